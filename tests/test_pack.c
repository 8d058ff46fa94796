/* npyload_pack_file's promises about its output and its input: synced
 * before and after it gets its name, never a partial file under the final
 * name, force replacing regular files only (checked again at the rename),
 * a temporary that fits beside any legal name (the nameless O_TMPFILE path
 * and the named fallback), an input rewritten mid-pack refused, and every
 * numeric option range-checked by name.
 *
 * fsync is interposed below (this executable's definition wins over libc's
 * for the statically linked library): each call records what it synced and
 * whether the output's name existed at that moment. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include "npyload.h"
#include "testutil.h"

/* The library's entry with the fallback forced (npyload_zst_pack.c). */
int npyl_pack_file_ex(const char *in, const char *out,
                      const npyload_pack_options *o, npyload_pack_result *r,
                      char *err, size_t errlen, int no_tmpfile);

/* ---- fsync, recorded ----------------------------------------------------- */

typedef struct sync_call {
    mode_t mode;
    dev_t dev;
    ino_t ino;
    int out_existed; /* the watched output name existed at the call */
} sync_call;

static sync_call g_calls[64];
static int g_ncalls;
static const char *g_watch; /* the output path being watched */

int fsync(int fd)
{
    if (g_ncalls < 64) {
        struct stat st;
        sync_call *c = &g_calls[g_ncalls++];
        memset(c, 0, sizeof *c);
        if (fstat(fd, &st) == 0) {
            c->mode = st.st_mode;
            c->dev = st.st_dev;
            c->ino = st.st_ino;
        }
        c->out_existed = g_watch && access(g_watch, F_OK) == 0;
    }
    return (int)syscall(SYS_fsync, fd);
}

/* ---- helpers ------------------------------------------------------------- */

#define ROWS 4096
#define ROW_BYTES 64

/* A (ROWS, ROW_BYTES) uint8 .npy whose bytes are tu_byte(seed, row, i),
 * with its mtime set an hour back so that any rewrite changes it. */
static void write_input(const char *path, uint32_t seed)
{
    size_t n = (size_t)ROWS * ROW_BYTES;
    unsigned char *d = malloc(n);
    cr_assert(d);
    for (size_t i = 0; i < n; i++)
        d[i] = tu_byte(seed, i / ROW_BYTES, i % ROW_BYTES);
    int64_t shape[2] = {ROWS, ROW_BYTES};
    cr_assert(tu_write_npy(path, "|u1", 0, 2, shape, d, n, 64) > 0);
    free(d);
    struct timespec ts[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
    cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
}

/* The .npy.zst at `zst` decompressed (zstd skips the seek table) equals the
 * file at `npy`: the independent truth is zstd itself. */
static void expect_same(const char *zst, const char *npy)
{
    size_t zn, nn;
    unsigned char *z = tu_read_file(zst, &zn);
    unsigned char *want = tu_read_file(npy, &nn);
    cr_assert(z && want);
    unsigned char *got = malloc(nn + 1);
    size_t g = ZSTD_decompress(got, nn + 1, z, zn);
    cr_assert(!ZSTD_isError(g), "%s: %s", zst, ZSTD_getErrorName(g));
    cr_assert_eq(g, nn);
    cr_assert(memcmp(got, want, nn) == 0, "%s: bytes differ from %s", zst, npy);
    free(z);
    free(want);
    free(got);
}

/* The names in dir, sorted, joined by ' '. */
static void listing(const char *dir, char *buf, size_t len)
{
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, alphasort);
    cr_assert(n >= 0);
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(ents[i]->d_name, ".") && strcmp(ents[i]->d_name, "..")) {
            if (buf[0])
                strncat(buf, " ", len - strlen(buf) - 1);
            strncat(buf, ents[i]->d_name, len - strlen(buf) - 1);
        }
        free(ents[i]);
    }
    free(ents);
}

