/*
 * npyload-pack — compress NPY files into seekable .npy.zst shards.
 *
 *   npyload-pack [-l LEVEL] [--frame-size BYTES] [-T THREADS] [-f] [--rm]
 *                [--no-check] [--narrow] [-q] [-o OUT] FILE.npy...
 *
 * Writes FILE.npy.zst beside each input (npyload_pack_file: zstd's
 * seekable format, frame 0 the NPY header, later frames whole samples).
 * `zstd -d FILE.npy.zst` gives back FILE.npy byte for byte.
 *
 * Habits of the zstd CLI: an existing output is kept unless -f (which
 * replaces regular files only); the output is written as a nameless
 * temporary file, synced, and linked under its name when complete, so an
 * interrupted pack or a power loss never leaves a half file under the final
 * name; SIGINT or SIGTERM stops at the next chunk (nothing left); a
 * progress line on stderr only when it is a terminal; one line per file and
 * a total on stdout; a failed file is named on stderr and the others are
 * still packed.
 *
 * Exit status: 0 every file packed, 1 some file failed, 2 usage error,
 * 128 + signal when interrupted.
 *
 * Uses nothing but include/npyload.h, npyload_args.h and libc.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "npyload.h"
#include "npyload_args.h"

#define PROG "npyload-pack"

static volatile sig_atomic_t g_signal; /* the tool's only process-wide state */

static void on_signal(int sig) { g_signal = sig; }

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [OPTIONS] FILE.npy...\n"
            "\n"
            "Compresses each NPY file into FILE.npy.zst (zstd seekable format:\n"
            "frame 0 the header, then frames of whole samples; the loader reads\n"
            "samples at random; `zstd -d` restores the .npy byte for byte).\n"
            "\n"
            "  -l, --level LEVEL      zstd level -131072 .. 22 (default %d;\n"
            "                         negative = faster)\n"
            "      --frame-size BYTES target decompressed bytes per frame: the\n"
            "                         fewest whole samples reaching it (default\n"
            "                         %u; 1 .. 1G; suffixes K, M, G = KiB,\n"
            "                         MiB, GiB)\n"
            "  -T, --threads N        compression threads 0 .. 1024 (default 0 =\n"
            "                         all cores)\n"
            "  -f, --force            replace existing outputs (regular files\n"
            "                         only: never a device, FIFO, directory or\n"
            "                         symbolic link)\n"
            "      --rm               remove each input after it is packed\n"
            "      --no-check         no frame checksums (default: checksummed)\n"
            "      --narrow           lossless narrowing: values of 2, 4 or 8 bytes\n"
            "                         that are at most 256 distinct bit patterns\n"
            "                         (8-bit images stored as float32) become\n"
            "                         one-byte codes + the table of values; the\n"
            "                         loader delivers the values bit for bit; a\n"
            "                         file with more is refused (exit 1)\n"
            "      --store            with --narrow: the codes uncompressed, as a\n"
            "                         plain .npy of the codes plus a trailer with\n"
            "                         the table (numpy reads the codes; npyload\n"
            "                         the values, with no decode): FILE.narrow.npy\n"
            "  -o, --output OUT       output path (one input only)\n"
            "  -q, --quiet            no per-file lines, no progress\n"
            "  -h, --help             this text\n"
            "  -V, --version          the npyload version\n"
            "\n"
            "Exit status: 0 all packed, 1 some file failed (named on stderr),\n"
            "2 usage error, 128+N interrupted by signal N (no partial output).\n",
            NPYLOAD_PACK_DEFAULT_LEVEL, NPYLOAD_PACK_DEFAULT_FRAME_SIZE);
}

