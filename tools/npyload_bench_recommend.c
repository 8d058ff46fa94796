/* npyload-bench, recommending: percentiles of the latencies and the rule that
 * picks num_workers and prefetch from the measured runs (the rule is in
 * npyload_bench.h and bench/README.md). Pure: nothing here measures, so
 * tests/test_bench_report.c checks it on synthetic runs. */
#include "npyload_bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Percentiles                                                                */
/* ------------------------------------------------------------------------ */

static int nb_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double nb_percentile(double *v, size_t n, double p)
{
    if (n == 0)
        return 0.0;
    qsort(v, n, sizeof *v, nb_cmp_double);
    if (p <= 0)
        return v[0];
    if (p >= 100)
        return v[n - 1];
    double rank = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(rank);
    size_t hi = lo + 1 < n ? lo + 1 : lo;
    double frac = rank - (double)lo;
    return v[lo] + (v[hi] - v[lo]) * frac;
}

/* ------------------------------------------------------------------------ */
/* Recommendation                                                             */
/* ------------------------------------------------------------------------ */

/* Is a "smaller" than b? Fewer workers, then fewer slots; for the same
 * (workers, prefetch) — another io backend — the faster one; then the
 * earlier run (ia < ib), so the choice is deterministic. */
static int nb_smaller(const nb_run *a, int ia, const nb_run *b, int ib)
{
    if (a->workers != b->workers)
        return a->workers < b->workers;
    if (a->prefetch != b->prefetch)
        return a->prefetch < b->prefetch;
    if (a->gbps != b->gbps)
        return a->gbps > b->gbps;
    return ia < ib;
}

/* Runs a recommendation may pick: measured, and with two slots or more (a
 * loader of one slot cannot read the next batch while the step holds the
 * current one: no overlap, whatever the table says without a step) unless
 * no run has two. */
static int eligible(const nb_run *runs, size_t n, size_t i)
{
    if (!runs[i].ok)
        return 0;
    if (runs[i].prefetch >= 2)
        return 1;
    for (size_t k = 0; k < n; k++)
        if (runs[k].ok && runs[k].prefetch >= 2)
            return 0;
    return 1;
}

/* With a step: less memory, then fewer workers, then faster. */
static int nb_leaner(const nb_run *a, int ia, const nb_run *b, int ib)
{
    if (a->slot_mib != b->slot_mib)
        return a->slot_mib < b->slot_mib;
    if (a->workers != b->workers)
        return a->workers < b->workers;
    if (a->gbps != b->gbps)
        return a->gbps > b->gbps;
    return ia < ib;
}

int nb_recommend(const nb_run *runs, size_t n, double compute_ms,
                 nb_recommendation *out)
{
    memset(out, 0, sizeof *out);
    out->run_index = -1;
    double best = -1;
    for (size_t i = 0; i < n; i++)
        if (runs[i].ok && runs[i].gbps > best)
            best = runs[i].gbps;
    if (best < 0)
        return -1;

    int pick = -1;
    if (compute_ms > 0) {
        /* Stall first, memory second: among the runs within
         * NB_STALL_NOISE points of the least stall measured (closer than
         * that is noise between two runs of one configuration), the one
         * with the least slot memory. */
        double least = INFINITY;
        for (size_t i = 0; i < n; i++)
            if (eligible(runs, n, i) && runs[i].stall_pct < least)
                least = runs[i].stall_pct;
        for (size_t i = 0; i < n; i++) {
            if (!eligible(runs, n, i) || !(runs[i].stall_pct <= least + NB_STALL_NOISE))
                continue;
            if (pick < 0 || nb_leaner(&runs[i], (int)i, &runs[pick], pick))
                pick = (int)i;
        }
        snprintf(out->criterion, sizeof out->criterion,
                 "least slot memory with stall within %.0f points of the least (%.1f%%)",
                 NB_STALL_NOISE, least);
    } else {
        double bar = 0.95 * best;
        for (size_t i = 0; i < n; i++) {
            if (!eligible(runs, n, i) || runs[i].gbps < bar)
                continue;
            if (pick < 0 || nb_smaller(&runs[i], (int)i, &runs[pick], pick))
                pick = (int)i;
        }
        if (pick < 0) /* every 2-slot run is below the bar: the best of them */
            for (size_t i = 0; i < n; i++)
                if (eligible(runs, n, i) && (pick < 0 || runs[i].gbps > runs[pick].gbps))
                    pick = (int)i;
        snprintf(out->criterion, sizeof out->criterion,
                 "smallest (workers, prefetch) of 2+ slots within 5%% of the best throughput");
    }

    const nb_run *r = &runs[pick];
    out->valid = 1;
    out->run_index = pick;
    out->workers = r->workers;
    out->prefetch = r->prefetch;
    snprintf(out->io, sizeof out->io, "%s", r->io_used);
    out->gbps = r->gbps;
    out->samples_per_s = r->samples_per_s;
    out->frac_of_best = best > 0 ? r->gbps / best : 0;
    out->stall_pct = r->stall_pct;
    out->slot_mib = r->slot_mib;
    return pick;
}

