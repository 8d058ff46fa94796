/* libFuzzer target for the NPY header parser (lib/format/npyload_header_parse.c).
 *
 * The input is the start of an NPY file. It is parsed three ways: as a whole
 * file of that size, as a prefix of a file of unknown size, and as a prefix
 * of a larger file (so the data-length check sees big sizes). On success the
 * facts must be self-consistent and npyload_format_header must reproduce a
 * header that parses to the same facts.
 *
 * Build: CC=clang cmake -S . -B build-fuzz -G Ninja -DNPYLOAD_FUZZ=ON
 *        -DNPYLOAD_BUILD_TESTS=OFF -DNPYLOAD_BUILD_TOOLS=OFF
 *        -DNPYLOAD_GPU_TESTS=OFF && ninja -C build-fuzz fuzz_header
 * Run:   ./build-fuzz/tests/fuzz_header -max_total_time=30 tests/fuzz/corpus */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "npyload.h"

static void check(const npyload_header *h, size_t size)
{
    if (h->ndim < 0 || h->ndim > NPYLOAD_MAX_DIMS || h->itemsize == 0 ||
        h->itemsize > 16 || h->header_len > NPYLOAD_MAX_HEADER_LEN ||
        h->data_offset > size || strnlen(h->descr, NPYLOAD_DESCR_LEN) >= NPYLOAD_DESCR_LEN)
        abort();
    uint64_t n = h->itemsize;
    int empty = 0;
    for (int d = 0; d < h->ndim; d++) {
        if (h->shape[d] < 0)
            abort();
        if (h->shape[d] == 0)
            empty = 1;
        else if (__builtin_mul_overflow(n, (uint64_t)h->shape[d], &n))
            abort();
    }
    if ((empty ? 0 : n) != h->data_bytes)
        abort();

    unsigned char buf[2048];
    int w = npyload_format_header(buf, sizeof buf, h->descr, h->fortran_order, h->ndim,
                                  h->shape);
    if (w <= 0)
        abort();
    npyload_header g;
    if (npyload_parse_header(buf, (size_t)w, UINT64_MAX, NULL, &g, NULL, 0) != 0 ||
        strcmp(g.descr, h->descr) != 0 || g.ndim != h->ndim ||
        g.fortran_order != h->fortran_order || g.data_bytes != h->data_bytes ||
        memcmp(g.shape, h->shape, sizeof(int64_t) * (size_t)h->ndim) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    npyload_header h;
    char err[256];
    if (npyload_parse_header(data, size, size, "fuzz.npy", &h, err, sizeof err) == 0)
        check(&h, size);
    if (strncmp(err, "fuzz.npy: ", 10) != 0 && err[0])
        abort();
    if (npyload_parse_header(data, size, UINT64_MAX, NULL, &h, err, sizeof err) == 0)
        check(&h, size);
    npyload_parse_header(data, size, (uint64_t)size << 20, NULL, &h, err, 16);
    return 0;
}
