/* The batch reader's plan: a batch's rows become read requests (runs of
 * consecutive samples of one .npy file, one request each, straight into
 * the slot) and the rows of .npy.zst files are grouped by frame (sorted by
 * field, file, frame, row), each frame's compressed bytes placed in the
 * worker's scratch at the address congruent to its file offset modulo
 * 4096 (O_DIRECT reads land straight there), in rounds of what fits.
 * Nothing here reads or decodes. */
#include <stdint.h>
#include <stdlib.h>

#include "npyload_loader_read_plan.h"

/* The file of field f holding global sample s (binary search). */
const npyl_ffile *npyl_rplan_file(const npyl_field *f, int64_t s)
{
    return &f->files[npyl_field_file_of(f, s)];
}

/* Request q: `rows` consecutive samples of field f from global sample s on,
 * all in file ff, landing at dst. A stored narrowed file's rows are codes,
 * one byte per value: they land at the end of the rows' npyl_rplan_place (*rff = ff)
 * and are expanded in npyl_rplan_place after the read (npyl_rround_expand), or, when the
 * device expands them (f->dnarrow: the rows' npyl_rplan_place holds codes), only
 * checked. */
void npyl_rplan_raw(npyl_req *q, const npyl_ffile **rff, const npyl_field *f,
                    const npyl_ffile *ff, int64_t s, uint64_t rows, uint8_t *dst)
{
    uint64_t rb = ff->rb;
    q->file = ff->io_index;
    q->offset = ff->data_offset + (uint64_t)(s - ff->first) * rb;
    q->len = rows * rb;
    q->dst = dst + rows * (f->stage_row_bytes - rb);
    *rff = ff->nx ? ff : NULL;
}

/* The batch's rows as runs of consecutive samples of one file of field f
 * (returns how many); every field of the same files_as has the same
 * runs. */
static size_t plan_runs(const npyl_field *f, const int64_t *indices, size_t rows,
                        npyl_prun *runs)
{
    size_t n = 0;
    for (size_t r = 0; r < rows;) {
        int64_t first = indices[r];
        size_t k = npyl_field_file_of(f, first);
        int64_t end = f->files[k].first + f->files[k].count;
        size_t run = 1;
        while (r + run < rows && indices[r + run] == first + (int64_t)run &&
               first + (int64_t)run < end)
            run++;
        runs[n++] = (npyl_prun){(uint32_t)r, (uint32_t)run, (uint32_t)k};
        r += run;
    }
    return n;
}

/* Turns the batch's rows (indices[0 .. rows)) into read requests, one per
 * run of consecutive samples of one .npy file: a run lands in one read,
 * straight into the slot. Rows of .npy.zst files go to zrows (*nz of them)
 * instead; *nnx: the requests of stored narrowed files (codes to expand).
 * The runs are found once per group of fields with the same files
 * (files_as), in runs. */
static size_t plan_reads(const npyl_read_view *v, const int64_t *indices, size_t rows,
                         uint8_t *const *dst, npyl_req *reqs, const npyl_ffile **rff,
                         npyl_zrow *zrows, size_t *nz, size_t *nnx, npyl_prun *runs)
{
    size_t n = 0, nruns = 0, runs_of = SIZE_MAX;
    *nz = 0;
    *nnx = 0;
    for (size_t fi = 0; fi < v->nfields; fi++) {
        const npyl_field *f = &v->fields[fi];
        uint8_t *base = dst[fi];
        if (f->files_as != runs_of) {
            nruns = plan_runs(f, indices, rows, runs);
            runs_of = f->files_as;
        }
        for (size_t u = 0; u < nruns; u++) {
            const npyl_prun *p = &runs[u];
            const npyl_ffile *ff = &f->files[p->k];
            if (!ff->zst) {
                npyl_rplan_raw(&reqs[n], &rff[n], f, ff, indices[p->r], p->n,
                               base + (uint64_t)p->r * f->stage_row_bytes);
                *nnx += rff[n] != NULL;
                n++;
                continue;
            }
            for (uint32_t r = p->r; r < p->r + p->n; r++) {
                npyl_zrow *z = &zrows[(*nz)++];
                uint64_t off;
                z->field = (uint32_t)fi;
                z->file = ff->io_index;
                z->row = r;
                z->local = (uint64_t)(indices[r] - ff->first);
                z->ff = ff;
                npyl_zst_locate(ff->zst, z->local, &z->frame, &off);
            }
        }
    }
    return n;
}

