/* npyload-bench's pure logic on synthetic measurements: percentiles, the
 * recommendation rule, the JSON document (its content; its validity against
 * bench/schema.json is checked with jsonschema in
 * tests/python/test_bench_cli.py) and the SVG heatmap, through the bench's
 * report core (npyload_bench_core, tools/npyload_bench_core.cmake; not part
 * of the library). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_bench.h"
#include "npyload_json.h"
#include "testutil.h"

/* ---- helpers ---- */

static nb_run mk(int w, int p, const char *io, double gbps, double stall, int ok)
{
    nb_run r;
    memset(&r, 0, sizeof r);
    r.workers = w;
    r.prefetch = p;
    snprintf(r.io_requested_name, sizeof r.io_requested_name, "%s", io);
    snprintf(r.io_used, sizeof r.io_used, "%s", io);
    r.ok = ok;
    r.gbps = gbps;
    r.samples_per_s = gbps * 1e9 / 1245184.0;
    r.stall_pct = stall;
    r.slot_mib = p * 152.0;
    r.frac_of_ceiling = -1;
    return r;
}

static void check_matches_run(const nb_run *runs, size_t n, const nb_recommendation *rec)
{
    cr_assert(rec->valid);
    cr_assert(rec->run_index >= 0 && (size_t)rec->run_index < n);
    const nb_run *r = &runs[rec->run_index];
    cr_assert_eq(r->workers, rec->workers);
    cr_assert_eq(r->prefetch, rec->prefetch);
    cr_assert(r->ok);
}

/* ---- percentiles ---- */

Test(bench_percentile, numpy_linear)
{
    double v[100];
    for (int i = 0; i < 100; i++)
        v[i] = 100 - i; /* unsorted: 100..1 */
    cr_assert_float_eq(nb_percentile(v, 100, 50), 50.5, 1e-9);
    cr_assert_float_eq(nb_percentile(v, 100, 99), 99.01, 1e-9);
    cr_assert_float_eq(nb_percentile(v, 100, 0), 1, 1e-12);
    cr_assert_float_eq(nb_percentile(v, 100, 100), 100, 1e-12);
}

Test(bench_percentile, small_and_empty)
{
    double one[1] = {3.5};
    cr_assert_float_eq(nb_percentile(one, 1, 50), 3.5, 1e-12);
    cr_assert_float_eq(nb_percentile(one, 1, 99), 3.5, 1e-12);
    double two[2] = {4, 2};
    cr_assert_float_eq(nb_percentile(two, 2, 50), 3, 1e-12);
    cr_assert_float_eq(nb_percentile(NULL, 0, 50), 0, 1e-12);
}

/* ---- recommendation without compute ---- */

Test(bench_recommend, smallest_within_5_percent)
{
    nb_run runs[] = {
        mk(1, 1, "auto", 1.00, 100, 1), mk(1, 2, "auto", 1.50, 100, 1),
        mk(2, 1, "auto", 1.80, 100, 1), mk(2, 4, "auto", 1.93, 100, 1),
        mk(4, 8, "auto", 2.00, 100, 1), mk(4, 4, "auto", 1.99, 100, 1),
    };
    nb_recommendation rec;
    int i = nb_recommend(runs, 6, 0, &rec);
    cr_assert_eq(i, 3);
    cr_assert_eq(rec.workers, 2);
    cr_assert_eq(rec.prefetch, 4);
    cr_assert_float_eq(rec.frac_of_best, 0.965, 1e-9);
    check_matches_run(runs, 6, &rec);
    char line[256];
    nb_format_recommendation(&rec, 0, line, sizeof line);
    cr_assert(strstr(line, "recommend: num_workers=2 prefetch=4 (1.93 GB/s, 96% of best, 608 MiB of slots)"),
              "%s", line);
}

Test(bench_recommend, fewer_workers_beat_fewer_slots)
{
    /* (1,8) qualifies and (2,1) would on throughput, but has one slot. */
    nb_run runs[] = {mk(2, 1, "auto", 1.98, 100, 1), mk(1, 8, "auto", 1.97, 100, 1),
                     mk(4, 4, "auto", 2.00, 100, 1)};
    nb_recommendation rec;
    cr_assert_eq(nb_recommend(runs, 3, 0, &rec), 1);
    cr_assert_eq(rec.workers, 1);
    cr_assert_eq(rec.prefetch, 8);
}

Test(bench_recommend, boundary_is_inclusive)
{
    nb_run runs[] = {mk(1, 2, "auto", 0.95, 100, 1), mk(2, 2, "auto", 1.00, 100, 1)};
    nb_recommendation rec;
    cr_assert_eq(nb_recommend(runs, 2, 0, &rec), 0);
    runs[0].gbps = 0.9499;
    cr_assert_eq(nb_recommend(runs, 2, 0, &rec), 1);
}

Test(bench_recommend, same_config_other_io_takes_faster)
{
    nb_run runs[] = {mk(2, 2, "pread", 1.96, 100, 1), mk(2, 2, "io_uring", 1.99, 100, 1),
                     mk(2, 4, "io_uring", 2.00, 100, 1)};
    nb_recommendation rec;
    cr_assert_eq(nb_recommend(runs, 3, 0, &rec), 1);
    cr_assert_str_eq(rec.io, "io_uring");
    /* An exact tie: the earlier run. */
    runs[0].gbps = runs[1].gbps;
    cr_assert_eq(nb_recommend(runs, 3, 0, &rec), 0);
}

