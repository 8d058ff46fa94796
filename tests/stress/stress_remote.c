/* Concurrency stress of remote shards, without Criterion (the TSan build
 * runs it: ctest -R '^stress_'): http:// lists served by the tests' own
 * server (tests/tu_http.c), several loaders at once, each with workers
 * and read-ahead threads (a curl multi handle each), sharing one block
 * cache directory with a small bound (concurrent fills, renames and
 * evictions), injected 503s and closed connections (retries), set_epoch
 * while transfers are in flight, destroy mid-epoch; concurrent misses of
 * one block waiting for one fetch (cold cached epochs with one block per
 * object and many reading threads: every block fetched once; a fetch that
 * fails without retries fails its waiters too, never hangs them); one fetch
 * per block per node (loaders with caches of their own over one directory,
 * as processes of a node are, and a bulk fill running beside them, then
 * stopped mid-run: every block fetched once in all). Every delivered byte
 * is checked against tu_byte(). Prints "N passed, N failed". */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#include "npyload.h"
#include "testutil.h"
#include "tu_http.h"

static int failures, passes;
#define CHECK(cond, ...) TU_STRESS_CHECK(failures, cond, __VA_ARGS__)

static const int64_t SIZES[] = {9, 3, 17, 1, 22, 12};
#define NF (sizeof SIZES / sizeof SIZES[0])
#define N 64
static const int64_t SHAPE[] = {5, 3};
static char *dir, *cache;
static char *urls_a[NF], *urls_b[NF];

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int batch_ok(npyload_batch *b)
{
    const int64_t *idx = npyload_batch_indices(b);
    const uint8_t *a = npyload_batch_field(b, 0)->data, *c = npyload_batch_field(b, 1)->data;
    for (size_t r = 0; r < npyload_batch_size(b); r++) {
        for (size_t i = 0; i < 60; i++)
            if (a[r * 60 + i] != tu_byte(1, (uint64_t)idx[r], i))
                return 0;
        for (size_t i = 0; i < 15; i++)
            if (c[r * 15 + i] != tu_byte(2, (uint64_t)idx[r], i))
                return 0;
    }
    return 1;
}

/* cached: 0 none; 1 the shared small cache (evictions all the time); 2
 * the directory `dedup_dir`, one block per object, no retry. */
static const char *dedup_dir;

static npyload_loader *make(int workers, int prefetch, int64_t batch, int cached)
{
    npyload_loader *L;
    npyload_remote r;
    memset(&r, 0, sizeof r);
    r.retry_base_ms = 1;
    r.retries = 20;
    r.timeout_ms = 20000;
    r.max_inflight = 3;
    if (cached == 1) {
        r.cache_dir = cache;
        r.cache_block = 4096;
        r.cache_bytes = 3 * 4096; /* evictions all the time */
    } else if (cached == 2) {
        r.cache_dir = dedup_dir;
        r.cache_block = 1 << 20;
        r.retries = -1;
    } else if (cached == 3) {
        r.cache_dir = dedup_dir;
        r.cache_block = 4096;
    }
    if (npyload_loader_create(&L) || npyload_loader_set_remote(L, &r, sizeof r) ||
        npyload_loader_add_field_files(L, "a", (const char *const *)urls_a, NF) ||
        npyload_loader_add_field_files(L, "b", (const char *const *)urls_b, NF) ||
        npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers) ||
        npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, prefetch) ||
        npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, batch) ||
        npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1) || npyload_loader_start(L)) {
        fprintf(stderr, "setup failed: %s\n", npyload_loader_errmsg(L));
        exit(2);
    }
    return L;
}

static void epochs_run(int cached)
{
    npyload_loader *L = make(3, 4, 5, cached);
    for (uint64_t e = 0; e < 3; e++) {
        CHECK(npyload_loader_set_epoch(L, e) == 0, "set_epoch");
        npyload_batch *b;
        int rc, nb = 0;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            CHECK(batch_ok(b), "bytes differ (epoch %llu)", (unsigned long long)e);
            npyload_batch_release(b);
            nb++;
        }
        CHECK(rc == NPYLOAD_EOF, "next: %s", npyload_loader_errmsg(L));
        CHECK(nb == npyload_loader_num_batches(L), "batches %d", nb);
    }
    npyload_stats st;
    npyload_loader_get_stats(L, &st, sizeof st);
    CHECK(st.remote_requests > 0, "no request counted");
    npyload_loader_destroy(L);
}

static void *epochs(void *arg)
{
    epochs_run((int)(intptr_t)arg);
    return NULL;
}

static void concurrent_loaders_shared_cache(tu_http *h)
{
    pthread_t t[3];
    tu_http_faults(h, 4, 3);
    for (int i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, epochs, (void *)(intptr_t)(i != 2));
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    passes++;
}

