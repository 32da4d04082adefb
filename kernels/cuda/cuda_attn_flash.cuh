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
 *    Per tile S = Q K^T goes to shared memory, lanes 0..15 each own a row:
 *    mask, soft-cap, online softmax (running max m and sum l), P, the row
 *    of the fp32 output tile O rescaled; then O += P V on the tensor cores
 *    (O loaded into the accumulators from shared memory and stored back).
 *    The end writes out = O / l and lse.
 *  - Backward, deterministic without atomics, two kernels as the scalar
 *    path: dq (a warp per 16 query rows walks the key tiles: S = Q K^T,
 *    dP = dO V^T, dS per row, dQ += dS K) and dk/dv (a warp per 16 key rows
 *    of a kv head walks the query heads of its group and their query
 *    tiles: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q).
 * q, k, v are exact in the input type; P, dS and the fp32 dO are not, so
 * each enters its products as hi + lo, both in the input type (fl_split,
 * two MMAs; lo x lo left out): one rounded P alone put bf16 results at 5x
 * the 16-bit tolerances of kernels.table at T = 70.
 * Elementwise work goes through shared memory, never through a fragment's
 * elements, whose per-lane layout is the hardware's: every tile a lane
 * reads back after a store is behind a __syncwarp. Warps per block: the
 * most (4, 2 or 1) whose shared memory fits in 48 KiB (fl_nw); dk/dv at
 * 128 and dq, dk/dv at 256 need 56 / 59 / 76 KiB, opted in on sm_80 and
 * later (cuda_attention.cu falls back to the scalar kernels before). No
 * per-thread arrays: ptxas reports no stack (kernels.cuda_attn_ptxas).
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
 * owning 16 rows); keys (or queries) per staged tile BC. */
template <int DM, typename E, int W> struct fl_cfg {
    typedef E elem;
    static const int D = DM, BC = DM > 128 ? 16 : 32, NW = W;
};

template <typename E> struct fl_type;
template <> struct fl_type<__half> {
    static const int dt = KN_F16;
};
template <> struct fl_type<__nv_bfloat16> {
    static const int dt = KN_BF16;
};

/* The input type's bits of an fp32 value (round to nearest even). */
template <typename E> __device__ __forceinline__ uint16_t fl_round(float f)
{
    return fl_type<E>::dt == KN_BF16 ? to_bf16(f) : to_f16(f);
}

/* x as hi + lo, both in the input type: hi = x rounded, lo = the rest
 * rounded, so hi + lo holds x to about twice the type's precision. */
