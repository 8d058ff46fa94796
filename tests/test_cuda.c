/* lib/cuda: the CUDA runtime and driver API reached through dlopen, the
 * device transform engine's host side, and the public helpers
 * npyload_cuda_available / npyload_cuda_h2d_bandwidth.
 *
 * Runs everywhere, CI included. Two groups:
 *  - "no GPU" tests check that a machine without a usable device says so,
 *    precisely, through every entry point (and the loader). On a machine with
 *    a GPU they skip, visibly.
 *  - "GPU" tests exercise the handle on device 0; without one they skip,
 *    visibly, with the reason npyload_cuda_available gives.
 *  - "fake" tests drive the loader's device path on the fake runtime
 *    (tests/gpu/fake_cudart.c), and the driver table and its users on the
 *    fake driver API (tests/gpu/fake_cuda_driver.c): call counts and
 *    injected failures, on any machine.
 * Kernel-level and loader-on-GPU tests live in tests/gpu (they need nvcc). */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <dlfcn.h>
#include <glob.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cuda/npyload_cuda.h"
#include "cuda/npyload_cuda_nvrtc.h"
#include "cuda/npyload_cuda_transform.h"
#include "cuda/npyload_cuda_transform_kparams.h"
#include "gpu/fake_cuda_driver.h"
#include "gpu/fake_cudart.h"
#include "npyload.h"
#include "npyload.h" /* with NPYLOAD_EXPERIMENTAL (CMake): the simulator, NVML, the GET sweep */
#include "testutil.h"

/* ---- helpers ---- */

static int gpu_present(char *why, size_t whylen)
{
    return npyload_cuda_available(0, why, whylen);
}

#define SKIP_IF_GPU()                                                          \
    do {                                                                       \
        char why_[512];                                                        \
        if (gpu_present(why_, sizeof why_))                                    \
            cr_skip_test("CUDA device 0 is usable here: this test covers "     \
                         "machines without one");                              \
    } while (0)

#define NEED_GPU()                                                             \
    do {                                                                       \
        char why_[512];                                                        \
        if (!gpu_present(why_, sizeof why_))                                   \
            cr_skip_test("needs CUDA device 0: %s", why_);                     \
    } while (0)

/* A reason that names its cause: one of the documented phrasings. */
static int names_cause(const char *why)
{
    static const char *const causes[] = {
        "no CUDA runtime library", "no CUDA driver", "no CUDA device",
        "out of range", "no CUDA runtime usable", "CUDA driver",
    };
    for (size_t i = 0; i < sizeof causes / sizeof causes[0]; i++)
        if (strstr(why, causes[i]))
            return 1;
    return 0;
}

static int can_dlopen(const char *name)
{
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h)
        dlclose(h);
    return h != NULL;
}

/* ---- no GPU: precise reasons ---- */

Test(cuda_nogpu, available_says_why)
{
    SKIP_IF_GPU();
    char why[512] = "unchanged";
    cr_assert_eq(npyload_cuda_available(0, why, sizeof why), 0);
    cr_log_info("npyload_cuda_available(0): %s", why);
    cr_assert_neq(why[0], '\0', "empty reason");
    cr_assert(names_cause(why), "reason does not name its cause: \"%s\"", why);
    /* NULL reason buffer is allowed. */
    cr_assert_eq(npyload_cuda_available(0, NULL, 0), 0);
    /* A tiny buffer is truncated, NUL-terminated. */
    char small[8];
    memset(small, 'x', sizeof small);
    cr_assert_eq(npyload_cuda_available(0, small, sizeof small), 0);
    cr_assert_eq(strlen(small), sizeof small - 1);
}

Test(cuda_nogpu, runtime_present_driver_absent_says_no_driver)
{
    /* The situation of this project's CI and dev machines: the toolkit (and
     * so libcudart) is installed, the driver (libcuda.so.1) is not. */
    SKIP_IF_GPU();
    int rt = can_dlopen("libcudart.so.13") || can_dlopen("libcudart.so.12") ||
             can_dlopen("libcudart.so.11.0") || can_dlopen("libcudart.so");
    if (!rt)
        cr_skip_test("no libcudart on this machine: the no-runtime path is "
                     "covered by open_no_runtime_library");
    if (can_dlopen("libcuda.so.1"))
        cr_skip_test("libcuda.so.1 loads here (driver present, no device): "
                     "covered by available_says_why");
    char why[512];
    cr_assert_eq(npyload_cuda_available(0, why, sizeof why), 0);
    cr_assert(strstr(why, "no CUDA driver") != NULL,
              "expected \"no CUDA driver\", got \"%s\"", why);
    cr_assert(strstr(why, "libcudart") != NULL,
              "the reason should say which runtime loaded: \"%s\"", why);
}

Test(cuda_nogpu, open_fails_with_enocuda)
{
    SKIP_IF_GPU();
    char why[512] = "", avail[512] = "";
    npyl_cuda *c = (npyl_cuda *)0x1;
    cr_assert_eq(npyl_cuda_open(&c, 0, why, sizeof why), NPYLOAD_ENOCUDA);
    cr_assert_null(c, "*out must be NULL on failure");
    cr_assert(names_cause(why), "reason: \"%s\"", why);
    npyload_cuda_available(0, avail, sizeof avail);
    cr_assert_str_eq(why, avail, "open and available disagree");
    /* Device 1 fails for the same reason, not "out of range". */
    cr_assert_eq(npyl_cuda_open(&c, 1, why, sizeof why), NPYLOAD_ENOCUDA);
    cr_assert_str_eq(why, avail);
}

Test(cuda_nogpu, h2d_bandwidth_enocuda)
{
    SKIP_IF_GPU();
    double g = -1.0;
    cr_assert_eq(npyload_cuda_h2d_bandwidth(0, 1 << 20, 4, &g), NPYLOAD_ENOCUDA);
}

/* ---- everywhere ---- */

Test(cuda, open_no_runtime_library)
{
    static const char *const names[] = {"libcudart-npyload-absent.so.99",
                                        "libnpyload-no-such-runtime.so"};
    char why[512];
    npyl_cuda *c = (npyl_cuda *)0x1;
    cr_assert_eq(npyl_cuda_open_sonames(&c, 0, names, 2, why, sizeof why),
                 NPYLOAD_ENOCUDA);
    cr_assert_null(c);
    cr_log_info("%s", why);
    cr_assert(strstr(why, "no CUDA runtime library (libcudart) found") != NULL,
              "reason: \"%s\"", why);
    cr_assert(strstr(why, names[0]) && strstr(why, names[1]),
              "the reason must list what was tried: \"%s\"", why);
}

Test(cuda, open_library_without_cuda_symbols)
{
    /* A library that loads but is no CUDA runtime. */
    static const char *const names[] = {"libc.so.6"};
    char why[512];
    npyl_cuda *c = NULL;
    cr_assert_eq(npyl_cuda_open_sonames(&c, 0, names, 1, why, sizeof why),
                 NPYLOAD_ENOCUDA);
    cr_assert(strstr(why, "no CUDA runtime library") && strstr(why, "libc.so.6") &&
                  strstr(why, "cudaGetDeviceCount"),
              "reason: \"%s\"", why);
}

Test(cuda, open_bad_arguments)
{
    char why[256];
    npyl_cuda *c = NULL;
    cr_assert_eq(npyl_cuda_open(NULL, 0, why, sizeof why), NPYLOAD_EINVAL);
    cr_assert_eq(npyl_cuda_open(&c, -1, why, sizeof why), NPYLOAD_EINVAL);
    cr_assert(strstr(why, "-1") != NULL, "reason: \"%s\"", why);
    cr_assert_null(c);
    npyl_cuda_close(NULL);
    cr_assert_str_eq(npyl_cuda_errmsg(NULL), "");
    cr_assert_eq(npyl_cuda_device(NULL), -1);
}

Test(cuda, available_negative_and_huge_device)
{
    char why[512];
    cr_assert_eq(npyload_cuda_available(-1, why, sizeof why), 0);
    cr_assert(strstr(why, "-1") != NULL, "reason: \"%s\"", why);
    cr_assert_eq(npyload_cuda_available(4096, why, sizeof why), 0);
    cr_assert(names_cause(why), "reason: \"%s\"", why);
    char g[512];
    if (gpu_present(g, sizeof g))
        cr_assert(strstr(why, "device 4096 out of range (") != NULL,
                  "reason: \"%s\"", why);
}

Test(cuda, h2d_bandwidth_bad_arguments)
{
    double g;
    cr_assert_eq(npyload_cuda_h2d_bandwidth(0, 0, 4, &g), NPYLOAD_EINVAL);
    cr_assert_eq(npyload_cuda_h2d_bandwidth(0, 4096, 0, &g), NPYLOAD_EINVAL);
    cr_assert_eq(npyload_cuda_h2d_bandwidth(0, 4096, 4, NULL), NPYLOAD_EINVAL);
}

/* ---- the loader asked for a device it cannot have ---- */

/* One small field; returns the glob (malloc'd) and the directory in *dir. */
static char *small_field(char **dir)
{
    *dir = tu_mkdtemp("cuda");
    cr_assert_not_null(*dir);
    const int64_t sshape[1] = {16};
    const int64_t per_file[2] = {8, 5};
    cr_assert_eq(tu_write_field(*dir, "x", 1, "<f4", 4, 1, sshape, per_file, 2,
                                64), 0);
    return tu_path(*dir, "x_*.npy");
}

/* Sets the device on a fresh loader with one field, then starts it; returns
 * the first failure (set or start) and where it happened in *at. */
static int loader_with_device(npyload_loader *L, int64_t device,
                              const char **at)
{
    int rc = npyload_loader_set(L, NPYLOAD_OPT_DEVICE, device);
    *at = "set";
    if (rc != 0)
        return rc;
    rc = npyload_loader_start(L);
    *at = "start";
    return rc;
}

