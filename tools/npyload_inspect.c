/*
 * npyload-inspect — print the header facts of NPY files.
 *
 *   npyload-inspect [--json] [--verify] FILE...
 *
 * One record per file: version, descr, shape, fortran_order, data_offset,
 * data_bytes, file_bytes. Only the header bytes are read (npyload_read_header),
 * so inspecting a 250 GB dataset costs one small read per file.
 *
 * A .npy.zst (told by its first bytes, whatever its name) gives the same
 * facts with the same keys and values as the .npy it decompresses to (read
 * from frame 0 after the seek table is validated, as the loader does), plus
 * compressed_bytes, ratio, frames (frame 0, the header, in) and
 * samples_per_frame. A malformed seek table is an error naming the file.
 *
 * --verify also decodes every frame of each .npy.zst with the loader's checks
 * (npyload_zst_file_verify: sizes, checksums, zstd windows) and reports the
 * first bad frame as the file's error (index, byte offset, what is wrong;
 * JSON: "bad_frame", "bad_offset"); a good file gets "verified": true. A .npy
 * carries no checksums: its facts are printed as without --verify.
 *
 * A malformed file is reported on stderr ("FILE: problem"), and with --json
 * also as an error record {"file": ..., "error": ...} on stdout so that a
 * program reading the JSON Lines sees every file; the remaining files are
 * still reported and the exit status is 1 at the end.
 *
 * Remote paths (s3://bucket/key, http(s)://host/path) are inspected with
 * ranged GETs as the loader's start reads them (npyload_remote_inspect:
 * the first 4 KiB, and the seek table and frame 0 of a .npy.zst), with the
 * same facts and keys as the local file's; an s3:// pattern with wildcards
 * is listed (ListObjectsV2) and each object inspected in order. The
 * configuration comes from the AWS environment and ~/.aws
 * (npyload_remote_env.c, the Python package's precedence); --verify reads
 * every frame of a remote .npy.zst with ranged GETs.
 *
 * A dataset manifest (a local FILE.json, the SPLIT.manifest.json that
 * npyload.write writes; read with jansson, npyload_inspect_manifest.c)
 * gives one record of the dataset's facts (JSON: "manifest", "version",
 * "split", "writer", "samples", "samples_per_file", "files", "fields"),
 * then each of its files as above, each checked against the manifest's
 * size and sample count (a mismatch is the file's error). s3:// manifests
 * are read by npyload.inspect() in Python.
 *
 * Exit status: 0 all files read, 1 at least one file failed, 2 usage error.
 *
 * Uses include/npyload.h (the .npy.zst file API and the remote client
 * included), libc, the tools' JSON writer (npyload_json.c) and their remote
 * configuration (npyload_remote_env.c).
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "npyload.h"
#include "npyload_inspect_manifest.h"
#include "npyload_json.h"
#include "npyload_remote_env.h"

#define PROG "npyload-inspect"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--json] [--verify] FILE|URL...\n"
            "\n"
            "Prints the header facts of each NPY file: version, descr, shape,\n"
            "fortran_order, data_offset, data_bytes and file_bytes. A .npy.zst\n"
            "(npyload-pack) shows the facts of the .npy inside, plus\n"
            "compressed_bytes, ratio, frames and samples_per_frame.\n"
            "s3://BUCKET/KEY (a pattern with * ? [ is listed) and http(s):// URLs\n"
            "are read with ranged GETs; s3:// takes its endpoint, region and\n"
            "credentials from AWS_ENDPOINT_URL[_S3], AWS_REGION, AWS_ACCESS_KEY_ID,\n"
            "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, AWS_CA_BUNDLE\n"
            "and ~/.aws/{config,credentials}, as the Python package does.\n"
            "A local SPLIT.manifest.json (npyload.write) prints the dataset's facts,\n"
            "then each of its files, checked against the manifest's sizes.\n"
            "\n"
            "  --json     one JSON object per file (JSON Lines); a malformed\n"
            "             file gives {\"file\": ..., \"error\": ...}\n"
            "  --verify   decode every frame of each .npy.zst and check sizes and\n"
            "             checksums (reads the whole file); the first bad frame\n"
            "             is the file's error (index, byte offset, problem)\n"
            "  --remote-config  print the remote configuration the AWS environment\n"
            "             and ~/.aws give (JSON; secrets shown as \"(set)\") and exit\n"
            "  --help     this text\n"
            "  --version  the npyload version\n"
            "  --         end of options (for file names starting with '-')\n"
            "\n"
            "Exit status: 0 all files read, 1 some file failed (each failure\n"
            "is named on stderr), 2 usage error.\n");
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

static double zst_ratio(const npyload_zst_facts *z)
{
    return z->compressed_bytes ? (double)z->hdr.file_bytes / (double)z->compressed_bytes : 0.0;
}

/* What a narrowed file (packed, or stored: a .npy of codes and a trailer)
 * delivers: nvalues codes in its table (0: not narrowed), of vdescr. */
