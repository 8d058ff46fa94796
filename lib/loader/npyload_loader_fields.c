/* Loader fields: adding them (globs, explicit lists) and, at start, reading
 * every header and checking that the files of a field agree and that the
 * fields hold the same number of samples. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_loader_internal.h"

/* ---- fields ---- */

/* The checks every add_field call starts with (the fork check first). */
static int check_new_field(npyload_loader *L, const char *name)
{
    int frc = npyl_loader_forked(L);
    if (frc)
        return frc;
    if (L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "fields cannot be added after start");
    if (!name || !*name)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "a field needs a non-empty name");
    if (L->nsources > 1)
        return 0; /* a later source's field: src_field checks it */
    for (size_t i = 0; i < L->nfields; i++)
        if (strcmp(L->fields[i].name, name) == 0)
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "%s%s%sfield '%s' was already added",
                                    L->nsources ? "source '" : "",
                                    L->nsources ? L->src_names[0] : "",
                                    L->nsources ? "': " : "", name);
    return 0;
}

/* ---- sources (a mixture) ---- */

int npyload_loader_add_source(npyload_loader *L, const char *name)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int rc = npyl_loader_forked(L);
    if (rc)
        return rc;
    if (L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "sources cannot be added after start");
    if (!name || !*name)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "a source needs a non-empty name");
    if (L->nsources == 0 && L->nfields)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "source '%s': fields were added before "
                                "the first source (with sources, every field belongs to "
                                "one: add the source first)", name);
    if (L->nsources >= NPYL_MIX_MAX_SOURCES)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "source '%s': more than %d sources",
                                name, NPYL_MIX_MAX_SOURCES);
    for (size_t k = 0; k < L->nsources; k++)
        if (strcmp(L->src_names[k], name) == 0)
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "source '%s' was already added", name);
    if ((rc = npyl_loader_sources_complete(L)))
        return rc;
    if (L->nsources == L->cap_sources) {
        size_t cap = L->cap_sources ? 2 * L->cap_sources : 4;
        char **nm = realloc(L->src_names, cap * sizeof *nm);
        if (nm)
            L->src_names = nm;
        double *w = nm ? realloc(L->weights, cap * sizeof *w) : NULL;
        if (w)
            L->weights = w;
        if (!nm || !w)
            return npyl_loader_fail(L, -ENOMEM, "out of memory adding source '%s'", name);
        L->cap_sources = cap;
    }
    char *copy = strdup(name);
    if (!copy)
        return npyl_loader_fail(L, -ENOMEM, "out of memory adding source '%s'", name);
    npyl_loader_drop_loaded_fields(L);
    L->src_names[L->nsources] = copy;
    L->weights[L->nsources] = 1.0;
    L->nsources++;
    npyl_loader_clear(L);
    return 0;
}

size_t npyload_loader_num_sources(const npyload_loader *L) { return L ? L->nsources : 0; }

const char *npyload_loader_source_name(const npyload_loader *L, size_t k)
{
    return L && k < L->nsources ? L->src_names[k] : NULL;
}

/* Whether every field of source 0 was added by the last source begun. */
int npyl_loader_sources_complete(npyload_loader *L)
{
    if (L->nsources == 0)
        return 0;
    size_t last = L->nsources - 1;
    if (L->nfields == 0)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "source '%s' has no fields",
                                L->src_names[last]);
    for (size_t i = 0; i < L->nfields; i++)
        if (L->fields[i].nsrc != L->nsources)
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "source '%s' lacks field '%s' (every "
                                    "source has the fields of source '%s')",
                                    L->src_names[last], L->fields[i].name, L->src_names[0]);
    return 0;
}

/* Records that field f's paths from `first` on are the current source's. */
static int src_mark(npyload_loader *L, npyl_field *f, size_t first)
{
    size_t *sf = realloc(f->src_first, (f->nsrc + 1) * sizeof *sf);
    if (!sf)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    f->src_first = sf;
    sf[f->nsrc++] = first;
    return 0;
}

