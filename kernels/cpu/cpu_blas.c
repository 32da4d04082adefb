/* cpu_blas.c — the CPU backend's one door to an fp32 GEMM library.
 *
 * Two libraries stand behind cpu_sgemm, chosen once per process:
 *   - oneDNN's dnnl_sgemm, on a CPU with AVX-512 (when oneDNN is built in).
 *     Its JIT kernels use the 512-bit FMA units; OpenBLAS 0.3.21 runs this
 *     machine with its Haswell (AVX2) kernels, about 0.6 of the rate
 *     (bench/engine-cpu/sgemm.c measures both side by side).
 *   - OpenBLAS's cblas_sgemm everywhere else.
 * TY_CPU_SGEMM=openblas|onednn overrides the choice (onednn only where it is
 * built in); kn_describe reports the library in use.
 *
 * Either runs single-threaded: the context's pool threads (cpu_pool.h)
 * split each product (cpu_matmul.c, cpu_attention.c) and call cpu_sgemm on
 * their own block, so only one thread pool ever spins on the cores. oneDNN,
 * called in a pool job (OpenMP thread count 1), runs sequentially on the
 * calling thread; OpenBLAS is set to one thread (Debian's default
 * libopenblas is the pthread build, whose workers would otherwise fight the
 * pool's for the same cores).
 *
 * Both are deterministic for a given shape and thread count, which exact
 * resume needs; they differ from each other in the last bits, within the
 * kernel table's fp32 tolerances. */
#include "cpu.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TY_KN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_desc[96];
static bool g_onednn;

static bool want_onednn(void)
{
#ifdef TY_KN_HAVE_DNNL
    const char *e = getenv("TY_CPU_SGEMM");
    if (e && *e) return strcmp(e, "onednn") == 0;
    return __builtin_cpu_supports("avx512f");
#else
    return false;
#endif
}

static void blas_setup(void)
{
    openblas_set_num_threads(1);
    g_onednn = want_onednn();
    if (g_onednn)
        snprintf(g_desc, sizeof g_desc, "onednn sgemm (avx512)");
    else
        snprintf(g_desc, sizeof g_desc, "openblas %s", openblas_get_corename());
}

int cpu_blas_init(ty_err *err)
{
    const char *e = getenv("TY_CPU_SGEMM");
    if (e && *e && strcmp(e, "openblas") != 0 && strcmp(e, "onednn") != 0)
        return ty_err_set(err, TY_EINVAL, "TY_CPU_SGEMM is '%s'; use openblas or onednn", e);
#ifndef TY_KN_HAVE_DNNL
    if (e && strcmp(e, "onednn") == 0)
        return ty_err_set(err, TY_EINVAL, "TY_CPU_SGEMM=onednn, but this build has no oneDNN");
#endif
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
#ifdef TY_KN_HAVE_DNNL
    /* Row-major, like cblas. An empty product, or arguments oneDNN
     * refuses, fall through to OpenBLAS, which never skips the work. */
    if (g_onednn && M > 0 && N > 0 && K > 0 &&
        dnnl_sgemm(ta == CblasTrans ? 'T' : 'N', tb == CblasTrans ? 'T' : 'N', M, N, K, alpha, A,
                   lda, B, ldb, beta, C, ldc) == dnnl_success)
        return;
#endif
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
