/* A thread's reads through the stores: its contexts (one per store with
 * files), and a round of requests over them. A round that touches one
 * store goes straight to it (when every file of the table is one store's,
 * without a look at each request: one dispatch per round, not per
 * request). A round that touches several is split by store; every part
 * is submitted before any is waited for (the stores that start their
 * reads in submit, the remote one, first) and completed in the reverse
 * order (the stores that read inside complete, the local one, first), so
 * the remote GETs are in flight while the local reads run. A request a
 * store completes short is asked again for the rest (a store may do
 * that, saying so with NPYL_STORE_SHORT; none of the built-in ones does,
 * the tests' fault store does). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_store.h"

int npyl_sctx_open(npyl_sctx *c, const npyl_stores *set, const npyl_store_cfg *cfg, char *err,
                   size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->set = set;
    c->only = -1;
    int has[NPYL_STORE_MAX] = {0}, stores = 0;
    for (size_t k = 0; k < set->nfiles; k++)
        has[set->files[k].store] = 1;
    for (size_t i = 0; i < set->n; i++) {
        if (!has[i])
            continue;
        c->only = stores++ ? -1 : (int)i;
        int rc = set->ops[i]->ctx_open(set->s[i], set->files, set->nfiles, cfg, &c->c[i], err,
                                       errlen);
        if (rc)
            return rc;
    }
    return 0;
}

void npyl_sctx_close(npyl_sctx *c)
{
    for (size_t i = 0; c->set && i < c->set->n; i++) {
        if (c->c[i])
            c->set->ops[i]->ctx_close(c->c[i]);
        c->c[i] = NULL;
    }
    for (int b = 0; b < 3; b++) {
        free(c->buf[b].reqs);
        free(c->buf[b].at);
    }
    free(c->done);
    memset(c->buf, 0, sizeof c->buf);
    c->done = NULL;
    c->cap = 0;
}

void npyl_sctx_counters(const npyl_sctx *c, npyl_store_counters *k)
{
    for (size_t i = 0; c->set && i < c->set->n; i++)
        if (c->c[i] && c->set->ops[i]->ctx_counters)
            c->set->ops[i]->ctx_counters(c->c[i], k);
}

/* Scratch for rounds of n requests. */
static int reserve(npyl_sctx *c, size_t n, char *err, size_t errlen)
{
    if (n <= c->cap)
        return 0;
    size_t cap = n < 64 ? 64 : n * 2;
    int ok = 1;
    for (int b = 0; b < 3; b++) {
        npyl_req *r = realloc(c->buf[b].reqs, cap * sizeof *r);
        if (r)
            c->buf[b].reqs = r;
        size_t *at = realloc(c->buf[b].at, cap * sizeof *at);
        if (at)
            c->buf[b].at = at;
        ok &= r && at;
    }
    uint64_t *done = realloc(c->done, cap * sizeof *done);
    if (done)
        c->done = done;
    if (!ok || !done)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    c->cap = cap;
    return 0;
}

/* The requests of a part that completed short (done[k] < len) go to
 * `out`, for the rest, with their indices in the round. Returns how many,
 * or a negative error when one got nothing (*bad: it). */
static long short_rest(npyl_sctx *c, const npyl_req *reqs, const size_t *idx, size_t n,
                       npyl_sbuf *out, size_t *bad, char *err, size_t errlen)
{
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        const npyl_req *q = &reqs[k];
        uint64_t d = c->done[k];
        if (d >= q->len)
            continue;
        if (d == 0) {
            *bad = idx ? idx[k] : k;
            return npyl_fail(err, errlen, NPYLOAD_ETRUNCATED, "%s: %" PRIu64 " bytes at "
                             "offset %" PRIu64 " asked, the store delivered none",
                             c->set->files[q->file].path, q->len, q->offset);
        }
        out->at[m] = idx ? idx[k] : k;
        out->reqs[m++] = (npyl_req){q->file, q->offset + d, q->len - d, (uint8_t *)q->dst + d};
    }
    return (long)m;
}

/* Store st's part of a round, reqs[0 .. n) (idx: their indices in the
 * round, NULL when they are the whole round), submitted already: completes
 * it, and asks again for what came short (the rest alternates between the
 * scratch buffers 1 and 2; buffer 0 may hold the split round). */
