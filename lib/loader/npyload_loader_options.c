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
    case NPYLOAD_OPT_ALIGN:
    case NPYLOAD_OPT_ON_ERROR:
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
    case NPYLOAD_OPT_MAX_ERRORS:
        if (v < 0)
            return range_fail(L, opt, v, ">= 0 samples (0 = no limit)");
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
