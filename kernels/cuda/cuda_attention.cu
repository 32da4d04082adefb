/* cuda_attention.cu — RoPE and causal attention with grouped-query heads.
 *
 * Attention follows FlashAttention-2's scheme: nothing of size T x T
 * exists, the forward keeps only out and lse = log sum_j exp(s_ij).
 *  - Forward: a block owns BR query rows of one (batch, query head),
 *    one thread per row owning its q row and output accumulator. Key and
 *    value tiles of BC rows up to the block's last causal column are
 *    staged in shared memory; each thread scores the tile, rescales its
 *    running (max, sum, accumulator) once per tile (online softmax), and
 *    at the end writes out = acc / l and lse = max + log l.
 *  - Backward, deterministic without atomics, in two kernels that each own
 *    their outputs: dq (a thread per query row walks the key tiles, as the
 *    forward) and dk/dv (a thread per key row of a kv head walks every
 *    query head of its group and the query tiles below the diagonal, Q
 *    and dO staged in shared memory). Both rebuild P = exp(S - lse) and use
 *    dS = P (dP - D_i) scale with D_i = rowsum(dO_i * O_i), which needs no
 *    whole row of P. The price next to FA2's single pass is computing
 *    the scores twice; the gain is no dq atomics and exact repeatability.
 * Gemma's options (kernels.h): a score soft-cap cap * tanh(s / cap), whose
 * derivative 1 - tanh^2 the backward applies to the recomputed score, and
 * a sliding window (row i sees keys (i - window, i]): tiles wholly left
 * of a block's windows are not visited, masked columns inside one are
 * skipped per thread. Both 0 = off.
 * bf16 / fp16 at head dims 64, 80, 96, 128 and 256 run the tensor-core
 * kernels of cuda_attn_flash.cuh (same scheme on 16x16 warp tiles); fp32,
 * and 16-bit at other head dims up to 256, run the scalar kernels here
 * (tiles sized by a head-dim bound of 64, 128 or 256; each thread's rows
 * as columns of shared memory, so no kernel has a stack frame: ptxas
 * checks this, tests/kernels/check_attn_ptxas.sh).
 * q, k, v, out and RoPE's rows are of the op's dtype: read with
 * load_as_f32 into the fp32 shared tiles, out stored with one
 * rounding (kn_cuda16.cuh); lse is fp32, the gradients fp32 or (g_dt)
 * the op's type, each rounded once as it is stored, and the backward's
 * dout fp32 or (dout_dt) the op's type. */
#include "cuda_attn.cuh"

namespace KN_NS {

/* ---- RoPE (Hugging Face rotate-half, fp32 angles as HF computes them) ---- */

/* The inverse frequencies 1 / base^(2i/D), computed on the host with the
 * CPU backend's expression, so both backends rotate by the same fp32
 * angles (the device's powf differs from the host's in the last bits,
 * which at position 100 moves an angle by about 1e-5). Passed by value. */
#define KN_ROPE_HALF_MAX 256
struct rope_inv {
    float v[KN_ROPE_HALF_MAX];
};

__global__ void k_rope(int xt, void *x, rope_inv inv, int T, int H, int D, int ld, int pos_offset,
                       float dir, size_t total)
{
    int half = D / 2;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % half);
        size_t rest = e / half;
        int h = (int)(rest % H);
        size_t bt = rest / H;
        float pos = (float)((int)(bt % T) + pos_offset);
        float ang = pos * inv.v[i];
        float co = cosf(ang), si = dir * sinf(ang);
        size_t r = bt * ld + (size_t)h * D;
        float a = load_as_f32(x, xt, r + i), b = load_as_f32(x, xt, r + i + half);
        store_from_f32(x, xt, r + i, a * co - b * si);
        store_from_f32(x, xt, r + i + half, b * co + a * si);
    }
}

