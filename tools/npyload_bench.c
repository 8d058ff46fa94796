/* npyload-bench: measures the loader over a workers x prefetch x io grid on
 * the user's own files, next to the machine's own ceilings measured in the
 * same run, and recommends num_workers and prefetch.
 *
 *   npyload-bench name=GLOB... [--batch-size N] [--workers 1,2,4]
 *       [--prefetch 1,2,4,8] [--io auto,io_uring,pread,mmap] [--shuffle]
 *       [--device cpu|cuda:N] [--batches N | --seconds S] [--compute-ms X]
 *       [--cold] [--direct] [--json FILE] [--plot FILE.svg] [--quiet]
 *
 * This file is the command line and the order of the work: set-up, the
 * ceilings, the grid, the recommendation, compression and the reports.
 * Calls only go down; each file includes only the headers of files below
 * it (measure.h declares the measuring side, bench.h the report core):
 *
 *   npyload_bench.c              command line, order of the work
 *     |-- npyload_bench_measure.c  one configuration of the grid, monitor
 *     |     |-- npyload_bench_gpu.c    h2d ceiling, GPU step
 *     |-- npyload_bench_zst.c      decode ceiling, packing estimate
 *     |     |-- npyload_bench_ceiling.c  pread/gather copy, O_DIRECT read
 *     |-- npyload_bench_ceiling.c
 *     `-- npyload_bench_data.c     files, headers, order, eviction, clock,
 *                                  warnings (below every measuring file)
 *   report core (npyload_bench_core, no measuring):
 *     npyload_bench_report.c, npyload_bench_plot.c
 *       |-- npyload_bench_zst_report.c, npyload_bench_recommend.c
 *       `-- npyload_json.c
 *   below all: include/npyload.h (with NPYLOAD_EXPERIMENTAL: the compute
 *   simulator, NVML, the ranged-GET sweep)
 *
 * Uses nothing of lib/ but include/npyload.h: the ceilings are the
 * library's (npyload_loader_ceiling, npyload_cuda_h2d_bandwidth, read
 * through the loader's own readers); libc and pthreads. */
#include "npyload_args.h"
#include "npyload_bench_measure.h"
#include "npyload_info_print.h"
#include "npyload_remote_env.h"

#include <errno.h>
#include <math.h>
#include <getopt.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Small helpers                                                              */
/* ------------------------------------------------------------------------ */

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("npyload-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nrun 'npyload-bench --help' for the options\n", stderr);
    exit(2);
}

/* ------------------------------------------------------------------------ */
/* Options                                                                    */
/* ------------------------------------------------------------------------ */

static const char usage[] =
    "usage: npyload-bench name=GLOB... [options]\n"
    "Measures npyload on your files over a workers x prefetch (x io) grid,\n"
    "next to the machine's own ceilings measured in the same run, and\n"
    "recommends num_workers and prefetch.\n"
    "\n"
    "  name=GLOB            a field: its NPY files (quote the glob); .npy.zst\n"
    "                       fields get the cores' decode ceiling (zst_decode),\n"
    "                       raw .npy fields an estimate of what npyload-pack\n"
    "                       would give here and whether packing pays\n"
    "  --source NAME=FIELD=GLOB[,FIELD=GLOB...]\n"
    "                       a mixture (instead of name=GLOB fields): one source,\n"
    "                       its fields; repeat per source, each with the same\n"
    "                       fields (as npyload.Loader(sources=...))\n"
    "  --weights NAME=W[,NAME=W...]\n"
    "                       the sources' weights (default: their sample counts);\n"
    "                       the report counts the rows each source gave\n"
    "  --batch-size N       samples per batch (default 128)\n"
    "  --workers LIST       worker counts, e.g. 1,2,4 (default 1,2)\n"
    "  --prefetch LIST      batch slots, as C's PREFETCH (Python prefetch =\n"
    "                       slots - 1) (default 1,2,4)\n"
    "  --io LIST            auto,io_uring,pread,mmap (default auto)\n"
    "  --shuffle[=local]    full shuffle (or locality-preserving)\n"
    "  --seed N, --drop-last  your Loader's seed and drop_last: measured with\n"
    "                       them and carried into the pasted line\n"
    "  --device D           cpu (default) or cuda:N\n"
    "  --seconds S          measure each configuration for S s (default 1.5),\n"
    "                       and for at least 10 batches (up to 60 s)\n"
    "  --batches N          measure each configuration for N batches instead\n"
    "  --compute-ms X       simulate a training step of X ms per batch (a host\n"
    "                       sleep; with cuda a GPU busy kernel); the\n"
    "                       recommendation then minimises consumer stall\n"
    "  --cold               evict the files from the page cache before each run\n"
    "  --warmup-batches N   untimed batches before each fixed run's timed part\n"
    "                       (default: prefetch + 1, at most 4 and half an\n"
    "                       epoch; --cold: 1); N wraps epochs (not with\n"
    "                       --cold). The default times the first epoch's\n"
    "                       page-table population (a minor fault per 16\n"
    "                       cached pages); N = the batches of an epoch times\n"
    "                       the steady state, as gather_copy's warm-up pass\n"
    "                       does. --auto runs have none\n"
    "  --direct             O_DIRECT reads in the loader\n"
    "  --transform F=SPEC   the field's transform in the workers (or on the\n"
    "                       GPU), as npyload.Transform: SPEC = dtype[,scale=X]\n"
    "                       [,mean=A:B..][,std=A:B..][,channels_last]\n"
    "                       [,hflip=P][,vflip=P][,crop=H:W or N][,pad=N]\n"
    "                       [,hflip_sign=A:B..][,vflip_sign=A:B..], dtype\n"
    "                       keep|float32|float16|bfloat16, X a number or A/B,\n"
    "                       P a probability; e.g.\n"
    "                       images=float32,scale=1/255,mean=0.5,std=0.25,hflip=0.5\n"
    "  --ranks R            R loaders at once, rank r of R (as torchrun\n"
    "                       --nproc_per_node=R runs them, here as threads):\n"
    "                       workers and prefetch per rank, samples/s the\n"
    "                       node's total; host steps only (not with --device)\n"
    "  --no-repeat          do not measure the close candidates a second time\n"
    "                       (by default up to 3 runs as good as the pick\n"
    "                       within noise are repeated and averaged before\n"
    "                       the recommendation is final)\n"
    "  --auto               also run the auto loader (num_workers and prefetch\n"
    "                       'auto': the controller tunes them as it runs), as\n"
    "                       long as a grid run and without warm-up, and print\n"
    "                       its samples/s as a ratio to the best fixed run\n"
    "                       (with --compute-ms also its stall against the\n"
    "                       least); in --json as \"auto\"\n"
    "  --no-read-ahead      workers read each batch only when they start it\n"
    "                       (READ_AHEAD -1), to compare with the default\n"
    "  --json FILE          every run, the ceilings and the machine (schema:\n"
    "                       bench/schema.json)\n"
    "  --plot FILE.svg      heatmap over the grid, as SVG (a FILE.png name\n"
    "                       writes FILE.svg beside it and says so; for a PNG:\n"
    "                       rsvg-convert -o FILE.png FILE.svg)\n"
    "  --quiet              only the recommendation line\n"
    "\n"
    "Remote fields (name=s3://BUCKET/PATTERN, or an http(s):// URL) are read\n"
    "with the loader's ranged GETs, configured like npyload-inspect from\n"
    "AWS_ENDPOINT_URL[_S3], AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,\n"
    "AWS_SESSION_TOKEN, AWS_PROFILE, AWS_CA_BUNDLE and ~/.aws. The store's\n"
    "ranged-GET throughput and latency at several concurrencies replace the\n"
    "local ceilings (remote_get), its best concurrency recommends workers and\n"
    "requests in flight (used by the grid), and the JSON gets the remote\n"
    "counters per run; the page cache and the compression estimate are skipped.\n";

