/* The block cache in cache_dir: an object version (URL, ETag, size) is cut
 * into blocks of cache_block bytes, each a plain file named
 * KEY.BLOCK, where KEY is a 128-bit FNV-1a hash of the URL, the ETag, the
 * size and the block size. A block enters the cache only whole: it is
 * written to a temporary file (".tmp-PID-..."), synced, then renamed to its
 * name, so a reader (another thread, another rank of the node, a later
 * run) sees a complete block or none, and a crash leaves at most a
 * temporary file, removed by the next eviction pass once its writer is
 * gone: the writer holds an flock on it while it writes (an flock dies
 * with its process, whatever PID comes next), so a temporary file that
 * nobody holds is an orphan once its PID (in its name) is gone or it is
 * older than NPYL_TMP_ORPHAN_S (a PID reused, or another PID namespace). An object whose ETag changed has another KEY: a stale block is
 * never looked up, and ages out.
 *
 * The bound: the cache's total size is kept in a record (npyload-cache.lock,
 * 16 bytes: a tag and the total) updated under flock(LOCK_EX) around each
 * rename, by every process that shares the directory. When a new block
 * would pass the bound, the pass under the same lock lists the directory
 * (which also corrects the record), and removes the least recently used
 * blocks (oldest mtime: a hit refreshes it, at most every 10 s) until the
 * total is at most 90 % of the bound with the new block. flock is per open
 * file description, so this process's threads take a mutex first. Opening
 * the cache runs one pass too (a crash's leftovers, the record's drift).
 *
 * One fetch per block per node: threads and processes sharing the
 * directory coordinate so that each block crosses the link once. A thread
 * that misses a block claims it: first in this process's registry of
 * in-flight blocks (threads of the process that miss it too wait for that
 * one fetch, and get its error when it fails), then node-wide with an OFD
 * byte-range lock (fcntl F_OFD_SETLK) on one byte of npyload-cache.fetch,
 * the byte chosen by a hash of the block's name. The lock is held from
 * the claim until the block is renamed into place (or the fetch failed).
 * A process whose claim finds the byte locked does not fetch: its waiters
 * poll (bounded; 1 ms doubling to 16 ms, and at once when a thread of the
 * process releases a block) until the block is in the directory (then it
 * is read from there) or the byte is free without the block (its fetcher
 * died or failed: the kernel drops an OFD lock with the last descriptor of
 * its holder, SIGKILL included); then one of them takes the lock and
 * fetches it. Why locks rather than a shared index: the kernel cleans up
 * after a dead holder (a shared table with robust mutexes needs recovery
 * code, a fixed size and a layout every version agrees on), no file per
 * block is created or removed, and a cache on a file system without OFD
 * locks still works, de-duplicated per process. The byte space is 2^62:
 * two blocks sharing a byte (practically never) only serialise their
 * fetches. The size record (flock) and the fetch locks are separate files,
 * so that flock emulated with fcntl locks (NFS) cannot conflict. */
#include "npyload_remote_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LOCK_NAME "npyload-cache.lock"
#define FETCH_NAME "npyload-cache.fetch"
/* Polls for a block another process fetches: the first after 1 ms, then
 * doubling up to this (ms). */
#define NPYL_FETCH_POLL_MAX_MS 16
/* An unlocked temporary file this old is an orphan (the age covers the
 * moment between its creation and its writer's flock). */
#define NPYL_TMP_ORPHAN_S 30
#define RECORD_TAG "NPYLCAC1"
/* A wait with a stop flag looks at it at least this often (ms). */
#define NPYL_STOP_POLL_MS 50

/* A block being fetched: by a thread of this process (owned), or by
 * another process (not owned: its node lock is held elsewhere, and the
 * threads of this process that miss the block wait on this entry).
 * Guarded by npyl_cache.fl_mu; freed by the last of the owner and the
 * waiters. */
struct npyl_inflight {
    npyl_inflight *next;
    char key[33];
    uint64_t k;
    int done, rc;
    int owned;                /* a thread of this process fetches it */
    int locked;               /* this process holds its node lock */
    int refs;                 /* the owner until release, + one per waiter */
    char msg[512];
};

