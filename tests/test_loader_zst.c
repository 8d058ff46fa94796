/* The loader over .npy.zst files (lib/loader/npyload_pipeline_read.c and
 * the header path of npyload_loader_fields.c). The truth is independent of
 * the loader: the bytes of every sample come from tu_byte() (the .npy files
 * are written by tests/testutil.c, then packed), the order from
 * npyload_order_indices. Damaged files are made by editing the bytes the
 * seek table points at, located with the zst module's own parser. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

#include "npyload.h"
#include "testutil.h"
#include "loader/npyload_loader_internal.h"
#include "zst/npyload_zst.h"

static const int64_t FILE_SIZES[] = {7, 1, 13, 30, 5, 8};
#define NFILES (sizeof FILE_SIZES / sizeof FILE_SIZES[0])
#define N_TOTAL 64
#define IMG_BYTES 60 /* tu_img_shape (3, 5) of <f4 */
#define LAB_BYTES 7  /* tu_lab_shape (7,) of |u1 */

/* The dataset as .npy files and as .npy.zst beside them: img frames hold 3
 * samples (frame_size 150: rows are picked from a frame), lab frames one
 * (frame_size 1: a frame decodes straight into the slot). */
typedef struct {
    char *dir;
    char img[NFILES][600], lab[NFILES][600]; /* the .npy.zst paths */
} dataset;

static void pack(const char *npy, uint64_t frame_size)
{
    npyload_pack_options o = {.frame_size = frame_size, .threads = 1};
    char err[512];
    int rc = npyload_pack_file(npy, NULL, &o, sizeof o, NULL, 0, err, sizeof err);
    cr_assert_eq(rc, 0, "pack %s: %s", npy, err);
}

static dataset make_dataset(void)
{
    dataset d;
    tu_img_lab npy;
    cr_assert_eq(tu_img_lab_make(&npy, "loader_zst", FILE_SIZES, NFILES), 0);
    d.dir = npy.dir;
    for (size_t k = 0; k < NFILES; k++) {
        char p[580];
        snprintf(p, sizeof p, "%s/img_%04zu.npy", d.dir, k);
        pack(p, 150);
        snprintf(d.img[k], sizeof d.img[k], "%s.zst", p);
        snprintf(p, sizeof p, "%s/lab_%04zu.npy", d.dir, k);
        pack(p, 1);
        snprintf(d.lab[k], sizeof d.lab[k], "%s.zst", p);
    }
    return d;
}

typedef struct {
    int backend, workers, prefetch, shuffle, direct, on_error;
    int read_ahead; /* NPYLOAD_OPT_READ_AHEAD: 0 default (on), -1 off */
    int64_t batch, rank, world, seed;
    int mixed; /* img: even files .npy, odd files .npy.zst */
} cfg;

static npyload_loader *open_loader(const dataset *d, const cfg *c)
{
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    char g[700];
    if (c->mixed) {
        char npy[NFILES][600];
        const char *list[NFILES];
        for (size_t k = 0; k < NFILES; k++) {
            snprintf(npy[k], sizeof npy[k], "%s/img_%04zu.npy", d->dir, k);
            list[k] = (k % 2) ? d->img[k] : npy[k];
        }
        cr_assert_eq(npyload_loader_add_field_files(L, "img", list, NFILES), 0, "%s",
                     npyload_loader_errmsg(L));
    } else {
        snprintf(g, sizeof g, "%s/img_*.npy.zst", d->dir);
        cr_assert_eq(npyload_loader_add_field(L, "img", g), 0, "%s", npyload_loader_errmsg(L));
    }
    snprintf(g, sizeof g, "%s/lab_*.npy.zst", d->dir);
    cr_assert_eq(npyload_loader_add_field(L, "lab", g), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, c->batch), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, c->workers ? c->workers : 1), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, c->prefetch ? c->prefetch : 1), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, c->shuffle), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SEED, c->seed), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_WORLD_SIZE, c->world ? c->world : 1), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_RANK, c->rank), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, c->backend), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DIRECT_IO, c->direct), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_ON_ERROR, c->on_error), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_READ_AHEAD, c->read_ahead), 0);
    return L;
}

/* Every row against tu_byte. */
static void check_batch(npyload_batch *b)
{
    size_t rows = npyload_batch_size(b);
    const int64_t *idx = npyload_batch_indices(b);
    const npyload_array *img = npyload_batch_field(b, 0), *lab = npyload_batch_field(b, 1);
    cr_assert_str_eq(img->descr, "<f4");
    cr_assert_str_eq(lab->descr, "|u1");
    cr_assert_eq(img->ndim, 3);
    cr_assert_eq(img->shape[1], 3);
    cr_assert_eq(img->shape[2], 5);
    cr_assert_eq(img->nbytes, rows * IMG_BYTES);
    cr_assert_eq(lab->nbytes, rows * LAB_BYTES);
    const uint8_t *pi = img->data, *pl = lab->data;
    for (size_t r = 0; r < rows; r++) {
        for (size_t i = 0; i < IMG_BYTES; i++)
            if (pi[r * IMG_BYTES + i] != tu_byte(1, (uint64_t)idx[r], i))
                cr_assert_fail("img row %zu (sample %lld) byte %zu differs", r,
                               (long long)idx[r], i);
        for (size_t i = 0; i < LAB_BYTES; i++)
            if (pl[r * LAB_BYTES + i] != tu_byte(2, (uint64_t)idx[r], i))
                cr_assert_fail("lab row %zu (sample %lld) byte %zu differs", r,
                               (long long)idx[r], i);
    }
}

/* One epoch: every batch's bytes, and the indices equal the documented
 * order. Returns the batches. */
static int64_t run_epoch(npyload_loader *L, const cfg *c, uint64_t epoch)
{
    int64_t expect[N_TOTAL * 2];
    int64_t n = npyload_order_indices(N_TOTAL, c->shuffle, c->seed, epoch, c->rank,
                                      c->world ? c->world : 1, 0, c->batch, FILE_SIZES,
                                      NFILES, 0, expect, N_TOTAL * 2);
    cr_assert_geq(n, 0);
    int64_t got = 0, nb = 0;
    npyload_batch *b;
    int rc;
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        check_batch(b);
        const int64_t *idx = npyload_batch_indices(b);
        for (size_t r = 0; r < npyload_batch_size(b); r++, got++)
            cr_assert_eq(idx[r], expect[got]);
        npyload_batch_release(b);
        nb++;
    }
    cr_assert_eq(rc, NPYLOAD_EOF, "next: %s: %s", npyload_strerror(rc), npyload_loader_errmsg(L));
    cr_assert_eq(got, n);
    cr_assert_eq(nb, npyload_loader_num_batches(L));
    return nb;
}

static int uring_usable(void)
{
    dataset d = make_dataset();
    cfg c = {.backend = NPYLOAD_IO_URING, .batch = 4};
    npyload_loader *L = open_loader(&d, &c);
    int rc = npyload_loader_start(L);
    npyload_loader_destroy(L);
    tu_rmtree(d.dir);
    return rc == 0;
}

static void matrix_ra(int backend, int direct, int mixed, int read_ahead)
{
    dataset d = make_dataset();
    int workers[] = {1, 3}, shuffles[] = {0, 1, 2};
    int64_t batches[] = {1, 5, 64, 100};
    for (size_t w = 0; w < 2; w++)
        for (size_t s = 0; s < 3; s++)
            for (size_t bi = 0; bi < 4; bi++) {
                cfg c = {.backend = backend, .workers = workers[w], .prefetch = 2 * workers[w],
                         .shuffle = shuffles[s], .batch = batches[bi], .seed = 42,
                         .direct = direct, .mixed = mixed, .read_ahead = read_ahead};
                npyload_loader *L = open_loader(&d, &c);
                cr_assert_eq(npyload_loader_start(L), 0, "start: %s", npyload_loader_errmsg(L));
                cr_assert_eq(npyload_loader_num_samples(L), N_TOTAL);
                cr_assert_eq(npyload_loader_backend(L), backend);
                run_epoch(L, &c, 0);
                cr_assert_eq(npyload_loader_set_epoch(L, 1), 0);
                run_epoch(L, &c, 1);
                npyload_stats st;
                cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
                cr_assert_eq(st.samples_delivered, 2 * N_TOTAL);
                cr_assert_eq(st.bytes_read, 2 * N_TOTAL * (IMG_BYTES + LAB_BYTES));
                cr_assert_gt(st.compressed_bytes_read, 0);
                cr_assert_geq(st.decompressed_bytes, 2 * N_TOTAL * LAB_BYTES);
                npyload_loader_destroy(L);
            }
    tu_rmtree(d.dir);
}