typedef struct opts {
    int workers[NB_MAX_GRID], nworkers;
    const char *transforms[NB_MAX_FIELDS]; /* --transform, applied after the fields */
    int ntransforms;
    int prefetch[NB_MAX_GRID], nprefetch;
    int io[NB_MAX_IO], nio;
    int seconds_given;
    int no_repeat;            /* --no-repeat */
    int auto_run;             /* --auto */
    const char *json, *plot;
    char plot_svg[4096];      /* --plot FILE.png: FILE.svg */
    const char *weights;      /* --weights, read after the sources */
} opts;

/* The shared number parser's message is printed; add the hint and stop. */
static void die_number(void) __attribute__((noreturn));
static void die_number(void)
{
    fputs("run 'npyload-bench --help' for the options\n", stderr);
    exit(2);
}

static int64_t parse_int(const char *opt, const char *s, int64_t lo, int64_t hi)
{
    int64_t v;
    if (tool_arg_i64("npyload-bench", opt, s, lo, hi, &v) != 0)
        die_number();
    return v;
}

/* "1,2,4": each element an integer in 1 .. 4096. */
static int parse_list(const char *s, int *out, int max, const char *what)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        size_t len = strcspn(p, ",");
        if (n == max)
            die_usage("%s %s: at most %d values", what, s, max);
        char *tok = strndup(p, len);
        if (!tok)
            die_usage("%s: out of memory", what);
        out[n++] = (int)parse_int(what, tok, 1, 4096);
        free(tok);
        p += len;
        if (*p == ',')
            p++;
    }
    if (n == 0)
        die_usage("%s: empty list", what);
    return n;
}

static int parse_io(const char *s, int *out)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t;
         t = strtok_r(NULL, ",", &save)) {
        int v;
        if (!strcmp(t, "auto")) v = NPYLOAD_IO_AUTO;
        else if (!strcmp(t, "io_uring") || !strcmp(t, "uring")) v = NPYLOAD_IO_URING;
        else if (!strcmp(t, "pread")) v = NPYLOAD_IO_PREAD;
        else if (!strcmp(t, "mmap")) v = NPYLOAD_IO_MMAP;
        else die_usage("--io: unknown backend '%s' (auto, io_uring, pread, mmap)", t);
        if (n == NB_MAX_IO)
            die_usage("--io: at most %d backends", NB_MAX_IO);
        out[n++] = v;
    }
    if (!n)
        die_usage("--io: empty list");
    return n;
}

/* A number option in [lo, hi] (seconds, milliseconds: fractions allowed). */
static double parse_num(const char *opt, const char *s, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || end == s)
        die_usage("%s %s: not a number (%g .. %g)", opt, s, lo, hi);
    if (errno == ERANGE || !(v >= lo) || v > hi)
        die_usage("%s %s: out of range (%g .. %g)", opt, s, lo, hi);
    return v;
}

static int parse_device(const char *d)
{
    if (!strcmp(d, "cpu"))
        return -1;
    if (!strcmp(d, "cuda"))
        return 0;
    if (!strncmp(d, "cuda:", 5))
        return (int)parse_int("--device cuda:N", d + 5, 0, 1024);
    die_usage("--device: '%s' (cpu, cuda or cuda:N)", d);
}

/* --plot: FILE.svg as given; FILE.png becomes FILE.svg beside it, in `buf`
 * (a PNG is a converter's job); any other name is refused before
 * measuring. */
static const char *plot_path(const char *p, char *buf, size_t len)
{
    size_t n = strlen(p);
    if (n >= 4 && !strcasecmp(p + n - 4, ".svg"))
        return p;
    if (n < 4 || strcasecmp(p + n - 4, ".png") != 0)
        die_usage("--plot: '%s': the plot is SVG; name it FILE.svg", p);
    if (n >= len)
        die_usage("--plot: '%s': name too long", p);
    snprintf(buf, len, "%.*s.svg", (int)(n - 4), p);
    fprintf(stderr,
            "npyload-bench: --plot %s: the plot is SVG, written to %s (for a PNG: "
            "rsvg-convert -o %s %s)\n",
            p, buf, p, buf);
    return buf;
}

/* name=GLOB: one field (of source `source`, -1 without --source). */
static void add_field(nb_config *cfg, const char *a, int source)
{
    const char *eq = strchr(a, '=');
    char shown[600];
    npyload_mask_urls(a, shown, sizeof shown);
    if (!eq)
        die_usage("unknown argument '%s'", shown);
    if (cfg->nfields == NB_MAX_FIELDS)
        die_usage("at most %d fields (with --source, all the sources' together)",
                  NB_MAX_FIELDS);
    nb_field_info *fi = &cfg->fields[cfg->nfields++];
    fi->source = source;
    size_t nl = (size_t)(eq - a);
    /* Absolute, so that the pasted line reads the same files from the
     * training script's directory. */
    char cwd[2048];
    if (eq[1] != '/' && !strstr(eq + 1, "://") && getcwd(cwd, sizeof cwd))
        snprintf(fi->glob, sizeof fi->glob, "%s/%s", cwd,
                 strncmp(eq + 1, "./", 2) ? eq + 1 : eq + 3);
    else
        snprintf(fi->glob, sizeof fi->glob, "%s", eq + 1);
    if (nl == 0 || nl >= sizeof fi->name)
        die_usage("'%s': a field is name=GLOB", shown);
    memcpy(fi->name, a, nl);
    fi->name[nl] = 0;
}

/* --source NAME=FIELD=GLOB[,FIELD=GLOB...]: a source and its fields. */
static void add_source(nb_config *cfg, const char *a)
{
    const char *eq = strchr(a, '=');
    char shown[600];
    npyload_mask_urls(a, shown, sizeof shown);
    if (!eq || eq == a || (size_t)(eq - a) >= sizeof cfg->sources[0] || !eq[1])
        die_usage("--source %s: NAME=FIELD=GLOB[,FIELD=GLOB...]", shown);
    if (cfg->nsources == NB_MAX_SOURCES)
        die_usage("--source: at most %d sources", NB_MAX_SOURCES);
    int k = cfg->nsources;
    snprintf(cfg->sources[k], sizeof cfg->sources[k], "%.*s", (int)(eq - a), a);
    for (int j = 0; j < k; j++)
        if (!strcmp(cfg->sources[j], cfg->sources[k]))
            die_usage("--source %s: a second source named '%s'", shown, cfg->sources[k]);
    cfg->nsources++;
    char list[4096];
    snprintf(list, sizeof list, "%s", eq + 1);
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        add_field(cfg, tok, k);
}

/* After the arguments: every source has source 0's fields (by name, each
 * once), and --weights names every source once. */
