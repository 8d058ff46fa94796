/* npyload-gen --generic: DIR/PREFIX_{id:04d}.npy of shape (S, *SHAPE) in any
 * numeric numpy dtype. File `id` draws from the splitmix64 stream
 * mix64(mix64(seed ^ fnv1a64(prefix)) + id); its bytes are the same on every
 * host (integers and exactly representable floats, written in the file's
 * byte order). */
#include "npyload_gen.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload.h"
#include "npyload_args.h"

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
        size_t n = strcspn(p, ",x");
        char tok[32];
        if (n == 0 || n >= sizeof tok)
            goto bad;
        memcpy(tok, p, n);
        tok[n] = 0;
        if (*tok < '0' || *tok > '9')
            goto bad;
        int64_t v;
        /* The range message goes to stderr; `why` adds the whole value. */
        if (tool_arg_i64(PROG, "--shape dimension", tok, 0, INT64_MAX, &v) != 0)
            goto bad;
        dims[(*ndim)++] = v;
        if (p[n] == '\0')
            return 0;
        p += n + 1;
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

/* The file's dtype and shape, from the options. @return : 0 or -2. */
typedef struct generic_layout {
    char descr[NPYLOAD_DESCR_LEN];
    char kind;
    size_t itemsize;
    int big;
    int ndim;
    int64_t shape[NPYLOAD_MAX_DIMS];
    uint64_t count; /* elements per file */
} generic_layout;

static int generic_parse(const gen_opts *o, generic_layout *g)
{
    char why[256];
    int nd = 0;
    if (parse_dtype(o->dtype, g->descr, &g->kind, &g->itemsize, &g->big, why, sizeof why) != 0 ||
        parse_shape(o->shape, g->shape + 1, &nd, why, sizeof why) != 0) {
        fprintf(stderr, PROG ": %s\n", why);
        return -2;
    }
    g->shape[0] = o->samples;
    g->ndim = nd + 1;
    /* Elements per file, checked against overflow before anything is
     * written. */
    g->count = 1;
    for (int i = 0; i < g->ndim; i++) {
        uint64_t d = (uint64_t)g->shape[i];
        if (d && g->count > UINT64_MAX / d / g->itemsize) {
            fprintf(stderr, PROG ": --shape '%s' x %" PRId64 " samples is too large\n",
                    o->shape, o->samples);
            return -2;
        }
        g->count *= d;
    }
    return 0;
}

/* Writes one file. @return : 0 or -1. */
static int generic_write_file(const gen_opts *o, const generic_layout *g, char *buf,
                              const char *path, rng *r, gen_totals *t)
{
    const size_t per_chunk = CHUNK_BYTES / g->itemsize;
    writer w;
    w.fd = -1;
    int ok = writer_open(&w, 0, buf, path, g->descr, o->fortran, g->ndim, g->shape) == 0;
    for (uint64_t done = 0; ok && done < g->count;) {
        size_t n = g->count - done < per_chunk ? (size_t)(g->count - done) : per_chunk;
        unsigned char *dst = writer_reserve(&w, n * g->itemsize);
        if (!dst) {
            ok = 0;
            break;
        }
        fill_elements(dst, n, g->kind, g->itemsize, g->big, r);
        done += n;
    }
    uint64_t bytes = w.written + w.len;
    if (writer_close(&w, ok) != 0 || !ok)
        return -1;
    t->files++;
    t->samples += (uint64_t)o->samples;
    t->bytes += bytes;
    return 0;
}

int gen_generic(const gen_opts *o, gen_totals *t)
{
    generic_layout g;
    uint64_t file_bytes;
    int rc = generic_parse(o, &g);
    if (rc != 0)
        return rc;
    if (mkdir_p(o->out) != 0 ||
        gen_npy_bytes(g.descr, o->fortran, g.ndim, g.shape, g.count * g.itemsize,
                      &file_bytes) != 0 ||
        gen_check_space(o->out, &file_bytes, 1, o->files) != 0)
        return -1;
    const uint64_t prefix_key = mix64(o->seed ^ fnv1a64(o->prefix));
    char *buf;
    if (buffers_alloc(&buf, 1) != 0)
        return -1;
    for (int64_t f = 0; rc == 0 && f < o->files; f++) {
        int64_t id = o->first_id + f;
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s_%04" PRId64 ".npy", o->out, o->prefix, id) >=
            (int)sizeof path) {
            fprintf(stderr, PROG ": output path too long\n");
            rc = -1;
            break;
        }
        rng r = {mix64(prefix_key + (uint64_t)id)};
        rc = generic_write_file(o, &g, buf, path, &r, t);
    }
    buffers_free(&buf, 1);
    return rc;
}
