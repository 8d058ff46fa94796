/* The ring of batch slots: every SLOT_* transition, under the one mutex
 * that guards them (the rules are in npyload_loader_slots.h). Callers ask
 * here; nothing here calls any other part of the loader. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "npyload_loader_slots.h"

void npyl_slots_init(npyl_ring *r)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->work_cv, &ca);
    pthread_cond_init(&r->ready_cv, &ca);
    pthread_cond_init(&r->dev_cv, &ca);
    pthread_condattr_destroy(&ca);
}

void npyl_slots_fini(npyl_ring *r)
{
    pthread_cond_destroy(&r->work_cv);
    pthread_cond_destroy(&r->ready_cv);
    pthread_cond_destroy(&r->dev_cv);
    pthread_mutex_destroy(&r->mu);
}

static void wake_all(npyl_ring *r)
{
    pthread_cond_broadcast(&r->work_cv);
    pthread_cond_broadcast(&r->dev_cv);
    pthread_cond_broadcast(&r->ready_cv);
}

/* ---- workers ---- */

/* A FREE staging slot for the next read, or NULL. Prefers a slot no copy
 * reads any more; among slots with a pending copy, the one copied earliest
 * (lowest seq; it was queued first). Called with mu held. */
static npyl_slot *free_staging(npyl_ring *r)
{
    npyl_slot *best = NULL;
    for (size_t i = 0; i < r->nh; i++) {
        npyl_slot *s = &r->hslots[i];
        if (s->state != SLOT_FREE)
            continue;
        if (!s->copy_pending)
            return s;
        if (!best || s->seq < best->seq)
            best = s;
    }
    return best;
}

static int have_free_device_slot(const npyl_ring *r)
{
    for (size_t i = 0; i < r->nd; i++)
        if (r->dslots[i].state == SLOT_FREE)
            return 1;
    return 0;
}

/* The next batch into FREE staging slot h: FILLING with the batch's seq,
 * epoch, rows and indices. Called with mu held. */
static void claim_into(npyl_ring *r, npyl_slot *h, int *copy_pending)
{
    /* Copy the batch's indices now, under mu, so a later set_epoch may
     * rebuild seqbuf while the worker reads. */
    int64_t seq = r->claim_seq++;
    int64_t B = r->op.batch_size;
    int64_t lo = seq * B, hi = lo + B < r->delivered ? lo + B : r->delivered;
    h->state = SLOT_FILLING;
    h->gen = r->gen;
    h->seq = seq;
    h->epoch = r->op.epoch;
    h->seed = r->op.seed;
    h->rows = h->planned = (size_t)(hi - lo);
    h->err = 0;
    memcpy(h->indices, r->seqbuf + lo, h->rows * sizeof *h->indices);
    if (h->mrows && r->mixbuf)
        memcpy(h->mrows, r->mixbuf + lo, h->rows * sizeof *h->mrows);
    *copy_pending = h->copy_pending;
}

npyl_slot *npyl_slots_claim(npyl_ring *r, size_t who, int wait, int *copy_pending)
{
    npyl_slot *h = NULL;
    pthread_mutex_lock(&r->mu);
    if (wait) {
        while (!r->stopping) {
            int mine = who < r->workers_on && r->claim_seq < r->nbatches;
            if (mine && (h = free_staging(r)) != NULL)
                break;
            /* Only a wait for a free slot counts (slot_wait_ns): not a
             * parked worker's, nor one for the next pass (a wait whose
             * batches were all claimed by others meanwhile counts
             * nothing). */
            uint64_t t0 = mine ? npyl_now_ns() : 0;
            pthread_cond_wait(&r->work_cv, &r->mu);
            if (mine && who < r->workers_on && r->claim_seq < r->nbatches)
                atomic_fetch_add(&r->slot_wait_ns, npyl_now_ns() - t0);
        }
        if (r->stopping)
            h = NULL;
    } else if (r->claim_seq < r->nbatches && (!r->nd || have_free_device_slot(r))) {
        /* Sync mode: claims are made one at a time by the one caller of
         * next(), so batches are filled in seq order and take_device always
         * finds its turn; it only needs a FREE device slot, checked here so
         * that it never waits. */
        h = free_staging(r);
    }
    if (h)
        claim_into(r, h, copy_pending);
    pthread_mutex_unlock(&r->mu);
    return h;
}

