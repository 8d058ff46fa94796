/* npyload-gen: declarations shared by its parts.
 *   npyload_gen.c          the command line
 *   npyload_gen_write.c    output files: NAME.tmp then rename, free space,
 *                          clean-up on SIGINT/SIGTERM
 *   npyload_gen_captcha.c  the captcha preset (MISSION.md's layout)
 *   npyload_gen_generic.c  --generic: any shape and numpy dtype
 *
 * Uses nothing but include/npyload.h and libc (+ libm). */
#ifndef NPYLOAD_GEN_H
#define NPYLOAD_GEN_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define PROG "npyload-gen"
#define CHUNK_BYTES ((size_t)8 << 20)

/* ---- PRNG: splitmix64 (Steele, Lea, Flood 2014; public-domain reference by
 * Sebastiano Vigna). Content is a pure function of the stream's state. ---- */

static inline uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct rng {
    uint64_t s;
} rng;

/* The next output of the stream: splitmix64 is mix64 of a Weyl sequence. */
static inline uint64_t rng_next(rng *r)
{
    uint64_t z = r->s;
    r->s += 0x9e3779b97f4a7c15ull;
    return mix64(z);
}

static inline uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

/* ---- options and totals ---- */

typedef struct gen_opts {
    const char *out;
    const char *split;
    const char *prefix;
    const char *dtype;
    const char *shape;
    int64_t files;
    int64_t samples;
    int64_t channels;
    int64_t first_id;
    uint64_t seed;
    int fortran;
} gen_opts;

typedef struct gen_totals {
    uint64_t files, samples, bytes;
} gen_totals;

/* The generators. @return : 0, -1 on an I/O error (said on stderr), -2 on a
 * bad argument found late (said on stderr). */
int gen_captcha(const gen_opts *o, gen_totals *t);
int gen_generic(const gen_opts *o, gen_totals *t);

/* ---- npyload_gen_write.c ---- */

/* At most this many output files are open at once (captcha: 3). */
#define GEN_MAX_OPEN 3

/* One output file: written to PATH.tmp and renamed to PATH when complete,
 * so a file that exists under its final name is whole. `slot` (< GEN_MAX_OPEN)
 * names the temporary file for the signal handler. */
typedef struct writer {
    int fd;
    int slot;
    char *buf;
    size_t len;
    uint64_t written;
    char path[PATH_MAX];
} writer;

/* SIGINT, SIGTERM and SIGHUP remove the temporary files being written, then
 * end the process by the same signal (the shell sees 130, 143, 129). */
void gen_install_cleanup(void);

/* mkdir -p. @return : 0 or -1 (said on stderr). */
int mkdir_p(const char *dir);

/* Bytes of an NPY file (header + data_bytes). @return : 0 or -1. */
int gen_npy_bytes(const char *descr, int fortran, int ndim, const int64_t *shape,
                  uint64_t data_bytes, uint64_t *out);

/* Refuses, with "need N MiB in DIR, M MiB free", when `copies` sets of the
 * files sized sizes[0..n) (each rounded up to the filesystem's block) do not
 * fit in what statvfs(dir) says is available. @return : 0 or -1. */
int gen_check_space(const char *dir, const uint64_t *sizes, int n, int64_t copies);

int buffers_alloc(char **bufs, int n);
void buffers_free(char **bufs, int n);

/* Opens PATH.tmp and writes the NPY header; the data follows through
 * writer_reserve(). `buf` (CHUNK_BYTES, 64-byte aligned) is the caller's and
 * reused from file to file. @return : 0 or -1. */
int writer_open(writer *w, int slot, char *buf, const char *path, const char *descr,
                int fortran, int ndim, const int64_t *shape);
/* Space for `n` (<= CHUNK_BYTES) more bytes, flushing first if they do not
 * fit; NULL after a write error. */
void *writer_reserve(writer *w, size_t n);
/* Flushes, closes and renames into place (ok != 0), or discards the
 * temporary file. Safe on a writer that never opened (fd = -1).
 * @return : 0 or -1. */
int writer_close(writer *w, int ok);

#endif
