/* The controller (NPYLOAD_AUTO): planning at start, one decision per window
 * of batches, applying it through the slots and the workers, and the
 * history. The rules are in npyload_loader_auto.h and npyload.h. */
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "npyload_loader_auto.h"

/* A window closes after this many batches and this long, or after
 * WIN_LONG_NS with at least one batch. */
#define WIN_BATCHES 4
#define WIN_MIN_NS 30000000ull
#define WIN_LONG_NS 1000000000ull
#define GAIN 1.05        /* an addition must raise throughput this much */
#define HOT_WINDOWS 2    /* windows in a row above the target before one */
#define JUDGE_WINDOWS 2  /* windows that judge a change */
#define REGIME 0.34      /* the step or throughput moving this much */
#define CALM_WINDOWS 3   /* windows with room to spare before a removal */
#define BUSY_FULL 0.9    /* workers busy this share of their time never wait
                            for a free slot: a slot more cannot help */
#define SLOT_USED 0.05   /* workers waiting for a free slot this share of
                            their time would use a slot more */
#define DEVICE_TRIAL 0.1 /* workers not BUSY_FULL that wait for a device
                            this share of their time earn a trial of one
                            worker above the cores */
#define AHEAD_CACHED 0.01 /* reads blocked below this share of the workers'
                             time (theirs and their read-ahead threads'):
                             every read served from the page cache */
#define AHEAD_WINDOWS 2   /* such windows in a row before read-ahead off */
#define AHEAD_JUDGE 3     /* windows that judge read-ahead off */
#define AHEAD_BLOCKED 0.05 /* workers reading their own batches (read-ahead
                              off) blocked this share of their time: the
                              reads wait for a device again, read-ahead
                              back on */
#define BACKOFF_MAX 64u  /* windows */
#define AUTO_MAX_SLOTS NPYL_AUTO_MAX_SLOTS
#define FORCE_MAX_WORKERS 4
#define FORCE_MAX_SLOTS 8

/* ACT_TRIM_S: a slot removed while the loader is the limit (UNUSED).
 * ACT_AHEAD_OFF: read-ahead switched off (AHEAD_OFF). */
enum { ACT_NONE = 0, ACT_ADD_W, ACT_DROP_W, ACT_DROP_S, ACT_ADD_S, ACT_TRIM_S, ACT_AHEAD_OFF };
enum { B_ADD_W = 0, B_DROP_W, B_DROP_S, B_ADD_S, B_AHEAD };

void npyl_auto_init(npyl_auto *a)
{
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->hist_mu, NULL);
}

void npyl_auto_fini(npyl_auto *a) { pthread_mutex_destroy(&a->hist_mu); }

static uint64_t read_limit(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    char buf[64] = "";
    uint64_t v = 0;
    if (fgets(buf, sizeof buf, f) && strncmp(buf, "max", 3) != 0)
        v = strtoull(buf, NULL, 10);
    fclose(f);
    return v;
}

uint64_t npyl_auto_default_budget(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t mem = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 4ull << 30;
    const char *limits[] = {"/sys/fs/cgroup/memory.max",
                            "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (size_t i = 0; i < sizeof limits / sizeof *limits; i++) {
        uint64_t v = read_limit(limits[i]);
        if (v && v < mem)
            mem = v; /* v1 reports "no limit" as a huge number: above mem */
    }
    return mem / 4;
}

static size_t process_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return (size_t)CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (size_t)n : 1;
}

/* Host slots a worker count keeps busy: each worker fills per slots, the
 * caller holds one and one is ready. */
static size_t min_slots(const npyl_auto *a, size_t workers) { return a->per * workers + 2; }

/* The fewest host slots a removal may leave: those the workers fill and
 * those the caller holds (at least one), without the ready one: whether
 * the loop needs it is what the removal's judging finds out (a consumer
 * slower than one worker's fill never waits for it). */
static size_t floor_slots(const npyl_auto *a, size_t workers, size_t held)
{
    return a->per * workers + (held > 1 ? held : 1);
}

static uint64_t bytes_of(const npyl_auto *a, size_t made, size_t slots)
{
    return made * a->worker_bytes + (a->device_mode ? 0 : slots * a->slot_bytes);
}

