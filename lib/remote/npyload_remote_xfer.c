/* Transfers: ranged GETs on a thread's curl multi handle, several in
 * flight (connections kept alive and reused by the multi handle; HTTP/2
 * multiplexed where the server offers it), with the checks that keep wrong
 * bytes out: the status, Content-Range against the range asked and the
 * size seen at start, the ETag seen at start (If-Match, and the response's
 * own ETag), and the byte count. Transient failures (connection refused or
 * reset, timeouts, 5xx, 429/503 "slow down") are retried with exponential
 * backoff and jitter, a bounded number of times; every wait is bounded
 * (curl's timeouts per attempt, the poll's timeout, the backoff cap).
 *
 * The body of a ranged GET is scattered into its pieces (the requests'
 * destinations) as it arrives, and into the cache's temporary files when
 * the transfer fills the cache. Messages never hold credentials: the URL
 * shown is the one the caller gave, without a query string. */
#include "npyload_remote_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* ---- the pool of handles --------------------------------------------------- */

int npyl_xpool_init(npyl_xpool *p, int inflight)
{
    memset(p, 0, sizeof *p);
    p->multi = curl_multi_init();
    p->easy = calloc((size_t)inflight, sizeof *p->easy);
    p->free_ = calloc((size_t)inflight, sizeof *p->free_);
    if (!p->multi || !p->easy || !p->free_)
        return -ENOMEM;
    curl_multi_setopt(p->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)inflight);
    for (int i = 0; i < inflight; i++) {
        if (!(p->easy[i] = curl_easy_init()))
            return -ENOMEM;
        p->neasy++;
        p->free_[p->nfree++] = p->easy[i];
    }
    p->rng = npyl_now_ns() ^ (uint64_t)(uintptr_t)p;
    return 0;
}

void npyl_xpool_fini(npyl_xpool *p)
{
    for (int i = 0; i < p->neasy; i++)
        curl_easy_cleanup(p->easy[i]);
    if (p->multi)
        curl_multi_cleanup(p->multi);
    free(p->easy);
    free(p->free_);
    memset(p, 0, sizeof *p);
}

/* ---- fills ----------------------------------------------------------------- */

static void fill_close_block(npyl_remote *r, npyl_fill *f, int keep)
{
    if (f->fd < 0)
        return;
    if (keep && fdatasync(f->fd) != 0)
        keep = 0;
    close(f->fd);
    f->fd = -1;
    if (!keep) {
        npyl_cache_discard(r->cache, f->tmp[f->k - f->k0]);
        f->tmp[f->k - f->k0][0] = 0;
        f->broken = 1;
    }
}

/* Drops every temporary file of f (a failed attempt). */
static void fill_reset(npyl_remote *r, npyl_fill *f)
{
    if (!f)
        return;
    if (f->fd >= 0) {
        close(f->fd);
        f->fd = -1;
    }
    for (uint64_t k = f->k0; k < f->k1; k++)
        if (f->tmp[k - f->k0][0]) {
            npyl_cache_discard(r->cache, f->tmp[k - f->k0]);
            f->tmp[k - f->k0][0] = 0;
        }
    f->broken = 0;
    f->k = f->k0;
}

/* Object bytes [lo, hi) into the fill's block files, in order. */
static void fill_write(npyl_remote *r, npyl_fill *f, uint64_t lo, const unsigned char *p,
                       uint64_t hi)
{
    uint64_t B = npyl_cache_block(r->cache);
    while (lo < hi && !f->broken) {
        uint64_t k = lo / B, end = (k + 1) * B < hi ? (k + 1) * B : hi;
        if (f->fd < 0 || k != f->k) {
            fill_close_block(r, f, 1);
            f->k = k;
            int fd = npyl_cache_tmp(r->cache, f->key, k, f->tmp[k - f->k0]);
            if (fd < 0) {
                f->tmp[k - f->k0][0] = 0;
                f->broken = 1;
                return;
            }
            f->fd = fd;
        }
        size_t n = (size_t)(end - lo);
        while (n > 0) {
            ssize_t w = write(f->fd, p, n);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                fill_close_block(r, f, 0);
                return;
            }
            p += w;
            n -= (size_t)w;
        }
        lo = end;
    }
}

