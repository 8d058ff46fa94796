/* Tests for lib/transform: checking and planning, and the host engine
 * against an independent scalar reference written here: elements decoded
 * byte by byte (no memcpy + bswap), float16 decoded with ldexp, float16 and
 * bfloat16 rounding done in double with nearbyint (the library uses integer
 * bit tricks and F16C), the arithmetic as three float32 steps through
 * volatile temporaries. Every input dtype x output dtype x layout x byte
 * order, C = 1, 3, 4 and others, odd spatial sizes, blocks larger than the
 * engine's chunks. */
#include <criterion/criterion.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transform/npyload_transform.h"

/* ---- reference ---------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* binary16 -> double from its fields. */
static double ref_h2d(unsigned h)
{
    int sign = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, -24);
    else
        v = ldexp(1024 + m, e - 25);
    return sign ? -v : v;
}

/* Rounds a finite or infinite v (exactly representable in double) to a
 * binary format with mbits stored mantissa bits and ebits exponent bits,
 * round to nearest even; returns the bits. NaN is the caller's business. */
static unsigned ref_round(double v, int mbits, int ebits)
{
    unsigned sign = signbit(v) ? 1u << (mbits + ebits) : 0;
    double a = fabs(v);
    int bias = (1 << (ebits - 1)) - 1, emin = 1 - bias;
    unsigned inf = ((1u << ebits) - 1) << mbits;
    if (a == 0)
        return sign;
    if (isinf(a))
        return sign | inf;
    int E = ilogb(a);
    if (E < emin)
        E = emin;
    double q = nearbyint(ldexp(a, mbits - E)); /* a / 2^(E-mbits) */
    if (q >= ldexp(1, mbits + 1)) {
        q /= 2;
        E++;
    }
    if (E + bias >= (1 << ebits) - 1)
        return sign | inf;
    unsigned uq = (unsigned)q;
    if (uq < (1u << mbits)) /* subnormal (exponent field 0) */
        return sign | uq;
    return sign | ((unsigned)(E + bias) << mbits) | (uq - (1u << mbits));
}

static unsigned ref_f2h(float f)
{
    if (isnan(f))
        return 0x7e00;
    return ref_round(f, 10, 5);
}

static unsigned ref_f2bf(float f)
{
    if (isnan(f))
        return 0x7fc0;
    return ref_round(f, 7, 8);
}

/* Element i of a raw array of dtype (kind, size, big) as float32. */
static float ref_load(const unsigned char *base, size_t i, char kind,
                      size_t size, int big)
{
    const unsigned char *p = base + i * size;
    uint64_t u = 0;
    for (size_t k = 0; k < size; k++) {
        unsigned b = big ? p[k] : p[size - 1 - k];
        u = (u << 8) | b;
    }
    if (kind == 'u')
        return (float)u;
    if (kind == 'i') {
        int64_t s = size == 8 ? (int64_t)u
                              : (u & (1ull << (8 * size - 1)))
                                    ? (int64_t)u - (int64_t)(1ull << (8 * size))
                                    : (int64_t)u;
        return (float)s;
    }
    if (size == 2)
        return (float)ref_h2d((unsigned)u);
    if (size == 4) {
        uint32_t w = (uint32_t)u;
        float f;
        memcpy(&f, &w, 4);
        return f;
    }
    double d;
    memcpy(&d, &u, 8);
    return (float)d;
}

static float ref_arith(float x, int arith, float scale, float m, float s)
{
    volatile float t = x;
    if (arith >= 1) {
        t = t * scale;
    }
    if (arith == 2) {
        t = t - m;
        t = t / s;
    }
    return t;
}

/* Distance in units in the last place between two values of a binary
 * format given as bits (sign-magnitude mapped onto a line). */
static int64_t ulps(uint64_t a, uint64_t b, int bits)
{
    uint64_t sbit = 1ull << (bits - 1);
    int64_t ia = (a & sbit) ? -(int64_t)(a & (sbit - 1)) : (int64_t)a;
    int64_t ib = (b & sbit) ? -(int64_t)(b & (sbit - 1)) : (int64_t)b;
    return ia > ib ? ia - ib : ib - ia;
}

static int is_nan_bits(uint64_t u, int out)
{
    if (out == NPYLOAD_DTYPE_FLOAT32)
        return (u & 0x7fffffffu) > 0x7f800000u;
    if (out == NPYLOAD_DTYPE_FLOAT16)
        return (u & 0x7fffu) > 0x7c00u;
    return (u & 0x7fffu) > 0x7f80u;
}

/* ---- random inputs ------------------------------------------------------ */

static void put_be_le(unsigned char *p, uint64_t u, size_t size, int big)
{
    for (size_t k = 0; k < size; k++)
        p[big ? size - 1 - k : k] = (unsigned char)(u >> (8 * k));
}

static void fill(unsigned char *buf, size_t n, char kind, size_t size, int big)
{
    static const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN,
                                     1e-45f, -1e-40f, 6e-8f, 2.98e-8f,
                                     65504.0f, 65520.0f, 65519.0f, 1e30f,
                                     3.0e38f, -2.5f, 1.0f + 0x1p-11f};
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd(), u;
        if (kind != 'f') {
            u = r;
            if (r % 7 == 0) /* extremes */
                u = (r & 8) ? ~0ull : (1ull << (8 * size - 1));
        } else if (size == 2) {
            u = r & 0xffff; /* every pattern: NaN, inf, subnormal */
        } else {
            float f;
            switch (r % 4) {
            case 0: f = specials[(r >> 8) % (sizeof specials / sizeof specials[0])]; break;
            case 1: f = (float)((int64_t)(r >> 40) - (1 << 23)) / 32768.0f; break;
            default: f = ldexpf((float)(r >> 40) / 16777216.0f, (int)((r >> 8) % 80) - 40);
                     if (r & 1) f = -f;
            }
            if (size == 4) {
                uint32_t w;
                memcpy(&w, &f, 4);
                u = w;
            } else {
                double d = (r % 3 == 0) ? (double)f : (double)f * (1.0 + ldexp((double)(r >> 44), -40));
                memcpy(&u, &d, 8);
            }
        }
        put_be_le(buf + i * size, u, size, big);
    }
}

