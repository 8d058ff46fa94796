/* Device transforms (lib/cuda, kernels in npyload_cuda_transform_kernels.cu)
 * against the host engine: bit for bit, NaN payloads aside (both NaN);
 * augmentation and narrowed codes too (the cases of xform_cases.c), and the
 * loader's device path against its host mode, with the bytes that crossed.
 * Needs the kernels (a fatbin, or NVRTC at run time) and a CUDA device;
 * skips visibly otherwise. Plain C: the library loads CUDA itself.
 *
 * ctest also runs it on the fake runtime and driver with the kernels on
 * the CPU (test_gpu_transform_on_fakes: both fakes in LD_PRELOAD,
 * FAKE_CUDA_RUN_KERNELS=1), so its own logic is exercised where no GPU
 * is; only a GPU run shows the device's arithmetic. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/npyload_cuda.h"
#include "cuda/npyload_cuda_transform.h"
#include "gpu/xform_cases.h"
#include "testutil.h"

static npyl_cuda *cuda;
static npyl_tdev *tdev;
static void *stream;

static void setup(void)
{
    char why[512] = "";
    if (!npyl_tdev_built(why, sizeof why))
        cr_skip_test("%s", why);
    if (npyl_cuda_open(&cuda, 0, why, sizeof why) != 0)
        cr_skip_test("no CUDA device: %s", why);
    void *probe = NULL; /* the runtime creates the primary context lazily */
    cr_assert_eq(npyl_cuda_malloc(cuda, &probe, 256), 0, "%s", npyl_cuda_errmsg(cuda));
    npyl_cuda_free(cuda, probe);
    cr_assert_eq(npyl_cuda_stream_create(cuda, &stream), 0);
    /* NPYLOAD_TEST_DEVICE_KERNELS=nvrtc (ctest's test_gpu_transform_nvrtc):
     * the same checks on the kernels NVRTC compiles at run time, with the
     * libnvrtc of NPYLOAD_NVRTC when set (else the library's search). */
    const char *mode = getenv("NPYLOAD_TEST_DEVICE_KERNELS");
    const char *nvrtc = getenv("NPYLOAD_NVRTC");
    npyl_tdev_cfg cfg = {.mode = mode && strcmp(mode, "nvrtc") == 0 ? NPYL_TDEV_NVRTC
                                                                    : NPYL_TDEV_AUTO,
                         .nvrtc = nvrtc && nvrtc[0] ? nvrtc : NULL};
    cr_assert_eq(npyl_tdev_open(&tdev, cuda, &cfg, why, sizeof why), 0, "%s", why);
    cr_log_info("kernels: %s", npyl_tdev_source(tdev));
}

static void teardown(void)
{
    npyl_tdev_close(tdev);
    if (stream)
        npyl_cuda_stream_destroy(cuda, stream);
    npyl_cuda_close(cuda);
}

