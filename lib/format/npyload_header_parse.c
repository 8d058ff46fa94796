/* NPY headers: parsing (untrusted input). Reading from a file and writing
 * are in npyload_header_file.c, dtype strings in npyload_dtype.c.
 *
 * An NPY file is a preamble (magic "\x93NUMPY", a version, a little-endian
 * header length), a header that is the text of a Python dict literal padded
 * with spaces and '\n', and the raw data. numpy reads the header with
 * ast.literal_eval; we parse the same restricted literal by hand and never
 * evaluate anything.
 *
 * Accepted grammar (whitespace is ' ', '\t', '\n', '\r', '\f'; '#' starts a
 * comment that runs to the end of the line, as in Python source):
 *
 *   header := ws dict ws
 *   dict   := '{' [ item (',' item)* [','] ] '}'
 *   item   := string ':' value       keys: 'descr', 'fortran_order', 'shape',
 *                                    each exactly once, in any order
 *   string := ['u'|'U'] ('\'' chars '\'' | '"' chars '"')
 *                                    no escapes, no newline inside
 *   descr  := string                 a fixed-size numeric type, see classify
 *   fortran_order := 'True' | 'False'
 *   shape  := '(' ')' | '(' int ',' ')' | '(' int (',' int)+ [','] ')'
 *   int    := ['-'] digits ['L'|'l']  no leading zeros; the 'L' suffix of
 *                                    Python 2 only in versions 1.0 and 2.0,
 *                                    as numpy's _filter_header allows
 *
 * Deliberate differences from numpy (all refusals of things numpy writes
 * never): escapes in strings, implicit string concatenation, triple quotes,
 * '+3', hex/underscore integers and parenthesised values are refused.
 * (3) is the int 3 in Python, not a tuple: numpy refuses it, so do we.
 *
 * The parser is a flat loop over a bounded buffer: no recursion, no
 * allocation, every index compared with the header length before use. */
#include "npyload_format.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longest excerpt of untrusted text quoted in a message. */
#define NPYL_QUOTE_MAX 32

/* ------------------------------------------------------------------------ */
/* Message helpers                                                           */
/* ------------------------------------------------------------------------ */

/* Copies at most NPYL_QUOTE_MAX bytes of untrusted text into dst as a
 * printable excerpt (other bytes become '?', a cut is marked "..."), so a
 * hostile header cannot put control characters into a message. */
static void excerpt(char *dst, size_t cap, const unsigned char *s, size_t n)
{
    size_t k = 0, i = 0;
    for (; i < n && i < NPYL_QUOTE_MAX && k + 1 < cap; i++)
        dst[k++] = (s[i] >= 0x20 && s[i] < 0x7f) ? (char)s[i] : '?';
    if (i < n && k + 4 < cap) {
        memcpy(dst + k, "...", 3);
        k += 3;
    }
    dst[k < cap ? k : cap - 1] = '\0';
}

int npyl_shape_repr(char *dst, size_t cap, int ndim, const int64_t *shape)
{
    size_t k = 0;
    int w = snprintf(dst, cap, "(");
    if (w < 0 || (size_t)w >= cap)
        return -1;
    k = (size_t)w;
    for (int d = 0; d < ndim; d++) {
        w = snprintf(dst + k, cap - k, d ? ", %" PRId64 : "%" PRId64, shape[d]);
        if (w < 0 || (size_t)w >= cap - k)
            return -1;
        k += (size_t)w;
    }
    w = snprintf(dst + k, cap - k, ndim == 1 ? ",)" : ")");
    if (w < 0 || (size_t)w >= cap - k)
        return -1;
    return (int)(k + (size_t)w);
}
/* ------------------------------------------------------------------------ */
/* The dict literal                                                          */
/* ------------------------------------------------------------------------ */

typedef struct npyl_lex {
    const unsigned char *s; /* header text, not NUL-terminated */
    size_t n;               /* its length */
    size_t i;               /* cursor, always <= n */
    size_t base;            /* file offset of s[0], for messages */
    int allow_long;         /* Python 2 'L' suffix allowed (versions 1, 2) */
    const char *name;
    char *err;
    size_t errlen;
} npyl_lex;

static int is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

static int is_ident(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_';
}

