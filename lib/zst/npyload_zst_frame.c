/* Decoding one frame of a .npy.zst: into a caller's buffer (the workers' hot
 * path: a reused ZSTD_DCtx, no allocation), or streamed through a bounded
 * window (frames of several samples, whatever their size), and the check of
 * every frame of a file (npyload-inspect --verify). Every path makes every
 * check that separates "these are the bytes the writer compressed" from
 * "something decoded". */
#include "npyload_zst.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <zstd.h>
#include <zstd_errors.h>

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

/* Frame_Header_Descriptor (RFC 8878 3.1.1.1.1) is the byte after the magic;
 * bit 2 is Content_Checksum_Flag. Read by hand: the stable libzstd API has
 * no accessor for it. */
#define NPYL_ZST_FHD_CHECKSUM 0x04u

ZSTD_DCtx *npyl_zst_dctx_create(void)
{
    return ZSTD_createDCtx();
}

void npyl_zst_dctx_free(ZSTD_DCtx *dctx)
{
    ZSTD_freeDCtx(dctx);
}

/* The checks before decoding: one whole zstd frame of exactly the table's
 * compressed size, its content size (when it states one) the table's, its
 * checksum (when it carries one) the table's. */
/* The zstd frame's own length: its extent in the seek table, except for
 * frame 0 of a narrowed file, whose extent also holds the value table. */
static size_t frame_len(const npyl_zst_index *x, uint32_t f)
{
    if (f == 0 && x->narrow)
        return (size_t)x->frame0_bytes;
    return (size_t)(x->coff[f + 1] - x->coff[f]);
}

static int check_frame(const npyl_zst_index *x, uint32_t f, const unsigned char *s,
                       const char *name, char *err, size_t errlen)
{
    size_t csz = frame_len(x, f);
    size_t dsz = (size_t)(x->doff[f + 1] - x->doff[f]);
    uint64_t at = x->coff[f];
    /* The table's checks guarantee csz >= 1; a frame needs more. */
    if (csz < 6 || le32(s) != NPYL_ZST_MAGIC)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame %" PRIu32 " at byte %" PRIu64 ": not a zstd "
                         "frame (damaged file, or the seek table is wrong)",
                         name, f, at);
    unsigned long long fcs = ZSTD_getFrameContentSize(s, csz);
    if (fcs == ZSTD_CONTENTSIZE_ERROR)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame %" PRIu32 " at byte %" PRIu64 ": damaged "
                         "frame header",
                         name, f, at);
    if (fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs != dsz)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame %" PRIu32 " at byte %" PRIu64 ": the frame "
                         "says %llu decompressed bytes, the seek table %zu",
                         name, f, at, fcs, dsz);
    size_t whole = ZSTD_findFrameCompressedSize(s, csz);
    if (ZSTD_isError(whole))
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame %" PRIu32 " at byte %" PRIu64 ": damaged "
                         "frame (%s)",
                         name, f, at, ZSTD_getErrorName(whole));
    if (whole != csz)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame %" PRIu32 " at byte %" PRIu64 ": the frame "
                         "is %zu bytes long, the seek table says %zu",
                         name, f, at, whole, csz);
    /* The seek table's checksum is the low 32 bits of XXH64(content), which
     * is exactly what a checksummed zstd frame stores in its last 4 bytes:
     * compare the two here, zstd checks the content against the frame's. A
     * frame without its own checksum leaves the table's unverified (no
     * XXH64 in the stable libzstd API); npyload-pack never writes one. */
    int frame_has_sum = (s[4] & NPYL_ZST_FHD_CHECKSUM) != 0;
    if (x->checksums && frame_has_sum && le32(s + csz - 4) != x->csum[f])
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame %" PRIu32 " at byte %" PRIu64 ": checksum "
                         "mismatch: seek table 0x%08" PRIx32 ", frame 0x%08" PRIx32,
                         name, f, at, x->csum[f], le32(s + csz - 4));
    return 0;
}

