/* The seek table of a .npy.zst: encoding, and parsing from the file tail
 * with every check the format and the NPY contract imply (npyload_zst.h).
 *
 * The parser reads through a callback so that a file (pread) and a memory
 * buffer (the fuzz target) go through one code path. Nothing is allocated
 * from a table field before that field is checked against the real file
 * size: the table's own size must fit the file, so the index arrays are
 * proportional to bytes that exist. */
#include "npyload_zst.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

static uint32_t rd_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static void wr_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

int npyl_zst_is_zstd(const void *p)
{
    return rd_le32(p) == NPYL_ZST_MAGIC;
}

int npyl_zst_read_fd(void *ctx, void *buf, size_t n, uint64_t off)
{
    int fd = *(const int *)ctx;
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return -EIO; /* the file shrank after its size was taken */
        got += (size_t)r;
    }
    return 0;
}

int npyl_zst_read_mem(void *ctx, void *buf, size_t n, uint64_t off)
{
    const npyl_zst_mem *m = ctx;
    if (off > m->len || n > m->len - off)
        return -EIO;
    memcpy(buf, m->data + off, n);
    return 0;
}

size_t npyl_zst_table_size(uint32_t n, int checksums)
{
    return NPYL_ZST_SKIP_HEADER_BYTES + (size_t)n * (checksums ? 12u : 8u) +
           NPYL_ZST_FOOTER_BYTES;
}

size_t npyl_zst_table_encode(void *dst, uint32_t n, const uint32_t *csize,
                             const uint32_t *dsize, const uint32_t *csum,
                             int checksums)
{
    size_t total = npyl_zst_table_size(n, checksums);
    unsigned char *p = dst;
    wr_le32(p, NPYL_ZST_SKIPPABLE_MAGIC);
    wr_le32(p + 4, (uint32_t)(total - NPYL_ZST_SKIP_HEADER_BYTES));
    p += NPYL_ZST_SKIP_HEADER_BYTES;
    for (uint32_t i = 0; i < n; i++) {
        wr_le32(p, csize[i]);
        wr_le32(p + 4, dsize[i]);
        p += 8;
        if (checksums) {
            wr_le32(p, csum[i]);
            p += 4;
        }
    }
    wr_le32(p, n);
    p[4] = checksums ? NPYL_ZST_FLAG_CHECKSUM : 0;
    wr_le32(p + 5, NPYL_ZST_SEEKABLE_MAGIC);
    return total;
}

void npyl_zst_index_free(npyl_zst_index *x)
{
    if (!x)
        return;
    free(x->coff);
    free(x->doff);
    free(x->csum);
    free(x->narrow);
    x->coff = x->doff = NULL;
    x->csum = NULL;
    x->narrow = NULL;
}

/* "no seek table" or "not zstd", depending on the file's first bytes. */
static int no_table(npyl_zst_read_fn rd, void *ctx, uint64_t size,
                    const char *name, const char *why, char *err, size_t errlen)
{
    unsigned char m[4];
    if (size >= 4 && rd(ctx, m, 4, 0) == 0 && npyl_zst_is_zstd(m))
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: no seek table: repack it with npyload-pack "
                         "(or zstd -d it); %s",
                         name, why);
    return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                     "%s: not a zstd file (%s)", name, why);
}

static int read_err(int rc, const char *name, size_t n, uint64_t off,
                    char *err, size_t errlen)
{
    return npyl_fail(err, errlen, rc, "%s: reading %zu bytes at byte %" PRIu64
                     " failed: %s", name, n, off,
                     rc == -EIO ? "short read (file changed?)" : strerror(-rc));
}

