/* The local store: files, read through lib/io (pread, io_uring, or the
 * mmap gather; the identity of each file checked by lib/io as it reads).
 * Its probe opens a file without blocking (a FIFO must not hang start),
 * refuses what is not a regular file with npyload_read_header's words,
 * records the identity lib/io checks later (device, inode, size, mtime)
 * and reads the first bytes (and the last, when the header asks). A round
 * is read in complete: lib/io blocks, so submit has nothing to start, and
 * the round's other stores (submitted first) run meanwhile. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "npyload_store.h"

typedef struct local_store {
    npyl_file_info *fi;   /* per file of the table (path NULL: not ours) */
    size_t n;
    npyl_io_maps *maps;   /* the files' mappings, shared by every context */
} local_store;

typedef struct local_ctx {
    npyl_io *io;
} local_ctx;

static int local_claims(const char *path)
{
    (void)path;
    return 1;
}

static int local_open(npyl_store **out, const void *cfg, char *err, size_t errlen)
{
    (void)cfg;
    local_store *s = calloc(1, sizeof *s);
    if (!s)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    *out = (npyl_store *)s;
    return 0;
}

static void local_close(npyl_store *st)
{
    local_store *s = (local_store *)st;
    if (!s)
        return;
    npyl_io_maps_destroy(s->maps);
    free(s->fi);
    free(s);
}

static int local_glob(npyl_store *st, const char *pattern, char ***paths, size_t *n, char *err,
                      size_t errlen)
{
    (void)st;
    return npyl_glob_sorted(pattern, paths, n, err, errlen);
}

static int local_table(npyl_store *st, size_t nfiles)
{
    local_store *s = (local_store *)st;
    free(s->fi);
    npyl_io_maps_destroy(s->maps); /* no context is open: set-up */
    s->maps = NULL;
    s->fi = nfiles ? calloc(nfiles, sizeof *s->fi) : NULL;
    s->n = s->fi ? nfiles : 0;
    if (nfiles && (!s->fi || npyl_io_maps_create(&s->maps, s->fi, nfiles) != 0))
        return -ENOMEM;
    return 0;
}

/* pread until n bytes or end of file: the count, or -errno. */
static ssize_t pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Opens a probed or probing file: a regular file, or the failure in
 * npyload_read_header's words. */
static int open_regular(const char *path, int *fd, struct stat *st, char *err, size_t errlen)
{
    /* O_NONBLOCK: open() of a FIFO without a writer (or of some devices)
     * would block forever before the regular-file check below; reads of a
     * regular file ignore it. */
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (*fd < 0) {
        int e = errno;
        return npyl_fail(err, errlen, -e, "%s: cannot open: %s", path, npyload_strerror(-e));
    }
    int rc = 0;
    if (fstat(*fd, st) != 0) {
        int e = errno;
        rc = npyl_fail(err, errlen, -e, "%s: cannot stat: %s", path, npyload_strerror(-e));
    } else if (S_ISDIR(st->st_mode)) {
        rc = npyl_fail(err, errlen, -EISDIR, "%s: is a directory", path);
    } else if (!S_ISREG(st->st_mode)) {
        rc = npyl_fail(err, errlen, NPYLOAD_EINVAL, "%s: not a regular file (%s)", path,
                       npyl_file_kind(st->st_mode));
    }
    if (rc) {
        close(*fd);
        *fd = -1;
    }
    return rc;
}

/* A probe's reader: exactly n bytes at off of an open file. */
typedef struct open_file {
    int fd;
    const char *path;
} open_file;

static int read_part(void *ctx, void *buf, size_t n, uint64_t off, char *err, size_t errlen)
{
    const open_file *f = ctx;
    ssize_t got = pread_full(f->fd, buf, n, off);
    if (got < 0)
        return npyl_fail(err, errlen, (int)got, "%s: read failed at offset %" PRIu64 ": %s",
                         f->path, off, npyload_strerror((int)got));
    if ((size_t)got < n)
        return npyl_fail(err, errlen, NPYLOAD_ECHANGED, "%s: %zu bytes at offset %" PRIu64
                         " expected, the file ends after %zd (changed while being read)",
                         f->path, n, off, got);
    return 0;
}

static int probe_one(local_store *s, const char *path, uint32_t i, npyl_sprobe *p, char *err,
                     size_t errlen)
{
    int fd;
    struct stat st;
    int rc = open_regular(path, &fd, &st, err, errlen);
    if (rc)
        return rc;
    if ((rc = npyl_io_fstat(fd, path, &s->fi[i])) != 0) {
        close(fd);
        return npyl_fail(err, errlen, rc, "%s: %s", path, npyload_strerror(rc));
    }
    open_file f = {fd, path};
    rc = npyl_sprobe_fill(p, s->fi[i].size, read_part, &f, path, err, errlen);
    close(fd);
    return rc;
}

