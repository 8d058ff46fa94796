/* A fake CUDA runtime for CPU-only tests of lib/cuda and the loader's device
 * path. Built as a shared library whose SONAME is libcudart.so.13: a test
 * dlopens it by path first, and lib/cuda's open (which prefers a runtime the
 * process already has, RTLD_NOLOAD by soname) then picks it up instead of
 * the real one. Criterion forks every test, so the fake never leaks into
 * another test's process.
 *
 * Semantics: one device; "device" memory is host memory; every copy is done
 * at once (so every event is complete as soon as it is recorded); streams
 * and events are small heap objects. What it adds over a real runtime is
 * control: call counters, and failures injected on demand through the
 * struct returned by fake_cudart_control() (look it up with dlsym).
 *
 * Test scaffolding: process-wide state is fine here, not in lib/. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cudart.h"

static fake_cudart g_fake;
static _Thread_local int t_device;

fake_cudart *fake_cudart_control(void) { return &g_fake; }

#define FAIL_CODE 999 /* cudaErrorUnknown */
#define COUNT(name) atomic_fetch_add(&g_fake.name, 1)

int cudaGetDeviceCount(int *n)
{
    *n = 1;
    return 0;
}

int cudaSetDevice(int d)
{
    COUNT(n_set_device);
    if (atomic_load(&g_fake.fail_set_device))
        return FAIL_CODE;
    if (d != 0)
        return 101; /* cudaErrorInvalidDevice */
    t_device = d;
    return 0;
}

int cudaGetDevice(int *d)
{
    COUNT(n_get_device);
    if (atomic_load(&g_fake.fail_get_device))
        return FAIL_CODE;
    *d = t_device;
    return 0;
}

const char *cudaGetErrorString(int e)
{
    return e == FAIL_CODE ? "fake runtime: injected failure" : "fake runtime error";
}

int cudaHostAlloc(void **p, size_t n, unsigned flags)
{
    (void)flags;
    return posix_memalign(p, 4096, n ? n : 1) == 0 ? 0 : 2; /* MemoryAllocation */
}

int cudaFreeHost(void *p)
{
    free(p);
    return 0;
}

int cudaMalloc(void **p, size_t n)
{
    return posix_memalign(p, 256, n ? n : 1) == 0 ? 0 : 2;
}

int cudaFree(void *p)
{
    free(p);
    return 0;
}

struct fake_stream { int unused; };
struct fake_event { int recorded; };

int cudaStreamCreateWithFlags(void **s, unsigned flags)
{
    (void)flags;
    *s = calloc(1, sizeof(struct fake_stream));
    return *s ? 0 : 2;
}

int cudaStreamDestroy(void *s)
{
    free(s);
    return 0;
}

int cudaStreamSynchronize(void *s)
{
    COUNT(n_stream_sync);
    if (s && s == atomic_load(&g_fake.watch))
        COUNT(n_watch_sync);
    return atomic_load(&g_fake.fail_stream_sync) ? FAIL_CODE : 0;
}

int cudaEventCreateWithFlags(void **e, unsigned flags)
{
    (void)flags;
    *e = calloc(1, sizeof(struct fake_event));
    return *e ? 0 : 2;
}

int cudaEventDestroy(void *e)
{
    free(e);
    return 0;
}

int cudaEventRecord(void *e, void *s)
{
    (void)s;
    COUNT(n_event_record);
    if (atomic_load(&g_fake.fail_event_record))
        return FAIL_CODE;
    ((struct fake_event *)e)->recorded = 1;
    return 0;
}

int cudaEventSynchronize(void *e)
{
    (void)e;
    COUNT(n_event_sync);
    return 0;
}

int cudaEventQuery(void *e)
{
    (void)e;
    COUNT(n_event_query);
    return atomic_load(&g_fake.query_not_ready) ? 600 /* cudaErrorNotReady */ : 0;
}

int cudaEventElapsedTime(float *ms, void *a, void *b)
{
    (void)a;
    (void)b;
    *ms = 0.25f;
    return 0;
}

int cudaStreamWaitEvent(void *s, void *e, unsigned flags)
{
    (void)s;
    (void)e;
    (void)flags;
    COUNT(n_stream_wait_event);
    return 0;
}

int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *s)
{
    (void)kind;
    (void)s;
    COUNT(n_memcpy_async);
    memcpy(dst, src, n);
    return 0;
}

int cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
    (void)kind;
    memcpy(dst, src, n);
    return 0;
}

int cudaDriverGetVersion(int *v)
{
    *v = 13000;
    return 0;
}

int cudaRuntimeGetVersion(int *v)
{
    *v = 13000;
    return 0;
}