static npyload_pack_options small_frames(void)
{
    npyload_pack_options o;
    memset(&o, 0, sizeof o);
    o.frame_size = ROW_BYTES; /* one row per frame: many chunks */
    o.threads = 1;
    o.level = 1;
    return o;
}

/* ---- 7: synced before the name, and the name synced after ---------------- */

static void fsync_order(int no_tmpfile, int force)
{
    char *dir = tu_mkdtemp("pack");
    char *in = tu_path(dir, "a.npy");
    char *out = tu_path(dir, "a.npy.zst");
    write_input(in, 1);
    if (force) {
        FILE *f = fopen(out, "w");
        cr_assert(f);
        fputs("old", f);
        fclose(f);
    }
    npyload_pack_options o = small_frames();
    o.force = force;
    char err[512];
    g_ncalls = 0;
    g_watch = force ? NULL : out;
    int rc = npyl_pack_file_ex(in, out, &o, NULL, err, sizeof err, no_tmpfile);
    g_watch = NULL;
    cr_assert_eq(rc, 0, "%s", err);
    struct stat so, sd;
    cr_assert_eq(stat(out, &so), 0);
    cr_assert_eq(stat(dir, &sd), 0);
    int file_at = -1, dir_at = -1;
    for (int i = 0; i < g_ncalls; i++) {
        if (S_ISREG(g_calls[i].mode) && g_calls[i].ino == so.st_ino &&
            g_calls[i].dev == so.st_dev && file_at < 0)
            file_at = i;
        if (S_ISDIR(g_calls[i].mode) && g_calls[i].ino == sd.st_ino &&
            g_calls[i].dev == sd.st_dev)
            dir_at = i;
    }
    cr_assert(file_at >= 0, "the output file was never fsynced (%d calls)",
              g_ncalls);
    cr_assert(dir_at > file_at, "the directory was not fsynced after the "
              "file (file call %d, directory call %d)", file_at, dir_at);
    if (!force) {
        cr_expect(!g_calls[file_at].out_existed,
                  "the file was synced after it had its final name");
        cr_expect(g_calls[dir_at].out_existed,
                  "the directory was synced before the name was in it");
    }
    expect_same(out, in);
    free(in);
    free(out);
    tu_rmtree(dir);
}

Test(pack_durable, fsync_file_then_directory) { fsync_order(0, 0); }
Test(pack_durable, fsync_file_then_directory_force) { fsync_order(0, 1); }
Test(pack_durable, fsync_file_then_directory_named_tmp) { fsync_order(1, 0); }
Test(pack_durable, fsync_file_then_directory_named_tmp_force) { fsync_order(1, 1); }

/* ---- 6: an input rewritten in place during the pack ---------------------- */

typedef struct rewrite_ctx {
    const char *in;
    int calls;
} rewrite_ctx;

/* After the first chunk: every row of the input rewritten in place (same
 * size, same inode), as a second writer would. */
static int rewrite_once(void *arg, uint64_t done, uint64_t total)
{
    rewrite_ctx *c = arg;
    if (done > 0 && c->calls++ == 0) {
        npyload_header h;
        char e[256];
        cr_assert_eq(npyload_read_header(c->in, &h, e, sizeof e), 0, "%s", e);
        int fd = open(c->in, O_WRONLY);
        cr_assert(fd >= 0);
        unsigned char row[ROW_BYTES];
        for (uint64_t r = 0; r < ROWS; r++) {
            for (size_t i = 0; i < ROW_BYTES; i++)
                row[i] = tu_byte(2, r, i);
            cr_assert_eq(pwrite(fd, row, ROW_BYTES,
                                (off_t)(h.data_offset + r * ROW_BYTES)),
                         ROW_BYTES);
        }
        close(fd);
    }
    return 0;
}