/* A field added for source k >= 1: one of source 0's, once per source.
 * Appends the paths (ownership taken) to it. */
static int src_field(npyload_loader *L, const char *name, char **paths, size_t n)
{
    const char *src = L->src_names[L->nsources - 1];
    npyl_field *f = NULL;
    for (size_t i = 0; i < L->nfields && !f; i++)
        if (strcmp(L->fields[i].name, name) == 0)
            f = &L->fields[i];
    int rc = 0;
    if (!f)
        rc = npyl_loader_fail(L, NPYLOAD_EINVAL, "source '%s': field '%s' is not a field of "
                              "source '%s' (every source has the same fields)", src, name,
                              L->src_names[0]);
    else if (f->nsrc == L->nsources)
        rc = npyl_loader_fail(L, NPYLOAD_EINVAL, "source '%s': field '%s' was already added",
                              src, name);
    char **all = rc ? NULL : realloc(f->paths, (f->npaths + n) * sizeof *all);
    if (!rc && !all)
        rc = npyl_loader_fail(L, -ENOMEM, "out of memory adding field '%s'", name);
    if (!rc)
        f->paths = all;
    if (!rc && (rc = src_mark(L, f, f->npaths)) == 0) {
        memcpy(f->paths + f->npaths, paths, n * sizeof *paths);
        f->npaths += n;
        free(paths);
        npyl_loader_drop_loaded_fields(L);
        npyl_loader_clear(L);
        return 0;
    }
    npyl_free_paths(paths, n);
    return rc;
}

int64_t npyl_loader_epoch_len(const npyload_loader *L)
{
    if (!L->nsources)
        return L->n;
    return L->opt[NPYLOAD_OPT_SAMPLES_PER_EPOCH] ? L->opt[NPYLOAD_OPT_SAMPLES_PER_EPOCH]
                                                  : L->n;
}

/* Takes ownership of paths (an npyl_glob_sorted-style array). */
static int push_field(npyload_loader *L, const char *name, char **paths, size_t n)
{
    if (L->nsources > 1)
        return src_field(L, name, paths, n);
    npyl_loader_drop_loaded_fields(L); /* a stopped loader's: another field now */
    if (L->nfields == L->cap_fields) {
        size_t cap = L->cap_fields ? 2 * L->cap_fields : 4;
        npyl_field *f = realloc(L->fields, cap * sizeof *f);
        if (!f) {
            npyl_free_paths(paths, n);
            return npyl_loader_fail(L, -ENOMEM, "out of memory adding field '%s'", name);
        }
        L->fields = f;
        L->cap_fields = cap;
    }
    npyl_field *f = &L->fields[L->nfields];
    memset(f, 0, sizeof *f);
    f->name = strdup(name);
    if (!f->name) {
        npyl_free_paths(paths, n);
        return npyl_loader_fail(L, -ENOMEM, "out of memory adding field '%s'", name);
    }
    f->paths = paths;
    f->npaths = n;
    L->nfields++;
    int rc;
    if (L->nsources && (rc = src_mark(L, f, 0)))
        return rc;
    npyl_loader_clear(L);
    return 0;
}

/* A path of field `name`, checked by the store that reads it (an s3:// path
 * needs npyload_loader_set_remote), and with glob expanded into *paths. */
static int add_path(npyload_loader *L, const char *name, const char *path, int glob,
                    char ***paths, size_t *n)
{
    char err[NPYL_ERRMSG_LEN - 128];
    int rc = npyl_stores_add(&L->stores, path, glob, paths, n, err, sizeof err);
    return rc ? npyl_loader_fail(L, rc, "field '%s': %s", name, err) : 0;
}

int npyl_loader_register_store(npyload_loader *L, const npyl_store_ops *ops, const void *arg)
{
    if (L->nfields || L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "a store is registered before any field");
    int rc = npyl_stores_register(&L->stores, ops, arg);
    return rc ? npyl_loader_fail(L, rc, "cannot register the store '%s'", ops->name) : 0;
}

