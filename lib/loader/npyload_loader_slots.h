/* lib/loader's slots: the ring of batch slots and the schedule of the
 * current generation (its order, the claim / device / hand-out positions),
 * guarded by one mutex. This file's .c is the only place a slot's state
 * (SLOT_*) changes and the only user of mu and the condition variables;
 * the worker, the device copy and the API ask it (claim, publish, take
 * ready, give back, reset, stop).
 *
 * Concurrency model, in one place:
 *  - One mutex (mu) guards every field below marked [mu]. Work is coarse
 *    (one lock round-trip per batch per stage, batches are megabytes), so a
 *    single lock is simpler than lock-free rings and never the bottleneck.
 *  - Workers sleep on work_cv until a batch can be claimed (a free staging
 *    slot and an unclaimed batch of the current generation), read it with no
 *    lock held, then publish it. The consumer sleeps on ready_cv until the
 *    batch with seq == next_seq of the current generation is published.
 *    In device mode, workers also wait on dev_cv for their turn to take a
 *    device slot: device slots are taken strictly in seq order, so a batch
 *    ahead can never occupy the last device slot while an earlier batch
 *    waits for one (that would deadlock the in-order consumer).
 *  - A generation (gen) is one pass over an epoch's batches. set_epoch and
 *    set_state start a new generation (npyl_slots_reset); work of an older
 *    generation is discarded when it finishes (its slot goes back to FREE) —
 *    in-flight reads are never cancelled, they land in memory the loader
 *    still owns.
 *  - Batch handles: each slot has NPYL_HANDLES handles used in turn, one per
 *    hand-out; owner is the one the caller holds (NULL when none). release
 *    claims it with a compare-and-swap (npyl_slots_disown), so a second
 *    release of a handle, or a release of a handle whose slot was handed out
 *    again since (under another handle), finds owner != handle and is
 *    refused: no count moves.
 *  - Device mode, staging slots: a worker queues the copy of its host slot
 *    on its own stream and hands the slot back FREE with copy_pending set,
 *    without waiting; whoever claims a FREE slot with copy_pending waits on
 *    its ev_done (no lock held) before reading into it; claims prefer slots
 *    without a pending copy (npyload_loader_device.h has the event rules).
 *  - Slots handed to the caller are HELD until released. A device slot
 *    released on a stream that can be neither ordered by an event nor waited
 *    for is POISONED: never reused.
 *  - The control mutex (ctl, npyload_loader_internal.h) is never taken with
 *    mu held. */
#ifndef NPYLOAD_LOADER_SLOTS_H
#define NPYLOAD_LOADER_SLOTS_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "../order/npyload_mix.h"
#include "../order/npyload_order.h"
#include "npyload_loader_types.h"

/* Handles per slot, used in turn: a stale handle is recognised until its
 * slot has been handed out NPYL_HANDLES more times (see npyl_slots_disown). */
#define NPYL_HANDLES 8

/* SLOT_OFF: a staging slot without memory, outside the ring (the
 * controller, npyload_loader_auto.h, shrank the ring): touched only by the
 * ctl holder, which gives it memory and offers it back (npyl_slots_offer). */
enum { SLOT_FREE = 0, SLOT_FILLING, SLOT_READY, SLOT_HELD, SLOT_POISONED, SLOT_OFF };

/* A slot: host staging memory (host slots) or device memory (device slots).
 * In host mode the host slots are also the batches handed out. The fields
 * not marked [mu] belong to whoever holds the slot (FILLING: its worker;
 * HELD: the caller). */
