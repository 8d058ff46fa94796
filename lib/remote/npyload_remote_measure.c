/* npyload_rget_measure: a remote store's ranged-GET throughput and
 * latency at several concurrencies through lib/remote (the loader's own
 * HTTP path, without the loader), and the workers and requests in flight
 * that reach it. Experimental API (npyload.h, NPYLOAD_EXPERIMENTAL) of
 * npyload-bench (remote fields) and bench/bench_remote. Only lib/remote's
 * API (npyload_remote.h), so it builds without libcurl too (the probe then
 * fails saying what to install). */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "npyload_remote.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct job {
    npyl_remote *r;
    const npyl_remote_obj *objs;
    size_t nobjs;
    size_t bytes;
    int inflight;
    double until;
    uint64_t seed;
    /* out */
    uint64_t requests, got;
    double *lat;              /* single-request latencies (inflight 1) */
    size_t nlat, caplat;
    int rc;
    char err[512];
} job;

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void *run(void *arg)
{
    job *j = arg;
    npyl_remote_ctx *c;
    if ((j->rc = npyl_remote_ctx_create(&c, j->r, j->objs, j->nobjs, j->err, sizeof j->err)))
        return NULL;
    unsigned char *buf = malloc(j->bytes * (size_t)j->inflight);
    npyl_remote_req *q = calloc((size_t)j->inflight, sizeof *q);
    if (!buf || !q) {
        j->rc = -1;
        snprintf(j->err, sizeof j->err, "out of memory");
    }
    while (j->rc == 0 && now() < j->until) {
        for (int i = 0; i < j->inflight; i++) {
            uint32_t o = (uint32_t)(mix(&j->seed) % j->nobjs);
            uint64_t span = j->objs[o].size > j->bytes ? j->objs[o].size - j->bytes : 0;
            q[i] = (npyl_remote_req){o, span ? mix(&j->seed) % span : 0,
                                     j->objs[o].size < j->bytes ? j->objs[o].size : j->bytes,
                                     buf + (size_t)i * j->bytes};
        }
        double t0 = now();
        uint64_t got = 0;
        j->rc = npyl_remote_read(c, q, (size_t)j->inflight, NULL, &got, j->err, sizeof j->err);
        double dt = now() - t0;
        j->requests += (uint64_t)j->inflight;
        j->got += got;
        if (j->inflight == 1) {
            if (j->nlat == j->caplat) {
                size_t cap = j->caplat ? 2 * j->caplat : 1024;
                double *l = realloc(j->lat, cap * sizeof *l);
                if (!l)
                    continue;
                j->lat = l;
                j->caplat = cap;
            }
            j->lat[j->nlat++] = dt;
        }
    }
    free(buf);
    free(q);
    npyl_remote_ctx_destroy(c);
    return NULL;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One concurrency: t threads with f requests in flight each. */
static int measure_point(npyl_remote *r, const npyl_remote_obj *objs, size_t n, size_t bytes,
                         double seconds, int t, int f, uint64_t seed, npyload_rget_point *pt,
                         char *err, size_t errlen)
{
    job *js = calloc((size_t)t, sizeof *js);
    pthread_t *th = calloc((size_t)t, sizeof *th);
    if (!js || !th) {
        free(js);
        free(th);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    double t0 = now();
    int started = 0, rc = 0;
    for (int i = 0; i < t; i++) {
        js[i] = (job){.r = r, .objs = objs, .nobjs = n, .bytes = bytes, .inflight = f,
                      .until = t0 + seconds, .seed = seed * 1000 + (uint64_t)i + 1};
        if (pthread_create(&th[i], NULL, run, &js[i]) != 0)
            break;
        started++;
    }
    uint64_t reqs = 0, got = 0;
    double *lat = NULL;
    size_t nl = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        if (js[i].rc && rc == 0) {
            rc = -1;
            snprintf(err, errlen, "%s", js[i].err);
        }
        reqs += js[i].requests;
        got += js[i].got;
        double *l = realloc(lat, (nl + js[i].nlat + 1) * sizeof *l);
        if (l) {
            lat = l;
            memcpy(lat + nl, js[i].lat, js[i].nlat * sizeof *lat);
            nl += js[i].nlat;
        }
        free(js[i].lat);
    }
    if (started < t && rc == 0) {
        rc = -1;
        snprintf(err, errlen, "cannot start %d threads", t);
    }
    double dt = now() - t0;
    *pt = (npyload_rget_point){.concurrency = t * f, .threads = t, .inflight = f,
                               .requests_per_s = (double)reqs / dt,
                               .mb_per_s = (double)got / dt / 1e6, .p50_ms = -1, .p99_ms = -1};
    if (nl) {
        qsort(lat, nl, sizeof *lat, cmpd);
        pt->p50_ms = lat[nl / 2] * 1e3;
        pt->p99_ms = lat[(size_t)((double)nl * 0.99)] * 1e3;
    }
    free(lat);
    free(js);
    free(th);
    return rc;
}

const char *npyload_rget_header(void)
{
    return "  conc  threads  inflight      req/s      MB/s    p50 ms    p99 ms";
}

void npyload_rget_row(const npyload_rget_point *p, char *buf, size_t len)
{
    char a[16] = "-", b[16] = "-";
    if (p->p50_ms >= 0) {
        snprintf(a, sizeof a, "%.2f", p->p50_ms);
        snprintf(b, sizeof b, "%.2f", p->p99_ms);
    }
    snprintf(buf, len, "%6d %8d %9d %10.0f %9.1f %9s %9s", p->concurrency, p->threads,
             p->inflight, p->requests_per_s, p->mb_per_s, a, b);
}

/* The sweep needs each object's size and ETag (the head), never its tail. */
static int no_tail(const npyl_remote_probe *p)
{
    (void)p;
    return 0;
}

int npyload_rget_measure(const npyload_remote *cfg_in, const char *const *urls, size_t n,
                         size_t bytes, double seconds, const int *conc, int nconc, int tmax,
                         void (*each)(const npyload_rget_point *p, void *arg), void *arg,
                         npyload_rget_result *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!n || !bytes || tmax < 1 || nconc < 1) {
        snprintf(err, errlen, "nothing to measure (no object, no concurrency)");
        return -1;
    }
    if (nconc > NPYLOAD_RGET_MAX_POINTS)
        nconc = NPYLOAD_RGET_MAX_POINTS;
    npyload_remote cfg = *cfg_in;
    cfg.max_inflight = 256; /* each thread's pool: the points' f */
    cfg.cache_dir = NULL;   /* the server's throughput, not a cache's */
    npyl_remote *r;
    if (npyl_remote_create(&r, &cfg, err, errlen))
        return -1;
    npyl_remote_probe *p = calloc(n, sizeof *p);
    npyl_remote_obj *objs = calloc(n, sizeof *objs);
    int rc = p && objs ? 0 : -1;
    if (rc)
        snprintf(err, errlen, "out of memory");
    size_t bad;
    for (size_t i = 0; rc == 0 && i < n; i++)
        p[i].url = urls[i];
    if (rc == 0 && npyl_remote_probe_all(r, p, n, no_tail, &bad, err, errlen))
        rc = -1;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        objs[i].url = urls[i];
        objs[i].size = p[i].size;
        snprintf(objs[i].etag, sizeof objs[i].etag, "%s", p[i].etag);
        out->object_bytes += p[i].size;
    }
    for (size_t i = 0; p && i < n; i++)
        npyl_remote_probe_free(&p[i]);
    free(p);
    out->objects = n;
    out->bytes_per_request = bytes;
    out->seconds = seconds;
    for (int k = 0; rc == 0 && k < nconc; k++) {
        int c = conc[k] < 1 ? 1 : conc[k];
        int t = c < tmax ? c : tmax, f = (c + t - 1) / t;
        npyload_rget_point *pt = &out->points[out->npoints];
        rc = measure_point(r, objs, n, bytes, seconds, t, f, (uint64_t)k + 1, pt, err, errlen);
        if (rc == 0) {
            out->npoints++;
            if (pt->mb_per_s > out->best_mb_per_s)
                out->best_mb_per_s = pt->mb_per_s;
            if (each)
                each(pt, arg);
        }
    }
    if (rc == 0) {
        int pick = 0;
        while (pick < out->npoints - 1 &&
               out->points[pick].mb_per_s < 0.9 * out->best_mb_per_s)
            pick++;
        const npyload_rget_point *pt = &out->points[pick];
        out->pick = pick;
        out->concurrency = pt->concurrency;
        /* Two reading threads per worker (itself and its read-ahead thread). */
        out->workers = pt->threads / 2 > 0 ? pt->threads / 2 : 1;
        out->max_inflight = (pt->concurrency + 2 * out->workers - 1) / (2 * out->workers);
    }
    npyl_remote_counters k;
    memset(&k, 0, sizeof k);
    npyl_remote_counters_add(r, &k);
    out->requests = k.requests;
    out->retries = k.retries;
    free(objs);
    npyl_remote_destroy(r);
    return rc;
}
