/* libFuzzer target for the .npy.zst seek-table parser and frame decoder
 * (lib/zst/npyload_zst_table.c, npyload_zst_frame.c).
 *
 * The input is a whole .npy.zst file. It is parsed from memory through the
 * same read-callback path the loader uses with pread. On success the index
 * must be self-consistent (offsets add up to the file, frame 0 is the
 * header, data frames hold whole samples, every sample is located inside
 * its frame), and every frame is decoded with one reused context; a failed
 * parse must name the file.
 *
 * Build: CC=clang cmake -S . -B build-fuzz -G Ninja -DNPYLOAD_FUZZ=ON
 *        -DNPYLOAD_BUILD_TESTS=OFF -DNPYLOAD_BUILD_TOOLS=OFF
 *        -DNPYLOAD_GPU_TESTS=OFF && ninja -C build-fuzz fuzz_seektable
 * Run:   ./build-fuzz/tests/fuzz_seektable -max_total_time=30
 *        tests/fuzz/corpus_seektable */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <zstd.h>

#include "npyload.h"
#include "zst/npyload_zst.h"

#define NAME "fuzz.npy.zst"

static ZSTD_DCtx *g_dctx; /* the fuzz driver's, reused like a worker's */

static void check(const npyl_zst_index *x, const uint8_t *data, size_t size)
{
    uint32_t n = x->nframes;
    if (n == 0 || x->coff[0] != 0 || x->doff[0] != 0 ||
        x->coff[n] + x->table_bytes != size || x->file_size != size ||
        x->doff[1] != x->hdr.data_offset ||
        x->doff[n] - x->doff[1] != x->hdr.data_bytes ||
        x->hdr.file_bytes != x->doff[n])
        abort();
    for (uint32_t f = 0; f < n; f++)
        if (x->coff[f + 1] <= x->coff[f] || x->doff[f + 1] <= x->doff[f])
            abort();
    for (uint32_t f = 1; f < n; f++) {
        uint64_t d = x->doff[f + 1] - x->doff[f];
        if (x->row_bytes == 0 || d % x->row_bytes || d > x->max_dsize ||
            x->coff[f + 1] - x->coff[f] > x->max_csize)
            abort();
    }
    if (n > 1) {
        uint64_t rows[2] = {0, x->rows - 1};
        for (int i = 0; i < 2; i++) {
            uint32_t f;
            uint64_t off, first, cnt;
            npyl_zst_locate(x, rows[i], &f, &off);
            npyl_zst_frame_rows(x, f, &first, &cnt);
            if (f < 1 || f >= n || rows[i] < first || rows[i] >= first + cnt ||
                off != (rows[i] - first) * x->row_bytes)
                abort();
        }
    }
    /* Decode every frame when the scratch is small (fuzz inputs are small;
     * a table may still claim up to 32768x expansion per frame). */
    uint64_t cap = x->max_dsize > x->doff[1] ? x->max_dsize : x->doff[1];
    if (cap > (1u << 22))
        return;
    unsigned char *dst = malloc(cap);
    char err[256];
    for (uint32_t f = 0; f < n && dst; f++) {
        int rc = npyl_zst_decode_frame(x, f, g_dctx, data + x->coff[f], dst,
                                       (size_t)cap, NAME, err, sizeof err);
        if (rc != 0 && strncmp(err, NAME ": frame ", sizeof NAME + 7) != 0)
            abort();
    }
    free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_dctx && !(g_dctx = ZSTD_createDCtx()))
        abort();
    npyl_zst_index x;
    char err[512];
    err[0] = '\0';
    npyl_zst_mem m = {data, size};
    int rc = npyl_zst_index_read(npyl_zst_read_mem, &m, size, NAME, &x, err,
                                 sizeof err);
    if (rc == 0) {
        check(&x, data, size);
        npyl_zst_index_free(&x);
    } else if (rc > 0 || strncmp(err, NAME ": ", sizeof NAME + 1) != 0) {
        abort();
    }
    /* A tiny error buffer: messages are truncated, never overflow. */
    if (npyl_zst_index_read(npyl_zst_read_mem, &m, size, NAME, &x, err, 8) == 0)
        npyl_zst_index_free(&x);
    return 0;
}
