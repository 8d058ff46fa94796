/* npyload-bench, compression: the judgement of a packing estimate, the
 * "compression" object of the JSON document and the text section. Pure:
 * npyload_bench_zst.c measures, tests/test_bench_report.c checks this on
 * synthetic figures. */
#include "npyload_bench.h"
#include "npyload_json.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

static void vappend(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void vappend(char *buf, size_t len, const char *fmt, ...)
{
    size_t l = strlen(buf);
    if (l + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + l, len - l, fmt, ap);
    va_end(ap);
}

static double min2(double a, double b) { return a < b ? a : b; }

/* Packed data at ratio R: the storage delivers R times the samples for the
 * same bytes, until the cores' decode rate caps it. */
void nb_zst_judge(nb_zst_report *z, uint64_t sample_bytes, int disk_bound)
{
    z->expected_cold_sps = z->expected_warm_sps = -1;
    z->pays = -1;
    z->verdict[0] = 0;
    if (!z->valid || sample_bytes == 0 || z->ratio <= 0) {
        snprintf(z->verdict, sizeof z->verdict, "packing not judged: %s",
                 z->note[0] ? z->note : "nothing measured");
        return;
    }
    double dec = z->decode_gbps * 1e9 / (double)sample_bytes;
    /* Like with like: the same workers spend on a packed sample the copy
     * of ratio-times fewer bytes, the decode and the same transforms
     * (decode and transforms share the cores). The warm rate scales by the
     * CPU time per sample; the cold one is the disk's, ratio-times more,
     * until those workers' CPU caps it. */
    double cap = dec, warm_gain = z->ratio;
    z->packed_cpu_ns_per_sample = -1;
    if (z->raw_cpu_ns_per_sample > 0 && z->decode_gbps_per_core > 0 && z->workers > 0) {
        double t = z->transform_ns_per_sample > 0 ? z->transform_ns_per_sample : 0;
        double copy = z->raw_cpu_ns_per_sample > t ? z->raw_cpu_ns_per_sample - t : 0;
        double packed = copy / z->ratio + (double)sample_bytes / z->decode_gbps_per_core + t;
        z->packed_cpu_ns_per_sample = packed;
        cap = (double)z->workers * 1e9 / packed;
        warm_gain = z->raw_cpu_ns_per_sample / packed;
    }
    if (z->raw_cold_sps > 0)
        z->expected_cold_sps = min2(z->raw_cold_sps * z->ratio, cap);
    if (z->raw_warm_sps > 0)
        z->expected_warm_sps = z->packed_cpu_ns_per_sample > 0
                                   ? z->raw_warm_sps * warm_gain
                                   : min2(z->raw_warm_sps * z->ratio, dec);
    char *v = z->verdict;
    size_t vl = sizeof z->verdict;
    if (!z->estimate) {
        snprintf(v, vl,
                 "packed fields: the cores decode %.0f samples/s (%.2f GB/s, %.2f GB/s per "
                 "core) at ratio %.2fx",
                 dec, z->decode_gbps, z->decode_gbps_per_core, z->ratio);
        return;
    }
    if (z->ratio < 1.1) {
        z->pays = 0;
        snprintf(v, vl, "packing does not pay here: the data compresses only %.2fx", z->ratio);
        return;
    }
    if (disk_bound) {
        if (z->raw_cold_sps <= 0) {
            snprintf(v, vl, "packing not judged: no raw cold figure (%s); the cores decode %.0f "
                     "samples/s at ratio %.2fx", z->raw_cold_source[0] ? z->raw_cold_source
                     : "odirect ceiling skipped", dec, z->ratio);
            return;
        }
        z->pays = z->expected_cold_sps >= 1.2 * z->raw_cold_sps;
        snprintf(v, vl,
                 "packing %s here: the data is read from disk; packed ~%.0f samples/s "
                 "cold against %.0f raw (%.2fx; ratio %.2fx, %s %.0f)",
                 z->pays ? "pays" : "does not pay", z->expected_cold_sps, z->raw_cold_sps,
                 z->expected_cold_sps / z->raw_cold_sps, z->ratio,
                 z->packed_cpu_ns_per_sample > 0 ? "the workers decode and transform"
                                                 : "the cores decode", cap);
        if (z->mem_available_gib > 0 && z->packed_gib < 0.6 * z->mem_available_gib &&
            z->dataset_gib >= 0.6 * z->mem_available_gib)
            vappend(v, vl, "; packed (%.1f GiB) it fits in the page cache", z->packed_gib);
        return;
    }
    if (z->raw_warm_sps <= 0) {
        snprintf(v, vl, "packing not judged: no raw page-cache figure; the cores decode %.0f "
                 "samples/s at ratio %.2fx", dec, z->ratio);
        return;
    }
    z->pays = z->expected_warm_sps >= z->raw_warm_sps;
    if (z->packed_cpu_ns_per_sample > 0)
        snprintf(v, vl,
                 "packing %s here: the data fits in the page cache, where the loader gives "
                 "%.0f samples/s from raw files and ~%.0f from packed ones on the same %d "
                 "workers (%.0f us of CPU per sample raw, ~%.0f packed: decode%s on the "
                 "same cores)",
                 z->pays ? "pays" : "does not pay", z->raw_warm_sps, z->expected_warm_sps,
                 z->workers, z->raw_cpu_ns_per_sample / 1e3, z->packed_cpu_ns_per_sample / 1e3,
                 z->transform_ns_per_sample > 0 ? " and the same transforms" : "");
    else
        snprintf(v, vl,
                 "packing %s here: the data fits in the page cache, where raw reads give %.0f "
                 "samples/s and packed data ~%.0f (the cores decode %.0f)",
                 z->pays ? "pays" : "does not pay", z->raw_warm_sps, z->expected_warm_sps, dec);
    if (z->raw_cold_sps > 0 && z->expected_cold_sps >= 1.2 * z->raw_cold_sps)
        vappend(v, vl, "; it pays once the data outgrows RAM (cold: ~%.0f packed against "
                "%.0f raw)", z->expected_cold_sps, z->raw_cold_sps);
}

/* A figure, or null when unknown (< 0). */
static void num_or_null(FILE *f, const char *key, double v)
{
    if (v >= 0 && isfinite(v))
        fprintf(f, ", \"%s\": %g", key, v);
    else
        fprintf(f, ", \"%s\": null", key);
}

void nb_json_compression(FILE *f, const nb_zst_report *z)
{
    if (!z) {
        fputs(",\n  \"compression\": null", f);
        return;
    }
    nj_printf(f, ",\n  \"compression\": {\n    \"mode\": %s, \"valid\": %c",
              z->estimate ? "estimate" : "packed", z->valid);
    if (z->estimate)
        fprintf(f, ", \"level\": %d, \"frame_size\": %llu", z->level,
                (unsigned long long)z->frame_size);
    else
        fputs(", \"level\": null, \"frame_size\": null", f);
    fprintf(f, ", \"threads\": %d", z->threads);
    num_or_null(f, "ratio", z->valid ? z->ratio : -1);
    num_or_null(f, "decode_gbps", z->valid ? z->decode_gbps : -1);
    num_or_null(f, "decode_gbps_per_core", z->valid ? z->decode_gbps_per_core : -1);
    num_or_null(f, "compress_mbps_per_core",
                z->valid && z->estimate ? z->compress_mbps_per_core : -1);
    fputs(",\n    ", f);
    fprintf(f, "\"dataset_gib\": %g", z->dataset_gib);
    num_or_null(f, "packed_gib", z->valid ? z->packed_gib : -1);
    num_or_null(f, "mem_available_gib", z->mem_available_gib);
    num_or_null(f, "raw_cold_samples_per_s", z->raw_cold_sps);
    nj_printf(f, ", \"raw_cold_source\": %s", z->raw_cold_source);
    num_or_null(f, "raw_warm_samples_per_s", z->raw_warm_sps);
    nj_printf(f, ", \"raw_warm_source\": %s", z->raw_warm_source);
    fputs(",\n    \"expected_cold_samples_per_s\": ", f);
    if (z->expected_cold_sps >= 0 && isfinite(z->expected_cold_sps))
        fprintf(f, "%g", z->expected_cold_sps);
    else
        fputs("null", f);
    num_or_null(f, "expected_warm_samples_per_s", z->expected_warm_sps);
    /* The like-for-like figures behind expected_warm (null when the runs
     * gave no worker CPU time): the same workers, per sample. */
    fputs(",\n    ", f);
    fprintf(f, "\"workers\": %d", z->packed_cpu_ns_per_sample > 0 ? z->workers : 0);
    num_or_null(f, "raw_cpu_ns_per_sample",
                z->packed_cpu_ns_per_sample > 0 ? z->raw_cpu_ns_per_sample : -1);
    num_or_null(f, "transform_ns_per_sample",
                z->packed_cpu_ns_per_sample > 0 ? z->transform_ns_per_sample : -1);
    num_or_null(f, "packed_cpu_ns_per_sample", z->packed_cpu_ns_per_sample);
    fprintf(f, ", \"pays\": %s", z->pays < 0 ? "null" : z->pays ? "true" : "false");
    nj_printf(f, ",\n    \"verdict\": %s,\n    \"note\": %s,\n    \"fields\": [", z->verdict,
              z->note);
    for (int i = 0; i < z->nfields; i++) {
        const nb_zst_field *x = &z->fields[i];
        fputs(i ? ",\n      " : "\n      ", f);
        nj_printf(f, "{\"name\": %s, \"compressed\": %c, \"frames\": %d, "
                  "\"samples_per_frame\": %llu, \"raw_bytes\": %llu, \"zst_bytes\": %llu",
                  x->name, x->compressed, x->frames, (unsigned long long)x->samples_per_frame,
                  (unsigned long long)x->raw_bytes, (unsigned long long)x->zst_bytes);
        num_or_null(f, "ratio", x->zst_bytes ? x->ratio : -1);
        num_or_null(f, "decode_gbps", x->zst_bytes ? x->decode_gbps : -1);
        num_or_null(f, "compress_mbps_per_core",
                    !x->compressed && x->zst_bytes ? x->compress_mbps_per_core : -1);
        fputc('}', f);
    }
    fputs(z->nfields ? "\n    ]\n  }" : "]\n  }", f);
}

static void sps(char *buf, size_t len, double v)
{
    if (v >= 0)
        snprintf(buf, len, "%.0f samples/s", v);
    else
        snprintf(buf, len, "unknown");
}

void nb_print_compression(FILE *f, const nb_zst_report *z)
{
    if (!z)
        return;
    if (!z->valid) {
        fprintf(f, "compression: not measured (%s)\n", z->note);
        return;
    }
    if (z->estimate)
        fprintf(f, "compression: estimate for npyload-pack -l %d, %llu-byte frames, from a "
                "sample of frames:\n", z->level, (unsigned long long)z->frame_size);
    else
        fprintf(f, "compression: packed fields, frames decoded from memory:\n");
    for (int i = 0; i < z->nfields; i++) {
        const nb_zst_field *x = &z->fields[i];
        if (!x->zst_bytes) {
            fprintf(f, "  field %-10s raw (not decoded)\n", x->name);
            continue;
        }
        fprintf(f, "  field %-10s ratio %6.2fx  decode %6.2f GB/s (%d threads)", x->name,
                x->ratio, x->decode_gbps, z->threads);
        if (!x->compressed)
            fprintf(f, "  pack %5.0f MB/s per core", x->compress_mbps_per_core);
        fprintf(f, "  %d frames of %llu samples\n", x->frames,
                (unsigned long long)x->samples_per_frame);
    }
    fprintf(f, "  per batch: ratio %.2fx, decode %.2f GB/s (%.2f GB/s per core)", z->ratio,
            z->decode_gbps, z->decode_gbps_per_core);
    if (z->estimate)
        fprintf(f, ", pack %.0f MB/s per core", z->compress_mbps_per_core);
    fprintf(f, "; dataset %.2f GiB -> %.2f GiB packed\n", z->dataset_gib, z->packed_gib);
    char a[48], b[48], c[48], d[48];
    sps(a, sizeof a, z->raw_cold_sps);
    sps(b, sizeof b, z->raw_warm_sps);
    sps(c, sizeof c, z->expected_cold_sps);
    sps(d, sizeof d, z->expected_warm_sps);
    if (z->raw_cold_sps > 0)
        fprintf(f, "  raw: cold %s (%s), ", a, z->raw_cold_source[0] ? z->raw_cold_source : "-");
    else
        fprintf(f, "  raw: cold not measured (run with --cold), ");
    fprintf(f, "warm %s (%s)\n", b, z->raw_warm_source[0] ? z->raw_warm_source : "-");
    fprintf(f, "  %s: cold %s, warm %s\n", z->estimate ? "packed, expected" : "packed, bound",
            c, d);
}
