/* The position, owned here: the pass rules (begin_pass, pass_batches),
 * set_epoch, and the resume state, as the 0.3 struct (get_state /
 * set_state) and as the growable byte string (save_state / load_state,
 * the format below). Every change runs with the control turn
 * (npyl_ctl_enter); the readers take the ring's mu through
 * npyl_slots_position. Before start the position is what set_epoch and
 * set_state chose (L->epoch, L->pending), reported once the fields are
 * read (start, or start and stop, read them).
 *
 * Pass rules, as DataLoader's iter() does it: the first begin_pass after
 * create or set_epoch(e) runs epoch e from its first batch (START); after
 * set_state, the restored position (RESUME), or, when the saved pass had
 * ended, the next epoch (ADVANCE); every later begin_pass the next epoch
 * (ADVANCE). Right after set_state, set_epoch with the restored epoch keeps
 * the restored position (the usual `for e in range(saved, n):
 * set_epoch(e)`). next() returning NPYLOAD_EOF ends the pass (the ring's
 * pass_ended, saved as loop_ended). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_loader_internal.h"

/* ---- the checks of a saved state ---- */

/* Checks every field of a saved state (it may come from an untrusted
 * checkpoint) and computes the batch to resume at. Comparisons are made in
 * unsigned arithmetic after range checks, so no value can wrap into a
 * negative position. `n` is the loader's sample count, or -1 when the
 * fields are not read yet (then the state's own num_samples sizes the
 * check, and start compares it with the fields). The order parameters the
 * state selects (seed, shuffle, drop_last, epoch, base) are stored in *op
 * on success; other members of *op are left as the caller set them. */
static int state_check(npyload_loader *L, const npyload_state *st, int64_t n,
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
    int64_t smin = 0, smax = 0; /* the option's range: one table (options.c) */
    npyload_option_range(NPYLOAD_OPT_SHUFFLE, &smin, &smax);
    if (st->shuffle < smin || st->shuffle > smax)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: shuffle = %" PRId64
                                " out of range: %" PRId64 " .. %" PRId64 " (an npyload_shuffle)",
                                st->shuffle, smin, smax);
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

/* ---- the position ---- */

/* The position get_state, save_state, num_batches and pass_batches report:
 * the order of the current generation, its batches, where it began and
 * the next batch, and whether its pass ended. */
typedef struct posnow {
    npyl_order_params op;
    int64_t delivered, nbatches, first_seq, next_seq;
    int ended;
} posnow;

/* position_now's body, with the control turn free (see below). */
static int position_of(const npyload_loader *L, posnow *p);

/* 0, or NPYLOAD_ESTATE when nothing is known yet (the fields not read).
 * For the readers (get_state, save_state, num_batches, pass_batches, on
 * any thread): waits for the control call in progress, if any, so that
 * what set_epoch and set_state write before start, and start itself, are
 * never read half done; the ring's part is read under its mu. */
/* A reader's turn: the control call in progress (if any) finished, none
 * begins until read_end. */
static npyload_loader *read_begin(const npyload_loader *L)
{
    npyload_loader *M = (npyload_loader *)L; /* the locks are not part of the value */
    pthread_mutex_lock(&M->ctl);
    while (M->ctl_busy && !M->destroying)
        pthread_cond_wait(&M->ctl_cv, &M->ctl);
    return M;
}

static void read_end(npyload_loader *M) { pthread_mutex_unlock(&M->ctl); }

static int position_now(const npyload_loader *L, posnow *p)
{
    npyload_loader *M = read_begin(L);
    int rc = position_of(L, p);
    read_end(M);
    return rc;
}

static int position_of(const npyload_loader *L, posnow *p)
{
    npyload_loader *M = (npyload_loader *)L;
    if (L->started) {
        npyl_position pos;
        npyl_slots_position(&M->ring, &pos);
        p->op = pos.op;
        p->delivered = pos.delivered;
        p->nbatches = pos.nbatches;
        p->first_seq = pos.gen_first_seq;
        p->next_seq = pos.next_seq;
        p->ended = pos.pass_ended;
        return 0;
    }
    if (!L->fields_loaded || L->opt[NPYLOAD_OPT_BATCH_SIZE] < 1)
        return NPYLOAD_ESTATE;
    npyl_loader_order_of(L, &p->op);
    p->first_seq = 0;
    p->ended = 0;
    if (L->state_pending) {
        /* Checked by set_state against these fields: only computed here. */
        char keep[NPYL_ERRMSG_LEN];
        npyload_loader_errmsg_copy(L, keep, sizeof keep);
        if (state_check(M, &L->pending, npyl_loader_epoch_len(L), &p->op, &p->first_seq) != 0) {
            npyl_loader_msg(M, keep);
            return NPYLOAD_ESTATE;
        }
        p->ended = L->pending_ended;
    }
    p->delivered = npyl_order_delivered_len(&p->op);
    p->nbatches = npyl_order_num_batches(&p->op);
    if (p->first_seq > p->nbatches)
        p->first_seq = p->nbatches;
    p->next_seq = p->first_seq;
    return 0;
}

