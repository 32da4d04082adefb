/* cuda_attn_flash.cuh — flash attention on tensor cores (PTX mma, wmma) for
 * bf16 / fp16 q, k, v at head dims 64, 80, 96, 128 and 256; included by
 * the sources that launch its kernels, one each (cuda_attn_fwd.cu,
 * cuda_attn_dq.cu, cuda_attn_dkdv.cu: cuda_attn.cuh). cuda_attention.cu
 * keeps the scalar kernels for fp32 and the other head dims and picks
 * between them (fl_picks).
 *
 * Same scheme and results as the scalar kernels (FlashAttention-2, nothing
 * of size T x T, out and lse saved; the backward rebuilds P = exp(S - lse)
 * and dS = P (dP - D_i) scale with D_i = rowsum(dO_i * O_i)), with every
 * product on the tensor cores, fp32 accumulators:
 *  - Forward: a warp owns 16 query rows (its Q tile staged once), a block
 *    NW warps sharing the K / V tiles of 64 keys (16 at head dim 256)
 *    staged in shared memory. The products are PTX's m16n8k16 MMA
 *    (kn_mma.cuh), whose register layout is documented, so S, P and the
 *    output O stay in registers: per tile S = Q K^T, then mask, soft-cap
 *    and the online softmax on S's registers (running max m and sum l,
 *    a row's four lanes meeting by shuffles), O's rows rescaled where
 *    their max moved, and O += P V with P's registers as the A operand.
 *    The end writes out = O / l and lse.
 *  - Backward, deterministic without atomics: k_fl_rowdot
 *    (cuda_attention.cu) computes D_i and dO in the input type once into
 *    scratch (fl_grad), then two
 *    kernels as the
 *    scalar path: dq (a warp per 16 query rows walks the key tiles: S = Q K^T,
 *    dP = dO V^T, dS per row, dQ += dS K) and dk/dv (a warp per 16 key rows
 *    of a kv head walks the query heads of its group and their query
 *    tiles: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q).
 *    Their products are nvcuda::wmma 16x16x16 tiles: dQ, and dK / dV up
 *    to head dim 128, accumulate in registers (fl_mma) from the first
 *    tile to the last, and their elementwise work goes through shared
 *    memory, since a wmma fragment's per-lane layout is the hardware's.
 * q, k, v are exact in the input type, and so is dO: a 16-bit backward
 * reads it rounded to its type (kernels.h). P and dS are not, so each
 * enters its products as hi + lo, both in the input type (fl_split, two
 * MMAs; lo x lo left out): one rounded P alone put bf16 results at 5x the
 * 16-bit tolerances of kernels.table at T = 70.
 * Shared-memory tiles are padded by 16 bytes a row (fl_cfg says why).
 * The backward's elementwise work goes through shared memory, never
 * through a wmma fragment's elements: every tile a lane reads back after
 * a store is behind a __syncwarp. Warps per block: the
 * most (4, 2 or 1) whose shared memory fits in 160 KiB where the device
 * grants it, else in 48 KiB (fl_nw); dk/dv at head dim 256 needs more
 * than 48 KiB even with one warp (71.1 KiB) and runs on sm_80 and later
 * only (cuda_attention.cu falls back to the scalar kernel before). No
 * per-thread arrays but the forward's S and O, indexed by constants after
 * full unrolling: ptxas reports no stack (kernels.cuda_attn_ptxas).
 * Each kernel's __launch_bounds__ names one block an SM as its minimum:
 * without it ptxas held some builds to 96 or 128 registers a lane and
 * spilled a few bytes; with it they take 90 to 250, and shared memory,
 * not registers, still bounds the blocks an SM runs.
 * bf16 fragments need sm_80: on sm_75 the bf16 kernels compile empty and
 * fl_picks sends bf16 to the scalar path (fp16's m16n8k16 runs there as
 * two m16n8k8). */
#ifndef TY_CUDA_ATTN_FLASH_CUH
#define TY_CUDA_ATTN_FLASH_CUH

#ifndef KN_CUDA_EMU
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#endif
#include <type_traits>

#include "cuda_attn.cuh"
#include "kn_async.cuh"
#include "kn_mma.cuh"

