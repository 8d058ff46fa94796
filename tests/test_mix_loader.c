/* The loader's mixture through the public C API (npyload_loader_add_source,
 * set_weights, npyload_batch_sources, source_samples, digest, save_state /
 * load_state), against independent truths: each batch's (source, index)
 * rows against lib/order's npyl_mix built here from the same parameters
 * (the order's own function, not the loader's ring), the bytes against a
 * plain pread of the files, the digest against XXH3 over the records that
 * npyload_digest.h documents, computed here from the delivered rows. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "npyload.h"
#include "order/npyload_mix.h"
#include "testutil.h"
#include "tu_store_fault.h"
#include "loader/npyload_loader_internal.h"

#define K 2
#define SEED 7
#define B 8
/* Source 0 is small (it cycles about three times an epoch at equal
 * weights, so a batch may hold a sample twice), source 1 large. */
static const int64_t FILES0[] = {5, 4}, FILES1[] = {20, 17, 13};
static const size_t NFILES[K] = {2, 3};
static const int64_t NS[K] = {9, 50};
static const int64_t XSHAPE[] = {3}, YSHAPE[] = {2};
#define XROW 12 /* <f4 (3,) */
#define YROW 2  /* |u1 (2,) */

static char *dir;

static void setup(void)
{
    dir = tu_mkdtemp("mixloader");
    cr_assert(dir);
    cr_assert_eq(tu_write_field(dir, "s0x", 1, "<f4", 4, 1, XSHAPE, FILES0, 2, 64), 0);
    cr_assert_eq(tu_write_field(dir, "s0y", 2, "|u1", 1, 1, YSHAPE, FILES0, 2, 16), 0);
    cr_assert_eq(tu_write_field(dir, "s1x", 11, "<f4", 4, 1, XSHAPE, FILES1, 3, 64), 0);
    cr_assert_eq(tu_write_field(dir, "s1y", 12, "|u1", 1, 1, YSHAPE, FILES1, 3, 16), 0);
}

static void teardown(void) { tu_rmtree(dir); }

/* Row `index` of source k's field ("x" or "y"), read with pread from the
 * file that holds it: the data offset from the NPY v1 header's length. */
static void pread_row(size_t k, const char *field, int64_t index, size_t row, uint8_t *out)
{
    const int64_t *sizes = k ? FILES1 : FILES0;
    size_t f = 0;
    while (index >= sizes[f]) {
        index -= sizes[f++];
        cr_assert_lt(f, NFILES[k]);
    }
    char name[64];
    snprintf(name, sizeof name, "s%zu%s_%04zu.npy", k, field, f);
    char *path = tu_path(dir, name);
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0, "%s", path);
    uint8_t h[10];
    cr_assert_eq(pread(fd, h, 10, 0), 10);
    cr_assert_eq(h[6], 1, "NPY version 1");
    off_t data = 10 + (h[8] | h[9] << 8);
    cr_assert_eq(pread(fd, out, row, data + (off_t)index * (off_t)row), (ssize_t)row);
    close(fd);
    free(path);
}

static npyload_loader *make(int64_t workers, const double *w)
{
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    for (size_t k = 0; k < K; k++) {
        char name[16], gx[512], gy[512];
        snprintf(name, sizeof name, "src%zu", k);
        snprintf(gx, sizeof gx, "%s/s%zux_*.npy", dir, k);
        snprintf(gy, sizeof gy, "%s/s%zuy_*.npy", dir, k);
        cr_assert_eq(npyload_loader_add_source(L, name), 0, "%s", npyload_loader_errmsg(L));
        /* Source 1 adds its fields in the other order: matched by name. */
        if (k == 0) {
            cr_assert_eq(npyload_loader_add_field(L, "x", gx), 0, "%s", npyload_loader_errmsg(L));
            cr_assert_eq(npyload_loader_add_field(L, "y", gy), 0, "%s", npyload_loader_errmsg(L));
        } else {
            cr_assert_eq(npyload_loader_add_field(L, "y", gy), 0, "%s", npyload_loader_errmsg(L));
            cr_assert_eq(npyload_loader_add_field(L, "x", gx), 0, "%s", npyload_loader_errmsg(L));
        }
    }
    cr_assert_eq(npyload_loader_set_weights(L, w, K), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, B), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, NPYLOAD_SHUFFLE_FULL), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SEED, SEED), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers), 0);
    cr_assert_eq(npyload_loader_num_sources(L), K);
    cr_assert_str_eq(npyload_loader_source_name(L, 1), "src1");
    return L;
}

