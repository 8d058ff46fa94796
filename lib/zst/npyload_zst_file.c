/* The public .npy.zst file API (include/npyload.h, "Compressed shards"):
 * probe, facts, frame access and decode, verify. The facts npyload-inspect
 * and npyload.inspect print and the frames npyload-bench decodes for its
 * decode ceiling come through the same seek-table parser and frame decoder
 * as the loader's. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

#include "npyload_zst.h"

struct npyload_zst_file {
    npyl_zst_index x;
    npyload_zst_facts facts;
    char *name;
    /* The file's identity when it was opened: verify reads it again. */
    dev_t dev;
    ino_t ino;
    struct timespec mtime;
    /* Not a local file (npyl_zst_file_over): verify reads through rd. */
    npyl_zst_read_fn rd;
    void *rd_ctx;
    void (*rd_free)(void *);
};

static void fill_facts(npyload_zst_file *z)
{
    npyload_zst_facts *f = &z->facts;
    f->hdr = z->x.hdr;
    f->compressed_bytes = z->x.file_size;
    f->table_bytes = z->x.table_bytes;
    f->frames = z->x.nframes;
    f->checksums = z->x.checksums;
    f->max_frame_bytes = z->x.max_dsize;
    f->max_frame_compressed = z->x.max_csize;
    if (z->x.narrow) {
        f->narrow_values = z->x.narrow->count;
        f->value_itemsize = z->x.narrow->itemsize;
        memcpy(f->value_descr, z->x.narrow->descr, sizeof f->value_descr);
    }
    if (z->x.nframes > 1 && z->x.row_bytes > 0) {
        uint64_t first;
        npyl_zst_frame_rows(&z->x, 1, &first, &f->samples_per_frame);
    }
}

int npyl_zst_file_over(npyl_zst_index *x, const char *name, npyl_zst_read_fn rd, void *ctx,
                       void (*free_ctx)(void *), npyload_zst_file **out)
{
    *out = NULL;
    npyload_zst_file *z = calloc(1, sizeof *z);
    char *nm = strdup(name);
    if (!z || !nm) {
        free(z);
        free(nm);
        if (free_ctx)
            free_ctx(ctx);
        return -ENOMEM;
    }
    z->x = *x;
    memset(x, 0, sizeof *x);
    z->name = nm;
    z->rd = rd;
    z->rd_ctx = ctx;
    z->rd_free = free_ctx;
    fill_facts(z);
    *out = z;
    return 0;
}

int npyl_zst_store_facts(npyl_zst_read_fn rd, void *ctx, const char *name,
                         const npyload_header *h, uint32_t *values, uint32_t *value_itemsize,
                         char *value_descr, char *err, size_t errlen)
{
    uint64_t end = h->data_offset + h->data_bytes;
    if (strcmp(h->descr, "|u1") != 0 || h->file_bytes <= end)
        return 0;
    npyl_zst_narrow *nx = NULL;
    int rc = npyl_zst_store_probe(rd, ctx, name, h->file_bytes, end, &nx, err, errlen);
    if (rc || !nx)
        return rc;
    if (values)
        *values = nx->count;
    if (value_itemsize)
        *value_itemsize = nx->itemsize;
    if (value_descr)
        memcpy(value_descr, nx->descr, NPYLOAD_DESCR_LEN);
    free(nx);
    return 1;
}

int npyload_narrow_stored(const char *path, const npyload_header *h, uint32_t *values,
                          uint32_t *value_itemsize, char *value_descr, char *err, size_t errlen)
{
    if (!path || !h)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyload_narrow_stored: NULL %s",
                         path ? "header" : "path");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return npyl_fail(err, errlen, -e, "%s: cannot open: %s", path, strerror(e));
    }
    int rc = npyl_zst_store_facts(npyl_zst_read_fd, &fd, path, h, values, value_itemsize,
                                  value_descr, err, errlen);
    close(fd);
    return rc;
}

int npyload_zst_probe(const char *path)
{
    if (!path)
        return NPYLOAD_EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    unsigned char m[4];
    ssize_t n;
    do
        n = pread(fd, m, sizeof m, 0);
    while (n < 0 && errno == EINTR);
    int e = n < 0 ? -errno : 0;
    close(fd);
    if (e)
        return e;
    return n == (ssize_t)sizeof m && npyl_zst_is_zstd(m);
}

