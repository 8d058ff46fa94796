/* A worker's whole life: init and fini of its resources, the thread's main
 * loop, filling one batch (claim, read, transform or copy, publish) and the
 * synchronous step. Slot states change only through the slots file. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_loader_worker.h"

int npyl_worker_init(npyl_worker *w, size_t index, const npyl_work_env *env,
                     const npyl_worker_cfg *cfg, char *err, size_t errlen)
{
    const npyl_device *dv = env->dev;
    size_t nfields = env->rv->nfields;
    int pairs = cfg->ahead ? 2 : 1;
    w->env = env;
    w->index = index;
    char rerr[NPYL_ERRMSG_LEN - 64];
    int rc = npyl_read_ctx_init(&w->rd, env->rv, &cfg->io, cfg->rows, &cfg->zst, cfg->ahead,
                                rerr, sizeof rerr);
    if (rc && !w->rd.opened)
        return npyl_fail(err, errlen, rc, "worker %zu: %s", index, rerr);
    if (rc)
        return npyl_fail(err, errlen, rc, "%s", rerr);
    for (int i = 0; i < pairs; i++)
        if (!(w->dst[i] = calloc(nfields ? nfields : 1, sizeof *w->dst[i])))
            return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    /* One batch of the transformed fields' stored rows (two with
     * read-ahead): memory is workers x batch, independent of PREFETCH. */
    for (int i = 0; i < pairs && cfg->raw_bytes && cfg->host_raw; i++)
        if (!(w->raw[i] = npyl_alloc_aligned(cfg->raw_bytes, NPYL_DIRECT_ALIGN)))
            return npyl_fail(err, errlen, -ENOMEM, "cannot allocate the %" PRIu64 "-byte "
                             "transform buffer of worker %zu", cfg->raw_bytes, index);
    if (cfg->aug_bytes && !(w->aug = malloc(cfg->aug_bytes)))
        return npyl_fail(err, errlen, -ENOMEM, "cannot allocate the %" PRIu64 "-byte "
                         "augmentation row of worker %zu", cfg->aug_bytes, index);
    if (cfg->raw_bytes && cfg->dev_raw && dv->device >= 0 &&
        (rc = npyl_cuda_malloc(dv->cuda, &w->draw, cfg->raw_bytes)))
        return npyl_fail(err, errlen, rc, "CUDA device %d: allocating the %" PRIu64
                         "-byte transform buffer of worker %zu failed: %s", dv->device,
                         cfg->raw_bytes, index, npyl_cuda_errmsg(dv->cuda));
    if (dv->device >= 0 && (rc = npyl_cuda_stream_create(dv->cuda, &w->stream)))
        return npyl_fail(err, errlen, rc, "CUDA: creating a copy stream failed: %s",
                         npyl_cuda_errmsg(dv->cuda));
    return 0;
}

void npyl_worker_fini(npyl_worker *w)
{
    if (!w->env)
        return; /* never initialised */
    const npyl_device *dv = w->env->dev;
    npyl_read_ctx_fini(&w->rd);
    free(w->aug);
    w->aug = NULL;
    for (int i = 0; i < 2; i++) {
        free(w->dst[i]);
        w->dst[i] = NULL;
        npyl_free_aligned(w->raw[i]);
        w->raw[i] = NULL;
    }
    if (w->draw)
        npyl_cuda_free(dv->cuda, w->draw);
    w->draw = NULL;
    if (w->stream)
        npyl_cuda_stream_destroy(dv->cuda, w->stream);
    w->stream = NULL;
}

/* The arrays a slot's batch is handed out as: its rows of each field. */
static void fill_arrays(const npyl_work_env *env, npyl_slot *s, int device_slot)
{
    const npyl_read_view *rv = env->rv;
    for (size_t fi = 0; fi < rv->nfields; fi++) {
        const npyl_field *f = &rv->fields[fi];
        npyload_array *a = &s->arrays[fi];
        a->data = s->mem + (device_slot ? f->dev_off : f->host_off);
        a->ndim = f->sndim + 1;
        a->shape[0] = (int64_t)s->rows;
        /* The delivered shape: a crop changes the last two axes. */
        memcpy(a->shape + 1, npyl_field_transformed(f) ? f->tplan.sshape : f->sshape,
               sizeof(int64_t) * (size_t)f->sndim);
        a->device = device_slot ? env->dev->device : -1;
        a->nbytes = (size_t)(s->rows * f->out_row_bytes);
        if (npyl_field_transformed(f)) {
            /* The delivered dtype and layout (channels-last strides). */
            memcpy(a->descr, f->tplan.out_descr, sizeof a->descr);
            a->itemsize = f->tplan.out_itemsize;
            memcpy(a->strides, f->tplan.byte_strides, sizeof(int64_t) * (size_t)a->ndim);
            continue;
        }
        memcpy(a->descr, f->descr, sizeof a->descr);
        a->itemsize = f->itemsize;
        int64_t st = (int64_t)f->itemsize;
        for (int d = a->ndim - 1; d >= 0; d--) {
            a->strides[d] = st;
            st *= d ? f->sshape[d - 1] : 0;
        }
    }
}

