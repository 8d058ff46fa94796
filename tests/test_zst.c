/* Tests of lib/zst: the .npy.zst seek table (write, parse, validate), the
 * frame decode helper and npyload_pack_file.
 *
 * Independent truths: the stock `zstd -d` CLI (skipped visibly when absent)
 * and the original .npy bytes; libzstd's one-shot ZSTD_compress for a plain
 * zstd file without a seek table; seek tables edited by hand here (the
 * format is little-endian u32 fields, see npyload_zst.h). */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

#include "npyload.h"
#include "testutil.h"
#include "zst/npyload_zst.h"

#define GOLDEN NPYLOAD_TEST_DATA "/golden"

/* ---- helpers ---- */

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static int write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    return fclose(f) == 0 && w == n ? 0 : -1;
}

static int parse_mem(const unsigned char *d, size_t n, npyl_zst_index *x,
                     char *err, size_t errlen)
{
    npyl_zst_mem m = {d, n};
    return npyl_zst_index_read(npyl_zst_read_mem, &m, n, "t.npy.zst", x, err,
                               errlen);
}

/* Decodes every frame of `file` into `npy` (x->doff[nframes] bytes) with one
 * reused context; returns the first failure. */
static int decode_all(const npyl_zst_index *x, const unsigned char *file,
                      unsigned char *npy, char *err, size_t errlen)
{
    ZSTD_DCtx *d = ZSTD_createDCtx();
    cr_assert(d);
    int rc = 0;
    for (uint32_t f = 0; f < x->nframes && rc == 0; f++)
        rc = npyl_zst_decode_frame(x, f, d, file + x->coff[f], npy + x->doff[f],
                                   (size_t)(x->doff[f + 1] - x->doff[f]),
                                   "t.npy.zst", err, errlen);
    ZSTD_freeDCtx(d);
    return rc;
}

static int have_zstd_cli(void)
{
    return system("zstd --version >/dev/null 2>&1") == 0;
}

/* Files in dir (names), for "nothing left behind" checks. */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

/* A packed file in memory: writes `rows` samples of `row_bytes` bytes (a
 * uint8 array of shape (rows, row_bytes)) and packs it with `target`. */
typedef struct packed {
    char *dir, *npy, *zst;
    unsigned char *orig, *file;
    size_t orig_n, file_n;
} packed;

static void make_packed(packed *p, uint64_t rows, uint64_t row_bytes,
                        uint64_t target, int no_checksum)
{
    memset(p, 0, sizeof *p);
    p->dir = tu_mkdtemp("zst");
    cr_assert(p->dir);
    p->npy = tu_path(p->dir, "a.npy");
    p->zst = tu_path(p->dir, "a.npy.zst");
    size_t n = (size_t)(rows * row_bytes);
    unsigned char *data = malloc(n ? n : 1);
    /* Compressible but not trivial: a ramp with noise every few bytes. */
    for (size_t i = 0; i < n; i++)
        data[i] = (i % 5 == 0) ? tu_byte(1, i / row_bytes, i % row_bytes)
                               : (unsigned char)(i / 7);
    int64_t shape[2] = {(int64_t)rows, (int64_t)row_bytes};
    cr_assert(tu_write_npy(p->npy, "|u1", 0, 2, shape, data, n, 64) > 0);
    free(data);
    npyload_pack_options o;
    memset(&o, 0, sizeof o);
    o.frame_size = target;
    o.no_checksum = no_checksum;
    o.threads = 2;
    npyload_pack_result r;
    char err[512];
    int rc = npyload_pack_file(p->npy, NULL, &o, sizeof o, &r, sizeof r, err, sizeof err);
    cr_assert_eq(rc, 0, "pack: %s", err);
    p->orig = tu_read_file(p->npy, &p->orig_n);
    p->file = tu_read_file(p->zst, &p->file_n);
    cr_assert(p->orig && p->file);
    cr_assert_eq(r.out_bytes, p->file_n);
    cr_assert_eq(r.in_bytes, p->orig_n);
}

static void free_packed(packed *p)
{
    free(p->npy);
    free(p->zst);
    free(p->orig);
    free(p->file);
    tu_rmtree(p->dir);
}

/* Parses p->file as edited, expecting failure with `code` and `frag`. */
static void expect_refused(const unsigned char *d, size_t n, int code,
                           const char *frag)
{
    npyl_zst_index x;
    char err[512] = "";
    int rc = parse_mem(d, n, &x, err, sizeof err);
    cr_expect_eq(rc, code, "rc %d (%s), %d expected: %s", rc, npyload_strerror(rc),
                 code, err);
    cr_expect(strncmp(err, "t.npy.zst: ", 11) == 0, "message does not name the file: %s", err);
    cr_expect(strstr(err, frag), "message lacks \"%s\": %s", frag, err);
    if (rc == 0)
        npyl_zst_index_free(&x);
}

/* ---- golden corpus: pack, then decode with zstd -d and with the index ---- */

