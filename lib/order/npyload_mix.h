/* Weighted mixing of several sources into one epoch order, with exact,
 * elastic resume, also when the weights change. Part of lib/order (depends
 * on lib/common only); it reuses the single-source order's generator,
 * permutations and split (npyload_order.h), whose text this one extends.
 * Written so that any language reproduces it bit for bit: the Python
 * reference in tests/python/mix_reference.py is written from this text.
 *
 * ==== The model ====
 * A mixture has K >= 1 sources k = 0 .. K-1 (in the order given), source k
 * holding n_k >= 0 samples, and a weight w_k >= 0 per source (a double; at
 * least one positive; a source with a positive weight must hold samples).
 * One epoch is a sequence M of T positions, T = samples_per_epoch; its
 * default (given as 0) is n_0 + ... + n_{K-1}, all the sources' samples
 * whatever the weights, so an epoch's length does not move when the weights
 * do. Position p of epoch e holds a row (k, i): sample i of source k. Which
 * row is a pure function of (seed, epoch, position) and the weights in
 * force (their history, see "Segments").
 *
 * Everything downstream is the single-source order with M in place of the
 * permutation S (npyload_order.h, "Split across ranks", with n = T): the
 * split across ranks like DistributedSampler, drop_last, padding, batches
 * (a batch mixes sources row by row, as the positions fall), the resume
 * base and elastic resume at another world size. Positions that drop_last
 * drops or that padding repeats are still positions of M: they draw (and
 * advance their source's stream) exactly once each.
 *
 * ==== A source's stream ====
 * Each source draws from its own endless stream. Its c-th draw (c = 0, 1,
 * ..., counted from the first epoch on, never reset) is
 *   pass q = floor(c / n_k),  offset j = c mod n_k,  sample = P_{k,q}[j]
 * where P_{k,q} is the single-source permutation of npyload_order.h for
 * n = n_k, the loader's shuffle mode (NONE: identity; FULL; LOCAL with
 * source k's own file sizes and the loader's window), seed
 *   s_k = seed XOR mix64(k * G)      (uint64 arithmetic, mix64 and G as in
 *                                     npyload_order.h; mix64(0) = 0, so
 *                                     s_0 is the loader's seed)
 * and epoch = q. So a small source cycles, a new permutation each pass,
 * while a large one is read once, across epochs, before any of its samples
 * repeats.
 *
 * ==== Weights in force ====
 * The doubles become integers once, when they are given. With S = w_0 + w_1
 * + ... + w_{K-1} summed left to right in double precision:
 *   U_k = 0                                     when w_k = 0,
 *   U_k = max(1, floor(w_k / S * 2^30 + 0.5))   otherwise (double arithmetic),
 * so a weight counts to 2^-30 of the total, and a tiny positive weight still
 * draws. U = U_0 + ... + U_{K-1} <= 2^30 + K. Weights that give the same
 * U are the same weights.
 *
 * ==== The interleave: which source, position by position ====
 * A balanced binary tree over the source indices: the node of [lo, hi) (the
 * root is [0, K)) is a leaf when hi - lo = 1, else its children are
 * [lo, mid) and [mid, hi), mid = lo + floor((hi - lo) / 2). A node's weight
 * s is the sum of U_k over its range; its left child's weight is a. Of the
 * first t positions that reach a node, the left child gets
 *   left(t) = floor(t / s) * a + floor((2 * a * (t mod s) + s) / (2 * s))
 * (0 when s = 0), the right child the other t - left(t): Bresenham's rule
 * with rounding, so |left(t) - t * a / s| <= 1/2, and left(t) never
 * decreases and grows by 0 or 1 per position.
 *   count_k(t): how many of the stream's first t positions go to source k:
 *     from the root to leaf k, t <- left(t) at each step to the left,
 *     t <- t - left(t) at each step to the right; the leaf's t.
 *   source(t): the leaf that position t (0-based) reaches: at each node go
 *     left, t <- left(t), when left(t + 1) > left(t); else go right,
 *     t <- t - left(t).
 * Both cost O(log K). Every prefix holds each source's share to within half
 * a row per level: |count_k(t) - t * U_k / U| <= ceil(log2 K) / 2 for every
 * t, so the proportions are exact, with no drift however long the stream.
 *
 * ==== Segments: the weights' history ====
 * The weights change only at a point (E, P) of the run: epoch E, position
 * P (0 <= P < T). A segment is (E, P, U[K], D[K]), D_k the draws of source
 * k before (E, P) (over every earlier segment). The first segment is
 * (0, 0, U of the weights given at creation, all D_k = 0). Inside a segment
 * the interleave is one stream across its epochs: position p of epoch
 * e >= E (p >= P when e = E) has the stream index
 *   tau(e, p) = (e - E) * T + (p - P).
 * (Continuing the stream across epochs, rather than restarting it in each
 * epoch, is what keeps long-run proportions exact: a restart would round
 * the same way every epoch.)
 *
 * ==== Blocks and the shuffle ====
 * The positions of an epoch are cut into blocks of B (the last one may be
 * shorter): block j covers [j*B, min((j+1)*B, T)); in a segment's first
 * epoch the block holding P is cut at P too (its part before P belongs to
 * the previous segment). For a block [lo, hi) of epoch e:
 *   L[i] = source(tau(e, lo) + i),   i = 0 .. hi - lo - 1,
 * then, unless shuffle is NONE, Fisher-Yates over L (npyload_order.h) with
 * the generator of (seed XOR mix64((2^63 + j) * G), e). Position lo + i
 * draws from source k = L[i], and its draw number in k's stream is
 *   c = D_k + count_k(tau(e, lo)) + #{i' < i : L[i'] = k}.
 * So each block holds exactly the interleave's quota of each source
 * (|quota - (hi - lo) * U_k / U| <= ceil(log2 K)) in a random order within
 * the block; a rank, which takes every W-th position, gets an unbiased
 * (hypergeometric) share of every block. With shuffle NONE the rows follow
 * the interleave itself and each source reads in stored order: a fixed
 * pattern, so with world_size > 1 a rank may see some sources only (1:1
 * weights at W = 2 give rank 0 source 0 and rank 1 source 1); shuffle for
 * training. Default B: NPYL_MIX_DEFAULT_BLOCK.
 * Random access: a position's source and draw number cost O(B log K + K)
 * (its block, computed once and cached; a rank's scan carries the counts
 * from block to block); its sample needs P_{k,q}, one O(n_k) Fisher-Yates
 * per pass (cached here, one pass per source).
 *
 * ==== Changing the weights ====
 * Between epochs: a new segment starts at (E, 0), E the next epoch, with
 * D_k = the old segment's D_k + count_k(tau(E, 0)). Setting the same
 * weights again (the same U) changes nothing, so a script that sets its
 * schedule's weights before every epoch stays exact.
 * Mid-epoch: exact from the next batch. The change point is the epoch's
 * global position P = min(T, base + consumed * world_size), the part of
 * the epoch every rank has consumed (in DDP every rank must change after
 * the same number of batches, as for any collective call); the new segment
 * starts at (e, P), D_k = the draws of source k before P in the old
 * segment (its shuffled block included), and the rest of the epoch,
 * positions P .. T-1, is split over the ranks as after an elastic resume
 * at base P. A change at P = T is a change at (e + 1, 0).
 * Positions before the current segment's start are no longer known: a
 * lookup there (an earlier epoch; the change's epoch from its start when
 * P > 0) is refused with NPYLOAD_ESTATE.
 *
 * ==== Resume ====
 * Beyond the single-source state (seed, shuffle, epoch, position, base),
 * the order needs the current segment: (E, P, U[K], D[K]) -- O(K), however
 * many epochs and changes came before. npyl_mix_state_save writes it, with
 * K, T, B and each n_k to check against on restore, in this little-endian
 * form (version 1):
 *   offset 0   8 bytes  "NPYLMIX" and a NUL
 *          8   u32      version (1)
 *         12   u32      K
 *         16   i64      T
 *         24   i64      B
 *         32   u64      E
 *         40   i64      P
 *         48   K times 24 bytes: i64 n_k, i64 D_k, u32 U_k, u32 0
 * A reader refuses another version, a size other than 48 + 24 K, and any
 * field out of range, naming it; K, T, B or an n_k other than the
 * loader's is NPYLOAD_EMISMATCH.
 *
 * ==== Augmentation of a mixture row (for the loader) ====
 * The decisions of npyload.h's "Augmentation" with seed -> s_k,
 * epoch -> q (the row's pass) and the sample index i: a pure function of
 * the row (padding repeats its row's decisions), a small source's repeats
 * get new decisions each pass, and one source (K = 1, T = n_0) decides
 * exactly as the single-source loader.
 *
 * ==== Properties (tests/test_mix.c, tests/python/test_mix_order.py) ====
 *  - K = 1 with T = n_0: M is the single-source order of npyload_order.h,
 *    for every shuffle mode, seed and epoch;
 *  - the draws of each source are consecutive in its stream: over the run,
 *    source k's draws are exactly c = 0, 1, 2, ... once each;
 *  - a resumed state, at any world size, with any weight history, gives the
 *    rows of the uninterrupted run.
 *
 * Limits: K <= NPYL_MIX_MAX_SOURCES; 1 <= B <= NPYL_MIX_MAX_BLOCK; T and
 * each n_k within the single-source order's limit on n; a lookup in epoch e
 * needs max_k D_k + (e - E + 1) * T <= INT64_MAX (NPYLOAD_ETOOBIG beyond).
 *
 * Thread-safety: an npyl_mix caches the current block and one permutation
 * per source: one thread at a time per object. npyl_mix_quantize is pure.
 */
