/* Tests of lib/format (npyload_dtype.c, npyload_header_parse.c,
 * npyload_header_file.c): the NPY header parser, reader and writer.
 *
 *  - golden/: files written by numpy (and a few by hand that numpy reads);
 *    golden/manifest.json holds numpy's own reading of each, compared here
 *    field by field.
 *  - malformed/: one file per problem; malformed/manifest.json gives the
 *    error code and a fragment of the message.
 *  - every prefix of valid files, round trips through npyload_format_header,
 *    byte-for-byte equality with numpy's writer.
 *
 * Both manifests are JSON arrays with one flat object per line (written by
 * make_golden.py / make_malformed.py); the small readers below rely on that
 * layout only. */
#include <criterion/criterion.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "format/npyload_format.h"
#include "npyload.h"
#include "testutil.h"

#define GOLDEN NPYLOAD_TEST_DATA "/golden"
#define MALFORMED NPYLOAD_TEST_DATA "/malformed"

/* ---- manifest reading ---- */

/* The text after "key": on `line`, or NULL. */
static const char *field(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    return p ? p + strlen(pat) : NULL;
}

/* A JSON string value without escapes (the scripts write ASCII names and
 * fragments; a backslash fails the test rather than being misread). */
static void field_str(const char *line, const char *key, char *dst, size_t cap)
{
    const char *p = field(line, key);
    cr_assert(p && *p == '"', "manifest line lacks string \"%s\": %s", key, line);
    p++;
    size_t k = 0;
    while (*p && *p != '"') {
        cr_assert(*p != '\\', "escape in manifest string: %s", line);
        cr_assert(k + 1 < cap);
        dst[k++] = *p++;
    }
    dst[k] = '\0';
}

static int64_t field_int(const char *line, const char *key)
{
    const char *p = field(line, key);
    cr_assert(p, "manifest line lacks \"%s\": %s", key, line);
    return strtoll(p, NULL, 10);
}

static int field_bool(const char *line, const char *key)
{
    const char *p = field(line, key);
    cr_assert(p, "manifest line lacks \"%s\": %s", key, line);
    return strncmp(p, "true", 4) == 0;
}

static int field_shape(const char *line, int64_t *shape)
{
    const char *p = field(line, "shape");
    cr_assert(p && *p == '[', "manifest line lacks shape: %s", line);
    p++;
    int n = 0;
    while (*p != ']') {
        char *end;
        cr_assert(n < NPYLOAD_MAX_DIMS);
        shape[n++] = strtoll(p, &end, 10);
        cr_assert(end != p, "bad shape in manifest: %s", line);
        p = end;
        while (*p == ',' || *p == ' ')
            p++;
    }
    return n;
}

/* Calls fn on every object line of a manifest; returns the count. */
static int each_entry(const char *manifest, void (*fn)(const char *line))
{
    FILE *f = fopen(manifest, "r");
    cr_assert(f, "cannot open %s", manifest);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"file\""))
            continue;
        fn(line);
        n++;
    }
    fclose(f);
    return n;
}

static char *path_of(const char *dir, const char *line)
{
    char name[256];
    field_str(line, "file", name, sizeof name);
    return tu_path(dir, name);
}

/* An exact-size heap copy, so ASan sees any read past `n`. */
static void *exact_copy(const void *p, size_t n)
{
    void *q = malloc(n ? n : 1);
    cr_assert(q);
    if (n)
        memcpy(q, p, n);
    return q;
}

/* ---- golden files ---- */

