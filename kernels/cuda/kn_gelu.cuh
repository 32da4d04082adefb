/* kn_gelu.cuh — GELU (tanh approximation, GPT-2's gelu_new) and its
 * derivative, for the GELU kernels (cuda_elementwise.cu), the fallback of
 * the fused matmul + GELU (cuda_matmul_gelu.cu) and the emulated cuBLASLt
 * epilogues (emu/emu_cublaslt.cpp), so all three compute the same values.
 * Include inside or after kn_cuda.cuh. */
#ifndef TY_KN_GELU_CUH
#define TY_KN_GELU_CUH

#include "kn_cuda.cuh"

namespace KN_NS {

#define KN_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define KN_GELU_A 0.044715f

__device__ __forceinline__ float kn_gelu(float v)
{
    return 0.5f * v * (1.0f + tanhf(KN_GELU_K * (v + KN_GELU_A * v * v * v)));
}

__device__ __forceinline__ float kn_gelu_grad(float v)
{
    float t = tanhf(KN_GELU_K * (v + KN_GELU_A * v * v * v));
    float dt = (1.0f - t * t) * KN_GELU_K * (1.0f + 3.0f * KN_GELU_A * v * v);
    return 0.5f * (1.0f + t) + 0.5f * v * dt;
}

} // namespace KN_NS

#endif