/* The transfer succeeded: every block of it into the cache. */
static void fill_commit(npyl_remote *r, npyl_xfer *x)
{
    npyl_fill *f = x->fill;
    if (!f)
        return;
    fill_close_block(r, f, !f->broken);
    uint64_t B = npyl_cache_block(r->cache);
    for (uint64_t k = f->k0; k < f->k1; k++) {
        char *tmp = f->tmp[k - f->k0];
        if (!tmp[0])
            continue;
        uint64_t len = (k + 1) * B < x->size ? B : x->size - k * B;
        uint64_t evicted = 0;
        if (f->broken) {
            npyl_cache_discard(r->cache, tmp);
        } else if (npyl_cache_commit(r->cache, tmp, f->key, k, len, &evicted) == 0) {
            atomic_fetch_add_explicit(&r->cache_write_bytes, len, memory_order_relaxed);
        }
        if (evicted)
            atomic_fetch_add_explicit(&r->cache_evictions, evicted, memory_order_relaxed);
        tmp[0] = 0;
    }
}

/* ---- callbacks -------------------------------------------------------------- */

static int fail_x(npyl_xfer *x, int code, const char *fmt, ...) NPYL_PRINTF(3, 4);
static int fail_x(npyl_xfer *x, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->failmsg, sizeof x->failmsg, fmt, ap);
    va_end(ap);
    x->fail = code;
    return code;
}

static int parse_u64(const char *s, const char **end, uint64_t *v)
{
    if (*s < '0' || *s > '9')
        return -1;
    uint64_t r = 0;
    while (*s >= '0' && *s <= '9') {
        if (r > (UINT64_MAX - 9) / 10)
            return -1;
        r = r * 10 + (uint64_t)(*s++ - '0');
    }
    *v = r;
    *end = s;
    return 0;
}

static size_t on_header(char *b, size_t size, size_t nitems, void *arg)
{
    npyl_xfer *x = arg;
    size_t len = size * nitems;
    if (len >= 5 && strncmp(b, "HTTP/", 5) == 0) {
        /* A new response (after a redirect or a 100 Continue). */
        const char *sp = memchr(b, ' ', len);
        x->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        x->have_cr = 0;
        x->clen = UINT64_MAX;
        x->etag_got[0] = 0;
        return len;
    }
    char line[NPYL_ETAG_LEN + 64];
    size_t n = len < sizeof line - 1 ? len : sizeof line - 1;
    memcpy(line, b, n);
    line[n] = 0;
    while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == '\n' || line[n - 1] == ' '))
        line[--n] = 0;
    char *colon = strchr(line, ':');
    if (!colon)
        return len;
    *colon = 0;
    const char *v = colon + 1, *end;
    while (*v == ' ' || *v == '\t')
        v++;
    if (strcasecmp(line, "content-range") == 0 && strncasecmp(v, "bytes ", 6) == 0) {
        v += 6;
        uint64_t a, bb, t;
        x->have_cr = 0;
        if (*v == '*') {
            end = v + 1;
            a = bb = UINT64_MAX;
        } else if (parse_u64(v, &end, &a) || *end != '-' || parse_u64(end + 1, &end, &bb)) {
            return len;
        }
        if (*end != '/')
            return len;
        if (end[1] == '*')
            t = UINT64_MAX;
        else if (parse_u64(end + 1, &end, &t))
            return len;
        x->cr_a = a;
        x->cr_b = bb;
        x->cr_total = t;
        x->have_cr = 1;
    } else if (strcasecmp(line, "content-length") == 0) {
        uint64_t cl;
        if (parse_u64(v, &end, &cl) == 0)
            x->clen = cl;
    } else if (strcasecmp(line, "etag") == 0) {
        snprintf(x->etag_got, sizeof x->etag_got, "%s", v);
    }
    return len;
}

/* The first body byte of a 200 or 206: the checks that decide whether
 * this body is the bytes asked for. Returns 0 or a failure code. */
