/* Loader setup, options, validation and teardown: the rare paths. The hot
 * path (workers, next, release) is in npyload_pipeline.c. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "npyload_loader_internal.h"

#define DEFAULT_WORKERS 2
#define DEFAULT_WINDOW 8
#define DEFAULT_QUEUE_DEPTH 32
#define MAX_WORKERS 256
#define MAX_PREFETCH 1024
#define MAX_QUEUE_DEPTH 4096
#define DEV_ALIGN 256u

int npyl_loader_fail(npyload_loader *L, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->errmsg, sizeof L->errmsg, fmt, ap);
    va_end(ap);
    return code;
}

int npyl_in_child(const npyload_loader *L) { return L->pid != getpid(); }

int npyl_loader_forked(npyload_loader *L)
{
    if (!npyl_in_child(L))
        return 0;
    snprintf(L->errmsg, sizeof L->errmsg, "%s", NPYL_FORKED_MSG);
    return NPYLOAD_EFORKED;
}

/* The option's name from the table, or NULL for a value not in it. */
static const char *opt_name(int opt)
{
    switch (opt) {
#define NPYL_XX_NAME(name, value, doc)                                         \
    case NPYLOAD_OPT_##name:                                                   \
        return #name;
        NPYLOAD_OPTION_MAP(NPYL_XX_NAME)
#undef NPYL_XX_NAME
    default:
        return NULL;
    }
}

/* The table's values index L->opt: each must be below NPYL_NUM_OPTS. */
#define NPYL_XX_CHECK(name, value, doc)                                        \
    _Static_assert((value) > 0 && (value) < NPYL_NUM_OPTS,                     \
                   "option " #name " outside 1 .. NPYL_NUM_OPTS - 1");
NPYLOAD_OPTION_MAP(NPYL_XX_CHECK)
#undef NPYL_XX_CHECK

int npyload_loader_create(npyload_loader **out)
{
    if (!out)
        return NPYLOAD_EINVAL;
    *out = NULL;
    npyload_loader *L = calloc(1, sizeof *L);
    if (!L)
        return -ENOMEM;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->work_cv, &ca);
    pthread_cond_init(&L->ready_cv, &ca);
    pthread_cond_init(&L->dev_cv, &ca);
    pthread_condattr_destroy(&ca);
    L->opt[NPYLOAD_OPT_BATCH_SIZE] = 1;
    L->opt[NPYLOAD_OPT_WORLD_SIZE] = 1;
    L->opt[NPYLOAD_OPT_DEVICE] = -1;
    L->opt[NPYLOAD_OPT_PIN_MEMORY] = -1;
    L->device = -1;
    L->pid = getpid();
    *out = L;
    return 0;
}

/* ---- fields ---- */

static int check_new_field(npyload_loader *L, const char *name)
{
    if (L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "fields cannot be added after start");
    if (!name || !*name)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "a field needs a non-empty name");
    for (size_t i = 0; i < L->nfields; i++)
        if (strcmp(L->fields[i].name, name) == 0)
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "field '%s' was already added", name);
    return 0;
}

/* Takes ownership of paths (an npyl_glob_sorted-style array). */
static int push_field(npyload_loader *L, const char *name, char **paths, size_t n)
{
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
    L->errmsg[0] = 0;
    return 0;
}

int npyload_loader_add_field(npyload_loader *L, const char *name, const char *glob)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int frc = npyl_loader_forked(L);
    if (frc)
        return frc;
    int rc = check_new_field(L, name);
    if (rc)
        return rc;
    if (!glob || !*glob)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "field '%s': empty glob", name);
    char **paths, err[NPYL_ERRMSG_LEN - 128];
    size_t n;
    rc = npyl_glob_sorted(glob, &paths, &n, err, sizeof err);
    if (rc)
        return npyl_loader_fail(L, rc, "field '%s': %s", name, err);
    return push_field(L, name, paths, n);
}

int npyload_loader_add_field_files(npyload_loader *L, const char *name,
                                   const char *const *paths, size_t n)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int frc = npyl_loader_forked(L);
    if (frc)
        return frc;
    int rc = check_new_field(L, name);
    if (rc)
        return rc;
    if (!paths || n == 0)
        return npyl_loader_fail(L, NPYLOAD_ENOFILES, "field '%s': empty list of files", name);
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

/* ---- options ---- */

static int range_fail(npyload_loader *L, int opt, int64_t v, const char *range)
{
    return npyl_loader_fail(L, NPYLOAD_EINVAL, "option %s = %" PRId64 " out of range: %s",
                            opt_name(opt), v, range);
}

