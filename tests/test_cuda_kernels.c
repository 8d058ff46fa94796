/* lib/cuda's device transform kernels run on the CPU, against the host
 * engine (lib/transform) and the host expansion of narrowed codes
 * (lib/zst), bit for bit; and the loader's device path with those kernels.
 *
 * No GPU needed: the fake runtime (tests/gpu/fake_cudart.c: "device"
 * memory is host memory, copies queued per stream) and the fake driver
 * (tests/gpu/fake_cuda_driver.c) with run_kernels set, which runs each
 * launched kernel on the CPU, queued on the fake stream in order with the
 * copies: the kernels are npyload_cuda_transform_kernels.cu itself,
 * compiled as C++ with tests/gpu/kshim (each _rn intrinsic one IEEE float
 * operation, never contracted; float16 through the CPU's F16C, bfloat16 by
 * CUDA's own integer rounding). What this cannot show is the GPU's own
 * arithmetic and memory model: tests/gpu/test_gpu_transform.c compares the
 * same cases on a device.
 *
 * Float outputs may differ only where both are NaN (the device may write
 * its canonical NaN, as documented for every device transform); stored
 * dtypes kept (and every narrowed value expanded without a transform) must
 * be equal byte for byte, NaN payloads, -0.0 and denormals included. */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/npyload_cuda.h"
#include "cuda/npyload_cuda_transform.h"
#include "gpu/fake_cuda_driver.h"
#include "gpu/fake_cudart.h"
#include "npyload.h"
#include "testutil.h"
#include "transform/npyload_transform.h"
#include "zst/npyload_zst.h"

#ifndef NPYLOAD_TEST_SITE_DIRS
#define NPYLOAD_TEST_SITE_DIRS ""
#endif

/* ---- the fakes, with the kernels on the CPU ---- */

static fake_cuda_driver *fd;
static fake_cudart *frt;
static int (*rt_stream_create)(void **, unsigned);
static int (*rt_stream_sync)(void *);
static char wheel[1024]; /* NVRTC for a build without a fatbin, else "" */

/* Loads the fake runtime and the fake driver (by their SONAMEs, so lib/cuda
 * opens them) and switches on the kernels on the CPU; skips visibly where
 * that cannot be done. */