/* The independent order: lib/order's mixture of the same sources. */
static npyl_mix *truth(const double *w)
{
    npyl_mix_source src[K] = {{.n = NS[0]}, {.n = NS[1]}};
    npyl_mix_params p = {.sources = src, .nsources = K, .weights = w,
                         .shuffle = NPYLOAD_SHUFFLE_FULL, .seed = SEED};
    npyl_mix *m = NULL;
    char err[256] = "";
    cr_assert_eq(npyl_mix_create(&p, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(npyl_mix_epoch_len(m), NS[0] + NS[1]);
    return m;
}

static npyl_mix_row *truth_epoch(npyl_mix *m, uint64_t e)
{
    int64_t T = npyl_mix_epoch_len(m);
    npyl_order_params op = {.n = T, .shuffle = NPYLOAD_SHUFFLE_FULL, .seed = SEED,
                            .epoch = e, .world_size = 1, .batch_size = B};
    npyl_mix_row *r = calloc((size_t)T, sizeof *r);
    cr_assert(r);
    cr_assert_eq(npyl_mix_build(m, &op, r), 0, "%s", npyl_mix_errmsg(m));
    return r;
}

/* The digest's record (npyload_digest.h) without augmentation. */
static uint64_t digest_row(uint64_t d, uint32_t source, int64_t index)
{
    uint8_t rec[24];
    for (int i = 0; i < 8; i++) {
        rec[i] = (uint8_t)(d >> 8 * i);
        rec[16 + i] = (uint8_t)((uint64_t)index >> 8 * i);
    }
    for (int i = 0; i < 4; i++) {
        rec[8 + i] = (uint8_t)(source >> 8 * i);
        rec[12 + i] = 0;
    }
    return XXH3_64bits(rec, sizeof rec);
}

/* What a run has seen: the rows in order, the digest over them, the rows
 * per source. */
typedef struct seen {
    npyl_mix_row rows[512];
    size_t n;
    uint64_t digest;
    int64_t per_source[K];
} seen;

/* Takes one batch and checks it: rows, bytes, and the loader's digest and
 * per-source counts against those recomputed from the rows seen. Returns
 * the next() code. */
static int take(npyload_loader *L, seen *s)
{
    npyload_batch *b;
    int rc = npyload_loader_next(L, &b);
    if (rc)
        return rc;
    size_t n = npyload_batch_size(b);
    const int64_t *idx = npyload_batch_indices(b);
    const uint32_t *src = npyload_batch_sources(b);
    cr_assert(idx && src, "a mixture's batch has indices and sources");
    cr_assert_eq(npyload_batch_num_fields(b), 2);
    const npyload_array *x = npyload_batch_field(b, 0), *y = npyload_batch_field(b, 1);
    cr_assert_lt(s->n + n, sizeof s->rows / sizeof s->rows[0]);
    for (size_t r = 0; r < n; r++) {
        cr_assert_lt(src[r], K);
        cr_assert(idx[r] >= 0 && idx[r] < NS[src[r]], "index %lld of source %u",
                  (long long)idx[r], src[r]);
        uint8_t want[XROW];
        pread_row(src[r], "x", idx[r], XROW, want);
        cr_assert_arr_eq(x->data + r * XROW, want, XROW, "x of source %u sample %lld", src[r],
                         (long long)idx[r]);
        pread_row(src[r], "y", idx[r], YROW, want);
        cr_assert_arr_eq(y->data + r * YROW, want, YROW, "y of source %u sample %lld", src[r],
                         (long long)idx[r]);
        s->rows[s->n++] = (npyl_mix_row){.index = idx[r], .source = src[r]};
        s->digest = digest_row(s->digest, src[r], idx[r]);
        s->per_source[src[r]]++;
    }
    npyload_batch_release(b);
    uint64_t d, rows;
    cr_assert_eq(npyload_loader_digest(L, &d, &rows), 0);
    cr_assert_eq(d, s->digest, "the loader's digest %016llx, recomputed %016llx",
                 (unsigned long long)d, (unsigned long long)s->digest);
    for (size_t k = 0; k < K; k++)
        cr_assert_eq(npyload_loader_source_samples(L, k), s->per_source[k]);
    return 0;
}

/* Three epochs, weights changed between epochs 1 and 2 (a curriculum):
 * every row is the mixture's, in order, every byte the file's, the digest
 * and counts the recomputed ones. */
Test(mix_loader, rows_bytes_and_digest_match_the_order, .init = setup, .fini = teardown)
{
    const double w0[K] = {1, 1}, w2[K] = {0.2, 0.8};
    npyload_loader *L = make(2, w0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyl_mix *m = truth(w0);
    static seen s; /* large: not on the stack */
    memset(&s, 0, sizeof s);
    int64_t T = NS[0] + NS[1];
    int repeats = 0;
    for (uint64_t e = 0; e < 3; e++) {
        if (e == 2) {
            cr_assert_eq(npyload_loader_set_weights(L, w2, K), 0, "%s", npyload_loader_errmsg(L));
            cr_assert_eq(npyl_mix_set_weights(m, 2, 0, w2), 0, "%s", npyl_mix_errmsg(m));
        }
        cr_assert_eq(npyload_loader_set_epoch(L, e), 0, "%s", npyload_loader_errmsg(L));
        npyl_mix_row *want = truth_epoch(m, e);
        size_t first = s.n;
        int rc;
        while ((rc = take(L, &s)) == 0)
            ;
        cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
        cr_assert_eq(s.n - first, (size_t)T, "epoch %llu: %zu rows", (unsigned long long)e,
                     s.n - first);
        for (int64_t p = 0; p < T; p++) {
            const npyl_mix_row *g = &s.rows[first + (size_t)p];
            cr_assert(g->source == want[p].source && g->index == want[p].index,
                      "epoch %llu position %lld: (%u, %lld), the order has (%u, %lld)",
                      (unsigned long long)e, (long long)p, g->source, (long long)g->index,
                      want[p].source, (long long)want[p].index);
            /* A sample twice in one batch: the small source cycled. */
            for (int64_t q = p - p % B; q < p; q++)
                repeats += want[q].source == want[p].source && want[q].index == want[p].index;
        }
        free(want);
        if (e == 2) /* the curriculum's weights show */
            cr_assert_gt(s.per_source[1] - (s.n - T), 0);
    }
    cr_assert_gt(repeats, 0, "the case has a sample twice in a batch");
    uint64_t d, rows;
    cr_assert_eq(npyload_loader_digest(L, &d, &rows), 0);
    cr_assert_eq(rows, (uint64_t)(3 * T));
    npyl_mix_destroy(m);
    npyload_loader_destroy(L);
}

/* save_state mid-epoch (after a mid-epoch weight change), load into a new
 * loader with another worker count: the next rows are exactly those the
 * saved loader goes on to give, the digest continues. */
static void resume_case(int64_t workers_after, int load_after_start)
{
    const double w0[K] = {1, 1}, w1[K] = {3, 1};
    npyload_loader *L = make(2, w0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    static seen a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    cr_assert_eq(npyload_loader_set_epoch(L, 1), 0);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(take(L, &a), 0);
    cr_assert_eq(npyload_loader_set_weights(L, w1, K), 0, "%s", npyload_loader_errmsg(L));
    for (int i = 0; i < 2; i++)
        cr_assert_eq(take(L, &a), 0);
    int64_t len = npyload_loader_save_state(L, NULL, 0);
    cr_assert_gt(len, 0);
    void *st = malloc((size_t)len);
    cr_assert_eq(npyload_loader_save_state(L, st, (size_t)len), len);
    size_t cut = a.n;
    int rc;
    while ((rc = take(L, &a)) == 0)
        ;
    cr_assert_eq(rc, NPYLOAD_EOF);
    /* The whole epoch (with its change) is the order's. */
    npyl_mix *m = truth(w0);
    npyl_mix_row *want0 = truth_epoch(m, 1); /* before the change point */
    cr_assert_eq(npyl_mix_set_weights(m, 1, 2 * B, w1), 0, "%s", npyl_mix_errmsg(m));
    /* The positions from the change point on (the mixture knows only
     * those after its new segment's start). */
    int64_t T = npyl_mix_epoch_len(m);
    npyl_mix_row *want1 = calloc((size_t)T, sizeof *want1);
    int64_t *pos = calloc((size_t)T, sizeof *pos);
    cr_assert(want1 && pos);
    for (int64_t p = 2 * B; p < T; p++)
        pos[p] = p;
    cr_assert_eq(npyl_mix_rows(m, 1, pos + 2 * B, (size_t)(T - 2 * B), want1 + 2 * B), 0, "%s",
                 npyl_mix_errmsg(m));
    free(pos);
    cr_assert_eq(a.n, (size_t)(NS[0] + NS[1]));
    for (size_t p = 0; p < a.n; p++) {
        const npyl_mix_row *w = p < 2 * B ? &want0[p] : &want1[p];
        cr_assert(a.rows[p].source == w->source && a.rows[p].index == w->index,
                  "position %zu: (%u, %lld), the order has (%u, %lld)", p, a.rows[p].source,
                  (long long)a.rows[p].index, w->source, (long long)w->index);
    }
    int changed = 0;
    for (size_t p = 2 * B; p < a.n; p++)
        changed |= want0[p].source != want1[p].source || want0[p].index != want1[p].index;
    cr_assert(changed, "the weight change changes the rest of the epoch");

    npyload_loader *R = make(workers_after, w0);
    if (load_after_start) { /* a started loader abandons its position */
        cr_assert_eq(npyload_loader_start(R), 0, "%s", npyload_loader_errmsg(R));
        cr_assert_eq(take(R, &b), 0);
        b.n = 0; /* per_source keeps them: source_samples counts from start */
    }
    cr_assert_eq(npyload_loader_load_state(R, st, (size_t)len), 0, "%s",
                 npyload_loader_errmsg(R));
    if (!load_after_start)
        cr_assert_eq(npyload_loader_start(R), 0, "%s", npyload_loader_errmsg(R));
    /* The resumed digest and counts start from the saved ones. */
    uint64_t d, rows;
    cr_assert_eq(npyload_loader_digest(R, &d, &rows), 0);
    b.digest = d;
    cr_assert_eq(rows, cut);
    uint64_t dcut = 0;
    for (size_t p = 0; p < cut; p++)
        dcut = digest_row(dcut, a.rows[p].source, a.rows[p].index);
    cr_assert_eq(d, dcut, "the restored digest is the saved loader's at the cut");
    while ((rc = take(R, &b)) == 0)
        ;
    cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(R));
    cr_assert_eq(b.n, a.n - cut, "the resumed loader gave %zu rows, the rest is %zu", b.n,
                 a.n - cut);
    for (size_t p = 0; p < b.n; p++)
        cr_assert(b.rows[p].source == a.rows[cut + p].source &&
                      b.rows[p].index == a.rows[cut + p].index,
                  "resumed row %zu: (%u, %lld), uninterrupted (%u, %lld)", p, b.rows[p].source,
                  (long long)b.rows[p].index, a.rows[cut + p].source,
                  (long long)a.rows[cut + p].index);
    cr_assert_eq(b.digest, a.digest, "the resumed stream's digest is the uninterrupted one's");
    /* The next epoch goes on with the weights in force at the save. */
    cr_assert_eq(npyload_loader_set_epoch(L, 2), 0);
    cr_assert_eq(npyload_loader_set_epoch(R, 2), 0);
    while ((rc = take(L, &a)) == 0)
        ;
    while ((rc = take(R, &b)) == 0)
        ;
    cr_assert_eq(b.digest, a.digest, "epoch 2 after the resume");
    free(want0);
    free(want1);
    npyl_mix_destroy(m);
    free(st);
    npyload_loader_destroy(L);
    npyload_loader_destroy(R);
}

Test(mix_loader, resume_mid_epoch_at_three_workers, .init = setup, .fini = teardown)
{
    resume_case(3, 0);
}

/* load_state into a started loader: it freed the state's mixture bytes
 * twice. */
Test(mix_loader, resume_into_a_started_loader, .init = setup, .fini = teardown)
{
    resume_case(2, 1);
}

Test(mix_loader, resume_mid_epoch_without_worker_threads, .init = setup, .fini = teardown)
{
    resume_case(NPYLOAD_WORKERS_SYNC, 0);
}

/* A source whose fields differ from source 0's is refused, naming both. */
Test(mix_loader, mismatched_source_is_named, .init = setup, .fini = teardown)
{
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    char g[512];
    cr_assert_eq(npyload_loader_add_source(L, "a"), 0);
    snprintf(g, sizeof g, "%s/s0x_*.npy", dir);
    cr_assert_eq(npyload_loader_add_field(L, "x", g), 0);
    cr_assert_eq(npyload_loader_add_source(L, "b"), 0);
    snprintf(g, sizeof g, "%s/s1y_*.npy", dir); /* |u1 (2,) as "x" */
    cr_assert_eq(npyload_loader_add_field(L, "x", g), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, B), 0);
    cr_assert_neq(npyload_loader_start(L), 0);
    const char *msg = npyload_loader_errmsg(L);
    cr_assert(strstr(msg, "source 'b', field 'x'") && strstr(msg, "source 'a'") &&
                  strstr(msg, "(2)") && strstr(msg, "(3)") && strstr(msg, "|u1") &&
                  strstr(msg, "<f4"),
              "the message names both sources, the field and both values: %s", msg);
    npyload_loader_destroy(L);
}

/* ---- ON_ERROR skip with a sample twice in one batch ----
 * Source 0 holds two samples, so a batch holds its sample 0 several times,
 * each copy from another pass of the source, with its own augmentation.
 * Reads of that sample fail the first `limit` times (the tests' fault
 * store): the batch read, its retry, then the row reads in the batch's
 * order, so the copies dropped are the first ones. The rows kept must
 * carry their own positions' (source, index, pass): their augmentation
 * decisions and transformed bytes are those of the same positions in a
 * run without faults. Matching a kept row by its sample index gave a later
 * copy the first copy's pass. */
#define SKN1 40
#define SKROW (6 * 6 * 4) /* float32 (6, 6) out */

typedef struct skrow {
    uint32_t source;
    int64_t index;
    uint8_t hf, vf;
    int64_t top, left;
    float px[6 * 6];
} skrow;

typedef struct skbatch {
    size_t n;
    skrow r[B];
} skbatch;

static npyload_loader *make_skip(int fault, tu_fault *f)
{
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    if (fault)
        cr_assert_eq(npyl_loader_register_store(L, &tu_store_fault, f), 0);
    for (size_t k = 0; k < K; k++) {
        char name[16], g[600];
        snprintf(name, sizeof name, "src%zu", k);
        snprintf(g, sizeof g, "%s%s/k%zuimg_*.npy", fault ? "fault://" : "", dir, k);
        cr_assert_eq(npyload_loader_add_source(L, name), 0, "%s", npyload_loader_errmsg(L));
        cr_assert_eq(npyload_loader_add_field(L, "img", g), 0, "%s", npyload_loader_errmsg(L));
    }
    npyload_transform tr = {.dtype = NPYLOAD_DTYPE_FLOAT32, .scale = 1.0f, .hflip = 0.5f,
                            .vflip = 0.5f, .pad = 2, .crop_h = 6, .crop_w = 6};
    cr_assert_eq(npyload_loader_set_transform(L, "img", &tr, sizeof tr), 0, "%s",
                 npyload_loader_errmsg(L));
    const double w[K] = {1, 1};
    cr_assert_eq(npyload_loader_set_weights(L, w, K), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, B), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, NPYLOAD_SHUFFLE_FULL), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SEED, SEED), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, NPYLOAD_WORKERS_SYNC), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_ON_ERROR, 1), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    return L;
}

