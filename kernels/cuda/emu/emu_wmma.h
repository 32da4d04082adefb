/* emu_wmma.h — nvcuda::wmma (mma.h) for the emulation: 16x16x16 tiles of
 * __half or __nv_bfloat16 inputs with fp32 accumulators, the shape and
 * types kernels/cuda uses.
 *
 * Each operation is a warp collective, as on the GPU: every lane of the
 * warp must call it with the same arguments. It meets the other lanes
 * through the emulator's warp operation (a __syncwarp on the full mask),
 * so a lane that is missing, has exited or diverged aborts the launch as
 * a bad shuffle does. The GPU spreads a fragment over the lanes in an
 * undocumented layout; here every lane holds the whole tile, so:
 *  - load_matrix_sync reads the whole tile in the lane's own turn, before
 *    the lanes meet: a tile written by other lanes without a __syncwarp
 *    between reads stale values under some thread order;
 *  - store_matrix_sync writes, after the lanes meet, only the lane's share
 *    (elements e with e % 32 == lane), so reading back a stored tile
 *    needs a __syncwarp as on the GPU;
 *  - mma_sync computes d = a b + c in fp32 (16-bit products are exact in
 *    fp32, summed in k order onto c), lane 0 counts its 2*16*16*16 FLOPs
 *    on the warp-matrix path (emu_count_mma).
 * Fragments have no x[] / num_elements: their per-lane layout is the
 * hardware's, so kernels go through shared memory for elementwise work.
 * Included by cuda_emu.h after its warp operations and counting hooks. */
#ifndef TY_EMU_WMMA_H
#define TY_EMU_WMMA_H

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

/* The 16-bit storage types of cuda_fp16.h / cuda_bf16.h: bits only. */
struct __half {
    uint16_t bits;
};
typedef __half half;
struct __nv_bfloat16 {
    uint16_t bits;
};

static inline float emu_widen(float v)
{
    return v;
}
static inline float emu_widen(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline float emu_widen(__half h)
{
    uint32_t s = (uint32_t)(h.bits & 0x8000u) << 16, e = (h.bits >> 10) & 0x1fu,
             m = h.bits & 0x3ffu, u;
    if (e == 0x1f)
        u = s | 0x7f800000u | (m << 13);
    else if (e)
        u = s | ((e + 112) << 23) | (m << 13);
    else {
        float f = (float)m * 5.9604644775390625e-8f; /* 2^-24 */
        return s ? -f : f;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

namespace nvcuda
{
namespace wmma
{

struct matrix_a {
};
struct matrix_b {
};
struct accumulator {
};
struct row_major {
};
struct col_major {
};
enum layout_t { mem_row_major, mem_col_major };

/* Rows and columns of a Use's tile in an M x N x K product. */
template <typename Use, int M, int N, int K> struct emu_dims;
template <int M, int N, int K> struct emu_dims<matrix_a, M, N, K> {
    static const int R = M, C = K;
};
template <int M, int N, int K> struct emu_dims<matrix_b, M, N, K> {
    static const int R = K, C = N;
};
template <int M, int N, int K> struct emu_dims<accumulator, M, N, K> {
    static const int R = M, C = N;
};

/* The tile, widened to fp32, row-major [R][C] whatever the layout. */
template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "cuda-emu: wmma supports 16x16x16 only");
    static const int R = emu_dims<Use, M, N, K>::R, C = emu_dims<Use, M, N, K>::C;
    float v[R * C];
};

/* The lanes meet as in a __syncwarp over the whole warp (cuda_emu.h). */
static inline void emu_wmma_meet(const char *what)
{
    emu_warp_op(EMU_WARP_SYNC, what, 0xffffffffu, 0, emu_lane());
}

template <typename Use, int M, int N, int K, typename T, typename L>
static inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, float x)
{
    emu_wmma_meet("wmma::fill_fragment");
    for (float &e : f.v)
        e = x;
}

/* What the GPU requires of a load or store's tile, and does not check:
 * a 256-bit aligned pointer and a leading dimension of whole 16 bytes
 * (8 16-bit elements, 4 floats). A tile that breaks it aborts here. */
static inline void emu_wmma_check(const void *p, unsigned ldm, size_t esize, const char *what)
{
    if ((uintptr_t)p % 32 == 0 && ldm * esize % 16 == 0) return;
    fprintf(stderr,
            "cuda-emu: %s: tile at %p with ldm %u (%zu-byte elements): the pointer must be "
            "32-byte aligned and ldm a multiple of 16 bytes\n",
            what, p, ldm, esize);
    abort();
}

/* Element (r, c) of a tile at p: row-major rows of ldm, or columns. */
template <typename T> static inline float emu_at(const T *p, unsigned ldm, bool col, int r, int c)
{
    return emu_widen(col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]);
}

template <typename Use, int M, int N, int K, typename T, typename L>
static inline void emu_load(fragment<Use, M, N, K, T, L> &f, const T *p, unsigned ldm, bool col)
{
    typedef fragment<Use, M, N, K, T, L> F;
    emu_wmma_check(p, ldm, sizeof(T), "wmma::load_matrix_sync");
    for (int r = 0; r < F::R; r++)
        for (int c = 0; c < F::C; c++)
            f.v[r * F::C + c] = emu_at(p, ldm, col, r, c);
    emu_wmma_meet("wmma::load_matrix_sync");
}
template <typename Use, int M, int N, int K, typename T>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, row_major> &f, const T *p,
                                    unsigned ldm)
{
    emu_load(f, p, ldm, false);
}
template <typename Use, int M, int N, int K, typename T>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, col_major> &f, const T *p,
                                    unsigned ldm)
{
    emu_load(f, p, ldm, true);
}
template <int M, int N, int K>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p,
                                    unsigned ldm, layout_t l)
{
    emu_load(f, p, ldm, l == mem_col_major);
}

template <int M, int N, int K>
static inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f,
                                     unsigned ldm, layout_t l)
{
    emu_wmma_check(p, ldm, sizeof(float), "wmma::store_matrix_sync");
    emu_wmma_meet("wmma::store_matrix_sync");
    for (int e = emu_lane(); e < M * N; e += 32) {
        int r = e / N, c = e % N;
        p[l == mem_col_major ? (size_t)c * ldm + r : (size_t)r * ldm + c] = f.v[e];
    }
}

template <int M, int N, int K, typename T, typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float> &d,
                            const fragment<matrix_a, M, N, K, T, LA> &a,
                            const fragment<matrix_b, M, N, K, T, LB> &b,
                            const fragment<accumulator, M, N, K, float> &c)
{
    emu_wmma_meet("wmma::mma_sync");
    float out[M * N];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = c.v[i * N + j];
            for (int k = 0; k < K; k++)
                s += a.v[i * K + k] * b.v[k * N + j];
            out[i * N + j] = s;
        }
    std::memcpy(d.v, out, sizeof out);
    if (emu_lane() == 0) emu_count_mma(2ull * M * N * K);
}

} // namespace wmma
} // namespace nvcuda

#endif
