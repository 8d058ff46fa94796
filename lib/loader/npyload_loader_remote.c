/* Remote objects read as start reads them: a probed object as a reader
 * (npyl_rsrc: the probe's head and tail bytes, ranged GETs for the rest),
 * shared by start (npyload_loader_fields.c) and the public client API for
 * the tools and npyload.inspect(): npyload_remote_client_create, _glob,
 * _inspect. The client is lib/remote's, wrapped; nothing here keeps state
 * beyond it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "npyload_loader_internal.h"

/* ---- a probed object as a reader ---- */

void npyl_rsrc_init(npyl_rsrc *s, npyl_remote *r, const npyl_remote_probe *p)
{
    memset(s, 0, sizeof *s);
    s->r = r;
    s->p = p;
    s->o.url = p->url;
    s->o.size = p->size;
    snprintf(s->o.etag, sizeof s->o.etag, "%s", p->etag);
}

int npyl_rsrc_read(void *ctx, void *buf, size_t n, uint64_t off)
{
    const npyl_rsrc *s = ctx;
    const npyl_remote_probe *p = s->p;
    if (off > p->size || n > p->size - off)
        return -EIO;
    if (off + n <= p->head_len) {
        memcpy(buf, p->head + off, n);
        return 0;
    }
    if (p->tail && off >= p->size - p->tail_len) {
        memcpy(buf, p->tail + (off - (p->size - p->tail_len)), n);
        return 0;
    }
    return npyl_remote_get(s->r, &s->o, off, n, buf, NULL, 0);
}

int npyl_rsrc_npy_header(npyl_rsrc *s, npyload_header *h, char *err, size_t errlen)
{
    const npyl_remote_probe *p = s->p;
    const char *url = p->url;
    int rc = npyload_parse_header(p->head, p->head_len, p->size, url, h, err, errlen);
    if (rc == NPYLOAD_ETRUNCATED && h->header_len && h->data_offset > p->head_len &&
        h->data_offset <= p->size) {
        size_t need = (size_t)h->data_offset;
        unsigned char *big = malloc(need);
        if (!big)
            return npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", url);
        rc = npyl_remote_get(s->r, &s->o, 0, need, big, err, errlen);
        if (rc == 0)
            rc = npyload_parse_header(big, need, p->size, url, h, err, errlen);
        free(big);
    }
    return rc;
}

int npyl_rsrc_want_tail(const npyl_remote_probe *p)
{
    if (p->head_len >= 4 && npyl_zst_is_zstd(p->head))
        return 1;
    npyload_header h;
    if (npyload_parse_header(p->head, p->head_len, p->size, NULL, &h, NULL, 0) != 0)
        return 0;
    return strcmp(h.descr, "|u1") == 0 && p->size > h.data_offset + h.data_bytes;
}

/* ---- the public client ---- */

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

/* inspect's want_tail: a .npy.zst's seek table only. */
static int zst_tail(const npyl_remote_probe *p)
{
    return p->head_len >= 4 && npyl_zst_is_zstd(p->head);
}

/* What verify of a remote .npy.zst reads through: the object as seen at
 * inspect (URL, size, ETag; a changed object fails its GETs). */
typedef struct zst_remote_src {
    npyl_remote *r;
    npyl_remote_obj o;
    char url[];
} zst_remote_src;

static int zst_remote_read(void *ctx, void *buf, size_t n, uint64_t off)
{
    zst_remote_src *s = ctx;
    return npyl_remote_get(s->r, &s->o, off, n, buf, NULL, 0);
}

/* One object probed through the client as start probes it: *p (free it
 * with npyl_remote_probe_free, whatever the result). */
static int client_probe(npyload_remote_client *c, const char *url,
                        npyl_remote_want_tail want_tail, npyl_remote_probe *p, char *err,
                        size_t errlen)
{
    memset(p, 0, sizeof *p);
    p->url = url;
    int rc = npyl_remote_check_url(c->r, c->configured, url, err, errlen);
    size_t bad = 0;
    return rc ? rc : npyl_remote_probe_all(c->r, p, 1, want_tail, &bad, err, errlen);
}

int npyload_remote_inspect(npyload_remote_client *c, const char *url, npyload_header *hdr,
                           npyload_zst_file **zst, char *err, size_t errlen)
{
    if (!c || !url || !hdr || !zst)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyload_remote_inspect: NULL argument");
    *zst = NULL;
    memset(hdr, 0, sizeof *hdr);
    npyl_remote_probe p;
    /* want_tail NULL would fetch every tail: only a .npy.zst's is needed. */
    int rc = client_probe(c, url, zst_tail, &p, err, errlen);
    if (rc) {
        npyl_remote_probe_free(&p);
        return rc;
    }
    npyl_rsrc s;
    npyl_rsrc_init(&s, c->r, &p);
    if (p.head_len < 4 || !npyl_zst_is_zstd(p.head)) {
        rc = npyl_rsrc_npy_header(&s, hdr, err, errlen);
        npyl_remote_probe_free(&p);
        return rc;
    }
    npyl_zst_index x;
    memset(&x, 0, sizeof x);
    rc = npyl_zst_index_read(npyl_rsrc_read, &s, p.size, url, &x, err, errlen);
    if (rc == 0) {
        size_t ul = strlen(url) + 1;
        zst_remote_src *src = malloc(sizeof *src + ul);
        if (!src) {
            npyl_zst_index_free(&x);
            rc = npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", url);
        } else {
            memcpy(src->url, url, ul);
            src->r = c->r;
            src->o = s.o;
            src->o.url = src->url;
            if ((rc = npyl_zst_file_over(&x, url, zst_remote_read, src, free, zst)) != 0) {
                npyl_zst_index_free(&x);
                rc = npyl_fail(err, errlen, rc, "%s: out of memory", url);
            } else {
                *hdr = npyload_zst_file_facts(*zst)->hdr;
            }
        }
    }
    npyl_remote_probe_free(&p);
    return rc;
}

int npyload_remote_narrow_stored(npyload_remote_client *c, const char *url,
                                 const npyload_header *h, uint32_t *values,
                                 uint32_t *value_itemsize, char *value_descr, char *err,
                                 size_t errlen)
{
    if (!c || !url || !h)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "npyload_remote_narrow_stored: NULL argument");
    if (strcmp(h->descr, "|u1") != 0 || h->file_bytes <= h->data_offset + h->data_bytes)
        return 0; /* not the codes of a stored narrowed file: nothing to fetch */
    npyl_remote_probe p;
    int rc = client_probe(c, url, npyl_rsrc_want_tail, &p, err, errlen);
    if (rc == 0) {
        npyl_rsrc s;
        npyl_rsrc_init(&s, c->r, &p);
        npyload_header now = *h;
        now.file_bytes = p.size; /* as the object is now */
        rc = npyl_zst_store_facts(npyl_rsrc_read, &s, url, &now, values, value_itemsize,
                                  value_descr, err, errlen);
    }
    npyl_remote_probe_free(&p);
    return rc;
}
