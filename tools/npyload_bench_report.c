/* npyload-bench, reporting: the JSON document (bench/schema.json), written
 * with the tools' one JSON writer (npyload_json.c), and the text table on
 * stdout. Pure: nothing here measures, so tests/test_bench_report.c checks
 * it on synthetic runs. */
#include "npyload_bench.h"
#include "npyload_info_print.h"
#include "npyload_json.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* JSON                                                                       */
/* ------------------------------------------------------------------------ */

static const char *nb_shuffle_name(int shuffle)
{
    return shuffle == 2 ? "local" : shuffle ? "full" : "none";
}

static void nb_device_name(int device, char *buf, size_t len)
{
    if (device < 0)
        snprintf(buf, len, "cpu");
    else
        snprintf(buf, len, "cuda:%d", device);
}

static void nb_json_machine(FILE *f, const nb_machine *m)
{
    nj_printf(f,
              ",\n  \"machine\": {\n    \"cores_online\": %d,\n    \"cores_allowed\": %d,"
              "\n    \"kernel\": %s,\n    \"cpu_model\": %s,\n    \"mem_total_gib\": %g,"
              "\n    \"library_version\": %s,\n    \"hostname\": %s\n  }",
              m->cores_online, m->cores_allowed, m->kernel, m->cpu_model, m->mem_total_gib,
              m->library_version, m->hostname);
}

static void nb_json_config(FILE *f, const nb_config *c)
{
    char dev[32];
    nb_device_name(c->device, dev, sizeof dev);
    nj_printf(f,
              ",\n  \"config\": {\n    \"batch_size\": %d,\n    \"shuffle\": %s,"
              "\n    \"device\": %s,\n    \"batches\": %lld,\n    \"seconds\": %g,"
              "\n    \"compute_ms\": %g,\n    \"cold\": %c,\n    \"direct\": %c,"
              "\n    \"ranks\": %d,"
              "\n    \"num_samples\": %lld,\n    \"batch_bytes\": %llu,"
              "\n    \"ceiling_reference\": %s,\n    \"note\": %s,\n    \"fields\": [",
              c->batch_size, nb_shuffle_name(c->shuffle), dev, (long long)c->batches,
              c->seconds, c->compute_ms, c->cold, c->direct, c->ranks > 1 ? c->ranks : 1,
              (long long)c->num_samples,
              (unsigned long long)c->batch_bytes, c->ceiling_ref, c->note);
    for (int i = 0; i < c->nfields; i++) {
        const nb_field_info *fi = &c->fields[i];
        char shown[sizeof fi->glob + 64];
        npyload_mask_urls(fi->glob, shown, sizeof shown);
        fputs(i ? ",\n      " : "\n      ", f);
        nj_printf(f,
                  "{\"name\": %s, \"glob\": %s, \"files\": %zu, "
                  "\"sample_bytes\": %llu, \"descr\": %s, ",
                  fi->name, shown, fi->nfiles,
                  (unsigned long long)fi->sample_bytes, fi->descr);
        if (nb_field_source(c, i) >= 0)
            nj_printf(f, "\"source\": %s, ", c->sources[fi->source]);
        if (fi->has_transform)
            nj_printf(f, "\"transform\": %s, \"sample_shape\": [", fi->transform);
        else
            fputs("\"transform\": null, \"sample_shape\": [", f);
        for (int d = 0; d < fi->ndim; d++)
            fprintf(f, "%s%lld", d ? ", " : "", (long long)fi->shape[d]);
        fputs("]}", f);
    }
    fputs(c->nfields ? "\n    ]" : "]", f);
    /* --source: the sources in order and their weights (null: the
     * library's default, the sources' sample counts). */
    fputs(",\n    \"sources\": [", f);
    for (int k = 0; k < c->nsources; k++)
        nj_printf(f, k ? ", %s" : "%s", c->sources[k]);
    fputs("],\n    \"weights\": ", f);
    for (int k = 0; k < c->nsources && c->weights_given; k++)
        fprintf(f, "%s%.17g", k ? ", " : "[", c->weights[k]);
    fputs(c->nsources && c->weights_given ? "]\n  }" : "null\n  }", f);
}

