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

double nb_noise(const nb_run *runs, size_t n, double compute_ms)
{
    double bar = compute_ms > 0 ? NB_STALL_NOISE : 5.0;
    for (size_t i = 0; i < n; i++)
        if (runs[i].ok && runs[i].repeats > 1 && runs[i].spread / 2 > bar)
            bar = runs[i].spread / 2;
    return bar;
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
        double least = INFINITY, noise = nb_noise(runs, n, compute_ms);
        for (size_t i = 0; i < n; i++)
            if (eligible(runs, n, i) && runs[i].stall_pct < least)
                least = runs[i].stall_pct;
        for (size_t i = 0; i < n; i++) {
            if (!eligible(runs, n, i) || !(runs[i].stall_pct <= least + noise))
                continue;
            if (pick < 0 || nb_leaner(&runs[i], (int)i, &runs[pick], pick))
                pick = (int)i;
        }
        snprintf(out->criterion, sizeof out->criterion,
                 "least slot memory with stall within %.1f points of the least (%.1f%%)",
                 noise, least);
    } else {
        double noise = nb_noise(runs, n, compute_ms);
        double bar = (1 - noise / 100) * best;
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
                 "smallest (workers, prefetch) of 2+ slots within %.0f%% of the best throughput",
                 noise);
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

/* The criterion's distance of run r from the best: stall points above the
 * least with a step, else % below the best gbps. */
static double distance(const nb_run *r, double compute_ms, double least, double best)
{
    if (compute_ms > 0)
        return r->stall_pct - least;
    return best > 0 ? 100.0 * (best - r->gbps) / best : 0;
}

size_t nb_close_candidates(const nb_run *runs, size_t n, double compute_ms,
                           const nb_recommendation *rec, int *idx, size_t max)
{
    if (!rec->valid || max == 0)
        return 0;
    double least = INFINITY, best = 0;
    for (size_t i = 0; i < n; i++) {
        if (!eligible(runs, n, i))
            continue;
        if (runs[i].stall_pct < least)
            least = runs[i].stall_pct;
        if (runs[i].gbps > best)
            best = runs[i].gbps;
    }
    double bar = nb_noise(runs, n, compute_ms);
    size_t k = 0;
    idx[k++] = rec->run_index;
    for (;;) { /* the closest not yet taken, until max or none left */
        int c = -1;
        double dc = 0;
        for (size_t i = 0; i < n; i++) {
            int taken = 0;
            for (size_t t = 0; t < k; t++)
                taken |= idx[t] == (int)i;
            double d = distance(&runs[i], compute_ms, least, best);
            if (taken || !eligible(runs, n, i) || !(d <= bar))
                continue;
            if (c < 0 || d < dc)
                c = (int)i, dc = d;
        }
        if (c < 0 || k == max)
            break;
        idx[k++] = c;
    }
    return k;
}

static double mean2(double a, int na, double b)
{
    return (a * na + b) / (na + 1);
}

void nb_merge_repeat(nb_run *a, const nb_run *b, double compute_ms)
{
    if (!b->ok)
        return;
    int na = a->repeats > 0 ? a->repeats : 1;
    double d = compute_ms > 0 ? fabs(a->stall_pct - b->stall_pct)
                              : (a->gbps > 0 ? 100.0 * fabs(a->gbps - b->gbps) / a->gbps : 0);
    a->spread = d > a->spread ? d : a->spread;
    a->samples_per_s = mean2(a->samples_per_s, na, b->samples_per_s);
    a->gbps = mean2(a->gbps, na, b->gbps);
    if (a->frac_of_ceiling >= 0 && b->frac_of_ceiling >= 0)
        a->frac_of_ceiling = mean2(a->frac_of_ceiling, na, b->frac_of_ceiling);
    a->stall_pct = mean2(a->stall_pct, na, b->stall_pct);
    a->cpu_pct = mean2(a->cpu_pct, na, b->cpu_pct);
    a->p50_ms = mean2(a->p50_ms, na, b->p50_ms);
    a->p99_ms = mean2(a->p99_ms, na, b->p99_ms);
    a->max_ms = b->max_ms > a->max_ms ? b->max_ms : a->max_ms;
    a->wall_s += b->wall_s;
    a->batches += b->batches;
    a->samples += b->samples;
    a->bytes += b->bytes;
    for (int k = 0; k < NB_MAX_SOURCES; k++)
        a->source_samples[k] += b->source_samples[k];
    a->peak_rss_mib = b->peak_rss_mib > a->peak_rss_mib ? b->peak_rss_mib : a->peak_rss_mib;
    a->repeats = na + 1;
}

