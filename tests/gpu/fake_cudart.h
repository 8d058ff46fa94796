/* Control block of the fake CUDA runtime (tests/gpu/fake_cudart.c): call
 * counters and failure switches. A test dlopens the fake by path and looks
 * up fake_cudart_control with dlsym. */
#ifndef NPYLOAD_FAKE_CUDART_H
#define NPYLOAD_FAKE_CUDART_H

#include <stdatomic.h>

typedef struct fake_cudart {
    /* counters */
    atomic_int n_stream_sync, n_event_sync, n_event_record, n_event_query,
        n_memcpy_async, n_stream_wait_event, n_set_device, n_get_device;
    /* cudaStreamSynchronize calls on the stream `watch` (set by the test) */
    void *_Atomic watch;
    atomic_int n_watch_sync;
    /* switches: nonzero makes the call fail with cudaErrorUnknown (999),
     * or cudaEventQuery answer cudaErrorNotReady */
    atomic_int fail_get_device, fail_set_device, fail_stream_sync,
        fail_event_record, query_not_ready;
    /* nonzero: run every copy and record at once instead of queueing */
    atomic_int immediate;
} fake_cudart;

typedef fake_cudart *(*fake_cudart_control_fn)(void);
/* Queues fn(arg) on stream s in order with its copies, records and waits
 * (the fake driver's kernels on the CPU). */
typedef int (*fake_cudart_enqueue_host_fn)(void *s, void (*fn)(void *), void *arg);
fake_cudart *fake_cudart_control(void);

#endif
