/* npyload_pack_file: .npy -> .npy.zst (npyload_zst.h for the layout).
 *
 * The calling thread reads a chunk of frames (pread), compresses frames of
 * it alongside threads-1 helpers (one ZSTD_CCtx each, frames handed out by
 * index under a mutex), then writes the chunk's frames in order to a
 * temporary file (nameless where the filesystem allows: pack_out below),
 * fsynced before it is linked or renamed to the output and the directory
 * fsynced after. Memory is two chunk buffers, whatever the input size.
 * The seek table's checksum of a frame is the last 4 bytes of the
 * compressed frame: zstd's content checksum is the same XXH64 low half. */
#include "npyload_zst.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

#define CHUNK_FRAMES_PER_THREAD 4
#define CHUNK_MAX_BYTES (64u << 20)
#define MAX_THREADS 256          /* threads started, at most */
#define PACK_THREADS_ARG_MAX 1024 /* accepted in options.threads */
#define WRITEBACK_BYTES (4u << 20)  /* start write-back every 4 MiB out */

typedef struct pack_pool {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;      /* bumped per chunk */
    int quit;
    int participants;  /* helpers + the calling thread */
    int finished;      /* participants done with this chunk */
    uint32_t next;     /* next frame of the chunk to compress */
    /* the chunk */
    uint32_t count;
    const unsigned char *in;
    size_t frame_bytes, last_bytes; /* the chunk's last frame may be short */
    unsigned char *out;
    size_t out_stride;
    size_t *csize;     /* per frame: compressed size or a zstd error code */
} pack_pool;

typedef struct pack_worker {
    pack_pool *pool;
    ZSTD_CCtx *cctx;
    pthread_t tid;
    int started;
} pack_worker;

static void compress_chunk(pack_pool *p, ZSTD_CCtx *cctx)
{
    for (;;) {
        pthread_mutex_lock(&p->mu);
        uint32_t i = p->next < p->count ? p->next++ : UINT32_MAX;
        pthread_mutex_unlock(&p->mu);
        if (i == UINT32_MAX)
            break;
        size_t n = i + 1 == p->count ? p->last_bytes : p->frame_bytes;
        p->csize[i] = ZSTD_compress2(cctx, p->out + (size_t)i * p->out_stride,
                                     p->out_stride,
                                     p->in + (size_t)i * p->frame_bytes, n);
    }
    pthread_mutex_lock(&p->mu);
    if (++p->finished == p->participants)
        pthread_cond_signal(&p->done);
    pthread_mutex_unlock(&p->mu);
}

static void *helper_main(void *arg)
{
    pack_worker *w = arg;
    pack_pool *p = w->pool;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->gen == seen && !p->quit)
            pthread_cond_wait(&p->go, &p->mu);
        int quit = p->quit;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        if (quit)
            return NULL;
        compress_chunk(p, w->cctx);
    }
}

/* multi: frames hold several samples. Readers stream those through a
 * bounded buffer and refuse a window above NPYLOAD_ZST_MAX_WINDOW_LOG
 * (npyload.h); levels 1-19 stay within it, the ultra levels (20-22) ask for
 * 2^25..2^27, so their window is capped here. Frames of one sample decode
 * straight into the batch and keep the level's window. */
static ZSTD_CCtx *make_cctx(int level, int checksum, int multi)
{
    ZSTD_CCtx *c = ZSTD_createCCtx();
    if (!c)
        return NULL;
    if (ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, checksum)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1)) ||
        (multi && level > 19 &&
         ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog,
                                             NPYLOAD_ZST_MAX_WINDOW_LOG)))) {
        ZSTD_freeCCtx(c);
        return NULL;
    }
    return c;
}

static int pread_exact(int fd, void *buf, size_t n, uint64_t off)
{
    return npyl_zst_read_fd(&fd, buf, n, off);
}

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

/* ---- the input: the same file from the header to the last byte ---------- */

/* Compares fstat of the open input (and stat of its path) with `was`, the
 * stat taken before its header was read, as the loader's identity check
 * does: 0, or NPYLOAD_ECHANGED saying what changed. An in-place rewrite
 * shows as a new mtime (or size); a file renamed over the path as another
 * inode. A rewrite within one tick of the filesystem's clock keeps the
 * mtime and is not seen. */
static int input_unchanged(int ifd, const char *in, const struct stat *was,
                           int check_path, char *err, size_t errlen)
{
    struct stat now;
    if (fstat(ifd, &now) != 0) {
        int e = errno;
        return npyl_fail(err, errlen, -e, "%s: fstat failed: %s", in,
                         strerror(e));
    }
    if (now.st_size != was->st_size)
        return npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                         "%s: changed while being packed (size %lld \u2192 "
                         "%lld): nothing written",
                         in, (long long)was->st_size, (long long)now.st_size);
    if (now.st_mtim.tv_sec != was->st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != was->st_mtim.tv_nsec)
        return npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                         "%s: changed while being packed (modified in place: "
                         "mtime %lld.%09ld \u2192 %lld.%09ld): nothing written",
                         in, (long long)was->st_mtim.tv_sec,
                         (long)was->st_mtim.tv_nsec,
                         (long long)now.st_mtim.tv_sec,
                         (long)now.st_mtim.tv_nsec);
    if (check_path && stat(in, &now) != 0) {
        int e = errno;
        return npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                         "%s: changed while being packed (the path no longer "
                         "opens: %s): nothing written", in, strerror(e));
    }
    if (now.st_dev != was->st_dev || now.st_ino != was->st_ino)
        return npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                         "%s: changed while being packed (replaced: device "
                         "%llu inode %llu \u2192 device %llu inode %llu): "
                         "nothing written",
                         in, (unsigned long long)was->st_dev,
                         (unsigned long long)was->st_ino,
                         (unsigned long long)now.st_dev,
                         (unsigned long long)now.st_ino);
    return 0;
}