npyl_slot *npyl_slots_claim_ahead(npyl_ring *r, size_t who, int *copy_pending)
{
    npyl_slot *h = NULL;
    pthread_mutex_lock(&r->mu);
    if (!r->stopping && who < r->workers_on && r->claim_seq < r->nbatches &&
        (h = free_staging(r)) != NULL)
        claim_into(r, h, copy_pending);
    pthread_mutex_unlock(&r->mu);
    return h;
}

/* h's generation was abandoned (set_epoch/set_state ran during the read) or
 * the loader stops: discard. Called with mu held. */
static int discard_stale(npyl_ring *r, npyl_slot *h)
{
    if (h->gen == r->gen && !r->stopping)
        return 0;
    h->state = SLOT_FREE;
    pthread_cond_broadcast(&r->work_cv);
    return 1;
}

/* The hand-off's two hot wake-ups (a batch published, a slot given back)
 * are made after mu is unlocked: woken inside, the waiter (on the other
 * core) would at once block again on the mutex its waker still holds, a
 * futex wait and wake and two more context switches per batch. Waking
 * after the unlock is sound here: every waiter re-checks its condition
 * under mu, and the ring outlives both callers (a worker is joined before
 * the ring goes; a release holds the loader's reference until after). */
void npyl_slots_publish(npyl_ring *r, npyl_slot *h, int copy_pending)
{
    pthread_mutex_lock(&r->mu);
    h->copy_pending = copy_pending;
    int ready = !discard_stale(r, h);
    if (ready)
        h->state = SLOT_READY;
    pthread_mutex_unlock(&r->mu);
    if (ready)
        pthread_cond_broadcast(&r->ready_cv);
}

npyl_slot *npyl_slots_take_device(npyl_ring *r, npyl_slot *h, int copy_pending,
                                  int *wait_release)
{
    npyl_slot *d = NULL;
    pthread_mutex_lock(&r->mu);
    h->copy_pending = copy_pending;
    for (;;) {
        if (discard_stale(r, h)) {
            pthread_mutex_unlock(&r->mu);
            return NULL;
        }
        if (r->dev_next_seq == h->seq) {
            for (size_t i = 0; i < r->nd && !d; i++)
                if (r->dslots[i].state == SLOT_FREE)
                    d = &r->dslots[i];
            if (d)
                break;
        }
        pthread_cond_wait(&r->dev_cv, &r->mu);
    }
    d->state = SLOT_FILLING;
    d->gen = h->gen;
    d->seq = h->seq;
    d->epoch = h->epoch;
    d->seed = h->seed;
    d->rows = h->rows;
    d->planned = h->planned;
    memcpy(d->indices, h->indices, h->rows * sizeof *h->indices);
    if (d->mrows && h->mrows)
        memcpy(d->mrows, h->mrows, h->rows * sizeof *h->mrows);
    d->err = h->err;
    if (h->err)
        memcpy(d->errmsg, h->errmsg, NPYL_ERRMSG_LEN);
    *wait_release = d->release_pending;
    d->release_pending = 0;
    r->dev_next_seq++;
    pthread_cond_broadcast(&r->dev_cv);
    pthread_mutex_unlock(&r->mu);
    return d;
}

void npyl_slots_publish_device(npyl_ring *r, npyl_slot *d, npyl_slot *h, int copy_queued,
                               int poison_h)
{
    pthread_mutex_lock(&r->mu);
    if (d->gen != r->gen || r->stopping) {
        d->state = SLOT_FREE; /* set_epoch/set_state ran during the copy */
        pthread_cond_broadcast(&r->dev_cv);
    } else {
        d->state = SLOT_READY;
        pthread_cond_broadcast(&r->ready_cv);
    }
    if (copy_queued)
        h->copy_pending = 1;
    h->state = poison_h ? SLOT_POISONED : SLOT_FREE;
    pthread_cond_broadcast(&r->work_cv);
    pthread_mutex_unlock(&r->mu);
}

