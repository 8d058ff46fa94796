/* Private to lib/io: what npyload_io.c (the shared part: open-file cache,
 * direct-I/O split, messages) hands the backends. The loader includes only
 * npyload_io.h. */
#ifndef NPYLOAD_IO_IMPL_H
#define NPYLOAD_IO_IMPL_H

#include "npyload_io.h"

/* ------------------------------------------------------------------------ */
/* Inside lib/io only: what npyload_io.c (open-file cache, request splitting, */
/* messages) offers the backends. The loader uses nothing below this line.   */
/* ------------------------------------------------------------------------ */

/* One open file of the per-context LRU. A backend pins an entry while it has
 * a read in flight on its descriptors (npyl_io_fh_get .. npyl_io_fh_put), so
 * eviction never closes a descriptor that the kernel may still be about to
 * resolve (io_uring resolves a plain fd when it issues the SQE). */
typedef struct npyl_io_fh {
    uint32_t file;          /* index in the file table; UINT32_MAX when free */
    int fd;                 /* buffered, O_RDONLY */
    int dfd;                /* O_DIRECT, or -1 when not direct */
    const uint8_t *map;     /* MMAP backend: whole file, PROT_READ, MAP_SHARED */
    uint64_t map_len;
    unsigned pins;
    struct npyl_io_fh *prev, *next; /* LRU list, most recent first */
} npyl_io_fh;

/* Returned by npyl_io_fh_get (positive, never an error) when the cache is
 * full and every entry is pinned: complete a read in flight, then retry. */
#define NPYL_IO_BUSY 2

/* Looks up (or opens, evicting the least recently used unpinned entry) file
 * `file` and pins it. Opening checks identity against the file table
 * (NPYLOAD_ECHANGED) and, for the MMAP backend, maps the file.
 * Returns 0, NPYL_IO_BUSY, or an error with "PATH: ..." in err. */
NPYL_HIDDEN int npyl_io_fh_get(npyl_io *io, uint32_t file, npyl_io_fh **out,
                               char *err, size_t errlen);
NPYL_HIDDEN void npyl_io_fh_put(npyl_io *io, npyl_io_fh *fh);

/* A piece of a request read through one descriptor. */
typedef struct npyl_io_seg {
    int direct;             /* 1: through fh->dfd, all three aligned */
    uint64_t offset, len;
    uint8_t *dst;
} npyl_io_seg;

/* Splits a request into at most 3 segments (buffered head, direct middle,
 * buffered tail) when the context is direct and offset and dst are congruent
 * modulo NPYL_DIRECT_ALIGN; otherwise one buffered segment. Returns the count. */
NPYL_HIDDEN unsigned npyl_io_split(const npyl_io *io, const npyl_io_req *r,
                                   npyl_io_seg seg[3]);

NPYL_HIDDEN const npyl_file_info *npyl_io_info(const npyl_io *io, uint32_t file);

/* Messages: "PATH: read of N bytes at offset X failed: <strerror(-code)>" and
 * "PATH: file ends at byte Y, N bytes expected at offset X" (returns
 * NPYLOAD_ETRUNCATED). Both return their code. */
NPYL_HIDDEN int npyl_io_fail_read(const npyl_io *io, const npyl_io_req *r,
                                  int code, char *err, size_t errlen);
NPYL_HIDDEN int npyl_io_fail_eof(const npyl_io *io, const npyl_io_req *r,
                                 uint64_t file_end, char *err, size_t errlen);

/* Backends. Each read function has npyl_io_read's contract. */
NPYL_HIDDEN int npyl_io_pread_read(npyl_io *io, const npyl_io_req *reqs,
                                   size_t n, size_t *bad, uint64_t *bytes_read,
                                   char *err, size_t errlen);
NPYL_HIDDEN int npyl_io_mmap_read(npyl_io *io, const npyl_io_req *reqs,
                                  size_t n, size_t *bad, uint64_t *bytes_read,
                                  char *err, size_t errlen);
typedef struct npyl_io_uring npyl_io_uring;
NPYL_HIDDEN int npyl_io_uring_create(npyl_io_uring **out, unsigned queue_depth,
                                     char *err, size_t errlen);
NPYL_HIDDEN void npyl_io_uring_destroy(npyl_io_uring *u);
NPYL_HIDDEN int npyl_io_uring_read(npyl_io *io, npyl_io_uring *u,
                                   const npyl_io_req *reqs, size_t n,
                                   size_t *bad, uint64_t *bytes_read,
                                   char *err, size_t errlen);

/* The synchronous backends (pread, mmap) handle one request at a time: this
 * runs `one` on each request in order with its file pinned, stops at the first
 * failure (storing its index in *bad) and adds the bytes that landed to
 * *bytes_read. `one` returns 0 or an error with its message written. */
typedef int (*npyl_io_one_fn)(npyl_io *io, const npyl_io_req *r,
                              const npyl_io_fh *fh, uint64_t *got, char *err,
                              size_t errlen);
NPYL_HIDDEN int npyl_io_each(npyl_io *io, const npyl_io_req *reqs, size_t n,
                             size_t *bad, uint64_t *bytes_read, char *err,
                             size_t errlen, npyl_io_one_fn one);

#endif
