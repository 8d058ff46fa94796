/* The hot path's API: where a batch is handed out (next) and given back
 * (release), and the batch accessors. The slots (npyload_loader_slots.c)
 * decide which batch and own every state change; a synchronous loader's
 * next() reads the batch itself through its one worker context. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "npyload_loader_internal.h"
#include "../order/npyload_digest.h"

/* At hand-out, on next()'s thread: a mixture's rows as the accessors give
 * them (index within the source, source), the rows per source, and the
 * running digest over (source, index, augmentation decisions) of each row
 * (npyload_digest.h), under dig_mu, taken once per batch. Without an
 * augmented field no decision is drawn: the rows' records are hashed in one
 * pass over the batch's index (and source) arrays. */
static void hand_out_rows(npyload_loader *L, npyl_slot *s)
{
    if (s->mrows) {
        for (size_t r = 0; r < s->rows; r++) {
            s->local[r] = s->mrows[r].index;
            s->src[r] = s->mrows[r].source;
            atomic_fetch_add_explicit(&L->src_samples[s->src[r]], 1, memory_order_relaxed);
        }
    }
    npyl_digest_aug aug[8];
    size_t naug = 0;
    for (size_t i = 0; i < L->nfields; i++)
        naug += npyl_field_transformed(&L->fields[i]) && L->fields[i].tplan.aug;
    if (!naug) { /* no decisions to draw: one pass over the batch's arrays */
        pthread_mutex_lock(&L->dig_mu);
        L->digest = npyl_digest_rows(L->digest, s->rows, s->mrows ? s->src : NULL,
                                     s->mrows ? s->local : s->indices, NULL, 0);
        L->digest_rows += s->rows;
        pthread_mutex_unlock(&L->dig_mu);
        return;
    }
    npyl_digest_aug *a = naug <= 8 ? aug : malloc(naug * sizeof *a);
    pthread_mutex_lock(&L->dig_mu);
    uint64_t d = L->digest;
    for (size_t r = 0; r < s->rows; r++) {
        int64_t seed, index;
        uint64_t epoch;
        npyl_slot_aug_key(s, r, &seed, &epoch, &index);
        size_t j = 0;
        for (size_t i = 0; a && i < L->nfields; i++) {
            const npyl_field *f = &L->fields[i];
            if (!(npyl_field_transformed(f) && f->tplan.aug))
                continue;
            npyl_aug x; /* by the row's source's plan */
            npyl_aug_decide(npyl_field_plan(f, s->mrows ? (int64_t)s->mrows[r].source : -1),
                            seed, epoch, index, &x);
            a[j++] = (npyl_digest_aug){.hflip = (uint8_t)x.hflip, .vflip = (uint8_t)x.vflip,
                                       .top = x.top, .left = x.left};
        }
        /* Out of memory for many augmented fields: hashed without them
         * (never reached with 8 or fewer). */
        d = npyl_digest_row(d, s->mrows ? s->mrows[r].source : 0, index, a,
                            a ? naug : 0);
    }
    L->digest = d;
    L->digest_rows += s->rows;
    pthread_mutex_unlock(&L->dig_mu);
    if (a != aug)
        free(a);
}

/* The controller's tick (NPYLOAD_AUTO), in the control turn when it is
 * free: a control call in progress (set_epoch, set_state, stop, destroy)
 * skips it, so the controller never overlaps one. */