static void load_fakes(void)
{
#if !defined(NPYLOAD_FAKE_CUDART) || !defined(NPYLOAD_FAKE_CUDA_DRIVER)
    cr_skip_test("built without tests/gpu/fake_cudart.c / fake_cuda_driver.c");
#else
    void *real = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (real) {
        dlclose(real);
        cr_skip_test("a libcuda.so.1 is already loaded: the fake driver cannot stand in");
    }
    char why[512];
    if (!npyl_tdev_built(why, sizeof why))
        cr_skip_test("%s", why);
    void *rt = dlopen(NPYLOAD_FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(rt, "%s", dlerror());
    frt = ((fake_cudart_control_fn)dlsym(rt, "fake_cudart_control"))();
    *(void **)&rt_stream_create = dlsym(rt, "cudaStreamCreateWithFlags");
    *(void **)&rt_stream_sync = dlsym(rt, "cudaStreamSynchronize");
    cr_assert(rt_stream_create && rt_stream_sync);
    void *drv = dlopen(NPYLOAD_FAKE_CUDA_DRIVER, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(drv, "%s", dlerror());
    fd = ((fake_cuda_driver_control_fn)dlsym(drv, "fake_cuda_driver_control"))();
    fake_cuda_driver_cpu_kernels_fn cpu =
        (fake_cuda_driver_cpu_kernels_fn)dlsym(drv, "fake_cuda_driver_cpu_kernels");
    if (!cpu || !cpu())
        cr_skip_test("the fake driver was built without a C++ compiler: the kernels "
                     "cannot run on the CPU here");
    atomic_store(&fd->run_kernels, 1);
    wheel[0] = 0;
    if (!npyl_tdev_aot_built(NULL, 0) &&
        !tu_nvrtc_wheel_dir(NPYLOAD_TEST_SITE_DIRS, wheel, sizeof wheel))
        cr_skip_test("no fatbin in this build and no nvidia-cuda-nvrtc wheel in the test "
                     "Python's site-packages (%s): the kernels cannot be loaded",
                     NPYLOAD_TEST_SITE_DIRS);
#endif
}

static npyl_cuda *cuda;
static npyl_tdev *tdev;
static void *stream;

static void engine_setup(void)
{
    load_fakes();
    char err[2048];
    cr_assert_eq(npyl_cuda_open(&cuda, 0, err, sizeof err), 0, "%s", err);
    npyl_tdev_cfg cfg = {.mode = NPYL_TDEV_AUTO, .nvrtc = wheel[0] ? wheel : NULL};
    cr_assert_eq(npyl_tdev_open(&tdev, cuda, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(npyl_cuda_stream_create(cuda, &stream), 0);
}

static void engine_teardown(void)
{
    npyl_tdev_close(tdev);
    if (stream)
        npyl_cuda_stream_destroy(cuda, stream);
    npyl_cuda_close(cuda);
}

/* ---- data ---- */

static uint64_t rs = 0x5eed;
static uint64_t rnd(void)
{
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A value of a float type of sz bytes: mostly ordinary numbers, else one
 * of the patterns that break careless code (NaN payloads, signed zeros,
 * denormals, infinities, the largest finite). */
static void float_value(unsigned char *p, size_t sz)
{
    static const uint16_t h[] = {0x7e01, 0xfe00, 0x7c01, 0x8000, 0x0000, 0x0001,
                                 0x83ff, 0x7c00, 0xfc00, 0x7bff};
    static const uint32_t f[] = {0x7fc00001u, 0xffc00123u, 0x7f800001u, 0x80000000u,
                                 0x00000000u, 0x00000001u, 0x807fffffu, 0x7f800000u,
                                 0xff800000u, 0x7f7fffffu};
    static const uint64_t d[] = {0x7ff8000000000001ull, 0xfff8000000000123ull,
                                 0x7ff0000000000001ull, 0x8000000000000000ull, 0,
                                 1, 0x800fffffffffffffull, 0x7ff0000000000000ull,
                                 0xfff0000000000000ull, 0x47efffffe0000000ull};
    uint64_t k = rnd();
    if (k % 4 == 0) {
        size_t i = (size_t)(k >> 8) % 10;
        if (sz == 2)
            memcpy(p, &h[i], 2);
        else if (sz == 4)
            memcpy(p, &f[i], 4);
        else
            memcpy(p, &d[i], 8);
        return;
    }
    double v = (double)(int64_t)(k >> 20) / 4096.0 / 37.0;
    if (sz == 2) {
        uint16_t b = npyl_f32_to_f16((float)v);
        memcpy(p, &b, 2);
    } else if (sz == 4) {
        float x = (float)v;
        memcpy(p, &x, 4);
    } else {
        memcpy(p, &v, 8);
    }
}

/* n items of dtype descr (random bytes for integers, float_value for
 * floats, in the descr's byte order). */
static void fill(unsigned char *p, size_t n, const char *descr, size_t sz)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char *e = p + i * sz;
        if (descr[1] != 'f') {
            for (size_t b = 0; b < sz; b++)
                e[b] = (unsigned char)rnd();
            continue;
        }
        float_value(e, sz);
        if (descr[0] == '>')
            for (size_t b = 0; b < sz / 2; b++) {
                unsigned char t = e[b];
                e[b] = e[sz - 1 - b];
                e[sz - 1 - b] = t;
            }
    }
}

static int is_nan(const unsigned char *p, int out)
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

/* want vs got, n bytes of p's output: equal, or both NaN (float outputs). */
static void same(const npyl_tplan *p, const unsigned char *want, const unsigned char *got,
                 size_t n, const char *what)
{
    size_t sz = p->out_itemsize;
    for (size_t i = 0; i < n; i += sz) {
        if (!memcmp(want + i, got + i, sz))
            continue;
        cr_assert(p->out_dtype != NPYLOAD_DTYPE_KEEP && is_nan(want + i, p->out_dtype) &&
                      is_nan(got + i, p->out_dtype),
                  "%s: element %zu differs (host vs kernel)", what, i / sz);
    }
}

/* The kernel of plan p over rows with the given records (and tables) on
 * the fake stream: it runs when the stream is waited for. */
static void run_x(const npyl_tplan *p, const npyl_tdev_row *rec, const void *tables,
                  const void *src, void *dst, size_t rows)
{
    npyl_tdev_extra x = {.rows = rec, .tables = tables};
    char err[512];
    int ran = atomic_load(&fd->n_ran);
    cr_assert_eq(npyl_tdev_run_x(tdev, p, &x, src, dst, rows, stream, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(npyl_cuda_stream_sync(cuda, stream), 0, "%s", npyl_cuda_errmsg(cuda));
    cr_assert_eq(atomic_load(&fd->n_ran), ran + 1, "the kernel ran once");
}

/* ---- augmentation: kernel vs host engine ---- */

typedef struct aug_case {
    float hflip, vflip;
    int64_t crop_h, crop_w, pad; /* crop: this much smaller than (H, W) */
    int signs;                   /* 0 none, 1 per channel, 2 one for all */
} aug_case;

#define AROWS 5

/* One augmentation of samples of dtype descr and shape sshape, with output
 * dtype out, channels-last or not, arithmetic or not: the kernel's rows
 * equal the host engine's. Returns 0 when the host refuses the plan (a
 * combination the API refuses), 1 when compared. */
static int aug_compare(const char *descr, int sndim, const int64_t *sshape, const aug_case *c,
                       int out, int cl, int arith, int *flips_seen)
{
    static const float mean[4] = {0.5f, -1.25f, 3.0f, 0.0f}, sd[4] = {0.25f, 2.0f, 0.75f, 3.0f};
    static const float sgn[4] = {-1.0f, 1.0f, -1.0f, -1.0f}, one = -1.0f;
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.dtype = out;
    t.channels_last = cl;
    t.hflip = c->hflip;
    t.vflip = c->vflip;
    int64_t C = sndim ? sshape[0] : 1;
    if (sndim >= 2 && (c->crop_h || c->crop_w)) {
        t.crop_h = sshape[sndim - 2] + 2 * c->pad - c->crop_h;
        t.crop_w = sshape[sndim - 1] + 2 * c->pad - c->crop_w;
    }
    t.pad = sndim >= 2 ? c->pad : 0;
    if (arith) {
        t.scale = 1.0f / 255.0f;
        t.mean = mean;
        t.std = sd;
        t.n_mean = t.n_std = C <= 4 ? (size_t)C : 1;
    }
    if (c->signs) {
        t.hflip_sign = c->signs == 1 ? sgn : &one;
        t.vflip_sign = c->signs == 1 ? sgn + 1 : &one;
        t.n_hflip_sign = t.n_vflip_sign = c->signs == 1 ? (size_t)C : 1;
        if (c->signs == 1 && C > 3)
            t.n_vflip_sign = 1;
    }
    npyl_tplan p;
    char err[512];
    if (npyl_transform_plan("x", &t, descr, sndim, sshape, &p, err, sizeof err) != 0)
        return 0;
    cr_assert_eq(npyl_tdev_plan_check("x", &p, err, sizeof err), 0, "%s", err);
    size_t in_n = AROWS * p.stored_row_bytes, out_n = AROWS * p.out_row_bytes;
    unsigned char *src = malloc(in_n), *want = malloc(out_n), *got = malloc(out_n);
    unsigned char *scratch = malloc(p.in_row_bytes + 1);
    fill(src, in_n / p.in_itemsize, descr, p.in_itemsize);
    int64_t idx[AROWS];
    npyl_tdev_row rec[AROWS];
    for (size_t r = 0; r < AROWS; r++) {
        idx[r] = (int64_t)(rnd() % 100000);
        npyl_tdev_row_fill(&p, 11, 3, idx[r], 0, &rec[r]);
        *flips_seen |= 1 << rec[r].flips;
    }
    npyl_transform_rows_aug(&p, src, want, AROWS, 11, 3, idx, scratch);
    memset(got, 0xa5, out_n);
    run_x(&p, rec, NULL, src, got, AROWS);
    char what[256];
    snprintf(what, sizeof what, "%s shape[%d] %lld.. -> %s cl=%d arith=%d flips %.1f/%.1f "
             "crop -%lld/-%lld pad %lld signs %d", descr, sndim, (long long)sshape[0],
             p.out_descr, cl, arith, (double)c->hflip, (double)c->vflip,
             (long long)c->crop_h, (long long)c->crop_w, (long long)c->pad, c->signs);
    same(&p, want, got, out_n, what);
    free(src);
    free(want);
    free(got);
    free(scratch);
    npyl_transform_plan_free(&p);
    return 1;
}

Test(cuda_kernels, augmentation_matches_the_host_engine, .init = engine_setup,
     .fini = engine_teardown, .timeout = 300)
{
    static const char *const descrs[] = {"|u1", "|i1", "<i2", ">u2", "<f2", ">f2",
                                         "<f4", ">f4", "<f8", ">f8"};
    static const int64_t s3[] = {3, 7, 9}, s2[] = {6, 5}, s1[] = {4}, s4[] = {2, 3, 4, 5};
    static const int64_t *const shapes[] = {s3, s2, s1, s4};
    static const int ndims[] = {3, 2, 1, 4};
    static const aug_case cases[] = {
        {1, 0, 0, 0, 0, 0},   {0, 1, 0, 0, 0, 1},    {1, 1, 0, 0, 0, 2},
        {0.5f, 0.5f, 0, 0, 0, 1}, {0, 0, 2, 3, 0, 0}, {0, 0, 0, 0, 2, 0},
        {0.5f, 0.5f, 4, 4, 2, 1}, {1, 1, 1, 2, 1, 2}, {0.5f, 0, 6, 5, 3, 0},
    };
    int compared = 0, flips = 0;
    for (size_t d = 0; d < sizeof descrs / sizeof *descrs; d++)
        for (size_t k = 0; k < 4; k++)
            for (size_t a = 0; a < sizeof cases / sizeof *cases; a++) {
                if (cases[a].signs && descrs[d][1] != 'f')
                    continue; /* signs negate floats only (refused otherwise) */
                for (int out = NPYLOAD_DTYPE_KEEP; out <= NPYLOAD_DTYPE_BFLOAT16; out++)
                    for (int cl = 0; cl <= 1; cl++)
                        for (int ar = 0; ar <= (out != NPYLOAD_DTYPE_KEEP); ar++)
                            compared += aug_compare(descrs[d], ndims[k], shapes[k],
                                                    &cases[a], out, cl, ar, &flips);
            }
    cr_log_info("%d augmentations compared", compared);
    cr_assert_gt(compared, 2000);
    cr_assert_eq(flips, 0xf, "rows with no flip, hflip, vflip and both were compared");
}

/* A crop window and pad larger than the sample, at the edges of the
 * draws: every top/left the formula can give, on one row each. */
Test(cuda_kernels, every_window_position_matches, .init = engine_setup,
     .fini = engine_teardown)
{
    const int64_t shp[] = {2, 3, 4};
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.dtype = NPYLOAD_DTYPE_FLOAT32;
    t.crop_h = 4;
    t.crop_w = 5;
    t.pad = 2; /* padded (7, 8): 4 x 4 window positions */
    t.hflip = 0.5f;
    npyl_tplan p;
    char err[512];
    cr_assert_eq(npyl_transform_plan("x", &t, "<u2", 3, shp, &p, err, sizeof err), 0, "%s", err);
    enum { R = 400 };
    unsigned char *src = malloc(R * p.stored_row_bytes), *want = malloc(R * p.out_row_bytes);
    unsigned char *got = malloc(R * p.out_row_bytes), *scratch = malloc(p.in_row_bytes);
    fill(src, R * p.stored_row_bytes / 2, "<u2", 2);
    int64_t idx[R];
    npyl_tdev_row rec[R];
    int seen[4][4] = {{0}};
    for (int r = 0; r < R; r++) {
        idx[r] = r;
        npyl_tdev_row_fill(&p, 5, 0, r, 0, &rec[r]);
        cr_assert(rec[r].top < 4 && rec[r].left < 4);
        seen[rec[r].top][rec[r].left] = 1;
    }
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 4; x++)
            cr_assert(seen[y][x], "window (%d, %d) never drawn in %d rows", y, x, R);
    npyl_transform_rows_aug(&p, src, want, R, 5, 0, idx, scratch);
    run_x(&p, rec, NULL, src, got, R);
    same(&p, want, got, R * p.out_row_bytes, "every window");
    free(src);
    free(want);
    free(got);
    free(scratch);
    npyl_transform_plan_free(&p);
}

/* ---- narrowed codes: kernel vs the host's expansion ---- */

#define NROWS 12
#define NTABLES 3

/* Tables of `count[k]` distinct values of descr (bit patterns from fill:
 * NaN payloads, -0.0, denormals, infinities), NPYL_TDEV_TABLE entries
 * apart, unused entries zero; x[k] the same as lib/zst's table. */
static unsigned char *make_tables(const char *descr, size_t sz, const uint32_t *count,
                                  npyl_zst_narrow *x)
{
    size_t tb = NPYL_TDEV_TABLE * sz;
    unsigned char *t = calloc(NTABLES, tb);
    for (int k = 0; k < NTABLES; k++) {
        fill(t + k * tb, count[k], descr, sz);
        memset(&x[k], 0, sizeof x[k]);
        snprintf(x[k].descr, sizeof x[k].descr, "%s", descr);
        x[k].count = count[k];
        x[k].itemsize = (uint32_t)sz;
        memcpy(x[k].values, t + k * tb, count[k] * sz);
    }
    return t;
}

/* Narrowed samples of dtype descr (codes of NTABLES tables, each row its
 * own table) through transform t: the kernel's output equals the host's
 * (expansion by lib/zst, then the host engine). */
static void narrow_compare(const char *descr, size_t sz, const npyload_transform *t,
                           int sndim, const int64_t *sshape)
{
    static const uint32_t counts[NTABLES] = {13, 200, 256};
    npyl_zst_narrow x[NTABLES];
    unsigned char *tables = make_tables(descr, sz, counts, x);
    npyl_tplan p;
    char err[512];
    cr_assert_eq(npyl_transform_plan("x", t, descr, sndim, sshape, &p, err, sizeof err), 0,
                 "%s", err);
    size_t elems = p.stored_row_bytes / sz;
    unsigned char *codes = malloc(NROWS * elems), *values = malloc(NROWS * p.stored_row_bytes);
    unsigned char *want = malloc(NROWS * p.out_row_bytes), *got = malloc(NROWS * p.out_row_bytes);
    unsigned char *scratch = malloc(p.in_row_bytes);
    int64_t idx[NROWS];
    npyl_tdev_row rec[NROWS];
    for (size_t r = 0; r < NROWS; r++) {
        uint32_t k = (uint32_t)(rnd() % NTABLES);
        for (size_t i = 0; i < elems; i++)
            codes[r * elems + i] = (unsigned char)(rnd() % counts[k]);
        cr_assert_eq(npyl_zst_narrow_expand(&x[k], codes + r * elems, elems,
                                            values + r * p.stored_row_bytes), 0);
        idx[r] = (int64_t)(rnd() % 5000);
        npyl_tdev_row_fill(&p, 2, 9, idx[r], k, &rec[r]);
    }
    if (npyl_transform_is_identity(&p))
        memcpy(want, values, NROWS * p.out_row_bytes);
    else
        npyl_transform_rows_aug(&p, values, want, NROWS, 2, 9, idx, scratch);
    memset(got, 0x5a, NROWS * p.out_row_bytes);
    run_x(&p, rec, tables, codes, got, NROWS);
    char what[128];
    snprintf(what, sizeof what, "narrowed %s -> %s cl=%d aug=%d", descr, p.out_descr,
             p.channels_last, p.aug);
    same(&p, want, got, NROWS * p.out_row_bytes, what);
    free(codes);
    free(values);
    free(want);
    free(got);
    free(scratch);
    free(tables);
    npyl_transform_plan_free(&p);
}

Test(cuda_kernels, narrowed_codes_expand_bit_for_bit, .init = engine_setup,
     .fini = engine_teardown)
{
    static const char *const descrs[] = {"<f4", ">f4", "<f8", ">f8", "<f2", ">f2",
                                         "<i4", ">u2", "<i8"};
    static const size_t sizes[] = {4, 4, 8, 8, 2, 2, 4, 2, 8};
    const int64_t shp[] = {3, 6, 10};
    for (size_t d = 0; d < sizeof descrs / sizeof *descrs; d++) {
        /* the expansion alone: a copy of table entries, exact for every
         * pattern (the identity plan keeps the dtype) */
        npyload_transform id = NPYLOAD_TRANSFORM_INIT;
        narrow_compare(descrs[d], sizes[d], &id, 3, shp);
        /* fused with a conversion, arithmetic, channels-last */
        for (int out = NPYLOAD_DTYPE_FLOAT32; out <= NPYLOAD_DTYPE_BFLOAT16; out++) {
            npyload_transform t = NPYLOAD_TRANSFORM_INIT;
            t.dtype = out;
            t.scale = 0.5f;
            t.channels_last = out != NPYLOAD_DTYPE_FLOAT16;
            narrow_compare(descrs[d], sizes[d], &t, 3, shp);
        }
        /* and with augmentation: window, pad, flips, signs (floats) */
        npyload_transform a = NPYLOAD_TRANSFORM_INIT;
        static const float sgn[3] = {-1.0f, 1.0f, -1.0f};
        a.hflip = a.vflip = 0.5f;
        a.crop_h = 5;
        a.crop_w = 9;
        a.pad = 1;
        if (descrs[d][1] == 'f') {
            a.hflip_sign = sgn;
            a.n_hflip_sign = 3;
        }
        narrow_compare(descrs[d], sizes[d], &a, 3, shp); /* stored dtype kept */
        a.dtype = NPYLOAD_DTYPE_FLOAT16;
        a.channels_last = 1;
        narrow_compare(descrs[d], sizes[d], &a, 3, shp);
    }
}

/* The launcher's choice and parameters: the npyl_tkx_ family, the plan's
 * geometry, the signs as bits, the sign bit of the stored byte order, the
 * tables; refusals name the reason. */
Test(cuda_kernels, launcher_picks_and_fills, .init = engine_setup, .fini = engine_teardown)
{
    const int64_t shp[] = {3, 8, 10};
    static const float sgn[3] = {1.0f, -1.0f, -1.0f};
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.dtype = NPYLOAD_DTYPE_BFLOAT16;
    t.hflip = 1.0f;
    t.hflip_sign = sgn;
    t.n_hflip_sign = 3;
    t.crop_h = 6;
    t.crop_w = 7;
    t.pad = 2;
    npyl_tplan p;
    char err[512];
    cr_assert_eq(npyl_transform_plan("x", &t, ">f8", 3, shp, &p, err, sizeof err), 0, "%s", err);
    unsigned char src[3 * 80 * 8] = {0}, dst[3 * 42 * 2];
    npyl_tdev_row rec = {0, 0, 1, 0};
    atomic_store(&fd->run_kernels, 0); /* parameters only */
    npyl_tdev_extra x = {.rows = &rec, .tables = NULL};
    cr_assert_eq(npyl_tdev_run_x(tdev, &p, &x, src, dst, 1, stream, err, sizeof err), 0, "%s",
                 err);
    cr_assert_str_eq(fd->last_kernel, "npyl_tkx_f8_bf");
    npyl_tk_params P;
    memcpy(&P, fd->last_params, sizeof P);
    cr_assert_eq(P.C, 3);
    cr_assert_eq(P.S, 6 * 7);
    cr_assert_eq(P.in_elems, 3 * 8 * 10, "the stored row");
    cr_assert_eq(P.geom, 1);
    cr_assert(P.H == 8 && P.W == 10 && P.h == 6 && P.w == 7 && P.pad == 2);
    cr_assert_eq(P.hneg[0], 0x6u, "channels 1 and 2 negated");
    cr_assert_eq(P.vneg[0], 0u);
    cr_assert_eq(P.signmask, 0x80u, "big-endian: the sign is in the first byte");
    cr_assert_eq(P.swap, 1);
    cr_assert_eq(P.rowinfo, &rec);
    cr_assert_null(P.tables);
    /* a plan with augmentation needs the records */
    cr_assert_eq(npyl_tdev_run(tdev, &p, src, dst, 1, stream, err, sizeof err),
                 NPYLOAD_EINVAL);
    cr_assert_not_null(strstr(err, "npyl_tdev_run_x"), "%s", err);
    npyl_transform_plan_free(&p);

    /* the expansion alone: the keep kernel of the values' size, with tables */
    npyload_transform id = NPYLOAD_TRANSFORM_INIT;
    cr_assert_eq(npyl_transform_plan("x", &id, "<f4", 3, shp, &p, err, sizeof err), 0, "%s",
                 err);
    unsigned char tables[NPYL_TDEV_TABLE * 4];
    x.tables = tables;
    cr_assert_eq(npyl_tdev_run_x(tdev, &p, &x, src, dst, 1, stream, err, sizeof err), 0, "%s",
                 err);
    cr_assert_str_eq(fd->last_kernel, "npyl_tkx_keep4");
    memcpy(&P, fd->last_params, sizeof P);
    cr_assert_eq(P.tables, tables);
    cr_assert_eq(P.geom, 0);
    cr_assert_eq(P.signmask, 0x80000000u);
    npyl_transform_plan_free(&p);

    /* past the kernels' limits: flip signs for more channels than 128 */
    const int64_t wide[] = {200, 4};
    float s200[200];
    for (int c = 0; c < 200; c++)
        s200[c] = c % 2 ? -1.0f : 1.0f;
    npyload_transform w = NPYLOAD_TRANSFORM_INIT;
    w.hflip = 0.5f;
    w.hflip_sign = s200;
    w.n_hflip_sign = 200;
    cr_assert_eq(npyl_transform_plan("wide", &w, "<f4", 2, wide, &p, err, sizeof err), 0, "%s",
                 err);
    cr_assert_eq(npyl_tdev_plan_check("wide", &p, err, sizeof err), NPYLOAD_EUNSUPPORTED);
    cr_assert(strstr(err, "wide") && strstr(err, "flip signs for 200 channels") &&
                  strstr(err, "host"), "%s", err);
    npyl_transform_plan_free(&p);
}

/* ---- the loader's device path, with the kernels on the CPU ---- */

/* A loader over `paths` (one field "x") in device mode on the fakes, or in
 * host mode (device -1), with transform t (NULL: none). */
static npyload_loader *make_loader(const char *const *paths, size_t n, int64_t device,
                                   const npyload_transform *t, int64_t workers)
{
    npyload_loader *L = NULL;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field_files(L, "x", paths, n), 0, "%s",
                 npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 7), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, 3), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, NPYLOAD_SHUFFLE_FULL), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SEED, 21), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, device), 0, "%s",
                 npyload_loader_errmsg(L));
    if (wheel[0])
        cr_assert_eq(npyload_loader_set_path(L, NPYLOAD_PATH_NVRTC, wheel), 0);
    if (t)
        cr_assert_eq(npyload_loader_set_transform(L, "x", t, sizeof *t), 0, "%s",
                     npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    return L;
}

