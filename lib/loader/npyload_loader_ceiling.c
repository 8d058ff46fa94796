/* npyload_loader_ceiling(): what this machine gives on the loader's own
 * bytes, measured through the loader's own readers (lib/store's local
 * store over lib/io), so that a ceiling and the loader share one reader
 * and can be compared in the same run (npyload-bench's ratios, a user
 * sizing a machine from Python):
 *   PREAD   threads pread the samples of the loader's current order, batch
 *           by batch, one request per sample and field (lib/io's pread,
 *           the gather path off) into a batch buffer each;
 *   GATHER  the same from the files mapped once (lib/io's mmap backend:
 *           a memcpy per row, no system call);
 *   DIRECT  one thread reads every file's data with O_DIRECT through
 *           io_uring, 1 MiB blocks, 32 in flight (the disk's ceiling; the
 *           caller evicts the page cache first when it wants it cold).
 * PREAD and GATHER take the best of three passes after a short warm-up
 * (a ceiling is what the machine can give, not an average). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_loader_internal.h"

enum { OD_BS = 1 << 20, OD_QD = 32, OD_CALL = 8 * OD_QD };

typedef struct ceil_run {
    const npyload_loader *L;
    const int64_t *order;     /* the rank's delivered sequence */
    int64_t n, batch;
    uint64_t batch_bytes;
    uint64_t deadline;
    _Atomic int64_t next_batch;
    _Atomic uint64_t bytes;
    _Atomic int failed;
    char err[NPYL_ERRMSG_LEN];
    pthread_mutex_t err_mu;
} ceil_run;

typedef struct ceil_thread {
    ceil_run *run;
    npyl_sctx io;
    uint8_t *buf;
    npyl_req *reqs;
    pthread_t t;
} ceil_thread;

static void *copy_main(void *arg)
{
    ceil_thread *th = arg;
    ceil_run *r = th->run;
    const npyload_loader *L = r->L;
    int64_t nb = (r->n + r->batch - 1) / r->batch;
    uint64_t local = 0;
    char err[NPYL_ERRMSG_LEN];
    while (npyl_now_ns() < r->deadline && !atomic_load(&r->failed)) {
        int64_t b = atomic_fetch_add(&r->next_batch, 1) % nb;
        int64_t i0 = b * r->batch, i1 = i0 + r->batch < r->n ? i0 + r->batch : r->n;
        size_t nr = 0;
        uint8_t *dst = th->buf;
        for (size_t fi = 0; fi < L->nfields; fi++) {
            const npyl_field *f = &L->fields[fi];
            for (int64_t i = i0; i < i1; i++) {
                int64_t s = r->order[i];
                const npyl_ffile *ff = &f->files[npyl_field_file_of(f, s)];
                th->reqs[nr++] = (npyl_req){ff->io_index,
                                            ff->data_offset + (uint64_t)(s - ff->first) *
                                                                  f->row_bytes,
                                            f->row_bytes, dst};
                dst += f->row_bytes;
            }
        }
        size_t bad = 0;
        if (npyl_sctx_read(&th->io, th->reqs, nr, &bad, NULL, err, sizeof err) != 0) {
            pthread_mutex_lock(&r->err_mu);
            if (!atomic_exchange(&r->failed, 1))
                snprintf(r->err, sizeof r->err, "%s", err);
            pthread_mutex_unlock(&r->err_mu);
            break;
        }
        local += (uint64_t)(dst - th->buf);
    }
    atomic_fetch_add(&r->bytes, local);
    return NULL;
}

/* The order the loader would deliver now: its current generation's when
 * started, else the one its options give for its first epoch. */
static int64_t *ceiling_order(npyload_loader *L, int64_t *n)
{
    npyl_order_params op;
    if (L->started) {
        npyl_position pos;
        npyl_slots_position(&L->ring, &pos);
        op = pos.op;
    } else {
        npyl_loader_order_of(L, &op);
        op.n = L->n; /* a mixture before start: its fields' samples in order */
    }
    /* LOCAL shuffling needs the file sizes: the first field's. */
    int64_t *sizes = malloc((L->fields[0].npaths ? L->fields[0].npaths : 1) * sizeof *sizes);
    if (!sizes)
        return NULL;
    for (size_t k = 0; k < L->fields[0].npaths; k++)
        sizes[k] = L->fields[0].files[k].count;
    op.file_sizes = sizes;
    op.nfiles = L->fields[0].npaths;
    *n = npyl_order_delivered_len(&op);
    int64_t *seq = malloc((size_t)(*n ? *n : 1) * sizeof *seq);
    /* A started mixture: its rows, as the ring builds them (ctl held). */
    npyl_mix_row *mrows = L->started && L->ring.mix
                        ? malloc((size_t)(*n ? *n : 1) * sizeof *mrows) : NULL;
    int bad = !seq || (L->started && L->ring.mix && !mrows);
    if (bad || (L->started ? npyl_slots_build(&L->ring, &op, seq, mrows)
                           : npyl_order_build(&op, seq)) != 0) {
        free(seq);
        seq = NULL;
    }
    free(mrows);
    free(sizes);
    return seq;
}

