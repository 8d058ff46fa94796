/* Bulk fill of the block cache: the blocks of a list of objects, in the
 * list's order, fetched with large sequential ranged GETs (whole blocks of
 * one object, up to request_bytes each, `inflight` of them at once) whose
 * bodies go straight into the blocks' files, never into memory. The part
 * filled is the list's first max_bytes (at most what the cache keeps
 * without evicting it again: 90 % of its bound). Blocks already in the
 * cache are kept (a lookup refreshes their age); blocks that another
 * thread or process is fetching are left to it (the claims of the cache,
 * one fetch per block per node) and waited for at the end, and fetched
 * here when their fetcher went away without storing them.
 *
 * Threads: up to 8 (inflight / 4, the calling thread one of them), each
 * with its own multi handle and inflight / threads GETs at once, so that
 * one thread's writes and fdatasyncs of finished blocks (done inside the
 * transfer loop) do not stall every transfer. Each works in rounds of up
 * to 3 x its GETs: under the shared mutex it takes the next blocks from the
 * shared cursor (lookups, claims), then runs their transfers (xfer:
 * retries, checks, commits) and releases their claims. The stop flag and
 * the first failure are looked at between rounds. A claim is therefore
 * held at most one round before its GET, and a loader that needs such a
 * block meanwhile waits for it rather than fetching it twice.
 * npyload_prefetch (the public API) runs it over whole objects; the
 * loader's background fill (lib/store's fill, the remote store) over
 * spans of blocks in the order its epoch needs them, as a background fill
 * (npyl_bulk_opts.background: its failures are never handed to the
 * readers that waited for its blocks, and a stop ends its waits). */
#include "npyload_remote_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Transfers per round, per GET in flight; threads at most, and GETs in
 * flight per thread at least. */
#define ROUND_PER_INFLIGHT 3
#define MAX_THREADS 8
#define INFLIGHT_PER_THREAD 4

/* A block another thread or process was fetching when a round met it. */
typedef struct bwait {
    npyl_inflight *t;
    size_t obj;
    uint64_t k, blen;
} bwait;

/* What the threads share. */
typedef struct bulk {
    npyl_remote *r;
    npyl_cache *cache;
    const npyl_remote_obj *objs;
    size_t n;
    char (*keys)[33];
    const npyl_bulk_span *spans; /* what to fill, in order */
    size_t ns;
    npyl_bulk_state *st;
    int background;
    uint64_t B, R;
    size_t end_span;          /* the part ends before block end_k of it */
    uint64_t end_k;
    pthread_mutex_t mu;       /* the cursor, the waits, the failure */
    size_t j;                 /* the cursor: block k of span j is next */
    uint64_t k;
    bwait *waits;
    size_t nw, wcap;
    int rc;                   /* the first failure */
    char err[1024];
} bulk;

/* One thread's transfers. */
typedef struct bworker {
    bulk *b;
    npyl_xpool pool;
    npyl_xfer *xf;
    npyl_fill *fills;
    char (*tmps)[64];
    npyl_inflight **tks;
    size_t maxx;
    int inflight;
    pthread_t tid;
    int started;
} bworker;

static uint64_t block_len(const npyl_remote_obj *o, uint64_t k, uint64_t B)
{
    return (k + 1) * B < o->size ? B : o->size - k * B;
}

static void add(_Atomic uint64_t *v, uint64_t n)
{
    atomic_fetch_add_explicit(v, n, memory_order_relaxed);
}

static int worker_init(bworker *w, bulk *b, int inflight)
{
    memset(w, 0, sizeof *w);
    w->b = b;
    w->inflight = inflight;
    w->maxx = (size_t)inflight * ROUND_PER_INFLIGHT;
    size_t maxb = w->maxx * (size_t)(b->R / b->B); /* a transfer: <= R / B blocks */
    w->xf = calloc(w->maxx, sizeof *w->xf);
    w->fills = calloc(w->maxx, sizeof *w->fills);
    w->tmps = calloc(maxb, sizeof *w->tmps);
    w->tks = calloc(maxb, sizeof *w->tks);
    if (!w->xf || !w->fills || !w->tmps || !w->tks || npyl_xpool_init(&w->pool, inflight))
        return -ENOMEM;
    return 0;
}

static void worker_fini(bworker *w)
{
    npyl_xpool_fini(&w->pool);
    free(w->xf);
    free(w->fills);
    free(w->tmps);
    free(w->tks);
}

/* Runs the round's nx transfers and releases their claims (a failed
 * transfer's with its error, for this process's waiters). */