int npyload_loader_add_field(npyload_loader *L, const char *name, const char *glob)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int rc = check_new_field(L, name);
    if (rc)
        return rc;
    if (!glob || !*glob)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "field '%s': empty glob", name);
    char **paths;
    size_t n;
    if ((rc = add_path(L, name, glob, 1, &paths, &n)))
        return rc;
    return push_field(L, name, paths, n);
}

int npyload_loader_add_field_files(npyload_loader *L, const char *name,
                                   const char *const *paths, size_t n)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int rc = check_new_field(L, name);
    if (rc)
        return rc;
    if (!paths || n == 0)
        return npyl_loader_fail(L, NPYLOAD_ENOFILES, "field '%s': empty list of files", name);
    for (size_t i = 0; i < n; i++)
        if (paths[i] && *paths[i] && (rc = add_path(L, name, paths[i], 0, NULL, NULL)))
            return rc;
    char **copy = calloc(n, sizeof *copy);
    if (!copy)
        return npyl_loader_fail(L, -ENOMEM, "out of memory adding field '%s'", name);
    for (size_t i = 0; i < n; i++) {
        if (!paths[i] || !*paths[i]) {
            npyl_free_paths(copy, i);
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "field '%s': path %zu is empty", name, i);
        }
        copy[i] = strdup(paths[i]);
        if (!copy[i]) {
            npyl_free_paths(copy, i);
            return npyl_loader_fail(L, -ENOMEM, "out of memory adding field '%s'", name);
        }
    }
    return push_field(L, name, copy, n);
}

size_t npyload_loader_num_fields(const npyload_loader *L) { return L ? L->nfields : 0; }

const char *npyload_loader_field_name(const npyload_loader *L, size_t i)
{
    return (L && i < L->nfields) ? L->fields[i].name : NULL;
}

/* ---- start: headers and validation ---- */

static void fmt_shape(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < ndim && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s%" PRId64, i ? "," : "", shape[i]);
    if (k < len)
        snprintf(buf + k, len - k, ")");
}

/* Whether a Fortran-ordered array's bytes are also its C-order bytes: true
 * when at most one dimension is longer than 1 (or it holds no element).
 * Only then can it be delivered as C-ordered rows; any other Fortran file,
 * a single sample (1, 2, 3) included, would come out transposed. */
static int f_order_is_c_order(const npyload_header *h)
{
    int longer = 0;
    for (int d = 0; d < h->ndim; d++) {
        if (h->shape[d] == 0)
            return 1;
        longer += h->shape[d] > 1;
    }
    return longer <= 1;
}

/* The source of field f's file k (a mixture: f->nsrc > 0). */
static size_t src_of_file(const npyl_field *f, size_t k)
{
    size_t sk = 0;
    while (sk + 1 < f->nsrc && f->src_first[sk + 1] <= k)
        sk++;
    return sk;
}

/* Reads the headers of field f's files (through their stores: the file
 * table's entries from *io_next on), checks they agree, and records the
 * files. *io_next is the field's first file in the table, advanced past it;
 * *samples receives the field's total. */
static int load_files(npyload_loader *L, npyl_field *f, size_t *io_next, int64_t *samples);

/* ON_ERROR skip and a .npy whose file holds only part of the data its
 * header announces (a failed copy among thousands): h as the parser filled
 * it (rc NPYLOAD_ETRUNCATED on the data check alone). The file is loaded
 * with the rows its header says, so that fields and indices stay as they
 * are; the rows it lacks fail when read (the io and remote layers refuse a
 * read past the size seen at start) and are skipped and counted like any
 * failed read. Named once, here, in the skip log (the loader's
 * last_skip_error; Python warns with it). A stored narrowed file cut short
 * has lost its value table: refused, never delivered as codes. Returns 0
 * or rc. */
