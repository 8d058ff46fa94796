/* The device transform engine's host side: gets the kernels
 * (npyload_cuda_transform_kernels.cu) as the fatbin nvcc built, or as an
 * image NVRTC compiles at run time (npyload_cuda_nvrtc.c), loads either
 * into the current CUDA context through the handle's driver table
 * (npyl_cuda_driver), and launches them. The runtime's streams are valid
 * CUstreams on the primary context that the runtime makes current. */
#include "npyload_cuda_transform.h"
#include "npyload_cuda_nvrtc.h"
#include "npyload_cuda_transform_kparams.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef NPYLOAD_HAVE_TRANSFORM_KERNELS
#include "npyload_cuda_transform_kernels_fatbin.h"
#endif

_Static_assert(NPYL_TK_MAXC == NPYL_TDEV_MAX_CHANNELS,
               "kernel parameter and plan limits agree");
_Static_assert(sizeof(npyl_tk_params) < 4096, "kernel parameter limit");

#define NO_FATBIN_MSG                                                          \
    "no ahead-of-time kernels in this build (nvcc was not found when "         \
    "libnpyload was built, or NPYLOAD_CUDA_KERNELS=NVRTC)"

int npyl_tdev_aot_built(char *why, size_t whylen)
{
#ifdef NPYLOAD_HAVE_TRANSFORM_KERNELS
    (void)why;
    (void)whylen;
    return 1;
#else
    npyl_fail(why, whylen, NPYLOAD_ENOCUDA, "%s", NO_FATBIN_MSG);
    return 0;
#endif
}

int npyl_tdev_built(char *why, size_t whylen)
{
    return npyl_tdev_aot_built(NULL, 0) || npyl_nvrtc_source_built(why, whylen);
}

const char *npyl_tdev_archs(void)
{
#if defined(NPYLOAD_HAVE_TRANSFORM_KERNELS) && defined(NPYLOAD_TRANSFORM_KERNEL_ARCHS)
    return NPYLOAD_TRANSFORM_KERNEL_ARCHS;
#else
    return "";
#endif
}

/* An item size the permutation and keep kernels move. */
static int item_moves(size_t sz)
{
    return sz == 1 || sz == 2 || sz == 4 || sz == 8 || sz == 16;
}

int npyl_tdev_plan_check(const char *what, const npyl_tplan *p, char *err,
                         size_t errlen)
{
    if (!what)
        what = "field";
    char why[256];
    if (!npyl_tdev_built(why, sizeof why))
        return npyl_fail(err, errlen, NPYLOAD_ENOCUDA, "%s: device transforms: %s",
                         what, why);
    if (p->C * p->S >= ((uint64_t)1 << 32))
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: device transform: samples of %" PRIu64
                         " elements; at most 2^32 - 1", what, p->C * p->S);
    if (p->per_channel && p->C > NPYL_TDEV_MAX_CHANNELS)
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: device transform: per-channel mean/std for %" PRIu64
                         " channels; at most %d on the device (host transforms "
                         "have no limit)", what, p->C, NPYL_TDEV_MAX_CHANNELS);
    if ((p->hneg || p->vneg) && p->C > NPYL_TDEV_MAX_CHANNELS)
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: device transform: flip signs for %" PRIu64 " channels; at "
                         "most %d on the device (host transforms have no limit)", what,
                         p->C, NPYL_TDEV_MAX_CHANNELS);
    if (p->out_dtype == NPYLOAD_DTYPE_KEEP && (p->channels_last || p->aug) &&
        !item_moves(p->in_itemsize))
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: device transform: no kernel moves %zu-byte items ('%s'; "
                         "1, 2, 4, 8 or 16 bytes; host transforms have no limit)", what,
                         p->in_itemsize, p->in_descr);
    return 0;
}

/* Kernels: npyl_tk_<in>_<out> and npyl_tkx_<in>_<out> for NIN input and
 * NOUT output dtypes (named in get_functions, ordered as in_index() and
 * NPYLOAD_DTYPE_FLOAT32..), npyl_tk_perm<bytes> and npyl_tkx_keep<bytes>. */
#define NIN 11
#define NOUT 3
static const unsigned PERM_SIZES[] = {1, 2, 4, 8, 16};
#define NPERM 5

/* Kernel families: [0] npyl_tk_* reads the stored rows as they are, [1]
 * npyl_tkx_* through the rows' records (augmentation, narrowed codes). */
struct npyl_tdev {
    const npyl_cudrv *drv; /* the handle's driver table */
    void *module;
    void *conv[2][NIN][NOUT];
    void *perm[2][NPERM];  /* npyl_tk_perm*, npyl_tkx_keep* */
    char source[384];      /* npyl_tdev_source */
};