int npyl_auto_plan(npyl_auto *a, const npyl_auto_setup *s, size_t *workers0,
                   size_t *cap_workers, size_t *slots0, size_t *cap_slots, char *err,
                   size_t errlen)
{
    /* In device mode the device slots keep their first count: the
     * controller changes the workers only, or nothing. */
    int mode = s->mode & ~(s->device_mode ? NPYL_AUTO_SLOTS : 0);
    a->mode = mode;
    a->device_mode = s->device_mode;
    a->per = s->ahead ? 2 : 1;
    a->ahead_switch = s->ahead && s->ahead_switch && !s->device_mode;
    a->slot_bytes = s->slot_bytes;
    a->worker_bytes = s->worker_bytes;
    a->force = s->force;
    a->target = (s->target_bp ? (double)s->target_bp : 200.0) / 10000.0;
    size_t cores = s->cores > 0 ? (size_t)s->cores : process_cores();
    if (!(mode & NPYL_AUTO_WORKERS)) {
        a->cap_workers = a->core_workers = s->workers;
    } else {
        a->core_workers = cores;
        /* Past the cores only when reads wait for a device. */
        a->cap_workers = 2 * cores < 256 ? 2 * cores : 256;
    }
    if (!mode) { /* fixed counts: no controller, no budget */
        a->workers = *workers0 = *cap_workers = s->workers;
        a->slots = *slots0 = *cap_slots = a->cap_slots = s->slots;
        return 0;
    }
    a->budget = s->budget ? s->budget : npyl_auto_default_budget();
    size_t w = mode & NPYL_AUTO_WORKERS ? (cores < 2 ? cores : 2) : s->workers;
    /* The first slots: the documented default for the first workers
     * (npyload_default_prefetch, which start passes in s->slots), at most
     * those the workers fill plus the one the loop holds when the
     * controller moves them: a ready slot more is added when the loop
     * waits for it (decide), and every slot costs its memory faulted in
     * during the first pass. */
    size_t sl = s->slots;
    if ((mode & NPYL_AUTO_SLOTS) && sl > a->per * w + 1)
        sl = a->per * w + 1;
    /* The smallest configuration the budget holds: fewer workers first. */
    while (bytes_of(a, w, sl) > a->budget && (mode & NPYL_AUTO_WORKERS) && w > 1) {
        w--;
        if ((mode & NPYL_AUTO_SLOTS) && sl > 2 * w)
            sl = 2 * w;
    }
    if ((mode & NPYL_AUTO_SLOTS) && bytes_of(a, w, sl) > a->budget)
        sl = 2;
    if (bytes_of(a, w, sl) > a->budget)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "MEMORY_BUDGET %" PRIu64 " bytes "
                         "cannot hold the smallest configuration: %zu slot%s of %" PRIu64
                         " bytes and %zu worker%s with %" PRIu64 " bytes of read buffers "
                         "each; raise MEMORY_BUDGET or lower BATCH_SIZE", a->budget, sl,
                         sl == 1 ? "" : "s", a->device_mode ? 0 : a->slot_bytes, w,
                         w == 1 ? "" : "s", a->worker_bytes);
    size_t cap_s = sl;
    if ((mode & NPYL_AUTO_SLOTS) && !s->device_mode) {
        uint64_t room = (a->budget - w * a->worker_bytes) / (a->slot_bytes ? a->slot_bytes : 1);
        cap_s = room < AUTO_MAX_SLOTS ? (size_t)room : AUTO_MAX_SLOTS;
        if (cap_s < sl)
            cap_s = sl;
    }
    a->cap_slots = cap_s;
    a->workers = w;
    a->slots = sl;
    *workers0 = w;
    *cap_workers = a->cap_workers;
    *slots0 = sl;
    *cap_slots = cap_s;
    return 0;
}

/* The measurements of one window. */
typedef struct window {
    double share, rate, busy, blocked, step_pb;
    double slot_wait; /* the workers' wait for a free slot (their share) */
    double ahead_blocked; /* the read-ahead threads' off-CPU time in their
                             reads (over the workers' time) */
} window;

/* One event of the history: the change from (pw, ps) to the counts now,
 * with the window behind it (NULL: a change no window decided). */
static void record(npyl_auto *a, const npyl_auto_meas *m, int reason, size_t pw, size_t ps,
                   const window *w)
{
    const window none = {0};
    if (!w)
        w = &none;
    npyload_auto_event e = {
        .t_ns = m->now_ns - a->t0,
        .batch = m->batches,
        .workers = (uint32_t)a->workers,
        .slots = (uint32_t)a->slots,
        .prev_workers = (uint32_t)pw,
        .prev_slots = (uint32_t)ps,
        .reason = reason,
        .wait_share = w->share,
        .samples_per_s = w->rate,
        .worker_busy = w->busy,
        .read_blocked = w->blocked,
        .slot_wait = w->slot_wait,
        .read_ahead = npyl_auto_ahead(a),
        .prev_read_ahead = a->logged_ahead,
    };
    a->logged_ahead = e.read_ahead;
    pthread_mutex_lock(&a->hist_mu);
    uint64_t n = atomic_load(&a->nevents);
    a->hist[n % NPYL_AUTO_HISTORY] = e;
    atomic_store(&a->nevents, n + 1);
    pthread_mutex_unlock(&a->hist_mu);
}

