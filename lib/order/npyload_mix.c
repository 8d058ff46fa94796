/* Weighted mixing: the interleave tree, segments, blocks, the sources'
 * streams and the serialised state. The algorithm is specified in
 * npyload_mix.h; this file must stay in step with that text (the Python
 * reference in the tests reimplements it from the text alone). */
#include "npyload_mix.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_order_rng.h"

struct npyl_mix {
    /* configuration, fixed at create */
    size_t k;
    int64_t T, B, window, seed;
    int shuffle;
    int64_t *n;                /* k */
    int64_t **files;           /* k file-size lists (LOCAL), each may be NULL */
    size_t *nfiles;            /* k */

    /* the segment in force */
    uint64_t seg_epoch;
    int64_t seg_pos;
    uint32_t *u;               /* k quantised weights */
    int64_t *d;                /* k draws before the segment */
    uint64_t *pre;             /* k + 1 prefix sums of u: the tree's weights */
    uint64_t lim;              /* lookups need epoch - seg_epoch < lim */

    /* the block cache: epoch, block number, [lo, hi), labels and draw numbers */
    int have_block;
    uint64_t blk_epoch;
    int64_t blk_j, blk_lo, blk_hi;
    int64_t *labels;           /* B: a source per offset (int64 for fisher_yates) */
    uint64_t *bpass;           /* B: each offset's draw as pass q ... */
    int64_t *boff;             /* B: ... and offset j in that pass */
    uint32_t *offs;            /* 2B: route()'s lists of offsets */
    int64_t *cnt;              /* k: count_all's answers */
    uint64_t *cq;              /* k: the next draw of each source as (pass, */
    int64_t *cj;               /* k: offset) while a block fills; with
                                  cnt_all, of every source after the cached
                                  block's end (blk_t1) */
    int cnt_all;
    uint64_t blk_t1;           /* stream index of the cached block's end */
    uint64_t *stamp;           /* k: which fill last set cq/cj[k] (not cnt_all) */
    uint64_t stamp_now;

    /* one pass's permutation per source (shuffled modes only) */
    int64_t **perm;            /* k, allocated on first use */
    uint64_t *perm_pass;       /* k */
    unsigned char *perm_ok;    /* k */

    char errmsg[256];
};

#define FAIL(m, code, ...) npyl_fail((m)->errmsg, sizeof (m)->errmsg, (code), __VA_ARGS__)

/* ---- the interleave tree ------------------------------------------------ */

/* Of the first t positions reaching a node of weight s whose left child
 * weighs a, how many go left: floor(t/s)*a + floor((2a(t mod s) + s)/(2s)).
 * s <= 2^31 (U <= 2^30 + K), so 2*a*(t mod s) < 2^63. */
static uint64_t left_count(uint64_t a, uint64_t s, uint64_t t)
{
    if (s == 0)
        return 0;
    return (t / s) * a + (2 * a * (t % s) + s) / (2 * s);
}

/* count_k(t): of the stream's first t positions, those that reach leaf k. */
static uint64_t tree_count(const uint64_t *pre, size_t K, size_t k, uint64_t t)
{
    size_t lo = 0, hi = K;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        uint64_t l = left_count(pre[mid] - pre[lo], pre[hi] - pre[lo], t);
        if (k < mid) {
            hi = mid;
            t = l;
        } else {
            lo = mid;
            t -= l;
        }
    }
    return t;
}

/* d[k] + count_k(t) for every leaf k of the node [lo, hi) into out: one
 * left() per node, O(K). */
static void count_all(const uint64_t *pre, size_t lo, size_t hi, uint64_t t,
                      const int64_t *d, int64_t *out)
{
    if (hi - lo == 1) {
        out[lo] = d[lo] + (int64_t)t;
        return;
    }
    size_t mid = lo + (hi - lo) / 2;
    uint64_t l = left_count(pre[mid] - pre[lo], pre[hi] - pre[lo], t);
    count_all(pre, lo, mid, l, d, out);
    count_all(pre, mid, hi, t - l, d, out);
}

