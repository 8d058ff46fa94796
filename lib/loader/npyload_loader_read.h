/* lib/loader's batch reader: a batch's rows (sample indices) become io
 * requests and .npy.zst frame groups, which are read and decoded into the
 * caller's buffers; with ON_ERROR skip, failed rows are dropped. It sees
 * the loader only through npyl_read_view (read-only: the fields, the io
 * file table, the options it needs, where to count), and each worker's
 * scratch through npyl_read_ctx. Nothing here locks anything but the skip
 * log's own mutex, and nothing here calls up into the loader. */
#ifndef NPYLOAD_LOADER_READ_H
#define NPYLOAD_LOADER_READ_H

#include <pthread.h>

#include "../store/npyload_store.h"
#include "npyload_loader_types.h"

/* The last failure behind a skipped sample (npyload_loader_last_skip_error),
 * with its own lock: workers write it while reading, any thread reads it. */
typedef struct npyl_skip_log {
    pthread_mutex_t mu;
    char msg[NPYL_ERRMSG_LEN];
} npyl_skip_log;

NPYL_HIDDEN void npyl_skip_log_init(npyl_skip_log *g);
NPYL_HIDDEN void npyl_skip_log_fini(npyl_skip_log *g);
NPYL_HIDDEN void npyl_skip_log_get(npyl_skip_log *g, char *buf, size_t len);

/* What the reader needs of the loader, filled once at start. */
typedef struct npyl_read_view {
    const npyl_field *fields;
    size_t nfields;
    const npyl_stores *stores; /* the file table, read through the stores */
    int direct_io;        /* DIRECT_IO: frames placed for O_DIRECT */
    int skip_errors;      /* ON_ERROR == skip */
    int64_t max_errors;   /* MAX_ERRORS (0: no limit) */
    npyl_stats *st;       /* counters it adds to */
    npyl_skip_log *skip;
} npyl_read_view;

/* The buffers of one batch's reads: its requests, its rows of .npy.zst
 * files grouped by frame, and the compressed frames (placed for O_DIRECT).
 * A worker has two, so that the next batch's reads fill one while the
 * current batch decodes out of the other. The plan of the batch they hold
 * (nraw .. cb) travels with them from npyl_read_begin to npyl_read_end. */
typedef struct npyl_read_buf {
    npyl_req *reqs;       /* rows x nfields capacity */
    const struct npyl_ffile **rff; /* per raw request: its file when that is
                                      a stored narrowed .npy (codes to
                                      expand), else NULL */
    struct npyl_zrow *zrows; /* rows x nfields: rows grouped by frame */
    uint8_t *zsrc;        /* compressed frames, NPYL_DIRECT_ALIGN-aligned */
    size_t zsrc_cap;
    size_t nraw, nz;      /* raw requests; .npy.zst rows */
    size_t nreq, u0, u;   /* this round: requests; its frames' rows [u0, u) */
    uint64_t cb;          /* this round: compressed bytes */
    int rc;               /* read-ahead: the first round's result (its */
    size_t bad;           /* failed request, the bytes that landed), */
    uint64_t got;         /* kept by npyl_read_wait for npyl_read_end */
} npyl_read_buf;

struct npyl_ahead;        /* the read-ahead thread (npyload_loader_read.c) */

/* One worker's reading state: its stores' contexts (descriptors, ring, an
 * HTTP multi handle), its two
 * batch buffers, the .npy.zst decoder and window, the read-ahead thread
 * with its own io context when read-ahead is on, and the message of its
 * last failure. */
typedef struct npyl_read_ctx {
    npyl_sctx io;         /* this thread's contexts of the stores */
    int opened;           /* io opened (a failure before is the stores') */
    npyl_read_buf buf[2];
    unsigned cur;         /* the buffer npyl_read_batch / _end use */
    ZSTD_DCtx *dctx;      /* reused for every frame */
    uint8_t *zdst;        /* the decode window of a frame of several samples
                             (at most 1 MiB; npyload_zst_frame.c) */
    size_t zdst_cap;
    struct npyl_ahead *ahead; /* NULL: no read-ahead */
    int read_here;        /* the batch begun was read by npyl_read_begin */
    char errmsg[NPYL_ERRMSG_LEN];
} npyl_read_ctx;

