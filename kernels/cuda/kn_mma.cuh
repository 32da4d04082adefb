/* kn_mma.cuh — the tensor-core product whose fragments have a documented
 * per-lane layout: PTX's mma.sync m16n8k16 (bf16 or f16 in, fp32
 * accumulators), for kernels that do elementwise work on a product's
 * values in registers (the flash forward's online softmax) instead of
 * going through shared memory as nvcuda::wmma's opaque fragments must.
 *
 * Layout (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
 * type"); lane l = 4 g + t:
 *   A 16 x 16, four registers:  a[0] = A[g][2t..2t+1],   a[1] = A[g+8][2t..2t+1],
 *                               a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9]
 *   B 16 x 8, two registers:    b[0] = B[2t..2t+1][g],   b[1] = B[2t+8..2t+9][g]
 *   C 16 x 8, four floats:      c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1]
 * Two 16-bit values a register, the lower index in the low half. So a C
 * tile's values are an A fragment's after rounding: the columns 16 kk ..
 * 16 kk + 15 of a product (C tiles 2 kk and 2 kk + 1) are the A operand of
 * the next product over those 16 indices (kn_mma_a_from_c).
 *
 * nvcc emits the instruction (sm_80 and later; on sm_75, f16 only, as two
 * m16n8k8); the emulation runs emu_mma.h's warp collective, which holds
 * the same layout. */
#ifndef TY_KN_MMA_CUH
#define TY_KN_MMA_CUH

#include <cstdint>

namespace KN_NS
{

/* c += A B, every lane of the warp. BF16: the inputs are bf16, else f16. */
template <bool BF16>
__device__ __forceinline__ void kn_mma16816(float (&c)[4], const uint32_t (&a)[4],
                                            const uint32_t (&b)[2])
{
#ifdef KN_CUDA_EMU
    emu_mma_16816(c, a, b, c, BF16);
#elif __CUDA_ARCH__ >= 800
    if constexpr (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif __CUDA_ARCH__ >= 750
    /* k 0..7 then 8..15: m16n8k8's A is a[0], a[1] (a[2], a[3]), its B b[0] (b[1]) */
    if constexpr (!BF16) {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5}, {%6}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(b[0]));
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5}, {%6}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[2]), "r"(a[3]), "r"(b[1]));
    }
#endif
}

/* Two 16-bit values as one register, lo at the lower index. */
__device__ __forceinline__ uint32_t kn_pack16(uint16_t lo, uint16_t hi)
{
    return (uint32_t)lo | (uint32_t)hi << 16;
}

/* The A fragment of rows [0, 16) and columns [k0, k0 + 16) of a row-major
 * 16-bit tile in shared memory (ld elements a row; k0 and ld even). */
__device__ __forceinline__ void kn_mma_load_a(uint32_t (&a)[4], const uint16_t *tile, int ld,
                                              int k0)
{
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const uint16_t *p = tile + (size_t)g * ld + k0 + 2 * t;
    a[0] = *(const uint32_t *)p;
    a[1] = *(const uint32_t *)(p + 8 * ld);
    a[2] = *(const uint32_t *)(p + 8);
    a[3] = *(const uint32_t *)(p + 8 * ld + 8);
}

/* The B fragment of B = X^T for X a row-major [n][k] 16-bit tile (X's rows
 * [n0, n0 + 8) become B's columns, its columns [k0, k0 + 16) B's k): the
 * keys of S = Q K^T, K staged as rows. */
__device__ __forceinline__ void kn_mma_load_bt(uint32_t (&b)[2], const uint16_t *X, int ld, int n0,
                                               int k0)
{
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const uint16_t *p = X + (size_t)(n0 + g) * ld + k0 + 2 * t;
    b[0] = *(const uint32_t *)p;
    b[1] = *(const uint32_t *)(p + 8);
}

/* The B fragment of B = X for X a row-major [k][n] 16-bit tile (rows
 * [k0, k0 + 16), columns [n0, n0 + 8)): V in O += P V. Two 16-bit loads a
 * register, rows 2t and 2t + 1 apart by ld. */
__device__ __forceinline__ void kn_mma_load_b(uint32_t (&b)[2], const uint16_t *X, int ld, int k0,
                                              int n0)
{
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const uint16_t *p = X + (size_t)(k0 + 2 * t) * ld + n0 + g;
    b[0] = kn_pack16(p[0], p[ld]);
    b[1] = kn_pack16(p[8 * ld], p[9 * ld]);
}

} // namespace KN_NS

#endif
