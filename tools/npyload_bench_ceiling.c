/* npyload-bench, the ceilings: what the machine itself gives on the same
 * bytes, measured in the same run as the loader (bench/README.md).
 *   pread_copy     threads pread the samples the loader reads, in its order
 *   gather_copy    threads memcpy the same samples, in the same order, from
 *                  the files mapped once (small rows: no syscall per row)
 *   odirect_uring  (--cold) one io_uring of depth 32 reads the files' data
 *                  with O_DIRECT in 1 MiB blocks
 * h2d_pinned is in npyload_bench_gpu.c. */
#include "npyload_bench_measure.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef NPYLOAD_HAVE_URING
#include <liburing.h>
#endif

/* ------------------------------------------------------------------------ */
/* pread_copy: parallel pread copy of the same bytes, same per-sample runs     */
/* ------------------------------------------------------------------------ */

typedef struct copy_ctx {
    const nb_ctx *ctx;
    const int64_t *order;
    int64_t n;
    int batch;
    int nfields;
    uint64_t batch_bytes;
    uint64_t deadline;
    int64_t max_batches;
    atomic_llong next_batch;
    atomic_ullong bytes;
    atomic_int failed;
    char **bufs;       /* one batch buffer per thread, touched before timing */
    atomic_int next_buf;
    const uint8_t **maps[NB_MAX_FIELDS]; /* gather_copy: [field][file] */
} copy_ctx;