static void check_against_numpy(const char *line, const npyload_header *h,
                                const char *what)
{
    char s[64];
    field_str(line, "version", s, sizeof s);
    char v[16];
    snprintf(v, sizeof v, "%d.%d", h->major_version, h->minor_version);
    cr_expect_str_eq(v, s, "%s: version %s, numpy says %s", what, v, s);
    field_str(line, "descr", s, sizeof s);
    cr_expect_str_eq(h->descr, s, "%s: descr %s, numpy says %s", what, h->descr, s);
    cr_expect_eq(h->itemsize, (size_t)field_int(line, "itemsize"), "%s: itemsize", what);
    cr_expect_eq(h->itemsize, npyl_descr_itemsize(h->descr), "%s", what);
    cr_expect_eq(h->byteorder, h->descr[0], "%s", what);
    cr_expect_eq(h->kind, h->descr[1], "%s", what);
    cr_expect_eq(h->fortran_order, field_bool(line, "fortran_order"), "%s: fortran_order", what);
    int64_t shape[NPYLOAD_MAX_DIMS];
    int nd = field_shape(line, shape);
    cr_expect_eq(h->ndim, nd, "%s: ndim %d, numpy says %d", what, h->ndim, nd);
    for (int d = 0; d < nd && d < h->ndim; d++)
        cr_expect_eq(h->shape[d], shape[d], "%s: shape[%d]", what, d);
    cr_expect_eq(h->data_offset, (uint64_t)field_int(line, "data_offset"), "%s: data_offset", what);
    cr_expect_eq(h->data_bytes, (uint64_t)field_int(line, "data_bytes"), "%s: data_bytes", what);
    cr_expect_eq(h->file_bytes, (uint64_t)field_int(line, "file_bytes"), "%s: file_bytes", what);
    cr_expect_eq(h->data_offset, (uint64_t)(h->major_version == 1 ? 10 : 12) + h->header_len,
                 "%s: header_len", what);
}

static void golden_one(const char *line)
{
    char *path = path_of(GOLDEN, line);
    npyload_header h;
    char err[512];
    int rc = npyload_read_header(path, &h, err, sizeof err);
    cr_expect_eq(rc, 0, "%s: rc %d: %s", path, rc, err);
    if (rc == 0)
        check_against_numpy(line, &h, path);

    /* The same from memory, with and without the file's size. */
    size_t n;
    unsigned char *all = tu_read_file(path, &n);
    cr_assert(all, "cannot read %s", path);
    npyload_header m;
    rc = npyload_parse_header(all, n, n, NULL, &m, err, sizeof err);
    cr_expect_eq(rc, 0, "%s (memory): %s", path, err);
    if (rc == 0)
        check_against_numpy(line, &m, path);
    rc = npyload_parse_header(all, (size_t)h.data_offset, UINT64_MAX, NULL, &m, err, sizeof err);
    cr_expect_eq(rc, 0, "%s (header only): %s", path, err);
    cr_expect_eq(m.file_bytes, 0);

    /* Files in numpy.save's layout are what npyload_format_header writes. */
    if (field_bool(line, "numpy_layout")) {
        unsigned char out[4096];
        int w = npyload_format_header(out, sizeof out, h.descr, h.fortran_order, h.ndim, h.shape);
        cr_expect_eq(w, (int)h.data_offset, "%s: format_header wrote %d bytes, numpy %" PRIu64,
                     path, w, h.data_offset);
        if (w == (int)h.data_offset)
            cr_expect(memcmp(out, all, (size_t)w) == 0,
                      "%s: format_header differs from numpy's header:\n%.*s\n%.*s", path,
                      w, (const char *)out, w, (const char *)all);
    }
    free(all);
    free(path);
}

Test(header, golden_files_match_numpy)
{
    int n = each_entry(GOLDEN "/manifest.json", golden_one);
    cr_assert_geq(n, 40, "only %d golden files", n);
}

/* Every dtype the issue lists, in every byte order numpy writes, and the
 * three versions, are in the golden set (guards against a shrunken set). */
static char seen_descr[64][16];
static int nseen;
static int seen_version[4];
static void collect(const char *line)
{
    char d[16], v[16];
    field_str(line, "descr", d, sizeof d);
    field_str(line, "version", v, sizeof v);
    if (v[0] >= '1' && v[0] <= '3')
        seen_version[v[0] - '0'] = 1;
    for (int i = 0; i < nseen; i++)
        if (strcmp(seen_descr[i], d) == 0)
            return;
    if (nseen < 64)
        snprintf(seen_descr[nseen++], sizeof seen_descr[0], "%s", d);
}

Test(header, golden_set_covers_every_dtype)
{
    each_entry(GOLDEN "/manifest.json", collect);
    static const char *want[] = {"|b1", "|i1", "|u1", "<i2", ">i2", "<i4", ">i4", "<i8",
                                 ">i8", "<u2", ">u2", "<u4", ">u4", "<u8", ">u8", "<f2",
                                 ">f2", "<f4", ">f4", "<f8", ">f8", "<c8", ">c8", "<c16",
                                 ">c16"};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        int found = 0;
        for (int i = 0; i < nseen; i++)
            found |= strcmp(seen_descr[i], want[k]) == 0;
        cr_expect(found, "no golden file with descr %s", want[k]);
    }
    cr_expect(seen_version[1] && seen_version[2] && seen_version[3]);
}