int npyload_loader_set(npyload_loader *L, npyload_option opt, int64_t v)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int frc = npyl_loader_forked(L);
    if (frc)
        return frc;
    if (!opt_name(opt))
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "unknown option %d", (int)opt);
    if (L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "option %s cannot change after start",
                                opt_name(opt));
    switch (opt) {
    case NPYLOAD_OPT_BATCH_SIZE:
        if (v < 1 || v > (INT64_C(1) << 31))
            return range_fail(L, opt, v, "1 .. 2^31 samples");
        break;
    case NPYLOAD_OPT_NUM_WORKERS:
        if (v < 0 || v > MAX_WORKERS)
            return range_fail(L, opt, v, "1 .. 256 (0 = default 2)");
        break;
    case NPYLOAD_OPT_PREFETCH:
        if (v < 0 || v > MAX_PREFETCH)
            return range_fail(L, opt, v, "1 .. 1024 slots (0 = default 2 x workers)");
        break;
    case NPYLOAD_OPT_SHUFFLE:
        if (v < NPYLOAD_SHUFFLE_NONE || v > NPYLOAD_SHUFFLE_LOCAL)
            return range_fail(L, opt, v, "0 (none), 1 (full) or 2 (local)");
        break;
    case NPYLOAD_OPT_DROP_LAST:
    case NPYLOAD_OPT_DIRECT_IO:
        if (v != 0 && v != 1)
            return range_fail(L, opt, v, "0 or 1");
        break;
    case NPYLOAD_OPT_RANK:
        if (v < 0)
            return range_fail(L, opt, v, ">= 0 and below WORLD_SIZE");
        break;
    case NPYLOAD_OPT_WORLD_SIZE:
        if (v < 1 || v > (INT64_C(1) << 24))
            return range_fail(L, opt, v, "1 .. 2^24");
        break;
    case NPYLOAD_OPT_IO_BACKEND:
        if (v < NPYLOAD_IO_AUTO || v > NPYLOAD_IO_MMAP)
            return range_fail(L, opt, v, "0 auto, 1 io_uring, 2 pread, 3 mmap");
        break;
    case NPYLOAD_OPT_DEVICE:
        if (v < -1 || v > 1024)
            return range_fail(L, opt, v, "-1 (host) or a CUDA device index 0 .. 1024");
        if (v >= 0) {
            char why[256] = "";
            if (!npyload_cuda_available((int)v, why, sizeof why))
                return npyl_loader_fail(L, NPYLOAD_ENOCUDA, "CUDA device %" PRId64
                                        " requested but unusable: %s", v, why);
        }
        break;
    case NPYLOAD_OPT_SHUFFLE_WINDOW:
        if (v < 0 || v > (INT64_C(1) << 31))
            return range_fail(L, opt, v, "files per window >= 1 (0 = default 8)");
        break;
    case NPYLOAD_OPT_QUEUE_DEPTH:
        if (v < 0 || v > MAX_QUEUE_DEPTH)
            return range_fail(L, opt, v, "1 .. 4096 (0 = default 32)");
        break;
    case NPYLOAD_OPT_PIN_MEMORY:
        if (v < -1 || v > 1)
            return range_fail(L, opt, v, "-1 auto, 0 never, 1 require");
        break;
    case NPYLOAD_OPT_SEED:
        break;
    }
    L->opt[opt] = v;
    L->errmsg[0] = 0;
    return 0;
}

