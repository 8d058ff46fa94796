/* npyload-bench, the data: the fields' files (headers read with the
 * library's npyload_read_header), eviction from and warming of the page
 * cache, and the loader's sample order for the copy ceiling. */
#include "npyload_bench_measure.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

uint64_t nb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void nb_sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

void nb_warn(nb_ctx *ctx, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "npyload-bench: warning: %s\n", buf);
    size_t l = strlen(ctx->warnings);
    if (l + strlen(buf) + 2 < sizeof ctx->warnings)
        snprintf(ctx->warnings + l, sizeof ctx->warnings - l, "%s\n", buf);
}

/* The NPY header of a .npy.zst (validated as the loader does; a remote
 * one read with ranged GETs) and its compressed size. @return : 0, or an
 * error with "PATH: problem". */
static int zst_read_header(npyload_remote_client *rc_, const char *path, npyload_header *h,
                           uint64_t *zbytes, char *err, size_t errlen)
{
    npyload_zst_file *z = NULL;
    int rc = rc_ ? npyload_remote_inspect(rc_, path, h, &z, err, errlen)
                 : npyload_zst_file_open(path, &z, err, errlen);
    if (rc != 0)
        return rc;
    if (!z) { /* remote: a .npy after all */
        *zbytes = 0;
        return 0;
    }
    const npyload_zst_facts *f = npyload_zst_file_facts(z);
    *h = f->hdr;
    if (f->narrow_values) { /* the values the loader delivers, not the codes */
        memcpy(h->descr, f->value_descr, sizeof h->descr);
        h->itemsize = f->value_itemsize;
        h->data_bytes *= f->value_itemsize;
    }
    *zbytes = f->compressed_bytes;
    npyload_zst_file_close(z);
    return 0;
}

/* kB value of "Key:" in /proc/self/status, or -1. */
long nb_proc_status_kb(const char *key)
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

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The field's paths, sorted (*paths, *n: npyload_paths_free them): glob(3),
 * or a remote listing (an s3:// pattern; an http(s):// URL is itself).
 * @return : 0, or -1 after saying why. */
static int field_paths(nb_ctx *ctx, const nb_field_info *fi, char ***paths, size_t *n)
{
    if (npyload_is_remote(fi->glob)) {
        char err[1024];
        if (npyload_remote_glob(ctx->rclient, fi->glob, paths, n, err, sizeof err) == 0)
            return 0;
        fprintf(stderr, "npyload-bench: field '%s': %s\n", fi->name, err);
        return -1;
    }
    glob_t g;
    int rc = glob(fi->glob, 0, NULL, &g);
    if (rc != 0 || g.gl_pathc == 0) {
        fprintf(stderr, "npyload-bench: field '%s': no file matches '%s'\n",
                fi->name, fi->glob);
        if (rc == 0)
            globfree(&g);
        return -1;
    }
    qsort(g.gl_pathv, g.gl_pathc, sizeof(char *), cmp_str);
    /* In the remote listing's form, so that one free serves both. */
    size_t want = g.gl_pathc, k = 0;
    char **v = malloc(want * sizeof *v);
    while (v && k < want && (v[k] = strdup(g.gl_pathv[k])))
        k++;
    globfree(&g);
    if (!v || k < want) {
        npyload_paths_free(v, k);
        perror("npyload-bench");
        return -1;
    }
    *paths = v;
    *n = k;
    return 0;
}

int nb_load_field(nb_ctx *ctx, nb_field_info *fi, nb_data *bf)
{
    char **pathv;
    size_t npaths;
    int rc;
    if (field_paths(ctx, fi, &pathv, &npaths) != 0)
        return -1;
    npyload_remote_client *rcl = npyload_is_remote(fi->glob) ? ctx->rclient : NULL;
    bf->nfiles = npaths;
    bf->files = calloc(bf->nfiles, sizeof *bf->files);
    if (!bf->files) {
        perror("npyload-bench");
        npyload_paths_free(pathv, npaths);
        return -1;
    }
    int64_t first = 0;
    for (size_t i = 0; i < bf->nfiles; i++) {
        nb_file *f = &bf->files[i];
        npyload_header h;
        char err[512];
        uint64_t zbytes = 0; /* a .npy.zst: its compressed size */
        if (rcl || npyload_zst_probe(pathv[i]) == 1)
            rc = zst_read_header(rcl, pathv[i], &h, &zbytes, err, sizeof err);
        else
            rc = npyload_read_header(pathv[i], &h, err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, "npyload-bench: %s\n", err[0] ? err : npyload_strerror(rc));
            goto fail;
        }
        if (h.ndim < 1 || h.shape[0] < 1) {
            fprintf(stderr, "npyload-bench: %s: no sample axis (shape has %d dims)\n",
                    pathv[i], h.ndim);
            goto fail;
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
                    pathv[i], (unsigned long long)sb, bf->files[0].path,
                    (unsigned long long)bf->sample_bytes);
            goto fail;
        }
        f->path = strdup(pathv[i]);
        f->fd = rcl ? -1 : open(f->path, O_RDONLY | O_CLOEXEC);
        if (f->fd < 0 && !rcl) {
            fprintf(stderr, "npyload-bench: %s: %s\n", f->path, strerror(errno));
            goto fail;
        }
        f->data_offset = h.data_offset;
        f->data_bytes = h.data_bytes;
        f->file_bytes = h.file_bytes;
        if (zbytes) {
            f->zst = 1;
            f->data_offset = 0;
            f->data_bytes = f->file_bytes = zbytes;
        }
        f->nsamples = h.shape[0];
        f->first = first;
        first += h.shape[0];
    }
    bf->nsamples = first;
    fi->nfiles = bf->nfiles;
    fi->nsamples = first;
    fi->sample_bytes = bf->sample_bytes;
    npyload_paths_free(pathv, npaths);
    return 0;
