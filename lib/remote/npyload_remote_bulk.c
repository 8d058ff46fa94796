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
 * The work goes in rounds of up to 3 x inflight transfers: a round claims
 * its blocks, runs its transfers (xfer: retries, checks, commits), then
 * releases them; the stop flag is looked at between rounds. A claim is
 * therefore held at most one round before its GET, and a loader that
 * needs such a block meanwhile waits for it rather than fetching it twice.
 * npyload_prefetch (the public API) runs it; the loader's background fill
 * is meant to, with the objects in the order its epoch needs them. */
#include "npyload_remote_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Transfers per round, per GET in flight. */
#define ROUND_PER_INFLIGHT 3

/* A block another thread or process was fetching when the round met it. */
typedef struct bwait {
    npyl_inflight *t;
    size_t obj;
    uint64_t k, blen;
} bwait;

typedef struct bulk {
    npyl_remote *r;
    npyl_cache *cache;
    const npyl_remote_obj *objs;
    char (*keys)[33];
    npyl_bulk_state *st;
    uint64_t B, R;
    npyl_xpool pool;
    /* a round */
    npyl_xfer *xf;
    npyl_fill *fills;
    char (*tmps)[64];
    npyl_inflight **tks;
    size_t maxx, maxb;
    /* the blocks left to others */
    bwait *waits;
    size_t nw, wcap;
} bulk;

static uint64_t block_len(const npyl_remote_obj *o, uint64_t k, uint64_t B)
{
    return (k + 1) * B < o->size ? B : o->size - k * B;
}

static void add(_Atomic uint64_t *v, uint64_t n)
{
    atomic_fetch_add_explicit(v, n, memory_order_relaxed);
}

/* Runs the round's nx transfers and releases their claims (a failed
 * transfer's with its error, for this process's waiters). */
