/* lib/loader's controller (NPYLOAD_AUTO): it changes the worker threads
 * and the staging slots while the loader runs, from what the loader
 * measures. One per loader, no global state.
 *
 * Who calls what: start sizes it (npyl_auto_plan, then npyl_auto_begin
 * once the ring and the workers exist); next() calls npyl_auto_tick with
 * the loader's counters while it holds the control turn (ctl, taken only
 * when free: a control call in progress skips the tick), so a tick never
 * overlaps start, stop, set_epoch, set_state or destroy. It asks the slots
 * to park workers (npyl_slots_set_workers), to take FREE slots out of the
 * ring (npyl_slots_retire: never a slot the caller holds) and to take
 * slots back (npyl_slots_offer); it initialises and starts the workers it
 * adds (npyl_worker_init, npyl_worker_start). A worker taken away parks
 * after the batches it holds and keeps its buffers (the budget counts
 * every worker made). Queries (stats, history) read the published counts
 * (atomics) and the history under hist_mu, a leaf lock.
 *
 * Order and bytes never depend on it: claims stay in seq order whatever
 * the count of workers, and a slot's bytes are its batch's. */
#ifndef NPYLOAD_LOADER_AUTO_H
#define NPYLOAD_LOADER_AUTO_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "npyload_loader_device.h"
#include "npyload_loader_slots.h"
#include "npyload_loader_types.h"
#include "npyload_loader_worker.h"

enum { NPYL_AUTO_WORKERS = 1, NPYL_AUTO_SLOTS = 2 };
#define NPYL_AUTO_HISTORY 32
#define NPYL_AUTO_MAX_SLOTS 64 /* staging slots the controller manages */

/* What start knows when it sizes the controller. */
typedef struct npyl_auto_setup {
    int mode;               /* NPYL_AUTO_* bits */
    size_t workers;         /* a fixed NUM_WORKERS (mode without WORKERS) */
    size_t slots;           /* a fixed PREFETCH (mode without SLOTS) */
    int device_mode;
    int ahead;              /* workers read ahead: each fills two slots */
    int ahead_switch;       /* the controller may switch read-ahead off and
                               on (READ_AHEAD 0, host mode) */
    uint64_t budget;        /* MEMORY_BUDGET, 0 = default */
    int64_t cores;          /* AUTO_CORES, 0 = the process's */
    int64_t target_bp;      /* AUTO_TARGET, 0 = default */
    int64_t force;          /* AUTO_FORCE */
    uint64_t slot_bytes;    /* one host slot */
    uint64_t worker_bytes;  /* one worker's read buffers */
} npyl_auto_setup;

/* The loader's counters as one tick sees them (cumulative). fill_wait_ns:
 * the part of wait_ns spent waiting for the first batch of a pass (start,
 * set_epoch, set_state), which no count of workers or slots removes: the
 * controller judges the steady state without it. */
typedef struct npyl_auto_meas {
    uint64_t now_ns, batches, samples, wait_ns, fill_wait_ns, step_ns, busy_ns, blocked_ns;
    uint64_t slot_wait_ns; /* workers waiting for a free slot (the ring) */
    /* Read-ahead: the workers' wait for the reads handed to their
     * read-ahead threads (read_wait_ns), and those threads' off-CPU time
     * in the reads (a wait for a device, as blocked_ns). */
    uint64_t read_wait_ns, ahead_blocked_ns;
} npyl_auto_meas;

