/* Concurrency stress for the loader, without Criterion: Criterion cannot run
 * under ThreadSanitizer (Snaipe/Criterion#274), and this is the program CI
 * runs in the TSan build. It exercises the paths where threads meet: many
 * workers filling slots while the consumer takes and releases them out of
 * order, set_epoch while reads are in flight, destroy mid-epoch with batches
 * outstanding and released from another thread, every backend, and workers
 * whose reads fail (the tests' fault store) while set_state, set_epoch,
 * next, stats and the position's readers run on other threads, and a
 * mixture of sources while set_weights, load_state, set_epoch, next, stats
 * and the digest's reader do.
 * Every delivered byte is checked against tu_byte(). Prints
 * "N passed, N failed" and exits non-zero on any failure. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "npyload.h"
#include "loader/npyload_loader_internal.h"
#include "testutil.h"
#include "tu_store_fault.h"

static int failures, passes;
#define CHECK(cond, ...) TU_STRESS_CHECK(failures, cond, __VA_ARGS__)

/* Second pass (issue 37): every threaded loader is an auto loader whose
 * controller changes workers and slots after every batch (AUTO_FORCE 1),
 * and switches read-ahead off and on where the workers read ahead (the
 * default READ_AHEAD with transforms: transforms_under_load), while the
 * scenarios below run: next, set_epoch, set_state, save and restore,
 * stats, destroy with batches held, a mixture's set_weights. */
static int forced_auto;

static int set_counts(npyload_loader *L, int64_t workers, int64_t prefetch)
{
    if (!forced_auto || workers == NPYLOAD_WORKERS_SYNC)
        return npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers) ||
               (prefetch && npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, prefetch));
    return npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, NPYLOAD_AUTO) ||
           npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, NPYLOAD_AUTO) ||
           npyload_loader_set(L, NPYLOAD_OPT_AUTO_FORCE, 1) ||
           npyload_loader_set(L, NPYLOAD_OPT_AUTO_CORES, 4);
}

static const int64_t SIZES[] = {9, 3, 17, 1, 22, 12};
#define NF (sizeof SIZES / sizeof SIZES[0])
#define N 64
static const int64_t SHAPE[] = {5, 3};
static char *dir, glob_a[512], glob_b[512];
/* NPYLOAD_OPT_READ_AHEAD of every loader: main runs the scenarios with 1
 * (the read-ahead threads and their hand-offs, which the default leaves off
 * for these stored rows delivered as they are) and with 0, the default. */
static int64_t read_ahead;

/* Row r of fields a and b holds global sample g. */
static int row_ok(const uint8_t *a, const uint8_t *c, size_t r, uint64_t g)
{
    for (size_t i = 0; i < 60; i++)
        if (a[r * 60 + i] != tu_byte(1, g, i))
            return 0;
    for (size_t i = 0; i < 15; i++)
        if (c[r * 15 + i] != tu_byte(2, g, i))
            return 0;
    return 1;
}

static int batch_ok(npyload_batch *b)
{
    const int64_t *idx = npyload_batch_indices(b);
    const uint8_t *a = npyload_batch_field(b, 0)->data, *c = npyload_batch_field(b, 1)->data;
    for (size_t r = 0; r < npyload_batch_size(b); r++)
        if (!row_ok(a, c, r, (uint64_t)idx[r]))
            return 0;
    return 1;
}

static npyload_loader *make(int backend, int workers, int prefetch, int64_t batch)
{
    npyload_loader *L;
    if (npyload_loader_create(&L) || npyload_loader_add_field(L, "a", glob_a) ||
        npyload_loader_add_field(L, "b", glob_b) ||
        npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, backend) ||
        set_counts(L, workers, prefetch) ||
        npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, batch) ||
        npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1) ||
        npyload_loader_set(L, NPYLOAD_OPT_READ_AHEAD, read_ahead) || npyload_loader_start(L)) {
        fprintf(stderr, "setup failed: %s\n", npyload_loader_errmsg(L));
        exit(2);
    }
    return L;
}

/* Consumer keeps up to `hold` batches and releases them oldest-last. */
static void epochs_out_of_order_release(int backend)
{
    npyload_loader *L = make(backend, 4, 4, 3);
    for (uint64_t e = 0; e < 4; e++) {
        CHECK(npyload_loader_set_epoch(L, e) == 0, "set_epoch");
        npyload_batch *held[3] = {0};
        int nh = 0, nb = 0, rc;
        npyload_batch *b;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            CHECK(batch_ok(b), "bytes differ (backend %d epoch %llu)", backend,
                  (unsigned long long)e);
            held[nh++] = b;
            nb++;
            if (nh == 3) {
                npyload_batch_release(held[2]);
                npyload_batch_release(held[0]);
                npyload_batch_release(held[1]);
                nh = 0;
            }
        }
        for (int i = 0; i < nh; i++)
            npyload_batch_release(held[i]);
        CHECK(rc == NPYLOAD_EOF, "next: %s", npyload_loader_errmsg(L));
        CHECK(nb == npyload_loader_num_batches(L), "batches %d", nb);
    }
    npyload_loader_destroy(L);
    passes++;
}