namespace KN_NS
{

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FL_BF16_OK 1
#else
#define FL_BF16_OK 0
#endif

/* A kernel configuration: head dim, element type, warps per block (each
 * owning 16 rows); keys (or queries) per staged tile BC. Shared-memory
 * tiles are padded by 16 bytes a row: with rows of 128 or 256 bytes every
 * row would start in the same bank, so a lane that owns a row (the
 * forward's softmax) and the 8-row phases of a fragment load would meet
 * in one bank 8 to 16 times over; a 16-byte pad moves each row 4 banks on.
 *   QLD: 16-bit [rows][D] tiles (Q, K, V, dO); OLD: fp32 [16][D]
 *   accumulators (O, dQ, dK, dV); SLD: fp32 [16][BC] scores (S, dP);
 *   PLD: 16-bit [16][BC] products' inputs (P, dS). */
template <int DM, typename E, int W, int NBUF = 1> struct fl_cfg {
    typedef E elem;
    static const int D = DM, BC = DM > 128 ? 16 : 32, NW = W;
    /* K / V tile buffers of the forward and dq: 2 stage the next tile
     * by cp.async while the block computes on this one (kn_async.cuh). */
    static const int BUF = NBUF;
    static const int QLD = DM + 8, OLD = DM + 4, SLD = BC + 4, PLD = BC + 8;
    /* dk/dv on the register MMA (fl_dkdv_reg_run): its dK and dV take
     * DM registers a lane, so up to head dim 128; at 256 the wmma kernel
     * with shared-memory accumulators (fl_dkdv_run). */
    static const bool KV_REG = DM <= 128;
};

template <typename E> struct fl_type;
template <> struct fl_type<__half> {
    static const int dt = KN_F16;
};
template <> struct fl_type<__nv_bfloat16> {
    static const int dt = KN_BF16;
};

/* x as hi + lo, both of 16-bit type dt: hi = x rounded, lo = the rest
 * rounded, so hi + lo holds x to about twice the type's precision. */
__device__ __forceinline__ void fl_split_as(int dt, float x, uint16_t *hi, uint16_t *lo)
{
    uint16_t h = dt == KN_BF16 ? to_bf16(x) : to_f16(x);
    float rest = x - (dt == KN_BF16 ? from_bf16(h) : from_f16(h));
    *hi = h;
    *lo = dt == KN_BF16 ? to_bf16(rest) : to_f16(rest);
}
template <typename E> __device__ __forceinline__ void fl_split(float x, uint16_t *hi, uint16_t *lo)
{
    fl_split_as(fl_type<E>::dt, x, hi, lo);
}

using namespace nvcuda;

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> fl_acc;

/* C[16][16] (ld ldc, fp32, row-major) = A[16][K] B[K][16] + (acc ? C : 0):
 * A row-major (ld lda); B row-major (ld ldb) or, when BT, the transpose
 * of a row-major [16][K] (ld ldb). */
template <typename E, bool BT, int K>
__device__ __forceinline__ void fl_tile(float *C, int ldc, const E *A, int lda, const E *B, int ldb,
                                        bool acc)
{
    typedef typename std::conditional<BT, wmma::col_major, wmma::row_major>::type LB;
    fl_acc c;
    if (acc) {
        __syncwarp(); /* C may be the tile the lanes just stored, each its part */
        wmma::load_matrix_sync(c, C, ldc, wmma::mem_row_major);
    } else
        wmma::fill_fragment(c, 0.0f);
    for (int k = 0; k < K; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, E, LB> b;
        wmma::load_matrix_sync(a, A + k, lda);
        wmma::load_matrix_sync(b, BT ? B + k : B + (size_t)k * ldb, ldb);
        wmma::mma_sync(c, a, b, c);
    }
    wmma::store_matrix_sync(C, c, ldc, wmma::mem_row_major);
}

/* C[16][N] += A[16][K] B for B row-major [K][N] (outputs: P V, dS K),
 * C in shared memory; fl_mma below is the same into registers. */
template <typename E, int N, int K>
__device__ __forceinline__ void fl_ab_acc(float *C, int ldc, const E *A, int lda, const E *B,
                                          int ldb)
{
    for (int n = 0; n < N; n += 16)
        fl_tile<E, false, K>(C + n, ldc, A, lda, B + n, ldb, true);
}

/* acc[n] (+)= A[16][K] B for the 16 columns n of N, accumulators held in
 * registers: B row-major [K][N] or, when BT, the transpose of a
 * row-major [N][K]. Each A fragment is loaded once a k step for all N/16
 * products (fl_tile loads it once per product). Fully unrolled, so acc
 * stays in registers: every S and dP, and the backward's dQ, dK, dV,
 * which need no per-row rescale and so stay in fragments to the end. */
template <typename E, bool BT, int N, int K>
__device__ __forceinline__ void fl_mma(fl_acc (&acc)[N / 16], const E *A, int lda, const E *B,
                                       int ldb)
{
    typedef typename std::conditional<BT, wmma::col_major, wmma::row_major>::type LB;
    KN_UNROLL(1)
    for (int k = 0; k < K; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> a;
        wmma::load_matrix_sync(a, A + k, lda);
        KN_UNROLL(16)
        for (int n = 0; n < N / 16; n++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, E, LB> b;
            wmma::load_matrix_sync(b, BT ? B + (size_t)16 * n * ldb + k : B + (size_t)k * ldb + 16 * n,
                                   ldb);
            wmma::mma_sync(acc[n], a, b, acc[n]);
        }
    }
}

/* The N / 16 accumulators as zeros, or into C[16][N] (ld ldc, row-major). */
template <int N> __device__ __forceinline__ void fl_zero(fl_acc (&acc)[N / 16])
{
    KN_UNROLL(16)
    for (int n = 0; n < N / 16; n++)
        wmma::fill_fragment(acc[n], 0.0f);
}
template <int N> __device__ __forceinline__ void fl_store(float *C, int ldc, fl_acc (&acc)[N / 16])
{
    KN_UNROLL(16)
    for (int n = 0; n < N / 16; n++)
        wmma::store_matrix_sync(C + 16 * n, acc[n], ldc, wmma::mem_row_major);
}

/* A backward tile's two score products into shared memory (ld sld, both
 * [16][BC]): S = A B^T and dP = G W^T. dk/dv at head dim 256 passes the
 * transposes' factors K, Q, V, dO. */
template <typename E, int BC, int D>
__device__ __forceinline__ void fl_scores(float *S, float *dP, int sld, const E *A, const E *B,
                                          const E *G, const E *W, int ld)
{
    fl_acc sc[BC / 16];
    fl_zero<BC>(sc);
    fl_mma<E, true, BC, D>(sc, A, ld, B, ld);
    fl_store<BC>(S, sld, sc);
    fl_zero<BC>(sc);
    fl_mma<E, true, BC, D>(sc, G, ld, W, ld);
    fl_store<BC>(dP, sld, sc);
}

/* Rows [r0, r0 + R) of a [B,T,H,D] 16-bit tensor (its head's first element
 * at `base`, row stride ld) into sm[R][sld], rows past T as zeros; threads
 * [t0, t0 + nt) share the copy. ASYNC: the 16-byte pieces of rows before
 * T go by cp.async (kn_async.cuh; the caller commits and waits), the rest
 * by plain stores. */
template <bool ASYNC = false>
__device__ __forceinline__ void fl_stage(uint16_t *sm, int sld, const void *src, size_t base,
                                         int r0, int R, int T, int D, int ld, int t, int nt)
{
    const uint16_t *s = (const uint16_t *)src;
    /* 16 bytes a load where rows allow it (every head dim here is a
     * multiple of 8, sld too; ld and the head's start decide) */
    if (ld % 8 == 0 && (uintptr_t)(s + base) % 16 == 0) {
        const int D8 = D / 8;
        /* fully unrolled, the loads' registers spill beside the fragments */
        KN_UNROLL(2)
        for (int e = t; e < R * D8; e += nt) {
            int r = e / D8, c = e % D8;
            uint16_t *d = sm + r * sld + 8 * c;
            const uint16_t *from = s + base + (size_t)(r0 + r) * ld + 8 * c;
            if (ASYNC && r0 + r < T) {
                kn_cp_async16(d, from);
                continue;
            }
            uint4 u = {0, 0, 0, 0};
            if (r0 + r < T) u = *(const uint4 *)from;
            *(uint4 *)d = u;
        }
        return;
    }
    for (int e = t; e < R * D; e += nt) {
        int r = e / D, d = e % D;
        sm[r * sld + d] = r0 + r < T ? s[base + (size_t)(r0 + r) * ld + d] : (uint16_t)0;
    }
}

/* The K and V tiles from key j0 into Ks, Vs ([BC][sld] each), by the whole
 * block: with BUF 2 issued by cp.async and committed as one group, else
 * plain (the caller's barriers make either visible). */
template <int BUF>
__device__ __forceinline__ void fl_stage_kv(uint16_t *Ks, uint16_t *Vs, int sld, const void *k,
                                            const void *v, size_t kvb, int j0, int BC, int T, int D,
                                            int ldkv)
{
    fl_stage<BUF == 2>(Ks, sld, k, kvb, j0, BC, T, D, ldkv, threadIdx.x, blockDim.x);
    fl_stage<BUF == 2>(Vs, sld, v, kvb, j0, BC, T, D, ldkv, threadIdx.x, blockDim.x);
    if constexpr (BUF == 2) kn_cp_commit();
}

/* The top of a key-tile loop of the forward and dq: tile `it` (from j0)
 * staged and visible to the whole block in buffer it % BUF of KV (each
 * buffer K then V, [BC][sld] each), the next tile (from jn, when jn <=
 * last) issued into the other buffer when BUF is 2 (the first tile is
 * issued before the loop, fl_kv_first). Returns buffer it's K tile. */
template <int BUF>
__device__ __forceinline__ uint16_t *fl_kv_next(uint16_t *KV, int sld, const void *k, const void *v,
                                                size_t kvb, int it, int j0, int jn, int last,
                                                int BC, int T, int D, int ldkv)
{
    uint16_t *cur = KV + (size_t)(it % BUF) * 2 * BC * sld;
    __syncthreads(); /* the tile before is consumed: its buffer may be refilled */
    if constexpr (BUF == 2) {
        uint16_t *nxt = KV + (size_t)((it + 1) % 2) * 2 * BC * sld;
        if (jn <= last) fl_stage_kv<2>(nxt, nxt + BC * sld, sld, k, v, kvb, jn, BC, T, D, ldkv);
        else kn_cp_commit(); /* an empty group keeps the wait's count */
        kn_cp_wait<1>(); /* this thread's copies of tile it have landed */
    } else
        fl_stage_kv<1>(cur, cur + BC * sld, sld, k, v, kvb, j0, BC, T, D, ldkv);
    __syncthreads();
    return cur;
}

/* Issues the first tile (from j0) into buffer 0 when BUF is 2. */
template <int BUF>
__device__ __forceinline__ void fl_kv_first(uint16_t *KV, int sld, const void *k, const void *v,
                                            size_t kvb, int j0, int last, int BC, int T, int D,
                                            int ldkv)
{
    if constexpr (BUF == 2)
        if (j0 <= last) fl_stage_kv<2>(KV, KV + BC * sld, sld, k, v, kvb, j0, BC, T, D, ldkv);
}

/* dO's rows [r0, r0 + R) of head h in batch b into sm[R][sld], as fl_stage
 * stages Q. */
__device__ __forceinline__ void fl_stage_do(uint16_t *sm, int sld, fl_grad g, int b, int h, int r0,
                                            int R, int T, int Hq, int D, int t, int nt)
{
    size_t base = (size_t)b * T * Hq * D + (size_t)h * D;
    fl_stage(sm, sld, g.dO, base, r0, R, T, D, Hq * D, t, nt);
}

/* Whether query position i sees key j. */
__device__ __forceinline__ bool fl_sees(int i, int j, int window)
{
    return j <= i && (window <= 0 || i - j < window);
}

/* ---- forward ------------------------------------------------------------- */

/* The key tile of the register kernels (the forward, dq): 64 keys (S in
 * 32 registers a lane) halve the block barriers of 32; at head dim 256,
 * where the accumulators take 128 registers a lane, 16 (32 spill). */
template <class C> struct fl_reg_tile {
    static const int BC = C::D <= 128 ? 64 : 16;
};

/* One warp's shared memory in the forward: its Q tile. */
template <class C> struct fl_fwd_warp {
    static const int BYTES = 16 * C::QLD * 2;
};

/* The block's K / V tiles of the forward and dq, at the start of their
 * shared memory: C::BUF buffers, each a K then a V [BC][QLD] tile. */
template <class C> struct fl_kv_tiles {
    static const int BYTES = C::BUF * 2 * fl_reg_tile<C>::BC * C::QLD * 2;
};

/* A [16][BC] product's columns [16 kk, 16 kk + 16), held in C layout
 * (x: BC / 8 tiles of 4), as the A fragments of its hi and lo halves
 * (fl_split): tiles 2 kk and 2 kk + 1 are the columns' two halves. */
template <typename E, int N>
__device__ __forceinline__ void fl_a_split(uint32_t (&hi)[4], uint32_t (&lo)[4],
                                           const float (&x)[N][4], int kk)
{
    KN_UNROLL(4)
    for (int r = 0; r < 4; r++) {
        /* register r: row g + 8 (r % 2), columns 16 kk + 8 (r / 2) + 2t, +1 */
        const float *c = x[2 * kk + r / 2] + 2 * (r % 2);
        uint16_t h0, l0, h1, l1;
        fl_split<E>(c[0], &h0, &l0);
        fl_split<E>(c[1], &h1, &l1);
        hi[r] = kn_pack16(h0, h1);
        lo[r] = kn_pack16(l0, l1);
    }
}

/* N / 8 accumulator tiles (C layout) as zeros. */
template <int N> __device__ __forceinline__ void fl_czero(float (&x)[N / 8][4])
{
    KN_UNROLL(32)
    for (int n = 0; n < N / 8; n++)
        x[n][0] = x[n][1] = x[n][2] = x[n][3] = 0.0f;
}

/* x[16][BC] += A B^T for A a row-major 16-bit [16][D] tile and B a
 * row-major [BC][D] one (its rows become x's columns), both in shared
 * memory with ld elements a row: the scores S = Q K^T and dP = dO V^T,
 * and their transposes in dk/dv. */
template <bool BF, int BC, int D>
__device__ __forceinline__ void fl_abt(float (&x)[BC / 8][4], const uint16_t *A, const uint16_t *B,
                                       int ld)
{
    KN_UNROLL(16)
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[4];
        kn_mma_load_a(a, A, ld, 16 * kk);
        KN_UNROLL(4)
        for (int j = 0; j < BC / 8; j += 2) {
            uint32_t b[2][2];
            kn_mma_load_bt2(b, B, ld, 8 * j, 16 * kk);
            kn_mma16816<BF>(x[j], a, b[0]);
            kn_mma16816<BF>(x[j + 1], a, b[1]);
        }
    }
}