/* ---- the consumer ---- */

void npyl_slots_enter_next(npyl_ring *r)
{
    pthread_mutex_lock(&r->mu);
    r->in_next++; /* destroy waits for it to leave */
    pthread_mutex_unlock(&r->mu);
}

void npyl_slots_leave_next(npyl_ring *r)
{
    pthread_mutex_lock(&r->mu);
    if (--r->in_next == 0 && r->stopping)
        pthread_cond_broadcast(&r->ready_cv); /* npyl_slots_stop waits for this */
    pthread_mutex_unlock(&r->mu);
}

static npyl_slot *find_ready(npyl_ring *r)
{
    npyl_slot *list = r->nd ? r->dslots : r->hslots;
    size_t n = r->nd ? r->nd : r->nh;
    for (size_t i = 0; i < n; i++)
        if (list[i].state == SLOT_READY && list[i].gen == r->gen && list[i].seq == r->next_seq)
            return &list[i];
    return NULL;
}

/* Why nothing can be handed out without waiting, or 0 (wait). Called with
 * mu held after find_ready failed. */
static int cannot_wait(npyl_ring *r, int sync, char *errmsg, size_t errlen)
{
    size_t nbatch_slots = r->nd ? r->nd : r->slots_on, poisoned = 0;
    for (size_t i = 0; i < r->nd; i++)
        poisoned += r->dslots[i].state == SLOT_POISONED;
    if (r->held + poisoned >= nbatch_slots)
        /* Every slot is in the caller's hands: waiting would never end. */
        return npyl_fail(errmsg, errlen, NPYLOAD_EHELD, "all %zu batch slots are held by "
                         "the caller%s; release batches (or raise PREFETCH) before asking "
                         "for more", nbatch_slots,
                         poisoned ? " or withdrawn after a failed CUDA release" : "");
    if (sync)
        /* Nothing to wait for: no other thread fills slots. */
        return npyl_fail(errmsg, errlen, NPYLOAD_ESTATE, "synchronous loader: batch %"
                         PRId64 " cannot be read now (no free slot)", r->next_seq);
    return 0;
}

/* Hands out s (READY, next_seq): HELD under a fresh handle; or, when it
 * carries an error, the error (in order, as an error, never as data), the
 * ring failed and the slot FREE. Called with mu held. */
static int hand_out(npyl_ring *r, npyl_slot *s, npyload_batch **out, size_t *rows,
                    size_t *dropped, char *errmsg, size_t errlen)
{
    *dropped = s->planned - s->rows;
    if (s->err) {
        /* next_seq stays: the position saved by get_state excludes the
         * failed batch, so a resume retries it. */
        memcpy(errmsg, s->errmsg, errlen < NPYL_ERRMSG_LEN ? errlen : NPYL_ERRMSG_LEN);
        r->failed = 1;
        s->state = SLOT_FREE;
        pthread_cond_broadcast(&r->work_cv);
        pthread_cond_broadcast(&r->dev_cv);
        return s->err;
    }
    r->next_seq++;
    s->state = SLOT_HELD;
    r->held++;
    /* A fresh handle per hand-out (see npyl_slots_disown). */
    npyload_batch *b = &s->handles[++s->handouts % NPYL_HANDLES];
    b->seq = s->seq;
    b->epoch = s->epoch;
    b->first = s->seq == r->gen_first_seq;
    atomic_store_explicit(&s->owner, b, memory_order_release);
    *out = b;
    *rows = s->rows;
    return 0;
}

