/* The CUDA runtime and the driver API, reached through dlopen: the one
 * place in lib/ that loads a library (lib/CMakeLists.txt checks it).
 *
 * Why dlopen and not a link against libcudart (static or shared):
 *  - host-only users (NPYLOAD_OPT_DEVICE = -1, the tools on a laptop, CI)
 *    need no CUDA library at all at run time: nothing here is touched until
 *    a device is asked for;
 *  - the library, the Python wheel and the tools build without a CUDA
 *    toolkit: every type below is declared with plain C types, no CUDA
 *    header is included;
 *  - one binary works with whichever runtime the machine has (CUDA 11, 12 or
 *    13): the runtime ABI of the calls used here has not changed across those
 *    major versions, and a runtime too new for the installed driver is
 *    skipped in favour of an older one.
 * A static cudart would also give the library its own copy of the runtime,
 * separate from the one PyTorch or the user's program loads; through dlopen
 * of the same soname the process shares one runtime, so streams and events
 * passed in by the user are the ones we see.
 *
 * No global state: every npyl_cuda holds its own dlopen handles (the dynamic
 * loader reference-counts the libraries) and its own tables of entry points:
 * the runtime's, filled by open (resolve), and the driver's (libcuda.so.1),
 * filled on first need by npyl_cuda_driver (load_driver), as kvikio's shim
 * does: one object with every entry point, filled in one function.
 *
 * Thread-safety: every function may be called from any thread once open()
 * has returned. The CUDA runtime is thread-safe; the only mutable state of a
 * handle is its error message and the driver table's loading, both under
 * `mu`. The current device is
 * per thread in CUDA: a thread other than the one that called open() must
 * call npyl_cuda_bind_thread() before its first allocation, stream or copy.
 */
#include "npyload_cuda.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The few CUDA constants used, from driver_types.h (stable since CUDA 4). */
enum {
    CU_SUCCESS = 0,
    CU_ERR_INITIALIZATION = 3,     /* cudaErrorInitializationError */
    CU_ERR_INSUFFICIENT_DRIVER = 35, /* cudaErrorInsufficientDriver */
    CU_ERR_NO_DEVICE = 100,        /* cudaErrorNoDevice */
    CU_ERR_INVALID_DEVICE = 101,   /* cudaErrorInvalidDevice */
    CU_ERR_STUB_LIBRARY = 34,      /* cudaErrorStubLibrary */
    CU_ERR_NOT_READY = 600,        /* cudaErrorNotReady */
    CU_ERR_SYSTEM_NOT_READY = 802, /* cudaErrorSystemNotReady (fabric manager) */
    CU_ERR_SYSTEM_DRIVER_MISMATCH = 803,
    CU_ERR_COMPAT_NOT_SUPPORTED = 804,
};
#define CU_HOST_ALLOC_PORTABLE 1u   /* cudaHostAllocPortable */
#define CU_STREAM_NON_BLOCKING 1u   /* cudaStreamNonBlocking */
#define CU_EVENT_DEFAULT 0u         /* cudaEventDefault */
#define CU_EVENT_DISABLE_TIMING 2u  /* cudaEventDisableTiming */
#define CU_MEMCPY_H2D 1             /* cudaMemcpyHostToDevice */
#define CU_MEMCPY_D2H 2             /* cudaMemcpyDeviceToHost */

/* The runtime's entry points. cudaError_t is an enum (int); cudaStream_t and
 * cudaEvent_t are pointers. (The driver's are npyl_cu_*_fn, in the header.) */
