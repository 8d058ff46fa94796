/*
 * npyload-gen — write NPY datasets for demos, tests and benchmarks.
 *
 *   npyload-gen --preset captcha --out DIR [--split train] [--files 4]
 *               [--samples-per-file 64] [--channels 2] [--seed 0]
 *               [--first-id 0]
 *   npyload-gen --generic --out DIR --shape 3,32,32 [--prefix data]
 *               [--files 4] [--samples-per-file 64] [--dtype <f4]
 *               [--fortran] [--seed 0] [--first-id 0]
 *
 * The captcha preset writes the reference layout of the slider-CAPTCHA
 * detector (docs: MISSION.md), per file id:
 *   images/{split}/{split}_{id:04d}.npy           <f4 (S, C, 256, 512)
 *       C=2: gray, C=4: RGB, quantised to 16 levels (values k/15),
 *       then an all-ones padding-mask channel;
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
 * Determinism: every sample draws from its own splitmix64 stream whose state
 * is mix64(mix64(mix64(seed ^ fnv1a64(split)) + id) + sample) — mix64 being
 * splitmix64's output function — so the content depends only on (seed,
 * split, id, sample), never on the order of generation, and libc's rand() is
 * not used. The generic mode draws file `id` from mix64(mix64(seed ^
 * fnv1a64(prefix)) + id); its bytes are the same on every host (integers
 * and exactly representable floats, written in the file's byte order). The
 * captcha geometry and offsets are integer-derived too; image textures use
 * libm's sinf/cosf, so their bytes are guaranteed identical for one seed on
 * one machine (and in practice across glibc builds), not across every libm.
 *
 * Files are assembled in an 8 MiB buffer and written with large sequential
 * write()s to "NAME.tmp", then renamed, so a file that exists is complete.
 *
 * Uses nothing but include/npyload.h and libc (+ libm).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "npyload.h"

#define PROG "npyload-gen"
#define CHUNK_BYTES ((size_t)8 << 20)

/* Captcha geometry. */
#define IMG_H 256
#define IMG_W 512
#define HM_H 64
#define HM_W 128
#define HM_STRIDE 4
#define GAUSS_SIGMA 1.5
#define GAUSS_RADIUS 4 /* 9x9 window */

/* ------------------------------------------------------------------------ */
/* PRNG: splitmix64 (Steele, Lea, Flood 2014; public-domain reference by
 * Sebastiano Vigna).                                                          */
/* ------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

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

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
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

/* ------------------------------------------------------------------------ */
/* Output files                                                                */
/* ------------------------------------------------------------------------ */

typedef struct writer {
    int fd;
    char *buf;
    size_t len;
    uint64_t written;
    char path[PATH_MAX];
    char tmp[PATH_MAX + 8];
} writer;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* mkdir -p: creates `dir` and its missing parents. */
static int mkdir_p(const char *dir)
{
    char p[PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) {
        fprintf(stderr, PROG ": %s: path too long\n", dir);
        return -1;
    }
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, PROG ": cannot create directory %s: %s\n", p,
                    strerror(errno));
            return -1;
        }
        p[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, PROG ": %s: not a directory\n", dir);
        return -1;
    }
    return 0;
}

static int writer_flush(writer *w)
{
    size_t off = 0;
    while (off < w->len) {
        ssize_t k = write(w->fd, w->buf + off, w->len - off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, PROG ": %s: write failed: %s\n", w->tmp,
                    strerror(errno));
            return -1;
        }
        off += (size_t)k;
    }
    w->written += w->len;
    w->len = 0;
    return 0;
}

/* Space for `n` (<= CHUNK_BYTES) more bytes at the end of the buffer,
 * flushing first if they do not fit. The buffer is 64-byte aligned and every
 * reservation made here keeps elements aligned (headers are multiples of 64
 * bytes, records multiples of their item size). */
static void *writer_reserve(writer *w, size_t n)
{
    if (w->len + n > CHUNK_BYTES && writer_flush(w) != 0)
        return NULL;
    void *p = w->buf + w->len;
    w->len += n;
    return p;
}

/* Opens PATH.tmp and writes the NPY header; the data follows through
 * writer_reserve(). `buf` (CHUNK_BYTES, 64-byte aligned) is the caller's and
 * is reused from file to file: a fresh buffer per file would cost a page
 * fault per 4 KiB written, as much kernel time as the write itself. */