void npyl_auto_begin(npyl_auto *a, npyl_ring *ring, npyl_worker *workers, size_t made,
                     const npyl_work_env *env, const npyl_worker_cfg *cfg,
                     const npyl_device *dev, const npyl_auto_meas *m)
{
    a->ring = ring;
    a->workers = made;
    a->made = made;
    a->env = env;
    a->cfg = *cfg;
    a->dev = dev;
    a->t0 = m->now_ns;
    a->last = *m;
    a->force_at = m->batches;
    a->w_ceiling = a->cap_workers;
    a->workers_arr = workers;
    /* Workers made without a read-ahead context (the descriptors did not
     * allow two) fill one slot each and have nothing to switch. */
    if (!cfg->ahead) {
        a->per = 1;
        a->ahead_switch = 0;
    }
    atomic_store(&a->ahead_on, cfg->ahead); /* before any worker thread starts */
    a->cached = 0;
    a->cached_rate = 0;
    a->logged_ahead = npyl_auto_ahead(a);
    a->nparked = 0; /* the stop before freed every slot's memory */
    atomic_store(&a->live_parked, 0);
    /* A start after a stop begins a new search and a new history. */
    a->pending = ACT_NONE;
    a->base_rate = a->seen_min_rate = a->seen_max_share = a->ref_step = a->ref_rate = 0;
    a->moved_step = a->moved_rate = 0;
    a->settling = 0;
    a->low_slots = 0;
    a->judged = a->hot = 0;
    a->hot_rate = 0;
    a->win = a->force_k = 0;
    a->calm = 0;
    memset(a->until, 0, sizeof a->until);
    memset(a->backoff, 0, sizeof a->backoff);
    pthread_mutex_lock(&a->hist_mu);
    atomic_store(&a->nevents, 0);
    pthread_mutex_unlock(&a->hist_mu);
    atomic_store(&a->live_made, made);
    atomic_store(&a->live_workers, a->workers);
    atomic_store(&a->live_slots, a->slots);
    if (a->mode)
        record(a, m, NPYLOAD_AUTO_START, a->workers, a->slots, NULL);
}

/* ---- applying a change ---- */

static void free_slot_mem(const npyl_auto *a, npyl_slot *s)
{
    if (a->dev->pinned)
        npyl_cuda_host_free(a->dev->cuda, s->mem);
    else
        npyl_free_aligned(s->mem);
    s->mem = NULL;
}

/* Frees the parked slots' memory (the removal they wait on was kept, or
 * the budget needs the room). */
static void release_parked(npyl_auto *a)
{
    for (size_t i = 0; i < a->nparked; i++)
        free_slot_mem(a, a->parked[i]);
    a->nparked = 0;
    atomic_store(&a->live_parked, 0);
}

/* Workers: makes (initialises and starts) those missing, within the
 * budget; parks or wakes the others. Returns the count now on. */
static size_t apply_workers(npyl_auto *a, size_t want)
{
    if (want < 1)
        want = 1;
    if (want > a->cap_workers)
        want = a->cap_workers;
    while (a->made < want) {
        if (bytes_of(a, a->made + 1, a->slots + a->nparked) > a->budget && a->nparked)
            release_parked(a);
        if (bytes_of(a, a->made + 1, a->slots) > a->budget)
            break;
        npyl_worker *w = &a->workers_arr[a->made];
        char err[NPYL_ERRMSG_LEN];
        if (npyl_worker_init(w, a->made, a->env, &a->cfg, err, sizeof err) != 0 ||
            npyl_worker_start(w, err, sizeof err) != 0) {
            npyl_worker_fini(w);
            memset(w, 0, sizeof *w);
            a->cap_workers = a->made; /* no more: descriptors or memory ran out */
            break;
        }
        a->made++;
        atomic_store(&a->live_made, a->made);
    }
    if (want > a->made)
        want = a->made;
    npyl_slots_set_workers(a->ring, want);
    a->workers = want;
    atomic_store(&a->live_workers, want);
    return want;
}

/* Read-ahead on or off (ahead_switch): the workers read the switch
 * between batches; one with read-ahead off claims one batch at a time, so
 * it fills one slot (per: the slots the workers need follow). */
static void apply_ahead(npyl_auto *a, int on)
{
    atomic_store(&a->ahead_on, on);
    a->per = on ? 2 : 1;
}

/* Whether the change being judged removed slots: those it takes out are
 * parked, not freed. */
static int removing_slots(const npyl_auto *a)
{
    return a->pending == ACT_DROP_S || a->pending == ACT_TRIM_S;
}

/* Host slots: offers parked slots again, or gives memory to OFF slots and
 * offers them, or takes FREE ones out, towards `want` (slots held or in
 * use come out later, at a later tick). Slots taken out are parked while
 * a slot removal is judged (removing_slots), freed otherwise. Returns the
 * count wanted. */
