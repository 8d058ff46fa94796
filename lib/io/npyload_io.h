/* Read backends behind one interface: io_uring, pread, mmap. Depends on
 * lib/common only. One npyl_io context per worker thread; contexts share
 * nothing, so no locking happens on the read path.
 *
 * A context reads a list of requests, each a run of bytes of one file that
 * lands directly at its destination, and returns when all are complete or
 * one failed. Files are identified by index into the table given at
 * creation; the context opens them lazily (and keeps a small LRU of open
 * descriptors / mappings, so 10,000+ files never exhaust RLIMIT_NOFILE). It
 * checks that each file is still the one validated at start (same device,
 * inode, size and mtime with nanoseconds) when it opens it and again, with
 * one fstat per distinct file, after each npyl_io_read call's reads, failing
 * with NPYLOAD_ECHANGED otherwise: a file rewritten in place while its
 * descriptor stays open is an error, never bytes delivered as success.
 */
#ifndef NPYLOAD_IO_H
#define NPYLOAD_IO_H

#include <stddef.h>
#include <stdint.h>

#include "../common/npyload_common.h"

typedef struct npyl_file_info {
    const char *path;
    uint64_t size;       /* st_size at start */
    uint64_t dev, ino;   /* identity at start */
    int64_t mtime_ns;
} npyl_file_info;

/* A request (lib/common's npyl_req): file indexes the context's table. */
typedef npyl_req npyl_io_req;

/* A table of mappings shared by the contexts of one reader (one per
 * loader's local store): each file is mapped once, by the first context
 * that maps it, and every other context copies from that mapping instead
 * of mapping the file itself. A mapping's first touch of a cached page
 * costs a minor fault per mapping (the kernel maps up to 16 cached pages
 * around it), so private mappings made every worker (and every read-ahead
 * context) fault in every file it reads on its own: measured on the 2-core
 * VM, CIFAR-like rows (6 files of 293 MiB, issue 37 item 5), 2 workers,
 * 27k faults each, most of a 2 s run's kernel time. Shared, the faults are
 * taken once. The mappings stay until npyl_io_maps_destroy, so at most
 * NPYL_IO_SHARED_MAPS files are shared (each mapping is one of the
 * process's vm.max_map_count areas); files beyond map privately, per
 * context, as without a table. */
typedef struct npyl_io_maps npyl_io_maps;

#ifndef NPYL_IO_SHARED_MAPS
#define NPYL_IO_SHARED_MAPS 4096u
#endif

/* Creates an empty table for the file table `files` (nfiles entries):
 * only contexts configured with this same `files` share it (a file is
 * known by its index in that table). Returns 0 or -ENOMEM. */
NPYL_HIDDEN int npyl_io_maps_create(npyl_io_maps **out, const npyl_file_info *files,
                                    size_t nfiles);

/* Unmaps every shared mapping; frees the table. Only once no context that
 * uses it exists any more. NULL-safe. */
NPYL_HIDDEN void npyl_io_maps_destroy(npyl_io_maps *m);

typedef struct npyl_io_config {
    int backend;               /* NPYLOAD_IO_URING, _PREAD or _MMAP (not AUTO) */
    int direct;                /* O_DIRECT (URING and PREAD only) */
    unsigned queue_depth;      /* reads in flight (URING); >= 1 */
    unsigned max_open;         /* LRU capacity of open files; >= 1 */
    const npyl_file_info *files;
    size_t nfiles;
    /* The gather path (URING and PREAD, not direct): requests of at most
     * this many bytes, of files whose pages are in the page cache, are
     * copied from a mapping of the file instead of read. 0: the default
     * (NPYL_GATHER_MAX_DEFAULT), < 0: never, > 0: this size. The MMAP
     * backend copies every request from its mapping whatever this says. */
    int64_t gather_max;
    /* The reads come in no particular order (a shuffled epoch): the
     * kernel's read-ahead is turned off for the buffered descriptors and
     * mappings (POSIX_FADV_RANDOM, MADV_RANDOM). Without it, each cold read
     * of a sample also pulls up to read_ahead_kb of the next one off the
     * disk: measured 0.74 of a 200 MB/s disk for the captcha layout
     * shuffled, against 0.99 with it (or O_DIRECT). */
    int random_access;
    /* Mappings shared with the reader's other contexts (NULL: this
     * context maps its files privately). Used when made for this `files`
     * table (else ignored: private mappings); it must outlive the context;
     * contexts on one table may run in different threads. */
    npyl_io_maps *maps;
} npyl_io_config;

