/* Reads a batch's rows: how a slot's rows become read requests (runs of
 * consecutive samples of one file, one read each), how rows of .npy.zst
 * files become frame reads and decodes, and what happens when a read fails
 * (ON_ERROR skip). Called by a worker with no lock held.
 *
 * .npy.zst rows: the batch's rows of compressed files are grouped by frame
 * (sorted by field, file, frame, row), so a frame that holds several of the
 * batch's rows is read and decompressed once. The frames' compressed bytes
 * are read in the same npyl_io_read call as the raw rows, into the worker's
 * compressed scratch (in rounds when they do not all fit), each placed at
 * the address that is congruent to its file offset modulo 4096, so O_DIRECT
 * reads land straight there. A frame that holds exactly the rows wanted, in
 * order, decodes straight into the slot, and so does a frame of one sample
 * (repeated rows copied from the first); any other is streamed through the
 * worker's decode window (at most NPYL_ZST_WINDOW_BYTES, whatever the
 * frame's size: a frame of a million 16-byte samples must not cost its
 * decompressed size per worker) and its rows are copied out as they pass.
 * Such a frame is decoded to its end, so that its checksum is verified
 * before the batch is handed out. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_loader_internal.h"

/* One row of a batch that lives in a .npy.zst file. */
typedef struct npyl_zrow {
    uint32_t field;
    uint32_t file;        /* io index */
    uint32_t frame;
    uint32_t row;         /* position in the batch */
    uint64_t local;       /* sample index inside the file */
    uint64_t src;         /* where its frame's compressed bytes land in zsrc */
    const npyl_ffile *ff;
} npyl_zrow;

/* Counters of one batch, added to the loader's once at the end. */
typedef struct zstats {
    uint64_t cbytes, dbytes, ns;
} zstats;

/* The compressed scratch holds at least one frame and at most this much
 * (a batch's frames beyond it are read in further rounds). */
#define ZSRC_MAX_BYTES (32u << 20)

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

/* Request q: `rows` consecutive samples of field f from global sample s on,
 * all in file ff, landing at dst. */
static void raw_req(npyl_io_req *q, const npyl_field *f, const npyl_ffile *ff, int64_t s,
                    uint64_t rows, uint8_t *dst)
{
    q->file = ff->io_index;
    q->offset = ff->data_offset + (uint64_t)(s - ff->first) * f->row_bytes;
    q->len = rows * f->row_bytes;
    q->dst = dst;
}

/* Turns the rows of slot s into read requests, one per run of consecutive
 * samples of one .npy file: a run lands in one read, straight into the
 * slot. Rows of .npy.zst files go to zrows (*nz of them) instead. */
static size_t plan_reads(const npyload_loader *L, const npyl_slot *s, uint8_t *const *dst,
                         npyl_io_req *reqs, npyl_zrow *zrows, size_t *nz)
{
    size_t n = 0;
    *nz = 0;
    for (size_t fi = 0; fi < L->nfields; fi++) {
        const npyl_field *f = &L->fields[fi];
        uint8_t *base = dst[fi];
        for (size_t r = 0; r < s->rows;) {
            int64_t first = s->indices[r];
            const npyl_ffile *ff = find_file(f, first);
            if (ff->zst) {
                npyl_zrow *z = &zrows[(*nz)++];
                uint64_t off;
                z->field = (uint32_t)fi;
                z->file = ff->io_index;
                z->row = (uint32_t)r;
                z->local = (uint64_t)(first - ff->first);
                z->ff = ff;
                npyl_zst_locate(ff->zst, z->local, &z->frame, &off);
                r++;
                continue;
            }
            size_t run = 1;
            while (r + run < s->rows && s->indices[r + run] == first + (int64_t)run &&
                   first + (int64_t)run < ff->first + ff->count)
                run++;
            raw_req(&reqs[n++], f, ff, first, run, base + (uint64_t)r * f->row_bytes);
            r += run;
        }
    }
    return n;
}

static int zrow_cmp(const void *pa, const void *pb)
{
    const npyl_zrow *a = pa, *b = pb;
    if (a->field != b->field)
        return a->field < b->field ? -1 : 1;
    if (a->file != b->file)
        return a->file < b->file ? -1 : 1;
    if (a->frame != b->frame)
        return a->frame < b->frame ? -1 : 1;
    /* Within a frame in the order its bytes decode (decode_group streams
     * them), then by position in the batch. */
    if (a->local != b->local)
        return a->local < b->local ? -1 : 1;
    return a->row < b->row ? -1 : a->row > b->row;
}