/* The position as the 0.3 struct. */
static void state_of(const npyload_loader *L, const posnow *p, npyload_state *out)
{
    const npyl_order_params *op = &p->op;
    int64_t consumed = p->next_seq * op->batch_size;
    if (consumed > p->delivered)
        consumed = p->delivered;
    memset(out, 0, sizeof *out);
    out->version = NPYLOAD_STATE_VERSION;
    out->seed = op->seed;
    out->epoch = op->epoch;
    out->consumed = (uint64_t)consumed;
    out->num_samples = npyl_loader_epoch_len(L);
    out->batch_size = op->batch_size;
    out->world_size = op->world_size;
    out->rank = op->rank;
    out->shuffle = op->shuffle;
    out->drop_last = op->drop_last;
    out->base = op->base;
}

int64_t npyload_loader_num_batches(const npyload_loader *L)
{
    if (!L)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    posnow p;
    int rc = position_now(L, &p); /* set_state may change it (drop_last) */
    return rc ? rc : p.nbatches;
}

int64_t npyload_loader_pass_batches(const npyload_loader *L)
{
    if (!L)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    posnow p;
    int rc = position_now(L, &p);
    if (rc)
        return rc;
    if (!p.ended)
        return p.nbatches - p.first_seq;
    /* The pass ran out: the next one is a whole epoch (its split, base 0). */
    npyl_order_params next = p.op;
    next.base = 0;
    return npyl_order_num_batches(&next);
}

int npyload_loader_get_state(const npyload_loader *L, npyload_state *out)
{
    if (!L || !out)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    posnow p;
    int rc = position_now(L, &p);
    if (rc)
        return rc;
    state_of(L, &p, out);
    return 0;
}

/* A generation that could not be built: out of memory, or the mixture's
 * refusal (an epoch before its weights' history: its message). */
static int reset_failed(npyload_loader *L, int rc, const char *what, uint64_t epoch)
{
    if (rc == -ENOMEM || !L->ring.mix)
        return npyl_loader_fail(L, rc, "out of memory %s %" PRIu64, what, epoch);
    return npyl_loader_fail(L, rc, "%s %" PRIu64 ": %s", what, epoch,
                            npyl_mix_errmsg(L->ring.mix));
}

/* ---- the mixture ---- */

int npyl_state_mix_new(npyload_loader *L, int64_t seed, int shuffle, npyl_mix **out)
{
    size_t K = L->nsources;
    const npyl_field *f0 = &L->fields[0];
    npyl_mix_source *src = calloc(K, sizeof *src);
    int64_t *sizes = malloc((f0->npaths ? f0->npaths : 1) * sizeof *sizes);
    if (!src || !sizes) {
        free(src);
        free(sizes);
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    }
    for (size_t k = 0; k < f0->npaths; k++)
        sizes[k] = f0->files[k].count;
    for (size_t k = 0; k < K; k++) {
        size_t a = f0->src_first[k], b = k + 1 < K ? f0->src_first[k + 1] : f0->npaths;
        src[k] = (npyl_mix_source){.n = L->src_n[k], .file_sizes = sizes + a,
                                   .nfiles = b - a};
    }
    int64_t window = L->opt[NPYLOAD_OPT_SHUFFLE_WINDOW];
    npyl_mix_params mp = {.sources = src, .nsources = K, .weights = L->weights,
                          .samples_per_epoch = npyl_loader_epoch_len(L), .shuffle = shuffle,
                          .seed = seed, .window = window ? window : DEFAULT_WINDOW};
    char err[NPYL_ERRMSG_LEN - 64];
    int rc = npyl_mix_create(&mp, out, err, sizeof err);
    free(src);
    free(sizes);
    return rc ? npyl_loader_fail(L, rc, "%s", err) : 0;
}

/* The mixture's part of a saved state, parsed (its records as found). */
typedef struct mixrec {
    int have;                 /* any mix_* record */
    const unsigned char *n, *w, *d; /* K values each: mix_samples, _weights, _draws */
    uint64_t count_n, count_w, count_d;
    uint64_t block, epoch, position;
    int have_block, have_epoch, have_position;
    int have_digest;
    uint64_t digest, digest_rows;
} mixrec;

/* The state's mixture as npyl_mix_state_save's form (npyload_mix.h,
 * "Resume"), T = num_samples: malloc'd into *out, or fails naming what is
 * missing. Checked in full by npyl_mix_state_load. */
