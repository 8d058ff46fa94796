/* lib/io: every backend (pread, mmap, io_uring) with and without O_DIRECT,
 * checked against an independent truth (the file read back with plain
 * read(2) by testutil, and tu_byte). Criterion runs each test in its own
 * process, so the seccomp test cannot leak into the others. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/magic.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "io/npyload_io.h"
#include "testutil.h"

#define MiB (1024ull * 1024ull)

/* ---- helpers ------------------------------------------------------------ */

/* A temp dir on a filesystem that is not tmpfs when one is at hand (tmpfs
 * refuses or ignores O_DIRECT): $TMPDIR, then /var/tmp, then /tmp. */
static char *mkdir_realfs(const char *tag)
{
    const char *cands[] = {getenv("TMPDIR"), "/var/tmp", "/tmp"};
    for (size_t i = 0; i < 3; i++) {
        struct statfs sf;
        if (!cands[i] || !*cands[i] || statfs(cands[i], &sf) != 0 ||
            sf.f_type == TMPFS_MAGIC)
            continue;
        char *p = malloc(strlen(cands[i]) + strlen(tag) + 32);
        sprintf(p, "%s/npyload-%s-XXXXXX", cands[i], tag);
        if (mkdtemp(p))
            return p;
        free(p);
    }
    return tu_mkdtemp(tag);
}

typedef struct tfile {
    char *path;
    uint8_t *bytes; /* the whole file, read back independently */
    size_t size;
    long data_offset;
} tfile;

/* An NPY file of `n` uint8 values tu_byte(seed, 0, i); header padded so the
 * data starts at a multiple of `align` (64 → offset 128, 16 → offset 80). */
static void make_file(tfile *t, const char *dir, const char *name,
                      uint32_t seed, size_t n, unsigned align)
{
    uint8_t *data = malloc(n ? n : 1);
    cr_assert(data);
    for (size_t i = 0; i < n; i++)
        data[i] = tu_byte(seed, 0, i);
    t->path = tu_path(dir, name);
    int64_t shape[1] = {(int64_t)n};
    t->data_offset = tu_write_npy(t->path, "|u1", 0, 1, shape, data, n, align);
    cr_assert(t->data_offset > 0, "cannot write %s", t->path);
    free(data);
    t->bytes = tu_read_file(t->path, &t->size);
    cr_assert(t->bytes && t->size == (size_t)t->data_offset + n);
    for (size_t i = 0; i < n; i += 4093) /* the writer agrees with tu_byte */
        cr_assert_eq(t->bytes[t->data_offset + i], tu_byte(seed, 0, i));
}

static void free_file(tfile *t)
{
    free(t->path);
    free(t->bytes);
}

static void stat_all(const tfile *t, size_t n, npyl_file_info *info)
{
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(npyl_io_stat(t[i].path, &info[i]), 0, "%s", t[i].path);
}

/* A uring test skips visibly when io_uring is refused or compiled out. */
static void need_uring(void)
{
    char why[256] = "";
    if (!npyl_io_uring_usable(why, sizeof why))
        cr_skip_test("io_uring unusable here: %s", why);
}

/* A direct test skips visibly when the filesystem refuses O_DIRECT. */
static void need_direct(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0)
        cr_skip_test("O_DIRECT refused on %s: %s", path, strerror(errno));
    void *buf = npyl_alloc_aligned(4096, 4096);
    ssize_t r = pread(fd, buf, 4096, 0);
    int e = errno;
    npyl_free_aligned(buf);
    close(fd);
    if (r < 0)
        cr_skip_test("O_DIRECT read refused on %s: %s", path, strerror(e));
}

static uint64_t rng_state;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t rnd_below(uint64_t n) { return n ? rnd() % n : 0; }

/* The gather threshold the contexts of a test get (npyl_io_config's
 * gather_max): 0 the default, -1 never (reads only), INT64_MAX every
 * request of a URING or PREAD context copied from a mapping. Criterion runs
 * each test in its own process: a test sets it before its first make_io. */
static int64_t gather_cfg;

static npyl_io *make_io(int backend, int direct, unsigned qd, unsigned max_open,
                        const npyl_file_info *info, size_t nfiles)
{
    npyl_io_config cfg = {.backend = backend, .direct = direct,
                          .queue_depth = qd, .max_open = max_open,
                          .files = info, .nfiles = nfiles,
                          .gather_max = gather_cfg};
    npyl_io *io = NULL;
    char err[512] = "";
    int rc = npyl_io_create(&io, &cfg, err, sizeof err);
    cr_assert_eq(rc, 0, "npyl_io_create: %d %s", rc, err);
    return io;
}

/* ---- random runs against the truth -------------------------------------- */

#define GUARD 0xEE

static void random_runs(int backend, int direct, unsigned qd,
                        unsigned max_open, int iters)
{
    enum { NF = 5 };
    char *dir = mkdir_realfs("io");
    cr_assert(dir);
    tfile f[NF];
    /* Sizes not multiples of 4096; data offsets 128 and 80. */
    const size_t sizes[NF] = {9 * MiB + 12345, 3 * MiB + 1, 777777, 4097,
                              6 * MiB + 4095};
    for (int k = 0; k < NF; k++) {
        char name[32];
        snprintf(name, sizeof name, "f%d.npy", k);
        make_file(&f[k], dir, name, (uint32_t)k + 1, sizes[k],
                  k % 2 ? 16 : 64);
    }
    cr_assert_eq(f[0].data_offset, 128);
    cr_assert_eq(f[1].data_offset, 80);
    if (direct)
        need_direct(f[0].path);
    npyl_file_info info[NF];
    stat_all(f, NF, info);
    npyl_io *io = make_io(backend, direct, qd, max_open, info, NF);

    enum { MAXREQ = 12 };
    const size_t cap = MAXREQ * (4 * MiB + 2 * 4096);
    uint8_t *buf = npyl_alloc_aligned(cap, 4096);
    cr_assert(buf);
    rng_state = 0x1234 + (uint64_t)backend * 7 + (uint64_t)direct;
    uint64_t direct_bytes = 0;
    for (int it = 0; it < iters; it++) {
        npyl_io_req req[MAXREQ];
        size_t n = 1 + rnd_below(MAXREQ), at = 0;
        memset(buf, GUARD, cap);
        for (size_t r = 0; r < n; r++) {
            uint32_t k = (uint32_t)rnd_below(NF);
            uint64_t len;
            switch (rnd_below(4)) {
            case 0: len = 1 + rnd_below(64); break;
            case 1: len = 1 + rnd_below(8192); break;
            case 2: len = 1 + rnd_below(512 * 1024); break;
            default: len = 1 + rnd_below(4 * MiB); break;
            }
            if (len > f[k].size)
                len = f[k].size;
            uint64_t off;
            if (rnd_below(3) == 0) /* inside the data, from its start */
                off = (uint64_t)f[k].data_offset +
                      rnd_below(f[k].size - (uint64_t)f[k].data_offset);
            else
                off = rnd_below(f[k].size - len + 1);
            if (off + len > f[k].size)
                len = f[k].size - off;
            /* Half the destinations congruent to the offset mod 4096 (the
             * direct path), half anywhere. */
            size_t slack = rnd_below(2) ? (size_t)(off % 4096)
                                        : (size_t)rnd_below(4096);
            at = (at + 4095) / 4096 * 4096 + 4096; /* a guard page between */
            uint8_t *dst = buf + at + slack;
            at += slack + len;
            cr_assert(at + 4096 <= cap);
            req[r] = (npyl_io_req){k, off, len, dst};
            if (direct && (off % 4096) == ((uintptr_t)dst % 4096) &&
                len >= 4096)
                direct_bytes += len;
        }
        uint64_t got = 0;
        size_t bad = 99;
        char err[512] = "";
        int rc = npyl_io_read(io, req, n, &bad, &got, err, sizeof err);
        cr_assert_eq(rc, 0, "iteration %d: rc %d (%s) req %zu: %s", it, rc,
                     npyload_strerror(rc), bad, err);
        uint64_t want = 0;
        for (size_t r = 0; r < n; r++) {
            const uint8_t *truth = f[req[r].file].bytes + req[r].offset;
            uint8_t *d = req[r].dst;
            want += req[r].len;
            cr_assert(memcmp(d, truth, req[r].len) == 0,
                      "iteration %d request %zu: file %u offset %llu len %llu "
                      "differs",
                      it, r, req[r].file, (unsigned long long)req[r].offset,
                      (unsigned long long)req[r].len);
            if ((uintptr_t)d > (uintptr_t)buf)
                cr_assert_eq(d[-1], GUARD, "write before request %zu", r);
            cr_assert_eq(d[req[r].len], GUARD, "write after request %zu", r);
        }
        cr_assert_eq(got, want, "bytes_read %llu, expected %llu",
                     (unsigned long long)got, (unsigned long long)want);
    }
    if (direct)
        cr_assert(direct_bytes > 0, "no request exercised the direct path");
    npyl_io_destroy(io);
    npyl_free_aligned(buf);
    for (int k = 0; k < NF; k++)
        free_file(&f[k]);
    tu_rmtree(dir);
}

