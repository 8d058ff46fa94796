/* A small HTTP/1.1 file server on 127.0.0.1 for the C tests of remote
 * shards (tu_http.c): GET with Range, ETag, If-Match, keep-alive, and
 * injected faults. Tests only. */
#ifndef TU_HTTP_H
#define TU_HTTP_H

#include <stdint.h>

typedef struct tu_http tu_http;

/* Serves the files under `root` (URL path = path under root) on a free
 * port. Returns 0 or -1. */
int tu_http_start(tu_http **out, const char *root);
int tu_http_port(const tu_http *h);
/* The next n503 requests get "503 Slow Down" (connection closed), the
 * next nclose requests a connection closed without an answer. */
void tu_http_faults(tu_http *h, int n503, int nclose);
/* on: every request from now on is held (received, its answer not sent)
 * until hold is turned off, at most 5 s; tu_http_held says how many are
 * held right now. */
void tu_http_hold(tu_http *h, int on);
int tu_http_held(tu_http *h);
/* Hostile modes. stall 1: every request from now on gets no answer at all
 * (the connection stays open, silent) until stall 0 or tu_http_stop; the
 * count of such requests is tu_http_stalled. */
void tu_http_stall(tu_http *h, int on);
uint64_t tu_http_stalled(tu_http *h);
/* S3 listings (GET /BUCKET/?list-type=2...), answered as ListObjectsV2
 * pages that never end: TU_LIST_SAME_TOKEN, truncated pages without keys
 * that give back the token they were asked with; TU_LIST_REPEAT, new
 * tokens but the same keys on every page; TU_LIST_FRESH, new tokens and
 * new, ascending keys on every page (only a bound or an interrupt ends
 * it). TU_LIST_NONE (the default): listings get 404. tu_http_pages counts
 * the listing pages served. */
enum { TU_LIST_NONE, TU_LIST_SAME_TOKEN, TU_LIST_REPEAT, TU_LIST_FRESH };
void tu_http_listing(tu_http *h, int mode);
uint64_t tu_http_pages(tu_http *h);
/* GETs for a range from byte 0 (a header or a probe; data reads start at
 * the data's offset) served so far. */
uint64_t tu_http_heads(tu_http *h);
/* Requests served so far. */
uint64_t tu_http_requests(tu_http *h);
/* Stops accepting, closes every connection, joins its threads. */
void tu_http_stop(tu_http *h);

#endif