int npyload_loader_get(const npyload_loader *L, npyload_option opt, int64_t *value)
{
    if (!L || !value || !opt_name(opt))
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    *value = L->opt[opt];
    if (!L->started)
        return 0;
    /* After start, what the loader runs with: defaults resolved. */
    switch (opt) {
    case NPYLOAD_OPT_NUM_WORKERS: *value = (int64_t)L->nworkers; break;
    case NPYLOAD_OPT_PREFETCH: *value = (int64_t)(L->nd ? L->nd : L->nh); break;
    case NPYLOAD_OPT_QUEUE_DEPTH: *value = (int64_t)L->queue_depth; break;
    case NPYLOAD_OPT_SHUFFLE_WINDOW: *value = L->op.window; break;
    case NPYLOAD_OPT_IO_BACKEND: *value = L->backend; break;
    case NPYLOAD_OPT_PIN_MEMORY: *value = L->pinned; break;
    default: break;
    }
    return 0;
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

/* Reads the headers of field f's files, checks they agree, and records the
 * files in the io table. *io_next is the next free io_files index; *samples
 * receives the field's total. */
static int load_field(npyload_loader *L, npyl_field *f, size_t *io_next, int64_t *samples)
{
    char err[NPYL_ERRMSG_LEN];
    f->files = calloc(f->npaths, sizeof *f->files);
    if (!f->files)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    int64_t total = 0;
    for (size_t k = 0; k < f->npaths; k++) {
        const char *path = f->paths[k];
        npyload_header h;
        int rc = npyload_read_header(path, &h, err, sizeof err);
        if (rc)
            return npyl_loader_fail(L, rc, "field '%s': %s", f->name, err);
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
        npyl_file_info *fi = &L->io_files[*io_next];
        rc = npyl_io_stat(path, fi);
        if (rc)
            return npyl_loader_fail(L, rc, "field '%s': %s: %s", f->name, path,
                                    npyload_strerror(rc));
        fi->path = path;
        f->files[k].io_index = (uint32_t)*io_next;
        f->files[k].first = total;
        f->files[k].count = h.shape[0];
        f->files[k].data_offset = h.data_offset;
        (*io_next)++;
        if (__builtin_add_overflow(total, h.shape[0], &total))
            return npyl_loader_fail(L, NPYLOAD_ETOOBIG, "field '%s': sample count overflows",
                                    f->name);
    }
    if (f->row_bytes == 0)
        return npyl_loader_fail(L, NPYLOAD_EUNSUPPORTED,
                                "field '%s': %s: samples of zero bytes", f->name, f->paths[0]);
    *samples = total;
    return 0;
}

static int validate_fields(npyload_loader *L)
{
    if (L->nfields == 0)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "no fields: add at least one before start");
    size_t nfiles = 0;
    for (size_t i = 0; i < L->nfields; i++)
        nfiles += L->fields[i].npaths;
    if (nfiles > UINT32_MAX)
        return npyl_loader_fail(L, NPYLOAD_ETOOBIG, "more than 2^32 files");
    L->io_files = calloc(nfiles, sizeof *L->io_files);
    if (!L->io_files)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    size_t io_next = 0;
    int64_t n0 = 0, n = 0;
    for (size_t i = 0; i < L->nfields; i++) {
        int rc = load_field(L, &L->fields[i], &io_next, &n);
        L->nio_files = io_next;
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
    return 0;
}

static int resolve_backend(npyload_loader *L)
{
    int want = (int)L->opt[NPYLOAD_OPT_IO_BACKEND];
    char why[256] = "";
    if (want == NPYLOAD_IO_MMAP && L->opt[NPYLOAD_OPT_DIRECT_IO])
        return npyl_loader_fail(L, NPYLOAD_EINVAL,
                                "DIRECT_IO needs the io_uring or pread backend, not mmap");
    if (want == NPYLOAD_IO_URING) {
        if (!npyl_io_uring_usable(why, sizeof why))
            return npyl_loader_fail(L, NPYLOAD_ENOURING,
                                    "io_uring backend requested but unusable: %s", why);
    } else if (want == NPYLOAD_IO_AUTO) {
        /* Probe once per loader: kernels, containers and seccomp profiles
         * refuse io_uring; pread on the worker threads is the fallback. */
        want = npyl_io_uring_usable(why, sizeof why) ? NPYLOAD_IO_URING : NPYLOAD_IO_PREAD;
    }
    L->backend = want;
    return 0;
}

/* Lays the fields out in a slot. With O_DIRECT, a field's region starts at an
 * address congruent to its first file's data offset modulo 4096, so that file
 * offsets and memory addresses of every row share their alignment and the
 * aligned middle of each run can be read with O_DIRECT straight into place
 * (rows a multiple of 4096 bytes keep that congruence for every run). */
static int plan_layout(npyload_loader *L)
{
    uint64_t B = (uint64_t)L->opt[NPYLOAD_OPT_BATCH_SIZE];
    uint64_t h = 0, d = 0;
    for (size_t i = 0; i < L->nfields; i++) {
        npyl_field *f = &L->fields[i];
        uint64_t bytes;
        if (npyl_mul_u64(B, f->row_bytes, &bytes))
            return npyl_loader_fail(L, NPYLOAD_ETOOBIG, "field '%s': batch bytes overflow",
                                    f->name);
        h = (h + NPYL_DIRECT_ALIGN - 1) / NPYL_DIRECT_ALIGN * NPYL_DIRECT_ALIGN;
        if (L->opt[NPYLOAD_OPT_DIRECT_IO])
            h += f->files[0].data_offset % NPYL_DIRECT_ALIGN;
        f->host_off = h;
        d = (d + DEV_ALIGN - 1) / DEV_ALIGN * DEV_ALIGN;
        f->dev_off = d;
        if (npyl_add_u64(h, bytes, &h) || npyl_add_u64(d, bytes, &d))
            return npyl_loader_fail(L, NPYLOAD_ETOOBIG, "batch bytes overflow");
    }
    L->host_slot_bytes = (h + NPYL_DIRECT_ALIGN - 1) / NPYL_DIRECT_ALIGN * NPYL_DIRECT_ALIGN;
    L->dev_slot_bytes = d;
    return 0;
}

static int init_slot(npyload_loader *L, npyl_slot *s, int device_slot)
{
    size_t B = (size_t)L->opt[NPYLOAD_OPT_BATCH_SIZE];
    s->indices = malloc(B * sizeof *s->indices);
    s->arrays = calloc(L->nfields, sizeof *s->arrays);
    s->errmsg = calloc(1, NPYL_ERRMSG_LEN);
    s->batch = calloc(1, sizeof *s->batch);
    if (!s->indices || !s->arrays || !s->errmsg || !s->batch)
        return npyl_loader_fail(L, -ENOMEM, "out of memory allocating slots");
    s->batch->L = L;
    s->batch->slot = s;
    s->batch->device_mode = device_slot;
    int rc;
    if (device_slot) {
        if ((rc = npyl_cuda_malloc(L->cuda, (void **)&s->mem, L->dev_slot_bytes)) ||
            (rc = npyl_cuda_event_create(L->cuda, &s->ev_done, 0)) ||
            (rc = npyl_cuda_event_create(L->cuda, &s->ev_release, 0)))
            return npyl_loader_fail(L, rc, "CUDA device %d: allocating a %" PRIu64
                                    "-byte device slot failed: %s", L->device,
                                    L->dev_slot_bytes, npyl_cuda_errmsg(L->cuda));
        return 0;
    }
    if (L->pinned) {
        rc = npyl_cuda_host_alloc(L->cuda, (void **)&s->mem, L->host_slot_bytes);
        if (rc == 0)
            return 0;
        if (L->opt[NPYLOAD_OPT_PIN_MEMORY] == 1)
            return npyl_loader_fail(L, rc, "pinning a %" PRIu64 "-byte slot failed (%s); "
                                    "PIN_MEMORY=1 requires it", L->host_slot_bytes,
                                    npyl_cuda_errmsg(L->cuda));
        /* Pinning can fail under a locked-memory limit: fall back to pageable
         * memory for every slot so the stats tell one consistent story. */
        for (size_t i = 0; i < L->nh && &L->hslots[i] != s; i++) {
            npyl_cuda_host_free(L->cuda, L->hslots[i].mem);
            L->hslots[i].mem = npyl_alloc_aligned(L->host_slot_bytes, NPYL_DIRECT_ALIGN);
            if (!L->hslots[i].mem)
                return npyl_loader_fail(L, -ENOMEM, "out of memory allocating slots");
        }
        L->pinned = 0;
    }
    s->mem = npyl_alloc_aligned(L->host_slot_bytes, NPYL_DIRECT_ALIGN);
    if (!s->mem)
        return npyl_loader_fail(L, -ENOMEM, "cannot allocate %zu slots of %" PRIu64
                                " bytes (PREFETCH x batch bytes)", L->nh, L->host_slot_bytes);
    return 0;
}

static int alloc_slots(npyload_loader *L, size_t nworkers, size_t prefetch)
{
    int device_mode = L->device >= 0;
    /* Host mode: the slots are the batches. Device mode: PREFETCH device
     * slots are the batches; host staging slots only need to cover the reads
     * in flight plus one being copied. */
    L->nh = device_mode ? (prefetch < nworkers + 1 ? prefetch : nworkers + 1) : prefetch;
    L->nd = device_mode ? prefetch : 0;
    L->hslots = calloc(L->nh, sizeof *L->hslots);
    L->dslots = L->nd ? calloc(L->nd, sizeof *L->dslots) : NULL;
    if (!L->hslots || (L->nd && !L->dslots))
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    for (size_t i = 0; i < L->nh; i++) {
        int rc = init_slot(L, &L->hslots[i], 0);
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < L->nd; i++) {
        int rc = init_slot(L, &L->dslots[i], 1);
        if (rc)
            return rc;
    }
    return 0;
}

/* Descriptors open in this process now (/proc/self/fd, less the listing's
 * own), or -1 when /proc is not mounted. */
static int count_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n > 0 ? n - 1 : 0;
}

