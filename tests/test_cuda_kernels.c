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
#include <unistd.h>

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
     .fini = engine_teardown)
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
Test(cuda_kernels, loader_augments_on_the_device)
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
Test(cuda_kernels, loader_signs_on_the_device)
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
Test(cuda_kernels, loader_past_the_kernels_limits_uses_the_host_engine)
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
Test(cuda_kernels, loader_expands_narrowed_codes_on_the_device)
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
Test(cuda_kernels, loader_mixed_narrowed_and_plain_expands_on_the_host)
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
Test(cuda_kernels, loader_refuses_a_code_outside_the_table_on_the_device)
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

/* ---- hostile shapes, dtypes and sizes: device mode equals host mode ---- */

typedef struct odd_case {
    const char *descr;
    size_t itemsize;
    int sndim;
    int64_t sshape[3];
    float hflip, vflip;
    int64_t crop_h, crop_w, pad;
    int sign;      /* a -1 flip sign for every channel */
    int dtype;
    int engine;    /* the one expected in device mode */
} odd_case;

Test(cuda_kernels, loader_odd_samples_match_host_mode)
{
    load_fakes();
    static const odd_case cases[] = {
        /* 0-d samples (a file of shape (N,)): flips only sign them */
        {"<f4", 4, 0, {0}, 0.5f, 0.5f, 0, 0, 0, 1, 0, NPYLOAD_ENGINE_DEVICE},
        /* 1-d samples: a sign per element (axis 0 is the channel) */
        {">f8", 8, 1, {5}, 0.5f, 0, 0, 0, 0, 1, NPYLOAD_DTYPE_FLOAT16, NPYLOAD_ENGINE_DEVICE},
        /* 16-byte items (complex128), flipped and cropped in the stored dtype */
        {"<c16", 16, 3, {2, 4, 5}, 0.5f, 0.5f, 3, 4, 1, 0, 0, NPYLOAD_ENGINE_DEVICE},
        /* 8-byte integers converted, a window in a large pad */
        {">u8", 8, 3, {2, 3, 4}, 0.5f, 0.5f, 5, 6, 40, 0, NPYLOAD_DTYPE_FLOAT32,
         NPYLOAD_ENGINE_DEVICE},
        /* the crop is the whole padded sample */
        {"<i4", 4, 2, {3, 4}, 1, 1, 5, 6, 1, 0, NPYLOAD_DTYPE_BFLOAT16, NPYLOAD_ENGINE_DEVICE},
        /* booleans moved as bytes */
        {"|b1", 1, 2, {3, 4}, 0.5f, 0.5f, 2, 2, 1, 0, 0, NPYLOAD_ENGINE_DEVICE},
        /* float16 with signs, 2-d: axis 0 is cropped too */
        {"<f2", 2, 2, {6, 4}, 0.5f, 0.5f, 4, 3, 0, 1, 0, NPYLOAD_ENGINE_DEVICE},
    };
    char *dir = tu_mkdtemp("kodd");
    static const float minus[1] = {-1.0f};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const odd_case *c = &cases[i];
        char prefix[16];
        snprintf(prefix, sizeof prefix, "o%zu", i);
        const int64_t counts[2] = {11, LN - 11};
        cr_assert_eq(tu_write_field(dir, prefix, (uint32_t)i + 40, c->descr, c->itemsize,
                                    c->sndim, c->sshape, counts, 2, 64), 0);
        char n0[32], n1[32];
        snprintf(n0, sizeof n0, "%s_0000.npy", prefix);
        snprintf(n1, sizeof n1, "%s_0001.npy", prefix);
        char *p0 = tu_path(dir, n0), *p1 = tu_path(dir, n1);
        const char *paths[2] = {p0, p1};
        npyload_transform t = NPYLOAD_TRANSFORM_INIT;
        t.dtype = c->dtype;
        t.hflip = c->hflip;
        t.vflip = c->vflip;
        t.crop_h = c->crop_h;
        t.crop_w = c->crop_w;
        t.pad = c->pad;
        if (c->sign) {
            t.hflip_sign = t.vflip_sign = minus;
            t.n_hflip_sign = t.n_vflip_sign = 1;
        }
        npyload_stats st;
        int eng;
        char why[1024];
        cr_log_info("case %zu: %s", i, c->descr);
        host_vs_device(paths, 2, &t, 2, &st, &eng, why, sizeof why);
        cr_assert_eq(eng, c->engine, "case %zu (%s): %s", i, c->descr, why);
        free(p0);
        free(p1);
    }
    tu_rmtree(dir);
}

