/* The loader's device path under concurrency, on the fake CUDA runtime
 * (tests/gpu/fake_cudart.c), without Criterion so that it runs under
 * ThreadSanitizer (the TSan build runs every ctest named stress_*).
 *
 * The fake queues copies per stream and runs them as late as CUDA may, in
 * whichever thread waits: a staging slot written before its copy ran, or a
 * device slot refilled before the consumer's stream read it, shows as wrong
 * bytes here and as a data race under TSan. Many workers, a consumer whose
 * host never waits (reads on its stream, releases on its stream), epochs
 * abandoned mid-flight, destroy with batches held and released from another
 * thread. Prints "N passed, N failed"; exits non-zero on any failure.
 *
 * With the fake driver too (second argument), the same runs again with a
 * random flip that negates the vectors (hflip with hflip_sign -1): the
 * workers stage each row's record beside the rows, and the kernel runs on
 * the CPU in stream order (tests/gpu/kernels_cpu.cpp), in whichever thread
 * waits, so TSan sees the records' writes against the copies' reads. A
 * build without a fatbin compiles the kernels with NVRTC from NPYLOAD_NVRTC
 * (else the field falls back to the host engine, said in the output).
 * Then once more over narrowed files (npyload-pack --narrow, .npy.zst and
 * the stored form): the codes cross, the kernels expand them through the
 * value tables uploaded at start, so TSan also sees the tables' upload and
 * their reads by kernels run in other threads, up to destroy with batches
 * held.
 *
 * Also the controller in device mode (auto_matches_fixed): NPYLOAD_AUTO
 * workers and prefetch, AUTO_FORCE changing the workers every two batches,
 * two epochs delivering a fixed NUM_WORKERS 2 loader's device bytes and
 * order, each row the .npy file's bytes, the device slots never changed.
 *
 * Usage: stress_device_fake PATH_TO_FAKE_LIBCUDART [PATH_TO_FAKE_LIBCUDA] */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/fake_cuda_driver.h"
#include "gpu/fake_cudart.h"
#include "npyload.h"
#include "testutil.h"

static int failures, passes;
#define CHECK(cond, ...) TU_STRESS_CHECK(failures, cond, __VA_ARGS__)

static int (*stream_create)(void **, unsigned);
static int (*stream_sync)(void *);
static int (*stream_destroy)(void *);
static int (*memcpy_async)(void *, const void *, size_t, int, void *);

static const int64_t SIZES[] = {9, 3, 17, 1, 22, 12};
#define NF (sizeof SIZES / sizeof SIZES[0])
#define ROW 48 /* bytes per sample: (12,) float32 */
static char *dir, glob[512];

static int flip_mode; /* the runs with a flip that negates (kernels) */
static int narrow_mode; /* ... over narrowed files */
static char cache[600];
static char narrowed[NF][600];

/* Element j of sample s in the narrowed files: 200 distinct float32 values
 * (0.0 among them, negated to -0.0). */
static float nval(int64_t s, size_t j)
{
    return (float)((s * 7 + (int64_t)j) % 200) - 50.0f;
}

typedef struct read_back {
    uint8_t *bytes;
    int64_t idx[8];
    uint8_t hf[8];        /* flip_mode: the rows' hflip decisions */
    size_t rows;
} read_back;

/* The file's bytes, each float's sign flipped in the rows hf says. */
static int rows_ok(const uint8_t *p, const int64_t *idx, const uint8_t *hf, size_t rows)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < ROW; i++) {
            uint8_t want = tu_byte(1, (uint64_t)idx[r], i);
            if (narrow_mode) {
                float v = nval(idx[r], i / 4);
                memcpy(&want, (const uint8_t *)&v + i % 4, 1);
            }
            if (p[r * ROW + i] != (want ^ (hf && hf[r] && i % 4 == 3 ? 0x80 : 0)))
                return 0;
        }
    return 1;
}

/* dir/n_K.npy of nval's values, packed narrowed: even K as .npy.zst, odd
 * K in the stored form. */