/* Host transforms: the stored rows of each transformed field, read into
 * the raw buffer, become the slot's output rows. h->rows is the count
 * after the read (ON_ERROR skip may have compacted the batch). */
static void transform_host(const npyl_worker *w, const uint8_t *raw, npyl_slot *h)
{
    const npyl_read_view *rv = w->env->rv;
    uint64_t t0 = 0;
    for (size_t fi = 0; fi < rv->nfields; fi++) {
        const npyl_field *f = &rv->fields[fi];
        if (!f->hxform)
            continue;
        if (!t0)
            t0 = npyl_now_ns();
        if (h->mrows && (f->tplan.aug || f->splans)) {
            /* A mixture: each row draws with its own source's seed and its
             * pass (npyl_slot_aug_key), through its source's plan (the
             * sources' plans share the stored and the delivered row
             * sizes), one row at a time. */
            for (size_t r = 0; r < h->rows; r++) {
                const npyl_tplan *p = npyl_field_plan(f, h->mrows[r].source);
                int64_t seed, index;
                uint64_t epoch;
                npyl_slot_aug_key(h, r, &seed, &epoch, &index);
                npyl_transform_rows_aug(p, raw + f->raw_off + r * f->tplan.stored_row_bytes,
                                        h->mem + f->host_off + r * f->tplan.out_row_bytes, 1,
                                        seed, epoch, &index, w->aug);
            }
            continue;
        }
        npyl_transform_rows_aug(&f->tplan, raw + f->raw_off, h->mem + f->host_off, h->rows,
                                h->seed, h->epoch, h->indices, w->aug);
    }
    if (t0)
        atomic_fetch_add(&w->env->st->transform_ns, npyl_now_ns() - t0);
}

/* Device mode: takes a device slot in seq order, queues the copy of the
 * filled staging slot h, publishes the device slot and hands h back. */
static void to_device(npyl_worker *w, npyl_slot *h, int copy_pending)
{
    const npyl_work_env *env = w->env;
    int wait_release = 0;
    npyl_slot *d = npyl_slots_take_device(env->ring, h, copy_pending, &wait_release);
    if (!d)
        return; /* abandoned generation: h is FREE again */
    npyl_copy_ctx cc = {.stream = w->stream, .draw = w->draw, .errmsg = w->rd.errmsg};
    int queued = 0, poison_h = 0;
    npyl_device_copy(env->dev, env->rv->fields, env->rv->nfields, &cc, h, d, wait_release,
                     env->st, &queued, &poison_h);
    fill_arrays(env, d, 1);
    npyl_slots_publish_device(env->ring, d, h, queued, poison_h);
}

/* A batch the worker fills: its staging slot, whether a copy may still
 * read it, and the pair of row buffers (w->dst[k], w->raw[k]) it takes. */
typedef struct fill_job {
    npyl_slot *h;
    int copy_pending;
    unsigned k;
} fill_job;

static fill_job job_of(npyl_worker *w, npyl_slot *h, int copy_pending)
{
    fill_job j = {h, copy_pending, w->k};
    if (w->rd.ahead)
        w->k ^= 1;
    return j;
}

/* Before anything is read into j's slot: the copy engine may still read it
 * (an earlier batch's copy), so wait for that copy's event. If the wait
 * fails, nothing is read and copy_pending stays set, so every later claim
 * of the slot fails the same way: errors, never bytes written under a
 * copy. Then each field's rows get their destination: the raw buffer for
 * host transforms, else the slot (device mode stages the stored rows as
 * they are). Returns 0, or the error set in the slot. */