static int run_round(bworker *w, size_t nx, char *err, size_t errlen)
{
    bulk *b = w->b;
    size_t xbad = 0;
    int rc = nx ? npyl_xfer_run(b->r, &w->pool, w->xf, nx, &xbad, err, errlen) : 0;
    for (size_t t = 0; t < nx; t++) {
        npyl_xfer *x = &w->xf[t];
        npyl_fill *f = x->fill;
        int ok = x->state == NPYL_X_DONE;
        for (uint64_t k = f->k0; k < f->k1; k++) {
            /* A background fill's failure is not handed to the readers
             * waiting for its blocks: they fetch them themselves. */
            int failed = rc && t == xbad && !ok && !b->background;
            npyl_cache_release(b->cache, f->tk[k - f->k0], failed ? rc : 0, failed ? err : NULL);
        }
        if (ok) {
            add(&b->st->fetched_blocks, f->k1 - f->k0);
            add(&b->st->fetched_bytes, x->b - x->a);
            add(&b->st->done_bytes, x->b - x->a);
        }
    }
    return rc;
}

/* A new transfer of w's round for block k of object i (claim t). */
static npyl_xfer *new_transfer(bworker *w, size_t *nx, size_t nb, size_t i, uint64_t k,
                               uint64_t blen)
{
    bulk *b = w->b;
    const npyl_remote_obj *o = &b->objs[i];
    npyl_xfer *x = &w->xf[*nx];
    memset(x, 0, sizeof *x);
    x->url = o->url;
    x->size = o->size;
    x->etag = o->etag;
    x->a = k * b->B;
    x->b = x->a + blen;
    npyl_fill *f = &w->fills[(*nx)++];
    memset(f, 0, sizeof *f);
    memcpy(f->key, b->keys[i], sizeof f->key);
    f->k0 = k;
    f->k1 = k + 1;
    f->fd = -1;
    f->tmp = &w->tmps[nb];
    f->tk = &w->tks[nb];
    x->fill = f;
    return x;
}

/* One block, fetched now into the cache: the claim t (may be NULL: then
 * unclaimed) released after. */
static int fetch_one(bworker *w, size_t obj, uint64_t k, uint64_t blen, npyl_inflight *t,
                     char *err, size_t errlen)
{
    size_t nx = 0;
    new_transfer(w, &nx, 0, obj, k, blen);
    w->tks[0] = t;
    w->tmps[0][0] = 0;
    return run_round(w, 1, err, errlen);
}

/* Under b->mu: the next round of w from the shared cursor (blocks found in
 * the cache counted, blocks others fetch set aside). Returns the number of
 * transfers (0: the part is done), or -ENOMEM. */
static long take_round(bworker *w)
{
    bulk *b = w->b;
    size_t nx = 0, nb = 0;
    npyl_xfer *cur = NULL;
    while (b->j < b->ns) {
        const npyl_bulk_span *sp = &b->spans[b->j];
        const npyl_remote_obj *ob = &b->objs[sp->obj];
        if ((b->j == b->end_span && b->k >= b->end_k) || !b->keys[sp->obj][0] ||
            b->k >= sp->k1 || b->k * b->B >= ob->size) {
            if (b->j == b->end_span) {
                b->j = b->ns;
                break;
            }
            if (++b->j < b->ns)
                b->k = b->spans[b->j].k0;
            continue; /* cur stays: the next span may continue its GET */
        }
        size_t i = sp->obj;
        uint64_t k = b->k, blen = block_len(ob, k, b->B);
        int extend = cur && cur->url == ob->url && cur->fill->k1 == k &&
                     cur->b - cur->a + blen <= b->R;
        if (!extend && nx == w->maxx)
            break; /* the round is full */
        int fd = npyl_cache_lookup(b->cache, b->keys[i], k, blen);
        if (fd >= 0) {
            close(fd);
            add(&b->st->found_blocks, 1);
            add(&b->st->done_bytes, blen);
            b->k++;
            cur = NULL;
            continue;
        }
        if (b->nw == b->wcap) {
            size_t nc = b->wcap ? 2 * b->wcap : 64;
            bwait *v = realloc(b->waits, nc * sizeof *v);
            if (!v)
                return -ENOMEM; /* before the claim: nothing to drop */
            b->waits = v;
            b->wcap = nc;
        }
        int claim;
        npyl_inflight *t = npyl_cache_claim(b->cache, b->keys[i], k, &claim);
        b->k++;
        if (claim == NPYL_CLAIM_WAIT) {
            b->waits[b->nw++] = (bwait){t, i, k, blen};
            cur = NULL;
            continue;
        }
        if (extend) {
            cur->b += blen;
            cur->fill->k1 = k + 1;
        } else {
            cur = new_transfer(w, &nx, nb, i, k, blen);
        }
        w->tks[nb] = t;
        w->tmps[nb++][0] = 0;
    }
    return (long)nx;
}

