/* cuda_matmul_gelu.cu — the linear + GELU pair in cuBLASLt's epilogue.
 *
 * Forward: out = gelu(x w^T + b) is one cublasLtMatmul with the
 * GELU_AUX_BIAS epilogue (GELU_AUX without a bias): D = out, and the GELU
 * input -- the pre-activation the backward needs -- is written as the aux
 * matrix, so the [N, M] pre-activation is not read back by a second kernel.
 * Backward: dpre = (dout w) * gelu'(pre) is the next linear's dx product
 * with the DGELU epilogue reading pre as aux: again no separate pass.
 * The column-major view is cuda_matmul.cu's (D = out^T, M x N, ld M), so
 * aux is pre^T with ld M (forward) or K (backward). A 16-bit run hands its
 * 16-bit x / pre to the ops as they are (x_dt, pre_dt): they are cuBLASLt's
 * bf16 / fp16 B operand and aux matrix directly, nothing is converted; an
 * fp32 tensor holding dt values (dout, the engine's gradients) is copied to
 * dt in scratch first (kn_cuda_acts16), exact.
 *
 * Where cuBLASLt does not fuse (its rule: the aux leading dimension is a
 * multiple of 8; and any type / architecture combination its heuristic
 * refuses, remembered per shape by the plan cache), the same op runs as
 * the GEMM (bias epilogue) plus one elementwise kernel: the documented
 * fallback, which is also the reference semantics' rounding for 16-bit
 * weights (kernels.h). The bias gradient of the backward is not cuBLASLt's
 * DGELU_BGRAD: the reference sums dpre as stored (rounded to a 16-bit
 * pre_dt), and cuBLASLt does not say whether its epilogue sums before or
 * after that rounding; kn_cuda_colsum_acc sums the stored dpre (one
 * deterministic pass, no atomics). */
#include "kn_cuda.cuh"
#include "kn_cuda16.cuh"
#include "kn_gelu.cuh"
#include "kn_vec.cuh"