/* ---- two fields with records, order options, resume ---- */

typedef struct ord_cfg {
    int64_t batch, world, rank, drop_last, workers, prefetch;
} ord_cfg;

/* The captcha shape shrunk to two fields that both carry records: an
 * augmented float image ("img", crop, pad, flips with signs, float16 out,
 * channels-last) and a narrowed label ("lab", the same flips and window,
 * expanded on the device). */
typedef struct two_fields {
    char *dir;
    char img[2][600], lab[2][640];
    npyload_transform ti, tl;
} two_fields;

static const float TWO_SIGNS[3] = {-1.0f, 1.0f, -1.0f};

static void two_fields_make(two_fields *w, const char *tag)
{
    w->dir = tu_mkdtemp(tag);
    const int64_t ishape[3] = {3, 9, 11}, counts[2] = {17, 40 - 17};
    cr_assert_eq(tu_write_field(w->dir, "img", 9, "<f4", 4, 3, ishape, counts, 2, 64), 0);
    for (int k = 0; k < 2; k++) {
        snprintf(w->img[k], sizeof w->img[k], "%s/img_%04d.npy", w->dir, k);
        /* labels: 3 x 9 x 11 float32 over 200 values, narrowed (file 0 as
         * .npy.zst, file 1 stored) */
        size_t n = (size_t)counts[k] * 3 * 9 * 11;
        float *v = malloc(n * sizeof *v);
        for (size_t i = 0; i < n; i++)
            v[i] = (float)((i * 31 + (size_t)k * 7) % 200) * 0.25f - 3.0f;
        char p[600];
        snprintf(p, sizeof p, "%s/lab_%04d.npy", w->dir, k);
        const int64_t shape[4] = {counts[k], 3, 9, 11};
        cr_assert_geq(tu_write_npy(p, "<f4", 0, 4, shape, v, n * sizeof *v, 64), 0);
        free(v);
        npyload_pack_options o = {.frame_size = 900, .threads = 1, .narrow = 1, .store = k};
        char err[512];
        snprintf(w->lab[k], sizeof w->lab[k], "%s/lab_%04d.%s", w->dir, k,
                 k ? "narrow.npy" : "npy.zst");
        cr_assert_eq(npyload_pack_file(p, w->lab[k], &o, sizeof o, NULL, 0, err, sizeof err), 0,
                     "%s", err);
    }
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.hflip = 0.5f;
    t.vflip = 0.5f;
    t.crop_h = 7;
    t.crop_w = 8;
    t.pad = 2;
    t.hflip_sign = TWO_SIGNS;
    t.n_hflip_sign = 3;
    w->tl = t;
    t.dtype = NPYLOAD_DTYPE_FLOAT16;
    t.channels_last = 1;
    w->ti = t;
}

static npyload_loader *two_loader(const two_fields *w, int64_t device, const ord_cfg *c)
{
    npyload_loader *L = NULL;
    cr_assert_eq(npyload_loader_create(&L), 0);
    const char *ip[2] = {w->img[0], w->img[1]}, *lp[2] = {w->lab[0], w->lab[1]};
    cr_assert_eq(npyload_loader_add_field_files(L, "img", ip, 2), 0);
    cr_assert_eq(npyload_loader_add_field_files(L, "lab", lp, 2), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_ALIGN, 1), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, c->batch), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, c->workers), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, c->prefetch), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, NPYLOAD_SHUFFLE_FULL), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SEED, 5), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_WORLD_SIZE, c->world), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_RANK, c->rank), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DROP_LAST, c->drop_last), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, device), 0);
    if (wheel[0])
        cr_assert_eq(npyload_loader_set_path(L, NPYLOAD_PATH_NVRTC, wheel), 0);
    cr_assert_eq(npyload_loader_set_transform(L, "img", &w->ti, sizeof w->ti), 0, "%s",
                 npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set_transform(L, "lab", &w->tl, sizeof w->tl), 0, "%s",
                 npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    if (device >= 0) {
        char why[1024];
        for (size_t f = 0; f < 2; f++)
            cr_assert_eq(npyload_loader_field_engine(L, f, why, sizeof why),
                         NPYLOAD_ENGINE_DEVICE, "field %zu: %s", f, why);
    }
    return L;
}

