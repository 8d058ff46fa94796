/* Transforms: checking and planning (rare path) and the host engine (hot
 * path, npyl_transform_rows). See npyload_transform.h for the contract.
 *
 * The engine works in chunks of at most NPYL_TBLK elements through two small
 * float buffers on the stack: load (stored dtype, byte swap, widen to
 * float32), arithmetic per channel, interleave for channels-last, store
 * (narrow to the output dtype). Each stage is a plain loop over contiguous
 * memory that GCC vectorises (this file is built with -O3
 * -ffp-contract=off); the buffers stay in L1. Channels-last reads the C
 * channel planes of a block of B spatial positions (C streams, each
 * sequential) and writes the output block once, contiguously. */
#include "npyload_transform.h"
#include "../format/npyload_format.h"
#include "npyload_transform_f16.h"
#include "npyload_transform_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NPYL_TBLK 2048 /* floats per stage buffer (8 KiB) */
#define NPYL_TLUT_MAX_BYTES (64u << 10) /* lookup tables of a plan, at most */
#define NPYL_AUG_MAX_SIDE (1 << 30) /* pad and the last two axes (the crop
                                       offset draw needs H + 2P + 1 < 2^32) */

/* ------------------------------------------------------------------------ */
/* Loads: stored dtype -> float32                                            */
/* ------------------------------------------------------------------------ */

#define NPYL_LOAD(name, T, U, swap, expr)                                      \
    static void name(const void *restrict src, size_t n, float *restrict dst) \
    {                                                                          \
        const unsigned char *s = src;                                          \
        for (size_t i = 0; i < n; i++) {                                       \
            U u;                                                               \
            memcpy(&u, s + i * sizeof(U), sizeof(U));                          \
            u = swap(u);                                                       \
            T v;                                                               \
            memcpy(&v, &u, sizeof v);                                          \
            dst[i] = (expr);                                                   \
        }                                                                      \
    }
#define NOSWAP(u) (u)

NPYL_LOAD(load_u1, uint8_t, uint8_t, NOSWAP, (float)v)
NPYL_LOAD(load_i1, int8_t, uint8_t, NOSWAP, (float)v)
NPYL_LOAD(load_u2, uint16_t, uint16_t, NOSWAP, (float)v)
NPYL_LOAD(load_u2s, uint16_t, uint16_t, __builtin_bswap16, (float)v)
NPYL_LOAD(load_i2, int16_t, uint16_t, NOSWAP, (float)v)
NPYL_LOAD(load_i2s, int16_t, uint16_t, __builtin_bswap16, (float)v)
NPYL_LOAD(load_u4, uint32_t, uint32_t, NOSWAP, (float)v)
NPYL_LOAD(load_u4s, uint32_t, uint32_t, __builtin_bswap32, (float)v)
NPYL_LOAD(load_i4, int32_t, uint32_t, NOSWAP, (float)v)
NPYL_LOAD(load_i4s, int32_t, uint32_t, __builtin_bswap32, (float)v)
NPYL_LOAD(load_u8, uint64_t, uint64_t, NOSWAP, (float)v)
NPYL_LOAD(load_u8s, uint64_t, uint64_t, __builtin_bswap64, (float)v)
NPYL_LOAD(load_i8, int64_t, uint64_t, NOSWAP, (float)v)
NPYL_LOAD(load_i8s, int64_t, uint64_t, __builtin_bswap64, (float)v)
NPYL_LOAD(load_f4, float, uint32_t, NOSWAP, v)
NPYL_LOAD(load_f4s, float, uint32_t, __builtin_bswap32, v)
NPYL_LOAD(load_f8, double, uint64_t, NOSWAP, (float)v)
NPYL_LOAD(load_f8s, double, uint64_t, __builtin_bswap64, (float)v)

static npyl_tload_fn pick_load(char kind, size_t size, int swap)
{
    switch (kind) {
    case 'u':
        switch (size) {
        case 1: return load_u1;
        case 2: return swap ? load_u2s : load_u2;
        case 4: return swap ? load_u4s : load_u4;
        case 8: return swap ? load_u8s : load_u8;
        }
        break;
    case 'i':
        switch (size) {
        case 1: return load_i1;
        case 2: return swap ? load_i2s : load_i2;
        case 4: return swap ? load_i4s : load_i4;
        case 8: return swap ? load_i8s : load_i8;
        }
        break;
    case 'f':
        switch (size) {
        case 2: return swap ? npyl_tload_f16_swap : npyl_tload_f16;
        case 4: return swap ? load_f4s : load_f4;
        case 8: return swap ? load_f8s : load_f8;
        }
        break;
    }
    return NULL;
}

static void store_f32(const float *restrict src, size_t n, void *restrict dst)
{
    memcpy(dst, src, n * sizeof(float));
}

/* ------------------------------------------------------------------------ */
/* Checking and planning                                                     */
/* ------------------------------------------------------------------------ */