/* The option as the user spelled it ("-l" or "--level"), for messages. */
static const char *spelled(char **argv, const char *shortname,
                           const char *longname)
{
    const char *o = optarg == argv[optind - 1] ? argv[optind - 2] : argv[optind - 1];
    return o[0] == '-' && o[1] == '-' ? longname : shortname;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct progress_state {
    const char *name;
    int show;      /* stderr is a terminal and not quiet */
    double start, last;
    int drawn;
} progress_state;

/* Polled by the library between chunks: draws the line, and returns the
 * signal flag so that SIGINT/SIGTERM cancel the pack (temp file removed). */
static int progress(void *arg, uint64_t done, uint64_t total)
{
    progress_state *p = arg;
    if (p->show) {
        double t = now_s();
        if (t - p->last >= 0.1 || done == total) {
            double el = t - p->start;
            fprintf(stderr, "\r%s: %3.0f%%  %.1f MB/s\033[K", p->name,
                    total ? 100.0 * (double)done / (double)total : 100.0,
                    el > 0 ? (double)done / el / 1e6 : 0.0);
            fflush(stderr);
            p->last = t;
            p->drawn = 1;
        }
    }
    return g_signal != 0;
}

static void clear_line(progress_state *p)
{
    if (p->drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        p->drawn = 0;
    }
}

int main(int argc, char **argv)
{
    static const struct option longs[] = {
        {"level", required_argument, NULL, 'l'},
        {"frame-size", required_argument, NULL, 'F'},
        {"threads", required_argument, NULL, 'T'},
        {"force", no_argument, NULL, 'f'},
        {"rm", no_argument, NULL, 'R'},
        {"no-check", no_argument, NULL, 'C'},
        {"narrow", no_argument, NULL, 'N'},
        {"store", no_argument, NULL, 'S'},
        {"output", required_argument, NULL, 'o'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    npyload_pack_options o;
    memset(&o, 0, sizeof o);
    const char *out = NULL;
    int rm = 0, quiet = 0, c;
    int64_t v;
    while ((c = getopt_long(argc, argv, "l:T:fo:qhV", longs, NULL)) != -1) {
        switch (c) {
        case 'l':
            /* zstd's range (ZSTD_minCLevel() .. ZSTD_maxCLevel()) */
            if (tool_arg_i64(PROG, spelled(argv, "-l", "--level"), optarg, -131072, 22, &v) != 0)
                return 2;
            o.level = (int)v;
            break;
        case 'F':
            if (tool_arg_size(PROG, "--frame-size", optarg, 1, 1u << 30,
                              &o.frame_size) != 0)
                return 2;
            break;
        case 'T':
            if (tool_arg_i64(PROG, spelled(argv, "-T", "--threads"), optarg, 0, 1024, &v) != 0)
                return 2;
            o.threads = (int)v;
            break;
        case 'f': o.force = 1; break;
        case 'R': rm = 1; break;
        case 'C': o.no_checksum = 1; break;
        case 'N': o.narrow = 1; break;
        case 'S': o.store = 1; break;
        case 'o': out = optarg; break;
        case 'q': quiet = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf(PROG " %s\n", npyload_version_string()); return 0;
        default: usage(stderr); return 2;
        }
    }
    int nin = argc - optind;
    if (nin < 1) {
        fprintf(stderr, PROG ": no input file\n");
        usage(stderr);
        return 2;
    }
    if (out && nin != 1) {
        fprintf(stderr, PROG ": -o names one output: give exactly one input "
                        "(got %d)\n", nin);
        return 2;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    progress_state ps;
    memset(&ps, 0, sizeof ps);
    ps.show = !quiet && isatty(STDERR_FILENO);
    o.progress = progress;
    o.progress_arg = &ps;

    int failed = 0, packed = 0;
    uint64_t tin = 0, tout = 0;
    double tsec = 0;
    for (int i = optind; i < argc && !g_signal; i++) {
        const char *in = argv[i];
        npyload_pack_result r;
        char err[1024];
        ps.name = in;
        ps.start = ps.last = now_s();
        int rc = npyload_pack_file(in, out, &o, sizeof o, &r, sizeof r, err, sizeof err);
        clear_line(&ps);
        if (rc == -ECANCELED && g_signal)
            break;
        if (rc != 0) {
            fprintf(stderr, PROG ": %s\n", err);
            failed++;
            continue;
        }
        packed++;
        tin += r.in_bytes;
        tout += r.out_bytes;
        tsec += r.seconds;
        if (!quiet) {
            char dst[PATH_MAX + 8];
            if (out)
                snprintf(dst, sizeof dst, "%s", out);
            else
                npyload_pack_default_out(in, o.store, dst, sizeof dst);
            char nar[48] = "";
            if (r.narrow_values)
                snprintf(nar, sizeof nar, ", narrowed to %" PRIu64 " codes", r.narrow_values);
            printf("%s: %" PRIu64 " -> %" PRIu64 " bytes, ratio %.2fx, %" PRIu64
                   " frames (%" PRIu64 " samples/frame)%s, %.1f MB/s -> %s\n",
                   in, r.in_bytes, r.out_bytes,
                   r.out_bytes ? (double)r.in_bytes / (double)r.out_bytes : 0.0,
                   r.frames, r.samples_per_frame, nar,
                   r.seconds > 0 ? (double)r.in_bytes / r.seconds / 1e6 : 0.0, dst);
            fflush(stdout);
        }
        if (rm && unlink(in) != 0) {
            fprintf(stderr, PROG ": %s: packed, but cannot remove it: %s\n", in,
                    strerror(errno));
            failed++;
        }
    }
    if (g_signal) {
        fprintf(stderr, PROG ": interrupted by signal %d: no partial output "
                        "left behind\n", (int)g_signal);
        return 128 + (int)g_signal;
    }
    if (!quiet && nin > 1)
        printf("total: %d of %d files, %" PRIu64 " -> %" PRIu64 " bytes, "
               "ratio %.2fx, %.1f MB/s\n",
               packed, nin, tin, tout, tout ? (double)tin / (double)tout : 0.0,
               tsec > 0 ? (double)tin / tsec / 1e6 : 0.0);
    return failed ? 1 : 0;
}
