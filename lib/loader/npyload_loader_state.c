/* Position: set_epoch, and the resume state (get_state, the checks of a
 * saved state, set_state). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_loader_internal.h"

/* set_epoch's body; the caller holds the control turn (npyl_ctl_enter). */
static int set_epoch_ctl(npyload_loader *L, uint64_t epoch)
{
    if (!L->started) {
        L->epoch = epoch;
        L->state_pending = 0;
        L->errmsg[0] = 0;
        return 0;
    }
    npyl_position pos;
    npyl_slots_position(&L->ring, &pos);
    /* Nothing consumed yet of this very epoch: keep the batches already
     * prefetched (start; set_epoch(0) is the common pattern). */
    if (epoch == pos.op.epoch && pos.next_seq == 0 && pos.gen_first_seq == 0 &&
        pos.op.base == 0 && !pos.failed) {
        npyl_slots_set_msg(&L->ring, L->errmsg, sizeof L->errmsg, "");
        return 0;
    }
    npyl_order_params op = pos.op;
    op.epoch = epoch;
    op.base = 0; /* a new epoch is the normal split */
    int rc = npyl_slots_reset(&L->ring, &op, 0, L->errmsg);
    if (rc)
        return npyl_loader_fail(L, rc, "out of memory building the order of epoch %" PRIu64,
                                epoch);
    return 0;
}

int npyload_loader_set_epoch(npyload_loader *L, uint64_t epoch)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int rc = npyl_loader_forked(L);
    if (rc || (rc = npyl_ctl_enter(L)))
        return rc;
    rc = set_epoch_ctl(L, epoch);
    npyl_ctl_leave(L);
    return rc;
}

int npyload_loader_get_state(const npyload_loader *L, npyload_state *out)
{
    if (!L || !out)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    if (!L->started)
        return NPYLOAD_ESTATE;
    npyload_loader *M = (npyload_loader *)L; /* the lock is not part of the value */
    npyl_position pos;
    npyl_slots_position(&M->ring, &pos);
    const npyl_order_params *op = &pos.op;
    int64_t consumed = pos.next_seq * op->batch_size;
    if (consumed > pos.delivered)
        consumed = pos.delivered;
    memset(out, 0, sizeof *out);
    out->version = NPYLOAD_STATE_VERSION;
    out->seed = op->seed;
    out->epoch = op->epoch;
    out->consumed = (uint64_t)consumed;
    out->num_samples = L->n;
    out->batch_size = op->batch_size;
    out->world_size = op->world_size;
    out->rank = op->rank;
    out->shuffle = op->shuffle;
    out->drop_last = op->drop_last;
    out->base = op->base;
    return 0;
}

/* Checks every field of a saved state (it may come from an untrusted
 * checkpoint) and computes the batch to resume at. Comparisons are made in
 * unsigned arithmetic after range checks, so no value can wrap into a
 * negative position. `n` is the loader's sample count, or -1 before start
 * (then the state's own num_samples sizes the check, and start compares it
 * with the fields). The order parameters the state selects (seed, shuffle,
 * drop_last, epoch) are stored in *op on success; other members of *op are
 * left as the caller set them. */