static int complete_part(npyl_sctx *c, uint32_t st, const npyl_req *reqs, const size_t *idx,
                         size_t n, size_t *bad, uint64_t *landed, char *err, size_t errlen)
{
    const npyl_store_ops *o = c->set->ops[st];
    for (int turn = 1;; turn = 3 - turn) {
        size_t b = 0;
        int rc = o->complete(c->c[st], reqs, n, c->done, &b, landed, err, errlen);
        if (rc < 0) {
            *bad = idx ? idx[b] : b;
            return rc;
        }
        if (rc != NPYL_STORE_SHORT)
            return 0; /* every request whole */
        npyl_sbuf *rest = &c->buf[turn];
        long m = short_rest(c, reqs, idx, n, rest, bad, err, errlen);
        if (m <= 0)
            return (int)m;
        reqs = rest->reqs;
        idx = rest->at;
        n = (size_t)m;
        if (o->submit && (rc = o->submit(c->c[st], reqs, n, err, errlen)) != 0) {
            o->complete(c->c[st], reqs, n, c->done, &b, landed, c->scratch, sizeof c->scratch);
            *bad = idx[b < n ? b : 0];
            return rc;
        }
    }
}

int npyl_sctx_read(npyl_sctx *c, const npyl_req *reqs, size_t n, size_t *bad, uint64_t *landed,
                   char *err, size_t errlen)
{
    size_t bad_local = 0;
    uint64_t landed_local = 0;
    if (!bad)
        bad = &bad_local;
    if (!landed)
        landed = &landed_local;
    if (n == 0)
        return 0;
    const npyl_stores *set = c->set;
    int rc = reserve(c, n, err, errlen);
    if (rc) {
        *bad = 0;
        return rc;
    }
    size_t count[NPYL_STORE_MAX] = {0};
    uint32_t first;
    if (c->only >= 0) {
        first = (uint32_t)c->only; /* every file is one store's: no look per request */
        count[first] = n;
    } else {
        for (size_t k = 0; k < n; k++)
            count[set->files[reqs[k].file].store]++;
        first = set->files[reqs[0].file].store;
    }
    if (count[first] == n) {
        /* One store: straight to it. */
        const npyl_store_ops *o = set->ops[first];
        if (o->submit && (rc = o->submit(c->c[first], reqs, n, err, errlen)) != 0) {
            o->complete(c->c[first], reqs, n, c->done, bad, landed, c->scratch,
                        sizeof c->scratch);
            return rc;
        }
        return complete_part(c, first, reqs, NULL, n, bad, landed, err, errlen);
    }
    /* Split by store into buffer 0, each part in the order of the round. */
    npyl_sbuf *split = &c->buf[0];
    size_t start[NPYL_STORE_MAX + 1] = {0};
    for (size_t i = 0; i < set->n; i++)
        start[i + 1] = start[i] + count[i];
    size_t fill[NPYL_STORE_MAX];
    memcpy(fill, start, sizeof fill);
    for (size_t k = 0; k < n; k++) {
        uint32_t st = set->files[reqs[k].file].store;
        split->reqs[fill[st]] = reqs[k];
        split->at[fill[st]++] = k;
    }
    /* Every part submitted before any is waited for: the stores that start
     * their reads in submit (async) first; then completed the other way
     * round: those that read inside complete (the local store) first,
     * while the others' reads are in flight. After a failure the parts
     * still submitted are completed only to finish them, their messages
     * discarded. */
    size_t order[NPYL_STORE_MAX], no = 0;
    for (int async = 1; async >= 0; async--)
        for (size_t i = 0; i < set->n; i++)
            if (count[i] && set->ops[i]->async == async)
                order[no++] = i;
    int submitted[NPYL_STORE_MAX] = {0}, failed = -1;
    for (size_t j = 0; j < no && rc == 0; j++) {
        size_t i = order[j];
        if (set->ops[i]->submit)
            rc = set->ops[i]->submit(c->c[i], split->reqs + start[i], count[i], err, errlen);
        submitted[i] = 1; /* even when it failed: complete follows every submit */
        if (rc)
            failed = (int)i;
    }
    for (size_t j = no; j-- > 0;) {
        size_t i = order[j];
        if (!submitted[i])
            continue;
        const npyl_req *part = split->reqs + start[i];
        const size_t *at = split->at + start[i];
        if (rc) {
            size_t b = 0;
            set->ops[i]->complete(c->c[i], part, count[i], c->done, &b, landed, c->scratch,
                                  sizeof c->scratch);
            if ((int)i == failed)
                *bad = at[b < count[i] ? b : 0];
            continue;
        }
        rc = complete_part(c, (uint32_t)i, part, at, count[i], bad, landed, err, errlen);
    }
    return rc;
}