static int write_narrowed(void)
{
    int64_t first = 0;
    for (size_t k = 0; k < NF; k++) {
        size_t n = (size_t)SIZES[k] * (ROW / 4);
        float *v = malloc(n * sizeof *v);
        if (!v)
            return -1;
        for (size_t i = 0; i < n; i++)
            v[i] = nval(first + (int64_t)(i / (ROW / 4)), i % (ROW / 4));
        char p[560];
        snprintf(p, sizeof p, "%s/n_%zu.npy", dir, k);
        const int64_t shape[2] = {SIZES[k], ROW / 4};
        long w = tu_write_npy(p, "<f4", 0, 2, shape, v, n * sizeof *v, 64);
        free(v);
        npyload_pack_options o = {.frame_size = 100, .threads = 1, .narrow = 1,
                                  .store = (int)(k % 2)};
        char err[512];
        snprintf(narrowed[k], sizeof narrowed[k], "%s/n_%zu.%s", dir, k,
                 k % 2 ? "narrow.npy" : "npy.zst");
        if (w < 0 || npyload_pack_file(p, narrowed[k], &o, sizeof o, NULL, 0, err, sizeof err)) {
            fprintf(stderr, "narrowed file %zu: %s\n", k, w < 0 ? "write failed" : err);
            return -1;
        }
        first += SIZES[k];
    }
    return 0;
}

static void set_flip(npyload_loader *L)
{
    static const float minus = -1.0f;
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    t.hflip = 0.5f;
    t.hflip_sign = &minus;
    t.n_hflip_sign = 1;
    const char *nvrtc = getenv("NPYLOAD_NVRTC");
    if ((nvrtc && nvrtc[0] && npyload_loader_set_path(L, NPYLOAD_PATH_NVRTC, nvrtc)) ||
        npyload_loader_set_path(L, NPYLOAD_PATH_KERNEL_CACHE, cache) ||
        npyload_loader_set_transform(L, "x", &t, sizeof t)) {
        fprintf(stderr, "setup failed: %s\n", npyload_loader_errmsg(L));
        exit(2);
    }
}

static npyload_loader *make(int workers, int prefetch, int64_t batch)
{
    npyload_loader *L;
    const char *nfiles[NF];
    for (size_t k = 0; k < NF; k++)
        nfiles[k] = narrowed[k];
    if (npyload_loader_create(&L) ||
        (narrow_mode ? npyload_loader_add_field_files(L, "x", nfiles, NF)
                     : npyload_loader_add_field(L, "x", glob)) ||
        npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers) ||
        npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, prefetch) ||
        npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, batch) ||
        npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1) ||
        npyload_loader_set(L, NPYLOAD_OPT_DEVICE, 0)) {
        fprintf(stderr, "setup failed: %s\n", npyload_loader_errmsg(L));
        exit(2);
    }
    if (flip_mode)
        set_flip(L);
    if (npyload_loader_start(L)) {
        fprintf(stderr, "start failed: %s\n", npyload_loader_errmsg(L));
        exit(2);
    }
    return L;
}

/* The host never waits for the device: read on the stream, release on it. */
static void consumer_never_waits(int workers, int prefetch, int64_t batch)
{
    npyload_loader *L = make(workers, prefetch, batch);
    void *cs;
    CHECK(stream_create(&cs, 1) == 0, "stream");
    enum { MAXR = 512 };
    read_back *rb = calloc(MAXR, sizeof *rb);
    size_t nr = 0;
    for (uint64_t e = 0; e < 8; e++) {
        CHECK(npyload_loader_set_epoch(L, e) == 0, "set_epoch");
        npyload_batch *b;
        int rc, k = 0;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            CHECK(nr < MAXR, "too many batches");
            read_back *r = &rb[nr++];
            r->rows = npyload_batch_size(b);
            r->bytes = malloc(r->rows * ROW);
            memcpy(r->idx, npyload_batch_indices(b), r->rows * sizeof *r->idx);
            CHECK(npyload_batch_augment(b, 0, r->hf, NULL, NULL, NULL) == 0, "augment");
            CHECK(npyload_batch_wait_stream(b, cs) == 0, "wait_stream");
            CHECK(memcpy_async(r->bytes, npyload_batch_field(b, 0)->data, r->rows * ROW, 2,
                               cs) == 0, "d2h");
            npyload_batch_release_stream(b, cs);
            if (e % 3 == 1 && ++k == 3)
                break; /* abandon the epoch, copies in flight */
        }
        CHECK(rc == 0 || rc == NPYLOAD_EOF, "next: %s", npyload_loader_errmsg(L));
    }
    CHECK(stream_sync(cs) == 0, "sync");
    for (size_t k = 0; k < nr; k++) {
        CHECK(rows_ok(rb[k].bytes, rb[k].idx, flip_mode ? rb[k].hf : NULL, rb[k].rows),
              "read %zu (w=%d p=%d): bytes differ: overwritten before the stream read them",
              k, workers, prefetch);
        free(rb[k].bytes);
    }
    free(rb);
    npyload_loader_destroy(L);
    stream_destroy(cs);
    passes++;
}