Test(cuda_nogpu, loader_device_fails_with_reason)
{
    SKIP_IF_GPU();
    char avail[512];
    npyload_cuda_available(0, avail, sizeof avail);

    char *dir;
    char *glob = small_field(&dir);
    npyload_loader *L = NULL;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", glob), 0, "%s",
                 npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 4), 0);
    const char *at;
    int rc = loader_with_device(L, 0, &at);
    cr_log_info("NPYLOAD_OPT_DEVICE=0 failed at %s: %s", at,
                npyload_loader_errmsg(L));
    cr_assert_eq(rc, NPYLOAD_ENOCUDA, "%s returned %d (%s): %s", at, rc,
                 npyload_strerror(rc), npyload_loader_errmsg(L));
    const char *msg = npyload_loader_errmsg(L);
    cr_assert(names_cause(msg), "loader message does not name the cause: \"%s\"",
              msg);

    if (strcmp(at, "set") == 0) {
        /* A refused option leaves the loader as it was: the program can fall
         * back to host memory. */
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, -1), 0);
        cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
        npyload_batch *b = NULL;
        cr_assert_eq(npyload_loader_next(L, &b), 0, "%s",
                     npyload_loader_errmsg(L));
        cr_assert_eq(npyload_batch_field(b, 0)->device, -1);
        /* Stream calls are no-ops on host batches. */
        cr_assert_eq(npyload_batch_wait_stream(b, NULL), 0);
        cr_assert_eq(npyload_batch_sync(b), 0);
        npyload_batch_release_stream(b, NULL);
    }
    npyload_loader_destroy(L);
    free(glob);
    tu_rmtree(dir);
}

Test(cuda, loader_device_out_of_range)
{
    char *dir;
    char *glob = small_field(&dir);
    npyload_loader *L = NULL;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", glob), 0);
    const char *at;
    /* 1000: inside the option's accepted range, beyond any machine. */
    int rc = loader_with_device(L, 1000, &at);
    cr_assert_eq(rc, NPYLOAD_ENOCUDA, "%s returned %d: %s", at, rc,
                 npyload_loader_errmsg(L));
    const char *msg = npyload_loader_errmsg(L);
    cr_assert(names_cause(msg), "loader message: \"%s\"", msg);
    char g[512];
    if (gpu_present(g, sizeof g))
        cr_assert(strstr(msg, "out of range") != NULL, "loader message: \"%s\"",
                  msg);
    npyload_loader_destroy(L);
    free(glob);
    tu_rmtree(dir);
}

/* ---- GPU: the handle on device 0 ---- */

Test(cuda_gpu, roundtrip_pinned_async_copy)
{
    NEED_GPU();
    char why[512];
    npyl_cuda *c = NULL;
    cr_assert_eq(npyl_cuda_open(&c, 0, why, sizeof why), 0, "%s", why);
    cr_log_info("runtime %s", npyl_cuda_soname(c));
    cr_assert_eq(npyl_cuda_device(c), 0);

    const size_t n = (4u << 20) + 13;
    void *h = NULL, *d = NULL, *s = NULL, *e0 = NULL, *e1 = NULL;
    cr_assert_eq(npyl_cuda_host_alloc(c, &h, n), 0, "%s", npyl_cuda_errmsg(c));
    cr_assert_eq(npyl_cuda_malloc(c, &d, n), 0, "%s", npyl_cuda_errmsg(c));
    cr_assert_eq(npyl_cuda_stream_create(c, &s), 0, "%s", npyl_cuda_errmsg(c));
    cr_assert_eq(npyl_cuda_event_create(c, &e0, 1), 0);
    cr_assert_eq(npyl_cuda_event_create(c, &e1, 1), 0);
    for (size_t i = 0; i < n; i++)
        ((uint8_t *)h)[i] = tu_byte(7, 0, i);

    cr_assert_eq(npyl_cuda_event_record(c, e0, s), 0);
    cr_assert_eq(npyl_cuda_memcpy_h2d_async(c, d, h, n, s), 0, "%s",
                 npyl_cuda_errmsg(c));
    cr_assert_eq(npyl_cuda_event_record(c, e1, s), 0);
    cr_assert_eq(npyl_cuda_event_sync(c, e1), 0);
    cr_assert_eq(npyl_cuda_event_query(c, e1), 1);
    float ms = -1.0f;
    cr_assert_eq(npyl_cuda_event_elapsed_ms(c, &ms, e0, e1), 0);
    cr_assert_geq(ms, 0.0f);

    uint8_t *back = malloc(n);
    cr_assert_eq(npyl_cuda_memcpy_d2h(c, back, d, n), 0, "%s",
                 npyl_cuda_errmsg(c));
    cr_assert_eq(memcmp(back, h, n), 0, "device copy differs from the source");
    free(back);

    cr_assert_eq(npyl_cuda_stream_sync(c, s), 0);
    cr_assert_eq(npyl_cuda_event_destroy(c, e1), 0);
    cr_assert_eq(npyl_cuda_event_destroy(c, e0), 0);
    cr_assert_eq(npyl_cuda_stream_destroy(c, s), 0);
    cr_assert_eq(npyl_cuda_free(c, d), 0);
    cr_assert_eq(npyl_cuda_host_free(c, h), 0);
    npyl_cuda_close(c);
}

Test(cuda_gpu, stream_waits_for_event)
{
    NEED_GPU();
    char why[512];
    npyl_cuda *c = NULL;
    cr_assert_eq(npyl_cuda_open(&c, 0, why, sizeof why), 0, "%s", why);
    void *s1, *s2, *e, *done;
    cr_assert_eq(npyl_cuda_stream_create(c, &s1), 0);
    cr_assert_eq(npyl_cuda_stream_create(c, &s2), 0);
    cr_assert_eq(npyl_cuda_event_create(c, &e, 0), 0);
    cr_assert_eq(npyl_cuda_event_create(c, &done, 0), 0);
    const size_t n = 64u << 20;
    void *h, *d;
    cr_assert_eq(npyl_cuda_host_alloc(c, &h, n), 0);
    cr_assert_eq(npyl_cuda_malloc(c, &d, n), 0);
    memset(h, 1, n);
    cr_assert_eq(npyl_cuda_memcpy_h2d_async(c, d, h, n, s1), 0);
    cr_assert_eq(npyl_cuda_event_record(c, e, s1), 0);
    cr_assert_eq(npyl_cuda_stream_wait_event(c, s2, e), 0);
    cr_assert_eq(npyl_cuda_event_record(c, done, s2), 0);
    cr_assert_eq(npyl_cuda_event_sync(c, done), 0);
    /* done completed after e: e must be complete now. */
    cr_assert_eq(npyl_cuda_event_query(c, e), 1);
    npyl_cuda_free(c, d);
    npyl_cuda_host_free(c, h);
    npyl_cuda_event_destroy(c, e);
    npyl_cuda_event_destroy(c, done);
    npyl_cuda_stream_destroy(c, s1);
    npyl_cuda_stream_destroy(c, s2);
    npyl_cuda_close(c);
}

static void *bound_thread(void *arg)
{
    npyl_cuda *c = arg;
    void *d = NULL;
    intptr_t rc = npyl_cuda_bind_thread(c);
    if (rc == 0)
        rc = npyl_cuda_malloc(c, &d, 1 << 20);
    if (rc == 0)
        rc = npyl_cuda_free(c, d);
    return (void *)rc;
}

Test(cuda_gpu, bind_thread_from_worker)
{
    NEED_GPU();
    char why[512];
    npyl_cuda *c = NULL;
    cr_assert_eq(npyl_cuda_open(&c, 0, why, sizeof why), 0, "%s", why);
    pthread_t t;
    void *res;
    cr_assert_eq(pthread_create(&t, NULL, bound_thread, c), 0);
    pthread_join(t, &res);
    cr_assert_eq((intptr_t)res, 0, "%s", npyl_cuda_errmsg(c));
    npyl_cuda_close(c);
}

Test(cuda_gpu, failed_call_names_itself)
{
    NEED_GPU();
    char why[512];
    npyl_cuda *c = NULL;
    cr_assert_eq(npyl_cuda_open(&c, 0, why, sizeof why), 0, "%s", why);
    /* Freeing a pointer the runtime never gave out: a synchronous, non-sticky
     * error. */
    int x;
    cr_assert_eq(npyl_cuda_free(c, &x), NPYLOAD_ECUDA);
    cr_log_info("%s", npyl_cuda_errmsg(c));
    cr_assert(strstr(npyl_cuda_errmsg(c), "cudaFree(") != NULL, "message: \"%s\"",
              npyl_cuda_errmsg(c));
    cr_assert(strstr(npyl_cuda_errmsg(c), "CUDA error") != NULL);
    char copy[64];
    npyl_cuda_errmsg_copy(c, copy, sizeof copy);
    cr_assert_eq(strncmp(copy, npyl_cuda_errmsg(c), strlen(copy)), 0);
    /* The handle still works. */
    void *d;
    cr_assert_eq(npyl_cuda_malloc(c, &d, 4096), 0, "%s", npyl_cuda_errmsg(c));
    cr_assert_eq(npyl_cuda_free(c, d), 0);
    npyl_cuda_close(c);
}

Test(cuda_gpu, two_handles_share_nothing)
{
    NEED_GPU();
    char why[512];
    npyl_cuda *a = NULL, *b = NULL;
    cr_assert_eq(npyl_cuda_open(&a, 0, why, sizeof why), 0, "%s", why);
    cr_assert_eq(npyl_cuda_open(&b, 0, why, sizeof why), 0, "%s", why);
    int x;
    cr_assert_eq(npyl_cuda_free(a, &x), NPYLOAD_ECUDA);
    cr_assert_str_eq(npyl_cuda_errmsg(b), "", "an error on one handle leaked "
                     "into another");
    npyl_cuda_close(a);
    void *d;
    cr_assert_eq(npyl_cuda_malloc(b, &d, 4096), 0, "closing one handle broke "
                 "the other: %s", npyl_cuda_errmsg(b));
    npyl_cuda_free(b, d);
    npyl_cuda_close(b);
}