void nb_format_close(const nb_run *runs, size_t n_all, const int *idx, size_t n,
                     double compute_ms, nb_recommendation *rec)
{
    size_t m = 0, len = sizeof rec->close;
    char *s = rec->close;
    s[0] = 0;
    if (n < 2)
        return;
    m += (size_t)snprintf(s, len, "close candidates, each measured %d times:",
                          runs[idx[0]].repeats > 1 ? runs[idx[0]].repeats : 1);
    double lo = INFINITY, hi = -INFINITY;
    for (size_t k = 0; k < n && m < len; k++) {
        const nb_run *r = &runs[idx[k]];
        double v = compute_ms > 0 ? r->stall_pct : r->gbps;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        if (compute_ms > 0)
            m += (size_t)snprintf(s + m, len - m, "%s w=%d p=%d stall %.1f%% (+-%.1f)",
                                  k ? ";" : "", r->workers, r->prefetch, r->stall_pct,
                                  r->spread / 2);
        else
            m += (size_t)snprintf(s + m, len - m, "%s w=%d p=%d %.3g GB/s (+-%.0f%%)",
                                  k ? ";" : "", r->workers, r->prefetch, r->gbps,
                                  r->spread / 2);
    }
    double gap = compute_ms > 0 ? hi - lo : (hi > 0 ? 100.0 * (hi - lo) / hi : 0);
    double bar = nb_noise(runs, n_all, compute_ms);
    if (m >= len)
        return;
    if (gap <= bar)
        snprintf(s + m, len - m, ". All within the noise (%.1f %s): the %s was picked", bar,
                 compute_ms > 0 ? "points" : "%", compute_ms > 0 ? "least slot memory"
                                                                 : "smallest configuration");
    else
        snprintf(s + m, len - m, ". Noise %.1f %s: the repeat separated them", bar,
                 compute_ms > 0 ? "points" : "%");
}

void nb_verdict(const nb_run *r, double compute_ms, char *buf, size_t len)
{
    /* Without a step the loop only waits: the consumer is never named. */
    npyload_stats s = r->timed;
    if (!(compute_ms > 0)) {
        s.wait_ns += s.step_ns;
        s.step_ns = 0;
    }
    npyload_stats_verdict(&s, 0, buf, len);
}

void nb_next_steps(const nb_config *cfg, const nb_recommendation *rec, const nb_run *r,
                   const nb_zst_report *z, int cores, char *buf, size_t len)
{
    buf[0] = 0;
    if (!rec->valid)
        return;
    const char *v = rec->verdict;
    size_t m = 0;
#define SAY(...)                                                                           \
    do {                                                                                   \
        if (m < len)                                                                       \
            m += (size_t)snprintf(buf + m, len - m, __VA_ARGS__);                          \
    } while (0)
    if (strstr(v, "the consumer")) {
        SAY("The loader keeps up with a %.3g ms step: paste the line above and spend no "
            "more cores or memory on loading; the model step is what to make faster "
            "(profile it, e.g. torch.profiler).", cfg->compute_ms);
    } else if (strstr(v, "the object store")) {
        SAY("Ranged GETs from the object store are the limit: give the loader a cache "
            "(remote={\"cache_dir\": ..., \"cache_bytes\": ...}) so later epochs read local "
            "disk, keep more requests in flight (max_inflight, the remote sweep above says "
            "how many the store serves best), and pack the fields (npyload-pack: fewer "
            "bytes per sample).");
    } else if (strstr(v, "the disk")) {
        SAY("Reads from the disk are the limit. ");
        if (z && z->valid && z->pays == 1)
            SAY("Packing pays here (expected cold %.0f samples/s packed): npyload-pack the "
                "fields (--narrow when 8-bit data is stored wider) and rerun on the packed "
                "files. ", z->expected_cold_sps);
        else
            SAY("Pack the fields (npyload-pack, --narrow for 8-bit data stored wider) to read "
                "fewer bytes. ");
        SAY("With the cores idle during reads, more workers keep more reads in flight: "
            "rerun with --cold --workers up to %d.", 2 * cores);
    } else if (strstr(v, "decode")) {
        SAY("zstd decode uses the cores: a faster level (npyload-pack -l 1), --narrow for "
            "8-bit data stored wider, more cores, or raw files where the data fits in the "
            "page cache (the compression line says which).");
    } else if (strstr(v, "host transforms")) {
        if (cfg->device >= 0)
            SAY("Host transforms use the cores: give the transform to the GPU (it runs "
                "after the copy there).");
        else if (npyload_cuda_available(0, NULL, 0) == 1)
            SAY("Host transforms use the cores: this machine has a CUDA device, so pass "
                "device=\"cuda\" (the transform runs on the GPU after the copy) and rerun "
                "with --device cuda:0 to measure it.");
        else
            SAY("Host transforms use the cores (no CUDA device here to move them to): "
                "%s a cheaper transform (keep the stored dtype, drop steps the model can "
                "do) or store the data already transformed.",
                r->workers < cores ? "more workers (rerun with --workers up to the cores),"
                                   : "all cores are busy, so");
    } else if (strstr(v, "the H2D copy")) {
        SAY("The copy engine is busy: carry the stored dtype over PCIe (transform on the "
            "GPU) and keep the slots pinned.");
    } else {
        if (r->workers < cores)
            SAY("Copies into the slots are the work and %d of %d cores do it: rerun with "
                "--workers up to %d.", r->workers, cores, cores);
        else
            SAY("Copies into the slots keep the %d cores busy (%.0f%% of the machine's "
                "measured copy ceiling): more workers will not help; move fewer bytes "
                "(npyload-pack, --narrow) or give the loader more cores.", cores,
                r->frac_of_ceiling >= 0 ? 100 * r->frac_of_ceiling : NAN);
    }
#undef SAY
}

