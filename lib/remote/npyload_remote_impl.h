/* Private to lib/remote. The layers, each using only the ones below it:
 *
 *   npyload_remote_prefetch.c the public npyload_prefetch (over bulk)
 *   npyload_remote_bulk.c    bulk fills of the cache (beside read)
 *   npyload_remote_read.c    a thread's reads and start's probe
 *   npyload_remote_list.c    ListObjectsV2 globs
 *   npyload_remote_xfer.c    transfers on a multi handle, retries, checks
 *   npyload_remote_xml.c     the XML of listings and error bodies (expat)
 *   npyload_remote_cache.c   the block cache (files only, no HTTP)
 *   npyload_remote_client.c  configuration, URLs, curl handle set-up
 *
 * The loader includes only npyload_remote.h. */
#ifndef NPYLOAD_REMOTE_IMPL_H
#define NPYLOAD_REMOTE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include <curl/curl.h>

#include "npyload_remote.h"

/* Defaults of npyload_remote's members (npyload.h documents them). */
#define NPYL_REMOTE_RETRIES 8
#define NPYL_REMOTE_TIMEOUT_MS 60000
#define NPYL_REMOTE_CONNECT_MS 10000
#define NPYL_REMOTE_INFLIGHT 8
#define NPYL_REMOTE_CACHE_BYTES (10ull << 30)
#define NPYL_REMOTE_CACHE_BLOCK (4ull << 20)
#define NPYL_REMOTE_LIST_KEYS 1000
/* A listing gives up after this many pages (100 million keys at 1000 a
 * page: far more objects than a loader's 2^32 files could use in
 * practice), whatever the server says. */
#define NPYL_REMOTE_LIST_MAX_PAGES 100000
/* ... and after this many keys (a server may put many more than max-keys
 * on a page; a page is at most 64 MiB). */
#define NPYL_REMOTE_LIST_MAX_KEYS 100000000
/* How often a transfer loop looks at the stop flag and the interrupt
 * callback, at least (ms): close() and Ctrl-C are answered within it. */
#define NPYL_REMOTE_POLL_MS 100
#define NPYL_REMOTE_RETRY_BASE_MS 100
#define NPYL_REMOTE_RETRY_CAP_MS 5000
/* A transfer covers at most this many bytes (coalesced ranges, cache
 * blocks): larger reads are split, so that they run in parallel. */
#define NPYL_REMOTE_XFER_MAX (16ull << 20)
/* A body of an error response kept for its message. */
#define NPYL_REMOTE_ERRBODY 1024

typedef struct npyl_cache npyl_cache;

struct npyl_remote {
    char *endpoint;           /* scheme://host[:port][/base], no trailing '/' */
    int aws;                  /* 1: no endpoint given, AWS's for the region */
    char *region;
    char *access_key, *secret_key, *session_token; /* NULL: unsigned */
    int path_style;           /* 1 path-style, 0 virtual-hosted, -1 per
                                 bucket (AWS: path-style for names with dots) */
    int retries;              /* retries after the first attempt */
    long timeout_ms, connect_timeout_ms, retry_base_ms;
    int max_inflight;
    char *ca_file, *proxy;
    long list_max_keys;
    char sigv4[96];           /* CURLOPT_AWS_SIGV4: "aws:amz:REGION:s3" */
    npyl_cache *cache;        /* NULL: no cache_dir */
    _Atomic int cancel;       /* npyl_remote_cancel: every transfer gives up */
    int (*interrupt)(void *); /* npyl_remote_set_interrupt: asked on the
                                 caller's thread (listings, probes) */
    void *interrupt_arg;
    _Atomic uint64_t bytes, requests, retried, wait_ns;
    _Atomic uint64_t cache_hits, cache_misses, cache_read_bytes, cache_write_bytes,
        cache_evictions;
};

/* ---- npyload_remote_client.c ------------------------------------------- */

/* A URL split: kind 's' (s3://bucket/key) or 'h' (http/https, used as is). */
typedef struct npyl_rurl {
    int kind;
    char bucket[256];
    const char *key;          /* points into the URL given (s3 only) */
} npyl_rurl;
NPYL_HIDDEN int npyl_rurl_parse(const char *url, npyl_rurl *u, char *err, size_t errlen);