Test(io_pread, random_runs) { random_runs(NPYLOAD_IO_PREAD, 0, 1, 4, 80); }
Test(io_pread, random_runs_direct)
{
    random_runs(NPYLOAD_IO_PREAD, 1, 1, 4, 80);
}
Test(io_pread, random_runs_one_open_file)
{
    random_runs(NPYLOAD_IO_PREAD, 0, 1, 1, 40);
}
Test(io_mmap, random_runs) { random_runs(NPYLOAD_IO_MMAP, 0, 1, 4, 80); }
Test(io_mmap, random_runs_one_open_file)
{
    random_runs(NPYLOAD_IO_MMAP, 0, 1, 1, 40);
}
Test(io_uring, random_runs_qd1)
{
    need_uring();
    random_runs(NPYLOAD_IO_URING, 0, 1, 4, 60);
}
Test(io_uring, random_runs_qd32)
{
    need_uring();
    random_runs(NPYLOAD_IO_URING, 0, 32, 4, 80);
}
Test(io_uring, random_runs_qd8_one_open_file)
{
    /* Every file switch must wait for the reads on the open one. */
    need_uring();
    random_runs(NPYLOAD_IO_URING, 0, 8, 1, 40);
}
Test(io_uring, random_runs_direct_qd32)
{
    need_uring();
    random_runs(NPYLOAD_IO_URING, 1, 32, 4, 80);
}
Test(io_uring, random_runs_direct_qd3_two_open_files)
{
    need_uring();
    random_runs(NPYLOAD_IO_URING, 1, 3, 2, 40);
}

/* ---- more files than max_open ------------------------------------------- */

static void many_files(int backend, int direct, unsigned qd)
{
    enum { NF = 300, MAXOPEN = 8 };
    char *dir = mkdir_realfs("io-many");
    cr_assert(dir);
    tfile *f = calloc(NF, sizeof *f);
    for (int k = 0; k < NF; k++) {
        char name[32];
        snprintf(name, sizeof name, "m%03d.npy", k);
        make_file(&f[k], dir, name, 1000u + (uint32_t)k,
                  5000 + (size_t)k * 37, k % 3 ? 64 : 16);
    }
    if (direct)
        need_direct(f[0].path);
    npyl_file_info *info = calloc(NF, sizeof *info);
    stat_all(f, NF, info);
    int fds0 = tu_count_fds();
    npyl_io *io = make_io(backend, direct, qd, MAXOPEN, info, NF);
    enum { PER = 64 };
    uint8_t *buf = npyl_alloc_aligned(PER * 16384, 4096);
    rng_state = 99;
    for (int round = 0; round < 20; round++) {
        npyl_io_req req[PER];
        for (int r = 0; r < PER; r++) {
            uint32_t k = (uint32_t)rnd_below(NF);
            uint64_t off = (uint64_t)f[k].data_offset;
            uint64_t len = f[k].size - off; /* the whole data of the file */
            req[r] = (npyl_io_req){k, off, len, buf + (size_t)r * 16384 +
                                                   (size_t)(off % 4096)};
        }
        char err[512] = "";
        size_t bad = 0;
        int rc = npyl_io_read(io, req, PER, &bad, NULL, err, sizeof err);
        cr_assert_eq(rc, 0, "round %d: %s", round, err);
        for (int r = 0; r < PER; r++)
            for (uint64_t i = 0; i < req[r].len; i += 97)
                cr_assert_eq(((uint8_t *)req[r].dst)[i],
                             tu_byte(1000u + req[r].file, 0, i),
                             "file %u byte %llu", req[r].file,
                             (unsigned long long)i);
        int open_now = tu_count_fds() - fds0;
        /* fd + O_DIRECT fd per cached file, and a ring fd. */
        cr_assert(open_now <= MAXOPEN * (direct ? 2 : 1) + 1,
                  "%d descriptors open with max_open %d", open_now, MAXOPEN);
    }
    npyl_io_destroy(io);
    cr_assert_eq(tu_count_fds(), fds0, "descriptors leaked by destroy");
    npyl_free_aligned(buf);
    for (int k = 0; k < NF; k++)
        free_file(&f[k]);
    free(f);
    free(info);
    tu_rmtree(dir);
}

Test(io_pread, many_files) { many_files(NPYLOAD_IO_PREAD, 0, 1); }
Test(io_pread, many_files_direct) { many_files(NPYLOAD_IO_PREAD, 1, 1); }
Test(io_mmap, many_files) { many_files(NPYLOAD_IO_MMAP, 0, 1); }
Test(io_uring, many_files)
{
    need_uring();
    many_files(NPYLOAD_IO_URING, 0, 16);
}
Test(io_uring, many_files_direct)
{
    need_uring();
    many_files(NPYLOAD_IO_URING, 1, 16);
}

/* ---- truncated after open: an error naming the path, never wrong bytes -- */

static void truncated(int backend, int direct)
{
    char *dir = mkdir_realfs("io-trunc");
    tfile f;
    make_file(&f, dir, "t.npy", 7, 2 * MiB, 64);
    if (backend == NPYLOAD_IO_URING)
        need_uring();
    if (direct)
        need_direct(f.path);
    npyl_file_info info;
    stat_all(&f, 1, &info);
    npyl_io *io = make_io(backend, direct, 8, 2, &info, 1);
    uint8_t *buf = npyl_alloc_aligned(2 * MiB + 8192, 4096);
    char err[512] = "";
    size_t bad = 0;
    /* First read opens (and for mmap maps) the file. */
    npyl_io_req r0 = {0, 128, 4096, buf + 128};
    cr_assert_eq(npyl_io_read(io, &r0, 1, &bad, NULL, err, sizeof err), 0,
                 "%s", err);
    cr_assert(truncate(f.path, 100000) == 0);
    /* A request wholly past the new end, then one straddling it. */
    npyl_io_req reqs[2] = {{0, 128, 8192, buf + 128},
                           {0, 1 * MiB, 64 * 1024, buf + 1 * MiB}};
    int rc = npyl_io_read(io, &reqs[1], 1, &bad, NULL, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_ETRUNCATED, "rc %d: %s", rc, err);
    /* The file's size now and at start, not where the read met EOF. */
    char eof_msg[600];
    snprintf(eof_msg, sizeof eof_msg, "%s: file ends at byte 100000 (%zu at "
             "start), 65536 bytes expected at offset 1048576", f.path, f.size);
    cr_assert_str_eq(err, eof_msg);
    npyl_io_req straddle = {0, 90000, 20000, buf + 90000};
    rc = npyl_io_read(io, &straddle, 1, &bad, NULL, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_ETRUNCATED, "rc %d: %s", rc, err);
    cr_assert(strstr(err, "file ends at byte 100000"), "message: %s", err);
    /* Good and bad in one call: the bad index is reported. */
    rc = npyl_io_read(io, reqs, 2, &bad, NULL, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_ETRUNCATED);
    cr_assert_eq(bad, 1);
    /* What is still there reads, but the file is no longer the one
     * validated at start: the check after the call says so. */
    rc = npyl_io_read(io, reqs, 1, &bad, NULL, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_ECHANGED, "rc %d: %s", rc, err);
    char want[600];
    snprintf(want, sizeof want, "%s: file changed since the loader started "
             "(size %zu \u2192 100000)", f.path, f.size);
    cr_assert_str_eq(err, want);
    npyl_io_destroy(io);
    npyl_free_aligned(buf);
    free_file(&f);
    tu_rmtree(dir);
}