/* Decompresses frame 0 and parses the NPY header in it. */
static int read_header_frame(npyl_zst_read_fn rd, void *ctx,
                             npyl_zst_index *x, const char *name, char *err,
                             size_t errlen)
{
    uint64_t csz = x->coff[1], dsz = x->doff[1];
    if (dsz > NPYLOAD_MAX_HEADER_LEN + 12)
        return npyl_fail(err, errlen, NPYLOAD_ETOOBIG,
                         "%s: frame 0 at byte 0: %" PRIu64 " bytes, more than "
                         "an NPY header can hold (%u)",
                         name, dsz, NPYLOAD_MAX_HEADER_LEN + 12);
    unsigned char *src = malloc((size_t)csz);
    unsigned char *dst = malloc((size_t)dsz);
    ZSTD_DCtx *dctx = ZSTD_createDCtx();
    int rc;
    if (!src || !dst || !dctx) {
        rc = npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", name);
        goto out;
    }
    rc = rd(ctx, src, (size_t)csz, 0);
    if (rc) {
        rc = read_err(rc, name, (size_t)csz, 0, err, errlen);
        goto out;
    }
    /* A narrowed file's value table follows the header's zstd frame inside
     * frame 0's extent (npyload_zst_narrow.c). */
    x->frame0_bytes = csz;
    size_t first = ZSTD_findFrameCompressedSize(src, (size_t)csz);
    if (!ZSTD_isError(first) && first < csz) {
        rc = npyl_zst_narrow_parse(src + first, (size_t)csz - first, name, &x->narrow,
                                   err, errlen);
        if (rc)
            goto out;
        x->frame0_bytes = first;
    }
    rc = npyl_zst_decode_frame(x, 0, dctx, src, dst, (size_t)dsz, name, err,
                               errlen);
    if (rc)
        goto out;
    /* The .npy this file decompresses to is doff[nframes] bytes long. */
    uint64_t npy_size = x->doff[x->nframes];
    rc = npyload_parse_header(dst, (size_t)dsz, npy_size, name, &x->hdr, err,
                              errlen);
    if (rc == NPYLOAD_ETRUNCATED && x->hdr.header_len &&
        x->hdr.data_offset > dsz) {
        rc = npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                       "%s: frame 0 at byte 0: holds %" PRIu64 " bytes, the "
                       "NPY header in it needs %" PRIu64,
                       name, dsz, x->hdr.data_offset);
        goto out;
    }
    if (rc)
        goto out;
    if (!rc && x->narrow && strcmp(x->hdr.descr, "|u1") != 0) {
        rc = npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                       "%s: a value table for one-byte codes, but the header's "
                       "dtype is '%s'", name, x->hdr.descr);
        goto out;
    }
    if (x->hdr.data_offset != dsz) {
        rc = npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                       "%s: frame 0 at byte 0: holds %" PRIu64 " bytes, the "
                       "NPY header is %" PRIu64 " (frame 0 must hold exactly "
                       "the header)",
                       name, dsz, x->hdr.data_offset);
        goto out;
    }
out:
    ZSTD_freeDCtx(dctx);
    free(dst);
    free(src);
    return rc;
}

/* The NPY facts against the frames: whole samples, exact total. */
static int check_npy(npyl_zst_index *x, const char *name, char *err,
                     size_t errlen)
{
    const npyload_header *h = &x->hdr;
    if (h->fortran_order && h->ndim > 1)
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: Fortran-ordered array (fortran_order: True): "
                         "samples are not contiguous",
                         name);
    uint64_t data = x->doff[x->nframes] - x->doff[1];
    if (data != h->data_bytes)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: the frames after the header hold %" PRIu64
                         " bytes, the header's shape and dtype say %" PRIu64,
                         name, data, h->data_bytes);
    x->rows = h->ndim ? (uint64_t)h->shape[0] : 1;
    /* Bytes per sample: itemsize x shape[1:]. With shape[0] == 0 that
     * product is not bounded by data_bytes: saturate (no data frame can
     * exist then anyway, the total above is 0). */
    uint64_t rb = h->itemsize;
    for (int d = 1; d < h->ndim; d++)
        if (npyl_mul_u64(rb, (uint64_t)h->shape[d], &rb) != 0) {
            rb = UINT64_MAX;
            break;
        }
    x->row_bytes = rb;
    x->max_dsize = x->max_csize = 0;
    for (uint32_t f = 1; f < x->nframes; f++) {
        uint64_t dsz = x->doff[f + 1] - x->doff[f];
        uint64_t csz = x->coff[f + 1] - x->coff[f];
        if (rb == 0 || dsz % rb != 0)
            return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                             "%s: frame %" PRIu32 " at byte %" PRIu64 ": %" PRIu64
                             " bytes is not a whole number of %" PRIu64
                             "-byte samples",
                             name, f, x->coff[f], dsz, rb);
        if (dsz > x->max_dsize)
            x->max_dsize = (uint32_t)dsz;
        if (csz > x->max_csize)
            x->max_csize = (uint32_t)csz;
    }
    return 0;
}