Test(cuda_gpu, device_out_of_range_counts_devices)
{
    NEED_GPU();
    char why[512];
    npyl_cuda *c = NULL;
    cr_assert_eq(npyl_cuda_open(&c, 4096, why, sizeof why), NPYLOAD_ENOCUDA);
    cr_assert(strstr(why, "device 4096 out of range (") && strstr(why, "device"),
              "reason: \"%s\"", why);
}

Test(cuda_gpu, h2d_bandwidth_measures)
{
    NEED_GPU();
    double g = 0.0;
    int rc = npyload_cuda_h2d_bandwidth(0, 32u << 20, 8, &g);
    cr_assert_eq(rc, 0, "%s", npyload_strerror(rc));
    cr_log_info("pinned H2D: %.2f GB/s", g);
    /* Any PCIe 3 x16 link or better exceeds 1 GB/s by far: this only guards
     * against unit errors (bytes vs GB, ms vs s). */
    cr_assert_gt(g, 1.0);
    cr_assert_lt(g, 10000.0);
}

Test(cuda_nogpu, compute_sim_refused_with_reason)
{
    char why[256] = "";
    if (npyload_cuda_available(0, why, sizeof why))
        cr_skip_test("a CUDA device is present: the no-GPU path cannot be shown here");
    npyload_compute_sim *s = (npyload_compute_sim *)0x1;
    int rc = npyload_compute_sim_create(0, &s, why, sizeof why);
    cr_assert_eq(rc, NPYLOAD_ENOCUDA, "rc %d", rc);
    cr_assert_null(s);
    cr_assert_neq(why[0], 0, "a reason is given");
    cr_assert_eq(npyload_compute_sim_busy(NULL, 1000), NPYLOAD_EINVAL);
    cr_assert_null(npyload_compute_sim_stream(NULL));
    npyload_compute_sim_destroy(NULL);
}

/* ---- the loader's device path on the fake runtime ---- */

static int (*fake_stream_create)(void **, unsigned);
static int (*fake_stream_sync)(void *);
static int (*fake_memcpy_async)(void *, const void *, size_t, int, void *);

/* A consumer stream of the fake runtime, watched: its syncs are counted
 * apart from the loader's. */
static void *consumer_stream(fake_cudart *f)
{
    void *s = NULL;
    cr_assert_eq(fake_stream_create(&s, 1), 0);
    atomic_store(&f->watch, s);
    return s;
}

/* Loads the fake runtime into this (forked) test process: lib/cuda then
 * opens it, as a runtime the process already has, instead of any real one. */
static fake_cudart *load_fake(void)
{
#ifndef NPYLOAD_FAKE_CUDART
    cr_skip_test("built without tests/gpu/fake_cudart.c");
    return NULL;
#else
    void *h = dlopen(NPYLOAD_FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(h, "%s", dlerror());
    fake_cudart_control_fn ctl = (fake_cudart_control_fn)dlsym(h, "fake_cudart_control");
    cr_assert_not_null(ctl);
    fake_cudart *f = ctl();
    *(void **)&fake_stream_create = dlsym(h, "cudaStreamCreateWithFlags");
    *(void **)&fake_stream_sync = dlsym(h, "cudaStreamSynchronize");
    *(void **)&fake_memcpy_async = dlsym(h, "cudaMemcpyAsync");
    cr_assert(fake_stream_create && fake_stream_sync && fake_memcpy_async);
    npyl_cuda *c = NULL;
    char why[256];
    cr_assert_eq(npyl_cuda_open(&c, 0, why, sizeof why), 0, "%s", why);
    int before = atomic_load(&f->n_set_device);
    cr_assert_eq(npyl_cuda_bind_thread(c), 0);
    cr_assert_eq(atomic_load(&f->n_set_device), before + 1,
                 "lib/cuda did not pick up the fake runtime");
    npyl_cuda_close(c);
    return f;
#endif
}

/* A started device-mode loader over small_field (13 rows of 64 bytes). */
static npyload_loader *fake_loader(const char *glob, int64_t batch, int64_t workers,
                                   int64_t prefetch)
{
    npyload_loader *L = NULL;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", glob), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, batch), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, prefetch), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, 0), 0, "%s",
                 npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    return L;
}

/* The fake's device memory is host memory: compare with the file bytes. */
static void check_fake_batch(npyload_batch *b)
{
    const npyload_array *a = npyload_batch_field(b, 0);
    cr_assert_eq(a->device, 0);
    const int64_t *idx = npyload_batch_indices(b);
    const uint8_t *p = a->data;
    for (size_t r = 0; r < npyload_batch_size(b); r++)
        for (size_t i = 0; i < 64; i++)
            cr_assert_eq(p[r * 64 + i], tu_byte(1, (uint64_t)idx[r], i),
                         "row %zu (sample %lld) byte %zu", r, (long long)idx[r], i);
}

/* The consumer's side of a device batch: its stream waits for the copy, the
 * host waits for its stream (the fake runs queued copies only then), then
 * the bytes are compared with the files'. */
static void consume_fake_batch(npyload_batch *b, void *cs)
{
    cr_assert_eq(npyload_batch_wait_stream(b, cs), 0);
    cr_assert_eq(fake_stream_sync(cs), 0);
    check_fake_batch(b);
}

Test(cuda_fake, workers_release_staging_on_events_not_stream_syncs)
{
    fake_cudart *f = load_fake();
    void *cs = consumer_stream(f);
    char *dir;
    char *glob = small_field(&dir);
    npyload_loader *L = fake_loader(glob, 2, 2, 3);
    size_t rows = 0, batches = 0;
    for (uint64_t e = 0; e < 3; e++) {
        cr_assert_eq(npyload_loader_set_epoch(L, e), 0);
        npyload_batch *b;
        int rc;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            consume_fake_batch(b, cs);
            rows += npyload_batch_size(b);
            batches++;
            npyload_batch_release(b);
        }
        cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    }
    cr_assert_eq(rows, 3 * 13);
    /* The worker never blocks on its stream after a copy: the staging slot
     * is released by the copy's event. (The consumer's own stream syncs are
     * counted apart.) */
    int loader_syncs = atomic_load(&f->n_stream_sync) - atomic_load(&f->n_watch_sync);
    cr_assert_eq(loader_syncs, 0, "%d cudaStreamSynchronize calls by the loader for %zu "
                 "batches", loader_syncs, batches);
    npyload_stats st;
    cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
    cr_assert_eq(st.h2d_bytes, rows * 64);
    int copies = atomic_load(&f->n_memcpy_async);
    cr_assert_eq((size_t)copies, batches, "one copy per batch (one field)");
    npyload_loader_destroy(L);
    /* Every copy's staging event was waited on exactly once before its slot
     * was written again or freed (reuse or destroy); nothing else here waits
     * on events (plain release, no batch_sync). */
    cr_assert_eq(atomic_load(&f->n_event_sync), copies,
                 "%d event waits for %d copies", atomic_load(&f->n_event_sync), copies);
    cr_assert_eq(atomic_load(&f->n_stream_sync) - atomic_load(&f->n_watch_sync), 0);
    free(glob);
    tu_rmtree(dir);
}

/* A batch read by the consumer on its stream, checked later. */
typedef struct late_read {
    uint8_t bytes[3 * 64];
    int64_t idx[3];
    size_t rows;
} late_read;

static void check_late_reads(late_read *r, size_t n)
{
    for (size_t k = 0; k < n; k++)
        for (size_t row = 0; row < r[k].rows; row++)
            for (size_t i = 0; i < 64; i++)
                cr_assert_eq(r[k].bytes[row * 64 + i], tu_byte(1, (uint64_t)r[k].idx[row], i),
                             "read %zu row %zu (sample %lld) byte %zu: overwritten before "
                             "the consumer's stream read it", k, row, (long long)r[k].idx[row], i);
}

/* The host never waits: the consumer's stream waits for each batch, reads it
 * (an async device-to-host copy, run as late as the fake may), and the batch
 * is released on that stream at once. Several workers, deep prefetch, epochs
 * abandoned mid-way, a batch held across destroy. The fake runs every copy
 * as late as CUDA may, so a staging slot written before its copy ran, or a
 * device slot refilled before the consumer's read, shows as wrong bytes. */
Test(cuda_fake, late_copies_deliver_file_bytes)
{
    fake_cudart *f = load_fake();
    void *cs = consumer_stream(f);
    char *dir;
    char *glob = small_field(&dir);
    npyload_loader *L = fake_loader(glob, 3, 3, 4);
    enum { MAXR = 64 };
    late_read *reads = calloc(MAXR, sizeof *reads);
    size_t nr = 0;
    npyload_batch *b, *kept = NULL;
    for (uint64_t e = 0; e < 6; e++) {
        cr_assert_eq(npyload_loader_set_epoch(L, e), 0);
        int rc, k = 0;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            cr_assert_lt(nr, (size_t)MAXR);
            late_read *r = &reads[nr++];
            r->rows = npyload_batch_size(b);
            memcpy(r->idx, npyload_batch_indices(b), r->rows * sizeof *r->idx);
            cr_assert_eq(npyload_batch_wait_stream(b, cs), 0);
            cr_assert_eq(fake_memcpy_async(r->bytes, npyload_batch_field(b, 0)->data,
                                           r->rows * 64, 2 /* D2H */, cs), 0);
            if (e == 5 && !kept) {
                kept = b;
                continue;
            }
            npyload_batch_release_stream(b, cs);
            if (e % 2 && ++k == 2)
                break; /* abandon the epoch with copies in flight */
        }
        cr_assert(rc == 0 || rc == NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    }
    cr_assert_eq(fake_stream_sync(cs), 0);
    check_late_reads(reads, nr);
    npyload_loader_destroy(L);
    cr_assert_not_null(kept);
    check_fake_batch(kept); /* outlives the loader */
    npyload_batch_release_stream(kept, cs);
    free(reads);
    free(glob);
    tu_rmtree(dir);
}

