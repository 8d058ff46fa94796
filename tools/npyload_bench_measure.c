/* npyload-bench, measuring: one configuration of the grid (a fresh loader,
 * a warm-up, the timed batches), with the monitor thread (NVML, VmRSS) and
 * the progress bar. */
#include "npyload_bench_measure.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

const char *nb_io_name(int io)
{
    switch (io) {
    case NPYLOAD_IO_AUTO: return "auto";
    case NPYLOAD_IO_URING: return "io_uring";
    case NPYLOAD_IO_PREAD: return "pread";
    case NPYLOAD_IO_MMAP: return "mmap";
    }
    return "?";
}

static double rusage_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* ------------------------------------------------------------------------ */
/* Memory and GPU monitoring                                                  */
/* ------------------------------------------------------------------------ */

/* Resets VmHWM to the current RSS (Linux >= 4.0: "5" > clear_refs). */
static int reset_hwm(void)
{
    int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, "5", 1);
    close(fd);
    return n == 1 ? 0 : -1;
}

/* Does resetting VmHWM really work here? Touch 64 MiB, give it back, reset,
 * and see the high-water mark come down. */
int nb_hwm_reset_works(void)
{
    size_t n = 64u << 20;
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 0;
    memset(p, 1, n);
    long peak = nb_proc_status_kb("VmHWM");
    munmap(p, n);
    if (reset_hwm() != 0)
        return 0;
    long after = nb_proc_status_kb("VmHWM");
    return peak > 0 && after > 0 && after < peak - 32 * 1024;
}

/* One monitor thread per run: NVML every 100 ms, VmRSS every 10 ms when
 * VmHWM cannot be reset. */
typedef struct monitor {
    const npyload_nvml *nvml;
    pthread_t thread;
    atomic_int stop;
    int sample_rss;
    long rss_max_kb;
    int gpu_samples;
    double util_sum, util_max, power_sum, mem_max_mib;
} monitor;

