/* cuda_attn_flash.cuh — flash attention on tensor cores (nvcuda::wmma) for
 * bf16 / fp16 q, k, v at head dims 64, 80, 96, 128 and 256; included by
 * cuda_attention.cu, which keeps the scalar kernels for fp32 and the other
 * head dims and picks between them (fl_picks).
 *
 * Same scheme and results as the scalar kernels (FlashAttention-2, nothing
 * of size T x T, out and lse saved; the backward rebuilds P = exp(S - lse)
 * and dS = P (dP - D_i) scale with D_i = rowsum(dO_i * O_i)), with every
 * product on 16x16x16 warp tiles, fp32 accumulators:
 *  - Forward: a warp owns 16 query rows (its Q tile staged once), a block
 *    NW warps sharing the K / V tiles of BC keys staged in shared memory.
 *    Per tile S = Q K^T goes to shared memory, two lanes own a row (half
 *    its keys each): mask, soft-cap, online softmax (running max m and
 *    sum l), P, the row of the fp32 output tile O rescaled where its max
 *    moved (after the first tiles, rarely); then O += P V on the tensor
 *    cores
 *    (O loaded into the accumulators from shared memory and stored back).
 *    The end writes out = O / l and lse.
 *  - Backward, deterministic without atomics: k_fl_rowdot computes
 *    D_i and dO's hi + lo split once into scratch (fl_grad), then two
 *    kernels as the
 *    scalar path: dq (a warp per 16 query rows walks the key tiles: S = Q K^T,
 *    dP = dO V^T, dS per row, dQ += dS K) and dk/dv (a warp per 16 key rows
 *    of a kv head walks the query heads of its group and their query
 *    tiles: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q).
 *    dQ, and dK / dV up to head dim 128, accumulate in registers (fl_mma)
 *    from the first tile to the last; the forward's O stays in shared
 *    memory, where each tile's rescale reaches its rows.
 * q, k, v are exact in the input type; P, dS and the fp32 dO are not, so
 * each enters its products as hi + lo, both in the input type (fl_split,
 * two MMAs; lo x lo left out): one rounded P alone put bf16 results at 5x
 * the 16-bit tolerances of kernels.table at T = 70.
 * Shared-memory tiles are padded by 16 bytes a row (fl_cfg says why).
 * Elementwise work goes through shared memory, never through a fragment's
 * elements, whose per-lane layout is the hardware's: every tile a lane
 * reads back after a store is behind a __syncwarp. Warps per block: the
 * most (4, 2 or 1) whose shared memory fits in 160 KiB where the device
 * grants it, else in 48 KiB (fl_nw); dk/dv at 96 and 128 and dq, dk/dv
 * at 256 need more than 48 KiB even with one warp (48.2 / 60.2 / 61.6 /
 * 79.4 KiB) and run on sm_80 and later only (cuda_attention.cu falls back
 * to the scalar kernels before). No
 * per-thread arrays: ptxas reports no stack (kernels.cuda_attn_ptxas).
 * Each kernel's __launch_bounds__ names one block an SM as its minimum:
 * without it ptxas held some builds to 96 or 128 registers a lane and
 * spilled a few bytes; with it they take 90 to 250, and shared memory,
 * not registers, still bounds the blocks an SM runs.
 * bf16 fragments need sm_80: on sm_75 the bf16 kernels compile empty and
 * fl_picks sends bf16 to the scalar path. */
#ifndef TY_CUDA_ATTN_FLASH_CUH
#define TY_CUDA_ATTN_FLASH_CUH