/* What a run delivered: every batch's indices and both fields' bytes. */
typedef struct two_out {
    unsigned char *bytes;
    size_t n;
    int64_t *idx;
    size_t nidx;
    size_t batches;
} two_out;

static void two_out_free(two_out *o)
{
    free(o->bytes);
    free(o->idx);
    memset(o, 0, sizeof *o);
}

/* Up to `max` batches (SIZE_MAX: to the epoch's end) of L into o. */
static void two_take(npyload_loader *L, int device, size_t max, two_out *o)
{
    void *cs = NULL;
    if (device >= 0)
        cr_assert_eq(rt_stream_create(&cs, 1), 0);
    npyload_batch *b;
    int rc = 0;
    for (size_t k = 0; k < max && (rc = npyload_loader_next(L, &b)) == 0; k++) {
        if (device >= 0) {
            cr_assert_eq(npyload_batch_wait_stream(b, cs), 0);
            cr_assert_eq(rt_stream_sync(cs), 0);
        }
        size_t rows = npyload_batch_size(b);
        o->idx = realloc(o->idx, (o->nidx + rows) * sizeof *o->idx);
        memcpy(o->idx + o->nidx, npyload_batch_indices(b), rows * sizeof *o->idx);
        o->nidx += rows;
        for (size_t f = 0; f < 2; f++) {
            const npyload_array *a = npyload_batch_field(b, f);
            cr_assert_eq((size_t)a->shape[0], rows);
            o->bytes = realloc(o->bytes, o->n + a->nbytes);
            memcpy(o->bytes + o->n, a->data, a->nbytes);
            o->n += a->nbytes;
        }
        o->batches++;
        if (device >= 0)
            npyload_batch_release_stream(b, cs);
        else
            npyload_batch_release(b);
    }
    if (max == SIZE_MAX)
        cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
}

static void two_same(const two_out *a, const two_out *b, const char *what)
{
    cr_assert_eq(a->batches, b->batches, "%s: batches", what);
    cr_assert_eq(a->nidx, b->nidx, "%s: rows", what);
    cr_assert_eq(memcmp(a->idx, b->idx, a->nidx * sizeof *a->idx), 0, "%s: indices", what);
    cr_assert_eq(a->n, b->n, "%s: bytes", what);
    /* float16 and float32 outputs of finite inputs: byte for byte */
    cr_assert_eq(memcmp(a->bytes, b->bytes, a->n), 0, "%s: the fields' bytes", what);
}

/* Ranks, drop_last, a tiny last batch, a batch larger than a rank's share:
 * both fields' records (two record areas in one staging slot) give device
 * mode exactly host mode's rows, epoch after epoch. */
Test(cuda_kernels, loader_two_record_fields_across_order_options)
{
    load_fakes();
    two_fields w;
    two_fields_make(&w, "ktwo");
    static const ord_cfg cfgs[] = {
        {6, 1, 0, 0, 2, 3},  /* 40 = 6 x 6 + 4: a short last batch */
        {3, 3, 2, 0, 3, 2},  /* 14 a rank (padded), last batch of 2 */
        {3, 3, 1, 1, 1, 4},  /* drop_last */
        {64, 2, 1, 0, 2, 2}, /* one batch of a rank's 20 */
        {13, 1, 0, 1, NPYLOAD_WORKERS_SYNC, 2},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++) {
        two_out h = {0}, d = {0};
        npyload_loader *H = two_loader(&w, -1, &cfgs[i]);
        npyload_loader *D = two_loader(&w, 0, &cfgs[i]);
        for (uint64_t e = 0; e < 2; e++) {
            cr_assert_eq(npyload_loader_set_epoch(H, e * 3 + 1), 0);
            cr_assert_eq(npyload_loader_set_epoch(D, e * 3 + 1), 0);
            two_take(H, -1, SIZE_MAX, &h);
            two_take(D, 0, SIZE_MAX, &d);
        }
        char what[64];
        snprintf(what, sizeof what, "config %zu", i);
        two_same(&h, &d, what);
        npyload_loader_destroy(H);
        npyload_loader_destroy(D);
        two_out_free(&h);
        two_out_free(&d);
    }
    tu_rmtree(w.dir);
}