static size_t apply_slots(npyl_auto *a, size_t want)
{
    if (a->device_mode)
        return a->slots;
    if (want > a->cap_slots)
        want = a->cap_slots;
    if (want < 2)
        want = 2;
    npyl_ring *r = a->ring;
    size_t on, held;
    npyl_slots_counts(r, &on, &held);
    if (want < held + 1)
        want = held + 1;
    while (on < want && a->nparked > 0) {
        npyl_slots_offer(r, a->parked[--a->nparked]); /* memory already faulted in */
        on++;
    }
    for (size_t i = 0; i < r->nh && on < want; i++) {
        npyl_slot *s = &r->hslots[i];
        /* OFF slots are the ctl holder's: reading the state without mu is
         * safe, nobody else changes an OFF slot. A slot with memory is on
         * or parked. */
        if (s->mem || bytes_of(a, a->made, on + 1) > a->budget)
            continue;
        void *mem = NULL;
        if (a->dev->pinned ? npyl_cuda_host_alloc(a->dev->cuda, &mem, a->slot_bytes) != 0
                           : (mem = npyl_alloc_aligned(a->slot_bytes, NPYL_DIRECT_ALIGN)) == NULL)
            break;
        s->mem = mem;
        npyl_slots_offer(r, s);
        on++;
    }
    if (on > want && r->nh <= AUTO_MAX_SLOTS) {
        npyl_slot *out[AUTO_MAX_SLOTS];
        size_t n = npyl_slots_retire(r, want, out);
        for (size_t i = 0; i < n; i++) {
            if (removing_slots(a) && a->nparked < AUTO_MAX_SLOTS)
                a->parked[a->nparked++] = out[i];
            else
                free_slot_mem(a, out[i]);
        }
        on -= n;
    }
    a->slots = want;
    atomic_store(&a->live_parked, a->nparked);
    atomic_store(&a->live_slots, on);
    return want;
}

/* ---- deciding ---- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* AUTO_FORCE: a new pseudo-random pair every `force` batches. */
static void forced(npyl_auto *a, const npyl_auto_meas *m)
{
    if (m->batches < a->force_at + (uint64_t)a->force)
        return;
    a->force_at = m->batches;
    uint64_t h = mix64(++a->force_k);
    size_t pw = a->workers, ps = a->slots;
    int pa = npyl_auto_ahead(a);
    if (a->mode & NPYL_AUTO_WORKERS) {
        size_t top = a->cap_workers < FORCE_MAX_WORKERS ? a->cap_workers : FORCE_MAX_WORKERS;
        apply_workers(a, 1 + (size_t)(h % top));
    }
    if (a->ahead_switch)
        apply_ahead(a, (int)((h >> 20) & 1));
    if (a->mode & NPYL_AUTO_SLOTS) {
        size_t top = a->cap_slots < FORCE_MAX_SLOTS ? a->cap_slots : FORCE_MAX_SLOTS;
        apply_slots(a, 2 + (size_t)((h >> 32) % (top > 2 ? top - 1 : 1)));
    }
    if (pw != a->workers || ps != a->slots || pa != npyl_auto_ahead(a))
        record(a, m, NPYLOAD_AUTO_FORCED, pw, ps, NULL);
}

static void back_off(npyl_auto *a, int which)
{
    unsigned b = a->backoff[which] ? a->backoff[which] * 2 : 4;
    a->backoff[which] = b < BACKOFF_MAX ? b : BACKOFF_MAX;
    a->until[which] = a->win + a->backoff[which];
}

/* +1 or -1: now moved above or below ref by more than REGIME (and the
 * slack); 0 otherwise, or without a reference. */
static int regime_moved(double now, double ref, double slack)
{
    if (ref <= 0)
        return 0;
    double d = now > ref ? now - ref : ref - now;
    return d > REGIME * ref + slack ? (now > ref ? 1 : -1) : 0;
}

/* The workers the cores keep busy: AUTO_CORES (or the process's cores),
 * more only while the workers wait for reads. A worker blocked a share b
 * of its time is on a CPU 1 - b of it, so cores / (1 - b) of them keep
 * the cores busy; b counts only spans with a voluntary context switch
 * (npyl_blocked_since), so time lost to preemption on a busy machine
 * never justifies a thread more. b is taken at most 1/2: at most twice
 * the cores (cap_workers). Workers that are not busy all the time
 * (BUSY_FULL) and wait for a device DEVICE_TRIAL of it earn one above the
 * cores, judged as any worker added: the cores idle while a worker waits
 * for its reads and the others for their turn (zstd decode on two cores
 * with reads throttled: the best fixed configuration had 3 workers where
 * b was 0.05-0.25). */
static size_t worker_ceiling(const npyl_auto *a, double blocked, double busy)
{
    double b = blocked < 0 ? 0 : blocked > 0.5 ? 0.5 : blocked;
    size_t c = (size_t)((double)a->core_workers / (1.0 - b) + 1e-9);
    if (c < a->core_workers)
        c = a->core_workers;
    if (c == a->core_workers && b >= DEVICE_TRIAL && busy < BUSY_FULL)
        c++;
    if (c > a->cap_workers)
        c = a->cap_workers;
    return c < a->w_ceiling ? c : a->w_ceiling;
}