static void set_epoch_in_flight(int backend)
{
    npyload_loader *L = make(backend, 3, 6, 1);
    for (uint64_t e = 0; e < 30; e++) {
        CHECK(npyload_loader_set_epoch(L, e % 5) == 0, "set_epoch");
        npyload_batch *b;
        for (uint64_t k = 0; k < e % 4; k++) {
            CHECK(npyload_loader_next(L, &b) == 0, "next: %s", npyload_loader_errmsg(L));
            CHECK(batch_ok(b), "bytes differ");
            CHECK(npyload_batch_epoch(b) == e % 5, "epoch");
            npyload_batch_release(b);
        }
    }
    npyload_loader_destroy(L);
    passes++;
}

static void *release_later(void *arg)
{
    npyload_batch **bs = arg;
    for (int i = 0; bs[i]; i++) {
        if (!batch_ok(bs[i]))
            __atomic_fetch_add(&failures, 1, __ATOMIC_SEQ_CST);
        npyload_batch_release(bs[i]);
    }
    return NULL;
}

static void destroy_mid_epoch_release_elsewhere(int backend)
{
    for (int round = 0; round < 10; round++) {
        npyload_loader *L = make(backend, 4, 5, 2);
        npyload_batch *bs[4] = {0};
        int k = round % 4;
        for (int i = 0; i < k; i++)
            CHECK(npyload_loader_next(L, &bs[i]) == 0, "next: %s", npyload_loader_errmsg(L));
        pthread_t t;
        pthread_create(&t, NULL, release_later, bs);
        npyload_loader_destroy(L); /* races with the releases on purpose */
        pthread_join(t, NULL);
    }
    passes++;
}

static void stats_while_running(int backend)
{
    npyload_loader *L = make(backend, 2, 3, 4);
    npyload_batch *b;
    npyload_stats st;
    while (npyload_loader_next(L, &b) == 0) {
        npyload_loader_get_stats(L, &st, sizeof st);
        CHECK(batch_ok(b), "bytes differ");
        npyload_batch_release(b);
    }
    npyload_loader_get_stats(L, &st, sizeof st);
    CHECK(st.samples_delivered == N, "samples %llu", (unsigned long long)st.samples_delivered);
    npyload_loader_destroy(L);
    passes++;
}

/* Transforms in the workers (and in next() with NPYLOAD_WORKERS_SYNC):
 * "a" (5, 3) float32 kept and permuted channels-last, "b" (15,) uint8 to
 * float32 x 2, with epochs abandoned mid-flight. Under TSan: the workers'
 * raw buffers and the plans are shared safely. */
static void transforms_under_load(int backend, int workers)
{
    npyload_loader *L;
    npyload_transform ta = {.scale = 1.0f, .channels_last = 1};
    npyload_transform tb = {.dtype = NPYLOAD_DTYPE_FLOAT32, .scale = 2.0f};
    if (npyload_loader_create(&L) || npyload_loader_add_field(L, "a", glob_a) ||
        npyload_loader_add_field(L, "b", glob_b) ||
        npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, backend) ||
        set_counts(L, workers, 0) ||
        npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 5) ||
        npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1) ||
        npyload_loader_set(L, NPYLOAD_OPT_READ_AHEAD, read_ahead) ||
        npyload_loader_set_transform(L, "a", &ta, sizeof ta) ||
        npyload_loader_set_transform(L, "b", &tb, sizeof tb) || npyload_loader_start(L)) {
        fprintf(stderr, "setup failed: %s\n", npyload_loader_errmsg(L));
        exit(2);
    }
    for (uint64_t e = 0; e < 6; e++) {
        npyload_loader_set_epoch(L, e);
        npyload_batch *b;
        int k = 0;
        while ((e % 2 == 0 || k < 3) && npyload_loader_next(L, &b) == 0) {
            const int64_t *idx = npyload_batch_indices(b);
            const uint8_t *a = npyload_batch_field(b, 0)->data;
            const float *y = npyload_batch_field(b, 1)->data;
            for (size_t r = 0; r < npyload_batch_size(b); r++) {
                for (size_t c = 0; c < 5; c++)
                    for (size_t j = 0; j < 3; j++)
                        for (size_t q = 0; q < 4; q++)
                            CHECK(a[r * 60 + (j * 5 + c) * 4 + q] ==
                                      tu_byte(1, (uint64_t)idx[r], (c * 3 + j) * 4 + q),
                                  "channels-last bytes differ");
                for (size_t i = 0; i < 15; i++)
                    CHECK(y[r * 15 + i] == 2.0f * tu_byte(2, (uint64_t)idx[r], i),
                          "float32 x 2 differs");
            }
            npyload_batch_release(b);
            k++;
        }
    }
    if (forced_auto && workers != NPYLOAD_WORKERS_SYNC && read_ahead == 0) {
        /* The default read-ahead of transforms: the forced controller
         * switched it while the bytes above were checked. */
        npyload_auto_event ev[32];
        int n = npyload_loader_auto_history(L, ev, 32, sizeof *ev, NULL), flips = 0;
        for (int i = 0; i < n; i++)
            flips += ev[i].read_ahead != ev[i].prev_read_ahead;
        CHECK(flips > 0, "the forced controller never switched read-ahead");
    }
    npyload_loader_destroy(L);
    passes++;
}


