/* The remote client: its configuration (copied; the secret wiped on
 * destroy and never formatted into a message), URLs (s3://bucket/key to
 * a request URL in path- or virtual-hosted style, names for messages),
 * and the set-up every curl handle gets: timeouts, TLS from the system,
 * SigV4 signing by libcurl (CURLOPT_AWS_SIGV4), no proxy taken from the
 * environment (the library reads none), no signals. */
#include "npyload_remote_impl.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- curl_global_init, once ---------------------------------------------- */

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_OK;

static void global_init(void) { global_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

int npyl_remote_global_init(char *err, size_t errlen)
{
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK)
        return npyl_fail(err, errlen, NPYLOAD_EREMOTE, "curl_global_init failed: %s",
                         curl_easy_strerror(global_rc));
    return 0;
}

int npyl_remote_built(char *version, size_t len)
{
    if (version && len) {
        const curl_version_info_data *v = curl_version_info(CURLVERSION_NOW);
        snprintf(version, len, "libcurl %s%s%s%s, expat", v->version,
                 v->ssl_version ? " (" : "", v->ssl_version ? v->ssl_version : "",
                 v->ssl_version ? ")" : "");
    }
    return 1;
}

/* ---- URLs ------------------------------------------------------------------ */

int npyl_remote_is_url(const char *p)
{
    return p && (strncasecmp(p, "s3://", 5) == 0 || strncasecmp(p, "http://", 7) == 0 ||
                 strncasecmp(p, "https://", 8) == 0);
}

int npyl_rurl_parse(const char *url, npyl_rurl *u, char *err, size_t errlen)
{
    memset(u, 0, sizeof *u);
    if (strncasecmp(url, "s3://", 5) != 0) {
        u->kind = 'h';
        const char *host = strstr(url, "://") + 3;
        if (!*host || *host == '/')
            return npyl_fail(err, errlen, NPYLOAD_EINVAL, "%s: no host in the URL", url);
        return 0;
    }
    u->kind = 's';
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t bl = slash ? (size_t)(slash - b) : strlen(b);
    if (bl == 0 || bl >= sizeof u->bucket)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: no bucket name (expected s3://BUCKET/KEY)", url);
    for (size_t i = 0; i < bl; i++)
        if (!(islower((unsigned char)b[i]) || isdigit((unsigned char)b[i]) || b[i] == '-' ||
              b[i] == '.' || b[i] == '_'))
            return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                             "%s: '%.*s' is not a valid bucket name (lowercase letters, "
                             "digits, '-', '.')", url, (int)bl, b);
    memcpy(u->bucket, b, bl);
    u->key = slash ? slash + 1 : "";
    return 0;
}

int npyl_remote_encode(char *dst, size_t cap, size_t *len, const char *s, int keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t k = *len;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int keep = isalnum(*p) || *p == '-' || *p == '_' || *p == '.' || *p == '~' ||
                   (keep_slash && *p == '/');
        if (k + (keep ? 1 : 3) >= cap)
            return -1;
        if (keep) {
            dst[k++] = (char)*p;
        } else {
            dst[k++] = '%';
            dst[k++] = hex[*p >> 4];
            dst[k++] = hex[*p & 15];
        }
    }
    dst[k] = 0;
    *len = k;
    return 0;
}

char *npyl_remote_request_url(const npyl_remote *r, const char *url, const char *query)
{
    npyl_rurl u;
    if (npyl_rurl_parse(url, &u, NULL, 0) != 0)
        return NULL;
    if (u.kind == 'h')
        return strdup(url);
    size_t cap = strlen(r->endpoint) + strlen(u.bucket) + 3 * strlen(u.key) +
                 (query ? strlen(query) : 0) + 16;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    int path = r->path_style >= 0 ? r->path_style : strchr(u.bucket, '.') != NULL;
    size_t k;
    if (path) {
        k = (size_t)snprintf(out, cap, "%s/%s/", r->endpoint, u.bucket);
    } else {
        /* scheme://bucket.host[:port][/base]/ */
        const char *host = strstr(r->endpoint, "://") + 3;
        k = (size_t)snprintf(out, cap, "%.*s%s.%s/", (int)(host - r->endpoint), r->endpoint,
                             u.bucket, host);
    }
    if (npyl_remote_encode(out, cap, &k, u.key, 1) != 0) {
        free(out);
        return NULL;
    }
    if (query)
        snprintf(out + k, cap - k, "?%s", query);
    return out;
}

void npyl_remote_display(const char *url, char *buf, size_t len)
{
    npyload_mask_urls(url, buf, len);
}

/* ---- curl handles ---------------------------------------------------------- */

#define SHA256_EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

int npyl_remote_setup_easy(const npyl_remote *r, CURL *e, int s3, const char *request_url,
                           const char *etag, struct curl_slist **hdrs)
{
    curl_easy_reset(e);
    *hdrs = NULL;
    curl_easy_setopt(e, CURLOPT_URL, request_url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, r->connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, r->timeout_ms);
    /* The library reads no environment variable: an empty proxy turns off
     * libcurl's http_proxy / HTTPS_PROXY / NO_PROXY. */
    curl_easy_setopt(e, CURLOPT_PROXY, r->proxy ? r->proxy : "");
    if (r->ca_file)
        curl_easy_setopt(e, CURLOPT_CAINFO, r->ca_file);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, NULL); /* bytes as stored */