static const char *dtype_name(int d)
{
    switch (d) {
    case NPYLOAD_DTYPE_KEEP: return "keep";
    case NPYLOAD_DTYPE_FLOAT32: return "float32";
    case NPYLOAD_DTYPE_FLOAT16: return "float16";
    case NPYLOAD_DTYPE_BFLOAT16: return "bfloat16";
    }
    return "?";
}

static int check_values(const char *what, const char *member, const float *v,
                        size_t n, int nonzero, char *err, size_t errlen)
{
    if (n > 0 && !v)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: transform %s is NULL with n_%s = %zu", what,
                         member, member, n);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                             "%s: transform %s[%zu] = %g is not finite", what,
                             member, i, (double)v[i]);
        if (nonzero && v[i] == 0.0f)
            return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                             "%s: transform %s[%zu] is 0 (division by zero)",
                             what, member, i);
    }
    return 0;
}

/* Signs are +1 or -1, one per channel or one for all. */
static int check_signs(const char *what, const char *member, const float *v, size_t n,
                       char *err, size_t errlen)
{
    if (n > 0 && !v)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: transform %s is NULL with n_%s = %zu", what, member,
                         member, n);
    if (n > ((size_t)1 << 24))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: transform %s: more than 2^24 values", what, member);
    for (size_t i = 0; i < n; i++)
        if (v[i] != 1.0f && v[i] != -1.0f)
            return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                             "%s: transform %s[%zu] = %g: a sign is +1 or -1", what,
                             member, i, (double)v[i]);
    return 0;
}

/* The augmentation members on their own (the sample shape is checked at
 * plan time). */
static int check_aug(const char *what, const npyload_transform *t, char *err,
                     size_t errlen)
{
    const float pr[2] = {t->hflip, t->vflip};
    for (int k = 0; k < 2; k++)
        if (!(pr[k] >= 0.0f && pr[k] <= 1.0f)) /* NaN fails too */
            return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                             "%s: transform %s = %g: a probability in [0, 1]", what,
                             k ? "vflip" : "hflip", (double)pr[k]);
    if (t->crop_h < 0 || t->crop_w < 0 || (t->crop_h == 0) != (t->crop_w == 0))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: transform crop (%" PRId64 ", %" PRId64 "): both sizes "
                         "positive, or both 0 for none", what, t->crop_h, t->crop_w);
    if (t->pad < 0 || t->pad > NPYL_AUG_MAX_SIDE)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: transform pad %" PRId64 ": 0 to %d", what, t->pad,
                         NPYL_AUG_MAX_SIDE);
    int rc = check_signs(what, "hflip_sign", t->hflip_sign, t->n_hflip_sign, err, errlen);
    if (!rc)
        rc = check_signs(what, "vflip_sign", t->vflip_sign, t->n_vflip_sign, err, errlen);
    return rc;
}

int npyl_transform_check(const char *what, const npyload_transform *t, char *err,
                         size_t errlen)
{
    if (!what)
        what = "field";
    if (!t)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "%s: transform is NULL",
                         what);
    if (t->dtype < NPYLOAD_DTYPE_KEEP || t->dtype > NPYLOAD_DTYPE_BFLOAT16)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: transform dtype %d unknown (expected keep, "
                         "float32, float16 or bfloat16)", what, t->dtype);
    if (!isfinite(t->scale) || t->scale == 0.0f)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: transform scale %g: expected a finite, nonzero "
                         "value (1 for no scaling; NPYLOAD_TRANSFORM_INIT sets "
                         "it)", what, (double)t->scale);
    if (t->n_mean > ((size_t)1 << 24) || t->n_std > ((size_t)1 << 24))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: transform mean/std: more than 2^24 values", what);
    int rc = check_values(what, "mean", t->mean, t->n_mean, 0, err, errlen);
    if (rc == 0)
        rc = check_values(what, "std", t->std, t->n_std, 1, err, errlen);
    if (rc)
        return rc;
    if (t->dtype == NPYLOAD_DTYPE_KEEP) {
        const char *m = t->n_mean ? "mean" : t->n_std ? "std"
                      : t->scale != 1.0f ? "scale" : NULL;
        if (m)
            return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                             "%s: transform dtype keep with %s: arithmetic "
                             "needs an output dtype (float32, float16 or "
                             "bfloat16)", what, m);
    }
    rc = check_aug(what, t, err, errlen);
    if (rc)
        return rc;
    if (t->channels_last != 0 && t->channels_last != 1)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: transform channels_last must be 0 or 1, got %d",
                         what, t->channels_last);
    return 0;
}

/* The plan's input: the stored dtype (the dtype model of lib/format, as
 * the header parser classified it) and the sample's geometry. */
