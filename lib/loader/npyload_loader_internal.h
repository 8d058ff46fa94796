/* The loader's private state, shared by npyload_loader.c (setup, options,
 * validation, teardown: the rare paths) and npyload_pipeline.c (workers,
 * next(), release(): the hot path). Depends on every other module of lib/.
 *
 * Concurrency model, in one place:
 *  - One mutex (mu) guards every field below marked [mu]. Work is coarse
 *    (one lock round-trip per batch per stage, batches are megabytes), so a
 *    single lock is simpler than lock-free rings and never the bottleneck.
 *  - Workers sleep on work_cv until a batch can be claimed (a free staging
 *    slot and an unclaimed batch of the current generation), read it with no
 *    lock held, then publish it. The consumer sleeps on ready_cv until the
 *    batch with seq == next_seq of the current generation is published.
 *    In device mode, workers also wait on dev_cv for their turn to take a
 *    device slot: device slots are taken strictly in seq order, so a batch
 *    ahead can never occupy the last device slot while an earlier batch
 *    waits for one (that would deadlock the in-order consumer).
 *  - A second mutex (ctl) serialises the API's control calls: start,
 *    set_epoch and set_state run one at a time (ctl_busy), each for its whole
 *    body, so the O(N) order is built into seqspare, which only the ctl
 *    holder touches, without mu: the workers never wait for an order being
 *    built. destroy marks the loader (destroying), waits for the control
 *    call in progress, makes those still waiting return NPYLOAD_ESTATE, and
 *    wakes a next() waiting for a batch (it returns NPYLOAD_ESTATE), then
 *    waits for it to leave (in_next) before anything is freed. Lock order:
 *    ctl is never taken with mu held.
 *  - Batch handles: each slot has NPYL_HANDLES handles used in turn, one per
 *    hand-out; owner is the one the caller holds (NULL when none). release
 *    claims it with a compare-and-swap, so a second release of a handle, or
 *    a release of a handle whose slot was handed out again since (under
 *    another handle), finds owner != handle and is refused: no count moves.
 *  - A generation (gen) is one pass over an epoch's batches. set_epoch and
 *    set_state start a new generation; work of an older generation is
 *    discarded when it finishes (its slot goes back to FREE) — in-flight
 *    reads are never cancelled, they land in memory the loader still owns.
 *  - Device mode, staging slots: a worker queues the copy of its host slot
 *    on its own stream, records the slot's ev_done after it, and hands the
 *    slot back FREE with copy_pending set, without waiting: it goes on to
 *    read its next batch while the copy runs. Whoever claims a FREE slot
 *    with copy_pending waits on its ev_done (no lock held) before reading
 *    into it; claims prefer slots without a pending copy. The copy itself
 *    waits only on device events already recorded (the previous copy into
 *    the device slot, the consumer's release), so no host wait can deadlock.
 *    npyl_pipeline_stop waits for every pending copy before memory is freed.
 *  - Slots handed to the caller are HELD until released. Destroy with slots
 *    HELD joins the workers and frees everything but those slots, the slot
 *    arrays, the fields and the CUDA context their release needs ("zombie");
 *    the last release frees the rest. A device slot released on a stream that can be
 *    neither ordered by an event nor waited for is POISONED: never reused
 *    (see release() in npyload_pipeline.c).
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
#include "../zst/npyload_zst.h"
#include "../transform/npyload_transform.h"

#define NPYL_ERRMSG_LEN 1024
#define DEFAULT_WORKERS 2
#define DEFAULT_WINDOW 8
#define DEFAULT_QUEUE_DEPTH 32
#define MAX_WORKERS 256
#define MAX_PREFETCH 1024
#define MAX_QUEUE_DEPTH 4096
#define DEV_ALIGN 256u
/* Handles per slot, used in turn: a stale handle is recognised until its
 * slot has been handed out NPYL_HANDLES more times (see release()). */
#define NPYL_HANDLES 8

/* One past the largest npyload_option: the table's values are 1 .. count
 * (checked by static assertions next to opt_name). */
#define NPYL_XX_COUNT(name, value, doc) +1
enum { NPYL_NUM_OPTS = 1 NPYLOAD_OPTION_MAP(NPYL_XX_COUNT) };
#undef NPYL_XX_COUNT

/* One file of a field, after start. */
typedef struct npyl_ffile {
    uint32_t io_index;    /* index into loader->io_files */
    int64_t first;        /* global sample index of its first row */
    int64_t count;        /* rows */
    uint64_t data_offset;
    npyl_zst_index *zst;  /* a .npy.zst: its frame index (owned); NULL: .npy */
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
    float *tmean, *tstd;
    npyl_tplan tplan;
    int xform;
    uint64_t out_row_bytes; /* bytes per delivered row (row_bytes without) */
    uint64_t raw_off;
} npyl_field;

enum { SLOT_FREE = 0, SLOT_FILLING, SLOT_READY, SLOT_HELD, SLOT_POISONED };