#ifndef NPYLOAD_MIX_H
#define NPYLOAD_MIX_H

#include <stddef.h>
#include <stdint.h>

#include "../common/npyload_common.h"
#include "npyload_order.h"

#define NPYL_MIX_DEFAULT_BLOCK 64
#define NPYL_MIX_MAX_BLOCK (1 << 20)
#define NPYL_MIX_MAX_SOURCES 65536
#define NPYL_MIX_WEIGHT_ONE (1u << 30) /* the quantised weights' scale */
#define NPYL_MIX_STATE_VERSION 1
#define NPYL_MIX_STATE_HEADER 48      /* bytes before the per-source records */
#define NPYL_MIX_STATE_RECORD 24      /* bytes per source */

typedef struct npyl_mix_source {
    int64_t n;                 /* samples, >= 0 */
    const int64_t *file_sizes; /* LOCAL shuffle: samples per file of the
                                  source's first field, summing to n;
                                  ignored otherwise (copied at create) */
    size_t nfiles;
} npyl_mix_source;

typedef struct npyl_mix_params {
    const npyl_mix_source *sources; /* K of them, copied */
    size_t nsources;                /* K, 1 .. NPYL_MIX_MAX_SOURCES */
    const double *weights;          /* K weights in force from epoch 0 */
    int64_t samples_per_epoch;      /* T; 0: the sum of the n_k */
    int64_t block;                  /* B; 0: NPYL_MIX_DEFAULT_BLOCK */
    int shuffle;                    /* npyload_shuffle */
    int64_t seed;
    int64_t window;                 /* LOCAL: files per window, <= 0: 8 */
} npyl_mix_params;

