/* cuda_loss.cu — fused softmax + cross-entropy.
 *
 * One block per row. The row is read twice (max, then the exponentials) and
 * the gradient written once; the full-vocabulary probabilities are never
 * stored anywhere else, and dlogits may alias logits (each element is read
 * and written by the same thread, the target's logit is read first). The
 * exponential sum is combined in double across the block, as the CPU
 * backend sums each row in double. Target -100 is ignored (zero loss and
 * gradient row); any other target outside [0, V) gives NaN, so the
 * engine's non-finite check stops the run. A final-logit soft-cap (cap >
 * 0, Gemma 2) is applied to each logit as it is read, y = cap tanh(z /
 * cap), and the gradient is multiplied by dy/dz = 1 - (y / cap)^2. */
#include "kn_cuda.cuh"
#include "kn_cuda16.cuh"

namespace KN_NS {

#define CE_THREADS 256
#define CE_IGNORE (-100)

__device__ __forceinline__ float capped(float z, float cap)
{
    return cap > 0.0f ? cap * tanhf(z / cap) : z;
}

__global__ void k_crossentropy(float *losses, void *dlogits, const void *logits, int dt,
                               const int32_t *targets, int V, float scale, float cap)
{
    __shared__ float shf[33];
    __shared__ double shd[33];
    size_t off = (size_t)blockIdx.x * V;
    int t = targets[blockIdx.x];
    if (t == CE_IGNORE || t < 0 || t >= V) {
        float fill = t == CE_IGNORE ? 0.0f : NAN;
        if (losses && threadIdx.x == 0)
            losses[blockIdx.x] = fill;
        for (int j = threadIdx.x; dlogits && j < V; j += blockDim.x)
            store_from_f32(dlogits, dt, off + j, fill);
        return;
    }
    float lt = capped(load_as_f32(logits, dt, off + t), cap);
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        mx = fmaxf(mx, capped(load_as_f32(logits, dt, off + j), cap));
    mx = kn_block_max(mx, shf);
    float part = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        part += expf(capped(load_as_f32(logits, dt, off + j), cap) - mx);
    double s = kn_block_sum((double)part, shd);
    if (losses && threadIdx.x == 0)
        losses[blockIdx.x] = (float)(log(s) - (double)(lt - mx));
    if (!dlogits)
        return;
    /* Every thread has read the target's logit and the row twice before
     * any element is overwritten (the block sum is a barrier), so dlogits
     * may alias logits. */
    float k = (float)(scale / s);
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float y = capped(load_as_f32(logits, dt, off + j), cap);
        float g = expf(y - mx) * k;
        if (j == t)
            g -= scale;
        if (cap > 0.0f)
            g *= 1.0f - (y / cap) * (y / cap);
        store_from_f32(dlogits, dt, off + j, g);
    }
}

/* 16-bit logits (the typed ops) are read and written in place as
 * 16 bits: no fp32 copy of the [N, V] tensor, no allocation. */
void cuda_crossentropy_fwd(kn_ctx *c, kn_dtype dt, float *losses, const void *logits,
                           const int32_t *targets, int N, int V, float softcap)
{
    void *no_grad = nullptr;
    if (N <= 0 || V <= 0)
        return;
    KN_IO(k_crossentropy, 4 * (size_t)N + (size_t)N * V * kn_dtype_size(dt), (losses ? 4 * (size_t)N : 0), 0);
    KN_LAUNCH(k_crossentropy, N, CE_THREADS, 0, c, losses, no_grad, logits, (int)dt, targets, V, 0.0f,
              softcap);
}

void cuda_crossentropy_fwd_bwd(kn_ctx *c, kn_dtype dt, float *losses, void *dlogits, const void *logits,
                               const int32_t *targets, int N, int V, float scale, float softcap)
{
    if (N <= 0 || V <= 0)
        return;
    KN_IO(k_crossentropy, 4 * (size_t)N + (size_t)N * V * kn_dtype_size(dt),
        (losses ? 4 * (size_t)N : 0) + (dlogits ? (size_t)N * V * kn_dtype_size(dt) : 0), 0);
    KN_LAUNCH(k_crossentropy, N, CE_THREADS, 0, c, losses, dlogits, logits, (int)dt, targets, V, scale,
              softcap);
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