static double share(uint64_t ns, double seconds)
{
    double s = seconds > 0 ? (double)ns / 1e9 / seconds : 0;
    return s < 1 ? s : 1;
}

void nb_verdict(const nb_run *r, double compute_ms, int cores, char *buf, size_t len)
{
    if (compute_ms > 0 && !isnan(r->stall_pct) && r->stall_pct <= NB_STALL_NOISE) {
        snprintf(buf, len, "bottleneck: the consumer (the %.3g ms step): the loader keeps "
                 "up (stall %.1f%%); a faster model step is what would go faster",
                 compute_ms, r->stall_pct);
        return;
    }
    double ws = r->wall_s * (r->workers > 0 ? r->workers : 1);
    struct { const char *what, *todo; double s; } c[] = {
        {"the disk (workers waited for reads", "pack the data (npyload-pack, --narrow for "
         "8-bit data stored wider), a faster disk, or more workers to keep more reads in "
         "flight", share(r->read_wait_ns, ws)},
        {"decode (zstd in the workers", "more cores, a faster level (npyload-pack -l 1) or --narrow, or "
         "keep hot data raw in the page cache", share(r->decode_ns, ws)},
        {"host transforms (in the workers", "move the transform to the GPU (device=\"cuda\": the kernel "
         "runs after the copy, PCIe carries the stored dtype)", share(r->transform_ns, ws)},
        {"the H2D copy (copy engine busy", "a narrower dtype on the wire (transform on the "
         "GPU), pinned slots (pin_memory)", share(r->h2d_ns, r->wall_s)},
    };
    /* Read waits name the disk only when the cores idled meanwhile: a read
     * from the page cache is a copy that keeps its core busy. */
    int busy = r->workers < cores ? r->workers : cores;
    if (r->cpu_pct >= 75.0 * (busy > 0 ? busy : 1))
        c[0].s = 0;
    int k = -1;
    for (int i = 0; i < 4; i++)
        if (c[i].s > NB_VERDICT_SHARE && (k < 0 || c[i].s > c[k].s))
            k = i;
    if (k < 0) {
        snprintf(buf, len, "bottleneck: copies on the CPU (reads from the page cache into "
                 "the slots, %.0f%% cpu for %d workers): more workers if cores are free, "
                 "else it is at the machine's copy rate", r->cpu_pct, r->workers);
        return;
    }
    snprintf(buf, len, "bottleneck: %s %.0f%% of the time): %s", c[k].what, 100 * c[k].s,
             c[k].todo);
}