/* A zstd error while decoding frame f, in words. */
static int zstd_fail(uint32_t f, uint64_t at, size_t r, const char *name, char *err,
                     size_t errlen)
{
    return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                     "%s: frame %" PRIu32 " at byte %" PRIu64 ": %s%s", name, f, at,
                     ZSTD_getErrorName(r),
                     ZSTD_getErrorCode(r) == ZSTD_error_checksum_wrong
                         ? " (content checksum mismatch: damaged data)"
                         : "");
}

int npyl_zst_decode_frame(const npyl_zst_index *x, uint32_t f, ZSTD_DCtx *dctx,
                          const void *src, void *dst, size_t cap,
                          const char *name, char *err, size_t errlen)
{
    if (!name)
        name = "<memory>";
    if (!x || !dctx || !src || f >= x->nframes)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: npyl_zst_decode_frame: bad argument", name);
    const unsigned char *s = src;
    size_t csz = frame_len(x, f);
    size_t dsz = (size_t)(x->doff[f + 1] - x->doff[f]);
    uint64_t at = x->coff[f];
    if (cap < dsz || !dst)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: frame %" PRIu32 " at byte %" PRIu64 ": %zu-byte "
                         "buffer for %zu decompressed bytes",
                         name, f, at, cap, dsz);
    int rc = check_frame(x, f, s, name, err, errlen);
    if (rc)
        return rc;
    size_t r = ZSTD_decompressDCtx(dctx, dst, dsz, s, csz);
    if (ZSTD_isError(r))
        return zstd_fail(f, at, r, name, err, errlen);
    if (r != dsz)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame %" PRIu32 " at byte %" PRIu64 ": decompressed "
                         "to %zu bytes, the seek table says %zu",
                         name, f, at, r, dsz);
    return 0;
}

int npyl_zst_frame_window(const void *hdr, size_t n, uint64_t *window)
{
    const unsigned char *h = hdr;
    if (n < 6 || le32(h) != NPYL_ZST_MAGIC)
        return -1;
    unsigned fhd = h[4];
    if (fhd & 0x20u) { /* Single_Segment_flag: the window is the content */
        unsigned long long fcs = ZSTD_getFrameContentSize(h, n);
        if (fcs == ZSTD_CONTENTSIZE_ERROR || fcs == ZSTD_CONTENTSIZE_UNKNOWN)
            return -1;
        *window = fcs;
        return 0;
    }
    unsigned wd = h[5]; /* Window_Descriptor */
    uint64_t base = (uint64_t)1 << (10 + (wd >> 3));
    *window = base + (base / 8) * (wd & 7u);
    return 0;
}

/* The limit on a frame's window, in the caller's terms. */
static int window_fail(const npyl_zst_index *x, uint32_t f, const unsigned char *s,
                       unsigned window_log_max, const char *name, char *err, size_t errlen)
{
    uint64_t w = 0;
    size_t csz = frame_len(x, f);
    if (npyl_zst_frame_window(s, csz, &w) != 0)
        w = 0;
    return npyl_fail(err, errlen, NPYLOAD_ETOOBIG,
                     "%s: frame %" PRIu32 " at byte %" PRIu64 ": needs a %" PRIu64
                     "-byte zstd window, more than the %llu bytes allowed for a frame of "
                     "several samples (NPYLOAD_ZST_MAX_WINDOW_LOG %u); repack it with "
                     "npyload-pack at level 19 or below, or a smaller --frame-size",
                     name, f, x->coff[f], w, 1ull << window_log_max, window_log_max);
}