void nb_format_paste(const nb_config *cfg, const nb_recommendation *r, char *py,
                     size_t pylen, char *c, size_t clen)
{
    size_t n = 0;
    n += (size_t)snprintf(py + n, pylen - n, cfg->nsources ? "npyload.Loader(sources={"
                                                           : "npyload.Loader({");
    for (int k = 0; k < cfg->nfields && n < pylen; k++) {
        char shown[sizeof cfg->fields[k].glob + 64];
        npyload_mask_urls(cfg->fields[k].glob, shown, sizeof shown);
        const int src = nb_field_source(cfg, k);
        if (src >= 0 && (k == 0 || cfg->fields[k - 1].source != src)) /* a source begins */
            n += (size_t)snprintf(py + n, pylen - n, "%s\"%s\": {", k ? "}, " : "",
                                  cfg->sources[src]);
        else if (k)
            n += (size_t)snprintf(py + n, pylen - n, ", ");
        if (n < pylen)
            n += (size_t)snprintf(py + n, pylen - n, "\"%s\": \"%s\"", cfg->fields[k].name,
                                  shown);
    }
    if (cfg->nsources && n < pylen)
        n += (size_t)snprintf(py + n, pylen - n, "}");
    for (int k = 0; cfg->weights_given && k < cfg->nsources && n < pylen; k++)
        n += (size_t)snprintf(py + n, pylen - n, "%s\"%s\": %.9g", k ? ", " : "}, weights={",
                              cfg->sources[k], cfg->weights[k]);
    const char *io = !strcmp(r->io, "io_uring") ? "uring" : r->io;
    static const char *const shuffle[] = {"False", "True", "\"local\""};
    if (n < pylen)
        n += (size_t)snprintf(py + n, pylen - n,
                              "}, batch_size=%d, shuffle=%s, num_workers=%d, prefetch=%d, "
                              "io=\"%s\"%s", cfg->batch_size,
                              shuffle[cfg->shuffle >= 0 && cfg->shuffle <= 2 ? cfg->shuffle : 0],
                              r->workers, r->prefetch - 1, io,
                              cfg->direct ? ", direct_io=True" : "");
    if (n < pylen && (cfg->seed_given || cfg->seed))
        n += (size_t)snprintf(py + n, pylen - n, ", seed=%lld", (long long)cfg->seed);
    if (n < pylen && cfg->drop_last)
        n += (size_t)snprintf(py + n, pylen - n, ", drop_last=True");
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
        static const char *const vname[4] = {"mean", "std", "hflip_sign", "vflip_sign"};
        const float *v[4] = {t->mean, t->std, t->hflip_sign, t->vflip_sign};
        size_t cnt[4] = {t->n_mean, t->n_std, t->n_hflip_sign, t->n_vflip_sign};
        for (int m = 0; m < 4 && n < pylen; m++) {
            if (!cnt[m])
                continue;
            n += (size_t)snprintf(py + n, pylen - n, ", %s=[", vname[m]);
            for (size_t i = 0; i < cnt[m] && n < pylen; i++)
                n += (size_t)snprintf(py + n, pylen - n, "%s%.9g", i ? ", " : "",
                                      (double)v[m][i]);
            if (n < pylen)
                n += (size_t)snprintf(py + n, pylen - n, "]");
        }
        if (n < pylen && t->channels_last)
            n += (size_t)snprintf(py + n, pylen - n, ", channels_last=True");
        if (n < pylen && t->hflip > 0)
            n += (size_t)snprintf(py + n, pylen - n, ", hflip=%.9g", (double)t->hflip);
        if (n < pylen && t->vflip > 0)
            n += (size_t)snprintf(py + n, pylen - n, ", vflip=%.9g", (double)t->vflip);
        if (n < pylen && (t->crop_h || t->crop_w))
            n += (size_t)snprintf(py + n, pylen - n, ", crop=(%lld, %lld)",
                                  (long long)t->crop_h, (long long)t->crop_w);
        if (n < pylen && t->pad)
            n += (size_t)snprintf(py + n, pylen - n, ", pad=%lld", (long long)t->pad);
        if (n < pylen)
            n += (size_t)snprintf(py + n, pylen - n, ")");
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

const char *nb_tuning_args(const nb_recommendation *r, char *buf, size_t len)
{
    snprintf(buf, len, "num_workers=%d, prefetch=%d, io=\"%s\"", r->workers, r->prefetch - 1,
             !strcmp(r->io, "io_uring") ? "uring" : r->io);
    return buf;
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

void nb_auto_compare(const nb_run *runs, size_t n, double compute_ms, nb_auto_cmp *c)
{
    c->best_index = c->least_stall_index = -1;
    c->ratio = -1;
    c->stall_points = NAN;
    for (size_t i = 0; i < n; i++) {
        if (!runs[i].ok)
            continue;
        if (c->best_index < 0 || runs[i].samples_per_s > runs[c->best_index].samples_per_s)
            c->best_index = (int)i;
        if (compute_ms > 0 && !isnan(runs[i].stall_pct) &&
            (c->least_stall_index < 0 ||
             runs[i].stall_pct < runs[c->least_stall_index].stall_pct))
            c->least_stall_index = (int)i;
    }
    if (!c->run.ok)
        return;
    if (c->best_index >= 0 && runs[c->best_index].samples_per_s > 0)
        c->ratio = c->run.samples_per_s / runs[c->best_index].samples_per_s;
    if (c->least_stall_index >= 0 && !isnan(c->run.stall_pct))
        c->stall_points = c->run.stall_pct - runs[c->least_stall_index].stall_pct;
}

void nb_format_auto(const nb_auto_cmp *c, const nb_run *runs, double compute_ms, char *buf,
                    size_t len)
{
    const nb_run *r = &c->run;
    if (!r->ok) {
        snprintf(buf, len, "auto: failed: %s", r->error);
        return;
    }
    int k = snprintf(buf, len, "auto: %d workers, %d slots at the end (%llu decisions): "
                     "%.0f samples/s", r->final_workers, r->final_slots,
                     (unsigned long long)r->auto_decisions, r->samples_per_s);
    if (k < 0 || (size_t)k >= len)
        return;
    if (c->best_index >= 0) {
        const nb_run *b = &runs[c->best_index];
        k += snprintf(buf + k, len - (size_t)k, " = %.2f of the best fixed (w=%d p=%d, %.0f "
                      "samples/s)", c->ratio, b->workers, b->prefetch, b->samples_per_s);
    } else {
        k += snprintf(buf + k, len - (size_t)k, " (no fixed run succeeded)");
    }
    if (k < 0 || (size_t)k >= len)
        return;
    if (compute_ms > 0 && c->least_stall_index >= 0 && !isnan(c->stall_points)) {
        const nb_run *b = &runs[c->least_stall_index];
        snprintf(buf + k, len - (size_t)k, "; stall %.1f%% = %+.1f points over the least "
                 "(w=%d p=%d, %.1f%%)", r->stall_pct, c->stall_points, b->workers,
                 b->prefetch, b->stall_pct);
    }
}