static int plan_input(const char *what, const char *descr, int sndim,
                      const int64_t *sshape, npyl_tplan *p, uint64_t *elems_out,
                      char *err, size_t errlen)
{
    npyl_dtype dt;
    const char *why = "";
    size_t dl = strnlen(descr, NPYL_TDESCR_LEN);
    if (dl >= NPYL_TDESCR_LEN || npyl_dtype_parse(descr, dl, &dt, &why) != 0)
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: transform: input dtype '%.15s' not understood%s%s",
                         what, descr, *why ? ": " : "", why);
    memcpy(p->in_descr, dt.str, sizeof dt.str < NPYL_TDESCR_LEN ? sizeof dt.str
                                                                : NPYL_TDESCR_LEN);
    p->in_kind = dt.kind;
    p->in_itemsize = dt.size;
    p->in_swap = dt.order != '|' && dt.order != npyl_host_order();
    p->sndim = sndim;
    uint64_t elems = 1;
    for (int d = 0; d < sndim; d++) {
        if (sshape[d] < 0 || npyl_mul_u64(elems, (uint64_t)sshape[d], &elems))
            return npyl_fail(err, errlen, NPYLOAD_ETOOBIG,
                             "%s: transform: sample shape too large", what);
        p->sshape[d] = sshape[d];
    }
    p->C = sndim ? (uint64_t)sshape[0] : 1;
    p->S = p->C ? elems / p->C : 0;
    if (npyl_mul_u64(elems, p->in_itemsize, &p->in_row_bytes))
        return npyl_fail(err, errlen, NPYLOAD_ETOOBIG,
                         "%s: transform: row bytes overflow", what);
    *elems_out = elems;
    return 0;
}

/* Augmentation: probabilities as 24-bit thresholds, the window of the
 * last two axes, and the delivered shape (oshape) when it asks for any. */
static int plan_aug(const char *what, const npyload_transform *t, int sndim,
                    const int64_t *sshape, int64_t *oshape, npyl_tplan *p, char *err,
                    size_t errlen)
{
    p->stored_row_bytes = p->in_row_bytes;
    p->hflip_t = (uint32_t)ceil((double)t->hflip * 16777216.0);
    p->vflip_t = (uint32_t)ceil((double)t->vflip * 16777216.0);
    int geom = t->crop_h > 0 || t->pad > 0;
    p->aug = p->hflip_t || p->vflip_t || geom;
    if (!p->aug)
        return 0;
    if (geom && sndim < 2)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: transform crop/pad acts on the last two axes; the "
                         "samples have %d", what, sndim);
    memcpy(oshape, sshape, sizeof(int64_t) * (size_t)sndim);
    if (sndim < 2)
        return 0; /* flips only sign such a sample */
    int64_t H = sshape[sndim - 2], W = sshape[sndim - 1], P = t->pad;
    if (H > NPYL_AUG_MAX_SIDE || W > NPYL_AUG_MAX_SIDE)
        return npyl_fail(err, errlen, NPYLOAD_ETOOBIG,
                         "%s: transform flip/crop: the last two axes (%" PRId64
                         ", %" PRId64 ") exceed %d", what, H, W, NPYL_AUG_MAX_SIDE);
    int64_t h = t->crop_h ? t->crop_h : H + 2 * P, w = t->crop_w ? t->crop_w : W + 2 * P;
    if (h > H + 2 * P || w > W + 2 * P)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: transform crop (%" PRId64 ", %" PRId64 ") is larger "
                         "than the padded sample (%" PRId64 ", %" PRId64 ")", what, h, w,
                         H + 2 * P, W + 2 * P);
    p->aug_H = H;
    p->aug_W = W;
    p->crop_h = h;
    p->crop_w = w;
    p->pad = P;
    p->aug_outer = 1;
    for (int d = 0; d < sndim - 2; d++)
        p->aug_outer *= (uint64_t)sshape[d];
    oshape[sndim - 2] = h;
    oshape[sndim - 1] = w;
    return 0;
}

/* The flip signs, one flag per channel of the delivered sample. Negating
 * is exact only on a float stored type (a sign-bit flip). */
static int plan_signs(const char *what, const npyload_transform *t, npyl_tplan *p,
                      char *err, size_t errlen)
{
    const float *v[2] = {t->hflip_sign, t->vflip_sign};
    const size_t n[2] = {t->n_hflip_sign, t->n_vflip_sign};
    uint8_t **flags[2] = {&p->hneg, &p->vneg};
    for (int k = 0; k < 2; k++) {
        const char *m = k ? "vflip_sign" : "hflip_sign";
        int any = 0;
        for (size_t i = 0; i < n[k]; i++)
            any |= v[k][i] < 0.0f;
        if (!any || !(k ? p->vflip_t : p->hflip_t))
            continue; /* nothing to negate, or never flipped */
        if (n[k] > 1 && n[k] != p->C)
            return npyl_fail(err, errlen, NPYLOAD_EMISMATCH,
                             "%s: transform %s has %zu values, the samples have %" PRIu64
                             " channels (axis 0 of the sample); give 1 or %" PRIu64, what,
                             m, n[k], p->C, p->C);
        if (p->in_kind != 'f')
            return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                             "%s: transform %s negates stored values, which needs a "
                             "float stored dtype; the field is '%s'", what, m,
                             p->in_descr);
        if (!(*flags[k] = calloc(p->C ? p->C : 1, 1)))
            return npyl_fail(err, errlen, -ENOMEM, "%s: transform: out of memory", what);
        for (uint64_t c = 0; c < p->C; c++)
            (*flags[k])[c] = (n[k] == 1 ? v[k][0] : v[k][c]) < 0.0f;
        p->aug = 1;
    }
    return 0;
}