/* One position's row: source, sample index within the source, and the
 * source's pass (q above: the augmentation's epoch for this row). */
typedef struct npyl_mix_row {
    int64_t index;
    uint64_t pass;
    uint32_t source;
} npyl_mix_row;

typedef struct npyl_mix npyl_mix;

/* Quantises K weights into u[K] (the "Weights in force" rule), checking
 * them: finite, >= 0, at least one > 0; with `n` (may be NULL) a positive
 * weight on a source with n[k] == 0 is refused. Pure.
 * @return : 0, or NPYLOAD_EINVAL with a message naming the source. */
NPYL_HIDDEN int npyl_mix_quantize(const double *w, size_t k, const int64_t *n,
                                  uint32_t *u, char *err, size_t errlen);

/* s_k = seed XOR mix64(k * G): the seed of source k's permutations, and of
 * its rows' augmentation decisions ("Augmentation of a mixture row"). Pure. */
NPYL_HIDDEN int64_t npyl_mix_source_seed(int64_t seed, size_t k);

/* Creates a mixture (first segment: epoch 0, position 0, no draws).
 * @return : 0; NPYLOAD_EINVAL (a bad parameter, named in err); -ENOMEM. */
NPYL_HIDDEN int npyl_mix_create(const npyl_mix_params *p, npyl_mix **out,
                                char *err, size_t errlen);