static int check_response(npyl_xfer *x)
{
    uint64_t total;
    if (x->status == 206) {
        if (!x->have_cr || x->cr_a == UINT64_MAX)
            return fail_x(x, NPYLOAD_EREMOTE, "a 206 response without a usable "
                                              "Content-Range");
        total = x->cr_total;
        x->base = x->cr_a;
    } else {
        total = x->clen;
        x->base = 0;
    }
    if (x->probe) {
        if (total == UINT64_MAX)
            return fail_x(x, NPYLOAD_EREMOTE, "the server gives no object size "
                                              "(no Content-Range total, no Content-Length)");
        x->got_size = total;
        if (x->status == 206 && (x->cr_a != x->a || x->cr_b + 1 != (x->b < total ? x->b : total)))
            return fail_x(x, NPYLOAD_EREMOTE,
                          "Content-Range bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64
                          " does not answer the range asked", x->cr_a, x->cr_b, total);
        return 0;
    }
    if (total != UINT64_MAX && total != x->size)
        return fail_x(x, NPYLOAD_ECHANGED,
                      "the object changed since start: it holds %" PRIu64 " bytes, %" PRIu64
                      " at start", total, x->size);
    if (x->etag[0] && x->etag_got[0] && strcmp(x->etag, x->etag_got) != 0)
        return fail_x(x, NPYLOAD_ECHANGED,
                      "the object changed since start: ETag %.60s, %.60s at start",
                      x->etag_got, x->etag);
    if (x->status == 206 && (x->cr_a != x->a || x->cr_b + 1 != x->b))
        return fail_x(x, NPYLOAD_EREMOTE,
                      "Content-Range bytes %" PRIu64 "-%" PRIu64 " does not answer the range "
                      "asked", x->cr_a, x->cr_b);
    return 0;
}

static size_t on_body(char *p, size_t size, size_t nmemb, void *arg)
{
    npyl_xfer *x = arg;
    size_t n = size * nmemb;
    if (x->mem_mode || (x->status != 200 && x->status != 206)) {
        /* A listing, or an error's body (kept for its message). */
        if (x->mem_mode && x->status >= 200 && x->status < 300) {
            if (x->mem_len + n + 1 > x->mem_cap) {
                size_t cap = x->mem_cap ? x->mem_cap : 65536;
                while (cap < x->mem_len + n + 1)
                    cap *= 2;
                if (cap > (64u << 20)) {
                    fail_x(x, NPYLOAD_ETOOBIG, "a listing page over 64 MiB");
                    return 0;
                }
                char *m = realloc(x->mem, cap);
                if (!m) {
                    fail_x(x, -ENOMEM, "out of memory");
                    return 0;
                }
                x->mem = m;
                x->mem_cap = cap;
            }
            memcpy(x->mem + x->mem_len, p, n);
            x->mem_len += n;
            x->mem[x->mem_len] = 0;
        } else {
            size_t k = sizeof x->body - 1 - x->body_len;
            k = n < k ? n : k;
            memcpy(x->body + x->body_len, p, k);
            x->body_len += k;
            x->body[x->body_len] = 0;
        }
        return n;
    }
    if (x->pos == 0 && !x->hdr_done) {
        x->hdr_done = 1;
        if (check_response(x))
            return 0;
    }
    uint64_t o = x->base + x->pos, end = o + n;
    x->pos += n;
    uint64_t want_end = x->b;
    if (x->probe && x->got_size < want_end)
        want_end = x->got_size;
    if (x->status == 206 && end > want_end) {
        fail_x(x, NPYLOAD_EREMOTE, "more bytes than the range asked");
        return 0;
    }
    uint64_t lo = o > x->a ? o : x->a, hi = end < want_end ? end : want_end;
    if (lo < hi) {
        while (x->p0 < x->npieces && x->pieces[x->p0].off + x->pieces[x->p0].len <= lo)
            x->p0++;
        for (size_t j = x->p0; j < x->npieces && x->pieces[j].off < hi; j++) {
            const npyl_piece *q = &x->pieces[j];
            uint64_t s = q->off > lo ? q->off : lo, e = q->off + q->len < hi ? q->off + q->len : hi;
            if (s < e)
                memcpy(q->dst + (s - q->off), p + (s - o), (size_t)(e - s));
        }
    }
    if (end >= want_end && x->status == 200 && end > want_end) {
        x->enough = 1; /* a 200 body: the rest is not wanted */
        return 0;
    }
    return n;
}

/* The fill needs the client; a transfer's callbacks get this pair. */
typedef struct xcb {
    npyl_remote *r;
    npyl_xfer *x;
} xcb;