typedef struct rel_job {
    npyload_batch *b[4];
    int n;
    void *stream;
} rel_job;

static void *release_elsewhere(void *arg)
{
    rel_job *j = arg;
    for (int i = 0; i < j->n; i++)
        npyload_batch_release_stream(j->b[i], j->stream);
    return NULL;
}

/* Destroy mid-epoch with batches held; another thread releases them. */
static void destroy_with_batches_held(void)
{
    npyload_loader *L = make(4, 4, 5);
    void *cs;
    CHECK(stream_create(&cs, 1) == 0, "stream");
    rel_job j = {.n = 0, .stream = cs};
    npyload_batch *b;
    while (j.n < 3 && npyload_loader_next(L, &b) == 0) {
        npyload_batch_sync(b);
        uint8_t hf[8];
        CHECK(npyload_batch_augment(b, 0, hf, NULL, NULL, NULL) == 0, "augment");
        CHECK(rows_ok(npyload_batch_field(b, 0)->data, npyload_batch_indices(b),
                      flip_mode ? hf : NULL, npyload_batch_size(b)), "bytes differ");
        j.b[j.n++] = b;
    }
    CHECK(j.n == 3, "three batches");
    npyload_loader_destroy(L);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, release_elsewhere, &j) == 0, "thread");
    pthread_join(t, NULL);
    stream_destroy(cs);
    passes++;
}

/* ---- The controller in device mode (issue 37): NPYLOAD_AUTO workers and
 * prefetch, AUTO_FORCE changing the workers every two batches, two epochs,
 * a consumer that reads each batch on the device after its event: the
 * batches are a fixed NUM_WORKERS 2 loader's (order and bytes), every row is
 * the file's bytes at its index (a plain read of the .npy files, not
 * tu_byte), and the controller changed the workers only: the device slots
 * stay at their first count (stats, history, auto_mode). ---- */
#define AUTO_B 3
#define AUTO_EPOCHS 2
#define AUTO_MAXB (AUTO_EPOCHS * 64 / AUTO_B + AUTO_EPOCHS)

typedef struct run_log {
    int64_t idx[AUTO_MAXB][AUTO_B];
    uint8_t bytes[AUTO_MAXB][AUTO_B * ROW];
    size_t rows[AUTO_MAXB], n;
    size_t workers_seen[16], slots_min, slots_max;
} run_log;

/* The files' rows in index order: the data after each .npy preamble (the
 * magic, the version, the header length), read as bytes. */
static uint8_t *rows_of_files(int64_t *n)
{
    int64_t total = 0;
    for (size_t k = 0; k < NF; k++)
        total += SIZES[k];
    uint8_t *all = malloc((size_t)total * ROW), *at = all;
    for (size_t k = 0; k < NF && all; k++) {
        char p[560];
        snprintf(p, sizeof p, "%s/x_%04zu.npy", dir, k);
        size_t len = 0;
        uint8_t *f = tu_read_file(p, &len);
        size_t v1 = f && len > 10 && f[6] == 1, hl = !f || len < 12 ? 0 :
            v1 ? (size_t)f[8] | (size_t)f[9] << 8 : (size_t)f[8] | (size_t)f[9] << 8 |
            (size_t)f[10] << 16 | (size_t)f[11] << 24;
        size_t off = (v1 ? 10 : 12) + hl, want = (size_t)SIZES[k] * ROW;
        if (!f || memcmp(f, "\x93NUMPY", 6) || len != off + want) {
            fprintf(stderr, "%s: not the .npy this test wrote\n", p);
            exit(2);
        }
        memcpy(at, f + off, want);
        at += want;
        free(f);
    }
    *n = total;
    return all;
}

