/* cuda_nf4.cu — QLoRA's 4-bit NormalFloat weights: dequantise, then cuBLASLt.
 *
 * kn_nf4_matmul_* dequantise the whole weight into a scratch slot of the
 * context (kn_cuda_scratch: grown to the largest weight on first use, then
 * reused, no allocation in the steady state), round it to the compute dtype and
 * run the fp32 cuBLASLt product of cuda_matmul.cu on it — what
 * bitsandbytes' matmul_4bit does for a batch of rows (dequantize_4bit, then
 * a dense GEMM). kn_nf4_dequant stores its dtype straight from the
 * kernel: the engine's 16-bit QLoRA path (engine/qlora.c) dequantises
 * into a bf16 / fp16 weight that way and runs matmul16's 16-bit cuBLASLt
 * product on it. One thread dequantises one element. The
 * arithmetic is bitsandbytes' in fp32, each operation rounded on its own
 * (__fmul_rn / __fadd_rn: nvcc would otherwise fuse the multiply-add of the
 * double-quantised absmax), so the weights are bit-identical to the CPU
 * backend's and to bitsandbytes' dequantize_4bit. */
#include "kn_cuda.cuh"
#include "kn_cuda16.cuh"
#include "nf4_tables.h"

namespace KN_NS
{

__constant__ float c_nf4[16] = KN_NF4_LEVELS_INIT;
__constant__ float c_dyn8[256] = KN_DYN8_MAP_INIT;

__device__ __forceinline__ float nf4_absmax(const kn_nf4 &w, size_t b)
{
    if (w.absmax) return w.absmax[b];
    float a = __fmul_rn(c_dyn8[w.qabsmax[b]], w.absmax2[b / KN_NF4_BLOCK2]);
    return __fadd_rn(a, w.offset);
}

/* One thread per output element i, the tensor's element g = first + i
 * (kn_nf4: a view of a row block starts anywhere), computed in fp32 and
 * stored in dt (a 16-bit one rounded to nearest even: kn_cuda16.cuh, the
 * CPU's bits), so a 16-bit weight needs no fp32 copy on the way. */
__global__ void k_nf4_dequant(void *out, int dt, kn_nf4 w, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t g = w.first + i;
        uint8_t byte = w.codes[g / 2];
        store_from_f32(out, dt, i,
                       __fmul_rn(c_nf4[g & 1 ? byte & 15 : byte >> 4],
                                 nf4_absmax(w, g / KN_NF4_BLOCK)));
    }
}

#ifdef KN_CUDA_EMU /* only the emulation counts (KN_IO) */
/* KN_IO's read bytes of a dequantisation of n elements from `first`:
 * the codes, the block scales (8-bit codes, or fp32 when not double
 * quantised) and the second-level scales. */
static inline uint64_t nf4_read_bytes(const kn_nf4 &w, size_t n)
{
    uint64_t blocks = n / KN_NF4_BLOCK + 1;
    return (n + 1) / 2 + (w.absmax ? 4 * blocks : blocks + 4 * (blocks / KN_NF4_BLOCK2 + 1));
}
#endif

/* The context's fp32 scratch of n floats (a kn_cuda_scratch slot). */
static float *nf4_scratch(kn_ctx *c, size_t n)
{
    return (float *)kn_cuda_scratch(c, KN_SCRATCH_NF4, n * sizeof(float));
}

/* deq(w) rounded to dt, in the scratch; nullptr after a failure. */
static float *dequant(kn_ctx *c, const kn_nf4 &w, size_t n, kn_dtype dt)
{
    float *s = nf4_scratch(c, n);
    KN_IO(k_nf4_dequant, nf4_read_bytes(w, n), 4 * n, 0);
    if (!s) return nullptr;
    KN_LAUNCH(k_nf4_dequant, kn_blocks(n, 256), 256, 0, c, (void *)s, (int)KN_F32, w, n);
    cuda_round(c, s, n, dt);
    return s;
}

void cuda_nf4_dequant(kn_ctx *c, void *out, kn_dtype dt, kn_nf4 w, size_t n)
{
    if (!n) return;
    KN_IO(k_nf4_dequant, nf4_read_bytes(w, n), kn_dtype_size(dt) * n, 0);
    KN_LAUNCH(k_nf4_dequant, kn_blocks(n, 256), 256, 0, c, out, (int)dt, w, n);
}

void cuda_nf4_matmul_fwd(kn_ctx *c, kn_dtype dt, float *out, const float *x, kn_nf4 w,
                         const float *bias, int N, int K, int M)
{
    if (N <= 0 || M <= 0) return;
    const float *s = dequant(c, w, (size_t)M * K, dt);
    if (s) cuda_matmul_fwd(c, out, x, s, bias, N, K, M);
}

void cuda_nf4_matmul_bwd(kn_ctx *c, kn_dtype dt, float *dx, const float *dout, kn_nf4 w, int N,
                         int K, int M)
{
    if (N <= 0 || M <= 0 || K <= 0 || !dx) return;
    const float *s = dequant(c, w, (size_t)M * K, dt);
    if (s) cuda_matmul_bwd(c, dx, nullptr, nullptr, dout, nullptr, s, N, K, M);
}

} // namespace KN_NS
