/* Private to lib/transform: the loops shared by npyload_transform.c and
 * npyload_transform_f16.c. */
#ifndef NPYLOAD_TRANSFORM_IMPL_H
#define NPYLOAD_TRANSFORM_IMPL_H

#include "npyload_transform.h"

NPYL_HIDDEN void npyl_tstore_f16(const float *restrict src, size_t n,
                                 void *restrict dst);
NPYL_HIDDEN void npyl_tstore_bf16(const float *restrict src, size_t n,
                                  void *restrict dst);
NPYL_HIDDEN void npyl_tload_f16(const void *restrict src, size_t n,
                                float *restrict dst);
NPYL_HIDDEN void npyl_tload_f16_swap(const void *restrict src, size_t n,
                                     float *restrict dst);
/* If the CPU has F16C (and AVX state), stores its float16 load/store loops
 * in *load / *store (either may be NULL) and returns 1; else returns 0. */
NPYL_HIDDEN int npyl_tf16c_pick(npyl_tload_fn *load, npyl_tstore_fn *store);

#endif