/* Sizes the per-worker open-file caches from what RLIMIT_NOFILE leaves, so
 * that reads never meet EMFILE mid-epoch. Each worker needs its io_uring
 * ring (one descriptor) and at least one open file (two with DIRECT_IO: a
 * buffered and an O_DIRECT descriptor); FD_RESERVE stay free for the
 * application. Workers share half of the rest, at most 256 files each.
 * Refuses with -EMFILE and the numbers when one file per worker does not
 * fit. */
#define FD_RESERVE 16
#define FD_UNKNOWN_OPEN 64 /* assumed open when /proc is missing */
static int plan_fd_budget(npyload_loader *L, size_t nworkers, unsigned *per_worker)
{
    struct rlimit rl;
    uint64_t soft = 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        soft = rl.rlim_cur;
    int open_now = count_open_fds();
    uint64_t used = open_now >= 0 ? (uint64_t)open_now : FD_UNKNOWN_OPEN;
    uint64_t ring = L->backend == NPYLOAD_IO_URING;
    uint64_t per_file = L->opt[NPYLOAD_OPT_DIRECT_IO] ? 2 : 1;
    uint64_t need = nworkers * (ring + per_file) + FD_RESERVE;
    uint64_t avail = soft > used ? soft - used : 0;
    if (need > avail)
        return npyl_loader_fail(L, -EMFILE, "%zu workers need at least %" PRIu64 " file "
                                "descriptors (%s%" PRIu64 " per open file each, %d kept "
                                "free), RLIMIT_NOFILE is %" PRIu64 " with %" PRIu64 " open: "
                                "raise it (ulimit -n) or use fewer workers", nworkers, need,
                                ring ? "1 io_uring ring + " : "", per_file, FD_RESERVE, soft,
                                used);
    uint64_t share = (avail - FD_RESERVE) / 2 / nworkers;
    uint64_t per = share > ring ? (share - ring) / per_file : 0;
    if (per < 1)
        per = 1; /* fits: need <= avail checked one file per worker */
    if (per > 256)
        per = 256;
    *per_worker = (unsigned)per;
    return 0;
}

static int check_state(npyload_loader *L, const npyload_state *st, int64_t n,
                       npyl_order_params *op, int64_t *first_seq);

static int open_cuda(npyload_loader *L)
{
    int dev = (int)L->opt[NPYLOAD_OPT_DEVICE];
    int pin = (int)L->opt[NPYLOAD_OPT_PIN_MEMORY];
    L->device = dev;
    if (dev < 0 && pin != 1)
        return 0; /* host mode never loads CUDA unless pinning is required */
    char why[256] = "";
    int rc = npyl_cuda_open(&L->cuda, dev >= 0 ? dev : 0, why, sizeof why);
    if (rc)
        return npyl_loader_fail(L, NPYLOAD_ENOCUDA, "%s: %s",
                                dev >= 0 ? "CUDA device requested but unusable"
                                         : "PIN_MEMORY=1 needs CUDA, which is unusable",
                                why);
    L->pinned = pin != 0;
    return 0;
}

