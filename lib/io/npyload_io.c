/* The top of lib/io: context lifecycle, dispatch to a backend, the run-time
 * fallback from io_uring to pread, and the io_uring probe. The open-file
 * cache, request splitting and messages live below the backends, in
 * npyload_io_files.c.
 *
 * A context belongs to one thread at a time; nothing here locks. */
#include "npyload_io_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef NPYLOAD_HAVE_URING
#include <liburing.h>
#endif

/* ---- probe -------------------------------------------------------------- */

#ifdef NPYLOAD_HAVE_URING
/* A ring and one real no-op submission: seccomp profiles exist that allow
 * io_uring_setup and refuse io_uring_enter. Returns 0 or -errno, *stage
 * naming the call that failed. */
static int probe_nop(const char **stage)
{
    struct io_uring ring;
    *stage = "io_uring_setup";
    int rc = io_uring_queue_init(2, &ring, 0);
    if (rc < 0)
        return rc;
    *stage = "io_uring_enter (a no-op submission)";
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    io_uring_prep_nop(sqe);
    rc = io_uring_submit_and_wait(&ring, 1);
    if (rc >= 0) {
        struct io_uring_cqe *cqe;
        rc = io_uring_peek_cqe(&ring, &cqe);
        if (rc == 0) {
            rc = cqe->res < 0 ? cqe->res : 0;
            io_uring_cqe_seen(&ring, cqe);
        }
    }
    io_uring_queue_exit(&ring);
    return rc;
}
#endif

int npyl_io_uring_usable(char *why, size_t whylen)
{
#ifdef NPYLOAD_HAVE_URING
    const char *stage = "";
    int rc = probe_nop(&stage);
    if (rc == 0)
        return 1;
    const char *hint = "";
    if (rc == -ENOSYS)
        hint = " (kernel built without io_uring, or a seccomp profile "
               "hides it)";
    else if (rc == -EPERM || rc == -EACCES) {
        int disabled = 0;
        FILE *f = fopen("/proc/sys/kernel/io_uring_disabled", "re");
        if (f) {
            if (fscanf(f, "%d", &disabled) != 1)
                disabled = 0;
            fclose(f);
        }
        hint = disabled ? " (sysctl kernel.io_uring_disabled is set)"
                        : " (refused by a seccomp profile, container "
                          "runtime or LSM)";
    } else if (rc == -ENOMEM)
        hint = " (RLIMIT_MEMLOCK too low for the ring on this kernel)";
    npyl_fail(why, whylen, 0, "%s failed: %s%s", stage, npyload_strerror(rc),
              hint);
    return 0;
#else
    npyl_fail(why, whylen, 0, "built without liburing");
    return 0;
#endif
}

int npyl_io_uring_built(char *version, size_t len)
{
#ifdef NPYLOAD_HAVE_URING
#ifndef NPYLOAD_LIBURING_VERSION
#define NPYLOAD_LIBURING_VERSION "unknown"
#endif
    if (version && len)
        snprintf(version, len, "%s", NPYLOAD_LIBURING_VERSION);
    return 1;
#else
    if (version && len)
        version[0] = '\0';
    return 0;
#endif
}

/* ---- lifecycle ---------------------------------------------------------- */

int npyl_io_create(npyl_io **out, const npyl_io_config *cfg, char *err,
                   size_t errlen)
{
    *out = NULL;
    if (!cfg || (cfg->nfiles && !cfg->files) || cfg->max_open < 1 ||
        cfg->nfiles > INT32_MAX)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "npyl_io_create: bad configuration");
    if (cfg->backend != NPYLOAD_IO_URING && cfg->backend != NPYLOAD_IO_PREAD &&
        cfg->backend != NPYLOAD_IO_MMAP)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "npyl_io_create: backend %d is not URING, PREAD or "
                         "MMAP",
                         cfg->backend);
    if (cfg->direct && cfg->backend == NPYLOAD_IO_MMAP)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "direct I/O is not possible with the mmap backend");
    if (cfg->backend == NPYLOAD_IO_URING && cfg->queue_depth < 1)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "io_uring queue depth must be >= 1");
#ifndef NPYLOAD_HAVE_URING
    if (cfg->backend == NPYLOAD_IO_URING)
        return npyl_fail(err, errlen, NPYLOAD_ENOURING,
                         "io_uring backend: built without liburing");
#endif
    npyl_io *io = calloc(1, sizeof *io);
    if (!io)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    io->backend = cfg->backend;
    atomic_init(&io->backend_now, cfg->backend);
    io->direct = cfg->direct ? 1 : 0;
    io->random_access = cfg->random_access ? 1 : 0;
    io->queue_depth = cfg->queue_depth;
    io->maps = cfg->maps && cfg->maps->files == cfg->files && cfg->maps->n >= cfg->nfiles
                   ? cfg->maps
                   : NULL;
    /* O_DIRECT reads stay reads: the point of them is to bypass the cache. */
    io->gather_max = io->direct || cfg->gather_max < 0 ? 0
                     : cfg->gather_max == 0       ? NPYL_GATHER_MAX_DEFAULT
                                                  : (uint64_t)cfg->gather_max;
    if (npyl_io_files_init(io, cfg) != 0) {
        npyl_io_destroy(io);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    int rc = 0;
    if (cfg->backend == NPYLOAD_IO_URING)
        rc = npyl_io_uring_create(&io->uring, cfg->queue_depth, err, errlen);
    else if (cfg->backend == NPYLOAD_IO_MMAP &&
             (rc = npyl_sigbus_acquire(err, errlen)) == 0)
        io->sigbus_ref = 1;
    if (rc) {
        npyl_io_destroy(io);
        return rc;
    }
    *out = io;
    return 0;
}

