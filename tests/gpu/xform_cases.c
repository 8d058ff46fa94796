/* Cases shared by the kernels' tests on the CPU (tests/test_cuda_kernels.c,
 * the fake driver running the .cu itself) and on a GPU
 * (tests/gpu/test_gpu_transform.c): augmentations and narrowed codes run
 * through npyl_tdev_run_x, compared with the host engine (lib/transform)
 * and lib/zst's expansion. Float outputs may differ only where both are
 * NaN; kept dtypes, and narrowed values without a transform, byte for
 * byte. Each backend says how a kernel runs (xc_runner). */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xform_cases.h"
#include "zst/npyload_zst.h"

static uint64_t rs = 0x5eed;
uint64_t xc_rnd(void)
{
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A value of a float type of sz bytes: mostly ordinary numbers, else one
 * of the patterns that break careless code (NaN payloads, signed zeros,
 * denormals, infinities, the largest finite). */
static void float_value(unsigned char *p, size_t sz)
{
    static const uint16_t h[] = {0x7e01, 0xfe00, 0x7c01, 0x8000, 0x0000, 0x0001,
                                 0x83ff, 0x7c00, 0xfc00, 0x7bff};
    static const uint32_t f[] = {0x7fc00001u, 0xffc00123u, 0x7f800001u, 0x80000000u,
                                 0x00000000u, 0x00000001u, 0x807fffffu, 0x7f800000u,
                                 0xff800000u, 0x7f7fffffu};
    static const uint64_t d[] = {0x7ff8000000000001ull, 0xfff8000000000123ull,
                                 0x7ff0000000000001ull, 0x8000000000000000ull, 0,
                                 1, 0x800fffffffffffffull, 0x7ff0000000000000ull,
                                 0xfff0000000000000ull, 0x47efffffe0000000ull};
    uint64_t k = xc_rnd();
    if (k % 4 == 0) {
        size_t i = (size_t)(k >> 8) % 10;
        if (sz == 2)
            memcpy(p, &h[i], 2);
        else if (sz == 4)
            memcpy(p, &f[i], 4);
        else
            memcpy(p, &d[i], 8);
        return;
    }
    double v = (double)(int64_t)(k >> 20) / 4096.0 / 37.0;
    if (sz == 2) {
        uint16_t b = npyl_f32_to_f16((float)v);
        memcpy(p, &b, 2);
    } else if (sz == 4) {
        float x = (float)v;
        memcpy(p, &x, 4);
    } else {
        memcpy(p, &v, 8);
    }
}

/* n items of dtype descr (random bytes for integers, float_value for
 * floats, in the descr's byte order). */
void xc_fill(unsigned char *p, size_t n, const char *descr, size_t sz)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char *e = p + i * sz;
        if (descr[1] != 'f') {
            for (size_t b = 0; b < sz; b++)
                e[b] = (unsigned char)xc_rnd();
            continue;
        }
        float_value(e, sz);
        if (descr[0] == '>')
            for (size_t b = 0; b < sz / 2; b++) {
                unsigned char t = e[b];
                e[b] = e[sz - 1 - b];
                e[sz - 1 - b] = t;
            }
    }
}