static void matrix(int backend, int direct, int mixed)
{
    matrix_ra(backend, direct, mixed, 0);
}

Test(loader_zst, pread) { matrix(NPYLOAD_IO_PREAD, 0, 0); }
/* READ_AHEAD off: the batch read in one go, the same bytes and order. */
Test(loader_zst, pread_without_read_ahead) { matrix_ra(NPYLOAD_IO_PREAD, 0, 1, -1); }
Test(loader_zst, mmap_without_read_ahead) { matrix_ra(NPYLOAD_IO_MMAP, 0, 0, -1); }

/* Read-ahead overlaps for real: with one worker and a slot free for every
 * batch, each batch after the first has its reads begun (handed to the
 * worker's read thread) before the batch before it is decoded. The loader
 * counts, when it starts to finish a batch, whether the next batch's reads
 * are in flight; a worker that issued them after the decode would count 0.
 * Raw .npy rows (mixed) and .npy.zst frames, every backend, O_DIRECT. */
static void overlap_case(const dataset *d, int backend, int direct, int mixed, int read_ahead)
{
    cfg c = {.backend = backend, .workers = 1, .prefetch = 32, .shuffle = 1, .batch = 5,
             .seed = 7, .direct = direct, .mixed = mixed, .read_ahead = read_ahead};
    npyload_loader *L = open_loader(d, &c);
    cr_assert_eq(npyload_loader_start(L), 0, "start: %s", npyload_loader_errmsg(L));
    int64_t nb = run_epoch(L, &c, 0);
    cr_assert_gt(nb, 2);
    npyload_stats st;
    cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
    uint64_t want = read_ahead < 0 ? 0 : (uint64_t)nb - 1;
    cr_assert_eq(st.read_ahead_batches, want, "backend %d direct %d mixed %d read_ahead %d: "
                 "%llu batches overlapped, %llu expected", backend, direct, mixed, read_ahead,
                 (unsigned long long)st.read_ahead_batches, (unsigned long long)want);
    npyload_loader_destroy(L);
}

Test(loader_zst, next_batch_read_is_in_flight_during_the_decode)
{
    dataset d = make_dataset();
    int backends[] = {NPYLOAD_IO_PREAD, NPYLOAD_IO_MMAP, NPYLOAD_IO_URING};
    int have_uring = uring_usable();
    for (int b = 0; b < 3; b++) {
        if (backends[b] == NPYLOAD_IO_URING && !have_uring)
            continue;
        for (int mixed = 0; mixed < 2; mixed++) {
            overlap_case(&d, backends[b], 0, mixed, 0);
            overlap_case(&d, backends[b], 0, mixed, -1);
            if (backends[b] != NPYLOAD_IO_MMAP)
                overlap_case(&d, backends[b], 1, mixed, 0);
        }
    }
    if (!have_uring)
        cr_log_warn("io_uring unusable here: its read-ahead case was not run");
    tu_rmtree(d.dir);
}
Test(loader_zst, mmap) { matrix(NPYLOAD_IO_MMAP, 0, 0); }
Test(loader_zst, pread_direct) { matrix(NPYLOAD_IO_PREAD, 1, 0); }
Test(loader_zst, mixed_npy_and_zst_in_one_field) { matrix(NPYLOAD_IO_PREAD, 0, 1); }
Test(loader_zst, mixed_mmap) { matrix(NPYLOAD_IO_MMAP, 0, 1); }
Test(loader_zst, uring)
{
    if (!uring_usable())
        cr_skip_test("io_uring refused here");
    matrix(NPYLOAD_IO_URING, 0, 0);
}
Test(loader_zst, uring_direct_mixed)
{
    if (!uring_usable())
        cr_skip_test("io_uring refused here");
    matrix(NPYLOAD_IO_URING, 1, 1);
}

Test(loader_zst, ranks_cover_every_sample)
{
    dataset d = make_dataset();
    for (int64_t r = 0; r < 3; r++) {
        cfg c = {.backend = NPYLOAD_IO_PREAD, .workers = 2, .shuffle = 1, .batch = 5,
                 .seed = 7, .rank = r, .world = 3};
        npyload_loader *L = open_loader(&d, &c);
        cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
        run_epoch(L, &c, 0);
        npyload_loader_destroy(L);
    }
    tu_rmtree(d.dir);
}

/* A frame that holds several of a batch's rows is decompressed once: with
 * the whole epoch in one batch, sequential or locally shuffled, the frames
 * decompress to exactly the data, once. (Decoding per row would count the
 * 3-sample img frames up to three times.) */
Test(loader_zst, a_shared_frame_is_decompressed_once)
{
    dataset d = make_dataset();
    int shuffles[] = {0, 2};
    for (size_t s = 0; s < 2; s++) {
        cfg c = {.backend = NPYLOAD_IO_PREAD, .shuffle = shuffles[s], .batch = N_TOTAL,
                 .seed = 3};
        npyload_loader *L = open_loader(&d, &c);
        cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
        run_epoch(L, &c, 0);
        npyload_stats st;
        cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
        cr_assert_eq(st.decompressed_bytes, N_TOTAL * (IMG_BYTES + LAB_BYTES), "%llu",
                     (unsigned long long)st.decompressed_bytes);
        uint64_t files = 0;
        for (size_t k = 0; k < NFILES; k++) {
            struct stat a, b;
            cr_assert_eq(stat(d.img[k], &a), 0);
            cr_assert_eq(stat(d.lab[k], &b), 0);
            files += (uint64_t)a.st_size + (uint64_t)b.st_size;
        }
        cr_assert_lt(st.compressed_bytes_read, files); /* headers and tables not read */
        npyload_loader_destroy(L);
    }
    tu_rmtree(d.dir);
}

Test(loader_zst, resume_from_state)
{
    dataset d = make_dataset();
    cfg a = {.backend = NPYLOAD_IO_PREAD, .workers = 1, .shuffle = 1, .batch = 6, .seed = 11};
    cfg b = a;
    b.backend = NPYLOAD_IO_MMAP;
    b.workers = 3;
    b.mixed = 1;
    npyload_loader *A = open_loader(&d, &a), *B = open_loader(&d, &b);
    cr_assert_eq(npyload_loader_start(A), 0, "%s", npyload_loader_errmsg(A));
    npyload_batch *x, *y;
    for (int k = 0; k < 4; k++) {
        cr_assert_eq(npyload_loader_next(A, &x), 0);
        npyload_batch_release(x);
    }
    npyload_state st;
    cr_assert_eq(npyload_loader_get_state(A, &st), 0);
    cr_assert_eq(npyload_loader_set_state(B, &st), 0, "%s", npyload_loader_errmsg(B));
    cr_assert_eq(npyload_loader_start(B), 0, "%s", npyload_loader_errmsg(B));
    int ra, rb, n = 0;
    for (;; n++) {
        ra = npyload_loader_next(A, &x);
        rb = npyload_loader_next(B, &y);
        cr_assert_eq(ra, rb);
        if (ra)
            break;
        cr_assert_eq(npyload_batch_size(x), npyload_batch_size(y));
        cr_assert_eq(memcmp(npyload_batch_indices(x), npyload_batch_indices(y),
                            npyload_batch_size(x) * sizeof(int64_t)), 0);
        check_batch(x);
        check_batch(y);
        npyload_batch_release(x);
        npyload_batch_release(y);
    }
    cr_assert_eq(ra, NPYLOAD_EOF);
    cr_assert_eq(n, npyload_loader_num_batches(A) - 4);
    npyload_loader_destroy(A);
    npyload_loader_destroy(B);
    tu_rmtree(d.dir);
}

/* ---- damaged files ---- */

static npyl_zst_index index_of(const char *path)
{
    npyl_zst_index x;
    char err[512];
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(npyl_zst_index_open(fd, path, &x, err, sizeof err), 0, "%s", err);
    close(fd);
    return x;
}

static void poke(const char *path, uint64_t off, uint8_t xor_mask)
{
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    uint8_t c;
    cr_assert_eq(pread(fd, &c, 1, (off_t)off), 1);
    c ^= xor_mask;
    cr_assert_eq(pwrite(fd, &c, 1, (off_t)off), 1);
    close(fd);
}