static void *copy_thread(void *arg)
{
    copy_ctx *c = arg;
    char *buf = c->bufs[atomic_fetch_add(&c->next_buf, 1)];
    int64_t nb = (c->n + c->batch - 1) / c->batch;
    uint64_t local = 0;
    for (;;) {
        int64_t b = atomic_fetch_add(&c->next_batch, 1);
        if (c->max_batches > 0 ? b >= c->max_batches : nb_now_ns() >= c->deadline)
            break;
        int64_t i0 = (b % nb) * c->batch;
        int64_t i1 = i0 + c->batch < c->n ? i0 + c->batch : c->n;
        char *dst = buf;
        for (int k = 0; k < c->nfields; k++) {
            const nb_data *bf = &c->ctx->data[k];
            for (int64_t i = i0; i < i1; i++) {
                const nb_file *f = nb_sample_file(bf, c->order[i]);
                off_t off = (off_t)(f->data_offset +
                                    (uint64_t)(c->order[i] - f->first) * bf->sample_bytes);
                if (c->maps[0]) {
                    memcpy(dst, c->maps[k][f - bf->files] + off, bf->sample_bytes);
                    dst += bf->sample_bytes;
                    local += bf->sample_bytes;
                    continue;
                }
                ssize_t r = pread(f->fd, dst, bf->sample_bytes, off);
                if (r != (ssize_t)bf->sample_bytes) {
                    atomic_store(&c->failed, 1);
                    return NULL;
                }
                dst += bf->sample_bytes;
                local += bf->sample_bytes;
            }
        }
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
        c->max_batches = 0;
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

/* Maps every file of every field (gather_copy). @return : 0, or -1 with the
 * reason in note; unmap_all undoes a partial map_all. */
static void unmap_all(const nb_ctx *ctx, copy_ctx *c)
{
    for (int k = 0; k < ctx->nfields; k++) {
        for (size_t i = 0; c->maps[k] && i < ctx->data[k].nfiles; i++)
            if (c->maps[k][i])
                munmap((void *)c->maps[k][i], ctx->data[k].files[i].file_bytes);
        free(c->maps[k]);
        c->maps[k] = NULL;
    }
}

static int map_all(const nb_ctx *ctx, copy_ctx *c, char *note, size_t len)
{
    for (int k = 0; k < ctx->nfields; k++) {
        const nb_data *d = &ctx->data[k];
        c->maps[k] = calloc(d->nfiles ? d->nfiles : 1, sizeof *c->maps[k]);
        if (!c->maps[k]) {
            snprintf(note, len, "out of memory");
            unmap_all(ctx, c);
            return -1;
        }
        for (size_t i = 0; i < d->nfiles; i++) {
            if (d->files[i].file_bytes == 0)
                continue;
            void *p = mmap(NULL, d->files[i].file_bytes, PROT_READ, MAP_SHARED,
                           d->files[i].fd, 0);
            if (p == MAP_FAILED) {
                snprintf(note, len, "%s: mmap failed (%s): skipped", d->files[i].path,
                         strerror(errno));
                unmap_all(ctx, c);
                return -1;
            }
            c->maps[k][i] = p;
        }
    }
    return 0;
}

static void ceiling_copy(const nb_ctx *ctx, const nb_config *cfg, int threads, double seconds,
                         int gather, nb_ceiling *out)
{
    snprintf(out->name, sizeof out->name, gather ? "gather_copy" : "pread_copy");
    out->threads = threads;
    int64_t *order = nb_make_order(ctx, cfg->num_samples, cfg->shuffle, cfg->batch_size, 0);
    if (!order) {
        snprintf(out->note, sizeof out->note, "cannot build the order (out of memory)");
        return;
    }
    copy_ctx c = {.ctx = ctx, .order = order, .n = cfg->num_samples, .batch = cfg->batch_size,
                  .nfields = cfg->nfields, .batch_bytes = cfg->batch_bytes};
    if (gather && map_all(ctx, &c, out->note, sizeof out->note) != 0) {
        free(order);
        return;
    }
    pthread_t *t = calloc((size_t)threads, sizeof *t);
    c.bufs = calloc((size_t)threads, sizeof *c.bufs);
    for (int i = 0; t && c.bufs && i < threads; i++) {
        if (posix_memalign((void **)&c.bufs[i], 4096, c.batch_bytes) != 0) {
            c.bufs[i] = NULL;
            break;
        }
        memset(c.bufs[i], 0, c.batch_bytes);
    }
    if (!t || !c.bufs || !c.bufs[threads - 1]) {
        for (int i = 0; c.bufs && i < threads; i++)
            free(c.bufs[i]);
        free(c.bufs);
        free(t);
        free(order);
        snprintf(out->note, sizeof out->note, "out of memory for %d batch buffers",
                 threads);
        unmap_all(ctx, &c);
        return;
    }
    double best = copy_passes(&c, t, threads, seconds, out);
    unmap_all(ctx, &c);
    for (int i = 0; i < threads; i++)
        free(c.bufs[i]);
    free(c.bufs);
    free(t);
    free(order);
    if (atomic_load(&c.failed)) {
        snprintf(out->note, sizeof out->note, "a pread failed or came back short");
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

#ifdef NPYLOAD_HAVE_URING
enum { OD_BS = 1 << 20, OD_QD = 32 };

typedef struct od_span {
    int fd;
    uint64_t off, end;
} od_span;

static void od_close(od_span *spans, size_t n)
{
    for (size_t i = 0; i < n; i++)
        close(spans[i].fd);
    free(spans);
}

/* The work list: every file's data range, aligned out to 4 KiB, each file
 * opened with O_DIRECT. @return : the number of spans, or -1 (note says why). */
static long od_spans(const nb_ctx *ctx, od_span **out, char *note, size_t len)
{
    size_t n = 0, total = 0;
    for (int k = 0; k < ctx->nfields; k++)
        total += ctx->data[k].nfiles;
    od_span *spans = calloc(total ? total : 1, sizeof *spans);
    if (!spans) {
        snprintf(note, len, "out of memory");
        return -1;
    }
    for (int k = 0; k < ctx->nfields; k++)
        for (size_t i = 0; i < ctx->data[k].nfiles; i++) {
            const nb_file *f = &ctx->data[k].files[i];
            int fd = open(f->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
            if (fd < 0) {
                snprintf(note, len, "%s: O_DIRECT open failed (%s): skipped", f->path,
                         strerror(errno));
                od_close(spans, n);
                return -1;
            }
            spans[n].fd = fd;
            spans[n].off = f->data_offset & ~4095ull;
            spans[n].end = (f->data_offset + f->data_bytes + 4095) & ~4095ull;
            n++;
        }
    *out = spans;
    return (long)n;
}

/* Reads the spans in OD_BS blocks, OD_QD in flight, until all are read or
 * the time is up. @return : bytes read, or -1 (note says why); *all tells
 * whether every span was read. */
static int64_t od_read(struct io_uring *ring, char *pool, const od_span *spans, size_t nspans,
                       double seconds, int *all, char *note, size_t len)
{
    uint64_t deadline = nb_now_ns() + (uint64_t)(seconds * 1e9);
    int64_t bytes = 0;
    size_t si = 0;
    uint64_t pos = nspans ? spans[0].off : 0;
    int inflight = 0, stop = 0, slot_free[OD_QD], nfree = OD_QD;
    for (int i = 0; i < OD_QD; i++)
        slot_free[i] = i;
    while (!stop || inflight) {
        struct io_uring_sqe *sqe;
        while (!stop && nfree > 0 && si < nspans && (sqe = io_uring_get_sqe(ring))) {
            int slot = slot_free[--nfree];
            uint64_t n = spans[si].end - pos < OD_BS ? spans[si].end - pos : OD_BS;
            io_uring_prep_read(sqe, spans[si].fd, pool + (size_t)slot * OD_BS, (unsigned)n, pos);
            io_uring_sqe_set_data64(sqe, (uint64_t)slot);
            inflight++;
            pos += n;
            if (pos >= spans[si].end && ++si < nspans)
                pos = spans[si].off;
        }
        stop |= si >= nspans;
        if (!inflight)
            break;
        io_uring_submit(ring);
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(ring, &cqe);
        if (rc < 0 || cqe->res < 0) {
            snprintf(note, len, "O_DIRECT read failed: %s", strerror(rc < 0 ? -rc : -cqe->res));
            return -1;
        }
        bytes += cqe->res;
        slot_free[nfree++] = (int)io_uring_cqe_get_data64(cqe);
        inflight--;
        io_uring_cqe_seen(ring, cqe);
        stop |= nb_now_ns() >= deadline;
    }
    *all = si >= nspans;
    return bytes;
}
#endif

void nb_ceiling_odirect(nb_ctx *ctx, double seconds, nb_ceiling *out)
{
    snprintf(out->name, sizeof out->name, "odirect_uring");
    out->threads = 1;
#ifndef NPYLOAD_HAVE_URING
    (void)ctx;
    (void)seconds;
    snprintf(out->note, sizeof out->note, "built without liburing: skipped");
#else
    struct io_uring ring;
    int rc = io_uring_queue_init(OD_QD, &ring, 0);
    if (rc < 0) {
        snprintf(out->note, sizeof out->note, "io_uring refused here (%s): skipped",
                 strerror(-rc));
        return;
    }
    char *pool = NULL;
    od_span *spans = NULL;
    long nspans = -1;
    if (posix_memalign((void **)&pool, 4096, (size_t)OD_BS * OD_QD) != 0) {
        pool = NULL;
        snprintf(out->note, sizeof out->note, "out of memory");
    } else {
        memset(pool, 0, (size_t)OD_BS * OD_QD);
        nb_evict_all(ctx, 0);
        nspans = od_spans(ctx, &spans, out->note, sizeof out->note);
    }
    if (nspans >= 0) {
        int all = 0;
        uint64_t t0 = nb_now_ns();
        int64_t bytes = od_read(&ring, pool, spans, (size_t)nspans, seconds, &all, out->note,
                                sizeof out->note);
        out->seconds = (double)(nb_now_ns() - t0) / 1e9;
        if (bytes >= 0) {
            out->bytes = (uint64_t)bytes;
            out->measured = bytes > 0;
            out->gbps = out->measured ? (double)bytes / out->seconds / 1e9 : 0;
            snprintf(out->note, sizeof out->note,
                     "O_DIRECT io_uring reads of the files' data, 1 MiB blocks, depth 32, "
                     "after eviction%s", all ? " (all data read before the time bound)" : "");
        }
        od_close(spans, (size_t)nspans);
    }
    free(pool);
    io_uring_queue_exit(&ring);
#endif
}
