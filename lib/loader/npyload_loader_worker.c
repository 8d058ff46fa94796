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
    w->env = env;
    char rerr[NPYL_ERRMSG_LEN - 64];
    int rc = npyl_read_ctx_init(&w->rd, env->rv, &cfg->io, cfg->rows, &cfg->zst, rerr,
                                sizeof rerr);
    if (rc && !w->rd.io)
        return npyl_fail(err, errlen, rc, "worker %zu: %s", index, rerr);
    if (rc)
        return npyl_fail(err, errlen, rc, "%s", rerr);
    w->dst = calloc(nfields ? nfields : 1, sizeof *w->dst);
    if (!w->dst)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    /* One batch of the transformed fields' stored rows: memory is workers x
     * batch, independent of PREFETCH. */
    if (cfg->raw_bytes && dv->device < 0 &&
        !(w->raw = npyl_alloc_aligned(cfg->raw_bytes, NPYL_DIRECT_ALIGN)))
        return npyl_fail(err, errlen, -ENOMEM, "cannot allocate the %" PRIu64 "-byte "
                         "transform buffer of worker %zu", cfg->raw_bytes, index);
    if (cfg->raw_bytes && dv->device >= 0 &&
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
    free(w->dst);
    w->dst = NULL;
    npyl_free_aligned(w->raw);
    w->raw = NULL;
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
        memcpy(a->shape + 1, f->sshape, sizeof(int64_t) * (size_t)f->sndim);
        a->device = device_slot ? env->dev->device : -1;
        a->nbytes = (size_t)(s->rows * f->out_row_bytes);
        if (f->has_transform) {
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
 * the worker's raw buffer, become the slot's output rows. h->rows is the
 * count after the read (ON_ERROR skip may have compacted the batch). */
static void transform_host(const npyl_worker *w, npyl_slot *h)
{
    const npyl_read_view *rv = w->env->rv;
    uint64_t t0 = 0;
    for (size_t fi = 0; fi < rv->nfields; fi++) {
        const npyl_field *f = &rv->fields[fi];
        if (!f->xform)
            continue;
        if (!t0)
            t0 = npyl_now_ns();
        npyl_transform_rows(&f->tplan, w->raw + f->raw_off, h->mem + f->host_off, h->rows);
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

/* Reads the claimed batch into staging slot h (after the copy that may
 * still read h). Sets h->err and h->errmsg on failure. */
static void read_into(npyl_worker *w, npyl_slot *h, int *copy_pending, int bind_rc)
{
    const npyl_work_env *env = w->env;
    const npyl_read_view *rv = env->rv;
    int rc = 0;
    /* The copy engine may still read h (an earlier batch's copy): the read
     * must not overwrite it before that copy's event completes. If the wait
     * fails, nothing is read and copy_pending stays set, so every later
     * claim of h fails the same way: errors, never bytes written under a
     * copy. */
    if (*copy_pending && (rc = npyl_device_finish_copy(env->dev, h, env->st)) == 0)
        *copy_pending = 0;
    if (rc) {
        npyl_cuda_errmsg_copy(env->dev->cuda, w->rd.errmsg, sizeof w->rd.errmsg);
        snprintf(h->errmsg, NPYL_ERRMSG_LEN, "batch %" PRId64 " of epoch %" PRIu64
                 ": CUDA device %d: waiting for the staging slot's previous copy "
                 "failed: %.700s", h->seq, h->epoch, env->dev->device, w->rd.errmsg);
        h->err = rc;
        return; /* nothing read: the staging slot is not safe to write */
    }
    uint64_t bytes = 0, t0 = npyl_now_ns();
    /* Host transforms read into the worker's raw buffer; device mode stages
     * the stored rows as they are. */
    for (size_t fi = 0; fi < rv->nfields; fi++) {
        const npyl_field *f = &rv->fields[fi];
        w->dst[fi] = (f->xform && w->raw) ? w->raw + f->raw_off : h->mem + f->host_off;
    }
    rc = npyl_read_batch(rv, &w->rd, h->indices, &h->rows, w->dst, &bytes);
    atomic_fetch_add(&env->st->io_ns, npyl_now_ns() - t0);
    atomic_fetch_add(&env->st->bytes, bytes);
    if (rc) {
        h->err = rc;
        snprintf(h->errmsg, NPYL_ERRMSG_LEN, "batch %" PRId64 " of epoch %" PRIu64 ": %.900s",
                 h->seq, h->epoch, w->rd.errmsg);
    } else if (bind_rc) {
        h->err = bind_rc;
        snprintf(h->errmsg, NPYL_ERRMSG_LEN, "worker cannot use CUDA device %d",
                 env->dev->device);
    } else if (w->raw) {
        transform_host(w, h);
    }
}

/* Fills the batch claimed into staging slot h: read, transform (host mode)
 * or copy and transform (device mode), publish. No lock held. The worker
 * threads and, in sync mode, next() itself run it. */
static void fill_batch(npyl_worker *w, npyl_slot *h, int copy_pending, int bind_rc)
{
    read_into(w, h, &copy_pending, bind_rc);
    if (w->env->dev->device >= 0) {
        to_device(w, h, copy_pending);
        return;
    }
    fill_arrays(w->env, h, 0);
    npyl_slots_publish(w->env->ring, h, copy_pending);
}

static void *worker_main(void *arg)
{
    npyl_worker *w = arg;
    const npyl_device *dv = w->env->dev;
    /* A worker that cannot bind its device would copy to the wrong one:
     * every batch it reads then carries the error instead. */
    int bind_rc = dv->device >= 0 ? npyl_cuda_bind_thread(dv->cuda) : 0;
    npyl_slot *h;
    int copy_pending = 0;
    while ((h = npyl_slots_claim(w->env->ring, 1, &copy_pending)) != NULL)
        fill_batch(w, h, copy_pending, bind_rc);
    return NULL;
}

int npyl_worker_step(npyl_worker *w)
{
    const npyl_device *dv = w->env->dev;
    int copy_pending = 0;
    npyl_slot *h = npyl_slots_claim(w->env->ring, 0, &copy_pending);
    if (!h)
        return 0;
    /* The caller's thread: the loader's device for the CUDA calls, its own
     * current device back afterwards. */
    int prev = -1, entered = 0, bind_rc = 0;
    if (dv->device >= 0) {
        bind_rc = npyl_cuda_enter(dv->cuda, &prev);
        entered = bind_rc == 0;
    }
    fill_batch(w, h, copy_pending, bind_rc);
    if (entered)
        npyl_cuda_leave(dv->cuda, prev);
    return 1;
}

int npyl_workers_start(npyl_worker *ws, size_t n, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        int rc = pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]);
        if (rc)
            return npyl_fail(err, errlen, -rc, "cannot start worker thread %zu: %s", i,
                             npyload_strerror(-rc));
        ws[i].started = 1;
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