static uint64_t st = 12345;
static uint64_t rnd(void)
{
    uint64_t z = (st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int nan_bits(const unsigned char *p, size_t sz, int out)
{
    if (out == NPYLOAD_DTYPE_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        return isnan(f);
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return out == NPYLOAD_DTYPE_FLOAT16 ? (h & 0x7fff) > 0x7c00 : (h & 0x7fff) > 0x7f80;
}

static void compare(const char *descr, int out, int cl, int arith,
                    int ndim, const int64_t *shp, size_t rows)
{
    float mean[4] = {0.485f, 0.456f, 0.406f, 0.5f}, sd[4] = {0.229f, 0.224f, 0.225f, 0.25f};
    npyload_transform t = {.scale = 1.0f, .dtype = out, .channels_last = cl};
    if (arith >= 1)
        t.scale = 1.0f / 255.0f;
    if (arith == 2) {
        t.mean = mean;
        t.std = sd;
        t.n_mean = t.n_std = (size_t)shp[0];
    }
    npyl_tplan p;
    char err[512];
    cr_assert_eq(npyl_transform_plan("x", &t, descr, ndim, shp, &p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(npyl_tdev_plan_check("x", &p, err, sizeof err), 0, "%s", err);
    if (npyl_transform_is_identity(&p)) {
        /* '<f4' to float32 with nothing to compute (a copy: the loader
         * runs no kernel for it) */
        npyl_transform_plan_free(&p);
        return;
    }
    size_t in_n = rows * p.in_row_bytes, out_n = rows * p.out_row_bytes;
    unsigned char *src = malloc(in_n), *want = malloc(out_n), *got = malloc(out_n);
    for (size_t i = 0; i < in_n; i++)
        src[i] = (unsigned char)rnd();
    if (descr[1] == 'f' && descr[2] == '4') /* mostly ordinary floats */
        for (size_t i = 0; i + 4 <= in_n; i += 4)
            if (rnd() % 4) {
                float f = (float)(rnd() % 100000) / 97.0f - 500.0f;
                memcpy(src + i, &f, 4);
            }
    npyl_transform_rows(&p, src, want, rows);
    void *dsrc = NULL, *ddst = NULL;
    cr_assert_eq(npyl_cuda_malloc(cuda, &dsrc, in_n), 0);
    cr_assert_eq(npyl_cuda_malloc(cuda, &ddst, out_n), 0);
    cr_assert_eq(npyl_cuda_memcpy_h2d_async(cuda, dsrc, src, in_n, stream), 0);
    cr_assert_eq(npyl_tdev_run(tdev, &p, dsrc, ddst, rows, stream, err, sizeof err), 0, "%s", err);
    cr_assert_eq(npyl_cuda_stream_sync(cuda, stream), 0, "%s", npyl_cuda_errmsg(cuda));
    cr_assert_eq(npyl_cuda_memcpy_d2h(cuda, got, ddst, out_n), 0);
    size_t sz = p.out_itemsize;
    for (size_t i = 0; i < out_n; i += sz) {
        if (!memcmp(want + i, got + i, sz))
            continue;
        cr_assert(nan_bits(want + i, sz, p.out_dtype) && nan_bits(got + i, sz, p.out_dtype),
                  "%s -> %s cl=%d arith=%d: element %zu differs (host vs device)",
                  descr, p.out_descr, cl, arith, i / sz);
    }
    npyl_cuda_free(cuda, dsrc);
    npyl_cuda_free(cuda, ddst);
    free(src);
    free(want);
    free(got);
    npyl_transform_plan_free(&p);
}

Test(gpu_transform, matches_host_engine, .init = setup, .fini = teardown)
{
    static const char *const descrs[] = {"|u1", "|i1", "<u2", ">u2", "<i2", ">i2",
                                         "<u4", ">i4", "<u8", ">i8", "<f2", ">f2",
                                         "<f4", ">f4", "<f8", ">f8"};
    const int64_t s1[] = {3, 37, 61}, s2[] = {4, 5, 7}, s3[] = {1, 9, 11};
    const int64_t *shapes[] = {s1, s2, s3};
    for (size_t d = 0; d < sizeof descrs / sizeof descrs[0]; d++)
        for (int out = NPYLOAD_DTYPE_FLOAT32; out <= NPYLOAD_DTYPE_BFLOAT16; out++)
            for (int cl = 0; cl <= 1; cl++)
                for (int arith = 0; arith <= 2; arith++)
                    for (int k = 0; k < 3; k++)
                        compare(descrs[d], out, cl, arith, 3, shapes[k], 5);
}

Test(gpu_transform, keep_channels_last_permute, .init = setup, .fini = teardown)
{
    static const char *const descrs[] = {"|u1", "<f2", "<f4", "<f8", "<c16"};
    const int64_t s1[] = {3, 37, 61};
    for (size_t d = 0; d < sizeof descrs / sizeof descrs[0]; d++)
        compare(descrs[d], NPYLOAD_DTYPE_KEEP, 1, 0, 3, s1, 4);
}

/* ---- augmentation and narrowed codes (npyl_tkx_*) vs the host ----
 * The cases of tests/gpu/xform_cases.c, which test_cuda_kernels also runs
 * with the kernels compiled for the CPU; here on the GPU. */

static void gpu_run(void *ctx, const npyl_tplan *p, const npyl_tdev_row *rec, size_t rows,
                    const void *src, size_t src_n, const void *tables, size_t tab_n, void *got,
                    size_t out_n)
{
    (void)ctx;
    void *dsrc = NULL, *ddst = NULL, *drec = NULL, *dtab = NULL;
    char err[512];
    cr_assert_eq(npyl_cuda_malloc(cuda, &dsrc, src_n), 0);
    cr_assert_eq(npyl_cuda_malloc(cuda, &ddst, out_n), 0);
    cr_assert_eq(npyl_cuda_malloc(cuda, &drec, rows * sizeof *rec), 0);
    cr_assert_eq(npyl_cuda_memcpy_h2d_async(cuda, dsrc, src, src_n, stream), 0);
    cr_assert_eq(npyl_cuda_memcpy_h2d_async(cuda, drec, rec, rows * sizeof *rec, stream), 0);
    if (tables) {
        cr_assert_eq(npyl_cuda_malloc(cuda, &dtab, tab_n), 0);
        cr_assert_eq(npyl_cuda_memcpy_h2d_async(cuda, dtab, tables, tab_n, stream), 0);
    }
    npyl_tdev_extra x = {.rows = drec, .tables = dtab};
    cr_assert_eq(npyl_tdev_run_x(tdev, p, &x, dsrc, ddst, rows, stream, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(npyl_cuda_stream_sync(cuda, stream), 0, "%s", npyl_cuda_errmsg(cuda));
    cr_assert_eq(npyl_cuda_memcpy_d2h(cuda, got, ddst, out_n), 0);
    npyl_cuda_free(cuda, dsrc);
    npyl_cuda_free(cuda, ddst);
    npyl_cuda_free(cuda, drec);
    npyl_cuda_free(cuda, dtab);
}

static const xc_runner gpu = {gpu_run, NULL};

Test(gpu_transform, augmentation_matches_host_engine, .init = setup, .fini = teardown)
{
    cr_assert_gt(xc_augmentations(&gpu), 2000);
    xc_windows(&gpu);
}

Test(gpu_transform, narrowed_codes_match_host_expansion, .init = setup, .fini = teardown)
{
    xc_narrowed(&gpu);
}

/* ---- the loader's device path: device transform vs host transform ---- */

#include "npyload.h"
#include <unistd.h>

#define LN 45
#define LC 3
#define LH 16
#define LW 12

/* One uint8 field of LN samples (LC, LH, LW) in two files under dir. */
static void write_u8_field(const char *dir)
{
    int64_t counts[2] = {20, LN - 20};
    size_t row = LC * LH * LW;
    for (int k = 0; k < 2; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/img_%d.npy", dir, k);
        int64_t shape[4] = {counts[k], LC, LH, LW};
        unsigned char hdr[256];
        int hl = npyload_format_header(hdr, sizeof hdr, "|u1", 0, 4, shape);
        cr_assert_gt(hl, 0);
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f);
        fwrite(hdr, 1, (size_t)hl, f);
        for (size_t i = 0; i < (size_t)counts[k] * row; i++)
            fputc((int)(rnd() & 0xff), f);
        fclose(f);
    }
}

static npyload_loader *loader_for(const char *glob, int device, int workers,
                                  const npyload_transform *t)
{
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "images", glob), 0);
    npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 8);
    npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers);
    npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1);
    npyload_loader_set(L, NPYLOAD_OPT_SEED, 4);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, device), 0, "%s",
                 npyload_loader_errmsg(L));
    const char *nvrtc = getenv("NPYLOAD_NVRTC"); /* as setup() gives the engine */
    if (nvrtc && nvrtc[0])
        cr_assert_eq(npyload_loader_set_path(L, NPYLOAD_PATH_NVRTC, nvrtc), 0);
    if (t)
        cr_assert_eq(npyload_loader_set_transform(L, "images", t, sizeof *t), 0, "%s",
                     npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    return L;
}