Test(cuda_fake, release_stream_without_context_waits_on_host)
{
    fake_cudart *f = load_fake();
    char *dir;
    char *glob = small_field(&dir);
    void *cs = consumer_stream(f);
    npyload_loader *L = fake_loader(glob, 4, 1, 2);
    npyload_batch *b;
    cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
    consume_fake_batch(b, cs);
    int before = atomic_load(&f->n_watch_sync);
    atomic_store(&f->fail_get_device, 1); /* npyl_cuda_enter fails */
    npyload_batch_release_stream(b, cs);
    atomic_store(&f->fail_get_device, 0);
    /* No event could be recorded: the slot goes back only after a host wait
     * for the stream. */
    cr_assert_eq(atomic_load(&f->n_watch_sync), before + 1,
                 "the slot was handed back without an event or a wait");
    int rc, n = 1;
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        consume_fake_batch(b, cs);
        n++;
        npyload_batch_release_stream(b, cs);
    }
    cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(n, 4);
    npyload_loader_destroy(L);
    free(glob);
    tu_rmtree(dir);
}

/* Neither an event nor a host wait possible: the slot must never come back. */
static void poisoned_release(int null_stream, int fail_sync)
{
    fake_cudart *f = load_fake();
    void *stream = null_stream ? NULL : consumer_stream(f);
    char *dir;
    char *glob = small_field(&dir);
    npyload_loader *L = fake_loader(glob, 4, 1, 1); /* one device slot */
    npyload_batch *b;
    cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
    atomic_store(&f->fail_get_device, 1);
    atomic_store(&f->fail_stream_sync, fail_sync);
    npyload_batch_release_stream(b, stream);
    atomic_store(&f->fail_get_device, 0);
    atomic_store(&f->fail_stream_sync, 0);
    int rc = npyload_loader_next(L, &b);
    cr_assert_eq(rc, NPYLOAD_ECUDA, "next() returned %d (%s)", rc, npyload_strerror(rc));
    const char *m = npyload_loader_errmsg(L);
    cr_log_info("%s", m);
    cr_assert(strstr(m, "releasing batch 0") && strstr(m, "withdrawn"), "message: %s", m);
    cr_assert_eq(npyload_loader_next(L, &b), NPYLOAD_ECUDA, "the failure is sticky");
    /* set_epoch clears the failure, but the only device slot stays out:
     * next() says so instead of waiting forever or reusing it. */
    cr_assert_eq(npyload_loader_set_epoch(L, 1), 0);
    rc = npyload_loader_next(L, &b);
    cr_assert_eq(rc, NPYLOAD_EHELD, "next() returned %d: %s", rc, npyload_loader_errmsg(L));
    cr_assert(strstr(npyload_loader_errmsg(L), "withdrawn"), "%s", npyload_loader_errmsg(L));
    npyload_loader_destroy(L); /* frees the withdrawn slot too (ASan: no leak) */
    free(glob);
    tu_rmtree(dir);
}

Test(cuda_fake, release_null_stream_without_context_poisons_slot)
{
    poisoned_release(1, 0); /* the legacy stream of which device? unknown */
}

Test(cuda_fake, release_stream_wait_failing_poisons_slot)
{
    poisoned_release(0, 1);
}

/* Device mode over .npy.zst: frames decode into the staging slot (2-sample
 * frames: rows are picked through the scratch as well), then the same copy
 * path; the bytes on the "device" are the files'. */
Test(cuda_fake, npy_zst_decodes_into_the_staging_slot)
{
    fake_cudart *f = load_fake();
    void *cs = consumer_stream(f);
    char *dir;
    char *glob = small_field(&dir);
    for (int k = 0; k < 2; k++) {
        char name[32];
        snprintf(name, sizeof name, "x_%04d.npy", k);
        char *p = tu_path(dir, name);
        npyload_pack_options o = {.frame_size = 128, .threads = 1};
        char err[512];
        cr_assert_eq(npyload_pack_file(p, NULL, &o, sizeof o, NULL, 0, err, sizeof err), 0, "%s", err);
        free(p);
    }
    char *zglob = tu_path(dir, "x_*.npy.zst");
    npyload_loader *L = fake_loader(zglob, 3, 2, 3);
    size_t rows = 0;
    for (uint64_t e = 0; e < 2; e++) {
        cr_assert_eq(npyload_loader_set_epoch(L, e), 0);
        npyload_batch *b;
        int rc;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            consume_fake_batch(b, cs);
            rows += npyload_batch_size(b);
            npyload_batch_release(b);
        }
        cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    }
    cr_assert_eq(rows, 2 * 13);
    npyload_stats st;
    cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
    cr_assert_gt(st.compressed_bytes_read, 0);
    cr_assert_eq(st.h2d_bytes, rows * 64);
    npyload_loader_destroy(L);
    free(zglob);
    free(glob);
    tu_rmtree(dir);
}

/* ---- transforms in device mode, on the fake runtime ---- */

/* A transform that needs a kernel: start refuses with the reason (no kernels
 * in this build, or no driver API to load them: the fake is a runtime only),
 * and the loader stays usable for a start without it. */
Test(cuda_fake, device_transform_without_kernels_or_driver_fails_at_start)
{
    load_fake();
    char *dir;
    char *glob = small_field(&dir);
    npyload_loader *L = NULL;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", glob), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 4), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, 0), 0, "%s",
                 npyload_loader_errmsg(L));
    npyload_transform t = {.dtype = NPYLOAD_DTYPE_FLOAT16, .scale = 0.5f};
    cr_assert_eq(npyload_loader_set_transform(L, "x", &t, sizeof t), 0, "%s", npyload_loader_errmsg(L));
    int rc = npyload_loader_start(L);
    const char *m = npyload_loader_errmsg(L);
    cr_log_info("%s", m);
    cr_assert(rc == NPYLOAD_ENOCUDA || rc == NPYLOAD_ECUDA, "start returned %d: %s", rc, m);
    cr_assert(strstr(m, "transform") && (strstr(m, "nvcc") || strstr(m, "libcuda") ||
                                         strstr(m, "kernels")), "message: %s", m);
    cr_assert_eq(npyload_loader_set_transform(L, "x", NULL, 0), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyload_loader_destroy(L);
    free(glob);
    tu_rmtree(dir);
}

/* Random flips (here: signs on (16,) float32 vectors, flipped with
 * probability 1/2) run as kernels in device mode; where the kernels do not
 * load (here: the fake runtime, no driver API) the field falls back to the
 * host engine, says so (npyload_loader_field_engine), and the rows on the
 * (fake) device equal the host mode's rows of the same sample indices,
 * byte for byte, with workers and read-ahead. (test_cuda_kernels runs the
 * kernels themselves on the CPU.) */
static void aug_rows(const char *glob, int64_t device, float *by_index, int *seen, void *cs)
{
    npyload_loader *L = NULL;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", glob), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 4), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, 2), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SEED, 9), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, device), 0, "%s",
                 npyload_loader_errmsg(L));
    const float sign = -1.0f;
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.dtype = NPYLOAD_DTYPE_FLOAT32;
    t.scale = 0.5f;
    t.hflip = 0.5f;
    t.hflip_sign = &sign;
    t.n_hflip_sign = 1;
    cr_assert_eq(npyload_loader_set_transform(L, "x", &t, sizeof t), 0, "%s",
                 npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    char why[1024];
    int eng = npyload_loader_field_engine(L, 0, why, sizeof why);
    cr_log_info("device %lld: %s", (long long)device, why);
    cr_assert_eq(eng, NPYLOAD_ENGINE_HOST, "%d: %s", eng, why);
    /* no driver API here, or (NPYLOAD_CUDA_KERNELS=OFF) no kernels built */
    cr_assert(device < 0 ? strstr(why, "host mode") != NULL
                         : (strstr(why, "did not load") && strstr(why, "libcuda")) ||
                               strstr(why, "NPYLOAD_CUDA_KERNELS=OFF"),
              "%s", why);
    npyload_batch *b;
    int rc;
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        size_t n = npyload_batch_size(b);
        const int64_t *idx = npyload_batch_indices(b);
        float rows[4 * 16];
        if (device >= 0) {
            cr_assert_eq(npyload_batch_wait_stream(b, cs), 0);
            cr_assert_eq(fake_memcpy_async(rows, npyload_batch_field(b, 0)->data,
                                           n * 64, 2 /* D2H */, cs), 0);
            cr_assert_eq(fake_stream_sync(cs), 0);
        } else {
            memcpy(rows, npyload_batch_field(b, 0)->data, n * 64);
        }
        uint8_t hf[4];
        cr_assert_eq(npyload_batch_augment(b, 0, hf, NULL, NULL, NULL), 0);
        for (size_t r = 0; r < n; r++) {
            memcpy(by_index + idx[r] * 16, rows + r * 16, 64);
            seen[idx[r]] = 1 + hf[r];
        }
        if (device >= 0)
            npyload_batch_release_stream(b, cs);
        else
            npyload_batch_release(b);
    }
    cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    npyload_loader_destroy(L);
}

