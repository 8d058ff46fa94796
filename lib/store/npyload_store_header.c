/* A file's header read through its store, whatever the store: probes
 * give each file's size, first bytes and (for a .npy.zst or a narrowed
 * store) last bytes, several at once where the store can; the NPY header,
 * the .npy.zst seek table and frame 0, and a narrowed store's value table
 * are parsed from those bytes, and what they do not cover is read with the
 * store's read_at. The kind of a file is told by its first bytes (zstd's
 * magic number), whatever its name. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_store.h"

int npyl_stores_want_tail(const unsigned char *head, size_t head_len, uint64_t size)
{
    if (head_len >= 4 && npyl_zst_is_zstd(head))
        return 1;
    npyload_header h;
    if (npyload_parse_header(head, head_len, size, NULL, &h, NULL, 0) != 0)
        return 0;
    return strcmp(h.descr, "|u1") == 0 && size > h.data_offset + h.data_bytes;
}

int npyl_sprobe_fill(npyl_sprobe *p, uint64_t size, npyl_sprobe_read_fn rd, void *ctx,
                     const char *path, char *err, size_t errlen)
{
    p->size = size;
    p->head_len = (size_t)(size < NPYL_STORE_HEAD_BYTES ? size : NPYL_STORE_HEAD_BYTES);
    if (!(p->head = malloc(p->head_len ? p->head_len : 1)))
        return npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    int rc = rd(ctx, p->head, p->head_len, 0, err, errlen);
    if (rc || !npyl_stores_want_tail(p->head, p->head_len, size))
        return rc;
    p->tail_len = (size_t)(size < NPYL_STORE_TAIL_BYTES ? size : NPYL_STORE_TAIL_BYTES);
    if (!(p->tail = malloc(p->tail_len ? p->tail_len : 1)))
        return npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    return rd(ctx, p->tail, p->tail_len, size - p->tail_len, err, errlen);
}

int npyl_sprobe_read(void *ctx, void *buf, size_t n, uint64_t off)
{
    const npyl_sreader *r = ctx;
    const npyl_sprobe *p = r->p;
    if (off > p->size || n > p->size - off)
        return -EIO;
    if (off + n <= p->head_len) {
        memcpy(buf, p->head + off, n);
        return 0;
    }
    if (p->tail && off >= p->size - p->tail_len) {
        memcpy(buf, p->tail + (off - (p->size - p->tail_len)), n);
        return 0;
    }
    return r->rest(r->rest_ctx, buf, n, off);
}

/* The rest of a file of the set's table: its store's read_at. */
typedef struct set_file {
    npyl_stores *set;
    uint32_t file;
} set_file;

static int read_rest(void *ctx, void *buf, size_t n, uint64_t off)
{
    const set_file *f = ctx;
    npyl_stores *set = f->set;
    uint32_t st = set->files[f->file].store;
    return set->ops[st]->read_at(set->s[st], set->files, f->file, buf, n, off, NULL, 0);
}

/* Narrowed: the loader delivers the values, not the codes. */
static void deliver_values(npyload_header *h, const npyl_zst_narrow *nx)
{
    memcpy(h->descr, nx->descr, sizeof nx->descr);
    h->byteorder = h->descr[0];
    h->kind = h->descr[1];
    h->itemsize = nx->itemsize;
    h->data_bytes *= nx->itemsize;
}

int npyl_sprobe_npy_header(const npyl_sreader *r, const char *path, npyload_header *h,
                           char *err, size_t errlen)
{
    const npyl_sprobe *p = r->p;
    int rc = npyload_parse_header(p->head, p->head_len, p->size, path, h, err, errlen);
    if (rc == NPYLOAD_ETRUNCATED && h->header_len && h->data_offset > p->head_len &&
        h->data_offset <= p->size) {
        /* data_offset <= NPYLOAD_MAX_HEADER_LEN + 12: parse checked it. */
        size_t need = (size_t)h->data_offset;
        unsigned char *big = malloc(need);
        if (!big)
            return npyl_fail(err, errlen, -ENOMEM, "%s: out of memory for a %zu-byte header",
                             path, need);
        rc = r->rest(r->rest_ctx, big, need, 0);
        if (rc)
            rc = npyl_fail(err, errlen, rc, "%s: reading its %zu-byte header failed: %s", path,
                           need, npyload_strerror(rc));
        else
            rc = npyload_parse_header(big, need, p->size, path, h, err, errlen);
        free(big);
    }
    return rc;
}