/* Epoch 0's batches into out[] (at most nmax); returns how many. */
static size_t skip_epoch(npyload_loader *L, skbatch *out, size_t nmax)
{
    cr_assert_eq(npyload_loader_set_epoch(L, 0), 0);
    size_t nb = 0;
    npyload_batch *b;
    int rc;
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        cr_assert_lt(nb, nmax);
        skbatch *o = &out[nb++];
        o->n = npyload_batch_size(b);
        uint8_t hf[B], vf[B];
        int64_t top[B], left[B];
        cr_assert_eq(npyload_batch_augment(b, 0, hf, vf, top, left), 0);
        const float *px = (const float *)npyload_batch_field(b, 0)->data;
        for (size_t r = 0; r < o->n; r++) {
            o->r[r] = (skrow){.source = npyload_batch_sources(b)[r],
                              .index = npyload_batch_indices(b)[r], .hf = hf[r], .vf = vf[r],
                              .top = top[r], .left = left[r]};
            memcpy(o->r[r].px, px + r * 36, sizeof o->r[r].px);
        }
        npyload_batch_release(b);
    }
    cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    return nb;
}

static int skrow_eq(const skrow *a, const skrow *b)
{
    return a->source == b->source && a->index == b->index && a->hf == b->hf &&
           a->vf == b->vf && a->top == b->top && a->left == b->left &&
           memcmp(a->px, b->px, sizeof a->px) == 0;
}