static int read_prepare(npyl_worker *w, fill_job *j)
{
    const npyl_work_env *env = w->env;
    const npyl_read_view *rv = env->rv;
    npyl_slot *h = j->h;
    int rc = 0;
    if (j->copy_pending && (rc = npyl_device_finish_copy(env->dev, h, env->st)) == 0)
        j->copy_pending = 0;
    if (rc) {
        /* Not in w->rd.errmsg: it may hold the failure of the batch read
         * before this one, not yet finished. */
        char why[NPYL_ERRMSG_LEN];
        npyl_cuda_errmsg_copy(env->dev->cuda, why, sizeof why);
        snprintf(h->errmsg, NPYL_ERRMSG_LEN, "batch %" PRId64 " of epoch %" PRIu64
                 ": CUDA device %d: waiting for the staging slot's previous copy "
                 "failed: %.700s", h->seq, h->epoch, env->dev->device, why);
        h->err = rc;
        return rc; /* nothing read: the staging slot is not safe to write */
    }
    uint8_t *raw = w->raw[j->k];
    for (size_t fi = 0; fi < rv->nfields; fi++) {
        const npyl_field *f = &rv->fields[fi];
        w->dst[j->k][fi] = (f->hxform && raw) ? raw + f->raw_off : h->mem + f->host_off;
    }
    return 0;
}

/* After the read of j (rc, `bytes` landed, since t0): counts, the error in
 * order, or the host transforms. */
static void read_done(npyl_worker *w, fill_job *j, int rc, uint64_t bytes, uint64_t t0,
                      int bind_rc)
{
    const npyl_work_env *env = w->env;
    npyl_slot *h = j->h;
    atomic_fetch_add(&env->st->io_ns, npyl_now_ns() - t0);
    atomic_fetch_add(&env->st->bytes, bytes);
    npyl_slots_mix_keep(h, w->rd.kept); /* rows ON_ERROR skip dropped */
    if (rc) {
        /* -ETIMEDOUT is next_timeout()'s "no batch yet": a read that timed
         * out (a soft NFS mount) is an I/O error, its message says which. */
        h->err = rc == -ETIMEDOUT ? -EIO : rc;
        snprintf(h->errmsg, NPYL_ERRMSG_LEN, "batch %" PRId64 " of epoch %" PRIu64 ": %.900s",
                 h->seq, h->epoch, w->rd.errmsg);
    } else if (bind_rc) {
        h->err = bind_rc;
        snprintf(h->errmsg, NPYL_ERRMSG_LEN, "worker cannot use CUDA device %d",
                 env->dev->device);
    } else if (w->raw[j->k]) {
        transform_host(w, w->raw[j->k], h);
    }
}

/* The batch is read: to the device (device mode) or READY (host mode). */
static void hand_on(npyl_worker *w, fill_job *j)
{
    if (w->env->dev->device >= 0) {
        to_device(w, j->h, j->copy_pending);
        return;
    }
    fill_arrays(w->env, j->h, 0);
    npyl_slots_publish(w->env->ring, j->h, j->copy_pending);
}

/* Fills the batch claimed into staging slot h in one go: read, transform
 * (host mode) or copy and transform (device mode), publish. No lock held.
 * Sync mode (next() itself) and workers without read-ahead run it. */
static void fill_batch(npyl_worker *w, npyl_slot *h, int copy_pending, int bind_rc)
{
    fill_job j = job_of(w, h, copy_pending);
    if (read_prepare(w, &j) == 0) {
        uint64_t bytes = 0;
        npyl_span span = npyl_span_begin();
        int rc = npyl_read_batch(w->env->rv, &w->rd, h->indices, &h->rows, w->dst[j.k],
                                 &bytes);
        atomic_fetch_add(&w->env->st->blocked_ns, npyl_blocked_since(span));
        read_done(w, &j, rc, bytes, span.wall, bind_rc);
    }
    hand_on(w, &j);
}

/* Read-ahead: hands j's first round of reads to the read-ahead thread, or
 * (the slot may not be written) leaves it failed. 1 when begun. */
static int begin_job(npyl_worker *w, fill_job *j, int here)
{
    if (read_prepare(w, j))
        return 0;
    /* Read on the worker (here): all of it was waiting for reads; handed to
     * the read-ahead thread, which counts its own. */
    npyl_span span = here ? npyl_span_begin() : (npyl_span){0, 0, 0};
    npyl_read_begin(w->env->rv, &w->rd, j->h->indices, j->h->rows, w->dst[j->k], here);
    if (here) {
        atomic_fetch_add(&w->env->st->read_wait_ns, npyl_now_ns() - span.wall);
        atomic_fetch_add(&w->env->st->blocked_ns, npyl_blocked_since(span));
    }
    return 1;
}

/* The loop of a worker with read-ahead: while it decodes and transforms
 * batch k, the reads of the next batch it claimed are in flight. The next
 * batch is claimed without waiting (npyl_slots_claim_ahead), right after
 * batch k's own reads are done and before its decode starts; when no slot
 * is free, or the controller switched read-ahead off (env->ahead_on,
 * read once a batch), the worker finishes k and then waits for a claim as
 * without read-ahead, reading that batch itself. A worker holds at most
 * two slots (one while read-ahead is off). */
