/* Loader lifetime: create, the fork() guard, the control turn, teardown
 * (destroy, what is kept for held batches, the last reference's free) and
 * the queries. Options, fields, start and resume state have their own
 * files; next() and release() are in npyload_loader_next.c. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "npyload_loader_internal.h"

int npyl_loader_fail(npyload_loader *L, int code, const char *fmt, ...)
{
    /* Formatted outside the lock (a message may quote L->errmsg's own
     * text... it never does, but formatting takes time). */
    char buf[NPYL_ERRMSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    npyl_loader_msg(L, buf);
    return code;
}

void npyl_loader_msg(npyload_loader *L, const char *msg)
{
    pthread_mutex_lock(&L->msg_mu);
    snprintf(L->errmsg, sizeof L->errmsg, "%s", msg);
    npyl_mask_urls_in(L->errmsg, sizeof L->errmsg); /* a path may be a URL */
    pthread_mutex_unlock(&L->msg_mu);
}

void npyl_loader_clear(npyload_loader *L) { npyl_loader_msg(L, ""); }

int npyl_in_child(const npyload_loader *L) { return L->pid != getpid(); }

int npyl_loader_forked(npyload_loader *L)
{
    if (!npyl_in_child(L))
        return 0;
    /* Without msg_mu: a thread of the parent may have held it at fork(),
     * and the child has no other thread. */
    snprintf(L->errmsg, sizeof L->errmsg, "%s", NPYL_FORKED_MSG);
    return NPYLOAD_EFORKED;
}

int npyl_ctl_enter(npyload_loader *L)
{
    pthread_mutex_lock(&L->ctl);
    L->ctl_waiting++;
    while (L->ctl_busy && !L->destroying)
        pthread_cond_wait(&L->ctl_cv, &L->ctl);
    L->ctl_waiting--;
    int rc = 0;
    if (L->destroying)
        rc = NPYLOAD_ESTATE; /* destroy waits for ctl_waiting == 0 */
    else
        L->ctl_busy = 1;
    pthread_cond_broadcast(&L->ctl_cv);
    pthread_mutex_unlock(&L->ctl);
    return rc;
}

void npyl_ctl_leave(npyload_loader *L)
{
    pthread_mutex_lock(&L->ctl);
    L->ctl_busy = 0;
    pthread_cond_broadcast(&L->ctl_cv);
    pthread_mutex_unlock(&L->ctl);
}

int npyload_loader_create(npyload_loader **out)
{
    if (!out)
        return NPYLOAD_EINVAL;
    *out = NULL;
    npyload_loader *L = calloc(1, sizeof *L);
    if (!L)
        return -ENOMEM;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    npyl_slots_init(&L->ring);
    npyl_auto_init(&L->ctrl);
    npyl_skip_log_init(&L->skip);
    npyl_stores_init(&L->stores);
    pthread_mutex_init(&L->ctl, NULL);
    pthread_mutex_init(&L->msg_mu, NULL);
    pthread_mutex_init(&L->dig_mu, NULL);
    pthread_cond_init(&L->ctl_cv, &ca);
    pthread_condattr_destroy(&ca);
    /* BATCH_SIZE stays 0 (unset): start() refuses it. */
    L->opt[NPYLOAD_OPT_WORLD_SIZE] = 1;
    L->opt[NPYLOAD_OPT_DEVICE] = -1;
    L->opt[NPYLOAD_OPT_PIN_MEMORY] = -1;
    L->dev.device = -1;
    L->pid = getpid();
    atomic_init(&L->refs, 1);
    L->env = (npyl_work_env){.ring = &L->ring, .rv = &L->rv, .dev = &L->dev, .st = &L->st,
                             .ahead_on = &L->ctrl.ahead_on};
    *out = L;
    return 0;
}

/* Frees what a slot owns and leaves NULLs, so a second call is a no-op.
 * A device slot released on a stream waits for that stream's work first.
 * keep_handles: its handles stay (destroyed with batches held: a stale
 * handle's release must still find them). */