typedef struct npyl_slot {
    int state;            /* [mu] SLOT_* */
    uint64_t gen;         /* [mu] generation it was filled for */
    int64_t seq;          /* [mu] batch position in the rank's epoch */
    uint64_t epoch;       /* the epoch it belongs to */
    int64_t seed;         /* and its order's seed (augmentation draws) */
    size_t rows;          /* the rows it holds (ON_ERROR skip drops some) */
    size_t planned;       /* the rows its batch was claimed with */
    int64_t *indices;     /* slot_rows entries */
    /* A mixture (NULL otherwise; slot_rows entries each): each row's
     * mixture row as claimed (source, index within it, pass), kept in step
     * with `indices` when ON_ERROR skip drops rows (npyl_slots_mix_keep);
     * at hand-out (next.c) `local` and `src` are what the batch accessors
     * give: the index within the source and the source. */
    npyl_mix_row *mrows;
    int64_t *local;
    uint32_t *src;
    int err;              /* a failed batch carries its error in order */
    char *errmsg;         /* NPYL_ERRMSG_LEN, only when err != 0 */
    uint8_t *mem;
    npyload_array *arrays; /* one per field, pointing into mem */
    npyload_batch *handles; /* NPYL_HANDLES handles, one per hand-out in turn;
                               kept until the loader is freed (a destroyed
                               loader keeps them all) so a stale handle is
                               never dangling */
    uint64_t handouts;    /* [mu] times the slot was handed out */
    _Atomic(npyload_batch *) owner; /* the handle the caller holds, or NULL:
                                       set under mu at hand-out, cleared by
                                       the release that wins the CAS */
    /* device mode: */
    void *ev_done, *ev_release; /* copy done (recorded by the copying
                                   worker; on a staging slot: the copy that
                                   reads it), slot released (by the consumer;
                                   device slots only) */
    void *ev_start;       /* staging slots: before the copy (timing); created
                             by the first worker that copies from the slot */
    int release_pending;  /* [mu] ev_release recorded and not yet waited on */
    int copy_pending;     /* [mu] staging slot: ev_done not yet waited on */
    int kept;             /* HELD when destroy ran (npyl_slots_mark_kept) */
} npyl_slot;

/* A handle to a handed-out batch. `owner` is the loader, opaque here: the
 * API reads its fields through it, nothing below the API does. */
struct npyload_batch {
    npyload_loader *owner;
    npyl_slot *slot;
    size_t nfields;
    int device_mode;
    int64_t seq;          /* the hand-out's batch and epoch (for messages) */
    uint64_t epoch;
    int first;            /* the first batch of its generation: its wait is
                             the pass's fill (the controller leaves it out) */
};

typedef struct npyl_ring {
    pthread_mutex_t mu;
    pthread_cond_t work_cv, ready_cv, dev_cv;
    npyl_slot *hslots;        /* staging (host) slots */
    size_t nh;
    npyl_slot *dslots;        /* device slots (device mode) */
    size_t nd;
    /* Order of the current generation. [mu] */
    npyl_order_params op;
    int64_t *seqbuf;          /* this rank's delivered indices for the epoch */
    int64_t *seqspare;        /* the next order is built here (by the ctl
                                 holder only, without mu), then swapped */
    /* A mixture: the mixture whose rows each generation delivers (NULL:
     * the single-source order), used and replaced by the ctl holder only;
     * the sources' first global indices (src_off[k]); each row of seqbuf as
     * a mixture row (mixbuf, [mu]) and its spare. */
    npyl_mix *mix;
    const int64_t *src_off;
    npyl_mix_row *mixbuf, *mixspare;
    int64_t delivered;        /* entries in seqbuf */
    int64_t nbatches;
    uint64_t gen;
    int64_t next_seq;         /* next batch next() hands out */
    int64_t claim_seq;        /* next batch a worker claims */
    int64_t dev_next_seq;     /* next batch to take a device slot */
    int64_t gen_first_seq;    /* where the generation began (resume) */
    size_t held;              /* [mu] batch slots held by the caller */
    int failed;               /* [mu] until the next reset: 1 an error was
                                 handed out; 2 a release poisoned a slot */
    char poison_msg[NPYL_ERRMSG_LEN]; /* [mu] failed == 2: why */
    int pass_ended;           /* [mu] next() returned NPYLOAD_EOF in this
                                 generation (or it was restored ended) */
    int stopping;             /* [mu] workers exit, next() returns */
    int in_next;              /* [mu] next() calls inside */
    size_t workers_on;        /* [mu] workers with index >= this claim
                                 nothing (they park on work_cv) */
    size_t slots_on;          /* [mu] staging slots not OFF */
    /* Workers' time waiting in npyl_slots_claim for a FREE staging slot
     * (a batch left to claim, the worker not parked), summed: the slots
     * the workers would use more of. Written under mu, read without. */
    _Atomic uint64_t slot_wait_ns;
} npyl_ring;

