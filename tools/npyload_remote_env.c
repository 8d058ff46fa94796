/* The tools' remote configuration from the AWS environment and ~/.aws
 * (see npyload_remote_env.h for the precedence, which is the Python
 * package's). */
#include "npyload_remote_env.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { S_ENDPOINT, S_REGION, S_ACCESS, S_SECRET, S_TOKEN, S_CA, S_N };
_Static_assert(S_N == sizeof ((tool_remote *)0)->str / sizeof(char *),
               "one string of tool_remote per setting");

/* The keys of one profile read from the INI files. */
static const char *const KEYS[S_N] = {"endpoint_url", "region", "aws_access_key_id",
                                      "aws_secret_access_key", "aws_session_token",
                                      "ca_bundle"};

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* The first of two variables that is set, else `fallback`. */
static const char *env2(const char *a, const char *b, const char *fallback)
{
    const char *v = env(a);
    if (!v && b)
        v = env(b);
    return v ? v : fallback;
}

/* Wipes a string that may hold a secret and frees it. */
static void wipe_free(char **s)
{
    if (*s) {
        explicit_bzero(*s, strlen(*s));
        free(*s);
        *s = NULL;
    }
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
    return s;
}

/* Reads section `section` of INI file `path` into vals (those of KEYS;
 * keys case-insensitive as configparser has them). Returns 1 when the
 * section exists, 0 when not (or no file), -1 when unreadable. */
static int read_section(const char *path, const char *section, char *vals[S_N])
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[4096];
    int in = 0, found = 0;
    while (fgets(line, sizeof line, f)) {
        char *l = trim(line);
        if (!*l || *l == '#' || *l == ';')
            continue;
        if (*l == '[') {
            char *e = strchr(l, ']');
            if (!e)
                continue;
            *e = 0;
            in = strcmp(trim(l + 1), section) == 0;
            found |= in;
            continue;
        }
        if (!in || isspace((unsigned char)line[0]))
            continue; /* a nested value ("s3 =" sub-keys): not ours */
        char *eq = strpbrk(l, "=:");
        if (!eq)
            continue;
        *eq = 0;
        char *k = trim(l), *v = trim(eq + 1);
        for (int i = 0; i < S_N; i++)
            if (strcasecmp(k, KEYS[i]) == 0 && *v) {
                wipe_free(&vals[i]);
                vals[i] = strdup(v);
            }
    }
    explicit_bzero(line, sizeof line);
    fclose(f);
    return found;
}

static void file_path(char *buf, size_t len, const char *var, const char *name)
{
    const char *v = env(var), *home = env("HOME");
    if (v && v[0] == '~' && home)
        snprintf(buf, len, "%s%s", home, v + 1);
    else if (v)
        snprintf(buf, len, "%s", v);
    else
        snprintf(buf, len, "%s/.aws/%s", home ? home : "", name);
}

static void free_vals(char *vals[S_N])
{
    for (int i = 0; i < S_N; i++)
        wipe_free(&vals[i]);
}

int tool_remote_from_env(tool_remote *t, int need_s3, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    const char *profile = env("AWS_PROFILE");
    char cfgp[4096], credp[4096], section[512];
    file_path(cfgp, sizeof cfgp, "AWS_CONFIG_FILE", "config");
    file_path(credp, sizeof credp, "AWS_SHARED_CREDENTIALS_FILE", "credentials");
    const char *pname = profile ? profile : "default";
    char *vals[S_N] = {NULL};
    if (strcmp(pname, "default") == 0)
        snprintf(section, sizeof section, "default");
    else
        snprintf(section, sizeof section, "profile %s", pname);
    int found = read_section(cfgp, section, vals);
    char *cred[S_N] = {NULL};
    found |= read_section(credp, pname, cred);
    for (int i = 0; i < S_N; i++)
        if (cred[i]) { /* the credentials file wins */
            wipe_free(&vals[i]);
            vals[i] = cred[i];
        }
    if (profile && !found) {
        free_vals(vals);
        snprintf(err, errlen, "remote: AWS profile '%s' (AWS_PROFILE) not found in %s or %s",
                 pname, cfgp, credp);
        return -1;
    }
    /* The environment over the files, per setting; the credentials as a
     * pair (a half from each place would be a mix-up). */
    const char *pick[S_N];
    pick[S_ENDPOINT] = env2("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", vals[S_ENDPOINT]);
    pick[S_REGION] = env2("AWS_REGION", "AWS_DEFAULT_REGION", vals[S_REGION]);
    pick[S_ACCESS] = env2("AWS_ACCESS_KEY_ID", NULL, vals[S_ACCESS]);
    pick[S_SECRET] = env2("AWS_SECRET_ACCESS_KEY", NULL, vals[S_SECRET]);
    pick[S_TOKEN] = env2("AWS_SESSION_TOKEN", NULL, vals[S_TOKEN]);
    pick[S_CA] = env2("AWS_CA_BUNDLE", NULL, vals[S_CA]);
    int rc = 0;
    if (!pick[S_ACCESS] != !pick[S_SECRET]) {
        snprintf(err, errlen, "remote: %s is missing while the other half of the credentials "
                              "is set",
                 pick[S_SECRET] ? "AWS_ACCESS_KEY_ID (aws_access_key_id)"
                                : "AWS_SECRET_ACCESS_KEY (aws_secret_access_key)");
        rc = -1;
    } else if (need_s3 && !pick[S_ACCESS]) {
        snprintf(err, errlen, "remote: s3:// paths need credentials: AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY, or profile '%s' in %s (and the "
                              "endpoint: AWS_ENDPOINT_URL for a server other than AWS)",
                 pname, credp);
        rc = -1;
    }
    for (int i = 0; i < S_N && rc == 0; i++)
        if (pick[i] && !(t->str[i] = strdup(pick[i]))) {
            snprintf(err, errlen, "remote: out of memory");
            rc = -1;
        }
    free_vals(vals);
    if (rc) {
        tool_remote_free(t);
        return -1;
    }
    t->cfg.endpoint = t->str[S_ENDPOINT];
    t->cfg.region = t->str[S_REGION];
    t->cfg.access_key = t->str[S_ACCESS];
    t->cfg.secret_key = t->str[S_SECRET];
    t->cfg.session_token = t->str[S_TOKEN];
    t->cfg.ca_file = t->str[S_CA];
    return 0;
}

void tool_remote_free(tool_remote *t)
{
    for (int i = 0; i < S_N; i++)
        wipe_free(&t->str[i]);
    memset(t, 0, sizeof *t);
}

int tool_remote_for_paths(const char *const *paths, size_t n, tool_remote *t, char *err,
                          size_t errlen)
{
    memset(t, 0, sizeof *t);
    int any = 0, s3 = 0;
    for (size_t i = 0; i < n; i++) {
        any |= npyload_is_remote(paths[i]);
        s3 |= strncasecmp(paths[i], "s3://", 5) == 0;
    }
    if (!any)
        return 0;
    return tool_remote_from_env(t, s3, err, errlen) != 0 ? -1 : 1;
}

int tool_remote_client(const char *const *paths, size_t n, npyload_remote_client **out,
                       char *err, size_t errlen)
{
    *out = NULL;
    tool_remote t;
    int any = tool_remote_for_paths(paths, n, &t, err, errlen);
    if (any <= 0)
        return any;
    int rc = npyload_remote_client_create(out, &t.cfg, sizeof t.cfg, err, errlen);
    tool_remote_free(&t);
    return rc ? -1 : 0;
}