/* A slot: host staging memory (host slots) or device memory (device slots).
 * In host mode the host slots are also the batches handed out. */
typedef struct npyl_slot {
    int state;            /* [mu] SLOT_* */
    uint64_t gen;         /* [mu] generation it was filled for */
    int64_t seq;          /* [mu] batch position in the rank's epoch */
    uint64_t epoch;       /* the epoch it belongs to */
    size_t rows;
    int64_t *indices;     /* batch_size entries */
    int err;              /* a failed batch carries its error in order */
    char *errmsg;         /* NPYL_ERRMSG_LEN, only when err != 0 */
    uint8_t *mem;
    npyload_array *arrays; /* one per field, pointing into mem */
    npyload_batch *handles; /* NPYL_HANDLES handles, one per hand-out in turn;
                               kept until the loader is freed (a zombie keeps
                               them all) so a stale handle is never dangling */
    uint64_t handouts;    /* [mu] times the slot was handed out */
    _Atomic(npyload_batch *) owner; /* the handle the caller holds, or NULL:
                                       set by next() under mu, cleared by the
                                       release that wins the CAS */
    /* device mode: */
    void *ev_done, *ev_release; /* copy done (recorded by the copying
                                   worker; on a staging slot: the copy that
                                   reads it), slot released (by the consumer;
                                   device slots only) */
    void *ev_start;       /* staging slots: before the copy (timing); created
                             by the first worker that copies from the slot */
    int release_pending;  /* [mu] ev_release recorded and not yet waited on */
    int copy_pending;     /* [mu] staging slot: ev_done not yet waited on */
} npyl_slot;

struct npyload_batch {
    npyload_loader *L;
    npyl_slot *slot;
    int device_mode;
    int64_t seq;          /* the hand-out's batch and epoch (for messages) */
    uint64_t epoch;
};

typedef struct npyl_worker {
    npyload_loader *L;
    pthread_t thread;
    int started;
    npyl_io *io;
    npyl_io_req *reqs;    /* batch_size x nfields capacity */
    uint8_t **dst;        /* nfields: where each field's rows land */
    uint8_t *raw;         /* host mode with transforms: one batch of the
                             transformed fields' stored rows (raw_bytes) */
    void *draw;           /* device mode with transforms: the same on the
                             device; reused in stream order */
    void *stream;         /* device mode: this worker's copy stream */
    char errmsg[NPYL_ERRMSG_LEN];
    /* .npy.zst reading (npyload_pipeline_read.c), sized at start: */
    ZSTD_DCtx *dctx;      /* reused for every frame */
    uint8_t *zsrc;        /* compressed frames, NPYL_DIRECT_ALIGN-aligned */
    size_t zsrc_cap;
    uint8_t *zdst;        /* the decode window of a frame of several samples
                             (at most 1 MiB; npyload_zst_frame.c) */
    size_t zdst_cap;
    struct npyl_zrow *zrows; /* batch_size x nfields: rows grouped by frame */
} npyl_worker;

struct npyload_loader {
    /* The creating process. In any other (a fork() child) the threads that
     * mu, the cvs and the io contexts belong to do not exist and mu may be
     * held forever: every entry returns NPYLOAD_EFORKED and touches none of
     * it (npyl_loader_forked). */
    pid_t pid;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, ready_cv, dev_cv;
    /* Control calls (start, set_epoch, set_state) and destroy; see above. */
    pthread_mutex_t ctl;
    pthread_cond_t ctl_cv;
    int ctl_busy;             /* [ctl] a control call runs */
    int ctl_waiting;          /* [ctl] control calls waiting for their turn */
    int destroying;           /* [ctl] destroy has begun */
    int in_next;              /* [mu] next() calls inside */

    int64_t opt[NPYL_NUM_OPTS];
    int state_pending;        /* set_state called before start */
    npyload_state pending;

    npyl_field *fields;
    size_t nfields, cap_fields;

    /* Known after start: */
    int started;
    int backend;              /* resolved npyload_io_backend */
    unsigned queue_depth;     /* resolved QUEUE_DEPTH */
    npyl_file_info *io_files; /* every file of every field */
    size_t nio_files;
    int64_t n;                /* samples per field */
    int64_t slot_rows;        /* rows a slot holds: min(BATCH_SIZE, the
                                 most samples a rank gets per epoch) */
    uint64_t host_slot_bytes, dev_slot_bytes;
    uint64_t raw_bytes;       /* per worker: stored rows of transformed fields */
    npyl_tdev *tdev;          /* device transforms: the loaded kernels */
    int sync;                 /* NUM_WORKERS = NPYLOAD_WORKERS_SYNC: one
                                 worker context, no thread; next() reads */
    npyl_cuda *cuda;          /* NULL unless device mode or pinned */
    int device;               /* -1 host */
    int pinned;
    npyl_slot *hslots;        /* staging (host) slots */
    size_t nh;
    npyl_slot *dslots;        /* device slots (device mode) */
    size_t nd;
    npyl_worker *workers;
    size_t nworkers;