static size_t on_body_fill(char *p, size_t size, size_t nmemb, void *arg)
{
    xcb *c = arg;
    npyl_xfer *x = c->x;
    size_t rc = on_body(p, size, nmemb, x);
    if (x->fill && !x->fail && !x->mem_mode && x->hdr_done &&
        (x->status == 200 || x->status == 206)) {
        /* on_body placed the chunk (x->base is known from its first one)
         * and counted it: it ends at base + pos. */
        size_t n = size * nmemb;
        uint64_t end = x->base + x->pos, o = end - n;
        uint64_t lo = o > x->a ? o : x->a, hi = end < x->b ? end : x->b;
        if (lo < hi)
            fill_write(c->r, x->fill, lo, (const unsigned char *)p + (lo - o), hi);
    }
    return rc;
}

static size_t on_header_cb(char *b, size_t size, size_t nitems, void *arg)
{
    return on_header(b, size, nitems, ((xcb *)arg)->x);
}

/* ---- starting and finishing a transfer --------------------------------------- */

static void detach(npyl_xpool *p, npyl_xfer *x)
{
    if (!x->easy)
        return;
    curl_multi_remove_handle(p->multi, x->easy);
    xcb *c = NULL;
    curl_easy_getinfo(x->easy, CURLINFO_PRIVATE, (char **)&c);
    free(c);
    curl_easy_setopt(x->easy, CURLOPT_PRIVATE, NULL);
    p->free_[p->nfree++] = x->easy;
    x->easy = NULL;
    curl_slist_free_all(x->hdrs);
    x->hdrs = NULL;
}

static int start(npyl_remote *r, npyl_xpool *p, npyl_xfer *x)
{
    CURL *e = p->free_[--p->nfree];
    xcb *c = malloc(sizeof *c);
    /* mem_mode: x->url is the request URL itself (a listing). */
    char *url = x->mem_mode ? strdup(x->url) : npyl_remote_request_url(r, x->url, NULL);
    int s3 = x->mem_mode ? x->sign : strncasecmp(x->url, "s3://", 5) == 0;
    int rc = c && url ? 0 : -ENOMEM;
    if (rc == 0)
        rc = npyl_remote_setup_easy(r, e, s3, url, x->probe || x->mem_mode ? NULL : x->etag,
                                    &x->hdrs);
    free(url);
    if (rc) {
        free(c);
        p->free_[p->nfree++] = e;
        return rc;
    }
    c->r = r;
    c->x = x;
    char range[48];
    if (!x->mem_mode) {
        snprintf(range, sizeof range, "%" PRIu64 "-%" PRIu64, x->a, x->b - 1);
        curl_easy_setopt(e, CURLOPT_RANGE, range);
    }
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body_fill);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header_cb);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)c);
    x->curlerr[0] = 0;
    x->timed_out = 0;
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->curlerr);
    x->status = 0;
    x->hdr_done = 0;
    x->have_cr = 0;
    x->clen = UINT64_MAX;
    x->etag_got[0] = 0;
    x->pos = 0;
    x->p0 = 0;
    x->enough = 0;
    x->fail = 0;
    x->failmsg[0] = 0;
    x->body_len = 0;
    x->body[0] = 0;
    x->mem_len = 0;
    x->easy = e;
    x->state = NPYL_X_ACTIVE;
    if (curl_multi_add_handle(p->multi, e) != CURLM_OK) {
        detach(p, x);
        x->state = NPYL_X_WAIT;
        return -ENOMEM;
    }
    return 0;
}

static int transient_curl(CURLcode c)
{
    switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
        return 1;
    default:
        return 0;
    }
}

static int errno_of_curl(CURLcode c)
{
    switch (c) {
    case CURLE_COULDNT_CONNECT:
        return -ECONNREFUSED;
    case CURLE_COULDNT_RESOLVE_HOST:
        return -EHOSTUNREACH;
    case CURLE_OPERATION_TIMEDOUT:
        /* Not -ETIMEDOUT: npyload_loader_next_timeout() says "no batch
         * yet" with it. The message names the URL and the timeout. */
        return NPYLOAD_EREMOTE;
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
        return -ECONNRESET;
    default:
        return NPYLOAD_EREMOTE;
    }
}

static int transient_http(long s)
{
    return s == 408 || s == 429 || s == 500 || s == 502 || s == 503 || s == 504;
}

static int code_of_http(long s)
{
    if (s == 404 || s == 410)
        return -ENOENT;
    if (s == 401 || s == 403)
        return -EACCES;
    if (s == 412)
        return NPYLOAD_ECHANGED;
    return NPYLOAD_EREMOTE;
}

/* Why this attempt failed, in words (x->failmsg), and whether it may be
 * retried: 0 success, 1 transient, else the permanent code. */