/* A slot fewer, judged as `act` (ACT_DROP_S or ACT_TRIM_S): the slot
 * taken out is parked while it is judged. Returns whether the count
 * changed. */
static int remove_slot(npyl_auto *a, int act)
{
    size_t ps = a->slots;
    a->pending = act;
    if (apply_slots(a, a->slots - 1) != ps)
        return 1;
    a->pending = ACT_NONE;
    return 0;
}

/* Read-ahead (ahead_switch), before the counts: off, judged (judge),
 * after AHEAD_WINDOWS windows in a row whose reads never blocked
 * (AHEAD_CACHED: the workers' and their read-ahead threads' off-CPU time
 * in reads; every read a copy from the page cache, where the second
 * batch in flight only costs its hand-offs, its memory and, on busy
 * cores, the time its thread takes from the decode). Returns the reason
 * of a change, or -1. (Back on: ahead_back_on.) */
static int decide_ahead(npyl_auto *a, const window *w)
{
    if (!atomic_load(&a->ahead_on))
        return -1;
    if (w->blocked + w->ahead_blocked >= AHEAD_CACHED || a->win < a->until[B_AHEAD]) {
        a->cached = 0;
        a->cached_rate = 0;
        return -1;
    }
    a->cached_rate += w->rate;
    if (++a->cached < AHEAD_WINDOWS)
        return -1;
    a->base_rate = a->cached_rate / a->cached;
    a->cached = 0;
    a->cached_rate = 0;
    apply_ahead(a, 0);
    a->pending = ACT_AHEAD_OFF;
    return NPYLOAD_AUTO_AHEAD_OFF;
}

/* Read-ahead off (ahead_switch) and the workers, reading their own
 * batches, blocked AHEAD_BLOCKED of the window (a cold disk, the cache
 * evicted: the reads wait for a device, where a read in flight while the
 * batch before decodes keeps the cores busy): back on at once, not
 * judged, whatever change is being judged (a trial of read-ahead off
 * ends there); the back-off of the trial off goes, so that the next warm
 * pass tries it again. */
static void ahead_back_on(npyl_auto *a, const npyl_auto_meas *m, const window *w)
{
    if (!a->ahead_switch || atomic_load(&a->ahead_on) || w->blocked < AHEAD_BLOCKED)
        return;
    if (a->pending == ACT_AHEAD_OFF)
        a->pending = ACT_NONE;
    apply_ahead(a, 1);
    a->backoff[B_AHEAD] = 0;
    a->until[B_AHEAD] = 0;
    a->cached = 0;
    a->cached_rate = 0;
    record(a, m, NPYLOAD_AUTO_AHEAD_ON, a->workers, a->slots, w);
}

/* One decision from the window w (no change being judged). A count rises
 * only after HOT_WINDOWS windows in a row above the target; the change is
 * then judged over JUDGE_WINDOWS windows (judge). */
