/* Lossless narrowing (npyload_zst.h, "narrowed files"): a field whose file
 * holds at most 256 distinct values (bit patterns) of 2, 4 or 8 bytes is
 * stored as one-byte codes plus the table of values.
 *
 * In the file: frame 0's extent in the seek table is the zstd frame of the
 * codes' NPY header ('|u1', the same shape) followed by a skippable frame
 * (magic NPYL_ZST_NARROW_MAGIC) whose payload is the tag "NPYLNRW1" and one
 * zstd frame, with a content checksum, of the table: the values' descr (16
 * bytes, NUL-padded), their count and itemsize (u32 little-endian each),
 * then count x itemsize bytes of values, code k's value at k x itemsize.
 * `zstd -d` skips skippable frames, so it restores a valid .npy of the
 * codes; npyload delivers the values. The table is compressed only to get
 * zstd's checksum over it: a damaged table is refused at start.
 *
 * Stored without compression (npyload-pack --narrow --store): a plain .npy
 * of the codes ('|u1', the same shape) followed by a trailer: the same
 * skippable frame, its length (u32 little-endian) and the tag "NPYLSTOR".
 * numpy reads the array and ignores what follows it (np.load gives the
 * codes); npyload finds the trailer from the file's end and delivers the
 * values. */
#include "npyload_zst.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zstd.h>

#define TAG "NPYLNRW1"
#define TAG_BYTES 8u
#define TABLE_HEAD 24u /* descr[16], count, itemsize */

static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint64_t load(const unsigned char *p, unsigned w)
{
    uint64_t v = 0;
    memcpy(&v, p, w); /* a bit pattern: only equality and order matter */
    return v;
}

/* The first position of the sorted set not below v (binary search: at
 * most 8 steps). */
