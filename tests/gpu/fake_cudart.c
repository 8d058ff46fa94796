/* A fake CUDA runtime for CPU-only tests of lib/cuda and the loader's device
 * path. Built as a shared library whose SONAME is libcudart.so.13: a test
 * dlopens it by path first, and lib/cuda's open (which prefers a runtime the
 * process already has, RTLD_NOLOAD by soname) then picks it up instead of
 * the real one. Criterion forks every test, so the fake never leaks into
 * another test's process.
 *
 * Semantics: one device; "device" memory is host memory; copies, event
 * records and stream waits are queued per stream and run only when the host
 * waits for them (see below), so a loader that writes a staging buffer
 * before its copy ran delivers wrong bytes. What it adds over a real runtime
 * is control: call counters, and failures injected on demand through the
 * struct returned by fake_cudart_control() (look it up with dlsym).
 *
 * Test scaffolding: process-wide state is fine here, not in lib/. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cudart.h"

static fake_cudart g_fake;
/* initial-exec: this library is dlopened, and a general-dynamic variable's
 * block in the dynamic TLS vector crashed LeakSanitizer's scan (see
 * kshim.h); 4 bytes of the static TLS surplus instead. */
static _Thread_local int t_device __attribute__((tls_model("initial-exec")));

fake_cudart *fake_cudart_control(void) { return &g_fake; }

#define FAIL_CODE 999 /* cudaErrorUnknown */
#define COUNT(name) atomic_fetch_add(&g_fake.name, 1)

int cudaGetDeviceCount(int *n)
{
    *n = 1;
    return 0;
}

int cudaSetDevice(int d)
{
    COUNT(n_set_device);
    if (atomic_load(&g_fake.fail_set_device))
        return FAIL_CODE;
    if (d != 0)
        return 101; /* cudaErrorInvalidDevice */
    t_device = d;
    return 0;
}

int cudaGetDevice(int *d)
{
    COUNT(n_get_device);
    if (atomic_load(&g_fake.fail_get_device))
        return FAIL_CODE;
    *d = t_device;
    return 0;
}

const char *cudaGetErrorString(int e)
{
    return e == FAIL_CODE ? "fake runtime: injected failure" : "fake runtime error";
}

int cudaHostAlloc(void **p, size_t n, unsigned flags)
{
    (void)flags;
    return posix_memalign(p, 4096, n ? n : 1) == 0 ? 0 : 2; /* MemoryAllocation */
}

static void run_all_locked(void);

int cudaFreeHost(void *p)
{
    run_all_locked(); /* as CUDA's implicit synchronisation */
    free(p);
    return 0;
}

int cudaMalloc(void **p, size_t n)
{
    return posix_memalign(p, 256, n ? n : 1) == 0 ? 0 : 2;
}

int cudaFree(void *p)
{
    run_all_locked();
    free(p);
    return 0;
}

/* Streams are queues of operations, run in order when someone waits (event
 * or stream synchronize, a stream destroyed, memory freed, a synchronous
 * copy) -- as late as CUDA could run them, so a host write into a staging
 * buffer before its copy's event was waited on shows up as wrong bytes on
 * the device. With `immediate` set, everything runs at once instead. One
 * mutex guards every queue; ops run with it held. */
enum { OP_COPY, OP_RECORD, OP_WAIT, OP_HOST };
struct fake_event;
typedef struct fake_op {
    int kind;
    unsigned long long seq;
    void (*fn)(void *);           /* HOST: fn(arg), e.g. a kernel the fake */
    void *arg;                    /* driver runs on the CPU */
    void *dst;
    const void *src;
    size_t n;
    struct fake_event *ev;        /* RECORD: the event; WAIT: its snapshot: */
    struct fake_stream *wait_s;   /* WAIT: the event's stream and record seq */
    unsigned long long wait_seq;
    struct fake_op *next;
} fake_op;

typedef struct fake_stream {
    fake_op *head, *tail;
    struct fake_stream *next_live, *prev_live;
} fake_stream;

typedef struct fake_event {
    fake_stream *s;               /* stream of the last record, while pending */
    unsigned long long seq;       /* op seq of the last record */
    int pending;
} fake_event;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long g_seq;
static fake_stream g_legacy;      /* the NULL stream */
static fake_stream *g_live;       /* created streams */

static fake_stream *S(void *s) { return s ? (fake_stream *)s : &g_legacy; }

static void run_until(fake_stream *s, unsigned long long seq);

static void run_op(fake_op *op)
{
    switch (op->kind) {
    case OP_COPY:
        memcpy(op->dst, op->src, op->n);
        break;
    case OP_RECORD:
        if (op->ev && op->ev->seq == op->seq)
            op->ev->pending = 0;
        break;
    case OP_WAIT:
        run_until(op->wait_s, op->wait_seq);
        break;
    case OP_HOST:
        op->fn(op->arg);
        break;
    }
}

/* Runs s's ops with seq <= seq, in order. g_mu held. */
static void run_until(fake_stream *s, unsigned long long seq)
{
    while (s->head && s->head->seq <= seq) {
        fake_op *op = s->head;
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        run_op(op);
        free(op);
    }
}

static void run_all_streams(void)
{
    run_until(&g_legacy, ~0ull);
    for (fake_stream *s = g_live; s; s = s->next_live)
        run_until(s, ~0ull);
}

