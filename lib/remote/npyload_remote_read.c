/* A thread's remote reads, and start's probe.
 *
 * npyl_remote_read: the requests (runs of rows, .npy.zst frames) become
 * pieces, sorted by object and offset. Without a cache, pieces that touch
 * or overlap become one ranged GET (up to NPYL_REMOTE_XFER_MAX bytes), its
 * body scattered into the pieces' destinations. With a cache, pieces are
 * cut at block boundaries; a block in the cache is read from its file
 * (pread), and consecutive missing blocks of an object become one GET whose
 * body goes both to the pieces and to the blocks' files. Either way up to
 * max_inflight GETs run at once on the context's multi handle. */
#include "npyload_remote_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct npyl_remote_ctx {
    npyl_remote *r;
    const npyl_remote_obj *objs;
    size_t nobjs;
    char (*keys)[33];         /* per object: its cache key ("" not cached) */
    npyl_xpool pool;
    npyl_piece *pieces;
    size_t pcap;
    npyl_xfer *xf;
    size_t xcap;
    npyl_fill *fills;
    size_t fcap;
    char (*tmps)[64];
    size_t tcap;
    npyl_inflight **tks;      /* per fill block (as tmps): its claim */
    size_t kcap;
    struct rwait *waits;      /* blocks another thread is fetching */
    size_t wcap;
    /* The round npyl_remote_submit began, for npyl_remote_complete. */
    struct rsub {
        int submitted, started; /* a round is in; its transfers are running */
        int rc;               /* submit's failure (complete returns it) */
        size_t bad, xbad;
        size_t nx, nw;        /* transfers; blocks other threads fetch */
        uint64_t want;        /* the round's bytes */
    } sub;
};

/* A block another thread of this process is fetching: its pieces
 * [p0, p1) of c->pieces wait for that fetch (npyl_cache_wait). */
typedef struct rwait {
    npyl_inflight *t;
    size_t p0, p1;
    uint64_t k, blen;
} rwait;

int npyl_remote_ctx_create(npyl_remote_ctx **out, npyl_remote *r, const npyl_remote_obj *objs,
                           size_t nobjs, char *err, size_t errlen)
{
    *out = NULL;
    npyl_remote_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    c->r = r;
    c->objs = objs;
    c->nobjs = nobjs;
    c->keys = calloc(nobjs ? nobjs : 1, sizeof *c->keys);
    if (!c->keys || npyl_xpool_init(&c->pool, r->max_inflight) != 0) {
        npyl_remote_ctx_destroy(c);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory for the HTTP handles");
    }
    if (r->cache)
        for (size_t i = 0; i < nobjs; i++)
            if (objs[i].url && objs[i].etag[0])
                npyl_cache_key(r->cache, objs[i].url, objs[i].etag, objs[i].size, c->keys[i]);
    *out = c;
    return 0;
}

void npyl_remote_ctx_destroy(npyl_remote_ctx *c)
{
    if (!c)
        return;
    npyl_xpool_fini(&c->pool);
    free(c->keys);
    free(c->pieces);
    free(c->xf);
    free(c->fills);
    free(c->tmps);
    free(c->tks);
    free(c->waits);
    free(c);
}

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * size);
    if (!q)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

static int piece_cmp(const void *pa, const void *pb)
{
    const npyl_piece *a = pa, *b = pb;
    if (a->obj != b->obj)
        return a->obj < b->obj ? -1 : 1;
    if (a->off != b->off)
        return a->off < b->off ? -1 : 1;
    return a->len < b->len ? -1 : a->len > b->len;
}

static npyl_xfer *new_xfer(npyl_remote_ctx *c, size_t *nx, const npyl_remote_obj *o)
{
    npyl_xfer *x = &c->xf[(*nx)++];
    memset(x, 0, sizeof *x);
    x->url = o->url;
    x->size = o->size;
    x->etag = o->etag;
    return x;
}

/* Reads the pieces [i, j) of block k of object o from cache file fd. */
static int read_cached(int fd, const npyl_piece *p, size_t n, uint64_t k, uint64_t B)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t left = p[i].len, at = p[i].off - k * B;
        uint8_t *dst = p[i].dst;
        while (left > 0) {
            ssize_t g = pread(fd, dst, left, (off_t)at);
            if (g < 0 && errno == EINTR)
                continue;
            if (g <= 0)
                return -1;
            dst += g;
            at += (uint64_t)g;
            left -= (uint64_t)g;
        }
    }
    return 0;
}