static void golden_each(int use_cli, int *packed_n, int *refused_n)
{
    glob_t g;
    cr_assert_eq(glob(GOLDEN "/*.npy", 0, NULL, &g), 0);
    char *dir = tu_mkdtemp("zstgold");
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *in = g.gl_pathv[i];
        const char *base = strrchr(in, '/') + 1;
        char name[300];
        snprintf(name, sizeof name, "%s.zst", base);
        char *out = tu_path(dir, name);
        npyload_header h;
        char err[512];
        cr_assert_eq(npyload_read_header(in, &h, err, sizeof err), 0, "%s", err);
        int rc = npyload_pack_file(in, out, NULL, 0, NULL, 0, err, sizeof err);
        int refusable = (h.fortran_order && h.ndim > 1) ||
                        h.file_bytes != h.data_offset + h.data_bytes;
        if (refusable) {
            cr_expect_eq(rc, NPYLOAD_EUNSUPPORTED, "%s: packed, refusal expected", in);
            cr_expect(strstr(err, in) != NULL, "message does not name %s: %s", in, err);
            cr_expect_eq(access(out, F_OK), -1, "%s: output left behind", out);
            (*refused_n)++;
            free(out);
            continue;
        }
        cr_expect_eq(rc, 0, "%s: %s", in, err);
        if (rc) {
            free(out);
            continue;
        }
        size_t on, zn;
        unsigned char *orig = tu_read_file(in, &on);
        unsigned char *z = tu_read_file(out, &zn);
        if (use_cli) {
            char cmd[1400], dec[1100];
            snprintf(dec, sizeof dec, "%s/%s.dec", dir, base);
            snprintf(cmd, sizeof cmd, "zstd -q -d -f -c '%s' > '%s'", out, dec);
            cr_expect_eq(system(cmd), 0, "zstd -d %s failed", out);
            size_t dn;
            unsigned char *d = tu_read_file(dec, &dn);
            cr_expect(d && dn == on && memcmp(d, orig, on) == 0,
                      "%s: zstd -d gives %zu bytes differing from the %zu of the .npy",
                      in, dn, on);
            free(d);
        } else {
            npyl_zst_index x;
            rc = parse_mem(z, zn, &x, err, sizeof err);
            cr_expect_eq(rc, 0, "%s: %s", in, err);
            if (rc == 0) {
                cr_expect_str_eq(x.hdr.descr, h.descr, "%s", in);
                cr_expect_eq(x.hdr.ndim, h.ndim, "%s", in);
                cr_expect_eq(x.hdr.data_offset, h.data_offset, "%s", in);
                cr_expect_eq(x.hdr.data_bytes, h.data_bytes, "%s", in);
                cr_expect_eq(x.hdr.file_bytes, h.file_bytes, "%s", in);
                cr_expect(memcmp(x.hdr.shape, h.shape, sizeof(int64_t) * (size_t)h.ndim) == 0);
                cr_expect_eq(x.doff[x.nframes], on);
                unsigned char *npy = malloc(on);
                rc = decode_all(&x, z, npy, err, sizeof err);
                cr_expect_eq(rc, 0, "%s: %s", in, err);
                cr_expect(rc || memcmp(npy, orig, on) == 0, "%s: decoded bytes differ", in);
                free(npy);
                npyl_zst_index_free(&x);
            }
        }
        free(orig);
        free(z);
        free(out);
        (*packed_n)++;
    }
    globfree(&g);
    tu_rmtree(dir);
}

Test(zst, golden_round_trip_through_zstd_cli)
{
    if (!have_zstd_cli())
        cr_skip_test("the zstd command-line tool is not installed (apt-get install zstd)");
    int n = 0, refused = 0;
    golden_each(1, &n, &refused);
    /* Every dtype in both byte orders is in the corpus (test_header checks
     * that); all but the Fortran and trailing-data files are packable. */
    cr_expect_geq(n, 45, "only %d golden files round-tripped", n);
    cr_expect_eq(refused, 4, "%d golden files refused, 4 expected "
                 "(fortran_2d, fortran_3d_be, spacing, trailing_data)", refused);
}

Test(zst, golden_round_trip_through_index_and_decoder)
{
    int n = 0, refused = 0;
    golden_each(0, &n, &refused);
    cr_expect_geq(n, 45);
    cr_expect_eq(refused, 4);
}

/* ---- frames hold whole samples; sample -> frame lookup ---- */

Test(zst, frames_hold_whole_samples)
{
    static const uint64_t rbs[] = {1, 7, 1000, 4096, 65536, 100000, 1 << 20};
    static const uint64_t targets[] = {1, 4096, 64 << 10, 128 << 10, 1 << 20};
    ZSTD_DCtx *d = ZSTD_createDCtx();
    for (size_t a = 0; a < sizeof rbs / sizeof rbs[0]; a++) {
        uint64_t rb = rbs[a];
        uint64_t rows = rb >= 65536 ? 5 : 301; /* odd: a short last frame */
        for (size_t b = 0; b < sizeof targets / sizeof targets[0]; b++) {
            uint64_t t = targets[b];
            packed p;
            make_packed(&p, rows, rb, t, 0);
            npyl_zst_index x;
            char err[512];
            cr_assert_eq(parse_mem(p.file, p.file_n, &x, err, sizeof err), 0, "%s", err);
            uint64_t spf = (t + rb - 1) / rb;
            if (spf > rows)
                spf = rows;
            cr_expect_eq(x.row_bytes, rb);
            cr_expect_eq(x.rows, rows);
            cr_expect_eq(x.nframes, 1 + (rows + spf - 1) / spf, "rb %" PRIu64 " target %"
                         PRIu64 ": %" PRIu32 " frames", rb, t, x.nframes);
            cr_expect_eq(x.doff[1], (uint64_t)(p.orig_n - rows * rb));
            for (uint32_t f = 1; f < x.nframes; f++) {
                uint64_t first, cnt;
                npyl_zst_frame_rows(&x, f, &first, &cnt);
                cr_expect_eq(first, (f - 1) * spf);
                cr_expect_eq(cnt, f + 1 < x.nframes ? spf : rows - (f - 1) * spf,
                             "rb %" PRIu64 " target %" PRIu64 " frame %" PRIu32, rb, t, f);
                /* The fewest whole samples reaching the target. */
                if (f + 1 < x.nframes)
                    cr_expect(cnt * rb >= t && (cnt - 1) * rb < t);
            }
            /* Every sample, located and decoded, equals the .npy's bytes. */
            unsigned char *scratch = malloc(x.max_dsize);
            uint32_t cur = 0;
            for (uint64_t row = 0; row < rows; row++) {
                uint32_t f;
                uint64_t off;
                npyl_zst_locate(&x, row, &f, &off);
                uint64_t first, cnt;
                npyl_zst_frame_rows(&x, f, &first, &cnt);
                cr_assert(row >= first && row < first + cnt, "row %" PRIu64 " not in frame %" PRIu32, row, f);
                cr_assert_eq(off, (row - first) * rb);
                if (f != cur) {
                    int rc = npyl_zst_decode_frame(&x, f, d, p.file + x.coff[f], scratch,
                                                   x.max_dsize, "t", err, sizeof err);
                    cr_assert_eq(rc, 0, "%s", err);
                    cur = f;
                }
                cr_assert(memcmp(scratch + off, p.orig + x.doff[1] + row * rb, rb) == 0,
                          "row %" PRIu64 " differs", row);
            }
            free(scratch);
            npyl_zst_index_free(&x);
            free_packed(&p);
        }
    }
    ZSTD_freeDCtx(d);
}