static void fail_once(bulk *b, int rc, const char *err)
{
    if (b->rc == 0) {
        b->rc = rc;
        snprintf(b->err, sizeof b->err, "%s", err);
    }
}

static void *worker_main(void *arg)
{
    bworker *w = arg;
    bulk *b = w->b;
    char err[1024];
    for (;;) {
        pthread_mutex_lock(&b->mu);
        if (b->rc == 0 && atomic_load(&b->st->stop))
            fail_once(b, -ECANCELED, "filling the cache: stopped");
        long nx = b->rc ? 0 : take_round(w);
        if (nx < 0)
            fail_once(b, -ENOMEM, "out of memory");
        pthread_mutex_unlock(&b->mu);
        if (nx <= 0)
            break;
        int rc = run_round(w, (size_t)nx, err, sizeof err);
        if (rc) {
            pthread_mutex_lock(&b->mu);
            fail_once(b, rc, err);
            pthread_mutex_unlock(&b->mu);
            break;
        }
    }
    return NULL;
}

/* After the threads: the blocks left to others, each waited for (bounded
 * by what a fetch with its retries may take); fetched here when its
 * fetcher went away without storing it, failed, or the wait timed out. */
static int wait_others(bworker *w, int rc, char *err, size_t errlen)
{
    bulk *b = w->b;
    npyl_remote *r = b->r;
    long bound = r->timeout_ms * (r->retries + 1) + (long)NPYL_REMOTE_RETRY_CAP_MS * r->retries;
    for (size_t j = 0; j < b->nw; j++) {
        bwait *q = &b->waits[j];
        int got = npyl_cache_wait_stop(b->cache, q->t, rc ? 0 : bound,
                                       b->background ? &b->st->stop : NULL, NULL, 0);
        if (got == 1 && b->background && atomic_load(&b->st->stop) && rc == 0)
            rc = npyl_fail(err, errlen, -ECANCELED, "filling the cache: stopped");
        if (rc) {
            if (got == NPYL_WAIT_YOURS)
                npyl_cache_release(b->cache, q->t, 0, NULL);
            continue;
        }
        if (got == NPYL_WAIT_YOURS) {
            rc = fetch_one(w, q->obj, q->k, q->blen, q->t, err, errlen);
            continue;
        }
        int fd = got == 0 ? npyl_cache_lookup(b->cache, b->keys[q->obj], q->k, q->blen) : -1;
        if (fd >= 0) {
            close(fd);
            add(&b->st->waited_blocks, 1);
            add(&b->st->done_bytes, q->blen);
            continue;
        }
        /* Its fetch failed or was not kept, or the wait timed out: once
         * more, here (claimed when nobody else holds it). */
        int claim;
        npyl_inflight *t = npyl_cache_claim(b->cache, b->keys[q->obj], q->k, &claim);
        if (claim == NPYL_CLAIM_WAIT) {
            npyl_cache_wait(b->cache, t, 0, NULL, 0); /* drops the reference */
            t = NULL;
        }
        rc = fetch_one(w, q->obj, q->k, q->blen, t, err, errlen);
    }
    b->nw = 0;
    return rc;
}

/* Block count of an object. */
static uint64_t nblocks(const npyl_remote_obj *o, uint64_t B)
{
    return (o->size + B - 1) / B;
}

int npyl_bulk_fill(npyl_remote *r, const npyl_remote_obj *objs, size_t n,
                   const npyl_bulk_opts *o, npyl_bulk_state *st, char *err, size_t errlen)
{
    if (!r->cache)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "filling the cache needs a cache_dir in "
                         "the remote configuration");
    npyl_bulk_span *spans = calloc(n ? n : 1, sizeof *spans);
    if (!spans)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    uint64_t B = npyl_cache_block(r->cache);
    for (size_t i = 0; i < n; i++)
        spans[i] = (npyl_bulk_span){i, 0, nblocks(&objs[i], B)};
    int rc = npyl_bulk_fill_spans(r, objs, n, spans, n, o, st, err, errlen);
    free(spans);
    return rc;
}

