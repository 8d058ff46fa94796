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
#include "../order/npyload_order.h"
#include "../order/npyload_mix.h"
#include "../store/npyload_store.h"
#include "../zst/npyload_zst.h"
#include "../transform/npyload_transform.h"
#include "npyload_loader_device.h"
#include "npyload_loader_types.h"
#include "npyload_loader_read.h"
#include "npyload_loader_slots.h"
#include "npyload_loader_worker.h"
#include "npyload_loader_auto.h"

#define DEFAULT_WORKERS 2
#define DEFAULT_WINDOW 8
#define DEFAULT_QUEUE_DEPTH 32
#define MAX_WORKERS 256
#define MAX_PREFETCH 1024
#define MAX_QUEUE_DEPTH 4096
#define DEV_ALIGN 256u

/* One past the largest npyload_option. The table's values are positive
 * but need not be contiguous: a union of one char[value] per option is as
 * large as the largest value (checked by static assertions next to
 * opt_name). */
#define NPYL_XX_SIZE(name, value, doc) char name[value];
union npyl_opt_largest { NPYLOAD_OPTION_MAP(NPYL_XX_SIZE) };
#undef NPYL_XX_SIZE
enum { NPYL_NUM_OPTS = (int)sizeof(union npyl_opt_largest) + 1 };

/* npyload_loader_set_path: one past the largest npyload_path_option, and
 * the longest path (with its NUL). */
enum { NPYL_NUM_PATHS = NPYLOAD_PATH_KERNEL_CACHE + 1, NPYL_PATH_OPT_MAX = 4096 };

/* Who writes what. Every member has one writer file, named in brackets, or
 * one documented lock: [ctl] the control turn (npyl_ctl_enter: start, stop,
 * set_epoch, set_state, begin_pass, destroy), [mu] the ring's mutex (only
 * npyload_loader_slots.c takes it), [msg] the message lock. Setup calls
 * (add_field, set, set_transform, set_remote, set_path) run before start
 * on one thread at a time (npyload.h, "Threads"). Teardown
 * (npyload_loader.c's free_started and loader_free) frees what the others
 * made, once no other thread can touch it. */
struct npyload_loader {
    /* [create] The creating process. In any other (a fork() child) the
     * threads that the locks and the io contexts belong to do not exist and
     * mu may be held forever: every entry returns NPYLOAD_EFORKED and
     * touches none of it (npyl_loader_forked). */
    pid_t pid;
    _Atomic size_t refs;      /* 1 (the caller's, until destroy) + batches
                                 held: next.c adds at hand-out, loader.c's
                                 unref drops */
    /* [loader.c] Control calls and destroy; see above. */
    pthread_mutex_t ctl;
    pthread_cond_t ctl_cv;
    int ctl_busy;             /* [ctl] a control call runs */
    int ctl_waiting;          /* [ctl] control calls waiting for their turn */
    int destroying;           /* [ctl] destroy has begun */

