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

template <typename T> struct In;
template <> struct In<uint8_t> {
    static __device__ float get(const void *p, size_t i, unsigned)
    {
        return __uint2float_rn(((const uint8_t *)p)[i]);
    }
};
template <> struct In<int8_t> {
    static __device__ float get(const void *p, size_t i, unsigned)
    {
        return __int2float_rn(((const int8_t *)p)[i]);
    }
};
template <> struct In<uint16_t> {
    static __device__ float get(const void *p, size_t i, unsigned sw)
    {
        uint16_t v = ((const uint16_t *)p)[i];
        return __uint2float_rn(sw ? bswap16(v) : v);
    }
};
template <> struct In<int16_t> {
    static __device__ float get(const void *p, size_t i, unsigned sw)
    {
        uint16_t v = ((const uint16_t *)p)[i];
        return __int2float_rn((int16_t)(sw ? bswap16(v) : v));
    }
};
template <> struct In<uint32_t> {
    static __device__ float get(const void *p, size_t i, unsigned sw)
    {
        uint32_t v = ((const uint32_t *)p)[i];
        return __uint2float_rn(sw ? bswap32(v) : v);
    }
};
template <> struct In<int32_t> {
    static __device__ float get(const void *p, size_t i, unsigned sw)
    {
        uint32_t v = ((const uint32_t *)p)[i];
        return __int2float_rn((int32_t)(sw ? bswap32(v) : v));
    }
};
template <> struct In<uint64_t> {
    static __device__ float get(const void *p, size_t i, unsigned sw)
    {
        uint64_t v = ((const uint64_t *)p)[i];
        return __ull2float_rn(sw ? bswap64(v) : v);
    }
};
template <> struct In<int64_t> {
    static __device__ float get(const void *p, size_t i, unsigned sw)
    {
        uint64_t v = ((const uint64_t *)p)[i];
        return __ll2float_rn((int64_t)(sw ? bswap64(v) : v));
    }
};
template <> struct In<__half> {
    static __device__ float get(const void *p, size_t i, unsigned sw)
    {
        uint16_t v = ((const uint16_t *)p)[i];
        return __half2float(__ushort_as_half(sw ? bswap16(v) : v));
    }
};
template <> struct In<float> {
    static __device__ float get(const void *p, size_t i, unsigned sw)
    {
        uint32_t v = ((const uint32_t *)p)[i];
        return __uint_as_float(sw ? bswap32(v) : v);
    }
};
template <> struct In<double> {
    static __device__ float get(const void *p, size_t i, unsigned sw)
    {
        uint64_t v = ((const uint64_t *)p)[i];
        return __double2float_rn(__longlong_as_double((long long)(sw ? bswap64(v) : v)));
    }
};

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

template <typename T, int O>
__device__ __forceinline__ void convert(const npyl_tk_params &P)
{
    const unsigned CS = P.C * P.S;
    for (unsigned long long n = blockIdx.y; n < P.rows; n += gridDim.y) {
        const size_t base = (size_t)n * CS;
        for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < CS;
             o += gridDim.x * blockDim.x) {
            unsigned c, s;
            if (P.channels_last) {
                s = o / P.C;
                c = o - s * P.C;
            } else {
                c = o / P.S;
                s = o - c * P.S;
            }
            float x = In<T>::get(P.src, base + (size_t)c * P.S + s, P.swap);
            if (P.arith == 1) {
                x = __fmul_rn(x, P.scale);
            } else if (P.arith == 2) {
                float m = P.per_channel ? P.mean[c] : P.mean1;
                float d = P.per_channel ? P.std[c] : P.std1;
                x = __fdiv_rn(__fsub_rn(__fmul_rn(x, P.scale), m), d);
            }
            put<O>(P.dst, base + o, x);
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
    }
NPYL_TP(1, uint8_t)
NPYL_TP(2, uint16_t)
NPYL_TP(4, uint32_t)
NPYL_TP(8, unsigned long long)
NPYL_TP(16, u128)
