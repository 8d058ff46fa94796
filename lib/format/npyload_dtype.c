/* numpy dtype strings: the one dtype model of lib/ (npyload_format.h).
 * The header parser classifies a header's descr with it, the transform
 * engine plans from it, the loader compares fields with it. */
#include "npyload_format.h"

#include <stdio.h>
#include <string.h>

char npyl_host_order(void)
{
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first ? '<' : '>';
}

int npyl_dtype_parse(const char *s, size_t n, npyl_dtype *dt,
                     const char **why)
{
    size_t pos = 0;
    char order = '=';
    if (n == 1 && s[0] == '?') {
        /* numpy's one-character code for bool */
        order = '|';
        dt->kind = 'b';
        dt->size = 1;
        goto normalise;
    }
    if (n > 0 && (s[0] == '<' || s[0] == '>' || s[0] == '|' || s[0] == '=')) {
        order = s[0];
        pos = 1;
    }
    if (pos >= n) {
        *why = "is not a numpy dtype (no type code)";
        return NPYLOAD_EFORMAT;
    }
    char kind = s[pos++];
    switch (kind) {
    case 'O':
        *why = "is an object dtype (pickled Python objects), not supported";
        return NPYLOAD_EUNSUPPORTED;
    case 'U':
        *why = "is a unicode string dtype, not supported";
        return NPYLOAD_EUNSUPPORTED;
    case 'S':
    case 'a':
        *why = "is a byte string dtype, not supported";
        return NPYLOAD_EUNSUPPORTED;
    case 'V':
        *why = "is a void (raw bytes) dtype, not supported";
        return NPYLOAD_EUNSUPPORTED;
    case 'M':
        *why = "is a datetime64 dtype, not supported";
        return NPYLOAD_EUNSUPPORTED;
    case 'm':
        *why = "is a timedelta64 dtype, not supported";
        return NPYLOAD_EUNSUPPORTED;
    case '?':
        if (pos == n) {
            dt->kind = 'b';
            dt->size = 1;
            goto normalise;
        }
        *why = "is not a numpy dtype";
        return NPYLOAD_EFORMAT;
    case 'b': case 'i': case 'u': case 'f': case 'c':
        break;
    default:
        *why = "is not a numpy dtype";
        return NPYLOAD_EFORMAT;
    }
    if (pos == n) {
        /* 'f', 'i'... are numpy type codes without an explicit size (and 'b'
         * alone means int8): numpy never writes them in a header. */
        *why = "has no item size (expected a type string such as '<f4')";
        return NPYLOAD_EUNSUPPORTED;
    }
    /* At most 2 digits: every size we know has 1 or 2, and it keeps the
     * accumulator far from overflow whatever the input. */
    if (n - pos > 2 || s[pos] == '0') {
        *why = "is not a numpy dtype (bad item size)";
        return NPYLOAD_EFORMAT;
    }
    size_t size = 0;
    for (; pos < n; pos++) {
        if (s[pos] < '0' || s[pos] > '9') {
            *why = "is not a numpy dtype (bad item size)";
            return NPYLOAD_EFORMAT;
        }
        size = size * 10 + (size_t)(s[pos] - '0');
    }
    int ok;
    switch (kind) {
    case 'b': ok = size == 1; break;
    case 'i': case 'u': ok = size == 1 || size == 2 || size == 4 || size == 8; break;
    case 'f': ok = size == 2 || size == 4 || size == 8; break;
    default: ok = size == 8 || size == 16; break; /* 'c' */
    }
    if (!ok) {
        if ((kind == 'f' && (size == 12 || size == 16)) ||
            (kind == 'c' && (size == 24 || size == 32))) {
            *why = "is a long double dtype, not supported";
            return NPYLOAD_EUNSUPPORTED;
        }
        *why = "is not a numpy dtype (bad item size)";
        return NPYLOAD_EFORMAT;
    }
    dt->kind = kind;
    dt->size = size;
normalise:
    /* numpy's own reading: byte order is meaningless for one byte ('|'),
     * and '=' (or '|' on a wider type) means the host's order. */
    if (dt->size == 1)
        dt->order = '|';
    else if (order == '<' || order == '>')
        dt->order = order;
    else
        dt->order = npyl_host_order();
    snprintf(dt->str, sizeof dt->str, "%c%c%zu", dt->order, dt->kind,
             dt->size);
    return 0;
}

size_t npyl_descr_itemsize(const char *descr)
{
    if (!descr)
        return 0;
    npyl_dtype dt;
    const char *why;
    size_t n = strnlen(descr, NPYLOAD_DESCR_LEN);
    if (n >= NPYLOAD_DESCR_LEN || npyl_dtype_parse(descr, n, &dt, &why) != 0)
        return 0;
    return dt.size;
}
