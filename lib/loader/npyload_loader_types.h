/* lib/loader's bottom layer: what a field is (its files, row layout and
 * transform) and the loader's counters. Types, and the one lookup of them
 * that more than one part needs (which file holds a sample): the
 * batch reader, the slots, the device copy and the worker all read these,
 * and none of them owns them (setup fills them at start, lifetime frees
 * them). See README.md in this folder for the layering. */
#ifndef NPYLOAD_LOADER_FIELD_H
#define NPYLOAD_LOADER_FIELD_H

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
} npyl_ffile;

typedef struct npyl_field {
    char *name;
    char **paths;         /* as added (glob already expanded, sorted) */
    size_t npaths;
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
} npyl_field;

/* The index in f->files of the file holding global sample s (files are in
 * sample order; s < the field's total). */
static inline size_t npyl_field_file_of(const npyl_field *f, int64_t s)
{
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
    _Atomic uint64_t blocked_ns;               /* off-CPU time in workers' reads */
    _Atomic uint64_t last_return_ns;           /* when next() last returned */
    uint64_t start_ns;                         /* set by start() */
} npyl_stats;

#endif
