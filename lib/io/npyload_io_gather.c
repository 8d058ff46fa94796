/* The gather path: requests copied from a mapping of their file, all of a
 * call's copies under one SIGBUS guard.
 *
 * Who comes here: every request of the MMAP backend; for URING and PREAD
 * (not direct), the requests of at most gather_max bytes whose file's pages
 * are in the page cache. The rest go to the read backend. Per request the
 * cost is then one memcpy (and an LRU lookup): no syscall, no advice, no
 * fstat per row. Per file and call: the identity check after the call
 * (npyl_io_files_verify), as for every backend. Per file, now and then: a
 * residency check (mincore, below).
 *
 * Why a threshold: a mapping's first touch of a page costs a minor fault
 * (the kernel maps up to 16 cached pages around it), and every 4 KiB page a
 * copy crosses costs a TLB miss, where the kernel copies cached data out of
 * its direct map; and a page that is not cached costs a synchronous major
 * fault, where io_uring keeps many reads in flight. Small rows of a cached
 * file pay little of that, and a read's syscall (or SQE and CQE) is most of
 * their cost. Measured on the 2-core VM, one thread, a cached 512 MiB file,
 * rows at random offsets, 256 per call (rows/s, pread / io_uring / gather):
 * 64 B 0.86M / 1.40M / 21.9M; 3 KiB 0.45M / 0.51M / 1.88M; 16 KiB
 * 408k / 423k / 488k; 32 KiB 111-150k / 142-151k / 198-254k; 64 KiB
 * 72-159k / 74-88k / 56-130k; 256 KiB and up within the noise of each
 * other. NPYL_GATHER_MAX_DEFAULT is therefore 32 KiB: the largest size at
 * which the gather path won every run.
 *
 * Truncation and I/O errors: a page of the mapping past the file's current
 * end, or one the kernel cannot read in, raises SIGBUS; the guard
 * (npyload_io_sigbus.c) turns it into an error naming the file. Bytes of a
 * truncated file's last, partly valid page read as zeros without a fault:
 * the identity check after the call (size, mtime) catches it. */
