/* lib/store: the storage interface under the loader. Depends on common,
 * format, io, remote and zst; the loader reads through it only.
 *
 * A store reads one kind of path: `local` (files, through lib/io: pread,
 * io_uring or the mmap gather), `remote` (s3:// and http(s)://, through
 * lib/remote). Each is one file that fills an npyl_store_ops table, and the
 * set of stores a loader uses is the table of built-in stores in
 * npyload_store.c (one line per store) plus what a test registers
 * (npyl_stores_register): tests/tu_store_fault.c is a store that injects
 * latency, short reads and errors, registered by one line.
 *
 *   npyload_store.c         the set: which store reads a path, their
 *                           configuration, globs, the file table, counters
 *   npyload_store_header.c  a file's header through its store: NPY, the
 *                           .npy.zst seek table and frame 0, a narrowed
 *                           store's value table (probe bytes, then reads)
 *   npyload_store_round.c   a thread's contexts and a round of requests
 *                           over several stores: every store's requests
 *                           submitted before any is waited for, short
 *                           completions continued
 *   npyload_store_local.c   the local store (lib/io)
 *   npyload_store_remote.c  the remote store (lib/remote), and
 *                           npyload_remote_inspect
 *
 * The file table: one entry per file of every field, {path, store, size};
 * what else a store needs of a file (an inode and mtime, an ETag) it keeps
 * in a table of its own, by the same index, filled when it probes.
 * Threads: the set and the stores are set up by the loader's control
 * calls (one at a time) and read-only while workers run; a context
 * (npyl_sctx) belongs to one thread at a time; counters are atomics. */
#ifndef NPYLOAD_STORE_H
#define NPYLOAD_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/npyload_common.h"
#include "../format/npyload_format.h"
#include "../io/npyload_io.h"
#include "../remote/npyload_remote.h"
#include "../zst/npyload_zst.h"

/* Stores in one set: the built-in ones and those registered. */
#define NPYL_STORE_MAX 6

/* What npyl_store_ops.complete returns when a request came short. */
#define NPYL_STORE_SHORT 1

typedef struct npyl_store npyl_store;         /* a store's state for one loader */
typedef struct npyl_store_ctx npyl_store_ctx; /* a store's context for one thread */

/* One file of the table. */
typedef struct npyl_sfile {
    const char *path;     /* as given (borrowed from the field) */
    uint32_t store;       /* index in the set */
    uint64_t size;        /* when it was probed */
} npyl_sfile;

/* What a probe learns of a file: its size and first bytes, and its last
 * bytes when the caller's want_tail asks for them (a .npy.zst's seek
 * table, a narrowed store's trailer). Buffers are malloc'd. */
typedef struct npyl_sprobe {
    uint64_t size;
    unsigned char *head;  /* bytes [0, head_len) */
    size_t head_len;
    unsigned char *tail;  /* bytes [size - tail_len, size) */
    size_t tail_len;
} npyl_sprobe;

/* The first and last bytes a probe reads. */
#define NPYL_STORE_HEAD_BYTES 4096u
#define NPYL_STORE_TAIL_BYTES 16384u

/* A thread's context options (what the loader's options say about reading;
 * each store takes what applies to it). */
typedef struct npyl_store_cfg {
    int backend;          /* local: NPYLOAD_IO_URING, _PREAD or _MMAP */
    int direct;           /* O_DIRECT */
    unsigned queue_depth; /* reads in flight */
    unsigned max_open;    /* open files kept per context */
    int random_access;    /* reads in no particular order (read-ahead off) */
    int64_t gather_max;   /* lib/io's gather threshold (0: its default) */
} npyl_store_cfg;

/* A context's counters (local reads; other stores may leave them 0). */
typedef struct npyl_store_counters {
    uint64_t gather_bytes, gather_reqs, read_bytes, read_reqs;
    int fell_back;        /* io_uring refused at run time: reads use pread */
} npyl_store_counters;

/* A background fill of a store's cache (the remote store's block cache):
 * a byte range of a file of the table, the options (GETs in flight, bytes
 * per GET, the part's bound) and the progress, which are lib/remote's
 * bulk fill's own (npyload_remote.h). */
typedef struct npyl_srange {
    uint32_t file;
    uint64_t off, len;
} npyl_srange;
typedef npyl_bulk_opts npyl_sfill_opts;
typedef npyl_bulk_state npyl_sfill_state;

