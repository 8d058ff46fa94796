/* Concurrency stress for the loader, without Criterion: Criterion cannot run
 * under ThreadSanitizer (Snaipe/Criterion#274), and this is the program CI
 * runs in the TSan build. It exercises the paths where threads meet: many
 * workers filling slots while the consumer takes and releases them out of
 * order, set_epoch while reads are in flight, destroy mid-epoch with batches
 * outstanding and released from another thread, and every backend.
 * Every delivered byte is checked against tu_byte(). Prints
 * "N passed, N failed" and exits non-zero on any failure. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload.h"
#include "testutil.h"

static int failures, passes;
#define CHECK(cond, ...) TU_STRESS_CHECK(failures, cond, __VA_ARGS__)

static const int64_t SIZES[] = {9, 3, 17, 1, 22, 12};
#define NF (sizeof SIZES / sizeof SIZES[0])
#define N 64
static const int64_t SHAPE[] = {5, 3};
static char *dir, glob_a[512], glob_b[512];

static int batch_ok(npyload_batch *b)
{
    const int64_t *idx = npyload_batch_indices(b);
    const uint8_t *a = npyload_batch_field(b, 0)->data, *c = npyload_batch_field(b, 1)->data;
    for (size_t r = 0; r < npyload_batch_size(b); r++) {
        for (size_t i = 0; i < 60; i++)
            if (a[r * 60 + i] != tu_byte(1, (uint64_t)idx[r], i))
                return 0;
        for (size_t i = 0; i < 15; i++)
            if (c[r * 15 + i] != tu_byte(2, (uint64_t)idx[r], i))
                return 0;
    }
    return 1;
}

static npyload_loader *make(int backend, int workers, int prefetch, int64_t batch)
{
    npyload_loader *L;
    if (npyload_loader_create(&L) || npyload_loader_add_field(L, "a", glob_a) ||
        npyload_loader_add_field(L, "b", glob_b) ||
        npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, backend) ||
        npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers) ||
        npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, prefetch) ||
        npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, batch) ||
        npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1) || npyload_loader_start(L)) {
        fprintf(stderr, "setup failed: %s\n", npyload_loader_errmsg(L));
        exit(2);
    }
    return L;
}

/* Consumer keeps up to `hold` batches and releases them oldest-last. */
static void epochs_out_of_order_release(int backend)
{
    npyload_loader *L = make(backend, 4, 4, 3);
    for (uint64_t e = 0; e < 4; e++) {
        CHECK(npyload_loader_set_epoch(L, e) == 0, "set_epoch");
        npyload_batch *held[3] = {0};
        int nh = 0, nb = 0, rc;
        npyload_batch *b;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            CHECK(batch_ok(b), "bytes differ (backend %d epoch %llu)", backend,
                  (unsigned long long)e);
            held[nh++] = b;
            nb++;
            if (nh == 3) {
                npyload_batch_release(held[2]);
                npyload_batch_release(held[0]);
                npyload_batch_release(held[1]);
                nh = 0;
            }
        }
        for (int i = 0; i < nh; i++)
            npyload_batch_release(held[i]);
        CHECK(rc == NPYLOAD_EOF, "next: %s", npyload_loader_errmsg(L));
        CHECK(nb == npyload_loader_num_batches(L), "batches %d", nb);
    }
    npyload_loader_destroy(L);
    passes++;
}

static void set_epoch_in_flight(int backend)
{
    npyload_loader *L = make(backend, 3, 6, 1);
    for (uint64_t e = 0; e < 30; e++) {
        CHECK(npyload_loader_set_epoch(L, e % 5) == 0, "set_epoch");
        npyload_batch *b;
        for (uint64_t k = 0; k < e % 4; k++) {
            CHECK(npyload_loader_next(L, &b) == 0, "next: %s", npyload_loader_errmsg(L));
            CHECK(batch_ok(b), "bytes differ");
            CHECK(npyload_batch_epoch(b) == e % 5, "epoch");
            npyload_batch_release(b);
        }
    }
    npyload_loader_destroy(L);
    passes++;
}

static void *release_later(void *arg)
{
    npyload_batch **bs = arg;
    for (int i = 0; bs[i]; i++) {
        if (!batch_ok(bs[i]))
            __atomic_fetch_add(&failures, 1, __ATOMIC_SEQ_CST);
        npyload_batch_release(bs[i]);
    }
    return NULL;
}

