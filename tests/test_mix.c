/* Tests for lib/order's mixture (npyload_mix.h) and running digest
 * (npyload_digest.h): properties that follow from the specification,
 * checked on the C alone. The comparison with the Python reference written
 * from the header's text is tests/python/test_mix_order.py; the digest's
 * known answers below were computed with PyPI's xxhash (XXH3-64) from
 * npyload_digest.h's record layout. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "order/npyload_digest.h"
#include "order/npyload_mix.h"

#define MAXK 8

typedef struct mixcase {
    size_t k;
    int64_t n[MAXK];
    double w[MAXK];
    int64_t T, B, seed, window;
    int shuffle;
    int64_t files[MAXK][4]; /* LOCAL: file sizes, 0-terminated */
} mixcase;

static npyl_mix *make(const mixcase *c)
{
    npyl_mix_source src[MAXK];
    for (size_t k = 0; k < c->k; k++) {
        size_t nf = 0;
        while (nf < 4 && c->files[k][nf])
            nf++;
        src[k] = (npyl_mix_source){.n = c->n[k], .file_sizes = c->files[k],
                                   .nfiles = nf};
    }
    npyl_mix_params p = {
        .sources = src, .nsources = c->k, .weights = c->w,
        .samples_per_epoch = c->T, .block = c->B, .shuffle = c->shuffle,
        .seed = c->seed, .window = c->window,
    };
    char err[256] = "";
    npyl_mix *m = NULL;
    cr_assert_eq(npyl_mix_create(&p, &m, err, sizeof err), 0, "%s", err);
    return m;
}

static int create_rc(const mixcase *c, char *err, size_t errlen)
{
    npyl_mix_source src[MAXK];
    for (size_t k = 0; k < c->k; k++)
        src[k] = (npyl_mix_source){.n = c->n[k]};
    npyl_mix_params p = {
        .sources = src, .nsources = c->k, .weights = c->w,
        .samples_per_epoch = c->T, .block = c->B, .shuffle = c->shuffle,
    };
    npyl_mix *m = NULL;
    int rc = npyl_mix_create(&p, &m, err, errlen);
    npyl_mix_destroy(m);
    return rc;
}

/* The rows of a whole epoch at world size 1. */
static npyl_mix_row *epoch_rows(npyl_mix *m, uint64_t e)
{
    int64_t T = npyl_mix_epoch_len(m);
    npyl_mix_row *r = calloc((size_t)T + 1, sizeof *r);
    npyl_order_params op = {.n = T, .epoch = e, .world_size = 1,
                            .batch_size = 1};
    cr_assert(r);
    cr_assert_eq(npyl_mix_build(m, &op, r), 0, "%s", npyl_mix_errmsg(m));
    return r;
}

static double depth_bound(size_t k)
{
    return ceil(log2((double)k)) / 2;
}

Test(mix, quantize_known_answers)
{
    uint32_t u[3];
    double a[] = {0.3, 0.7};
    cr_assert_eq(npyl_mix_quantize(a, 2, NULL, u, NULL, 0), 0);
    cr_assert_eq(u[0], 322122547u); /* floor(0.3 * 2^30 + 0.5) */
    cr_assert_eq(u[1], 751619277u);
    double b[] = {1, 1, 1};
    cr_assert_eq(npyl_mix_quantize(b, 3, NULL, u, NULL, 0), 0);
    cr_assert(u[0] == 357913941u && u[1] == u[0] && u[2] == u[0]);
    double c[] = {1e-15, 0, 5};
    cr_assert_eq(npyl_mix_quantize(c, 3, NULL, u, NULL, 0), 0);
    cr_assert(u[0] == 1 && u[1] == 0 && u[2] == (1u << 30));
}

