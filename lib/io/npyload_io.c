/* The shared part of lib/io: context lifecycle, dispatch to a backend, the
 * per-context LRU of open files (with the identity check on open), the
 * direct-I/O split, and the error messages every backend writes.
 *
 * A context belongs to one thread at a time; nothing here locks. */
#include "npyload_io_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef NPYLOAD_HAVE_URING
#include <liburing.h>
#endif

struct npyl_io {
    int backend;
    int direct;
    unsigned queue_depth;
    const npyl_file_info *files;
    size_t nfiles;

    /* LRU of open files: `cap` entries, `slot_of[file]` is the entry holding
     * `file` or -1. `head` is the most recently used, `tail` the least. */
    npyl_io_fh *fh;
    unsigned cap;
    int32_t *slot_of;
    npyl_io_fh *head, *tail;

    npyl_io_uring *uring; /* URING backend state, else NULL */
};

static const char *file_path(const npyl_io *io, uint32_t f)
{
    return io->files[f].path ? io->files[f].path : "<unnamed>";
}

const npyl_file_info *npyl_io_info(const npyl_io *io, uint32_t file)
{
    return &io->files[file];
}

/* ---- messages ---------------------------------------------------------- */

int npyl_io_fail_read(const npyl_io *io, const npyl_io_req *r, int code,
                      char *err, size_t errlen)
{
    return npyl_fail(err, errlen, code,
                     "%s: read of %" PRIu64 " bytes at offset %" PRIu64
                     " failed: %s",
                     file_path(io, r->file), r->len, r->offset,
                     code < 0 && code > -4096 ? strerror(-code)
                                              : npyload_strerror(code));
}

int npyl_io_fail_eof(const npyl_io *io, const npyl_io_req *r,
                     uint64_t file_end, char *err, size_t errlen)
{
    return npyl_fail(err, errlen, NPYLOAD_ETRUNCATED,
                     "%s: file ends at byte %" PRIu64 ", %" PRIu64
                     " bytes expected at offset %" PRIu64,
                     file_path(io, r->file), file_end, r->len, r->offset);
}

/* ---- stat / probe ------------------------------------------------------- */

static void info_from_stat(npyl_file_info *info, const struct stat *st)
{
    info->size = (uint64_t)st->st_size;
    info->dev = (uint64_t)st->st_dev;
    info->ino = (uint64_t)st->st_ino;
    info->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000ll +
                     (int64_t)st->st_mtim.tv_nsec;
}

int npyl_io_stat(const char *path, npyl_file_info *info)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return -errno;
    info->path = path;
    info_from_stat(info, &st);
    return 0;
}

int npyl_io_uring_usable(char *why, size_t whylen)
{
#ifdef NPYLOAD_HAVE_URING
    struct io_uring ring;
    int rc = io_uring_queue_init(2, &ring, 0);
    if (rc == 0) {
        io_uring_queue_exit(&ring);
        return 1;
    }
    const char *hint = "";
    if (rc == -ENOSYS)
        hint = " (kernel built without io_uring, or a seccomp profile "
               "hides it)";
    else if (rc == -EPERM || rc == -EACCES) {
        int disabled = 0;
        FILE *f = fopen("/proc/sys/kernel/io_uring_disabled", "re");
        if (f) {
            if (fscanf(f, "%d", &disabled) != 1)
                disabled = 0;
            fclose(f);
        }
        hint = disabled ? " (sysctl kernel.io_uring_disabled is set)"
                        : " (refused by a seccomp profile, container "
                          "runtime or LSM)";
    } else if (rc == -ENOMEM)
        hint = " (RLIMIT_MEMLOCK too low for the ring on this kernel)";
    npyl_fail(why, whylen, 0, "io_uring_setup failed: %s%s", strerror(-rc),
              hint);
    return 0;
#else
    npyl_fail(why, whylen, 0, "built without liburing");
    return 0;
#endif
}

/* ---- LRU of open files -------------------------------------------------- */

