/* lib/store: batches through the storage interface, byte for byte, for
 * every io backend of the local store (pread, io_uring, mmap), .npy and
 * .npy.zst, the remote store over the tests' HTTP server, and a field that
 * mixes local files and remote objects; a round over two stores has every
 * request in flight before any is waited for; and the test-only fault
 * store (tests/tu_store_fault.c, joined by one registration line) injects
 * latency, short reads and errors. The truth is independent of the loader:
 * every byte of every sample is tu_byte(field, sample, byte) (the .npy
 * files are written by tests/testutil.c, then packed), and every epoch must
 * deliver each sample exactly once. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "npyload.h"
#include "loader/npyload_loader_internal.h"
#include "testutil.h"
#include "tu_http.h"
#include "tu_store_fault.h"

static const int64_t SIZES[] = {6, 9, 4, 7};
#define NF (sizeof SIZES / sizeof SIZES[0])
#define N_TOTAL 26
static const int64_t A_SHAPE[] = {3, 5}; /* <f4: 60 bytes a sample */
static const int64_t B_SHAPE[] = {11};   /* |u1: 11 bytes a sample */
#define A_BYTES 60
#define B_BYTES 11

typedef struct site {
    char *dir;
    tu_http *h;
    char a[NF][512], b[NF][512]; /* the files' local paths (.npy or .npy.zst) */
    char an[NF][64], bn[NF][64]; /* their names under dir */
} site;

static void pack(const char *npy, uint64_t frame_size)
{
    npyload_pack_options o = {.frame_size = frame_size, .threads = 1};
    char err[512];
    cr_assert_eq(npyload_pack_file(npy, NULL, &o, sizeof o, NULL, 0, err, sizeof err), 0,
                 "pack %s: %s", npy, err);
}

static void site_up(site *s, int packed, int http)
{
    memset(s, 0, sizeof *s);
    s->dir = tu_mkdtemp("store");
    cr_assert_not_null(s->dir);
    cr_assert_eq(tu_write_field(s->dir, "a", 1, "<f4", 4, 2, A_SHAPE, SIZES, NF, 64), 0);
    cr_assert_eq(tu_write_field(s->dir, "b", 2, "|u1", 1, 1, B_SHAPE, SIZES, NF, 16), 0);
    for (size_t k = 0; k < NF; k++) {
        snprintf(s->an[k], sizeof s->an[k], "a_%04zu.npy%s", k, packed ? ".zst" : "");
        snprintf(s->bn[k], sizeof s->bn[k], "b_%04zu.npy%s", k, packed ? ".zst" : "");
        snprintf(s->a[k], sizeof s->a[k], "%s/%s", s->dir, s->an[k]);
        snprintf(s->b[k], sizeof s->b[k], "%s/%s", s->dir, s->bn[k]);
        if (packed) {
            char npy[512];
            snprintf(npy, sizeof npy, "%s/a_%04zu.npy", s->dir, k);
            pack(npy, 150); /* frames of 2 samples: rows picked from a frame */
            snprintf(npy, sizeof npy, "%s/b_%04zu.npy", s->dir, k);
            pack(npy, 1);   /* a sample a frame: decoded straight into place */
        }
    }
    if (http)
        cr_assert_eq(tu_http_start(&s->h, s->dir), 0);
}

static void site_down(site *s)
{
    if (s->h)
        tu_http_stop(s->h);
    tu_rmtree(s->dir);
}

/* Where file k of field f is read from: 'l' local path, 'r' http URL,
 * 'f' fault://local path. */
static void path_of(const site *s, int field, size_t k, char where, char *out, size_t len)
{
    const char *local = field ? s->b[k] : s->a[k];
    const char *name = field ? s->bn[k] : s->an[k];
    if (where == 'r')
        snprintf(out, len, "http://127.0.0.1:%d/%s", tu_http_port(s->h), name);
    else if (where == 'f')
        snprintf(out, len, "fault://%s", local);
    else
        snprintf(out, len, "%s", local);
}

typedef struct cfg {
    int backend, workers, shuffle, on_error;
    int64_t batch;
    const char *where;    /* per file: 'l', 'r' or 'f' (NULL: all local) */
    tu_fault *fault;      /* registered when given */
} cfg;

static npyload_loader *open_loader(const site *s, const cfg *c)
{
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    if (c->fault)
        cr_assert_eq(npyl_loader_register_store(L, &tu_store_fault, c->fault), 0, "%s",
                     npyload_loader_errmsg(L)); /* the one registration line */
    for (int field = 0; field < 2; field++) {
        char buf[NF][600];
        const char *list[NF];
        for (size_t k = 0; k < NF; k++) {
            path_of(s, field, k, c->where ? c->where[k] : 'l', buf[k], sizeof buf[k]);
            list[k] = buf[k];
        }
        cr_assert_eq(npyload_loader_add_field_files(L, field ? "b" : "a", list, NF), 0, "%s",
                     npyload_loader_errmsg(L));
    }
    npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, c->batch ? c->batch : 5);
    npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, c->workers ? c->workers : 2);
    npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, c->backend);
    npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, c->shuffle);
    npyload_loader_set(L, NPYLOAD_OPT_SEED, 17);
    npyload_loader_set(L, NPYLOAD_OPT_ON_ERROR, c->on_error);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    return L;
}