Test(io_pread, truncated) { truncated(NPYLOAD_IO_PREAD, 0); }
Test(io_pread, truncated_direct) { truncated(NPYLOAD_IO_PREAD, 1); }
Test(io_mmap, truncated) { truncated(NPYLOAD_IO_MMAP, 0); }
Test(io_uring, truncated) { truncated(NPYLOAD_IO_URING, 0); }
Test(io_uring, truncated_direct) { truncated(NPYLOAD_IO_URING, 1); }

/* ---- a request past the size recorded at start -------------------------- */

static void past_end(int backend)
{
    if (backend == NPYLOAD_IO_URING)
        need_uring();
    char *dir = mkdir_realfs("io-end");
    tfile f;
    make_file(&f, dir, "e.npy", 3, 10000, 64);
    npyl_file_info info;
    stat_all(&f, 1, &info);
    npyl_io *io = make_io(backend, 0, 4, 1, &info, 1);
    uint8_t buf[20000];
    char err[512] = "";
    size_t bad = 9;
    npyl_io_req r = {0, 5000, 10000, buf};
    int rc = npyl_io_read(io, &r, 1, &bad, NULL, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_ETRUNCATED, "rc %d: %s", rc, err);
    cr_assert_eq(bad, 0);
    char want[600];
    snprintf(want, sizeof want,
             "%s: file ends at byte 10128, 10000 bytes expected at offset 5000",
             f.path);
    cr_assert_str_eq(err, want);
    npyl_io_destroy(io);
    free_file(&f);
    tu_rmtree(dir);
}

Test(io_pread, past_end) { past_end(NPYLOAD_IO_PREAD); }
Test(io_mmap, past_end) { past_end(NPYLOAD_IO_MMAP); }
Test(io_uring, past_end) { past_end(NPYLOAD_IO_URING); }

/* ---- replaced (write new, rename over) → ECHANGED on open --------------- */

static void replaced(int backend, int same_size)
{
    if (backend == NPYLOAD_IO_URING)
        need_uring();
    char *dir = mkdir_realfs("io-repl");
    tfile f, g;
    make_file(&f, dir, "r.npy", 11, 50000, 64);
    npyl_file_info info;
    stat_all(&f, 1, &info);
    npyl_io *io = make_io(backend, 0, 4, 1, &info, 1);
    make_file(&g, dir, "r.npy.tmp", 12, same_size ? 50000 : 40000, 64);
    cr_assert(rename(g.path, f.path) == 0);
    uint8_t buf[4096];
    char err[512] = "";
    size_t bad = 9;
    npyl_io_req r = {0, 128, 4096, buf};
    int rc = npyl_io_read(io, &r, 1, &bad, NULL, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_ECHANGED, "rc %d: %s", rc, err);
    cr_assert_eq(bad, 0);
    cr_assert(strstr(err, f.path), "message lacks the path: %s", err);
    cr_assert(strstr(err, "file changed since the loader started"), "%s", err);
    if (!same_size) {
        char want[64];
        snprintf(want, sizeof want, "(size %zu \u2192 %zu)", f.size, g.size);
        cr_assert(strstr(err, want), "message lacks '%s': %s", want, err);
    }
    npyl_io_destroy(io);
    free_file(&f);
    free_file(&g);
    tu_rmtree(dir);
}

Test(io_pread, replaced) { replaced(NPYLOAD_IO_PREAD, 0); }
Test(io_pread, replaced_same_size) { replaced(NPYLOAD_IO_PREAD, 1); }
Test(io_mmap, replaced) { replaced(NPYLOAD_IO_MMAP, 0); }
Test(io_uring, replaced_same_size) { replaced(NPYLOAD_IO_URING, 1); }

/* ---- modified in place with the descriptor open → ECHANGED ------------- */

/* Sets the file's mtime to start + 7 s: a rewrite inside the same coarse
 * clock tick as the file's creation would otherwise keep its mtime, and the
 * test would depend on timing. */
static void bump_mtime(const char *path, const npyl_file_info *start)
{
    int fd = open(path, O_WRONLY);
    cr_assert(fd >= 0);
    struct timespec ts[2];
    ts[0].tv_sec = ts[1].tv_sec = (time_t)(start->mtime_ns / 1000000000) + 7;
    ts[0].tv_nsec = ts[1].tv_nsec = (long)(start->mtime_ns % 1000000000);
    cr_assert_eq(futimens(fd, ts), 0, "%s", strerror(errno));
    close(fd);
}

/* mode 0: same-size rewrite of the data; mode 1: truncate to 0, then grow
 * back to the same size (zeros). The first read opens the file and keeps
 * its descriptor (and mapping) open; the second must not deliver. */
static void modified_in_place(int backend, int direct, int mode)
{
    if (backend == NPYLOAD_IO_URING)
        need_uring();
    char *dir = mkdir_realfs("io-inplace");
    tfile f;
    make_file(&f, dir, "p.npy", 21, 1 * MiB, 64);
    if (direct)
        need_direct(f.path);
    npyl_file_info info;
    stat_all(&f, 1, &info);
    npyl_io *io = make_io(backend, direct, 4, 2, &info, 1);
    uint8_t *buf = npyl_alloc_aligned(2 * MiB, 4096);
    char err[512] = "";
    size_t bad = 9;
    npyl_io_req r = {0, 128, 1 * MiB, buf + 128};
    cr_assert_eq(npyl_io_read(io, &r, 1, &bad, NULL, err, sizeof err), 0,
                 "%s", err);
    cr_assert(memcmp(buf + 128, f.bytes + 128, 1 * MiB) == 0);

    int fd = open(f.path, O_WRONLY);
    cr_assert(fd >= 0);
    if (mode == 0) {
        uint8_t *other = malloc(1 * MiB);
        for (size_t i = 0; i < 1 * MiB; i++)
            other[i] = (uint8_t)~f.bytes[128 + i];
        cr_assert_eq(pwrite(fd, other, 1 * MiB, 128), (ssize_t)(1 * MiB));
        free(other);
    } else {
        cr_assert_eq(ftruncate(fd, 0), 0);
        cr_assert_eq(ftruncate(fd, (off_t)f.size), 0);
    }
    close(fd);
    bump_mtime(f.path, &info);

    memset(buf, 0, 2 * MiB);
    int rc = npyl_io_read(io, &r, 1, &bad, NULL, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_ECHANGED, "rc %d (%s): %s", rc,
                 npyload_strerror(rc), err);
    cr_assert_eq(bad, 0);
    char want[600];
    snprintf(want, sizeof want, "%s: file changed since the loader started "
             "(modified in place: mtime %lld \u2192 %lld ns)", f.path,
             (long long)info.mtime_ns,
             (long long)info.mtime_ns + 7000000000ll);
    cr_assert_str_eq(err, want);
    npyl_io_destroy(io);
    npyl_free_aligned(buf);
    free_file(&f);
    tu_rmtree(dir);
}

Test(io_pread, rewritten_in_place) { modified_in_place(NPYLOAD_IO_PREAD, 0, 0); }
Test(io_pread, truncated_then_grown) { modified_in_place(NPYLOAD_IO_PREAD, 0, 1); }
Test(io_pread, rewritten_in_place_direct) { modified_in_place(NPYLOAD_IO_PREAD, 1, 0); }
Test(io_mmap, rewritten_in_place) { modified_in_place(NPYLOAD_IO_MMAP, 0, 0); }
Test(io_mmap, truncated_then_grown) { modified_in_place(NPYLOAD_IO_MMAP, 0, 1); }
Test(io_uring, rewritten_in_place) { modified_in_place(NPYLOAD_IO_URING, 0, 0); }
Test(io_uring, truncated_then_grown) { modified_in_place(NPYLOAD_IO_URING, 0, 1); }
Test(io_uring, rewritten_in_place_direct) { modified_in_place(NPYLOAD_IO_URING, 1, 0); }

/* More files than open slots: a file evicted in the middle of a call is
 * checked when it is evicted (the check after the call no longer sees it). */