fail:
    npyload_paths_free(pathv, npaths);
    return -1;
}

/* The file holding global sample s of a field (binary search). */
const nb_file *nb_sample_file(const nb_data *bf, int64_t s)
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
void nb_evict_all(nb_ctx *ctx, int verbose_warn)
{
    uint64_t resident = 0, checked = 0;
    for (int k = 0; k < ctx->nfields; k++) {
        nb_data *bf = &ctx->data[k];
        size_t stride = bf->nfiles > 8 ? bf->nfiles / 8 : 1;
        for (size_t i = 0; i < bf->nfiles; i++) {
            int fd = bf->files[i].fd;
            if (fd < 0)
                continue; /* remote */
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
        nb_warn(ctx, "--cold: %.0f%% of the sampled pages stayed in the page cache after "
             "POSIX_FADV_DONTNEED (mapped by another process, or a filesystem "
             "that ignores the advice): cold numbers are partly warm",
             100.0 * (double)resident / (double)checked);
    }
}

/* Reads every file once so that the hot runs start from the page cache. */
void nb_warm_all(const nb_ctx *ctx)
{
    size_t n = 4u << 20;
    char *buf = malloc(n);
    if (!buf)
        return;
    for (int k = 0; k < ctx->nfields; k++)
        for (size_t i = 0; i < ctx->data[k].nfiles; i++) {
            int fd = ctx->data[k].files[i].fd;
            if (fd < 0)
                continue; /* remote */
            off_t off = 0;
            ssize_t r;
            while ((r = pread(fd, buf, n, off)) > 0)
                off += r;
        }
    free(buf);
}

double nb_mem_available_gib(void)
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

/* The library's own order (npyload_order_indices), so the ceiling reads
 * the samples in the pattern the loader reads them; LOCAL needs the first
 * field's file sizes. NULL when out of memory or the order is refused. */
int64_t *nb_make_order(const nb_ctx *ctx, int64_t n, int shuffle_mode, int batch,
                       uint64_t epoch)
{
    const nb_data *f0 = &ctx->data[0];
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
