/* The device transform kernels on the CPU (kernels_cpu.h): the .cu itself,
 * compiled as C++ with kshim/kshim.h force-included and kshim/ first on the
 * include path (tests/CMakeLists.txt), so what runs here is the kernels'
 * own index math, loads, signs, table look-ups and arithmetic. */
#include "../../lib/cuda/npyload_cuda_transform_kernels.cu"

#include <string.h>

#include "kernels_cpu.h"

NPYL_KSHIM_TLS npyl_kshim_dim3 blockIdx, threadIdx, gridDim, blockDim;

namespace {

struct entry {
    const char *name;
    npyl_kcpu_fn fn;
};

#define NPYL_KCPU_ONE(k)                                                       \
    {#k, [](const void *p) { k(*(const npyl_tk_params *)p); }},
#define NPYL_KCPU_IN(in)                                                       \
    NPYL_KCPU_ONE(npyl_tk_##in##_f4) NPYL_KCPU_ONE(npyl_tk_##in##_f2)          \
    NPYL_KCPU_ONE(npyl_tk_##in##_bf) NPYL_KCPU_ONE(npyl_tkx_##in##_f4)         \
    NPYL_KCPU_ONE(npyl_tkx_##in##_f2) NPYL_KCPU_ONE(npyl_tkx_##in##_bf)
#define NPYL_KCPU_SZ(sz) NPYL_KCPU_ONE(npyl_tk_perm##sz) NPYL_KCPU_ONE(npyl_tkx_keep##sz)

const entry TABLE[] = {
    NPYL_KCPU_IN(u1) NPYL_KCPU_IN(i1) NPYL_KCPU_IN(u2) NPYL_KCPU_IN(i2)
    NPYL_KCPU_IN(u4) NPYL_KCPU_IN(i4) NPYL_KCPU_IN(u8) NPYL_KCPU_IN(i8)
    NPYL_KCPU_IN(f2) NPYL_KCPU_IN(f4) NPYL_KCPU_IN(f8)
    NPYL_KCPU_SZ(1) NPYL_KCPU_SZ(2) NPYL_KCPU_SZ(4) NPYL_KCPU_SZ(8) NPYL_KCPU_SZ(16)
};

} // namespace

extern "C" npyl_kcpu_fn npyl_kcpu_find(const char *name)
{
    for (const entry &e : TABLE)
        if (strcmp(e.name, name) == 0)
            return e.fn;
    return nullptr;
}

extern "C" int npyl_kcpu_count(void) { return (int)(sizeof TABLE / sizeof TABLE[0]); }

extern "C" void npyl_kcpu_launch(npyl_kcpu_fn fn, const unsigned grid[3],
                                 const unsigned block[3], const void *params)
{
    gridDim = {grid[0], grid[1], grid[2]};
    blockDim = {block[0], block[1], block[2]};
    for (unsigned bz = 0; bz < grid[2]; bz++)
        for (unsigned by = 0; by < grid[1]; by++)
            for (unsigned bx = 0; bx < grid[0]; bx++)
                for (unsigned tz = 0; tz < block[2]; tz++)
                    for (unsigned ty = 0; ty < block[1]; ty++)
                        for (unsigned tx = 0; tx < block[0]; tx++) {
                            blockIdx = {bx, by, bz};
                            threadIdx = {tx, ty, tz};
                            fn(params);
                        }
}
