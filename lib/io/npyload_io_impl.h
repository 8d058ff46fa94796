/* Private to lib/io. The layers, each using only the ones below it:
 *
 *   npyload_io.c          dispatch: create/read/destroy, the io_uring probe
 *   npyload_io_gather.c   the mapped path: MMAP's reads, and the small
 *                         requests of resident files for the others
 *   npyload_io_pread.c,   the read backends
 *   npyload_io_uring.c
 *   npyload_io_files.c    open-file cache (LRU, identity checks), request
 *                         splitting, the error messages every backend writes
 *   npyload_io_sigbus.c   the SIGBUS guard mapped copies run under
 *
 * The loader includes only npyload_io.h. */
#ifndef NPYLOAD_IO_IMPL_H
#define NPYLOAD_IO_IMPL_H

#include <stdatomic.h>

#include "npyload_io.h"

/* One open file of the per-context LRU. A backend pins an entry while it has
 * a read in flight on its descriptors (npyl_io_fh_get .. npyl_io_fh_put), so
 * eviction never closes a descriptor that the kernel may still be about to
 * resolve (io_uring resolves a plain fd when it issues the SQE). */
typedef struct npyl_io_fh {
    uint32_t file;          /* index in the file table; UINT32_MAX when free */
    int fd;                 /* buffered, O_RDONLY */
    int dfd;                /* O_DIRECT, or -1 when not direct */
    const uint8_t *map;     /* whole file, PROT_READ, MAP_SHARED: mapped at
                               open (MMAP) or at first gather (others), or
                               io->maps' mapping of it (shared) */
    uint64_t map_len;
    int nomap;              /* mapping failed: this file is read, not mapped */
    int shared;             /* map belongs to io->maps: not unmapped here */
    int resident;           /* last residency check: pages in the cache */
    uint64_t resident_call; /* the call that checked it; 0: never */
    unsigned pins;
    uint64_t used;          /* the npyl_io_read call that last used it */
    struct npyl_io_fh *prev, *next; /* LRU list, most recent first */
} npyl_io_fh;

typedef struct npyl_io_uring npyl_io_uring;

/* The shared mappings (npyl_io_maps): map[file] is 0 until a context
 * installs its mapping (compare-and-swap: a context that loses the race
 * unmaps its own and takes the winner's); then fixed until destroy. */
struct npyl_io_maps {
    const npyl_file_info *files; /* the file table it was made for */
    size_t n;
    _Atomic(uintptr_t) *map;  /* n entries; the length is the file's size */
    uint64_t *len;            /* [file]: the mapping's length, written by
                                 the context that installed it, read by
                                 destroy only */
    _Atomic unsigned count;   /* entries set, at most NPYL_IO_SHARED_MAPS */
};

/* A context. It belongs to one thread at a time; nothing in lib/io locks,
 * except that backend_now may be read from any thread (stats) and that the
 * contexts of one reader share its npyl_io_maps (atomics). */
struct npyl_io {
    int backend;              /* as configured */
    _Atomic int backend_now;  /* what reads go through now (URING may fall
                                 back to PREAD, once, for good) */
    int direct;
    int random_access;        /* no kernel read-ahead (npyl_io_config) */
    unsigned queue_depth;
    const npyl_file_info *files;
    size_t nfiles;
    npyl_io_maps *maps;       /* shared mappings, or NULL (npyl_io_config) */

    /* LRU of open files: `cap` entries, `slot_of[file]` is the entry holding
     * `file` or -1. `head` is the most recently used, `tail` the least. */
    npyl_io_fh *fh;
    unsigned cap;
    int32_t *slot_of;
    npyl_io_fh *head, *tail;
    uint64_t call;            /* npyl_io_read calls so far */

    npyl_io_uring *uring;     /* URING backend state, else NULL */
    int sigbus_ref;           /* holds a reference on the SIGBUS handler
                                 (MMAP: from creation; others: from their
                                 first gather) */

    /* The gather path (npyload_io_gather.c). */
    uint64_t gather_max;      /* largest request gathered; 0: never */
    struct npyl_gather_seg *segs; /* a call's copies and their request; */
    size_t *seg_req;              /* the requests left to the read */
    npyl_io_req *rest;            /* backend, with their index */
    size_t *rest_idx;
    size_t scratch_cap;       /* entries of each of those four arrays */
    npyl_io_fh **gpin;        /* the files the copies collected so far hold
                                 a pin on, one each (cap entries) */
    size_t ngpin;
    unsigned char *mcvec;     /* mincore vector, NPYL_MINCORE_PAGES bytes */
    _Atomic uint64_t st_gather_bytes, st_gather_reqs;
    _Atomic uint64_t st_read_bytes, st_read_reqs;
};

/* ---- npyload_io_files.c: open-file cache ------------------------------- */

/* Allocates the LRU (cfg->max_open entries, at most one per file) and
 * records the file table. Returns 0 or -ENOMEM. npyl_io_files_fini closes
 * every entry and frees it (safe on a partly initialised context). */
NPYL_HIDDEN int npyl_io_files_init(npyl_io *io, const npyl_io_config *cfg);
NPYL_HIDDEN void npyl_io_files_fini(npyl_io *io);

/* Returned by npyl_io_fh_get (positive, never an error) when the cache is
 * full and every entry is pinned: complete a read in flight, then retry. */
#define NPYL_IO_BUSY 2

/* Looks up (or opens, evicting the least recently used unpinned entry) file
 * `file`, pins it and marks it used by the current call. Opening refuses
 * non-regular files without blocking on them, checks identity against the
 * file table (NPYLOAD_ECHANGED) and, for the MMAP backend, maps the file.
 * Evicting an entry used earlier in the same call checks its identity first
 * (its reads are done; the check after the call would miss it).
 * Returns 0, NPYL_IO_BUSY, or an error with "PATH: ..." in err. */