/* A block whose fetcher in another process went away without storing it
 * (NPYL_WAIT_YOURS): this thread's claim now, fetched at once into the
 * cache (so that the processes still waiting for it find it) and
 * released. x: a free transfer slot. */
static int fetch_claimed(npyl_remote_ctx *c, const rwait *q, npyl_xfer *x, size_t *bad,
                         char *err, size_t errlen)
{
    npyl_remote *r = c->r;
    npyl_piece *p = &c->pieces[q->p0];
    atomic_fetch_add_explicit(&r->cache_misses, 1, memory_order_relaxed);
    const npyl_remote_obj *o = &c->objs[p->obj];
    memset(x, 0, sizeof *x);
    x->url = o->url;
    x->size = o->size;
    x->etag = o->etag;
    x->a = q->k * npyl_cache_block(r->cache);
    x->b = x->a + q->blen;
    x->pieces = p;
    x->npieces = q->p1 - q->p0;
    /* The main round is over: its fill slots are free. */
    npyl_fill *f = &c->fills[0];
    memset(f, 0, sizeof *f);
    memcpy(f->key, c->keys[p->obj], sizeof f->key);
    f->k0 = q->k;
    f->k1 = q->k + 1;
    f->fd = -1;
    f->tmp = &c->tmps[0];
    c->tmps[0][0] = 0;
    f->tk = &c->tks[0];
    c->tks[0] = q->t;
    x->fill = f;
    size_t xbad = 0;
    int rc = npyl_xfer_run(r, &c->pool, x, 1, &xbad, err, errlen);
    if (rc)
        *bad = p->req;
    npyl_cache_release(r->cache, q->t, rc, rc ? err : NULL);
    return rc;
}

/* The blocks other threads or processes were fetching (c->waits[0 ..
 * nw)): each waited for (bounded by what their fetch may take), then read
 * from the cache; a fetch of this process that failed fails these reads
 * with its error; a block whose fetcher elsewhere went away is fetched
 * here into the cache; a block the fetch did not keep (or a wait that
 * timed out) is fetched here. rc: the reader's failure so far (then only
 * the claims are dropped). */
static int wait_others(npyl_remote_ctx *c, size_t nw, int rc, size_t *bad, char *err,
                       size_t errlen)
{
    npyl_remote *r = c->r;
    npyl_cache *cache = r->cache;
    long bound = r->timeout_ms * (r->retries + 1) + (long)NPYL_REMOTE_RETRY_CAP_MS * r->retries;
    size_t nx = 0;
    for (size_t w = 0; w < nw; w++) {
        rwait *q = &c->waits[w];
        char why[512] = "";
        int got = npyl_cache_wait(cache, q->t, rc ? 0 : bound, why, sizeof why);
        if (rc)
            continue;
        npyl_piece *p = &c->pieces[q->p0];
        if (got < 0) {
            *bad = p->req;
            rc = npyl_fail(err, errlen, got, "%s", why);
            continue;
        }
        if (got == NPYL_WAIT_YOURS) {
            /* c->xf[nx]: past the fetches collected below (nx <= w < np). */
            rc = fetch_claimed(c, q, &c->xf[nx], bad, err, errlen);
            continue;
        }
        int fd = got == 0 ? npyl_cache_lookup(cache, c->keys[p->obj], q->k, q->blen) : -1;
        if (fd >= 0) {
            int rrc = read_cached(fd, p, q->p1 - q->p0, q->k, npyl_cache_block(cache));
            close(fd);
            if (rrc == 0) {
                uint64_t n = 0;
                for (size_t t = q->p0; t < q->p1; t++)
                    n += c->pieces[t].len;
                atomic_fetch_add_explicit(&r->cache_hits, 1, memory_order_relaxed);
                atomic_fetch_add_explicit(&r->cache_read_bytes, n, memory_order_relaxed);
                continue;
            }
        }
        /* Not in the cache after all: fetch the block's pieces here. */
        atomic_fetch_add_explicit(&r->cache_misses, 1, memory_order_relaxed);
        npyl_xfer *x = new_xfer(c, &nx, &c->objs[p->obj]);
        x->a = q->k * npyl_cache_block(cache);
        x->b = x->a + q->blen;
        x->pieces = p;
        x->npieces = q->p1 - q->p0;
    }
    size_t xbad = 0;
    if (rc == 0 && nx && (rc = npyl_xfer_run(r, &c->pool, c->xf, nx, &xbad, err, errlen)))
        *bad = c->xf[xbad].pieces[0].req;
    return rc;
}