static void lru_unlink(npyl_io *io, npyl_io_fh *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        io->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        io->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(npyl_io *io, npyl_io_fh *e)
{
    e->prev = NULL;
    e->next = io->head;
    if (io->head)
        io->head->prev = e;
    io->head = e;
    if (!io->tail)
        io->tail = e;
}

static void lru_push_back(npyl_io *io, npyl_io_fh *e)
{
    e->next = NULL;
    e->prev = io->tail;
    if (io->tail)
        io->tail->next = e;
    io->tail = e;
    if (!io->head)
        io->head = e;
}

static void fh_close(npyl_io *io, npyl_io_fh *e)
{
    if (e->map)
        munmap((void *)e->map, e->map_len);
    if (e->dfd >= 0)
        close(e->dfd);
    if (e->fd >= 0)
        close(e->fd);
    if (e->file != UINT32_MAX)
        io->slot_of[e->file] = -1;
    e->map = NULL;
    e->map_len = 0;
    e->fd = e->dfd = -1;
    e->file = UINT32_MAX;
    e->pins = 0;
}

/* Opens `file` into the free entry `e`. */
static int fh_open(npyl_io *io, npyl_io_fh *e, uint32_t file, char *err,
                   size_t errlen)
{
    const npyl_file_info *fi = &io->files[file];
    const char *path = file_path(io, file);
    int fd = open(fi->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        return npyl_fail(err, errlen, rc, "%s: open failed: %s", path,
                         strerror(-rc));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = -errno;
        close(fd);
        return npyl_fail(err, errlen, rc, "%s: fstat failed: %s", path,
                         strerror(-rc));
    }
    npyl_file_info now;
    info_from_stat(&now, &st);
    if (now.size != fi->size || now.dev != fi->dev || now.ino != fi->ino ||
        now.mtime_ns != fi->mtime_ns) {
        close(fd);
        if (now.size != fi->size)
            return npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                             "%s: file changed since the loader started "
                             "(size %" PRIu64 " \u2192 %" PRIu64 ")",
                             path, fi->size, now.size);
        if (now.dev != fi->dev || now.ino != fi->ino)
            return npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                             "%s: file changed since the loader started "
                             "(replaced: inode %" PRIu64 " \u2192 %" PRIu64
                             ")",
                             path, fi->ino, now.ino);
        return npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                         "%s: file changed since the loader started "
                         "(modified: mtime %" PRId64 " \u2192 %" PRId64
                         " ns)",
                         path, fi->mtime_ns, now.mtime_ns);
    }
    int dfd = -1;
    if (io->direct) {
        dfd = open(fi->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (dfd < 0) {
            int rc = -errno;
            close(fd);
            return npyl_fail(err, errlen, rc,
                             "%s: open with O_DIRECT failed: %s%s", path,
                             strerror(-rc),
                             rc == -EINVAL ? " (the filesystem does not "
                                             "support direct I/O)"
                                           : "");
        }
        /* The second open could race a rename; both must be the same file. */
        struct stat dst;
        if (fstat(dfd, &dst) != 0 || dst.st_ino != st.st_ino ||
            dst.st_dev != st.st_dev) {
            close(dfd);
            close(fd);
            return npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                             "%s: file changed since the loader started "
                             "(replaced while opening)",
                             path);
        }
    }
    const uint8_t *map = NULL;
    if (io->backend == NPYLOAD_IO_MMAP && fi->size > 0) {
        void *p = mmap(NULL, (size_t)fi->size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int rc = -errno;
            close(fd);
            return npyl_fail(err, errlen, rc, "%s: mmap of %" PRIu64
                             " bytes failed: %s",
                             path, fi->size, strerror(-rc));
        }
        /* Advice only: a failure changes nothing but speed. */
        (void)madvise(p, (size_t)fi->size, MADV_SEQUENTIAL);
        map = p;
    }
    e->file = file;
    e->fd = fd;
    e->dfd = dfd;
    e->map = map;
    e->map_len = map ? fi->size : 0;
    e->pins = 0;
    io->slot_of[file] = (int32_t)(e - io->fh);
    return 0;
}

int npyl_io_fh_get(npyl_io *io, uint32_t file, npyl_io_fh **out, char *err,
                   size_t errlen)
{
    if (file >= io->nfiles)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "file index %" PRIu32 " out of range (%zu files)",
                         file, io->nfiles);
    int32_t s = io->slot_of[file];
    npyl_io_fh *e;
    if (s >= 0) {
        e = &io->fh[s];
        if (io->head != e) {
            lru_unlink(io, e);
            lru_push_front(io, e);
        }
    } else {
        /* Every entry is always on the list; free ones (file == UINT32_MAX)
         * sit at the tail, so they are taken before an open file is
         * evicted. */
        for (e = io->tail; e && e->pins; e = e->prev)
            ;
        if (!e)
            return NPYL_IO_BUSY;
        if (e->file != UINT32_MAX)
            fh_close(io, e);
        int rc = fh_open(io, e, file, err, errlen);
        if (rc) {
            /* e is free: keep free entries at the tail, taken first. */
            lru_unlink(io, e);
            lru_push_back(io, e);
            return rc;
        }
        lru_unlink(io, e);
        lru_push_front(io, e);
    }
    e->pins++;
    *out = e;
    return 0;
}

void npyl_io_fh_put(npyl_io *io, npyl_io_fh *fh)
{
    (void)io;
    if (fh && fh->pins)
        fh->pins--;
}

/* ---- direct-I/O split --------------------------------------------------- */

unsigned npyl_io_split(const npyl_io *io, const npyl_io_req *r,
                       npyl_io_seg seg[3])
{
    const uint64_t A = NPYL_DIRECT_ALIGN;
    uint8_t *dst = r->dst;
    if (!io->direct || (r->offset % A) != ((uintptr_t)dst % A)) {
        seg[0] = (npyl_io_seg){0, r->offset, r->len, dst};
        return 1;
    }
    uint64_t head = (A - r->offset % A) % A;
    if (head > r->len)
        head = r->len;
    uint64_t mid = (r->len - head) / A * A;
    uint64_t tail = r->len - head - mid;
    unsigned k = 0;
    if (head)
        seg[k++] = (npyl_io_seg){0, r->offset, head, dst};
    if (mid)
        seg[k++] = (npyl_io_seg){1, r->offset + head, mid, dst + head};
    if (tail)
        seg[k++] = (npyl_io_seg){0, r->offset + head + mid, tail,
                                 dst + head + mid};
    return k;
}