static int same_frame(const npyl_zrow *a, const npyl_zrow *b)
{
    return a->field == b->field && a->file == b->file && a->frame == b->frame;
}

/* One past the last of the sorted rows zr[v..n) that share zr[v]'s frame. */
static size_t frame_end(const npyl_zrow *zr, size_t v, size_t n)
{
    size_t g = v + 1;
    while (g < n && same_frame(&zr[g], &zr[v]))
        g++;
    return g;
}

/* Where in zsrc a frame at file offset `coff` goes when the scratch is
 * filled up to `cursor`: with O_DIRECT, at the next address congruent to
 * coff modulo NPYL_DIRECT_ALIGN (zsrc itself is aligned), so the io layer
 * reads all but its unaligned head and tail with O_DIRECT. */
static uint64_t place(const npyload_loader *L, uint64_t cursor, uint64_t coff)
{
    if (!L->opt[NPYLOAD_OPT_DIRECT_IO])
        return cursor;
    return cursor + ((coff - cursor) & (NPYL_DIRECT_ALIGN - 1));
}

/* Copies the wanted rows out of a frame's decompressed bytes as they stream
 * through the decode window: rows z[next..k) (sorted by their sample in the
 * frame) that overlap the chunk [pos, pos + n) get their overlapping part,
 * so a row split across two chunks is assembled in place. */
typedef struct row_sink {
    const npyl_zrow *z;
    size_t k, next;
    uint64_t first, rb;
    uint8_t *dst; /* the field's rows in the slot */
} row_sink;

static void copy_rows(void *arg, uint64_t pos, const unsigned char *p, size_t n)
{
    row_sink *rs = arg;
    uint64_t end = pos + n;
    for (size_t j = rs->next; j < rs->k; j++) {
        uint64_t a = (rs->z[j].local - rs->first) * rs->rb, b = a + rs->rb;
        if (a >= end)
            break;
        uint64_t lo = a > pos ? a : pos, hi = b < end ? b : end;
        if (lo < hi)
            memcpy(rs->dst + rs->z[j].row * rs->rb + (lo - a), p + (lo - pos), hi - lo);
    }
    /* Rows that end inside this chunk are complete (they start in order, so
     * they end in order). */
    while (rs->next < rs->k && (rs->z[rs->next].local - rs->first + 1) * rs->rb <= end)
        rs->next++;
}

/* Decompresses frame `frame` of file z->ff (its compressed bytes at src) to
 * rows z[0..k) of field z->field: straight into dst when the frame holds
 * exactly these rows in order, else streamed through the decode window. */
static int decode_group(npyload_loader *L, npyl_worker *w, const npyl_zrow *z, size_t k,
                        const uint8_t *src, uint8_t *const *dst, uint64_t *bytes, zstats *zs)
{
    const npyl_field *f = &L->fields[z->field];
    const npyl_zst_index *x = z->ff->zst;
    const char *name = L->io_files[z->file].path;
    uint64_t first, count, rb = f->row_bytes;
    npyl_zst_frame_rows(x, z->frame, &first, &count);
    int direct = k == count;
    for (size_t j = 0; direct && j < k; j++)
        direct = z[j].row == z[0].row + j && z[j].local == first + j;
    uint64_t t0 = npyl_now_ns();
    int rc;
    if (direct || count == 1) {
        /* A one-sample frame wanted by several rows (a sample repeated in a
         * batch, rank padding) decodes into the first and is copied to the
         * rest: the decode scratch is only for frames of several samples. */
        uint8_t *at = dst[z->field] + z->row * rb;
        rc = npyl_zst_decode_frame(x, z->frame, w->dctx, src, at, (size_t)(count * rb), name,
                                   w->errmsg, sizeof w->errmsg);
        for (size_t j = 1; rc == 0 && !direct && j < k; j++)
            memcpy(dst[z->field] + z[j].row * rb, at, rb);
    } else {
        row_sink sink = {.z = z, .k = k, .next = 0, .first = first, .rb = rb,
                         .dst = dst[z->field]};
        rc = npyl_zst_stream_frame(x, z->frame, w->dctx, src, w->zdst, w->zdst_cap,
                                   NPYLOAD_ZST_MAX_WINDOW_LOG, copy_rows, &sink, name,
                                   w->errmsg, sizeof w->errmsg);
    }
    zs->ns += npyl_now_ns() - t0;
    if (rc)
        return rc;
    zs->dbytes += count * rb;
    *bytes += k * rb;
    return 0;
}