static void destroy_mid_epoch_release_elsewhere(int backend)
{
    for (int round = 0; round < 10; round++) {
        npyload_loader *L = make(backend, 4, 5, 2);
        npyload_batch *bs[4] = {0};
        int k = round % 4;
        for (int i = 0; i < k; i++)
            CHECK(npyload_loader_next(L, &bs[i]) == 0, "next: %s", npyload_loader_errmsg(L));
        pthread_t t;
        pthread_create(&t, NULL, release_later, bs);
        npyload_loader_destroy(L); /* races with the releases on purpose */
        pthread_join(t, NULL);
    }
    passes++;
}

static void stats_while_running(int backend)
{
    npyload_loader *L = make(backend, 2, 3, 4);
    npyload_batch *b;
    npyload_stats st;
    while (npyload_loader_next(L, &b) == 0) {
        npyload_loader_get_stats(L, &st, sizeof st);
        CHECK(batch_ok(b), "bytes differ");
        npyload_batch_release(b);
    }
    npyload_loader_get_stats(L, &st, sizeof st);
    CHECK(st.samples_delivered == N, "samples %llu", (unsigned long long)st.samples_delivered);
    npyload_loader_destroy(L);
    passes++;
}

/* Transforms in the workers (and in next() with NPYLOAD_WORKERS_SYNC):
 * "a" (5, 3) float32 kept and permuted channels-last, "b" (15,) uint8 to
 * float32 x 2, with epochs abandoned mid-flight. Under TSan: the workers'
 * raw buffers and the plans are shared safely. */
static void transforms_under_load(int backend, int workers)
{
    npyload_loader *L;
    npyload_transform ta = {.scale = 1.0f, .channels_last = 1};
    npyload_transform tb = {.dtype = NPYLOAD_DTYPE_FLOAT32, .scale = 2.0f};
    if (npyload_loader_create(&L) || npyload_loader_add_field(L, "a", glob_a) ||
        npyload_loader_add_field(L, "b", glob_b) ||
        npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, backend) ||
        npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers) ||
        npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 5) ||
        npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1) ||
        npyload_loader_set_transform(L, "a", &ta, sizeof ta) ||
        npyload_loader_set_transform(L, "b", &tb, sizeof tb) || npyload_loader_start(L)) {
        fprintf(stderr, "setup failed: %s\n", npyload_loader_errmsg(L));
        exit(2);
    }
    for (uint64_t e = 0; e < 6; e++) {
        npyload_loader_set_epoch(L, e);
        npyload_batch *b;
        int k = 0;
        while ((e % 2 == 0 || k < 3) && npyload_loader_next(L, &b) == 0) {
            const int64_t *idx = npyload_batch_indices(b);
            const uint8_t *a = npyload_batch_field(b, 0)->data;
            const float *y = npyload_batch_field(b, 1)->data;
            for (size_t r = 0; r < npyload_batch_size(b); r++) {
                for (size_t c = 0; c < 5; c++)
                    for (size_t j = 0; j < 3; j++)
                        for (size_t q = 0; q < 4; q++)
                            CHECK(a[r * 60 + (j * 5 + c) * 4 + q] ==
                                      tu_byte(1, (uint64_t)idx[r], (c * 3 + j) * 4 + q),
                                  "channels-last bytes differ");
                for (size_t i = 0; i < 15; i++)
                    CHECK(y[r * 15 + i] == 2.0f * tu_byte(2, (uint64_t)idx[r], i),
                          "float32 x 2 differs");
            }
            npyload_batch_release(b);
            k++;
        }
    }
    npyload_loader_destroy(L);
    passes++;
}

int main(void)
{
    dir = tu_mkdtemp("stress");
    int64_t sh2[] = {15};
    if (!dir || tu_write_field(dir, "a", 1, "<f4", 4, 2, SHAPE, SIZES, NF, 64) ||
        tu_write_field(dir, "b", 2, "|u1", 1, 1, sh2, SIZES, NF, 16)) {
        fprintf(stderr, "cannot write the dataset\n");
        return 2;
    }
    snprintf(glob_a, sizeof glob_a, "%s/a_*.npy", dir);
    snprintf(glob_b, sizeof glob_b, "%s/b_*.npy", dir);
    int backends[] = {NPYLOAD_IO_AUTO, NPYLOAD_IO_PREAD, NPYLOAD_IO_MMAP};
    for (size_t i = 0; i < 3; i++) {
        epochs_out_of_order_release(backends[i]);
        set_epoch_in_flight(backends[i]);
        destroy_mid_epoch_release_elsewhere(backends[i]);
        stats_while_running(backends[i]);
        transforms_under_load(backends[i], 3);
        transforms_under_load(backends[i], NPYLOAD_WORKERS_SYNC);
    }
    tu_rmtree(dir);
    printf("%d passed, %d failed\n", passes, failures);
    return failures ? 1 : 0;
}
