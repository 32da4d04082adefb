/* cuda_matmul.cu — linear layers on cuBLASLt.
 *
 * Row-major out[N,M] = x[N,K] w[M,K]^T is, read column-major, the product
 * out^T[M,N] = op(w)[M,K] x^T[K,N]: A = w (K x M col-major, transposed),
 * B = x (K x N col-major), D = out (M x N, ld M), the bias added by the
 * BIAS epilogue (one value per row of D = per output feature). Backward:
 * dx^T[K,N] += w^T[K,M] dout^T[M,N] and dw^T[K,M] += x^T[K,N] dout[N,M]
 * (beta = 1 gives the accumulate convention). dbias, the column sums of
 * dout, comes out of dw's product where cuBLASLt has its BGRADB epilogue
 * for it (kn_cuda_gemm_dw: dout is that product's B, summed over k, the
 * tokens); BGRADB writes its vector, so it goes to scratch and one add
 * accumulates it. Elsewhere, or with no dw, two deterministic stages
 * (kn_cuda_colsum_acc, cuda_colsum.cu).
 * Compute is CUBLAS_COMPUTE_32F: true fp32, no TF32, so fp32 results are
 * comparable with the CPU's sgemm. kn_cuda_gemm also takes bf16 / fp16 A
 * and B (the tensor-core path of matmul16, cuda_convert.cu) with an fp32 or
 * same-type D, still with fp32 accumulation.
 *
 * Every call is legal by cublasLt.h's rules: the bias vector is of D's
 * type, so a 16-bit D gets its bias converted to that type first (exact:
 * kernels.h asks that such a bias hold values the type represents, as the
 * engine's biases, read from 16-bit storage, do), and the bias and aux
 * pointers are set before the heuristic is asked, which derives the
 * alignment it assumes from them.
 *
 * Each (shape, transposes, epilogue, types, alignment of A/B/D, of the
 * bias and of the aux matrix) gets a plan once, cached in the context:
 * the route it takes and, for cuBLASLt, its descriptors and algorithm; the
 * steady state calls only cublasLtMatmul. When the heuristic returns no
 * algorithm the plan takes the next route, never an error:
 *   LT      one cublasLtMatmul with the epilogue asked for;
 *   LT_F32  cuBLASLt's plain product with an fp32 result (D itself, or
 *           scratch for a 16-bit D), then k_gemm_finish adds the bias and
 *           rounds: the fused epilogue's arithmetic (fp32 accumulator +
 *           beta C + bias, rounded once), so the same bits;
 *   KERNEL  k_gemm_tiled, our own fp32 GEMM, the same arithmetic again
 *           (slow; for a cuBLASLt that has nothing for these operands);
 *   UNFUSED a GELU epilogue with no algorithm: kn_cuda_gemm_epi returns
 *           0 and the caller runs its unfused pair (cuda_matmul_gelu.cu).
 * Under cuda-emu the same calls go to a CPU reference that refuses what
 * the real library refuses (emu_cublaslt.cpp); TY_EMU_LT_REFUSE sends the
 * tests down each route. */
#include "kn_cuda.cuh"
#include "kn_cuda16.cuh"

#include <stdio.h>
#include <stdlib.h>