/* Host mode and device mode over the same files (glob), transform t (NULL:
 * none): every batch equal bit for bit (the same rounding on both engines;
 * NaN payloads aside: equal NaN-ness), indices, descr and strides equal,
 * and PCIe carried h2d bytes (per epoch) in device mode, which runs on the
 * engine `engine`. */
static void loader_case(const char *glob, const npyload_transform *t, int workers,
                        uint64_t h2d, int engine)
{
    npyload_loader *H = loader_for(glob, -1, 2, t);
    npyload_loader *D = loader_for(glob, 0, workers, t);
    char why[1024];
    int eng = npyload_loader_field_engine(D, 0, why, sizeof why);
    cr_log_info("device engine: %s", why);
    cr_assert_eq(eng, engine, "%s", why);
    npyload_batch *hb, *db;
    int rh, rd;
    size_t rows = 0;
    uint64_t out_bytes = 0;
    while ((rh = npyload_loader_next(H, &hb)) == 0) {
        rd = npyload_loader_next(D, &db);
        cr_assert_eq(rd, 0, "%s", npyload_loader_errmsg(D));
        const npyload_array *ha = npyload_batch_field(hb, 0), *da = npyload_batch_field(db, 0);
        cr_assert_eq(da->device, 0);
        cr_assert_str_eq(da->descr, ha->descr);
        cr_assert_eq(da->nbytes, ha->nbytes);
        cr_assert_eq(memcmp(da->strides, ha->strides, sizeof(int64_t) * 4), 0);
        cr_assert_eq(memcmp(npyload_batch_indices(db), npyload_batch_indices(hb),
                            npyload_batch_size(hb) * 8), 0);
        cr_assert_eq(npyload_batch_sync(db), 0);
        unsigned char *back = malloc(da->nbytes);
        cr_assert_eq(npyl_cuda_memcpy_d2h(cuda, back, da->data, da->nbytes), 0);
        /* Same three roundings on both engines: equal bit for bit. */
        if (memcmp(back, ha->data, ha->nbytes) != 0) {
            npyl_tplan p = {.out_dtype = !strcmp(ha->descr, "<f4")   ? NPYLOAD_DTYPE_FLOAT32
                                         : !strcmp(ha->descr, "<f2") ? NPYLOAD_DTYPE_FLOAT16
                                         : !strcmp(ha->descr, "bfloat16")
                                             ? NPYLOAD_DTYPE_BFLOAT16
                                             : NPYLOAD_DTYPE_KEEP,
                            .out_itemsize = ha->itemsize};
            if (!t || t->dtype == NPYLOAD_DTYPE_KEEP)
                p.out_dtype = NPYLOAD_DTYPE_KEEP;
            xc_same(&p, ha->data, back, ha->nbytes, "host mode vs device mode");
        }
        free(back);
        rows += npyload_batch_size(hb);
        out_bytes += ha->nbytes;
        npyload_batch_release(hb);
        npyload_batch_release(db);
    }
    cr_assert_eq(rh, NPYLOAD_EOF);
    cr_assert_eq(npyload_loader_next(D, &db), NPYLOAD_EOF);
    cr_assert_eq(rows, (size_t)npyload_loader_num_samples(H));
    /* PCIe carried the stored dtype (or the codes), not the output dtype. */
    npyload_stats stats;
    npyload_loader_get_stats(D, &stats, sizeof stats);
    cr_log_info("H2D bytes per epoch: %llu; the output delivered: %llu bytes",
                (unsigned long long)stats.h2d_bytes, (unsigned long long)out_bytes);
    cr_assert_eq(stats.h2d_bytes, h2d);
    npyload_loader_destroy(H);
    npyload_loader_destroy(D);
}

