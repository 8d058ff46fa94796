/* float16 / bfloat16 loops of the host engine: a portable path that GCC
 * vectorises (npyload_transform_f16.h), and an F16C path (x86 vcvtps2ph /
 * vcvtph2ps) compiled with a target attribute and chosen at plan time only
 * when CPUID says the CPU and the OS support it. Both round to nearest even
 * and give the same bits (NaN included: vcvtps2ph keeps sign and top payload
 * bits and sets the quiet bit, as the portable path does). */
#include "npyload_transform.h"
#include "npyload_transform_f16.h"
#include "npyload_transform_impl.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define NPYL_HAVE_F16C_PATH 1
#endif

uint16_t npyl_f32_to_f16(float f) { return npyl_f2h(f); }
float npyl_f16_to_f32(uint16_t h) { return npyl_h2f(h); }
uint16_t npyl_f32_to_bf16(float f) { return npyl_f2bf(f); }
float npyl_bf16_to_f32(uint16_t h) { return npyl_bf2f(h); }

void npyl_tstore_f16(const float *restrict src, size_t n, void *restrict dst)
{
    unsigned char *d = dst;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = npyl_f2h(src[i]);
        memcpy(d + 2 * i, &h, 2);
    }
}

void npyl_tstore_bf16(const float *restrict src, size_t n, void *restrict dst)
{
    unsigned char *d = dst;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = npyl_f2bf(src[i]);
        memcpy(d + 2 * i, &h, 2);
    }
}

void npyl_tload_f16(const void *restrict src, size_t n, float *restrict dst)
{
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = npyl_h2f(h);
    }
}

void npyl_tload_f16_swap(const void *restrict src, size_t n,
                         float *restrict dst)
{
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = npyl_h2f(__builtin_bswap16(h));
    }
}

#ifdef NPYL_HAVE_F16C_PATH
__attribute__((target("avx,f16c"))) static void
store_f16_f16c(const float *restrict src, size_t n, void *restrict dst)
{
    unsigned char *d = dst;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(void *)(d + 2 * i), h);
    }
    npyl_tstore_f16(src + i, n - i, d + 2 * i);
}

__attribute__((target("avx,f16c"))) static void
load_f16_f16c(const void *restrict src, size_t n, float *restrict dst)
{
    const unsigned char *s = src;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                      (const __m128i *)(const void *)(s + 2 * i))));
    npyl_tload_f16(s + 2 * i, n - i, dst + i);
}

/* CPUID.1:ECX F16C (29), AVX (28), OSXSAVE (27), and XCR0 saving the XMM
 * and YMM state (the OS supports AVX registers). */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    const unsigned need = (1u << 29) | (1u << 28) | (1u << 27);
    if ((c & need) != need)
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u;
}
#endif

int npyl_tf16c_pick(npyl_tload_fn *load, npyl_tstore_fn *store)
{
#ifdef NPYL_HAVE_F16C_PATH
    if (cpu_has_f16c()) {
        if (load)
            *load = load_f16_f16c;
        if (store)
            *store = store_f16_f16c;
        return 1;
    }
#endif
    (void)load;
    (void)store;
    return 0;
}

int npyl_transform_f16c(int *compiled)
{
#ifdef NPYL_HAVE_F16C_PATH
    if (compiled)
        *compiled = 1;
#else
    if (compiled)
        *compiled = 0;
#endif
    return npyl_tf16c_pick(NULL, NULL);
}