static void free_slot(npyload_loader *L, npyl_slot *s, int device_slot, int keep_handles)
{
    if (device_slot) {
        if (s->ev_release && s->release_pending)
            npyl_cuda_event_sync(L->dev.cuda, s->ev_release);
        if (s->mem)
            npyl_cuda_free(L->dev.cuda, s->mem);
        if (s->ev_done)
            npyl_cuda_event_destroy(L->dev.cuda, s->ev_done);
        if (s->ev_release)
            npyl_cuda_event_destroy(L->dev.cuda, s->ev_release);
    } else if (s->mem) {
        if (L->dev.pinned)
            npyl_cuda_host_free(L->dev.cuda, s->mem);
        else
            npyl_free_aligned(s->mem);
    }
    free(s->indices);
    free(s->mrows);
    free(s->local);
    free(s->src);
    free(s->arrays);
    free(s->errmsg);
    if (!keep_handles) {
        free(s->handles);
        s->handles = NULL;
    }
    s->mem = NULL;
    s->ev_done = s->ev_release = NULL;
    s->release_pending = 0;
    s->indices = NULL;
    s->mrows = NULL;
    s->local = NULL;
    s->src = NULL;
    s->arrays = NULL;
    s->errmsg = NULL;
}

/* Frees every slot, or (keep_held) every slot but those the caller held
 * when destroy ran (npyl_slots_mark_kept), and of those only what no
 * handle reaches. */
static void free_slots(npyload_loader *L, int keep_held)
{
    npyl_slot *lists[2] = {L->ring.hslots, L->ring.dslots};
    size_t counts[2] = {L->ring.nh, L->ring.nd};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; lists[k] && i < counts[k]; i++)
            if (!keep_held || !lists[k][i].kept)
                free_slot(L, &lists[k][i], k == 1, keep_held);
}

/* Frees the per-start tables that neither a held batch nor its release
 * reads: the epoch's order and the file tables. */
static void free_field_tables(npyload_loader *L);

static void free_tables(npyload_loader *L, int keep_fields)
{
    free((void *)L->ring.op.file_sizes);
    L->ring.op.file_sizes = NULL;
    free(L->ring.seqbuf);
    free(L->ring.seqspare);
    L->ring.seqbuf = L->ring.seqspare = NULL;
    free(L->ring.mixbuf);
    free(L->ring.mixspare);
    L->ring.mixbuf = L->ring.mixspare = NULL;
    npyl_mix_destroy(L->ring.mix);
    L->ring.mix = NULL;
    L->ring.src_off = NULL;
    free(L->src_samples);
    L->src_samples = NULL;
    if (!keep_fields)
        free_field_tables(L);
}

/* What start read of the fields: files (headers, .npy.zst indexes, value
 * tables) and the stores' file table. */
static void free_field_tables(npyload_loader *L)
{
    L->fields_loaded = 0;
    for (size_t i = 0; i < L->nfields; i++) {
        for (size_t k = 0; L->fields[i].files && k < L->fields[i].npaths; k++) {
            npyl_zst_index_free(L->fields[i].files[k].zst);
            free(L->fields[i].files[k].nx);
            free(L->fields[i].files[k].zst);
        }
        free(L->fields[i].files);
        L->fields[i].files = NULL;
    }
    npyl_stores_table(&L->stores, NULL, 0, NULL, 0);
}

/* The workers' io contexts, buffers and events (threads already joined). */
static void free_workers(npyload_loader *L)
{
    for (size_t i = 0; i < L->nworkers; i++)
        npyl_worker_fini(&L->workers[i]);
    free(L->workers);
    L->workers = NULL;
    L->nworkers = 0;
}

/* Frees what start allocated; the loader returns to its pre-start state. */
void npyl_loader_drop_loaded_fields(npyload_loader *L)
{
    if (L->fields_loaded && !L->started)
        free_field_tables(L);
}

static void free_started(npyload_loader *L, int keep_fields);

void npyl_loader_free_started(npyload_loader *L) { free_started(L, 0); }

void npyl_loader_free_started_keep_fields(npyload_loader *L) { free_started(L, 1); }