Test(mix_loader, skip_keeps_each_copys_own_pass, .init = setup, .fini = teardown)
{
    int64_t n0[] = {2}, n1[] = {SKN1 / 2, SKN1 / 2}, sh[] = {6, 6};
    cr_assert_eq(tu_write_field(dir, "k0img", 21, "|u1", 1, 2, sh, n0, 1, 64), 0);
    cr_assert_eq(tu_write_field(dir, "k1img", 22, "|u1", 1, 2, sh, n1, 2, 64), 0);
    /* Sample 0 of source 0: its bytes in its file. */
    char *path = tu_path(dir, "k0img_0000.npy");
    int fd = open(path, O_RDONLY);
    uint8_t h[10];
    cr_assert(fd >= 0 && pread(fd, h, 10, 0) == 10);
    close(fd);
    free(path);
    uint64_t data = 10 + (uint64_t)(h[8] | h[9] << 8);

    static skbatch want[16], got[16];
    tu_fault none = {0};
    npyload_loader *R = make_skip(0, &none);
    size_t nb = skip_epoch(R, want, 16);
    npyload_loader_destroy(R);

    int informative = 0;
    for (uint64_t limit = 1; limit <= 24; limit++) {
        tu_fault f = {.fail_path = "k0img_0000.npy", .fail_from = data, .fail_to = data + 36,
                      .fail_code = -EIO, .fail_limit = limit};
        npyload_loader *L = make_skip(1, &f);
        cr_assert_eq(skip_epoch(L, got, 16), nb);
        npyload_loader_destroy(L);
        for (size_t bi = 0; bi < nb; bi++) {
            const skbatch *w = &want[bi], *g = &got[bi];
            cr_assert_leq(g->n, w->n);
            size_t drop = w->n - g->n, ndup = 0, j = 0;
            /* g = w less its first `drop` copies of (0, 0). */
            for (size_t r = 0; r < w->n; r++) {
                int dup = w->r[r].source == 0 && w->r[r].index == 0;
                if (dup && ndup++ < drop)
                    continue;
                cr_assert_lt(j, g->n);
                cr_assert(skrow_eq(&g->r[j], &w->r[r]),
                          "limit %llu, batch %zu: kept row %zu is (%u, %lld) flips %d %d crop "
                          "%lld %lld; planned row %zu is (%u, %lld) flips %d %d crop %lld %lld",
                          (unsigned long long)limit, bi, j, g->r[j].source,
                          (long long)g->r[j].index, g->r[j].hf, g->r[j].vf,
                          (long long)g->r[j].top, (long long)g->r[j].left, r, w->r[r].source,
                          (long long)w->r[r].index, w->r[r].hf, w->r[r].vf,
                          (long long)w->r[r].top, (long long)w->r[r].left);
                j++;
            }
            cr_assert_eq(j, g->n);
            cr_assert_leq(drop, ndup);
            /* A case that matching by sample index gets wrong: a copy kept
             * after one dropped, with other decisions than the first. */
            if (drop && drop < ndup) {
                const skrow *first = NULL;
                size_t c = 0;
                for (size_t r = 0; r < w->n; r++)
                    if (w->r[r].source == 0 && w->r[r].index == 0) {
                        if (!first)
                            first = &w->r[r];
                        else if (c >= drop && !skrow_eq(first, &w->r[r]))
                            informative++;
                        c++;
                    }
            }
        }
    }
    cr_assert_gt(informative, 0, "no batch kept a later copy whose decisions differ");
}

