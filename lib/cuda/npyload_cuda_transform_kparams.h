/* The kernels' one parameter, shared by npyload_cuda_transform_kernels.cu
 * and the launcher (npyload_cuda_transform.c): plain C, the same layout on both
 * sides (LP64, natural alignment). Passed by value (under the 4 KiB kernel
 * parameter limit). */
#ifndef NPYLOAD_CUDA_TRANSFORM_KPARAMS_H
#define NPYLOAD_CUDA_TRANSFORM_KPARAMS_H

#define NPYL_TK_MAXC 128  /* = NPYL_TDEV_MAX_CHANNELS */
#define NPYL_TK_TABLE 256 /* values per narrowed value table (NPYL_ZST_NARROW_MAX) */

/* One row of a batch, for the npyl_tkx_* kernels: its augmentation
 * decisions (computed on the host by npyl_aug_decide, the host engine's own
 * function) and, for a narrowed field, which value table its codes index.
 * The worker writes rows x this beside the batch's stored rows and the copy
 * takes them to the device with the rows. */
typedef struct npyl_tk_row {
    unsigned int top, left; /* the window's corner in the padded sample */
    unsigned int flips;     /* bit 0: hflip, bit 1: vflip */
    unsigned int table;     /* narrowed: the row's file's table */
} npyl_tk_row;

typedef struct npyl_tk_params {
    const void *src;             /* rows x (C x S) items, stored layout */
    void *dst;                   /* rows x (C x S) items, output layout */
    unsigned long long rows;
    unsigned int C, S;           /* C * S < 2^32 (checked at plan time) */
    unsigned int channels_last;
    unsigned int swap;           /* load in the other byte order */
    int arith;                   /* 0 none, 1 x*scale, 2 (x*scale-m)/s */
    int per_channel;
    float scale, mean1, std1;
    float mean[NPYL_TK_MAXC];
    float std[NPYL_TK_MAXC];
    /* The npyl_tkx_* kernels only (augmentation, narrowed codes): C and S
     * above are the augmented sample's; src holds rows of in_elems stored
     * items (or one-byte codes when tables is set). */
    const npyl_tk_row *rowinfo;  /* rows x npyl_tk_row, device memory */
    const void *tables;          /* narrowed: NPYL_TK_TABLE values per table;
                                    NULL: src holds the values */
    unsigned long long in_elems; /* stored items (codes) per row */
    unsigned long long signmask; /* the sign bit of an item as loaded */
    unsigned int geom;           /* the last two axes move (crop, pad, flip) */
    unsigned int H, W, h, w, pad; /* stored last two axes, window, pad */
    unsigned int hneg[NPYL_TK_MAXC / 32], vneg[NPYL_TK_MAXC / 32]; /* per channel */
} npyl_tk_params;

#endif
