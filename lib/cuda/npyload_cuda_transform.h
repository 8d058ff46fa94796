/* The device transform engine: the host engine's math (lib/transform) run
 * on the GPU after the copy, by kernels that nvcc compiled at build time
 * (npyload_cuda_transform_kernels.cu, embedded as a fatbin) and that are
 * loaded and launched through the handle's driver table (npyl_cuda_driver).
 * It runs the plans of lib/transform (npyl_tplan); lib/transform itself
 * knows nothing of CUDA. Without nvcc at build time there is no fatbin, and
 * npyl_tdev_built() / npyl_tdev_plan_check() say so. */
#ifndef NPYLOAD_CUDA_TRANSFORM_H
#define NPYLOAD_CUDA_TRANSFORM_H

#include <stddef.h>

#include "../common/npyload_common.h"
#include "../transform/npyload_transform.h"
#include "npyload_cuda.h"

/* Device transforms take mean/std as kernel parameters: at most this many
 * channels when the values differ per channel. */
#define NPYL_TDEV_MAX_CHANNELS 128

typedef struct npyl_tdev npyl_tdev;

/* 1 if this build embeds the kernels (nvcc was found), else 0 and why. */
NPYL_HIDDEN int npyl_tdev_built(char *why, size_t whylen);
/* The architectures of the embedded fatbin: "sm_80 sm_90 compute_75"
 * (SASS for each sm_, PTX for each compute_, which the driver compiles for
 * any other GPU); "" without kernels. */
NPYL_HIDDEN const char *npyl_tdev_archs(void);

/* Checks that plan `p` can run on the device: kernels built, channel count
 * within NPYL_TDEV_MAX_CHANNELS when per channel. Returns 0, NPYLOAD_ENOCUDA
 * ("device transforms need the kernels built with the CUDA toolkit ...") or
 * NPYLOAD_EUNSUPPORTED, message naming `what`. No CUDA call. */
NPYL_HIDDEN int npyl_tdev_plan_check(const char *what, const npyl_tplan *p,
                                     char *err, size_t errlen);

/* Loads the kernels into the CUDA context current on the calling thread (the
 * runtime's primary context of `cuda`'s device, made current by
 * npyl_cuda_enter), through `cuda`'s driver table, which this loads on first
 * need. `cuda` must outlive the engine. Returns 0, NPYLOAD_ENOCUDA (no
 * kernels in this build, no driver library) or NPYLOAD_ECUDA with the reason
 * in err. */
NPYL_HIDDEN int npyl_tdev_open(npyl_tdev **out, npyl_cuda *cuda, char *err,
                               size_t errlen);
/* Queues the transform of `rows` samples from device memory dsrc (stored
 * layout) to ddst (output layout) on `stream` (a cudaStream_t of the same
 * context). Thread-safe. Returns 0, or NPYLOAD_ECUDA with err set. */
NPYL_HIDDEN int npyl_tdev_run(npyl_tdev *d, const npyl_tplan *p,
                              const void *dsrc, void *ddst, size_t rows,
                              void *stream, char *err, size_t errlen);
/* Unloads the module (its context must still be alive). NULL-safe. */
NPYL_HIDDEN void npyl_tdev_close(npyl_tdev *d);

#endif