template <typename E> __device__ __forceinline__ void fl_split(float x, uint16_t *hi, uint16_t *lo)
{
    uint16_t h = fl_round<E>(x);
    *hi = h;
    *lo = fl_round<E>(x - (fl_type<E>::dt == KN_BF16 ? from_bf16(h) : from_f16(h)));
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

/* C[16][N] (+)= A[16][K] B^T for B row-major [N][K] (scores: Q K^T, dO V^T). */
template <typename E, int N, int K>
__device__ __forceinline__ void fl_abt(float *C, const E *A, const E *B, bool acc = false)
{
    for (int n = 0; n < N; n += 16)
        fl_tile<E, true, K>(C + n, N, A, K, B + (size_t)n * K, K, acc);
}

/* C[16][N] += A[16][K] B for B row-major [K][N] (outputs: P V, dS K). */
template <typename E, int N, int K>
__device__ __forceinline__ void fl_ab_acc(float *C, const E *A, const E *B)
{
    for (int n = 0; n < N; n += 16)
        fl_tile<E, false, K>(C + n, N, A, K, B + n, N, true);
}

/* Rows [r0, r0 + R) of a [B,T,H,D] 16-bit tensor (its head's first element
 * at `base`, row stride ld) into sm[R][D], rows past T as zeros; threads
 * [t0, t0 + nt) share the copy. */
__device__ __forceinline__ void fl_stage(uint16_t *sm, const void *src, size_t base, int r0, int R,
                                         int T, int D, int ld, int t, int nt)
{
    const uint16_t *s = (const uint16_t *)src;
    for (int e = t; e < R * D; e += nt) {
        int r = e / D, d = e % D;
        sm[e] = r0 + r < T ? s[base + (size_t)(r0 + r) * ld + d] : (uint16_t)0;
    }
}

/* The same from an fp32 tensor, split: hi in sm[R][D], lo in sm[R*D..]. */
template <typename E>
__device__ __forceinline__ void fl_stage32(uint16_t *sm, const float *src, size_t base, int r0,
                                           int R, int T, int D, int ld, int t, int nt)
{
    for (int e = t; e < R * D; e += nt) {
        int r = e / D, d = e % D;
        fl_split<E>(r0 + r < T ? src[base + (size_t)(r0 + r) * ld + d] : 0.0f, sm + e,
                    sm + R * D + e);
    }
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
        16 * C::D * 2 + 16 * C::BC * 4 + 2 * 16 * C::BC * 2 + 16 * C::D * 4 + 128;
};

struct fl_args {
    float scale, cap;
    int window;
};

/* One tile's online-softmax step for row r of a warp (lane r < 16): the
 * row's masked, capped scores S[r][.] of keys j0.. become P (in E), the
 * running max / sum move, O's row is rescaled. i < 0: a row past Tq. */
template <class C>
__device__ __forceinline__ void fl_fwd_row(const float *S, uint16_t *P, float *O, float *m,
                                           float *l, int r, int i, int j0, fl_args a)
{
    const int BC = C::BC;
    float dt, tmax = -INFINITY;
    for (int t = 0; t < BC; t++)
        if (i >= 0 && fl_sees(i, j0 + t, a.window))
            tmax = fmaxf(tmax, att_score(S[r * BC + t], a.scale, a.cap, &dt));
    if (tmax == -INFINITY) { /* nothing visible in this tile */
        for (int t = 0; t < BC; t++)
            P[r * BC + t] = P[16 * BC + r * BC + t] = 0;
        return;
    }
    float mnew = fmaxf(m[r], tmax), corr = expf(m[r] - mnew), sum = 0.0f;
    for (int t = 0; t < BC; t++) {
        float p = fl_sees(i, j0 + t, a.window)
                      ? expf(att_score(S[r * BC + t], a.scale, a.cap, &dt) - mnew)
                      : 0.0f;
        sum += p;
        fl_split<typename C::elem>(p, P + r * BC + t, P + 16 * BC + r * BC + t);
    }
    for (int d = 0; d < C::D; d++)
        O[r * C::D + d] *= corr;
    l[r] = l[r] * corr + sum;
    m[r] = mnew;
}

template <class C>
__device__ __forceinline__ void fl_fwd_run(void *out, float *lse, const void *q, const void *k,
                                           const void *v, int Tq, int Tk, int Hq, int Hkv, int ldq,
                                           int ldkv, fl_args a)
{
    typedef typename C::elem E;
    const int D = C::D, BC = C::BC, BR = 16 * C::NW;
    KN_DYN_SHARED(unsigned char, sm);
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint16_t *Ks = (uint16_t *)sm, *Vs = Ks + BC * D;
    unsigned char *mine = sm + 2 * BC * D * 2 + w * fl_fwd_warp<C>::BYTES;
    uint16_t *Qs = (uint16_t *)mine;
    float *S = (float *)(Qs + 16 * D);
    uint16_t *P = (uint16_t *)(S + 16 * BC);
    float *O = (float *)(P + 2 * 16 * BC), *m = O + 16 * D, *l = m + 16;
    int b = blockIdx.z, h = blockIdx.y, hk = h / (Hq / Hkv), q0 = Tk - Tq;
    int r0 = blockIdx.x * BR + w * 16, i0 = q0 + blockIdx.x * BR, wi0 = q0 + r0;
    size_t kvb = (size_t)b * Tk * ldkv + (size_t)hk * D;
    fl_stage(Qs, q, (size_t)b * Tq * ldq + (size_t)h * D, r0, 16, Tq, D, ldq, lane, 32);
    for (int e = lane; e < 16 * D; e += 32)
        O[e] = 0.0f;
    if (lane < 16) m[lane] = -INFINITY, l[lane] = 0.0f;
    __syncwarp();
    int last = min(Tk - 1, i0 + BR - 1), wlast = min(Tk - 1, wi0 + 15);
    for (int j0 = att_lo(i0, a.window) / BC * BC; j0 <= last; j0 += BC) {
        __syncthreads(); /* the previous tile is consumed */
        fl_stage(Ks, k, kvb, j0, BC, Tk, D, ldkv, threadIdx.x, blockDim.x);
        fl_stage(Vs, v, kvb, j0, BC, Tk, D, ldkv, threadIdx.x, blockDim.x);
        __syncthreads();
        if (r0 >= Tq || j0 > wlast || j0 + BC <= att_lo(wi0, a.window))
            continue; /* the warp's rows see none of this tile */
        fl_abt<E, BC, D>(S, (const E *)Qs, (const E *)Ks);
        __syncwarp();
        if (lane < 16) fl_fwd_row<C>(S, P, O, m, l, lane, r0 + lane < Tq ? wi0 + lane : -1, j0, a);
        __syncwarp();
        fl_ab_acc<E, D, BC>(O, (const E *)P, (const E *)Vs);
        fl_ab_acc<E, D, BC>(O, (const E *)P + 16 * BC, (const E *)Vs);
        __syncwarp();
    }
    size_t ob = ((size_t)b * Tq + r0) * Hq * D + (size_t)h * D;
    for (int e = lane; e < 16 * D; e += 32) {
        int r = e / D, d = e % D;
        if (r0 + r < Tq)
            store_from_f32(out, fl_type<E>::dt, ob + (size_t)r * Hq * D + d, O[e] / l[r]);
    }
    if (lane < 16 && r0 + lane < Tq)
        lse[((size_t)b * Hq + h) * Tq + r0 + lane] = m[lane] + logf(l[lane]);
}

/* bf16 fragments exist from sm_80: the body compiles empty before. */
template <class C>
__global__ void __launch_bounds__(C::NW * 32)
    k_fl_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int Tq, int Tk,
             int Hq, int Hkv, int ldq, int ldkv, fl_args a)
{
    if constexpr (fl_type<typename C::elem>::dt == KN_F16 || FL_BF16_OK)
        fl_fwd_run<C>(out, lse, q, k, v, Tq, Tk, Hq, Hkv, ldq, ldkv, a);
}