/* ---- the matrix --------------------------------------------------------- */

typedef struct shape {
    int ndim;
    int64_t d[4];
} shape;

static const shape SHAPES[] = {
    {3, {1, 5, 7}},   {3, {3, 5, 7}},    {3, {4, 3, 9}},    {2, {4, 33}},
    {4, {3, 2, 3, 5}}, {3, {3, 37, 61}}, {3, {2, 45, 47}}, {2, {2500, 3}},
    {1, {6}},         {3, {3, 1, 1}},
};
#define NSHAPES (sizeof SHAPES / sizeof SHAPES[0])

static const float MEAN[] = {0.485f, 0.456f, 0.406f, 0.5f};
static const float STD[] = {0.229f, 0.224f, 0.225f, 0.25f};

/* Runs one configuration through the engine and the reference; returns the
 * largest ulp distance, or -1 on a NaN mismatch / exactness failure (with a
 * message). */
static void run_one(const char *descr, int out, int cl, const shape *sh,
                    int arith, int portable, size_t rows)
{
    char kind = descr[1];
    size_t size = (size_t)atoi(descr + 2);
    int big = descr[0] == '>';
    uint64_t C = (uint64_t)sh->d[0], elems = 1;
    for (int k = 0; k < sh->ndim; k++)
        elems *= (uint64_t)sh->d[k];
    uint64_t S = elems / C;

    float *mean = NULL, *stdv = NULL;
    npyload_transform t = {.scale = 1.0f, .dtype = out, .channels_last = cl};
    if (arith >= 1)
        t.scale = 1.0f / 255.0f;
    if (arith == 2) {
        mean = malloc(C * sizeof *mean);
        stdv = malloc(C * sizeof *stdv);
        for (uint64_t c = 0; c < C; c++) {
            mean[c] = MEAN[c % 4] * (float)(c + 1);
            stdv[c] = STD[c % 4] / (float)(c + 1);
        }
        t.mean = mean;
        t.std = stdv;
        t.n_mean = t.n_std = C; /* per channel; C = 1 gives one value */
    }
    npyl_tplan p;
    char err[256];
    int rc = portable ? npyl_transform_plan_portable("images", &t, descr, sh->ndim, sh->d, &p, err, sizeof err)
                      : npyl_transform_plan("images", &t, descr, sh->ndim, sh->d, &p, err, sizeof err);
    cr_assert_eq(rc, 0, "%s -> %d: plan failed: %s", descr, out, err);
    size_t osz = out == NPYLOAD_DTYPE_FLOAT32 ? 4 : 2;
    cr_assert_eq(p.out_itemsize, osz);
    cr_assert_eq(p.out_row_bytes, elems * osz);
    cr_assert_eq(p.in_row_bytes, elems * size);

    size_t n = rows * elems;
    unsigned char *src = malloc(n * size), *dst = malloc(n * osz + 64);
    cr_assert(src && dst);
    fill(src, n, kind, size, big);
    memset(dst, 0xA5, n * osz + 64);
    npyl_transform_rows(&p, src, dst, rows);
    for (size_t k = 0; k < 64; k++)
        cr_assert_eq(dst[n * osz + k], 0xA5, "%s: wrote past the output", descr);

    int64_t worst = 0;
    for (size_t r = 0; r < rows; r++)
        for (uint64_t c = 0; c < C; c++)
            for (uint64_t s = 0; s < S; s++) {
                size_t ii = r * elems + c * S + s;
                /* the output position from the plan's strides */
                size_t oi = r * (size_t)p.strides[0];
                if (sh->ndim >= 1) {
                    oi += c * (size_t)p.strides[1];
                    uint64_t rem = s;
                    for (int d = sh->ndim - 1; d >= 1; d--) {
                        oi += (rem % (uint64_t)sh->d[d]) * (size_t)p.strides[d + 1];
                        rem /= (uint64_t)sh->d[d];
                    }
                }
                float x = ref_load(src, ii, kind, size, big);
                float y = ref_arith(x, arith, t.scale, arith == 2 ? mean[c] : 0,
                                    arith == 2 ? stdv[c] : 1);
                uint64_t want, got = 0;
                int bits;
                if (out == NPYLOAD_DTYPE_FLOAT32) {
                    uint32_t w;
                    memcpy(&w, &y, 4);
                    want = w;
                    uint32_t g;
                    memcpy(&g, dst + oi * 4, 4);
                    got = g;
                    bits = 32;
                } else {
                    want = out == NPYLOAD_DTYPE_FLOAT16 ? ref_f2h(y) : ref_f2bf(y);
                    uint16_t g;
                    memcpy(&g, dst + oi * 2, 2);
                    got = g;
                    bits = 16;
                }
                if (isnan(y)) {
                    cr_assert(is_nan_bits(got, out),
                              "%s -> %d cl=%d arith=%d: row %zu c %llu s %llu: "
                              "NaN expected, got 0x%llx", descr, out, cl, arith,
                              r, (unsigned long long)c, (unsigned long long)s,
                              (unsigned long long)got);
                    continue;
                }
                int64_t u = ulps(want, got, bits);
                /* casts bit for bit; arithmetic within one ulp */
                cr_assert(u <= (arith ? 1 : 0),
                          "%s -> %d cl=%d arith=%d portable=%d shape #%d: row "
                          "%zu c %llu s %llu: x=%.9g y=%.9g want 0x%llx got "
                          "0x%llx (%lld ulp)", descr, out, cl, arith, portable,
                          (int)(sh - SHAPES), r, (unsigned long long)c,
                          (unsigned long long)s, (double)x, (double)y,
                          (unsigned long long)want, (unsigned long long)got,
                          (long long)u);
                if (u > worst)
                    worst = u;
            }
    free(src);
    free(dst);
    free(mean);
    free(stdv);
    npyl_transform_plan_free(&p);
}