void npyl_tdev_close(npyl_tdev *d)
{
    if (!d)
        return;
    if (d->module)
        d->drv->module_unload(d->module);
    free(d);
}

const char *npyl_tdev_source(const npyl_tdev *d) { return d ? d->source : ""; }

#ifdef NPYLOAD_HAVE_TRANSFORM_KERNELS
/* CUresults after which NVRTC is tried: the fatbin has nothing this GPU (or
 * this driver) can run. */
#define CU_ERR_INVALID_PTX 218
#define CU_ERR_UNSUPPORTED_PTX_VERSION 222
#define CU_ERR_NO_BINARY_FOR_GPU 209
static int fatbin_miss(int e)
{
    return e == CU_ERR_NO_BINARY_FOR_GPU || e == CU_ERR_INVALID_PTX ||
           e == CU_ERR_UNSUPPORTED_PTX_VERSION;
}
#endif

/* The compute capability of the current context's device, as 80 for 8.0. */
static int device_arch(const npyl_cudrv *drv, int *arch, char *err, size_t errlen)
{
    int dev = 0, major = 0, minor = 0, e;
    if ((e = drv->ctx_get_device(&dev)) != 0 ||
        (e = drv->device_get_attribute(&major, NPYL_CU_CC_MAJOR, dev)) != 0 ||
        (e = drv->device_get_attribute(&minor, NPYL_CU_CC_MINOR, dev)) != 0)
        return npyl_fail(err, errlen, NPYLOAD_ECUDA,
                         "device transforms: the GPU's compute capability: %s "
                         "(CUresult %d)", npyl_cudrv_strerror(drv, e), e);
    *arch = major * 10 + minor;
    return 0;
}

/* Loads the run-time image: NVRTC's (or the cache's) for the GPU. A cached
 * image the driver refuses is compiled again and replaced. */
static int load_nvrtc(npyl_tdev *d, npyl_cuda *cuda, const npyl_tdev_cfg *cfg,
                      const char *aot_why, char *err, size_t errlen)
{
    int arch = 0;
    int rc = device_arch(d->drv, &arch, err, errlen);
    if (rc)
        return rc;
    char cudart[512];
    npyl_cuda_runtime_path(cuda, cudart, sizeof cudart);
    npyl_nvrtc_places places;
    const npyl_nvrtc_where *w = npyl_nvrtc_default_where(&places, cfg->nvrtc, cudart);
    char why[1536];
    for (int skip_cache = 0; skip_cache <= 1; skip_cache++) {
        npyl_kimage k;
        rc = npyl_nvrtc_kernels(w, cfg->cache_dir, skip_cache, arch, &k, why, sizeof why);
        if (rc)
            return npyl_fail(err, errlen, rc, "device transforms: %s%s%s", aot_why,
                             aot_why[0] ? "; " : "", why);
        int e = d->drv->module_load_data(&d->module, k.data);
        int cached = k.cached;
        snprintf(d->source, sizeof d->source, "%s", k.from);
        npyl_kimage_free(&k);
        if (e == 0)
            return 0;
        d->module = NULL;
        if (!cached)
            return npyl_fail(err, errlen, NPYLOAD_ECUDA,
                             "device transforms: loading the kernels compiled by "
                             "%s failed: %s (CUresult %d)", d->source,
                             npyl_cudrv_strerror(d->drv, e), e);
    }
    return NPYLOAD_ECUDA; /* not reached: the second pass never reads the cache */
}

/* Looks every kernel up in d's module; on failure returns the CUresult
 * with the kernel's name in name[]. */
static int get_functions(npyl_tdev *d, char *name, size_t len)
{
    static const char *const IN_CODES[NIN] = {"u1", "i1", "u2", "i2", "u4", "i4",
                                              "u8", "i8", "f2", "f4", "f8"};
    static const char *const OUT_CODES[NOUT] = {"f4", "f2", "bf"};
    static const char *const FAMILY[2] = {"npyl_tk", "npyl_tkx"};
    static const char *const MOVE[2] = {"perm", "keep"};
    int e;
    for (int x = 0; x < 2; x++) {
        for (int i = 0; i < NIN; i++)
            for (int o = 0; o < NOUT; o++) {
                snprintf(name, len, "%s_%s_%s", FAMILY[x], IN_CODES[i], OUT_CODES[o]);
                if ((e = d->drv->module_get_function(&d->conv[x][i][o], d->module, name)))
                    return e;
            }
        for (int k = 0; k < NPERM; k++) {
            snprintf(name, len, "%s_%s%u", FAMILY[x], MOVE[x], PERM_SIZES[k]);
            if ((e = d->drv->module_get_function(&d->perm[x][k], d->module, name)))
                return e;
        }
    }
    return 0;
}