typedef struct run_out {
    unsigned char *bytes; /* every batch's field bytes, in order */
    size_t n;
    int64_t rows;
    npyload_stats st;
    char descr[32];
} run_out;

/* Every batch of two epochs, the device ones read after a consumer stream
 * waited for them (the fake runs the copies and kernels then). */
static void drain(npyload_loader *L, int device, run_out *o)
{
    void *cs = NULL;
    if (device >= 0)
        cr_assert_eq(rt_stream_create(&cs, 1), 0);
    memset(o, 0, sizeof *o);
    for (uint64_t e = 0; e < 2; e++) {
        cr_assert_eq(npyload_loader_set_epoch(L, e), 0);
        npyload_batch *b;
        int rc;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            const npyload_array *a = npyload_batch_field(b, 0);
            if (device >= 0) {
                cr_assert_eq(a->device, 0);
                cr_assert_eq(npyload_batch_wait_stream(b, cs), 0);
                cr_assert_eq(rt_stream_sync(cs), 0);
            }
            o->bytes = realloc(o->bytes, o->n + a->nbytes);
            memcpy(o->bytes + o->n, a->data, a->nbytes);
            o->n += a->nbytes;
            o->rows += (int64_t)npyload_batch_size(b);
            snprintf(o->descr, sizeof o->descr, "%s", a->descr);
            if (device >= 0)
                npyload_batch_release_stream(b, cs);
            else
                npyload_batch_release(b);
        }
        cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    }
    npyload_loader_get_stats(L, &o->st, sizeof o->st);
}