/* ---- what a store implements ----
 *
 * Every operation gets the store's state; those marked [ctx] a thread's
 * context. Failures return a negative code with "PATH: what happened" in
 * err. NULL entries: the store has no such thing (no glob, no
 * configuration). */
typedef struct npyl_store_ops {
    const char *name;     /* "local", "remote", ... (messages, configure) */
    int async;            /* submit starts the reads and returns (remote);
                             0: they are read inside complete (local). In a
                             round over several stores the async ones are
                             submitted first and completed last. */
    /* 1 when `path` is this store's (its scheme). The local store is asked
     * last and takes every path no other store claims. */
    int (*claims)(const char *path);
    /* The store's state, from a configuration (NULL: the defaults; what it
     * points at is the store's own type, given to npyl_stores_configure). */
    int (*open)(npyl_store **out, const void *cfg, char *err, size_t errlen);
    void (*close)(npyl_store *s);
    /* add_field: whether `path` can be read (configured: a configuration
     * was given). May be NULL. */
    int (*check)(npyl_store *s, int configured, const char *path, char *err, size_t errlen);
    /* add_field: a glob's matches, sorted (npyl_glob_sorted's contract). */
    int (*glob)(npyl_store *s, const char *pattern, char ***paths, size_t *n, char *err,
                size_t errlen);
    /* start: the store's per-file table for nfiles files (0: freed). */
    int (*table)(npyl_store *s, size_t nfiles);
    /* start: probes files idx[0 .. n) of t (several at once where the
     * store can): size and identity into its table, head and tail (when
     * npyl_stores_want_tail says so) into out[]. On failure *bad is the
     * index into idx. */
    int (*probe)(npyl_store *s, const npyl_sfile *t, const uint32_t *idx, size_t n,
                 npyl_sprobe *out, size_t *bad, char *err, size_t errlen);
    /* start: n bytes at off of probed file `file` (a header's rest, a seek
     * table), checked against what the probe saw. */
    int (*read_at)(npyl_store *s, const npyl_sfile *t, uint32_t file, void *buf, size_t n,
                   uint64_t off, char *err, size_t errlen);
    /* A thread's context over the table t[0 .. nfiles) (borrowed). */
    int (*ctx_open)(npyl_store *s, const npyl_sfile *t, size_t nfiles,
                    const npyl_store_cfg *cfg, npyl_store_ctx **out, char *err,
                    size_t errlen);
    void (*ctx_close)(npyl_store_ctx *c);
    /* [ctx] A round: submit may start the n requests and return at once;
     * complete waits for them. Every submit is followed by one complete
     * with the same requests (valid and untouched until then). complete
     * returns 0 when every request landed whole (done[] untouched: the
     * common case costs nothing per request), NPYL_STORE_SHORT when
     * done[i] says the bytes of each request i that landed: all of them,
     * or fewer (a short read: the round asks for the rest; 0 means none
     * could be read). On failure (negative) *bad is the failed request,
     * *landed the bytes that landed anyway. submit's failure may wait for
     * complete. submit may be NULL: the store starts nothing before
     * complete (it reads inside it, as the local store does). */
    int (*submit)(npyl_store_ctx *c, const npyl_req *reqs, size_t n, char *err,
                  size_t errlen);
    int (*complete)(npyl_store_ctx *c, const npyl_req *reqs, size_t n, uint64_t *done,
                    size_t *bad, uint64_t *landed, char *err, size_t errlen);
    /* start: a key naming the object behind file `file` of t (path NULL)
     * or behind `path` (a path of this store), equal for two spellings of
     * one object: a local file's device and inode, an object's URL.
     * Returns 0, or -errno when `path` does not exist. */
    int (*key)(npyl_store *s, const npyl_sfile *t, uint32_t file, const char *path,
               char *key, size_t keylen);
    /* A start that reuses the probes of an earlier one (a stopped loader):
     * 1 when file `file` may have changed since (a local file's identity
     * differs), so its header must be read again. May be NULL (never
     * says so: a remote object's ETag is checked by every read). */
    int (*changed)(npyl_store *s, const npyl_sfile *t, uint32_t file);
    /* [ctx, any thread] Adds the context's counters. May be NULL. */
    void (*ctx_counters)(const npyl_store_ctx *c, npyl_store_counters *k);
    /* Any thread: adds the store's own counters to a loader's stats. May be
     * NULL. */
    void (*stats)(const npyl_store *s, npyload_stats *st);
    /* Any thread: on 1 every read of the store in flight, on any thread,
     * and every later one gives up within a bounded poll (-ECANCELED,
     * "stopped") until it is cleared (on 0): the loader sets it before it
     * joins its workers (stop, destroy), so that a stalled server does not
     * hold them for its timeouts. May be NULL (reads that never stall for
     * long: local files). */
    void (*cancel)(npyl_store *s, int on);
    /* fn(arg) (NULL: none), asked at least every poll by the work that runs
     * on the control thread while it waits (globs, probes, read_at), never
     * by a context's reads: non-zero makes that work give up (-ECANCELED,
     * "interrupted"): Ctrl-C in Python. Set while no such work runs. May be
     * NULL. */
    void (*interrupt)(npyl_store *s, int (*fn)(void *), void *arg);
    /* A store that keeps a cache of what it reads (remote's cache_dir):
     * fill_facts gives its unit (*unit: a cache block) and the bytes the
     * cache keeps without evicting them again (*budget); 0 and 0 when it
     * keeps none. fill brings ranges[0 .. n) (files of t, in that order,
     * whole units; ranges of files not its own are skipped) into the
     * cache, up to the budget, on the calling thread (a loader's own
     * thread, not a context's), coordinated with the readers (a unit is
     * fetched once; readers wait for a unit in flight), as a background
     * fill (npyl_sfill_opts.background). Returns 0 when the part is in,
     * -ECANCELED once st->stop or cancel was set, or the first failure.
     * Both may be NULL (a store without a cache). */
    void (*fill_facts)(const npyl_store *s, uint64_t *unit, uint64_t *budget);
    int (*fill)(npyl_store *s, const npyl_srange *ranges, size_t n, const npyl_sfill_opts *o,
                npyl_sfill_state *st, char *err, size_t errlen);
} npyl_store_ops;

