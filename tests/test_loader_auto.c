/* The controller (NPYLOAD_AUTO, lib/loader/npyload_loader_auto.c) through
 * the public API. The truth is independent of the loader: every byte of
 * every delivered row is checked against tu_byte() (tests/testutil.h) and
 * the order against npyload_order_indices, while AUTO_FORCE makes the
 * controller change workers and slots every few batches; and a fixed
 * configuration's batches are compared with the auto loader's byte for
 * byte. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload.h"
#include "testutil.h"

static const int64_t FILE_SIZES[] = {7, 1, 13, 30, 5, 8, 40, 24};
#define NFILES (sizeof FILE_SIZES / sizeof FILE_SIZES[0])
#define N_TOTAL 128
static const int64_t IMG_SHAPE[] = {3, 5};
static const int64_t LAB_SHAPE[] = {7};

typedef struct {
    char *dir;
    char img[512], lab[512];
} dataset;

static dataset make_dataset(void)
{
    dataset d;
    d.dir = tu_mkdtemp("auto");
    cr_assert_not_null(d.dir);
    cr_assert_eq(tu_write_field(d.dir, "img", 1, "<f4", 4, 2, IMG_SHAPE, FILE_SIZES, NFILES, 64), 0);
    cr_assert_eq(tu_write_field(d.dir, "lab", 2, "|u1", 1, 1, LAB_SHAPE, FILE_SIZES, NFILES, 16), 0);
    snprintf(d.img, sizeof d.img, "%s/img_*.npy", d.dir);
    snprintf(d.lab, sizeof d.lab, "%s/lab_*.npy", d.dir);
    return d;
}

static npyload_loader *open_loader(const dataset *d, int64_t workers, int64_t prefetch,
                                   int64_t force, int64_t budget)
{
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "img", d->img), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_add_field(L, "lab", d->lab), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 5), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, NPYLOAD_SHUFFLE_FULL), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SEED, 11), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, prefetch), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_AUTO_FORCE, force), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_MEMORY_BUDGET, budget), 0);
    /* Four cores whatever the machine: the forced pairs reach 4 workers. */
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_AUTO_CORES, 4), 0);
    return L;
}

/* Every row of b against tu_byte, and its indices against want. */
static void check_batch(const npyload_batch *b, const int64_t *want, size_t rows)
{
    cr_assert_eq(npyload_batch_size(b), rows);
    const int64_t *ix = npyload_batch_indices(b);
    size_t rb[2] = {tu_sample_bytes(4, 2, IMG_SHAPE), tu_sample_bytes(1, 1, LAB_SHAPE)};
    for (size_t r = 0; r < rows; r++) {
        cr_assert_eq(ix[r], want[r], "row %zu: index %" PRId64 ", expected %" PRId64, r,
                     ix[r], want[r]);
        for (size_t f = 0; f < 2; f++) {
            const uint8_t *p = (const uint8_t *)npyload_batch_field(b, f)->data + r * rb[f];
            for (size_t i = 0; i < rb[f]; i++)
                cr_assert_eq(p[i], tu_byte((uint32_t)f + 1, (uint64_t)ix[r], i),
                             "field %zu sample %" PRId64 " byte %zu", f, ix[r], i);
        }
    }
}

/* Issue 37 item 2: the controller forced to change workers and slots every
 * 2 batches, with the caller holding up to three batches at times: every
 * batch of three epochs is the one the order and the files say, and the
 * counts did change (the history says so). */
