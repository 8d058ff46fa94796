/* Tests for lib/order: the per-epoch permutation and the split across ranks.
 * The known-answer vectors were computed by the independent Python
 * reimplementation in tests/python/test_order_vs_torch.py, written from the
 * algorithm's text in lib/order/npyload_order.h. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "order/npyload_order.h"

static const int64_t NS[] = {0, 1, 2, 7, 64, 1000, 214464};
#define NNS (sizeof NS / sizeof NS[0])
static const int64_t SEEDS[] = {0, 1, -1, 42, INT64_MAX, INT64_MIN};
#define NSEEDS (sizeof SEEDS / sizeof SEEDS[0])

static npyl_order_params params(int64_t n, int shuffle, int64_t seed,
                                uint64_t epoch)
{
    npyl_order_params p = {
        .n = n, .shuffle = shuffle, .seed = seed, .epoch = epoch,
        .rank = 0, .world_size = 1, .drop_last = 0, .batch_size = 1,
    };
    return p;
}

static int64_t *perm_of(const npyl_order_params *p)
{
    int64_t *a = malloc(((size_t)p->n + 1) * sizeof *a);
    cr_assert(a);
    cr_assert_eq(npyl_order_permutation(p, a), 0);
    return a;
}

/* Asserts a[0..n) is a permutation of 0..n-1. */
static void assert_permutation(const int64_t *a, int64_t n)
{
    unsigned char *seen = calloc((size_t)n + 1, 1);
    cr_assert(seen);
    for (int64_t i = 0; i < n; i++) {
        cr_assert(a[i] >= 0 && a[i] < n, "a[%lld] = %lld out of range",
                  (long long)i, (long long)a[i]);
        cr_assert(!seen[a[i]], "%lld appears twice", (long long)a[i]);
        seen[a[i]] = 1;
    }
    free(seen);
}

static void assert_vec(const int64_t *got, const int64_t *exp, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(got[i], exp[i], "entry %zu: %lld, expected %lld", i,
                     (long long)got[i], (long long)exp[i]);
}

Test(order, identity_without_shuffle)
{
    for (size_t k = 0; k < NNS; k++) {
        npyl_order_params p = params(NS[k], NPYLOAD_SHUFFLE_NONE, 42, 3);
        int64_t *a = perm_of(&p);
        for (int64_t i = 0; i < p.n; i++)
            cr_assert_eq(a[i], i);
        p.batch_size = 5;
        cr_assert_eq(npyl_order_delivered_len(&p), p.n);
        int64_t *b = calloc((size_t)p.n + 1, sizeof *b);
        cr_assert_eq(npyl_order_build(&p, b), 0);
        assert_vec(b, a, (size_t)p.n);
        free(a);
        free(b);
    }
}

Test(order, full_is_permutation)
{
    for (size_t k = 0; k < NNS; k++)
        for (size_t s = 0; s < NSEEDS; s++)
            for (uint64_t e = 0; e < 3; e++) {
                npyl_order_params p = params(NS[k], NPYLOAD_SHUFFLE_FULL,
                                             SEEDS[s], e);
                int64_t *a = perm_of(&p);
                assert_permutation(a, p.n);
                free(a);
            }
}

Test(order, deterministic_and_epoch_dependent)
{
    for (size_t s = 0; s < NSEEDS; s++) {
        npyl_order_params p = params(1000, NPYLOAD_SHUFFLE_FULL, SEEDS[s], 5);
        int64_t *a = perm_of(&p), *b = perm_of(&p);
        assert_vec(b, a, 1000);
        p.epoch = 6;
        int64_t *c = perm_of(&p);
        cr_assert(memcmp(a, c, 1000 * sizeof *a) != 0,
                  "epochs 5 and 6 gave the same order");
        p.epoch = 5;
        p.seed = (int64_t)((uint64_t)SEEDS[s] + 1);
        int64_t *d = perm_of(&p);
        cr_assert(memcmp(a, d, 1000 * sizeof *a) != 0,
                  "seeds %lld and +1 gave the same order", (long long)SEEDS[s]);
        free(a);
        free(b);
        free(c);
        free(d);
    }
}

