/* The device copy (staging slot → device slot, device transforms), its
 * events, and the ordering of a device slot's release on a stream. The
 * rules are in npyload_loader_device.h; slot states change only in the
 * slots file. */
#include <inttypes.h>
#include <stdio.h>

#include "npyload_loader_device.h"

/* The per-row records of field f (drows) for h's rows as read (ON_ERROR
 * skip may have dropped some), written into h beside the rows: each row's
 * augmentation decisions, computed here once by the host engine's own
 * function, and its file's value table. h is the worker's: its previous
 * copy was waited for before the read. */
static const npyl_tdev_row *stage_records(const npyl_field *f, npyl_slot *h)
{
    npyl_tdev_row *rec = (npyl_tdev_row *)(h->mem + f->rec_host_off);
    for (size_t r = 0; r < h->rows; r++) {
        int64_t seed, index;
        uint64_t epoch;
        npyl_slot_aug_key(h, r, &seed, &epoch, &index);
        npyl_tdev_row_fill(&f->tplan, seed, epoch, index,
                           f->dnarrow ? (uint32_t)npyl_field_file_of(f, h->indices[r]) : 0, &rec[r]);
    }
    return rec;
}

/* Queues field f's kernel from the device raw buffer (the rows at dst, and
 * its records copied there first) into d, on the worker's stream. */
static int queue_kernel(const npyl_device *dv, const npyl_field *f, const npyl_copy_ctx *cc,
                        npyl_slot *h, npyl_slot *d, const uint8_t *dst, uint64_t *bytes,
                        int *kerr)
{
    int rc;
    if (!f->drows) {
        rc = npyl_tdev_run(dv->tdev, &f->tplan, dst, d->mem + f->dev_off, h->rows,
                           cc->stream, cc->errmsg, NPYL_ERRMSG_LEN);
        *kerr = rc != 0;
        return rc;
    }
    size_t n = h->rows * sizeof(npyl_tdev_row);
    npyl_tdev_row *drec = (npyl_tdev_row *)((uint8_t *)cc->draw + f->rec_raw_off);
    rc = npyl_cuda_memcpy_h2d_async(dv->cuda, drec, stage_records(f, h), n, cc->stream);
    if (rc)
        return rc;
    *bytes += n;
    const npyl_tdev_extra x = {.rows = drec, .tables = f->dnarrow ? f->dtables : NULL};
    rc = npyl_tdev_run_x(dv->tdev, &f->tplan, &x, dst, d->mem + f->dev_off, h->rows,
                         cc->stream, cc->errmsg, NPYL_ERRMSG_LEN);
    *kerr = rc != 0;
    return rc;
}

/* Queues the copy (and kernels) of every field, then the two ev_done
 * records. Returns 0 or the failure; *queued: some copy may be in flight;
 * *kerr: the failure is a kernel's (message in cc->errmsg). */
static int queue_copy(const npyl_device *dv, const npyl_field *fields, size_t nfields,
                      const npyl_copy_ctx *cc, npyl_slot *h, npyl_slot *d, int wait_release,
                      uint64_t *bytes, int *queued, int *kerr)
{
    int rc = 0;
    /* The staging slot's own events, made by the first worker that copies
     * from it (every worker is bound to the loader's device). */
    if (!h->ev_start)
        rc = npyl_cuda_event_create(dv->cuda, &h->ev_start, 1);
    if (!rc && !h->ev_done)
        rc = npyl_cuda_event_create(dv->cuda, &h->ev_done, 1);
    /* The previous copy into d (on another worker's stream, possibly still
     * in flight if d was released unread or recycled by set_epoch) must land
     * first: its ev_done was last recorded by that copy's owner, before d
     * became FREE under mu. */
    if (!rc)
        rc = npyl_cuda_stream_wait_event(dv->cuda, cc->stream, d->ev_done);
    /* The consumer released d with an event on its stream: the copy must
     * not start before the work queued there has finished. The event was
     * recorded before release returned, and release happened before d was
     * found FREE under mu, so waiting on it here orders the copy after that
     * work. */
    if (!rc && wait_release)
        rc = npyl_cuda_stream_wait_event(dv->cuda, cc->stream, d->ev_release);
    if (!rc)
        rc = npyl_cuda_event_record(dv->cuda, h->ev_start, cc->stream);
    for (size_t fi = 0; fi < nfields && !rc; fi++) {
        const npyl_field *f = &fields[fi];
        size_t n = (size_t)(h->rows * (f->hxform ? f->out_row_bytes : f->stage_row_bytes));
        /* A transformed field crosses PCIe in its stored dtype (a narrowed
         * one as its codes) into the worker's device raw buffer, and the
         * kernel writes the slot on the same stream, before ev_done below.
         * The raw buffer is reused by this worker's next batch only after
         * it, in stream order. */
        uint8_t *dst = f->dxform ? (uint8_t *)cc->draw + f->raw_off : d->mem + f->dev_off;
        rc = npyl_cuda_memcpy_h2d_async(dv->cuda, dst, h->mem + f->host_off, n, cc->stream);
        *queued = 1;
        *bytes += n;
        if (!rc && f->dxform && h->rows)
            rc = queue_kernel(dv, f, cc, h, d, dst, bytes, kerr);
    }
    if (!rc)
        rc = npyl_cuda_event_record(dv->cuda, d->ev_done, cc->stream);
    if (!rc)
        rc = npyl_cuda_event_record(dv->cuda, h->ev_done, cc->stream);
    return rc;
}

