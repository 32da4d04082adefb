/* cuda_matmul.cu — linear layers on cuBLASLt.
 *
 * Row-major out[N,M] = x[N,K] w[M,K]^T is, read column-major, the product
 * out^T[M,N] = op(w)[M,K] x^T[K,N]: A = w (K x M col-major, transposed),
 * B = x (K x N col-major), D = out (M x N, ld M), the bias added by the
 * BIAS epilogue (one value per row of D = per output feature). Backward:
 * dx^T[K,N] += w^T[K,M] dout^T[M,N] and dw^T[K,M] += x^T[K,N] dout[N,M]
 * (beta = 1 gives the accumulate convention). dbias is a column sum of
 * dout, one thread per column, rows in order (deterministic).
 * Compute is CUBLAS_COMPUTE_32F: true fp32, no TF32, so fp32 results are
 * comparable with the CPU's sgemm. kn_cuda_gemm also takes bf16 / fp16 A
 * and B (the tensor-core path of matmul16, cuda_convert.cu) with an fp32 or
 * same-type D, still with fp32 accumulation; the bias stays fp32. The
 * algorithm of each (shape, transposes, epilogue, types, pointer alignment)
 * is asked of the heuristic once and cached in the context with its
 * descriptors; the steady state calls only cublasLtMatmul. The alignment
 * (the largest power of two, up to 256, dividing every pointer) is part of
 * the key and told to the heuristic, because the engine passes views into
 * its arenas and cuBLASLt otherwise assumes 256-byte aligned operands.
 * kn_cuda_gemm_epi adds the GELU epilogues (cuda_matmul_gelu.cu): their
 * aux matrix pointer is told to the heuristic (cuBLASLt derives the
 * alignment from it) and its leading dimension is part of the key; a
 * shape cuBLASLt has no fused algorithm for is remembered as such, so the
 * caller's unfused path is chosen once, not asked for on every call.
 * Under cuda-emu the same calls go to a CPU reference (emu_cublaslt.cpp). */
#include "kn_cuda.cuh"
#include "kn_cuda16.cuh"

#include <stdlib.h>