static int zrow_cmp(const void *pa, const void *pb)
{
    const npyl_zrow *a = pa, *b = pb;
    if (a->field != b->field)
        return a->field < b->field ? -1 : 1;
    if (a->file != b->file)
        return a->file < b->file ? -1 : 1;
    if (a->frame != b->frame)
        return a->frame < b->frame ? -1 : 1;
    /* Within a frame in the order its bytes decode (npyl_rround_decode streams
     * them), then by position in the batch. */
    if (a->local != b->local)
        return a->local < b->local ? -1 : 1;
    return a->row < b->row ? -1 : a->row > b->row;
}

static int same_frame(const npyl_zrow *a, const npyl_zrow *b)
{
    return a->field == b->field && a->file == b->file && a->frame == b->frame;
}

/* One past the last of the sorted rows zr[v..n) that share zr[v]'s frame. */
size_t npyl_rplan_frame_end(const npyl_zrow *zr, size_t v, size_t n)
{
    size_t g = v + 1;
    while (g < n && same_frame(&zr[g], &zr[v]))
        g++;
    return g;
}

/* Where in zsrc a frame at file offset `coff` goes when the scratch is
 * filled up to `cursor`: with O_DIRECT, at the next address congruent to
 * coff modulo NPYL_DIRECT_ALIGN (zsrc itself is aligned), so the io layer
 * reads all but its unaligned head and tail with O_DIRECT. */
uint64_t npyl_rplan_place(const npyl_read_view *v, uint64_t cursor, uint64_t coff)
{
    if (!v->direct_io)
        return cursor;
    return cursor + ((coff - cursor) & (NPYL_DIRECT_ALIGN - 1));
}

/* Plans the batch's rows into b: one request per run of raw rows (b->nraw),
 * the rows of .npy.zst files sorted by frame (b->nz), no round yet. */
void npyl_rplan_batch(const npyl_read_view *v, npyl_read_buf *b, const int64_t *indices,
                       size_t rows, uint8_t *const *dst)
{
    b->nraw = plan_reads(v, indices, rows, dst, b->reqs, b->rff, b->zrows, &b->nz, &b->nnx,
                         b->runs);
    if (b->nz)
        qsort(b->zrows, b->nz, sizeof *b->zrows, zrow_cmp);
    b->u0 = b->u = 0;
}

/* The next round of b's reads: the raw rows (first round only) and, from
 * b->u on, as many frames as the compressed scratch holds (further frames
 * go to later rounds, only when they do not fit). */
void npyl_rplan_round(const npyl_read_view *v, npyl_read_buf *b)
{
    npyl_zrow *zr = b->zrows;
    size_t nreq = b->nraw, u = b->u, nz = b->nz;
    uint64_t cursor = 0, cb = 0;
    b->u0 = u;
    while (u < nz) {
        size_t g = npyl_rplan_frame_end(zr, u, nz);
        const npyl_zst_index *x = zr[u].ff->zst;
        uint64_t coff = x->coff[zr[u].frame], csz = x->coff[zr[u].frame + 1] - coff;
        uint64_t p = npyl_rplan_place(v, cursor, coff);
        if (p + csz > b->zsrc_cap && u > b->u0)
            break; /* the first frame always fits: zsrc_cap >= max_csize + align */
        zr[u].src = p;
        b->reqs[nreq++] = (npyl_req){.file = zr[u].file, .offset = coff, .len = csz,
                                        .dst = b->zsrc + p};
        cursor = p + csz;
        cb += csz;
        u = g;
    }
    b->nreq = nreq;
    b->u = u;
    b->cb = cb;
}