/* An io failure on a frame read: say which frame as well. */
static void name_frame(npyl_worker *w, const npyl_zrow *z)
{
    size_t n = strlen(w->errmsg);
    if (n + 1 < sizeof w->errmsg)
        snprintf(w->errmsg + n, sizeof w->errmsg - n, " (frame %" PRIu32 " at byte %" PRIu64 ")",
                 z->frame, z->ff->zst->coff[z->frame]);
}

/* Reads all of slot h's rows, every field: the plain path. */
static int read_all(npyload_loader *L, npyl_worker *w, npyl_slot *h, uint8_t *const *dst,
                    uint64_t *bytes, zstats *zs)
{
    size_t nz = 0, bad = 0;
    size_t nraw = plan_reads(L, h, dst, w->reqs, w->zrows, &nz);
    if (nz == 0)
        return npyl_io_read(w->io, w->reqs, nraw, &bad, bytes, w->errmsg, sizeof w->errmsg);
    npyl_zrow *zr = w->zrows;
    qsort(zr, nz, sizeof *zr, zrow_cmp);
    /* Rounds: the raw rows and as many frames as the scratch holds in the
     * first, further frames in later ones (only when they do not fit). */
    size_t u = 0;
    do {
        size_t nreq = nraw, u0 = u;
        uint64_t cursor = 0, cb = 0;
        while (u < nz) {
            size_t g = frame_end(zr, u, nz);
            const npyl_zst_index *x = zr[u].ff->zst;
            uint64_t coff = x->coff[zr[u].frame], csz = x->coff[zr[u].frame + 1] - coff;
            uint64_t p = place(L, cursor, coff);
            if (p + csz > w->zsrc_cap && u > u0)
                break; /* the first frame always fits: zsrc_cap >= max_csize + align */
            zr[u].src = p;
            w->reqs[nreq++] = (npyl_io_req){.file = zr[u].file, .offset = coff, .len = csz,
                                            .dst = w->zsrc + p};
            cursor = p + csz;
            cb += csz;
            u = g;
        }
        uint64_t got = 0;
        int rc = npyl_io_read(w->io, w->reqs, nreq, &bad, &got, w->errmsg, sizeof w->errmsg);
        if (rc) {
            if (bad >= nraw) { /* a frame: the bad-th request after the raw ones */
                size_t k = bad - nraw, v = u0;
                while (k--)
                    v = frame_end(zr, v, nz);
                if (v < nz)
                    name_frame(w, &zr[v]);
            }
            return rc;
        }
        *bytes += got - cb; /* the raw rows; frames count as the rows they hold */
        zs->cbytes += cb;
        nraw = 0;
        for (size_t v = u0; v < u;) {
            size_t g = frame_end(zr, v, u);
            rc = decode_group(L, w, &zr[v], g - v, w->zsrc + zr[v].src, dst, bytes, zs);
            if (rc)
                return rc;
            v = g;
        }
    } while (u < nz);
    return 0;
}

/* Reads global sample s of every field to row `at` of dst: the row-by-row
 * path of ON_ERROR skip. Raw fields in one io call, then each .npy.zst
 * field's frame, read and decoded through the scratch buffers. */
static int read_row(npyload_loader *L, npyl_worker *w, int64_t s, size_t at, uint8_t *const *dst,
                    uint64_t *bytes, zstats *zs)
{
    size_t n = 0, bad = 0;
    for (size_t fi = 0; fi < L->nfields; fi++) {
        const npyl_field *f = &L->fields[fi];
        const npyl_ffile *ff = find_file(f, s);
        if (ff->zst)
            continue;
        raw_req(&w->reqs[n++], f, ff, s, 1, dst[fi] + (uint64_t)at * f->row_bytes);
    }
    int rc = n ? npyl_io_read(w->io, w->reqs, n, &bad, bytes, w->errmsg, sizeof w->errmsg) : 0;
    for (size_t fi = 0; rc == 0 && fi < L->nfields; fi++) {
        const npyl_field *f = &L->fields[fi];
        const npyl_ffile *ff = find_file(f, s);
        if (!ff->zst)
            continue;
        npyl_zrow z = {.field = (uint32_t)fi, .file = ff->io_index, .row = (uint32_t)at,
                       .local = (uint64_t)(s - ff->first), .ff = ff};
        uint64_t off, got = 0;
        npyl_zst_locate(ff->zst, z.local, &z.frame, &off);
        uint64_t coff = ff->zst->coff[z.frame], csz = ff->zst->coff[z.frame + 1] - coff;
        uint64_t p = place(L, 0, coff);
        npyl_io_req q = {.file = z.file, .offset = coff, .len = csz, .dst = w->zsrc + p};
        rc = npyl_io_read(w->io, &q, 1, &bad, &got, w->errmsg, sizeof w->errmsg);
        if (rc) {
            name_frame(w, &z);
            break;
        }
        zs->cbytes += csz;
        /* One row of the frame: never its whole (decode_group goes through
         * the scratch unless the frame is exactly this one row, in place). */
        rc = decode_group(L, w, &z, 1, w->zsrc + p, dst, bytes, zs);
    }
    return rc;
}

