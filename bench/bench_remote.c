/* bench_remote: what a remote store gives, measured with the loader's own
 * HTTP path (lib/remote: a libcurl multi handle per thread, keep-alive,
 * signing) but without the loader: parallel ranged GETs of `--bytes`
 * bytes at random offsets of the objects given, at several concurrencies
 * (threads x requests in flight per thread). Per concurrency: requests/s,
 * MB/s, and the latency of single requests (p50, p90, p99). Then the
 * recommendation: the smallest concurrency within 10 % of the best
 * throughput, as num_workers and max_inflight (a worker has two reading
 * threads with read-ahead: itself and its read-ahead thread).
 *
 *   bench_remote [--bytes N] [--seconds S] [--conc 1,2,4,...]
 *                [--threads-max T] [--json FILE] URL...
 *
 * s3:// URLs take their configuration from the AWS environment
 * (AWS_ENDPOINT_URL[_S3], AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 * AWS_SESSION_TOKEN, AWS_REGION): a program may read the environment, the
 * library does not. The secret is never printed. Not installed. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "npyload.h"
#include "remote/npyload_remote.h"

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
    while (now() < j->until && j->rc == 0) {
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
                j->caplat = j->caplat ? 2 * j->caplat : 1024;
                j->lat = realloc(j->lat, j->caplat * sizeof *j->lat);
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

static const char *env(const char *a, const char *b)
{
    const char *v = getenv(a);
    if ((!v || !*v) && b)
        v = getenv(b);
    return v && *v ? v : NULL;
}

int main(int argc, char **argv)
{
    size_t bytes = 1 << 20;
    double seconds = 3;
    int conc[16] = {1, 2, 4, 8, 16, 32}, nconc = 6, tmax = 4;
    const char *json = NULL;
    const char *urls[4096];
    size_t nurls = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bytes") && i + 1 < argc)
            bytes = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--threads-max") && i + 1 < argc)
            tmax = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--conc") && i + 1 < argc) {
            nconc = 0;
            for (char *p = strtok(argv[++i], ","); p && nconc < 16; p = strtok(NULL, ","))
                conc[nconc++] = atoi(p);
        } else if (nurls < 4096)
            urls[nurls++] = argv[i];
    }
    if (!nurls || !bytes || tmax < 1) {
        fprintf(stderr, "usage: bench_remote [--bytes N] [--seconds S] [--conc LIST] "
                        "[--threads-max T] [--json FILE] URL...\n");
        return 2;
    }
    npyload_remote cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.endpoint = env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL");
    cfg.region = env("AWS_REGION", "AWS_DEFAULT_REGION");
    cfg.access_key = env("AWS_ACCESS_KEY_ID", NULL);
    cfg.secret_key = env("AWS_SECRET_ACCESS_KEY", NULL);
    cfg.session_token = env("AWS_SESSION_TOKEN", NULL);
    cfg.max_inflight = 256;
    char err[1024];
    npyl_remote *r;
    if (npyl_remote_create(&r, &cfg, err, sizeof err)) {
        fprintf(stderr, "bench_remote: %s\n", err);
        return 1;
    }
    npyl_remote_probe *p = calloc(nurls, sizeof *p);
    npyl_remote_obj *objs = calloc(nurls, sizeof *objs);
    for (size_t i = 0; i < nurls; i++)
        p[i].url = urls[i];
    size_t bad;
    if (npyl_remote_probe_all(r, p, nurls, NULL, &bad, err, sizeof err)) {
        fprintf(stderr, "bench_remote: %s\n", err);
        return 1;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < nurls; i++) {
        objs[i].url = urls[i];
        objs[i].size = p[i].size;
        snprintf(objs[i].etag, sizeof objs[i].etag, "%s", p[i].etag);
        total += p[i].size;
        npyl_remote_probe_free(&p[i]);
    }
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (jf)
        fprintf(jf, "{\"bytes_per_request\": %zu, \"objects\": %zu, \"object_bytes\": %" PRIu64
                    ", \"runs\": [", bytes, nurls, total);
    printf("%zu objects, %.1f MB; ranged GETs of %zu bytes at random offsets, %.1f s each\n",
           nurls, (double)total / 1e6, bytes, seconds);
    printf("%6s %8s %9s %10s %9s %9s %9s\n", "conc", "threads", "inflight", "req/s", "MB/s",
           "p50 ms", "p99 ms");
    double best = 0, mbps[16] = {0};
    int thr[16], inf[16];
    for (int k = 0; k < nconc; k++) {
        int c = conc[k] < 1 ? 1 : conc[k];
        int t = c < tmax ? c : tmax, f = (c + t - 1) / t;
        job *js = calloc((size_t)t, sizeof *js);
        pthread_t *th = calloc((size_t)t, sizeof *th);
        double t0 = now();
        for (int i = 0; i < t; i++) {
            js[i] = (job){.r = r, .objs = objs, .nobjs = nurls, .bytes = bytes, .inflight = f,
                          .until = t0 + seconds, .seed = (uint64_t)(k * 1000 + i + 1)};
            pthread_create(&th[i], NULL, run, &js[i]);
        }
        uint64_t reqs = 0, got = 0;
        double *lat = NULL;
        size_t nl = 0;
        for (int i = 0; i < t; i++) {
            pthread_join(th[i], NULL);
            if (js[i].rc) {
                fprintf(stderr, "bench_remote: %s\n", js[i].err);
                return 1;
            }
            reqs += js[i].requests;
            got += js[i].got;
            lat = realloc(lat, (nl + js[i].nlat + 1) * sizeof *lat);
            memcpy(lat + nl, js[i].lat, js[i].nlat * sizeof *lat);
            nl += js[i].nlat;
            free(js[i].lat);
        }
        double dt = now() - t0;
        double p50 = 0, p99 = 0;
        if (nl) {
            qsort(lat, nl, sizeof *lat, cmpd);
            p50 = lat[nl / 2] * 1e3;
            p99 = lat[(size_t)((double)nl * 0.99)] * 1e3;
        }
        mbps[k] = (double)got / dt / 1e6;
        thr[k] = t;
        inf[k] = f;
        if (mbps[k] > best)
            best = mbps[k];
        char a[16] = "-", b[16] = "-";
        if (nl) {
            snprintf(a, sizeof a, "%.2f", p50);
            snprintf(b, sizeof b, "%.2f", p99);
        }
        printf("%6d %8d %9d %10.0f %9.1f %9s %9s\n", t * f, t, f, (double)reqs / dt, mbps[k],
               a, b);
        if (jf)
            fprintf(jf, "%s{\"concurrency\": %d, \"threads\": %d, \"inflight\": %d, "
                        "\"requests_per_s\": %.1f, \"mb_per_s\": %.2f, \"p50_ms\": %s, "
                        "\"p99_ms\": %s}", k ? ", " : "", t * f, t, f, (double)reqs / dt,
                    mbps[k], nl ? a : "null", nl ? b : "null");
        free(lat);
        free(js);
        free(th);
    }
    int pick = 0;
    while (pick < nconc - 1 && mbps[pick] < 0.9 * best)
        pick++;
    int c = thr[pick] * inf[pick];
    /* Two reading threads per worker (itself and its read-ahead thread). */
    int workers = thr[pick] / 2 > 0 ? thr[pick] / 2 : 1;
    int inflight = (c + 2 * workers - 1) / (2 * workers);
    printf("best %.1f MB/s; %.1f MB/s (within 10 %%) from concurrency %d: "
           "num_workers=%d, remote max_inflight=%d\n", best, mbps[pick], c, workers, inflight);
    if (jf) {
        fprintf(jf, "], \"best_mb_per_s\": %.2f, \"recommended_concurrency\": %d, "
                    "\"recommended_workers\": %d, \"recommended_max_inflight\": %d}\n",
                best, c, workers, inflight);
        fclose(jf);
    }
    npyl_remote_counters k;
    memset(&k, 0, sizeof k);
    npyl_remote_counters_add(r, &k);
    printf("requests %" PRIu64 ", retries %" PRIu64 "\n", k.requests, k.retries);
    free(objs);
    free(p);
    npyl_remote_destroy(r);
    return 0;
}