/* source(t) for len consecutive node-local indices t0 .. t0+len-1 of the
 * node [lo, hi): labels[in[i]] = the leaf of the i-th. Consecutive indices
 * reaching a node reach each child consecutively too (left() is monotone),
 * so each level splits the list in order and goes on with a contiguous
 * range; the step left(t+1) - left(t) is found from the running remainder
 * rem = (2at + s) mod 2s without a division: left iff rem + 2a >= 2s.
 * `in` and `scratch` hold len entries each and are both overwritten. */
static void route(const uint64_t *pre, size_t lo, size_t hi, uint64_t t0,
                  size_t len, uint32_t *in, uint32_t *scratch, int64_t *labels)
{
    if (len == 0)
        return;
    if (hi - lo == 1) {
        for (size_t i = 0; i < len; i++)
            labels[in[i]] = (int64_t)lo;
        return;
    }
    size_t mid = lo + (hi - lo) / 2;
    uint64_t a = pre[mid] - pre[lo], s = pre[hi] - pre[lo]; /* s > 0: reached */
    uint64_t l0 = left_count(a, s, t0);
    uint64_t rem = (2 * a * (t0 % s) + s) % (2 * s);
    size_t nl = 0, nr = 0;
    for (size_t i = 0; i < len; i++) {
        rem += 2 * a;
        if (rem >= 2 * s) {
            rem -= 2 * s;
            scratch[nl++] = in[i];
        } else {
            in[nr++] = in[i]; /* nr <= i: in place, in order */
        }
    }
    route(pre, lo, mid, l0, nl, scratch, in + nr, labels);
    route(pre, mid, hi, t0 - l0, nr, in, scratch + nl, labels);
}

/* ---- weights and segments ----------------------------------------------- */

int npyl_mix_quantize(const double *w, size_t k, const int64_t *n, uint32_t *u,
                      char *err, size_t errlen)
{
    if (!w || !u || k == 0 || k > NPYL_MIX_MAX_SOURCES)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "mix: %zu weights; 1 .. %d expected", k,
                         NPYL_MIX_MAX_SOURCES);
    double sum = 0;
    for (size_t i = 0; i < k; i++) {
        if (!isfinite(w[i]) || w[i] < 0)
            return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                             "mix: source %zu: weight %g; a finite weight "
                             ">= 0 expected", i, w[i]);
        sum += w[i];
    }
    if (!(sum > 0) || !isfinite(sum))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "mix: the weights sum to %g; a finite sum > 0 "
                         "expected", sum);
    for (size_t i = 0; i < k; i++) {
        if (w[i] == 0) {
            u[i] = 0;
            continue;
        }
        if (n && n[i] == 0)
            return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                             "mix: source %zu has weight %g but no samples",
                             i, w[i]);
        /* floor of a value in [0.5, 2^30 + 0.5]: the conversion truncates
         * toward zero, which is floor here (and needs no libm) */
        uint32_t q = (uint32_t)(w[i] / sum * (double)NPYL_MIX_WEIGHT_ONE + 0.5);
        u[i] = q < 1 ? 1 : q;
    }
    return 0;
}

/* Puts a segment in force (u and d already checked) and drops the block. */
static void set_segment(npyl_mix *m, uint64_t epoch, int64_t pos,
                        const uint32_t *u, const int64_t *d)
{
    int64_t dmax = 0;
    m->pre[0] = 0;
    for (size_t i = 0; i < m->k; i++) {
        m->u[i] = u[i];
        m->d[i] = d[i];
        m->pre[i + 1] = m->pre[i] + u[i];
        if (d[i] > dmax)
            dmax = d[i];
    }
    m->seg_epoch = epoch;
    m->seg_pos = pos;
    /* A lookup in epoch e needs dmax + (e - E + 1) * T <= INT64_MAX: stream
     * indices and draw numbers then fit an int64. */
    m->lim = m->T > 0 ? (uint64_t)((INT64_MAX - dmax) / m->T) : UINT64_MAX;
    m->have_block = 0;
}

/* Checks that (epoch, pos) lies in the segment and within its limits; with
 * allow_end, pos may be T. */
