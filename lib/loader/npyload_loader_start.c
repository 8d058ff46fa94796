/* npyload_loader_start() in named steps: resolve the counts, load the
 * fields, plan the transforms (and where each runs), resolve the backend,
 * open CUDA and load the kernels (a field that can fall back to the host
 * does so when they do not load), plan the slot layout and the order,
 * allocate the slots, copy narrowed value tables to the device, create the
 * workers' io contexts within the descriptor budget, begin the first
 * epoch, spawn the workers. On failure the loader returns to its pre-start
 * state. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>

#include "npyload_loader_internal.h"

static int resolve_backend(npyload_loader *L)
{
    int want = (int)L->opt[NPYLOAD_OPT_IO_BACKEND];
    char why[256] = "";
    if (want == NPYLOAD_IO_MMAP && L->opt[NPYLOAD_OPT_DIRECT_IO])
        return npyl_loader_fail(L, NPYLOAD_EINVAL,
                                "DIRECT_IO needs the io_uring or pread backend, not mmap");
    if (want == NPYLOAD_IO_URING) {
        if (npyl_stores_auto_backend(why, sizeof why) != NPYLOAD_IO_URING)
            return npyl_loader_fail(L, NPYLOAD_ENOURING,
                                    "io_uring backend requested but unusable: %s", why);
    } else if (want == NPYLOAD_IO_AUTO) {
        want = npyl_stores_auto_backend(why, sizeof why); /* once per loader */
    }
    L->backend = want;
    return 0;
}

/* Lays the fields out in a slot. With O_DIRECT, a field's region starts at an
 * address congruent to its first file's data offset modulo 4096, so that file
 * offsets and memory addresses of every row share their alignment and the
 * aligned middle of each run can be read with O_DIRECT straight into place
 * (rows a multiple of 4096 bytes keep that congruence for every run). */
static int plan_layout(npyload_loader *L)
{
    uint64_t B = (uint64_t)L->slot_rows;
    uint64_t h = 0, d = 0, r = 0;
    for (size_t i = 0; i < L->nfields; i++) {
        npyl_field *f = &L->fields[i];
        /* A transformed field: the host slot holds what the reader wrote
         * (the stored rows, or a narrowed field's codes) when the kernels
         * convert it after the copy (dxform: it crosses PCIe as read) and
         * the output rows when the host engine does (hxform), whose stored
         * rows land in the worker's raw buffer first; the device slot
         * always holds the output. Per-row records (drows) follow the rows
         * in the staging slot and in the device raw buffer. */
        uint64_t bytes, out_bytes, raw_bytes = 0, recs = 0;
        if (npyl_mul_u64(B, f->stage_row_bytes, &bytes) ||
            npyl_mul_u64(B, f->out_row_bytes, &out_bytes) ||
            npyl_mul_u64(B, f->drows ? sizeof(npyl_tdev_row) : 0, &recs))
            return npyl_loader_fail(L, NPYLOAD_ETOOBIG, "field '%s': batch bytes overflow",
                                    f->name);
        uint64_t hbytes = f->hxform ? out_bytes : bytes;
        h = (h + NPYL_DIRECT_ALIGN - 1) / NPYL_DIRECT_ALIGN * NPYL_DIRECT_ALIGN;
        if (L->opt[NPYLOAD_OPT_DIRECT_IO] && !f->hxform)
            h += f->files[0].data_offset % NPYL_DIRECT_ALIGN;
        f->host_off = h;
        d = (d + DEV_ALIGN - 1) / DEV_ALIGN * DEV_ALIGN;
        f->dev_off = d;
        f->raw_off = 0;
        if (f->xform) {
            /* Reads land in the raw buffer: give it the O_DIRECT congruence. */
            r = (r + NPYL_DIRECT_ALIGN - 1) / NPYL_DIRECT_ALIGN * NPYL_DIRECT_ALIGN;
            if (L->opt[NPYLOAD_OPT_DIRECT_IO] && f->hxform)
                r += f->files[0].data_offset % NPYL_DIRECT_ALIGN;
            f->raw_off = r;
            raw_bytes = bytes;
        }
        if (npyl_add_u64(h, hbytes, &h) || npyl_add_u64(d, out_bytes, &d) ||
            npyl_add_u64(r, raw_bytes, &r))
            return npyl_loader_fail(L, NPYLOAD_ETOOBIG, "batch bytes overflow");
        if (recs) {
            f->rec_host_off = h = (h + 15) / 16 * 16;
            f->rec_raw_off = r = (r + 15) / 16 * 16;
            if (npyl_add_u64(h, recs, &h) || npyl_add_u64(r, recs, &r))
                return npyl_loader_fail(L, NPYLOAD_ETOOBIG, "batch bytes overflow");
        }
    }
    L->host_slot_bytes = (h + NPYL_DIRECT_ALIGN - 1) / NPYL_DIRECT_ALIGN * NPYL_DIRECT_ALIGN;
    L->dev_slot_bytes = d;
    L->raw_bytes = r ? (r + NPYL_DIRECT_ALIGN - 1) / NPYL_DIRECT_ALIGN * NPYL_DIRECT_ALIGN : 0;
    return 0;
}

/* Step: the per-sample size bound, checked before anything is sized from
 * it, and the rows a slot needs: a batch never holds more than BATCH_SIZE
 * rows nor more than a rank's samples per epoch, ceil(N / WORLD_SIZE)
 * (every split of an epoch, a resumed one or drop_last included, gives a
 * rank at most that many), so a field of 3 samples with BATCH_SIZE 1024 has
 * slots of 3 rows, and one of 0 samples slots of none. */
