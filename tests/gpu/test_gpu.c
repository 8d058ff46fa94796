/* The loader on a real GPU (NPYLOAD_OPT_DEVICE = 0), through the public API
 * only: bytes, order, overlap of copies with compute, and no overwrite of a
 * slot still read by a slow consumer.
 *
 * Built only where nvcc exists (tests/CMakeLists.txt); every test skips,
 * visibly and with the reason, when npyload_cuda_available(0) is 0. Run them
 * under compute-sanitizer as tests/gpu/README.md says. */
#include <criterion/criterion.h>
#include <time.h>
#include <criterion/logging.h>

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_kernels.h"
#include "npyload.h"
#include "npyload.h" /* with NPYLOAD_EXPERIMENTAL (CMake): the simulator, NVML, the GET sweep */
#include "testutil.h"

#define NEED_GPU()                                                             \
    do {                                                                       \
        char why_[512];                                                        \
        if (!npyload_cuda_available(0, why_, sizeof why_))                     \
            cr_skip_test("needs CUDA device 0: %s", why_);                     \
    } while (0)

#define CU(expr)                                                               \
    do {                                                                       \
        cudaError_t e_ = (expr);                                               \
        cr_assert_eq(e_, cudaSuccess, "%s: %s", #expr, cudaGetErrorString(e_)); \
    } while (0)

#define GK(expr)                                                               \
    do {                                                                       \
        int e_ = (expr);                                                       \
        cr_assert_eq(e_, 0, "%s: %s", #expr,                                   \
                     cudaGetErrorString((cudaError_t)e_));                     \
    } while (0)

/* ---- a data set of up to 2 fields, written with tests/testutil ---- */

#define MAXF 2
typedef struct field_spec {
    const char *name;
    const char *descr;
    size_t itemsize;
    int sndim;
    int64_t sshape[4];
    uint32_t seed;
} field_spec;

typedef struct dataset {
    char *dir;
    size_t nfields;
    field_spec f[MAXF];
    size_t sample_bytes[MAXF];
    char *glob[MAXF];
    int64_t n;
} dataset;

static void ds_make(dataset *d, const field_spec *f, size_t nfields,
                    const int64_t *per_file, size_t nfiles)
{
    memset(d, 0, sizeof *d);
    d->dir = tu_mkdtemp("gpu");
    cr_assert_not_null(d->dir);
    d->nfields = nfields;
    for (size_t k = 0; k < nfiles; k++)
        d->n += per_file[k];
    for (size_t i = 0; i < nfields; i++) {
        d->f[i] = f[i];
        d->sample_bytes[i] = tu_sample_bytes(f[i].itemsize, f[i].sndim,
                                             f[i].sshape);
        cr_assert_eq(tu_write_field(d->dir, f[i].name, f[i].seed, f[i].descr,
                                    f[i].itemsize, f[i].sndim, f[i].sshape,
                                    per_file, nfiles, 64),
                     0);
        char pat[128];
        snprintf(pat, sizeof pat, "%s_*.npy", f[i].name);
        d->glob[i] = tu_path(d->dir, pat);
    }
}

static void ds_free(dataset *d)
{
    for (size_t i = 0; i < d->nfields; i++)
        free(d->glob[i]);
    tu_rmtree(d->dir);
}

typedef struct opts {
    int64_t batch, workers, prefetch, shuffle, seed, rank, world, drop_last;
    int64_t backend;
} opts;

#define SET(L, o, v)                                                           \
    do {                                                                       \
        int r_ = npyload_loader_set((L), (o), (v));                            \
        cr_assert_eq(r_, 0, "set(%s, %lld): %s", #o, (long long)(v),           \
                     npyload_loader_errmsg(L));                                \
    } while (0)

/* A loader on device 0, not yet started. */
static npyload_loader *ds_loader(const dataset *d, const opts *o)
{
    npyload_loader *L = NULL;
    cr_assert_eq(npyload_loader_create(&L), 0);
    for (size_t i = 0; i < d->nfields; i++)
        cr_assert_eq(npyload_loader_add_field(L, d->f[i].name, d->glob[i]), 0,
                     "%s", npyload_loader_errmsg(L));
    SET(L, NPYLOAD_OPT_BATCH_SIZE, o->batch);
    SET(L, NPYLOAD_OPT_NUM_WORKERS, o->workers);
    SET(L, NPYLOAD_OPT_PREFETCH, o->prefetch);
    SET(L, NPYLOAD_OPT_SHUFFLE, o->shuffle);
    SET(L, NPYLOAD_OPT_SEED, o->seed);
    SET(L, NPYLOAD_OPT_WORLD_SIZE, o->world ? o->world : 1);
    SET(L, NPYLOAD_OPT_RANK, o->rank);
    SET(L, NPYLOAD_OPT_DROP_LAST, o->drop_last);
    SET(L, NPYLOAD_OPT_IO_BACKEND, o->backend);
    SET(L, NPYLOAD_OPT_DEVICE, 0);
    return L;
}

/* Expected bytes of field fi for the rows `idx[0..rows)`, into a malloc'd
 * buffer. */
static uint8_t *expected_field(const dataset *d, size_t fi, const int64_t *idx,
                               size_t rows)
{
    size_t sb = d->sample_bytes[fi];
    uint8_t *e = malloc(sb * rows + 1);
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < sb; i++)
            e[r * sb + i] = tu_byte(d->f[fi].seed, (uint64_t)idx[r], i);
    return e;
}

