/* Loader options: the names generated from NPYLOAD_OPTION_MAP, the range
 * checks of npyload_loader_set() and npyload_loader_get(). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_loader_internal.h"

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

/* ---- options ---- */

/* The accepted values of every option: one table, read by the setter and by
 * npyload_option_range() (the Python binding checks its arguments against
 * it, in its own units). `what` is the range in words for messages. */
typedef struct opt_range {
    int64_t min, max;
    const char *what;
} opt_range;

static int range_of(int opt, opt_range *r)
{
    switch (opt) {
    case NPYLOAD_OPT_BATCH_SIZE:
        *r = (opt_range){1, INT64_C(1) << 31, "1 .. 2^31 samples"};
        return 0;
    case NPYLOAD_OPT_NUM_WORKERS:
        *r = (opt_range){NPYLOAD_AUTO, MAX_WORKERS,
                         "1 .. 256 (0 or -2 = auto, the default; -1 = synchronous reads "
                         "in next())"};
        return 0;
    case NPYLOAD_OPT_PREFETCH:
        *r = (opt_range){NPYLOAD_AUTO, MAX_PREFETCH, "1 .. 1024 slots (0 or -2 = auto, the "
                         "default)"};
        return 0;
    case NPYLOAD_OPT_MEMORY_BUDGET:
        *r = (opt_range){0, INT64_MAX, ">= 0 bytes (0 = default: a quarter of the memory "
                         "the process may use)"};
        return 0;
    case NPYLOAD_OPT_AUTO_TARGET:
        *r = (opt_range){0, 10000, "1 .. 10000 basis points of the loop (0 = default 200)"};
        return 0;
    case NPYLOAD_OPT_AUTO_CORES:
        *r = (opt_range){0, MAX_WORKERS, "1 .. 256 cores (0 = default: the cores the "
                         "process may run on)"};
        return 0;
    case NPYLOAD_OPT_AUTO_FORCE:
        *r = (opt_range){0, INT64_C(1) << 31, ">= 0 batches (0 = off)"};
        return 0;
    case NPYLOAD_OPT_SHUFFLE:
        *r = (opt_range){NPYLOAD_SHUFFLE_NONE, NPYLOAD_SHUFFLE_LOCAL,
                         "0 (none), 1 (full) or 2 (local)"};
        return 0;
    case NPYLOAD_OPT_DROP_LAST:
    case NPYLOAD_OPT_DIRECT_IO:
    case NPYLOAD_OPT_ALIGN:
    case NPYLOAD_OPT_ON_ERROR:
        *r = (opt_range){0, 1, "0 or 1"};
        return 0;
    case NPYLOAD_OPT_RANK:
        *r = (opt_range){0, (INT64_C(1) << 24) - 1, ">= 0 and below WORLD_SIZE"};
        return 0;
    case NPYLOAD_OPT_WORLD_SIZE:
        *r = (opt_range){1, INT64_C(1) << 24, "1 .. 2^24"};
        return 0;
    case NPYLOAD_OPT_IO_BACKEND:
        *r = (opt_range){NPYLOAD_IO_AUTO, NPYLOAD_IO_MMAP,
                         "0 auto, 1 io_uring, 2 pread, 3 mmap"};
        return 0;
    case NPYLOAD_OPT_DEVICE:
        *r = (opt_range){-1, 1024, "-1 (host) or a CUDA device index 0 .. 1024"};
        return 0;
    case NPYLOAD_OPT_SHUFFLE_WINDOW:
        *r = (opt_range){0, INT64_C(1) << 31, "files per window >= 1 (0 = default 8)"};
        return 0;
    case NPYLOAD_OPT_QUEUE_DEPTH:
        *r = (opt_range){0, MAX_QUEUE_DEPTH, "1 .. 4096 (0 = default 32)"};
        return 0;
    case NPYLOAD_OPT_PIN_MEMORY:
        *r = (opt_range){-1, 1, "-1 auto, 0 never, 1 require"};
        return 0;
    case NPYLOAD_OPT_READ_AHEAD:
        *r = (opt_range){-1, 1, "-1 off, 0 (default: on where a batch has work after its "
                            "reads) or 1 on"};
        return 0;
    case NPYLOAD_OPT_CACHE_FILL:
        *r = (opt_range){-1, 1, "-1 off, 0 (default: on when the cache keeps what it would "
                            "fill) or 1 on"};
        return 0;
    case NPYLOAD_OPT_DEVICE_KERNELS:
        *r = (opt_range){0, 2, "0 auto, 1 ahead of time, 2 NVRTC"};
        return 0;
    case NPYLOAD_OPT_SAMPLES_PER_EPOCH:
        *r = (opt_range){0, INT64_C(1) << 62, "0 (default: the sources' samples) .. 2^62"};
        return 0;
    case NPYLOAD_OPT_MAX_ERRORS:
        *r = (opt_range){0, INT64_MAX, ">= 0 samples (0 = no limit)"};
        return 0;
    case NPYLOAD_OPT_SEED:
        *r = (opt_range){INT64_MIN, INT64_MAX, "any int64"};
        return 0;
    }
    return NPYLOAD_EINVAL;
}