/* f(r, j, e) for each of a lane's scores in a [16][BC] product (C
 * layout): row g + 8r, column 8j + 2t + e, fully unrolled so the
 * registers stay registers. */
template <int BC, typename F> __device__ __forceinline__ void fl_each(F f)
{
    KN_UNROLL(2)
    for (int r = 0; r < 2; r++)
        KN_UNROLL(8)
        for (int j = 0; j < BC / 8; j++)
            KN_UNROLL(2)
            for (int e = 0; e < 2; e++)
                f(r, j, e);
}

/* The backward's two score products into registers: s = A B^T and
 * dP = G W^T. dq passes Q, K, dO, V; dk/dv the transposes' factors K, Q,
 * V, dO. */
template <bool BF, int BC, int D>
__device__ __forceinline__ void fl_scores_reg(float (&s)[BC / 8][4], float (&dp)[BC / 8][4],
                                              const uint16_t *A, const uint16_t *B,
                                              const uint16_t *G, const uint16_t *W, int ld)
{
    fl_czero<BC>(s);
    fl_czero<BC>(dp);
    fl_abt<BF, BC, D>(s, A, B, ld);
    fl_abt<BF, BC, D>(dp, G, W, ld);
}

/* acc[16][N] += X B for X a [16][BC] product in registers (C layout),
 * entering as its hi + lo halves (fl_a_split), and B
 * rows [0, BC) of a row-major 16-bit tile in shared memory (ld elements a
 * row): O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q. */