int npyl_remote_submit(npyl_remote_ctx *c, const npyl_remote_req *reqs, size_t n, char *err,
                       size_t errlen)
{
    npyl_remote *r = c->r;
    npyl_cache *cache = r->cache;
    uint64_t B = cache ? npyl_cache_block(cache) : 0;
    size_t *bad = &c->sub.bad;
    c->sub = (struct rsub){.submitted = 1};
    /* Pieces: each request, cut at cache block boundaries when its object
     * is cached. */
    size_t np = 0;
    uint64_t want = 0;
    for (size_t i = 0; i < n; i++) {
        const npyl_remote_req *q = &reqs[i];
        if (q->len == 0)
            continue;
        if (q->file >= c->nobjs || !c->objs[q->file].url) {
            *bad = i;
            return c->sub.rc = npyl_fail(err, errlen, NPYLOAD_EINVAL,
                                         "object %" PRIu32 " is not remote", q->file);
        }
        const npyl_remote_obj *o = &c->objs[q->file];
        if (q->offset > o->size || q->len > o->size - q->offset) {
            *bad = i;
            return c->sub.rc = npyl_fail(err, errlen, NPYLOAD_ETRUNCATED,
                             "%s: %" PRIu64 " bytes at offset %" PRIu64 " asked of an "
                             "object of %" PRIu64, o->url, q->len, q->offset, o->size);
        }
        int cached = cache && c->keys[q->file][0];
        uint64_t off = q->offset, end = q->offset + q->len;
        uint8_t *dst = q->dst;
        while (off < end) {
            uint64_t e = cached ? ((off / B + 1) * B < end ? (off / B + 1) * B : end) : end;
            if (grow((void **)&c->pieces, &c->pcap, np + 1, sizeof *c->pieces)) {
                *bad = i;
                return c->sub.rc = npyl_fail(err, errlen, -ENOMEM, "out of memory");
            }
            c->pieces[np++] = (npyl_piece){off, e - off, dst, i, q->file};
            dst += e - off;
            off = e;
        }
        want += q->len;
    }
    qsort(c->pieces, np, sizeof *c->pieces, piece_cmp);
    /* Transfers: at most one per piece. */
    if (grow((void **)&c->xf, &c->xcap, np ? np : 1, sizeof *c->xf) ||
        (cache && (grow((void **)&c->fills, &c->fcap, np ? np : 1, sizeof *c->fills) ||
                   grow((void **)&c->tmps, &c->tcap, np ? np : 1, sizeof *c->tmps) ||
                   grow((void **)&c->tks, &c->kcap, np ? np : 1, sizeof *c->tks))))
        return c->sub.rc = npyl_fail(err, errlen, -ENOMEM, "out of memory");
    size_t nx = 0, ntmp = 0, nw = 0;
    int rc = 0;
    for (size_t i = 0; i < np;) {
        npyl_piece *p = &c->pieces[i];
        const npyl_remote_obj *o = &c->objs[p->obj];
        if (cache && c->keys[p->obj][0]) {
            /* The pieces of block k. */
            uint64_t k = p->off / B, blen = (k + 1) * B < o->size ? B : o->size - k * B;
            size_t j = i + 1;
            while (j < np && c->pieces[j].obj == p->obj && c->pieces[j].off / B == k)
                j++;
            int fd = npyl_cache_lookup(cache, c->keys[p->obj], k, blen);
            if (fd >= 0) {
                int rrc = read_cached(fd, p, j - i, k, B);
                close(fd);
                if (rrc == 0) {
                    atomic_fetch_add_explicit(&r->cache_hits, 1, memory_order_relaxed);
                    uint64_t got = 0;
                    for (size_t t = i; t < j; t++)
                        got += c->pieces[t].len;
                    atomic_fetch_add_explicit(&r->cache_read_bytes, got, memory_order_relaxed);
                    i = j;
                    continue;
                }
            }
            /* A miss: fetch it, unless another thread of this process is
             * fetching it already (then wait for that one below). */
            int claim;
            npyl_inflight *tk = npyl_cache_claim(cache, c->keys[p->obj], k, &claim);
            if (claim == NPYL_CLAIM_WAIT) {
                if (grow((void **)&c->waits, &c->wcap, nw + 1, sizeof *c->waits)) {
                    npyl_cache_release(cache, tk, 0, NULL); /* drop our reference */
                    rc = npyl_fail(err, errlen, -ENOMEM, "out of memory");
                    break;
                }
                c->waits[nw++] = (rwait){tk, i, j, k, blen};
                i = j;
                continue;
            }
            c->tks[ntmp] = tk;
            atomic_fetch_add_explicit(&r->cache_misses, 1, memory_order_relaxed);
            npyl_xfer *x = nx ? &c->xf[nx - 1] : NULL;
            if (x && x->fill && x->pieces[0].obj == p->obj && x->fill->k1 == k &&
                x->b - x->a + blen <= NPYL_REMOTE_XFER_MAX) {
                /* The next block of the previous transfer's object. */
                x->b += blen;
                x->fill->k1 = k + 1;
                x->npieces += j - i;
                ntmp++;
            } else {
                x = new_xfer(c, &nx, o);
                x->a = k * B;
                x->b = k * B + blen;
                x->pieces = p;
                x->npieces = j - i;
                npyl_fill *f = &c->fills[nx - 1];
                memset(f, 0, sizeof *f);
                memcpy(f->key, c->keys[p->obj], sizeof f->key);
                f->k0 = k;
                f->k1 = k + 1;
                f->fd = -1;
                f->tk = &c->tks[ntmp];
                f->tmp = &c->tmps[ntmp++];
                x->fill = f;
            }
            /* The pieces of this transfer must be contiguous in c->pieces:
             * they are (sorted, and misses are appended in order) unless a
             * hit came between; a hit ends the transfer above (k1 != k). */
            i = j;
            continue;
        }
        /* Uncached: pieces that touch or overlap, up to the size cap. */
        npyl_xfer *x = new_xfer(c, &nx, o);
        x->a = p->off;
        x->b = p->off + p->len;
        x->pieces = p;
        size_t j = i + 1;
        while (j < np && c->pieces[j].obj == p->obj && c->pieces[j].off <= x->b &&
               (c->pieces[j].off + c->pieces[j].len > x->b
                    ? c->pieces[j].off + c->pieces[j].len
                    : x->b) - x->a <= NPYL_REMOTE_XFER_MAX) {
            if (c->pieces[j].off + c->pieces[j].len > x->b)
                x->b = c->pieces[j].off + c->pieces[j].len;
            j++;
        }
        x->npieces = j - i;
        i = j;
    }
    for (size_t t = 0; t < ntmp; t++)
        c->tmps[t][0] = 0;
    /* The transfers' requests go out now; npyl_remote_complete waits. */
    size_t xbad = 0;
    if (rc == 0 && nx && (rc = npyl_xfer_start(r, &c->pool, c->xf, nx, &xbad, err, errlen)))
        c->sub.xbad = xbad;
    c->sub.started = rc == 0 && nx;
    c->sub.rc = rc;
    c->sub.nx = nx;
    c->sub.nw = nw;
    c->sub.want = want;
    return rc;
}