static int mix_bytes(npyload_loader *L, const mixrec *m, int64_t T, unsigned char **out,
                     size_t *len)
{
    size_t K = L->nsources;
    if (!K && m->have)
        return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "saved state is of a mixture of %"
                                PRIu64 " sources; this loader has no sources",
                                m->count_n);
    if (!K)
        return 0;
    if (!m->have)
        return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "saved state has no mixture (a loader "
                                "without sources); this loader mixes %zu sources", K);
    if (!m->n || !m->w || !m->d || !m->have_block || !m->have_epoch || !m->have_position)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state lacks one of mix_samples, "
                                "mix_weights, mix_draws, mix_block, mix_epoch, mix_position");
    if (m->count_n != K || m->count_w != K || m->count_d != K)
        return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "saved state is of a mixture of %"
                                PRIu64 " sources; this loader mixes %zu", m->count_n, K);
    size_t n = NPYL_MIX_STATE_HEADER + K * NPYL_MIX_STATE_RECORD;
    unsigned char *b = calloc(1, n);
    if (!b)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    memcpy(b, "NPYLMIX", 8);
    npyl_put_le(b + 8, NPYL_MIX_STATE_VERSION, 4);
    npyl_put_le(b + 12, K, 4);
    npyl_put_le(b + 16, (uint64_t)T, 8);
    npyl_put_le(b + 24, m->block, 8);
    npyl_put_le(b + 32, m->epoch, 8);
    npyl_put_le(b + 40, m->position, 8);
    for (size_t k = 0; k < K; k++) {
        unsigned char *r = b + NPYL_MIX_STATE_HEADER + k * NPYL_MIX_STATE_RECORD;
        uint64_t u = npyl_get_le(m->w + 8 * k, 8);
        if (u > UINT32_MAX) {
            free(b);
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: mix_weights[%zu] = %"
                                    PRIu64 " out of range", k, u);
        }
        npyl_put_le(r, npyl_get_le(m->n + 8 * k, 8), 8);
        npyl_put_le(r + 8, npyl_get_le(m->d + 8 * k, 8), 8);
        npyl_put_le(r + 16, u, 4);
    }
    *out = b;
    *len = n;
    return 0;
}

/* Puts a saved mixture in force on a new mixture of seed and shuffle
 * (*out; NULL without sources). */
static int mix_restore(npyload_loader *L, const unsigned char *b, size_t len, int64_t seed,
                       int shuffle, npyl_mix **out)
{
    *out = NULL;
    if (!b)
        return 0;
    int rc = npyl_state_mix_new(L, seed, shuffle, out);
    if (rc)
        return rc;
    if ((rc = npyl_mix_state_load(*out, b, len)) != 0) {
        npyl_loader_fail(L, rc, "saved state: %s", npyl_mix_errmsg(*out));
        npyl_mix_destroy(*out);
        *out = NULL;
    }
    return rc;
}

/* The point a weight change takes effect: the generation's global position
 * after the batches handed out, (epoch, T) when its pass ended. */
static int64_t change_point(const npyl_order_params *op, int64_t delivered, int64_t next_seq,
                            int ended, int64_t T)
{
    if (ended)
        return T;
    int64_t consumed = next_seq * op->batch_size;
    if (consumed > delivered)
        consumed = delivered;
    uint64_t rest = (uint64_t)(T - op->base), W = (uint64_t)op->world_size;
    if ((uint64_t)consumed >= (rest + W - 1) / W)
        return T;
    uint64_t P = (uint64_t)op->base + (uint64_t)consumed * W;
    return P > (uint64_t)T ? T : (int64_t)P;
}

/* Puts w in force at (epoch, P) on L->ring.mix; *moved: the mixture
 * changed (the same weights change nothing). */
static int mix_change(npyload_loader *L, uint64_t epoch, int64_t P, const double *w, int *moved)
{
    uint64_t e0, e1;
    int64_t p0, p1;
    npyl_mix_segment(L->ring.mix, &e0, &p0, NULL, NULL);
    int rc = npyl_mix_set_weights(L->ring.mix, epoch, P, w);
    if (rc)
        return npyl_loader_fail(L, rc, "set_weights at position %" PRId64 " of epoch %" PRIu64
                                ": %s", P, epoch, npyl_mix_errmsg(L->ring.mix));
    npyl_mix_segment(L->ring.mix, &e1, &p1, NULL, NULL);
    *moved = e1 != e0 || p1 != p0;
    return 0;
}

static int set_weights_ctl(npyload_loader *L, const double *w)
{
    size_t K = L->nsources;
    char err[NPYL_ERRMSG_LEN - 64];
    uint32_t *u = malloc(K * sizeof *u);
    if (!u)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    int rc = npyl_mix_quantize(w, K, L->fields_loaded ? L->src_n : NULL, u, err, sizeof err);
    free(u);
    if (rc)
        return npyl_loader_fail(L, rc, "set_weights: %s", err);
    if (L->started) {
        npyl_position pos;
        npyl_slots_position(&L->ring, &pos);
        int64_t T = npyl_loader_epoch_len(L);
        int64_t P = change_point(&pos.op, pos.delivered, pos.next_seq, pos.pass_ended, T);
        int moved = 0;
        if ((rc = mix_change(L, pos.op.epoch, P, w, &moved)))
            return rc;
        if (moved && P < T) {
            /* The rest of the epoch from P, split as an elastic resume at P. */
            npyl_order_params op = pos.op;
            op.base = P;
            if ((rc = npyl_slots_reset(&L->ring, &op, 0, 0)))
                return reset_failed(L, rc, "set_weights: building the rest of epoch",
                                    op.epoch);
        }
    } else {
        L->weights_after_state = L->state_pending;
    }
    memcpy(L->weights, w, K * sizeof *w);
    L->weights_given = 1;
    npyl_loader_clear(L);
    return 0;
}

int npyload_loader_set_weights(npyload_loader *L, const double *w, size_t k)
{
    if (!L || !w)
        return NPYLOAD_EINVAL;
    int rc = npyl_loader_forked(L);
    if (rc || (rc = npyl_ctl_enter(L)))
        return rc;
    if (!L->nsources)
        rc = npyl_loader_fail(L, NPYLOAD_EINVAL, "set_weights: the loader has no sources "
                              "(npyload_loader_add_source)");
    else if (k != L->nsources)
        rc = npyl_loader_fail(L, NPYLOAD_EINVAL, "set_weights: %zu weights for %zu sources",
                              k, L->nsources);
    else
        rc = set_weights_ctl(L, w);
    npyl_ctl_leave(L);
    return rc;
}

