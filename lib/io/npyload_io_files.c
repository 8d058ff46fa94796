/* The bottom of lib/io, under the backends: the per-context LRU of open
 * files with its identity checks, the direct-I/O split, and the messages
 * every backend writes.
 *
 * Runs on worker threads: messages use npyload_strerror (thread-safe), never
 * strerror. A context belongs to one thread at a time; nothing here locks. */
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

static const char *file_path(const npyl_io *io, uint32_t f)
{
    return io->files[f].path ? io->files[f].path : "<unnamed>";
}

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

int npyl_io_fstat(int fd, const char *path, npyl_file_info *info)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -errno;
    info->path = path;
    info_from_stat(info, &st);
    return 0;
}

/* ---- identity ----------------------------------------------------------- */

/* Compares the open descriptor fd of `file` with the table: 0, or
 * NPYLOAD_ECHANGED saying what changed (-errno if fstat fails). */
static int check_identity(const npyl_io *io, uint32_t file, int fd, char *err,
                          size_t errlen)
{
    const npyl_file_info *fi = &io->files[file];
    const char *path = file_path(io, file);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = -errno;
        return npyl_fail(err, errlen, rc, "%s: fstat failed: %s", path,
                         npyload_strerror(rc));
    }
    npyl_file_info now;
    info_from_stat(&now, &st);
    if (now.size != fi->size)
        return npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                         "%s: file changed since the loader started "
                         "(size %" PRIu64 " \u2192 %" PRIu64 ")",
                         path, fi->size, now.size);
    if (now.dev != fi->dev || now.ino != fi->ino)
        return npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                         "%s: file changed since the loader started "
                         "(replaced: device %" PRIu64 " inode %" PRIu64
                         " \u2192 device %" PRIu64 " inode %" PRIu64 ")",
                         path, fi->dev, fi->ino, now.dev, now.ino);
    if (now.mtime_ns != fi->mtime_ns)
        return npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                         "%s: file changed since the loader started "
                         "(modified in place: mtime %" PRId64 " \u2192 %" PRId64
                         " ns)",
                         path, fi->mtime_ns, now.mtime_ns);
    return 0;
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
    if (e->map && !e->shared)
        munmap((void *)e->map, e->map_len);
    if (e->dfd >= 0)
        close(e->dfd);
    if (e->fd >= 0)
        close(e->fd);
    if (e->file != UINT32_MAX)
        io->slot_of[e->file] = -1;
    e->map = NULL;
    e->map_len = 0;
    e->nomap = 0;
    e->shared = 0;
    e->resident = 0;
    e->resident_call = 0;
    e->fd = e->dfd = -1;
    e->file = UINT32_MAX;
    e->pins = 0;
    e->used = 0;
}

/* ---- shared mappings (npyl_io_maps) ------------------------------------- */

int npyl_io_maps_create(npyl_io_maps **out, const npyl_file_info *files, size_t nfiles)
{
    npyl_io_maps *m = calloc(1, sizeof *m);
    *out = NULL;
    if (!m)
        return -ENOMEM;
    m->files = files;
    m->n = nfiles;
    m->map = calloc(nfiles ? nfiles : 1, sizeof *m->map);
    m->len = calloc(nfiles ? nfiles : 1, sizeof *m->len);
    if (!m->map || !m->len) {
        npyl_io_maps_destroy(m);
        return -ENOMEM;
    }
    for (size_t i = 0; i < nfiles; i++)
        atomic_init(&m->map[i], 0);
    atomic_init(&m->count, 0);
    *out = m;
    return 0;
}

void npyl_io_maps_destroy(npyl_io_maps *m)
{
    if (!m)
        return;
    for (size_t i = 0; m->map && i < m->n; i++) {
        uintptr_t p = atomic_load_explicit(&m->map[i], memory_order_relaxed);
        if (p)
            munmap((void *)p, m->len[i]);
    }
    free(m->map);
    free(m->len);
    free(m);
}

/* The table's mapping of e's file, or, when there is none yet and the
 * table has room, p (just made) installed as the table's; e then does not
 * own its map. Called with p == NULL first (a look-up); with p set, returns
 * the mapping to use (p, or the one another context installed first, in
 * which case p is unmapped). */
static const uint8_t *maps_share(npyl_io *io, npyl_io_fh *e, void *p, uint64_t len)
{
    npyl_io_maps *m = io->maps;
    uintptr_t cur = atomic_load_explicit(&m->map[e->file], memory_order_acquire);
    if (cur || !p) {
        if (cur && p)
            munmap(p, (size_t)len);
        e->shared = cur != 0;
        return (const uint8_t *)cur;
    }
    /* Room for one more: a reservation (taken back if another context
     * installs this file first). */
    if (atomic_fetch_add_explicit(&m->count, 1, memory_order_relaxed) >= NPYL_IO_SHARED_MAPS) {
        atomic_fetch_sub_explicit(&m->count, 1, memory_order_relaxed);
        return p; /* private, as without a table */
    }
    uintptr_t want = 0;
    if (atomic_compare_exchange_strong_explicit(&m->map[e->file], &want, (uintptr_t)p,
                                                memory_order_acq_rel, memory_order_acquire)) {
        m->len[e->file] = len; /* read by destroy only, after every context */
        e->shared = 1;
        return p;
    }
    atomic_fetch_sub_explicit(&m->count, 1, memory_order_relaxed);
    munmap(p, (size_t)len);
    e->shared = 1;
    return (const uint8_t *)want;
}

