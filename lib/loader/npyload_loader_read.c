/* Reads a batch's rows: how a slot's rows become read requests (runs of
 * consecutive samples of one file, one read each), how rows of .npy.zst
 * files become frame reads and decodes, and what happens when a read fails
 * (ON_ERROR skip). Called by a worker with no lock held; sees the loader
 * only through npyl_read_view (npyload_loader_read.h).
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

#include "npyload_loader_read.h"

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
    return &f->files[npyl_field_file_of(f, s)];
}

/* Reads a round's n requests: those of local files through io (lib/io),
 * those of remote objects through rm (lib/remote), with npyl_io_read's
 * contract for the whole (*bad indexes reqs). */
static int read_reqs(const npyl_read_view *v, npyl_io *io, npyl_remote_ctx *rm,
                     npyl_rsplit *sp, const npyl_io_req *reqs, size_t n, size_t *bad,
                     uint64_t *got, char *err, size_t errlen)
{
    if (!v->robjs)
        return npyl_io_read(io, reqs, n, bad, got, err, errlen);
    if (n > sp->cap) {
        size_t cap = n * 2;
        npyl_io_req *loc = realloc(sp->loc, cap * sizeof *loc);
        if (loc)
            sp->loc = loc;
        size_t *li = realloc(sp->loc_idx, cap * sizeof *li);
        if (li)
            sp->loc_idx = li;
        npyl_remote_req *rem = realloc(sp->rem, cap * sizeof *rem);
        if (rem)
            sp->rem = rem;
        size_t *ri = realloc(sp->rem_idx, cap * sizeof *ri);
        if (ri)
            sp->rem_idx = ri;
        if (!loc || !li || !rem || !ri)
            return npyl_fail(err, errlen, -ENOMEM, "out of memory");
        sp->cap = cap;
    }
    size_t nl = 0, nr = 0, b = 0;
    for (size_t i = 0; i < n; i++) {
        if (v->robjs[reqs[i].file].url) {
            sp->rem[nr] = (npyl_remote_req){reqs[i].file, reqs[i].offset, reqs[i].len,
                                            reqs[i].dst};
            sp->rem_idx[nr++] = i;
        } else {
            sp->loc[nl] = reqs[i];
            sp->loc_idx[nl++] = i;
        }
    }
    int rc = nl ? npyl_io_read(io, sp->loc, nl, &b, got, err, errlen) : 0;
    if (rc) {
        *bad = sp->loc_idx[b];
        return rc;
    }
    rc = nr ? npyl_remote_read(rm, sp->rem, nr, &b, got, err, errlen) : 0;
    if (rc)
        *bad = sp->rem_idx[b];
    return rc;
}

static void rsplit_fini(npyl_rsplit *sp)
{
    free(sp->loc);
    free(sp->loc_idx);
    free(sp->rem);
    free(sp->rem_idx);
    memset(sp, 0, sizeof *sp);
}

/* Request q: `rows` consecutive samples of field f from global sample s on,
 * all in file ff, landing at dst. A stored narrowed file's rows are codes,
 * one byte per value: they land at the end of the rows' place (*rff = ff)
 * and are expanded in place after the read (expand_raw), or, when the
 * device expands them (f->dnarrow: the rows' place holds codes), only
 * checked. */
static void raw_req(npyl_io_req *q, const npyl_ffile **rff, const npyl_field *f,
                    const npyl_ffile *ff, int64_t s, uint64_t rows, uint8_t *dst)
{
    uint64_t rb = ff->nx ? f->row_bytes / ff->nx->itemsize : f->row_bytes;
    q->file = ff->io_index;
    q->offset = ff->data_offset + (uint64_t)(s - ff->first) * rb;
    q->len = rows * rb;
    q->dst = dst + rows * (f->stage_row_bytes - rb);
    *rff = ff->nx ? ff : NULL;
}

/* A narrowed file's n codes, read or decoded to `codes`, become what the
 * slot holds at dst: their values (dst may be codes' place, expanded front
 * to back), or with keep (the device expands them) the codes themselves.
 * -1 when a code is not in the table. */
static int put_codes(const npyl_zst_narrow *x, int keep, const uint8_t *codes, size_t n,
                     uint8_t *dst)
{
    if (!keep)
        return npyl_zst_narrow_expand(x, codes, n, dst);
    if (dst != codes)
        memmove(dst, codes, n);
    return npyl_zst_narrow_check(x, dst, n);
}