int npyload_loader_start(npyload_loader *L)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int frc = npyl_loader_forked(L);
    if (frc)
        return frc;
    if (L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "the loader is already started");
    int64_t W = L->opt[NPYLOAD_OPT_WORLD_SIZE], R = L->opt[NPYLOAD_OPT_RANK];
    if (R >= W)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "RANK %" PRId64 " must be below "
                                "WORLD_SIZE %" PRId64, R, W);
    size_t nworkers = L->opt[NPYLOAD_OPT_NUM_WORKERS] ? (size_t)L->opt[NPYLOAD_OPT_NUM_WORKERS]
                                                       : DEFAULT_WORKERS;
    size_t prefetch = L->opt[NPYLOAD_OPT_PREFETCH] ? (size_t)L->opt[NPYLOAD_OPT_PREFETCH]
                                                    : 2 * nworkers;
    if (prefetch > MAX_PREFETCH)
        prefetch = MAX_PREFETCH;
    unsigned qd = L->opt[NPYLOAD_OPT_QUEUE_DEPTH] ? (unsigned)L->opt[NPYLOAD_OPT_QUEUE_DEPTH]
                                                   : DEFAULT_QUEUE_DEPTH;
    L->queue_depth = qd;
    int rc;
    if ((rc = validate_fields(L)) || (rc = resolve_backend(L)) || (rc = plan_layout(L)))
        goto fail;

    /* The order parameters are fixed from here on, but for the epoch. */
    npyl_order_params *op = &L->op;
    memset(op, 0, sizeof *op);
    op->n = L->n;
    op->shuffle = (int)L->opt[NPYLOAD_OPT_SHUFFLE];
    op->seed = L->opt[NPYLOAD_OPT_SEED];
    op->rank = R;
    op->world_size = W;
    op->drop_last = (int)L->opt[NPYLOAD_OPT_DROP_LAST];
    op->batch_size = L->opt[NPYLOAD_OPT_BATCH_SIZE];
    op->window = L->opt[NPYLOAD_OPT_SHUFFLE_WINDOW] ? L->opt[NPYLOAD_OPT_SHUFFLE_WINDOW]
                                                    : DEFAULT_WINDOW;
    {   /* kept for every mode: set_state may switch to LOCAL after start */
        npyl_field *f0 = &L->fields[0];
        int64_t *sizes = malloc(f0->npaths * sizeof *sizes);
        if (!sizes) {
            rc = npyl_loader_fail(L, -ENOMEM, "out of memory");
            goto fail;
        }
        for (size_t k = 0; k < f0->npaths; k++)
            sizes[k] = f0->files[k].count;
        op->file_sizes = sizes; /* owned by the loader; freed in npyl_loader_free */
        op->nfiles = f0->npaths;
    }
    {
        char oerr[256];
        if ((rc = npyl_order_check(op, oerr, sizeof oerr))) {
            npyl_loader_fail(L, rc, "%s", oerr);
            goto fail;
        }
    }
    L->delivered = npyl_order_delivered_len(op);
    L->nbatches = npyl_order_num_batches(op);
    {   /* sized for the larger of the drop_last cases: set_state may switch */
        npyl_order_params keep = *op;
        keep.drop_last = 0;
        int64_t cap = npyl_order_delivered_len(&keep);
        if (cap < L->delivered)
            cap = L->delivered;
        L->seqbuf = malloc((size_t)(cap ? cap : 1) * sizeof *L->seqbuf);
        L->seqspare = malloc((size_t)(cap ? cap : 1) * sizeof *L->seqspare);
    }
    if (!L->seqbuf || !L->seqspare) {
        rc = npyl_loader_fail(L, -ENOMEM, "out of memory for the epoch's order (%" PRId64
                              " samples)", L->delivered);
        goto fail;
    }

    if ((rc = open_cuda(L)) || (rc = alloc_slots(L, nworkers, prefetch)))
        goto fail;

    L->workers = calloc(nworkers, sizeof *L->workers);
    if (!L->workers) {
        rc = npyl_loader_fail(L, -ENOMEM, "out of memory");
        goto fail;
    }
    L->nworkers = nworkers;
    unsigned max_open = 1;
    if ((rc = plan_fd_budget(L, nworkers, &max_open)))
        goto fail;
    npyl_io_config cfg = {
        .backend = L->backend,
        .direct = (int)L->opt[NPYLOAD_OPT_DIRECT_IO],
        .queue_depth = qd,
        .max_open = max_open,
        .files = L->io_files,
        .nfiles = L->nio_files,
    };
    size_t B = (size_t)L->opt[NPYLOAD_OPT_BATCH_SIZE];
    for (size_t i = 0; i < nworkers; i++) {
        npyl_worker *w = &L->workers[i];
        w->L = L;
        char err[NPYL_ERRMSG_LEN];
        rc = npyl_io_create(&w->io, &cfg, err, sizeof err);
        if (rc) {
            npyl_loader_fail(L, rc, "worker %zu: %s", i, err);
            goto fail;
        }
        w->reqs = calloc(B * L->nfields, sizeof *w->reqs);
        if (!w->reqs) {
            rc = npyl_loader_fail(L, -ENOMEM, "out of memory");
            goto fail;
        }
        if (L->device >= 0 && ((rc = npyl_cuda_stream_create(L->cuda, &w->stream)) ||
                               (rc = npyl_cuda_event_create(L->cuda, &w->ev_start, 1)) ||
                               (rc = npyl_cuda_event_create(L->cuda, &w->ev_end, 1)))) {
            npyl_loader_fail(L, rc, "CUDA: creating a copy stream failed: %s",
                             npyl_cuda_errmsg(L->cuda));
            goto fail;
        }
    }

    npyl_order_params first = L->op;
    first.epoch = L->epoch;
    int64_t first_seq = 0;
    if (L->state_pending) {
        if ((rc = check_state(L, &L->pending, L->n, &first, &first_seq)))
            goto fail;
        L->state_pending = 0;
    }
    rc = npyl_pipeline_reset(L, &first, first_seq);
    if (rc) {
        npyl_loader_fail(L, rc, "out of memory building the epoch's order");
        goto fail;
    }
    L->started = 1;
    if ((rc = npyl_pipeline_start(L))) {
        L->started = 0;
        goto fail;
    }
    L->errmsg[0] = 0;
    return 0;