namespace KN_NS {

enum gemm_route { ROUTE_LT, ROUTE_LT_F32, ROUTE_KERNEL, ROUTE_UNFUSED };

struct cuda_gemm_plan {
    /* the key */
    int m, n, k, ta, tb, epi, lda, ldb, ldd, dt_ab, dt_d;
    int64_t ldaux;
    unsigned align, align_bias, align_aux;
    /* what runs */
    int route;
    cublasLtMatmulDesc_t op; /* ROUTE_LT / ROUTE_LT_F32, else NULL */
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
};

static void lt_release(cuda_gemm_plan *p)
{
    if (p->op)
        cublasLtMatmulDescDestroy(p->op);
    if (p->a)
        cublasLtMatrixLayoutDestroy(p->a);
    if (p->b)
        cublasLtMatrixLayoutDestroy(p->b);
    if (p->d)
        cublasLtMatrixLayoutDestroy(p->d);
    p->op = nullptr, p->a = p->b = p->d = nullptr;
}

void kn_cuda_gemm_plans_free(cuda_state *st)
{
    for (int i = 0; i < st->n_plans; i++)
        lt_release(&st->plans[i]);
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

/* The largest power of two (at most 256) dividing every given address;
 * 256 for none (NULLs are ignored). */
static unsigned ptr_align(const void *a, const void *b = nullptr, const void *d = nullptr)
{
    uintptr_t u = (uintptr_t)a | (uintptr_t)b | (uintptr_t)d | 256u;
    return (unsigned)(u & (~u + 1));
}

/* Asks cuBLASLt for D[m,n] = op(A) op(B) (+ epilogue), D of type dt_d and
 * leading dimension ldd, filling p's descriptors and algorithm. 1: found;
 * 0: no algorithm (p released, no error); -1: failed (context error). */
static int lt_plan(kn_ctx *c, cuda_gemm_plan *p, int epi, int dt_d, int ldd, const void *bias,
                   const void *aux)
{
    cuda_state *st = kn_cuda_st(c);
    cudaDataType_t tab = lt_type(p->dt_ab), td = lt_type(dt_d);
    int m = p->m, n = p->n, k = p->k, ta = p->ta, tb = p->tb;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t lt_epi = (cublasLtEpilogue_t)epi;
    int has_bias = epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                   epi == CUBLASLT_EPILOGUE_BGRADB;
    uint64_t ws = st->lt_ws_bytes;
    uint32_t align = p->align;
    int64_t ldaux = p->ldaux;
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulHeuristicResult_t h = {};
    int got = 0;
    int ok = lt_ok(c, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc") &&
             lt_ok(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                                     sizeof opa), "transa") &&
             lt_ok(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                                     sizeof opb), "transb") &&
             lt_ok(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &lt_epi,
                                                     sizeof lt_epi), "epilogue") &&
             (!has_bias ||
              lt_ok(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof bias), "bias pointer")) &&
             (!aux ||
              (lt_ok(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                       &aux, sizeof aux), "aux pointer") &&
               lt_ok(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                       &ldaux, sizeof ldaux), "aux ld"))) &&
             lt_ok(c, cublasLtMatrixLayoutCreate(&p->a, tab, ta ? k : m, ta ? m : k, p->lda),
                   "layout A") &&
             lt_ok(c, cublasLtMatrixLayoutCreate(&p->b, tab, tb ? n : k, tb ? k : n, p->ldb),
                   "layout B") &&
             lt_ok(c, cublasLtMatrixLayoutCreate(&p->d, td, m, n, ldd), "layout D") &&
             lt_ok(c, cublasLtMatmulPreferenceCreate(&pref), "preference") &&
             lt_ok(c, cublasLtMatmulPreferenceSetAttribute(
                          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                   "workspace preference");
    static const cublasLtMatmulPreferenceAttributes_t aligns[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; ok && i < 4; i++)
        ok = lt_ok(c, cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align, sizeof align),
                   "alignment preference");
    if (ok) /* any status but success means no algorithm (cuBLASLt says NOT_SUPPORTED) */
        cublasLtMatmulAlgoGetHeuristic(st->lt, p->op, p->a, p->b, p->d, p->d, pref, 1, &h, &got);
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (ok && got >= 1) {
        p->algo = h.algo;
        return 1;
    }
    lt_release(p);
    return ok ? 0 : -1;
}

/* Finds or builds the plan (the key's fields as named in cuda_gemm_plan);
 * bias and aux are the pointers the first call passes (the heuristic
 * derives their alignment from them). NULL after a context error. */