/* Runs an epoch that must fail; returns the loader's message (static). */
static const char *failing_epoch(const dataset *d, const cfg *c)
{
    static char msg[2048];
    npyload_loader *L = open_loader(d, c);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyload_batch *b;
    int rc;
    while ((rc = npyload_loader_next(L, &b)) == 0) {
        check_batch(b); /* whatever is delivered as success is right */
        npyload_batch_release(b);
    }
    cr_assert_lt(rc, 0, "a damaged file must surface as an error, got %d", rc);
    snprintf(msg, sizeof msg, "%s", npyload_loader_errmsg(L));
    npyload_loader_destroy(L);
    return msg;
}

static void expect_in(const char *msg, const char *what)
{
    cr_assert_not_null(strstr(msg, what), "\"%s\" not in: %s", what, msg);
}

Test(loader_zst, flipped_byte_in_a_frame_names_file_frame_and_offset)
{
    dataset d = make_dataset();
    npyl_zst_index x = index_of(d.img[3]); /* 30 samples: 10 frames */
    uint64_t mid = (x.coff[4] + x.coff[5]) / 2;
    char at[64];
    snprintf(at, sizeof at, "frame 4 at byte %llu", (unsigned long long)x.coff[4]);
    npyl_zst_index_free(&x);
    poke(d.img[3], mid, 0x40);
    int backends[] = {NPYLOAD_IO_PREAD, NPYLOAD_IO_MMAP};
    for (size_t i = 0; i < 2; i++) {
        cfg c = {.backend = backends[i], .workers = 2, .shuffle = 1, .batch = 8};
        const char *msg = failing_epoch(&d, &c);
        expect_in(msg, "img_0003.npy.zst");
        expect_in(msg, at);
    }
    tu_rmtree(d.dir);
}

Test(loader_zst, wrong_checksum_in_the_seek_table)
{
    dataset d = make_dataset();
    npyl_zst_index x = index_of(d.lab[2]);
    cr_assert(x.checksums);
    /* Entry 5's checksum: table header, 5 entries of 12 bytes, +8. */
    uint64_t at_sum = x.file_size - x.table_bytes + NPYL_ZST_SKIP_HEADER_BYTES + 5 * 12 + 8;
    char at[64];
    snprintf(at, sizeof at, "frame 5 at byte %llu", (unsigned long long)x.coff[5]);
    npyl_zst_index_free(&x);
    poke(d.lab[2], at_sum, 0x01);
    cfg c = {.backend = NPYLOAD_IO_PREAD, .batch = 8};
    const char *msg = failing_epoch(&d, &c);
    expect_in(msg, "lab_0002.npy.zst");
    expect_in(msg, at);
    expect_in(msg, "checksum");
    tu_rmtree(d.dir);
}

static void changed_after_start(int truncate_it)
{
    dataset d = make_dataset();
    int backends[] = {NPYLOAD_IO_PREAD, NPYLOAD_IO_MMAP};
    for (size_t i = 0; i < 2; i++) {
        cfg c = {.backend = backends[i], .workers = 1, .prefetch = 1, .batch = 8};
        npyload_loader *L = open_loader(&d, &c);
        cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
        if (truncate_it) {
            struct stat st;
            cr_assert_eq(stat(d.img[5], &st), 0);
            cr_assert_eq(truncate(d.img[5], st.st_size / 2), 0);
        } else {
            /* Replaced: another file renamed over it, same size even. */
            char tmp[700];
            snprintf(tmp, sizeof tmp, "%s.new", d.img[5]);
            size_t n;
            void *p = tu_read_file(d.img[5], &n);
            FILE *f = fopen(tmp, "wb");
            cr_assert_not_null(f);
            cr_assert_eq(fwrite(p, 1, n, f), n);
            fclose(f);
            free(p);
            cr_assert_eq(rename(tmp, d.img[5]), 0);
        }
        npyload_batch *b;
        int rc;
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            check_batch(b);
            npyload_batch_release(b);
        }
        cr_assert_lt(rc, 0);
        expect_in(npyload_loader_errmsg(L), "img_0005.npy.zst");
        npyload_loader_destroy(L);
        if (truncate_it) { /* repack for the next backend */
            char npy[600];
            snprintf(npy, sizeof npy, "%s/img_0005.npy", d.dir);
            npyload_pack_options o = {.frame_size = 150, .threads = 1, .force = 1};
            cr_assert_eq(npyload_pack_file(npy, NULL, &o, sizeof o, NULL, 0, NULL, 0), 0);
        }
    }
    tu_rmtree(d.dir);
}

Test(loader_zst, truncated_after_start) { changed_after_start(1); }
Test(loader_zst, replaced_after_start) { changed_after_start(0); }

/* A start-time refusal: start fails, the message names the file and says
 * `what`. */
static void refused_at_start(const dataset *d, const char *file, const char *what)
{
    cfg c = {.backend = NPYLOAD_IO_PREAD, .batch = 8};
    npyload_loader *L = open_loader(d, &c);
    int rc = npyload_loader_start(L);
    cr_assert_lt(rc, 0, "start must refuse %s", file);
    expect_in(npyload_loader_errmsg(L), file);
    expect_in(npyload_loader_errmsg(L), what);
    npyload_loader_destroy(L);
}

