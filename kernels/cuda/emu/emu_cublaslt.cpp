/* emu_cublaslt.cpp — cuBLASLt on the CPU for the emulated backend: every
 * matmul becomes one column-major cblas_sgemm (OpenBLAS, already the CPU
 * backend's library), D = alpha op(A) op(B) + beta C, then + bias per row
 * of D (cuBLASLt's BIAS epilogue: one value per row of the column-major
 * result). In-place C == D is all kernels/cuda needs and all we accept. */
#include "emu_cublaslt.h"

#include <atomic>
#include <cblas.h>
#include <cstdlib>
#include <vector>

#include "../kn_cuda16.cuh" /* the same bf16 / fp16 rounding as the kernels */
#include "../kn_gelu.cuh"   /* and the same GELU */

using kn_cuda_emu_ns::from_bf16;
using kn_cuda_emu_ns::from_f16;
using kn_cuda_emu_ns::kn_gelu;
using kn_cuda_emu_ns::kn_gelu_grad;
using kn_cuda_emu_ns::to_bf16;
using kn_cuda_emu_ns::to_f16;

struct emu_lt {
    int unused;
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = new emu_lt{0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct,
                                        cudaDataType_t st)
{
    if (ct != CUBLAS_COMPUTE_32F || st != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = new emu_lt_desc{CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, nullptr, -1, nullptr, 0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void *buf,
                                              size_t size)
{
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
        if (size != sizeof(cublasOperation_t))
            return CUBLAS_STATUS_INVALID_VALUE;
        cublasOperation_t op = *(const cublasOperation_t *)buf;
        (a == CUBLASLT_MATMUL_DESC_TRANSA ? d->ta : d->tb) = op;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (size != sizeof(cublasLtEpilogue_t))
            return CUBLAS_STATUS_INVALID_VALUE;
        d->epi = *(const cublasLtEpilogue_t *)buf;
        return d->epi == CUBLASLT_EPILOGUE_DEFAULT || d->epi == CUBLASLT_EPILOGUE_BIAS ||
                       d->epi == CUBLASLT_EPILOGUE_GELU_AUX ||
                       d->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || d->epi == CUBLASLT_EPILOGUE_DGELU
                   ? CUBLAS_STATUS_SUCCESS
                   : CUBLAS_STATUS_NOT_SUPPORTED;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        if (size != sizeof(void *))
            return CUBLAS_STATUS_INVALID_VALUE;
        d->aux = *(const void *const *)buf;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        if (size != sizeof(int64_t))
            return CUBLAS_STATUS_INVALID_VALUE;
        d->aux_ld = *(const int64_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (size != sizeof(void *))
            return CUBLAS_STATUS_INVALID_VALUE;
        d->bias = *(const void *const *)buf;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        if (size != sizeof(int32_t))
            return CUBLAS_STATUS_INVALID_VALUE;
        d->bias_type = *(const int32_t *)buf;
        return d->bias_type == CUDA_R_32F ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t t,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (t != CUDA_R_32F && t != CUDA_R_16BF && t != CUDA_R_16F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (ld < (int64_t)rows || ld < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    *l = new emu_lt_layout{t, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = new emu_lt_pref{0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *buf, size_t size)
{
    if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES)
        return size == sizeof(uint32_t) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    if (a != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES || size != sizeof(uint64_t))
        return CUBLAS_STATUS_INVALID_VALUE;
    p->ws = *(const uint64_t *)buf;
    return CUBLAS_STATUS_SUCCESS;
}

/* The fp32 copy of a (possibly 16-bit) column-major matrix, ld kept. */
static void widen(std::vector<float> &out, const void *p, const emu_lt_layout *l)
{
    size_t n = l->cols ? (size_t)(l->cols - 1) * (size_t)l->ld + l->rows : 0;
    out.resize(n ? n : 1);
    for (size_t i = 0; i < n; i++) {
        if (l->type == CUDA_R_32F) {
            out[i] = ((const float *)p)[i];
            continue;
        }
        uint16_t h = ((const uint16_t *)p)[i];
        out[i] = l->type == CUDA_R_16BF ? from_bf16(h) : from_f16(h);
    }
}

/* The op(X) shape a layout describes. */
static void op_shape(const emu_lt_layout *l, cublasOperation_t op, uint64_t *r, uint64_t *c)
{
    *r = op == CUBLAS_OP_N ? l->rows : l->cols;
    *c = op == CUBLAS_OP_N ? l->cols : l->rows;
}

static bool has_bias(cublasLtMatmulDesc_t d)
{
    return d->epi == CUBLASLT_EPILOGUE_BIAS || d->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
static bool has_aux(cublasLtMatmulDesc_t d)
{
    return d->epi == CUBLASLT_EPILOGUE_GELU_AUX || d->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
           d->epi == CUBLASLT_EPILOGUE_DGELU;
}

static cublasStatus_t check_shapes(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                   cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                   cublasLtMatrixLayout_t dl)
{
    uint64_t ar, ac, br, bc;
    op_shape(a, d->ta, &ar, &ac);
    op_shape(b, d->tb, &br, &bc);
    if (ac != br || c->rows != ar || c->cols != bc || dl->rows != ar || dl->cols != bc ||
        c->ld != dl->ld)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* The type combinations cuBLASLt's COMPUTE_32F offers and we model. */
    if (a->type != b->type || c->type != dl->type ||
        (dl->type != CUDA_R_32F && dl->type != a->type))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* The GELU input matrix: D's shape and type, ld a multiple of 8. */
    if (has_aux(d) && (d->aux_ld < (int64_t)dl->rows || d->aux_ld % 8))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (has_bias(d) && d->bias_type != CUDA_R_32F && dl->type != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED; /* a 16-bit bias is not modelled */
    return CUBLAS_STATUS_SUCCESS;
}

/* Heuristic queries and matmuls so far, process-wide (emu_lt_calls): what
 * kernels.cuda_emu.plans reads to see that a shape's algorithm is asked
 * for once and then only cublasLtMatmul runs. */
static std::atomic<long> n_heuristic{0}, n_matmul{0};

extern "C" void emu_lt_calls(long *heuristic, long *matmul)
{
    *heuristic = n_heuristic.load();
    *matmul = n_matmul.load();
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t *res, int *returned)
{
    n_heuristic++;
    *returned = 0;
    if (requested < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t s = check_shapes(d, a, b, c, dl);
    if (s)
        return s;
    res[0] = cublasLtMatmulHeuristicResult_t{};
    res[0].algo.id = 1;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Al, const void *B,
                              cublasLtMatrixLayout_t Bl, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cl, void *D, cublasLtMatrixLayout_t Dl,
                              const cublasLtMatmulAlgo_t *algo, void *, size_t, cudaStream_t)
{
    emu_device_guard dg;
    n_matmul++;
    if (!h || !algo || algo->id != 1)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasStatus_t s = check_shapes(d, Al, Bl, Cl, Dl);
    if (s)
        return s;
    if (C != D) /* out of place is legal in cuBLASLt but unused here */
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if ((has_bias(d) && !d->bias) || (has_aux(d) && !d->aux))
        return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t m, k, n, kb;
    op_shape(Al, d->ta, &m, &k);
    op_shape(Bl, d->tb, &kb, &n);
    float al = *(const float *)alpha, be = *(const float *)beta;
    /* 16-bit operands are widened into fp32 copies (exact), the result is
     * computed in fp32 and, for a 16-bit D, rounded back at the end. */
    std::vector<float> a32, b32, d32;
    if (Al->type != CUDA_R_32F) {
        widen(a32, A, Al);
        widen(b32, B, Bl);
        A = a32.data();
        B = b32.data();
    }
    float *out = (float *)D;
    if (Dl->type != CUDA_R_32F) {
        widen(d32, D, Dl);
        out = d32.data();
    }
    if (m && n) {
        if (k)
            cblas_sgemm(CblasColMajor, d->ta == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                        d->tb == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k,
                        al, (const float *)A, (int)Al->ld, (const float *)B, (int)Bl->ld, be, out,
                        (int)Dl->ld);
        else
            for (uint64_t j = 0; j < n; j++)
                for (uint64_t i = 0; i < m; i++)
                    out[j * Dl->ld + i] = be == 0.0f ? 0.0f : be * out[j * Dl->ld + i];
    }
    if (has_bias(d)) {
        const float *bias = (const float *)d->bias;
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++)
                out[j * Dl->ld + i] += bias[i];
    }
    if (has_aux(d)) /* GELU after the bias: aux keeps its input; DGELU reads it */
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                float &v = out[j * Dl->ld + i];
                size_t a = j * (size_t)d->aux_ld + i;
                if (d->epi == CUBLASLT_EPILOGUE_DGELU) {
                    float g = Dl->type == CUDA_R_32F ? ((const float *)d->aux)[a]
                              : Dl->type == CUDA_R_16BF ? from_bf16(((const uint16_t *)d->aux)[a])
                                                        : from_f16(((const uint16_t *)d->aux)[a]);
                    v *= kn_gelu_grad(g);
                    continue;
                }
                if (Dl->type == CUDA_R_32F)
                    ((float *)d->aux)[a] = v;
                else
                    ((uint16_t *)d->aux)[a] = Dl->type == CUDA_R_16BF ? to_bf16(v) : to_f16(v);
                v = kn_gelu(v);
            }
    if (Dl->type != CUDA_R_32F) {
        uint16_t *d16 = (uint16_t *)D;
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                float v = out[j * Dl->ld + i];
                d16[j * Dl->ld + i] = Dl->type == CUDA_R_16BF ? to_bf16(v) : to_f16(v);
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}