Test(bench_recommend, failed_runs_ignored)
{
    nb_run runs[] = {mk(1, 1, "auto", 9.0, 0, 0), mk(2, 2, "auto", 1.0, 100, 1),
                     mk(2, 1, "auto", 0.5, 100, 1)};
    nb_recommendation rec;
    cr_assert_eq(nb_recommend(runs, 3, 0, &rec), 1);
    check_matches_run(runs, 3, &rec);
    cr_assert_float_eq(rec.frac_of_best, 1.0, 1e-12);
}

Test(bench_recommend, nothing_ran)
{
    nb_run runs[] = {mk(1, 1, "auto", 0, 0, 0)};
    nb_recommendation rec;
    cr_assert_eq(nb_recommend(runs, 1, 0, &rec), -1);
    cr_assert_eq(rec.valid, 0);
    cr_assert_eq(nb_recommend(NULL, 0, 0, &rec), -1);
    char line[128];
    nb_format_recommendation(&rec, 0, line, sizeof line);
    cr_assert(strstr(line, "none"));
}

/* ---- recommendation with compute ---- */

Test(bench_recommend, compute_least_memory_within_noise_of_least_stall)
{
    nb_run runs[] = {
        mk(1, 1, "auto", 1.0, 40.0, 1), mk(1, 4, "auto", 1.2, 0.9, 1),
        mk(2, 2, "auto", 1.2, 0.1, 1),  mk(1, 2, "auto", 1.1, 1.0, 1),
        mk(4, 8, "auto", 1.3, 0.0, 1),  mk(1, 3, "auto", 1.3, 2.01, 1),
    };
    nb_recommendation rec;
    /* least stall 0.0: (1,4), (2,2), (1,2) and (4,8) are within 2 points,
     * (1,3) is not; least memory 2 slots, then fewer workers: (1,2). */
    cr_assert_eq(nb_recommend(runs, 6, 10.0, &rec), 3);
    cr_assert_eq(rec.workers, 1);
    cr_assert_eq(rec.prefetch, 2);
    cr_assert(strstr(rec.criterion, "least slot memory"), "%s", rec.criterion);
    char line[256];
    nb_format_recommendation(&rec, 10.0, line, sizeof line);
    cr_assert(strstr(line, "num_workers=1 prefetch=2"), "%s", line);
    cr_assert(strstr(line, "stall 1.0%"), "%s", line);
}

Test(bench_recommend, compute_never_recommends_one_slot)
{
    /* The 1-slot run looks best (its stall is measured with the step's
     * sleep, yet it cannot overlap a real step's GPU work with a read):
     * the 2-slot run wins. Only when no run has two slots is one taken. */
    nb_run runs[] = {mk(1, 1, "auto", 2.0, 0.0, 1), mk(2, 2, "auto", 1.5, 1.5, 1)};
    nb_recommendation rec;
    cr_assert_eq(nb_recommend(runs, 2, 10.0, &rec), 1);
    cr_assert_eq(nb_recommend(runs, 2, 0, &rec), 1);
    cr_assert_eq(nb_recommend(runs, 1, 10.0, &rec), 0);
}

Test(bench_recommend, compute_ties_pick_less_memory)
{
    /* 0.3 and 1.9 points apart: noise; the smaller memory wins even though
     * it stalls a little more. */
    nb_run runs[] = {mk(4, 8, "auto", 1.3, 0.3, 1), mk(2, 4, "auto", 1.2, 1.9, 1)};
    nb_recommendation rec;
    cr_assert_eq(nb_recommend(runs, 2, 10.0, &rec), 1);
    runs[1].stall_pct = 2.5; /* 2.2 points: beyond the noise */
    cr_assert_eq(nb_recommend(runs, 2, 10.0, &rec), 0);
}

Test(bench_recommend, compute_fallback_lowest_stall)
{
    nb_run runs[] = {mk(1, 1, "auto", 1.0, 40.0, 1), mk(4, 8, "auto", 1.3, 5.0, 1),
                     mk(2, 4, "auto", 1.2, 5.0, 1), mk(8, 8, "auto", 9.9, 1.0, 0)};
    nb_recommendation rec;
    /* Lowest stall 5.0 is tied: the smaller (2,4) wins; the failed run with
     * 1.0 never counts. */
    cr_assert_eq(nb_recommend(runs, 4, 10.0, &rec), 2);
    check_matches_run(runs, 4, &rec);
}