/* ---- malformed files ---- */

static int code_of(const char *name)
{
#define XX(n, c, m) if (strcmp(name, #n) == 0) return c;
    NPYLOAD_ERROR_MAP(XX)
#undef XX
    cr_assert_fail("unknown code %s in manifest", name);
    return 0;
}

static void malformed_one(const char *line)
{
    char name[256], code[32], frag[256];
    field_str(line, "file", name, sizeof name);
    field_str(line, "code", code, sizeof code);
    field_str(line, "fragment", frag, sizeof frag);
    char *path = tu_path(MALFORMED, name);
    int want = code_of(code);
    npyload_header h;
    char err[512] = "";
    int rc = npyload_read_header(path, &h, err, sizeof err);
    cr_expect_eq(rc, want, "%s: rc %d (%s), want %s; message: %s", name, rc,
                 npyload_strerror(rc), code, err);
    cr_expect(strstr(err, path) == err, "%s: message does not start with the path: %s", name, err);
    cr_expect(strstr(err, frag) != NULL, "%s: message lacks '%s': %s", name, frag, err);

    /* From memory the verdict is the same and the name is "<memory>". */
    size_t n;
    unsigned char *all = tu_read_file(path, &n);
    cr_assert(all || n == 0, "cannot read %s", path);
    unsigned char *copy = exact_copy(all, n);
    rc = npyload_parse_header(copy, n, n, NULL, &h, err, sizeof err);
    cr_expect_eq(rc, want, "%s (memory): rc %d: %s", name, rc, err);
    cr_expect(strncmp(err, "<memory>: ", 10) == 0, "%s: %s", name, err);
    free(copy);
    free(all);
    free(path);
}

Test(header, malformed_files_refused_with_clear_message)
{
    int n = each_entry(MALFORMED "/manifest.json", malformed_one);
    cr_assert_geq(n, 50, "only %d malformed files", n);
}

Test(header, read_header_closes_every_fd)
{
    int before = tu_count_fds();
    if (before < 0)
        cr_skip_test("no /proc/self/fd here");
    for (int k = 0; k < 3; k++) {
        each_entry(GOLDEN "/manifest.json", golden_one);
        each_entry(MALFORMED "/manifest.json", malformed_one);
    }
    cr_expect_eq(tu_count_fds(), before, "file descriptors leaked");
}

Test(header, read_header_os_errors)
{
    npyload_header h;
    char err[512];
    int rc = npyload_read_header(NPYLOAD_TEST_DATA "/no/such/file.npy", &h, err, sizeof err);
    cr_expect_eq(rc, -ENOENT);
    cr_expect(strstr(err, "no/such/file.npy") != NULL, "%s", err);
    rc = npyload_read_header(GOLDEN, &h, err, sizeof err);
    cr_expect_eq(rc, -EISDIR, "%d: %s", rc, err);
    cr_expect_eq(npyload_read_header(NULL, &h, err, sizeof err), NPYLOAD_EINVAL);
    cr_expect_eq(npyload_read_header(GOLDEN "/dt_f4_le.npy", NULL, err, sizeof err),
                 NPYLOAD_EINVAL);
    /* err may be NULL */
    cr_expect_eq(npyload_read_header(MALFORMED "/bad_magic.npy", &h, NULL, 0), NPYLOAD_EFORMAT);
    /* a too-small err buffer is truncated, still NUL-terminated */
    char tiny[8];
    memset(tiny, 'x', sizeof tiny);
    cr_expect_eq(npyload_read_header(MALFORMED "/bad_magic.npy", &h, tiny, sizeof tiny),
                 NPYLOAD_EFORMAT);
    cr_expect_eq(tiny[7], '\0');
}

