/*
 * npyload-inspect — print the header facts of NPY files.
 *
 *   npyload-inspect [--json] FILE...
 *
 * One record per file: version, descr, shape, fortran_order, data_offset,
 * data_bytes, file_bytes. Only the header bytes are read (npyload_read_header),
 * so inspecting a 250 GB dataset costs one small read per file.
 *
 * A malformed file is reported on stderr ("FILE: problem"), and with --json
 * also as an error record {"file": ..., "error": ...} on stdout so that a
 * program reading the JSON Lines sees every file; the remaining files are
 * still reported and the exit status is 1 at the end.
 *
 * Exit status: 0 all files read, 1 at least one file failed, 2 usage error.
 *
 * Uses nothing but include/npyload.h and libc.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npyload.h"

#define PROG "npyload-inspect"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--json] FILE...\n"
            "\n"
            "Prints the header facts of each NPY file: version, descr, shape,\n"
            "fortran_order, data_offset, data_bytes and file_bytes.\n"
            "\n"
            "  --json     one JSON object per file (JSON Lines); a malformed\n"
            "             file gives {\"file\": ..., \"error\": ...}\n"
            "  --help     this text\n"
            "  --version  the npyload version\n"
            "  --         end of options (for file names starting with '-')\n"
            "\n"
            "Exit status: 0 all files read, 1 some file failed (each failure\n"
            "is named on stderr), 2 usage error.\n");
}

/* Writes `s` as a JSON string literal: quotes, backslashes and control
 * characters escaped; bytes >= 0x80 passed through (file names are bytes;
 * valid UTF-8 stays valid, and invalid bytes are escaped as \u00XX so the
 * line stays parseable). */
static void json_string(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    while (*p) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
            p++;
        } else if (c == '\n') {
            fputs("\\n", f);
            p++;
        } else if (c == '\t') {
            fputs("\\t", f);
            p++;
        } else if (c == '\r') {
            fputs("\\r", f);
            p++;
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(f, "\\u%04x", c);
            p++;
        } else if (c < 0x80) {
            fputc(c, f);
            p++;
        } else {
            /* Pass a well-formed UTF-8 sequence through; escape stray bytes
             * as the Latin-1 code point of the byte. */
            size_t n = c >= 0xf0 && c <= 0xf4   ? 4
                       : c >= 0xe0 && c <= 0xef ? 3
                       : c >= 0xc2 && c <= 0xdf ? 2
                                                : 0;
            size_t k = 1;
            while (n && k < n && (p[k] & 0xc0) == 0x80)
                k++;
            if (n && k == n) {
                fwrite(p, 1, n, f);
                p += n;
            } else {
                fprintf(f, "\\u%04x", c);
                p++;
            }
        }
    }
    fputc('"', f);
}

static void print_shape_tuple(FILE *f, const npyload_header *h)
{
    fputc('(', f);
    for (int i = 0; i < h->ndim; i++)
        fprintf(f, "%s%lld", i ? ", " : "", (long long)h->shape[i]);
    if (h->ndim == 1)
        fputc(',', f);
    fputc(')', f);
}

static void print_text(const char *path, const npyload_header *h)
{
    printf("%s: v%d.%d %s ", path, h->major_version, h->minor_version,
           h->descr);
    print_shape_tuple(stdout, h);
    printf(" %s data_offset=%llu data_bytes=%llu\n",
           h->fortran_order ? "F-order" : "C-order",
           (unsigned long long)h->data_offset,
           (unsigned long long)h->data_bytes);
}

static void print_json(const char *path, const npyload_header *h)
{
    fputs("{\"file\": ", stdout);
    json_string(stdout, path);
    printf(", \"version\": \"%d.%d\", \"descr\": ", h->major_version,
           h->minor_version);
    json_string(stdout, h->descr);
    fputs(", \"shape\": [", stdout);
    for (int i = 0; i < h->ndim; i++)
        printf("%s%lld", i ? ", " : "", (long long)h->shape[i]);
    printf("], \"fortran_order\": %s, \"itemsize\": %zu, "
           "\"header_len\": %llu, \"data_offset\": %llu, "
           "\"data_bytes\": %llu, \"file_bytes\": %llu}\n",
           h->fortran_order ? "true" : "false", h->itemsize,
           (unsigned long long)h->header_len,
           (unsigned long long)h->data_offset,
           (unsigned long long)h->data_bytes,
           (unsigned long long)h->file_bytes);
}

/* Returns 0 if `path` was reported, 1 if it failed. */
static int inspect_one(const char *path, int json)
{
    npyload_header h;
    char err[1024] = "";
    memset(&h, 0, sizeof h);
    int rc = npyload_read_header(path, &h, err, sizeof err);
    if (rc == 0) {
        if (json)
            print_json(path, &h);
        else
            print_text(path, &h);
        return 0;
    }

    /* The library's message already reads "path: problem"; make sure the
     * path is named even if a failure left `err` empty. */
    char msg[1300];
    if (err[0] && strstr(err, path))
        snprintf(msg, sizeof msg, "%s", err);
    else if (err[0])
        snprintf(msg, sizeof msg, "%s: %s", path, err);
    else
        snprintf(msg, sizeof msg, "%s: %s", path, npyload_strerror(rc));

    if (json) {
        fputs("{\"file\": ", stdout);
        json_string(stdout, path);
        fputs(", \"error\": ", stdout);
        json_string(stdout, msg);
        fputs(", \"code\": ", stdout);
        json_string(stdout, npyload_strerror(rc));
        fputs("}\n", stdout);
    }
    /* stdout first so that an interleaved terminal shows the error after the
     * records that precede it. */
    fflush(stdout);
    fprintf(stderr, PROG ": %s\n", msg);
    return 1;
}

int main(int argc, char **argv)
{
    int json = 0, nfiles = 0, opts_done = 0;
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    if (!files) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    /* Options may follow file names (GNU style), so `npyload-inspect a.npy
     * --json` works; `--` ends the options; "-" alone is a file name. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (opts_done || a[0] != '-' || a[1] == '\0') {
            files[nfiles++] = a;
        } else if (strcmp(a, "--") == 0) {
            opts_done = 1;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            free(files);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf(PROG " %s\n", npyload_version_string());
            free(files);
            return 0;
        } else {
            fprintf(stderr, PROG ": unknown option '%s'\n", a);
            usage(stderr);
            free(files);
            return 2;
        }
    }
    if (nfiles == 0) {
        fprintf(stderr, PROG ": no FILE given\n");
        usage(stderr);
        free(files);
        return 2;
    }

    int failed = 0;
    for (int i = 0; i < nfiles; i++)
        failed |= inspect_one(files[i], json);
    free(files);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, PROG ": error writing to stdout\n");
        return 1;
    }
    return failed ? 1 : 0;
}
