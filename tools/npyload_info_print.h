/* The build and machine facts of npyload_get_build_info(), as the tools
 * print them: the block npyload-bench starts with (the C half of
 * `python -m npyload info`, which adds Python's side) and the bench JSON's
 * "build_info" object (bench/schema.json). Public header only. */
#ifndef NPYLOAD_INFO_PRINT_H
#define NPYLOAD_INFO_PRINT_H

#include <stdio.h>

#include "npyload.h"

/* Fills *bi (npyload_get_build_info) and, when f is not NULL, prints the
 * block to f. @return : 0, or the library's error (bi zeroed). */
int ni_build_info(FILE *f, npyload_build_info *bi);

/* Writes `,\n  "build_info": {...}` (a member of the document's top-level
 * object, as the bench's JSON writer continues one): the keys and value
 * types of Python's npyload.build_info() without its Python entries. */
void ni_build_info_json(FILE *f, const npyload_build_info *bi);

#endif
