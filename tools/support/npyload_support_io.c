/* The library's own io layer (lib/io) for npyload-bench's ceilings, so that
 * a ceiling reads the same bytes through the same code as the loader rather
 * than through a second hand-written reader. A thin wrapper: the bench's
 * files include only npyload_support.h, never lib/ headers. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>

#include "io/npyload_io.h"
#include "npyload_support.h"

_Static_assert(sizeof(npyload_support_req) == sizeof(npyl_io_req) &&
                   offsetof(npyload_support_req, file) == offsetof(npyl_io_req, file) &&
                   offsetof(npyload_support_req, offset) == offsetof(npyl_io_req, offset) &&
                   offsetof(npyload_support_req, len) == offsetof(npyl_io_req, len) &&
                   offsetof(npyload_support_req, dst) == offsetof(npyl_io_req, dst),
               "npyload_support_req mirrors npyl_io_req");

/* The context borrows its file table (and the paths): the wrapper owns it. */
struct npyload_support_io {
    npyl_io *io;
    npyl_file_info *files;
};

int npyload_support_io_create(const char *const *paths, size_t n, int backend, int direct,
                              unsigned depth, npyload_support_io **out, char *err, size_t len)
{
    npyload_support_io *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!s || !(s->files = calloc(n ? n : 1, sizeof *s->files))) {
        free(s);
        return npyl_fail(err, len, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        int rc = npyl_io_stat(paths[i], &s->files[i]);
        if (rc != 0) {
            npyload_support_io_destroy(s);
            return npyl_fail(err, len, rc, "%s: cannot stat", paths[i]);
        }
        s->files[i].path = paths[i];
    }
    npyl_io_config cfg = {.backend = backend, .direct = direct, .queue_depth = depth,
                          .max_open = n ? (unsigned)n : 1, .files = s->files, .nfiles = n,
                          .gather_max = -1};
    int rc = npyl_io_create(&s->io, &cfg, err, len);
    if (rc != 0) {
        npyload_support_io_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

int npyload_support_io_read(npyload_support_io *s, const npyload_support_req *reqs, size_t n,
                            char *err, size_t len)
{
    size_t bad = 0;
    return npyl_io_read(s->io, (const npyl_io_req *)reqs, n, &bad, NULL, err, len);
}

void npyload_support_io_destroy(npyload_support_io *s)
{
    if (!s)
        return;
    npyl_io_destroy(s->io);
    free(s->files);
    free(s);
}
