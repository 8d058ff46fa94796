/*
 * npyload_support.h — scaffolding for npyload's own tools (npyload-bench)
 * and tests: the pinned H2D ceiling, a GPU compute simulator, NVML
 * monitoring. Not part of libnpyload (shared or static), not installed, no
 * API or ABI promise. The definitions live in the `npyload_support` static
 * library (tools/support/CMakeLists.txt), built in the build tree only.
 *
 * Like npyload.h it carries no CUDA types: streams are `void *`.
 */
#ifndef NPYLOAD_SUPPORT_H
#define NPYLOAD_SUPPORT_H

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

/*! npyload_nvml: GPU monitoring through NVML (libnvidia-ml.so.1, loaded at
 * run time; absent on machines without an NVIDIA driver). */
typedef struct npyload_nvml npyload_nvml;
typedef struct npyload_nvml_sample_t {
    double util_pct;     /* GPU utilisation, percent */
    double power_w;      /* 0 when NVML cannot tell */
    double mem_used_mib; /* < 0 when NVML cannot tell */
} npyload_nvml_sample_t;
/*! npyload_nvml_open() : NVML for `device` (an NVML index).
 * @return : 0, or -1 with the reason in `why`. */
int npyload_nvml_open(int device, npyload_nvml **out, char *why, size_t whylen);
/*! npyload_nvml_sample() : @return : 0, or -1 when no sample came. */
int npyload_nvml_sample(const npyload_nvml *n, npyload_nvml_sample_t *s);
/*! npyload_nvml_close() : NULL-safe. */
void npyload_nvml_close(npyload_nvml *n);

/*! npyload_support_io: lib/io, the loader's own read backends, for the
 * bench's ceilings. Files by index into `paths` (which must outlive the
 * context); `backend` an NPYLOAD_IO_* value other than AUTO; the gather
 * path is off (a PREAD context really preads, an MMAP context copies from
 * its mappings); `depth`: io_uring reads in flight. */
typedef struct npyload_support_io npyload_support_io;
typedef struct npyload_support_req {
    uint32_t file;
    uint64_t offset, len;
    void *dst;
} npyload_support_req;
/*! @return : 0, NPYLOAD_ENOURING, NPYLOAD_EINVAL or -errno (err says why). */
int npyload_support_io_create(const char *const *paths, size_t n, int backend, int direct,
                              unsigned depth, npyload_support_io **out, char *err, size_t len);
/*! Reads all n requests (blocking). @return : 0 or an error (err says why). */
int npyload_support_io_read(npyload_support_io *io, const npyload_support_req *reqs, size_t n,
                            char *err, size_t len);
/*! NULL-safe. */
void npyload_support_io_destroy(npyload_support_io *io);

/*! npyload_rget: what a remote store gives, measured with the loader's own
 * HTTP path (lib/remote: a libcurl multi handle per thread, keep-alive,
 * signing) but without the loader: ranged GETs of `bytes` bytes at random
 * offsets of the objects, at several concurrencies (threads x requests in
 * flight per thread), each for `seconds`. Used by npyload-bench on remote
 * fields and by bench/bench_remote. */
#define NPYLOAD_RGET_MAX_POINTS 16
typedef struct npyload_rget_point {
    int concurrency, threads, inflight;
    double requests_per_s, mb_per_s;
    double p50_ms, p99_ms;     /* single-request latency: measured at
                                  inflight 1 only, else < 0 */
} npyload_rget_point;
typedef struct npyload_rget_result {
    size_t objects;
    uint64_t object_bytes;
    size_t bytes_per_request;
    double seconds;
    int npoints;
    npyload_rget_point points[NPYLOAD_RGET_MAX_POINTS];
    double best_mb_per_s;
    /* The recommendation: the smallest concurrency within 10 % of the best
     * throughput, as reading threads x requests in flight per thread; a
     * worker has two reading threads with read-ahead (itself and its
     * read-ahead thread), so workers = threads / 2 (at least 1) and
     * max_inflight = concurrency / (2 x workers), rounded up. */
    int pick;                  /* index of the point chosen */
    int concurrency, workers, max_inflight;
    uint64_t requests, retries; /* HTTP requests of the whole sweep (the
                                   probe included) */
} npyload_rget_result;
/*! npyload_rget_row() : one point as a table row "conc threads inflight
 * req/s MB/s p50 p99" (npyload_rget_header() the header), as npyload-bench
 * and bench_remote print them. */
void npyload_rget_row(const npyload_rget_point *p, char *buf, size_t len);
const char *npyload_rget_header(void);
/*! npyload_rget_measure() : probes the n objects (size, ETag), then
 * measures each concurrency of conc[0 .. nconc) (at most
 * NPYLOAD_RGET_MAX_POINTS) with at most tmax threads. `each` (may be NULL)
 * is called after every point (for a table printed as it goes).
 * `cfg` is copied (max_inflight is raised to what the points need).
 * @return : 0, or an error with the message (URL and what happened, never
 * a secret) in err. */
int npyload_rget_measure(const npyload_remote *cfg, const char *const *urls, size_t n,
                         size_t bytes, double seconds, const int *conc, int nconc, int tmax,
                         void (*each)(const npyload_rget_point *p, void *arg), void *arg,
                         npyload_rget_result *out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* NPYLOAD_SUPPORT_H */