typedef struct narrow_facts {
    uint32_t nvalues;
    char vdescr[NPYLOAD_DESCR_LEN];
} narrow_facts;

/* `z`: the .npy.zst facts, or NULL for a .npy; `verified`: --verify
 * checked every frame of it. */
static void print_text(const char *path, const npyload_header *h,
                       const npyload_zst_facts *z, const narrow_facts *nf, int verified)
{
    printf("%s: v%d.%d %s ", path, h->major_version, h->minor_version,
           h->descr);
    print_shape_tuple(stdout, h);
    printf(" %s data_offset=%llu data_bytes=%llu",
           h->fortran_order ? "F-order" : "C-order",
           (unsigned long long)h->data_offset,
           (unsigned long long)h->data_bytes);
    if (z)
        printf(" compressed_bytes=%llu ratio=%.2fx frames=%lu samples_per_frame=%llu",
               (unsigned long long)z->compressed_bytes, zst_ratio(z), (unsigned long)z->frames,
               (unsigned long long)z->samples_per_frame);
    if (nf->nvalues)
        printf(" narrow_values=%u value_descr=%s", (unsigned)nf->nvalues, nf->vdescr);
    if (verified)
        printf(" verified=%s", z->checksums ? "checksums" : "sizes (no checksums)");
    putchar('\n');
}

static void print_json(const char *path, const npyload_header *h,
                       const npyload_zst_facts *z, const narrow_facts *nf, int verified)
{
    nj_printf(stdout, "{\"file\": %s, \"version\": \"%d.%d\", \"descr\": %s, \"shape\": [",
              path, h->major_version, h->minor_version, h->descr);
    for (int i = 0; i < h->ndim; i++)
        printf("%s%lld", i ? ", " : "", (long long)h->shape[i]);
    nj_printf(stdout,
              "], \"fortran_order\": %c, \"itemsize\": %zu, \"header_len\": %llu, "
              "\"data_offset\": %llu, \"data_bytes\": %llu, \"file_bytes\": %llu",
              h->fortran_order, h->itemsize, (unsigned long long)h->header_len,
              (unsigned long long)h->data_offset, (unsigned long long)h->data_bytes,
              (unsigned long long)h->file_bytes);
    if (z)
        printf(", \"compressed_bytes\": %llu, \"ratio\": %.4f, \"frames\": %lu, "
               "\"samples_per_frame\": %llu",
               (unsigned long long)z->compressed_bytes, zst_ratio(z), (unsigned long)z->frames,
               (unsigned long long)z->samples_per_frame);
    if (nf->nvalues)
        nj_printf(stdout, ", \"narrow_values\": %d, \"value_descr\": %s", (int)nf->nvalues,
                  nf->vdescr);
    if (verified)
        printf(", \"verified\": true, \"checksums\": %s", z->checksums ? "true" : "false");
    fputs("}\n", stdout);
}

/* Returns 0 if `path` was reported, 1 if it failed. `rc` (when not 0):
 * the failure that came before reading (a remote listing). `want`: the
 * manifest's entry for the file (its stored size and samples), or NULL. */
