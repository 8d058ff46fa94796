// Kernels for tests/gpu/test_gpu.c. Launch wrappers are extern "C".
#include "gpu_kernels.h"

#include <cuda_runtime.h>

namespace {

__global__ void k_checksum(const unsigned char *p, size_t n,
                           unsigned long long *out)
{
    unsigned long long s = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        s += p[i];
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_down_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31u) == 0 && s != 0)
        atomicAdd(out, s);
}

__device__ __forceinline__ unsigned long long global_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void k_busy(unsigned long long ns)
{
    const unsigned long long t0 = global_ns();
    const long long c0 = clock64();
    // Safety bound: 10 cycles per ns is above any GPU clock, so this never
    // ends the spin early, and ends it should %globaltimer be frozen.
    const long long cmax = (long long)(ns * 10ull);
    while (global_ns() - t0 < ns) {
        if (clock64() - c0 > cmax)
            break;
    }
}

int launch_status()
{
    cudaError_t e = cudaGetLastError();
    // cudaErrorNotReady is no error (a query elsewhere may have left it).
    return (e == cudaSuccess || e == cudaErrorNotReady) ? 0 : (int)e;
}

} // namespace

extern "C" int gk_checksum(const void *d_data, size_t n,
                           unsigned long long *d_sum, void *stream)
{
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    cudaError_t e = cudaMemsetAsync(d_sum, 0, sizeof *d_sum, s);
    if (e != cudaSuccess)
        return (int)e;
    if (n == 0)
        return 0;
    const unsigned threads = 256;
    size_t blocks = (n + threads - 1) / threads;
    if (blocks > 1024)
        blocks = 1024;
    k_checksum<<<(unsigned)blocks, threads, 0, s>>>(
        static_cast<const unsigned char *>(d_data), n, d_sum);
    return launch_status();
}

extern "C" int gk_busy(unsigned us, void *stream)
{
    k_busy<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(
        (unsigned long long)us * 1000ull);
    return launch_status();
}