int npyl_tdev_open(npyl_tdev **out, npyl_cuda *cuda, const npyl_tdev_cfg *cfg,
                   char *err, size_t errlen)
{
    if (!out || !cuda)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyl_tdev_open: %s is NULL",
                         out ? "cuda" : "out");
    *out = NULL;
    static const npyl_tdev_cfg defaults = {NPYL_TDEV_AUTO, NULL, NULL};
    if (!cfg)
        cfg = &defaults;
    char why[512];
    if (!npyl_tdev_built(why, sizeof why))
        return npyl_fail(err, errlen, NPYLOAD_ENOCUDA, "device transforms: %s", why);
    if (cfg->mode == NPYL_TDEV_AOT && !npyl_tdev_aot_built(why, sizeof why))
        return npyl_fail(err, errlen, NPYLOAD_ENOCUDA,
                         "device transforms: ahead-of-time kernels asked for: %s", why);
    const npyl_cudrv *drv = NULL;
    int rc = npyl_cuda_driver(cuda, &drv, why, sizeof why);
    if (rc)
        return npyl_fail(err, errlen, rc, "device transforms: %s", why);
    npyl_tdev *d = calloc(1, sizeof *d);
    if (!d)
        return npyl_fail(err, errlen, -ENOMEM, "device transforms: out of memory");
    d->drv = drv;
    int e = -1;
    char aot_why[256] = "";
#ifdef NPYLOAD_HAVE_TRANSFORM_KERNELS
    if (cfg->mode != NPYL_TDEV_NVRTC) {
        e = drv->module_load_data(&d->module, npyl_tk_fatbin);
        if (e == 0) {
            snprintf(d->source, sizeof d->source, "ahead of time (embedded fatbin: %s)",
                     npyl_tdev_archs());
        } else {
            d->module = NULL;
            if (cfg->mode == NPYL_TDEV_AOT || !fatbin_miss(e)) {
                rc = npyl_fail(err, errlen, NPYLOAD_ECUDA,
                               "device transforms: loading the kernels failed: %s "
                               "(CUresult %d; no current context, or a GPU that this "
                               "build's fatbin does not cover)",
                               npyl_cudrv_strerror(drv, e), e);
                goto fail;
            }
            snprintf(aot_why, sizeof aot_why, "the embedded fatbin (%s) does not run "
                     "on this GPU: %s (CUresult %d)", npyl_tdev_archs(),
                     npyl_cudrv_strerror(drv, e), e);
        }
    }
#endif
    if (e != 0 && (rc = load_nvrtc(d, cuda, cfg, aot_why, err, errlen)) != 0)
        goto fail;
    char name[32];
    if ((e = get_functions(d, name, sizeof name)) != 0)
        goto nofunc;
    *out = d;
    return 0;
nofunc:
    rc = npyl_fail(err, errlen, NPYLOAD_ECUDA,
                   "device transforms: kernel %s missing from the module: %s "
                   "(CUresult %d)", name, npyl_cudrv_strerror(drv, e), e);
fail:
    npyl_tdev_close(d);
    return rc;
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

/* The parameter's common part: geometry, layout and arithmetic. */
static void fill_params(const npyl_tplan *p, const void *dsrc, void *ddst, size_t rows,
                        npyl_tk_params *P)
{
    memset(P, 0, sizeof *P);
    P->src = dsrc;
    P->dst = ddst;
    P->rows = rows;
    P->C = (unsigned)p->C;
    P->S = (unsigned)p->S;
    P->channels_last = (unsigned)p->channels_last;
    P->swap = (unsigned)p->in_swap;
    P->arith = p->arith;
    P->per_channel = p->per_channel;
    P->scale = p->scale;
    P->mean1 = p->mean1;
    P->std1 = p->std1;
    if (p->per_channel) {
        memcpy(P->mean, p->mean, p->C * sizeof(float));
        memcpy(P->std, p->std, p->C * sizeof(float));
    }
}

/* The npyl_tkx_* part: the augmented window, the signs, the tables. */
static void fill_params_x(const npyl_tplan *p, const npyl_tdev_extra *x, npyl_tk_params *P)
{
    P->rowinfo = x->rows;
    P->tables = x->tables;
    P->in_elems = p->in_itemsize ? p->stored_row_bytes / p->in_itemsize : 0;
    /* The sign bit of an item loaded as it lies (the GPU is little-endian;
     * in_swap: stored big-endian, so the sign is in the first byte). */
    size_t sz = p->in_itemsize;
    P->signmask = sz > 8 ? 0 : p->in_swap ? 0x80u : (1ull << (8 * sz - 1));
    P->geom = p->aug_H != 0;
    P->H = (unsigned)p->aug_H;
    P->W = (unsigned)p->aug_W;
    P->h = (unsigned)p->crop_h;
    P->w = (unsigned)p->crop_w;
    P->pad = (unsigned)p->pad;
    for (uint64_t c = 0; c < p->C && c < NPYL_TK_MAXC; c++) {
        if (p->hneg && p->hneg[c])
            P->hneg[c >> 5] |= 1u << (c & 31);
        if (p->vneg && p->vneg[c])
            P->vneg[c >> 5] |= 1u << (c & 31);
    }
}

