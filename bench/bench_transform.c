/* Host transform engine throughput, one thread, and the error of the fused
 * form x*a + b (a = scale/std, b = -mean/std) against the literal float32
 * formula the engine computes. Uses lib/transform's internal API, so it is
 * built against the static library (bench/CMakeLists.txt, with the tools):
 *
 *   cmake --build build --target bench_transform
 *   build/bench/bench_transform [batch=256] [reps=20]
 *
 * GB/s counts the bytes read plus the bytes written per second. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transform/npyload_transform.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const float MEAN[3] = {0.485f, 0.456f, 0.406f};
static const float STD[3] = {0.229f, 0.224f, 0.225f};

static void bench(const char *label, const char *descr, int out, int cl,
                  int portable, size_t batch, int reps)
{
    const int64_t shp[] = {3, 64, 64};
    npyload_transform t = {.dtype = out, .scale = descr[1] == 'u' ? 1.0f / 255.0f : 1.0f,
                        .mean = MEAN, .n_mean = 3, .std = STD, .n_std = 3,
                        .channels_last = cl};
    npyl_tplan p;
    char err[256];
    int rc = portable ? npyl_transform_plan_portable("bench", &t, descr, 3, shp, &p, err, sizeof err)
                      : npyl_transform_plan("bench", &t, descr, 3, shp, &p, err, sizeof err);
    if (rc) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    size_t in_n = batch * p.in_row_bytes, out_n = batch * p.out_row_bytes;
    unsigned char *src = malloc(in_n), *dst = malloc(out_n);
    for (size_t i = 0; i < in_n; i++)
        src[i] = (unsigned char)(i * 131 + (i >> 7));
    if (descr[1] == 'f')
        for (size_t i = 0; i < in_n / 4; i++)
            ((float *)(void *)src)[i] = (float)(i % 251) / 251.0f;
    npyl_transform_rows(&p, src, dst, batch); /* warm up, fault pages in */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        npyl_transform_rows(&p, src, dst, batch);
        double dt = now() - t0;
        if (dt < best)
            best = dt;
    }
    printf("%-46s %7.2f ms  %6.2f GB/s (in+out)  %6.2f Gelem/s  %s\n", label,
           best * 1e3, (double)(in_n + out_n) / best / 1e9,
           (double)batch * 3 * 64 * 64 / best / 1e9, p.f16c ? "F16C" : "portable");
    free(src);
    free(dst);
    npyl_transform_plan_free(&p);
}

static long ulp_dist(uint32_t a, uint32_t b, int bits)
{
    uint32_t s = 1u << (bits - 1);
    long ia = (a & s) ? -(long)(a & (s - 1)) : (long)a;
    long ib = (b & s) ? -(long)(b & (s - 1)) : (long)b;
    return labs(ia - ib);
}

/* Max ulp distance of the fused form from the literal one, per output. */
static void fused_error(const char *label, const float *xs, size_t n,
                        float scale)
{
    long worst[3] = {0, 0, 0};
    for (int c = 0; c < 3; c++) {
        volatile float a = scale / STD[c], b = -MEAN[c] / STD[c];
        for (size_t i = 0; i < n; i++) {
            volatile float t = xs[i] * scale;
            t = t - MEAN[c];
            float lit = t / STD[c];
            volatile float u = xs[i] * a;
            float fus = u + b;
            uint32_t l32, f32;
            memcpy(&l32, &lit, 4);
            memcpy(&f32, &fus, 4);
            long d[3] = {ulp_dist(l32, f32, 32),
                         ulp_dist(npyl_f32_to_f16(lit), npyl_f32_to_f16(fus), 16),
                         ulp_dist(npyl_f32_to_bf16(lit), npyl_f32_to_bf16(fus), 16)};
            for (int k = 0; k < 3; k++)
                if (d[k] > worst[k])
                    worst[k] = d[k];
        }
    }
    printf("fused x*a+b vs literal, %-26s max ulp: float32 %ld, float16 %ld, bfloat16 %ld\n",
           label, worst[0], worst[1], worst[2]);
}

int main(int argc, char **argv)
{
    size_t batch = argc > 1 ? (size_t)atol(argv[1]) : 256;
    int reps = argc > 2 ? atoi(argv[2]) : 20;
    printf("batch %zu x (3, 64, 64), best of %d, one thread\n", batch, reps);
    bench("uint8 -> float16 norm channels-last", "|u1", NPYLOAD_DTYPE_FLOAT16, 1, 0, batch, reps);
    bench("uint8 -> float16 norm channels-last portable", "|u1", NPYLOAD_DTYPE_FLOAT16, 1, 1, batch, reps);
    bench("uint8 -> float16 norm channels-first", "|u1", NPYLOAD_DTYPE_FLOAT16, 0, 0, batch, reps);
    bench("uint8 -> bfloat16 norm channels-last", "|u1", NPYLOAD_DTYPE_BFLOAT16, 1, 0, batch, reps);
    bench("uint8 -> float32 norm channels-last", "|u1", NPYLOAD_DTYPE_FLOAT32, 1, 0, batch, reps);
    bench("float32 -> float16 norm channels-last", "<f4", NPYLOAD_DTYPE_FLOAT16, 1, 0, batch, reps);
    bench("float32 -> float16 norm channels-first", "<f4", NPYLOAD_DTYPE_FLOAT16, 0, 0, batch, reps);

    float u8[256];
    for (int i = 0; i < 256; i++)
        u8[i] = (float)i;
    fused_error("uint8, scale 1/255:", u8, 256, 1.0f / 255.0f);
    size_t n = 1 << 20;
    float *r = malloc(n * sizeof *r);
    uint64_t s = 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        r[i] = (float)(s >> 40) / 16777216.0f; /* [0, 1) */
    }
    fused_error("float32 in [0,1), scale 1:", r, n, 1.0f);
    free(r);
    return 0;
}
