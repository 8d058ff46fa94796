/* npyload_cuda_h2d_bandwidth: pinned host-to-device bandwidth, the
 * ceiling npyload-bench, the GPU tests and users (npyload.h2d_ceiling)
 * compare the loader's device path with, measured through lib/cuda's
 * runtime table. */
#include <pthread.h>
#include <string.h>

#include "npyload_cuda.h"

struct bw_job {
    int device;
    size_t bytes;
    int iters;
    double gbps;
    int rc;
};

static int measure_h2d(int device, size_t bytes, int iters, double *gbps)
{
    npyl_cuda *c = NULL;
    int rc = npyl_cuda_open(&c, device, NULL, 0);
    if (rc != 0)
        return rc;

    void *host = NULL, *dev = NULL, *s = NULL, *e0 = NULL, *e1 = NULL;
    float ms = 0.0f;
    if ((rc = npyl_cuda_host_alloc(c, &host, bytes)) != 0 ||
        (rc = npyl_cuda_malloc(c, &dev, bytes)) != 0 ||
        (rc = npyl_cuda_stream_create(c, &s)) != 0 ||
        (rc = npyl_cuda_event_create(c, &e0, 1)) != 0 ||
        (rc = npyl_cuda_event_create(c, &e1, 1)) != 0)
        goto out;
    /* Touch the pages, then one untimed copy: the first copy pays for lazy
     * context and DMA-mapping setup. */
    memset(host, 0xA5, bytes);
    if ((rc = npyl_cuda_memcpy_h2d_async(c, dev, host, bytes, s)) != 0 ||
        (rc = npyl_cuda_stream_sync(c, s)) != 0 ||
        (rc = npyl_cuda_event_record(c, e0, s)) != 0)
        goto out;
    for (int i = 0; i < iters; i++)
        if ((rc = npyl_cuda_memcpy_h2d_async(c, dev, host, bytes, s)) != 0)
            goto out;
    if ((rc = npyl_cuda_event_record(c, e1, s)) != 0 ||
        (rc = npyl_cuda_event_sync(c, e1)) != 0 ||
        (rc = npyl_cuda_event_elapsed_ms(c, &ms, e0, e1)) != 0)
        goto out;
    if (ms > 0.0f)
        *gbps = (double)bytes * (double)iters / 1e9 / ((double)ms / 1e3);
    else
        rc = NPYLOAD_ECUDA; /* below event resolution: ask for more bytes */
out:
    if (s)
        npyl_cuda_stream_sync(c, s);
    npyl_cuda_event_destroy(c, e1);
    npyl_cuda_event_destroy(c, e0);
    npyl_cuda_stream_destroy(c, s);
    npyl_cuda_free(c, dev);
    npyl_cuda_host_free(c, host);
    npyl_cuda_close(c);
    return rc;
}

static void *bw_thread(void *arg)
{
    struct bw_job *j = arg;
    j->rc = measure_h2d(j->device, j->bytes, j->iters, &j->gbps);
    return NULL;
}

int npyload_cuda_h2d_bandwidth(int device, size_t bytes, int iters,
                                           double *gbps)
{
    if (!gbps || bytes == 0 || iters <= 0)
        return NPYLOAD_EINVAL;
    *gbps = 0.0;
    /* On a thread of its own: the measurement makes `device` current, and
     * the caller's thread keeps its current device (and gets no context on
     * a device it never used). */
    struct bw_job j = {device, bytes, iters, 0.0, 0};
    pthread_t t;
    int e = pthread_create(&t, NULL, bw_thread, &j);
    if (e != 0)
        return -e;
    pthread_join(t, NULL);
    if (j.rc == 0)
        *gbps = j.gbps;
    return j.rc;
}