/* Copies every field of b back from the device and compares it with the
 * file bytes of its rows. */
static void check_batch_bytes(const dataset *d, npyload_batch *b)
{
    size_t rows = npyload_batch_size(b);
    const int64_t *idx = npyload_batch_indices(b);
    cr_assert_eq(npyload_batch_num_fields(b), d->nfields);
    for (size_t fi = 0; fi < d->nfields; fi++) {
        const npyload_array *a = npyload_batch_field(b, fi);
        cr_assert_not_null(a);
        cr_assert_eq(a->device, 0, "field %s: device %d", d->f[fi].name,
                     a->device);
        cr_assert_eq(a->shape[0], (int64_t)rows);
        cr_assert_str_eq(a->descr, d->f[fi].descr);
        cr_assert_eq(a->nbytes, rows * d->sample_bytes[fi]);
        struct cudaPointerAttributes pa;
        CU(cudaPointerGetAttributes(&pa, a->data));
        cr_assert_eq(pa.type, cudaMemoryTypeDevice,
                     "field %s: data %p is not device memory (type %d)",
                     d->f[fi].name, a->data, (int)pa.type);
        cr_assert_eq(pa.device, 0);
        uint8_t *got = malloc(a->nbytes + 1);
        CU(cudaMemcpy(got, a->data, a->nbytes, cudaMemcpyDeviceToHost));
        uint8_t *exp = expected_field(d, fi, idx, rows);
        if (memcmp(got, exp, a->nbytes) != 0) {
            size_t k = 0;
            while (got[k] == exp[k])
                k++;
            size_t sb = d->sample_bytes[fi];
            cr_assert(0, "field %s, batch %lld: byte %zu (row %zu = sample %lld, "
                    "byte %zu) is %u on the device, %u in the file",
                    d->f[fi].name, (long long)npyload_batch_seq(b), k, k / sb,
                    (long long)idx[k / sb], k % sb, got[k], exp[k]);
        }
        free(got);
        free(exp);
    }
}

static const field_spec two_fields[2] = {
    {"img", "<f4", 4, 3, {4, 64, 64}, 11},  /* 64 KiB per sample */
    {"lab", "|u1", 1, 1, {7}, 22},          /* 7 bytes: odd offsets */
};

/* ---- bytes on the device equal the file bytes ---- */

Test(gpu, device_bytes_equal_file_bytes)
{
    NEED_GPU();
    dataset d;
    const int64_t per_file[3] = {40, 24, 37}; /* N = 101: last batch short */
    ds_make(&d, two_fields, 2, per_file, 3);
    static const int64_t backends[] = {NPYLOAD_IO_AUTO, NPYLOAD_IO_PREAD,
                                       NPYLOAD_IO_MMAP};
    for (size_t k = 0; k < sizeof backends / sizeof backends[0]; k++) {
        opts o = {.batch = 8, .workers = 2, .prefetch = 3,
                  .backend = backends[k]};
        npyload_loader *L = ds_loader(&d, &o);
        cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
        cr_log_info("backend %s",
                    npyload_backend_name(npyload_loader_backend(L)));
        cr_assert_eq(npyload_loader_num_batches(L), 13);
        int64_t seen = 0, nb = 0;
        size_t bytes = 0;
        npyload_batch *b;
        int rc;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            cr_assert_eq(npyload_batch_seq(b), nb);
            cr_assert_eq(npyload_batch_sync(b), 0, "%s",
                         npyload_loader_errmsg(L));
            const int64_t *idx = npyload_batch_indices(b);
            for (size_t r = 0; r < npyload_batch_size(b); r++)
                cr_assert_eq(idx[r], seen + (int64_t)r);
            check_batch_bytes(&d, b);
            for (size_t fi = 0; fi < d.nfields; fi++)
                bytes += npyload_batch_field(b, fi)->nbytes;
            seen += (int64_t)npyload_batch_size(b);
            nb++;
            npyload_batch_release(b);
        }
        cr_assert_eq(rc, NPYLOAD_EOF, "next: %d %s", rc,
                     npyload_loader_errmsg(L));
        cr_assert_eq(seen, d.n);
        cr_assert_eq(nb, 13);
        npyload_stats st;
        cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
        cr_expect_eq(st.device, 0);
        cr_expect_geq(st.h2d_bytes, bytes, "stats.h2d_bytes %llu < %zu bytes "
                      "delivered", (unsigned long long)st.h2d_bytes, bytes);
        npyload_loader_destroy(L);
    }
    ds_free(&d);
}