/* ---- damage: every error names the file and, for a frame, its offset ---- */

Test(zst, every_flipped_byte_of_a_frame_is_caught)
{
    packed p;
    make_packed(&p, 40, 1000, 4096, 0);
    npyl_zst_index x;
    char err[512];
    cr_assert_eq(parse_mem(p.file, p.file_n, &x, err, sizeof err), 0, "%s", err);
    cr_assert_geq(x.nframes, 4);
    uint32_t f = 2;
    size_t csz = (size_t)(x.coff[f + 1] - x.coff[f]);
    size_t dsz = (size_t)(x.doff[f + 1] - x.doff[f]);
    unsigned char *dst = malloc(dsz);
    ZSTD_DCtx *d = ZSTD_createDCtx();
    char at[64];
    snprintf(at, sizeof at, "frame 2 at byte %" PRIu64 ": ", x.coff[f]);
    int ignored = 0;
    for (size_t i = 0; i < csz; i++)
        for (unsigned bit = 0; bit < 8; bit++) {
            unsigned char *src = malloc(csz);
            memcpy(src, p.file + x.coff[f], csz);
            src[i] ^= (unsigned char)(1u << bit);
            int rc = npyl_zst_decode_frame(&x, f, d, src, dst, dsz, "t.npy.zst", err,
                                           sizeof err);
            /* Either refused, or (a bit zstd must ignore, such as the
             * header's unused bit) the exact bytes: never wrong bytes. */
            if (rc == 0) {
                cr_assert(memcmp(dst, p.orig + x.doff[f], dsz) == 0,
                          "flip of bit %u of byte %zu of frame 2: wrong bytes as success",
                          bit, i);
                ignored++;
                if (getenv("ZST_TEST_VERBOSE"))
                    fprintf(stderr, "ignored flip: byte %zu of %zu, bit %u\n", i, csz, bit);
            } else {
                cr_assert_eq(rc, NPYLOAD_EFORMAT, "byte %zu bit %u: rc %d", i, bit, rc);
                cr_assert(strstr(err, at) && strncmp(err, "t.npy.zst: ", 11) == 0, "%s", err);
            }
            free(src);
        }
    /* Bits zstd ignores (the header's unused bit, entropy-table entries of
     * symbols no sequence uses) decode to the exact bytes (checked above,
     * and the content checksum guards it); they are rare. */
    cr_expect_lt((size_t)ignored * 100, csz * 8, "%d of %zu flips decoded", ignored, csz * 8);
    /* The same context decodes the intact frame afterwards. */
    cr_expect_eq(npyl_zst_decode_frame(&x, f, d, p.file + x.coff[f], dst, dsz, "t", err,
                                       sizeof err), 0, "%s", err);
    cr_expect(memcmp(dst, p.orig + x.doff[f], dsz) == 0);
    ZSTD_freeDCtx(d);
    free(dst);
    npyl_zst_index_free(&x);
    free_packed(&p);
}

Test(zst, damaged_header_frame_is_refused_at_open)
{
    packed p;
    make_packed(&p, 10, 100, 4096, 0);
    npyl_zst_index x;
    char err[512];
    cr_assert_eq(parse_mem(p.file, p.file_n, &x, err, sizeof err), 0, "%s", err);
    size_t c0 = (size_t)x.coff[1];
    npyl_zst_index_free(&x);
    for (size_t i = 0; i < c0; i++) {
        p.file[i] ^= 0x10;
        int rc = parse_mem(p.file, p.file_n, &x, err, sizeof err);
        if (rc == 0) { /* an ignored bit: the header must be intact */
            npyload_header h;
            cr_assert_eq(npyload_parse_header(p.orig, p.orig_n, p.orig_n, NULL, &h, NULL, 0), 0);
            cr_assert(x.hdr.data_offset == h.data_offset && x.hdr.shape[0] == h.shape[0],
                      "flip in frame 0 byte %zu gave a different header", i);
            npyl_zst_index_free(&x);
        } else {
            cr_assert(strncmp(err, "t.npy.zst: ", 11) == 0, "%s", err);
        }
        p.file[i] ^= 0x10;
    }
    free_packed(&p);
}

Test(zst, truncated_file_is_refused)
{
    packed p;
    make_packed(&p, 30, 512, 2048, 0);
    for (size_t cut = 1; cut < p.file_n; cut += (cut < 64 ? 1 : 97)) {
        npyl_zst_index x;
        char err[512];
        int rc = parse_mem(p.file, p.file_n - cut, &x, err, sizeof err);
        cr_assert_neq(rc, 0, "file cut by %zu bytes accepted", cut);
        cr_assert(strncmp(err, "t.npy.zst: ", 11) == 0, "%s", err);
    }
    /* Through a file descriptor too: the same path, the real name. */
    cr_assert_eq(truncate(p.zst, (off_t)p.file_n - 3), 0);
    FILE *f = fopen(p.zst, "rb");
    int fd = fileno(f);
    npyl_zst_index x;
    char err[512];
    int rc = npyl_zst_index_open(fd, p.zst, &x, err, sizeof err);
    fclose(f);
    cr_expect_eq(rc, NPYLOAD_EFORMAT);
    cr_expect(strstr(err, p.zst) == err, "%s", err);
    cr_expect(strstr(err, "no seek table: repack it with npyload-pack (or zstd -d it)"), "%s", err);
    free_packed(&p);
}

