/* Branch-free float <-> float16 / bfloat16 conversions, written so that GCC
 * vectorises loops over them (every path is computed, then selected).
 * Private to lib/transform. Round to nearest even, in integer arithmetic
 * except two float operations: the multiply in npyl_h2f is exact with a
 * normal result, and the add in npyl_f2h's subnormal path relies on the
 * default rounding mode (round to nearest even), as every float operation of
 * the engine does. FTZ/DAZ do not change any result. */
#ifndef NPYLOAD_TRANSFORM_F16_H
#define NPYLOAD_TRANSFORM_F16_H

#include <stdint.h>
#include <string.h>

static inline uint32_t npyl_fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float npyl_bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float -> binary16, RNE. Normal results: add the rounding bias to the
 * float's bits and shift (a carry into the exponent is the correct
 * rounding up, up to infinity). Subnormal results: shift the significand
 * (with its implicit bit) right by the exponent deficit and round on the
 * bits shifted out (by a float addition). NaN: quiet, sign and top payload bits kept. */
static inline uint16_t npyl_f2h(float f)
{
    uint32_t x = npyl_fbits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    /* normal range: a >= 2^-14 (exp 113) */
    uint32_t odd = (a >> 13) & 1u;
    uint32_t norm = (a - (112u << 23) + 0xfffu + odd) >> 13;
    /* subnormal range: a < 2^-14. Adding 0.5 leaves the value in [0.5, 1)
     * where the float ulp is 2^-24, the float16 subnormal quantum, so the
     * FPU's addition does the rounding (to nearest even: the default mode,
     * which this path assumes; FTZ/DAZ cannot matter, the sum is normal and
     * float subnormal inputs round to 0 either way). Vectorises on SSE2,
     * unlike a per-lane variable shift. */
    uint32_t sub = npyl_fbits(npyl_bitsf(a) + 0.5f) - 0x3f000000u;
    uint32_t r = a < (113u << 23) ? sub : norm;
    r = a >= 0x47800000u ? 0x7c00u : r;                     /* >= 65536: inf */
    r = a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : r; /* NaN */
    return (uint16_t)(sign | r);
}

/* binary16 -> float, exact. A NaN keeps its sign and payload and comes out
 * quiet (the quiet bit set: a signalling NaN is quieted), exactly as x86's
 * vcvtph2ps does, so the F16C path and this one give the same bits for all
 * 65,536 inputs wherever an element falls in a row (IEEE 754 asks a
 * conversion to quiet a signalling NaN). */
static inline float npyl_h2f(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t em = (uint32_t)h & 0x7fffu;
    uint32_t norm = (em << 13) + (112u << 23);            /* rebias 15 -> 127 */
    uint32_t quiet = em > 0x7c00u ? 0x00400000u : 0u;     /* NaN */
    uint32_t infnan = (em << 13) | 0x7f800000u | quiet;
    /* subnormal: em * 2^-24, exact in float (em < 1024) */
    float subf = (float)em * 5.9604644775390625e-8f;
    uint32_t sub = npyl_fbits(subf);
    uint32_t r = em >= 0x7c00u ? infnan : norm;
    r = em < 0x0400u ? sub : r;
    return npyl_bitsf(sign | r);
}

/* float -> bfloat16, RNE; NaN: quiet, sign and top payload bits kept. */
static inline uint16_t npyl_f2bf(float f)
{
    uint32_t x = npyl_fbits(f);
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

static inline float npyl_bf2f(uint16_t h)
{
    return npyl_bitsf((uint32_t)h << 16);
}

#endif
