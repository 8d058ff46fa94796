/* CUDA, loaded at run time with dlopen so that host-only users need no CUDA
 * library and the build needs no CUDA toolkit. This module is the only place
 * in lib/ that calls dlopen (lib/CMakeLists.txt checks it at configure time).
 * Each npyl_cuda is its own handle (dlopen is reference counted by the
 * dynamic loader): no global state. A handle holds two tables of entry
 * points, each filled in one function:
 *  - the runtime (libcudart), loaded by npyl_cuda_open: memory, streams,
 *    events, copies (the functions below);
 *  - the driver API (libcuda.so.1), loaded on first need by
 *    npyl_cuda_driver: modules and kernel launches, for the device
 *    transforms (npyload_cuda_transform.h) and the bench's busy kernel.
 *
 * Types are opaque pointers: a stream is a cudaStream_t, an event a
 * cudaEvent_t. Every runtime function returns 0 or NPYLOAD_ECUDA (with the
 * runtime's error string in the handle's message, npyl_cuda_errmsg). */
#ifndef NPYLOAD_CUDA_H
#define NPYLOAD_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "../common/npyload_common.h"

typedef struct npyl_cuda npyl_cuda;

/* Loads the runtime (libcudart.so.13, .12, .11.0, then libcudart.so; a
 * runtime too new for the installed driver is skipped for an older one),
 * checks that a driver answers and that `device` exists, and makes it current
 * on the calling thread. Returns 0, NPYLOAD_EINVAL for device < 0, or
 * NPYLOAD_ENOCUDA with the reason in why (may be NULL):
 *   "no CUDA runtime library (libcudart) found: tried libcudart.so.13, ..."
 *   "no CUDA driver (libcuda.so not found or not loadable; ...)"
 *   "no CUDA device (driver 12.4 answers but reports no device; ...)"
 *   "device 3 out of range (2 devices)"
 *   "no CUDA runtime usable with the installed driver: ..."
 * The handle may be used from any thread; see npyl_cuda_bind_thread.
 * Note that this changes the calling thread's current device; when that is a
 * user's thread, the work after open may be wrapped in npyl_cuda_enter/leave
 * instead of relying on it. (npyload_cuda_available() only counts devices:
 * it sets no device and creates no context.) */
NPYL_HIDDEN int npyl_cuda_open(npyl_cuda **out, int device, char *why,
                               size_t whylen);
/* The same, trying the `n` given sonames in order instead of the default list
 * (n = 0 or sonames = NULL: the default list). Tests use it to reach the
 * "no runtime library" path on a machine that has one. */
NPYL_HIDDEN int npyl_cuda_open_sonames(npyl_cuda **out, int device,
                                       const char *const *sonames, size_t n,
                                       char *why, size_t whylen);
/* What the runtime search finds on this machine, for
 * npyload_get_build_info(): the runtime that loads (the one open() would
 * use), its file, its version and the driver's, and the devices it counts.
 * Like npyload_cuda_available() it sets no current device and creates no
 * context (counting devices initialises the driver). Never fails: without
 * a runtime, found is 0 and why says what was tried. */
typedef struct npyl_cuda_facts {
    int found;            /* a libcudart loaded with every entry point */
    int devices;          /* devices the runtime counts; 0 when unusable */
    int runtime_version;  /* 12040 for 12.4; 0 when not found */
    int driver_version;   /* 0 when no driver answers */
    char soname[32];      /* "libcudart.so.12" */
    char path[256];       /* the file the dynamic loader mapped */
    char why[512];        /* why CUDA is not usable; "" when devices > 0 */
} npyl_cuda_facts;
NPYL_HIDDEN void npyl_cuda_probe_facts(npyl_cuda_facts *out);
/* NULL-safe. The caller must have destroyed every stream and event and freed
 * every buffer of the handle first (the runtime stays mapped: RTLD_NODELETE). */
NPYL_HIDDEN void npyl_cuda_close(npyl_cuda *c);
/* The last failure on the handle: "cudaMemcpyAsync(device 0x.. <- host 0x..,
 * 4096 bytes, stream 0x..) on device 0: invalid argument (CUDA error 1)".
 * Written under a lock; if several threads may fail at once, read it with
 * npyl_cuda_errmsg_copy (this pointer's content may change under you). */