Test(order, known_answers)
{
    static const int64_t full_10_42_3[] = {2, 7, 5, 4, 6, 3, 0, 9, 8, 1};
    static const int64_t full_16_0_0[] = {4, 5, 9, 12, 1, 8, 6, 10,
                                          11, 14, 0, 13, 3, 2, 7, 15};
    static const int64_t local_12_7_1[] = {11, 0, 1, 2, 10, 9,
                                           7, 8, 3, 5, 6, 4};
    static const int64_t rank1_of_3[] = {7, 6, 9, 2};
    static const int64_t sizes[] = {3, 2, 4, 3};
    int64_t out[16];

    npyl_order_params p = params(10, NPYLOAD_SHUFFLE_FULL, 42, 3);
    cr_assert_eq(npyl_order_permutation(&p, out), 0);
    assert_vec(out, full_10_42_3, 10);

    p = params(16, NPYLOAD_SHUFFLE_FULL, 0, 0);
    cr_assert_eq(npyl_order_permutation(&p, out), 0);
    assert_vec(out, full_16_0_0, 16);

    p = params(12, NPYLOAD_SHUFFLE_LOCAL, 7, 1);
    p.file_sizes = sizes;
    p.nfiles = 4;
    p.window = 2;
    cr_assert_eq(npyl_order_permutation(&p, out), 0);
    assert_vec(out, local_12_7_1, 12);

    cr_assert_eq(npyload_order_indices(10, NPYLOAD_SHUFFLE_FULL, 42, 3, 1, 3,
                                       0, 2, NULL, 0, 0, out, 16), 4);
    assert_vec(out, rank1_of_3, 4);
}

/* Walks a LOCAL output and checks that it splits into consecutive segments
 * each made of the complete samples of at most `window` files (sizes > 0). */
static void assert_windows(const int64_t *a, int64_t n, const int64_t *sizes,
                           size_t nfiles, int64_t window)
{
    int64_t *file_of = malloc(((size_t)n + 1) * sizeof *file_of);
    int64_t *left = malloc((nfiles + 1) * sizeof *left);
    int64_t *set = malloc(((size_t)window + 1) * sizeof *set);
    cr_assert(file_of && left && set);
    int64_t s = 0;
    for (size_t f = 0; f < nfiles; f++) {
        left[f] = sizes[f];
        for (int64_t i = 0; i < sizes[f]; i++)
            file_of[s++] = (int64_t)f;
    }
    int64_t nset = 0, open = 0, segments = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t f = file_of[a[i]];
        int64_t j;
        for (j = 0; j < nset && set[j] != f; j++)
            ;
        if (j == nset) {
            cr_assert(nset < window, "sample %lld at %lld: a window holds more "
                      "than %lld files", (long long)a[i], (long long)i,
                      (long long)window);
            cr_assert_eq(left[f], sizes[f], "file %lld split across windows",
                         (long long)f);
            set[nset++] = f;
            open++;
        }
        if (--left[f] == 0)
            open--;
        if (nset == window && open == 0) {
            nset = 0;
            segments++;
        }
    }
    cr_assert_eq(open, 0);
    free(file_of);
    free(left);
    free(set);
}

Test(order, local_permutation_and_windows)
{
    static const int64_t windows[] = {0, 1, 2, 3, 8, 1000};
    for (int shape = 0; shape < 4; shape++) {
        size_t nfiles = shape == 3 ? 3351 : (size_t)(1 + shape * 17);
        int64_t *sizes = malloc(nfiles * sizeof *sizes);
        cr_assert(sizes);
        int64_t n = 0;
        for (size_t f = 0; f < nfiles; f++) {
            sizes[f] = shape == 3 ? 64 : (int64_t)(1 + (f * 7919) % 13);
            n += sizes[f];
        }
        for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++)
            for (size_t s = 0; s < 3; s++) {
                npyl_order_params p = params(n, NPYLOAD_SHUFFLE_LOCAL,
                                             SEEDS[s], s + w);
                p.file_sizes = sizes;
                p.nfiles = nfiles;
                p.window = windows[w];
                int64_t *a = perm_of(&p);
                assert_permutation(a, n);
                assert_windows(a, n, sizes, nfiles,
                               windows[w] > 0 ? windows[w] : 8);
                int64_t *b = perm_of(&p);
                assert_vec(b, a, (size_t)n);
                free(a);
                free(b);
            }
        free(sizes);
    }
}

