/* npyload_prefetch (include/npyload.h): a dataset's remote objects into a
 * node's cache before a job. The fields' globs are listed at add, the
 * objects probed at run (size and ETag: the cache key), put in sample
 * order (each field's files by their position in the field, the fields
 * interleaved), and filled by npyl_bulk_fill. Compiled in every build:
 * without libcurl, create fails saying what to install. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "npyload_remote.h"

struct npyload_prefetch {
    npyl_remote *r;
    char **urls;              /* every field's objects, fields in turn */
    uint32_t *field;          /* the field of each */
    size_t n, cap;
    uint32_t nfields;
    npyl_bulk_opts opts;
    npyl_bulk_state st;
    _Atomic uint64_t objects, dataset_bytes, t0_ns, elapsed_ns, probe_ns;
    _Atomic uint32_t phase;
    _Atomic int32_t rc;
    _Atomic int stop, running;
    _Atomic uint64_t req0, bytes0; /* the client's counters when run began */
    char err[2048];
};

static int fail(npyload_prefetch *P, int code, const char *fmt, ...) NPYL_PRINTF(3, 4);
static int fail(npyload_prefetch *P, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(P->err, sizeof P->err, fmt, ap);
    va_end(ap);
    return code;
}

int npyload_prefetch_create(npyload_prefetch **out, const npyload_remote *cfg, size_t size,
                            char *err, size_t errlen)
{
    if (!out)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyload_prefetch_create: NULL out");
    *out = NULL;
    if (!cfg)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyload_prefetch_create: a remote "
                         "configuration with a cache_dir is needed");
    npyload_remote mine;
    int rc = npyl_sized_in(&mine, sizeof mine, cfg, size,
                           NPYL_SIZE_THROUGH(npyload_remote, retry_base_ms));
    if (rc)
        return npyl_fail(err, errlen, rc,
                         rc == NPYLOAD_EINVAL
                             ? "npyload_prefetch_create: size %zu is below the first layout "
                               "of npyload_remote"
                             : "npyload_prefetch_create: a member this library does not know "
                               "is set (size %zu)", size);
    if (!mine.cache_dir || !mine.cache_dir[0])
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyload_prefetch_create: the remote "
                         "configuration has no cache_dir (the directory to fill)");
    npyload_prefetch *P = calloc(1, sizeof *P);
    if (!P)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    if ((rc = npyl_remote_create(&P->r, &mine, err, errlen)) != 0) {
        free(P);
        return rc;
    }
    *out = P;
    return 0;
}

void npyload_prefetch_destroy(npyload_prefetch *P)
{
    if (!P)
        return;
    npyl_remote_destroy(P->r);
    npyl_free_paths(P->urls, P->n);
    free(P->field);
    free(P);
}

static int push(npyload_prefetch *P, char *url)
{
    if (P->n == P->cap) {
        size_t nc = P->cap ? 2 * P->cap : 64;
        char **u = realloc(P->urls, nc * sizeof *u);
        if (!u)
            return -ENOMEM;
        P->urls = u;
        uint32_t *f = realloc(P->field, nc * sizeof *f);
        if (!f)
            return -ENOMEM;
        P->field = f;
        P->cap = nc;
    }
    P->urls[P->n] = url;
    P->field[P->n++] = P->nfields;
    return 0;
}

/* The objects of one field, appended (owned), or nothing on failure. */
static int add_urls(npyload_prefetch *P, char **urls, size_t n)
{
    size_t n0 = P->n;
    for (size_t i = 0; i < n; i++) {
        char *u = strdup(urls[i]);
        if (!u || push(P, u) != 0) {
            free(u);
            while (P->n > n0)
                free(P->urls[--P->n]);
            return fail(P, -ENOMEM, "out of memory");
        }
    }
    P->nfields++;
    return 0;
}

static int check(npyload_prefetch *P, const char *url)
{
    if (!npyl_remote_is_url(url))
        return fail(P, NPYLOAD_EINVAL, "%.1500s: not an s3:// or http(s):// path (a local "
                    "file needs no prefetch)", url);
    return npyl_remote_check_url(P->r, 1, url, P->err, sizeof P->err);
}

int npyload_prefetch_add_field(npyload_prefetch *P, const char *pattern)
{
    if (!P || !pattern)
        return NPYLOAD_EINVAL;
    if (atomic_load(&P->running))
        return fail(P, NPYLOAD_ESTATE, "npyload_prefetch_add_field: a run is in progress");
    P->err[0] = 0;
    int rc = check(P, pattern);
    if (rc)
        return rc;
    if (strncasecmp(pattern, "s3://", 5) != 0) {
        char *one[1] = {(char *)pattern};
        return add_urls(P, one, 1);
    }
    char **paths = NULL;
    size_t n = 0;
    rc = npyl_remote_glob(P->r, pattern, &paths, &n, P->err, sizeof P->err);
    if (rc == 0)
        rc = add_urls(P, paths, n);
    npyl_free_paths(paths, n);
    return rc;
}

