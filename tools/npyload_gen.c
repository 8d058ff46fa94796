/*
 * npyload-gen — write NPY datasets for demos, tests and benchmarks.
 *
 *   npyload-gen --preset captcha --out DIR [--split train] [--files 4]
 *               [--samples-per-file 64] [--channels 2] [--seed 0]
 *               [--first-id 0]
 *   npyload-gen --generic --out DIR --shape 3,32,32 [--prefix data]
 *               [--files 4] [--samples-per-file 64] [--dtype <f4]
 *               [--fortran] [--seed 0] [--first-id 0]
 *
 * This file is the command line; the layouts are in npyload_gen_captcha.c
 * and npyload_gen_generic.c, the files in npyload_gen_write.c.
 *
 * Determinism: content depends only on (seed, split or prefix, id, sample),
 * never on the order of generation, and libc's rand() is not used.
 *
 * Files are assembled in an 8 MiB buffer and written with large sequential
 * write()s to "NAME.tmp", then renamed, so a file that exists is complete.
 * Before writing, the free space of DIR is checked against the whole dataset.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "npyload.h"
#include "npyload_args.h"
#include "npyload_gen.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: " PROG " --preset captcha --out DIR [--split train] [--files 4]\n"
        "                   [--samples-per-file 64] [--channels 2] [--seed 0]\n"
        "                   [--first-id 0]\n"
        "       " PROG " --generic --out DIR --shape 3,32,32 [--prefix data]\n"
        "                   [--files 4] [--samples-per-file 64] [--dtype <f4]\n"
        "                   [--fortran] [--seed 0] [--first-id 0]\n"
        "\n"
        "--preset captcha writes the slider-CAPTCHA reference layout:\n"
        "  DIR/images/SPLIT/SPLIT_{id:04d}.npy           float32 (S, C, 256, 512)\n"
        "      C=2: gray + mask, C=4: RGB + mask; 8-bit levels k/255;\n"
        "      mask all ones; about 9x with zstd -3 like natural photos\n"
        "  DIR/labels/SPLIT/SPLIT_{id:04d}_heatmaps.npy  float32 (S, 2, 64, 128)\n"
        "      gap, slider: gaussian sigma 1.5 in a 9x9 window, 1.0 at the peak\n"
        "  DIR/labels/SPLIT/SPLIT_{id:04d}_offsets.npy   float32 (S, 4, 64, 128)\n"
        "      gap du,dv, slider du,dv in [-0.5, 0.5), set at the peak cell only\n"
        "--generic writes DIR/PREFIX_{id:04d}.npy of shape (S, *SHAPE) with\n"
        "  pseudo-random content; --dtype one of b1 i1 i2 i4 i8 u1 u2 u4 u8\n"
        "  f2 f4 f8 c8 c16, prefixed by '<', '>' or '|' (one-byte types).\n"
        "\n"
        "  --out DIR               output directory (created as needed)\n"
        "  --split NAME            captcha split: train, val, test... (train)\n"
        "  --channels 2|4          captcha image channels (2)\n"
        "  --prefix NAME           generic file name prefix (data)\n"
        "  --shape D1,D2,...       generic per-sample shape ('' = scalars)\n"
        "  --dtype DTYPE           generic dtype (<f4)\n"
        "  --fortran               generic: mark the files fortran_order\n"
        "  --files N               number of files (4)\n"
        "  --samples-per-file S    first dimension of every file (64)\n"
        "  --first-id K            id of the first file (0), to write shards\n"
        "                          of one dataset from several processes\n"
        "  --seed S                any 64-bit integer (0); same seed, same bytes\n"
        "  --quiet                 no summary line\n"
        "  --help, --version\n"
        "\n"
        "Content is a pure function of (seed, split or prefix, id, sample):\n"
        "splitmix64 streams, never rand(). Each file is written as NAME.tmp and\n"
        "renamed when complete; the space for every file is checked first\n"
        "(files being replaced are not counted as free), and an interrupted run\n"
        "(SIGINT, SIGTERM) removes its temporary files. Exit status: 0 done,\n"
        "1 I/O error or not enough space, 2 bad arguments; killed by a signal\n"
        "after the clean-up (shell status 130, 143).\n");
}

static int bad_arg(const char *fmt, const char *a)
{
    fprintf(stderr, PROG ": ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n(try " PROG " --help)\n");
    return 2;
}

static int parse_i64(const char *opt, const char *s, int64_t lo, int64_t hi,
                     int64_t *out)
{
    if (tool_arg_i64(PROG, opt, s, lo, hi, out) != 0) {
        fprintf(stderr, "(try " PROG " --help)\n");
        return -1;
    }
    return 0;
}

/* A 64-bit seed: 0 .. 2^64-1, or a negative int64 taken modulo 2^64. */
static int parse_seed(const char *s, uint64_t *out)
{
    if (*s == '-') {
        int64_t v;
        if (parse_i64("--seed", s, INT64_MIN, -1, &v) != 0)
            return -1;
        *out = (uint64_t)v;
        return 0;
    }
    if (tool_arg_u64(PROG, "--seed", s, 0, UINT64_MAX, out) != 0) {
        fprintf(stderr, "(try " PROG " --help)\n");
        return -1;
    }
    return 0;
}

