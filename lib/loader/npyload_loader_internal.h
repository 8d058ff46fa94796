/* The loader object, shared by the top layer of lib/loader: the public API
 * and lifetime (npyload_loader.c, npyload_loader_next.c), setup
 * (npyload_loader_start.c, _fields.c, _options.c) and the resume state
 * (npyload_loader_state.c). Everything below this layer (worker, batch
 * read, slots, device) sees only the sub-structs it is handed, never
 * npyload_loader; README.md in this folder draws the layers.
 *
 * The loader is the sum of its parts: ring (the slots and the schedule,
 * npyload_loader_slots.h: its mutex mu and condition variables guard every
 * slot state, and its header has the concurrency model), dev (CUDA,
 * npyload_loader_device.h), rv + skip (what the batch reader sees,
 * npyload_loader_read.h), workers + env (npyload_loader_worker.h), st (the
 * counters), plus what setup owns (options, fields, file tables, sizes)
 * and the control turn below.
 *
 * Control calls: a second mutex (ctl) serialises start, set_epoch and
 * set_state (ctl_busy), each for its whole body, so the O(N) order is built
 * into the ring's seqspare, which only the ctl holder touches, without mu:
 * the workers never wait for an order being built. destroy marks the loader
 * (destroying), waits for the control call in progress, makes those still
 * waiting return NPYLOAD_ESTATE, and stops the ring, which wakes a next()
 * waiting for a batch (it returns NPYLOAD_ESTATE) and waits for it to leave
 * before anything is freed. Lock order: ctl is never taken with mu held.
 *
 * Lifetime: refs counts the caller's reference (dropped by destroy) and
 * one per batch handed out and not yet released. Destroy with batches held
 * joins the workers and frees everything but the HELD slots, the slot
 * arrays and handles, the fields and the CUDA context their release needs;
 * whoever drops the last reference (destroy, or the last release) frees the
 * rest (npyl_loader_unref). Nothing below the API calls back into it.
 */
#ifndef NPYLOAD_LOADER_INTERNAL_H
#define NPYLOAD_LOADER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "../common/npyload_common.h"
#include "../cuda/npyload_cuda.h"
#include "../cuda/npyload_cuda_transform.h"
#include "../io/npyload_io.h"
#include "../order/npyload_order.h"
#include "../remote/npyload_remote.h"
#include "../zst/npyload_zst.h"
#include "../transform/npyload_transform.h"
#include "npyload_loader_device.h"
#include "npyload_loader_field.h"
#include "npyload_loader_read.h"
#include "npyload_loader_slots.h"
#include "npyload_loader_worker.h"

#define DEFAULT_WORKERS 2
#define DEFAULT_WINDOW 8
#define DEFAULT_QUEUE_DEPTH 32
#define MAX_WORKERS 256
#define MAX_PREFETCH 1024
#define MAX_QUEUE_DEPTH 4096
#define DEV_ALIGN 256u

/* One past the largest npyload_option: the table's values are 1 .. count
 * (checked by static assertions next to opt_name). */
#define NPYL_XX_COUNT(name, value, doc) +1
enum { NPYL_NUM_OPTS = 1 NPYLOAD_OPTION_MAP(NPYL_XX_COUNT) };
#undef NPYL_XX_COUNT

/* npyload_loader_set_path: one past the largest npyload_path_option, and
 * the longest path (with its NUL). */
enum { NPYL_NUM_PATHS = NPYLOAD_PATH_KERNEL_CACHE + 1, NPYL_PATH_OPT_MAX = 4096 };

struct npyload_loader {
    /* The creating process. In any other (a fork() child) the threads that
     * the locks and the io contexts belong to do not exist and mu may be
     * held forever: every entry returns NPYLOAD_EFORKED and touches none of
     * it (npyl_loader_forked). */
    pid_t pid;
    _Atomic size_t refs;      /* 1 (the caller's, until destroy) + batches held */
    /* Control calls (start, set_epoch, set_state) and destroy; see above. */
    pthread_mutex_t ctl;
    pthread_cond_t ctl_cv;
    int ctl_busy;             /* [ctl] a control call runs */
    int ctl_waiting;          /* [ctl] control calls waiting for their turn */
    int destroying;           /* [ctl] destroy has begun */

    /* Setup: options and fields. */
    int64_t opt[NPYL_NUM_OPTS];
    char *paths[NPYL_NUM_PATHS]; /* npyload_loader_set_path: NULL = default */
    int state_pending;        /* set_state called before start */
    npyload_state pending;
    uint64_t epoch;           /* the first epoch (set_epoch before start) */
    npyl_field *fields;
    size_t nfields, cap_fields;
    /* Remote paths: the client (set_remote, or made with the defaults by
     * the first http(s):// field), whether set_remote configured it, and
     * whether a remote field was added (then set_remote is refused). Freed
     * (its secret wiped) by destroy. */
    npyl_remote *remote;
    int remote_set, remote_used;
    int (*interrupt)(void *); /* npyload_loader_set_interrupt, given to the */
    void *interrupt_arg;      /* client whenever one is made */