static int judge(npyl_xfer *x, CURLcode res)
{
    if (x->fail)
        return x->fail == NPYLOAD_EREMOTE && !x->probe ? 1 : x->fail;
    if (res == CURLE_WRITE_ERROR && x->enough)
        res = CURLE_OK;
    if (res != CURLE_OK) {
        fail_x(x, errno_of_curl(res), "%s%s%s", curl_easy_strerror(res),
               x->curlerr[0] ? ": " : "", x->curlerr);
        x->timed_out = res == CURLE_OPERATION_TIMEDOUT;
        return transient_curl(res) ? 1 : x->fail;
    }
    if (x->mem_mode) {
        if (x->status >= 200 && x->status < 300)
            return 0;
    } else if (x->status == 200 || x->status == 206) {
        uint64_t want = x->b;
        if (x->probe && x->got_size < want)
            want = x->got_size;
        if (!x->hdr_done && want > x->a) {
            fail_x(x, NPYLOAD_EREMOTE, "an empty body");
            return 1;
        }
        if (x->base + x->pos < want) {
            fail_x(x, -ECONNRESET, "the body ended after %" PRIu64 " of %" PRIu64 " bytes",
                   x->base + x->pos > x->a ? x->base + x->pos - x->a : 0, want - x->a);
            return 1;
        }
        return 0;
    } else if (x->probe && x->status == 416 && x->have_cr && x->cr_total == 0) {
        x->got_size = 0; /* an empty object */
        return 0;
    }
    char s3err[300];
    npyl_remote_xml_error(x->mem_mode ? (x->mem ? x->mem : "") : x->body,
                          x->mem_mode ? x->mem_len : x->body_len, s3err, sizeof s3err);
    if (x->mem_mode && x->status >= 300)
        npyl_remote_xml_error(x->body, x->body_len, s3err, sizeof s3err);
    const char *hint = "";
    if (x->status == 412)
        hint = " (If-Match: the object changed since start)";
    else if (x->status == 416 && !x->probe)
        hint = " (the object is now shorter than at start)";
    else if (x->status == 301 || x->status == 307)
        hint = " (the bucket is in another region or needs another endpoint)";
    fail_x(x, x->status == 416 ? NPYLOAD_ECHANGED : code_of_http(x->status), "HTTP %ld%s%s%s",
           x->status, s3err[0] ? " " : "", s3err, hint);
    return transient_http(x->status) ? 1 : x->fail;
}

static uint64_t next_rand(uint64_t *s)
{
    *s += 0x9E3779B97F4A7C15ull;
    return npyl_mix64(*s);
}

/* Exponential backoff with "equal jitter": half the delay fixed, half
 * random, doubling from retry_base_ms up to NPYL_REMOTE_RETRY_CAP_MS. */
static uint64_t backoff_ns(npyl_remote *r, npyl_xpool *p, int attempt)
{
    uint64_t ms = (uint64_t)r->retry_base_ms;
    for (int i = 1; i < attempt && ms < NPYL_REMOTE_RETRY_CAP_MS; i++)
        ms *= 2;
    if (ms > NPYL_REMOTE_RETRY_CAP_MS)
        ms = NPYL_REMOTE_RETRY_CAP_MS;
    uint64_t half = ms * 1000000ull / 2;
    return half + next_rand(&p->rng) % (half + 1);
}

static int describe(const npyl_remote *r, npyl_xfer *x, int code, char *err, size_t errlen)
{
    char shown[512];
    npyl_remote_display(x->url, shown, sizeof shown);
    char range[64] = " (a listing page)";
    if (!x->mem_mode)
        snprintf(range, sizeof range, " bytes %" PRIu64 "-%" PRIu64, x->a, x->b - 1);
    char tmo[96] = "";
    if (x->timed_out) /* a stalled server: which limit gave up */
        snprintf(tmo, sizeof tmo, "; the remote timeout is %.3g s per attempt (remote "
                 "'timeout')", (double)r->timeout_ms / 1000);
    double secs = (double)(npyl_now_ns() - x->first_ns) / 1e9;
    return npyl_fail(err, errlen, code, "%s: GET%s failed: %s (%d attempt%s, %.1f s%s)", shown,
                     range, x->failmsg[0] ? x->failmsg : npyload_strerror(code),
                     x->attempt + 1, x->attempt ? "s" : "", secs, tmo);
}