Test(mix, quantize_refuses_bad_weights)
{
    uint32_t u[2];
    char err[256];
    double bad[][2] = {{NAN, 1}, {INFINITY, 1}, {-1, 2}, {0, 0},
                       {1e308, 1e308}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(npyl_mix_quantize(bad[i], 2, NULL, u, err, sizeof err),
                     NPYLOAD_EINVAL, "case %zu accepted", i);
    int64_t n[] = {3, 0};
    double w[] = {1, 1};
    cr_assert_eq(npyl_mix_quantize(w, 2, n, u, err, sizeof err), NPYLOAD_EINVAL);
    cr_assert(strstr(err, "source 1"), "%s", err);
    w[1] = 0;
    cr_assert_eq(npyl_mix_quantize(w, 2, n, u, err, sizeof err), 0);
}

Test(mix, create_refuses_bad_parameters)
{
    char err[256];
    mixcase c = {.k = 2, .n = {5, 5}, .w = {1, 1}, .shuffle = NPYLOAD_SHUFFLE_FULL};
    cr_assert_eq(create_rc(&c, err, sizeof err), 0);
    mixcase bad = c;
    bad.B = NPYL_MIX_MAX_BLOCK + 1;
    cr_assert_eq(create_rc(&bad, err, sizeof err), NPYLOAD_EINVAL);
    bad = c;
    bad.T = -1;
    cr_assert_eq(create_rc(&bad, err, sizeof err), NPYLOAD_EINVAL);
    bad = c;
    bad.k = 0;
    cr_assert_eq(create_rc(&bad, err, sizeof err), NPYLOAD_EINVAL);
    bad = c;
    bad.n[1] = -3;
    cr_assert_eq(create_rc(&bad, err, sizeof err), NPYLOAD_EINVAL);
    cr_assert(strstr(err, "source 1"), "%s", err);
    bad = c;
    bad.shuffle = NPYLOAD_SHUFFLE_LOCAL; /* no file sizes */
    cr_assert_eq(create_rc(&bad, err, sizeof err), NPYLOAD_EINVAL);
}

/* One source with T = n is the single-source order, for every mode, split
 * and resume base. */
Test(mix, one_source_is_the_plain_order)
{
    int modes[] = {NPYLOAD_SHUFFLE_NONE, NPYLOAD_SHUFFLE_FULL, NPYLOAD_SHUFFLE_LOCAL};
    for (size_t mi = 0; mi < 3; mi++) {
        mixcase c = {.k = 1, .n = {37}, .w = {0.25}, .shuffle = modes[mi],
                     .seed = -99, .window = 2, .files = {{10, 3, 20, 4}}};
        npyl_mix *m = make(&c);
        for (uint64_t e = 0; e < 3; e++)
            for (int64_t w = 1; w <= 4; w++)
                for (int64_t r = 0; r < w; r++)
                    for (int drop = 0; drop <= 1; drop++) {
                        npyl_order_params op = {
                            .n = 37, .shuffle = modes[mi], .seed = -99,
                            .epoch = e, .rank = r, .world_size = w,
                            .drop_last = drop, .base = 5 * r, .batch_size = 3,
                            .file_sizes = c.files[0], .nfiles = 4, .window = 2,
                        };
                        int64_t len = npyl_order_delivered_len(&op);
                        int64_t want[40];
                        npyl_mix_row got[40];
                        cr_assert_eq(npyl_order_build(&op, want), 0);
                        cr_assert_eq(npyl_mix_build(m, &op, got), 0);
                        for (int64_t i = 0; i < len; i++) {
                            cr_assert_eq(got[i].source, 0);
                            cr_assert_eq(got[i].index, want[i],
                                         "mode %d epoch %llu row %lld",
                                         modes[mi], (unsigned long long)e,
                                         (long long)i);
                            cr_assert_eq(got[i].pass, e);
                        }
                    }
        npyl_mix_destroy(m);
    }
}

/* draws_before steps by one at each position, for the row's source, and
 * the row is that draw of its source's stream. */
Test(mix, rows_are_consecutive_draws)
{
    mixcase c = {.k = 5, .n = {3, 50, 0, 17, 200}, .w = {0.1, 0.2, 0, 0.3, 0.4},
                 .T = 301, .B = 16, .shuffle = NPYLOAD_SHUFFLE_NONE, .seed = 4};
    /* B = 2 < K/2: the draws come from the tree source by source, not all
     * at once (fill_block's two ways) */
    for (int mode = 0; mode < 4; mode++) {
        c.shuffle = mode & 1 ? NPYLOAD_SHUFFLE_FULL : NPYLOAD_SHUFFLE_NONE;
        c.B = mode & 2 ? 2 : 16;
        npyl_mix *m = make(&c);
        int64_t before[MAXK], after[MAXK];
        for (uint64_t e = 0; e < 3; e++) {
            npyl_mix_row *r = epoch_rows(m, e);
            for (int64_t p = 0; p < c.T; p++) {
                cr_assert_eq(npyl_mix_draws_before(m, e, p, before), 0);
                cr_assert_eq(npyl_mix_draws_before(m, e, p + 1, after), 0);
                size_t k = r[p].source;
                cr_assert_neq(k, 2, "a source of weight 0 drew");
                for (size_t j = 0; j < c.k; j++)
                    cr_assert_eq(after[j] - before[j], j == k,
                                 "epoch %llu position %lld source %zu",
                                 (unsigned long long)e, (long long)p, j);
                cr_assert_eq(r[p].pass, (uint64_t)before[k] / (uint64_t)c.n[k]);
                if (!(mode & 1))
                    cr_assert_eq(r[p].index, before[k] % c.n[k]);
            }
            free(r);
        }
        npyl_mix_destroy(m);
    }
}

/* Each row is its draw's sample: P_{k,q}[j] of the single-source order
 * with source k's seed and epoch q. */
Test(mix, rows_are_the_sources_permutations)
{
    mixcase c = {.k = 2, .n = {7, 40}, .w = {0.5, 0.5}, .T = 100, .B = 16,
                 .shuffle = NPYLOAD_SHUFFLE_FULL, .seed = -3};
    npyl_mix *m = make(&c);
    cr_assert_eq(npyl_mix_source_seed(-3, 0), -3);
    cr_assert_neq(npyl_mix_source_seed(-3, 1), -3);
    int64_t before[2], perm[40];
    for (uint64_t e = 0; e < 2; e++) {
        npyl_mix_row *r = epoch_rows(m, e);
        for (int64_t p = 0; p < c.T; p++) {
            size_t k = r[p].source;
            cr_assert_eq(npyl_mix_draws_before(m, e, p, before), 0);
            npyl_order_params op = {.n = c.n[k], .shuffle = c.shuffle,
                                    .seed = npyl_mix_source_seed(c.seed, k),
                                    .epoch = r[p].pass};
            cr_assert_eq(npyl_order_permutation(&op, perm), 0);
            cr_assert_eq(r[p].index, perm[before[k] % c.n[k]]);
        }
        free(r);
    }
    npyl_mix_destroy(m);
}

/* Every prefix holds the weights to within ceil(log2 K)/2 (at epoch
 * starts however far: no drift), and every block its quota to within
 * ceil(log2 K). */
Test(mix, proportions_are_exact)
{
    mixcase c = {.k = 5, .n = {3, 50, 9, 17, 200}, .w = {0.05, 0.2, 1.0 / 3, 0.3, 0.1167},
                 .T = 1000, .B = 64, .shuffle = NPYLOAD_SHUFFLE_FULL, .seed = 8};
    npyl_mix *m = make(&c);
    uint32_t u[MAXK];
    npyl_mix_segment(m, NULL, NULL, u, NULL);
    double U = 0;
    for (size_t k = 0; k < c.k; k++)
        U += u[k];
    int64_t d[MAXK], d2[MAXK];
    uint64_t far[] = {1, 2, 7, 1000, 123456789, 1000000000000ull};
    for (size_t i = 0; i < sizeof far / sizeof far[0]; i++) {
        cr_assert_eq(npyl_mix_draws_before(m, far[i], 0, d), 0);
        for (size_t k = 0; k < c.k; k++) {
            /* |d - t u_k / U| <= bound, exactly: |d U - t u_k| <= bound U */
            __int128 t = (__int128)far[i] * c.T;
            __int128 dev = (__int128)d[k] * (__int128)U - t * u[k];
            if (dev < 0)
                dev = -dev;
            cr_assert((double)dev <= depth_bound(c.k) * U,
                      "epoch %llu source %zu: %lld draws, %.1f off",
                      (unsigned long long)far[i], k, (long long)d[k],
                      (double)dev / U);
        }
    }
    for (int64_t lo = 0; lo < c.T; lo += c.B) {
        int64_t hi = lo + c.B < c.T ? lo + c.B : c.T;
        cr_assert_eq(npyl_mix_draws_before(m, 3, lo, d), 0);
        cr_assert_eq(npyl_mix_draws_before(m, 3, hi, d2), 0);
        for (size_t k = 0; k < c.k; k++) {
            double ideal = (double)(hi - lo) * u[k] / U;
            cr_assert(fabs((double)(d2[k] - d[k]) - ideal) <= 2 * depth_bound(c.k),
                      "block at %lld source %zu", (long long)lo, k);
        }
    }
    npyl_mix_destroy(m);
}

Test(mix, same_weights_change_nothing)
{
    mixcase c = {.k = 3, .n = {10, 20, 30}, .w = {1, 2, 3}, .shuffle = NPYLOAD_SHUFFLE_FULL};
    npyl_mix *m = make(&c);
    double same[] = {2, 4, 6}; /* the same proportions: the same U */
    cr_assert_eq(npyl_mix_set_weights(m, 5, 7, same), 0);
    uint64_t e;
    int64_t p;
    npyl_mix_segment(m, &e, &p, NULL, NULL);
    cr_assert(e == 0 && p == 0, "segment moved to %llu/%lld", (unsigned long long)e,
              (long long)p);
    npyl_mix_destroy(m);
}

Test(mix, weight_changes_keep_each_stream_consecutive)
{
    mixcase c = {.k = 3, .n = {10, 20, 30}, .w = {1, 2, 3}, .T = 0, .B = 8,
                 .shuffle = NPYLOAD_SHUFFLE_FULL, .seed = 77};
    npyl_mix *m = make(&c);
    int64_t d[3], d2[3];
    double w1[] = {0, 1, 1}, w2[] = {5, 0, 1};
    /* mid-epoch, inside a block */
    cr_assert_eq(npyl_mix_draws_before(m, 2, 13, d), 0);
    cr_assert_eq(npyl_mix_set_weights(m, 2, 13, w1), 0);
    int64_t pos;
    uint64_t ep;
    npyl_mix_segment(m, &ep, &pos, NULL, d2);
    cr_assert(ep == 2 && pos == 13);
    cr_assert(memcmp(d, d2, sizeof d) == 0, "draws before the change moved");
    /* at the epoch's end: the next epoch's start */
    cr_assert_eq(npyl_mix_draws_before(m, 2, 60, d), 0);
    cr_assert_eq(npyl_mix_set_weights(m, 2, 60, w2), 0);
    npyl_mix_segment(m, &ep, &pos, NULL, d2);
    cr_assert(ep == 3 && pos == 0, "%llu %lld", (unsigned long long)ep, (long long)pos);
    cr_assert(memcmp(d, d2, sizeof d) == 0);
    /* the new weights draw from where each stream stood */
    npyl_mix_row *r = epoch_rows(m, 3);
    int64_t next[3] = {d[0], d[1], d[2]};
    for (int64_t i = 0; i < 60; i++) {
        size_t k = r[i].source;
        cr_assert_neq(k, 1, "source 1 has weight 0");
        cr_assert_eq(r[i].pass, (uint64_t)(next[k] / c.n[k]));
        next[k]++;
    }
    free(r);
    /* before the segment: refused, nothing changes */
    cr_assert_eq(npyl_mix_set_weights(m, 2, 59, w1), NPYLOAD_ESTATE);
    cr_assert_eq(npyl_mix_draws_before(m, 2, 0, d), NPYLOAD_ESTATE);
    npyl_mix_row one;
    int64_t p0 = 0;
    cr_assert_eq(npyl_mix_rows(m, 1, &p0, 1, &one), NPYLOAD_ESTATE);
    cr_assert(strstr(npyl_mix_errmsg(m), "epoch 3"), "%s", npyl_mix_errmsg(m));
    npyl_mix_segment(m, &ep, &pos, NULL, NULL);
    cr_assert(ep == 3 && pos == 0);
    double bad[] = {1, NAN, 1};
    cr_assert_eq(npyl_mix_set_weights(m, 4, 0, bad), NPYLOAD_EINVAL);
    cr_assert_eq(npyl_mix_set_weights(m, 4, 61, w1), NPYLOAD_EINVAL);
    npyl_mix_segment(m, &ep, &pos, NULL, NULL);
    cr_assert(ep == 3 && pos == 0);
    npyl_mix_destroy(m);
}

Test(mix, far_epochs_are_refused_not_wrapped)
{
    mixcase c = {.k = 2, .n = {1000, 1000}, .w = {1, 1}, .shuffle = NPYLOAD_SHUFFLE_FULL};
    npyl_mix *m = make(&c);
    int64_t d[2];
    uint64_t ok = (uint64_t)(INT64_MAX / 2000) - 1;
    cr_assert_eq(npyl_mix_draws_before(m, ok, 0, d), 0);
    cr_assert_eq(npyl_mix_draws_before(m, ok + 1, 0, d), NPYLOAD_ETOOBIG);
    cr_assert_eq(npyl_mix_draws_before(m, UINT64_MAX, 0, d), NPYLOAD_ETOOBIG);
    npyl_mix_destroy(m);
}

/* ---- state ---------------------------------------------------------------- */

static mixcase state_case(void)
{
    mixcase c = {.k = 3, .n = {10, 20, 30}, .w = {1, 2, 3}, .B = 8,
                 .shuffle = NPYLOAD_SHUFFLE_FULL, .seed = 5};
    return c;
}

Test(mix, state_round_trip)
{
    mixcase c = state_case();
    npyl_mix *a = make(&c);
    double w1[] = {3, 0, 1};
    cr_assert_eq(npyl_mix_set_weights(a, 4, 21, w1), 0);
    size_t len = npyl_mix_state_size(a);
    cr_assert_eq(len, NPYL_MIX_STATE_HEADER + 3 * NPYL_MIX_STATE_RECORD);
    unsigned char buf[256];
    cr_assert_eq(npyl_mix_state_save(a, buf, len - 1), NPYLOAD_EINVAL);
    cr_assert_eq(npyl_mix_state_save(a, buf, len), 0);
    npyl_mix *b = make(&c);
    cr_assert_eq(npyl_mix_state_load(b, buf, len), 0, "%s", npyl_mix_errmsg(b));
    for (uint64_t e = 4; e < 7; e++) {
        int64_t lo = e == 4 ? 21 : 0;
        for (int64_t p = lo; p < 60; p++) {
            npyl_mix_row ra, rb;
            cr_assert_eq(npyl_mix_rows(a, e, &p, 1, &ra), 0);
            cr_assert_eq(npyl_mix_rows(b, e, &p, 1, &rb), 0);
            cr_assert(ra.source == rb.source && ra.index == rb.index &&
                      ra.pass == rb.pass);
        }
    }
    npyl_mix_destroy(a);
    npyl_mix_destroy(b);
}

/* Untrusted bytes: every truncation and every field out of range is
 * refused with a message, and nothing changes. */
Test(mix, state_malformed)
{
    mixcase c = state_case();
    npyl_mix *m = make(&c);
    size_t len = npyl_mix_state_size(m);
    unsigned char good[256], bad[256];
    cr_assert_eq(npyl_mix_state_save(m, good, len), 0);
    for (size_t cut = 0; cut < len; cut++)
        cr_assert_neq(npyl_mix_state_load(m, good, cut), 0, "%zu bytes accepted", cut);
    cr_assert_neq(npyl_mix_state_load(m, NULL, len), 0);
    struct {
        size_t off;
        unsigned char val;
        int rc;
        const char *says;
    } flips[] = {
        {0, 'X', NPYLOAD_EINVAL, "NPYLMIX"},
        {8, 2, NPYLOAD_EINVAL, "version 2"},
        {12, 4, NPYLOAD_EMISMATCH, "4 sources"},
        {16, 61, NPYLOAD_EMISMATCH, "61"},
        {24, 9, NPYLOAD_EMISMATCH, "blocks of 9"},
        {40, 60, NPYLOAD_EINVAL, "position 60"},
        {47, 0x80, NPYLOAD_EINVAL, "position"},
        {48 + 24, 21, NPYLOAD_EMISMATCH, "source 1 holds 21"},
        {48 + 8 + 7, 0x80, NPYLOAD_EINVAL, "source 0"},
        {48 + 20, 1, NPYLOAD_EINVAL, "source 0"},
        {48 + 19, 0x40, NPYLOAD_EINVAL, "source 0"},
    };
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        memcpy(bad, good, len);
        bad[flips[i].off] = flips[i].val;
        int rc = npyl_mix_state_load(m, bad, len);
        cr_assert_eq(rc, flips[i].rc, "flip %zu: %d (%s)", i, rc, npyl_mix_errmsg(m));
        cr_assert(strstr(npyl_mix_errmsg(m), flips[i].says), "flip %zu: %s", i,
                  npyl_mix_errmsg(m));
    }
    /* all weights zero */
    memcpy(bad, good, len);
    for (size_t k = 0; k < 3; k++)
        memset(bad + 48 + 24 * k + 16, 0, 4);
    cr_assert_eq(npyl_mix_state_load(m, bad, len), NPYLOAD_EINVAL);
    uint64_t e;
    int64_t p;
    int64_t d[3];
    npyl_mix_segment(m, &e, &p, NULL, d);
    cr_assert(e == 0 && p == 0 && d[0] == 0 && d[1] == 0 && d[2] == 0);
    npyl_mix_destroy(m);
}