static int check_point(npyl_mix *m, uint64_t epoch, int64_t pos, int allow_end)
{
    if (pos < 0 || pos > m->T || (pos == m->T && !allow_end))
        return FAIL(m, NPYLOAD_EINVAL, "mix: position %" PRId64 "; 0 .. %"
                    PRId64 " expected", pos, allow_end ? m->T : m->T - 1);
    if (epoch < m->seg_epoch || (epoch == m->seg_epoch && pos < m->seg_pos))
        return FAIL(m, NPYLOAD_ESTATE, "mix: epoch %" PRIu64 " position %"
                    PRId64 " comes before the weights in force since epoch %"
                    PRIu64 " position %" PRId64 ", which are all that is "
                    "known", epoch, pos, m->seg_epoch, m->seg_pos);
    if (epoch - m->seg_epoch >= m->lim)
        return FAIL(m, NPYLOAD_ETOOBIG, "mix: epoch %" PRIu64 " is too far "
                    "past the weights' change at epoch %" PRIu64 ": the "
                    "draw counts would pass 2^63", epoch, m->seg_epoch);
    return 0;
}

/* tau(e, p) = (e - E) * T + (p - P); check_point(e, p) == 0 assumed. */
static uint64_t stream_index(const npyl_mix *m, uint64_t epoch, int64_t pos)
{
    return (epoch - m->seg_epoch) * (uint64_t)m->T + (uint64_t)pos -
           (uint64_t)m->seg_pos;
}

/* ---- blocks ------------------------------------------------------------- */

/* seed XOR mix64(tag * G): the seeds of the sources' (tag k) and the
 * blocks' (tag 2^63 + j) generators. */
static int64_t tag_seed(int64_t seed, uint64_t tag)
{
    return (int64_t)((uint64_t)seed ^ npyl_mix64(tag * NPYL_GOLDEN));
}

int64_t npyl_mix_source_seed(int64_t seed, size_t k)
{
    return tag_seed(seed, k);
}

/* Source k's next draw is its c-th: as (pass, offset). A source without
 * samples has weight 0 and never draws. */
static void set_next(npyl_mix *m, size_t k, int64_t c)
{
    int64_t n = m->n[k] > 0 ? m->n[k] : 1;
    m->cq[k] = (uint64_t)(c / n);
    m->cj[k] = c % n;
}

/* Makes block (epoch, j) the cached one: its labels L and each offset's
 * draw number. */
static void fill_block(npyl_mix *m, uint64_t epoch, int64_t j)
{
    int64_t lo = j * m->B, hi = lo + m->B < m->T ? lo + m->B : m->T;
    if (epoch == m->seg_epoch && lo < m->seg_pos)
        lo = m->seg_pos;
    size_t len = (size_t)(hi - lo);
    uint64_t t0 = stream_index(m, epoch, lo);
    /* The draws before t0 of every source: where the cached block ended
     * when this one follows it in the stream (a rank's scan, W <= B);
     * else from the tree, all of them when K is small next to a block,
     * else each source as it appears (stamped). */
    int all = m->have_block && m->cnt_all && m->blk_t1 == t0;
    if (!all && m->k <= 2 * (size_t)m->B) {
        count_all(m->pre, 0, m->k, t0, m->d, m->cnt);
        for (size_t k = 0; k < m->k; k++)
            set_next(m, k, m->cnt[k]);
        all = 1;
    }
    m->cnt_all = all;
    m->stamp_now++;
    for (size_t i = 0; i < len; i++)
        m->offs[i] = (uint32_t)i;
    route(m->pre, 0, m->k, t0, len, m->offs, m->offs + m->B, m->labels);
    if (m->shuffle != NPYLOAD_SHUFFLE_NONE) {
        npyl_rng g;
        rng_init(&g, tag_seed(m->seed, (UINT64_C(1) << 63) + (uint64_t)j), epoch);
        fisher_yates(&g, m->labels, len);
    }
    for (size_t i = 0; i < len; i++) {
        size_t k = (size_t)m->labels[i];
        if (!all && m->stamp[k] != m->stamp_now) {
            m->stamp[k] = m->stamp_now;
            set_next(m, k, m->d[k] + (int64_t)tree_count(m->pre, m->k, k, t0));
        }
        /* draw c = cq * n_k + cj; the next one without a division */
        m->bpass[i] = m->cq[k];
        m->boff[i] = m->cj[k];
        if (++m->cj[k] == m->n[k]) {
            m->cj[k] = 0;
            m->cq[k]++;
        }
    }
    m->have_block = 1;
    m->blk_epoch = epoch;
    m->blk_j = j;
    m->blk_lo = lo;
    m->blk_hi = hi;
    m->blk_t1 = t0 + len;
}