    /* [options.c] Options (state.c's set_state adopts seed, shuffle and
     * drop_last through npyl_loader_adopt_order). */
    int64_t opt[NPYL_NUM_OPTS];
    char *paths[NPYL_NUM_PATHS]; /* npyload_loader_set_path: NULL = default */
    /* [state.c, ctl] The position before start and the pass rules: what
     * the next begin_pass does (NPYL_PASS_*), whether set_epoch with the
     * restored epoch keeps a restored position, a state restored before
     * start (checked, applied by start), the first epoch. */
    int pass_rule;
    int keep_restored;
    int state_pending;        /* set_state called before start */
    npyload_state pending;
    int pending_ended;        /* its pass had ended */
    uint64_t epoch;           /* the first epoch (set_epoch before start) */
    /* [fields.c] The fields (their transform descriptions: options.c's
     * set_transform; their plans, at start: start.c). */
    npyl_field *fields;
    size_t nfields, cap_fields;
    /* [fields.c] A mixture (npyload_loader_add_source): the sources'
     * names in order (K = nsources; 0: no mixture); at start (fields.c)
     * each source's samples and first global sample index: the fields are
     * each source's files in source order, so source k's sample i is the
     * fields' global sample src_off[k] + i. */
    char **src_names;
    size_t nsources, cap_sources;
    int64_t *src_n, *src_off;
    /* [state.c, ctl] The weights given (K doubles; 1.0 each until
     * set_weights), and whether set_weights came after a state restored
     * before start (then start applies them at the restored position). */
    double *weights;
    int weights_given;        /* set_weights was called (else, at start, each
                                 source's weight is its sample count) */
    int weights_after_state;
    /* [state.c, ctl] A restored state's mixture (npyl_mix_state_save's
     * form) waiting for start; and from start the mixture itself, used by
     * the ctl holder only (it builds each generation's order through the
     * ring, npyl_slots_reset). */
    unsigned char *mix_pending;
    size_t mix_pending_len;
    npyl_mix *mix;
    /* [next.c] rows handed out per source (K atomics, from start) and the
     * running digest (npyload_loader_digest) under dig_mu, a leaf lock;
     * state.c restores it. */
    _Atomic uint64_t *src_samples;
    pthread_mutex_t dig_mu;
    uint64_t digest, digest_rows;
    /* [fields.c, options.c, through lib/store] The stores the fields' files
     * are read through: their configurations (set_remote), the stores
     * opened by add_field, and from start the file table. Closed (a remote
     * secret wiped) by destroy. */
    npyl_stores stores;

    /* [start.c] Known after start (freed by free_started): */
    int started;
    int backend;              /* resolved npyload_io_backend */
    unsigned queue_depth;     /* resolved QUEUE_DEPTH */
    int fields_loaded;        /* [fields.c] the headers (and probes) of start
                                 and the stores' file table are kept across
                                 npyload_loader_stop: the next start reuses
                                 them; adding a field, set_remote or ALIGN
                                 drop them */
    int64_t n;                /* [fields.c] samples per field, once read */
    int64_t slot_rows;        /* rows a slot holds: min(BATCH_SIZE, the
                                 most samples a rank gets per epoch) */
    uint64_t host_slot_bytes, dev_slot_bytes;
    uint64_t raw_bytes;       /* per worker: stored rows of transformed fields */
    npyl_zst_sizes zst;       /* [fields.c] .npy.zst files: the largest frames */
    int sync;                 /* NUM_WORKERS = NPYLOAD_WORKERS_SYNC: one
                                 worker context, no thread; next() reads */

    /* The parts below the API, each handed only what it needs. */
    npyl_ring ring;           /* [slots.c, mu] slots and schedule */
    npyl_device dev;          /* [start.c] CUDA: context, device, pinned,
                                 kernels */
    npyl_read_view rv;        /* [start.c] the batch reader's view */
    npyl_skip_log skip;       /* [read_skip.c, its own lock] last failure
                                 behind a skip */
    npyl_stats st;            /* atomics: whoever did the work counts */
    npyl_work_env env;        /* [create] the workers' view: ring, rv, dev, st */
    npyl_worker *workers;     /* [start.c] the array (nworkers); the first
                                 npyl_auto_made(&ctrl) are initialised */
    size_t nworkers;
    /* [fill.c, ctl] The background cache fill (NPYLOAD_OPT_CACHE_FILL):
     * made by the first start that fills, its thread stopped by stop and
     * destroy, freed with the loader; read by stats on any thread. */
    struct npyl_fill *fill;
    npyl_auto ctrl;           /* [start.c, then ctl] the controller
                                 (NPYLOAD_AUTO): npyload_loader_auto.h */