static int writer_open(writer *w, char *buf, const char *path,
                       const char *descr, int fortran, int ndim,
                       const int64_t *shape)
{
    if (strlen(path) >= sizeof w->path) {
        fprintf(stderr, PROG ": %s: path too long\n", path);
        return -1;
    }
    strcpy(w->path, path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
    w->buf = buf;
    char hdr[8192];
    int hl = npyload_format_header(hdr, sizeof hdr, descr, fortran, ndim,
                                   shape);
    if (hl <= 0) {
        fprintf(stderr, PROG ": %s: cannot format the NPY header: %s\n",
                path, npyload_strerror(hl));
        return -1;
    }
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (w->fd < 0) {
        fprintf(stderr, PROG ": cannot create %s: %s\n", w->tmp,
                strerror(errno));
        return -1;
    }
    memcpy(writer_reserve(w, (size_t)hl), hdr, (size_t)hl);
    return 0;
}

static void buffers_free(char **bufs, int n)
{
    for (int i = 0; i < n; i++)
        free(bufs[i]);
}

static int buffers_alloc(char **bufs, int n)
{
    for (int i = 0; i < n; i++) {
        if (posix_memalign((void **)&bufs[i], 64, CHUNK_BYTES) != 0) {
            buffers_free(bufs, i);
            fprintf(stderr, PROG ": out of memory\n");
            return -1;
        }
    }
    return 0;
}

/* Flushes, closes and renames into place (ok != 0), or discards the
 * temporary file. Returns 0 or -1. */
static int writer_close(writer *w, int ok)
{
    int rc = ok ? 0 : -1;
    if (w->fd >= 0) {
        if (ok && writer_flush(w) != 0)
            rc = -1;
        if (close(w->fd) != 0 && rc == 0) {
            fprintf(stderr, PROG ": %s: close failed: %s\n", w->tmp,
                    strerror(errno));
            rc = -1;
        }
        if (rc == 0 && rename(w->tmp, w->path) != 0) {
            fprintf(stderr, PROG ": cannot rename %s to %s: %s\n", w->tmp,
                    w->path, strerror(errno));
            rc = -1;
        }
        if (rc != 0)
            unlink(w->tmp);
        w->fd = -1;
    }
    w->buf = NULL;
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Captcha preset                                                              */
/* ------------------------------------------------------------------------ */

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
    float an = rng_range(r, 0.03f, 0.08f);
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
        /* 16 levels: k / 15. */
        static const float level[16] = {
            0.0f / 15, 1.0f / 15, 2.0f / 15,  3.0f / 15,  4.0f / 15,  5.0f / 15,
            6.0f / 15, 7.0f / 15, 8.0f / 15,  9.0f / 15,  10.0f / 15, 11.0f / 15,
            12.0f / 15, 13.0f / 15, 14.0f / 15, 15.0f / 15};
        for (size_t i = 0; i < plane; i++) {
            float q = o[i] * 15.0f + 0.5f;
            int k = q <= 0.0f ? 0 : q >= 15.0f ? 15 : (int)q;
            o[i] = level[k];
        }
    }
    float *mask = img + (size_t)(channels - 1) * plane;
    for (size_t i = 0; i < plane; i++)
        mask[i] = 1.0f;
}

static void captcha_labels(float *hm, float *off, const captcha_sample *s,
                           float gauss[2 * GAUSS_RADIUS + 1]
                                           [2 * GAUSS_RADIUS + 1])
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

typedef struct gen_opts {
    const char *out;
    const char *split;
    const char *prefix;
    const char *dtype;
    const char *shape;
    int64_t files;
    int64_t samples;
    int64_t channels;
    int64_t first_id;
    uint64_t seed;
    int fortran;
} gen_opts;

typedef struct gen_totals {
    uint64_t files, samples, bytes;
} gen_totals;

