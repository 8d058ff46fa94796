/* Kernels for the GPU tests, with C launch wrappers (tests/gpu/test_gpu.c is
 * C; the kernels are compiled by nvcc). Every wrapper returns a cudaError_t
 * as int (0 on success) and only enqueues work on `stream` (a cudaStream_t;
 * NULL is the legacy default stream of the calling thread's device). */
#ifndef NPYLOAD_GPU_KERNELS_H
#define NPYLOAD_GPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* *d_sum = sum of the n bytes at d_data (device memory), each byte taken as
 * an unsigned value. *d_sum (device memory) is zeroed on `stream` first, so
 * the result is complete once the stream reaches the end of this call. */
int gk_checksum(const void *d_data, size_t n, unsigned long long *d_sum,
                void *stream);

/* Occupies `stream` for `us` microseconds of GPU wall time (one block of one
 * warp, spinning on %globaltimer; clock64 bounds the spin should the timer
 * not advance). Stands in for a consumer's compute. */
int gk_busy(unsigned us, void *stream);

/* Host-side reference of gk_checksum. */
static inline unsigned long long gk_checksum_host(const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    unsigned long long s = 0;
    for (size_t i = 0; i < n; i++)
        s += p[i];
    return s;
}

#ifdef __cplusplus
}
#endif
#endif