/* Queues op on s (or runs it at once). g_mu held. */
static void enqueue(fake_stream *s, fake_op *op)
{
    op->seq = ++g_seq;
    if (atomic_load(&g_fake.immediate)) {
        run_op(op);
        free(op);
        return;
    }
    op->next = NULL;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
}

int cudaStreamCreateWithFlags(void **s, unsigned flags)
{
    (void)flags;
    fake_stream *st = calloc(1, sizeof *st);
    if (!st)
        return 2;
    pthread_mutex_lock(&g_mu);
    st->next_live = g_live;
    if (g_live)
        g_live->prev_live = st;
    g_live = st;
    pthread_mutex_unlock(&g_mu);
    *s = st;
    return 0;
}

int cudaStreamDestroy(void *s)
{
    fake_stream *st = s;
    pthread_mutex_lock(&g_mu);
    run_until(st, ~0ull); /* CUDA finishes a destroyed stream's work */
    if (st->prev_live)
        st->prev_live->next_live = st->next_live;
    else
        g_live = st->next_live;
    if (st->next_live)
        st->next_live->prev_live = st->prev_live;
    pthread_mutex_unlock(&g_mu);
    free(st);
    return 0;
}

int cudaStreamSynchronize(void *s)
{
    COUNT(n_stream_sync);
    if (s && s == atomic_load(&g_fake.watch))
        COUNT(n_watch_sync);
    if (atomic_load(&g_fake.fail_stream_sync))
        return FAIL_CODE;
    pthread_mutex_lock(&g_mu);
    run_until(S(s), ~0ull);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

int cudaEventCreateWithFlags(void **e, unsigned flags)
{
    (void)flags;
    *e = calloc(1, sizeof(fake_event));
    return *e ? 0 : 2;
}

int cudaEventDestroy(void *e)
{
    fake_event *ev = e;
    pthread_mutex_lock(&g_mu);
    if (ev->pending)
        run_until(ev->s, ev->seq); /* its RECORD op must not outlive it */
    pthread_mutex_unlock(&g_mu);
    free(ev);
    return 0;
}

int cudaEventRecord(void *e, void *s)
{
    COUNT(n_event_record);
    if (atomic_load(&g_fake.fail_event_record))
        return FAIL_CODE;
    fake_op *op = calloc(1, sizeof *op);
    if (!op)
        return 2;
    fake_event *ev = e;
    pthread_mutex_lock(&g_mu);
    op->kind = OP_RECORD;
    op->ev = ev;
    ev->s = S(s);
    ev->seq = g_seq + 1; /* the seq enqueue gives op */
    ev->pending = 1;
    enqueue(S(s), op);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

int cudaEventSynchronize(void *e)
{
    COUNT(n_event_sync);
    fake_event *ev = e;
    pthread_mutex_lock(&g_mu);
    if (ev->pending)
        run_until(ev->s, ev->seq);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

int cudaEventQuery(void *e)
{
    COUNT(n_event_query);
    if (atomic_load(&g_fake.query_not_ready))
        return 600; /* cudaErrorNotReady */
    fake_event *ev = e;
    pthread_mutex_lock(&g_mu); /* "the GPU made progress" */
    if (ev->pending)
        run_until(ev->s, ev->seq);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

int cudaEventElapsedTime(float *ms, void *a, void *b)
{
    (void)a;
    (void)b;
    *ms = 0.25f;
    return 0;
}

int cudaStreamWaitEvent(void *s, void *e, unsigned flags)
{
    (void)flags;
    COUNT(n_stream_wait_event);
    fake_event *ev = e;
    pthread_mutex_lock(&g_mu);
    if (ev->pending) {
        fake_op *op = calloc(1, sizeof *op);
        if (!op) {
            pthread_mutex_unlock(&g_mu);
            return 2;
        }
        op->kind = OP_WAIT;
        op->wait_s = ev->s;
        op->wait_seq = ev->seq;
        enqueue(S(s), op);
    }
    pthread_mutex_unlock(&g_mu);
    return 0;
}

int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *s)
{
    (void)kind;
    COUNT(n_memcpy_async);
    fake_op *op = calloc(1, sizeof *op);
    if (!op)
        return 2;
    op->kind = OP_COPY;
    op->dst = dst;
    op->src = src;
    op->n = n;
    pthread_mutex_lock(&g_mu);
    enqueue(S(s), op);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

/* Not CUDA: queues fn(arg) on stream s like any other operation (the fake
 * driver's kernels run on the CPU this way, in stream order with the
 * copies). g_mu is held while fn runs. */
int fake_cudart_enqueue_host(void *s, void (*fn)(void *), void *arg)
{
    fake_op *op = calloc(1, sizeof *op);
    if (!op)
        return 2;
    op->kind = OP_HOST;
    op->fn = fn;
    op->arg = arg;
    pthread_mutex_lock(&g_mu);
    enqueue(S(s), op);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

int cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
    (void)kind;
    pthread_mutex_lock(&g_mu);
    run_all_streams(); /* legacy-stream semantics, roughly */
    pthread_mutex_unlock(&g_mu);
    memcpy(dst, src, n);
    return 0;
}

int cudaDriverGetVersion(int *v)
{
    *v = 13000;
    return 0;
}

int cudaRuntimeGetVersion(int *v)
{
    *v = 13000;
    return 0;
}

static void run_all_locked(void)
{
    pthread_mutex_lock(&g_mu);
    run_all_streams();
    pthread_mutex_unlock(&g_mu);
}
