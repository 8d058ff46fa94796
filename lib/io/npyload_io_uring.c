/* io_uring backend: one ring per context. A call keeps up to queue_depth
 * reads in flight across all its requests; requests larger than
 * URING_CHUNK are split so that one big request alone still fills the
 * queue. Short reads are continued by resubmitting the remainder, -EAGAIN
 * and -EINTR are resubmitted as they are. On the first error the call stops
 * submitting, waits for every read still in flight (the caller may free or
 * reuse the destination memory as soon as we return), and returns the error.
 *
 * Plain descriptors, not registered files: each SQE names the fd of an entry
 * of the open-file LRU, and that entry stays pinned until the CQE arrives,
 * so eviction never closes a descriptor the kernel has yet to resolve.
 * Registered files would save an fget/fput per read, which is noise next to
 * a 1 MiB copy; registered buffers are skipped: the destinations are slots
 * owned by the loader, and buffered reads of cached data are bound by the
 * copy, not by page pinning. Neither was measured to pay. */
#include "npyload_io_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef NPYLOAD_HAVE_URING
#include <liburing.h>

/* Largest single read. Measured on a page-cached 512 MiB file, 1 thread,
 * 128 MiB batches (of 1 MiB requests, or one 128 MiB request): chunks of
 * 512 KiB, 1 MiB, 4 MiB and unsplit all ran at 7-8.5 GB/s, within the
 * noise of a shared 2-core box: cached buffered reads complete inline on
 * the submitting thread, so the split neither helps nor costs there. It
 * matters when the data is not cached: one big request then still keeps
 * queue_depth reads in flight (io-wq workers / the device queue). 1 MiB. */
#ifndef URING_CHUNK
#define URING_CHUNK (1ull << 20)
#endif
#define URING_MAX_DEPTH 4096u

typedef struct uring_op {
    size_t req;          /* index of the request it serves */
    npyl_io_fh *fh;      /* pinned while in flight */
    int direct;
    uint64_t off, left;  /* what is still to read for this chunk */
    uint8_t *dst;
} uring_op;

struct npyl_io_uring {
    struct io_uring ring;
    unsigned depth;
    uring_op *ops;
    unsigned *free_ops;  /* stack of free op indices */
    unsigned nfree;
    int broken;          /* -errno once the ring itself failed, else 0 */
};

int npyl_io_uring_create(npyl_io_uring **out, unsigned queue_depth, char *err,
                         size_t errlen)
{
    *out = NULL;
    unsigned depth = queue_depth < 1 ? 1 : queue_depth;
    if (depth > URING_MAX_DEPTH)
        depth = URING_MAX_DEPTH;
    npyl_io_uring *u = calloc(1, sizeof *u);
    if (!u)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    u->depth = depth;
    u->ops = calloc(depth, sizeof *u->ops);
    u->free_ops = calloc(depth, sizeof *u->free_ops);
    if (!u->ops || !u->free_ops) {
        free(u->ops);
        free(u->free_ops);
        free(u);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    for (unsigned i = 0; i < depth; i++)
        u->free_ops[i] = depth - 1 - i;
    u->nfree = depth;

    /* COOP_TASKRUN (5.19+): completions are run when we enter the kernel
     * anyway, instead of interrupting the worker with task work. Older
     * kernels answer EINVAL: then a plain ring. SINGLE_ISSUER/DEFER_TASKRUN
     * are not used: they bind the ring to the thread that first submits, and
     * gave no measurable gain for 1 MiB reads. */
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_COOP_TASKRUN;
    int rc = io_uring_queue_init_params(depth, &u->ring, &p);
    if (rc == -EINVAL) {
        memset(&p, 0, sizeof p);
        rc = io_uring_queue_init_params(depth, &u->ring, &p);
    }
    if (rc < 0) {
        free(u->ops);
        free(u->free_ops);
        free(u);
        return npyl_fail(err, errlen, NPYLOAD_ENOURING,
                         "io_uring_setup with %u entries failed: %s", depth,
                         npyload_strerror(rc));
    }
    *out = u;
    return 0;
}

int npyl_io_uring_broken(const npyl_io_uring *u) { return u ? u->broken : 0; }

void npyl_io_uring_destroy(npyl_io_uring *u)
{
    if (!u)
        return;
    io_uring_queue_exit(&u->ring);
    free(u->ops);
    free(u->free_ops);
    free(u);
}

static struct io_uring_sqe *get_sqe(npyl_io_uring *u)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    while (!sqe) { /* unreachable while ring entries >= ops; stay safe */
        io_uring_submit(&u->ring);
        sqe = io_uring_get_sqe(&u->ring);
    }
    return sqe;
}