Test(header, read_header_ignores_data_it_never_reads)
{
    /* A header announcing 1 GiB, the file extended sparsely: the header is
     * read without touching (or allocating for) the data. */
    char *dir = tu_mkdtemp("hdr");
    cr_assert(dir);
    char *p = tu_path(dir, "big.npy");
    int64_t shape[2] = {256, 1 << 20};
    long off = tu_write_npy(p, "<f4", 0, 2, shape, NULL, 0, 64);
    cr_assert_gt(off, 0);
    cr_assert_eq(truncate(p, off + (1l << 30)), 0);
    npyload_header h;
    char err[512];
    cr_expect_eq(npyload_read_header(p, &h, err, sizeof err), 0, "%s", err);
    cr_expect_eq(h.data_bytes, 1ull << 30);
    cr_assert_eq(truncate(p, off + (1l << 30) - 1), 0);
    cr_expect_eq(npyload_read_header(p, &h, err, sizeof err), NPYLOAD_ETRUNCATED);
    cr_expect(strstr(err, "header says 1073741824 bytes of data from offset 128, "
                          "file holds 1073741951 bytes") != NULL, "%s", err);
    free(p);
    tu_rmtree(dir);
}

/* ---- every prefix of valid files ---- */

static void prefixes_one(const char *line)
{
    char *path = path_of(GOLDEN, line);
    size_t n;
    unsigned char *all = tu_read_file(path, &n);
    cr_assert(all);
    uint64_t off = (uint64_t)field_int(line, "data_offset");
    uint64_t hl = off - (line[0] && strstr(line, "\"version\": \"1.0\"") ? 10 : 12);
    size_t pre = (size_t)(off - hl);
    uint64_t need = off + (uint64_t)field_int(line, "data_bytes");
    for (size_t k = 0; k <= n; k++) {
        unsigned char *b = exact_copy(all, k);
        npyload_header h;
        char err[512];
        /* size unknown: header-only prefixes succeed */
        int rc = npyload_parse_header(b, k, UINT64_MAX, "p.npy", &h, err, sizeof err);
        if (k < pre) {
            cr_expect_eq(rc, NPYLOAD_ETRUNCATED, "%s: prefix %zu: rc %d", path, k, rc);
            cr_expect_eq(h.header_len, 0);
        } else if (k < off) {
            cr_expect_eq(rc, NPYLOAD_ETRUNCATED, "%s: prefix %zu: rc %d", path, k, rc);
            cr_expect_eq(h.header_len, hl, "%s: prefix %zu", path, k);
            cr_expect_eq(h.data_offset, off);
        } else {
            cr_expect_eq(rc, 0, "%s: prefix %zu: %s", path, k, err);
        }
        cr_expect(strncmp(err, "p.npy: ", 7) == 0 || rc == 0, "%s", err);
        /* a file cut to k bytes */
        rc = npyload_parse_header(b, k, k, "p.npy", &h, err, sizeof err);
        if (k < need)
            cr_expect_eq(rc, NPYLOAD_ETRUNCATED, "%s: file cut at %zu: rc %d: %s", path, k, rc, err);
        else
            cr_expect_eq(rc, 0, "%s: file of %zu: %s", path, k, err);
        free(b);
    }
    free(all);
    free(path);
}

Test(header, every_prefix_is_truncated_never_a_crash)
{
    each_entry(GOLDEN "/manifest.json", prefixes_one);
}

/* ---- round trips through npyload_format_header ---- */

Test(header, format_round_trip)
{
    static const char *descrs[] = {"<f4", ">f4", "=f8", "|b1", "?", "<i1", "|u1", "<c16",
                                   ">u8", "<f2", "i2"};
    static const int64_t shapes[][5] = {
        {0}, {7}, {64, 2, 256, 512}, {0, 3}, {3, 0}, {1, 1, 1, 1, 1},
        {INT64_MAX / 16, 1}, {9223372036854775807 / 16}};
    static const int ndims[] = {0, 1, 4, 2, 2, 5, 2, 1};
    for (size_t a = 0; a < sizeof descrs / sizeof descrs[0]; a++)
        for (size_t s = 0; s < sizeof ndims / sizeof ndims[0]; s++)
            for (int fo = 0; fo < 2; fo++) {
                unsigned char buf[1024];
                int w = npyload_format_header(buf, sizeof buf, descrs[a], fo, ndims[s], shapes[s]);
                cr_assert_gt(w, 0, "%s ndim %d: %d", descrs[a], ndims[s], w);
                cr_expect_eq(w % 64, 0);
                cr_expect_eq(buf[w - 1], '\n');
                cr_expect_eq(buf[6], 1);
                npyload_header h;
                char err[512];
                int rc = npyload_parse_header(buf, (size_t)w, UINT64_MAX, NULL, &h, err, sizeof err);
                cr_assert_eq(rc, 0, "%s: %s", descrs[a], err);
                cr_expect_eq((int)h.data_offset, w);
                cr_expect_eq(h.fortran_order, fo);
                cr_expect_eq(h.ndim, ndims[s]);
                for (int d = 0; d < ndims[s]; d++)
                    cr_expect_eq(h.shape[d], shapes[s][d]);
                cr_expect_eq(h.itemsize, npyl_descr_itemsize(descrs[a]));
                /* writing the normalised descr gives the same bytes */
                unsigned char again[1024];
                int w2 = npyload_format_header(again, sizeof again, h.descr, fo, h.ndim, h.shape);
                cr_expect_eq(w2, w);
                cr_expect(memcmp(again, buf, (size_t)w) == 0);
            }
}