NPYL_HIDDEN void npyl_slots_init(npyl_ring *r);
NPYL_HIDDEN void npyl_slots_fini(npyl_ring *r);

/* ---- workers ---- */
/* Claims the next batch into a FREE staging slot (preferring one no copy
 * reads any more): sets it FILLING with the batch's seq, epoch, rows and
 * indices, and *copy_pending to whether a copy may still read it. wait:
 * sleeps until a claim is possible or stop; else (sync mode) needs a FREE
 * device slot too when there are device slots, never sleeps. Returns the
 * slot, or NULL (stopping, or nothing to claim now). */
NPYL_HIDDEN npyl_slot *npyl_slots_claim(npyl_ring *r, size_t who, int wait, int *copy_pending);
/* Read-ahead: claims the next batch as npyl_slots_claim does, without
 * waiting: NULL when no staging slot is FREE, nothing is left to claim, or
 * the loader stops. */
NPYL_HIDDEN npyl_slot *npyl_slots_claim_ahead(npyl_ring *r, size_t who, int *copy_pending);
/* A filled staging slot h, host mode: READY for next() (FREE when its
 * generation was abandoned meanwhile). */
NPYL_HIDDEN void npyl_slots_publish(npyl_ring *r, npyl_slot *h, int copy_pending);
/* Device mode: a filled staging slot h waits for its turn (dev_next_seq ==
 * h->seq) and a FREE device slot, which becomes FILLING with h's batch
 * (seq, rows, indices, error); *wait_release says the consumer's release
 * event must be waited for before the copy. Returns NULL (h FREE) when h's
 * generation was abandoned or the loader stops. */
NPYL_HIDDEN npyl_slot *npyl_slots_take_device(npyl_ring *r, npyl_slot *h, int copy_pending,
                                              int *wait_release);
/* Device mode, after the copy was queued (or failed): d READY (or FREE when
 * abandoned), h FREE (POISONED: poison_h) with copy_pending = copy_queued. */
NPYL_HIDDEN void npyl_slots_publish_device(npyl_ring *r, npyl_slot *d, npyl_slot *h,
                                           int copy_queued, int poison_h);

/* ---- the consumer ---- */
enum { NPYL_TAKE_AGAIN = 0x10000 }; /* not NPYLOAD_EOF (1), not an error */
/* next(): npyl_slots_enter_next / leave_next bracket the whole call
 * (destroy waits for every next() to leave, npyl_slots_stop). */
NPYL_HIDDEN void npyl_slots_enter_next(npyl_ring *r);
NPYL_HIDDEN void npyl_slots_leave_next(npyl_ring *r);
/* Hands out batch next_seq: HELD under a fresh handle, in *out, with
 * *rows. A failed batch returns its error and message (errmsg) instead and
 * marks the ring failed. Either way *dropped is the rows the batch lost to
 * ON_ERROR skip (0 when nothing was handed out). Else: NPYLOAD_ESTATE when
 * stopping (no message) or failed earlier, NPYLOAD_ECUDA when a release
 * poisoned a slot,
 * NPYLOAD_EOF, NPYLOAD_EHELD when every slot is held, -ETIMEDOUT at the
 * deadline (NULL: none). sync: nobody else fills slots: try == 1 returns
 * NPYL_TAKE_AGAIN rather than fail, so the caller may read one itself
 * (npyl_worker_step) and ask again; try == 0 then fails with ESTATE. */
NPYL_HIDDEN int npyl_slots_take_ready(npyl_ring *r, const struct timespec *deadline, int sync,
                                      int try, npyload_batch **out, size_t *rows,
                                      size_t *dropped, char *errmsg, size_t errlen);
/* A release: takes b out of its slot's owner tag. 0 when b was held;
 * NPYLOAD_ESTATE when it was not (released already, or its slot handed out
 * again since): then nothing may change. */
NPYL_HIDDEN int npyl_slots_disown(npyload_batch *b);
/* Gives b's slot back: FREE (release_pending = recorded) when ordered, else
 * POISONED and the ring failed, `why` kept for next() to say. */
NPYL_HIDDEN void npyl_slots_give_back(npyl_ring *r, npyl_slot *s, int ordered, int recorded,
                                      const char *why);

