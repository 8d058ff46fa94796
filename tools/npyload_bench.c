/* npyload-bench: measures the loader over a workers x prefetch x io grid on
 * the user's own files, next to the machine's own ceilings measured in the
 * same run, and recommends num_workers and prefetch.
 *
 *   npyload-bench name=GLOB... [--batch-size N] [--workers 1,2,4]
 *       [--prefetch 1,2,4,8] [--io auto,io_uring,pread,mmap] [--shuffle]
 *       [--device cpu|cuda:N] [--batches N | --seconds S] [--compute-ms X]
 *       [--cold] [--direct] [--json FILE] [--plot FILE] [--quiet]
 *
 * Uses nothing of lib/: only include/npyload.h, libc, pthreads, and liburing
 * for the raw O_DIRECT read ceiling. The pure logic (percentiles, the
 * recommendation, JSON, the heatmap) lives in npyload_bench_report.c. */
#include "npyload.h"
#include "npyload_bench.h"
#include "npyload_bench_support.h" /* unstable: h2d ceiling, GPU busy step */

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#ifdef NPYLOAD_HAVE_URING
#include <liburing.h>
#endif

/* ------------------------------------------------------------------------ */
/* Small helpers                                                              */
/* ------------------------------------------------------------------------ */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static double rusage_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static char g_warnings[8192];
static int g_quiet;

static void warn(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "npyload-bench: warning: %s\n", buf);
    size_t l = strlen(g_warnings);
    if (l + strlen(buf) + 2 < sizeof g_warnings)
        snprintf(g_warnings + l, sizeof g_warnings - l, "%s\n", buf);
}

static void die_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("npyload-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nrun 'npyload-bench --help' for the options\n", stderr);
    exit(2);
}

/* kB value of "Key:" in /proc/self/status, or -1. */
static long proc_status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtol(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

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
static int hwm_reset_works(void)
{
    size_t n = 64u << 20;
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 0;
    memset(p, 1, n);
    long peak = proc_status_kb("VmHWM");
    munmap(p, n);
    if (reset_hwm() != 0)
        return 0;
    long after = proc_status_kb("VmHWM");
    return peak > 0 && after > 0 && after < peak - 32 * 1024;
}

/* ------------------------------------------------------------------------ */
/* Options                                                                    */
/* ------------------------------------------------------------------------ */

static const char usage[] =
    "usage: npyload-bench name=GLOB... [options]\n"
    "Measures npyload on your files over a workers x prefetch (x io) grid,\n"
    "next to the machine's own ceilings measured in the same run, and\n"
    "recommends num_workers and prefetch.\n"
    "\n"
    "  name=GLOB            a field: its NPY files (quote the glob)\n"
    "  --batch-size N       samples per batch (default 128)\n"
    "  --workers LIST       worker counts, e.g. 1,2,4 (default 1,2)\n"
    "  --prefetch LIST      prefetch depths (batch slots) (default 1,2,4)\n"
    "  --io LIST            auto,io_uring,pread,mmap (default auto)\n"
    "  --shuffle[=local]    full shuffle (or locality-preserving)\n"
    "  --device D           cpu (default) or cuda:N\n"
    "  --seconds S          measure each configuration for S s (default 1.5)\n"
    "  --batches N          measure each configuration for N batches instead\n"
    "  --compute-ms X       simulate a training step of X ms per batch (a host\n"
    "                       sleep; with cuda a GPU busy kernel); the\n"
    "                       recommendation then minimises consumer stall\n"
    "  --cold               evict the files from the page cache before each run\n"
    "  --direct             O_DIRECT reads in the loader\n"
    "  --json FILE          every run, the ceilings and the machine (schema:\n"
    "                       bench/schema.json)\n"
    "  --plot FILE          heatmap over the grid (.png, or .svg)\n"
    "  --quiet              only the recommendation line\n";

typedef struct opts {
    int workers[NB_MAX_GRID], nworkers;
    int prefetch[NB_MAX_GRID], nprefetch;
    int io[NB_MAX_IO], nio;
    int shuffle_mode; /* npyload_shuffle */
    const char *json, *plot;
} opts;

static int parse_list(const char *s, int *out, int max, const char *what)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 4096)
            die_usage("%s: '%s' is not a list of positive integers", what, s);
        if (n == max)
            die_usage("%s: at most %d values", what, max);
        out[n++] = (int)v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            die_usage("%s: '%s' is not a comma-separated list", what, s);
    }
    if (n == 0)
        die_usage("%s: empty list", what);
    return n;
}

static const char *io_name(int io)
{
    switch (io) {
    case NPYLOAD_IO_AUTO: return "auto";
    case NPYLOAD_IO_URING: return "io_uring";
    case NPYLOAD_IO_PREAD: return "pread";
    case NPYLOAD_IO_MMAP: return "mmap";
    }
    return "?";
}

static int parse_io(const char *s, int *out)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t;
         t = strtok_r(NULL, ",", &save)) {
        int v;
        if (!strcmp(t, "auto")) v = NPYLOAD_IO_AUTO;
        else if (!strcmp(t, "io_uring") || !strcmp(t, "uring")) v = NPYLOAD_IO_URING;
        else if (!strcmp(t, "pread")) v = NPYLOAD_IO_PREAD;
        else if (!strcmp(t, "mmap")) v = NPYLOAD_IO_MMAP;
        else die_usage("--io: unknown backend '%s' (auto, io_uring, pread, mmap)", t);
        if (n == NB_MAX_IO)
            die_usage("--io: at most %d backends", NB_MAX_IO);
        out[n++] = v;
    }
    if (!n)
        die_usage("--io: empty list");
    return n;
}

/* ------------------------------------------------------------------------ */
/* Files (for the ceilings and the cache eviction)                            */
/* ------------------------------------------------------------------------ */

typedef struct bfile {
    char *path;
    int fd;
    uint64_t data_offset;
    uint64_t data_bytes;
    uint64_t file_bytes;
    int64_t nsamples;
    int64_t first; /* global index of its first sample */
} bfile;

typedef struct bfield {
    bfile *files;
    size_t nfiles;
    uint64_t sample_bytes;
    int64_t nsamples;
} bfield;