Test(order, local_with_empty_files)
{
    static const int64_t sizes[] = {0, 5, 0, 0, 3, 9, 0, 1};
    npyl_order_params p = params(18, NPYLOAD_SHUFFLE_LOCAL, 9, 9);
    p.file_sizes = sizes;
    p.nfiles = 8;
    p.window = 2;
    int64_t *a = perm_of(&p);
    assert_permutation(a, 18);
    free(a);
    p = params(0, NPYLOAD_SHUFFLE_LOCAL, 9, 9);
    p.file_sizes = sizes;
    p.nfiles = 1;
    cr_assert_eq(npyl_order_check(&p, NULL, 0), 0);
    p.nfiles = 0;
    p.file_sizes = NULL;
    cr_assert_eq(npyl_order_check(&p, NULL, 0), 0);
}

/* One rank's sequence through the public entry point, length in *len. */
static int64_t *rank_seq(const npyl_order_params *p, int64_t *len)
{
    int64_t need = npyload_order_indices(p->n, p->shuffle, p->seed, p->epoch,
                                         p->rank, p->world_size, p->drop_last,
                                         p->batch_size, p->file_sizes,
                                         p->nfiles, p->window, NULL, 0);
    cr_assert(need >= 0);
    int64_t *a = malloc(((size_t)need + 1) * sizeof *a);
    cr_assert(a);
    cr_assert_eq(npyload_order_indices(p->n, p->shuffle, p->seed, p->epoch,
                                       p->rank, p->world_size, p->drop_last,
                                       p->batch_size, p->file_sizes, p->nfiles,
                                       p->window, a, (size_t)need), need);
    *len = need;
    return a;
}

Test(order, ranks_balanced_covering_disjoint)
{
    static const int64_t ns[] = {0, 1, 2, 3, 5, 7, 8, 9, 63, 64, 65, 1000};
    static const int64_t ws[] = {1, 2, 3, 4, 7, 8};
    static const int64_t bss[] = {1, 2, 3, 8, 64, 5000};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
    for (size_t b = 0; b < sizeof ws / sizeof ws[0]; b++)
    for (size_t c = 0; c < sizeof bss / sizeof bss[0]; c++)
    for (int drop = 0; drop <= 1; drop++) {
        int64_t n = ns[a], w = ws[b], bs = bss[c];
        npyl_order_params p = params(n, NPYLOAD_SHUFFLE_FULL, 11, (uint64_t)a);
        p.world_size = w;
        p.drop_last = drop;
        p.batch_size = bs;
        int64_t *perm = perm_of(&p);
        int64_t *count = calloc((size_t)n + 1, sizeof *count);
        cr_assert(count);
        int64_t rank_len = drop ? n / w : (n + w - 1) / w;
        int64_t nb = drop ? rank_len / bs : (rank_len + bs - 1) / bs;
        int64_t deliv = drop ? nb * bs : rank_len;
        int64_t total = 0;
        for (int64_t r = 0; r < w; r++) {
            p.rank = r;
            cr_assert_eq(npyl_order_rank_len(&p), rank_len);
            cr_assert_eq(npyl_order_num_batches(&p), nb,
                         "n=%lld w=%lld bs=%lld drop=%d", (long long)n,
                         (long long)w, (long long)bs, drop);
            int64_t len;
            int64_t *seq = rank_seq(&p, &len);
            cr_assert_eq(len, deliv);
            for (int64_t k = 0; k < len; k++) {
                int64_t pos = r + k * w;
                cr_assert_eq(seq[k], perm[pos < n ? pos : (pos - n) % n]);
                count[seq[k]]++;
            }
            total += len;
            free(seq);
        }
        int64_t dups = 0, missing = 0;
        for (int64_t i = 0; i < n; i++) {
            if (count[i] > 1)
                dups += count[i] - 1;
            if (count[i] == 0)
                missing++;
        }
        if (!drop) {
            cr_assert_eq(missing, 0, "n=%lld w=%lld: union misses samples",
                         (long long)n, (long long)w);
            cr_assert_eq(total, rank_len * w);
            cr_assert(dups <= w - 1 && dups == total - n);
        } else {
            cr_assert_eq(dups, 0, "drop_last: ranks overlap");
            cr_assert_eq(total, nb * bs * w);
            if (n < w)
                cr_assert_eq(total, 0);
        }
        free(perm);
        free(count);
    }
}