/* ---- set_epoch, begin_pass ---- */

/* set_epoch's body; the caller holds the control turn (npyl_ctl_enter). */
static int set_epoch_ctl(npyload_loader *L, uint64_t epoch)
{
    /* The restored epoch, and whether a batch was handed out since. */
    uint64_t restored = L->epoch;
    int moved = 0;
    if (L->keep_restored && L->started) {
        npyl_position now;
        npyl_slots_position(&L->ring, &now);
        restored = now.op.epoch;
        moved = now.next_seq != now.gen_first_seq;
    }
    if (L->keep_restored && epoch == restored && !moved) {
        /* Right after set_state, the restored epoch: go on from the
         * restored position (even one whose pass had ended). */
        L->pass_rule = NPYL_PASS_RESUME;
        if (L->started)
            npyl_slots_reopen(&L->ring);
        L->pending_ended = 0;
        npyl_loader_clear(L);
        return 0;
    }
    L->pass_rule = NPYL_PASS_START;
    L->keep_restored = 0;
    if (!L->started) {
        L->epoch = epoch;
        L->state_pending = 0;
        free(L->mix_pending);
        L->mix_pending = NULL;
        L->weights_after_state = 0;
        L->pending_ended = 0;
        npyl_loader_clear(L);
        return 0;
    }
    npyl_position pos;
    npyl_slots_position(&L->ring, &pos);
    /* Nothing consumed yet of this very epoch: keep the batches already
     * prefetched (start; set_epoch(0) is the common pattern). */
    if (epoch == pos.op.epoch && pos.next_seq == 0 && pos.gen_first_seq == 0 &&
        pos.op.base == 0 && !pos.failed) {
        npyl_slots_reopen(&L->ring);
        npyl_loader_clear(L);
        return 0;
    }
    npyl_order_params op = pos.op;
    op.epoch = epoch;
    op.base = 0; /* a new epoch is the normal split */
    int rc = npyl_slots_reset(&L->ring, &op, 0, 0);
    if (rc)
        return reset_failed(L, rc, "building the order of epoch", epoch);
    npyl_loader_clear(L);
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

/* The last epoch a pass may advance to: epochs are int64 in Python, and a
 * state must round-trip. */
#define NPYL_EPOCH_MAX ((uint64_t)INT64_MAX)

static int begin_pass_ctl(npyload_loader *L)
{
    if (!L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "begin_pass() before start()");
    npyl_position pos;
    npyl_slots_position(&L->ring, &pos);
    int rc = 0;
    switch (L->pass_rule) {
    case NPYL_PASS_START:
        /* set_epoch's epoch from its first batch (nothing to do when
         * nothing of it was consumed). */
        rc = set_epoch_ctl(L, pos.op.epoch);
        break;
    case NPYL_PASS_ADVANCE:
        if (pos.op.epoch >= NPYL_EPOCH_MAX)
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "epoch %" PRIu64 " is the last one; "
                                    "call set_epoch() to choose the next", pos.op.epoch);
        rc = set_epoch_ctl(L, pos.op.epoch + 1);
        break;
    default: /* RESUME: the restored position as it is */
        npyl_slots_reopen(&L->ring);
        break;
    }
    if (rc)
        return rc;
    L->pass_rule = NPYL_PASS_ADVANCE;
    L->keep_restored = 0;
    return 0;
}

int npyload_loader_begin_pass(npyload_loader *L)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int rc = npyl_loader_forked(L);
    if (rc || (rc = npyl_ctl_enter(L)))
        return rc;
    rc = begin_pass_ctl(L);
    npyl_ctl_leave(L);
    return rc;
}

int npyload_loader_pass_rule(const npyload_loader *L)
{
    if (!L)
        return NPYLOAD_EINVAL;
    npyload_loader *M = read_begin(L);
    int rule = L->pass_rule;
    read_end(M);
    return rule;
}

/* ---- set_state ---- */

/* set_state's body (ended: the saved pass had run out); the caller holds
 * the control turn. */
