/* sgemm.c — the fp32 GEMM libraries behind cpu_sgemm, side by side: OpenBLAS
 * (cblas_sgemm, the kernels OPENBLAS_CORETYPE or the CPU picks) against
 * oneDNN's dnnl_sgemm (JIT, AVX-512 where the CPU has it).
 *
 * Each product is split by rows over the OpenMP threads and each thread calls
 * the library on its own block, single-threaded, as cpu_matmul.c does. The
 * shapes are a GPT-2 124M step's (N tokens = 256 and 1024; forward, the two
 * backward products, and the tied LM head over a loss chunk). The two
 * libraries alternate rep by rep; a row gives the best wall time of each as
 * GFLOP/s (2MNK / time), their ratio, and the relative L2 distance of the two
 * results, so a wrong layout cannot look fast. Usage: sgemm [threads] [reps] */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct shape {
    const char *what;
    int M, N, K;
    int ta, tb; /* A is [K, M] when ta, B is [N, K] when tb (row-major) */
} shape;

static const shape SHAPES[] = {
    {"qkv fwd, 256 tok", 256, 2304, 768, 0, 0},   {"fc fwd, 256 tok", 256, 3072, 768, 0, 0},
    {"proj dx, 256 tok", 256, 3072, 768, 0, 1},   {"fc dW, 256 tok", 768, 3072, 256, 1, 0},
    {"qkv fwd, 1024 tok", 1024, 2304, 768, 0, 0}, {"proj fwd, 1024 tok", 1024, 768, 3072, 0, 0},
    {"fc dx, 1024 tok", 1024, 768, 3072, 0, 1},   {"fc dW, 1024 tok", 768, 3072, 1024, 1, 0},
    {"lm head, 160 rows", 160, 50257, 768, 0, 1}, {"lm head dW, 160 rows", 50257, 768, 160, 1, 0},
};

static void product(int lib, const shape *s, const float *A, const float *B, float *C)
{
#pragma omp parallel
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int m0 = (int)((long)s->M * t / nt), m1 = (int)((long)s->M * (t + 1) / nt), m = m1 - m0;
        int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
        const float *a = s->ta ? A + m0 : A + (size_t)m0 * s->K;
        float *c = C + (size_t)m0 * s->N;
        if (m > 0 && lib == 0)
            cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                        s->tb ? CblasTrans : CblasNoTrans, m, s->N, s->K, 1.0f, a, lda, B, ldb,
                        0.0f, c, s->N);
        else if (m > 0)
            dnnl_sgemm(s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', m, s->N, s->K, 1.0f, a, lda, B, ldb,
                       0.0f, c, s->N);
    }
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : omp_get_max_threads();
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    omp_set_num_threads(threads);
    openblas_set_num_threads(1);
    printf("threads %d, reps %d, openblas %s\n", threads, reps, openblas_get_corename());
    printf("%-22s %6s %6s %6s %12s %12s %7s %9s\n", "product", "M", "N", "K", "openblas GF/s",
           "onednn GF/s", "ratio", "rel L2");
    double geo = 0;
    int n = (int)(sizeof SHAPES / sizeof SHAPES[0]);
    for (int i = 0; i < n; i++) {
        const shape *s = &SHAPES[i];
        size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N;
        float *A = malloc(na * 4), *B = malloc(nb * 4), *C[2] = {malloc(nc * 4), malloc(nc * 4)};
        if (!A || !B || !C[0] || !C[1]) return 1;
        srand(1 + i);
        for (size_t j = 0; j < na; j++)
            A[j] = (float)rand() / RAND_MAX - 0.5f;
        for (size_t j = 0; j < nb; j++)
            B[j] = (float)rand() / RAND_MAX - 0.5f;
        double best[2] = {1e30, 1e30};
        for (int r = 0; r < reps; r++)
            for (int lib = 0; lib < 2; lib++) {
                double t0 = now();
                product(lib, s, A, B, C[lib]);
                double dt = now() - t0;
                if (dt < best[lib]) best[lib] = dt;
            }
        double d2 = 0, r2 = 0;
        for (size_t j = 0; j < nc; j++) {
            double d = (double)C[0][j] - C[1][j];
            d2 += d * d, r2 += (double)C[0][j] * C[0][j];
        }
        double fl = 2.0 * s->M * s->N * s->K;
        printf("%-22s %6d %6d %6d %12.1f %12.1f %6.2fx %9.1e\n", s->what, s->M, s->N, s->K,
               fl / best[0] / 1e9, fl / best[1] / 1e9, best[0] / best[1], sqrt(d2 / r2));
        geo += log(best[0] / best[1]);
        free(A), free(B), free(C[0]), free(C[1]);
    }
    printf("geometric mean, onednn over openblas: %.2fx\n", exp(geo / n));
    return 0;
}