static void auto_tick(npyload_loader *L)
{
    if (!L->ctrl.mode)
        return;
    pthread_mutex_lock(&L->ctl);
    int mine = !L->ctl_busy && !L->destroying && L->started;
    if (mine)
        L->ctl_busy = 1;
    pthread_mutex_unlock(&L->ctl);
    if (!mine)
        return;
    npyl_auto_meas m = {
        .now_ns = npyl_now_ns(),
        .batches = atomic_load(&L->st.batches),
        .samples = atomic_load(&L->st.samples),
        .wait_ns = atomic_load(&L->st.wait_ns),
        .fill_wait_ns = atomic_load(&L->st.fill_wait_ns),
        .step_ns = atomic_load(&L->st.step_ns),
        .busy_ns = atomic_load(&L->st.io_ns) + atomic_load(&L->st.transform_ns),
        .blocked_ns = atomic_load(&L->st.blocked_ns),
        .slot_wait_ns = atomic_load(&L->ring.slot_wait_ns),
        .read_wait_ns = atomic_load(&L->st.read_wait_ns),
    };
    /* The read-ahead threads' waits for reads (the workers made so far). */
    size_t made = npyl_auto_made(&L->ctrl);
    for (size_t i = 0; L->workers && i < made && i < L->nworkers; i++)
        m.ahead_blocked_ns += npyl_read_ctx_ahead_blocked(&L->workers[i].rd);
    npyl_auto_tick(&L->ctrl, &m);
    npyl_ctl_leave(L);
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
    uint64_t back = atomic_load(&L->st.last_return_ns);
    if (back && t0 > back) /* the step since the last batch */
        atomic_fetch_add(&L->st.step_ns, t0 - back);
    auto_tick(L);
    struct timespec deadline;
    if (timeout_ns >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        uint64_t ns = (uint64_t)deadline.tv_nsec + (uint64_t)timeout_ns;
        deadline.tv_sec += (time_t)(ns / 1000000000u);
        deadline.tv_nsec = (long)(ns % 1000000000u);
    }
    npyl_slots_enter_next(&L->ring); /* destroy waits for it to leave */
    size_t rows = 0, dropped = 0;
    int rc, try = 1;
    char msg[NPYL_ERRMSG_LEN];
    msg[0] = '\0'; /* not `= ""`, which zeroes all of it on every next() */
    /* A synchronous loader reads on this thread when nothing is ready, and
     * asks again; when nothing can be read now either, it fails. */
    while ((rc = npyl_slots_take_ready(&L->ring, timeout_ns >= 0 ? &deadline : NULL, L->sync,
                                       try, out, &rows, &dropped, msg, sizeof msg)) ==
           NPYL_TAKE_AGAIN)
        try = npyl_worker_step(&L->workers[0]);
    if (msg[0]) /* a failure the slots described (none: stopping, EOF) */
        npyl_loader_msg(L, msg);
    /* The counters and the batch's reference before leaving: once next()
     * has left, a destroy() on another thread may free L. */
    uint64_t t1 = npyl_now_ns();
    atomic_fetch_add(&L->st.wait_ns, t1 - t0);
    atomic_store(&L->st.last_return_ns, t1);
    if (*out) {
        hand_out_rows(L, (*out)->slot);
        atomic_fetch_add(&L->refs, 1); /* dropped by the batch's release */
        atomic_fetch_add(&L->st.batches, 1);
        atomic_fetch_add(&L->st.samples, rows);
        if ((*out)->first)
            atomic_fetch_add(&L->st.fill_wait_ns, t1 - t0);
    }
    /* Rows the reader dropped count when their batch is handed out, as data
     * or as the error MAX_ERRORS made of it: a batch read ahead and dropped
     * by set_epoch was never missing any. */
    atomic_fetch_add(&L->st.skipped_out, dropped);
    npyl_slots_leave_next(&L->ring);
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
    return b ? (b->slot->local ? b->slot->local : b->slot->indices) : NULL;
}

const uint32_t *npyload_batch_sources(const npyload_batch *b)
{
    return b ? b->slot->src : NULL;
}

int64_t npyload_loader_source_samples(const npyload_loader *L, size_t k)
{
    if (!L || k >= L->nsources)
        return NPYLOAD_EINVAL;
    if (!L->src_samples) /* not started */
        return 0;
    return (int64_t)atomic_load_explicit(&L->src_samples[k], memory_order_relaxed);
}

int npyload_loader_digest(const npyload_loader *L, uint64_t *digest, uint64_t *rows)
{
    if (!L || !digest || !rows)
        return NPYLOAD_EINVAL;
    npyload_loader *M = (npyload_loader *)L; /* the lock is not part of the value */
    pthread_mutex_lock(&M->dig_mu);
    *digest = L->digest;
    *rows = L->digest_rows;
    pthread_mutex_unlock(&M->dig_mu);
    return 0;
}

size_t npyload_batch_num_fields(const npyload_batch *b) { return b ? b->nfields : 0; }

const npyload_array *npyload_batch_field(const npyload_batch *b, size_t i)
{
    return (b && i < b->nfields) ? &b->slot->arrays[i] : NULL;
}

