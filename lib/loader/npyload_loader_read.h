/* lib/loader's batch reader as the worker sees it: a batch's rows (sample
 * indices) become requests and .npy.zst frame groups, which are read
 * through the stores and decoded into the caller's buffers; with ON_ERROR
 * skip, failed rows are dropped. It sees the loader only through
 * npyl_read_view (read-only: the fields, the stores' file table, the
 * options it needs, where to count), and each worker's scratch through
 * npyl_read_ctx (both in npyload_loader_types.h). Nothing here locks
 * anything but the skip log's own mutex and the read-ahead thread's, and
 * nothing here calls up into the loader. Its parts, calls going down:
 * read (this header: the worker's API, read-ahead, a reading state's
 * life) -> read_skip (ON_ERROR skip, the skip log) -> read_round (a
 * batch's rounds read and decoded) -> read_plan (requests and frame
 * groups planned). */
#ifndef NPYLOAD_LOADER_READ_H
#define NPYLOAD_LOADER_READ_H

#include "npyload_loader_read_skip.h"
#include "npyload_loader_types.h"

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

/* The read-ahead thread's off-CPU time in its rounds (0 without one).
 * Any thread: an atomic load. */
NPYL_HIDDEN uint64_t npyl_read_ctx_ahead_blocked(const npyl_read_ctx *c);

/* Reads rows indices[0 .. *rows) of every field fi to dst[fi] + row *
 * row_bytes, through c. With ON_ERROR skip, failed rows are dropped (*rows
 * and indices shrink, the good rows packed to the front; c->kept[r] is
 * then the position the row now at r had in indices as given, for the
 * caller's own per-row data). Returns 0 or the
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