Test(zst, wrong_checksum_in_the_table)
{
    packed p;
    make_packed(&p, 30, 512, 2048, 0);
    npyl_zst_index x;
    char err[512];
    cr_assert_eq(parse_mem(p.file, p.file_n, &x, err, sizeof err), 0, "%s", err);
    cr_assert(x.checksums);
    /* Entry 3's checksum: table start + 8 + 3 * 12 + 8. */
    size_t pos = (size_t)(p.file_n - x.table_bytes) + 8 + 3 * 12 + 8;
    npyl_zst_index_free(&x);
    put32(p.file + pos, get32(p.file + pos) ^ 0x1u);
    cr_assert_eq(parse_mem(p.file, p.file_n, &x, err, sizeof err), 0, "%s", err);
    unsigned char *npy = malloc(x.doff[x.nframes]);
    int rc = decode_all(&x, p.file, npy, err, sizeof err);
    cr_expect_eq(rc, NPYLOAD_EFORMAT);
    char at[64];
    snprintf(at, sizeof at, "frame 3 at byte %" PRIu64 ": checksum mismatch", x.coff[3]);
    cr_expect(strstr(err, at), "%s", err);
    free(npy);
    npyl_zst_index_free(&x);
    free_packed(&p);
}

Test(zst, plain_zstd_file_without_seek_table)
{
    packed p;
    make_packed(&p, 30, 512, 2048, 0);
    size_t cap = ZSTD_compressBound(p.orig_n);
    unsigned char *z = malloc(cap);
    size_t n = ZSTD_compress(z, cap, p.orig, p.orig_n, 3);
    cr_assert(!ZSTD_isError(n));
    expect_refused(z, n, NPYLOAD_EFORMAT,
                   "no seek table: repack it with npyload-pack (or zstd -d it)");
    /* A tiny one too (shorter than a seek table) and a non-zstd file. */
    expect_refused(z, 12, NPYLOAD_EFORMAT, "no seek table");
    expect_refused(p.orig, p.orig_n, NPYLOAD_EFORMAT, "not a zstd file");
    free(z);
    free_packed(&p);
}

Test(zst, inconsistent_table_sums)
{
    packed p;
    make_packed(&p, 30, 512, 2048, 0);
    npyl_zst_index x;
    char err[512];
    cr_assert_eq(parse_mem(p.file, p.file_n, &x, err, sizeof err), 0, "%s", err);
    size_t t = (size_t)(p.file_n - x.table_bytes) + 8; /* first entry */
    uint32_t n = x.nframes;
    npyl_zst_index_free(&x);
    unsigned char *e = malloc(p.file_n);

    /* Compressed sizes: one byte too many in frame 2 (the last frame then
     * runs into the table), one too few. */
    memcpy(e, p.file, p.file_n);
    put32(e + t + 2 * 12, get32(e + t + 2 * 12) + 1);
    expect_refused(e, p.file_n, NPYLOAD_EFORMAT, "compressed bytes run past the seek table");
    memcpy(e, p.file, p.file_n);
    put32(e + t + 2 * 12, get32(e + t + 2 * 12) - 1);
    expect_refused(e, p.file_n, NPYLOAD_EFORMAT, "compressed bytes, the file holds");

    /* Compressed sizes moved between frames 1 and 2: the sum holds, the
     * frames do not. */
    memcpy(e, p.file, p.file_n);
    put32(e + t + 1 * 12, get32(e + t + 1 * 12) + 1);
    put32(e + t + 2 * 12, get32(e + t + 2 * 12) - 1);
    cr_assert_eq(parse_mem(e, p.file_n, &x, err, sizeof err), 0, "%s", err);
    unsigned char *npy = malloc(x.doff[x.nframes]);
    cr_expect_eq(decode_all(&x, e, npy, err, sizeof err), NPYLOAD_EFORMAT);
    cr_expect(strstr(err, "frame 1 at byte"), "%s", err);
    npyl_zst_index_free(&x);
    free(npy);

    /* Decompressed sizes: not a whole number of samples. */
    memcpy(e, p.file, p.file_n);
    put32(e + t + 1 * 12 + 4, get32(e + t + 1 * 12 + 4) + 3);
    put32(e + t + 2 * 12 + 4, get32(e + t + 2 * 12 + 4) - 3);
    expect_refused(e, p.file_n, NPYLOAD_EFORMAT, "not a whole number of 512-byte samples");

    /* Decompressed sizes: one sample too many in total. */
    memcpy(e, p.file, p.file_n);
    put32(e + t + 1 * 12 + 4, get32(e + t + 1 * 12 + 4) + 512);
    expect_refused(e, p.file_n, NPYLOAD_EFORMAT, "the header's shape and dtype say");

    /* Frame 0's size differs from the header frame's content. */
    memcpy(e, p.file, p.file_n);
    put32(e + t + 4, get32(e + t + 4) + 64);
    expect_refused(e, p.file_n, NPYLOAD_EFORMAT, "frame 0 at byte 0: the frame says");

    /* A frame count that disagrees with the table's frame size. */
    memcpy(e, p.file, p.file_n);
    put32(e + p.file_n - 9, n - 1);
    expect_refused(e, p.file_n, NPYLOAD_EFORMAT, "seek table at byte");

    /* Reserved descriptor bits. */
    memcpy(e, p.file, p.file_n);
    e[p.file_n - 5] |= 0x04;
    expect_refused(e, p.file_n, NPYLOAD_EUNSUPPORTED, "reserved bits");

    /* An empty frame. */
    memcpy(e, p.file, p.file_n);
    put32(e + t + 1 * 12 + 4, 0);
    expect_refused(e, p.file_n, NPYLOAD_EFORMAT, "empty frame");
    free(e);
    free_packed(&p);
}

/* Caps the address space (outside ASan, which reserves terabytes) so that
 * a large allocation fails the test instead of passing unnoticed. */