static npyload_loader *make_auto(int64_t workers, int64_t prefetch)
{
    npyload_loader *L;
    if (npyload_loader_create(&L) || npyload_loader_add_field(L, "x", glob) ||
        npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers) ||
        npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, prefetch) ||
        npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, AUTO_B) ||
        npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1) ||
        npyload_loader_set(L, NPYLOAD_OPT_SEED, 23) ||
        npyload_loader_set(L, NPYLOAD_OPT_DEVICE, 0) ||
        (workers == NPYLOAD_AUTO &&
         (npyload_loader_set(L, NPYLOAD_OPT_AUTO_FORCE, 2) ||
          /* Four cores whatever the machine: the forced counts reach 4. */
          npyload_loader_set(L, NPYLOAD_OPT_AUTO_CORES, 4))) ||
        npyload_loader_start(L)) {
        fprintf(stderr, "auto setup failed: %s\n", npyload_loader_errmsg(L));
        exit(2);
    }
    return L;
}

/* stats()' auto_mode and memory_budget in device mode, where the device
 * slots never change (issue 37): the controller's mode is what it may
 * change. Workers auto (prefetch auto or fixed): 1 and a budget; workers
 * fixed, prefetch auto: nothing to change, so no controller (0) and no
 * budget. Before, the plan kept the slots bit and stats masked it: the
 * last case reported a budget for a controller that changes nothing. */
static void auto_mode_in_device_mode(void)
{
    static const struct {
        int64_t workers, prefetch;
        uint64_t mode;
    } cases[] = {
        {NPYLOAD_AUTO, NPYLOAD_AUTO, 1},
        {NPYLOAD_AUTO, 2, 1},
        {2, NPYLOAD_AUTO, 0},
        {2, 2, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        npyload_loader *L = make_auto(cases[i].workers, cases[i].prefetch);
        npyload_stats st;
        CHECK(npyload_loader_get_stats(L, &st, sizeof st) == 0, "stats");
        CHECK(st.auto_mode == cases[i].mode, "workers %lld prefetch %lld in device mode: "
              "auto_mode %llu, expected %llu", (long long)cases[i].workers,
              (long long)cases[i].prefetch, (unsigned long long)st.auto_mode,
              (unsigned long long)cases[i].mode);
        CHECK((st.memory_budget != 0) == (cases[i].mode != 0), "workers %lld prefetch %lld "
              "in device mode: memory_budget %llu with auto_mode %llu",
              (long long)cases[i].workers, (long long)cases[i].prefetch,
              (unsigned long long)st.memory_budget, (unsigned long long)st.auto_mode);
        npyload_loader_destroy(L);
    }
    passes++;
}

/* Two epochs of L into lg: indices, the device bytes (read after the
 * batch's event on the host: the fake's device memory is host memory),
 * the counts seen after each batch. */
static void run_two_epochs(npyload_loader *L, run_log *lg)
{
    lg->slots_min = SIZE_MAX;
    for (uint64_t e = 0; e < AUTO_EPOCHS; e++) {
        CHECK(npyload_loader_set_epoch(L, e) == 0, "set_epoch");
        npyload_batch *b;
        int rc;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            size_t rows = npyload_batch_size(b);
            if (lg->n == AUTO_MAXB || rows > AUTO_B) {
                CHECK(0, "%zu batches, %zu rows: more than two epochs", lg->n, rows);
                npyload_batch_release(b);
                return;
            }
            CHECK(npyload_batch_field(b, 0)->device == 0, "not a device batch");
            npyload_batch_sync(b);
            memcpy(lg->idx[lg->n], npyload_batch_indices(b), rows * sizeof(int64_t));
            memcpy(lg->bytes[lg->n], npyload_batch_field(b, 0)->data, rows * ROW);
            lg->rows[lg->n++] = rows;
            npyload_batch_release(b);
            npyload_stats st;
            CHECK(npyload_loader_get_stats(L, &st, sizeof st) == 0, "stats");
            lg->workers_seen[st.num_workers < 16 ? st.num_workers : 15]++;
            lg->slots_min = st.num_slots < lg->slots_min ? st.num_slots : lg->slots_min;
            lg->slots_max = st.num_slots > lg->slots_max ? st.num_slots : lg->slots_max;
        }
        CHECK(rc == NPYLOAD_EOF, "next: %s", npyload_loader_errmsg(L));
    }
}

