/* Number arguments of the command-line tools, parsed one way everywhere.
 *
 * A value is a decimal integer that fills the whole argument (no blanks, no
 * trailing text, no '-' for an unsigned option) inside [lo, hi]. Anything
 * else prints one line on stderr naming the program, the option, the value
 * as given and the accepted range:
 *
 *   npyload-gen: --files 99999999999999999999: out of range (1 .. 100000000)
 *   npyload-gen: --files ten: not an integer (1 .. 100000000)
 *
 * and returns -1 (the tool then exits with its usage status, 2). */
#ifndef NPYLOAD_ARGS_H
#define NPYLOAD_ARGS_H

#include <stdint.h>

int tool_arg_i64(const char *prog, const char *opt, const char *s, int64_t lo,
                 int64_t hi, int64_t *out);
int tool_arg_u64(const char *prog, const char *opt, const char *s, uint64_t lo,
                 uint64_t hi, uint64_t *out);
/* As tool_arg_u64, with an optional binary suffix K, M or G (KiB, MiB,
 * GiB; "k", "KiB" alike); the range is in bytes. */
int tool_arg_size(const char *prog, const char *opt, const char *s,
                  uint64_t lo, uint64_t hi, uint64_t *out);
#endif