Test(bench_recommend, paste_lines_carry_the_measured_run)
{
    nb_config c;
    memset(&c, 0, sizeof c);
    c.batch_size = 64;
    c.shuffle = 2;
    c.device = -1;
    c.nfields = 2;
    snprintf(c.fields[0].name, sizeof c.fields[0].name, "images");
    snprintf(c.fields[0].glob, sizeof c.fields[0].glob, "d/images/*.npy");
    snprintf(c.fields[1].name, sizeof c.fields[1].name, "heatmaps");
    snprintf(c.fields[1].glob, sizeof c.fields[1].glob, "d/h/*.npy");
    nb_run runs[] = {mk(3, 4, "io_uring", 1.0, 0.5, 1)};
    nb_recommendation rec;
    cr_assert_eq(nb_recommend(runs, 1, 5.0, &rec), 0);
    char py[1024], cl[512];
    nb_format_paste(&c, &rec, py, sizeof py, cl, sizeof cl);
    cr_assert_str_eq(py, "npyload.Loader({\"images\": \"d/images/*.npy\", \"heatmaps\": "
                         "\"d/h/*.npy\"}, batch_size=64, shuffle=\"local\", num_workers=3, "
                         "prefetch=3, io=\"uring\")");
    char tune[128];
    cr_assert_str_eq(nb_tuning_args(&rec, tune, sizeof tune),
                     "num_workers=3, prefetch=3, io=\"uring\"");
    /* The user's seed and drop_last are carried (issue 40). */
    c.seed = 7;
    c.seed_given = 1;
    c.drop_last = 1;
    char py2[1024], cl2[512];
    nb_format_paste(&c, &rec, py2, sizeof py2, cl2, sizeof cl2);
    cr_assert(strstr(py2, "io=\"uring\", seed=7, drop_last=True)"), "%s", py2);
    cr_assert_str_eq(cl, "npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, 3); "
                         "npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, 4); "
                         "npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, NPYLOAD_IO_URING);");
}

/* ---- JSON ---- */

static nb_config test_config(void)
{
    nb_config c;
    memset(&c, 0, sizeof c);
    c.batch_size = 128;
    c.shuffle = 1;
    c.device = -1;
    c.seconds = 1.5;
    c.nfields = 2;
    snprintf(c.fields[0].name, sizeof c.fields[0].name, "images");
    snprintf(c.fields[0].glob, sizeof c.fields[0].glob, "/d/\"q\"\\images/*.npy");
    c.fields[0].nfiles = 8;
    c.fields[0].sample_bytes = 1048576;
    snprintf(c.fields[0].descr, sizeof c.fields[0].descr, "<f4");
    c.fields[0].ndim = 3;
    c.fields[0].shape[0] = 2;
    c.fields[0].shape[1] = 256;
    c.fields[0].shape[2] = 512;
    snprintf(c.fields[1].name, sizeof c.fields[1].name, "heatmaps");
    snprintf(c.fields[1].glob, sizeof c.fields[1].glob, "h/*.npy");
    c.fields[1].nfiles = 8;
    c.fields[1].sample_bytes = 65536;
    c.fields[1].ndim = 0; /* scalar samples: an empty shape list */
    c.num_samples = 512;
    c.batch_bytes = 128ull * (1048576 + 65536);
    snprintf(c.ceiling_ref, sizeof c.ceiling_ref, "pread_copy");
    snprintf(c.note, sizeof c.note, "line one\nline\ttwo \x01");
    return c;
}

static char *write_json(const nb_report *rep)
{
    char *dir = tu_mkdtemp("bench_json");
    char *path = tu_path(dir, "out.json");
    cr_assert_eq(nb_write_json_file(path, rep), 0);
    size_t n;
    char *text = tu_read_file(path, &n);
    cr_assert(text);
    text = realloc(text, n + 1);
    text[n] = 0;
    free(path);
    tu_rmtree(dir);
    return text;
}

Test(bench_json, valid_document_with_everything)
{
    nb_config c = test_config();
    nb_machine m = {.cores_online = 2, .cores_allowed = 2, .mem_total_gib = 23.5};
    snprintf(m.kernel, sizeof m.kernel, "Linux 6.1");
    snprintf(m.library_version, sizeof m.library_version, "0.1.0");
    nb_ceiling ce[2];
    memset(ce, 0, sizeof ce);
    snprintf(ce[0].name, sizeof ce[0].name, "pread_copy");
    ce[0].measured = 1;
    ce[0].gbps = 10.5;
    snprintf(ce[1].name, sizeof ce[1].name, "odirect_uring");
    snprintf(ce[1].note, sizeof ce[1].note, "O_DIRECT open failed: \"EINVAL\"");
    nb_run runs[3] = {mk(1, 1, "auto", 1.0, 100, 1), mk(2, 4, "io_uring", 2.0, 100, 1),
                      mk(2, 8, "mmap", 0, 0, 0)};
    runs[0].frac_of_ceiling = 0.5;
    runs[0].p99_ms = NAN; /* must come out as null, never as nan */
    runs[1].gpu_samples = 3;
    runs[1].gpu_util_avg_pct = 50;
    snprintf(runs[2].error, sizeof runs[2].error, "start: bad\n\"thing\"");
    nb_recommendation rec;
    nb_recommend(runs, 3, 0, &rec);
    nb_report rep = {.config = &c, .machine = &m, .ceilings = ce, .nceilings = 2,
                     .runs = runs, .nruns = 3, .rec = &rec,
                     .warnings = "first warning\nsecond \"quoted\"\n"};
    char *text = write_json(&rep);
    cr_assert(strstr(text, "\"tool\": \"npyload-bench\""));
    cr_assert(strstr(text, "\"recommendation\": {\n    \"workers\": 2,\n    \"prefetch\": 4"), "%s", text);
    cr_assert(strstr(text, "\"p99\": null"));
    cr_assert(strstr(text, "\"gbps\": null")); /* the skipped ceiling */
    cr_assert(strstr(text, "\"sample_shape\": [2, 256, 512]"));
    cr_assert(strstr(text, "\"sample_shape\": []"));
    cr_assert(strstr(text, "\"second \\\"quoted\\\"\""));
    cr_assert(strstr(text, "\\u0001"));
    cr_assert(strstr(text, "\"gpu\": {\"samples\": 3"));
    cr_assert(strstr(text, "\"shuffle\": \"full\""));
    cr_assert_null(strstr(text, "nan"));
    free(text);
}