static void cap_memory(void)
{
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
    return;
#endif
#endif
    struct rlimit rl;
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f) {
        if (fscanf(f, "%lu", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    rl.rlim_cur = rl.rlim_max = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (256u << 20);
    setrlimit(RLIMIT_AS, &rl);
#endif
}

Test(zst, absurd_sizes_are_refused_before_any_allocation)
{
    packed p;
    make_packed(&p, 30, 512, 2048, 0);
    npyl_zst_index x;
    char err[512];
    cr_assert_eq(parse_mem(p.file, p.file_n, &x, err, sizeof err), 0, "%s", err);
    size_t t = (size_t)(p.file_n - x.table_bytes) + 8;
    npyl_zst_index_free(&x);
    cap_memory();
    unsigned char *e = malloc(p.file_n);

    /* Huge frame counts: over the format's limit, and under it but larger
     * than the file could hold. */
    memcpy(e, p.file, p.file_n);
    put32(e + p.file_n - 9, 0xFFFFFFFFu);
    expect_refused(e, p.file_n, NPYLOAD_ETOOBIG, "frames, more than the format's");
    put32(e + p.file_n - 9, NPYL_ZST_MAX_FRAMES);
    expect_refused(e, p.file_n, NPYLOAD_EFORMAT, "-byte table, the file holds");

    /* Huge decompressed sizes: 4 GiB - 1 in a data frame, and 1 GiB from a
     * few hundred compressed bytes. */
    memcpy(e, p.file, p.file_n);
    put32(e + t + 1 * 12 + 4, 0xFFFFFFFFu);
    expect_refused(e, p.file_n, NPYLOAD_ETOOBIG, "claims 4294967295 decompressed bytes");
    memcpy(e, p.file, p.file_n);
    put32(e + t + 2 * 12 + 4, 1u << 30);
    expect_refused(e, p.file_n, NPYLOAD_ETOOBIG, "claims 1073741824 decompressed bytes");

    /* A header frame that claims 1 GiB - 1 (frame 0 is decoded at open). */
    memcpy(e, p.file, p.file_n);
    put32(e + t + 4, (1u << 30) - 1);
    expect_refused(e, p.file_n, NPYLOAD_ETOOBIG, "frame 0 at byte 0");

    /* A huge compressed size. */
    memcpy(e, p.file, p.file_n);
    put32(e + t + 1 * 12, 0xFFFFFFF0u);
    expect_refused(e, p.file_n, NPYLOAD_EFORMAT, "run past the seek table");
    free(e);
    free_packed(&p);
}

Test(zst, without_checksums)
{
    packed p;
    make_packed(&p, 30, 512, 2048, 1);
    npyl_zst_index x;
    char err[512];
    cr_assert_eq(parse_mem(p.file, p.file_n, &x, err, sizeof err), 0, "%s", err);
    cr_expect_eq(x.checksums, 0);
    cr_expect_eq(p.file[p.file_n - 5], 0, "descriptor");
    unsigned char *npy = malloc(x.doff[x.nframes]);
    cr_expect_eq(decode_all(&x, p.file, npy, err, sizeof err), 0, "%s", err);
    cr_expect(memcmp(npy, p.orig, p.orig_n) == 0);
    free(npy);
    npyl_zst_index_free(&x);
    free_packed(&p);
}

Test(zst, table_encode_parse_round_trip)
{
    uint32_t cs[3] = {10, 20, 30}, ds[3] = {40, 50, 60}, ck[3] = {1, 2, 0xdeadbeef};
    for (int sums = 0; sums <= 1; sums++) {
        size_t n = npyl_zst_table_size(3, sums);
        cr_assert_eq(n, 8 + 3 * (sums ? 12u : 8u) + 9);
        unsigned char *b = malloc(n);
        cr_assert_eq(npyl_zst_table_encode(b, 3, cs, ds, ck, sums), n);
        cr_expect_eq(get32(b), 0x184D2A5Eu);
        cr_expect_eq(get32(b + 4), n - 8);
        cr_expect_eq(get32(b + n - 9), 3u);
        cr_expect_eq(b[n - 5], sums ? 0x80 : 0);
        cr_expect_eq(get32(b + n - 4), 0x8F92EAB1u);
        for (int i = 0; i < 3; i++) {
            const unsigned char *e = b + 8 + i * (sums ? 12 : 8);
            cr_expect_eq(get32(e), cs[i]);
            cr_expect_eq(get32(e + 4), ds[i]);
            if (sums)
                cr_expect_eq(get32(e + 8), ck[i]);
        }
        free(b);
    }
}

/* ---- packing: overwrite, output naming, cancel, inputs refused ---- */

static int cancel_at_second(void *arg, uint64_t done, uint64_t total)
{
    int *calls = arg;
    return ++*calls >= 2;
}

Test(zst, pack_refuses_overwrite_without_force)
{
    packed p;
    make_packed(&p, 30, 512, 2048, 0);
    char err[512];
    cr_assert_eq(write_file(p.zst, "keep", 4), 0);
    int rc = npyload_pack_file(p.npy, NULL, NULL, 0, NULL, 0, err, sizeof err);
    cr_expect_eq(rc, -EEXIST);
    cr_expect(strstr(err, p.zst) == err && strstr(err, "already exists"), "%s", err);
    size_t n;
    unsigned char *k = tu_read_file(p.zst, &n);
    cr_expect(n == 4 && memcmp(k, "keep", 4) == 0, "existing output was touched");
    free(k);
    cr_expect_eq(count_entries(p.dir), 2, "a temporary file was left behind");

    npyload_pack_options o;
    memset(&o, 0, sizeof o);
    o.force = 1;
    o.frame_size = 2048; /* as make_packed */
    cr_expect_eq(npyload_pack_file(p.npy, NULL, &o, sizeof o, NULL, 0, err, sizeof err), 0, "%s", err);
    k = tu_read_file(p.zst, &n);
    cr_expect(n == p.file_n && memcmp(k, p.file, n) == 0, "forced output differs");
    free(k);

    /* The output may not be the input. */
    cr_expect_eq(npyload_pack_file(p.npy, p.npy, &o, sizeof o, NULL, 0, err, sizeof err), NPYLOAD_EINVAL);
    free_packed(&p);
}

Test(zst, pack_cancel_leaves_nothing)
{
    packed p;
    make_packed(&p, 64, 65536, 65536, 0);
    cr_assert_eq(unlink(p.zst), 0);
    npyload_pack_options o;
    memset(&o, 0, sizeof o);
    int calls = 0;
    o.progress = cancel_at_second;
    o.progress_arg = &calls;
    o.threads = 1; /* one frame per chunk step: cancels mid-file */
    char err[512];
    int rc = npyload_pack_file(p.npy, NULL, &o, sizeof o, NULL, 0, err, sizeof err);
    cr_expect_eq(rc, -ECANCELED, "rc %d: %s", rc, err);
    cr_expect_eq(count_entries(p.dir), 1, "output or temporary left after cancel");
    free_packed(&p);
}

Test(zst, pack_output_is_deterministic_across_threads)
{
    packed p;
    make_packed(&p, 200, 3000, 16384, 0);
    char err[512];
    for (int t = 1; t <= 5; t += 2) {
        npyload_pack_options o;
        memset(&o, 0, sizeof o);
        o.threads = t;
        o.frame_size = 16384;
        o.force = 1;
        char *out = tu_path(p.dir, "b.npy.zst");
        cr_assert_eq(npyload_pack_file(p.npy, out, &o, sizeof o, NULL, 0, err, sizeof err), 0, "%s", err);
        size_t n;
        unsigned char *b = tu_read_file(out, &n);
        cr_expect(n == p.file_n && memcmp(b, p.file, n) == 0, "threads=%d differs", t);
        free(b);
        free(out);
    }
    free_packed(&p);
}

Test(zst, pack_refuses_bad_inputs_by_name)
{
    char *dir = tu_mkdtemp("zstbad");
    char err[512];
    char *in = tu_path(dir, "bad.npy");
    cr_assert_eq(write_file(in, "\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'", 24), 0);
    int rc = npyload_pack_file(in, NULL, NULL, 0, NULL, 0, err, sizeof err);
    cr_expect(rc == NPYLOAD_EFORMAT || rc == NPYLOAD_ETRUNCATED, "rc %d", rc);
    cr_expect(strstr(err, in) == err, "%s", err);
    int64_t shape[2] = {3, 4};
    float data[12] = {0};
    cr_assert(tu_write_npy(in, "<f4", 1, 2, shape, data, sizeof data, 64) > 0);
    rc = npyload_pack_file(in, NULL, NULL, 0, NULL, 0, err, sizeof err);
    cr_expect_eq(rc, NPYLOAD_EUNSUPPORTED);
    cr_expect(strstr(err, in) == err && strstr(err, "Fortran"), "%s", err);
    npyload_pack_options o;
    memset(&o, 0, sizeof o);
    o.level = 99;
    cr_assert(tu_write_npy(in, "<f4", 0, 2, shape, data, sizeof data, 64) > 0);
    cr_expect_eq(npyload_pack_file(in, NULL, &o, sizeof o, NULL, 0, err, sizeof err), NPYLOAD_EINVAL);
    cr_expect(strstr(err, "level 99"), "%s", err);
    cr_expect_eq(count_entries(dir), 1);
    free(in);
    tu_rmtree(dir);
}

/* ---- zstd windows (issue 21, item 13) ---- */

/* A .npy.zst built by hand: frame 0 the NPY header of a (rows, row_bytes)
 * uint8 array, then the data in frames of `per` samples compressed at
 * level 1 with zstd window 2^wlog, checksums on. The data is compressible:
 * bytes 0-3 of each sample its index, the rest zero. *npy receives the
 * .npy's bytes (the truth). */
static unsigned char *windowed_file(const char *dir, uint64_t rows, uint64_t row_bytes,
                                    uint64_t per, int wlog, size_t *len, unsigned char **npy,
                                    size_t *npy_len)
{
    size_t n = (size_t)(rows * row_bytes);
    unsigned char *data = calloc(1, n);
    cr_assert_not_null(data);
    for (uint64_t s = 0; s < rows; s++)
        for (int i = 0; i < 4 && (uint64_t)i < row_bytes; i++)
            data[s * row_bytes + i] = (unsigned char)(s >> (8 * i));
    char *path = tu_path(dir, "w.npy");
    int64_t shape[2] = {(int64_t)rows, (int64_t)row_bytes};
    long off = tu_write_npy(path, "|u1", 0, 2, shape, data, n, 64);
    cr_assert_gt(off, 0);
    free(data);
    *npy = tu_read_file(path, npy_len);
    free(path);
    uint32_t nf = 1 + (uint32_t)((rows + per - 1) / per);
    uint32_t *cs = calloc(nf, 4), *ds = calloc(nf, 4), *sum = calloc(nf, 4);
    size_t cap = ZSTD_compressBound(*npy_len) + 64 * nf + npyl_zst_table_size(nf, 1);
    unsigned char *out = malloc(cap);
    ZSTD_CCtx *c = ZSTD_createCCtx();
    cr_assert(out && c && cs && ds && sum);
    size_t at = 0;
    for (uint32_t f = 0; f < nf; f++) {
        size_t from = f == 0 ? 0 : (size_t)off + (size_t)((f - 1) * per * row_bytes);
        size_t to = f == 0 ? (size_t)off : from + (size_t)(per * row_bytes);
        if (to > *npy_len)
            to = *npy_len;
        ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters);
        cr_assert(!ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 1)));
        cr_assert(!ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1)));
        cr_assert(!ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, wlog)));
        size_t z = ZSTD_compress2(c, out + at, cap - at, *npy + from, to - from);
        cr_assert(!ZSTD_isError(z), "%s", ZSTD_getErrorName(z));
        cs[f] = (uint32_t)z;
        ds[f] = (uint32_t)(to - from);
        sum[f] = get32(out + at + z - 4);
        at += z;
    }
    at += npyl_zst_table_encode(out + at, nf, cs, ds, sum, 1);
    ZSTD_freeCCtx(c);
    free(cs);
    free(ds);
    free(sum);
    *len = at;
    return out;
}