#ifndef KN_CUDA_EMU
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#endif
#include <type_traits>

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
template <int DM, typename E, int W> struct fl_cfg {
    typedef E elem;
    static const int D = DM, BC = DM > 128 ? 16 : 32, NW = W;
    static const int QLD = DM + 8, OLD = DM + 4, SLD = BC + 4, PLD = BC + 8;
    /* dk/dv's accumulators in registers (fl_mma): 2 x DM / 2 a lane, so
     * up to head dim 128; at 256 they stay in shared memory. */
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

/* fl_ab_acc into register accumulators (ldc unused), so one caller
 * serves either home of its accumulators. */
template <typename E, int N, int K>
__device__ __forceinline__ void fl_ab_acc(fl_acc (&acc)[N / 16], int, const E *A, int lda,
                                          const E *B, int ldb)
{
    fl_mma<E, false, N, K>(acc, A, lda, B, ldb);
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
 * [16][BC]): S = A B^T and dP = G W^T, plus G2 W2^T when lo (dO's lo
 * half; fl_grad). dq passes Q, K, dO, V; dk/dv the transposes' factors
 * K, Q, V, dO. */
template <typename E, int BC, int D>
__device__ __forceinline__ void fl_scores(float *S, float *dP, int sld, const E *A, const E *B,
                                          const E *G, const E *W, const E *G2, const E *W2,
                                          bool lo, int ld)
{
    fl_acc sc[BC / 16];
    fl_zero<BC>(sc);
    fl_mma<E, true, BC, D>(sc, A, ld, B, ld);
    fl_store<BC>(S, sld, sc);
    fl_zero<BC>(sc);
    fl_mma<E, true, BC, D>(sc, G, ld, W, ld);
    if (lo) fl_mma<E, true, BC, D>(sc, G2, ld, W2, ld);
    fl_store<BC>(dP, sld, sc);
}

/* Rows [r0, r0 + R) of a [B,T,H,D] 16-bit tensor (its head's first element
 * at `base`, row stride ld) into sm[R][sld], rows past T as zeros; threads
 * [t0, t0 + nt) share the copy. */
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
            uint4 u = {0, 0, 0, 0};
            if (r0 + r < T) u = *(const uint4 *)(s + base + (size_t)(r0 + r) * ld + 8 * c);
            *(uint4 *)(sm + r * sld + 8 * c) = u;
        }
        return;
    }
    for (int e = t; e < R * D; e += nt) {
        int r = e / D, d = e % D;
        sm[r * sld + d] = r0 + r < T ? s[base + (size_t)(r0 + r) * ld + d] : (uint16_t)0;
    }
}

/* What k_fl_rowdot prepares for both backward kernels from the fp32 dO:
 * D_i = rowsum(dO_i * O_i) per row and head (laid out as lse), and dO
 * split into hi + lo of the input type (fl_split; each [B, T, Hq, D]), so
 * the kernels stage dO as they stage Q, 16 bytes a load, and split none
 * of it again for every key block. lo_rows (laid out as lse) is 1 where a
 * row's lo half is not all zeros: the engine's 16-bit steps round every
 * activation gradient to the input type, so their dO is exact in it and
 * the kernels skip staging the lo half and its products (adding exact
 * zeros, so the same bits). */
struct fl_grad {
    const float *Dd;
    const uint16_t *doh, *dol;
    const uint8_t *lo_rows;
};

/* Whether any of rows [r0, r0 + R) (R <= 32) of head h has a lo half,
 * the same answer in every lane of the warp (a ballot). */
__device__ __forceinline__ bool fl_has_lo(fl_grad g, int b, int h, int r0, int R, int T, int Hq)
{
    int lane = threadIdx.x % 32;
    bool mine = lane < R && r0 + lane < T && g.lo_rows[((size_t)b * Hq + h) * T + r0 + lane];
    return __ballot_sync(0xffffffffu, mine) != 0;
}

/* dO's rows [r0, r0 + R) of head h in batch b, hi into sm[R][sld], lo
 * (when lo_too) into the R rows after it, as fl_stage stages Q. */
__device__ __forceinline__ void fl_stage_do(uint16_t *sm, int sld, fl_grad g, bool lo_too, int b,
                                            int h, int r0, int R, int T, int Hq, int D, int t,
                                            int nt)
{
    size_t base = (size_t)b * T * Hq * D + (size_t)h * D;
    fl_stage(sm, sld, g.doh, base, r0, R, T, D, Hq * D, t, nt);
    if (lo_too) fl_stage(sm + R * sld, sld, g.dol, base, r0, R, T, D, Hq * D, t, nt);
}

