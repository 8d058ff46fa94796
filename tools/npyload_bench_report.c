/* npyload-bench, the pure part: percentiles, the recommendation, the JSON
 * document and the heatmap (PNG written by hand: stored deflate blocks,
 * CRC-32 and Adler-32 need no zlib; a built-in 5x7 font). Nothing here
 * measures or touches a loader, so tests/test_bench_report.c includes this
 * file and checks it on synthetic runs. */
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

/* ------------------------------------------------------------------------ */
/* JSON                                                                       */
/* ------------------------------------------------------------------------ */

static void nb_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

static void nb_json_num(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

/* "key": value helpers; `c` is the separator to print first. */
static void nb_kn(FILE *f, const char *c, const char *k, double v)
{
    fprintf(f, "%s\"%s\": ", c, k);
    nb_json_num(f, v);
}
static void nb_ki(FILE *f, const char *c, const char *k, long long v)
{
    fprintf(f, "%s\"%s\": %lld", c, k, v);
}
static void nb_kb(FILE *f, const char *c, const char *k, int v)
{
    fprintf(f, "%s\"%s\": %s", c, k, v ? "true" : "false");
}
static void nb_ks(FILE *f, const char *c, const char *k, const char *v)
{
    fprintf(f, "%s\"%s\": ", c, k);
    nb_json_str(f, v);
}

int nb_write_json(FILE *f, const nb_report *rep)
{
    const nb_config *c = rep->config;
    const nb_machine *m = rep->machine;
    const char *nl = ",\n    ";

    fputs("{\n", f);
    nb_ks(f, "  ", "tool", "npyload-bench");
    nb_ki(f, ",\n  ", "schema_version", 1);

    fputs(",\n  \"machine\": {\n", f);
    nb_ki(f, "    ", "cores_online", m->cores_online);
    nb_ki(f, nl, "cores_allowed", m->cores_allowed);
    nb_ks(f, nl, "kernel", m->kernel);
    nb_ks(f, nl, "cpu_model", m->cpu_model);
    nb_kn(f, nl, "mem_total_gib", m->mem_total_gib);
    nb_ks(f, nl, "library_version", m->library_version);
    nb_ks(f, nl, "hostname", m->hostname);
    fputs("\n  }", f);

    fputs(",\n  \"config\": {\n", f);
    nb_ki(f, "    ", "batch_size", c->batch_size);
    nb_ks(f, nl, "shuffle", c->shuffle == 2 ? "local" : c->shuffle ? "full" : "none");
    if (c->device < 0)
        nb_ks(f, nl, "device", "cpu");
    else {
        char d[32];
        snprintf(d, sizeof d, "cuda:%d", c->device);
        nb_ks(f, nl, "device", d);
    }
    nb_ki(f, nl, "batches", (long long)c->batches);
    nb_kn(f, nl, "seconds", c->seconds);
    nb_kn(f, nl, "compute_ms", c->compute_ms);
    nb_kb(f, nl, "cold", c->cold);
    nb_kb(f, nl, "direct", c->direct);
    nb_ki(f, nl, "num_samples", (long long)c->num_samples);
    nb_ki(f, nl, "batch_bytes", (long long)c->batch_bytes);
    nb_ks(f, nl, "ceiling_reference", c->ceiling_ref);
    nb_ks(f, nl, "note", c->note);
    fputs(",\n    \"fields\": [", f);
    for (int i = 0; i < c->nfields; i++) {
        const nb_field_info *fi = &c->fields[i];
        fputs(i ? ",\n      {" : "\n      {", f);
        nb_ks(f, "", "name", fi->name);
        nb_ks(f, ", ", "glob", fi->glob);
        nb_ki(f, ", ", "files", (long long)fi->nfiles);
        nb_ki(f, ", ", "sample_bytes", (long long)fi->sample_bytes);
        nb_ks(f, ", ", "descr", fi->descr);
        fputs(", \"sample_shape\": [", f);
        for (int d = 0; d < fi->ndim; d++)
            fprintf(f, "%s%lld", d ? ", " : "", (long long)fi->shape[d]);
        fputs("]}", f);
    }
    fputs(c->nfields ? "\n    ]\n  }" : "]\n  }", f);

    fputs(",\n  \"ceilings\": [", f);
    for (size_t i = 0; i < rep->nceilings; i++) {
        const nb_ceiling *ce = &rep->ceilings[i];
        fputs(i ? ",\n    {" : "\n    {", f);
        nb_ks(f, "", "name", ce->name);
        nb_kb(f, ", ", "measured", ce->measured);
        if (ce->measured)
            nb_kn(f, ", ", "gbps", ce->gbps);
        else
            fputs(", \"gbps\": null", f);
        nb_ki(f, ", ", "threads", ce->threads);
        nb_ki(f, ", ", "bytes", (long long)ce->bytes);
        nb_kn(f, ", ", "seconds", ce->seconds);
        nb_ks(f, ", ", "note", ce->note);
        fputs("}", f);
    }
    fputs(rep->nceilings ? "\n  ]" : "]", f);

    fputs(",\n  \"runs\": [", f);
    for (size_t i = 0; i < rep->nruns; i++) {
        const nb_run *r = &rep->runs[i];
        const char *s = ",\n      ";
        fputs(i ? ",\n    {\n" : "\n    {\n", f);
        nb_ki(f, "      ", "workers", r->workers);
        nb_ki(f, s, "prefetch", r->prefetch);
        nb_ks(f, s, "io_requested", r->io_requested_name);
        nb_ks(f, s, "io_used", r->io_used);
        nb_kb(f, s, "ok", r->ok);
        nb_ks(f, s, "error", r->error);
        nb_ki(f, s, "batches", (long long)r->batches);
        nb_ki(f, s, "samples", (long long)r->samples);
        nb_ki(f, s, "bytes", (long long)r->bytes);
        nb_kn(f, s, "wall_s", r->wall_s);
        nb_kn(f, s, "samples_per_s", r->samples_per_s);
        nb_kn(f, s, "gbps", r->gbps);
        if (r->frac_of_ceiling >= 0)
            nb_kn(f, s, "frac_of_ceiling", r->frac_of_ceiling);
        else
            fprintf(f, "%s\"frac_of_ceiling\": null", s);
        fprintf(f, "%s\"latency_ms\": {", s);
        nb_kn(f, "", "p50", r->p50_ms);
        nb_kn(f, ", ", "p99", r->p99_ms);
        nb_kn(f, ", ", "max", r->max_ms);
        fputs("}", f);
        nb_kn(f, s, "stall_pct", r->stall_pct);
        nb_kn(f, s, "cpu_pct", r->cpu_pct);
        nb_kn(f, s, "peak_rss_mib", r->peak_rss_mib);
        nb_kn(f, s, "base_rss_mib", r->base_rss_mib);
        nb_kn(f, s, "slot_mib", r->slot_mib);
        nb_kb(f, s, "pinned", r->pinned);
        nb_kb(f, s, "direct_io", r->direct_io);
        if (r->gpu_samples > 0) {
            fprintf(f, "%s\"gpu\": {", s);
            nb_ki(f, "", "samples", r->gpu_samples);
            nb_kn(f, ", ", "util_avg_pct", r->gpu_util_avg_pct);
            nb_kn(f, ", ", "util_max_pct", r->gpu_util_max_pct);
            nb_kn(f, ", ", "power_avg_w", r->gpu_power_avg_w);
            nb_kn(f, ", ", "mem_max_mib", r->gpu_mem_max_mib);
            fputs("}", f);
        } else {
            fprintf(f, "%s\"gpu\": null", s);
        }
        fputs("\n    }", f);
    }
    fputs(rep->nruns ? "\n  ]" : "]", f);

    const nb_recommendation *rec = rep->rec;
    if (rec && rec->valid) {
        char line[256];
        nb_format_recommendation(rec, c->compute_ms, line, sizeof line);
        fputs(",\n  \"recommendation\": {\n", f);
        nb_ki(f, "    ", "workers", rec->workers);
        nb_ki(f, nl, "prefetch", rec->prefetch);
        nb_ks(f, nl, "io", rec->io);
        nb_ki(f, nl, "run_index", rec->run_index);
        nb_kn(f, nl, "gbps", rec->gbps);
        nb_kn(f, nl, "samples_per_s", rec->samples_per_s);
        nb_kn(f, nl, "frac_of_best", rec->frac_of_best);
        nb_kn(f, nl, "stall_pct", rec->stall_pct);
        nb_kn(f, nl, "slot_mib", rec->slot_mib);
        nb_ks(f, nl, "criterion", rec->criterion);
        nb_ks(f, nl, "line", line);
        fputs("\n  }", f);
    } else {
        fputs(",\n  \"recommendation\": null", f);
    }

    fputs(",\n  \"warnings\": [", f);
    int nw = 0;
    if (rep->warnings) {
        const char *p = rep->warnings;
        while (*p) {
            const char *e = strchr(p, '\n');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            if (len) {
                char buf[1024];
                if (len >= sizeof buf)
                    len = sizeof buf - 1;
                memcpy(buf, p, len);
                buf[len] = 0;
                fputs(nw++ ? ",\n    " : "\n    ", f);
                nb_json_str(f, buf);
            }
            if (!e)
                break;
            p = e + 1;
        }
    }
    fputs(nw ? "\n  ]\n}\n" : "]\n}\n", f);
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
/* PNG without zlib                                                           */
/* ------------------------------------------------------------------------ */

uint32_t nb_crc32(const uint8_t *p, size_t n, uint32_t crc)
{
    static uint32_t table[256];
    static int ready;
    if (!ready) { /* benign race: every thread computes the same table */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    crc = ~crc;
    for (size_t i = 0; i < n; i++)
        crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint32_t nb_adler32(const uint8_t *p, size_t n)
{
    uint32_t a = 1, b = 0;
    for (size_t i = 0; i < n; i++) {
        a = (a + p[i]) % 65521u;
        b = (b + a) % 65521u;
    }
    return (b << 16) | a;
}

static void nb_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static int nb_png_chunk(FILE *f, const char *type, const uint8_t *data,
                        size_t n)
{
    uint8_t hdr[8];
    nb_be32(hdr, (uint32_t)n);
    memcpy(hdr + 4, type, 4);
    uint32_t crc = nb_crc32(hdr + 4, 4, 0);
    crc = nb_crc32(data, n, crc);
    uint8_t tail[4];
    nb_be32(tail, crc);
    if (fwrite(hdr, 1, 8, f) != 8)
        return -1;
    if (n && fwrite(data, 1, n, f) != n)
        return -1;
    return fwrite(tail, 1, 4, f) == 4 ? 0 : -1;
}

int nb_png_write(FILE *f, const uint8_t *rgb, int w, int h)
{
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (w <= 0 || h <= 0 || fwrite(sig, 1, 8, f) != 8)
        return -1;
    uint8_t ihdr[13];
    nb_be32(ihdr, (uint32_t)w);
    nb_be32(ihdr + 4, (uint32_t)h);
    ihdr[8] = 8;  /* bit depth */
    ihdr[9] = 2;  /* truecolour RGB */
    ihdr[10] = 0; /* deflate */
    ihdr[11] = 0; /* adaptive filters (we use filter 0 on every row) */
    ihdr[12] = 0; /* no interlace */
    if (nb_png_chunk(f, "IHDR", ihdr, sizeof ihdr))
        return -1;

    /* Raw scanlines: a filter byte 0 then the row. */
    size_t row = (size_t)w * 3 + 1;
    size_t raw_n = row * (size_t)h;
    uint8_t *raw = malloc(raw_n);
    if (!raw)
        return -1;
    for (int y = 0; y < h; y++) {
        raw[(size_t)y * row] = 0;
        memcpy(raw + (size_t)y * row + 1, rgb + (size_t)y * w * 3, (size_t)w * 3);
    }
    /* zlib stream: header, stored blocks of at most 65535 bytes, Adler-32. */
    size_t nblocks = raw_n / 65535 + 1;
    size_t z_n = 2 + raw_n + nblocks * 5 + 4;
    uint8_t *z = malloc(z_n);
    if (!z) {
        free(raw);
        return -1;
    }
    size_t o = 0;
    z[o++] = 0x78; /* deflate, 32K window */
    z[o++] = 0x01; /* no preset dictionary, fastest; (0x7801 % 31 == 0) */
    size_t left = raw_n, pos = 0;
    do {
        size_t len = left > 65535 ? 65535 : left;
        z[o++] = (uint8_t)(left == len); /* BFINAL, BTYPE 00 (stored) */
        z[o++] = (uint8_t)(len & 0xff);
        z[o++] = (uint8_t)(len >> 8);
        z[o++] = (uint8_t)(~len & 0xff);
        z[o++] = (uint8_t)((~len >> 8) & 0xff);
        memcpy(z + o, raw + pos, len);
        o += len;
        pos += len;
        left -= len;
    } while (left > 0);
    nb_be32(z + o, nb_adler32(raw, raw_n));
    o += 4;
    int rc = nb_png_chunk(f, "IDAT", z, o);
    free(z);
    free(raw);
    if (rc == 0)
        rc = nb_png_chunk(f, "IEND", NULL, 0);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* A 5x7 font (upper case; lower case letters are drawn as upper case)        */
/* ------------------------------------------------------------------------ */

typedef struct nb_glyph {
    char c;
    uint8_t rows[7]; /* bit 4 is the leftmost column */
} nb_glyph;

static const nb_glyph nb_font[] = {
    {' ', {0, 0, 0, 0, 0, 0, 0}},
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}},
    {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}},
    {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}},
    {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}},
    {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}},
    {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}},
    {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}},
    {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}},
    {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}},
    {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}},
    {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}},
    {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}},
    {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}},
    {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}},
    {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'.', {0, 0, 0, 0, 0, 0x0C, 0x0C}},
    {',', {0, 0, 0, 0, 0x0C, 0x04, 0x08}},
    {':', {0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}},
    {'/', {0, 0x01, 0x02, 0x04, 0x08, 0x10, 0}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}},
    {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'[', {0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E}},
    {']', {0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E}},
    {'=', {0, 0, 0x1F, 0, 0x1F, 0, 0}},
    {'-', {0, 0, 0, 0x1F, 0, 0, 0}},
    {'+', {0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0}},
    {'_', {0, 0, 0, 0, 0, 0, 0x1F}},
    {'*', {0, 0x04, 0x15, 0x0E, 0x15, 0x04, 0}},
    {'>', {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08}},
    {'<', {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02}},
    {'\'', {0x04, 0x04, 0x08, 0, 0, 0, 0}},
    {'?', {0x0E, 0x11, 0x01, 0x02, 0x04, 0, 0x04}},
};

