/* Sample order: the per-epoch permutation and the split across ranks.
 * Depends on lib/common only.
 *
 * The generator (documented so any language can reproduce it):
 *   key   = splitmix64 chain over (seed, epoch): s0 = splitmix64(seed),
 *           s1 = splitmix64(s0 ^ epoch) ... (see npyload_order.c for the
 *           exact derivation of the four xoshiro256** words)
 *   draws = xoshiro256**, bounded with Lemire's multiply-shift rejection
 *   perm  = Fisher–Yates from the top: for i = n-1 down to 1, j = draw(i+1),
 *           swap(a[i], a[j]), starting from the identity.
 */
#ifndef NPYLOAD_ORDER_H
#define NPYLOAD_ORDER_H

#include <stddef.h>
#include <stdint.h>

#include "../common/npyload_common.h"

typedef struct npyl_order_params {
    int64_t n;            /* samples, >= 0 */
    int shuffle;          /* npyload_shuffle */
    int64_t seed;
    uint64_t epoch;
    int64_t rank;         /* 0 <= rank < world_size */
    int64_t world_size;   /* >= 1 */
    int drop_last;        /* 0/1, semantics in include/npyload.h */
    int64_t batch_size;   /* >= 1 */
    const int64_t *file_sizes; /* LOCAL shuffle: samples per file of the
                                  first field, summing to n */
    size_t nfiles;
    int64_t window;       /* LOCAL shuffle: files per window, >= 1 */
} npyl_order_params;

/* Checks the parameters; 0 or NPYLOAD_EINVAL with a message. */
NPYL_HIDDEN int npyl_order_check(const npyl_order_params *p, char *err,
                                 size_t errlen);

/* Samples this rank gets in one epoch (before dropping a short last batch). */
NPYL_HIDDEN int64_t npyl_order_rank_len(const npyl_order_params *p);

/* Batches this rank gets in one epoch (the same for every rank). */
NPYL_HIDDEN int64_t npyl_order_num_batches(const npyl_order_params *p);

/* Samples actually delivered per epoch on this rank:
 * min(rank_len, num_batches * batch_size). */
NPYL_HIDDEN int64_t npyl_order_delivered_len(const npyl_order_params *p);

/* Fills out[0 .. npyl_order_delivered_len(p)) with this rank's global sample
 * indices for the epoch. Returns 0 or -ENOMEM (it needs an n-entry scratch
 * permutation when shuffling). */
NPYL_HIDDEN int npyl_order_build(const npyl_order_params *p, int64_t *out);

/* The full-epoch permutation of 0..n-1 for (seed, epoch): identity when
 * shuffle is NONE. out has n entries. Returns 0 or -ENOMEM. */
NPYL_HIDDEN int npyl_order_permutation(const npyl_order_params *p,
                                       int64_t *out);

#endif