/* Every option of the table has a range (checked once, at compile time, by
 * the switch above covering the enum: -Wswitch warns on a missing case). */

int npyload_option_range(npyload_option opt, int64_t *min, int64_t *max)
{
    opt_range r;
    if (!min || !max || range_of(opt, &r))
        return NPYLOAD_EINVAL;
    *min = r.min;
    *max = r.max;
    return 0;
}

int64_t npyload_default_prefetch(int64_t num_workers)
{
    opt_range r;
    range_of(NPYLOAD_OPT_NUM_WORKERS, &r);
    if (num_workers < r.min || num_workers > r.max)
        return NPYLOAD_EINVAL;
    /* Sync mode has one worker context; slots: two per worker (auto: its
     * first worker count). */
    int64_t w = num_workers == NPYLOAD_WORKERS_SYNC ? 1
              : num_workers > 0 ? num_workers : DEFAULT_WORKERS;
    int64_t slots = 2 * w;
    return slots < MAX_PREFETCH ? slots : MAX_PREFETCH;
}

int npyload_loader_set(npyload_loader *L, npyload_option opt, int64_t v)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int frc = npyl_loader_forked(L);
    if (frc)
        return frc;
    opt_range r;
    if (!opt_name(opt) || range_of(opt, &r))
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "unknown option %d", (int)opt);
    if (L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "option %s cannot change after start",
                                opt_name(opt));
    if (v < r.min || v > r.max)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "option %s = %" PRId64
                                " out of range: %s", opt_name(opt), v, r.what);
    if (opt == NPYLOAD_OPT_DEVICE && v >= 0) {
        char why[256] = "";
        if (!npyload_cuda_available((int)v, why, sizeof why))
            return npyl_loader_fail(L, NPYLOAD_ENOCUDA, "CUDA device %" PRId64
                                    " requested but unusable: %s", v, why);
    }
    if (opt == NPYLOAD_OPT_ALIGN && v != L->opt[opt])
        npyl_loader_drop_loaded_fields(L); /* start checks the pairing again */
    L->opt[opt] = v;
    npyl_loader_clear(L);
    return 0;
}

int npyload_loader_set_path(npyload_loader *L, npyload_path_option which,
                            const char *path)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int frc = npyl_loader_forked(L);
    if (frc)
        return frc;
    if (which != NPYLOAD_PATH_NVRTC && which != NPYLOAD_PATH_KERNEL_CACHE)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "unknown path option %d", (int)which);
    const char *name = which == NPYLOAD_PATH_NVRTC ? "NVRTC" : "KERNEL_CACHE";
    if (L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "path %s cannot change after start",
                                name);
    char *copy = NULL;
    if (path && path[0]) {
        if (strnlen(path, NPYL_PATH_OPT_MAX) >= NPYL_PATH_OPT_MAX)
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "path %s: longer than %d bytes",
                                    name, NPYL_PATH_OPT_MAX - 1);
        if (!(copy = strdup(path)))
            return npyl_loader_fail(L, -ENOMEM, "out of memory");
    }
    free(L->paths[which]);
    L->paths[which] = copy;
    npyl_loader_clear(L);
    return 0;
}