/* Whether query position i sees key j. */
__device__ __forceinline__ bool fl_sees(int i, int j, int window)
{
    return j <= i && (window <= 0 || i - j < window);
}

/* ---- forward ------------------------------------------------------------- */

/* One warp's shared memory in the forward: Q tile, scores, P, O, m, l. */
template <class C> struct fl_fwd_warp {
    static const int BYTES =
        16 * C::QLD * 2 + 16 * C::SLD * 4 + 2 * 16 * C::PLD * 2 + 16 * C::OLD * 4 + 128;
};

struct fl_args {
    float scale, cap;
    int window;
};

/* One tile's online-softmax step, two lanes a row: lanes r and r + 16
 * each take half the tile's keys and half of O's columns of row r, and
 * combine the row's max and sum by one shuffle each. The row's masked,
 * capped scores S[r][.] of keys j0.. become P (in E), the running max /
 * sum move, O's row is rescaled where its max moved (after the first
 * tiles, rarely). i < 0: a row past Tq. All 32 lanes call. */
template <class C>
__device__ __forceinline__ void fl_fwd_row(const float *S, uint16_t *P, float *O, float *m,
                                           float *l, int lane, int i, int j0, fl_args a)
{
    const int SLD = C::SLD, PLD = C::PLD, H = C::BC / 2, DH = C::D / 2;
    int r = lane % 16, t0 = lane / 16 * H, d0 = lane / 16 * DH;
    const float *Sr = S + r * SLD;
    uint16_t *Ph = P + r * PLD, *Pl = P + 16 * PLD + r * PLD;
    float dt, tmax = -INFINITY, mold = m[r];
    for (int t = t0; t < t0 + H; t++)
        if (i >= 0 && fl_sees(i, j0 + t, a.window))
            tmax = fmaxf(tmax, att_score(Sr[t], a.scale, a.cap, &dt));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 16));
    bool none = tmax == -INFINITY; /* nothing visible in this tile: P = 0 */
    float mnew = fmaxf(mold, tmax), corr = none ? 1.0f : expf(mold - mnew), sum = 0.0f;
    for (int t = t0; t < t0 + H; t++) {
        float p = !none && fl_sees(i, j0 + t, a.window)
                      ? expf(att_score(Sr[t], a.scale, a.cap, &dt) - mnew)
                      : 0.0f;
        sum += p;
        fl_split<typename C::elem>(p, Ph + t, Pl + t);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 16);
    if (corr != 1.0f)
        for (int d = d0; d < d0 + DH; d++)
            O[r * C::OLD + d] *= corr;
    __syncwarp(); /* both lanes of the row have read m[r] */
    if (lane < 16 && !none) {
        l[r] = l[r] * corr + sum;
        m[r] = mnew;
    }
}

