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

/* Loads the runtime (libcudart.so.13, .12, .11, then libcudart.so), checks
 * that a driver answers and that `device` exists, and makes it current on the
 * calling thread. Returns 0 or NPYLOAD_ENOCUDA with the reason in why: "no
 * CUDA runtime library (libcudart) found", "no CUDA driver", "no CUDA device",
 * "device 3 out of range (2 devices)". */
NPYL_HIDDEN int npyl_cuda_open(npyl_cuda **out, int device, char *why,
                               size_t whylen);
NPYL_HIDDEN void npyl_cuda_close(npyl_cuda *c);
NPYL_HIDDEN const char *npyl_cuda_errmsg(const npyl_cuda *c);
NPYL_HIDDEN int npyl_cuda_device(const npyl_cuda *c);

/* Makes the handle's device current on the calling thread (worker threads
 * call this once). */
NPYL_HIDDEN int npyl_cuda_bind_thread(npyl_cuda *c);

NPYL_HIDDEN int npyl_cuda_host_alloc(npyl_cuda *c, void **p, size_t n);
NPYL_HIDDEN int npyl_cuda_host_free(npyl_cuda *c, void *p);
NPYL_HIDDEN int npyl_cuda_malloc(npyl_cuda *c, void **p, size_t n);
NPYL_HIDDEN int npyl_cuda_free(npyl_cuda *c, void *p);
/* Non-blocking stream (cudaStreamNonBlocking). */
NPYL_HIDDEN int npyl_cuda_stream_create(npyl_cuda *c, void **s);
NPYL_HIDDEN int npyl_cuda_stream_destroy(npyl_cuda *c, void *s);
NPYL_HIDDEN int npyl_cuda_stream_sync(npyl_cuda *c, void *s);
/* timing = 0 creates the event with cudaEventDisableTiming. */
NPYL_HIDDEN int npyl_cuda_event_create(npyl_cuda *c, void **e, int timing);
NPYL_HIDDEN int npyl_cuda_event_destroy(npyl_cuda *c, void *e);
NPYL_HIDDEN int npyl_cuda_event_record(npyl_cuda *c, void *e, void *s);
NPYL_HIDDEN int npyl_cuda_event_sync(npyl_cuda *c, void *e);
/* 1 if complete, 0 if pending, or NPYLOAD_ECUDA. */
NPYL_HIDDEN int npyl_cuda_event_query(npyl_cuda *c, void *e);
NPYL_HIDDEN int npyl_cuda_event_elapsed_ms(npyl_cuda *c, float *ms, void *start,
                                           void *end);
NPYL_HIDDEN int npyl_cuda_stream_wait_event(npyl_cuda *c, void *s, void *e);
NPYL_HIDDEN int npyl_cuda_memcpy_h2d_async(npyl_cuda *c, void *dst,
                                           const void *src, size_t n, void *s);
/* Synchronous device-to-host copy (tests and tools). */
NPYL_HIDDEN int npyl_cuda_memcpy_d2h(npyl_cuda *c, void *dst, const void *src,
                                     size_t n);

#endif
