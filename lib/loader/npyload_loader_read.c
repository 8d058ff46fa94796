/* The batch reader as a worker sees it: a batch read in one go
 * (npyl_read_batch), or with read-ahead in three steps whose first round
 * runs on the worker's read-ahead thread; and a worker's reading state
 * (its stores' contexts, buffers, decoder, the thread). Called by a worker
 * with no lock held; sees the loader only through npyl_read_view. The
 * concerns below it, each a file, calls going down: the skip path
 * (npyload_loader_read_skip.c), a batch's rounds and their decoding
 * (npyload_loader_read_round.c), the plan of requests and frames
 * (npyload_loader_read_plan.c). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_loader_read.h"

/* The compressed scratch holds at least one frame and at most this much
 * (a batch's frames beyond it are read in further rounds). */
#define ZSRC_MAX_BYTES (32u << 20)

int npyl_read_batch(const npyl_read_view *v, npyl_read_ctx *c, int64_t *indices, size_t *rows,
                    uint8_t *const *dst, uint64_t *bytes)
{
    npyl_zstats zs = {0, 0, 0};
    int rc = npyl_rround_all(v, c, indices, *rows, dst, bytes, &zs);
    return npyl_rskip_finish(v, c, indices, rows, dst, rc, bytes, &zs);
}

/* ---- read-ahead ----
 *
 * Each worker has a thread of its own that only performs reads: the worker
 * hands it the first round of its next batch's reads (npyl_read_begin),
 * decodes or transforms its current batch meanwhile, and takes the result
 * when it needs it (npyl_read_end). Why a thread per worker and not reads
 * submitted to the worker's io_uring: one path for every backend (pread
 * and mmap cannot submit asynchronously; the gather path and io_uring's
 * page-cache hits complete inline on the submitting thread, so submitting
 * alone would copy on the worker anyway), with the io layer unchanged: its
 * identity checks, O_DIRECT placement, error messages and the io_uring ->
 * pread fallback hold as they are. The thread has its own io context
 * (contexts belong to one thread at a time); the worker's own context
 * serves the rounds after the first and ON_ERROR skip's retries. Why not
 * one shared I/O thread: a page-cached read is a copy, and one thread
 * copying for every worker would cap throughput at one core's memcpy. */

enum { AHEAD_IDLE = 0, AHEAD_QUEUED, AHEAD_DONE };

struct npyl_ahead {
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* state changed, or quit */
    pthread_t thread;
    int started, quit;    /* [mu] quit */
    int state;            /* [mu] AHEAD_* */
    npyl_sctx io;         /* the thread's own contexts of the stores */
    const npyl_read_view *v;
    _Atomic uint64_t cpu_ns; /* the thread's CPU time, per round */
    _Atomic uint64_t blocked_ns; /* its off-CPU time in the rounds */
    const npyl_req *reqs; /* [mu] the queued round */
    size_t n;
    int rc;               /* [mu] its result */
    size_t bad;
    uint64_t got;
    char errmsg[NPYL_ERRMSG_LEN];
};

static void *ahead_main(void *arg)
{
    struct npyl_ahead *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (a->state != AHEAD_QUEUED && !a->quit)
            pthread_cond_wait(&a->cv, &a->mu);
        if (a->state != AHEAD_QUEUED)
            break; /* quit, nothing queued */
        const npyl_req *reqs = a->reqs;
        size_t n = a->n, bad = 0;
        pthread_mutex_unlock(&a->mu);
        uint64_t got = 0, cpu = npyl_thread_cpu_ns();
        npyl_span span = npyl_span_begin();
        int rc = npyl_sctx_read(&a->io, reqs, n, &bad, &got, a->errmsg,
                           sizeof a->errmsg);
        atomic_fetch_add(&a->blocked_ns, npyl_blocked_since(span));
        npyl_count_cpu(&a->cpu_ns, &cpu);
        pthread_mutex_lock(&a->mu);
        a->rc = rc;
        a->bad = bad;
        a->got = got;
        a->state = AHEAD_DONE;
        /* Woken after the unlock, the worker does not block at once on the
         * mutex this thread holds (as npyl_slots_publish); ahead_stop joins
         * this thread before the condition variable goes. */
        pthread_mutex_unlock(&a->mu);
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_lock(&a->mu);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int ahead_start(npyl_read_ctx *c, const npyl_read_view *v, const npyl_store_cfg *cfg,
                       char *err, size_t errlen)
{
    struct npyl_ahead *a = calloc(1, sizeof *a);
    if (!a)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    c->ahead = a;
    a->v = v;
    int rc = npyl_sctx_open(&a->io, v->stores, cfg, err, errlen);
    if (rc)
        return rc;
    rc = pthread_create(&a->thread, NULL, ahead_main, a);
    if (rc)
        return npyl_fail(err, errlen, -rc, "cannot start a read-ahead thread: %s",
                         npyload_strerror(-rc));
    a->started = 1;
    return 0;
}

static void ahead_stop(struct npyl_ahead *a)
{
    if (!a)
        return;
    if (a->started) {
        pthread_mutex_lock(&a->mu);
        a->quit = 1; /* a round queued is read first: it writes into our buffers */
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->thread, NULL);
    }
    npyl_sctx_close(&a->io);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}

