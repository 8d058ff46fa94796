/* npyload_get_build_info(): the build's and the machine's facts for a bug
 * report, asked of the module that owns each one: lib/io (io_uring built
 * in, and usable now), lib/cuda (the runtime the search finds, the device
 * kernels embedded), lib/transform (the F16C path), the loader's own
 * defaults (npyload_loader_internal.h, npyload_default_prefetch, the AUTO
 * backend as start resolves it). It lives in lib/info, the one module
 * that may use every other one, the loader included (ARCHITECTURE.md).
 *
 * zstd's two versions are read here, with <zstd.h>, rather than through
 * lib/zst: ZSTD_VERSION_STRING is what this file was compiled against, the
 * same header lib/zst is compiled against (both come from the one
 * pkg_check_modules of the top CMakeLists.txt), and ZSTD_versionString()
 * answers from the libzstd the process runs.
 *
 * Nothing is kept between calls. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <zstd.h>

#include "../cuda/npyload_cuda_nvrtc.h"
#include "../loader/npyload_loader_internal.h"

int npyload_get_build_info(npyload_build_info *dst, size_t size)
{
    if (!dst)
        return NPYLOAD_EINVAL;
    /* The first published layout is the whole struct as it is now; check
     * the size before doing any of the (slow) probes. */
    const size_t min = NPYL_SIZE_THROUGH(npyload_build_info, nvrtc_why);
    if (size < min)
        return NPYLOAD_EINVAL;

    npyload_build_info bi;
    memset(&bi, 0, sizeof bi);
    snprintf(bi.version, sizeof bi.version, "%s", npyload_version_string());

    bi.uring_compiled = npyl_io_uring_built(bi.liburing_version, sizeof bi.liburing_version);
    /* The probe start runs for AUTO: usable exactly when AUTO picks io_uring. */
    bi.default_io_backend = npyl_stores_auto_backend(bi.uring_why, sizeof bi.uring_why);
    bi.uring_usable = bi.default_io_backend == NPYLOAD_IO_URING;
    if (bi.uring_usable)
        bi.uring_why[0] = '\0';

    snprintf(bi.zstd_compiled, sizeof bi.zstd_compiled, "%s", ZSTD_VERSION_STRING);
    snprintf(bi.zstd_loaded, sizeof bi.zstd_loaded, "%s", ZSTD_versionString());

    npyl_cuda_facts cf;
    npyl_cuda_probe_facts(&cf);
    bi.cuda_runtime_found = cf.found;
    bi.cuda_devices = cf.devices;
    bi.cuda_runtime_version = cf.runtime_version;
    bi.cuda_driver_version = cf.driver_version;
    snprintf(bi.cuda_runtime_soname, sizeof bi.cuda_runtime_soname, "%s", cf.soname);
    snprintf(bi.cuda_runtime_path, sizeof bi.cuda_runtime_path, "%s", cf.path);
    snprintf(bi.cuda_why, sizeof bi.cuda_why, "%s", cf.why);

    bi.transform_kernels = npyl_tdev_aot_built(bi.transform_kernels_why,
                                               sizeof bi.transform_kernels_why);
    if (bi.transform_kernels)
        bi.transform_kernels_why[0] = '\0';
    snprintf(bi.transform_kernel_archs, sizeof bi.transform_kernel_archs, "%s",
             npyl_tdev_archs());

    /* NVRTC as start would find it without an override, next to the
     * runtime the search above found. */
    bi.transform_nvrtc = npyl_nvrtc_source_built(NULL, 0);
    if (bi.transform_nvrtc) {
        npyl_nvrtc_places places;
        npyl_nvrtc *nv = NULL;
        if (npyl_nvrtc_open(&nv, npyl_nvrtc_default_where(&places, NULL, cf.path),
                            bi.nvrtc_why, sizeof bi.nvrtc_why) == 0) {
            bi.nvrtc_found = 1;
            bi.nvrtc_version = npyl_nvrtc_version(nv);
            snprintf(bi.nvrtc_path, sizeof bi.nvrtc_path, "%s", npyl_nvrtc_path(nv));
            bi.nvrtc_why[0] = '\0';
            npyl_nvrtc_close(nv);
        }
    } else {
        npyl_nvrtc_source_built(bi.transform_kernels_why, sizeof bi.transform_kernels_why);
    }

    bi.f16c_used = npyl_transform_f16c(&bi.f16c_compiled);
    bi.remote_compiled = npyl_remote_built(bi.remote_version, sizeof bi.remote_version);

    bi.default_num_workers = DEFAULT_WORKERS;
    bi.default_prefetch = npyload_default_prefetch(0);
    bi.default_queue_depth = DEFAULT_QUEUE_DEPTH;
    bi.default_shuffle_window = DEFAULT_WINDOW;
    bi.default_read_ahead = 1; /* READ_AHEAD 0 is on where a batch has work
                                  after its reads (start.c, read_ahead()) */

    return npyl_sized_out(dst, size, &bi, sizeof bi, min);
}