    /* [msg] The text of the last failure: written only through
     * npyl_loader_fail / _msg / _clear (npyload_loader.c), under msg_mu, a
     * leaf lock (nothing is taken under it); parts below the API write
     * their messages into buffers of their own (a slot's, a reading
     * context's) and their callers pass them on. */
    pthread_mutex_t msg_mu;
    char errmsg[NPYL_ERRMSG_LEN];
};

/* What the next begin_pass does (npyload_loader_state.c): npyload_pass. */
enum { NPYL_PASS_START = NPYLOAD_PASS_START, NPYL_PASS_RESUME = NPYLOAD_PASS_RESUME,
       NPYL_PASS_ADVANCE = NPYLOAD_PASS_ADVANCE };

/* Sets L->errmsg (under msg_mu) and returns code. */
NPYL_HIDDEN int npyl_loader_fail(npyload_loader *L, int code, const char *fmt,
                                 ...) NPYL_PRINTF(3, 4);
/* L->errmsg = msg, or "" (under msg_mu). */
NPYL_HIDDEN void npyl_loader_msg(npyload_loader *L, const char *msg);
NPYL_HIDDEN void npyl_loader_clear(npyload_loader *L);

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

/* npyload_loader_fields.c: adds a store to the loader's set, asked before
 * the built-in ones which paths it reads (arg: its configuration). Before
 * any field is added. The tests register their fault-injecting store so
 * (tests/tu_store_fault.c). */
NPYL_HIDDEN int npyl_loader_register_store(npyload_loader *L, const npyl_store_ops *ops,
                                           const void *arg);

/* npyload_loader_fields.c: reads every field's headers at start, checks
 * them and fills the stores' file table and L->n. */
NPYL_HIDDEN int npyl_load_fields(npyload_loader *L);

/* npyload_loader_state.c: the first generation of a start, at the
 * position set_epoch or set_state chose before it. */
NPYL_HIDDEN int npyl_state_first_epoch(npyload_loader *L);

/* npyload_loader_fields.c: 0 when the last source begun added every field
 * of source 0 (or there are no sources), else fails naming the field. */
NPYL_HIDDEN int npyl_loader_sources_complete(npyload_loader *L);

/* npyload_loader_fields.c: the positions of one epoch: T of a mixture
 * (SAMPLES_PER_EPOCH or the sources' samples summed), else L->n. */
NPYL_HIDDEN int64_t npyl_loader_epoch_len(const npyload_loader *L);

/* npyload_loader_state.c: a new mixture of the loader's sources (their
 * sizes and the first field's file sizes), its weights and epoch length,
 * with seed and shuffle (the order's), in its first segment. */
NPYL_HIDDEN int npyl_state_mix_new(npyload_loader *L, int64_t seed, int shuffle,
                                   npyl_mix **out);

/* npyload_loader_options.c: the order the options give (epoch L->epoch,
 * base 0, no file sizes), and the order options a restored state brings
 * (set_state adopts them). */
NPYL_HIDDEN void npyl_loader_order_of(const npyload_loader *L, npyl_order_params *op);
NPYL_HIDDEN void npyl_loader_adopt_order(npyload_loader *L, int64_t seed, int64_t shuffle,
                                         int64_t drop_last);

/* npyload_loader_fill.c: the background cache fill. start (the last step,
 * the workers running) plans it and starts its thread when the option and
 * the stores say so (never fails: a fill is an optimisation); stop joins
 * the thread (the caller set the stores' cancel first); free stops and
 * frees; stats adds its progress. */
NPYL_HIDDEN void npyl_fill_start(npyload_loader *L);
NPYL_HIDDEN void npyl_fill_stop(npyload_loader *L);
NPYL_HIDDEN void npyl_fill_free(npyload_loader *L);
NPYL_HIDDEN void npyl_fill_stats(const npyload_loader *L, npyload_stats *out);
/* Its failure's message into buf (len > 0), "" when none. Any thread. */
NPYL_HIDDEN void npyl_fill_error(const npyload_loader *L, char *buf, size_t len);

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