static void skip_space(npyl_lex *x)
{
    while (x->i < x->n) {
        unsigned char c = x->s[x->i];
        if (is_space(c)) {
            x->i++;
        } else if (c == '#') {
            while (x->i < x->n && x->s[x->i] != '\n' && x->s[x->i] != '\r')
                x->i++;
        } else {
            break;
        }
    }
}

/* What the cursor is looking at, for "found ..." in messages. */
static const char *found(npyl_lex *x, char *buf, size_t cap)
{
    /* the padding after the dict would only fill the excerpt with blanks */
    size_t end = x->n;
    while (end > x->i && is_space(x->s[end - 1]))
        end--;
    if (x->i >= end)
        return "the end of the header";
    char ex[NPYL_QUOTE_MAX + 8];
    excerpt(ex, sizeof ex, x->s + x->i, end - x->i);
    snprintf(buf, cap, "'%s'", ex);
    return buf;
}

/* A message about the text at the cursor: "name: at byte N: what, found 'x'". */
static int lex_fail(npyl_lex *x, int code, const char *what)
{
    char fb[NPYL_QUOTE_MAX + 16];
    return npyl_fail(x->err, x->errlen, code, "%s: at byte %zu: %s, found %s",
                     x->name, x->base + x->i, what, found(x, fb, sizeof fb));
}

/* Parses a string literal at the cursor: on success str and len point into the
 * header text. Returns 0, or an error with its message written. */
static int lex_string(npyl_lex *x, const char *what, const unsigned char **str,
                      size_t *len)
{
    size_t start = x->i;
    size_t i = x->i;
    if (i < x->n && (x->s[i] == 'u' || x->s[i] == 'U'))
        i++; /* u'' is a str in Python 3, written by some Python 2 tools */
    if (i >= x->n || (x->s[i] != '\'' && x->s[i] != '"'))
        return lex_fail(x, NPYLOAD_EFORMAT, what);
    unsigned char q = x->s[i++];
    size_t from = i;
    while (i < x->n && x->s[i] != q) {
        if (x->s[i] == '\\') {
            x->i = i;
            return lex_fail(x, NPYLOAD_EUNSUPPORTED,
                            "escape sequences in header strings are not supported");
        }
        if (x->s[i] == '\n' || x->s[i] == '\r')
            break;
        i++;
    }
    if (i >= x->n || x->s[i] != q) {
        x->i = start;
        return lex_fail(x, NPYLOAD_EFORMAT, "unterminated string");
    }
    *str = x->s + from;
    *len = i - from;
    x->i = i + 1;
    return 0;
}

enum { KEY_DESCR = 1, KEY_FORTRAN = 2, KEY_SHAPE = 4 };

static int key_id(const unsigned char *k, size_t n)
{
    if (n == 5 && memcmp(k, "descr", 5) == 0)
        return KEY_DESCR;
    if (n == 13 && memcmp(k, "fortran_order", 13) == 0)
        return KEY_FORTRAN;
    if (n == 5 && memcmp(k, "shape", 5) == 0)
        return KEY_SHAPE;
    return 0;
}

static int parse_descr(npyl_lex *x, npyl_dtype *dt)
{
    if (x->i < x->n && x->s[x->i] == '[')
        return npyl_fail(x->err, x->errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: at byte %zu: descr is a list: structured dtypes "
                         "are not supported",
                         x->name, x->base + x->i);
    if (x->i < x->n && x->s[x->i] == '(')
        return npyl_fail(x->err, x->errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: at byte %zu: descr is a tuple: subarray dtypes "
                         "are not supported",
                         x->name, x->base + x->i);
    const unsigned char *s;
    size_t n;
    size_t at = x->i;
    int rc = lex_string(x, "descr must be a string literal", &s, &n);
    if (rc)
        return rc;
    const char *why = "";
    rc = npyl_dtype_parse((const char *)s, n, dt, &why);
    if (rc) {
        char ex[NPYL_QUOTE_MAX + 8];
        excerpt(ex, sizeof ex, s, n);
        return npyl_fail(x->err, x->errlen, rc, "%s: at byte %zu: descr '%s' %s",
                         x->name, x->base + at, ex, why);
    }
    return 0;
}