static void set_epoch_and_destroy_in_flight(void)
{
    for (int round = 0; round < 6; round++) {
        npyload_loader *L = make(2, 6, 1, round & 1);
        npyload_batch *b;
        for (uint64_t e = 0; e < 4; e++) {
            CHECK(npyload_loader_set_epoch(L, e) == 0, "set_epoch");
            for (uint64_t k = 0; k < (e + (uint64_t)round) % 3; k++) {
                CHECK(npyload_loader_next(L, &b) == 0, "next: %s", npyload_loader_errmsg(L));
                CHECK(batch_ok(b), "bytes differ");
                npyload_batch_release(b);
            }
        }
        CHECK(npyload_loader_next(L, &b) == 0, "next");
        npyload_loader_destroy(L); /* a batch held, transfers in flight */
        npyload_batch_release(b);
    }
    passes++;
}

/* Cold cached epochs, every object one block, 4 workers with read-ahead
 * and one-sample batches: each block is fetched once (the misses at most
 * the blocks); then with 503s and no retries: the owner's failure reaches
 * the threads waiting for its block (an error naming the URL), no hang. */
static void concurrent_misses_wait_for_one_fetch(tu_http *h)
{
    for (int round = 0; round < 8; round++) {
        char sub[64];
        snprintf(sub, sizeof sub, "dedup%d", round);
        char *d = tu_path(dir, sub);
        dedup_dir = d;
        int faults = round >= 5;
        npyload_loader *L = make(4, 16, 1, 2);
        if (faults)
            tu_http_faults(h, 3, 0);
        npyload_batch *b;
        int rc, nb = 0;
        CHECK(npyload_loader_set_epoch(L, (uint64_t)round) == 0, "set_epoch");
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            CHECK(batch_ok(b), "bytes differ (round %d)", round);
            npyload_batch_release(b);
            nb++;
        }
        if (faults) {
            CHECK(rc == NPYLOAD_EOF || strstr(npyload_loader_errmsg(L), "http://"),
                  "round %d: %d %s", round, rc, npyload_loader_errmsg(L));
        } else {
            CHECK(rc == NPYLOAD_EOF, "next: %s", npyload_loader_errmsg(L));
            npyload_stats st;
            npyload_loader_get_stats(L, &st, sizeof st);
            CHECK(st.cache_misses <= 2 * NF, "%llu blocks fetched for %zu",
                  (unsigned long long)st.cache_misses, 2 * NF);
        }
        npyload_loader_destroy(L);
        tu_http_faults(h, 0, 0);
        free(d);
    }
    passes++;
}

/* One directory, three loaders (each its own cache object: they coordinate
 * through the node's fetch locks, as processes do) and a bulk fill, all
 * cold at once: each block is fetched once in all (misses + the fills'
 * fetches = the blocks: the prefetch's and the loaders' own), whoever came
 * first. Then a fill stopped at once
 * ends with -ECANCELED, and one run to the end finds every block. */
static const char *node_dir;

static void node_epoch_run(uint64_t *misses)
{
    npyload_loader *L = make(2, 4, 3, 3);
    npyload_batch *b;
    int rc;
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        CHECK(batch_ok(b), "bytes differ (node dedup)");
        npyload_batch_release(b);
    }
    CHECK(rc == NPYLOAD_EOF, "next: %s", npyload_loader_errmsg(L));
    npyload_stats st;
    /* The loader's own background fill (on by default: the cache holds the
     * dataset) fetches too: counted once it is over. */
    for (int i = 0; i < 10000; i++) {
        npyload_loader_get_stats(L, &st, sizeof st);
        if (st.fill_state != NPYLOAD_FILL_RUNNING)
            break;
        usleep(1000);
    }
    *misses = st.cache_misses + st.fill_fetched_blocks;
    npyload_loader_destroy(L);
}

static void *node_epoch(void *arg)
{
    node_epoch_run(arg);
    return NULL;
}

static npyload_prefetch *node_fill(void)
{
    npyload_remote r;
    memset(&r, 0, sizeof r);
    r.cache_dir = node_dir;
    r.cache_block = 4096;
    r.retry_base_ms = 1;
    r.retries = 20;
    npyload_prefetch *P;
    char err[512];
    if (npyload_prefetch_create(&P, &r, sizeof r, err, sizeof err) ||
        npyload_prefetch_add_field_files(P, (const char *const *)urls_a, NF) ||
        npyload_prefetch_add_field_files(P, (const char *const *)urls_b, NF) ||
        npyload_prefetch_set(P, NPYLOAD_PREFETCH_INFLIGHT, 8) || /* 2 threads */
        npyload_prefetch_set(P, NPYLOAD_PREFETCH_REQUEST_BYTES, 8192)) {
        fprintf(stderr, "prefetch setup failed\n");
        exit(2);
    }
    return P;
}

static void node_fill_check(npyload_prefetch *P)
{
    CHECK(npyload_prefetch_run(P) == 0, "prefetch: %s", npyload_prefetch_errmsg(P));
}

static void *node_fill_run(void *arg)
{
    node_fill_check(arg);
    return NULL;
}