/* The kernel of family fam (0 plain, 1 npyl_tkx_*) for plan p, or NULL. */
static void *pick_kernel(const npyl_tdev *d, const npyl_tplan *p, int fam)
{
    if (p->out_dtype == NPYLOAD_DTYPE_KEEP) {
        for (int k = 0; k < NPERM; k++)
            if (PERM_SIZES[k] == p->in_itemsize)
                return d->perm[fam][k];
        return NULL;
    }
    int i = in_index(p);
    return i >= 0 ? d->conv[fam][i][p->out_dtype - 1] : NULL;
}

static int launch(npyl_tdev *d, const npyl_tplan *p, void *fn, npyl_tk_params *P,
                  size_t rows, void *stream, char *err, size_t errlen)
{
    if (!fn)
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "device transform: no kernel for '%s' -> '%s'",
                         p->in_descr, p->out_descr);
    const unsigned threads = 256;
    uint64_t bx = (p->C * p->S + threads - 1) / threads;
    unsigned gx = bx > 65535 ? 65535 : (unsigned)bx;
    unsigned gy = rows > 65535 ? 65535 : (unsigned)rows;
    void *args[] = {P};
    int e = d->drv->launch_kernel(fn, gx, gy, 1, threads, 1, 1, 0, stream, args, NULL);
    if (e != 0)
        return npyl_fail(err, errlen, NPYLOAD_ECUDA,
                         "device transform '%s' -> '%s': cuLaunchKernel failed: "
                         "%s (CUresult %d)", p->in_descr, p->out_descr,
                         npyl_cudrv_strerror(d->drv, e), e);
    return 0;
}

int npyl_tdev_run(npyl_tdev *d, const npyl_tplan *p, const void *dsrc,
                  void *ddst, size_t rows, void *stream, char *err,
                  size_t errlen)
{
    if (!d || !p)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyl_tdev_run: NULL");
    if (p->aug)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyl_tdev_run: a plan with "
                         "augmentation needs the rows' decisions (npyl_tdev_run_x)");
    if (rows == 0 || p->C * p->S == 0)
        return 0;
    int rc = npyl_tdev_plan_check(NULL, p, err, errlen);
    if (rc)
        return rc;
    if (p->out_dtype == NPYLOAD_DTYPE_KEEP && !p->channels_last)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "npyl_tdev_run: identity transform (copy instead)");
    npyl_tk_params P;
    fill_params(p, dsrc, ddst, rows, &P);
    return launch(d, p, pick_kernel(d, p, 0), &P, rows, stream, err, errlen);
}

void npyl_tdev_row_fill(const npyl_tplan *p, int64_t seed, uint64_t epoch, int64_t index,
                        uint32_t table, npyl_tdev_row *out)
{
    npyl_aug a;
    npyl_aug_decide(p, seed, epoch, index, &a);
    /* top < H + 2P - h + 1 <= 3 * 2^30 + 1 (plan_aug's limits): 32 bits. */
    out->top = (unsigned)a.top;
    out->left = (unsigned)a.left;
    out->flips = (unsigned)a.hflip | (unsigned)a.vflip << 1;
    out->table = table;
}

int npyl_tdev_run_x(npyl_tdev *d, const npyl_tplan *p, const npyl_tdev_extra *x,
                    const void *dsrc, void *ddst, size_t rows, void *stream, char *err,
                    size_t errlen)
{
    if (!d || !p || !x || !x->rows)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyl_tdev_run_x: %s is NULL",
                         !d || !p ? "the engine or plan" : "the rows' records");
    if (rows == 0 || p->C * p->S == 0)
        return 0;
    int rc = npyl_tdev_plan_check(NULL, p, err, errlen);
    if (rc)
        return rc;
    if (x->tables && p->in_itemsize != 2 && p->in_itemsize != 4 && p->in_itemsize != 8)
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED, "device expansion of "
                         "narrowed codes: values of %zu bytes ('%s'; 2, 4 or 8)",
                         p->in_itemsize, p->in_descr);
    npyl_tk_params P;
    fill_params(p, dsrc, ddst, rows, &P);
    fill_params_x(p, x, &P);
    return launch(d, p, pick_kernel(d, p, 1), &P, rows, stream, err, errlen);
}