int npyl_io_fh_map(npyl_io *io, npyl_io_fh *e, char *err, size_t errlen)
{
    const npyl_file_info *fi = &io->files[e->file];
    if (e->map || fi->size == 0)
        return 0; /* an empty file has nothing to map: every request fails */
    /* Mapped already by another context of the reader: the same file (its
     * identity was checked at its open, as e's was at e's). */
    if (io->maps && (e->map = maps_share(io, e, NULL, 0)) != NULL) {
        e->map_len = fi->size;
        return 0;
    }
    /* The size validated at start: the identity checks catch a file that
     * grew or shrank since; a page past its current end faults (SIGBUS,
     * caught by the guard). */
    void *p = mmap(NULL, (size_t)fi->size, PROT_READ, MAP_SHARED, e->fd, 0);
    if (p == MAP_FAILED) {
        int rc = -errno;
        e->nomap = 1;
        return npyl_fail(err, errlen, rc,
                         "%s: mmap of %" PRIu64 " bytes failed: %s",
                         file_path(io, e->file), fi->size,
                         npyload_strerror(rc));
    }
    if (io->random_access)
        (void)madvise(p, (size_t)fi->size, MADV_RANDOM); /* advice: errors ignored */
    e->map = io->maps ? maps_share(io, e, p, fi->size) : p;
    e->map_len = fi->size;
    return 0;
}

/* Opens `file` into the free entry `e`. */
static int fh_open(npyl_io *io, npyl_io_fh *e, uint32_t file, char *err,
                   size_t errlen)
{
    const npyl_file_info *fi = &io->files[file];
    const char *path = file_path(io, file);
    /* O_NONBLOCK: a FIFO put in the file's place must not block open();
     * non-regular files are then refused. Cleared again for the reads. */
    int fd = open(fi->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int rc = -errno;
        return npyl_fail(err, errlen, rc, "%s: open failed: %s", path,
                         npyload_strerror(rc));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = -errno;
        close(fd);
        return npyl_fail(err, errlen, rc, "%s: fstat failed: %s", path,
                         npyload_strerror(rc));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                         "%s: not a regular file", path);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int rc = -errno;
        close(fd);
        return npyl_fail(err, errlen, rc, "%s: fcntl failed: %s", path,
                         npyload_strerror(rc));
    }
    int rc = check_identity(io, file, fd, err, errlen);
    if (rc) {
        close(fd);
        return rc;
    }
    if (io->random_access)
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM); /* advice: errors ignored */
    int dfd = -1;
    if (io->direct) {
        /* The first open proved it a regular file; a FIFO swapped in since
         * is caught by the inode comparison below, but must not block. */
        dfd = open(fi->path, O_RDONLY | O_CLOEXEC | O_DIRECT | O_NONBLOCK);
        if (dfd < 0) {
            rc = -errno;
            close(fd);
            return npyl_fail(err, errlen, rc,
                             "%s: open with O_DIRECT failed: %s%s", path,
                             npyload_strerror(rc),
                             rc == -EINVAL ? " (the filesystem does not "
                                             "support direct I/O)"
                                           : "");
        }
        /* The second open could race a rename; both must be the same file. */
        struct stat dst;
        if (fstat(dfd, &dst) != 0 || dst.st_ino != st.st_ino ||
            dst.st_dev != st.st_dev ||
            (fl = fcntl(dfd, F_GETFL)) < 0 ||
            fcntl(dfd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
            close(dfd);
            close(fd);
            return npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                             "%s: file changed since the loader started "
                             "(replaced while opening)",
                             path);
        }
    }
    e->file = file;
    e->fd = fd;
    e->dfd = dfd;
    e->map = NULL;
    e->map_len = 0;
    e->pins = 0;
    if (io->backend == NPYLOAD_IO_MMAP) {
        rc = npyl_io_fh_map(io, e, err, errlen);
        if (rc) {
            e->file = UINT32_MAX;
            e->fd = e->dfd = -1;
            e->nomap = 0;
            close(fd);
            return rc;
        }
        /* Advice only: a failure changes nothing but speed. */
        if (e->map)
            (void)madvise((void *)e->map, (size_t)e->map_len,
                          MADV_SEQUENTIAL);
    }
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
        if (e->file != UINT32_MAX) {
            /* Its reads in this call are complete (it is unpinned): check
             * it now, the check after the call will not see it. */
            int rc = e->used == io->call
                         ? check_identity(io, e->file, e->fd, err, errlen)
                         : 0;
            fh_close(io, e);
            if (rc) {
                lru_unlink(io, e);
                lru_push_back(io, e);
                return rc;
            }
        }
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
    e->used = io->call;
    *out = e;
    return 0;
}