/* Cache blocks of `bs` bytes of every object of both fields. */
static uint64_t count_blocks(uint64_t bs)
{
    uint64_t blocks = 0;
    for (size_t k = 0; k < NF; k++)
        for (int f = 0; f < 2; f++) {
            char name[64];
            snprintf(name, sizeof name, "%s_%04zu.npy", f ? "b" : "a", k);
            char *p = tu_path(dir, name);
            struct stat st;
            if (stat(p, &st) == 0)
                blocks += ((uint64_t)st.st_size + bs - 1) / bs;
            free(p);
        }
    return blocks;
}

static void one_fetch_per_block_per_node(tu_http *h)
{
    for (int round = 0; round < 4; round++) {
        char sub[64];
        snprintf(sub, sizeof sub, "node%d", round);
        char *d = tu_path(dir, sub);
        node_dir = dedup_dir = d;
        uint64_t blocks = count_blocks(4096);
        npyload_prefetch *P = node_fill();
        pthread_t t[3], f;
        uint64_t misses[3] = {0, 0, 0};
        if (round & 1)
            tu_http_faults(h, 2, 1);
        pthread_create(&f, NULL, node_fill_run, P);
        for (int i = 0; i < 3; i++)
            pthread_create(&t[i], NULL, node_epoch, &misses[i]);
        npyload_prefetch_progress pg;
        for (int spin = 0; spin < 3; spin++) /* progress read while it runs */
            CHECK(npyload_prefetch_get_progress(P, &pg, sizeof pg) == 0, "progress");
        for (int i = 0; i < 3; i++)
            pthread_join(t[i], NULL);
        pthread_join(f, NULL);
        CHECK(npyload_prefetch_get_progress(P, &pg, sizeof pg) == 0 &&
                  pg.phase == NPYLOAD_PREFETCH_DONE && pg.cached_bytes == pg.planned_bytes,
              "fill: %llu of %llu", (unsigned long long)pg.cached_bytes,
              (unsigned long long)pg.planned_bytes);
        uint64_t fetched = misses[0] + misses[1] + misses[2] + pg.fetched_blocks;
        CHECK(fetched == blocks, "round %d: %llu fetches for %llu blocks (loaders %llu %llu "
              "%llu, fill %llu)", round, (unsigned long long)fetched,
              (unsigned long long)blocks, (unsigned long long)misses[0],
              (unsigned long long)misses[1], (unsigned long long)misses[2],
              (unsigned long long)pg.fetched_blocks);
        npyload_prefetch_destroy(P);
        /* A stop before the run: -ECANCELED at once, nothing fetched. */
        P = node_fill();
        npyload_prefetch_stop(P);
        CHECK(npyload_prefetch_run(P) == -ECANCELED, "stopped run: %s",
              npyload_prefetch_errmsg(P));
        CHECK(npyload_prefetch_run(P) == 0, "run after a stop: %s",
              npyload_prefetch_errmsg(P));
        CHECK(npyload_prefetch_get_progress(P, &pg, sizeof pg) == 0 &&
                  pg.found_blocks == blocks && pg.fetched_blocks == 0,
              "warm fill fetched %llu", (unsigned long long)pg.fetched_blocks);
        npyload_prefetch_destroy(P);
        tu_http_faults(h, 0, 0);
        free(d);
    }
    passes++;
}

int main(void)
{
    dir = tu_mkdtemp("stress_remote");
    cache = tu_path(dir, "cache");
    const int64_t sh2[] = {15};
    if (tu_write_field(dir, "a", 1, "<f4", 4, 2, SHAPE, SIZES, NF, 64) ||
        tu_write_field(dir, "b", 2, "|u1", 1, 1, sh2, SIZES, NF, 16)) {
        fprintf(stderr, "cannot write the dataset\n");
        return 2;
    }
    tu_http *h;
    if (tu_http_start(&h, dir) != 0) {
        fprintf(stderr, "cannot start the HTTP server\n");
        return 2;
    }
    for (size_t k = 0; k < NF; k++) {
        char u[512];
        snprintf(u, sizeof u, "http://127.0.0.1:%d/a_%04zu.npy", tu_http_port(h), k);
        urls_a[k] = strdup(u);
        snprintf(u, sizeof u, "http://127.0.0.1:%d/b_%04zu.npy", tu_http_port(h), k);
        urls_b[k] = strdup(u);
    }
    uint64_t t0 = now_ns();
    concurrent_loaders_shared_cache(h);
    uint64_t t1 = now_ns();
    set_epoch_and_destroy_in_flight();
    concurrent_misses_wait_for_one_fetch(h);
    one_fetch_per_block_per_node(h);
    fprintf(stderr, "shared cache %.2f s, set_epoch/destroy %.2f s, %llu requests\n",
            (double)(t1 - t0) / 1e9, (double)(now_ns() - t1) / 1e9,
            (unsigned long long)tu_http_requests(h));
    tu_http_stop(h);
    for (size_t k = 0; k < NF; k++) {
        free(urls_a[k]);
        free(urls_b[k]);
    }
    free(cache);
    tu_rmtree(dir);
    printf("%d passed, %d failed\n", passes, failures);
    return failures ? 1 : 0;
}