Test(gpu_transform, loader_device_matches_host, .init = setup, .fini = teardown)
{
    char dir[] = "/tmp/npyload-gtr-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    write_u8_field(dir);
    char glob[512];
    snprintf(glob, sizeof glob, "%s/img_*.npy", dir);
    static const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    for (int dt = NPYLOAD_DTYPE_FLOAT32; dt <= NPYLOAD_DTYPE_BFLOAT16; dt++)
        for (int cl = 0; cl < 2; cl++) {
            npyload_transform t = {.dtype = dt, .scale = 1.0f / 255, .mean = mean,
                                   .n_mean = 3, .std = sd, .n_std = 3, .channels_last = cl};
            loader_case(glob, &t, 2, (uint64_t)LN * LC * LH * LW, NPYLOAD_ENGINE_DEVICE);
            /* next() on this thread */
            loader_case(glob, &t, NPYLOAD_WORKERS_SYNC, (uint64_t)LN * LC * LH * LW,
                        NPYLOAD_ENGINE_DEVICE);
        }
    for (int k = 0; k < 2; k++) {
        char p[600];
        snprintf(p, sizeof p, "%s/img_%d.npy", dir, k);
        unlink(p);
    }
    rmdir(dir);
}

/* Augmentation in device mode: the stored uint8 crosses PCIe with a
 * 16-byte record per row, and one kernel per batch pads, crops, flips and
 * normalises: bit for bit the host engine's rows. */
