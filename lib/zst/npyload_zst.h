/* Compressed NPY shards (`FILE.npy.zst`): zstd's seekable format.
 *
 * Layout (facebook/zstd contrib/seekable_format, version 0.1.0):
 *
 *   [frame 0: the NPY header bytes, magic through padding (data_offset)]
 *   [frame 1 .. n-1: whole samples each, in file order]
 *   [skippable frame 0x184D2A5E, Frame_Size (u32 LE) =
 *       n entries { Compressed_Size u32, Decompressed_Size u32,
 *                   [Checksum u32 = low 32 bits of XXH64(frame content)] }
 *       footer { Number_Of_Frames u32, Descriptor u8 (bit 7 checksums,
 *                bits 6-2 reserved = 0), Seekable magic 0x8F92EAB1 u32 }]
 *
 * All integers little-endian. `zstd -d` skips the skippable frame and
 * concatenates the frames, giving back the .npy byte for byte.
 *
 *   npyload_zst_table.c  the seek table: write, parse from the file tail
 *                        through a read callback (a file or memory), every
 *                        NPY-specific check, sample -> frame lookup.
 *   npyload_zst_frame.c  decode one frame exactly into a caller buffer with a
 *                        reused ZSTD_DCtx (the workers' hot path), or through
 *                        a bounded window (frames of several samples), and
 *                        verify every frame of a file.
 *   npyload_zst_file.c   the public npyload_zst_* file API (npyload.h):
 *                        probe, facts, frame access, verify.
 *   npyload_zst_pack.c   npyload_pack_file (public): .npy -> .npy.zst.
 *
 * Depends on lib/common, the public NPY header parser, and libzstd. */
#ifndef NPYLOAD_ZST_H
#define NPYLOAD_ZST_H

#include <stddef.h>
#include <stdint.h>

#include "../common/npyload_common.h"

typedef struct ZSTD_DCtx_s ZSTD_DCtx;

#define NPYL_ZST_MAGIC 0xFD2FB528u          /* a zstd frame */
#define NPYL_ZST_SKIPPABLE_MAGIC 0x184D2A5Eu /* the seek table's frame */
#define NPYL_ZST_SEEKABLE_MAGIC 0x8F92EAB1u  /* last 4 bytes of the file */
#define NPYL_ZST_FOOTER_BYTES 9u             /* frames u32, descriptor, magic */
#define NPYL_ZST_SKIP_HEADER_BYTES 8u        /* skippable magic + frame size */
#define NPYL_ZST_FLAG_CHECKSUM 0x80u
#define NPYL_ZST_RESERVED_BITS 0x7Cu
#define NPYL_ZST_FRAME_HEADER_MAX 18u        /* RFC 8878: magic + 14 bytes */

/* Limits. No frame of a valid file decompresses to more than
 * NPYL_ZST_MAX_FRAME_BYTES (the contrib writer's own limit), nor to more than
 * NPYL_ZST_MAX_EXPANSION times its compressed size: the densest zstd block
 * is an RLE block, 4 bytes for ZSTD_BLOCKSIZE_MAX (128 KiB) of output, and
 * every frame has at least one block. Both checks run before anything is
 * sized from a table entry. */
#define NPYL_ZST_MAX_FRAMES 0x8000000u       /* as the contrib reader */
#define NPYL_ZST_MAX_FRAME_BYTES (1u << 30)
#define NPYL_ZST_MAX_EXPANSION ((1u << 17) / 4u)

/* Decoding memory. A frame of several samples is decoded through a window
 * of at most NPYL_ZST_WINDOW_BYTES (frames up to that size decode into it
 * in one call, larger ones stream through it), with the zstd window the
 * frame needs held in the context: at most 2^NPYLOAD_ZST_MAX_WINDOW_LOG
 * (npyload.h), checked at open for every frame of several samples that
 * could need more (npyl_zst_index_read) and enforced by zstd while
 * decoding. So a decoder's memory is bounded by constants, whatever the
 * frame's decompressed size (up to NPYL_ZST_MAX_FRAME_BYTES). */
#define NPYL_ZST_WINDOW_BYTES (1u << 20)

/* Reads exactly `n` bytes at `off` into `buf`. Returns 0, or a negative
 * -errno (a short read is -EIO: the caller checked the size first). */
typedef int (*npyl_zst_read_fn)(void *ctx, void *buf, size_t n, uint64_t off);

/* Ready-made readers: `ctx` is a pointer to an int fd, or to a
 * npyl_zst_mem. */