static int set_state_ctl(npyload_loader *L, const npyload_state *st, int ended,
                         unsigned char *mb, size_t mlen, const mixrec *m)
{
    npyl_order_params op;
    int64_t first_seq;
    if (!L->started) {
        /* Checked now; against the fields' count when they were read
         * already (start, or start and stop), else at start. */
        memset(&op, 0, sizeof op);
        int rc = state_check(L, st, L->fields_loaded ? npyl_loader_epoch_len(L) : -1, &op,
                             &first_seq);
        if (rc)
            return rc;
        if (mb && L->fields_loaded) {
            npyl_mix *check = NULL; /* the mixture's checks, now */
            if ((rc = mix_restore(L, mb, mlen, st->seed, (int)st->shuffle, &check)))
                return rc;
            npyl_mix_destroy(check);
        }
        free(L->mix_pending);
        L->mix_pending = mb; /* ours now (NULL without sources) */
        L->mix_pending_len = mlen;
        mb = NULL;
        L->weights_after_state = 0;
        npyl_loader_adopt_order(L, st->seed, st->shuffle, st->drop_last);
        L->pending = *st;
        if (st->version < 2)
            L->pending.base = 0;
        L->state_pending = 1;
        L->pending_ended = ended;
        L->epoch = st->epoch;
    } else {
        /* Adopt the saved order parameters (installed under mu by reset;
         * only the ctl holder changes L->ring.op, so reading it here needs
         * no mu). */
        op = L->ring.op;
        int rc = state_check(L, st, npyl_loader_epoch_len(L), &op, &first_seq);
        npyl_mix *mix = NULL, *was = L->ring.mix;
        if (rc || (rc = mix_restore(L, mb, mlen, st->seed, (int)st->shuffle, &mix))) {
            free(mb);
            return rc;
        }
        free(mb);
        mb = NULL;
        if (mix)
            L->ring.mix = mix; /* the saved history, with the saved seed and shuffle */
        rc = npyl_slots_reset(&L->ring, &op, first_seq, ended);
        if (rc) {
            L->ring.mix = was;
            npyl_mix_destroy(mix);
            return npyl_loader_fail(L, rc, "out of memory restoring the state");
        }
        if (mix)
            npyl_mix_destroy(was);
        npyl_loader_adopt_order(L, st->seed, st->shuffle, st->drop_last);
    }
    if (m && m->have_digest) {
        pthread_mutex_lock(&L->dig_mu);
        L->digest = m->digest;
        L->digest_rows = m->digest_rows;
        pthread_mutex_unlock(&L->dig_mu);
    }
    free(mb);
    L->pass_rule = ended ? NPYL_PASS_ADVANCE : NPYL_PASS_RESUME;
    L->keep_restored = 1;
    npyl_loader_clear(L);
    return 0;
}

int npyload_loader_set_state(npyload_loader *L, const npyload_state *st)
{
    if (!L || !st)
        return NPYLOAD_EINVAL;
    int rc = npyl_loader_forked(L);
    if (rc || (rc = npyl_ctl_enter(L)))
        return rc;
    if (L->nsources)
        rc = npyl_loader_fail(L, NPYLOAD_EINVAL, "set_state: a mixture's position holds its "
                              "weights' history, which npyload_state cannot: use "
                              "npyload_loader_save_state / npyload_loader_load_state");
    else
        rc = set_state_ctl(L, st, 0, NULL, 0, NULL);
    npyl_ctl_leave(L);
    return rc;
}

int npyl_state_first_epoch(npyload_loader *L)
{
    npyl_order_params first = L->ring.op;
    first.epoch = L->epoch;
    int64_t first_seq = 0;
    if (L->state_pending) {
        int rc = state_check(L, &L->pending, npyl_loader_epoch_len(L), &first, &first_seq);
        if (rc)
            return rc;
        L->state_pending = 0;
    }
    int ended = L->pending_ended;
    if (L->ring.mix && L->mix_pending) {
        /* The restored history (the mixture was made with the state's seed
         * and shuffle, adopted by set_state). */
        int rc = npyl_mix_state_load(L->ring.mix, L->mix_pending, L->mix_pending_len);
        if (rc)
            return npyl_loader_fail(L, rc, "saved state: %s", npyl_mix_errmsg(L->ring.mix));
    }
    if (L->ring.mix && L->weights_after_state) {
        /* Weights set after the state was restored: from its position on. */
        int64_t T = npyl_loader_epoch_len(L);
        int64_t delivered = npyl_order_delivered_len(&first);
        int64_t P = change_point(&first, delivered, first_seq, ended, T);
        int moved = 0;
        int rc = mix_change(L, first.epoch, P, L->weights, &moved);
        if (rc)
            return rc;
        if (moved && P < T) {
            first.base = P;
            first_seq = 0;
        }
    }
    int rc = npyl_slots_reset(&L->ring, &first, first_seq, ended);
    L->pending_ended = 0;
    if (rc)
        return reset_failed(L, rc, "building the order of epoch", first.epoch);
    free(L->mix_pending);
    L->mix_pending = NULL;
    L->weights_after_state = 0;
    return 0;
}

/* ---- the growable form: save_state / load_state ----
 *
 * A byte string, little-endian throughout:
 *
 *   "NPYS"                magic (4 bytes)
 *   u16  format           NPYL_STATE_FORMAT (1)
 *   u16  records          how many follow
 *   u32  length           of the whole string, header included
 *   records, each:
 *     u8   name length    1 .. 63, then the name: [a-z0-9_]
 *     u8   type           'i' int64, 'u' uint64, 'f' float64 (IEEE 754)
 *     u32  count          values that follow (count x 8 bytes)
 *
 * A record is a named list of numbers; the loader's are one value each:
 * version (of the position's content, as npyload_state's: 2; 1 has no
 * base),
 * seed, epoch, consumed, num_samples, batch_size, world_size, rank,
 * shuffle, drop_last, base, loop_ended. A reader refuses a record it does
 * not know, unless its name begins with '_' (then the record may be
 * dropped without changing what is delivered); so a state a newer
 * library wrote (sources, weights, per-source positions) is refused by an
 * older one rather than misread, and records are added without a new
 * format. Names are unique; integers are checked for range as the struct's
 * members are. Python's state_dict() is the same records as a dict. */

