/* cuda_loss.cu — fused softmax + cross-entropy.
 *
 * One block per row. The row is read twice (max, then the exponentials) and
 * the gradient written once; the full-vocabulary probabilities are never
 * stored anywhere else, and dlogits may alias logits (each element is read
 * and written by the same thread, the target's logit is read first). The
 * exponential sum is combined in double across the block, as the CPU
 * backend sums each row in double. Target -100 is ignored (zero loss and
 * gradient row); any other target outside [0, V) gives NaN, so the
 * engine's non-finite check stops the run. */
#include "kn_cuda.cuh"
#include "kn_cuda16.cuh"

namespace KN_NS {

#define CE_THREADS 256
#define CE_IGNORE (-100)

__global__ void k_crossentropy(float *losses, void *dlogits, const void *logits, int dt,
                               const int32_t *targets, int V, float scale)
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
    float lt = load_as_f32(logits, dt, off + t);
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        mx = fmaxf(mx, load_as_f32(logits, dt, off + j));
    mx = kn_block_max(mx, shf);
    float part = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        part += expf(load_as_f32(logits, dt, off + j) - mx);
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
        float g = expf(load_as_f32(logits, dt, off + j) - mx) * k;
        store_from_f32(dlogits, dt, off + j, j == t ? g - scale : g);
    }
}

/* 16-bit logits (issue 10's typed ops) are read and written in place as
 * 16 bits: no fp32 copy of the [N, V] tensor, no allocation. */
void cuda_crossentropy_fwd(kn_ctx *c, kn_dtype dt, float *losses, const void *logits,
                           const int32_t *targets, int N, int V)
{
    void *no_grad = nullptr;
    if (N <= 0 || V <= 0)
        return;
    KN_LAUNCH(k_crossentropy, N, CE_THREADS, 0, c, losses, no_grad, logits, (int)dt, targets, V, 0.0f);
}

void cuda_crossentropy_fwd_bwd(kn_ctx *c, kn_dtype dt, float *losses, void *dlogits, const void *logits,
                               const int32_t *targets, int N, int V, float scale)
{
    if (N <= 0 || V <= 0)
        return;
    KN_LAUNCH(k_crossentropy, N, CE_THREADS, 0, c, losses, dlogits, logits, (int)dt, targets, V, scale);
}

} // namespace KN_NS