typedef struct npyl_zst_mem {
    const unsigned char *data;
    size_t len;
} npyl_zst_mem;
NPYL_HIDDEN int npyl_zst_read_fd(void *ctx, void *buf, size_t n, uint64_t off);
NPYL_HIDDEN int npyl_zst_read_mem(void *ctx, void *buf, size_t n, uint64_t off);

/* A validated .npy.zst: the NPY header (as from the .npy, with file_bytes
 * the decompressed size) and the frame index. Frame f occupies compressed
 * bytes [coff[f], coff[f+1]) of the file and decompressed bytes
 * [doff[f], doff[f+1]) of the .npy; doff[1] == hdr.data_offset. */
/* Narrowed files (npyload_zst_narrow.c): at most this many distinct values,
 * stored as one-byte codes; the value table in a skippable frame with this
 * magic right after the header's zstd frame, inside frame 0's extent. */
#define NPYL_ZST_NARROW_MAX 256u
#define NPYL_ZST_NARROW_MAGIC 0x184D2A50u
#define NPYL_ZST_NARROW_FRAME_MAX 4096u /* the table's skippable frame, at most */

typedef struct npyl_zst_narrow {
    char descr[16];       /* the values' dtype as the original file had it */
    uint32_t count;       /* 1 .. 256 */
    uint32_t itemsize;    /* 2, 4 or 8 */
    unsigned char values[NPYL_ZST_NARROW_MAX * 8]; /* code k at k x itemsize */
} npyl_zst_narrow;

/* The distinct values of a file, found by the packer (sorted bit patterns;
 * over: more than NPYL_ZST_NARROW_MAX). */
typedef struct npyl_zst_narrow_scan {
    unsigned itemsize;
    uint32_t count;
    int over;
    uint64_t set[NPYL_ZST_NARROW_MAX];
} npyl_zst_narrow_scan;

NPYL_HIDDEN void npyl_zst_narrow_begin(npyl_zst_narrow_scan *s, unsigned itemsize);
/* Adds n bytes of values; -1 (and s->over) once there are too many. */
NPYL_HIDDEN int npyl_zst_narrow_add(npyl_zst_narrow_scan *s, const void *data, size_t n);
/* The codes of n bytes of values, every one of which was added. */
NPYL_HIDDEN void npyl_zst_narrow_codes(const npyl_zst_narrow_scan *s, const void *data,
                                       size_t n, unsigned char *codes);
/* The skippable frame holding s's table (malloc'd into *out). */
NPYL_HIDDEN int npyl_zst_narrow_encode(const npyl_zst_narrow_scan *s, const char *descr,
                                       unsigned char **out, size_t *out_len);
/* Parses such a frame (n bytes at p); *out malloc'd. */
NPYL_HIDDEN int npyl_zst_narrow_parse(const unsigned char *p, size_t n, const char *name,
                                      npyl_zst_narrow **out, char *err, size_t errlen);
/* The stored form (--narrow --store): a plain .npy of the codes, then the
 * table's skippable frame, its length (u32 LE) and this tag. */
#define NPYL_ZST_STORE_TAG "NPYLSTOR"
#define NPYL_ZST_STORE_TAIL_BYTES 12u /* the length and the tag */
/* The trailer (frame, length, tag) of s's table, malloc'd into *out. */
NPYL_HIDDEN int npyl_zst_store_trailer(const npyl_zst_narrow_scan *s, const char *descr,
                                       unsigned char **out, size_t *out_len);
/* A '|u1' .npy whose data ends at data_end in a file of file_bytes (read
 * through rd): when
 * it ends with the stored form's trailer, *out gets its table (malloc'd);
 * else 0 and *out NULL. NPYLOAD_EFORMAT for a damaged trailer or table. */
NPYL_HIDDEN int npyl_zst_store_probe(npyl_zst_read_fn rd, void *ctx, const char *name,
                                     uint64_t file_bytes, uint64_t data_end,
                                     npyl_zst_narrow **out, char *err, size_t errlen);
/* npyload_narrow_stored over rd: for the .npy with header h (any header:
 * only a '|u1' one with bytes after its data is probed). */
NPYL_HIDDEN int npyl_zst_store_facts(npyl_zst_read_fn rd, void *ctx, const char *name,
                                     const npyload_header *h, uint32_t *values,
                                     uint32_t *value_itemsize, char *value_descr, char *err,
                                     size_t errlen);
/* dst[i] = the value of codes[i], for n codes; dst may hold the codes in
 * its last n bytes (expanded in place). -1 when a code is not in the
 * table (the values written for it are unspecified). */
