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
/* Requests served so far. */
uint64_t tu_http_requests(tu_http *h);
/* Stops accepting, closes every connection, joins its threads. */
void tu_http_stop(tu_http *h);

#endif
