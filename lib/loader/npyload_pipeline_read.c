/* Reads a batch's rows: how a slot's rows become read requests (runs of
 * consecutive samples of one file, one read each) and what happens when a
 * read fails (ON_ERROR skip). Called by a worker with no lock held. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "npyload_loader_internal.h"

/* The file of field f holding global sample s (binary search). */
static const npyl_ffile *find_file(const npyl_field *f, int64_t s)
{
    size_t lo = 0, hi = f->npaths;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (f->files[mid].first <= s)
            lo = mid;
        else
            hi = mid;
    }
    return &f->files[lo];
}

/* Turns the rows of slot s into read requests, one per run of consecutive
 * samples of one file: a run lands in one read, straight into the slot. */
static size_t plan_reads(const npyload_loader *L, const npyl_slot *s, uint8_t *const *dst,
                         npyl_io_req *reqs)
{
    size_t n = 0;
    for (size_t fi = 0; fi < L->nfields; fi++) {
        const npyl_field *f = &L->fields[fi];
        uint8_t *base = dst[fi];
        for (size_t r = 0; r < s->rows;) {
            int64_t first = s->indices[r];
            const npyl_ffile *ff = find_file(f, first);
            size_t run = 1;
            while (r + run < s->rows && s->indices[r + run] == first + (int64_t)run &&
                   first + (int64_t)run < ff->first + ff->count)
                run++;
            reqs[n].file = ff->io_index;
            reqs[n].offset = ff->data_offset + (uint64_t)(first - ff->first) * f->row_bytes;
            reqs[n].len = (uint64_t)run * f->row_bytes;
            reqs[n].dst = base + (uint64_t)r * f->row_bytes;
            n++;
            r += run;
        }
    }
    return n;
}

/* ON_ERROR skip: the batch's reads failed. Retry them once; if they fail
 * again, read row by row, each good row landing right after the previous
 * good one (rows only move down, so nothing unread is overwritten), and drop
 * the rows that fail. A row is delivered only when its own read succeeded,
 * identity checks included: never wrong bytes. Returns 0 (the slot now
 * holds only good rows, possibly none) or the read's error when more than
 * MAX_ERRORS samples were skipped; w->errmsg says why. */
static int read_skipping(npyload_loader *L, npyl_worker *w, npyl_slot *h, uint8_t *const *dst,
                         size_t nreq, int rc, uint64_t *bytes)
{
    size_t bad = 0;
    atomic_fetch_add(&L->st_errors, 1);
    pthread_mutex_lock(&L->mu);
    snprintf(L->skip_msg, sizeof L->skip_msg, "%s", w->errmsg);
    pthread_mutex_unlock(&L->mu);
    if (npyl_io_read(w->io, w->reqs, nreq, &bad, bytes, w->errmsg, sizeof w->errmsg) == 0)
        return 0;
    size_t kept = 0, skipped = 0;
    for (size_t r = 0; r < h->rows; r++) {
        int64_t s = h->indices[r];
        for (size_t fi = 0; fi < L->nfields; fi++) {
            const npyl_field *f = &L->fields[fi];
            const npyl_ffile *ff = find_file(f, s);
            w->reqs[fi].file = ff->io_index;
            w->reqs[fi].offset = ff->data_offset + (uint64_t)(s - ff->first) * f->row_bytes;
            w->reqs[fi].len = f->row_bytes;
            w->reqs[fi].dst = dst[fi] + (uint64_t)kept * f->row_bytes;
        }
        int rrc = L->nfields ? npyl_io_read(w->io, w->reqs, L->nfields, &bad, bytes, w->errmsg,
                                            sizeof w->errmsg)
                             : 0;
        if (rrc == 0) {
            h->indices[kept++] = s;
            continue;
        }
        skipped++;
        rc = rrc;
        pthread_mutex_lock(&L->mu);
        snprintf(L->skip_msg, sizeof L->skip_msg, "sample %" PRId64 ": %.900s", s, w->errmsg);
        pthread_mutex_unlock(&L->mu);
    }
    h->rows = kept;
    uint64_t total = atomic_fetch_add(&L->st_skipped, skipped) + skipped;
    int64_t max = L->opt[NPYLOAD_OPT_MAX_ERRORS];
    if (max > 0 && total > (uint64_t)max)
        return rc; /* w->errmsg holds the last failure */
    return 0;
}

int npyl_read_batch(npyload_loader *L, npyl_worker *w, npyl_slot *h, uint8_t *const *dst,
                    uint64_t *bytes)
{
    size_t nreq = plan_reads(L, h, dst, w->reqs), bad = 0;
    int rc = npyl_io_read(w->io, w->reqs, nreq, &bad, bytes, w->errmsg, sizeof w->errmsg);
    if (rc && L->opt[NPYLOAD_OPT_ON_ERROR] == 1)
        rc = read_skipping(L, w, h, dst, nreq, rc, bytes);
    return rc;
}
