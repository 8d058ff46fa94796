/* NPY header parsing and writing: the public npyload_parse_header,
 * npyload_read_header and npyload_format_header live in npyload_header.c.
 * Depends on lib/common only. Internal helpers for other modules: */
#ifndef NPYLOAD_FORMAT_H
#define NPYLOAD_FORMAT_H

#include "../common/npyload_common.h"

/* Bytes per element for a normalised descr, or 0 if unsupported. */
NPYL_HIDDEN size_t npyl_descr_itemsize(const char *descr);

#endif
