/* The hot path: where a batch is claimed and read (worker_main), where it is
 * copied to the device (to_device), and where it is handed out (next) and
 * given back (release). Locking rules are in npyload_loader_internal.h. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "npyload_loader_internal.h"

/* ---- generations ---- */

int npyl_pipeline_reset(npyload_loader *L, const npyl_order_params *op, int64_t first_seq)
{
    /* Build the new order without mu (O(N): a permutation of every sample)
     * into the spare buffer, which only the ctl holder touches (two builders
     * used to share it: set_epoch(5) || set_epoch(7) could install the
     * previous epoch's order), then swap it in under mu. Workers read seqbuf
     * only under mu. */
    int rc = npyl_order_build(op, L->seqspare);
    if (rc)
        return rc; /* L->op, gen and the position unchanged */
    pthread_mutex_lock(&L->mu);
    int64_t *old = L->seqbuf;
    L->seqbuf = L->seqspare;
    L->seqspare = old;
    L->op = *op;
    L->delivered = npyl_order_delivered_len(op);
    L->nbatches = npyl_order_num_batches(op);
    L->gen++;
    if (first_seq > L->nbatches)
        first_seq = L->nbatches;
    L->gen_first_seq = first_seq;
    L->next_seq = first_seq;
    L->claim_seq = first_seq;
    L->dev_next_seq = first_seq;
    L->failed = 0;
    L->errmsg[0] = 0;
    /* Batches of the old generation that are READY but not handed out are
     * recycled now; those still being filled are recycled by their worker. */
    for (size_t i = 0; i < L->nh; i++)
        if (L->hslots[i].state == SLOT_READY)
            L->hslots[i].state = SLOT_FREE;
    for (size_t i = 0; i < L->nd; i++)
        if (L->dslots[i].state == SLOT_READY)
            L->dslots[i].state = SLOT_FREE;
    pthread_cond_broadcast(&L->work_cv);
    pthread_cond_broadcast(&L->dev_cv);
    pthread_cond_broadcast(&L->ready_cv);
    pthread_mutex_unlock(&L->mu);
    return 0;
}

