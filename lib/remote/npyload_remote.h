/* Remote shards: s3:// and http(s):// objects read with ranged GETs.
 * Depends on lib/common only (and libcurl, expat). The loader uses it.
 *
 *   npyload_remote_client.c  the client: configuration (secrets copied and
 *                            wiped), URLs (s3://bucket/key -> request URL,
 *                            names for messages), curl handles set up for
 *                            signing, timeouts, TLS, no environment
 *   npyload_remote_xfer.c    transfers on a curl multi handle: ranged GETs
 *                            several in flight, Content-Range and ETag
 *                            checks, retries with backoff and jitter, the
 *                            error messages
 *   npyload_remote_list.c    globs over ListObjectsV2 (pagination)
 *   npyload_remote_xml.c     the XML of listings and S3 error bodies (expat)
 *   npyload_remote_cache.c   the block cache in cache_dir (atomic rename,
 *                            an flock'ed size record, LRU eviction; one
 *                            fetch per block per node: OFD locks)
 *   npyload_remote_bulk.c    a bulk fill of the cache: large sequential
 *                            GETs of a list of objects, several threads
 *   npyload_remote_prefetch.c the public npyload_prefetch over bulk (globs,
 *                            probes, sample order), in every build
 *   npyload_remote_read.c    a worker's reads: requests -> cache blocks or
 *                            coalesced ranges -> transfers; the probe of
 *                            headers and seek tables at start
 *   npyload_remote_api.c     the public client (npyload_remote_client_*,
 *                            npyload_remote_glob), in every build
 *   npyload_remote_none.c    the same API in a build without libcurl: every
 *                            remote path fails saying what to install
 *
 * Objects are identified by index into a table (npyl_remote_obj) that the
 * caller fills at start from the probe; entries with url == NULL are not
 * remote and are never asked for. A context (npyl_remote_ctx) belongs to
 * one thread at a time; the client is shared read-only after creation
 * (its counters are atomics, the cache's state has its own lock). */
#ifndef NPYLOAD_REMOTE_H
#define NPYLOAD_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/npyload_common.h"

/* An ETag as the server sent it, quotes included. */
#define NPYL_ETAG_LEN 128

typedef struct npyl_remote npyl_remote;
typedef struct npyl_remote_ctx npyl_remote_ctx;

/* One remote object, as seen at start. */
typedef struct npyl_remote_obj {
    const char *url;           /* as given (s3://... or https://...); NULL:
                                  not remote */
    uint64_t size;
    char etag[NPYL_ETAG_LEN];  /* "": the server sends none (not checked) */
} npyl_remote_obj;

/* A request (lib/common's npyl_req): file indexes the object table. */
typedef npyl_req npyl_remote_req;

/* The client's counters since creation (every context's, start's probe
 * and listings included). */
typedef struct npyl_remote_counters {
    uint64_t bytes;            /* body bytes received */
    uint64_t requests;         /* HTTP requests completed or failed */
    uint64_t retries;          /* of those, repeats after a transient failure */
    uint64_t wait_ns;          /* time threads waited for transfers */
    uint64_t cache_hits, cache_misses; /* cache blocks */
    uint64_t cache_read_bytes;  /* bytes served from cache_dir */
    uint64_t cache_write_bytes; /* bytes written into cache_dir */
    uint64_t cache_evictions;   /* blocks this process removed for room */
} npyl_remote_counters;

/* 1 for "s3://", "http://" and "https://" paths (any case of the scheme). */
NPYL_HIDDEN int npyl_remote_is_url(const char *path);

/* 1 when this build reads remote paths (libcurl and expat found), else 0.
 * `version` (may be NULL) gets libcurl's version and TLS library, or why
 * not ("built without libcurl: install libcurl4-openssl-dev and
 * libexpat1-dev and rebuild"). */
NPYL_HIDDEN int npyl_remote_built(char *version, size_t len);

/* Creates a client from a configuration (npyload_remote of this library's
 * size; NULL: every default, no credentials). Strings are copied; the
 * secret is wiped on destroy and never written to any message. Returns 0,
 * NPYLOAD_EINVAL (a missing or bad member, named), NPYLOAD_EUNSUPPORTED (no
 * libcurl in this build), -ENOMEM. */
NPYL_HIDDEN int npyl_remote_create(npyl_remote **out, const npyload_remote *cfg,
                                   char *err, size_t errlen);
NPYL_HIDDEN void npyl_remote_destroy(npyl_remote *r);

/* Checks that `url` can be read with this client (an s3:// path needs a
 * configuration, set with npyload_loader_set_remote: `configured` says
 * whether one was). Returns 0 or an error naming the URL and what is
 * missing. */