/* The same files through host mode and device mode: the same bytes (float
 * outputs: or both NaN); returns the device run's stats and engine. */
static void host_vs_device(const char *const *paths, size_t n, const npyload_transform *t,
                           int64_t workers, npyload_stats *dst, int *engine, char *why,
                           size_t whylen)
{
    run_out h, d;
    npyload_loader *H = make_loader(paths, n, -1, t, 2);
    drain(H, -1, &h);
    npyload_loader_destroy(H);
    npyload_loader *D = make_loader(paths, n, 0, t, workers);
    *engine = npyload_loader_field_engine(D, 0, why, whylen);
    cr_log_info("engine %d: %s", *engine, why);
    drain(D, 0, &d);
    npyload_loader_destroy(D);
    cr_assert_eq(d.rows, h.rows);
    cr_assert_eq(d.n, h.n);
    cr_assert_str_eq(d.descr, h.descr);
    int out = !strcmp(h.descr, "<f4") ? NPYLOAD_DTYPE_FLOAT32
            : !strcmp(h.descr, "<f2") ? NPYLOAD_DTYPE_FLOAT16
            : !strcmp(h.descr, "bfloat16") ? NPYLOAD_DTYPE_BFLOAT16 : NPYLOAD_DTYPE_KEEP;
    npyl_tplan p = {.out_dtype = t && t->dtype ? out : NPYLOAD_DTYPE_KEEP,
                    .out_itemsize = out == NPYLOAD_DTYPE_FLOAT32 ? 4 : 2};
    if (p.out_dtype == NPYLOAD_DTYPE_KEEP)
        p.out_itemsize = 1;
    same(&p, h.bytes, d.bytes, h.n, "host mode vs device mode");
    *dst = d.st;
    free(h.bytes);
    free(d.bytes);
}

