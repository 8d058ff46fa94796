/* lib/loader's bottom layer: what a field is (its files, row layout and
 * transform) and the loader's counters. Types, and the one lookup of them
 * that more than one part needs (which file holds a sample): the
 * batch reader, the slots, the device copy and the worker all read these,
 * and none of them owns them (setup fills them at start, lifetime frees
 * them). See README.md in this folder for the layering. */
#ifndef NPYLOAD_LOADER_FIELD_H
#define NPYLOAD_LOADER_FIELD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "../common/npyload_common.h"
#include "../store/npyload_store.h"
#include "../transform/npyload_transform.h"
#include "../zst/npyload_zst.h"

#define NPYL_ERRMSG_LEN 1024

/* One file of a field, after start. */
typedef struct npyl_ffile {
    uint32_t io_index;    /* index into the loader's io file table */
    int64_t first;        /* global sample index of its first row */
    int64_t count;        /* rows */
    uint64_t data_offset;
    npyl_zst_index *zst;  /* a .npy.zst: its frame index (owned); NULL: .npy */
    npyl_zst_narrow *nx;  /* a stored narrowed .npy (codes + trailer): its
                             value table (owned); rows are read as codes and
                             expanded; NULL otherwise */
    uint64_t rb;          /* stored bytes per row: the field's row_bytes, or
                             a narrowed file's codes (set at start,
                             fill_read_view) */
} npyl_ffile;

/* One source's own transform of a field (npyl_field.sxf). */
typedef struct npyl_sxf {
    int set;
    npyload_transform tdesc;
    float *tvals[4];      /* its own copies of mean, std, hflip_sign, vflip_sign */
} npyl_sxf;

typedef struct npyl_field {
    char *name;
    char **paths;         /* as added (glob already expanded, sorted) */
    size_t npaths;
    size_t *src_first;    /* a mixture: the first path of each source, in
                             source order (nsrc entries, one per source
                             that added the field so far) */
    size_t nsrc;
    /* Known after start: */
    npyl_ffile *files;
    char descr[NPYLOAD_DESCR_LEN];
    size_t itemsize;
    int sndim;            /* per-sample ndim */
    int64_t sshape[NPYLOAD_MAX_DIMS];
    uint64_t row_bytes;   /* bytes per sample */
    uint64_t host_off;    /* where the field starts in a host slot */
    uint64_t dev_off;     /* where the field starts in a device slot */
    /* Transform (npyload_loader_set_transform): the description with its
     * own copies of mean/std, then at start its plan. xform: the plan is
     * not the identity, so the stored rows go through the worker's raw
     * buffer (host mode) or its device raw buffer (device mode), at
     * raw_off, and the slot holds out_row_bytes per row. */
    int has_transform;
    npyload_transform tdesc;
    float *tvals[4];      /* its own copies of mean, std, hflip_sign, vflip_sign */
    /* A mixture's per-source transforms (npyload_loader_set_source_
     * transform): nsxf entries (the sources when last set); sxf[k].set:
     * source k's rows take sxf[k].tdesc instead of tdesc. At start, when
     * any is set: splans, one plan per source (nsources entries, those
     * not set planned from tdesc or the identity), every one delivering
     * the same dtype, shape and layout; tplan is then the plan of the
     * first source that augments (else that transforms, else source 0),
     * so its flags (aug, identity) and row sizes are the field's. */
    struct npyl_sxf *sxf;
    size_t nsxf;
    npyl_tplan *splans;
    npyl_tplan tplan;     /* with has_transform, or the identity plan of a
                             field whose codes the device expands */
    int xform;            /* hxform or dxform */
    int hxform;           /* xform by the host engine in the worker: host
                             mode, and in device mode a transform the
                             kernels cannot run but the host can (an
                             augmentation past their limits, or kernels
                             that did not load): stored rows in the raw
                             buffer, output rows in the staging slot,
                             which crosses PCIe as output */
    int dxform;           /* xform by the kernels after the copy: the
                             stored rows (or codes) cross PCIe into the
                             worker's device raw buffer */
    int dnarrow;          /* dxform of a field whose files are all narrowed:
                             the reader delivers the one-byte codes (checked
                             against the tables) and the kernel expands them
                             through dtables, fused with the transform */
    int drows;            /* dxform with per-row records (augmentation or
                             dnarrow): rows x npyl_tdev_row at rec_host_off
                             in the staging slot and rec_raw_off in the
                             device raw buffer, written by the copying
                             worker and copied with the rows */
    void *dtables;        /* dnarrow: one table per file (npaths x
                             NPYL_TDEV_TABLE values) on the device; owned,
                             freed with the slots */
    char engine[768];     /* where the transform / expansion runs and why
                             (npyload_loader_field_engine) */
    uint64_t stage_row_bytes; /* bytes per row the reader writes: row_bytes,
                                 or with dnarrow the codes (one per value) */
    uint64_t out_row_bytes; /* bytes per delivered row (row_bytes without) */
    uint64_t raw_off;
    uint64_t rec_host_off, rec_raw_off;
    int64_t per_file;     /* every file but the last holds this many
                             samples (> 0): a sample's file is a division
                             (npyl_field_file_of); 0: they differ */
    size_t files_as;      /* the first field (index) whose files hold the
                             same samples (same count, same first sample
                             each): a batch's rows fall into the same files
                             and runs for both, planned once (set at start,
                             fill_read_view) */
} npyl_field;

