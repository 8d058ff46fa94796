/* A stand-in for a training step on the GPU: a stream and a kernel that
 * spins for a given time on it. npyload-bench and tests use it to measure the
 * stall a trainer would see, and to show that copies overlap compute, from C
 * code that has no CUDA headers and no nvcc.
 *
 * The kernel is PTX text, JIT-compiled by the driver for whatever GPU is
 * present (cuModuleLoadData), so the library needs no CUDA toolkit at build
 * time. The driver API comes from the handle's driver table
 * (npyl_cuda_driver, loaded on first need); it works on the primary context
 * that the runtime makes current, so the runtime's stream is a valid
 * CUstream for cuLaunchKernel.
 *
 * Experimental API (npyload.h, NPYLOAD_EXPERIMENTAL): the bench's and the
 * tests'; it uses lib/cuda's driver table (no dlopen of its own). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_cuda.h"

/* Spins until %globaltimer (ns) has advanced by `ns` from the kernel's start.
 * One thread: the point is to occupy the stream, not the SMs. */
static const char BUSY_PTX[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry npyload_busy(.param .u64 npyload_busy_ns)\n"
    "{\n"
    "  .reg .pred %p;\n"
    "  .reg .b64 %n, %t0, %t1, %d;\n"
    "  ld.param.u64 %n, [npyload_busy_ns];\n"
    "  mov.u64 %t0, %globaltimer;\n"
    "SPIN:\n"
    "  mov.u64 %t1, %globaltimer;\n"
    "  sub.u64 %d, %t1, %t0;\n"
    "  setp.lt.u64 %p, %d, %n;\n"
    "  @%p bra SPIN;\n"
    "  ret;\n"
    "}\n";

struct npyload_compute_sim {
    npyl_cuda *cuda;
    void *stream;
    const npyl_cudrv *drv; /* cuda's driver table */
    void *module;   /* CUmodule */
    void *busy;     /* CUfunction */
};

void npyload_compute_sim_destroy(npyload_compute_sim *s)
{
    if (!s)
        return;
    int prev = -1, entered = s->cuda && npyl_cuda_enter(s->cuda, &prev) == 0;
    if (s->stream) {
        npyl_cuda_stream_sync(s->cuda, s->stream);
        npyl_cuda_stream_destroy(s->cuda, s->stream);
    }
    if (s->module)
        s->drv->module_unload(s->module);
    if (entered)
        npyl_cuda_leave(s->cuda, prev);
    npyl_cuda_close(s->cuda);
    free(s);
}

int npyload_compute_sim_create(int device, npyload_compute_sim **out, char *why,
                               size_t whylen)
{
    if (!out)
        return npyl_fail(why, whylen, NPYLOAD_EINVAL, "out is NULL");
    *out = NULL;
    npyload_compute_sim *s = calloc(1, sizeof *s);
    if (!s)
        return npyl_fail(why, whylen, -ENOMEM, "out of memory");
    int rc = npyl_cuda_open(&s->cuda, device, why, whylen);
    if (rc) {
        free(s);
        return rc;
    }
    int prev = -1, entered = 0;
    if ((rc = npyl_cuda_enter(s->cuda, &prev)) != 0) {
        npyl_fail(why, whylen, rc, "%s", npyl_cuda_errmsg(s->cuda));
        goto fail;
    }
    entered = 1;
    if ((rc = npyl_cuda_stream_create(s->cuda, &s->stream)) != 0) {
        npyl_fail(why, whylen, rc, "%s", npyl_cuda_errmsg(s->cuda));
        goto fail;
    }
    if ((rc = npyl_cuda_driver(s->cuda, &s->drv, why, whylen)) != 0)
        goto fail;
    int e = s->drv->module_load_data(&s->module, BUSY_PTX);
    if (e != 0)
        s->module = NULL;
    else
        e = s->drv->module_get_function(&s->busy, s->module, "npyload_busy");
    if (e != 0) {
        rc = npyl_fail(why, whylen, NPYLOAD_ECUDA,
                       "loading the busy kernel's PTX failed: %s (CUresult %d)",
                       npyl_cudrv_strerror(s->drv, e), e);
        goto fail;
    }
    npyl_cuda_leave(s->cuda, prev);
    *out = s;
    return 0;
fail:
    if (entered)
        npyl_cuda_leave(s->cuda, prev);
    npyload_compute_sim_destroy(s);
    return rc;
}

void *npyload_compute_sim_stream(const npyload_compute_sim *s)
{
    return s ? s->stream : NULL;
}

int npyload_compute_sim_busy(npyload_compute_sim *s, uint64_t ns)
{
    if (!s)
        return NPYLOAD_EINVAL;
    int prev, rc = npyl_cuda_enter(s->cuda, &prev);
    if (rc)
        return rc;
    void *args[] = {&ns};
    int e = s->drv->launch_kernel(s->busy, 1, 1, 1, 1, 1, 1, 0, s->stream, args, NULL);
    npyl_cuda_leave(s->cuda, prev);
    return e == 0 ? 0 : NPYLOAD_ECUDA;
}

int npyload_compute_sim_sync(npyload_compute_sim *s)
{
    if (!s)
        return NPYLOAD_EINVAL;
    int prev, rc = npyl_cuda_enter(s->cuda, &prev);
    if (rc)
        return rc;
    rc = npyl_cuda_stream_sync(s->cuda, s->stream);
    npyl_cuda_leave(s->cuda, prev);
    return rc;
}