/* The field file ff belongs to. */
static const npyl_field *field_of(const npyl_read_view *v, const npyl_ffile *ff)
{
    for (size_t fi = 0; fi < v->nfields; fi++)
        if (ff >= v->fields[fi].files && ff < v->fields[fi].files + v->fields[fi].npaths)
            return &v->fields[fi];
    return NULL; /* not reached: every request's file is a field's */
}

/* The codes of the stored narrowed files among the n raw requests (read)
 * become their values, in place (or stay, checked: dnarrow). */
static int expand_raw(const npyl_read_view *v, npyl_read_ctx *c, const npyl_io_req *reqs,
                      const npyl_ffile *const *rff, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const npyl_ffile *ff = rff[i];
        if (!ff)
            continue;
        const npyl_zst_narrow *x = ff->nx;
        const npyl_field *f = field_of(v, ff);
        const int keep = f && f->dnarrow;
        uint8_t *to = keep ? reqs[i].dst : reqs[i].dst + reqs[i].len - reqs[i].len * x->itemsize;
        if (put_codes(x, keep, reqs[i].dst, (size_t)reqs[i].len, to) == 0)
            continue;
        snprintf(c->errmsg, sizeof c->errmsg, "%s: a code is not in the file's table of "
                 "%" PRIu32 " values (a damaged file)", f ? f->paths[ff - f->files] : "?",
                 x->count);
        return NPYLOAD_EFORMAT;
    }
    return 0;
}

/* Turns the batch's rows (indices[0 .. rows)) into read requests, one per run of consecutive
 * samples of one .npy file: a run lands in one read, straight into the
 * slot. Rows of .npy.zst files go to zrows (*nz of them) instead. */
