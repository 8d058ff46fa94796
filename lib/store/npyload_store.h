/* lib/store: the storage interface under the loader. Depends on common,
 * format, io, remote and zst. */
#ifndef NPYLOAD_STORE_H
#define NPYLOAD_STORE_H

#include "../common/npyload_common.h"
#include "../format/npyload_format.h"
#include "../remote/npyload_remote.h"
#include "../zst/npyload_zst.h"

/* npyload_store_remote.c: a probed remote object as a reader (its head
 * and tail bytes from the probe, the rest by ranged GETs checked against
 * the probe's ETag), shared by start and npyload_remote_inspect. */
typedef struct npyl_rsrc {
    npyl_remote *r;
    const npyl_remote_probe *p;
    npyl_remote_obj o;
} npyl_rsrc;
NPYL_HIDDEN void npyl_rsrc_init(npyl_rsrc *s, npyl_remote *r, const npyl_remote_probe *p);
/* npyl_zst_read_fn over a npyl_rsrc. */
NPYL_HIDDEN int npyl_rsrc_read(void *ctx, void *buf, size_t n, uint64_t off);
/* The NPY header of a probed .npy (more bytes fetched when it is longer
 * than the head). */
NPYL_HIDDEN int npyl_rsrc_npy_header(npyl_rsrc *s, npyload_header *h, char *err, size_t errlen);
/* npyl_remote_want_tail for start: a .npy.zst (the seek table) and a
 * '|u1' .npy with bytes after its data (a narrowed store's trailer). */
NPYL_HIDDEN int npyl_rsrc_want_tail(const npyl_remote_probe *p);

#endif