static const nb_glyph *nb_glyph_for(char c)
{
    if (c >= 'a' && c <= 'z')
        c = (char)(c - 'a' + 'A');
    for (size_t i = 0; i < sizeof nb_font / sizeof nb_font[0]; i++)
        if (nb_font[i].c == c)
            return &nb_font[i];
    return &nb_font[sizeof nb_font / sizeof nb_font[0] - 1]; /* '?' */
}

/* ------------------------------------------------------------------------ */
/* A canvas that draws either into an RGB raster or as SVG                    */
/* ------------------------------------------------------------------------ */

typedef struct nb_canvas {
    int w, h;
    uint8_t *px; /* raster mode */
    FILE *svg;   /* svg mode */
} nb_canvas;

static void nb_rect(nb_canvas *cv, int x, int y, int w, int h, uint32_t rgb)
{
    if (cv->svg) {
        fprintf(cv->svg,
                "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#%06x\"/>\n",
                x, y, w, h, rgb & 0xffffff);
        return;
    }
    for (int j = y; j < y + h; j++) {
        if (j < 0 || j >= cv->h)
            continue;
        for (int i = x; i < x + w; i++) {
            if (i < 0 || i >= cv->w)
                continue;
            uint8_t *p = cv->px + ((size_t)j * cv->w + i) * 3;
            p[0] = (uint8_t)(rgb >> 16);
            p[1] = (uint8_t)(rgb >> 8);
            p[2] = (uint8_t)rgb;
        }
    }
}

