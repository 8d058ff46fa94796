/* The remote store: s3:// and http(s):// objects, read through lib/remote
 * (ranged GETs, several in flight, retries, the block cache; each object
 * checked against the size and ETag its probe saw). Its probe fetches the
 * heads of a group of objects at once, then the tails the headers ask for
 * (seek tables, narrowed trailers); a round's GETs are sent by submit and
 * waited for by complete, so the round's local reads run between the two.
 * Also npyload_remote_inspect: the header facts of one object for the
 * tools and npyload.inspect() (the client itself is lib/remote's public
 * API, npyload_remote_api.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_store.h"

typedef struct remote_store {
    npyl_remote *r;
    npyl_remote_obj *objs; /* per file of the table (url NULL: not ours) */
    size_t n;
} remote_store;

static int remote_claims(const char *path) { return npyl_remote_is_url(path); }

static int remote_open(npyl_store **out, const void *cfg, char *err, size_t errlen)
{
    remote_store *s = calloc(1, sizeof *s);
    if (!s)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    int rc = npyl_remote_create(&s->r, cfg, err, errlen);
    if (rc) {
        free(s);
        return rc;
    }
    *out = (npyl_store *)s;
    return 0;
}

static void remote_close(npyl_store *st)
{
    remote_store *s = (remote_store *)st;
    if (!s)
        return;
    npyl_remote_destroy(s->r); /* wipes the secret */
    free(s->objs);
    free(s);
}

static int remote_check(npyl_store *st, int configured, const char *path, char *err,
                        size_t errlen)
{
    remote_store *s = (remote_store *)st;
    return npyl_remote_check_url(s ? s->r : NULL, configured, path, err, errlen);
}

static int remote_glob(npyl_store *st, const char *pattern, char ***paths, size_t *n,
                       char *err, size_t errlen)
{
    return npyl_remote_glob(((remote_store *)st)->r, pattern, paths, n, err, errlen);
}

static int remote_table(npyl_store *st, size_t nfiles)
{
    remote_store *s = (remote_store *)st;
    free(s->objs);
    s->objs = nfiles ? calloc(nfiles, sizeof *s->objs) : NULL;
    s->n = s->objs ? nfiles : 0;
    return nfiles && !s->objs ? -ENOMEM : 0;
}

static int want_tail(const npyl_remote_probe *p)
{
    return npyl_stores_want_tail(p->head, p->head_len, p->size);
}

static int remote_probe(npyl_store *st, const npyl_sfile *t, const uint32_t *idx, size_t n,
                        npyl_sprobe *out, size_t *bad, char *err, size_t errlen)
{
    remote_store *s = (remote_store *)st;
    npyl_remote_probe *p = calloc(n ? n : 1, sizeof *p);
    if (!p)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    for (size_t k = 0; k < n; k++)
        p[k].url = t[idx[k]].path;
    int rc = npyl_remote_probe_all(s->r, p, n, want_tail, bad, err, errlen);
    for (size_t k = 0; k < n; k++) {
        out[k] = (npyl_sprobe){p[k].size, p[k].head, p[k].head_len, p[k].tail, p[k].tail_len};
        npyl_remote_obj *o = &s->objs[idx[k]];
        o->url = t[idx[k]].path;
        o->size = p[k].size;
        snprintf(o->etag, sizeof o->etag, "%s", p[k].etag);
    }
    free(p); /* the buffers are out[]'s now */
    return rc;
}

static int remote_read_at(npyl_store *st, const npyl_sfile *t, uint32_t file, void *buf,
                          size_t n, uint64_t off, char *err, size_t errlen)
{
    (void)t;
    remote_store *s = (remote_store *)st;
    return npyl_remote_get(s->r, &s->objs[file], off, n, buf, err, errlen);
}

/* An object's URL, hashed (FNV-1a, 64 bits) with its length. */
static int remote_key(npyl_store *st, const npyl_sfile *t, uint32_t file, const char *path,
                      char *key, size_t keylen)
{
    (void)st;
    const char *url = path ? path : t[file].path;
    uint64_t h = 0xcbf29ce484222325ull;
    size_t n = 0;
    for (; url[n]; n++)
        h = (h ^ (unsigned char)url[n]) * 0x100000001b3ull;
    snprintf(key, keylen, "u%016llx:%zu", (unsigned long long)h, n);
    return 0;
}

static int remote_ctx_open(npyl_store *st, const npyl_sfile *t, size_t nfiles,
                           const npyl_store_cfg *cfg, npyl_store_ctx **out, char *err,
                           size_t errlen)
{
    (void)t;
    (void)cfg;
    remote_store *s = (remote_store *)st;
    npyl_remote_ctx *c = NULL;
    int rc = npyl_remote_ctx_create(&c, s->r, s->objs, nfiles, err, errlen);
    *out = (npyl_store_ctx *)c;
    return rc;
}

