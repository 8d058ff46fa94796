/* ON_ERROR skip: when a batch's reads fail, they are retried once, then
 * read row by row, and the rows that still fail are dropped (never wrong
 * bytes: a row is delivered only when its own read, identity checks and
 * frame checksums included, succeeded); the skip log keeps the last
 * failure behind a skip. And the end of every batch read (the .npy.zst
 * counters). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "npyload_loader_read_skip.h"

/* Reads global sample s of every field to row `at` of dst: the row-by-row
 * path of ON_ERROR skip. Raw fields in one io call, then each .npy.zst
 * field's frame, read and decoded through the scratch buffers. */
static int read_row(const npyl_read_view *v, npyl_read_ctx *c, int64_t s, size_t at, uint8_t *const *dst,
                    uint64_t *bytes, npyl_zstats *zs)
{
    npyl_read_buf *b = &c->buf[c->cur];
    size_t n = 0, bad = 0;
    for (size_t fi = 0; fi < v->nfields; fi++) {
        const npyl_field *f = &v->fields[fi];
        const npyl_ffile *ff = npyl_rplan_file(f, s);
        if (ff->zst)
            continue;
        npyl_rplan_raw(&b->reqs[n], &b->rff[n], f, ff, s, 1,
                dst[fi] + (uint64_t)at * f->stage_row_bytes);
        n++;
    }
    int rc = n ? npyl_sctx_read(&c->io, b->reqs, n, &bad, bytes, c->errmsg,
                           sizeof c->errmsg)
               : 0;
    if (rc == 0)
        rc = npyl_rround_expand(v, c, b->reqs, b->rff, n);
    for (size_t fi = 0; rc == 0 && fi < v->nfields; fi++) {
        const npyl_field *f = &v->fields[fi];
        const npyl_ffile *ff = npyl_rplan_file(f, s);
        if (!ff->zst)
            continue;
        npyl_zrow z = {.field = (uint32_t)fi, .file = ff->io_index, .row = (uint32_t)at,
                       .local = (uint64_t)(s - ff->first), .ff = ff};
        uint64_t off, got = 0;
        npyl_zst_locate(ff->zst, z.local, &z.frame, &off);
        uint64_t coff = ff->zst->coff[z.frame], csz = ff->zst->coff[z.frame + 1] - coff;
        uint64_t p = npyl_rplan_place(v, 0, coff);
        npyl_req q = {.file = z.file, .offset = coff, .len = csz, .dst = b->zsrc + p};
        rc = npyl_sctx_read(&c->io, &q, 1, &bad, &got, c->errmsg,
                       sizeof c->errmsg);
        if (rc) {
            npyl_rround_name_frame(c, &z);
            break;
        }
        zs->cbytes += csz;
        /* One row of the frame: never its whole (npyl_rround_decode goes through
         * the scratch unless the frame is exactly this one row, in npyl_rplan_place). */
        rc = npyl_rround_decode(v, c, &z, 1, b->zsrc + p, dst, bytes, zs);
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
                         size_t *rows, uint8_t *const *dst, int rc, uint64_t *bytes, npyl_zstats *zs)
{
    atomic_fetch_add(&v->st->errors, 1);
    pthread_mutex_lock(&v->skip->mu);
    snprintf(v->skip->msg, sizeof v->skip->msg, "%s", c->errmsg);
    pthread_mutex_unlock(&v->skip->mu);
    if (npyl_rround_all(v, c, indices, *rows, dst, bytes, zs) == 0)
        return 0;
    size_t kept = 0, skipped = 0;
    for (size_t r = 0; r < *rows; r++) {
        int64_t s = indices[r];
        int rrc = read_row(v, c, s, kept, dst, bytes, zs);
        if (rrc == 0) {
            c->kept[kept] = r;
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
int npyl_rskip_finish(const npyl_read_view *v, npyl_read_ctx *c, int64_t *indices,
                        size_t *rows, uint8_t *const *dst, int rc, uint64_t *bytes, npyl_zstats *zs)
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

void npyl_skip_log_note(npyl_skip_log *g, int append, const char *fmt, ...)
{
    pthread_mutex_lock(&g->mu);
    size_t m = append ? strlen(g->msg) : 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->msg + m, sizeof g->msg - m, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&g->mu);
}