/* The default gather threshold: see npyload_io_gather.c for the measurement. */
#ifndef NPYL_GATHER_MAX_DEFAULT
#define NPYL_GATHER_MAX_DEFAULT (32u * 1024u)
#endif

/* What a context's reads went through, since creation. */
typedef struct npyl_io_counters {
    uint64_t gather_bytes;  /* copied from a mapping (gather path, MMAP) */
    uint64_t gather_reqs;
    uint64_t read_bytes;    /* read with io_uring or pread */
    uint64_t read_reqs;
    uint64_t cpu_ns;        /* CPU time of read-ahead threads, and */
    uint64_t blocked_ns;    /* their off-CPU time in reads (filled by the
                               loader's read context, not by npyl_io) */
} npyl_io_counters;

typedef struct npyl_io npyl_io;

/* O_DIRECT alignment used for offsets, lengths and memory addresses. */
#define NPYL_DIRECT_ALIGN 4096u

/* Creates a per-worker context. Returns 0, NPYLOAD_ENOURING (io_uring refused:
 * the message says what the kernel answered), -ENOMEM or NPYLOAD_EINVAL. */
NPYL_HIDDEN int npyl_io_create(npyl_io **out, const npyl_io_config *cfg,
                               char *err, size_t errlen);

/* Performs all n requests; blocks until every one is complete. Short reads
 * are continued; a read that hits end-of-file early fails with
 * NPYLOAD_ETRUNCATED. On failure returns the code (-errno, NPYLOAD_ETRUNCATED,
 * NPYLOAD_ECHANGED: see above), stores the failing request's index in *bad
 * and writes "PATH: what happened at offset X (N bytes)" to err. The mmap
 * backend turns a SIGBUS from its mapping (truncation, EIO) into such an
 * error too. With direct I/O the
 * part of each request that is 4096-aligned in both file offset and memory is
 * read with O_DIRECT straight into dst; the unaligned head and tail (< 4 KiB
 * each) go through the page cache. *bytes_read (if not NULL) accumulates the
 * bytes that landed. */
NPYL_HIDDEN int npyl_io_read(npyl_io *io, const npyl_io_req *reqs, size_t n,
                             size_t *bad, uint64_t *bytes_read, char *err,
                             size_t errlen);

/* The backend reads go through now: the configured one, except that an
 * io_uring context whose io_uring_enter is refused at run time (EPERM,
 * EACCES, ENOSYS: a seccomp profile that allows io_uring_setup) falls back
 * to pread for good, redoing the refused call with pread. May be called from
 * any thread while another reads. */
NPYL_HIDDEN int npyl_io_backend_now(const npyl_io *io);

/* Adds the context's counters to *c. May be called from any thread while
 * another reads (relaxed atomics: each counter is exact, the four together
 * are not a snapshot). */
NPYL_HIDDEN void npyl_io_counters_add(const npyl_io *io, npyl_io_counters *c);

/* Closes every descriptor and mapping; frees the context. NULL-safe. */
NPYL_HIDDEN void npyl_io_destroy(npyl_io *io);

/* Probes whether io_uring works here: a tiny ring and one no-op submitted
 * and waited for, then torn down. Returns 1 if usable, 0 if not (and writes
 * which call failed and why), never fails otherwise. */
NPYL_HIDDEN int npyl_io_uring_usable(char *why, size_t whylen);

/* 1 when this build has the io_uring backend (liburing found at build
 * time), else 0. `version` (may be NULL) gets the liburing version built
 * against ("2.3"), "" without it. */
NPYL_HIDDEN int npyl_io_uring_built(char *version, size_t len);

/* Fills info for `path` from stat(2); returns 0 or -errno. */
NPYL_HIDDEN int npyl_io_stat(const char *path, npyl_file_info *info);
/* The same from an open descriptor of `path` (fstat(2)). */
NPYL_HIDDEN int npyl_io_fstat(int fd, const char *path, npyl_file_info *info);

#endif