static int run_round(bulk *b, size_t nx, char *err, size_t errlen)
{
    size_t xbad = 0;
    int rc = nx ? npyl_xfer_run(b->r, &b->pool, b->xf, nx, &xbad, err, errlen) : 0;
    for (size_t t = 0; t < nx; t++) {
        npyl_xfer *x = &b->xf[t];
        npyl_fill *f = x->fill;
        int ok = x->state == NPYL_X_DONE;
        for (uint64_t k = f->k0; k < f->k1; k++) {
            int failed = rc && t == xbad && !ok;
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

/* One block, fetched now into the cache: the claim t (may be NULL: then
 * unclaimed) released after. */
static int fetch_one(bulk *b, size_t obj, uint64_t k, uint64_t blen, npyl_inflight *t,
                     char *err, size_t errlen)
{
    const npyl_remote_obj *o = &b->objs[obj];
    npyl_xfer *x = &b->xf[0];
    memset(x, 0, sizeof *x);
    x->url = o->url;
    x->size = o->size;
    x->etag = o->etag;
    x->a = k * b->B;
    x->b = x->a + blen;
    npyl_fill *f = &b->fills[0];
    memset(f, 0, sizeof *f);
    memcpy(f->key, b->keys[obj], sizeof f->key);
    f->k0 = k;
    f->k1 = k + 1;
    f->fd = -1;
    f->tmp = &b->tmps[0];
    b->tmps[0][0] = 0;
    f->tk = &b->tks[0];
    b->tks[0] = t;
    x->fill = f;
    return run_round(b, 1, err, errlen);
}

/* The blocks left to others: each waited for (bounded by what a fetch
 * with its retries may take); fetched here when its fetcher went away
 * without storing it, failed, or the wait timed out. */
static int wait_others(bulk *b, int rc, char *err, size_t errlen)
{
    npyl_remote *r = b->r;
    long bound = r->timeout_ms * (r->retries + 1) + (long)NPYL_REMOTE_RETRY_CAP_MS * r->retries;
    for (size_t w = 0; w < b->nw; w++) {
        bwait *q = &b->waits[w];
        int got = npyl_cache_wait(b->cache, q->t, rc ? 0 : bound, NULL, 0);
        if (rc) {
            if (got == NPYL_WAIT_YOURS)
                npyl_cache_release(b->cache, q->t, 0, NULL);
            continue;
        }
        if (got == NPYL_WAIT_YOURS) {
            rc = fetch_one(b, q->obj, q->k, q->blen, q->t, err, errlen);
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
        rc = fetch_one(b, q->obj, q->k, q->blen, t, err, errlen);
    }
    b->nw = 0;
    return rc;
}

static void bulk_free(bulk *b)
{
    npyl_xpool_fini(&b->pool);
    free(b->keys);
    free(b->xf);
    free(b->fills);
    free(b->tmps);
    free(b->tks);
    free(b->waits);
}

int npyl_bulk_fill(npyl_remote *r, const npyl_remote_obj *objs, size_t n,
                   const npyl_bulk_opts *o, npyl_bulk_state *st, char *err, size_t errlen)
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
    b.st = st;
    b.B = npyl_cache_block(cache);
    uint64_t bound = npyl_cache_bound(cache), cap = bound - bound / 10;
    uint64_t budget = o->max_bytes && o->max_bytes < cap ? o->max_bytes : cap;
    uint64_t R = o->request_bytes ? o->request_bytes : NPYL_BULK_REQUEST;
    b.R = R < b.B ? b.B : (R + b.B - 1) / b.B * b.B;
    int inflight = o->inflight > 0 ? o->inflight : NPYL_BULK_INFLIGHT;
    b.maxx = (size_t)inflight * ROUND_PER_INFLIGHT;
    b.maxb = b.maxx * (size_t)(b.R / b.B);
    b.keys = calloc(n ? n : 1, sizeof *b.keys);
    b.xf = calloc(b.maxx, sizeof *b.xf);
    b.fills = calloc(b.maxx, sizeof *b.fills);
    b.tmps = calloc(b.maxb, sizeof *b.tmps);
    b.tks = calloc(b.maxb, sizeof *b.tks);
    if (!b.keys || !b.xf || !b.fills || !b.tmps || !b.tks ||
        npyl_xpool_init(&b.pool, inflight) != 0) {
        bulk_free(&b);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    /* The part: whole blocks, in the list's order, within the budget.
     * Objects without an ETag are never cached (nothing to fill). */
    uint64_t plan_bytes = 0, plan_blocks = 0;
    size_t end_obj = n;
    uint64_t end_k = 0;
    for (size_t i = 0; i < n && end_obj == n; i++) {
        if (!objs[i].url || !objs[i].etag[0])
            continue;
        npyl_cache_key(cache, objs[i].url, objs[i].etag, objs[i].size, b.keys[i]);
        for (uint64_t k = 0; k * b.B < objs[i].size; k++) {
            uint64_t blen = block_len(&objs[i], k, b.B);
            if (plan_bytes + blen > budget) {
                end_obj = i;
                end_k = k;
                break;
            }
            plan_bytes += blen;
            plan_blocks++;
        }
    }
    atomic_store(&st->planned_bytes, plan_bytes);
    atomic_store(&st->planned_blocks, plan_blocks);
    int rc = 0;
    size_t i = 0;
    uint64_t k = 0;
    while (rc == 0 && i < n) {
        if (atomic_load(&st->stop)) {
            rc = npyl_fail(err, errlen, -ECANCELED, "filling the cache: stopped");
            break;
        }
        size_t nx = 0, nb = 0;
        npyl_xfer *cur = NULL;
        while (i < n) {
            const npyl_remote_obj *ob = &objs[i];
            if ((i == end_obj && k >= end_k) || !b.keys[i][0] || k * b.B >= ob->size) {
                if (i == end_obj) {
                    i = n;
                    break;
                }
                i++;
                k = 0;
                cur = NULL;
                continue;
            }
            uint64_t blen = block_len(ob, k, b.B);
            int extend = cur && cur->fill->k1 == k && cur->b - cur->a + blen <= b.R;
            if (!extend && nx == b.maxx)
                break; /* the round is full */
            int fd = npyl_cache_lookup(cache, b.keys[i], k, blen);
            if (fd >= 0) {
                close(fd);
                add(&st->found_blocks, 1);
                add(&st->done_bytes, blen);
                k++;
                cur = NULL;
                continue;
            }
            int claim;
            npyl_inflight *t = npyl_cache_claim(cache, b.keys[i], k, &claim);
            if (claim == NPYL_CLAIM_WAIT) {
                if (b.nw == b.wcap) {
                    size_t nc = b.wcap ? 2 * b.wcap : 64;
                    bwait *v = realloc(b.waits, nc * sizeof *v);
                    if (!v) {
                        npyl_cache_wait(cache, t, 0, NULL, 0);
                        rc = npyl_fail(err, errlen, -ENOMEM, "out of memory");
                        break;
                    }
                    b.waits = v;
                    b.wcap = nc;
                }
                b.waits[b.nw++] = (bwait){t, i, k, blen};
                k++;
                cur = NULL;
                continue;
            }
            b.tks[nb] = t;
            if (extend) {
                cur->b += blen;
                cur->fill->k1 = k + 1;
            } else {
                cur = &b.xf[nx];
                memset(cur, 0, sizeof *cur);
                cur->url = ob->url;
                cur->size = ob->size;
                cur->etag = ob->etag;
                cur->a = k * b.B;
                cur->b = cur->a + blen;
                npyl_fill *f = &b.fills[nx++];
                memset(f, 0, sizeof *f);
                memcpy(f->key, b.keys[i], sizeof f->key);
                f->k0 = k;
                f->k1 = k + 1;
                f->fd = -1;
                f->tmp = &b.tmps[nb];
                f->tk = &b.tks[nb];
                cur->fill = f;
            }
            /* nb < maxb: a transfer holds at most R / B blocks. */
            b.tmps[nb++][0] = 0;
            k++;
        }
        int rrc = run_round(&b, nx, err, errlen);
        if (rc == 0)
            rc = rrc;
    }
    rc = wait_others(&b, rc, err, errlen);
    /* What the cache holds of the part now (another process's eviction may
     * have taken some already). */
    if (rc == 0) {
        uint64_t held = 0;
        for (size_t j = 0; j < n && j <= end_obj; j++)
            for (uint64_t q = 0; b.keys[j][0] && q * b.B < objs[j].size; q++) {
                if (j == end_obj && q >= end_k)
                    break;
                uint64_t blen = block_len(&objs[j], q, b.B);
                int fd = npyl_cache_lookup(cache, b.keys[j], q, blen);
                if (fd >= 0) {
                    close(fd);
                    held += blen;
                }
            }
        atomic_store(&st->done_bytes, held);
    }
    bulk_free(&b);
    return rc;
}