static void free_started(npyload_loader *L, int keep_fields)
{
    /* May run on any user thread (destroy, the last release): switch to the
     * loader's device for the frees and back. */
    int prev = -1, entered = L->dev.cuda && npyl_cuda_enter(L->dev.cuda, &prev) == 0;
    free_workers(L);
    free_slots(L, 0);
    free(L->ring.hslots);
    free(L->ring.dslots);
    L->ring.hslots = L->ring.dslots = NULL;
    L->ring.nh = L->ring.nd = 0;
    npyl_tdev_close(L->dev.tdev); /* its context is still alive here */
    L->dev.tdev = NULL;
    for (size_t i = 0; i < L->nfields; i++) {
        if (L->fields[i].dtables)
            npyl_cuda_free(L->dev.cuda, L->fields[i].dtables);
        L->fields[i].dtables = NULL;
    }
    if (entered)
        npyl_cuda_leave(L->dev.cuda, prev);
    npyl_cuda_close(L->dev.cuda);
    L->dev.cuda = NULL;
    L->dev.pinned = 0;
    free_tables(L, keep_fields);
    for (size_t i = 0; i < L->nfields; i++) {
        npyl_field *f = &L->fields[i];
        npyl_transform_plan_free(&f->tplan);
        for (size_t k = 0; f->splans && k < L->nsources; k++)
            npyl_transform_plan_free(&f->splans[k]);
        free(f->splans);
        f->splans = NULL;
        f->xform = f->hxform = f->dxform = f->dnarrow = f->drows = 0;
        f->engine[0] = 0;
    }
    L->raw_bytes = 0;
    L->sync = 0;
    L->started = 0;
}

/* destroy with batches held: keep only the slots the caller holds (and the
 * CUDA context and slot arrays their release needs); free the io contexts
 * (descriptors, rings), every other slot, host and device, and the tables.
 * The workers are joined and the slots marked (npyl_slots_mark_kept), so
 * no slot freed here changes state meanwhile; a release of a held batch
 * drops its reference, and the last one frees the rest. */
static void shed_held(npyload_loader *L)
{
    int prev = -1, entered = L->dev.cuda && npyl_cuda_enter(L->dev.cuda, &prev) == 0;
    free_workers(L);
    free_slots(L, 1);
    if (entered)
        npyl_cuda_leave(L->dev.cuda, prev);
    free_tables(L, 0);
    /* The workers are gone: nothing reads any more; the stores close now
     * (a remote secret is wiped now, not at the last release). */
    npyl_stores_fini(&L->stores);
}

static void loader_free(npyload_loader *L)
{
    npyl_loader_free_started(L);
    for (size_t i = 0; i < L->nfields; i++) {
        free(L->fields[i].name);
        for (int k = 0; k < 4; k++)
            free(L->fields[i].tvals[k]);
        for (size_t j = 0; j < L->fields[i].nsxf; j++)
            for (int k = 0; k < 4; k++)
                free(L->fields[i].sxf[j].tvals[k]);
        free(L->fields[i].sxf);
        npyl_free_paths(L->fields[i].paths, L->fields[i].npaths);
        free(L->fields[i].src_first);
    }
    free(L->fields);
    npyl_fill_free(L);
    for (size_t k = 0; k < L->nsources; k++)
        free(L->src_names[k]);
    free(L->src_names);
    free(L->weights);
    free(L->src_n);
    free(L->src_off);
    free(L->mix_pending);
    pthread_mutex_destroy(&L->dig_mu);
    npyl_stores_fini(&L->stores);
    npyl_slots_fini(&L->ring);
    npyl_auto_fini(&L->ctrl);
    npyl_skip_log_fini(&L->skip);
    pthread_cond_destroy(&L->ctl_cv);
    pthread_mutex_destroy(&L->ctl);
    pthread_mutex_destroy(&L->msg_mu);
    for (int i = 0; i < NPYL_NUM_PATHS; i++)
        free(L->paths[i]);
    free(L);
}

void npyl_loader_unref(npyload_loader *L)
{
    /* acq_rel: every use of L by the other holders happens before the
     * free by the last. */
    if (atomic_fetch_sub_explicit(&L->refs, 1, memory_order_acq_rel) == 1)
        loader_free(L);
}

void npyload_loader_destroy(npyload_loader *L)
{
    if (!L)
        return;
    if (npyl_in_child(L))
        return; /* fork() child: leaked on purpose, see npyload.h */
    /* Remote transfers in flight (a start's probe, the workers' reads, a
     * synchronous next()) give up within NPYL_REMOTE_POLL_MS instead of
     * waiting out a stalled server's timeouts and retries. */
    npyl_stores_cancel(&L->stores, 1);
    /* Control calls: the one in progress finishes (they never wait for
     * anything unbounded), those waiting for their turn return
     * NPYLOAD_ESTATE. Then none is inside or can get in. */
    pthread_mutex_lock(&L->ctl);
    L->destroying = 1;
    pthread_cond_broadcast(&L->ctl_cv);
    while (L->ctl_busy || L->ctl_waiting)
        pthread_cond_wait(&L->ctl_cv, &L->ctl);
    pthread_mutex_unlock(&L->ctl);
    /* A next() waiting for a batch sees stopping and returns
     * NPYLOAD_ESTATE; wait until it has left (a synchronous next() finishes
     * its read first) before the workers, slots and locks go. */
    npyl_slots_stop(&L->ring, 1);
    npyl_workers_stop(L->workers, L->nworkers, &L->env);
    npyl_fill_stop(L); /* before anything it reads (the stores) goes */
    if (npyl_slots_mark_kept(&L->ring) > 0)
        shed_held(L);
    npyl_loader_unref(L); /* the caller's reference; held batches have theirs */
}

