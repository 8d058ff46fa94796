/* The tests' fault-injecting store: "fault://PATH" is the local file PATH,
 * read with pread, with the latency, short reads and errors its tu_fault
 * configuration asks for. All of it is this one file: a store is the
 * operations of npyl_store_ops (lib/store/npyload_store.h), and it joins a
 * loader with one line, npyl_loader_register_store(L, &tu_store_fault,
 * &cfg). It reads inside complete, as the local store does (submit starts
 * nothing), so in a round that mixes it with remote objects it is
 * completed while their GETs are in flight. */
#include "tu_store_fault.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PREFIX "fault://"
#define PREFIX_LEN 8

typedef struct fault_store {
    tu_fault *cfg;
    uint64_t *size;       /* per file of the table */
} fault_store;

typedef struct fault_ctx {
    fault_store *s;
    const npyl_sfile *t;
} fault_ctx;

static const char *local_of(const char *path) { return path + PREFIX_LEN; }

static int f_claims(const char *path) { return strncmp(path, PREFIX, PREFIX_LEN) == 0; }

static int f_open(npyl_store **out, const void *cfg, char *err, size_t errlen)
{
    fault_store *s = calloc(1, sizeof *s);
    if (!s)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    s->cfg = (tu_fault *)cfg;
    *out = (npyl_store *)s;
    return 0;
}

static void f_close(npyl_store *st)
{
    fault_store *s = (fault_store *)st;
    if (s)
        free(s->size);
    free(s);
}

static int f_table(npyl_store *st, size_t nfiles)
{
    fault_store *s = (fault_store *)st;
    free(s->size);
    s->size = nfiles ? calloc(nfiles, sizeof *s->size) : NULL;
    return nfiles && !s->size ? -ENOMEM : 0;
}

/* Exactly n bytes at off of `path`, or -errno (-EIO when it ends early). */
static int read_exact(const char *path, void *buf, size_t n, uint64_t off)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            close(fd);
            return -e;
        }
        got += (size_t)r;
    }
    close(fd);
    return 0;
}

/* The probe's reader: n bytes at off of fault://PATH (ctx). */
static int probe_read(void *ctx, void *buf, size_t n, uint64_t off, char *err, size_t errlen)
{
    const char *path = ctx;
    int rc = read_exact(local_of(path), buf, n, off);
    return rc ? npyl_fail(err, errlen, rc, "%s: probe failed: %s", path, npyload_strerror(rc))
              : 0;
}

static int f_probe(npyl_store *st, const npyl_sfile *t, const uint32_t *idx, size_t n,
                   npyl_sprobe *out, size_t *bad, char *err, size_t errlen)
{
    fault_store *s = (fault_store *)st;
    for (size_t k = 0; k < n; k++) {
        const char *path = t[idx[k]].path;
        struct stat sb;
        if (stat(local_of(path), &sb) != 0 || !S_ISREG(sb.st_mode)) {
            *bad = k;
            return npyl_fail(err, errlen, -ENOENT, "%s: no such regular file", path);
        }
        s->size[idx[k]] = (uint64_t)sb.st_size;
        int rc = npyl_sprobe_fill(&out[k], (uint64_t)sb.st_size, probe_read, (void *)path,
                                  path, err, errlen);
        if (rc) {
            *bad = k;
            return rc;
        }
    }
    return 0;
}

static int f_read_at(npyl_store *st, const npyl_sfile *t, uint32_t file, void *buf, size_t n,
                     uint64_t off, char *err, size_t errlen)
{
    (void)st;
    int rc = read_exact(local_of(t[file].path), buf, n, off);
    return rc ? npyl_fail(err, errlen, rc, "%s: read failed", t[file].path) : 0;
}

static int f_key(npyl_store *st, const npyl_sfile *t, uint32_t file, const char *path,
                 char *key, size_t keylen)
{
    (void)st;
    struct stat sb;
    if (stat(local_of(path ? path : t[file].path), &sb) != 0)
        return -errno;
    snprintf(key, keylen, "f%llx:%llx", (unsigned long long)sb.st_dev,
             (unsigned long long)sb.st_ino);
    return 0;
}

static int f_ctx_open(npyl_store *st, const npyl_sfile *t, size_t nfiles,
                      const npyl_store_cfg *cfg, npyl_store_ctx **out, char *err,
                      size_t errlen)
{
    (void)nfiles;
    (void)cfg;
    fault_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    c->s = (fault_store *)st;
    c->t = t;
    *out = (npyl_store_ctx *)c;
    return 0;
}

static void f_ctx_close(npyl_store_ctx *c) { free(c); }

static int f_complete(npyl_store_ctx *ct, const npyl_req *reqs, size_t n, uint64_t *done,
                      size_t *bad, uint64_t *landed, char *err, size_t errlen)
{
    fault_ctx *c = (fault_ctx *)ct;
    tu_fault *f = c->s->cfg;
    atomic_fetch_add(&f->completes, 1);
    if (f->on_complete)
        f->on_complete(f->arg);
    if (f->latency_us) {
        struct timespec ts = {f->latency_us / 1000000, (long)(f->latency_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    int short_any = 0;
    for (size_t i = 0; i < n; i++) {
        const npyl_req *q = &reqs[i];
        const char *path = c->t[q->file].path;
        if (f->fail_path && strstr(path, f->fail_path) && q->offset < f->fail_to &&
            q->offset + q->len > f->fail_from &&
            (!f->fail_limit || atomic_fetch_add(&f->budget_used, 1) < f->fail_limit)) {
            atomic_fetch_add(&f->failures, 1);
            *bad = i;
            return npyl_fail(err, errlen, f->fail_code, "%s: injected failure reading %" PRIu64
                             " bytes at offset %" PRIu64, path, q->len, q->offset);
        }
        uint64_t len = q->len;
        if (f->short_max && len > f->short_max) {
            len = f->short_max;
            atomic_fetch_add(&f->shorts, 1);
            short_any = 1;
        }
        int rc = read_exact(local_of(path), q->dst, (size_t)len, q->offset);
        if (rc) {
            *bad = i;
            return npyl_fail(err, errlen, rc, "%s: read failed at offset %" PRIu64, path,
                             q->offset);
        }
        done[i] = len;
        *landed += len;
    }
    return short_any ? NPYL_STORE_SHORT : 0;
}

static int f_glob(npyl_store *st, const char *pattern, char ***paths, size_t *n, char *err,
                  size_t errlen)
{
    (void)st;
    int rc = npyl_glob_sorted(local_of(pattern), paths, n, err, errlen);
    for (size_t i = 0; rc == 0 && i < *n; i++) {
        size_t len = strlen((*paths)[i]);
        char *p = malloc(PREFIX_LEN + len + 1);
        if (!p)
            return npyl_fail(err, errlen, -ENOMEM, "out of memory");
        memcpy(p, PREFIX, PREFIX_LEN);
        memcpy(p + PREFIX_LEN, (*paths)[i], len + 1);
        free((*paths)[i]);
        (*paths)[i] = p;
    }
    return rc;
}

const npyl_store_ops tu_store_fault = {
    .name = "fault",
    .claims = f_claims,
    .open = f_open,
    .close = f_close,
    .glob = f_glob,
    .table = f_table,
    .probe = f_probe,
    .read_at = f_read_at,
    .key = f_key,
    .ctx_open = f_ctx_open,
    .ctx_close = f_ctx_close,
    .submit = NULL, /* read in complete */
    .complete = f_complete,
};
