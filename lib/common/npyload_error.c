#include <string.h>

#include "npyload_common.h"

const char *npyload_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
    case NPYLOAD_EOF:
        return "end of epoch";
#define NPYLOAD_XX_CASE(name, code, msg)                                       \
    case NPYLOAD_E##name:                                                      \
        return msg;
        NPYLOAD_ERROR_MAP(NPYLOAD_XX_CASE)
#undef NPYLOAD_XX_CASE
    default:
        break;
    }
    if (err < 0 && err > -4096) {
        /* strerror() is not thread-safe in general; strerrordesc_np (glibc
         * 2.32+) returns a static description. */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
        const char *s = strerrordesc_np(-err);
        if (s)
            return s;
#endif
        return "system error";
    }
    return "unknown error";
}

const char *npyload_version_string(void) { return NPYLOAD_VERSION_STRING; }