/* ON_ERROR skip: the batch's reads failed. Retry them once; if they fail
 * again, read row by row, each good row landing right after the previous
 * good one (rows only move down, so nothing unread is overwritten), and drop
 * the rows that fail. A row is delivered only when its own read succeeded,
 * identity checks and frame checksums included: never wrong bytes. Returns
 * 0 (the slot now holds only good rows, possibly none) or the read's error
 * when more than MAX_ERRORS samples were skipped; w->errmsg says why. */
static int read_skipping(npyload_loader *L, npyl_worker *w, npyl_slot *h, uint8_t *const *dst,
                         int rc, uint64_t *bytes, zstats *zs)
{
    atomic_fetch_add(&L->st_errors, 1);
    pthread_mutex_lock(&L->mu);
    snprintf(L->skip_msg, sizeof L->skip_msg, "%s", w->errmsg);
    pthread_mutex_unlock(&L->mu);
    if (read_all(L, w, h, dst, bytes, zs) == 0)
        return 0;
    size_t kept = 0, skipped = 0;
    for (size_t r = 0; r < h->rows; r++) {
        int64_t s = h->indices[r];
        int rrc = read_row(L, w, s, kept, dst, bytes, zs);
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
    zstats zs = {0, 0, 0};
    int rc = read_all(L, w, h, dst, bytes, &zs);
    if (rc && L->opt[NPYLOAD_OPT_ON_ERROR] == 1)
        rc = read_skipping(L, w, h, dst, rc, bytes, &zs);
    if (zs.cbytes | zs.dbytes | zs.ns) {
        atomic_fetch_add(&L->st_zcbytes, zs.cbytes);
        atomic_fetch_add(&L->st_zdbytes, zs.dbytes);
        atomic_fetch_add(&L->st_zdecode_ns, zs.ns);
    }
    return rc;
}

int npyl_read_worker_init(npyload_loader *L, npyl_worker *w)
{
    if (!L->has_zst)
        return 0;
    /* Rows a batch can hold here (min(BATCH_SIZE, the rank's share)), as
     * the slots are sized: a huge BATCH_SIZE over a small field reserves
     * nothing more. */
    size_t B = L->slot_rows ? (size_t)L->slot_rows : 1;
    /* One frame, wherever its offset puts it: max_csize + the alignment. */
    uint64_t one = (uint64_t)L->zst_max_csize + NPYL_DIRECT_ALIGN;
    uint64_t all = one * B * L->nfields;
    uint64_t cap = all < ZSRC_MAX_BYTES ? all : ZSRC_MAX_BYTES;
    if (cap < one)
        cap = one;
    cap = (cap + NPYL_DIRECT_ALIGN - 1) & ~(uint64_t)(NPYL_DIRECT_ALIGN - 1);
    w->zsrc = npyl_alloc_aligned((size_t)cap, NPYL_DIRECT_ALIGN);
    w->zsrc_cap = (size_t)cap;
    /* The decode window: a frame of several samples up to this size decodes
     * into it in one call, a larger one streams through it. */
    w->zdst_cap = L->zst_max_multi_dsize ? L->zst_max_multi_dsize : 1;
    if (w->zdst_cap > NPYL_ZST_WINDOW_BYTES)
        w->zdst_cap = NPYL_ZST_WINDOW_BYTES;
    w->zdst = malloc(w->zdst_cap);
    w->zrows = calloc(B * L->nfields, sizeof *w->zrows);
    w->dctx = npyl_zst_dctx_create();
    if (!w->zsrc || !w->zdst || !w->zrows || !w->dctx)
        return npyl_loader_fail(L, -ENOMEM, "out of memory for the .npy.zst buffers (%" PRIu64
                                " + %zu bytes per worker)", cap, w->zdst_cap);
    return 0;
}

void npyl_read_worker_free(npyl_worker *w)
{
    npyl_zst_dctx_free(w->dctx);
    npyl_free_aligned(w->zsrc);
    free(w->zdst);
    free(w->zrows);
    w->dctx = NULL;
    w->zsrc = w->zdst = NULL;
    w->zrows = NULL;
    w->zsrc_cap = w->zdst_cap = 0;
}