/* Every row of b equal to tu_byte's bytes of its sample; marks it seen. */
static void check_batch(npyload_batch *b, int *seen)
{
    const int64_t *idx = npyload_batch_indices(b);
    const npyload_array *fa = npyload_batch_field(b, 0), *fb = npyload_batch_field(b, 1);
    for (size_t r = 0; r < npyload_batch_size(b); r++) {
        int64_t s = idx[r];
        cr_assert(s >= 0 && s < N_TOTAL);
        seen[s]++;
        const uint8_t *ra = (const uint8_t *)fa->data + r * A_BYTES;
        const uint8_t *rb = (const uint8_t *)fb->data + r * B_BYTES;
        for (uint64_t i = 0; i < A_BYTES; i++)
            cr_assert_eq(ra[i], tu_byte(1, (uint64_t)s, i), "a: sample %lld byte %llu",
                         (long long)s, (unsigned long long)i);
        for (uint64_t i = 0; i < B_BYTES; i++)
            cr_assert_eq(rb[i], tu_byte(2, (uint64_t)s, i), "b: sample %lld byte %llu",
                         (long long)s, (unsigned long long)i);
    }
}

/* Two epochs, each delivering every sample once, byte for byte. */
static void two_epochs(npyload_loader *L)
{
    for (uint64_t e = 0; e < 2; e++) {
        cr_assert_eq(npyload_loader_set_epoch(L, e), 0);
        int seen[N_TOTAL] = {0};
        npyload_batch *b;
        int rc;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            check_batch(b, seen);
            npyload_batch_release(b);
        }
        cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
        for (int s = 0; s < N_TOTAL; s++)
            cr_assert_eq(seen[s], 1, "epoch %llu: sample %d delivered %d times",
                         (unsigned long long)e, s, seen[s]);
    }
}

static int uring_usable(void)
{
    char why[256];
    return npyl_stores_auto_backend(why, sizeof why) == NPYLOAD_IO_URING;
}

Test(store, local_batches_byte_exact_every_backend_npy_and_zst)
{
    const int backends[] = {NPYLOAD_IO_PREAD, NPYLOAD_IO_URING, NPYLOAD_IO_MMAP};
    for (int packed = 0; packed <= 1; packed++) {
        site s;
        site_up(&s, packed, 0);
        for (size_t i = 0; i < 3; i++) {
            if (backends[i] == NPYLOAD_IO_URING && !uring_usable()) {
                cr_log_warn("SKIP io_uring: refused here");
                continue;
            }
            cfg c = {.backend = backends[i], .shuffle = NPYLOAD_SHUFFLE_FULL};
            npyload_loader *L = open_loader(&s, &c);
            two_epochs(L);
            npyload_loader_destroy(L);
        }
        site_down(&s);
    }
}

#ifdef NPYLOAD_HAVE_REMOTE
Test(store, remote_batches_byte_exact_npy_and_zst)
{
    for (int packed = 0; packed <= 1; packed++) {
        site s;
        site_up(&s, packed, 1);
        cfg c = {.shuffle = NPYLOAD_SHUFFLE_FULL, .where = "rrrr"};
        npyload_loader *L = open_loader(&s, &c);
        two_epochs(L);
        npyload_stats st;
        cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
        cr_assert_gt(st.remote_requests, 0, "the remote store answered the reads");
        npyload_loader_destroy(L);
        site_down(&s);
    }
}

Test(store, a_field_mixing_local_and_remote_files_byte_exact)
{
    const int backends[] = {NPYLOAD_IO_PREAD, NPYLOAD_IO_MMAP};
    for (int packed = 0; packed <= 1; packed++) {
        site s;
        site_up(&s, packed, 1);
        for (size_t i = 0; i < 2; i++) {
            for (int workers = -1; workers <= 2; workers += 3) {
                cfg c = {.backend = backends[i], .workers = workers,
                         .shuffle = NPYLOAD_SHUFFLE_FULL, .where = "lrlr"};
                npyload_loader *L = open_loader(&s, &c);
                two_epochs(L);
                npyload_loader_destroy(L);
            }
        }
        site_down(&s);
    }
}