static int valid_name(const char *s)
{
    return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

enum { MODE_ANY, MODE_CAPTCHA, MODE_GENERIC };
enum {
    OPT_PRESET = 1, OPT_OUT, OPT_SPLIT, OPT_PREFIX, OPT_FILES, OPT_SAMPLES, OPT_CHANNELS,
    OPT_SEED, OPT_SHAPE, OPT_DTYPE, OPT_FIRST_ID, OPT_GENERIC, OPT_FORTRAN, OPT_QUIET,
    OPT_VERSION, OPT_HELP = 'h',
};

static const struct option longopts[] = {
    {"preset", required_argument, NULL, OPT_PRESET},
    {"out", required_argument, NULL, OPT_OUT},
    {"split", required_argument, NULL, OPT_SPLIT},
    {"prefix", required_argument, NULL, OPT_PREFIX},
    {"files", required_argument, NULL, OPT_FILES},
    {"samples-per-file", required_argument, NULL, OPT_SAMPLES},
    {"channels", required_argument, NULL, OPT_CHANNELS},
    {"seed", required_argument, NULL, OPT_SEED},
    {"shape", required_argument, NULL, OPT_SHAPE},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"first-id", required_argument, NULL, OPT_FIRST_ID},
    {"generic", no_argument, NULL, OPT_GENERIC},
    {"fortran", no_argument, NULL, OPT_FORTRAN},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

/* What the command line asked for, beyond gen_opts. */
typedef struct cli {
    gen_opts o;
    const char *preset;
    int generic, quiet;
    const char *mode_opt[3]; /* the last option that only one mode takes */
} cli;

/* The mode an option belongs to (for "applies to ... only"). */
static int opt_mode(int opt)
{
    switch (opt) {
    case OPT_SPLIT: case OPT_CHANNELS: return MODE_CAPTCHA;
    case OPT_PREFIX: case OPT_SHAPE: case OPT_DTYPE: case OPT_FORTRAN: return MODE_GENERIC;
    default: return MODE_ANY;
    }
}

/* One option with its value. @return : 0, or the exit status (2). */
static int apply_opt(cli *c, int opt, const char *val)
{
    gen_opts *o = &c->o;
    switch (opt) {
    case OPT_PRESET: c->preset = val; break;
    case OPT_OUT:
        if (!*val)
            return bad_arg("--out needs a directory%s", "");
        o->out = val;
        break;
    case OPT_SPLIT:
    case OPT_PREFIX:
        if (!valid_name(val))
            return bad_arg("'%s' must be a non-empty name without '/'", val);
        *(opt == OPT_SPLIT ? &o->split : &o->prefix) = val;
        break;
    case OPT_FILES: return parse_i64("--files", val, 1, 100000000, &o->files) ? 2 : 0;
    case OPT_SAMPLES:
        return parse_i64("--samples-per-file", val, 0, INT32_MAX, &o->samples) ? 2 : 0;
    case OPT_FIRST_ID: return parse_i64("--first-id", val, 0, INT32_MAX, &o->first_id) ? 2 : 0;
    case OPT_CHANNELS: {
        int64_t ch;
        if (parse_i64("--channels", val, 2, 4, &ch) != 0)
            return 2;
        if (ch == 3)
            return bad_arg("--channels 3: 2 (gray + mask) or 4 (RGB + mask)%s", "");
        o->channels = (int)ch;
        break;
    }
    case OPT_SEED: return parse_seed(val, &o->seed) ? 2 : 0;
    case OPT_SHAPE: o->shape = val; break;
    case OPT_DTYPE: o->dtype = val; break;
    case OPT_GENERIC: c->generic = 1; break;
    case OPT_FORTRAN: o->fortran = 1; break;
    case OPT_QUIET: c->quiet = 1; break;
    }
    return 0;
}

/* The combinations the options allow. @return : 0 or 2. */
static int check_combination(const cli *c)
{
    const gen_opts *o = &c->o;
    if (c->generic && c->preset)
        return bad_arg("choose one of --preset and --generic%s", "");
    if (!c->generic && !c->preset)
        return bad_arg("say what to write: --preset captcha or --generic%s", "");
    if (c->preset && strcmp(c->preset, "captcha") != 0)
        return bad_arg("unknown preset '%s' (known: captcha)", c->preset);
    if (!o->out)
        return bad_arg("--out DIR is required%s", "");
    if (c->preset && c->mode_opt[MODE_GENERIC])
        return bad_arg("%s applies to --generic only", c->mode_opt[MODE_GENERIC]);
    if (c->generic && c->mode_opt[MODE_CAPTCHA])
        return bad_arg("%s applies to --preset captcha only", c->mode_opt[MODE_CAPTCHA]);
    if (c->generic && !o->shape)
        return bad_arg("--generic needs --shape (per-sample dimensions, e.g. 3,32,32)%s", "");
    if (c->preset && o->samples < 1)
        return bad_arg("--samples-per-file must be at least 1%s", "");
    if (o->first_id + o->files - 1 > INT32_MAX)
        return bad_arg("--first-id + --files is too large%s", "");
    return 0;
}

/* @return : -1 to go on, or the exit status. */
static int parse_args(int argc, char **argv, cli *c)
{
    int opt, idx;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":h", longopts, &idx)) != -1) {
        if (opt == OPT_HELP) {
            usage(stdout);
            return 0;
        }
        if (opt == OPT_VERSION) {
            printf(PROG " %s\n", npyload_version_string());
            return 0;
        }
        if (opt == ':')
            return bad_arg("%s needs a value", argv[optind - 1]);
        if (opt == '?')
            return bad_arg(optopt ? "option '%s' takes no value" : "unknown option '%s'",
                           argv[optind - 1]);
        int mode = opt_mode(opt);
        if (mode != MODE_ANY)
            c->mode_opt[mode] = argv[optind - 1];
        int rc = apply_opt(c, opt, optarg);
        if (rc != 0)
            return rc;
    }
    if (optind < argc)
        return bad_arg("unexpected argument '%s'", argv[optind]);
    return check_combination(c) ? 2 : -1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    cli c = {.o = {.out = NULL, .split = "train", .prefix = "data", .dtype = "<f4",
                   .shape = NULL, .files = 4, .samples = 64, .channels = 2, .first_id = 0,
                   .seed = 0, .fortran = 0}};
    int status = parse_args(argc, argv, &c);
    if (status >= 0)
        return status;

    gen_install_cleanup();
    gen_totals t = {0, 0, 0};
    double t0 = now_s();
    int rc = c.generic ? gen_generic(&c.o, &t) : gen_captcha(&c.o, &t);
    double dt = now_s() - t0;
    if (rc == -2)
        return 2;
    if (rc != 0)
        return 1;
    if (!c.quiet)
        printf(PROG ": wrote %" PRIu64 " files, %" PRIu64 " samples, %" PRIu64
               " bytes (%.1f MiB) under %s in %.3f s, %.1f MB/s\n",
               t.files, t.samples, t.bytes, (double)t.bytes / 1048576.0, c.o.out, dt,
               dt > 0 ? (double)t.bytes / 1e6 / dt : 0.0);
    return 0;
}
