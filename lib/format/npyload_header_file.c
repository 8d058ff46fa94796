/* NPY headers and files: npyload_read_header (reads only the header bytes
 * of a file, then the parser of npyload_header_parse.c) and
 * npyload_format_header (the writer, numpy's byte layout). */
#include "npyload_format.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* numpy (>= 1.24) leaves room after the dict so the growing axis can be
 * rewritten in place; we reproduce it so our headers match numpy's bytes. */
#define NPYL_GROWTH_AXIS_MAX_DIGITS 21

/* pread until n bytes or end of file; returns the count or -errno. */
static ssize_t pread_full(int fd, void *buf, size_t n, off_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

int npyload_read_header(const char *path, npyload_header *out, char *err,
                        size_t errlen)
{
    if (!path || !out)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: npyload_read_header: NULL argument",
                         path ? path : "<null>");
    /* O_NONBLOCK: open() of a FIFO without a writer (or of some devices)
     * would block forever before the regular-file check below. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return npyl_fail(err, errlen, -e, "%s: cannot open: %s", path,
                         npyload_strerror(-e));
    }
    int rc;
    unsigned char *big = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        rc = npyl_fail(err, errlen, -e, "%s: cannot stat: %s", path, npyload_strerror(-e));
        goto done;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = npyl_fail(err, errlen, -EISDIR, "%s: is a directory", path);
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        /* Sizes of pipes and devices mean nothing; the loader needs
         * random access anyway. */
        rc = npyl_fail(err, errlen, NPYLOAD_EINVAL,
                       "%s: not a regular file (%s)", path,
                       npyl_file_kind(st.st_mode));
        goto done;
    }
    /* A regular file: back to ordinary blocking reads. */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = errno;
        rc = npyl_fail(err, errlen, -e, "%s: fcntl failed: %s", path,
                       npyload_strerror(-e));
        goto done;
    }
    uint64_t size = (uint64_t)st.st_size;
    /* The largest preamble first; the header length it announces says how
     * much more to read. The data is never read. */
    unsigned char pre[12];
    ssize_t got = pread_full(fd, pre, size < sizeof pre ? (size_t)size : sizeof pre, 0);
    if (got < 0) {
        rc = npyl_fail(err, errlen, (int)got, "%s: read failed at offset 0: %s",
                       path, npyload_strerror((int)got));
        goto done;
    }
    rc = npyload_parse_header(pre, (size_t)got, size, path, out, err, errlen);
    if (rc == NPYLOAD_ETRUNCATED && out->header_len &&
        out->data_offset > (uint64_t)got && out->data_offset <= size) {
        /* data_offset <= NPYLOAD_MAX_HEADER_LEN + 12: parse checked it. */
        size_t need = (size_t)out->data_offset;
        big = malloc(need);
        if (!big) {
            rc = npyl_fail(err, errlen, -ENOMEM,
                           "%s: out of memory for a %zu-byte header", path, need);
            goto done;
        }
        got = pread_full(fd, big, need, 0);
        if (got < 0) {
            rc = npyl_fail(err, errlen, (int)got, "%s: read failed at offset 0: %s",
                           path, npyload_strerror((int)got));
            goto done;
        }
        /* A file that shrank meanwhile gives a short read: parse reports it. */
        rc = npyload_parse_header(big, (size_t)got, size, path, out, err, errlen);
    }
done:
    free(big);
    close(fd);
    return rc;
}

int npyload_format_header(void *buf, size_t cap, const char *descr,
                          int fortran_order, int ndim, const int64_t *shape)
{
    if ((!buf && cap) || !descr || ndim < 0 || (ndim > 0 && !shape))
        return NPYLOAD_EINVAL;
    if (ndim > NPYLOAD_MAX_DIMS)
        return NPYLOAD_ETOOBIG;
    npyl_dtype dt;
    const char *why;
    size_t dn = strnlen(descr, NPYLOAD_DESCR_LEN);
    if (dn >= NPYLOAD_DESCR_LEN || npyl_dtype_parse(descr, dn, &dt, &why) != 0)
        return NPYLOAD_EINVAL;
    uint64_t bytes = dt.size;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return NPYLOAD_EINVAL;
        /* the parser refuses what overflows; never write such a header */
        if (shape[d] && (npyl_mul_u64(bytes, (uint64_t)shape[d], &bytes) ||
                         bytes > (uint64_t)INT64_MAX))
            return NPYLOAD_ETOOBIG;
    }

    /* numpy's _write_array_header: keys sorted, repr of each value, a
     * trailing ", " before '}', then room for the growing axis. */
    char sb[NPYLOAD_MAX_DIMS * 24 + 8];
    if (npyl_shape_repr(sb, sizeof sb, ndim, shape) < 0)
        return NPYLOAD_EINVAL;
    char dict[sizeof sb + 128];
    int w = snprintf(dict, sizeof dict,
                     "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }",
                     dt.str, fortran_order ? "True" : "False", sb);
    if (w < 0 || (size_t)w >= sizeof dict)
        return NPYLOAD_EINVAL;
    size_t dlen = (size_t)w;
    size_t growth = 0;
    if (ndim > 0) {
        char digits[24];
        int nd = snprintf(digits, sizeof digits, "%" PRId64,
                          shape[fortran_order ? ndim - 1 : 0]);
        if (nd > 0 && nd < NPYL_GROWTH_AXIS_MAX_DIGITS)
            growth = (size_t)(NPYL_GROWTH_AXIS_MAX_DIGITS - nd);
    }
    /* _wrap_header: pad with spaces so preamble + text + '\n' is a multiple
     * of 64; numpy adds a full 64 when already aligned, and so do we. */
    size_t pre = 10;
    size_t text = dlen + growth + 1;
    size_t pad = NPYL_ALIGN - (pre + text) % NPYL_ALIGN;
    if (text + pad > 0xffff) {
        pre = 12;
        pad = NPYL_ALIGN - (pre + text) % NPYL_ALIGN;
    }
    size_t total = pre + text + pad;
    if (total > cap)
        return NPYLOAD_ETOOBIG;
    unsigned char *o = buf;
    size_t hl = text + pad;
    memcpy(o, NPYL_MAGIC, NPYL_MAGIC_LEN);
    o[6] = pre == 10 ? 1 : 2;
    o[7] = 0;
    o[8] = (unsigned char)(hl & 0xff);
    o[9] = (unsigned char)(hl >> 8 & 0xff);
    if (pre == 12) {
        o[10] = (unsigned char)(hl >> 16 & 0xff);
        o[11] = (unsigned char)(hl >> 24 & 0xff);
    }
    memcpy(o + pre, dict, dlen);
    memset(o + pre + dlen, ' ', growth + pad);
    o[total - 1] = '\n';
    return (int)total;
}
