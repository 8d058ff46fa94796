/* Helpers shared by the Criterion tests. Independent of lib/: files are
 * written here by hand (not with npyload_format_header) so the library is
 * checked against a separate writer. */
#ifndef NPYLOAD_TESTUTIL_H
#define NPYLOAD_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* Creates a fresh directory under $TMPDIR (or /tmp); returns a malloc'd path. */
char *tu_mkdtemp(const char *tag);
/* rm -rf of a directory made by tu_mkdtemp; frees the path. */
void tu_rmtree(char *dir);
/* malloc'd "dir/name". */
char *tu_path(const char *dir, const char *name);

/* Writes a version-1.0 NPY file: header padded so the data starts at a
 * multiple of `align` (64 like numpy, or 16 like old writers), then `nbytes`
 * of `data`. Returns the data offset, or -1. */
long tu_write_npy(const char *path, const char *descr, int fortran,
                  int ndim, const int64_t *shape, const void *data,
                  size_t nbytes, unsigned align);

/* Deterministic content: byte i of sample s of file seed f. Tests derive the
 * expected bytes of any sample from this alone. */
static inline uint8_t tu_byte(uint32_t f, uint64_t s, uint64_t i)
{
    uint64_t x = (f + 1) * 0x9E3779B97F4A7C15ull ^ (s * 0xBF58476D1CE4E5B9ull) ^ (i * 0x94D049BB133111EBull);
    x ^= x >> 31;
    return (uint8_t)(x * 0xD6E8FEB86659FD93ull >> 56);
}

/* Writes a field as `nfiles` files "prefix_%04d.npy" in dir holding
 * samples_per_file[k] samples each of per-sample shape `sshape` (sndim dims,
 * dtype descr, itemsize) whose bytes are tu_byte(field_seed, global sample,
 * byte index within the sample). Returns 0 or -1. */
int tu_write_field(const char *dir, const char *prefix, uint32_t field_seed,
                   const char *descr, size_t itemsize, int sndim,
                   const int64_t *sshape, const int64_t *samples_per_file,
                   size_t nfiles, unsigned align);

/* The loader tests' two fields: "img" <f4 per-sample tu_img_shape (3, 5),
 * field seed 1, data aligned to 64 bytes; "lab" |u1 per-sample
 * tu_lab_shape (7,), field seed 2, aligned to 16 (as old writers did). */
extern const int64_t tu_img_shape[2], tu_lab_shape[1];

typedef struct tu_img_lab {
    char *dir;            /* a tu_mkdtemp directory: tu_rmtree(d.dir) */
    char img[512], lab[512]; /* the fields' globs: dir/img_*.npy, dir/lab_*.npy */
} tu_img_lab;

/* Writes both fields (tu_write_field) as nfiles files of sizes[k] samples
 * each under a fresh directory tagged `tag`, and fills *d. Returns 0, or
 * -1 (nothing left behind; d->dir NULL). */
int tu_img_lab_make(tu_img_lab *d, const char *tag, const int64_t *sizes, size_t nfiles);

/* Bytes per sample for a per-sample shape. */
size_t tu_sample_bytes(size_t itemsize, int sndim, const int64_t *sshape);

/* Entries in /proc/self/fd (open descriptors, plus the listing's own), or -1:
 * compare two counts to see whether descriptors leaked. */
int tu_count_fds(void);

/* Reads a whole file into a malloc'd buffer; *n its size. NULL on error. */
void *tu_read_file(const char *path, size_t *n);

/* The directory of the nvidia-cuda-nvrtc wheel's libnvrtc
 * (SITE/nvidia/cu13/lib or SITE/nvidia/cuda_nvrtc/lib) under the first of
 * the colon-separated site-packages directories `sites` that has it,
 * written to out. Returns 1, or 0 when none has it. */
int tu_nvrtc_wheel_dir(const char *sites, char *out, size_t len);

/* For the stress drivers, which run without Criterion (it cannot run under
 * ThreadSanitizer): when cond is false, prints "FAIL file:line: message" to
 * stderr, counts it in `fails` and returns from the calling void function. */
#define TU_STRESS_CHECK(fails, cond, ...)                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
            (fails)++;                                                         \
            return;                                                            \
        }                                                                      \
    } while (0)

#endif