#define LN 30 /* samples per field */

/* An augmented uint8 image field (2 channels, the captcha layout shrunk):
 * PCIe carries the stored bytes plus a 16-byte record per row, one kernel
 * per batch does pad, window, flips and the normalisation, and the output
 * equals host mode's byte for byte. */
Test(cuda_kernels, loader_augments_on_the_device, .timeout = 120)
{
    load_fakes();
    char *dir = tu_mkdtemp("kaug");
    const int64_t sshape[3] = {2, 12, 20}, counts[2] = {13, LN - 13};
    cr_assert_eq(tu_write_field(dir, "img", 3, "|u1", 1, 3, sshape, counts, 2, 64), 0);
    char *p0 = tu_path(dir, "img_0000.npy"), *p1 = tu_path(dir, "img_0001.npy");
    const char *paths[2] = {p0, p1};
    static const float mean[2] = {0.5f, 0.25f}, sd[2] = {0.2f, 0.3f};
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.dtype = NPYLOAD_DTYPE_FLOAT32;
    t.scale = 1.0f / 255.0f;
    t.mean = mean;
    t.std = sd;
    t.n_mean = t.n_std = 2;
    t.channels_last = 1;
    t.hflip = 0.5f;
    t.vflip = 0.25f;
    t.crop_h = 10;
    t.crop_w = 16;
    t.pad = 2;
    const int64_t worker_counts[2] = {2, NPYLOAD_WORKERS_SYNC};
    for (int k = 0; k < 2; k++) {
        int launches = atomic_load(&fd->n_launch), ran = atomic_load(&fd->n_ran);
        npyload_stats st;
        int eng;
        char why[1024];
        host_vs_device(paths, 2, &t, worker_counts[k], &st, &eng, why, sizeof why);
        cr_assert_eq(eng, NPYLOAD_ENGINE_DEVICE, "%s", why);
        cr_assert(strstr(why, "stored '|u1'"), "%s", why);
        /* two epochs of LN rows: 2 x 12 x 20 stored bytes and a record each */
        cr_assert_eq(st.h2d_bytes, 2u * LN * (2 * 12 * 20 + sizeof(npyl_tdev_row)),
                     "h2d_bytes %llu", (unsigned long long)st.h2d_bytes);
        int batches = 2 * ((LN + 6) / 7);
        cr_assert_eq(atomic_load(&fd->n_launch) - launches, batches, "one kernel a batch");
        cr_assert_eq(atomic_load(&fd->n_ran) - ran, batches);
        cr_assert_str_eq(fd->last_kernel, "npyl_tkx_u1_f4");
    }
    free(p0);
    free(p1);
    tu_rmtree(dir);
}