#ifdef CURL_HTTP_VERSION_2TLS
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
#endif
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_USERAGENT, "npyload/" NPYLOAD_VERSION_STRING);
    struct curl_slist *h = NULL, *t;
    char line[NPYL_ETAG_LEN + 32];
    if (!s3) {
        /* A CDN may redirect; S3 requests are signed for one host. */
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(e, CURLOPT_MAXREDIRS, 5L);
        curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    } else if (r->access_key) {
        curl_easy_setopt(e, CURLOPT_AWS_SIGV4, r->sigv4);
        curl_easy_setopt(e, CURLOPT_USERNAME, r->access_key);
        curl_easy_setopt(e, CURLOPT_PASSWORD, r->secret_key);
        /* S3 wants the payload's hash; a GET has none: the hash of "" is
         * both what libcurl signs and what the header says. */
        if (!(t = curl_slist_append(h, "x-amz-content-sha256: " SHA256_EMPTY)))
            goto oom;
        h = t;
        if (r->session_token) {
            size_t n = strlen(r->session_token) + 32;
            char *tok = malloc(n);
            if (!tok)
                goto oom;
            snprintf(tok, n, "x-amz-security-token: %s", r->session_token);
            t = curl_slist_append(h, tok);
            explicit_bzero(tok, n);
            free(tok);
            if (!t)
                goto oom;
            h = t;
        }
    }
    if (etag && *etag) {
        snprintf(line, sizeof line, "If-Match: %s", etag);
        if (!(t = curl_slist_append(h, line)))
            goto oom;
        h = t;
    }
    if (h)
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    *hdrs = h;
    return 0;
oom:
    curl_slist_free_all(h);
    return -ENOMEM;
}

/* ---- the client -------------------------------------------------------- */

static char *dup_or_null(const char *s) { return s && *s ? strdup(s) : NULL; }

static int bad_member(char *err, size_t errlen, const char *what)
{
    return npyl_fail(err, errlen, NPYLOAD_EINVAL, "remote configuration: %s", what);
}

int npyl_remote_create(npyl_remote **out, const npyload_remote *c, char *err, size_t errlen)
{
    *out = NULL;
    npyload_remote none;
    memset(&none, 0, sizeof none);
    if (!c)
        c = &none;
    int rc = npyl_remote_global_init(err, errlen);
    if (rc)
        return rc;
    if (c->endpoint && *c->endpoint && strncasecmp(c->endpoint, "http://", 7) != 0 &&
        strncasecmp(c->endpoint, "https://", 8) != 0)
        return bad_member(err, errlen, "endpoint must start with http:// or https:// "
                                       "(\"http://127.0.0.1:8333\")");
    if ((c->access_key && *c->access_key) != (c->secret_key && *c->secret_key))
        return bad_member(err, errlen, c->access_key && *c->access_key
                                           ? "access_key is set but secret_key is missing"
                                           : "secret_key is set but access_key is missing");
    if (c->session_token && *c->session_token && !(c->access_key && *c->access_key))
        return bad_member(err, errlen, "session_token needs access_key and secret_key");
    if (c->path_style < 0 || c->path_style > NPYLOAD_REMOTE_VIRTUAL)
        return bad_member(err, errlen, "path_style must be NPYLOAD_REMOTE_AUTO, _PATH or "
                                       "_VIRTUAL");
    if (c->retries < -1 || c->retries > 100 || c->timeout_ms < 0 || c->connect_timeout_ms < 0 ||
        c->max_inflight < 0 || c->max_inflight > 256 || c->cache_bytes < 0 ||
        c->cache_block < 0 || c->list_max_keys < 0 || c->list_max_keys > 1000 ||
        c->retry_base_ms < 0 || c->retry_base_ms > 60000)
        return bad_member(err, errlen, "a count or time is out of range (retries -1..100, "
                                       "max_inflight 0..256, list_max_keys 0..1000, "
                                       "retry_base_ms 0..60000, the others >= 0)");
    const char *region = c->region && *c->region ? c->region : "us-east-1";
    for (const char *p = region; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '-'))
            return bad_member(err, errlen, "region holds characters other than letters, "
                                           "digits and '-'");
    if (strlen(region) > 40)
        return bad_member(err, errlen, "region is longer than 40 characters");
    npyl_remote *r = calloc(1, sizeof *r);
    if (!r)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    r->region = strdup(region);
    if (c->endpoint && *c->endpoint) {
        r->endpoint = strdup(c->endpoint);
        if (r->endpoint) {
            size_t n = strlen(r->endpoint);
            while (n > 0 && r->endpoint[n - 1] == '/')
                r->endpoint[--n] = 0;
        }
    } else {
        char buf[96];
        snprintf(buf, sizeof buf, "https://s3.%s.amazonaws.com", region);
        r->endpoint = strdup(buf);
        r->aws = 1;
    }
    r->access_key = dup_or_null(c->access_key);
    r->secret_key = dup_or_null(c->secret_key);
    r->session_token = dup_or_null(c->session_token);
    r->ca_file = dup_or_null(c->ca_file);
    r->proxy = dup_or_null(c->proxy);
    /* A custom endpoint (SeaweedFS, MinIO...) takes path-style requests. */
    r->path_style = c->path_style == NPYLOAD_REMOTE_PATH      ? 1
                    : c->path_style == NPYLOAD_REMOTE_VIRTUAL ? 0
                    : r->aws                                  ? -1
                                                              : 1;
    r->retries = c->retries == -1 ? 0 : c->retries ? c->retries : NPYL_REMOTE_RETRIES;
    r->timeout_ms = c->timeout_ms ? (long)c->timeout_ms : NPYL_REMOTE_TIMEOUT_MS;
    r->connect_timeout_ms = c->connect_timeout_ms ? (long)c->connect_timeout_ms
                                                  : NPYL_REMOTE_CONNECT_MS;
    if (r->connect_timeout_ms > r->timeout_ms)
        r->connect_timeout_ms = r->timeout_ms;
    r->retry_base_ms = c->retry_base_ms ? (long)c->retry_base_ms : NPYL_REMOTE_RETRY_BASE_MS;
    r->max_inflight = c->max_inflight ? c->max_inflight : NPYL_REMOTE_INFLIGHT;
    r->list_max_keys = c->list_max_keys ? (long)c->list_max_keys : NPYL_REMOTE_LIST_KEYS;
    snprintf(r->sigv4, sizeof r->sigv4, "aws:amz:%s:s3", region);
    if (!r->region || !r->endpoint || (c->access_key && *c->access_key && !r->access_key) ||
        (c->secret_key && *c->secret_key && !r->secret_key) ||
        (c->session_token && *c->session_token && !r->session_token) ||
        (c->ca_file && *c->ca_file && !r->ca_file) || (c->proxy && *c->proxy && !r->proxy)) {
        npyl_remote_destroy(r);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    if (c->cache_dir && *c->cache_dir) {
        uint64_t bound = c->cache_bytes ? (uint64_t)c->cache_bytes : NPYL_REMOTE_CACHE_BYTES;
        uint64_t block = c->cache_block ? (uint64_t)c->cache_block : NPYL_REMOTE_CACHE_BLOCK;
        rc = npyl_cache_open(&r->cache, c->cache_dir, bound, block, err, errlen);
        if (rc) {
            npyl_remote_destroy(r);
            return rc;
        }
    }
    *out = r;
    return 0;
}

