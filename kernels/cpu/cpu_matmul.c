/* cpu_matmul.c — y = x w^T + b and its backward through OpenBLAS sgemm.
 *
 * Weights are [out, in] (nn.Linear), so every product is one sgemm with the
 * transposes given as BLAS flags — no copies. Gradients accumulate by
 * calling sgemm with beta = 1. The library itself runs single-threaded
 * (see cpu_blas.c); par_sgemm cuts the output along its longer side into
 * two blocks per pool thread (cpu_pool.h), taken as threads come free, so each
 * block is an independent sgemm and no two thread pools compete for the
 * cores. The bias gradient is a column
 * reduction, split over columns so each column is summed in row order by
 * one thread. */
#include "cpu.h"

#include <stdatomic.h>

/* Below this many multiply-adds per thread a split costs more than it saves. */
#define GEMM_MIN_WORK (1L << 18)

/* Blocks a product is cut into, per thread: two, so that a thread whose
 * core is shared with another process can hand part of its share to the
 * others. Four cost 8 % on a quiet machine (smaller sgemm calls) and
 * gained nothing with one spinning process beside the step (ab.py). */
#define GEMM_BLOCKS_PER_THREAD 2

/* One product C[M,N] = op(A) op(B) + beta C (+ bias[n] on every row), cut
 * along its longer side into nb blocks of whole 16-wide kernel tiles. */
typedef struct gemm_plan {
    enum CBLAS_TRANSPOSE ta, tb;
    int M, N, K, lda, ldb, ldc;
    const float *A, *B, *bias;
    float beta, *C;
    int by_rows, len, units, nt;
    long nb;
} gemm_plan;

/* The cut depends only on the shape and the thread count, never on
 * timing, and each element is computed inside one block, so results do
 * not depend on which thread ran which block. */
static void plan_cut(kn_ctx *c, gemm_plan *p)
{
    long work = (long)p->M * p->N * (p->K > 0 ? p->K : 1);
    int nt = c->n_threads;
    if (nt > 1 && work / nt < GEMM_MIN_WORK)
        nt = (int)(work / GEMM_MIN_WORK) > 1 ? (int)(work / GEMM_MIN_WORK) : 1;
    p->by_rows = p->M >= p->N;
    p->len = p->by_rows ? p->M : p->N;
    p->units = (p->len + 15) / 16;
    if (nt > p->units) nt = p->units > 0 ? p->units : 1;
    long nb = nt > 1 ? (long)nt * GEMM_BLOCKS_PER_THREAD : 1;
    if (nb > work / GEMM_MIN_WORK) nb = work / GEMM_MIN_WORK > nt ? work / GEMM_MIN_WORK : nt;
    if (nb > p->units) nb = p->units > 0 ? p->units : 1;
    p->nt = nt;
    p->nb = nb;
}

/* Block blk of the plan: rows (by_rows) or columns [lo, hi) of C. */
static void plan_block(const gemm_plan *p, long blk)
{
    int lo = (int)(p->units * blk / p->nb) * 16, hi = (int)(p->units * (blk + 1) / p->nb) * 16;
    if (hi > p->len) hi = p->len;
    if (hi <= lo) return;
    const float *a = p->A, *b = p->B;
    float *cc = p->C;
    int m = p->M, n = p->N;
    if (p->by_rows) {
        a = p->ta == CblasNoTrans ? p->A + (size_t)lo * p->lda : p->A + lo;
        cc = p->C + (size_t)lo * p->ldc;
        m = hi - lo;
    } else {
        b = p->tb == CblasNoTrans ? p->B + lo : p->B + (size_t)lo * p->ldb;
        cc = p->C + lo;
        n = hi - lo;
    }
    if (p->K > 0)
        cpu_sgemm(p->ta, p->tb, m, n, p->K, 1.0f, a, p->lda, b, p->ldb, p->beta, cc, p->ldc);
    else if (p->beta == 0.0f) /* an empty product is zero */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                cc[(size_t)i * p->ldc + j] = 0.0f;
    if (p->bias) {
        const float *bb = p->by_rows ? p->bias : p->bias + lo;
        for (int i = 0; i < m; i++) {
            float *row = cc + (size_t)i * p->ldc;
            for (int j = 0; j < n; j++)
                row[j] += bb[j];
        }
    }
}