static void rope(kn_ctx *c, kn_dtype dt, void *x, int B, int T, int H, int D, int ld, float base,
                 int pos_offset, float dir)
{
    if (B <= 0 || T <= 0 || H <= 0 || D < 2)
        return;
    if (D / 2 > KN_ROPE_HALF_MAX) {
        kn_fail(c, TY_EINVAL, "rope: head size %d is over %d", D, 2 * KN_ROPE_HALF_MAX);
        return;
    }
    rope_inv inv;
    for (int i = 0; i < D / 2; i++)
        inv.v[i] = 1.0f / powf(base, (float)(2 * i) / (float)D);
    size_t total = (size_t)B * T * H * (D / 2);
    KN_IO(k_rope, total * 2 * kn_dtype_size(dt), total * 2 * kn_dtype_size(dt), 0);
    KN_LAUNCH(k_rope, kn_blocks(total, 256), 256, 0, c, (int)dt, x, inv, T, H, D, ld, pos_offset,
              dir, total);
}
void cuda_rope_fwd(kn_ctx *c, kn_dtype dt, void *x, int B, int T, int H, int D, int ld, float base,
                   int pos_offset)
{
    rope(c, dt, x, B, T, H, D, ld, base, pos_offset, 1.0f);
}
void cuda_rope_bwd(kn_ctx *c, kn_dtype dt, void *dx, int B, int T, int H, int D, int ld,
                   float base, int pos_offset)
{
    rope(c, dt, dx, B, T, H, D, ld, base, pos_offset, -1.0f);
}

/* Scaled RoPE: the inverse frequencies come from the caller (device array
 * of D/2), angle = pos * inv_freq[i] in fp32 as on the CPU. */
__global__ void k_rope_freq(int xt, void *x, const float *inv_freq, int T, int H, int D, int ld,
                            int pos_offset, float dir, size_t total)
{
    int half = D / 2;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % half);
        size_t rest = e / half;
        int h = (int)(rest % H);
        size_t bt = rest / H;
        float pos = (float)((int)(bt % T) + pos_offset);
        float ang = pos * inv_freq[i];
        float co = cosf(ang), si = dir * sinf(ang);
        size_t r = bt * ld + (size_t)h * D;
        float a = load_as_f32(x, xt, r + i), b = load_as_f32(x, xt, r + i + half);
        store_from_f32(x, xt, r + i, a * co - b * si);
        store_from_f32(x, xt, r + i + half, b * co + a * si);
    }
}

static void rope_freq(kn_ctx *c, kn_dtype dt, void *x, int B, int T, int H, int D, int ld,
                      const float *inv_freq, int pos_offset, float dir)
{
    if (B <= 0 || T <= 0 || H <= 0 || D < 2)
        return;
    size_t total = (size_t)B * T * H * (D / 2);
    KN_IO(k_rope_freq, total * 2 * kn_dtype_size(dt) + 4 * (size_t)(D / 2),
        total * 2 * kn_dtype_size(dt), 0);
    KN_LAUNCH(k_rope_freq, kn_blocks(total, 256), 256, 0, c, (int)dt, x, inv_freq, T, H, D, ld,
              pos_offset, dir, total);
}
void cuda_rope_freq_fwd(kn_ctx *c, kn_dtype dt, void *x, int B, int T, int H, int D, int ld,
                        const float *inv_freq, int pos_offset)
{
    rope_freq(c, dt, x, B, T, H, D, ld, inv_freq, pos_offset, 1.0f);
}
void cuda_rope_freq_bwd(kn_ctx *c, kn_dtype dt, void *dx, int B, int T, int H, int D, int ld,
                        const float *inv_freq, int pos_offset)
{
    rope_freq(c, dt, dx, B, T, H, D, ld, inv_freq, pos_offset, -1.0f);
}

/* ---- attention ------------------------------------------------------------ */

/* The scalar kernels' tiles by head-dim bound DM: BR query (or key) rows
 * per block, one thread each, and BC staged rows. A thread's own rows (q,
 * its accumulators, its scores) live in shared memory as columns (element
 * d of thread r at [d * BR + r]: consecutive threads, consecutive banks),
 * never in per-thread arrays, which ptxas would put in local memory. Every
 * kernel's block stays within the 48 KiB any device gives without an
 * opt-in (the static_asserts below, at D = DM). */
template <int DM> struct att_tile {
    static const int BR = DM <= 128 ? 16 : 8;
    static const int BC = DM <= 64 ? 32 : DM <= 128 ? 8 : 4;
};

