/* Device transforms (lib/transform, kernels in npyload_transform_kernels.cu)
 * against the host engine: bit for bit, NaN payloads aside (both NaN).
 * Needs the kernels (nvcc at build time) and a CUDA device; skips visibly
 * otherwise. Plain C: the library loads CUDA itself. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/npyload_cuda.h"
#include "transform/npyload_transform.h"

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
    cr_assert_eq(npyl_tdev_open(&tdev, why, sizeof why), 0, "%s", why);
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
    if (out == NPYL_TDTYPE_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        return isnan(f);
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return out == NPYL_TDTYPE_FLOAT16 ? (h & 0x7fff) > 0x7c00 : (h & 0x7fff) > 0x7f80;
}

static void compare(const char *descr, int out, int cl, int arith,
                    int ndim, const int64_t *shp, size_t rows)
{
    float mean[4] = {0.485f, 0.456f, 0.406f, 0.5f}, sd[4] = {0.229f, 0.224f, 0.225f, 0.25f};
    npyl_transform t = {.dtype = out, .channels_last = cl};
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
        for (int out = NPYL_TDTYPE_FLOAT32; out <= NPYL_TDTYPE_BFLOAT16; out++)
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
        compare(descrs[d], NPYL_TDTYPE_KEEP, 1, 0, 3, s1, 4);
}
