/* npyload-bench, the ceilings: what the machine itself gives on the same
 * bytes, measured in the same run as the loader (bench/README.md). Every
 * ceiling reads through the library's own io layer (lib/io, through
 * tools/support), so a ceiling and the loader share one reader:
 *   pread_copy     threads pread the samples the loader reads, in its order
 *                  (lib/io's pread backend, the gather path off)
 *   gather_copy    threads memcpy the same samples, in the same order, from
 *                  the files mapped once (lib/io's mmap backend: small rows,
 *                  no syscall per row)
 *   odirect_uring  (--cold) lib/io's io_uring backend, depth 32, reads the
 *                  files' data with O_DIRECT in 1 MiB blocks
 * h2d_pinned is in npyload_bench_gpu.c. */
#include "npyload_bench_measure.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every file of every field, in one table for a support io context; a
 * field's files start at base[k]. */
typedef struct file_table {
    const char **paths;
    size_t n;
    size_t base[NB_MAX_FIELDS];
} file_table;

static int table_make(const nb_ctx *ctx, file_table *t)
{
    size_t n = 0;
    for (int k = 0; k < ctx->nfields; k++)
        n += ctx->data[k].nfiles;
    t->paths = calloc(n ? n : 1, sizeof *t->paths);
    if (!t->paths)
        return -1;
    t->n = 0;
    for (int k = 0; k < ctx->nfields; k++) {
        t->base[k] = t->n;
        for (size_t i = 0; i < ctx->data[k].nfiles; i++)
            t->paths[t->n++] = ctx->data[k].files[i].path;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* pread_copy / gather_copy: the same bytes, same per-sample runs, in order    */
/* ------------------------------------------------------------------------ */

typedef struct copy_ctx {
    const nb_ctx *ctx;
    const file_table *table;
    const int64_t *order;
    int64_t n;
    int batch;
    int nfields;
    uint64_t batch_bytes;
    uint64_t deadline;
    atomic_llong next_batch;
    atomic_ullong bytes;
    atomic_int failed;
    char **bufs;                /* one batch buffer per thread, touched before timing */
    npyload_support_io **ios;   /* one io context per thread, as the loader's workers */
    npyload_support_req **reqs; /* one request list per thread */
    atomic_int next_buf;
    char err[200];
} copy_ctx;

static void *copy_thread(void *arg)
{
    copy_ctx *c = arg;
    int me = atomic_fetch_add(&c->next_buf, 1);
    npyload_support_req *reqs = c->reqs[me];
    int64_t nb = (c->n + c->batch - 1) / c->batch;
    uint64_t local = 0;
    for (;;) {
        int64_t b = atomic_fetch_add(&c->next_batch, 1);
        if (nb_now_ns() >= c->deadline)
            break;
        int64_t i0 = (b % nb) * c->batch;
        int64_t i1 = i0 + c->batch < c->n ? i0 + c->batch : c->n;
        char *dst = c->bufs[me];
        size_t nr = 0;
        for (int k = 0; k < c->nfields; k++) {
            const nb_data *bf = &c->ctx->data[k];
            for (int64_t i = i0; i < i1; i++) {
                const nb_file *f = nb_sample_file(bf, c->order[i]);
                reqs[nr++] = (npyload_support_req){
                    .file = (uint32_t)(c->table->base[k] + (size_t)(f - bf->files)),
                    .offset = f->data_offset +
                              (uint64_t)(c->order[i] - f->first) * bf->sample_bytes,
                    .len = bf->sample_bytes, .dst = dst};
                dst += bf->sample_bytes;
            }
        }
        char err[200];
        if (npyload_support_io_read(c->ios[me], reqs, nr, err, sizeof err) != 0) {
            if (!atomic_exchange(&c->failed, 1))
                snprintf(c->err, sizeof c->err, "%s", err);
            return NULL;
        }
        local += (uint64_t)(dst - c->bufs[me]);
    }
    atomic_fetch_add(&c->bytes, local);
    return NULL;
}

/* A short warm-up pass (first touch of the buffers, readahead state), then
 * three measured passes: the best one is the ceiling (others share this
 * machine; a ceiling is what it can give, not an average). @return : the
 * best GB/s; out->seconds and out->bytes describe that pass. */
static double copy_passes(copy_ctx *c, pthread_t *t, int threads, double seconds,
                          nb_ceiling *out)
{
    double best = 0;
    for (int pass = 0; pass < 4; pass++) {
        atomic_store(&c->next_batch, 0);
        atomic_store(&c->bytes, 0);
        atomic_store(&c->next_buf, 0);
        uint64_t t0 = nb_now_ns();
        c->deadline = t0 + (uint64_t)((pass ? seconds / 3 : 0.2) * 1e9);
        int started = 0;
        for (int i = 0; i < threads; i++)
            if (pthread_create(&t[i], NULL, copy_thread, c) == 0)
                started++;
            else
                break;
        for (int i = 0; i < started; i++)
            pthread_join(t[i], NULL);
        uint64_t t1 = nb_now_ns();
        double s = (double)(t1 - t0) / 1e9;
        uint64_t bytes = atomic_load(&c->bytes);
        if (pass && s > 0 && (double)bytes / s / 1e9 > best) {
            best = (double)bytes / s / 1e9;
            out->seconds = s;
            out->bytes = bytes;
        }
    }
    return best;
}

static void copy_free(copy_ctx *c, int threads)
{
    for (int i = 0; i < threads; i++) {
        free(c->bufs ? c->bufs[i] : NULL);
        free(c->reqs ? c->reqs[i] : NULL);
        npyload_support_io_destroy(c->ios ? c->ios[i] : NULL);
    }
    free(c->bufs);
    free(c->reqs);
    free(c->ios);
}

static void ceiling_copy(const nb_ctx *ctx, const nb_config *cfg, int threads, double seconds,
                         int gather, nb_ceiling *out)
{
    snprintf(out->name, sizeof out->name, gather ? "gather_copy" : "pread_copy");
    out->threads = threads;
    int64_t *order = nb_make_order(ctx, cfg->num_samples, cfg->shuffle, cfg->batch_size, 0);
    file_table table = {0};
    if (!order || table_make(ctx, &table) != 0) {
        free(order);
        snprintf(out->note, sizeof out->note, "cannot build the order (out of memory)");
        return;
    }
    copy_ctx c = {.ctx = ctx, .table = &table, .order = order, .n = cfg->num_samples,
                  .batch = cfg->batch_size, .nfields = cfg->nfields,
                  .batch_bytes = cfg->batch_bytes};
    pthread_t *t = calloc((size_t)threads, sizeof *t);
    c.bufs = calloc((size_t)threads, sizeof *c.bufs);
    c.reqs = calloc((size_t)threads, sizeof *c.reqs);
    c.ios = calloc((size_t)threads, sizeof *c.ios);
    int ok = t && c.bufs && c.reqs && c.ios;
    for (int i = 0; ok && i < threads; i++) {
        if (posix_memalign((void **)&c.bufs[i], 4096, c.batch_bytes) != 0) {
            c.bufs[i] = NULL;
            ok = 0;
            break;
        }
        memset(c.bufs[i], 0, c.batch_bytes);
        c.reqs[i] = calloc((size_t)cfg->batch_size * (size_t)cfg->nfields, sizeof **c.reqs);
        ok = c.reqs[i] != NULL;
    }
    if (!ok)
        snprintf(out->note, sizeof out->note, "out of memory for %d batch buffers", threads);
    for (int i = 0; ok && i < threads; i++) {
        char err[200];
        if (npyload_support_io_create(table.paths, table.n,
                                      gather ? NPYLOAD_IO_MMAP : NPYLOAD_IO_PREAD, 0, 1,
                                      &c.ios[i], err, sizeof err) != 0) {
            snprintf(out->note, sizeof out->note, "%s: skipped", err);
            ok = 0;
        }
    }
    if (!ok) {
        copy_free(&c, threads);
        free(t);
        free(order);
        free(table.paths);
        return;
    }
    double best = copy_passes(&c, t, threads, seconds, out);
    copy_free(&c, threads);
    free(t);
    free(order);
    free(table.paths);
    if (atomic_load(&c.failed)) {
        snprintf(out->note, sizeof out->note, "a read failed: %s", c.err);
        return;
    }
    out->measured = best > 0;
    out->gbps = best;
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

/* ------------------------------------------------------------------------ */
/* odirect_uring (--cold)                                                     */
/* ------------------------------------------------------------------------ */

enum { OD_BS = 1 << 20, OD_QD = 32, OD_CALL = 8 * OD_QD };

/* Every file's data range, aligned down to 4 KiB at the start (the end is
 * the file's), in OD_BS blocks, OD_CALL per read call (OD_QD in flight, the
 * destinations cycling over OD_QD buffers: the bytes are not kept), until
 * all are read or the time is up. @return : bytes read, or -1 (note says
 * why); *all tells whether everything was read. */
static int64_t od_read(const nb_ctx *ctx, npyload_support_io *io, char *pool, double seconds,
                       int *all, char *note, size_t len)
{
    uint64_t deadline = nb_now_ns() + (uint64_t)(seconds * 1e9);
    npyload_support_req reqs[OD_CALL];
    size_t nr = 0;
    uint32_t file = 0;
    int64_t bytes = 0;
    *all = 0;
    for (int k = 0; k < ctx->nfields; k++)
        for (size_t i = 0; i < ctx->data[k].nfiles; i++, file++) {
            const nb_file *f = &ctx->data[k].files[i];
            uint64_t end = f->data_offset + f->data_bytes;
            for (uint64_t pos = f->data_offset & ~4095ull; pos < end; pos += OD_BS) {
                uint64_t n = end - pos < OD_BS ? end - pos : OD_BS;
                reqs[nr] = (npyload_support_req){.file = file, .offset = pos, .len = n,
                                                 .dst = pool + (nr % OD_QD) * (size_t)OD_BS};
                if (++nr < OD_CALL)
                    continue;
                if (npyload_support_io_read(io, reqs, nr, note, len) != 0)
                    return -1;
                for (size_t r = 0; r < nr; r++)
                    bytes += (int64_t)reqs[r].len;
                nr = 0;
                if (nb_now_ns() >= deadline)
                    return bytes;
            }
        }
    if (nr && npyload_support_io_read(io, reqs, nr, note, len) != 0)
        return -1;
    for (size_t r = 0; r < nr; r++)
        bytes += (int64_t)reqs[r].len;
    *all = 1;
    return bytes;
}

void nb_ceiling_odirect(nb_ctx *ctx, double seconds, nb_ceiling *out)
{
    snprintf(out->name, sizeof out->name, "odirect_uring");
    out->threads = 1;
    file_table table = {0};
    npyload_support_io *io = NULL;
    char *pool = NULL;
    char err[200] = "";
    if (table_make(ctx, &table) != 0 ||
        posix_memalign((void **)&pool, 4096, (size_t)OD_BS * OD_QD) != 0) {
        free(table.paths);
        snprintf(out->note, sizeof out->note, "out of memory");
        return;
    }
    memset(pool, 0, (size_t)OD_BS * OD_QD);
    int rc = npyload_support_io_create(table.paths, table.n, NPYLOAD_IO_URING, 1, OD_QD, &io,
                                       err, sizeof err);
    if (rc != 0) {
        snprintf(out->note, sizeof out->note, "%s: skipped", err);
    } else {
        nb_evict_all(ctx, 0);
        int all = 0;
        uint64_t t0 = nb_now_ns();
        int64_t bytes = od_read(ctx, io, pool, seconds, &all, out->note, sizeof out->note);
        out->seconds = (double)(nb_now_ns() - t0) / 1e9;
        if (bytes >= 0) {
            out->bytes = (uint64_t)bytes;
            out->measured = bytes > 0;
            out->gbps = out->measured ? (double)bytes / out->seconds / 1e9 : 0;
            snprintf(out->note, sizeof out->note,
                     "O_DIRECT io_uring reads of the files' data (lib/io), 1 MiB blocks, "
                     "depth 32, after eviction%s",
                     all ? " (all data read before the time bound)" : "");
        }
    }
    npyload_support_io_destroy(io);
    free(pool);
    free(table.paths);
}
