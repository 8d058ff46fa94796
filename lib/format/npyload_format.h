/* NPY headers and the dtype model. Depends on lib/common only.
 *   npyload_dtype.c         numpy dtype strings: the one dtype model of lib/
 *   npyload_header_parse.c  npyload_parse_header (untrusted input)
 *   npyload_header_file.c   npyload_read_header, npyload_format_header
 * Internal helpers for other modules: */
#ifndef NPYLOAD_FORMAT_H
#define NPYLOAD_FORMAT_H

#include "../common/npyload_common.h"

#define NPYL_MAGIC "\x93NUMPY"
#define NPYL_MAGIC_LEN 6
#define NPYL_ALIGN 64 /* numpy pads preamble + header to a multiple of 64 */

/* A numpy dtype as npyload loads it: a fixed-size bool, integer, float or
 * complex number in a byte order. */
typedef struct npyl_dtype {
    char order; /* normalised: '<', '>' or '|' (one-byte types) */
    char kind;  /* 'b', 'i', 'u', 'f', 'c' */
    size_t size;
    char str[NPYLOAD_DESCR_LEN]; /* normalised descr: "<f4", "|u1", ">i8" */
} npyl_dtype;

/* '<' on a little-endian host, '>' on a big-endian one. */
NPYL_HIDDEN char npyl_host_order(void);

/* Classifies the numpy type string `s` of `n` bytes (not NUL-terminated;
 * '=' and '|' on a wider type mean the host's order, '?' is bool). Returns
 * 0 and fills *dt; NPYLOAD_EUNSUPPORTED for types numpy knows that npyload
 * does not load (object, strings, void, datetime, long double...);
 * NPYLOAD_EFORMAT for strings numpy would not accept. *why then says which
 * ("is an object dtype (pickled Python objects), not supported"). */
NPYL_HIDDEN int npyl_dtype_parse(const char *s, size_t n, npyl_dtype *dt,
                                 const char **why);

/* Bytes per element for a normalised descr, or 0 if unsupported. */
NPYL_HIDDEN size_t npyl_descr_itemsize(const char *descr);

/* Python's repr of a tuple of ints: "()", "(3,)", "(3, 4)". Returns the
 * length written, or -1 if cap is too small. */
NPYL_HIDDEN int npyl_shape_repr(char *dst, size_t cap, int ndim,
                                const int64_t *shape);

#endif