namespace KN_NS {

/* out = gelu(pre), both of type P::first (fp32 or 16-bit), pre read
 * rounded to P::second (the weight's type). */
template <typename P>
__global__ void k_gelu_of(typename P::first *out, const typename P::first *pre, size_t n, int vec)
{
    typedef typename P::second R;
    kn_for_packs<KN_VEC_W(typename P::first)>(n, [&](auto w, size_t i) {
        float v[KN_PACK_N(w)];
        kn_load(v, pre + i, vec);
        for (int k = 0; k < KN_PACK_N(w); k++)
            v[k] = kn_gelu(kn_round_to<R>(v[k]));
        kn_store(out + i, v, vec);
    });
}

/* dpre = round(round(dact) * gelu'(pre)): dact the fp32 product, pre and
 * dpre of type P::first (dpre may be dact itself when that is fp32),
 * rounding to P::second. */
template <typename P>
__global__ void k_dgelu_mul(typename P::first *dpre, const float *dact,
                            const typename P::first *pre, size_t n, int vec)
{
    typedef typename P::second R;
    kn_for_packs<KN_VEC_W(typename P::first)>(n, [&](auto w, size_t i) {
        float d[KN_PACK_N(w)], v[KN_PACK_N(w)];
        kn_load(d, dact + i, vec);
        kn_load(v, pre + i, vec);
        for (int k = 0; k < KN_PACK_N(w); k++)
            d[k] = kn_round_to<R>(kn_round_to<R>(d[k]) * kn_gelu_grad(v[k]));
        kn_store(dpre + i, d, vec);
    });
}

template <typename T, typename R>
static void launch_gelu_of(kn_ctx *c, void *out, const void *pre, size_t n)
{
    typedef kn_pair<T, R> P;
    KN_IO(k_gelu_of<P>, n * sizeof(T), n * sizeof(T), 0);
    KN_LAUNCH(k_gelu_of<P>, kn_pack_blocks(n, KN_VEC_W(T), 256), 256, 0, c, (T *)out,
              (const T *)pre, n, kn_aligned16(out, pre));
}
template <typename T, typename R>
static void launch_dgelu_mul(kn_ctx *c, void *dpre, const float *dact, const void *pre, size_t n)
{
    typedef kn_pair<T, R> P;
    KN_IO(k_dgelu_mul<P>, n * (4 + sizeof(T)), n * sizeof(T), 0);
    KN_LAUNCH(k_dgelu_mul<P>, kn_pack_blocks(n, KN_VEC_W(T), 256), 256, 0, c, (T *)dpre, dact,
              (const T *)pre, n, kn_aligned16(dpre, dact, pre));
}
/* The rounding type picked, for activations of type T: a 16-bit T is the
 * weight's own type (types_ok), so only fp32 activations need the choice
 * (and only the pairs that occur are compiled). */
template <typename T>
static void gelu_of(kn_ctx *c, kn_dtype round_dt, void *out, const void *pre, size_t n)
{
    if constexpr (sizeof(T) == 2)
        launch_gelu_of<T, T>(c, out, pre, n);
    else if (round_dt == KN_BF16)
        launch_gelu_of<T, kn_bf16>(c, out, pre, n);
    else if (round_dt == KN_F16)
        launch_gelu_of<T, kn_f16>(c, out, pre, n);
    else
        launch_gelu_of<T, float>(c, out, pre, n);
}
template <typename T>
static void dgelu_mul(kn_ctx *c, kn_dtype round_dt, void *dpre, const float *dact, const void *pre,
                      size_t n)
{
    if constexpr (sizeof(T) == 2)
        launch_dgelu_mul<T, T>(c, dpre, dact, pre, n);
    else if (round_dt == KN_BF16)
        launch_dgelu_mul<T, kn_bf16>(c, dpre, dact, pre, n);
    else if (round_dt == KN_F16)
        launch_dgelu_mul<T, kn_f16>(c, dpre, dact, pre, n);
    else
        launch_dgelu_mul<T, float>(c, dpre, dact, pre, n);
}

/* The weight's dtype, and each activation's: fp32 or the weight's. */
static int types_ok(kn_ctx *c, kn_dtype dt, kn_dtype a_dt, kn_dtype b_dt, const char *op)
{
    if ((dt == KN_F32 || dt == KN_BF16 || dt == KN_F16) && (a_dt == KN_F32 || a_dt == dt) &&
        (b_dt == KN_F32 || b_dt == dt))
        return 1;
    kn_fail(c, TY_EINVAL,
            "%s: weight dtype %s with %s / %s activations (each is f32 or the weight's)", op,
            kn_dtype_name(dt), kn_dtype_name(a_dt), kn_dtype_name(b_dt));
    return 0;
}

/* cuBLASLt's aux matrix rules: ld a multiple of 8, 16-byte aligned. */
static int aux_ok(const void *aux, int ld)
{
    return ld % 8 == 0 && (uintptr_t)aux % 16 == 0;
}

/* An activation as the GEMM's operand: itself when it is in dt (fp32 runs,
 * and 16-bit runs passing their 16-bit tensors), else its dt copy. */
static const void *operand(kn_ctx *c, kn_dtype dt, const void *a, kn_dtype a_dt, size_t n)
{
    return a_dt == dt ? a : kn_cuda_acts16(c, dt, (const float *)a, n);
}

void cuda_matmul_gelu_fwd(kn_ctx *c, kn_dtype dt, kn_dtype out_dt, kn_dtype x_dt, void *out,
                          void *pre, const void *x, const void *w, const void *bias, kn_dtype b_dt,
                          int N, int K, int M)
{
    if (N <= 0 || M <= 0 || !types_ok(c, dt, out_dt, x_dt, "matmul_gelu_fwd") ||
        !kn_bias_dtype_ok(c, dt, b_dt, "matmul_gelu_fwd"))
        return;
    const void *B = x; /* x as the GEMM's operand, in dt */
    if (K > 0 && !(B = operand(c, dt, x, x_dt, (size_t)N * K)))
        return;
    int epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    if (K > 0 && aux_ok(pre, M)) {
        int r = kn_cuda_gemm_epi(c, out, out_dt, w, B, dt, epi, bias, b_dt, pre, M, M, N, K, 1, 0, K, K, M,
                                 0.0f);
        if (r)
            return; /* done, or failed with the context's error set */
    }
    if (K > 0)
        kn_cuda_gemm(c, pre, out_dt, w, B, dt, bias, b_dt, M, N, K, 1, 0, K, K, M, 0.0f);
    else /* an empty product: pre = bias (matmul_fwd's rule) */
        cuda_matmul16_fwd(c, dt, out_dt, x_dt, pre, x, w, bias, b_dt, N, K, M);
    size_t n = (size_t)N * M;
    KN_BY_DTYPE(out_dt, gelu_of, c, dt, out, pre, n);
}

/* cuBLASLt's aux matrix has D's type, and dpre is stored in pre's type:
 * the epilogue writes dpre itself (a 16-bit run's dpre rounded once, from
 * the fp32 product times gelu'(pre)), which the next linear's GEMMs and
 * the bias gradient read as it is. */
void cuda_matmul_dgelu(kn_ctx *c, kn_dtype dt, kn_dtype dout_dt, kn_dtype pre_dt, void *dpre,
                       float *dbias, const void *dout, const void *w, const void *pre, int N, int K,
                       int M)
{
    if (N <= 0 || K <= 0 || !types_ok(c, dt, dout_dt, pre_dt, "matmul_dgelu"))
        return;
    size_t n = (size_t)N * K, es = kn_dtype_size(pre_dt);
    if (M <= 0) { /* an empty product: dpre = 0 */
        kn_cuda_ok(c, cudaMemsetAsync(dpre, 0, n * es, kn_cuda_st(c)->stream), "matmul_dgelu");
        return;
    }
    const void *B = operand(c, dt, dout, dout_dt, (size_t)N * M);
    if (!B)
        return;
    /* dpre^T[K,N] = w^T[K,M] dout^T[M,N]: A = w as K x M col-major (matmul_bwd's dx). */
    int r = 0;
    if (aux_ok(pre, K)) {
        r = kn_cuda_gemm_epi(c, dpre, pre_dt, w, B, dt, CUBLASLT_EPILOGUE_DGELU, nullptr, KN_F32, pre, K, K,
                             N, M, 0, 0, K, M, K, 0.0f);
        if (r < 0)
            return;
    }
    if (!r) { /* the fp32 product, then the derivative and the rounding */
        float *dact = pre_dt == KN_F32 ? (float *)dpre
                                       : (float *)kn_cuda_scratch(c, KN_SCRATCH_O32, n * 4);
        if (!dact)
            return;
        kn_cuda_gemm(c, dact, KN_F32, w, B, dt, nullptr, KN_F32, K, N, M, 0, 0, K, M, K, 0.0f);
        KN_BY_DTYPE(pre_dt, dgelu_mul, c, dt, dpre, dact, pre, n);
    }
    if (dbias)
        kn_cuda_colsum_acc(c, dbias, dpre, pre_dt, N, K);
}

} // namespace KN_NS