typedef struct npyl_auto {
    /* [start] */
    int mode;
    int device_mode;
    size_t per;              /* slots one worker fills at once (1, 2 ahead) */
    int ahead_switch;        /* workers made with read-ahead whose switch
                                the controller owns (ahead_on) */
    size_t cap_workers;      /* the workers array */
    size_t core_workers;     /* the ceiling unless reads wait for a device
                                (AUTO_CORES, else the process's cores) */
    size_t cap_slots;        /* staging slot structs (ring.nh) */
    uint64_t budget, slot_bytes, worker_bytes;
    double target;
    int64_t force;
    npyl_ring *ring;
    npyl_worker *workers_arr; /* cap_workers, made of them initialised */
    const npyl_work_env *env;
    npyl_worker_cfg cfg;
    const npyl_device *dev;
    uint64_t t0;
    /* [ctl] the counts the controller wants and its search */
    size_t made;             /* workers initialised (threads started) */
    size_t workers, slots;
    /* Slots taken out by a removal being judged keep their memory (OFF,
     * already faulted in): taking the removal back offers them again at no
     * cost. Freed once the removal is kept, or when the budget needs them;
     * counted in the bytes held. */
    npyl_slot *parked[NPYL_AUTO_MAX_SLOTS];
    size_t nparked;
    npyl_auto_meas last;     /* the window's start */
    int pending;             /* the change being judged (an action) */
    unsigned judged;         /* windows seen since it was made */
    double base_rate;        /* the rate of the windows before it */
    double seen_min_rate, seen_max_share; /* the windows since */
    double seen_rate, seen_slot_wait; /* their rates and slot waits, summed */
    double base_slot_wait;   /* the workers' slot wait before it */
    unsigned hot;            /* windows in a row above the target */
    double hot_rate;         /* their rates, summed */
    double hot_slot_wait;    /* their workers' slot waits, summed */
    double ref_step, ref_rate; /* the last steady window's (none judged
                                  a change), kept while one is judged */
    int moved_step, moved_rate; /* a window moved them (+1 up, -1 down):
                                   the next one confirms a new regime */
    int settling;            /* the window after a verdict: not measured
                                for a regime */
    /* Read-ahead (ahead_switch): the windows in a row whose reads never
     * blocked (served from the page cache) and their rates, summed; the
     * state the history's last event recorded. */
    unsigned cached;
    double cached_rate;
    int logged_ahead;
    size_t w_ceiling;        /* adding up to this did not help */
    size_t trial_slots;      /* the slots before a worker trial */
    size_t used_slots;       /* the workers waited for a free slot with
                                fewer (a slot added that cut that wait, or
                                a trim that brought it back): no trim
                                below (until the regime changes) */
    size_t low_slots;        /* a kept removal left this many with room to
                                spare: below the workers' need, yet enough
                                (until a slot added pays or the regime
                                changes) */
    uint64_t win, force_k, force_at;
    unsigned calm;
    uint64_t until[5];       /* windows: add worker, drop worker, drop slot,
                                add slot, read-ahead off */
    unsigned backoff[5];
    /* The workers' read-ahead now: 1 on, 0 off (the switch they read
     * between batches, npyl_work_env.ahead_on); without ahead_switch,
     * whether start made them with read-ahead. */
    _Atomic int ahead_on;
    /* published for queries */
    _Atomic size_t live_workers, live_slots, live_made, live_parked;
    _Atomic uint64_t nevents;
    pthread_mutex_t hist_mu; /* leaf: the history */
    npyload_auto_event hist[NPYL_AUTO_HISTORY];
} npyl_auto;

NPYL_HIDDEN void npyl_auto_init(npyl_auto *a);
NPYL_HIDDEN void npyl_auto_fini(npyl_auto *a);

/* Start: the first counts and the capacities (workers array, staging
 * slots), within the budget. Returns 0 or the error with the message in
 * err (the budget cannot hold the smallest configuration). */
NPYL_HIDDEN int npyl_auto_plan(npyl_auto *a, const npyl_auto_setup *s, size_t *workers0,
                               size_t *cap_workers, size_t *slots0, size_t *cap_slots,
                               char *err, size_t errlen);
/* Start, once the ring, the workers (made of them initialised) and their
 * configuration exist: records the first counts. */
NPYL_HIDDEN void npyl_auto_begin(npyl_auto *a, npyl_ring *ring, npyl_worker *workers,
                                 size_t made, const npyl_work_env *env,
                                 const npyl_worker_cfg *cfg, const npyl_device *dev,
                                 const npyl_auto_meas *m);
/* A tick (the control turn held): judges the window that closed, if one
 * did, and changes the counts. */
NPYL_HIDDEN void npyl_auto_tick(npyl_auto *a, const npyl_auto_meas *m);

/* Queries: the current counts, the bytes they hold (parked slots
 * included), whether the workers read ahead now, the history. */
NPYL_HIDDEN size_t npyl_auto_workers(npyl_auto *a);
NPYL_HIDDEN size_t npyl_auto_slots(npyl_auto *a);
NPYL_HIDDEN size_t npyl_auto_made(npyl_auto *a);
NPYL_HIDDEN size_t npyl_auto_parked(npyl_auto *a);
NPYL_HIDDEN int npyl_auto_ahead(npyl_auto *a);
NPYL_HIDDEN uint64_t npyl_auto_bytes(npyl_auto *a);
NPYL_HIDDEN size_t npyl_auto_history(npyl_auto *a, npyload_auto_event *ev, size_t n,
                                     size_t size, uint64_t *total);
/* The default budget: a quarter of the smaller of physical memory and the
 * cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes). */
NPYL_HIDDEN uint64_t npyl_auto_default_budget(void);

#endif
