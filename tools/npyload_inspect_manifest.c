/* npyload_inspect_manifest: a dataset manifest's facts for npyload-inspect
 * (see the header). The JSON is parsed by jansson, a maintained library
 * (Debian libjansson-dev), never by hand. */
#include "npyload_inspect_manifest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tool_is_manifest(const char *path)
{
    size_t n = strlen(path);
    return n > 5 && strcmp(path + n - 5, ".json") == 0 && !strstr(path, "://");
}

void tool_manifest_free(tool_manifest *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nfiles; i++)
        free(m->files[i].path);
    for (size_t i = 0; i < m->nfields; i++)
        free(m->fields[i]);
    free(m->files);
    free(m->fields);
    free(m->split);
    free(m->writer);
    memset(m, 0, sizeof *m);
}

#ifndef NPYLOAD_TOOLS_JANSSON

int tool_manifest_read(const char *path, tool_manifest *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    snprintf(err, errlen,
             "%s: this npyload-inspect was built without jansson (Debian libjansson-dev), "
             "so it does not read manifests; npyload.inspect() in Python does",
             path);
    return 1;
}

#else
#include <jansson.h>

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static int64_t int_or(json_t *o, const char *key, int64_t dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

int tool_manifest_read(const char *path, tool_manifest *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    json_error_t je;
    /* A manifest lists every file of a split: a few MB at most. */
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        snprintf(err, errlen, "%s: not a JSON manifest: line %d: %s", path, je.line, je.text);
        return 1;
    }
    int rc = 1;
    const char *fmt = json_string_value(json_object_get(root, "format"));
    json_t *fields = json_object_get(root, "fields");
    if (!json_is_object(root) || !fmt || strcmp(fmt, "npyload-manifest") != 0) {
        snprintf(err, errlen, "%s: not an npyload manifest (no \"format\": "
                 "\"npyload-manifest\")", path);
        goto out;
    }
    m->version = (int)int_or(root, "version", 0);
    if (m->version != 1) {
        snprintf(err, errlen, "%s: manifest version %d; this npyload reads 1 .. 1", path,
                 m->version);
        goto out;
    }
    if (!json_is_object(fields) || json_object_size(fields) == 0) {
        snprintf(err, errlen, "%s: the manifest has no fields", path);
        goto out;
    }
    m->split = dup_or_null(json_string_value(json_object_get(root, "split")));
    m->writer = dup_or_null(json_string_value(json_object_get(root, "writer")));
    m->samples = int_or(root, "samples", -1);
    m->samples_per_file = int_or(root, "samples_per_file", -1);

    /* The directory the entries' paths are relative to. */
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) + 1 : 0;
    size_t total = 0;
    const char *key;
    json_t *f;
    json_object_foreach(fields, key, f) {
        json_t *files = json_object_get(f, "files");
        if (!json_is_array(files) || json_array_size(files) == 0) {
            snprintf(err, errlen, "%s: field '%s': files must be a non-empty list", path, key);
            goto out;
        }
        total += json_array_size(files);
    }
    m->fields = calloc(json_object_size(fields), sizeof *m->fields);
    m->files = calloc(total, sizeof *m->files);
    if (!m->fields || !m->files) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto out;
    }
    json_object_foreach(fields, key, f) {
        if (!(m->fields[m->nfields++] = strdup(key))) {
            snprintf(err, errlen, "%s: out of memory", path);
            goto out;
        }
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(f, "files"), i, x) {
            const char *rel = json_string_value(json_object_get(x, "path"));
            json_t *size = json_object_get(x, "size");
            if (!rel || !*rel || rel[0] == '/' || strcmp(rel, "..") == 0 ||
                strncmp(rel, "../", 3) == 0 || strstr(rel, "/../") ||
                (strlen(rel) >= 3 && strcmp(rel + strlen(rel) - 3, "/..") == 0) ||
                !json_is_integer(size)) {
                snprintf(err, errlen, "%s: field '%s' file %zu: files must be "
                         "{\"path\": relative path, \"size\": int, ...}", path, key, i);
                goto out;
            }
            tool_manifest_file *mf = &m->files[m->nfiles];
            if (!(mf->path = malloc(dlen + strlen(rel) + 1))) {
                snprintf(err, errlen, "%s: out of memory", path);
                goto out;
            }
            memcpy(mf->path, path, dlen);
            strcpy(mf->path + dlen, rel);
            mf->size = (int64_t)json_integer_value(size);
            mf->samples = int_or(x, "samples", -1);
            m->nfiles++;
        }
    }
    rc = 0;
out:
    json_decref(root);
    if (rc)
        tool_manifest_free(m);
    return rc;
}
#endif
