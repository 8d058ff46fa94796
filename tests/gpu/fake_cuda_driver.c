/* A fake CUDA driver API for CPU-only tests of lib/cuda's driver table, the
 * device transform engine's host side and the compute simulator. Built as a
 * shared library whose SONAME is libcuda.so.1: a test dlopens it by path
 * first, and lib/cuda's dlopen("libcuda.so.1") then finds it among the
 * loaded objects (the dynamic loader matches an already loaded library by
 * its SONAME) instead of searching for the real one. Criterion forks every
 * test, so the fake never leaks into another test's process.
 *
 * Semantics: modules and functions are host allocations; a launch records
 * the kernel's name, the grid, the block, the stream and a copy of its
 * parameter (fake_cuda_driver.h), and runs nothing unless run_kernels is
 * set: then a transform kernel (npyl_tk*) runs on the CPU (kernels_cpu.cpp:
 * the .cu compiled for the host), queued on the fake runtime's stream in
 * order with its copies, so the loader's device path delivers real output
 * on a machine without a GPU. Failures are injected through the struct
 * returned by fake_cuda_driver_control().
 *
 * Test scaffolding: process-wide state is fine here, not in lib/. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../lib/cuda/npyload_cuda_transform_kparams.h"
#include "fake_cuda_driver.h"
#include "fake_cudart.h"
#include "kernels_cpu.h"

#ifdef FAKE_NO_CPU_KERNELS /* built without a C++ compiler */
npyl_kcpu_fn npyl_kcpu_find(const char *name)
{
    (void)name;
    return NULL;
}
void npyl_kcpu_launch(npyl_kcpu_fn fn, const unsigned grid[3], const unsigned block[3],
                      const void *params)
{
    (void)fn, (void)grid, (void)block, (void)params;
}
#endif

/* 1 when this fake can run the transform kernels on the CPU. */
int fake_cuda_driver_cpu_kernels(void) { return npyl_kcpu_find("npyl_tk_u1_f4") != NULL; }

_Static_assert(sizeof(npyl_tk_params) <= sizeof(((fake_cuda_driver *)0)->last_params),
               "the fake keeps a whole kernel parameter");

static fake_cuda_driver g_drv = {.mu = PTHREAD_MUTEX_INITIALIZER};

fake_cuda_driver *fake_cuda_driver_control(void) { return &g_drv; }

/* FAKE_CUDA_RUN_KERNELS=1 (test scaffolding may read the environment):
 * run_kernels from the start, for a program that does not know the fake,
 * such as tests/gpu/test_gpu_transform with both fakes in LD_PRELOAD. */
__attribute__((constructor)) static void run_kernels_from_env(void)
{
    const char *e = getenv("FAKE_CUDA_RUN_KERNELS");
    if (e && e[0] == '1')
        atomic_store(&g_drv.run_kernels, 1);
}

#define COUNT(name) atomic_fetch_add(&g_drv.name, 1)

typedef struct fake_function {
    struct fake_function *next;
    char name[64];
    npyl_kcpu_fn cpu;     /* the kernel on the CPU (a transform kernel) */
} fake_function;

typedef struct fake_module {
    fake_function *functions;
} fake_module;

static int image_kind(const void *image)
{
    static const unsigned char fatbin_magic[4] = {0x50, 0xed, 0x55, 0xba};
    if (!image)
        return FAKE_IMAGE_OTHER;
    if (memcmp(image, fatbin_magic, sizeof fatbin_magic) == 0)
        return FAKE_IMAGE_FATBIN;
    if (memcmp(image, "\177ELF", 4) == 0)
        return FAKE_IMAGE_CUBIN;
    /* nvcc's and NVRTC's PTX: comments, then .version */
    if (strncmp(image, ".version", 8) == 0 ||
        (strncmp(image, "//", 2) == 0 && strstr(image, "\n.version")))
        return FAKE_IMAGE_PTX;
    return FAKE_IMAGE_OTHER;
}

int cuModuleLoadData(void **module, const void *image)
{
    COUNT(n_module_load);
    pthread_mutex_lock(&g_drv.mu);
    g_drv.last_image = image_kind(image);
    pthread_mutex_unlock(&g_drv.mu);
    if (atomic_load(&g_drv.fail_module_load))
        return FAKE_CU_INVALID_IMAGE;
    if (atomic_load(&g_drv.fatbin_no_binary) && image_kind(image) == FAKE_IMAGE_FATBIN)
        return FAKE_CU_NO_BINARY_FOR_GPU;
    fake_module *m = calloc(1, sizeof *m);
    if (!m)
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    *module = m;
    return 0;
}

int cuModuleUnload(void *module)
{
    COUNT(n_module_unload);
    fake_module *m = module;
    if (!m)
        return FAKE_CU_INVALID_VALUE;
    while (m->functions) {
        fake_function *f = m->functions;
        m->functions = f->next;
        free(f);
    }
    free(m);
    return 0;
}