Test(header, format_max_dims_and_limits)
{
    int64_t shape[NPYLOAD_MAX_DIMS + 1];
    for (int d = 0; d <= NPYLOAD_MAX_DIMS; d++)
        shape[d] = 1000000007 + d;
    shape[0] = 1;
    unsigned char buf[4096];
    /* 32 dims of 10 digits overflow the byte size: refused */
    cr_expect_eq(npyload_format_header(buf, sizeof buf, "<f4", 0, NPYLOAD_MAX_DIMS, shape),
                 NPYLOAD_ETOOBIG);
    for (int d = 0; d <= NPYLOAD_MAX_DIMS; d++)
        shape[d] = d % 3 == 0 ? 0 : 1000000000000000000 + d; /* empty */
    for (int d = 0; d <= NPYLOAD_MAX_DIMS; d++)
        if (d % 3 && d != 1)
            shape[d] = 1;
    shape[1] = INT64_MAX / 4; /* the nonzero axes must fit: numpy's rule */
    int w = npyload_format_header(buf, sizeof buf, "<f4", 0, NPYLOAD_MAX_DIMS, shape);
    cr_assert_gt(w, 0);
    npyload_header h;
    char err[512];
    cr_expect_eq(npyload_parse_header(buf, (size_t)w, (size_t)w, NULL, &h, err, sizeof err), 0, "%s", err);
    cr_expect_eq(h.ndim, NPYLOAD_MAX_DIMS);
    cr_expect_eq(h.data_bytes, 0);
    cr_expect_eq(h.shape[1], INT64_MAX / 4);
    cr_expect_eq(npyload_format_header(buf, sizeof buf, "<f4", 0, NPYLOAD_MAX_DIMS + 1, shape),
                 NPYLOAD_ETOOBIG);
    /* every too-small capacity is refused, the exact one accepted */
    for (int cap = 0; cap < w; cap++)
        cr_expect_eq(npyload_format_header(buf, (size_t)cap, "<f4", 0, NPYLOAD_MAX_DIMS, shape),
                     NPYLOAD_ETOOBIG);
    cr_expect_eq(npyload_format_header(buf, (size_t)w, "<f4", 0, NPYLOAD_MAX_DIMS, shape), w);
    int64_t neg[1] = {-1};
    cr_expect_eq(npyload_format_header(buf, sizeof buf, "<f4", 0, 1, neg), NPYLOAD_EINVAL);
    cr_expect_eq(npyload_format_header(buf, sizeof buf, "<U4", 0, 1, shape + 1), NPYLOAD_EINVAL);
    cr_expect_eq(npyload_format_header(buf, sizeof buf, "<f4extra", 0, 1, shape + 1), NPYLOAD_EINVAL);
    cr_expect_eq(npyload_format_header(buf, sizeof buf, NULL, 0, 1, shape + 1), NPYLOAD_EINVAL);
    cr_expect_eq(npyload_format_header(buf, sizeof buf, "<f4", 0, 1, NULL), NPYLOAD_EINVAL);
    cr_expect_eq(npyload_format_header(buf, sizeof buf, "<f4", 0, -1, shape), NPYLOAD_EINVAL);
    cr_expect_eq(npyload_format_header(NULL, 64, "<f4", 0, 0, NULL), NPYLOAD_EINVAL);
}

