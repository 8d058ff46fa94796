/* The cost of the mixture order (lib/order/npyload_mix.h) next to the
 * single-source order, per epoch and per sample, and of the running digest
 * per row (lib/order/npyload_digest.h). Uses lib/order's internal API, so
 * it is built against the static library (bench/CMakeLists.txt):
 *
 *   cmake --build build --target bench_mix_order
 *   build/bench/bench_mix_order [samples=214464] [reps=5]
 *
 * One rank (world size 1), shuffled; K equal sources weighted 1, 2, .., K.
 * The order is built once per epoch (npyl_order_build / npyl_mix_build),
 * the digest once per delivered row. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "order/npyload_digest.h"
#include "order/npyload_mix.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void report(const char *what, double s, int reps, int64_t n)
{
    printf("%-22s %8.2f ms/epoch %7.1f ns/sample\n", what, s / reps * 1e3,
           s / reps / (double)n * 1e9);
}

int main(int argc, char **argv)
{
    int64_t N = argc > 1 ? atoll(argv[1]) : 214464;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (N < 1 || reps < 1) {
        fprintf(stderr, "usage: %s [samples >= 1] [reps >= 1]\n", argv[0]);
        return 2;
    }
    int64_t *plain = malloc((size_t)N * sizeof *plain);
    npyl_mix_row *rows = malloc((size_t)N * sizeof *rows);
    if (!plain || !rows)
        return 1;
    npyl_order_params op = {.n = N, .shuffle = NPYLOAD_SHUFFLE_FULL, .seed = 1,
                            .world_size = 1, .batch_size = 128};
    double t = now();
    for (int e = 0; e < reps; e++) {
        op.epoch = (uint64_t)e;
        if (npyl_order_build(&op, plain))
            return 1;
    }
    report("single source", now() - t, reps, N);

    static const size_t Ks[] = {1, 2, 8, 50};
    for (size_t i = 0; i < sizeof Ks / sizeof Ks[0]; i++) {
        size_t K = Ks[i];
        npyl_mix_source *src = calloc(K, sizeof *src);
        double *w = calloc(K, sizeof *w);
        if (!src || !w)
            return 1;
        for (size_t k = 0; k < K; k++) {
            src[k].n = N / (int64_t)K + (k < (size_t)(N % (int64_t)K));
            w[k] = (double)(k + 1);
        }
        npyl_mix_params p = {.sources = src, .nsources = K, .weights = w,
                             .shuffle = NPYLOAD_SHUFFLE_FULL, .seed = 1};
        npyl_mix *m = NULL;
        char err[256];
        if (npyl_mix_create(&p, &m, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        op.n = npyl_mix_epoch_len(m);
        t = now();
        for (int e = 0; e < reps; e++) {
            op.epoch = (uint64_t)e;
            if (npyl_mix_build(m, &op, rows)) {
                fprintf(stderr, "%s\n", npyl_mix_errmsg(m));
                return 1;
            }
        }
        char what[32];
        snprintf(what, sizeof what, "mixture of %zu", K);
        report(what, now() - t, reps, op.n);
        npyl_mix_destroy(m);
        free(src);
        free(w);
    }

    npyl_digest_aug aug[2] = {{1, 0, 3, 4}, {0, 1, 5, 6}};
    for (size_t naug = 0; naug <= 2; naug += 2) {
        uint64_t d = 0;
        t = now();
        for (int64_t r = 0; r < N * reps; r++)
            d = npyl_digest_row(d, (uint32_t)(r & 1), r, aug, naug);
        printf("digest, %zu augmented    %8.2f ns/row (%016llx)\n", naug,
               (now() - t) / (double)(N * reps) * 1e9, (unsigned long long)d);
    }
    free(plain);
    free(rows);
    return 0;
}