/* Resume mid-epoch in device mode: get_state after 3 batches, a new loader
 * (other workers, other prefetch) set_state: the rest of the epoch equals
 * the uninterrupted run's and host mode's; set_epoch mid-epoch abandons
 * the position and the next epoch is whole. */
Test(cuda_kernels, loader_device_resume_and_set_epoch_mid_epoch)
{
    load_fakes();
    two_fields w;
    two_fields_make(&w, "kres");
    const ord_cfg a = {4, 2, 1, 0, 2, 3}, b = {4, 2, 1, 0, 3, 5};
    two_out whole = {0}, host = {0}, part = {0};
    npyload_loader *U = two_loader(&w, 0, &a);
    cr_assert_eq(npyload_loader_set_epoch(U, 7), 0);
    two_take(U, 0, SIZE_MAX, &whole);
    npyload_loader_destroy(U);
    npyload_loader *H = two_loader(&w, -1, &b);
    cr_assert_eq(npyload_loader_set_epoch(H, 7), 0);
    two_take(H, -1, SIZE_MAX, &host);
    npyload_loader_destroy(H);
    two_same(&host, &whole, "host vs device, uninterrupted");

    npyload_loader *P = two_loader(&w, 0, &a);
    cr_assert_eq(npyload_loader_set_epoch(P, 7), 0);
    two_take(P, 0, 3, &part);
    npyload_state st;
    cr_assert_eq(npyload_loader_get_state(P, &st), 0);
    cr_assert_eq(st.consumed, 12);
    /* set_epoch mid-epoch with batches in flight, then the epoch again */
    cr_assert_eq(npyload_loader_set_epoch(P, 8), 0);
    npyload_batch *held;
    cr_assert_eq(npyload_loader_next(P, &held), 0);
    cr_assert_eq(npyload_loader_set_epoch(P, 7), 0);
    npyload_batch_release(held);
    two_out again = {0};
    two_take(P, 0, SIZE_MAX, &again);
    two_same(&whole, &again, "set_epoch mid-epoch, then the epoch again");
    npyload_loader_destroy(P);

    npyload_loader *R = two_loader(&w, 0, &b);
    cr_assert_eq(npyload_loader_set_state(R, &st), 0, "%s", npyload_loader_errmsg(R));
    two_take(R, 0, SIZE_MAX, &part);
    npyload_loader_destroy(R);
    two_same(&whole, &part, "resumed");
    two_out_free(&whole);
    two_out_free(&host);
    two_out_free(&part);
    two_out_free(&again);
    tu_rmtree(w.dir);
}

/* ON_ERROR skip in device mode over damaged narrowed files: a code past
 * the table in one sample of the stored file, a damaged frame of the
 * .npy.zst (4 samples), and then the stored file cut short after start.
 * Device mode skips exactly the samples host mode skips, and the rows it
 * keeps carry the same values (their records follow the compacted rows). */
static npyload_loader *skip_loader(const two_fields *w, int64_t device, int64_t workers)
{
    npyload_loader *M = NULL;
    cr_assert_eq(npyload_loader_create(&M), 0);
    const char *ip[2] = {w->img[0], w->img[1]}, *lp[2] = {w->lab[0], w->lab[1]};
    cr_assert_eq(npyload_loader_add_field_files(M, "img", ip, 2), 0);
    cr_assert_eq(npyload_loader_add_field_files(M, "lab", lp, 2), 0);
    cr_assert_eq(npyload_loader_set(M, NPYLOAD_OPT_ALIGN, 1), 0);
    cr_assert_eq(npyload_loader_set(M, NPYLOAD_OPT_BATCH_SIZE, 5), 0);
    cr_assert_eq(npyload_loader_set(M, NPYLOAD_OPT_NUM_WORKERS, workers), 0);
    cr_assert_eq(npyload_loader_set(M, NPYLOAD_OPT_SHUFFLE, NPYLOAD_SHUFFLE_FULL), 0);
    cr_assert_eq(npyload_loader_set(M, NPYLOAD_OPT_SEED, 11), 0);
    cr_assert_eq(npyload_loader_set(M, NPYLOAD_OPT_ON_ERROR, 1), 0);
    cr_assert_eq(npyload_loader_set(M, NPYLOAD_OPT_DEVICE, device), 0);
    if (wheel[0])
        cr_assert_eq(npyload_loader_set_path(M, NPYLOAD_PATH_NVRTC, wheel), 0);
    cr_assert_eq(npyload_loader_set_transform(M, "img", &w->ti, sizeof w->ti), 0);
    cr_assert_eq(npyload_loader_set_transform(M, "lab", &w->tl, sizeof w->tl), 0);
    cr_assert_eq(npyload_loader_start(M), 0, "%s", npyload_loader_errmsg(M));
    return M;
}

