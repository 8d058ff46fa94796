/* A validated .npy.zst for npyload's own tools: the facts npyload-inspect
 * prints and the frames npyload-bench decodes for its decode ceiling, through
 * the same seek-table parser and frame decoder as the loader. Not part of
 * libnpyload: built into the npyload_bench_support static library
 * (lib/CMakeLists.txt); declared in include/npyload_bench_support.h, an
 * unstable, uninstalled header. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "npyload_bench_support.h"
#include "npyload_zst.h"

struct npyload_zst_file {
    npyl_zst_index x;
    npyload_zst_facts facts;
    char *name;
};

int npyload_zst_probe(const char *path)
{
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
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return npyl_fail(err, errlen, -e, "%s: cannot open: %s", path,
                         strerror(e));
    }
    npyload_zst_file *z = calloc(1, sizeof *z);
    char *name = strdup(path);
    if (!z || !name) {
        close(fd);
        free(z);
        free(name);
        return npyl_fail(err, errlen, -ENOMEM, "%s: out of memory",
                         path);
    }
    int rc = npyl_zst_index_open(fd, path, &z->x, err, errlen);
    close(fd);
    if (rc != 0) {
        free(z);
        free(name);
        return rc;
    }
    z->name = name;
    npyload_zst_facts *f = &z->facts;
    f->hdr = z->x.hdr;
    f->compressed_bytes = z->x.file_size;
    f->table_bytes = z->x.table_bytes;
    f->frames = z->x.nframes;
    f->checksums = z->x.checksums;
    f->max_frame_bytes = z->x.max_dsize;
    f->max_frame_compressed = z->x.max_csize;
    if (z->x.nframes > 1 && z->x.row_bytes > 0) {
        uint64_t first;
        npyl_zst_frame_rows(&z->x, 1, &first, &f->samples_per_frame);
    }
    *out = z;
    return 0;
}

void npyload_zst_file_close(npyload_zst_file *z)
{
    if (!z)
        return;
    npyl_zst_index_free(&z->x);
    free(z->name);
    free(z);
}

const npyload_zst_facts *npyload_zst_file_facts(const npyload_zst_file *z)
{
    return &z->facts;
}

int npyload_zst_file_frame(const npyload_zst_file *z, uint32_t f,
                           uint64_t *offset, uint64_t *csize, uint64_t *dsize)
{
    if (f >= z->x.nframes)
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
    if (f >= z->x.nframes || !dctx)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: frame %u: no such frame", z->name, (unsigned)f);
    return npyl_zst_decode_frame(&z->x, f, (ZSTD_DCtx *)dctx, src, dst, cap,
                                 z->name, err, errlen);
}