static bfield g_fields[NB_MAX_FIELDS];

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void load_field(nb_field_info *fi, bfield *bf)
{
    glob_t g;
    int rc = glob(fi->glob, 0, NULL, &g);
    if (rc != 0 || g.gl_pathc == 0) {
        fprintf(stderr, "npyload-bench: field '%s': no file matches '%s'\n",
                fi->name, fi->glob);
        exit(2);
    }
    qsort(g.gl_pathv, g.gl_pathc, sizeof(char *), cmp_str);
    bf->nfiles = g.gl_pathc;
    bf->files = calloc(bf->nfiles, sizeof *bf->files);
    if (!bf->files) {
        perror("npyload-bench");
        exit(1);
    }
    int64_t first = 0;
    for (size_t i = 0; i < bf->nfiles; i++) {
        bfile *f = &bf->files[i];
        npyload_header h;
        char err[512];
        rc = npyload_read_header(g.gl_pathv[i], &h, err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, "npyload-bench: %s\n", err[0] ? err : npyload_strerror(rc));
            exit(2);
        }
        if (h.ndim < 1 || h.shape[0] < 1) {
            fprintf(stderr, "npyload-bench: %s: no sample axis (shape has %d dims)\n",
                    g.gl_pathv[i], h.ndim);
            exit(2);
        }
        uint64_t sb = h.data_bytes / (uint64_t)h.shape[0];
        if (i == 0) {
            bf->sample_bytes = sb;
            snprintf(fi->descr, sizeof fi->descr, "%s", h.descr);
            fi->ndim = h.ndim - 1 < 8 ? h.ndim - 1 : 8;
            for (int d = 0; d < fi->ndim; d++)
                fi->shape[d] = h.shape[d + 1];
        } else if (sb != bf->sample_bytes) {
            fprintf(stderr,
                    "npyload-bench: %s: %llu bytes per sample, %s has %llu\n",
                    g.gl_pathv[i], (unsigned long long)sb, bf->files[0].path,
                    (unsigned long long)bf->sample_bytes);
            exit(2);
        }
        f->path = strdup(g.gl_pathv[i]);
        f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
        if (f->fd < 0) {
            fprintf(stderr, "npyload-bench: %s: %s\n", f->path, strerror(errno));
            exit(2);
        }
        f->data_offset = h.data_offset;
        f->data_bytes = h.data_bytes;
        f->file_bytes = h.file_bytes;
        f->nsamples = h.shape[0];
        f->first = first;
        first += h.shape[0];
    }
    bf->nsamples = first;
    fi->nfiles = bf->nfiles;
    fi->sample_bytes = bf->sample_bytes;
    globfree(&g);
}

/* The file holding global sample s of a field (binary search). */
static const bfile *sample_file(const bfield *bf, int64_t s)
{
    size_t lo = 0, hi = bf->nfiles;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (bf->files[mid].first <= s)
            lo = mid;
        else
            hi = mid;
    }
    return &bf->files[lo];
}

/* --cold: drop every file of every field from the page cache. Caveats (see
 * bench/README.md): dirty pages are written back first (fdatasync) or they
 * would stay; pages mapped or locked by other processes stay; some
 * filesystems (network, FUSE, overlay on some kernels) ignore the advice.
 * mincore on a sample of files checks it; a warning says when pages stay. */
static void evict_all(int nfields, int verbose_warn)
{
    uint64_t resident = 0, checked = 0;
    for (int k = 0; k < nfields; k++) {
        bfield *bf = &g_fields[k];
        size_t stride = bf->nfiles > 8 ? bf->nfiles / 8 : 1;
        for (size_t i = 0; i < bf->nfiles; i++) {
            int fd = bf->files[i].fd;
            fdatasync(fd);
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            if (i % stride != 0 || bf->files[i].file_bytes == 0)
                continue;
            size_t len = (size_t)bf->files[i].file_bytes;
            if (len > (256u << 20))
                len = 256u << 20;
            void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
            if (m == MAP_FAILED)
                continue;
            long pg = sysconf(_SC_PAGESIZE);
            size_t npages = (len + (size_t)pg - 1) / (size_t)pg;
            unsigned char *vec = malloc(npages);
            if (vec && mincore(m, len, vec) == 0) {
                for (size_t j = 0; j < npages; j++)
                    resident += vec[j] & 1;
                checked += npages;
            }
            free(vec);
            munmap(m, len);
        }
    }
    static int warned;
    if (verbose_warn && checked && resident * 20 > checked && !warned) {
        warned = 1;
        warn("--cold: %.0f%% of the sampled pages stayed in the page cache after "
             "POSIX_FADV_DONTNEED (mapped by another process, or a filesystem "
             "that ignores the advice): cold numbers are partly warm",
             100.0 * (double)resident / (double)checked);
    }
}

/* Reads every file once so that the hot runs start from the page cache. */
static void warm_all(int nfields)
{
    size_t n = 4u << 20;
    char *buf = malloc(n);
    if (!buf)
        return;
    for (int k = 0; k < nfields; k++)
        for (size_t i = 0; i < g_fields[k].nfiles; i++) {
            int fd = g_fields[k].files[i].fd;
            off_t off = 0;
            ssize_t r;
            while ((r = pread(fd, buf, n, off)) > 0)
                off += r;
        }
    free(buf);
}

static double mem_available_gib(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return -1;
    char line[256];
    double v = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "MemAvailable:", 13) == 0) {
            v = strtod(line + 13, NULL) / (1024.0 * 1024.0);
            break;
        }
    fclose(f);
    return v;
}

/* ------------------------------------------------------------------------ */
/* The order (the same sequence the loader reads, for the copy ceiling)      */
/* ------------------------------------------------------------------------ */

/* The library's own order (npyload_order_indices), so the ceiling reads
 * the samples in the pattern the loader reads them; LOCAL needs the first
 * field's file sizes. NULL when out of memory or the order is refused. */
static int64_t *make_order(int64_t n, int shuffle_mode, int batch, uint64_t epoch)
{
    const bfield *f0 = &g_fields[0];
    int64_t *sizes = malloc((f0->nfiles ? f0->nfiles : 1) * sizeof *sizes);
    int64_t *o = malloc((size_t)(n ? n : 1) * sizeof *o);
    if (!sizes || !o) {
        free(sizes);
        free(o);
        return NULL;
    }
    for (size_t i = 0; i < f0->nfiles; i++)
        sizes[i] = f0->files[i].nsamples;
    int64_t got = npyload_order_indices(n, shuffle_mode, 0, epoch, 0, 1, 0, batch, sizes,
                                        f0->nfiles, 0, o, (size_t)n);
    free(sizes);
    if (got != n) {
        free(o);
        return NULL;
    }
    return o;
}

/* ------------------------------------------------------------------------ */
/* Ceiling 1: parallel pread copy of the same bytes, same per-sample runs     */
/* ------------------------------------------------------------------------ */

typedef struct copy_ctx {
    const int64_t *order;
    int64_t n;
    int batch;
    int nfields;
    uint64_t batch_bytes;
    uint64_t deadline;
    int64_t max_batches;
    atomic_llong next_batch;
    atomic_ullong bytes;
    atomic_int failed;
    char **bufs;       /* one batch buffer per thread, touched before timing */
    atomic_int next_buf;
} copy_ctx;