static void rewritten_input(int no_tmpfile)
{
    char *dir = tu_mkdtemp("pack");
    char *in = tu_path(dir, "a.npy");
    char *out = tu_path(dir, "a.npy.zst");
    write_input(in, 1);
    rewrite_ctx c = {in, 0};
    npyload_pack_options o = small_frames();
    o.progress = rewrite_once;
    o.progress_arg = &c;
    char err[512] = "";
    int rc = npyl_pack_file_ex(in, out, &o, NULL, err, sizeof err, no_tmpfile);
    cr_assert(c.calls >= 1, "the rewrite did not happen mid-pack");
    cr_assert_eq(rc, NPYLOAD_ECHANGED, "rc %d (%s): a rewritten input "
                 "packed as a mix of old and new rows", rc, err);
    cr_expect(strncmp(err, in, strlen(in)) == 0, "%s", err);
    cr_expect(strstr(err, "modified in place"), "%s", err);
    char names[512];
    listing(dir, names, sizeof names);
    cr_expect_str_eq(names, "a.npy");
    free(in);
    free(out);
    tu_rmtree(dir);
}

Test(pack_input, rewritten_in_place_is_refused) { rewritten_input(0); }
Test(pack_input, rewritten_in_place_is_refused_named_tmp) { rewritten_input(1); }

/* Replaced by a rename (another inode at the path): the output would be
 * the old file's, and --rm would then remove the new one. */
static int replace_once(void *arg, uint64_t done, uint64_t total)
{
    rewrite_ctx *c = arg;
    if (done > 0 && c->calls++ == 0) {
        size_t n = strlen(c->in);
        char *tmp = malloc(n + 8);
        sprintf(tmp, "%s.new", c->in);
        write_input(tmp, 1); /* the same bytes, another inode */
        cr_assert_eq(rename(tmp, c->in), 0);
        free(tmp);
    }
    return 0;
}

Test(pack_input, replaced_by_rename_is_refused)
{
    char *dir = tu_mkdtemp("pack");
    char *in = tu_path(dir, "a.npy");
    char *out = tu_path(dir, "a.npy.zst");
    write_input(in, 1);
    rewrite_ctx c = {in, 0};
    npyload_pack_options o = small_frames();
    o.progress = replace_once;
    o.progress_arg = &c;
    char err[512] = "";
    int rc = npyload_pack_file(in, out, &o, sizeof o, NULL, 0, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_ECHANGED, "rc %d (%s)", rc, err);
    cr_expect(strstr(err, "replaced"), "%s", err);
    char names[512];
    listing(dir, names, sizeof names);
    cr_expect_str_eq(names, "a.npy");
    free(in);
    free(out);
    tu_rmtree(dir);
}

/* ---- 5: force replaces regular files only, checked at the rename too ----- */

typedef struct swap_ctx {
    const char *out;
    int calls;
} swap_ctx;

/* After the up-front check passed on a regular file: a FIFO in its place. */
static int fifo_midway(void *arg, uint64_t done, uint64_t total)
{
    swap_ctx *c = arg;
    if (done > 0 && c->calls++ == 0) {
        cr_assert_eq(unlink(c->out), 0);
        cr_assert_eq(mkfifo(c->out, 0600), 0);
    }
    return 0;
}

static void special_at_rename(int no_tmpfile)
{
    char *dir = tu_mkdtemp("pack");
    char *in = tu_path(dir, "a.npy");
    char *out = tu_path(dir, "out.npy.zst");
    write_input(in, 1);
    FILE *f = fopen(out, "w");
    cr_assert(f);
    fclose(f);
    swap_ctx c = {out, 0};
    npyload_pack_options o = small_frames();
    o.force = 1;
    o.progress = fifo_midway;
    o.progress_arg = &c;
    char err[512] = "";
    int rc = npyl_pack_file_ex(in, out, &o, NULL, err, sizeof err, no_tmpfile);
    cr_assert(c.calls >= 1, "the FIFO did not appear mid-pack");
    cr_assert_eq(rc, NPYLOAD_EINVAL, "rc %d (%s)", rc, err);
    cr_expect(strstr(err, "is a FIFO"), "%s", err);
    struct stat st;
    cr_assert_eq(lstat(out, &st), 0);
    cr_expect(S_ISFIFO(st.st_mode), "the FIFO was replaced");
    char names[512];
    listing(dir, names, sizeof names);
    cr_expect_str_eq(names, "a.npy out.npy.zst");
    free(in);
    free(out);
    tu_rmtree(dir);
}