/* Float vectors with flip signs kept in their stored dtype (the offsets
 * label of the captcha layout: negated when flipped), and float16 out. */
Test(cuda_kernels, loader_signs_on_the_device, .timeout = 120)
{
    load_fakes();
    char *dir = tu_mkdtemp("ksign");
    const int64_t sshape[3] = {4, 6, 8}, counts[1] = {LN};
    cr_assert_eq(tu_write_field(dir, "off", 5, "<f4", 4, 3, sshape, counts, 1, 64), 0);
    char *p0 = tu_path(dir, "off_0000.npy");
    const char *paths[1] = {p0};
    static const float hs[4] = {-1.0f, 1.0f, -1.0f, 1.0f}, vs[4] = {1.0f, -1.0f, 1.0f, -1.0f};
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.hflip = 0.5f;
    t.vflip = 0.5f;
    t.hflip_sign = hs;
    t.vflip_sign = vs;
    t.n_hflip_sign = t.n_vflip_sign = 4;
    for (int out = NPYLOAD_DTYPE_KEEP; out <= NPYLOAD_DTYPE_FLOAT16; out += 2) {
        t.dtype = out;
        npyload_stats st;
        int eng;
        char why[1024];
        host_vs_device(paths, 1, &t, 2, &st, &eng, why, sizeof why);
        cr_assert_eq(eng, NPYLOAD_ENGINE_DEVICE, "%s", why);
        cr_assert_eq(st.h2d_bytes, 2u * LN * (4 * 6 * 8 * 4 + sizeof(npyl_tdev_row)));
        cr_assert_str_eq(fd->last_kernel, out ? "npyl_tkx_f4_f2" : "npyl_tkx_keep4");
    }
    free(p0);
    tu_rmtree(dir);
}