int npyl_bulk_fill_spans(npyl_remote *r, const npyl_remote_obj *objs, size_t n,
                         const npyl_bulk_span *spans, size_t ns, const npyl_bulk_opts *o,
                         npyl_bulk_state *st, char *err, size_t errlen)
{
    npyl_cache *cache = r->cache;
    if (!cache)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "filling the cache needs a cache_dir in "
                         "the remote configuration");
    bulk b;
    memset(&b, 0, sizeof b);
    b.r = r;
    b.cache = cache;
    b.objs = objs;
    b.n = n;
    b.spans = spans;
    b.ns = ns;
    b.st = st;
    b.background = o->background;
    b.B = npyl_cache_block(cache);
    uint64_t bound = npyl_cache_bound(cache), cap = bound - bound / 10;
    uint64_t budget = o->max_bytes && o->max_bytes < cap ? o->max_bytes : cap;
    uint64_t R = o->request_bytes ? o->request_bytes : NPYL_BULK_REQUEST;
    b.R = R < b.B ? b.B : (R + b.B - 1) / b.B * b.B;
    int inflight = o->inflight > 0 ? o->inflight : NPYL_BULK_INFLIGHT;
    int nthreads = inflight / INFLIGHT_PER_THREAD;
    nthreads = nthreads < 1 ? 1 : nthreads > MAX_THREADS ? MAX_THREADS : nthreads;
    bworker w[MAX_THREADS];
    memset(w, 0, sizeof w);
    b.keys = calloc(n ? n : 1, sizeof *b.keys);
    int rc = b.keys ? 0 : -ENOMEM;
    for (int t = 0; t < nthreads && rc == 0; t++)
        rc = worker_init(&w[t], &b, (inflight + nthreads - 1 - t) / nthreads);
    if (rc) {
        for (int t = 0; t < nthreads; t++)
            worker_fini(&w[t]);
        free(b.keys);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    /* Objects without an ETag are never cached (nothing to fill). */
    for (size_t i = 0; i < n; i++)
        if (objs[i].url && objs[i].etag[0])
            npyl_cache_key(cache, objs[i].url, objs[i].etag, objs[i].size, b.keys[i]);
    /* The part: whole blocks, in the spans' order, within the budget. */
    uint64_t plan_bytes = 0, plan_blocks = 0;
    b.end_span = ns;
    for (size_t j = 0; j < ns && b.end_span == ns; j++) {
        const npyl_remote_obj *ob = &objs[spans[j].obj];
        if (!b.keys[spans[j].obj][0])
            continue;
        for (uint64_t k = spans[j].k0; k < spans[j].k1 && k * b.B < ob->size; k++) {
            uint64_t blen = block_len(ob, k, b.B);
            if (plan_bytes + blen > budget) {
                b.end_span = j;
                b.end_k = k;
                break;
            }
            plan_bytes += blen;
            plan_blocks++;
        }
    }
    b.k = ns ? spans[0].k0 : 0;
    atomic_store(&st->planned_bytes, plan_bytes);
    atomic_store(&st->planned_blocks, plan_blocks);
    pthread_mutex_init(&b.mu, NULL);
    /* The calling thread is worker 0; a thread that cannot start leaves
     * its share to the others. */
    for (int t = 1; t < nthreads; t++)
        w[t].started = pthread_create(&w[t].tid, NULL, worker_main, &w[t]) == 0;
    worker_main(&w[0]);
    for (int t = 1; t < nthreads; t++)
        if (w[t].started)
            pthread_join(w[t].tid, NULL);
    pthread_mutex_destroy(&b.mu);
    rc = b.rc;
    if (rc)
        npyl_fail(err, errlen, rc, "%s", b.err);
    rc = wait_others(&w[0], rc, err, errlen);
    /* What the cache holds of the part now (another process's eviction may
     * have taken some already). */
    if (rc == 0) {
        uint64_t held = 0;
        for (size_t j = 0; j < ns && j <= b.end_span; j++) {
            const npyl_remote_obj *ob = &objs[spans[j].obj];
            const char *key = b.keys[spans[j].obj];
            for (uint64_t q = spans[j].k0; key[0] && q < spans[j].k1 && q * b.B < ob->size;
                 q++) {
                if (j == b.end_span && q >= b.end_k)
                    break;
                uint64_t blen = block_len(ob, q, b.B);
                int fd = npyl_cache_lookup(cache, key, q, blen);
                if (fd >= 0) {
                    close(fd);
                    held += blen;
                }
            }
        }
        atomic_store(&st->done_bytes, held);
    }
    for (int t = 0; t < nthreads; t++)
        worker_fini(&w[t]);
    free(b.keys);
    free(b.waits);
    return rc;
}

int npyl_remote_cache_facts(const npyl_remote *r, uint64_t *block, uint64_t *budget)
{
    *block = *budget = 0;
    if (!r || !r->cache)
        return 0;
    uint64_t bound = npyl_cache_bound(r->cache);
    *block = npyl_cache_block(r->cache);
    *budget = bound - bound / 10;
    return 0;
}