static int plan_rows(npyload_loader *L)
{
    for (size_t i = 0; i < L->nfields; i++) {
        const npyl_field *f = &L->fields[i];
        uint64_t stored = f->row_bytes, out = f->out_row_bytes;
        /* The host engine builds an augmented row in the stored dtype
         * before converting it (a worker's scratch, allocated at start
         * whatever the sample count): up to 4x the delivered bytes. */
        uint64_t aug = f->hxform && f->tplan.aug ? f->tplan.in_row_bytes : 0;
        if (stored <= NPYLOAD_MAX_SAMPLE_BYTES && out <= NPYLOAD_MAX_SAMPLE_BYTES &&
            aug <= NPYLOAD_MAX_SAMPLE_BYTES)
            continue;
        char shape[256];
        int at = snprintf(shape, sizeof shape, "(");
        for (int d = 0; d < f->sndim && at < (int)sizeof shape - 24; d++)
            at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%" PRId64, d ? ", " : "",
                           f->sshape[d]);
        snprintf(shape + at, sizeof shape - (size_t)at, "%s)", f->sndim == 1 ? "," : "");
        if (stored > NPYLOAD_MAX_SAMPLE_BYTES)
            return npyl_loader_fail(L, NPYLOAD_ETOOBIG, "field '%s': %s: a sample of shape "
                                    "%s and dtype %s is %" PRIu64 " bytes, above "
                                    "NPYLOAD_MAX_SAMPLE_BYTES (%" PRIu64 " bytes, 4 GiB)",
                                    f->name, f->paths[0], shape, f->descr, stored,
                                    (uint64_t)NPYLOAD_MAX_SAMPLE_BYTES);
        if (out <= NPYLOAD_MAX_SAMPLE_BYTES)
            return npyl_loader_fail(L, NPYLOAD_ETOOBIG, "field '%s': %s: a sample of shape "
                                    "%s is %" PRIu64 " bytes once augmented in its stored "
                                    "dtype %s (the host engine's row before the conversion "
                                    "to %s), above NPYLOAD_MAX_SAMPLE_BYTES (%" PRIu64
                                    " bytes, 4 GiB)", f->name, f->paths[0], shape, aug,
                                    f->descr, f->tplan.out_descr,
                                    (uint64_t)NPYLOAD_MAX_SAMPLE_BYTES);
        return npyl_loader_fail(L, NPYLOAD_ETOOBIG, "field '%s': %s: a sample of shape %s "
                                "is %" PRIu64 " bytes after its transform (%s), above "
                                "NPYLOAD_MAX_SAMPLE_BYTES (%" PRIu64 " bytes, 4 GiB)",
                                f->name, f->paths[0], shape, out, f->tplan.out_descr,
                                (uint64_t)NPYLOAD_MAX_SAMPLE_BYTES);
    }
    int64_t B = L->opt[NPYLOAD_OPT_BATCH_SIZE], W = L->opt[NPYLOAD_OPT_WORLD_SIZE];
    int64_t T = npyl_loader_epoch_len(L);
    int64_t per_rank = T / W + (T % W != 0);
    L->slot_rows = per_rank < B ? per_rank : B;
    return 0;
}

/* How many of f's files are narrowed (one-byte codes and a value table). */
static size_t narrowed_files(const npyl_field *f)
{
    size_t n = 0;
    for (size_t k = 0; k < f->npaths; k++)
        n += f->files[k].nx || (f->files[k].zst && f->files[k].zst->narrow);
    return n;
}

/* Device mode: whether a narrowed field's codes cross PCIe and a kernel
 * expands them (dnarrow), or the reader expands them on the host; writes
 * the reason for the host into why (or leaves it empty). */
static void plan_codes(npyl_field *f, size_t narrowed, char *why, size_t whylen)
{
    char err[512];
    if (f->hxform)
        snprintf(why, whylen, "its transform runs in the host engine");
    else if (narrowed < f->npaths)
        snprintf(why, whylen, "%zu of its %zu files are narrowed (a field that mixes "
                 "narrowed and plain files is expanded on the host; pack them all "
                 "with --narrow)", narrowed, f->npaths);
    else if (npyl_tdev_plan_check(f->name, &f->tplan, err, sizeof err) != 0)
        snprintf(why, whylen, "%.300s", err);
    if (why[0])
        return;
    f->dnarrow = f->dxform = 1;
    f->stage_row_bytes = f->row_bytes / f->itemsize;
}

/* f->engine: where it runs, what crosses PCIe, and why the host when the
 * device was asked for (npyload_loader_field_engine). */
static void describe_engine(npyl_field *f, int device, const char *why, const char *codes)
{
    char *e = f->engine;
    size_t n = sizeof f->engine;
    if (f->dxform && f->dnarrow)
        snprintf(e, n, "device: kernels after the copy expand the one-byte codes (PCIe "
                 "carries the codes, not '%s')%s", f->descr,
                 f->tplan.aug ? " and augment" : "");
    else if (f->dxform)
        snprintf(e, n, "device: kernels after the copy (PCIe carries the stored '%s')%s%.300s",
                 f->descr, codes[0] ? "; narrowed codes expanded on the host: " : "", codes);
    else if (f->hxform)
        snprintf(e, n, "host engine%s%.300s%s%.300s", device ? ": " : " (host mode)", why,
                 codes[0] ? "; narrowed codes expanded on the host: " : "", codes);
    else
        snprintf(e, n, "none: the stored rows are delivered%s%.300s",
                 codes[0] ? "; narrowed codes expanded on the host: " : "", codes);
}

/* The shape of plan p's delivered sample, "(3, 32, 32)", into buf. */
static void plan_shape(const npyl_tplan *p, char *buf, size_t len)
{
    int at = snprintf(buf, len, "(");
    for (int d = 0; d < p->sndim && at < (int)len - 24; d++)
        at += snprintf(buf + at, len - (size_t)at, "%s%" PRId64, d ? ", " : "", p->sshape[d]);
    snprintf(buf + at, len - (size_t)at, "%s)", p->sndim == 1 ? "," : "");
}