template <typename E, int BC, int N>
__device__ __forceinline__ void fl_xb(float (&acc)[N / 8][4], const float (&x)[BC / 8][4],
                                      const uint16_t *B, int ld)
{
    const bool BF = fl_type<E>::dt == KN_BF16;
    KN_UNROLL(4)
    for (int kk = 0; kk < BC / 16; kk++) {
        uint32_t hi[4], lo[4];
        fl_a_split<E>(hi, lo, x, kk);
        KN_UNROLL(16)
        for (int n = 0; n < N / 8; n += 2) {
            uint32_t b[2][2];
            kn_mma_load_b2(b, B, ld, 16 * kk, 8 * n);
            KN_UNROLL(2)
            for (int y = 0; y < 2; y++) {
                kn_mma16816<BF>(acc[n + y], hi, b[y]);
                kn_mma16816<BF>(acc[n + y], lo, b[y]);
            }
        }
    }
}

/* The forward on kn_mma16816, whose fragments' layout is documented
 * (kn_mma.cuh), so S, P and O stay in registers from the first key tile
 * to the last: lane 4 g + t holds rows g and g + 8 of the warp's 16, of
 * S the keys 8 j + 2t, +1 of each 8-key tile j, of O the columns 8 n + 2t,
 * +1. A row's max and sum meet over its four lanes (t) by two shuffles;
 * each lane keeps its partial sum of P (rescaled with the row) and the
 * four are added at the end, in a fixed order. P's hi + lo halves
 * (fl_split) are the A fragments of O += P V as they stand: S's tiles 2kk
 * and 2kk + 1 are the keys of P's k step kk. */
template <class C>
__device__ __forceinline__ void fl_fwd_run(void *out, float *lse, const void *q, const void *k,
                                           const void *v, int Tq, int Tk, int Hq, int Hkv, int ldq,
                                           int ldkv, fl_args a)
{
    typedef typename C::elem E;
    const bool BF = fl_type<E>::dt == KN_BF16;
    const int D = C::D, BC = fl_reg_tile<C>::BC, BR = 16 * C::NW, QLD = C::QLD;
    KN_DYN_SHARED(unsigned char, sm);
    int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    uint16_t *KV = (uint16_t *)sm; /* C::BUF buffers of K, V tiles */
    uint16_t *Qs = (uint16_t *)(sm + fl_kv_tiles<C>::BYTES + w * fl_fwd_warp<C>::BYTES);
    int b = blockIdx.z, h = blockIdx.y, hk = h / (Hq / Hkv), q0 = Tk - Tq;
    int r0 = blockIdx.x * BR + w * 16, i0 = q0 + blockIdx.x * BR, wi0 = q0 + r0;
    size_t kvb = (size_t)b * Tk * ldkv + (size_t)hk * D;
    fl_stage(Qs, QLD, q, (size_t)b * Tq * ldq + (size_t)h * D, r0, 16, Tq, D, ldq, lane, 32);
    __syncwarp();
    float o[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    fl_czero<D>(o);
    /* this lane's two rows: query positions, -1 past Tq */
    int qi[2] = {r0 + g < Tq ? wi0 + g : -1, r0 + g + 8 < Tq ? wi0 + g + 8 : -1};
    int last = min(Tk - 1, i0 + BR - 1), wlast = min(Tk - 1, wi0 + 15);
    int jfirst = att_lo(i0, a.window) / BC * BC;
    fl_kv_first<C::BUF>(KV, QLD, k, v, kvb, jfirst, last, BC, Tk, D, ldkv);
    for (int j0 = jfirst, it = 0; j0 <= last; j0 += BC, it++) {
        uint16_t *Ks = fl_kv_next<C::BUF>(KV, QLD, k, v, kvb, it, j0, j0 + BC, last, BC, Tk, D, ldkv);
        uint16_t *Vs = Ks + BC * QLD;
        if (r0 >= Tq || j0 > wlast || j0 + BC <= att_lo(wi0, a.window))
            continue; /* the warp's rows see none of this tile */
        float s[BC / 8][4];
        fl_czero<BC>(s);
        fl_abt<BF, BC, D>(s, Qs, Ks, QLD);
        /* the online softmax of rows g (r = 0) and g + 8 (r = 1) */
        KN_UNROLL(2)
        for (int r = 0; r < 2; r++) {
            float tmax = -INFINITY, dt;
            KN_UNROLL(8)
            for (int j = 0; j < BC / 8; j++)
                KN_UNROLL(2)
                for (int e = 0; e < 2; e++) {
                    bool on = qi[r] >= 0 && fl_sees(qi[r], j0 + 8 * j + 2 * t + e, a.window);
                    float x = on ? att_score(s[j][2 * r + e], a.scale, a.cap, &dt) : -INFINITY;
                    s[j][2 * r + e] = x;
                    tmax = fmaxf(tmax, x);
                }
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
            bool none = tmax == -INFINITY; /* nothing visible in this tile: P = 0 */
            float mnew = fmaxf(m[r], tmax), corr = none ? 1.0f : expf(m[r] - mnew), sum = 0.0f;
            KN_UNROLL(8)
            for (int j = 0; j < BC / 8; j++)
                KN_UNROLL(2)
                for (int e = 0; e < 2; e++) {
                    float x = s[j][2 * r + e];
                    float p = x == -INFINITY ? 0.0f : expf(x - mnew);
                    s[j][2 * r + e] = p;
                    sum += p;
                }
            l[r] = l[r] * corr + sum;
            if (!none) m[r] = mnew;
            if (corr != 1.0f)
                KN_UNROLL(32)
                for (int n = 0; n < D / 8; n++)
                    o[n][2 * r] *= corr, o[n][2 * r + 1] *= corr;
        }
        fl_xb<E, BC, D>(o, s, Vs, QLD); /* O += P V, P as hi + lo */
    }
    /* each row's sum over its four lanes, in the same order in each */
    KN_UNROLL(2)
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    KN_UNROLL(2)
    for (int r = 0; r < 2; r++) {
        if (qi[r] < 0) continue;
        int row = r0 + g + 8 * r;
        float inv = 1.0f / l[r];
        size_t ob = ((size_t)b * Tq + row) * Hq * D + (size_t)h * D;
        uint16_t *po = (uint16_t *)out + ob + 2 * t;
        KN_UNROLL(32)
        for (int n = 0; n < D / 8; n++) {
            uint16_t x0 = BF ? to_bf16(o[n][2 * r] * inv) : to_f16(o[n][2 * r] * inv);
            uint16_t x1 = BF ? to_bf16(o[n][2 * r + 1] * inv) : to_f16(o[n][2 * r + 1] * inv);
            *(uint32_t *)(po + 8 * n) = kn_pack16(x0, x1);
        }
        if (t == 0) lse[((size_t)b * Hq + h) * Tq + row] = m[r] + logf(l[r]);
    }
}

/* bf16 fragments exist from sm_80: the body compiles empty before. */
template <class C>
__global__ void __launch_bounds__(C::NW * 32, 1)
    k_fl_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int Tq, int Tk,
             int Hq, int Hkv, int ldq, int ldkv, fl_args a)
{
    if constexpr (fl_type<typename C::elem>::dt == KN_F16 || FL_BF16_OK)
        fl_fwd_run<C>(out, lse, q, k, v, Tq, Tk, Hq, Hkv, ldq, ldkv, a);
}