static void *copy_thread(void *arg)
{
    copy_ctx *c = arg;
    char *buf = c->bufs[atomic_fetch_add(&c->next_buf, 1)];
    int64_t nb = (c->n + c->batch - 1) / c->batch;
    uint64_t local = 0;
    for (;;) {
        int64_t b = atomic_fetch_add(&c->next_batch, 1);
        if (c->max_batches > 0 ? b >= c->max_batches : now_ns() >= c->deadline)
            break;
        int64_t i0 = (b % nb) * c->batch;
        int64_t i1 = i0 + c->batch < c->n ? i0 + c->batch : c->n;
        char *dst = buf;
        for (int k = 0; k < c->nfields; k++) {
            const bfield *bf = &g_fields[k];
            for (int64_t i = i0; i < i1; i++) {
                const bfile *f = sample_file(bf, c->order[i]);
                off_t off = (off_t)(f->data_offset +
                                    (uint64_t)(c->order[i] - f->first) * bf->sample_bytes);
                ssize_t r = pread(f->fd, dst, bf->sample_bytes, off);
                if (r != (ssize_t)bf->sample_bytes) {
                    atomic_store(&c->failed, 1);
                    return NULL;
                }
                dst += bf->sample_bytes;
                local += bf->sample_bytes;
            }
        }
    }
    atomic_fetch_add(&c->bytes, local);
    return NULL;
}

static void ceiling_copy(const nb_config *cfg, int shuffle_mode, int threads,
                         double seconds, nb_ceiling *out)
{
    snprintf(out->name, sizeof out->name, "pread_copy");
    out->threads = threads;
    int64_t *order = make_order(cfg->num_samples, shuffle_mode, cfg->batch_size, 0);
    if (!order) {
        snprintf(out->note, sizeof out->note, "cannot build the order (out of memory)");
        return;
    }
    copy_ctx c = {.order = order, .n = cfg->num_samples, .batch = cfg->batch_size,
                  .nfields = cfg->nfields, .batch_bytes = cfg->batch_bytes};
    pthread_t *t = calloc((size_t)threads, sizeof *t);
    c.bufs = calloc((size_t)threads, sizeof *c.bufs);
    for (int i = 0; t && c.bufs && i < threads; i++) {
        if (posix_memalign((void **)&c.bufs[i], 4096, c.batch_bytes) != 0) {
            c.bufs[i] = NULL;
            break;
        }
        memset(c.bufs[i], 0, c.batch_bytes);
    }
    if (!t || !c.bufs || !c.bufs[threads - 1]) {
        for (int i = 0; c.bufs && i < threads; i++)
            free(c.bufs[i]);
        free(c.bufs);
        free(t);
        free(order);
        snprintf(out->note, sizeof out->note, "out of memory for %d batch buffers",
                 threads);
        return;
    }
    /* A short warm-up pass (first touch of the buffers, readahead state),
     * then three measured passes: the best one is the ceiling (others share
     * this machine; a ceiling is what it can give, not an average). */
    double best = 0;
    for (int pass = 0; pass < 4; pass++) {
        atomic_store(&c.next_batch, 0);
        atomic_store(&c.bytes, 0);
        atomic_store(&c.next_buf, 0);
        uint64_t t0 = now_ns();
        c.deadline = t0 + (uint64_t)((pass ? seconds / 3 : 0.2) * 1e9);
        c.max_batches = 0;
        int started = 0;
        for (int i = 0; i < threads; i++)
            if (pthread_create(&t[i], NULL, copy_thread, &c) == 0)
                started++;
            else
                break;
        for (int i = 0; i < started; i++)
            pthread_join(t[i], NULL);
        uint64_t t1 = now_ns();
        double s = (double)(t1 - t0) / 1e9;
        uint64_t bytes = atomic_load(&c.bytes);
        if (pass && s > 0 && (double)bytes / s / 1e9 > best) {
            best = (double)bytes / s / 1e9;
            out->seconds = s;
            out->bytes = bytes;
        }
    }
    for (int i = 0; i < threads; i++)
        free(c.bufs[i]);
    free(c.bufs);
    free(t);
    free(order);
    if (atomic_load(&c.failed)) {
        snprintf(out->note, sizeof out->note, "a pread failed or came back short");
        return;
    }
    out->measured = best > 0;
    out->gbps = best;
    snprintf(out->note, sizeof out->note,
             "best of 3: %d threads pread the same samples (one read per sample and field) "
             "into batch-sized buffers, %s", threads,
             cfg->cold ? "page cache after a warm-up pass (the hot reference; --cold "
                         "runs compare with odirect_uring)" : "page cache");
}

/* ------------------------------------------------------------------------ */
/* Ceiling 2: raw O_DIRECT io_uring read, 1 MiB blocks, depth 32 (--cold)     */
/* ------------------------------------------------------------------------ */