/* ---- control (the ctl holder) ---- */
/* Begins a generation with order parameters `op` (its epoch included) at
 * batch first_seq: builds the order into seqspare without mu, then installs
 * it, recycles READY slots of the old generation and clears the failure;
 * ended: the generation's pass counts as ended already (a state saved at
 * its end). Returns 0 or -ENOMEM, in which case nothing changed. */
NPYL_HIDDEN int npyl_slots_reset(npyl_ring *r, const npyl_order_params *op, int64_t first_seq,
                                 int ended);
/* The order of `op` into out[0 .. npyl_order_delivered_len(op)) as
 * global sample indices (and, with a mixture, its rows into mrows): the
 * builder reset uses, for other readers of the order (the ceiling). The
 * ctl holder only. Returns 0, -ENOMEM, or the mixture's error (its
 * message: npyl_mix_errmsg(r->mix)). */
NPYL_HIDDEN int npyl_slots_build(npyl_ring *r, const npyl_order_params *op, int64_t *out,
                                 npyl_mix_row *mrows);
/* A row's augmentation key: the seed, epoch and index its decisions draw
 * from (npyload.h, "Augmentation"; with a mixture the source's seed, the
 * row's pass and its index within the source: npyload_mix.h). */
static inline void npyl_slot_aug_key(const npyl_slot *s, size_t r, int64_t *seed,
                                     uint64_t *epoch, int64_t *index)
{
    if (s->mrows) {
        *seed = npyl_mix_source_seed(s->seed, s->mrows[r].source);
        *epoch = s->mrows[r].pass;
        *index = s->mrows[r].index;
    } else {
        *seed = s->seed;
        *epoch = s->epoch;
        *index = s->indices[r];
    }
}
/* After ON_ERROR skip compacted s->indices (rows < planned): drops the
 * mixture rows of the rows dropped, so mrows[r] is again indices[r]'s
 * (kept[r]: the planned position of the row now at r, npyl_read_ctx's
 * kept). */
NPYL_HIDDEN void npyl_slots_mix_keep(npyl_slot *s, const size_t *kept);
/* Marks the generation's pass as not ended (set_epoch keeping a restored
 * position). */
NPYL_HIDDEN void npyl_slots_reopen(npyl_ring *r);
/* The position as set_epoch and get_state read it, under mu. */
typedef struct npyl_position {
    npyl_order_params op;
    int64_t next_seq, gen_first_seq, delivered, nbatches;
    int failed, pass_ended;
} npyl_position;
NPYL_HIDDEN void npyl_slots_position(npyl_ring *r, npyl_position *p);
/* Sets stopping and wakes every waiter; wait_next: also waits until no
 * next() is inside. */
NPYL_HIDDEN void npyl_slots_stop(npyl_ring *r, int wait_next);
/* destroy, after stop and with the workers joined: marks the slots the
 * caller holds (kept) and returns how many. A slot not kept is touched by
 * nobody from here on, so it may be freed without mu; a kept one changes
 * state only in its release. */
NPYL_HIDDEN size_t npyl_slots_mark_kept(npyl_ring *r);
/* The batches the caller holds, under mu. */
NPYL_HIDDEN size_t npyl_slots_held(npyl_ring *r);

/* ---- the controller (the ctl holder) ---- */
/* Workers whose index is >= n claim nothing from now on: they finish what
 * they hold and park on work_cv; raising n wakes them. who (claim) is the
 * worker's index. */
NPYL_HIDDEN void npyl_slots_set_workers(npyl_ring *r, size_t n);
/* Takes FREE staging slots out of the ring (OFF), highest index first,
 * until at most `want` are on (never fewer than 1): a slot held, filled or
 * ready is never taken. Writes the slots taken into out (room for r->nh)
 * and returns how many; their memory is the caller's to free, without mu. */
NPYL_HIDDEN size_t npyl_slots_retire(npyl_ring *r, size_t want, npyl_slot **out);
/* An OFF slot whose memory the caller allocated joins the ring (FREE). */
NPYL_HIDDEN void npyl_slots_offer(npyl_ring *r, npyl_slot *s);
/* Under mu: slots on, held by the caller. */
NPYL_HIDDEN void npyl_slots_counts(npyl_ring *r, size_t *on, size_t *held);

#endif