/* ---- backward: dq -------------------------------------------------------- */

/* One warp's shared memory in dq: Q, dO. */
template <class C> struct fl_dq_warp {
    static const int BYTES = 2 * 16 * C::QLD * 2;
};

/* P and dS of one score (0 where masked), dS split into ds[0] and ds[n]. */
template <class C>
__device__ __forceinline__ float fl_ds(float s, float dp, float L, float Dd, bool sees, fl_args a,
                                       uint16_t *ds, int n)
{
    float dt = 1.0f, p = sees ? expf(att_score(s, a.scale, a.cap, &dt) - L) : 0.0f;
    fl_split<typename C::elem>(sees ? p * (dp - Dd) * a.scale * dt : 0.0f, ds, ds + n);
    return p;
}

/* dq on kn_mma16816, as the forward: a warp's 16 query rows walk the key
 * tiles with S = Q K^T, dP = dO V^T, dS and the dQ accumulators in
 * registers (lane 4 g + t: rows g and g + 8); dS's hi + lo halves are the
 * A fragments of dQ += dS K. */
template <class C>
__device__ __forceinline__ void fl_dq_run(void *dq, fl_grad g, const float *lse, const void *q,
                                          const void *k, const void *v, int T, int Hq, int Hkv,
                                          int ldq, int ldkv, fl_args a)
{
    typedef typename C::elem E;
    const bool BF = fl_type<E>::dt == KN_BF16;
    const int D = C::D, BC = fl_reg_tile<C>::BC, BR = 16 * C::NW, QLD = C::QLD;
    KN_DYN_SHARED(unsigned char, sm);
    int w = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t = lane % 4;
    uint16_t *KV = (uint16_t *)sm; /* C::BUF buffers of K, V tiles */
    uint16_t *Qs = (uint16_t *)(sm + fl_kv_tiles<C>::BYTES + w * fl_dq_warp<C>::BYTES),
             *dOs = Qs + 16 * QLD;
    int b = blockIdx.z, h = blockIdx.y, hk = h / (Hq / Hkv);
    int r0 = blockIdx.x * BR + w * 16, i0 = blockIdx.x * BR;
    size_t kvb = (size_t)b * T * ldkv + (size_t)hk * D;
    fl_stage(Qs, QLD, q, (size_t)b * T * ldq + (size_t)h * D, r0, 16, T, D, ldq, lane, 32);
    fl_stage_do(dOs, QLD, g, b, h, r0, 16, T, Hq, D, lane, 32);
    __syncwarp();
    int qi[2];
    float L[2], Dd[2], acc[D / 8][4];
    KN_UNROLL(2)
    for (int r = 0; r < 2; r++) {
        int row = r0 + gr + 8 * r;
        size_t lb = ((size_t)b * Hq + h) * T + row;
        qi[r] = row < T ? row : -1;
        L[r] = row < T ? lse[lb] : 0.0f;
        Dd[r] = row < T ? g.Dd[lb] : 0.0f;
    }
    fl_czero<D>(acc);
    int last = min(T - 1, i0 + BR - 1), wlast = min(T - 1, r0 + 15);
    int jfirst = att_lo(i0, a.window) / BC * BC;
    fl_kv_first<C::BUF>(KV, QLD, k, v, kvb, jfirst, last, BC, T, D, ldkv);
    for (int j0 = jfirst, it = 0; j0 <= last; j0 += BC, it++) {
        uint16_t *Ks = fl_kv_next<C::BUF>(KV, QLD, k, v, kvb, it, j0, j0 + BC, last, BC, T, D, ldkv);
        uint16_t *Vs = Ks + BC * QLD;
        if (r0 >= T || j0 > wlast || j0 + BC <= att_lo(r0, a.window)) continue;
        float s[BC / 8][4], dp[BC / 8][4];
        fl_scores_reg<BF, BC, D>(s, dp, Qs, Ks, dOs, Vs, QLD);
        /* dS = P (dP - D_i) scale, 0 where masked, into s */
        fl_each<BC>([&](int r, int j, int e) {
            bool sees = qi[r] >= 0 && fl_sees(qi[r], j0 + 8 * j + 2 * t + e, a.window);
            float dt = 1.0f, x = s[j][2 * r + e];
            float p = sees ? expf(att_score(x, a.scale, a.cap, &dt) - L[r]) : 0.0f;
            s[j][2 * r + e] = sees ? p * (dp[j][2 * r + e] - Dd[r]) * a.scale * dt : 0.0f;
        });
        fl_xb<E, BC, D>(acc, s, Ks, QLD); /* dQ += dS K */
    }
    KN_UNROLL(2)
    for (int r = 0; r < 2; r++) {
        if (qi[r] < 0) continue;
        size_t o = ((size_t)b * T + qi[r]) * ldq + (size_t)h * D + 2 * t;
        KN_UNROLL(32)
        for (int n = 0; n < D / 8; n++) {
            store_from_f32(dq, a.gdt, o + 8 * n, acc[n][2 * r]);
            store_from_f32(dq, a.gdt, o + 8 * n + 1, acc[n][2 * r + 1]);
        }
    }
}