/* ---- Control calls on several threads (set_epoch, set_state, next,
 * destroy): the rules in npyload.h, "Threads". A larger field, so that
 * building an epoch's order takes long enough for calls to overlap. ---- */
#define BIG_N 200000
#define BIG_B 4096
#define BIG_SEED 11
static char glob_big[512];
static const uint64_t BIG_EPOCHS[] = {5, 7, 9};
#define NBIG_EPOCHS (sizeof BIG_EPOCHS / sizeof BIG_EPOCHS[0])
static int64_t *big_order[NBIG_EPOCHS]; /* npyload_order_indices per epoch */

static npyload_loader *make_big(int backend, int workers, int prefetch, int64_t batch)
{
    npyload_loader *L;
    if (npyload_loader_create(&L) || npyload_loader_add_field(L, "u", glob_big) ||
        npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, backend) ||
        set_counts(L, workers, prefetch) ||
        npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, batch) ||
        npyload_loader_set(L, NPYLOAD_OPT_SEED, BIG_SEED) ||
        npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1) ||
        npyload_loader_set(L, NPYLOAD_OPT_READ_AHEAD, read_ahead) || npyload_loader_start(L)) {
        fprintf(stderr, "setup failed: %s\n", npyload_loader_errmsg(L));
        exit(2);
    }
    return L;
}

static const int64_t *big_expected(uint64_t epoch)
{
    for (size_t i = 0; i < NBIG_EPOCHS; i++)
        if (BIG_EPOCHS[i] == epoch)
            return big_order[i];
    return NULL;
}

/* A batch of the big loader is what npyload_order_indices() gives for the
 * epoch it reports, at its position, with the bytes of those samples. */
static int big_batch_ok(npyload_batch *b, int64_t batch, char *why, size_t len)
{
    uint64_t e = npyload_batch_epoch(b);
    int64_t seq = npyload_batch_seq(b);
    const int64_t *want = big_expected(e);
    if (!want) {
        snprintf(why, len, "batch of epoch %llu, never asked for", (unsigned long long)e);
        return 0;
    }
    const int64_t *idx = npyload_batch_indices(b);
    const uint8_t *u = npyload_batch_field(b, 0)->data;
    size_t rows = npyload_batch_size(b);
    int64_t lo = seq * batch;
    size_t exp_rows = (size_t)(BIG_N - lo < batch ? BIG_N - lo : batch);
    if (lo < 0 || lo >= BIG_N || rows != exp_rows) {
        snprintf(why, len, "epoch %llu batch %lld: %zu rows", (unsigned long long)e,
                 (long long)seq, rows);
        return 0;
    }
    for (size_t r = 0; r < rows; r++) {
        if (idx[r] != want[lo + (int64_t)r]) {
            snprintf(why, len, "epoch %llu batch %lld row %zu: sample %lld, the epoch's "
                     "order has %lld", (unsigned long long)e, (long long)seq, r,
                     (long long)idx[r], (long long)want[lo + (int64_t)r]);
            return 0;
        }
        if (u[r] != tu_byte(3, (uint64_t)idx[r], 0)) {
            snprintf(why, len, "epoch %llu batch %lld row %zu: bytes differ",
                     (unsigned long long)e, (long long)seq, r);
            return 0;
        }
    }
    return 1;
}

/* Drains the rest of the epoch and checks it continues get_state's position
 * in the order of get_state's epoch. */
static void drain_matches_state(npyload_loader *L, const char *what)
{
    npyload_state st;
    CHECK(npyload_loader_get_state(L, &st) == 0, "%s: get_state", what);
    const int64_t *want = big_expected(st.epoch);
    CHECK(want, "%s: get_state reports epoch %llu", what, (unsigned long long)st.epoch);
    int64_t pos = (int64_t)st.consumed;
    npyload_batch *b;
    int rc;
    char why[256];
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        int ok = big_batch_ok(b, BIG_B, why, sizeof why);
        uint64_t e = npyload_batch_epoch(b);
        int64_t seq = npyload_batch_seq(b);
        size_t rows = npyload_batch_size(b);
        npyload_batch_release(b);
        CHECK(ok, "%s: %s", what, why);
        CHECK(e == st.epoch && seq * BIG_B == pos, "%s: get_state says epoch %llu at %lld, "
              "next() gave epoch %llu batch %lld", what, (unsigned long long)st.epoch,
              (long long)pos, (unsigned long long)e, (long long)seq);
        pos += (int64_t)rows;
    }
    CHECK(rc == NPYLOAD_EOF, "%s: next: %s", what, npyload_loader_errmsg(L));
    CHECK(pos == BIG_N, "%s: the epoch ended at %lld of %d", what, (long long)pos, BIG_N);
}

typedef struct racer {
    npyload_loader *L;
    pthread_barrier_t *go;
    uint64_t epoch;
    int rc;
} racer;

static void *set_epoch_racer(void *arg)
{
    racer *r = arg;
    pthread_barrier_wait(r->go);
    r->rc = npyload_loader_set_epoch(r->L, r->epoch);
    return NULL;
}