void npyl_read_begin(const npyl_read_view *v, npyl_read_ctx *c, const int64_t *indices,
                     size_t rows, uint8_t *const *dst, int here)
{
    npyl_read_buf *b = &c->buf[c->cur ^ 1];
    npyl_rplan_batch(v, b, indices, rows, dst);
    npyl_rplan_round(v, b);
    if (here) {
        /* Nothing to overlap with: no hand-off, whose wake-up costs a
         * scheduling delay when every core is busy decoding. */
        b->bad = 0;
        b->got = 0;
        b->rc = npyl_sctx_read(&c->io, b->reqs, b->nreq, &b->bad, &b->got,
                          c->errmsg, sizeof c->errmsg);
        c->cur ^= 1;
        c->read_here = 1;
        return;
    }
    struct npyl_ahead *a = c->ahead;
    pthread_mutex_lock(&a->mu);
    a->reqs = b->reqs;
    a->n = b->nreq;
    a->state = AHEAD_QUEUED;
    pthread_mutex_unlock(&a->mu);
    pthread_cond_broadcast(&a->cv); /* after the unlock, as in ahead_main */
}

void npyl_read_wait(npyl_read_ctx *c)
{
    if (c->read_here) {
        c->read_here = 0; /* read by begin itself */
        return;
    }
    struct npyl_ahead *a = c->ahead;
    pthread_mutex_lock(&a->mu);
    while (a->state != AHEAD_DONE)
        pthread_cond_wait(&a->cv, &a->mu);
    a->state = AHEAD_IDLE;
    c->cur ^= 1;
    npyl_read_buf *b = &c->buf[c->cur];
    b->rc = a->rc; /* the next begin reuses a's result fields */
    b->bad = a->bad;
    b->got = a->got;
    pthread_mutex_unlock(&a->mu);
    if (b->rc)
        snprintf(c->errmsg, sizeof c->errmsg, "%s", a->errmsg);
}

int npyl_read_end(const npyl_read_view *v, npyl_read_ctx *c, int64_t *indices, size_t *rows,
                  uint8_t *const *dst, uint64_t *bytes)
{
    struct npyl_ahead *a = c->ahead;
    pthread_mutex_lock(&a->mu);
    int overlapped = a->state != AHEAD_IDLE; /* the next batch's reads begun */
    pthread_mutex_unlock(&a->mu);
    if (overlapped)
        atomic_fetch_add(&v->st->ahead, 1);
    npyl_read_buf *b = &c->buf[c->cur];
    npyl_zstats zs = {0, 0, 0};
    int rc = npyl_rround_finish(v, c, b, b->rc, b->bad, b->got, dst, bytes, &zs);
    if (rc == 0 && b->u < b->nz)
        rc = npyl_rround_rest(v, c, b, dst, bytes, &zs);
    return npyl_rskip_finish(v, c, indices, rows, dst, rc, bytes, &zs);
}

/* ---- a worker's reading state ---- */

/* Buffers for batches of up to B rows: requests, .npy.zst rows and, when
 * any file is .npy.zst, the compressed scratch. */
