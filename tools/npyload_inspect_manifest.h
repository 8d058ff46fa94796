/* npyload_inspect_manifest: what npyload-inspect reads of a dataset manifest
 * (SPLIT.manifest.json, the JSON that npyload.write writes last beside a
 * split's files; format in python_bindings/npyload/_manifest.py): the
 * dataset's facts and its files, resolved against the manifest's directory,
 * with the size and sample count the manifest gives each. Parsed with
 * jansson (Debian libjansson-dev); a build without it reports that. */
#ifndef NPYLOAD_INSPECT_MANIFEST_H
#define NPYLOAD_INSPECT_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

typedef struct tool_manifest_file {
    char *path;         /* the manifest's directory + the entry's relative path */
    int64_t size;       /* bytes of the stored file */
    int64_t samples;    /* -1 when the entry has none */
} tool_manifest_file;

typedef struct tool_manifest {
    int version;
    char *split, *writer;          /* NULL when absent */
    int64_t samples, samples_per_file;   /* -1 when absent */
    char **fields;                 /* names, in the manifest's order */
    size_t nfields;
    tool_manifest_file *files;     /* every field's files, field by field */
    size_t nfiles;
} tool_manifest;

/* 1 when `path` names a manifest (a local path ending in ".json"). */
int tool_is_manifest(const char *path);

/* Reads and checks the manifest at `path` (format "npyload-manifest",
 * version 1, relative file paths without ".."). @return : 0 and *m
 * (tool_manifest_free it), or 1 with "path: problem" in err. */
int tool_manifest_read(const char *path, tool_manifest *m, char *err, size_t errlen);

/* Frees what tool_manifest_read filled in; safe on a zeroed struct. */
void tool_manifest_free(tool_manifest *m);

#endif