NPYL_HIDDEN int npyl_remote_check_url(const npyl_remote *r, int configured, const char *url,
                                      char *err, size_t errlen);

/* Expands "s3://bucket/pattern" (fnmatch with FNM_PATHNAME | FNM_PERIOD,
 * like glob(3)) through ListObjectsV2 into the sorted (strcmp) list of
 * "s3://bucket/key" paths, as npyl_glob_sorted does for local paths.
 * A pattern without wildcards is the object itself (not listed). Returns
 * 0, NPYLOAD_ENOFILES, or an error with a message naming the pattern. */
NPYL_HIDDEN int npyl_remote_glob(npyl_remote *r, const char *pattern, char ***paths,
                                 size_t *n, char *err, size_t errlen);

/* What start learns of an object with a first request: size, ETag, its
 * first head_len bytes and its last tail_len bytes (both whole when the
 * object is smaller). Buffers are malloc'd (npyl_remote_probe_free). */
typedef struct npyl_remote_probe {
    const char *url;           /* in */
    uint64_t size;
    char etag[NPYL_ETAG_LEN];
    unsigned char *head;       /* bytes [0, head_len) */
    size_t head_len;
    unsigned char *tail;       /* bytes [size - tail_len, size) */
    size_t tail_len;
} npyl_remote_probe;

/* The head and tail bytes start reads of each object. */
#define NPYL_REMOTE_HEAD_BYTES 4096u
#define NPYL_REMOTE_TAIL_BYTES 16384u

/* Probes n objects, several requests in flight: the head of each (which
 * gives size and ETag), then the tail of those for which want_tail says so
 * (called with the head; NULL: every object). Returns 0 or the first
 * failure, *bad its index, the message naming the URL. */
typedef int (*npyl_remote_want_tail)(const npyl_remote_probe *p);
NPYL_HIDDEN int npyl_remote_probe_all(npyl_remote *r, npyl_remote_probe *p, size_t n,
                                      npyl_remote_want_tail want_tail, size_t *bad,
                                      char *err, size_t errlen);
NPYL_HIDDEN void npyl_remote_probe_free(npyl_remote_probe *p);

/* Reads len bytes at off of one object (ETag checked) on the calling
 * thread: the rare reads of start beyond the probe's bytes. */
NPYL_HIDDEN int npyl_remote_get(npyl_remote *r, const npyl_remote_obj *o, uint64_t off,
                                size_t len, void *dst, char *err, size_t errlen);

/* A thread's reading context over the object table objs[0 .. nobjs)
 * (borrowed; it must outlive the context). */
NPYL_HIDDEN int npyl_remote_ctx_create(npyl_remote_ctx **out, npyl_remote *r,
                                       const npyl_remote_obj *objs, size_t nobjs,
                                       char *err, size_t errlen);
NPYL_HIDDEN void npyl_remote_ctx_destroy(npyl_remote_ctx *c);

/* npyl_io_read's contract for remote objects: performs all n requests
 * (through the cache when the client has one), blocks until every one is
 * complete or one failed for good (after the retries), and never longer
 * than the configured timeouts allow. On failure returns the code (-errno
 * such as -ENOENT for 404, -EACCES for 403, NPYLOAD_ECHANGED
 * when the object changed since start, NPYLOAD_EREMOTE), *bad a request
 * that failed, and err "URL: what happened (bytes A-B)". *bytes_read (may
 * be NULL) accumulates the bytes that landed. */
NPYL_HIDDEN int npyl_remote_read(npyl_remote_ctx *c, const npyl_remote_req *reqs, size_t n,
                                 size_t *bad, uint64_t *bytes_read, char *err,
                                 size_t errlen);
/* npyl_remote_read in two halves, so that a round's remote requests are in
 * flight while the caller does other work (the local reads of the same
 * round): npyl_remote_submit plans the requests (cache blocks, coalesced
 * ranges), reads what the cache holds and sends the first GETs without
 * waiting; npyl_remote_complete waits for them all, with npyl_remote_read's
 * contract (a failure of submit is returned by complete). Every submit is
 * followed by exactly one complete on the same context; reqs must stay
 * valid and untouched until then. submit returns 0 or its failure. */
NPYL_HIDDEN int npyl_remote_submit(npyl_remote_ctx *c, const npyl_remote_req *reqs, size_t n,
                                   char *err, size_t errlen);
NPYL_HIDDEN int npyl_remote_complete(npyl_remote_ctx *c, size_t *bad, uint64_t *bytes_read,
                                     char *err, size_t errlen);

/* npyload_remote_api.c: the public client's lib/remote client and
 * whether it was configured (s3:// allowed). */
NPYL_HIDDEN npyl_remote *npyl_remote_client_core(const npyload_remote_client *c,
                                                 int *configured);