int npyl_state_check(npyload_loader *L, const npyload_state *st, int64_t n,
                     npyl_order_params *op, int64_t *first_seq)
{
    if (st->version != NPYLOAD_STATE_VERSION && st->version != 1)
        return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "saved state has version %" PRIu64
                                ", this library reads versions 1 and %d", st->version,
                                NPYLOAD_STATE_VERSION);
    /* A version 1 struct ends before `base`: never read it. */
    int64_t base = st->version >= 2 ? st->base : 0;
    if (st->batch_size < 1 || st->batch_size > (INT64_C(1) << 31))
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: batch_size = %" PRId64
                                " out of range: 1 .. 2^31", st->batch_size);
    if (st->world_size < 1 || st->world_size > (INT64_C(1) << 24))
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: world_size = %" PRId64
                                " out of range: 1 .. 2^24", st->world_size);
    if (st->rank < 0 || st->rank >= st->world_size)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: rank = %" PRId64
                                " out of range: 0 .. world_size - 1 (%" PRId64 ")",
                                st->rank, st->world_size - 1);
    if (st->shuffle < NPYLOAD_SHUFFLE_NONE || st->shuffle > NPYLOAD_SHUFFLE_LOCAL)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: shuffle = %" PRId64
                                " out of range: 0 (none), 1 (full) or 2 (local)", st->shuffle);
    if (st->drop_last != 0 && st->drop_last != 1)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: drop_last = %" PRId64
                                " out of range: 0 or 1", st->drop_last);
    if (st->num_samples < 0)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: num_samples = %" PRId64
                                " out of range: >= 0", st->num_samples);
    if (base < 0 || base > st->num_samples)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: base = %" PRId64
                                " out of range: 0 .. num_samples (%" PRId64 ")", base,
                                st->num_samples);
    /* seed (any int64) and epoch (any uint64) feed the generator as bit
     * patterns: every value is valid. */
    if (st->batch_size != L->opt[NPYLOAD_OPT_BATCH_SIZE])
        return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "saved state has batch size %" PRId64
                                ", the loader %" PRId64, st->batch_size,
                                L->opt[NPYLOAD_OPT_BATCH_SIZE]);
    if (n >= 0 && st->num_samples != n)
        return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "saved state is for %" PRId64
                                " samples, the fields hold %" PRId64, st->num_samples, n);
    /* The samples per epoch of a rank do not depend on the rank or the
     * permutation: size the check with the state's own N and split. */
    npyl_order_params sz = {.n = st->num_samples, .shuffle = NPYLOAD_SHUFFLE_NONE,
                            .rank = 0, .world_size = st->world_size,
                            .drop_last = (int)st->drop_last, .batch_size = st->batch_size,
                            .base = base};
    char oerr[256];
    int rc = npyl_order_check(&sz, oerr, sizeof oerr);
    if (rc)
        return npyl_loader_fail(L, rc, "saved state: %s", oerr);
    uint64_t delivered = (uint64_t)npyl_order_delivered_len(&sz); /* >= 0 */
    uint64_t B = (uint64_t)st->batch_size;
    if (st->consumed > delivered || (st->consumed % B != 0 && st->consumed != delivered))
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: consumed = %" PRIu64
                                " out of range: a multiple of batch_size %" PRIu64
                                " in 0 .. %" PRIu64 ", or %" PRIu64 " (this rank's samples "
                                "per epoch)", st->consumed, B, delivered, delivered);
    if (st->world_size == L->opt[NPYLOAD_OPT_WORLD_SIZE]) {
        /* The same split, continued: round up, a short last batch counts as
         * consumed. consumed <= delivered < 2^63, so neither the sum nor the
         * cast can overflow. */
        *first_seq = (int64_t)((st->consumed + B - 1) / B);
        op->base = base;
    } else {
        /* Elastic: every rank consumed `consumed` samples, i.e. positions
         * base .. base + consumed * W - 1 of the epoch's sequence (clamped to
         * N: positions past the rest are padding). A new split of the rest
         * starts there. Compared without multiplying, so nothing overflows. */
        uint64_t rest = (uint64_t)(st->num_samples - base);
        uint64_t W = (uint64_t)st->world_size;
        uint64_t pos = st->consumed >= (rest + W - 1) / W ? (uint64_t)st->num_samples
                                                          : (uint64_t)base + st->consumed * W;
        if (pos > (uint64_t)st->num_samples)
            pos = (uint64_t)st->num_samples;
        *first_seq = 0;
        op->base = (int64_t)pos;
    }
    op->seed = st->seed;
    op->shuffle = (int)st->shuffle;
    op->drop_last = (int)st->drop_last;
    op->epoch = st->epoch;
    return 0;
}

/* set_state's body; the caller holds the control turn (npyl_ctl_enter). */
static int set_state_ctl(npyload_loader *L, const npyload_state *st)
{
    npyl_order_params op;
    int64_t first_seq;
    if (!L->started) {
        memset(&op, 0, sizeof op);
        int rc = npyl_state_check(L, st, -1, &op, &first_seq);
        if (rc)
            return rc;
        L->opt[NPYLOAD_OPT_SEED] = st->seed;
        L->opt[NPYLOAD_OPT_SHUFFLE] = st->shuffle;
        L->opt[NPYLOAD_OPT_DROP_LAST] = st->drop_last;
        L->pending = *st;
        L->state_pending = 1;
        L->epoch = st->epoch;
        L->errmsg[0] = 0;
        return 0;
    }
    /* Adopt the saved order parameters (installed under mu by reset; only
     * the ctl holder changes L->ring.op, so reading it here needs no mu). */
    op = L->ring.op;
    int rc = npyl_state_check(L, st, L->n, &op, &first_seq);
    if (rc)
        return rc;
    rc = npyl_slots_reset(&L->ring, &op, first_seq, L->errmsg);
    if (rc)
        return npyl_loader_fail(L, rc, "out of memory restoring the state");
    L->opt[NPYLOAD_OPT_SEED] = st->seed;
    L->opt[NPYLOAD_OPT_SHUFFLE] = st->shuffle;
    L->opt[NPYLOAD_OPT_DROP_LAST] = st->drop_last;
    return 0;
}

int npyload_loader_set_state(npyload_loader *L, const npyload_state *st)
{
    if (!L || !st)
        return NPYLOAD_EINVAL;
    int rc = npyl_loader_forked(L);
    if (rc || (rc = npyl_ctl_enter(L)))
        return rc;
    rc = set_state_ctl(L, st);
    npyl_ctl_leave(L);
    return rc;
}
