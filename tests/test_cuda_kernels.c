/* lib/cuda's device transform kernels run on the CPU, against the host
 * engine (lib/transform) and the host expansion of narrowed codes
 * (lib/zst), bit for bit; and the loader's device path with those kernels.
 *
 * No GPU needed: the fake runtime (tests/gpu/fake_cudart.c: "device"
 * memory is host memory, copies queued per stream) and the fake driver
 * (tests/gpu/fake_cuda_driver.c) with run_kernels set, which runs each
 * launched kernel on the CPU, queued on the fake stream in order with the
 * copies: the kernels are npyload_cuda_transform_kernels.cu itself,
 * compiled as C++ with tests/gpu/kshim (each _rn intrinsic one IEEE float
 * operation, never contracted; float16 through the CPU's F16C, bfloat16 by
 * CUDA's own integer rounding). What this cannot show is the GPU's own
 * arithmetic and memory model: tests/gpu/test_gpu_transform.c compares the
 * same cases on a device.
 *
 * Float outputs may differ only where both are NaN (the device may write
 * its canonical NaN, as documented for every device transform); stored
 * dtypes kept (and every narrowed value expanded without a transform) must
 * be equal byte for byte, NaN payloads, -0.0 and denormals included. */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/npyload_cuda.h"
#include "cuda/npyload_cuda_transform.h"
#include "gpu/fake_cuda_driver.h"
#include "gpu/fake_cudart.h"
#include "npyload.h"
#include "testutil.h"
#include "gpu/xform_cases.h"
#include "transform/npyload_transform.h"

#ifndef NPYLOAD_TEST_SITE_DIRS
#define NPYLOAD_TEST_SITE_DIRS ""
#endif

/* ---- the fakes, with the kernels on the CPU ---- */

static fake_cuda_driver *fd;
static fake_cudart *frt;
static int (*rt_stream_create)(void **, unsigned);
static int (*rt_stream_sync)(void *);
static char wheel[1024]; /* NVRTC for a build without a fatbin, else "" */

/* Loads the fake runtime and the fake driver (by their SONAMEs, so lib/cuda
 * opens them) and switches on the kernels on the CPU; skips visibly where
 * that cannot be done. */