fail:
    /* Leave the loader as it was before start, so destroy stays simple and
     * the caller can read errmsg. */
    npyl_pipeline_stop(L);
    L->stopping = 0;
    npyl_loader_free_started(L); /* fields and options stay; errmsg too */
    return rc;
}

/* Frees a worker's io context (its descriptors and ring), requests and CUDA
 * stream/events. The worker's thread must be joined. */
static void free_worker(npyload_loader *L, npyl_worker *w)
{
    npyl_io_destroy(w->io);
    w->io = NULL;
    free(w->reqs);
    w->reqs = NULL;
    if (w->stream)
        npyl_cuda_stream_destroy(L->cuda, w->stream);
    if (w->ev_start)
        npyl_cuda_event_destroy(L->cuda, w->ev_start);
    if (w->ev_end)
        npyl_cuda_event_destroy(L->cuda, w->ev_end);
    w->stream = w->ev_start = w->ev_end = NULL;
}

/* Frees what a slot owns and leaves NULLs, so a second call is a no-op.
 * A device slot released on a stream waits for that stream's work first. */
static void free_slot(npyload_loader *L, npyl_slot *s, int device_slot)
{
    if (device_slot) {
        if (s->ev_release && s->release_pending)
            npyl_cuda_event_sync(L->cuda, s->ev_release);
        if (s->mem)
            npyl_cuda_free(L->cuda, s->mem);
        if (s->ev_done)
            npyl_cuda_event_destroy(L->cuda, s->ev_done);
        if (s->ev_release)
            npyl_cuda_event_destroy(L->cuda, s->ev_release);
    } else if (s->mem) {
        if (L->pinned)
            npyl_cuda_host_free(L->cuda, s->mem);
        else
            npyl_free_aligned(s->mem);
    }
    free(s->indices);
    free(s->arrays);
    free(s->errmsg);
    free(s->batch);
    s->mem = NULL;
    s->ev_done = s->ev_release = NULL;
    s->release_pending = 0;
    s->indices = NULL;
    s->arrays = NULL;
    s->errmsg = NULL;
    s->batch = NULL;
}

/* Frees every slot, or (keep_held) every slot but those the caller holds. */
static void free_slots(npyload_loader *L, int keep_held)
{
    npyl_slot *lists[2] = {L->hslots, L->dslots};
    size_t counts[2] = {L->nh, L->nd};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; lists[k] && i < counts[k]; i++)
            if (!keep_held || lists[k][i].state != SLOT_HELD)
                free_slot(L, &lists[k][i], k == 1);
}

/* Frees the per-start tables that neither a held batch nor its release
 * reads: the epoch's order and the file tables. */
static void free_tables(npyload_loader *L)
{
    free((void *)L->op.file_sizes);
    L->op.file_sizes = NULL;
    free(L->seqbuf);
    free(L->seqspare);
    L->seqbuf = L->seqspare = NULL;
    for (size_t i = 0; i < L->nfields; i++) {
        free(L->fields[i].files);
        L->fields[i].files = NULL;
    }
    free(L->io_files);
    L->io_files = NULL;
    L->nio_files = 0;
}

/* Frees what start allocated; the loader returns to its pre-start state. */
void npyl_loader_free_started(npyload_loader *L)
{
    /* May run on any user thread (destroy, the last release): switch to the
     * loader's device for the frees and back. */
    int prev = -1, entered = L->cuda && npyl_cuda_enter(L->cuda, &prev) == 0;
    for (size_t i = 0; i < L->nworkers; i++)
        free_worker(L, &L->workers[i]);
    free(L->workers);
    L->workers = NULL;
    L->nworkers = 0;
    free_slots(L, 0);
    free(L->hslots);
    free(L->dslots);
    L->hslots = L->dslots = NULL;
    L->nh = L->nd = 0;
    if (entered)
        npyl_cuda_leave(L->cuda, prev);
    npyl_cuda_close(L->cuda);
    L->cuda = NULL;
    L->pinned = 0;
    free_tables(L);
    L->started = 0;
}

/* destroy with batches held: keep only the HELD slots (and the CUDA context
 * and slot arrays their release needs); free the io contexts (descriptors,
 * rings), every other slot, host and device, and the tables. Called with mu
 * held and the workers joined, so no slot changes state meanwhile; release()
 * of a held batch waits on mu, then sees zombie. */
static void shed_for_zombie(npyload_loader *L)
{
    int prev = -1, entered = L->cuda && npyl_cuda_enter(L->cuda, &prev) == 0;
    for (size_t i = 0; i < L->nworkers; i++)
        free_worker(L, &L->workers[i]);
    free(L->workers);
    L->workers = NULL;
    L->nworkers = 0;
    free_slots(L, 1);
    if (entered)
        npyl_cuda_leave(L->cuda, prev);
    free_tables(L);
}