/* A mixture whose sources have their own transforms of f
 * (npyload_loader_set_source_transform): one plan per source in
 * f->splans (a source without one: the field's transform, or the
 * identity), every one delivering what source 0's does (dtype, shape,
 * layout), else NPYLOAD_EMISMATCH naming both sources; *rep: the source
 * whose description plans f->tplan (the first that augments, else the
 * first that transforms, else 0), so that tplan's flags and row sizes are
 * the field's. */
static int plan_sources(npyload_loader *L, npyl_field *f, size_t *rep)
{
    const npyload_transform identity = NPYLOAD_TRANSFORM_INIT;
    const size_t K = L->nsources;
    if (!(f->splans = calloc(K, sizeof *f->splans)))
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    size_t aug = K, xf = K;
    for (size_t k = 0; k < K; k++) {
        const npyload_transform *t = k < f->nsxf && f->sxf[k].set ? &f->sxf[k].tdesc
                                     : f->has_transform     ? &f->tdesc
                                                            : &identity;
        char what[512], err[512];
        snprintf(what, sizeof what, "%.200s (source '%.200s')", f->name, L->src_names[k]);
        npyl_tplan *p = &f->splans[k];
        int rc = npyl_transform_plan(what, t, f->descr, f->sndim, f->sshape, p, err,
                                     sizeof err);
        if (rc)
            return npyl_loader_fail(L, rc, "%s", err);
        if (p->aug && aug == K)
            aug = k;
        if (!npyl_transform_is_identity(p) && xf == K)
            xf = k;
        const npyl_tplan *p0 = &f->splans[0];
        if (k && (strcmp(p->out_descr, p0->out_descr) || p->sndim != p0->sndim ||
                  memcmp(p->sshape, p0->sshape, sizeof p->sshape[0] * (size_t)p->sndim) ||
                  memcmp(p->byte_strides, p0->byte_strides,
                         sizeof p->byte_strides[0] * (size_t)(p->sndim + 1)))) {
            char s0[256], sk[256];
            plan_shape(p0, s0, sizeof s0);
            plan_shape(p, sk, sizeof sk);
            return npyl_loader_fail(L, NPYLOAD_EMISMATCH, "field '%s': source '%s' delivers "
                                    "%s %s%s, source '%s' %s %s%s: every source's transform "
                                    "of a field must deliver the same dtype, shape and "
                                    "layout", f->name, L->src_names[0], p0->out_descr, s0,
                                    p0->channels_last ? " channels-last" : "",
                                    L->src_names[k], p->out_descr, sk,
                                    p->channels_last ? " channels-last" : "");
        }
    }
    *rep = aug < K ? aug : xf < K ? xf : 0;
    return 0;
}

/* Whether a source of the mixture has its own transform of f. */
static int has_source_transforms(const npyl_field *f)
{
    for (size_t k = 0; k < f->nsxf; k++)
        if (f->sxf[k].set)
            return 1;
    return 0;
}

/* Where field f's transform and the expansion of its narrowed codes run.
 * Host mode: the host engine. Device mode: a transform without
 * augmentation runs as kernels after the copy, or start fails (the kernels
 * missing, a per-channel limit); an augmentation, or narrowed codes, run
 * there when the kernels can take them and fall back to the host engine
 * (the reader's expansion) otherwise, with the reason in f->engine. */
static int plan_field(npyload_loader *L, npyl_field *f)
{
    const int device = L->opt[NPYLOAD_OPT_DEVICE] >= 0;
    const size_t narrowed = device ? narrowed_files(f) : 0;
    const int per_source = has_source_transforms(f);
    snprintf(f->engine, sizeof f->engine, "none: the stored rows are delivered");
    if (!f->has_transform && !narrowed && !per_source)
        return 0;
    char err[512], why[384] = "";
    const npyload_transform identity = NPYLOAD_TRANSFORM_INIT;
    const npyload_transform *t = f->has_transform ? &f->tdesc : &identity;
    size_t rep = 0;
    int rc = per_source ? plan_sources(L, f, &rep) : 0;
    if (rc)
        return rc;
    if (per_source && rep < f->nsxf && f->sxf[rep].set)
        t = &f->sxf[rep].tdesc;
    rc = npyl_transform_plan(f->name, t, f->descr, f->sndim, f->sshape, &f->tplan, err,
                             sizeof err);
    if (rc)
        return npyl_loader_fail(L, rc, "%s", err);
    f->out_row_bytes = f->tplan.out_row_bytes;
    const int xf = !npyl_transform_is_identity(&f->tplan);
    /* Per-source plans run in the host engine: the kernels take one plan
     * per batch. */
    rc = xf && device && !per_source
             ? npyl_tdev_plan_check(f->name, &f->tplan, err, sizeof err) : 0;
    if (rc && !f->tplan.aug)
        return npyl_loader_fail(L, rc, "%s", err);
    f->dxform = xf && device && !rc && !per_source;
    f->hxform = xf && !f->dxform;
    if (rc)
        snprintf(why, sizeof why, "%.300s", err);
    else if (xf && device && per_source)
        snprintf(why, sizeof why, "the sources have their own transforms (one plan per "
                 "row's source: the host engine)");
    char codes[384] = "";
    if (narrowed)
        plan_codes(f, narrowed, codes, sizeof codes);
    f->drows = f->dxform && (f->tplan.aug || f->dnarrow);
    f->xform = f->hxform || f->dxform;
    describe_engine(f, device, why, codes);
    return 0;
}

/* Step: each field's transform planned against its dtype and sample shape
 * (a field without one delivers its stored rows: out_row_bytes = row_bytes),
 * and where it runs (plan_field). The kernels are loaded in open_tdev. */
static int plan_transforms(npyload_loader *L)
{
    for (size_t i = 0; i < L->nfields; i++) {
        npyl_field *f = &L->fields[i];
        f->xform = f->hxform = f->dxform = f->dnarrow = f->drows = 0;
        f->out_row_bytes = f->stage_row_bytes = f->row_bytes;
        int rc = plan_field(L, f);
        if (rc)
            return rc;
    }
    return 0;
}