struct npyl_cache {
    char *dir;
    uint64_t bound, block;
    int lockfd;
    int fetchfd;              /* npyload-cache.fetch: the node's fetch locks
                                 (-1: none, de-duplication per process) */
    pthread_mutex_t mu;       /* this process's threads, around the flock */
    _Atomic uint64_t tmp_seq;
    pthread_mutex_t fl_mu;    /* the in-flight list (a leaf lock) */
    pthread_cond_t fl_cv;     /* a fetch is over */
    npyl_inflight *fl;
};

static uint64_t evict(npyl_cache *c, uint64_t incoming, uint64_t target, uint64_t *evicted);
static void write_record(npyl_cache *c, uint64_t total);

static int mkdirs(const char *dir)
{
    char buf[4096];
    if (strlen(dir) >= sizeof buf)
        return -ENAMETOOLONG;
    strcpy(buf, dir);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return -errno;
            *p = '/';
        }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return -errno;
    return 0;
}

int npyl_cache_open(npyl_cache **out, const char *dir, uint64_t bound, uint64_t block,
                    char *err, size_t errlen)
{
    *out = NULL;
    if (block < 4096 || block > (1ull << 30))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "remote configuration: cache_block "
                         "must be 4 KiB .. 1 GiB (%" PRIu64 " given)", block);
    if (strlen(dir) > 3000)
        return npyl_fail(err, errlen, NPYLOAD_EINVAL, "remote configuration: cache_dir is "
                         "too long");
    int rc = mkdirs(dir);
    if (rc)
        return npyl_fail(err, errlen, rc, "remote cache %s: cannot create it: %s", dir,
                         npyload_strerror(rc));
    npyl_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/" LOCK_NAME, dir);
    c->lockfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (c->lockfd < 0) {
        rc = -errno;
        free(c->dir);
        free(c);
        return npyl_fail(err, errlen, rc, "remote cache %s: cannot open %s: %s", dir, path,
                         npyload_strerror(rc));
    }
    /* An open file description of this cache's own: the OFD locks taken
     * through it conflict with every other process's (and with none of
     * this process's threads, which the registry coordinates). Without it
     * (a read-only directory) blocks are de-duplicated per process. */
    snprintf(path, sizeof path, "%s/" FETCH_NAME, dir);
    c->fetchfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    c->bound = bound;
    c->block = block;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->fl_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->fl_cv, &ca);
    pthread_condattr_destroy(&ca);
    /* A pass at open: temporary files of writers that died (a crash) go,
     * the size record is recomputed from the directory, and a bound lower
     * than the last user's is enforced now. */
    while (flock(c->lockfd, LOCK_EX) != 0 && errno == EINTR)
        ;
    uint64_t evicted = 0;
    write_record(c, evict(c, 0, bound, &evicted));
    flock(c->lockfd, LOCK_UN);
    *out = c;
    return 0;
}

void npyl_cache_close(npyl_cache *c)
{
    if (!c)
        return;
    close(c->lockfd);
    if (c->fetchfd >= 0)
        close(c->fetchfd);
    pthread_mutex_destroy(&c->mu);
    /* Every reader is gone (the client outlives its contexts): no claim
     * is left. */
    pthread_mutex_destroy(&c->fl_mu);
    pthread_cond_destroy(&c->fl_cv);
    free(c->dir);
    free(c);
}

uint64_t npyl_cache_block(const npyl_cache *c) { return c->block; }

uint64_t npyl_cache_bound(const npyl_cache *c) { return c->bound; }

/* ---- keys ---------------------------------------------------------------------- */

typedef unsigned __int128 u128;

static u128 fnv(u128 h, const void *p, size_t n)
{
    const u128 prime = ((u128)0x0000000001000000ull << 64) | 0x000000000000013Bull;
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= prime;
    }
    return h;
}

void npyl_cache_key(const npyl_cache *c, const char *url, const char *etag, uint64_t size,
                    char key[33])
{
    u128 h = ((u128)0x6c62272e07bb0142ull << 64) | 0x62b821756295c58dull;
    h = fnv(h, url, strlen(url) + 1);
    h = fnv(h, etag, strlen(etag) + 1);
    h = fnv(h, &size, sizeof size);
    h = fnv(h, &c->block, sizeof c->block);
    snprintf(key, 33, "%016" PRIx64 "%016" PRIx64, (uint64_t)(h >> 64), (uint64_t)h);
}

