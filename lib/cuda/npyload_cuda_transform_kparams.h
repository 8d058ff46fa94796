/* The kernels' one parameter, shared by npyload_cuda_transform_kernels.cu
 * and the launcher (npyload_cuda_transform.c): plain C, the same layout on both
 * sides (LP64, natural alignment). Passed by value (under the 4 KiB kernel
 * parameter limit). */
#ifndef NPYLOAD_CUDA_TRANSFORM_KPARAMS_H
#define NPYLOAD_CUDA_TRANSFORM_KPARAMS_H

#define NPYL_TK_MAXC 128 /* = NPYL_TDEV_MAX_CHANNELS */

typedef struct npyl_tk_params {
    const void *src;             /* rows x (C x S) items, stored layout */
    void *dst;                   /* rows x (C x S) items, output layout */
    unsigned long long rows;
    unsigned int C, S;           /* C * S < 2^32 (checked at plan time) */
    unsigned int channels_last;
    unsigned int swap;           /* load in the other byte order */
    int arith;                   /* 0 none, 1 x*scale, 2 (x*scale-m)/s */
    int per_channel;
    float scale, mean1, std1;
    float mean[NPYL_TK_MAXC];
    float std[NPYL_TK_MAXC];
} npyl_tk_params;

#endif
