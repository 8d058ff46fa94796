/* npyload_pack_file: .npy -> .npy.zst (npyload_zst.h for the layout).
 *
 * The calling thread reads a chunk of frames (pread), compresses frames of
 * it alongside threads-1 helpers (one ZSTD_CCtx each, frames handed out by
 * index under a mutex), then writes the chunk's frames in order to a
 * temporary file. Memory is two chunk buffers, whatever the input size.
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
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

#define CHUNK_FRAMES_PER_THREAD 4
#define CHUNK_MAX_BYTES (64u << 20)
#define MAX_THREADS 256

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

static ZSTD_CCtx *make_cctx(int level, int checksum)
{
    ZSTD_CCtx *c = ZSTD_createCCtx();
    if (!c)
        return NULL;
    if (ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, checksum)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1))) {
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

/* Puts tmp in place of out: atomically refusing to replace unless force. */
static int publish(const char *tmp, const char *out, int force, char *err,
                   size_t errlen)
{
    if (force) {
        if (rename(tmp, out) == 0)
            return 0;
    } else {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_NOREPLACE) == 0)
            return 0;
        if (errno == EINVAL || errno == ENOSYS) {
            /* A filesystem without RENAME_NOREPLACE: link() also fails
             * with EEXIST rather than replace. */
            if (link(tmp, out) == 0) {
                unlink(tmp);
                return 0;
            }
        }
    }
    int e = errno;
    if (e == EEXIST)
        return npyl_fail(err, errlen, -EEXIST,
                         "%s: already exists (force / -f to overwrite)", out);
    return npyl_fail(err, errlen, -e, "%s: cannot rename %s to it: %s", out,
                     tmp, strerror(e));
}