typedef struct collect {
    unsigned char *buf;
    uint64_t next; /* every byte once, in order */
} collect;

static void collect_sink(void *arg, uint64_t pos, const unsigned char *p, size_t n)
{
    collect *c = arg;
    cr_assert_eq(pos, c->next);
    memcpy(c->buf + pos, p, n);
    c->next = pos + n;
}

/* A frame of several samples asking for a zstd window above
 * NPYLOAD_ZST_MAX_WINDOW_LOG is refused at open, naming the frame and the
 * window; at the limit it streams through a small buffer, in bounded
 * memory, to the right bytes. A frame of one sample may use any window (it
 * decodes straight into the batch). */
Test(zst, frames_of_several_samples_have_a_bounded_window)
{
    char *dir = tu_mkdtemp("zst_window");
    const uint64_t rows = 1u << 20, rb = 16; /* a 16 MiB frame */
    size_t len, npy_len;
    unsigned char *npy, *file;
    npyl_zst_index x;
    char err[512] = "";

    file = windowed_file(dir, rows, rb, rows, NPYLOAD_ZST_MAX_WINDOW_LOG + 1, &len, &npy,
                         &npy_len);
    int rc = parse_mem(file, len, &x, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_ETOOBIG, "rc %d: %s", rc, err);
    cr_expect(strstr(err, "t.npy.zst: frame 1 at byte "), "%s", err);
    cr_expect(strstr(err, "16777216-byte zstd window"), "%s", err);
    cr_expect(strstr(err, "NPYLOAD_ZST_MAX_WINDOW_LOG"), "%s", err);
    free(file);
    free(npy);

    file = windowed_file(dir, rows, rb, rows, NPYLOAD_ZST_MAX_WINDOW_LOG, &len, &npy, &npy_len);
    cr_assert_eq(parse_mem(file, len, &x, err, sizeof err), 0, "%s", err);
    cr_assert_eq(x.nframes, 2);
    ZSTD_DCtx *d = ZSTD_createDCtx();
    unsigned char win[64 << 10];
    collect c = {malloc(rows * rb), 0};
    cr_assert_eq(npyl_zst_stream_frame(&x, 1, d, file + x.coff[1], win, sizeof win,
                                       NPYLOAD_ZST_MAX_WINDOW_LOG, collect_sink, &c,
                                       "t.npy.zst", err, sizeof err), 0, "%s", err);
    cr_assert_eq(c.next, rows * rb);
    cr_assert_eq(memcmp(c.buf, npy + x.doff[1], rows * rb), 0);
    cr_assert_leq(ZSTD_sizeof_DCtx(d), ((size_t)1 << NPYLOAD_ZST_MAX_WINDOW_LOG) + (1u << 20));
    /* The same frame under a lower limit: zstd refuses it while decoding,
     * in the same words (the check that open does not make for frames
     * under the limit's size). */
    rc = npyl_zst_stream_frame(&x, 1, d, file + x.coff[1], win, sizeof win, 20, NULL, NULL,
                               "t.npy.zst", err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_ETOOBIG, "rc %d: %s", rc, err);
    cr_expect(strstr(err, "t.npy.zst: frame 1 at byte "), "%s", err);
    cr_expect(strstr(err, "-byte zstd window"), "%s", err);
    ZSTD_freeDCtx(d);
    free(c.buf);
    npyl_zst_index_free(&x);
    free(file);
    free(npy);

    /* One 16 MiB sample per frame: any window. */
    file = windowed_file(dir, 2, rows * rb, 1, NPYLOAD_ZST_MAX_WINDOW_LOG + 1, &len, &npy,
                         &npy_len);
    cr_assert_eq(parse_mem(file, len, &x, err, sizeof err), 0, "%s", err);
    unsigned char *all = malloc(npy_len);
    cr_assert_eq(decode_all(&x, file, all, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(all, npy, npy_len), 0);
    free(all);
    npyl_zst_index_free(&x);
    free(file);
    free(npy);
    tu_rmtree(dir);
}

/* ---- npyload_zst_file_verify (issue 21, item 15) ---- */

/* Opens path (must succeed: open reads only the table and frame 0, which
 * is why inspect without --verify calls a damaged data frame fine) and
 * verifies it. Returns the verify result; *bad and the message out. */
static int open_and_verify(const char *path, uint32_t *bad, char *err, size_t errlen)
{
    npyload_zst_file *z = NULL;
    int rc = npyload_zst_file_open(path, &z, err, errlen);
    cr_assert_eq(rc, 0, "open %s: %s", path, err);
    rc = npyload_zst_file_verify(z, bad, err, errlen);
    npyload_zst_file_close(z);
    return rc;
}

/* `zstd -t` on a file: 0 when it says the frames are good (the independent
 * truth for damage inside frames; it skips the seek table). */
static int zstd_t(const char *path)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "zstd -q -t '%s' >/dev/null 2>&1", path);
    return system(cmd);
}