    /* Order of the current generation. [mu] */
    npyl_order_params op;
    int64_t *seqbuf;          /* this rank's delivered indices for the epoch */
    int64_t *seqspare;        /* the next order is built here, then swapped */
    int64_t delivered;        /* entries in seqbuf */
    int64_t nbatches;
    uint64_t gen;
    uint64_t epoch;
    int64_t next_seq;         /* next batch next() hands out */
    int64_t claim_seq;        /* next batch a worker claims */
    int64_t dev_next_seq;     /* next batch to take a device slot */
    int64_t gen_first_seq;    /* where the generation began (resume) */

    size_t held;              /* [mu] batch slots held by the caller */
    int failed;               /* [mu] until set_epoch: 1 an error was handed
                                 out; 2 a release poisoned a slot (errmsg
                                 says why; next() returns NPYLOAD_ECUDA) */
    int stopping;             /* [mu] workers exit */
    int zombie;               /* [mu] destroyed with batches held */

    /* Counters, read without the lock. */
    _Atomic uint64_t st_bytes, st_batches, st_samples, st_wait_ns, st_io_ns,
        st_h2d_bytes, st_h2d_ns;
    _Atomic uint64_t st_skipped, st_errors; /* ON_ERROR skip */
    char skip_msg[NPYL_ERRMSG_LEN];  /* [mu] last failure behind a skip */

    /* .npy.zst files (npyload_loader_fields.c): the largest frame of any. */
    int has_zst;
    uint32_t zst_max_csize;       /* any frame, compressed */
    uint32_t zst_max_multi_dsize; /* frames of several samples, decompressed */
    _Atomic uint64_t st_zcbytes, st_zdbytes, st_zdecode_ns;
    _Atomic uint64_t st_transform_ns; /* host transforms */

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

/* npyload_loader_fields.c: reads every field's headers at start, checks
 * them and fills the io file table and L->n. */
NPYL_HIDDEN int npyl_load_fields(npyload_loader *L);

/* npyload_loader_state.c: checks every field of a saved state against the
 * loader (n = its sample count, or -1 before start) and yields the order
 * parameters it selects (into *op) and the batch to resume at. */
NPYL_HIDDEN int npyl_state_check(npyload_loader *L, const npyload_state *st, int64_t n,
                                 npyl_order_params *op, int64_t *first_seq);

/* npyload_pipeline_read.c: reads slot h's rows (h->indices, h->rows) of
 * field fi to dst[fi] + row * row_bytes, through w's io context. With
 * ON_ERROR skip, failed rows are dropped (h->rows and h->indices shrink,
 * the good rows packed to the front). Returns 0 or the error, with the
 * message in w->errmsg; *bytes accumulates what landed. No lock held. */
NPYL_HIDDEN int npyl_read_batch(npyload_loader *L, npyl_worker *w, npyl_slot *h,
                                uint8_t *const *dst, uint64_t *bytes);

/* npyload_pipeline_read.c: a worker's .npy.zst state (decompression
 * context, scratch buffers), sized from L's largest frames; nothing when the
 * loader has no .npy.zst file. 0 or -ENOMEM (message in L->errmsg). The
 * free is idempotent. */
NPYL_HIDDEN int npyl_read_worker_init(npyload_loader *L, npyl_worker *w);
NPYL_HIDDEN void npyl_read_worker_free(npyl_worker *w);

/* npyload_pipeline.c: */
/* Sync mode: claims and fills the next batch on the calling thread (the
 * worker body once). Called with mu held; returns with mu held. Returns 1
 * when a batch was processed, 0 when none can be claimed now. */
NPYL_HIDDEN int npyl_pipeline_step(npyload_loader *L);
/* Starts the worker threads (after slots and io contexts exist). */
NPYL_HIDDEN int npyl_pipeline_start(npyload_loader *L);
/* Stops and joins the workers; in-flight reads and copies complete first. */
NPYL_HIDDEN void npyl_pipeline_stop(npyload_loader *L);
/* Begins a generation with order parameters `op` (its epoch included) at
 * batch first_seq. Called by the ctl holder without mu (it builds the order
 * into seqspare unlocked, then takes mu to install it; ctl keeps any other
 * builder out). Clears errmsg on success. Returns 0 or -ENOMEM, in which case
 * nothing changed. */
NPYL_HIDDEN int npyl_pipeline_reset(npyload_loader *L, const npyl_order_params *op,
                                    int64_t first_seq);
/* npyload_loader.c: frees what start allocated (the loader returns to its
 * pre-start state), or everything including the loader itself. */
NPYL_HIDDEN void npyl_loader_free_started(npyload_loader *L);
NPYL_HIDDEN void npyl_loader_free(npyload_loader *L);

#endif