/* Sizes of the .npy.zst scratch: the largest frame of any file, compressed,
 * and of frames of several samples, decompressed (0, 0: no .npy.zst). */
typedef struct npyl_zst_sizes {
    int any;
    uint32_t max_csize, max_multi_dsize;
} npyl_zst_sizes;

/* Creates c's contexts of the stores from cfg and its buffers for batches
 * of up to `rows` rows; ahead: also the read-ahead thread, with contexts
 * of its own (same cfg) and the second set of buffers. Returns 0, or the
 * error with the message in err (the store's own message when opening a
 * context failed: c->opened is 0 then, and the caller prefixes it with the
 * worker). c is left for npyl_read_ctx_fini in every case. */
NPYL_HIDDEN int npyl_read_ctx_init(npyl_read_ctx *c, const npyl_read_view *v,
                                   const npyl_store_cfg *cfg, size_t rows,
                                   const npyl_zst_sizes *zs, int ahead, char *err,
                                   size_t errlen);
/* Waits for a read-ahead in flight, stops the thread, frees what init made;
 * idempotent. */
NPYL_HIDDEN void npyl_read_ctx_fini(npyl_read_ctx *c);
/* Adds c's counters (both threads' contexts) to *k, the read-ahead
 * thread's CPU and off-CPU time to *cpu_ns and *blocked_ns, and 1 to
 * *fallbacks when one of its contexts fell back from io_uring to pread.
 * Any thread. */
NPYL_HIDDEN void npyl_read_ctx_counters(const npyl_read_ctx *c, npyl_store_counters *k,
                                        uint64_t *cpu_ns, uint64_t *blocked_ns,
                                        uint64_t *fallbacks);

/* Reads rows indices[0 .. *rows) of every field fi to dst[fi] + row *
 * row_bytes, through c. With ON_ERROR skip, failed rows are dropped (*rows
 * and indices shrink, the good rows packed to the front). Returns 0 or the
 * error, with the message in c->errmsg; *bytes accumulates what landed.
 * No lock held. */
NPYL_HIDDEN int npyl_read_batch(const npyl_read_view *v, npyl_read_ctx *c, int64_t *indices,
                                size_t *rows, uint8_t *const *dst, uint64_t *bytes);

/* Read-ahead (c->ahead set), in three steps per batch. npyl_read_begin
 * plans the batch's reads into c's other buffer and hands their first
 * round (every raw row and the frames that fit) to the read-ahead thread,
 * returning at once. npyl_read_wait blocks until that round's reads are
 * done and makes that buffer c's current one (the caller then begins its
 * next batch, into the buffer just freed, before it finishes this one).
 * npyl_read_end finishes the batch as npyl_read_batch does (decode,
 * further rounds through c's own context, ON_ERROR skip), with the
 * arguments given to begin (indices and dst untouched meanwhile). One
 * batch begun at a time: wait for it before the next begin. here: the
 * first round is read by begin itself, on the calling thread, through c's
 * own context (a batch with nothing to overlap: the worker would only wait
 * for the hand-off). */
NPYL_HIDDEN void npyl_read_begin(const npyl_read_view *v, npyl_read_ctx *c,
                                 const int64_t *indices, size_t rows, uint8_t *const *dst,
                                 int here);
NPYL_HIDDEN void npyl_read_wait(npyl_read_ctx *c);
NPYL_HIDDEN int npyl_read_end(const npyl_read_view *v, npyl_read_ctx *c, int64_t *indices,
                              size_t *rows, uint8_t *const *dst, uint64_t *bytes);

#endif