int npyload_prefetch_add_field_files(npyload_prefetch *P, const char *const *urls, size_t n)
{
    if (!P || (!urls && n))
        return NPYLOAD_EINVAL;
    if (atomic_load(&P->running))
        return fail(P, NPYLOAD_ESTATE, "npyload_prefetch_add_field_files: a run is in "
                    "progress");
    P->err[0] = 0;
    if (n == 0)
        return fail(P, NPYLOAD_ENOFILES, "npyload_prefetch_add_field_files: no URL given");
    for (size_t i = 0; i < n; i++) {
        if (!urls[i])
            return fail(P, NPYLOAD_EINVAL, "npyload_prefetch_add_field_files: URL %zu is "
                        "NULL", i);
        int rc = check(P, urls[i]);
        if (rc)
            return rc;
    }
    return add_urls(P, (char **)urls, n);
}

int npyload_prefetch_set(npyload_prefetch *P, npyload_prefetch_option opt, int64_t v)
{
    if (!P)
        return NPYLOAD_EINVAL;
    if (atomic_load(&P->running))
        return fail(P, NPYLOAD_ESTATE, "npyload_prefetch_set: a run is in progress");
    P->err[0] = 0;
    switch (opt) {
    case NPYLOAD_PREFETCH_MAX_BYTES:
        if (v < 0)
            return fail(P, NPYLOAD_EINVAL, "MAX_BYTES must be >= 0 (0: what the cache "
                        "holds), %" PRId64 " given", v);
        P->opts.max_bytes = (uint64_t)v;
        return 0;
    case NPYLOAD_PREFETCH_INFLIGHT:
        if (v < 0 || v > 1024)
            return fail(P, NPYLOAD_EINVAL, "INFLIGHT must be 0 .. 1024 (0: %d), %" PRId64
                        " given", NPYL_BULK_INFLIGHT, v);
        P->opts.inflight = (int)v;
        return 0;
    case NPYLOAD_PREFETCH_REQUEST_BYTES:
        if (v != 0 && (v < 4096 || v > (1ll << 30)))
            return fail(P, NPYLOAD_EINVAL, "REQUEST_BYTES must be 4096 .. 1 GiB (0: 32 MiB), "
                        "%" PRId64 " given", v);
        P->opts.request_bytes = (uint64_t)v;
        return 0;
    }
    return fail(P, NPYLOAD_EINVAL, "npyload_prefetch_set: unknown option %d", (int)opt);
}

/* Sample order: an object's key is its first byte's position in its
 * field (as a fraction of the field's bytes); ties go by field, then by
 * the field's own order. */
typedef struct ord {
    double pos;
    uint32_t field;
    size_t i;
} ord;