static void block_path(const npyl_cache *c, const char *key, uint64_t k, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s.%" PRIu64, c->dir, key, k);
}

/* ---- lookups ---------------------------------------------------------------------- */

int npyl_cache_lookup(npyl_cache *c, const char *key, uint64_t k, uint64_t len)
{
    char path[4096];
    block_path(c, key, k, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != len) {
        /* Not what a complete block of this version is: never served. */
        close(fd);
        return -1;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (now.tv_sec - st.st_mtim.tv_sec > 10)
        (void)futimens(fd, NULL); /* LRU age; an error only ages it */
    return fd;
}

/* ---- in-flight blocks: this process's registry, the node's locks ------------------- */

/* The byte of npyload-cache.fetch that stands for block k of key: below
 * 2^62, so that the one-byte range never overflows an off_t. */
static off_t lock_byte(const char *key, uint64_t k)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = key; *p; p++) {
        h ^= (unsigned char)*p;
        h *= 0x100000001b3ull;
    }
    return (off_t)(npyl_mix64(h ^ npyl_mix64(k + NPYL_GOLDEN)) >> 2);
}

/* Takes (F_WRLCK, without waiting) or drops (F_UNLCK) the node lock of
 * block k. Returns 1 when taken, also when this cache has no lock file or
 * its file system no OFD locks (then nothing coordinates processes: each
 * fetches what it misses, as before), 0 when another process holds it. */
static int node_lock(npyl_cache *c, const char *key, uint64_t k, short type)
{
    if (c->fetchfd < 0)
        return 1;
    struct flock fl;
    memset(&fl, 0, sizeof fl); /* l_pid 0, as OFD locks require */
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = lock_byte(key, k);
    fl.l_len = 1;
    for (;;) {
        if (fcntl(c->fetchfd, F_OFD_SETLK, &fl) == 0)
            return 1;
        if (errno != EINTR)
            return errno == EAGAIN || errno == EACCES ? 0 : 1;
    }
}