/* The request URL of an object (malloc'd): for s3://, the endpoint with
 * the bucket (path- or virtual-hosted style) and the key percent-encoded
 * as SigV4 signs it; `query` (may be NULL) appended after '?', already in
 * SigV4's canonical form (sorted, encoded). NULL when out of memory. */
NPYL_HIDDEN char *npyl_remote_request_url(const npyl_remote *r, const char *url,
                                          const char *query);
/* Appends s percent-encoded the SigV4 way (unreserved kept; '/' kept when
 * keep_slash) to dst of capacity cap at *len. Returns -1 when it does not
 * fit. */
NPYL_HIDDEN int npyl_remote_encode(char *dst, size_t cap, size_t *len, const char *s,
                                   int keep_slash);
/* How a URL is named in messages: npyload_mask_urls (a userinfo's password
 * masked, a query string, a presigned URL's signature, cut). */
NPYL_HIDDEN void npyl_remote_display(const char *url, char *buf, size_t len);
/* Sets up an easy handle for a GET (s3: an S3 request, signed when the
 * client has credentials): timeouts, TLS, no proxy
 * from the environment, signing for s3://, no signals. `hdrs` receives the
 * header list (free it after the transfer), with If-Match when etag is
 * not empty. Returns 0 or -ENOMEM. */
NPYL_HIDDEN int npyl_remote_setup_easy(const npyl_remote *r, CURL *e, int s3,
                                       const char *request_url, const char *etag,
                                       struct curl_slist **hdrs);
/* The process's curl_global_init, once. */
NPYL_HIDDEN int npyl_remote_global_init(char *err, size_t errlen);

/* ---- npyload_remote_xfer.c --------------------------------------------- */

/* A part of a transfer's body that lands somewhere: object bytes
 * [off, off + len) to dst. `req` is the request it serves (for *bad). */
typedef struct npyl_piece {
    uint64_t off, len;
    uint8_t *dst;
    size_t req;
    uint32_t obj;
} npyl_piece;

/* A cache fill: the blocks [k0, k1) that the transfer's body covers are
 * written to temporary files (each synced when complete) and renamed into
 * the cache when the transfer succeeds. */
typedef struct npyl_fill {
    char key[33];             /* the object's cache key */
    uint64_t k0, k1;
    uint64_t k;               /* the block being written (fd) */
    int fd;
    int broken;               /* a write failed: nothing of it is kept */
    char (*tmp)[64];          /* per block: its temporary file, "" if none */
    struct npyl_inflight **tk; /* per block: this thread's claim (may be
                                  NULL), released by the reader */
} npyl_fill;

enum { NPYL_X_WAIT = 0, NPYL_X_ACTIVE, NPYL_X_DONE };

/* One ranged GET of bytes [a, b) of an object. probe: the size and ETag
 * are learnt (the object may be shorter than b: then its end), not
 * checked. */
typedef struct npyl_xfer {
    const char *url;          /* the object as given (messages, signing) */
    uint64_t size;            /* known size, or UINT64_MAX (probe) */
    const char *etag;         /* "" or the ETag to match */
    uint64_t a, b;
    int probe;
    npyl_piece *pieces;       /* sorted by off; all inside [a, b) */
    size_t npieces, p0;
    npyl_fill *fill;          /* NULL: no cache fill */
    /* the attempt */
    int state, attempt;
    uint64_t due_ns, first_ns;
    CURL *easy;
    struct curl_slist *hdrs;
    long status;
    int hdr_done;             /* the final response's headers are in */
    uint64_t cr_a, cr_b, cr_total; /* Content-Range (cr_total UINT64_MAX: '*') */
    int have_cr;
    uint64_t clen;            /* Content-Length, UINT64_MAX when absent */
    char etag_got[NPYL_ETAG_LEN];
    uint64_t base;            /* object offset of the body's first byte */
    uint64_t pos;             /* body bytes received in this attempt */
    int enough;               /* a 200 body past b: stopped on purpose */
    int fail;                 /* a check failed in a callback: the code */
    char failmsg[200];
    char body[NPYL_REMOTE_ERRBODY];
    size_t body_len;
    char curlerr[CURL_ERROR_SIZE];
    int timed_out;            /* the last attempt hit the remote timeout */
    /* probe results */
    uint64_t got_size;
    /* mode 1: the whole body into memory (listings), no Range */
    int mem_mode;
    int sign;                 /* mem_mode: sign it as an S3 request */
    char *mem;
    size_t mem_len, mem_cap;
} npyl_xfer;

