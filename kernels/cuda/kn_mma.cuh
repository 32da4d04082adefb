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
 * Fragments come from shared memory by ldmatrix (four 8 x 8 matrices an
 * instruction, transposed on the way for a B stored as rows of k).
 * nvcc emits the instructions (sm_80 and later; on sm_75, f16 only, the
 * product as two m16n8k8); the emulation runs emu_mma.h's warp
 * collectives, which hold the same layouts. */
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

/* ldmatrix .x4: four 8 x 8 16-bit matrices from shared memory into r[0..3],
 * lane 8 i + j giving the address of row j of matrix i (16-byte aligned).
 * Plain, lane 4 g + t receives row g's elements 2t, 2t + 1 of each; with
 * trans, rows 2t and 2t + 1's element g (the matrix transposed). */
template <bool TRANS>
__device__ __forceinline__ void kn_ldsm4(uint32_t (&r)[4], const uint16_t *row)
{
#ifdef KN_CUDA_EMU
    emu_ldsm4(r, row, TRANS);
#else
    unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
#endif
}

/* The A fragment of rows [0, 16) and columns [k0, k0 + 16) of a row-major
 * 16-bit tile in shared memory (ld elements a row, a multiple of 8; k0 of
 * 8; the tile 16-byte aligned): matrix i is rows 8 (i % 2), columns
 * k0 + 8 (i / 2), register a[i] as the layout has it. */
__device__ __forceinline__ void kn_mma_load_a(uint32_t (&a)[4], const uint16_t *tile, int ld,
                                              int k0)
{
    int l = threadIdx.x % 32, i = l / 8;
    kn_ldsm4<false>(a, tile + (size_t)(l % 8 + 8 * (i % 2)) * ld + k0 + 8 * (i / 2));
}

/* The B fragments of two 8-column tiles of B = X^T for X a row-major
 * [n][k] 16-bit tile: b[j] is X's rows [n0 + 8j, n0 + 8j + 8) as B's
 * columns, its columns [k0, k0 + 16) as B's k (the keys of S = Q K^T, K
 * staged as rows). Matrix 2j + h: rows n0 + 8j, columns k0 + 8h. */
__device__ __forceinline__ void kn_mma_load_bt2(uint32_t (&b)[2][2], const uint16_t *X, int ld,
                                                int n0, int k0)
{
    int l = threadIdx.x % 32, i = l / 8;
    uint32_t r[4];
    kn_ldsm4<false>(r, X + (size_t)(n0 + l % 8 + 8 * (i / 2)) * ld + k0 + 8 * (i % 2));
    b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

/* The B fragments of two 8-column tiles of B = X for X a row-major [k][n]
 * 16-bit tile: b[j] is rows [k0, k0 + 16), columns [n0 + 8j, n0 + 8j + 8)
 * (V in O += P V), each 8 x 8 matrix transposed by ldmatrix. Matrix
 * 2j + h: rows k0 + 8h, columns n0 + 8j. */
__device__ __forceinline__ void kn_mma_load_b2(uint32_t (&b)[2][2], const uint16_t *X, int ld,
                                               int k0, int n0)
{
    int l = threadIdx.x % 32, i = l / 8;
    uint32_t r[4];
    kn_ldsm4<true>(r, X + (size_t)(k0 + l % 8 + 8 * (i % 2)) * ld + n0 + 8 * (i / 2));
    b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

} // namespace KN_NS

#endif
