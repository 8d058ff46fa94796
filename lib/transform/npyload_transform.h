/* Transforms of a field's samples: cast (float32, float16, bfloat16),
 * y = (x * scale - mean[c]) / std[c] in float32, and channels-last layout.
 * Depends on lib/common and lib/format; its users are the loader (the host
 * engine, in its workers) and lib/cuda's device engine (after the copy).
 *
 * Three steps:
 *   npyl_transform_check()  the description alone (what set_transform can
 *                           refuse before start);
 *   npyl_transform_plan()   against a field's descr and per-sample shape
 *                           (start): output descr, row bytes, strides;
 *   npyl_transform_rows()   the host engine, one pass from the raw rows to
 *                           the output rows (any thread, the plan is
 *                           read-only after planning);
 * and the device engine (npyl_tdev_*, lib/cuda/npyload_cuda_transform.h)
 * runs the same plans on the GPU. This module knows nothing of CUDA.
 *
 * The arithmetic is the literal float32 formula (x*scale - mean)/std with
 * three correctly rounded operations and no contraction into an FMA, on the
 * host (this module is built with -ffp-contract=off) and on the device
 * (__fmul_rn, __fsub_rn, __fdiv_rn), so the two agree bit for bit except for
 * NaN payloads. The fused form x*a + b with a = scale/std, b = -mean/std is
 * NOT used: near x*scale == mean it is off by many ulps of a float32 output
 * (bench_transform prints the figures).
 *
 * Half and bfloat16: round to nearest even, overflow to +-inf, subnormals
 * kept; NaN stays NaN with its sign (float16: sign|0x7e00|payload>>13,
 * bfloat16: sign|0x7fc0|payload>>16, as numpy and ml_dtypes write them).
 * Widening float16 -> float32 keeps sign and payload and sets the quiet bit
 * (sign|0x7fc00000|payload<<13: a signalling NaN comes out quiet), on the
 * portable and the F16C path alike.
 *
 * bfloat16's descr is "bfloat16": numpy has no such type code, and
 * ml_dtypes' own dtype has .str "<V2" (any two raw bytes: a reader cannot
 * tell it from a 2-byte void) but .name "bfloat16", and
 * np.dtype("bfloat16") resolves to ml_dtypes.bfloat16 once ml_dtypes is
 * imported. The binding maps it to torch.bfloat16 (DLPack kDLBfloat, 16 bits)
 * and to ml_dtypes.bfloat16 for numpy when importable. It needs a descr
 * field of at least 9 bytes (NPYL_TDESCR_LEN). */
#ifndef NPYLOAD_TRANSFORM_H
#define NPYLOAD_TRANSFORM_H

#include <stddef.h>
#include <stdint.h>

#include "../common/npyload_common.h"

/* The description is the public npyload_transform (npyload.h) and its
 * output dtypes the public NPYLOAD_DTYPE_* values: no private mirror. */

#define NPYL_TDESCR_LEN 16

typedef void (*npyl_tload_fn)(const void *src, size_t n, float *dst);
typedef void (*npyl_tstore_fn)(const float *src, size_t n, void *dst);

/* What the loader needs to size slots and describe arrays, and what the
 * engines need to run. Filled by npyl_transform_plan; owns nothing (mean and
 * std are copied in, expanded to one value per channel when they fit). */
typedef struct npyl_tplan {
    /* input */
    char in_descr[NPYL_TDESCR_LEN];
    char in_kind;             /* 'u', 'i', 'f' ('b', 'c' only with KEEP) */
    size_t in_itemsize;
    int in_swap;              /* stored in the other byte order */
    /* output */
    int out_dtype;            /* NPYL_TDTYPE_*, KEEP when no conversion */
    char out_descr[NPYL_TDESCR_LEN]; /* "<f4", "<f2", "bfloat16" or the input's */
    size_t out_itemsize;
    int channels_last;        /* and the sample has more than one axis */
    /* geometry of one sample: C channels of S elements */
    int sndim;
    int64_t sshape[NPYLOAD_MAX_DIMS];
    uint64_t C, S;
    uint64_t in_row_bytes, out_row_bytes;
    /* Strides of the batch array (N, sshape...), ndim = 1 + sndim, in
     * elements and in bytes; [0] is the row stride. */
    int64_t strides[NPYLOAD_MAX_DIMS + 1];
    int64_t byte_strides[NPYLOAD_MAX_DIMS + 1];
    /* arithmetic: 0 none (a cast or a copy), 1 x*scale, 2 (x*scale-m)/s */
    int arith;
    float scale;
    int per_channel;          /* mean/std differ per channel */
    float mean1, std1;        /* when !per_channel */
    float *mean, *std;        /* C values when per_channel (plan-owned) */
    /* Augmentation (npyload.h, "Augmentation"): aug is set when the
     * description asks for a flip or a crop. Then the geometry above
     * (sshape, C, S, in_row_bytes, strides) is the augmented sample's, in
     * the stored dtype: the engine's input is a row the augmentation step
     * built; stored_row_bytes and aug_H/W/outer describe the stored row. */
    int aug;
    uint32_t hflip_t, vflip_t;  /* flip when the 24-bit draw is below */
    int64_t aug_H, aug_W;       /* stored last two axes (0 with < 2 axes) */
    int64_t crop_h, crop_w, pad;
    uint64_t aug_outer;         /* product of the stored axes before them */
    uint64_t stored_row_bytes;
    uint8_t *hneg, *vneg;       /* C flags (plan-owned): negate channel c
                                   when flipped; NULL: none */
    /* host engine, chosen at plan time (F16C when the CPU has it) */
    npyl_tload_fn load;
    npyl_tstore_fn store;
    int f16c;                 /* the F16C path was chosen */
    /* One-byte integer input with a conversion: the output item of each of
     * the 256 stored values (load, arithmetic and store run once for each
     * at plan time), 256 items per channel when mean/std differ per
     * channel, else 256; plan-owned. The host engine then looks items up
     * instead of computing them: the same bytes, at a lookup's cost. NULL:
     * computed (other inputs, or more than NPYL_TLUT_MAX_BYTES of tables). */
    unsigned char *lut;
} npyl_tplan;