Test(loader_zst, plain_zstd_file_is_refused_with_what_to_do)
{
    dataset d = make_dataset();
    char npy[600];
    snprintf(npy, sizeof npy, "%s/lab_0001.npy", d.dir);
    size_t n;
    void *src = tu_read_file(npy, &n);
    size_t cap = ZSTD_compressBound(n);
    void *dst = malloc(cap);
    size_t z = ZSTD_compress(dst, cap, src, n, 3);
    cr_assert(!ZSTD_isError(z));
    FILE *f = fopen(d.lab[1], "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(dst, 1, z, f), z);
    fclose(f);
    free(src);
    free(dst);
    refused_at_start(&d, "lab_0001.npy.zst", "npyload-pack");
    tu_rmtree(d.dir);
}

Test(loader_zst, seek_table_with_huge_sizes_is_refused)
{
    dataset d = make_dataset();
    npyl_zst_index x = index_of(d.img[3]);
    uint64_t entry = x.file_size - x.table_bytes + NPYL_ZST_SKIP_HEADER_BYTES + 2 * 12;
    npyl_zst_index_free(&x);
    poke(d.img[3], entry + 4 + 3, 0x7f); /* frame 2's decompressed size: ~2 GiB */
    refused_at_start(&d, "img_0003.npy.zst", "frame 2");
    tu_rmtree(d.dir);
}

Test(loader_zst, seek_table_inconsistent_sizes_are_refused)
{
    dataset d = make_dataset();
    npyl_zst_index x = index_of(d.img[3]);
    uint64_t entry = x.file_size - x.table_bytes + NPYL_ZST_SKIP_HEADER_BYTES + 2 * 12;
    npyl_zst_index_free(&x);
    poke(d.img[3], entry, 0x01); /* frame 2's compressed size off by one */
    refused_at_start(&d, "img_0003.npy.zst", "seek table");
    tu_rmtree(d.dir);
}

/* Frames that hold no whole number of samples: a table over the same
 * frames, claiming 61 + 59 bytes for the first two data frames. */
Test(loader_zst, frames_not_holding_whole_samples_are_refused)
{
    dataset d = make_dataset();
    npyl_zst_index x = index_of(d.img[3]);
    uint64_t e1 = x.file_size - x.table_bytes + NPYL_ZST_SKIP_HEADER_BYTES + 1 * 12;
    npyl_zst_index_free(&x);
    /* 180 -> 181 and 180 -> 179 (low bytes; 180 = 0xB4). */
    poke(d.img[3], e1 + 4, 0xB4 ^ 0xB5);
    poke(d.img[3], e1 + 12 + 4, 0xB4 ^ 0xB3);
    refused_at_start(&d, "img_0003.npy.zst", "whole number");
    tu_rmtree(d.dir);
}

/* ON_ERROR skip: the rows of a damaged frame are dropped, every other row is
 * delivered, right. */
Test(loader_zst, skip_drops_the_rows_of_a_damaged_frame)
{
    dataset d = make_dataset();
    npyl_zst_index x = index_of(d.img[3]);
    uint64_t mid = (x.coff[4] + x.coff[5]) / 2;
    npyl_zst_index_free(&x);
    poke(d.img[3], mid, 0x40); /* img_0003 frame 4: samples 21+9..21+11 */
    int shuffles[] = {0, 1, 2};
    for (size_t s = 0; s < 3; s++) {
        cfg c = {.backend = NPYLOAD_IO_PREAD, .workers = 2, .shuffle = shuffles[s],
                 .batch = 8, .on_error = 1, .seed = 5};
        npyload_loader *L = open_loader(&d, &c);
        cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
        npyload_batch *b;
        int rc, seen[N_TOTAL] = {0};
        while ((rc = npyload_loader_next(L, &b)) == 0) {
            check_batch(b);
            for (size_t r = 0; r < npyload_batch_size(b); r++)
                seen[npyload_batch_indices(b)[r]]++;
            npyload_batch_release(b);
        }
        cr_assert_eq(rc, NPYLOAD_EOF, "%s", npyload_loader_errmsg(L));
        for (int i = 0; i < N_TOTAL; i++)
            cr_assert_eq(seen[i], (i >= 30 && i < 33) ? 0 : 1, "sample %d seen %d times", i,
                         seen[i]);
        npyload_stats st;
        cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
        cr_assert_eq(st.samples_skipped, 3);
        char last[1024];
        cr_assert_eq(npyload_loader_last_skip_error(L, last, sizeof last), 0);
        expect_in(last, "img_0003.npy.zst");
        npyload_loader_destroy(L);
    }
    tu_rmtree(d.dir);
}

/* A batch whose frames do not fit the worker's compressed scratch (32 MiB)
 * at once is read in rounds: 40 incompressible 1 MiB samples, one a frame,
 * all in one batch, with O_DIRECT too. */
Test(loader_zst, frames_beyond_the_scratch_are_read_in_rounds)
{
    char *dir = tu_mkdtemp("loader_zst_big");
    const int64_t sizes[] = {40}, shape[] = {1 << 20};
    cr_assert_eq(tu_write_field(dir, "big", 9, "|u1", 1, 1, shape, sizes, 1, 64), 0);
    char npy[600], zst[620];
    snprintf(npy, sizeof npy, "%s/big_0000.npy", dir);
    snprintf(zst, sizeof zst, "%s.zst", npy);
    pack(npy, 1);
    for (int direct = 0; direct < 2; direct++) {
        npyload_loader *L;
        cr_assert_eq(npyload_loader_create(&L), 0);
        const char *list[] = {zst};
        cr_assert_eq(npyload_loader_add_field_files(L, "big", list, 1), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 40), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, 1), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, 1), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, 1), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, NPYLOAD_IO_PREAD), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_DIRECT_IO, direct), 0);
        cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
        npyload_batch *b;
        cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
        cr_assert_eq(npyload_batch_size(b), 40);
        const uint8_t *p = npyload_batch_field(b, 0)->data;
        const int64_t *idx = npyload_batch_indices(b);
        for (size_t r = 0; r < 40; r++)
            for (size_t i = 0; i < (1u << 20); i += 997)
                if (p[(r << 20) + i] != tu_byte(9, (uint64_t)idx[r], i))
                    cr_assert_fail("row %zu byte %zu differs", r, i);
        npyload_batch_release(b);
        npyload_stats st;
        cr_assert_eq(npyload_loader_get_stats(L, &st, sizeof st), 0);
        cr_assert_gt(st.compressed_bytes_read, 32u << 20);
        cr_assert_eq(st.decompressed_bytes, 40u << 20);
        npyload_loader_destroy(L);
    }
    tu_rmtree(dir);
}

/* ---- a frame of many small samples (issue 21, item 13) ---- */

/* One .npy of `rows` samples of `rb` bytes (bytes 0-7 the sample's index,
 * the rest zero: highly compressible) packed into a single data frame.
 * Returns the .npy.zst path; *npy the .npy's bytes (the plain truth),
 * *data_off where its data starts. */
#define SMALL_ROW 16u
static char *one_big_frame(const char *dir, uint64_t rows, uint64_t rb, uint8_t **npy,
                           size_t *npy_len, long *data_off)
{
    uint8_t *data = calloc(rows, rb);
    cr_assert_not_null(data);
    for (uint64_t s = 0; s < rows; s++)
        for (int i = 0; i < 8; i++)
            data[s * rb + i] = (uint8_t)(s >> (8 * i));
    char *path = tu_path(dir, "small.npy");
    const int64_t shape[] = {(int64_t)rows, (int64_t)rb};
    *data_off = tu_write_npy(path, "|u1", 0, 2, shape, data, rows * rb, 64);
    cr_assert_geq(*data_off, 0);
    free(data);
    *npy = tu_read_file(path, npy_len);
    cr_assert_not_null(*npy);
    npyload_pack_options o = {.frame_size = rows * rb, .threads = 1, .force = 1};
    char err[512];
    cr_assert_eq(npyload_pack_file(path, NULL, &o, sizeof o, NULL, 0, err, sizeof err), 0, "%s", err);
    char *zst = malloc(strlen(path) + 5);
    sprintf(zst, "%s.zst", path);
    free(path);
    npyl_zst_index x = index_of(zst);
    cr_assert_eq(x.nframes, 2, "one data frame expected, got %u", x.nframes - 1);
    npyl_zst_index_free(&x);
    return zst;
}

static npyload_loader *small_loader(const char *zst, int shuffle, int workers, int64_t batch)
{
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    const char *list[] = {zst};
    cr_assert_eq(npyload_loader_add_field_files(L, "x", list, 1), 0, "%s",
                 npyload_loader_errmsg(L));
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, batch), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, workers), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_PREFETCH, 2), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, shuffle), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SEED, 3), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, NPYLOAD_IO_PREAD), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    return L;
}

/* A 32 MiB frame of 2M 16-byte samples (a few hundred KB packed): the rows
 * delivered equal the .npy's, and each worker's decode memory (its scratch
 * plus the zstd context's buffers) stays within the documented constant
 * (NPYL_ZST_WINDOW_BYTES + a zstd window of 2^NPYLOAD_ZST_MAX_WINDOW_LOG),
 * not the frame's decompressed size. */
Test(loader_zst, a_big_frame_of_small_samples_decodes_in_bounded_memory)
{
    const uint64_t rows = 2u << 20, rb = SMALL_ROW;
    char *dir = tu_mkdtemp("loader_zst_bomb");
    uint8_t *npy;
    size_t npy_len;
    long off;
    char *zst = one_big_frame(dir, rows, rb, &npy, &npy_len, &off);
    struct stat st;
    cr_assert_eq(stat(zst, &st), 0);
    cr_assert_lt(st.st_size, rows * rb / 8, "the test needs a compressible frame");
    npyload_loader *L = small_loader(zst, 1, 2, 4);
    npyload_batch *b;
    for (int k = 0; k < 6; k++) {
        cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
        const npyload_array *a = npyload_batch_field(b, 0);
        const int64_t *idx = npyload_batch_indices(b);
        cr_assert_eq(npyload_batch_size(b), 4);
        for (size_t r = 0; r < 4; r++)
            cr_assert_eq(memcmp((const uint8_t *)a->data + r * rb,
                                npy + off + (uint64_t)idx[r] * rb, rb), 0,
                         "row %zu (sample %lld) differs from the .npy", r, (long long)idx[r]);
        npyload_batch_release(b);
    }
    const size_t bound = NPYL_ZST_WINDOW_BYTES + ((size_t)1 << NPYLOAD_ZST_MAX_WINDOW_LOG) +
                         (1u << 20); /* the context itself and its block buffers */
    size_t used = 0;
    for (size_t w = 0; w < L->nworkers; w++) {
        const npyl_worker *wk = &L->workers[w];
        size_t mem = wk->rd.zdst_cap + ZSTD_sizeof_DCtx(wk->rd.dctx);
        cr_assert_leq(mem, bound,
                      "worker %zu: %zu bytes of decode scratch + %zu of zstd context for a "
                      "%llu-byte frame (bound %zu)", w, wk->rd.zdst_cap,
                      ZSTD_sizeof_DCtx(wk->rd.dctx), (unsigned long long)(rows * rb), bound);
        used += ZSTD_sizeof_DCtx(wk->rd.dctx) > 64u << 10; /* its stream buffers exist */
    }
    cr_assert_geq(used, 1, "no worker streamed the frame");
    npyload_loader_destroy(L);
    free(npy);
    free(zst);
    tu_rmtree(dir);
}