static size_t lower_bound(const npyl_zst_narrow_scan *s, uint64_t v)
{
    size_t lo = 0, hi = s->count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->set[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void npyl_zst_narrow_begin(npyl_zst_narrow_scan *s, unsigned itemsize)
{
    memset(s, 0, sizeof *s);
    s->itemsize = itemsize;
}

int npyl_zst_narrow_add(npyl_zst_narrow_scan *s, const void *data, size_t n)
{
    const unsigned char *p = data;
    const unsigned w = s->itemsize;
    for (size_t i = 0; i + w <= n; i += w) {
        uint64_t v = load(p + i, w);
        size_t lo = lower_bound(s, v);
        if (lo < s->count && s->set[lo] == v)
            continue;
        if (s->count == NPYL_ZST_NARROW_MAX) {
            s->over = 1;
            return -1;
        }
        memmove(s->set + lo + 1, s->set + lo, (s->count - lo) * sizeof *s->set);
        s->set[lo] = v;
        s->count++;
    }
    return 0;
}

void npyl_zst_narrow_codes(const npyl_zst_narrow_scan *s, const void *data, size_t n,
                           unsigned char *codes)
{
    const unsigned char *p = data;
    const unsigned w = s->itemsize;
    for (size_t i = 0, k = 0; i + w <= n; i += w, k++) {
        codes[k] = (unsigned char)lower_bound(s, load(p + i, w)); /* every value was added */
    }
}

int npyl_zst_narrow_encode(const npyl_zst_narrow_scan *s, const char *descr,
                           unsigned char **out, size_t *out_len)
{
    const unsigned w = s->itemsize;
    size_t tlen = TABLE_HEAD + (size_t)s->count * w;
    unsigned char *t = calloc(1, tlen);
    size_t cap = ZSTD_compressBound(tlen);
    unsigned char *f = malloc(NPYL_ZST_SKIP_HEADER_BYTES + TAG_BYTES + cap);
    if (!t || !f) {
        free(t);
        free(f);
        return -ENOMEM;
    }
    strncpy((char *)t, descr, 15);
    wr32(t + 16, s->count);
    wr32(t + 20, w);
    for (uint32_t k = 0; k < s->count; k++)
        memcpy(t + TABLE_HEAD + (size_t)k * w, &s->set[k], w);
    ZSTD_CCtx *c = ZSTD_createCCtx();
    size_t z = c ? ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1) : 0;
    if (c && !ZSTD_isError(z))
        z = ZSTD_compress2(c, f + NPYL_ZST_SKIP_HEADER_BYTES + TAG_BYTES, cap, t, tlen);
    ZSTD_freeCCtx(c);
    free(t);
    if (!c || ZSTD_isError(z)) {
        free(f);
        return !c ? -ENOMEM : NPYLOAD_EINVAL;
    }
    wr32(f, NPYL_ZST_NARROW_MAGIC);
    wr32(f + 4, (uint32_t)(TAG_BYTES + z));
    memcpy(f + NPYL_ZST_SKIP_HEADER_BYTES, TAG, TAG_BYTES);
    *out = f;
    *out_len = NPYL_ZST_SKIP_HEADER_BYTES + TAG_BYTES + z;
    return 0;
}

int npyl_zst_store_trailer(const npyl_zst_narrow_scan *s, const char *descr,
                           unsigned char **out, size_t *out_len)
{
    unsigned char *f = NULL;
    size_t n = 0;
    int rc = npyl_zst_narrow_encode(s, descr, &f, &n);
    if (rc)
        return rc;
    unsigned char *t = realloc(f, n + NPYL_ZST_STORE_TAIL_BYTES);
    if (!t) {
        free(f);
        return -ENOMEM;
    }
    wr32(t + n, (uint32_t)n);
    memcpy(t + n + 4, NPYL_ZST_STORE_TAG, 8);
    *out = t;
    *out_len = n + NPYL_ZST_STORE_TAIL_BYTES;
    return 0;
}

int npyl_zst_store_probe(npyl_zst_read_fn rd, void *ctx, const char *name, uint64_t file_bytes,
                         uint64_t data_end, npyl_zst_narrow **out, char *err, size_t errlen)
{
    *out = NULL;
    unsigned char tail[NPYL_ZST_STORE_TAIL_BYTES];
    if (file_bytes < data_end + NPYL_ZST_STORE_TAIL_BYTES ||
        rd(ctx, tail, sizeof tail, file_bytes - sizeof tail) != 0 ||
        memcmp(tail + 4, NPYL_ZST_STORE_TAG, 8) != 0) {
        /* No trailer at the end. A stored narrowed file that lost its last
         * bytes (the tag, the length, part of the table) still has its
         * table's frame right after the codes: refused, never delivered as
         * the uint8 codes. Any other bytes after the data: a plain .npy
         * (numpy ignores them), as before. */
        unsigned char head[NPYL_ZST_SKIP_HEADER_BYTES + TAG_BYTES];
        uint64_t after = file_bytes - data_end;
        size_t k = after < sizeof head ? (size_t)after : sizeof head;
        if (k >= 4 && rd(ctx, head, k, data_end) == 0 && rd32(head) == NPYL_ZST_NARROW_MAGIC &&
            (k < sizeof head || memcmp(head + NPYL_ZST_SKIP_HEADER_BYTES, TAG, TAG_BYTES) == 0))
            return npyl_fail(err, errlen, NPYLOAD_ETRUNCATED,
                             "%s: a stored narrowed file (npyload-pack --narrow --store) "
                             "whose trailer is missing or cut: its value table follows the "
                             "codes, but the %u bytes that must end the file (the table's "
                             "length and the tag NPYLSTOR) are not there (the file lost its "
                             "last bytes?); refused rather than delivering the codes",
                             name, (unsigned)NPYL_ZST_STORE_TAIL_BYTES);
        return 0;
    }
    uint32_t n = rd32(tail);
    if (n > NPYL_ZST_NARROW_FRAME_MAX ||
        data_end + n + NPYL_ZST_STORE_TAIL_BYTES != file_bytes)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: a narrowed-store trailer of %" PRIu32 " bytes that does not "
                         "end the %" PRIu64 " bytes after the codes (a damaged file)", name, n,
                         file_bytes - data_end);
    unsigned char p[NPYL_ZST_NARROW_FRAME_MAX];
    if (rd(ctx, p, n, data_end) != 0)
        return npyl_fail(err, errlen, NPYLOAD_ETRUNCATED, "%s: cannot read the value table "
                         "(%" PRIu32 " bytes at byte %" PRIu64 ")", name, n, data_end);
    return npyl_zst_narrow_parse(p, n, name, out, err, errlen);
}