/* ---- order: indices and contents follow npyload_order_indices ---- */

Test(gpu, order_follows_order_indices)
{
    NEED_GPU();
    dataset d;
    const int64_t per_file[2] = {30, 23}; /* N = 53 */
    ds_make(&d, two_fields, 2, per_file, 2);
    const int64_t batch = 5;
    for (int64_t rank = 0; rank < 2; rank++) {
        opts o = {.batch = batch, .workers = 3, .prefetch = 4,
                  .shuffle = NPYLOAD_SHUFFLE_FULL, .seed = 1234, .rank = rank,
                  .world = 2, .drop_last = 0, .backend = NPYLOAD_IO_AUTO};
        npyload_loader *L = ds_loader(&d, &o);
        cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
        for (uint64_t epoch = 0; epoch < 2; epoch++) {
            if (epoch > 0)
                cr_assert_eq(npyload_loader_set_epoch(L, epoch), 0);
            int64_t want[64];
            int64_t n = npyload_order_indices(d.n, NPYLOAD_SHUFFLE_FULL, 1234,
                                              epoch, rank, 2, 0, batch, NULL, 0,
                                              0, want, 64);
            cr_assert_eq(n, 27, "ceil(53 / 2) samples per rank, got %lld",
                         (long long)n);
            int64_t pos = 0;
            npyload_batch *b;
            int rc;
            while ((rc = npyload_loader_next(L, &b)) == 0) {
                cr_assert_eq(npyload_batch_epoch(b), epoch);
                cr_assert_eq(npyload_batch_sync(b), 0);
                const int64_t *idx = npyload_batch_indices(b);
                for (size_t r = 0; r < npyload_batch_size(b); r++)
                    cr_assert_eq(idx[r], want[pos + (int64_t)r],
                                 "rank %lld epoch %llu position %lld: index "
                                 "%lld, expected %lld",
                                 (long long)rank, (unsigned long long)epoch,
                                 (long long)(pos + (int64_t)r),
                                 (long long)idx[r],
                                 (long long)want[pos + (int64_t)r]);
                check_batch_bytes(&d, b);
                pos += (int64_t)npyload_batch_size(b);
                npyload_batch_release(b);
            }
            cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
            cr_assert_eq(pos, n);
        }
        npyload_loader_destroy(L);
    }
    ds_free(&d);
}

/* ---- copies of later batches run while the consumer computes ---- */