/* Flip signs for more channels than the kernels take: the host engine,
 * and the reason. */
Test(cuda_kernels, loader_past_the_kernels_limits_uses_the_host_engine, .timeout = 120)
{
    load_fakes();
    char *dir = tu_mkdtemp("kwide");
    const int64_t sshape[2] = {130, 3}, counts[1] = {LN};
    cr_assert_eq(tu_write_field(dir, "w", 6, "<f4", 4, 2, sshape, counts, 1, 64), 0);
    char *p0 = tu_path(dir, "w_0000.npy");
    const char *paths[1] = {p0};
    float s[130];
    for (int c = 0; c < 130; c++)
        s[c] = c % 3 ? 1.0f : -1.0f;
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.hflip = 0.5f;
    t.hflip_sign = s;
    t.n_hflip_sign = 130;
    npyload_stats st;
    int eng;
    char why[1024];
    host_vs_device(paths, 1, &t, 2, &st, &eng, why, sizeof why);
    cr_assert_eq(eng, NPYLOAD_ENGINE_HOST, "%s", why);
    cr_assert(strstr(why, "130 channels") && strstr(why, "at most 128"), "%s", why);
    cr_assert_eq(st.h2d_bytes, 2u * LN * 130 * 3 * 4, "the output crossed, no records");
    free(p0);
    tu_rmtree(dir);
}

/* 256 float32 patterns (NaN payloads, both zeros, denormals, infinities,
 * gray levels), a different set per file: file k uses pats[i] ^ k<<..
 * on the ordinary values only. */
static void patterns(uint32_t pats[256], int k)
{
    static const uint32_t odd[] = {0x7fc00000u, 0x7fc00001u, 0xffc00123u, 0x7f800001u,
                                   0x80000000u, 0x00000000u, 0x00000001u, 0x807fffffu,
                                   0x7f800000u, 0xff800000u};
    size_t n = 0;
    for (; n < sizeof odd / sizeof odd[0]; n++)
        pats[n] = odd[n];
    for (int v = 1; n < 256; v++, n++) {
        float f = (float)(v + 1000 * k) / 255.0f;
        memcpy(&pats[n], &f, 4);
    }
}

#define NR 10   /* rows per file */
#define NV 48   /* values per row: (3, 4, 4) */

/* dir/n_k.npy: NR samples (3, 4, 4) float32 over file k's patterns, packed
 * narrowed (store: the plain .npy of codes with a trailer) or not at all
 * (plain). Writes the path the loader reads to out. */