Test(cuda_fake, device_augmentation_falls_back_to_the_host_engine)
{
    fake_cudart *f = load_fake();
    void *cs = consumer_stream(f);
    char *dir;
    char *glob = small_field(&dir);
    float host[13 * 16], dev[13 * 16];
    int hseen[13] = {0}, dseen[13] = {0}, flipped = 0;
    aug_rows(glob, -1, host, hseen, NULL);
    aug_rows(glob, 0, dev, dseen, cs);
    for (int i = 0; i < 13; i++) {
        cr_assert(hseen[i] && hseen[i] == dseen[i], "sample %d", i);
        flipped += hseen[i] == 2;
    }
    cr_assert(flipped > 0 && flipped < 13, "%d of 13 flipped at p = 1/2", flipped);
    cr_assert_arr_eq(host, dev, sizeof host);
    free(glob);
    tu_rmtree(dir);
}

/* A transform that is the identity on the bytes (keep, channels first) needs
 * no kernel; and the synchronous mode (NUM_WORKERS -1) runs the device path
 * (read, copy, publish) on the calling thread: same bytes, the copies
 * ordered by events as with workers. */
Test(cuda_fake, device_sync_mode_and_identity_transform)
{
    fake_cudart *f = load_fake();
    void *cs = consumer_stream(f);
    char *dir;
    char *glob = small_field(&dir);
    npyload_loader *L = NULL;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", glob), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 3), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, NPYLOAD_WORKERS_SYNC), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, 2), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, 0), 0, "%s",
                 npyload_loader_errmsg(L));
    npyload_transform t = {.scale = 1.0f, .dtype = NPYLOAD_DTYPE_KEEP};
    cr_assert_eq(npyload_loader_set_transform(L, "x", &t, sizeof t), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    size_t rows = 0;
    for (uint64_t e = 0; e < 2; e++) {
        cr_assert_eq(npyload_loader_set_epoch(L, e), 0);
        npyload_batch *b;
        int rc;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            consume_fake_batch(b, cs);
            const npyload_array *a = npyload_batch_field(b, 0);
            cr_assert_eq(a->strides[0], 64);
            rows += npyload_batch_size(b);
            npyload_batch_release(b);
        }
        cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    }
    cr_assert_eq(rows, 2 * 13);
    npyload_loader_destroy(L);
    free(glob);
    tu_rmtree(dir);
}

/* ---- the driver table (npyl_cuda_driver) and its users ---- */

static void *fake_driver_lib;

/* Loads the fake driver API (SONAME libcuda.so.1) into this (forked) test
 * process: lib/cuda's dlopen("libcuda.so.1") then finds it. */
