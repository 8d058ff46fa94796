/* lib/loader's batch reader, its plan (npyload_loader_read_plan.c): a
 * batch's rows become requests (runs of consecutive samples of one .npy
 * file) and .npy.zst rows grouped by frame, in rounds of what the
 * compressed scratch holds. Reads and decodes nothing. */
#ifndef NPYLOAD_LOADER_READ_PLAN_H
#define NPYLOAD_LOADER_READ_PLAN_H

#include "npyload_loader_types.h"

/* The file of field f holding global sample s (binary search). */
NPYL_HIDDEN const npyl_ffile *npyl_rplan_file(const npyl_field *f, int64_t s);
/* Request q: `rows` consecutive samples of field f from global sample s
 * on, all in file ff, landing at dst. A stored narrowed file's rows are
 * codes, one byte per value: they land at the end of the rows' place
 * (*rff = ff) and are expanded in place after the read
 * (npyl_rround_expand), or, when the device expands them (f->dnarrow),
 * only checked. */
NPYL_HIDDEN void npyl_rplan_raw(npyl_req *q, const npyl_ffile **rff, const npyl_field *f,
                                const npyl_ffile *ff, int64_t s, uint64_t rows, uint8_t *dst);
/* One past the last of the sorted rows zr[v..n) that share zr[v]'s frame. */
NPYL_HIDDEN size_t npyl_rplan_frame_end(const npyl_zrow *zr, size_t v, size_t n);
/* Where in zsrc a frame at file offset coff goes when the scratch is
 * filled up to cursor (with O_DIRECT: congruent to coff modulo 4096). */
NPYL_HIDDEN uint64_t npyl_rplan_place(const npyl_read_view *v, uint64_t cursor, uint64_t coff);
/* Plans the batch's rows into b: one request per run of raw rows
 * (b->nraw), the rows of .npy.zst files sorted by frame (b->nz), no round
 * yet. */
NPYL_HIDDEN void npyl_rplan_batch(const npyl_read_view *v, npyl_read_buf *b,
                                  const int64_t *indices, size_t rows, uint8_t *const *dst);
/* The next round of b's reads: the raw rows (first round only) and, from
 * b->u on, as many frames as the compressed scratch holds. */
NPYL_HIDDEN void npyl_rplan_round(const npyl_read_view *v, npyl_read_buf *b);

#endif