static int parse_fortran(npyl_lex *x, int *fortran)
{
    size_t j = x->i;
    while (j < x->n && is_ident(x->s[j]))
        j++;
    size_t n = j - x->i;
    /* Only the bool literals: numpy checks isinstance(value, bool), so 0/1
     * and names such as np.True_ are refused. */
    if (n == 4 && memcmp(x->s + x->i, "True", 4) == 0)
        *fortran = 1;
    else if (n == 5 && memcmp(x->s + x->i, "False", 5) == 0)
        *fortran = 0;
    else
        return lex_fail(x, NPYLOAD_EFORMAT, "fortran_order must be True or False");
    x->i = j;
    return 0;
}

/* Parses the shape tuple. Negative dimensions are collected and reported
 * after the whole tuple is read, so the message can show it. */
static int parse_shape(npyl_lex *x, int *ndim_out, int64_t *shape)
{
    if (x->i < x->n && x->s[x->i] == '[')
        return lex_fail(x, NPYLOAD_EFORMAT, "shape must be a tuple, not a list");
    if (x->i >= x->n || x->s[x->i] != '(')
        return lex_fail(x, NPYLOAD_EFORMAT, "shape must be a tuple literal");
    x->i++;
    int ndim = 0;
    int commas = 0;
    skip_space(x);
    if (x->i < x->n && x->s[x->i] == ')') {
        x->i++;
        *ndim_out = 0;
        return 0;
    }
    for (;;) {
        skip_space(x);
        if (ndim == NPYLOAD_MAX_DIMS)
            return npyl_fail(x->err, x->errlen, NPYLOAD_ETOOBIG,
                             "%s: at byte %zu: shape has more than %d dimensions",
                             x->name, x->base + x->i, NPYLOAD_MAX_DIMS);
        size_t start = x->i;
        int neg = 0;
        if (x->i < x->n && x->s[x->i] == '-') {
            neg = 1;
            x->i++;
            skip_space(x); /* "- 1" is still a literal in Python */
        }
        char what[64];
        snprintf(what, sizeof what, "shape: dimension %d is not a plain integer", ndim);
        if (x->i >= x->n || x->s[x->i] < '0' || x->s[x->i] > '9') {
            x->i = start;
            return lex_fail(x, NPYLOAD_EFORMAT, what);
        }
        if (x->s[x->i] == '0' && x->i + 1 < x->n && x->s[x->i + 1] >= '0' &&
            x->s[x->i + 1] <= '9') {
            x->i = start;
            return lex_fail(x, NPYLOAD_EFORMAT,
                            "shape: leading zeros are not a Python integer literal");
        }
        uint64_t v = 0;
        int over = 0;
        size_t digits = x->i;
        while (x->i < x->n && x->s[x->i] >= '0' && x->s[x->i] <= '9') {
            if (npyl_mul_u64(v, 10, &v) ||
                npyl_add_u64(v, (uint64_t)(x->s[x->i] - '0'), &v))
                over = 1;
            x->i++;
        }
        size_t ndigits = x->i - digits;
        if (x->i < x->n && (x->s[x->i] == 'L' || x->s[x->i] == 'l')) {
            if (!x->allow_long)
                return lex_fail(x, NPYLOAD_EFORMAT,
                                "shape: the Python 2 'L' suffix is only valid in "
                                "version 1.0 and 2.0 headers");
            x->i++;
        }
        /* 2.5, 1e3, 0x10, 1_000, 3j: numbers, but not plain ints */
        if (x->i < x->n && (is_ident(x->s[x->i]) || x->s[x->i] == '.')) {
            x->i = start;
            return lex_fail(x, NPYLOAD_EFORMAT, what);
        }
        if (over || v > (uint64_t)INT64_MAX) {
            char ex[NPYL_QUOTE_MAX + 8];
            excerpt(ex, sizeof ex, x->s + digits, ndigits);
            return npyl_fail(x->err, x->errlen, NPYLOAD_ETOOBIG,
                             "%s: at byte %zu: shape: dimension %d (%s%s) does "
                             "not fit 64 bits",
                             x->name, x->base + start, ndim, neg ? "-" : "", ex);
        }
        shape[ndim++] = neg ? -(int64_t)v : (int64_t)v;
        skip_space(x);
        if (x->i < x->n && x->s[x->i] == ',') {
            x->i++;
            commas++;
            skip_space(x);
            if (x->i < x->n && x->s[x->i] == ')') {
                x->i++;
                break;
            }
            continue;
        }
        if (x->i < x->n && x->s[x->i] == ')') {
            x->i++;
            if (ndim == 1 && commas == 0) {
                return npyl_fail(x->err, x->errlen, NPYLOAD_EFORMAT,
                                 "%s: shape (%" PRId64 ") is the int %" PRId64
                                 ", not a tuple (a 1-d shape is written (%" PRId64
                                 ",))",
                                 x->name, shape[0], shape[0], shape[0]);
            }
            break;
        }
        x->i = start; /* show the whole element: "2*3", not "*3" */
        return lex_fail(x, NPYLOAD_EFORMAT, what);
    }
    *ndim_out = ndim;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) {
            char sb[NPYLOAD_MAX_DIMS * 24 + 8];
            npyl_shape_repr(sb, sizeof sb, ndim, shape);
            return npyl_fail(x->err, x->errlen, NPYLOAD_EFORMAT,
                             "%s: shape %s: dimension %d is negative", x->name,
                             sb, d);
        }
    }
    return 0;
}