static int gen_captcha(const gen_opts *o, gen_totals *t)
{
    char dimg[PATH_MAX], dlab[PATH_MAX];
    if (snprintf(dimg, sizeof dimg, "%s/images/%s", o->out, o->split) >=
            (int)sizeof dimg ||
        snprintf(dlab, sizeof dlab, "%s/labels/%s", o->out, o->split) >=
            (int)sizeof dlab) {
        fprintf(stderr, PROG ": output path too long\n");
        return -1;
    }
    if (mkdir_p(dimg) != 0 || mkdir_p(dlab) != 0)
        return -1;

    float gauss[2 * GAUSS_RADIUS + 1][2 * GAUSS_RADIUS + 1];
    for (int i = -GAUSS_RADIUS; i <= GAUSS_RADIUS; i++)
        for (int j = -GAUSS_RADIUS; j <= GAUSS_RADIUS; j++)
            gauss[i + GAUSS_RADIUS][j + GAUSS_RADIUS] = (float)exp(
                -(double)(i * i + j * j) / (2.0 * GAUSS_SIGMA * GAUSS_SIGMA));

    const int C = (int)o->channels;
    const size_t img_bytes = (size_t)C * IMG_H * IMG_W * sizeof(float);
    const size_t hm_bytes = (size_t)2 * HM_H * HM_W * sizeof(float);
    const size_t off_bytes = (size_t)4 * HM_H * HM_W * sizeof(float);
    const int64_t S = o->samples;
    const int64_t shp_img[4] = {S, C, IMG_H, IMG_W};
    const int64_t shp_hm[4] = {S, 2, HM_H, HM_W};
    const int64_t shp_off[4] = {S, 4, HM_H, HM_W};
    const uint64_t split_key = mix64(o->seed ^ fnv1a64(o->split));
    char *bufs[3];
    if (buffers_alloc(bufs, 3) != 0)
        return -1;

    int ok = 1;
    for (int64_t f = 0; f < o->files; f++) {
        int64_t id = o->first_id + f;
        char p_img[PATH_MAX], p_hm[PATH_MAX], p_off[PATH_MAX];
        if (snprintf(p_img, sizeof p_img, "%s/%s_%04" PRId64 ".npy", dimg,
                     o->split, id) >= (int)sizeof p_img ||
            snprintf(p_hm, sizeof p_hm, "%s/%s_%04" PRId64 "_heatmaps.npy",
                     dlab, o->split, id) >= (int)sizeof p_hm ||
            snprintf(p_off, sizeof p_off, "%s/%s_%04" PRId64 "_offsets.npy",
                     dlab, o->split, id) >= (int)sizeof p_off) {
            fprintf(stderr, PROG ": output path too long\n");
            ok = 0;
            break;
        }
        writer wi, wh, wo;
        writer *ws[3] = {&wi, &wh, &wo};
        for (int i = 0; i < 3; i++) {
            memset(ws[i], 0, sizeof *ws[i]);
            ws[i]->fd = -1;
        }
        ok = writer_open(&wi, bufs[0], p_img, "<f4", 0, 4, shp_img) == 0;
        ok = ok && writer_open(&wh, bufs[1], p_hm, "<f4", 0, 4, shp_hm) == 0;
        ok = ok && writer_open(&wo, bufs[2], p_off, "<f4", 0, 4, shp_off) == 0;
        const uint64_t file_key = mix64(split_key + (uint64_t)id);
        for (int64_t k = 0; ok && k < S; k++) {
            rng r = {mix64(file_key + (uint64_t)k)};
            captcha_sample s;
            float *img = writer_reserve(&wi, img_bytes);
            float *hm = img ? writer_reserve(&wh, hm_bytes) : NULL;
            float *off = hm ? writer_reserve(&wo, off_bytes) : NULL;
            if (!off) {
                ok = 0;
                break;
            }
            captcha_image(img, C, &r, &s);
            captcha_labels(hm, off, &s, gauss);
        }
        /* Unopened writers have fd = -1: closing all three is safe after a
         * partial open, and discards every temporary file on failure. */
        for (int i = 0; i < 3; i++) {
            uint64_t bytes = ws[i]->written + ws[i]->len;
            if (writer_close(ws[i], ok) != 0)
                ok = 0;
            else if (ok) {
                t->files++;
                t->bytes += bytes;
            }
        }
        if (!ok)
            break;
        t->samples += (uint64_t)S;
    }
    buffers_free(bufs, 3);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------------ */
/* Generic mode                                                                */
/* ------------------------------------------------------------------------ */

static int host_little_endian(void)
{
    const uint16_t one = 1;
    return *(const unsigned char *)&one == 1;
}

/* Parses a dtype such as "<f4", ">c16", "|u1", "i8" (native order) or "=f2"
 * into the normalised descr the file will carry. Returns 0 or -1 with a
 * message in `why`. */
static int parse_dtype(const char *s, char descr[NPYLOAD_DESCR_LEN],
                       char *kind, size_t *itemsize, int *big, char *why,
                       size_t whylen)
{
    char native = host_little_endian() ? '<' : '>';
    char order = native;
    const char *p = s;
    if (*p == '<' || *p == '>' || *p == '|' || *p == '=') {
        order = *p == '=' ? native : *p;
        p++;
    }
    char k = *p ? *p++ : '\0';
    char *end = NULL;
    errno = 0;
    long n = strtol(p, &end, 10);
    if (!*p || *end || errno || n <= 0) {
        snprintf(why, whylen, "bad --dtype '%s' (expected e.g. <f4, >i8, |u1)",
                 s);
        return -1;
    }
    int valid = 0;
    switch (k) {
    case 'b': valid = n == 1; break;
    case 'i':
    case 'u': valid = n == 1 || n == 2 || n == 4 || n == 8; break;
    case 'f': valid = n == 2 || n == 4 || n == 8; break;
    case 'c': valid = n == 8 || n == 16; break;
    default: break;
    }
    if (!valid) {
        snprintf(why, whylen,
                 "unsupported --dtype '%s' (supported: b1, i1, i2, i4, i8, "
                 "u1, u2, u4, u8, f2, f4, f8, c8, c16 with '<', '>' or '|')",
                 s);
        return -1;
    }
    if (n == 1) {
        order = '|';
    } else if (order == '|') {
        snprintf(why, whylen,
                 "--dtype '%s': '|' (no byte order) is only for one-byte "
                 "types; use '<' or '>'",
                 s);
        return -1;
    }
    descr[0] = order;
    descr[1] = k;
    snprintf(descr + 2, NPYLOAD_DESCR_LEN - 2, "%d", (int)(n & 0xff));
    *kind = k;
    *itemsize = (size_t)n;
    *big = order == '>';
    return 0;
}

/* Parses "3,32,32" (or "" for scalar samples) into dims. */
static int parse_shape(const char *s, int64_t *dims, int *ndim, char *why,
                       size_t whylen)
{
    *ndim = 0;
    if (*s == '\0')
        return 0;
    const char *p = s;
    for (;;) {
        if (*ndim >= NPYLOAD_MAX_DIMS - 1) {
            snprintf(why, whylen, "--shape '%s': more than %d dimensions", s,
                     NPYLOAD_MAX_DIMS - 1);
            return -1;
        }
        char *end = NULL;
        errno = 0;
        if (*p < '0' || *p > '9')
            goto bad;
        long long v = strtoll(p, &end, 10);
        if (errno || v < 0)
            goto bad;
        dims[(*ndim)++] = v;
        if (*end == '\0')
            return 0;
        if (*end != ',' && *end != 'x')
            goto bad;
        p = end + 1;
    }
bad:
    snprintf(why, whylen,
             "bad --shape '%s' (expected per-sample dimensions like 3,32,32)",
             s);
    return -1;
}

/* One half-precision value m * 2^-11 for |m| < 2048: exact, finite. */
static uint16_t half_from_int(int m)
{
    uint16_t sign = m < 0 ? 0x8000 : 0;
    unsigned a = (unsigned)(m < 0 ? -m : m);
    if (a == 0)
        return sign;
    int e = 0;
    while ((a >> (e + 1)) != 0)
        e++;                                   /* 2^e <= a < 2^(e+1) */
    uint16_t exp = (uint16_t)(e - 11 + 15);    /* value = 1.f x 2^(e-11) */
    uint16_t man = (uint16_t)((a << (10 - e)) & 0x3ffu);
    return (uint16_t)(sign | (exp << 10) | man);
}

static void byteswap(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n / 2; i++) {
        unsigned char t = p[i];
        p[i] = p[n - 1 - i];
        p[n - 1 - i] = t;
    }
}

