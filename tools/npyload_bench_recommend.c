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
        for (size_t i = 0; i < n; i++) {
            if (!runs[i].ok || !(runs[i].stall_pct < 1.0))
                continue;
            if (pick < 0 || nb_smaller(&runs[i], (int)i, &runs[pick], pick))
                pick = (int)i;
        }
        if (pick >= 0) {
            snprintf(out->criterion, sizeof out->criterion,
                     "smallest (workers, prefetch) with stall < 1%%");
        } else {
            /* Nothing keeps the consumer fed: the least stall, ties to the
             * smallest configuration. */
            for (size_t i = 0; i < n; i++) {
                if (!runs[i].ok)
                    continue;
                if (pick < 0 || runs[i].stall_pct < runs[pick].stall_pct ||
                    (runs[i].stall_pct == runs[pick].stall_pct &&
                     nb_smaller(&runs[i], (int)i, &runs[pick], pick)))
                    pick = (int)i;
            }
            snprintf(out->criterion, sizeof out->criterion,
                     "lowest stall (no configuration under 1%%)");
        }
    } else {
        double bar = 0.95 * best;
        for (size_t i = 0; i < n; i++) {
            if (!runs[i].ok || runs[i].gbps < bar)
                continue;
            if (pick < 0 || nb_smaller(&runs[i], (int)i, &runs[pick], pick))
                pick = (int)i;
        }
        snprintf(out->criterion, sizeof out->criterion,
                 "smallest (workers, prefetch) within 5%% of the best throughput");
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
