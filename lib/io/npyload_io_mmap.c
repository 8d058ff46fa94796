/* mmap backend: each file is mapped once per context (read-only, MAP_SHARED,
 * MADV_SEQUENTIAL; the mapping lives in the open-file LRU and is unmapped on
 * eviction), each request is advised MADV_WILLNEED and copied.
 *
 * Truncation and I/O errors: touching a page of the mapping past the file's
 * current end, or one the kernel cannot read in, raises SIGBUS. The copy
 * runs under the SIGBUS guard (npyload_io_sigbus.c), which turns that fault
 * into an error naming the file (NPYLOAD_ETRUNCATED, NPYLOAD_ECHANGED or
 * -EIO) instead of the death of the process. A truncation that leaves the
 * requested bytes inside the file's last, partly valid page reads zeros
 * without a fault: the identity check after the call (size, mtime) catches
 * it. */
#include "npyload_io_impl.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

static int copy_one(npyl_io *io, const npyl_io_req *r, const npyl_io_fh *fh,
                    uint64_t *got, char *err, size_t errlen)
{
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t end, at = 0;
    if (npyl_add_u64(r->offset, r->len, &end) || end > fh->map_len)
        /* Beyond the size validated at start (the mapping's length). */
        return npyl_io_fail_eof(io, r, fh, err, errlen);
    uint64_t a = r->offset / page * page;
    (void)madvise((void *)(fh->map + a), (size_t)(end - a), MADV_WILLNEED);
    if (npyl_sigbus_copy(r->dst, fh->map + r->offset, (size_t)r->len, &at))
        return npyl_io_fail_fault(io, r, fh, at, err, errlen);
    *got += r->len;
    return 0;
}

int npyl_io_mmap_read(npyl_io *io, const npyl_io_req *reqs, size_t n,
                      size_t *bad, uint64_t *bytes_read, char *err,
                      size_t errlen)
{
    return npyl_io_each(io, reqs, n, bad, bytes_read, err, errlen, copy_one);
}