int npyl_zst_stream_frame(const npyl_zst_index *x, uint32_t f, ZSTD_DCtx *dctx,
                          const void *src, unsigned char *win, size_t wcap,
                          unsigned window_log_max, npyl_zst_sink sink, void *arg,
                          const char *name, char *err, size_t errlen)
{
    if (!name)
        name = "<memory>";
    if (!x || !dctx || !src || !win || wcap == 0 || f >= x->nframes)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: npyl_zst_stream_frame: bad argument", name);
    const unsigned char *s = src;
    size_t csz = frame_len(x, f);
    uint64_t dsz = x->doff[f + 1] - x->doff[f];
    uint64_t at = x->coff[f];
    int rc = check_frame(x, f, s, name, err, errlen);
    if (rc)
        return rc;
    /* A new frame from a known state, whatever the last use of the context
     * was (a one-shot decode, a stream that failed half way); the window
     * limit can only be set in that state. */
    size_t r = ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);
    if (!ZSTD_isError(r))
        r = ZSTD_DCtx_setParameter(dctx, ZSTD_d_windowLogMax, (int)window_log_max);
    if (ZSTD_isError(r))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: frame %" PRIu32 ": zstd window limit 2^%u: %s", name, f,
                         window_log_max, ZSTD_getErrorName(r));
    ZSTD_inBuffer in = {s, csz, 0};
    uint64_t pos = 0;
    for (;;) {
        ZSTD_outBuffer out = {win, wcap, 0};
        size_t in0 = in.pos;
        r = ZSTD_decompressStream(dctx, &out, &in);
        if (ZSTD_isError(r)) {
            if (ZSTD_getErrorCode(r) == ZSTD_error_frameParameter_windowTooLarge)
                return window_fail(x, f, s, window_log_max, name, err, errlen);
            return zstd_fail(f, at, r, name, err, errlen);
        }
        if (out.pos > dsz - pos)
            return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                             "%s: frame %" PRIu32 " at byte %" PRIu64 ": decompresses "
                             "to more than the seek table's %" PRIu64 " bytes",
                             name, f, at, dsz);
        if (out.pos && sink)
            sink(arg, pos, win, out.pos);
        pos += out.pos;
        if (r == 0)
            break; /* the frame's end: zstd checked its checksum */
        if (out.pos == 0 && in.pos == in0)
            return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                             "%s: frame %" PRIu32 " at byte %" PRIu64 ": the frame "
                             "ends early (%" PRIu64 " of %" PRIu64 " bytes decoded)",
                             name, f, at, pos, dsz);
    }
    if (pos != dsz || in.pos != csz)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame %" PRIu32 " at byte %" PRIu64 ": decompressed "
                         "to %" PRIu64 " bytes from %zu, the seek table says %" PRIu64
                         " from %zu",
                         name, f, at, pos, in.pos, dsz, csz);
    return 0;
}

int npyl_zst_verify(npyl_zst_read_fn rd, void *ctx, const npyl_zst_index *x,
                    const char *name, uint32_t *bad, char *err, size_t errlen)
{
    *bad = UINT32_MAX;
    if (!name)
        name = "<memory>";
    uint64_t cmax = 0;
    for (uint32_t f = 0; f < x->nframes; f++)
        if (x->coff[f + 1] - x->coff[f] > cmax)
            cmax = x->coff[f + 1] - x->coff[f];
    unsigned char *src = malloc((size_t)cmax);
    unsigned char *win = malloc(NPYL_ZST_WINDOW_BYTES);
    ZSTD_DCtx *dctx = ZSTD_createDCtx();
    int rc = 0;
    if (!src || !win || !dctx) {
        rc = npyl_fail(err, errlen, -ENOMEM, "%s: out of memory for a %" PRIu64
                       "-byte frame", name, cmax);
        goto out;
    }
    /* One-sample frames (and the header frame) are decoded by the loader
     * straight into their destination, where no window limit applies. */
    const unsigned any = (unsigned)ZSTD_dParam_getBounds(ZSTD_d_windowLogMax).upperBound;
    for (uint32_t f = 0; f < x->nframes; f++) {
        uint64_t csz = x->coff[f + 1] - x->coff[f];
        rc = rd(ctx, src, (size_t)csz, x->coff[f]);
        if (rc) {
            rc = npyl_fail(err, errlen, rc, "%s: frame %" PRIu32 " at byte %" PRIu64
                           ": reading %" PRIu64 " bytes failed: %s", name, f, x->coff[f],
                           csz, rc == -EIO ? "short read (file changed?)" : strerror(-rc));
        } else {
            int several = f > 0 && x->doff[f + 1] - x->doff[f] > x->row_bytes;
            rc = npyl_zst_stream_frame(x, f, dctx, src, win, NPYL_ZST_WINDOW_BYTES,
                                       several ? NPYLOAD_ZST_MAX_WINDOW_LOG : any, NULL,
                                       NULL, name, err, errlen);
        }
        if (rc) {
            *bad = f;
            break;
        }
    }
out:
    ZSTD_freeDCtx(dctx);
    free(win);
    free(src);
    return rc;
}