static void check_sources(nb_config *cfg, const char *weights)
{
    if (!cfg->nsources) {
        if (weights)
            die_usage("--weights needs --source (a mixture)");
        return;
    }
    int per[NB_MAX_SOURCES] = {0};
    for (int i = 0; i < cfg->nfields; i++) {
        const nb_field_info *fi = &cfg->fields[i];
        if (fi->source < 0)
            die_usage("'%s=...': with --source, every field belongs to a source "
                      "(--source NAME=%s=GLOB)", fi->name, fi->name);
        per[fi->source]++;
        int found = fi->source == 0;
        for (int j = 0; !found && j < cfg->nfields; j++)
            found = cfg->fields[j].source == 0 && !strcmp(cfg->fields[j].name, fi->name);
        if (!found)
            die_usage("--source %s: field '%s' is not a field of source '%s'",
                      cfg->sources[fi->source], fi->name, cfg->sources[0]);
        for (int j = 0; j < i; j++)
            if (cfg->fields[j].source == fi->source && !strcmp(cfg->fields[j].name, fi->name))
                die_usage("--source %s: field '%s' twice", cfg->sources[fi->source], fi->name);
    }
    for (int k = 1; k < cfg->nsources; k++)
        if (per[k] != per[0])
            die_usage("--source %s: %d fields, source '%s' %d: every source has the same "
                      "fields", cfg->sources[k], per[k], cfg->sources[0], per[0]);
    if (!weights)
        return;
    char list[4096];
    snprintf(list, sizeof list, "%s", weights);
    int given[NB_MAX_SOURCES] = {0};
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            die_usage("--weights %s: NAME=W[,NAME=W...]", weights);
        *eq = 0;
        int k = 0;
        while (k < cfg->nsources && strcmp(cfg->sources[k], tok))
            k++;
        if (k == cfg->nsources)
            die_usage("--weights: no source named '%s'", tok);
        if (given[k]++)
            die_usage("--weights: '%s' twice", tok);
        cfg->weights[k] = parse_num("--weights", eq + 1, 0, 1e300);
    }
    for (int k = 0; k < cfg->nsources; k++)
        if (!given[k])
            die_usage("--weights: no weight for source '%s' (name every source)",
                      cfg->sources[k]);
    cfg->weights_given = 1;
}

/* "a:b:c" -> up to 16 floats. @return : how many. */
static size_t parse_floats(const char *what, const char *s, float *out)
{
    size_t n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ":", &save); t; t = strtok_r(NULL, ":", &save)) {
        if (n == 16)
            die_usage("--transform %s: at most 16 values", what);
        out[n++] = (float)parse_num(what, t, -1e30, 1e30);
    }
    if (n == 0)
        die_usage("--transform %s: no value", what);
    return n;
}

/* The augmentation members of a --transform SPEC (hflip=P, vflip=P,
 * crop=H:W or N, pad=N, hflip_sign=A:B.., vflip_sign=A:B..) into t.
 * @return : 1 when tok was one of them. */
static int parse_augment(nb_field_info *fi, npyload_transform *t, const char *tok)
{
    if (!strncmp(tok, "hflip=", 6)) {
        t->hflip = (float)parse_num("--transform hflip", tok + 6, 0, 1);
    } else if (!strncmp(tok, "vflip=", 6)) {
        t->vflip = (float)parse_num("--transform vflip", tok + 6, 0, 1);
    } else if (!strncmp(tok, "pad=", 4)) {
        t->pad = parse_int("--transform pad", tok + 4, 0, 1 << 20);
    } else if (!strncmp(tok, "crop=", 5)) {
        /* H:W, or N for a square; the loader checks them against the
         * (padded) sample at start. */
        char h[32];
        const char *colon = strchr(tok + 5, ':');
        snprintf(h, sizeof h, "%.*s", colon ? (int)(colon - tok - 5) : 31, tok + 5);
        t->crop_h = parse_int("--transform crop", h, 1, INT64_MAX);
        t->crop_w = colon ? parse_int("--transform crop", colon + 1, 1, INT64_MAX) : t->crop_h;
    } else if (!strncmp(tok, "hflip_sign=", 11)) {
        t->n_hflip_sign = parse_floats("hflip_sign", tok + 11, fi->hsign);
        t->hflip_sign = fi->hsign;
    } else if (!strncmp(tok, "vflip_sign=", 11)) {
        t->n_vflip_sign = parse_floats("vflip_sign", tok + 11, fi->vsign);
        t->vflip_sign = fi->vsign;
    } else {
        return 0;
    }
    return 1;
}

/* --transform FIELD=SPEC, SPEC = dtype[,scale=X][,mean=A:B..][,std=A:B..]
 * [,channels_last][,hflip=P][,vflip=P][,crop=H:W or N][,pad=N]
 * [,hflip_sign=A:B..][,vflip_sign=A:B..], dtype keep|float32|float16|
 * bfloat16, X a number or A/B (1/255): what npyload.Transform takes, in one
 * argument. The loader checks the combination at start (a crop larger than
 * the padded sample, signs on an integer field, ...). */
static void add_transform(nb_config *cfg, const char *a)
{
    const char *eq = strchr(a, '=');
    if (!eq || eq == a)
        die_usage("--transform %s: FIELD=SPEC", a);
    nb_field_info *fi = NULL;
    for (int k = 0; k < cfg->nfields && !fi; k++)
        if (strlen(cfg->fields[k].name) == (size_t)(eq - a) &&
            !strncmp(cfg->fields[k].name, a, (size_t)(eq - a)))
            fi = &cfg->fields[k];
    if (!fi)
        die_usage("--transform %s: no field of that name (give name=GLOB first)", a);
    snprintf(fi->transform, sizeof fi->transform, "%s", eq + 1);
    npyload_transform t = NPYLOAD_TRANSFORM_INIT;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", eq + 1);
    int first = 1;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save), first = 0) {
        static const char *const dt[] = {"keep", "float32", "float16", "bfloat16"};
        int d = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(tok, dt[i]))
                d = i;
        if (first && d >= 0) {
            t.dtype = d; /* NPYLOAD_DTYPE_KEEP .. BFLOAT16 in this order */
        } else if (!strncmp(tok, "scale=", 6)) {
            const char *x = tok + 6, *sl = strchr(x, '/');
            char num[64];
            snprintf(num, sizeof num, "%.*s", sl ? (int)(sl - x) : (int)strlen(x), x);
            double v = parse_num("--transform scale", num, -1e30, 1e30);
            if (sl)
                v /= parse_num("--transform scale", sl + 1, 1e-30, 1e30);
            t.scale = (float)v;
        } else if (!strncmp(tok, "mean=", 5)) {
            t.n_mean = parse_floats("mean", tok + 5, fi->mean);
            t.mean = fi->mean;
        } else if (!strncmp(tok, "std=", 4)) {
            t.n_std = parse_floats("std", tok + 4, fi->std);
            t.std = fi->std;
        } else if (!strcmp(tok, "channels_last")) {
            t.channels_last = 1;
        } else if (!parse_augment(fi, &t, tok)) {
            die_usage("--transform %s: '%s' is not dtype (first: keep, float32, float16, "
                      "bfloat16), scale=, mean=, std=, channels_last, hflip=, vflip=, crop=, "
                      "pad=, hflip_sign= or vflip_sign=", a, tok);
        }
    }
    fi->t = t;
    fi->has_transform = 1;
}

enum {
    OPT_BATCH_SIZE = 256, OPT_WORKERS, OPT_PREFETCH, OPT_IO, OPT_SHUFFLE, OPT_DEVICE,
    OPT_BATCHES, OPT_SECONDS, OPT_COMPUTE_MS, OPT_COLD, OPT_WARMUP_BATCHES, OPT_DIRECT, OPT_NO_READ_AHEAD, OPT_NO_REPEAT, OPT_TRANSFORM, OPT_RANKS, OPT_JSON, OPT_PLOT, OPT_SEED, OPT_DROP_LAST,
    OPT_VERSION, OPT_AUTO, OPT_SOURCE, OPT_WEIGHTS,
};