static int accept_short(npyload_loader *L, const npyl_field *f, const char *path,
                        const npyload_header *h, int rc, size_t *nshort)
{
    static const char nar[] = ".narrow.npy";
    size_t len = strlen(path), nl = sizeof nar - 1;
    if (rc != NPYLOAD_ETRUNCATED || L->opt[NPYLOAD_OPT_ON_ERROR] != 1 || !h->descr[0] ||
        h->ndim < 1 || h->data_offset > h->file_bytes ||
        h->data_offset + h->data_bytes <= h->file_bytes ||
        (len > nl && strcmp(path + len - nl, nar) == 0))
        return rc;
    uint64_t row = h->itemsize;
    for (int d = 1; d < h->ndim; d++)
        row *= (uint64_t)h->shape[d];
    uint64_t whole = row ? (h->file_bytes - h->data_offset) / row : 0;
    if (++*nshort == 1)
        npyl_skip_log_note(&L->skip, 0,
                 "field '%s': %.700s holds %" PRIu64 " of the %" PRId64 " samples its header "
                 "says (%" PRIu64 " of %" PRIu64 " data bytes: a truncated file); with "
                 "on_error skip the missing samples are skipped and counted when read",
                 f->name, path, whole, h->shape[0], h->file_bytes - h->data_offset,
                 h->data_bytes);
    return 0;
}

static int load_field(npyload_loader *L, npyl_field *f, size_t *io_next, int64_t *samples)
{
    f->files = calloc(f->npaths, sizeof *f->files);
    if (!f->files)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    return load_files(L, f, io_next, samples);
}

/* load_field's loop over the files: one header, checked and recorded. */
static int load_file(npyload_loader *L, npyl_field *f, size_t k, size_t io, npyl_sheader *sh,
                     int64_t *total)
{
    const char *path = f->paths[k];
    npyload_header h = sh->h;
    npyl_zst_index *zst = sh->zst;
    f->files[k].zst = zst; /* freed with the file table from here on */
    f->files[k].nx = sh->nx;
    if (zst) {
        L->zst.any = 1;
        if (zst->max_csize > L->zst.max_csize)
            L->zst.max_csize = zst->max_csize;
        for (uint32_t fr = 1; fr < zst->nframes; fr++) {
            uint64_t first, count;
            npyl_zst_frame_rows(zst, fr, &first, &count);
            uint64_t dsz = zst->doff[fr + 1] - zst->doff[fr];
            if (count > 1 && dsz > L->zst.max_multi_dsize)
                L->zst.max_multi_dsize = (uint32_t)dsz;
        }
    }
    if (h.ndim < 1)
        return npyl_loader_fail(L, NPYLOAD_EUNSUPPORTED,
                                "field '%s': %s: 0-d array has no sample axis", f->name, path);
    uint64_t row = h.itemsize;
    for (int d = 1; d < h.ndim; d++)
        row *= (uint64_t)h.shape[d]; /* cannot overflow: the parser checked the product */
    if (h.fortran_order && !f_order_is_c_order(&h)) {
        char a[256];
        fmt_shape(a, sizeof a, h.ndim, h.shape);
        return npyl_loader_fail(L, NPYLOAD_EUNSUPPORTED,
                                "field '%s': %s: Fortran-ordered data of shape %s is not "
                                "supported (its bytes are not in C order); rewrite it "
                                "C-ordered (numpy.ascontiguousarray)", f->name, path, a);
    }
    if (k == 0) {
        memcpy(f->descr, h.descr, sizeof f->descr);
        f->itemsize = h.itemsize;
        f->sndim = h.ndim - 1;
        memcpy(f->sshape, h.shape + 1, sizeof(int64_t) * (size_t)f->sndim);
        f->row_bytes = row;
    } else if (f->nsrc > 1 && src_of_file(f, k) > 0) {
        size_t sk = src_of_file(f, k);
        char a[256], b[256];
        fmt_shape(a, sizeof a, h.ndim - 1, h.shape + 1);
        fmt_shape(b, sizeof b, f->sndim, f->sshape);
        if (strcmp(h.descr, f->descr) != 0 || h.ndim - 1 != f->sndim ||
            memcmp(h.shape + 1, f->sshape, sizeof(int64_t) * (size_t)f->sndim) != 0)
            return npyl_loader_fail(L, NPYLOAD_EMISMATCH,
                                    "source '%s', field '%s': %s holds samples of shape %s "
                                    "and dtype %s; source '%s' has shape %s and dtype %s "
                                    "(%s): every source's field has the same shape and dtype",
                                    L->src_names[sk], f->name, path, a, h.descr,
                                    L->src_names[0], b, f->descr, f->paths[0]);
    } else {
        if (strcmp(h.descr, f->descr) != 0)
            return npyl_loader_fail(L, NPYLOAD_EMISMATCH,
                                    "field '%s': %s holds dtype %s, expected %s as in %s",
                                    f->name, path, h.descr, f->descr, f->paths[0]);
        if (h.ndim - 1 != f->sndim ||
            memcmp(h.shape + 1, f->sshape, sizeof(int64_t) * (size_t)f->sndim) != 0) {
            char a[256], b[256];
            fmt_shape(a, sizeof a, h.ndim - 1, h.shape + 1);
            fmt_shape(b, sizeof b, f->sndim, f->sshape);
            return npyl_loader_fail(L, NPYLOAD_EMISMATCH,
                                    "field '%s': %s holds samples of shape %s, expected %s "
                                    "as in %s", f->name, path, a, b, f->paths[0]);
        }
    }
    f->files[k].io_index = (uint32_t)io;
    f->files[k].first = *total;
    f->files[k].count = h.shape[0];
    f->files[k].data_offset = h.data_offset;
    if (__builtin_add_overflow(*total, h.shape[0], total))
        return npyl_loader_fail(L, NPYLOAD_ETOOBIG, "field '%s': sample count overflows",
                                f->name);
    return 0;
}

