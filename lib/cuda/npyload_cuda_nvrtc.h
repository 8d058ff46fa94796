/* NVRTC, the CUDA run-time compiler, loaded with dlopen (this module is the
 * only place in lib/ that loads libraries): it compiles the device
 * transform kernels' embedded source (npyload_cuda_transform_kernels.cu and
 * the two headers it includes under NVRTC, embedded as text by
 * npyload_cuda_transform_kernels.cmake) for the GPU at hand, when the build
 * has no ahead-of-time image for it (NPYLOAD_CUDA_KERNELS=NVRTC, a build
 * without nvcc such as a pip-built wheel, or a GPU that the fatbin does not
 * cover). The image it makes is loaded by the same loader as the fatbin
 * (npyl_tdev_open, cuModuleLoadData).
 *
 * Where libnvrtc is looked for (npyl_nvrtc_where), in this order:
 *  1. the override alone when one is given (a file, or a directory holding
 *     libnvrtc.so.N): the caller's choice (C: npyload_loader_set_path with
 *     NPYLOAD_PATH_NVRTC; Python: the NPYLOAD_NVRTC environment variable);
 *  2. `dirs`: the directory the CUDA runtime was loaded from (the toolkit's
 *     lib64, or the wheel directory nvidia/cu13/lib of a CUDA 13 torch);
 *  3. `roots`: directories that hold Python packages (site-packages):
 *     ROOT/nvidia/cu13/lib (the nvidia-cuda-nvrtc wheel for CUDA 13) and
 *     ROOT/nvidia/cuda_nvrtc/lib (nvidia-cuda-nvrtc-cu12); the defaults are
 *     the one holding this library (the Python extension lives in
 *     site-packages/npyload/) and the one above the runtime's wheel;
 *  4. unless no_system: the dynamic loader's own search (ld.so.cache,
 *     LD_LIBRARY_PATH), then /usr/local/cuda/lib64, /usr/local/cuda-*\/lib64
 *     (newest first), /opt/cuda/lib64.
 * The library reads no environment variable: the override comes from the
 * caller.
 *
 * Compiled images can be kept in a cache directory (given by the caller;
 * Python's default is ~/.cache/npyload/kernels): one file per source
 * version and GPU architecture, written atomically (a temporary file
 * renamed), so that a process other than the first needs no NVRTC.
 *
 * Handles hold their own dlopen handles: no global state; a handle may be
 * used by one thread at a time. */
#ifndef NPYLOAD_CUDA_NVRTC_H
#define NPYLOAD_CUDA_NVRTC_H

#include <stddef.h>

#include "../common/npyload_common.h"

/* What the message of a missing NVRTC tells the user to install. */
#define NPYL_NVRTC_INSTALL                                                     \
    "install NVRTC with `pip install nvidia-cuda-nvrtc` (CUDA 13; "            \
    "nvidia-cuda-nvrtc-cu12 for CUDA 12) or the CUDA toolkit, or give its "    \
    "path (Python: NPYLOAD_NVRTC=/path/to/libnvrtc.so; C: "                    \
    "npyload_loader_set_path(L, NPYLOAD_PATH_NVRTC, path))"

typedef struct npyl_nvrtc_where {
    const char *override;      /* file or directory; set: the only place */
    const char *const *dirs;   /* directories that may hold libnvrtc.so.N */
    size_t ndirs;
    const char *const *roots;  /* site-packages-like directories */
    size_t nroots;
    int no_system;             /* 1: skip step 4 (tests) */
} npyl_nvrtc_where;

/* The product's search: `override` (may be NULL or "") and the places
 * derived from the CUDA runtime's file `cudart_path` (may be NULL or "")
 * and from this library's own file. The strings live in `p`. */
typedef struct npyl_nvrtc_places {
    char dirs[1][512];
    char roots[2][512];
    const char *dirp[1];
    const char *rootp[2];
    npyl_nvrtc_where where;
} npyl_nvrtc_places;
NPYL_HIDDEN const npyl_nvrtc_where *npyl_nvrtc_default_where(npyl_nvrtc_places *p,
                                                             const char *override,
                                                             const char *cudart_path);

typedef struct npyl_nvrtc npyl_nvrtc;

/* Finds and loads libnvrtc (and the libnvrtc-builtins beside it, which
 * NVRTC itself looks up only through the dynamic loader's path). Returns 0,
 * NPYLOAD_EINVAL, or NPYLOAD_ENOCUDA with why = "NVRTC (libnvrtc) not
 * found: tried DIRS...; " NPYL_NVRTC_INSTALL, or the file that failed to
 * load and the loader's reason. */
NPYL_HIDDEN int npyl_nvrtc_open(npyl_nvrtc **out, const npyl_nvrtc_where *w,
                                char *why, size_t whylen);
/* NULL-safe. */
NPYL_HIDDEN void npyl_nvrtc_close(npyl_nvrtc *n);
/* The file that loaded (the dynamic loader's name for it). */
NPYL_HIDDEN const char *npyl_nvrtc_path(const npyl_nvrtc *n);
/* NVRTC's version as CUDA writes it: 13000 for 13.0. */
NPYL_HIDDEN int npyl_nvrtc_version(const npyl_nvrtc *n);

/* 1 if this build embeds the kernels' source (NPYLOAD_CUDA_KERNELS is not
 * OFF), else 0 and why. */
NPYL_HIDDEN int npyl_nvrtc_source_built(char *why, size_t whylen);

/* A compiled image: data (NUL-terminated when PTX) is malloc'd. */
typedef struct npyl_kimage {
    void *data;
    size_t len;
    int ptx;           /* 1: PTX (the driver compiles it), 0: a cubin */
    int arch;          /* 80 for sm_80: what it was compiled for */
    int cached;        /* 1: read from the cache directory */
    char from[384];    /* "NVRTC 13.0 (/path/libnvrtc.so.13), sm_80 cubin",
                          "cache /home/u/.cache/npyload/kernels/..." */
} npyl_kimage;
NPYL_HIDDEN void npyl_kimage_free(npyl_kimage *k);

/* Compiles the embedded kernels for compute capability `arch` (80 = 8.0):
 * ptx = 0 a cubin for sm_<arch>, ptx = 1 PTX for compute_<arch>. A GPU
 * newer than this NVRTC knows gets PTX for the newest architecture it
 * knows (the driver compiles it). Returns 0, NPYLOAD_ENOCUDA (no source in
 * this build) or NPYLOAD_ECUDA with NVRTC's log in err. */
NPYL_HIDDEN int npyl_nvrtc_compile(npyl_nvrtc *n, int arch, int ptx,
                                   npyl_kimage *out, char *err, size_t errlen);

/* The whole run-time path: the image for `arch` from `cache_dir` (may be
 * NULL: no cache; skip_cache = 1: compile even when the cache has it, and
 * replace it), else NVRTC found through `w`, compiled, and stored in the
 * cache (a cache that cannot be written is not an error). Returns as
 * npyl_nvrtc_open and npyl_nvrtc_compile. */
NPYL_HIDDEN int npyl_nvrtc_kernels(const npyl_nvrtc_where *w, const char *cache_dir,
                                   int skip_cache, int arch, npyl_kimage *out,
                                   char *err, size_t errlen);

#endif
