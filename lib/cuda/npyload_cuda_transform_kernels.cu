// Device transforms: the same math as the host engine (lib/transform/npyload_transform.c),
// one output element per thread. Compiled by nvcc at build time into a
// fatbin embedded in libnpyload (npyload_cuda_transform_kernels.cmake) and loaded
// through the driver API (npyload_cuda_transform.c); never linked against
// the CUDA runtime.
//
// Agreement with the host, bit for bit: the widening of the stored value is
// exact (integers to float32 and double to float32 round to nearest even on
// both sides; half to float is exact), the arithmetic is three correctly
// rounded operations written with the _rn intrinsics (so no FMA contraction
// whatever -fmad says), and the narrowing is RNE (__float2half_rn,
// __float2bfloat16_rn). NaN payloads may differ (the device may write its
// canonical NaN); NaN stays NaN.
//
// Grid: y walks the rows, x the C*S elements of a row in output order; with
// channels-last an output element (s, c) reads input (c, s), so a warp reads
// C short runs and writes one coalesced run.
//
// Two families: npyl_tk_* (and npyl_tk_perm*) read the stored rows as they
// are; npyl_tkx_* (and npyl_tkx_keep*) first find each element through the
// row's augmentation decisions (crop window of the padded sample, flips,
// signs) and, for a narrowed field, through the row's value table, in the
// same pass. The per-row records (npyl_tk_row) come from the host, which
// computed the decisions with the host engine's own function.
//
// tests/gpu/kshim compiles this file for the CPU (plain C++, the _rn
// intrinsics as correctly rounded float operations) to compare the kernels'
// output with the host engine's where no GPU is (test_cuda_kernels).
#ifdef __CUDACC_RTC__
#include "npyload_cuda_transform_rtc.h" // NVRTC: no CUDA headers at run time
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#endif

#include "npyload_cuda_transform_kparams.h"

namespace {

__device__ __forceinline__ uint16_t bswap16(uint16_t v)
{
    return (uint16_t)((v >> 8) | (v << 8));
}
__device__ __forceinline__ uint32_t bswap32(uint32_t v)
{
    return __byte_perm(v, 0, 0x0123);
}
__device__ __forceinline__ uint64_t bswap64(uint64_t v)
{
    return ((uint64_t)bswap32((uint32_t)v) << 32) | bswap32((uint32_t)(v >> 32));
}

// In<T>: the stored type T as U, its bits (loaded as they lie, the item
// size's unsigned type), and conv: those bits (byte-swapped when sw) widened
// to float32.
template <typename T> struct In;
template <> struct In<uint8_t> {
    typedef uint8_t U;
    static __device__ float conv(U v, unsigned) { return __uint2float_rn(v); }
};
template <> struct In<int8_t> {
    typedef uint8_t U;
    static __device__ float conv(U v, unsigned) { return __int2float_rn((int8_t)v); }
};
template <> struct In<uint16_t> {
    typedef uint16_t U;
    static __device__ float conv(U v, unsigned sw)
    {
        return __uint2float_rn(sw ? bswap16(v) : v);
    }
};
template <> struct In<int16_t> {
    typedef uint16_t U;
    static __device__ float conv(U v, unsigned sw)
    {
        return __int2float_rn((int16_t)(sw ? bswap16(v) : v));
    }
};
template <> struct In<uint32_t> {
    typedef uint32_t U;
    static __device__ float conv(U v, unsigned sw)
    {
        return __uint2float_rn(sw ? bswap32(v) : v);
    }
};
template <> struct In<int32_t> {
    typedef uint32_t U;
    static __device__ float conv(U v, unsigned sw)
    {
        return __int2float_rn((int32_t)(sw ? bswap32(v) : v));
    }
};
template <> struct In<uint64_t> {
    typedef uint64_t U;
    static __device__ float conv(U v, unsigned sw)
    {
        return __ull2float_rn(sw ? bswap64(v) : v);
    }
};
template <> struct In<int64_t> {
    typedef uint64_t U;
    static __device__ float conv(U v, unsigned sw)
    {
        return __ll2float_rn((int64_t)(sw ? bswap64(v) : v));
    }
};
template <> struct In<__half> {
    typedef uint16_t U;
    static __device__ float conv(U v, unsigned sw)
    {
        return __half2float(__ushort_as_half(sw ? bswap16(v) : v));
    }
};
template <> struct In<float> {
    typedef uint32_t U;
    static __device__ float conv(U v, unsigned sw)
    {
        return __uint_as_float(sw ? bswap32(v) : v);
    }
};
template <> struct In<double> {
    typedef uint64_t U;
    static __device__ float conv(U v, unsigned sw)
    {
        return __double2float_rn(__longlong_as_double((long long)(sw ? bswap64(v) : v)));
    }
};

template <typename T>
__device__ __forceinline__ float load(const void *p, size_t i, unsigned sw)
{
    return In<T>::conv(((const typename In<T>::U *)p)[i], sw);
}

enum { OUT_F4 = 1, OUT_F2 = 2, OUT_BF = 3 };

template <int O> __device__ __forceinline__ void put(void *p, size_t i, float y);
template <> __device__ __forceinline__ void put<OUT_F4>(void *p, size_t i, float y)
{
    ((float *)p)[i] = y;
}
template <> __device__ __forceinline__ void put<OUT_F2>(void *p, size_t i, float y)
{
    ((__half *)p)[i] = __float2half_rn(y);
}
template <> __device__ __forceinline__ void put<OUT_BF>(void *p, size_t i, float y)
{
    ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(y);
}

// The arithmetic of channel c: three correctly rounded operations.
__device__ __forceinline__ float arith(const npyl_tk_params &P, float x, unsigned c)
{
    if (P.arith == 1) {
        x = __fmul_rn(x, P.scale);
    } else if (P.arith == 2) {
        float m = P.per_channel ? P.mean[c] : P.mean1;
        float d = P.per_channel ? P.std[c] : P.std1;
        x = __fdiv_rn(__fsub_rn(__fmul_rn(x, P.scale), m), d);
    }
    return x;
}

// Output element o of a row: channel c, position s of the (augmented) sample.
__device__ __forceinline__ void where(const npyl_tk_params &P, unsigned o, unsigned *c,
                                      unsigned *s)
{
    if (P.channels_last) {
        *s = o / P.C;
        *c = o - *s * P.C;
    } else {
        *c = o / P.S;
        *s = o - *c * P.S;
    }
}

template <typename T, int O>
__device__ __forceinline__ void convert(const npyl_tk_params &P)
{
    const unsigned CS = P.C * P.S;
    for (unsigned long long n = blockIdx.y; n < P.rows; n += gridDim.y) {
        const size_t base = (size_t)n * CS;
        for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < CS;
             o += gridDim.x * blockDim.x) {
            unsigned c, s;
            where(P, o, &c, &s);
            float x = load<T>(P.src, base + (size_t)c * P.S + s, P.swap);
            put<O>(P.dst, base + o, arith(P, x, c));
        }
    }
}