#define NB_CHAR_W 6 /* 5 columns + 1 of spacing, before scaling */

static int nb_text_width(const char *s, int scale)
{
    int n = (int)strlen(s);
    return n ? (n * NB_CHAR_W - 1) * scale : 0;
}

/* Draws s with its top-left corner at (x, y); align: 0 left, 1 centre,
 * 2 right of x. */
static void nb_text(nb_canvas *cv, int x, int y, const char *s, int scale,
                    uint32_t rgb, int align)
{
    int tw = nb_text_width(s, scale);
    if (align == 1)
        x -= tw / 2;
    else if (align == 2)
        x -= tw;
    if (cv->svg) {
        fprintf(cv->svg,
                "<text x=\"%d\" y=\"%d\" font-family=\"monospace\" "
                "font-size=\"%d\" textLength=\"%d\" fill=\"#%06x\">",
                x, y + 7 * scale, 9 * scale, tw > 0 ? tw : 1, rgb & 0xffffff);
        for (const char *p = s; *p; p++) {
            if (*p == '<') fputs("&lt;", cv->svg);
            else if (*p == '>') fputs("&gt;", cv->svg);
            else if (*p == '&') fputs("&amp;", cv->svg);
            else fputc(*p, cv->svg);
        }
        fputs("</text>\n", cv->svg);
        return;
    }
    for (const char *p = s; *p; p++, x += NB_CHAR_W * scale) {
        const nb_glyph *g = nb_glyph_for(*p);
        for (int r = 0; r < 7; r++)
            for (int c = 0; c < 5; c++)
                if (g->rows[r] & (0x10 >> c))
                    nb_rect(cv, x + c * scale, y + r * scale, scale, scale, rgb);
    }
}