Test(bench_json, empty_runs_and_no_recommendation)
{
    nb_config c = test_config();
    c.nfields = 0;
    nb_machine m;
    memset(&m, 0, sizeof m);
    nb_recommendation rec;
    nb_recommend(NULL, 0, 0, &rec);
    nb_report rep = {.config = &c, .machine = &m, .rec = &rec};
    char *text = write_json(&rep);
    cr_assert(strstr(text, "\"recommendation\": null"));
    cr_assert(strstr(text, "\"runs\": []"));
    cr_assert(strstr(text, "\"warnings\": []"));
    free(text);
}

Test(bench_plot, svg_heatmaps)
{
    nb_config c = test_config();
    nb_machine m;
    memset(&m, 0, sizeof m);
    nb_run runs[] = {mk(1, 1, "auto", 1.0, 100, 1), mk(1, 2, "auto", 1.5, 100, 1),
                     mk(2, 1, "auto", 1.8, 100, 1), mk(2, 2, "auto", 0, 0, 0)};
    for (int i = 0; i < 4; i++) /* escaped in SVG text */
        snprintf(runs[i].io_used, sizeof runs[i].io_used, "<&>");
    nb_recommendation rec;
    nb_recommend(runs, 4, 0, &rec);
    nb_report rep = {.config = &c, .machine = &m, .runs = runs, .nruns = 4, .rec = &rec};
    char *dir = tu_mkdtemp("bench_plot");
    char *gbps = tu_path(dir, "g.svg"), *stall = tu_path(dir, "h.SVG");
    cr_assert_eq(nb_write_plot(gbps, &rep), 0);
    c.compute_ms = 5; /* stall heatmap */
    cr_assert_eq(nb_write_plot(stall, &rep), 0);
    size_t n;
    char *s = tu_read_file(gbps, &n);
    s = realloc(s, n + 1);
    s[n] = 0;
    cr_assert(!memcmp(s, "<svg", 4) && strstr(s, "</svg>\n"), "%s", s);
    cr_assert(strstr(s, "throughput GB/s"));
    cr_assert(strstr(s, ">1.80</text>"), "the best cell's figure");
    cr_assert(strstr(s, ">failed</text>"));
    cr_assert(strstr(s, "stroke=\"#e0102f\""), "the recommended cell is framed");
    cr_assert(strstr(s, "io = auto (active: &lt;&amp;&gt;)"), "%s", s);
    cr_assert_null(strstr(s, "<&>"));
    free(s);
    s = tu_read_file(stall, &n);
    s = realloc(s, n + 1);
    s[n] = 0;
    cr_assert(strstr(s, "consumer stall"));
    free(s);
    nb_report empty = {.config = &c, .machine = &m, .rec = &rec};
    cr_assert_eq(nb_write_plot(gbps, &empty), -1);
    free(gbps);
    free(stall);
    tu_rmtree(dir);
}

/* ---- the JSON writer shared with npyload-inspect ---- */

static char *nj_to_string(void (*write)(FILE *))
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    cr_assert(f);
    write(f);
    fclose(f);
    return buf;
}

static void nj_sample(FILE *f)
{
    cr_assert_eq(nj_printf(f, "{\"s\": %s, \"n\": %g, \"nan\": %g, \"b\": [%c, %c], "
                              "\"i\": %d, \"ll\": %lld, \"u\": %llu, \"z\": %zu, \"pct\": \"%%\"}",
                           "a\"b\\c\n\x01\xff\xc3\xa9", 2.5, NAN, 1, 0, -3, -4ll, 5ull,
                           (size_t)6),
                 0);
}

static void nj_bad(FILE *f)
{
    cr_assert_eq(nj_printf(f, "%x", 1u), -1); /* not a conversion it knows */
}

Test(bench_json, writer_conversions)
{
    char *s = nj_to_string(nj_sample);
    cr_assert_str_eq(s, "{\"s\": \"a\\\"b\\\\c\\n\\u0001\\u00ff\xc3\xa9\", \"n\": 2.5, "
                        "\"nan\": null, \"b\": [true, false], \"i\": -3, \"ll\": -4, \"u\": 5, "
                        "\"z\": 6, \"pct\": \"%\"}");
    free(s);
    free(nj_to_string(nj_bad));
}

/* ---- compression: the packing judgement and its JSON ---- */

static nb_zst_report zst_estimate(double ratio, double decode_gbps, double cold_sps,
                                  double warm_sps)
{
    nb_zst_report z;
    memset(&z, 0, sizeof z);
    z.valid = 1;
    z.estimate = 1;
    z.level = 3;
    z.frame_size = 131072;
    z.threads = 2;
    z.ratio = ratio;
    z.decode_gbps = decode_gbps;
    z.decode_gbps_per_core = decode_gbps / 2;
    z.raw_cold_sps = cold_sps;
    z.raw_warm_sps = warm_sps;
    z.dataset_gib = 250;
    z.packed_gib = 250 / ratio;
    z.mem_available_gib = 60;
    return z;
}