template <typename U>
__device__ __forceinline__ void permute(const npyl_tk_params &P)
{
    const unsigned CS = P.C * P.S;
    for (unsigned long long n = blockIdx.y; n < P.rows; n += gridDim.y) {
        const size_t base = (size_t)n * CS;
        for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < CS;
             o += gridDim.x * blockDim.x) {
            unsigned s = o / P.C, c = o - s * P.C;
            ((U *)P.dst)[base + o] = ((const U *)P.src)[base + (size_t)c * P.S + s];
        }
    }
}

struct u128 {
    unsigned long long lo, hi;
};

// ---- augmentation and narrowed codes (npyl_tkx_*) ----
//
// Element e of the augmented row (npyload.h, "Augmentation": the window of
// the padded sample, flipped) is stored element si of the row, or padding
// (a stored zero); a narrowed field's stored element is a one-byte code and
// its value the entry of the row's table (an exact copy of the bits). Then
// channel c is negated (the sign bit, as stored) when the row's flips ask
// for it, and the value goes on as in convert/permute. One pass: nothing is
// written but the output.

__device__ __forceinline__ bool source(const npyl_tk_params &P, const npyl_tk_row &R,
                                       unsigned e, unsigned long long *si)
{
    if (!P.geom) {
        *si = e;
        return true;
    }
    const unsigned x = e % P.w, t = e / P.w, y = t % P.h, q = t / P.h;
    const long long u = (long long)R.top + (R.flips & 2 ? P.h - 1 - y : y) - (long long)P.pad;
    const long long v = (long long)R.left + (R.flips & 1 ? P.w - 1 - x : x) - (long long)P.pad;
    if (u < 0 || u >= (long long)P.H || v < 0 || v >= (long long)P.W)
        return false;
    *si = ((unsigned long long)q * P.H + (unsigned long long)u) * P.W + (unsigned long long)v;
    return true;
}

__device__ __forceinline__ bool negate(const npyl_tk_params &P, const npyl_tk_row &R,
                                       unsigned c)
{
    if (c >= NPYL_TK_MAXC)
        return false; // signs are planned for at most NPYL_TK_MAXC channels
    const bool h = (R.flips & 1) && ((P.hneg[c >> 5] >> (c & 31)) & 1);
    const bool v = (R.flips & 2) && ((P.vneg[c >> 5] >> (c & 31)) & 1);
    return h != v;
}