int npyload_loader_set_remote(npyload_loader *L, const npyload_remote *cfg, size_t size)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int frc = npyl_loader_forked(L);
    if (frc)
        return frc;
    if (L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "the remote configuration cannot change "
                                "after start");
    npyload_remote mine;
    if (cfg) {
        int rc = npyl_sized_in(&mine, sizeof mine, cfg, size,
                               NPYL_SIZE_THROUGH(npyload_remote, retry_base_ms));
        if (rc)
            return npyl_loader_fail(L, rc, rc == NPYLOAD_EINVAL
                                    ? "npyload_loader_set_remote: size %zu is below the "
                                      "first layout of npyload_remote"
                                    : "npyload_loader_set_remote: a member this library "
                                      "does not know is set (size %zu)", size);
    }
    char err[NPYL_ERRMSG_LEN - 64];
    int rc = npyl_stores_configure(&L->stores, "remote", cfg ? &mine : NULL, err, sizeof err);
    if (rc)
        return npyl_loader_fail(L, rc, "%s", err);
    npyl_loader_drop_loaded_fields(L); /* probed with the other client */
    npyl_loader_clear(L);
    return 0;
}

int npyload_loader_set_interrupt(npyload_loader *L, int (*fn)(void *arg), void *arg)
{
    if (!L)
        return NPYLOAD_EINVAL;
    npyl_stores_set_interrupt(&L->stores, fn, arg);
    return 0;
}

void npyl_loader_order_of(const npyload_loader *L, npyl_order_params *op)
{
    memset(op, 0, sizeof *op);
    op->n = npyl_loader_epoch_len(L);
    op->shuffle = (int)L->opt[NPYLOAD_OPT_SHUFFLE];
    op->seed = L->opt[NPYLOAD_OPT_SEED];
    op->rank = L->opt[NPYLOAD_OPT_RANK];
    op->world_size = L->opt[NPYLOAD_OPT_WORLD_SIZE];
    op->drop_last = (int)L->opt[NPYLOAD_OPT_DROP_LAST];
    op->batch_size = L->opt[NPYLOAD_OPT_BATCH_SIZE];
    op->window = L->opt[NPYLOAD_OPT_SHUFFLE_WINDOW] ? L->opt[NPYLOAD_OPT_SHUFFLE_WINDOW]
                                                    : DEFAULT_WINDOW;
    op->epoch = L->epoch;
}

void npyl_loader_adopt_order(npyload_loader *L, int64_t seed, int64_t shuffle,
                             int64_t drop_last)
{
    L->opt[NPYLOAD_OPT_SEED] = seed;
    L->opt[NPYLOAD_OPT_SHUFFLE] = shuffle;
    L->opt[NPYLOAD_OPT_DROP_LAST] = drop_last;
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
    case NPYLOAD_OPT_NUM_WORKERS:
        *value = L->sync ? NPYLOAD_WORKERS_SYNC : (int64_t)npyl_auto_workers((npyl_auto *)&L->ctrl);
        break;
    case NPYLOAD_OPT_PREFETCH: *value = (int64_t)npyl_auto_slots((npyl_auto *)&L->ctrl); break;
    case NPYLOAD_OPT_MEMORY_BUDGET: *value = (int64_t)L->ctrl.budget; break;
    case NPYLOAD_OPT_QUEUE_DEPTH: *value = (int64_t)L->queue_depth; break;
    case NPYLOAD_OPT_SHUFFLE_WINDOW: *value = L->ring.op.window; break;
    case NPYLOAD_OPT_IO_BACKEND: *value = L->backend; break;
    case NPYLOAD_OPT_PIN_MEMORY: *value = L->dev.pinned; break;
    default: break;
    }
    return 0;
}

/* ---- transforms ---- */

/* The field named `field`, or NULL. */
static npyl_field *field_named(npyload_loader *L, const char *field)
{
    for (size_t i = 0; i < L->nfields; i++)
        if (!strcmp(L->fields[i].name, field))
            return &L->fields[i];
    return NULL;
}

/* t (size bytes, the caller's layout) checked on its own into *d, its
 * value arrays copied into copies[4] (mean, std, hflip_sign, vflip_sign).
 * `what` names the field (and the source) in messages. */