Test(io_pread, rewritten_then_evicted_in_one_call)
{
    char *dir = mkdir_realfs("io-evict");
    tfile f[3];
    for (int k = 0; k < 3; k++) {
        char name[16];
        snprintf(name, sizeof name, "e%d.npy", k);
        make_file(&f[k], dir, name, 30u + (uint32_t)k, 8192, 64);
    }
    npyl_file_info info[3];
    stat_all(f, 3, info);
    npyl_io *io = make_io(NPYLOAD_IO_PREAD, 0, 1, 1, info, 3);
    uint8_t buf[3 * 8192];
    char err[512] = "";
    size_t bad = 9;
    npyl_io_req r[3];
    for (int k = 0; k < 3; k++)
        r[k] = (npyl_io_req){(uint32_t)k, 128, 8192, buf + k * 8192};
    cr_assert_eq(npyl_io_read(io, r, 3, &bad, NULL, err, sizeof err), 0,
                 "%s", err);
    /* File 2 holds the only slot and changes; the next call reads it (stale
     * bytes), then file 0, which evicts it: the eviction checks it. */
    int fd = open(f[2].path, O_WRONLY);
    cr_assert_eq(pwrite(fd, "XXXX", 4, 200), 4);
    close(fd);
    bump_mtime(f[2].path, &info[2]);
    npyl_io_req r2[2] = {r[2], r[0]};
    int rc = npyl_io_read(io, r2, 2, &bad, NULL, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_ECHANGED, "%s", err);
    cr_assert(strstr(err, f[2].path), "%s", err);
    cr_assert(strstr(err, "modified in place"), "%s", err);
    npyl_io_destroy(io);
    for (int k = 0; k < 3; k++)
        free_file(&f[k]);
    tu_rmtree(dir);
}

/* ---- a FIFO in a file's place must not block open() ---------------------- */

static void fifo_in_place(int backend)
{
    if (backend == NPYLOAD_IO_URING)
        need_uring();
    char *dir = mkdir_realfs("io-fifo");
    tfile f;
    make_file(&f, dir, "q.npy", 5, 10000, 64);
    npyl_file_info info;
    stat_all(&f, 1, &info);
    npyl_io *io = make_io(backend, 0, 4, 1, &info, 1);
    cr_assert_eq(unlink(f.path), 0);
    cr_assert_eq(mkfifo(f.path, 0600), 0, "mkfifo: %s", strerror(errno));
    alarm(20); /* a blocked open() becomes SIGALRM: a failure, not a hang */
    uint8_t buf[4096];
    char err[512] = "";
    size_t bad = 9;
    npyl_io_req r = {0, 128, 4096, buf};
    int rc = npyl_io_read(io, &r, 1, &bad, NULL, err, sizeof err);
    alarm(0);
    cr_assert_lt(rc, 0, "a FIFO must be refused, got %d", rc);
    char want[600];
    snprintf(want, sizeof want, "%s: not a regular file", f.path);
    cr_assert_str_eq(err, want);
    npyl_io_destroy(io);
    free_file(&f);
    tu_rmtree(dir);
}

Test(io_pread, fifo_in_place) { fifo_in_place(NPYLOAD_IO_PREAD); }
Test(io_mmap, fifo_in_place) { fifo_in_place(NPYLOAD_IO_MMAP); }
Test(io_uring, fifo_in_place) { fifo_in_place(NPYLOAD_IO_URING); }

/* ---- a fault in one copy of many: the right request and file ---------- */

/* Three mapped files; the middle one truncated after the first call. One
 * call of interleaved requests, every file pinned at once: the copy past
 * B's new end faults (SIGBUS caught by the guard) and the error names B
 * and that request, never an earlier one; the copies before it landed. */
static void fault_among_files(int backend)
{
    enum { NF = 3 };
    char *dir = mkdir_realfs("io-fault");
    tfile f[NF];
    const char *names[NF] = {"a.npy", "b.npy", "c.npy"};
    for (int k = 0; k < NF; k++)
        make_file(&f[k], dir, names[k], 70u + (uint32_t)k, 1 * MiB, 64);
    npyl_file_info info[NF];
    stat_all(f, NF, info);
    npyl_io *io = make_io(backend, 0, 4, NF, info, NF);
    uint8_t *buf = calloc(16, 4096);
    char err[512] = "";
    size_t bad = 0;
    for (uint32_t k = 0; k < NF; k++) { /* open (and map) every file */
        npyl_io_req r0 = {k, 128, 64, buf};
        cr_assert_eq(npyl_io_read(io, &r0, 1, &bad, NULL, err, sizeof err), 0, "%s", err);
    }
    cr_assert(truncate(f[1].path, 100000) == 0);
    /* a, b (below the new end), c, a, b past the end, c */
    const uint32_t file[6] = {0, 1, 2, 0, 1, 2};
    const uint64_t off[6] = {4096, 8192, 12288, 600000, 500000, 700000};
    npyl_io_req reqs[6];
    for (int i = 0; i < 6; i++)
        reqs[i] = (npyl_io_req){file[i], off[i], 3000, buf + (size_t)i * 4096};
    int rc = npyl_io_read(io, reqs, 6, &bad, NULL, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_ETRUNCATED, "rc %d: %s", rc, err);
    cr_assert_eq(bad, 4, "the failing request: %zu (%s)", bad, err);
    char want[600];
    snprintf(want, sizeof want, "%s: file ends at byte 100000 (%zu at start), 3000 bytes "
             "expected at offset 500000", f[1].path, f[1].size);
    cr_assert_str_eq(err, want);
    for (int i = 0; i < 4; i++)
        cr_assert(memcmp(buf + (size_t)i * 4096, f[file[i]].bytes + off[i], 3000) == 0,
                  "request %d: wrong bytes", i);
    npyl_io_destroy(io);
    free(buf);
    for (int k = 0; k < NF; k++)
        free_file(&f[k]);
    tu_rmtree(dir);
}

Test(io_mmap, fault_among_files_names_the_request) { fault_among_files(NPYLOAD_IO_MMAP); }

/* ---- mmap: SIGBUS from a truncation racing the copies ------------------ */

typedef struct race {
    const char *path;
    atomic_int started; /* reads begun by the copier */
    off_t to;
} race;

static void *truncator(void *arg)
{
    race *rc = arg;
    /* Truncate as soon as the copier is inside its second read: a 32 MiB
     * copy takes milliseconds, so this lands mid-copy most of the time. */
    while (atomic_load(&rc->started) < 2)
        ;
    if (truncate(rc->path, rc->to) != 0)
        return (void *)1;
    return NULL;
}

/* Runs in a child: exit 0 when every read returned the right bytes or
 * ETRUNCATED/ECHANGED and the truncation was seen, another code otherwise;
 * a death by signal is seen by the parent. */
static int race_child(const char *dir, int round, int backend)
{
    const size_t n = 32 * MiB;
    char name[32];
    snprintf(name, sizeof name, "big%d.npy", round);
    tfile f;
    make_file(&f, dir, name, 40u + (uint32_t)round, n, 64);
    npyl_file_info info;
    stat_all(&f, 1, &info);
    npyl_io *io = make_io(backend, 0, 4, 1, &info, 1);
    uint8_t *buf = npyl_alloc_aligned(n, 4096);
    race rr = {.path = f.path, .to = (off_t)(round % 2 ? 4096 * 3 + 100 : 0)};
    atomic_init(&rr.started, 0);
    pthread_t t;
    pthread_create(&t, NULL, truncator, &rr);
    int seen = 0;
    for (int it = 0; it < 50 && !seen; it++) {
        /* Four 8 MiB requests, the whole data. */
        npyl_io_req r[4];
        for (int k = 0; k < 4; k++)
            r[k] = (npyl_io_req){0, (uint64_t)f.data_offset + k * 8 * MiB,
                                 8 * MiB, buf + k * 8 * MiB};
        char err[512] = "";
        size_t bad = 0;
        atomic_fetch_add(&rr.started, 1);
        int rc = npyl_io_read(io, r, 4, &bad, NULL, err, sizeof err);
        if (rc == NPYLOAD_ETRUNCATED || rc == NPYLOAD_ECHANGED) {
            if (!strstr(err, f.path))
                return 3;
            seen = 1;
        } else if (rc != 0) {
            fprintf(stderr, "rc %d: %s\n", rc, err);
            return 4;
        } else if (memcmp(buf, f.bytes + f.data_offset, n) != 0) {
            return 5; /* wrong bytes delivered as success */
        }
    }
    pthread_join(t, NULL);
    npyl_io_destroy(io);
    npyl_free_aligned(buf);
    free_file(&f);
    return seen ? 0 : 6;
}