static void decide(npyl_auto *a, const npyl_auto_meas *m, const window *w, size_t held)
{
    size_t pw = a->workers, ps = a->slots;
    int reason = -1;
    a->pending = ACT_NONE;
    int aw = a->mode & NPYL_AUTO_WORKERS, as = a->mode & NPYL_AUTO_SLOTS;
    if (a->ahead_switch && (reason = decide_ahead(a, w)) >= 0) {
        /* The windows before the switch count for nothing after it. */
        a->hot = a->calm = 0;
        a->hot_rate = a->hot_slot_wait = 0;
    } else if (w->share > a->target) {
        a->calm = 0;
        a->hot_rate += w->rate;
        a->hot_slot_wait += w->slot_wait;
        if (++a->hot < HOT_WINDOWS)
            return;
        a->base_rate = a->hot_rate / a->hot;
        a->base_slot_wait = a->hot_slot_wait / a->hot;
        a->hot = 0;
        a->hot_rate = a->hot_slot_wait = 0;
        size_t need = min_slots(a, a->workers) + (held > 1 ? held - 1 : 0);
        /* A slot more can be used only by workers that are not busy all
         * the time. (Their wait for a free slot is no reason on its own:
         * in the page cache with the cores shared, workers busy 94 % of
         * their time waited 30 % for a slot, a batch behind the one a
         * preempted worker held; a slot more only cost its memory.) */
        int room = w->busy < BUSY_FULL;
        if (as && a->slots < need && a->slots > a->low_slots && room &&
            apply_slots(a, a->slots + 1) != ps) {
            /* The workers' own need (not judged), unless they never wait
             * for a free slot (BUSY_FULL) or a kept removal showed the
             * loop does without it (low_slots: then only a judged trial
             * below brings it back). */
            reason = NPYLOAD_AUTO_WAIT;
        } else if (aw && a->workers < worker_ceiling(a, w->blocked, w->busy) &&
                   a->win >= a->until[B_ADD_W] && apply_workers(a, a->workers + 1) != pw) {
            /* Its slots too: the new worker's fill only, when a kept
             * removal showed the loop does without a ready one. Taken
             * back with the worker if it does not pay. */
            size_t want = a->low_slots ? ps + a->per : min_slots(a, a->workers);
            if (as && a->slots < want)
                apply_slots(a, want);
            a->trial_slots = ps;
            a->pending = ACT_ADD_W;
            reason = NPYLOAD_AUTO_WAIT;
        } else if (as && a->slots < need + a->workers && room &&
                   a->win >= a->until[B_ADD_S] && apply_slots(a, a->slots + 1) != ps) {
            /* A deeper queue absorbs jitter, when it does: judged as a
             * worker is (more slots are more memory to fault in and to
             * keep in cache, and slower when the loader is the limit).
             * Not tried when the workers were busy all the time (the copy
             * or the device at its ceiling): they never waited for a free
             * slot, so one more would stay empty. */
            a->pending = ACT_ADD_S;
            reason = NPYLOAD_AUTO_WAIT;
        } else if (as && a->slots > need && a->slots > a->used_slots &&
                   a->win >= a->until[B_DROP_S] && remove_slot(a, ACT_TRIM_S)) {
            /* Nothing more is tried: the loader is the limit, the loop
             * takes each batch as it lands and the slots beyond those the
             * workers fill, the one it holds and the ready one stay
             * empty. Judged on the throughput alone (the wait stays above
             * the target whatever the slots). */
            reason = NPYLOAD_AUTO_UNUSED;
        }
    } else {
        a->hot = 0;
        a->hot_rate = a->hot_slot_wait = 0;
        if (w->share < a->target / 2 && ++a->calm >= CALM_WINDOWS) {
            a->calm = 0;
            a->base_rate = w->rate;
            size_t floor = floor_slots(a, a->workers, held);
            if (as && a->slots > floor && a->win >= a->until[B_DROP_S] &&
                remove_slot(a, ACT_DROP_S)) {
                reason = NPYLOAD_AUTO_SPARE;
            } else if (aw && a->workers > 1 && a->win >= a->until[B_DROP_W] &&
                       apply_workers(a, a->workers - 1) != pw) {
                a->pending = ACT_DROP_W;
                reason = NPYLOAD_AUTO_SPARE;
            }
        }
    }
    if (reason >= 0)
        record(a, m, reason, pw, ps, w);
    if (a->pending) {
        a->judged = 0;
        a->seen_min_rate = 0;
        a->seen_max_share = 0;
        a->seen_rate = a->seen_slot_wait = 0;
        /* A move seen before the change does not pair with one after. */
        a->moved_step = a->moved_rate = 0;
    }
}

/* Judges the change being judged after JUDGE_WINDOWS windows: an addition
 * is kept only when every one of them delivered GAIN times the rate of the
 * windows before it (a slot added where the workers waited for one: also
 * when that wait halved and the rate did not fall); a removal is taken
 * back when one of them waited above the target, or the rate fell by as
 * much while the loop waited at least half the target, a slot trimmed
 * while the loader is the limit (the wait above the target before and
 * after) only when the rate fell or the workers now wait for a free slot
 * SLOT_USED of their time. What is taken back backs off. */