void nb_format_paste(const nb_config *cfg, const nb_recommendation *r, char *py,
                     size_t pylen, char *c, size_t clen)
{
    size_t n = 0;
    n += (size_t)snprintf(py + n, pylen - n, "npyload.Loader({");
    for (int k = 0; k < cfg->nfields && n < pylen; k++)
        n += (size_t)snprintf(py + n, pylen - n, "%s\"%s\": \"%s\"", k ? ", " : "",
                              cfg->fields[k].name, cfg->fields[k].glob);
    const char *io = !strcmp(r->io, "io_uring") ? "uring" : r->io;
    static const char *const shuffle[] = {"False", "True", "\"local\""};
    if (n < pylen)
        n += (size_t)snprintf(py + n, pylen - n,
                              "}, batch_size=%d, shuffle=%s, num_workers=%d, prefetch=%d, "
                              "io=\"%s\"%s", cfg->batch_size,
                              shuffle[cfg->shuffle >= 0 && cfg->shuffle <= 2 ? cfg->shuffle : 0],
                              r->workers, r->prefetch - 1, io,
                              cfg->direct ? ", direct_io=True" : "");
    if (n < pylen && cfg->device >= 0)
        n += (size_t)snprintf(py + n, pylen - n, ", device=\"cuda:%d\"", cfg->device);
    int nt = 0;
    for (int k = 0; k < cfg->nfields && n < pylen; k++) {
        const nb_field_info *fi = &cfg->fields[k];
        if (!fi->has_transform)
            continue;
        static const char *const dt[] = {"None", "\"float32\"", "\"float16\"",
                                         "\"bfloat16\""};
        const npyload_transform *t = &fi->t;
        n += (size_t)snprintf(py + n, pylen - n, "%s\"%s\": npyload.Transform(dtype=%s, "
                              "scale=%.9g", nt++ ? ", " : ", transforms={", fi->name,
                              dt[t->dtype >= 0 && t->dtype <= 3 ? t->dtype : 0],
                              (double)t->scale);
        const float *v[2] = {t->mean, t->std};
        size_t cnt[2] = {t->n_mean, t->n_std};
        for (int m = 0; m < 2 && n < pylen; m++) {
            if (!cnt[m])
                continue;
            n += (size_t)snprintf(py + n, pylen - n, ", %s=[", m ? "std" : "mean");
            for (size_t i = 0; i < cnt[m] && n < pylen; i++)
                n += (size_t)snprintf(py + n, pylen - n, "%s%.9g", i ? ", " : "",
                                      (double)v[m][i]);
            if (n < pylen)
                n += (size_t)snprintf(py + n, pylen - n, "]");
        }
        if (n < pylen)
            n += (size_t)snprintf(py + n, pylen - n, "%s)",
                                  t->channels_last ? ", channels_last=True" : "");
    }
    if (nt && n < pylen)
        n += (size_t)snprintf(py + n, pylen - n, "}");
    if (n < pylen)
        snprintf(py + n, pylen - n, ")%s",
                 r->prefetch < 2 ? "  # 1 slot: Python needs 2 (prefetch >= 1)" : "");
    snprintf(c, clen,
             "npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, %d); "
             "npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, %d); "
             "npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, NPYLOAD_IO_%s);",
             r->workers, r->prefetch,
             !strcmp(r->io, "io_uring") ? "URING" : !strcmp(r->io, "pread") ? "PREAD"
             : !strcmp(r->io, "mmap") ? "MMAP" : "AUTO");
    for (int k = 0; k < cfg->nfields; k++)
        if (cfg->fields[k].has_transform) {
            size_t m = strlen(c);
            if (m + 1 < clen)
                snprintf(c + m, clen - m, " /* + npyload_loader_set_transform as --transform */");
            break;
        }
}

static void nb_format_mib(double mib, char *buf, size_t len)
{
    if (mib >= 1024 * 10)
        snprintf(buf, len, "%.0f GiB", mib / 1024);
    else if (mib >= 1024)
        snprintf(buf, len, "%.1f GiB", mib / 1024);
    else if (mib >= 10)
        snprintf(buf, len, "%.0f MiB", mib);
    else
        snprintf(buf, len, "%.2f MiB", mib);
}

void nb_format_recommendation(const nb_recommendation *r, double compute_ms,
                              char *buf, size_t len)
{
    if (!r->valid) {
        snprintf(buf, len, "recommend: none (no configuration ran)");
        return;
    }
    char mem[32];
    nb_format_mib(r->slot_mib, mem, sizeof mem);
    if (compute_ms > 0)
        snprintf(buf, len,
                 "recommend: num_workers=%d prefetch=%d (%.2f GB/s, stall %.1f%% "
                 "at %.3g ms/step, %s of slots%s)",
                 r->workers, r->prefetch, r->gbps, r->stall_pct, compute_ms, mem,
                 strncmp(r->criterion, "lowest", 6) == 0 ? "; none under 1% stall" : "");
    else
        snprintf(buf, len,
                 "recommend: num_workers=%d prefetch=%d (%.2f GB/s, %.0f%% of best, "
                 "%s of slots)",
                 r->workers, r->prefetch, r->gbps, 100.0 * r->frac_of_best, mem);
}
