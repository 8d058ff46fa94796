/* pread backend: one synchronous read at a time, on the calling thread.
 * Portable, no setup, and as fast as anything on page-cached data when each
 * request is large; the io_uring backend wins when the disk needs depth. */
#include "npyload_io_impl.h"

#include <errno.h>
#include <unistd.h>

/* Reads one segment completely. Returns 0, -errno, or NPYLOAD_ETRUNCATED when
 * the file ended first. */
static int read_seg(const npyl_io_fh *fh, const npyl_io_seg *s, uint64_t *got)
{
    const uint64_t A = NPYL_DIRECT_ALIGN;
    uint64_t off = s->offset, left = s->len;
    uint8_t *dst = s->dst;
    int direct = s->direct;
    while (left > 0) {
        /* After a short O_DIRECT read the rest may no longer be aligned: it
         * then goes through the page cache (offset and dst stay congruent). */
        if (direct && (off % A || (uintptr_t)dst % A || left % A))
            direct = 0;
        size_t want = left > (1u << 30) ? (1u << 30) : (size_t)left;
        ssize_t r = pread(direct ? fh->dfd : fh->fd, dst, want, (off_t)off);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -errno;
        }
        if (r == 0)
            return NPYLOAD_ETRUNCATED;
        off += (uint64_t)r;
        dst += r;
        left -= (uint64_t)r;
        *got += (uint64_t)r;
    }
    return 0;
}

static int read_one(npyl_io *io, const npyl_io_req *r, const npyl_io_fh *fh,
                    uint64_t *got, char *err, size_t errlen)
{
    npyl_io_seg seg[3];
    unsigned k = npyl_io_split(io, r, seg);
    int rc = 0;
    for (unsigned j = 0; j < k && rc == 0; j++)
        rc = read_seg(fh, &seg[j], got);
    if (rc == NPYLOAD_ETRUNCATED) /* says the file's size now, not where */
        return npyl_io_fail_eof(io, r, fh, err, errlen);
    return rc ? npyl_io_fail_read(io, r, rc, err, errlen) : 0;
}

int npyl_io_pread_read(npyl_io *io, const npyl_io_req *reqs, size_t n,
                       size_t *bad, uint64_t *bytes_read, char *err,
                       size_t errlen)
{
    return npyl_io_each(io, reqs, n, bad, bytes_read, err, errlen, read_one);
}
