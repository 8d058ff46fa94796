/* npyload-gen --preset captcha: the reference layout of the slider-CAPTCHA
 * detector (MISSION.md), per file id:
 *   images/{split}/{split}_{id:04d}.npy           <f4 (S, C, 256, 512)
 *       C=2: gray, C=4: RGB, quantised to 8 bits (values k/255, as a
 *       photo divided by 255 in float32), then an all-ones padding-mask
 *       channel;
 *   labels/{split}/{split}_{id:04d}_heatmaps.npy  <f4 (S, 2, 64, 128)
 *       channel 0 gap, 1 slider: a gaussian (sigma 1.5) cut to the 9x9
 *       window around its peak cell, 1.0 at the peak cell;
 *   labels/{split}/{split}_{id:04d}_offsets.npy   <f4 (S, 4, 64, 128)
 *       gap du,dv (channels 0,1), slider du,dv (2,3), in [-0.5, 0.5) and
 *       never 0, each set in the peak cell of its heatmap only.
 * Heatmap cell (v, u) covers image pixels [4v, 4v+4) x [4u, 4u+4); a piece
 * centred at (x, y) = (4 (u + 0.5 + du), 4 (v + 0.5 + dv)) has peak cell
 * (v, u) and offsets (du, dv).
 *
 * Every sample draws from its own splitmix64 stream whose state is
 * mix64(mix64(mix64(seed ^ fnv1a64(split)) + id) + sample). The geometry and
 * offsets are integer-derived; image textures use libm's sinf/cosf, so their
 * bytes are identical for one seed on one machine (and in practice across
 * glibc builds), not across every libm.
 *
 * Compressibility is meant to match natural photos stored the same way, so
 * that no benchmark flatters .npy.zst: with zstd -3 in npyload-pack's
 * default frames the gray plane compresses about 3.8x, an image file (gray
 * + mask) about 7.6x and the preset as a whole about 9x (natural 8-bit gray
 * photos as float32 + mask: about 8x, the gray plane about 4x). The pixel
 * noise (amplitude `an` below, 2.5 to 7.6 levels of 255) sets it: 16 levels
 * and more noise gave 16x, 256 levels with twice this noise 7x.
 * tests/python/test_tools_zst.py checks the band. */
#include "npyload_gen.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Captcha geometry. */
#define IMG_H 256
#define IMG_W 512
#define HM_H 64
#define HM_W 128
#define HM_STRIDE 4
#define GAUSS_SIGMA 1.5
#define GAUSS_RADIUS 4 /* 9x9 window */

/* Uniform in [0, 1) with 24 bits: exact in float. */
static float rng_unit_f(rng *r) { return (float)(rng_next(r) >> 40) * 0x1p-24f; }

/* Uniform in [lo, hi). */
static float rng_range(rng *r, float lo, float hi)
{
    return lo + (hi - lo) * rng_unit_f(r);
}

/* Uniform integer in [lo, hi] (the modulo bias is irrelevant here). */
static int rng_int(rng *r, int lo, int hi)
{
    return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1));
}

/* Uniform in [-0.5, 0.5) on a 2^-24 grid, never 0. */
static float rng_offset(rng *r)
{
    for (;;) {
        uint64_t k = rng_next(r) >> 40;
        if (k != (1u << 23))
            return (float)k * 0x1p-24f - 0.5f;
    }
}

/* A cheap 32-bit integer hash (Chris Wellons' lowbias32) for pixel noise. */
static uint32_t hash32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

typedef struct piece {
    int u, v;     /* peak cell of the heatmap */
    float du, dv; /* sub-cell offset of the centre, in [-0.5, 0.5), != 0 */
    float cx, cy; /* centre in image pixels */
} piece;

typedef struct captcha_sample {
    piece gap, slider;
    float half;  /* half side of the square body of the piece, pixels */
    float knob;  /* radius of the round knob on its right side */
    uint32_t noise_key;
} captcha_sample;