/* A set of easy handles on one multi handle (a thread's). */
typedef struct npyl_xpool {
    CURLM *multi;
    CURL **easy;
    int neasy, nfree;
    CURL **free_;
    uint64_t rng;             /* jitter */
    /* A run begun by npyl_xfer_start, continued by npyl_xfer_run: */
    int begun;
    size_t next;              /* transfers started once */
    uint64_t t0;
    int caller;               /* runs on the caller's thread (listings,
                                 start's probe and reads): the client's
                                 interrupt callback is asked */
    uint64_t asked_ns;        /* when it was last asked */
} npyl_xpool;

NPYL_HIDDEN int npyl_xpool_init(npyl_xpool *p, int inflight);
NPYL_HIDDEN void npyl_xpool_fini(npyl_xpool *p);

/* Runs the n transfers, at most the pool's handles in flight, retrying
 * transient failures; returns 0, or the first permanent failure (the
 * others are stopped) with *bad the index of the failed transfer and err
 * naming its URL and range. Successful fills are committed to the cache.
 * Every transfer is left DONE or WAIT, no handle busy. Gives up with
 * -ECANCELED within NPYL_REMOTE_POLL_MS once the client is cancelled or
 * (a caller's pool) its interrupt callback says so (npyl_remote_stopped). */
NPYL_HIDDEN int npyl_xfer_run(npyl_remote *r, npyl_xpool *p, npyl_xfer *x, size_t n,
                              size_t *bad, char *err, size_t errlen);
/* Begins the run of the n transfers without waiting: as many as the pool
 * has handles are started and their requests sent (one
 * curl_multi_perform); npyl_xfer_run on the same pool and transfers then
 * continues it (and must follow, to finish or stop them). Returns 0, or
 * -ENOMEM (nothing left running, *bad the transfer that could not start). */
NPYL_HIDDEN int npyl_xfer_start(npyl_remote *r, npyl_xpool *p, npyl_xfer *x, size_t n,
                                size_t *bad, char *err, size_t errlen);
/* One GET of a small body into memory (listings): url given by request
 * URL; *body malloc'd, *len; status in *status. Retries as above; a final
 * HTTP error is returned as -EACCES, -ENOENT, NPYLOAD_EREMOTE... with its
 * S3 error code and message in err. */
NPYL_HIDDEN int npyl_xfer_get_body(npyl_remote *r, const char *url, const char *request_url,
                                   char **body, size_t *len, char *err, size_t errlen);

/* ---- npyload_remote_xml.c ---------------------------------------------- */

/* The XML of S3's answers, parsed by expat (npyload_remote_xml.c): the
 * keys, truncation and continuation token of a ListObjectsV2 page, and the
 * Code and Message of an error body. */
typedef struct xml_state {
    int depth;
    char path[4][32];         /* element names at depths 1..4 */
    char text[4096];          /* the text of the element open now */
    size_t tlen;
    /* a listing */
    char **keys;
    size_t nkeys, cap;
    int truncated;
    char token[1024];
    int oom;
    /* an error */
    char code[96], message[200];
} xml_state;
/* Parses body into s (keys appended: the caller frees them). Returns 0,
 * or -1 for XML that does not parse. */
NPYL_HIDDEN int npyl_remote_xml_parse(xml_state *s, const char *body, size_t len);
/* Whether the work on pool p must stop now: -ECANCELED with a message in
 * err when the client was cancelled or, on a caller's pool, its interrupt
 * callback returned non-zero (asked at most every NPYL_REMOTE_POLL_MS);
 * else 0. */
NPYL_HIDDEN int npyl_remote_stopped(npyl_remote *r, npyl_xpool *p, char *err, size_t errlen);
/* The S3 error of an XML body: "Code: Message" into buf ("" when none). */
NPYL_HIDDEN void npyl_remote_xml_error(const char *body, size_t len, char *buf, size_t buflen);

/* ---- npyload_remote_cache.c -------------------------------------------- */