NPYL_HIDDEN const char *npyl_cuda_errmsg(const npyl_cuda *c);
NPYL_HIDDEN int npyl_cuda_errmsg_copy(npyl_cuda *c, char *buf, size_t len);
NPYL_HIDDEN int npyl_cuda_device(const npyl_cuda *c);
/* The soname that loaded, e.g. "libcudart.so.12" (for logs and stats). */
NPYL_HIDDEN const char *npyl_cuda_soname(const npyl_cuda *c);
/* The file the runtime was loaded from ("/usr/local/cuda/lib64/libcudart.so.13"),
 * or its soname when the dynamic loader does not say. */
NPYL_HIDDEN void npyl_cuda_runtime_path(const npyl_cuda *c, char *buf, size_t len);

/* Appends printf-style text to a reason being built in why[whylen]
 * (NUL-terminated; a full buffer stays as it is). NULL-safe. */
NPYL_HIDDEN void npyl_cuda_why_append(char *why, size_t whylen, const char *fmt, ...)
    NPYL_PRINTF(3, 4);

/* Makes the handle's device current on the calling thread. The current device
 * is per thread in CUDA: open() sets it only on the thread that called open.
 * Every other thread (each worker, a copy thread, the consumer thread of
 * next() if it is not the opener) must call this once before its first
 * allocation, stream, event or copy through the handle; otherwise the call
 * silently acts on device 0. */
NPYL_HIDDEN int npyl_cuda_bind_thread(npyl_cuda *c);

/* For work done on a thread the library does not own (the user's thread in
 * start, destroy, release, batch_sync...): makes the handle's device current
 * and stores the thread's previous device in *prev; npyl_cuda_leave(c, prev)
 * puts it back, so the library never changes the user's current device
 * behind their back. Returns 0 or NPYLOAD_ECUDA (then nothing to leave). */
NPYL_HIDDEN int npyl_cuda_enter(npyl_cuda *c, int *prev);
NPYL_HIDDEN void npyl_cuda_leave(npyl_cuda *c, int prev);

/* Pinned (page-locked, cudaHostAllocPortable) host memory; cudaFreeHost.
 * host_free, free, stream_destroy and event_destroy accept NULL. */
NPYL_HIDDEN int npyl_cuda_host_alloc(npyl_cuda *c, void **p, size_t n);
NPYL_HIDDEN int npyl_cuda_host_free(npyl_cuda *c, void *p);
NPYL_HIDDEN int npyl_cuda_malloc(npyl_cuda *c, void **p, size_t n);
NPYL_HIDDEN int npyl_cuda_free(npyl_cuda *c, void *p);
/* Makes the current device's primary context exist now (cudaFree(NULL)):
 * the runtime creates it lazily, and the driver API (the transform
 * kernels' module) needs it current. Returns 0 or NPYLOAD_ECUDA. */
NPYL_HIDDEN int npyl_cuda_init_context(npyl_cuda *c);
/* Non-blocking stream (cudaStreamNonBlocking). */
NPYL_HIDDEN int npyl_cuda_stream_create(npyl_cuda *c, void **s);
NPYL_HIDDEN int npyl_cuda_stream_destroy(npyl_cuda *c, void *s);
NPYL_HIDDEN int npyl_cuda_stream_sync(npyl_cuda *c, void *s);
/* Events are created on the current device of the calling thread.
 * timing = 0 creates the event with cudaEventDisableTiming. */
NPYL_HIDDEN int npyl_cuda_event_create(npyl_cuda *c, void **e, int timing);
NPYL_HIDDEN int npyl_cuda_event_destroy(npyl_cuda *c, void *e);
NPYL_HIDDEN int npyl_cuda_event_record(npyl_cuda *c, void *e, void *s);
NPYL_HIDDEN int npyl_cuda_event_sync(npyl_cuda *c, void *e);
/* 1 if complete, 0 if pending, or NPYLOAD_ECUDA. */
NPYL_HIDDEN int npyl_cuda_event_query(npyl_cuda *c, void *e);
NPYL_HIDDEN int npyl_cuda_event_elapsed_ms(npyl_cuda *c, float *ms, void *start,
                                           void *end);