/* ---- epoch, state, queries ---- */

int64_t npyload_loader_num_samples(const npyload_loader *L)
{
    if (!L)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    return L->started || L->fields_loaded ? L->n : NPYLOAD_ESTATE;
}

_Static_assert(sizeof(((npyl_field *)0)->engine) <= 768,
               "npyload.h: 768 bytes always hold field_engine's why");

int npyload_loader_field_engine(const npyload_loader *L, size_t i, char *why, size_t whylen)
{
    if (!L || i >= L->nfields)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    if (!L->started)
        return NPYLOAD_ESTATE;
    const npyl_field *f = &L->fields[i];
    if (why && whylen)
        snprintf(why, whylen, "%s", f->engine);
    return f->dxform ? NPYLOAD_ENGINE_DEVICE : f->hxform ? NPYLOAD_ENGINE_HOST
                                                        : NPYLOAD_ENGINE_NONE;
}

const char *npyload_loader_errmsg(const npyload_loader *L)
{
    if (!L)
        return "";
    /* In a fork() child the message of the call that failed is in the
     * child's copy; before any call there, say what is wrong. */
    return (npyl_in_child(L) && !L->errmsg[0]) ? NPYL_FORKED_MSG : L->errmsg;
}

int npyload_loader_errmsg_copy(const npyload_loader *L, char *buf, size_t len)
{
    if (!L || !buf || len == 0)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L)) {
        snprintf(buf, len, "%s", npyload_loader_errmsg(L));
        return 0;
    }
    npyload_loader *M = (npyload_loader *)L; /* the lock is not part of the value */
    pthread_mutex_lock(&M->msg_mu);
    snprintf(buf, len, "%s", L->errmsg);
    pthread_mutex_unlock(&M->msg_mu);
    return 0;
}

npyload_io_backend npyload_loader_backend(const npyload_loader *L)
{
    return (L && L->started) ? (npyload_io_backend)L->backend : NPYLOAD_IO_AUTO;
}

const char *npyload_backend_name(npyload_io_backend b)
{
    switch (b) {
    case NPYLOAD_IO_AUTO: return "auto";
    case NPYLOAD_IO_URING: return "io_uring";
    case NPYLOAD_IO_PREAD: return "pread";
    case NPYLOAD_IO_MMAP: return "mmap";
    }
    return "unknown";
}