Test(order, edge_cases)
{
    npyl_order_params p = params(0, NPYLOAD_SHUFFLE_FULL, 1, 1);
    p.world_size = 4;
    p.rank = 3;
    cr_assert_eq(npyl_order_num_batches(&p), 0);
    cr_assert_eq(npyl_order_delivered_len(&p), 0);
    cr_assert_eq(npyl_order_build(&p, NULL), 0);
    /* N < W, no drop: every rank gets one (padded) sample. */
    p.n = 3;
    p.world_size = 8;
    p.rank = 7;
    int64_t out[8];
    cr_assert_eq(npyl_order_delivered_len(&p), 1);
    cr_assert_eq(npyl_order_build(&p, out), 0);
    int64_t perm[3];
    cr_assert_eq(npyl_order_permutation(&p, perm), 0);
    cr_assert_eq(out[0], perm[(7 - 3) % 3]);
    p.drop_last = 1;
    cr_assert_eq(npyl_order_num_batches(&p), 0);
    cr_assert_eq(npyl_order_delivered_len(&p), 0);
    /* batch_size > rank_len. */
    p = params(10, NPYLOAD_SHUFFLE_NONE, 0, 0);
    p.world_size = 3;
    p.batch_size = 100;
    cr_assert_eq(npyl_order_num_batches(&p), 1);
    cr_assert_eq(npyl_order_delivered_len(&p), 4);
    p.drop_last = 1;
    cr_assert_eq(npyl_order_num_batches(&p), 0);
    cr_assert_eq(npyl_order_delivered_len(&p), 0);
    /* cap smaller than the length. */
    int64_t small[2] = {-1, -1};
    cr_assert_eq(npyload_order_indices(10, NPYLOAD_SHUFFLE_NONE, 0, 0, 1, 2, 0,
                                       3, NULL, 0, 0, small, 2), 5);
    cr_assert_eq(small[0], 1);
    cr_assert_eq(small[1], 3);
}

Test(order, bad_arguments)
{
    char err[256];
    int64_t out[4];
    static const int64_t sizes[] = {1, 2};
    npyl_order_params p = params(4, NPYLOAD_SHUFFLE_NONE, 0, 0);
    cr_assert_eq(npyl_order_check(&p, err, sizeof err), 0);
    p.world_size = 0;
    cr_assert_eq(npyl_order_check(&p, err, sizeof err), NPYLOAD_EINVAL);
    cr_assert(strstr(err, "world_size"), "%s", err);
    p = params(4, NPYLOAD_SHUFFLE_NONE, 0, 0);
    p.rank = 1;
    cr_assert_eq(npyl_order_check(&p, err, sizeof err), NPYLOAD_EINVAL);
    cr_assert(strstr(err, "rank"), "%s", err);
    p = params(4, NPYLOAD_SHUFFLE_NONE, 0, 0);
    p.batch_size = 0;
    cr_assert_eq(npyl_order_check(&p, err, sizeof err), NPYLOAD_EINVAL);
    p = params(-1, NPYLOAD_SHUFFLE_NONE, 0, 0);
    cr_assert_eq(npyl_order_check(&p, err, sizeof err), NPYLOAD_EINVAL);
    p = params(4, 7, 0, 0);
    cr_assert_eq(npyl_order_check(&p, err, sizeof err), NPYLOAD_EINVAL);
    p = params(4, NPYLOAD_SHUFFLE_NONE, 0, 0);
    p.drop_last = 2;
    cr_assert_eq(npyl_order_check(&p, err, sizeof err), NPYLOAD_EINVAL);
    p = params(4, NPYLOAD_SHUFFLE_LOCAL, 0, 0);
    p.file_sizes = sizes;
    p.nfiles = 2;
    cr_assert_eq(npyl_order_check(&p, err, sizeof err), NPYLOAD_EINVAL);
    cr_assert(strstr(err, "sum"), "%s", err);
    p.nfiles = 0;
    cr_assert_eq(npyl_order_check(&p, err, sizeof err), NPYLOAD_EINVAL);
    cr_assert_eq(npyl_order_build(&p, out), NPYLOAD_EINVAL);
    cr_assert_eq(npyl_order_permutation(&p, out), NPYLOAD_EINVAL);
    cr_assert_eq(npyload_order_indices(4, NPYLOAD_SHUFFLE_NONE, 0, 0, 0, 1, 0,
                                       1, NULL, 0, 0, NULL, 4), NPYLOAD_EINVAL);
    cr_assert_eq(npyload_order_indices(4, NPYLOAD_SHUFFLE_LOCAL, 0, 0, 0, 1, 0,
                                       1, NULL, 0, 0, out, 4), NPYLOAD_EINVAL);
}