static int load_files(npyload_loader *L, npyl_field *f, size_t *io_next, int64_t *samples)
{
    char err[NPYL_ERRMSG_LEN];
    int64_t total = 0;
    size_t nshort = 0;
    npyl_hwalk *w = malloc(sizeof *w);
    if (!w)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    const size_t first = *io_next;
    npyl_stores_walk_begin(w, &L->stores, first, f->npaths);
    size_t io = first;
    npyl_sheader sh;
    int rc, failed = 0;
    while ((rc = npyl_stores_walk_next(w, &io, &sh, err, sizeof err)) != 0) {
        if (rc < 0 && (sh.zst || sh.nx ||
                       (rc = accept_short(L, f, f->paths[io - first], &sh.h, rc, &nshort))))
            break;
        *io_next = io + 1;
        if ((rc = load_file(L, f, io - first, io, &sh, &total)) != 0) {
            failed = 1; /* its message is set */
            break;
        }
    }
    npyl_stores_walk_end(w);
    free(w);
    if (rc && !failed)
        return npyl_loader_fail(L, rc, "field '%s': %s", f->name, err);
    if (rc)
        return rc;
    if (nshort > 1)
        npyl_skip_log_note(&L->skip, 1, " (and %zu more files of field '%s' are short)",
                           nshort - 1, f->name);
    if (f->row_bytes == 0)
        return npyl_loader_fail(L, NPYLOAD_EUNSUPPORTED,
                                "field '%s': %s: samples of zero bytes", f->name, f->paths[0]);
    /* Files of one count but the last: a sample's file is a division. */
    f->per_file = f->npaths > 1 ? f->files[0].count : 0;
    for (size_t k = 0; k + 1 < f->npaths && f->per_file > 0; k++)
        if (f->files[k].count != f->per_file)
            f->per_file = 0;
    *samples = total;
    return 0;
}

/* One file of a field by identity, for the packed-twin check: its store's
 * key (a local file's device and inode, an object's URL). */
typedef struct file_id {
    char key[NPYL_SKEY_LEN];
    size_t k;
} file_id;