/* Writes `count` elements of random content: booleans 0/1, integers over
 * their full range, floats uniform in [-1, 1) (exactly representable), complex
 * numbers as two such floats; in the file's byte order (`big`: '>'), so the
 * bytes are the same on every host. */
static void fill_elements(unsigned char *dst, size_t count, char kind,
                          size_t itemsize, int big, rng *r)
{
    const int swap_native = big == host_little_endian();
    for (size_t i = 0; i < count; i++, dst += itemsize) {
        uint64_t x = rng_next(r);
        switch (kind) {
        case 'b': dst[0] = (unsigned char)(x >> 63); break;
        case 'i':
        case 'u':
            for (size_t b = 0; b < itemsize; b++)
                dst[b] = (unsigned char)(x >> (8 * b)); /* little-endian */
            if (big)
                byteswap(dst, itemsize);
            break;
        case 'f':
        case 'c': {
            size_t comp = kind == 'c' ? itemsize / 2 : itemsize;
            for (size_t part = 0; part * comp < itemsize; part++) {
                unsigned char *q = dst + part * comp;
                if (part)
                    x = rng_next(r);
                if (comp == 2) {
                    uint16_t h = half_from_int((int)(x >> 52) - 2048);
                    memcpy(q, &h, 2);
                } else if (comp == 4) {
                    float v = (float)((int64_t)(x >> 40) - (1 << 23)) *
                              0x1p-23f;
                    memcpy(q, &v, 4);
                } else {
                    double v =
                        (double)((int64_t)(x >> 11) - ((int64_t)1 << 52)) *
                        0x1p-52;
                    memcpy(q, &v, 8);
                }
                if (swap_native)
                    byteswap(q, comp);
            }
            break;
        }
        default: break;
        }
    }
}