static void nb_json_ceilings(FILE *f, const nb_ceiling *ce, size_t n)
{
    fputs(",\n  \"ceilings\": [", f);
    for (size_t i = 0; i < n; i++) {
        fputs(i ? ",\n    " : "\n    ", f);
        nj_printf(f,
                  "{\"name\": %s, \"measured\": %c, \"gbps\": %g, \"threads\": %d, "
                  "\"bytes\": %llu, \"seconds\": %g, \"note\": %s}",
                  ce[i].name, ce[i].measured,
                  ce[i].measured ? ce[i].gbps : NAN, ce[i].threads,
                  (unsigned long long)ce[i].bytes, ce[i].seconds, ce[i].note);
    }
    fputs(n ? "\n  ]" : "]", f);
}

/* Where a run's time went, per batch of its timed part (ms; summed over
 * workers for worker time), null without batches. */
static void nb_json_time(FILE *f, const npyload_stats *t)
{
    if (!t->batches_delivered) {
        fputs("null", f);
        return;
    }
    double k = 1e6 * (double)t->batches_delivered;
    nj_printf(f,
              "{\"loop_wait\": %g, \"step\": %g, \"read\": %g, \"read_wait\": %g, "
              "\"read_blocked\": %g, \"decode\": %g, \"transform\": %g, \"h2d\": %g, "
              "\"worker_cpu\": %g}",
              (double)t->wait_ns / k, (double)t->step_ns / k, (double)t->io_ns / k,
              (double)t->read_wait_ns / k, (double)t->read_blocked_ns / k,
              (double)t->decode_ns / k, (double)t->transform_ns / k, (double)t->h2d_ns / k,
              (double)t->worker_cpu_ns / k);
}

static void nb_json_run(FILE *f, const nb_run *r, const nb_config *c)
{
    nj_printf(f,
              "\n    {\n      \"workers\": %d, \"prefetch\": %d, \"io_requested\": %s, "
              "\"io_used\": %s, \"ok\": %c, \"error\": %s,\n      \"batches\": %llu, "
              "\"samples\": %llu, \"bytes\": %llu, \"wall_s\": %g, \"samples_per_s\": %g, "
              "\"gbps\": %g, \"frac_of_ceiling\": %g,\n      \"latency_ms\": {\"p50\": %g, "
              "\"p99\": %g, \"max\": %g}, \"stall_pct\": %g, \"cpu_pct\": %g,\n      "
              "\"peak_rss_mib\": %g, \"base_rss_mib\": %g, \"slot_mib\": %g, "
              "\"pinned\": %c, \"direct_io\": %c,\n      \"gather_bytes\": %llu, "
              "\"gather_requests\": %llu, \"read_requests\": %llu,\n      "
              "\"compressed_bytes_read\": %llu, \"decompressed_bytes\": %llu, "
              "\"decode_ns\": %llu, \"read_ahead_batches\": %llu, \"read_wait_ns\": %llu,"
              "\n      \"time_per_batch_ms\": ",
              r->workers, r->prefetch, r->io_requested_name, r->io_used, r->ok, r->error,
              (unsigned long long)r->batches, (unsigned long long)r->samples,
              (unsigned long long)r->bytes, r->wall_s, r->samples_per_s, r->gbps,
              r->frac_of_ceiling >= 0 ? r->frac_of_ceiling : NAN, r->p50_ms, r->p99_ms,
              r->max_ms, r->stall_pct, r->cpu_pct, r->peak_rss_mib, r->base_rss_mib,
              r->slot_mib, r->pinned, r->direct_io, (unsigned long long)r->gather_bytes,
              (unsigned long long)r->gather_requests, (unsigned long long)r->read_requests,
              (unsigned long long)r->compressed_bytes_read,
              (unsigned long long)r->decompressed_bytes, (unsigned long long)r->decode_ns,
              (unsigned long long)r->read_ahead_batches, (unsigned long long)r->read_wait_ns);
    nb_json_time(f, &r->timed);
    nj_printf(f, ", \"repeats\": %d, \"spread\": %g", r->repeats > 0 ? r->repeats : 1,
              r->spread);
    const npyload_stats *t = &r->timed;
    nj_printf(f,
              ",\n      \"remote\": {\"bytes\": %llu, \"requests\": %llu, \"retries\": %llu, "
              "\"wait_ns\": %llu, \"cache_hits\": %llu, \"cache_misses\": %llu, "
              "\"cache_read_bytes\": %llu, \"cache_write_bytes\": %llu}",
              (unsigned long long)t->remote_bytes, (unsigned long long)t->remote_requests,
              (unsigned long long)t->remote_retries, (unsigned long long)t->remote_wait_ns,
              (unsigned long long)t->cache_hits, (unsigned long long)t->cache_misses,
              (unsigned long long)t->cache_read_bytes, (unsigned long long)t->cache_write_bytes);
    fputs(",\n      \"source_samples\": {", f);
    for (int k = 0; c && k < c->nsources; k++)
        nj_printf(f, k ? ", %s: %lld" : "%s: %lld", c->sources[k],
                  (long long)r->source_samples[k]);
    fputs("}", f);
    fputs(",\n      \"gpu\": ", f);
    if (r->gpu_samples > 0)
        nj_printf(f,
                  "{\"samples\": %d, \"util_avg_pct\": %g, \"util_max_pct\": %g, "
                  "\"power_avg_w\": %g, \"mem_max_mib\": %g}\n    }",
                  r->gpu_samples, r->gpu_util_avg_pct, r->gpu_util_max_pct,
                  r->gpu_power_avg_w, r->gpu_mem_max_mib);
    else
        fputs("null\n    }", f);
}

