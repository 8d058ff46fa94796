/* mmap backend: each file is mapped once per context (read-only, MAP_SHARED,
 * MADV_SEQUENTIAL; the mapping lives in the open-file LRU and is unmapped on
 * eviction), each request is advised MADV_WILLNEED and copied with memcpy.
 *
 * Truncation: touching a page of the mapping past the file's current end
 * raises SIGBUS. The library installs no signal handlers (no global state),
 * so before each copy it checks with fstat that the file still holds the
 * range and fails with NPYLOAD_ETRUNCATED otherwise. A truncation that lands
 * between that fstat and the end of the memcpy still raises SIGBUS: that
 * window is small (one request's copy), and the open-time identity check
 * keeps replaced files (the usual way datasets are rewritten: write a new
 * file, rename over) from ever being mapped. Use the pread or io_uring
 * backend when files may be truncated in place while a loader runs. */
#include "npyload_io_impl.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int copy_one(npyl_io *io, const npyl_io_req *r, const npyl_io_fh *fh,
                    uint64_t *got, char *err, size_t errlen)
{
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t end;
    struct stat st;
    if (npyl_add_u64(r->offset, r->len, &end) || end > fh->map_len)
        /* Beyond the size validated at start (the mapping's length). */
        return npyl_io_fail_eof(io, r, fh->map_len, err, errlen);
    if (fstat(fh->fd, &st) != 0)
        return npyl_io_fail_read(io, r, -errno, err, errlen);
    if ((uint64_t)st.st_size < end)
        return npyl_io_fail_eof(io, r, (uint64_t)st.st_size, err, errlen);
    uint64_t a = r->offset / page * page;
    (void)madvise((void *)(fh->map + a), (size_t)(end - a), MADV_WILLNEED);
    memcpy(r->dst, fh->map + r->offset, (size_t)r->len);
    *got += r->len;
    return 0;
}

int npyl_io_mmap_read(npyl_io *io, const npyl_io_req *reqs, size_t n,
                      size_t *bad, uint64_t *bytes_read, char *err,
                      size_t errlen)
{
    return npyl_io_each(io, reqs, n, bad, bytes_read, err, errlen, copy_one);
}