static void load_fakes(void)
{
#if !defined(NPYLOAD_FAKE_CUDART) || !defined(NPYLOAD_FAKE_CUDA_DRIVER)
    cr_skip_test("built without tests/gpu/fake_cudart.c / fake_cuda_driver.c");
#else
    void *real = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (real) {
        dlclose(real);
        cr_skip_test("a libcuda.so.1 is already loaded: the fake driver cannot stand in");
    }
    char why[512];
    if (!npyl_tdev_built(why, sizeof why))
        cr_skip_test("%s", why);
    void *rt = dlopen(NPYLOAD_FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(rt, "%s", dlerror());
    frt = ((fake_cudart_control_fn)dlsym(rt, "fake_cudart_control"))();
    *(void **)&rt_stream_create = dlsym(rt, "cudaStreamCreateWithFlags");
    *(void **)&rt_stream_sync = dlsym(rt, "cudaStreamSynchronize");
    cr_assert(rt_stream_create && rt_stream_sync);
    void *drv = dlopen(NPYLOAD_FAKE_CUDA_DRIVER, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(drv, "%s", dlerror());
    fd = ((fake_cuda_driver_control_fn)dlsym(drv, "fake_cuda_driver_control"))();
    fake_cuda_driver_cpu_kernels_fn cpu =
        (fake_cuda_driver_cpu_kernels_fn)dlsym(drv, "fake_cuda_driver_cpu_kernels");
    if (!cpu || !cpu())
        cr_skip_test("the fake driver was built without a C++ compiler: the kernels "
                     "cannot run on the CPU here");
    atomic_store(&fd->run_kernels, 1);
    wheel[0] = 0;
    if (!npyl_tdev_aot_built(NULL, 0) &&
        !tu_nvrtc_wheel_dir(NPYLOAD_TEST_SITE_DIRS, wheel, sizeof wheel))
        cr_skip_test("no fatbin in this build and no nvidia-cuda-nvrtc wheel in the test "
                     "Python's site-packages (%s): the kernels cannot be loaded",
                     NPYLOAD_TEST_SITE_DIRS);
#endif
}

static npyl_cuda *cuda;
static npyl_tdev *tdev;
static void *stream;

static void engine_setup(void)
{
    load_fakes();
    char err[2048];
    cr_assert_eq(npyl_cuda_open(&cuda, 0, err, sizeof err), 0, "%s", err);
    npyl_tdev_cfg cfg = {.mode = NPYL_TDEV_AUTO, .nvrtc = wheel[0] ? wheel : NULL};
    cr_assert_eq(npyl_tdev_open(&tdev, cuda, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(npyl_cuda_stream_create(cuda, &stream), 0);
}

static void engine_teardown(void)
{
    npyl_tdev_close(tdev);
    if (stream)
        npyl_cuda_stream_destroy(cuda, stream);
    npyl_cuda_close(cuda);
}

/* ---- the kernels on the CPU against the host ---- */

/* The fake's device memory is host memory: the kernel reads and writes the
 * buffers themselves, when the stream is waited for. */
static void fake_run(void *ctx, const npyl_tplan *p, const npyl_tdev_row *rec, size_t rows,
                     const void *src, size_t src_n, const void *tables, size_t tab_n,
                     void *got, size_t out_n)
{
    (void)ctx, (void)src_n, (void)tab_n;
    npyl_tdev_extra x = {.rows = rec, .tables = tables};
    char err[512];
    int ran = atomic_load(&fd->n_ran);
    memset(got, 0xa5, out_n);
    cr_assert_eq(npyl_tdev_run_x(tdev, p, &x, src, got, rows, stream, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(npyl_cuda_stream_sync(cuda, stream), 0, "%s", npyl_cuda_errmsg(cuda));
    cr_assert_eq(atomic_load(&fd->n_ran), ran + 1, "the kernel ran once");
}

static const xc_runner cpu = {fake_run, NULL};

Test(cuda_kernels, augmentation_matches_the_host_engine, .init = engine_setup,
     .fini = engine_teardown, .timeout = 300)
{
    cr_assert_gt(xc_augmentations(&cpu), 2000);
}

Test(cuda_kernels, every_window_position_matches, .init = engine_setup,
     .fini = engine_teardown)
{
    xc_windows(&cpu);
}

Test(cuda_kernels, narrowed_codes_expand_bit_for_bit, .init = engine_setup,
     .fini = engine_teardown)
{
    xc_narrowed(&cpu);
}

/* The launcher's choice and parameters: the npyl_tkx_ family, the plan's
 * geometry, the signs as bits, the sign bit of the stored byte order, the
 * tables; refusals name the reason. */
Test(cuda_kernels, launcher_picks_and_fills, .init = engine_setup, .fini = engine_teardown)
{
    const int64_t shp[] = {3, 8, 10};
    static const float sgn[3] = {1.0f, -1.0f, -1.0f};
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.dtype = NPYLOAD_DTYPE_BFLOAT16;
    t.hflip = 1.0f;
    t.hflip_sign = sgn;
    t.n_hflip_sign = 3;
    t.crop_h = 6;
    t.crop_w = 7;
    t.pad = 2;
    npyl_tplan p;
    char err[512];
    cr_assert_eq(npyl_transform_plan("x", &t, ">f8", 3, shp, &p, err, sizeof err), 0, "%s", err);
    unsigned char src[3 * 80 * 8] = {0}, dst[3 * 42 * 2];
    npyl_tdev_row rec = {0, 0, 1, 0};
    atomic_store(&fd->run_kernels, 0); /* parameters only */
    npyl_tdev_extra x = {.rows = &rec, .tables = NULL};
    cr_assert_eq(npyl_tdev_run_x(tdev, &p, &x, src, dst, 1, stream, err, sizeof err), 0, "%s",
                 err);
    cr_assert_str_eq(fd->last_kernel, "npyl_tkx_f8_bf");
    npyl_tk_params P;
    memcpy(&P, fd->last_params, sizeof P);
    cr_assert_eq(P.C, 3);
    cr_assert_eq(P.S, 6 * 7);
    cr_assert_eq(P.in_elems, 3 * 8 * 10, "the stored row");
    cr_assert_eq(P.geom, 1);
    cr_assert(P.H == 8 && P.W == 10 && P.h == 6 && P.w == 7 && P.pad == 2);
    cr_assert_eq(P.hneg[0], 0x6u, "channels 1 and 2 negated");
    cr_assert_eq(P.vneg[0], 0u);
    cr_assert_eq(P.signmask, 0x80u, "big-endian: the sign is in the first byte");
    cr_assert_eq(P.swap, 1);
    cr_assert_eq(P.rowinfo, &rec);
    cr_assert_null(P.tables);
    /* a plan with augmentation needs the records */
    cr_assert_eq(npyl_tdev_run(tdev, &p, src, dst, 1, stream, err, sizeof err),
                 NPYLOAD_EINVAL);
    cr_assert_not_null(strstr(err, "npyl_tdev_run_x"), "%s", err);
    npyl_transform_plan_free(&p);

    /* the expansion alone: the keep kernel of the values' size, with tables */
    npyload_transform id = NPYLOAD_TRANSFORM_INIT;
    cr_assert_eq(npyl_transform_plan("x", &id, "<f4", 3, shp, &p, err, sizeof err), 0, "%s",
                 err);
    unsigned char tables[NPYL_TDEV_TABLE * 4];
    x.tables = tables;
    cr_assert_eq(npyl_tdev_run_x(tdev, &p, &x, src, dst, 1, stream, err, sizeof err), 0, "%s",
                 err);
    cr_assert_str_eq(fd->last_kernel, "npyl_tkx_keep4");
    memcpy(&P, fd->last_params, sizeof P);
    cr_assert_eq(P.tables, tables);
    cr_assert_eq(P.geom, 0);
    cr_assert_eq(P.signmask, 0x80000000u);
    npyl_transform_plan_free(&p);

    /* past the kernels' limits: flip signs for more channels than 128 */
    const int64_t wide[] = {200, 4};
    float s200[200];
    for (int c = 0; c < 200; c++)
        s200[c] = c % 2 ? -1.0f : 1.0f;
    npyload_transform w = NPYLOAD_TRANSFORM_INIT;
    w.hflip = 0.5f;
    w.hflip_sign = s200;
    w.n_hflip_sign = 200;
    cr_assert_eq(npyl_transform_plan("wide", &w, "<f4", 2, wide, &p, err, sizeof err), 0, "%s",
                 err);
    cr_assert_eq(npyl_tdev_plan_check("wide", &p, err, sizeof err), NPYLOAD_EUNSUPPORTED);
    cr_assert(strstr(err, "wide") && strstr(err, "flip signs for 200 channels") &&
                  strstr(err, "host"), "%s", err);
    npyl_transform_plan_free(&p);
}

/* ---- the loader's device path, with the kernels on the CPU ---- */

/* A loader over `paths` (one field "x") in device mode on the fakes, or in
 * host mode (device -1), with transform t (NULL: none). */
static npyload_loader *make_loader(const char *const *paths, size_t n, int64_t device,
                                   const npyload_transform *t, int64_t workers)
{
    npyload_loader *L = NULL;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field_files(L, "x", paths, n), 0, "%s",
                 npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 7), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, 3), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, NPYLOAD_SHUFFLE_FULL), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SEED, 21), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, device), 0, "%s",
                 npyload_loader_errmsg(L));
    if (wheel[0])
        cr_assert_eq(npyload_loader_set_path(L, NPYLOAD_PATH_NVRTC, wheel), 0);
    if (t)
        cr_assert_eq(npyload_loader_set_transform(L, "x", t, sizeof *t), 0, "%s",
                     npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    return L;
}

typedef struct run_out {
    unsigned char *bytes; /* every batch's field bytes, in order */
    size_t n;
    int64_t rows;
    npyload_stats st;
    char descr[32];
} run_out;

/* Every batch of two epochs, the device ones read after a consumer stream
 * waited for them (the fake runs the copies and kernels then). */
static void drain(npyload_loader *L, int device, run_out *o)
{
    void *cs = NULL;
    if (device >= 0)
        cr_assert_eq(rt_stream_create(&cs, 1), 0);
    memset(o, 0, sizeof *o);
    for (uint64_t e = 0; e < 2; e++) {
        cr_assert_eq(npyload_loader_set_epoch(L, e), 0);
        npyload_batch *b;
        int rc;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            const npyload_array *a = npyload_batch_field(b, 0);
            if (device >= 0) {
                cr_assert_eq(a->device, 0);
                cr_assert_eq(npyload_batch_wait_stream(b, cs), 0);
                cr_assert_eq(rt_stream_sync(cs), 0);
            }
            o->bytes = realloc(o->bytes, o->n + a->nbytes);
            memcpy(o->bytes + o->n, a->data, a->nbytes);
            o->n += a->nbytes;
            o->rows += (int64_t)npyload_batch_size(b);
            snprintf(o->descr, sizeof o->descr, "%s", a->descr);
            if (device >= 0)
                npyload_batch_release_stream(b, cs);
            else
                npyload_batch_release(b);
        }
        cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    }
    npyload_loader_get_stats(L, &o->st, sizeof o->st);
}