#include "npyload_io_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Residency: mincore over the whole mapping (for files up to
 * MINCORE_SPAN_MAX; beyond, MINCORE_SAMPLES windows spread over the file),
 * one call per NPYL_MINCORE_PAGES pages. A resident file is checked again
 * after RECHECK_RESIDENT calls, one that is not after RECHECK_COLD (the
 * backend's reads bring its pages in meanwhile). A file counts as resident
 * when at most 1/RESIDENT_SLACK of the pages checked are missing: a few
 * major faults are cheaper than reading every row with a syscall. */
#define NPYL_MINCORE_PAGES 16384u
#define MINCORE_SAMPLES 16u
#define RECHECK_RESIDENT 1024u
#define RECHECK_COLD 64u
#define RESIDENT_SLACK 64u

static int check_resident(npyl_io *io, npyl_io_fh *fh)
{
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    if (!io->mcvec && !(io->mcvec = malloc(NPYL_MINCORE_PAGES)))
        return 0;
    const uint64_t win = (uint64_t)NPYL_MINCORE_PAGES * page;
    uint64_t len = fh->map_len, nwin = (len + win - 1) / win, step = 1;
    if (nwin > MINCORE_SAMPLES) {
        step = nwin / MINCORE_SAMPLES;
        nwin = MINCORE_SAMPLES;
    }
    uint64_t pages = 0, missing = 0;
    for (uint64_t k = 0; k < nwin; k++) {
        uint64_t off = k * step * win;
        uint64_t n = len - off < win ? len - off : win;
        if (mincore((void *)(fh->map + off), (size_t)n, io->mcvec) != 0)
            return 0; /* cannot tell: read, the safe choice */
        uint64_t np = (n + page - 1) / page;
        for (uint64_t p = 0; p < np; p++)
            missing += !(io->mcvec[p] & 1);
        pages += np;
    }
    return missing * RESIDENT_SLACK <= pages;
}

static int resident(npyl_io *io, npyl_io_fh *fh)
{
    uint64_t every = fh->resident ? RECHECK_RESIDENT : RECHECK_COLD;
    if (fh->resident_call == 0 || io->call - fh->resident_call >= every) {
        fh->resident = check_resident(io, fh);
        fh->resident_call = io->call;
    }
    return fh->resident;
}

static int grow_scratch(npyl_io *io, size_t n)
{
    if (n <= io->scratch_cap)
        return 0;
    size_t cap = io->scratch_cap ? io->scratch_cap : 64;
    while (cap < n)
        cap *= 2;
    void *p;
    if (!(p = realloc(io->segs, cap * sizeof *io->segs)))
        return -ENOMEM;
    io->segs = p;
    if (!(p = realloc(io->seg_req, cap * sizeof *io->seg_req)))
        return -ENOMEM;
    io->seg_req = p;
    if (!(p = realloc(io->rest, cap * sizeof *io->rest)))
        return -ENOMEM;
    io->rest = p;
    if (!(p = realloc(io->rest_idx, cap * sizeof *io->rest_idx)))
        return -ENOMEM;
    io->rest_idx = p;
    io->scratch_cap = cap;
    return 0;
}

void npyl_io_gather_fini(npyl_io *io)
{
    free(io->segs);
    free(io->seg_req);
    free(io->rest);
    free(io->rest_idx);
    free(io->mcvec);
    io->segs = NULL;
    io->seg_req = NULL;
    io->rest = NULL;
    io->rest_idx = NULL;
    io->mcvec = NULL;
    io->scratch_cap = 0;
}

/* Unpins the files of the copies collected so far (one pin each). */
static void unpin(npyl_io *io)
{
    for (size_t s = 0; s < io->ngpin; s++)
        npyl_io_fh_put(io, io->gpin[s]);
    io->ngpin = 0;
}

/* Copies the k segments collected so far (kb bytes) under one guard and
 * unpins their files. Returns 0 or the fault as an error for its
 * request. */
static int flush(npyl_io *io, const npyl_io_req *reqs, size_t k, uint64_t kb,
                 size_t *bad, uint64_t *got, char *err, size_t errlen)
{
    size_t which = 0;
    uint64_t at = 0;
    int rc = k ? npyl_sigbus_gather(io->segs, k, &which, &at) : 0;
    if (rc) {
        const npyl_io_req *r = &reqs[io->seg_req[which]];
        *bad = io->seg_req[which];
        /* Its file is pinned (in gpin): still open, in its slot. */
        rc = npyl_io_fail_fault(io, r, &io->fh[io->slot_of[r->file]], at, err,
                                errlen);
        for (size_t s = 0; s < which; s++)
            *got += io->segs[s].len;
    } else {
        *got += kb;
    }
    unpin(io);
    return rc;
}

int npyl_io_gather_read(npyl_io *io, const npyl_io_req *reqs, size_t n,
                        size_t *bad, uint64_t *bytes_read, size_t *nrest,
                        char *err, size_t errlen)
{
    const int all = io->backend == NPYLOAD_IO_MMAP;
    *nrest = n;
    if (!all) {
        /* Nothing small enough: straight to the backend, untouched. */
        size_t i = 0;
        while (i < n && reqs[i].len > io->gather_max)
            i++;
        if (i == n)
            return 0;
        if (!io->sigbus_ref) {
            if (npyl_sigbus_acquire(err, errlen) != 0) {
                io->gather_max = 0; /* no guard, no gather: read */
                return 0;
            }
            io->sigbus_ref = 1;
        }
    }
    if (grow_scratch(io, n) != 0) {
        *bad = 0;
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    size_t k = 0, nr = 0, ng = 0;
    uint64_t got = 0, gbytes = 0, kb = 0;
    int rc = 0;
    io->ngpin = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const npyl_io_req *r = &reqs[i];
        if (r->len == 0)
            continue;
        if (!all && r->len > io->gather_max)
            goto rest;
        npyl_io_fh *fh;
        int32_t slot = r->file < io->nfiles ? io->slot_of[r->file] : -1;
        /* A file pinned in this call is one an earlier copy of the call
         * holds (gpin): mapped and judged resident (or MMAP) this call, and
         * in the leading run of entries this call used (what
         * npyl_io_files_verify walks), so no LRU move and no check again:
         * per row, a lookup and the bounds. */
        int held = slot >= 0 && io->fh[slot].pins > 0 && io->fh[slot].used == io->call;
        if (held) {
            fh = &io->fh[slot];
        } else {
            int g = npyl_io_fh_get(io, r->file, &fh, err, errlen);
            if (g == NPYL_IO_BUSY) {
                /* Every open file is pinned by a copy still to do: do them. */
                rc = flush(io, reqs, k, kb, bad, &got, err, errlen);
                k = 0;
                kb = 0;
                if (rc)
                    break;
                g = npyl_io_fh_get(io, r->file, &fh, err, errlen);
            }
            if (g) {
                rc = g;
                *bad = i;
                break;
            }
            if (!fh->map && !fh->nomap && !all)
                (void)npyl_io_fh_map(io, fh, err, errlen); /* failure: read */
        }
        const uint64_t size = io->files[r->file].size;
        if (r->len > size || r->offset > size - r->len) {
            /* Past the size validated at start (no overflow: end is
             * offset + len below). */
            rc = npyl_io_fail_eof(io, r, fh, err, errlen);
            *bad = i;
            if (!held)
                npyl_io_fh_put(io, fh);
            break;
        }
        if (!held) {
            if (!fh->map || (!all && !resident(io, fh))) {
                npyl_io_fh_put(io, fh);
                goto rest;
            }
            if (all)
                (void)resident(io, fh);
            io->gpin[io->ngpin++] = fh; /* pinned until the flush */
        }
        if (all && !fh->resident) {
            /* Not cached: ask for the pages this copy needs before it
             * faults on them one by one. */
            uint64_t a = r->offset / page * page, end = r->offset + r->len;
            (void)madvise((void *)(fh->map + a), (size_t)(end - a),
                          MADV_WILLNEED);
        }
        io->segs[k] = (npyl_gather_seg){r->dst, fh->map + r->offset,
                                        (size_t)r->len};
        io->seg_req[k] = i;
        k++;
        kb += r->len;
        ng++;
        gbytes += r->len;
        continue;
    rest:
        io->rest[nr] = *r;
        io->rest_idx[nr] = i;
        nr++;
    }
    if (rc)
        unpin(io);
    else
        rc = flush(io, reqs, k, kb, bad, &got, err, errlen);
    *bytes_read += got;
    if (rc == 0) {
        *nrest = nr;
        atomic_fetch_add_explicit(&io->st_gather_bytes, gbytes,
                                  memory_order_relaxed);
        atomic_fetch_add_explicit(&io->st_gather_reqs, ng,
                                  memory_order_relaxed);
    }
    return rc;
}