NPYL_HIDDEN int npyl_zst_narrow_expand(const npyl_zst_narrow *x, const unsigned char *codes,
                                       size_t n, void *dst);
/* -1 when one of the n codes is not in the table, else 0 (codes that are
 * expanded elsewhere: the device's kernels). */
NPYL_HIDDEN int npyl_zst_narrow_check(const npyl_zst_narrow *x, const unsigned char *codes,
                                      size_t n);

typedef struct npyl_zst_index {
    npyload_header hdr;
    uint64_t file_size;   /* compressed file size, seek table in */
    uint64_t table_bytes; /* the seek table's skippable frame, header in */
    uint32_t nframes;     /* frame 0 (the header) included */
    int checksums;        /* 1: csum[] holds the table's checksums */
    uint64_t *coff;       /* nframes + 1 entries */
    uint64_t *doff;       /* nframes + 1 entries */
    uint32_t *csum;       /* nframes entries, or NULL */
    uint64_t rows;        /* samples: shape[0] (1 for a 0-d array) */
    uint64_t row_bytes;   /* bytes per sample */
    uint32_t max_dsize;   /* largest data frame, decompressed (scratch) */
    uint32_t max_csize;   /* largest data frame, compressed (read buffer) */
    uint64_t frame0_bytes; /* the header's zstd frame: coff[1], or less when
                              the value table follows it (narrowed) */
    npyl_zst_narrow *narrow; /* narrowed: hdr is the codes' ('|u1'); NULL
                                otherwise */
} npyl_zst_index;

/* 1 if the 4 bytes at `p` are a zstd frame magic (how a .npy.zst is told
 * from a .npy whatever its name). */
NPYL_HIDDEN int npyl_zst_is_zstd(const void *p);

/* npyl_zst_index_read() :
 * Parses and validates the seek table at the tail of a file of `file_size`
 * bytes read through `rd`, decompresses frame 0 and parses the NPY header in
 * it with npyload_parse_header, then checks the NPY facts against the table:
 * frame 0 is exactly data_offset bytes, every later frame holds a whole
 * number of samples (no empty frame), and they add up to the data. Reads
 * are bounded: the footer, the table (whose size is checked against the file
 * first) and frame 0. Memory is O(frames), frames that exist in the file.
 * `name` names the file in messages: "NAME: frame 7 at byte 123: ...".
 * @return : 0 and *out filled (npyl_zst_index_free it), or NPYLOAD_EFORMAT /
 *           EUNSUPPORTED / ETRUNCATED / ETOOBIG / -errno with `err` set.
 *           A zstd file without a seek table says how to repack it. */
NPYL_HIDDEN int npyl_zst_index_read(npyl_zst_read_fn rd, void *ctx,
                                    uint64_t file_size, const char *name,
                                    npyl_zst_index *out, char *err,
                                    size_t errlen);

/* npyl_zst_index_open() : the same for an open file (pread on `fd`). */
NPYL_HIDDEN int npyl_zst_index_open(int fd, const char *name,
                                    npyl_zst_index *out, char *err,
                                    size_t errlen);

/* npyl_zst_file_over() :
 * An npyload_zst_file (the public file API) over an index read through a
 * reader rather than from a local file (a remote object): `x` is moved
 * into it (left empty), and npyload_zst_file_verify reads the frames
 * through rd(ctx, ...) (which checks that the object did not change).
 * ctx is freed with free_ctx (may be NULL) when the file is closed, or
 * here on failure. Returns 0 or -ENOMEM. */
NPYL_HIDDEN int npyl_zst_file_over(npyl_zst_index *x, const char *name, npyl_zst_read_fn rd,
                                   void *ctx, void (*free_ctx)(void *),
                                   npyload_zst_file **out);

/* Frees the arrays of an index (not the struct); NULL-safe, idempotent. */
NPYL_HIDDEN void npyl_zst_index_free(npyl_zst_index *x);

/* npyl_zst_locate() :
 * The frame holding sample `row` (< rows) and the byte offset of the
 * sample inside that frame's decompressed bytes. O(log frames). */
NPYL_HIDDEN void npyl_zst_locate(const npyl_zst_index *x, uint64_t row,
                                 uint32_t *frame, uint64_t *offset);

/* First sample of data frame `f` (1 <= f < nframes) and its sample count. */
NPYL_HIDDEN void npyl_zst_frame_rows(const npyl_zst_index *x, uint32_t f,
                                     uint64_t *first, uint64_t *count);

