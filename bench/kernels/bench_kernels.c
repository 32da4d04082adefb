/* bench_kernels.c — times the CPU kernels at the shapes of the engine's
 * benchmark model (GPT-2, 4 layers x 256 wide, seq 256, batch 8, vocab
 * 50257), op by op, so slow kernels show up before the whole-model run.
 * Usage: bench_kernels [threads] [reps]. Prints ms per call and GFLOP/s. */
#include "kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float *buf(kn_ctx *c, size_t n)
{
    float *p = kn_alloc(c, n * sizeof *p);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    uint64_t s = n * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = (float)((s >> 40) * (1.0 / 16777216.0) - 0.5) * 0.2f;
    }
    return p;
}

#define TIME(label, flops, reps, stmt)                                                             \
    do {                                                                                           \
        stmt; /* warm-up */                                                                        \
        double t0 = now_s(), c0 = cpu_s();                                                         \
        for (int r_ = 0; r_ < (reps); r_++)                                                        \
            stmt;                                                                                  \
        double ms = (now_s() - t0) / (reps)*1e3;                                                   \
        double cms = (cpu_s() - c0) / (reps)*1e3;                                                  \
        total_ms += ms;                                                                            \
        printf("%-34s %9.3f ms %9.3f cpu-ms %8.1f GFLOP/s\n", label, ms, cms,                      \
               (flops) / ms * 1e-6);                                                               \
    } while (0)

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    kn_ctx *c = NULL;
    ty_err err = {0};
    if (kn_open(&c, KN_CPU, 0, threads, &err)) {
        fprintf(stderr, "kn_open: %s\n", err.msg);
        return 1;
    }
    const int B = 8, T = 256, C = 256, H = 4, D = 64, V = 50257;
    const int N = B * T;
    double total_ms = 0;
    printf("%s\n", kn_describe(c));
    printf("threads %d, B=%d T=%d C=%d H=%d V=%d\n", threads, B, T, C, H, V);

    float *x = buf(c, (size_t)N * 4 * C), *y = buf(c, (size_t)N * 4 * C);
    float *dx = buf(c, (size_t)N * 4 * C), *dy = buf(c, (size_t)N * 4 * C);
    float *w = buf(c, (size_t)4 * C * C), *dw = buf(c, (size_t)4 * C * C);
    float *bias = buf(c, 4 * C), *dbias = buf(c, 4 * C);
    int shapes[][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};
    const char *names[] = {"qkv", "attn.proj", "fc", "mlp.proj"};
    for (int s = 0; s < 4; s++) {
        int K = shapes[s][0], M = shapes[s][1];
        double f = 2.0 * N * K * M;
        char l[64];
        snprintf(l, sizeof l, "matmul_fwd %s %dx%d", names[s], K, M);
        TIME(l, f, reps, kn_matmul_fwd(c, y, x, w, bias, N, K, M));
        snprintf(l, sizeof l, "matmul_bwd %s", names[s]);
        TIME(l, 2 * f, reps, kn_matmul_bwd(c, dx, dw, dbias, dy, x, w, N, K, M));
    }

    float *qkv = buf(c, (size_t)N * 3 * C), *dqkv = buf(c, (size_t)N * 3 * C);
    float *lse = buf(c, (size_t)B * H * T), *ao = buf(c, (size_t)N * C);
    double af = 2.0 * B * H * (double)T * (T + 1) / 2 * D * 2; /* QK^T and PV, causal half */
    TIME("attention_fwd", af, reps,
         kn_attention_fwd(c, KN_F32, ao, lse, qkv, qkv + C, qkv + 2 * C, B, T, H, H, D, 3 * C,
                          3 * C, 0.0f, 0.0f, 0));
    /* The backward recomputes QK^T: five products of the forward's size, not four. */
    TIME("attention_bwd", 2.5 * af, reps,
         kn_attention_bwd(c, KN_F32, KN_F32, dqkv, dqkv + C, dqkv + 2 * C, ao, KN_F32, ao, lse, qkv,
                          qkv + C, qkv + 2 * C, B, T, H, H, D, 3 * C, 3 * C, 0.0f, 0.0f, 0));

    float *mean = buf(c, N), *rstd = buf(c, N);
    TIME("layernorm_fwd", 0, reps,
         kn_layernorm_fwd(c, KN_F32, y, mean, rstd, x, w, bias, N, C, 1e-5f));
    TIME("layernorm_bwd", 0, reps,
         kn_layernorm_bwd(c, KN_F32, dx, NULL, dw, dbias, dy, KN_F32, x, w, mean, rstd, N, C));
    TIME("gelu_fwd", 0, reps, kn_gelu_fwd(c, KN_F32, y, x, (size_t)N * 4 * C));
    TIME("gelu_bwd", 0, reps, kn_gelu_bwd(c, KN_F32, dx, dy, x, (size_t)N * 4 * C));
    TIME("add (residual)", 0, reps, kn_add(c, KN_F32, y, x, dy, (size_t)N * C));

    float *lw = buf(c, (size_t)V * C), *dlw = buf(c, (size_t)V * C);
    float *logits = buf(c, (size_t)N * V), *losses = buf(c, N);
    int32_t *tg = malloc(N * sizeof *tg);
    for (int n = 0; n < N; n++)
        tg[n] = (n * 7919) % V;
    double hf = 2.0 * N * C * (double)V;
    TIME("matmul_fwd lm_head 256x50257", hf, reps, kn_matmul_fwd(c, logits, x, lw, NULL, N, C, V));
    TIME("crossentropy_fwd", 0, reps,
         kn_crossentropy_fwd(c, KN_F32, losses, logits, tg, N, V, V, 0.0f));
    TIME("crossentropy_fwd_bwd (fused)", 0, reps,
         kn_crossentropy_fwd_bwd(c, KN_F32, losses, logits, logits, tg, N, V, V, 1.0f / N, 0.0f));
    TIME("matmul_bwd lm_head", 2 * hf, reps,
         kn_matmul_bwd(c, dx, dlw, NULL, logits, x, lw, N, C, V));
    size_t np = (size_t)V * C;
    float *m = buf(c, np), *v = buf(c, np);
    TIME("adamw (lm_head size)", 0, reps,
         kn_adamw(c, KN_F32, lw, NULL, dlw, m, v, np, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.1f, 3));
    TIME("sumsq (lm_head size)", 0, reps, (void)kn_sumsq(c, dlw, np));
    printf("%-34s %9.3f ms\n", "sum of the above", total_ms);
    free(tg);
    kn_close(c);
    return 0;
}