/* The kernels did not load (err): a field that can run on the host goes
 * there (an augmentation, narrowed codes), with the reason; a transform
 * that only the kernels run fails start, as before. */
static int kernels_missing(npyload_loader *L, int rc, const char *err)
{
    for (size_t i = 0; i < L->nfields; i++) {
        const npyl_field *f = &L->fields[i];
        if (f->dxform && !f->tplan.aug && !npyl_transform_is_identity(&f->tplan))
            return npyl_loader_fail(L, rc, "CUDA device %d: loading the transform kernels "
                                    "failed: %s", L->dev.device, err);
    }
    for (size_t i = 0; i < L->nfields; i++) {
        npyl_field *f = &L->fields[i];
        if (!f->dxform)
            continue;
        f->hxform = !npyl_transform_is_identity(&f->tplan);
        f->xform = f->hxform;
        f->dxform = f->dnarrow = f->drows = 0;
        f->stage_row_bytes = f->row_bytes;
        snprintf(f->engine, sizeof f->engine, "%s: the device kernels did not load: %.600s",
                 f->hxform ? "host engine"
                           : "none: the stored rows are delivered; narrowed codes expanded "
                             "on the host", err);
    }
    return 0;
}

/* Device mode with transforms: loads the kernels into the loader's device
 * context (made to exist first: the runtime creates it lazily), before the
 * layout, so that a field that can run on the host goes there when they do
 * not load (kernels_missing). */
static int open_tdev(npyload_loader *L)
{
    int need = 0;
    for (size_t i = 0; i < L->nfields; i++)
        need |= L->fields[i].dxform;
    if (L->dev.device < 0 || !need)
        return 0;
    char err[2048] = "";
    int prev = -1, rc = npyl_cuda_enter(L->dev.cuda, &prev);
    if (rc)
        return npyl_loader_fail(L, rc, "CUDA device %d: %s", L->dev.device,
                                npyl_cuda_errmsg(L->dev.cuda));
    const npyl_tdev_cfg cfg = {.mode = (int)L->opt[NPYLOAD_OPT_DEVICE_KERNELS],
                               .nvrtc = L->paths[NPYLOAD_PATH_NVRTC],
                               .cache_dir = L->paths[NPYLOAD_PATH_KERNEL_CACHE]};
    rc = npyl_cuda_init_context(L->dev.cuda);
    if (rc)
        snprintf(err, sizeof err, "%s", npyl_cuda_errmsg(L->dev.cuda));
    else
        rc = npyl_tdev_open(&L->dev.tdev, L->dev.cuda, &cfg, err, sizeof err);
    npyl_cuda_leave(L->dev.cuda, prev);
    return rc ? kernels_missing(L, rc, err) : 0;
}

/* A narrowed field's value tables, one per file in file order (the rows'
 * records name them), NPYL_TDEV_TABLE entries each (unused ones zero), in
 * device memory for the loader's life; written once here. */
static int upload_tables(npyload_loader *L, npyl_field *f)
{
    size_t tb = NPYL_TDEV_TABLE * f->itemsize, n = f->npaths * tb;
    unsigned char *t = calloc(n ? n : 1, 1);
    if (!t)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    for (size_t k = 0; k < f->npaths; k++) {
        const npyl_ffile *ff = &f->files[k];
        const npyl_zst_narrow *x = ff->nx ? ff->nx : ff->zst->narrow;
        memcpy(t + k * tb, x->values, (size_t)x->count * x->itemsize);
    }
    void *s = NULL;
    int rc = npyl_cuda_malloc(L->dev.cuda, &f->dtables, n);
    if (!rc && !(rc = npyl_cuda_stream_create(L->dev.cuda, &s)) &&
        !(rc = npyl_cuda_memcpy_h2d_async(L->dev.cuda, f->dtables, t, n, s)))
        rc = npyl_cuda_stream_sync(L->dev.cuda, s);
    if (s)
        npyl_cuda_stream_destroy(L->dev.cuda, s);
    free(t);
    if (rc)
        return npyl_loader_fail(L, rc, "field '%s': CUDA device %d: copying the %zu value "
                                "tables of its narrowed files failed: %s", f->name,
                                L->dev.device, f->npaths, npyl_cuda_errmsg(L->dev.cuda));
    return 0;
}

/* Step: the value tables of every field whose codes the device expands. */
static int upload_all_tables(npyload_loader *L)
{
    int prev = -1, rc = 0, entered = 0;
    for (size_t i = 0; i < L->nfields && !rc; i++) {
        if (!L->fields[i].dnarrow)
            continue;
        if (!entered && (rc = npyl_cuda_enter(L->dev.cuda, &prev)) != 0)
            return npyl_loader_fail(L, rc, "CUDA device %d: %s", L->dev.device,
                                    npyl_cuda_errmsg(L->dev.cuda));
        entered = 1;
        rc = upload_tables(L, &L->fields[i]);
    }
    if (entered)
        npyl_cuda_leave(L->dev.cuda, prev);
    return rc;
}