static void ensure_block(npyl_mix *m, uint64_t epoch, int64_t pos)
{
    int64_t j = pos / m->B;
    if (!m->have_block || m->blk_epoch != epoch || m->blk_j != j)
        fill_block(m, epoch, j);
}

/* ---- the sources' streams ----------------------------------------------- */

/* P_{k,q}[j]: the sample of source k's pass q at offset j. */
static int pass_sample(npyl_mix *m, size_t k, uint64_t q, int64_t j,
                       int64_t *out)
{
    if (m->shuffle == NPYLOAD_SHUFFLE_NONE) {
        *out = j;
        return 0;
    }
    if (!m->perm_ok[k] || m->perm_pass[k] != q) {
        m->perm_ok[k] = 0; /* until the new pass is in place */
        if (!m->perm[k]) {
            m->perm[k] = malloc((size_t)m->n[k] * sizeof *m->perm[k]);
            if (!m->perm[k])
                return FAIL(m, -ENOMEM, "mix: source %zu: no memory for the "
                            "permutation of %" PRId64 " samples", k, m->n[k]);
        }
        npyl_order_params op = {
            .n = m->n[k], .shuffle = m->shuffle, .seed = tag_seed(m->seed, k),
            .epoch = q, .file_sizes = m->files[k], .nfiles = m->nfiles[k],
            .window = m->window,
        };
        int rc = npyl_order_permutation(&op, m->perm[k]);
        if (rc)
            return FAIL(m, rc, "mix: source %zu: permutation of pass %" PRIu64
                        " failed", k, q);
        m->perm_ok[k] = 1;
        m->perm_pass[k] = q;
    }
    *out = m->perm[k][j];
    return 0;
}

static int row_at(npyl_mix *m, uint64_t epoch, int64_t pos, npyl_mix_row *out)
{
    int rc = check_point(m, epoch, pos, 0);
    if (rc)
        return rc;
    ensure_block(m, epoch, pos);
    size_t i = (size_t)(pos - m->blk_lo);
    size_t k = (size_t)m->labels[i];
    out->source = (uint32_t)k;
    out->pass = m->bpass[i];
    return pass_sample(m, k, m->bpass[i], m->boff[i], &out->index);
}

int npyl_mix_rows(npyl_mix *m, uint64_t epoch, const int64_t *pos, size_t n,
                  npyl_mix_row *out)
{
    for (size_t r = 0; r < n; r++) {
        int rc = row_at(m, epoch, pos[r], &out[r]);
        if (rc)
            return rc;
    }
    return 0;
}

int npyl_mix_build(npyl_mix *m, const npyl_order_params *split,
                   npyl_mix_row *out)
{
    char oerr[160];
    int rc = npyl_order_check(split, oerr, sizeof oerr);
    if (rc)
        return FAIL(m, rc, "mix: the split: %s", oerr);
    if (split->n != m->T)
        return FAIL(m, NPYLOAD_EINVAL, "mix: the split covers %" PRId64
                    " positions; the epoch has %" PRId64, split->n, m->T);
    int64_t len = npyl_order_delivered_len(split);
    for (int64_t r = 0; r < len; r++) {
        rc = row_at(m, split->epoch, npyl_order_position(split, r), &out[r]);
        if (rc)
            return rc;
    }
    return 0;
}

int npyl_mix_draws_before(npyl_mix *m, uint64_t epoch, int64_t pos,
                          int64_t *draws)
{
    int rc = check_point(m, epoch, pos, 1);
    if (rc)
        return rc;
    /* At a block's start (or the epoch's end) the shuffled block adds
     * nothing: the interleave's count is the answer. */
    int64_t lo = pos;
    if (pos < m->T) {
        ensure_block(m, epoch, pos);
        lo = m->blk_lo;
    }
    count_all(m->pre, 0, m->k, stream_index(m, epoch, lo), m->d, draws);
    for (int64_t i = 0; i < pos - lo; i++)
        draws[m->labels[i]]++;
    return 0;
}