static void ceiling_odirect(int nfields, double seconds, nb_ceiling *out)
{
    snprintf(out->name, sizeof out->name, "odirect_uring");
    out->threads = 1;
#ifndef NPYLOAD_HAVE_URING
    (void)nfields;
    (void)seconds;
    snprintf(out->note, sizeof out->note, "built without liburing: skipped");
#else
    enum { BS = 1 << 20, QD = 32 };
    struct io_uring ring;
    int rc = io_uring_queue_init(QD, &ring, 0);
    if (rc < 0) {
        snprintf(out->note, sizeof out->note, "io_uring refused here (%s): skipped",
                 strerror(-rc));
        return;
    }
    char *pool = NULL;
    if (posix_memalign((void **)&pool, 4096, (size_t)BS * QD) != 0) {
        io_uring_queue_exit(&ring);
        snprintf(out->note, sizeof out->note, "out of memory");
        return;
    }
    memset(pool, 0, (size_t)BS * QD);
    evict_all(nfields, 0);

    /* The work list: every file's data range, aligned out to 4 KiB. */
    typedef struct { int fd; uint64_t off, end; } span;
    size_t nspans = 0, cap = 0;
    span *spans = NULL;
    for (int k = 0; k < nfields; k++)
        for (size_t i = 0; i < g_fields[k].nfiles; i++) {
            const bfile *f = &g_fields[k].files[i];
            int fd = open(f->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
            if (fd < 0) {
                snprintf(out->note, sizeof out->note,
                         "%s: O_DIRECT open failed (%s): skipped", f->path,
                         strerror(errno));
                goto done;
            }
            if (nspans == cap) {
                cap = cap ? cap * 2 : 64;
                spans = realloc(spans, cap * sizeof *spans);
            }
            spans[nspans].fd = fd;
            spans[nspans].off = f->data_offset & ~4095ull;
            spans[nspans].end = (f->data_offset + f->data_bytes + 4095) & ~4095ull;
            nspans++;
        }

    uint64_t t0 = now_ns(), deadline = t0 + (uint64_t)(seconds * 1e9);
    uint64_t bytes = 0;
    size_t si = 0;
    uint64_t pos = nspans ? spans[0].off : 0;
    int inflight = 0, stop = 0, slot_free[QD], nfree = QD;
    for (int i = 0; i < QD; i++)
        slot_free[i] = i;
    while (!stop || inflight) {
        while (!stop && nfree > 0 && si < nspans) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (!sqe)
                break;
            int slot = slot_free[--nfree];
            uint64_t len = spans[si].end - pos < BS ? spans[si].end - pos : BS;
            io_uring_prep_read(sqe, spans[si].fd, pool + (size_t)slot * BS,
                               (unsigned)len, pos);
            io_uring_sqe_set_data64(sqe, (uint64_t)slot);
            inflight++;
            pos += len;
            if (pos >= spans[si].end && ++si < nspans)
                pos = spans[si].off;
        }
        if (si >= nspans)
            stop = 1;
        if (!inflight)
            break;
        io_uring_submit(&ring);
        struct io_uring_cqe *cqe;
        rc = io_uring_wait_cqe(&ring, &cqe);
        if (rc < 0) {
            snprintf(out->note, sizeof out->note, "io_uring_wait_cqe: %s", strerror(-rc));
            goto done;
        }
        if (cqe->res < 0) {
            snprintf(out->note, sizeof out->note, "O_DIRECT read failed: %s",
                     strerror(-cqe->res));
            io_uring_cqe_seen(&ring, cqe);
            goto done;
        }
        bytes += (uint64_t)cqe->res;
        slot_free[nfree++] = (int)io_uring_cqe_get_data64(cqe);
        inflight--;
        io_uring_cqe_seen(&ring, cqe);
        if (now_ns() >= deadline)
            stop = 1;
    }
    out->seconds = (double)(now_ns() - t0) / 1e9;
    out->bytes = bytes;
    out->measured = bytes > 0;
    out->gbps = out->measured ? (double)bytes / out->seconds / 1e9 : 0;
    snprintf(out->note, sizeof out->note,
             "O_DIRECT io_uring reads of the files' data, 1 MiB blocks, depth 32, "
             "after eviction%s", si >= nspans ? " (all data read before the time bound)" : "");
done:
    for (size_t i = 0; i < nspans; i++)
        close(spans[i].fd);
    free(spans);
    free(pool);
    io_uring_queue_exit(&ring);
#endif
}

/* ------------------------------------------------------------------------ */
/* GPU monitoring through NVML, loaded at run time                            */
/* ------------------------------------------------------------------------ */

typedef struct { unsigned gpu, memory; } nvml_util;
typedef struct { unsigned long long total, free, used; } nvml_mem;
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_handle_fn)(unsigned, void **);
typedef int (*nvml_util_fn)(void *, nvml_util *);
typedef int (*nvml_power_fn)(void *, unsigned *);
typedef int (*nvml_mem_fn)(void *, nvml_mem *);

static struct {
    void *lib;
    void *dev;
    nvml_util_fn util;
    nvml_power_fn power;
    nvml_mem_fn mem;
} g_nvml;

static int nvml_open(int device, char *why, size_t whylen)
{
    g_nvml.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!g_nvml.lib) {
        snprintf(why, whylen, "libnvidia-ml.so.1 not found");
        return -1;
    }
    nvml_init_fn init = (nvml_init_fn)dlsym(g_nvml.lib, "nvmlInit_v2");
    nvml_handle_fn handle = (nvml_handle_fn)dlsym(g_nvml.lib, "nvmlDeviceGetHandleByIndex_v2");
    g_nvml.util = (nvml_util_fn)dlsym(g_nvml.lib, "nvmlDeviceGetUtilizationRates");
    g_nvml.power = (nvml_power_fn)dlsym(g_nvml.lib, "nvmlDeviceGetPowerUsage");
    g_nvml.mem = (nvml_mem_fn)dlsym(g_nvml.lib, "nvmlDeviceGetMemoryInfo");
    if (!init || !handle || !g_nvml.util) {
        snprintf(why, whylen, "libnvidia-ml.so.1 lacks the expected symbols");
        return -1;
    }
    if (init() != 0 || handle((unsigned)device, &g_nvml.dev) != 0) {
        snprintf(why, whylen, "nvmlInit or device %d lookup failed", device);
        g_nvml.dev = NULL;
        return -1;
    }
    return 0;
}

/* One monitor thread per run: NVML every 100 ms, VmRSS every 10 ms when
 * VmHWM cannot be reset. */
typedef struct monitor {
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
            long kb = proc_status_kb("VmRSS");
            if (kb > m->rss_max_kb)
                m->rss_max_kb = kb;
        }
        uint64_t t = now_ns();
        if (g_nvml.dev && t >= next_gpu) {
            next_gpu = t + 100000000ull;
            nvml_util u;
            unsigned mw = 0;
            nvml_mem mem;
            if (g_nvml.util(g_nvml.dev, &u) == 0) {
                m->gpu_samples++;
                m->util_sum += u.gpu;
                if (u.gpu > m->util_max)
                    m->util_max = u.gpu;
                if (g_nvml.power && g_nvml.power(g_nvml.dev, &mw) == 0)
                    m->power_sum += mw / 1000.0;
                if (g_nvml.mem && g_nvml.mem(g_nvml.dev, &mem) == 0 &&
                    mem.used / 1048576.0 > m->mem_max_mib)
                    m->mem_max_mib = mem.used / 1048576.0;
            }
        }
        sleep_ns(m->sample_rss ? 10000000ull : 50000000ull);
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Progress bar: stderr, only when it is a terminal                           */
/* ------------------------------------------------------------------------ */

static struct {
    int on;
    int total, done;
    uint64_t t_start, last_draw;
    int drawn;
} g_prog;