static void truncation_racing(int backend)
{
    char *dir = mkdir_realfs("io-sigbus");
    for (int round = 0; round < 6; round++) {
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0)
            _exit(race_child(dir, round, backend));
        int st = 0;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        cr_assert(!WIFSIGNALED(st), "round %d: the copier died of signal %d "
                  "(%s)", round, WTERMSIG(st), strsignal(WTERMSIG(st)));
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "round %d: child exit %d", round, WEXITSTATUS(st));
    }
    tu_rmtree(dir);
}

Test(io_mmap, truncation_racing_copies_is_an_error_not_sigbus)
{
    truncation_racing(NPYLOAD_IO_MMAP);
}

/* ---- the SIGBUS handler: installed only while mmap contexts exist ------ */

static atomic_int user_hits;
static void user_bus(int sig, siginfo_t *si, void *uc)
{
    (void)sig; (void)si; (void)uc;
    atomic_fetch_add(&user_hits, 1);
}

static npyl_io *mmap_ctx(const npyl_file_info *info)
{
    return make_io(NPYLOAD_IO_MMAP, 0, 1, 1, info, 1);
}

Test(io_mmap, sigbus_handler_chains_and_is_restored)
{
    char *dir = mkdir_realfs("io-handler");
    tfile f;
    make_file(&f, dir, "h.npy", 9, 5000, 64);
    npyl_file_info info;
    stat_all(&f, 1, &info);
    struct sigaction mine, cur;
    memset(&mine, 0, sizeof mine);
    mine.sa_sigaction = user_bus;
    mine.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&mine.sa_mask);
    cr_assert_eq(sigaction(SIGBUS, &mine, NULL), 0);

    npyl_io *pr = make_io(NPYLOAD_IO_PREAD, 0, 1, 1, &info, 1);
    sigaction(SIGBUS, NULL, &cur);
    cr_assert(cur.sa_sigaction == user_bus, "pread must install nothing");
    npyl_io *a = mmap_ctx(&info), *b = mmap_ctx(&info);
    sigaction(SIGBUS, NULL, &cur);
    cr_assert(cur.sa_sigaction != user_bus, "no handler installed for mmap");
    cr_assert(cur.sa_flags & SA_SIGINFO);
    /* A SIGBUS that is not a fault in a guarded copy reaches the user's. */
    raise(SIGBUS);
    cr_assert_eq(atomic_load(&user_hits), 1, "not chained to the user's");
    npyl_io_destroy(a);
    sigaction(SIGBUS, NULL, &cur);
    cr_assert(cur.sa_sigaction != user_bus, "removed while b still maps");
    npyl_io_destroy(b);
    sigaction(SIGBUS, NULL, &cur);
    cr_assert(cur.sa_sigaction == user_bus, "user's handler not restored");
    cr_assert_eq(cur.sa_flags & (SA_SIGINFO | SA_RESTART),
                 SA_SIGINFO | SA_RESTART);
    npyl_io_destroy(pr);
    free_file(&f);
    tu_rmtree(dir);
}

Test(io_mmap, sigbus_default_action_still_kills)
{
    /* With SIG_DFL before us, a SIGBUS that is not ours still ends the
     * process with SIGBUS (in a child). */
    char *dir = mkdir_realfs("io-dfl");
    tfile f;
    make_file(&f, dir, "d.npy", 8, 5000, 64);
    npyl_file_info info;
    stat_all(&f, 1, &info);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        signal(SIGBUS, SIG_DFL);
        npyl_io *io = mmap_ctx(&info);
        raise(SIGBUS);
        npyl_io_destroy(io);
        _exit(0);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS,
              "child status %#x: expected death by SIGBUS", st);
    free_file(&f);
    tu_rmtree(dir);
}

/* ---- stat, bad configs --------------------------------------------------- */

Test(io_common, stat_and_bad_config)
{
    npyl_file_info info;
    cr_assert_eq(npyl_io_stat("/nonexistent/npyload/x.npy", &info), -ENOENT);
    npyl_io *io = (npyl_io *)1;
    char err[256];
    npyl_io_config cfg = {.backend = NPYLOAD_IO_MMAP, .direct = 1,
                          .queue_depth = 1, .max_open = 1};
    cr_assert_eq(npyl_io_create(&io, &cfg, err, sizeof err), NPYLOAD_EINVAL);
    cr_assert_null(io);
    cfg = (npyl_io_config){.backend = NPYLOAD_IO_AUTO, .max_open = 1};
    cr_assert_eq(npyl_io_create(&io, &cfg, err, sizeof err), NPYLOAD_EINVAL);
    cfg = (npyl_io_config){.backend = NPYLOAD_IO_PREAD, .max_open = 0};
    cr_assert_eq(npyl_io_create(&io, &cfg, err, sizeof err), NPYLOAD_EINVAL);
    npyl_io_destroy(NULL);
}

/* ---- io_uring refused by seccomp ---------------------------------------- */

#if defined(__x86_64__)
#define TEST_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define TEST_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

/* Installs a filter that makes syscall `nr` fail with EPERM (everything else
 * allowed), on every thread of the process when
 * `all_threads` (SECCOMP_FILTER_FLAG_TSYNC). Criterion runs each test in its
 * own forked process, so the filter dies with it. Skips visibly when seccomp
 * is unavailable. */
static void refuse_syscall(long nr, int all_threads)
{
#ifndef TEST_AUDIT_ARCH
    (void)nr;
    (void)all_threads;
    cr_skip_test("no seccomp arch constant for this CPU in the test");
#else
    struct sock_filter prog[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, TEST_AUDIT_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog fprog = {.len = sizeof prog / sizeof prog[0],
                               .filter = prog};
    cr_assert_eq(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0, "%s",
                 strerror(errno));
    long rc = syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER,
                      all_threads ? SECCOMP_FILTER_FLAG_TSYNC : 0, &fprog);
    if (rc != 0)
        cr_skip_test("cannot install a seccomp filter here: %s",
                     rc > 0 ? "another thread's filter differs"
                            : strerror(errno));
#endif
}

Test(io_uring, refused_by_seccomp)
{
#ifndef TEST_AUDIT_ARCH
    cr_skip_test("no seccomp arch constant for this CPU in the test");
#else
    refuse_syscall(__NR_io_uring_setup, 0);
    char why[256] = "";
    cr_assert_eq(npyl_io_uring_usable(why, sizeof why), 0);
    cr_assert(why[0], "no reason given");
#ifdef NPYLOAD_HAVE_URING
    cr_assert(strstr(why, strerror(EPERM)), "reason: %s", why);
#endif
    npyl_io *io = NULL;
    char err[256] = "";
    npyl_io_config cfg = {.backend = NPYLOAD_IO_URING, .queue_depth = 8,
                          .max_open = 4};
    cr_assert_eq(npyl_io_create(&io, &cfg, err, sizeof err), NPYLOAD_ENOURING,
                 "%s", err);
    cr_assert_null(io);
    cr_assert(err[0]);
    /* pread stays available. */
    cfg.backend = NPYLOAD_IO_PREAD;
    cr_assert_eq(npyl_io_create(&io, &cfg, err, sizeof err), 0, "%s", err);
    npyl_io_destroy(io);
#endif
}

Test(io_uring, enter_refused_falls_back_to_pread)
{
    need_uring(); /* before the filter: io_uring must work to start with */
    char *dir = mkdir_realfs("io-enter");
    tfile f;
    make_file(&f, dir, "u.npy", 17, 3 * MiB + 77, 64);
    npyl_file_info info;
    stat_all(&f, 1, &info);
    refuse_syscall(__NR_io_uring_enter, 0);

    /* The probe submits a no-op: it sees the refusal. */
    char why[256] = "";
    cr_assert_eq(npyl_io_uring_usable(why, sizeof why), 0);
    cr_assert(strstr(why, "io_uring_enter"), "reason: %s", why);
    cr_assert(strstr(why, strerror(EPERM)), "reason: %s", why);

    /* A ring still sets up; its first read is refused and redone with
     * pread, and the context stays on pread. */
    npyl_io *io = make_io(NPYLOAD_IO_URING, 0, 8, 2, &info, 1);
    cr_assert_eq(npyl_io_backend_now(io), NPYLOAD_IO_URING);
    uint8_t *buf = npyl_alloc_aligned(4 * MiB, 4096);
    for (int it = 0; it < 3; it++) {
        memset(buf, 0, 4 * MiB);
        npyl_io_req r = {0, (uint64_t)it * 1000, 3 * MiB - 4096, buf};
        uint64_t got = 0;
        char err[512] = "";
        size_t bad = 9;
        int rc = npyl_io_read(io, &r, 1, &bad, &got, err, sizeof err);
        cr_assert_eq(rc, 0, "read %d: %s", it, err);
        cr_assert_eq(got, 3 * MiB - 4096);
        cr_assert(memcmp(buf, f.bytes + it * 1000, 3 * MiB - 4096) == 0,
                  "read %d: wrong bytes", it);
        cr_assert_eq(npyl_io_backend_now(io), NPYLOAD_IO_PREAD);
    }
    npyl_io_destroy(io);
    npyl_free_aligned(buf);
    free_file(&f);
    tu_rmtree(dir);
}