static void fill_arrays(const npyload_loader *L, npyl_slot *s, int device_slot)
{
    for (size_t fi = 0; fi < L->nfields; fi++) {
        const npyl_field *f = &L->fields[fi];
        npyload_array *a = &s->arrays[fi];
        a->data = s->mem + (device_slot ? f->dev_off : f->host_off);
        a->ndim = f->sndim + 1;
        a->shape[0] = (int64_t)s->rows;
        memcpy(a->shape + 1, f->sshape, sizeof(int64_t) * (size_t)f->sndim);
        a->device = device_slot ? L->device : -1;
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

/* Device mode: takes a device slot in seq order, queues the copy of host
 * slot h on the worker's stream, publishes the device slot, and hands h back
 * FREE with copy_pending set: h's ev_done, recorded after the copy, tells
 * when the copy engine has finished reading it (see claim_staging). The
 * worker does not wait for the copy, so its next read overlaps it.
 * Called and returns with mu held. */
static void to_device(npyload_loader *L, npyl_worker *w, npyl_slot *h)
{
    npyl_slot *d = NULL;
    for (;;) {
        if (L->stopping || h->gen != L->gen) {
            h->state = SLOT_FREE;
            pthread_cond_broadcast(&L->work_cv);
            return;
        }
        if (L->dev_next_seq == h->seq) {
            for (size_t i = 0; i < L->nd && !d; i++)
                if (L->dslots[i].state == SLOT_FREE)
                    d = &L->dslots[i];
            if (d)
                break;
        }
        pthread_cond_wait(&L->dev_cv, &L->mu);
    }
    d->state = SLOT_FILLING;
    d->gen = h->gen;
    d->seq = h->seq;
    d->epoch = h->epoch;
    d->rows = h->rows;
    memcpy(d->indices, h->indices, h->rows * sizeof *h->indices);
    d->err = h->err;
    if (h->err)
        memcpy(d->errmsg, h->errmsg, NPYL_ERRMSG_LEN);
    int wait_release = d->release_pending;
    d->release_pending = 0;
    L->dev_next_seq++;
    pthread_cond_broadcast(&L->dev_cv);
    pthread_mutex_unlock(&L->mu);

    int rc = 0, queued = 0; /* queued: a copy reading h may be in flight */
    int kerr = 0;           /* rc is a transform kernel's; w->errmsg says why */
    uint64_t bytes = 0;
    if (!d->err) {
        /* The staging slot's own events, made by the first worker that
         * copies from it (every worker is bound to the loader's device). */
        if (!h->ev_start)
            rc = npyl_cuda_event_create(L->cuda, &h->ev_start, 1);
        if (!rc && !h->ev_done)
            rc = npyl_cuda_event_create(L->cuda, &h->ev_done, 1);
        /* The consumer released this slot with an event on its stream: the
         * copy must not start before the work queued there has finished.
         * The event was recorded before release returned, and release
         * happened before we found the slot FREE under mu, so waiting on it
         * here orders the copy after that work. */
        /* The previous copy into d (on another worker's stream, possibly
         * still in flight if d was released unread or recycled by
         * set_epoch) must land first: its ev_done was last recorded by that
         * copy's owner, before d became FREE under mu. */
        if (!rc)
            rc = npyl_cuda_stream_wait_event(L->cuda, w->stream, d->ev_done);
        if (!rc && wait_release)
            rc = npyl_cuda_stream_wait_event(L->cuda, w->stream, d->ev_release);
        if (!rc)
            rc = npyl_cuda_event_record(L->cuda, h->ev_start, w->stream);
        for (size_t fi = 0; fi < L->nfields && !rc; fi++) {
            const npyl_field *f = &L->fields[fi];
            size_t n = (size_t)(h->rows * f->row_bytes);
            /* A transformed field crosses PCIe in its stored dtype into the
             * worker's device raw buffer, and the kernel writes the slot on
             * the same stream, before ev_done below. The raw buffer is
             * reused by this worker's next batch only after it, in stream
             * order. */
            uint8_t *dst = f->xform ? (uint8_t *)w->draw + f->raw_off : d->mem + f->dev_off;
            rc = npyl_cuda_memcpy_h2d_async(L->cuda, dst, h->mem + f->host_off, n, w->stream);
            queued = 1;
            bytes += n;
            if (!rc && f->xform && h->rows &&
                (rc = npyl_tdev_run(L->tdev, &f->tplan, dst, d->mem + f->dev_off, h->rows,
                                    w->stream, w->errmsg, sizeof w->errmsg)) != 0)
                kerr = 1;
        }
        if (!rc)
            rc = npyl_cuda_event_record(L->cuda, d->ev_done, w->stream);
        if (!rc)
            rc = npyl_cuda_event_record(L->cuda, h->ev_done, w->stream);
        if (rc) {
            char cerr[512];
            if (kerr)
                snprintf(cerr, sizeof cerr, "%.500s", w->errmsg);
            else
                npyl_cuda_errmsg_copy(L->cuda, cerr, sizeof cerr);
            d->err = rc;
            snprintf(d->errmsg, NPYL_ERRMSG_LEN, "CUDA device %d: queueing the copy of batch %"
                     PRId64 " failed: %s", L->device, d->seq, cerr);
        } else {
            atomic_fetch_add(&L->st_h2d_bytes, bytes);
        }
    }
    fill_arrays(L, d, 1);
    int poison_h = 0;
    if (rc && queued) {
        /* Part of the copy may be in flight with no event behind it: wait
         * for it on the host (rare path). If even that fails, h is never
         * written again. */
        poison_h = npyl_cuda_stream_sync(L->cuda, w->stream) != 0;
    }
    pthread_mutex_lock(&L->mu);
    if (d->gen != L->gen || L->stopping) {
        d->state = SLOT_FREE; /* set_epoch/set_state ran during the copy */
        pthread_cond_broadcast(&L->dev_cv);
    } else {
        d->state = SLOT_READY;
        pthread_cond_broadcast(&L->ready_cv);
    }
    if (!rc && !d->err)
        h->copy_pending = 1;
    h->state = poison_h ? SLOT_POISONED : SLOT_FREE;
    pthread_cond_broadcast(&L->work_cv);
}

/* A FREE staging slot for the next read, or NULL. Prefers a slot no copy
 * reads any more; among slots with a pending copy, the one copied earliest
 * (lowest seq; it was queued first). Called with mu held. */
static npyl_slot *claim_staging(npyload_loader *L)
{
    npyl_slot *best = NULL;
    for (size_t i = 0; i < L->nh; i++) {
        npyl_slot *s = &L->hslots[i];
        if (s->state != SLOT_FREE)
            continue;
        if (!s->copy_pending)
            return s;
        if (!best || s->seq < best->seq)
            best = s;
    }
    return best;
}

/* Waits for the copy that read staging slot h (its ev_done) and adds the
 * copy's time to the stats. Called without mu, by the slot's owner. */
static int finish_copy(npyload_loader *L, npyl_slot *h)
{
    int rc = npyl_cuda_event_sync(L->cuda, h->ev_done);
    float ms = 0;
    if (rc == 0 && npyl_cuda_event_elapsed_ms(L->cuda, &ms, h->ev_start, h->ev_done) == 0)
        atomic_fetch_add(&L->st_h2d_ns, (uint64_t)(ms * 1e6));
    return rc;
}

/* Host transforms: the stored rows of each transformed field, read into
 * the worker's raw buffer, become the slot's output rows. h->rows is the
 * count after the read (ON_ERROR skip may have compacted the batch). */
static void transform_host(npyload_loader *L, const npyl_worker *w, npyl_slot *h)
{
    uint64_t t0 = 0;
    for (size_t fi = 0; fi < L->nfields; fi++) {
        const npyl_field *f = &L->fields[fi];
        if (!f->xform)
            continue;
        if (!t0)
            t0 = npyl_now_ns();
        npyl_transform_rows(&f->tplan, w->raw + f->raw_off, h->mem + f->host_off, h->rows);
    }
    if (t0)
        atomic_fetch_add(&L->st_transform_ns, npyl_now_ns() - t0);
}

/* Claims the next batch into staging slot h and fills it: read, transform
 * (host mode) or copy and transform (device mode, to_device), publish.
 * Called with mu held (claim_seq < nbatches, h FREE); returns with mu held.
 * The worker threads and, in sync mode, next() itself run it. */
static void fill_batch(npyload_loader *L, npyl_worker *w, npyl_slot *h, int bind_rc)
{
    /* Claim: copy the batch's indices now, under mu, so a later
     * set_epoch may rebuild seqbuf while we read. */
    int64_t seq = L->claim_seq++;
    int64_t B = L->op.batch_size;
    int64_t lo = seq * B, hi = lo + B < L->delivered ? lo + B : L->delivered;
    h->state = SLOT_FILLING;
    h->gen = L->gen;
    h->seq = seq;
    h->epoch = L->op.epoch;
    h->rows = (size_t)(hi - lo);
    h->err = 0;
    memcpy(h->indices, L->seqbuf + lo, h->rows * sizeof *h->indices);
    int copy_pending = h->copy_pending;
    pthread_mutex_unlock(&L->mu);

    int rc = 0;
    /* The copy engine may still read h (an earlier batch's copy): the
     * read must not overwrite it before that copy's event completes. If
     * the wait fails, nothing is read and copy_pending stays set, so
     * every later claim of h fails the same way: errors, never bytes
     * written under a copy. */
    if (copy_pending && (rc = finish_copy(L, h)) == 0)
        copy_pending = 0;
    if (rc) {
        npyl_cuda_errmsg_copy(L->cuda, w->errmsg, sizeof w->errmsg);
        snprintf(h->errmsg, NPYL_ERRMSG_LEN, "batch %" PRId64 " of epoch %" PRIu64
                 ": CUDA device %d: waiting for the staging slot's previous copy "
                 "failed: %.700s", seq, h->epoch, L->device, w->errmsg);
        h->err = rc;
    }
    uint64_t bytes = 0, t0 = npyl_now_ns();
    if (!rc) {
        /* Host transforms read into the worker's raw buffer; device mode
         * stages the stored rows as they are. */
        for (size_t fi = 0; fi < L->nfields; fi++) {
            const npyl_field *f = &L->fields[fi];
            w->dst[fi] = (f->xform && w->raw) ? w->raw + f->raw_off : h->mem + f->host_off;
        }
        rc = npyl_read_batch(L, w, h, w->dst, &bytes);
    } else {
        rc = 0; /* h->err already says why */
    }
    atomic_fetch_add(&L->st_io_ns, npyl_now_ns() - t0);
    atomic_fetch_add(&L->st_bytes, bytes);
    if (h->err) {
        /* nothing read: the staging slot is not safe to write */
    } else if (rc) {
        h->err = rc;
        snprintf(h->errmsg, NPYL_ERRMSG_LEN, "batch %" PRId64 " of epoch %" PRIu64 ": %.900s",
                 seq, h->epoch, w->errmsg);
    } else if (bind_rc) {
        h->err = bind_rc;
        snprintf(h->errmsg, NPYL_ERRMSG_LEN, "worker cannot use CUDA device %d", L->device);
    } else if (w->raw) {
        transform_host(L, w, h);
    }

    pthread_mutex_lock(&L->mu);
    h->copy_pending = copy_pending;
    if (h->gen != L->gen || L->stopping) {
        h->state = SLOT_FREE; /* an abandoned generation: discard */
        pthread_cond_broadcast(&L->work_cv);
        return;
    }
    if (L->device >= 0) {
        to_device(L, w, h);
        return;
    }
    fill_arrays(L, h, 0);
    h->state = SLOT_READY;
    pthread_cond_broadcast(&L->ready_cv);
}

static void *worker_main(void *arg)
{
    npyl_worker *w = arg;
    npyload_loader *L = w->L;
    /* A worker that cannot bind its device would copy to the wrong one:
     * every batch it reads then carries the error instead. */
    int bind_rc = L->device >= 0 ? npyl_cuda_bind_thread(L->cuda) : 0;
    pthread_mutex_lock(&L->mu);
    for (;;) {
        npyl_slot *h = NULL;
        while (!L->stopping) {
            if (L->claim_seq < L->nbatches && (h = claim_staging(L)) != NULL)
                break;
            pthread_cond_wait(&L->work_cv, &L->mu);
        }
        if (L->stopping)
            break;
        fill_batch(L, w, h, bind_rc);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

/* Sync mode (NPYLOAD_WORKERS_SYNC): claims are made one at a time by the
 * one caller of next(), so batches are filled in seq order and to_device
 * always finds its turn (dev_next_seq == seq); it only needs a FREE device
 * slot, checked here so that it never waits. */
int npyl_pipeline_step(npyload_loader *L)
{
    if (L->claim_seq >= L->nbatches)
        return 0;
    if (L->nd) {
        int free_d = 0;
        for (size_t i = 0; i < L->nd && !free_d; i++)
            free_d = L->dslots[i].state == SLOT_FREE;
        if (!free_d)
            return 0;
    }
    npyl_slot *h = claim_staging(L);
    if (!h)
        return 0;
    /* The caller's thread: the loader's device for the CUDA calls, its own
     * current device back afterwards. */
    int prev = -1, entered = 0, bind_rc = 0;
    if (L->device >= 0) {
        bind_rc = npyl_cuda_enter(L->cuda, &prev);
        entered = bind_rc == 0;
    }
    fill_batch(L, &L->workers[0], h, bind_rc);
    if (entered)
        npyl_cuda_leave(L->cuda, prev);
    return 1;
}

int npyl_pipeline_start(npyload_loader *L)
{
    for (size_t i = 0; i < L->nworkers; i++) {
        npyl_worker *w = &L->workers[i];
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc)
            return npyl_loader_fail(L, -rc, "cannot start worker thread %zu: %s", i,
                                    npyload_strerror(-rc));
        w->started = 1;
    }
    return 0;
}

void npyl_pipeline_stop(npyload_loader *L)
{
    pthread_mutex_lock(&L->mu);
    L->stopping = 1;
    pthread_cond_broadcast(&L->work_cv);
    pthread_cond_broadcast(&L->dev_cv);
    pthread_cond_broadcast(&L->ready_cv);
    pthread_mutex_unlock(&L->mu);
    for (size_t i = 0; i < L->nworkers; i++) {
        if (L->workers[i].started) {
            pthread_join(L->workers[i].thread, NULL);
            L->workers[i].started = 0;
        }
    }
    if (!L->cuda || L->device < 0)
        return;
    /* Copies still reading staging slots must finish before their memory is
     * freed (or pinned pages are unpinned). Event waits and destroys work
     * from any current device; enter only to keep the user's as it was. */
    int prev = -1, entered = npyl_cuda_enter(L->cuda, &prev) == 0;
    for (size_t i = 0; i < L->nh; i++) {
        npyl_slot *h = &L->hslots[i];
        if (h->copy_pending)
            finish_copy(L, h);
        h->copy_pending = 0;
        npyl_cuda_event_destroy(L->cuda, h->ev_start);
        npyl_cuda_event_destroy(L->cuda, h->ev_done);
        h->ev_start = h->ev_done = NULL;
    }
    if (entered)
        npyl_cuda_leave(L->cuda, prev);
}

/* ---- handing batches out ---- */

static npyl_slot *find_ready(npyload_loader *L)
{
    npyl_slot *list = L->nd ? L->dslots : L->hslots;
    size_t n = L->nd ? L->nd : L->nh;
    for (size_t i = 0; i < n; i++)
        if (list[i].state == SLOT_READY && list[i].gen == L->gen && list[i].seq == L->next_seq)
            return &list[i];
    return NULL;
}

int npyload_loader_next_timeout(npyload_loader *L, npyload_batch **out, int64_t timeout_ns)
{
    if (!L || !out)
        return NPYLOAD_EINVAL;
    *out = NULL;
    int frc = npyl_loader_forked(L);
    if (frc)
        return frc;
    if (!L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "next() before start()");
    uint64_t t0 = npyl_now_ns();
    struct timespec deadline;
    if (timeout_ns >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        uint64_t ns = (uint64_t)deadline.tv_nsec + (uint64_t)timeout_ns;
        deadline.tv_sec += (time_t)(ns / 1000000000u);
        deadline.tv_nsec = (long)(ns % 1000000000u);
    }
    int rc = 0;
    npyl_slot *s = NULL;
    pthread_mutex_lock(&L->mu);
    L->in_next++; /* destroy waits for it to leave */
    for (;;) {
        if (L->stopping) {
            /* destroy() on another thread: the loader is going away, so no
             * message (its memory is freed once we leave). */
            rc = NPYLOAD_ESTATE;
            break;
        }
        if (L->failed == 2) {
            rc = NPYLOAD_ECUDA; /* release() withdrew a slot; errmsg says why */
            break;
        }
        if (L->failed) {
            rc = NPYLOAD_ESTATE;
            snprintf(L->errmsg, sizeof L->errmsg, "the loader failed earlier; call set_epoch "
                     "or set_state to go on");
            break;
        }
        if (L->next_seq >= L->nbatches) {
            rc = NPYLOAD_EOF;
            break;
        }
        if ((s = find_ready(L)) != NULL)
            break;
        if (L->sync && npyl_pipeline_step(L))
            continue; /* read on this thread; find_ready again */
        size_t nbatch_slots = L->nd ? L->nd : L->nh, poisoned = 0;
        for (size_t i = 0; L->nd && i < L->nd; i++)
            poisoned += L->dslots[i].state == SLOT_POISONED;
        if (L->held + poisoned >= nbatch_slots) {
            /* Every slot is in the caller's hands: waiting would never end. */
            rc = npyl_loader_fail(L, NPYLOAD_EHELD, "all %zu batch slots are held by the "
                                  "caller%s; release batches (or raise PREFETCH) before "
                                  "asking for more", nbatch_slots,
                                  poisoned ? " or withdrawn after a failed CUDA release" : "");
            break;
        }
        if (L->sync) {
            /* Nothing to wait for: no other thread fills slots. */
            rc = npyl_loader_fail(L, NPYLOAD_ESTATE, "synchronous loader: batch %" PRId64
                                  " cannot be read now (no free slot)", L->next_seq);
            break;
        }
        if (timeout_ns >= 0) {
            if (pthread_cond_timedwait(&L->ready_cv, &L->mu, &deadline) == ETIMEDOUT &&
                !find_ready(L)) {
                rc = -ETIMEDOUT;
                break;
            }
        } else {
            pthread_cond_wait(&L->ready_cv, &L->mu);
        }
    }
    if (s) {
        if (s->err) {
            /* next_seq stays: the position saved by get_state excludes the
             * failed batch, so a resume retries it. */
            /* A failed read surfaces in order, as an error, never as data. */
            rc = s->err;
            memcpy(L->errmsg, s->errmsg, sizeof L->errmsg);
            L->failed = 1;
            s->state = SLOT_FREE;
            pthread_cond_broadcast(&L->work_cv);
            pthread_cond_broadcast(&L->dev_cv);
        } else {
            L->next_seq++;
            s->state = SLOT_HELD;
            L->held++;
            /* A fresh handle per hand-out (see release()). */
            npyload_batch *b = &s->handles[++s->handouts % NPYL_HANDLES];
            b->seq = s->seq;
            b->epoch = s->epoch;
            atomic_store_explicit(&s->owner, b, memory_order_release);
            *out = b;
        }
    }
    /* The counters before leaving: once in_next drops, a destroy() on
     * another thread may free L. */
    atomic_fetch_add(&L->st_wait_ns, npyl_now_ns() - t0);
    if (*out) {
        atomic_fetch_add(&L->st_batches, 1);
        atomic_fetch_add(&L->st_samples, s->rows);
    }
    if (--L->in_next == 0 && L->stopping)
        pthread_cond_broadcast(&L->ready_cv); /* destroy waits for this */
    pthread_mutex_unlock(&L->mu);
    return rc;
}

int npyload_loader_next(npyload_loader *L, npyload_batch **out)
{
    return npyload_loader_next_timeout(L, out, -1);
}

/* ---- batches ---- */

size_t npyload_batch_size(const npyload_batch *b) { return b ? b->slot->rows : 0; }

const int64_t *npyload_batch_indices(const npyload_batch *b)
{
    return b ? b->slot->indices : NULL;
}

size_t npyload_batch_num_fields(const npyload_batch *b) { return b ? b->L->nfields : 0; }

const npyload_array *npyload_batch_field(const npyload_batch *b, size_t i)
{
    return (b && i < b->L->nfields) ? &b->slot->arrays[i] : NULL;
}

uint64_t npyload_batch_epoch(const npyload_batch *b)
{
    return b ? b->slot->epoch : 0;
}

int64_t npyload_batch_seq(const npyload_batch *b) { return b ? b->slot->seq : -1; }

/* wait_stream (sync == 0) and sync (sync == 1): on the user's thread, so
 * its current device is kept as it was. */
static int batch_copy_wait(npyload_batch *b, void *stream, int sync)
{
    if (!b)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(b->L))
        return NPYLOAD_EFORKED;
    if (!b->device_mode)
        return 0;
    int prev, rc = npyl_cuda_enter(b->L->cuda, &prev);
    if (rc)
        return rc;
    rc = sync ? npyl_cuda_event_sync(b->L->cuda, b->slot->ev_done)
              : npyl_cuda_stream_wait_event(b->L->cuda, stream, b->slot->ev_done);
    npyl_cuda_leave(b->L->cuda, prev);
    return rc;
}

int npyload_batch_wait_stream(npyload_batch *b, void *stream)
{
    return batch_copy_wait(b, stream, 0);
}

int npyload_batch_sync(npyload_batch *b) { return batch_copy_wait(b, NULL, 1); }

/* Gives a batch's slot back. With a stream (device batches), the slot's next
 * copy must be ordered after the work queued on it so far, and the slot is
 * never handed back unordered:
 *  - normally an event is recorded on the stream (ev_release) and the next
 *    copy into the slot waits for it on the device;
 *  - if entering the loader's device or recording fails, the host waits for
 *    the stream instead (cudaStreamSynchronize works from any current device
 *    for a non-NULL stream; the legacy NULL stream means the current
 *    device's, so without entering it cannot be waited for);
 *  - if that is impossible or fails too, the slot is POISONED: withdrawn
 *    for the loader's lifetime, and the loader fails (next() returns
 *    NPYLOAD_ECUDA with the reason) until set_epoch/set_state. Its memory is
 *    freed with the loader (cudaFree waits for the device). */
static int release(npyload_batch *b, void *stream, int on_stream)
{
    if (!b)
        return NPYLOAD_EINVAL;
    npyload_loader *L = b->L;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED; /* fork() child: never touch the parent's lock or streams */
    npyl_slot *s = b->slot;
    /* Only the release that takes the handle out of owner goes on: a second
     * release of b, or a release of b after its slot was handed out again
     * (under another of its handles), finds owner != b and changes nothing.
     * Handles are kept for the loader's life, zombie included, so b is never
     * dangling here while the loader exists. */
    npyload_batch *mine = b;
    if (!atomic_compare_exchange_strong_explicit(&s->owner, &mine, NULL, memory_order_acq_rel,
                                                 memory_order_acquire)) {
        pthread_mutex_lock(&L->mu);
        snprintf(L->errmsg, sizeof L->errmsg, "npyload_batch_release: batch %" PRId64
                 " of epoch %" PRIu64 " (handle %p) is not held by the caller: it was "
                 "released already; ignored", b->seq, b->epoch, (void *)b);
        pthread_mutex_unlock(&L->mu);
        return NPYLOAD_ESTATE;
    }
    int recorded = 0, ordered = 1;
    char why[512] = "";
    if (b->device_mode && on_stream) {
        int prev, entered = npyl_cuda_enter(L->cuda, &prev) == 0;
        if (entered)
            recorded = npyl_cuda_event_record(L->cuda, s->ev_release, stream) == 0;
        if (!recorded) {
            npyl_cuda_errmsg_copy(L->cuda, why, sizeof why);
            ordered = (entered || stream) && npyl_cuda_stream_sync(L->cuda, stream) == 0;
        }
        if (entered)
            npyl_cuda_leave(L->cuda, prev);
    }
    pthread_mutex_lock(&L->mu);
    if (ordered) {
        s->release_pending = recorded;
        s->state = SLOT_FREE;
    } else {
        s->release_pending = 0;
        s->state = SLOT_POISONED;
        L->failed = 2;
        snprintf(L->errmsg, sizeof L->errmsg, "CUDA device %d: releasing batch %" PRId64
                 " on stream %p: neither an event nor a host wait could order the slot's "
                 "reuse after the stream's work (%.400s); the slot is withdrawn",
                 L->device, s->seq, stream, why);
    }
    L->held--;
    int free_now = L->zombie && L->held == 0;
    pthread_cond_broadcast(&L->work_cv);
    pthread_cond_broadcast(&L->dev_cv);
    pthread_cond_broadcast(&L->ready_cv);
    pthread_mutex_unlock(&L->mu);
    if (free_now)
        npyl_loader_free(L); /* destroyed earlier; this was its last batch */
    return 0;
}

void npyload_batch_release(npyload_batch *b) { (void)release(b, NULL, 0); }

int npyload_batch_release_checked(npyload_batch *b) { return release(b, NULL, 0); }

void npyload_batch_release_stream(npyload_batch *b, void *stream) { (void)release(b, stream, 1); }