static cuda_gemm_plan *gemm_plan(kn_ctx *c, const cuda_gemm_plan *key, const void *bias,
                                 const void *aux)
{
    cuda_state *st = kn_cuda_st(c);
    for (int i = 0; i < st->n_plans; i++) {
        cuda_gemm_plan *p = &st->plans[i];
        if (p->m == key->m && p->n == key->n && p->k == key->k && p->ta == key->ta &&
            p->tb == key->tb && p->epi == key->epi && p->lda == key->lda && p->ldb == key->ldb &&
            p->ldd == key->ldd && p->dt_ab == key->dt_ab && p->dt_d == key->dt_d &&
            p->align == key->align && p->align_bias == key->align_bias &&
            p->align_aux == key->align_aux && p->ldaux == key->ldaux)
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
    cuda_gemm_plan p = *key;
    p.op = nullptr, p.a = p.b = p.d = nullptr;
    p.route = ROUTE_LT;
    int r = lt_plan(c, &p, p.epi, p.dt_d, p.ldd, bias, aux);
    if (r == 0 && (aux || p.epi == CUBLASLT_EPILOGUE_BGRADB)) {
        p.route = ROUTE_UNFUSED;
    } else if (r == 0) {
        /* The plain product into fp32: D itself, or compact scratch. */
        int plain = p.epi == CUBLASLT_EPILOGUE_DEFAULT && p.dt_d == KN_F32;
        p.route = ROUTE_LT_F32;
        r = plain ? 0 : lt_plan(c, &p, CUBLASLT_EPILOGUE_DEFAULT, KN_F32,
                                p.dt_d == KN_F32 ? p.ldd : p.m, nullptr, nullptr);
        if (r == 0)
            p.route = ROUTE_KERNEL;
    }
    if (r < 0)
        return nullptr;
    st->plans[st->n_plans] = p;
    return &st->plans[st->n_plans++];
}

/* D[i,j] (column-major, type dt_d, ld ldd) = acc[i,j] (+ beta D[i,j] when
 * acc is not D) (+ bias[i]), rounded once: the fused epilogue's arithmetic
 * after cuBLASLt's plain fp32 product. */
__global__ void k_gemm_finish(void *D, int dt_d, int ldd, const float *acc, int ldacc,
                              const float *bias, float beta, int m, int n)
{
    size_t total = (size_t)m * n;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % m), j = (int)(e / m);
        float v = acc[(size_t)j * ldacc + i];
        if ((const void *)acc != D && beta != 0.0f)
            v += beta * load_as_f32(D, dt_d, (size_t)j * ldd + i);
        if (bias)
            v += bias[i];
        store_from_f32(D, dt_d, (size_t)j * ldd + i, v);
    }
}

/* The last route: D[m,n] = op(A) op(B) + beta D + bias, column-major, A
 * and B read in dt_ab, fp32 accumulation over k in order, D stored in
 * dt_d. GEMM_T x GEMM_T output tiles, each block walking tiles grid-stride,
 * GEMM_T-deep slices of A and B staged in shared memory. */
#define GEMM_T 16
__global__ void k_gemm_tiled(void *D, int dt_d, int ldd, const void *A, int lda, int ta,
                             const void *B, int ldb, int tb, int dt_ab, const float *bias,
                             float beta, int m, int n, int k)
{
    __shared__ float As[GEMM_T][GEMM_T + 1], Bs[GEMM_T][GEMM_T + 1];
    int tx = threadIdx.x % GEMM_T, ty = threadIdx.x / GEMM_T;
    int mt = (m + GEMM_T - 1) / GEMM_T, nt = (n + GEMM_T - 1) / GEMM_T;
    for (int tile = blockIdx.x; tile < mt * nt; tile += gridDim.x) {
        int i = (tile % mt) * GEMM_T + tx, j = (tile / mt) * GEMM_T + ty;
        float acc = 0.0f;
        for (int l0 = 0; l0 < k; l0 += GEMM_T) {
            /* As[ty][tx] = op(A)(i, l0 + ty); Bs[ty][tx] = op(B)(l0 + tx, j) */
            int al = l0 + ty, bl = l0 + tx;
            As[ty][tx] = i < m && al < k
                             ? load_as_f32(A, dt_ab, ta ? (size_t)i * lda + al : (size_t)al * lda + i)
                             : 0.0f;
            Bs[ty][tx] = bl < k && j < n
                             ? load_as_f32(B, dt_ab, tb ? (size_t)bl * ldb + j : (size_t)j * ldb + bl)
                             : 0.0f;
            __syncthreads();
            int lmax = min(GEMM_T, k - l0);
            for (int l = 0; l < lmax; l++)
                acc += As[l][tx] * Bs[ty][l];
            __syncthreads();
        }
        if (i < m && j < n) {
            size_t o = (size_t)j * ldd + i;
            if (beta != 0.0f)
                acc += beta * load_as_f32(D, dt_d, o);
            if (bias)
                acc += bias[i];
            store_from_f32(D, dt_d, o, acc);
        }
    }
}

/* The bias (type bias_dt: fp32 or a 16-bit type) converted to `want` in
 * scratch slot `slot`, or itself when it is of that type already (exact
 * for a bias holding values both types represent). */
static const void *bias_as(kn_ctx *c, const void *bias, int bias_dt, int want, int slot, int m)
{
    if (!bias || bias_dt == want)
        return bias;
    void *b = kn_cuda_scratch(c, slot, (size_t)m * kn_dtype_size((kn_dtype)want));
    if (b)
        cuda_convert(c, b, (kn_dtype)want, bias, (kn_dtype)bias_dt, (size_t)m);
    return b;
}