static int ord_cmp(const void *pa, const void *pb)
{
    const ord *a = pa, *b = pb;
    if (a->pos != b->pos)
        return a->pos < b->pos ? -1 : 1;
    if (a->field != b->field)
        return a->field < b->field ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

static int no_tail(const npyl_remote_probe *p)
{
    (void)p;
    return 0;
}

/* Probes the objects and fills the table objs (in sample order). */
static int probe(npyload_prefetch *P, npyl_remote_obj *objs)
{
    npyl_remote_probe *pr = calloc(P->n, sizeof *pr);
    ord *o = calloc(P->n, sizeof *o);
    uint64_t *tot = calloc(P->nfields, sizeof *tot);
    int rc = pr && o && tot ? 0 : fail(P, -ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < P->n; i++)
        pr[i].url = P->urls[i];
    size_t bad = 0;
    if (rc == 0)
        rc = npyl_remote_probe_all(P->r, pr, P->n, no_tail, &bad, P->err, sizeof P->err);
    if (rc == 0) {
        uint64_t total = 0;
        for (size_t i = 0; i < P->n; i++) {
            o[i] = (ord){(double)tot[P->field[i]], P->field[i], i};
            tot[P->field[i]] += pr[i].size;
            total += pr[i].size;
        }
        for (size_t i = 0; i < P->n; i++)
            if (tot[o[i].field])
                o[i].pos /= (double)tot[o[i].field];
        qsort(o, P->n, sizeof *o, ord_cmp);
        for (size_t j = 0; j < P->n; j++) {
            const npyl_remote_probe *q = &pr[o[j].i];
            objs[j].url = P->urls[o[j].i];
            objs[j].size = q->size;
            snprintf(objs[j].etag, sizeof objs[j].etag, "%s", q->etag);
        }
        atomic_store(&P->dataset_bytes, total);
    }
    for (size_t i = 0; pr && i < P->n; i++)
        npyl_remote_probe_free(&pr[i]);
    free(pr);
    free(o);
    free(tot);
    return rc;
}

int npyload_prefetch_run(npyload_prefetch *P)
{
    if (!P)
        return NPYLOAD_EINVAL;
    if (P->n == 0)
        return fail(P, NPYLOAD_EINVAL, "npyload_prefetch_run: no field was added");
    P->err[0] = 0;
    /* Zeroed field by field: another thread may read them (progress). */
    atomic_store(&P->st.stop, 0);
    _Atomic uint64_t *c[] = {&P->st.planned_bytes, &P->st.planned_blocks, &P->st.done_bytes,
                             &P->st.found_blocks, &P->st.fetched_blocks, &P->st.fetched_bytes,
                             &P->st.waited_blocks};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        atomic_store(c[i], 0);
    npyl_remote_counters k0;
    memset(&k0, 0, sizeof k0);
    npyl_remote_counters_add(P->r, &k0);
    atomic_store(&P->req0, k0.requests);
    atomic_store(&P->bytes0, k0.bytes);
    atomic_store(&P->objects, (uint64_t)P->n);
    atomic_store(&P->dataset_bytes, 0);
    atomic_store(&P->elapsed_ns, 0);
    atomic_store(&P->probe_ns, 0);
    atomic_store(&P->t0_ns, npyl_now_ns());
    atomic_store(&P->rc, 0);
    atomic_store(&P->running, 1);
    atomic_store(&P->phase, NPYLOAD_PREFETCH_PROBING);
    int rc = 0;
    npyl_remote_obj *objs = calloc(P->n, sizeof *objs);
    if (!objs)
        rc = fail(P, -ENOMEM, "out of memory");
    if (rc == 0 && atomic_load(&P->stop))
        rc = fail(P, -ECANCELED, "filling the cache: stopped");
    if (rc == 0)
        rc = probe(P, objs);
    atomic_store(&P->probe_ns, npyl_now_ns() - atomic_load(&P->t0_ns));
    if (rc == 0) {
        atomic_store(&P->phase, NPYLOAD_PREFETCH_FILLING);
        /* A stop that came during the probe. */
        atomic_store(&P->st.stop, atomic_load(&P->stop));
        rc = npyl_bulk_fill(P->r, objs, P->n, &P->opts, &P->st, P->err, sizeof P->err);
    }
    free(objs);
    atomic_store(&P->elapsed_ns, npyl_now_ns() - atomic_load(&P->t0_ns));
    atomic_store(&P->rc, rc);
    atomic_store(&P->phase, NPYLOAD_PREFETCH_DONE);
    atomic_store(&P->stop, 0);
    atomic_store(&P->running, 0);
    return rc;
}

void npyload_prefetch_stop(npyload_prefetch *P)
{
    if (!P)
        return;
    atomic_store(&P->stop, 1);
    atomic_store(&P->st.stop, 1);
}

int npyload_prefetch_get_progress(const npyload_prefetch *P, npyload_prefetch_progress *out,
                                  size_t size)
{
    if (!P || !out)
        return NPYLOAD_EINVAL;
    npyload_prefetch_progress g;
    memset(&g, 0, sizeof g);
    npyload_prefetch *Q = (npyload_prefetch *)P; /* atomics: loads only */
    g.phase = atomic_load(&Q->phase);
    g.rc = atomic_load(&Q->rc);
    g.objects = atomic_load(&Q->objects);
    g.dataset_bytes = atomic_load(&Q->dataset_bytes);
    g.planned_bytes = atomic_load(&Q->st.planned_bytes);
    g.planned_blocks = atomic_load(&Q->st.planned_blocks);
    g.cached_bytes = atomic_load(&Q->st.done_bytes);
    g.fetched_bytes = atomic_load(&Q->st.fetched_bytes);
    g.found_blocks = atomic_load(&Q->st.found_blocks);
    g.fetched_blocks = atomic_load(&Q->st.fetched_blocks);
    g.waited_blocks = atomic_load(&Q->st.waited_blocks);
    g.probe_ns = atomic_load(&Q->probe_ns);
    if (g.phase != NPYLOAD_PREFETCH_IDLE) {
        npyl_remote_counters k;
        memset(&k, 0, sizeof k);
        npyl_remote_counters_add(P->r, &k);
        g.requests = k.requests - atomic_load(&Q->req0);
        g.received_bytes = k.bytes - atomic_load(&Q->bytes0);
        g.elapsed_ns = g.phase == NPYLOAD_PREFETCH_DONE
                           ? atomic_load(&Q->elapsed_ns)
                           : npyl_now_ns() - atomic_load(&Q->t0_ns);
    }
    return npyl_sized_out(out, size, &g, sizeof g,
                          NPYL_SIZE_THROUGH(npyload_prefetch_progress, rc));
}

const char *npyload_prefetch_errmsg(const npyload_prefetch *P)
{
    return P ? P->err : "";
}
