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

namespace KN_NS {

#define CE_THREADS 256
#define CE_IGNORE (-100)

__global__ void k_crossentropy(float *losses, float *dlogits, const float *logits,
                               const int32_t *targets, int V, float scale)
{
    __shared__ float shf[33];
    __shared__ double shd[33];
    size_t off = (size_t)blockIdx.x * V;
    const float *l = logits + off;
    float *d = dlogits ? dlogits + off : nullptr;
    int t = targets[blockIdx.x];
    if (t == CE_IGNORE || t < 0 || t >= V) {
        float fill = t == CE_IGNORE ? 0.0f : NAN;
        if (losses && threadIdx.x == 0)
            losses[blockIdx.x] = fill;
        for (int j = threadIdx.x; d && j < V; j += blockDim.x)
            d[j] = fill;
        return;
    }
    float lt = l[t];
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        mx = fmaxf(mx, l[j]);
    mx = kn_block_max(mx, shf);
    float part = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        part += expf(l[j] - mx);
    double s = kn_block_sum((double)part, shd);
    if (losses && threadIdx.x == 0)
        losses[blockIdx.x] = (float)(log(s) - (double)(lt - mx));
    if (!d)
        return;
    float k = (float)(scale / s);
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = expf(l[j] - mx) * k;
        d[j] = j == t ? g - scale : g;
    }
}

/* 16-bit logits (issue 10's typed ops): the baseline widens them into a
 * temporary fp32 tensor (allocated per call), runs the fp32 kernel there
 * and rounds dlogits back; a kernel reading 16-bit rows is the tuning
 * step. */
static float *widened(kn_ctx *c, kn_dtype dt, const void *logits, size_t n)
{
    float *l32 = nullptr;
    if (kn_cuda_ok(c, cudaMalloc((void **)&l32, n * sizeof(float)), "crossentropy fp32 logits"))
        return nullptr;
    cuda_convert(c, l32, KN_F32, logits, dt, n);
    return l32;
}

void cuda_crossentropy_fwd(kn_ctx *c, kn_dtype dt, float *losses, const void *logits,
                           const int32_t *targets, int N, int V)
{
    float *no_grad = nullptr;
    if (N <= 0 || V <= 0)
        return;
    if (dt == KN_F32) {
        KN_LAUNCH(k_crossentropy, N, CE_THREADS, 0, c, losses, no_grad, (const float *)logits, targets, V, 0.0f);
        return;
    }
    float *l32 = widened(c, dt, logits, (size_t)N * V);
    if (!l32)
        return;
    KN_LAUNCH(k_crossentropy, N, CE_THREADS, 0, c, losses, no_grad, (const float *)l32, targets, V, 0.0f);
    kn_cuda_ok(c, cudaFree(l32), "crossentropy fp32 logits");
}

void cuda_crossentropy_fwd_bwd(kn_ctx *c, kn_dtype dt, float *losses, void *dlogits, const void *logits,
                               const int32_t *targets, int N, int V, float scale)
{
    if (N <= 0 || V <= 0)
        return;
    if (dt == KN_F32) {
        KN_LAUNCH(k_crossentropy, N, CE_THREADS, 0, c, losses, (float *)dlogits, (const float *)logits, targets,
                  V, scale);
        return;
    }
    float *l32 = widened(c, dt, logits, (size_t)N * V);
    if (!l32)
        return;
    KN_LAUNCH(k_crossentropy, N, CE_THREADS, 0, c, losses, l32, (const float *)l32, targets, V, scale);
    cuda_convert(c, dlogits, dt, l32, KN_F32, (size_t)N * V);
    kn_cuda_ok(c, cudaFree(l32), "crossentropy fp32 logits");
}

} // namespace KN_NS