int npyl_mix_set_weights(npyl_mix *m, uint64_t epoch, int64_t pos,
                         const double *w)
{
    uint32_t *u = malloc(m->k * sizeof *u);
    int64_t *d = malloc(m->k * sizeof *d);
    int rc = -ENOMEM;
    if (!u || !d) {
        FAIL(m, rc, "mix: no memory for %zu weights", m->k);
        goto out;
    }
    rc = npyl_mix_quantize(w, m->k, m->n, u, m->errmsg, sizeof m->errmsg);
    if (rc || memcmp(u, m->u, m->k * sizeof *u) == 0)
        goto out; /* bad weights, or the same ones: nothing changes */
    rc = npyl_mix_draws_before(m, epoch, pos, d);
    if (rc)
        goto out;
    if (pos == m->T && m->T > 0) {
        /* the epoch's end is the next epoch's start */
        if (epoch == UINT64_MAX) {
            rc = FAIL(m, NPYLOAD_ETOOBIG, "mix: no epoch after %" PRIu64,
                      epoch);
            goto out;
        }
        epoch++;
        pos = 0;
    }
    set_segment(m, epoch, pos, u, d);
out:
    free(u);
    free(d);
    return rc;
}

/* ---- create, destroy, queries ------------------------------------------- */

static int check_source(const npyl_mix_params *p, size_t k, char *err,
                        size_t errlen)
{
    const npyl_mix_source *s = &p->sources[k];
    npyl_order_params op = {
        .n = s->n, .shuffle = p->shuffle, .file_sizes = s->file_sizes,
        .nfiles = s->nfiles, .window = p->window, .world_size = 1,
        .batch_size = 1,
    };
    char oerr[160];
    if (npyl_order_check(&op, oerr, sizeof oerr))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "mix: source %zu: %s",
                         k, oerr);
    return 0;
}

int npyl_mix_create(const npyl_mix_params *p, npyl_mix **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    if (!p || !p->sources || p->nsources == 0 ||
        p->nsources > NPYL_MIX_MAX_SOURCES)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "mix: %zu sources; 1 .. %d expected",
                         p ? p->nsources : 0, NPYL_MIX_MAX_SOURCES);
    size_t K = p->nsources;
    int64_t B = p->block ? p->block : NPYL_MIX_DEFAULT_BLOCK;
    if (B < 1 || B > NPYL_MIX_MAX_BLOCK)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "mix: block %" PRId64 "; 1 .. %d (0: %d) expected",
                         p->block, NPYL_MIX_MAX_BLOCK, NPYL_MIX_DEFAULT_BLOCK);
    int64_t total = 0;
    for (size_t k = 0; k < K; k++) {
        int rc = check_source(p, k, err, errlen);
        if (rc)
            return rc;
        if (p->sources[k].n > INT64_MAX - total)
            return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                             "mix: the sources hold more than 2^63 samples");
        total += p->sources[k].n;
    }
    int64_t T = p->samples_per_epoch ? p->samples_per_epoch : total;
    npyl_order_params op = {.n = T, .world_size = 1, .batch_size = 1};
    char oerr[160];
    if (p->samples_per_epoch < 0 || npyl_order_check(&op, oerr, sizeof oerr))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "mix: samples_per_epoch %" PRId64 " (the epoch: %"
                         PRId64 " positions); 0 (the sum of the sources) or "
                         "a count within the order's limit expected",
                         p->samples_per_epoch, T);

    npyl_mix *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    m->k = K;
    m->T = T;
    m->B = B;
    m->window = p->window;
    m->seed = p->seed;
    m->shuffle = p->shuffle;
    m->n = calloc(K, sizeof *m->n);
    m->files = calloc(K, sizeof *m->files);
    m->nfiles = calloc(K, sizeof *m->nfiles);
    m->u = calloc(K, sizeof *m->u);
    m->d = calloc(K, sizeof *m->d);
    m->pre = calloc(K + 1, sizeof *m->pre);
    m->labels = calloc((size_t)B, sizeof *m->labels);
    m->bpass = calloc((size_t)B, sizeof *m->bpass);
    m->boff = calloc((size_t)B, sizeof *m->boff);
    m->cq = calloc(K, sizeof *m->cq);
    m->cj = calloc(K, sizeof *m->cj);
    m->offs = calloc(2 * (size_t)B, sizeof *m->offs);
    m->cnt = calloc(K, sizeof *m->cnt);
    m->stamp = calloc(K, sizeof *m->stamp);
    m->perm = calloc(K, sizeof *m->perm);
    m->perm_pass = calloc(K, sizeof *m->perm_pass);
    m->perm_ok = calloc(K, 1);
    int rc = -ENOMEM;
    if (!m->n || !m->files || !m->nfiles || !m->u || !m->d || !m->pre ||
        !m->labels || !m->bpass || !m->boff || !m->offs || !m->cnt || !m->cq || !m->cj || !m->stamp || !m->perm ||
        !m->perm_pass || !m->perm_ok)
        goto fail;
    for (size_t k = 0; k < K; k++) {
        const npyl_mix_source *s = &p->sources[k];
        m->n[k] = s->n;
        if (p->shuffle == NPYLOAD_SHUFFLE_LOCAL && s->nfiles > 0) {
            m->files[k] = malloc(s->nfiles * sizeof *m->files[k]);
            if (!m->files[k])
                goto fail;
            memcpy(m->files[k], s->file_sizes, s->nfiles * sizeof *m->files[k]);
            m->nfiles[k] = s->nfiles;
        }
    }
    rc = npyl_mix_quantize(p->weights, K, m->n, m->u, err, errlen);
    if (rc)
        goto fail;
    set_segment(m, 0, 0, m->u, m->d);
    *out = m;
    return 0;