#define NPYL_STATE_FORMAT 1
#define NPYL_STATE_MAX_BYTES (1u << 20)

typedef struct srec {
    const char *name;
    char type;
    uint64_t v;           /* the bits of the one value */
    size_t count;         /* 0: one value, v; else count values at vals */
    const uint64_t *vals;
} srec;

/* A mixture's segment as the state saves it (n, U, D per source; block,
 * epoch, position): the running mixture's, a restored one still pending,
 * or before start the first segment of the weights given. */
static int mix_segment_now(const npyload_loader *L, const posnow *p, uint64_t *n, uint64_t *u,
                           uint64_t *d, uint64_t *block, uint64_t *epoch, uint64_t *position)
{
    (void)p;
    size_t K = L->nsources;
    for (size_t k = 0; k < K; k++)
        n[k] = (uint64_t)L->src_n[k];
    if (L->started && L->ring.mix) {
        uint32_t *uu = malloc(K * sizeof *uu);
        int64_t *dd = malloc(K * sizeof *dd);
        if (!uu || !dd) {
            free(uu);
            free(dd);
            return -ENOMEM;
        }
        int64_t pos;
        npyl_mix_segment(L->ring.mix, epoch, &pos, uu, dd);
        for (size_t k = 0; k < K; k++)
            u[k] = uu[k], d[k] = (uint64_t)dd[k];
        *position = (uint64_t)pos;
        *block = (uint64_t)npyl_mix_block(L->ring.mix);
        free(uu);
        free(dd);
        return 0;
    }
    if (L->mix_pending) {
        const unsigned char *b = L->mix_pending;
        *block = npyl_get_le(b + 24, 8);
        *epoch = npyl_get_le(b + 32, 8);
        *position = npyl_get_le(b + 40, 8);
        for (size_t k = 0; k < K; k++) {
            const unsigned char *r = b + NPYL_MIX_STATE_HEADER + k * NPYL_MIX_STATE_RECORD;
            d[k] = npyl_get_le(r + 8, 8);
            u[k] = npyl_get_le(r + 16, 4);
        }
        return 0;
    }
    uint32_t *uu = malloc(K * sizeof *uu);
    char err[256];
    if (!uu)
        return -ENOMEM;
    int rc = npyl_mix_quantize(L->weights, K, NULL, uu, err, sizeof err);
    for (size_t k = 0; k < K; k++)
        u[k] = rc ? 0 : uu[k], d[k] = 0;
    free(uu);
    *block = NPYL_MIX_DEFAULT_BLOCK;
    *epoch = 0;
    *position = 0;
    return rc;
}

int64_t npyload_loader_save_state(const npyload_loader *L, void *buf, size_t cap)
{
    if (!L || (!buf && cap))
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    /* The position, the mixture's segment and the digest in one turn of
     * the control lock: load_state / set_weights on another thread replace
     * the mixture (and free the old one) only while holding the turn. */
    size_t K = L->nsources;
    uint64_t *mv = K ? calloc(3 * K, sizeof *mv) : NULL;
    if (K && !mv)
        return -ENOMEM;
    uint64_t mblock = 0, mepoch = 0, mposition = 0, dig = 0, dig_rows = 0;
    posnow p;
    npyload_loader *M = read_begin(L);
    int rc = position_of(L, &p);
    if (rc == 0 && K)
        rc = mix_segment_now(L, &p, mv, mv + K, mv + 2 * K, &mblock, &mepoch, &mposition);
    if (rc == 0)
        npyload_loader_digest(L, &dig, &dig_rows);
    read_end(M);
    if (rc) {
        free(mv);
        return rc;
    }
    npyload_state st;
    state_of(L, &p, &st);
    const srec recs[] = {
        {"version", 'i', NPYLOAD_STATE_VERSION, 0, NULL},
        {"seed", 'i', (uint64_t)st.seed, 0, NULL},
        {"epoch", 'u', st.epoch, 0, NULL},
        {"consumed", 'u', st.consumed, 0, NULL},
        {"num_samples", 'i', (uint64_t)st.num_samples, 0, NULL},
        {"batch_size", 'i', (uint64_t)st.batch_size, 0, NULL},
        {"world_size", 'i', (uint64_t)st.world_size, 0, NULL},
        {"rank", 'i', (uint64_t)st.rank, 0, NULL},
        {"shuffle", 'i', (uint64_t)st.shuffle, 0, NULL},
        {"drop_last", 'i', (uint64_t)st.drop_last, 0, NULL},
        {"base", 'i', (uint64_t)st.base, 0, NULL},
        {"loop_ended", 'i', (uint64_t)p.ended, 0, NULL},
        /* a mixture (filled below) */
        {"mix_samples", 'i', 0, 0, NULL}, {"mix_weights", 'u', 0, 0, NULL}, {"mix_draws", 'i', 0, 0, NULL},
        {"mix_block", 'i', mblock, 0, NULL}, {"mix_epoch", 'u', mepoch, 0, NULL},
        {"mix_position", 'i', mposition, 0, NULL},
        /* may be dropped: delivers the same rows */
        {"_digest", 'u', dig, 0, NULL}, {"_digest_rows", 'u', dig_rows, 0, NULL},
    };
    srec rec[sizeof recs / sizeof recs[0]];
    memcpy(rec, recs, sizeof recs);
    size_t nrec = sizeof recs / sizeof recs[0];
    size_t at_mix = 12;
    if (K) {
        for (int j = 0; j < 3; j++) {
            rec[at_mix + (size_t)j].count = K;
            rec[at_mix + (size_t)j].vals = mv + (size_t)j * K;
        }
    } else {
        memmove(rec + at_mix, rec + at_mix + 6, 2 * sizeof *rec);
        nrec -= 6;
    }
    size_t len = 12;
    for (size_t i = 0; i < nrec; i++)
        len += 1 + strlen(rec[i].name) + 1 + 4 + 8 * (rec[i].count ? rec[i].count : 1);
    if (cap < len) {
        free(mv);
        return (int64_t)len;
    }
    unsigned char *o = buf;
    memcpy(o, "NPYS", 4);
    npyl_put_le(o + 4, NPYL_STATE_FORMAT, 2);
    npyl_put_le(o + 6, nrec, 2);
    npyl_put_le(o + 8, len, 4);
    size_t at = 12;
    for (size_t i = 0; i < nrec; i++) {
        size_t nl = strlen(rec[i].name);
        o[at++] = (unsigned char)nl;
        memcpy(o + at, rec[i].name, nl);
        at += nl;
        o[at++] = (unsigned char)rec[i].type;
        size_t count = rec[i].count ? rec[i].count : 1;
        npyl_put_le(o + at, count, 4);
        at += 4;
        for (size_t j = 0; j < count; j++, at += 8)
            npyl_put_le(o + at, rec[i].count ? rec[i].vals[j] : rec[i].v, 8);
    }
    free(mv);
    return (int64_t)len;
}