int npyl_remote_complete(npyl_remote_ctx *c, size_t *bad, uint64_t *bytes_read, char *err,
                         size_t errlen)
{
    npyl_remote *r = c->r;
    npyl_cache *cache = r->cache;
    struct rsub sub = c->sub;
    c->sub.submitted = 0;
    size_t bad_local = 0;
    if (!bad)
        bad = &bad_local;
    *bad = sub.bad;
    int rc = sub.rc;
    size_t nx = sub.nx, nw = sub.nw, xbad = sub.xbad;
    if (sub.started)
        rc = npyl_xfer_run(r, &c->pool, c->xf, nx, &xbad, err, errlen);
    if (rc && nx && rc != -ENOMEM)
        *bad = c->xf[xbad].pieces[0].req;
    /* Our claims, before any wait (no thread waits holding a claim): a
     * fetch that failed hands its error to the threads waiting for it; a
     * block not fetched because another transfer failed is left to them. */
    for (size_t t = 0; t < nx; t++) {
        npyl_fill *f = c->xf[t].fill;
        for (uint64_t k = 0; f && k < f->k1 - f->k0; k++) {
            int failed = rc && t == xbad && c->xf[t].state != NPYL_X_DONE;
            npyl_cache_release(cache, f->tk[k], failed ? rc : 0, failed ? err : NULL);
        }
    }
    if (nw)
        rc = wait_others(c, nw, rc, bad, err, errlen);
    if (rc)
        return rc;
    if (bytes_read)
        *bytes_read += sub.want;
    return 0;
}

int npyl_remote_read(npyl_remote_ctx *c, const npyl_remote_req *reqs, size_t n, size_t *bad,
                     uint64_t *bytes_read, char *err, size_t errlen)
{
    npyl_remote_submit(c, reqs, n, err, errlen); /* its failure is complete's */
    return npyl_remote_complete(c, bad, bytes_read, err, errlen);
}