/* 24-byte rows in a 24 MiB frame read in order, 65,536 a batch: a batch's
 * rows cover 1.5 MiB of the frame, so some straddle the edges of the 1 MiB
 * chunks it streams through (1 MiB and 128 KiB are not multiples of 24);
 * every row must be assembled whole. */
Test(loader_zst, rows_straddling_the_decode_window_are_assembled)
{
    char *dir = tu_mkdtemp("loader_zst_straddle");
    const uint64_t rows = 1u << 20, rb = 24, B = 1u << 16;
    uint8_t *npy;
    size_t npy_len;
    long off;
    char *zst = one_big_frame(dir, rows, rb, &npy, &npy_len, &off);
    npyload_loader *L = small_loader(zst, 0, 1, (int64_t)B);
    npyload_batch *b;
    for (uint64_t k = 0; k < 3; k++) {
        cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
        cr_assert_eq(npyload_batch_size(b), B);
        cr_assert_eq(npyload_batch_indices(b)[0], (int64_t)(k * B));
        const uint8_t *p = npyload_batch_field(b, 0)->data;
        for (uint64_t r = 0; r < B; r++)
            if (memcmp(p + r * rb, npy + off + (k * B + r) * rb, rb) != 0)
                cr_assert_fail("batch %llu row %llu (byte %llu of the frame) differs",
                               (unsigned long long)k, (unsigned long long)r,
                               (unsigned long long)((k * B + r) * rb));
        npyload_batch_release(b);
    }
    npyload_loader_destroy(L);
    free(npy);
    free(zst);
    tu_rmtree(dir);
}

/* Rows at the start of a big frame: the frame is still decoded to its end,
 * so a byte damaged after the wanted rows fails the batch (the frame's
 * checksum is verified) instead of delivering unverified bytes. */
Test(loader_zst, rows_from_the_start_of_a_frame_still_verify_its_checksum)
{
    char *dir = tu_mkdtemp("loader_zst_bomb_tail");
    const uint64_t rows = 1u << 18; /* 4 MiB */
    uint8_t *npy;
    size_t npy_len;
    long off;
    char *zst = one_big_frame(dir, rows, SMALL_ROW, &npy, &npy_len, &off);
    npyl_zst_index x = index_of(zst);
    uint64_t end = x.coff[2] - 4; /* the frame's checksum: its last 4 bytes */
    npyl_zst_index_free(&x);
    /* Damage the content, not the checksum: 40 bytes before it. */
    poke(zst, end - 40, 0x10);
    npyload_loader *L = small_loader(zst, 0, 1, 4);
    npyload_batch *b;
    int rc = npyload_loader_next(L, &b);
    if (rc == 0) {
        const npyload_array *a = npyload_batch_field(b, 0);
        cr_assert_eq(memcmp(a->data, npy + off, 4 * SMALL_ROW), 0);
        npyload_batch_release(b);
    }
    cr_assert_lt(rc, 0, "rows 0-3 of a frame damaged near its end were delivered as success");
    expect_in(npyload_loader_errmsg(L), "small.npy.zst");
    expect_in(npyload_loader_errmsg(L), "frame 1");
    npyload_loader_destroy(L);
    free(npy);
    free(zst);
    tu_rmtree(dir);
}

/* ---- a field holding FILE and FILE.zst (issue 21, item 14) ---- */

static void expect_twins_refused(npyload_loader *L, const char *npy, const char *zst)
{
    int rc = npyload_loader_start(L);
    cr_assert_eq(rc, NPYLOAD_EINVAL, "start: %d (%s): a field holding %s and %s must be refused",
                 rc, npyload_loader_errmsg(L), npy, zst);
    expect_in(npyload_loader_errmsg(L), npy);
    expect_in(npyload_loader_errmsg(L), zst);
    expect_in(npyload_loader_errmsg(L), "twice");
    npyload_loader_destroy(L);
}

/* Packing without --rm, then a glob over the directory: every sample
 * twice. Refused at start, naming both files; a glob that picks one form
 * still loads. */
Test(loader_zst, a_glob_matching_a_file_and_its_packed_twin_is_refused)
{
    dataset d = make_dataset(); /* img_*.npy and img_*.npy.zst side by side */
    char g[700], npy0[700];
    snprintf(g, sizeof g, "%s/img_*", d.dir);
    snprintf(npy0, sizeof npy0, "%s/img_0000.npy", d.dir);
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "img", g), 0, "%s", npyload_loader_errmsg(L));
    expect_twins_refused(L, npy0, d.img[0]);
    /* One form each: both load, the same number of samples. */
    const char *forms[] = {"%s/img_*.npy", "%s/img_*.npy.zst"};
    for (int i = 0; i < 2; i++) {
        snprintf(g, sizeof g, forms[i], d.dir);
        cr_assert_eq(npyload_loader_create(&L), 0);
        cr_assert_eq(npyload_loader_add_field(L, "img", g), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 1), 0);
        cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
        cr_assert_eq(npyload_loader_num_batches(L), N_TOTAL);
        npyload_loader_destroy(L);
    }
    tu_rmtree(d.dir);
}

/* An explicit list too, whatever the spelling of the .npy ("dir/./x"). */
Test(loader_zst, a_file_list_holding_a_file_and_its_packed_twin_is_refused)
{
    dataset d = make_dataset();
    char npy3[700];
    snprintf(npy3, sizeof npy3, "%s/./img_0003.npy", d.dir);
    const char *list[] = {d.img[0], d.img[1], npy3, d.img[3]};
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field_files(L, "img", list, 4), 0);
    expect_twins_refused(L, npy3, d.img[3]);
    /* Twins in different fields are fine: each field holds each sample once. */
    const char *a[] = {npy3}, *b[] = {d.img[3]};
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field_files(L, "a", a, 1), 0);
    cr_assert_eq(npyload_loader_add_field_files(L, "b", b, 1), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 1), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyload_loader_destroy(L);
    tu_rmtree(d.dir);
}

/* Stored narrowed twins (issue 35, item 8): '*.npy' matches FILE.npy and
 * FILE.narrow.npy (npyload-pack --narrow --store without --rm), every
 * sample twice. Refused at start naming both, as the .npy.zst twin is; so
 * are FILE.npy.zst and FILE.narrow.npy together (two forms of one source,
 * the source gone). '*.narrow.npy' alone loads, and a plain file that only
 * carries the name (no value table) is not anybody's twin. */
Test(loader_zst, a_glob_matching_a_file_and_its_narrowed_twin_is_refused)
{
    char *dir = tu_mkdtemp("loader_zst_narrow_twin");
    const int64_t shape[2] = {6, 4};
    float v[24];
    for (int i = 0; i < 24; i++)
        v[i] = (float)(i % 3) * 0.5f;
    char src[2][600], nar[2][700], g[700];
    for (int k = 0; k < 2; k++) {
        snprintf(src[k], sizeof src[k], "%s/x_%04d.npy", dir, k);
        cr_assert_geq(tu_write_npy(src[k], "<f4", 0, 2, shape, v, sizeof v, 64), 0);
        npyload_pack_options o = {.threads = 1, .narrow = 1, .store = 1};
        char err[512] = "";
        cr_assert_eq(npyload_pack_file(src[k], NULL, &o, sizeof o, NULL, 0, err, sizeof err),
                     0, "%s", err);
        snprintf(nar[k], sizeof nar[k], "%s/x_%04d.narrow.npy", dir, k);
    }
    npyload_loader *L;
    snprintf(g, sizeof g, "%s/x_*.npy", dir);
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", g), 0, "%s", npyload_loader_errmsg(L));
    expect_twins_refused(L, src[0], nar[0]);
    /* An explicit list, another spelling of the source. */
    char spelled[700];
    snprintf(spelled, sizeof spelled, "%s/./x_0001.npy", dir);
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field_files(L, "x", (const char *[]){nar[1], spelled}, 2),
                 0);
    expect_twins_refused(L, spelled, nar[1]);
    /* The narrowed form alone loads: the values, 12 samples. */
    snprintf(g, sizeof g, "%s/x_*.narrow.npy", dir);
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field(L, "x", g), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 6), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyload_batch *b;
    cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(memcmp(npyload_batch_field(b, 0)->data, v, sizeof v), 0);
    npyload_batch_release(b);
    cr_assert_eq(npyload_loader_num_batches(L), 2);
    npyload_loader_destroy(L);
    /* Two packed forms of x_0000.npy, the source removed. */
    npyload_pack_options o = {.threads = 1, .narrow = 1};
    char err[512] = "", zst[700];
    cr_assert_eq(npyload_pack_file(src[0], NULL, &o, sizeof o, NULL, 0, err, sizeof err), 0,
                 "%s", err);
    snprintf(zst, sizeof zst, "%s.zst", src[0]);
    cr_assert_eq(unlink(src[0]), 0);
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field_files(L, "x", (const char *[]){nar[0], zst}, 2), 0);
    expect_twins_refused(L, nar[0], zst);
    /* A plain .npy named like a narrowed one is nobody's twin. */
    char plain[700];
    snprintf(plain, sizeof plain, "%s/y.narrow.npy", dir);
    cr_assert_geq(tu_write_npy(plain, "<f4", 0, 2, shape, v, sizeof v, 64), 0);
    snprintf(g, sizeof g, "%s/y.npy", dir);
    cr_assert_geq(tu_write_npy(g, "<f4", 0, 2, shape, v, sizeof v, 64), 0);
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field_files(L, "y", (const char *[]){g, plain}, 2), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 6), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyload_loader_destroy(L);
    tu_rmtree(dir);
}

