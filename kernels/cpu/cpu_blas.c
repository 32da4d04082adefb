/* cpu_blas.c — the CPU backend's one door to OpenBLAS.
 *
 * OpenBLAS runs single-threaded: our OpenMP threads split each product
 * (cpu_matmul.c) and call sgemm on their own block, so only one thread pool
 * ever spins on the cores (Debian's default libopenblas is the pthread
 * build, whose workers would otherwise fight OpenMP's for the same cores).
 * OpenBLAS picks its kernels from the CPU, or from OPENBLAS_CORETYPE when
 * set; kn_describe reports which. */
#include "cpu.h"

#include <pthread.h>
#include <stdio.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_desc[96];

static void blas_setup(void)
{
    openblas_set_num_threads(1);
    snprintf(g_desc, sizeof g_desc, "openblas %s", openblas_get_corename());
}

int cpu_blas_init(ty_err *err)
{
    (void)err;
    pthread_once(&g_once, blas_setup);
    return 0;
}

const char *cpu_blas_desc(void)
{
    return g_desc;
}

void cpu_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