static int init_slot(npyload_loader *L, npyl_slot *s, int device_slot, int with_mem)
{
    size_t rows = L->slot_rows ? (size_t)L->slot_rows : 1;
    s->indices = malloc(rows * sizeof *s->indices);
    s->arrays = calloc(L->nfields, sizeof *s->arrays);
    s->errmsg = calloc(1, NPYL_ERRMSG_LEN);
    s->handles = calloc(NPYL_HANDLES, sizeof *s->handles);
    if (L->nsources) {
        s->mrows = malloc(rows * sizeof *s->mrows);
        s->local = malloc(rows * sizeof *s->local);
        s->src = malloc(rows * sizeof *s->src);
    }
    if (!s->indices || !s->arrays || !s->errmsg || !s->handles ||
        (L->nsources && (!s->mrows || !s->local || !s->src)))
        return npyl_loader_fail(L, -ENOMEM, "out of memory allocating slots");
    for (size_t k = 0; k < NPYL_HANDLES; k++) {
        s->handles[k].owner = L;
        s->handles[k].nfields = L->nfields;
        s->handles[k].slot = s;
        s->handles[k].device_mode = device_slot;
    }
    atomic_init(&s->owner, NULL);
    int rc;
    if (!with_mem) {
        s->state = SLOT_OFF; /* the controller gives it memory when it wants it */
        return 0;
    }
    if (device_slot) {
        if ((rc = npyl_cuda_malloc(L->dev.cuda, (void **)&s->mem, L->dev_slot_bytes)) ||
            (rc = npyl_cuda_event_create(L->dev.cuda, &s->ev_done, 0)) ||
            (rc = npyl_cuda_event_create(L->dev.cuda, &s->ev_release, 0)))
            return npyl_loader_fail(L, rc, "CUDA device %d: allocating a %" PRIu64
                                    "-byte device slot failed: %s", L->dev.device,
                                    L->dev_slot_bytes, npyl_cuda_errmsg(L->dev.cuda));
        return 0;
    }
    if (L->dev.pinned) {
        rc = npyl_cuda_host_alloc(L->dev.cuda, (void **)&s->mem, L->host_slot_bytes);
        if (rc == 0)
            return 0;
        if (L->opt[NPYLOAD_OPT_PIN_MEMORY] == 1)
            return npyl_loader_fail(L, rc, "pinning a %" PRIu64 "-byte slot failed (%s); "
                                    "PIN_MEMORY=1 requires it", L->host_slot_bytes,
                                    npyl_cuda_errmsg(L->dev.cuda));
        /* Pinning can fail under a locked-memory limit: fall back to pageable
         * memory for every slot so the stats tell one consistent story. */
        for (size_t i = 0; i < L->ring.nh && &L->ring.hslots[i] != s &&
                           L->ring.hslots[i].mem; i++) {
            npyl_cuda_host_free(L->dev.cuda, L->ring.hslots[i].mem);
            L->ring.hslots[i].mem = npyl_alloc_aligned(L->host_slot_bytes, NPYL_DIRECT_ALIGN);
            if (!L->ring.hslots[i].mem)
                return npyl_loader_fail(L, -ENOMEM, "out of memory allocating slots");
        }
        L->dev.pinned = 0;
    }
    s->mem = npyl_alloc_aligned(L->host_slot_bytes, NPYL_DIRECT_ALIGN);
    if (!s->mem)
        return npyl_loader_fail(L, -ENOMEM, "cannot allocate %zu slots of %" PRIu64
                                " bytes (PREFETCH x batch bytes)", L->ring.nh, L->host_slot_bytes);
    return 0;
}

/* READ_AHEAD resolved, never in sync mode: -1 off, 1 on, 0 (the default)
 * on when a batch has work after its reads for the next batch's reads to
 * overlap: .npy.zst frames to decode, narrowed codes to expand, host
 * transforms, device copies. A batch of stored rows delivered as they are
 * has none: its worker would only wait for the hand-off to the read thread
 * and back, two wake-ups a batch, which in the page cache cost more than
 * copying a batch of small rows (issue 37: 3 KiB rows, 0.7x without it). */
static int read_ahead(const npyload_loader *L)
{
    int64_t opt = L->opt[NPYLOAD_OPT_READ_AHEAD];
    if (L->sync || opt < 0)
        return 0;
    if (opt > 0 || L->dev.device >= 0 || L->zst.any)
        return 1;
    for (size_t i = 0; i < L->nfields; i++)
        if (L->fields[i].hxform || narrowed_files(&L->fields[i]))
            return 1;
    return 0;
}

/* nworkers, prefetch: the capacities (the controller's ceilings); on:
 * the host slots that get memory now (the others are OFF). */
static int alloc_slots(npyload_loader *L, size_t nworkers, size_t prefetch, size_t on)
{
    int device_mode = L->dev.device >= 0;
    /* Host mode: the slots are the batches. Device mode: PREFETCH device
     * slots are the batches; host staging slots only need to cover the reads
     * in flight plus one being copied. */
    size_t staging = (read_ahead(L) ? 2 : 1) * nworkers + 1; /* with read-ahead a
                                                               worker fills two */
    L->ring.nh = device_mode ? (prefetch < staging ? prefetch : staging) : prefetch;
    L->ring.nd = device_mode ? prefetch : 0;
    L->ring.hslots = calloc(L->ring.nh, sizeof *L->ring.hslots);
    L->ring.dslots = L->ring.nd ? calloc(L->ring.nd, sizeof *L->ring.dslots) : NULL;
    if (!L->ring.hslots || (L->ring.nd && !L->ring.dslots))
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    if (device_mode)
        on = L->ring.nh;
    for (size_t i = 0; i < L->ring.nh; i++) {
        int rc = init_slot(L, &L->ring.hslots[i], 0, i < on);
        if (rc)
            return rc;
    }
    L->ring.slots_on = on < L->ring.nh ? on : L->ring.nh;
    for (size_t i = 0; i < L->ring.nd; i++) {
        int rc = init_slot(L, &L->ring.dslots[i], 1, 1);
        if (rc)
            return rc;
    }
    return 0;
}

/* Descriptors open in this process now (/proc/self/fd, less the listing's
 * own), or -1 when /proc is not mounted. */
static int count_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n > 0 ? n - 1 : 0;
}

/* Sizes the per-worker open-file caches from what RLIMIT_NOFILE leaves, so
 * that reads never meet EMFILE mid-epoch. Each worker needs its io_uring
 * ring (one descriptor) and at least one open file (two with DIRECT_IO: a
 * buffered and an O_DIRECT descriptor); FD_RESERVE stay free for the
 * application. Workers share half of the rest, at most 256 files each.
 * Refuses with -EMFILE and the numbers when one file per worker does not
 * fit. */