/* set_epoch(5) and set_epoch(7) at once: whichever returns last decides, and
 * the loader then delivers exactly that epoch's order (it used to deliver
 * the previous epoch's order while reporting 5 or 7). */
static void concurrent_set_epoch(int backend)
{
    npyload_loader *L = make_big(backend, 2, 4, BIG_B);
    for (int round = 0; round < 12; round++) {
        /* Something else first, with a batch in flight. */
        CHECK(npyload_loader_set_epoch(L, 1000 + (uint64_t)round) == 0, "set_epoch");
        npyload_batch *b;
        CHECK(npyload_loader_next(L, &b) == 0, "next: %s", npyload_loader_errmsg(L));
        npyload_batch_release(b);
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, 2);
        racer r[2] = {{L, &go, 5, -1}, {L, &go, 7, -1}};
        pthread_t t[2];
        for (int i = 0; i < 2; i++)
            pthread_create(&t[i], NULL, set_epoch_racer, &r[i]);
        for (int i = 0; i < 2; i++)
            pthread_join(t[i], NULL);
        pthread_barrier_destroy(&go);
        CHECK(r[0].rc == 0 && r[1].rc == 0, "set_epoch: %d %d", r[0].rc, r[1].rc);
        drain_matches_state(L, "set_epoch(5) || set_epoch(7)");
    }
    npyload_loader_destroy(L);
    passes++;
}

