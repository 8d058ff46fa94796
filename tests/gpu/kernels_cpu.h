/* The device transform kernels (lib/cuda/npyload_cuda_transform_kernels.cu)
 * compiled for the CPU with kshim/ and run there: each simulated thread of
 * the grid runs the kernel's grid-stride loops in turn. Used by the fake
 * driver (fake_cuda_driver.c runs launches on the fake runtime's streams
 * when asked) and so by test_cuda_kernels. Test scaffolding. */
#ifndef NPYLOAD_KERNELS_CPU_H
#define NPYLOAD_KERNELS_CPU_H

#ifdef __cplusplus
extern "C" {
#endif

/* A kernel taking its parameter (npyl_tk_params) by pointer. */
typedef void (*npyl_kcpu_fn)(const void *params);

/* The kernel named `name` (npyl_tk_u1_f4, npyl_tkx_keep4, ...), or NULL. */
npyl_kcpu_fn npyl_kcpu_find(const char *name);
/* The number of kernels the table holds. */
int npyl_kcpu_count(void);
/* Runs fn over a grid of grid[0..2] blocks of block[0..2] threads on the
 * calling thread. */
void npyl_kcpu_launch(npyl_kcpu_fn fn, const unsigned grid[3], const unsigned block[3],
                      const void *params);

#ifdef __cplusplus
}
#endif

#endif