#define FD_RESERVE 16
#define FD_UNKNOWN_OPEN 64 /* assumed open when /proc is missing */
static int plan_fd_budget(npyload_loader *L, size_t nworkers, unsigned *per_worker)
{
    struct rlimit rl;
    uint64_t soft = 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        soft = rl.rlim_cur;
    int open_now = count_open_fds();
    uint64_t used = open_now >= 0 ? (uint64_t)open_now : FD_UNKNOWN_OPEN;
    uint64_t ring = L->backend == NPYLOAD_IO_URING;
    uint64_t per_file = L->opt[NPYLOAD_OPT_DIRECT_IO] ? 2 : 1;
    uint64_t need = nworkers * (ring + per_file) + FD_RESERVE;
    uint64_t avail = soft > used ? soft - used : 0;
    if (need > avail)
        return npyl_loader_fail(L, -EMFILE, "%zu workers need at least %" PRIu64 " file "
                                "descriptors (%s%" PRIu64 " per open file each, %d kept "
                                "free), RLIMIT_NOFILE is %" PRIu64 " with %" PRIu64 " open: "
                                "raise it (ulimit -n) or use fewer workers", nworkers, need,
                                ring ? "1 io_uring ring + " : "", per_file, FD_RESERVE, soft,
                                used);
    uint64_t share = (avail - FD_RESERVE) / 2 / nworkers;
    uint64_t per = share > ring ? (share - ring) / per_file : 0;
    if (per < 1)
        per = 1; /* fits: need <= avail checked one file per worker */
    if (per > 256)
        per = 256;
    *per_worker = (unsigned)per;
    return 0;
}

static int open_cuda(npyload_loader *L)
{
    int dev = (int)L->opt[NPYLOAD_OPT_DEVICE];
    int pin = (int)L->opt[NPYLOAD_OPT_PIN_MEMORY];
    L->dev.device = dev;
    if (dev < 0 && pin != 1)
        return 0; /* host mode never loads CUDA unless pinning is required */
    char why[256] = "";
    int rc = npyl_cuda_open(&L->dev.cuda, dev >= 0 ? dev : 0, why, sizeof why);
    if (rc)
        return npyl_loader_fail(L, NPYLOAD_ENOCUDA, "%s: %s",
                                dev >= 0 ? "CUDA device requested but unusable"
                                         : "PIN_MEMORY=1 needs CUDA, which is unusable",
                                why);
    L->dev.pinned = pin != 0;
    return 0;
}

/* Step: worker count, slot count and queue depth, defaults resolved. */
/* Step: BATCH_SIZE has no default (after the fields, so that a bad file
 * is named first). */
static int need_batch_size(npyload_loader *L)
{
    if (L->opt[NPYLOAD_OPT_BATCH_SIZE] >= 1)
        return 0;
    return npyl_loader_fail(L, NPYLOAD_EINVAL, "BATCH_SIZE is not set: call "
                            "npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, n) before start "
                            "(it has no default)");
}

static int resolve_counts(npyload_loader *L, size_t *nworkers, size_t *prefetch, int *mode)
{
    int64_t W = L->opt[NPYLOAD_OPT_WORLD_SIZE], R = L->opt[NPYLOAD_OPT_RANK];
    if (R >= W)
        return npyl_loader_fail(L, NPYLOAD_EINVAL, "RANK %" PRId64 " must be below "
                                "WORLD_SIZE %" PRId64, R, W);
    int64_t nw = L->opt[NPYLOAD_OPT_NUM_WORKERS], pf = L->opt[NPYLOAD_OPT_PREFETCH];
    /* Sync: one worker context (io, buffers) used by next() itself; no
     * controller. Else 0 and NPYLOAD_AUTO hand the count to it. */
    L->sync = nw == NPYLOAD_WORKERS_SYNC;
    *mode = L->sync ? 0 : (nw <= 0 ? NPYL_AUTO_WORKERS : 0) | (pf <= 0 ? NPYL_AUTO_SLOTS : 0);
    *nworkers = L->sync ? 1 : nw > 0 ? (size_t)nw : DEFAULT_WORKERS;
    *prefetch = pf > 0 ? (size_t)pf
                       : (size_t)npyload_default_prefetch(L->sync ? nw : nw > 0 ? nw : 0);
    if (*prefetch > MAX_PREFETCH)
        *prefetch = MAX_PREFETCH;
    L->queue_depth = L->opt[NPYLOAD_OPT_QUEUE_DEPTH] ? (unsigned)L->opt[NPYLOAD_OPT_QUEUE_DEPTH]
                                                      : DEFAULT_QUEUE_DEPTH;
    return 0;
}

/* Step: the order parameters (fixed from here on but for the epoch) and the
 * buffers the epoch's order is built in. */
static int plan_order(npyload_loader *L)
{
    npyl_order_params *op = &L->ring.op;
    npyl_loader_order_of(L, op);
    op->epoch = 0; /* the first generation's is set by npyl_state_first_epoch */
    /* File sizes are kept for every mode: set_state may switch to LOCAL. */
    npyl_field *f0 = &L->fields[0];
    int64_t *sizes = malloc(f0->npaths * sizeof *sizes);
    if (!sizes)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    for (size_t k = 0; k < f0->npaths; k++)
        sizes[k] = f0->files[k].count;
    op->file_sizes = sizes; /* owned by the loader; freed with the tables */
    op->nfiles = f0->npaths;
    char oerr[256];
    int rc = npyl_order_check(op, oerr, sizeof oerr);
    if (rc)
        return npyl_loader_fail(L, rc, "%s", oerr);
    L->ring.delivered = npyl_order_delivered_len(op);
    L->ring.nbatches = npyl_order_num_batches(op);
    /* Sized for the larger of the drop_last cases: set_state may switch. */
    npyl_order_params keep = *op;
    keep.drop_last = 0;
    int64_t cap = npyl_order_delivered_len(&keep);
    if (cap < L->ring.delivered)
        cap = L->ring.delivered;
    L->ring.seqbuf = malloc((size_t)(cap ? cap : 1) * sizeof *L->ring.seqbuf);
    L->ring.seqspare = malloc((size_t)(cap ? cap : 1) * sizeof *L->ring.seqspare);
    if (!L->ring.seqbuf || !L->ring.seqspare)
        return npyl_loader_fail(L, -ENOMEM, "out of memory for the epoch's order (%" PRId64
                                " samples)", L->ring.delivered);
    return 0;
}