static const struct option longopts[] = {
    {"batch-size", required_argument, NULL, OPT_BATCH_SIZE},
    {"workers", required_argument, NULL, OPT_WORKERS},
    {"prefetch", required_argument, NULL, OPT_PREFETCH},
    {"io", required_argument, NULL, OPT_IO},
    {"shuffle", optional_argument, NULL, OPT_SHUFFLE},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"batches", required_argument, NULL, OPT_BATCHES},
    {"seconds", required_argument, NULL, OPT_SECONDS},
    {"compute-ms", required_argument, NULL, OPT_COMPUTE_MS},
    {"cold", no_argument, NULL, OPT_COLD},
    {"warmup-batches", required_argument, NULL, OPT_WARMUP_BATCHES},
    {"direct", no_argument, NULL, OPT_DIRECT},
    {"no-read-ahead", no_argument, NULL, OPT_NO_READ_AHEAD},
    {"no-repeat", no_argument, NULL, OPT_NO_REPEAT},
    {"auto", no_argument, NULL, OPT_AUTO},
    {"transform", required_argument, NULL, OPT_TRANSFORM},
    {"ranks", required_argument, NULL, OPT_RANKS},
    {"seed", required_argument, NULL, OPT_SEED},
    {"drop-last", no_argument, NULL, OPT_DROP_LAST},
    {"source", required_argument, NULL, OPT_SOURCE},
    {"weights", required_argument, NULL, OPT_WEIGHTS},
    {"json", required_argument, NULL, OPT_JSON},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

/* One option. */
static void apply_opt(nb_ctx *ctx, nb_config *cfg, opts *o, int opt, const char *v)
{
    switch (opt) {
    case OPT_BATCH_SIZE: cfg->batch_size = (int)parse_int("--batch-size", v, 1, 1 << 24); break;
    case OPT_WORKERS: o->nworkers = parse_list(v, o->workers, NB_MAX_GRID, "--workers"); break;
    case OPT_PREFETCH: o->nprefetch = parse_list(v, o->prefetch, NB_MAX_GRID, "--prefetch"); break;
    case OPT_IO: o->nio = parse_io(v, o->io); break;
    case OPT_SHUFFLE:
        if (!v || !strcmp(v, "full"))
            cfg->shuffle = NPYLOAD_SHUFFLE_FULL;
        else if (!strcmp(v, "local"))
            cfg->shuffle = NPYLOAD_SHUFFLE_LOCAL;
        else
            die_usage("--shuffle=%s: full or local", v);
        break;
    case OPT_DEVICE: cfg->device = parse_device(v); break;
    case OPT_BATCHES: cfg->batches = parse_int("--batches", v, 1, 1000000000000000); break;
    case OPT_SECONDS:
        cfg->seconds = parse_num("--seconds", v, 1e-9, 86400);
        o->seconds_given = 1;
        break;
    case OPT_COMPUTE_MS: cfg->compute_ms = parse_num("--compute-ms", v, 0, 1e6); break;
    case OPT_COLD: cfg->cold = 1; break;
    case OPT_WARMUP_BATCHES:
        cfg->warmup_batches = parse_int("--warmup-batches", v, 0, 1000000000000000);
        break;
    case OPT_DIRECT: cfg->direct = 1; break;
    case OPT_NO_READ_AHEAD: cfg->no_read_ahead = 1; break;
    case OPT_NO_REPEAT: o->no_repeat = 1; break;
    case OPT_AUTO: o->auto_run = 1; break;
    case OPT_RANKS: cfg->ranks = (int)parse_int("--ranks", v, 1, 64); break;
    case OPT_SEED:
        cfg->seed = parse_int("--seed", v, INT64_MIN, INT64_MAX);
        cfg->seed_given = 1;
        break;
    case OPT_DROP_LAST: cfg->drop_last = 1; break;
    case OPT_TRANSFORM:
        if (o->ntransforms == NB_MAX_FIELDS)
            die_usage("--transform: at most %d", NB_MAX_FIELDS);
        o->transforms[o->ntransforms++] = v;
        break;
    case OPT_SOURCE: add_source(cfg, v); break;
    case OPT_WEIGHTS: o->weights = v; break;
    case OPT_JSON: o->json = v; break;
    case OPT_PLOT: o->plot = plot_path(v, o->plot_svg, sizeof o->plot_svg); break;
    case 'q': ctx->quiet = 1; break;
    }
}

/* A file the run ends by writing (--json, --plot), checked before anything
 * is measured, so that minutes of runs are not lost to a missing directory
 * or a typo: its directory exists and may be written in, and the path is
 * not a directory nor a file that may not be written. Exits 2 otherwise. */
static void check_output(const char *opt, const char *path)
{
    if (!path)
        return;
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        die_usage("%s %s: is a directory; give a file name", opt, path);
    int missing = stat(dir, &st) != 0;
    if (missing || !S_ISDIR(st.st_mode))
        die_usage("%s %s: the directory %s %s (nothing was measured)", opt, path, dir,
                  missing ? "does not exist" : "is not a directory");
    if (access(dir, W_OK | X_OK) != 0)
        die_usage("%s %s: cannot write in %s: %s (nothing was measured)", opt, path, dir,
                  strerror(errno));
    if (access(path, F_OK) == 0 && access(path, W_OK) != 0)
        die_usage("%s %s: cannot be written: %s (nothing was measured)", opt, path,
                  strerror(errno));
}

static void parse_args(int argc, char **argv, nb_ctx *ctx, nb_config *cfg, opts *o)
{
    cfg->batch_size = 128;
    cfg->ranks = 1;
    cfg->device = -1;
    cfg->seconds = 1.5;
    cfg->warmup_batches = -1;
    o->nworkers = parse_list("1,2", o->workers, NB_MAX_GRID, "--workers");
    o->nprefetch = parse_list("1,2,4", o->prefetch, NB_MAX_GRID, "--prefetch");
    o->io[0] = NPYLOAD_IO_AUTO;
    o->nio = 1;
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":hq", longopts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(usage, stdout);
            fputs("\n", stdout);
            fputs(nb_legend, stdout);
            fputs("\nThe recommendation is followed by the lines to paste: the\n"
                  "npyload.Loader(...) call (prefetch = slots - 1) and the C\n"
                  "npyload_loader_set calls (PREFETCH = slots) of the measured run.\n"
                  "Only configurations of 2+ slots are recommended (one slot cannot\n"
                  "overlap a read with the step); with --compute-ms the least memory\n"
                  "among the runs within 2 points of the least stall.\n", stdout);
            exit(0);
        } else if (opt == OPT_VERSION) {
            printf("npyload-bench %s\n", npyload_version_string());
            exit(0);
        } else if (opt == ':') {
            die_usage("%s needs a value", argv[optind - 1]);
        } else if (opt == '?') {
            die_usage("unknown argument '%s'", argv[optind - 1]);
        }
        apply_opt(ctx, cfg, o, opt, optarg);
    }
    for (int i = optind; i < argc; i++)
        add_field(cfg, argv[i], -1);
    check_sources(cfg, o->weights);
    for (int i = 0; i < o->ntransforms; i++)
        add_transform(cfg, o->transforms[i]);
    if (cfg->ranks > 1 && cfg->device >= 0)
        die_usage("--ranks with --device: one GPU per rank is not measured here yet");
    if (cfg->nfields == 0)
        die_usage("no field given (name=GLOB, or --source NAME=FIELD=GLOB)");
    if (cfg->batches > 0 && o->seconds_given)
        die_usage("--batches and --seconds exclude each other");
    if (cfg->batches > 0)
        cfg->seconds = 0;
    check_output("--json", o->json);
    check_output("--plot", o->plot);
}

