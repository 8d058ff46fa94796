#include "npyload_common.h"

#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int npyl_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

uint64_t npyl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void *npyl_alloc_aligned(size_t size, size_t align)
{
    void *p = NULL;
    if (size == 0)
        size = align;
    if (posix_memalign(&p, align, size) != 0)
        return NULL;
    return p;
}

void npyl_free_aligned(void *p) { free(p); }

int npyl_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

int npyl_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

static int cmp_paths(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int npyl_glob_sorted(const char *pattern, char ***paths, size_t *n)
{
    glob_t g;
    *paths = NULL;
    *n = 0;
    /* GLOB_NOSORT: glob's own sort follows the locale's collation; we want
     * byte order, the same on every machine. */
    int rc = glob(pattern, GLOB_NOSORT | GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH)
        return NPYLOAD_ENOFILES;
    if (rc == GLOB_NOSPACE)
        return -ENOMEM;
    if (rc != 0) {
        globfree(&g);
        return -EIO;
    }
    char **out = calloc(g.gl_pathc ? g.gl_pathc : 1, sizeof *out);
    if (!out) {
        globfree(&g);
        return -ENOMEM;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        out[i] = strdup(g.gl_pathv[i]);
        if (!out[i]) {
            npyl_free_paths(out, i);
            globfree(&g);
            return -ENOMEM;
        }
    }
    *n = g.gl_pathc;
    globfree(&g);
    qsort(out, *n, sizeof *out, cmp_paths);
    *paths = out;
    return *n ? 0 : NPYLOAD_ENOFILES;
}

void npyl_free_paths(char **paths, size_t n)
{
    if (!paths)
        return;
    for (size_t i = 0; i < n; i++)
        free(paths[i]);
    free(paths);
}