/* Step: a mixture (sources added): the mixture of the sources' sizes and
 * the weights given (epoch 0 on; npyl_state_first_epoch puts a restored
 * state's history in force), the ring's row buffers, the per-source
 * counters. */
static int plan_mix(npyload_loader *L)
{
    if (!L->nsources)
        return 0;
    L->src_samples = calloc(L->nsources, sizeof *L->src_samples);
    if (!L->src_samples)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    const npyl_order_params *op = &L->ring.op;
    int rc = npyl_state_mix_new(L, op->seed, op->shuffle, &L->ring.mix);
    if (rc)
        return rc;
    L->ring.src_off = L->src_off;
    size_t cap = 1;
    npyl_order_params keep = *op;
    keep.drop_last = 0;
    int64_t n = npyl_order_delivered_len(&keep);
    if (n > 0)
        cap = (size_t)n;
    L->ring.mixbuf = malloc(cap * sizeof *L->ring.mixbuf);
    L->ring.mixspare = malloc(cap * sizeof *L->ring.mixspare);
    if (!L->ring.mixbuf || !L->ring.mixspare)
        return npyl_loader_fail(L, -ENOMEM, "out of memory for the epoch's order (%" PRId64
                                " samples)", n);
    return 0;
}

/* Whether fields a and b split their samples into files alike: the same
 * number of files, each with the same first sample and count. */
static int same_files(const npyl_field *a, const npyl_field *b)
{
    if (a->npaths != b->npaths)
        return 0;
    for (size_t k = 0; k < a->npaths; k++)
        if (a->files[k].first != b->files[k].first || a->files[k].count != b->files[k].count)
            return 0;
    return 1;
}

/* Step: what the batch reader sees of the loader; per file its stored row
 * size (rb); and per field, the first field whose files split the samples
 * alike (files_as: the batch plan finds a row's file and runs once for
 * both). */
static int fill_read_view(npyload_loader *L)
{
    for (size_t fi = 0; fi < L->nfields; fi++) {
        npyl_field *f = &L->fields[fi];
        for (size_t k = 0; k < f->npaths; k++) {
            npyl_ffile *ff = &f->files[k];
            ff->rb = ff->nx ? f->row_bytes / ff->nx->itemsize : f->row_bytes;
        }
        f->files_as = fi;
        for (size_t g = 0; g < fi; g++)
            if (same_files(&L->fields[g], f)) {
                f->files_as = g;
                break;
            }
    }
    L->rv = (npyl_read_view){
        .fields = L->fields,
        .nfields = L->nfields,
        .stores = &L->stores,
        .direct_io = (int)L->opt[NPYLOAD_OPT_DIRECT_IO],
        .skip_errors = L->opt[NPYLOAD_OPT_ON_ERROR] == 1,
        .max_errors = L->opt[NPYLOAD_OPT_MAX_ERRORS],
        .st = &L->st,
        .skip = &L->skip,
    };
    return 0;
}

/* Step: one worker per thread (or the one of a synchronous loader): its io
 * context (descriptors, ring), request array, .npy.zst scratch and, in
 * device mode, copy stream (npyl_worker_init). */
static int create_workers(npyload_loader *L, size_t nworkers, size_t made)
{
    unsigned max_open = 1;
    /* Read-ahead gives each worker a second io context; when the
     * descriptors do not allow two, the workers read no ahead. */
    int ahead = read_ahead(L), rc = 0;
    if (ahead && plan_fd_budget(L, 2 * nworkers, &max_open) != 0) {
        ahead = 0;
        npyl_loader_clear(L);
    }
    if (!ahead && (rc = plan_fd_budget(L, nworkers, &max_open)))
        return rc;
    L->workers = calloc(nworkers, sizeof *L->workers);
    if (!L->workers)
        return npyl_loader_fail(L, -ENOMEM, "out of memory");
    L->nworkers = nworkers;
    npyl_worker_cfg cfg = {
        .io = {
            .backend = L->backend,
            .direct = (int)L->opt[NPYLOAD_OPT_DIRECT_IO],
            .queue_depth = L->queue_depth,
            .max_open = max_open,
            .random_access = L->opt[NPYLOAD_OPT_SHUFFLE] != NPYLOAD_SHUFFLE_NONE,
        },
        .rows = L->slot_rows ? (size_t)L->slot_rows : 1,
        .zst = L->zst,
        .raw_bytes = L->raw_bytes,
        .ahead = ahead,
    };
    for (size_t i = 0; i < L->nfields; i++) {
        const npyl_field *f = &L->fields[i];
        cfg.host_raw |= f->hxform;
        cfg.dev_raw |= f->dxform;
        if (f->hxform && f->tplan.aug && f->tplan.in_row_bytes > cfg.aug_bytes)
            cfg.aug_bytes = f->tplan.in_row_bytes;
    }
    char err[NPYL_ERRMSG_LEN];
    for (size_t i = 0; i < made; i++)
        if ((rc = npyl_worker_init(&L->workers[i], i, &L->env, &cfg, err, sizeof err)))
            return npyl_loader_fail(L, rc, "%s", err);
    L->ring.workers_on = made;
    npyl_auto_meas m = {.now_ns = npyl_now_ns()};
    npyl_auto_begin(&L->ctrl, &L->ring, L->workers, made, &L->env, &cfg, &L->dev, &m);
    return 0;
}