Test(cuda_kernels, loader_device_skip_over_damaged_narrowed_files)
{
    load_fakes();
    two_fields w;
    two_fields_make(&w, "kskip");
    char err[512];
    /* lab file 1 (stored, 23 samples of 297 codes): sample 4's first code
     * past the table */
    npyload_header hd;
    cr_assert_eq(npyload_read_header(w.lab[1], &hd, err, sizeof err), 0, "%s", err);
    FILE *fp = fopen(w.lab[1], "r+b");
    cr_assert_not_null(fp);
    fseek(fp, (long)hd.data_offset + 4 * 297, SEEK_SET);
    fputc(250, fp);
    fclose(fp);
    /* lab file 0 (.npy.zst, 4 samples a frame): a byte in frame 2 */
    npyload_zst_file *z;
    cr_assert_eq(npyload_zst_file_open(w.lab[0], &z, err, sizeof err), 0, "%s", err);
    uint64_t off, csz, dsz;
    cr_assert_eq(npyload_zst_file_frame(z, 2, &off, &csz, &dsz), 0);
    npyload_zst_file_close(z);
    fp = fopen(w.lab[0], "r+b");
    cr_assert_not_null(fp);
    fseek(fp, (long)(off + csz / 2), SEEK_SET);
    int byte = fgetc(fp);
    fseek(fp, (long)(off + csz / 2), SEEK_SET);
    fputc(byte ^ 0x5a, fp);
    fclose(fp);
    for (int phase = 0; phase < 2; phase++) {
        npyload_loader *L[2];
        two_out o[2] = {{0}, {0}};
        for (int k = 0; k < 2; k++)
            L[k] = skip_loader(&w, k ? 0 : -1, phase ? 3 : 1);
        if (phase == 1) /* after start: the stored file loses its last 3 samples */
            cr_assert_eq(truncate(w.lab[1], (off_t)(hd.data_offset + 20 * 297)), 0);
        for (int k = 0; k < 2; k++) {
            if (phase == 1)
                cr_assert_eq(npyload_loader_set_epoch(L[k], 2), 0);
            two_take(L[k], k ? 0 : -1, SIZE_MAX, &o[k]);
        }
        npyload_stats sh, sd;
        npyload_loader_get_stats(L[0], &sh, sizeof sh);
        npyload_loader_get_stats(L[1], &sd, sizeof sd);
        cr_log_info("phase %d: skipped host %llu device %llu, rows %zu", phase,
                    (unsigned long long)sh.samples_skipped,
                    (unsigned long long)sd.samples_skipped, o[1].nidx);
        if (phase == 0) {
            cr_assert_eq(sh.samples_skipped, 5, "sample 17+4 and frame 2's 4 samples");
            cr_assert_eq(sd.samples_skipped, sh.samples_skipped);
            cr_assert_eq(o[1].nidx, 40 - 5);
        }
        two_same(&o[0], &o[1], "skip: host vs device");
        for (int k = 0; k < 2; k++) {
            npyload_loader_destroy(L[k]);
            two_out_free(&o[k]);
        }
    }
    tu_rmtree(w.dir);
}

/* destroy mid-epoch with device batches held (their kernels read the
 * records and the narrowed tables) and workers busy: the held batches stay
 * right, read after destroy, and their release frees the rest (ASan sees
 * any table or record buffer freed while a kernel still reads it). */