NPYL_HIDDEN int npyl_cache_open(npyl_cache **out, const char *dir, uint64_t bound,
                                uint64_t block, char *err, size_t errlen);
NPYL_HIDDEN void npyl_cache_close(npyl_cache *c);
NPYL_HIDDEN uint64_t npyl_cache_block(const npyl_cache *c);
NPYL_HIDDEN uint64_t npyl_cache_bound(const npyl_cache *c);
/* The key of an object version: 32 hex digits and a NUL. */
NPYL_HIDDEN void npyl_cache_key(const npyl_cache *c, const char *url, const char *etag,
                                uint64_t size, char key[33]);
/* Opens block k of `key` when it is in the cache with exactly len bytes
 * (refreshing its age for LRU); -1 on a miss. */
NPYL_HIDDEN int npyl_cache_lookup(npyl_cache *c, const char *key, uint64_t k, uint64_t len);
/* A temporary file for block k of `key` (tmp receives its name); the fd
 * or -errno. */
NPYL_HIDDEN int npyl_cache_tmp(npyl_cache *c, const char *key, uint64_t k, char tmp[64]);
/* Makes the complete temporary file `tmp` (len bytes, synced and closed)
 * block k of `key`: under the cache's lock, eviction of the least
 * recently used blocks so the cache stays within its bound, and an atomic
 * rename. Returns 0 (or the block was not kept: larger than the bound, or
 * an error writing; a cache is an optimisation), *evicted the blocks
 * removed. */
NPYL_HIDDEN int npyl_cache_commit(npyl_cache *c, const char *tmp, const char *key,
                                  uint64_t k, uint64_t len, uint64_t *evicted);
/* Drops a temporary file (a failed or retried transfer). */
NPYL_HIDDEN void npyl_cache_discard(npyl_cache *c, const char *tmp);

/* In-flight blocks, one fetch per block per node: concurrent misses of
 * one block, by threads of this process or by other processes sharing the
 * directory, wait for the one fetch instead of fetching it again (the
 * cache file's header comment says how: a registry per process, an OFD
 * lock per block node-wide). A thread that misses block k of `key` claims
 * it: *claim says whether it fetches it (NPYL_CLAIM_OWN: release it when
 * the fetch is over, committed or not) or another thread or process is
 * fetching it (NPYL_CLAIM_WAIT: wait for it, then look it up). The
 * returned ticket is for release / wait. A thread never waits while it
 * owns unreleased claims, and a holder of a node lock never waits, so no
 * cycle. */
typedef struct npyl_inflight npyl_inflight;
enum { NPYL_CLAIM_OWN = 1, NPYL_CLAIM_WAIT = 2 };
NPYL_HIDDEN npyl_inflight *npyl_cache_claim(npyl_cache *c, const char *key, uint64_t k,
                                            int *claim);
/* The owner's fetch is over: rc 0 (committed, or not kept: the waiter
 * looks it up and fetches it itself when absent) or its failure, with
 * msg (the message naming the URL) handed to this process's waiters. The
 * node lock is dropped here: call it after the commit. */
NPYL_HIDDEN void npyl_cache_release(npyl_cache *c, npyl_inflight *t, int rc, const char *msg);
/* Waits at most timeout_ms for the fetch; returns 0 when it is over (look
 * the block up), the owner's failure (a thread of this process; msg copied
 * to err), 1 when the wait timed out or timeout_ms <= 0 (then fetch it,
 * outside the cache), or NPYL_WAIT_YOURS: the other process's fetcher went
 * away (died or failed) without storing the block, and the ticket is now
 * the caller's claim (NPYL_CLAIM_OWN: fetch it at once, before any other
 * wait, and release it). Every other return frees the ticket. */
enum { NPYL_WAIT_YOURS = 2 };
NPYL_HIDDEN int npyl_cache_wait(npyl_cache *c, npyl_inflight *t, long timeout_ms, char *err,
                                size_t errlen);
/* npyl_cache_wait that also gives up (returns 1, the ticket freed) within
 * 50 ms of *stop becoming non-zero: a background fill that is being
 * stopped never waits out another process's fetch. */
NPYL_HIDDEN int npyl_cache_wait_stop(npyl_cache *c, npyl_inflight *t, long timeout_ms,
                                     _Atomic int *stop, char *err, size_t errlen);

#endif
