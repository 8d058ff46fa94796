/* Decoding one frame of a .npy.zst into a caller's buffer: the workers' hot
 * path. A reused ZSTD_DCtx, no allocation, and every check that separates
 * "these are the bytes the writer compressed" from "something decoded". */
#include "npyload_zst.h"

#include <inttypes.h>
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
    size_t csz = (size_t)(x->coff[f + 1] - x->coff[f]);
    size_t dsz = (size_t)(x->doff[f + 1] - x->doff[f]);
    uint64_t at = x->coff[f];
    if (cap < dsz || !dst)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: frame %" PRIu32 " at byte %" PRIu64 ": %zu-byte "
                         "buffer for %zu decompressed bytes",
                         name, f, at, cap, dsz);
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
    size_t r = ZSTD_decompressDCtx(dctx, dst, dsz, s, csz);
    if (ZSTD_isError(r))
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame %" PRIu32 " at byte %" PRIu64 ": %s%s",
                         name, f, at, ZSTD_getErrorName(r),
                         ZSTD_getErrorCode(r) == ZSTD_error_checksum_wrong
                             ? " (content checksum mismatch: damaged data)"
                             : "");
    if (r != dsz)
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: frame %" PRIu32 " at byte %" PRIu64 ": decompressed "
                         "to %zu bytes, the seek table says %zu",
                         name, f, at, r, dsz);
    return 0;
}
