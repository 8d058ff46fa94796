/* npyload-bench: the types of a measurement and its pure, unit-tested logic:
 *   npyload_bench_recommend.c  percentiles, the recommendation
 *   npyload_bench_report.c     the JSON document and the text table
 *   npyload_bench_plot.c       the SVG heatmap
 * The measuring side (npyload_bench.c and npyload_bench_*.c beside it) has
 * its own header, npyload_bench_measure.h.
 *
 * Like every tool, this uses nothing of lib/ but include/npyload.h. */
#ifndef NPYLOAD_BENCH_H
#define NPYLOAD_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "npyload.h"

#define NB_MAX_FIELDS 16
#define NB_MAX_GRID 32   /* values per list option (--workers, --prefetch) */
#define NB_MAX_IO 4
#define NB_MAX_SOURCES 16 /* --source */

/* One measured configuration of the workers x prefetch x io grid. */
typedef struct nb_run {
    int workers;
    int prefetch;
    int io_requested;          /* npyload_io_backend asked for */
    char io_requested_name[16];
    char io_used[16];          /* npyload_backend_name(npyload_loader_backend) */
    int ok;                    /* 1 measured; 0 failed (error says why) */
    char error[256];

    uint64_t batches;          /* measured batches (warm-up excluded) */
    uint64_t samples;
    uint64_t bytes;            /* samples x bytes per sample, all fields */
    double wall_s;
    double samples_per_s;
    double gbps;               /* 1e9 bytes/s */
    double frac_of_ceiling;    /* gbps / ceiling gbps; < 0 when unknown */
    double p50_ms, p99_ms, max_ms; /* latency of next() (+ sync on cuda) */
    double stall_pct;          /* time in next() / wall, percent */
    double cpu_pct;            /* (user + sys) / wall, percent of one core */
    double peak_rss_mib;       /* VmHWM (reset per run) or sampled VmRSS */
    double base_rss_mib;       /* VmRSS before the loader was created */
    double slot_mib;           /* prefetch x batch bytes */
    int pinned;                /* slots page-locked (from npyload_stats) */
    int direct_io;
    uint64_t gather_bytes;     /* npyload_stats: the gather path's share */
    uint64_t gather_requests;
    uint64_t read_requests;
    uint64_t bytes_read;       /* npyload_stats.bytes_read, for gath% */
    uint64_t compressed_bytes_read; /* npyload_stats: .npy.zst frame bytes read */
    uint64_t decompressed_bytes;    /* ... and what they decompressed to */
    uint64_t decode_ns;             /* worker time decompressing, summed */
    uint64_t read_ahead_batches;    /* decoded with the next batch's reads in flight */
    uint64_t read_wait_ns;          /* worker time waiting for those reads */
    uint64_t transform_ns;          /* worker time in host transforms */
    uint64_t h2d_ns;                /* copy-engine time of the H2D copies */
    int repeats;                    /* measurements merged into this run (1;
                                       more for a repeated close candidate) */
    double spread;                  /* between them: stall points with a
                                       step, else % of gbps */
    npyload_stats timed;            /* the loader's counters over the timed
                                       part (summed over ranks; elapsed_ns
                                       the longest), for the verdict */
    int64_t source_samples[NB_MAX_SOURCES]; /* --source: rows of each source
                                       handed out in the timed part
                                       (npyload_loader_source_samples;
                                       summed over ranks) */

    /* --auto: the controller's counts at the end of the run (per rank) and
     * its decisions (npyload_stats); any run fills them. */
    int final_workers, final_slots;
    uint64_t auto_decisions;

    /* GPU monitoring (NVML), when sampled. */
    int gpu_samples;
    double gpu_util_avg_pct, gpu_util_max_pct;
    double gpu_power_avg_w;
    double gpu_mem_max_mib;
} nb_run;

/* A ceiling: what the machine itself gives on the same bytes. */
typedef struct nb_ceiling {
    char name[32];             /* "pread_copy", "odirect_uring", "h2d_pinned" */
    int measured;              /* 0: skipped (note says why) */
    double gbps;
    int threads;
    uint64_t bytes;
    double seconds;
    char note[256];
} nb_ceiling;