static void judge(npyl_auto *a, const npyl_auto_meas *m, const window *w)
{
    if (!a->judged || w->rate < a->seen_min_rate)
        a->seen_min_rate = w->rate;
    if (w->share > a->seen_max_share)
        a->seen_max_share = w->share;
    a->seen_rate += w->rate;
    a->seen_slot_wait += w->slot_wait;
    if (++a->judged < (a->pending == ACT_AHEAD_OFF ? AHEAD_JUDGE : JUDGE_WINDOWS))
        return;
    size_t pw = a->workers, ps = a->slots;
    int act = a->pending;
    a->pending = ACT_NONE;
    /* Whatever the verdict, nothing is parked after it: a removal taken
     * back offers its parked slot again (apply_slots), one kept frees it. */
    int paid = a->seen_min_rate >= a->base_rate * GAIN;
    /* A slot added where the workers waited for a free one SLOT_USED of
     * their time: kept when that wait fell by half and the rate did not
     * fall (the mean of the judging windows against the windows before,
     * within GAIN). The rate alone swings 2x between the windows of one
     * run here (transforms in the page cache): asking each window for
     * GAIN more took a used slot back as often as not. */
    double n = (double)a->judged;
    if (act == ACT_ADD_S && !paid && a->base_slot_wait >= SLOT_USED)
        paid = a->seen_slot_wait / n <= a->base_slot_wait / 2 &&
               a->seen_rate / n * GAIN >= a->base_rate;
    /* A slot trimmed that the workers then wait for was used. */
    int slot_missed = act == ACT_TRIM_S && a->seen_slot_wait / n >= SLOT_USED;
    /* A loop that never waited half the target lost at most that much of
     * its rate to the loader: a fall beyond is its own step's (a consumer
     * that jitters), not the removal's. */
    int worse = a->seen_max_share > a->target ||
                (a->seen_min_rate * GAIN < a->base_rate && a->seen_max_share >= a->target / 2);
    if (act == ACT_ADD_W && !paid) {
        apply_workers(a, a->workers - 1);
        if (a->slots > a->trial_slots)
            apply_slots(a, a->trial_slots);
        a->w_ceiling = a->workers; /* until the regime changes */
        back_off(a, B_ADD_W);
        record(a, m, NPYLOAD_AUTO_NO_GAIN, pw, ps, w);
    } else if (act == ACT_ADD_S && !paid) {
        apply_slots(a, a->slots - 1);
        back_off(a, B_ADD_S);
        record(a, m, NPYLOAD_AUTO_NO_GAIN, pw, ps, w);
    } else if (((act == ACT_DROP_W || act == ACT_DROP_S) && worse) ||
               (act == ACT_TRIM_S && (a->seen_min_rate * GAIN < a->base_rate || slot_missed))) {
        if (act == ACT_DROP_W) {
            apply_workers(a, a->workers + 1);
            back_off(a, B_DROP_W);
        } else {
            apply_slots(a, a->slots + 1);
            back_off(a, B_DROP_S);
            if (slot_missed)
                a->used_slots = a->slots;
        }
        record(a, m, NPYLOAD_AUTO_WORSE, pw, ps, w);
    } else if (act == ACT_TRIM_S) {
        /* The slot was unused: adding one back waits, as after a slot
         * added in vain. */
        back_off(a, B_ADD_S);
    } else if (act == ACT_ADD_W || act == ACT_ADD_S) {
        a->backoff[act == ACT_ADD_W ? B_ADD_W : B_ADD_S] = 0; /* it paid */
        a->low_slots = 0;
        if (act == ACT_ADD_S && a->base_slot_wait >= SLOT_USED)
            a->used_slots = a->slots; /* the workers use it: never trimmed */
    } else if ((act == ACT_DROP_W || act == ACT_DROP_S) && a->seen_max_share < a->target / 2) {
        /* A removal kept with room to spare: its windows were calm ones,
         * the next removal comes at the next calm window. */
        a->calm = CALM_WINDOWS - 1;
        if (act == ACT_DROP_S)
            a->low_slots = a->slots;
    } else if (act == ACT_AHEAD_OFF && a->seen_rate / n * GAIN < a->base_rate) {
        /* Read-ahead off is kept unless the mean rate of its windows fell
         * by GAIN against the cached windows before it (the mean: one
         * window's rate swings 2x in the page cache with transforms). */
        apply_ahead(a, 1);
        back_off(a, B_AHEAD);
        record(a, m, NPYLOAD_AUTO_WORSE, pw, ps, w);
    } else if (act == ACT_AHEAD_OFF) {
        a->backoff[B_AHEAD] = 0;
    }
    release_parked(a);
}