/* The loader's records, by name: index into the struct's members. */
enum { R_VERSION, R_SEED, R_EPOCH, R_CONSUMED, R_N, R_BATCH, R_WORLD, R_RANK, R_SHUFFLE,
       R_DROP, R_BASE, R_ENDED, R_COUNT };
static const char *const rec_names[R_COUNT] = {
    "version", "seed", "epoch", "consumed", "num_samples", "batch_size", "world_size",
    "rank", "shuffle", "drop_last", "base", "loop_ended"};

/* One record's value as an int64 (types 'i', or 'u' up to INT64_MAX; epoch
 * and consumed take the whole uint64 range). */
static int rec_value(npyload_loader *L, int which, int type, uint64_t bits, uint64_t *out)
{
    int unsigned_ok = which == R_EPOCH || which == R_CONSUMED;
    if (type == 'u' && !unsigned_ok && bits > (uint64_t)INT64_MAX)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: %s = %" PRIu64 " out of "
                                "the int64 range", rec_names[which], bits);
    if (type == 'i' && unsigned_ok && (int64_t)bits < 0)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: %s = %" PRId64 " out of "
                                "range: >= 0", rec_names[which], (int64_t)bits);
    if (type == 'f')
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: %s must be an integer",
                                rec_names[which]);
    *out = bits;
    return 0;
}

/* Parses a saved byte string into the struct and the pass flag. */
static int parse_mix_record(npyload_loader *L, const char *name, int type, uint64_t count,
                            const unsigned char *values, mixrec *m);