Test(pack_output, fifo_at_the_rename_is_refused) { special_at_rename(0); }
Test(pack_output, fifo_at_the_rename_is_refused_named_tmp) { special_at_rename(1); }

/* ---- 8: names up to NAME_MAX, both temporary paths ----------------------- */

static void long_names(int no_tmpfile)
{
    char *dir = tu_mkdtemp("pack");
    char *in = tu_path(dir, "a.npy");
    write_input(in, 1);
    static const size_t lens[] = {250, 255};
    for (size_t k = 0; k < 2; k++) {
        char base[256];
        memset(base, 'n', lens[k]);
        base[lens[k]] = 0;
        char *out = tu_path(dir, base);
        npyload_pack_options o = small_frames();
        char err[512] = "";
        int rc = npyl_pack_file_ex(in, out, &o, NULL, err, sizeof err, no_tmpfile);
        cr_assert_eq(rc, 0, "%zu-character name: %s", lens[k], err);
        expect_same(out, in);
        /* without force: refused, atomically, and the file kept */
        rc = npyl_pack_file_ex(in, out, &o, NULL, err, sizeof err, no_tmpfile);
        cr_assert_eq(rc, -EEXIST, "rc %d (%s)", rc, err);
        /* with force: replaced */
        o.force = 1;
        o.level = 5;
        rc = npyl_pack_file_ex(in, out, &o, NULL, err, sizeof err, no_tmpfile);
        cr_assert_eq(rc, 0, "%zu-character name, force: %s", lens[k], err);
        expect_same(out, in);
        free(out);
    }
    char names[1024], want[1024];
    listing(dir, names, sizeof names);
    memcpy(want, "a.npy ", 6);
    memset(want + 6, 'n', 250);
    want[256] = ' ';
    memset(want + 257, 'n', 255);
    want[512] = 0;
    cr_expect_str_eq(names, want, "leftovers: %s", names);
    free(in);
    tu_rmtree(dir);
}

Test(pack_output, names_of_250_and_255_characters) { long_names(0); }
Test(pack_output, names_of_250_and_255_characters_named_tmp) { long_names(1); }

static int cancel_midway(void *arg, uint64_t done, uint64_t total)
{
    return done > 0;
}

Test(pack_output, cancelled_named_tmp_leaves_nothing)
{
    char *dir = tu_mkdtemp("pack");
    char *in = tu_path(dir, "a.npy");
    char *out = tu_path(dir, "a.npy.zst");
    write_input(in, 1);
    npyload_pack_options o = small_frames();
    o.progress = cancel_midway;
    char err[512];
    cr_assert_eq(npyl_pack_file_ex(in, out, &o, NULL, err, sizeof err, 1),
                 -ECANCELED);
    char names[512];
    listing(dir, names, sizeof names);
    cr_expect_str_eq(names, "a.npy");
    free(in);
    free(out);
    tu_rmtree(dir);
}

/* ---- 9: numeric options, named with their ranges ------------------------- */

static void bad_option(npyload_pack_options o, const char *want)
{
    char *dir = tu_mkdtemp("pack");
    char *in = tu_path(dir, "a.npy");
    char *out = tu_path(dir, "a.npy.zst");
    write_input(in, 1);
    char err[512] = "";
    int rc = npyload_pack_file(in, out, &o, sizeof o, NULL, 0, err, sizeof err);
    cr_expect_eq(rc, NPYLOAD_EINVAL, "rc %d (%s)", rc, err);
    cr_expect(strstr(err, want), "'%s' expected in '%s'", want, err);
    cr_expect(strncmp(err, in, strlen(in)) == 0, "%s", err);
    cr_expect_eq(access(out, F_OK), -1);
    free(in);
    free(out);
    tu_rmtree(dir);
}