typedef struct nb_machine {
    int cores_online;
    int cores_allowed;         /* sched_getaffinity */
    char kernel[128];          /* uname -sr */
    char cpu_model[128];
    double mem_total_gib;
    char library_version[32];
    char hostname[64];
    npyload_build_info build_info; /* the JSON's "build_info" (npyload_info_print.h) */
} nb_machine;

/* With --compute-ms, runs whose stall is within this many points of the
 * least are equal (two runs of one configuration differ by about that on
 * a quiet machine): the recommendation takes the least memory among them. */
#define NB_STALL_NOISE 2.0
/* Measuring by time (--seconds), a run goes on until it has at least
 * NB_MIN_BATCHES batches, unless that takes NB_MAX_RUN_S seconds (a warning
 * says so then). */
#define NB_MIN_BATCHES 10
#define NB_MAX_RUN_S 60

/* The table's column legend (printed after the table and in --help). */
extern const char nb_legend[];

typedef struct nb_recommendation {
    int valid;
    int run_index;             /* index into the runs; workers/prefetch match it */
    int workers;
    int prefetch;
    char io[16];
    double gbps;
    double samples_per_s;
    double frac_of_best;       /* gbps / best gbps */
    double stall_pct;
    double slot_mib;
    char criterion[96];        /* which rule chose it */
    char verdict[512];         /* nb_verdict of the chosen run (set by the caller) */
    char next_steps[640];      /* nb_next_steps: what to do next */
    char close[512];           /* the close candidates repeated and what the
                                  repeat showed ("" when none were) */
} nb_recommendation;

typedef struct nb_field_info {
    char name[64];
    char glob[512];            /* as given; reports show it through
                                  npyload_mask_urls (a URL's password) */
    char transform[128];       /* --transform SPEC as given ("" none) */
    int has_transform;
    npyload_transform t;       /* parsed; mean/std and the flip signs point
                                  into the arrays */
    float mean[16], std[16], hsign[16], vsign[16];
    size_t nfiles;
    int64_t nsamples;          /* samples in the field's files */
    uint64_t sample_bytes;
    char descr[NPYLOAD_DESCR_LEN];
    int ndim;                  /* per-sample ndim */
    int64_t shape[8];
    int source;                /* --source: the source's index; -1 without */
} nb_field_info;

typedef struct nb_config {
    int batch_size;
    int shuffle;
    int device;                /* -1 cpu */
    int64_t batches;           /* > 0: count-bounded */
    double seconds;            /* time bound per configuration */
    double compute_ms;         /* simulated step; 0 none */
    int cold;
    int direct;
    int64_t warmup_batches;    /* --warmup-batches N: batches before the timed
                                  part, wrapping epochs; -1 (default): prefetch
                                  + 1, at most 4 (1 with --cold, none for
                                  --auto) */
    int no_read_ahead;         /* --no-read-ahead: READ_AHEAD -1 */
    int64_t seed;              /* --seed (0 by default, as the Loader's) */
    int seed_given;
    int drop_last;             /* --drop-last */
    int ranks;                 /* --ranks R: R loaders at once (rank r of R), as
                                  torchrun --nproc_per_node=R runs them; a
                                  run's workers and prefetch are per rank, its
                                  samples/s the node's total */
    int nfields;
    nb_field_info fields[NB_MAX_FIELDS]; /* with --source, every source's
                                            fields, source by source */
    /* A mixture (--source NAME=FIELD=GLOB,..., --weights NAME=W,...): the
     * sources in order, their weights (weights_given 0: the library's
     * default, each source's sample count). */
    int nsources;
    char sources[NB_MAX_SOURCES][64];
    double weights[NB_MAX_SOURCES];
    int weights_given;
    int64_t num_samples;
    uint64_t batch_bytes;      /* batch_size x bytes per sample, all fields */
    char ceiling_ref[32];      /* the ceiling runs are compared with ("" none) */
    char note[768];            /* notes about the measurement (cuda compute, ...) */
    /* Remote fields (s3://, http(s)://): the configuration every loader of
     * the grid gets (from the AWS environment; never written out, it holds
     * the secret); NULL when every field is local. */
    const npyload_remote *remote;
} nb_config;