/* ---- the output: a temporary file that becomes `out` -------------------- */

/* The output is built without a name (O_TMPFILE) in out's directory and
 * linked in when complete, so a temporary name never has to fit beside a
 * long `out` and a killed pack leaves nothing behind. A filesystem that
 * refuses O_TMPFILE (or a process without /proc to link it through) gets a
 * short named temporary ".npyl-XXXXXX" instead. */
typedef struct pack_out {
    const char *path;  /* as the caller gave it */
    char *dir;         /* its directory (malloc'd) */
    const char *base;  /* its last component, inside path */
    int dirfd;         /* dir, opened for *at() calls and the final fsync */
    int fd;            /* the temporary file */
    int anon;          /* 1: O_TMPFILE, nameless until linked */
    char tmp[16];      /* the temporary's name in dir while it has one */
} pack_out;

#define TMP_PREFIX ".npyl-"
#define TMP_TRIES 100

static void tmp_name(char name[16])
{
    static const char abc[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char r[6];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        uint64_t x = npyl_now_ns() ^ ((uint64_t)getpid() << 32) ^
                     (uint64_t)(uintptr_t)name;
        for (size_t i = 0; i < sizeof r; i++, x >>= 7)
            r[i] = (unsigned char)x;
    }
    memcpy(name, TMP_PREFIX, sizeof TMP_PREFIX - 1);
    for (size_t i = 0; i < sizeof r; i++)
        name[sizeof TMP_PREFIX - 1 + i] = abc[r[i] % (sizeof abc - 1)];
    name[sizeof TMP_PREFIX - 1 + sizeof r] = 0;
}

/* What is at `out` now may be replaced? 0 when nothing is there, or (with
 * force) a regular file other than the input. lstat, not stat: a symbolic
 * link is refused, never followed nor replaced, and so are devices, FIFOs,
 * sockets and directories: force replaces regular files only. */
