/* Sample order: the per-epoch permutation (SplitMix64-seeded xoshiro256**,
 * Lemire's bounded draws, Fisher–Yates) and the DistributedSampler-style
 * split across ranks. The algorithm is specified bit for bit in
 * npyload_order.h; this file must stay in step with that text (the Python
 * test reimplements it from the text alone). */
#include "npyload_order.h"
#include "npyload_order_rng.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- parameters --------------------------------------------------------- */

static int64_t window_of(const npyl_order_params *p)
{
    return p->window > 0 ? p->window : NPYL_ORDER_DEFAULT_WINDOW;
}

/* Checks what the permutation needs: n, shuffle and the LOCAL file list. */
static int check_perm(const npyl_order_params *p, char *err, size_t errlen)
{
    if (!p)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "order: no parameters");
    if (p->n < 0)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "order: %lld samples; n >= 0 expected",
                         (long long)p->n);
    /* Positions up to n + world_size must fit a size_t index and n entries
     * of int64_t must be allocatable. */
    if ((uint64_t)p->n > SIZE_MAX / (2 * sizeof(int64_t)))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "order: %lld samples is over the limit",
                         (long long)p->n);
    switch (p->shuffle) {
    case NPYLOAD_SHUFFLE_NONE:
    case NPYLOAD_SHUFFLE_FULL:
        return 0;
    case NPYLOAD_SHUFFLE_LOCAL:
        break;
    default:
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "order: shuffle mode %d; NONE (0), FULL (1) or "
                         "LOCAL (2) expected", p->shuffle);
    }
    if (p->nfiles > 0 && !p->file_sizes)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "order: LOCAL shuffle needs the file sizes");
    uint64_t sum = 0;
    for (size_t f = 0; f < p->nfiles; f++) {
        if (p->file_sizes[f] < 0)
            return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                             "order: file %zu holds %lld samples; >= 0 "
                             "expected", f, (long long)p->file_sizes[f]);
        sum += (uint64_t)p->file_sizes[f];
        if (sum > (uint64_t)p->n)
            break;
    }
    if (sum != (uint64_t)p->n)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "order: LOCAL shuffle: file sizes of %zu files sum "
                         "to %s%llu; %lld samples expected", p->nfiles,
                         sum > (uint64_t)p->n ? "more than " : "",
                         (unsigned long long)sum, (long long)p->n);
    return 0;
}

int npyl_order_check(const npyl_order_params *p, char *err, size_t errlen)
{
    int rc = check_perm(p, err, errlen);
    if (rc)
        return rc;
    if (p->world_size < 1)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "order: world_size %lld; >= 1 expected",
                         (long long)p->world_size);
    if (p->world_size > INT64_MAX / 4 || (uint64_t)p->world_size > SIZE_MAX / 4)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "order: world_size %lld is over the limit",
                         (long long)p->world_size);
    if (p->rank < 0 || p->rank >= p->world_size)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "order: rank %lld; 0 <= rank < world_size (%lld) "
                         "expected", (long long)p->rank,
                         (long long)p->world_size);
    if (p->drop_last != 0 && p->drop_last != 1)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "order: drop_last %d; 0 or 1 expected", p->drop_last);
    if (p->batch_size < 1)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "order: batch_size %lld; >= 1 expected",
                         (long long)p->batch_size);
    if (p->base < 0 || p->base > p->n)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "order: resume base %lld; 0 <= base <= %lld (the "
                         "samples) expected", (long long)p->base,
                         (long long)p->n);
    return 0;
}

/* ---- sizes -------------------------------------------------------------- */

int64_t npyl_order_rank_len(const npyl_order_params *p)
{
    int64_t m = p->n - p->base;
    int64_t q = m / p->world_size;
    if (!p->drop_last && m % p->world_size)
        q++;
    return q;
}

int64_t npyl_order_num_batches(const npyl_order_params *p)
{
    int64_t len = npyl_order_rank_len(p);
    int64_t nb = len / p->batch_size;
    if (!p->drop_last && len % p->batch_size)
        nb++;
    return nb;
}

int64_t npyl_order_delivered_len(const npyl_order_params *p)
{
    int64_t len = npyl_order_rank_len(p);
    if (p->drop_last)
        return len - len % p->batch_size;
    return len;
}

/* ---- permutation -------------------------------------------------------- */

/* LOCAL: permute the files, then the samples within each window of files.
 * Needs 2 * nfiles scratch entries (on the stack for small file lists). */
