/* Internal helpers shared by every module of lib/. Depends on nothing but
 * libc and the public header. Symbols are prefixed npyl_ and hidden. */
#ifndef NPYLOAD_COMMON_H
#define NPYLOAD_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "npyload.h"

#define NPYL_HIDDEN __attribute__((visibility("hidden")))
#define NPYL_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* Writes a formatted message into err[errlen] (NULL-safe, always
 * NUL-terminated) and returns `code`, so error paths read
 * `return npyl_fail(err, errlen, NPYLOAD_EFORMAT, "%s: ...", path);`. */
NPYL_HIDDEN int npyl_fail(char *err, size_t errlen, int code, const char *fmt,
                          ...) NPYL_PRINTF(4, 5);

/* One read: `len` bytes (> 0) of file `file` (an index into the file table
 * of whoever reads it) from byte `offset` on land at `dst`. lib/io,
 * lib/remote and the stores of lib/store all read lists of these. */
typedef struct npyl_req {
    uint32_t file;
    uint64_t offset;
    uint64_t len;
    void *dst;
} npyl_req;

/* npyload_mask_urls on s in place (s holds cap bytes): what npyl_fail
 * does to every message, for text formatted otherwise. */
NPYL_HIDDEN void npyl_mask_urls_in(char *s, size_t cap);

/* Monotonic clock in nanoseconds. */
NPYL_HIDDEN uint64_t npyl_now_ns(void);

/* CPU time of the calling thread in nanoseconds (0 when unavailable). */
NPYL_HIDDEN uint64_t npyl_thread_cpu_ns(void);

/* Adds the calling thread's CPU time since *mark to *sum and moves *mark to
 * now (start with *mark = npyl_thread_cpu_ns()). */
NPYL_HIDDEN void npyl_count_cpu(_Atomic uint64_t *sum, uint64_t *mark);

/* Off-CPU time of a span on the calling thread (time blocked, e.g. in a
 * read from a device): mark, do the work, then npyl_blocked_since. Wall
 * minus the thread's CPU time is the time off the CPU, blocked or
 * preempted; the thread's voluntary context switches tell them apart: a
 * span without one was only preempted (a page-cache copy on a busy
 * machine) and counts 0. Both from one getrusage(RUSAGE_THREAD) per end. */
typedef struct npyl_span {
    uint64_t wall, cpu, vcsw;
} npyl_span;
NPYL_HIDDEN npyl_span npyl_span_begin(void);
NPYL_HIDDEN uint64_t npyl_blocked_since(npyl_span m);

/* Page-aligned allocation of at least `size` bytes (NULL on failure), and its
 * release. Memory is not zeroed. */
NPYL_HIDDEN void *npyl_alloc_aligned(size_t size, size_t align);
NPYL_HIDDEN void npyl_free_aligned(void *p);

/* SplitMix64's constant and finaliser (Steele, Lea, Flood 2014; the
 * variant of Vigna's splitmix64.c): lib/order's shuffle and lib/transform's
 * augmentation draws are built from them, documented bit for bit there. */
#define NPYL_GOLDEN 0x9E3779B97F4A7C15ull
static inline uint64_t npyl_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Little-endian bytes: the `bytes` (1..8) low bytes of v into p, and back.
 * For serialised forms that must read the same on every host. On a
 * little-endian host one store (a value written byte by byte and read back
 * whole, as a hash does, would stall on store forwarding). */
static inline void npyl_put_le(unsigned char *p, uint64_t v, int bytes)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, &v, (size_t)bytes);
#else
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
#endif
}
static inline uint64_t npyl_get_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* a * b and a + b with overflow detection: return 0 and store the result, or
 * -1 on overflow. */
NPYL_HIDDEN int npyl_mul_u64(uint64_t a, uint64_t b, uint64_t *out);
NPYL_HIDDEN int npyl_add_u64(uint64_t a, uint64_t b, uint64_t *out);

/* The sized-struct rule (npyload.h, Conventions). A struct crosses the API
 * with the caller's sizeof: `theirs_size` bytes. npyl_sized_in copies the
 * common prefix of a caller's struct into the library's `ours` and zeroes
 * the rest of ours (NPYLOAD_EUNSUPPORTED when a newer caller set a member
 * past ours: nonzero bytes there); npyl_sized_out writes the common prefix
 * of ours into the caller's struct, zeroes the caller's members that ours
 * lacks, and writes nothing past theirs_size. Both return 0, or
 * NPYLOAD_EINVAL when theirs_size < min (the first published layout, see
 * NPYL_SIZE_THROUGH), and then copy nothing. */
#define NPYL_SIZE_THROUGH(type, member)                                        \
    (offsetof(type, member) + sizeof(((type *)0)->member))
NPYL_HIDDEN int npyl_sized_in(void *ours, size_t ours_size, const void *theirs,
                              size_t theirs_size, size_t min);
NPYL_HIDDEN int npyl_sized_out(void *theirs, size_t theirs_size,
                               const void *ours, size_t ours_size, size_t min);

/* What a non-regular file is, for messages: "directory", "FIFO",
 * "character device", "block device", "socket", "symbolic link", or
 * "special file". `mode` is a struct stat's st_mode. */
NPYL_HIDDEN const char *npyl_file_kind(unsigned mode);

/* Expands a glob into a sorted (byte order, strcmp) list of paths. On success
 * *paths holds *n malloc'd strings in one malloc'd array (npyl_free_paths).
 * Returns 0, NPYLOAD_ENOFILES or -errno, with a message in err naming the
 * pattern and, where a directory is at fault, which one ("PATTERN: directory
 * DIR does not exist"). */
NPYL_HIDDEN int npyl_glob_sorted(const char *pattern, char ***paths, size_t *n,
                                 char *err, size_t errlen);
NPYL_HIDDEN void npyl_free_paths(char **paths, size_t n);

#endif