    /* Known after start (setup fills them; freed by free_started): */
    int started;
    int backend;              /* resolved npyload_io_backend */
    unsigned queue_depth;     /* resolved QUEUE_DEPTH */
    npyl_file_info *io_files; /* every file of every field */
    size_t nio_files;
    int fields_loaded;        /* the headers (and remote probes) of start are
                                 kept across npyload_loader_stop: the next
                                 start reuses them; adding a field, set_remote
                                 or ALIGN drop them */
    npyl_remote_obj *robjs;   /* per io file: its remote object (url NULL:
                                 local); NULL when no file is remote */
    int64_t n;                /* samples per field */
    int64_t slot_rows;        /* rows a slot holds: min(BATCH_SIZE, the
                                 most samples a rank gets per epoch) */
    uint64_t host_slot_bytes, dev_slot_bytes;
    uint64_t raw_bytes;       /* per worker: stored rows of transformed fields */
    npyl_zst_sizes zst;       /* .npy.zst files: the largest frames */
    int sync;                 /* NUM_WORKERS = NPYLOAD_WORKERS_SYNC: one
                                 worker context, no thread; next() reads */

    /* The parts below the API, each handed only what it needs. */
    npyl_ring ring;           /* slots and schedule; owns mu and the cvs */
    npyl_device dev;          /* CUDA: context, device, pinned, kernels */
    npyl_read_view rv;        /* the batch reader's view (filled at start) */
    npyl_skip_log skip;       /* last failure behind a skip */
    npyl_stats st;            /* counters */
    npyl_work_env env;        /* the workers' view: ring, rv, dev, st */
    npyl_worker *workers;
    size_t nworkers;

    char errmsg[NPYL_ERRMSG_LEN];
};

/* Sets L->errmsg and returns code. */
NPYL_HIDDEN int npyl_loader_fail(npyload_loader *L, int code, const char *fmt,
                                 ...) NPYL_PRINTF(3, 4);

/* 0 in the creating process; in a fork() child sets L->errmsg (the child's
 * own copy) and returns NPYLOAD_EFORKED. npyl_in_child is the same test for
 * const entries, without the message. */
NPYL_HIDDEN int npyl_loader_forked(npyload_loader *L);
NPYL_HIDDEN int npyl_in_child(const npyload_loader *L);
#define NPYL_FORKED_MSG                                                        \
    "loader used in a child process after fork(); create a new loader in "    \
    "the child"

/* Control calls: npyl_ctl_enter waits for the control call in progress to
 * finish, then owns the loader's order and position until npyl_ctl_leave.
 * Returns 0, or NPYLOAD_ESTATE (errmsg untouched: the loader is being freed)
 * once destroy has begun. */
NPYL_HIDDEN int npyl_ctl_enter(npyload_loader *L);
NPYL_HIDDEN void npyl_ctl_leave(npyload_loader *L);

/* npyload_loader_start.c: the backend NPYLOAD_IO_AUTO resolves to now
 * (io_uring when a probe ring works, else pread), with the reason io_uring
 * was passed over in why (may be NULL). Start and npyload_get_build_info
 * both ask it. */
NPYL_HIDDEN int npyl_loader_auto_backend(char *why, size_t whylen);

/* npyload_loader_fields.c: reads every field's headers at start, checks
 * them and fills the io file table and L->n. */
NPYL_HIDDEN int npyl_load_fields(npyload_loader *L);
/* Fields kept by npyload_loader_stop: 1 when a local file changed since
 * start read it (size, device and inode, mtime: what lib/io checks at each
 * read), else 0. Stats each local file; reads nothing. */
NPYL_HIDDEN int npyl_loaded_fields_changed(const npyload_loader *L);

/* npyload_loader_remote.c: a probed remote object as a reader (its head
 * and tail bytes from the probe, the rest by ranged GETs checked against
 * the probe's ETag), shared by start and npyload_remote_inspect. */
typedef struct npyl_rsrc {
    npyl_remote *r;
    const npyl_remote_probe *p;
    npyl_remote_obj o;
} npyl_rsrc;
NPYL_HIDDEN void npyl_rsrc_init(npyl_rsrc *s, npyl_remote *r, const npyl_remote_probe *p);
/* npyl_zst_read_fn over a npyl_rsrc. */
NPYL_HIDDEN int npyl_rsrc_read(void *ctx, void *buf, size_t n, uint64_t off);
/* The NPY header of a probed .npy (more bytes fetched when it is longer
 * than the head). */
NPYL_HIDDEN int npyl_rsrc_npy_header(npyl_rsrc *s, npyload_header *h, char *err, size_t errlen);
/* npyl_remote_want_tail for start: a .npy.zst (the seek table) and a
 * '|u1' .npy with bytes after its data (a narrowed store's trailer). */
NPYL_HIDDEN int npyl_rsrc_want_tail(const npyl_remote_probe *p);

/* npyload_loader_state.c: checks every field of a saved state against the
 * loader (n = its sample count, or -1 before start) and yields the order
 * parameters it selects (into *op) and the batch to resume at. */
NPYL_HIDDEN int npyl_state_check(npyload_loader *L, const npyload_state *st, int64_t n,
                                 npyl_order_params *op, int64_t *first_seq);

/* npyload_loader.c: frees what start allocated (the loader returns to its
 * pre-start state). */
NPYL_HIDDEN void npyl_loader_free_started(npyload_loader *L);
/* The same, keeping what start read of the fields (npyload_loader_stop). */
NPYL_HIDDEN void npyl_loader_free_started_keep_fields(npyload_loader *L);
/* Drops the fields kept by npyload_loader_stop (unstarted loader). */
NPYL_HIDDEN void npyl_loader_drop_loaded_fields(npyload_loader *L);
/* npyload_loader.c: drops a reference (destroy's, or a released batch's);
 * the last one frees the loader. */
NPYL_HIDDEN void npyl_loader_unref(npyload_loader *L);

#endif