void npyl_loader_free(npyload_loader *L)
{
    npyl_loader_free_started(L);
    for (size_t i = 0; i < L->nfields; i++) {
        free(L->fields[i].name);
        npyl_free_paths(L->fields[i].paths, L->fields[i].npaths);
    }
    free(L->fields);
    pthread_cond_destroy(&L->work_cv);
    pthread_cond_destroy(&L->ready_cv);
    pthread_cond_destroy(&L->dev_cv);
    pthread_mutex_destroy(&L->mu);
    free(L);
}

void npyload_loader_destroy(npyload_loader *L)
{
    if (!L)
        return;
    if (npyl_in_child(L))
        return; /* fork() child: leaked on purpose, see npyload.h */
    npyl_pipeline_stop(L);
    pthread_mutex_lock(&L->mu);
    int keep = L->held > 0;
    if (keep) {
        shed_for_zombie(L);
        L->zombie = 1; /* the last npyload_batch_release frees the rest */
    }
    pthread_mutex_unlock(&L->mu);
    if (!keep)
        npyl_loader_free(L);
}

/* ---- epoch, state, queries ---- */

int npyload_loader_set_epoch(npyload_loader *L, uint64_t epoch)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int frc = npyl_loader_forked(L);
    if (frc)
        return frc;
    if (!L->started) {
        L->epoch = epoch;
        L->state_pending = 0;
        return 0;
    }
    pthread_mutex_lock(&L->mu);
    /* Nothing consumed yet of this very epoch: keep the batches already
     * prefetched (start; set_epoch(0) is the common pattern). */
    int keep = epoch == L->op.epoch && L->next_seq == 0 && L->gen_first_seq == 0 && !L->failed;
    npyl_order_params op = L->op;
    pthread_mutex_unlock(&L->mu);
    int rc = 0;
    if (!keep) {
        op.epoch = epoch;
        rc = npyl_pipeline_reset(L, &op, 0);
    }
    if (rc)
        return npyl_loader_fail(L, rc, "out of memory building the order of epoch %" PRIu64,
                                epoch);
    L->errmsg[0] = 0;
    return 0;
}

int64_t npyload_loader_num_batches(const npyload_loader *L)
{
    if (!L)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    return L->started ? L->nbatches : NPYLOAD_ESTATE;
}

int64_t npyload_loader_num_samples(const npyload_loader *L)
{
    if (!L)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    return L->started ? L->n : NPYLOAD_ESTATE;
}

const char *npyload_loader_errmsg(const npyload_loader *L)
{
    if (!L)
        return "";
    /* In a fork() child the message of the call that failed is in the
     * child's copy; before any call there, say what is wrong. */
    return (npyl_in_child(L) && !L->errmsg[0]) ? NPYL_FORKED_MSG : L->errmsg;
}

npyload_io_backend npyload_loader_backend(const npyload_loader *L)
{
    return (L && L->started) ? (npyload_io_backend)L->backend : NPYLOAD_IO_AUTO;
}

const char *npyload_backend_name(npyload_io_backend b)
{
    switch (b) {
    case NPYLOAD_IO_AUTO: return "auto";
    case NPYLOAD_IO_URING: return "io_uring";
    case NPYLOAD_IO_PREAD: return "pread";
    case NPYLOAD_IO_MMAP: return "mmap";
    }
    return "unknown";
}

int npyload_loader_get_state(const npyload_loader *L, npyload_state *out)
{
    if (!L || !out)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    if (!L->started)
        return NPYLOAD_ESTATE;
    npyload_loader *M = (npyload_loader *)L; /* the lock is not part of the value */
    pthread_mutex_lock(&M->mu);
    int64_t consumed = L->next_seq * L->op.batch_size;
    if (consumed > L->delivered)
        consumed = L->delivered;
    memset(out, 0, sizeof *out);
    out->version = NPYLOAD_STATE_VERSION;
    out->seed = L->op.seed;
    out->epoch = L->op.epoch;
    out->consumed = (uint64_t)consumed;
    out->num_samples = L->n;
    out->batch_size = L->op.batch_size;
    out->world_size = L->op.world_size;
    out->rank = L->op.rank;
    out->shuffle = L->op.shuffle;
    out->drop_last = L->op.drop_last;
    pthread_mutex_unlock(&M->mu);
    return 0;
}

/* Checks every field of a saved state (it may come from an untrusted
 * checkpoint) and computes the batch to resume at. Comparisons are made in
 * unsigned arithmetic after range checks, so no value can wrap into a
 * negative position. `n` is the loader's sample count, or -1 before start
 * (then the state's own num_samples sizes the check, and start compares it
 * with the fields). The order parameters the state selects (seed, shuffle,
 * drop_last, epoch) are stored in *op on success; other members of *op are
 * left as the caller set them. */