/* A pause between control calls, so that batches (and failures) flow. */
static void pause_us(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* One control thread of a churn: `rounds` set_epoch calls cycling through
 * epochs[0 .. n_epochs), or set_state calls of `st` at the positions
 * st.batch_size * (i % positions), `pause` microseconds apart. */
typedef struct churn {
    npyload_loader *L;
    atomic_int *running;
    int rc;
    int rounds;
    long pause;
    uint64_t epochs[4];
    int n_epochs;
    int estate_ok;       /* set_epoch's NPYLOAD_ESTATE is documented here */
    npyload_state st;
    int positions;
} churn;

static void *churn_set_epoch(void *arg)
{
    churn *c = arg;
    for (int i = 0; i < c->rounds && !c->rc; i++) {
        c->rc = npyload_loader_set_epoch(c->L, c->epochs[i % c->n_epochs]);
        if (c->estate_ok && c->rc == NPYLOAD_ESTATE)
            c->rc = 0;
        if (c->pause)
            pause_us(c->pause);
    }
    atomic_fetch_sub(c->running, 1);
    return NULL;
}

static void *churn_set_state(void *arg)
{
    churn *c = arg;
    for (int i = 0; i < c->rounds && !c->rc; i++) {
        npyload_state st = c->st;
        st.consumed = st.batch_size * (uint64_t)(i % c->positions);
        c->rc = npyload_loader_set_state(c->L, &st);
        if (c->pause)
            pause_us(c->pause);
    }
    atomic_fetch_sub(c->running, 1);
    return NULL;
}

/* A churn state: the shuffled single-rank position (epoch, seed, samples,
 * batch) with its consumed count set per call. */
static npyload_state churn_state(uint64_t epoch, uint64_t seed, uint64_t n, uint64_t batch)
{
    return (npyload_state){.version = NPYLOAD_STATE_VERSION, .seed = seed, .epoch = epoch,
                           .num_samples = n, .batch_size = batch, .world_size = 1,
                           .rank = 0, .shuffle = 1, .drop_last = 0, .base = 0};
}

/* set_state (epoch 9, various positions) vs set_epoch (5, 7) vs next() on
 * the consumer: every batch handed out is the right one for the epoch and
 * position it reports; afterwards the loader continues from get_state. */
static void set_state_set_epoch_next(int backend)
{
    npyload_loader *L = make_big(backend, 3, 4, BIG_B);
    CHECK(npyload_loader_set_epoch(L, 5) == 0, "set_epoch");
    atomic_int running = 2;
    churn ce = {.L = L, .running = &running, .rounds = 60, .epochs = {7, 5}, .n_epochs = 2},
          cs = {.L = L, .running = &running, .rounds = 60, .positions = 7,
                .st = churn_state(9, BIG_SEED, BIG_N, BIG_B)};
    pthread_t te, ts;
    pthread_create(&te, NULL, churn_set_epoch, &ce);
    pthread_create(&ts, NULL, churn_set_state, &cs);
    char why[256];
    int bad = 0, rc = 0;
    while (atomic_load(&running) > 0) {
        npyload_batch *b;
        rc = npyload_loader_next(L, &b);
        if (rc == NPYLOAD_EOF) {
            sched_yield();
            continue;
        }
        if (rc)
            break;
        if (!bad && !big_batch_ok(b, BIG_B, why, sizeof why))
            bad = 1;
        npyload_batch_release(b);
    }
    pthread_join(te, NULL);
    pthread_join(ts, NULL);
    CHECK(rc == 0 || rc == NPYLOAD_EOF, "next: %s", npyload_loader_errmsg(L));
    CHECK(ce.rc == 0 && cs.rc == 0, "set_epoch %d, set_state %d: %s", ce.rc, cs.rc,
          npyload_loader_errmsg(L));
    CHECK(!bad, "during the churn: %s", why);
    drain_matches_state(L, "after set_state || set_epoch || next");
    npyload_loader_destroy(L);
    passes++;
}

/* ---- Workers that fail (reads of one file injected with EIO by the
 * tests' fault store) while set_state and set_epoch churn on two threads,
 * stats and the position's readers (get_state, save_state, pass_batches,
 * num_batches, pass_rule, the message) on a third, and next() on the
 * consumer: every batch handed out is right, every failure names the file,
 * and TSan sees no race (the message has its own lock). ---- */
typedef struct reader_churn {
    npyload_loader *L;
    atomic_int *running;
    int bad;
    char why[256];
} reader_churn;

static void *churn_readers(void *arg)
{
    reader_churn *c = arg;
    while (atomic_load(c->running) > 0 && !c->bad) {
        npyload_stats st;
        npyload_state ps;
        unsigned char buf[512];
        char msg[1024];
        int64_t len = npyload_loader_save_state(c->L, buf, sizeof buf);
        int64_t nb = npyload_loader_pass_batches(c->L), n = npyload_loader_num_batches(c->L);
        if (npyload_loader_get_stats(c->L, &st, sizeof st) || npyload_loader_get_state(c->L, &ps) ||
            len <= 0 || len > (int64_t)sizeof buf || nb < 0 || n < 0 ||
            npyload_loader_pass_rule(c->L) < 0 || npyload_loader_errmsg_copy(c->L, msg, sizeof msg)) {
            c->bad = 1;
            snprintf(c->why, sizeof c->why, "a reader failed (save_state %lld, pass_batches "
                     "%lld, num_batches %lld)", (long long)len, (long long)nb, (long long)n);
        }
        sched_yield();
    }
    return NULL;
}

static void failing_workers_vs_control_calls(int backend)
{
    /* Reads of a_0002.npy (samples 12 .. 28) fail. */
    tu_fault f = {.fail_path = "a_0002.npy", .fail_from = 0, .fail_to = UINT64_MAX,
                  .fail_code = -EIO, .latency_us = 20};
    char ga[600], gb[600];
    snprintf(ga, sizeof ga, "fault://%s", glob_a);
    snprintf(gb, sizeof gb, "fault://%s", glob_b);
    npyload_loader *L;
    if (npyload_loader_create(&L) || npyl_loader_register_store(L, &tu_store_fault, &f) ||
        npyload_loader_add_field(L, "a", ga) || npyload_loader_add_field(L, "b", gb) ||
        npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, backend) ||
        set_counts(L, 3, 4) ||
        npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 8) ||
        npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1) || npyload_loader_start(L)) {
        fprintf(stderr, "setup failed: %s\n", npyload_loader_errmsg(L));
        exit(2);
    }
    atomic_int running = 2;
    churn ce = {.L = L, .running = &running, .rounds = 80, .pause = 2000,
                .epochs = {0, 1, 2}, .n_epochs = 3},
          cs = {.L = L, .running = &running, .rounds = 80, .pause = 3000, .positions = 8,
                .st = churn_state(4, 0, N, 8)};
    reader_churn cr = {.L = L, .running = &running};
    pthread_t te, ts, tr;
    pthread_create(&te, NULL, churn_set_epoch, &ce);
    pthread_create(&ts, NULL, churn_set_state, &cs);
    pthread_create(&tr, NULL, churn_readers, &cr);
    int bad = 0, errors = 0, batches = 0;
    char why[1100] = "";
    while (atomic_load(&running) > 0) {
        npyload_batch *b;
        int rc = npyload_loader_next(L, &b);
        if (rc == 0) {
            batches++;
            if (!batch_ok(b) && !bad) {
                bad = 1;
                snprintf(why, sizeof why, "wrong bytes in a batch");
            }
            npyload_batch_release(b);
            continue;
        }
        if (rc != NPYLOAD_EOF) {
            char msg[1024];
            npyload_loader_errmsg_copy(L, msg, sizeof msg);
            errors++;
            /* "" when a set_epoch / set_state on another thread cleared it
             * meanwhile (each call leaves the loader's message as it ends);
             * else the failure, naming the file. */
            if (!bad && rc == -EIO && msg[0] && !strstr(msg, "a_0002.npy: injected failure")) {
                bad = 1;
                snprintf(why, sizeof why, "a failed read's message: %s", msg);
            }
        }
        sched_yield();
    }
    pthread_join(te, NULL);
    pthread_join(ts, NULL);
    pthread_join(tr, NULL);
    CHECK(ce.rc == 0 && cs.rc == 0, "set_epoch %d, set_state %d: %s", ce.rc, cs.rc,
          npyload_loader_errmsg(L));
    CHECK(!cr.bad, "%s", cr.why);
    CHECK(!bad, "%s", why);
    CHECK(atomic_load(&f.failures) > 0 && errors > 0 && batches > 0,
          "the churn saw %d batches and %d failures (%llu injected)", batches, errors,
          (unsigned long long)atomic_load(&f.failures));
    npyload_loader_destroy(L);
    passes++;
}