void npyl_io_fh_put(npyl_io *io, npyl_io_fh *fh)
{
    (void)io;
    if (fh && fh->pins)
        fh->pins--;
}

int npyl_io_files_verify(npyl_io *io, const npyl_io_req *reqs, size_t n,
                         size_t *bad, char *err, size_t errlen)
{
    /* fh_get moves every entry it hands out to the head, so the entries
     * used by this call are exactly the leading run with used == call. */
    for (npyl_io_fh *e = io->head; e && e->file != UINT32_MAX &&
                                   e->used == io->call;
         e = e->next) {
        int rc = check_identity(io, e->file, e->fd, err, errlen);
        if (rc) {
            for (size_t i = 0; i < n; i++)
                if (reqs[i].file == e->file) {
                    *bad = i;
                    break;
                }
            return rc;
        }
    }
    return 0;
}

int npyl_io_files_init(npyl_io *io, const npyl_io_config *cfg)
{
    io->files = cfg->files;
    io->nfiles = cfg->nfiles;
    io->cap = cfg->max_open;
    if (io->cap > cfg->nfiles && cfg->nfiles > 0)
        io->cap = (unsigned)cfg->nfiles;
    io->fh = calloc(io->cap, sizeof *io->fh);
    io->slot_of = malloc((cfg->nfiles ? cfg->nfiles : 1) * sizeof *io->slot_of);
    /* The gather's pins: at most one per entry (npyl_io_gather_read). */
    io->gpin = malloc(io->cap * sizeof *io->gpin);
    if (!io->fh || !io->slot_of || !io->gpin)
        return -ENOMEM;
    for (size_t i = 0; i < cfg->nfiles; i++)
        io->slot_of[i] = -1;
    for (unsigned i = 0; i < io->cap; i++) {
        io->fh[i].file = UINT32_MAX;
        io->fh[i].fd = io->fh[i].dfd = -1;
        lru_push_front(io, &io->fh[i]);
    }
    return 0;
}

void npyl_io_files_fini(npyl_io *io)
{
    if (io->fh)
        for (unsigned i = 0; i < io->cap; i++)
            if (io->fh[i].file != UINT32_MAX)
                fh_close(io, &io->fh[i]);
    free(io->fh);
    free(io->slot_of);
    free(io->gpin);
    io->fh = NULL;
    io->slot_of = NULL;
    io->gpin = NULL;
    io->ngpin = 0;
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
        npyl_io_fh *fh = NULL;
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

/* ---- messages ----------------------------------------------------------- */

int npyl_io_fail_read(const npyl_io *io, const npyl_io_req *r, int code,
                      char *err, size_t errlen)
{
    return npyl_fail(err, errlen, code,
                     "%s: read of %" PRIu64 " bytes at offset %" PRIu64
                     " failed: %s",
                     file_path(io, r->file), r->len, r->offset,
                     npyload_strerror(code));
}

int npyl_io_fail_eof(const npyl_io *io, const npyl_io_req *r,
                     const npyl_io_fh *fh, char *err, size_t errlen)
{
    const npyl_file_info *fi = &io->files[r->file];
    struct stat st;
    uint64_t now = fi->size;
    if (fh && fstat(fh->fd, &st) == 0)
        now = (uint64_t)st.st_size;
    char was[48] = "";
    if (now != fi->size)
        snprintf(was, sizeof was, " (%" PRIu64 " at start)", fi->size);
    return npyl_fail(err, errlen, NPYLOAD_ETRUNCATED,
                     "%s: file ends at byte %" PRIu64 "%s, %" PRIu64
                     " bytes expected at offset %" PRIu64,
                     file_path(io, r->file), now, was, r->len, r->offset);
}

int npyl_io_fail_fault(const npyl_io *io, const npyl_io_req *r,
                       const npyl_io_fh *fh, uint64_t at, char *err,
                       size_t errlen)
{
    struct stat st;
    if (fstat(fh->fd, &st) == 0 &&
        (uint64_t)st.st_size < r->offset + r->len)
        return npyl_io_fail_eof(io, r, fh, err, errlen);
    int rc = check_identity(io, r->file, fh->fd, err, errlen);
    if (rc)
        return rc;
    return npyl_fail(err, errlen, -EIO,
                     "%s: read of %" PRIu64 " bytes at offset %" PRIu64
                     " failed: %s (SIGBUS on the mapping at offset %" PRIu64
                     ")",
                     file_path(io, r->file), r->len, r->offset,
                     npyload_strerror(-EIO), r->offset + at);
}