/* The source of field k (--source), or -1 without sources (a config
 * zeroed by hand has none). */
static inline int nb_field_source(const nb_config *c, int k)
{
    return c->nsources ? c->fields[k].source : -1;
}

/* Remote fields: the store's ranged-GET sweep (the experimental
 * npyload_rget_measure) and the workers and requests in flight it
 * recommends. */
#define NB_REMOTE_POINTS 16
typedef struct nb_remote_point {
    int concurrency, threads, inflight;
    double requests_per_s, mb_per_s;
    double p50_ms, p99_ms;     /* < 0: not measured (inflight > 1) */
} nb_remote_point;
typedef struct nb_remote_report {
    int measured;              /* 0: the sweep failed (note says why) */
    uint64_t objects, object_bytes, bytes_per_request;
    double seconds;            /* per point */
    int npoints;
    nb_remote_point points[NB_REMOTE_POINTS];
    double best_mb_per_s;
    int concurrency, workers, max_inflight; /* the recommendation */
    uint64_t requests, retries; /* of the sweep */
    char note[256];
} nb_remote_report;

/* Compression (npyload_bench_zst.c measures, npyload_bench_zst_report.c
 * reports): for .npy.zst fields the decode ceiling of the cores; for raw
 * .npy fields an estimate of what npyload-pack would give here. */
typedef struct nb_zst_field {
    char name[64];
    int compressed;            /* 1: its files are .npy.zst */
    int frames;                /* frames sampled */
    uint64_t samples_per_frame;
    uint64_t raw_bytes;        /* decompressed bytes of the sampled frames */
    uint64_t zst_bytes;        /* their compressed bytes */
    double ratio;              /* raw_bytes / zst_bytes */
    double decode_gbps;        /* all threads, decompressed GB/s */
    double compress_mbps_per_core; /* estimate: zstd at `level`, one thread */
} nb_zst_field;

typedef struct nb_zst_report {
    int valid;                 /* 0: nothing measured (note says why) */
    int estimate;              /* 1: raw fields, what packing would give */
    int level;                 /* estimate: the zstd level (npyload-pack's) */
    uint64_t frame_size;       /* estimate: target bytes per frame */
    int threads;               /* decode threads (all usable cores) */
    int nfields;
    nb_zst_field fields[NB_MAX_FIELDS];
    double ratio;              /* per batch: all fields' bytes / compressed */
    double decode_gbps;        /* batch GB/s the cores decode (raw fields free) */
    double decode_gbps_per_core;
    double compress_mbps_per_core; /* estimate: per batch, one core */
    double dataset_gib, packed_gib, mem_available_gib;
    /* samples/s; < 0 unknown. Sources name the measurement used. */
    double raw_cold_sps, raw_warm_sps;
    char raw_cold_source[32], raw_warm_source[32];
    double expected_cold_sps, expected_warm_sps;
    /* Like with like: the raw runs' worker CPU time per sample (reads or
     * copies and the transforms), the transforms' part of it, and the
     * workers that spent it (<= 0 unknown). Packed data costs the copy of
     * ratio-times fewer bytes, the decode and the same transforms, on the
     * same workers. */
    double raw_cpu_ns_per_sample, transform_ns_per_sample;
    int workers;
    double packed_cpu_ns_per_sample; /* the judge's estimate; < 0 unknown */
    int pays;                  /* 1 yes, 0 no, -1 not judged (packed fields) */
    char verdict[512];
    char note[256];
} nb_zst_report;

typedef struct nb_report {
    const nb_config *config;
    const nb_machine *machine;
    const nb_ceiling *ceilings;
    size_t nceilings;
    const nb_run *runs;
    size_t nruns;
    const nb_recommendation *rec;
    const char *warnings;      /* newline-separated, may be NULL */
    const nb_zst_report *zst;  /* NULL: "compression": null */
    const nb_remote_report *remote; /* NULL: "remote": null (local fields) */
    const struct nb_auto_cmp *autocmp; /* --auto; NULL: "auto": null */
} nb_report;