Test(bench_zst, disk_bound_packing_pays_until_decode_caps)
{
    /* 1 MiB samples: 1000 samples/s cold raw at ratio 8 would be 8000, but
     * the cores decode 2.097152 GB/s = 2000 samples/s: packed 2000, 2x */
    nb_zst_report z = zst_estimate(8, 2.097152, 1000, 5000);
    nb_zst_judge(&z, 1 << 20, 1);
    cr_assert_float_eq(z.expected_cold_sps, 2000, 1e-6);
    cr_assert_float_eq(z.expected_warm_sps, 2000, 1e-6);
    cr_assert_eq(z.pays, 1);
    cr_assert(strstr(z.verdict, "packing pays here"), "%s", z.verdict);
    cr_assert(strstr(z.verdict, "fits in the page cache"), "%s", z.verdict); /* 31 GiB < 36 */
    /* decode barely above the raw disk rate: under 1.2x, no */
    z = zst_estimate(8, 1.1 * 1.048576, 1000, 5000);
    nb_zst_judge(&z, 1 << 20, 1);
    cr_assert_float_eq(z.expected_cold_sps, 1100, 1e-6);
    cr_assert_eq(z.pays, 0);
    cr_assert(strstr(z.verdict, "does not pay"), "%s", z.verdict);
}

Test(bench_zst, page_cache_raw_wins_and_says_when_it_would_pay)
{
    nb_zst_report z = zst_estimate(9, 2.097152, 900, 5000);
    nb_zst_judge(&z, 1 << 20, 0);
    cr_assert_float_eq(z.expected_warm_sps, 2000, 1e-6);
    cr_assert_float_eq(z.expected_cold_sps, 2000, 1e-6);
    cr_assert_eq(z.pays, 0);
    cr_assert(strstr(z.verdict, "fits in the page cache"), "%s", z.verdict);
    cr_assert(strstr(z.verdict, "outgrows RAM"), "%s", z.verdict);
    /* no raw cold figure: the hint is left out, the verdict stays */
    z = zst_estimate(9, 1.048576, -1, 5000);
    nb_zst_judge(&z, 1 << 20, 0);
    cr_assert_eq(z.pays, 0);
    cr_assert_null(strstr(z.verdict, "outgrows"));
    cr_assert_float_eq(z.expected_cold_sps, -1, 1e-12);
}

/* Like with like (issue 40): in the page cache, packed data costs the same
 * workers the decode and the same transforms; the trial measured raw 1.7x
 * faster than packed there, where "raw x ratio, capped by all cores'
 * decode" promised packed faster. 1 MiB samples, ratio 2, 1 GB/s decode per
 * core: raw 0.1 ms copy + 0.5 ms transform per sample, packed 0.05 + 1.048576
 * + 0.5 ms. */
Test(bench_zst, page_cache_compares_the_same_workers_with_transforms)
{
    nb_zst_report z = zst_estimate(2, 2.0, 100, 1305);
    z.raw_cpu_ns_per_sample = 600000;
    z.transform_ns_per_sample = 500000;
    z.workers = 2;
    nb_zst_judge(&z, 1 << 20, 0);
    double packed = 50000 + 1048576 + 500000;
    cr_assert_float_eq(z.packed_cpu_ns_per_sample, packed, 1e-6);
    cr_assert_float_eq(z.expected_warm_sps, 1305 * 600000 / packed, 1e-6);
    cr_assert_eq(z.pays, 0, "%s", z.verdict);
    cr_assert(strstr(z.verdict, "does not pay") && strstr(z.verdict, "same 2 workers") &&
              strstr(z.verdict, "same transforms"), "%s", z.verdict);
    /* cold: the disk's 100 raw x ratio 2 = 200, under the workers' CPU cap */
    cr_assert_float_eq(z.expected_cold_sps, 200, 1e-6);
    /* disk-bound, the same CPU cap: 2 workers x 1e9 / packed ns */
    z = zst_estimate(2, 2.0, 1100, 1305);
    z.raw_cpu_ns_per_sample = 600000;
    z.transform_ns_per_sample = 500000;
    z.workers = 2;
    nb_zst_judge(&z, 1 << 20, 1);
    cr_assert_float_eq(z.expected_cold_sps, 2e9 / packed, 1e-6);
    cr_assert_eq(z.pays, 0, "%s", z.verdict); /* 1251 < 1.2 x 1100 */
}

