/* emu_mma.h — the PTX warp MMA `mma.sync.aligned.m16n8k16.row.col.f32`
 * with bf16 or f16 inputs, and `ldmatrix` .x4 that feeds it, for the
 * emulation (kernels/cuda/kn_mma.cuh calls them where nvcc emits the
 * instructions).
 *
 * Unlike nvcuda::wmma (emu_wmma.h), this instruction's fragments have the
 * per-lane layout the PTX ISA documents ("Matrix Fragments for
 * mma.m16n8k16 with floating point type"), and the kernels rely on it, so
 * it is emulated exactly: each lane holds its own registers, and lane
 * l = 4 g + t (g = l / 4, t = l % 4) holds
 *   A (16 x 16, row):  a[0] = A[g][2t, 2t+1],    a[1] = A[g+8][2t, 2t+1],
 *                      a[2] = A[g][2t+8, 2t+9],  a[3] = A[g+8][2t+8, 2t+9];
 *   B (16 x 8, col):   b[0] = B[2t, 2t+1][g],    b[1] = B[2t+8, 2t+9][g];
 *   C, D (16 x 8):     c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] = C[g+8][2t, 2t+1];
 * two 16-bit elements in a register, the lower index in the low half.
 * The lanes post their A and B registers in the block's thread-local
 * scratch, meet (a __syncwarp on the full mask: a missing or diverged lane
 * aborts the launch), each computes its four outputs from every lane's
 * posts in fp32, k in order, and they meet again before any lane may post
 * the next product's registers. Lane 0 counts 2 * 16 * 8 * 16 FLOPs on
 * the warp-matrix path. Included by cuda_emu.h after emu_wmma.h. */
#ifndef TY_EMU_MMA_H
#define TY_EMU_MMA_H

#include <cstdint>
#include <cstdio>
#include <cstdlib>

struct emu_mma_post {
    uint32_t a[4], b[2];
    const uint16_t *row; /* ldmatrix: this lane's row address */
};

/* The posts of the calling thread's warp: 32 lanes, in block-local
 * storage (one block runs at a time on an OS thread). */
static inline emu_mma_post *emu_mma_posts(void)
{
    static thread_local emu_mma_post posts[32][32]; /* [warp][lane]: 1024 threads */
    emu_uint3 t = emu_thread_idx(), d = emu_block_dim();
    unsigned linear = t.x + d.x * (t.y + d.y * t.z);
    return posts[linear / 32];
}

/* Element e (0: low half, 1: high) of a register holding two 16-bit values. */
static inline float emu_mma_elem(uint32_t r, int e, bool bf16)
{
    uint16_t h = (uint16_t)(e ? r >> 16 : r & 0xffffu);
    return bf16 ? emu_widen(__nv_bfloat16{h}) : emu_widen(__half{h});
}

/* d = A B + c for one warp; every lane calls it. */
static inline void emu_mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2],
                                 const float c[4], bool bf16)
{
    emu_mma_post *w = emu_mma_posts();
    int lane = emu_lane(), g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++)
        w[lane].a[i] = a[i];
    w[lane].b[0] = b[0];
    w[lane].b[1] = b[1];
    emu_warp_op(EMU_WARP_SYNC, "mma.sync m16n8k16", 0xffffffffu, 0, lane);
    float out[4];
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float s = c[i];
        for (int k = 0; k < 16; k++) {
            /* A[row][k]: lane 4 (row % 8) + (k % 8) / 2, register row / 8 + 2 (k / 8) */
            uint32_t ar = w[4 * (row % 8) + (k % 8) / 2].a[row / 8 + 2 * (k / 8)];
            /* B[k][col]: lane 4 col + (k % 8) / 2, register k / 8 */
            uint32_t br = w[4 * col + (k % 8) / 2].b[k / 8];
            s += emu_mma_elem(ar, k % 2, bf16) * emu_mma_elem(br, k % 2, bf16);
        }
        out[i] = s;
    }
    emu_warp_op(EMU_WARP_SYNC, "mma.sync m16n8k16", 0xffffffffu, 0, lane);
    for (int i = 0; i < 4; i++)
        d[i] = out[i];
    if (lane == 0) emu_count_mma(2ull * 16 * 8 * 16);
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane 8 i + j posts
 * the address of row j of matrix i; after the lanes meet, lane 4 g + t
 * takes of matrix i row g's elements 2t, 2t + 1 (trans: rows 2t and
 * 2t + 1's element g), and they meet again before any lane goes on (the
 * instruction reads all rows at once, before any later write of the
 * warp's). A row not 16-byte aligned aborts, as the GPU requires. */
static inline void emu_ldsm4(uint32_t r[4], const uint16_t *row, bool trans)
{
    emu_mma_post *w = emu_mma_posts();
    int lane = emu_lane(), g = lane / 4, t = lane % 4;
    if ((uintptr_t)row % 16) {
        fprintf(stderr, "cuda-emu: ldmatrix: lane %d's row at %p is not 16-byte aligned\n", lane,
                (const void *)row);
        abort();
    }
    w[lane].row = row;
    emu_warp_op(EMU_WARP_SYNC, "ldmatrix", 0xffffffffu, 0, lane);
    uint32_t out[4];
    for (int i = 0; i < 4; i++) {
        /* plain: row g's elements 2t, 2t + 1; trans: rows 2t, 2t + 1's element g */
        const uint16_t *a = w[8 * i + (trans ? 2 * t : g)].row, *b = w[8 * i + 2 * t + 1].row;
        uint16_t lo = trans ? a[g] : a[2 * t], hi = trans ? b[g] : a[2 * t + 1];
        out[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
    emu_warp_op(EMU_WARP_SYNC, "ldmatrix", 0xffffffffu, 0, lane);
    for (int i = 0; i < 4; i++)
        r[i] = out[i];
}

#endif