/* npyl_zst_decode_frame() :
 * Decompresses frame `f` of `x` from `src` (its coff[f+1] - coff[f]
 * compressed bytes) into `dst` (capacity >= its decompressed size) with the
 * caller's reused `dctx`. Checks: one whole zstd frame of exactly the
 * table's compressed size, decompressing to exactly the table's size; the
 * frame's content checksum (zstd verifies it when the frame carries one);
 * and the seek table's checksum against the frame's. Allocates nothing.
 * @return : 0, or NPYLOAD_EFORMAT with "NAME: frame F at byte B: problem". */
NPYL_HIDDEN int npyl_zst_decode_frame(const npyl_zst_index *x, uint32_t f,
                                      ZSTD_DCtx *dctx, const void *src,
                                      void *dst, size_t cap, const char *name,
                                      char *err, size_t errlen);

/* npyl_zst_sink: receives the decompressed bytes [pos, pos + n) of a frame
 * streamed by npyl_zst_stream_frame, in order, each byte once. */
typedef void (*npyl_zst_sink)(void *arg, uint64_t pos, const unsigned char *p,
                              size_t n);

/* npyl_zst_stream_frame() :
 * Decompresses frame `f` of `x` from `src` (its whole compressed bytes)
 * through the caller's window `win` of `wcap` bytes (>= 1), handing every
 * decompressed chunk to `sink` (may be NULL: verify only). The frame is
 * always decoded to its end, so zstd verifies its content checksum before
 * this returns 0: a caller that keeps some of the bytes delivers them only
 * after a 0. `window_log_max` bounds the zstd window the frame may ask for
 * (the context's own buffers: about 2^window_log_max + 3 x 128 KiB); a
 * frame that fits `win` decodes in one call without them. The same checks
 * as npyl_zst_decode_frame (sizes, table and frame checksums).
 * @return : 0, or NPYLOAD_EFORMAT / ETOOBIG with "NAME: frame F at byte B:
 *           problem" (a window over the limit is ETOOBIG and says so). */
NPYL_HIDDEN int npyl_zst_stream_frame(const npyl_zst_index *x, uint32_t f,
                                      ZSTD_DCtx *dctx, const void *src,
                                      unsigned char *win, size_t wcap,
                                      unsigned window_log_max,
                                      npyl_zst_sink sink, void *arg,
                                      const char *name, char *err,
                                      size_t errlen);

/* npyl_zst_frame_window() :
 * The window size a zstd frame asks for, from its first `n` bytes (RFC 8878
 * 3.1.1.1: the Window_Descriptor, or the content size of a single-segment
 * frame). @return : 0 and *window, or -1 when the header is incomplete or
 * not a zstd frame header. */
NPYL_HIDDEN int npyl_zst_frame_window(const void *hdr, size_t n,
                                      uint64_t *window);

/* npyl_zst_verify() :
 * Reads (through `rd`) and decodes every frame of the validated index `x`,
 * frame 0 included, with every check the loader makes (sizes, table and
 * frame checksums, windows: a frame of several samples within
 * 2^NPYLOAD_ZST_MAX_WINDOW_LOG as the loader streams it; a frame of one
 * sample with any window, as the loader decodes it into the batch). Stops
 * at the first bad frame. Memory: the largest compressed frame, one
 * NPYL_ZST_WINDOW_BYTES window and a zstd context.
 * @return : 0 (*bad = UINT32_MAX), or the error with *bad the frame index
 *           and `err` "NAME: frame F at byte B: problem"; -ENOMEM with
 *           *bad = UINT32_MAX. */
NPYL_HIDDEN int npyl_zst_verify(npyl_zst_read_fn rd, void *ctx,
                                const npyl_zst_index *x, const char *name,
                                uint32_t *bad, char *err, size_t errlen);

/* A decompression context for npyl_zst_decode_frame, so that users of this
 * module need not include zstd.h. Returns NULL when out of memory; the free
 * is NULL-safe. One per thread: a context is not thread-safe. */
NPYL_HIDDEN ZSTD_DCtx *npyl_zst_dctx_create(void);
NPYL_HIDDEN void npyl_zst_dctx_free(ZSTD_DCtx *dctx);

/* ---- writing ---- */

/* Bytes of the seek table's skippable frame for `n` frames. */
NPYL_HIDDEN size_t npyl_zst_table_size(uint32_t n, int checksums);

/* Encodes the seek table for `n` frames into `dst` (npyl_zst_table_size
 * bytes). `csum` may be NULL when `checksums` is 0. Returns the size. */
NPYL_HIDDEN size_t npyl_zst_table_encode(void *dst, uint32_t n,
                                         const uint32_t *csize,
                                         const uint32_t *dsize,
                                         const uint32_t *csum, int checksums);

#endif