/* The bias as cuBLASLt wants it with a dt_d result (of D's type), and as
 * the fp32 routes add it. */
static const void *lt_bias(kn_ctx *c, const void *bias, int bias_dt, int dt_d, int m)
{
    return bias_as(c, bias, bias_dt, dt_d, dt_d == KN_F32 ? KN_SCRATCH_BIAS32 : KN_SCRATCH_BIAS16,
                   m);
}
const float *kn_cuda_bias_f32(kn_ctx *c, const void *bias, int bias_dt, int m)
{
    return (const float *)bias_as(c, bias, bias_dt, KN_F32, KN_SCRATCH_BIAS32, m);
}

static int lt_run(kn_ctx *c, cuda_gemm_plan *p, void *D, const void *A, const void *B,
                  const void *bias, const void *aux, float beta)
{
    cuda_state *st = kn_cuda_st(c);
    if (bias && !lt_ok(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                         &bias, sizeof bias), "bias pointer"))
        return -1;
    if (aux && !lt_ok(c, cublasLtMatmulDescSetAttribute(
                             p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux),
                      "aux pointer"))
        return -1;
    float alpha = 1.0f;
    if (st->prof)
        kn_prof_begin(st->prof, st->stream);
    int ok = lt_ok(c, cublasLtMatmul(st->lt, p->op, &alpha, A, p->a, B, p->b, &beta, D, p->d, D,
                                     p->d, &p->algo, st->lt_ws, st->lt_ws_bytes, st->stream),
                   "matmul");
    if (st->prof) {
        char name[64];
        snprintf(name, sizeof name, "lt %c%c %dx%dx%d %s>%s epi%d", p->ta ? 'T' : 'N',
                 p->tb ? 'T' : 'N', p->m, p->n, p->k, kn_dtype_name((kn_dtype)p->dt_ab),
                 kn_dtype_name((kn_dtype)p->dt_d), p->epi);
        kn_prof_end(st->prof, st->stream, name);
    }
    return ok ? 1 : -1;
}

int kn_cuda_gemm_epi(kn_ctx *c, void *D, int dt_d, const void *A, const void *B, int dt_ab, int epi,
                     const void *bias_in, int bias_dt, const void *aux, int64_t ldaux, int m, int n,
                     int k, int ta, int tb, int lda, int ldb, int ldd, float beta)
{
    const void *bias_lt = bias_in;
    if (bias_in && !(bias_lt = lt_bias(c, bias_in, bias_dt, dt_d, m)))
        return -1;
    cuda_gemm_plan key = {m,
                          n,
                          k,
                          ta,
                          tb,
                          epi,
                          lda,
                          ldb,
                          ldd,
                          dt_ab,
                          dt_d,
                          aux ? ldaux : 0,
                          ptr_align(A, B, D),
                          ptr_align(bias_lt),
                          ptr_align(aux),
                          0,
                          nullptr,
                          nullptr,
                          nullptr,
                          nullptr,
                          {}};
    cuda_gemm_plan *p = gemm_plan(c, &key, bias_lt, aux);
    if (!p)
        return -1;
    if (p->route == ROUTE_UNFUSED)
        return 0;
    if (p->route == ROUTE_LT)
        return lt_run(c, p, D, A, B, bias_lt, aux, beta);
    /* the fp32 routes add an fp32 bias */
    const float *bias = kn_cuda_bias_f32(c, bias_in, bias_dt, m);
    if (bias_in && !bias)
        return -1;
    switch (p->route) {
    case ROUTE_LT_F32: {
        float *acc = (float *)D;
        int ldacc = ldd;
        if (dt_d != KN_F32) {
            acc = (float *)kn_cuda_scratch(c, KN_SCRATCH_GEMM32, (size_t)m * n * sizeof(float));
            ldacc = m;
        }
        if (!acc || lt_run(c, p, acc, A, B, nullptr, nullptr, dt_d == KN_F32 ? beta : 0.0f) < 0)
            return -1;
        KN_IO(k_gemm_finish, 4 * (size_t)m * n * (acc != D) + (bias ? 4 * (size_t)m : 0) +
            (acc != D && beta != 0.0f ? (size_t)m * n * kn_dtype_size((kn_dtype)dt_d) : 0),
            (size_t)m * n * kn_dtype_size((kn_dtype)dt_d), 0);
        if (bias || dt_d != KN_F32)
            KN_LAUNCH(k_gemm_finish, kn_blocks((size_t)m * n, 256), 256, 0, c, D, dt_d, ldd, acc,
                      ldacc, bias, beta, m, n);
        return 1;
    }
    default: {
        size_t tiles = (size_t)((m + GEMM_T - 1) / GEMM_T) * ((n + GEMM_T - 1) / GEMM_T);
        KN_IO(k_gemm_tiled, ((size_t)m + n) * k * kn_dtype_size((kn_dtype)dt_ab) + (bias ? 4 * (size_t)m : 0) +
            (beta != 0.0f ? (size_t)m * n * kn_dtype_size((kn_dtype)dt_d) : 0),
            (size_t)m * n * kn_dtype_size((kn_dtype)dt_d), 2 * (size_t)m * n * k);
        KN_LAUNCH(k_gemm_tiled, kn_blocks(tiles, 1), GEMM_T * GEMM_T, 0, c, D, dt_d, ldd, A, lda, ta,
                  B, ldb, tb, dt_ab, bias, beta, m, n, k);
        return 1;
    }
    }
}