/* ---- backward: dq -------------------------------------------------------- */

/* One warp's shared memory in dq: Q, dO (hi, lo), S, dP, dS (hi, lo), dQ,
 * L, D. */
template <class C> struct fl_dq_warp {
    static const int BYTES =
        3 * 16 * C::D * 2 + 2 * 16 * C::BC * 4 + 2 * 16 * C::BC * 2 + 16 * C::D * 4 + 128;
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

/* D_i = rowsum(dO_i * O_i) and L_i for the warp's rows (lanes 0..15). */
__device__ __forceinline__ void fl_row_stats(float *Ls, float *Dd, const float *dout,
                                             const void *out, const float *lse, int xt, size_t ob,
                                             size_t lb, int r, bool live, int D)
{
    float di = 0.0f;
    for (int d = 0; live && d < D; d++)
        di += dout[ob + d] * load_as_f32(out, xt, ob + d);
    Dd[r] = di;
    Ls[r] = live ? lse[lb] : 0.0f;
}

template <class C>
__device__ __forceinline__ void
fl_dq_run(float *dq, const float *dout, const void *out, const float *lse, const void *q,
          const void *k, const void *v, int T, int Hq, int Hkv, int ldq, int ldkv, fl_args a)
{
    typedef typename C::elem E;
    const int D = C::D, BC = C::BC, BR = 16 * C::NW;
    KN_DYN_SHARED(unsigned char, sm);
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint16_t *Ks = (uint16_t *)sm, *Vs = Ks + BC * D;
    uint16_t *Qs = (uint16_t *)(sm + 2 * BC * D * 2 + w * fl_dq_warp<C>::BYTES), *dOs = Qs + 16 * D;
    float *S = (float *)(dOs + 2 * 16 * D), *dP = S + 16 * BC;
    uint16_t *dS = (uint16_t *)(dP + 16 * BC);
    float *dQ = (float *)(dS + 2 * 16 * BC), *Ls = dQ + 16 * D, *Dd = Ls + 16;
    int b = blockIdx.z, h = blockIdx.y, hk = h / (Hq / Hkv);
    int r0 = blockIdx.x * BR + w * 16, i0 = blockIdx.x * BR;
    size_t kvb = (size_t)b * T * ldkv + (size_t)hk * D, ob = (size_t)b * T * Hq * D + (size_t)h * D;
    fl_stage(Qs, q, (size_t)b * T * ldq + (size_t)h * D, r0, 16, T, D, ldq, lane, 32);
    fl_stage32<E>(dOs, dout, ob, r0, 16, T, D, Hq * D, lane, 32);
    for (int e = lane; e < 16 * D; e += 32)
        dQ[e] = 0.0f;
    if (lane < 16)
        fl_row_stats(Ls, Dd, dout, out, lse, fl_type<E>::dt, ob + (size_t)(r0 + lane) * Hq * D,
                     ((size_t)b * Hq + h) * T + r0 + lane, lane, r0 + lane < T, D);
    __syncwarp();
    int last = min(T - 1, i0 + BR - 1), wlast = min(T - 1, r0 + 15);
    for (int j0 = att_lo(i0, a.window) / BC * BC; j0 <= last; j0 += BC) {
        __syncthreads();
        fl_stage(Ks, k, kvb, j0, BC, T, D, ldkv, threadIdx.x, blockDim.x);
        fl_stage(Vs, v, kvb, j0, BC, T, D, ldkv, threadIdx.x, blockDim.x);
        __syncthreads();
        if (r0 >= T || j0 > wlast || j0 + BC <= att_lo(r0, a.window)) continue;
        fl_abt<E, BC, D>(S, (const E *)Qs, (const E *)Ks);
        fl_abt<E, BC, D>(dP, (const E *)dOs, (const E *)Vs);
        fl_abt<E, BC, D>(dP, (const E *)dOs + 16 * D, (const E *)Vs, true);
        __syncwarp();
        for (int e = lane; e < 16 * BC; e += 32) {
            int r = e / BC, i = r0 + r;
            fl_ds<C>(S[e], dP[e], Ls[r], Dd[r], i < T && fl_sees(i, j0 + e % BC, a.window), a,
                     dS + e, 16 * BC);
        }
        __syncwarp();
        fl_ab_acc<E, D, BC>(dQ, (const E *)dS, (const E *)Ks);
        fl_ab_acc<E, D, BC>(dQ, (const E *)dS + 16 * BC, (const E *)Ks);
        __syncwarp();
    }
    for (int e = lane; e < 16 * D; e += 32)
        if (r0 + e / D < T) dq[((size_t)b * T + r0 + e / D) * ldq + (size_t)h * D + e % D] += dQ[e];
}

/* bf16 fragments exist from sm_80: the body compiles empty before. */
template <class C>
__global__ void __launch_bounds__(C::NW * 32)
    k_fl_bwd_dq(float *dq, const float *dout, const void *out, const float *lse, const void *q,
                const void *k, const void *v, int T, int Hq, int Hkv, int ldq, int ldkv, fl_args a)
{
    if constexpr (fl_type<typename C::elem>::dt == KN_F16 || FL_BF16_OK)
        fl_dq_run<C>(dq, dout, out, lse, q, k, v, T, Hq, Hkv, ldq, ldkv, a);
}

/* ---- backward: dk, dv ---------------------------------------------------- */

/* The block's query tile: Q, dO (hi, lo), L, D; one warp's: K, V, S^T,
 * dP^T, P^T and dS^T (each hi, lo), dK, dV. */
template <class C> struct fl_kv_block {
    static const int BYTES = 3 * C::BC * C::D * 2 + 2 * C::BC * 4;
};
template <class C> struct fl_kv_warp {
    static const int BYTES =
        2 * 16 * C::D * 2 + 2 * 16 * C::BC * 4 + 4 * 16 * C::BC * 2 + 2 * 16 * C::D * 4;
};

/* Stages query tile [i0, i0 + BC) of head h: Q, dO split, L and D. */
template <class C>
__device__ __forceinline__ void fl_kv_stage(unsigned char *sm, const float *dout, const void *out,
                                            const float *lse, const void *q, int b, int h, int i0,
                                            int T, int Hq, int ldq)
{
    typedef typename C::elem E;
    const int D = C::D, BC = C::BC;
    uint16_t *Qs = (uint16_t *)sm, *dOs = Qs + BC * D;
    float *Ls = (float *)(dOs + 2 * BC * D), *Dd = Ls + BC;
    size_t ob = (size_t)b * T * Hq * D + (size_t)h * D;
    fl_stage(Qs, q, (size_t)b * T * ldq + (size_t)h * D, i0, BC, T, D, ldq, threadIdx.x,
             blockDim.x);
    fl_stage32<E>(dOs, dout, ob, i0, BC, T, D, Hq * D, threadIdx.x, blockDim.x);
    for (int r = threadIdx.x; r < BC; r += blockDim.x)
        fl_row_stats(Ls, Dd, dout, out, lse, fl_type<E>::dt, ob + (size_t)(i0 + r) * Hq * D,
                     ((size_t)b * Hq + h) * T + i0 + r, r, i0 + r < T, D);
}

/* P^T and dS^T of the warp's 16 keys (from j0) against query tile i0. */
template <class C>
__device__ __forceinline__ void fl_kv_probs(uint16_t *Pt, uint16_t *dSt, const float *St,
                                            const float *dPt, const float *Ls, const float *Dd,
                                            int j0, int i0, int T, fl_args a)
{
    const int BC = C::BC;
    for (int e = threadIdx.x % 32; e < 16 * BC; e += 32) {
        int jr = e / BC, t = e % BC, i = i0 + t;
        float p = fl_ds<C>(St[e], dPt[e], Ls[t], Dd[t], i < T && fl_sees(i, j0 + jr, a.window), a,
                           dSt + e, 16 * BC);
        fl_split<typename C::elem>(p, Pt + e, Pt + 16 * BC + e);
    }
}

/* dV += P^T dO and dK += dS^T Q, each factor split (hi, lo): the lo x lo
 * product is below the fp32 accumulation's own rounding and left out. */
template <class C>
__device__ __forceinline__ void fl_kv_acc(float *dK, float *dV, const uint16_t *Pt,
                                          const uint16_t *dSt, const uint16_t *Qs,
                                          const uint16_t *dOs)
{
    typedef typename C::elem E;
    const int D = C::D, BC = C::BC;
    const E *P = (const E *)Pt, *dS = (const E *)dSt, *Q = (const E *)Qs, *dO = (const E *)dOs;
    fl_ab_acc<E, D, BC>(dV, P, dO);
    fl_ab_acc<E, D, BC>(dV, P, dO + BC * D);
    fl_ab_acc<E, D, BC>(dV, P + 16 * BC, dO);
    fl_ab_acc<E, D, BC>(dK, dS, Q);
    fl_ab_acc<E, D, BC>(dK, dS + 16 * BC, Q);
}

template <class C>
__device__ __forceinline__ void fl_dkdv_run(float *dk, float *dv, const float *dout,
                                            const void *out, const float *lse, const void *q,
                                            const void *k, const void *v, int T, int Hq, int Hkv,
                                            int ldq, int ldkv, fl_args a)
{
    typedef typename C::elem E;
    const int D = C::D, BC = C::BC, BR = 16 * C::NW;
    KN_DYN_SHARED(unsigned char, sm);
    int w = threadIdx.x / 32, lane = threadIdx.x % 32, group = Hq / Hkv;
    const uint16_t *Qs = (const uint16_t *)sm, *dOs = Qs + BC * D;
    const float *Ls = (const float *)(dOs + 2 * BC * D), *Dd = Ls + BC;
    uint16_t *Kw = (uint16_t *)(sm + fl_kv_block<C>::BYTES + w * fl_kv_warp<C>::BYTES),
             *Vw = Kw + 16 * D;
    float *St = (float *)(Vw + 16 * D), *dPt = St + 16 * BC;
    uint16_t *Pt = (uint16_t *)(dPt + 16 * BC), *dSt = Pt + 2 * 16 * BC;
    float *dK = (float *)(dSt + 2 * 16 * BC), *dV = dK + 16 * D;
    int b = blockIdx.z, hk = blockIdx.y, jb = blockIdx.x * BR, j0 = jb + w * 16;
    size_t kvb = (size_t)b * T * ldkv + (size_t)hk * D;
    fl_stage(Kw, k, kvb, j0, 16, T, D, ldkv, lane, 32);
    fl_stage(Vw, v, kvb, j0, 16, T, D, ldkv, lane, 32);
    for (int e = lane; e < 16 * D; e += 32)
        dK[e] = dV[e] = 0.0f;
    __syncwarp();
    /* Query rows past the block's last key's window see none of it. */
    int iend = a.window > 0 ? min(T, jb + BR - 1 + a.window) : T;
    int wend = a.window > 0 ? min(T, j0 + 15 + a.window) : T;
    for (int h = hk * group; h < (hk + 1) * group; h++)
        for (int i0 = jb / BC * BC; i0 < iend; i0 += BC) {
            __syncthreads();
            fl_kv_stage<C>(sm, dout, out, lse, q, b, h, i0, T, Hq, ldq);
            __syncthreads();
            if (j0 >= T || i0 + BC <= j0 || i0 >= wend) continue;
            fl_abt<E, BC, D>(St, (const E *)Kw, (const E *)Qs);
            fl_abt<E, BC, D>(dPt, (const E *)Vw, (const E *)dOs);
            fl_abt<E, BC, D>(dPt, (const E *)Vw, (const E *)dOs + BC * D, true);
            __syncwarp();
            fl_kv_probs<C>(Pt, dSt, St, dPt, Ls, Dd, j0, i0, T, a);
            __syncwarp();
            fl_kv_acc<C>(dK, dV, Pt, dSt, Qs, dOs);
            __syncwarp();
        }
    for (int e = lane; e < 16 * D; e += 32) {
        size_t g = kvb + (size_t)(j0 + e / D) * ldkv + e % D;
        if (j0 + e / D >= T) continue;
        if (dk) dk[g] += dK[e];
        if (dv) dv[g] += dV[e];
    }
}

/* bf16 fragments exist from sm_80: the body compiles empty before. */
template <class C>
__global__ void __launch_bounds__(C::NW * 32)
    k_fl_bwd_dkdv(float *dk, float *dv, const float *dout, const void *out, const float *lse,
                  const void *q, const void *k, const void *v, int T, int Hq, int Hkv, int ldq,
                  int ldkv, fl_args a)
{
    if constexpr (fl_type<typename C::elem>::dt == KN_F16 || FL_BF16_OK)
        fl_dkdv_run<C>(dk, dv, dout, out, lse, q, k, v, T, Hq, Hkv, ldq, ldkv, a);
}

/* ---- shared memory and warps per block ----------------------------------- */

enum { FL_FWD, FL_DQ, FL_DKDV };

template <int K, class C> constexpr size_t fl_smem()
{
    return K == FL_FWD  ? (size_t)4 * C::BC * C::D + (size_t)C::NW * fl_fwd_warp<C>::BYTES
           : K == FL_DQ ? (size_t)4 * C::BC * C::D + (size_t)C::NW * fl_dq_warp<C>::BYTES
                        : (size_t)fl_kv_block<C>::BYTES + (size_t)C::NW * fl_kv_warp<C>::BYTES;
}

/* The most warps per block (4, 2, 1) whose shared memory fits in 48 KiB. */
template <int K, int DM, typename E> constexpr int fl_nw()
{
    return fl_smem<K, fl_cfg<DM, E, 4>>() <= 48 * 1024   ? 4
           : fl_smem<K, fl_cfg<DM, E, 2>>() <= 48 * 1024 ? 2
                                                         : 1;
}

} // namespace KN_NS

#endif