int npyl_slots_take_ready(npyl_ring *r, const struct timespec *deadline, int sync, int try,
                          npyload_batch **out, size_t *rows, size_t *dropped, char *errmsg,
                          size_t errlen)
{
    int rc = 0;
    *dropped = 0;
    npyl_slot *s = NULL;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->stopping) {
            /* destroy() on another thread: the loader is going away, so no
             * message. */
            rc = NPYLOAD_ESTATE;
            break;
        }
        if (r->failed == 2) {
            rc = npyl_fail(errmsg, errlen, NPYLOAD_ECUDA, "%s", r->poison_msg);
            break;
        }
        if (r->failed) {
            rc = npyl_fail(errmsg, errlen, NPYLOAD_ESTATE, "the loader failed earlier; call "
                           "set_epoch or set_state to go on");
            break;
        }
        if (r->next_seq >= r->nbatches) {
            rc = NPYLOAD_EOF;
            r->pass_ended = 1;
            break;
        }
        if ((s = find_ready(r)) != NULL)
            break;
        if (sync && try) {
            rc = NPYL_TAKE_AGAIN; /* the caller reads one itself */
            break;
        }
        if ((rc = cannot_wait(r, sync, errmsg, errlen)) != 0)
            break;
        if (!deadline) {
            pthread_cond_wait(&r->ready_cv, &r->mu);
        } else if (pthread_cond_timedwait(&r->ready_cv, &r->mu, deadline) == ETIMEDOUT &&
                   !find_ready(r)) {
            rc = -ETIMEDOUT;
            break;
        }
    }
    if (s)
        rc = hand_out(r, s, out, rows, dropped, errmsg, errlen);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int npyl_slots_disown(npyload_batch *b)
{
    /* Only the release that takes the handle out of owner goes on: a second
     * release of b, or a release of b after its slot was handed out again
     * (under another of its handles), finds owner != b and changes nothing.
     * Handles are kept for the loader's life, so b is never dangling here
     * while the loader exists. */
    npyload_batch *mine = b;
    if (atomic_compare_exchange_strong_explicit(&b->slot->owner, &mine, NULL,
                                                memory_order_acq_rel, memory_order_acquire))
        return 0;
    return NPYLOAD_ESTATE;
}

void npyl_slots_give_back(npyl_ring *r, npyl_slot *s, int ordered, int recorded,
                          const char *why)
{
    pthread_mutex_lock(&r->mu);
    if (ordered) {
        s->release_pending = recorded;
        s->state = SLOT_FREE;
    } else {
        s->release_pending = 0;
        s->state = SLOT_POISONED;
        r->failed = 2;
        snprintf(r->poison_msg, sizeof r->poison_msg, "%s", why);
    }
    r->held--;
    pthread_mutex_unlock(&r->mu);
    wake_all(r); /* after the unlock: see npyl_slots_publish */
}

/* ---- control ---- */

int npyl_slots_build(npyl_ring *r, const npyl_order_params *op, int64_t *out,
                     npyl_mix_row *mrows)
{
    if (!r->mix)
        return npyl_order_build(op, out);
    int rc = npyl_mix_build(r->mix, op, mrows);
    if (rc)
        return rc;
    int64_t n = npyl_order_delivered_len(op);
    for (int64_t i = 0; i < n; i++)
        out[i] = r->src_off[mrows[i].source] + mrows[i].index;
    return 0;
}

void npyl_slots_mix_keep(npyl_slot *s, const size_t *kept)
{
    /* By position, never by sample index: a sample twice in one batch (a
     * small source's passes) has a row per copy, each with its own pass,
     * and one copy's read may fail while the other's succeeds. kept[] is
     * increasing, kept[r] >= r: moving rows down overwrites none unread. */
    if (!s->mrows || s->rows == s->planned)
        return;
    for (size_t r = 0; r < s->rows; r++)
        s->mrows[r] = s->mrows[kept[r]];
}