typedef int (*cudart_get_device_count_fn)(int *);
typedef int (*cudart_set_device_fn)(int);
typedef int (*cudart_get_device_fn)(int *);
typedef const char *(*cudart_get_error_string_fn)(int);
typedef int (*cudart_host_alloc_fn)(void **, size_t, unsigned int);
typedef int (*cudart_free_host_fn)(void *);
typedef int (*cudart_malloc_fn)(void **, size_t);
typedef int (*cudart_free_fn)(void *);
typedef int (*cudart_stream_create_with_flags_fn)(void **, unsigned int);
typedef int (*cudart_stream_destroy_fn)(void *);
typedef int (*cudart_stream_synchronize_fn)(void *);
typedef int (*cudart_event_create_with_flags_fn)(void **, unsigned int);
typedef int (*cudart_event_destroy_fn)(void *);
typedef int (*cudart_event_record_fn)(void *, void *);
typedef int (*cudart_event_synchronize_fn)(void *);
typedef int (*cudart_event_query_fn)(void *);
typedef int (*cudart_event_elapsed_time_fn)(float *, void *, void *);
typedef int (*cudart_stream_wait_event_fn)(void *, void *, unsigned int);
typedef int (*cudart_memcpy_async_fn)(void *, const void *, size_t, int, void *);
typedef int (*cudart_memcpy_fn)(void *, const void *, size_t, int);
typedef int (*cudart_driver_get_version_fn)(int *);
typedef int (*cudart_runtime_get_version_fn)(int *);

struct npyl_cuda {
    void *lib;
    const char *soname;  /* the name that loaded (a string literal) */
    int device;
    int ndevices;
    int driver_version;  /* 12040 for 12.4; 0 when no driver answers */
    int runtime_version;

    cudart_get_device_count_fn get_device_count;
    cudart_set_device_fn set_device;
    cudart_get_device_fn get_device;
    cudart_get_error_string_fn get_error_string;
    cudart_host_alloc_fn host_alloc;
    cudart_free_host_fn free_host;
    cudart_malloc_fn malloc_;
    cudart_free_fn free_;
    cudart_stream_create_with_flags_fn stream_create;
    cudart_stream_destroy_fn stream_destroy;
    cudart_stream_synchronize_fn stream_sync;
    cudart_event_create_with_flags_fn event_create;
    cudart_event_destroy_fn event_destroy;
    cudart_event_record_fn event_record;
    cudart_event_synchronize_fn event_sync;
    cudart_event_query_fn event_query;
    cudart_event_elapsed_time_fn event_elapsed;
    cudart_stream_wait_event_fn stream_wait_event;
    cudart_memcpy_async_fn memcpy_async;
    cudart_memcpy_fn memcpy_;
    cudart_driver_get_version_fn driver_get_version;
    cudart_runtime_get_version_fn runtime_get_version;

    /* The driver API, loaded on first need (npyl_cuda_driver): drv_state 0
     * not tried yet, 1 loaded, or the failure's code (drv_why its reason),
     * which later calls return without trying again. */
    void *drv_lib;
    int drv_state;
    npyl_cudrv drv;
    char drv_why[256];

    pthread_mutex_t mu; /* guards msg and the driver table's loading */
    char msg[512];
};

/* The sonames tried, newest first. A runtime newer than the driver refuses
 * to start (cudaErrorInsufficientDriver); open() then goes on to the next. */
static const char *const default_sonames[] = {
    "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so",
};

/* ---- error reporting ---- */

static const char *err_string(const npyl_cuda *c, int e)
{
    const char *s = c->get_error_string ? c->get_error_string(e) : NULL;
    return s ? s : "unknown CUDA error";
}

/* Records "call: runtime message (cuda error N)" on the handle and returns
 * NPYLOAD_ECUDA. */
static int cu_fail(npyl_cuda *c, int e, const char *fmt, ...) NPYL_PRINTF(3, 4);
static int cu_fail(npyl_cuda *c, int e, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->mu);
    snprintf(c->msg, sizeof c->msg, "%s on device %d: %s (CUDA error %d)",
             what, c->device, err_string(c, e), e);
    pthread_mutex_unlock(&c->mu);
    return NPYLOAD_ECUDA;
}

#define CU_CALL(c, expr, ...)                                                  \
    do {                                                                       \
        int e_ = (expr);                                                       \
        if (e_ != CU_SUCCESS)                                                  \
            return cu_fail((c), e_, __VA_ARGS__);                              \
    } while (0)

const char *npyl_cuda_errmsg(const npyl_cuda *c)
{
    return c ? c->msg : "";
}

