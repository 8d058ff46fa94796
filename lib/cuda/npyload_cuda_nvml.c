/* NVML, loaded at run time, for the bench's GPU monitoring (experimental
 * API, npyload.h, NPYLOAD_EXPERIMENTAL). lib/cuda is where the library
 * loads libraries: NVML is loaded here, once per npyload_nvml. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "npyload_cuda.h"

typedef struct { unsigned gpu, memory; } nvml_util;
typedef struct { unsigned long long total, free, used; } nvml_mem;

struct npyload_nvml {
    void *lib;
    void *dev;
    int (*util)(void *, nvml_util *);
    int (*power)(void *, unsigned *);
    int (*mem)(void *, nvml_mem *);
};

int npyload_nvml_open(int device, npyload_nvml **out, char *why, size_t whylen)
{
    *out = NULL;
    npyload_nvml *n = calloc(1, sizeof *n);
    if (!n) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    n->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) {
        snprintf(why, whylen, "libnvidia-ml.so.1 not found");
        free(n);
        return -1;
    }
    int (*init)(void) = (int (*)(void))dlsym(n->lib, "nvmlInit_v2");
    int (*handle)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(n->lib, "nvmlDeviceGetHandleByIndex_v2");
    n->util = (int (*)(void *, nvml_util *))dlsym(n->lib, "nvmlDeviceGetUtilizationRates");
    n->power = (int (*)(void *, unsigned *))dlsym(n->lib, "nvmlDeviceGetPowerUsage");
    n->mem = (int (*)(void *, nvml_mem *))dlsym(n->lib, "nvmlDeviceGetMemoryInfo");
    if (!init || !handle || !n->util) {
        snprintf(why, whylen, "libnvidia-ml.so.1 lacks the expected symbols");
        npyload_nvml_close(n);
        return -1;
    }
    if (init() != 0 || handle((unsigned)device, &n->dev) != 0) {
        snprintf(why, whylen, "nvmlInit or device %d lookup failed", device);
        npyload_nvml_close(n);
        return -1;
    }
    *out = n;
    return 0;
}

int npyload_nvml_sample(const npyload_nvml *n, npyload_nvml_sample_t *s)
{
    nvml_util u;
    unsigned mw = 0;
    nvml_mem mem;
    if (!n || n->util(n->dev, &u) != 0)
        return -1;
    s->util_pct = u.gpu;
    s->power_w = n->power && n->power(n->dev, &mw) == 0 ? mw / 1000.0 : 0;
    s->mem_used_mib = n->mem && n->mem(n->dev, &mem) == 0 ? mem.used / 1048576.0 : -1;
    return 0;
}

void npyload_nvml_close(npyload_nvml *n)
{
    if (!n)
        return;
    /* NVML stays loaded (and initialised) for the process, as before. */
    free(n);
}