/* The arithmetic: scale, and mean / std (one value, or one per channel). */
static int plan_arith(const char *what, const npyload_transform *t, npyl_tplan *p,
                      char *err, size_t errlen)
{
    float scale = t->scale;
    p->scale = scale;
    p->arith = (t->n_mean || t->n_std) ? 2 : scale != 1.0f ? 1 : 0;
    size_t nm = t->n_mean, ns = t->n_std;
    const char *bad = nm > 1 && nm != p->C ? "mean" : ns > 1 && ns != p->C ? "std" : NULL;
    if (bad)
        return npyl_fail(err, errlen, NPYLOAD_EMISMATCH,
                         "%s: transform %s has %zu values, the samples have "
                         "%" PRIu64 " channel%s (axis 0 of the sample%s); give "
                         "1 or %" PRIu64, what, bad, !strcmp(bad, "mean") ? nm : ns,
                         p->C, p->C == 1 ? "" : "s",
                         p->sndim ? "" : ", which is a scalar", p->C);
    p->per_channel = nm > 1 || ns > 1;
    p->mean1 = nm ? t->mean[0] : 0.0f;
    p->std1 = ns ? t->std[0] : 1.0f;
    if (!p->per_channel)
        return 0;
    p->mean = malloc(p->C * sizeof(float));
    p->std = malloc(p->C * sizeof(float));
    if (!p->mean || !p->std)
        return npyl_fail(err, errlen, -ENOMEM, "%s: transform: out of memory", what);
    for (uint64_t c = 0; c < p->C; c++) {
        p->mean[c] = nm == 0 ? 0.0f : nm == 1 ? t->mean[0] : t->mean[c];
        p->std[c] = ns == 0 ? 1.0f : ns == 1 ? t->std[0] : t->std[c];
    }
    return 0;
}

/* The output dtype and the load / store kernels (F16C where allowed). */
static int plan_output(const char *what, const npyload_transform *t, const char *descr,
                       uint64_t elems, npyl_tplan *p, int allow_f16c, char *err,
                       size_t errlen)
{
    int out = t->dtype;
    if (out != NPYLOAD_DTYPE_KEEP) {
        if ((p->in_kind != 'u' && p->in_kind != 'i' && p->in_kind != 'f') ||
            !pick_load(p->in_kind, p->in_itemsize, p->in_swap))
            return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                             "%s: transform to %s: input dtype '%s' is not an "
                             "integer or float type (bool and complex can only "
                             "be kept)", what, dtype_name(out), descr);
        static const char *const od[] = {"", "<f4", "<f2", "bfloat16"};
        static const size_t osz[] = {0, 4, 2, 2};
        snprintf(p->out_descr, sizeof p->out_descr, "%s", od[out]);
        if (npyl_host_order() == '>' && out != NPYLOAD_DTYPE_BFLOAT16)
            p->out_descr[0] = '>';
        p->out_itemsize = osz[out];
        /* A cast to the stored type with nothing to compute is a copy. */
        if (p->arith == 0 && !strcmp(p->out_descr, p->in_descr))
            out = NPYLOAD_DTYPE_KEEP;
    }
    p->out_dtype = out;
    if (out == NPYLOAD_DTYPE_KEEP) {
        memcpy(p->out_descr, p->in_descr, sizeof p->out_descr);
        p->out_itemsize = p->in_itemsize;
    } else {
        p->load = pick_load(p->in_kind, p->in_itemsize, p->in_swap);
        p->store = out == NPYLOAD_DTYPE_FLOAT32 ? store_f32
                 : out == NPYLOAD_DTYPE_FLOAT16 ? npyl_tstore_f16
                                              : npyl_tstore_bf16;
        npyl_tload_fn l16 = NULL;
        npyl_tstore_fn s16 = NULL;
        if (allow_f16c && npyl_tf16c_pick(&l16, &s16)) {
            if (p->in_kind == 'f' && p->in_itemsize == 2 && !p->in_swap) {
                p->load = l16;
                p->f16c = 1;
            }
            if (out == NPYLOAD_DTYPE_FLOAT16) {
                p->store = s16;
                p->f16c = 1;
            }
        }
    }
    if (npyl_mul_u64(elems, p->out_itemsize, &p->out_row_bytes))
        return npyl_fail(err, errlen, NPYLOAD_ETOOBIG,
                         "%s: transform: row bytes overflow", what);
    return 0;
}

static inline void arith(const npyl_tplan *p, float *restrict x, size_t n, uint64_t c);

/* One-byte integer input: the output items of the 256 stored values, per
 * channel when the arithmetic is, computed by the plan's own load,
 * arithmetic and store (so the engine's lookups give its bytes exactly).
 * No table when it would exceed NPYL_TLUT_MAX_BYTES. */