/* Stops (on 1) every transfer of the client, on every thread, within
 * NPYL_REMOTE_POLL_MS: they fail with -ECANCELED ("stopped"), and so does
 * every later one until the flag is cleared (on 0). The loader sets it
 * before it joins its workers (destroy, stop), so a stalled GET does not
 * hold them for the timeouts. Any thread. */
NPYL_HIDDEN void npyl_remote_cancel(npyl_remote *r, int on);

/* fn (NULL: none) is called with arg, at least every NPYL_REMOTE_POLL_MS,
 * by the work that runs on the calling thread of the client's owner
 * (listings, start's probe and reads, the public client's inspect) while
 * it waits for the network, never by a context's reads: non-zero makes
 * that work give up with -ECANCELED ("interrupted"). Set it while no such
 * work runs. */
NPYL_HIDDEN void npyl_remote_set_interrupt(npyl_remote *r, int (*fn)(void *), void *arg);
/* ---- bulk fill of the cache (npyload_remote_bulk.c) ---- */

/* Defaults of npyl_bulk_opts (npyload.h documents them). */
#define NPYL_BULK_INFLIGHT 16
#define NPYL_BULK_REQUEST (32ull << 20)

typedef struct npyl_bulk_opts {
    uint64_t max_bytes;       /* the part to fill; 0 (and at most): what the
                                 cache keeps, 90 % of its bound */
    int inflight;             /* GETs at once; 0: NPYL_BULK_INFLIGHT */
    uint64_t request_bytes;   /* per GET, whole blocks; 0: NPYL_BULK_REQUEST */
    int background;           /* beside readers that must not fail for it
                                 (the loader's fill): a failed GET's blocks
                                 are released as not kept, so a reader that
                                 waited for one fetches it itself, and the
                                 final waits for blocks others fetch give
                                 up within 50 ms of st->stop */
} npyl_bulk_opts;

/* Blocks [k0, k1) of object obj: a piece of a fill's order. */
typedef struct npyl_bulk_span {
    size_t obj;
    uint64_t k0, k1;
} npyl_bulk_span;

/* A fill's progress: written by the fill, read by any thread (relaxed
 * atomics: each counter is exact, a set of them a snapshot only). */
typedef struct npyl_bulk_state {
    _Atomic int stop;                      /* set by any thread: the fill
                                              ends after its round */
    _Atomic uint64_t planned_bytes, planned_blocks; /* the part */
    _Atomic uint64_t done_bytes;           /* of it, in the cache (found,
                                              fetched, or waited for; at
                                              the end: counted there) */
    _Atomic uint64_t found_blocks;         /* already in the cache */
    _Atomic uint64_t fetched_blocks, fetched_bytes; /* by this fill */
    _Atomic uint64_t waited_blocks;        /* another thread or process
                                              fetched them meanwhile */
} npyl_bulk_state;

/* Fills the cache of r (a cache_dir is needed) with the blocks of
 * objs[0 .. n) (as probed: URL, size, ETag; objects without an ETag are
 * skipped, never cached), in that order, up to the part's budget (the
 * first blocks in that order; npyl_bulk_opts). Coordinated with every
 * other reader of the directory (one fetch per block per node). Blocks on
 * the calling thread until the part is in the cache, st->stop was set
 * (-ECANCELED), or a GET failed for good (its code; err names the URL).
 * st must be zeroed by the caller (counters add up). */
NPYL_HIDDEN int npyl_bulk_fill(npyl_remote *r, const npyl_remote_obj *objs, size_t n,
                               const npyl_bulk_opts *o, npyl_bulk_state *st, char *err,
                               size_t errlen);

/* npyl_bulk_fill over the blocks of spans[0 .. ns) in that order (spans
 * index objs[0 .. n); adjacent blocks of one object, in one span or in
 * consecutive ones, share a GET up to request_bytes); the part is the
 * first blocks in that order within the budget. A block listed twice is
 * found in the cache the second time. */
NPYL_HIDDEN int npyl_bulk_fill_spans(npyl_remote *r, const npyl_remote_obj *objs, size_t n,
                                     const npyl_bulk_span *spans, size_t ns,
                                     const npyl_bulk_opts *o, npyl_bulk_state *st, char *err,
                                     size_t errlen);
/* The block size and the fill budget (90 % of the bound) of r's cache;
 * 0 when r has no cache. */
NPYL_HIDDEN int npyl_remote_cache_facts(const npyl_remote *r, uint64_t *block,
                                        uint64_t *budget);

/* Adds the client's counters to *k. Any thread. */
NPYL_HIDDEN void npyl_remote_counters_add(const npyl_remote *r, npyl_remote_counters *k);

#endif