Test(pack_options, frame_size_out_of_range)
{
    npyload_pack_options o;
    memset(&o, 0, sizeof o);
    o.frame_size = UINT64_MAX;
    bad_option(o, "frame_size 18446744073709551615 out of range (1 .. 1073741824");
    o.frame_size = (1ull << 30) + 1;
    bad_option(o, "frame_size 1073741825 out of range (1 .. 1073741824");
}

Test(pack_options, level_out_of_range)
{
    npyload_pack_options o;
    memset(&o, 0, sizeof o);
    o.level = INT_MAX;
    bad_option(o, "level 2147483647 out of range (-131072 .. 22");
    o.level = INT_MIN;
    bad_option(o, "level -2147483648 out of range (-131072 .. 22");
}

Test(pack_options, threads_out_of_range)
{
    npyload_pack_options o;
    memset(&o, 0, sizeof o);
    o.threads = -1;
    bad_option(o, "threads -1 out of range (0 .. 1024");
    o.threads = INT_MAX;
    bad_option(o, "threads 2147483647 out of range (0 .. 1024");
}

Test(pack_options, largest_frame_size_packs_one_frame)
{
    char *dir = tu_mkdtemp("pack");
    char *in = tu_path(dir, "a.npy");
    char *out = tu_path(dir, "a.npy.zst");
    write_input(in, 1);
    npyload_pack_options o;
    memset(&o, 0, sizeof o);
    o.frame_size = 1ull << 30;
    npyload_pack_result r;
    char err[512];
    cr_assert_eq(npyload_pack_file(in, out, &o, sizeof o, &r, sizeof r, err, sizeof err), 0, "%s", err);
    cr_expect_eq(r.samples_per_frame, ROWS);
    cr_expect_eq(r.frames, 2);
    expect_same(out, in);
    free(in);
    free(out);
    tu_rmtree(dir);
}

/* The ultra levels (20-22) ask for windows of 2^25..2^27, which readers
 * refuse for frames of several samples (NPYLOAD_ZST_MAX_WINDOW_LOG): pack
 * caps them, so a level-20 pack with 16 MiB frames opens and verifies. */
Test(pack_options, ultra_level_frames_of_several_samples_stay_readable)
{
    char *dir = tu_mkdtemp("pack");
    char *in = tu_path(dir, "u.npy");
    char *out = tu_path(dir, "u.npy.zst");
    enum { N = 1 << 21, W = 16 }; /* 32 MiB of 16-byte samples */
    uint8_t *data = malloc((size_t)N * W);
    cr_assert_not_null(data);
    for (size_t i = 0; i < (size_t)N * W; i++)
        data[i] = (uint8_t)(i % 251 ? 0 : i / 251); /* compressible, not constant */
    const int64_t shape[] = {N, W};
    cr_assert(tu_write_npy(in, "|u1", 0, 2, shape, data, (size_t)N * W, 64) > 0);
    free(data);
    npyload_pack_options o;
    memset(&o, 0, sizeof o);
    o.level = 20;
    o.frame_size = 16u << 20;
    o.threads = 1;
    char err[512];
    cr_assert_eq(npyload_pack_file(in, out, &o, sizeof o, NULL, 0, err, sizeof err), 0, "%s", err);
    npyload_zst_file *z = NULL;
    cr_assert_eq(npyload_zst_file_open(out, &z, err, sizeof err), 0, "%s", err);
    uint32_t bad = 0;
    cr_assert_eq(npyload_zst_file_verify(z, &bad, err, sizeof err), 0, "%s", err);
    npyload_zst_file_close(z);
    expect_same(out, in);
    free(in);
    free(out);
    tu_rmtree(dir);
}
