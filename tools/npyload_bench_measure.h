/* npyload-bench, the measuring side: declarations shared by
 *   npyload_bench.c          the command line and the order of the work
 *   npyload_bench_data.c     the fields' files: headers, eviction, warming;
 *                            the clock and the warnings
 *   npyload_bench_ceiling.c  the machine's ceilings (pread copy, O_DIRECT)
 *   npyload_bench_measure.c  one configuration of the grid, monitoring
 *   npyload_bench_zst.c      .npy.zst: decode ceiling, packing estimate
 *   npyload_bench_gpu.c      the only caller of the CUDA bench helpers
 *                            (npyload_cuda_h2d_bandwidth, npyload_compute_sim)
 * (the order of their calls: the comment at the top of npyload_bench.c).
 * Like every tool, this uses nothing of lib/ but include/npyload.h and the
 * non-installed tools/support library. */
#ifndef NPYLOAD_BENCH_MEASURE_H
#define NPYLOAD_BENCH_MEASURE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "npyload.h"
#include "npyload_bench.h"
#include "npyload.h" /* with NPYLOAD_EXPERIMENTAL (CMake): the simulator, NVML, the GET sweep */

/* One NPY file of a field, open for the ceilings and the eviction. */
typedef struct nb_file {
    char *path;
    int fd;
    uint64_t data_offset;
    uint64_t data_bytes;
    uint64_t file_bytes;
    int64_t nsamples;
    int64_t first; /* global index of its first sample */
    int zst;       /* a .npy.zst: data_offset 0, data_bytes = file_bytes =
                      its compressed size (what a cold read moves) */
} nb_file;

typedef struct nb_data {
    nb_file *files;
    size_t nfiles;
    uint64_t sample_bytes;
    int64_t nsamples;
} nb_data;

/* The progress bar on stderr (only when it is a terminal). */
typedef struct nb_progress {
    int on;
    int total, done;
    uint64_t t_start, last_draw;
    int drawn;
} nb_progress;

/* Everything one bench invocation shares between its parts. */
typedef struct nb_ctx {
    nb_data data[NB_MAX_FIELDS];
    int nfields;
    int quiet;
    int hwm_ok;            /* VmHWM can be reset (else VmRSS is sampled) */
    npyload_nvml *nvml;    /* NULL: no GPU monitoring */
    nb_progress prog;
    char warnings[8192];   /* newline-separated, for the JSON */
    /* Remote fields: the client their headers are read with; NULL when
     * every field is local (with one, the local ceilings, the page cache
     * and the compression estimate are skipped; remote files have fd -1). */
    npyload_remote_client *rclient;
} nb_ctx;

/* ---- npyload_bench_data.c ---- */
uint64_t nb_now_ns(void);
void nb_sleep_ns(uint64_t ns);
/* Prints "npyload-bench: warning: ..." and keeps it for the JSON. */
void nb_warn(nb_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Globs and reads the headers of one field. @return : 0, or -1 with the
 * reason on stderr. */
int nb_load_field(nb_ctx *ctx, nb_field_info *fi, nb_data *d);
/* The file holding global sample s. */
const nb_file *nb_sample_file(const nb_data *d, int64_t s);
/* --cold: drops every file from the page cache; warns (once, when `check`)
 * when sampled pages stay resident. */
void nb_evict_all(nb_ctx *ctx, int check);
/* Reads every file once so that hot runs start from the page cache. */
void nb_warm_all(const nb_ctx *ctx);
double nb_mem_available_gib(void);
/* The loader's order for (shuffle_mode, batch, epoch), from the library's
 * npyload_order_indices. NULL when out of memory or refused. */
int64_t *nb_make_order(const nb_ctx *ctx, int64_t n, int shuffle_mode, int batch,
                       uint64_t epoch);
/* kB value of "Key:" in /proc/self/status, or -1. */
long nb_proc_status_kb(const char *key);

/* ---- npyload_bench_ceiling.c ---- */
void nb_ceiling_copy(const nb_ctx *ctx, const nb_config *cfg, int threads, double seconds,
                     nb_ceiling *out);
/* gather_copy: the same samples in the same order, memcpy from the files
 * mapped once (the reference for small rows, where a syscall per row is
 * most of the cost). */
void nb_ceiling_gather(const nb_ctx *ctx, const nb_config *cfg, int threads, double seconds,
                       nb_ceiling *out);
void nb_ceiling_odirect(nb_ctx *ctx, const nb_config *cfg, double seconds, nb_ceiling *out);

/* ---- npyload_bench_zst.c ---- */
/* 1 if some field has .npy.zst files. */
int nb_zst_any(const nb_ctx *ctx);
/* zst_decode: `threads` threads decompress sampled frames of the packed
 * fields from memory; fills `z` (mode "packed"). */
void nb_zst_decode_ceiling(nb_ctx *ctx, const nb_config *cfg, int threads, double seconds,
                           nb_zst_report *z, nb_ceiling *out);
/* zst_cold: min(odirect_uring x ratio, zst_decode). */
void nb_zst_cold_ceiling(const nb_zst_report *z, const nb_ceiling *odirect, nb_ceiling *out);
/* After the grid: for raw fields the packing estimate (may run an O_DIRECT
 * read for the raw cold figure, evicting the files), then the judgement. */
void nb_zst_after_grid(nb_ctx *ctx, const nb_config *cfg, int threads, const nb_ceiling *ce,
                       size_t nce, const nb_run *runs, size_t nruns, uint64_t total_bytes,
                       nb_zst_report *z);

/* ---- npyload_bench_gpu.c ---- */
/* h2d_pinned: pinned host-to-device copies of one batch (at most 256 MiB). */
void nb_ceiling_h2d(const nb_config *cfg, nb_ceiling *out);
/* The simulated training step on a GPU: a busy kernel on a stream of its
 * own. NULL (with `why`) when the driver API cannot be loaded. */
typedef struct nb_gpu_step nb_gpu_step;
nb_gpu_step *nb_gpu_step_create(int device, char *why, size_t whylen);
/* Makes the step's stream wait for b's copy, queues ns of busy kernel and
 * releases b on that stream. */
void nb_gpu_step_run(nb_gpu_step *s, npyload_batch *b, uint64_t ns);
void nb_gpu_step_sync(nb_gpu_step *s);
void nb_gpu_step_destroy(nb_gpu_step *s);

/* ---- npyload_bench_measure.c ---- */
/* Resets VmHWM, and tells whether resetting really works here. */
int nb_hwm_reset_works(void);
void nb_progress_start(nb_progress *p, int total, int quiet);
/* One configuration of the grid, measured into r. */
void nb_run_one(nb_ctx *ctx, const nb_config *cfg, int workers, int prefetch, int io,
                double ceiling_gbps, nb_run *r);
const char *nb_io_name(int io);

#endif