int npyl_remote_stopped(npyl_remote *r, npyl_xpool *p, char *err, size_t errlen)
{
    if (atomic_load_explicit(&r->cancel, memory_order_acquire))
        return npyl_fail(err, errlen, -ECANCELED, "stopped: the loader is being closed");
    if (!p || !p->caller || !r->interrupt)
        return 0;
    uint64_t now = npyl_now_ns();
    if (p->asked_ns && now - p->asked_ns < NPYL_REMOTE_POLL_MS * 1000000ull)
        return 0;
    p->asked_ns = now;
    if (r->interrupt(r->interrupt_arg))
        return npyl_fail(err, errlen, -ECANCELED, "interrupted");
    return 0;
}

void npyl_remote_cancel(npyl_remote *r, int on)
{
    if (r)
        atomic_store_explicit(&r->cancel, on, memory_order_release);
}

void npyl_remote_set_interrupt(npyl_remote *r, int (*fn)(void *), void *arg)
{
    if (!r)
        return;
    r->interrupt = fn;
    r->interrupt_arg = arg;
}

/* Every transfer of a run WAITing for its first attempt. */
static void run_init(npyl_xfer *x, size_t n, uint64_t t0)
{
    for (size_t i = 0; i < n; i++) {
        x[i].state = NPYL_X_WAIT;
        x[i].attempt = 0;
        x[i].due_ns = 0;
        x[i].first_ns = t0;
        x[i].easy = NULL;
        x[i].hdrs = NULL;
        if (x[i].fill) {
            x[i].fill->fd = -1;
            x[i].fill->k = x[i].fill->k0;
            x[i].fill->broken = 0;
        }
    }
}

int npyl_xfer_start(npyl_remote *r, npyl_xpool *p, npyl_xfer *x, size_t n, size_t *bad,
                    char *err, size_t errlen)
{
    p->t0 = npyl_now_ns();
    p->next = 0;
    run_init(x, n, p->t0);
    while (p->next < n && p->nfree > 0) {
        int rc = start(r, p, &x[p->next]);
        if (rc) {
            for (size_t i = 0; i < p->next; i++) {
                detach(p, &x[i]);
                fill_reset(r, x[i].fill);
                x[i].state = NPYL_X_WAIT;
            }
            *bad = p->next;
            return npyl_fail(err, errlen, rc, "out of memory");
        }
        p->next++;
    }
    /* The requests go out now: on a connection kept from the last round at
     * once; on a new one once it is connected, which a few passes without
     * waiting see through on a near server (a far one finishes connecting
     * in npyl_xfer_run). */
    int running = 0;
    for (int pass = 0; pass < 4; pass++) {
        curl_multi_perform(p->multi, &running);
        if (!running || curl_multi_poll(p->multi, NULL, 0, 0, NULL) != CURLM_OK)
            break;
    }
    p->begun = 1;
    return 0;
}