static size_t plan_reads(const npyl_read_view *v, const int64_t *indices, size_t rows,
                         uint8_t *const *dst, npyl_io_req *reqs, const npyl_ffile **rff,
                         npyl_zrow *zrows, size_t *nz)
{
    size_t n = 0;
    *nz = 0;
    for (size_t fi = 0; fi < v->nfields; fi++) {
        const npyl_field *f = &v->fields[fi];
        uint8_t *base = dst[fi];
        for (size_t r = 0; r < rows;) {
            int64_t first = indices[r];
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
            while (r + run < rows && indices[r + run] == first + (int64_t)run &&
                   first + (int64_t)run < ff->first + ff->count)
                run++;
            raw_req(&reqs[n], &rff[n], f, ff, first, run,
                    base + (uint64_t)r * f->stage_row_bytes);
            n++;
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
static uint64_t place(const npyl_read_view *v, uint64_t cursor, uint64_t coff)
{
    if (!v->direct_io)
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
    uint64_t first, rb;   /* rb: stored bytes per row (narrowed: codes) */
    uint8_t *dst; /* the field's rows in the slot */
    const npyl_zst_narrow *narrow; /* narrowed: codes become values */
    int keep;             /* narrowed, dnarrow: the codes stay (checked) */
    uint64_t orb;         /* bytes per row in the slot */
    int bad;              /* a code outside the value table */
} row_sink;

static void copy_rows(void *arg, uint64_t pos, const unsigned char *p, size_t n)
{
    row_sink *rs = arg;
    uint64_t end = pos + n;
    /* bytes in the slot per stored byte: a value per code when expanding */
    const uint64_t w = rs->narrow && !rs->keep ? rs->narrow->itemsize : 1;
    for (size_t j = rs->next; j < rs->k; j++) {
        uint64_t a = (rs->z[j].local - rs->first) * rs->rb, b = a + rs->rb;
        if (a >= end)
            break;
        uint64_t lo = a > pos ? a : pos, hi = b < end ? b : end;
        uint8_t *to = rs->dst + rs->z[j].row * rs->orb + (lo - a) * w;
        if (lo < hi && rs->narrow)
            rs->bad |= put_codes(rs->narrow, rs->keep, p + (lo - pos), hi - lo, to);
        else if (lo < hi)
            memcpy(to, p + (lo - pos), hi - lo);
    }
    /* Rows that end inside this chunk are complete (they start in order, so
     * they end in order). */
    while (rs->next < rs->k && (rs->z[rs->next].local - rs->first + 1) * rs->rb <= end)
        rs->next++;
}

/* A narrowed frame held a code its value table does not have. */
static int bad_code(npyl_read_ctx *c, const char *name, const npyl_zrow *z)
{
    return npyl_fail(c->errmsg, sizeof c->errmsg, NPYLOAD_EFORMAT,
                     "%s: frame %" PRIu32 " at byte %" PRIu64 ": a code past the %" PRIu32
                     " values of the file's value table (damaged file)", name, z->frame,
                     z->ff->zst->coff[z->frame], z->ff->zst->narrow->count);
}

/* Decompresses frame `frame` of file z->ff (its compressed bytes at src) to
 * rows z[0..k) of field z->field: straight into dst when the frame holds
 * exactly these rows in order, else streamed through the decode window. */
static int decode_group(const npyl_read_view *v, npyl_read_ctx *c, const npyl_zrow *z, size_t k,
                        const uint8_t *src, uint8_t *const *dst, uint64_t *bytes, zstats *zs)
{
    const npyl_field *f = &v->fields[z->field];
    const npyl_zst_index *x = z->ff->zst;
    const char *name = v->io_files[z->file].path;
    uint64_t first, count, rb = f->stage_row_bytes, srb = x->row_bytes; /* srb: stored */
    npyl_zst_frame_rows(x, z->frame, &first, &count);
    int direct = k == count;
    for (size_t j = 0; direct && j < k; j++)
        direct = z[j].row == z[0].row + j && z[j].local == first + j;
    uint64_t t0 = npyl_now_ns();
    int rc;
    if (direct || count == 1) {
        /* A one-sample frame wanted by several rows (a sample repeated in a
         * batch, rank padding) decodes into the first and is copied to the
         * rest: the decode scratch is only for frames of several samples.
         * A narrowed frame's codes land at the end of the rows and are
         * expanded in place, front to back. */
        uint8_t *at = dst[z->field] + z->row * rb;
        uint8_t *codes = at + count * (rb - srb);
        rc = npyl_zst_decode_frame(x, z->frame, c->dctx, src, codes, (size_t)(count * srb),
                                   name, c->errmsg, sizeof c->errmsg);
        if (rc == 0 && x->narrow &&
            put_codes(x->narrow, f->dnarrow, codes, (size_t)(count * srb), at) != 0)
            rc = bad_code(c, name, z);
        for (size_t j = 1; rc == 0 && !direct && j < k; j++)
            memcpy(dst[z->field] + z[j].row * rb, at, rb);
    } else {
        row_sink sink = {.z = z, .k = k, .next = 0, .first = first, .rb = srb,
                         .dst = dst[z->field], .narrow = x->narrow, .keep = f->dnarrow,
                         .orb = rb};
        rc = npyl_zst_stream_frame(x, z->frame, c->dctx, src, c->zdst, c->zdst_cap,
                                   NPYLOAD_ZST_MAX_WINDOW_LOG, copy_rows, &sink, name,
                                   c->errmsg, sizeof c->errmsg);
        if (rc == 0 && sink.bad)
            rc = bad_code(c, name, z);
    }
    zs->ns += npyl_now_ns() - t0;
    if (rc)
        return rc;
    zs->dbytes += count * rb;
    *bytes += k * rb;
    return 0;
}

/* An io failure on a frame read: say which frame as well. */
static void name_frame(npyl_read_ctx *c, const npyl_zrow *z)
{
    size_t n = strlen(c->errmsg);
    if (n + 1 < sizeof c->errmsg)
        snprintf(c->errmsg + n, sizeof c->errmsg - n, " (frame %" PRIu32 " at byte %" PRIu64 ")",
                 z->frame, z->ff->zst->coff[z->frame]);
}

/* Plans the batch's rows into b: one request per run of raw rows (b->nraw),
 * the rows of .npy.zst files sorted by frame (b->nz), no round yet. */
static void plan_batch(const npyl_read_view *v, npyl_read_buf *b, const int64_t *indices,
                       size_t rows, uint8_t *const *dst)
{
    b->nraw = plan_reads(v, indices, rows, dst, b->reqs, b->rff, b->zrows, &b->nz);
    if (b->nz)
        qsort(b->zrows, b->nz, sizeof *b->zrows, zrow_cmp);
    b->u0 = b->u = 0;
}

/* The next round of b's reads: the raw rows (first round only) and, from
 * b->u on, as many frames as the compressed scratch holds (further frames
 * go to later rounds, only when they do not fit). */
static void plan_round(const npyl_read_view *v, npyl_read_buf *b)
{
    npyl_zrow *zr = b->zrows;
    size_t nreq = b->nraw, u = b->u, nz = b->nz;
    uint64_t cursor = 0, cb = 0;
    b->u0 = u;
    while (u < nz) {
        size_t g = frame_end(zr, u, nz);
        const npyl_zst_index *x = zr[u].ff->zst;
        uint64_t coff = x->coff[zr[u].frame], csz = x->coff[zr[u].frame + 1] - coff;
        uint64_t p = place(v, cursor, coff);
        if (p + csz > b->zsrc_cap && u > b->u0)
            break; /* the first frame always fits: zsrc_cap >= max_csize + align */
        zr[u].src = p;
        b->reqs[nreq++] = (npyl_io_req){.file = zr[u].file, .offset = coff, .len = csz,
                                        .dst = b->zsrc + p};
        cursor = p + csz;
        cb += csz;
        u = g;
    }
    b->nreq = nreq;
    b->u = u;
    b->cb = cb;
}

/* A round's reads returned rc (the bad-th request failed; got bytes
 * landed): names the frame of a failed frame read, counts what landed and
 * decodes the round's frames. */
static int finish_round(const npyl_read_view *v, npyl_read_ctx *c, npyl_read_buf *b, int rc,
                        size_t bad, uint64_t got, uint8_t *const *dst, uint64_t *bytes,
                        zstats *zs)
{
    npyl_zrow *zr = b->zrows;
    if (rc) {
        if (b->nz == 0)
            *bytes += got; /* raw rows only: what landed counts */
        else if (bad >= b->nraw) { /* a frame: the bad-th request after the raw ones */
            size_t k = bad - b->nraw, t = b->u0;
            while (k--)
                t = frame_end(zr, t, b->nz);
            if (t < b->nz)
                name_frame(c, &zr[t]);
        }
        return rc;
    }
    *bytes += got - b->cb; /* the raw rows; frames count as the rows they hold */
    zs->cbytes += b->cb;
    rc = expand_raw(v, c, b->reqs, b->rff, b->nraw);
    if (rc)
        return rc;
    b->nraw = 0;
    for (size_t t = b->u0; t < b->u;) {
        size_t g = frame_end(zr, t, b->u);
        rc = decode_group(v, c, &zr[t], g - t, b->zsrc + zr[t].src, dst, bytes, zs);
        if (rc)
            return rc;
        t = g;
    }
    return 0;
}

/* b's rounds from where it stands, each read through c's own io context
 * and decoded before the next. */
static int read_rounds(const npyl_read_view *v, npyl_read_ctx *c, npyl_read_buf *b,
                       uint8_t *const *dst, uint64_t *bytes, zstats *zs)
{
    do {
        plan_round(v, b);
        size_t bad = 0;
        uint64_t got = 0;
        int rc = read_reqs(v, c->io, c->rm, &c->split, b->reqs, b->nreq, &bad, &got,
                           c->errmsg, sizeof c->errmsg);
        rc = finish_round(v, c, b, rc, bad, got, dst, bytes, zs);
        if (rc)
            return rc;
    } while (b->u < b->nz);
    return 0;
}

/* Reads all of the batch's rows, every field, through c's current buffer:
 * the plain path. */
static int read_all(const npyl_read_view *v, npyl_read_ctx *c, const int64_t *indices,
                    size_t rows, uint8_t *const *dst, uint64_t *bytes, zstats *zs)
{
    npyl_read_buf *b = &c->buf[c->cur];
    plan_batch(v, b, indices, rows, dst);
    return read_rounds(v, c, b, dst, bytes, zs);
}

/* Reads global sample s of every field to row `at` of dst: the row-by-row
 * path of ON_ERROR skip. Raw fields in one io call, then each .npy.zst
 * field's frame, read and decoded through the scratch buffers. */
static int read_row(const npyl_read_view *v, npyl_read_ctx *c, int64_t s, size_t at, uint8_t *const *dst,
                    uint64_t *bytes, zstats *zs)
{
    npyl_read_buf *b = &c->buf[c->cur];
    size_t n = 0, bad = 0;
    for (size_t fi = 0; fi < v->nfields; fi++) {
        const npyl_field *f = &v->fields[fi];
        const npyl_ffile *ff = find_file(f, s);
        if (ff->zst)
            continue;
        raw_req(&b->reqs[n], &b->rff[n], f, ff, s, 1,
                dst[fi] + (uint64_t)at * f->stage_row_bytes);
        n++;
    }
    int rc = n ? read_reqs(v, c->io, c->rm, &c->split, b->reqs, n, &bad, bytes, c->errmsg,
                           sizeof c->errmsg)
               : 0;
    if (rc == 0)
        rc = expand_raw(v, c, b->reqs, b->rff, n);
    for (size_t fi = 0; rc == 0 && fi < v->nfields; fi++) {
        const npyl_field *f = &v->fields[fi];
        const npyl_ffile *ff = find_file(f, s);
        if (!ff->zst)
            continue;
        npyl_zrow z = {.field = (uint32_t)fi, .file = ff->io_index, .row = (uint32_t)at,
                       .local = (uint64_t)(s - ff->first), .ff = ff};
        uint64_t off, got = 0;
        npyl_zst_locate(ff->zst, z.local, &z.frame, &off);
        uint64_t coff = ff->zst->coff[z.frame], csz = ff->zst->coff[z.frame + 1] - coff;
        uint64_t p = place(v, 0, coff);
        npyl_io_req q = {.file = z.file, .offset = coff, .len = csz, .dst = b->zsrc + p};
        rc = read_reqs(v, c->io, c->rm, &c->split, &q, 1, &bad, &got, c->errmsg,
                       sizeof c->errmsg);
        if (rc) {
            name_frame(c, &z);
            break;
        }
        zs->cbytes += csz;
        /* One row of the frame: never its whole (decode_group goes through
         * the scratch unless the frame is exactly this one row, in place). */
        rc = decode_group(v, c, &z, 1, b->zsrc + p, dst, bytes, zs);
    }
    return rc;
}

/* ON_ERROR skip: the batch's reads failed. Retry them once; if they fail
 * again, read row by row, each good row landing right after the previous
 * good one (rows only move down, so nothing unread is overwritten), and drop
 * the rows that fail. A row is delivered only when its own read succeeded,
 * identity checks and frame checksums included: never wrong bytes. Returns
 * 0 (the slot now holds only good rows, possibly none) or the read's error
 * when more than MAX_ERRORS samples were skipped; c->errmsg says why. */
static int read_skipping(const npyl_read_view *v, npyl_read_ctx *c, int64_t *indices,
                         size_t *rows, uint8_t *const *dst, int rc, uint64_t *bytes, zstats *zs)
{
    atomic_fetch_add(&v->st->errors, 1);
    pthread_mutex_lock(&v->skip->mu);
    snprintf(v->skip->msg, sizeof v->skip->msg, "%s", c->errmsg);
    pthread_mutex_unlock(&v->skip->mu);
    if (read_all(v, c, indices, *rows, dst, bytes, zs) == 0)
        return 0;
    size_t kept = 0, skipped = 0;
    for (size_t r = 0; r < *rows; r++) {
        int64_t s = indices[r];
        int rrc = read_row(v, c, s, kept, dst, bytes, zs);
        if (rrc == 0) {
            indices[kept++] = s;
            continue;
        }
        skipped++;
        rc = rrc;
        pthread_mutex_lock(&v->skip->mu);
        snprintf(v->skip->msg, sizeof v->skip->msg, "sample %" PRId64 ": %.900s", s, c->errmsg);
        pthread_mutex_unlock(&v->skip->mu);
    }
    *rows = kept;
    uint64_t total = atomic_fetch_add(&v->st->skipped, skipped) + skipped;
    int64_t max = v->max_errors;
    if (max > 0 && total > (uint64_t)max)
        return rc; /* c->errmsg holds the last failure */
    return 0;
}

/* The end of every batch read: ON_ERROR skip on a failure, the .npy.zst
 * counters. */
static int finish_batch(const npyl_read_view *v, npyl_read_ctx *c, int64_t *indices,
                        size_t *rows, uint8_t *const *dst, int rc, uint64_t *bytes, zstats *zs)
{
    if (rc && v->skip_errors)
        rc = read_skipping(v, c, indices, rows, dst, rc, bytes, zs);
    if (zs->cbytes | zs->dbytes | zs->ns) {
        atomic_fetch_add(&v->st->zcbytes, zs->cbytes);
        atomic_fetch_add(&v->st->zdbytes, zs->dbytes);
        atomic_fetch_add(&v->st->zdecode_ns, zs->ns);
    }
    return rc;
}

int npyl_read_batch(const npyl_read_view *v, npyl_read_ctx *c, int64_t *indices, size_t *rows,
                    uint8_t *const *dst, uint64_t *bytes)
{
    zstats zs = {0, 0, 0};
    int rc = read_all(v, c, indices, *rows, dst, bytes, &zs);
    return finish_batch(v, c, indices, rows, dst, rc, bytes, &zs);
}

/* ---- read-ahead ----
 *
 * Each worker has a thread of its own that only performs reads: the worker
 * hands it the first round of its next batch's reads (npyl_read_begin),
 * decodes or transforms its current batch meanwhile, and takes the result
 * when it needs it (npyl_read_end). Why a thread per worker and not reads
 * submitted to the worker's io_uring: one path for every backend (pread
 * and mmap cannot submit asynchronously; the gather path and io_uring's
 * page-cache hits complete inline on the submitting thread, so submitting
 * alone would copy on the worker anyway), with the io layer unchanged: its
 * identity checks, O_DIRECT placement, error messages and the io_uring ->
 * pread fallback hold as they are. The thread has its own io context
 * (contexts belong to one thread at a time); the worker's own context
 * serves the rounds after the first and ON_ERROR skip's retries. Why not
 * one shared I/O thread: a page-cached read is a copy, and one thread
 * copying for every worker would cap throughput at one core's memcpy. */

enum { AHEAD_IDLE = 0, AHEAD_QUEUED, AHEAD_DONE };

struct npyl_ahead {
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* state changed, or quit */
    pthread_t thread;
    int started, quit;    /* [mu] quit */
    int state;            /* [mu] AHEAD_* */
    npyl_io *io;          /* the thread's own context */
    npyl_remote_ctx *rm;  /* and its remote one (NULL: no remote file) */
    npyl_rsplit split;
    const npyl_read_view *v;
    _Atomic uint64_t cpu_ns; /* the thread's CPU time, per round */
    _Atomic uint64_t blocked_ns; /* its off-CPU time in the rounds */
    const npyl_io_req *reqs; /* [mu] the queued round */
    size_t n;
    int rc;               /* [mu] its result */
    size_t bad;
    uint64_t got;
    char errmsg[NPYL_ERRMSG_LEN];
};

static void *ahead_main(void *arg)
{
    struct npyl_ahead *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (a->state != AHEAD_QUEUED && !a->quit)
            pthread_cond_wait(&a->cv, &a->mu);
        if (a->state != AHEAD_QUEUED)
            break; /* quit, nothing queued */
        const npyl_io_req *reqs = a->reqs;
        size_t n = a->n, bad = 0;
        pthread_mutex_unlock(&a->mu);
        uint64_t got = 0, cpu = npyl_thread_cpu_ns();
        npyl_span span = npyl_span_begin();
        int rc = read_reqs(a->v, a->io, a->rm, &a->split, reqs, n, &bad, &got, a->errmsg,
                           sizeof a->errmsg);
        atomic_fetch_add(&a->blocked_ns, npyl_blocked_since(span));
        npyl_count_cpu(&a->cpu_ns, &cpu);
        pthread_mutex_lock(&a->mu);
        a->rc = rc;
        a->bad = bad;
        a->got = got;
        a->state = AHEAD_DONE;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int ahead_start(npyl_read_ctx *c, const npyl_read_view *v, const npyl_io_config *cfg,
                       char *err, size_t errlen)
{
    struct npyl_ahead *a = calloc(1, sizeof *a);
    if (!a)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    c->ahead = a;
    a->v = v;
    int rc = npyl_io_create(&a->io, cfg, err, errlen);
    if (rc == 0 && v->robjs)
        rc = npyl_remote_ctx_create(&a->rm, v->remote, v->robjs, cfg->nfiles, err, errlen);
    if (rc)
        return rc;
    rc = pthread_create(&a->thread, NULL, ahead_main, a);
    if (rc)
        return npyl_fail(err, errlen, -rc, "cannot start a read-ahead thread: %s",
                         npyload_strerror(-rc));
    a->started = 1;
    return 0;
}

static void ahead_stop(struct npyl_ahead *a)
{
    if (!a)
        return;
    if (a->started) {
        pthread_mutex_lock(&a->mu);
        a->quit = 1; /* a round queued is read first: it writes into our buffers */
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->thread, NULL);
    }
    npyl_io_destroy(a->io);
    npyl_remote_ctx_destroy(a->rm);
    rsplit_fini(&a->split);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}

void npyl_read_begin(const npyl_read_view *v, npyl_read_ctx *c, const int64_t *indices,
                     size_t rows, uint8_t *const *dst, int here)
{
    npyl_read_buf *b = &c->buf[c->cur ^ 1];
    plan_batch(v, b, indices, rows, dst);
    plan_round(v, b);
    if (here) {
        /* Nothing to overlap with: no hand-off, whose wake-up costs a
         * scheduling delay when every core is busy decoding. */
        b->bad = 0;
        b->got = 0;
        b->rc = read_reqs(v, c->io, c->rm, &c->split, b->reqs, b->nreq, &b->bad, &b->got,
                          c->errmsg, sizeof c->errmsg);
        c->cur ^= 1;
        c->read_here = 1;
        return;
    }
    struct npyl_ahead *a = c->ahead;
    pthread_mutex_lock(&a->mu);
    a->reqs = b->reqs;
    a->n = b->nreq;
    a->state = AHEAD_QUEUED;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

void npyl_read_wait(npyl_read_ctx *c)
{
    if (c->read_here) {
        c->read_here = 0; /* read by begin itself */
        return;
    }
    struct npyl_ahead *a = c->ahead;
    pthread_mutex_lock(&a->mu);
    while (a->state != AHEAD_DONE)
        pthread_cond_wait(&a->cv, &a->mu);
    a->state = AHEAD_IDLE;
    c->cur ^= 1;
    npyl_read_buf *b = &c->buf[c->cur];
    b->rc = a->rc; /* the next begin reuses a's result fields */
    b->bad = a->bad;
    b->got = a->got;
    pthread_mutex_unlock(&a->mu);
    if (b->rc)
        snprintf(c->errmsg, sizeof c->errmsg, "%s", a->errmsg);
}

int npyl_read_end(const npyl_read_view *v, npyl_read_ctx *c, int64_t *indices, size_t *rows,
                  uint8_t *const *dst, uint64_t *bytes)
{
    struct npyl_ahead *a = c->ahead;
    pthread_mutex_lock(&a->mu);
    int overlapped = a->state != AHEAD_IDLE; /* the next batch's reads begun */
    pthread_mutex_unlock(&a->mu);
    if (overlapped)
        atomic_fetch_add(&v->st->ahead, 1);
    npyl_read_buf *b = &c->buf[c->cur];
    zstats zs = {0, 0, 0};
    int rc = finish_round(v, c, b, b->rc, b->bad, b->got, dst, bytes, &zs);
    if (rc == 0 && b->u < b->nz)
        rc = read_rounds(v, c, b, dst, bytes, &zs);
    return finish_batch(v, c, indices, rows, dst, rc, bytes, &zs);
}

/* ---- a worker's reading state ---- */

/* Buffers for batches of up to B rows: requests, .npy.zst rows and, when
 * any file is .npy.zst, the compressed scratch. */
static int buf_init(npyl_read_buf *b, const npyl_read_view *v, size_t B,
                    const npyl_zst_sizes *zsz)
{
    b->reqs = calloc(B * v->nfields, sizeof *b->reqs);
    b->rff = calloc(B * v->nfields, sizeof *b->rff);
    if (!b->reqs || !b->rff)
        return -ENOMEM;
    if (!zsz->any)
        return 0;
    /* One frame, wherever its offset puts it: max_csize + the alignment. */
    uint64_t one = (uint64_t)zsz->max_csize + NPYL_DIRECT_ALIGN;
    uint64_t all = one * B * v->nfields;
    uint64_t cap = all < ZSRC_MAX_BYTES ? all : ZSRC_MAX_BYTES;
    if (cap < one)
        cap = one;
    cap = (cap + NPYL_DIRECT_ALIGN - 1) & ~(uint64_t)(NPYL_DIRECT_ALIGN - 1);
    b->zsrc = npyl_alloc_aligned((size_t)cap, NPYL_DIRECT_ALIGN);
    b->zsrc_cap = (size_t)cap;
    b->zrows = calloc(B * v->nfields, sizeof *b->zrows);
    return b->zsrc && b->zrows ? 0 : -ENOMEM;
}

static void buf_fini(npyl_read_buf *b)
{
    free(b->reqs);
    free(b->rff);
    npyl_free_aligned(b->zsrc);
    free(b->zrows);
    memset(b, 0, sizeof *b);
}

int npyl_read_ctx_init(npyl_read_ctx *c, const npyl_read_view *v, const npyl_io_config *cfg,
                       size_t rows, const npyl_zst_sizes *zsz, int ahead, char *err,
                       size_t errlen)
{
    int rc = npyl_io_create(&c->io, cfg, err, errlen);
    if (rc == 0 && v->robjs)
        rc = npyl_remote_ctx_create(&c->rm, v->remote, v->robjs, cfg->nfiles, err, errlen);
    if (rc)
        return rc;
    /* Rows a batch can hold here (min(BATCH_SIZE, the rank's share)), as
     * the slots are sized: a huge BATCH_SIZE over a small field reserves
     * nothing more. */
    size_t B = rows;
    for (int i = 0; i < 1 + (ahead != 0); i++)
        if (buf_init(&c->buf[i], v, B, zsz))
            return npyl_fail(err, errlen, -ENOMEM, "out of memory for the read buffers "
                             "(%zu rows x %zu fields%s)", B, v->nfields,
                             zsz->any ? ", .npy.zst frames" : "");
    if (zsz->any) {
        /* The decode window: a frame of several samples up to this size
         * decodes into it in one call, a larger one streams through it. */
        c->zdst_cap = zsz->max_multi_dsize ? zsz->max_multi_dsize : 1;
        if (c->zdst_cap > NPYL_ZST_WINDOW_BYTES)
            c->zdst_cap = NPYL_ZST_WINDOW_BYTES;
        c->zdst = malloc(c->zdst_cap);
        c->dctx = npyl_zst_dctx_create();
        if (!c->zdst || !c->dctx)
            return npyl_fail(err, errlen, -ENOMEM, "out of memory for the .npy.zst "
                             "decoder (%zu bytes per worker)", c->zdst_cap);
    }
    return ahead ? ahead_start(c, v, cfg, err, errlen) : 0;
}

void npyl_read_ctx_fini(npyl_read_ctx *c)
{
    ahead_stop(c->ahead); /* first: its reads land in the buffers */
    c->ahead = NULL;
    npyl_io_destroy(c->io);
    c->io = NULL;
    npyl_remote_ctx_destroy(c->rm);
    c->rm = NULL;
    rsplit_fini(&c->split);
    buf_fini(&c->buf[0]);
    buf_fini(&c->buf[1]);
    npyl_zst_dctx_free(c->dctx);
    free(c->zdst);
    c->dctx = NULL;
    c->zdst = NULL;
    c->zdst_cap = 0;
}

void npyl_read_ctx_counters(const npyl_read_ctx *c, npyl_io_counters *k, uint64_t *fallbacks)
{
    const npyl_io *ios[2] = {c->io, c->ahead ? c->ahead->io : NULL};
    int fell = 0;
    for (int i = 0; i < 2; i++) {
        if (!ios[i])
            continue;
        npyl_io_counters_add(ios[i], k);
        if (i == 1) {
            k->cpu_ns += atomic_load(&c->ahead->cpu_ns);
            k->blocked_ns += atomic_load(&c->ahead->blocked_ns);
        }
        fell |= npyl_io_backend_now(ios[i]) == NPYLOAD_IO_PREAD;
    }
    *fallbacks += (uint64_t)fell;
}

/* ---- the skip log ---- */

void npyl_skip_log_init(npyl_skip_log *g)
{
    pthread_mutex_init(&g->mu, NULL);
    g->msg[0] = 0;
}

void npyl_skip_log_fini(npyl_skip_log *g) { pthread_mutex_destroy(&g->mu); }

void npyl_skip_log_get(npyl_skip_log *g, char *buf, size_t len)
{
    pthread_mutex_lock(&g->mu);
    npyload_mask_urls(g->msg, buf, len); /* a path may be a URL */
    pthread_mutex_unlock(&g->mu);
}