void kn_cuda_gemm(kn_ctx *c, void *D, int dt_d, const void *A, const void *B, int dt_ab,
                  const void *bias, int bias_dt, int m, int n, int k, int ta, int tb, int lda,
                  int ldb, int ldd, float beta)
{
    kn_cuda_gemm_epi(c, D, dt_d, A, B, dt_ab, bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT,
                     bias, bias_dt, nullptr, 0, m, n, k, ta, tb, lda, ldb, ldd, beta);
}

/* The fp32 product (kn_matmul_*). */
static void gemm(kn_ctx *c, float *D, const float *A, const float *B, const float *bias, int m,
                 int n, int k, int ta, int tb, int lda, int ldb, int ldd, float beta)
{
    kn_cuda_gemm(c, D, KN_F32, A, B, KN_F32, bias, KN_F32, m, n, k, ta, tb, lda, ldb, ldd, beta);
}

void cuda_matmul_fwd(kn_ctx *c, float *out, const float *x, const float *w, const float *bias,
                     int N, int K, int M)
{
    if (N <= 0 || M <= 0)
        return;
    gemm(c, out, w, x, bias, M, N, K, 1, 0, K, K, M, 0.0f);
}

void kn_cuda_gemm_dw(kn_ctx *c, float *dw, float *dbias, const void *x, const void *dout,
                     int dt_ab, int N, int K, int M)
{
    /* dw^T[K,M] += x^T[K,N] (dout^T)^T[N,M]: B = dout as M x N col-major,
     * transposed; BGRADB sums op(B) = dout over k = N into bg */
    if (dbias && dw) {
        float *bg = (float *)kn_cuda_scratch(c, KN_SCRATCH_BGRAD, (size_t)M * sizeof(float));
        if (!bg)
            return;
        int r = kn_cuda_gemm_epi(c, dw, KN_F32, x, dout, dt_ab, CUBLASLT_EPILOGUE_BGRADB, bg,
                                 KN_F32, nullptr, 0, K, M, N, 0, 1, K, M, K, 1.0f);
        if (r > 0)
            cuda_add(c, KN_F32, dbias, dbias, bg, (size_t)M);
        if (r != 0)
            return;
    }
    if (dw)
        kn_cuda_gemm(c, dw, KN_F32, x, dout, dt_ab, nullptr, KN_F32, K, M, N, 0, 1, K, M, K, 1.0f);
    if (dbias)
        kn_cuda_colsum_acc(c, dbias, dout, dt_ab, N, M);
}

void cuda_matmul_bwd(kn_ctx *c, float *dx, float *dw, float *dbias, const float *dout,
                     const float *x, const float *w, int N, int K, int M)
{
    if (N <= 0 || M <= 0 || K <= 0)
        return;
    if (dx) /* dx^T[K,N] += w^T[K,M] dout^T[M,N]: A = w as K x M col-major */
        gemm(c, dx, w, dout, nullptr, K, N, M, 0, 0, K, M, K, 1.0f);
    kn_cuda_gemm_dw(c, dw, dbias, x, dout, KN_F32, N, K, M);
}

} // namespace KN_NS