/* Checks a description on its own. Returns 0 or NPYLOAD_EINVAL with a
 * message naming `what` (the field) and the member: "images: transform
 * dtype keep with std: arithmetic needs a float output dtype". */
NPYL_HIDDEN int npyl_transform_check(const char *what, const npyload_transform *t,
                                     char *err, size_t errlen);

/* Plans `t` for samples of dtype `descr` (normalised, as the header parser
 * writes it) and per-sample shape sshape[sndim]. Returns 0 and fills *p
 * (release with npyl_transform_plan_free), NPYLOAD_EINVAL (description),
 * NPYLOAD_EMISMATCH (mean/std counts vs channels), NPYLOAD_EUNSUPPORTED
 * (input dtype) or NPYLOAD_ETOOBIG (row bytes overflow), with the message in
 * err. */
NPYL_HIDDEN int npyl_transform_plan(const char *what, const npyload_transform *t,
                                    const char *descr, int sndim,
                                    const int64_t *sshape, npyl_tplan *p,
                                    char *err, size_t errlen);
/* Same, never choosing the F16C path (tests compare both). */
NPYL_HIDDEN int npyl_transform_plan_portable(const char *what,
                                             const npyload_transform *t,
                                             const char *descr, int sndim,
                                             const int64_t *sshape,
                                             npyl_tplan *p, char *err,
                                             size_t errlen);
/* NULL-safe; leaves *p zeroed. */
NPYL_HIDDEN void npyl_transform_plan_free(npyl_tplan *p);

/* 1 when the transform is the identity on the bytes (keep, channels first
 * or a sample with one axis): the loader reads straight into the output. */
NPYL_HIDDEN int npyl_transform_is_identity(const npyl_tplan *p);

/* The host engine: converts `rows` samples at src (in_row_bytes each,
 * stored layout) into dst (out_row_bytes each, output layout). src and dst
 * must not overlap. Uses a few KiB of stack, no allocation, thread-safe. */
NPYL_HIDDEN void npyl_transform_rows(const npyl_tplan *p, const void *src,
                                     void *dst, size_t rows);

/* One sample's augmentation decisions (npyload.h documents the draws). */
typedef struct npyl_aug {
    int hflip, vflip;
    int64_t top, left;
} npyl_aug;

/* The decisions of plan p for sample `index` of `epoch` under `seed`: a pure
 * function; all zero when p has no augmentation. */
NPYL_HIDDEN void npyl_aug_decide(const npyl_tplan *p, int64_t seed, uint64_t epoch,
                                 int64_t index, npyl_aug *out);

/* The host engine with augmentation: `rows` stored rows at src
 * (stored_row_bytes each), of samples indices[0..rows), become output rows
 * at dst. scratch holds in_row_bytes (one augmented row; unused when the
 * plan keeps the stored dtype channels-first). Thread-safe like
 * npyl_transform_rows; the same as it when !p->aug. */
NPYL_HIDDEN void npyl_transform_rows_aug(const npyl_tplan *p, const void *src, void *dst,
                                         size_t rows, int64_t seed, uint64_t epoch,
                                         const int64_t *indices, void *scratch);

/* The F16C path of the float16 loops: returns 1 when plans choose it here
 * (built in, and CPUID says this CPU and OS support F16C and AVX), else 0.
 * *compiled (may be NULL) gets 1 when the path is built in (x86-64 with
 * GCC or Clang). */
NPYL_HIDDEN int npyl_transform_f16c(int *compiled);

/* Scalar conversions, also used by the engine's portable path. */
NPYL_HIDDEN uint16_t npyl_f32_to_f16(float f);
NPYL_HIDDEN float npyl_f16_to_f32(uint16_t h);
NPYL_HIDDEN uint16_t npyl_f32_to_bf16(float f);
NPYL_HIDDEN float npyl_bf16_to_f32(uint16_t h);

#endif