template <typename U> __device__ __forceinline__ U flip_sign(U v, unsigned long long m)
{
    return (U)(v ^ (U)m);
}
template <> __device__ __forceinline__ u128 flip_sign<u128>(u128 v, unsigned long long)
{
    return v; // 16-byte items (complex) are never negated
}
template <typename U> __device__ __forceinline__ U table_value(const npyl_tk_params &P,
                                                              const npyl_tk_row &R,
                                                              unsigned char code)
{
    return ((const U *)P.tables)[(size_t)R.table * NPYL_TK_TABLE + code];
}
template <> __device__ __forceinline__ u128 table_value<u128>(const npyl_tk_params &,
                                                              const npyl_tk_row &,
                                                              unsigned char)
{
    return u128(); // tables hold 2-, 4- or 8-byte values only
}

// The bits of element e (channel c) of row n's augmented sample, as stored.
template <typename U>
__device__ __forceinline__ U fetch(const npyl_tk_params &P, const npyl_tk_row &R,
                                   unsigned long long n, unsigned e, unsigned c)
{
    U v = U();
    unsigned long long si;
    if (source(P, R, e, &si)) {
        const size_t at = (size_t)n * P.in_elems + si;
        v = P.tables ? table_value<U>(P, R, ((const unsigned char *)P.src)[at])
                     : ((const U *)P.src)[at];
    }
    return negate(P, R, c) ? flip_sign<U>(v, P.signmask) : v;
}

template <typename T, int O>
__device__ __forceinline__ void convert_x(const npyl_tk_params &P)
{
    typedef typename In<T>::U U;
    const unsigned CS = P.C * P.S;
    for (unsigned long long n = blockIdx.y; n < P.rows; n += gridDim.y) {
        const npyl_tk_row R = P.rowinfo[n];
        const size_t base = (size_t)n * CS;
        for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < CS;
             o += gridDim.x * blockDim.x) {
            unsigned c, s;
            where(P, o, &c, &s);
            float x = In<T>::conv(fetch<U>(P, R, n, c * P.S + s, c), P.swap);
            put<O>(P.dst, base + o, arith(P, x, c));
        }
    }
}

template <typename U>
__device__ __forceinline__ void keep_x(const npyl_tk_params &P)
{
    const unsigned CS = P.C * P.S;
    for (unsigned long long n = blockIdx.y; n < P.rows; n += gridDim.y) {
        const npyl_tk_row R = P.rowinfo[n];
        const size_t base = (size_t)n * CS;
        for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < CS;
             o += gridDim.x * blockDim.x) {
            unsigned c, s;
            where(P, o, &c, &s);
            ((U *)P.dst)[base + o] = fetch<U>(P, R, n, c * P.S + s, c);
        }
    }
}

} // namespace

#define NPYL_TK(in, T)                                                         \
    extern "C" __global__ void npyl_tk_##in##_f4(const npyl_tk_params P)       \
    {                                                                          \
        convert<T, OUT_F4>(P);                                                 \
    }                                                                          \
    extern "C" __global__ void npyl_tk_##in##_f2(const npyl_tk_params P)       \
    {                                                                          \
        convert<T, OUT_F2>(P);                                                 \
    }                                                                          \
    extern "C" __global__ void npyl_tk_##in##_bf(const npyl_tk_params P)       \
    {                                                                          \
        convert<T, OUT_BF>(P);                                                 \
    }                                                                          \
    extern "C" __global__ void npyl_tkx_##in##_f4(const npyl_tk_params P)      \
    {                                                                          \
        convert_x<T, OUT_F4>(P);                                               \
    }                                                                          \
    extern "C" __global__ void npyl_tkx_##in##_f2(const npyl_tk_params P)      \
    {                                                                          \
        convert_x<T, OUT_F2>(P);                                               \
    }                                                                          \
    extern "C" __global__ void npyl_tkx_##in##_bf(const npyl_tk_params P)      \
    {                                                                          \
        convert_x<T, OUT_BF>(P);                                               \
    }

NPYL_TK(u1, uint8_t)
NPYL_TK(i1, int8_t)
NPYL_TK(u2, uint16_t)
NPYL_TK(i2, int16_t)
NPYL_TK(u4, uint32_t)
NPYL_TK(i4, int32_t)
NPYL_TK(u8, uint64_t)
NPYL_TK(i8, int64_t)
NPYL_TK(f2, __half)
NPYL_TK(f4, float)
NPYL_TK(f8, double)

#define NPYL_TP(sz, U)                                                         \
    extern "C" __global__ void npyl_tk_perm##sz(const npyl_tk_params P)        \
    {                                                                          \
        permute<U>(P);                                                         \
    }                                                                          \
    extern "C" __global__ void npyl_tkx_keep##sz(const npyl_tk_params P)       \
    {                                                                          \
        keep_x<U>(P);                                                          \
    }
NPYL_TP(1, uint8_t)
NPYL_TP(2, uint16_t)
NPYL_TP(4, uint32_t)
NPYL_TP(8, unsigned long long)
NPYL_TP(16, u128)
