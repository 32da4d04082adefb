/* cpu_matmul.c — y = x w^T + b and its backward through OpenBLAS sgemm.
 *
 * Weights are [out, in] (nn.Linear), so every product is one sgemm call with
 * the transposes expressed as BLAS flags — no copies. Gradients accumulate
 * by calling sgemm with beta = 1. The bias gradient is a column reduction,
 * split over columns so each column is summed in row order by one thread. */
#include "cpu.h"

#include <cblas.h>
#include <omp.h>

/* OpenBLAS's thread count is process-wide; two contexts with different
 * counts would otherwise run each other's setting. */
static void cpu_blas_threads(kn_ctx *c)
{
    if (openblas_get_num_threads() != c->n_threads)
        openblas_set_num_threads(c->n_threads);
}

void cpu_matmul_fwd(kn_ctx *c, float *out, const float *x, const float *w, const float *bias,
                    int N, int K, int M)
{
    if (N <= 0 || M <= 0)
        return;
    cpu_blas_threads(c);
    if (K <= 0) {
        /* An empty product is zero: the output is the bias alone. */
        for (int n = 0; n < N; n++)
            for (int m = 0; m < M; m++)
                out[(size_t)n * M + m] = bias ? bias[m] : 0.0f;
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, M, K, 1.0f, x, K, w, K, 0.0f, out, M);
    if (bias) {
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if ((size_t)N * M > CPU_PAR_MIN)
        for (int n = 0; n < N; n++) {
            float *o = out + (size_t)n * M;
            for (int m = 0; m < M; m++)
                o[m] += bias[m];
        }
    }
}

void cpu_matmul_bwd(kn_ctx *c, float *dx, float *dw, float *dbias, const float *dout,
                    const float *x, const float *w, int N, int K, int M)
{
    if (N <= 0 || M <= 0)
        return;
    cpu_blas_threads(c);
    if (K > 0) {
        /* dx[N,K] += dout[N,M] w[M,K] */
        if (dx)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, K, M, 1.0f, dout, M, w, K,
                        1.0f, dx, K);
        /* dw[M,K] += dout[N,M]^T x[N,K] */
        if (dw)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, K, N, 1.0f, dout, M, x, K,
                        1.0f, dw, K);
    }
    if (dbias) {
        int par = (size_t)N * M > CPU_PAR_MIN;
#pragma omp parallel num_threads(par ? c->n_threads : 1)
        {
            int me = omp_get_thread_num(), cnt = omp_get_num_threads();
            int units = (M + 15) / 16;
            int lo = (int)((long)units * me / cnt) * 16, hi = (int)((long)units * (me + 1) / cnt) * 16;
            if (lo > M)
                lo = M;
            if (hi > M)
                hi = M;
            for (int n = 0; n < N; n++) {
                const float *g = dout + (size_t)n * M;
                for (int m = lo; m < hi; m++)
                    dbias[m] += g[m];
            }
        }
    }
}