/* ---- A mixture (two sources: files a/b_0000-0001 and a/b_0002-0005)
 * while set_weights, load_state and set_epoch churn on three threads and
 * stats, the digest, source_samples and save_state are read on a fourth,
 * next() on the consumer: every row's bytes are its source's sample's,
 * TSan sees no race on the digest's lock or the mixture rows copied under
 * the ring's lock, and afterwards the counts agree: rows handed out =
 * digest rows = the sources' rows summed. ---- */
#define MIX_OFF1 12 /* source 1's first global sample (9 + 3) */

static int mix_batch_ok(npyload_batch *b)
{
    const int64_t *idx = npyload_batch_indices(b);
    const uint32_t *src = npyload_batch_sources(b);
    const uint8_t *a = npyload_batch_field(b, 0)->data, *c = npyload_batch_field(b, 1)->data;
    if (!idx || !src)
        return 0;
    for (size_t r = 0; r < npyload_batch_size(b); r++) {
        if (src[r] > 1 || idx[r] < 0 || idx[r] >= (src[r] ? N - MIX_OFF1 : MIX_OFF1))
            return 0;
        if (!row_ok(a, c, r, (uint64_t)(idx[r] + (src[r] ? MIX_OFF1 : 0))))
            return 0;
    }
    return 1;
}

static npyload_loader *make_mix(int backend, int workers)
{
    npyload_loader *L;
    if (npyload_loader_create(&L)) {
        fprintf(stderr, "create failed\n");
        exit(2);
    }
    for (int k = 0; k < 2; k++) {
        char name[8];
        snprintf(name, sizeof name, "s%d", k);
        if (npyload_loader_add_source(L, name))
            goto fail;
        for (int f = 0; f < 2; f++) {
            char *paths[NF];
            size_t np = 0;
            for (size_t i = k ? 2 : 0; i < (k ? NF : 2); i++) {
                char nm[32];
                snprintf(nm, sizeof nm, "%c_%04zu.npy", f ? 'b' : 'a', i);
                paths[np++] = tu_path(dir, nm);
            }
            int rc = npyload_loader_add_field_files(L, f ? "b" : "a",
                                                    (const char *const *)paths, np);
            for (size_t i = 0; i < np; i++)
                free(paths[i]);
            if (rc)
                goto fail;
        }
    }
    if (npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, backend) ||
        set_counts(L, workers, 4) || npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 5) ||
        npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1) ||
        npyload_loader_set(L, NPYLOAD_OPT_SAMPLES_PER_EPOCH, 90) ||
        npyload_loader_set(L, NPYLOAD_OPT_READ_AHEAD, read_ahead) || npyload_loader_start(L))
        goto fail;
    return L;
fail:
    fprintf(stderr, "mixture setup failed: %s\n", npyload_loader_errmsg(L));
    exit(2);
}

typedef struct mix_churn {
    npyload_loader *L;
    atomic_int *running;
    const unsigned char *state; /* load_state's bytes */
    size_t state_len;
    int rc, bad;
    char why[256];
} mix_churn;

static void *churn_weights(void *arg)
{
    mix_churn *c = arg;
    static const double w[3][2] = {{1, 1}, {1, 3}, {0.2, 1}};
    for (int i = 0; i < 80 && !c->bad; i++) {
        int rc = npyload_loader_set_weights(c->L, w[i % 3], 2);
        /* ESTATE: a load_state meanwhile restored a position before the
         * weights in force (documented); anything else is wrong. */
        if (rc && rc != NPYLOAD_ESTATE) {
            c->bad = 1;
            snprintf(c->why, sizeof c->why, "set_weights: %d", rc);
        }
        pause_us(1500);
    }
    atomic_fetch_sub(c->running, 1);
    return NULL;
}

static void *churn_load_state(void *arg)
{
    mix_churn *c = arg;
    for (int i = 0; i < 60 && !c->rc; i++) {
        c->rc = npyload_loader_load_state(c->L, c->state, c->state_len);
        pause_us(2500);
    }
    atomic_fetch_sub(c->running, 1);
    return NULL;
}

static void *churn_mix_readers(void *arg)
{
    mix_churn *c = arg;
    while (atomic_load(c->running) > 0 && !c->bad) {
        npyload_stats st;
        unsigned char buf[4096];
        uint64_t d, rows;
        int64_t len = npyload_loader_save_state(c->L, buf, sizeof buf);
        int64_t s0 = npyload_loader_source_samples(c->L, 0),
                s1 = npyload_loader_source_samples(c->L, 1);
        if (npyload_loader_get_stats(c->L, &st, sizeof st) ||
            npyload_loader_digest(c->L, &d, &rows) || len <= 0 || len > (int64_t)sizeof buf ||
            s0 < 0 || s1 < 0) {
            c->bad = 1;
            snprintf(c->why, sizeof c->why, "a reader failed (save_state %lld, source_samples "
                     "%lld %lld)", (long long)len, (long long)s0, (long long)s1);
        }
        (void)d;
        (void)rows; /* load_state meanwhile sets them back: no order to check */
        sched_yield();
    }
    return NULL;
}