static void run_matrix(const char *descr)
{
    for (int out = NPYLOAD_DTYPE_FLOAT32; out <= NPYLOAD_DTYPE_BFLOAT16; out++)
        for (int cl = 0; cl <= 1; cl++)
            for (size_t k = 0; k < NSHAPES; k++)
                for (int arith = 0; arith <= 2; arith++)
                    for (int portable = 0; portable <= 1; portable++)
                        run_one(descr, out, cl, &SHAPES[k], arith, portable,
                                k >= 5 && k <= 7 ? 2 : 3);
}

Test(transform_matrix, u1) { run_matrix("|u1"); }
Test(transform_matrix, i1) { run_matrix("|i1"); }
Test(transform_matrix, u2) { run_matrix("<u2"); run_matrix(">u2"); }
Test(transform_matrix, i2) { run_matrix("<i2"); run_matrix(">i2"); }
Test(transform_matrix, u4) { run_matrix("<u4"); run_matrix(">u4"); }
Test(transform_matrix, i4) { run_matrix("<i4"); run_matrix(">i4"); }
Test(transform_matrix, u8) { run_matrix("<u8"); run_matrix(">u8"); }
Test(transform_matrix, i8) { run_matrix("<i8"); run_matrix(">i8"); }
Test(transform_matrix, f2) { run_matrix("<f2"); run_matrix(">f2"); }
Test(transform_matrix, f4) { run_matrix("<f4"); run_matrix(">f4"); }
Test(transform_matrix, f8) { run_matrix("<f8"); run_matrix(">f8"); }

