/* cuda_loss.cu — fused softmax + cross-entropy.
 *
 * One block per row, and the row is read twice: a first pass finds the
 * max and the exponential sum together (online softmax: each thread keeps
 * a running max and rescales its sum when the max grows; the block then
 * rescales every thread's sum to the row's max), a second pass writes the
 * gradient. Rows are walked as a scalar head up to the first 16-byte
 * boundary, 16-byte vectors (4 fp32 or 8 16-bit logits a load) and a
 * scalar tail, so rows of any V (GPT-2's 50257 leaves most rows
 * unaligned) take 128-bit loads. The full-vocabulary probabilities are
 * never stored anywhere else, and dlogits may alias logits (each element
 * is read and written by the same thread, the target's logit is read
 * first). The exponential sum is combined in double across the block, as
 * the CPU backend sums each row in double. Target -100 is ignored (zero
 * loss and gradient row); any other target outside [0, V) gives NaN, so
 * the engine's non-finite check stops the run. A final-logit soft-cap
 * (cap > 0, Gemma 2) is applied to each logit as it is read,
 * y = cap tanh(z / cap), and the gradient is multiplied by
 * dy/dz = 1 - (y / cap)^2. */
#include "kn_cuda.cuh"
#include "kn_cuda16.cuh"

namespace KN_NS {

#define CE_THREADS 256
#define CE_IGNORE (-100)

/* 16 bytes of a row: what one 128-bit load brings. */
struct __align__(16) ce_vec {
    uint32_t w[4];
};

__device__ __forceinline__ float capped(float z, float cap)
{
    return cap > 0.0f ? cap * tanhf(z / cap) : z;
}

/* Element e of a 16-byte vector of DT values, as fp32; and its store. */
template <int DT> __device__ __forceinline__ float vec_get(const ce_vec &v, int e)
{
    if (DT == KN_F32)
        return bits_f(v.w[e]);
    uint16_t h = (uint16_t)(v.w[e / 2] >> (16 * (e % 2)));
    return DT == KN_BF16 ? from_bf16(h) : from_f16(h);
}
template <int DT> __device__ __forceinline__ void vec_set(ce_vec &v, int e, float x)
{
    if (DT == KN_F32) {
        v.w[e] = f_bits(x);
        return;
    }
    uint32_t h = DT == KN_BF16 ? to_bf16(x) : to_f16(x), sh = 16 * (e % 2);
    v.w[e / 2] = (v.w[e / 2] & ~(0xffffu << sh)) | (h << sh);
}

/* Walks this thread's elements of a row of V logits: f(j, y) with y the
 * (capped) logit j; when out is set, f's result is stored as out[j] (out
 * may be row). The head runs up to row's first 16-byte boundary; vectors
 * are stored as vectors when out has row's alignment. */
template <int DT, typename F>
__device__ __forceinline__ void ce_walk(const void *row, void *out, int V, float cap, F f)
{
    const int per = DT == KN_F32 ? 4 : 8, es = 16 / per;
    int head = (int)(((16 - ((uintptr_t)row & 15)) & 15) / es);
    head = head < V ? head : V;
    int nvec = (V - head) / per, tail = head + nvec * per;
    int vec_out = out && ((uintptr_t)out & 15) == ((uintptr_t)row & 15);
    for (int j = threadIdx.x; j < head; j += blockDim.x) {
        float g = f(j, capped(load_as_f32(row, DT, j), cap));
        if (out)
            store_from_f32(out, DT, j, g);
    }
    const ce_vec *vin = (const ce_vec *)((const char *)row + (size_t)head * es);
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
        ce_vec v = vin[i];
        int j0 = head + i * per;
        for (int e = 0; e < per; e++) {
            float g = f(j0 + e, capped(vec_get<DT>(v, e), cap));
            if (vec_out)
                vec_set<DT>(v, e, g);
            else if (out)
                store_from_f32(out, DT, j0 + e, g);
        }
        if (vec_out)
            ((ce_vec *)((char *)out + (size_t)head * es))[i] = v;
    }
    for (int j = tail + threadIdx.x; j < V; j += blockDim.x) {
        float g = f(j, capped(load_as_f32(row, DT, j), cap));
        if (out)
            store_from_f32(out, DT, j, g);
    }
}