static int inspect_one(npyload_remote_client *client, const char *path, int json, int verify,
                       int rc, const char *why, const tool_manifest_file *want)
{
    npyload_header h;
    char err[1024] = "";
    memset(&h, 0, sizeof h);
    npyload_zst_file *zf = NULL;
    uint32_t bad = UINT32_MAX;
    uint64_t bad_off = 0, cs, ds;
    narrow_facts nf = {0, ""};
    int stored = 0; /* npyload_narrow_stored's answer for a .npy */
    if (rc) {
        snprintf(err, sizeof err, "%s", why);
    } else if (npyload_is_remote(path)) {
        rc = npyload_remote_inspect(client, path, &h, &zf, err, sizeof err);
        if (rc == 0 && zf && verify) {
            rc = npyload_zst_file_verify(zf, &bad, err, sizeof err);
            if (bad != UINT32_MAX)
                npyload_zst_file_frame(zf, bad, &bad_off, &cs, &ds);
        }
        if (rc == 0 && !zf)
            stored = npyload_remote_narrow_stored(client, path, &h, &nf.nvalues, NULL,
                                                  nf.vdescr, err, sizeof err);
    } else if ((rc = npyload_zst_probe(path)) == 1) {
        rc = npyload_zst_file_open(path, &zf, err, sizeof err);
        if (rc == 0 && verify) {
            rc = npyload_zst_file_verify(zf, &bad, err, sizeof err);
            if (bad != UINT32_MAX)
                npyload_zst_file_frame(zf, bad, &bad_off, &cs, &ds);
        }
    } else if (rc == 0) {
        rc = npyload_read_header(path, &h, err, sizeof err);
        if (rc == 0)
            stored = npyload_narrow_stored(path, &h, &nf.nvalues, NULL, nf.vdescr, err,
                                           sizeof err);
    } else if (rc < 0) { /* open or read failed: let the NPY reader say so */
        rc = npyload_read_header(path, &h, err, sizeof err);
    }
    if (rc == 0 && stored < 0)
        rc = stored; /* a stored narrowed file whose trailer is damaged */
    /* The path as shown: a URL's password and query string masked. */
    char shown[1100];
    npyload_mask_urls(path, shown, sizeof shown);
    if (rc == 0 && want) {   /* the file as the manifest says it was written */
        const npyload_zst_facts *z = zf ? npyload_zst_file_facts(zf) : NULL;
        int64_t bytes = z ? (int64_t)z->compressed_bytes : (int64_t)h.file_bytes;
        int64_t samples = z ? (z->hdr.ndim ? z->hdr.shape[0] : -1) : (h.ndim ? h.shape[0] : -1);
        if (bytes != want->size) {
            snprintf(err, sizeof err, "%.700s: %lld bytes, the manifest says %lld", shown,
                     (long long)bytes, (long long)want->size);
            rc = 1;
        } else if (want->samples >= 0 && samples != want->samples) {
            snprintf(err, sizeof err, "%.700s: %lld samples, the manifest says %lld", shown,
                     (long long)samples, (long long)want->samples);
            rc = 1;
        }
    }
    if (rc == 0) {
        const npyload_zst_facts *z = zf ? npyload_zst_file_facts(zf) : NULL;
        if (z) {
            h = z->hdr;
            nf.nvalues = z->narrow_values;
            memcpy(nf.vdescr, z->value_descr, sizeof nf.vdescr);
        }
        if (json)
            print_json(shown, &h, z, &nf, verify && z);
        else
            print_text(shown, &h, z, &nf, verify && z);
        npyload_zst_file_close(zf);
        return 0;
    }
    npyload_zst_file_close(zf);

    /* The library's message already reads "path: problem"; make sure the
     * path is named even if a failure left `err` empty. */
    char msg[2400];
    if (err[0] && strstr(err, shown))
        snprintf(msg, sizeof msg, "%s", err);
    else if (err[0])
        snprintf(msg, sizeof msg, "%s: %s", shown, err);
    else
        snprintf(msg, sizeof msg, "%s: %s", shown, npyload_strerror(rc));
    const char *code = rc == 1 ? "manifest mismatch" : npyload_strerror(rc);

    if (json && bad != UINT32_MAX)
        nj_printf(stdout,
                  "{\"file\": %s, \"error\": %s, \"code\": %s, \"bad_frame\": %llu, "
                  "\"bad_offset\": %llu}\n",
                  shown, msg, code, (unsigned long long)bad, (unsigned long long)bad_off);
    else if (json)
        nj_printf(stdout, "{\"file\": %s, \"error\": %s, \"code\": %s}\n", shown, msg, code);
    /* stdout first so that an interleaved terminal shows the error after the
     * records that precede it. */
    fflush(stdout);
    fprintf(stderr, PROG ": %s\n", msg);
    return 1;
}

/* A manifest: its facts (one record), then each of its files as any file,
 * checked against the manifest's size and samples. Returns 0 or 1. */