static int local_probe(npyl_store *st, const npyl_sfile *t, const uint32_t *idx, size_t n,
                       npyl_sprobe *out, size_t *bad, char *err, size_t errlen)
{
    local_store *s = (local_store *)st;
    for (size_t k = 0; k < n; k++) {
        int rc = probe_one(s, t[idx[k]].path, idx[k], &out[k], err, errlen);
        if (rc) {
            *bad = k;
            return rc;
        }
    }
    return 0;
}

static int local_read_at(npyl_store *st, const npyl_sfile *t, uint32_t file, void *buf,
                         size_t n, uint64_t off, char *err, size_t errlen)
{
    local_store *s = (local_store *)st;
    const npyl_file_info *fi = &s->fi[file];
    const char *path = t[file].path;
    int fd;
    struct stat sb;
    int rc = open_regular(path, &fd, &sb, err, errlen);
    if (rc)
        return rc;
    npyl_file_info now;
    rc = npyl_io_fstat(fd, path, &now);
    if (rc == 0 && (now.dev != fi->dev || now.ino != fi->ino || now.size != fi->size ||
                    now.mtime_ns != fi->mtime_ns))
        rc = npyl_fail(err, errlen, NPYLOAD_ECHANGED, "%s: changed while start read it "
                       "(replaced or rewritten)", path);
    ssize_t got = rc ? 0 : pread_full(fd, buf, n, off);
    close(fd);
    if (rc)
        return rc;
    if (got < 0)
        return npyl_fail(err, errlen, (int)got, "%s: read failed at offset %" PRIu64 ": %s",
                         path, off, npyload_strerror((int)got));
    if ((size_t)got < n)
        return npyl_fail(err, errlen, -EIO, "%s: %zu bytes at offset %" PRIu64 " expected, "
                         "the file ends after %zd", path, n, off, got);
    return 0;
}

static int local_key(npyl_store *st, const npyl_sfile *t, uint32_t file, const char *path,
                     char *key, size_t keylen)
{
    (void)t;
    local_store *s = (local_store *)st;
    npyl_file_info fi;
    if (path) {
        int rc = npyl_io_stat(path, &fi);
        if (rc)
            return rc;
    } else {
        fi = s->fi[file];
    }
    snprintf(key, keylen, "%" PRIx64 ":%" PRIx64, fi.dev, fi.ino);
    return 0;
}

static int local_changed(npyl_store *st, const npyl_sfile *t, uint32_t file)
{
    local_store *s = (local_store *)st;
    const npyl_file_info *fi = &s->fi[file];
    npyl_file_info now;
    return npyl_io_stat(t[file].path, &now) != 0 || now.dev != fi->dev || now.ino != fi->ino ||
           now.size != fi->size || now.mtime_ns != fi->mtime_ns;
}

static int local_ctx_open(npyl_store *st, const npyl_sfile *t, size_t nfiles,
                          const npyl_store_cfg *cfg, npyl_store_ctx **out, char *err,
                          size_t errlen)
{
    (void)t;
    local_store *s = (local_store *)st;
    local_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    *out = (npyl_store_ctx *)c;
    npyl_io_config io = {
        .backend = cfg->backend,
        .direct = cfg->direct,
        .queue_depth = cfg->queue_depth,
        .max_open = cfg->max_open,
        .files = s->fi,
        .nfiles = nfiles,
        .gather_max = cfg->gather_max,
        .random_access = cfg->random_access,
        .maps = s->maps,
    };
    return npyl_io_create(&c->io, &io, err, errlen);
}

static void local_ctx_close(npyl_store_ctx *ct)
{
    local_ctx *c = (local_ctx *)ct;
    if (!c)
        return;
    npyl_io_destroy(c->io);
    free(c);
}

static int local_complete(npyl_store_ctx *ct, const npyl_req *reqs, size_t n, uint64_t *done,
                          size_t *bad, uint64_t *landed, char *err, size_t errlen)
{
    (void)done; /* lib/io reads every request whole, or fails */
    local_ctx *c = (local_ctx *)ct;
    return npyl_io_read(c->io, reqs, n, bad, landed, err, errlen);
}

static void local_ctx_counters(const npyl_store_ctx *ct, npyl_store_counters *k)
{
    const local_ctx *c = (const local_ctx *)ct;
    if (!c->io)
        return;
    npyl_io_counters io = {0};
    npyl_io_counters_add(c->io, &io);
    k->gather_bytes += io.gather_bytes;
    k->gather_reqs += io.gather_reqs;
    k->read_bytes += io.read_bytes;
    k->read_reqs += io.read_reqs;
    k->fell_back |= npyl_io_backend_now(c->io) == NPYLOAD_IO_PREAD;
}

const npyl_store_ops npyl_store_local = {
    .name = "local",
    .claims = local_claims,
    .open = local_open,
    .close = local_close,
    .glob = local_glob,
    .table = local_table,
    .probe = local_probe,
    .read_at = local_read_at,
    .key = local_key,
    .changed = local_changed,
    .ctx_open = local_ctx_open,
    .ctx_close = local_ctx_close,
    .submit = NULL, /* lib/io reads in complete */
    .complete = local_complete,
    .ctx_counters = local_ctx_counters,
};