void npyl_remote_destroy(npyl_remote *r)
{
    if (!r)
        return;
    if (r->secret_key)
        explicit_bzero(r->secret_key, strlen(r->secret_key));
    if (r->session_token)
        explicit_bzero(r->session_token, strlen(r->session_token));
    if (r->access_key)
        explicit_bzero(r->access_key, strlen(r->access_key));
    free(r->secret_key);
    free(r->session_token);
    free(r->access_key);
    free(r->endpoint);
    free(r->region);
    free(r->ca_file);
    free(r->proxy);
    npyl_cache_close(r->cache);
    free(r);
}

int npyl_remote_check_url(const npyl_remote *r, int configured, const char *url, char *err,
                          size_t errlen)
{
    npyl_rurl u;
    char shown[512];
    npyl_remote_display(url, shown, sizeof shown);
    int rc = npyl_rurl_parse(shown, &u, err, errlen);
    if (rc)
        return rc;
    if (u.kind == 's' && !configured)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: an s3:// path needs a remote configuration (endpoint, region, "
                         "credentials): npyload_loader_set_remote() before adding the field "
                         "(Python: remote={...} or the AWS environment variables)",
                         shown);
    if (u.kind == 's' && !*u.key)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "%s: no key after the bucket", shown);
    (void)r;
    return 0;
}

void npyl_remote_counters_add(const npyl_remote *rr, npyl_remote_counters *k)
{
    npyl_remote *r = (npyl_remote *)rr; /* atomics: loads only */
    k->bytes += atomic_load_explicit(&r->bytes, memory_order_relaxed);
    k->requests += atomic_load_explicit(&r->requests, memory_order_relaxed);
    k->retries += atomic_load_explicit(&r->retried, memory_order_relaxed);
    k->wait_ns += atomic_load_explicit(&r->wait_ns, memory_order_relaxed);
    k->cache_hits += atomic_load_explicit(&r->cache_hits, memory_order_relaxed);
    k->cache_misses += atomic_load_explicit(&r->cache_misses, memory_order_relaxed);
    k->cache_read_bytes += atomic_load_explicit(&r->cache_read_bytes, memory_order_relaxed);
    k->cache_write_bytes += atomic_load_explicit(&r->cache_write_bytes, memory_order_relaxed);
    k->cache_evictions += atomic_load_explicit(&r->cache_evictions, memory_order_relaxed);
}