/* Strict UTF-8 check (no overlongs, no surrogates, nothing past U+10FFFF),
 * as Python's decoder: version 3.0 headers are UTF-8. Returns the offset of
 * the first bad byte, or n. */
static size_t utf8_bad(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            len = 2; cp = c & 0x1f; min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3; cp = c & 0x0f; min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4; cp = c & 0x07; min = 0x10000;
        } else {
            return i;
        }
        if (n - i < len)
            return i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += len;
    }
    return n;
}

static int parse_dict(npyl_lex *x, npyl_dtype *dt, int *fortran, int *ndim,
                      int64_t *shape)
{
    const void *nul = memchr(x->s, 0, x->n);
    if (nul)
        return npyl_fail(x->err, x->errlen, NPYLOAD_EFORMAT,
                         "%s: at byte %zu: NUL byte in the header",
                         x->name, x->base + (size_t)((const unsigned char *)nul - x->s));
    skip_space(x);
    if (x->i >= x->n || x->s[x->i] != '{')
        return lex_fail(x, NPYLOAD_EFORMAT, "header is not a dict literal");
    x->i++;
    int seen = 0;
    for (;;) {
        skip_space(x);
        if (x->i < x->n && x->s[x->i] == '}') {
            x->i++;
            break;
        }
        const unsigned char *k;
        size_t kn;
        size_t kat = x->i;
        int rc = lex_string(x, "expected a string key or '}'", &k, &kn);
        if (rc)
            return rc;
        int id = key_id(k, kn);
        char kex[NPYL_QUOTE_MAX + 8];
        excerpt(kex, sizeof kex, k, kn);
        if (!id)
            return npyl_fail(x->err, x->errlen, NPYLOAD_EFORMAT,
                             "%s: at byte %zu: unknown key '%s' (an NPY header "
                             "holds 'descr', 'fortran_order' and 'shape' only)",
                             x->name, x->base + kat, kex);
        if (seen & id)
            return npyl_fail(x->err, x->errlen, NPYLOAD_EFORMAT,
                             "%s: at byte %zu: duplicate key '%s'", x->name,
                             x->base + kat, kex);
        seen |= id;
        skip_space(x);
        if (x->i >= x->n || x->s[x->i] != ':') {
            char what[128];
            snprintf(what, sizeof what, "expected ':' after key '%s'", kex);
            return lex_fail(x, NPYLOAD_EFORMAT, what);
        }
        x->i++;
        skip_space(x);
        if (id == KEY_DESCR)
            rc = parse_descr(x, dt);
        else if (id == KEY_FORTRAN)
            rc = parse_fortran(x, fortran);
        else
            rc = parse_shape(x, ndim, shape);
        if (rc)
            return rc;
        skip_space(x);
        if (x->i < x->n && x->s[x->i] == ',') {
            x->i++;
            continue;
        }
        if (x->i < x->n && x->s[x->i] == '}') {
            x->i++;
            break;
        }
        char what[128];
        snprintf(what, sizeof what, "expected ',' or '}' after the value of '%s'", kex);
        return lex_fail(x, NPYLOAD_EFORMAT, what);
    }
    skip_space(x);
    if (x->i < x->n)
        return lex_fail(x, NPYLOAD_EFORMAT, "unexpected text after the header dict");
    static const struct { int id; const char *name; } keys[] = {
        {KEY_DESCR, "descr"}, {KEY_FORTRAN, "fortran_order"}, {KEY_SHAPE, "shape"}};
    for (size_t j = 0; j < sizeof keys / sizeof keys[0]; j++)
        if (!(seen & keys[j].id))
            return npyl_fail(x->err, x->errlen, NPYLOAD_EFORMAT,
                             "%s: missing key '%s' in the header", x->name,
                             keys[j].name);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Public entry points                                                       */
/* ------------------------------------------------------------------------ */

/* On NPYLOAD_ETRUNCATED because `len` is short, out->header_len and
 * out->data_offset (the bytes needed) are set once the preamble was complete;
 * header_len stays 0 when even the preamble was cut. */
/* The preamble: magic, version, header length, where the data starts.
 * `avail` is what may be looked at (the buffer, capped by the file's
 * size). Sets out's versions, header_len and data_offset, *pre the
 * preamble's size. */
static int parse_preamble(const unsigned char *p, uint64_t avail, size_t len,
                          uint64_t file_size, const char *name, npyload_header *out,
                          size_t *pre_out, char *err, size_t errlen)
{
    size_t m = avail < NPYL_MAGIC_LEN ? (size_t)avail : NPYL_MAGIC_LEN;
    if (memcmp(p ? (const void *)p : "", NPYL_MAGIC, m) != 0) {
        char ex[NPYL_QUOTE_MAX + 8];
        excerpt(ex, sizeof ex, p, m);
        return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                         "%s: not an NPY file (magic is '%s', expected "
                         "'\\x93NUMPY')",
                         name, ex);
    }
    if (avail < NPYL_MAGIC_LEN + 2) {
        if (file_size < NPYL_MAGIC_LEN + 2)
            return npyl_fail(err, errlen, NPYLOAD_ETRUNCATED,
                             "%s: file holds %" PRIu64 " bytes, too short for "
                             "an NPY preamble",
                             name, file_size);
        return npyl_fail(err, errlen, NPYLOAD_ETRUNCATED,
                         "%s: %zu bytes given, the NPY preamble needs more",
                         name, len);
    }
    int major = p[6], minor = p[7];
    if ((major != 1 && major != 2 && major != 3) || minor != 0)
        return npyl_fail(err, errlen, NPYLOAD_EUNSUPPORTED,
                         "%s: NPY format version %d.%d is not supported "
                         "(1.0, 2.0 and 3.0 are)",
                         name, major, minor);
    out->major_version = major;
    out->minor_version = minor;
    size_t pre = major == 1 ? 10 : 12;
    if (avail < pre) {
        if (file_size < pre)
            return npyl_fail(err, errlen, NPYLOAD_ETRUNCATED,
                             "%s: file holds %" PRIu64 " bytes, too short for "
                             "a version %d.0 NPY preamble (%zu bytes)",
                             name, file_size, major, pre);
        return npyl_fail(err, errlen, NPYLOAD_ETRUNCATED,
                         "%s: %zu bytes given, the NPY preamble needs %zu",
                         name, len, pre);
    }
    uint64_t hlen = major == 1
                        ? (uint64_t)p[8] | (uint64_t)p[9] << 8
                        : (uint64_t)p[8] | (uint64_t)p[9] << 8 |
                              (uint64_t)p[10] << 16 | (uint64_t)p[11] << 24;
    /* Checked before it sizes anything: our callers allocate this much. */
    if (hlen > NPYLOAD_MAX_HEADER_LEN)
        return npyl_fail(err, errlen, NPYLOAD_ETOOBIG,
                         "%s: header length %" PRIu64 " is over the limit of "
                         "%u bytes",
                         name, hlen, (unsigned)NPYLOAD_MAX_HEADER_LEN);
    uint64_t data_offset = pre + hlen;
    out->header_len = hlen;
    out->data_offset = data_offset;
    if (data_offset > file_size)
        return npyl_fail(err, errlen, NPYLOAD_ETRUNCATED,
                         "%s: header of %" PRIu64 " bytes from offset %zu runs "
                         "past the end of the file (%" PRIu64 " bytes)",
                         name, hlen, pre, file_size);
    if (data_offset > len)
        return npyl_fail(err, errlen, NPYLOAD_ETRUNCATED,
                         "%s: header needs %" PRIu64 " bytes, %zu given", name,
                         data_offset, len);
    *pre_out = pre;
    return 0;
}