static int file_id_cmp(const void *pa, const void *pb)
{
    return strcmp(((const file_id *)pa)->key, ((const file_id *)pb)->key);
}

/* The file that path was made from, when path is a packed or narrowed
 * form of another (*stem malloc'd): FILE.zst from FILE (npyload-pack), a
 * stored narrowed FILE.narrow.npy (one the reader found a value table in)
 * from FILE.npy (npyload-pack --narrow --store). 0 with *stem NULL for any
 * other path; -ENOMEM. */
static int twin_source(const char *path, const npyl_ffile *ff, char **stem, const char **form)
{
    static const char zst[] = ".zst", nar[] = ".narrow.npy";
    size_t len = strlen(path), zl = sizeof zst - 1, nl = sizeof nar - 1;
    *stem = NULL;
    if (len > zl && strcmp(path + len - zl, zst) == 0) {
        *form = "unpacked and packed";
        *stem = strndup(path, len - zl);
    } else if (ff->nx && len > nl && strcmp(path + len - nl, nar) == 0) {
        *form = "plain and narrowed";
        if ((*stem = malloc(len - nl + 5)))
            snprintf(*stem, len - nl + 5, "%.*s.npy", (int)(len - nl), path);
    } else {
        return 0;
    }
    return *stem ? 0 : -ENOMEM;
}

static int twin_refused(npyload_loader *L, const npyl_field *f, const char *a, const char *b,
                        const char *form)
{
    return npyl_loader_fail(L, NPYLOAD_EINVAL,
                            "field '%s' holds both %s and %s: the same samples %s, so every "
                            "one would be delivered twice; keep one form (a glob such as "
                            "'*.npy', '*.npy.zst' or '*.narrow.npy', or delete the source "
                            "files after packing: npyload-pack --rm)",
                            f->name, a, b, form);
}

typedef struct stem_at {
    const char *stem;
    size_t k;
} stem_at;

static int stem_cmp(const void *pa, const void *pb)
{
    const stem_at *a = pa, *b = pb;
    int c = strcmp(a->stem, b->stem);
    return c ? c : (a->k > b->k) - (a->k < b->k);
}

/* Two derived forms of one source in field f (FILE.npy.zst and
 * FILE.narrow.npy, the source itself gone): stems[k] as twin_source gave
 * them, nstem of them not NULL. */
static int check_two_forms(npyload_loader *L, const npyl_field *f, char *const *stems,
                           size_t nstem)
{
    stem_at *v = malloc(nstem * sizeof *v);
    if (!v)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    size_t n = 0;
    for (size_t k = 0; k < f->npaths; k++)
        if (stems[k])
            v[n++] = (stem_at){stems[k], k};
    qsort(v, n, sizeof *v, stem_cmp);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        if (strcmp(v[i - 1].stem, v[i].stem) == 0)
            rc = twin_refused(L, f, f->paths[v[i - 1].k], f->paths[v[i].k],
                              "in two packed forms");
    free(v);
    return rc;
}

/* Refuses a field that holds a file and its packed twin: FILE.zst beside
 * FILE, or FILE.narrow.npy beside FILE.npy (a glob over a whole directory,
 * packed without --rm) would deliver every sample twice. FILE is looked up
 * by identity (its store's key: a local file's device and inode, an
 * object's URL), so any spelling of a local file in an explicit list is
 * caught too; two forms of one source whose source is gone (FILE.npy.zst
 * and FILE.narrow.npy) by their names. Runs after load_field (identities
 * known, value tables found), before the fields' sample counts are
 * compared (which would only say "twice as many"). */