/* Runs measured by time on fewer than NB_MIN_BATCHES batches (the time
 * limit ran out first): their p50, stall and verdict rest on too little,
 * and the user is told why and what to do. */
static void warn_few_batches(nb_ctx *ctx, const nb_config *cfg, const nb_run *runs,
                             size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!runs[i].ok || runs[i].batches >= NB_MIN_BATCHES)
            continue;
        if (cfg->batches > 0)
            continue; /* the count the user asked for */
        nb_warn(ctx, "w=%d p=%d measured only %llu batches in %.0f s (the %d-second "
                "limit per run): p50, stall and the verdict rest on too few; use a "
                "smaller --compute-ms or --batches %d", runs[i].workers, runs[i].prefetch,
                (unsigned long long)runs[i].batches, runs[i].wall_s, NB_MAX_RUN_S,
                NB_MIN_BATCHES);
    }
}

/* ------------------------------------------------------------------------ */
/* Machine                                                                    */
/* ------------------------------------------------------------------------ */

static void machine_info(nb_machine *m)
{
    memset(m, 0, sizeof *m);
    m->cores_online = (int)sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    m->cores_allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                   : m->cores_online;
    struct utsname u;
    if (uname(&u) == 0)
        snprintf(m->kernel, sizeof m->kernel, "%.60s %.60s", u.sysname, u.release);
    gethostname(m->hostname, sizeof m->hostname - 1);
    snprintf(m->library_version, sizeof m->library_version, "%s", npyload_version_string());
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "model name", 10) == 0) {
                char *p = strchr(line, ':');
                if (p) {
                    p++;
                    while (*p == ' ')
                        p++;
                    p[strcspn(p, "\n")] = 0;
                    snprintf(m->cpu_model, sizeof m->cpu_model, "%s", p);
                }
                break;
            }
        fclose(f);
    }
    f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "MemTotal:", 9) == 0) {
                m->mem_total_gib = strtod(line + 9, NULL) / (1024.0 * 1024.0);
                break;
            }
        fclose(f);
    }
}

/* ------------------------------------------------------------------------ */
/* The steps of a bench                                                       */
/* ------------------------------------------------------------------------ */

/* The fields' files and sizes. A mixture (--source): a sample is one of
 * source 0's fields' rows (every source has the same shapes), an epoch
 * the sources' samples summed (the loader's default). @return : the
 * dataset's bytes. */
static uint64_t setup_data(nb_ctx *ctx, nb_config *cfg)
{
    uint64_t sample_bytes = 0, total_bytes = 0;
    int64_t per_source[NB_MAX_SOURCES + 1];
    for (int s = 0; s <= NB_MAX_SOURCES; s++)
        per_source[s] = -1;
    ctx->nfields = cfg->nfields;
    for (int k = 0; k < cfg->nfields; k++) {
        const nb_data *d = &ctx->data[k];
        const int s = cfg->fields[k].source < 0 ? 0 : cfg->fields[k].source;
        if (nb_load_field(ctx, &cfg->fields[k], &ctx->data[k]) != 0)
            exit(2);
        if (s == 0)
            sample_bytes += d->sample_bytes;
        total_bytes += d->sample_bytes * (uint64_t)d->nsamples;
        if (per_source[s] < 0 || d->nsamples < per_source[s]) {
            if (per_source[s] >= 0)
                nb_warn(ctx, "fields hold different sample counts (%s%s%s: %lld); the "
                        "loader will refuse them", cfg->nsources ? cfg->sources[s] : "",
                        cfg->nsources ? " " : "", cfg->fields[k].name,
                        (long long)d->nsamples);
            per_source[s] = d->nsamples;
        }
    }
    cfg->num_samples = 0;
    for (int s = 0; s < (cfg->nsources ? cfg->nsources : 1); s++)
        cfg->num_samples += per_source[s] > 0 ? per_source[s] : 0;
    cfg->batch_bytes = sample_bytes * (uint64_t)cfg->batch_size;
    if (cfg->num_samples < cfg->batch_size)
        nb_warn(ctx, "%lld samples is less than one batch of %d", (long long)cfg->num_samples,
                cfg->batch_size);
    return total_bytes;
}

static void add_note(nb_config *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_note(nb_config *cfg, const char *fmt, ...)
{
    size_t nl = strlen(cfg->note);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cfg->note + nl, sizeof cfg->note - nl, fmt, ap);
    va_end(ap);
}

/* GPU monitoring, CUDA and the notes about how the run measures. */
static void setup_device(nb_ctx *ctx, nb_config *cfg)
{
    if (cfg->device < 0) {
        add_note(cfg, "device cpu: no GPU monitoring. ");
    } else {
        char nwhy[128] = "", why[256] = "";
        if (npyload_nvml_open(cfg->device, &ctx->nvml, nwhy, sizeof nwhy) != 0) {
            add_note(cfg, "GPU monitoring skipped: %s. ", nwhy);
            if (!ctx->quiet)
                fprintf(stderr, "npyload-bench: GPU monitoring skipped: %s\n", nwhy);
        } else {
            add_note(cfg, "GPU sampled with NVML every 100 ms (NVML index %d; it may differ "
                     "from the CUDA index under CUDA_VISIBLE_DEVICES). ", cfg->device);
        }
        if (cfg->compute_ms > 0)
            add_note(cfg, "compute is a GPU busy kernel of %.3g ms per batch on a stream "
                     "ordered after the batch's copy (npyload_compute_sim); stall is the "
                     "time spent in next(). ", cfg->compute_ms);
        if (!npyload_cuda_available(cfg->device, why, sizeof why)) {
            fprintf(stderr, "npyload-bench: --device cuda:%d: CUDA is not usable here: %s\n",
                    cfg->device, why);
            exit(2);
        }
    }
    if (cfg->cold)
        add_note(cfg, "cold: files evicted with POSIX_FADV_DONTNEED before each run; a run "
                 "stops at the end of its epoch. ");
    if (cfg->warmup_batches >= 0)
        add_note(cfg, "warm-up: %lld untimed batches before each fixed run's timed part "
                 "(--warmup-batches). ", (long long)cfg->warmup_batches);
}

/* The ceilings, first, in the same run. .npy.zst fields: no pread_copy (it
 * reads sample offsets of raw files); zst_decode on `cores`, and cold
 * zst_cold (npyload_bench_zst.c). @return : the reference GB/s (0: none). */
/* remote_get's table row as it is measured. */
static void print_rget_point(const npyload_rget_point *p, void *arg)
{
    if (*(const int *)arg)
        return; /* quiet */
    char row[128];
    npyload_rget_row(p, row, sizeof row);
    printf("    %s\n", row);
    fflush(stdout);
}

/* Remote fields: the store's ranged GETs of the size the loader asks
 * (one sample shuffled, a batch's rows coalesced in order; 64 KiB ..
 * 16 MiB) at random offsets of every remote file, at concurrencies 1 ..
 * 32 with up to two reading threads per worker, as the remote_get
 * ceiling; the grid's loaders then keep the recommended requests in
 * flight. */