fail:
    if (rc == -ENOMEM)
        npyl_fail(err, errlen, rc, "mix: no memory for %zu sources", K);
    npyl_mix_destroy(m);
    return rc;
}

void npyl_mix_destroy(npyl_mix *m)
{
    if (!m)
        return;
    for (size_t k = 0; k < m->k; k++) {
        if (m->files)
            free(m->files[k]);
        if (m->perm)
            free(m->perm[k]);
    }
    free(m->n);
    free(m->files);
    free(m->nfiles);
    free(m->u);
    free(m->d);
    free(m->pre);
    free(m->labels);
    free(m->bpass);
    free(m->boff);
    free(m->cq);
    free(m->cj);
    free(m->offs);
    free(m->cnt);
    free(m->stamp);
    free(m->perm);
    free(m->perm_pass);
    free(m->perm_ok);
    free(m);
}

int64_t npyl_mix_epoch_len(const npyl_mix *m) { return m->T; }
size_t npyl_mix_num_sources(const npyl_mix *m) { return m->k; }
int64_t npyl_mix_block(const npyl_mix *m) { return m->B; }
const char *npyl_mix_errmsg(const npyl_mix *m) { return m->errmsg; }

void npyl_mix_segment(const npyl_mix *m, uint64_t *epoch, int64_t *position,
                      uint32_t *u, int64_t *d)
{
    if (epoch)
        *epoch = m->seg_epoch;
    if (position)
        *position = m->seg_pos;
    if (u)
        memcpy(u, m->u, m->k * sizeof *u);
    if (d)
        memcpy(d, m->d, m->k * sizeof *d);
}

/* ---- the serialised state (npyload_mix.h, "Resume") --------------------- */

static const char MAGIC[8] = "NPYLMIX";


size_t npyl_mix_state_size(const npyl_mix *m)
{
    return NPYL_MIX_STATE_HEADER + m->k * NPYL_MIX_STATE_RECORD;
}

int npyl_mix_state_save(const npyl_mix *m, void *buf, size_t len)
{
    if (!buf || len < npyl_mix_state_size(m))
        return NPYLOAD_EINVAL;
    unsigned char *p = buf;
    memcpy(p, MAGIC, 8);
    npyl_put_le(p + 8, NPYL_MIX_STATE_VERSION, 4);
    npyl_put_le(p + 12, m->k, 4);
    npyl_put_le(p + 16, (uint64_t)m->T, 8);
    npyl_put_le(p + 24, (uint64_t)m->B, 8);
    npyl_put_le(p + 32, m->seg_epoch, 8);
    npyl_put_le(p + 40, (uint64_t)m->seg_pos, 8);
    for (size_t k = 0; k < m->k; k++) {
        unsigned char *r = p + NPYL_MIX_STATE_HEADER + k * NPYL_MIX_STATE_RECORD;
        npyl_put_le(r, (uint64_t)m->n[k], 8);
        npyl_put_le(r + 8, (uint64_t)m->d[k], 8);
        npyl_put_le(r + 16, m->u[k], 4);
        npyl_put_le(r + 20, 0, 4);
    }
    return 0;
}