/* ---- per-source transforms (npyload_loader_set_source_transform) ----
 * x (<f4 (3,)) scaled by 2 for source 0 and by -3 for source 1; y kept.
 * Every row of x is its source's stored row (pread) times its source's
 * scale; y is the stored row. A source's own transform that delivers
 * another dtype than the others' is refused at start naming both sources
 * and the field; an unknown source or field, and a call after start, are
 * refused. */
Test(mix_loader, each_source_its_own_transform, .init = setup, .fini = teardown)
{
    const double w[K] = {1, 1};
    const float scale[K] = {2.0f, -3.0f};
    npyload_loader *L = make(2, w);
    for (size_t k = 0; k < K; k++) {
        npyload_transform t = NPYLOAD_TRANSFORM_INIT;
        t.dtype = NPYLOAD_DTYPE_FLOAT32;
        t.scale = scale[k];
        cr_assert_eq(npyload_loader_set_source_transform(L, k ? "src1" : "src0", "x", &t,
                                                         sizeof t),
                     0, "%s", npyload_loader_errmsg(L));
    }
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    char why[512];
    cr_assert_eq(npyload_loader_field_engine(L, 0, why, sizeof why), NPYLOAD_ENGINE_HOST, "%s",
                 why);
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    cr_assert_eq(npyload_loader_set_source_transform(L, "src0", "x", &t, sizeof t),
                 NPYLOAD_ESTATE);
    int64_t per[K] = {0, 0};
    npyload_batch *b;
    int rc;
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        const int64_t *idx = npyload_batch_indices(b);
        const uint32_t *src = npyload_batch_sources(b);
        const npyload_array *x = npyload_batch_field(b, 0), *y = npyload_batch_field(b, 1);
        cr_assert_str_eq(x->descr, "<f4");
        for (size_t r = 0; r < npyload_batch_size(b); r++) {
            float stored[3], got[3];
            pread_row(src[r], "x", idx[r], XROW, (uint8_t *)stored);
            memcpy(got, (const uint8_t *)x->data + r * XROW, XROW);
            for (int c = 0; c < 3; c++) { /* the test files' bytes hold NaNs too */
                float want = stored[c] * scale[src[r]];
                cr_assert(isnan(want) ? isnan(got[c]) : got[c] == want,
                          "source %u sample %lld channel %d: %g, stored %g", src[r],
                          (long long)idx[r], c, got[c], stored[c]);
            }
            uint8_t want[YROW];
            pread_row(src[r], "y", idx[r], YROW, want);
            cr_assert_arr_eq((const uint8_t *)y->data + r * YROW, want, YROW);
            per[src[r]]++;
        }
        npyload_batch_release(b);
    }
    cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    cr_assert(per[0] > 0 && per[1] > 0);
    npyload_loader_destroy(L);

    L = make(1, w);
    t.dtype = NPYLOAD_DTYPE_FLOAT32;
    cr_assert_eq(npyload_loader_set_source_transform(L, "nope", "x", &t, sizeof t),
                 NPYLOAD_EINVAL);
    cr_assert(strstr(npyload_loader_errmsg(L), "'nope'"), "%s", npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set_source_transform(L, "src1", "z", &t, sizeof t),
                 NPYLOAD_EINVAL);
    cr_assert(strstr(npyload_loader_errmsg(L), "'z'"), "%s", npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set_source_transform(L, "src1", "y", &t, sizeof t), 0);
    cr_assert_eq(npyload_loader_start(L), NPYLOAD_EMISMATCH);
    const char *msg = npyload_loader_errmsg(L);
    cr_assert(strstr(msg, "field 'y'") && strstr(msg, "'src0'") && strstr(msg, "'src1'") &&
                  strstr(msg, "|u1") && strstr(msg, "<f4"),
              "the message names the field, both sources and both dtypes: %s", msg);
    /* Removed again: the loader starts, y as stored. */
    cr_assert_eq(npyload_loader_set_source_transform(L, "src1", "y", NULL, 0), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyload_loader_destroy(L);
}