static int out_replaceable(const pack_out *po, int force, const struct stat *ist,
                           char *err, size_t errlen)
{
    struct stat st;
    if (fstatat(po->dirfd, po->base, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        int e = errno;
        if (e == ENOENT)
            return 0;
        return npyl_fail(err, errlen, -e, "%s: cannot stat: %s", po->path,
                         strerror(e));
    }
    if (!S_ISREG(st.st_mode))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: is a %s: the output must be a regular file (force "
                         "replaces regular files only)",
                         po->path, npyl_file_kind(st.st_mode));
    if (st.st_dev == ist->st_dev && st.st_ino == ist->st_ino)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: the output is the input", po->path);
    if (!force)
        return npyl_fail(err, errlen, -EEXIST,
                         "%s: already exists (force / -f to overwrite)",
                         po->path);
    return 0;
}

/* Splits po->path and opens its directory. */
static int out_open_dir(pack_out *po, char *err, size_t errlen)
{
    const char *slash = strrchr(po->path, '/');
    po->base = slash ? slash + 1 : po->path;
    if (!*po->base || !strcmp(po->base, ".") || !strcmp(po->base, ".."))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: names a directory, not an output file", po->path);
    size_t n = slash ? (size_t)(slash - po->path) : 1;
    po->dir = malloc(n + 2);
    if (!po->dir)
        return npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", po->path);
    if (!slash)
        strcpy(po->dir, ".");
    else if (n == 0)
        strcpy(po->dir, "/");
    else {
        memcpy(po->dir, po->path, n);
        po->dir[n] = 0;
    }
    po->dirfd = open(po->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (po->dirfd < 0) {
        int e = errno;
        return npyl_fail(err, errlen, -e, "%s: cannot open its directory %s: %s",
                         po->path, po->dir, strerror(e));
    }
    return 0;
}

/* /proc/self/fd/N of the nameless temporary, for linkat. */
static void proc_path(const pack_out *po, char buf[40])
{
    snprintf(buf, 40, "/proc/self/fd/%d", po->fd);
}

/* Creates the temporary file: nameless when allowed and possible. */
static int out_create_tmp(pack_out *po, int no_tmpfile, char *err, size_t errlen)
{
    if (!no_tmpfile) {
        po->fd = openat(po->dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
        if (po->fd >= 0) {
            /* linkat needs /proc (AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH):
             * check now, while falling back costs nothing. */
            char pp[40];
            struct stat a, b;
            proc_path(po, pp);
            if (fstat(po->fd, &a) == 0 && stat(pp, &b) == 0 &&
                a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
                po->anon = 1;
                return 0;
            }
            close(po->fd);
            po->fd = -1;
        }
    }
    for (int i = 0; i < TMP_TRIES; i++) {
        tmp_name(po->tmp);
        po->fd = openat(po->dirfd, po->tmp,
                        O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (po->fd >= 0)
            return 0;
        if (errno != EEXIST)
            break;
    }
    int e = errno;
    po->tmp[0] = 0; /* nothing to remove */
    return npyl_fail(err, errlen, -e, "%s: cannot create a temporary file in "
                     "%s: %s", po->path, po->dir, strerror(e));
}

/* Gives the nameless temporary the name `name` in dir: 0 or -errno. */
static int out_link_anon(const pack_out *po, const char *name)
{
    char pp[40];
    proc_path(po, pp);
    return linkat(AT_FDCWD, pp, po->dirfd, name, AT_SYMLINK_FOLLOW) == 0 ? 0
                                                                         : -errno;
}

/* Puts the complete, synced temporary in place of out. Without force,
 * atomically refusing to replace (linkat, RENAME_NOREPLACE). With force,
 * only a regular file is replaced: checked up front by the caller and
 * again right before the rename (what is at `out` can still change between
 * that lstat and the rename; no rename-based writer closes that gap). */
static int out_publish(pack_out *po, int force, const struct stat *ist,
                       char *err, size_t errlen)
{
    int rc;
    if (po->anon) {
        rc = out_link_anon(po, po->base);
        if (rc == 0)
            return 0;
        if (rc != -EEXIST)
            return npyl_fail(err, errlen, rc, "%s: cannot link the output "
                             "into place: %s", po->path, strerror(-rc));
        if (!force)
            return npyl_fail(err, errlen, -EEXIST, "%s: already exists "
                             "(force / -f to overwrite)", po->path);
        /* Replacing: a short name first, then rename over out. */
        for (int i = 0; i < TMP_TRIES; i++) {
            tmp_name(po->tmp);
            rc = out_link_anon(po, po->tmp);
            if (rc != -EEXIST)
                break;
        }
        if (rc) {
            po->tmp[0] = 0;
            return npyl_fail(err, errlen, rc, "%s: cannot link a temporary "
                             "name in %s: %s", po->path, po->dir,
                             strerror(-rc));
        }
    } else if (!force) {
        if (renameat2(po->dirfd, po->tmp, po->dirfd, po->base,
                      RENAME_NOREPLACE) == 0)
            return 0;
        int e = errno;
        if (e == EINVAL || e == ENOSYS) {
            /* A filesystem without RENAME_NOREPLACE: link() also fails
             * with EEXIST rather than replace. */
            if (linkat(po->dirfd, po->tmp, po->dirfd, po->base, 0) == 0) {
                unlinkat(po->dirfd, po->tmp, 0);
                return 0;
            }
            e = errno;
        }
        if (e == EEXIST)
            return npyl_fail(err, errlen, -EEXIST, "%s: already exists "
                             "(force / -f to overwrite)", po->path);
        return npyl_fail(err, errlen, -e, "%s: cannot rename %s to it: %s",
                         po->path, po->tmp, strerror(e));
    }
    rc = out_replaceable(po, force, ist, err, errlen);
    if (rc)
        return rc; /* the caller removes po->tmp */
    if (renameat(po->dirfd, po->tmp, po->dirfd, po->base) != 0) {
        int e = errno;
        return npyl_fail(err, errlen, -e, "%s: cannot rename %s to it: %s",
                         po->path, po->tmp, strerror(e));
    }
    return 0;
}

/* fsync that treats "this file cannot be synced" (EINVAL: some FUSE and
 * special filesystems) as nothing to do. */
static int sync_fd(int fd)
{
    if (fsync(fd) == 0 || errno == EINVAL)
        return 0;
    return -errno;
}

/* The options' ranges, checked before anything is opened. */
static int check_options(const char *in, const npyload_pack_options *o,
                         char *err, size_t errlen)
{
    if (o->level != 0 &&
        (o->level < ZSTD_minCLevel() || o->level > ZSTD_maxCLevel()))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: level %d out of range (%d .. %d; 0 = the "
                         "default %d)",
                         in, o->level, ZSTD_minCLevel(), ZSTD_maxCLevel(),
                         NPYLOAD_PACK_DEFAULT_LEVEL);
    if (o->frame_size > NPYL_ZST_MAX_FRAME_BYTES)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: frame_size %" PRIu64 " out of range (1 .. %u "
                         "bytes; 0 = the default %u)",
                         in, o->frame_size, NPYL_ZST_MAX_FRAME_BYTES,
                         NPYLOAD_PACK_DEFAULT_FRAME_SIZE);
    if (o->threads < 0 || o->threads > PACK_THREADS_ARG_MAX)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: threads %d out of range (0 .. %d; 0 = all online "
                         "cores)", in, o->threads, PACK_THREADS_ARG_MAX);
    if (o->store && !o->narrow)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: store needs narrow (only narrowed codes are stored "
                         "without compression)", in);
    return 0;
}

/* npyload_pack_file with a test's choice: no_tmpfile 1 takes the named
 * temporary path that a filesystem without O_TMPFILE gets. */
NPYL_HIDDEN int npyl_pack_file_ex(const char *in, const char *out,
                                  const npyload_pack_options *o,
                                  npyload_pack_result *r, char *err,
                                  size_t errlen, int no_tmpfile);

int npyload_pack_file(const char *in, const char *out,
                      const npyload_pack_options *o, size_t o_size,
                      npyload_pack_result *r, size_t r_size, char *err,
                      size_t errlen)
{
    /* The sized-struct rule (npyload.h, Conventions); the first layouts end
     * at progress_arg and at seconds. */
    const size_t o_min = NPYL_SIZE_THROUGH(npyload_pack_options, progress_arg);
    const size_t r_min = NPYL_SIZE_THROUGH(npyload_pack_result, seconds);
    npyload_pack_options opts;
    npyload_pack_result res;
    const char *what = in ? in : "<null>";
    if (o) {
        int rc = npyl_sized_in(&opts, sizeof opts, o, o_size, o_min);
        if (rc == NPYLOAD_EINVAL)
            return npyl_fail(err, errlen, rc, "%s: npyload_pack_file: options size "
                             "%zu is smaller than the first npyload_pack_options "
                             "layout (%zu bytes); pass sizeof(npyload_pack_options)",
                             what, o_size, o_min);
        if (rc)
            return npyl_fail(err, errlen, rc, "%s: npyload_pack_file: the options "
                             "(%zu bytes) set members this library (%zu bytes, "
                             "version %s) does not know", what, o_size,
                             sizeof opts, NPYLOAD_VERSION_STRING);
    }
    if (r && r_size < r_min)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "%s: npyload_pack_file: "
                         "result size %zu is smaller than the first "
                         "npyload_pack_result layout (%zu bytes); pass "
                         "sizeof(npyload_pack_result)", what, r_size, r_min);
    int rc = npyl_pack_file_ex(in, out, o ? &opts : NULL, r ? &res : NULL, err,
                               errlen, 0);
    if (rc == 0 && r)
        npyl_sized_out(r, r_size, &res, sizeof res, r_min);
    return rc;
}

size_t npyload_pack_default_out(const char *in, int store, char *buf, size_t len)
{
    size_t n = in ? strlen(in) : 0;
    if (!store)
        return (size_t)snprintf(buf, len, "%s.zst", in ? in : "");
    if (n >= 4 && !strcmp(in + n - 4, ".npy"))
        n -= 4;
    return (size_t)snprintf(buf, len, "%.*s.narrow.npy", (int)n, in ? in : "");
}

/* ---- one pack: plan, temporary output, chunk loop, finish -------------- */

/* Everything one npyload_pack_file call holds; pack_release frees it all,
 * whatever step failed. */
typedef struct pack_job {
    const char *in, *out;
    const npyload_pack_options *o;
    char *err;
    size_t errlen;
    /* the plan */
    int level, checksum;
    struct stat ist;            /* the input's identity before its header */
    npyload_header h;
    uint64_t rows, rb;          /* samples and bytes per sample, as stored
                                   (narrowed: one byte per value) */
    unsigned w;                 /* narrowed: bytes per input value; else 1 */
    npyl_zst_narrow_scan *scan; /* narrowed: the file's distinct values */
    unsigned char *nbuf;        /* narrowed: a chunk of input values */
    uint64_t spf, nframes;      /* samples per frame; frames with frame 0 */
    size_t frame_bytes;
    char *dflt;                 /* the default output name, when built */
    /* the files */
    int ifd;
    pack_out po;
    /* the seek table, one entry per frame */
    uint32_t *tcs, *tds, *tck;
    uint64_t out_bytes, flushed; /* written; write-back started */
    /* the chunk loop */
    unsigned char *ibuf, *obuf;
    size_t *csz, stride;
    uint64_t chunk_frames;
    ZSTD_CCtx *cctx;            /* the calling thread's */
    pack_worker *ws;            /* ws[1..nthreads-1]: helpers */
    int nthreads, pool_init;
    pack_pool pool;
} pack_job;

/* Frames for the header's rows: spf samples per frame, the fewest whole
 * samples reaching the target, within the seekable format's limits. */
static int plan_frames(pack_job *j, uint64_t target)
{
    const npyload_header *h = &j->h;
    j->rows = h->ndim ? (uint64_t)h->shape[0] : 1;
    j->rb = j->rows ? h->data_bytes / j->w / j->rows : 0;
    j->spf = 0;
    j->nframes = 1;
    if (h->data_bytes) {
        uint64_t rb = j->rb, spf;
        if (rb > NPYL_ZST_MAX_FRAME_BYTES)
            return npyl_fail(j->err, j->errlen, NPYLOAD_ETOOBIG,
                             "%s: %" PRIu64 "-byte samples: more than a "
                             "seekable frame may hold (%u)",
                             j->in, rb, NPYL_ZST_MAX_FRAME_BYTES);
        spf = target / rb + (target % rb != 0); /* target <= 1 GiB */
        if (spf == 0)
            spf = 1;
        if (spf > NPYL_ZST_MAX_FRAME_BYTES / rb)
            spf = NPYL_ZST_MAX_FRAME_BYTES / rb;
        if (spf > j->rows)
            spf = j->rows;
        j->spf = spf;
        j->nframes = 1 + (j->rows + spf - 1) / spf;
        if (j->nframes > NPYL_ZST_MAX_FRAMES)
            return npyl_fail(j->err, j->errlen, NPYLOAD_ETOOBIG,
                             "%s: %" PRIu64 " frames, more than the seekable "
                             "format's %u: choose a larger frame size",
                             j->in, j->nframes, NPYL_ZST_MAX_FRAMES);
    }
    j->frame_bytes = (size_t)(j->spf * j->rb);
    return 0;
}

/* --narrow: the file's values, 2, 4 or 8 bytes each, must be at most
 * NPYL_ZST_NARROW_MAX distinct bit patterns (a first pass over the data);
 * the output then stores one-byte codes (npyload_zst_narrow.c). */
static int plan_narrow(pack_job *j)
{
    const npyload_header *h = &j->h;
    unsigned w = (unsigned)h->itemsize;
    if ((w != 2 && w != 4 && w != 8) || strlen(h->descr) != 3 || !strchr("fiuc", h->kind))
        return npyl_fail(j->err, j->errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: narrow: dtype '%s' cannot be narrowed (numbers of 2, 4 or "
                         "8 bytes can)", j->in, h->descr);
    j->scan = malloc(sizeof *j->scan);
    size_t cap = 8u << 20;
    unsigned char *buf = malloc(cap);
    int fd = open(j->in, O_RDONLY | O_CLOEXEC);
    int rc = 0;
    if (!j->scan || !buf || fd < 0) {
        int e = fd < 0 ? errno : ENOMEM;
        rc = npyl_fail(j->err, j->errlen, -e, "%s: narrow: %s", j->in,
                       fd < 0 ? strerror(e) : "out of memory");
        goto out;
    }
    npyl_zst_narrow_begin(j->scan, w);
    for (uint64_t at = 0; at < h->data_bytes && !j->scan->over;) {
        size_t n = h->data_bytes - at < cap ? (size_t)(h->data_bytes - at) : cap;
        n -= n % w;
        rc = pread_exact(fd, buf, n, h->data_offset + at);
        if (rc) {
            rc = npyl_fail(j->err, j->errlen, rc == -EIO ? NPYLOAD_ECHANGED : rc,
                           "%s: narrow: read of %zu bytes at byte %" PRIu64 " failed: %s",
                           j->in, n, h->data_offset + at,
                           rc == -EIO ? "short read (file changed?)" : strerror(-rc));
            goto out;
        }
        npyl_zst_narrow_add(j->scan, buf, n);
        at += n;
    }
    if (j->scan->over)
        rc = npyl_fail(j->err, j->errlen, NPYLOAD_EUNSUPPORTED,
                       "%s: narrow: more than %u distinct values: '%s' data cannot be "
                       "stored as one-byte codes without loss (pack it without --narrow)",
                       j->in, NPYL_ZST_NARROW_MAX, h->descr);
    else
        j->w = w;
    /* A file of no values (0 samples, or a zero-length axis): a table of
     * one value that no code names, since a table holds 1 to 256 values
     * (npyl_zst_narrow_parse) and narrow_values 0 means "not narrowed". */
    if (!rc && j->scan->count == 0) {
        static const unsigned char zero[8] = {0};
        npyl_zst_narrow_add(j->scan, zero, w);
    }
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    return rc;
}

/* Step 1, nothing opened yet: the options, the input's identity and header,
 * the frames, the output's name. */
static int pack_plan(pack_job *j)
{
    const npyload_pack_options *o = j->o;
    int rc = check_options(j->in, o, j->err, j->errlen);
    if (rc)
        return rc;
    j->level = o->level ? o->level : NPYLOAD_PACK_DEFAULT_LEVEL;
    j->checksum = !o->no_checksum;
    /* The input's identity before its header is read: every later check
     * compares with it. ENOENT: the header reader names it as the loader
     * does. */
    if (stat(j->in, &j->ist) != 0 && errno != ENOENT) {
        int e = errno;
        return npyl_fail(j->err, j->errlen, -e, "%s: cannot stat: %s", j->in,
                         strerror(e));
    }
    rc = npyload_read_header(j->in, &j->h, j->err, j->errlen);
    if (rc)
        return rc;
    if (j->h.fortran_order && j->h.ndim > 1)
        return npyl_fail(j->err, j->errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: Fortran-ordered array (fortran_order: True): "
                         "samples are not contiguous, cannot pack by sample",
                         j->in);
    if (j->h.file_bytes != j->h.data_offset + j->h.data_bytes)
        return npyl_fail(j->err, j->errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: %" PRIu64 " bytes after the array data: a "
                         ".npy.zst holds the array only, strip them first",
                         j->in, j->h.file_bytes - j->h.data_offset - j->h.data_bytes);
    j->w = 1;
    if (o->narrow && (rc = plan_narrow(j)))
        return rc;
    rc = plan_frames(j, o->frame_size ? o->frame_size
                                      : NPYLOAD_PACK_DEFAULT_FRAME_SIZE);
    if (rc)
        return rc;
    if (!j->out) {
        size_t n = npyload_pack_default_out(j->in, j->o->store, NULL, 0) + 1;
        j->dflt = malloc(n);
        if (!j->dflt)
            return npyl_fail(j->err, j->errlen, -ENOMEM, "%s: out of memory",
                             j->in);
        npyload_pack_default_out(j->in, j->o->store, j->dflt, n);
        j->out = j->dflt;
    }
    j->po.path = j->out;
    return 0;
}

/* Step 2: the input opened and still the file planned, the temporary output
 * created, the seek table and the caller's compressor allocated. */
static int pack_open(pack_job *j, int no_tmpfile)
{
    j->ifd = open(j->in, O_RDONLY | O_CLOEXEC);
    if (j->ifd < 0) {
        int e = errno;
        return npyl_fail(j->err, j->errlen, -e, "%s: cannot open: %s", j->in,
                         strerror(e));
    }
    int rc = input_unchanged(j->ifd, j->in, &j->ist, 0, j->err, j->errlen);
    if (rc)
        return rc;
    if ((uint64_t)j->ist.st_size != j->h.file_bytes)
        return npyl_fail(j->err, j->errlen, NPYLOAD_ECHANGED,
                         "%s: changed while being packed (%" PRIu64 " bytes, "
                         "then %lld)", j->in, j->h.file_bytes,
                         (long long)j->ist.st_size);
    rc = out_open_dir(&j->po, j->err, j->errlen);
    if (!rc)
        rc = out_replaceable(&j->po, j->o->force, &j->ist, j->err, j->errlen);
    if (!rc)
        rc = out_create_tmp(&j->po, no_tmpfile, j->err, j->errlen);
    if (rc)
        return rc;
    size_t n = (size_t)j->nframes;
    j->tcs = malloc(sizeof(uint32_t) * n);
    j->tds = malloc(sizeof(uint32_t) * n);
    j->tck = malloc(sizeof(uint32_t) * n);
    j->cctx = make_cctx(j->level, j->checksum, j->spf > 1);
    if (!j->tcs || !j->tds || !j->tck || !j->cctx)
        return npyl_fail(j->err, j->errlen, -ENOMEM, "%s: out of memory", j->in);
    return 0;
}

static int pack_write_failed(const pack_job *j, int rc)
{
    return npyl_fail(j->err, j->errlen, rc, "%s: write failed: %s", j->out,
                     strerror(-rc));
}

/* Appends compressed frame f (c bytes at cp) and its seek-table entry. */
static int pack_put_frame(pack_job *j, uint64_t f, const unsigned char *cp,
                          size_t c, size_t dsize)
{
    int rc = write_all(j->po.fd, cp, c);
    if (rc)
        return pack_write_failed(j, rc);
    j->tcs[f] = (uint32_t)c;
    j->tds[f] = (uint32_t)dsize;
    j->tck[f] = j->checksum ? le32(cp + c - 4) : 0;
    j->out_bytes += c;
    return 0;
}

/* Narrowed: the input's header made the codes' one: its descr ('<f4',
 * three characters, checked by plan_narrow) becomes '|u1' in place, so the
 * header keeps its length and padding. */
static int codes_header(const pack_job *j, unsigned char *hbuf, size_t hb)
{
    char q1[24], q2[24];
    snprintf(q1, sizeof q1, "'%s'", j->h.descr);
    snprintf(q2, sizeof q2, "\"%s\"", j->h.descr);
    const char *key = memmem(hbuf, hb, "descr", 5);
    size_t from = key ? (size_t)(key - (const char *)hbuf) : hb;
    unsigned char *d = from < hb ? memmem(hbuf + from, hb - from, q1, 5) : NULL;
    if (!d && from < hb)
        d = memmem(hbuf + from, hb - from, q2, 5);
    if (!d)
        return npyl_fail(j->err, j->errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: narrow: cannot find the descr '%s' in the header text",
                         j->in, j->h.descr);
    memcpy(d + 1, "|u1", 3);
    return 0;
}

/* Narrowed: the value table, after the header's zstd frame, inside frame
 * 0's extent (the seek table's checksum stays the header frame's). */
static int pack_put_table(pack_job *j)
{
    unsigned char *t = NULL;
    size_t n = 0;
    int rc = npyl_zst_narrow_encode(j->scan, j->h.descr, &t, &n);
    if (rc)
        return npyl_fail(j->err, j->errlen, rc, "%s: narrow: cannot encode the value "
                         "table", j->in);
    rc = write_all(j->po.fd, t, n);
    free(t);
    if (rc)
        return pack_write_failed(j, rc);
    j->tcs[0] += (uint32_t)n;
    j->out_bytes += n;
    return 0;
}

/* Step 3: frame 0, the NPY header on its own. */
static int pack_header_frame(pack_job *j)
{
    size_t hb = (size_t)j->h.data_offset;
    size_t cap = ZSTD_compressBound(hb);
    unsigned char *hbuf = malloc(hb), *cbuf = malloc(cap);
    int rc = 0;
    if (!hbuf || !cbuf) {
        rc = npyl_fail(j->err, j->errlen, -ENOMEM, "%s: out of memory", j->in);
        goto out;
    }
    rc = pread_exact(j->ifd, hbuf, hb, 0);
    if (rc) {
        rc = npyl_fail(j->err, j->errlen, rc, "%s: read failed at byte 0: %s",
                       j->in, rc == -EIO ? "short read" : strerror(-rc));
        goto out;
    }
    if (j->w > 1 && (rc = codes_header(j, hbuf, hb)))
        goto out;
    if (j->o->store) { /* the codes' .npy header as is */
        rc = write_all(j->po.fd, hbuf, hb);
        if (rc)
            rc = pack_write_failed(j, rc);
        j->out_bytes += hb;
        goto out;
    }
    size_t c = ZSTD_compress2(j->cctx, cbuf, cap, hbuf, hb);
    if (ZSTD_isError(c))
        rc = npyl_fail(j->err, j->errlen, NPYLOAD_EINVAL, "%s: zstd: %s",
                       j->in, ZSTD_getErrorName(c));
    else
        rc = pack_put_frame(j, 0, cbuf, c, hb);
    if (rc == 0 && j->w > 1)
        rc = pack_put_table(j);
out:
    free(hbuf);
    free(cbuf);
    return rc;
}

/* Step 4a: chunk buffers of chunk_frames frames, and threads-1 helpers that
 * compress alongside the calling thread. */
static int pack_pool_start(pack_job *j)
{
    uint64_t data_frames = j->nframes - 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = j->o->threads > 0 ? j->o->threads : (cores > 0 ? (int)cores : 1);
    if (nt > MAX_THREADS)
        nt = MAX_THREADS;
    if ((uint64_t)nt > data_frames)
        nt = (int)data_frames;
    uint64_t k = (uint64_t)nt * CHUNK_FRAMES_PER_THREAD;
    if (k * j->frame_bytes * j->w > CHUNK_MAX_BYTES)
        k = CHUNK_MAX_BYTES / (j->frame_bytes * j->w);
    if (k == 0)
        k = 1;
    if (k > data_frames)
        k = data_frames;
    j->chunk_frames = k;
    j->stride = ZSTD_compressBound(j->frame_bytes);
    j->ibuf = malloc((size_t)k * j->frame_bytes);
    j->obuf = malloc((size_t)k * j->stride);
    j->csz = malloc(sizeof(size_t) * (size_t)k);
    j->ws = calloc((size_t)nt, sizeof *j->ws);
    if (j->w > 1)
        j->nbuf = malloc((size_t)k * j->frame_bytes * j->w);
    if (!j->ibuf || !j->obuf || !j->csz || !j->ws || (j->w > 1 && !j->nbuf))
        return npyl_fail(j->err, j->errlen, -ENOMEM, "%s: out of memory for %"
                         PRIu64 " frames of %zu bytes", j->in, k,
                         j->frame_bytes);
    j->nthreads = nt;
    pack_pool *p = &j->pool;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    j->pool_init = 1;
    p->participants = 1;
    p->out = j->obuf;
    p->out_stride = j->stride;
    p->csize = j->csz;
    p->in = j->ibuf;
    p->frame_bytes = j->frame_bytes;
    /* ws[0] is the calling thread (j->cctx); helpers from 1. */
    for (int t = 1; t < nt; t++) {
        pack_worker *w = &j->ws[t];
        w->pool = p;
        w->cctx = make_cctx(j->level, j->checksum, j->spf > 1);
        if (!w->cctx)
            return npyl_fail(j->err, j->errlen, -ENOMEM, "%s: out of memory",
                             j->in);
        int e = pthread_create(&w->tid, NULL, helper_main, w);
        if (e)
            return npyl_fail(j->err, j->errlen, -e, "%s: cannot start a "
                             "thread: %s", j->in, strerror(e));
        w->started = 1;
        p->participants++;
    }
    return 0;
}

/* Compresses the cnt frames of `bytes` input in ibuf with every
 * participant, returning when all are done. */
static void pack_compress(pack_job *j, uint32_t cnt, size_t bytes)
{
    pack_pool *p = &j->pool;
    pthread_mutex_lock(&p->mu);
    p->count = cnt;
    p->last_bytes = bytes - (size_t)(cnt - 1) * j->frame_bytes;
    p->next = 0;
    p->finished = 0;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    compress_chunk(p, j->cctx);
    pthread_mutex_lock(&p->mu);
    while (p->finished < p->participants)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* Step 4b, one chunk: frames f .. f+cnt-1 (rows from `row`) read,
 * compressed and appended. */
static int pack_chunk(pack_job *j, uint64_t f, uint32_t cnt, uint64_t row,
                      uint64_t crow)
{
    size_t bytes = (size_t)(crow * j->rb);
    uint64_t off = j->h.data_offset + row * j->rb * j->w;
    int rc = pread_exact(j->ifd, j->w > 1 ? j->nbuf : j->ibuf, bytes * j->w, off);
    if (rc == 0 && j->w > 1)
        npyl_zst_narrow_codes(j->scan, j->nbuf, bytes * j->w, j->ibuf);
    if (rc)
        return npyl_fail(j->err, j->errlen,
                         rc == -EIO ? NPYLOAD_ECHANGED : rc,
                         "%s: read of %zu bytes at byte %" PRIu64 " failed: %s",
                         j->in, bytes * j->w, off,
                         rc == -EIO ? "short read (file changed?)"
                                    : strerror(-rc));
    pack_compress(j, cnt, bytes);
    for (uint32_t i = 0; i < cnt; i++) {
        size_t c = j->csz[i];
        if (ZSTD_isError(c))
            return npyl_fail(j->err, j->errlen, NPYLOAD_EINVAL,
                             "%s: zstd failed on frame %" PRIu64 ": %s",
                             j->in, f + i, ZSTD_getErrorName(c));
        rc = pack_put_frame(j, f + i, j->obuf + (size_t)i * j->stride, c,
                            i + 1 == cnt ? j->pool.last_bytes : j->frame_bytes);
        if (rc)
            return rc;
    }
    /* Start the write-back of what is written so far, so that the final
     * fsync has little left to wait for (it overlaps with compressing the
     * next chunks). Advice only: errors ignored. */
    if (j->out_bytes - j->flushed >= WRITEBACK_BYTES) {
        sync_file_range(j->po.fd, (off_t)j->flushed,
                        (off_t)(j->out_bytes - j->flushed),
                        SYNC_FILE_RANGE_WRITE);
        j->flushed = j->out_bytes;
    }
    return 0;
}

static int pack_progress(const pack_job *j, uint64_t done)
{
    const npyload_pack_options *o = j->o;
    if (o->progress && o->progress(o->progress_arg, done, j->h.file_bytes))
        return npyl_fail(j->err, j->errlen, -ECANCELED, "%s: cancelled", j->out);
    return 0;
}

/* Step 4, stored: the codes of chunks of rows, written as they are. */
static int pack_store_chunks(pack_job *j)
{
    /* rb is 0 for samples of no values: nothing to write, one row a chunk */
    uint64_t k = j->rb ? CHUNK_MAX_BYTES / (j->rb * j->w) : 1;
    if (k == 0)
        k = 1;
    j->ibuf = malloc((size_t)(k * j->rb) + 1);
    j->nbuf = malloc((size_t)(k * j->rb * j->w) + 1);
    if (!j->ibuf || !j->nbuf)
        return npyl_fail(j->err, j->errlen, -ENOMEM, "%s: out of memory", j->in);
    int rc = 0;
    for (uint64_t row = 0; !rc && row < j->rows; row += k) {
        uint64_t crow = j->rows - row < k ? j->rows - row : k;
        size_t bytes = (size_t)(crow * j->rb);
        uint64_t off = j->h.data_offset + row * j->rb * j->w;
        rc = pread_exact(j->ifd, j->nbuf, bytes * j->w, off);
        if (rc)
            return npyl_fail(j->err, j->errlen, rc == -EIO ? NPYLOAD_ECHANGED : rc,
                             "%s: read of %zu bytes at byte %" PRIu64 " failed: %s", j->in,
                             bytes * j->w, off,
                             rc == -EIO ? "short read (file changed?)" : strerror(-rc));
        npyl_zst_narrow_codes(j->scan, j->nbuf, bytes * j->w, j->ibuf);
        rc = write_all(j->po.fd, j->ibuf, bytes);
        if (rc)
            return pack_write_failed(j, rc);
        j->out_bytes += bytes;
        rc = input_unchanged(j->ifd, j->in, &j->ist, 0, j->err, j->errlen);
        if (!rc)
            rc = pack_progress(j, off + bytes * j->w);
    }
    return rc;
}

/* Step 4: the data frames, chunk by chunk. */
static int pack_chunks(pack_job *j)
{
    if (j->o->store)
        return pack_store_chunks(j);
    if (j->nframes == 1)
        return 0;
    int rc = pack_pool_start(j);
    uint64_t row = 0, f = 1;
    while (!rc && f < j->nframes) {
        uint64_t left = j->nframes - f;
        uint32_t cnt = (uint32_t)(left < j->chunk_frames ? left : j->chunk_frames);
        uint64_t crow = (uint64_t)cnt * j->spf;
        if (crow > j->rows - row)
            crow = j->rows - row;
        rc = pack_chunk(j, f, cnt, row, crow);
        row += crow;
        f += cnt;
        /* An early answer to a rewrite; the last check is in pack_finish. */
        if (!rc)
            rc = input_unchanged(j->ifd, j->in, &j->ist, 0, j->err, j->errlen);
        if (!rc)
            rc = pack_progress(j, j->h.data_offset + row * j->rb * j->w);
    }
    return rc;
}

/* Step 5: the seek table, then the output durable before it has the final
 * name (after a power loss the name holds the whole output or nothing), and
 * the name durable after. */
static int pack_finish(pack_job *j)
{
    size_t tsz = 0;
    unsigned char *tab = NULL;
    if (j->o->store) { /* stored: the value table's trailer instead */
        int rc = npyl_zst_store_trailer(j->scan, j->h.descr, &tab, &tsz);
        if (rc)
            return npyl_fail(j->err, j->errlen, rc, "%s: narrow: cannot encode the "
                             "value table", j->in);
    } else {
        tsz = npyl_zst_table_size((uint32_t)j->nframes, j->checksum);
        tab = malloc(tsz);
        if (!tab)
            return npyl_fail(j->err, j->errlen, -ENOMEM, "%s: out of memory", j->in);
        npyl_zst_table_encode(tab, (uint32_t)j->nframes, j->tcs, j->tds, j->tck,
                              j->checksum);
    }
    int rc = write_all(j->po.fd, tab, tsz);
    free(tab);
    if (rc)
        return pack_write_failed(j, rc);
    j->out_bytes += tsz;
    /* Every byte read came from the file whose header was parsed: else the
     * output could mix old and new rows. */
    rc = input_unchanged(j->ifd, j->in, &j->ist, 1, j->err, j->errlen);
    if (rc)
        return rc;
    if (fchmod(j->po.fd, j->ist.st_mode & 07777) != 0) {
        int e = errno;
        return npyl_fail(j->err, j->errlen, -e, "%s: cannot set its mode: %s",
                         j->out, strerror(e));
    }
    rc = sync_fd(j->po.fd);
    if (rc)
        return npyl_fail(j->err, j->errlen, rc, "%s: fsync failed: %s", j->out,
                         strerror(-rc));
    rc = out_publish(&j->po, j->o->force, &j->ist, j->err, j->errlen);
    if (rc)
        return rc;
    j->po.tmp[0] = 0; /* published: nothing to remove */
    rc = sync_fd(j->po.dirfd);
    if (rc)
        return npyl_fail(j->err, j->errlen, rc, "%s: written, but fsync of its "
                         "directory %s failed (the name may not survive a "
                         "power loss): %s", j->out, j->po.dir, strerror(-rc));
    return 0;
}

/* Frees what any step left, stopping the helpers first; an unpublished
 * temporary is removed. */
static void pack_release(pack_job *j)
{
    if (j->pool_init) {
        pthread_mutex_lock(&j->pool.mu);
        j->pool.quit = 1;
        pthread_cond_broadcast(&j->pool.go);
        pthread_mutex_unlock(&j->pool.mu);
    }
    for (int t = 1; j->ws && t < j->nthreads; t++) {
        if (j->ws[t].started)
            pthread_join(j->ws[t].tid, NULL);
        ZSTD_freeCCtx(j->ws[t].cctx);
    }
    if (j->pool_init) {
        pthread_mutex_destroy(&j->pool.mu);
        pthread_cond_destroy(&j->pool.go);
        pthread_cond_destroy(&j->pool.done);
    }
    free(j->ws);
    ZSTD_freeCCtx(j->cctx);
    /* After fsync, close() has no write-back error left to report. */
    if (j->po.fd >= 0)
        close(j->po.fd);
    if (j->po.tmp[0])
        unlinkat(j->po.dirfd, j->po.tmp, 0);
    if (j->po.dirfd >= 0)
        close(j->po.dirfd);
    free(j->po.dir);
    if (j->ifd >= 0)
        close(j->ifd);
    free(j->csz);
    free(j->scan);
    free(j->nbuf);
    free(j->ibuf);
    free(j->obuf);
    free(j->tcs);
    free(j->tds);
    free(j->tck);
    free(j->dflt);
}

int npyl_pack_file_ex(const char *in, const char *out,
                      const npyload_pack_options *o, npyload_pack_result *r,
                      char *err, size_t errlen, int no_tmpfile)
{
    uint64_t t0 = npyl_now_ns();
    npyload_pack_options def;
    memset(&def, 0, sizeof def);
    if (!in)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "<null>: npyload_pack_file: no input path");
    pack_job *j = calloc(1, sizeof *j);
    if (!j)
        return npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", in);
    j->in = in;
    j->out = out;
    j->o = o ? o : &def;
    j->err = err;
    j->errlen = errlen;
    j->ifd = j->po.dirfd = j->po.fd = -1;
    int rc = pack_plan(j);
    if (!rc)
        rc = pack_open(j, no_tmpfile);
    if (!rc)
        rc = pack_progress(j, 0);
    if (!rc)
        rc = pack_header_frame(j);
    if (!rc)
        rc = pack_chunks(j);
    if (!rc)
        rc = pack_finish(j);
    if (!rc && r) {
        r->in_bytes = j->h.file_bytes;
        r->out_bytes = j->out_bytes;
        r->frames = j->o->store ? 0 : j->nframes;
        r->samples_per_frame = j->o->store ? 0 : j->spf;
        r->narrow_values = j->w > 1 ? j->scan->count : 0;
        r->seconds = (double)(npyl_now_ns() - t0) / 1e9;
    }
    pack_release(j);
    free(j);
    return rc;
}
