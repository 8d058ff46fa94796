/* Kernel cases shared by the CPU and GPU tests (xform_cases.c). */
#ifndef NPYLOAD_XFORM_CASES_H
#define NPYLOAD_XFORM_CASES_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/npyload_cuda_transform.h"
#include "transform/npyload_transform.h"

/* How a backend runs plan p's npyl_tkx_* kernel: rows records rec, the
 * stored rows (or codes) src of src_n bytes, tables of tab_n bytes (NULL
 * when not narrowed), the output into got (out_n bytes), all host memory;
 * fails the test on any error. */
typedef struct xc_runner {
    void (*run)(void *ctx, const npyl_tplan *p, const npyl_tdev_row *rec, size_t rows,
                const void *src, size_t src_n, const void *tables, size_t tab_n, void *got,
                size_t out_n);
    void *ctx;
} xc_runner;

/* Every flip/crop/pad/sign combination over several dtypes, shapes, output
 * dtypes, layouts and arithmetic; returns how many were compared. */
int xc_augmentations(const xc_runner *r);
/* Every window position of a crop in a padded sample. */
void xc_windows(const xc_runner *r);
/* Narrowed codes of several tables (NaN payloads, -0.0, denormals,
 * infinities) alone, fused with conversions and with augmentation. */
void xc_narrowed(const xc_runner *r);

/* Test data: a deterministic generator; n items of dtype descr (random
 * bytes for integers, ordinary and special floats for floats). */
uint64_t xc_rnd(void);
void xc_fill(unsigned char *p, size_t n, const char *descr, size_t sz);
/* want vs got, n bytes of p's output: equal, or both NaN (float outputs). */
void xc_same(const npyl_tplan *p, const unsigned char *want, const unsigned char *got, size_t n,
             const char *what);

#endif