/* Queues (does not submit) the read for op `k`. The SQ has at least as many
 * entries as there are ops, and every op holds at most one SQE, so an SQE
 * is always available. */
static void prep_op(npyl_io_uring *u, unsigned k)
{
    const uint64_t A = NPYL_DIRECT_ALIGN;
    uring_op *op = &u->ops[k];
    if (op->direct &&
        (op->off % A || (uintptr_t)op->dst % A || op->left % A))
        op->direct = 0; /* remainder of a short direct read: page cache */
    struct io_uring_sqe *sqe = get_sqe(u);
    unsigned len = op->left > URING_CHUNK ? (unsigned)URING_CHUNK
                                          : (unsigned)op->left;
    io_uring_prep_read(sqe, op->direct ? op->fh->dfd : op->fh->fd, op->dst,
                       len, op->off);
    io_uring_sqe_set_data64(sqe, k);
}

/* One call's state: the cursor over its requests (request i, its
 * segments, position pos in segment j), the counts of reads prepared and
 * in flight, the first error. */
typedef struct uring_call {
    npyl_io *io;
    npyl_io_uring *u;
    const npyl_io_req *reqs;
    size_t n, i, *bad;
    npyl_io_fh *cur;      /* pinned for request i while it is cut */
    npyl_io_seg seg[3];
    unsigned nseg, j;
    uint64_t pos, got;
    unsigned inflight;    /* submitted, completion not yet reaped */
    unsigned queued;      /* prepared, not yet taken by the kernel */
    int rc;
    char *err;
    size_t errlen;
} uring_call;

/* 1. Fills free ops from the cursor (stops at the first error, or when
 * every open file has reads in flight). */
static void fill_ops(uring_call *c)
{
    npyl_io_uring *u = c->u;
    while (c->rc == 0 && c->i < c->n && u->nfree > 0) {
        if (!c->cur) {
            if (c->reqs[c->i].len == 0) {
                c->i++;
                continue;
            }
            int g = npyl_io_fh_get(c->io, c->reqs[c->i].file, &c->cur, c->err, c->errlen);
            if (g) {
                c->cur = NULL;
                if (g == NPYL_IO_BUSY)
                    break; /* every open file has reads in flight */
                c->rc = g;
                *c->bad = c->i;
                break;
            }
            c->nseg = npyl_io_split(c->io, &c->reqs[c->i], c->seg);
            c->j = 0;
            c->pos = 0;
        }
        const npyl_io_seg *sg = &c->seg[c->j];
        uint64_t len = sg->len - c->pos;
        if (len > URING_CHUNK)
            len = URING_CHUNK;
        unsigned k = u->free_ops[--u->nfree];
        uring_op *op = &u->ops[k];
        op->req = c->i;
        op->fh = c->cur;
        c->cur->pins++; /* the op's own pin, dropped at its completion */
        op->direct = sg->direct;
        op->off = sg->offset + c->pos;
        op->left = len;
        op->dst = sg->dst + c->pos;
        prep_op(u, k);
        c->queued++;
        c->pos += len;
        if (c->pos == sg->len) {
            c->pos = 0;
            if (++c->j == c->nseg) {
                npyl_io_fh_put(c->io, c->cur);
                c->cur = NULL;
                c->i++;
            }
        }
    }
}

/* 2. Submits what is queued and waits for at least one completion. After
 * a ring failure only waits: reads in flight write into the caller's
 * memory, so they must land before we return. */
static void submit_wait(uring_call *c)
{
    npyl_io_uring *u = c->u;
    struct io_uring_cqe *unused;
    int s = u->broken ? io_uring_wait_cqe(&u->ring, &unused)
                      : io_uring_submit_and_wait(&u->ring, 1);
    if (!u->broken && s >= 0) {
        unsigned t = (unsigned)s < c->queued ? (unsigned)s : c->queued;
        c->inflight += t;
        c->queued -= t;
    } else if (s < 0 && s != -EINTR && s != -EAGAIN && s != -EBUSY && s != -ETIME) {
        /* The ring itself failed (never seen in practice). SQEs that the
         * kernel did not take stay in the SQ: the ring is marked broken so
         * that no later call submits them into memory the caller may have
         * freed; io_uring_queue_exit discards them. */
        if (!u->broken) {
            u->broken = s;
            if (c->rc == 0) {
                size_t b = c->i < c->n ? c->i : c->n - 1;
                c->rc = npyl_io_fail_read(c->io, &c->reqs[b], s, c->err, c->errlen);
                *c->bad = b;
            }
        }
        /* If even waiting fails, the loop polls the CQ in reap() rather
         * than return with reads in flight. */
    }
}