static void remote_ctx_close(npyl_store_ctx *c)
{
    npyl_remote_ctx_destroy((npyl_remote_ctx *)c);
}

static int remote_submit(npyl_store_ctx *c, const npyl_req *reqs, size_t n, char *err,
                         size_t errlen)
{
    return npyl_remote_submit((npyl_remote_ctx *)c, reqs, n, err, errlen);
}

static int remote_complete(npyl_store_ctx *c, const npyl_req *reqs, size_t n, uint64_t *done,
                           size_t *bad, uint64_t *landed, char *err, size_t errlen)
{
    (void)reqs;
    (void)n;
    (void)done; /* lib/remote reads every request whole, or fails */
    return npyl_remote_complete((npyl_remote_ctx *)c, bad, landed, err, errlen);
}

static void remote_stats(const npyl_store *st, npyload_stats *out)
{
    const remote_store *s = (const remote_store *)st;
    npyl_remote_counters k = {0};
    npyl_remote_counters_add(s->r, &k);
    out->remote_bytes += k.bytes;
    out->remote_requests += k.requests;
    out->remote_retries += k.retries;
    out->remote_wait_ns += k.wait_ns;
    out->cache_hits += k.cache_hits;
    out->cache_misses += k.cache_misses;
    out->cache_read_bytes += k.cache_read_bytes;
    out->cache_write_bytes += k.cache_write_bytes;
    out->cache_evictions += k.cache_evictions;
}

static void remote_cancel(npyl_store *st, int on)
{
    npyl_remote_cancel(((remote_store *)st)->r, on);
}

static void remote_interrupt(npyl_store *st, int (*fn)(void *), void *arg)
{
    npyl_remote_set_interrupt(((remote_store *)st)->r, fn, arg);
}

static void remote_fill_facts(const npyl_store *st, uint64_t *unit, uint64_t *budget)
{
    npyl_remote_cache_facts(((const remote_store *)st)->r, unit, budget);
}

/* The ranges as spans of cache blocks (a range's blocks; a span continues
 * the one before when it starts where that one ends), then the bulk fill. */
static int remote_fill(npyl_store *st, const npyl_srange *ranges, size_t n,
                       const npyl_sfill_opts *o, npyl_sfill_state *fs, char *err,
                       size_t errlen)
{
    remote_store *s = (remote_store *)st;
    uint64_t B = 0, budget = 0;
    npyl_remote_cache_facts(s->r, &B, &budget);
    if (!B)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "filling the cache needs a cache_dir in "
                         "the remote configuration");
    npyl_bulk_span *sp = malloc((n ? n : 1) * sizeof *sp);
    if (!sp)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    size_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        const npyl_srange *q = &ranges[i];
        if (q->file >= s->n || !s->objs[q->file].url || q->len == 0)
            continue;
        uint64_t k0 = q->off / B, k1 = (q->off + q->len + B - 1) / B;
        if (ns && sp[ns - 1].obj == q->file && sp[ns - 1].k1 == k0)
            sp[ns - 1].k1 = k1;
        else
            sp[ns++] = (npyl_bulk_span){q->file, k0, k1};
    }
    int rc = npyl_bulk_fill_spans(s->r, s->objs, s->n, sp, ns, o, fs, err, errlen);
    free(sp);
    return rc;
}

const npyl_store_ops npyl_store_remote = {
    .name = "remote",
    .async = 1,
    .claims = remote_claims,
    .open = remote_open,
    .close = remote_close,
    .check = remote_check,
    .glob = remote_glob,
    .table = remote_table,
    .probe = remote_probe,
    .read_at = remote_read_at,
    .key = remote_key,
    .ctx_open = remote_ctx_open,
    .ctx_close = remote_ctx_close,
    .submit = remote_submit,
    .complete = remote_complete,
    .stats = remote_stats,
    .cancel = remote_cancel,
    .interrupt = remote_interrupt,
    .fill_facts = remote_fill_facts,
    .fill = remote_fill,
};

/* ---- npyload_remote_inspect: the public client's header facts ---- */

/* inspect's want_tail: a .npy.zst's seek table only. */
static int zst_tail(const npyl_remote_probe *p)
{
    return p->head_len >= 4 && npyl_zst_is_zstd(p->head);
}

/* What verify of a remote .npy.zst reads through: the object as seen at
 * inspect (URL, size, ETag; a changed object fails its GETs). */
