/* lib/remote in a build without libcurl (or expat): the same API, and
 * every remote path fails with a message that says what to install. */
#include <stdio.h>
#include <strings.h>

#include "npyload_remote.h"

#define NO_REMOTE                                                               \
    "built without libcurl and expat, so s3:// and https:// paths cannot be "   \
    "read: install libcurl4-openssl-dev and libexpat1-dev (Debian) and rebuild"

int npyl_remote_is_url(const char *p)
{
    return p && (strncasecmp(p, "s3://", 5) == 0 || strncasecmp(p, "http://", 7) == 0 ||
                 strncasecmp(p, "https://", 8) == 0);
}

int npyl_remote_built(char *version, size_t len)
{
    if (version && len)
        snprintf(version, len, "%s", NO_REMOTE);
    return 0;
}

int npyl_remote_create(npyl_remote **out, const npyload_remote *cfg, char *err, size_t errlen)
{
    (void)cfg;
    *out = NULL;
    return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED, "libnpyload was " NO_REMOTE);
}

void npyl_remote_destroy(npyl_remote *r) { (void)r; }

int npyl_remote_check_url(const npyl_remote *r, int configured, const char *url, char *err,
                          size_t errlen)
{
    (void)r;
    (void)configured;
    return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED, "%.512s: libnpyload was " NO_REMOTE,
                     url);
}

int npyl_remote_glob(npyl_remote *r, const char *pattern, char ***paths, size_t *n, char *err,
                     size_t errlen)
{
    *paths = NULL;
    *n = 0;
    return npyl_remote_check_url(r, 0, pattern, err, errlen);
}

int npyl_remote_probe_all(npyl_remote *r, npyl_remote_probe *p, size_t n,
                          npyl_remote_want_tail want_tail, size_t *bad, char *err,
                          size_t errlen)
{
    (void)want_tail;
    *bad = 0;
    return npyl_remote_check_url(r, 0, n ? p[0].url : "", err, errlen);
}

void npyl_remote_probe_free(npyl_remote_probe *p) { (void)p; }

int npyl_remote_get(npyl_remote *r, const npyl_remote_obj *o, uint64_t off, size_t len,
                    void *dst, char *err, size_t errlen)
{
    (void)off;
    (void)len;
    (void)dst;
    return npyl_remote_check_url(r, 0, o->url, err, errlen);
}

int npyl_remote_ctx_create(npyl_remote_ctx **out, npyl_remote *r, const npyl_remote_obj *objs,
                           size_t nobjs, char *err, size_t errlen)
{
    (void)r;
    (void)objs;
    (void)nobjs;
    *out = NULL;
    return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED, "libnpyload was " NO_REMOTE);
}

void npyl_remote_ctx_destroy(npyl_remote_ctx *c) { (void)c; }

int npyl_remote_read(npyl_remote_ctx *c, const npyl_remote_req *reqs, size_t n, size_t *bad,
                     uint64_t *bytes_read, char *err, size_t errlen)
{
    (void)c;
    (void)reqs;
    (void)n;
    (void)bytes_read;
    if (bad)
        *bad = 0;
    return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED, "libnpyload was " NO_REMOTE);
}

int npyl_remote_submit(npyl_remote_ctx *c, const npyl_remote_req *reqs, size_t n, char *err,
                       size_t errlen)
{
    (void)c;
    (void)reqs;
    (void)n;
    return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED, "libnpyload was " NO_REMOTE);
}

int npyl_remote_complete(npyl_remote_ctx *c, size_t *bad, uint64_t *bytes_read, char *err,
                         size_t errlen)
{
    return npyl_remote_read(c, NULL, 0, bad, bytes_read, err, errlen);
}

void npyl_remote_counters_add(const npyl_remote *r, npyl_remote_counters *k)
{
    (void)r;
    (void)k;
}

void npyl_remote_cancel(npyl_remote *r, int on)
{
    (void)r;
    (void)on;
}

void npyl_remote_set_interrupt(npyl_remote *r, int (*fn)(void *), void *arg)
{
    (void)r;
    (void)fn;
    (void)arg;
}

int npyl_bulk_fill(npyl_remote *r, const npyl_remote_obj *objs, size_t n,
                   const npyl_bulk_opts *o, npyl_bulk_state *st, char *err, size_t errlen)
{
    (void)r;
    (void)objs;
    (void)n;
    (void)o;
    (void)st;
    return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED, "libnpyload was " NO_REMOTE);
}

int npyl_bulk_fill_spans(npyl_remote *r, const npyl_remote_obj *objs, size_t n,
                         const npyl_bulk_span *spans, size_t ns, const npyl_bulk_opts *o,
                         npyl_bulk_state *st, char *err, size_t errlen)
{
    (void)spans;
    (void)ns;
    return npyl_bulk_fill(r, objs, n, o, st, err, errlen);
}

int npyl_remote_cache_facts(const npyl_remote *r, uint64_t *block, uint64_t *budget)
{
    (void)r;
    *block = *budget = 0;
    return 0;
}