static int check_packed_twins(npyload_loader *L, const npyl_field *f)
{
    if (f->npaths < 2)
        return 0;
    file_id *ids = malloc(f->npaths * sizeof *ids);
    char **stems = calloc(f->npaths, sizeof *stems);
    const char **forms = calloc(f->npaths, sizeof *forms);
    int rc = ids && stems && forms ? 0 : npyl_loader_fail(L, -ENOMEM, "out of memory");
    size_t nstem = 0;
    for (size_t k = 0; k < f->npaths && rc == 0; k++) {
        npyl_stores_key(&L->stores, f->files[k].io_index, NULL, ids[k].key);
        ids[k].k = k;
        if (twin_source(f->paths[k], &f->files[k], &stems[k], &forms[k]))
            rc = npyl_loader_fail(L, -ENOMEM, "out of memory");
        nstem += stems[k] != NULL;
    }
    if (rc == 0 && nstem)
        qsort(ids, f->npaths, sizeof *ids, file_id_cmp);
    for (size_t k = 0; k < f->npaths && rc == 0 && nstem; k++) {
        const char *stem = stems[k], *zp = f->paths[k];
        if (!stem)
            continue;
        file_id key = {.k = 0};
        if (npyl_stores_key(&L->stores, f->files[k].io_index, stem, key.key) != 0)
            continue; /* packed with --rm, or never unpacked: fine */
        const file_id *hit = bsearch(&key, ids, f->npaths, sizeof *ids, file_id_cmp);
        if (hit && hit->k != k) /* not the packed file itself (a hard link) */
            rc = twin_refused(L, f, f->paths[hit->k], zp, forms[k]);
    }
    if (rc == 0 && nstem > 1)
        rc = check_two_forms(L, f, stems, nstem);
    for (size_t k = 0; stems && k < f->npaths; k++)
        free(stems[k]);
    free(stems);
    free(forms);
    free(ids);
    return rc;
}

/* The number a file name carries for pairing: the last run of digits of
 * its base name (leading zeros ignored), or -1 when it has none (or more
 * than 18 digits). */
static int64_t name_number(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *end = NULL, *p = base + strlen(base);
    while (p > base && !end) {
        p--;
        if (*p >= '0' && *p <= '9')
            end = p + 1;
    }
    if (!end)
        return -1;
    const char *start = end;
    while (start > base && start[-1] >= '0' && start[-1] <= '9')
        start--;
    while (start < end - 1 && *start == '0')
        start++;
    if (end - start > 18)
        return -1;
    int64_t v = 0;
    for (const char *q = start; q < end; q++)
        v = v * 10 + (*q - '0');
    return v;
}

/* Guards against silently misaligned fields (ALIGN = 0): when every field
 * has the same number of files, the i-th files must carry the same number
 * in their names. Files without digits in their names are not paired. */
static int check_alignment(npyload_loader *L)
{
    if (L->opt[NPYLOAD_OPT_ALIGN] != 0 || L->nfields < 2)
        return 0;
    size_t nf = L->fields[0].npaths;
    for (size_t i = 1; i < L->nfields; i++)
        if (L->fields[i].npaths != nf)
            return 0;
    for (size_t k = 0; k < nf; k++) {
        const char *a = L->fields[0].paths[k];
        int64_t na = name_number(a);
        if (na < 0)
            continue;
        for (size_t i = 1; i < L->nfields; i++) {
            const char *b = L->fields[i].paths[k];
            int64_t nb = name_number(b);
            if (nb >= 0 && nb != na)
                return npyl_loader_fail(
                    L, NPYLOAD_EMISMATCH,
                    "fields '%s' and '%s' look misaligned: file %zu is %s (number %" PRId64
                    ") and %s (number %" PRId64 "); the i-th files of every field must "
                    "carry the same number in their names (set ALIGN = 1, Python "
                    "align=\"none\", to turn this check off)",
                    L->fields[0].name, L->fields[i].name, k, a, na, b, nb);
        }
    }
    return 0;
}

/* A mixture: each source's samples and first global index, the same in
 * every field (named when not). */