int npyl_zst_narrow_parse(const unsigned char *p, size_t n, const char *name,
                          npyl_zst_narrow **out, char *err, size_t errlen)
{
    *out = NULL;
    if (n < NPYL_ZST_SKIP_HEADER_BYTES + TAG_BYTES || rd32(p) != NPYL_ZST_NARROW_MAGIC ||
        memcmp(p + NPYL_ZST_SKIP_HEADER_BYTES, TAG, TAG_BYTES) != 0 ||
        rd32(p + 4) != n - NPYL_ZST_SKIP_HEADER_BYTES)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame 0 holds %zu bytes after the header's zstd frame "
                         "that are not npyload's value table (a newer format, or a "
                         "damaged file)", name, n);
    const unsigned char *z = p + NPYL_ZST_SKIP_HEADER_BYTES + TAG_BYTES;
    size_t zlen = n - NPYL_ZST_SKIP_HEADER_BYTES - TAG_BYTES;
    unsigned char t[TABLE_HEAD + NPYL_ZST_NARROW_MAX * 8];
    unsigned long long fcs = ZSTD_getFrameContentSize(z, zlen);
    size_t r = fcs <= sizeof t ? ZSTD_decompress(t, sizeof t, z, zlen) : (size_t)-1;
    if (fcs > sizeof t || ZSTD_isError(r) || r != fcs || r < TABLE_HEAD)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: the value table of this narrowed file is damaged (%s)",
                         name, fcs > sizeof t ? "too large"
                         : ZSTD_isError(r) ? ZSTD_getErrorName(r) : "wrong size");
    uint32_t count = rd32(t + 16), w = rd32(t + 20);
    if (t[15] != 0 || count < 1 || count > NPYL_ZST_NARROW_MAX ||
        (w != 2 && w != 4 && w != 8) || r != TABLE_HEAD + (size_t)count * w)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: the value table of this narrowed file is inconsistent "
                         "(%" PRIu32 " values of %" PRIu32 " bytes in %zu bytes)",
                         name, count, w, r);
    /* The descr becomes the field's dtype and w its item size: they must
     * agree (what plan_narrow packs: a byte order, a kind of "fiuc" and the
     * size in one digit), or rows of w bytes a value would be read as
     * another size. The checksum only says the table is as written. */
    const char *d = (const char *)t;
    if (strnlen(d, 16) != 3 || !strchr("<>=", d[0]) || !d[0] || !strchr("fiuc", d[1]) ||
        !d[1] || (unsigned)(d[2] - '0') != w || (d[1] == 'c' && w != 8))
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: the value table of this narrowed file is inconsistent "
                         "(dtype '%.15s' for values of %" PRIu32 " bytes; expected a "
                         "number of %" PRIu32 " bytes such as '<f%" PRIu32 "')",
                         name, d, w, w, w);
    npyl_zst_narrow *x = calloc(1, sizeof *x);
    if (!x)
        return npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", name);
    memcpy(x->descr, t, 16);
    x->count = count;
    x->itemsize = w;
    memcpy(x->values, t + TABLE_HEAD, (size_t)count * w);
    *out = x;
    return 0;
}

int npyl_zst_narrow_expand(const npyl_zst_narrow *x, const unsigned char *codes, size_t n,
                           void *dst)
{
    int bad = 0;
    switch (x->itemsize) {
    case 2: {
        uint16_t v[NPYL_ZST_NARROW_MAX] = {0}, *d = dst;
        memcpy(v, x->values, (size_t)x->count * 2);
        for (size_t i = 0; i < n; i++) {
            bad |= codes[i] >= x->count;
            memcpy(d + i, &v[codes[i]], 2);
        }
        break;
    }
    case 4: {
        uint32_t v[NPYL_ZST_NARROW_MAX] = {0}, *d = dst;
        memcpy(v, x->values, (size_t)x->count * 4);
        for (size_t i = 0; i < n; i++) {
            bad |= codes[i] >= x->count;
            memcpy(d + i, &v[codes[i]], 4);
        }
        break;
    }
    default: {
        uint64_t v[NPYL_ZST_NARROW_MAX] = {0}, *d = dst;
        memcpy(v, x->values, (size_t)x->count * 8);
        for (size_t i = 0; i < n; i++) {
            bad |= codes[i] >= x->count;
            memcpy(d + i, &v[codes[i]], 8);
        }
        break;
    }
    }
    return bad ? -1 : 0;
}

int npyl_zst_narrow_check(const npyl_zst_narrow *x, const unsigned char *codes, size_t n)
{
    if (x->count >= NPYL_ZST_NARROW_MAX)
        return 0; /* every byte is a code */
    unsigned char top = 0;
    for (size_t i = 0; i < n; i++)
        top = codes[i] > top ? codes[i] : top;
    return n && top >= x->count ? -1 : 0;
}
