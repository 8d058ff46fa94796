/* Stand-in for the toolkit's cuda_fp16.h in the CPU build of the kernels
 * (kshim.h): __half and the two conversions the kernels use, on the CPU's
 * own half-precision hardware (x86-64: F16C's vcvtph2ps / vcvtps2ph with
 * round to nearest even; elsewhere the compiler's _Float16), so the
 * comparison with lib/transform's float16 code is with an independent
 * implementation. */
#ifndef NPYLOAD_KSHIM_CUDA_FP16_H
#define NPYLOAD_KSHIM_CUDA_FP16_H

#include <string.h>

struct __half {
    unsigned short x;
};

static inline __half __ushort_as_half(unsigned short v)
{
    __half h;
    h.x = v;
    return h;
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("f16c"))) static inline float __half2float(__half h)
{
    return _cvtsh_ss(h.x);
}
__attribute__((target("f16c"))) static inline __half __float2half_rn(float f)
{
    __half h;
    h.x = (unsigned short)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return h;
}
#else
static inline float __half2float(__half h)
{
    _Float16 v;
    memcpy(&v, &h.x, 2);
    return (float)v;
}
static inline __half __float2half_rn(float f)
{
    _Float16 v = (_Float16)f;
    __half h;
    memcpy(&h.x, &v, 2);
    return h;
}
#endif

#endif