static void nb_json_recommendation(FILE *f, const nb_recommendation *rec, double compute_ms)
{
    if (!rec || !rec->valid) {
        fputs(",\n  \"recommendation\": null", f);
        return;
    }
    char line[256];
    nb_format_recommendation(rec, compute_ms, line, sizeof line);
    nj_printf(f,
              ",\n  \"recommendation\": {\n    \"workers\": %d,\n    \"prefetch\": %d,"
              "\n    \"io\": %s,\n    \"run_index\": %d,\n    \"gbps\": %g,"
              "\n    \"samples_per_s\": %g,\n    \"frac_of_best\": %g,\n    \"stall_pct\": %g,"
              "\n    \"slot_mib\": %g,\n    \"criterion\": %s,\n    \"line\": %s,"
              "\n    \"verdict\": %s,\n    \"close\": %s,\n    \"next_steps\": %s\n  }",
              rec->workers, rec->prefetch, rec->io, rec->run_index, rec->gbps,
              rec->samples_per_s, rec->frac_of_best, rec->stall_pct, rec->slot_mib,
              rec->criterion, line, rec->verdict, rec->close[0] ? rec->close : NULL,
              rec->next_steps);
}

/* Remote fields: the ranged-GET sweep and its recommendation. */
static void nb_json_remote(FILE *f, const nb_remote_report *x)
{
    if (!x) {
        fputs(",\n  \"remote\": null", f);
        return;
    }
    nj_printf(f,
              ",\n  \"remote\": {\n    \"measured\": %c, \"objects\": %llu, \"object_bytes\": "
              "%llu, \"bytes_per_request\": %llu, \"seconds\": %g,\n    \"points\": [",
              x->measured, (unsigned long long)x->objects, (unsigned long long)x->object_bytes,
              (unsigned long long)x->bytes_per_request, x->seconds);
    for (int i = 0; i < x->npoints; i++) {
        const nb_remote_point *p = &x->points[i];
        fputs(i ? ",\n      " : "\n      ", f);
        nj_printf(f,
                  "{\"concurrency\": %d, \"threads\": %d, \"inflight\": %d, "
                  "\"requests_per_s\": %g, \"mb_per_s\": %g, \"p50_ms\": %g, \"p99_ms\": %g}",
                  p->concurrency, p->threads, p->inflight, p->requests_per_s, p->mb_per_s,
                  p->p50_ms >= 0 ? p->p50_ms : NAN, p->p99_ms >= 0 ? p->p99_ms : NAN);
    }
    fputs(x->npoints ? "\n    ],\n    " : "],\n    ", f);
    if (x->measured)
        nj_printf(f,
                  "\"best_mb_per_s\": %g, \"recommended_concurrency\": %d, "
                  "\"recommended_workers\": %d, \"recommended_max_inflight\": %d,\n    ",
                  x->best_mb_per_s, x->concurrency, x->workers, x->max_inflight);
    else
        fputs("\"best_mb_per_s\": null, \"recommended_concurrency\": null, "
              "\"recommended_workers\": null, \"recommended_max_inflight\": null,\n    ", f);
    nj_printf(f, "\"requests\": %llu, \"retries\": %llu, \"note\": %s\n  }",
              (unsigned long long)x->requests, (unsigned long long)x->retries, x->note);
}