static void auto_matches_fixed(void)
{
    int64_t n = 0;
    uint8_t *truth = rows_of_files(&n);
    run_log *fx = calloc(1, sizeof *fx), *au = calloc(1, sizeof *au);
    if (!truth || !fx || !au) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    npyload_loader *L = make_auto(2, 3);
    run_two_epochs(L, fx);
    npyload_loader_destroy(L);
    L = make_auto(NPYLOAD_AUTO, NPYLOAD_AUTO);
    run_two_epochs(L, au);

    CHECK(au->n == fx->n && fx->n > 2 * 64 / AUTO_B, "auto %zu batches, fixed %zu", au->n,
          fx->n);
    size_t seen = 0;
    uint8_t *hit = calloc((size_t)n * AUTO_EPOCHS, 1);
    for (size_t k = 0; k < au->n && k < fx->n; k++) {
        CHECK(au->rows[k] == fx->rows[k] &&
              !memcmp(au->idx[k], fx->idx[k], au->rows[k] * sizeof(int64_t)),
              "batch %zu: auto's indices differ from num_workers=2's", k);
        CHECK(!memcmp(au->bytes[k], fx->bytes[k], au->rows[k] * ROW),
              "batch %zu: auto's device bytes differ from num_workers=2's", k);
        for (size_t r = 0; r < au->rows[k]; r++) {
            int64_t i = au->idx[k][r];
            int ok = i >= 0 && i < n && !memcmp(au->bytes[k] + r * ROW, truth + i * ROW, ROW);
            CHECK(ok, "batch %zu row %zu (sample %lld): not the file's bytes", k, r,
                  (long long)i);
            if (ok)
                hit[(size_t)(seen / (size_t)n) * (size_t)n + (size_t)i]++;
            seen++;
        }
    }
    for (int64_t i = 0; i < n * AUTO_EPOCHS; i++)
        CHECK(hit[i] == 1, "epoch %lld: sample %lld delivered %d times", (long long)(i / n),
              (long long)(i % n), hit[i]);
    free(hit);

    /* The controller changed the workers, never the device slots. */
    size_t kinds = 0;
    for (int i = 0; i < 16; i++)
        kinds += au->workers_seen[i] != 0;
    CHECK(kinds >= 2, "the worker count took %zu value(s) under AUTO_FORCE", kinds);
    CHECK(au->slots_min == au->slots_max, "device slots moved: %zu .. %zu", au->slots_min,
          au->slots_max);
    npyload_stats st;
    CHECK(npyload_loader_get_stats(L, &st, sizeof st) == 0, "stats");
    CHECK(st.auto_mode == 1, "auto_mode %llu in device mode: the controller changes the "
          "workers only (1)", (unsigned long long)st.auto_mode);
    CHECK(st.auto_decisions > 0, "no decision recorded");
    npyload_auto_event ev[32];
    uint64_t total = 0;
    int ne = npyload_loader_auto_history(L, ev, 32, sizeof *ev, &total);
    int forced = 0;
    CHECK(ne > 0 && total >= (uint64_t)ne, "history: %d of %llu", ne,
          (unsigned long long)total);
    for (int i = 0; i < ne; i++) {
        CHECK(ev[i].slots == ev[i].prev_slots && ev[i].slots == ev[0].slots,
              "decision %d (%s) moved the device slots %u -> %u", i,
              npyload_auto_reason_name(ev[i].reason), ev[i].prev_slots, ev[i].slots);
        forced += ev[i].reason == NPYLOAD_AUTO_FORCED && ev[i].workers != ev[i].prev_workers;
    }
    CHECK(forced > 0, "no forced change of the workers in the history");
    printf("auto in device mode: %zu batches as num_workers=2's, the workers took %zu "
           "counts (%llu decisions), the slots stayed %zu\n", au->n, kinds,
           (unsigned long long)total, au->slots_min);
    npyload_loader_destroy(L);
    free(truth);
    free(fx);
    free(au);
    passes++;
}