/* PREAD (gather 0) or GATHER (gather 1): best of three passes. */
static int ceiling_copy(npyload_loader *L, int gather, int threads, double seconds,
                        npyload_ceiling *out)
{
    ceil_run r = {.L = L, .batch = L->opt[NPYLOAD_OPT_BATCH_SIZE]};
    pthread_mutex_init(&r.err_mu, NULL);
    for (size_t fi = 0; fi < L->nfields; fi++)
        r.batch_bytes += L->fields[fi].row_bytes * (uint64_t)r.batch;
    int64_t *order = ceiling_order(L, &r.n);
    ceil_thread *th = calloc((size_t)threads, sizeof *th);
    int rc = order && th ? 0 : npyl_loader_fail(L, -ENOMEM, "out of memory");
    r.order = order;
    npyl_store_cfg cfg = {.backend = gather ? NPYLOAD_IO_MMAP : NPYLOAD_IO_PREAD,
                          .queue_depth = 1, .max_open = 256, .gather_max = -1};
    char err[NPYL_ERRMSG_LEN];
    for (int i = 0; rc == 0 && i < threads; i++) {
        th[i].run = &r;
        th[i].buf = npyl_alloc_aligned(r.batch_bytes ? r.batch_bytes : 1, NPYL_DIRECT_ALIGN);
        th[i].reqs = calloc((size_t)r.batch * L->nfields, sizeof *th[i].reqs);
        if (!th[i].buf || !th[i].reqs)
            rc = npyl_loader_fail(L, -ENOMEM, "out of memory for %d batch buffers", threads);
        else if ((rc = npyl_sctx_open(&th[i].io, &L->stores, &cfg, err, sizeof err)) != 0)
            npyl_loader_fail(L, rc, "%s", err);
        else
            memset(th[i].buf, 0, r.batch_bytes); /* touched before timing */
    }
    double best = 0;
    for (int pass = 0; rc == 0 && r.n > 0 && pass < 4; pass++) {
        atomic_store(&r.next_batch, 0);
        atomic_store(&r.bytes, 0);
        uint64_t t0 = npyl_now_ns();
        r.deadline = t0 + (uint64_t)((pass ? seconds / 3 : 0.2) * 1e9);
        int started = 0;
        for (int i = 0; i < threads; i++)
            if (pthread_create(&th[i].t, NULL, copy_main, &th[i]) == 0)
                started++;
            else
                break;
        for (int i = 0; i < started; i++)
            pthread_join(th[i].t, NULL);
        double s = (double)(npyl_now_ns() - t0) / 1e9;
        uint64_t bytes = atomic_load(&r.bytes);
        if (atomic_load(&r.failed))
            rc = npyl_loader_fail(L, -EIO, "a ceiling read failed: %s", r.err);
        else if (pass && s > 0 && (double)bytes / s / 1e9 > best) {
            best = (double)bytes / s / 1e9;
            out->seconds = s;
            out->bytes = bytes;
        }
    }
    for (int i = 0; th && i < threads; i++) {
        npyl_sctx_close(&th[i].io);
        npyl_free_aligned(th[i].buf);
        free(th[i].reqs);
    }
    free(th);
    free(order);
    pthread_mutex_destroy(&r.err_mu);
    out->gbps = best;
    out->threads = threads;
    return rc;
}

/* DIRECT: every file's data, aligned down to 4 KiB at its start, in 1 MiB
 * blocks, OD_CALL per read call (OD_QD in flight, the destinations cycling
 * over OD_QD buffers: the bytes are not kept), until all is read or the
 * time is up. */
