#include "npyload_common.h"

#include <errno.h>
#include <glob.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

int npyl_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
        npyl_mask_urls_in(err, errlen);
    }
    return code;
}

/* ---- URLs in messages ---------------------------------------------------- */

static int scheme_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '+' || c == '-' || c == '.';
}

/* Where a URL written in running text ends: at white space, a quote or an
 * angle bracket (none may appear in a URL unescaped). */
static int url_end(char c) { return !c || strchr(" \t\r\n\"'<>`", c) != NULL; }

size_t npyload_mask_urls(const char *text, char *buf, size_t len)
{
    size_t o = 0;
#define PUT(c)                                                                 \
    do {                                                                       \
        char c_ = (c); /* evaluated once, whether it fits or not */            \
        if (o + 1 < len)                                                       \
            buf[o] = c_;                                                       \
        o++;                                                                   \
    } while (0)
    const char *p = text ? text : "";
    while (*p) {
        const char *sep = strstr(p, "://");
        if (!sep) {
            while (*p)
                PUT(*p++);
            break;
        }
        const char *s = sep; /* the scheme: letters first, then [a-z0-9+.-] */
        while (s > p && scheme_char(s[-1]))
            s--;
        while (s < sep && !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
            s++;
        while (p < sep + 3)
            PUT(*p++);
        if (s == sep)
            continue; /* "://" without a scheme: not a URL */
        const char *end = p, *auth = p, *at = NULL;
        while (!url_end(*end))
            end++;
        while (auth < end && *auth != '/' && *auth != '?' && *auth != '#') {
            if (*auth == '@')
                at = auth; /* the last '@' ends the userinfo */
            auth++;
        }
        if (at) {
            const char *colon = memchr(p, ':', (size_t)(at - p));
            while (p < (colon ? colon + 1 : at))
                PUT(*p++);
            if (colon)
                for (const char *m = "***"; *m; m++)
                    PUT(*m);
            p = at;
        }
        const char *q = memchr(auth, '?', (size_t)(end - auth));
        while (p < (q ? q : end))
            PUT(*p++);
        if (q) {
            /* A query string (a presigned URL's signature): cut; punctuation
             * that ends the sentence, not the URL, stays. */
            for (const char *m = "?..."; *m; m++)
                PUT(*m);
            if (end - q > 1 && strchr(":,;.)]", end[-1]))
                PUT(end[-1]);
            p = end;
        }
    }
    if (len)
        buf[o < len ? o : len - 1] = 0;
#undef PUT
    return o;
}

void npyl_mask_urls_in(char *s, size_t cap)
{
    if (!s || !cap || !strstr(s, "://"))
        return;
    char small[2048];
    size_t n = strlen(s) + 1;
    char *copy = n <= sizeof small ? small : malloc(n);
    if (!copy) {
        s[0] = 0; /* never show what could not be masked */
        return;
    }
    memcpy(copy, s, n);
    npyload_mask_urls(copy, s, cap);
    if (copy != small)
        free(copy);
}

uint64_t npyl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t npyl_thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void npyl_count_cpu(_Atomic uint64_t *sum, uint64_t *mark)
{
    uint64_t now = npyl_thread_cpu_ns();
    if (now > *mark)
        atomic_fetch_add(sum, now - *mark);
    *mark = now;
}

/* The calling thread's CPU time and voluntary context switches, from one
 * getrusage(RUSAGE_THREAD): its user + system time is the thread's exact
 * run time in microseconds (the kernel splits the same sum), so a span
 * needs one system call at each end, not two (a thread CPU clock read costs
 * about as much as getrusage: 0.6 and 0.35 us on the 2-core VM, per batch
 * and worker). vcsw UINT64_MAX when unknown: then every span's off-CPU
 * time counts as blocked. */
static void thread_usage(uint64_t *cpu, uint64_t *vcsw)
{
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) != 0) {
        *cpu = npyl_thread_cpu_ns();
        *vcsw = UINT64_MAX;
        return;
    }
    *cpu = ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
           ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
    *vcsw = (uint64_t)ru.ru_nvcsw;
}

npyl_span npyl_span_begin(void)
{
    npyl_span m = {npyl_now_ns(), 0, 0};
    thread_usage(&m.cpu, &m.vcsw);
    return m;
}

