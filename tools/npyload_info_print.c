/* npyload_get_build_info() printed for people and for JSON. The text says
 * the same as python_bindings/npyload/_info.py's format_info (which adds
 * the Python, numpy and torch lines); keep the two in step. */
#include "npyload_info_print.h"

#include <string.h>

#include "npyload_json.h"

static void cuda_version(char *buf, size_t len, int v)
{
    if (v <= 0)
        snprintf(buf, len, "%s", "");
    else
        snprintf(buf, len, "%d.%d", v / 1000, (v % 1000) / 10);
}

int ni_build_info(FILE *f, npyload_build_info *bi)
{
    int rc = npyload_get_build_info(bi, sizeof *bi);
    if (rc != 0) {
        memset(bi, 0, sizeof *bi);
        if (f)
            fprintf(f, "npyload %s (build info unavailable: %s)\n", npyload_version_string(),
                    npyload_strerror(rc));
        return rc;
    }
    if (!f)
        return 0;
    char rv[16], dv[16];
    cuda_version(rv, sizeof rv, bi->cuda_runtime_version);
    cuda_version(dv, sizeof dv, bi->cuda_driver_version);
    fprintf(f, "npyload %s\n", bi->version);
    if (!bi->uring_compiled)
        fprintf(f, "io_uring:          not compiled in (built without liburing): reads use "
                   "pread\n");
    else if (bi->uring_usable)
        fprintf(f, "io_uring:          compiled in (liburing %s), usable here\n",
                bi->liburing_version);
    else
        fprintf(f, "io_uring:          compiled in (liburing %s), NOT usable here: %s\n",
                bi->liburing_version, bi->uring_why);
    fprintf(f, "zstd:              %s loaded, built against %s%s\n", bi->zstd_loaded,
            bi->zstd_compiled,
            strcmp(bi->zstd_loaded, bi->zstd_compiled) ? " (they differ)" : "");
    if (bi->cuda_runtime_found)
        fprintf(f, "CUDA runtime:      %s (CUDA %s)\n", bi->cuda_runtime_path, rv[0] ? rv : "?");
    else
        fprintf(f, "CUDA runtime:      not found\n");
    if (bi->cuda_devices)
        fprintf(f, "CUDA devices:      %d (driver %s)\n", bi->cuda_devices, dv[0] ? dv : "?");
    else
        fprintf(f, "CUDA devices:      none: %s\n", bi->cuda_why);
    if (bi->transform_kernels)
        fprintf(f, "device transforms: ahead of time (embedded fatbin: %s)\n",
                bi->transform_kernel_archs);
    else
        fprintf(f, "device transforms: unavailable: %s\n", bi->transform_kernels_why);
    if (!bi->f16c_compiled)
        fprintf(f, "CPU features:      F16C not compiled in (portable float16 conversion)\n");
    else
        fprintf(f, "CPU features:      F16C compiled in, %s\n",
                bi->f16c_used ? "used (this CPU has it)" : "not used (this CPU lacks F16C/AVX)");
    fprintf(f,
            "defaults:          num_workers %lld, prefetch %lld (C: PREFETCH %lld slots), "
            "queue depth %lld per worker, io auto -> %s here, read-ahead %s, shuffle window "
            "%lld files\n",
            (long long)bi->default_num_workers, (long long)bi->default_prefetch - 1,
            (long long)bi->default_prefetch, (long long)bi->default_queue_depth,
            npyload_backend_name((npyload_io_backend)bi->default_io_backend),
            bi->default_read_ahead ? "on" : "off", (long long)bi->default_shuffle_window);
    return 0;
}

void ni_build_info_json(FILE *f, const npyload_build_info *bi)
{
    char rv[16], dv[16];
    cuda_version(rv, sizeof rv, bi->cuda_runtime_version);
    cuda_version(dv, sizeof dv, bi->cuda_driver_version);
    nj_printf(f,
              ",\n  \"build_info\": {\n    \"version\": %s,\n    \"uring_compiled\": %c,"
              "\n    \"uring_usable\": %c,\n    \"liburing_version\": %s,\n    \"uring_why\": %s,"
              "\n    \"zstd_compiled\": %s,\n    \"zstd_loaded\": %s,",
              bi->version, bi->uring_compiled, bi->uring_usable, bi->liburing_version,
              bi->uring_why, bi->zstd_compiled, bi->zstd_loaded);
    nj_printf(f,
              "\n    \"cuda_runtime_found\": %c,\n    \"cuda_devices\": %d,"
              "\n    \"cuda_runtime_version\": %s,\n    \"cuda_driver_version\": %s,"
              "\n    \"cuda_runtime_soname\": %s,\n    \"cuda_runtime_path\": %s,"
              "\n    \"cuda_why\": %s,",
              bi->cuda_runtime_found, bi->cuda_devices, rv, dv, bi->cuda_runtime_soname,
              bi->cuda_runtime_path, bi->cuda_why);
    nj_printf(f,
              "\n    \"transform_kernels\": %c,\n    \"transform_kernel_archs\": %s,"
              "\n    \"transform_kernels_why\": %s,\n    \"f16c_compiled\": %c,"
              "\n    \"f16c_used\": %c,",
              bi->transform_kernels, bi->transform_kernel_archs, bi->transform_kernels_why,
              bi->f16c_compiled, bi->f16c_used);
    nj_printf(f,
              "\n    \"default_num_workers\": %lld,\n    \"default_prefetch\": %lld,"
              "\n    \"default_queue_depth\": %lld,\n    \"default_shuffle_window\": %lld,"
              "\n    \"default_io_backend\": %s,\n    \"default_read_ahead\": %c\n  }",
              (long long)bi->default_num_workers, (long long)bi->default_prefetch,
              (long long)bi->default_queue_depth, (long long)bi->default_shuffle_window,
              npyload_backend_name((npyload_io_backend)bi->default_io_backend),
              bi->default_read_ahead);
}