/* ---- start: probes -------------------------------------------------------------- */

void npyl_remote_probe_free(npyl_remote_probe *p)
{
    free(p->head);
    free(p->tail);
    p->head = p->tail = NULL;
    p->head_len = p->tail_len = 0;
}

/* The transfers of one probe round over p[0 .. n): 0 heads, 1 tails. */
static int probe_round(npyl_remote *r, npyl_xpool *pool, npyl_remote_probe *p, size_t n,
                       int tails, npyl_remote_want_tail want_tail, size_t *bad, char *err,
                       size_t errlen)
{
    npyl_xfer *x = calloc(n ? n : 1, sizeof *x);
    npyl_piece *pc = calloc(n ? n : 1, sizeof *pc);
    size_t *who = calloc(n ? n : 1, sizeof *who);
    if (!x || !pc || !who) {
        free(x);
        free(pc);
        free(who);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    size_t nx = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        npyl_remote_probe *q = &p[i];
        uint64_t a, b;
        unsigned char *buf;
        if (!tails) {
            a = 0;
            b = NPYL_REMOTE_HEAD_BYTES;
            buf = q->head = malloc(NPYL_REMOTE_HEAD_BYTES);
        } else {
            if (want_tail && !want_tail(q))
                continue;
            uint64_t t = q->size < NPYL_REMOTE_TAIL_BYTES ? q->size : NPYL_REMOTE_TAIL_BYTES;
            q->tail_len = (size_t)t;
            buf = q->tail = malloc(t ? t : 1);
            if (buf && q->size <= q->head_len) {
                memcpy(buf, q->head, (size_t)t); /* the head holds it all */
                continue;
            }
            a = q->size - t;
            b = q->size;
        }
        if (!buf) {
            rc = npyl_fail(err, errlen, -ENOMEM, "out of memory");
            break;
        }
        npyl_xfer *t = &x[nx];
        t->url = q->url;
        t->size = tails ? q->size : UINT64_MAX;
        t->etag = tails ? q->etag : "";
        t->probe = !tails;
        t->a = a;
        t->b = b;
        pc[nx] = (npyl_piece){a, b - a, buf, i, 0};
        t->pieces = &pc[nx];
        t->npieces = 1;
        who[nx++] = i;
    }
    size_t xb = 0;
    if (rc == 0 && nx)
        rc = npyl_xfer_run(r, pool, x, nx, &xb, err, errlen);
    if (rc && nx)
        *bad = who[xb];
    if (rc == 0 && !tails)
        for (size_t k = 0; k < nx; k++) {
            npyl_remote_probe *q = &p[who[k]];
            q->size = x[k].got_size;
            q->head_len = (size_t)(q->size < NPYL_REMOTE_HEAD_BYTES ? q->size
                                                                    : NPYL_REMOTE_HEAD_BYTES);
            snprintf(q->etag, sizeof q->etag, "%s", x[k].etag_got);
        }
    free(x);
    free(pc);
    free(who);
    return rc;
}

int npyl_remote_probe_all(npyl_remote *r, npyl_remote_probe *p, size_t n,
                          npyl_remote_want_tail want_tail, size_t *bad, char *err,
                          size_t errlen)
{
    npyl_xpool pool;
    int rc = npyl_xpool_init(&pool, r->max_inflight > 16 ? r->max_inflight : 16);
    if (rc) {
        npyl_xpool_fini(&pool);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory for the HTTP handles");
    }
    *bad = 0;
    pool.caller = 1; /* start's (or inspect's) thread */
    rc = probe_round(r, &pool, p, n, 0, NULL, bad, err, errlen);
    if (rc == 0)
        rc = probe_round(r, &pool, p, n, 1, want_tail, bad, err, errlen);
    npyl_xpool_fini(&pool);
    return rc;
}

int npyl_remote_get(npyl_remote *r, const npyl_remote_obj *o, uint64_t off, size_t len,
                    void *dst, char *err, size_t errlen)
{
    npyl_remote_ctx *c;
    int rc = npyl_remote_ctx_create(&c, r, o, 1, err, errlen);
    if (rc)
        return rc;
    c->pool.caller = 1; /* start's (or inspect's) thread */
    npyl_remote_req q = {0, off, len, dst};
    rc = npyl_remote_read(c, &q, 1, NULL, NULL, err, errlen);
    npyl_remote_ctx_destroy(c);
    return rc;
}