/* The same files through host mode and device mode: the same bytes (float
 * outputs: or both NaN); returns the device run's stats and engine. */
static void host_vs_device(const char *const *paths, size_t n, const npyload_transform *t,
                           int64_t workers, npyload_stats *dst, int *engine, char *why,
                           size_t whylen)
{
    run_out h, d;
    npyload_loader *H = make_loader(paths, n, -1, t, 2);
    drain(H, -1, &h);
    npyload_loader_destroy(H);
    npyload_loader *D = make_loader(paths, n, 0, t, workers);
    *engine = npyload_loader_field_engine(D, 0, why, whylen);
    cr_log_info("engine %d: %s", *engine, why);
    drain(D, 0, &d);
    npyload_loader_destroy(D);
    cr_assert_eq(d.rows, h.rows);
    cr_assert_eq(d.n, h.n);
    cr_assert_str_eq(d.descr, h.descr);
    int out = !strcmp(h.descr, "<f4") ? NPYLOAD_DTYPE_FLOAT32
            : !strcmp(h.descr, "<f2") ? NPYLOAD_DTYPE_FLOAT16
            : !strcmp(h.descr, "bfloat16") ? NPYLOAD_DTYPE_BFLOAT16 : NPYLOAD_DTYPE_KEEP;
    npyl_tplan p = {.out_dtype = t && t->dtype ? out : NPYLOAD_DTYPE_KEEP,
                    .out_itemsize = out == NPYLOAD_DTYPE_FLOAT32 ? 4 : 2};
    if (p.out_dtype == NPYLOAD_DTYPE_KEEP)
        p.out_itemsize = 1;
    xc_same(&p, h.bytes, d.bytes, h.n, "host mode vs device mode");
    *dst = d.st;
    free(h.bytes);
    free(d.bytes);
}