/* A huge BATCH_SIZE over a small packed field: the per-worker .npy.zst
 * state is sized, like the slots, for the rows a batch can hold (the whole
 * field here), not for BATCH_SIZE (2^31 rows of frame bookkeeping would be
 * tens of GiB). One batch holds every sample, equal to the .npy's rows. */
Test(loader_zst, huge_batch_size_over_a_small_field_sizes_for_the_field)
{
    dataset d = make_dataset();
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    const char *imgs[NFILES];
    for (size_t k = 0; k < NFILES; k++)
        imgs[k] = d.img[k];
    cr_assert_eq(npyload_loader_add_field_files(L, "img", imgs, NFILES), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, (int64_t)1 << 31), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, 2), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, NPYLOAD_IO_PREAD), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyload_batch *b;
    cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
    cr_assert_eq(npyload_batch_size(b), N_TOTAL);
    const uint8_t *got = npyload_batch_field(b, 0)->data;
    for (int64_t s = 0; s < N_TOTAL; s++)
        for (size_t i = 0; i < IMG_BYTES; i++)
            cr_assert_eq(got[s * IMG_BYTES + i], tu_byte(1, (uint64_t)s, i), "sample %ld", (long)s);
    npyload_batch_release(b);
    cr_assert_eq(npyload_loader_next(L, &b), NPYLOAD_EOF);
    npyload_loader_destroy(L);
    tu_rmtree(d.dir);
}

/* ---- lossless narrowing (npyload-pack --narrow) ---- */

/* 256 float32 bit patterns: quiet and signalling NaNs with payloads, both
 * zeros, denormals, both infinities, the 8-bit gray levels k/255. */
static void narrow_patterns(uint32_t pats[256])
{
    static const uint32_t odd[] = {0x7fc00000u, 0x7fc00001u, 0xffc00123u, 0x7f800001u,
                                   0x80000000u, 0x00000000u, 0x00000001u, 0x807fffffu,
                                   0x7f800000u, 0xff800000u};
    size_t n = 0;
    for (; n < sizeof odd / sizeof odd[0]; n++)
        pats[n] = odd[n];
    for (int k = 1; n < 256; k++, n++) {
        float v = (float)k / 255.0f;
        memcpy(&pats[n], &v, 4);
    }
}

#define NAR_ROWS 40
#define NAR_VALS 51 /* (3, 17) float32 per sample */

/* Writes dir/NAME_k.npy: NAR_ROWS samples whose value j of sample s is
 * pats[(s * 7 + j * 13 + k) % npats] (every pattern used), packed narrow
 * (frame_size small: frames of several samples) or plain. Returns the
 * .npy's values for checking. */
static uint32_t *narrow_file(const char *dir, const char *name, int k, const uint32_t *pats,
                             size_t npats, int narrow, uint64_t frame_size, char *zst,
                             size_t zlen)
{
    uint32_t *v = malloc(sizeof(uint32_t) * NAR_ROWS * NAR_VALS);
    for (size_t s = 0; s < NAR_ROWS; s++)
        for (size_t j = 0; j < NAR_VALS; j++)
            v[s * NAR_VALS + j] = pats[(s * 7 + j * 13 + (size_t)k) % npats];
    char p[560];
    snprintf(p, sizeof p, "%s/%s_%04d.npy", dir, name, k);
    const int64_t shape[3] = {NAR_ROWS, 3, 17};
    cr_assert_geq(tu_write_npy(p, "<f4", 0, 3, shape, v, sizeof(uint32_t) * NAR_ROWS * NAR_VALS,
                               64), 0);
    npyload_pack_options o = {.frame_size = frame_size, .threads = 1, .narrow = narrow};
    npyload_pack_result r;
    char err[512];
    int rc = npyload_pack_file(p, NULL, &o, sizeof o, &r, sizeof r, err, sizeof err);
    cr_assert_eq(rc, 0, "pack %s: %s", p, err);
    cr_assert_eq(r.narrow_values, narrow ? npats : 0);
    snprintf(zst, zlen, "%s.zst", p);
    return v;
}