void npyl_auto_tick(npyl_auto *a, const npyl_auto_meas *m)
{
    if (!a->mode || !a->ring)
        return;
    size_t on, held;
    npyl_slots_counts(a->ring, &on, &held);
    int as = a->mode & NPYL_AUTO_SLOTS; /* never in device mode (plan) */
    if (as) {
        /* The caller holds every slot: one more now, whatever the window
         * says (within the budget), so next() does not fail for it. */
        if (held >= on && on < a->cap_slots) {
            size_t ps = a->slots;
            if (apply_slots(a, held + 1) != ps)
                record(a, m, NPYLOAD_AUTO_HELD, a->workers, ps, NULL);
        } else if (on > a->slots) {
            apply_slots(a, a->slots); /* slots that were in use come out now */
        }
    }
    if (a->force) {
        forced(a, m);
        return;
    }
    uint64_t wall = m->now_ns - a->last.now_ns, nb = m->batches - a->last.batches;
    if (!nb || (wall < WIN_LONG_NS && (nb < WIN_BATCHES || wall < WIN_MIN_NS)))
        return;
    /* The steady state: the wait for a pass's first batch (its fill) is
     * left out of the wait and of the wall time the rate is taken over. */
    uint64_t wait = m->wait_ns - a->last.wait_ns, step = m->step_ns - a->last.step_ns;
    uint64_t fill = m->fill_wait_ns - a->last.fill_wait_ns;
    fill = fill < wait ? fill : wait;
    wait -= fill;
    uint64_t steady = wall > fill ? wall - fill : 1;
    double wk = (double)wall * (double)(a->workers ? a->workers : 1);
    /* Read-ahead: a worker waiting for the reads its read-ahead thread
     * does waits for a device as far as that thread was blocked in them
     * (off the CPU after a voluntary switch): the smaller of the two. */
    uint64_t rw = m->read_wait_ns - a->last.read_wait_ns;
    uint64_t ab = m->ahead_blocked_ns - a->last.ahead_blocked_ns;
    uint64_t ahead_wait = rw < ab ? rw : ab;
    window w = {
        .share = wait + step ? (double)wait / (double)(wait + step) : 0,
        .rate = (double)(m->samples - a->last.samples) * 1e9 / (double)steady,
        .busy = (double)(m->busy_ns - a->last.busy_ns) / wk,
        .blocked = (double)(m->blocked_ns - a->last.blocked_ns + ahead_wait) / wk,
        .step_pb = (double)step / (double)nb,
        .slot_wait = (double)(m->slot_wait_ns - a->last.slot_wait_ns) / wk,
        .ahead_blocked = (double)ab / wk,
    };
    a->last = *m;
    a->win++;
    ahead_back_on(a, m, &w);
    if (a->pending) {
        /* The windows that judge a change set no reference; the one from
         * before it stays, so that a regime change made while a change is
         * judged is still seen (the change may look paid for by it). An
         * addition that paid more than REGIME is taken for one too: the
         * back-offs go, which costs at most a retried trial. */
        judge(a, m, &w);
        if (!a->pending)
            a->settling = 1;
        return;
    }
    int ds = regime_moved(w.step_pb, a->ref_step, 1e6), dr = regime_moved(w.rate, a->ref_rate, 0);
    if (a->settling) {
        /* The window after a verdict still carries the change (a slot
         * faulted in, the rebound after it): its move is only the first
         * of two (a move before the change never pairs with one after
         * it), and it is no reference. */
        a->settling = 0;
        a->moved_step = ds;
        a->moved_rate = dr;
        decide(a, m, &w, held);
        return;
    }
    /* A regime change (the step or the throughput moved with the counts
     * unchanged, two windows in a row the same way against the last
     * steady reference: one window's swing is noise): forget what did not
     * help. A moved window leaves the reference as it was. */
    if ((ds && ds == a->moved_step) || (dr && dr == a->moved_rate)) {
        if (a->w_ceiling < a->cap_workers || a->backoff[0] || a->backoff[1] ||
            a->backoff[2] || a->backoff[3]) {
            a->w_ceiling = a->cap_workers;
            a->low_slots = a->used_slots = 0;
            memset(a->backoff, 0, sizeof a->backoff);
            memset(a->until, 0, sizeof a->until);
            record(a, m, NPYLOAD_AUTO_REGIME, a->workers, a->slots, &w);
        }
        ds = dr = 0; /* the new regime's window is the reference */
    }
    a->moved_step = ds;
    a->moved_rate = dr;
    if (!ds)
        a->ref_step = w.step_pb;
    if (!dr)
        a->ref_rate = w.rate;
    decide(a, m, &w, held);
}

/* ---- queries ---- */

size_t npyl_auto_workers(npyl_auto *a) { return atomic_load(&a->live_workers); }
size_t npyl_auto_slots(npyl_auto *a) { return atomic_load(&a->live_slots); }
size_t npyl_auto_made(npyl_auto *a) { return atomic_load(&a->live_made); }
size_t npyl_auto_parked(npyl_auto *a) { return atomic_load(&a->live_parked); }

int npyl_auto_ahead(npyl_auto *a) { return atomic_load(&a->ahead_on); }

uint64_t npyl_auto_bytes(npyl_auto *a)
{
    return bytes_of(a, atomic_load(&a->live_made),
                    atomic_load(&a->live_slots) + atomic_load(&a->live_parked));
}

size_t npyl_auto_history(npyl_auto *a, npyload_auto_event *ev, size_t n, size_t size,
                         uint64_t *total)
{
    pthread_mutex_lock(&a->hist_mu);
    uint64_t all = atomic_load(&a->nevents);
    uint64_t kept = all < NPYL_AUTO_HISTORY ? all : NPYL_AUTO_HISTORY;
    size_t out = kept < n ? (size_t)kept : n;
    size_t sz = size < sizeof *ev ? size : sizeof *ev;
    for (size_t i = 0; i < out; i++) {
        uint64_t k = all - out + i;
        uint8_t *dst = (uint8_t *)ev + i * size;
        memcpy(dst, &a->hist[k % NPYL_AUTO_HISTORY], sz);
        if (size > sz)
            memset(dst + sz, 0, size - sz);
    }
    pthread_mutex_unlock(&a->hist_mu);
    if (total)
        *total = all;
    return out;
}