static void mixture_vs_control_calls(int backend, int workers)
{
    npyload_loader *L = make_mix(backend, workers);
    /* A state mid-epoch 2, after a change of weights: load_state's bytes. */
    const double w0[2] = {1, 2};
    npyload_batch *b;
    CHECK(npyload_loader_set_epoch(L, 2) == 0, "set_epoch");
    CHECK(npyload_loader_next(L, &b) == 0, "next: %s", npyload_loader_errmsg(L));
    npyload_batch_release(b);
    CHECK(npyload_loader_set_weights(L, w0, 2) == 0, "set_weights: %s", npyload_loader_errmsg(L));
    CHECK(npyload_loader_next(L, &b) == 0, "next: %s", npyload_loader_errmsg(L));
    npyload_batch_release(b);
    static unsigned char state[4096];
    int64_t len = npyload_loader_save_state(L, state, sizeof state);
    CHECK(len > 0 && len <= (int64_t)sizeof state, "save_state: %lld", (long long)len);

    atomic_int running = 3;
    mix_churn cw = {.L = L, .running = &running}, cl = {.L = L, .running = &running,
                    .state = state, .state_len = (size_t)len},
              cr = {.L = L, .running = &running};
    /* An epoch before the weights in force began is refused (documented);
     * load_state brings an earlier start back. */
    churn ce = {.L = L, .running = &running, .rounds = 60, .pause = 2000,
                .epochs = {0, 1, 2, 3}, .n_epochs = 4, .estate_ok = 1};
    pthread_t tw, tl, te, tr;
    pthread_create(&tw, NULL, churn_weights, &cw);
    pthread_create(&tl, NULL, churn_load_state, &cl);
    pthread_create(&te, NULL, churn_set_epoch, &ce);
    pthread_create(&tr, NULL, churn_mix_readers, &cr);
    int bad = 0, batches = 0, rc = 0;
    while (atomic_load(&running) > 0) {
        rc = npyload_loader_next(L, &b);
        if (rc == NPYLOAD_EOF) {
            sched_yield();
            continue;
        }
        if (rc)
            break;
        batches++;
        if (!bad && !mix_batch_ok(b))
            bad = 1;
        npyload_batch_release(b);
    }
    pthread_join(tw, NULL);
    pthread_join(tl, NULL);
    pthread_join(te, NULL);
    pthread_join(tr, NULL);
    CHECK(rc == 0 || rc == NPYLOAD_EOF, "next: %s", npyload_loader_errmsg(L));
    CHECK(!cw.bad && !cr.bad, "%s%s", cw.why, cr.why);
    CHECK(cl.rc == 0 && ce.rc == 0, "load_state %d, set_epoch %d: %s", cl.rc, ce.rc,
          npyload_loader_errmsg(L));
    CHECK(!bad, "a mixture's batch with wrong bytes or sources");
    CHECK(batches > 0, "no batch during the churn");
    /* Quiet now: the rows per source add up to the rows handed out, and
     * the state restored once more gives the stream (digest included) a
     * fresh loader gives from it. */
    npyload_stats st;
    CHECK(npyload_loader_get_stats(L, &st, sizeof st) == 0, "stats");
    int64_t sum = npyload_loader_source_samples(L, 0) + npyload_loader_source_samples(L, 1);
    CHECK((uint64_t)sum == st.samples_delivered, "rows handed out %llu, per source %lld",
          (unsigned long long)st.samples_delivered, (long long)sum);
    npyload_loader *F = make_mix(backend, 2);
    uint64_t d[2], rows[2];
    npyload_loader *both[2] = {L, F};
    for (int i = 0; i < 2; i++) {
        CHECK(npyload_loader_load_state(both[i], state, (size_t)len) == 0, "load_state: %s",
              npyload_loader_errmsg(both[i]));
        while ((rc = npyload_loader_next(both[i], &b)) == 0) {
            CHECK(mix_batch_ok(b), "a batch after the churn");
            npyload_batch_release(b);
        }
        CHECK(rc == NPYLOAD_EOF, "next: %s", npyload_loader_errmsg(both[i]));
        npyload_loader_digest(both[i], &d[i], &rows[i]);
    }
    CHECK(d[0] == d[1] && rows[0] == rows[1],
          "after the churn, the restored state's stream: digest %016llx (%llu rows), a fresh "
          "loader's %016llx (%llu rows)", (unsigned long long)d[0], (unsigned long long)rows[0],
          (unsigned long long)d[1], (unsigned long long)rows[1]);
    npyload_loader_destroy(F);
    npyload_loader_destroy(L);
    passes++;
}

typedef struct sleeper {
    npyload_loader *L;
    int64_t batch; /* the loader's BATCH_SIZE */
    atomic_long tid;
    atomic_int calling, done;
    int rc, ok;
    char why[256];
} sleeper;

static void *next_once(void *arg)
{
    sleeper *s = arg;
    atomic_store(&s->tid, (long)syscall(SYS_gettid));
    npyload_batch *b = NULL;
    atomic_store(&s->calling, 1);
    s->rc = npyload_loader_next(s->L, &b);
    s->ok = 1;
    if (s->rc == 0) {
        s->ok = big_batch_ok(b, s->batch, s->why, sizeof s->why);
        npyload_batch_release(b); /* may run after destroy: allowed */
    }
    atomic_store(&s->done, 1);
    return NULL;
}