namespace KN_NS {

struct cuda_gemm_plan {
    int m, n, k, ta, tb, epi, lda, ldb, ldd, dt_ab, dt_d;
    int64_t ldaux;
    unsigned align;
    int fused; /* 0: a GELU epilogue cuBLASLt has no algorithm for (no descriptors) */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
};

void kn_cuda_gemm_plans_free(cuda_state *st)
{
    for (int i = 0; i < st->n_plans; i++) {
        cuda_gemm_plan *p = &st->plans[i];
        if (!p->fused)
            continue;
        cublasLtMatmulDescDestroy(p->op);
        cublasLtMatrixLayoutDestroy(p->a);
        cublasLtMatrixLayoutDestroy(p->b);
        cublasLtMatrixLayoutDestroy(p->d);
    }
    free(st->plans);
    st->plans = nullptr;
    st->n_plans = st->cap_plans = 0;
}

static int lt_ok(kn_ctx *c, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 1;
    kn_fail(c, TY_EIO, "cuBLASLt %s failed (status %d)", what, (int)s);
    return 0;
}

static cudaDataType_t lt_type(int dt)
{
    return dt == KN_BF16 ? CUDA_R_16BF : dt == KN_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* The largest power of two (at most 256) dividing every given address. */
static unsigned ptr_align(const void *a, const void *b, const void *d, const void *bias,
                          const void *aux)
{
    uintptr_t u = (uintptr_t)a | (uintptr_t)b | (uintptr_t)d | (uintptr_t)bias | (uintptr_t)aux | 256u;
    return (unsigned)(u & (~u + 1));
}

/* Finds or builds the plan for D[m,n] = op(A) op(B) (column-major) with
 * epilogue epi. For a GELU epilogue (aux given) a refusal by cuBLASLt is
 * not an error: the plan is kept with fused = 0. */
static cuda_gemm_plan *gemm_plan(kn_ctx *c, int m, int n, int k, int ta, int tb, int epi,
                                 int lda, int ldb, int ldd, int dt_ab, int dt_d, unsigned align,
                                 const void *aux, int64_t ldaux)
{
    int bias = epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    cuda_state *st = kn_cuda_st(c);
    for (int i = 0; i < st->n_plans; i++) {
        cuda_gemm_plan *p = &st->plans[i];
        if (p->m == m && p->n == n && p->k == k && p->ta == ta && p->tb == tb && p->epi == epi &&
            p->lda == lda && p->ldb == ldb && p->ldd == ldd && p->dt_ab == dt_ab && p->dt_d == dt_d &&
            p->align == align && p->ldaux == ldaux)
            return p;
    }
    if (st->n_plans == st->cap_plans) {
        int cap = st->cap_plans ? st->cap_plans * 2 : 16;
        void *np = realloc(st->plans, (size_t)cap * sizeof *st->plans);
        if (!np) {
            kn_fail(c, TY_ENOMEM, "out of memory caching a matmul plan");
            return nullptr;
        }
        st->plans = (cuda_gemm_plan *)np;
        st->cap_plans = cap;
    }
    cuda_gemm_plan p = {m,   n,     k,     ta, tb,      epi,     lda,     ldb,     ldd, dt_ab,
                        dt_d, ldaux, align, 1,  nullptr, nullptr, nullptr, nullptr, {}};
    cudaDataType_t tab = lt_type(dt_ab), td = lt_type(dt_d);
    int32_t bias_type = CUDA_R_32F;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t lt_epi = (cublasLtEpilogue_t)epi;
    uint64_t ws = st->lt_ws_bytes;
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulHeuristicResult_t h = {};
    int got = 0;
    int ok = lt_ok(c, cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc") &&
             lt_ok(c, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                                     sizeof opa), "transa") &&
             lt_ok(c, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                                     sizeof opb), "transb") &&
             lt_ok(c, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &lt_epi,
                                                     sizeof lt_epi), "epilogue") &&
             (!aux ||
              (lt_ok(c, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                       &aux, sizeof aux), "aux pointer") &&
               lt_ok(c, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                       &ldaux, sizeof ldaux), "aux ld"))) &&
             (!bias || td == CUDA_R_32F ||
              lt_ok(c, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                      &bias_type, sizeof bias_type), "bias type")) &&
             lt_ok(c, cublasLtMatrixLayoutCreate(&p.a, tab, ta ? k : m, ta ? m : k, lda),
                   "layout A") &&
             lt_ok(c, cublasLtMatrixLayoutCreate(&p.b, tab, tb ? n : k, tb ? k : n, ldb),
                   "layout B") &&
             lt_ok(c, cublasLtMatrixLayoutCreate(&p.d, td, m, n, ldd), "layout D") &&
             lt_ok(c, cublasLtMatmulPreferenceCreate(&pref), "preference") &&
             lt_ok(c, cublasLtMatmulPreferenceSetAttribute(
                          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                   "workspace preference") &&
             lt_ok(c, cublasLtMatmulPreferenceSetAttribute(
                          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, sizeof align),
                   "alignment A") &&
             lt_ok(c, cublasLtMatmulPreferenceSetAttribute(
                          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, sizeof align),
                   "alignment B") &&
             lt_ok(c, cublasLtMatmulPreferenceSetAttribute(
                          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align, sizeof align),
                   "alignment C") &&
             lt_ok(c, cublasLtMatmulPreferenceSetAttribute(
                          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align, sizeof align),
                   "alignment D") &&
             1;
    cublasStatus_t hs = CUBLAS_STATUS_NOT_SUPPORTED;
    if (ok)
        hs = cublasLtMatmulAlgoGetHeuristic(st->lt, p.op, p.a, p.b, p.d, p.d, pref, 1, &h, &got);
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    int refused = ok && (hs != CUBLAS_STATUS_SUCCESS || got < 1);
    if (refused && aux) {
        p.fused = 0; /* the caller's unfused path, from now on without asking */
        ok = 0;
    } else if (ok && !lt_ok(c, hs, "heuristic")) {
        ok = 0;
    } else if (refused) {
        kn_fail(c, TY_EIO, "cuBLASLt has no algorithm for %dx%dx%d (%s operands, %s result)", m, n, k,
                kn_dtype_name((kn_dtype)dt_ab), kn_dtype_name((kn_dtype)dt_d));
        ok = 0;
    }
    if (!ok) {
        if (p.op)
            cublasLtMatmulDescDestroy(p.op);
        if (p.a)
            cublasLtMatrixLayoutDestroy(p.a);
        if (p.b)
            cublasLtMatrixLayoutDestroy(p.b);
        if (p.d)
            cublasLtMatrixLayoutDestroy(p.d);
        if (p.fused)
            return nullptr;
        p.op = nullptr, p.a = p.b = p.d = nullptr;
    }
    p.algo = h.algo;
    st->plans[st->n_plans] = p;
    return &st->plans[st->n_plans++];
}

