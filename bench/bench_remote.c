/* bench_remote: what a remote store gives, measured with the loader's own
 * HTTP path (lib/remote: a libcurl multi handle per thread, keep-alive,
 * signing) but without the loader: parallel ranged GETs of `--bytes`
 * bytes at random offsets of the objects given, at several concurrencies
 * (threads x requests in flight per thread). Per concurrency: requests/s,
 * MB/s, and the latency of single requests (p50, p99). Then the
 * recommendation: the smallest concurrency within 10 % of the best
 * throughput, as num_workers and max_inflight. The measurement is
 * tools/support's npyload_rget_measure, the one npyload-bench runs on
 * remote fields; this program is its table for bench/remote_bench.py.
 *
 *   bench_remote [--bytes N] [--seconds S] [--conc 1,2,4,...]
 *                [--threads-max T] [--json FILE] URL...
 *
 * s3:// URLs take their configuration from the AWS environment and
 * ~/.aws (tools/npyload_remote_env.c, as npyload-inspect and
 * npyload-bench): a program may read the environment, the library does
 * not. The secret is never printed. Not installed. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload.h"
#include "npyload_remote_env.h"
#include "npyload.h" /* with NPYLOAD_EXPERIMENTAL (CMake): the simulator, NVML, the GET sweep */

static void print_point(const npyload_rget_point *p, void *arg)
{
    (void)arg;
    char row[128];
    npyload_rget_row(p, row, sizeof row);
    printf("%s\n", row);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    size_t bytes = 1 << 20;
    double seconds = 3;
    int conc[NPYLOAD_RGET_MAX_POINTS] = {1, 2, 4, 8, 16, 32}, nconc = 6, tmax = 4;
    const char *json = NULL;
    const char **urls = calloc((size_t)argc, sizeof *urls);
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
            for (char *p = strtok(argv[++i], ","); p && nconc < NPYLOAD_RGET_MAX_POINTS;
                 p = strtok(NULL, ","))
                conc[nconc++] = atoi(p);
        } else {
            urls[nurls++] = argv[i];
        }
    }
    if (!nurls || !bytes || tmax < 1 || nconc < 1) {
        fprintf(stderr, "usage: bench_remote [--bytes N] [--seconds S] [--conc LIST] "
                        "[--threads-max T] [--json FILE] URL...\n");
        return 2;
    }
    char err[1024];
    tool_remote env;
    if (tool_remote_for_paths(urls, nurls, &env, err, sizeof err) < 0) {
        fprintf(stderr, "bench_remote: %s\n", err);
        return 1;
    }
    printf("%zu objects; ranged GETs of %zu bytes at random offsets, %.1f s each\n", nurls,
           bytes, seconds);
    printf("%s\n", npyload_rget_header());
    npyload_rget_result res;
    int rc = npyload_rget_measure(&env.cfg, urls, nurls, bytes, seconds, conc, nconc, tmax,
                                  print_point, NULL, &res, err, sizeof err);
    tool_remote_free(&env);
    free(urls);
    if (rc) {
        fprintf(stderr, "bench_remote: %s\n", err);
        return 1;
    }
    printf("%zu objects, %.1f MB; best %.1f MB/s; %.1f MB/s (within 10 %%) from concurrency "
           "%d: num_workers=%d, remote max_inflight=%d\n", res.objects,
           (double)res.object_bytes / 1e6, res.best_mb_per_s, res.points[res.pick].mb_per_s,
           res.concurrency, res.workers, res.max_inflight);
    printf("requests %" PRIu64 ", retries %" PRIu64 "\n", res.requests, res.retries);
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) {
        perror(json);
        return 1;
    }
    if (jf) {
        fprintf(jf, "{\"bytes_per_request\": %zu, \"objects\": %zu, \"object_bytes\": %" PRIu64
                    ", \"runs\": [", bytes, res.objects, res.object_bytes);
        for (int k = 0; k < res.npoints; k++) {
            const npyload_rget_point *p = &res.points[k];
            char a[24] = "null", b[24] = "null";
            if (p->p50_ms >= 0) {
                snprintf(a, sizeof a, "%.2f", p->p50_ms);
                snprintf(b, sizeof b, "%.2f", p->p99_ms);
            }
            fprintf(jf, "%s{\"concurrency\": %d, \"threads\": %d, \"inflight\": %d, "
                        "\"requests_per_s\": %.1f, \"mb_per_s\": %.2f, \"p50_ms\": %s, "
                        "\"p99_ms\": %s}", k ? ", " : "", p->concurrency, p->threads,
                    p->inflight, p->requests_per_s, p->mb_per_s, a, b);
        }
        fprintf(jf, "], \"best_mb_per_s\": %.2f, \"recommended_concurrency\": %d, "
                    "\"recommended_workers\": %d, \"recommended_max_inflight\": %d}\n",
                res.best_mb_per_s, res.concurrency, res.workers, res.max_inflight);
        fclose(jf);
    }
    return 0;
}