/* Position histogram over many (deterministic) seeds: each value lands at
 * each position about equally often. Chi-square with (n-1)^2 degrees of
 * freedom; the bound is far out in the tail, and the seeds are fixed, so the
 * test cannot flake. */
static double chi_square(int n, int trials, int by_epoch)
{
    int64_t a[8];
    long hist[8][8] = {{0}};
    for (int t = 0; t < trials; t++) {
        npyl_order_params p = params(n, NPYLOAD_SHUFFLE_FULL,
                                     by_epoch ? 1234 : t,
                                     by_epoch ? (uint64_t)t : 0);
        cr_assert_eq(npyl_order_permutation(&p, a), 0);
        for (int i = 0; i < n; i++)
            hist[a[i]][i]++;
    }
    double e = (double)trials / n, chi = 0;
    for (int v = 0; v < n; v++)
        for (int i = 0; i < n; i++)
            chi += (hist[v][i] - e) * (hist[v][i] - e) / e;
    return chi;
}

Test(order, uniformity)
{
    for (int by_epoch = 0; by_epoch <= 1; by_epoch++) {
        for (int n = 2; n <= 8; n++) {
            double df = (n - 1) * (n - 1);
            double chi = chi_square(n, 20000, by_epoch);
            /* mean df, sd sqrt(2 df): allow df + 8 sd + 10. */
            cr_assert(chi < df + 8 * __builtin_sqrt(2 * df) + 10,
                      "n=%d chi2=%.1f df=%.0f", n, chi, df);
        }
    }
    /* All 6 orders of 3 elements, about equally often. */
    long count[6] = {0};
    for (int t = 0; t < 60000; t++) {
        int64_t a[3];
        npyl_order_params p = params(3, NPYLOAD_SHUFFLE_FULL, 77, (uint64_t)t);
        cr_assert_eq(npyl_order_permutation(&p, a), 0);
        count[a[0] * 2 + (a[1] > a[2])]++;
    }
    double chi = 0;
    for (int k = 0; k < 6; k++)
        chi += (count[k] - 10000.0) * (count[k] - 10000.0) / 10000.0;
    cr_assert(chi < 5 + 8 * __builtin_sqrt(10.0) + 10, "chi2=%.1f", chi);
}

Test(order, captcha_scale_permutation)
{
    /* The reference train split: 3,351 files of 64 samples. Timing is a
     * benchmark concern; here only correctness at scale. */
    npyl_order_params p = params(214464, NPYLOAD_SHUFFLE_FULL, 2024, 17);
    uint64_t t0 = npyl_now_ns();
    int64_t *a = perm_of(&p);
    uint64_t t1 = npyl_now_ns();
    cr_log_info("FULL permutation of 214464: %.3f ms", (t1 - t0) / 1e6);
    assert_permutation(a, p.n);
    free(a);
}

/* DistributedSampler's rule, written out for a dataset that is the rest
 * S[b..n): rank r of w takes positions r, r+w, ... of the rest padded
 * cyclically (drop_last 0) or truncated (drop_last 1). The independent
 * reference for the resume base. Returns the count written. */
static size_t ref_split(const int64_t *S, int64_t n, int64_t b, int64_t w,
                        int64_t r, int drop_last, int64_t *out)
{
    int64_t m = n - b;
    int64_t total = drop_last ? (m / w) * w : ((m + w - 1) / w) * w;
    size_t k = 0;
    for (int64_t pos = r; pos < total; pos += w)
        out[k++] = S[b + pos % (m ? m : 1)];
    return k;
}