/* The built-in stores (npyload_store_local.c, npyload_store_remote.c). */
extern NPYL_HIDDEN const npyl_store_ops npyl_store_local;
extern NPYL_HIDDEN const npyl_store_ops npyl_store_remote;

/* ---- the set of a loader ---- */

typedef struct npyl_stores {
    const npyl_store_ops *ops[NPYL_STORE_MAX];
    const void *arg[NPYL_STORE_MAX];  /* a registered store's configuration */
    npyl_store *s[NPYL_STORE_MAX];    /* open once used (or configured) */
    int configured[NPYL_STORE_MAX];   /* npyl_stores_configure was called */
    int used[NPYL_STORE_MAX];         /* a path of it was added */
    size_t n;
    /* The file table, filled at start (npyl_stores_table). */
    npyl_sfile *files;
    size_t nfiles;
    /* npyl_stores_set_interrupt's, given to every store opened. */
    int (*interrupt)(void *);
    void *interrupt_arg;
} npyl_stores;

/* The built-in stores, none open yet. */
NPYL_HIDDEN void npyl_stores_init(npyl_stores *set);
/* Closes every store (wiping what they hold: a secret) and frees the
 * table. Idempotent. */
NPYL_HIDDEN void npyl_stores_fini(npyl_stores *set);
/* Adds a store to the set (tests: the fault store), asked before the
 * built-in ones for the paths it claims; arg is given to its open. Returns
 * 0 or NPYLOAD_ETOOBIG (the set is full). */
NPYL_HIDDEN int npyl_stores_register(npyl_stores *set, const npyl_store_ops *ops,
                                     const void *arg);
/* The store that reads `path`. */
NPYL_HIDDEN uint32_t npyl_stores_of(const npyl_stores *set, const char *path);
/* The configuration of the store named `name` (opened with it now, so
 * that a bad one fails here). NPYLOAD_ESTATE once a path of it was added. */
NPYL_HIDDEN int npyl_stores_configure(npyl_stores *set, const char *name, const void *cfg,
                                      char *err, size_t errlen);
/* add_field: `path` (a file, or with glob a pattern) of the store that
 * claims it: checked (its store opened with the defaults when no
 * configuration was given), and a pattern expanded into *paths / *n. */