Test(zst, verify_finds_the_first_bad_frame)
{
    packed p;
    make_packed(&p, 30, 512, 2048, 0); /* 4 samples a frame: frames 1..8 */
    int cli = have_zstd_cli();
    if (!cli)
        cr_log_warn("zstd CLI not found: the cross-check with `zstd -t` is skipped");
    uint32_t bad = 7;
    char err[1024] = "";
    cr_assert_eq(open_and_verify(p.zst, &bad, err, sizeof err), 0, "%s", err);
    cr_assert_eq(bad, UINT32_MAX);
    if (cli)
        cr_assert_eq(zstd_t(p.zst), 0, "zstd -t refuses the good file");

    npyl_zst_index x;
    cr_assert_eq(parse_mem(p.file, p.file_n, &x, err, sizeof err), 0, "%s", err);
    unsigned char *e = malloc(p.file_n);
    char at[64];

    /* A flipped byte inside data frame 3, and another in frame 6: the first
     * is reported, with its index and offset. */
    memcpy(e, p.file, p.file_n);
    e[(x.coff[3] + x.coff[4]) / 2] ^= 0x20;
    e[(x.coff[6] + x.coff[7]) / 2] ^= 0x20;
    cr_assert_eq(write_file(p.zst, e, p.file_n), 0);
    int rc = open_and_verify(p.zst, &bad, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_EFORMAT, "rc %d: %s", rc, err);
    cr_assert_eq(bad, 3, "frame %u reported: %s", bad, err);
    snprintf(at, sizeof at, "frame 3 at byte %llu: ", (unsigned long long)x.coff[3]);
    cr_assert(strstr(err, p.zst) && strstr(err, at), "%s", err);
    if (cli)
        cr_assert_neq(zstd_t(p.zst), 0, "zstd -t finds nothing wrong: the test lost its damage");

    /* The seek table's checksum of frame 2 (zstd -t skips the table: only
     * verify sees this). */
    memcpy(e, p.file, p.file_n);
    size_t entry2 = (size_t)(p.file_n - x.table_bytes) + NPYL_ZST_SKIP_HEADER_BYTES + 2 * 12;
    e[entry2 + 8] ^= 0x01;
    cr_assert_eq(write_file(p.zst, e, p.file_n), 0);
    rc = open_and_verify(p.zst, &bad, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_EFORMAT, "rc %d: %s", rc, err);
    cr_assert_eq(bad, 2, "frame %u reported: %s", bad, err);
    cr_assert(strstr(err, "checksum mismatch"), "%s", err);
    if (cli)
        cr_assert_eq(zstd_t(p.zst), 0);

    /* Truncated: refused at open (the seek table is at the end) ... */
    cr_assert_eq(write_file(p.zst, p.file, p.file_n - 100), 0);
    npyload_zst_file *z = NULL;
    rc = npyload_zst_file_open(p.zst, &z, err, sizeof err);
    cr_assert_lt(rc, 0);
    cr_assert(strstr(err, p.zst), "%s", err);
    /* ... and truncated after open: verify says the file changed. */
    cr_assert_eq(write_file(p.zst, p.file, p.file_n), 0);
    cr_assert_eq(npyload_zst_file_open(p.zst, &z, err, sizeof err), 0, "%s", err);
    cr_assert_eq(truncate(p.zst, (off_t)x.coff[5]), 0);
    rc = npyload_zst_file_verify(z, &bad, err, sizeof err);
    cr_assert_eq(rc, NPYLOAD_ECHANGED, "rc %d: %s", rc, err);
    cr_assert_eq(bad, UINT32_MAX);
    cr_assert(strstr(err, p.zst), "%s", err);
    npyload_zst_file_close(z);

    npyl_zst_index_free(&x);
    free(e);
    free_packed(&p);
}

