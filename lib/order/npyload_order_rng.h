/* lib/order's generator, shared by the single-source order
 * (npyload_order.c) and the mixture (npyload_mix.c): SplitMix64-seeded
 * xoshiro256**, Lemire's bounded draws and Fisher-Yates, specified bit for
 * bit in npyload_order.h. Private to lib/order. */
#ifndef NPYLOAD_ORDER_RNG_H
#define NPYLOAD_ORDER_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "../common/npyload_common.h"

typedef struct npyl_rng {
    uint64_t s[4];
} npyl_rng;

static inline uint64_t splitmix64(uint64_t *x)
{
    *x += NPYL_GOLDEN;
    return npyl_mix64(*x);
}

static inline uint64_t rotl64(uint64_t v, int k)
{
    return (v << k) | (v >> (64 - k));
}

static inline void rng_init(npyl_rng *g, int64_t seed, uint64_t epoch)
{
    uint64_t x = (uint64_t)seed;
    uint64_t k = splitmix64(&x);
    x = k ^ epoch;
    for (int i = 0; i < 4; i++)
        g->s[i] = splitmix64(&x);
}

static inline uint64_t rng_next(npyl_rng *g)
{
    uint64_t *s = g->s;
    uint64_t r = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return r;
}

/* 64x64 -> 128-bit product, high and low halves. */
static inline uint64_t mul_hilo(uint64_t a, uint64_t b, uint64_t *lo)
{
#if defined(__SIZEOF_INT128__)
    unsigned __int128 m = (unsigned __int128)a * b;
    *lo = (uint64_t)m;
    return (uint64_t)(m >> 64);
#else
    uint64_t a0 = (uint32_t)a, a1 = a >> 32, b0 = (uint32_t)b, b1 = b >> 32;
    uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    uint64_t mid = (p00 >> 32) + (uint32_t)p01 + (uint32_t)p10;
    *lo = (mid << 32) | (uint32_t)p00;
    return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
#endif
}

/* Uniform in [0, bound), bound >= 1: Lemire's multiply-shift with rejection;
 * the division only happens on the rare path where rejection is possible. */
static inline uint64_t rng_bounded(npyl_rng *g, uint64_t bound)
{
    uint64_t lo;
    uint64_t hi = mul_hilo(rng_next(g), bound, &lo);
    if (lo < bound) {
        uint64_t thr = (0 - bound) % bound;
        while (lo < thr)
            hi = mul_hilo(rng_next(g), bound, &lo);
    }
    return hi;
}

static inline void fisher_yates(npyl_rng *g, int64_t *a, size_t len)
{
    for (size_t i = len; i-- > 1;) {
        size_t j = (size_t)rng_bounded(g, (uint64_t)i + 1);
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

#endif