Test(bench_zst, incompressible_unknown_and_packed)
{
    nb_zst_report z = zst_estimate(1.02, 5, 1000, 5000);
    nb_zst_judge(&z, 1 << 20, 1);
    cr_assert_eq(z.pays, 0);
    cr_assert(strstr(z.verdict, "compresses only 1.02x"), "%s", z.verdict);
    z = zst_estimate(8, 2, -1, 5000);
    nb_zst_judge(&z, 1 << 20, 1); /* disk-bound without a cold figure */
    cr_assert_eq(z.pays, -1);
    cr_assert(strstr(z.verdict, "not judged"), "%s", z.verdict);
    z = zst_estimate(8, 2.097152, -1, -1);
    z.estimate = 0;
    nb_zst_judge(&z, 1 << 20, 1);
    cr_assert_eq(z.pays, -1);
    cr_assert(strncmp(z.verdict, "packed fields: the cores decode 2000 samples/s", 46) == 0,
              "%s", z.verdict);
    memset(&z, 0, sizeof z);
    snprintf(z.note, sizeof z.note, "f.npy.zst: frame 3 at byte 9: checksum mismatch");
    nb_zst_judge(&z, 1 << 20, 1);
    cr_assert(strstr(z.verdict, "checksum mismatch"), "%s", z.verdict);
}

Test(bench_zst, json_object_and_null)
{
    nb_config c = test_config();
    nb_machine m = {.cores_online = 2, .cores_allowed = 2};
    nb_run runs[1] = {mk(1, 1, "auto", 1.0, 100, 1)};
    nb_recommendation rec;
    nb_recommend(runs, 1, 0, &rec);
    nb_report rep = {.config = &c, .machine = &m, .runs = runs, .nruns = 1, .rec = &rec};
    char *text = write_json(&rep);
    cr_assert(strstr(text, "\"compression\": null,\n  \"remote\": null,\n  \"auto\": null,"
                           "\n  \"warnings\""), "%s", text);
    free(text);

    nb_zst_report z = zst_estimate(8, 2.097152, -1, 5000);
    z.nfields = 2;
    snprintf(z.fields[0].name, sizeof z.fields[0].name, "images");
    z.fields[0].frames = 4;
    z.fields[0].samples_per_frame = 1;
    z.fields[0].raw_bytes = 4 << 20;
    z.fields[0].zst_bytes = 1 << 19;
    z.fields[0].ratio = 8;
    z.fields[0].decode_gbps = 2;
    z.fields[0].compress_mbps_per_core = 300;
    snprintf(z.fields[1].name, sizeof z.fields[1].name, "labels");
    z.fields[1].compressed = 1; /* a packed field in estimate mode: not sampled */
    snprintf(z.raw_warm_source, sizeof z.raw_warm_source, "runs (page cache)");
    nb_zst_judge(&z, 1 << 20, 0);
    rep.zst = &z;
    text = write_json(&rep);
    cr_assert(strstr(text, "\"mode\": \"estimate\", \"valid\": true, \"level\": 3, "
                           "\"frame_size\": 131072, \"threads\": 2, \"ratio\": 8"), "%s", text);
    cr_assert(strstr(text, "\"raw_cold_samples_per_s\": null"), "%s", text);
    cr_assert(strstr(text, "\"expected_cold_samples_per_s\": null"), "%s", text);
    cr_assert(strstr(text, "\"expected_warm_samples_per_s\": 2000"), "%s", text);
    cr_assert(strstr(text, "\"pays\": false"), "%s", text);
    cr_assert(strstr(text, "{\"name\": \"images\", \"compressed\": false, \"frames\": 4, "
                           "\"samples_per_frame\": 1, \"raw_bytes\": 4194304, "
                           "\"zst_bytes\": 524288, \"ratio\": 8, \"decode_gbps\": 2, "
                           "\"compress_mbps_per_core\": 300}"), "%s", text);
    cr_assert(strstr(text, "{\"name\": \"labels\", \"compressed\": true, \"frames\": 0, "
                           "\"samples_per_frame\": 0, \"raw_bytes\": 0, \"zst_bytes\": 0, "
                           "\"ratio\": null, \"decode_gbps\": null, "
                           "\"compress_mbps_per_core\": null}"), "%s", text);
    free(text);
}

/* ---- where the time goes ---- */

/* nb_verdict is the library's verdict on the timed counters; without a
 * step (compute_ms 0) the consumer is never named. */
Test(bench_verdict, uses_the_timed_counters_and_the_step)
{
    char v[512];
    nb_run r = mk(2, 4, "auto", 1.0, 0.5, 1);
    r.timed.batches_delivered = 50;
    r.timed.num_workers = 2;
    r.timed.elapsed_ns = 10000000000ull;
    r.timed.wait_ns = 100000000ull; /* 1 % of the loop */
    r.timed.step_ns = 9900000000ull;
    nb_verdict(&r, 20.0, v, sizeof v);
    cr_assert(strstr(v, "bottleneck: the consumer"), "%s", v);
    nb_verdict(&r, 0, v, sizeof v);
    cr_assert(!strstr(v, "consumer"), "%s", v);
    r.timed.decode_ns = 12000000000ull;
    nb_verdict(&r, 0, v, sizeof v);
    cr_assert(strstr(v, "bottleneck: decode"), "%s", v);
}

/* ---- close candidates: repeated, averaged, then the noise decides ---- */