static int plan_lut(const char *what, npyl_tplan *p, char *err, size_t errlen)
{
    if (p->out_dtype == NPYLOAD_DTYPE_KEEP || p->in_itemsize != 1 ||
        (p->in_kind != 'u' && p->in_kind != 'i'))
        return 0;
    uint64_t tables = p->per_channel ? p->C : 1, each = 256 * p->out_itemsize;
    if (tables > NPYL_TLUT_MAX_BYTES / each)
        return 0;
    if (!(p->lut = malloc((size_t)(tables * each))))
        return npyl_fail(err, errlen, -ENOMEM, "%s: transform: out of memory", what);
    unsigned char values[256];
    float x[256];
    for (int v = 0; v < 256; v++)
        values[v] = (unsigned char)v;
    for (uint64_t c = 0; c < tables; c++) {
        p->load(values, 256, x);
        arith(p, x, 256, c);
        p->store(x, 256, p->lut + c * each);
    }
    return 0;
}

/* The layout: strides of (N, C, d1..dk), channels-last when asked and
 * meaningful (2+ axes, several channels and positions). */
static int plan_layout(const char *what, const npyload_transform *t, int sndim,
                       const int64_t *sshape, uint64_t elems, npyl_tplan *p, char *err,
                       size_t errlen)
{
    if (t->channels_last && sndim == 0)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: transform channels_last needs samples with a "
                         "channel axis; the samples are scalars", what);
    p->channels_last = t->channels_last && sndim >= 2 && p->C > 1 && p->S > 1;
    int nd = 1 + sndim;
    int64_t acc = 1;
    if (!p->channels_last) {
        for (int d = nd - 1; d >= 1; d--) {
            p->strides[d] = acc;
            acc *= sshape[d - 1];
        }
    } else {
        p->strides[1] = 1;             /* C innermost */
        acc = (int64_t)p->C;
        for (int d = nd - 1; d >= 2; d--) {
            p->strides[d] = acc;
            acc *= sshape[d - 1];
        }
    }
    p->strides[0] = (int64_t)elems;
    for (int d = 0; d < nd; d++)
        p->byte_strides[d] = p->strides[d] * (int64_t)p->out_itemsize;
    return 0;
}

static int plan(const char *what, const npyload_transform *t, const char *descr,
                int sndim, const int64_t *sshape, npyl_tplan *p, int allow_f16c,
                char *err, size_t errlen)
{
    if (!what)
        what = "field";
    if (!p)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "%s: plan is NULL", what);
    memset(p, 0, sizeof *p);
    int rc = npyl_transform_check(what, t, err, errlen);
    if (rc)
        return rc;
    if (!descr || sndim < 0 || sndim > NPYLOAD_MAX_DIMS || (sndim && !sshape))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: transform plan: bad descr or shape", what);
    uint64_t elems = 0;
    rc = plan_input(what, descr, sndim, sshape, p, &elems, err, errlen);
    int64_t oshape[NPYLOAD_MAX_DIMS];
    if (!rc)
        rc = plan_aug(what, t, sndim, sshape, oshape, p, err, errlen);
    if (!rc && p->aug) {
        /* From here on the engine's input is the augmented row. */
        sshape = oshape;
        rc = plan_input(what, descr, sndim, sshape, p, &elems, err, errlen);
    }
    if (!rc)
        rc = plan_signs(what, t, p, err, errlen);
    if (!rc)
        rc = plan_arith(what, t, p, err, errlen);
    if (!rc)
        rc = plan_output(what, t, descr, elems, p, allow_f16c, err, errlen);
    if (!rc)
        rc = plan_layout(what, t, sndim, sshape, elems, p, err, errlen);
    if (!rc)
        rc = plan_lut(what, p, err, errlen);
    if (rc)
        npyl_transform_plan_free(p);
    return rc;
}

int npyl_transform_plan(const char *what, const npyload_transform *t,
                        const char *descr, int sndim, const int64_t *sshape,
                        npyl_tplan *p, char *err, size_t errlen)
{
    return plan(what, t, descr, sndim, sshape, p, 1, err, errlen);
}

int npyl_transform_plan_portable(const char *what, const npyload_transform *t,
                                 const char *descr, int sndim,
                                 const int64_t *sshape, npyl_tplan *p,
                                 char *err, size_t errlen)
{
    return plan(what, t, descr, sndim, sshape, p, 0, err, errlen);
}

void npyl_transform_plan_free(npyl_tplan *p)
{
    if (!p)
        return;
    free(p->mean);
    free(p->std);
    free(p->hneg);
    free(p->vneg);
    free(p->lut);
    memset(p, 0, sizeof *p);
}

int npyl_transform_is_identity(const npyl_tplan *p)
{
    return p->out_dtype == NPYLOAD_DTYPE_KEEP && !p->channels_last && !p->aug;
}

/* ------------------------------------------------------------------------ */
/* The host engine                                                           */
/* ------------------------------------------------------------------------ */