NPYL_HIDDEN int npyl_io_fh_get(npyl_io *io, uint32_t file, npyl_io_fh **out,
                               char *err, size_t errlen);
NPYL_HIDDEN void npyl_io_fh_put(npyl_io *io, npyl_io_fh *fh);

/* After a call's reads completed: one fstat per distinct file the call used
 * (they sit at the head of the LRU), failing with NPYLOAD_ECHANGED when a
 * file's size, mtime, inode or device differs from the table. Catches
 * in-place rewrites of files whose descriptor stays open, including writes
 * that raced the reads (a write updates mtime before it copies data). On
 * failure *bad is the first request of the changed file. */
NPYL_HIDDEN int npyl_io_files_verify(npyl_io *io, const npyl_io_req *reqs,
                                     size_t n, size_t *bad, char *err,
                                     size_t errlen);

/* ---- npyload_io_files.c: request splitting ------------------------------ */

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

/* ---- npyload_io_files.c: messages --------------------------------------- */

/* "PATH: read of N bytes at offset X failed: <description of code>". */
NPYL_HIDDEN int npyl_io_fail_read(const npyl_io *io, const npyl_io_req *r,
                                  int code, char *err, size_t errlen);
/* "PATH: file ends at byte Y[ (Z at start)], N bytes expected at offset X",
 * NPYLOAD_ETRUNCATED; Y is the file's size now (fstat of fh's descriptor),
 * Z the size recorded at start when it differs. */
NPYL_HIDDEN int npyl_io_fail_eof(const npyl_io *io, const npyl_io_req *r,
                                 const npyl_io_fh *fh, char *err,
                                 size_t errlen);
/* A fault (SIGBUS) while copying request r from fh's mapping, `at` bytes
 * into it: NPYLOAD_ETRUNCATED when the file is now shorter than the request,
 * NPYLOAD_ECHANGED when it changed otherwise, else -EIO. */
NPYL_HIDDEN int npyl_io_fail_fault(const npyl_io *io, const npyl_io_req *r,
                                   const npyl_io_fh *fh, uint64_t at,
                                   char *err, size_t errlen);

/* ---- npyload_io_sigbus.c: the SIGBUS guard ----------------------------- */

/* Holds / drops a reference on the process's SIGBUS handler: the first
 * reference installs it (saving the previous action), the last restores the
 * previous action. Refcounted under a mutex: the only process-wide state of
 * the library. Returns 0 or -errno with a message. */
NPYL_HIDDEN int npyl_sigbus_acquire(char *err, size_t errlen);
NPYL_HIDDEN void npyl_sigbus_release(void);

/* A gather: copies of segs[i].len bytes from src to dst. */
typedef struct npyl_gather_seg {
    void *dst;
    const void *src;
    size_t len;
} npyl_gather_seg;

/* Copies segs[i].len bytes from src to dst for each of the n segments,
 * surviving a SIGBUS raised by reading a src (a mapped file truncated
 * under us, or an I/O error behind the mapping): one recovery point for
 * all n copies (no per-segment setjmp). Needs a reference
 * (npyl_sigbus_acquire). Returns 0, or -EFAULT with *which the segment
 * that faulted and *at the offset in its src of the faulting address; the
 * segments before it are done, its dst holds an unspecified prefix. */
NPYL_HIDDEN int npyl_sigbus_gather(const npyl_gather_seg *segs, size_t n,
                                   size_t *which, uint64_t *at);

/* ---- the backends: each read function has npyl_io_read's contract ------ */

NPYL_HIDDEN int npyl_io_pread_read(npyl_io *io, const npyl_io_req *reqs,
                                   size_t n, size_t *bad, uint64_t *bytes_read,
                                   char *err, size_t errlen);
/* The gather path, npyload_io_gather.c. Copies from the files' mappings the
 * requests it takes (MMAP: all of them; others: those of at most gather_max
 * bytes whose file is resident) and leaves the rest in io->rest (copies,
 * io->rest_idx[k] their index in reqs), *nrest of them, for the read
 * backend; *nrest == n means it took none (io->rest is then not written:
 * read reqs itself). Errors as npyl_io_read's, *bad indexing reqs. */
NPYL_HIDDEN int npyl_io_gather_read(npyl_io *io, const npyl_io_req *reqs,
                                    size_t n, size_t *bad,
                                    uint64_t *bytes_read, size_t *nrest,
                                    char *err, size_t errlen);
/* Frees the gather scratch of a context (the mappings live in the LRU). */
NPYL_HIDDEN void npyl_io_gather_fini(npyl_io *io);
/* Maps fh's file if it is not yet (MMAP does so at open). Returns 0 or
 * -errno with a message. */
NPYL_HIDDEN int npyl_io_fh_map(npyl_io *io, npyl_io_fh *fh, char *err,
                               size_t errlen);
NPYL_HIDDEN int npyl_io_uring_create(npyl_io_uring **out, unsigned queue_depth,
                                     char *err, size_t errlen);
NPYL_HIDDEN void npyl_io_uring_destroy(npyl_io_uring *u);
NPYL_HIDDEN int npyl_io_uring_read(npyl_io *io, npyl_io_uring *u,
                                   const npyl_io_req *reqs, size_t n,
                                   size_t *bad, uint64_t *bytes_read,
                                   char *err, size_t errlen);
/* -errno when the ring itself failed (io_uring_enter refused), else 0. */
NPYL_HIDDEN int npyl_io_uring_broken(const npyl_io_uring *u);

#endif