/* --auto: the auto loader (NUM_WORKERS and PREFETCH NPYLOAD_AUTO) measured
 * as a grid run is, against the best fixed configuration of the grid. */
typedef struct nb_auto_cmp {
    nb_run run;                /* workers/prefetch: its counts at the end */
    int best_index;            /* the grid's fastest run (samples/s); -1 none */
    double ratio;              /* run.samples_per_s / the best's; < 0 none */
    int least_stall_index;     /* with a step: the grid's least stall; -1 */
    double stall_points;       /* with a step: run.stall_pct minus that
                                  run's stall (points); NAN without */
} nb_auto_cmp;

/* ---- npyload_bench_recommend.c ---- */

/* Percentile p in [0,100] of v[0..n) with linear interpolation between
 * closest ranks (numpy's default). Sorts v in place. n == 0 gives 0. */
double nb_percentile(double *v, size_t n, double p);

/* Recommendation.
 * Without compute (compute_ms <= 0): among the runs that succeeded, the
 * "smallest" configuration whose throughput (GB/s) is at least 95 % of the
 * best run's.
 * Only runs of two slots or more are candidates (one slot cannot overlap
 * a read with the step holding its batch), unless no run has two.
 * With compute (compute_ms > 0): stall first, memory second: among the
 * runs whose stall is within nb_noise points of the least measured,
 * the one with the least slot memory (then fewer workers, then faster).
 * "Smallest" (without compute) orders by workers, then prefetch (fewest
 * threads first, then least slot memory); among runs with equal (workers,
 * prefetch) — other io backends — the higher throughput wins, then the
 * earlier run.
 * The result always names one measured run (run_index).
 * @return : run_index, or -1 when no run succeeded (out->valid = 0). */
int nb_recommend(const nb_run *runs, size_t n, double compute_ms,
                 nb_recommendation *out);

/* The close candidates of a recommendation: the runs it may pick that are
 * as good as its criterion's best within noise (with a step: stall within
 * NB_STALL_NOISE points of the least; without: within 5 % of the best
 * gbps), the pick first, then the closest, at most `max`. The bench
 * measures each once more (nb_merge_repeat) and recommends again, so that
 * one lucky or unlucky run does not decide. @return : how many (0 or 1:
 * nothing to repeat). */
size_t nb_close_candidates(const nb_run *runs, size_t n, double compute_ms,
                           const nb_recommendation *rec, int *idx, size_t max);

/* Merges a repeat b into run a: throughput, stall, cpu and latencies are
 * the mean of the measurements, counters summed; repeats and spread (the
 * criterion's largest difference between them) updated. */
void nb_merge_repeat(nb_run *a, const nb_run *b, double compute_ms);

/* One line for rec->close: the candidates with their measurements and
 * whether the repeat separated them or they are within noise (then the
 * least memory was picked). */
void nb_format_close(const nb_run *runs, size_t n_all, const int *idx, size_t n,
                     double compute_ms, nb_recommendation *rec);

/* The noise of the criterion: NB_STALL_NOISE points (with a step) or 5 %
 * of gbps, or half the largest spread measured between a repeated run's
 * measurements when that is more. nb_recommend and the close candidates
 * use it. */
double nb_noise(const nb_run *runs, size_t n, double compute_ms);

/* --auto: fills c's comparison of c->run with the succeeded runs of the
 * grid: the fastest (best_index, ratio), and with a step (compute_ms > 0)
 * the least stall (least_stall_index, stall_points). */
void nb_auto_compare(const nb_run *runs, size_t n, double compute_ms, nb_auto_cmp *c);

/* One line: "auto: 2 workers, 4 slots at the end (3 decisions): 9100
 * samples/s = 0.97 of the best fixed (w=2 p=4, 9400 samples/s)", with a
 * step also "; stall 1.2% = +0.9 points over the least (w=1 p=4)". */