int npyl_cuda_errmsg_copy(npyl_cuda *c, char *buf, size_t len)
{
    if (!buf || !len)
        return 0;
    if (!c) {
        buf[0] = '\0';
        return 0;
    }
    pthread_mutex_lock(&c->mu);
    snprintf(buf, len, "%s", c->msg);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* ---- open / close ---- */

static int resolve(npyl_cuda *c, const char **missing)
{
#define SYM(field, name)                                                       \
    do {                                                                       \
        *(void **)(&c->field) = dlsym(c->lib, name);                           \
        if (!c->field) {                                                       \
            *missing = name;                                                   \
            return -1;                                                         \
        }                                                                      \
    } while (0)
    SYM(get_device_count, "cudaGetDeviceCount");
    SYM(set_device, "cudaSetDevice");
    SYM(get_device, "cudaGetDevice");
    SYM(get_error_string, "cudaGetErrorString");
    SYM(host_alloc, "cudaHostAlloc");
    SYM(free_host, "cudaFreeHost");
    SYM(malloc_, "cudaMalloc");
    SYM(free_, "cudaFree");
    SYM(stream_create, "cudaStreamCreateWithFlags");
    SYM(stream_destroy, "cudaStreamDestroy");
    SYM(stream_sync, "cudaStreamSynchronize");
    SYM(event_create, "cudaEventCreateWithFlags");
    SYM(event_destroy, "cudaEventDestroy");
    SYM(event_record, "cudaEventRecord");
    SYM(event_sync, "cudaEventSynchronize");
    SYM(event_query, "cudaEventQuery");
    SYM(event_elapsed, "cudaEventElapsedTime");
    SYM(stream_wait_event, "cudaStreamWaitEvent");
    SYM(memcpy_async, "cudaMemcpyAsync");
    SYM(memcpy_, "cudaMemcpy");
    SYM(driver_get_version, "cudaDriverGetVersion");
    SYM(runtime_get_version, "cudaRuntimeGetVersion");
#undef SYM
    return 0;
}

static void free_handle(npyl_cuda *c)
{
    if (c->drv_lib)
        dlclose(c->drv_lib);
    if (c->lib)
        dlclose(c->lib);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void npyl_cuda_why_append(char *why, size_t whylen, const char *fmt, ...)
{
    if (!why || !whylen)
        return;
    size_t used = strnlen(why, whylen);
    if (used + 1 >= whylen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why + used, whylen - used, fmt, ap);
    va_end(ap);
}

static void fmt_version(char *buf, size_t len, int v)
{
    snprintf(buf, len, "%d.%d", v / 1000, (v % 1000) / 10);
}

/* Tries one loaded runtime: driver present, devices counted.
 * Returns 0 (c->ndevices set), 1 to try the next soname (runtime too new
 * for the driver), or NPYLOAD_ENOCUDA with the reason in why. */
static int probe_runtime(npyl_cuda *c, char *why, size_t whylen)
{
    char dv[16], rv[16];
    c->driver_version = 0;
    c->runtime_version = 0;
    /* cudaDriverGetVersion answers 0 without error when libcuda.so cannot be
     * loaded, and does not initialise the driver. */
    if (c->driver_get_version(&c->driver_version) != CU_SUCCESS)
        c->driver_version = 0;
    if (c->runtime_get_version(&c->runtime_version) != CU_SUCCESS)
        c->runtime_version = 0;
    fmt_version(dv, sizeof dv, c->driver_version);
    fmt_version(rv, sizeof rv, c->runtime_version);

    int n = 0;
    int e = c->get_device_count(&n);
    if (e == CU_SUCCESS && n > 0) {
        c->ndevices = n;
        return 0;
    }
    if (c->driver_version == 0) {
        npyl_fail(why, whylen, NPYLOAD_ENOCUDA,
                  "no CUDA driver (libcuda.so not found or not loadable; "
                  "runtime %s (CUDA %s) loaded)", c->soname, rv);
        return NPYLOAD_ENOCUDA;
    }
    switch (e) {
    case CU_SUCCESS:
    case CU_ERR_NO_DEVICE:
        npyl_fail(why, whylen, NPYLOAD_ENOCUDA,
                  "no CUDA device (driver %s answers but reports no device; "
                  "check CUDA_VISIBLE_DEVICES and /dev/nvidia*)", dv);
        return NPYLOAD_ENOCUDA;
    case CU_ERR_INSUFFICIENT_DRIVER:
    case CU_ERR_COMPAT_NOT_SUPPORTED:
        npyl_cuda_why_append(why, whylen, "%s%s (runtime %s) needs a newer driver than %s",
                   (why && why[0]) ? "; " : "", c->soname, rv, dv);
        return 1;
    case CU_ERR_STUB_LIBRARY:
        npyl_fail(why, whylen, NPYLOAD_ENOCUDA,
                  "no CUDA driver (only the toolkit's stub libcuda.so is "
                  "installed)");
        return NPYLOAD_ENOCUDA;
    default:
        npyl_fail(why, whylen, NPYLOAD_ENOCUDA,
                  "CUDA driver %s failed to initialise with runtime %s: %s "
                  "(CUDA error %d)", dv, c->soname, err_string(c, e), e);
        return NPYLOAD_ENOCUDA;
    }
}

/* set_current = 0 only counts devices: npyload_cuda_available() must not
 * change the caller's current device nor create a context (a probe of
 * device 3 from a fresh thread would otherwise leave a context on it, or, on
 * restoring, one on device 0 -- the classic "every rank holds memory on
 * GPU 0"). */
void npyl_cuda_runtime_path(const npyl_cuda *c, char *buf, size_t len)
{
    struct link_map *lm = NULL;
    if (c && dlinfo(c->lib, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
        snprintf(buf, len, "%s", lm->l_name);
    else
        snprintf(buf, len, "%s", c ? c->soname : "");
}

/* Records what the runtime `c` (loaded, resolved, probed) is. */
static void note_facts(const npyl_cuda *c, npyl_cuda_facts *f)
{
    f->found = 1;
    f->devices = c->ndevices;
    f->runtime_version = c->runtime_version;
    f->driver_version = c->driver_version;
    snprintf(f->soname, sizeof f->soname, "%s", c->soname);
    npyl_cuda_runtime_path(c, f->path, sizeof f->path);
}

/* facts (may be NULL) gets the last runtime that loaded and was probed. */
static int open_impl(npyl_cuda **out, int device, const char *const *sonames,
                     size_t nsonames, int set_current, npyl_cuda_facts *facts,
                     char *why, size_t whylen)
{
    if (why && whylen)
        why[0] = '\0';
    if (!out)
        return npyl_fail(why, whylen, NPYLOAD_EINVAL, "npyl_cuda_open: out is NULL");
    *out = NULL;
    if (device < 0)
        return npyl_fail(why, whylen, NPYLOAD_EINVAL,
                         "device %d is not a CUDA device index (>= 0 expected)",
                         device);
    if (!sonames || nsonames == 0) {
        sonames = default_sonames;
        nsonames = sizeof default_sonames / sizeof default_sonames[0];
    }
    if (nsonames > 16)
        nsonames = 16;
    /* A runtime the process already has (PyTorch's, the program's own) comes
     * first, so that we share it rather than map a second one beside it.
     * (Two runtimes would still interoperate: both use the driver's primary
     * context, so streams, events and pointers are valid across them.) */
    const char *order[16];
    size_t norder = 0;
    for (size_t i = 0; i < nsonames; i++) {
        void *h = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (h) {
            dlclose(h);
            order[norder++] = sonames[i];
        }
    }
    for (size_t i = 0; i < nsonames; i++) {
        size_t j = 0;
        while (j < norder && order[j] != sonames[i])
            j++;
        if (j == norder)
            order[norder++] = sonames[i];
    }
    sonames = order;

    /* Reasons gathered while trying: what failed to load, which runtime was
     * too new for the driver. */
    char tried[512] = "";
    char toonew[512] = "";
    for (size_t i = 0; i < nsonames; i++) {
        npyl_cuda *c = calloc(1, sizeof *c);
        if (!c)
            return npyl_fail(why, whylen, -ENOMEM, "out of memory");
        pthread_mutex_init(&c->mu, NULL);
        c->device = device;
        c->soname = sonames[i];
        /* RTLD_LOCAL: our lookups go through this handle only and nothing
         * leaks into the global namespace. RTLD_NODELETE: the runtime keeps
         * process-wide driver state (primary contexts, its threads, atexit
         * handlers); unmapping it when the last handle closes and mapping it
         * again at the next open is slow and has crashed runtimes in the
         * past, while keeping it mapped costs nothing once it was loaded. */
        c->lib = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (!c->lib) {
            npyl_cuda_why_append(tried, sizeof tried, "%s%s", tried[0] ? ", " : "",
                       sonames[i]);
            free_handle(c);
            continue;
        }
        const char *missing = NULL;
        if (resolve(c, &missing) != 0) {
            npyl_cuda_why_append(tried, sizeof tried, "%s%s (no %s)", tried[0] ? ", " : "",
                       sonames[i], missing);
            free_handle(c);
            continue;
        }
        int rc = probe_runtime(c, toonew, sizeof toonew);
        if (facts)
            note_facts(c, facts);
        if (rc == 1) { /* too new for this driver: try an older runtime */
            free_handle(c);
            continue;
        }
        if (rc != 0) {
            npyl_fail(why, whylen, rc, "%s", toonew);
            free_handle(c);
            return rc;
        }
        if (device >= c->ndevices) {
            npyl_fail(why, whylen, NPYLOAD_ENOCUDA,
                      "device %d out of range (%d device%s)", device,
                      c->ndevices, c->ndevices == 1 ? "" : "s");
            free_handle(c);
            return NPYLOAD_ENOCUDA;
        }
        int e = set_current ? c->set_device(device) : CU_SUCCESS;
        if (e != CU_SUCCESS) {
            npyl_fail(why, whylen, NPYLOAD_ENOCUDA,
                      "cudaSetDevice(%d) failed: %s (CUDA error %d)", device,
                      err_string(c, e), e);
            free_handle(c);
            return NPYLOAD_ENOCUDA;
        }
        *out = c;
        return 0;
    }
    if (toonew[0])
        return npyl_fail(why, whylen, NPYLOAD_ENOCUDA,
                         "no CUDA runtime usable with the installed driver: %s%s%s",
                         toonew, tried[0] ? "; not loadable: " : "", tried);
    return npyl_fail(why, whylen, NPYLOAD_ENOCUDA,
                     "no CUDA runtime library (libcudart) found: tried %s",
                     tried);
}

int npyl_cuda_open_sonames(npyl_cuda **out, int device,
                           const char *const *sonames, size_t nsonames,
                           char *why, size_t whylen)
{
    return open_impl(out, device, sonames, nsonames, 1, NULL, why, whylen);
}

int npyl_cuda_open(npyl_cuda **out, int device, char *why, size_t whylen)
{
    return open_impl(out, device, NULL, 0, 1, NULL, why, whylen);
}

void npyl_cuda_close(npyl_cuda *c)
{
    /* dlclose only drops our reference: the runtime stays mapped while any
     * other handle (or the program itself) uses it. */
    if (c)
        free_handle(c);
}

int npyl_cuda_device(const npyl_cuda *c) { return c ? c->device : -1; }

const char *npyl_cuda_soname(const npyl_cuda *c)
{
    return c ? c->soname : "";
}

int npyl_cuda_bind_thread(npyl_cuda *c)
{
    CU_CALL(c, c->set_device(c->device), "cudaSetDevice(%d)", c->device);
    return 0;
}

int npyl_cuda_enter(npyl_cuda *c, int *prev)
{
    *prev = -1;
    /* cudaGetDevice does not create a context: on a thread that never used
     * CUDA it answers 0. */
    CU_CALL(c, c->get_device(prev), "cudaGetDevice");
    if (*prev == c->device)
        return 0;
    CU_CALL(c, c->set_device(c->device), "cudaSetDevice(%d)", c->device);
    return 0;
}

void npyl_cuda_leave(npyl_cuda *c, int prev)
{
    if (prev >= 0 && prev != c->device)
        c->set_device(prev);
}

/* ---- the driver API ---- */

#define DRIVER_SONAME "libcuda.so.1"

/* Fills c->drv: one dlopen, every entry point, one failure message. Called
 * once per handle, under c->mu. */
static int load_driver(npyl_cuda *c, char *why, size_t whylen)
{
    /* No RTLD_NODELETE (unlike the runtime): the runtime itself holds the
     * driver while it is mapped, and nothing of ours outlives the handle. */
    c->drv_lib = dlopen(DRIVER_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!c->drv_lib) {
        const char *e = dlerror();
        return npyl_fail(why, whylen, NPYLOAD_ENOCUDA,
                         "CUDA driver API (" DRIVER_SONAME ") not loadable: %s",
                         e ? e : "dlopen failed");
    }
#define DRV_SYM(field, name)                                                       do {                                                                               *(void **)(&c->drv.field) = dlsym(c->drv_lib, name);                           if (!c->drv.field)                                                                 return npyl_fail(why, whylen, NPYLOAD_ENOCUDA,                                                  "CUDA driver API (" DRIVER_SONAME ") not "                                     "loadable: it has no " name);                         } while (0)
    DRV_SYM(module_load_data, "cuModuleLoadData");
    DRV_SYM(module_unload, "cuModuleUnload");
    DRV_SYM(module_get_function, "cuModuleGetFunction");
    DRV_SYM(launch_kernel, "cuLaunchKernel");
    DRV_SYM(get_error_string, "cuGetErrorString");
    DRV_SYM(ctx_get_device, "cuCtxGetDevice");
    DRV_SYM(device_get_attribute, "cuDeviceGetAttribute");
#undef DRV_SYM
    return 0;
}

int npyl_cuda_driver(npyl_cuda *c, const npyl_cudrv **out, char *why,
                     size_t whylen)
{
    if (out)
        *out = NULL;
    if (!c || !out)
        return npyl_fail(why, whylen, NPYLOAD_EINVAL,
                         "npyl_cuda_driver: %s is NULL", c ? "out" : "handle");
    pthread_mutex_lock(&c->mu);
    if (c->drv_state == 0) {
        int rc = load_driver(c, c->drv_why, sizeof c->drv_why);
        if (rc) {
            memset(&c->drv, 0, sizeof c->drv);
            if (c->drv_lib)
                dlclose(c->drv_lib);
            c->drv_lib = NULL;
        }
        c->drv_state = rc ? rc : 1;
    }
    int rc = c->drv_state == 1 ? 0 : c->drv_state;
    if (rc)
        npyl_fail(why, whylen, rc, "%s", c->drv_why);
    else
        *out = &c->drv;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

const char *npyl_cudrv_strerror(const npyl_cudrv *d, int result)
{
    const char *s = NULL;
    if (d && d->get_error_string && d->get_error_string(result, &s) != 0)
        s = NULL;
    return s ? s : "unknown CUDA driver error";
}

/* ---- memory ---- */

int npyl_cuda_host_alloc(npyl_cuda *c, void **p, size_t n)
{
    *p = NULL;
    /* Portable: the pages count as pinned for every device, so a slot filled
     * by a worker thread bound to another device would still copy at full
     * speed. */
    CU_CALL(c, c->host_alloc(p, n, CU_HOST_ALLOC_PORTABLE),
            "cudaHostAlloc(%zu bytes)", n);
    return 0;
}

int npyl_cuda_host_free(npyl_cuda *c, void *p)
{
    if (!p)
        return 0;
    CU_CALL(c, c->free_host(p), "cudaFreeHost(%p)", p);
    return 0;
}

int npyl_cuda_malloc(npyl_cuda *c, void **p, size_t n)
{
    *p = NULL;
    CU_CALL(c, c->malloc_(p, n), "cudaMalloc(%zu bytes)", n);
    return 0;
}

int npyl_cuda_free(npyl_cuda *c, void *p)
{
    if (!p)
        return 0;
    CU_CALL(c, c->free_(p), "cudaFree(%p)", p);
    return 0;
}

int npyl_cuda_init_context(npyl_cuda *c)
{
    CU_CALL(c, c->free_(NULL), "cudaFree(NULL) (creating the device's primary context)");
    return 0;
}

/* ---- streams and events ---- */

int npyl_cuda_stream_create(npyl_cuda *c, void **s)
{
    *s = NULL;
    /* Non-blocking: the copy stream must not synchronise with the legacy
     * default stream, or a user kernel on stream 0 would serialise copies. */
    CU_CALL(c, c->stream_create(s, CU_STREAM_NON_BLOCKING),
            "cudaStreamCreateWithFlags(cudaStreamNonBlocking)");
    return 0;
}

int npyl_cuda_stream_destroy(npyl_cuda *c, void *s)
{
    if (!s)
        return 0;
    CU_CALL(c, c->stream_destroy(s), "cudaStreamDestroy(%p)", s);
    return 0;
}

int npyl_cuda_stream_sync(npyl_cuda *c, void *s)
{
    CU_CALL(c, c->stream_sync(s), "cudaStreamSynchronize(%p)", s);
    return 0;
}

int npyl_cuda_event_create(npyl_cuda *c, void **e, int timing)
{
    *e = NULL;
    unsigned flags = timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING;
    CU_CALL(c, c->event_create(e, flags), "cudaEventCreateWithFlags(%s)",
            timing ? "cudaEventDefault" : "cudaEventDisableTiming");
    return 0;
}

int npyl_cuda_event_destroy(npyl_cuda *c, void *e)
{
    if (!e)
        return 0;
    CU_CALL(c, c->event_destroy(e), "cudaEventDestroy(%p)", e);
    return 0;
}

int npyl_cuda_event_record(npyl_cuda *c, void *e, void *s)
{
    CU_CALL(c, c->event_record(e, s), "cudaEventRecord(event %p, stream %p)",
            e, s);
    return 0;
}

int npyl_cuda_event_sync(npyl_cuda *c, void *e)
{
    CU_CALL(c, c->event_sync(e), "cudaEventSynchronize(%p)", e);
    return 0;
}

int npyl_cuda_event_query(npyl_cuda *c, void *e)
{
    int r = c->event_query(e);
    if (r == CU_SUCCESS)
        return 1;
    if (r == CU_ERR_NOT_READY)
        return 0;
    return cu_fail(c, r, "cudaEventQuery(%p)", e);
}

int npyl_cuda_event_elapsed_ms(npyl_cuda *c, float *ms, void *start, void *end)
{
    *ms = 0.0f;
    CU_CALL(c, c->event_elapsed(ms, start, end),
            "cudaEventElapsedTime(%p, %p)", start, end);
    return 0;
}

int npyl_cuda_stream_wait_event(npyl_cuda *c, void *s, void *e)
{
    CU_CALL(c, c->stream_wait_event(s, e, 0),
            "cudaStreamWaitEvent(stream %p, event %p)", s, e);
    return 0;
}

/* ---- copies ---- */

int npyl_cuda_memcpy_h2d_async(npyl_cuda *c, void *dst, const void *src,
                               size_t n, void *s)
{
    CU_CALL(c, c->memcpy_async(dst, src, n, CU_MEMCPY_H2D, s),
            "cudaMemcpyAsync(device %p <- host %p, %zu bytes, stream %p)", dst,
            src, n, s);
    return 0;
}

int npyl_cuda_memcpy_d2h(npyl_cuda *c, void *dst, const void *src, size_t n)
{
    CU_CALL(c, c->memcpy_(dst, src, n, CU_MEMCPY_D2H),
            "cudaMemcpy(host %p <- device %p, %zu bytes)", dst, src, n);
    return 0;
}

/* ---- public helper ---- */

NPYLOAD_API int npyload_cuda_available(int device, char *why, size_t whylen)
{
    npyl_cuda *c = NULL;
    char tmp[512];
    int rc = open_impl(&c, device, NULL, 0, 0, NULL, tmp, sizeof tmp);
    if (rc != 0) {
        if (why && whylen)
            snprintf(why, whylen, "%s", tmp);
        return 0;
    }
    npyl_cuda_close(c);
    if (why && whylen)
        why[0] = '\0';
    return 1;
}

void npyl_cuda_probe_facts(npyl_cuda_facts *out)
{
    npyl_cuda *c = NULL;
    memset(out, 0, sizeof *out);
    if (open_impl(&c, 0, NULL, 0, 0, out, out->why, sizeof out->why) == 0) {
        out->why[0] = '\0';
        npyl_cuda_close(c);
    } else {
        out->devices = 0;
    }
}