static int buf_init(npyl_read_buf *b, const npyl_read_view *v, size_t B,
                    const npyl_zst_sizes *zsz)
{
    b->reqs = calloc(B * v->nfields, sizeof *b->reqs);
    b->rff = calloc(B * v->nfields, sizeof *b->rff);
    b->runs = malloc(B * sizeof *b->runs);
    if (!b->reqs || !b->rff || !b->runs)
        return -ENOMEM;
    if (!zsz->any)
        return 0;
    /* One frame, wherever its offset puts it: max_csize + the alignment. */
    uint64_t one = (uint64_t)zsz->max_csize + NPYL_DIRECT_ALIGN;
    uint64_t all = one * B * v->nfields;
    uint64_t cap = all < ZSRC_MAX_BYTES ? all : ZSRC_MAX_BYTES;
    if (cap < one)
        cap = one;
    cap = (cap + NPYL_DIRECT_ALIGN - 1) & ~(uint64_t)(NPYL_DIRECT_ALIGN - 1);
    b->zsrc = npyl_alloc_aligned((size_t)cap, NPYL_DIRECT_ALIGN);
    b->zsrc_cap = (size_t)cap;
    b->zrows = calloc(B * v->nfields, sizeof *b->zrows);
    return b->zsrc && b->zrows ? 0 : -ENOMEM;
}

static void buf_fini(npyl_read_buf *b)
{
    free(b->reqs);
    free(b->rff);
    free(b->runs);
    npyl_free_aligned(b->zsrc);
    free(b->zrows);
    memset(b, 0, sizeof *b);
}

int npyl_read_ctx_init(npyl_read_ctx *c, const npyl_read_view *v, const npyl_store_cfg *cfg,
                       size_t rows, const npyl_zst_sizes *zsz, int ahead, char *err,
                       size_t errlen)
{
    int rc = npyl_sctx_open(&c->io, v->stores, cfg, err, errlen);
    if (rc)
        return rc;
    c->opened = 1;
    /* Rows a batch can hold here (min(BATCH_SIZE, the rank's share)), as
     * the slots are sized: a huge BATCH_SIZE over a small field reserves
     * nothing more. */
    size_t B = rows;
    c->kept = malloc((B ? B : 1) * sizeof *c->kept);
    for (int i = 0; i < 1 + (ahead != 0); i++)
        if (!c->kept || buf_init(&c->buf[i], v, B, zsz))
            return npyl_fail(err, errlen, -ENOMEM, "out of memory for the read buffers "
                             "(%zu rows x %zu fields%s)", B, v->nfields,
                             zsz->any ? ", .npy.zst frames" : "");
    if (zsz->any) {
        /* The decode window: a frame of several samples up to this size
         * decodes into it in one call, a larger one streams through it. */
        c->zdst_cap = zsz->max_multi_dsize ? zsz->max_multi_dsize : 1;
        if (c->zdst_cap > NPYL_ZST_WINDOW_BYTES)
            c->zdst_cap = NPYL_ZST_WINDOW_BYTES;
        c->zdst = malloc(c->zdst_cap);
        c->dctx = npyl_zst_dctx_create();
        if (!c->zdst || !c->dctx)
            return npyl_fail(err, errlen, -ENOMEM, "out of memory for the .npy.zst "
                             "decoder (%zu bytes per worker)", c->zdst_cap);
    }
    return ahead ? ahead_start(c, v, cfg, err, errlen) : 0;
}

void npyl_read_ctx_fini(npyl_read_ctx *c)
{
    ahead_stop(c->ahead); /* first: its reads land in the buffers */
    c->ahead = NULL;
    npyl_sctx_close(&c->io);
    c->opened = 0;
    buf_fini(&c->buf[0]);
    buf_fini(&c->buf[1]);
    npyl_zst_dctx_free(c->dctx);
    free(c->zdst);
    free(c->kept);
    c->kept = NULL;
    c->dctx = NULL;
    c->zdst = NULL;
    c->zdst_cap = 0;
}

uint64_t npyl_read_ctx_ahead_blocked(const npyl_read_ctx *c)
{
    return c->ahead ? atomic_load(&c->ahead->blocked_ns) : 0;
}

void npyl_read_ctx_counters(const npyl_read_ctx *c, npyl_store_counters *k,
                            uint64_t *cpu_ns, uint64_t *blocked_ns, uint64_t *fallbacks)
{
    npyl_store_counters mine = {0};
    npyl_sctx_counters(&c->io, &mine);
    if (c->ahead) {
        npyl_sctx_counters(&c->ahead->io, &mine);
        *cpu_ns += atomic_load(&c->ahead->cpu_ns);
        *blocked_ns += atomic_load(&c->ahead->blocked_ns);
    }
    k->gather_bytes += mine.gather_bytes;
    k->gather_reqs += mine.gather_reqs;
    k->read_bytes += mine.read_bytes;
    k->read_reqs += mine.read_reqs;
    *fallbacks += (uint64_t)mine.fell_back;
}

