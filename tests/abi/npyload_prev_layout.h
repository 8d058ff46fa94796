/* The first published layouts (npyload 0.3) of the public structs that
 * grow, copied here as a program built against that header holds them. The
 * ABI test compiles against these and runs against the library being built:
 * whatever members the library adds later, an old program's struct must be
 * read and written only within its own size. Keep these frozen: a new
 * member goes into include/npyload.h, never here. */
#ifndef NPYLOAD_PREV_LAYOUT_H
#define NPYLOAD_PREV_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

typedef struct prev_npyload_stats {
    uint64_t bytes_read;
    uint64_t batches_delivered;
    uint64_t samples_delivered;
    uint64_t wait_ns;
    uint64_t io_ns;
    uint64_t h2d_bytes;
    uint64_t h2d_ns;
    int backend;
    int pinned;
    int direct_io;
    int device;
    uint64_t slot_bytes;
    uint64_t num_slots;
    uint64_t uring_fallbacks;
    uint64_t samples_skipped;
    uint64_t errors;
    uint64_t gather_bytes;
    uint64_t gather_requests;
    uint64_t read_requests;
    uint64_t compressed_bytes_read;
    uint64_t decompressed_bytes;
    uint64_t decode_ns;
    uint64_t transform_ns;
} prev_npyload_stats;

typedef struct prev_npyload_transform {
    int dtype;
    float scale;
    const float *mean;
    size_t n_mean;
    const float *std;
    size_t n_std;
    int channels_last;
} prev_npyload_transform;

typedef struct prev_npyload_pack_options {
    int level;
    uint64_t frame_size;
    int threads;
    int no_checksum;
    int force;
    int (*progress)(void *arg, uint64_t done, uint64_t total);
    void *progress_arg;
} prev_npyload_pack_options;

typedef struct prev_npyload_pack_result {
    uint64_t in_bytes;
    uint64_t out_bytes;
    uint64_t frames;
    uint64_t samples_per_frame;
    double seconds;
} prev_npyload_pack_result;

#endif