/* The literal formula, three roundings, no FMA (-ffp-contract=off). */
static void arith_scale(float *restrict x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] * scale;
}

static void arith_norm(float *restrict x, size_t n, float scale, float m,
                       float s)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (x[i] * scale - m) / s;
}

static inline void arith(const npyl_tplan *p, float *restrict x, size_t n,
                         uint64_t c)
{
    if (p->arith == 1)
        arith_scale(x, n, p->scale);
    else if (p->arith == 2)
        arith_norm(x, n, p->scale, p->per_channel ? p->mean[c] : p->mean1,
                   p->per_channel ? p->std[c] : p->std1);
}

/* in: C planes of nb floats; out: nb groups of C floats. */
static void interleave(const float *restrict in, float *restrict out,
                       size_t C, size_t nb)
{
    switch (C) {
    case 2:
        for (size_t s = 0; s < nb; s++) {
            out[2 * s] = in[s];
            out[2 * s + 1] = in[nb + s];
        }
        return;
    case 3:
        for (size_t s = 0; s < nb; s++) {
            out[3 * s] = in[s];
            out[3 * s + 1] = in[nb + s];
            out[3 * s + 2] = in[2 * nb + s];
        }
        return;
    case 4:
        for (size_t s = 0; s < nb; s++) {
            out[4 * s] = in[s];
            out[4 * s + 1] = in[nb + s];
            out[4 * s + 2] = in[2 * nb + s];
            out[4 * s + 3] = in[3 * nb + s];
        }
        return;
    default:
        for (size_t s = 0; s < nb; s++)
            for (size_t c = 0; c < C; c++)
                out[s * C + c] = in[c * nb + s];
    }
}

/* Channels-first: each channel plane is one contiguous run (the whole
 * batch is one run when mean/std do not vary by channel). */
static void rows_planar(const npyl_tplan *p, const unsigned char *src,
                        unsigned char *dst, size_t rows)
{
    float buf[NPYL_TBLK];
    const size_t isz = p->in_itemsize, osz = p->out_itemsize;
    uint64_t runs = p->per_channel ? (uint64_t)rows * p->C : 1;
    uint64_t len = p->per_channel ? p->S : (uint64_t)rows * p->C * p->S;
    for (uint64_t r = 0; r < runs; r++) {
        uint64_t c = p->per_channel ? r % p->C : 0;
        for (uint64_t off = 0; off < len; off += NPYL_TBLK) {
            size_t n = len - off < NPYL_TBLK ? (size_t)(len - off) : NPYL_TBLK;
            uint64_t e = r * len + off;
            p->load(src + e * isz, n, buf);
            arith(p, buf, n, c);
            p->store(buf, n, dst + e * osz);
        }
    }
}

static void rows_channels_last(const npyl_tplan *p, const unsigned char *src,
                               unsigned char *dst, size_t rows)
{
    float buf[NPYL_TBLK], ibuf[NPYL_TBLK];
    const size_t isz = p->in_itemsize, osz = p->out_itemsize;
    const uint64_t C = p->C, S = p->S;
    /* Either a block holds all channels of B positions, or (C > NPYL_TBLK)
     * one position and a group of channels: the output run is contiguous
     * in both cases. */
    const size_t cg = C < NPYL_TBLK ? (size_t)C : NPYL_TBLK;
    const size_t B = C < NPYL_TBLK ? NPYL_TBLK / (size_t)C : 1;
    for (size_t r = 0; r < rows; r++) {
        const unsigned char *in = src + r * p->in_row_bytes;
        unsigned char *out = dst + r * p->out_row_bytes;
        for (uint64_t s0 = 0; s0 < S; s0 += B) {
            size_t nb = S - s0 < B ? (size_t)(S - s0) : B;
            for (uint64_t c0 = 0; c0 < C; c0 += cg) {
                size_t ng = C - c0 < cg ? (size_t)(C - c0) : cg;
                for (size_t k = 0; k < ng; k++) {
                    uint64_t c = c0 + k;
                    p->load(in + (c * S + s0) * isz, nb, buf + k * nb);
                    arith(p, buf + k * nb, nb, c);
                }
                const float *o = buf;
                if (nb > 1) {
                    interleave(buf, ibuf, ng, nb);
                    o = ibuf;
                }
                p->store(o, nb * ng, out + (s0 * C + c0) * osz);
            }
        }
    }
}

/* One-byte input through the plan's tables (plan_lut): each output item
 * is its channel's table entry for the stored byte. Channels-last walks the
 * output in order, reading the C planes at the same position; C is a
 * constant for 2, 3 and 4 channels, which the compiler unrolls. */