/* ---- lifecycle and dispatch --------------------------------------------- */

int npyl_io_create(npyl_io **out, const npyl_io_config *cfg, char *err,
                   size_t errlen)
{
    *out = NULL;
    if (!cfg || (cfg->nfiles && !cfg->files) || cfg->max_open < 1 ||
        cfg->nfiles > INT32_MAX)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "npyl_io_create: bad configuration");
    if (cfg->backend != NPYLOAD_IO_URING && cfg->backend != NPYLOAD_IO_PREAD &&
        cfg->backend != NPYLOAD_IO_MMAP)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "npyl_io_create: backend %d is not URING, PREAD or "
                         "MMAP",
                         cfg->backend);
    if (cfg->direct && cfg->backend == NPYLOAD_IO_MMAP)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "direct I/O is not possible with the mmap backend");
    if (cfg->backend == NPYLOAD_IO_URING && cfg->queue_depth < 1)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "io_uring queue depth must be >= 1");
#ifndef NPYLOAD_HAVE_URING
    if (cfg->backend == NPYLOAD_IO_URING)
        return npyl_fail(err, errlen, NPYLOAD_ENOURING,
                         "io_uring backend: built without liburing");
#endif
    npyl_io *io = calloc(1, sizeof *io);
    if (!io)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    io->backend = cfg->backend;
    io->direct = cfg->direct ? 1 : 0;
    io->queue_depth = cfg->queue_depth;
    io->files = cfg->files;
    io->nfiles = cfg->nfiles;
    io->cap = cfg->max_open;
    if (io->cap > cfg->nfiles && cfg->nfiles > 0)
        io->cap = (unsigned)cfg->nfiles;
    io->fh = calloc(io->cap, sizeof *io->fh);
    io->slot_of = malloc((cfg->nfiles ? cfg->nfiles : 1) * sizeof *io->slot_of);
    if (!io->fh || !io->slot_of) {
        npyl_io_destroy(io);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < cfg->nfiles; i++)
        io->slot_of[i] = -1;
    for (unsigned i = 0; i < io->cap; i++) {
        io->fh[i].file = UINT32_MAX;
        io->fh[i].fd = io->fh[i].dfd = -1;
        lru_push_front(io, &io->fh[i]);
    }
    if (cfg->backend == NPYLOAD_IO_URING) {
        int rc = npyl_io_uring_create(&io->uring, cfg->queue_depth, err,
                                      errlen);
        if (rc) {
            npyl_io_destroy(io);
            return rc;
        }
    }
    *out = io;
    return 0;
}

void npyl_io_destroy(npyl_io *io)
{
    if (!io)
        return;
    /* The ring first: no read may be in flight into a descriptor we close
     * (npyl_io_read never returns with reads in flight, so this is belt and
     * braces). */
    npyl_io_uring_destroy(io->uring);
    if (io->fh)
        for (unsigned i = 0; i < io->cap; i++)
            if (io->fh[i].file != UINT32_MAX)
                fh_close(io, &io->fh[i]);
    free(io->fh);
    free(io->slot_of);
    free(io);
}

int npyl_io_read(npyl_io *io, const npyl_io_req *reqs, size_t n, size_t *bad,
                 uint64_t *bytes_read, char *err, size_t errlen)
{
    size_t bad_local = 0;
    if (!bad)
        bad = &bad_local;
    if (n == 0)
        return 0;
    switch (io->backend) {
    case NPYLOAD_IO_PREAD:
        return npyl_io_pread_read(io, reqs, n, bad, bytes_read, err, errlen);
    case NPYLOAD_IO_MMAP:
        return npyl_io_mmap_read(io, reqs, n, bad, bytes_read, err, errlen);
    case NPYLOAD_IO_URING:
        return npyl_io_uring_read(io, io->uring, reqs, n, bad, bytes_read, err,
                                  errlen);
    }
    return npyl_fail(err, errlen, NPYLOAD_EINVAL, "bad backend");
}

int npyl_io_each(npyl_io *io, const npyl_io_req *reqs, size_t n, size_t *bad,
                 uint64_t *bytes_read, char *err, size_t errlen,
                 npyl_io_one_fn one)
{
    uint64_t got = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const npyl_io_req *r = &reqs[i];
        if (r->len == 0)
            continue;
        npyl_io_fh *fh;
        /* NPYL_IO_BUSY cannot happen here: one pin at a time. */
        rc = npyl_io_fh_get(io, r->file, &fh, err, errlen);
        if (rc == 0) {
            rc = one(io, r, fh, &got, err, errlen);
            npyl_io_fh_put(io, fh);
        }
        if (rc)
            *bad = i;
    }
    if (bytes_read)
        *bytes_read += got;
    return rc;
}