Test(loader_zst, narrowed_files_deliver_every_float32_pattern_bit_for_bit)
{
    char *dir = tu_mkdtemp("loader_zst_narrow");
    uint32_t pats[256];
    narrow_patterns(pats);
    /* file 0 narrowed, frames of several samples; file 1 plain; file 2
     * narrowed, one sample a frame (decoded in place) */
    char zst[3][600];
    uint32_t *vals[3];
    vals[0] = narrow_file(dir, "n", 0, pats, 256, 1, 500, zst[0], sizeof zst[0]);
    vals[1] = narrow_file(dir, "n", 1, pats, 256, 0, 500, zst[1], sizeof zst[1]);
    vals[2] = narrow_file(dir, "n", 2, pats, 256, 1, 1, zst[2], sizeof zst[2]);
    int backends[] = {NPYLOAD_IO_PREAD, NPYLOAD_IO_MMAP};
    for (int bi = 0; bi < 2; bi++)
        for (int w = -1; w <= 3; w += 2) { /* sync, 1, 3 workers */
            npyload_loader *L;
            cr_assert_eq(npyload_loader_create(&L), 0);
            const char *list[3] = {zst[0], zst[1], zst[2]};
            cr_assert_eq(npyload_loader_add_field_files(L, "x", list, 3), 0, "%s",
                         npyload_loader_errmsg(L));
            cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 9), 0);
            cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_NUM_WORKERS, w), 0);
            cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_SHUFFLE, NPYLOAD_SHUFFLE_FULL), 0);
            cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_IO_BACKEND, backends[bi]), 0);
            cr_assert_eq(npyload_loader_start(L), 0, "start: %s", npyload_loader_errmsg(L));
            npyload_batch *b;
            int64_t seen = 0;
            while (npyload_loader_next(L, &b) == 0) {
                const npyload_array *a = npyload_batch_field(b, 0);
                cr_assert_str_eq(a->descr, "<f4");
                const int64_t *idx = npyload_batch_indices(b);
                for (size_t r = 0; r < npyload_batch_size(b); r++) {
                    int64_t s = idx[r], file = s / NAR_ROWS, row = s % NAR_ROWS;
                    const uint32_t *want = vals[file] + row * NAR_VALS;
                    cr_assert_eq(memcmp((const uint8_t *)a->data + r * NAR_VALS * 4, want,
                                        NAR_VALS * 4), 0,
                                 "backend %d workers %d: sample %lld differs", backends[bi], w,
                                 (long long)s);
                }
                seen += (int64_t)npyload_batch_size(b);
                npyload_batch_release(b);
            }
            cr_assert_eq(seen, 3 * NAR_ROWS, "%s", npyload_loader_errmsg(L));
            npyload_loader_destroy(L);
        }

    /* zstd -d (libzstd over the whole file: skippable frames skipped) gives
     * a valid .npy of the codes: '|u1', the same shape, code k the k-th
     * smallest bit pattern. */
    size_t zn = 0;
    uint8_t *zf = tu_read_file(zst[0], &zn);
    size_t cap = 64u << 10;
    uint8_t *npy = malloc(cap);
    size_t got = ZSTD_decompress(npy, cap, zf, zn);
    cr_assert(!ZSTD_isError(got), "%s", ZSTD_getErrorName(got));
    npyload_header h;
    char err[512];
    cr_assert_eq(npyload_parse_header(npy, got, got, "codes", &h, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(h.descr, "|u1");
    cr_assert_eq(h.ndim, 3);
    cr_assert_eq(h.shape[0], NAR_ROWS);
    cr_assert_eq(h.data_bytes, NAR_ROWS * NAR_VALS);
    uint32_t sorted[256];
    memcpy(sorted, pats, sizeof sorted);
    for (int i = 1; i < 256; i++) /* insertion sort: 256 values */
        for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            uint32_t t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
    for (size_t i = 0; i < NAR_ROWS * NAR_VALS; i++)
        cr_assert_eq(sorted[npy[h.data_offset + i]], vals[0][i], "code %zu", i);
    free(npy);
    free(zf);
    for (int k = 0; k < 3; k++)
        free(vals[k]);
    tu_rmtree(dir);
}

Test(loader_zst, narrowing_refuses_257_distinct_values)
{
    char *dir = tu_mkdtemp("loader_zst_narrow257");
    uint32_t pats[257];
    narrow_patterns(pats);
    float extra = 2.5f; /* not among the 256 */
    memcpy(&pats[256], &extra, 4);
    uint32_t *v = malloc(sizeof(uint32_t) * NAR_ROWS * NAR_VALS);
    for (size_t i = 0; i < NAR_ROWS * NAR_VALS; i++)
        v[i] = pats[i % 257];
    char p[600];
    snprintf(p, sizeof p, "%s/w_0000.npy", dir);
    const int64_t shape[3] = {NAR_ROWS, 3, 17};
    cr_assert_geq(tu_write_npy(p, "<f4", 0, 3, shape, v, sizeof(uint32_t) * NAR_ROWS * NAR_VALS,
                               64), 0);
    npyload_pack_options o = {.threads = 1, .narrow = 1};
    char err[512] = "";
    int rc = npyload_pack_file(p, NULL, &o, sizeof o, NULL, 0, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_EUNSUPPORTED, "%d: %s", rc, err);
    cr_assert_not_null(strstr(err, p), "%s", err);
    cr_assert_not_null(strstr(err, "more than 256 distinct values"), "%s", err);
    char z[620];
    snprintf(z, sizeof z, "%s.zst", p);
    cr_assert_neq(access(z, F_OK), 0, "no output may be left");
    /* one-byte data cannot be narrowed further */
    snprintf(p, sizeof p, "%s/b_0000.npy", dir);
    cr_assert_geq(tu_write_npy(p, "|u1", 0, 3, shape, v, NAR_ROWS * NAR_VALS, 64), 0);
    rc = npyload_pack_file(p, NULL, &o, sizeof o, NULL, 0, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_EUNSUPPORTED, "%d: %s", rc, err);
    cr_assert_not_null(strstr(err, "cannot be narrowed"), "%s", err);
    free(v);
    tu_rmtree(dir);
}

Test(loader_zst, a_damaged_value_table_is_refused_at_start)
{
    char *dir = tu_mkdtemp("loader_zst_narrowbad");
    uint32_t pats[256];
    narrow_patterns(pats);
    char zst[600];
    uint32_t *v = narrow_file(dir, "d", 0, pats, 256, 1, 500, zst, sizeof zst);
    npyl_zst_index x = index_of(zst);
    cr_assert_not_null(x.narrow);
    cr_assert_eq(x.narrow->count, 256);
    uint64_t table_at = x.frame0_bytes, table_end = x.coff[1];
    npyl_zst_index_free(&x);
    cr_assert_gt(table_end, table_at + 24);
    /* a byte in the middle of the table's compressed frame */
    poke(zst, table_at + (table_end - table_at) / 2 + 8, 0x40);
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field_files(L, "x", (const char *[]){zst}, 1), 0);
    int rc = npyload_loader_start(L);
    cr_assert_eq(rc, NPYLOAD_EFORMAT, "%d: %s", rc, npyload_loader_errmsg(L));
    cr_assert_not_null(strstr(npyload_loader_errmsg(L), zst), "%s", npyload_loader_errmsg(L));
    cr_assert_not_null(strstr(npyload_loader_errmsg(L), "value table"), "%s",
                       npyload_loader_errmsg(L));
    npyload_loader_destroy(L);
    free(v);
    tu_rmtree(dir);
}

/* A stored narrowed file (--narrow --store) whose trailer's table names a
 * dtype that its values' size contradicts, or no dtype at all: a hostile
 * or damaged file whose table still carries a valid zstd checksum. The
 * loader took the descr and the item size from the table as they were, so
 * a '<f8' table of 4-byte values made rows of 4 bytes a value read as 8
 * (the host transform read past its buffer; the device tables were indexed
 * in 8-byte steps over 4-byte tables). Refused at start, naming the file. */
static void lying_table(const char *dir, const char *descr, unsigned w, char *out, size_t len)
{
    uint8_t codes[400 * 6];
    for (size_t i = 0; i < sizeof codes; i++)
        codes[i] = (uint8_t)(i % 3);
    snprintf(out, len, "%s/lie_%s_%u.narrow.npy", dir, descr[0] ? descr + 1 : "empty", w);
    const int64_t shape[3] = {400, 2, 3};
    cr_assert_geq(tu_write_npy(out, "|u1", 0, 3, shape, codes, sizeof codes, 64), 0);
    npyl_zst_narrow_scan s;
    npyl_zst_narrow_begin(&s, w);
    uint64_t vals[3] = {0x3ff0000000000000ull, 0x4000000000000000ull, 0xbff0000000000000ull};
    unsigned char raw[3 * 8];
    for (int k = 0; k < 3; k++)
        memcpy(raw + k * w, (unsigned char *)&vals[k] + 8 - w, w);
    npyl_zst_narrow_add(&s, raw, 3 * (size_t)w);
    unsigned char *t = NULL;
    size_t tn = 0;
    cr_assert_eq(npyl_zst_store_trailer(&s, descr, &t, &tn), 0);
    FILE *fp = fopen(out, "ab");
    cr_assert_not_null(fp);
    cr_assert_eq(fwrite(t, 1, tn, fp), tn);
    fclose(fp);
    free(t);
}

Test(loader_zst, a_value_table_whose_dtype_contradicts_its_values_is_refused)
{
    char *dir = tu_mkdtemp("loader_zst_lie");
    static const struct {
        const char *descr;
        unsigned w;
    } lies[] = {{"<f8", 4}, {"<f4", 8}, {"<f2", 4}, {"|u1", 2}, {"", 4},
                {"zz9", 4}, {"<f4 ", 4}, {"<c4", 4}, {"<M8", 8}};
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        char p[700];
        lying_table(dir, lies[i].descr, lies[i].w, p, sizeof p);
        npyload_loader *L;
        cr_assert_eq(npyload_loader_create(&L), 0);
        cr_assert_eq(npyload_loader_add_field_files(L, "x", (const char *[]){p}, 1), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 400), 0);
        npyload_transform tr = NPYLOAD_TRANSFORM_INIT;
        tr.dtype = NPYLOAD_DTYPE_FLOAT32;
        cr_assert_eq(npyload_loader_set_transform(L, "x", &tr, sizeof tr), 0);
        int rc = npyload_loader_start(L);
        const char *m = npyload_loader_errmsg(L);
        cr_assert_eq(rc, NPYLOAD_EFORMAT, "'%s' x %u bytes: %d: %s", lies[i].descr, lies[i].w,
                     rc, m);
        cr_assert(strstr(m, p) && strstr(m, "value table"), "%s", m);
        npyload_loader_destroy(L);
    }
    /* the honest table of the same shape loads and delivers its values */
    char p[700];
    lying_table(dir, "<f4", 4, p, sizeof p);
    npyload_loader *L;
    cr_assert_eq(npyload_loader_create(&L), 0);
    cr_assert_eq(npyload_loader_add_field_files(L, "x", (const char *[]){p}, 1), 0);
    cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 4), 0);
    cr_assert_eq(npyload_loader_start(L), 0, "%s", npyload_loader_errmsg(L));
    npyload_batch *b;
    cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
    const npyload_array *a = npyload_batch_field(b, 0);
    cr_assert_str_eq(a->descr, "<f4");
    cr_assert_eq(a->nbytes, 4 * 6 * 4, "4 rows of 6 float32");
    npyload_batch_release(b);
    npyload_loader_destroy(L);
    tu_rmtree(dir);
}