/* Block k of key is in the directory (renamed in whole: complete). */
static int present(const npyl_cache *c, const char *key, uint64_t k)
{
    char path[4096];
    struct stat st;
    block_path(c, key, k, path, sizeof path);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

npyl_inflight *npyl_cache_claim(npyl_cache *c, const char *key, uint64_t k, int *claim)
{
    pthread_mutex_lock(&c->fl_mu);
    npyl_inflight *t = c->fl;
    while (t && !(t->k == k && !t->done && strcmp(t->key, key) == 0))
        t = t->next;
    if (t) {
        t->refs++;
        *claim = NPYL_CLAIM_WAIT;
    } else if ((t = calloc(1, sizeof *t))) {
        snprintf(t->key, sizeof t->key, "%s", key);
        t->k = k;
        t->refs = 1;
        t->next = c->fl;
        c->fl = t;
        *claim = NPYL_CLAIM_WAIT; /* the caller waits, unless it fetches: */
        if (node_lock(c, key, k, F_WRLCK)) {
            if (present(c, key, k)) {
                /* Renamed into place since the caller's lookup: its wait
                 * returns 0 at once and it reads the block. */
                node_lock(c, key, k, F_UNLCK);
                t->done = 1;
            } else {
                t->owned = 1;
                t->locked = c->fetchfd >= 0;
                *claim = NPYL_CLAIM_OWN;
            }
        }
        /* else another process fetches it: the caller waits (not owned) */
    } else {
        *claim = NPYL_CLAIM_OWN; /* out of memory: fetch it, unregistered */
    }
    pthread_mutex_unlock(&c->fl_mu);
    return t;
}

/* Under fl_mu: drops one reference; the last unlinks and frees. */
static void inflight_unref(npyl_cache *c, npyl_inflight *t)
{
    if (--t->refs > 0)
        return;
    for (npyl_inflight **p = &c->fl; *p; p = &(*p)->next)
        if (*p == t) {
            *p = t->next;
            break;
        }
    free(t);
}

void npyl_cache_release(npyl_cache *c, npyl_inflight *t, int rc, const char *msg)
{
    if (!t)
        return;
    pthread_mutex_lock(&c->fl_mu);
    /* After the rename (the commit precedes the release): a process that
     * takes the lock next finds the block. */
    if (t->locked)
        node_lock(c, t->key, t->k, F_UNLCK);
    t->locked = 0;
    t->done = 1;
    t->rc = rc;
    snprintf(t->msg, sizeof t->msg, "%s", rc && msg ? msg : "");
    inflight_unref(c, t);
    pthread_cond_broadcast(&c->fl_cv);
    pthread_mutex_unlock(&c->fl_mu);
}

static struct timespec ts_after(struct timespec t, long ms)
{
    t.tv_sec += ms / 1000;
    t.tv_nsec += (ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

static int ts_before(struct timespec a, struct timespec b)
{
    return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

int npyl_cache_wait(npyl_cache *c, npyl_inflight *t, long timeout_ms, char *err, size_t errlen)
{
    return npyl_cache_wait_stop(c, t, timeout_ms, NULL, err, errlen);
}

int npyl_cache_wait_stop(npyl_cache *c, npyl_inflight *t, long timeout_ms, _Atomic int *stop,
                         char *err, size_t errlen)
{
    struct timespec now, dl;
    clock_gettime(CLOCK_MONOTONIC, &now);
    dl = ts_after(now, timeout_ms > 0 ? timeout_ms : 0);
    long poll_ms = 1;
    pthread_mutex_lock(&c->fl_mu);
    int out;
    for (;;) {
        if (t->done) {
            out = t->rc;
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (timeout_ms <= 0 || !ts_before(now, dl) || (stop && atomic_load(stop))) {
            out = 1;
            break;
        }
        struct timespec until = dl;
        if (stop) { /* looked at again within NPYL_STOP_POLL_MS */
            struct timespec next = ts_after(now, NPYL_STOP_POLL_MS);
            if (ts_before(next, until))
                until = next;
        }
        if (!t->owned) {
            /* Another process fetches it: done when the block is in the
             * directory; ours when its lock is free without the block (the
             * fetcher died or failed). */
            int got = present(c, t->key, t->k) ? 2 : node_lock(c, t->key, t->k, F_WRLCK);
            if (got == 1 && present(c, t->key, t->k)) {
                node_lock(c, t->key, t->k, F_UNLCK);
                got = 2;
            }
            if (got == 2) {
                t->done = 1;
                pthread_cond_broadcast(&c->fl_cv);
                continue;
            }
            if (got == 1) {
                /* This thread's reference becomes the owner's. */
                t->owned = 1;
                t->locked = c->fetchfd >= 0;
                pthread_mutex_unlock(&c->fl_mu);
                return NPYL_WAIT_YOURS;
            }
            struct timespec next = ts_after(now, poll_ms);
            if (ts_before(next, until))
                until = next;
            poll_ms = poll_ms * 2 > NPYL_FETCH_POLL_MAX_MS ? NPYL_FETCH_POLL_MAX_MS : poll_ms * 2;
        }
        pthread_cond_timedwait(&c->fl_cv, &c->fl_mu, &until);
    }
    if (t->done && t->rc && err && errlen)
        snprintf(err, errlen, "%s", t->msg);
    inflight_unref(c, t);
    pthread_mutex_unlock(&c->fl_mu);
    return out;
}

/* ---- fills ------------------------------------------------------------------------- */

int npyl_cache_tmp(npyl_cache *c, const char *key, uint64_t k, char tmp[64])
{
    uint64_t seq = atomic_fetch_add(&c->tmp_seq, 1);
    snprintf(tmp, 64, ".tmp-%ld-%" PRIu64 "-%.12s.%" PRIu64, (long)getpid(), seq, key, k);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", c->dir, tmp);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0)
        return -errno;
    /* Held until the writer closes it (renamed or discarded): how an
     * eviction pass tells a live writer's file from a crash's. */
    (void)flock(fd, LOCK_EX | LOCK_NB);
    return fd;
}

void npyl_cache_discard(npyl_cache *c, const char *tmp)
{
    if (!tmp || !tmp[0])
        return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", c->dir, tmp);
    unlink(path);
}

static int read_record(npyl_cache *c, uint64_t *total)
{
    unsigned char b[16];
    if (pread(c->lockfd, b, sizeof b, 0) != (ssize_t)sizeof b || memcmp(b, RECORD_TAG, 8) != 0)
        return -1;
    memcpy(total, b + 8, 8);
    return 0;
}

static void write_record(npyl_cache *c, uint64_t total)
{
    unsigned char b[16];
    memcpy(b, RECORD_TAG, 8);
    memcpy(b + 8, &total, 8);
    (void)!pwrite(c->lockfd, b, sizeof b, 0);
}

typedef struct entry {
    int64_t mtime_ns;
    uint64_t size;
    char name[64];
} entry;

static int by_age(const void *pa, const void *pb)
{
    const entry *a = pa, *b = pb;
    if (a->mtime_ns != b->mtime_ns)
        return a->mtime_ns < b->mtime_ns ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* A block file's name: 32 hex digits, '.', digits. */
static int is_block(const char *n)
{
    for (int i = 0; i < 32; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f')))
            return 0;
    if (n[32] != '.' || !n[33])
        return 0;
    for (const char *p = n + 33; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

/* A temporary file whose writer is gone: nobody holds its flock, and its
 * PID does not exist or it is older than NPYL_TMP_ORPHAN_S (the age, and
 * the PID, cover the moment between its creation and its writer's flock). */
static int orphan_tmp(const char *path, const char *n)
{
    if (strncmp(n, ".tmp-", 5) != 0)
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return 0;
    struct stat st;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    long pid = strtol(n + 5, NULL, 10);
    int gone = pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    int orphan = fstat(fd, &st) == 0 &&
                 (gone || now.tv_sec - st.st_mtim.tv_sec > NPYL_TMP_ORPHAN_S) &&
                 flock(fd, LOCK_EX | LOCK_NB) == 0;
    close(fd); /* drops the lock if taken */
    return orphan;
}

/* Under the lock: lists the cache, removes orphaned temporary files and,
 * oldest first, blocks until total + incoming <= target. Returns the
 * total left; *evicted counts the blocks removed. */
static uint64_t evict(npyl_cache *c, uint64_t incoming, uint64_t target, uint64_t *evicted)
{
    DIR *d = opendir(c->dir);
    if (!d)
        return 0;
    entry *v = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *name = de->d_name;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", c->dir, name);
        if (orphan_tmp(path, name)) {
            unlink(path);
            continue;
        }
        if (strlen(name) >= sizeof v->name || !is_block(name))
            continue;
        struct stat st;
        if (stat(path, &st) != 0)
            continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 256;
            entry *w = realloc(v, nc * sizeof *v);
            if (!w)
                break;
            v = w;
            cap = nc;
        }
        v[n].mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        v[n].size = (uint64_t)st.st_size;
        snprintf(v[n].name, sizeof v[n].name, "%s", name);
        total += v[n].size;
        n++;
    }
    closedir(d);
    if (v)
        qsort(v, n, sizeof *v, by_age);
    for (size_t i = 0; i < n && total + incoming > target; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", c->dir, v[i].name);
        if (unlink(path) == 0) {
            total -= v[i].size;
            (*evicted)++;
        }
    }
    free(v);
    return total;
}

int npyl_cache_commit(npyl_cache *c, const char *tmp, const char *key, uint64_t k,
                      uint64_t len, uint64_t *evicted)
{
    *evicted = 0;
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/%s", c->dir, tmp);
    block_path(c, key, k, to, sizeof to);
    if (len > c->bound) {
        unlink(from);
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    while (flock(c->lockfd, LOCK_EX) != 0 && errno == EINTR)
        ;
    int rc = 0;
    struct stat st;
    if (stat(to, &st) == 0) {
        /* Another thread or rank fetched it meanwhile: the same bytes. */
        unlink(from);
        rc = -1;
    } else {
        uint64_t total;
        if (read_record(c, &total) != 0 || total + len > c->bound)
            total = evict(c, len, c->bound - c->bound / 10 > len ? c->bound - c->bound / 10
                                                                  : len, evicted);
        if (total + len > c->bound || rename(from, to) != 0) {
            unlink(from);
            rc = -1;
        } else {
            total += len;
        }
        write_record(c, total);
    }
    flock(c->lockfd, LOCK_UN);
    pthread_mutex_unlock(&c->mu);
    return rc;
}