uint64_t npyl_blocked_since(npyl_span m)
{
    uint64_t wall = npyl_now_ns() - m.wall, cpu, v;
    thread_usage(&cpu, &v);
    if (v == m.vcsw && v != UINT64_MAX)
        return 0; /* off the CPU only when preempted: not a wait */
    cpu -= m.cpu;
    return wall > cpu ? wall - cpu : 0;
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

int npyl_sized_in(void *ours, size_t ours_size, const void *theirs,
                  size_t theirs_size, size_t min)
{
    if (theirs_size < min)
        return NPYLOAD_EINVAL;
    /* A newer caller's members this library does not know must be zero
     * (off), or the caller would get less than it asked for (openat2 and
     * clone3 apply the same rule). */
    for (size_t i = ours_size; i < theirs_size; i++)
        if (((const unsigned char *)theirs)[i])
            return NPYLOAD_EUNSUPPORTED;
    size_t n = theirs_size < ours_size ? theirs_size : ours_size;
    memcpy(ours, theirs, n);
    memset((char *)ours + n, 0, ours_size - n);
    return 0;
}

int npyl_sized_out(void *theirs, size_t theirs_size, const void *ours,
                   size_t ours_size, size_t min)
{
    if (theirs_size < min)
        return NPYLOAD_EINVAL;
    size_t n = theirs_size < ours_size ? theirs_size : ours_size;
    memcpy(theirs, ours, n);
    memset((char *)theirs + n, 0, theirs_size - n);
    return 0;
}

const char *npyl_file_kind(unsigned mode)
{
    mode_t m = (mode_t)mode;
    if (S_ISDIR(m))
        return "directory";
    if (S_ISFIFO(m))
        return "FIFO";
    if (S_ISCHR(m))
        return "character device";
    if (S_ISBLK(m))
        return "block device";
    if (S_ISSOCK(m))
        return "socket";
    if (S_ISLNK(m))
        return "symbolic link";
    return "special file";
}

static int cmp_paths(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* glob() says only "aborted" when a directory cannot be read. Name the
 * first directory of the pattern's fixed prefix (before any wildcard) that
 * is missing or unreadable; returns -errno for it, or -EIO if each exists. */
static int explain_glob_error(const char *pattern, char *err, size_t errlen)
{
    size_t meta = strcspn(pattern, "*?[\\");
    size_t len = meta;
    while (len > 0 && pattern[len - 1] != '/')
        len--; /* the directory part of the fixed prefix */
    char *dir = strndup(pattern, len);
    if (!dir)
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    /* Walk down component by component: the first one that fails. */
    for (size_t k = 1; k <= len; k++) {
        if (k < len && dir[k] != '/')
            continue;
        char c = dir[k];
        dir[k] = 0;
        struct stat st;
        int rc = 0;
        if (stat(dir, &st) != 0)
            rc = -errno;
        else if (!S_ISDIR(st.st_mode))
            rc = -ENOTDIR;
        else if (k == len && access(dir, R_OK | X_OK) != 0)
            rc = -errno;
        if (rc) {
            if (rc == -ENOENT)
                npyl_fail(err, errlen, rc, "%s: directory %s does not exist", pattern, dir);
            else if (rc == -ENOTDIR)
                npyl_fail(err, errlen, rc, "%s: %s is not a directory", pattern, dir);
            else
                npyl_fail(err, errlen, rc, "%s: directory %s cannot be read: %s", pattern,
                          dir, npyload_strerror(rc));
            free(dir);
            return rc;
        }
        dir[k] = c;
    }
    free(dir);
    return npyl_fail(err, errlen, -EIO, "%s: a directory matched by the pattern cannot "
                     "be read", pattern);
}

int npyl_glob_sorted(const char *pattern, char ***paths, size_t *n, char *err,
                     size_t errlen)
{
    glob_t g;
    *paths = NULL;
    *n = 0;
    /* GLOB_NOSORT: glob's own sort follows the locale's collation; we want
     * byte order, the same on every machine. */
    int rc = glob(pattern, GLOB_NOSORT | GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        /* Without GLOB_ERR's abort, a missing directory is "no match" too. */
        int why = explain_glob_error(pattern, err, errlen);
        if (why != -EIO)
            return why;
        return npyl_fail(err, errlen, NPYLOAD_ENOFILES, "%s: no files match", pattern);
    }
    if (rc == GLOB_NOSPACE)
        return npyl_fail(err, errlen, -ENOMEM, "%s: out of memory expanding the pattern",
                         pattern);
    if (rc != 0) {
        globfree(&g);
        return explain_glob_error(pattern, err, errlen);
    }
    char **out = calloc(g.gl_pathc ? g.gl_pathc : 1, sizeof *out);
    if (!out) {
        globfree(&g);
        return npyl_fail(err, errlen, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        out[i] = strdup(g.gl_pathv[i]);
        if (!out[i]) {
            npyl_free_paths(out, i);
            globfree(&g);
            return npyl_fail(err, errlen, -ENOMEM, "out of memory");
        }
    }
    *n = g.gl_pathc;
    globfree(&g);
    qsort(out, *n, sizeof *out, cmp_paths);
    *paths = out;
    return *n ? 0 : npyl_fail(err, errlen, NPYLOAD_ENOFILES, "%s: no files match", pattern);
}

void npyl_free_paths(char **paths, size_t n)
{
    if (!paths)
        return;
    for (size_t i = 0; i < n; i++)
        free(paths[i]);
    free(paths);
}