static int gen_generic(const gen_opts *o, gen_totals *t)
{
    char descr[NPYLOAD_DESCR_LEN], kind = 0, why[256];
    size_t itemsize = 0;
    int big = 0, nd = 0;
    int64_t shape[NPYLOAD_MAX_DIMS];
    if (parse_dtype(o->dtype, descr, &kind, &itemsize, &big, why,
                    sizeof why) != 0 ||
        parse_shape(o->shape, shape + 1, &nd, why, sizeof why) != 0) {
        fprintf(stderr, PROG ": %s\n", why);
        return -2;
    }
    shape[0] = o->samples;
    /* Elements per file, checked against overflow before anything is
     * written. */
    uint64_t count = 1;
    for (int i = 0; i <= nd; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (d && count > UINT64_MAX / d / itemsize) {
            fprintf(stderr, PROG ": --shape '%s' x %" PRId64
                            " samples is too large\n",
                    o->shape, o->samples);
            return -2;
        }
        count *= d;
    }
    if (mkdir_p(o->out) != 0)
        return -1;
    const uint64_t prefix_key = mix64(o->seed ^ fnv1a64(o->prefix));
    const size_t per_chunk = CHUNK_BYTES / itemsize;
    char *buf;
    if (buffers_alloc(&buf, 1) != 0)
        return -1;

    int ok = 1;
    for (int64_t f = 0; ok && f < o->files; f++) {
        int64_t id = o->first_id + f;
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s_%04" PRId64 ".npy", o->out,
                     o->prefix, id) >= (int)sizeof path) {
            fprintf(stderr, PROG ": output path too long\n");
            ok = 0;
            break;
        }
        writer w;
        memset(&w, 0, sizeof w);
        w.fd = -1;
        ok = writer_open(&w, buf, path, descr, o->fortran, nd + 1, shape) == 0;
        rng r = {mix64(prefix_key + (uint64_t)id)};
        for (uint64_t done = 0; ok && done < count;) {
            size_t n = count - done < per_chunk ? (size_t)(count - done)
                                                 : per_chunk;
            unsigned char *dst = writer_reserve(&w, n * itemsize);
            if (!dst) {
                ok = 0;
                break;
            }
            fill_elements(dst, n, kind, itemsize, big, &r);
            done += n;
        }
        uint64_t bytes = w.written + w.len;
        if (writer_close(&w, ok) != 0 || !ok) {
            ok = 0;
            break;
        }
        t->files++;
        t->samples += (uint64_t)o->samples;
        t->bytes += bytes;
    }
    buffers_free(&buf, 1);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------------ */
