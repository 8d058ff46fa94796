/* lib/loader's batch reader, ON_ERROR skip and the skip log
 * (npyload_loader_read_skip.c). */
#ifndef NPYLOAD_LOADER_READ_SKIP_H
#define NPYLOAD_LOADER_READ_SKIP_H

#include "npyload_loader_read_plan.h"
#include "npyload_loader_read_round.h"
#include "npyload_loader_types.h"

NPYL_HIDDEN void npyl_skip_log_init(npyl_skip_log *g);
NPYL_HIDDEN void npyl_skip_log_fini(npyl_skip_log *g);
/* The log's text, URLs' passwords masked. Any thread. */
NPYL_HIDDEN void npyl_skip_log_get(npyl_skip_log *g, char *buf, size_t len);
/* Writes the log's text (append: after what it holds) from a format: what
 * start notes of a file skipped in part (ON_ERROR skip over a file short
 * at start). Any thread. */
NPYL_HIDDEN void npyl_skip_log_note(npyl_skip_log *g, int append, const char *fmt, ...)
    NPYL_PRINTF(3, 4);

/* The end of every batch read: ON_ERROR skip on a failure (rc: the read's
 * result; the batch's reads retried once, then row by row, the rows that
 * still fail dropped: *rows and indices shrink, c->kept[r] the position
 * row r had before), the .npy.zst counters.
 * Returns 0 or the error (more than MAX_ERRORS samples skipped, or no
 * skipping), with c->errmsg. */
NPYL_HIDDEN int npyl_rskip_finish(const npyl_read_view *v, npyl_read_ctx *c, int64_t *indices,
                                  size_t *rows, uint8_t *const *dst, int rc, uint64_t *bytes,
                                  npyl_zstats *zs);

#endif