static void measure_remote(nb_ctx *ctx, nb_config *cfg, int max_workers, double secs,
                           nb_remote_report *rr, nb_ceiling *out)
{
    memset(rr, 0, sizeof *rr);
    snprintf(out->name, sizeof out->name, "remote_get");
    size_t n = 0;
    uint64_t bytes = 0;
    for (int k = 0; k < ctx->nfields; k++)
        if (ctx->data[k].nfiles && ctx->data[k].files[0].fd < 0) {
            n += ctx->data[k].nfiles;
            if (ctx->data[k].sample_bytes > bytes)
                bytes = ctx->data[k].sample_bytes;
        }
    if (!cfg->shuffle)
        bytes *= (uint64_t)cfg->batch_size;
    bytes = bytes < (64u << 10) ? (64u << 10) : bytes > (16u << 20) ? (16u << 20) : bytes;
    const char **urls = calloc(n ? n : 1, sizeof *urls);
    size_t u = 0;
    for (int k = 0; urls && k < ctx->nfields; k++)
        for (size_t i = 0; i < ctx->data[k].nfiles; i++)
            if (ctx->data[k].files[i].fd < 0)
                urls[u++] = ctx->data[k].files[i].path;
    static const int conc[] = {1, 2, 4, 8, 16, 32};
    int tmax = 2 * (max_workers > 2 ? max_workers : 2);
    if (!ctx->quiet) {
        printf("  remote_get: ranged GETs of %llu bytes at random offsets of %zu objects, "
               "%.2g s per concurrency:\n    %s\n",
               (unsigned long long)bytes, n, secs, npyload_rget_header());
        fflush(stdout);
    }
    npyload_rget_result res;
    char err[512];
    uint64_t t0 = nb_now_ns();
    int rc = urls ? npyload_rget_measure(cfg->remote, urls, n, (size_t)bytes, secs, conc,
                                         (int)(sizeof conc / sizeof conc[0]), tmax,
                                         print_rget_point, &ctx->quiet, &res, err, sizeof err)
                  : -1;
    free(urls);
    out->seconds = (double)(nb_now_ns() - t0) / 1e9;
    rr->seconds = secs;
    if (rc != 0) {
        snprintf(out->note, sizeof out->note, "failed: %.230s", urls ? err : "out of memory");
        snprintf(rr->note, sizeof rr->note, "%s", out->note);
        nb_warn(ctx, "remote_get: %s", out->note);
        return;
    }
    rr->measured = 1;
    rr->objects = res.objects;
    rr->object_bytes = res.object_bytes;
    rr->bytes_per_request = res.bytes_per_request;
    rr->npoints = res.npoints < NB_REMOTE_POINTS ? res.npoints : NB_REMOTE_POINTS;
    for (int i = 0; i < rr->npoints; i++) {
        const npyload_rget_point *p = &res.points[i];
        rr->points[i] = (nb_remote_point){p->concurrency, p->threads, p->inflight,
                                          p->requests_per_s, p->mb_per_s, p->p50_ms,
                                          p->p99_ms};
    }
    rr->best_mb_per_s = res.best_mb_per_s;
    rr->concurrency = res.concurrency;
    rr->workers = res.workers;
    rr->max_inflight = res.max_inflight;
    rr->requests = res.requests;
    rr->retries = res.retries;
    snprintf(rr->note, sizeof rr->note,
             "the smallest concurrency within 10%% of the best throughput, as reading threads "
             "x requests in flight; a worker reads on two threads (itself and read-ahead)");
    out->measured = 1;
    out->gbps = res.best_mb_per_s / 1e3;
    out->threads = res.points[res.pick].threads;
    out->bytes = (uint64_t)(res.best_mb_per_s * 1e6 * secs);
    snprintf(out->note, sizeof out->note,
             "the store's best ranged-GET throughput (wire bytes; %d in flight); the grid's "
             "loaders keep max_inflight=%d", res.points[res.pick].concurrency,
             res.max_inflight);
}

static double measure_ceilings(nb_ctx *ctx, nb_config *cfg, int max_workers, int cores,
                               nb_zst_report *zst, nb_ceiling *ce, size_t *nceil,
                               nb_remote_report *rr)
{
    double secs = cfg->seconds > 0 ? cfg->seconds : 1.0;
    secs = secs > 3 ? 3 : secs;
    double ref = 0;
    *nceil = 0;
    if (ctx->rclient) {
        /* The page cache, O_DIRECT and the frames' decode read local files:
         * the store's own ranged GETs are the reference instead. */
        nb_ceiling *c = &ce[(*nceil)++];
        snprintf(c->name, sizeof c->name, "pread_copy");
        snprintf(c->note, sizeof c->note, "skipped: remote fields (no page cache to copy "
                 "from; remote_get is their ceiling)");
        if (cfg->cold) {
            c = &ce[(*nceil)++];
            snprintf(c->name, sizeof c->name, "odirect_uring");
            snprintf(c->note, sizeof c->note, "skipped: remote fields (every run reads "
                     "from the store: no cache_dir)");
        }
        measure_remote(ctx, cfg, max_workers, secs > 2 ? 2 : secs, rr, &ce[(*nceil)++]);
        if (cfg->device >= 0)
            nb_ceiling_h2d(cfg, &ce[(*nceil)++]);
        for (size_t i = 0; i < *nceil; i++)
            if (ce[i].measured && (ref <= 0 || ce[i].gbps < ref)) {
                ref = ce[i].gbps;
                snprintf(cfg->ceiling_ref, sizeof cfg->ceiling_ref, "%.31s", ce[i].name);
            }
        return ref;
    }
    int packed = nb_zst_any(ctx);
    if (!packed) {
        nb_ceiling_copy(ctx, cfg, max_workers, secs, &ce[(*nceil)++]);
        nb_ceiling_gather(ctx, cfg, max_workers, secs, &ce[(*nceil)++]);
    } else {
        nb_ceiling *c = &ce[(*nceil)++];
        snprintf(c->name, sizeof c->name, "pread_copy");
        snprintf(c->note, sizeof c->note, "skipped: .npy.zst fields (zst_decode is "
                 "their page-cache ceiling)");
    }
    if (cfg->cold)
        nb_ceiling_odirect(ctx, cfg, secs, &ce[(*nceil)++]);
    if (packed) {
        nb_zst_decode_ceiling(ctx, cfg, cores, secs, zst, &ce[(*nceil)++]);
        if (cfg->cold) {
            const nb_ceiling *od = &ce[*nceil - 2];
            nb_zst_cold_ceiling(zst, od, &ce[(*nceil)++]);
        }
    }
    if (cfg->device >= 0)
        nb_ceiling_h2d(cfg, &ce[(*nceil)++]);
    /* The reference: for .npy.zst fields zst_cold when cold, else zst_decode;
     * for raw fields the O_DIRECT read when cold, else the higher of the two
     * copies (pread, gather: the fraction must never flatter the loader).
     * Without the wanted one, the highest measured. A slower host-to-device
     * copy bounds them all. */
    const char *want = packed ? (cfg->cold ? "zst_cold" : "zst_decode")
                              : (cfg->cold ? "odirect_uring" : NULL);
    int have_want = 0;
    for (size_t i = 0; want && i < *nceil; i++)
        have_want |= ce[i].measured && !strcmp(ce[i].name, want);
    for (size_t i = 0; i < *nceil; i++) {
        if (!ce[i].measured || !strcmp(ce[i].name, "h2d_pinned"))
            continue;
        if (have_want ? !strcmp(ce[i].name, want) : ce[i].gbps > ref) {
            ref = ce[i].gbps;
            snprintf(cfg->ceiling_ref, sizeof cfg->ceiling_ref, "%.31s", ce[i].name);
        }
    }
    for (size_t i = 0; i < *nceil; i++) {
        int h2d = !strcmp(ce[i].name, "h2d_pinned");
        if (ce[i].measured && h2d && (ref <= 0 || ce[i].gbps < ref)) {
            ref = ce[i].gbps;
            snprintf(cfg->ceiling_ref, sizeof cfg->ceiling_ref, "%.31s", ce[i].name);
        }
    }
    return ref;
}