/* NULL-safe. */
NPYL_HIDDEN void npyl_mix_destroy(npyl_mix *m);

/* T, K and B as in force. */
NPYL_HIDDEN int64_t npyl_mix_epoch_len(const npyl_mix *m);
NPYL_HIDDEN size_t npyl_mix_num_sources(const npyl_mix *m);
NPYL_HIDDEN int64_t npyl_mix_block(const npyl_mix *m);

/* The current segment: its start (epoch, position), the quantised weights
 * (K entries, may be NULL) and the draws before it (K entries, may be
 * NULL). */
NPYL_HIDDEN void npyl_mix_segment(const npyl_mix *m, uint64_t *epoch,
                                  int64_t *position, uint32_t *u, int64_t *d);

/* The last failure's message ("" when none). */
NPYL_HIDDEN const char *npyl_mix_errmsg(const npyl_mix *m);

/* Rows of n positions pos[0..n) of epoch `epoch` into out[0..n). Fastest
 * with positions in increasing order (the block and the permutations are
 * cached). @return : 0; NPYLOAD_EINVAL (a position outside 0 .. T-1);
 * NPYLOAD_ESTATE (before the segment's start); NPYLOAD_ETOOBIG (the
 * limits); -ENOMEM. */
NPYL_HIDDEN int npyl_mix_rows(npyl_mix *m, uint64_t epoch, const int64_t *pos,
                              size_t n, npyl_mix_row *out);

/* This rank's rows of the epoch, as npyl_order_build gives a rank's
 * samples: `split` is the split (rank, world_size, drop_last, base,
 * batch_size) with split->n == T; its shuffle, seed and file fields are
 * ignored. out holds npyl_order_delivered_len(split) rows. @return : as
 * npyl_mix_rows, or NPYLOAD_EINVAL for a bad split. */
NPYL_HIDDEN int npyl_mix_build(npyl_mix *m, const npyl_order_params *split,
                               npyl_mix_row *out);

/* The draws of each source before position `position` (0 .. T) of epoch
 * `epoch` into draws[K] (so draws after the epoch's last position with
 * position == T). @return : as npyl_mix_rows. O(K + B). */
NPYL_HIDDEN int npyl_mix_draws_before(npyl_mix *m, uint64_t epoch,
                                      int64_t position, int64_t *draws);

/* Puts weights w[K] in force from position `position` (0 .. T) of epoch
 * `epoch` on ("Changing the weights"); the same quantised weights as now
 * change nothing. @return : 0; NPYLOAD_EINVAL (bad weights or position);
 * NPYLOAD_ESTATE (a point before the current segment's start);
 * NPYLOAD_ETOOBIG (the limits). On failure nothing changes. */
NPYL_HIDDEN int npyl_mix_set_weights(npyl_mix *m, uint64_t epoch,
                                     int64_t position, const double *w);

/* Bytes of the serialised state: NPYL_MIX_STATE_HEADER + K *
 * NPYL_MIX_STATE_RECORD. */
NPYL_HIDDEN size_t npyl_mix_state_size(const npyl_mix *m);

/* Writes the state ("Resume") into buf[0 .. npyl_mix_state_size(m)).
 * @return : 0, or NPYLOAD_EINVAL when len is smaller. */
NPYL_HIDDEN int npyl_mix_state_save(const npyl_mix *m, void *buf, size_t len);

/* Reads a state written by npyl_mix_state_save (untrusted bytes: every
 * field is checked before use) and puts its segment in force.
 * @return : 0; NPYLOAD_EINVAL (malformed: which field);
 * NPYLOAD_EMISMATCH (K, T, B or an n_k differs from this mixture's).
 * On failure nothing changes. */
NPYL_HIDDEN int npyl_mix_state_load(npyl_mix *m, const void *buf, size_t len);

#endif