int npyload_loader_get_stats(const npyload_loader *L, npyload_stats *dst,
                             size_t size)
{
    if (!L || !dst)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    npyload_stats st, *out = &st;
    memset(out, 0, sizeof *out);
    out->bytes_read = atomic_load(&L->st.bytes);
    out->samples_skipped = atomic_load(&L->st.skipped_out);
    out->errors = atomic_load(&L->st.errors);
    out->compressed_bytes_read = atomic_load(&L->st.zcbytes);
    out->decompressed_bytes = atomic_load(&L->st.zdbytes);
    out->decode_ns = atomic_load(&L->st.zdecode_ns);
    out->transform_ns = atomic_load(&L->st.transform_ns);
    out->read_ahead_batches = atomic_load(&L->st.ahead);
    out->read_wait_ns = atomic_load(&L->st.read_wait_ns);
    out->batches_delivered = atomic_load(&L->st.batches);
    out->samples_delivered = atomic_load(&L->st.samples);
    out->wait_ns = atomic_load(&L->st.wait_ns);
    out->io_ns = atomic_load(&L->st.io_ns);
    out->h2d_bytes = atomic_load(&L->st.h2d_bytes);
    out->h2d_ns = atomic_load(&L->st.h2d_ns);
    out->backend = L->started ? L->backend : NPYLOAD_IO_AUTO;
    out->pinned = L->dev.pinned;
    out->direct_io = (int)L->opt[NPYLOAD_OPT_DIRECT_IO];
    out->device = L->dev.device;
    out->slot_bytes = L->host_slot_bytes;
    /* The counts now (the controller changes them) and the memory. */
    out->num_slots = L->started ? (L->dev.device >= 0 ? L->ring.nh + L->ring.nd
                                                      : npyl_auto_slots((npyl_auto *)&L->ctrl))
                                : 0;
    /* What the controller changes (in device mode never the slots: the
     * plan leaves that bit out). */
    out->auto_mode = L->started ? (uint64_t)L->ctrl.mode : 0;
    out->memory_budget = L->started && L->ctrl.mode ? L->ctrl.budget : 0;
    out->memory_bytes = L->started ? npyl_auto_bytes((npyl_auto *)&L->ctrl) : 0;
    out->parked_slots = L->started ? npyl_auto_parked((npyl_auto *)&L->ctrl) : 0;
    out->slot_wait_ns = atomic_load(&L->ring.slot_wait_ns);
    out->read_ahead_on = L->started ? (uint64_t)npyl_auto_ahead((npyl_auto *)&L->ctrl) : 0;
    if (L->started) {
        uint64_t total = 0;
        npyl_auto_history((npyl_auto *)&L->ctrl, NULL, 0, sizeof(npyload_auto_event), &total);
        out->auto_decisions = total ? total - 1 : 0; /* the start is not a change */
    }
    /* workers[] and their io contexts live from start to free_started, like
     * the slots read above; backend_now is atomic. */
    npyl_store_counters c = {0};
    uint64_t ahead_cpu = 0, ahead_blocked = 0;
    /* Only the workers made so far (the controller makes more). */
    size_t made = L->started && L->workers ? npyl_auto_made((npyl_auto *)&L->ctrl) : 0;
    if (L->started && L->workers)
        for (size_t i = 0; i < made && i < L->nworkers; i++) {
            uint64_t fell = 0;
            npyl_read_ctx_counters(&L->workers[i].rd, &c, &ahead_cpu, &ahead_blocked, &fell);
            if (L->backend == NPYLOAD_IO_URING)
                out->uring_fallbacks += fell;
        }
    out->elapsed_ns = L->started ? npyl_now_ns() - L->st.start_ns : 0;
    out->step_ns = atomic_load(&L->st.step_ns);
    out->worker_cpu_ns = atomic_load(&L->st.cpu_ns) + ahead_cpu;
    out->read_blocked_ns = atomic_load(&L->st.blocked_ns) + ahead_blocked;
    out->num_workers = L->sync || !L->started ? 0 : npyl_auto_workers((npyl_auto *)&L->ctrl);
    out->gather_bytes = c.gather_bytes;
    out->gather_requests = c.gather_reqs;
    out->read_requests = c.read_reqs;
    npyl_stores_stats(&L->stores, out);
    npyl_fill_stats(L, out);
    /* The first published layout ends at transform_ns (npyload.h). */
    return npyl_sized_out(dst, size, out, sizeof *out,
                          NPYL_SIZE_THROUGH(npyload_stats, transform_ns));
}

int npyload_loader_auto_history(const npyload_loader *L, npyload_auto_event *ev, size_t n,
                                size_t size, uint64_t *total)
{
    if (total)
        *total = 0;
    if (!L || (n && !ev) || size < NPYL_SIZE_THROUGH(npyload_auto_event, read_blocked))
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    npyload_loader *M = (npyload_loader *)L; /* the lock is not part of the value */
    return (int)npyl_auto_history(&M->ctrl, ev, n > INT32_MAX ? INT32_MAX : n, size, total);
}

const char *npyload_auto_reason_name(int reason)
{
    static const char *const names[] = {"start", "wait", "no-gain", "spare",
                                        "worse", "held", "regime", "forced",
                                        "unused", "read-ahead-off", "read-ahead-on"};
    return reason >= 0 && reason < (int)(sizeof names / sizeof *names) ? names[reason] : "?";
}

int npyload_loader_fill_error(const npyload_loader *L, char *buf, size_t len)
{
    if (!L || !buf || len == 0)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    npyl_fill_error(L, buf, len);
    return 0;
}

int npyload_loader_last_skip_error(const npyload_loader *L, char *buf, size_t len)
{
    if (!L || !buf || len == 0)
        return NPYLOAD_EINVAL;
    if (npyl_in_child(L))
        return NPYLOAD_EFORKED;
    npyload_loader *M = (npyload_loader *)L; /* the lock is not part of the value */
    npyl_skip_log_get(&M->skip, buf, len);
    return 0;
}