static fake_cuda_driver *load_fake_driver(void)
{
#ifndef NPYLOAD_FAKE_CUDA_DRIVER
    cr_skip_test("built without tests/gpu/fake_cuda_driver.c");
    return NULL;
#else
    void *real = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (real) {
        dlclose(real);
        cr_skip_test("a libcuda.so.1 is already loaded in this process: the "
                     "fake driver cannot stand in for it");
    }
    fake_driver_lib = dlopen(NPYLOAD_FAKE_CUDA_DRIVER, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(fake_driver_lib, "%s", dlerror());
    fake_cuda_driver_control_fn ctl =
        (fake_cuda_driver_control_fn)dlsym(fake_driver_lib, "fake_cuda_driver_control");
    cr_assert_not_null(ctl);
    return ctl();
#endif
}

/* A table entry as a data pointer, to compare with dlsym's answer. */
static void *entry(const void *field)
{
    void *p;
    memcpy(&p, field, sizeof p);
    return p;
}

#define DRIVER_PREFIX "CUDA driver API (libcuda.so.1) not loadable: "

/* Where libcuda.so.1 is absent (this project's CI and dev machines): the
 * runtime handle opens without it (the driver table is loaded only on first
 * need), the first need fails with a reason that names the library and the
 * loader's cause, and a handle keeps that answer. */
Test(cuda_fake, driver_table_absent_says_why)
{
    load_fake();
    if (can_dlopen("libcuda.so.1"))
        cr_skip_test("libcuda.so.1 loads on this machine: the missing-driver "
                     "path cannot be shown here");
    npyl_cuda *c = NULL;
    char why[512] = "", again[512] = "";
    cr_assert_eq(npyl_cuda_open(&c, 0, why, sizeof why), 0, "%s", why);
    void *s = NULL, *mem = NULL;
    cr_assert_eq(npyl_cuda_stream_create(c, &s), 0, "%s", npyl_cuda_errmsg(c));
    cr_assert_eq(npyl_cuda_malloc(c, &mem, 64), 0, "%s", npyl_cuda_errmsg(c));
    npyl_cuda_free(c, mem);
    npyl_cuda_stream_destroy(c, s);

    const npyl_cudrv *d = (const npyl_cudrv *)0x1;
    cr_assert_eq(npyl_cuda_driver(c, &d, why, sizeof why), NPYLOAD_ENOCUDA);
    cr_assert_null(d, "*out must be NULL on failure");
    cr_log_info("%s", why);
    cr_assert(strncmp(why, DRIVER_PREFIX, strlen(DRIVER_PREFIX)) == 0 &&
                  strlen(why) > strlen(DRIVER_PREFIX) + 4,
              "the reason names the library and the cause: \"%s\"", why);
    cr_assert_eq(npyl_cuda_driver(c, &d, NULL, 0), NPYLOAD_ENOCUDA);
    /* The answer is the handle's: a driver that appears later (here the
     * fake, loaded now) changes nothing for it; a new handle finds it. */
    load_fake_driver();
    cr_assert_eq(npyl_cuda_driver(c, &d, again, sizeof again), NPYLOAD_ENOCUDA);
    cr_assert_str_eq(again, why);
    npyl_cuda *c2 = NULL;
    cr_assert_eq(npyl_cuda_open(&c2, 0, again, sizeof again), 0, "%s", again);
    cr_assert_eq(npyl_cuda_driver(c2, &d, again, sizeof again), 0, "%s", again);
    cr_assert_not_null(d);
    npyl_cuda_close(c2);
    /* Its users report the same reason under their own name. */
    npyl_tdev *t = (npyl_tdev *)0x1;
    cr_assert_eq(npyl_tdev_open(&t, c, NULL, again, sizeof again), NPYLOAD_ENOCUDA);
    cr_assert_null(t);
    if (npyl_tdev_built(NULL, 0))
        cr_assert(strstr(again, "device transforms: ") && strstr(again, why),
                  "tdev_open: \"%s\"", again);
    npyl_cuda_close(c);
    cr_assert_eq(npyl_cuda_driver(NULL, &d, again, sizeof again), NPYLOAD_EINVAL);
    cr_assert_null(d);
}

/* The compute simulator (bench scaffolding) asks the same table: without
 * the driver, the same reason. */
Test(cuda_fake, compute_sim_without_driver_says_why)
{
    load_fake();
    if (can_dlopen("libcuda.so.1"))
        cr_skip_test("libcuda.so.1 loads on this machine: the missing-driver "
                     "path cannot be shown here");
    char why[512] = "";
    npyload_compute_sim *sim = (npyload_compute_sim *)0x1;
    cr_assert_eq(npyload_compute_sim_create(0, &sim, why, sizeof why), NPYLOAD_ENOCUDA,
                 "%s", why);
    cr_assert_null(sim);
    cr_assert(strncmp(why, DRIVER_PREFIX, strlen(DRIVER_PREFIX)) == 0, "\"%s\"", why);
}

typedef struct driver_ask {
    npyl_cuda *c;
    const npyl_cudrv *got;
    int rc;
} driver_ask;

static void *ask_driver(void *arg)
{
    driver_ask *a = arg;
    a->rc = npyl_cuda_driver(a->c, &a->got, NULL, 0);
    return NULL;
}

/* One table per handle, filled once with every entry point of the driver;
 * threads asking at once all get it; handles share nothing. */
Test(cuda_fake, driver_table_filled_once_per_handle)
{
    load_fake();
    load_fake_driver();
    npyl_cuda *c = NULL, *c2 = NULL;
    char why[512] = "";
    cr_assert_eq(npyl_cuda_open(&c, 0, why, sizeof why), 0, "%s", why);
    cr_assert_eq(npyl_cuda_open(&c2, 0, why, sizeof why), 0, "%s", why);
    const npyl_cudrv *d1 = NULL, *d2 = NULL;
    cr_assert_eq(npyl_cuda_driver(c, &d1, why, sizeof why), 0, "%s", why);
    cr_assert_eq(npyl_cuda_driver(c, &d2, why, sizeof why), 0, "%s", why);
    cr_assert_eq(d1, d2, "a second call returns the same table");
    static const struct {
        size_t off;
        const char *name;
    } entries[] = {
        {offsetof(npyl_cudrv, module_load_data), "cuModuleLoadData"},
        {offsetof(npyl_cudrv, module_unload), "cuModuleUnload"},
        {offsetof(npyl_cudrv, module_get_function), "cuModuleGetFunction"},
        {offsetof(npyl_cudrv, launch_kernel), "cuLaunchKernel"},
        {offsetof(npyl_cudrv, get_error_string), "cuGetErrorString"},
        {offsetof(npyl_cudrv, ctx_get_device), "cuCtxGetDevice"},
        {offsetof(npyl_cudrv, device_get_attribute), "cuDeviceGetAttribute"},
    };
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        cr_assert_eq(entry((const char *)d1 + entries[i].off),
                     dlsym(fake_driver_lib, entries[i].name), "%s", entries[i].name);
    cr_assert_str_eq(npyl_cudrv_strerror(d1, FAKE_CU_LAUNCH_FAILED),
                     "fake driver: injected launch failure");
    cr_assert_str_eq(npyl_cudrv_strerror(d1, 123456), "unknown CUDA driver error");

    enum { NT = 8 };
    pthread_t th[NT];
    driver_ask asks[NT];
    for (int i = 0; i < NT; i++) {
        asks[i] = (driver_ask){.c = c2};
        cr_assert_eq(pthread_create(&th[i], NULL, ask_driver, &asks[i]), 0);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(asks[i].rc, 0);
        cr_assert_eq(asks[i].got, asks[0].got, "thread %d got another table", i);
    }
    cr_assert_neq(asks[0].got, d1, "each handle has its own table");
    npyl_cuda_close(c);
    /* c2's table is its own: still usable after c closed. */
    cr_assert_str_eq(npyl_cudrv_strerror(asks[0].got, FAKE_CU_NOT_FOUND),
                     "fake driver: injected named symbol not found");
    npyl_cuda_close(c2);
}

/* The tests of the embedded fatbin need one (NPYLOAD_CUDA_KERNELS=NVRTC
 * or a build without nvcc has none; the NVRTC tests below cover those). */
#define SKIP_WITHOUT_KERNELS()                                                 \
    do {                                                                       \
        char why_[512];                                                        \
        if (!npyl_tdev_aot_built(why_, sizeof why_))                           \
            cr_skip_test("%s", why_);                                          \
    } while (0)

/* The device transform engine's host side on the fake driver: the embedded
 * fatbin is what it loads, every kernel is looked up once, a run launches
 * the plan's kernel with the plan's geometry and parameters, and failures
 * name the call and the driver's reason. */
Test(cuda_fake, device_transform_engine_on_the_driver_table)
{
    SKIP_WITHOUT_KERNELS();
    load_fake();
    fake_cuda_driver *fd = load_fake_driver();
    npyl_cuda *c = NULL;
    char err[512] = "";
    cr_assert_eq(npyl_cuda_open(&c, 0, err, sizeof err), 0, "%s", err);
    npyl_tdev *t = NULL;
    cr_assert_eq(npyl_tdev_open(&t, c, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(atomic_load(&fd->n_module_load), 1);
    cr_assert_eq(fd->last_image, FAKE_IMAGE_FATBIN, "the embedded kernels are a fatbin");
    cr_assert_eq(atomic_load(&fd->n_get_function), 2 * (11 * 3 + 5),
                 "11 input x 3 output conversions and 5 permutations, as stored "
                 "(npyl_tk_*) and through the rows' records (npyl_tkx_*)");

    const int64_t shp[] = {3, 5, 7};
    const float mean[3] = {0.5f, 1.0f, 2.0f}, std[3] = {0.25f, 2.0f, 4.0f};
    npyload_transform tr = {.dtype = NPYLOAD_DTYPE_FLOAT16, .scale = 2.0f,
                            .mean = mean, .n_mean = 3, .std = std, .n_std = 3,
                            .channels_last = 1};
    npyl_tplan p;
    cr_assert_eq(npyl_transform_plan("x", &tr, "|u1", 3, shp, &p, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(npyl_tdev_plan_check("x", &p, err, sizeof err), 0, "%s", err);
    void *stream = (void *)0x5151, *src = (void *)0x1000, *dst = (void *)0x2000;
    cr_assert_eq(npyl_tdev_run(t, &p, src, dst, 9, stream, err, sizeof err), 0, "%s", err);
    cr_assert_eq(atomic_load(&fd->n_launch), 1);
    cr_assert_str_eq(fd->last_kernel, "npyl_tk_u1_f2");
    cr_assert_eq(fd->last_grid[0], (unsigned)((p.C * p.S + 255) / 256));
    cr_assert_eq(fd->last_grid[1], 9);
    cr_assert_eq(fd->last_grid[2], 1);
    cr_assert_eq(fd->last_block[0], 256);
    cr_assert_eq(fd->last_stream, stream);
    npyl_tk_params P;
    memcpy(&P, fd->last_params, sizeof P);
    cr_assert_eq(P.src, src);
    cr_assert_eq(P.dst, dst);
    cr_assert_eq(P.rows, 9);
    cr_assert_eq(P.C, p.C);
    cr_assert_eq(P.S, p.S);
    cr_assert_eq(P.channels_last, 1);
    cr_assert_eq(P.arith, p.arith);
    cr_assert_eq(P.per_channel, 1);
    cr_assert_eq(P.scale, p.scale);
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(P.mean[k], p.mean[k]);
        cr_assert_eq(P.std[k], p.std[k]);
    }
    npyl_transform_plan_free(&p);

    /* keep + channels-last: the permutation kernel of the item size */
    npyload_transform keep = {.dtype = NPYLOAD_DTYPE_KEEP, .scale = 1.0f, .channels_last = 1};
    cr_assert_eq(npyl_transform_plan("x", &keep, "<f4", 3, shp, &p, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(npyl_tdev_run(t, &p, src, dst, 2, stream, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(fd->last_kernel, "npyl_tk_perm4");

    atomic_store(&fd->fail_launch, 1);
    cr_assert_eq(npyl_tdev_run(t, &p, src, dst, 2, stream, err, sizeof err), NPYLOAD_ECUDA);
    cr_assert(strstr(err, "cuLaunchKernel") && strstr(err, "injected launch failure"),
              "\"%s\"", err);
    atomic_store(&fd->fail_launch, 0);
    npyl_transform_plan_free(&p);
    npyl_tdev_close(t);
    cr_assert_eq(atomic_load(&fd->n_module_unload), 1);

    atomic_store(&fd->fail_module_load, 1);
    t = (npyl_tdev *)0x1;
    cr_assert_eq(npyl_tdev_open(&t, c, NULL, err, sizeof err), NPYLOAD_ECUDA);
    cr_assert_null(t);
    cr_assert(strstr(err, "loading the kernels failed") && strstr(err, "injected invalid image"),
              "\"%s\"", err);
    cr_assert_eq(atomic_load(&fd->n_module_unload), 1, "nothing loaded, nothing unloaded");
    atomic_store(&fd->fail_module_load, 0);
    atomic_store(&fd->fail_get_function, 1);
    cr_assert_eq(npyl_tdev_open(&t, c, NULL, err, sizeof err), NPYLOAD_ECUDA);
    cr_assert(strstr(err, "kernel npyl_tk_u1_f4 missing") && strstr(err, "symbol not found"),
              "\"%s\"", err);
    cr_assert_eq(atomic_load(&fd->n_module_unload), 2, "the module loaded is unloaded");
    npyl_cuda_close(c);
}

/* A device-mode loader with a transform that needs a kernel: it loads the
 * kernels once through its handle's driver table, launches one kernel per
 * batch, and unloads them at destroy. (The fake runs no kernel: the bytes
 * are not checked here; tests/gpu/test_gpu_transform.c does on a GPU.) */
Test(cuda_fake, loader_device_transform_launches_through_the_driver_table)
{
    SKIP_WITHOUT_KERNELS();
    load_fake();
    fake_cuda_driver *fd = load_fake_driver();
    char *dir;
    char *glob = small_field(&dir);
    npyload_loader *L = NULL;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", glob), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 4), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, 2), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, 2), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, 0), 0, "%s",
                 npyload_loader_errmsg(L));
    npyload_transform t = {.dtype = NPYLOAD_DTYPE_FLOAT16, .scale = 0.5f};
    cr_assert_eq(npyload_loader_set_transform(L, "x", &t, sizeof t), 0, "%s",
                 npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(atomic_load(&fd->n_module_load), 1);
    int batches = 0;
    for (uint64_t e = 0; e < 2; e++) {
        cr_assert_eq(npyload_loader_set_epoch(L, e), 0);
        npyload_batch *b;
        int rc;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            const npyload_array *a = npyload_batch_field(b, 0);
            cr_assert_str_eq(a->descr, "<f2");
            cr_assert_eq(a->device, 0);
            batches++;
            npyload_batch_release(b);
        }
        cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    }
    cr_assert_eq(batches, 2 * 4, "13 rows in batches of 4, two epochs");
    cr_assert_eq(atomic_load(&fd->n_launch), batches, "one kernel per batch");
    cr_assert_str_eq(fd->last_kernel, "npyl_tk_f4_f2");
    cr_assert_eq(atomic_load(&fd->n_module_load), 1, "the kernels are loaded once");
    npyload_loader_destroy(L);
    cr_assert_eq(atomic_load(&fd->n_module_unload), 1);
    free(glob);
    tu_rmtree(dir);
}

/* ---- NVRTC: the run-time path of the device kernels ----
 *
 * NVRTC comes from the nvidia-cuda-nvrtc wheel (pyproject.toml's test
 * extra) in the site-packages of the Python scripts/setup-deps.sh installs
 * into; these tests find it through the product's own search
 * (npyl_nvrtc_open with those directories as package roots) and skip,
 * visibly, where it is not installed. */

#ifndef NPYLOAD_TEST_SITE_DIRS
#define NPYLOAD_TEST_SITE_DIRS ""
#endif
#ifndef NPYLOAD_TEST_PTXAS
#define NPYLOAD_TEST_PTXAS ""
#endif

/* The wheel's directory, or a visible skip. */
static void need_nvrtc_wheel(char *dir, size_t len)
{
    if (!tu_nvrtc_wheel_dir(NPYLOAD_TEST_SITE_DIRS, dir, len))
        cr_skip_test("the nvidia-cuda-nvrtc wheel is not installed in the test "
                     "Python's site-packages (%s): `pip install nvidia-cuda-nvrtc`",
                     NPYLOAD_TEST_SITE_DIRS);
}

/* The site-packages directories as package roots, nothing else. */
typedef struct site_roots {
    char buf[4096];
    const char *roots[16];
    npyl_nvrtc_where w;
} site_roots;

static const npyl_nvrtc_where *wheel_only_search(site_roots *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->buf, sizeof r->buf, "%s", NPYLOAD_TEST_SITE_DIRS);
    char *save = NULL;
    for (char *t = strtok_r(r->buf, ":", &save); t && r->w.nroots < 16;
         t = strtok_r(NULL, ":", &save))
        r->roots[r->w.nroots++] = t;
    r->w.roots = r->roots;
    r->w.no_system = 1;
    return &r->w;
}

/* Every kernel npyl_tdev_open looks up, by name: both families (as stored,
 * and through the rows' records: augmentation, narrowed codes). */
static void expect_every_entry(const char *ptx)
{
    static const char *const in[] = {"u1", "i1", "u2", "i2", "u4", "i4",
                                     "u8", "i8", "f2", "f4", "f8"};
    static const char *const outs[] = {"f4", "f2", "bf"};
    static const char *const fam[] = {"npyl_tk", "npyl_tkx"}, *const move[] = {"perm", "keep"};
    char name[64];
    for (size_t x = 0; x < 2; x++) {
        for (size_t i = 0; i < 11; i++)
            for (size_t o = 0; o < 3; o++) {
                snprintf(name, sizeof name, ".entry %s_%s_%s(", fam[x], in[i], outs[o]);
                cr_assert_not_null(strstr(ptx, name), "PTX lacks %s", name);
            }
        static const int perm[] = {1, 2, 4, 8, 16};
        for (size_t k = 0; k < 5; k++) {
            snprintf(name, sizeof name, ".entry %s_%s%d(", fam[x], move[x], perm[k]);
            cr_assert_not_null(strstr(ptx, name), "PTX lacks %s", name);
        }
    }
}

/* The product's search finds the wheel; the embedded source compiles to PTX
 * that holds every kernel and that ptxas assembles for sm_80 and sm_90, and
 * to a cubin for sm_90. */
Test(nvrtc, wheel_found_and_source_compiles_for_sm80_sm90)
{
    char why[2048] = "", wheel[1024];
    if (!npyl_nvrtc_source_built(why, sizeof why))
        cr_skip_test("%s", why);
    need_nvrtc_wheel(wheel, sizeof wheel);
    site_roots r;
    npyl_nvrtc *n = NULL;
    cr_assert_eq(npyl_nvrtc_open(&n, wheel_only_search(&r), why, sizeof why), 0, "%s", why);
    cr_log_info("NVRTC %d: %s", npyl_nvrtc_version(n), npyl_nvrtc_path(n));
    cr_assert(strncmp(npyl_nvrtc_path(n), wheel, strlen(wheel)) == 0 ||
                  strstr(npyl_nvrtc_path(n), "/nvidia/"),
              "found %s, the wheel is in %s", npyl_nvrtc_path(n), wheel);
    cr_assert_geq(npyl_nvrtc_version(n), 11020);

    npyl_kimage k;
    cr_assert_eq(npyl_nvrtc_compile(n, 80, 1, &k, why, sizeof why), 0, "%s", why);
    cr_assert_eq(k.ptx, 1);
    cr_assert_eq(k.arch, 80);
    cr_assert_eq(strlen(k.data), k.len - (((char *)k.data)[k.len - 1] == '\0'),
                 "PTX is one NUL-terminated text");
    cr_assert_not_null(strstr(k.data, ".target sm_80"));
    expect_every_entry(k.data);

    npyl_kimage cub;
    cr_assert_eq(npyl_nvrtc_compile(n, 90, 0, &cub, why, sizeof why), 0, "%s", why);
    cr_assert_eq(cub.ptx, 0);
    cr_assert(cub.len > 1024 && memcmp(cub.data, "\177ELF", 4) == 0, "a cubin is an ELF file");
    cr_assert_not_null(strstr(cub.from, "sm_90 cubin"), "%s", cub.from);
    npyl_kimage_free(&cub);
    npyl_nvrtc_close(n);

    if (!NPYLOAD_TEST_PTXAS[0]) {
        npyl_kimage_free(&k);
        cr_skip_test("ptxas not found (CUDA toolkit): NVRTC's PTX compiled and "
                     "holds every kernel, not assembled");
    }
    char *dir = tu_mkdtemp("nvrtc");
    char ptx[1100], cmd[4096];
    snprintf(ptx, sizeof ptx, "%s/kernels.ptx", dir);
    FILE *f = fopen(ptx, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(k.data, 1, strlen(k.data), f), strlen(k.data));
    fclose(f);
    npyl_kimage_free(&k);
    static const char *const archs[] = {"sm_80", "sm_90"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "'%s' -arch=%s '%s' -o '%s/%s.cubin'", NPYLOAD_TEST_PTXAS,
                 archs[i], ptx, dir, archs[i]);
        int st = system(cmd);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: exit status %d", cmd, st);
    }
    tu_rmtree(dir);
}

/* A missing NVRTC says what to install: an override that names nothing, an
 * override directory without libnvrtc, and an empty search. */
Test(nvrtc, missing_nvrtc_names_what_to_install)
{
    char why[2048] = "";
    npyl_nvrtc *n = (npyl_nvrtc *)0x1;
    npyl_nvrtc_where w = {.override = "/nonexistent/npyload/libnvrtc.so.13"};
    cr_assert_eq(npyl_nvrtc_open(&n, &w, why, sizeof why), NPYLOAD_ENOCUDA);
    cr_assert_null(n);
    cr_log_info("%s", why);
    cr_assert(strstr(why, "NVRTC (libnvrtc) not found at the path given") &&
                  strstr(why, "/nonexistent/npyload/libnvrtc.so.13") &&
                  strstr(why, "No such file") &&
                  strstr(why, "pip install nvidia-cuda-nvrtc") && strstr(why, "NPYLOAD_NVRTC"),
              "\"%s\"", why);

    char *dir = tu_mkdtemp("nvrtc");
    w.override = dir;
    cr_assert_eq(npyl_nvrtc_open(&n, &w, why, sizeof why), NPYLOAD_ENOCUDA);
    cr_assert(strstr(why, dir) && strstr(why, "pip install nvidia-cuda-nvrtc"), "\"%s\"", why);
    /* A file that is not NVRTC is named with the loader's reason. */
    char bogus[1100];
    snprintf(bogus, sizeof bogus, "%s/libnvrtc.so.13", dir);
    FILE *f = fopen(bogus, "w");
    cr_assert_not_null(f);
    fputs("not a library", f);
    fclose(f);
    cr_assert_eq(npyl_nvrtc_open(&n, &w, why, sizeof why), NPYLOAD_ENOCUDA);
    cr_assert(strstr(why, bogus) && strstr(why, "pip install"), "\"%s\"", why);

    npyl_nvrtc_where none = {.no_system = 1};
    cr_assert_eq(npyl_nvrtc_open(&n, &none, why, sizeof why), NPYLOAD_ENOCUDA);
    cr_assert(strstr(why, "NVRTC (libnvrtc) not found: tried") &&
                  strstr(why, "pip install nvidia-cuda-nvrtc") && strstr(why, "CUDA toolkit"),
              "\"%s\"", why);
    npyl_kimage k;
    cr_assert_eq(npyl_nvrtc_kernels(&none, dir, 0, 80, &k, why, sizeof why), NPYLOAD_ENOCUDA);
    cr_assert_null(k.data);
    tu_rmtree(dir);
}

/* The product's places: the runtime's directory, the site-packages above a
 * runtime from a wheel, and the one above this code's file. */
Test(nvrtc, default_search_follows_the_runtime_and_the_library)
{
    npyl_nvrtc_places p;
    const npyl_nvrtc_where *w =
        npyl_nvrtc_default_where(&p, "", "/venv/site/nvidia/cu13/lib/libcudart.so.13");
    cr_assert_null(w->override, "an empty override means none");
    cr_assert_eq(w->ndirs, 1);
    cr_assert_str_eq(w->dirs[0], "/venv/site/nvidia/cu13/lib");
    /* (and the root above this code's file when that is a shared object:
     * the main program has no name of its own for dladdr) */
    cr_assert_geq(w->nroots, 1);
    cr_assert_str_eq(w->roots[0], "/venv/site/nvidia/cu13/lib/../../..");
    cr_assert_eq(w->no_system, 0);
    w = npyl_nvrtc_default_where(&p, "/x/libnvrtc.so.12", "/usr/local/cuda/lib64/libcudart.so.13");
    cr_assert_str_eq(w->override, "/x/libnvrtc.so.12");
    cr_assert_str_eq(w->dirs[0], "/usr/local/cuda/lib64");
    cr_assert_leq(w->nroots, 1, "no wheel above a toolkit's runtime");
    for (size_t i = 0; i < w->nroots; i++)
        cr_assert(strstr(w->roots[i], "/..") && !strstr(w->roots[i], "cuda/lib64"), "%s",
                  w->roots[i]);
}

static size_t count_cached(const char *dir, const char *suffix)
{
    char pat[1100];
    snprintf(pat, sizeof pat, "%s/npyload-transform-*-%s", dir, suffix);
    glob_t g;
    size_t n = glob(pat, 0, NULL, &g) == 0 ? g.gl_pathc : 0;
    if (n)
        globfree(&g);
    return n;
}

/* The engine on the fake driver with NVRTC: a cubin for the device's
 * architecture is what it loads; the cache keeps it, and a later open
 * (even with NVRTC gone) uses it; another architecture compiles again; a
 * fatbin that does not cover the GPU falls back to NVRTC. */
Test(cuda_fake, device_transform_engine_compiles_with_nvrtc_and_caches)
{
    char err[2048] = "", wheel[1024];
    if (!npyl_nvrtc_source_built(err, sizeof err))
        cr_skip_test("%s", err);
    need_nvrtc_wheel(wheel, sizeof wheel);
    load_fake();
    fake_cuda_driver *fd = load_fake_driver();
    npyl_cuda *c = NULL;
    cr_assert_eq(npyl_cuda_open(&c, 0, err, sizeof err), 0, "%s", err);
    char *cache = tu_mkdtemp("kcache");
    char sub[1100];
    snprintf(sub, sizeof sub, "%s/made/by/open", cache);
    npyl_tdev_cfg cfg = {.mode = NPYL_TDEV_NVRTC, .nvrtc = wheel, .cache_dir = sub};
    npyl_tdev *t = NULL;
    cr_assert_eq(npyl_tdev_open(&t, c, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(fd->last_image, FAKE_IMAGE_CUBIN, "NVRTC made a cubin for the device");
    cr_assert(strstr(npyl_tdev_source(t), "NVRTC") && strstr(npyl_tdev_source(t), "sm_80 cubin"),
              "%s", npyl_tdev_source(t));
    cr_assert_eq(atomic_load(&fd->n_get_function), 2 * (11 * 3 + 5));
    npyl_tdev_close(t);
    cr_assert_eq(count_cached(sub, "sm_80.cubin"), 1);

    cfg.nvrtc = "/nonexistent/libnvrtc.so.13"; /* the cache needs no NVRTC */
    cr_assert_eq(npyl_tdev_open(&t, c, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert(strncmp(npyl_tdev_source(t), "cache ", 6) == 0, "%s", npyl_tdev_source(t));
    cr_assert_eq(fd->last_image, FAKE_IMAGE_CUBIN);
    npyl_tdev_close(t);

    atomic_store(&fd->cc_major, 9); /* another GPU: not in the cache */
    cr_assert_eq(npyl_tdev_open(&t, c, &cfg, err, sizeof err), NPYLOAD_ENOCUDA);
    cr_assert(strstr(err, "device transforms: NVRTC (libnvrtc) not found") &&
                  strstr(err, "pip install nvidia-cuda-nvrtc"), "\"%s\"", err);
    cfg.nvrtc = wheel;
    cr_assert_eq(npyl_tdev_open(&t, c, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_not_null(strstr(npyl_tdev_source(t), "sm_90 cubin"), "%s", npyl_tdev_source(t));
    npyl_tdev_close(t);
    cr_assert_eq(count_cached(sub, "sm_90.cubin"), 1);

    /* A fatbin the driver has no image in for this GPU: NVRTC takes over
     * in AUTO, and AOT says why it cannot. */
    if (npyl_tdev_aot_built(NULL, 0)) {
        atomic_store(&fd->fatbin_no_binary, 1);
        cfg.mode = NPYL_TDEV_AUTO;
        cfg.cache_dir = NULL;
        cr_assert_eq(npyl_tdev_open(&t, c, &cfg, err, sizeof err), 0, "%s", err);
        cr_assert_eq(fd->last_image, FAKE_IMAGE_CUBIN);
        npyl_tdev_close(t);
        cfg.nvrtc = "/nonexistent/libnvrtc.so.13";
        cr_assert_eq(npyl_tdev_open(&t, c, &cfg, err, sizeof err), NPYLOAD_ENOCUDA);
        cr_assert(strstr(err, "the embedded fatbin") && strstr(err, "no kernel image") &&
                      strstr(err, "pip install nvidia-cuda-nvrtc"), "\"%s\"", err);
        cfg.mode = NPYL_TDEV_AOT;
        cr_assert_eq(npyl_tdev_open(&t, c, &cfg, err, sizeof err), NPYLOAD_ECUDA);
        cr_assert(strstr(err, "loading the kernels failed"), "\"%s\"", err);
    }
    npyl_cuda_close(c);
    tu_rmtree(cache);
}

/* The loader passes its options through: DEVICE_KERNELS = 2 compiles with
 * the NVRTC of NPYLOAD_PATH_NVRTC into NPYLOAD_PATH_KERNEL_CACHE; paths
 * are refused after start and for an unknown name. */
Test(cuda_fake, loader_device_kernels_nvrtc_through_its_paths)
{
    char wheel[1024], why[256];
    if (!npyl_nvrtc_source_built(why, sizeof why))
        cr_skip_test("%s", why);
    need_nvrtc_wheel(wheel, sizeof wheel);
    load_fake();
    fake_cuda_driver *fd = load_fake_driver();
    char *dir;
    char *glob = small_field(&dir);
    char cache[1100];
    snprintf(cache, sizeof cache, "%s/kernels", dir);
    npyload_loader *L = NULL;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", glob), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 4), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, 0), 0, "%s",
                 npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE_KERNELS, 3), NPYLOAD_EINVAL);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE_KERNELS, 2), 0);
    cr_assert_eq(npyload_loader_set_path(L, (npyload_path_option)7, "x"), NPYLOAD_EINVAL);
    cr_assert_eq(npyload_loader_set_path(L, NPYLOAD_PATH_NVRTC, "/nonexistent"), 0);
    cr_assert_eq(npyload_loader_set_path(L, NPYLOAD_PATH_NVRTC, wheel), 0);
    cr_assert_eq(npyload_loader_set_path(L, NPYLOAD_PATH_KERNEL_CACHE, cache), 0);
    npyload_transform t = {.dtype = NPYLOAD_DTYPE_FLOAT16, .scale = 0.5f};
    cr_assert_eq(npyload_loader_set_transform(L, "x", &t, sizeof t), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(fd->last_image, FAKE_IMAGE_CUBIN);
    cr_assert_eq(count_cached(cache, "sm_80.cubin"), 1);
    cr_assert_eq(npyload_loader_set_path(L, NPYLOAD_PATH_NVRTC, NULL), NPYLOAD_ESTATE);
    npyload_batch *b;
    cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_str_eq(fd->last_kernel, "npyl_tk_f4_f2");
    npyload_batch_release(b);
    npyload_loader_destroy(L);

    /* Without NVRTC and without a cache: start fails naming what to install. */
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", glob), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 4), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, 0), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE_KERNELS, 2), 0);
    cr_assert_eq(npyload_loader_set_path(L, NPYLOAD_PATH_NVRTC, "/nonexistent/libnvrtc.so"), 0);
    cr_assert_eq(npyload_loader_set_transform(L, "x", &t, sizeof t), 0);
    cr_assert_eq(npyload_loader_start(L), NPYLOAD_ENOCUDA);
    cr_assert(strstr(npyload_loader_errmsg(L), "loading the transform kernels failed") &&
                  strstr(npyload_loader_errmsg(L), "pip install nvidia-cuda-nvrtc"),
              "%s", npyload_loader_errmsg(L));
    npyload_loader_destroy(L);
    free(glob);
    tu_rmtree(dir);
}

/* The compute simulator on the same table: its PTX loaded, its one-thread
 * kernel launched on its stream with the time asked. */
Test(cuda_fake, compute_sim_launches_through_the_driver_table)
{
    load_fake();
    fake_cuda_driver *fd = load_fake_driver();
    char why[512] = "";
    npyload_compute_sim *sim = NULL;
    cr_assert_eq(npyload_compute_sim_create(0, &sim, why, sizeof why), 0, "%s", why);
    cr_assert_eq(atomic_load(&fd->n_module_load), 1);
    cr_assert_eq(fd->last_image, FAKE_IMAGE_PTX);
    cr_assert_eq(npyload_compute_sim_busy(sim, 12345), 0);
    cr_assert_eq(atomic_load(&fd->n_launch), 1);
    cr_assert_str_eq(fd->last_kernel, "npyload_busy");
    cr_assert_eq(fd->last_grid[0] * fd->last_grid[1] * fd->last_block[0], 1);
    cr_assert_eq(fd->last_stream, npyload_compute_sim_stream(sim));
    uint64_t ns;
    memcpy(&ns, fd->last_params, sizeof ns);
    cr_assert_eq(ns, 12345);
    atomic_store(&fd->fail_launch, 1);
    cr_assert_eq(npyload_compute_sim_busy(sim, 1), NPYLOAD_ECUDA);
    npyload_compute_sim_destroy(sim);
    cr_assert_eq(atomic_load(&fd->n_module_unload), 1);
}

/* ---- npyload_get_build_info's CUDA facts ---- */

/* Without a device it says what npyload_cuda_available says, word for word,
 * and a runtime exactly when one of the sonames loads here. */
Test(cuda_nogpu, build_info_says_what_available_says)
{
    SKIP_IF_GPU();
    npyload_build_info bi;
    char avail[512] = "";
    cr_assert_eq(npyload_get_build_info(&bi, sizeof bi), 0);
    npyload_cuda_available(0, avail, sizeof avail);
    cr_assert_eq(bi.cuda_devices, 0);
    cr_assert_str_eq(bi.cuda_why, avail);
    int rt = can_dlopen("libcudart.so.13") || can_dlopen("libcudart.so.12") ||
             can_dlopen("libcudart.so.11.0") || can_dlopen("libcudart.so");
    cr_assert_eq(bi.cuda_runtime_found, rt, "found %d, a libcudart %s", bi.cuda_runtime_found,
                 rt ? "loads" : "does not load");
    if (!rt) {
        cr_assert_str_eq(bi.cuda_runtime_path, "");
        cr_assert_eq(bi.cuda_runtime_version, 0);
    }
}

/* With a runtime (the fake one, 1 device, CUDA 13.0): the file it was
 * loaded from, its soname, both versions and the device count. */
Test(cuda_fake, build_info_names_the_runtime_and_counts_devices)
{
    load_fake();
#ifdef NPYLOAD_FAKE_CUDART
    npyload_build_info bi;
    cr_assert_eq(npyload_get_build_info(&bi, sizeof bi), 0);
    cr_assert_eq(bi.cuda_runtime_found, 1);
    cr_assert_eq(bi.cuda_devices, 1);
    cr_assert_str_eq(bi.cuda_why, "");
    cr_assert_eq(bi.cuda_runtime_version, 13000);
    cr_assert_eq(bi.cuda_driver_version, 13000);
    cr_assert_str_eq(bi.cuda_runtime_soname, "libcudart.so.13");
    char a[4096], b[4096];
    cr_assert_not_null(realpath(NPYLOAD_FAKE_CUDART, a));
    cr_assert_not_null(realpath(bi.cuda_runtime_path, b), "%s", bi.cuda_runtime_path);
    cr_assert_str_eq(a, b);
#endif
}