/* Vertical text, bottom to top, one character per line (the 5x7 font does
 * not rotate well): used for the y axis label. */
static void nb_text_vertical(nb_canvas *cv, int x, int ycentre, const char *s,
                             int scale, uint32_t rgb)
{
    int n = (int)strlen(s);
    int step = 9 * scale;
    int y = ycentre - n * step / 2;
    for (int i = 0; i < n; i++) {
        char one[2] = {s[i], 0};
        nb_text(cv, x, y + i * step, one, scale, rgb, 1);
    }
}

/* A perceptually ordered palette (viridis stops), t in [0,1]. */
static uint32_t nb_palette(double t)
{
    static const uint8_t stops[5][3] = {
        {68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
    if (!(t >= 0))
        t = 0;
    if (t > 1)
        t = 1;
    double x = t * 4;
    int i = (int)x;
    if (i >= 4)
        i = 3;
    double f = x - i;
    uint32_t rgb = 0;
    for (int k = 0; k < 3; k++) {
        double v = stops[i][k] + (stops[i + 1][k] - stops[i][k]) * f;
        rgb = (rgb << 8) | (uint32_t)(v + 0.5);
    }
    return rgb;
}

static uint32_t nb_text_on(uint32_t bg)
{
    double l = 0.299 * (bg >> 16 & 0xff) + 0.587 * (bg >> 8 & 0xff) +
               0.114 * (bg & 0xff);
    return l < 140 ? 0xffffff : 0x000000;
}

static int nb_int_index(const int *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return i;
    return -1;
}

static void nb_sort_unique(int *v, int *n)
{
    for (int i = 1; i < *n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            int t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    int k = 0;
    for (int i = 0; i < *n; i++)
        if (k == 0 || v[k - 1] != v[i])
            v[k++] = v[i];
    *n = k;
}

/* Layout constants (pixels). */
enum {
    NB_SCALE = 2,
    NB_CELL_W = 170,
    NB_CELL_H = 64,
    NB_MARGIN_L = 110,
    NB_MARGIN_R = 150, /* colour bar */
    NB_TITLE_H = 96,
    NB_PANEL_TITLE_H = 30,
    NB_AXIS_H = 64,
    NB_FOOT_H = 52,
};

/* The text lines around the grid: title, subtitle, ceiling, recommendation.
 * Computed once so the canvas can be made wide enough for them. */
typedef struct nb_plot_text {
    char title[160];
    char sub[256];
    char ceil[160];
    char rec[256];
} nb_plot_text;

static void nb_plot_texts(const nb_report *rep, int stall, nb_plot_text *t)
{
    const nb_config *c = rep->config;
    memset(t, 0, sizeof *t);
    snprintf(t->title, sizeof t->title, "npyload-bench: %s",
             stall ? "consumer stall %, lower is better"
                   : "throughput GB/s, higher is better");
    char dev[24];
    if (c->device < 0)
        snprintf(dev, sizeof dev, "cpu");
    else
        snprintf(dev, sizeof dev, "cuda:%d", c->device);
    snprintf(t->sub, sizeof t->sub, "batch %d, %s%s%s, %s, %lld samples",
             c->batch_size,
             c->shuffle == 2 ? "local shuffle" : c->shuffle ? "shuffle" : "in order",
             c->cold ? ", cold cache" : "", c->direct ? ", o_direct" : "", dev,
             (long long)c->num_samples);
    if (stall) {
        size_t l = strlen(t->sub);
        snprintf(t->sub + l, sizeof t->sub - l, ", compute %.3g ms/step",
                 c->compute_ms);
    }
    for (size_t i = 0; i < rep->nceilings; i++)
        if (rep->ceilings[i].measured &&
            strcmp(rep->ceilings[i].name, c->ceiling_ref) == 0)
            snprintf(t->ceil, sizeof t->ceil, "ceiling (%s): %.2f GB/s",
                     rep->ceilings[i].name, rep->ceilings[i].gbps);
    if (rep->rec && rep->rec->valid)
        nb_format_recommendation(rep->rec, c->compute_ms, t->rec, sizeof t->rec);
}

static void nb_draw(nb_canvas *cv, const nb_report *rep, const nb_plot_text *tx,
                    const int *ws, int nw, const int *ps, int np, char ios[][16],
                    int nio, int stall, double vmin, double vmax)
{
    const uint32_t ink = 0x202020;
    char buf[256];
    nb_rect(cv, 0, 0, cv->w, cv->h, 0xffffff);
    nb_text(cv, 16, 12, tx->title, NB_SCALE + 1, ink, 0);
    nb_text(cv, 16, 44, tx->sub, NB_SCALE, 0x505050, 0);
    nb_text(cv, 16, 64, tx->ceil, NB_SCALE, 0x505050, 0);

    int grid_w = np * NB_CELL_W, grid_h = nw * NB_CELL_H;
    int panel_h = NB_PANEL_TITLE_H + grid_h + NB_AXIS_H;
    for (int k = 0; k < nio; k++) {
        int top = NB_TITLE_H + k * panel_h;
        int gx = NB_MARGIN_L, gy = top + NB_PANEL_TITLE_H;
        const char *used = "";
        for (size_t i = 0; i < rep->nruns; i++)
            if (rep->runs[i].ok && strcmp(rep->runs[i].io_requested_name, ios[k]) == 0)
                used = rep->runs[i].io_used;
        if (*used && strcmp(used, ios[k]) != 0)
            snprintf(buf, sizeof buf, "io = %s (active: %s)", ios[k], used);
        else
            snprintf(buf, sizeof buf, "io = %s", ios[k]);
        nb_text(cv, gx, top + 8, buf, NB_SCALE, ink, 0);
        for (int wi = 0; wi < nw; wi++) {
            int y = gy + (nw - 1 - wi) * NB_CELL_H; /* more workers higher up */
            snprintf(buf, sizeof buf, "%d", ws[wi]);
            nb_text(cv, gx - 12, y + NB_CELL_H / 2 - 7, buf, NB_SCALE, ink, 2);
            for (int pi = 0; pi < np; pi++) {
                int x = gx + pi * NB_CELL_W;
                const nb_run *r = NULL;
                int ri = -1;
                for (size_t i = 0; i < rep->nruns; i++)
                    if (rep->runs[i].workers == ws[wi] &&
                        rep->runs[i].prefetch == ps[pi] &&
                        strcmp(rep->runs[i].io_requested_name, ios[k]) == 0) {
                        r = &rep->runs[i];
                        ri = (int)i;
                    }
                uint32_t bg = 0xdddddd;
                char l1[32] = "-", l2[48] = "";
                if (r && r->ok) {
                    double v = stall ? r->stall_pct : r->gbps;
                    double t = vmax > vmin ? (v - vmin) / (vmax - vmin) : 1.0;
                    if (stall)
                        t = 1.0 - t; /* low stall is good: bright */
                    bg = nb_palette(t);
                    if (stall) {
                        snprintf(l1, sizeof l1, "%.1f%%", r->stall_pct);
                        snprintf(l2, sizeof l2, "%.2f GB/s", r->gbps);
                    } else {
                        snprintf(l1, sizeof l1, "%.2f", r->gbps);
                        if (r->frac_of_ceiling >= 0)
                            snprintf(l2, sizeof l2, "%.0f%% of ceil",
                                     100 * r->frac_of_ceiling);
                        else
                            snprintf(l2, sizeof l2, "p99 %.1f ms", r->p99_ms);
                    }
                } else if (r) {
                    snprintf(l1, sizeof l1, "failed");
                }
                nb_rect(cv, x, y, NB_CELL_W, NB_CELL_H, 0xffffff);
                nb_rect(cv, x + 1, y + 1, NB_CELL_W - 2, NB_CELL_H - 2, bg);
                uint32_t fg = nb_text_on(bg);
                nb_text(cv, x + NB_CELL_W / 2, y + 12, l1, NB_SCALE + 1, fg, 1);
                nb_text(cv, x + NB_CELL_W / 2, y + 40, l2, NB_SCALE, fg, 1);
                if (rep->rec && rep->rec->valid && rep->rec->run_index == ri) {
                    /* The recommended cell: a thick red frame. */
                    uint32_t red = 0xe0102f;
                    nb_rect(cv, x, y, NB_CELL_W, 4, red);
                    nb_rect(cv, x, y + NB_CELL_H - 4, NB_CELL_W, 4, red);
                    nb_rect(cv, x, y, 4, NB_CELL_H, red);
                    nb_rect(cv, x + NB_CELL_W - 4, y, 4, NB_CELL_H, red);
                }
            }
        }
        for (int pi = 0; pi < np; pi++) {
            snprintf(buf, sizeof buf, "%d", ps[pi]);
            nb_text(cv, gx + pi * NB_CELL_W + NB_CELL_W / 2, gy + grid_h + 8, buf,
                    NB_SCALE, ink, 1);
        }
        nb_text(cv, gx + grid_w / 2, gy + grid_h + 34,
                "prefetch (batch slots)", NB_SCALE, ink, 1);
        nb_text_vertical(cv, 22, gy + grid_h / 2, "workers", NB_SCALE, ink);
    }

    /* Colour bar. */
    int bx = NB_MARGIN_L + np * NB_CELL_W + 40;
    int by = NB_TITLE_H + NB_PANEL_TITLE_H;
    int bh = nw * NB_CELL_H;
    if (bh < 120)
        bh = 120;
    for (int j = 0; j < bh; j++) {
        double t = 1.0 - (double)j / (bh - 1);
        nb_rect(cv, bx, by + j, 20, 1, nb_palette(t));
    }
    char hi[32], lo[32];
    if (stall) {
        snprintf(hi, sizeof hi, "%.1f%%", vmin);
        snprintf(lo, sizeof lo, "%.1f%%", vmax);
    } else {
        snprintf(hi, sizeof hi, "%.2f", vmax);
        snprintf(lo, sizeof lo, "%.2f", vmin);
    }
    nb_text(cv, bx + 26, by, hi, NB_SCALE, ink, 0);
    nb_text(cv, bx + 26, by + bh - 14, lo, NB_SCALE, ink, 0);

    int fy = cv->h - NB_FOOT_H + 4;
    if (tx->rec[0]) {
        nb_text(cv, 16, fy, tx->rec, NB_SCALE, 0xe0102f, 0);
        nb_text(cv, 16, fy + 20, "red frame = recommended configuration",
                NB_SCALE, 0x505050, 0);
    }
}

static int nb_ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    if (a < b)
        return 0;
    for (size_t i = 0; i < b; i++) {
        char x = s[a - b + i];
        if (x >= 'A' && x <= 'Z')
            x = (char)(x - 'A' + 'a');
        if (x != suffix[i])
            return 0;
    }
    return 1;
}

int nb_write_plot(const char *path, const nb_report *rep)
{
    int ws[NB_MAX_GRID * NB_MAX_IO * NB_MAX_GRID], ps[NB_MAX_GRID * NB_MAX_IO * NB_MAX_GRID];
    int nw = 0, np = 0, nio = 0;
    char ios[NB_MAX_IO][16];
    int stall = rep->config->compute_ms > 0;
    double vmin = INFINITY, vmax = -INFINITY;
    for (size_t i = 0; i < rep->nruns; i++) {
        const nb_run *r = &rep->runs[i];
        if (nb_int_index(ws, nw, r->workers) < 0 && nw < (int)(sizeof ws / sizeof ws[0]))
            ws[nw++] = r->workers;
        if (nb_int_index(ps, np, r->prefetch) < 0 && np < (int)(sizeof ps / sizeof ps[0]))
            ps[np++] = r->prefetch;
        int seen = 0;
        for (int k = 0; k < nio; k++)
            seen |= strcmp(ios[k], r->io_requested_name) == 0;
        if (!seen && nio < NB_MAX_IO)
            snprintf(ios[nio++], sizeof ios[0], "%s", r->io_requested_name);
        if (r->ok) {
            double v = stall ? r->stall_pct : r->gbps;
            if (v < vmin) vmin = v;
            if (v > vmax) vmax = v;
        }
    }
    if (nw == 0 || np == 0)
        return -1;
    nb_sort_unique(ws, &nw);
    nb_sort_unique(ps, &np);
    if (!isfinite(vmin)) {
        vmin = 0;
        vmax = 1;
    }
    if (!stall)
        vmin = 0; /* throughput from zero: colours compare ratios honestly */

    int grid_w = np * NB_CELL_W;
    int panel_h = NB_PANEL_TITLE_H + nw * NB_CELL_H + NB_AXIS_H;
    nb_plot_text tx;
    nb_plot_texts(rep, stall, &tx);
    nb_canvas cv = {0};
    cv.w = NB_MARGIN_L + grid_w + NB_MARGIN_R;
    int tw[4] = {nb_text_width(tx.title, NB_SCALE + 1), nb_text_width(tx.sub, NB_SCALE),
                 nb_text_width(tx.ceil, NB_SCALE), nb_text_width(tx.rec, NB_SCALE)};
    for (int i = 0; i < 4; i++)
        if (tw[i] + 32 > cv.w)
            cv.w = tw[i] + 32;
    cv.h = NB_TITLE_H + nio * panel_h + NB_FOOT_H;
    if (cv.h < NB_TITLE_H + NB_PANEL_TITLE_H + 120 + NB_FOOT_H + 20)
        cv.h = NB_TITLE_H + NB_PANEL_TITLE_H + 120 + NB_FOOT_H + 20;

    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int rc = 0;
    if (nb_ends_with(path, ".svg")) {
        cv.svg = f;
        fprintf(f,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                "viewBox=\"0 0 %d %d\">\n",
                cv.w, cv.h, cv.w, cv.h);
        nb_draw(&cv, rep, &tx, ws, nw, ps, np, ios, nio, stall, vmin, vmax);
        fputs("</svg>\n", f);
        rc = ferror(f) ? -1 : 0;
    } else {
        cv.px = malloc((size_t)cv.w * cv.h * 3);
        if (!cv.px) {
            fclose(f);
            return -1;
        }
        nb_draw(&cv, rep, &tx, ws, nw, ps, np, ios, nio, stall, vmin, vmax);
        rc = nb_png_write(f, cv.px, cv.w, cv.h);
        free(cv.px);
    }
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}