Test(bench_close, candidates_are_the_runs_within_noise_pick_first)
{
    nb_run runs[] = {mk(1, 2, "auto", 1.0, 30.0, 1), mk(1, 4, "auto", 1.0, 10.5, 1),
                     mk(2, 4, "auto", 1.0, 9.5, 1), mk(2, 8, "auto", 1.0, 9.0, 1),
                     mk(4, 8, "auto", 1.0, 12.0, 1)};
    size_t n = sizeof runs / sizeof runs[0];
    nb_recommendation rec;
    cr_assert_eq(nb_recommend(runs, n, 20.0, &rec), 1, "least memory within 2 points");
    int idx[3];
    size_t k = nb_close_candidates(runs, n, 20.0, &rec, idx, 3);
    cr_assert_eq(k, 3);
    cr_assert_eq(idx[0], 1);
    cr_assert_eq(idx[1], 3, "the closest to the least stall next");
    cr_assert_eq(idx[2], 2);
    /* 12.0 is 3 points above: not a candidate; nor the 30 % run. */
    cr_assert_eq(nb_close_candidates(runs, n, 20.0, &rec, idx, 8), 3);
    /* Alone within noise: nothing to repeat. */
    nb_run lone[] = {mk(1, 2, "auto", 1.0, 40.0, 1), mk(2, 4, "auto", 1.0, 5.0, 1)};
    nb_recommend(lone, 2, 20.0, &rec);
    cr_assert_eq(nb_close_candidates(lone, 2, 20.0, &rec, idx, 3), 1);
}

Test(bench_close, repeat_averages_and_measured_spread_widens_the_noise)
{
    nb_run runs[] = {mk(1, 4, "auto", 1.0, 10.5, 1), mk(2, 4, "auto", 1.2, 9.0, 1)};
    runs[1].slot_mib = runs[0].slot_mib; /* same memory: fewer workers wins ties */
    nb_recommendation rec;
    cr_assert_eq(nb_recommend(runs, 2, 20.0, &rec), 0);
    /* The repeat of run 0 says 16.5: mean 13.5, spread 6 (noise 3 points). */
    nb_run again = mk(1, 4, "auto", 0.8, 16.5, 1);
    nb_merge_repeat(&runs[0], &again, 20.0);
    cr_assert_eq(runs[0].repeats, 2);
    cr_assert_float_eq(runs[0].stall_pct, 13.5, 1e-9);
    cr_assert_float_eq(runs[0].gbps, 0.9, 1e-9);
    cr_assert_float_eq(runs[0].spread, 6.0, 1e-9);
    cr_assert_float_eq(nb_noise(runs, 2, 20.0), 3.0, 1e-9);
    nb_run again1 = mk(2, 4, "auto", 1.2, 9.2, 1);
    nb_merge_repeat(&runs[1], &again1, 20.0);
    /* 13.5 vs 9.1: 4.4 points apart, above the measured noise of 3. */
    cr_assert_eq(nb_recommend(runs, 2, 20.0, &rec), 1);
    int idx[] = {1, 0};
    nb_format_close(runs, 2, idx, 2, 20.0, &rec);
    cr_assert(strstr(rec.close, "measured 2 times") && strstr(rec.close, "separated"), "%s",
              rec.close);
    /* A noisier machine: spread 10 -> noise 5: within it, fewer workers. */
    runs[0].spread = 10.0;
    cr_assert_eq(nb_recommend(runs, 2, 20.0, &rec), 0);
    nb_format_close(runs, 2, idx, 2, 20.0, &rec);
    cr_assert(strstr(rec.close, "within the noise (5.0 points)") &&
              strstr(rec.close, "least slot memory"), "%s", rec.close);
}