NPYL_HIDDEN int npyl_stores_add(npyl_stores *set, const char *path, int glob, char ***paths,
                                size_t *n, char *err, size_t errlen);
/* start: the file table of paths[0 .. nfiles) (borrowed: they must outlive
 * the table), each file given to the store that claims it, which is opened
 * (with its defaults when not configured) and sizes its own table.
 * nfiles 0 frees the table. */
NPYL_HIDDEN int npyl_stores_table(npyl_stores *set, const char *const *paths, size_t nfiles,
                                  char *err, size_t errlen);
/* The key of table file i (path NULL) or of `path` (read by the same
 * store as file i): see npyl_store_ops.key. */
#define NPYL_SKEY_LEN 48
NPYL_HIDDEN int npyl_stores_key(const npyl_stores *set, size_t i, const char *path,
                                char key[NPYL_SKEY_LEN]);
/* 1 when a file of the table may have changed since it was probed
 * (npyl_store_ops.changed). */
NPYL_HIDDEN int npyl_stores_changed(const npyl_stores *set);
/* Adds every store's counters to st (remote requests, cache hits...). */
NPYL_HIDDEN void npyl_stores_stats(const npyl_stores *set, npyload_stats *st);
/* The backend NPYLOAD_IO_AUTO resolves to now (io_uring when a probe ring
 * works, else pread), with the reason io_uring was passed over in why. */
NPYL_HIDDEN int npyl_stores_auto_backend(char *why, size_t whylen);
/* npyl_store_ops.cancel of every open store. Any thread, destroy's
 * included while a control call runs: a store is swapped only by
 * npyl_stores_configure, which the loader refuses once a path of it was
 * added, and is read here with an atomic load. */
NPYL_HIDDEN void npyl_stores_cancel(npyl_stores *set, int on);
/* The interrupt callback of every store, open now or later
 * (npyl_store_ops.interrupt). Control calls only. */
NPYL_HIDDEN void npyl_stores_set_interrupt(npyl_stores *set, int (*fn)(void *), void *arg);
/* The store of the table's files that fills a cache (npyl_store_ops.fill
 * and a non-zero unit from fill_facts): its index, *unit and *budget; -1
 * when none does. */
NPYL_HIDDEN int npyl_stores_fill_facts(const npyl_stores *set, uint64_t *unit,
                                       uint64_t *budget);
/* npyl_store_ops.fill of store `store` (npyl_stores_fill_facts's). */
NPYL_HIDDEN int npyl_stores_fill(npyl_stores *set, int store, const npyl_srange *ranges,
                                 size_t n, const npyl_sfill_opts *o, npyl_sfill_state *st,
                                 char *err, size_t errlen);
/* 1 when the table has a file of a store other than local. */
NPYL_HIDDEN int npyl_stores_any_other(const npyl_stores *set);

/* ---- headers (npyload_store_header.c) ---- */

/* Whether a probe should read a file's tail too, from its first bytes: a
 * .npy.zst (its seek table) or a '|u1' .npy with bytes after its data (a
 * narrowed store's trailer). Stores call it in their probe. */
NPYL_HIDDEN int npyl_stores_want_tail(const unsigned char *head, size_t head_len,
                                      uint64_t size);

/* A file's facts as start reads them. */
typedef struct npyl_sheader {
    npyload_header h;     /* of a narrowed file: the values' dtype */
    npyl_zst_index *zst;  /* a .npy.zst: its frame index (malloc'd; the caller
                             owns it and frees it with npyl_zst_index_free
                             and free), else NULL */
    npyl_zst_narrow *nx;  /* a stored narrowed .npy: its value table
                             (malloc'd, owned by the caller), else NULL */
} npyl_sheader;

/* A probe of one file of `size` bytes read with rd (0, or a negative code
 * with "PATH: what happened" in err): its head and, when
 * npyl_stores_want_tail says so, its tail, into malloc'd buffers of p
 * (the caller's to free, also on failure). For the stores that probe a
 * file at a time (local; the tests' fault store). */
typedef int (*npyl_sprobe_read_fn)(void *ctx, void *buf, size_t n, uint64_t off, char *err,
                                   size_t errlen);
NPYL_HIDDEN int npyl_sprobe_fill(npyl_sprobe *p, uint64_t size, npyl_sprobe_read_fn rd,
                                 void *ctx, const char *path, char *err, size_t errlen);