/* Frames of several samples stream through a bounded window while the
 * context holds the zstd window the frame asks for: refuse, at open, a frame
 * that asks for more than NPYLOAD_ZST_MAX_WINDOW_LOG. A frame no larger
 * than that limit never needs more (zstd sizes the window to the content),
 * so only the headers of larger frames are read: one small read per
 * 2^NPYLOAD_ZST_MAX_WINDOW_LOG bytes of data at most. Decoding enforces the
 * limit again (ZSTD_d_windowLogMax) for whatever this does not read. */
static int check_windows(npyl_zst_read_fn rd, void *ctx, const npyl_zst_index *x,
                         const char *name, char *err, size_t errlen)
{
    const uint64_t limit = (uint64_t)1 << NPYLOAD_ZST_MAX_WINDOW_LOG;
    for (uint32_t f = 1; f < x->nframes; f++) {
        uint64_t dsz = x->doff[f + 1] - x->doff[f];
        if (dsz <= limit || dsz <= x->row_bytes)
            continue;
        unsigned char h[NPYL_ZST_FRAME_HEADER_MAX];
        uint64_t csz = x->coff[f + 1] - x->coff[f];
        size_t n = csz < sizeof h ? (size_t)csz : sizeof h;
        int rc = rd(ctx, h, n, x->coff[f]);
        if (rc)
            return read_err(rc, name, n, x->coff[f], err, errlen);
        uint64_t w;
        if (npyl_zst_frame_window(h, n, &w) != 0)
            return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                             "%s: frame %" PRIu32 " at byte %" PRIu64 ": not a zstd "
                             "frame header (damaged file, or the seek table is wrong)",
                             name, f, x->coff[f]);
        if (w > limit)
            return npyl_fail(err, errlen, NPYLOAD_ETOOBIG,
                             "%s: frame %" PRIu32 " at byte %" PRIu64 ": %" PRIu64
                             " bytes of several samples need a %" PRIu64 "-byte zstd "
                             "window, more than the %" PRIu64 " bytes allowed "
                             "(NPYLOAD_ZST_MAX_WINDOW_LOG %u); repack it with "
                             "npyload-pack at level 19 or below, or a smaller "
                             "--frame-size",
                             name, f, x->coff[f], dsz, w, limit, NPYLOAD_ZST_MAX_WINDOW_LOG);
    }
    return 0;
}

/* The footer and the seek table's skippable-frame header: sets x's
 * checksums, nframes and table_bytes (the table starts at file_size -
 * table_bytes). A file without the seekable footer gets no_table's
 * message. */
