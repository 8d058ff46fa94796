/* What npyload_cuda_transform_kernels.cu takes from <stdint.h>,
 * <cuda_fp16.h> and <cuda_bf16.h>, for NVRTC (__CUDACC_RTC__), which has
 * none of those headers when it comes from the nvidia-cuda-nvrtc wheel (the
 * wheel ships libnvrtc alone; the toolkit's headers are not on a user's
 * machine). nvcc builds include the real headers instead. Only the handful
 * of names the kernels use, each one instruction of PTX, so the numbers are
 * the hardware's, as with the toolkit's headers:
 *   cvt.f32.f16 (exact), cvt.rn.f16.f32 (round to nearest even),
 *   cvt.rn.bf16.f32 (RNE, sm_80+); below sm_80 the same rounding in integer
 *   arithmetic, as cuda_bf16.hpp does there (NaN -> the canonical 0x7fff).
 * Embedded in libnpyload beside the kernels (npyload_cuda_transform_kernels.cmake)
 * and handed to NVRTC as a header by npyload_cuda_nvrtc.c. */
#ifndef NPYLOAD_CUDA_TRANSFORM_RTC_H
#define NPYLOAD_CUDA_TRANSFORM_RTC_H

typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef unsigned long size_t;

struct __align__(2) __half {
    unsigned short x;
};
struct __align__(2) __nv_bfloat16 {
    unsigned short x;
};

__device__ __forceinline__ __half __ushort_as_half(unsigned short v)
{
    __half h;
    h.x = v;
    return h;
}
__device__ __forceinline__ float __half2float(__half h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.x));
    return f;
}
__device__ __forceinline__ __half __float2half_rn(float f)
{
    __half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.x) : "f"(f));
    return h;
}
__device__ __forceinline__ __nv_bfloat16 __float2bfloat16_rn(float f)
{
    __nv_bfloat16 b;
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.x) : "f"(f));
#else
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        b.x = 0x7fff;
    else
        b.x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
    return b;
}

#endif