/* 3. Reaps every completion available: counts what landed, resubmits the
 * remainder of a short read (or a retry), records the first error. */
static void reap(uring_call *c)
{
    npyl_io_uring *u = c->u;
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&u->ring, head, cqe)
    {
        seen++;
        c->inflight--;
        unsigned k = (unsigned)io_uring_cqe_get_data64(cqe);
        uring_op *op = &u->ops[k];
        const npyl_io_req *r = &c->reqs[op->req];
        int res = cqe->res;
        int again = 0;
        if (res == -EAGAIN || res == -EINTR) {
            again = c->rc == 0;
        } else if (res < 0) {
            if (c->rc == 0) {
                c->rc = npyl_io_fail_read(c->io, r, res, c->err, c->errlen);
                *c->bad = op->req;
            }
        } else if (res == 0) {
            if (c->rc == 0) {
                /* Chunks complete out of order: the one that saw EOF may lie
                 * past the real end. The message says the file's size. */
                c->rc = npyl_io_fail_eof(c->io, r, op->fh, c->err, c->errlen);
                *c->bad = op->req;
            }
        } else {
            c->got += (uint64_t)res;
            op->off += (uint64_t)res;
            op->dst += res;
            op->left -= (uint64_t)res;
            again = op->left > 0 && c->rc == 0;
        }
        if (again && !u->broken) {
            prep_op(u, k); /* the remainder (or a retry) */
            c->queued++;
        } else {
            npyl_io_fh_put(c->io, op->fh);
            op->fh = NULL;
            u->free_ops[u->nfree++] = k;
        }
    }
    io_uring_cq_advance(&u->ring, seen);
}

int npyl_io_uring_read(npyl_io *io, npyl_io_uring *u, const npyl_io_req *reqs,
                       size_t n, size_t *bad, uint64_t *bytes_read, char *err,
                       size_t errlen)
{
    if (u->broken) {
        *bad = 0;
        return npyl_fail(err, errlen, u->broken,
                         "io_uring ring unusable after an earlier failure: %s",
                         npyload_strerror(u->broken));
    }
    uring_call c = {.io = io, .u = u, .reqs = reqs, .n = n, .bad = bad, .err = err,
                    .errlen = errlen};
    for (;;) {
        fill_ops(&c);
        if (c.inflight == 0 && (c.queued == 0 || u->broken))
            break; /* all done, or failed with nothing in flight */
        submit_wait(&c);
        reap(&c);
    }
    if (c.cur)
        npyl_io_fh_put(io, c.cur);
    if (u->broken) /* ops whose SQEs the kernel never took */
        for (unsigned k = 0; k < u->depth; k++)
            if (u->ops[k].fh) {
                npyl_io_fh_put(io, u->ops[k].fh);
                u->ops[k].fh = NULL;
                u->free_ops[u->nfree++] = k;
            }
    if (bytes_read)
        *bytes_read += c.got;
    return c.rc;
}

#else /* !NPYLOAD_HAVE_URING */

int npyl_io_uring_create(npyl_io_uring **out, unsigned queue_depth, char *err,
                         size_t errlen)
{
    (void)queue_depth;
    *out = NULL;
    return npyl_fail(err, errlen, NPYLOAD_ENOURING,
                     "io_uring backend: built without liburing");
}

void npyl_io_uring_destroy(npyl_io_uring *u) { (void)u; }

int npyl_io_uring_broken(const npyl_io_uring *u) { (void)u; return 0; }

int npyl_io_uring_read(npyl_io *io, npyl_io_uring *u, const npyl_io_req *reqs,
                       size_t n, size_t *bad, uint64_t *bytes_read, char *err,
                       size_t errlen)
{
    (void)io; (void)u; (void)reqs; (void)n; (void)bad; (void)bytes_read;
    return npyl_fail(err, errlen, NPYLOAD_ENOURING,
                     "io_uring backend: built without liburing");
}

#endif
