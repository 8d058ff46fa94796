/*
 * npyload_bench_support.h — UNSTABLE. For npyload's own benchmark
 * (npyload-bench), tools (npyload-inspect) and tests only.
 *
 * Not installed, not part of libnpyload (shared or static), no API or ABI
 * promise: names and meanings may change in any release. The definitions
 * live in the `npyload_bench_support` static library (lib/CMakeLists.txt),
 * built in the build tree next to libnpyload; link it explicitly. Programs
 * outside this repository should measure with CUDA themselves.
 *
 * Like npyload.h it carries no CUDA types: streams are `void *`.
 */
#ifndef NPYLOAD_BENCH_SUPPORT_H
#define NPYLOAD_BENCH_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#include "npyload.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! npyload_cuda_h2d_bandwidth() : measures pinned host-to-device
 * cudaMemcpyAsync bandwidth on `device` with `bytes` per copy, `iters`
 * copies, on a non-blocking stream, on a thread of its own (the caller's
 * current device is untouched); writes GB/s (1e9 bytes/s) to *gbps.
 * @return : 0, NPYLOAD_EINVAL, NPYLOAD_ENOCUDA or NPYLOAD_ECUDA. */
int npyload_cuda_h2d_bandwidth(int device, size_t bytes, int iters, double *gbps);

/*! npyload_compute_sim: a non-blocking CUDA stream on a device and a kernel
 * that keeps it busy for a given time, so programs without CUDA headers (the
 * bench, tests) can stand in for a training step: take a batch, make the
 * simulator's stream wait for it (npyload_batch_wait_stream), queue
 * npyload_compute_sim_busy, release with npyload_batch_release_stream. The
 * kernel is PTX JIT-compiled by the driver; nothing here needs nvcc. */
typedef struct npyload_compute_sim npyload_compute_sim;

/*! npyload_compute_sim_create() :
 * @return : 0, NPYLOAD_ENOCUDA (reason in `why`) or NPYLOAD_ECUDA. */
int npyload_compute_sim_create(int device, npyload_compute_sim **out, char *why,
                               size_t whylen);
/*! npyload_compute_sim_stream() : its stream (a cudaStream_t). */
void *npyload_compute_sim_stream(const npyload_compute_sim *s);
/*! npyload_compute_sim_busy() : queues a kernel that spins for `ns`
 * nanoseconds (GPU global timer) on the stream; returns at once. */
int npyload_compute_sim_busy(npyload_compute_sim *s, uint64_t ns);
/*! npyload_compute_sim_sync() : waits on the host for the stream. */
int npyload_compute_sim_sync(npyload_compute_sim *s);
/*! npyload_compute_sim_destroy() : waits for the stream, frees. NULL-safe. */
void npyload_compute_sim_destroy(npyload_compute_sim *s);

/* ---- .npy.zst for npyload-inspect and npyload-bench (lib/zst) ---- */

/*! npyload_zst_probe() : 1 if `path` starts with a zstd frame (a .npy.zst,
 * whatever its name), 0 if not (a .npy, or shorter than 4 bytes), -errno. */
int npyload_zst_probe(const char *path);

/*! npyload_zst_facts: what a validated .npy.zst holds. */
typedef struct npyload_zst_facts {
    npyload_header hdr;            /* the NPY facts, exactly as
                                      npyload_read_header gives them for the
                                      .npy (file_bytes: the .npy's size) */
    uint64_t compressed_bytes;     /* the .npy.zst's size, seek table in */
    uint64_t table_bytes;          /* the seek table's skippable frame */
    uint32_t frames;               /* zstd frames, frame 0 (the header) in */
    int checksums;                 /* the seek table carries checksums */
    uint64_t samples_per_frame;    /* samples in data frame 1 (every data
                                      frame but the last holds as many when
                                      npyload-pack wrote it); 0: no data */
    uint64_t max_frame_bytes;      /* largest data frame, decompressed */
    uint64_t max_frame_compressed; /* largest data frame, compressed */
} npyload_zst_facts;

/*! npyload_zst_file: a .npy.zst whose seek table and header were read and
 * validated as the loader does (the file is closed again). */
typedef struct npyload_zst_file npyload_zst_file;

/*! npyload_zst_file_open() :
 * @return : 0 and *out, or NPYLOAD_EFORMAT / EUNSUPPORTED / ETRUNCATED /
 *           ETOOBIG / -errno with "PATH: problem" in `err`. */
int npyload_zst_file_open(const char *path, npyload_zst_file **out, char *err,
                          size_t errlen);
/*! npyload_zst_file_close() : NULL-safe. */
void npyload_zst_file_close(npyload_zst_file *z);
const npyload_zst_facts *npyload_zst_file_facts(const npyload_zst_file *z);
/*! npyload_zst_file_frame() : frame `f`'s compressed bytes are
 * [*offset, *offset + *csize) of the file; it decompresses to *dsize bytes.
 * @return : 0, or NPYLOAD_EINVAL for f >= frames. */
int npyload_zst_file_frame(const npyload_zst_file *z, uint32_t f,
                           uint64_t *offset, uint64_t *csize, uint64_t *dsize);
/*! npyload_zst_file_decode() : decodes frame `f` from its compressed bytes
 * `src` into `dst` with the caller's ZSTD_DCtx `dctx`, with the loader's
 * checks (sizes, checksums). Allocates nothing.
 * @return : 0, or NPYLOAD_EFORMAT / EINVAL with "PATH: frame F at byte B:
 *           problem" in `err`. */
int npyload_zst_file_decode(const npyload_zst_file *z, uint32_t f, void *dctx,
                            const void *src, void *dst, size_t cap, char *err,
                            size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* NPYLOAD_BENCH_SUPPORT_H */