/* The same through the loader: started on io_uring, then io_uring_enter is
 * refused on every thread; the next epoch still delivers the right bytes
 * and the stats count the workers that fell back. */
Test(io_uring, enter_refused_loader_stats)
{
    need_uring();
    char *dir = tu_mkdtemp("io-enter-loader");
    /* Rows above the gather threshold: they are read, through the ring. */
    enum { ROW = NPYL_GATHER_MAX_DEFAULT + 3000 };
    const int64_t sshape[1] = {ROW};
    const int64_t per_file[3] = {20, 13, 31};
    cr_assert_eq(tu_write_field(dir, "x", 3, "|u1", 1, 1, sshape, per_file, 3,
                                64), 0);
    char glob[600];
    snprintf(glob, sizeof glob, "%s/x_*.npy", dir);
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", glob), 0, "%s",
                 npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 4), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, 2), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, 2), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND,
                                    NPYLOAD_IO_URING), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    for (int epoch = 0; epoch < 2; epoch++) {
        if (epoch == 1) {
            /* Workers sit idle: the epoch's batches are all consumed. */
            refuse_syscall(__NR_io_uring_enter, 1);
            cr_assert_eq(npyload_loader_set_epoch(L, 1), 0);
        }
        npyload_batch *b;
        int rc, rows = 0;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            const npyload_array *a = npyload_batch_field(b, 0);
            const int64_t *idx = npyload_batch_indices(b);
            const uint8_t *d = a->data;
            for (size_t r = 0; r < npyload_batch_size(b); r++)
                for (size_t i = 0; i < ROW; i += 997)
                    cr_assert_eq(d[r * ROW + i],
                                 tu_byte(3, (uint64_t)idx[r], i),
                                 "epoch %d sample %lld byte %zu", epoch,
                                 (long long)idx[r], i);
            rows += (int)npyload_batch_size(b);
            npyload_batch_release(b);
        }
        cr_assert_eq(rc, NPYLOAD_EOF, "epoch %d: %d %s", epoch, rc,
                     npyload_loader_errmsg(L));
        cr_assert_eq(rows, 64);
        npyload_stats st;
        cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
        cr_assert_eq(st.backend, NPYLOAD_IO_URING);
        if (epoch == 0)
            cr_assert_eq(st.uring_fallbacks, 0);
        else
            cr_assert(st.uring_fallbacks >= 1 && st.uring_fallbacks <= 2,
                      "uring_fallbacks %llu",
                      (unsigned long long)st.uring_fallbacks);
    }
    npyload_loader_destroy(L);
    tu_rmtree(dir);
}

#ifndef NPYLOAD_HAVE_URING
Test(io_uring, compiled_out)
{
    npyl_io *io = NULL;
    char err[256] = "";
    npyl_io_config cfg = {.backend = NPYLOAD_IO_URING, .queue_depth = 8,
                          .max_open = 4};
    cr_assert_eq(npyl_io_create(&io, &cfg, err, sizeof err), NPYLOAD_ENOURING);
    cr_assert(strstr(err, "built without liburing"), "%s", err);
}
#endif

/* ---- the gather path: small requests copied from a mapping -------------- */

/* Every request of a URING or PREAD context through the gather path (the
 * threshold at its maximum), against the same truth as the backends. */
#define GATHER_ALL() (gather_cfg = INT64_MAX)

Test(io_gather, random_runs_pread) { GATHER_ALL(); random_runs(NPYLOAD_IO_PREAD, 0, 1, 4, 80); }
Test(io_gather, random_runs_pread_one_open_file)
{
    /* One open file: a call's copies of several files flush whenever the
     * next file needs the only slot (NPYL_IO_BUSY). */
    GATHER_ALL();
    random_runs(NPYLOAD_IO_PREAD, 0, 1, 1, 40);
}
Test(io_gather, random_runs_uring)
{
    need_uring();
    GATHER_ALL();
    random_runs(NPYLOAD_IO_URING, 0, 8, 4, 80);
}
Test(io_gather, random_runs_uring_direct_stays_reads)
{
    need_uring();
    GATHER_ALL();
    random_runs(NPYLOAD_IO_URING, 1, 8, 4, 40);
}
Test(io_gather, many_files_pread) { GATHER_ALL(); many_files(NPYLOAD_IO_PREAD, 0, 1); }
Test(io_gather, truncated_pread) { GATHER_ALL(); truncated(NPYLOAD_IO_PREAD, 0); }
Test(io_gather, truncated_uring) { GATHER_ALL(); truncated(NPYLOAD_IO_URING, 0); }
Test(io_gather, fault_among_files_pread)
{
    GATHER_ALL();
    fault_among_files(NPYLOAD_IO_PREAD);
}
Test(io_gather, past_end_pread) { GATHER_ALL(); past_end(NPYLOAD_IO_PREAD); }
Test(io_gather, replaced_pread) { GATHER_ALL(); replaced(NPYLOAD_IO_PREAD, 0); }
Test(io_gather, replaced_same_size_uring) { GATHER_ALL(); replaced(NPYLOAD_IO_URING, 1); }
Test(io_gather, rewritten_in_place_pread) { GATHER_ALL(); modified_in_place(NPYLOAD_IO_PREAD, 0, 0); }
Test(io_gather, truncated_then_grown_pread) { GATHER_ALL(); modified_in_place(NPYLOAD_IO_PREAD, 0, 1); }
Test(io_gather, truncated_then_grown_uring) { GATHER_ALL(); modified_in_place(NPYLOAD_IO_URING, 0, 1); }
Test(io_gather, fifo_in_place_pread) { GATHER_ALL(); fifo_in_place(NPYLOAD_IO_PREAD); }
Test(io_gather, truncation_racing_copies_pread)
{
    GATHER_ALL();
    truncation_racing(NPYLOAD_IO_PREAD);
}

/* The read backends alone (no gather): the small requests of the tests above
 * otherwise go through the gather path by default. */
Test(io_reads, random_runs_pread) { gather_cfg = -1; random_runs(NPYLOAD_IO_PREAD, 0, 1, 4, 80); }
Test(io_reads, random_runs_uring)
{
    need_uring();
    gather_cfg = -1;
    random_runs(NPYLOAD_IO_URING, 0, 32, 4, 80);
}
Test(io_reads, truncated_pread) { gather_cfg = -1; truncated(NPYLOAD_IO_PREAD, 0); }
Test(io_reads, truncated_then_grown_uring)
{
    gather_cfg = -1;
    modified_in_place(NPYLOAD_IO_URING, 0, 1);
}

static npyl_io_counters counters(const npyl_io *io)
{
    npyl_io_counters c = {0};
    npyl_io_counters_add(io, &c);
    return c;
}

/* Requests up to the threshold are copied, larger ones read; the counters
 * say which, exactly; the bytes are right either way. */
