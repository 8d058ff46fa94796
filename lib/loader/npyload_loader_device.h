/* lib/loader's device side: the staging slot → device slot copy with the
 * device transforms, the events that order it, waiting for a copy, and the
 * ordering of a device slot's release on the caller's stream. It works on
 * slots handed to it (the worker holds h FILLING and d FILLING while it
 * copies; the API holds a released slot) and changes no slot state: the
 * slots file does that.
 *
 * Event rules: a worker queues the copy of its staging slot h on its own
 * stream, records the device slot's ev_done and h's ev_done after it, and
 * does not wait: its next read overlaps the copy. Whoever claims h next
 * waits on h's ev_done (npyl_device_finish_copy) before reading into it.
 * The copy itself waits only on device events already recorded (the
 * previous copy into d, the consumer's release), so no host wait can
 * deadlock. npyl_device_drain waits for every pending copy before staging
 * memory is freed. */
#ifndef NPYLOAD_LOADER_DEVICE_H
#define NPYLOAD_LOADER_DEVICE_H

#include "../cuda/npyload_cuda.h"
#include "../cuda/npyload_cuda_transform.h"
#include "npyload_loader_types.h"
#include "npyload_loader_slots.h"

typedef struct npyl_device {
    npyl_cuda *cuda;      /* NULL unless device mode or pinned */
    int device;           /* -1 host */
    int pinned;
    npyl_tdev *tdev;      /* device transforms: the loaded kernels */
} npyl_device;

/* The copying worker's own resources. */
typedef struct npyl_copy_ctx {
    void *stream;         /* its copy stream */
    void *draw;           /* with transforms: the stored rows on the device */
    char *errmsg;         /* NPYL_ERRMSG_LEN: a kernel's failure */
} npyl_copy_ctx;

/* Queues h's rows (every field; transformed fields through draw and their
 * kernel) into d on the worker's stream, after d's previous copy and, with
 * wait_release, after the consumer's release of d. On failure d->err and
 * d->errmsg say why. *copy_queued: h's ev_done was recorded after the copy
 * (h is read until it completes); *poison_h: part of a failed copy may
 * still read h and even a host wait failed. Called without mu. */
NPYL_HIDDEN void npyl_device_copy(const npyl_device *dv, const npyl_field *fields,
                                  size_t nfields, const npyl_copy_ctx *cc, npyl_slot *h,
                                  npyl_slot *d, int wait_release, npyl_stats *st,
                                  int *copy_queued, int *poison_h);
/* Waits for the copy that read staging slot h (its ev_done) and adds the
 * copy's time to st. Called without mu, by the slot's owner. */
NPYL_HIDDEN int npyl_device_finish_copy(const npyl_device *dv, npyl_slot *h, npyl_stats *st);
/* The workers are joined: waits for every copy still reading a staging
 * slot and destroys the staging slots' events. */
NPYL_HIDDEN void npyl_device_drain(const npyl_device *dv, npyl_slot *hslots, size_t nh,
                                   npyl_stats *st);
/* A device slot s released on `stream` (on_stream) must not be reused
 * before the stream's work so far: records s->ev_release on it (*recorded),
 * or waits for the stream on the host. Returns 1 when ordered, 0 when
 * neither worked (why[] says what failed). On the user's thread: its
 * current device is kept. */
NPYL_HIDDEN int npyl_device_order_release(const npyl_device *dv, npyl_slot *s, void *stream,
                                          int *recorded, char *why, size_t whylen);
/* wait_stream (sync == 0) and sync (sync == 1) of a device batch in slot s,
 * on the user's thread. */
NPYL_HIDDEN int npyl_device_batch_wait(const npyl_device *dv, npyl_slot *s, void *stream,
                                       int sync);

#endif