Test(order, resume_base_splits_the_rest_like_distributed_sampler)
{
    static const int64_t ns[] = {0, 1, 5, 13, 64, 101};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (int shuffle = NPYLOAD_SHUFFLE_NONE; shuffle <= NPYLOAD_SHUFFLE_FULL; shuffle++)
            for (int dl = 0; dl <= 1; dl++)
                for (int64_t w = 1; w <= 4; w++)
                    for (int64_t b = 0; b <= ns[a]; b += 1 + ns[a] / 7) {
                        npyl_order_params p = params(ns[a], shuffle, 9, 2);
                        int64_t *S = perm_of(&p);
                        p.world_size = w;
                        p.drop_last = dl;
                        p.base = b;
                        for (int64_t r = 0; r < w; r++) {
                            p.rank = r;
                            cr_assert_eq(npyl_order_check(&p, NULL, 0), 0);
                            int64_t len = npyl_order_delivered_len(&p);
                            int64_t *got = malloc(((size_t)len + 1) * sizeof *got);
                            int64_t *exp = malloc(((size_t)ns[a] + 4) * sizeof *exp);
                            cr_assert(got && exp);
                            cr_assert_eq(npyl_order_build(&p, got), 0);
                            size_t k = ref_split(S, ns[a], b, w, r, dl, exp);
                            cr_assert_eq((size_t)len, k, "n=%lld b=%lld w=%lld r=%lld dl=%d",
                                         (long long)ns[a], (long long)b, (long long)w,
                                         (long long)r, dl);
                            assert_vec(got, exp, k);
                            free(got);
                            free(exp);
                        }
                        free(S);
                    }
}

/* The elastic guarantee end to end: W ranks consume c batches each, the
 * global position B' = min(n, c * bs * W) is saved, W' ranks finish the
 * epoch from there. With drop_last 0 every sample is delivered, and at most
 * W' - 1 deliveries after the save repeat anything (padding). Every rank
 * gets the same number of batches after the resume. */
Test(order, elastic_resume_loses_nothing_repeats_only_padding)
{
    const int64_t n = 103, bs = 4;
    for (int dl = 0; dl <= 1; dl++)
        for (int64_t w = 1; w <= 4; w++)
            for (int64_t w2 = 1; w2 <= 4; w2++) {
                npyl_order_params p = params(n, NPYLOAD_SHUFFLE_FULL, 5, 1);
                p.world_size = w;
                p.drop_last = dl;
                p.batch_size = bs;
                int64_t nb = npyl_order_num_batches(&p);
                for (int64_t c = 0; c <= nb; c++) {
                    unsigned *times = calloc((size_t)n, sizeof *times);
                    int64_t *buf = malloc((size_t)(n + 8) * sizeof *buf);
                    cr_assert(times && buf);
                    int64_t per_rank = 0;
                    for (int64_t r = 0; r < w; r++) {
                        p.rank = r;
                        p.base = 0;
                        p.world_size = w;
                        int64_t len = npyl_order_delivered_len(&p);
                        cr_assert_eq(npyl_order_build(&p, buf), 0);
                        per_rank = c * bs < len ? c * bs : len;
                        for (int64_t i = 0; i < per_rank; i++)
                            times[buf[i]]++;
                    }
                    int64_t b2 = per_rank * w < n ? per_rank * w : n;
                    int64_t after = 0, batches = -1;
                    p.world_size = w2;
                    p.base = b2;
                    for (int64_t r = 0; r < w2; r++) {
                        p.rank = r;
                        int64_t len = npyl_order_delivered_len(&p);
                        int64_t nb2 = npyl_order_num_batches(&p);
                        cr_assert(batches < 0 || batches == nb2, "unequal batch counts");
                        batches = nb2;
                        cr_assert_eq(npyl_order_build(&p, buf), 0);
                        for (int64_t i = 0; i < len; i++)
                            times[buf[i]]++;
                        after += len;
                    }
                    int64_t missing = 0, extra = 0;
                    for (int64_t s = 0; s < n; s++) {
                        if (times[s] == 0)
                            missing++;
                        else
                            extra += times[s] - 1;
                    }
                    if (!dl) {
                        cr_assert_eq(missing, 0, "w=%lld w2=%lld c=%lld: %lld lost",
                                     (long long)w, (long long)w2, (long long)c,
                                     (long long)missing);
                        /* Repeats: the first split's padding (only once the
                         * epoch's end was consumed) and the new split's. */
                        cr_assert(extra <= (w - 1) + (w2 - 1), "w=%lld w2=%lld c=%lld: %lld repeats",
                                  (long long)w, (long long)w2, (long long)c, (long long)extra);
                    } else {
                        cr_assert_eq(extra, 0, "drop_last never repeats");
                    }
                    free(times);
                    free(buf);
                }
            }
}