/* Step: the controller's first counts and ceilings (NPYLOAD_AUTO), within
 * MEMORY_BUDGET; fixed counts pass through. */
static int plan_auto(npyload_loader *L, int mode, size_t *nworkers, size_t *cap_workers,
                     size_t *prefetch, size_t *cap_slots)
{
    /* Workers that read ahead (READ_AHEAD 1, or the default where a batch
     * has work after its reads: transforms, .npy.zst) fill two slots each:
     * the controller's start and the workers' need count them (issue 37:
     * with one a worker could not read ahead while the slot before its
     * batch was still unread, and waited for its reads instead). */
    int ahead = read_ahead(L);
    uint64_t per = ahead ? 2 : 1;
    npyl_auto_setup su = {
        .mode = mode,
        .workers = *nworkers,
        .slots = *prefetch,
        .device_mode = L->dev.device >= 0,
        .ahead = ahead,
        .ahead_switch = L->opt[NPYLOAD_OPT_READ_AHEAD] == 0,
        .budget = (uint64_t)L->opt[NPYLOAD_OPT_MEMORY_BUDGET],
        .cores = L->opt[NPYLOAD_OPT_AUTO_CORES],
        .target_bp = L->opt[NPYLOAD_OPT_AUTO_TARGET],
        .force = L->opt[NPYLOAD_OPT_AUTO_FORCE],
        .slot_bytes = L->host_slot_bytes,
        /* read buffers: the transform rows (two with read-ahead), the
         * .npy.zst scratch, and a little for requests and io */
        .worker_bytes = per * (L->raw_bytes + (uint64_t)L->zst.max_csize +
                               (uint64_t)L->zst.max_multi_dsize) + (256u << 10),
    };
    char err[NPYL_ERRMSG_LEN];
    int rc = npyl_auto_plan(&L->ctrl, &su, nworkers, cap_workers, prefetch, cap_slots, err,
                            sizeof err);
    return rc ? npyl_loader_fail(L, rc, "%s", err) : 0;
}

static int start_ctl(npyload_loader *L);

int npyload_loader_start(npyload_loader *L)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int rc = npyl_loader_forked(L);
    if (rc || (rc = npyl_ctl_enter(L)))
        return rc;
    rc = start_ctl(L);
    npyl_ctl_leave(L);
    return rc;
}

/* start's body; the caller holds the control turn (npyl_ctl_enter). */
static int start_ctl(npyload_loader *L)
{
    int rc;
    if (L->started)
        return npyl_loader_fail(L, NPYLOAD_ESTATE, "the loader is already started");
    size_t nworkers = 0, prefetch = 0, cap_workers = 0, cap_slots = 0;
    int mode = 0;
    if ((rc = resolve_counts(L, &nworkers, &prefetch, &mode)))
        return rc;
    /* The fields a stop kept are read again when a file changed since. */
    if (L->fields_loaded && npyl_stores_changed(&L->stores))
        npyl_loader_drop_loaded_fields(L);
    if ((!L->fields_loaded && (rc = npyl_load_fields(L))) || (rc = need_batch_size(L)) || (rc = plan_transforms(L)) || (rc = plan_rows(L)) ||
        (rc = resolve_backend(L)) || (rc = open_cuda(L)) || (rc = open_tdev(L)) ||
        (rc = plan_layout(L)) || (rc = plan_auto(L, mode, &nworkers, &cap_workers, &prefetch,
                                                 &cap_slots)) || (rc = plan_order(L)) ||
        (rc = plan_mix(L)) ||
        (rc = alloc_slots(L, cap_workers, L->dev.device >= 0 ? prefetch : cap_slots,
                          prefetch)) || (rc = upload_all_tables(L)) ||
        (rc = fill_read_view(L)) || (rc = create_workers(L, cap_workers, nworkers)) ||
        (rc = npyl_state_first_epoch(L)))
        goto fail;
    L->started = 1;
    L->st.start_ns = npyl_now_ns();
    char err[NPYL_ERRMSG_LEN];
    if (!L->sync && (rc = npyl_workers_start(L->workers, nworkers, err, sizeof err))) {
        npyl_loader_fail(L, rc, "%s", err);
        L->started = 0;
        goto fail;
    }
    L->fields_loaded = 1;
    npyl_fill_start(L);
    npyl_loader_clear(L);
    return 0;
fail:
    /* Leave the loader as it was before start, so destroy stays simple and
     * the caller can read errmsg. */
    npyl_workers_stop(L->workers, L->nworkers, &L->env);
    L->ring.stopping = 0; /* no thread left: the ring is the caller's again */
    npyl_loader_free_started(L); /* fields and options stay; errmsg too */
    return rc;
}

int npyload_loader_stop(npyload_loader *L)
{
    if (!L)
        return NPYLOAD_EINVAL;
    int rc = npyl_loader_forked(L);
    if (rc || (rc = npyl_ctl_enter(L)))
        return rc;
    size_t held = atomic_load(&L->refs) - 1;
    if (!L->started) {
        rc = npyl_loader_fail(L, NPYLOAD_ESTATE, "stop: the loader is not started");
    } else if (held) {
        rc = npyl_loader_fail(L, NPYLOAD_ESTATE,
                              "stop: %zu batch%s still held: release %s first", held,
                              held == 1 ? " is" : "es are", held == 1 ? "it" : "them");
    } else {
        /* As a failed start leaves it, but with the fields as start read
         * them: the next start does not read the headers or probe the
         * remote objects again. Remote reads in flight give up at once. */
        npyl_stores_cancel(&L->stores, 1);
        npyl_workers_stop(L->workers, L->nworkers, &L->env);
        npyl_fill_stop(L);
        npyl_stores_cancel(&L->stores, 0);
        L->ring.stopping = 0;
        npyl_loader_free_started_keep_fields(L);
        npyl_loader_clear(L);
    }
    npyl_ctl_leave(L);
    return rc;
}