/* The grid, io x workers x prefetch. @return : how many runs succeeded. */
static int measure_grid(nb_ctx *ctx, const nb_config *cfg, const opts *o, double ref,
                        nb_run *runs)
{
    size_t ri = 0;
    int nok = 0;
    nb_progress_start(&ctx->prog, o->nio * o->nworkers * o->nprefetch, ctx->quiet);
    if (!ctx->quiet) {
        nb_print_table_header(stdout);
        fflush(stdout);
    }
    for (int a = 0; a < o->nio; a++)
        for (int wi = 0; wi < o->nworkers; wi++)
            for (int pi = 0; pi < o->nprefetch; pi++) {
                nb_run *r = &runs[ri++];
                nb_run_one(ctx, cfg, o->workers[wi], o->prefetch[pi], o->io[a], ref, r);
                nok += r->ok;
                if (!ctx->quiet) {
                    nb_print_run(stdout, r);
                    nb_print_sources(stdout, cfg, r);
                    fflush(stdout);
                }
            }
    return nok;
}

/* Worker time that waited for reads (read ahead, or read by the worker
 * itself when the loader read no ahead: stored rows delivered as they are),
 * as a share of the run's worker time: high means the disk, not the cores,
 * held the workers. */
static double read_wait_share(const nb_run *r)
{
    double worker_s = r->wall_s * r->workers;
    uint64_t wait = r->read_ahead_batches ? r->read_wait_ns : r->timed.io_ns;
    double share = worker_s > 0 ? (double)wait / 1e9 / worker_s : 0;
    return share < 1 ? share : 1; /* the counter includes the warm-up */
}

#define WAIT_SHARE_EXTEND 0.25 /* above it, more workers than cores may pay */

/* With --cold, the grid goes past its largest worker count when the best run had that
 * many workers, its workers waited for reads more than WAIT_SHARE_EXTEND of
 * the time, and the cores were idle meanwhile (the process used less than
 * 3/4 of min(workers, cores) cores: a read from the page cache is a copy
 * that keeps a core busy, a read from a device leaves it idle): then the
 * same io and prefetch depths with twice the workers (at most 4 x cores),
 * appended to runs (room for o->nprefetch more). @return : the runs
 * added. */
static size_t extend_grid(nb_ctx *ctx, nb_config *cfg, const opts *o, double ref, int cores,
                          nb_run *runs, size_t nruns)
{
    const nb_run *best = NULL;
    int max_w = 0;
    for (size_t i = 0; i < nruns; i++) {
        if (runs[i].workers > max_w)
            max_w = runs[i].workers;
        if (runs[i].ok && (!best || runs[i].samples_per_s > best->samples_per_s))
            best = &runs[i];
    }
    double share = best ? read_wait_share(best) : 0;
    int w = 2 * max_w;
    /* Only cold (--cold): from the page cache a read is a copy, and short
     * runs of small batches can look idle without any device wait. */
    if (!cfg->cold || !best || best->workers != max_w || share <= WAIT_SHARE_EXTEND ||
        w > 4 * cores)
        return 0;
    int busy = best->workers < cores ? best->workers : cores;
    if (best->cpu_pct >= 75.0 * busy)
        return 0; /* the waits were copies from the page cache */
    if (!isnan(best->stall_pct) && best->stall_pct <= NB_STALL_NOISE)
        return 0; /* with a step: it is fed already */
    add_note(cfg, "the best run (%d workers) waited for reads %.0f%% of its worker time: "
             "the grid was extended to %d workers.", best->workers, 100 * share, w);
    int io = best->io_requested;
    for (int pi = 0; pi < o->nprefetch; pi++) {
        nb_run *r = &runs[nruns + (size_t)pi];
        nb_run_one(ctx, cfg, w, o->prefetch[pi], io, ref, r);
        if (!ctx->quiet) {
            nb_print_run(stdout, r);
            nb_print_sources(stdout, cfg, r);
            fflush(stdout);
        }
    }
    return (size_t)o->nprefetch;
}

#define NB_REPEAT_MAX 3 /* close candidates measured a second time */

/* Measures the recommendation's close candidates once more, merges each
 * repeat into its run and recommends again (unless --no-repeat); rec->close
 * says what the repeat showed. */
static void repeat_close(nb_ctx *ctx, nb_config *cfg, const opts *o, double ref, nb_run *runs,
                         size_t nruns, nb_recommendation *rec)
{
    int idx[NB_REPEAT_MAX];
    size_t n = nb_close_candidates(runs, nruns, cfg->compute_ms, rec, idx, NB_REPEAT_MAX);
    if (o->no_repeat || n < 2)
        return;
    if (!ctx->quiet)
        printf("repeating the %zu close candidates:\n", n);
    for (size_t k = 0; k < n; k++) {
        nb_run *r = &runs[idx[k]], again;
        nb_run_one(ctx, cfg, r->workers, r->prefetch, r->io_requested, ref, &again);
        if (!ctx->quiet) {
            nb_print_run(stdout, &again);
            nb_print_sources(stdout, cfg, &again);
            fflush(stdout);
        }
        nb_merge_repeat(r, &again, cfg->compute_ms);
    }
    nb_recommend(runs, nruns, cfg->compute_ms, rec);
    nb_format_close(runs, nruns, idx, n, cfg->compute_ms, rec);
}

/* --auto: the auto loader measured as a grid run is, on the recommended
 * io (else the first asked), compared with the grid. */
static void measure_auto(nb_ctx *ctx, const nb_config *cfg, const opts *o, double ref,
                         const nb_run *runs, size_t nruns, const nb_recommendation *rec,
                         nb_auto_cmp *c)
{
    int io = rec->valid ? runs[rec->run_index].io_requested : o->io[0];
    nb_progress_start(&ctx->prog, 1, ctx->quiet);
    if (!ctx->quiet) {
        printf("the auto loader (w and p: its counts at the end):\n");
        fflush(stdout);
    }
    nb_run_one(ctx, cfg, NPYLOAD_AUTO, NPYLOAD_AUTO, io, ref, &c->run);
    c->run.workers = c->run.final_workers;
    c->run.prefetch = c->run.final_slots;
    if (!ctx->quiet) {
        nb_print_run(stdout, &c->run);
        fflush(stdout);
    }
    nb_auto_compare(runs, nruns, cfg->compute_ms, c);
}