/* A probed file as a reader (npyl_zst_read_fn over an npyl_sreader): the
 * probe's bytes, else `rest` (the store's reads). */
typedef struct npyl_sreader {
    const npyl_sprobe *p;
    npyl_zst_read_fn rest;
    void *rest_ctx;
} npyl_sreader;
NPYL_HIDDEN int npyl_sprobe_read(void *ctx, void *buf, size_t n, uint64_t off);
/* The NPY header of a probed .npy (the rest read when it is longer than
 * the probe's head). */
NPYL_HIDDEN int npyl_sprobe_npy_header(const npyl_sreader *r, const char *path,
                                       npyload_header *h, char *err, size_t errlen);

/* A walk over the headers of files first .. first + n - 1 of the table, in
 * order, probing them in groups (several at once where the store can):
 *
 *     npyl_hwalk w;
 *     npyl_stores_walk_begin(&w, set, first, n);
 *     while ((rc = npyl_stores_walk_next(&w, &i, &sh, err, errlen)) == 1)
 *         ... file i's header in sh (its zst and nx are the caller's) ...
 *     npyl_stores_walk_end(&w);
 *
 * walk_next returns 1 with the next file, 0 at the end, or the failure
 * with "PATH: what is wrong" in err and *i the file it concerns. A
 * header's failure leaves sh->h as far as the parser filled it (a .npy
 * short of the data its header announces: NPYLOAD_ETRUNCATED with the
 * whole header) and the walk able to go on with the next file; a probe's
 * failure ends the walk (sh zeroed). */
#define NPYL_HWALK_GROUP 64
typedef struct npyl_hwalk {
    npyl_stores *set;
    size_t next, end;     /* the next file to hand out; one past the last */
    size_t g0, g1;        /* the probed group: files [g0, g1) */
    npyl_sprobe probe[NPYL_HWALK_GROUP];
    uint32_t idx[NPYL_HWALK_GROUP];
} npyl_hwalk;
NPYL_HIDDEN void npyl_stores_walk_begin(npyl_hwalk *w, npyl_stores *set, size_t first,
                                        size_t n);
NPYL_HIDDEN int npyl_stores_walk_next(npyl_hwalk *w, size_t *i, npyl_sheader *sh, char *err,
                                      size_t errlen);
NPYL_HIDDEN void npyl_stores_walk_end(npyl_hwalk *w);

/* ---- a thread's reads (npyload_store_round.c) ---- */

/* A thread's contexts: one per store that has files in the table, and the
 * scratch of a round split over several stores. */
typedef struct npyl_sbuf {
    npyl_req *reqs;
    size_t *at;           /* each one's index in the round */
} npyl_sbuf;
typedef struct npyl_sctx {
    const npyl_stores *set;
    npyl_store_ctx *c[NPYL_STORE_MAX];
    int only;             /* the store of every file of the table, else -1:
                             its rounds go to it with no look at each
                             request's store */
    npyl_sbuf buf[3];     /* a round split by store; the rest of requests
                             completed short (two, used in turn) */
    uint64_t *done;       /* bytes that landed per request of a part */
    size_t cap;
    char scratch[512];    /* the messages of failures after the first */
} npyl_sctx;

/* Opens the contexts of every store with files in the table. Returns 0 or
 * the error (c is left for npyl_sctx_close in every case). */
NPYL_HIDDEN int npyl_sctx_open(npyl_sctx *c, const npyl_stores *set,
                               const npyl_store_cfg *cfg, char *err, size_t errlen);
NPYL_HIDDEN void npyl_sctx_close(npyl_sctx *c);
/* Performs all n requests, whichever stores they belong to, and returns
 * when every one is complete or one failed: npyl_io_read's contract
 * (*bad the failed request, *landed accumulates the bytes that landed).
 * The requests of every store are submitted before any is waited for, so
 * a round that mixes local files and remote objects has its GETs in
 * flight while the local reads run. */
NPYL_HIDDEN int npyl_sctx_read(npyl_sctx *c, const npyl_req *reqs, size_t n, size_t *bad,
                               uint64_t *landed, char *err, size_t errlen);
/* Adds c's counters. Any thread. */
NPYL_HIDDEN void npyl_sctx_counters(const npyl_sctx *c, npyl_store_counters *k);

#endif