/* A stored narrowed file that lost its last 1..12 bytes (the trailer's tag
 * or length), or more of its trailer (issue 35, item 7): refused at start
 * naming the file, never loaded as its uint8 codes, as long as the value
 * table's frame magic is left after the codes. Whole, it delivers the
 * values; with less than that magic after the codes (the whole trailer
 * gone) nothing tells it from a plain .npy of bytes: loaded as numpy reads
 * it, '|u1'. */
Test(loader_zst, a_stored_narrowed_file_cut_short_is_refused)
{
    char *dir = tu_mkdtemp("loader_zst_narrow_cut");
    const int64_t shape[2] = {6, 4};
    float v[24];
    for (int i = 0; i < 24; i++)
        v[i] = (float)(i % 3) * 0.25f;
    char src[600], nar[700], cut[700];
    snprintf(src, sizeof src, "%s/s.npy", dir);
    snprintf(nar, sizeof nar, "%s/s.narrow.npy", dir);
    snprintf(cut, sizeof cut, "%s/cut.npy", dir);
    cr_assert_geq(tu_write_npy(src, "<f4", 0, 2, shape, v, sizeof v, 64), 0);
    npyload_pack_options o = {.threads = 1, .narrow = 1, .store = 1};
    char err[512] = "";
    cr_assert_eq(npyload_pack_file(src, nar, &o, sizeof o, NULL, 0, err, sizeof err), 0, "%s",
                 err);
    size_t n;
    unsigned char *good = tu_read_file(nar, &n);
    cr_assert_not_null(good);
    npyload_header h;
    cr_assert_eq(npyload_read_header(nar, &h, err, sizeof err), 0, "%s", err);
    size_t data_end = (size_t)(h.data_offset + h.data_bytes), trailer = n - data_end;
    for (size_t lost = 0; lost <= trailer; lost++) {
        if (lost > 16 && lost < trailer - 6)
            lost = trailer - 6; /* a few cuts into the table, then past it */
        FILE *f = fopen(cut, "wb");
        cr_assert_eq(fwrite(good, 1, n - lost, f), n - lost);
        fclose(f);
        npyload_loader *L;
        cr_assert_eq(npyload_loader_create(&L), 0);
        cr_assert_eq(npyload_loader_add_field_files(L, "x", (const char *[]){cut}, 1), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 6), 0);
        int rc = npyload_loader_start(L);
        npyload_batch *b;
        if (lost == 0 || lost > trailer - 4) {
            cr_assert_eq(rc, 0, "lost %zu: %s", lost, npyload_loader_errmsg(L));
            cr_assert_eq(npyload_loader_next(L, &b), 0);
            const npyload_array *a = npyload_batch_field(b, 0);
            cr_assert_str_eq(a->descr, lost ? "|u1" : "<f4", "lost %zu", lost);
            if (!lost)
                cr_assert_eq(memcmp(a->data, v, sizeof v), 0);
            npyload_batch_release(b);
        } else {
            cr_assert_lt(rc, 0, "lost %zu of %zu trailer bytes: loaded as %s", lost, trailer,
                         rc == 0 && npyload_loader_next(L, &b) == 0
                             ? npyload_batch_field(b, 0)->descr : "?");
            cr_assert_not_null(strstr(npyload_loader_errmsg(L), cut), "lost %zu: %s", lost,
                               npyload_loader_errmsg(L));
        }
        npyload_loader_destroy(L);
    }
    /* npyload_narrow_stored: the facts of the whole file, nothing for the
     * source, the loader's refusal for a cut trailer (issue 35, item 18). */
    uint32_t values = 0, width = 0;
    char vdescr[NPYLOAD_DESCR_LEN] = "";
    cr_assert_eq(npyload_narrow_stored(nar, &h, &values, &width, vdescr, err, sizeof err), 1,
                 "%s", err);
    cr_assert_eq(values, 3);
    cr_assert_eq(width, 4);
    cr_assert_str_eq(vdescr, "<f4");
    npyload_header hs;
    cr_assert_eq(npyload_read_header(src, &hs, err, sizeof err), 0);
    cr_assert_eq(npyload_narrow_stored(src, &hs, &values, NULL, NULL, err, sizeof err), 0);
    FILE *f = fopen(cut, "wb");
    cr_assert_eq(fwrite(good, 1, n - 5, f), n - 5);
    fclose(f);
    npyload_header hc;
    cr_assert_eq(npyload_read_header(cut, &hc, err, sizeof err), 0);
    cr_assert_eq(npyload_narrow_stored(cut, &hc, NULL, NULL, NULL, err, sizeof err),
                 NPYLOAD_ETRUNCATED);
    cr_assert_not_null(strstr(err, cut), "%s", err);
    free(good);
    tu_rmtree(dir);
}

/* Files of no values narrowed (0 samples, and samples of a zero-length
 * axis): --narrow --store divided by the zero row size (SIGFPE; UBSan
 * "division by zero"), and --narrow wrote a table of 0 values that every
 * reader then refused as inconsistent. Both forms pack, an empty file
 * loads beside a non-empty narrowed one, and the values are delivered. */
Test(loader_zst, narrowing_a_file_of_no_values)
{
    char *dir = tu_mkdtemp("loader_zst_narrow_empty");
    const int64_t empty[3] = {0, 3, 4}, zero_axis[3] = {5, 0, 4}, full[3] = {2, 3, 4};
    float v[24];
    for (int i = 0; i < 24; i++)
        v[i] = (float)(i % 5) - 2.0f;
    char e[600], z[600], f[600];
    snprintf(e, sizeof e, "%s/a_empty.npy", dir);
    snprintf(z, sizeof z, "%s/c_zero_axis.npy", dir);
    snprintf(f, sizeof f, "%s/b_full.npy", dir);
    cr_assert_geq(tu_write_npy(e, "<f4", 0, 3, empty, v, 0, 64), 0);
    cr_assert_geq(tu_write_npy(z, "<f4", 0, 3, zero_axis, v, 0, 64), 0);
    cr_assert_geq(tu_write_npy(f, "<f4", 0, 3, full, v, sizeof v, 64), 0);
    for (int store = 0; store <= 1; store++) {
        npyload_pack_options o = {.threads = 1, .narrow = 1, .store = store};
        char out[3][700], err[512] = "";
        const char *in[3] = {e, z, f};
        for (int k = 0; k < 3; k++) {
            snprintf(out[k], sizeof out[k], "%s.%s", in[k], store ? "narrow.npy" : "zst");
            npyload_pack_result r;
            int rc = npyload_pack_file(in[k], out[k], &o, sizeof o, &r, sizeof r, err,
                                       sizeof err);
            cr_assert_eq(rc, 0, "store %d, %s: %d: %s", store, in[k], rc, err);
            cr_assert_geq(r.narrow_values, 1);
        }
        /* the empty file and the full one, one field */
        npyload_loader *L;
        cr_assert_eq(npyload_loader_create(&L), 0);
        cr_assert_eq(npyload_loader_add_field_files(L, "x", (const char *[]){out[0], out[2]},
                                                    2), 0);
        cr_assert_eq(npyload_loader_set(L, NPYLOAD_OPT_BATCH_SIZE, 2), 0);
        cr_assert_eq(npyload_loader_start(L), 0, "store %d: %s", store,
                     npyload_loader_errmsg(L));
        npyload_batch *b;
        cr_assert_eq(npyload_loader_next(L, &b), 0, "%s", npyload_loader_errmsg(L));
        const npyload_array *a = npyload_batch_field(b, 0);
        cr_assert_str_eq(a->descr, "<f4");
        cr_assert_eq(a->nbytes, sizeof v);
        cr_assert_eq(memcmp(a->data, v, sizeof v), 0, "the values, not the codes");
        npyload_batch_release(b);
        cr_assert_eq(npyload_loader_next(L, &b), NPYLOAD_EOF);
        npyload_loader_destroy(L);
    }
    tu_rmtree(dir);
}
