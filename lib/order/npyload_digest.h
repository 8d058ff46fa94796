/* The running digest of a delivered stream: one 64-bit value per rank that
 * two runs compare to prove they delivered the same rows, in the same
 * order, with the same augmentation, without storing their batches.
 * Part of lib/order (depends on lib/common; XXH3 from libxxhash, compiled
 * in from its header: no run-time library).
 *
 * ==== What is hashed, exactly ====
 * The digest starts at 0 and takes each delivered row in order (row r of
 * batch b before row r+1; batch b before b+1; epochs in the order run):
 *   digest' = XXH3_64bits(record)      (XXH3, 64-bit, no seed, no secret:
 *                                       Collet's xxHash >= 0.8.0, whose
 *                                       XXH3 output is frozen)
 * with `record` these little-endian bytes:
 *   offset 0   u64  digest (the value before this row)
 *          8   u32  source (the row's source; 0 without a mixture)
 *         12   u32  naug (the augmented fields below; 0 without augmentation)
 *         16   i64  index (the sample's index within its source; the global
 *                   sample index without a mixture)
 *         24   naug times 24 bytes, one per field that has augmentation, in
 *              the fields' order: u8 hflip, u8 vflip, 6 zero bytes, i64 top,
 *              i64 left (npyload_batch_augment()'s decisions of that row)
 * So the digest after N rows is a function of the N rows alone: not of the
 * batch size, the workers, the backend, the device or where a job was
 * resumed. The state keeps (digest, rows): a resumed job continues from
 * them, and equal pairs mean equal streams (up to XXH3's 2^-64 collision
 * odds: a check against drift, not against an adversary).
 *
 * Why XXH3: specified, maintained (Debian's libxxhash-dev, PyPI's xxhash
 * for checks in Python), and fast on the short records here (about 15 ns a
 * row, measured by bench/bench_mix_order: nothing beside a batch's copy);
 * a cryptographic hash would cost ~10x for no gain against drift. The
 * chaining through the record's first 8 bytes keeps the state at one u64,
 * where XXH3's streaming state would be ~600 bytes of a layout private to
 * the library's version.
 *
 * Pure functions: thread-safe. */
#ifndef NPYLOAD_DIGEST_H
#define NPYLOAD_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#include "../common/npyload_common.h"

/* One augmented field's decisions for one row. */
typedef struct npyl_digest_aug {
    uint8_t hflip, vflip;
    int64_t top, left;
} npyl_digest_aug;

/* The digest after one more row: `aug` holds naug entries (NULL when naug
 * is 0). */
NPYL_HIDDEN uint64_t npyl_digest_row(uint64_t digest, uint32_t source,
                                     int64_t index, const npyl_digest_aug *aug,
                                     size_t naug);

/* The digest after n more rows: source[r] (NULL: all 0), index[r], and
 * row r's naug decisions at aug[r * naug ...] (NULL when naug is 0). */
NPYL_HIDDEN uint64_t npyl_digest_rows(uint64_t digest, size_t n,
                                      const uint32_t *source,
                                      const int64_t *index,
                                      const npyl_digest_aug *aug, size_t naug);

#endif