static int inspect_manifest(npyload_remote_client *client, const char *path, int json,
                            int verify)
{
    tool_manifest m;
    char err[1024], shown[1100], msg[2400];
    npyload_mask_urls(path, shown, sizeof shown); /* a URL's password never shown */
    if (tool_manifest_read(path, &m, err, sizeof err) != 0) {
        npyload_mask_urls(err, msg, sizeof msg);
        if (json)
            nj_printf(stdout, "{\"file\": %s, \"error\": %s, \"code\": %s}\n", shown, msg,
                      "manifest");
        fflush(stdout);
        fprintf(stderr, PROG ": %s\n", msg);
        return 1;
    }
    if (json) {
        nj_printf(stdout, "{\"manifest\": %s, \"version\": %d, \"split\": %s, "
                  "\"writer\": %s, \"samples\": %lld, \"samples_per_file\": %lld, "
                  "\"files\": %zu, \"fields\": [",
                  shown, m.version, m.split, m.writer, (long long)m.samples,
                  (long long)m.samples_per_file, m.nfiles);
        for (size_t i = 0; i < m.nfields; i++)
            nj_printf(stdout, i ? ", %s" : "%s", m.fields[i]);
        fputs("]}\n", stdout);
    } else {
        printf("%s: npyload manifest v%d, split %s, %lld samples (%lld per file), %zu files, "
               "fields", shown, m.version, m.split ? m.split : "?", (long long)m.samples,
               (long long)m.samples_per_file, m.nfiles);
        for (size_t i = 0; i < m.nfields; i++)
            printf("%s%s", i ? ", " : " ", m.fields[i]);
        printf("%s%s\n", m.writer ? "; written by " : "", m.writer ? m.writer : "");
    }
    int failed = 0;
    for (size_t i = 0; i < m.nfiles; i++)
        failed |= inspect_one(client, m.files[i].path, json, verify, 0, NULL, &m.files[i]);
    tool_manifest_free(&m);
    return failed;
}

/* --remote-config: what npyload_remote_env.c resolved, for a user who
 * wonders which endpoint or profile was taken (and for the tests that
 * hold it to the Python package's precedence). Secrets are never shown. */
static int show_remote_config(void)
{
    tool_remote t;
    char err[1024];
    if (tool_remote_from_env(&t, 0, err, sizeof err) != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return 1;
    }
    const npyload_remote *c = &t.cfg;
    char endpoint[1100];
    npyload_mask_urls(c->endpoint, endpoint, sizeof endpoint);
    nj_printf(stdout, "{\"endpoint\": %s, \"region\": %s, \"access_key\": %s, ",
              c->endpoint ? endpoint : NULL, c->region, c->access_key);
    nj_printf(stdout, "\"secret_key\": %s, \"session_token\": %s, \"ca_file\": %s}\n",
              c->secret_key ? "(set)" : NULL, c->session_token ? "(set)" : NULL, c->ca_file);
    tool_remote_free(&t);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},
        {"verify", no_argument, NULL, 'v'},
        {"remote-config", no_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    int json = 0, verify = 0, c;
    /* GNU getopt permutes: options may follow file names (`npyload-inspect
     * a.npy --json`), `--` ends the options, "-" alone is a file name. */
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'j':
            json = 1;
            break;
        case 'v':
            verify = 1;
            break;
        case 'r':
            return show_remote_config();
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf(PROG " %s\n", npyload_version_string());
            return 0;
        default:
            fprintf(stderr, PROG ": unknown option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind == argc) {
        fprintf(stderr, PROG ": no FILE given\n");
        usage(stderr);
        return 2;
    }

    /* One client for every remote path (none when all are local). */
    npyload_remote_client *client = NULL;
    char err[1024];
    if (tool_remote_client((const char *const *)argv + optind, (size_t)(argc - optind), &client,
                           err, sizeof err) != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return 1;
    }
    int failed = 0;
    for (int i = optind; i < argc; i++) {
        const char *a = argv[i];
        /* Remote paths go through the library's glob, which lists an
         * s3:// pattern and returns a plain path or an http(s):// URL. */
        if (tool_is_manifest(a)) {
            failed |= inspect_manifest(client, a, json, verify);
            continue;
        }
        if (!npyload_is_remote(a)) {
            failed |= inspect_one(client, a, json, verify, 0, NULL, NULL);
            continue;
        }
        char **paths = NULL;
        size_t n = 0;
        int rc = npyload_remote_glob(client, a, &paths, &n, err, sizeof err);
        if (rc) {
            failed |= inspect_one(client, a, json, verify, rc, err, NULL);
            continue;
        }
        for (size_t k = 0; k < n; k++)
            failed |= inspect_one(client, paths[k], json, verify, 0, NULL, NULL);
        npyload_paths_free(paths, n);
    }
    npyload_remote_client_destroy(client);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, PROG ": error writing to stdout\n");
        return 1;
    }
    return failed ? 1 : 0;
}
