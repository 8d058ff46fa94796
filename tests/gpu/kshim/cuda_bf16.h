/* Stand-in for the toolkit's cuda_bf16.h in the CPU build of the kernels
 * (kshim.h): __nv_bfloat16 and __float2bfloat16_rn, rounded to nearest
 * even in integer arithmetic as cuda_bf16.hpp does below sm_80 (NaN ->
 * 0x7fff), not with lib/transform's code. */
#ifndef NPYLOAD_KSHIM_CUDA_BF16_H
#define NPYLOAD_KSHIM_CUDA_BF16_H

#include <string.h>

struct __nv_bfloat16 {
    unsigned short x;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        b.x = 0x7fff;
    else
        b.x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return b;
}

#endif