/* ---- digest --------------------------------------------------------------- */

Test(digest, known_answers)
{
    cr_assert_eq(npyl_digest_row(0, 0, 0, NULL, 0), 0x743df94ee4c78a2aull);
    cr_assert_eq(npyl_digest_row(0, 1, 5, NULL, 0), 0x694e46183e6a839bull);
    uint64_t d = 0;
    for (int i = 0; i < 10; i++)
        d = npyl_digest_row(d, (uint32_t)(i % 3), 100 - i, NULL, 0);
    cr_assert_eq(d, 0x74a41a7ab31db6deull);
    npyl_digest_aug a = {.hflip = 1, .vflip = 0, .top = 3, .left = 4};
    cr_assert_eq(npyl_digest_row(123456789, 2, -1, &a, 1), 0x1b7803463656e12full);
    /* nine augmented fields: the streaming path */
    npyl_digest_aug nine[9];
    for (int i = 0; i < 9; i++)
        nine[i] = (npyl_digest_aug){.hflip = (uint8_t)(i % 2),
                                    .vflip = (uint8_t)((i / 2) % 2), .top = i, .left = -i};
    cr_assert_eq(npyl_digest_row(0, 7, 42, nine, 9), 0x7e1937f9879afb06ull);
}

Test(digest, rows_chain_row_by_row)
{
    uint32_t src[20];
    int64_t idx[20];
    npyl_digest_aug aug[40];
    for (int i = 0; i < 20; i++) {
        src[i] = (uint32_t)(i % 4);
        idx[i] = 1000 - 7 * i;
        aug[2 * i] = (npyl_digest_aug){.hflip = (uint8_t)(i & 1), .top = i};
        aug[2 * i + 1] = (npyl_digest_aug){.vflip = 1, .left = -i};
    }
    uint64_t one = 0;
    for (int i = 0; i < 20; i++)
        one = npyl_digest_row(one, src[i], idx[i], &aug[2 * i], 2);
    /* any batching gives the same chain */
    uint64_t b = npyl_digest_rows(0, 7, src, idx, aug, 2);
    b = npyl_digest_rows(b, 13, src + 7, idx + 7, aug + 14, 2);
    cr_assert_eq(b, one);
    cr_assert_eq(npyl_digest_rows(0, 20, src, idx, aug, 2), one);
    /* one decision changed, one row moved: another digest */
    aug[9].top++;
    cr_assert_neq(npyl_digest_rows(0, 20, src, idx, aug, 2), one);
    aug[9].top--;
    int64_t t = idx[3];
    idx[3] = idx[4];
    idx[4] = t;
    cr_assert_neq(npyl_digest_rows(0, 20, src, idx, aug, 2), one);
    /* NULL sources are source 0 */
    uint32_t zero[20] = {0};
    cr_assert_eq(npyl_digest_rows(0, 20, NULL, idx, NULL, 0),
                 npyl_digest_rows(0, 20, zero, idx, NULL, 0));
}
