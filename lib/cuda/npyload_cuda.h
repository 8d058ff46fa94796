/* The CUDA runtime, loaded at run time with dlopen so that host-only users
 * need no CUDA library and the build needs no CUDA toolkit. Depends on
 * lib/common only. Each npyl_cuda is its own handle (dlopen is reference
 * counted by the dynamic loader): no global state.
 *
 * Types are opaque pointers: a stream is a cudaStream_t, an event a
 * cudaEvent_t. Every function returns 0 or NPYLOAD_ECUDA (with the runtime's
 * error string in the handle's message, npyl_cuda_errmsg). */
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

#endif
