/* lib/loader's workers: a worker's whole life — init (its reading state,
 * transform buffer and copy stream), the thread's main loop, filling one
 * batch (claim, read, transform or copy, publish), the synchronous step
 * next() runs itself in sync mode, stop and fini. A worker sees the loader
 * through npyl_work_env: the slots to ask, the read view, the device, the
 * counters; never the loader itself. */
#ifndef NPYLOAD_LOADER_WORKER_H
#define NPYLOAD_LOADER_WORKER_H

#include <pthread.h>

#include "npyload_loader_device.h"
#include "npyload_loader_types.h"
#include "npyload_loader_read.h"
#include "npyload_loader_slots.h"

/* What the workers share, filled at start (a part of the loader). */
typedef struct npyl_work_env {
    npyl_ring *ring;
    const npyl_read_view *rv;   /* rv->fields / nfields: the slot layout too */
    const npyl_device *dev;
    npyl_stats *st;
    /* Read-ahead on (1) or off (0) now, for workers made with it: the
     * controller's switch (NPYLOAD_AUTO), read between batches. Off, a
     * worker claims no second batch and reads each batch itself (its
     * second context and thread stay, idle). */
    const _Atomic int *ahead_on;
} npyl_work_env;

typedef struct npyl_worker {
    const npyl_work_env *env;
    size_t index;         /* its place in the workers array: it claims
                             only while index < the ring's workers_on */
    pthread_t thread;
    int started;
    npyl_read_ctx rd;     /* io context, requests, .npy.zst scratch, errmsg */
    uint8_t **dst[2];     /* nfields each: where each field's rows land, for
                             the batch being finished and the one read
                             ahead (used in turn) */
    uint8_t *raw[2];      /* host mode with transforms: one batch of the
                             transformed fields' stored rows (raw_bytes)
                             each; raw[1] only with read-ahead */
    unsigned k;           /* the pair (dst, raw) the next batch takes */
    uint8_t *aug;         /* host mode with augmentation: one row (aug_bytes) */
    void *draw;           /* device mode with transforms: the same on the
                             device; reused in stream order */
    void *stream;         /* device mode: this worker's copy stream */
} npyl_worker;

/* What npyl_worker_init sizes. */
typedef struct npyl_worker_cfg {
    npyl_store_cfg io;
    size_t rows;          /* rows a slot holds (at least 1) */
    npyl_zst_sizes zst;
    uint64_t raw_bytes;   /* stored rows of transformed fields, per batch */
    uint64_t aug_bytes;   /* one augmented row of the widest augmented field */
    int host_raw, dev_raw; /* raw_bytes on the host (a field with hxform)
                              and on the device (a field with dxform) */
    int ahead;            /* read-ahead: the next batch's reads in flight
                             while this one decodes (worker threads only) */
} npyl_worker_cfg;

/* Gives w (zeroed) its resources; index names it in messages. Returns 0 or
 * the error with the message in err. w is left for npyl_worker_fini in
 * every case. */
NPYL_HIDDEN int npyl_worker_init(npyl_worker *w, size_t index, const npyl_work_env *env,
                                 const npyl_worker_cfg *cfg, char *err, size_t errlen);
/* Frees w's resources; its thread must be joined. Idempotent. */
NPYL_HIDDEN void npyl_worker_fini(npyl_worker *w);
/* Starts w's thread (w initialised). Returns 0 or the error (message in
 * err). */
NPYL_HIDDEN int npyl_worker_start(npyl_worker *w, char *err, size_t errlen);
/* Starts the threads of ws[0 .. n). Returns 0 or the error (message in err). */
NPYL_HIDDEN int npyl_workers_start(npyl_worker *ws, size_t n, char *err, size_t errlen);
/* Stops (the ring's stopping) and joins the threads of ws[0 .. n), then
 * waits for every copy still reading a staging slot. In-flight reads and
 * copies complete first. */
NPYL_HIDDEN void npyl_workers_stop(npyl_worker *ws, size_t n, const npyl_work_env *env);
/* Sync mode: claims and fills the next batch on the calling thread with w.
 * Returns 1 when a batch was processed, 0 when none can be claimed now. */
NPYL_HIDDEN int npyl_worker_step(npyl_worker *w);

#endif