Test(cuda_kernels, loader_device_destroy_with_record_batches_held)
{
    load_fakes();
    two_fields w;
    two_fields_make(&w, "kheld");
    const ord_cfg c = {4, 1, 0, 0, 3, 6};
    two_out want = {0};
    npyload_loader *H = two_loader(&w, -1, &c);
    two_take(H, -1, 3, &want);
    npyload_loader_destroy(H);
    for (int wait_first = 0; wait_first < 2; wait_first++) {
        npyload_loader *D = two_loader(&w, 0, &c);
        npyload_batch *b[3];
        void *cs = NULL;
        cr_assert_eq(rt_stream_create(&cs, 1), 0);
        for (int k = 0; k < 3; k++) {
            cr_assert_eq(npyload_loader_next(D, &b[k]), 0, "%s", npyload_loader_errmsg(D));
            if (wait_first)
                cr_assert_eq(npyload_batch_wait_stream(b[k], cs), 0);
        }
        npyload_loader_destroy(D);
        two_out got = {0};
        for (int k = 0; k < 3; k++) {
            cr_assert_eq(npyload_batch_wait_stream(b[k], cs), 0);
            cr_assert_eq(rt_stream_sync(cs), 0);
            size_t rows = npyload_batch_size(b[k]);
            got.idx = realloc(got.idx, (got.nidx + rows) * sizeof *got.idx);
            memcpy(got.idx + got.nidx, npyload_batch_indices(b[k]), rows * sizeof *got.idx);
            got.nidx += rows;
            for (size_t f = 0; f < 2; f++) {
                const npyload_array *a = npyload_batch_field(b[k], f);
                got.bytes = realloc(got.bytes, got.n + a->nbytes);
                memcpy(got.bytes + got.n, a->data, a->nbytes);
                got.n += a->nbytes;
            }
            got.batches++;
            npyload_batch_release_stream(b[k], cs);
        }
        two_same(&want, &got, "batches held across destroy");
        two_out_free(&got);
    }
    two_out_free(&want);
    tu_rmtree(w.dir);
}

/* A batch of more rows than a grid has blocks in y (65535): the kernels
 * walk the rows grid-stride, records and narrowed codes included, and
 * every row equals host mode's. */
Test(cuda_kernels, loader_batches_past_the_grid_limit)
{
    load_fakes();
    char *dir = tu_mkdtemp("kbig");
    enum { BIG = 70001 };
    const int64_t sshape[2] = {2, 3}, counts[1] = {BIG};
    cr_assert_eq(tu_write_field(dir, "b", 12, "<f4", 4, 2, sshape, counts, 1, 64), 0);
    char *p0 = tu_path(dir, "b_0000.npy");
    static const float minus[1] = {-1.0f};
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.hflip = 0.5f;
    t.vflip = 0.5f;
    t.hflip_sign = minus;
    t.n_hflip_sign = 1;
    t.pad = 1;
    t.crop_h = 2;
    t.crop_w = 2;
    for (int device = -1; device <= 0; device++) {
        npyload_loader *L = NULL;
        cr_assert_eq(npyload_loader_create(&L), 0);
        cr_assert_eq(npyload_loader_add_field_files(L, "b", (const char *[]){p0}, 1), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, BIG - 1), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, 1), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, 1), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SEED, 3), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, NPYLOAD_SHUFFLE_FULL), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DEVICE, device), 0);
        if (wheel[0])
            cr_assert_eq(npyload_loader_set_path(L, NPYLOAD_PATH_NVRTC, wheel), 0);
        cr_assert_eq(npyload_loader_set_transform(L, "b", &t, sizeof t), 0);
        cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
        static two_out o[2];
        two_out *out = &o[device + 1];
        memset(out, 0, sizeof *out);
        void *cs = NULL;
        if (device >= 0)
            cr_assert_eq(rt_stream_create(&cs, 1), 0);
        npyload_batch *b;
        int rc;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            if (device >= 0) {
                cr_assert_eq(npyload_batch_wait_stream(b, cs), 0);
                cr_assert_eq(rt_stream_sync(cs), 0);
            }
            const npyload_array *a = npyload_batch_field(b, 0);
            out->bytes = realloc(out->bytes, out->n + a->nbytes);
            memcpy(out->bytes + out->n, a->data, a->nbytes);
            out->n += a->nbytes;
            out->batches++;
            npyload_batch_release(b);
        }
        cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
        npyload_loader_destroy(L);
        if (device == 0) {
            cr_assert_eq(o[1].batches, 2);
            cr_assert_eq(o[1].n, (size_t)BIG * 2 * 2 * 4, "2 x 2 windows of float32");
            npyl_tplan p = {.out_dtype = NPYLOAD_DTYPE_KEEP, .out_itemsize = 4};
            xc_same(&p, o[0].bytes, o[1].bytes, o[0].n, "70000-row batches");
            two_out_free(&o[0]);
            two_out_free(&o[1]);
        }
    }
    free(p0);
    tu_rmtree(dir);
}