uint64_t npyload_batch_epoch(const npyload_batch *b)
{
    return b ? b->slot->epoch : 0;
}

int64_t npyload_batch_seq(const npyload_batch *b) { return b ? b->slot->seq : -1; }

int npyload_batch_augment(const npyload_batch *b, size_t index, uint8_t *hflip,
                          uint8_t *vflip, int64_t *top, int64_t *left)
{
    if (!b || index >= b->nfields)
        return NPYLOAD_EINVAL;
    const npyl_slot *s = b->slot;
    const npyl_field *f = &b->owner->fields[index];
    for (size_t r = 0; r < s->rows; r++) {
        npyl_aug a = {0, 0, 0, 0};
        if (npyl_field_transformed(f)) {
            int64_t seed, idx;
            uint64_t epoch;
            npyl_slot_aug_key(s, r, &seed, &epoch, &idx);
            npyl_aug_decide(npyl_field_plan(f, s->mrows ? (int64_t)s->mrows[r].source : -1),
                            seed, epoch, idx, &a);
        }
        if (hflip)
            hflip[r] = (uint8_t)a.hflip;
        if (vflip)
            vflip[r] = (uint8_t)a.vflip;
        if (top)
            top[r] = a.top;
        if (left)
            left[r] = a.left;
    }
    return 0;
}

/* wait_stream (sync == 0) and sync (sync == 1): on the user's thread, so
 * its current device is kept as it was. */
static int batch_copy_wait(npyload_batch *b, void *stream, int sync)
{
    if (!b)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(b->owner))
        return NPYLOAD_EFORKED;
    if (!b->device_mode)
        return 0;
    return npyl_device_batch_wait(&b->owner->dev, b->slot, stream, sync);
}

int npyload_batch_wait_stream(npyload_batch *b, void *stream)
{
    return batch_copy_wait(b, stream, 0);
}

int npyload_batch_sync(npyload_batch *b) { return batch_copy_wait(b, NULL, 1); }

/* Gives a batch's slot back and drops the batch's reference on the loader
 * (the last one, after destroy, frees it). With a stream (device batches),
 * the slot's next copy must be ordered after the work queued on it so far,
 * and the slot is never handed back unordered (npyl_device_order_release):
 * if neither an event nor a host wait can order it, the slot is POISONED:
 * withdrawn for the loader's lifetime, and the loader fails (next() returns
 * NPYLOAD_ECUDA with the reason) until set_epoch/set_state. Its memory is
 * freed with the loader (cudaFree waits for the device). */
static int release(npyload_batch *b, void *stream, int on_stream)
{
    if (!b)
        return NPYLOAD_EINVAL;
    npyload_loader *L = b->owner;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED; /* fork() child: never touch the parent's lock or streams */
    npyl_slot *s = b->slot;
    if (npyl_slots_disown(b) != 0) {
        char msg[NPYL_ERRMSG_LEN];
        snprintf(msg, sizeof msg, "npyload_batch_release: batch %" PRId64 " of epoch %" PRIu64
                 " (handle %p) is not held by the caller: it was released already; "
                 "ignored", b->seq, b->epoch, (void *)b);
        npyl_loader_msg(L, msg);
        return NPYLOAD_ESTATE;
    }
    int recorded = 0, ordered = 1;
    char why[512] = "", msg[NPYL_ERRMSG_LEN] = "";
    if (b->device_mode && on_stream)
        ordered = npyl_device_order_release(&L->dev, s, stream, &recorded, why, sizeof why);
    if (!ordered)
        snprintf(msg, sizeof msg, "CUDA device %d: releasing batch %" PRId64 " on stream %p: "
                 "neither an event nor a host wait could order the slot's reuse after the "
                 "stream's work (%.400s); the slot is withdrawn", L->dev.device, b->seq,
                 stream, why);
    npyl_slots_give_back(&L->ring, s, ordered, recorded, msg);
    if (!ordered)
        npyl_loader_msg(L, msg);
    npyl_loader_unref(L); /* destroyed earlier and this was its last batch: freed */
    return 0;
}

void npyload_batch_release(npyload_batch *b) { (void)release(b, NULL, 0); }

int npyload_batch_release_checked(npyload_batch *b) { return release(b, NULL, 0); }

void npyload_batch_release_stream(npyload_batch *b, void *stream) { (void)release(b, stream, 1); }