static void progress(double frac_current, const char *what)
{
    if (!g_prog.on)
        return;
    uint64_t t = now_ns();
    if (t - g_prog.last_draw < 100000000ull && frac_current > 0 && frac_current < 1)
        return;
    g_prog.last_draw = t;
    double f = (g_prog.done + (frac_current > 1 ? 1 : frac_current)) / (double)g_prog.total;
    double el = (double)(t - g_prog.t_start) / 1e9;
    double eta = f > 0.01 ? el / f - el : 0;
    char bar[31];
    int filled = (int)(f * 30);
    for (int i = 0; i < 30; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[30] = 0;
    fprintf(stderr, "\r\033[K[%s] %d/%d %-28.28s ETA %3.0fs", bar, g_prog.done + 1,
            g_prog.total, what, eta);
    fflush(stderr);
    g_prog.drawn = 1;
}

static void progress_clear(void)
{
    if (g_prog.on && g_prog.drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        g_prog.drawn = 0;
    }
}

/* ------------------------------------------------------------------------ */
/* One configuration                                                          */
/* ------------------------------------------------------------------------ */

static int g_hwm_ok;

static void run_one(const nb_config *cfg, const opts *o, int workers,
                    int prefetch, int io, double ceiling_gbps, nb_run *r)
{
    memset(r, 0, sizeof *r);
    r->workers = workers;
    r->prefetch = prefetch;
    r->io_requested = io;
    r->frac_of_ceiling = -1;
    snprintf(r->io_requested_name, sizeof r->io_requested_name, "%s", io_name(io));
    snprintf(r->io_used, sizeof r->io_used, "-");
    r->slot_mib = (double)prefetch * (double)cfg->batch_bytes / 1048576.0;

    if (cfg->cold)
        evict_all(cfg->nfields, 1);
    long base_kb = proc_status_kb("VmRSS");
    r->base_rss_mib = base_kb > 0 ? base_kb / 1024.0 : 0;

    npyload_loader *L = NULL;
    int rc = npyload_loader_create(&L);
    const char *stage = "create";
    for (int k = 0; rc == 0 && k < cfg->nfields; k++) {
        stage = "add_field";
        rc = npyload_loader_add_field(L, cfg->fields[k].name, cfg->fields[k].glob);
    }
    struct { npyload_option opt; int64_t v; const char *name; } set[] = {
        {NPYLOAD_OPT_BATCH_SIZE, cfg->batch_size, "batch_size"},
        {NPYLOAD_OPT_NUM_WORKERS, workers, "num_workers"},
        {NPYLOAD_OPT_PREFETCH, prefetch, "prefetch"},
        {NPYLOAD_OPT_SHUFFLE, o->shuffle_mode, "shuffle"},
        {NPYLOAD_OPT_SEED, 0, "seed"},
        {NPYLOAD_OPT_IO_BACKEND, io, "io"},
        {NPYLOAD_OPT_DEVICE, cfg->device, "device"},
        {NPYLOAD_OPT_DIRECT_IO, cfg->direct, "direct_io"},
    };
    for (size_t i = 0; rc == 0 && i < sizeof set / sizeof set[0]; i++) {
        stage = set[i].name;
        rc = npyload_loader_set(L, set[i].opt, set[i].v);
    }
    if (rc == 0) {
        stage = "start";
        rc = npyload_loader_start(L);
    }
    if (rc != 0) {
        const char *m = npyload_loader_errmsg(L);
        snprintf(r->error, sizeof r->error, "%s: %s%s%s", stage, npyload_strerror(rc),
                 m && *m ? ": " : "", m ? m : "");
        npyload_loader_destroy(L);
        return;
    }
    snprintf(r->io_used, sizeof r->io_used, "%s",
             npyload_backend_name(npyload_loader_backend(L)));
    int64_t nbatches = npyload_loader_num_batches(L);

    monitor mon;
    memset(&mon, 0, sizeof mon);
    mon.sample_rss = !g_hwm_ok;
    int mon_on = (mon.sample_rss || g_nvml.dev) &&
                 pthread_create(&mon.thread, NULL, monitor_thread, &mon) == 0;

    /* Warm-up: a few batches, not counted (thread start-up, first touch of
     * slots, the pipeline filling). */
    uint64_t epoch = 0;
    int warm = cfg->cold ? 1 : (prefetch + 1 < 4 ? prefetch + 1 : 4);
    if (nbatches > 0 && warm > nbatches / 2)
        warm = nbatches / 2 > 0 ? (int)(nbatches / 2) : 0;
    for (int i = 0; i < warm; i++) {
        npyload_batch *b = NULL;
        rc = npyload_loader_next(L, &b);
        if (rc != 0)
            break;
        if (cfg->device >= 0)
            npyload_batch_sync(b);
        npyload_batch_release(b);
    }
    if (rc < 0)
        goto failed;

    size_t lat_cap = 1024, nlat = 0;
    double *lat = malloc(lat_cap * sizeof *lat);
    if (g_hwm_ok)
        reset_hwm();
    uint64_t compute_ns = (uint64_t)(cfg->compute_ms * 1e6);
    /* On a GPU the step is a kernel of compute_ms on a stream of its own,
     * ordered after the batch's copy and before the slot's reuse, so the
     * stall is the one a trainer at that step time would see. */
    npyload_compute_sim *sim = NULL;
    void *sim_stream = NULL;
    if (cfg->device >= 0 && compute_ns) {
        char why[256] = "";
        if (npyload_compute_sim_create(cfg->device, &sim, why, sizeof why) == 0)
            sim_stream = npyload_compute_sim_stream(sim);
        else
            fprintf(stderr, "npyload-bench: GPU busy kernel unavailable (%s): the step is "
                    "a host sleep\n", why);
    }
    double cpu0 = rusage_cpu_s();
    uint64_t t0 = now_ns(), in_next = 0;
    uint64_t bound_ns = (uint64_t)(cfg->seconds * 1e9);
    char what[64];
    snprintf(what, sizeof what, "%s w=%d p=%d", io_name(io), workers, prefetch);
    for (;;) {
        npyload_batch *b = NULL;
        uint64_t ts = now_ns();
        rc = npyload_loader_next(L, &b);
        if (rc == NPYLOAD_EOF) {
            if (cfg->cold)
                break; /* a second epoch would be (partly) warm */
            rc = npyload_loader_set_epoch(L, ++epoch);
            if (rc == 0)
                rc = npyload_loader_next(L, &b);
        }
        if (rc != 0)
            break;
        if (cfg->device >= 0 && !sim)
            npyload_batch_sync(b); /* the consumer waits for the copy too */
        uint64_t te = now_ns();
        in_next += te - ts;
        if (nlat == lat_cap) {
            lat_cap *= 2;
            lat = realloc(lat, lat_cap * sizeof *lat);
        }
        lat[nlat++] = (double)(te - ts) / 1e6;
        r->samples += npyload_batch_size(b);
        if (sim) {
            npyload_batch_wait_stream(b, sim_stream);
            npyload_compute_sim_busy(sim, compute_ns);
            npyload_batch_release_stream(b, sim_stream);
        } else {
            if (compute_ns)
                sleep_ns(compute_ns);
            npyload_batch_release(b);
        }
        uint64_t el = now_ns() - t0;
        if (cfg->batches > 0) {
            progress((double)nlat / (double)cfg->batches, what);
            if ((int64_t)nlat >= cfg->batches)
                break;
        } else {
            progress((double)el / (double)bound_ns, what);
            if (el >= bound_ns && nlat >= 2)
                break;
        }
    }
    if (sim)
        npyload_compute_sim_sync(sim); /* the last steps belong to the run */
    uint64_t t1 = now_ns();
    double cpu1 = rusage_cpu_s();
    npyload_compute_sim_destroy(sim);
    if (rc < 0 && rc != NPYLOAD_EOF) {
        free(lat);
        goto failed;
    }

    r->ok = nlat > 0;
    r->batches = nlat;
    r->bytes = r->samples * (cfg->batch_bytes / (uint64_t)cfg->batch_size);
    r->wall_s = (double)(t1 - t0) / 1e9;
    r->samples_per_s = r->wall_s > 0 ? (double)r->samples / r->wall_s : 0;
    r->gbps = r->wall_s > 0 ? (double)r->bytes / r->wall_s / 1e9 : 0;
    if (ceiling_gbps > 0)
        r->frac_of_ceiling = r->gbps / ceiling_gbps;
    r->stall_pct = r->wall_s > 0 ? 100.0 * (double)in_next / 1e9 / r->wall_s : 0;
    r->cpu_pct = r->wall_s > 0 ? 100.0 * (cpu1 - cpu0) / r->wall_s : 0;
    r->p50_ms = nb_percentile(lat, nlat, 50);
    r->p99_ms = nb_percentile(lat, nlat, 99);
    r->max_ms = nlat ? lat[nlat - 1] : 0; /* sorted by nb_percentile */
    free(lat);
    if (!r->ok)
        snprintf(r->error, sizeof r->error, "no batch measured (dataset too small?)");

    npyload_stats st;
    if (npyload_loader_get_stats(L, &st) == 0) {
        r->pinned = st.pinned;
        r->direct_io = st.direct_io;
        if (st.slot_bytes && st.num_slots)
            r->slot_mib = (double)st.slot_bytes * (double)st.num_slots / 1048576.0;
    }
    goto finish;

failed:
    r->ok = 0;
    {
        const char *m = npyload_loader_errmsg(L);
        snprintf(r->error, sizeof r->error, "next: %s%s%s", npyload_strerror(rc),
                 m && *m ? ": " : "", m ? m : "");
    }
finish:
    if (mon_on) {
        atomic_store(&mon.stop, 1);
        pthread_join(mon.thread, NULL);
    }
    if (g_hwm_ok) {
        long hwm = proc_status_kb("VmHWM");
        r->peak_rss_mib = hwm > 0 ? hwm / 1024.0 : 0;
    } else {
        r->peak_rss_mib = mon.rss_max_kb / 1024.0;
    }
    if (mon.gpu_samples) {
        r->gpu_samples = mon.gpu_samples;
        r->gpu_util_avg_pct = mon.util_sum / mon.gpu_samples;
        r->gpu_util_max_pct = mon.util_max;
        r->gpu_power_avg_w = mon.power_sum / mon.gpu_samples;
        r->gpu_mem_max_mib = mon.mem_max_mib;
    }
    npyload_loader_destroy(L);
}

/* ------------------------------------------------------------------------ */
/* Machine                                                                    */
/* ------------------------------------------------------------------------ */

static void machine_info(nb_machine *m)
{
    memset(m, 0, sizeof *m);
    m->cores_online = (int)sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    m->cores_allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                   : m->cores_online;
    struct utsname u;
    if (uname(&u) == 0)
        snprintf(m->kernel, sizeof m->kernel, "%.60s %.60s", u.sysname, u.release);
    gethostname(m->hostname, sizeof m->hostname - 1);
    snprintf(m->library_version, sizeof m->library_version, "%s", npyload_version_string());
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "model name", 10) == 0) {
                char *p = strchr(line, ':');
                if (p) {
                    p++;
                    while (*p == ' ')
                        p++;
                    p[strcspn(p, "\n")] = 0;
                    snprintf(m->cpu_model, sizeof m->cpu_model, "%s", p);
                }
                break;
            }
        fclose(f);
    }
    f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "MemTotal:", 9) == 0) {
                m->mem_total_gib = strtod(line + 9, NULL) / (1024.0 * 1024.0);
                break;
            }
        fclose(f);
    }
}