#define LN 30 /* samples per field */

/* An augmented uint8 image field (2 channels, the captcha layout shrunk):
 * PCIe carries the stored bytes plus a 16-byte record per row, one kernel
 * per batch does pad, window, flips and the normalisation, and the output
 * equals host mode's byte for byte. */
Test(cuda_kernels, loader_augments_on_the_device, .timeout = 120)
{
    load_fakes();
    char *dir = tu_mkdtemp("kaug");
    const int64_t sshape[3] = {2, 12, 20}, counts[2] = {13, LN - 13};
    cr_assert_eq(tu_write_field(dir, "img", 3, "|u1", 1, 3, sshape, counts, 2, 64), 0);
    char *p0 = tu_path(dir, "img_0000.npy"), *p1 = tu_path(dir, "img_0001.npy");
    const char *paths[2] = {p0, p1};
    static const float mean[2] = {0.5f, 0.25f}, sd[2] = {0.2f, 0.3f};
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.dtype = NPYLOAD_DTYPE_FLOAT32;
    t.scale = 1.0f / 255.0f;
    t.mean = mean;
    t.std = sd;
    t.n_mean = t.n_std = 2;
    t.channels_last = 1;
    t.hflip = 0.5f;
    t.vflip = 0.25f;
    t.crop_h = 10;
    t.crop_w = 16;
    t.pad = 2;
    const int64_t worker_counts[2] = {2, NPYLOAD_WORKERS_SYNC};
    for (int k = 0; k < 2; k++) {
        int launches = atomic_load(&fd->n_launch), ran = atomic_load(&fd->n_ran);
        npyload_stats st;
        int eng;
        char why[1024];
        host_vs_device(paths, 2, &t, worker_counts[k], &st, &eng, why, sizeof why);
        cr_assert_eq(eng, NPYLOAD_ENGINE_DEVICE, "%s", why);
        cr_assert(strstr(why, "stored '|u1'"), "%s", why);
        /* two epochs of LN rows: 2 x 12 x 20 stored bytes and a record each */
        cr_assert_eq(st.h2d_bytes, 2u * LN * (2 * 12 * 20 + sizeof(npyl_tdev_row)),
                     "h2d_bytes %llu", (unsigned long long)st.h2d_bytes);
        int batches = 2 * ((LN + 6) / 7);
        cr_assert_eq(atomic_load(&fd->n_launch) - launches, batches, "one kernel a batch");
        cr_assert_eq(atomic_load(&fd->n_ran) - ran, batches);
        cr_assert_str_eq(fd->last_kernel, "npyl_tkx_u1_f4");
    }
    free(p0);
    free(p1);
    tu_rmtree(dir);
}