Test(header, format_matches_numpy_for_the_captcha_layout)
{
    /* np.save(f, np.zeros((64, 2, 256, 512), '<f4')) writes exactly this */
    static const char want[] =
        "\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': "
        "(64, 2, 256, 512), }";
    int64_t shape[4] = {64, 2, 256, 512};
    unsigned char buf[256];
    int w = npyload_format_header(buf, sizeof buf, "<f4", 0, 4, shape);
    cr_assert_eq(w, 128);
    cr_expect(memcmp(buf, want, sizeof want - 1) == 0);
    for (int i = (int)sizeof want - 1; i < 127; i++)
        cr_expect_eq(buf[i], ' ');
    cr_expect_eq(buf[127], '\n');
}

/* ---- specific parser behaviour, from memory ---- */

/* Parses a version-1.0 header with dict text `text` followed by `data`
 * bytes of data (file size known). */
static int parse_text(const char *text, size_t data, npyload_header *h, char *err, size_t errlen)
{
    size_t tl = strlen(text);
    size_t n = 10 + tl + data;
    unsigned char *b = calloc(1, n);
    cr_assert(b);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)(tl & 0xff);
    b[9] = (unsigned char)(tl >> 8);
    memcpy(b + 10, text, tl);
    int rc = npyload_parse_header(b, n, n, "x.npy", h, err, errlen);
    free(b);
    return rc;
}

