/* The device transform engine's host side: loads the embedded kernels
 * (npyload_transform_kernels.cu, built by nvcc into a fatbin at build time)
 * into the current CUDA context through the driver API, and launches them.
 *
 * libcuda.so.1 is dlopen'd here, by each npyl_tdev (reference counted by
 * the dynamic loader: no global state), as lib/cuda/npyload_cuda_sim.c does
 * for its PTX; the runtime's streams are valid CUstreams on the primary
 * context that the runtime makes current. Without nvcc at build time there
 * is no fatbin, and npyl_tdev_built() / npyl_tdev_plan_check() say so. */
#include "npyload_transform.h"
#include "npyload_transform_kparams.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef NPYLOAD_HAVE_TRANSFORM_KERNELS
#include "npyload_transform_kernels_fatbin.h"
#endif

_Static_assert(NPYL_TK_MAXC == NPYL_TDEV_MAX_CHANNELS,
               "kernel parameter and plan limits agree");
_Static_assert(sizeof(npyl_tk_params) < 4096, "kernel parameter limit");

#define NO_KERNELS_MSG                                                         \
    "device transforms need the kernels built with the CUDA toolkit (nvcc was " \
    "not found when libnpyload was built; host transforms work)"

int npyl_tdev_built(char *why, size_t whylen)
{
#ifdef NPYLOAD_HAVE_TRANSFORM_KERNELS
    (void)why;
    (void)whylen;
    return 1;
#else
    npyl_fail(why, whylen, NPYLOAD_ENOCUDA, "%s", NO_KERNELS_MSG);
    return 0;
#endif
}

int npyl_tdev_plan_check(const char *what, const npyl_tplan *p, char *err,
                         size_t errlen)
{
    if (!what)
        what = "field";
    if (!npyl_tdev_built(NULL, 0))
        return npyl_fail(err, errlen, NPYLOAD_ENOCUDA, "%s: %s", what,
                         NO_KERNELS_MSG);
    if (p->C * p->S >= ((uint64_t)1 << 32))
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: device transform: samples of %" PRIu64
                         " elements; at most 2^32 - 1", what, p->C * p->S);
    if (p->per_channel && p->C > NPYL_TDEV_MAX_CHANNELS)
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: device transform: per-channel mean/std for %" PRIu64
                         " channels; at most %d on the device (host transforms "
                         "have no limit)", what, p->C, NPYL_TDEV_MAX_CHANNELS);
    return 0;
}

typedef int (*fn_module_load_data)(void **, const void *);
typedef int (*fn_module_unload)(void *);
typedef int (*fn_module_get_function)(void **, void *, const char *);
typedef int (*fn_launch_kernel)(void *, unsigned, unsigned, unsigned, unsigned,
                                unsigned, unsigned, unsigned, void *, void **,
                                void **);
typedef int (*fn_get_error_string)(int, const char **);

/* Kernel names: npyl_tk_<in>_<out>, npyl_tk_perm<bytes>. */
static const char *const IN_CODES[] = {"u1", "i1", "u2", "i2", "u4", "i4",
                                       "u8", "i8", "f2", "f4", "f8"};
#define NIN 11
static const char *const OUT_CODES[] = {"f4", "f2", "bf"}; /* FLOAT32.. */
#define NOUT 3
static const unsigned PERM_SIZES[] = {1, 2, 4, 8, 16};
#define NPERM 5

struct npyl_tdev {
    void *driver;
    void *module;
    fn_module_unload module_unload;
    fn_launch_kernel launch;
    fn_get_error_string errstr;
    void *conv[NIN][NOUT];
    void *perm[NPERM];
};

void npyl_tdev_close(npyl_tdev *d)
{
    if (!d)
        return;
    if (d->module && d->module_unload)
        d->module_unload(d->module);
    if (d->driver)
        dlclose(d->driver);
    free(d);
}