static int is_nan(const unsigned char *p, int out)
{
    if (out == NPYLOAD_DTYPE_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        return isnan(f);
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return out == NPYLOAD_DTYPE_FLOAT16 ? (h & 0x7fff) > 0x7c00 : (h & 0x7fff) > 0x7f80;
}

/* want vs got, n bytes of p's output: equal, or both NaN (float outputs). */
void xc_same(const npyl_tplan *p, const unsigned char *want, const unsigned char *got,
                 size_t n, const char *what)
{
    size_t sz = p->out_itemsize;
    for (size_t i = 0; i < n; i += sz) {
        if (!memcmp(want + i, got + i, sz))
            continue;
        cr_assert(p->out_dtype != NPYLOAD_DTYPE_KEEP && is_nan(want + i, p->out_dtype) &&
                      is_nan(got + i, p->out_dtype),
                  "%s: element %zu differs (host vs kernel)", what, i / sz);
    }
}

typedef struct aug_case {
    float hflip, vflip;
    int64_t crop_h, crop_w, pad; /* crop: this much smaller than (H, W) */
    int signs;                   /* 0 none, 1 per channel, 2 one for all */
} aug_case;

#define AROWS 5

/* One augmentation of samples of dtype descr and shape sshape, with output
 * dtype out, channels-last or not, arithmetic or not: the kernel's rows
 * equal the host engine's. Returns 1 (compared). */
static int aug_compare(const xc_runner *run, const char *descr, int sndim, const int64_t *sshape,
                       const aug_case *c, int out, int cl, int arith, int *flips_seen)
{
    static const float mean[4] = {0.5f, -1.25f, 3.0f, 0.0f}, sd[4] = {0.25f, 2.0f, 0.75f, 3.0f};
    static const float hs[8] = {-1, 1, -1, -1, 1, -1, 1, 1}, vs[8] = {1, -1, -1, 1, -1, 1, 1, -1};
    static const float one = -1.0f;
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.dtype = out;
    t.channels_last = cl;
    t.hflip = c->hflip;
    t.vflip = c->vflip;
    if (sndim >= 2 && (c->crop_h || c->crop_w)) {
        t.crop_h = sshape[sndim - 2] + 2 * c->pad - c->crop_h;
        t.crop_w = sshape[sndim - 1] + 2 * c->pad - c->crop_w;
    }
    t.pad = sndim >= 2 ? c->pad : 0;
    /* the channels: axis 0 of the augmented sample (of two axes: its rows) */
    int64_t C = sndim == 0 ? 1 : sndim != 2 ? sshape[0]
              : t.crop_h ? t.crop_h : sshape[0] + 2 * t.pad;
    if (arith) {
        t.scale = 1.0f / 255.0f;
        t.mean = mean;
        t.std = sd;
        t.n_mean = t.n_std = C <= 4 ? (size_t)C : 1;
    }
    if (c->signs) {
        t.hflip_sign = c->signs == 1 ? hs : &one;
        t.vflip_sign = c->signs == 1 ? vs : &one;
        t.n_hflip_sign = t.n_vflip_sign = c->signs == 1 && C <= 8 ? (size_t)C : 1;
    }
    npyl_tplan p;
    char err[512];
    cr_assert_eq(npyl_transform_plan("x", &t, descr, sndim, sshape, &p, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(npyl_tdev_plan_check("x", &p, err, sizeof err), 0, "%s", err);
    size_t in_n = AROWS * p.stored_row_bytes, out_n = AROWS * p.out_row_bytes;
    unsigned char *src = malloc(in_n), *want = malloc(out_n), *got = malloc(out_n);
    unsigned char *scratch = malloc(p.in_row_bytes + 1);
    xc_fill(src, in_n / p.in_itemsize, descr, p.in_itemsize);
    int64_t idx[AROWS];
    npyl_tdev_row rec[AROWS];
    for (size_t r = 0; r < AROWS; r++) {
        idx[r] = (int64_t)(xc_rnd() % 100000);
        npyl_tdev_row_fill(&p, 11, 3, idx[r], 0, &rec[r]);
        *flips_seen |= 1 << rec[r].flips;
    }
    npyl_transform_rows_aug(&p, src, want, AROWS, 11, 3, idx, scratch);
    memset(got, 0xa5, out_n);
    run->run(run->ctx, &p, rec, AROWS, src, in_n, NULL, 0, got, out_n);
    char what[256];
    snprintf(what, sizeof what, "%s shape[%d] %lld.. -> %s cl=%d arith=%d flips %.1f/%.1f "
             "crop -%lld/-%lld pad %lld signs %d", descr, sndim, (long long)sshape[0],
             p.out_descr, cl, arith, (double)c->hflip, (double)c->vflip,
             (long long)c->crop_h, (long long)c->crop_w, (long long)c->pad, c->signs);
    xc_same(&p, want, got, out_n, what);
    free(src);
    free(want);
    free(got);
    free(scratch);
    npyl_transform_plan_free(&p);
    return 1;
}

int xc_augmentations(const xc_runner *run)
{
    static const char *const descrs[] = {"|u1", "|i1", "<i2", ">u2", "<f2", ">f2",
                                         "<f4", ">f4", "<f8", ">f8"};
    static const int64_t s3[] = {3, 7, 9}, s2[] = {6, 5}, s1[] = {4}, s4[] = {2, 3, 4, 5};
    static const int64_t *const shapes[] = {s3, s2, s1, s4};
    static const int ndims[] = {3, 2, 1, 4};
    static const aug_case cases[] = {
        {1, 0, 0, 0, 0, 0},   {0, 1, 0, 0, 0, 1},    {1, 1, 0, 0, 0, 2},
        {0.5f, 0.5f, 0, 0, 0, 1}, {0, 0, 2, 3, 0, 0}, {0, 0, 0, 0, 2, 0},
        {0.5f, 0.5f, 4, 4, 2, 1}, {1, 1, 1, 2, 1, 2}, {0.5f, 0, 6, 5, 3, 0},
    };
    int compared = 0, flips = 0;
    for (size_t d = 0; d < sizeof descrs / sizeof *descrs; d++)
        for (size_t k = 0; k < 4; k++)
            for (size_t a = 0; a < sizeof cases / sizeof *cases; a++) {
                if (cases[a].signs && descrs[d][1] != 'f')
                    continue; /* signs negate floats only (refused otherwise) */
                for (int out = NPYLOAD_DTYPE_KEEP; out <= NPYLOAD_DTYPE_BFLOAT16; out++)
                    for (int cl = 0; cl <= 1; cl++)
                        for (int ar = 0; ar <= (out != NPYLOAD_DTYPE_KEEP); ar++)
                            compared += aug_compare(run, descrs[d], ndims[k], shapes[k],
                                                    &cases[a], out, cl, ar, &flips);
            }
    cr_log_info("%d augmentations compared", compared);
    cr_assert_eq(flips, 0xf, "rows with no flip, hflip, vflip and both were compared");
    return compared;
}

/* A crop window and pad larger than the sample, at the edges of the
 * draws: every top/left the formula can give, on one row each. */
void xc_windows(const xc_runner *run)
{
    const int64_t shp[] = {2, 3, 4};
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.dtype = NPYLOAD_DTYPE_FLOAT32;
    t.crop_h = 4;
    t.crop_w = 5;
    t.pad = 2; /* padded (7, 8): 4 x 4 window positions */
    t.hflip = 0.5f;
    npyl_tplan p;
    char err[512];
    cr_assert_eq(npyl_transform_plan("x", &t, "<u2", 3, shp, &p, err, sizeof err), 0, "%s", err);
    enum { R = 400 };
    unsigned char *src = malloc(R * p.stored_row_bytes), *want = malloc(R * p.out_row_bytes);
    unsigned char *got = malloc(R * p.out_row_bytes), *scratch = malloc(p.in_row_bytes);
    xc_fill(src, R * p.stored_row_bytes / 2, "<u2", 2);
    int64_t idx[R];
    npyl_tdev_row rec[R];
    int seen[4][4] = {{0}};
    for (int r = 0; r < R; r++) {
        idx[r] = r;
        npyl_tdev_row_fill(&p, 5, 0, r, 0, &rec[r]);
        cr_assert(rec[r].top < 4 && rec[r].left < 4);
        seen[rec[r].top][rec[r].left] = 1;
    }
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 4; x++)
            cr_assert(seen[y][x], "window (%d, %d) never drawn in %d rows", y, x, R);
    npyl_transform_rows_aug(&p, src, want, R, 5, 0, idx, scratch);
    run->run(run->ctx, &p, rec, R, src, R * p.stored_row_bytes, NULL, 0, got, R * p.out_row_bytes);
    xc_same(&p, want, got, R * p.out_row_bytes, "every window");
    free(src);
    free(want);
    free(got);
    free(scratch);
    npyl_transform_plan_free(&p);
}

#define NROWS 12
#define NTABLES 3

/* Tables of `count[k]` distinct values of descr (bit patterns from fill:
 * NaN payloads, -0.0, denormals, infinities), NPYL_TDEV_TABLE entries
 * apart, unused entries zero; x[k] the same as lib/zst's table. */
static unsigned char *make_tables(const char *descr, size_t sz, const uint32_t *count,
                                  npyl_zst_narrow *x)
{
    size_t tb = NPYL_TDEV_TABLE * sz;
    unsigned char *t = calloc(NTABLES, tb);
    for (int k = 0; k < NTABLES; k++) {
        xc_fill(t + k * tb, count[k], descr, sz);
        memset(&x[k], 0, sizeof x[k]);
        snprintf(x[k].descr, sizeof x[k].descr, "%s", descr);
        x[k].count = count[k];
        x[k].itemsize = (uint32_t)sz;
        memcpy(x[k].values, t + k * tb, count[k] * sz);
    }
    return t;
}

/* Narrowed samples of dtype descr (codes of NTABLES tables, each row its
 * own table) through transform t: the kernel's output equals the host's
 * (expansion by lib/zst, then the host engine). */
static void narrow_compare(const xc_runner *run, const char *descr, size_t sz,
                           const npyload_transform *t, int sndim, const int64_t *sshape)
{
    static const uint32_t counts[NTABLES] = {13, 200, 256};
    npyl_zst_narrow x[NTABLES];
    unsigned char *tables = make_tables(descr, sz, counts, x);
    npyl_tplan p;
    char err[512];
    cr_assert_eq(npyl_transform_plan("x", t, descr, sndim, sshape, &p, err, sizeof err), 0,
                 "%s", err);
    size_t elems = p.stored_row_bytes / sz;
    unsigned char *codes = malloc(NROWS * elems), *values = malloc(NROWS * p.stored_row_bytes);
    unsigned char *want = malloc(NROWS * p.out_row_bytes), *got = malloc(NROWS * p.out_row_bytes);
    unsigned char *scratch = malloc(p.in_row_bytes);
    int64_t idx[NROWS];
    npyl_tdev_row rec[NROWS];
    for (size_t r = 0; r < NROWS; r++) {
        uint32_t k = (uint32_t)(xc_rnd() % NTABLES);
        for (size_t i = 0; i < elems; i++)
            codes[r * elems + i] = (unsigned char)(xc_rnd() % counts[k]);
        cr_assert_eq(npyl_zst_narrow_expand(&x[k], codes + r * elems, elems,
                                            values + r * p.stored_row_bytes), 0);
        idx[r] = (int64_t)(xc_rnd() % 5000);
        npyl_tdev_row_fill(&p, 2, 9, idx[r], k, &rec[r]);
    }
    if (npyl_transform_is_identity(&p))
        memcpy(want, values, NROWS * p.out_row_bytes);
    else
        npyl_transform_rows_aug(&p, values, want, NROWS, 2, 9, idx, scratch);
    memset(got, 0x5a, NROWS * p.out_row_bytes);
    run->run(run->ctx, &p, rec, NROWS, codes, NROWS * elems, tables,
           NTABLES * NPYL_TDEV_TABLE * sz, got, NROWS * p.out_row_bytes);
    char what[128];
    snprintf(what, sizeof what, "narrowed %s -> %s cl=%d aug=%d", descr, p.out_descr,
             p.channels_last, p.aug);
    xc_same(&p, want, got, NROWS * p.out_row_bytes, what);
    free(codes);
    free(values);
    free(want);
    free(got);
    free(scratch);
    free(tables);
    npyl_transform_plan_free(&p);
}

void xc_narrowed(const xc_runner *run)
{
    static const char *const descrs[] = {"<f4", ">f4", "<f8", ">f8", "<f2", ">f2",
                                         "<i4", ">u2", "<i8"};
    static const size_t sizes[] = {4, 4, 8, 8, 2, 2, 4, 2, 8};
    const int64_t shp[] = {3, 6, 10};
    for (size_t d = 0; d < sizeof descrs / sizeof *descrs; d++) {
        /* the expansion alone: a copy of table entries, exact for every
         * pattern (the identity plan keeps the dtype) */
        npyload_transform id = NPYLOAD_TRANSFORM_INIT;
        narrow_compare(run, descrs[d], sizes[d], &id, 3, shp);
        /* fused with a conversion, arithmetic, channels-last */
        for (int out = NPYLOAD_DTYPE_FLOAT32; out <= NPYLOAD_DTYPE_BFLOAT16; out++) {
            npyload_transform t = NPYLOAD_TRANSFORM_INIT;
            t.dtype = out;
            t.scale = 0.5f;
            t.channels_last = out != NPYLOAD_DTYPE_FLOAT16;
            narrow_compare(run, descrs[d], sizes[d], &t, 3, shp);
        }
        /* and with augmentation: window, pad, flips, signs (floats) */
        npyload_transform a = NPYLOAD_TRANSFORM_INIT;
        static const float sgn[3] = {-1.0f, 1.0f, -1.0f};
        a.hflip = a.vflip = 0.5f;
        a.crop_h = 5;
        a.crop_w = 9;
        a.pad = 1;
        if (descrs[d][1] == 'f') {
            a.hflip_sign = sgn;
            a.n_hflip_sign = 3;
        }
        narrow_compare(run, descrs[d], sizes[d], &a, 3, shp); /* stored dtype kept */
        a.dtype = NPYLOAD_DTYPE_FLOAT16;
        a.channels_last = 1;
        narrow_compare(run, descrs[d], sizes[d], &a, 3, shp);
    }
}