/* The newline-separated warnings as an array of strings. */
static void nb_json_warnings(FILE *f, const char *warnings)
{
    int n = 0;
    fputs(",\n  \"warnings\": [", f);
    for (const char *p = warnings ? warnings : ""; *p;) {
        size_t len = strcspn(p, "\n");
        if (len) {
            char buf[1024];
            snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), p);
            fputs(n++ ? ",\n    " : "\n    ", f);
            nj_printf(f, "%s", buf);
        }
        p += len + (p[len] == '\n');
    }
    fputs(n ? "\n  ]\n}\n" : "]\n}\n", f);
}

/* --auto: the auto loader's run and its comparison with the grid. */
static void nb_json_auto(FILE *f, const nb_auto_cmp *c, const nb_run *runs,
                         const nb_config *cfg)
{
    if (!c) {
        fputs(",\n  \"auto\": null", f);
        return;
    }
    char line[768];
    nb_format_auto(c, runs, cfg->compute_ms, line, sizeof line);
    fputs(",\n  \"auto\": {\n  \"run\":", f);
    nb_json_run(f, &c->run, cfg);
    nj_printf(f,
              ",\n    \"final_workers\": %d, \"final_slots\": %d, \"decisions\": %llu,"
              "\n    \"best_run_index\": %d, \"ratio_to_best\": %g,"
              "\n    \"least_stall_run_index\": %d, \"stall_points_over_least\": %g,"
              "\n    \"line\": %s\n  }",
              c->run.final_workers, c->run.final_slots,
              (unsigned long long)c->run.auto_decisions, c->best_index,
              c->ratio >= 0 ? c->ratio : NAN, c->least_stall_index, c->stall_points, line);
}

int nb_write_json(FILE *f, const nb_report *rep)
{
    nj_printf(f, "{\n  \"tool\": %s,\n  \"schema_version\": %d", "npyload-bench", 1);
    nb_json_machine(f, rep->machine);
    ni_build_info_json(f, &rep->machine->build_info);
    nb_json_config(f, rep->config);
    nb_json_ceilings(f, rep->ceilings, rep->nceilings);
    fputs(",\n  \"runs\": [", f);
    for (size_t i = 0; i < rep->nruns; i++) {
        if (i)
            fputc(',', f);
        nb_json_run(f, &rep->runs[i], rep->config);
    }
    fputs(rep->nruns ? "\n  ]" : "]", f);
    nb_json_recommendation(f, rep->rec, rep->config->compute_ms);
    nb_json_compression(f, rep->zst);
    nb_json_remote(f, rep->remote);
    nb_json_auto(f, rep->autocmp, rep->runs, rep->config);
    nb_json_warnings(f, rep->warnings);
    return ferror(f) ? -1 : 0;
}

int nb_write_json_file(const char *path, const nb_report *rep)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int rc = nb_write_json(f, rep);
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}

/* ------------------------------------------------------------------------ */
/* The text report                                                            */
/* ------------------------------------------------------------------------ */

void nb_print_setup(FILE *f, const nb_config *c, const nb_machine *m, uint64_t total_bytes)
{
    fprintf(f, "npyload-bench %s on %s: %d cores (%d usable), %.1f GiB, %s\n",
            m->library_version, m->hostname, m->cores_online, m->cores_allowed,
            m->mem_total_gib, m->kernel);
    for (int k = 0; k < c->nfields; k++) {
        const nb_field_info *fi = &c->fields[k];
        if (nb_field_source(c, k) >= 0)
            fprintf(f, "  source %s:", c->sources[fi->source]);
        fprintf(f, "  field %-10s %zu files, %lld samples, %s (", fi->name, fi->nfiles,
                (long long)fi->nsamples, fi->descr);
        for (int d = 0; d < fi->ndim; d++)
            fprintf(f, "%s%lld", d ? "," : "", (long long)fi->shape[d]);
        fprintf(f, "), %.3f MiB/sample\n", fi->sample_bytes / 1048576.0);
    }
    fprintf(f, "  batch %d = %.2f MiB; dataset %.2f GiB; %s; %s\n", c->batch_size,
            c->batch_bytes / 1048576.0, total_bytes / 1073741824.0,
            c->shuffle == 1 ? "full shuffle" : c->shuffle == 2 ? "local shuffle" : "in order",
            c->remote ? "remote, no cache_dir" : c->cold ? "cold cache" : "page cache");
}