int npyload_pack_file(const char *in, const char *out,
                      const npyload_pack_options *o, npyload_pack_result *r,
                      char *err, size_t errlen)
{
    uint64_t t0 = npyl_now_ns();
    npyload_pack_options def;
    memset(&def, 0, sizeof def);
    if (!o)
        o = &def;
    if (!in)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "<null>: npyload_pack_file: no input path");
    int level = o->level ? o->level : NPYLOAD_PACK_DEFAULT_LEVEL;
    if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel())
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: zstd level %d out of range [%d, %d]", in, level,
                         ZSTD_minCLevel(), ZSTD_maxCLevel());
    uint64_t target = o->frame_size ? o->frame_size : NPYLOAD_PACK_DEFAULT_FRAME_SIZE;
    int checksum = !o->no_checksum;

    npyload_header h;
    int rc = npyload_read_header(in, &h, err, errlen);
    if (rc)
        return rc;
    if (h.fortran_order && h.ndim > 1)
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: Fortran-ordered array (fortran_order: True): "
                         "samples are not contiguous, cannot pack by sample",
                         in);
    if (h.file_bytes != h.data_offset + h.data_bytes)
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: %" PRIu64 " bytes after the array data: a "
                         ".npy.zst holds the array only, strip them first",
                         in, h.file_bytes - h.data_offset - h.data_bytes);

    /* Samples and frames. */
    uint64_t rows = h.ndim ? (uint64_t)h.shape[0] : 1;
    uint64_t rb = rows ? h.data_bytes / rows : 0;
    uint64_t spf = 0, nframes = 1;
    if (h.data_bytes) {
        if (rb > NPYL_ZST_MAX_FRAME_BYTES)
            return npyl_fail(err, errlen, NPYLOAD_ETOOBIG,
                             "%s: %" PRIu64 "-byte samples: more than a "
                             "seekable frame may hold (%u)",
                             in, rb, NPYL_ZST_MAX_FRAME_BYTES);
        spf = (target + rb - 1) / rb;
        if (spf == 0)
            spf = 1;
        if (spf > NPYL_ZST_MAX_FRAME_BYTES / rb)
            spf = NPYL_ZST_MAX_FRAME_BYTES / rb;
        if (spf > rows)
            spf = rows;
        nframes = 1 + (rows + spf - 1) / spf;
        if (nframes > NPYL_ZST_MAX_FRAMES)
            return npyl_fail(err, errlen, NPYLOAD_ETOOBIG,
                             "%s: %" PRIu64 " frames, more than the seekable "
                             "format's %u: choose a larger frame size",
                             in, nframes, NPYL_ZST_MAX_FRAMES);
    }
    size_t frame_bytes = (size_t)(spf * rb);

    char *dflt = NULL;
    if (!out) {
        dflt = malloc(strlen(in) + 5);
        if (!dflt)
            return npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", in);
        sprintf(dflt, "%s.zst", in);
        out = dflt;
    }

    /* Everything below releases through `done`. */
    int ifd = -1, ofd = -1;
    char *tmp = NULL;
    uint32_t *tcs = NULL, *tds = NULL, *tck = NULL;
    unsigned char *ibuf = NULL, *obuf = NULL, *tab = NULL;
    size_t *csz = NULL;
    pack_worker *ws = NULL;
    int nthreads = 0;
    pack_pool pool;
    memset(&pool, 0, sizeof pool);
    int pool_init = 0;
    ZSTD_CCtx *cctx = NULL;

    struct stat ist, ost;
    ifd = open(in, O_RDONLY | O_CLOEXEC);
    if (ifd < 0 || fstat(ifd, &ist) != 0) {
        int e = errno;
        rc = npyl_fail(err, errlen, -e, "%s: cannot open: %s", in, strerror(e));
        goto done;
    }
    if ((uint64_t)ist.st_size != h.file_bytes) {
        rc = npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                       "%s: changed while being packed (%" PRIu64 " bytes, "
                       "then %lld)", in, h.file_bytes, (long long)ist.st_size);
        goto done;
    }
    if (stat(out, &ost) == 0) {
        if (ost.st_dev == ist.st_dev && ost.st_ino == ist.st_ino) {
            rc = npyl_fail(err, errlen, NPYLOAD_EINVAL,
                           "%s: the output is the input", out);
            goto done;
        }
        if (!o->force) {
            rc = npyl_fail(err, errlen, -EEXIST,
                           "%s: already exists (force / -f to overwrite)", out);
            goto done;
        }
    }

    tmp = malloc(strlen(out) + 12);
    if (!tmp) {
        rc = npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", in);
        goto done;
    }
    sprintf(tmp, "%s.tmp.XXXXXX", out);
    ofd = mkostemp(tmp, O_CLOEXEC);
    if (ofd < 0) {
        int e = errno;
        free(tmp);
        tmp = NULL; /* nothing to remove */
        rc = npyl_fail(err, errlen, -e, "%s: cannot create a temporary file "
                       "beside it: %s", out, strerror(e));
        goto done;
    }

    tcs = malloc(sizeof(uint32_t) * nframes);
    tds = malloc(sizeof(uint32_t) * nframes);
    tck = malloc(sizeof(uint32_t) * nframes);
    cctx = make_cctx(level, checksum);
    if (!tcs || !tds || !tck || !cctx) {
        rc = npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", in);
        goto done;
    }

    if (o->progress && o->progress(o->progress_arg, 0, h.file_bytes)) {
        rc = npyl_fail(err, errlen, -ECANCELED, "%s: cancelled", out);
        goto done;
    }

    /* Frame 0: the header. */
    {
        size_t hb = (size_t)h.data_offset;
        size_t cap = ZSTD_compressBound(hb);
        ibuf = malloc(hb);
        obuf = malloc(cap);
        if (!ibuf || !obuf) {
            rc = npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", in);
            goto done;
        }
        rc = pread_exact(ifd, ibuf, hb, 0);
        if (rc) {
            rc = npyl_fail(err, errlen, rc, "%s: read failed at byte 0: %s", in,
                           rc == -EIO ? "short read" : strerror(-rc));
            goto done;
        }
        size_t c = ZSTD_compress2(cctx, obuf, cap, ibuf, hb);
        if (ZSTD_isError(c)) {
            rc = npyl_fail(err, errlen, NPYLOAD_EINVAL, "%s: zstd: %s", in,
                           ZSTD_getErrorName(c));
            goto done;
        }
        rc = write_all(ofd, obuf, c);
        if (rc) {
            rc = npyl_fail(err, errlen, rc, "%s: write failed: %s", tmp,
                           strerror(-rc));
            goto done;
        }
        tcs[0] = (uint32_t)c;
        tds[0] = (uint32_t)hb;
        tck[0] = checksum ? le32(obuf + c - 4) : 0;
        free(ibuf);
        free(obuf);
        ibuf = obuf = NULL;
    }
    uint64_t out_bytes = tcs[0];

    if (nframes > 1) {
        uint64_t data_frames = nframes - 1;
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = o->threads > 0 ? o->threads : (cores > 0 ? (int)cores : 1);
        if (nthreads > MAX_THREADS)
            nthreads = MAX_THREADS;
        if ((uint64_t)nthreads > data_frames)
            nthreads = (int)data_frames;
        uint64_t k = (uint64_t)nthreads * CHUNK_FRAMES_PER_THREAD;
        if (k * frame_bytes > CHUNK_MAX_BYTES)
            k = CHUNK_MAX_BYTES / frame_bytes;
        if (k == 0)
            k = 1;
        if (k > data_frames)
            k = data_frames;
        size_t stride = ZSTD_compressBound(frame_bytes);
        ibuf = malloc((size_t)k * frame_bytes);
        obuf = malloc((size_t)k * stride);
        csz = malloc(sizeof(size_t) * (size_t)k);
        ws = calloc((size_t)nthreads, sizeof *ws);
        if (!ibuf || !obuf || !csz || !ws) {
            rc = npyl_fail(err, errlen, -ENOMEM, "%s: out of memory for %" PRIu64
                           " frames of %zu bytes", in, k, frame_bytes);
            goto done;
        }
        pthread_mutex_init(&pool.mu, NULL);
        pthread_cond_init(&pool.go, NULL);
        pthread_cond_init(&pool.done, NULL);
        pool_init = 1;
        pool.participants = 1;
        pool.out = obuf;
        pool.out_stride = stride;
        pool.csize = csz;
        pool.in = ibuf;
        pool.frame_bytes = frame_bytes;
        /* ws[0] is the calling thread (cctx above); helpers from 1. */
        for (int t = 1; t < nthreads; t++) {
            ws[t].pool = &pool;
            ws[t].cctx = make_cctx(level, checksum);
            if (!ws[t].cctx) {
                rc = npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", in);
                goto done;
            }
            int e = pthread_create(&ws[t].tid, NULL, helper_main, &ws[t]);
            if (e) {
                rc = npyl_fail(err, errlen, -e, "%s: cannot start a thread: %s",
                               in, strerror(e));
                goto done;
            }
            ws[t].started = 1;
            pool.participants++;
        }

        uint64_t row = 0;
        uint32_t f = 1;
        while (f < nframes) {
            uint32_t cnt = (uint32_t)(nframes - f < k ? nframes - f : k);
            uint64_t crow = (uint64_t)cnt * spf;
            if (crow > rows - row)
                crow = rows - row;
            size_t bytes = (size_t)(crow * rb);
            uint64_t off = h.data_offset + row * rb;
            rc = pread_exact(ifd, ibuf, bytes, off);
            if (rc) {
                rc = npyl_fail(err, errlen, rc == -EIO ? NPYLOAD_ECHANGED : rc,
                               "%s: read of %zu bytes at byte %" PRIu64
                               " failed: %s", in, bytes, off,
                               rc == -EIO ? "short read (file changed?)"
                                          : strerror(-rc));
                goto done;
            }
            pthread_mutex_lock(&pool.mu);
            pool.count = cnt;
            pool.last_bytes = bytes - (size_t)(cnt - 1) * frame_bytes;
            pool.next = 0;
            pool.finished = 0;
            pool.gen++;
            pthread_cond_broadcast(&pool.go);
            pthread_mutex_unlock(&pool.mu);
            compress_chunk(&pool, cctx);
            pthread_mutex_lock(&pool.mu);
            while (pool.finished < pool.participants)
                pthread_cond_wait(&pool.done, &pool.mu);
            pthread_mutex_unlock(&pool.mu);

            for (uint32_t i = 0; i < cnt; i++) {
                size_t c = csz[i];
                if (ZSTD_isError(c)) {
                    rc = npyl_fail(err, errlen, NPYLOAD_EINVAL,
                                   "%s: zstd failed on frame %" PRIu32 ": %s",
                                   in, f + i, ZSTD_getErrorName(c));
                    goto done;
                }
                const unsigned char *cp = obuf + (size_t)i * stride;
                rc = write_all(ofd, cp, c);
                if (rc) {
                    rc = npyl_fail(err, errlen, rc, "%s: write failed: %s", tmp,
                                   strerror(-rc));
                    goto done;
                }
                tcs[f + i] = (uint32_t)c;
                tds[f + i] = (uint32_t)(i + 1 == cnt ? pool.last_bytes : frame_bytes);
                tck[f + i] = checksum ? le32(cp + c - 4) : 0;
                out_bytes += c;
            }
            row += crow;
            f += cnt;
            if (o->progress &&
                o->progress(o->progress_arg, h.data_offset + row * rb, h.file_bytes)) {
                rc = npyl_fail(err, errlen, -ECANCELED, "%s: cancelled", out);
                goto done;
            }
        }
    }

    size_t tsz = npyl_zst_table_size((uint32_t)nframes, checksum);
    tab = malloc(tsz);
    if (!tab) {
        rc = npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", in);
        goto done;
    }
    npyl_zst_table_encode(tab, (uint32_t)nframes, tcs, tds, tck, checksum);
    rc = write_all(ofd, tab, tsz);
    if (rc) {
        rc = npyl_fail(err, errlen, rc, "%s: write failed: %s", tmp,
                       strerror(-rc));
        goto done;
    }
    out_bytes += tsz;
    if (fchmod(ofd, ist.st_mode & 07777) != 0 || close(ofd) != 0) {
        int e = errno;
        ofd = -1;
        rc = npyl_fail(err, errlen, -e, "%s: %s", tmp, strerror(e));
        goto done;
    }
    ofd = -1;
    rc = publish(tmp, out, o->force, err, errlen);
    if (rc)
        goto done;
    free(tmp);
    tmp = NULL; /* published: nothing to remove */
    if (r) {
        r->in_bytes = h.file_bytes;
        r->out_bytes = out_bytes;
        r->frames = nframes;
        r->samples_per_frame = spf;
        r->seconds = (double)(npyl_now_ns() - t0) / 1e9;
    }
    rc = 0;

done:
    if (pool_init) {
        pthread_mutex_lock(&pool.mu);
        pool.quit = 1;
        pthread_cond_broadcast(&pool.go);
        pthread_mutex_unlock(&pool.mu);
    }
    for (int t = 1; ws && t < nthreads; t++) {
        if (ws[t].started)
            pthread_join(ws[t].tid, NULL);
        ZSTD_freeCCtx(ws[t].cctx);
    }
    if (pool_init) {
        pthread_mutex_destroy(&pool.mu);
        pthread_cond_destroy(&pool.go);
        pthread_cond_destroy(&pool.done);
    }
    free(ws);
    ZSTD_freeCCtx(cctx);
    if (ofd >= 0)
        close(ofd);
    if (tmp) {
        unlink(tmp);
        free(tmp);
    }
    if (ifd >= 0)
        close(ifd);
    free(tab);
    free(csz);
    free(ibuf);
    free(obuf);
    free(tcs);
    free(tds);
    free(tck);
    free(dflt);
    return rc;
}