static int read_footer(npyl_zst_read_fn rd, void *ctx, npyl_zst_index *x,
                       const char *name, char *err, size_t errlen)
{
    uint64_t file_size = x->file_size;
    const uint64_t min = NPYL_ZST_SKIP_HEADER_BYTES + NPYL_ZST_FOOTER_BYTES;
    if (file_size < min)
        return no_table(rd, ctx, file_size, name, "file too short", err, errlen);
    unsigned char foot[NPYL_ZST_FOOTER_BYTES];
    uint64_t foot_at = file_size - NPYL_ZST_FOOTER_BYTES;
    int rc = rd(ctx, foot, sizeof foot, foot_at);
    if (rc)
        return read_err(rc, name, sizeof foot, foot_at, err, errlen);
    if (rd_le32(foot + 5) != NPYL_ZST_SEEKABLE_MAGIC)
        return no_table(rd, ctx, file_size, name,
                        "the file does not end with the seekable magic", err,
                        errlen);
    uint32_t n = rd_le32(foot);
    unsigned desc = foot[4];
    if (desc & NPYL_ZST_RESERVED_BITS)
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: seek table at byte %" PRIu64 ": descriptor 0x%02x "
                         "has reserved bits set (a newer format version?)",
                         name, foot_at, desc);
    x->checksums = (desc & NPYL_ZST_FLAG_CHECKSUM) != 0;
    if (n == 0)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: seek table at byte %" PRIu64 ": 0 frames (frame 0 "
                         "must hold the NPY header)",
                         name, foot_at);
    if (n > NPYL_ZST_MAX_FRAMES)
        return npyl_fail(err, errlen, NPYLOAD_ETOOBIG,
                         "%s: seek table at byte %" PRIu64 ": %" PRIu32
                         " frames, more than the format's %u",
                         name, foot_at, n, NPYL_ZST_MAX_FRAMES);
    uint64_t tbytes = npyl_zst_table_size(n, x->checksums);
    if (tbytes > file_size)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: seek table at byte %" PRIu64 ": %" PRIu32
                         " frames need a %" PRIu64 "-byte table, the file holds "
                         "%" PRIu64 " bytes",
                         name, foot_at, n, tbytes, file_size);
    uint64_t tab_at = file_size - tbytes;
    unsigned char skh[NPYL_ZST_SKIP_HEADER_BYTES];
    rc = rd(ctx, skh, sizeof skh, tab_at);
    if (rc)
        return read_err(rc, name, sizeof skh, tab_at, err, errlen);
    if (rd_le32(skh) != NPYL_ZST_SKIPPABLE_MAGIC)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: seek table at byte %" PRIu64 ": skippable-frame "
                         "magic 0x%08" PRIx32 " expected, found 0x%08" PRIx32
                         " (%" PRIu32 " frames in the footer: wrong count?)",
                         name, tab_at, NPYL_ZST_SKIPPABLE_MAGIC, rd_le32(skh), n);
    if (rd_le32(skh + 4) != tbytes - NPYL_ZST_SKIP_HEADER_BYTES)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: seek table at byte %" PRIu64 ": frame size %" PRIu32
                         ", %" PRIu64 " expected for %" PRIu32 " frames",
                         name, tab_at, rd_le32(skh + 4),
                         tbytes - NPYL_ZST_SKIP_HEADER_BYTES, n);
    x->table_bytes = tbytes;
    x->nframes = n;
    return 0;
}

/* One seek-table entry, frame i (x->coff[i] known): its sizes checked
 * against the data before the table (which ends at data_end) and the
 * format's limits, then the next offsets. */
static int take_entry(npyl_zst_index *x, uint32_t i, const unsigned char *e,
                      uint64_t data_end, const char *name, char *err, size_t errlen)
{
    uint32_t csz = rd_le32(e), dsz = rd_le32(e + 4);
    uint64_t coff = x->coff[i];
    if (x->checksums)
        x->csum[i] = rd_le32(e + 8);
    if (dsz == 0 || csz == 0)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame %" PRIu32 " at byte %" PRIu64
                         ": empty frame in the seek table (compressed %"
                         PRIu32 ", decompressed %" PRIu32 " bytes)",
                         name, i, coff, csz, dsz);
    if (csz > data_end - coff)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame %" PRIu32 " at byte %" PRIu64
                         ": %" PRIu32 " compressed bytes run past the "
                         "seek table at byte %" PRIu64,
                         name, i, coff, csz, data_end);
    if (dsz > NPYL_ZST_MAX_FRAME_BYTES ||
        (uint64_t)dsz > (uint64_t)csz * NPYL_ZST_MAX_EXPANSION)
        return npyl_fail(err, errlen, NPYLOAD_ETOOBIG,
                         "%s: frame %" PRIu32 " at byte %" PRIu64
                         ": claims %" PRIu32 " decompressed bytes from %"
                         PRIu32 " compressed (limits: %u bytes, %ux)",
                         name, i, coff, dsz, csz, NPYL_ZST_MAX_FRAME_BYTES,
                         NPYL_ZST_MAX_EXPANSION);
    /* Frame 0 of a narrowed file also holds the value table. */
    if (csz > ZSTD_compressBound(dsz) + (i == 0 ? NPYL_ZST_NARROW_FRAME_MAX : 0))
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame %" PRIu32 " at byte %" PRIu64
                         ": %" PRIu32 " compressed bytes for %" PRIu32
                         " decompressed, more than zstd ever needs (%zu)",
                         name, i, coff, csz, dsz, ZSTD_compressBound(dsz));
    x->coff[i + 1] = coff + csz;
    x->doff[i + 1] = x->doff[i] + dsz; /* < 2^27 * 2^30: no overflow */
    return 0;
}

/* The seek table's entries, read in chunks through a small buffer, into
 * x->coff / doff / csum (allocated here). */