/* "What to do next" follows the verdict. */
Test(bench_next_steps, follows_the_verdict)
{
    nb_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.device = -1;
    cfg.compute_ms = 12;
    nb_run r = mk(2, 4, "auto", 1.0, 0.5, 1);
    r.frac_of_ceiling = 0.9;
    nb_recommendation rec;
    memset(&rec, 0, sizeof rec);
    rec.valid = 1;
    char s[640];
    struct {
        const char *verdict, *want;
    } cases[] = {
        {"bottleneck: the consumer (...)", "model step"},
        {"bottleneck: the disk (...)", "--cold --workers up to 4"},
        {"bottleneck: the object store (...)", "cache_dir"},
        {"bottleneck: decode (...)", "npyload-pack -l 1"},
        /* the GPU only on a machine with one (issue 40) */
        {"bottleneck: host transforms (...)", npyload_cuda_available(0, NULL, 0) == 1
                                                  ? "device=\"cuda\""
                                                  : "no CUDA device here"},
        {"bottleneck: the H2D copy (...)", "pinned"},
        {"bottleneck: CPU copies (...)", "90% of the machine's measured copy ceiling"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(rec.verdict, sizeof rec.verdict, "%s", cases[i].verdict);
        nb_next_steps(&cfg, &rec, &r, NULL, 2, s, sizeof s);
        cr_assert(strstr(s, cases[i].want), "%s -> %s", cases[i].verdict, s);
    }
    nb_zst_report z;
    memset(&z, 0, sizeof z);
    z.valid = 1;
    z.pays = 1;
    z.expected_cold_sps = 2345;
    snprintf(rec.verdict, sizeof rec.verdict, "bottleneck: the disk (...)");
    nb_next_steps(&cfg, &rec, &r, &z, 2, s, sizeof s);
    cr_assert(strstr(s, "expected cold 2345 samples/s packed"), "%s", s);
    r.workers = 1; /* a core free: more workers */
    snprintf(rec.verdict, sizeof rec.verdict, "bottleneck: CPU copies (...)");
    nb_next_steps(&cfg, &rec, &r, NULL, 2, s, sizeof s);
    cr_assert(strstr(s, "--workers up to 2"), "%s", s);
    cfg.device = 0; /* a CUDA loader: the GPU is the advice */
    snprintf(rec.verdict, sizeof rec.verdict, "bottleneck: host transforms (...)");
    nb_next_steps(&cfg, &rec, &r, NULL, 2, s, sizeof s);
    cr_assert(strstr(s, "GPU"), "%s", s);
}

/* Remote fields: the sweep, its recommendation, a point without latency
 * (null) and each run's remote counters. */
Test(bench_remote, json_block)
{
    nb_config c = test_config();
    nb_machine m = {.cores_online = 2, .cores_allowed = 2};
    nb_run runs[1] = {mk(1, 1, "auto", 1.0, 100, 1)};
    runs[0].timed.remote_bytes = 12345;
    runs[0].timed.remote_requests = 7;
    nb_recommendation rec;
    nb_recommend(runs, 1, 0, &rec);
    nb_remote_report x = {.measured = 1, .objects = 3, .object_bytes = 999,
                          .bytes_per_request = 65536, .seconds = 0.5, .npoints = 2,
                          .points = {{1, 1, 1, 10, 0.6, 2.5, 9}, {8, 4, 2, 50, 3.2, -1, -1}},
                          .best_mb_per_s = 3.2, .concurrency = 8, .workers = 2,
                          .max_inflight = 2, .requests = 40, .retries = 1};
    nb_report rep = {.config = &c, .machine = &m, .runs = runs, .nruns = 1, .rec = &rec,
                     .remote = &x};
    char *text = write_json(&rep);
    cr_assert(strstr(text, "\"remote\": {\"bytes\": 12345, \"requests\": 7, "), "%s", text);
    cr_assert(strstr(text, "\"p50_ms\": null, \"p99_ms\": null}"), "%s", text);
    cr_assert(strstr(text, "\"recommended_workers\": 2, \"recommended_max_inflight\": 2"), "%s",
              text);
    free(text);
}

/* ---- --auto ---- */

/* The auto run against the grid: the fastest succeeded run (a failed one
 * is ignored however fast), the ratio, and with a step the least stall and
 * the points over it; the line and the JSON say the same. */
Test(bench_auto, compares_with_the_best_fixed_run)
{
    nb_run runs[4] = {mk(1, 2, "auto", 1.0, 30, 1), mk(2, 2, "auto", 2.0, 12, 1),
                      mk(2, 4, "auto", 1.5, 4, 1), mk(4, 4, "auto", 9.0, 0, 0)};
    nb_auto_cmp c;
    memset(&c, 0, sizeof c);
    c.run = mk(2, 3, "auto", 1.9, 5.5, 1);
    c.run.final_workers = 2;
    c.run.final_slots = 3;
    c.run.auto_decisions = 4;
    nb_auto_compare(runs, 4, 0, &c);
    cr_assert_eq(c.best_index, 1);
    cr_assert_float_eq(c.ratio, 0.95, 1e-9);
    cr_assert_eq(c.least_stall_index, -1, "no step: no stall compared");
    cr_assert(isnan(c.stall_points));
    char line[768];
    nb_format_auto(&c, runs, 0, line, sizeof line);
    cr_assert(strstr(line, "auto: 2 workers, 3 slots at the end (4 decisions): "), "%s", line);
    cr_assert(strstr(line, " = 0.95 of the best fixed (w=2 p=2, "), "%s", line);
    cr_assert_null(strstr(line, "stall"), "%s", line);

    nb_auto_compare(runs, 4, 40, &c);
    cr_assert_eq(c.least_stall_index, 2);
    cr_assert_float_eq(c.stall_points, 1.5, 1e-9);
    nb_format_auto(&c, runs, 40, line, sizeof line);
    cr_assert(strstr(line, "; stall 5.5% = +1.5 points over the least (w=2 p=4, 4.0%)"), "%s",
              line);

    nb_config cfg = test_config();
    cfg.compute_ms = 40;
    nb_machine m = {.cores_online = 2, .cores_allowed = 2};
    nb_recommendation rec;
    nb_recommend(runs, 4, 40, &rec);
    nb_report rep = {.config = &cfg, .machine = &m, .runs = runs, .nruns = 4, .rec = &rec,
                     .autocmp = &c};
    char *text = write_json(&rep);
    cr_assert(strstr(text, "\"final_workers\": 2, \"final_slots\": 3, \"decisions\": 4,"), "%s",
              text);
    cr_assert(strstr(text, "\"best_run_index\": 1, \"ratio_to_best\": 0.95,"), "%s", text);
    cr_assert(strstr(text, "\"least_stall_run_index\": 2, \"stall_points_over_least\": 1.5,"),
              "%s", text);
    free(text);

    c.run.ok = 0; /* a failed auto run: no ratio */
    snprintf(c.run.error, sizeof c.run.error, "start: boom");
    nb_auto_compare(runs, 4, 0, &c);
    cr_assert_lt(c.ratio, 0);
    nb_format_auto(&c, runs, 0, line, sizeof line);
    cr_assert_str_eq(line, "auto: failed: start: boom");
}