static int check_transform(npyload_loader *L, const char *what, const npyload_transform *t,
                           size_t size, npyload_transform *d, float *copies[4])
{
    /* The caller's struct may be older (shorter) or newer than ours: the
     * sized-struct rule of npyload.h. The first layout ends at
     * channels_last. */
    int src = npyl_sized_in(d, sizeof *d, t, size,
                            NPYL_SIZE_THROUGH(npyload_transform, channels_last));
    if (src == NPYLOAD_EINVAL)
        return npyl_loader_fail(L, src, "%s: set_transform: size %zu is smaller "
                                "than the first npyload_transform layout (%zu "
                                "bytes); pass sizeof(npyload_transform)", what,
                                size, NPYL_SIZE_THROUGH(npyload_transform, channels_last));
    if (src)
        return npyl_loader_fail(L, src, "%s: set_transform: the struct (%zu bytes) "
                                "sets members this library (%zu bytes, version %s) "
                                "does not know", what, size, sizeof *d,
                                NPYLOAD_VERSION_STRING);
    char err[512];
    int rc = npyl_transform_check(what, d, err, sizeof err);
    if (rc)
        return npyl_loader_fail(L, rc, "%s", err);
    /* The value arrays are the caller's: keep copies (the check above
     * refused a NULL array with a count, and counts over 2^24). */
    const float **arr[4] = {&d->mean, &d->std, &d->hflip_sign, &d->vflip_sign};
    const size_t cnt[4] = {d->n_mean, d->n_std, d->n_hflip_sign, d->n_vflip_sign};
    for (int k = 0; k < 4; k++) {
        if (!cnt[k])
            continue;
        if (!(copies[k] = malloc(cnt[k] * sizeof(float)))) {
            for (int j = 0; j < k; j++)
                free(copies[j]);
            return npyl_loader_fail(L, -ENOMEM, "out of memory");
        }
        memcpy(copies[k], *arr[k], cnt[k] * sizeof(float));
        *arr[k] = copies[k];
    }
    return 0;
}

/* set_transform's and set_source_transform's: t checked and copied into
 * *out and tvals[4] (their previous copies freed); t NULL: *out zeroed.
 * On an error nothing changes. */
static int keep_transform(npyload_loader *L, const char *what, const npyload_transform *t,
                          size_t size, npyload_transform *out, float *tvals[4])
{
    float *copies[4] = {NULL, NULL, NULL, NULL};
    npyload_transform d;
    memset(&d, 0, sizeof d);
    int rc = t ? check_transform(L, what, t, size, &d, copies) : 0;
    if (rc)
        return rc;
    *out = d;
    for (int k = 0; k < 4; k++) {
        free(tvals[k]);
        tvals[k] = copies[k];
    }
    return 0;
}

int npyload_loader_set_transform(npyload_loader *L, const char *field,
                                 const npyload_transform *t, size_t size)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int frc = npyl_loader_forked(L);
    if (frc)
        return frc;
    if (!field)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "set_transform: field name is NULL");
    npyl_field *f = field_named(L, field);
    if (!f)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "set_transform: no field named '%s' "
                                "(add the field first)", field);
    if (L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "%s: a transform cannot change after "
                                "start", field);
    int rc = keep_transform(L, field, t, size, &f->tdesc, f->tvals);
    if (rc)
        return rc;
    f->has_transform = t != NULL;
    npyl_loader_clear(L);
    return 0;
}

int npyload_loader_set_source_transform(npyload_loader *L, const char *source,
                                        const char *field, const npyload_transform *t,
                                        size_t size)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int frc = npyl_loader_forked(L);
    if (frc)
        return frc;
    if (!source || !field)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "set_source_transform: %s name is NULL",
                                source ? "field" : "source");
    size_t k = 0;
    while (k < L->nsources && strcmp(L->src_names[k], source))
        k++;
    if (k == L->nsources)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "set_source_transform: no source named "
                                "'%s' (add the source first: npyload_loader_add_source)",
                                source);
    npyl_field *f = field_named(L, field);
    if (!f)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "set_source_transform: source '%s': no "
                                "field named '%s' (add the field first)", source, field);
    if (L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "source '%s', field '%s': a transform "
                                "cannot change after start", source, field);
    if (f->nsxf < L->nsources) {
        npyl_sxf *grown = realloc(f->sxf, L->nsources * sizeof *grown);
        if (!grown)
            return npyl_loader_fail(L, -ENOMEM, "out of memory");
        memset(grown + f->nsxf, 0, (L->nsources - f->nsxf) * sizeof *grown);
        f->sxf = grown;
        f->nsxf = L->nsources;
    }
    char what[512];
    snprintf(what, sizeof what, "%.200s (source '%.200s')", field, source);
    npyl_sxf *x = &f->sxf[k];
    int rc = keep_transform(L, what, t, size, &x->tdesc, x->tvals);
    if (rc)
        return rc;
    x->set = t != NULL;
    npyl_loader_clear(L);
    return 0;
}