/* Whether rows of f go through a transform plan: its own transform, or
 * a source's (a field without either may still have the identity plan of
 * narrowed codes). */
static inline int npyl_field_transformed(const npyl_field *f)
{
    return f->has_transform || f->splans;
}

/* The plan of row r of a batch, by its source (src: the row's source,
 * or -1 outside a mixture): splans[src] with per-source transforms, else
 * tplan. */
static inline const npyl_tplan *npyl_field_plan(const npyl_field *f, int64_t src)
{
    return f->splans && src >= 0 ? &f->splans[src] : &f->tplan;
}

/* The index in f->files of the file holding global sample s (files are in
 * sample order; 0 <= s < the field's total): a division when the files
 * hold the same count (per_file), else a binary search. */
static inline size_t npyl_field_file_of(const npyl_field *f, int64_t s)
{
    if (f->per_file > 0) {
        size_t k = (size_t)(s / f->per_file);
        return k < f->npaths ? k : f->npaths - 1;
    }
    size_t lo = 0, hi = f->npaths;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (f->files[mid].first <= s)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The loader's counters (npyload_loader_get_stats), added to without a
 * lock by whichever part did the work. */
typedef struct npyl_stats {
    _Atomic uint64_t bytes, batches, samples, wait_ns, io_ns, h2d_bytes, h2d_ns;
    _Atomic uint64_t skipped, errors;          /* ON_ERROR skip: rows the
                                                  readers dropped (MAX_ERRORS
                                                  judges them), failed reads */
    _Atomic uint64_t skipped_out;              /* rows missing from batches
                                                  handed out (samples_skipped) */
    _Atomic uint64_t zcbytes, zdbytes, zdecode_ns; /* .npy.zst */
    _Atomic uint64_t transform_ns;             /* host transforms */
    _Atomic uint64_t ahead, read_wait_ns;      /* read-ahead */
    _Atomic uint64_t step_ns, cpu_ns;          /* consumer step, worker CPU */
    _Atomic uint64_t fill_wait_ns;             /* next()'s wait for the first
                                                  batch of each generation */
    _Atomic uint64_t blocked_ns;               /* off-CPU time in workers' reads */
    _Atomic uint64_t last_return_ns;           /* when next() last returned */
    uint64_t start_ns;                         /* set by start() */
} npyl_stats;

/* ---- the batch reader's types (npyload_loader_read*.c) ---- */

/* The last failure behind a skipped sample (npyload_loader_last_skip_error),
 * with its own lock: workers write it while reading, any thread reads it. */
typedef struct npyl_skip_log {
    pthread_mutex_t mu;
    char msg[NPYL_ERRMSG_LEN];
} npyl_skip_log;

/* What the reader needs of the loader, filled once at start. */
typedef struct npyl_read_view {
    const npyl_field *fields;
    size_t nfields;
    const npyl_stores *stores; /* the file table, read through the stores */
    int direct_io;        /* DIRECT_IO: frames placed for O_DIRECT */
    int skip_errors;      /* ON_ERROR == skip */
    int64_t max_errors;   /* MAX_ERRORS (0: no limit) */
    npyl_stats *st;       /* counters it adds to */
    npyl_skip_log *skip;
} npyl_read_view;

/* The buffers of one batch's reads: its requests, its rows of .npy.zst
 * files grouped by frame, and the compressed frames (placed for O_DIRECT).
 * A worker has two, so that the next batch's reads fill one while the
 * current batch decodes out of the other. The plan of the batch they hold
 * (nraw .. cb) travels with them from npyl_read_begin to npyl_read_end. */
typedef struct npyl_read_buf {
    npyl_req *reqs;       /* rows x nfields capacity */
    const struct npyl_ffile **rff; /* per raw request: its file when that is
                                      a stored narrowed .npy (codes to
                                      expand), else NULL */
    struct npyl_zrow *zrows; /* rows x nfields: rows grouped by frame */
    struct npyl_prun *runs; /* rows: the batch's runs of consecutive samples
                               of one file, shared by fields of the same
                               files_as (npyload_loader_read_plan.c) */
    uint8_t *zsrc;        /* compressed frames, NPYL_DIRECT_ALIGN-aligned */
    size_t zsrc_cap;
    size_t nraw, nz;      /* raw requests; .npy.zst rows */
    size_t nnx;           /* raw requests of stored narrowed files */
    size_t nreq, u0, u;   /* this round: requests; its frames' rows [u0, u) */
    uint64_t cb;          /* this round: compressed bytes */
    int rc;               /* read-ahead: the first round's result (its */
    size_t bad;           /* failed request, the bytes that landed), */
    uint64_t got;         /* kept by npyl_read_wait for npyl_read_end */
} npyl_read_buf;

struct npyl_ahead;        /* the read-ahead thread (npyload_loader_read.c) */
/* A run of a batch's rows: rows [r, r + n) are consecutive samples of the
 * field's file k (files[k]). */
typedef struct npyl_prun {
    uint32_t r, n, k;
} npyl_prun;

/* One row of a batch that lives in a .npy.zst file. */
typedef struct npyl_zrow {
    uint32_t field;
    uint32_t file;        /* io index */
    uint32_t frame;
    uint32_t row;         /* position in the batch */
    uint64_t local;       /* sample index inside the file */
    uint64_t src;         /* where its frame's compressed bytes land in zsrc */
    const npyl_ffile *ff;
} npyl_zrow;

/* Counters of one batch, added to the loader's once at the end. */
typedef struct npyl_zstats {
    uint64_t cbytes, dbytes, ns;
} npyl_zstats;


/* One worker's reading state: its stores' contexts (descriptors, ring, an
 * HTTP multi handle), its two
 * batch buffers, the .npy.zst decoder and window, the read-ahead thread
 * with its own io context when read-ahead is on, and the message of its
 * last failure. */
typedef struct npyl_read_ctx {
    npyl_sctx io;         /* this thread's contexts of the stores */
    int opened;           /* io opened (a failure before is the stores') */
    npyl_read_buf buf[2];
    unsigned cur;         /* the buffer npyl_read_batch / _end use */
    ZSTD_DCtx *dctx;      /* reused for every frame */
    uint8_t *zdst;        /* the decode window of a frame of several samples
                             (at most 1 MiB; npyload_zst_frame.c) */
    size_t zdst_cap;
    struct npyl_ahead *ahead; /* NULL: no read-ahead */
    int read_here;        /* the batch begun was read by npyl_read_begin */
    size_t *kept;         /* ON_ERROR skip: after a read that dropped rows,
                             kept[r] is the position, in the batch as given,
                             of the row now at r (read_skip.c) */
    char errmsg[NPYL_ERRMSG_LEN];
} npyl_read_ctx;

/* Sizes of the .npy.zst scratch: the largest frame of any file, compressed,
 * and of frames of several samples, decompressed (0, 0: no .npy.zst). */
typedef struct npyl_zst_sizes {
    int any;
    uint32_t max_csize, max_multi_dsize;
} npyl_zst_sizes;

#endif