Test(gpu, copies_overlap_consumer_kernel)
{
    NEED_GPU();
    /* 1 MiB batches (a copy takes tens of microseconds) and a 2 ms consumer
     * kernel per batch: the copy of batch k + PREFETCH can only start once
     * batch k is released, and must then run during the kernel of batch k+1.
     */
    static const field_spec f[1] = {{"x", "<f4", 4, 2, {64, 1024}, 5}};
    const int64_t per_file[2] = {32, 32};
    enum { NB = 16, KERNEL_US = 2000 };
    dataset d;
    ds_make(&d, f, 1, per_file, 2);
    opts o = {.batch = 4, .workers = 2, .prefetch = 4,
              .backend = NPYLOAD_IO_AUTO};
    npyload_loader *L = ds_loader(&d, &o);

    cudaStream_t cs, probe;
    CU(cudaSetDevice(0));
    CU(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&probe, cudaStreamNonBlocking));
    cudaEvent_t base, done[NB], ks[NB], ke[NB];
    CU(cudaEventCreate(&base));
    for (int i = 0; i < NB; i++) {
        CU(cudaEventCreate(&done[i]));
        CU(cudaEventCreate(&ks[i]));
        CU(cudaEventCreate(&ke[i]));
    }
    /* The origin of every timestamp: before any copy can start. */
    CU(cudaEventRecord(base, cs));
    CU(cudaEventSynchronize(base));
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));

    int nb = 0;
    npyload_batch *b;
    int rc;
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        cr_assert_lt(nb, NB);
        /* The probe stream does nothing but wait for the copy: its event
         * completes when batch nb is on the device. */
        cr_assert_eq(npyload_batch_wait_stream(b, probe), 0);
        CU(cudaEventRecord(done[nb], probe));
        cr_assert_eq(npyload_batch_wait_stream(b, cs), 0);
        CU(cudaEventRecord(ks[nb], cs));
        GK(gk_busy(KERNEL_US, cs));
        CU(cudaEventRecord(ke[nb], cs));
        npyload_batch_release_stream(b, cs);
        nb++;
    }
    cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(nb, NB);
    CU(cudaStreamSynchronize(cs));
    CU(cudaStreamSynchronize(probe));

    float t_done[NB], t_ks[NB], t_ke[NB];
    for (int i = 0; i < NB; i++) {
        CU(cudaEventElapsedTime(&t_done[i], base, done[i]));
        CU(cudaEventElapsedTime(&t_ks[i], base, ks[i]));
        CU(cudaEventElapsedTime(&t_ke[i], base, ke[i]));
    }
    /* Batch k's copy overlapped compute if it completed strictly inside the
     * kernel of an earlier batch i < k (so it ran while that kernel did). */
    int overlapped = 0;
    float stall = 0.0f;
    for (int k = 1; k < NB; k++) {
        for (int i = 0; i < k; i++)
            if (t_done[k] > t_ks[i] && t_done[k] < t_ke[i]) {
                overlapped++;
                break;
            }
        stall += t_ks[k] - t_ke[k - 1];
    }
    for (int i = 0; i < NB; i++)
        cr_log_info("batch %2d: copy done %8.3f ms, kernel %8.3f .. %8.3f ms",
                    i, t_done[i], t_ks[i], t_ke[i]);
    float total = t_ke[NB - 1] - t_ks[0];
    cr_log_info("%d of %d later copies completed during an earlier kernel; "
                "consumer idle %.3f of %.3f ms (%.1f %%)",
                overlapped, NB - 1, stall, total, 100.0f * stall / total);
    /* Far below what a serialised pipeline gives (0) and far above what
     * scheduling noise could erase (copies are ~50x shorter than kernels). */
    cr_assert_geq(overlapped, (NB - 1) / 2,
                  "only %d of %d copies overlapped a consumer kernel",
                  overlapped, NB - 1);

    npyload_loader_destroy(L);
    for (int i = 0; i < NB; i++) {
        cudaEventDestroy(done[i]);
        cudaEventDestroy(ks[i]);
        cudaEventDestroy(ke[i]);
    }
    cudaEventDestroy(base);
    cudaStreamDestroy(cs);
    cudaStreamDestroy(probe);
    ds_free(&d);
}

/* ---- a slow consumer never sees its batch overwritten ---- */

