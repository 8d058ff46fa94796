/* Number arguments of the command-line tools (npyload_args.h). */
#include "npyload_args.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

static int range_error(const char *prog, const char *opt, const char *s,
                       const char *why, const char *lo, const char *hi)
{
    fprintf(stderr, "%s: %s %s: %s (%s .. %s)\n", prog, opt, s, why, lo, hi);
    return -1;
}

static int fail_i64(const char *prog, const char *opt, const char *s,
                    const char *why, int64_t lo, int64_t hi)
{
    char l[24], h[24];
    snprintf(l, sizeof l, "%" PRId64, lo);
    snprintf(h, sizeof h, "%" PRId64, hi);
    return range_error(prog, opt, s, why, l, h);
}

static int fail_u64(const char *prog, const char *opt, const char *s,
                    const char *why, uint64_t lo, uint64_t hi)
{
    char l[24], h[24];
    snprintf(l, sizeof l, "%" PRIu64, lo);
    snprintf(h, sizeof h, "%" PRIu64, hi);
    return range_error(prog, opt, s, why, l, h);
}

/* strtoll/strtoull skip blanks and take a sign themselves: only a digit
 * (or, signed, one '-' or '+' and a digit) may start a value. */
static int starts_number(const char *s, int sign_ok)
{
    if (sign_ok && (*s == '-' || *s == '+'))
        s++;
    return *s >= '0' && *s <= '9';
}

int tool_arg_i64(const char *prog, const char *opt, const char *s, int64_t lo,
                 int64_t hi, int64_t *out)
{
    char *end = NULL;
    if (!starts_number(s, 1))
        return fail_i64(prog, opt, s, "not an integer", lo, hi);
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end)
        return fail_i64(prog, opt, s, "not an integer", lo, hi);
    if (errno == ERANGE || v < lo || v > hi)
        return fail_i64(prog, opt, s, "out of range", lo, hi);
    *out = v;
    return 0;
}

int tool_arg_u64(const char *prog, const char *opt, const char *s, uint64_t lo,
                 uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    if (*s == '-' && starts_number(s + 1, 0))
        return fail_u64(prog, opt, s, "out of range", lo, hi);
    if (!starts_number(s, 0))
        return fail_u64(prog, opt, s, "not an integer", lo, hi);
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end)
        return fail_u64(prog, opt, s, "not an integer", lo, hi);
    if (errno == ERANGE || v < lo || v > hi)
        return fail_u64(prog, opt, s, "out of range", lo, hi);
    *out = v;
    return 0;
}

int tool_arg_size(const char *prog, const char *opt, const char *s,
                  uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    if (*s == '-' && starts_number(s + 1, 0))
        return fail_u64(prog, opt, s, "out of range", lo, hi);
    if (!starts_number(s, 0))
        return fail_u64(prog, opt, s, "not a byte count", lo, hi);
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    int range = errno == ERANGE;
    unsigned shift = 0;
    if (*end == 'K' || *end == 'k')
        shift = 10, end++;
    else if (*end == 'M' || *end == 'm')
        shift = 20, end++;
    else if (*end == 'G' || *end == 'g')
        shift = 30, end++;
    if (shift && (*end == 'i' || *end == 'I') && (end[1] == 'B' || end[1] == 'b'))
        end += 2;
    if (*end)
        return fail_u64(prog, opt, s, "not a byte count", lo, hi);
    if (range || v > (UINT64_MAX >> shift) || (v << shift) < lo ||
        (v << shift) > hi)
        return fail_u64(prog, opt, s, "out of range", lo, hi);
    *out = (uint64_t)v << shift;
    return 0;
}