Test(gpu_transform, loader_device_augments_like_host, .init = setup, .fini = teardown)
{
    char dir[] = "/tmp/npyload-gaug-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    write_u8_field(dir);
    char glob[512];
    snprintf(glob, sizeof glob, "%s/img_*.npy", dir);
    static const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    const uint64_t h2d = (uint64_t)LN * (LC * LH * LW + sizeof(npyl_tdev_row));
    for (int dt = NPYLOAD_DTYPE_KEEP; dt <= NPYLOAD_DTYPE_BFLOAT16; dt++)
        for (int cl = 0; cl < 2; cl++) {
            npyload_transform t = NPYLOAD_TRANSFORM_INIT;
            t.dtype = dt;
            t.channels_last = cl;
            if (dt != NPYLOAD_DTYPE_KEEP) {
                t.scale = 1.0f / 255;
                t.mean = mean;
                t.std = sd;
                t.n_mean = t.n_std = 3;
            }
            t.hflip = 0.5f;
            t.vflip = 0.5f;
            t.crop_h = 14;
            t.crop_w = 10;
            t.pad = 2;
            loader_case(glob, &t, 2, h2d, NPYLOAD_ENGINE_DEVICE);
            loader_case(glob, &t, NPYLOAD_WORKERS_SYNC, h2d, NPYLOAD_ENGINE_DEVICE);
        }
    for (int k = 0; k < 2; k++) {
        char p[600];
        snprintf(p, sizeof p, "%s/img_%d.npy", dir, k);
        unlink(p);
    }
    rmdir(dir);
}

#define NN 24   /* samples per narrowed file */
#define NVAL 96 /* float32 values per sample: (2, 6, 8) */

/* dir/n_k.npy: NN samples over 256 float32 patterns (NaN payloads, both
 * zeros, denormals, infinities, gray levels; file k its own), packed
 * narrowed as .npy.zst (store 0) or the stored form (store 1). */
static void write_narrowed(const char *dir, int k, int store)
{
    static const uint32_t odd[] = {0x7fc00000u, 0x7fc00001u, 0xffc00123u, 0x7f800001u,
                                   0x80000000u, 0x00000000u, 0x00000001u, 0x807fffffu,
                                   0x7f800000u, 0xff800000u};
    uint32_t pats[256], v[NN * NVAL];
    for (int i = 0; i < 256; i++) {
        float f = (float)(i + 300 * k) / 255.0f;
        memcpy(&pats[i], &f, 4);
        if (i < 10)
            pats[i] = odd[i];
    }
    for (size_t i = 0; i < NN * NVAL; i++)
        v[i] = pats[(i * 11 + (size_t)k) % 256];
    char p[600], out[640];
    snprintf(p, sizeof p, "%s/raw_%d.npy", dir, k);
    const int64_t shape[4] = {NN, 2, 6, 8};
    cr_assert_geq(tu_write_npy(p, "<f4", 0, 4, shape, v, sizeof v, 64), 0);
    snprintf(out, sizeof out, "%s/n_%d.%s", dir, k, store ? "narrow.npy" : "npy.zst");
    npyload_pack_options o = {.frame_size = 1000, .threads = 1, .narrow = 1, .store = store};
    npyload_pack_result r;
    char err[512];
    cr_assert_eq(npyload_pack_file(p, out, &o, sizeof o, &r, sizeof r, err, sizeof err), 0,
                 "%s", err);
}

/* Narrowed files in device mode: one byte per value crosses PCIe (and a
 * record per row), the kernel expands through each file's table, alone
 * (values bit for bit, NaN payloads included) and fused with a transform. */
Test(gpu_transform, loader_device_expands_narrowed_like_host, .init = setup, .fini = teardown)
{
    char *dir = tu_mkdtemp("gnarrow");
    for (int k = 0; k < 3; k++)
        write_narrowed(dir, k, k == 1);
    char glob[600];
    snprintf(glob, sizeof glob, "%s/n_*", dir);
    const uint64_t h2d = 3ull * NN * (NVAL + sizeof(npyl_tdev_row));
    loader_case(glob, NULL, 2, h2d, NPYLOAD_ENGINE_DEVICE);
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.dtype = NPYLOAD_DTYPE_BFLOAT16;
    t.scale = 0.5f;
    t.channels_last = 1;
    t.hflip = 0.5f;
    t.crop_h = 4;
    t.crop_w = 8;
    loader_case(glob, &t, 2, h2d, NPYLOAD_ENGINE_DEVICE);
    loader_case(glob, &t, NPYLOAD_WORKERS_SYNC, h2d, NPYLOAD_ENGINE_DEVICE);
    tu_rmtree(dir);
}
