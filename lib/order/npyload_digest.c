/* The running digest (npyload_digest.h): XXH3 over each row's record,
 * chained through the record's first 8 bytes. */
#include "npyload_digest.h"

#include <string.h>

/* Header-only: every XXH symbol static inline here, nothing exported and no
 * libxxhash.so to ship. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#if XXH_VERSION_NUMBER < 800
#error "npyload needs xxHash >= 0.8.0 (XXH3's output is frozen from 0.8.0 on)"
#endif

#define HEAD 24
#define AUG 24
#define ONE_SHOT_AUGS 8 /* records up to this many augmented fields: one buffer */

static inline void put_aug(unsigned char *p, const npyl_digest_aug *a)
{
    /* u8 hflip, u8 vflip, 6 zero bytes: one 8-byte store */
    npyl_put_le(p, a->hflip | (uint64_t)a->vflip << 8, 8);
    npyl_put_le(p + 8, (uint64_t)a->top, 8);
    npyl_put_le(p + 16, (uint64_t)a->left, 8);
}

uint64_t npyl_digest_row(uint64_t digest, uint32_t source, int64_t index,
                         const npyl_digest_aug *aug, size_t naug)
{
    unsigned char rec[HEAD + ONE_SHOT_AUGS * AUG];
    npyl_put_le(rec, digest, 8);
    /* u32 source, u32 naug: one 8-byte store (XXH3 reads it whole) */
    npyl_put_le(rec + 8, source | (uint64_t)(uint32_t)naug << 32, 8);
    npyl_put_le(rec + 16, (uint64_t)index, 8);
    if (naug <= ONE_SHOT_AUGS) {
        for (size_t a = 0; a < naug; a++)
            put_aug(rec + HEAD + a * AUG, &aug[a]);
        return XXH3_64bits(rec, HEAD + naug * AUG);
    }
    /* Many augmented fields: the same bytes through XXH3's streaming API,
     * which gives the one-shot's result. */
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, rec, HEAD);
    for (size_t a = 0; a < naug; a++) {
        put_aug(rec, &aug[a]);
        XXH3_64bits_update(&st, rec, AUG);
    }
    return XXH3_64bits_digest(&st);
}

uint64_t npyl_digest_rows(uint64_t digest, size_t n, const uint32_t *source,
                          const int64_t *index, const npyl_digest_aug *aug,
                          size_t naug)
{
    for (size_t r = 0; r < n; r++)
        digest = npyl_digest_row(digest, source ? source[r] : 0, index[r],
                                 naug ? aug + r * naug : NULL, naug);
    return digest;
}