static void piece_place(piece *p, int u, int v, float du, float dv)
{
    p->u = u;
    p->v = v;
    p->du = du;
    p->dv = dv;
    p->cx = (float)HM_STRIDE * ((float)u + 0.5f + du);
    p->cy = (float)HM_STRIDE * ((float)v + 0.5f + dv);
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Inside the puzzle-piece outline: a square of half side `h` and a disc of
 * radius `r` centred on the middle of its right edge. */
static int in_piece(float dx, float dy, float h, float r)
{
    if (fabsf(dx) <= h && fabsf(dy) <= h)
        return 1;
    float kx = dx - h;
    return kx * kx + dy * dy <= r * r;
}

/* 0 outside, 1 in the body, 2 in the 2-pixel rim. */
static int piece_zone(float dx, float dy, float h, float r)
{
    if (!in_piece(dx, dy, h, r))
        return 0;
    return in_piece(dx, dy, h - 2.0f, r - 2.0f) ? 1 : 2;
}

/* Background texture of one channel: a slanted sinusoid, a vertical and a
 * horizontal one, and per-pixel hash noise — separable, so per pixel it costs
 * two multiply-adds and one hash. Values are left unquantised in `out`. */
static void render_texture(float *out, rng *r, float kx, float ky,
                           uint32_t noise_key)
{
    float colA[IMG_W], colB[IMG_W], colC[IMG_W];
    float rowA[IMG_H], rowB[IMG_H], rowC[IMG_H];
    float base = rng_range(r, 0.30f, 0.70f);
    float a1 = rng_range(r, 0.08f, 0.22f);
    float a2 = rng_range(r, 0.04f, 0.14f);
    float a3 = rng_range(r, 0.04f, 0.12f);
    float an = rng_range(r, 0.01f, 0.03f);
    float p1 = rng_range(r, 0.0f, 6.2831853f);
    float p2 = rng_range(r, 0.0f, 6.2831853f);
    float p3 = rng_range(r, 0.0f, 6.2831853f);
    float kx2 = rng_range(r, 0.02f, 0.10f);
    float ky3 = rng_range(r, 0.02f, 0.12f);
    for (int x = 0; x < IMG_W; x++) {
        float t = kx * (float)x + p1;
        colA[x] = a1 * sinf(t);
        colB[x] = a1 * cosf(t);
        colC[x] = base + a2 * sinf(kx2 * (float)x + p2);
    }
    for (int y = 0; y < IMG_H; y++) {
        float t = ky * (float)y;
        rowA[y] = cosf(t);
        rowB[y] = sinf(t);
        rowC[y] = a3 * sinf(ky3 * (float)y + p3);
    }
    /* a1 sin(kx x + p1 + ky y) = colA rowA + colB rowB. */
    const float nscale = an * 0x1p-23f;
    for (int y = 0; y < IMG_H; y++) {
        float *o = out + (size_t)y * IMG_W;
        float ra = rowA[y], rb = rowB[y], rc = rowC[y];
        uint32_t key = noise_key + (uint32_t)y * IMG_W;
        for (int x = 0; x < IMG_W; x++) {
            float n = (float)(int32_t)(hash32(key + (uint32_t)x) >> 8) -
                      8388608.0f;
            o[x] = colC[x] + rc + colA[x] * ra + colB[x] * rb + nscale * n;
        }
    }
}

/* Draws one sample and renders its image channels into `img` (C planes of
 * IMG_H x IMG_W floats, quantised; the last one is the mask). */
static void captcha_image(float *img, int channels, rng *r,
                          captcha_sample *s)
{
    /* Geometry first, so the labels do not depend on the texture code. */
    s->half = (float)rng_int(r, 16, 24);
    s->knob = 0.4f * s->half;
    int v = rng_int(r, 7, 56);        /* piece fits vertically */
    float dv = rng_offset(r);
    piece_place(&s->gap, rng_int(r, 36, 115), v, rng_offset(r), dv);
    piece_place(&s->slider, rng_int(r, 7, 12), v, rng_offset(r), dv);
    s->noise_key = (uint32_t)rng_next(r);

    float kx = rng_range(r, 0.015f, 0.08f);
    float ky = rng_range(r, 0.015f, 0.08f);
    const size_t plane = (size_t)IMG_H * IMG_W;
    const float h = s->half, kr = s->knob;
    const int ox = (int)lrintf(s->gap.cx - s->slider.cx); /* slider -> gap */
    const int pad = (int)(h + kr) + 3;

    for (int c = 0; c < channels - 1; c++) {
        float *o = img + (size_t)c * plane;
        render_texture(o, r, kx, ky, s->noise_key + (uint32_t)c * 0x9e3779b9u);

        /* The slider piece shows the texture that the gap cut out (read
         * before the gap is shaded; the two boxes never overlap). */
        int y0 = clampi((int)s->slider.cy - pad, 0, IMG_H - 1);
        int y1 = clampi((int)s->slider.cy + pad, 0, IMG_H - 1);
        int x0 = clampi((int)s->slider.cx - pad, 0, IMG_W - 1);
        int x1 = clampi((int)s->slider.cx + pad, 0, IMG_W - 1 - ox);
        for (int y = y0; y <= y1; y++) {
            for (int x = x0; x <= x1; x++) {
                int z = piece_zone((float)x + 0.5f - s->slider.cx,
                                   (float)y + 0.5f - s->slider.cy, h, kr);
                if (z == 1)
                    o[(size_t)y * IMG_W + x] =
                        0.9f * o[(size_t)y * IMG_W + x + ox] + 0.1f;
                else if (z == 2)
                    o[(size_t)y * IMG_W + x] = 0.95f;
            }
        }
        /* The gap: a shadow with a light rim. */
        y0 = clampi((int)s->gap.cy - pad, 0, IMG_H - 1);
        y1 = clampi((int)s->gap.cy + pad, 0, IMG_H - 1);
        x0 = clampi((int)s->gap.cx - pad, 0, IMG_W - 1);
        x1 = clampi((int)s->gap.cx + pad, 0, IMG_W - 1);
        for (int y = y0; y <= y1; y++) {
            for (int x = x0; x <= x1; x++) {
                int z = piece_zone((float)x + 0.5f - s->gap.cx,
                                   (float)y + 0.5f - s->gap.cy, h, kr);
                float *p = &o[(size_t)y * IMG_W + x];
                if (z == 1)
                    *p = 0.45f * *p + 0.03f;
                else if (z == 2)
                    *p = 0.85f;
            }
        }
        /* 8-bit levels stored as float32, as a photo divided by 255. */
        for (size_t i = 0; i < plane; i++) {
            float q = o[i] * 255.0f + 0.5f;
            int k = q <= 0.0f ? 0 : q >= 255.0f ? 255 : (int)q;
            o[i] = (float)k / 255.0f;
        }
    }
    float *mask = img + (size_t)(channels - 1) * plane;
    for (size_t i = 0; i < plane; i++)
        mask[i] = 1.0f;
}

static void captcha_labels(float *hm, float *off, const captcha_sample *s,
                           const float gauss[][2 * GAUSS_RADIUS + 1])
{
    const size_t plane = (size_t)HM_H * HM_W;
    memset(hm, 0, 2 * plane * sizeof *hm);
    memset(off, 0, 4 * plane * sizeof *off);
    const piece *ps[2] = {&s->gap, &s->slider};
    for (int c = 0; c < 2; c++) {
        const piece *p = ps[c];
        float *o = hm + (size_t)c * plane;
        for (int i = -GAUSS_RADIUS; i <= GAUSS_RADIUS; i++) {
            int y = p->v + i;
            if (y < 0 || y >= HM_H)
                continue;
            for (int j = -GAUSS_RADIUS; j <= GAUSS_RADIUS; j++) {
                int x = p->u + j;
                if (x < 0 || x >= HM_W)
                    continue;
                o[(size_t)y * HM_W + x] =
                    gauss[i + GAUSS_RADIUS][j + GAUSS_RADIUS];
            }
        }
        size_t cell = (size_t)p->v * HM_W + (size_t)p->u;
        off[(size_t)(2 * c) * plane + cell] = p->du;
        off[(size_t)(2 * c + 1) * plane + cell] = p->dv;
    }
}

/* The three files of one id: paths, shapes and the bytes per sample. */
typedef struct captcha_set {
    char path[3][PATH_MAX];
    int64_t shape[3][4];
    size_t sample_bytes[3];
} captcha_set;

static int captcha_paths(const gen_opts *o, const char *dimg, const char *dlab, int64_t id,
                         captcha_set *cs)
{
    if (snprintf(cs->path[0], PATH_MAX, "%s/%s_%04" PRId64 ".npy", dimg, o->split, id) >=
            PATH_MAX ||
        snprintf(cs->path[1], PATH_MAX, "%s/%s_%04" PRId64 "_heatmaps.npy", dlab, o->split,
                 id) >= PATH_MAX ||
        snprintf(cs->path[2], PATH_MAX, "%s/%s_%04" PRId64 "_offsets.npy", dlab, o->split,
                 id) >= PATH_MAX) {
        fprintf(stderr, PROG ": output path too long\n");
        return -1;
    }
    return 0;
}

static void captcha_shapes(const gen_opts *o, captcha_set *cs)
{
    const int64_t C = o->channels, S = o->samples;
    const int64_t shapes[3][4] = {{S, C, IMG_H, IMG_W}, {S, 2, HM_H, HM_W}, {S, 4, HM_H, HM_W}};
    memcpy(cs->shape, shapes, sizeof shapes);
    for (int i = 0; i < 3; i++)
        cs->sample_bytes[i] = (size_t)(shapes[i][1] * shapes[i][2] * shapes[i][3]) * sizeof(float);
}

/* Writes the three files of one id. @return : 0 or -1. */
static int captcha_write_id(const gen_opts *o, const captcha_set *cs, char **bufs,
                            uint64_t file_key, const float gauss[][2 * GAUSS_RADIUS + 1],
                            gen_totals *t)
{
    writer w[3];
    int ok = 1;
    for (int i = 0; i < 3; i++)
        w[i].fd = -1;
    for (int i = 0; ok && i < 3; i++)
        ok = writer_open(&w[i], i, bufs[i], cs->path[i], "<f4", 0, 4, cs->shape[i]) == 0;
    for (int64_t k = 0; ok && k < o->samples; k++) {
        rng r = {mix64(file_key + (uint64_t)k)};
        captcha_sample s;
        float *img = writer_reserve(&w[0], cs->sample_bytes[0]);
        float *hm = img ? writer_reserve(&w[1], cs->sample_bytes[1]) : NULL;
        float *off = hm ? writer_reserve(&w[2], cs->sample_bytes[2]) : NULL;
        if (!off) {
            ok = 0;
            break;
        }
        captcha_image(img, (int)o->channels, &r, &s);
        captcha_labels(hm, off, &s, gauss);
    }
    /* Unopened writers have fd = -1: closing all three is safe after a
     * partial open, and discards every temporary file on failure. */
    for (int i = 0; i < 3; i++) {
        uint64_t bytes = w[i].written + w[i].len;
        if (writer_close(&w[i], ok) != 0)
            ok = 0;
        else if (ok) {
            t->files++;
            t->bytes += bytes;
        }
    }
    return ok ? 0 : -1;
}

int gen_captcha(const gen_opts *o, gen_totals *t)
{
    char dimg[PATH_MAX], dlab[PATH_MAX];
    if (snprintf(dimg, sizeof dimg, "%s/images/%s", o->out, o->split) >= (int)sizeof dimg ||
        snprintf(dlab, sizeof dlab, "%s/labels/%s", o->out, o->split) >= (int)sizeof dlab) {
        fprintf(stderr, PROG ": output path too long\n");
        return -1;
    }
    if (mkdir_p(dimg) != 0 || mkdir_p(dlab) != 0)
        return -1;

    captcha_set cs;
    captcha_shapes(o, &cs);
    uint64_t sizes[3];
    for (int i = 0; i < 3; i++)
        if (gen_npy_bytes("<f4", 0, 4, cs.shape[i], cs.sample_bytes[i] * (uint64_t)o->samples,
                          &sizes[i]) != 0)
            return -1;
    if (gen_check_space(o->out, sizes, 3, o->files) != 0)
        return -1;

    float gauss[2 * GAUSS_RADIUS + 1][2 * GAUSS_RADIUS + 1];
    for (int i = -GAUSS_RADIUS; i <= GAUSS_RADIUS; i++)
        for (int j = -GAUSS_RADIUS; j <= GAUSS_RADIUS; j++)
            gauss[i + GAUSS_RADIUS][j + GAUSS_RADIUS] =
                (float)exp(-(double)(i * i + j * j) / (2.0 * GAUSS_SIGMA * GAUSS_SIGMA));
    const uint64_t split_key = mix64(o->seed ^ fnv1a64(o->split));
    char *bufs[3];
    if (buffers_alloc(bufs, 3) != 0)
        return -1;
    int rc = 0;
    for (int64_t f = 0; rc == 0 && f < o->files; f++) {
        int64_t id = o->first_id + f;
        rc = captcha_paths(o, dimg, dlab, id, &cs);
        if (rc == 0)
            rc = captcha_write_id(o, &cs, bufs, mix64(split_key + (uint64_t)id),
                                  (const float(*)[2 * GAUSS_RADIUS + 1])gauss, t);
        if (rc == 0)
            t->samples += (uint64_t)o->samples;
    }
    buffers_free(bufs, 3);
    return rc;
}
