/* Remote objects read as start reads them: a probed object as a reader
 * (npyl_rsrc: the probe's head and tail bytes, ranged GETs for the rest),
 * shared by start (npyload_loader_fields.c) and npyload_remote_inspect (the
 * header facts of one object, for the tools and npyload.inspect(); the
 * client itself is lib/remote's public API, npyload_remote_api.c).
 * Nothing here keeps state. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "npyload_store.h"

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

/* ---- npyload_remote_inspect: the public client's header facts ---- */

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

int npyload_remote_inspect(npyload_remote_client *c, const char *url, npyload_header *hdr,
                           npyload_zst_file **zst, char *err, size_t errlen)
{
    if (!c || !url || !hdr || !zst)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyload_remote_inspect: NULL argument");
    *zst = NULL;
    memset(hdr, 0, sizeof *hdr);
    int configured = 0;
    npyl_remote *r = npyl_remote_client_core(c, &configured);
    int rc = npyl_remote_check_url(r, configured, url, err, errlen);
    if (rc)
        return rc;
    npyl_remote_probe p;
    memset(&p, 0, sizeof p);
    p.url = url;
    size_t bad = 0;
    /* want_tail NULL would fetch every tail: only a .npy.zst's is needed. */
    rc = npyl_remote_probe_all(r, &p, 1, zst_tail, &bad, err, errlen);
    if (rc) {
        npyl_remote_probe_free(&p);
        return rc;
    }
    npyl_rsrc s;
    npyl_rsrc_init(&s, r, &p);
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
            src->r = r;
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