Test(gpu, no_overwrite_under_slow_consumer)
{
    NEED_GPU();
    /* The host never waits for the GPU here: it enqueues a slow kernel and a
     * checksum per batch and releases with release_stream. If the loader
     * reused a slot before the checksum of its previous batch had run, that
     * checksum would see the next batch's bytes. */
    static const field_spec f[2] = {
        {"a", "<f4", 4, 2, {32, 1024}, 31}, /* 128 KiB per sample */
        {"b", "|u1", 1, 1, {13}, 32},
    };
    const int64_t per_file[3] = {27, 27, 26}; /* N = 80 */
    enum { BATCH = 4, NB = 20, SLOW_US = 1500 };
    dataset d;
    ds_make(&d, f, 2, per_file, 3);
    opts o = {.batch = BATCH, .workers = 2, .prefetch = 2,
              .shuffle = NPYLOAD_SHUFFLE_FULL, .seed = 99,
              .backend = NPYLOAD_IO_AUTO};
    npyload_loader *L = ds_loader(&d, &o);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));

    CU(cudaSetDevice(0));
    cudaStream_t cs;
    CU(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    unsigned long long *d_sums;
    CU(cudaMalloc((void **)&d_sums, sizeof *d_sums * NB * 2));
    unsigned long long want[NB * 2];

    int nb = 0;
    npyload_batch *b;
    int rc;
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        cr_assert_lt(nb, NB);
        size_t rows = npyload_batch_size(b);
        const int64_t *idx = npyload_batch_indices(b);
        cr_assert_eq(npyload_batch_wait_stream(b, cs), 0);
        GK(gk_busy(SLOW_US, cs));
        for (size_t fi = 0; fi < 2; fi++) {
            const npyload_array *a = npyload_batch_field(b, fi);
            GK(gk_checksum(a->data, a->nbytes, &d_sums[nb * 2 + fi], cs));
            uint8_t *exp = expected_field(&d, fi, idx, rows);
            want[nb * 2 + fi] = gk_checksum_host(exp, a->nbytes);
            free(exp);
        }
        npyload_batch_release_stream(b, cs);
        nb++;
    }
    cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(nb, NB);
    cudaError_t q = cudaStreamQuery(cs);
    cr_log_info("after the last release the consumer stream is %s",
                q == cudaErrorNotReady ? "still busy (the host ran ahead)"
                                       : "idle (the host waited)");
    CU(cudaStreamSynchronize(cs));
    unsigned long long got[NB * 2];
    CU(cudaMemcpy(got, d_sums, sizeof got, cudaMemcpyDeviceToHost));
    for (int i = 0; i < NB; i++)
        for (int fi = 0; fi < 2; fi++)
            cr_assert_eq(got[i * 2 + fi], want[i * 2 + fi],
                         "batch %d field %s: device checksum %llu, file bytes "
                         "give %llu (slot overwritten or copied late?)",
                         i, f[fi].name, got[i * 2 + fi], want[i * 2 + fi]);
    npyload_loader_destroy(L);
    cudaFree(d_sums);
    cudaStreamDestroy(cs);
    ds_free(&d);
}

/* ---- a device batch outlives its loader ---- */

Test(gpu, device_batch_outlives_loader)
{
    NEED_GPU();
    dataset d;
    const int64_t per_file[1] = {24};
    ds_make(&d, two_fields, 2, per_file, 1);
    opts o = {.batch = 6, .workers = 2, .prefetch = 3,
              .backend = NPYLOAD_IO_AUTO};
    npyload_loader *L = ds_loader(&d, &o);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyload_batch *b0, *b1;
    cr_assert_eq(npyload_loader_next(L, &b0), 0);
    cr_assert_eq(npyload_loader_next(L, &b1), 0);
    /* Destroy mid-epoch, workers busy, two batches held. */
    npyload_loader_destroy(L);
    cr_assert_eq(npyload_batch_sync(b0), 0);
    cr_assert_eq(npyload_batch_sync(b1), 0);
    check_batch_bytes(&d, b0);
    check_batch_bytes(&d, b1);
    npyload_batch_release(b0);
    npyload_batch_release(b1); /* frees the loader's memory */
    ds_free(&d);
}

/* ---- the bandwidth helper against the loader's own copy path ---- */

Test(gpu, h2d_bandwidth_helper)
{
    NEED_GPU();
    double g = 0.0;
    int rc = npyload_cuda_h2d_bandwidth(0, 64u << 20, 10, &g);
    cr_assert_eq(rc, 0, "%s", npyload_strerror(rc));
    cr_log_info("pinned cudaMemcpyAsync H2D: %.2f GB/s", g);
    cr_assert_gt(g, 1.0);
}

/* The compute simulator's kernel occupies its stream for the time asked:
 * measured on the host around a sync, and two kernels queue one after the
 * other. */
Test(gpu, compute_sim_busy_takes_its_time)
{
    NEED_GPU();
    npyload_compute_sim *s;
    char why[256];
    int rc = npyload_compute_sim_create(0, &s, why, sizeof why);
    cr_assert_eq(rc, 0, "%s", why);
    cr_assert_not_null(npyload_compute_sim_stream(s));
    cr_assert_eq(npyload_compute_sim_busy(s, 1000), 0); /* JIT and first launch */
    cr_assert_eq(npyload_compute_sim_sync(s), 0);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    cr_assert_eq(npyload_compute_sim_busy(s, 20 * 1000 * 1000), 0);
    cr_assert_eq(npyload_compute_sim_busy(s, 20 * 1000 * 1000), 0);
    cr_assert_eq(npyload_compute_sim_sync(s), 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
    cr_log_info("two 20 ms busy kernels took %.2f ms", ms);
    cr_assert_geq(ms, 39.0, "busy kernels too short: %.2f ms", ms);
    cr_assert_lt(ms, 400.0, "busy kernels far too long: %.2f ms", ms);
    npyload_compute_sim_destroy(s);
}