/* The runs again with the flip, its kernel on the CPU (the fake driver). */
static void run_with_kernels(const char *driver)
{
    void *d = dlopen(driver, RTLD_NOW | RTLD_LOCAL);
    fake_cuda_driver_control_fn ctl =
        d ? (fake_cuda_driver_control_fn)dlsym(d, "fake_cuda_driver_control") : NULL;
    fake_cuda_driver_cpu_kernels_fn cpu =
        d ? (fake_cuda_driver_cpu_kernels_fn)dlsym(d, "fake_cuda_driver_cpu_kernels") : NULL;
    if (!ctl || !cpu || !cpu()) {
        printf("no kernels on the CPU here (%s): the flip runs skipped\n",
               d ? "built without C++" : dlerror());
        return;
    }
    atomic_store(&ctl()->run_kernels, 1);
    snprintf(cache, sizeof cache, "%s/kcache", dir);
    flip_mode = 1;
    npyload_loader *L = make(2, 2, 4);
    char why[1024];
    npyload_loader_field_engine(L, 0, why, sizeof why);
    printf("flip runs: %s\n", why);
    npyload_loader_destroy(L);
    consumer_never_waits(1, 2, 4);
    consumer_never_waits(6, 3, 7);
    destroy_with_batches_held();
    CHECK(atomic_load(&ctl()->n_ran) > 0 || !strstr(why, "device"), "no kernel ran");
    if (write_narrowed())
        exit(2);
    narrow_mode = 1;
    L = make(2, 2, 4);
    npyload_loader_field_engine(L, 0, why, sizeof why);
    printf("narrowed runs: %s\n", why);
    npyload_loader_destroy(L);
    int ran = atomic_load(&ctl()->n_ran);
    consumer_never_waits(1, 2, 4);
    consumer_never_waits(6, 3, 7);
    destroy_with_batches_held();
    CHECK(atomic_load(&ctl()->n_ran) > ran || !strstr(why, "device"), "no kernel ran");
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s PATH_TO_FAKE_LIBCUDART [PATH_TO_FAKE_LIBCUDA]\n", argv[0]);
        return 2;
    }
    /* Loaded first: lib/cuda prefers a runtime the process already has. */
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    *(void **)&stream_create = dlsym(h, "cudaStreamCreateWithFlags");
    *(void **)&stream_sync = dlsym(h, "cudaStreamSynchronize");
    *(void **)&stream_destroy = dlsym(h, "cudaStreamDestroy");
    *(void **)&memcpy_async = dlsym(h, "cudaMemcpyAsync");
    char why[256];
    if (!stream_create || !npyload_cuda_available(0, why, sizeof why)) {
        fprintf(stderr, "the fake runtime is not in use: %s\n", why);
        return 2;
    }
    dir = tu_mkdtemp("stressdev");
    const int64_t shape[1] = {12};
    if (!dir || tu_write_field(dir, "x", 1, "<f4", 4, 1, shape, SIZES, NF, 64)) {
        fprintf(stderr, "cannot write the dataset\n");
        return 2;
    }
    snprintf(glob, sizeof glob, "%s/x_*.npy", dir);
    consumer_never_waits(1, 2, 4);
    consumer_never_waits(3, 4, 3);
    consumer_never_waits(6, 3, 7);
    destroy_with_batches_held();
    auto_matches_fixed();
    auto_mode_in_device_mode();
    if (argc == 3)
        run_with_kernels(argv[2]);
    tu_rmtree(dir);
    printf("%d passed, %d failed\n", passes, failures);
    return failures ? 1 : 0;
}
