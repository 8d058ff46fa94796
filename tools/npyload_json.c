/* npyload_json: see npyload_json.h. */
#include "npyload_json.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

/* Length of the well-formed UTF-8 sequence at p, or 0. */
static size_t nj_utf8_len(const unsigned char *p)
{
    unsigned char c = p[0];
    size_t n = c >= 0xf0 && c <= 0xf4   ? 4
               : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xc2 && c <= 0xdf ? 2
                                        : 0;
    for (size_t k = 1; k < n; k++)
        if ((p[k] & 0xc0) != 0x80)
            return 0;
    return n;
}

void nj_string(FILE *f, const char *s)
{
    if (!s) { /* NULL is JSON null */
        fputs("null", f);
        return;
    }
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    while (*p) {
        unsigned char c = *p;
        size_t n = 1;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else if (c < 0x80)
            fputc(c, f);
        else if ((n = nj_utf8_len(p)) != 0)
            fwrite(p, 1, n, f);
        else {
            fprintf(f, "\\u%04x", c); /* a stray byte: its Latin-1 code point */
            n = 1;
        }
        p += n;
    }
    fputc('"', f);
}

int nj_printf(FILE *f, const char *fmt, ...)
{
    va_list ap;
    int rc = 0;
    va_start(ap, fmt);
    for (const char *p = fmt; *p && rc == 0; p++) {
        if (*p != '%') {
            fputc(*p, f);
            continue;
        }
        p++;
        if (*p == '%') {
            fputc('%', f);
        } else if (*p == 's') {
            nj_string(f, va_arg(ap, const char *));
        } else if (*p == 'd') {
            fprintf(f, "%d", va_arg(ap, int));
        } else if (*p == 'c') {
            fputs(va_arg(ap, int) ? "true" : "false", f);
        } else if (*p == 'g') {
            double v = va_arg(ap, double);
            if (isfinite(v))
                fprintf(f, "%g", v);
            else
                fputs("null", f);
        } else if (strncmp(p, "lld", 3) == 0) {
            fprintf(f, "%lld", va_arg(ap, long long));
            p += 2;
        } else if (strncmp(p, "llu", 3) == 0) {
            fprintf(f, "%llu", va_arg(ap, unsigned long long));
            p += 2;
        } else if (strncmp(p, "zu", 2) == 0) {
            fprintf(f, "%zu", va_arg(ap, size_t));
            p += 1;
        } else {
            rc = -1; /* a template the writer does not know: a bug */
        }
    }
    va_end(ap);
    return rc == 0 && !ferror(f) ? 0 : -1;
}