Test(auto, forced_changes_keep_order_and_bytes)
{
    dataset d = make_dataset();
    npyload_loader *L = open_loader(&d, NPYLOAD_AUTO, NPYLOAD_AUTO, 2, 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    int64_t want[N_TOTAL];
    size_t seen_w[8] = {0}, seen_s[16] = {0};
    for (uint64_t e = 0; e < 3; e++) {
        cr_assert_eq(npyload_loader_set_epoch(L, e), 0);
        int64_t n = npyload_order_indices(N_TOTAL, NPYLOAD_SHUFFLE_FULL, 11, e, 0, 1, 0, 5,
                                          NULL, 0, 0, want, N_TOTAL);
        cr_assert_eq(n, N_TOTAL);
        npyload_batch *held[3] = {NULL, NULL, NULL};
        int64_t pos = 0;
        for (int k = 0;; k++) {
            npyload_batch *b = NULL;
            int rc = npyload_loader_next(L, &b);
            if (rc == NPYLOAD_EOF)
                break;
            cr_assert_eq(rc, 0, "%s", npyload_loader_errmsg(L));
            size_t rows = (size_t)(N_TOTAL - pos < 5 ? N_TOTAL - pos : 5);
            check_batch(b, want + pos, rows);
            pos += (int64_t)rows;
            /* Hold batches across forced changes: they must stay intact. */
            npyload_batch_release(held[k % 3]);
            held[k % 3] = (k / 7) % 2 ? b : NULL;
            if (!held[k % 3])
                npyload_batch_release(b);
            npyload_stats st;
            cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
            seen_w[st.num_workers < 8 ? st.num_workers : 7]++;
            seen_s[st.num_slots < 16 ? st.num_slots : 15]++;
            cr_assert_leq(st.memory_bytes, st.memory_budget);
        }
        for (int i = 0; i < 3; i++)
            npyload_batch_release(held[i]);
        cr_assert_eq(pos, N_TOTAL);
    }
    size_t kinds_w = 0, kinds_s = 0;
    for (int i = 0; i < 8; i++)
        kinds_w += seen_w[i] != 0;
    for (int i = 0; i < 16; i++)
        kinds_s += seen_s[i] != 0;
    cr_assert_geq(kinds_w, 3, "the worker count took %zu values", kinds_w);
    cr_assert_geq(kinds_s, 3, "the slot count took %zu values", kinds_s);
    npyload_auto_event ev[40];
    uint64_t total = 0;
    int n = npyload_loader_auto_history(L, ev, 40, sizeof *ev, &total);
    cr_assert_eq(n, 32, "the history keeps the last 32 (%d)", n);
    cr_assert_gt(total, 32);
    cr_assert_eq(ev[n - 1].reason, NPYLOAD_AUTO_FORCED);
    cr_assert_str_eq(npyload_auto_reason_name(ev[n - 1].reason), "forced");
    npyload_loader_destroy(L);
    tu_rmtree(d.dir);
}

/* The auto loader (measuring, not forced) and a fixed one deliver the same
 * batches, byte for byte, over two epochs. */
Test(auto, auto_and_fixed_deliver_the_same_batches)
{
    dataset d = make_dataset();
    npyload_loader *A = open_loader(&d, 0, 0, 0, 0);
    npyload_loader *F = open_loader(&d, 1, 2, 0, 0);
    cr_assert_eq(npyload_loader_start(A), 0, "%s", npyload_loader_errmsg(A));
    cr_assert_eq(npyload_loader_start(F), 0, "%s", npyload_loader_errmsg(F));
    for (uint64_t e = 0; e < 2; e++) {
        cr_assert_eq(npyload_loader_set_epoch(A, e), 0);
        cr_assert_eq(npyload_loader_set_epoch(F, e), 0);
        for (;;) {
            npyload_batch *a = NULL, *f = NULL;
            int ra = npyload_loader_next(A, &a), rf = npyload_loader_next(F, &f);
            cr_assert_eq(ra, rf);
            if (ra == NPYLOAD_EOF)
                break;
            cr_assert_eq(ra, 0);
            cr_assert_eq(npyload_batch_size(a), npyload_batch_size(f));
            size_t rows = npyload_batch_size(a);
            cr_assert_eq(memcmp(npyload_batch_indices(a), npyload_batch_indices(f),
                                rows * sizeof(int64_t)), 0);
            for (size_t k = 0; k < 2; k++) {
                const npyload_array *x = npyload_batch_field(a, k), *y = npyload_batch_field(f, k);
                cr_assert_eq(x->nbytes, y->nbytes);
                cr_assert_eq(memcmp(x->data, y->data, x->nbytes), 0);
            }
            npyload_batch_release(a);
            npyload_batch_release(f);
        }
    }
    npyload_stats st;
    cr_assert_eq(npyload_loader_get_stats(A, &st, sizeof st), 0);
    cr_assert_eq(st.auto_mode, 3);
    cr_assert_gt(st.memory_budget, 0);
    cr_assert_eq(npyload_loader_get_stats(F, &st, sizeof st), 0);
    cr_assert_eq(st.auto_mode, 0, "explicit counts: no controller");
    cr_assert_eq(st.num_workers, 1);
    cr_assert_eq(st.num_slots, 2);
    uint64_t total = 9;
    cr_assert_eq(npyload_loader_auto_history(F, NULL, 0, sizeof(npyload_auto_event), &total), 0);
    cr_assert_eq(total, 0, "a fixed loader makes no decision");
    npyload_loader_destroy(A);
    npyload_loader_destroy(F);
    tu_rmtree(d.dir);
}

/* MEMORY_BUDGET: one that cannot hold two slots and a worker is refused at
 * start, naming the option; one that holds a few slots is never exceeded,
 * even when the caller holds batches (then next() fails rather than grow
 * past it). */
Test(auto, memory_budget_is_a_ceiling)
{
    dataset d = make_dataset();
    npyload_loader *L = open_loader(&d, 0, 0, 0, 1000);
    cr_assert_neq(npyload_loader_start(L), 0);
    cr_assert(strstr(npyload_loader_errmsg(L), "MEMORY_BUDGET"), "%s", npyload_loader_errmsg(L));
    npyload_loader_destroy(L);

    /* A worker's buffers are 256 KiB here; room for it and 3 slots (a
     * slot holds each field aligned to 4 KiB: 8 KiB). */
    uint64_t budget = (256u << 10) + 3 * 8192;
    L = open_loader(&d, 1, NPYLOAD_AUTO, 0, (int64_t)budget);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyload_batch *held[8] = {0};
    int failed = 0;
    for (int k = 0; k < 8; k++) {
        int rc = npyload_loader_next(L, &held[k]);
        npyload_stats st;
        cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
        cr_assert_leq(st.memory_bytes, budget, "%" PRIu64 " bytes > budget %" PRIu64,
                      st.memory_bytes, budget);
        if (rc == NPYLOAD_EHELD) {
            failed = 1;
            break;
        }
        cr_assert_eq(rc, 0, "%s", npyload_loader_errmsg(L));
    }
    cr_assert(failed, "holding more batches than the budget's slots must fail");
    for (int k = 0; k < 8; k++)
        npyload_batch_release(held[k]);
    npyload_loader_destroy(L);
    tu_rmtree(d.dir);
}

/* The history's sized struct: a size below the first layout is refused. */
Test(auto, history_checks_its_arguments)
{
    npyload_auto_event ev;
    cr_assert_eq(npyload_loader_auto_history(NULL, &ev, 1, sizeof ev, NULL), NPYLOAD_EINVAL);
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_auto_history(L, &ev, 1, 8, NULL), NPYLOAD_EINVAL);
    cr_assert_eq(npyload_loader_auto_history(L, NULL, 1, sizeof ev, NULL), NPYLOAD_EINVAL);
    cr_assert_eq(npyload_loader_auto_history(L, &ev, 1, sizeof ev, NULL), 0);
    cr_assert_str_eq(npyload_auto_reason_name(99), "?");
    npyload_loader_destroy(L);
}