static int read_entries(npyl_zst_read_fn rd, void *ctx, npyl_zst_index *x,
                        const char *name, char *err, size_t errlen)
{
    uint32_t n = x->nframes;
    uint64_t tab_at = x->file_size - x->table_bytes, data_end = tab_at;
    x->coff = malloc(sizeof(uint64_t) * ((size_t)n + 1));
    x->doff = malloc(sizeof(uint64_t) * ((size_t)n + 1));
    x->csum = x->checksums ? malloc(sizeof(uint32_t) * (size_t)n) : NULL;
    if (!x->coff || !x->doff || (x->checksums && !x->csum))
        return npyl_fail(err, errlen, -ENOMEM,
                         "%s: out of memory for %" PRIu32 " frames", name, n);
    x->coff[0] = x->doff[0] = 0;
    const unsigned esz = x->checksums ? 12u : 8u;
    unsigned char buf[12 * 512];
    const uint32_t per = (uint32_t)(sizeof buf / esz);
    uint64_t at = tab_at + NPYL_ZST_SKIP_HEADER_BYTES;
    for (uint32_t i = 0; i < n;) {
        uint32_t k = n - i < per ? n - i : per;
        int rc = rd(ctx, buf, (size_t)k * esz, at);
        if (rc)
            return read_err(rc, name, (size_t)k * esz, at, err, errlen);
        for (uint32_t j = 0; j < k; j++, i++)
            if ((rc = take_entry(x, i, buf + (size_t)j * esz, data_end, name, err, errlen)))
                return rc;
        at += (uint64_t)k * esz;
    }
    if (x->coff[n] != data_end)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: seek table at byte %" PRIu64 ": its %" PRIu32
                         " frames add up to %" PRIu64 " compressed bytes, the "
                         "file holds %" PRIu64 " before the table",
                         name, tab_at, n, x->coff[n], data_end);
    return 0;
}

int npyl_zst_index_read(npyl_zst_read_fn rd, void *ctx, uint64_t file_size,
                        const char *name, npyl_zst_index *out, char *err,
                        size_t errlen)
{
    if (!rd || !out)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: npyl_zst_index_read: NULL argument",
                         name ? name : "<memory>");
    if (!name)
        name = "<memory>";
    memset(out, 0, sizeof *out);
    npyl_zst_index *x = out;
    x->file_size = file_size;
    int rc = read_footer(rd, ctx, x, name, err, errlen);
    if (rc)
        return rc; /* nothing allocated yet */
    rc = read_entries(rd, ctx, x, name, err, errlen);
    if (!rc)
        rc = read_header_frame(rd, ctx, x, name, err, errlen);
    if (!rc) {
        x->hdr.file_bytes = x->doff[x->nframes];
        rc = check_npy(x, name, err, errlen);
    }
    if (!rc)
        rc = check_windows(rd, ctx, x, name, err, errlen);
    if (rc)
        npyl_zst_index_free(x);
    return rc;
}

int npyl_zst_index_open(int fd, const char *name, npyl_zst_index *out,
                        char *err, size_t errlen)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        return npyl_fail(err, errlen, -e, "%s: cannot stat: %s", name,
                         strerror(e));
    }
    if (!S_ISREG(st.st_mode))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "%s: not a regular file",
                         name);
    return npyl_zst_index_read(npyl_zst_read_fd, &fd, (uint64_t)st.st_size,
                               name, out, err, errlen);
}

/* Data frames are searched by decompressed offset: doff[1..nframes] is
 * strictly increasing (no empty frame), so the frame holding data byte b
 * (counted from the start of the .npy) is the last f with doff[f] <= b. */
void npyl_zst_locate(const npyl_zst_index *x, uint64_t row, uint32_t *frame,
                     uint64_t *offset)
{
    uint64_t b = x->doff[1] + row * x->row_bytes;
    uint32_t lo = 1, hi = x->nframes - 1; /* answer in [lo, hi] */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (x->doff[mid] <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    *frame = lo;
    *offset = b - x->doff[lo];
}

void npyl_zst_frame_rows(const npyl_zst_index *x, uint32_t f, uint64_t *first,
                         uint64_t *count)
{
    *first = (x->doff[f] - x->doff[1]) / x->row_bytes;
    *count = (x->doff[f + 1] - x->doff[f]) / x->row_bytes;
}
