/* The loader's background cache fill (NPYLOAD_OPT_CACHE_FILL): at start,
 * when the fields have files of a store that keeps a cache (the remote
 * store with a cache_dir), the plan of what the cache should hold, in the
 * order this rank's epoch needs it, and one thread that brings it in with
 * the store's fill (large ranged GETs, a few in flight, bodies straight
 * into the cache's block files) while the workers read what has arrived.
 *
 * The plan: the cache units (blocks) of the samples this rank reads from
 * the position at start to the end of the epoch, in that order, each unit
 * once; then, when the order shuffles (every epoch draws another share of
 * the samples), every unit of every file of that store, in file order.
 * Units are whole: a unit is listed at its first need. The store cuts the
 * plan at what its cache keeps (the part); in the default mode (0) the
 * fill runs only when the part is the whole plan.
 *
 * Readers and the fill meet in the cache's claims (one fetch per block per
 * node): a worker that needs a block the fill is fetching waits for it; a
 * block a worker or another rank fetched first is found or waited for by
 * the fill. The fill never fails a read: its failures release their
 * blocks as not kept (the waiting worker fetches the block itself) and
 * show in stats (fill_state FAILED, fill_error, npyload_loader_fill_error).
 *
 * Lifetime: built and started by start (the control turn; the plan is
 * read from the order start installed, so set_epoch later changes nothing
 * here), stopped by stop and destroy after they set the stores' cancel
 * (the fill's GETs give up within the transfer poll, its waits within
 * 50 ms) and before they clear it. The struct is made by the first start
 * that fills and kept until the loader is freed (a later start resets it
 * in place), so stats and npyload_loader_fill_error read it on any thread
 * without a lock on the pointer. The thread touches only this struct and
 * the stores, which outlive it. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload_loader_internal.h"

typedef struct npyl_fill npyl_fill;
struct npyl_fill {
    npyl_stores *stores;
    int store;                /* the index of the store that fills */
    npyl_srange *ranges;      /* the plan, in order */
    size_t n, cap;
    npyl_sfill_opts opts;
    npyl_sfill_state st;      /* the store's progress (atomics) */
    _Atomic uint64_t wanted;  /* the plan's bytes */
    _Atomic int state;        /* npyload_fill_state */
    _Atomic int rc;
    _Atomic uint64_t t0_ns, t1_ns;
    pthread_t tid;
    int joinable;
    pthread_mutex_t mu;       /* err (a leaf) */
    char err[NPYL_ERRMSG_LEN];
};

/* ---- the plan ---- */

/* The units of the fill's store, one bit each, per file at base[file]. */
typedef struct plan {
    npyl_fill *F;
    const npyl_stores *set;
    uint64_t unit;
    uint64_t *base;           /* per table file: its first bit (files of
                                 other stores: UINT64_MAX) */
    uint8_t *seen;
} plan;

static int push(npyl_fill *F, uint32_t file, uint64_t off, uint64_t len)
{
    if (F->n) {
        npyl_srange *last = &F->ranges[F->n - 1];
        if (last->file == file && last->off + last->len == off) {
            last->len += len;
            return 0;
        }
    }
    if (F->n == F->cap) {
        size_t nc = F->cap ? 2 * F->cap : 256;
        npyl_srange *r = realloc(F->ranges, nc * sizeof *r);
        if (!r)
            return -ENOMEM;
        F->ranges = r;
        F->cap = nc;
    }
    F->ranges[F->n++] = (npyl_srange){file, off, len};
    return 0;
}

/* Bytes [off, off + len) of table file `file`: its units not listed yet,
 * appended. */
static int want(plan *p, uint32_t file, uint64_t off, uint64_t len)
{
    uint64_t b = p->base[file], size = p->set->files[file].size;
    if (b == UINT64_MAX || len == 0 || off >= size)
        return 0;
    if (off + len > size)
        len = size - off;
    for (uint64_t k = off / p->unit; k * p->unit < off + len; k++) {
        uint64_t bit = b + k;
        if (p->seen[bit / 8] & (1u << (bit % 8)))
            continue;
        p->seen[bit / 8] |= (uint8_t)(1u << (bit % 8));
        uint64_t at = k * p->unit, ulen = at + p->unit < size ? p->unit : size - at;
        if (push(p->F, file, at, ulen))
            return -ENOMEM;
        atomic_fetch_add_explicit(&p->F->wanted, ulen, memory_order_relaxed);
    }
    return 0;
}

