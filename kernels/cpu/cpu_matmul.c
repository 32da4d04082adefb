/* cpu_matmul.c — y = x w^T + b and its backward through OpenBLAS sgemm.
 *
 * Weights are [out, in] (nn.Linear), so every product is one sgemm with the
 * transposes given as BLAS flags — no copies. Gradients accumulate by
 * calling sgemm with beta = 1. The library itself runs single-threaded
 * (see cpu_blas.c); par_sgemm cuts the output along its longer side into
 * a few blocks per OpenMP thread, taken as threads come free, so each
 * block is an independent sgemm, no two thread pools compete for the
 * cores, and a core shared with another process slows the product by its
 * lost share, not by half. The bias gradient is a column
 * reduction, split over columns so each column is summed in row order by
 * one thread. */
#include "cpu.h"

#include <omp.h>

/* Below this many multiply-adds per thread a split costs more than it saves. */
#define GEMM_MIN_WORK (1L << 18)

/* Blocks a product is cut into, per thread: more than one, so that a
 * thread whose core is shared with another process hands its share of
 * the blocks to the others instead of making them wait at the join. */
#define GEMM_BLOCKS_PER_THREAD 4

/* One block of C: rows (by_rows) or columns [lo, hi) of the product. */
static void sgemm_block(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int by_rows, int lo,
                        int hi, int M, int N, int K, const float *A, int lda, const float *B,
                        int ldb, float beta, float *C, int ldc, const float *bias)
{
    const float *a = A, *b = B;
    float *cc = C;
    int m = M, n = N;
    if (by_rows) {
        a = ta == CblasNoTrans ? A + (size_t)lo * lda : A + lo;
        cc = C + (size_t)lo * ldc;
        m = hi - lo;
    } else {
        b = tb == CblasNoTrans ? B + lo : B + (size_t)lo * ldb;
        cc = C + lo;
        n = hi - lo;
    }
    if (K > 0)
        cpu_sgemm(ta, tb, m, n, K, 1.0f, a, lda, b, ldb, beta, cc, ldc);
    else if (beta == 0.0f) /* an empty product is zero */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                cc[(size_t)i * ldc + j] = 0.0f;
    if (bias) {
        const float *bb = by_rows ? bias : bias + lo;
        for (int i = 0; i < m; i++) {
            float *row = cc + (size_t)i * ldc;
            for (int j = 0; j < n; j++)
                row[j] += bb[j];
        }
    }
}

/* C[M,N] = alpha op(A) op(B) + beta C (+ bias[n] on every row when bias),
 * row-major, cut along its longer side into blocks of whole 16-wide kernel
 * tiles that the context's threads take as they come free. The cut
 * depends only on the shape and the thread count, never on timing, and
 * each element is computed inside one block, so results do not depend on
 * which thread ran which block. */
static void par_sgemm(kn_ctx *c, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N,
                      int K, const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc, const float *bias)
{
    long work = (long)M * N * (K > 0 ? K : 1);
    int nt = c->n_threads;
    if (nt > 1 && work / nt < GEMM_MIN_WORK)
        nt = (int)(work / GEMM_MIN_WORK) > 1 ? (int)(work / GEMM_MIN_WORK) : 1;
    int by_rows = M >= N;
    int len = by_rows ? M : N;
    int units = (len + 15) / 16;
    if (nt > units) nt = units > 0 ? units : 1;
    long nb = nt > 1 ? (long)nt * GEMM_BLOCKS_PER_THREAD : 1;
    if (nb > work / GEMM_MIN_WORK) nb = work / GEMM_MIN_WORK > nt ? work / GEMM_MIN_WORK : nt;
    if (nb > units) nb = units > 0 ? units : 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (long blk = 0; blk < nb; blk++) {
        int lo = (int)(units * blk / nb) * 16, hi = (int)(units * (blk + 1) / nb) * 16;
        if (hi > len) hi = len;
        if (hi > lo)
            sgemm_block(ta, tb, by_rows, lo, hi, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
    }
}

void cpu_matmul_fwd(kn_ctx *c, float *out, const float *x, const float *w, const float *bias, int N,
                    int K, int M)
{
    if (N <= 0 || M <= 0) return;
    if (N == 1 && cpu_gemv_on()) { /* decoding: one row reads each weight once (cpu_gemv.c) */
        cpu_gemv(c, KN_F32, out, x, w, bias, K, M);
        return;
    }
    /* out[N,M] = x[N,K] w[M,K]^T, then + bias (added after the product). */
    par_sgemm(c, CblasNoTrans, CblasTrans, N, M, K, x, K, w, K, 0.0f, out, M, bias);
}

void cpu_matmul_bwd(kn_ctx *c, float *dx, float *dw, float *dbias, const float *dout,
                    const float *x, const float *w, int N, int K, int M)
{
    if (N <= 0 || M <= 0) return;
    if (K > 0) {
        /* dx[N,K] += dout[N,M] w[M,K] */
        if (dx) par_sgemm(c, CblasNoTrans, CblasNoTrans, N, K, M, dout, M, w, K, 1.0f, dx, K, NULL);
        /* dw[M,K] += dout[N,M]^T x[N,K] */
        if (dw) par_sgemm(c, CblasTrans, CblasNoTrans, M, K, N, dout, M, x, K, 1.0f, dw, K, NULL);
    }
    if (dbias) {
        int par = (size_t)N * M > CPU_PAR_MIN;
#pragma omp parallel num_threads(par ? c->n_threads : 1)
        {
            int me = omp_get_thread_num(), cnt = omp_get_num_threads();
            int units = (M + 15) / 16;
            int lo = (int)((long)units * me / cnt) * 16,
                hi = (int)((long)units * (me + 1) / cnt) * 16;
            if (lo > M) lo = M;
            if (hi > M) hi = M;
            for (int n = 0; n < N; n++) {
                const float *g = dout + (size_t)n * M;
                for (int m = lo; m < hi; m++)
                    dbias[m] += g[m];
            }
        }
    }
}