int kn_cuda_gemm_epi(kn_ctx *c, void *D, int dt_d, const void *A, const void *B, int dt_ab, int epi,
                     const float *bias, const void *aux, int64_t ldaux, int m, int n, int k, int ta,
                     int tb, int lda, int ldb, int ldd, float beta)
{
    cuda_state *st = kn_cuda_st(c);
    cuda_gemm_plan *p = gemm_plan(c, m, n, k, ta, tb, epi, lda, ldb, ldd, dt_ab, dt_d,
                                  ptr_align(A, B, D, bias, aux), aux, aux ? ldaux : 0);
    if (!p)
        return -1;
    if (!p->fused)
        return 0;
    if (bias && !lt_ok(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                         &bias, sizeof bias), "bias pointer"))
        return -1;
    if (aux && !lt_ok(c, cublasLtMatmulDescSetAttribute(
                             p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux),
                      "aux pointer"))
        return -1;
    float alpha = 1.0f;
    return lt_ok(c, cublasLtMatmul(st->lt, p->op, &alpha, A, p->a, B, p->b, &beta, D, p->d, D, p->d,
                                   &p->algo, st->lt_ws, st->lt_ws_bytes, st->stream), "matmul")
               ? 1
               : -1;
}

void kn_cuda_gemm(kn_ctx *c, void *D, int dt_d, const void *A, const void *B, int dt_ab,
                  const float *bias, int m, int n, int k, int ta, int tb, int lda, int ldb, int ldd,
                  float beta)
{
    kn_cuda_gemm_epi(c, D, dt_d, A, B, dt_ab, bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT,
                     bias, nullptr, 0, m, n, k, ta, tb, lda, ldb, ldd, beta);
}

/* The fp32 product (kn_matmul_*). */
static void gemm(kn_ctx *c, float *D, const float *A, const float *B, const float *bias, int m,
                 int n, int k, int ta, int tb, int lda, int ldb, int ldd, float beta)
{
    kn_cuda_gemm(c, D, KN_F32, A, B, KN_F32, bias, m, n, k, ta, tb, lda, ldb, ldd, beta);
}

/* dbias[M] += column sums of dout[N,M] (fp32 or 16-bit), one thread per
 * column walking the rows in order: deterministic, no atomics. */
__global__ void k_colsum_acc(float *dbias, const void *dout, int dt, int N, int M)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= M)
        return;
    float s = 0;
    for (int n = 0; n < N; n++)
        s += load_as_f32(dout, dt, (size_t)n * M + col);
    dbias[col] += s;
}

void kn_cuda_colsum_acc(kn_ctx *c, float *dbias, const void *dout, int dt, int N, int M)
{
    KN_LAUNCH(k_colsum_acc, kn_blocks((size_t)M, 128), 128, 0, c, dbias, dout, dt, N, M);
}

void cuda_matmul_fwd(kn_ctx *c, float *out, const float *x, const float *w, const float *bias,
                     int N, int K, int M)
{
    if (N <= 0 || M <= 0)
        return;
    gemm(c, out, w, x, bias, M, N, K, 1, 0, K, K, M, 0.0f);
}

void cuda_matmul_bwd(kn_ctx *c, float *dx, float *dw, float *dbias, const float *dout,
                     const float *x, const float *w, int N, int K, int M)
{
    if (N <= 0 || M <= 0 || K <= 0)
        return;
    if (dx) /* dx^T[K,N] += w^T[K,M] dout^T[M,N]: A = w as K x M col-major */
        gemm(c, dx, w, dout, nullptr, K, N, M, 0, 0, K, M, K, 1.0f);
    if (dw) /* dw^T[K,M] += x^T[K,N] (dout^T)^T[N,M]: B = dout as M x N col-major, transposed */
        gemm(c, dw, x, dout, nullptr, K, M, N, 0, 1, K, M, K, 1.0f);
    if (dbias)
        kn_cuda_colsum_acc(c, dbias, dout, KN_F32, N, M);
}

} // namespace KN_NS