/* The fault store reads inside complete, as the local store does; while it
 * does, the round's remote GETs must be in flight: its complete waits
 * (bounded) for the HTTP server to hold a request of the round, the
 * server's answers being held until then. Were the remote part submitted
 * only after the other part completed (the old split), no GET would be
 * there to see; were it completed first, its answer would come only after
 * the server's 5 s hold, and none would be held any more. */
typedef struct inflight {
    tu_http *h;
    int rounds, seen;     /* completes, and those that saw a GET held */
} inflight;

static void wait_for_get(void *arg)
{
    inflight *w = arg;
    w->rounds++;
    for (int i = 0; i < 5000 && !w->seen; i++) { /* up to 5 s; a GET arrives in ms */
        if (tu_http_held(w->h) > 0)
            w->seen++;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    tu_http_hold(w->h, 0);
}

Test(store, a_round_over_two_stores_has_every_request_in_flight_at_once)
{
    site s;
    site_up(&s, 0, 1);
    inflight w = {.h = s.h};
    tu_fault f = {.on_complete = wait_for_get, .arg = &w};
    /* Field a: files 0 and 2 through the fault store (read inside complete,
     * as local files are), 1 and 3 remote; field b all local. One batch of
     * every sample, read on the calling thread: one round. */
    cfg c = {.workers = NPYLOAD_WORKERS_SYNC, .batch = N_TOTAL, .where = "frfr",
             .fault = &f};
    npyload_loader *L = open_loader(&s, &c);
    tu_http_hold(s.h, 1); /* after start's probes */
    int seen[N_TOTAL] = {0};
    npyload_batch *b;
    cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
    check_batch(b, seen);
    npyload_batch_release(b);
    cr_assert_eq(w.rounds, 1, "one round over the fault store");
    cr_assert_eq(w.seen, 1, "no remote GET was in flight while the other store read");
    npyload_loader_destroy(L);
    site_down(&s);
}
#endif

Test(store, fault_store_latency_and_short_reads_deliver_the_same_bytes)
{
    for (int packed = 0; packed <= 1; packed++) {
        site s;
        site_up(&s, packed, 0);
        tu_fault f = {.latency_us = 200, .short_max = 37};
        cfg c = {.shuffle = NPYLOAD_SHUFFLE_FULL, .where = "ffff", .fault = &f};
        npyload_loader *L = open_loader(&s, &c);
        two_epochs(L);
        cr_assert_gt(atomic_load(&f.shorts), 0, "short reads were injected");
        cr_assert_gt(atomic_load(&f.completes), atomic_load(&f.shorts) / 64,
                     "the rest of each short read was asked again");
        npyload_loader_destroy(L);
        site_down(&s);
    }
}

Test(store, fault_store_errors_raise_naming_the_file_or_are_skipped)
{
    site s;
    site_up(&s, 0, 0);
    /* Reads of a_0001.npy fail; it holds samples 6 .. 14. */
    tu_fault f = {.fail_path = "a_0001.npy", .fail_from = 0, .fail_to = UINT64_MAX,
                  .fail_code = -EIO};
    cfg c = {.where = "ffff", .fault = &f, .batch = 4};
    npyload_loader *L = open_loader(&s, &c);
    npyload_batch *b;
    int rc;
    while ((rc = npyload_loader_next(L, &b)) == 0)
        npyload_batch_release(b);
    cr_assert_eq(rc, -EIO, "%d: %s", rc, npyload_loader_errmsg(L));
    cr_assert(strstr(npyload_loader_errmsg(L), "fault://"), "%s", npyload_loader_errmsg(L));
    cr_assert(strstr(npyload_loader_errmsg(L), "a_0001.npy: injected failure"), "%s",
              npyload_loader_errmsg(L));
    npyload_loader_destroy(L);

    c.on_error = 1;
    L = open_loader(&s, &c);
    int seen[N_TOTAL] = {0};
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        check_batch(b, seen);
        npyload_batch_release(b);
    }
    cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
    for (int k = 0; k < N_TOTAL; k++)
        cr_assert_eq(seen[k], k >= 6 && k < 15 ? 0 : 1, "sample %d seen %d times", k, seen[k]);
    npyload_stats st;
    cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
    cr_assert_eq(st.samples_skipped, 9, "%llu", (unsigned long long)st.samples_skipped);
    char last[1024];
    cr_assert_eq(npyload_loader_last_skip_error(L, last, sizeof last), 0);
    cr_assert(strstr(last, "a_0001.npy: injected failure"), "%s", last);
    npyload_loader_destroy(L);
    site_down(&s);
}

Test(store, registering_a_store_after_a_field_is_refused)
{
    site s;
    site_up(&s, 0, 0);
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "a", s.a[0]), 0, "%s", npyload_loader_errmsg(L));
    tu_fault f = {0};
    cr_assert_eq(npyl_loader_register_store(L, &tu_store_fault, &f), NPYLOAD_ESTATE);
    npyload_loader_destroy(L);
    site_down(&s);
}
