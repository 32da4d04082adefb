/* cuda_attn.cuh — what the attention sources share.
 *
 * cuda_attention.cu holds RoPE, the scalar attention kernels, the
 * backward's row dots and the op entry points, which pick the tensor-core
 * kernels where they are built (fl_picks) and the scalar ones otherwise.
 * The tensor-core kernels (cuda_attn_flash.cuh) are launched from a
 * source each: cuda_attn_fwd.cu, cuda_attn_dq.cu and cuda_attn_dkdv.cu.
 * Each instantiates its kernel for every head dim, type and shared-memory
 * limit, at every architecture, which makes them nvcc's longest compiles:
 * as separate sources they build in parallel. This header has the score
 * rules both kinds of kernel apply, the arguments the flash launchers
 * take, their declarations, and the emulation's byte counts (KN_IO). */
#ifndef TY_CUDA_ATTN_CUH
#define TY_CUDA_ATTN_CUH

#include "kn_cuda.cuh"
#include "kn_cuda16.cuh"

namespace KN_NS
{

/* The score of a visible pair: scaled, then soft-capped when cap > 0; *dt
 * gets the cap's derivative (1 when off). */
__device__ __forceinline__ float att_score(float dot, float scale, float cap, float *dt)
{
    float s = dot * scale;
    if (cap > 0.0f) {
        float t = tanhf(s / cap);
        *dt = 1.0f - t * t;
        return cap * t;
    }
    *dt = 1.0f;
    return s;
}

/* First key column row i sees. */
__device__ __forceinline__ int att_lo(int i, int window)
{
    return window > 0 ? max(0, i - window + 1) : 0;
}

/* What k_fl_rowdot prepares for both backward kernels from dO: D_i =
 * rowsum(dO_i * O_i) per row and head (laid out as lse), and dO in the
 * input type ([B, T, Hq, D]: the op's dout where a producer stored it in
 * that type, else dout rounded into scratch), so the kernels stage it as
 * they stage Q, 16 bytes a load, and convert none of it again for every
 * key block. */
struct fl_grad {
    const float *Dd;
    const uint16_t *dO;
};

/* The options, and the type the backward stores dq, dk, dv in (gdt:
 * fp32 or the input type, kernels.h). */
struct fl_args {
    float scale, cap;
    int window, gdt;
};

/* The tensor-core launchers: the kernel for head dim D (64, 80, 96, 128
 * or 256) and 16-bit type dt, in the most warps a block the device's
 * shared memory allows; false, launching nothing, when no configuration
 * fits (the scalar kernel runs instead). */
bool fl_fwd_launch(kn_ctx *c, kn_dtype dt, int D, void *out, float *lse, const void *q,
                   const void *k, const void *v, int B, int Tq, int Tk, int Hq, int Hkv, int ldq,
                   int ldkv, fl_args a);
bool fl_dq_launch(kn_ctx *c, kn_dtype dt, int D, void *dq, fl_grad g, const float *lse,
                  const void *q, const void *k, const void *v, int B, int T, int Hq, int Hkv,
                  int ldq, int ldkv, fl_args a);
bool fl_dkdv_launch(kn_ctx *c, kn_dtype dt, int D, void *dk, void *dv, fl_grad g,
                    const float *lse, const void *q, const void *k, const void *v, int B, int T,
                    int Hq, int Hkv, int ldq, int ldkv, fl_args a);

#ifdef KN_CUDA_EMU /* only the emulation counts (KN_IO) */
/* KN_IO's figures. The (query, key) pairs a head scores: causal, inside
 * the window; each costs 2 D FLOPs per product with a row of K or V (the
 * forward: QK and PV; dq: QK, dO V and dS K; dk/dv: QK, dO V, P dO, dS Q).
 * Bytes of one pass over the tensors (kinds: 0 the forward's reads, 1
 * its writes, 2 dq's reads, 3 dk/dv's reads less dk and dv themselves;
 * ot: dout's type). */
static inline uint64_t att_pairs(int Tq, int Tk, int window)
{
    uint64_t n = 0;
    for (int i = Tk - Tq; i < Tk; i++)
        n += (uint64_t)(window > 0 && window < i + 1 ? window : i + 1);
    return n;
}
/* The bytes the backward writes for gradients a and b (either NULL),
 * each [B, T, H, D] in type gt. */
static inline uint64_t att_grad_bytes(const void *a, const void *b, int gt, int B, int T, int H,
                                      int D)
{
    return kn_dtype_size((kn_dtype)gt) * (uint64_t)B * T * H * D * (!!a + !!b);
}
static inline uint64_t att_bytes(int xt, int B, int Tq, int Tk, int Hq, int Hkv, int D, int kind,
                                 int ot = KN_F32)
{
    uint64_t es = kn_dtype_size((kn_dtype)xt), q = (uint64_t)B * Tq * Hq * D,
             kv = 2 * (uint64_t)B * Tk * Hkv * D, lse = 4 * (uint64_t)B * Hq * Tq;
    if (kind == 1)
        return q * es + lse;
    uint64_t r = (q + kv) * es;
    if (kind >= 2) /* dout (of type ot), out, lse */
        r += q * kn_dtype_size((kn_dtype)ot) + q * es + lse;
    return r;
}
/* A flash backward kernel's reads: q, k, v, dO in the input type, lse,
 * and the row dots (k_fl_rowdot) in place of out. */
static inline uint64_t fl_bwd_bytes(int xt, int B, int T, int Hq, int Hkv, int D)
{
    uint64_t q = (uint64_t)B * T * Hq * D, lse = 4 * (uint64_t)B * Hq * T;
    return att_bytes(xt, B, T, T, Hq, Hkv, D, 0) + q * kn_dtype_size((kn_dtype)xt) + 2 * lse;
}
#endif

} // namespace KN_NS

#endif
