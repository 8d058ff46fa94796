/* npyload_get_build_info() printed for people (the library's
 * npyload_build_info_text, which `python -m npyload info` prints too) and
 * for JSON. */
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
    char text[4096];
    npyload_build_info_text(bi, text, sizeof text);
    fputs(text, f);
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
              "\n    \"default_io_backend\": %s,\n    \"default_read_ahead\": %c,",
              (long long)bi->default_num_workers, (long long)bi->default_prefetch,
              (long long)bi->default_queue_depth, (long long)bi->default_shuffle_window,
              npyload_backend_name((npyload_io_backend)bi->default_io_backend),
              bi->default_read_ahead);
    char nv[16];
    cuda_version(nv, sizeof nv, bi->nvrtc_version);
    nj_printf(f,
              "\n    \"transform_nvrtc\": %c,\n    \"nvrtc_found\": %c,"
              "\n    \"nvrtc_version\": %s,\n    \"nvrtc_path\": %s,"
              "\n    \"nvrtc_why\": %s,",
              bi->transform_nvrtc, bi->nvrtc_found, nv, bi->nvrtc_path, bi->nvrtc_why);
    nj_printf(f, "\n    \"remote_compiled\": %c,\n    \"remote_version\": %s\n  }",
              bi->remote_compiled, bi->remote_version);
}