#define NPYL_LUT_ROWS(name, T)                                                 \
    static inline __attribute__((always_inline)) void name##_cl(               \
        const T *restrict lut, uint64_t tstep, const unsigned char *restrict in, \
        unsigned char *restrict out, uint64_t C, uint64_t S)                   \
    {                                                                          \
        for (uint64_t s = 0; s < S; s++)                                       \
            for (uint64_t c = 0; c < C; c++)                                   \
                memcpy(out + (s * C + c) * sizeof(T), &lut[c * tstep + in[c * S + s]], \
                       sizeof(T));                                             \
    }                                                                          \
    static void name(const npyl_tplan *p, const unsigned char *restrict src,   \
                     unsigned char *restrict dst, size_t rows)                 \
    {                                                                          \
        const T *lut = (const T *)(const void *)p->lut;                        \
        const uint64_t C = p->C, S = p->S, tstep = p->per_channel ? 256 : 0;  \
        for (size_t r = 0; r < rows; r++) {                                    \
            const unsigned char *in = src + r * p->in_row_bytes;               \
            unsigned char *out = dst + r * p->out_row_bytes;                   \
            if (p->channels_last) {                                            \
                switch (C) {                                                   \
                case 2: name##_cl(lut, tstep, in, out, 2, S); break;           \
                case 3: name##_cl(lut, tstep, in, out, 3, S); break;           \
                case 4: name##_cl(lut, tstep, in, out, 4, S); break;           \
                default: name##_cl(lut, tstep, in, out, C, S);                 \
                }                                                              \
                continue;                                                      \
            }                                                                  \
            for (uint64_t c = 0; c < C; c++) {                                 \
                const T *t = lut + c * tstep;                                  \
                const unsigned char *ic = in + c * S;                          \
                unsigned char *oc = out + c * S * sizeof(T);                   \
                for (uint64_t s = 0; s < S; s++)                               \
                    memcpy(oc + s * sizeof(T), &t[ic[s]], sizeof(T));          \
            }                                                                  \
        }                                                                      \
    }
NPYL_LUT_ROWS(rows_lut2, uint16_t)
NPYL_LUT_ROWS(rows_lut4, uint32_t)

/* Keep + channels-last: a per-sample transpose (C, S) -> (S, C) of items. */
#define NPYL_PERMUTE(name, T)                                                  \
    static void name(const unsigned char *src, unsigned char *dst, uint64_t C, \
                     uint64_t S)                                               \
    {                                                                          \
        for (uint64_t s = 0; s < S; s++)                                       \
            for (uint64_t c = 0; c < C; c++) {                                 \
                T v;                                                           \
                memcpy(&v, src + (c * S + s) * sizeof(T), sizeof(T));          \
                memcpy(dst + (s * C + c) * sizeof(T), &v, sizeof(T));          \
            }                                                                  \
    }
NPYL_PERMUTE(permute1, uint8_t)
NPYL_PERMUTE(permute2, uint16_t)
NPYL_PERMUTE(permute4, uint32_t)
NPYL_PERMUTE(permute8, uint64_t)

static void permute_any(const unsigned char *src, unsigned char *dst,
                        uint64_t C, uint64_t S, size_t sz)
{
    for (uint64_t s = 0; s < S; s++)
        for (uint64_t c = 0; c < C; c++)
            memcpy(dst + (s * C + c) * sz, src + (c * S + s) * sz, sz);
}

void npyl_transform_rows(const npyl_tplan *p, const void *src, void *dst,
                         size_t rows)
{
    const unsigned char *s = src;
    unsigned char *d = dst;
    if (rows == 0 || p->in_row_bytes == 0)
        return;
    if (p->out_dtype == NPYLOAD_DTYPE_KEEP) {
        if (!p->channels_last) {
            memcpy(d, s, rows * p->in_row_bytes);
            return;
        }
        for (size_t r = 0; r < rows; r++) {
            const unsigned char *in = s + r * p->in_row_bytes;
            unsigned char *out = d + r * p->out_row_bytes;
            switch (p->in_itemsize) {
            case 1: permute1(in, out, p->C, p->S); break;
            case 2: permute2(in, out, p->C, p->S); break;
            case 4: permute4(in, out, p->C, p->S); break;
            case 8: permute8(in, out, p->C, p->S); break;
            default: permute_any(in, out, p->C, p->S, p->in_itemsize);
            }
        }
        return;
    }
    if (p->lut && p->out_itemsize == 2)
        rows_lut2(p, s, d, rows);
    else if (p->lut)
        rows_lut4(p, s, d, rows);
    else if (p->channels_last)
        rows_channels_last(p, s, d, rows);
    else
        rows_planar(p, s, d, rows);
}

/* ------------------------------------------------------------------------ */
/* Augmentation                                                              */
/* ------------------------------------------------------------------------ */