static void *monitor_thread(void *arg)
{
    monitor *m = arg;
    uint64_t next_gpu = 0;
    while (!atomic_load(&m->stop)) {
        if (m->sample_rss) {
            long kb = nb_proc_status_kb("VmRSS");
            if (kb > m->rss_max_kb)
                m->rss_max_kb = kb;
        }
        uint64_t t = nb_now_ns();
        npyload_nvml_sample_t g;
        if (m->nvml && t >= next_gpu) {
            next_gpu = t + 100000000ull;
            if (npyload_nvml_sample(m->nvml, &g) == 0) {
                m->gpu_samples++;
                m->util_sum += g.util_pct;
                if (g.util_pct > m->util_max)
                    m->util_max = g.util_pct;
                m->power_sum += g.power_w;
                if (g.mem_used_mib > m->mem_max_mib)
                    m->mem_max_mib = g.mem_used_mib;
            }
        }
        nb_sleep_ns(m->sample_rss ? 10000000ull : 50000000ull);
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Progress bar: stderr, only when it is a terminal                           */
/* ------------------------------------------------------------------------ */

void nb_progress_start(nb_progress *p, int total, int quiet)
{
    memset(p, 0, sizeof *p);
    p->on = !quiet && isatty(STDERR_FILENO);
    p->total = total;
    p->t_start = nb_now_ns();
}

static void progress(nb_progress *g, double frac_current, const char *what)
{
    if (!g->on)
        return;
    uint64_t t = nb_now_ns();
    if (t - g->last_draw < 100000000ull && frac_current > 0 && frac_current < 1)
        return;
    g->last_draw = t;
    double f = (g->done + (frac_current > 1 ? 1 : frac_current)) / (double)g->total;
    double el = (double)(t - g->t_start) / 1e9;
    double eta = f > 0.01 ? el / f - el : 0;
    char bar[31];
    int filled = (int)(f * 30);
    for (int i = 0; i < 30; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[30] = 0;
    fprintf(stderr, "\r\033[K[%s] %d/%d %-28.28s ETA %3.0fs", bar, g->done + 1,
            g->total, what, eta);
    fflush(stderr);
    g->drawn = 1;
}

static void progress_clear(nb_progress *g)
{
    if (g->on && g->drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        g->drawn = 0;
    }
}


/* ------------------------------------------------------------------------ */
/* One configuration                                                          */
/* ------------------------------------------------------------------------ */

/* "stage: error: message" from the loader into r->error. */
static void run_error(nb_run *r, const char *stage, int rc, const npyload_loader *L)
{
    const char *m = L ? npyload_loader_errmsg(L) : NULL;
    snprintf(r->error, sizeof r->error, "%s: %s%s%s", stage, npyload_strerror(rc),
             m && *m ? ": " : "", m ? m : "");
}

/* A started loader for the configuration, or NULL (r->error says why). */
static npyload_loader *run_loader(const nb_config *cfg, int workers, int prefetch, int io,
                                  int rank, nb_run *r)
{
    npyload_loader *L = NULL;
    int rc = npyload_loader_create(&L);
    const char *stage = "create";
    if (rc == 0 && cfg->remote) {
        stage = "set_remote";
        rc = npyload_loader_set_remote(L, cfg->remote, sizeof *cfg->remote);
    }
    for (int k = 0; rc == 0 && k < cfg->nfields; k++) {
        const int src = nb_field_source(cfg, k);
        if (src >= 0 && (k == 0 || cfg->fields[k - 1].source != src)) {
            stage = "add_source"; /* --source: the fields after it are its own */
            rc = npyload_loader_add_source(L, cfg->sources[src]);
        }
        stage = "add_field";
        if (rc == 0)
            rc = npyload_loader_add_field(L, cfg->fields[k].name, cfg->fields[k].glob);
    }
    if (rc == 0 && cfg->nsources && cfg->weights_given) {
        stage = "set_weights";
        rc = npyload_loader_set_weights(L, cfg->weights, (size_t)cfg->nsources);
    }
    const struct { npyload_option opt; int64_t v; const char *name; } set[] = {
        {NPYLOAD_OPT_BATCH_SIZE, cfg->batch_size, "batch_size"},
        {NPYLOAD_OPT_NUM_WORKERS, workers, "num_workers"},
        {NPYLOAD_OPT_PREFETCH, prefetch, "prefetch"},
        {NPYLOAD_OPT_SHUFFLE, cfg->shuffle, "shuffle"},
        {NPYLOAD_OPT_SEED, cfg->seed, "seed"},
        {NPYLOAD_OPT_DROP_LAST, cfg->drop_last, "drop_last"},
        {NPYLOAD_OPT_IO_BACKEND, io, "io"},
        {NPYLOAD_OPT_DEVICE, cfg->device, "device"},
        {NPYLOAD_OPT_DIRECT_IO, cfg->direct, "direct_io"},
        {NPYLOAD_OPT_READ_AHEAD, cfg->no_read_ahead ? -1 : 0, "read_ahead"},
        {NPYLOAD_OPT_WORLD_SIZE, cfg->ranks > 1 ? cfg->ranks : 1, "world_size"},
        {NPYLOAD_OPT_RANK, rank, "rank"},
    };
    for (size_t i = 0; rc == 0 && i < sizeof set / sizeof set[0]; i++) {
        stage = set[i].name;
        rc = npyload_loader_set(L, set[i].opt, set[i].v);
    }
    for (int k = 0; rc == 0 && k < cfg->nfields; k++)
        if (cfg->fields[k].has_transform) {
            stage = "set_transform";
            rc = npyload_loader_set_transform(L, cfg->fields[k].name, &cfg->fields[k].t,
                                              sizeof cfg->fields[k].t);
        }
    if (rc == 0) {
        stage = "start";
        rc = npyload_loader_start(L);
    }
    if (rc != 0) {
        run_error(r, stage, rc, L);
        npyload_loader_destroy(L);
        return NULL;
    }
    return L;
}

/* The next batch, wrapping epochs unless --cold (a second epoch would be
 * partly warm). @return : 0, NPYLOAD_EOF, or an error. */
static int next_batch(npyload_loader *L, const nb_config *cfg, uint64_t *epoch,
                      npyload_batch **b)
{
    int rc = npyload_loader_next(L, b);
    if (rc == NPYLOAD_EOF && !cfg->cold) {
        rc = npyload_loader_set_epoch(L, ++*epoch);
        if (rc == 0)
            rc = npyload_loader_next(L, b);
    }
    return rc;
}

/* Warm-up: a few batches, not counted (thread start-up, first touch of
 * slots, the pipeline filling); --warmup-batches N: N, wrapping epochs
 * (not with --cold: a second epoch would be partly warm). `epoch` : the
 * epoch reached. @return : 0 or the failing code. */
static int run_warmup(npyload_loader *L, const nb_config *cfg, int prefetch, uint64_t *epoch)
{
    int64_t nbatches = npyload_loader_num_batches(L);
    /* Auto (prefetch NPYLOAD_AUTO): none, its convergence counts. */
    int64_t warm = prefetch < 0 ? 0 : cfg->cold ? 1 : (prefetch + 1 < 4 ? prefetch + 1 : 4);
    if (prefetch >= 0 && cfg->warmup_batches >= 0)
        warm = cfg->warmup_batches;
    else if (nbatches > 0 && warm > nbatches / 2)
        warm = nbatches / 2 > 0 ? nbatches / 2 : 0;
    for (int64_t i = 0; i < warm; i++) {
        npyload_batch *b = NULL;
        int rc = next_batch(L, cfg, epoch, &b);
        if (rc != 0)
            return rc < 0 ? rc : 0;
        if (cfg->device >= 0)
            npyload_batch_sync(b);
        npyload_batch_release(b);
    }
    return 0;
}

/* The latencies of next() in ms, grown as needed. */
typedef struct lat_log {
    double *v;
    size_t n, cap;
} lat_log;

static void lat_add(lat_log *l, double ms)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        double *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return; /* a latency less, not a wrong one */
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = ms;
}

/* The npyload_stats counters a run keeps for its timed part (the
 * difference across it) and sums over its ranks. */
static const size_t TIMED_COUNTERS[] = {
    offsetof(npyload_stats, batches_delivered), offsetof(npyload_stats, samples_delivered),
    offsetof(npyload_stats, io_ns),             offsetof(npyload_stats, h2d_ns),
    offsetof(npyload_stats, decode_ns),         offsetof(npyload_stats, transform_ns),
    offsetof(npyload_stats, read_wait_ns),      offsetof(npyload_stats, read_ahead_batches),
    offsetof(npyload_stats, worker_cpu_ns),     offsetof(npyload_stats, read_blocked_ns),
    offsetof(npyload_stats, remote_bytes),      offsetof(npyload_stats, remote_requests),
    offsetof(npyload_stats, remote_retries),    offsetof(npyload_stats, remote_wait_ns),
    offsetof(npyload_stats, cache_hits),        offsetof(npyload_stats, cache_misses),
    offsetof(npyload_stats, cache_read_bytes),  offsetof(npyload_stats, cache_write_bytes),
};
#define NB_COUNTER(s, off) (*(uint64_t *)(void *)((char *)(s) + (off)))

/* The loader's counters over the timed part (those since st0); the loop's
 * wait is the bench's own (a device sync outside next() included). */
static void timed_stats(npyload_loader *L, const npyload_stats *st0, uint64_t in_next,
                        uint64_t wall_ns, nb_run *r)
{
    npyload_stats s;
    if (npyload_loader_get_stats(L, &s, sizeof s) != 0)
        return;
    npyload_stats *d = &r->timed;
    memset(d, 0, sizeof *d);
    for (size_t i = 0; i < sizeof TIMED_COUNTERS / sizeof TIMED_COUNTERS[0]; i++)
        NB_COUNTER(d, TIMED_COUNTERS[i]) =
            NB_COUNTER(&s, TIMED_COUNTERS[i]) - NB_COUNTER(st0, TIMED_COUNTERS[i]);
    d->elapsed_ns = wall_ns;
    d->wait_ns = in_next;
    d->step_ns = wall_ns > in_next ? wall_ns - in_next : 0;
    d->num_workers = s.num_workers;
    d->num_slots = s.num_slots; /* the verdict's start-up rule */
    d->device = s.device;       /* its GPU advice: a host loader has -1 */
}

/* The timed batches: each taken with next() (and synced on a GPU without a
 * step kernel), then a simulated step of compute_ms, then released.
 * Fills samples, wall_s, stall and cpu. `epoch` : the loader's epoch
 * (the warm-up may have wrapped). @return : 0, NPYLOAD_EOF or an
 * error. */
static int run_timed(nb_ctx *ctx, npyload_loader *L, const nb_config *cfg, nb_gpu_step *step,
                     const char *what, int show, uint64_t epoch, lat_log *lat, nb_run *r)
{
    uint64_t compute_ns = (uint64_t)(cfg->compute_ms * 1e6);
    uint64_t bound_ns = (uint64_t)(cfg->seconds * 1e9), in_next = 0;
    double cpu0 = rusage_cpu_s();
    npyload_stats st0;
    if (npyload_loader_get_stats(L, &st0, sizeof st0) != 0)
        memset(&st0, 0, sizeof st0);
    int64_t src0[NB_MAX_SOURCES];
    for (int k = 0; k < cfg->nsources; k++)
        src0[k] = npyload_loader_source_samples(L, (size_t)k);
    uint64_t t0 = nb_now_ns();
    int rc;
    for (;;) {
        npyload_batch *b = NULL;
        uint64_t ts = nb_now_ns();
        rc = next_batch(L, cfg, &epoch, &b);
        if (rc != 0)
            break;
        if (cfg->device >= 0 && !step)
            npyload_batch_sync(b); /* the consumer waits for the copy too */
        uint64_t te = nb_now_ns();
        in_next += te - ts;
        lat_add(lat, (double)(te - ts) / 1e6);
        r->samples += npyload_batch_size(b);
        if (step) {
            nb_gpu_step_run(step, b, compute_ns);
        } else {
            if (compute_ns)
                nb_sleep_ns(compute_ns);
            npyload_batch_release(b);
        }
        uint64_t el = nb_now_ns() - t0;
        double frac = cfg->batches > 0 ? (double)lat->n / (double)cfg->batches
                                       : (double)el / (double)bound_ns;
        if (show)
            progress(&ctx->prog, frac, what);
        /* By time: at least NB_MIN_BATCHES (a p50, a stall share and a
         * verdict need them; a 900 ms step gives 1-2 in 1.5 s), unless
         * even that runs past NB_MAX_RUN_S (then main warns). */
        if (cfg->batches > 0 ? (int64_t)lat->n >= cfg->batches
                             : el >= bound_ns && (lat->n >= NB_MIN_BATCHES ||
                                                  (el >= NB_MAX_RUN_S * 1000000000ull &&
                                                   lat->n >= 2)))
            break;
    }
    if (step)
        nb_gpu_step_sync(step); /* the last steps belong to the run */
    r->wall_s = (double)(nb_now_ns() - t0) / 1e9;
    if (r->wall_s > 0) {
        /* Without a step there is nothing to stall: the consumer only waits. */
        r->stall_pct = compute_ns || step ? 100.0 * (double)in_next / 1e9 / r->wall_s : NAN;
        r->cpu_pct = 100.0 * (rusage_cpu_s() - cpu0) / r->wall_s;
    }
    timed_stats(L, &st0, in_next, nb_now_ns() - t0, r);
    for (int k = 0; k < cfg->nsources; k++)
        r->source_samples[k] += npyload_loader_source_samples(L, (size_t)k) - src0[k];
    return rc;
}

/* The figures that follow from the timed part. */
static void run_figures(const nb_config *cfg, double ceiling_gbps, lat_log *lat, nb_run *r)
{
    r->ok = lat->n > 0;
    r->batches = lat->n;
    r->bytes = r->samples * (cfg->batch_bytes / (uint64_t)cfg->batch_size);
    r->samples_per_s = r->wall_s > 0 ? (double)r->samples / r->wall_s : 0;
    r->gbps = r->wall_s > 0 ? (double)r->bytes / r->wall_s / 1e9 : 0;
    if (ceiling_gbps > 0)
        r->frac_of_ceiling = r->gbps / ceiling_gbps;
    r->p50_ms = nb_percentile(lat->v, lat->n, 50);
    r->p99_ms = nb_percentile(lat->v, lat->n, 99);
    r->max_ms = lat->n ? lat->v[lat->n - 1] : 0; /* sorted by nb_percentile */
    if (!r->ok)
        snprintf(r->error, sizeof r->error, "no batch measured (dataset too small?)");
}

/* Peak RSS and the GPU samples of the run. */
static void run_monitored(const nb_ctx *ctx, const monitor *mon, nb_run *r)
{
    if (ctx->hwm_ok) {
        long hwm = nb_proc_status_kb("VmHWM");
        r->peak_rss_mib = hwm > 0 ? hwm / 1024.0 : 0;
    } else {
        r->peak_rss_mib = mon->rss_max_kb / 1024.0;
    }
    if (mon->gpu_samples) {
        r->gpu_samples = mon->gpu_samples;
        r->gpu_util_avg_pct = mon->util_sum / mon->gpu_samples;
        r->gpu_util_max_pct = mon->util_max;
        r->gpu_power_avg_w = mon->power_sum / mon->gpu_samples;
        r->gpu_mem_max_mib = mon->mem_max_mib;
    }
}

static void run_init(nb_run *r, const nb_config *cfg, int workers, int prefetch, int io)
{
    memset(r, 0, sizeof *r);
    r->workers = workers;
    r->prefetch = prefetch;
    r->io_requested = io;
    r->frac_of_ceiling = -1;
    snprintf(r->io_requested_name, sizeof r->io_requested_name, "%s", nb_io_name(io));
    snprintf(r->io_used, sizeof r->io_used, "-");
    r->slot_mib = (double)prefetch * (double)cfg->batch_bytes / 1048576.0;
}

/* Adds a loader's counters to the run (summed over the ranks' loaders). */
static void add_stats(npyload_loader *L, nb_run *r)
{
    npyload_stats st;
    if (npyload_loader_get_stats(L, &st, sizeof st) != 0)
        return;
    r->pinned = st.pinned;
    r->direct_io = st.direct_io;
    r->final_workers = (int)st.num_workers;
    r->final_slots = (int)st.num_slots;
    r->auto_decisions = st.auto_decisions;
    r->gather_bytes += st.gather_bytes;
    r->gather_requests += st.gather_requests;
    r->read_requests += st.read_requests;
    r->bytes_read += st.bytes_read;
    r->compressed_bytes_read += st.compressed_bytes_read;
    r->decompressed_bytes += st.decompressed_bytes;
    r->decode_ns += st.decode_ns;
    r->read_ahead_batches += st.read_ahead_batches;
    r->read_wait_ns += st.read_wait_ns;
    r->transform_ns += st.transform_ns;
    r->h2d_ns += st.h2d_ns;
}

/* Measures a started loader: warm-up, timed part, figures, stats. */
static void run_loader_measure(nb_ctx *ctx, npyload_loader *L, const nb_config *cfg,
                               int prefetch, double ceiling_gbps, nb_run *r)
{
    uint64_t epoch = 0;
    int rc = run_warmup(L, cfg, prefetch, &epoch);
    if (rc < 0) {
        run_error(r, "next", rc, L);
        return;
    }
    if (ctx->hwm_ok)
        reset_hwm();
    /* On a GPU the step is a kernel of compute_ms on a stream of its own,
     * ordered after the batch's copy and before the slot's reuse, so the
     * stall is the one a trainer at that step time would see. */
    nb_gpu_step *step = NULL;
    if (cfg->device >= 0 && cfg->compute_ms > 0) {
        char why[256] = "";
        step = nb_gpu_step_create(cfg->device, why, sizeof why);
        if (!step)
            fprintf(stderr, "npyload-bench: GPU busy kernel unavailable (%s): the step is "
                    "a host sleep\n", why);
    }
    char what[64];
    snprintf(what, sizeof what, "%s w=%d p=%d", r->io_requested_name, r->workers, prefetch);
    lat_log lat = {0};
    rc = run_timed(ctx, L, cfg, step, what, 1, epoch, &lat, r);
    nb_gpu_step_destroy(step);
    if (rc < 0) {
        free(lat.v);
        run_error(r, "next", rc, L);
        return;
    }
    run_figures(cfg, ceiling_gbps, &lat, r);
    free(lat.v);
    add_stats(L, r);
    npyload_stats st;
    if (npyload_loader_get_stats(L, &st, sizeof st) == 0 && st.slot_bytes && st.num_slots)
        r->slot_mib = (double)st.slot_bytes * (double)st.num_slots / 1048576.0;
}

/* --ranks R: one loader per rank, each consumed by a thread of its own at
 * once (host steps only); the run is the node's: samples summed, wall the
 * longest, stall the ranks' mean, latencies pooled, counters and slot
 * memory summed. workers and prefetch are per rank. */
typedef struct rank_job {
    nb_ctx *ctx;
    const nb_config *cfg;
    npyload_loader *L;
    int prefetch, rank;
    char what[64];
    nb_run r;
    lat_log lat;
    int rc;
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    uint64_t epoch = 0;
    j->rc = run_warmup(j->L, j->cfg, j->prefetch, &epoch);
    if (j->rc >= 0)
        j->rc = run_timed(j->ctx, j->L, j->cfg, NULL, j->what, j->rank == 0, epoch, &j->lat,
                          &j->r);
    return NULL;
}

/* A rank's timed counters into the node's: sums, the longest elapsed. */
static void add_timed(const npyload_stats *a, npyload_stats *t)
{
    for (size_t i = 0; i < sizeof TIMED_COUNTERS / sizeof TIMED_COUNTERS[0]; i++)
        NB_COUNTER(t, TIMED_COUNTERS[i]) += NB_COUNTER(a, TIMED_COUNTERS[i]);
    t->elapsed_ns = a->elapsed_ns > t->elapsed_ns ? a->elapsed_ns : t->elapsed_ns;
    t->wait_ns += a->wait_ns;
    t->step_ns += a->step_ns;
    t->num_workers += a->num_workers;
}

static void run_ranks(nb_ctx *ctx, const nb_config *cfg, int workers, int prefetch, int io,
                      double ceiling_gbps, nb_run *r)
{
    int R = cfg->ranks;
    rank_job *j = calloc((size_t)R, sizeof *j);
    pthread_t *th = calloc((size_t)R, sizeof *th);
    int started = 0, ok = j && th;
    if (!ok)
        snprintf(r->error, sizeof r->error, "out of memory");
    for (int k = 0; ok && k < R; k++) {
        j[k] = (rank_job){.ctx = ctx, .cfg = cfg, .prefetch = prefetch, .rank = k};
        snprintf(j[k].what, sizeof j[k].what, "%s w=%d p=%d x%d", r->io_requested_name,
                 workers, prefetch, R);
        j[k].L = run_loader(cfg, workers, prefetch, io, k, r);
        ok = j[k].L != NULL;
    }
    if (ok && ctx->hwm_ok)
        reset_hwm();
    for (int k = 0; ok && k < R; k++) {
        if (pthread_create(&th[k], NULL, rank_main, &j[k]) != 0) {
            snprintf(r->error, sizeof r->error, "cannot start rank thread %d", k);
            ok = 0;
            break;
        }
        started++;
    }
    for (int k = 0; k < started; k++)
        pthread_join(th[k], NULL);
    lat_log lat = {0};
    double stall = 0, cpu = 0;
    if (ok)
        r->slot_mib = 0; /* the ranks' slots, summed below */
    for (int k = 0; ok && k < R; k++) {
        if (j[k].rc < 0) {
            run_error(r, "next", j[k].rc, j[k].L);
            ok = 0;
            break;
        }
        r->samples += j[k].r.samples;
        r->wall_s = j[k].r.wall_s > r->wall_s ? j[k].r.wall_s : r->wall_s;
        add_timed(&j[k].r.timed, &r->timed);
        for (int i = 0; i < cfg->nsources; i++)
            r->source_samples[i] += j[k].r.source_samples[i];
        stall += j[k].r.stall_pct / R;
        cpu = j[k].r.cpu_pct > cpu ? j[k].r.cpu_pct : cpu; /* process-wide already */
        for (size_t i = 0; i < j[k].lat.n; i++)
            lat_add(&lat, j[k].lat.v[i]);
        add_stats(j[k].L, r);
        npyload_stats st;
        if (npyload_loader_get_stats(j[k].L, &st, sizeof st) == 0)
            r->slot_mib += (double)st.slot_bytes * (double)st.num_slots / 1048576.0;
    }
    if (ok) {
        snprintf(r->io_used, sizeof r->io_used, "%s",
                 npyload_backend_name(npyload_loader_backend(j[0].L)));
        r->stall_pct = stall;
        r->cpu_pct = cpu;
        run_figures(cfg, ceiling_gbps, &lat, r);
    }
    free(lat.v);
    for (int k = 0; j && k < R; k++) {
        free(j[k].lat.v);
        npyload_loader_destroy(j[k].L);
    }
    free(j);
    free(th);
}

void nb_run_one(nb_ctx *ctx, const nb_config *cfg, int workers, int prefetch, int io,
                double ceiling_gbps, nb_run *r)
{
    run_init(r, cfg, workers, prefetch, io);
    progress(&ctx->prog, 0, "starting");
    if (cfg->cold)
        nb_evict_all(ctx, 1);
    long base_kb = nb_proc_status_kb("VmRSS");
    r->base_rss_mib = base_kb > 0 ? base_kb / 1024.0 : 0;

    if (cfg->ranks > 1) {
        run_ranks(ctx, cfg, workers, prefetch, io, ceiling_gbps, r);
        long hwm = nb_proc_status_kb("VmHWM");
        r->peak_rss_mib = hwm > 0 ? hwm / 1024.0 : 0;
        ctx->prog.done++;
        progress_clear(&ctx->prog);
        return;
    }
    npyload_loader *L = run_loader(cfg, workers, prefetch, io, 0, r);
    if (L) {
        snprintf(r->io_used, sizeof r->io_used, "%s",
                 npyload_backend_name(npyload_loader_backend(L)));
        monitor mon;
        memset(&mon, 0, sizeof mon);
        mon.nvml = ctx->nvml;
        mon.sample_rss = !ctx->hwm_ok;
        int mon_on = (mon.sample_rss || ctx->nvml) &&
                     pthread_create(&mon.thread, NULL, monitor_thread, &mon) == 0;
        run_loader_measure(ctx, L, cfg, prefetch, ceiling_gbps, r);
        if (mon_on) {
            atomic_store(&mon.stop, 1);
            pthread_join(mon.thread, NULL);
        }
        run_monitored(ctx, &mon, r);
        npyload_loader_destroy(L);
    }
    ctx->prog.done++;
    progress_clear(&ctx->prog);
}