Test(header, normalises_descr)
{
    static const struct { const char *in, *out; } cases[] = {
        {"<f4", "<f4"}, {">f4", ">f4"}, {"=f4", "<f4"}, {"|f4", "<f4"}, {"f4", "<f4"},
        {"?", "|b1"}, {"|b1", "|b1"}, {"<b1", "|b1"}, {"b1", "|b1"}, {"<i1", "|i1"},
        {">u1", "|u1"}, {"=c16", "<c16"}, {">c8", ">c8"}, {"<f2", "<f2"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char text[128];
        snprintf(text, sizeof text, "{'descr': '%s', 'fortran_order': False, 'shape': (), }\n",
                 cases[k].in);
        npyload_header h;
        char err[256];
        int rc = parse_text(text, 16, &h, err, sizeof err);
        cr_assert_eq(rc, 0, "%s: %s", cases[k].in, err);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        cr_expect_str_eq(h.descr, cases[k].out, "%s -> %s", cases[k].in, h.descr);
#endif
        cr_expect_eq(h.ndim, 0);
        cr_expect_eq(h.data_bytes, h.itemsize, "0-d holds one element");
    }
    cr_expect_eq(npyl_descr_itemsize("<c16"), 16);
    cr_expect_eq(npyl_descr_itemsize("|b1"), 1);
    cr_expect_eq(npyl_descr_itemsize("<U4"), 0);
    cr_expect_eq(npyl_descr_itemsize("<f16"), 0);
    cr_expect_eq(npyl_descr_itemsize(""), 0);
    cr_expect_eq(npyl_descr_itemsize(NULL), 0);
}

Test(header, messages_name_the_problem)
{
    npyload_header h;
    char err[512];
    int rc = parse_text("{'descr': '<f4', 'fortran_order': False, 'shape': (3, -1), }\n", 0,
                        &h, err, sizeof err);
    cr_expect_eq(rc, NPYLOAD_EFORMAT);
    cr_expect_str_eq(err, "x.npy: shape (3, -1): dimension 1 is negative");
    rc = parse_text("{'descr': '<f4', 'fortran_order': False, 'shape': (1024,), }\n", 100,
                    &h, err, sizeof err);
    cr_expect_eq(rc, NPYLOAD_ETRUNCATED);
    cr_expect(strstr(err, "x.npy: header says 4096 bytes of data from offset 71, file holds 171")
              == err, "%s", err);
    /* the header facts are filled in even though the data is short */
    cr_expect_eq(h.data_bytes, 4096);
    cr_expect_eq(h.shape[0], 1024);
    /* untrusted text in messages is cut and made printable */
    rc = parse_text("{'descr': '\x01\x02<f4AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA', "
                    "'fortran_order': False, 'shape': (), }", 0, &h, err, sizeof err);
    cr_expect_eq(rc, NPYLOAD_EFORMAT);
    cr_expect(strstr(err, "'?" "?<f4AAAA") && strstr(err, "...'"), "%s", err);
    for (const char *c = err; *c; c++)
        cr_expect(*c >= 0x20 && *c < 0x7f);
    /* comments and exotic spacing are Python, so they are accepted */
    rc = parse_text("# leading comment\n{'shape':(\t1 ,2,),# x\n\"descr\":u\"<i2\",'fortran_order'"
                    ":True,}", 4, &h, err, sizeof err);
    cr_expect_eq(rc, 0, "%s", err);
    cr_expect_eq(h.ndim, 2);
    cr_expect_eq(h.fortran_order, 1);
}

Test(header, python2_long_suffix_only_before_version_3)
{
    npyload_header h;
    char err[512];
    cr_expect_eq(parse_text("{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3l), }", 24,
                            &h, err, sizeof err), 0, "%s", err);
    cr_expect_eq(h.shape[1], 3);
    cr_expect_eq(parse_text("{'descr': '<f4', 'fortran_order': False, 'shape': (2LL,), }", 8,
                            &h, err, sizeof err), NPYLOAD_EFORMAT);
}

Test(header, argument_errors)
{
    npyload_header h;
    char err[128];
    cr_expect_eq(npyload_parse_header(NULL, 10, 10, NULL, &h, err, sizeof err), NPYLOAD_EINVAL);
    cr_expect_eq(npyload_parse_header("x", 1, 1, NULL, NULL, err, sizeof err), NPYLOAD_EINVAL);
    /* NULL with zero length is an empty input, not a bad argument */
    cr_expect_eq(npyload_parse_header(NULL, 0, UINT64_MAX, NULL, &h, err, sizeof err),
                 NPYLOAD_ETRUNCATED);
    cr_expect_eq(npyload_parse_header(NULL, 0, 0, NULL, &h, err, sizeof err), NPYLOAD_ETRUNCATED);
    cr_expect(strstr(err, "<memory>: file holds 0 bytes") == err, "%s", err);
}

Test(header, agrees_with_testutil_writer)
{
    /* testutil writes headers by hand (16- and 64-byte alignment): a second,
     * independent writer. */
    char *dir = tu_mkdtemp("hdr");
    cr_assert(dir);
    static const int64_t shape[3] = {4, 3, 2};
    unsigned char data[4 * 3 * 2 * 8] = {0};
    for (unsigned align = 16; align <= 64; align *= 4)
        for (int nd = 0; nd <= 3; nd++) {
            char *p = tu_path(dir, "t.npy");
            size_t nb = 8;
            for (int d = 0; d < nd; d++)
                nb *= (size_t)shape[d];
            long off = tu_write_npy(p, ">i8", nd == 2, nd, shape, data, nb, align);
            cr_assert_gt(off, 0);
            npyload_header h;
            char err[512];
            cr_expect_eq(npyload_read_header(p, &h, err, sizeof err), 0, "%s", err);
            cr_expect_eq((long)h.data_offset, off);
            cr_expect_eq(h.data_offset % align, 0);
            cr_expect_eq(h.ndim, nd);
            cr_expect_eq(h.data_bytes, nb);
            cr_expect_eq(h.fortran_order, nd == 2);
            cr_expect_str_eq(h.descr, ">i8");
            free(p);
        }
    tu_rmtree(dir);
}

/* Issue 11 item 5: open() of a FIFO without a writer blocked forever before
 * the regular-file check (start(), npyload-inspect and npyload.inspect all
 * hung). The reader runs in a child under alarm(), so a hang fails the test
 * instead of hanging CI; the child reports the code and message back. */
Test(header, fifo_refused_without_blocking)
{
    char *dir = tu_mkdtemp("fifo");
    cr_assert_not_null(dir);
    char *p = tu_path(dir, "pipe.npy");
    cr_assert_eq(mkfifo(p, 0600), 0, "mkfifo: %s", strerror(errno));
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        alarm(10);
        npyload_header h;
        char err[512] = "";
        int rc = npyload_read_header(p, &h, err, sizeof err);
        dprintf(fds[1], "%d %s", rc, err);
        _exit(0);
    }
    close(fds[1]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the reader hung on a FIFO (killed by signal %d)",
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    char buf[600] = "";
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    cr_assert_gt(n, 0);
    buf[n] = 0;
    int rc = atoi(buf);
    cr_assert_eq(rc, NPYLOAD_EINVAL, "%s", buf);
    char want[600];
    snprintf(want, sizeof want, "%s: not a regular file (FIFO)", p);
    cr_assert_not_null(strstr(buf, want), "message: %s", buf);
    free(p);
    tu_rmtree(dir);
}