/* ------------------------------------------------------------------------ */
/* main                                                                       */
/* ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    static nb_config cfg;
    opts o;
    memset(&o, 0, sizeof o);
    cfg.batch_size = 128;
    cfg.device = -1;
    cfg.seconds = 1.5;
    o.nworkers = parse_list("1,2", o.workers, NB_MAX_GRID, "--workers");
    o.nprefetch = parse_list("1,2,4", o.prefetch, NB_MAX_GRID, "--prefetch");
    o.io[0] = NPYLOAD_IO_AUTO;
    o.nio = 1;
    int seconds_given = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define NEED_ARG()                                                             \
    do {                                                                       \
        if (i + 1 >= argc)                                                     \
            die_usage("%s needs a value", a);                                  \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("npyload-bench %s\n", npyload_version_string());
            return 0;
        } else if (!strcmp(a, "--batch-size")) {
            NEED_ARG();
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > (1 << 24))
                die_usage("--batch-size: '%s' is not a positive integer", argv[i]);
            cfg.batch_size = (int)v;
        } else if (!strcmp(a, "--workers")) {
            NEED_ARG();
            o.nworkers = parse_list(argv[++i], o.workers, NB_MAX_GRID, a);
        } else if (!strcmp(a, "--prefetch")) {
            NEED_ARG();
            o.nprefetch = parse_list(argv[++i], o.prefetch, NB_MAX_GRID, a);
        } else if (!strcmp(a, "--io")) {
            NEED_ARG();
            o.nio = parse_io(argv[++i], o.io);
        } else if (!strcmp(a, "--shuffle")) {
            o.shuffle_mode = NPYLOAD_SHUFFLE_FULL;
        } else if (!strcmp(a, "--shuffle=local")) {
            o.shuffle_mode = NPYLOAD_SHUFFLE_LOCAL;
        } else if (!strcmp(a, "--shuffle=full")) {
            o.shuffle_mode = NPYLOAD_SHUFFLE_FULL;
        } else if (!strcmp(a, "--device")) {
            NEED_ARG();
            const char *d = argv[++i];
            if (!strcmp(d, "cpu"))
                cfg.device = -1;
            else if (!strcmp(d, "cuda"))
                cfg.device = 0;
            else if (!strncmp(d, "cuda:", 5) && d[5]) {
                char *end;
                long v = strtol(d + 5, &end, 10);
                if (*end || v < 0 || v > 1024)
                    die_usage("--device: '%s' (cpu, cuda or cuda:N)", d);
                cfg.device = (int)v;
            } else
                die_usage("--device: '%s' (cpu, cuda or cuda:N)", d);
        } else if (!strcmp(a, "--batches")) {
            NEED_ARG();
            char *end;
            long long v = strtoll(argv[++i], &end, 10);
            if (*end || v < 1)
                die_usage("--batches: '%s' is not a positive integer", argv[i]);
            cfg.batches = v;
        } else if (!strcmp(a, "--seconds")) {
            NEED_ARG();
            char *end;
            double v = strtod(argv[++i], &end);
            if (*end || !(v > 0) || v > 86400)
                die_usage("--seconds: '%s' is not a positive number", argv[i]);
            cfg.seconds = v;
            seconds_given = 1;
        } else if (!strcmp(a, "--compute-ms")) {
            NEED_ARG();
            char *end;
            double v = strtod(argv[++i], &end);
            if (*end || !(v >= 0) || v > 1e6)
                die_usage("--compute-ms: '%s' is not a number >= 0", argv[i]);
            cfg.compute_ms = v;
        } else if (!strcmp(a, "--cold")) {
            cfg.cold = 1;
        } else if (!strcmp(a, "--direct")) {
            cfg.direct = 1;
        } else if (!strcmp(a, "--json")) {
            NEED_ARG();
            o.json = argv[++i];
        } else if (!strcmp(a, "--plot")) {
            NEED_ARG();
            o.plot = argv[++i];
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            g_quiet = 1;
        } else if (a[0] != '-' && strchr(a, '=')) {
            if (cfg.nfields == NB_MAX_FIELDS)
                die_usage("at most %d fields", NB_MAX_FIELDS);
            nb_field_info *fi = &cfg.fields[cfg.nfields++];
            size_t nl = (size_t)(strchr(a, '=') - a);
            if (nl == 0 || nl >= sizeof fi->name)
                die_usage("'%s': a field is name=GLOB", a);
            memcpy(fi->name, a, nl);
            fi->name[nl] = 0;
            snprintf(fi->glob, sizeof fi->glob, "%s", a + nl + 1);
        } else {
            die_usage("unknown argument '%s'", a);
        }
#undef NEED_ARG
    }
    if (cfg.nfields == 0)
        die_usage("no field given (name=GLOB)");
    if (cfg.batches > 0 && seconds_given)
        die_usage("--batches and --seconds exclude each other");
    if (cfg.batches > 0)
        cfg.seconds = 0;
    cfg.shuffle = o.shuffle_mode;

    nb_machine mach;
    machine_info(&mach);

    /* Files, sizes, the batch in bytes. */
    uint64_t sample_bytes = 0, total_bytes = 0;
    cfg.num_samples = -1;
    for (int k = 0; k < cfg.nfields; k++) {
        load_field(&cfg.fields[k], &g_fields[k]);
        sample_bytes += g_fields[k].sample_bytes;
        total_bytes += g_fields[k].sample_bytes * (uint64_t)g_fields[k].nsamples;
        if (cfg.num_samples < 0 || g_fields[k].nsamples < cfg.num_samples) {
            if (cfg.num_samples >= 0)
                warn("fields hold different sample counts (%s: %lld); the loader "
                     "will refuse them", cfg.fields[k].name,
                     (long long)g_fields[k].nsamples);
            cfg.num_samples = g_fields[k].nsamples;
        }
    }
    cfg.batch_bytes = sample_bytes * (uint64_t)cfg.batch_size;
    if (cfg.num_samples < cfg.batch_size)
        warn("%lld samples is less than one batch of %d",
             (long long)cfg.num_samples, cfg.batch_size);

    int max_workers = 0;
    for (int i = 0; i < o.nworkers; i++)
        if (o.workers[i] > max_workers)
            max_workers = o.workers[i];
    if (max_workers > mach.cores_allowed)
        warn("up to %d workers on %d usable cores: more threads than cores",
             max_workers, mach.cores_allowed);

    g_hwm_ok = hwm_reset_works();
    if (!g_hwm_ok)
        warn("VmHWM cannot be reset here (/proc/self/clear_refs): peak RSS is "
             "sampled every 10 ms instead");

    size_t nl = strlen(cfg.note);
    if (cfg.device >= 0) {
        char nwhy[128] = "";
        if (nvml_open(cfg.device, nwhy, sizeof nwhy) != 0) {
            snprintf(cfg.note + nl, sizeof cfg.note - nl,
                     "GPU monitoring skipped: %s. ", nwhy);
            if (!g_quiet)
                fprintf(stderr, "npyload-bench: GPU monitoring skipped: %s\n", nwhy);
        } else {
            snprintf(cfg.note + nl, sizeof cfg.note - nl,
                     "GPU sampled with NVML every 100 ms (NVML index %d; it may "
                     "differ from the CUDA index under CUDA_VISIBLE_DEVICES). ",
                     cfg.device);
        }
        nl = strlen(cfg.note);
        if (cfg.compute_ms > 0)
            snprintf(cfg.note + nl, sizeof cfg.note - nl,
                     "compute is a GPU busy kernel of %.3g ms per batch on a stream "
                     "ordered after the batch's copy (npyload_compute_sim); stall is "
                     "the time spent in next(). ", cfg.compute_ms);
    } else {
        snprintf(cfg.note + nl, sizeof cfg.note - nl,
                 "device cpu: no GPU monitoring. ");
    }
    char why[256] = "";
    if (cfg.device >= 0 && !npyload_cuda_available(cfg.device, why, sizeof why)) {
        fprintf(stderr, "npyload-bench: --device cuda:%d: CUDA is not usable here: %s\n",
                cfg.device, why);
        return 2;
    }
    nl = strlen(cfg.note);
    if (cfg.cold)
        snprintf(cfg.note + nl, sizeof cfg.note - nl,
                 "cold: files evicted with POSIX_FADV_DONTNEED before each run; a "
                 "run stops at the end of its epoch. ");

    if (!g_quiet) {
        printf("npyload-bench %s on %s: %d cores (%d usable), %.1f GiB, %s\n",
               mach.library_version, mach.hostname, mach.cores_online,
               mach.cores_allowed, mach.mem_total_gib, mach.kernel);
        for (int k = 0; k < cfg.nfields; k++) {
            nb_field_info *fi = &cfg.fields[k];
            printf("  field %-10s %zu files, %lld samples, %s (", fi->name, fi->nfiles,
                   (long long)g_fields[k].nsamples, fi->descr);
            for (int d = 0; d < fi->ndim; d++)
                printf("%s%lld", d ? "," : "", (long long)fi->shape[d]);
            printf("), %.3f MiB/sample\n", fi->sample_bytes / 1048576.0);
        }
        printf("  batch %d = %.2f MiB; dataset %.2f GiB; %s; %s\n", cfg.batch_size,
               cfg.batch_bytes / 1048576.0, total_bytes / 1073741824.0,
               o.shuffle_mode == NPYLOAD_SHUFFLE_FULL    ? "full shuffle"
               : o.shuffle_mode == NPYLOAD_SHUFFLE_LOCAL ? "local shuffle"
                                                         : "in order",
               cfg.cold ? "cold cache" : "page cache");
        fflush(stdout);
    }

    /* Page cache: read everything once, if it fits. */
    if (!cfg.cold) {
        double avail = mem_available_gib();
        if (avail > 0 && total_bytes / 1073741824.0 > 0.6 * avail)
            warn("the dataset (%.1f GiB) does not fit in the page cache (%.1f GiB "
                 "available): 'hot' numbers are partly disk-bound; try --cold",
                 total_bytes / 1073741824.0, avail);
        else
            warm_all(cfg.nfields);
    }

    /* Ceilings first, in the same run. */
    nb_ceiling ceilings[3];
    size_t nceil = 0;
    memset(ceilings, 0, sizeof ceilings);
    double ceil_seconds = cfg.seconds > 0 ? cfg.seconds : 1.0;
    if (ceil_seconds > 3)
        ceil_seconds = 3;
    if (!g_quiet) {
        printf("ceilings:\n");
        fflush(stdout);
    }
    ceiling_copy(&cfg, o.shuffle_mode, max_workers, ceil_seconds, &ceilings[nceil++]);
    double ref = ceilings[0].measured ? ceilings[0].gbps : 0;
    snprintf(cfg.ceiling_ref, sizeof cfg.ceiling_ref, "%s",
             ceilings[0].measured ? ceilings[0].name : "");
    if (cfg.cold) {
        ceiling_odirect(cfg.nfields, ceil_seconds, &ceilings[nceil]);
        if (ceilings[nceil].measured) {
            ref = ceilings[nceil].gbps;
            snprintf(cfg.ceiling_ref, sizeof cfg.ceiling_ref, "%.31s", ceilings[nceil].name);
        }
        nceil++;
    }
    if (cfg.device >= 0) {
        nb_ceiling *c = &ceilings[nceil++];
        snprintf(c->name, sizeof c->name, "h2d_pinned");
        size_t bytes = cfg.batch_bytes < (256u << 20) ? (size_t)cfg.batch_bytes : 256u << 20;
        int rc = npyload_cuda_h2d_bandwidth(cfg.device, bytes, 20, &c->gbps);
        if (rc == 0) {
            c->measured = 1;
            c->threads = 1;
            c->bytes = (uint64_t)bytes * 20;
            c->seconds = c->gbps > 0 ? (double)c->bytes / (c->gbps * 1e9) : 0;
            snprintf(c->note, sizeof c->note,
                     "pinned cudaMemcpyAsync, %zu bytes per copy, 20 copies", bytes);
            if (ref <= 0 || c->gbps < ref) {
                ref = c->gbps;
                snprintf(cfg.ceiling_ref, sizeof cfg.ceiling_ref, "%s", c->name);
            }
        } else {
            snprintf(c->note, sizeof c->note, "failed: %s", npyload_strerror(rc));
        }
    }
    if (!g_quiet) {
        for (size_t i = 0; i < nceil; i++) {
            if (ceilings[i].measured)
                printf("  %-14s %7.2f GB/s  (%s)%s\n", ceilings[i].name, ceilings[i].gbps,
                       ceilings[i].note,
                       strcmp(ceilings[i].name, cfg.ceiling_ref) ? "" : "  <- reference");
            else
                printf("  %-14s    skipped  (%s)\n", ceilings[i].name, ceilings[i].note);
        }
        fflush(stdout);
    }

    /* The grid. */
    size_t nruns = (size_t)(o.nio * o.nworkers * o.nprefetch);
    nb_run *runs = calloc(nruns, sizeof *runs);
    if (!runs) {
        perror("npyload-bench");
        return 1;
    }
    g_prog.on = !g_quiet && isatty(STDERR_FILENO);
    g_prog.total = (int)nruns;
    g_prog.t_start = now_ns();
    if (!g_quiet) {
        printf("%-8s %-8s %3s %3s %10s %7s %6s %8s %8s %7s %6s %8s %9s\n", "io", "used",
               "w", "p", "samples/s", "GB/s", "ceil%", "p50 ms", "p99 ms", "stall%",
               "cpu%", "rss MiB", "slots MiB");
        fflush(stdout);
    }
    size_t ri = 0;
    int nok = 0;
    for (int a = 0; a < o.nio; a++)
        for (int wi = 0; wi < o.nworkers; wi++)
            for (int pi = 0; pi < o.nprefetch; pi++) {
                nb_run *r = &runs[ri++];
                progress(0, "starting");
                run_one(&cfg, &o, o.workers[wi], o.prefetch[pi], o.io[a], ref, r);
                g_prog.done++;
                progress_clear();
                nok += r->ok;
                if (g_quiet)
                    continue;
                if (r->ok) {
                    char ceil[16] = "-";
                    if (r->frac_of_ceiling >= 0)
                        snprintf(ceil, sizeof ceil, "%.0f", 100 * r->frac_of_ceiling);
                    printf("%-8s %-8s %3d %3d %10.0f %7.3f %6s %8.2f %8.2f %7.1f %6.0f "
                           "%8.0f %9.1f\n",
                           r->io_requested_name, r->io_used, r->workers, r->prefetch,
                           r->samples_per_s, r->gbps, ceil, r->p50_ms, r->p99_ms,
                           r->stall_pct, r->cpu_pct, r->peak_rss_mib, r->slot_mib);
                } else {
                    printf("%-8s %-8s %3d %3d failed: %s\n", r->io_requested_name,
                           r->io_used, r->workers, r->prefetch, r->error);
                }
                if (r->gpu_samples)
                    printf("%28s gpu: util %.0f%% avg (%.0f%% max), %.0f W, %.0f MiB\n",
                           "", r->gpu_util_avg_pct, r->gpu_util_max_pct,
                           r->gpu_power_avg_w, r->gpu_mem_max_mib);
                fflush(stdout);
            }

    nb_recommendation rec;
    nb_recommend(runs, nruns, cfg.compute_ms, &rec);
    char line[256];
    nb_format_recommendation(&rec, cfg.compute_ms, line, sizeof line);
    if (!g_quiet && cfg.note[0])
        printf("note: %s\n", cfg.note);
    printf("%s\n", line);
    fflush(stdout);

    nb_report rep = {.config = &cfg, .machine = &mach, .ceilings = ceilings,
                     .nceilings = nceil, .runs = runs, .nruns = nruns, .rec = &rec,
                     .warnings = g_warnings};
    int status = nok ? 0 : 1;
    if (o.json && nb_write_json_file(o.json, &rep) != 0) {
        fprintf(stderr, "npyload-bench: %s: cannot write JSON: %s\n", o.json, strerror(errno));
        status = 1;
    }
    if (o.plot && nb_write_plot(o.plot, &rep) != 0) {
        fprintf(stderr, "npyload-bench: %s: cannot write the plot: %s\n", o.plot,
                strerror(errno));
        status = 1;
    }
    free(runs);
    return status;
}