void npyl_aug_decide(const npyl_tplan *p, int64_t seed, uint64_t epoch, int64_t index,
                     npyl_aug *out)
{
    memset(out, 0, sizeof *out);
    if (!p->aug)
        return;
    /* npyload.h, "Augmentation": the draws, bit for bit. */
    uint64_t x = npyl_mix64(npyl_mix64((uint64_t)seed + NPYL_GOLDEN) ^ epoch) ^
                 (uint64_t)index;
    uint64_t d1 = npyl_mix64(x + 1 * NPYL_GOLDEN), d2 = npyl_mix64(x + 2 * NPYL_GOLDEN);
    uint64_t d3 = npyl_mix64(x + 3 * NPYL_GOLDEN), d4 = npyl_mix64(x + 4 * NPYL_GOLDEN);
    out->hflip = (d1 >> 40) < p->hflip_t;
    out->vflip = (d2 >> 40) < p->vflip_t;
    if (p->aug_H) {
        uint64_t ry = (uint64_t)(p->aug_H + 2 * p->pad - p->crop_h) + 1;
        uint64_t rx = (uint64_t)(p->aug_W + 2 * p->pad - p->crop_w) + 1;
        out->top = (int64_t)(((d3 >> 32) * ry) >> 32);
        out->left = (int64_t)(((d4 >> 32) * rx) >> 32);
    }
}

/* Reverses n items of size sz in place. */
static void reverse_items(unsigned char *a, size_t n, size_t sz)
{
    unsigned char t[16];
    for (size_t i = 0, j = n ? n - 1 : 0; i < j; i++, j--) {
        memcpy(t, a + i * sz, sz);
        memcpy(a + i * sz, a + j * sz, sz);
        memcpy(a + j * sz, t, sz);
    }
}

/* Builds the augmented row (the window of the padded sample, flipped) in
 * the stored dtype: out holds p->in_row_bytes. */
static void aug_geometry(const npyl_tplan *p, const unsigned char *in, unsigned char *out,
                         const npyl_aug *a)
{
    const size_t sz = p->in_itemsize;
    if (!p->aug_H) { /* fewer than two axes: nothing moves */
        memcpy(out, in, p->in_row_bytes);
        return;
    }
    const int64_t H = p->aug_H, W = p->aug_W, h = p->crop_h, w = p->crop_w, P = p->pad;
    /* The columns of the window inside the stored line: x in [x0, x1). */
    int64_t c0 = a->left - P; /* stored column of window column 0 */
    int64_t x0 = c0 < 0 ? -c0 : 0, x1 = W - c0 < w ? W - c0 : w;
    if (x1 < x0)
        x1 = x0;
    const size_t line = (size_t)w * sz;
    for (uint64_t o = 0; o < p->aug_outer; o++) {
        const unsigned char *plane = in + o * (uint64_t)H * (uint64_t)W * sz;
        for (int64_t y = 0; y < h; y++) {
            unsigned char *dl = out + (o * (uint64_t)h + (uint64_t)y) * line;
            int64_t u = a->top + (a->vflip ? h - 1 - y : y) - P; /* stored row */
            if (u < 0 || u >= H || x0 == x1) {
                memset(dl, 0, line);
                continue;
            }
            memset(dl, 0, (size_t)x0 * sz);
            memcpy(dl + (size_t)x0 * sz, plane + ((uint64_t)u * (uint64_t)W +
                                                   (uint64_t)(c0 + x0)) * sz,
                   (size_t)(x1 - x0) * sz);
            memset(dl + (size_t)x1 * sz, 0, (size_t)(w - x1) * sz);
            if (a->hflip)
                reverse_items(dl, (size_t)w, sz);
        }
    }
}

/* Negates channel c (S items of a float type) of the augmented row where
 * the sample's flips ask for it: the sign bit, in the stored byte order. */
static void aug_signs(const npyl_tplan *p, unsigned char *row, const npyl_aug *a)
{
    if (!((a->hflip && p->hneg) || (a->vflip && p->vneg)))
        return;
    const size_t sz = p->in_itemsize;
    const size_t sb = p->in_descr[0] == '>' ? 0 : sz - 1; /* the sign's byte */
    for (uint64_t c = 0; c < p->C; c++) {
        int neg = (a->hflip && p->hneg && p->hneg[c]) ^ (a->vflip && p->vneg && p->vneg[c]);
        if (!neg)
            continue;
        unsigned char *e = row + c * p->S * sz + sb;
        for (uint64_t k = 0; k < p->S; k++)
            e[k * sz] ^= 0x80;
    }
}

void npyl_transform_rows_aug(const npyl_tplan *p, const void *src, void *dst, size_t rows,
                             int64_t seed, uint64_t epoch, const int64_t *indices,
                             void *scratch)
{
    if (!p->aug) {
        npyl_transform_rows(p, src, dst, rows);
        return;
    }
    /* Stored dtype, channels first: the augmented row is the output row. */
    const int direct = p->out_dtype == NPYLOAD_DTYPE_KEEP && !p->channels_last;
    for (size_t r = 0; r < rows; r++) {
        npyl_aug a;
        npyl_aug_decide(p, seed, epoch, indices[r], &a);
        const unsigned char *in = (const unsigned char *)src + r * p->stored_row_bytes;
        unsigned char *out = (unsigned char *)dst + r * p->out_row_bytes;
        unsigned char *row = direct ? out : scratch;
        aug_geometry(p, in, row, &a);
        aug_signs(p, row, &a);
        if (!direct)
            npyl_transform_rows(p, row, out, 1);
    }
}
