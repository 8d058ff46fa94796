/* The CUDA names npyload_cuda_transform_kernels.cu uses, for the host: the
 * kernels compiled as plain C++ (force-included before the .cu by
 * tests/gpu/kernels_cpu.cpp's build) and run on the CPU, one "thread" at a
 * time, by kernels_cpu.cpp. Built with -ffp-contract=off and without
 * -ffast-math, so each _rn intrinsic is one correctly rounded IEEE float
 * operation, as on the GPU. Test scaffolding: not part of the library.
 *
 * With this header the .cu's own #include <cuda_fp16.h> / <cuda_bf16.h>
 * find this directory's stand-ins (put first on the include path). */
#ifndef NPYLOAD_KSHIM_H
#define NPYLOAD_KSHIM_H

#include <stdint.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

struct npyl_kshim_dim3 {
    unsigned x, y, z;
};
/* Set by the launcher (kernels_cpu.cpp) before each simulated thread.
 * initial-exec, as fake_cudart.c's device: the fake driver that holds them
 * is dlopened, and GCC 12's LeakSanitizer (glibc 2.36) crashed ("Tracer
 * caught signal 11") scanning a stale dynamic-TLS entry of the fake
 * runtime's general-dynamic variable; 48 bytes of the static TLS surplus
 * keep these out of the dynamic vector too. */
#define NPYL_KSHIM_TLS thread_local __attribute__((tls_model("initial-exec")))
extern NPYL_KSHIM_TLS npyl_kshim_dim3 blockIdx, threadIdx, gridDim, blockDim;

/* __byte_perm(x, y, s): byte i of the result is byte ((s >> 4i) & 7) of
 * the 8-byte value y:x (x the low half), as PTX prmt in its default mode. */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++)
        r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}

/* Integer and double to float: C's conversions round to nearest even (the
 * default rounding mode, never changed here), as the _rn intrinsics do. */
static inline float __uint2float_rn(unsigned v) { return (float)v; }
static inline float __int2float_rn(int v) { return (float)v; }
static inline float __ull2float_rn(unsigned long long v) { return (float)v; }
static inline float __ll2float_rn(long long v) { return (float)v; }
static inline float __double2float_rn(double v) { return (float)v; }

/* One IEEE operation each (-ffp-contract=off: never fused). */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }

static inline float __uint_as_float(unsigned v)
{
    float f;
    memcpy(&f, &v, 4);
    return f;
}
static inline unsigned __float_as_uint(float f)
{
    unsigned v;
    memcpy(&v, &f, 4);
    return v;
}
static inline double __longlong_as_double(long long v)
{
    double d;
    memcpy(&d, &v, 8);
    return d;
}

#endif