/* Appends to buf[len] at *at (the length counts on past a full buffer, as
 * snprintf's return does). */
static void put(char *buf, size_t len, size_t *at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*at < len ? buf + *at : NULL, *at < len ? len - *at : 0, fmt, ap);
    va_end(ap);
    if (n > 0)
        *at += (size_t)n;
}

/* "12.4" from CUDA's 12040; "?" for 0. */
static void cuda_version(char *v, size_t len, int n)
{
    if (n > 0)
        snprintf(v, len, "%d.%d", n / 1000, (n % 1000) / 10);
    else
        snprintf(v, len, "?");
}

size_t npyload_build_info_text(const npyload_build_info *bi, char *buf, size_t len)
{
    size_t at = 0;
    if (buf && len)
        buf[0] = '\0';
    if (!bi)
        return 0;
    if (!buf)
        len = 0;
    char rv[16], dv[16];
    cuda_version(rv, sizeof rv, bi->cuda_runtime_version);
    cuda_version(dv, sizeof dv, bi->cuda_driver_version);
    put(buf, len, &at, "npyload %s\n", bi->version);
    if (!bi->uring_compiled)
        put(buf, len, &at, "io_uring:          not compiled in (built without liburing): "
            "reads use pread\n");
    else if (bi->uring_usable)
        put(buf, len, &at, "io_uring:          compiled in (liburing %s), usable here\n",
            bi->liburing_version);
    else
        put(buf, len, &at, "io_uring:          compiled in (liburing %s), NOT usable here: "
            "%s\n", bi->liburing_version, bi->uring_why);
    put(buf, len, &at, "zstd:              %s loaded, built against %s%s\n", bi->zstd_loaded,
        bi->zstd_compiled, strcmp(bi->zstd_loaded, bi->zstd_compiled) ? " (they differ)" : "");
    if (bi->cuda_runtime_found)
        put(buf, len, &at, "CUDA runtime:      %s (CUDA %s)\n", bi->cuda_runtime_path, rv);
    else
        put(buf, len, &at, "CUDA runtime:      not found\n");
    if (bi->cuda_devices)
        put(buf, len, &at, "CUDA devices:      %d (driver %s)\n", bi->cuda_devices, dv);
    else
        put(buf, len, &at, "CUDA devices:      none: %s\n", bi->cuda_why);
    char nv[16];
    cuda_version(nv, sizeof nv, bi->nvrtc_version);
    if (bi->transform_kernels && bi->transform_nvrtc && bi->nvrtc_found)
        put(buf, len, &at, "device transforms: ahead of time (embedded fatbin: %s); other "
            "GPUs: NVRTC %s at run time (%s)\n", bi->transform_kernel_archs, nv,
            bi->nvrtc_path);
    else if (bi->transform_kernels && bi->transform_nvrtc)
        put(buf, len, &at, "device transforms: ahead of time (embedded fatbin: %s); other "
            "GPUs: NVRTC not found (pip install nvidia-cuda-nvrtc)\n",
            bi->transform_kernel_archs);
    else if (bi->transform_kernels)
        put(buf, len, &at, "device transforms: ahead of time (embedded fatbin: %s)\n",
            bi->transform_kernel_archs);
    else if (bi->transform_nvrtc && bi->nvrtc_found)
        put(buf, len, &at, "device transforms: NVRTC %s at run time (%s); no ahead-of-time "
            "kernels: %s\n", nv, bi->nvrtc_path, bi->transform_kernels_why);
    else if (bi->transform_nvrtc)
        put(buf, len, &at, "device transforms: unavailable: %s, and %s\n",
            bi->transform_kernels_why, bi->nvrtc_why);
    else
        put(buf, len, &at, "device transforms: unavailable: %s\n", bi->transform_kernels_why);
    put(buf, len, &at, "remote shards:     %s%s\n",
        bi->remote_compiled ? "s3:// and https:// with " : "", bi->remote_version);
    if (!bi->f16c_compiled)
        put(buf, len, &at, "CPU features:      F16C not compiled in (portable float16 "
            "conversion)\n");
    else
        put(buf, len, &at, "CPU features:      F16C compiled in, %s\n",
            bi->f16c_used ? "used (this CPU has it)" : "not used (this CPU lacks F16C/AVX)");
    put(buf, len, &at,
        "defaults:          num_workers %lld, prefetch %lld (C: PREFETCH %lld slots), queue "
        "depth %lld per worker, io auto -> %s here, read-ahead %s, shuffle window %lld "
        "files\n",
        (long long)bi->default_num_workers, (long long)bi->default_prefetch - 1,
        (long long)bi->default_prefetch, (long long)bi->default_queue_depth,
        npyload_backend_name((npyload_io_backend)bi->default_io_backend),
        bi->default_read_ahead ? "on" : "off", (long long)bi->default_shuffle_window);
    return at;
}
