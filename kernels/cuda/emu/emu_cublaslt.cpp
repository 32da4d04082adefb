/* emu_cublaslt.cpp — cuBLASLt on the CPU for the emulated backend: every
 * matmul becomes one column-major cblas_sgemm (OpenBLAS, already the CPU
 * backend's library), D = alpha op(A) op(B) + beta C, then + bias per row
 * of D (cuBLASLt's BIAS epilogue: one value per row of the column-major
 * result), the GELU epilogues, and BGRADB (the bias gradient: each column
 * of op(B) summed over k, k in order, written to the bias pointer). In-place
 * C == D is all kernels/cuda needs and all we accept.
 *
 * The heuristic answers only inside lt_legal(), the rules of cublasLt.h
 * 13.x for what kernels/cuda asks (see the comments there); outside them,
 * or for a case TY_EMU_LT_REFUSE names, it returns no algorithm, as the
 * real one does, and the caller's fallback must take over. */
#include "emu_cublaslt.h"

#include <atomic>
#include <cblas.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
    *d = new emu_lt_desc{ct, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, nullptr, -1, nullptr,
                         -1, 0};
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
                       d->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                       d->epi == CUBLASLT_EPILOGUE_DGELU || d->epi == CUBLASLT_EPILOGUE_BGRADB
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
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: /* any value is stored; the heuristic judges */
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
        if (size != sizeof(int32_t))
            return CUBLAS_STATUS_INVALID_VALUE;
        (a == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE ? d->bias_type : d->aux_type) =
            *(const int32_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
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
    *p = new emu_lt_pref{0, {256, 256, 256, 256}};
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
    if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        if (size != sizeof(uint32_t))
            return CUBLAS_STATUS_INVALID_VALUE;
        p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = *(const uint32_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    }
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
static bool has_bgrad(cublasLtMatmulDesc_t d)
{
    return d->epi == CUBLASLT_EPILOGUE_BGRADB;
}
static bool has_aux(cublasLtMatmulDesc_t d)
{
    return d->epi == CUBLASLT_EPILOGUE_GELU_AUX || d->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
           d->epi == CUBLASLT_EPILOGUE_DGELU;
}

static size_t type_size(cudaDataType_t t)
{
    return t == CUDA_R_32F ? 4 : 2;
}

/* The largest power of two (at most 256) dividing p; 256 for NULL. */
static uint32_t align_of(const void *p)
{
    uintptr_t u = (uintptr_t)p | 256u;
    return (uint32_t)(u & (~u + 1));
}

/* The shapes agree: op(A) is m x k, op(B) k x n, C and D m x n with one
 * layout (C == D in place). */
static bool shapes_agree(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                         cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                         cublasLtMatrixLayout_t dl)
{
    uint64_t ar, ac, br, bc;
    op_shape(a, d->ta, &ar, &ac);
    op_shape(b, d->tb, &br, &bc);
    return ac == br && c->rows == ar && c->cols == bc && dl->rows == ar && dl->cols == bc &&
           c->ld == dl->ld && c->type == dl->type;
}

/* cublasLt.h 13.x's rules for what kernels/cuda asks; NULL when legal,
 * else why not. Compute CUBLAS_COMPUTE_32F with CUDA_R_32F scale (the
 * only descriptors cublasLtMatmulDescCreate accepts here) takes A and B
 * of one type: fp32 with an fp32 C/D; bf16 or fp16 with C/D of the same
 * type or fp32 (cublasLtMatmul's table of supported types). The bias
 * vector is of D's type ("Bias vector elements are the same type as the
 * elements of output matrix (Dtype)", BIAS_DATA_TYPE; the exceptions are
 * int8 IMMA and fp8 kernels, which we never use), and so is the GELU aux
 * matrix (EPILOGUE_AUX_DATA_TYPE), whose leading dimension "must be
 * divisible by 8 and be no less than the number of rows in the output
 * matrix" (EPILOGUE_AUX_LD). A bias gradient vector is of the output's
 * type too ("Bias gradient vector elements are the same type as the
 * output elements", BIAS_POINTER). An alignment told to the heuristic below a
 * matrix's element size leaves no algorithm (p NULL: not checked). */
static const char *lt_illegal(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t dl,
                              const emu_lt_pref *p)
{
    if (a->type != b->type)
        return "A and B of different types";
    if (dl->type != CUDA_R_32F && dl->type != a->type)
        return "a 16-bit D of another type than A and B";
    bool bias = has_bias(d) || has_bgrad(d), aux = has_aux(d);
    if (bias && d->bias_type != -1 && d->bias_type != (int)dl->type)
        return "a bias of another type than D";
    if (has_bgrad(d) && !d->bias)
        return "a bias gradient epilogue without its bias pointer";
    if (aux && d->aux_type != -1 && d->aux_type != (int)dl->type)
        return "a GELU aux matrix of another type than D";
    if (aux && (d->aux_ld < (int64_t)dl->rows || d->aux_ld % 8))
        return "an aux leading dimension not a multiple of 8 or below D's rows";
    if (aux && !d->aux)
        return "a GELU epilogue without its aux pointer";
    const emu_lt_layout *ls[4] = {a, b, dl, dl};
    for (int i = 0; p && i < 4; i++) /* p: NULL at matmul time (the algorithm's are checked) */
        if (p->align[i] < type_size(ls[i]->type) || (p->align[i] & (p->align[i] - 1)))
            return "a minimum alignment below the element size";
    return nullptr;
}

/* The cases TY_EMU_LT_REFUSE names, in the order of emu_lt_case_names. */
enum { CASE_BIAS, CASE_GELU, CASE_DGELU, CASE_BGRAD, CASE_16BIT, CASE_ALL, N_CASES };
static const char *const emu_lt_case_names[N_CASES] = {"bias",  "gelu", "dgelu",
                                                        "bgrad", "16bit", "all"};

/* Which cases a heuristic query is: each flag set where refusing that case
 * would refuse this query ("all" is every query). */
static void query_cases(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, bool (&is)[N_CASES])
{
    is[CASE_BIAS] = d->epi == CUBLASLT_EPILOGUE_BIAS;
    is[CASE_GELU] = d->epi == CUBLASLT_EPILOGUE_GELU_AUX || d->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    is[CASE_DGELU] = d->epi == CUBLASLT_EPILOGUE_DGELU;
    is[CASE_BGRAD] = has_bgrad(d);
    is[CASE_16BIT] = a->type != CUDA_R_32F;
    is[CASE_ALL] = true;
}

/* With TY_EMU_LT_CASES=<file>, the process writes at exit, for each case,
 * how many heuristic queries were of it ("<case> N" lines), then how many
 * TY_EMU_LT_REFUSE refused ("refused N"): so a test refuses only what a
 * model asks for, and sees that the refusal was met. */
namespace {
struct case_census {
    std::atomic<long> asked[N_CASES] = {}, refused{0};
    ~case_census()
    {
        const char *path = getenv("TY_EMU_LT_CASES");
        FILE *f = path && *path ? fopen(path, "w") : nullptr;
        if (!f)
            return;
        for (int i = 0; i < N_CASES; i++)
            fprintf(f, "%s %ld\n", emu_lt_case_names[i], asked[i].load());
        fprintf(f, "refused %ld\n", refused.load());
        fclose(f);
    }
};
case_census g_census;
} // namespace

/* TY_EMU_LT_REFUSE: the cases the heuristic refuses on request; every
 * query is counted by case for TY_EMU_LT_CASES. */
static bool refused_on_request(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a)
{
    bool is[N_CASES];
    query_cases(d, a, is);
    for (int i = 0; i < N_CASES; i++)
        if (is[i])
            g_census.asked[i]++;
    const char *v = getenv("TY_EMU_LT_REFUSE");
    if (!v || !*v)
        return false;
    char list[256];
    snprintf(list, sizeof list, ",%s,", v);
    bool named[N_CASES] = {};
    for (const char *t = list + 1; *t; t = strchr(t, ',') + 1) {
        size_t n = strcspn(t, ",");
        int i = 0;
        while (i < N_CASES && !(strlen(emu_lt_case_names[i]) == n &&
                                !strncmp(t, emu_lt_case_names[i], n)))
            i++;
        if (n && i == N_CASES) {
            fprintf(stderr, "emu-cublaslt: TY_EMU_LT_REFUSE=%s: unknown case '%.*s' (known: "
                            "bias, gelu, dgelu, bgrad, 16bit, all)\n", v, (int)n, t);
            abort();
        }
        if (n)
            named[i] = true;
    }
    for (int i = 0; i < N_CASES; i++)
        if (named[i] && is[i]) {
            g_census.refused++;
            return true;
        }
    return false;
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
                                              cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t *res, int *returned)
{
    n_heuristic++;
    *returned = 0;
    if (requested < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!shapes_agree(d, a, b, c, dl))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (lt_illegal(d, a, b, dl, p) || refused_on_request(d, a))
        return CUBLAS_STATUS_NOT_SUPPORTED; /* no algorithm, as cuBLASLt answers */
    res[0] = cublasLtMatmulHeuristicResult_t{};
    res[0].algo.id = 1;
    res[0].algo.epi = d->epi;
    for (int i = 0; i < 4; i++)
        res[0].algo.align[i] = p->align[i];
    res[0].algo.align[4] = align_of(d->bias);
    res[0].algo.align[5] = align_of(d->aux);
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* cuBLASLt's choice of execution path: 16-bit A and B run on the tensor
 * cores with fp32 accumulation under any 32F compute type; fp32 A and B
 * run on fp32 CUDA cores (SIMT) under CUBLAS_COMPUTE_32F and _PEDANTIC,
 * on TF32 tensor cores under _FAST_TF32, on 16-bit ones (inputs rounded
 * down) under _FAST_16F / _FAST_16BF. */
extern "C" int emu_lt_path(int ct, int ab)
{
    if (ab == CUDA_R_16BF || ab == CUDA_R_16F)
        return EMU_PATH_TC16;
    if (ct == CUBLAS_COMPUTE_32F_FAST_TF32)
        return EMU_PATH_TF32;
    if (ct == CUBLAS_COMPUTE_32F_FAST_16F || ct == CUBLAS_COMPUTE_32F_FAST_16BF)
        return EMU_PATH_TC16;
    return EMU_PATH_SIMT;
}

static const char *epi_name(int e)
{
    return e == CUBLASLT_EPILOGUE_BIAS             ? "bias"
           : e == CUBLASLT_EPILOGUE_GELU_AUX       ? "gelu_aux"
           : e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? "gelu_aux_bias"
           : e == CUBLASLT_EPILOGUE_DGELU          ? "dgelu"
           : e == CUBLASLT_EPILOGUE_BGRADB         ? "bgradb"
                                                   : "default";
}

static const char *type_name(int t)
{
    return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_16F ? "f16" : "f32";
}

/* The record of one matmul: 2 m n k FLOPs on its path; bytes read: A, B,
 * D when beta is not 0 (C == D), the bias, a DGELU's aux; written: D, a
 * GELU_AUX's aux and a BGRADB's bias gradient. The name carries the shape, so a profile tells the
 * model's GEMMs apart. */
static void lt_count(emu_count_rec &r, cublasLtMatmulDesc_t d, const emu_lt_layout *a,
                     const emu_lt_layout *b, const emu_lt_layout *dl, uint64_t m, uint64_t n,
                     uint64_t k, bool reads_d)
{
    uint64_t es_d = type_size(dl->type), md = m * n * es_d;
    snprintf(r.name, sizeof r.name, "cublasLtMatmul %s %s>%s %llux%llux%llu%s%s", epi_name(d->epi),
             type_name(a->type), type_name(dl->type), (unsigned long long)m, (unsigned long long)n,
             (unsigned long long)k, d->ta == CUBLAS_OP_T ? " tA" : "", d->tb == CUBLAS_OP_T ? " tB" : "");
    r.flops[emu_lt_path(d->ct, a->type)] += 2 * m * n * k;
    r.declared = 1;
    r.decl_rd = a->rows * a->cols * type_size(a->type) + b->rows * b->cols * type_size(b->type) +
                (reads_d ? md : 0) + (has_bias(d) ? m * es_d : 0) +
                (d->epi == CUBLASLT_EPILOGUE_DGELU ? md : 0);
    r.decl_wr = md + (has_aux(d) && d->epi != CUBLASLT_EPILOGUE_DGELU ? md : 0) +
                (has_bgrad(d) ? n * es_d : 0);
}

/* A matmul that breaks what its algorithm assumes: a GPU would fail it or
 * fault; here it fails loudly. */
static cublasStatus_t lt_misuse(const char *why)
{
    fprintf(stderr, "emu-cublaslt: cublasLtMatmul refused: %s\n", why);
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Al, const void *B,
                              cublasLtMatrixLayout_t Bl, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cl, void *D, cublasLtMatrixLayout_t Dl,
                              const cublasLtMatmulAlgo_t *algo, void *, size_t, cudaStream_t)
{
    emu_device_guard dg;
    emu_count_scope cs("cublasLtMatmul", dim3(), dim3());
    n_matmul++;
    if (!h || !algo || algo->id != 1)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!shapes_agree(d, Al, Bl, Cl, Dl))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (const char *why = lt_illegal(d, Al, Bl, Dl, nullptr))
        return lt_misuse(why);
    if (algo->epi != d->epi)
        return lt_misuse("the algorithm was found for another epilogue");
    if (C != D) /* out of place is legal in cuBLASLt but unused here */
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (((has_bias(d) || has_bgrad(d)) && !d->bias) || (has_aux(d) && !d->aux))
        return CUBLAS_STATUS_INVALID_VALUE;
    const void *ptrs[6] = {A, B, C, D, has_bias(d) || has_bgrad(d) ? d->bias : nullptr,
                           has_aux(d) ? d->aux : nullptr};
    static const char *names[6] = {"A", "B", "C", "D", "bias", "aux"};
    for (int i = 0; i < 6; i++)
        if (ptrs[i] && align_of(ptrs[i]) < algo->align[i]) {
            char why[96];
            snprintf(why, sizeof why, "%s is %u-byte aligned, its algorithm assumes %u", names[i],
                     align_of(ptrs[i]), algo->align[i]);
            return lt_misuse(why);
        }
    uint64_t m, k, n, kb;
    op_shape(Al, d->ta, &m, &k);
    op_shape(Bl, d->tb, &kb, &n);
    float al = *(const float *)alpha, be = *(const float *)beta;
    if (cs.active)
        lt_count(cs.rec, d, Al, Bl, Dl, m, n, k, be != 0.0f);
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
    if (Dl->type != CUDA_R_32F) { /* D is read only when beta asks for it */
        if (be != 0.0f)
            widen(d32, D, Dl);
        else
            d32.assign(Dl->cols ? (size_t)(Dl->cols - 1) * (size_t)Dl->ld + Dl->rows : 1, 0.0f);
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
    if (has_bgrad(d)) /* op(B)'s columns summed over k, in D's type (lt_illegal) */
        for (uint64_t j = 0; j < n; j++) {
            float s = 0.0f;
            for (uint64_t l = 0; l < k; l++)
                s += ((const float *)B)[d->tb == CUBLAS_OP_T ? l * Bl->ld + j : j * Bl->ld + l];
            if (Dl->type == CUDA_R_32F)
                ((float *)d->bias)[j] = s;
            else
                ((uint16_t *)d->bias)[j] = Dl->type == CUDA_R_16BF ? to_bf16(s) : to_f16(s);
        }
    if (has_bias(d)) { /* of D's type (lt_illegal) */
        std::vector<float> bias;
        emu_lt_layout bl{Dl->type, m, 1, (int64_t)m};
        widen(bias, d->bias, &bl);
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