void nb_format_auto(const nb_auto_cmp *c, const nb_run *runs, double compute_ms, char *buf,
                    size_t len);

/* One line: "recommend: num_workers=2 prefetch=4 (1.93 GB/s, 97% of best,
 * 512 MiB of slots)". */
void nb_format_recommendation(const nb_recommendation *r, double compute_ms,
                              char *buf, size_t len);

/* Where the recommended run's time went, in one line naming the bottleneck
 * and what to do about it: npyload_stats_verdict (its rules, npyload.h) on
 * the run's counters over the timed part; without a step (compute_ms 0)
 * the loop only waits, so the consumer is never named. */
void nb_verdict(const nb_run *r, double compute_ms, char *buf, size_t len);

/* "What to do next": a short paragraph derived from rec->verdict (set
 * first), the recommended run r, the compression report z (may be NULL)
 * and the cores: the consumer -> the model step; the disk -> pack (with
 * the expected figure when packing pays), more workers with --cold; decode
 * -> level/narrow/raw; host transforms -> the GPU; H2D -> dtype on the
 * wire; CPU copies -> more workers while cores are free, else the machine's
 * copy rate. */
void nb_next_steps(const nb_config *cfg, const nb_recommendation *rec, const nb_run *r,
                   const nb_zst_report *z, int cores, char *buf, size_t len);

/* The recommendation as lines to paste: the npyload.Loader(...) call (its
 * prefetch is the slots - 1 the Python loader counts) and the C
 * npyload_loader_set calls (PREFETCH in slots), with the measured run's
 * values: both build that run's loader. */
/* The recommendation's tuning arguments alone ("num_workers=2,
 * prefetch=3, io=\"uring\""), for a Loader(...) call the user already has.
 * @return : buf. */
const char *nb_tuning_args(const nb_recommendation *r, char *buf, size_t len);

void nb_format_paste(const nb_config *cfg, const nb_recommendation *r, char *py,
                     size_t pylen, char *c, size_t clen);

/* ---- npyload_bench_report.c ---- */

/* JSON document (see bench/schema.json). @return : 0 or -1 on I/O error. */
int nb_write_json(FILE *f, const nb_report *rep);
int nb_write_json_file(const char *path, const nb_report *rep);

/* The text report on stdout, piece by piece as the measurement goes: the
 * machine and the data, the ceilings (`ref`: the reference's name), the
 * table's header, one row per run. */
void nb_print_setup(FILE *f, const nb_config *c, const nb_machine *m, uint64_t total_bytes);
void nb_print_ceilings(FILE *f, const nb_ceiling *ce, size_t n, const char *ref);
void nb_print_table_header(FILE *f);
void nb_print_run(FILE *f, const nb_run *r);
/* --source: the rows each source gave in run r's timed part, and their
 * shares, on one line (nothing without sources or for a failed run). */
void nb_print_sources(FILE *f, const nb_config *c, const nb_run *r);

/* ---- npyload_bench_zst_report.c ---- */

/* The expected samples/s and the verdict of an estimate from its measured
 * parts (ratio, decode_gbps, raw_*_sps, sizes); `disk_bound`: the raw data
 * is read from disk (--cold, or it does not fit in the page cache);
 * `sample_bytes`: all fields' bytes per sample. Pure. */
void nb_zst_judge(nb_zst_report *z, uint64_t sample_bytes, int disk_bound);
/* "compression": {...} or null, after the other top-level keys. */
void nb_json_compression(FILE *f, const nb_zst_report *z);
/* The text section ("compression:" lines and the packing line). */
void nb_print_compression(FILE *f, const nb_zst_report *z);

/* ---- npyload_bench_plot.c ---- */

/* SVG heatmap of the workers x prefetch grid, one panel per io backend:
 * GB/s, or stall % when compute_ms > 0; the recommended cell framed.
 * @return : 0, or -1 (no run, or an I/O error: errno says which). */
int nb_write_plot(const char *path, const nb_report *rep);

#endif