/* The stored bytes of global sample s of field f: a row of a .npy (codes
 * of a narrowed one), or the frame of a .npy.zst that holds it. */
static int want_sample(plan *p, const npyl_field *f, int64_t s)
{
    const npyl_ffile *ff = &f->files[npyl_field_file_of(f, s)];
    uint64_t local = (uint64_t)(s - ff->first);
    if (ff->zst) {
        uint32_t frame;
        uint64_t off;
        npyl_zst_locate(ff->zst, local, &frame, &off);
        return want(p, ff->io_index, ff->zst->coff[frame],
                    ff->zst->coff[frame + 1] - ff->zst->coff[frame]);
    }
    uint64_t rb = ff->nx ? f->row_bytes / ff->nx->itemsize : f->row_bytes;
    return want(p, ff->io_index, ff->data_offset + local * rb, rb);
}

static int build_plan(npyload_loader *L, npyl_fill *F, uint64_t unit)
{
    const npyl_stores *set = &L->stores;
    plan p = {F, set, unit, calloc(set->nfiles ? set->nfiles : 1, sizeof *p.base), NULL};
    if (!p.base)
        return -ENOMEM;
    uint64_t bits = 0;
    for (size_t i = 0; i < set->nfiles; i++) {
        p.base[i] = UINT64_MAX;
        if ((int)set->files[i].store == F->store) {
            p.base[i] = bits;
            bits += (set->files[i].size + unit - 1) / unit;
        }
    }
    int rc = (p.seen = calloc(bits / 8 + 1, 1)) ? 0 : -ENOMEM;
    /* This rank's samples from the position start installed (the ctl
     * holder's: nothing swaps the order meanwhile). */
    npyl_position pos;
    npyl_slots_position(&L->ring, &pos);
    int64_t first = pos.gen_first_seq * pos.op.batch_size;
    for (int64_t q = first; rc == 0 && q < pos.delivered; q++)
        for (size_t fi = 0; rc == 0 && fi < L->nfields; fi++)
            rc = want_sample(&p, &L->fields[fi], L->ring.seqbuf[q]);
    /* Later epochs draw other samples: every file, whole. */
    if (L->opt[NPYLOAD_OPT_SHUFFLE] != NPYLOAD_SHUFFLE_NONE)
        for (size_t i = 0; rc == 0 && i < set->nfiles; i++)
            rc = want(&p, (uint32_t)i, 0, set->files[i].size);
    free(p.base);
    free(p.seen);
    return rc;
}

/* ---- the thread ---- */

static void *fill_main(void *arg)
{
    npyl_fill *F = arg;
    char err[NPYL_ERRMSG_LEN] = "";
    int rc = npyl_stores_fill(F->stores, F->store, F->ranges, F->n, &F->opts, &F->st, err,
                              sizeof err);
    atomic_store(&F->t1_ns, npyl_now_ns());
    /* -ECANCELED: stop or destroy (their cancel may end the GETs before
     * npyl_fill_stop sets stop); the fill's pools ask no interrupt. */
    if (rc == -ECANCELED || (rc && atomic_load(&F->st.stop))) {
        atomic_store(&F->state, NPYLOAD_FILL_STOPPED);
        return NULL;
    }
    if (rc) {
        pthread_mutex_lock(&F->mu);
        snprintf(F->err, sizeof F->err, "%s", err);
        pthread_mutex_unlock(&F->mu);
        atomic_store(&F->rc, rc);
    }
    atomic_store(&F->state, rc ? NPYLOAD_FILL_FAILED : NPYLOAD_FILL_DONE);
    return NULL;
}

/* The loader's fill struct, reset for a new start (made at the first). */
static npyl_fill *fill_reset(npyload_loader *L)
{
    npyl_fill *F = L->fill;
    if (!F) {
        if (!(F = calloc(1, sizeof *F)))
            return NULL;
        pthread_mutex_init(&F->mu, NULL);
        __atomic_store_n(&L->fill, F, __ATOMIC_RELEASE); /* stats may look */
    }
    F->n = 0;
    _Atomic uint64_t *c[] = {&F->st.planned_bytes, &F->st.planned_blocks, &F->st.done_bytes,
                             &F->st.found_blocks, &F->st.fetched_blocks, &F->st.fetched_bytes,
                             &F->st.waited_blocks, &F->wanted, &F->t0_ns, &F->t1_ns};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        atomic_store(c[i], 0);
    atomic_store(&F->st.stop, 0);
    atomic_store(&F->rc, 0);
    atomic_store(&F->state, NPYLOAD_FILL_OFF);
    pthread_mutex_lock(&F->mu);
    F->err[0] = 0;
    pthread_mutex_unlock(&F->mu);
    return F;
}