int npyl_mix_state_load(npyl_mix *m, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    if (!p || len < NPYL_MIX_STATE_HEADER || memcmp(p, MAGIC, 8) != 0)
        return FAIL(m, NPYLOAD_EINVAL, "mixture state: %zu bytes without the "
                    "\"NPYLMIX\" header of %d bytes", p ? len : 0,
                    NPYL_MIX_STATE_HEADER);
    uint64_t version = npyl_get_le(p + 8, 4), K = npyl_get_le(p + 12, 4);
    int64_t T = (int64_t)npyl_get_le(p + 16, 8), B = (int64_t)npyl_get_le(p + 24, 8);
    uint64_t E = npyl_get_le(p + 32, 8);
    int64_t P = (int64_t)npyl_get_le(p + 40, 8);
    if (version != NPYL_MIX_STATE_VERSION)
        return FAIL(m, NPYLOAD_EINVAL, "mixture state: version %" PRIu64
                    "; this npyload reads version %d", version,
                    NPYL_MIX_STATE_VERSION);
    if (K != m->k)
        return FAIL(m, NPYLOAD_EMISMATCH, "mixture state: %" PRIu64
                    " sources; this mixture has %zu", K, m->k);
    if (len != npyl_mix_state_size(m))
        return FAIL(m, NPYLOAD_EINVAL, "mixture state: %zu bytes; %zu "
                    "expected for %zu sources", len, npyl_mix_state_size(m),
                    m->k);
    if (T != m->T || B != m->B)
        return FAIL(m, NPYLOAD_EMISMATCH, "mixture state: epochs of %" PRId64
                    " positions in blocks of %" PRId64 "; this mixture has %"
                    PRId64 " in blocks of %" PRId64, T, B, m->T, m->B);
    if (P < 0 || P > T || (P == T && T > 0))
        return FAIL(m, NPYLOAD_EINVAL, "mixture state: position %" PRId64
                    " out of range 0 .. %" PRId64, P, T > 0 ? T - 1 : 0);
    uint32_t *u = malloc(m->k * sizeof *u);
    int64_t *d = malloc(m->k * sizeof *d);
    int rc = 0;
    if (!u || !d) {
        rc = FAIL(m, -ENOMEM, "mixture state: no memory for %zu sources", m->k);
        goto out;
    }
    uint64_t usum = 0;
    for (size_t k = 0; k < m->k && rc == 0; k++) {
        const unsigned char *r = p + NPYL_MIX_STATE_HEADER + k * NPYL_MIX_STATE_RECORD;
        int64_t n = (int64_t)npyl_get_le(r, 8);
        d[k] = (int64_t)npyl_get_le(r + 8, 8);
        u[k] = (uint32_t)npyl_get_le(r + 16, 4);
        usum += u[k];
        if (n != m->n[k])
            rc = FAIL(m, NPYLOAD_EMISMATCH, "mixture state: source %zu holds %"
                      PRId64 " samples; this one holds %" PRId64, k, n, m->n[k]);
        else if (d[k] < 0 || npyl_get_le(r + 20, 4) != 0 ||
                 u[k] > NPYL_MIX_WEIGHT_ONE || (u[k] > 0 && n == 0))
            rc = FAIL(m, NPYLOAD_EINVAL, "mixture state: source %zu: draws %"
                      PRId64 ", weight %" PRIu32 " (of 2^30) out of range", k,
                      d[k], u[k]);
    }
    if (rc == 0 && (usum == 0 || usum > (uint64_t)NPYL_MIX_WEIGHT_ONE + m->k))
        rc = FAIL(m, NPYLOAD_EINVAL, "mixture state: the weights sum to %"
                  PRIu64 "; 1 .. 2^30 + %zu expected", usum, m->k);
    if (rc == 0)
        set_segment(m, E, P, u, d);
out:
    free(u);
    free(d);
    return rc;
}