/* The array's byte size. numpy refuses an array whose byte size overflows
 * intp (zero-length axes aside), so the same bound holds here: at most
 * INT64_MAX bytes. */
static int array_bytes(const npyl_dtype *dt, int ndim, const int64_t *shape,
                       const char *name, uint64_t *out, char *err, size_t errlen)
{
    uint64_t bytes = dt->size;
    int empty = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 0) {
            empty = 1;
            continue;
        }
        if (npyl_mul_u64(bytes, (uint64_t)shape[d], &bytes) ||
            bytes > (uint64_t)INT64_MAX) {
            char sb[NPYLOAD_MAX_DIMS * 24 + 8];
            npyl_shape_repr(sb, sizeof sb, ndim, shape);
            return npyl_fail(err, errlen, NPYLOAD_ETOOBIG,
                             "%s: shape %s of '%s' is over 2^63-1 bytes (the "
                             "byte size overflows 64 bits)",
                             name, sb, dt->str);
        }
    }
    *out = empty ? 0 : bytes;
    return 0;
}

int npyload_parse_header(const void *buf, size_t len, uint64_t file_size,
                         const char *name, npyload_header *out, char *err,
                         size_t errlen)
{
    if (!name)
        name = "<memory>";
    if (!out || (!buf && len))
        return npyl_fail(err, errlen, NPYLOAD_EINVAL,
                         "%s: npyload_parse_header: NULL %s", name,
                         out ? "buffer" : "output");
    memset(out, 0, sizeof *out);
    if (err && errlen)
        err[0] = '\0';
    const unsigned char *p = buf;
    out->file_bytes = file_size == UINT64_MAX ? 0 : file_size;
    /* Cap what we look at by the file's size too, in case a caller's buffer
     * runs past it. */
    uint64_t avail = len;
    if (file_size < avail)
        avail = file_size;
    size_t pre = 0;
    int rc = parse_preamble(p, avail, len, file_size, name, out, &pre, err, errlen);
    if (rc)
        return rc;

    npyl_lex x = {
        .s = p + pre,
        .n = (size_t)out->header_len,
        .i = 0,
        .base = pre,
        .allow_long = out->major_version <= 2,
        .name = name,
        .err = err,
        .errlen = errlen,
    };
    if (out->major_version == 3) {
        size_t bad = utf8_bad(x.s, x.n);
        if (bad < x.n)
            return npyl_fail(err, errlen, NPYLOAD_EFORMAT,
                             "%s: at byte %zu: version 3.0 header is not valid "
                             "UTF-8",
                             name, pre + bad);
    }
    npyl_dtype dt;
    int fortran = 0, ndim = 0;
    int64_t shape[NPYLOAD_MAX_DIMS];
    uint64_t bytes = 0;
    rc = parse_dict(&x, &dt, &fortran, &ndim, shape);
    if (!rc)
        rc = array_bytes(&dt, ndim, shape, name, &bytes, err, errlen);
    if (rc)
        return rc;

    memcpy(out->descr, dt.str, sizeof out->descr);
    out->kind = dt.kind;
    out->byteorder = dt.order;
    out->itemsize = dt.size;
    out->fortran_order = fortran;
    out->ndim = ndim;
    memcpy(out->shape, shape, (size_t)ndim * sizeof shape[0]);
    out->data_bytes = bytes;
    /* Bytes past the data are allowed (numpy reads exactly what it needs);
     * too few are not. Cannot overflow: data_offset <= 2^20 + 12, bytes <=
     * INT64_MAX. */
    if (file_size != UINT64_MAX && out->data_offset + bytes > file_size)
        return npyl_fail(err, errlen, NPYLOAD_ETRUNCATED,
                         "%s: header says %" PRIu64 " bytes of data from offset "
                         "%" PRIu64 ", file holds %" PRIu64 " bytes",
                         name, bytes, out->data_offset, file_size);
    return 0;
}

/* What a non-regular file is, for messages. */
