/* Control block of the fake CUDA driver API (tests/gpu/fake_cuda_driver.c):
 * call counters, failure switches and what the last launch received. A test
 * dlopens the fake by path and looks up fake_cuda_driver_control with
 * dlsym. */
#ifndef NPYLOAD_FAKE_CUDA_DRIVER_H
#define NPYLOAD_FAKE_CUDA_DRIVER_H

#include <pthread.h>
#include <stdatomic.h>

/* What cuModuleLoadData was given. */
enum { FAKE_IMAGE_OTHER = 0, FAKE_IMAGE_FATBIN = 1, FAKE_IMAGE_PTX = 2, FAKE_IMAGE_CUBIN = 3 };

/* The CUresults the fake returns. */
#define FAKE_CU_INVALID_VALUE 1
#define FAKE_CU_INVALID_IMAGE 200
#define FAKE_CU_NOT_FOUND 500
#define FAKE_CU_NO_BINARY_FOR_GPU 209
#define FAKE_CU_LAUNCH_FAILED 719

typedef struct fake_cuda_driver {
    /* counters */
    atomic_int n_module_load, n_module_unload, n_get_function, n_launch;
    /* switches: nonzero makes the call fail (INVALID_IMAGE, NOT_FOUND,
     * LAUNCH_FAILED) */
    atomic_int fail_module_load, fail_get_function, fail_launch;
    /* nonzero: cuModuleLoadData refuses a fatbin with NO_BINARY_FOR_GPU (a
     * GPU the fatbin does not cover); other images load */
    atomic_int fatbin_no_binary;
    /* nonzero: a transform kernel's launch runs it on the CPU
     * (kernels_cpu.cpp), queued on the fake runtime's stream; n_ran counts
     * the kernels that ran */
    atomic_int run_kernels, n_ran;
    /* the compute capability cuDeviceGetAttribute reports (0: 8.0) */
    atomic_int cc_major, cc_minor;
    /* the last module image and launch, under mu */
    pthread_mutex_t mu;
    int last_image;            /* FAKE_IMAGE_* */
    char last_kernel[64];      /* the name the function was looked up by */
    unsigned last_grid[3], last_block[3];
    void *last_stream;
    /* the kernel's parameter, copied: npyl_tk_params for npyl_tk_* kernels,
     * a uint64_t (nanoseconds) for npyload_busy */
    unsigned char last_params[2048];
} fake_cuda_driver;

typedef fake_cuda_driver *(*fake_cuda_driver_control_fn)(void);
fake_cuda_driver *fake_cuda_driver_control(void);
/* 1 when the fake was built with the kernels on the CPU (a C++ compiler). */
typedef int (*fake_cuda_driver_cpu_kernels_fn)(void);
int fake_cuda_driver_cpu_kernels(void);

#endif