/* Command line                                                                */
/* ------------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: " PROG " --preset captcha --out DIR [--split train] [--files 4]\n"
        "                   [--samples-per-file 64] [--channels 2] [--seed 0]\n"
        "                   [--first-id 0]\n"
        "       " PROG " --generic --out DIR --shape 3,32,32 [--prefix data]\n"
        "                   [--files 4] [--samples-per-file 64] [--dtype <f4]\n"
        "                   [--fortran] [--seed 0] [--first-id 0]\n"
        "\n"
        "--preset captcha writes the slider-CAPTCHA reference layout:\n"
        "  DIR/images/SPLIT/SPLIT_{id:04d}.npy           float32 (S, C, 256, 512)\n"
        "      C=2: gray + mask, C=4: RGB + mask; 16 levels k/15; mask all ones\n"
        "  DIR/labels/SPLIT/SPLIT_{id:04d}_heatmaps.npy  float32 (S, 2, 64, 128)\n"
        "      gap, slider: gaussian sigma 1.5 in a 9x9 window, 1.0 at the peak\n"
        "  DIR/labels/SPLIT/SPLIT_{id:04d}_offsets.npy   float32 (S, 4, 64, 128)\n"
        "      gap du,dv, slider du,dv in [-0.5, 0.5), set at the peak cell only\n"
        "--generic writes DIR/PREFIX_{id:04d}.npy of shape (S, *SHAPE) with\n"
        "  pseudo-random content; --dtype one of b1 i1 i2 i4 i8 u1 u2 u4 u8\n"
        "  f2 f4 f8 c8 c16, prefixed by '<', '>' or '|' (one-byte types).\n"
        "\n"
        "  --out DIR               output directory (created as needed)\n"
        "  --split NAME            captcha split: train, val, test... (train)\n"
        "  --channels 2|4          captcha image channels (2)\n"
        "  --prefix NAME           generic file name prefix (data)\n"
        "  --shape D1,D2,...       generic per-sample shape ('' = scalars)\n"
        "  --dtype DTYPE           generic dtype (<f4)\n"
        "  --fortran               generic: mark the files fortran_order\n"
        "  --files N               number of files (4)\n"
        "  --samples-per-file S    first dimension of every file (64)\n"
        "  --first-id K            id of the first file (0), to write shards\n"
        "                          of one dataset from several processes\n"
        "  --seed S                any 64-bit integer (0); same seed, same bytes\n"
        "  --quiet                 no summary line\n"
        "  --help, --version\n"
        "\n"
        "Content is a pure function of (seed, split or prefix, id, sample):\n"
        "splitmix64 streams, never rand(). Exit status: 0 done, 1 I/O error,\n"
        "2 bad arguments.\n");
}

static int bad_arg(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, PROG ": ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n(try " PROG " --help)\n");
    return 2;
}

static int parse_i64(const char *opt, const char *s, int64_t lo, int64_t hi,
                     int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        char range[96];
        snprintf(range, sizeof range, "an integer in [%lld, %lld]",
                 (long long)lo, (long long)hi);
        fprintf(stderr, PROG ": %s: '%s' is not %s\n(try " PROG " --help)\n",
                opt, s, range);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_seed(const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    if (*s == '-') {
        long long v = strtoll(s, &end, 0);
        if (*end || errno)
            return -1;
        *out = (uint64_t)v;
    } else {
        unsigned long long v = strtoull(s, &end, 0);
        if (!*s || *end || errno)
            return -1;
        *out = v;
    }
    return 0;
}

static int valid_name(const char *s)
{
    return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

int main(int argc, char **argv)
{
    gen_opts o = {.out = NULL, .split = "train", .prefix = "data",
                  .dtype = "<f4", .shape = NULL, .files = 4, .samples = 64,
                  .channels = 2, .first_id = 0, .seed = 0, .fortran = 0};
    const char *preset = NULL;
    int generic = 0, quiet = 0;
    int captcha_only = 0, generic_only = 0;
    const char *captcha_opt = NULL, *generic_opt = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        char name[64];
        /* --opt=value or --opt value */
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        if (eq) {
            size_t n = (size_t)(eq - a);
            if (n >= sizeof name)
                return bad_arg("unknown option '%s'%s", a, "");
            memcpy(name, a, n);
            name[n] = '\0';
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
        }

        if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(name, "--version") == 0) {
            printf(PROG " %s\n", npyload_version_string());
            return 0;
        }
        if (strcmp(name, "--generic") == 0 || strcmp(name, "--fortran") == 0 ||
            strcmp(name, "--quiet") == 0) {
            if (val)
                return bad_arg("%s takes no value%s", name, "");
            if (name[2] == 'g')
                generic = 1;
            else if (name[2] == 'f') {
                o.fortran = 1;
                generic_only = 1;
                generic_opt = "--fortran";
            } else
                quiet = 1;
            continue;
        }

        static const char *const with_value[] = {
            "--preset", "--out", "--split", "--prefix", "--files",
            "--samples-per-file", "--channels", "--seed", "--shape",
            "--dtype", "--first-id"};
        int known = 0;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++)
            known |= strcmp(name, with_value[k]) == 0;
        if (!known)
            return bad_arg("unknown option '%s'%s", a, "");
        if (!val) {
            if (i + 1 >= argc)
                return bad_arg("%s needs a value%s", name, "");
            val = argv[++i];
        }

        if (strcmp(name, "--preset") == 0) {
            preset = val;
        } else if (strcmp(name, "--out") == 0) {
            if (!*val)
                return bad_arg("--out needs a directory%s%s", "", "");
            o.out = val;
        } else if (strcmp(name, "--split") == 0) {
            if (!valid_name(val))
                return bad_arg("--split '%s' must be a non-empty name "
                               "without '/'%s", val, "");
            o.split = val;
            captcha_only = 1;
            captcha_opt = "--split";
        } else if (strcmp(name, "--prefix") == 0) {
            if (!valid_name(val))
                return bad_arg("--prefix '%s' must be a non-empty name "
                               "without '/'%s", val, "");
            o.prefix = val;
            generic_only = 1;
            generic_opt = "--prefix";
        } else if (strcmp(name, "--files") == 0) {
            if (parse_i64(name, val, 1, 100000000, &o.files))
                return 2;
        } else if (strcmp(name, "--samples-per-file") == 0) {
            if (parse_i64(name, val, 0, INT32_MAX, &o.samples))
                return 2;
        } else if (strcmp(name, "--channels") == 0) {
            if (strcmp(val, "2") != 0 && strcmp(val, "4") != 0)
                return bad_arg("--channels must be 2 (gray + mask) or 4 "
                               "(RGB + mask), not '%s'%s", val, "");
            o.channels = val[0] - '0';
            captcha_only = 1;
            captcha_opt = "--channels";
        } else if (strcmp(name, "--first-id") == 0) {
            if (parse_i64(name, val, 0, INT32_MAX, &o.first_id))
                return 2;
        } else if (strcmp(name, "--seed") == 0) {
            if (parse_seed(val, &o.seed))
                return bad_arg("--seed '%s' is not a 64-bit integer%s", val,
                               "");
        } else if (strcmp(name, "--shape") == 0) {
            o.shape = val;
            generic_only = 1;
            generic_opt = "--shape";
        } else if (strcmp(name, "--dtype") == 0) {
            o.dtype = val;
            generic_only = 1;
            generic_opt = "--dtype";
        }
    }

    if (generic && preset)
        return bad_arg("choose one of --preset and --generic%s%s", "", "");
    if (!generic && !preset)
        return bad_arg("say what to write: --preset captcha or --generic%s%s",
                       "", "");
    if (preset && strcmp(preset, "captcha") != 0)
        return bad_arg("unknown preset '%s' (known: captcha)%s", preset, "");
    if (!o.out)
        return bad_arg("--out DIR is required%s%s", "", "");
    if (preset && generic_only)
        return bad_arg("%s applies to --generic only%s", generic_opt, "");
    if (generic && captcha_only)
        return bad_arg("%s applies to --preset captcha only%s", captcha_opt,
                       "");
    if (generic && !o.shape)
        return bad_arg("--generic needs --shape (per-sample dimensions, e.g. "
                       "3,32,32)%s%s", "", "");
    if (preset && o.samples < 1)
        return bad_arg("--samples-per-file must be at least 1%s%s", "", "");
    if (o.first_id + o.files - 1 > INT32_MAX)
        return bad_arg("--first-id + --files is too large%s%s", "", "");

    gen_totals t = {0, 0, 0};
    double t0 = now_s();
    int rc = generic ? gen_generic(&o, &t) : gen_captcha(&o, &t);
    double dt = now_s() - t0;
    if (rc == -2)
        return 2;
    if (rc != 0)
        return 1;
    if (!quiet)
        printf(PROG ": wrote %" PRIu64 " files, %" PRIu64 " samples, %" PRIu64
               " bytes (%.1f MiB) under %s in %.3f s, %.1f MB/s\n",
               t.files, t.samples, t.bytes, (double)t.bytes / 1048576.0, o.out,
               dt, dt > 0 ? (double)t.bytes / 1e6 / dt : 0.0);
    return 0;
}