static int parse_state(npyload_loader *L, const unsigned char *b, size_t len,
                       npyload_state *st, int *ended, mixrec *m)
{
    if (len < 12 || memcmp(b, "NPYS", 4) != 0)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: not an npyload state (no "
                                "\"NPYS\" at its start, %zu bytes)", len);
    uint64_t format = npyl_get_le(b + 4, 2), nrec = npyl_get_le(b + 6, 2);
    uint64_t total = npyl_get_le(b + 8, 4);
    if (format != NPYL_STATE_FORMAT)
        return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "saved state: format %" PRIu64
                                ", this library reads format %d", format, NPYL_STATE_FORMAT);
    if (total != len || len > NPYL_STATE_MAX_BYTES)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: %zu bytes, its header says "
                                "%" PRIu64 " (at most %u)", len, total, NPYL_STATE_MAX_BYTES);
    uint64_t val[R_COUNT] = {0};
    int have[R_COUNT] = {0};
    size_t at = 12;
    for (uint64_t r = 0; r < nrec; r++) {
        if (at + 1 > len)
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: record %" PRIu64
                                    " of %" PRIu64 " is cut off", r + 1, nrec);
        size_t nl = b[at++];
        if (nl < 1 || nl > 63 || at + nl + 5 > len)
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: record %" PRIu64
                                    " has a bad name length (%zu)", r + 1, nl);
        char name[64];
        memcpy(name, b + at, nl);
        name[nl] = 0;
        for (size_t i = 0; i < nl; i++)
            if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') ||
                  name[i] == '_'))
                return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: record %" PRIu64
                                        " has a bad name (only a-z, 0-9 and _)", r + 1);
        at += nl;
        int type = b[at++];
        uint64_t count = npyl_get_le(b + at, 4);
        at += 4;
        if (type != 'i' && type != 'u' && type != 'f')
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: record '%s' has an "
                                    "unknown type %d", name, type);
        if (count > (len - at) / 8)
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: record '%s' is cut off "
                                    "(%" PRIu64 " values)", name, count);
        const unsigned char *values = b + at;
        at += (size_t)count * 8;
        int which = 0;
        while (which < R_COUNT && strcmp(rec_names[which], name) != 0)
            which++;
        int mrc = which == R_COUNT ? parse_mix_record(L, name, type, count, values, m) : 1;
        if (mrc <= 0) {
            if (mrc < 0)
                return mrc;
            continue;
        }
        if (which == R_COUNT) {
            if (name[0] == '_')
                continue; /* may be dropped: it changes nothing delivered */
            return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "saved state: record '%s' is not "
                                    "known to this library (a state of a newer npyload, or "
                                    "of a loader with features this one lacks)", name);
        }
        if (have[which])
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: record '%s' twice",
                                    name);
        if (count != 1)
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: record '%s' holds %"
                                    PRIu64 " values, one expected", name, count);
        int rc = rec_value(L, which, type, npyl_get_le(values, 8), &val[which]);
        if (rc)
            return rc;
        have[which] = 1;
    }
    if (at != len)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: %zu bytes after its last "
                                "record", len - at);
    int64_t version = have[R_VERSION] ? (int64_t)val[R_VERSION] : -1;
    if (version != 1 && version != NPYLOAD_STATE_VERSION)
        return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "saved state has version %" PRId64
                                ", this library reads versions 1 and %d", version,
                                NPYLOAD_STATE_VERSION);
    for (int w = R_SEED; w < R_COUNT; w++)
        if (!have[w] && !(w == R_ENDED || (w == R_BASE && version == 1)))
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state lacks '%s'",
                                    rec_names[w]);
    if (have[R_ENDED] && val[R_ENDED] > 1)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: loop_ended = %" PRId64
                                " out of range: 0 or 1", (int64_t)val[R_ENDED]);
    memset(st, 0, sizeof *st);
    st->version = (uint64_t)version;
    st->seed = (int64_t)val[R_SEED];
    st->epoch = val[R_EPOCH];
    st->consumed = val[R_CONSUMED];
    st->num_samples = (int64_t)val[R_N];
    st->batch_size = (int64_t)val[R_BATCH];
    st->world_size = (int64_t)val[R_WORLD];
    st->rank = (int64_t)val[R_RANK];
    st->shuffle = (int64_t)val[R_SHUFFLE];
    st->drop_last = (int64_t)val[R_DROP];
    st->base = (int64_t)val[R_BASE];
    *ended = (int)val[R_ENDED];
    return 0;
}

/* The mixture's records and the digest: 0 when `name` is one of them
 * (stored in m), 1 when it is not, or the failure. */
static int parse_mix_record(npyload_loader *L, const char *name, int type, uint64_t count,
                            const unsigned char *values, mixrec *m)
{
    static const char *const arrays[] = {"mix_samples", "mix_weights", "mix_draws"};
    static const char *const ones[] = {"mix_block", "mix_epoch", "mix_position", "_digest",
                                       "_digest_rows"};
    for (int i = 0; i < 3; i++) {
        if (strcmp(name, arrays[i]) != 0)
            continue;
        const unsigned char **slot = i == 0 ? &m->n : i == 1 ? &m->w : &m->d;
        uint64_t *c = i == 0 ? &m->count_n : i == 1 ? &m->count_w : &m->count_d;
        if (*slot)
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: record '%s' twice", name);
        if (type == 'f')
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: %s must be integers",
                                    name);
        *slot = values;
        *c = count;
        m->have = 1;
        return 0;
    }
    for (int i = 0; i < 5; i++) {
        if (strcmp(name, ones[i]) != 0)
            continue;
        if (count != 1 || type == 'f')
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: record '%s' must be one "
                                    "integer", name);
        uint64_t v = npyl_get_le(values, 8);
        int *have[] = {&m->have_block, &m->have_epoch, &m->have_position, &m->have_digest,
                       &m->have_digest};
        uint64_t *dst[] = {&m->block, &m->epoch, &m->position, &m->digest, &m->digest_rows};
        if (i < 3 && *have[i])
            return npyl_loader_fail(L, NPYLOAD_EINVAL, "saved state: record '%s' twice", name);
        *have[i] = 1;
        *dst[i] = v;
        if (i < 3)
            m->have = 1;
        return 0;
    }
    return 1;
}

int npyload_loader_load_state(npyload_loader *L, const void *buf, size_t len)
{
    if (!L || !buf)
        return NPYLOAD_EINVAL;
    int rc = npyl_loader_forked(L);
    if (rc || (rc = npyl_ctl_enter(L)))
        return rc;
    npyload_state st;
    int ended = 0;
    mixrec m;
    memset(&m, 0, sizeof m);
    unsigned char *mb = NULL;
    size_t mlen = 0;
    rc = parse_state(L, buf, len, &st, &ended, &m);
    if (rc == 0)
        rc = mix_bytes(L, &m, st.num_samples, &mb, &mlen);
    if (rc == 0)
        rc = set_state_ctl(L, &st, ended, mb, mlen, &m); /* takes mb */
    npyl_ctl_leave(L);
    return rc;
}
