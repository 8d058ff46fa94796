/* npyload-bench, the ceilings: what the machine itself gives on the same
 * bytes, measured in the same run as the loader (bench/README.md), by the
 * library's npyload_loader_ceiling over a loader of the same fields, so a
 * ceiling and the loader share one reader (lib/io) and users get the same
 * numbers from C or Python (npyload.copy_ceiling):
 *   pread_copy     threads pread the samples the loader reads, in its order
 *   gather_copy    threads memcpy the same samples from the files mapped once
 *   odirect_uring  (--cold) io_uring O_DIRECT reads of the files' data,
 *                  1 MiB blocks, depth 32, after eviction
 * h2d_pinned is in npyload_bench_gpu.c. */
#include "npyload_bench_measure.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A started loader over ctx's files (every field, every file, as read),
 * one row a batch unless `batch` says, no worker thread: what the library's
 * ceilings read. NULL with the reason in note. */
static npyload_loader *ceiling_loader(const nb_ctx *ctx, const nb_config *cfg, int64_t batch,
                                      char *note, size_t len)
{
    npyload_loader *L = NULL;
    int rc = npyload_loader_create(&L);
    for (int k = 0; rc == 0 && k < ctx->nfields; k++) {
        const nb_data *d = &ctx->data[k];
        const char **paths = calloc(d->nfiles ? d->nfiles : 1, sizeof *paths);
        if (!paths) {
            rc = -ENOMEM;
            break;
        }
        for (size_t i = 0; i < d->nfiles; i++)
            paths[i] = d->files[i].path;
        const int src = nb_field_source(cfg, k); /* --source: the loader's mixture */
        if (src >= 0 && (k == 0 || cfg->fields[k - 1].source != src))
            rc = npyload_loader_add_source(L, cfg->sources[src]);
        if (rc == 0)
            rc = npyload_loader_add_field_files(L, cfg->fields[k].name, paths, d->nfiles);
        free(paths);
    }
    if (rc == 0 && cfg->nsources && cfg->weights_given)
        rc = npyload_loader_set_weights(L, cfg->weights, (size_t)cfg->nsources);
    const struct { npyload_option opt; int64_t v; } set[] = {
        {NPYLOAD_OPT_BATCH_SIZE, batch}, {NPYLOAD_OPT_SHUFFLE, cfg->shuffle},
        {NPYLOAD_OPT_NUM_WORKERS, NPYLOAD_WORKERS_SYNC}, {NPYLOAD_OPT_PREFETCH, 1},
        {NPYLOAD_OPT_READ_AHEAD, -1}, {NPYLOAD_OPT_ALIGN, 1},
    };
    for (size_t i = 0; rc == 0 && i < sizeof set / sizeof set[0]; i++)
        rc = npyload_loader_set(L, set[i].opt, set[i].v);
    if (rc == 0)
        rc = npyload_loader_start(L);
    if (rc) {
        snprintf(note, len, "%s: skipped", L ? npyload_loader_errmsg(L) : npyload_strerror(rc));
        npyload_loader_destroy(L);
        return NULL;
    }
    return L;
}

/* The library's ceiling `kind` over L into out (named `name`). */
static void measure(npyload_loader *L, npyload_ceiling_kind kind, int threads, double seconds,
                    nb_ceiling *out)
{
    npyload_ceiling c;
    int rc = npyload_loader_ceiling(L, kind, threads, seconds, &c, sizeof c);
    if (rc) {
        snprintf(out->note, sizeof out->note, "%s: skipped", npyload_loader_errmsg(L));
        return;
    }
    out->measured = c.gbps > 0;
    out->gbps = c.gbps;
    out->threads = c.threads;
    out->bytes = c.bytes;
    out->seconds = c.seconds;
}

static void ceiling_copy(const nb_ctx *ctx, const nb_config *cfg, int threads, double seconds,
                         int gather, nb_ceiling *out)
{
    snprintf(out->name, sizeof out->name, gather ? "gather_copy" : "pread_copy");
    out->threads = threads;
    npyload_loader *L = ceiling_loader(ctx, cfg, cfg->batch_size, out->note, sizeof out->note);
    if (!L)
        return;
    measure(L, gather ? NPYLOAD_CEILING_GATHER : NPYLOAD_CEILING_PREAD, threads, seconds, out);
    npyload_loader_destroy(L);
    if (!out->measured)
        return;
    if (gather) {
        snprintf(out->note, sizeof out->note,
                 "best of 3: %d threads memcpy the same samples, in the same order, from "
                 "the files mapped once (shared, warm) into batch-sized buffers, %s",
                 threads, cfg->cold ? "page cache after a warm-up pass" : "page cache");
        return;
    }
    snprintf(out->note, sizeof out->note,
             "best of 3: %d threads pread the same samples (one read per sample and field) "
             "into batch-sized buffers, %s", threads,
             cfg->cold ? "page cache after a warm-up pass (the hot reference; --cold "
                         "runs compare with odirect_uring)" : "page cache");
}

void nb_ceiling_copy(const nb_ctx *ctx, const nb_config *cfg, int threads, double seconds,
                     nb_ceiling *out)
{
    ceiling_copy(ctx, cfg, threads, seconds, 0, out);
}

void nb_ceiling_gather(const nb_ctx *ctx, const nb_config *cfg, int threads, double seconds,
                       nb_ceiling *out)
{
    ceiling_copy(ctx, cfg, threads, seconds, 1, out);
}

void nb_ceiling_odirect(nb_ctx *ctx, const nb_config *cfg, double seconds, nb_ceiling *out)
{
    snprintf(out->name, sizeof out->name, "odirect_uring");
    out->threads = 1;
    npyload_loader *L = ceiling_loader(ctx, cfg, 1, out->note, sizeof out->note);
    if (!L)
        return;
    nb_evict_all(ctx, 0);
    measure(L, NPYLOAD_CEILING_DIRECT, 1, seconds, out);
    npyload_loader_destroy(L);
    if (out->measured)
        snprintf(out->note, sizeof out->note, "O_DIRECT io_uring reads of the files' data "
                 "(lib/io), 1 MiB blocks, depth 32, after eviction");
}