/* bf16 fragments exist from sm_80: the body compiles empty before. */
template <class C>
__global__ void __launch_bounds__(C::NW * 32, 1)
    k_fl_bwd_dq(void *dq, fl_grad g, const float *lse, const void *q, const void *k, const void *v,
                int T, int Hq, int Hkv, int ldq, int ldkv, fl_args a)
{
    if constexpr (fl_type<typename C::elem>::dt == KN_F16 || FL_BF16_OK)
        fl_dq_run<C>(dq, g, lse, q, k, v, T, Hq, Hkv, ldq, ldkv, a);
}

/* ---- backward: dk, dv ---------------------------------------------------- */

/* The block's query tile: Q, dO, L, D; one warp's: K, V, S^T, dP^T, P^T
 * and dS^T (each hi, lo), dK, dV. */
template <class C> struct fl_kv_block {
    static const int BYTES = 2 * C::BC * C::QLD * 2 + 2 * C::BC * 4;
};
template <class C> struct fl_kv_warp {
    static const int BYTES =
        2 * 16 * C::QLD * 2 + 2 * 16 * C::SLD * 4 + 4 * 16 * C::PLD * 2 + 2 * 16 * C::OLD * 4;
};

/* Stages query tile [i0, i0 + BC) of head h: Q, dO, L and D. */
template <class C, int BC>
__device__ __forceinline__ void fl_kv_stage(unsigned char *sm, fl_grad g, const float *lse,
                                            const void *q, int b, int h, int i0, int T, int Hq,
                                            int ldq)
{
    const int D = C::D, QLD = C::QLD;
    uint16_t *Qs = (uint16_t *)sm, *dOs = Qs + BC * QLD;
    float *Ls = (float *)(dOs + BC * QLD), *Dd = Ls + BC;
    fl_stage(Qs, QLD, q, (size_t)b * T * ldq + (size_t)h * D, i0, BC, T, D, ldq, threadIdx.x,
             blockDim.x);
    fl_stage_do(dOs, QLD, g, b, h, i0, BC, T, Hq, D, threadIdx.x, blockDim.x);
    for (int r = threadIdx.x; r < BC; r += blockDim.x) {
        size_t lb = ((size_t)b * Hq + h) * T + i0 + r;
        bool live = i0 + r < T;
        Ls[r] = live ? lse[lb] : 0.0f;
        Dd[r] = live ? g.Dd[lb] : 0.0f;
    }
}

/* dk/dv's walk: for each query head of kv head hk's group and each query
 * tile [i0, i0 + BC) that can see the block's keys [jb, jb + BR), stages
 * the tile (fl_kv_stage) and calls f(i0) where the warp's keys
 * [j0, j0 + 16) have queries in it. Every thread walks every tile: the stages' barriers need them all. */
template <class C, int BC, typename F>
__device__ __forceinline__ void fl_kv_walk(unsigned char *sm, fl_grad g, const float *lse,
                                           const void *q, int b, int hk, int jb, int j0, int T,
                                           int Hq, int Hkv, int ldq, fl_args a, F f)
{
    const int BR = 16 * C::NW, group = Hq / Hkv;
    /* Query rows past the block's last key's window see none of it. */
    int iend = a.window > 0 ? min(T, jb + BR - 1 + a.window) : T;
    int wend = a.window > 0 ? min(T, j0 + 15 + a.window) : T;
    for (int h = hk * group; h < (hk + 1) * group; h++)
        for (int i0 = jb / BC * BC; i0 < iend; i0 += BC) {
            __syncthreads();
            fl_kv_stage<C, BC>(sm, g, lse, q, b, h, i0, T, Hq, ldq);
            __syncthreads();
            if (j0 < T && i0 + BC > j0 && i0 < wend) f(i0);
        }
}

/* P^T and dS^T of the warp's 16 keys (from j0) against query tile i0. */
template <class C>
__device__ __forceinline__ void fl_kv_probs(uint16_t *Pt, uint16_t *dSt, const float *St,
                                            const float *dPt, const float *Ls, const float *Dd,
                                            int j0, int i0, int T, fl_args a)
{
    const int BC = C::BC, SLD = C::SLD, PLD = C::PLD;
    for (int e = threadIdx.x % 32; e < 16 * BC; e += 32) {
        int jr = e / BC, t = e % BC, i = i0 + t;
        float p = fl_ds<C>(St[jr * SLD + t], dPt[jr * SLD + t], Ls[t], Dd[t],
                           i < T && fl_sees(i, j0 + jr, a.window), a, dSt + jr * PLD + t, 16 * PLD);
        fl_split<typename C::elem>(p, Pt + jr * PLD + t, Pt + 16 * PLD + jr * PLD + t);
    }
}

/* dV += P^T dO and dK += dS^T Q, P^T and dS^T split (hi, lo). dK, dV:
 * shared-memory accumulators. */
template <class C>
__device__ __forceinline__ void fl_kv_acc(float *dK, float *dV, const uint16_t *Pt,
                                          const uint16_t *dSt, const uint16_t *Qs,
                                          const uint16_t *dOs)
{
    typedef typename C::elem E;
    const int D = C::D, BC = C::BC, QLD = C::QLD, OLD = C::OLD, PLD = C::PLD;
    const E *P = (const E *)Pt, *dS = (const E *)dSt, *Q = (const E *)Qs, *dO = (const E *)dOs;
    fl_ab_acc<E, D, BC>(dV, OLD, P, PLD, dO, QLD);
    fl_ab_acc<E, D, BC>(dV, OLD, P + 16 * PLD, PLD, dO, QLD);
    fl_ab_acc<E, D, BC>(dK, OLD, dS, PLD, Q, QLD);
    fl_ab_acc<E, D, BC>(dK, OLD, dS + 16 * PLD, PLD, Q, QLD);
}

