/* The device transform engine: the host engine's math (lib/transform) run
 * on the GPU after the copy, by the kernels of
 * npyload_cuda_transform_kernels.cu: compiled ahead of time by nvcc and
 * embedded as a fatbin (NPYLOAD_CUDA_KERNELS AUTO/AOT with nvcc), or
 * compiled at run time from the embedded source by NVRTC
 * (npyload_cuda_nvrtc.h) when the build has no fatbin or the fatbin does
 * not cover the GPU. Either image is loaded by npyl_tdev_open and launched
 * through the handle's driver table (npyl_cuda_driver). It runs the plans
 * of lib/transform (npyl_tplan); lib/transform itself knows nothing of
 * CUDA. Built with NPYLOAD_CUDA_KERNELS=OFF there are no kernels, and
 * npyl_tdev_built() / npyl_tdev_plan_check() say so. */
#ifndef NPYLOAD_CUDA_TRANSFORM_H
#define NPYLOAD_CUDA_TRANSFORM_H

#include <stddef.h>

#include "../common/npyload_common.h"
#include "../transform/npyload_transform.h"
#include "npyload_cuda.h"
#include "npyload_cuda_transform_kparams.h"

/* Device transforms take mean/std as kernel parameters: at most this many
 * channels when the values differ per channel. */
#define NPYL_TDEV_MAX_CHANNELS 128

typedef struct npyl_tdev npyl_tdev;

/* 1 if this build has device kernels (a fatbin, or the source for NVRTC),
 * else 0 and why. */
NPYL_HIDDEN int npyl_tdev_built(char *why, size_t whylen);
/* 1 if this build embeds kernels compiled ahead of time (a fatbin), else 0
 * and why ("nvcc was not found when libnpyload was built ..."). */
NPYL_HIDDEN int npyl_tdev_aot_built(char *why, size_t whylen);
/* The architectures of the embedded fatbin: "sm_80 sm_90 compute_75"
 * (SASS for each sm_, PTX for each compute_, which the driver compiles for
 * any other GPU); "" without kernels. */
NPYL_HIDDEN const char *npyl_tdev_archs(void);

/* Checks that plan `p` can run on the device: kernels built, channel count
 * within NPYL_TDEV_MAX_CHANNELS when per channel (mean/std, flip signs),
 * an item size the kernels move when they move stored items (keep with
 * channels-last or augmentation: 1, 2, 4, 8 or 16 bytes). Returns 0,
 * NPYLOAD_ENOCUDA ("device transforms need the kernels built with the CUDA
 * toolkit ...") or NPYLOAD_EUNSUPPORTED, message naming `what` and saying
 * that the host engine has no such limit. No CUDA call. */
NPYL_HIDDEN int npyl_tdev_plan_check(const char *what, const npyl_tplan *p,
                                     char *err, size_t errlen);

/* Where the kernels come from (npyl_tdev_cfg.mode). */
enum {
    NPYL_TDEV_AUTO = 0,  /* the fatbin when it loads on the GPU, else NVRTC */
    NPYL_TDEV_AOT = 1,   /* the fatbin only */
    NPYL_TDEV_NVRTC = 2, /* NVRTC even when the build has a fatbin */
};
typedef struct npyl_tdev_cfg {
    int mode;              /* NPYL_TDEV_* */
    const char *nvrtc;     /* libnvrtc file or directory; NULL: the search
                              of npyl_nvrtc_default_where */
    const char *cache_dir; /* where NVRTC's images are kept; NULL: none */
} npyl_tdev_cfg;

/* Loads the kernels into the CUDA context current on the calling thread (the
 * runtime's primary context of `cuda`'s device, made current by
 * npyl_cuda_enter), through `cuda`'s driver table, which this loads on first
 * need: the embedded fatbin, or (cfg's mode, a fatbin that does not cover
 * the GPU: CUDA_ERROR_NO_BINARY_FOR_GPU, an unsupported PTX version) an
 * image NVRTC compiles for the GPU's architecture, from cfg's cache when it
 * is there. cfg may be NULL (AUTO, the default search, no cache). `cuda`
 * must outlive the engine. Returns 0, NPYLOAD_ENOCUDA (no kernels in this
 * build, no driver library, no NVRTC: the message names what to install)
 * or NPYLOAD_ECUDA with the reason in err. */
NPYL_HIDDEN int npyl_tdev_open(npyl_tdev **out, npyl_cuda *cuda,
                               const npyl_tdev_cfg *cfg, char *err, size_t errlen);
/* Where the loaded kernels came from: "ahead of time (embedded fatbin)",
 * "NVRTC 13.0 (/path/libnvrtc.so.13), sm_90 cubin", "cache /path/...". */
NPYL_HIDDEN const char *npyl_tdev_source(const npyl_tdev *d);
/* Queues the transform of `rows` samples from device memory dsrc (stored
 * layout) to ddst (output layout) on `stream` (a cudaStream_t of the same
 * context). Thread-safe. Returns 0, or NPYLOAD_ECUDA with err set. A plan
 * with augmentation needs npyl_tdev_run_x (NPYLOAD_EINVAL here). */
NPYL_HIDDEN int npyl_tdev_run(npyl_tdev *d, const npyl_tplan *p,
                              const void *dsrc, void *ddst, size_t rows,
                              void *stream, char *err, size_t errlen);

/* What a batch of an augmented or narrowed field adds (npyl_tdev_run_x):
 * per-row records (the row's augmentation decisions and value table) and,
 * narrowed, the value tables, both in device memory of the context. */
typedef npyl_tk_row npyl_tdev_row;
typedef struct npyl_tdev_extra {
    const npyl_tdev_row *rows; /* `rows` records */
    const void *tables;        /* narrowed: NPYL_TDEV_TABLE values of
                                  itemsize bytes per table, the field's
                                  values (the plan's input dtype); NULL:
                                  dsrc holds the values */
} npyl_tdev_extra;
#define NPYL_TDEV_TABLE NPYL_TK_TABLE

/* Row record of sample `index`: plan p's augmentation decisions
 * (npyl_aug_decide: the host engine's function, so both engines make the
 * same ones) and value table `table`. */
NPYL_HIDDEN void npyl_tdev_row_fill(const npyl_tplan *p, int64_t seed, uint64_t epoch,
                                    int64_t index, uint32_t table, npyl_tdev_row *out);
/* Like npyl_tdev_run, through the npyl_tkx_* kernels: each output element
 * is found through its row's record (crop window, flips, signs of
 * npyload.h's "Augmentation") and, with x->tables, dsrc holds one-byte
 * codes (the plan's stored elements, in_row_bytes / in_itemsize per row)
 * whose values are the row's table's entries, copied exactly. Then the
 * plan's dtype, arithmetic and layout as in npyl_tdev_run, fused in one
 * kernel. A plan that keeps the dtype runs too (the expansion alone, or the
 * augmentation of stored items). Returns 0, NPYLOAD_EINVAL (x or its rows
 * missing), NPYLOAD_EUNSUPPORTED or NPYLOAD_ECUDA with err set. */
NPYL_HIDDEN int npyl_tdev_run_x(npyl_tdev *d, const npyl_tplan *p, const npyl_tdev_extra *x,
                                const void *dsrc, void *ddst, size_t rows, void *stream,
                                char *err, size_t errlen);
/* Unloads the module (its context must still be alive). NULL-safe. */
NPYL_HIDDEN void npyl_tdev_close(npyl_tdev *d);

#endif