/* One row's loss and gradient (see the file's comment). */
template <int DT>
__device__ void ce_row(float *losses, void *drow, const void *row, int t, int V, float scale,
                       float cap, float *shf, double *shd)
{
    float lt = capped(load_as_f32(row, DT, t), cap);
    float m = -INFINITY, s = 0.0f;
    ce_walk<DT>(row, nullptr, V, cap, [&](int, float y) {
        if (y > m) {
            s = s * expf(m - y) + 1.0f;
            m = y;
        } else if (m > -INFINITY) {
            s += expf(y - m);
        }
        return 0.0f;
    });
    float mx = kn_block_max(m, shf);
    double sum = kn_block_sum(s > 0.0f ? (double)(s * expf(m - mx)) : 0.0, shd);
    if (losses && threadIdx.x == 0)
        losses[blockIdx.x] = (float)(log(sum) - (double)(lt - mx));
    if (!drow)
        return;
    /* Every thread has read the target's logit and its elements before
     * any element is overwritten (the block sum is a barrier), so drow
     * may alias row. */
    float k = (float)(scale / sum);
    ce_walk<DT>(row, drow, V, cap, [&](int j, float y) {
        float g = expf(y - mx) * k;
        if (j == t)
            g -= scale;
        if (cap > 0.0f)
            g *= 1.0f - (y / cap) * (y / cap);
        return g;
    });
}

__global__ void k_crossentropy(float *losses, void *dlogits, const void *logits, int dt,
                               const int32_t *targets, int V, int ld, float scale, float cap)
{
    __shared__ float shf[33];
    __shared__ double shd[33];
    size_t off = (size_t)blockIdx.x * ld, es = dt == KN_F32 ? 4 : 2;
    int t = targets[blockIdx.x];
    if (t == CE_IGNORE || t < 0 || t >= V) {
        float fill = t == CE_IGNORE ? 0.0f : NAN;
        if (losses && threadIdx.x == 0)
            losses[blockIdx.x] = fill;
        for (int j = threadIdx.x; dlogits && j < V; j += blockDim.x)
            store_from_f32(dlogits, dt, off + j, fill);
        return;
    }
    const void *row = (const char *)logits + off * es;
    void *drow = dlogits ? (char *)dlogits + off * es : nullptr;
    if (dt == KN_F32)
        ce_row<KN_F32>(losses, drow, row, t, V, scale, cap, shf, shd);
    else if (dt == KN_BF16)
        ce_row<KN_BF16>(losses, drow, row, t, V, scale, cap, shf, shd);
    else
        ce_row<KN_F16>(losses, drow, row, t, V, scale, cap, shf, shd);
}

/* 16-bit logits (the typed ops) are read and written in place as
 * 16 bits: no fp32 copy of the [N, V] tensor, no allocation. */
void cuda_crossentropy_fwd(kn_ctx *c, kn_dtype dt, float *losses, const void *logits,
                           const int32_t *targets, int N, int V, int ld, float softcap)
{
    void *no_grad = nullptr;
    if (N <= 0 || V <= 0)
        return;
    KN_IO(k_crossentropy, 4 * (size_t)N + (size_t)N * V * kn_dtype_size(dt), (losses ? 4 * (size_t)N : 0), 0);
    KN_LAUNCH(k_crossentropy, N, CE_THREADS, 0, c, losses, no_grad, logits, (int)dt, targets, V, ld,
              0.0f, softcap);
}

void cuda_crossentropy_fwd_bwd(kn_ctx *c, kn_dtype dt, float *losses, void *dlogits, const void *logits,
                               const int32_t *targets, int N, int V, int ld, float scale, float softcap)
{
    if (N <= 0 || V <= 0)
        return;
    KN_IO(k_crossentropy, 4 * (size_t)N + (size_t)N * V * kn_dtype_size(dt),
        (losses ? 4 * (size_t)N : 0) + (dlogits ? (size_t)N * V * kn_dtype_size(dt) : 0), 0);
    KN_LAUNCH(k_crossentropy, N, CE_THREADS, 0, c, losses, dlogits, logits, (int)dt, targets, V, ld,
              scale, softcap);
}