void npyl_device_copy(const npyl_device *dv, const npyl_field *fields, size_t nfields,
                      const npyl_copy_ctx *cc, npyl_slot *h, npyl_slot *d, int wait_release,
                      npyl_stats *st, int *copy_queued, int *poison_h)
{
    *copy_queued = 0;
    *poison_h = 0;
    if (d->err)
        return; /* the read failed: the error travels in d, nothing to copy */
    int queued = 0; /* a copy reading h may be in flight */
    int kerr = 0;   /* rc is a transform kernel's; cc->errmsg says why */
    uint64_t bytes = 0;
    int rc = queue_copy(dv, fields, nfields, cc, h, d, wait_release, &bytes, &queued, &kerr);
    if (!rc) {
        atomic_fetch_add(&st->h2d_bytes, bytes);
        *copy_queued = 1;
        return;
    }
    char cerr[512];
    if (kerr)
        snprintf(cerr, sizeof cerr, "%.500s", cc->errmsg);
    else
        npyl_cuda_errmsg_copy(dv->cuda, cerr, sizeof cerr);
    d->err = rc;
    snprintf(d->errmsg, NPYL_ERRMSG_LEN, "CUDA device %d: queueing the copy of batch %" PRId64
             " failed: %s", dv->device, d->seq, cerr);
    /* Part of the copy may be in flight with no event behind it: wait for it
     * on the host (rare path). If even that fails, h is never written
     * again. */
    if (queued)
        *poison_h = npyl_cuda_stream_sync(dv->cuda, cc->stream) != 0;
}

int npyl_device_finish_copy(const npyl_device *dv, npyl_slot *h, npyl_stats *st)
{
    int rc = npyl_cuda_event_sync(dv->cuda, h->ev_done);
    float ms = 0;
    if (rc == 0 && npyl_cuda_event_elapsed_ms(dv->cuda, &ms, h->ev_start, h->ev_done) == 0)
        atomic_fetch_add(&st->h2d_ns, (uint64_t)(ms * 1e6));
    return rc;
}

void npyl_device_drain(const npyl_device *dv, npyl_slot *hslots, size_t nh, npyl_stats *st)
{
    if (!dv->cuda || dv->device < 0)
        return;
    /* Copies still reading staging slots must finish before their memory is
     * freed (or pinned pages are unpinned). Event waits and destroys work
     * from any current device; enter only to keep the user's as it was. */
    int prev = -1, entered = npyl_cuda_enter(dv->cuda, &prev) == 0;
    for (size_t i = 0; i < nh; i++) {
        npyl_slot *h = &hslots[i];
        if (h->copy_pending)
            npyl_device_finish_copy(dv, h, st);
        h->copy_pending = 0;
        npyl_cuda_event_destroy(dv->cuda, h->ev_start);
        npyl_cuda_event_destroy(dv->cuda, h->ev_done);
        h->ev_start = h->ev_done = NULL;
    }
    if (entered)
        npyl_cuda_leave(dv->cuda, prev);
}

/* Normally an event is recorded on the stream (ev_release) and the next
 * copy into the slot waits for it on the device; if entering the loader's
 * device or recording fails, the host waits for the stream instead
 * (cudaStreamSynchronize works from any current device for a non-NULL
 * stream; the legacy NULL stream means the current device's, so without
 * entering it cannot be waited for). */
int npyl_device_order_release(const npyl_device *dv, npyl_slot *s, void *stream, int *recorded,
                              char *why, size_t whylen)
{
    int prev, entered = npyl_cuda_enter(dv->cuda, &prev) == 0, ordered = 1;
    *recorded = 0;
    if (entered)
        *recorded = npyl_cuda_event_record(dv->cuda, s->ev_release, stream) == 0;
    if (!*recorded) {
        npyl_cuda_errmsg_copy(dv->cuda, why, whylen);
        ordered = (entered || stream) && npyl_cuda_stream_sync(dv->cuda, stream) == 0;
    }
    if (entered)
        npyl_cuda_leave(dv->cuda, prev);
    return ordered;
}

int npyl_device_batch_wait(const npyl_device *dv, npyl_slot *s, void *stream, int sync)
{
    int prev, rc = npyl_cuda_enter(dv->cuda, &prev);
    if (rc)
        return rc;
    rc = sync ? npyl_cuda_event_sync(dv->cuda, s->ev_done)
              : npyl_cuda_stream_wait_event(dv->cuda, stream, s->ev_done);
    npyl_cuda_leave(dv->cuda, prev);
    return rc;
}