static int load_sources(npyload_loader *L)
{
    free(L->src_n);
    free(L->src_off);
    L->src_n = L->src_off = NULL;
    if (!L->nsources)
        return 0;
    size_t K = L->nsources;
    L->src_n = calloc(K, sizeof *L->src_n);
    L->src_off = calloc(K, sizeof *L->src_off);
    if (!L->src_n || !L->src_off)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    for (size_t i = 0; i < L->nfields; i++) {
        const npyl_field *f = &L->fields[i];
        for (size_t k = 0; k < K; k++) {
            size_t a = f->src_first[k], b = k + 1 < K ? f->src_first[k + 1] : f->npaths;
            int64_t first = a < f->npaths ? f->files[a].first : L->n;
            int64_t end = b < f->npaths ? f->files[b].first : L->n;
            if (i == 0) {
                L->src_off[k] = first;
                L->src_n[k] = end - first;
            } else if (end - first != L->src_n[k]) {
                return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "source '%s': field '%s' holds "
                                        "%" PRId64 " samples, field '%s' %" PRId64 " (a "
                                        "source's fields hold the same number)",
                                        L->src_names[k], L->fields[0].name, L->src_n[k],
                                        f->name, end - first);
            }
        }
    }
    if (!L->weights_given) /* the default: every sample about once an epoch */
        for (size_t k = 0; k < K; k++)
            L->weights[k] = (double)L->src_n[k];
    return 0;
}

int npyl_load_fields(npyload_loader *L)
{
    int src_rc = npyl_loader_sources_complete(L);
    if (src_rc)
        return src_rc;
    if (L->nfields == 0)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "no fields: add at least one before start");
    size_t nfiles = 0;
    for (size_t i = 0; i < L->nfields; i++)
        nfiles += L->fields[i].npaths;
    if (nfiles > UINT32_MAX)
        return npyl_loader_fail(L, NPYLOAD_ETOOBIG, "more than 2^32 files");
    int arc = check_alignment(L);
    if (arc)
        return arc;
    L->zst.any = 0;
    L->zst.max_csize = L->zst.max_multi_dsize = 0;
    /* The file table: every file of every field, in order, each read by
     * the store that claims its path. */
    const char **all = malloc((nfiles ? nfiles : 1) * sizeof *all);
    if (!all)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    for (size_t i = 0, at = 0; i < L->nfields; i++)
        for (size_t k = 0; k < L->fields[i].npaths; k++)
            all[at++] = L->fields[i].paths[k];
    char err[NPYL_ERRMSG_LEN - 64];
    int trc = npyl_stores_table(&L->stores, all, nfiles, err, sizeof err);
    free(all);
    if (trc)
        return npyl_loader_fail(L, trc, "%s", err);
    size_t io_next = 0;
    int64_t n0 = 0, n = 0;
    for (size_t i = 0; i < L->nfields; i++) {
        int rc = load_field(L, &L->fields[i], &io_next, &n);
        if (rc == 0)
            rc = check_packed_twins(L, &L->fields[i]);
        if (rc)
            return rc;
        if (i == 0) {
            n0 = n;
        } else if (n != n0) {
            npyl_field *a = &L->fields[0], *b = &L->fields[i];
            /* Name the first file where the running counts part ways. */
            size_t ka = 0, kb = 0;
            while (ka < a->npaths && kb < b->npaths &&
                   a->files[ka].first == b->files[kb].first &&
                   a->files[ka].count == b->files[kb].count)
                ka++, kb++;
            if (ka < a->npaths && kb < b->npaths)
                return npyl_loader_fail(
                    L, NPYLOAD_EMISMATCH,
                    "field '%s' holds %" PRId64 " samples, field '%s' holds %" PRId64
                    "; they part at %s (%" PRId64 " samples) vs %s (%" PRId64 " samples)",
                    a->name, n0, b->name, n, a->paths[ka], a->files[ka].count,
                    b->paths[kb], b->files[kb].count);
            return npyl_loader_fail(L, NPYLOAD_EMISMATCH,
                                    "field '%s' holds %" PRId64 " samples (%zu files), "
                                    "field '%s' holds %" PRId64 " (%zu files)",
                                    a->name, n0, a->npaths, b->name, n, b->npaths);
        }
    }
    L->n = n0;
    return load_sources(L);
}