/* The lm_head GEMMs with the logits' leading dimension ld (kn_logit_ld
 * pads it to a multiple of 128, so every logits row starts 16-byte
 * aligned for cuBLASLt and the cross-entropy's vector loads): the layouts
 * of kn_matmul16_* (kn_matmul_* in fp32) with ld for the logits'. The
 * weight keeps its V rows, columns V..ld-1 of the logits are never
 * written nor read.
 * The vocabulary is the forward's output extent and dx's reduction. At
 * GPT-2's 50257 an H200 ran those two GEMMs at 95 and 126 TFLOP/s, the
 * model's other bf16 GEMMs at 390 to 580 (TY_CUDA_PROFILE), dW (whose
 * odd extent is its N) at 510: so each runs as two, the rows below the
 * last multiple of 128 under V (head_bulk) and the tail. */
static int head_bulk(int V) { return V % 128 && V > 128 ? V / 128 * 128 : V; }

void cuda_logits_fwd(kn_ctx *c, kn_dtype dt, void *out, const void *x, const void *w, int N, int K,
                     int V, int ld)
{
    if (N <= 0 || V <= 0)
        return;
    if (ld < V) {
        kn_fail(c, TY_EINVAL, "logits: leading dimension %d < vocabulary %d", ld, V);
        return;
    }
    /* out^T[V,N] (column-major, ld) = w[V,K] x^T, rows [0, Vb) then [Vb, V) */
    size_t es = kn_dtype_size(dt);
    int Vb = head_bulk(V);
    kn_cuda_gemm(c, out, dt, w, x, dt, nullptr, KN_F32, Vb, N, K, 1, 0, K, K, ld, 0.0f);
    if (Vb < V)
        kn_cuda_gemm(c, (char *)out + Vb * es, dt, (const char *)w + (size_t)Vb * K * es, x, dt,
                     nullptr, KN_F32, V - Vb, N, K, 1, 0, K, K, ld, 0.0f);
}

void cuda_logits_bwd(kn_ctx *c, kn_dtype dt, float *dx, float *dw, const void *dout, const void *x,
                     const void *w, int N, int K, int V, int ld)
{
    if (N <= 0 || V <= 0 || K <= 0)
        return;
    if (ld < V) {
        kn_fail(c, TY_EINVAL, "logits: leading dimension %d < vocabulary %d", ld, V);
        return;
    }
    size_t es = kn_dtype_size(dt);
    int Vb = head_bulk(V);
    if (dx) { /* dx^T[K,N] += w^T[K,V] dout^T[V,N], the sum over V in two parts */
        kn_cuda_gemm(c, dx, KN_F32, w, dout, dt, nullptr, KN_F32, K, N, Vb, 0, 0, K, ld, K, 1.0f);
        if (Vb < V)
            kn_cuda_gemm(c, dx, KN_F32, (const char *)w + (size_t)Vb * K * es,
                         (const char *)dout + Vb * es, dt, nullptr, KN_F32, K, N, V - Vb, 0, 0, K, ld, K,
                         1.0f);
    }
    if (dw) /* dw^T[K,V] += x^T[K,N] dout[N,V] */
        kn_cuda_gemm(c, dw, KN_F32, x, dout, dt, nullptr, KN_F32, K, V, N, 0, 1, K, ld, K, 1.0f);
}

/* x = cap tanh(x / cap) in place (generation's and evaluation's logits). */
__global__ void k_softcap(float *x, size_t n, float cap)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

void cuda_softcap(kn_ctx *c, float *x, size_t n, float cap)
{
    if (n == 0 || cap <= 0.0f)
        return;
    KN_IO(k_softcap, 4 * n, 4 * n, 0);
    KN_LAUNCH(k_softcap, kn_blocks(n, 256), 256, 0, c, x, n, cap);
}

} // namespace KN_NS