static gemm_plan plan(kn_ctx *c, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N,
                      int K, const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc, const float *bias)
{
    gemm_plan p = {.ta = ta,
                   .tb = tb,
                   .M = M,
                   .N = N,
                   .K = K,
                   .lda = lda,
                   .ldb = ldb,
                   .ldc = ldc,
                   .A = A,
                   .B = B,
                   .bias = bias,
                   .beta = beta,
                   .C = C};
    plan_cut(c, &p);
    return p;
}

static void dbias_block(float *dbias, const float *dout, int N, int M, int lo, int hi);

/* One parallel job of blocks: the forward's product, or the backward's
 * dx and dw products and the bias gradient's 16-column ranges laid end to
 * end; threads take the next block from `next` as they come free. */
typedef struct gemm_job {
    gemm_plan px, pw;
    float *dbias;
    const float *dout;
    int N, M, units;
    long nbias;
    atomic_long next;
} gemm_job;

static void job_block(gemm_job *j, long blk)
{
    if (blk < j->px.nb) {
        plan_block(&j->px, blk);
    } else if (blk < j->px.nb + j->pw.nb) {
        plan_block(&j->pw, blk - j->px.nb);
    } else {
        long k = blk - j->px.nb - j->pw.nb;
        int lo = (int)(j->units * k / j->nbias) * 16,
            hi = (int)(j->units * (k + 1) / j->nbias) * 16;
        dbias_block(j->dbias, j->dout, j->N, j->M, lo, hi < j->M ? hi : j->M);
    }
}

static void gemm_worker(int tid, int nt, void *arg)
{
    (void)tid, (void)nt;
    gemm_job *j = arg;
    long total = j->px.nb + j->pw.nb + j->nbias;
    for (long blk; (blk = atomic_fetch_add(&j->next, 1)) < total;)
        job_block(j, blk);
}

/* C[M,N] = op(A) op(B) + beta C (+ bias), row-major, its blocks taken by
 * the context's threads as they come free. */
static void par_sgemm(kn_ctx *c, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N,
                      int K, const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc, const float *bias)
{
    gemm_job j = {.px = plan(c, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias)};
    atomic_init(&j.next, 0);
    cpu_pool_run(c, j.px.nt, gemm_worker, &j);
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

/* dbias[lo, hi) += the column sums of dout[N,M] over those columns, each
 * column in row order. */
static void dbias_block(float *dbias, const float *dout, int N, int M, int lo, int hi)
{
    for (int n = 0; n < N; n++) {
        const float *g = dout + (size_t)n * M;
        for (int m = lo; m < hi; m++)
            dbias[m] += g[m];
    }
}

/* The backward's products (dx, dw) and the bias gradient in one parallel
 * region: their blocks (the bias gradient's are 16-column ranges, one a
 * thread) form one list the threads take from, so a linear's backward is
 * one fork and one join instead of three. */
void cpu_matmul_bwd(kn_ctx *c, float *dx, float *dw, float *dbias, const float *dout,
                    const float *x, const float *w, int N, int K, int M)
{
    if (N <= 0 || M <= 0) return;
    gemm_plan none = {.nb = 0, .nt = 1};
    /* dx[N,K] += dout[N,M] w[M,K];  dw[M,K] += dout[N,M]^T x[N,K] */
    gemm_plan px =
        dx && K > 0 ? plan(c, CblasNoTrans, CblasNoTrans, N, K, M, dout, M, w, K, 1.0f, dx, K, NULL)
                    : none;
    gemm_plan pw =
        dw && K > 0 ? plan(c, CblasTrans, CblasNoTrans, M, K, N, dout, M, x, K, 1.0f, dw, K, NULL)
                    : none;
    int bt = dbias && (size_t)N * M > CPU_PAR_MIN ? c->n_threads : 1, units = (M + 15) / 16;
    long nbias = dbias ? (bt < units ? bt : units) : 0;
    int nt = px.nt > pw.nt ? px.nt : pw.nt;
    if (nt < bt) nt = bt;
    gemm_job j = {.px = px,
                  .pw = pw,
                  .dbias = dbias,
                  .dout = dout,
                  .N = N,
                  .M = M,
                  .units = units,
                  .nbias = nbias};
    atomic_init(&j.next, 0);
    cpu_pool_run(c, nt, gemm_worker, &j);
}