/* Floats of shared memory each scalar kernel's block takes at head dim D. */
template <int DM> __host__ __device__ constexpr int att_fwd_floats(int D)
{
    return 2 * att_tile<DM>::BC * D + 2 * D * att_tile<DM>::BR + att_tile<DM>::BC * att_tile<DM>::BR;
}
template <int DM> __host__ __device__ constexpr int att_dq_floats(int D)
{
    return 2 * att_tile<DM>::BC * D + 3 * D * att_tile<DM>::BR;
}
template <int DM> __host__ __device__ constexpr int att_kv_floats(int D)
{
    return 2 * att_tile<DM>::BC * D + 2 * att_tile<DM>::BC + 4 * D * att_tile<DM>::BR;
}
#define ATT_FITS(DM)                                                                               \
    static_assert(4 * att_fwd_floats<DM>(DM) <= 48 * 1024 &&                                       \
                      4 * att_dq_floats<DM>(DM) <= 48 * 1024 &&                                    \
                      4 * att_kv_floats<DM>(DM) <= 48 * 1024,                                      \
                  "scalar attention block over 48 KiB at head dim " #DM)
ATT_FITS(64);
ATT_FITS(128);
ATT_FITS(256);
#undef ATT_FITS

/* sum_d a[d * as] b[d]: a is a thread's column (as = BR), b a staged row. */
__device__ __forceinline__ float dot_col(const float *a, int as, const float *b, int D)
{
    float s = 0;
    for (int d = 0; d < D; d++)
        s += a[d * as] * b[d];
    return s;
}

/* Stages rows [r0, r0+BC) of a [B,T,H,D] tensor of type xt (its head's
 * first element at `base`, row stride ld) into fp32 sm[BC][D] (rows past
 * T as zeros), each value rounded to what type rt holds (the backward's
 * fp32 dO as a 16-bit op reads it). */
__device__ __forceinline__ void stage(float *sm, const void *src, size_t base, int xt, int r0,
                                      int BC, int T, int D, int ld, int rt = KN_F32)
{
    for (int e = threadIdx.x; e < BC * D; e += blockDim.x) {
        int r = e / D, d = e % D;
        float x = r0 + r < T ? load_as_f32(src, xt, base + (size_t)(r0 + r) * ld + d) : 0.0f;
        sm[e] = round_as(rt, x);
    }
}

/* Query rows are the last Tq of Tk positions (Tq == Tk: training's
 * causal attention; Tq < Tk: generation's new rows over a KV cache): local
 * row r of q, out and lse sits at position q0 + r, q0 = Tk - Tq. */
template <int DM>
__global__ void k_attn_fwd(int xt, void *out, float *lse, const void *q, const void *k,
                           const void *v, int Tq, int Tk, int Hq, int Hkv, int D, int ldq,
                           int ldkv, float scale, float cap, int window)
{
    const int BC = att_tile<DM>::BC, BR = att_tile<DM>::BR;
    KN_DYN_SHARED(float, sm);
    float *Ks = sm, *Vs = Ks + BC * D;
    float *qi = Vs + BC * D + threadIdx.x, *acc = qi + D * BR, *s = acc + D * BR;
    int b = blockIdx.z, h = blockIdx.y, hk = h / (Hq / Hkv), q0 = Tk - Tq;
    int r = blockIdx.x * BR + threadIdx.x, i0 = q0 + blockIdx.x * BR, i = q0 + r;
    bool live = r < Tq;
    size_t kvb = (size_t)b * Tk * ldkv + (size_t)hk * D;
    for (int d = 0; d < D; d++) {
        qi[d * BR] =
            live ? load_as_f32(q, xt, ((size_t)b * Tq + r) * ldq + (size_t)h * D + d) : 0.0f;
        acc[d * BR] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f, dt;
    int last = min(Tk - 1, i0 + BR - 1), lo = att_lo(i, window);
    for (int j0 = att_lo(i0, window) / BC * BC; j0 <= last; j0 += BC) {
        __syncthreads(); /* the previous tile is consumed */
        stage(Ks, k, kvb, xt, j0, BC, Tk, D, ldkv);
        stage(Vs, v, kvb, xt, j0, BC, Tk, D, ldkv);
        __syncthreads();
        if (!live || j0 > i || j0 + BC <= lo)
            continue;
        int n = min(BC, i - j0 + 1);
        float tmax = -INFINITY;
        for (int t = 0; t < n; t++) {
            s[t * BR] = j0 + t < lo ? -INFINITY
                                    : att_score(dot_col(qi, BR, Ks + t * D, D), scale, cap, &dt);
            tmax = fmaxf(tmax, s[t * BR]);
        }
        float mnew = fmaxf(m, tmax);
        float corr = expf(m - mnew); /* 0 on the first tile (m = -inf) */
        l *= corr;
        for (int d = 0; d < D; d++)
            acc[d * BR] *= corr;
        for (int t = 0; t < n; t++) {
            float p = expf(s[t * BR] - mnew);
            l += p;
            const float *vr = Vs + t * D;
            for (int d = 0; d < D; d++)
                acc[d * BR] += p * vr[d];
        }
        m = mnew;
    }
    if (!live)
        return;
    float inv = 1.0f / l;
    size_t o = ((size_t)b * Tq + r) * Hq * D + (size_t)h * D;
    for (int d = 0; d < D; d++)
        store_from_f32(out, xt, o + d, acc[d * BR] * inv);
    lse[((size_t)b * Hq + h) * Tq + r] = m + logf(l);
}

template <int DM>
__global__ void k_attn_bwd_dq(int xt, int gt, void *dq, const void *dout, int ot, const void *out,
                              const float *lse, const void *q, const void *k, const void *v, int T,
                              int Hq, int Hkv, int D, int ldq, int ldkv, float scale, float cap,
                              int window)
{
    const int BC = att_tile<DM>::BC, BR = att_tile<DM>::BR;
    KN_DYN_SHARED(float, sm);
    float *Ks = sm, *Vs = Ks + BC * D;
    float *qi = Vs + BC * D + threadIdx.x, *doi = qi + D * BR, *dqi = doi + D * BR;
    int b = blockIdx.z, h = blockIdx.y, hk = h / (Hq / Hkv);
    int i0 = blockIdx.x * BR, i = i0 + threadIdx.x;
    bool live = i < T;
    size_t kvb = (size_t)b * T * ldkv + (size_t)hk * D;
    size_t orow = ((size_t)b * T + i) * Hq * D + (size_t)h * D;
    float Di = 0.0f, L = 0.0f;
    if (live) {
        for (int d = 0; d < D; d++) {
            qi[d * BR] = load_as_f32(q, xt, ((size_t)b * T + i) * ldq + (size_t)h * D + d);
            doi[d * BR] = round_as(xt, load_as_f32(dout, ot, orow + d));
            dqi[d * BR] = 0.0f;
            Di += doi[d * BR] * load_as_f32(out, xt, orow + d);
        }
        L = lse[((size_t)b * Hq + h) * T + i];
    }
    int last = min(T - 1, i0 + BR - 1), lo = att_lo(i, window);
    for (int j0 = att_lo(i0, window) / BC * BC; j0 <= last; j0 += BC) {
        __syncthreads();
        stage(Ks, k, kvb, xt, j0, BC, T, D, ldkv);
        stage(Vs, v, kvb, xt, j0, BC, T, D, ldkv);
        __syncthreads();
        if (!live || j0 > i)
            continue;
        int n = min(BC, i - j0 + 1);
        for (int r = max(0, lo - j0); r < n; r++) {
            const float *kr = Ks + r * D;
            float dt, p = expf(att_score(dot_col(qi, BR, kr, D), scale, cap, &dt) - L);
            float ds = p * (dot_col(doi, BR, Vs + r * D, D) - Di) * scale * dt;
            for (int d = 0; d < D; d++)
                dqi[d * BR] += ds * kr[d];
        }
    }
    if (!live)
        return;
    size_t o = ((size_t)b * T + i) * ldq + (size_t)h * D;
    for (int d = 0; d < D; d++)
        store_from_f32(dq, gt, o + d, dqi[d * BR]);
}

template <int DM>
__global__ void k_attn_bwd_dkdv(int xt, int gt, void *dk, void *dv, const void *dout, int ot,
                                const void *out, const float *lse, const void *q, const void *k,
                                const void *v, int T, int Hq, int Hkv, int D, int ldq, int ldkv,
                                float scale, float cap, int window)
{
    const int BQ = att_tile<DM>::BC, BR = att_tile<DM>::BR;
    KN_DYN_SHARED(float, sm);
    float *Qs = sm, *Os = sm + BQ * D, *Ls = sm + 2 * BQ * D, *Dd = Ls + BQ;
    float *kj = Dd + BQ + threadIdx.x, *vj = kj + D * BR, *dkj = vj + D * BR, *dvj = dkj + D * BR;
    int b = blockIdx.z, hk = blockIdx.y, group = Hq / Hkv;
    int j0 = blockIdx.x * BR, j = j0 + threadIdx.x;
    bool live = j < T;
    size_t krow = ((size_t)b * T + j) * ldkv + (size_t)hk * D;
    for (int d = 0; d < D; d++) {
        kj[d * BR] = live ? load_as_f32(k, xt, krow + d) : 0.0f;
        vj[d * BR] = live ? load_as_f32(v, xt, krow + d) : 0.0f;
        dkj[d * BR] = dvj[d * BR] = 0.0f;
    }
    for (int h = hk * group; h < (hk + 1) * group; h++) {
        size_t qb = (size_t)b * T * ldq + (size_t)h * D;
        size_t ob = (size_t)b * T * Hq * D + (size_t)h * D;
        /* Query rows past the block's last key's window see none of it. */
        int iend = window > 0 ? min(T, j0 + BR - 1 + window) : T;
        for (int i0 = j0; i0 < iend; i0 += BQ) {
            __syncthreads();
            stage(Qs, q, qb, xt, i0, BQ, T, D, ldq);
            stage(Os, dout, ob, ot, i0, BQ, T, D, Hq * D, xt);
            for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
                int i = i0 + r;
                float di = 0.0f, li = 0.0f;
                if (i < T) {
                    size_t orow = ((size_t)b * T + i) * Hq * D + (size_t)h * D;
                    for (int d = 0; d < D; d++)
                        di += round_as(xt, load_as_f32(dout, ot, orow + d)) *
                              load_as_f32(out, xt, orow + d);
                    li = lse[((size_t)b * Hq + h) * T + i];
                }
                Dd[r] = di;
                Ls[r] = li;
            }
            __syncthreads();
            if (!live)
                continue;
            for (int r = 0; r < BQ; r++) {
                int i = i0 + r;
                if (i < j || i >= T || (window > 0 && i - j >= window))
                    continue;
                const float *qr = Qs + r * D, *dor = Os + r * D;
                float dt, p = expf(att_score(dot_col(kj, BR, qr, D), scale, cap, &dt) - Ls[r]);
                float ds = p * (dot_col(vj, BR, dor, D) - Dd[r]) * scale * dt;
                for (int d = 0; d < D; d++) {
                    dvj[d * BR] += p * dor[d];
                    dkj[d * BR] += ds * qr[d];
                }
            }
        }
    }
    if (!live)
        return;
    for (int d = 0; d < D; d++) {
        if (dk)
            store_from_f32(dk, gt, krow + d, dkj[d * BR]);
        if (dv)
            store_from_f32(dv, gt, krow + d, dvj[d * BR]);
    }
}

template <int DM>
static void attn_fwd(kn_ctx *c, int xt, void *out, float *lse, const void *q, const void *k,
                     const void *v, int B, int Tq, int Tk, int Hq, int Hkv, int D, int ldq,
                     int ldkv, float scale, float cap, int window)
{
    const int BR = att_tile<DM>::BR;
    dim3 grid((Tq + BR - 1) / BR, Hq, B);
    KN_IO(k_attn_fwd<DM>, att_bytes(xt, B, Tq, Tk, Hq, Hkv, D, 0), att_bytes(xt, B, Tq, Tk, Hq, 0, D, 1),
        4 * (uint64_t)B * Hq * D * att_pairs(Tq, Tk, window));
    KN_LAUNCH(k_attn_fwd<DM>, grid, BR, 4 * (size_t)att_fwd_floats<DM>(D), c, xt, out, lse, q, k,
              v, Tq, Tk, Hq, Hkv, D, ldq, ldkv, scale, cap, window);
}

template <int DM>
static void attn_bwd(kn_ctx *c, int xt, int gt, void *dq, void *dk, void *dv, const void *dout,
                     int ot, const void *out, const float *lse, const void *q, const void *k,
                     const void *v, int B, int T, int Hq, int Hkv, int D, int ldq, int ldkv,
                     float scale, float cap, int window)
{
    const int BR = att_tile<DM>::BR;
    if (dq) {
        dim3 grid((T + BR - 1) / BR, Hq, B);
        KN_IO(k_attn_bwd_dq<DM>, att_bytes(xt, B, T, T, Hq, Hkv, D, 2, ot),
            att_grad_bytes(dq, nullptr, gt, B, T, Hq, D),
            6 * (uint64_t)B * Hq * D * att_pairs(T, T, window));
        KN_LAUNCH(k_attn_bwd_dq<DM>, grid, BR, 4 * (size_t)att_dq_floats<DM>(D), c, xt, gt, dq, dout,
                  ot, out, lse, q, k, v, T, Hq, Hkv, D, ldq, ldkv, scale, cap, window);
    }
    if (dk || dv) {
        dim3 grid((T + BR - 1) / BR, Hkv, B);
        KN_IO(k_attn_bwd_dkdv<DM>, att_bytes(xt, B, T, T, Hq, Hkv, D, 3, ot),
            att_grad_bytes(dk, dv, gt, B, T, Hkv, D),
            8 * (uint64_t)B * Hq * D * att_pairs(T, T, window));
        KN_LAUNCH(k_attn_bwd_dkdv<DM>, grid, BR, 4 * (size_t)att_kv_floats<DM>(D), c, xt, gt, dk, dv,
                  dout, ot, out, lse, q, k, v, T, Hq, Hkv, D, ldq, ldkv, scale, cap, window);
    }
}

/* ---- the tensor-core kernels (cuda_attn_flash.cuh) ----------------------- */

/* bf16 / fp16 at a head dim the flash kernels are built for; bf16 needs
 * sm_80's fragments. */
static bool fl_picks(kn_ctx *c, kn_dtype dt, int D)
{
    if (dt == KN_F32 || !(D == 64 || D == 80 || D == 96 || D == 128 || D == 256)) return false;
    return dt == KN_F16 || kn_cuda_st(c)->cc_major >= 8;
}

/* Dd[b, h, i] = rowsum(dO_i * O_i) over the head's D, laid out as lse,
 * and, where dO is not NULL, dout rounded to the input type into it
 * (fl_grad): computed once for both backward kernels (dk/dv would
 * otherwise redo it for every key block). A warp per (row, head), lanes
 * along d, the lanes' sums added by kn_warp_sum's fixed tree. out is of
 * the input type xt, dout of type ot (fp32, or xt: then it is the
 * kernels' dO as it stands and dO is NULL); all [B, T, Hq, D]. */
__global__ void k_fl_rowdot(float *Dd, uint16_t *dO, const void *dout, int ot, const void *out,
                            int xt, int B, int T, int Hq, int D)
{
    int lane = threadIdx.x % 32, wpb = blockDim.x / 32;
    size_t rows = (size_t)B * T * Hq;
    for (size_t row = (size_t)blockIdx.x * wpb + threadIdx.x / 32; row < rows;
         row += (size_t)gridDim.x * wpb) {
        size_t o = row * D; /* [B, T, Hq] rows of D */
        float s = 0.0f;
        for (int d = lane; d < D; d += 32) {
            float g = round_as(xt, load_as_f32(dout, ot, o + d)); /* as the 16-bit op reads it */
            s += g * load_as_f32(out, xt, o + d);
            if (dO) store_from_f32(dO, xt, o + d, g);
        }
        s = kn_warp_sum(s);
        if (lane == 0) {
            int h = (int)(row % Hq);
            size_t bt = row / Hq, b = bt / T, i = bt % T;
            Dd[((size_t)b * Hq + h) * T + i] = s;
        }
    }
}

/* D_i = rowsum(dO * O) per row and head, for both backward kernels, into
 * scratch, and dO in the input type: dout itself where it is of that
 * type, else dout rounded into scratch; false after an error. */
static bool fl_rowdot(kn_ctx *c, kn_dtype dt, fl_grad *g, const void *dout, kn_dtype dout_dt,
                      const void *out, int B, int T, int Hq, int D)
{
    size_t rows = (size_t)B * T * Hq, n = rows * D;
    bool typed = dout_dt == dt;
    float *Dd = (float *)kn_cuda_scratch(c, KN_SCRATCH_ATTN_D, rows * sizeof(float));
    uint16_t *dO = typed ? nullptr
                         : (uint16_t *)kn_cuda_scratch(c, KN_SCRATCH_ATTN_DO, n * sizeof(uint16_t));
    if (!Dd || (!typed && !dO)) return false;
    KN_IO(k_fl_rowdot, n * (kn_dtype_size(dout_dt) + kn_dtype_size(dt)),
          4 * rows + (typed ? 0 : 2 * n), 0);
    KN_LAUNCH(k_fl_rowdot, kn_blocks(rows, 8), 256, 0, c, Dd, dO, dout, (int)dout_dt, out, (int)dt,
              B, T, Hq, D);
    *g = {Dd, typed ? (const uint16_t *)dout : dO};
    return true;
}

static int attn_shape_ok(kn_ctx *c, int B, int T, int Hq, int Hkv, int D)
{
    if (B <= 0 || T <= 0)
        return 0;
    if (Hq <= 0 || Hkv <= 0 || Hq % Hkv || D <= 0 || D > 256) {
        kn_fail(c, TY_EINVAL, "attention: unsupported heads %d/%d or head dim %d (max 256)", Hq,
                Hkv, D);
        return 0;
    }
    return 1;
}

void cuda_attention_fwd(kn_ctx *c, kn_dtype dt, void *out, float *lse, const void *q,
                        const void *k, const void *v, int B, int T, int Hq, int Hkv, int D, int ldq,
                        int ldkv, float scale, float softcap, int window)
{
    cuda_attention_kv_fwd(c, dt, out, lse, q, k, v, B, T, T, Hq, Hkv, D, ldq, ldkv, scale, softcap,
                          window);
}

void cuda_attention_kv_fwd(kn_ctx *c, kn_dtype dt, void *out, float *lse, const void *q,
                           const void *k, const void *v, int B, int Tq, int Tk, int Hq, int Hkv,
                           int D, int ldq, int ldkv, float scale, float softcap, int window)
{
    if (Tq > Tk) {
        kn_fail(c, TY_EINVAL, "attention: %d query rows over %d positions", Tq, Tk);
        return;
    }
    if (!attn_shape_ok(c, B, Tq, Hq, Hkv, D))
        return;
    if (scale == 0.0f)
        scale = 1.0f / sqrtf((float)D);
    fl_args a = {scale, softcap, window, KN_F32};
    if (fl_picks(c, dt, D) &&
        fl_fwd_launch(c, dt, D, out, lse, q, k, v, B, Tq, Tk, Hq, Hkv, ldq, ldkv, a))
        return;
    int xt = (int)dt;
#define ATT_FWD_ARGS                                                                               \
    c, xt, out, lse, q, k, v, B, Tq, Tk, Hq, Hkv, D, ldq, ldkv, scale, softcap, window
    if (D <= 64)
        attn_fwd<64>(ATT_FWD_ARGS);
    else if (D <= 128)
        attn_fwd<128>(ATT_FWD_ARGS);
    else
        attn_fwd<256>(ATT_FWD_ARGS);
#undef ATT_FWD_ARGS
}

void cuda_attention_bwd(kn_ctx *c, kn_dtype dt, kn_dtype g_dt, void *dq, void *dk, void *dv,
                        const void *dout, kn_dtype dout_dt, const void *out, const float *lse,
                        const void *q, const void *k, const void *v, int B, int T, int Hq, int Hkv,
                        int D, int ldq, int ldkv, float scale, float softcap, int window)
{
    if (!attn_shape_ok(c, B, T, Hq, Hkv, D))
        return;
    if (!kn_grad_dtype_ok(c, dt, g_dt, "attention backward") ||
        !kn_grad_dtype_ok(c, dt, dout_dt, "attention backward"))
        return;
    if (scale == 0.0f)
        scale = 1.0f / sqrtf((float)D);
    fl_args a = {scale, softcap, window, (int)g_dt};
    fl_grad g;
    bool flash = fl_picks(c, dt, D) && (dq || dk || dv) &&
                 fl_rowdot(c, dt, &g, dout, dout_dt, out, B, T, Hq, D);
    if (flash) { /* what a flash kernel does, the scalar one leaves */
        if (dq && fl_dq_launch(c, dt, D, dq, g, lse, q, k, v, B, T, Hq, Hkv, ldq, ldkv, a))
            dq = nullptr;
        if ((dk || dv) &&
            fl_dkdv_launch(c, dt, D, dk, dv, g, lse, q, k, v, B, T, Hq, Hkv, ldq, ldkv, a))
            dk = dv = nullptr;
        if (!dq && !dk && !dv)
            return;
    }
    int xt = (int)dt, gt = (int)g_dt;
#define ATT_BWD_ARGS                                                                               \
    c, xt, gt, dq, dk, dv, dout, (int)dout_dt, out, lse, q, k, v, B, T, Hq, Hkv, D, ldq, ldkv,     \
        scale, softcap, window
    if (D <= 64)
        attn_bwd<64>(ATT_BWD_ARGS);
    else if (D <= 128)
        attn_bwd<128>(ATT_BWD_ARGS);
    else
        attn_bwd<256>(ATT_BWD_ARGS);
#undef ATT_BWD_ARGS
}

} // namespace KN_NS