void npyl_fill_start(npyload_loader *L)
{
    npyl_fill_stop(L);
    int64_t mode = L->opt[NPYLOAD_OPT_CACHE_FILL];
    uint64_t unit = 0, budget = 0;
    int store = mode < 0 ? -1 : npyl_stores_fill_facts(&L->stores, &unit, &budget);
    npyl_fill *F = L->fill || store >= 0 ? fill_reset(L) : NULL;
    if (store < 0 || !F)
        return; /* stats: NPYLOAD_FILL_OFF (a fill is an optimisation) */
    F->stores = &L->stores;
    F->store = store;
    F->opts = (npyl_sfill_opts){.background = 1};
    int rc = build_plan(L, F, unit);
    if (rc == 0 && mode == 0 && F->wanted > budget)
        return; /* the cache keeps less than the plan: off (its bytes shown) */
    if (rc == 0 && F->n == 0) {
        atomic_store(&F->state, NPYLOAD_FILL_DONE);
        return;
    }
    atomic_store(&F->t0_ns, npyl_now_ns());
    atomic_store(&F->state, NPYLOAD_FILL_RUNNING);
    if (rc == 0 && (rc = -pthread_create(&F->tid, NULL, fill_main, F)) == 0) {
        F->joinable = 1;
        return;
    }
    atomic_store(&F->t1_ns, npyl_now_ns());
    snprintf(F->err, sizeof F->err, "the cache fill could not start: %s",
             npyload_strerror(rc));
    atomic_store(&F->rc, rc);
    atomic_store(&F->state, NPYLOAD_FILL_FAILED);
}

void npyl_fill_stop(npyload_loader *L)
{
    npyl_fill *F = L->fill;
    if (!F || !F->joinable)
        return;
    atomic_store(&F->st.stop, 1);
    pthread_join(F->tid, NULL);
    F->joinable = 0;
}

void npyl_fill_free(npyload_loader *L)
{
    npyl_fill *F = L->fill;
    if (!F)
        return;
    npyl_fill_stop(L);
    free(F->ranges);
    pthread_mutex_destroy(&F->mu);
    free(F);
    L->fill = NULL;
}

void npyl_fill_stats(const npyload_loader *L, npyload_stats *out)
{
    npyl_fill *F = __atomic_load_n(&L->fill, __ATOMIC_ACQUIRE); /* made once, freed
                                                                   with the loader */
    if (!F)
        return;
    out->fill_state = atomic_load(&F->state);
    out->fill_error = atomic_load(&F->rc);
    out->fill_wanted_bytes = atomic_load(&F->wanted);
    if (out->fill_state == NPYLOAD_FILL_OFF)
        return;
    out->fill_planned_bytes = atomic_load(&F->st.planned_bytes);
    out->fill_planned_blocks = atomic_load(&F->st.planned_blocks);
    out->fill_done_bytes = atomic_load(&F->st.done_bytes);
    out->fill_found_blocks = atomic_load(&F->st.found_blocks);
    out->fill_fetched_blocks = atomic_load(&F->st.fetched_blocks);
    out->fill_fetched_bytes = atomic_load(&F->st.fetched_bytes);
    out->fill_waited_blocks = atomic_load(&F->st.waited_blocks);
    uint64_t t0 = atomic_load(&F->t0_ns), t1 = atomic_load(&F->t1_ns);
    out->fill_ns = t0 ? (t1 ? t1 : npyl_now_ns()) - t0 : 0;
}

void npyl_fill_error(const npyload_loader *L, char *buf, size_t len)
{
    buf[0] = 0;
    npyl_fill *F = __atomic_load_n(&L->fill, __ATOMIC_ACQUIRE);
    if (F) {
        pthread_mutex_lock(&F->mu);
        snprintf(buf, len, "%s", F->err);
        pthread_mutex_unlock(&F->mu);
    }
}