static void run_ahead(npyl_worker *w, int bind_rc)
{
    npyl_ring *ring = w->env->ring;
    int pend = 0;
    uint64_t cpu = npyl_thread_cpu_ns();
    npyl_slot *h = npyl_slots_claim(ring, w->index, 1, &pend);
    fill_job cur = {0}, next = {0};
    int begun = 0;
    if (h) {
        cur = job_of(w, h, pend);
        begun = begin_job(w, &cur, 1);
    }
    while (cur.h) {
        uint64_t t0 = npyl_now_ns();
        if (begun) {
            npyl_read_wait(&w->rd);
            atomic_fetch_add(&w->env->st->read_wait_ns, npyl_now_ns() - t0);
        }
        int next_begun = 0;
        npyl_slot *n = NULL;
        if (atomic_load_explicit(w->env->ahead_on, memory_order_relaxed))
            n = npyl_slots_claim_ahead(ring, w->index, &pend);
        if (n) {
            next = job_of(w, n, pend);
            next_begun = begin_job(w, &next, 0);
        }
        if (begun) {
            uint64_t bytes = 0;
            int rc = npyl_read_end(w->env->rv, &w->rd, cur.h->indices, &cur.h->rows,
                                   w->dst[cur.k], &bytes);
            read_done(w, &cur, rc, bytes, t0, bind_rc);
        }
        hand_on(w, &cur);
        npyl_count_cpu(&w->env->st->cpu_ns, &cpu);
        if (n) {
            cur = next;
            begun = next_begun;
            continue;
        }
        h = npyl_slots_claim(ring, w->index, 1, &pend);
        cur = (fill_job){0};
        if (h) {
            cur = job_of(w, h, pend);
            begun = begin_job(w, &cur, 1);
        }
    }
}

static void *worker_main(void *arg)
{
    npyl_worker *w = arg;
    const npyl_device *dv = w->env->dev;
    /* A worker that cannot bind its device would copy to the wrong one:
     * every batch it reads then carries the error instead. */
    int bind_rc = dv->device >= 0 ? npyl_cuda_bind_thread(dv->cuda) : 0;
    if (w->rd.ahead) {
        run_ahead(w, bind_rc);
        return NULL;
    }
    npyl_slot *h;
    int copy_pending = 0;
    uint64_t cpu = npyl_thread_cpu_ns();
    while ((h = npyl_slots_claim(w->env->ring, w->index, 1, &copy_pending)) != NULL) {
        fill_batch(w, h, copy_pending, bind_rc);
        npyl_count_cpu(&w->env->st->cpu_ns, &cpu);
    }
    return NULL;
}

int npyl_worker_step(npyl_worker *w)
{
    const npyl_device *dv = w->env->dev;
    int copy_pending = 0;
    npyl_slot *h = npyl_slots_claim(w->env->ring, 0, 0, &copy_pending);
    if (!h)
        return 0;
    /* The caller's thread: the loader's device for the CUDA calls, its own
     * current device back afterwards. */
    int prev = -1, entered = 0, bind_rc = 0;
    if (dv->device >= 0) {
        bind_rc = npyl_cuda_enter(dv->cuda, &prev);
        entered = bind_rc == 0;
    }
    uint64_t cpu = npyl_thread_cpu_ns();
    fill_batch(w, h, copy_pending, bind_rc);
    npyl_count_cpu(&w->env->st->cpu_ns, &cpu);
    if (entered)
        npyl_cuda_leave(dv->cuda, prev);
    return 1;
}

int npyl_worker_start(npyl_worker *w, char *err, size_t errlen)
{
    int rc = pthread_create(&w->thread, NULL, worker_main, w);
    if (rc)
        return npyl_fail(err, errlen, -rc, "cannot start worker thread %zu: %s", w->index,
                         npyload_strerror(-rc));
    w->started = 1;
    return 0;
}

int npyl_workers_start(npyl_worker *ws, size_t n, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        int rc = npyl_worker_start(&ws[i], err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

void npyl_workers_stop(npyl_worker *ws, size_t n, const npyl_work_env *env)
{
    npyl_slots_stop(env->ring, 0);
    for (size_t i = 0; i < n; i++) {
        if (ws[i].started) {
            pthread_join(ws[i].thread, NULL);
            ws[i].started = 0;
        }
    }
    npyl_device_drain(env->dev, env->ring->hslots, env->ring->nh, env->st);
}
