/* The SIGBUS guard of the mmap backend.
 *
 * Reading a page of a shared file mapping that lies past the file's current
 * end (the file was truncated), or whose read-in failed (EIO), raises SIGBUS
 * in the reading thread; by default that kills the process.
 * npyl_sigbus_gather sets a thread-local recovery point around a list of
 * memcpys; the handler jumps back to it when the fault lies in the source
 * range of the copy in progress, and the caller turns the fault into an
 * error naming the file.
 *
 * Process-wide state, the only one in the library: a reference count (one
 * per mmap io context) and the action that was installed before ours, under
 * a mutex. The handler is installed when the count goes 0 -> 1 and the
 * previous action restored when it goes back to 0 (unless someone installed
 * another handler over ours meanwhile: theirs is then left alone).
 *
 * Faults that are not ours (another thread, another address, no guard, a
 * SIGBUS sent with kill) go to the previous action: its handler is called;
 * SIG_DFL (or SIG_IGN for a fault the kernel raised, which cannot be
 * ignored) resets the default action and re-raises, so the process dies of
 * SIGBUS exactly as it would have without us. */
#include "npyload_io_impl.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

/* The recovery point of one thread: the list being copied and the index
 * of the copy in progress; the handler accepts a fault in that copy's
 * source range, page-rounded (pm: the page size - 1). initial-exec TLS: the
 * handler must not reach __tls_get_addr, which may allocate in a thread
 * (of a dlopen'd module) that never touched the variable. */
typedef struct sigbus_guard {
    sigjmp_buf *volatile env;              /* set only around the copies */
    const npyl_gather_seg *volatile segs;
    volatile size_t i;
    volatile uintptr_t pm;
    volatile uintptr_t fault;              /* si_addr of the fault, for the caller */
} sigbus_guard;

static __thread sigbus_guard guard __attribute__((tls_model("initial-exec")));

static pthread_mutex_t sigbus_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned sigbus_refs;        /* [sigbus_mu] */
static struct sigaction sigbus_prev; /* [sigbus_mu]; stable while installed */

static void chain(int sig, siginfo_t *si, void *uc)
{
    const struct sigaction *p = &sigbus_prev;
    if (p->sa_flags & SA_SIGINFO) {
        if (p->sa_sigaction) {
            p->sa_sigaction(sig, si, uc);
            return;
        }
    } else if (p->sa_handler == SIG_IGN) {
        if (si && si->si_code <= 0)
            return; /* sent by a process: ignoring it was allowed */
    } else if (p->sa_handler != SIG_DFL) {
        p->sa_handler(sig);
        return;
    }
    /* Default action. SIGBUS is blocked while we run, so the raised signal
     * stays pending and kills the process as soon as the handler returns
     * (a hardware fault would also simply recur). */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    sigbus_guard *g = &guard;
    sigjmp_buf *env = g->env;
    uintptr_t a = si ? (uintptr_t)si->si_addr : 0, lo = 0, hi = 0;
    if (env) {
        const npyl_gather_seg *s = &g->segs[g->i];
        lo = (uintptr_t)s->src & ~g->pm;
        hi = ((uintptr_t)s->src + s->len + g->pm) & ~g->pm;
    }
    if (env && si && si->si_code > 0 && a >= lo && a < hi) {
        g->env = NULL;
        g->fault = a;
        siglongjmp(*env, 1);
    }
    chain(sig, si, uc);
}

int npyl_sigbus_acquire(char *err, size_t errlen)
{
    int rc = 0;
    pthread_mutex_lock(&sigbus_mu);
    if (sigbus_refs == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        /* SA_ONSTACK: run on the thread's alternate stack when it has one
         * (runtimes that install one expect their stacks left alone). */
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &sigbus_prev) != 0)
            rc = -errno;
    }
    if (rc == 0)
        sigbus_refs++;
    pthread_mutex_unlock(&sigbus_mu);
    if (rc)
        return npyl_fail(err, errlen, rc,
                         "mmap backend: cannot install the SIGBUS handler: %s",
                         npyload_strerror(rc));
    return 0;
}

void npyl_sigbus_release(void)
{
    pthread_mutex_lock(&sigbus_mu);
    if (sigbus_refs > 0 && --sigbus_refs == 0) {
        struct sigaction cur;
        if (sigaction(SIGBUS, NULL, &cur) == 0 &&
            (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus)
            sigaction(SIGBUS, &sigbus_prev, NULL);
    }
    pthread_mutex_unlock(&sigbus_mu);
}

int npyl_sigbus_gather(const npyl_gather_seg *segs, size_t n, size_t *which,
                       uint64_t *at)
{
    /* One recovery point for the whole list: sigsetjmp once per call, one
     * store per segment (its index: the handler finds the range it accepts
     * in the list), so a batch of small rows costs a memcpy each. Nothing
     * between sigsetjmp and the end of the copies holds a lock, allocates
     * or changes a local the recovery path reads, so jumping out of a
     * memcpy leaves nothing half done. sigsetjmp(.., 0) does not save the
     * signal mask (no syscall per call); the recovery path unblocks SIGBUS,
     * which the kernel blocked on entry to the handler. */
    sigbus_guard *g = &guard;
    sigjmp_buf env;
    if (sigsetjmp(env, 0)) {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGBUS);
        pthread_sigmask(SIG_UNBLOCK, &s, NULL);
        size_t k = g->i;
        uintptr_t src = (uintptr_t)segs[k].src;
        *which = k;
        *at = g->fault >= src ? g->fault - src : 0;
        return -EFAULT;
    }
    g->pm = (uintptr_t)sysconf(_SC_PAGESIZE) - 1; /* glibc: no syscall */
    g->segs = segs;
    g->i = 0;
    atomic_signal_fence(memory_order_seq_cst);
    g->env = &env;
    for (size_t k = 0; k < n; k++) {
        const npyl_gather_seg *s = &segs[k];
        /* Rows of a shuffled batch sit at random places: start loading the
         * next row's first lines while this one is copied (a prefetch never
         * faults, even past a truncated file's end). */
        if (k + 1 < n) {
            const char *nx = segs[k + 1].src;
            size_t nl = segs[k + 1].len < 256 ? segs[k + 1].len : 256;
            for (size_t o = 0; o < nl; o += 64)
                __builtin_prefetch(nx + o);
        }
        g->i = k;
        atomic_signal_fence(memory_order_seq_cst);
        memcpy(s->dst, s->src, s->len);
        atomic_signal_fence(memory_order_seq_cst);
    }
    g->env = NULL;
    atomic_signal_fence(memory_order_seq_cst);
    return 0;
}