void npyl_io_destroy(npyl_io *io)
{
    if (!io)
        return;
    /* The ring first: no read may be in flight into a descriptor we close
     * (npyl_io_read never returns with reads in flight, so this is belt and
     * braces). Mappings go before the SIGBUS handler reference. */
    npyl_io_uring_destroy(io->uring);
    npyl_io_files_fini(io);
    npyl_io_gather_fini(io);
    if (io->sigbus_ref)
        npyl_sigbus_release();
    free(io);
}

int npyl_io_backend_now(const npyl_io *io)
{
    return atomic_load_explicit(&((npyl_io *)io)->backend_now,
                                memory_order_relaxed);
}

/* ---- dispatch ----------------------------------------------------------- */

/* io_uring_enter refused at run time (a seccomp profile that allows
 * io_uring_setup, as some do): nothing will ever go through this ring. */
static int uring_refused(int broken)
{
    return broken == -EPERM || broken == -EACCES || broken == -ENOSYS;
}

/* The read backends, on the requests the gather path left. */
static int backend_read(npyl_io *io, const npyl_io_req *reqs, size_t n,
                        size_t *bad, uint64_t *got, char *err, size_t errlen)
{
    int rc;
    switch (atomic_load_explicit(&io->backend_now, memory_order_relaxed)) {
    case NPYLOAD_IO_PREAD:
        rc = npyl_io_pread_read(io, reqs, n, bad, got, err, errlen);
        break;
    case NPYLOAD_IO_URING: {
        uint64_t g = 0;
        rc = npyl_io_uring_read(io, io->uring, reqs, n, bad, &g, err, errlen);
        if (rc && uring_refused(npyl_io_uring_broken(io->uring))) {
            /* Fall back to pread for the rest of this context's life and
             * redo these reads: they are idempotent, and nothing is in
             * flight once npyl_io_uring_read returned. */
            npyl_io_uring_destroy(io->uring);
            io->uring = NULL;
            atomic_store_explicit(&io->backend_now, NPYLOAD_IO_PREAD,
                                  memory_order_relaxed);
            g = 0;
            rc = npyl_io_pread_read(io, reqs, n, bad, &g, err, errlen);
        }
        *got += g;
        break;
    }
    default:
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "bad backend");
    }
    return rc;
}

int npyl_io_read(npyl_io *io, const npyl_io_req *reqs, size_t n, size_t *bad,
                 uint64_t *bytes_read, char *err, size_t errlen)
{
    size_t bad_local = 0;
    if (!bad)
        bad = &bad_local;
    if (n == 0)
        return 0;
    io->call++;
    int rc = 0;
    uint64_t got = 0, rgot = 0;
    size_t nrest = n;
    if (io->backend == NPYLOAD_IO_MMAP || io->gather_max)
        rc = npyl_io_gather_read(io, reqs, n, bad, &got, &nrest, err, errlen);
    if (rc == 0 && nrest > 0 && io->backend != NPYLOAD_IO_MMAP) {
        /* nrest == n: the gather path took nothing, reqs are the rest. */
        const npyl_io_req *rest = nrest == n ? reqs : io->rest;
        size_t rbad = 0;
        rc = backend_read(io, rest, nrest, &rbad, &rgot, err, errlen);
        if (rc)
            *bad = nrest == n ? rbad : io->rest_idx[rbad];
        got += rgot;
        atomic_fetch_add_explicit(&io->st_read_bytes, rgot,
                                  memory_order_relaxed);
        atomic_fetch_add_explicit(&io->st_read_reqs, nrest,
                                  memory_order_relaxed);
    }
    if (bytes_read)
        *bytes_read += got;
    if (rc)
        return rc;
    return npyl_io_files_verify(io, reqs, n, bad, err, errlen);
}

void npyl_io_counters_add(const npyl_io *io, npyl_io_counters *c)
{
    npyl_io *m = (npyl_io *)io; /* atomics: loads only */
    c->gather_bytes += atomic_load_explicit(&m->st_gather_bytes,
                                            memory_order_relaxed);
    c->gather_reqs += atomic_load_explicit(&m->st_gather_reqs,
                                           memory_order_relaxed);
    c->read_bytes += atomic_load_explicit(&m->st_read_bytes,
                                          memory_order_relaxed);
    c->read_reqs += atomic_load_explicit(&m->st_read_reqs,
                                         memory_order_relaxed);
}