static void narrowed_file(const char *dir, int k, int mode, char *out, size_t len)
{
    uint32_t pats[256], v[NR * NV];
    patterns(pats, k);
    for (size_t i = 0; i < NR * NV; i++)
        v[i] = pats[(i * 7 + (size_t)k) % 256];
    char p[600];
    snprintf(p, sizeof p, "%s/n_%d.npy", dir, k);
    const int64_t shape[4] = {NR, 3, 4, 4};
    cr_assert_geq(tu_write_npy(p, "<f4", 0, 4, shape, v, sizeof v, 64), 0);
    snprintf(out, len, "%s", p);
    if (mode == 0)
        return; /* plain */
    npyload_pack_options o = {.frame_size = 700, .threads = 1, .narrow = 1,
                              .store = mode == 2};
    npyload_pack_result r;
    char err[512];
    snprintf(out, len, "%s/n_%d.%s", dir, k, mode == 2 ? "narrow.npy" : "npy.zst");
    cr_assert_eq(npyload_pack_file(p, out, &o, sizeof o, &r, sizeof r, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(r.narrow_values, 256);
}

/* A field of narrowed files (.npy.zst and the stored form, each its own
 * table): PCIe carries one byte per value plus a record per row, the
 * kernel expands through the right table, and the values equal host
 * mode's (which expands on the host) bit for bit; fused with a transform. */
Test(cuda_kernels, loader_expands_narrowed_codes_on_the_device, .timeout = 120)
{
    load_fakes();
    char *dir = tu_mkdtemp("knarrow");
    char f[3][640];
    narrowed_file(dir, 0, 1, f[0], sizeof f[0]);
    narrowed_file(dir, 1, 2, f[1], sizeof f[1]);
    narrowed_file(dir, 2, 1, f[2], sizeof f[2]);
    const char *paths[3] = {f[0], f[1], f[2]};
    npyload_stats st;
    int eng;
    char why[1024];
    host_vs_device(paths, 3, NULL, 2, &st, &eng, why, sizeof why);
    cr_assert_eq(eng, NPYLOAD_ENGINE_DEVICE, "%s", why);
    cr_assert(strstr(why, "codes"), "%s", why);
    cr_assert_eq(st.h2d_bytes, 2u * 3 * NR * (NV + sizeof(npyl_tdev_row)),
                 "one byte per value crossed: %llu", (unsigned long long)st.h2d_bytes);
    cr_assert_str_eq(fd->last_kernel, "npyl_tkx_keep4");

    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.dtype = NPYLOAD_DTYPE_FLOAT16;
    t.scale = 2.0f;
    t.channels_last = 1;
    t.hflip = 0.5f;
    host_vs_device(paths, 3, &t, NPYLOAD_WORKERS_SYNC, &st, &eng, why, sizeof why);
    cr_assert_eq(eng, NPYLOAD_ENGINE_DEVICE, "%s", why);
    cr_assert_eq(st.h2d_bytes, 2u * 3 * NR * (NV + sizeof(npyl_tdev_row)));
    cr_assert_str_eq(fd->last_kernel, "npyl_tkx_f4_f2");
    tu_rmtree(dir);
}

/* Narrowed and plain files in one field: expanded on the host (said so),
 * the full values cross, the values still equal. */
Test(cuda_kernels, loader_mixed_narrowed_and_plain_expands_on_the_host, .timeout = 120)
{
    load_fakes();
    char *dir = tu_mkdtemp("kmixed");
    char f[2][640];
    narrowed_file(dir, 0, 1, f[0], sizeof f[0]);
    narrowed_file(dir, 1, 0, f[1], sizeof f[1]);
    const char *paths[2] = {f[0], f[1]};
    npyload_stats st;
    int eng;
    char why[1024];
    host_vs_device(paths, 2, NULL, 2, &st, &eng, why, sizeof why);
    cr_assert_eq(eng, NPYLOAD_ENGINE_NONE, "%s", why);
    cr_assert(strstr(why, "expanded on the host") && strstr(why, "1 of its 2 files"), "%s", why);
    cr_assert_eq(st.h2d_bytes, 2u * 2 * NR * NV * 4);
    tu_rmtree(dir);
}

/* A damaged code (past its table) in a stored narrowed file: the batch
 * fails naming the file; never wrong bytes as success. */
Test(cuda_kernels, loader_refuses_a_code_outside_the_table_on_the_device, .timeout = 120)
{
    load_fakes();
    char *dir = tu_mkdtemp("kbad");
    char f[640];
    /* 8 distinct values: codes 0..7; make one code 200 */
    uint32_t v[NR * NV];
    for (size_t i = 0; i < NR * NV; i++) {
        float x = (float)(i % 8);
        memcpy(&v[i], &x, 4);
    }
    char p[600];
    snprintf(p, sizeof p, "%s/b.npy", dir);
    const int64_t shape[4] = {NR, 3, 4, 4};
    cr_assert_geq(tu_write_npy(p, "<f4", 0, 4, shape, v, sizeof v, 64), 0);
    snprintf(f, sizeof f, "%s/b.narrow.npy", dir);
    npyload_pack_options o = {.threads = 1, .narrow = 1, .store = 1};
    npyload_pack_result r;
    char err[512];
    cr_assert_eq(npyload_pack_file(p, f, &o, sizeof o, &r, sizeof r, err, sizeof err), 0, "%s",
                 err);
    npyload_header h;
    cr_assert_eq(npyload_read_header(f, &h, err, sizeof err), 0, "%s", err);
    FILE *fp = fopen(f, "r+b");
    cr_assert_not_null(fp);
    fseek(fp, (long)h.data_offset + 5 * NV + 3, SEEK_SET); /* sample 5 */
    fputc(200, fp);
    fclose(fp);
    const char *paths[1] = {f};
    npyload_loader *L = make_loader(paths, 1, 0, NULL, 1);
    char why[1024];
    cr_assert_eq(npyload_loader_field_engine(L, 0, why, sizeof why), NPYLOAD_ENGINE_DEVICE,
                 "%s", why);
    npyload_batch *b;
    int rc, failed = 0;
    while ((rc = npyload_loader_next(L, &b)) != NPYLOAD_EOF) {
        if (rc == 0) {
            npyload_batch_release(b);
            continue;
        }
        failed++;
        const char *m = npyload_loader_errmsg(L);
        cr_assert(strstr(m, "b.narrow.npy") && strstr(m, "not in the file's table"), "%s", m);
        break;
    }
    cr_assert_eq(failed, 1, "the batch holding sample 5 failed");
    npyload_loader_destroy(L);
    tu_rmtree(dir);
}