/* Float vectors with flip signs kept in their stored dtype (the offsets
 * label of the captcha layout: negated when flipped), and float16 out. */
Test(cuda_kernels, loader_signs_on_the_device, .timeout = 120)
{
    load_fakes();
    char *dir = tu_mkdtemp("ksign");
    const int64_t sshape[3] = {4, 6, 8}, counts[1] = {LN};
    cr_assert_eq(tu_write_field(dir, "off", 5, "<f4", 4, 3, sshape, counts, 1, 64), 0);
    char *p0 = tu_path(dir, "off_0000.npy");
    const char *paths[1] = {p0};
    static const float hs[4] = {-1.0f, 1.0f, -1.0f, 1.0f}, vs[4] = {1.0f, -1.0f, 1.0f, -1.0f};
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.hflip = 0.5f;
    t.vflip = 0.5f;
    t.hflip_sign = hs;
    t.vflip_sign = vs;
    t.n_hflip_sign = t.n_vflip_sign = 4;
    for (int out = NPYLOAD_DTYPE_KEEP; out <= NPYLOAD_DTYPE_FLOAT16; out += 2) {
        t.dtype = out;
        npyload_stats st;
        int eng;
        char why[1024];
        host_vs_device(paths, 1, &t, 2, &st, &eng, why, sizeof why);
        cr_assert_eq(eng, NPYLOAD_ENGINE_DEVICE, "%s", why);
        cr_assert_eq(st.h2d_bytes, 2u * LN * (4 * 6 * 8 * 4 + sizeof(npyl_tdev_row)));
        cr_assert_str_eq(fd->last_kernel, out ? "npyl_tkx_f4_f2" : "npyl_tkx_keep4");
    }
    free(p0);
    tu_rmtree(dir);
}

/* Flip signs for more channels than the kernels take: the host engine,
 * and the reason. */
Test(cuda_kernels, loader_past_the_kernels_limits_uses_the_host_engine, .timeout = 120)
{
    load_fakes();
    char *dir = tu_mkdtemp("kwide");
    const int64_t sshape[2] = {130, 3}, counts[1] = {LN};
    cr_assert_eq(tu_write_field(dir, "w", 6, "<f4", 4, 2, sshape, counts, 1, 64), 0);
    char *p0 = tu_path(dir, "w_0000.npy");
    const char *paths[1] = {p0};
    float s[130];
    for (int c = 0; c < 130; c++)
        s[c] = c % 3 ? 1.0f : -1.0f;
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.hflip = 0.5f;
    t.hflip_sign = s;
    t.n_hflip_sign = 130;
    npyload_stats st;
    int eng;
    char why[1024];
    host_vs_device(paths, 1, &t, 2, &st, &eng, why, sizeof why);
    cr_assert_eq(eng, NPYLOAD_ENGINE_HOST, "%s", why);
    cr_assert(strstr(why, "130 channels") && strstr(why, "at most 128"), "%s", why);
    cr_assert_eq(st.h2d_bytes, 2u * LN * 130 * 3 * 4, "the output crossed, no records");
    free(p0);
    tu_rmtree(dir);
}