int npyload_zst_file_open(const char *path, npyload_zst_file **out, char *err,
                          size_t errlen)
{
    if (!out || !path)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "npyload_zst_file_open: NULL %s", path ? "out" : "path");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return npyl_fail(err, errlen, -e, "%s: cannot open: %s", path,
                         strerror(e));
    }
    npyload_zst_file *z = calloc(1, sizeof *z);
    char *name = strdup(path);
    struct stat st;
    if (!z || !name) {
        close(fd);
        free(z);
        free(name);
        return npyl_fail(err, errlen, -ENOMEM, "%s: out of memory",
                         path);
    }
    int rc = npyl_zst_index_open(fd, path, &z->x, err, errlen);
    if (rc == 0 && fstat(fd, &st) != 0)
        rc = npyl_fail(err, errlen, -errno, "%s: cannot stat: %s", path, strerror(errno));
    close(fd);
    if (rc != 0) {
        npyl_zst_index_free(&z->x);
        free(z);
        free(name);
        return rc;
    }
    z->name = name;
    z->dev = st.st_dev;
    z->ino = st.st_ino;
    z->mtime = st.st_mtim;
    fill_facts(z);
    *out = z;
    return 0;
}

void npyload_zst_file_close(npyload_zst_file *z)
{
    if (!z)
        return;
    npyl_zst_index_free(&z->x);
    if (z->rd_free)
        z->rd_free(z->rd_ctx);
    free(z->name);
    free(z);
}

const npyload_zst_facts *npyload_zst_file_facts(const npyload_zst_file *z)
{
    return z ? &z->facts : NULL;
}

int npyload_zst_file_frame(const npyload_zst_file *z, uint32_t f,
                           uint64_t *offset, uint64_t *csize, uint64_t *dsize)
{
    if (!z || f >= z->x.nframes || !offset || !csize || !dsize)
        return NPYLOAD_EINVAL;
    *offset = z->x.coff[f];
    *csize = z->x.coff[f + 1] - z->x.coff[f];
    *dsize = z->x.doff[f + 1] - z->x.doff[f];
    return 0;
}

int npyload_zst_file_decode(const npyload_zst_file *z, uint32_t f, void *dctx,
                            const void *src, void *dst, size_t cap, char *err,
                            size_t errlen)
{
    if (!z)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyload_zst_file_decode: NULL file");
    if (f >= z->x.nframes)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: frame %u: no such frame (the file has %u)", z->name,
                         (unsigned)f, (unsigned)z->x.nframes);
    ZSTD_DCtx *own = NULL;
    if (!dctx) {
        dctx = own = ZSTD_createDCtx();
        if (!own)
            return npyl_fail(err, errlen, -ENOMEM, "%s: out of memory", z->name);
    }
    int rc = npyl_zst_decode_frame(&z->x, f, (ZSTD_DCtx *)dctx, src, dst, cap, z->name,
                                   err, errlen);
    ZSTD_freeDCtx(own);
    return rc;
}

int npyload_zst_file_verify(const npyload_zst_file *z, uint32_t *bad_frame, char *err,
                            size_t errlen)
{
    uint32_t bad = UINT32_MAX;
    if (bad_frame)
        *bad_frame = bad;
    if (!z)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "npyload_zst_file_verify: NULL file");
    if (z->rd) {
        int rc = npyl_zst_verify(z->rd, z->rd_ctx, &z->x, z->name, &bad, err, errlen);
        if (bad_frame)
            *bad_frame = bad;
        return rc;
    }
    int fd = open(z->name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return npyl_fail(err, errlen, -e, "%s: cannot open: %s", z->name, strerror(e));
    }
    /* The frames must be the ones the index describes. */
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = npyl_fail(err, errlen, -errno, "%s: cannot stat: %s", z->name, strerror(errno));
    else if (st.st_dev != z->dev || st.st_ino != z->ino ||
             (uint64_t)st.st_size != z->x.file_size ||
             st.st_mtim.tv_sec != z->mtime.tv_sec || st.st_mtim.tv_nsec != z->mtime.tv_nsec)
        rc = npyl_fail(err, errlen, NPYLOAD_ECHANGED,
                       "%s: changed since it was opened (size %" PRIu64 ", now %lld): "
                       "open it again", z->name, z->x.file_size, (long long)st.st_size);
    if (rc == 0)
        rc = npyl_zst_verify(npyl_zst_read_fd, &fd, &z->x, z->name, &bad, err, errlen);
    close(fd);
    if (bad_frame)
        *bad_frame = bad;
    return rc;
}