static int ceiling_direct(npyload_loader *L, double seconds, npyload_ceiling *out)
{
    npyl_store_cfg cfg = {.backend = NPYLOAD_IO_URING, .direct = 1, .queue_depth = OD_QD,
                          .max_open = 256};
    char err[NPYL_ERRMSG_LEN];
    if (npyl_stores_auto_backend(err, sizeof err) != NPYLOAD_IO_URING)
        return npyl_loader_fail(L, NPYLOAD_ENOURING, "the DIRECT ceiling needs io_uring: %s",
                                err);
    npyl_sctx io;
    uint8_t *pool = npyl_alloc_aligned((size_t)OD_BS * OD_QD, NPYL_DIRECT_ALIGN);
    npyl_req *reqs = malloc(OD_CALL * sizeof *reqs);
    int rc = pool && reqs ? npyl_sctx_open(&io, &L->stores, &cfg, err, sizeof err) : -ENOMEM;
    if (rc) {
        if (pool && reqs)
            npyl_sctx_close(&io);
        npyl_free_aligned(pool);
        free(reqs);
        return npyl_loader_fail(L, rc, "%s", rc == -ENOMEM ? "out of memory" : err);
    }
    memset(pool, 0, (size_t)OD_BS * OD_QD);
    uint64_t t0 = npyl_now_ns(), deadline = t0 + (uint64_t)(seconds * 1e9), bytes = 0;
    size_t nr = 0;
    for (size_t fi = 0; rc == 0 && fi < L->nfields; fi++) {
        const npyl_field *f = &L->fields[fi];
        for (size_t k = 0; rc == 0 && k < f->npaths && npyl_now_ns() < deadline; k++) {
            const npyl_ffile *ff = &f->files[k];
            /* A .npy's data; a packed or narrowed file whole (what a cold
             * read of it moves). */
            int whole = ff->zst || ff->nx;
            uint64_t start = whole ? 0 : ff->data_offset;
            uint64_t end = whole ? L->stores.files[ff->io_index].size
                                 : ff->data_offset + (uint64_t)ff->count * f->row_bytes;
            for (uint64_t pos = start & ~4095ull; rc == 0 && pos < end; pos += OD_BS) {
                uint64_t n = end - pos < OD_BS ? end - pos : OD_BS;
                reqs[nr] = (npyl_req){ff->io_index, pos, n, pool + (nr % OD_QD) * (size_t)OD_BS};
                if (++nr < OD_CALL)
                    continue;
                size_t bad = 0;
                rc = npyl_sctx_read(&io, reqs, nr, &bad, &bytes, err, sizeof err);
                nr = 0;
            }
        }
    }
    size_t bad = 0;
    if (rc == 0 && nr)
        rc = npyl_sctx_read(&io, reqs, nr, &bad, &bytes, err, sizeof err);
    npyl_sctx_close(&io);
    npyl_free_aligned(pool);
    free(reqs);
    if (rc)
        return npyl_loader_fail(L, rc, "a ceiling read failed: %s", err);
    out->seconds = (double)(npyl_now_ns() - t0) / 1e9;
    out->bytes = bytes;
    out->gbps = out->seconds > 0 ? (double)bytes / out->seconds / 1e9 : 0;
    out->threads = 1;
    return 0;
}

/* Every file of every field is local, and with raw a plain .npy (the copy
 * ceilings read raw rows; remote files have their own measure). */
static int only_local(npyload_loader *L, int raw)
{
    for (size_t fi = 0; fi < L->nfields; fi++) {
        const npyl_field *f = &L->fields[fi];
        for (size_t k = 0; k < f->npaths; k++) {
            const npyl_ffile *ff = &f->files[k];
            if ((raw && (ff->zst || ff->nx)) ||
                L->stores.files[ff->io_index].store != L->stores.n - 1)
                return npyl_loader_fail(L, NPYLOAD_EUNSUPPORTED, "field '%s': %s: the %s "
                                        "ceiling reads local %sfiles", f->name, f->paths[k],
                                        raw ? "copy" : "disk", raw ? "plain .npy " : "");
        }
    }
    return 0;
}

int npyload_loader_ceiling(npyload_loader *L, npyload_ceiling_kind kind, int threads,
                           double seconds, npyload_ceiling *out, size_t size)
{
    if (!L || !out)
        return NPYLOAD_EINVAL;
    int rc = npyl_loader_forked(L);
    if (rc || (rc = npyl_ctl_enter(L)))
        return rc;
    npyload_ceiling mine;
    memset(&mine, 0, sizeof mine);
    if (kind < NPYLOAD_CEILING_PREAD || kind > NPYLOAD_CEILING_DIRECT)
        rc = npyl_loader_fail(L, NPYLOAD_EINVAL, "ceiling: kind %d: PREAD (1), GATHER (2) or "
                              "DIRECT (3)", (int)kind);
    else if (threads < 1 || threads > MAX_WORKERS)
        rc = npyl_loader_fail(L, NPYLOAD_EINVAL, "ceiling: threads = %d out of range: 1 .. %d",
                              threads, MAX_WORKERS);
    else if (!(seconds > 0 && seconds <= 3600))
        rc = npyl_loader_fail(L, NPYLOAD_EINVAL, "ceiling: seconds = %g out of range: > 0 and "
                              "<= 3600", seconds);
    else if (!L->started && !L->fields_loaded)
        rc = npyl_loader_fail(L, NPYLOAD_ESTATE, "ceiling: the fields are not read yet: start "
                              "the loader (or start and stop it) first");
    else if (L->opt[NPYLOAD_OPT_BATCH_SIZE] < 1)
        rc = npyl_loader_fail(L, NPYLOAD_EINVAL, "ceiling: BATCH_SIZE is not set");
    if (rc == 0)
        rc = only_local(L, kind != NPYLOAD_CEILING_DIRECT);
    if (rc == 0 && kind == NPYLOAD_CEILING_DIRECT)
        rc = ceiling_direct(L, seconds, &mine);
    else if (rc == 0)
        rc = ceiling_copy(L, kind == NPYLOAD_CEILING_GATHER, threads, seconds, &mine);
    npyl_ctl_leave(L);
    if (rc)
        return rc;
    return npyl_sized_out(out, size, &mine, sizeof mine,
                          NPYL_SIZE_THROUGH(npyload_ceiling, threads));
}
