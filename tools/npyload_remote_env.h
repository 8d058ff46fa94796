/* The remote configuration of the command-line tools (npyload-inspect,
 * npyload-bench, bench/bench_remote): an npyload_remote built from the
 * standard AWS environment and ~/.aws files, with the precedence of the
 * Python package (python_bindings/npyload/_remote.py), so that a shell
 * that works for `npyload.Loader` works for the tools:
 *
 *   endpoint        AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, profile endpoint_url
 *   region          AWS_REGION, AWS_DEFAULT_REGION, profile region
 *   credentials     AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+
 *                   AWS_SESSION_TOKEN), else the profile's aws_access_key_id,
 *                   aws_secret_access_key, aws_session_token
 *   ca_file         AWS_CA_BUNDLE, profile ca_bundle
 *   profile         AWS_PROFILE, else "default"; its entries come from
 *                   AWS_CONFIG_FILE (~/.aws/config, "[profile NAME]") and
 *                   AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials,
 *                   "[NAME]"), the credentials file winning; a profile named
 *                   by AWS_PROFILE that neither file has is an error
 *
 * The library reads no environment variable; tools may. Messages name the
 * variable or file that is missing or wrong, never a value of a secret. */
#ifndef NPYLOAD_REMOTE_ENV_H
#define NPYLOAD_REMOTE_ENV_H

#include <stddef.h>

#include "npyload.h"

typedef struct tool_remote {
    npyload_remote cfg;       /* points into the strings below */
    char *str[6];             /* owned: endpoint, region, access, secret,
                                 token, ca_file */
} tool_remote;

/* Fills *t from the environment. `need_s3`: s3:// paths will be read, so
 * credentials are required (anonymous s3:// access is not offered by the
 * tools). Returns 0, or -1 with a message (never a secret) in err. */
int tool_remote_from_env(tool_remote *t, int need_s3, char *err, size_t errlen);

/* Wipes the secret and the token and frees the strings. */
void tool_remote_free(tool_remote *t);

/* The configuration paths[0 .. n) need: 1 with *t filled (tool_remote_free
 * it) when any is remote (s3:// ones needing credentials), 0 when none is
 * (*t zeroed), -1 with the message in err. */
int tool_remote_for_paths(const char *const *paths, size_t n, tool_remote *t, char *err,
                          size_t errlen);

/* A client for paths[0 .. n) when any is remote (s3:// needing
 * credentials), else *out = NULL. Returns 0 or -1 with the message in err. */
int tool_remote_client(const char *const *paths, size_t n, npyload_remote_client **out,
                       char *err, size_t errlen);

#endif