template <class C>
__device__ __forceinline__ void fl_fwd_run(void *out, float *lse, const void *q, const void *k,
                                           const void *v, int Tq, int Tk, int Hq, int Hkv, int ldq,
                                           int ldkv, fl_args a)
{
    typedef typename C::elem E;
    const int D = C::D, BC = C::BC, BR = 16 * C::NW;
    const int QLD = C::QLD, OLD = C::OLD, SLD = C::SLD, PLD = C::PLD;
    KN_DYN_SHARED(unsigned char, sm);
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint16_t *Ks = (uint16_t *)sm, *Vs = Ks + BC * QLD;
    unsigned char *mine = sm + 2 * BC * QLD * 2 + w * fl_fwd_warp<C>::BYTES;
    uint16_t *Qs = (uint16_t *)mine;
    float *S = (float *)(Qs + 16 * QLD);
    uint16_t *P = (uint16_t *)(S + 16 * SLD);
    float *O = (float *)(P + 2 * 16 * PLD), *m = O + 16 * OLD, *l = m + 16;
    int b = blockIdx.z, h = blockIdx.y, hk = h / (Hq / Hkv), q0 = Tk - Tq;
    int r0 = blockIdx.x * BR + w * 16, i0 = q0 + blockIdx.x * BR, wi0 = q0 + r0;
    size_t kvb = (size_t)b * Tk * ldkv + (size_t)hk * D;
    fl_stage(Qs, QLD, q, (size_t)b * Tq * ldq + (size_t)h * D, r0, 16, Tq, D, ldq, lane, 32);
    for (int e = lane; e < 16 * OLD; e += 32)
        O[e] = 0.0f;
    if (lane < 16) m[lane] = -INFINITY, l[lane] = 0.0f;
    __syncwarp();
    int last = min(Tk - 1, i0 + BR - 1), wlast = min(Tk - 1, wi0 + 15);
    for (int j0 = att_lo(i0, a.window) / BC * BC; j0 <= last; j0 += BC) {
        __syncthreads(); /* the previous tile is consumed */
        fl_stage(Ks, QLD, k, kvb, j0, BC, Tk, D, ldkv, threadIdx.x, blockDim.x);
        fl_stage(Vs, QLD, v, kvb, j0, BC, Tk, D, ldkv, threadIdx.x, blockDim.x);
        __syncthreads();
        if (r0 >= Tq || j0 > wlast || j0 + BC <= att_lo(wi0, a.window))
            continue; /* the warp's rows see none of this tile */
        fl_acc sc[BC / 16];
        fl_zero<BC>(sc);
        fl_mma<E, true, BC, D>(sc, (const E *)Qs, QLD, (const E *)Ks, QLD);
        fl_store<BC>(S, SLD, sc);
        __syncwarp();
        fl_fwd_row<C>(S, P, O, m, l, lane, r0 + lane % 16 < Tq ? wi0 + lane % 16 : -1, j0, a);
        __syncwarp();
        fl_ab_acc<E, D, BC>(O, OLD, (const E *)P, PLD, (const E *)Vs, QLD);
        fl_ab_acc<E, D, BC>(O, OLD, (const E *)P + 16 * PLD, PLD, (const E *)Vs, QLD);
        __syncwarp();
    }
    size_t ob = ((size_t)b * Tq + r0) * Hq * D + (size_t)h * D;
    for (int e = lane; e < 16 * D; e += 32) {
        int r = e / D, d = e % D;
        if (r0 + r < Tq)
            store_from_f32(out, fl_type<E>::dt, ob + (size_t)r * Hq * D + d, O[r * OLD + d] / l[r]);
    }
    if (lane < 16 && r0 + lane < Tq)
        lse[((size_t)b * Hq + h) * Tq + r0 + lane] = m[lane] + logf(l[lane]);
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

/* ---- backward: the row dots ------------------------------------------------ */

/* Dd[b, h, i] = rowsum(dO_i * O_i) over the head's D, laid out as lse,
 * dO split into doh + dol and the rows whose dol is not all zeros
 * (fl_grad): computed once for both backward kernels (dk/dv would
 * otherwise redo it for every key block). A warp per
 * (row, head), lanes along d, the lanes' sums added by kn_warp_sum's
 * fixed tree. out is of the input type xt, dout fp32; all [B, T, Hq, D]. */
__global__ void k_fl_rowdot(float *Dd, uint8_t *lo_rows, uint16_t *doh, uint16_t *dol,
                            const float *dout, const void *out, int xt, int B, int T, int Hq,
                            int D)
{
    int lane = threadIdx.x % 32, wpb = blockDim.x / 32;
    size_t rows = (size_t)B * T * Hq;
    for (size_t row = (size_t)blockIdx.x * wpb + threadIdx.x / 32; row < rows;
         row += (size_t)gridDim.x * wpb) {
        size_t o = row * D; /* [B, T, Hq] rows of D */
        float s = 0.0f;
        bool lo = false;
        for (int d = lane; d < D; d += 32) {
            float g = dout[o + d];
            s += g * load_as_f32(out, xt, o + d);
            uint16_t h16, l16;
            fl_split_as(xt, g, &h16, &l16);
            doh[o + d] = h16;
            dol[o + d] = l16;
            lo |= l16 != 0;
        }
        s = kn_warp_sum(s);
        lo = __ballot_sync(0xffffffffu, lo) != 0;
        if (lane == 0) {
            int h = (int)(row % Hq);
            size_t bt = row / Hq, b = bt / T, i = bt % T;
            Dd[((size_t)b * Hq + h) * T + i] = s;
            lo_rows[((size_t)b * Hq + h) * T + i] = lo;
        }
    }
}

/* ---- backward: dq -------------------------------------------------------- */

/* One warp's shared memory in dq: Q, dO (hi, lo), S, dP, dS (hi, lo), dQ,
 * L, D. */
template <class C> struct fl_dq_warp {
    static const int BYTES = 3 * 16 * C::QLD * 2 + 2 * 16 * C::SLD * 4 + 2 * 16 * C::PLD * 2 +
                             16 * C::OLD * 4 + 128;
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

template <class C>
__device__ __forceinline__ void fl_dq_run(float *dq, fl_grad g, const float *lse, const void *q,
                                          const void *k, const void *v, int T, int Hq, int Hkv,
                                          int ldq, int ldkv, fl_args a)
{
    typedef typename C::elem E;
    const int D = C::D, BC = C::BC, BR = 16 * C::NW;
    const int QLD = C::QLD, OLD = C::OLD, SLD = C::SLD, PLD = C::PLD;
    KN_DYN_SHARED(unsigned char, sm);
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint16_t *Ks = (uint16_t *)sm, *Vs = Ks + BC * QLD;
    uint16_t *Qs = (uint16_t *)(sm + 2 * BC * QLD * 2 + w * fl_dq_warp<C>::BYTES),
             *dOs = Qs + 16 * QLD;
    float *S = (float *)(dOs + 2 * 16 * QLD), *dP = S + 16 * SLD;
    uint16_t *dS = (uint16_t *)(dP + 16 * SLD);
    float *dQ = (float *)(dS + 2 * 16 * PLD), *Ls = dQ + 16 * OLD, *Dd = Ls + 16;
    int b = blockIdx.z, h = blockIdx.y, hk = h / (Hq / Hkv);
    int r0 = blockIdx.x * BR + w * 16, i0 = blockIdx.x * BR;
    size_t kvb = (size_t)b * T * ldkv + (size_t)hk * D;
    fl_stage(Qs, QLD, q, (size_t)b * T * ldq + (size_t)h * D, r0, 16, T, D, ldq, lane, 32);
    bool lo = fl_has_lo(g, b, h, r0, 16, T, Hq);
    fl_stage_do(dOs, QLD, g, lo, b, h, r0, 16, T, Hq, D, lane, 32);
    fl_acc acc[D / 16];
    fl_zero<D>(acc);
    if (lane < 16) {
        size_t lb = ((size_t)b * Hq + h) * T + r0 + lane;
        bool live = r0 + lane < T;
        Ls[lane] = live ? lse[lb] : 0.0f;
        Dd[lane] = live ? g.Dd[lb] : 0.0f;
    }
    __syncwarp();
    int last = min(T - 1, i0 + BR - 1), wlast = min(T - 1, r0 + 15);
    for (int j0 = att_lo(i0, a.window) / BC * BC; j0 <= last; j0 += BC) {
        __syncthreads();
        fl_stage(Ks, QLD, k, kvb, j0, BC, T, D, ldkv, threadIdx.x, blockDim.x);
        fl_stage(Vs, QLD, v, kvb, j0, BC, T, D, ldkv, threadIdx.x, blockDim.x);
        __syncthreads();
        if (r0 >= T || j0 > wlast || j0 + BC <= att_lo(r0, a.window)) continue;
        fl_scores<E, BC, D>(S, dP, SLD, (const E *)Qs, (const E *)Ks, (const E *)dOs,
                            (const E *)Vs, (const E *)dOs + 16 * QLD, (const E *)Vs, lo, QLD);
        __syncwarp();
        for (int e = lane; e < 16 * BC; e += 32) {
            int r = e / BC, t = e % BC, i = r0 + r;
            fl_ds<C>(S[r * SLD + t], dP[r * SLD + t], Ls[r], Dd[r],
                     i < T && fl_sees(i, j0 + t, a.window), a, dS + r * PLD + t, 16 * PLD);
        }
        __syncwarp();
        fl_mma<E, false, D, BC>(acc, (const E *)dS, PLD, (const E *)Ks, QLD);
        fl_mma<E, false, D, BC>(acc, (const E *)dS + 16 * PLD, PLD, (const E *)Ks, QLD);
        __syncwarp(); /* dS is rewritten by the next tile */
    }
    fl_store<D>(dQ, OLD, acc);
    __syncwarp();
    for (int e = lane; e < 16 * D; e += 32)
        if (r0 + e / D < T)
            dq[((size_t)b * T + r0 + e / D) * ldq + (size_t)h * D + e % D] +=
                dQ[(e / D) * OLD + e % D];
}

/* bf16 fragments exist from sm_80: the body compiles empty before. */
template <class C>
__global__ void __launch_bounds__(C::NW * 32, 1)
    k_fl_bwd_dq(float *dq, fl_grad g, const float *lse, const void *q, const void *k, const void *v,
                int T, int Hq, int Hkv, int ldq, int ldkv, fl_args a)
{
    if constexpr (fl_type<typename C::elem>::dt == KN_F16 || FL_BF16_OK)
        fl_dq_run<C>(dq, g, lse, q, k, v, T, Hq, Hkv, ldq, ldkv, a);
}

/* ---- backward: dk, dv ---------------------------------------------------- */

/* The block's query tile: Q, dO (hi, lo), L, D; one warp's: K, V, S^T,
 * dP^T, P^T and dS^T (each hi, lo), dK, dV. */
template <class C> struct fl_kv_block {
    static const int BYTES = 3 * C::BC * C::QLD * 2 + 2 * C::BC * 4;
};
template <class C> struct fl_kv_warp {
    static const int BYTES =
        2 * 16 * C::QLD * 2 + 2 * 16 * C::SLD * 4 + 4 * 16 * C::PLD * 2 + 2 * 16 * C::OLD * 4;
};

/* Stages query tile [i0, i0 + BC) of head h: Q, dO split (its lo half
 * when lo_too), L and D. */
template <class C>
__device__ __forceinline__ void fl_kv_stage(unsigned char *sm, fl_grad g, bool lo_too,
                                            const float *lse, const void *q, int b, int h, int i0,
                                            int T, int Hq, int ldq)
{
    const int D = C::D, BC = C::BC, QLD = C::QLD;
    uint16_t *Qs = (uint16_t *)sm, *dOs = Qs + BC * QLD;
    float *Ls = (float *)(dOs + 2 * BC * QLD), *Dd = Ls + BC;
    fl_stage(Qs, QLD, q, (size_t)b * T * ldq + (size_t)h * D, i0, BC, T, D, ldq, threadIdx.x,
             blockDim.x);
    fl_stage_do(dOs, QLD, g, lo_too, b, h, i0, BC, T, Hq, D, threadIdx.x, blockDim.x);
    for (int r = threadIdx.x; r < BC; r += blockDim.x) {
        size_t lb = ((size_t)b * Hq + h) * T + i0 + r;
        bool live = i0 + r < T;
        Ls[r] = live ? lse[lb] : 0.0f;
        Dd[r] = live ? g.Dd[lb] : 0.0f;
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

/* dV += P^T dO and dK += dS^T Q, each factor split (hi, lo): the lo x lo
 * product is below the fp32 accumulation's own rounding and left out; dO's
 * lo only when lo. Acc: shared-memory accumulators (float *, head dim
 * 256) or registers (fl_acc[D / 16]). */
template <class C, typename Acc>
__device__ __forceinline__ void fl_kv_acc(Acc &dK, Acc &dV, const uint16_t *Pt,
                                          const uint16_t *dSt, const uint16_t *Qs,
                                          const uint16_t *dOs, bool lo)
{
    typedef typename C::elem E;
    const int D = C::D, BC = C::BC, QLD = C::QLD, OLD = C::OLD, PLD = C::PLD;
    const E *P = (const E *)Pt, *dS = (const E *)dSt, *Q = (const E *)Qs, *dO = (const E *)dOs;
    fl_ab_acc<E, D, BC>(dV, OLD, P, PLD, dO, QLD);
    if (lo) fl_ab_acc<E, D, BC>(dV, OLD, P, PLD, dO + BC * QLD, QLD);
    fl_ab_acc<E, D, BC>(dV, OLD, P + 16 * PLD, PLD, dO, QLD);
    fl_ab_acc<E, D, BC>(dK, OLD, dS, PLD, Q, QLD);
    fl_ab_acc<E, D, BC>(dK, OLD, dS + 16 * PLD, PLD, Q, QLD);
}

template <class C>
__device__ __forceinline__ void fl_dkdv_run(float *dk, float *dv, fl_grad g, const float *lse,
                                            const void *q, const void *k, const void *v, int T,
                                            int Hq, int Hkv, int ldq, int ldkv, fl_args a)
{
    typedef typename C::elem E;
    const int D = C::D, BC = C::BC, BR = 16 * C::NW;
    const int QLD = C::QLD, OLD = C::OLD, SLD = C::SLD, PLD = C::PLD;
    KN_DYN_SHARED(unsigned char, sm);
    int w = threadIdx.x / 32, lane = threadIdx.x % 32, group = Hq / Hkv;
    const uint16_t *Qs = (const uint16_t *)sm, *dOs = Qs + BC * QLD;
    const float *Ls = (const float *)(dOs + 2 * BC * QLD), *Dd = Ls + BC;
    uint16_t *Kw = (uint16_t *)(sm + fl_kv_block<C>::BYTES + w * fl_kv_warp<C>::BYTES),
             *Vw = Kw + 16 * QLD;
    float *St = (float *)(Vw + 16 * QLD), *dPt = St + 16 * SLD;
    uint16_t *Pt = (uint16_t *)(dPt + 16 * SLD), *dSt = Pt + 2 * 16 * PLD;
    float *dK = (float *)(dSt + 2 * 16 * PLD), *dV = dK + 16 * OLD;
    int b = blockIdx.z, hk = blockIdx.y, jb = blockIdx.x * BR, j0 = jb + w * 16;
    size_t kvb = (size_t)b * T * ldkv + (size_t)hk * D;
    fl_stage(Kw, QLD, k, kvb, j0, 16, T, D, ldkv, lane, 32);
    fl_stage(Vw, QLD, v, kvb, j0, 16, T, D, ldkv, lane, 32);
    /* register accumulators; unused (and dropped by the compiler) at 256 */
    fl_acc aK[C::KV_REG ? D / 16 : 1], aV[C::KV_REG ? D / 16 : 1];
    if constexpr (C::KV_REG) {
        fl_zero<D>(aK);
        fl_zero<D>(aV);
    } else
        for (int e = lane; e < 16 * OLD; e += 32)
            dK[e] = dV[e] = 0.0f;
    __syncwarp();
    /* Query rows past the block's last key's window see none of it. */
    int iend = a.window > 0 ? min(T, jb + BR - 1 + a.window) : T;
    int wend = a.window > 0 ? min(T, j0 + 15 + a.window) : T;
    for (int h = hk * group; h < (hk + 1) * group; h++)
        for (int i0 = jb / BC * BC; i0 < iend; i0 += BC) {
            __syncthreads();
            bool lo = fl_has_lo(g, b, h, i0, BC, T, Hq); /* the same in every warp */
            fl_kv_stage<C>(sm, g, lo, lse, q, b, h, i0, T, Hq, ldq);
            __syncthreads();
            if (j0 >= T || i0 + BC <= j0 || i0 >= wend) continue;
            fl_scores<E, BC, D>(St, dPt, SLD, (const E *)Kw, (const E *)Qs, (const E *)Vw,
                                (const E *)dOs, (const E *)Vw, (const E *)dOs + BC * QLD, lo, QLD);
            __syncwarp();
            fl_kv_probs<C>(Pt, dSt, St, dPt, Ls, Dd, j0, i0, T, a);
            __syncwarp();
            if constexpr (C::KV_REG)
                fl_kv_acc<C>(aK, aV, Pt, dSt, Qs, dOs, lo);
            else
                fl_kv_acc<C>(dK, dV, Pt, dSt, Qs, dOs, lo);
            __syncwarp(); /* P^T, dS^T are rewritten by the next tile */
        }
    if constexpr (C::KV_REG) {
        fl_store<D>(dK, OLD, aK);
        fl_store<D>(dV, OLD, aV);
    }
    __syncwarp();
    for (int e = lane; e < 16 * D; e += 32) {
        int r = e / D, d = e % D;
        size_t g = kvb + (size_t)(j0 + r) * ldkv + d;
        if (j0 + r >= T) continue;
        if (dk) dk[g] += dK[r * OLD + d];
        if (dv) dv[g] += dV[r * OLD + d];
    }
}

/* bf16 fragments exist from sm_80: the body compiles empty before. */
template <class C>
__global__ void __launch_bounds__(C::NW * 32, 1)
    k_fl_bwd_dkdv(float *dk, float *dv, fl_grad g, const float *lse, const void *q, const void *k,
                  const void *v, int T, int Hq, int Hkv, int ldq, int ldkv, fl_args a)
{
    if constexpr (fl_type<typename C::elem>::dt == KN_F16 || FL_BF16_OK)
        fl_dkdv_run<C>(dk, dv, g, lse, q, k, v, T, Hq, Hkv, ldq, ldkv, a);
}

/* ---- shared memory and warps per block ----------------------------------- */

enum { FL_FWD, FL_DQ, FL_DKDV };

template <int K, class C> constexpr size_t fl_smem()
{
    return K == FL_FWD  ? (size_t)4 * C::BC * C::QLD + (size_t)C::NW * fl_fwd_warp<C>::BYTES
           : K == FL_DQ ? (size_t)4 * C::BC * C::QLD + (size_t)C::NW * fl_dq_warp<C>::BYTES
                        : (size_t)fl_kv_block<C>::BYTES + (size_t)C::NW * fl_kv_warp<C>::BYTES;
}

/* Shared memory a block may have: 48 KiB on any device; 160 KiB with the
 * opt-in of A100 (163 KiB) and H100 / H200 (227 KiB). More warps a block
 * share each staged tile (K / V in the forward and dq, Q / dO in dk/dv),
 * so every kernel takes the opt-in where it is granted: at head dim 64
 * dk/dv has 4 warps a block there, one in 48 KiB, and stages its query
 * tiles a quarter as often per key. Where the opt-in is refused (sm_86 /
 * sm_89 stop at 99 KiB) the 48 KiB configuration runs. */
#define FL_SMEM_BASE (48 * 1024)
#define FL_SMEM_OPTIN (160 * 1024)

/* The most warps per block (4, 2, 1) whose shared memory fits in LIMIT. */
template <int K, int DM, typename E, int LIMIT> constexpr int fl_nw()
{
    return fl_smem<K, fl_cfg<DM, E, 4>>() <= LIMIT ? 4
           : fl_smem<K, fl_cfg<DM, E, 2>>() <= LIMIT ? 2
                                                     : 1;
}

} // namespace KN_NS

#endif