/* File i's header from its probe. */
static int header_of(npyl_stores *set, size_t i, const npyl_sprobe *p, npyl_sheader *sh,
                     char *err, size_t errlen)
{
    const char *path = set->files[i].path;
    set_file f = {set, (uint32_t)i};
    npyl_sreader r = {p, read_rest, &f};
    sh->zst = NULL;
    sh->nx = NULL;
    npyload_header *h = &sh->h;
    memset(h, 0, sizeof *h); /* what a failure leaves: as far as the parser got */
    if (p->head_len < 4 || !npyl_zst_is_zstd(p->head)) {
        int rc = npyl_sprobe_npy_header(&r, path, h, err, errlen);
        uint64_t end = h->data_offset + h->data_bytes;
        if (rc || strcmp(h->descr, "|u1") != 0 || h->file_bytes <= end)
            return rc;
        rc = npyl_zst_store_probe(npyl_sprobe_read, &r, path, h->file_bytes, end, &sh->nx, err, errlen);
        if (rc == 0 && sh->nx)
            deliver_values(h, sh->nx);
        return rc;
    }
    npyl_zst_index *x = calloc(1, sizeof *x);
    if (!x)
        return npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    int rc = npyl_zst_index_read(npyl_sprobe_read, &r, p->size, path, x, err, errlen);
    if (rc) {
        free(x);
        return rc;
    }
    *h = x->hdr;
    if (x->narrow)
        deliver_values(h, x->narrow);
    sh->zst = x;
    return 0;
}

static void free_group(npyl_hwalk *w)
{
    for (size_t k = 0; k < w->g1 - w->g0; k++) {
        free(w->probe[k].head);
        free(w->probe[k].tail);
    }
    memset(w->probe, 0, sizeof w->probe);
    w->g0 = w->g1 = w->next;
}

void npyl_stores_walk_begin(npyl_hwalk *w, npyl_stores *set, size_t first, size_t n)
{
    memset(w, 0, sizeof *w);
    w->set = set;
    w->next = w->g0 = w->g1 = first;
    w->end = first + n;
}

int npyl_stores_walk_next(npyl_hwalk *w, size_t *i, npyl_sheader *sh, char *err,
                          size_t errlen)
{
    if (w->next >= w->end)
        return 0;
    npyl_stores *set = w->set;
    if (w->next >= w->g1) {
        /* The next group: consecutive files of one store. */
        free_group(w);
        uint32_t st = set->files[w->next].store;
        size_t g1 = w->next;
        while (g1 < w->end && g1 - w->next < NPYL_HWALK_GROUP && set->files[g1].store == st) {
            w->idx[g1 - w->next] = (uint32_t)g1;
            g1++;
        }
        size_t bad = 0;
        int rc = set->ops[st]->probe(set->s[st], set->files, w->idx, g1 - w->next, w->probe,
                                     &bad, err, errlen);
        w->g1 = g1;
        if (rc) {
            *i = w->idx[bad < g1 - w->next ? bad : 0];
            memset(sh, 0, sizeof *sh);
            w->next = w->end; /* the walk is over */
            return rc;
        }
    }
    *i = w->next;
    const npyl_sprobe *p = &w->probe[w->next - w->g0];
    set->files[w->next].size = p->size;
    w->next++; /* after a header's failure too: the caller may go on */
    int rc = header_of(set, *i, p, sh, err, errlen);
    return rc ? rc : 1;
}

void npyl_stores_walk_end(npyl_hwalk *w)
{
    free_group(w);
}