/* dk/dv at head dim 256 on wmma: a warp's 16 keys walk the query tiles
 * with S^T, dP^T, P^T and dS^T through shared memory, dK and dV
 * accumulated in shared memory (in registers they would take 256 a lane). */
template <class C>
__device__ __forceinline__ void fl_dkdv_run(void *dk, void *dv, fl_grad g, const float *lse,
                                            const void *q, const void *k, const void *v, int T,
                                            int Hq, int Hkv, int ldq, int ldkv, fl_args a)
{
    typedef typename C::elem E;
    const int D = C::D, BC = C::BC, BR = 16 * C::NW;
    const int QLD = C::QLD, OLD = C::OLD, SLD = C::SLD, PLD = C::PLD;
    KN_DYN_SHARED(unsigned char, sm);
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint16_t *Qs = (const uint16_t *)sm, *dOs = Qs + BC * QLD;
    const float *Ls = (const float *)(dOs + BC * QLD), *Dd = Ls + BC;
    uint16_t *Kw = (uint16_t *)(sm + fl_kv_block<C>::BYTES + w * fl_kv_warp<C>::BYTES),
             *Vw = Kw + 16 * QLD;
    float *St = (float *)(Vw + 16 * QLD), *dPt = St + 16 * SLD;
    uint16_t *Pt = (uint16_t *)(dPt + 16 * SLD), *dSt = Pt + 2 * 16 * PLD;
    float *dK = (float *)(dSt + 2 * 16 * PLD), *dV = dK + 16 * OLD;
    int b = blockIdx.z, hk = blockIdx.y, jb = blockIdx.x * BR, j0 = jb + w * 16;
    size_t kvb = (size_t)b * T * ldkv + (size_t)hk * D;
    fl_stage(Kw, QLD, k, kvb, j0, 16, T, D, ldkv, lane, 32);
    fl_stage(Vw, QLD, v, kvb, j0, 16, T, D, ldkv, lane, 32);
    for (int e = lane; e < 16 * OLD; e += 32)
        dK[e] = dV[e] = 0.0f;
    __syncwarp();
    fl_kv_walk<C, BC>(sm, g, lse, q, b, hk, jb, j0, T, Hq, Hkv, ldq, a, [&](int i0) {
        fl_scores<E, BC, D>(St, dPt, SLD, (const E *)Kw, (const E *)Qs, (const E *)Vw,
                            (const E *)dOs, QLD);
        __syncwarp();
        fl_kv_probs<C>(Pt, dSt, St, dPt, Ls, Dd, j0, i0, T, a);
        __syncwarp();
        fl_kv_acc<C>(dK, dV, Pt, dSt, Qs, dOs);
        __syncwarp(); /* P^T, dS^T are rewritten by the next tile */
    });
    __syncwarp();
    for (int e = lane; e < 16 * D; e += 32) {
        int r = e / D, d = e % D;
        size_t g = kvb + (size_t)(j0 + r) * ldkv + d;
        if (j0 + r >= T) continue;
        if (dk) store_from_f32(dk, a.gdt, g, dK[r * OLD + d]);
        if (dv) store_from_f32(dv, a.gdt, g, dV[r * OLD + d]);
    }
}

/* The query tile of the register dk/dv: S^T and dP^T take BC / 2
 * registers a lane each beside dK and dV's D: 64 queries up to head dim
 * 80, 32 at 96 and 16 at 128 (at sm_90 more spill). */
template <class C> struct fl_kv_reg_tile {
    static const int BC = C::D <= 80 ? 64 : C::D <= 96 ? 32 : 16;
};
/* Its block's query tile (Q, dO, L, D) and a warp's K, V. */
template <class C> struct fl_kv_reg_block {
    static const int BYTES = 2 * fl_kv_reg_tile<C>::BC * C::QLD * 2 + 2 * fl_kv_reg_tile<C>::BC * 4;
};
template <class C> struct fl_kv_reg_warp {
    static const int BYTES = 2 * 16 * C::QLD * 2;
};

/* dk/dv up to head dim 128 on kn_mma16816: a warp's 16 keys (rows g and
 * g + 8 of lane 4 g + t) walk the query tiles of the heads of their group
 * with S^T = K Q^T, dP^T = V dO^T, P^T, dS^T and the dK, dV accumulators
 * in registers; P^T's and dS^T's hi + lo halves are the A fragments of
 * dV += P^T dO and dK += dS^T Q. */
template <class C>
__device__ __forceinline__ void fl_dkdv_reg_run(void *dk, void *dv, fl_grad g, const float *lse,
                                                const void *q, const void *k, const void *v, int T,
                                                int Hq, int Hkv, int ldq, int ldkv, fl_args a)
{
    typedef typename C::elem E;
    const bool BF = fl_type<E>::dt == KN_BF16;
    const int D = C::D, BC = fl_kv_reg_tile<C>::BC, BR = 16 * C::NW, QLD = C::QLD;
    KN_DYN_SHARED(unsigned char, sm);
    int w = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t = lane % 4;
    const uint16_t *Qs = (const uint16_t *)sm, *dOs = Qs + BC * QLD;
    const float *Ls = (const float *)(dOs + BC * QLD), *Dd = Ls + BC;
    uint16_t *Kw = (uint16_t *)(sm + fl_kv_reg_block<C>::BYTES + w * fl_kv_reg_warp<C>::BYTES),
             *Vw = Kw + 16 * QLD;
    int b = blockIdx.z, hk = blockIdx.y, jb = blockIdx.x * BR, j0 = jb + w * 16;
    size_t kvb = (size_t)b * T * ldkv + (size_t)hk * D;
    fl_stage(Kw, QLD, k, kvb, j0, 16, T, D, ldkv, lane, 32);
    fl_stage(Vw, QLD, v, kvb, j0, 16, T, D, ldkv, lane, 32);
    __syncwarp();
    int kj[2] = {j0 + gr, j0 + gr + 8}; /* this lane's two keys */
    float dK[D / 8][4], dV[D / 8][4];
    fl_czero<D>(dK);
    fl_czero<D>(dV);
    fl_kv_walk<C, BC>(sm, g, lse, q, b, hk, jb, j0, T, Hq, Hkv, ldq, a, [&](int i0) {
        float s[BC / 8][4], dp[BC / 8][4];
        fl_scores_reg<BF, BC, D>(s, dp, Kw, Qs, Vw, dOs, QLD);
        /* P^T into s, dS^T into dp; 0 where masked */
        fl_each<BC>([&](int r, int j, int e) {
            int c = 8 * j + 2 * t + e, i = i0 + c;
            bool sees = i < T && fl_sees(i, kj[r], a.window);
            float dt = 1.0f, x = s[j][2 * r + e];
            float p = sees ? expf(att_score(x, a.scale, a.cap, &dt) - Ls[c]) : 0.0f;
            s[j][2 * r + e] = p;
            dp[j][2 * r + e] = sees ? p * (dp[j][2 * r + e] - Dd[c]) * a.scale * dt : 0.0f;
        });
        fl_xb<E, BC, D>(dV, s, dOs, QLD); /* dV += P^T dO */
        fl_xb<E, BC, D>(dK, dp, Qs, QLD); /* dK += dS^T Q */
    });
    KN_UNROLL(2)
    for (int r = 0; r < 2; r++) {
        if (kj[r] >= T) continue;
        size_t row = kvb + (size_t)kj[r] * ldkv + 2 * t;
        KN_UNROLL(16)
        for (int n = 0; n < D / 8; n++)
            KN_UNROLL(2)
            for (int e = 0; e < 2; e++) {
                if (dk) store_from_f32(dk, a.gdt, row + 8 * n + e, dK[n][2 * r + e]);
                if (dv) store_from_f32(dv, a.gdt, row + 8 * n + e, dV[n][2 * r + e]);
            }
    }
}