/* The recommendation line and the files. @return : the exit status. */
static int report(const nb_ctx *ctx, const nb_report *rep, const opts *o, int nok)
{
    char line[256];
    nb_format_recommendation(rep->rec, rep->config->compute_ms, line, sizeof line);
    if (!ctx->quiet && rep->config->note[0])
        printf("note: %s\n", rep->config->note);
    printf("%s\n", line);
    if (!ctx->quiet && rep->rec->close[0])
        printf("%s\n", rep->rec->close);
    if (!ctx->quiet && rep->rec->valid) {
        char py[2048], c[512];
        nb_format_paste(rep->config, rep->rec, py, sizeof py, c, sizeof c);
        if (rep->config->ranks > 1)
            printf("  per rank, %d ranks (torchrun --nproc_per_node=%d): the node delivers "
                   "%.0f samples/s\n", rep->config->ranks, rep->config->ranks,
                   rep->rec->samples_per_s);
        printf("  python: %s\n  C:      %s\n", py, c);
        printf("  or only the tuning arguments, into your own Loader(...): %s\n",
               nb_tuning_args(rep->rec, py, sizeof py));
        printf("%s\n", rep->rec->verdict);
    }
    if (!ctx->quiet && rep->zst)
        printf("%s\n", rep->zst->verdict);
    if (rep->autocmp) { /* asked for: printed with --quiet too */
        char al[768];
        nb_format_auto(rep->autocmp, rep->runs, rep->config->compute_ms, al, sizeof al);
        printf("%s\n", al);
    }
    const nb_remote_report *rr = rep->remote;
    if (rr && rr->measured)
        printf("remote: ranged GETs of %llu bytes reach %.1f MB/s from %d in flight: "
               "num_workers=%d, remote max_inflight=%d (python: remote={..., "
               "\"max_inflight\": %d}; C: npyload_remote.max_inflight = %d)\n",
               (unsigned long long)rr->bytes_per_request,
               rr->points[0].mb_per_s > 0 ? rr->best_mb_per_s : 0.0, rr->concurrency,
               rr->workers, rr->max_inflight, rr->max_inflight, rr->max_inflight);
    if (!ctx->quiet && rep->rec->next_steps[0])
        printf("what to do next: %s\n", rep->rec->next_steps);
    fflush(stdout);
    int status = nok ? 0 : 1;
    if (o->json && nb_write_json_file(o->json, rep) != 0) {
        fprintf(stderr, "npyload-bench: %s: cannot write JSON: %s\n", o->json, strerror(errno));
        status = 1;
    }
    if (o->plot && nb_write_plot(o->plot, rep) != 0) {
        fprintf(stderr, "npyload-bench: %s: cannot write the plot: %s\n", o->plot,
                errno ? strerror(errno) : "no run to draw");
        status = 1;
    }
    return status;
}

int main(int argc, char **argv)
{
    static nb_ctx ctx;
    static nb_config cfg;
    opts o;
    memset(&o, 0, sizeof o);
    parse_args(argc, argv, &ctx, &cfg, &o);

    nb_machine mach;
    machine_info(&mach);
    ni_build_info(ctx.quiet ? NULL : stdout, &mach.build_info); /* first: for bug reports */
    /* Remote fields: the configuration from the AWS environment (never
     * printed) and a client for their listings and headers. */
    static tool_remote renv;
    const char *globs[NB_MAX_FIELDS];
    for (int k = 0; k < cfg.nfields; k++)
        globs[k] = cfg.fields[k].glob;
    char err[1024];
    int any_remote = tool_remote_for_paths(globs, (size_t)cfg.nfields, &renv, err, sizeof err);
    if (any_remote > 0 &&
        npyload_remote_client_create(&ctx.rclient, &renv.cfg, sizeof renv.cfg, err,
                                     sizeof err) != 0)
        any_remote = -1;
    if (any_remote < 0) {
        fprintf(stderr, "npyload-bench: %s\n", err);
        return 2;
    }
    if (ctx.rclient) {
        cfg.remote = &renv.cfg;
        add_note(&cfg, "remote fields: read with ranged GETs without a cache_dir (every run "
                 "from the store); the local ceilings, the page cache and the compression "
                 "estimate are skipped. ");
    }
    uint64_t total_bytes = setup_data(&ctx, &cfg);
    int max_workers = 0;
    for (int i = 0; i < o.nworkers; i++)
        max_workers = o.workers[i] > max_workers ? o.workers[i] : max_workers;
    if (max_workers > mach.cores_allowed)
        nb_warn(&ctx, "up to %d workers on %d usable cores: more threads than cores",
                max_workers, mach.cores_allowed);
    ctx.hwm_ok = nb_hwm_reset_works();
    if (!ctx.hwm_ok)
        nb_warn(&ctx, "VmHWM cannot be reset here (/proc/self/clear_refs): peak RSS is "
                "sampled every 10 ms instead");
    setup_device(&ctx, &cfg);
    if (!ctx.quiet) {
        nb_print_setup(stdout, &cfg, &mach, total_bytes);
        fflush(stdout);
    }

    /* Page cache: read everything once, if it fits. */
    double avail = nb_mem_available_gib();
    if (!cfg.cold && avail > 0 && total_bytes / 1073741824.0 > 0.6 * avail)
        nb_warn(&ctx, "the dataset (%.1f GiB) does not fit in the page cache (%.1f GiB "
                "available): 'hot' numbers are partly disk-bound; try --cold",
                total_bytes / 1073741824.0, avail);
    else if (!cfg.cold && !ctx.rclient)
        nb_warm_all(&ctx);

    nb_ceiling ceilings[6];
    size_t nceil;
    static nb_zst_report zst;
    static nb_remote_report rrep;
    memset(ceilings, 0, sizeof ceilings);
    if (!ctx.quiet) {
        printf("ceilings:\n");
        fflush(stdout);
    }
    double ref = measure_ceilings(&ctx, &cfg, max_workers, mach.cores_allowed, &zst, ceilings,
                                  &nceil, &rrep);
    /* The grid's loaders keep the requests in flight the sweep recommends
     * (cfg.remote points at renv.cfg). */
    if (rrep.measured)
        renv.cfg.max_inflight = rrep.max_inflight;
    if (!ctx.quiet) {
        nb_print_ceilings(stdout, ceilings, nceil, cfg.ceiling_ref);
        fflush(stdout);
    }

    size_t nruns = (size_t)(o.nio * o.nworkers * o.nprefetch);
    nb_run *runs = calloc(nruns + (size_t)o.nprefetch, sizeof *runs); /* + extend_grid's */
    if (!runs) {
        perror("npyload-bench");
        return 1;
    }
    int nok = measure_grid(&ctx, &cfg, &o, ref, runs);
    if (!ctx.quiet)
        fputs(nb_legend, stdout);
    size_t more = extend_grid(&ctx, &cfg, &o, ref, mach.cores_allowed, runs, nruns);
    for (size_t i = nruns; i < nruns + more; i++)
        nok += runs[i].ok;
    nruns += more;
    warn_few_batches(&ctx, &cfg, runs, nruns);
    if (!ctx.rclient) {
        nb_zst_after_grid(&ctx, &cfg, mach.cores_allowed, ceilings, nceil, runs, nruns,
                          total_bytes, &zst);
        if (!ctx.quiet)
            nb_print_compression(stdout, &zst);
    }
    nb_recommendation rec;
    if (nb_recommend(runs, nruns, cfg.compute_ms, &rec) >= 0) {
        repeat_close(&ctx, &cfg, &o, ref, runs, nruns, &rec);
        nb_verdict(&runs[rec.run_index], cfg.compute_ms, rec.verdict,
                   sizeof rec.verdict);
        nb_next_steps(&cfg, &rec, &runs[rec.run_index], &zst, mach.cores_allowed,
                      rec.next_steps, sizeof rec.next_steps);
    }
    static nb_auto_cmp autocmp;
    if (o.auto_run)
        measure_auto(&ctx, &cfg, &o, ref, runs, nruns, &rec, &autocmp);
    nb_report rep = {.config = &cfg, .machine = &mach, .ceilings = ceilings,
                     .nceilings = nceil, .runs = runs, .nruns = nruns, .rec = &rec,
                     .warnings = ctx.warnings, .zst = ctx.rclient ? NULL : &zst,
                     .remote = ctx.rclient ? &rrep : NULL,
                     .autocmp = o.auto_run ? &autocmp : NULL};
    int status = report(&ctx, &rep, &o, nok);
    npyload_nvml_close(ctx.nvml);
    npyload_remote_client_destroy(ctx.rclient);
    tool_remote_free(&renv);
    free(runs);
    return status;
}