void nb_print_ceilings(FILE *f, const nb_ceiling *ce, size_t n, const char *ref)
{
    for (size_t i = 0; i < n; i++) {
        if (ce[i].measured)
            fprintf(f, "  %-14s %7.2f GB/s  (%s)%s\n", ce[i].name, ce[i].gbps, ce[i].note,
                    strcmp(ce[i].name, ref) ? "" : "  <- reference");
        else
            fprintf(f, "  %-14s    skipped  (%s)\n", ce[i].name, ce[i].note);
    }
}

const char nb_legend[] =
    "columns: io asked / used; w workers; p batch slots (C PREFETCH; Python\n"
    "  prefetch = p - 1, the batches ahead of the one the loop holds);\n"
    "  samples/s and GB/s delivered; ceil% of the reference ceiling; p50/p99 ms\n"
    "  between batches; stall% the step's time spent waiting in next()\n"
    "  (--compute-ms only, else -); cpu% of one core; rss MiB peak; slots MiB\n"
    "  the loader's batch memory; gath% bytes copied from mappings.\n";

void nb_print_sources(FILE *f, const nb_config *c, const nb_run *r)
{
    if (!c->nsources || !r->ok)
        return;
    int64_t total = 0;
    for (int k = 0; k < c->nsources; k++)
        total += r->source_samples[k];
    fprintf(f, "%28s rows per source:", "");
    for (int k = 0; k < c->nsources; k++)
        fprintf(f, "%s %s %lld (%.1f%%)", k ? "," : "", c->sources[k],
                (long long)r->source_samples[k],
                total ? 100.0 * (double)r->source_samples[k] / (double)total : 0.0);
    fputc('\n', f);
}

void nb_print_table_header(FILE *f)
{
    fprintf(f, "%-8s %-8s %3s %3s %10s %7s %6s %8s %8s %7s %6s %8s %9s %6s\n", "io", "used",
            "w", "p", "samples/s", "GB/s", "ceil%", "p50 ms", "p99 ms", "stall%", "cpu%",
            "rss MiB", "slots MiB", "gath%");
}

void nb_print_run(FILE *f, const nb_run *r)
{
    if (r->ok) {
        char ceil[16] = "-";
        if (r->frac_of_ceiling >= 0)
            snprintf(ceil, sizeof ceil, "%.0f", 100 * r->frac_of_ceiling);
        /* gath%: the share of the bytes copied from mappings (gather path). */
        char gath[16] = "-";
        if (r->bytes_read)
            snprintf(gath, sizeof gath, "%.0f",
                     100.0 * (double)r->gather_bytes / (double)r->bytes_read);
        char stall[16] = "-"; /* not measured without --compute-ms */
        if (!isnan(r->stall_pct))
            snprintf(stall, sizeof stall, "%.1f", r->stall_pct);
        fprintf(f, "%-8s %-8s %3d %3d %10.0f %7.3f %6s %8.2f %8.2f %7s %6.0f %8.0f %9.1f %6s\n",
                r->io_requested_name, r->io_used, r->workers, r->prefetch, r->samples_per_s,
                r->gbps, ceil, r->p50_ms, r->p99_ms, stall, r->cpu_pct,
                r->peak_rss_mib, r->slot_mib, gath);
    } else {
        fprintf(f, "%-8s %-8s %3d %3d failed: %s\n", r->io_requested_name, r->io_used,
                r->workers, r->prefetch, r->error);
    }
    if (r->gpu_samples)
        fprintf(f, "%28s gpu: util %.0f%% avg (%.0f%% max), %.0f W, %.0f MiB\n", "",
                r->gpu_util_avg_pct, r->gpu_util_max_pct, r->gpu_power_avg_w,
                r->gpu_mem_max_mib);
}