static int perm_local(const npyl_order_params *p, npyl_rng *g, int64_t *out)
{
    size_t nf = p->nfiles;
    size_t win = (size_t)window_of(p);
    int64_t stackbuf[2 * 256];
    int64_t *starts = stackbuf;
    if (nf > 256) {
        if (nf > SIZE_MAX / (2 * sizeof *starts))
            return -ENOMEM;
        starts = malloc(nf * 2 * sizeof *starts);
        if (!starts)
            return -ENOMEM;
    }
    int64_t *files = starts + nf;
    int64_t acc = 0;
    for (size_t f = 0; f < nf; f++) {
        starts[f] = acc;
        acc += p->file_sizes[f];
        files[f] = (int64_t)f;
    }
    fisher_yates(g, files, nf);
    size_t pos = 0;
    for (size_t w0 = 0; w0 < nf; w0 += win) {
        size_t w1 = nf - w0 > win ? w0 + win : nf;
        size_t seg = pos;
        for (size_t k = w0; k < w1; k++) {
            int64_t f = files[k], base = starts[f];
            for (int64_t s = 0; s < p->file_sizes[f]; s++)
                out[pos++] = base + s;
        }
        fisher_yates(g, out + seg, pos - seg);
    }
    if (starts != stackbuf)
        free(starts);
    return 0;
}

int npyl_order_permutation(const npyl_order_params *p, int64_t *out)
{
    int rc = check_perm(p, NULL, 0);
    if (rc)
        return rc;
    size_t n = (size_t)p->n;
    if (p->shuffle == NPYLOAD_SHUFFLE_LOCAL) {
        npyl_rng g;
        rng_init(&g, p->seed, p->epoch);
        return perm_local(p, &g, out);
    }
    for (size_t i = 0; i < n; i++)
        out[i] = (int64_t)i;
    if (p->shuffle == NPYLOAD_SHUFFLE_FULL) {
        npyl_rng g;
        rng_init(&g, p->seed, p->epoch);
        fisher_yates(&g, out, n);
    }
    return 0;
}

/* ---- split across ranks ------------------------------------------------- */

int64_t npyl_order_position(const npyl_order_params *p, int64_t k)
{
    /* Position k of rank r is r + k*W in the padded rest R = S[base..n) of
     * length m; positions past m wrap to the rest's head (cyclic repeat, as
     * DistributedSampler pads). k < rank_len implies m > 0, and positions
     * stay below m + W, far from overflow. */
    uint64_t m = (uint64_t)(p->n - p->base);
    uint64_t pos = (uint64_t)p->rank + (uint64_t)k * (uint64_t)p->world_size;
    return p->base + (int64_t)(pos < m ? pos : (pos - m) % m);
}

int npyl_order_build(const npyl_order_params *p, int64_t *out)
{
    int rc = npyl_order_check(p, NULL, 0);
    if (rc)
        return rc;
    size_t n = (size_t)p->n;
    size_t len = (size_t)npyl_order_delivered_len(p);
    if (len == 0)
        return 0;
    int64_t *perm = NULL;
    if (p->shuffle != NPYLOAD_SHUFFLE_NONE) {
        perm = malloc(n * sizeof *perm);
        if (!perm)
            return -ENOMEM;
        rc = npyl_order_permutation(p, perm);
        if (rc) {
            free(perm);
            return rc;
        }
    }
    for (size_t k = 0; k < len; k++) {
        size_t q = (size_t)npyl_order_position(p, (int64_t)k);
        out[k] = perm ? perm[q] : (int64_t)q;
    }
    free(perm);
    return 0;
}

/* ---- public ------------------------------------------------------------- */

int64_t npyload_order_indices(int64_t n, int shuffle, int64_t seed,
                              uint64_t epoch, int64_t rank, int64_t world_size,
                              int drop_last, int64_t batch_size,
                              const int64_t *file_sizes, size_t nfiles,
                              int64_t window, int64_t *out, size_t cap)
{
    npyl_order_params p = {
        .n = n, .shuffle = shuffle, .seed = seed, .epoch = epoch,
        .rank = rank, .world_size = world_size, .drop_last = drop_last,
        .batch_size = batch_size, .file_sizes = file_sizes, .nfiles = nfiles,
        .window = window,
    };
    int rc = npyl_order_check(&p, NULL, 0);
    if (rc)
        return rc;
    if (cap > 0 && !out)
        return NPYLOAD_EINVAL;
    int64_t len = npyl_order_delivered_len(&p);
    if (cap == 0 || len == 0)
        return len;
    if ((uint64_t)len <= cap) {
        rc = npyl_order_build(&p, out);
        return rc ? rc : len;
    }
    int64_t *tmp = malloc((size_t)len * sizeof *tmp);
    if (!tmp)
        return -ENOMEM;
    rc = npyl_order_build(&p, tmp);
    if (rc == 0)
        memcpy(out, tmp, cap * sizeof *tmp);
    free(tmp);
    return rc ? rc : len;
}