/* The state letter of thread `tid` (/proc/self/task/TID/stat), or 0. */
static char thread_state(long tid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}

/* destroy() while another thread waits inside next(): next() returns
 * NPYLOAD_ESTATE (or the batch, if it came first) and destroy returns; it
 * used to free the condition variable next() slept on. One worker reading a
 * shuffled batch of single-byte rows keeps next() waiting. */
static void destroy_wakes_next(int backend)
{
    for (int round = 0; round < 3; round++) {
        npyload_loader *L = make_big(backend, 1, 2, BIG_N / 2);
        /* An epoch whose order big_batch_ok knows, for a batch that comes
         * before the destroy. */
        CHECK(npyload_loader_set_epoch(L, BIG_EPOCHS[0]) == 0, "set_epoch");
        sleeper s = {.L = L, .batch = BIG_N / 2};
        pthread_t t;
        pthread_create(&t, NULL, next_once, &s);
        /* Wait until the thread is inside next() and asleep there (or done). */
        struct timespec ms = {0, 1000000};
        for (int i = 0; i < 20000 && !atomic_load(&s.done); i++) {
            if (atomic_load(&s.calling) && thread_state(atomic_load(&s.tid)) == 'S')
                break;
            nanosleep(&ms, NULL);
        }
        npyload_loader_destroy(L);
        pthread_join(t, NULL);
        CHECK(s.rc == 0 || s.rc == NPYLOAD_ESTATE, "next() during destroy returned %d", s.rc);
        CHECK(s.ok, "next() during destroy: wrong batch: %s", s.why);
    }
    passes++;
}

int main(void)
{
    dir = tu_mkdtemp("stress");
    int64_t sh2[] = {15};
    if (!dir || tu_write_field(dir, "a", 1, "<f4", 4, 2, SHAPE, SIZES, NF, 64) ||
        tu_write_field(dir, "b", 2, "|u1", 1, 1, sh2, SIZES, NF, 16)) {
        fprintf(stderr, "cannot write the dataset\n");
        return 2;
    }
    snprintf(glob_a, sizeof glob_a, "%s/a_*.npy", dir);
    snprintf(glob_b, sizeof glob_b, "%s/b_*.npy", dir);
    int64_t sh1[] = {1}, big[] = {BIG_N};
    if (tu_write_field(dir, "u", 3, "|u1", 1, 1, sh1, big, 1, 64)) {
        fprintf(stderr, "cannot write the dataset\n");
        return 2;
    }
    snprintf(glob_big, sizeof glob_big, "%s/u_*.npy", dir);
    for (size_t i = 0; i < NBIG_EPOCHS; i++) {
        big_order[i] = malloc(BIG_N * sizeof *big_order[i]);
        if (!big_order[i] ||
            npyload_order_indices(BIG_N, 1, BIG_SEED, BIG_EPOCHS[i], 0, 1, 0, BIG_B, NULL, 0,
                                  0, big_order[i], BIG_N) != BIG_N) {
            fprintf(stderr, "npyload_order_indices failed\n");
            return 2;
        }
    }
    int backends[] = {NPYLOAD_IO_AUTO, NPYLOAD_IO_PREAD, NPYLOAD_IO_MMAP};
    for (size_t i = 0; i < 6; i++) {
        read_ahead = i < 3;
        concurrent_set_epoch(backends[i % 3]);
        set_state_set_epoch_next(backends[i % 3]);
        failing_workers_vs_control_calls(backends[i % 3]);
        mixture_vs_control_calls(backends[i % 3], i % 2 ? 3 : NPYLOAD_WORKERS_SYNC);
        destroy_wakes_next(backends[i % 3]);
        epochs_out_of_order_release(backends[i % 3]);
        set_epoch_in_flight(backends[i % 3]);
        destroy_mid_epoch_release_elsewhere(backends[i % 3]);
        stats_while_running(backends[i % 3]);
        transforms_under_load(backends[i % 3], 3);
        transforms_under_load(backends[i % 3], NPYLOAD_WORKERS_SYNC);
    }
    /* The same with the controller changing the counts after every batch. */
    forced_auto = 1;
    for (size_t i = 0; i < 3; i += 2) {
        concurrent_set_epoch(backends[i]);
        set_state_set_epoch_next(backends[i]);
        failing_workers_vs_control_calls(backends[i]);
        mixture_vs_control_calls(backends[i], 3);
        destroy_wakes_next(backends[i]);
        epochs_out_of_order_release(backends[i]);
        set_epoch_in_flight(backends[i]);
        destroy_mid_epoch_release_elsewhere(backends[i]);
        stats_while_running(backends[i]);
        transforms_under_load(backends[i], 3);
    }
    for (size_t i = 0; i < NBIG_EPOCHS; i++)
        free(big_order[i]);
    tu_rmtree(dir);
    printf("%d passed, %d failed\n", passes, failures);
    return failures ? 1 : 0;
}