int npyl_xfer_run(npyl_remote *r, npyl_xpool *p, npyl_xfer *x, size_t n, size_t *bad,
                  char *err, size_t errlen)
{
    uint64_t t0;
    size_t left = n, next = 0; /* next: transfers before it were started once */
    int rc = 0;
    if (p->begun) { /* npyl_xfer_start began it */
        t0 = p->t0;
        next = p->next;
        p->begun = 0;
    } else {
        t0 = npyl_now_ns();
        run_init(x, n, t0);
    }
    size_t nretry = 0; /* transfers waiting for a retry */
    while (left > 0) {
        char why[64];
        if ((rc = npyl_remote_stopped(r, p, why, sizeof why)) != 0) {
            for (*bad = 0; *bad < n && x[*bad].state == NPYL_X_DONE; (*bad)++)
                ;
            if (*bad == n)
                *bad = 0;
            const npyl_xfer *t = &x[*bad];
            char shown[512];
            npyl_remote_display(t->url, shown, sizeof shown);
            if (t->mem_mode) /* a listing: npyl_xfer_get_body names it */
                rc = npyl_fail(err, errlen, rc, "%s", why);
            else
                rc = npyl_fail(err, errlen, rc, "%s: GET bytes %" PRIu64 "-%" PRIu64 ": %s",
                               shown, t->a, t->b - 1, why);
            goto stop;
        }
        uint64_t now = npyl_now_ns(), wake = UINT64_MAX;
        if (nretry)
            for (size_t i = 0; i < next && p->nfree > 0; i++)
                if (x[i].state == NPYL_X_WAIT) {
                    if (x[i].due_ns <= now) {
                        if ((rc = start(r, p, &x[i]))) {
                            *bad = i;
                            rc = npyl_fail(err, errlen, rc, "out of memory");
                            goto stop;
                        }
                        nretry--;
                    } else if (x[i].due_ns < wake) {
                        wake = x[i].due_ns;
                    }
                }
        while (next < n && p->nfree > 0) {
            if ((rc = start(r, p, &x[next]))) {
                *bad = next;
                rc = npyl_fail(err, errlen, rc, "out of memory");
                goto stop;
            }
            next++;
        }
        int running = 0;
        curl_multi_perform(p->multi, &running);
        CURLMsg *m;
        int q;
        while ((m = curl_multi_info_read(p->multi, &q))) {
            if (m->msg != CURLMSG_DONE)
                continue;
            xcb *c = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&c);
            npyl_xfer *t = c->x;
            CURLcode res = m->data.result;
            int v = judge(t, res);
            detach(p, t);
            atomic_fetch_add_explicit(&r->requests, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&r->bytes, t->pos, memory_order_relaxed);
            if (v == 0) {
                t->state = NPYL_X_DONE;
                left--;
                fill_commit(r, t);
            } else if (v == 1 && t->attempt < r->retries) {
                t->attempt++;
                t->state = NPYL_X_WAIT;
                t->due_ns = npyl_now_ns() + backoff_ns(r, p, t->attempt);
                fill_reset(r, t->fill);
                nretry++;
                atomic_fetch_add_explicit(&r->retried, 1, memory_order_relaxed);
            } else {
                *bad = (size_t)(t - x);
                rc = describe(r, t, v == 1 ? (t->fail ? t->fail : NPYLOAD_EREMOTE) : v, err,
                              errlen);
                fill_reset(r, t->fill);
                goto stop;
            }
        }
        if (left == 0)
            break;
        now = npyl_now_ns();
        long tmo = NPYL_REMOTE_POLL_MS; /* the stop flag is looked at this often */
        if (wake != UINT64_MAX && p->nfree > 0)
            tmo = wake <= now ? 0 : (long)((wake - now) / 1000000 + 1);
        if (tmo > NPYL_REMOTE_POLL_MS)
            tmo = NPYL_REMOTE_POLL_MS;
        if (next < n && p->nfree > 0)
            continue; /* handles came free: start the next transfers now */
        if (running > 0 || tmo > 0)
            curl_multi_poll(p->multi, NULL, 0, (int)tmo, NULL);
    }
stop:
    for (size_t i = 0; i < n; i++)
        if (x[i].state == NPYL_X_ACTIVE) {
            detach(p, &x[i]);
            fill_reset(r, x[i].fill);
            x[i].state = NPYL_X_WAIT;
        }
    atomic_fetch_add_explicit(&r->wait_ns, npyl_now_ns() - t0, memory_order_relaxed);
    return rc;
}

int npyl_xfer_get_body(npyl_remote *r, const char *url, const char *request_url, char **body,
                       size_t *len, char *err, size_t errlen)
{
    *body = NULL;
    *len = 0;
    npyl_xpool p;
    if (npyl_xpool_init(&p, 1) != 0) {
        npyl_xpool_fini(&p);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    npyl_xfer *x = calloc(1, sizeof *x);
    if (!x) {
        npyl_xpool_fini(&p);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    p.caller = 1; /* a listing runs on the caller's thread */
    x->mem_mode = 1;
    x->sign = strncasecmp(url, "s3://", 5) == 0;
    x->url = request_url;
    x->etag = "";
    size_t bad;
    int rc = npyl_xfer_run(r, &p, x, 1, &bad, err, errlen);
    if (rc) {
        /* Name the URL as the caller gave it, not the request URL. */
        char shown[512], msg[1024];
        npyl_remote_display(url, shown, sizeof shown);
        const char *tail = strstr(err ? err : "", ": GET");
        snprintf(msg, sizeof msg, "%s%s%s", shown, tail ? "" : ": ",
                 tail ? tail : err ? err : "");
        if (err && errlen)
            snprintf(err, errlen, "%s", msg);
        free(x->mem);
    } else {
        *body = x->mem;
        *len = x->mem_len;
    }
    free(x);
    npyl_xpool_fini(&p);
    return rc;
}