static void threshold(int backend)
{
    if (backend == NPYLOAD_IO_URING)
        need_uring();
    char *dir = mkdir_realfs("io-thr");
    tfile f[2];
    make_file(&f[0], dir, "a.npy", 51, 300000, 64);
    make_file(&f[1], dir, "b.npy", 52, 200000, 16);
    npyl_file_info info[2];
    stat_all(f, 2, info);
    gather_cfg = 4096;
    npyl_io *io = make_io(backend, 0, 8, 2, info, 2);
    uint8_t *buf = malloc(64 * 8192);
    rng_state = 77;
    uint64_t want_g = 0, want_r = 0, nreq_g = 0, nreq_r = 0;
    for (int it = 0; it < 20; it++) {
        npyl_io_req req[64];
        size_t n = 1 + rnd_below(64);
        for (size_t r = 0; r < n; r++) {
            uint32_t k = (uint32_t)rnd_below(2);
            uint64_t len = rnd_below(2) ? 1 + rnd_below(4096) : 4097 + rnd_below(4000);
            uint64_t off = f[k].data_offset + rnd_below(f[k].size - f[k].data_offset - len);
            req[r] = (npyl_io_req){k, off, len, buf + r * 8192};
            if (len <= 4096) {
                want_g += len;
                nreq_g++;
            } else {
                want_r += len;
                nreq_r++;
            }
        }
        uint64_t got = 0;
        size_t bad = 0;
        char err[512] = "";
        cr_assert_eq(npyl_io_read(io, req, n, &bad, &got, err, sizeof err), 0, "%s", err);
        for (size_t r = 0; r < n; r++)
            cr_assert(memcmp(req[r].dst, f[req[r].file].bytes + req[r].offset,
                             req[r].len) == 0,
                      "iteration %d request %zu differs", it, r);
        npyl_io_counters c = counters(io);
        cr_assert_eq(c.gather_bytes, want_g);
        cr_assert_eq(c.gather_reqs, nreq_g);
        cr_assert_eq(c.read_bytes, want_r);
        cr_assert_eq(c.read_reqs, nreq_r);
        cr_assert_eq(c.gather_bytes + c.read_bytes, want_g + want_r);
    }
    npyl_io_destroy(io);
    free(buf);
    free_file(&f[0]);
    free_file(&f[1]);
    tu_rmtree(dir);
}

Test(io_gather, threshold_pread) { threshold(NPYLOAD_IO_PREAD); }
Test(io_gather, threshold_uring) { threshold(NPYLOAD_IO_URING); }

Test(io_gather, direct_reads_never_gather)
{
    char *dir = mkdir_realfs("io-gdirect");
    tfile f;
    make_file(&f, dir, "d.npy", 53, 1 * MiB, 64);
    need_direct(f.path);
    npyl_file_info info;
    stat_all(&f, 1, &info);
    GATHER_ALL();
    npyl_io *io = make_io(NPYLOAD_IO_PREAD, 1, 1, 1, &info, 1);
    uint8_t *buf = npyl_alloc_aligned(2 * MiB, 4096);
    npyl_io_req r = {0, 128, 5000, buf + 128};
    char err[512] = "";
    size_t bad = 0;
    cr_assert_eq(npyl_io_read(io, &r, 1, &bad, NULL, err, sizeof err), 0, "%s", err);
    cr_assert(memcmp(buf + 128, f.bytes + 128, 5000) == 0);
    npyl_io_counters c = counters(io);
    cr_assert_eq(c.gather_reqs, 0);
    cr_assert_eq(c.read_reqs, 1);
    npyl_io_destroy(io);
    npyl_free_aligned(buf);
    free_file(&f);
    tu_rmtree(dir);
}

/* Whether the page of `path` at `off` is in the page cache. */
static int page_cached(const char *path, size_t size, size_t off)
{
    int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);
    void *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    cr_assert(p != MAP_FAILED);
    long pg = sysconf(_SC_PAGESIZE);
    unsigned char v = 0;
    cr_assert_eq(mincore((uint8_t *)p + off / (size_t)pg * (size_t)pg, 1, &v), 0);
    munmap(p, size);
    return v & 1;
}

/* A file that is not in the page cache is read (io_uring or pread keep the
 * disk busy; a mapping would fault page by page); once it is cached, the
 * periodic residency check moves it to the gather path. */
Test(io_gather, cold_file_is_read_until_cached)
{
    char *dir = mkdir_realfs("io-cold");
    tfile f;
    make_file(&f, dir, "c.npy", 54, 8 * MiB, 64);
    int fd = open(f.path, O_RDONLY);
    cr_assert(fd >= 0);
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    if (page_cached(f.path, f.size, 4 * MiB))
        cr_skip_test("cannot evict %s from the page cache here", f.path);
    npyl_file_info info;
    stat_all(&f, 1, &info);
    npyl_io *io = make_io(NPYLOAD_IO_PREAD, 0, 1, 1, &info, 1);
    uint8_t buf[4096];
    char err[512] = "";
    size_t bad = 0;
    rng_state = 5;
    int calls = 0;
    for (; calls < 4000; calls++) {
        uint64_t off = f.data_offset + rnd_below(8 * MiB - sizeof buf);
        npyl_io_req r = {0, off, sizeof buf, buf};
        cr_assert_eq(npyl_io_read(io, &r, 1, &bad, NULL, err, sizeof err), 0, "%s", err);
        cr_assert(memcmp(buf, f.bytes + off, sizeof buf) == 0, "call %d", calls);
        npyl_io_counters c = counters(io);
        if (calls == 0) {
            cr_assert_eq(c.gather_reqs, 0, "a cold file went through the mapping");
            cr_assert_eq(c.read_reqs, 1);
            /* Now cache it all, as an earlier epoch would. */
            size_t sz = 0;
            uint8_t *all = tu_read_file(f.path, &sz);
            free(all);
        }
        if (c.gather_reqs > 0)
            break;
    }
    cr_assert_lt(calls, 4000, "a cached file never moved to the gather path");
    npyl_io_destroy(io);
    free_file(&f);
    tu_rmtree(dir);
}

/* A URING or PREAD context installs the SIGBUS handler at its first gather,
 * not at creation, and the last context's destruction restores the user's. */