int npyl_tdev_open(npyl_tdev **out, char *err, size_t errlen)
{
    if (!out)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyl_tdev_open: NULL");
    *out = NULL;
#ifndef NPYLOAD_HAVE_TRANSFORM_KERNELS
    return npyl_fail(err, errlen, NPYLOAD_ENOCUDA, "%s", NO_KERNELS_MSG);
#else
    npyl_tdev *d = calloc(1, sizeof *d);
    if (!d)
        return npyl_fail(err, errlen, -12, "out of memory");
    int rc;
    d->driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    fn_module_load_data load = NULL;
    fn_module_get_function getf = NULL;
    if (d->driver) {
        load = (fn_module_load_data)dlsym(d->driver, "cuModuleLoadData");
        getf = (fn_module_get_function)dlsym(d->driver, "cuModuleGetFunction");
        d->module_unload = (fn_module_unload)dlsym(d->driver, "cuModuleUnload");
        d->launch = (fn_launch_kernel)dlsym(d->driver, "cuLaunchKernel");
        d->errstr = (fn_get_error_string)dlsym(d->driver, "cuGetErrorString");
    }
    if (!load || !getf || !d->module_unload || !d->launch) {
        rc = npyl_fail(err, errlen, NPYLOAD_ENOCUDA,
                       "device transforms: CUDA driver API (libcuda.so.1) not "
                       "loadable: %s", d->driver ? "entry points missing" : dlerror());
        goto fail;
    }
    int e = load(&d->module, npyl_tk_fatbin);
    if (e != 0) {
        const char *s = NULL;
        if (d->errstr)
            d->errstr(e, &s);
        rc = npyl_fail(err, errlen, NPYLOAD_ECUDA,
                       "device transforms: loading the kernels failed: %s "
                       "(CUresult %d; no current context, or a GPU that this "
                       "build's fatbin does not cover)", s ? s : "?", e);
        goto fail;
    }
    char name[32];
    for (int i = 0; i < NIN; i++)
        for (int o = 0; o < NOUT; o++) {
            snprintf(name, sizeof name, "npyl_tk_%s_%s", IN_CODES[i], OUT_CODES[o]);
            if ((e = getf(&d->conv[i][o], d->module, name)) != 0)
                goto nofunc;
        }
    for (int k = 0; k < NPERM; k++) {
        snprintf(name, sizeof name, "npyl_tk_perm%u", PERM_SIZES[k]);
        if ((e = getf(&d->perm[k], d->module, name)) != 0)
            goto nofunc;
    }
    *out = d;
    return 0;
nofunc:
    rc = npyl_fail(err, errlen, NPYLOAD_ECUDA,
                   "device transforms: kernel %s missing from the module "
                   "(CUresult %d)", name, e);
fail:
    npyl_tdev_close(d);
    return rc;
#endif
}

static int in_index(const npyl_tplan *p)
{
    static const char kinds[NIN] = {'u', 'i', 'u', 'i', 'u', 'i', 'u', 'i', 'f', 'f', 'f'};
    static const unsigned sizes[NIN] = {1, 1, 2, 2, 4, 4, 8, 8, 2, 4, 8};
    for (int i = 0; i < NIN; i++)
        if (kinds[i] == p->in_kind && sizes[i] == p->in_itemsize)
            return i;
    return -1;
}

int npyl_tdev_run(npyl_tdev *d, const npyl_tplan *p, const void *dsrc,
                  void *ddst, size_t rows, void *stream, char *err,
                  size_t errlen)
{
    if (!d || !p)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyl_tdev_run: NULL");
    if (rows == 0 || p->C * p->S == 0)
        return 0;
    int rc = npyl_tdev_plan_check(NULL, p, err, errlen);
    if (rc)
        return rc;
    npyl_tk_params P;
    memset(&P, 0, sizeof P);
    P.src = dsrc;
    P.dst = ddst;
    P.rows = rows;
    P.C = (unsigned)p->C;
    P.S = (unsigned)p->S;
    P.channels_last = (unsigned)p->channels_last;
    P.swap = (unsigned)p->in_swap;
    P.arith = p->arith;
    P.per_channel = p->per_channel;
    P.scale = p->scale;
    P.mean1 = p->mean1;
    P.std1 = p->std1;
    if (p->per_channel) {
        memcpy(P.mean, p->mean, p->C * sizeof(float));
        memcpy(P.std, p->std, p->C * sizeof(float));
    }
    void *fn = NULL;
    if (p->out_dtype == NPYLOAD_DTYPE_KEEP) {
        if (!p->channels_last)
            return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                             "npyl_tdev_run: identity transform (copy instead)");
        for (int k = 0; k < NPERM; k++)
            if (PERM_SIZES[k] == p->in_itemsize)
                fn = d->perm[k];
    } else {
        int i = in_index(p);
        if (i >= 0)
            fn = d->conv[i][p->out_dtype - 1];
    }
    if (!fn)
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "device transform: no kernel for '%s' -> '%s'",
                         p->in_descr, p->out_descr);
    const unsigned threads = 256;
    uint64_t bx = (p->C * p->S + threads - 1) / threads;
    unsigned gx = bx > 65535 ? 65535 : (unsigned)bx;
    unsigned gy = rows > 65535 ? 65535 : (unsigned)rows;
    void *args[] = {&P};
    int e = d->launch(fn, gx, gy, 1, threads, 1, 1, 0, stream, args, NULL);
    if (e != 0) {
        const char *s = NULL;
        if (d->errstr)
            d->errstr(e, &s);
        return npyl_fail(err, errlen, NPYLOAD_ECUDA,
                         "device transform '%s' -> '%s': cuLaunchKernel failed: "
                         "%s (CUresult %d)", p->in_descr, p->out_descr,
                         s ? s : "?", e);
    }
    return 0;
}