/* bf16 fragments exist from sm_80: the body compiles empty before. */
template <class C>
__global__ void __launch_bounds__(C::NW * 32, 1)
    k_fl_bwd_dkdv(void *dk, void *dv, fl_grad g, const float *lse, const void *q, const void *k,
                  const void *v, int T, int Hq, int Hkv, int ldq, int ldkv, fl_args a)
{
    if constexpr (fl_type<typename C::elem>::dt == KN_F16 || FL_BF16_OK) {
        if constexpr (C::KV_REG)
            fl_dkdv_reg_run<C>(dk, dv, g, lse, q, k, v, T, Hq, Hkv, ldq, ldkv, a);
        else
            fl_dkdv_run<C>(dk, dv, g, lse, q, k, v, T, Hq, Hkv, ldq, ldkv, a);
    }
}

/* ---- shared memory and warps per block ----------------------------------- */

enum { FL_FWD, FL_DQ, FL_DKDV };

template <int K, class C> constexpr size_t fl_smem()
{
    return K == FL_FWD  ? (size_t)fl_kv_tiles<C>::BYTES + (size_t)C::NW * fl_fwd_warp<C>::BYTES
           : K == FL_DQ ? (size_t)fl_kv_tiles<C>::BYTES + (size_t)C::NW * fl_dq_warp<C>::BYTES
           : C::KV_REG  ? (size_t)fl_kv_reg_block<C>::BYTES + (size_t)C::NW * fl_kv_reg_warp<C>::BYTES
                        : (size_t)fl_kv_block<C>::BYTES + (size_t)C::NW * fl_kv_warp<C>::BYTES;
}

/* Shared memory a block may have: 48 KiB on any device; 160 KiB with the
 * opt-in of A100 (163 KiB) and H100 / H200 (227 KiB). More warps a block
 * share each staged tile (K / V in the forward and dq, Q / dO in dk/dv),
 * so every kernel takes the opt-in where it is granted: at head dim 128
 * dq has 4 warps a block there, one in 48 KiB, and stages its K / V tiles
 * a quarter as often per query row. Where the opt-in is refused (sm_86 /
 * sm_89 stop at 99 KiB) the 48 KiB configuration runs. */
#define FL_SMEM_BASE (48 * 1024)
#define FL_SMEM_OPTIN (160 * 1024)

/* K / V buffers (fl_cfg::BUF): 2 for the forward and dq in the opted-in
 * shared memory, where every head dim fits them with 4 warps; 1 in 48
 * KiB, where the second would cost warps, and in dk/dv, which stages its
 * query tiles plainly. */
template <int K, int LIMIT> constexpr int fl_buf()
{
    return K != FL_DKDV && LIMIT > FL_SMEM_BASE ? 2 : 1;
}

/* The most warps per block (4, 2, 1) whose shared memory fits in LIMIT. */
template <int K, int DM, typename E, int LIMIT> constexpr int fl_nw()
{
    return fl_smem<K, fl_cfg<DM, E, 4, fl_buf<K, LIMIT>()>>() <= LIMIT ? 4
           : fl_smem<K, fl_cfg<DM, E, 2, fl_buf<K, LIMIT>()>>() <= LIMIT ? 2
                                                                       : 1;
}

/* A block above the 48 KiB default is opted in where the device has it:
 * sm_80 and later. */
template <typename F> static bool fl_smem_ok(kn_ctx *c, F *kernel, size_t smem)
{
    if (smem <= 48 * 1024) return true;
    if (kn_cuda_st(c)->cc_major < 8) return false;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) ==
           cudaSuccess;
}

/* ---- launching ------------------------------------------------------------ */

/* A launcher's kernel is built for two shared-memory limits (fl_nw): on
 * sm_80 and later the opted-in one, with more warps a block, is tried
 * first. L::at<LIMIT>(c, args...) launches one configuration, or returns
 * false where the device cannot give it its shared memory. */
template <class L, typename... A> static bool fl_limits(kn_ctx *c, A... args)
{
    return (kn_cuda_st(c)->cc_major >= 8 && L::template at<FL_SMEM_OPTIN>(c, args...)) ||
           L::template at<FL_SMEM_BASE>(c, args...);
}

/* L<DM, E> at the head dim D the flash kernels are built for (fl_picks
 * has checked it) and the 16-bit type dt. */
template <template <int, typename> class L, typename E, typename... A>
static bool fl_dims(kn_ctx *c, int D, A... args)
{
    switch (D) {
    case 64:
        return fl_limits<L<64, E>>(c, args...);
    case 80:
        return fl_limits<L<80, E>>(c, args...);
    case 96:
        return fl_limits<L<96, E>>(c, args...);
    case 128:
        return fl_limits<L<128, E>>(c, args...);
    default:
        return fl_limits<L<256, E>>(c, args...);
    }
}
template <template <int, typename> class L, typename... A>
static bool fl_launch(kn_ctx *c, kn_dtype dt, int D, A... args)
{
    return dt == KN_BF16 ? fl_dims<L, __nv_bfloat16>(c, D, args...)
                         : fl_dims<L, __half>(c, D, args...);
}

} // namespace KN_NS

#endif