int npyl_slots_reset(npyl_ring *r, const npyl_order_params *op, int64_t first_seq,
                     int ended)
{
    /* Build the new order without mu (O(N): a permutation of every sample)
     * into the spare buffer, which only the ctl holder touches (two builders
     * used to share it: set_epoch(5) || set_epoch(7) could install the
     * previous epoch's order), then swap it in under mu. Workers read seqbuf
     * only under mu. */
    int rc = npyl_slots_build(r, op, r->seqspare, r->mixspare);
    if (rc)
        return rc; /* r->op, gen and the position unchanged */
    pthread_mutex_lock(&r->mu);
    int64_t *old = r->seqbuf;
    r->seqbuf = r->seqspare;
    r->seqspare = old;
    npyl_mix_row *oldm = r->mixbuf;
    r->mixbuf = r->mixspare;
    r->mixspare = oldm;
    r->op = *op;
    r->delivered = npyl_order_delivered_len(op);
    r->nbatches = npyl_order_num_batches(op);
    r->gen++;
    if (first_seq > r->nbatches)
        first_seq = r->nbatches;
    r->gen_first_seq = first_seq;
    r->next_seq = first_seq;
    r->claim_seq = first_seq;
    r->dev_next_seq = first_seq;
    r->failed = 0;
    r->pass_ended = ended;
    /* Batches of the old generation that are READY but not handed out are
     * recycled now; those still being filled are recycled by their worker. */
    for (size_t i = 0; i < r->nh; i++)
        if (r->hslots[i].state == SLOT_READY)
            r->hslots[i].state = SLOT_FREE;
    for (size_t i = 0; i < r->nd; i++)
        if (r->dslots[i].state == SLOT_READY)
            r->dslots[i].state = SLOT_FREE;
    wake_all(r);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

void npyl_slots_position(npyl_ring *r, npyl_position *p)
{
    pthread_mutex_lock(&r->mu);
    p->op = r->op;
    p->next_seq = r->next_seq;
    p->gen_first_seq = r->gen_first_seq;
    p->delivered = r->delivered;
    p->nbatches = r->nbatches;
    p->failed = r->failed;
    p->pass_ended = r->pass_ended;
    pthread_mutex_unlock(&r->mu);
}

void npyl_slots_stop(npyl_ring *r, int wait_next)
{
    pthread_mutex_lock(&r->mu);
    r->stopping = 1;
    wake_all(r);
    while (wait_next && r->in_next)
        pthread_cond_wait(&r->ready_cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

size_t npyl_slots_held(npyl_ring *r)
{
    pthread_mutex_lock(&r->mu);
    size_t n = r->held;
    pthread_mutex_unlock(&r->mu);
    return n;
}

void npyl_slots_reopen(npyl_ring *r)
{
    pthread_mutex_lock(&r->mu);
    r->pass_ended = 0;
    pthread_mutex_unlock(&r->mu);
}

size_t npyl_slots_mark_kept(npyl_ring *r)
{
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->nh; i++)
        r->hslots[i].kept = r->hslots[i].state == SLOT_HELD;
    for (size_t i = 0; i < r->nd; i++)
        r->dslots[i].kept = r->dslots[i].state == SLOT_HELD;
    size_t n = r->held;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* ---- the controller ---- */

void npyl_slots_set_workers(npyl_ring *r, size_t n)
{
    pthread_mutex_lock(&r->mu);
    r->workers_on = n;
    pthread_cond_broadcast(&r->work_cv);
    pthread_mutex_unlock(&r->mu);
}

size_t npyl_slots_retire(npyl_ring *r, size_t want, npyl_slot **out)
{
    size_t n = 0;
    if (want < 1)
        want = 1;
    pthread_mutex_lock(&r->mu);
    for (size_t i = r->nh; i-- > 0 && r->slots_on > want;) {
        npyl_slot *s = &r->hslots[i];
        /* Only a FREE slot no copy reads: HELD (the caller's), FILLING and
         * READY slots stay until they come back. */
        if (s->state != SLOT_FREE || s->copy_pending)
            continue;
        s->state = SLOT_OFF;
        r->slots_on--;
        out[n++] = s;
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

void npyl_slots_offer(npyl_ring *r, npyl_slot *s)
{
    pthread_mutex_lock(&r->mu);
    s->state = SLOT_FREE;
    s->copy_pending = 0;
    r->slots_on++;
    pthread_cond_broadcast(&r->work_cv);
    pthread_mutex_unlock(&r->mu);
}

void npyl_slots_counts(npyl_ring *r, size_t *on, size_t *held)
{
    pthread_mutex_lock(&r->mu);
    *on = r->nd ? r->nd : r->slots_on;
    *held = r->held;
    pthread_mutex_unlock(&r->mu);
}