typedef struct zst_remote_src {
    npyl_remote *r;
    npyl_remote_obj o;
    char url[];
} zst_remote_src;

static int zst_remote_read(void *ctx, void *buf, size_t n, uint64_t off)
{
    zst_remote_src *s = ctx;
    return npyl_remote_get(s->r, &s->o, off, n, buf, NULL, 0);
}

/* One object probed through the public client as start probes it: *p
 * (free it with npyl_remote_probe_free, whatever the result), *r the
 * client's core. */
static int client_probe(npyload_remote_client *c, const char *url,
                        int (*tail)(const npyl_remote_probe *), npyl_remote **r,
                        npyl_remote_probe *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    p->url = url;
    int configured = 0;
    *r = npyl_remote_client_core(c, &configured);
    int rc = npyl_remote_check_url(*r, configured, url, err, errlen);
    size_t bad = 0;
    return rc ? rc : npyl_remote_probe_all(*r, p, 1, tail, &bad, err, errlen);
}

int npyload_remote_inspect(npyload_remote_client *c, const char *url, npyload_header *hdr,
                           npyload_zst_file **zst, char *err, size_t errlen)
{
    if (!c || !url || !hdr || !zst)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyload_remote_inspect: NULL argument");
    *zst = NULL;
    memset(hdr, 0, sizeof *hdr);
    npyl_remote *r = NULL;
    npyl_remote_probe p;
    /* want_tail NULL would fetch every tail: only a .npy.zst's is needed. */
    int rc = client_probe(c, url, zst_tail, &r, &p, err, errlen);
    if (rc) {
        npyl_remote_probe_free(&p);
        return rc;
    }
    /* The object as seen now: GETs beyond the probe's bytes check its ETag. */
    zst_remote_src one = {.r = r, .o = {.url = url, .size = p.size}};
    snprintf(one.o.etag, sizeof one.o.etag, "%s", p.etag);
    npyl_sprobe sp = {p.size, p.head, p.head_len, p.tail, p.tail_len};
    npyl_sreader rd = {&sp, zst_remote_read, &one};
    if (p.head_len < 4 || !npyl_zst_is_zstd(p.head)) {
        rc = npyl_sprobe_npy_header(&rd, url, hdr, err, errlen);
        npyl_remote_probe_free(&p);
        return rc;
    }
    npyl_zst_index x;
    memset(&x, 0, sizeof x);
    rc = npyl_zst_index_read(npyl_sprobe_read, &rd, p.size, url, &x, err, errlen);
    if (rc == 0) {
        size_t ul = strlen(url) + 1;
        zst_remote_src *src = malloc(sizeof *src + ul);
        if (!src) {
            npyl_zst_index_free(&x);
            rc = npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", url);
        } else {
            memcpy(src->url, url, ul);
            src->r = r;
            src->o = one.o;
            src->o.url = src->url;
            if ((rc = npyl_zst_file_over(&x, url, zst_remote_read, src, free, zst)) != 0) {
                npyl_zst_index_free(&x);
                rc = npyl_fail(err, errlen, rc, "%s: out of memory", url);
            } else {
                *hdr = npyload_zst_file_facts(*zst)->hdr;
            }
        }
    }
    npyl_remote_probe_free(&p);
    return rc;
}

int npyload_remote_narrow_stored(npyload_remote_client *c, const char *url,
                                 const npyload_header *h, uint32_t *values,
                                 uint32_t *value_itemsize, char *value_descr, char *err,
                                 size_t errlen)
{
    if (!c || !url || !h)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "npyload_remote_narrow_stored: NULL argument");
    if (strcmp(h->descr, "|u1") != 0 || h->file_bytes <= h->data_offset + h->data_bytes)
        return 0; /* not the codes of a stored narrowed file: nothing to fetch */
    npyl_remote *r = NULL;
    npyl_remote_probe p;
    int rc = client_probe(c, url, want_tail, &r, &p, err, errlen);
    if (rc == 0) {
        zst_remote_src one = {.r = r, .o = {.url = url, .size = p.size}};
        snprintf(one.o.etag, sizeof one.o.etag, "%s", p.etag);
        npyl_sprobe sp = {p.size, p.head, p.head_len, p.tail, p.tail_len};
        npyl_sreader rd = {&sp, zst_remote_read, &one};
        npyload_header now = *h;
        now.file_bytes = p.size; /* as the object is now */
        rc = npyl_zst_store_facts(npyl_sprobe_read, &rd, url, &now, values, value_itemsize,
                                  value_descr, err, errlen);
    }
    npyl_remote_probe_free(&p);
    return rc;
}
