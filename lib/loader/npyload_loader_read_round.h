/* lib/loader's batch reader, a batch's rounds (npyload_loader_read_round.c):
 * each round's requests read through the stores, narrowed raw rows
 * expanded, the round's .npy.zst frames decoded into the slot. */
#ifndef NPYLOAD_LOADER_READ_ROUND_H
#define NPYLOAD_LOADER_READ_ROUND_H

#include "npyload_loader_read_plan.h"
#include "npyload_loader_types.h"

/* The codes of the stored narrowed files among the n raw requests (read)
 * become their values, in place (or stay, checked: dnarrow). 0 or
 * NPYLOAD_EFORMAT (a code not in the table) with c->errmsg. */
NPYL_HIDDEN int npyl_rround_expand(const npyl_read_view *v, npyl_read_ctx *c,
                                   const npyl_req *reqs, const npyl_ffile *const *rff,
                                   size_t n);
/* Decompresses frame z->frame of file z->ff (its compressed bytes at src)
 * to rows z[0..k) of field z->field. */
NPYL_HIDDEN int npyl_rround_decode(const npyl_read_view *v, npyl_read_ctx *c,
                                   const npyl_zrow *z, size_t k, const uint8_t *src,
                                   uint8_t *const *dst, uint64_t *bytes, npyl_zstats *zs);
/* An io failure on a frame read: appends which frame to c->errmsg. */
NPYL_HIDDEN void npyl_rround_name_frame(npyl_read_ctx *c, const npyl_zrow *z);
/* A round's reads returned rc (the bad-th request failed; got bytes
 * landed): names the frame of a failed frame read, counts what landed and
 * decodes the round's frames. */
NPYL_HIDDEN int npyl_rround_finish(const npyl_read_view *v, npyl_read_ctx *c,
                                   npyl_read_buf *b, int rc, size_t bad, uint64_t got,
                                   uint8_t *const *dst, uint64_t *bytes, npyl_zstats *zs);
/* b's rounds from where it stands, each read through c's own contexts and
 * decoded before the next. */
NPYL_HIDDEN int npyl_rround_rest(const npyl_read_view *v, npyl_read_ctx *c, npyl_read_buf *b,
                                 uint8_t *const *dst, uint64_t *bytes, npyl_zstats *zs);
/* Reads all of the batch's rows, every field, through c's current buffer:
 * the plain path. */
NPYL_HIDDEN int npyl_rround_all(const npyl_read_view *v, npyl_read_ctx *c,
                                const int64_t *indices, size_t rows, uint8_t *const *dst,
                                uint64_t *bytes, npyl_zstats *zs);

#endif