static int check_state(npyload_loader *L, const npyload_state *st, int64_t n,
                       npyl_order_params *op, int64_t *first_seq)
{
    if (st->version != NPYLOAD_STATE_VERSION)
        return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "saved state has version %" PRIu64
                                ", this library reads version %d", st->version,
                                NPYLOAD_STATE_VERSION);
    if (st->batch_size < 1 || st->batch_size > (INT64_C(1) << 31))
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: batch_size = %" PRId64
                                " out of range: 1 .. 2^31", st->batch_size);
    if (st->world_size < 1 || st->world_size > (INT64_C(1) << 24))
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: world_size = %" PRId64
                                " out of range: 1 .. 2^24", st->world_size);
    if (st->rank < 0 || st->rank >= st->world_size)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: rank = %" PRId64
                                " out of range: 0 .. world_size - 1 (%" PRId64 ")",
                                st->rank, st->world_size - 1);
    if (st->shuffle < NPYLOAD_SHUFFLE_NONE || st->shuffle > NPYLOAD_SHUFFLE_LOCAL)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: shuffle = %" PRId64
                                " out of range: 0 (none), 1 (full) or 2 (local)", st->shuffle);
    if (st->drop_last != 0 && st->drop_last != 1)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: drop_last = %" PRId64
                                " out of range: 0 or 1", st->drop_last);
    if (st->num_samples < 0)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: num_samples = %" PRId64
                                " out of range: >= 0", st->num_samples);
    /* seed (any int64) and epoch (any uint64) feed the generator as bit
     * patterns: every value is valid. */
    if (st->batch_size != L->opt[NPYLOAD_OPT_BATCH_SIZE])
        return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "saved state has batch size %" PRId64
                                ", the loader %" PRId64, st->batch_size,
                                L->opt[NPYLOAD_OPT_BATCH_SIZE]);
    if (st->world_size != L->opt[NPYLOAD_OPT_WORLD_SIZE])
        return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "saved state has world size %" PRId64
                                ", the loader %" PRId64 " (changing it on resume is not "
                                "supported)", st->world_size, L->opt[NPYLOAD_OPT_WORLD_SIZE]);
    if (n >= 0 && st->num_samples != n)
        return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "saved state is for %" PRId64
                                " samples, the fields hold %" PRId64, st->num_samples, n);
    /* The samples per epoch of a rank do not depend on the rank or the
     * permutation: size the check with the state's own N and split. */
    npyl_order_params sz = {.n = st->num_samples, .shuffle = NPYLOAD_SHUFFLE_NONE,
                            .rank = 0, .world_size = st->world_size,
                            .drop_last = (int)st->drop_last, .batch_size = st->batch_size};
    char oerr[256];
    int rc = npyl_order_check(&sz, oerr, sizeof oerr);
    if (rc)
        return npyl_loader_fail(L, rc, "saved state: %s", oerr);
    uint64_t delivered = (uint64_t)npyl_order_delivered_len(&sz); /* >= 0 */
    uint64_t B = (uint64_t)st->batch_size;
    if (st->consumed > delivered || (st->consumed % B != 0 && st->consumed != delivered))
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: consumed = %" PRIu64
                                " out of range: a multiple of batch_size %" PRIu64
                                " in 0 .. %" PRIu64 ", or %" PRIu64 " (this rank's samples "
                                "per epoch)", st->consumed, B, delivered, delivered);
    /* Round up: a short last batch counts as consumed. consumed <= delivered
     * < 2^63, so neither the sum nor the cast can overflow. */
    *first_seq = (int64_t)((st->consumed + B - 1) / B);
    op->seed = st->seed;
    op->shuffle = (int)st->shuffle;
    op->drop_last = (int)st->drop_last;
    op->epoch = st->epoch;
    return 0;
}

int npyload_loader_set_state(npyload_loader *L, const npyload_state *st)
{
    if (!L || !st)
        return NPYLOAD_EINVAL;
    int frc = npyl_loader_forked(L);
    if (frc)
        return frc;
    npyl_order_params op;
    int64_t first_seq;
    if (!L->started) {
        memset(&op, 0, sizeof op);
        int rc = check_state(L, st, -1, &op, &first_seq);
        if (rc)
            return rc;
        L->opt[NPYLOAD_OPT_SEED] = st->seed;
        L->opt[NPYLOAD_OPT_SHUFFLE] = st->shuffle;
        L->opt[NPYLOAD_OPT_DROP_LAST] = st->drop_last;
        L->pending = *st;
        L->state_pending = 1;
        L->epoch = st->epoch;
        L->errmsg[0] = 0;
        return 0;
    }
    /* Adopt the saved order parameters (installed under mu by reset). */
    pthread_mutex_lock(&L->mu);
    op = L->op;
    pthread_mutex_unlock(&L->mu);
    int rc = check_state(L, st, L->n, &op, &first_seq);
    if (rc)
        return rc;
    rc = npyl_pipeline_reset(L, &op, first_seq);
    if (rc)
        return npyl_loader_fail(L, rc, "out of memory restoring the state");
    L->opt[NPYLOAD_OPT_SEED] = st->seed;
    L->opt[NPYLOAD_OPT_SHUFFLE] = st->shuffle;
    L->opt[NPYLOAD_OPT_DROP_LAST] = st->drop_last;
    L->errmsg[0] = 0;
    return 0;
}

int npyload_loader_get_stats(const npyload_loader *L, npyload_stats *out)
{
    if (!L || !out)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    memset(out, 0, sizeof *out);
    out->bytes_read = atomic_load(&L->st_bytes);
    out->batches_delivered = atomic_load(&L->st_batches);
    out->samples_delivered = atomic_load(&L->st_samples);
    out->wait_ns = atomic_load(&L->st_wait_ns);
    out->io_ns = atomic_load(&L->st_io_ns);
    out->h2d_bytes = atomic_load(&L->st_h2d_bytes);
    out->h2d_ns = atomic_load(&L->st_h2d_ns);
    out->backend = L->started ? L->backend : NPYLOAD_IO_AUTO;
    out->pinned = L->pinned;
    out->direct_io = (int)L->opt[NPYLOAD_OPT_DIRECT_IO];
    out->device = L->device;
    out->slot_bytes = L->host_slot_bytes;
    out->num_slots = L->nh + L->nd;
    return 0;
}