int cuModuleGetFunction(void **function, void *module, const char *name)
{
    COUNT(n_get_function);
    fake_module *m = module;
    if (!m || !name || strlen(name) >= sizeof(((fake_function *)0)->name))
        return FAKE_CU_INVALID_VALUE;
    if (atomic_load(&g_drv.fail_get_function))
        return FAKE_CU_NOT_FOUND;
    fake_function *f = calloc(1, sizeof *f);
    if (!f)
        return 2;
    strcpy(f->name, name);
    f->cpu = npyl_kcpu_find(name);
    f->next = m->functions;
    m->functions = f;
    *function = f;
    return 0;
}

/* A launch to run on the CPU when the fake runtime reaches it. */
typedef struct cpu_job {
    npyl_kcpu_fn fn;
    unsigned grid[3], block[3];
    npyl_tk_params params; /* copied at launch, as the driver does */
} cpu_job;

static void run_job(void *arg)
{
    cpu_job *j = arg;
    npyl_kcpu_launch(j->fn, j->grid, j->block, &j->params);
    atomic_fetch_add(&g_drv.n_ran, 1);
    free(j);
}

static int run_on_stream(const fake_function *f, unsigned gx, unsigned gy, unsigned gz,
                         unsigned bx, unsigned by, unsigned bz, void *stream,
                         const void *params)
{
    /* The fake runtime this process loaded (by its SONAME), for its queue. */
    void *rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
    fake_cudart_enqueue_host_fn enq =
        rt ? (fake_cudart_enqueue_host_fn)dlsym(rt, "fake_cudart_enqueue_host") : NULL;
    if (rt)
        dlclose(rt);
    cpu_job *j = enq ? calloc(1, sizeof *j) : NULL;
    if (!j)
        return FAKE_CU_INVALID_VALUE; /* run_kernels needs the fake runtime */
    *j = (cpu_job){.fn = f->cpu, .grid = {gx, gy, gz}, .block = {bx, by, bz}};
    memcpy(&j->params, params, sizeof j->params);
    if (enq(stream, run_job, j) != 0) {
        free(j);
        return FAKE_CU_INVALID_VALUE;
    }
    return 0;
}

int cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz,
                   unsigned bx, unsigned by, unsigned bz, unsigned shared,
                   void *stream, void **params, void **extra)
{
    (void)shared;
    (void)extra;
    COUNT(n_launch);
    fake_function *f = function;
    if (!f || !params || !params[0])
        return FAKE_CU_INVALID_VALUE;
    if (atomic_load(&g_drv.fail_launch))
        return FAKE_CU_LAUNCH_FAILED;
    size_t n = strncmp(f->name, "npyl_tk", 7) == 0 ? sizeof(npyl_tk_params)
                                                   : sizeof(uint64_t);
    pthread_mutex_lock(&g_drv.mu);
    strcpy(g_drv.last_kernel, f->name);
    g_drv.last_grid[0] = gx;
    g_drv.last_grid[1] = gy;
    g_drv.last_grid[2] = gz;
    g_drv.last_block[0] = bx;
    g_drv.last_block[1] = by;
    g_drv.last_block[2] = bz;
    g_drv.last_stream = stream;
    memcpy(g_drv.last_params, params[0], n);
    pthread_mutex_unlock(&g_drv.mu);
    if (atomic_load(&g_drv.run_kernels) && f->cpu)
        return run_on_stream(f, gx, gy, gz, bx, by, bz, stream, params[0]);
    return 0;
}

int cuCtxGetDevice(int *device)
{
    *device = 0;
    return 0;
}

int cuDeviceGetAttribute(int *value, int attribute, int device)
{
    if (device != 0)
        return FAKE_CU_INVALID_VALUE;
    int major = atomic_load(&g_drv.cc_major), minor = atomic_load(&g_drv.cc_minor);
    if (!major)
        major = 8, minor = 0;
    if (attribute == 75) /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
        *value = major;
    else if (attribute == 76)
        *value = minor;
    else
        return FAKE_CU_INVALID_VALUE;
    return 0;
}

int cuGetErrorString(int result, const char **str)
{
    switch (result) {
    case FAKE_CU_NO_BINARY_FOR_GPU:
        *str = "fake driver: no kernel image is available for execution on the device";
        return 0;
    case FAKE_CU_INVALID_VALUE:
        *str = "fake driver: invalid argument";
        return 0;
    case FAKE_CU_INVALID_IMAGE:
        *str = "fake driver: injected invalid image";
        return 0;
    case FAKE_CU_NOT_FOUND:
        *str = "fake driver: injected named symbol not found";
        return 0;
    case FAKE_CU_LAUNCH_FAILED:
        *str = "fake driver: injected launch failure";
        return 0;
    default:
        *str = NULL;
        return FAKE_CU_INVALID_VALUE;
    }
}