Test(io_gather, sigbus_handler_from_first_gather)
{
    char *dir = mkdir_realfs("io-ghandler");
    tfile f;
    make_file(&f, dir, "h.npy", 55, 5000, 64);
    npyl_file_info info;
    stat_all(&f, 1, &info);
    struct sigaction mine, cur;
    memset(&mine, 0, sizeof mine);
    mine.sa_sigaction = user_bus;
    mine.sa_flags = SA_SIGINFO;
    sigemptyset(&mine.sa_mask);
    cr_assert_eq(sigaction(SIGBUS, &mine, NULL), 0);
    npyl_io *io = make_io(NPYLOAD_IO_PREAD, 0, 1, 1, &info, 1);
    sigaction(SIGBUS, NULL, &cur);
    cr_assert(cur.sa_sigaction == user_bus, "installed before any gather");
    uint8_t buf[100];
    char err[512] = "";
    size_t bad = 0;
    npyl_io_req r = {0, 128, sizeof buf, buf};
    cr_assert_eq(npyl_io_read(io, &r, 1, &bad, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(counters(io).gather_reqs, 1);
    sigaction(SIGBUS, NULL, &cur);
    cr_assert(cur.sa_sigaction != user_bus, "gathered without the guard");
    raise(SIGBUS);
    cr_assert_eq(atomic_load(&user_hits), 1, "not chained to the user's");
    npyl_io_destroy(io);
    sigaction(SIGBUS, NULL, &cur);
    cr_assert(cur.sa_sigaction == user_bus, "user's handler not restored");
    free_file(&f);
    tu_rmtree(dir);
}

/* ---- mappings shared by the contexts of one reader (npyl_io_maps) ------- */

/* How many areas of /proc/self/maps map `path` (its real path). */
static int mappings_of(const char *path)
{
    char real[4096];
    cr_assert(realpath(path, real), "%s", path);
    FILE *fp = fopen("/proc/self/maps", "r");
    cr_assert(fp);
    char line[8192];
    int n = 0;
    size_t rl = strlen(real);
    while (fgets(line, sizeof line, fp)) {
        size_t l = strlen(line);
        while (l && (line[l - 1] == '\n' || line[l - 1] == ' '))
            line[--l] = '\0';
        n += l >= rl && strcmp(line + l - rl, real) == 0 && (l == rl || line[l - rl - 1] == ' ');
    }
    fclose(fp);
    return n;
}

static npyl_io *make_shared_io(int backend, unsigned max_open, const npyl_file_info *info,
                               size_t nfiles, npyl_io_maps *maps)
{
    npyl_io_config cfg = {.backend = backend, .queue_depth = 1, .max_open = max_open,
                          .files = info, .nfiles = nfiles, .gather_max = INT64_MAX,
                          .random_access = 1, .maps = maps};
    npyl_io *io = NULL;
    char err[512] = "";
    cr_assert_eq(npyl_io_create(&io, &cfg, err, sizeof err), 0, "%s", err);
    return io;
}

/* n random rows (up to 5000 bytes, some across page boundaries) of random
 * files through io, checked against the files' bytes read back with read(2). */
static void shared_rows(npyl_io *io, const tfile *f, size_t nf, int n, const char *who)
{
    enum { ROWS = 16 };
    uint8_t *buf = malloc(ROWS * 5000);
    cr_assert(buf);
    for (int it = 0; it < n; it++) {
        npyl_io_req req[ROWS];
        for (size_t r = 0; r < ROWS; r++) {
            uint32_t k = (uint32_t)rnd_below(nf);
            uint64_t len = 1 + rnd_below(5000);
            uint64_t off = rnd_below(f[k].size - len + 1);
            req[r] = (npyl_io_req){k, off, len, buf + r * 5000};
        }
        size_t bad = 0;
        char err[512] = "";
        cr_assert_eq(npyl_io_read(io, req, ROWS, &bad, NULL, err, sizeof err), 0,
                     "%s: %s", who, err);
        for (size_t r = 0; r < ROWS; r++)
            cr_assert(memcmp(req[r].dst, f[req[r].file].bytes + req[r].offset, req[r].len) == 0,
                      "%s: iteration %d row %zu (file %u offset %llu len %llu) differs", who,
                      it, r, req[r].file, (unsigned long long)req[r].offset,
                      (unsigned long long)req[r].len);
    }
    free(buf);
}

Test(io_shared, one_mapping_per_file_for_every_context)
{
    /* Three contexts of one reader (the gather path of a pread context with
     * one open file for three files, a second one with two, an mmap
     * context) share one mapping per file; without the table each context
     * maps each file it reads itself. */
    enum { NF = 3 };
    char *dir = mkdir_realfs("io-shared");
    tfile f[NF];
    const size_t sizes[NF] = {MiB + 4093, 300001, 2 * MiB + 1};
    for (int k = 0; k < NF; k++) {
        char name[32];
        snprintf(name, sizeof name, "s%d.npy", k);
        make_file(&f[k], dir, name, (uint32_t)k + 40, sizes[k], 64);
    }
    npyl_file_info info[NF];
    stat_all(f, NF, info);
    npyl_io_maps *maps = NULL;
    cr_assert_eq(npyl_io_maps_create(&maps, info, NF), 0);
    npyl_io *io[3] = {make_shared_io(NPYLOAD_IO_PREAD, 1, info, NF, maps),
                      make_shared_io(NPYLOAD_IO_PREAD, 2, info, NF, maps),
                      make_shared_io(NPYLOAD_IO_MMAP, NF, info, NF, maps)};
    rng_state = 77;
    for (int round = 0; round < 4; round++)
        for (int c = 0; c < 3; c++) {
            char who[32];
            snprintf(who, sizeof who, "context %d", c);
            shared_rows(io[c], f, NF, 20, who);
            for (int k = 0; k < NF; k++)
                cr_assert_leq(mappings_of(f[k].path), 1, "%s: %d mappings", f[k].path,
                              mappings_of(f[k].path));
        }
    for (int c = 0; c < 3; c++) {
        cr_assert_gt(counters(io[c]).gather_reqs, 0, "context %d did not gather", c);
        npyl_io_destroy(io[c]);
    }
    /* The mappings belong to the table: kept until it goes. */
    for (int k = 0; k < NF; k++)
        cr_assert_eq(mappings_of(f[k].path), 1, "%s", f[k].path);
    npyl_io_maps_destroy(maps);
    for (int k = 0; k < NF; k++) {
        cr_assert_eq(mappings_of(f[k].path), 0, "%s", f[k].path);
        free_file(&f[k]);
    }
    tu_rmtree(dir);
}

Test(io_shared, a_table_of_another_file_table_is_not_used)
{
    /* A table is for the file table it was made for: a context of another
     * one (file 0 there is another file) maps privately. */
    char *dir = mkdir_realfs("io-shared2");
    tfile f[2];
    make_file(&f[0], dir, "a.npy", 5, 100000, 64);
    make_file(&f[1], dir, "b.npy", 6, 100000, 64);
    npyl_file_info ia, ib;
    stat_all(&f[0], 1, &ia);
    stat_all(&f[1], 1, &ib);
    npyl_io_maps *maps = NULL;
    cr_assert_eq(npyl_io_maps_create(&maps, &ia, 1), 0);
    npyl_io *a = make_shared_io(NPYLOAD_IO_PREAD, 1, &ia, 1, maps);
    npyl_io *b = make_shared_io(NPYLOAD_IO_PREAD, 1, &ib, 1, maps);
    rng_state = 5;
    shared_rows(a, &f[0], 1, 5, "a");
    shared_rows(b, &f[1], 1, 5, "b");
    cr_assert_eq(mappings_of(f[0].path), 1);
    cr_assert_eq(mappings_of(f[1].path), 1);
    npyl_io_destroy(b);
    cr_assert_eq(mappings_of(f[1].path), 0, "b's private mapping outlived it");
    npyl_io_destroy(a);
    npyl_io_maps_destroy(maps);
    cr_assert_eq(mappings_of(f[0].path), 0);
    free_file(&f[0]);
    free_file(&f[1]);
    tu_rmtree(dir);
}

Test(io_shared, truncated_under_a_shared_mapping_is_an_error)
{
    /* One context maps the file; it is truncated; the other context's
     * copies from the shared mapping and the first one's are errors naming
     * the file, never a SIGBUS or stale bytes. */
    char *dir = mkdir_realfs("io-shared-trunc");
    tfile f;
    make_file(&f, dir, "t.npy", 9, 2 * MiB, 64);
    npyl_file_info info;
    stat_all(&f, 1, &info);
    npyl_io_maps *maps = NULL;
    cr_assert_eq(npyl_io_maps_create(&maps, &info, 1), 0);
    npyl_io *a = make_shared_io(NPYLOAD_IO_MMAP, 1, &info, 1, maps);
    npyl_io *b = make_shared_io(NPYLOAD_IO_PREAD, 1, &info, 1, maps);
    uint8_t buf[4096];
    char err[512] = "";
    size_t bad = 0;
    npyl_io_req r0 = {0, 128, sizeof buf, buf};
    cr_assert_eq(npyl_io_read(a, &r0, 1, &bad, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(npyl_io_read(b, &r0, 1, &bad, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(mappings_of(f.path), 1);
    cr_assert(truncate(f.path, 100000) == 0);
    npyl_io_req past[2] = {{0, 200, 100, buf}, {0, MiB + 5, 3000, buf + 100}};
    for (int c = 0; c < 2; c++) {
        npyl_io *io = c ? b : a;
        err[0] = '\0';
        int rc = npyl_io_read(io, past, 2, &bad, NULL, err, sizeof err);
        cr_assert(rc != 0, "context %d: a read past the new end succeeded", c);
        cr_assert(strstr(err, f.path), "context %d: rc %d, message %s", c, rc, err);
    }
    npyl_io_destroy(a);
    npyl_io_destroy(b);
    npyl_io_maps_destroy(maps);
    free_file(&f);
    tu_rmtree(dir);
}

/* npyl_span (lib/common), which the workers wrap their reads in: time
 * spent asleep counts as blocked, CPU work without a wait counts 0 (the
 * CPU time and the voluntary switches come from one getrusage per end). */
Test(io, span_counts_a_sleep_as_blocked_and_work_as_not)
{
    npyl_span m = npyl_span_begin();
    struct timespec ts = {0, 30 * 1000 * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    uint64_t blocked = npyl_blocked_since(m);
    /* Slept 30 ms on the wall, almost no CPU: at least 25 ms off it. */
    cr_assert_geq(blocked, 25000000ull, "blocked %llu ns", (unsigned long long)blocked);
    cr_assert_lt(blocked, 60ull * 1000000000ull);
    m = npyl_span_begin();
    volatile uint64_t x = 0;
    uint64_t t0 = npyl_now_ns();
    while (npyl_now_ns() - t0 < 20000000ull) /* 20 ms of CPU, no wait */
        x += 1;
    cr_assert_eq(npyl_blocked_since(m), 0);
}