/* One mean/std value for every channel, and scale only. */
Test(transform_matrix, broadcast_mean_std)
{
    const int64_t shp[] = {3, 5, 7};
    float m = 0.5f, s = 0.25f;
    npyload_transform t = {.dtype = NPYLOAD_DTYPE_FLOAT16, .scale = 2.0f, .mean = &m,
                        .n_mean = 1, .std = &s, .n_std = 1, .channels_last = 1};
    npyl_tplan p;
    char err[256];
    cr_assert_eq(npyl_transform_plan("x", &t, "|u1", 3, shp, &p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(p.per_channel, 0);
    uint8_t src[105];
    uint16_t dst[105];
    for (int i = 0; i < 105; i++)
        src[i] = (uint8_t)(i * 37);
    npyl_transform_rows(&p, src, dst, 1);
    for (int c = 0; c < 3; c++)
        for (int k = 0; k < 35; k++) {
            volatile float y = (float)src[c * 35 + k] * 2.0f;
            y = y - 0.5f;
            y = y / 0.25f;
            cr_assert_eq(dst[k * 3 + c], ref_f2h(y));
        }
    npyl_transform_plan_free(&p);
}

/* One-byte integer input is looked up in the plan's tables (issue 37): the
 * same bytes as computing each item, for every stored value, channel,
 * output dtype, layout and arithmetic (per-channel or one mean/std), F16C
 * or portable. The computed engine is the plan with its tables taken away;
 * the matrix above checks it against the reference. */
static void lut_case(const char *descr, int out, int cl, int arith, int per_channel,
                     int portable, const shape *sh)
{
    uint64_t C = (uint64_t)sh->d[0], elems = 1;
    for (int k = 0; k < sh->ndim; k++)
        elems *= (uint64_t)sh->d[k];
    float mean[64], stdv[64];
    for (uint64_t c = 0; c < C && c < 64; c++) {
        mean[c] = MEAN[c % 4] * (float)(c + 1);
        stdv[c] = STD[c % 4] / (float)(c + 1);
    }
    npyload_transform t = {.scale = arith ? 1.0f / 255.0f : 1.0f, .dtype = out,
                           .channels_last = cl};
    if (arith == 2) {
        t.mean = mean;
        t.std = stdv;
        t.n_mean = t.n_std = per_channel ? C : 1;
    }
    npyl_tplan p;
    char err[256];
    int rc = portable ? npyl_transform_plan_portable("x", &t, descr, sh->ndim, sh->d, &p, err,
                                                     sizeof err)
                      : npyl_transform_plan("x", &t, descr, sh->ndim, sh->d, &p, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_not_null(p.lut, "%s -> %d: no lookup table", descr, out);
    npyl_tplan computed = p;
    computed.lut = NULL;
    /* Enough rows that every channel sees all 256 byte values. */
    size_t rows = (size_t)((256 + elems / C - 1) / (elems / C));
    size_t n = rows * elems, osz = p.out_itemsize;
    unsigned char *src = malloc(n), *a = malloc(n * osz), *b = malloc(n * osz);
    cr_assert(src && a && b);
    uint64_t S = elems / C;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = i / elems, c = i % elems / S, sp = i % S;
        src[i] = (unsigned char)(r * S + sp + 13 * c);
    }
    npyl_transform_rows(&p, src, a, rows);
    npyl_transform_rows(&computed, src, b, rows);
    for (size_t i = 0; i < n * osz; i++)
        cr_assert_eq(a[i], b[i], "%s -> %d cl=%d arith=%d per_channel=%d portable=%d shape "
                     "#%d: byte %zu differs (looked up 0x%02x, computed 0x%02x)", descr, out,
                     cl, arith, per_channel, portable, (int)(sh - SHAPES), i, a[i], b[i]);
    free(src);
    free(a);
    free(b);
    npyl_transform_plan_free(&p);
}

Test(transform_lut, one_byte_input_looked_up_gives_the_computed_bytes)
{
    const char *descrs[] = {"|u1", "|i1"};
    for (int d = 0; d < 2; d++)
        for (int out = NPYLOAD_DTYPE_FLOAT32; out <= NPYLOAD_DTYPE_BFLOAT16; out++)
            for (int cl = 0; cl <= 1; cl++)
                for (int arith = 0; arith <= 2; arith++)
                    for (int pc = 0; pc <= 1; pc++)
                        for (int portable = 0; portable <= 1; portable++)
                            for (size_t k = 0; k < NSHAPES; k++)
                                if (!(pc && SHAPES[k].d[0] > 64))
                                    lut_case(descrs[d], out, cl, arith, pc, portable,
                                             &SHAPES[k]);
}

/* Tables only while they stay small: 3 x 64 channels of float32 would be
 * 192 KiB, so those items are computed; a cast or one mean/std is 1 table. */
Test(transform_lut, tables_bounded)
{
    const int64_t big[] = {192, 4, 4}, one[] = {2500, 3};
    float m[192], sd[192];
    for (int c = 0; c < 192; c++) {
        m[c] = 0.5f;
        sd[c] = 0.25f + (float)c;
    }
    npyload_transform t = {.dtype = NPYLOAD_DTYPE_FLOAT32, .scale = 1.0f, .mean = m,
                           .n_mean = 192, .std = sd, .n_std = 192};
    npyl_tplan p;
    char err[256];
    cr_assert_eq(npyl_transform_plan("x", &t, "|u1", 3, big, &p, err, sizeof err), 0, "%s", err);
    cr_assert_null(p.lut);
    npyl_transform_plan_free(&p);
    t.n_mean = t.n_std = 1;
    cr_assert_eq(npyl_transform_plan("x", &t, "|u1", 2, one, &p, err, sizeof err), 0, "%s", err);
    cr_assert_not_null(p.lut);
    npyl_transform_plan_free(&p);
    t.dtype = NPYLOAD_DTYPE_FLOAT16;
    cr_assert_eq(npyl_transform_plan("x", &t, "<u2", 2, one, &p, err, sizeof err), 0, "%s", err);
    cr_assert_null(p.lut); /* two-byte input: computed */
    npyl_transform_plan_free(&p);
}

/* ---- keep: copies and permutations ------------------------------------- */

Test(transform_keep, identity_and_channels_last_permute)
{
    static const char *const descrs[] = {"|u1", "<i2", ">f4", "<f8", "<c16", "|b1"};
    const int64_t shp[] = {3, 5, 7};
    for (size_t k = 0; k < sizeof descrs / sizeof descrs[0]; k++) {
        size_t sz = (size_t)atoi(descrs[k] + 2);
        for (int cl = 0; cl <= 1; cl++) {
            npyload_transform t = {.scale = 1.0f, .channels_last = cl};
            npyl_tplan p;
            char err[256];
            cr_assert_eq(npyl_transform_plan("x", &t, descrs[k], 3, shp, &p, err, sizeof err), 0, "%s", err);
            cr_assert_str_eq(p.out_descr, descrs[k]);
            cr_assert_eq(npyl_transform_is_identity(&p), !cl);
            size_t n = 2 * 105 * sz;
            unsigned char *src = malloc(n), *dst = malloc(n);
            for (size_t i = 0; i < n; i++)
                src[i] = (unsigned char)rnd();
            npyl_transform_rows(&p, src, dst, 2);
            for (size_t r = 0; r < 2; r++)
                for (size_t c = 0; c < 3; c++)
                    for (size_t s = 0; s < 35; s++) {
                        size_t o = cl ? s * 3 + c : c * 35 + s;
                        cr_assert(!memcmp(dst + (r * 105 + o) * sz,
                                          src + (r * 105 + c * 35 + s) * sz, sz),
                                  "%s cl=%d", descrs[k], cl);
                    }
            free(src);
            free(dst);
            npyl_transform_plan_free(&p);
        }
    }
}

Test(transform_keep, cast_to_same_type_is_a_copy)
{
    const int64_t shp[] = {2, 3};
    npyload_transform t = {.scale = 1.0f, .dtype = NPYLOAD_DTYPE_FLOAT32};
    npyl_tplan p;
    char err[256];
    cr_assert_eq(npyl_transform_plan("x", &t, "<f4", 2, shp, &p, err, sizeof err), 0);
    cr_assert_eq(p.out_dtype, NPYLOAD_DTYPE_KEEP);
    cr_assert(npyl_transform_is_identity(&p));
    npyl_transform_plan_free(&p);
    cr_assert_eq(npyl_transform_plan("x", &t, ">f4", 2, shp, &p, err, sizeof err), 0);
    cr_assert_eq(p.out_dtype, NPYLOAD_DTYPE_FLOAT32, "a byte swap is not a copy");
    cr_assert_str_eq(p.out_descr, "<f4");
    npyl_transform_plan_free(&p);
}

/* ---- plan: descr, row bytes, strides ------------------------------------ */

Test(transform_plan, descr_rows_strides)
{
    const int64_t shp[] = {3, 5, 7};
    npyl_tplan p;
    char err[256];
    npyload_transform t = {.scale = 1.0f, .dtype = NPYLOAD_DTYPE_FLOAT16, .channels_last = 1};
    cr_assert_eq(npyl_transform_plan("x", &t, "|u1", 3, shp, &p, err, sizeof err), 0);
    cr_assert_str_eq(p.out_descr, "<f2");
    cr_assert_eq(p.in_row_bytes, 105);
    cr_assert_eq(p.out_row_bytes, 210);
    const int64_t want_cl[] = {105, 1, 21, 3};
    for (int d = 0; d < 4; d++) {
        cr_assert_eq(p.strides[d], want_cl[d], "dim %d", d);
        cr_assert_eq(p.byte_strides[d], 2 * want_cl[d]);
    }
    npyl_transform_plan_free(&p);

    t.channels_last = 0;
    t.dtype = NPYLOAD_DTYPE_BFLOAT16;
    cr_assert_eq(npyl_transform_plan("x", &t, ">i4", 3, shp, &p, err, sizeof err), 0);
    cr_assert_str_eq(p.out_descr, "bfloat16");
    cr_assert_eq(p.in_swap, 1);
    const int64_t want[] = {105, 35, 7, 1};
    for (int d = 0; d < 4; d++)
        cr_assert_eq(p.strides[d], want[d], "dim %d", d);
    npyl_transform_plan_free(&p);

    t.dtype = NPYLOAD_DTYPE_FLOAT32;
    t.channels_last = 1;
    const int64_t one[] = {4};
    cr_assert_eq(npyl_transform_plan("x", &t, "<f8", 1, one, &p, err, sizeof err), 0);
    cr_assert_eq(p.channels_last, 0, "one axis: channels-last is the same layout");
    cr_assert_eq(p.strides[0], 4);
    cr_assert_eq(p.strides[1], 1);
    cr_assert_str_eq(p.out_descr, "<f4");
    npyl_transform_plan_free(&p);
}

/* ---- errors: each names the field and the member ------------------------ */

static void expect_error(const npyload_transform *t, const char *descr, int ndim,
                         const int64_t *shp, int code, const char *needle)
{
    npyl_tplan p;
    char err[256] = "";
    int rc = npyl_transform_plan("images", t, descr, ndim, shp, &p, err, sizeof err);
    cr_assert_eq(rc, code, "expected %d, got %d (%s)", code, rc, err);
    cr_assert(strstr(err, needle), "message '%s' lacks '%s'", err, needle);
    cr_assert(strstr(err, "images"), "message '%s' names no field", err);
}

Test(transform_errors, messages)
{
    const int64_t shp[] = {3, 4, 4};
    float two[] = {0.5f, 0.5f}, three[] = {1, 0, 1};
    npyload_transform t = {.scale = 1.0f, .dtype = NPYLOAD_DTYPE_FLOAT32, .mean = two, .n_mean = 2};
    expect_error(&t, "|u1", 3, shp, NPYLOAD_EMISMATCH, "mean has 2 values");
    expect_error(&t, "|u1", 3, shp, NPYLOAD_EMISMATCH, "3 channels");
    t = (npyload_transform){.scale = 1.0f, .dtype = NPYLOAD_DTYPE_FLOAT32, .std = two, .n_std = 2};
    expect_error(&t, "|u1", 3, shp, NPYLOAD_EMISMATCH, "std has 2 values");
    t = (npyload_transform){.scale = 1.0f, .dtype = NPYLOAD_DTYPE_KEEP, .std = three + 2, .n_std = 1};
    expect_error(&t, "|u1", 3, shp, NPYLOAD_EINVAL, "dtype keep with std");
    t = (npyload_transform){.dtype = NPYLOAD_DTYPE_KEEP, .scale = 2.0f};
    expect_error(&t, "|u1", 3, shp, NPYLOAD_EINVAL, "dtype keep with scale");
    t = (npyload_transform){.scale = 1.0f, .dtype = NPYLOAD_DTYPE_FLOAT32, .std = three, .n_std = 3};
    expect_error(&t, "|u1", 3, shp, NPYLOAD_EINVAL, "std[1] is 0");
    t = (npyload_transform){.scale = 1.0f, .dtype = NPYLOAD_DTYPE_FLOAT32, .mean = NULL, .n_mean = 3};
    expect_error(&t, "|u1", 3, shp, NPYLOAD_EINVAL, "mean is NULL");
    t = (npyload_transform){.dtype = NPYLOAD_DTYPE_FLOAT32, .scale = NAN};
    expect_error(&t, "|u1", 3, shp, NPYLOAD_EINVAL, "scale");
    /* 0 is not "unset": it is refused (it used to mean 1, so a Python
     * scale=0.0 delivered x unscaled). A struct zeroed by hand is refused
     * the same way rather than scaled by 0. */
    t = (npyload_transform){.dtype = NPYLOAD_DTYPE_FLOAT32, .scale = 0.0f};
    expect_error(&t, "|u1", 3, shp, NPYLOAD_EINVAL, "scale 0: expected a finite, nonzero");
    t = (npyload_transform){0};
    expect_error(&t, "|u1", 3, shp, NPYLOAD_EINVAL, "scale 0");
    t = (npyload_transform){.scale = 1.0f, .dtype = 7};
    expect_error(&t, "|u1", 3, shp, NPYLOAD_EINVAL, "dtype 7 unknown");
    t = (npyload_transform){.scale = 1.0f, .dtype = NPYLOAD_DTYPE_FLOAT16};
    expect_error(&t, "<c8", 3, shp, NPYLOAD_EUNSUPPORTED, "'<c8' is not an integer or float");
    expect_error(&t, "|b1", 3, shp, NPYLOAD_EUNSUPPORTED, "bool and complex");
    t = (npyload_transform){.scale = 1.0f, .dtype = NPYLOAD_DTYPE_FLOAT16, .channels_last = 1};
    expect_error(&t, "<f4", 0, NULL, NPYLOAD_EINVAL, "channels_last needs");
}

/* ---- float16 / bfloat16 known values ------------------------------------ */

Test(transform_f16, known_values)
{
    struct { float f; unsigned h; } v[] = {
        {1.0f, 0x3c00}, {-2.0f, 0xc000}, {65504.0f, 0x7bff},
        {65519.996f, 0x7bff}, {65520.0f, 0x7c00}, /* tie rounds to even: inf */
        {1e10f, 0x7c00}, {INFINITY, 0x7c00}, {-INFINITY, 0xfc00},
        {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000}, /* tie to even: 0 */
        {0x1.000002p-25f, 0x0001}, {0x3p-25f, 0x0002}, /* 1.5 units -> 2 */
        {0x5p-25f, 0x0002}, /* 2.5 units -> 2 */ {0x1p-14f, 0x0400},
        {0x1.ff8p-15f, 0x03ff}, {0x1.ffcp-15f, 0x0400}, /* tie: up into the normals */
        {0x1p-26f, 0x0000}, {1e-45f, 0x0000}, {-1e-45f, 0x8000},
        {-0.0f, 0x8000}, {0.0f, 0x0000},
        {1.0f + 0x1p-11f, 0x3c00}, {1.0f + 0x3p-11f, 0x3c02},
        {1.0f + 0x1p-11f + 0x1p-23f, 0x3c01},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        cr_assert_eq(npyl_f32_to_f16(v[i].f), v[i].h, "%a -> 0x%04x, want 0x%04x",
                     (double)v[i].f, npyl_f32_to_f16(v[i].f), v[i].h);
        cr_assert_eq(ref_f2h(v[i].f), v[i].h, "reference disagrees on %a", (double)v[i].f);
    }
    float qnan = NAN, nnan = -NAN;
    cr_assert_eq(npyl_f32_to_f16(qnan), 0x7e00);
    cr_assert_eq(npyl_f32_to_f16(nnan) & 0xfe00, 0xfe00);
    uint32_t snan_bits = 0x7f800001u; /* signalling: comes out quiet */
    float snan;
    memcpy(&snan, &snan_bits, 4);
    cr_assert_eq(npyl_f32_to_f16(snan), 0x7e00);

    cr_assert_eq(npyl_f16_to_f32(0x0001), 0x1p-24f);
    cr_assert_eq(npyl_f16_to_f32(0x03ff), 0x3ffp-24f);
    cr_assert_eq(npyl_f16_to_f32(0x7bff), 65504.0f);
    cr_assert(isinf(npyl_f16_to_f32(0xfc00)) && npyl_f16_to_f32(0xfc00) < 0);
    cr_assert(isnan(npyl_f16_to_f32(0x7e00)));
    cr_assert(signbit(npyl_f16_to_f32(0x8000)));
}

Test(transform_f16, bfloat16_known_values)
{
    struct { float f; unsigned h; } v[] = {
        {1.0f, 0x3f80}, {1.0f + 0x1p-8f, 0x3f80}, {1.0f + 0x3p-8f, 0x3f82},
        {1.0f + 0x1p-8f + 0x1p-23f, 0x3f81}, {FLT_MAX, 0x7f80},
        {0x1.fep127f, 0x7f7f}, {INFINITY, 0x7f80}, {-INFINITY, 0xff80},
        {0x1p-133f, 0x0001}, {0x1p-134f, 0x0000}, {0x3p-134f, 0x0002},
        {1e-45f, 0x0000}, {-0.0f, 0x8000}, {-3.0f, 0xc040},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        cr_assert_eq(npyl_f32_to_bf16(v[i].f), v[i].h, "%a -> 0x%04x, want 0x%04x",
                     (double)v[i].f, npyl_f32_to_bf16(v[i].f), v[i].h);
        cr_assert_eq(ref_f2bf(v[i].f), v[i].h, "reference disagrees on %a", (double)v[i].f);
    }
    cr_assert_eq(npyl_f32_to_bf16(NAN), 0x7fc0);
    cr_assert_eq(npyl_f32_to_bf16(-NAN) & 0xffc0, 0xffc0);
    cr_assert_eq(npyl_bf16_to_f32(0x3f80), 1.0f);
}

/* Every float16 decodes exactly; around every float16 rounding boundary
 * (all 2^16 high halves of a float x 12 low-bit patterns) the engine's
 * portable and F16C paths and the reference agree. */
Test(transform_f16, exhaustive_boundaries)
{
    for (unsigned h = 0; h < 65536; h++) {
        float f = npyl_f16_to_f32((uint16_t)h);
        double r = ref_h2d(h);
        if (isnan(r)) {
            cr_assert(isnan(f), "0x%04x", h);
            continue;
        }
        cr_assert(f == r && !signbit(f) == !signbit(r), "0x%04x: %a vs %a", h, (double)f, r);
    }
    static const uint32_t lows[] = {0, 1, 0xfff, 0x1000, 0x1001, 0x0fff, 0x1fff,
                                    0x2000, 0x7fff, 0x8000, 0xffff, 0x17ff};
    enum { CHUNK = 4096 };
    float *in = malloc(CHUNK * sizeof *in);
    uint16_t *a = malloc(CHUNK * 2), *b = malloc(CHUNK * 2);
    const int64_t shp[] = {CHUNK};
    npyload_transform t = {.scale = 1.0f, .dtype = NPYLOAD_DTYPE_FLOAT16};
    npyl_tplan pf, pp;
    cr_assert_eq(npyl_transform_plan("x", &t, "<f4", 1, shp, &pf, NULL, 0), 0);
    cr_assert_eq(npyl_transform_plan_portable("x", &t, "<f4", 1, shp, &pp, NULL, 0), 0);
    cr_log_info("F16C path %s", pf.f16c ? "in use" : "not available on this CPU");
    size_t k = 0;
    for (uint32_t hi = 0; hi < 65536; hi++)
        for (size_t l = 0; l < sizeof lows / sizeof lows[0]; l++) {
            uint32_t u = (hi << 16) | lows[l];
            memcpy(&in[k++], &u, 4);
            if (k < CHUNK)
                continue;
            npyl_transform_rows(&pf, in, a, 1);
            npyl_transform_rows(&pp, in, b, 1);
            for (size_t i = 0; i < CHUNK; i++) {
                cr_assert_eq(a[i], b[i], "%a: F16C 0x%04x portable 0x%04x",
                             (double)in[i], a[i], b[i]);
                if (!isnan(in[i]))
                    cr_assert_eq(b[i], ref_f2h(in[i]), "%a: 0x%04x want 0x%04x",
                                 (double)in[i], b[i], ref_f2h(in[i]));
                else
                    cr_assert((b[i] & 0x7e00) == 0x7e00, "NaN stays quiet NaN");
            }
            k = 0;
        }
    npyl_transform_plan_free(&pf);
    npyl_transform_plan_free(&pp);
    free(in);
    free(a);
    free(b);
}

/* float16 -> float32 for all 65,536 float16 values, through the engine as
 * the loader runs it: rows of 65,536 elements (the F16C path converts them
 * eight at a time) and rows of 7 (every element in the scalar tail), and
 * the portable plan. One rule everywhere, checked bit for bit against a
 * reference written from IEEE 754: numbers exact, NaN quiet with its sign
 * and payload (a signalling NaN is quieted, as a conversion must). */
static uint32_t ref_h2f_bits(unsigned h)
{
    unsigned em = h & 0x7fffu;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    if (em > 0x7c00u)
        return sign | 0x7fc00000u | ((uint32_t)(em & 0x3ffu) << 13);
    float f = (float)ref_h2d(h); /* exact: every float16 is a float */
    uint32_t u;
    memcpy(&u, &f, 4);
    return u | sign; /* -0.0 keeps its sign */
}

Test(transform_f16, widening_nan_rule_every_value_every_position)
{
    enum { N = 65536, TAIL = 7 };
    uint16_t *in = malloc(N * 2);
    uint32_t *out = malloc(N * 4);
    cr_assert(in && out);
    for (unsigned h = 0; h < N; h++)
        in[h] = (uint16_t)h;
    const int64_t whole[] = {N}, tail[] = {TAIL};
    npyload_transform t = {.dtype = NPYLOAD_DTYPE_FLOAT32, .scale = 1.0f};
    /* The engine converts contiguous rows in blocks, so a row of 7 reaches
     * the scalar tail only when it is converted alone: one call per row. */
    struct { const int64_t *shape; int portable, per_row; const char *what; } runs[] = {
        {whole, 0, 0, "rows of 65536 (vector path when the CPU has F16C)"},
        {tail, 0, 1, "rows of 7, one per call (scalar tail)"},
        {whole, 1, 0, "portable plan"},
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        npyl_tplan p;
        int rc = runs[r].portable
                     ? npyl_transform_plan_portable("x", &t, "<f2", 1, runs[r].shape, &p, NULL, 0)
                     : npyl_transform_plan("x", &t, "<f2", 1, runs[r].shape, &p, NULL, 0);
        cr_assert_eq(rc, 0);
        if (!runs[r].portable)
            cr_log_info("%s: F16C %s", runs[r].what, p.f16c ? "in use" : "not available");
        size_t len = (size_t)runs[r].shape[0];
        size_t rows = N / len; /* the last N % 7 values: one more row below */
        if (runs[r].per_row)
            for (size_t i = 0; i < rows; i++)
                npyl_transform_rows(&p, in + i * len, out + i * len, 1);
        else
            npyl_transform_rows(&p, in, out, rows);
        size_t done = rows * len;
        if (done < N) {
            uint16_t last[TAIL] = {0};
            uint32_t lout[TAIL];
            memcpy(last, in + done, (N - done) * 2);
            npyl_transform_rows(&p, last, lout, 1);
            memcpy(out + done, lout, (N - done) * 4);
        }
        for (unsigned h = 0; h < N; h++)
            cr_assert_eq(out[h], ref_h2f_bits(h), "%s: float16 0x%04x -> 0x%08x, want 0x%08x",
                         runs[r].what, h, out[h], ref_h2f_bits(h));
        npyl_transform_plan_free(&p);
    }
    free(in);
    free(out);
}

/* ---- augmentation ------------------------------------------------------- */

/* A (1, 3, 4) uint8 sample, values 1..12, kept as stored: pad 1 and a crop
 * of the whole padded sample (5, 6) fixes top = left = 0, so the delivered
 * row is the padded sample, flipped both ways (probability 1): written out
 * by hand here. */
Test(transform_aug, pad_and_flips_by_hand)
{
    const int64_t sh[] = {1, 3, 4};
    npyload_transform t = {.scale = 1.0f, .hflip = 1.0f, .vflip = 1.0f, .crop_h = 5,
                           .crop_w = 6, .pad = 1};
    npyl_tplan p;
    char err[256];
    cr_assert_eq(npyl_transform_plan("x", &t, "|u1", 3, sh, &p, err, sizeof err), 0, "%s", err);
    cr_assert(p.aug && !npyl_transform_is_identity(&p));
    cr_assert_eq(p.sshape[1], 5);
    cr_assert_eq(p.sshape[2], 6);
    cr_assert_eq(p.out_row_bytes, 30);
    uint8_t in[12], out[30], scratch[30];
    for (int i = 0; i < 12; i++)
        in[i] = (uint8_t)(i + 1);
    int64_t idx = 5;
    npyl_transform_rows_aug(&p, in, out, 1, 3, 0, &idx, scratch);
    static const uint8_t want[30] = {
        0, 0,  0,  0,  0, 0,
        0, 12, 11, 10, 9, 0,
        0, 8,  7,  6,  5, 0,
        0, 4,  3,  2,  1, 0,
        0, 0,  0,  0,  0, 0,
    };
    cr_assert_arr_eq(out, want, 30);
    npyl_transform_plan_free(&p);
}

/* The decisions: probability 0 never flips, 1 always; the crop offsets
 * stay in range and take every value; the function is pure. */
Test(transform_aug, decisions_bounds_and_purity)
{
    const int64_t sh[] = {4, 9};
    npyload_transform t = {.scale = 1.0f, .hflip = 1.0f, .vflip = 0.0f, .crop_h = 2,
                           .crop_w = 3};
    npyl_tplan p;
    cr_assert_eq(npyl_transform_plan("x", &t, "<f4", 2, sh, &p, NULL, 0), 0);
    int seen_top[3] = {0}, seen_left[7] = {0};
    for (int64_t i = 0; i < 2000; i++) {
        npyl_aug a, b;
        npyl_aug_decide(&p, -7, 3, i, &a);
        npyl_aug_decide(&p, -7, 3, i, &b);
        cr_assert(!memcmp(&a, &b, sizeof a));
        cr_assert(a.hflip == 1 && a.vflip == 0);
        cr_assert(a.top >= 0 && a.top <= 2 && a.left >= 0 && a.left <= 6, "%" PRId64, i);
        seen_top[a.top] = seen_left[a.left] = 1;
    }
    for (int k = 0; k < 3; k++)
        cr_assert(seen_top[k], "top %d never drawn", k);
    for (int k = 0; k < 7; k++)
        cr_assert(seen_left[k], "left %d never drawn", k);
    npyl_transform_plan_free(&p);
}

/* Signs negate exactly, in the stored byte order: a big-endian float32
 * field of (2,) vectors flipped horizontally with sign (-1, 1). */
Test(transform_aug, sign_on_big_endian_floats)
{
    const int64_t sh[] = {2};
    const float sign[] = {-1.0f, 1.0f};
    npyload_transform t = {.scale = 1.0f, .dtype = NPYLOAD_DTYPE_FLOAT32, .hflip = 1.0f,
                           .hflip_sign = sign, .n_hflip_sign = 2};
    npyl_tplan p;
    char err[256];
    cr_assert_eq(npyl_transform_plan("v", &t, ">f4", 1, sh, &p, err, sizeof err), 0, "%s", err);
    const float vals[2] = {1.5f, -2.25f};
    uint8_t in[8];
    for (int k = 0; k < 2; k++) { /* big-endian bytes, built by hand */
        uint32_t u;
        memcpy(&u, &vals[k], 4);
        for (int b = 0; b < 4; b++)
            in[k * 4 + b] = (uint8_t)(u >> (24 - 8 * b));
    }
    float out[2], scratch[2];
    int64_t idx = 0;
    npyl_transform_rows_aug(&p, in, out, 1, 0, 0, &idx, scratch);
    cr_assert_eq(out[0], -1.5f);
    cr_assert_eq(out[1], -2.25f);
    npyl_transform_plan_free(&p);
}

/* Refusals name the field and the member. */
Test(transform_aug, refusals)
{
    const int64_t sh[] = {3, 4};
    char err[256];
    npyl_tplan p;
    npyload_transform t = {.scale = 1.0f, .hflip = NAN};
    cr_assert_eq(npyl_transform_check("img", &t, err, sizeof err), NPYLOAD_EINVAL);
    cr_assert(strstr(err, "img") && strstr(err, "hflip"), "%s", err);
    t = (npyload_transform){.scale = 1.0f, .crop_h = 2};
    cr_assert_eq(npyl_transform_check("img", &t, err, sizeof err), NPYLOAD_EINVAL);
    cr_assert(strstr(err, "crop"), "%s", err);
    t = (npyload_transform){.scale = 1.0f, .crop_h = 4, .crop_w = 4};
    cr_assert_eq(npyl_transform_plan("img", &t, "|u1", 2, sh, &p, err, sizeof err),
                 NPYLOAD_EINVAL);
    cr_assert(strstr(err, "larger than the padded"), "%s", err);
    const float s = -1.0f;
    t = (npyload_transform){.scale = 1.0f, .hflip = 0.5f, .hflip_sign = &s, .n_hflip_sign = 1};
    cr_assert_eq(npyl_transform_plan("img", &t, "<i4", 2, sh, &p, err, sizeof err),
                 NPYLOAD_EUNSUPPORTED);
    cr_assert(strstr(err, "float stored dtype"), "%s", err);
}
