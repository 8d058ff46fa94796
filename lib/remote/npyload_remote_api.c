/* lib/remote's public API (include/npyload.h, "Remote objects without a
 * loader"): a client made from a configuration, and globs over it;
 * npyload_remote_inspect, which reads NPY headers and seek tables, is the
 * store layer's (lib/store/npyload_store_remote.c). Compiled with and
 * without libcurl: without it, npyl_remote_create fails saying what to
 * install. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "npyload_remote.h"

struct npyload_remote_client {
    npyl_remote *r;
    int configured;           /* a configuration was given (s3:// allowed) */
};

int npyload_remote_client_create(npyload_remote_client **out, const npyload_remote *cfg,
                                 size_t size, char *err, size_t errlen)
{
    if (!out)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyload_remote_client_create: NULL out");
    *out = NULL;
    npyload_remote mine;
    if (cfg) {
        int rc = npyl_sized_in(&mine, sizeof mine, cfg, size,
                               NPYL_SIZE_THROUGH(npyload_remote, retry_base_ms));
        if (rc)
            return npyl_fail(err, errlen, rc,
                             rc == NPYLOAD_EINVAL
                                 ? "npyload_remote_client_create: size %zu is below the first "
                                   "layout of npyload_remote"
                                 : "npyload_remote_client_create: a member this library does "
                                   "not know is set (size %zu)", size);
    }
    npyload_remote_client *c = calloc(1, sizeof *c);
    if (!c)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    int rc = npyl_remote_create(&c->r, cfg ? &mine : NULL, err, errlen);
    if (rc) {
        free(c);
        return rc;
    }
    c->configured = cfg != NULL;
    *out = c;
    return 0;
}

void npyload_remote_client_destroy(npyload_remote_client *c)
{
    if (!c)
        return;
    npyl_remote_destroy(c->r);
    free(c);
}

int npyload_is_remote(const char *path) { return npyl_remote_is_url(path); }

void npyload_paths_free(char **paths, size_t n) { npyl_free_paths(paths, n); }

int npyload_remote_glob(npyload_remote_client *c, const char *pattern, char ***paths,
                        size_t *n, char *err, size_t errlen)
{
    if (!c || !pattern || !paths || !n)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyload_remote_glob: NULL argument");
    *paths = NULL;
    *n = 0;
    if (!npyl_remote_is_url(pattern))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "%s: not an s3:// or http(s):// path",
                         pattern);
    int rc = npyl_remote_check_url(c->r, c->configured, pattern, err, errlen);
    if (rc)
        return rc;
    if (strncasecmp(pattern, "s3://", 5) == 0)
        return npyl_remote_glob(c->r, pattern, paths, n, err, errlen);
    /* http(s)://: no listing; the URL itself. */
    char **one = calloc(1, sizeof *one);
    if (!one || !(one[0] = strdup(pattern))) {
        free(one);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    *paths = one;
    *n = 1;
    return 0;
}

npyl_remote *npyl_remote_client_core(const npyload_remote_client *c, int *configured)
{
    *configured = c->configured;
    return c->r;
}
