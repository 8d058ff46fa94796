/* Sample order: the per-epoch permutation and the split across ranks.
 * Depends on lib/common only.
 *
 * ==== The generator, exactly (so any language reproduces it bit for bit) ====
 * All arithmetic is on unsigned 64-bit integers, wrapping modulo 2^64;
 * `seed` (an int64) is taken as its two's-complement uint64 bit pattern.
 *
 *   G = 0x9E3779B97F4A7C15
 *   mix64(z):  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
 *              z = (z ^ (z >> 27)) * 0x94D049BB133111EB
 *              return z ^ (z >> 31)
 *   splitmix64 step on a state x:  x = x + G; return mix64(x)
 *
 * State derivation for (seed, epoch):
 *   x = seed;  k = step(x)            -- k = mix64(seed + G)
 *   x = k ^ epoch
 *   s0 = step(x); s1 = step(x); s2 = step(x); s3 = step(x)
 * (consecutive splitmix64 outputs are distinct, so the state is never zero).
 *
 * xoshiro256** draw (Blackman & Vigna), rotl = rotate left on 64 bits:
 *   r  = rotl(s1 * 5, 7) * 9
 *   t  = s1 << 17
 *   s2 ^= s0; s3 ^= s1; s1 ^= s2; s0 ^= s3; s2 ^= t; s3 = rotl(s3, 45)
 *   return r
 *
 * Bounded draw in [0, b), b >= 1 (Lemire, "Fast random integer generation in
 * an interval", 2019; nearly divisionless, 128-bit product):
 *   m = draw() * b  (as a 128-bit product);  lo = m mod 2^64
 *   if lo < b:
 *       thr = (2^64 - b) mod b
 *       while lo < thr: m = draw() * b; lo = m mod 2^64
 *   return m >> 64
 *
 * Fisher–Yates from the top on an array a[0..len):
 *   for i = len-1 down to 1: j = bounded(i + 1); swap(a[i], a[j])
 * (len 0 or 1: no draw at all.)
 *
 * FULL shuffle: a = [0, 1, ..., n-1], one generator for (seed, epoch),
 *   Fisher–Yates over all of a.
 *
 * LOCAL shuffle (file_sizes[0..nfiles) of the first field, summing to n;
 * file f holds samples [start_f, start_f + file_sizes[f]) with start_f the sum
 * of the sizes before f; W = window, <= 0 meaning 8):
 *   1. one generator for (seed, epoch); Fisher–Yates over the file list
 *      F = [0, 1, ..., nfiles-1].
 *   2. for w = 0, 1, ...: the window is F[w*W .. min((w+1)*W, nfiles)).
 *      Append to the output the samples of the window's files, file by file
 *      in that (permuted) order, each file's samples ascending; then
 *      Fisher–Yates over just that appended segment, the generator
 *      continuing from where it stands (no re-seeding between steps or
 *      windows).
 *   So the output is a permutation of 0..n-1, and any run of samples inside
 *   one window's segment comes from at most W files.
 *
 * NONE: the identity, no generator.
 *
 * ==== Split across ranks (torch.utils.data.DistributedSampler) ====
 * With S the epoch sequence above (length n), W world_size and B the resume
 * base (0 <= B <= n; 0 except after an elastic resume, see below), the split
 * is over the rest R = S[B..n) of length m = n - B, exactly as if R were the
 * whole dataset (m in place of n, R in place of S):
 *   drop_last = 0: rank_len = ceil(m / W); R is padded to rank_len * W by
 *     repeating its head cyclically (position p >= m holds R[(p - m) mod m]).
 *   drop_last = 1: rank_len = floor(m / W); R is truncated to rank_len * W.
 *   Rank r takes positions r, r + W, r + 2W, ... (rank_len of them).
 *   num_batches = ceil(rank_len / batch_size) (drop_last = 0) or
 *                 floor(rank_len / batch_size) (drop_last = 1), the same on
 *                 every rank; delivered = min(rank_len, num_batches *
 *                 batch_size) samples: a short last batch is kept with
 *                 drop_last = 0, dropped with drop_last = 1.
 *
 * Elastic resume: in DDP every rank consumes the same number c of samples
 * of its split, so after c samples per rank the first c * W positions of the
 * padded R are consumed, and the epoch's global position is
 * B' = min(n, B + c * W). A loader resumed at B' with any world size W'
 * splits S[B'..n) by the same rule: no sample of S is lost, and nothing
 * consumed before is repeated except the padding of the new split (at most
 * W' - 1 samples).
 *
 * Every function here is pure (no global state) and thread-safe.
 */
#ifndef NPYLOAD_ORDER_H
#define NPYLOAD_ORDER_H

#include <stddef.h>
#include <stdint.h>

#include "../common/npyload_common.h"

#define NPYL_ORDER_DEFAULT_WINDOW 8

typedef struct npyl_order_params {
    int64_t n;            /* samples, >= 0 */
    int shuffle;          /* npyload_shuffle */
    int64_t seed;
    uint64_t epoch;
    int64_t rank;         /* 0 <= rank < world_size */
    int64_t world_size;   /* >= 1 */
    int drop_last;        /* 0/1, semantics in include/npyload.h */
    int64_t base;         /* resume base B: positions of the epoch's
                             sequence consumed before this split,
                             0 <= base <= n */
    int64_t batch_size;   /* >= 1 */
    const int64_t *file_sizes; /* LOCAL shuffle: samples per file of the
                                  first field, summing to n (each >= 0);
                                  ignored otherwise */
    size_t nfiles;
    int64_t window;       /* LOCAL shuffle: files per window; <= 0 means
                             NPYL_ORDER_DEFAULT_WINDOW */
} npyl_order_params;

/* Checks the parameters; 0 or NPYLOAD_EINVAL with a message. */
NPYL_HIDDEN int npyl_order_check(const npyl_order_params *p, char *err,
                                 size_t errlen);

/* Samples this rank gets in one epoch (before dropping a short last batch).
 * The size functions assume npyl_order_check(p) == 0. */
NPYL_HIDDEN int64_t npyl_order_rank_len(const npyl_order_params *p);

/* Batches this rank gets in one epoch (the same for every rank). */
NPYL_HIDDEN int64_t npyl_order_num_batches(const npyl_order_params *p);

/* Samples actually delivered per epoch on this rank:
 * min(rank_len, num_batches * batch_size). */
NPYL_HIDDEN int64_t npyl_order_delivered_len(const npyl_order_params *p);

/* The position in the epoch's sequence S (0 .. n-1) of this rank's k-th
 * sample, 0 <= k < npyl_order_rank_len(p): base + r + k*W, wrapped into the
 * rest's head past its end (the split above). O(1); assumes
 * npyl_order_check(p) == 0. */
NPYL_HIDDEN int64_t npyl_order_position(const npyl_order_params *p, int64_t k);

/* Fills out[0 .. npyl_order_delivered_len(p)) with this rank's global sample
 * indices for the epoch. Returns 0, NPYLOAD_EINVAL (bad parameters) or
 * -ENOMEM (it needs an n-entry scratch permutation when shuffling). */
NPYL_HIDDEN int npyl_order_build(const npyl_order_params *p, int64_t *out);

/* The full-epoch permutation of 0..n-1 for (seed, epoch): identity when
 * shuffle is NONE. out has n entries. Rank, world_size, drop_last and
 * batch_size are ignored. Returns 0, NPYLOAD_EINVAL, or -ENOMEM (LOCAL with
 * more than 256 files needs 2 * nfiles entries of scratch). */
NPYL_HIDDEN int npyl_order_permutation(const npyl_order_params *p,
                                       int64_t *out);

#endif
