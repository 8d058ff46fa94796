/* Globs over S3 listings: "s3://bucket/prefix/train_*.npy.zst" lists the
 * keys under the pattern's literal prefix with ListObjectsV2 (page after
 * page through continuation tokens; with delimiter '/' when the wildcards
 * cannot cross a '/'), keeps those that fnmatch the pattern as glob(3)
 * would (FNM_PATHNAME | FNM_PERIOD), and sorts them by strcmp, as local
 * globs are. The pages are parsed by npyload_remote_xml.c. */
#include "npyload_remote_impl.h"

#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- globs ---------------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends "&name=value" (value encoded) to q. */
static int add_param(char *q, size_t cap, size_t *len, const char *name, const char *value)
{
    size_t k = *len;
    int w = snprintf(q + k, cap - k, "%s%s=", k ? "&" : "", name);
    if (w < 0 || (size_t)w >= cap - k)
        return -1;
    k += (size_t)w;
    if (npyl_remote_encode(q, cap, &k, value, 0) != 0)
        return -1;
    *len = k;
    return 0;
}

int npyl_remote_glob(npyl_remote *r, const char *pattern, char ***paths, size_t *n, char *err,
                     size_t errlen)
{
    *paths = NULL;
    *n = 0;
    npyl_rurl u;
    int rc = npyl_rurl_parse(pattern, &u, err, errlen);
    if (rc)
        return rc;
    size_t lit = u.kind == 's' ? strcspn(u.key, "*?[") : 0;
    if (u.kind != 's' && strcspn(pattern, "*[") < strlen(pattern))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: an http(s):// URL cannot be listed: give the files as a list",
                         pattern);
    if (u.kind != 's' || u.key[lit] == 0) {
        /* No wildcard: the object itself, as glob(3) returns a plain path
         * (whether it exists is found out at start). */
        char **one = calloc(1, sizeof *one);
        if (!one || !(one[0] = strdup(pattern))) {
            free(one);
            return npyl_fail(err, errlen, -ENOMEM, "out of memory");
        }
        *paths = one;
        *n = 1;
        return 0;
    }
    /* The literal part up to its last '/', and whether the wildcards stay
     * inside one path segment (then a delimiter spares the deeper keys). */
    char prefix[1024];
    size_t plen = lit;
    if (plen >= sizeof prefix)
        return npyl_fail(err, errlen, NPYLOAD_ETOOBIG, "%s: the prefix is too long", pattern);
    memcpy(prefix, u.key, plen);
    prefix[plen] = 0;
    int one_level = strchr(u.key + lit, '/') == NULL;
    const char *kpat = u.key;
    xml_state *s = calloc(1, sizeof *s);
    if (!s)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    char bucket_url[300];
    snprintf(bucket_url, sizeof bucket_url, "s3://%s/", u.bucket);
    char *base = npyl_remote_request_url(r, bucket_url, NULL);
    size_t listed = 0, pages = 0;
    char **out = NULL;
    size_t nout = 0, cap = 0;
    char *last = NULL; /* the last key of the pages so far */
    char sent[sizeof s->token] = ""; /* the continuation token of this page */
    if (!base) {
        free(s);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    for (;;) {
        /* A listing that never ends (a server that says IsTruncated with
         * the same token, or pages that go back) must fail, not list
         * forever: each page must move on (keys ascend, as ListObjectsV2
         * returns them, and a token never repeats the one sent), and there
         * is a bound on pages. */
        if (pages >= NPYL_REMOTE_LIST_MAX_PAGES || listed >= NPYL_REMOTE_LIST_MAX_KEYS) {
            rc = npyl_fail(err, errlen, NPYLOAD_ETOOBIG, "%s: the listing goes on past %zu "
                           "pages and %zu keys (the bounds are %d pages, %d keys): a server "
                           "that never ends its listing, or a prefix far too broad", pattern,
                           pages, listed, NPYL_REMOTE_LIST_MAX_PAGES,
                           NPYL_REMOTE_LIST_MAX_KEYS);
            break;
        }
        snprintf(sent, sizeof sent, "%s", s->token);
        /* SigV4 signs the query in canonical form: names sorted, values
         * encoded. */
        char q[2048], maxk[24];
        size_t qlen = 0;
        q[0] = 0;
        snprintf(maxk, sizeof maxk, "%ld", r->list_max_keys);
        int bad = (s->token[0] && add_param(q, sizeof q, &qlen, "continuation-token", s->token)) ||
                  (one_level && add_param(q, sizeof q, &qlen, "delimiter", "/")) ||
                  add_param(q, sizeof q, &qlen, "list-type", "2") ||
                  add_param(q, sizeof q, &qlen, "max-keys", maxk) ||
                  add_param(q, sizeof q, &qlen, "prefix", prefix);
        if (bad) {
            rc = npyl_fail(err, errlen, NPYLOAD_ETOOBIG, "%s: listing query too long", pattern);
            break;
        }
        size_t ulen = strlen(base) + qlen + 2;
        char *url = malloc(ulen);
        if (!url) {
            rc = npyl_fail(err, errlen, -ENOMEM, "out of memory");
            break;
        }
        snprintf(url, ulen, "%s?%s", base, q);
        char *body = NULL;
        size_t blen = 0;
        rc = npyl_xfer_get_body(r, pattern, url, &body, &blen, err, errlen);
        free(url);
        if (rc)
            break;
        s->nkeys = 0;
        s->truncated = 0;
        s->token[0] = 0;
        int prc = blen > INT32_MAX ? -1 : npyl_remote_xml_parse(s, body, blen);
        free(body);
        if (prc || s->oom) {
            rc = npyl_fail(err, errlen, s->oom ? -ENOMEM : NPYLOAD_EREMOTE,
                           "%s: page %zu of the listing %s", pattern, pages + 1,
                           s->oom ? "does not fit in memory" : "is not ListObjectsV2 XML");
            break;
        }
        pages++;
        if (s->nkeys && last && strcmp(s->keys[0], last) <= 0) {
            rc = npyl_fail(err, errlen, NPYLOAD_EREMOTE, "%s: page %zu of the listing goes "
                           "back to key '%.200s' after '%.200s' (a listing that does not "
                           "move on; the server repeats its pages)", pattern, pages,
                           s->keys[0], last);
        } else if (s->nkeys) {
            free(last);
            if (!(last = strdup(s->keys[s->nkeys - 1])))
                rc = npyl_fail(err, errlen, -ENOMEM, "out of memory");
        }
        for (size_t i = 0; i < s->nkeys && rc == 0; i++) {
            const char *key = s->keys[i];
            listed++;
            size_t kl = strlen(key);
            if (kl && key[kl - 1] != '/' && fnmatch(kpat, key, FNM_PATHNAME | FNM_PERIOD) == 0) {
                if (nout == cap) {
                    size_t nc = cap ? 2 * cap : 64;
                    char **o = realloc(out, nc * sizeof *o);
                    if (!o) {
                        rc = npyl_fail(err, errlen, -ENOMEM, "out of memory");
                        break;
                    }
                    out = o;
                    cap = nc;
                }
                size_t len = strlen(u.bucket) + kl + 7;
                if (!(out[nout] = malloc(len))) {
                    rc = npyl_fail(err, errlen, -ENOMEM, "out of memory");
                    break;
                }
                snprintf(out[nout++], len, "s3://%s/%s", u.bucket, key);
            }
            free(s->keys[i]);
            s->keys[i] = NULL;
        }
        for (size_t i = 0; i < s->nkeys; i++)
            free(s->keys[i]);
        s->nkeys = 0;
        if (rc)
            break;
        if (!s->truncated)
            break;
        if (!s->token[0]) {
            rc = npyl_fail(err, errlen, NPYLOAD_EREMOTE, "%s: a truncated listing page "
                           "without a NextContinuationToken", pattern);
            break;
        }
        if (strcmp(s->token, sent) == 0) {
            rc = npyl_fail(err, errlen, NPYLOAD_EREMOTE, "%s: page %zu of the listing is "
                           "truncated and gives back the continuation token it was asked "
                           "with ('%.60s'): the listing would never end", pattern, pages,
                           s->token);
            break;
        }
    }
    free(last);
    free(s->keys);
    free(s);
    free(base);
    if (rc == 0 && nout == 0)
        rc = npyl_fail(err, errlen, NPYLOAD_ENOFILES,
                       "%s: no objects match (%zu keys listed under prefix '%s')", pattern,
                       listed, prefix);
    if (rc) {
        npyl_free_paths(out, nout);
        return rc;
    }
    qsort(out, nout, sizeof *out, cmp_str);
    *paths = out;
    *n = nout;
    return 0;
}
