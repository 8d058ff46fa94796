/* A batch's rounds: each round's requests read through the stores (every
 * store's in flight together, npyl_sctx_read), the codes of narrowed raw
 * rows expanded, the round's .npy.zst frames decoded. A frame that holds
 * exactly the rows wanted, in order, decodes straight into the slot, and
 * so does a frame of one sample (repeated rows copied from the first); any
 * other is streamed through the worker's decode window (at most
 * NPYL_ZST_WINDOW_BYTES, whatever the frame's size: a frame of a million
 * 16-byte samples must not cost its decompressed size per worker) and its
 * rows are copied out as they pass. Such a frame is decoded to its end, so
 * that its checksum is verified before the batch is handed out. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "npyload_loader_read_round.h"

/* A narrowed file's n codes, read or decoded to `codes`, become what the
 * slot holds at dst: their values (dst may be codes' npyl_rplan_place, expanded front
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
 * become their values, in npyl_rplan_place (or stay, checked: dnarrow). */
int npyl_rround_expand(const npyl_read_view *v, npyl_read_ctx *c, const npyl_req *reqs,
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

/* Copies the wanted rows out of a frame's decompressed bytes as they stream
 * through the decode window: rows z[next..k) (sorted by their sample in the
 * frame) that overlap the chunk [pos, pos + n) get their overlapping part,
 * so a row split across two chunks is assembled in npyl_rplan_place. */
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
int npyl_rround_decode(const npyl_read_view *v, npyl_read_ctx *c, const npyl_zrow *z, size_t k,
                        const uint8_t *src, uint8_t *const *dst, uint64_t *bytes, npyl_zstats *zs)
{
    const npyl_field *f = &v->fields[z->field];
    const npyl_zst_index *x = z->ff->zst;
    const char *name = v->stores->files[z->file].path;
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
         * expanded in npyl_rplan_place, front to back. */
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
void npyl_rround_name_frame(npyl_read_ctx *c, const npyl_zrow *z)
{
    size_t n = strlen(c->errmsg);
    if (n + 1 < sizeof c->errmsg)
        snprintf(c->errmsg + n, sizeof c->errmsg - n, " (frame %" PRIu32 " at byte %" PRIu64 ")",
                 z->frame, z->ff->zst->coff[z->frame]);
}

/* A round's reads returned rc (the bad-th request failed; got bytes
 * landed): names the frame of a failed frame read, counts what landed and
 * decodes the round's frames. */
int npyl_rround_finish(const npyl_read_view *v, npyl_read_ctx *c, npyl_read_buf *b, int rc,
                        size_t bad, uint64_t got, uint8_t *const *dst, uint64_t *bytes,
                        npyl_zstats *zs)
{
    npyl_zrow *zr = b->zrows;
    if (rc) {
        if (b->nz == 0)
            *bytes += got; /* raw rows only: what landed counts */
        else if (bad >= b->nraw) { /* a frame: the bad-th request after the raw ones */
            size_t k = bad - b->nraw, t = b->u0;
            while (k--)
                t = npyl_rplan_frame_end(zr, t, b->nz);
            if (t < b->nz)
                npyl_rround_name_frame(c, &zr[t]);
        }
        return rc;
    }
    *bytes += got - b->cb; /* the raw rows; frames count as the rows they hold */
    zs->cbytes += b->cb;
    rc = b->nnx ? npyl_rround_expand(v, c, b->reqs, b->rff, b->nraw) : 0;
    if (rc)
        return rc;
    b->nraw = 0;
    for (size_t t = b->u0; t < b->u;) {
        size_t g = npyl_rplan_frame_end(zr, t, b->u);
        rc = npyl_rround_decode(v, c, &zr[t], g - t, b->zsrc + zr[t].src, dst, bytes, zs);
        if (rc)
            return rc;
        t = g;
    }
    return 0;
}

/* b's rounds from where it stands, each read through c's own io context
 * and decoded before the next. */
int npyl_rround_rest(const npyl_read_view *v, npyl_read_ctx *c, npyl_read_buf *b,
                       uint8_t *const *dst, uint64_t *bytes, npyl_zstats *zs)
{
    do {
        npyl_rplan_round(v, b);
        size_t bad = 0;
        uint64_t got = 0;
        int rc = npyl_sctx_read(&c->io, b->reqs, b->nreq, &bad, &got,
                           c->errmsg, sizeof c->errmsg);
        rc = npyl_rround_finish(v, c, b, rc, bad, got, dst, bytes, zs);
        if (rc)
            return rc;
    } while (b->u < b->nz);
    return 0;
}

/* Reads all of the batch's rows, every field, through c's current buffer:
 * the plain path. */
int npyl_rround_all(const npyl_read_view *v, npyl_read_ctx *c, const int64_t *indices,
                    size_t rows, uint8_t *const *dst, uint64_t *bytes, npyl_zstats *zs)
{
    npyl_read_buf *b = &c->buf[c->cur];
    npyl_rplan_batch(v, b, indices, rows, dst);
    return npyl_rround_rest(v, c, b, dst, bytes, zs);
}