/* 256 float32 patterns (NaN payloads, both zeros, denormals, infinities,
 * gray levels), a different set per file: file k uses pats[i] ^ k<<..
 * on the ordinary values only. */
static void patterns(uint32_t pats[256], int k)
{
    static const uint32_t odd[] = {0x7fc00000u, 0x7fc00001u, 0xffc00123u, 0x7f800001u,
                                   0x80000000u, 0x00000000u, 0x00000001u, 0x807fffffu,
                                   0x7f800000u, 0xff800000u};
    size_t n = 0;
    for (; n < sizeof odd / sizeof odd[0]; n++)
        pats[n] = odd[n];
    for (int v = 1; n < 256; v++, n++) {
        float f = (float)(v + 1000 * k) / 255.0f;
        memcpy(&pats[n], &f, 4);
    }
}

#define NR 10   /* rows per file */
#define NV 48   /* values per row: (3, 4, 4) */

/* dir/n_k.npy: NR samples (3, 4, 4) float32 over file k's patterns, packed
 * narrowed (store: the plain .npy of codes with a trailer) or not at all
 * (plain). Writes the path the loader reads to out. */
static void narrowed_file(const char *dir, int k, int mode, char *out, size_t len)
{
    uint32_t pats[256], v[NR * NV];
    patterns(pats, k);
    for (size_t i = 0; i < NR * NV; i++)
        v[i] = pats[(i * 7 + (size_t)k) % 256];
    char p[600];
    snprintf(p, sizeof p, "%s/n_%d.npy", dir, k);
    const int64_t shape[4] = {NR, 3, 4, 4};
    cr_assert_geq(tu_write_npy(p, "<f4", 0, 4, shape, v, sizeof v, 64), 0);
    snprintf(out, len, "%s", p);
    if (mode == 0)
        return; /* plain */
    npyload_pack_options o = {.frame_size = 700, .threads = 1, .narrow = 1,
                              .store = mode == 2};
    npyload_pack_result r;
    char err[512];
    snprintf(out, len, "%s/n_%d.%s", dir, k, mode == 2 ? "narrow.npy" : "npy.zst");
    cr_assert_eq(npyload_pack_file(p, out, &o, sizeof o, &r, sizeof r, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(r.narrow_values, 256);
}

/* A field of narrowed files (.npy.zst and the stored form, each its own
 * table): PCIe carries one byte per value plus a record per row, the
 * kernel expands through the right table, and the values equal host
 * mode's (which expands on the host) bit for bit; fused with a transform. */
Test(cuda_kernels, loader_expands_narrowed_codes_on_the_device, .timeout = 120)
{
    load_fakes();
    char *dir = tu_mkdtemp("knarrow");
    char f[3][640];
    narrowed_file(dir, 0, 1, f[0], sizeof f[0]);
    narrowed_file(dir, 1, 2, f[1], sizeof f[1]);
    narrowed_file(dir, 2, 1, f[2], sizeof f[2]);
    const char *paths[3] = {f[0], f[1], f[2]};
    npyload_stats st;
    int eng;
    char why[1024];
    host_vs_device(paths, 3, NULL, 2, &st, &eng, why, sizeof why);
    cr_assert_eq(eng, NPYLOAD_ENGINE_DEVICE, "%s", why);
    cr_assert(strstr(why, "codes"), "%s", why);
    cr_assert_eq(st.h2d_bytes, 2u * 3 * NR * (NV + sizeof(npyl_tdev_row)),
                 "one byte per value crossed: %llu", (unsigned long long)st.h2d_bytes);
    cr_assert_str_eq(fd->last_kernel, "npyl_tkx_keep4");

    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.dtype = NPYLOAD_DTYPE_FLOAT16;
    t.scale = 2.0f;
    t.channels_last = 1;
    t.hflip = 0.5f;
    host_vs_device(paths, 3, &t, NPYLOAD_WORKERS_SYNC, &st, &eng, why, sizeof why);
    cr_assert_eq(eng, NPYLOAD_ENGINE_DEVICE, "%s", why);
    cr_assert_eq(st.h2d_bytes, 2u * 3 * NR * (NV + sizeof(npyl_tdev_row)));
    cr_assert_str_eq(fd->last_kernel, "npyl_tkx_f4_f2");
    tu_rmtree(dir);
}

/* Narrowed and plain files in one field: expanded on the host (said so),
 * the full values cross, the values still equal. */
Test(cuda_kernels, loader_mixed_narrowed_and_plain_expands_on_the_host, .timeout = 120)
{
    load_fakes();
    char *dir = tu_mkdtemp("kmixed");
    char f[2][640];
    narrowed_file(dir, 0, 1, f[0], sizeof f[0]);
    narrowed_file(dir, 1, 0, f[1], sizeof f[1]);
    const char *paths[2] = {f[0], f[1]};
    npyload_stats st;
    int eng;
    char why[1024];
    host_vs_device(paths, 2, NULL, 2, &st, &eng, why, sizeof why);
    cr_assert_eq(eng, NPYLOAD_ENGINE_NONE, "%s", why);
    cr_assert(strstr(why, "expanded on the host") && strstr(why, "1 of its 2 files"), "%s", why);
    cr_assert_eq(st.h2d_bytes, 2u * 2 * NR * NV * 4);
    tu_rmtree(dir);
}

/* A damaged code (past its table) in a stored narrowed file: the batch
 * fails naming the file; never wrong bytes as success. */
Test(cuda_kernels, loader_refuses_a_code_outside_the_table_on_the_device, .timeout = 120)
{
    load_fakes();
    char *dir = tu_mkdtemp("kbad");
    char f[640];
    /* 8 distinct values: codes 0..7; make one code 200 */
    uint32_t v[NR * NV];
    for (size_t i = 0; i < NR * NV; i++) {
        float x = (float)(i % 8);
        memcpy(&v[i], &x, 4);
    }
    char p[600];
    snprintf(p, sizeof p, "%s/b.npy", dir);
    const int64_t shape[4] = {NR, 3, 4, 4};
    cr_assert_geq(tu_write_npy(p, "<f4", 0, 4, shape, v, sizeof v, 64), 0);
    snprintf(f, sizeof f, "%s/b.narrow.npy", dir);
    npyload_pack_options o = {.threads = 1, .narrow = 1, .store = 1};
    npyload_pack_result r;
    char err[512];
    cr_assert_eq(npyload_pack_file(p, f, &o, sizeof o, &r, sizeof r, err, sizeof err), 0, "%s",
                 err);
    npyload_header h;
    cr_assert_eq(npyload_read_header(f, &h, err, sizeof err), 0, "%s", err);
    FILE *fp = fopen(f, "r+b");
    cr_assert_not_null(fp);
    fseek(fp, (long)h.data_offset + 5 * NV + 3, SEEK_SET); /* sample 5 */
    fputc(200, fp);
    fclose(fp);
    const char *paths[1] = {f};
    npyload_loader *L = make_loader(paths, 1, 0, NULL, 1);
    char why[1024];
    cr_assert_eq(npyload_loader_field_engine(L, 0, why, sizeof why), NPYLOAD_ENGINE_DEVICE,
                 "%s", why);
    npyload_batch *b;
    int rc, failed = 0;
    while ((rc = npyload_loader_next(L, &b)) != NPYLOAD_EOF) {
        if (rc == 0) {
            npyload_batch_release(b);
            continue;
        }
        failed++;
        const char *m = npyload_loader_errmsg(L);
        cr_assert(strstr(m, "b.narrow.npy") && strstr(m, "not in the file's table"), "%s", m);
        break;
    }
    cr_assert_eq(failed, 1, "the batch holding sample 5 failed");
    npyload_loader_destroy(L);
    tu_rmtree(dir);
}
