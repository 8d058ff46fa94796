/* npyload-bench, the GPU: the only file that calls tools/support's CUDA
 * helpers (npyload_cuda_h2d_bandwidth, npyload_compute_sim_*). */
#include "npyload_bench_measure.h"

#include <stdio.h>
#include <stdlib.h>

void nb_ceiling_h2d(const nb_config *cfg, nb_ceiling *out)
{
    snprintf(out->name, sizeof out->name, "h2d_pinned");
    size_t bytes = cfg->batch_bytes < (256u << 20) ? (size_t)cfg->batch_bytes : 256u << 20;
    int rc = npyload_cuda_h2d_bandwidth(cfg->device, bytes, 20, &out->gbps);
    if (rc != 0) {
        snprintf(out->note, sizeof out->note, "failed: %s", npyload_strerror(rc));
        return;
    }
    out->measured = 1;
    out->threads = 1;
    out->bytes = (uint64_t)bytes * 20;
    out->seconds = out->gbps > 0 ? (double)out->bytes / (out->gbps * 1e9) : 0;
    snprintf(out->note, sizeof out->note,
             "pinned cudaMemcpyAsync, %zu bytes per copy, 20 copies", bytes);
}

struct nb_gpu_step {
    npyload_compute_sim *sim;
    void *stream;
};

nb_gpu_step *nb_gpu_step_create(int device, char *why, size_t whylen)
{
    nb_gpu_step *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    if (npyload_compute_sim_create(device, &s->sim, why, whylen) != 0) {
        free(s);
        return NULL;
    }
    s->stream = npyload_compute_sim_stream(s->sim);
    return s;
}

void nb_gpu_step_run(nb_gpu_step *s, npyload_batch *b, uint64_t ns)
{
    npyload_batch_wait_stream(b, s->stream);
    npyload_compute_sim_busy(s->sim, ns);
    npyload_batch_release_stream(b, s->stream);
}

void nb_gpu_step_sync(nb_gpu_step *s)
{
    npyload_compute_sim_sync(s->sim);
}

void nb_gpu_step_destroy(nb_gpu_step *s)
{
    if (!s)
        return;
    npyload_compute_sim_destroy(s->sim);
    free(s);
}