/* cudaStreamWaitEvent(s, e, 0): work queued on s after this waits for the
 * work captured by e's last record, on the device, without a host wait. */
NPYL_HIDDEN int npyl_cuda_stream_wait_event(npyl_cuda *c, void *s, void *e);
/* cudaMemcpyAsync host-to-device on stream s. `src` must be pinned
 * (npyl_cuda_host_alloc) for the copy to be asynchronous; from pageable
 * memory the runtime stages it and returns only once src may be reused. */
NPYL_HIDDEN int npyl_cuda_memcpy_h2d_async(npyl_cuda *c, void *dst,
                                           const void *src, size_t n, void *s);
/* Synchronous device-to-host copy (tests and tools). */
NPYL_HIDDEN int npyl_cuda_memcpy_d2h(npyl_cuda *c, void *dst, const void *src,
                                     size_t n);

/* ---- the driver API (libcuda.so.1) ----
 *
 * The runtime works on the device's primary context and makes it current,
 * so a cudaStream_t is a valid CUstream for the driver calls below. CUresult
 * is an enum (int); CUmodule, CUfunction and CUstream are opaque pointers.
 * The pointer types are named after the driver (npyl_cu_*_fn), apart from
 * the runtime's (cudart_*_fn, private to npyload_cuda.c): both APIs have a
 * "get error string", with different signatures. */
typedef int (*npyl_cu_module_load_data_fn)(void **module, const void *image);
typedef int (*npyl_cu_module_unload_fn)(void *module);
typedef int (*npyl_cu_module_get_function_fn)(void **function, void *module,
                                              const char *name);
typedef int (*npyl_cu_launch_kernel_fn)(void *function, unsigned grid_x,
                                        unsigned grid_y, unsigned grid_z,
                                        unsigned block_x, unsigned block_y,
                                        unsigned block_z, unsigned shared_bytes,
                                        void *stream, void **params,
                                        void **extra);
typedef int (*npyl_cu_get_error_string_fn)(int result, const char **str);
typedef int (*npyl_cu_ctx_get_device_fn)(int *device);
typedef int (*npyl_cu_device_get_attribute_fn)(int *value, int attribute, int device);
/* CUdevice_attribute values used. */
#define NPYL_CU_CC_MAJOR 75 /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
#define NPYL_CU_CC_MINOR 76 /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR */

/* Every driver entry point npyload uses, all present once loaded. */
typedef struct npyl_cudrv {
    npyl_cu_module_load_data_fn module_load_data;         /* cuModuleLoadData */
    npyl_cu_module_unload_fn module_unload;               /* cuModuleUnload */
    npyl_cu_module_get_function_fn module_get_function;   /* cuModuleGetFunction */
    npyl_cu_launch_kernel_fn launch_kernel;               /* cuLaunchKernel */
    npyl_cu_get_error_string_fn get_error_string;         /* cuGetErrorString */
    npyl_cu_ctx_get_device_fn ctx_get_device;             /* cuCtxGetDevice */
    npyl_cu_device_get_attribute_fn device_get_attribute; /* cuDeviceGetAttribute */
} npyl_cudrv;

/* The driver table of handle `c`. The first call loads libcuda.so.1 and
 * looks up every entry point, under the handle's lock; every later call
 * (any thread) returns the same table, or the same failure without trying
 * again. Host-only work and the device copy never call it, so they never
 * need the driver library. Returns 0 with *out valid until
 * npyl_cuda_close(c), NPYLOAD_EINVAL (c or out NULL) or NPYLOAD_ENOCUDA with
 * the reason in why (may be NULL):
 *   "CUDA driver API (libcuda.so.1) not loadable: libcuda.so.1: cannot open
 *    shared object file: No such file or directory"
 *   "CUDA driver API (libcuda.so.1) not loadable: it has no cuLaunchKernel" */
NPYL_HIDDEN int npyl_cuda_driver(npyl_cuda *c, const npyl_cudrv **out,
                                 char *why, size_t whylen);
/* The driver's description of `result` ("invalid device context"), never
 * NULL. */
NPYL_HIDDEN const char *npyl_cudrv_strerror(const npyl_cudrv *d, int result);

#endif