/* Every frame is checked, frame 0 and the last included, whatever byte is
 * flipped (a sample of positions across the whole data). */
Test(zst, verify_catches_a_flipped_byte_anywhere_in_the_frames)
{
    packed p;
    make_packed(&p, 12, 300, 600, 0);
    npyl_zst_index x;
    char err[1024];
    cr_assert_eq(parse_mem(p.file, p.file_n, &x, err, sizeof err), 0, "%s", err);
    unsigned char *e = malloc(p.file_n);
    for (uint64_t pos = 0; pos < x.coff[x.nframes]; pos += 7) {
        memcpy(e, p.file, p.file_n);
        e[pos] ^= 0x04;
        npyl_zst_index y;
        if (parse_mem(e, p.file_n, &y, err, sizeof err) != 0)
            continue; /* frame 0 is decoded at open: refused there */
        npyl_zst_mem m = {e, p.file_n};
        uint32_t bad = 0;
        int rc = npyl_zst_verify(npyl_zst_read_mem, &m, &y, "t.npy.zst", &bad, err, sizeof err);
        uint32_t f = 0;
        while (x.coff[f + 1] <= pos)
            f++;
        cr_assert_neq(rc, 0, "byte %llu (frame %u) flipped: verify passed",
                      (unsigned long long)pos, f);
        cr_assert_eq(bad, f, "byte %llu flipped: frame %u reported, %u expected: %s",
                     (unsigned long long)pos, bad, f, err);
        npyl_zst_index_free(&y);
    }
    npyl_zst_index_free(&x);
    free(e);
    free_packed(&p);
}

/* The public API takes no zstd type: a NULL context is made for the call;
 * bad arguments are refused in words. */
Test(zst, public_file_api_arguments)
{
    packed p;
    make_packed(&p, 10, 64, 128, 0);
    npyload_zst_file *z = NULL;
    char err[512];
    cr_assert_eq(npyload_zst_probe(p.zst), 1);
    cr_assert_eq(npyload_zst_probe(p.npy), 0);
    cr_assert_eq(npyload_zst_file_open(p.zst, &z, err, sizeof err), 0, "%s", err);
    const npyload_zst_facts *fa = npyload_zst_file_facts(z);
    cr_assert_eq(fa->frames, 6);
    cr_assert_eq(fa->samples_per_frame, 2);
    uint64_t off, cs, ds;
    cr_assert_eq(npyload_zst_file_frame(z, 1, &off, &cs, &ds), 0);
    unsigned char out[128];
    cr_assert_eq(npyload_zst_file_decode(z, 1, NULL, p.file + off, out, sizeof out, err,
                                         sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(out, p.orig + fa->hdr.data_offset, 128), 0);
    cr_assert_eq(npyload_zst_file_frame(z, 6, &off, &cs, &ds), NPYLOAD_EINVAL);
    cr_assert_eq(npyload_zst_file_decode(z, 6, NULL, p.file, out, sizeof out, err,
                                         sizeof err), NPYLOAD_EINVAL);
    cr_assert(strstr(err, "frame 6: no such frame"), "%s", err);
    cr_assert_eq(npyload_zst_file_verify(NULL, NULL, err, sizeof err), NPYLOAD_EINVAL);
    npyload_zst_file_close(z);
    npyload_zst_file_close(NULL);
    free_packed(&p);
}
