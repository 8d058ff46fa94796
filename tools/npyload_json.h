/* npyload_json: the one JSON writer of the tools (npyload-inspect,
 * npyload-bench). No dependency beyond stdio.
 *
 * nj_printf writes a JSON text from a template: the template's characters
 * are copied as they are, and each conversion writes one JSON value:
 *   %s    a JSON string: the C string escaped (NULL writes null); see nj_string
 *   %d %lld %llu %zu   an integer, as printf writes it
 *   %g    a number (printf's %g, 6 significant digits); NaN or an infinity
 *         writes null (JSON has neither)
 *   %c    a boolean: an int argument, 0 writes false, anything else true
 *   %%    a literal '%'
 * The format attribute lets the compiler check the argument types (every
 * conversion above is a valid printf conversion of the same type). */
#ifndef NPYLOAD_JSON_H
#define NPYLOAD_JSON_H

#include <stdio.h>

/* Writes `s` as a JSON string literal: quotes, backslashes and control
 * characters escaped; well-formed UTF-8 passed through, and any other byte
 * >= 0x80 (file names are bytes) escaped as \u00XX so that the document
 * stays valid JSON. */
void nj_string(FILE *f, const char *s);

/* @return : 0, or -1 when the template holds an unsupported conversion or
 * the stream is in error. */
int nj_printf(FILE *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
