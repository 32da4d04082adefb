/* test_emu_plans.c — kernels.cuda_emu.plans: the CUDA backend asks
 * cuBLASLt's heuristic for an algorithm once per GEMM shape (with its
 * transposes, epilogue, types and pointer alignment) and caches the plan
 * in the context, so a training loop's steady state calls only
 * cublasLtMatmul (cuda_matmul.cu, gemm_plan). The emulated cuBLASLt counts
 * both calls (emu_lt_calls); the same counts hold on a GPU by the same
 * source. */
#include <stdio.h>

#include "backend.h"
#include "tyassert.h"

void emu_lt_calls(long *heuristic, long *matmul);

static long h0, m0;

/* Heuristic queries and matmuls since the last call. */
static void delta(long *h, long *m)
{
    long h1, m1;
    emu_lt_calls(&h1, &m1);
    *h = h1 - h0, *m = m1 - m0;
    h0 = h1, m0 = m1;
}

int main(void)
{
    kn_ctx *c = NULL;
    ty_err err = {0};
    if (kn_open_backend(&c, &kn_cuda_emu_backend, KN_CUDA, 0, 1, &err)) {
        printf("FAIL: open: %s\n", err.msg);
        return 1;
    }
    int N = 19, K = 24, M = 40;
    float *x = kn_alloc(c, (size_t)N * K * 4), *w = kn_alloc(c, (size_t)M * K * 4),
          *b = kn_alloc(c, (size_t)M * 4), *o = kn_alloc(c, (size_t)N * M * 4),
          *pre = kn_alloc(c, (size_t)N * M * 4), *dx = kn_alloc(c, (size_t)N * K * 4);
    void *w16 = kn_alloc(c, (size_t)M * K * 2);
    long h, m;
    delta(&h, &m);
    /* one shape three times: asked once, run three times */
    for (int i = 0; i < 3; i++)
        kn_matmul_fwd(c, o, x, w, b, N, K, M);
    delta(&h, &m);
    CHECK(h == 1 && m == 3, "matmul_fwd x3: %ld heuristic queries, %ld matmuls (want 1, 3)", h, m);
    /* another shape, and the backward's two products: each a plan of its own */
    kn_matmul_fwd(c, o, x, w, b, N - 2, K, M);
    kn_matmul_bwd(c, dx, w, NULL, o, x, w, N, K, M);
    delta(&h, &m);
    CHECK(h == 3 && m == 3, "new shapes: %ld queries, %ld matmuls (want 3, 3)", h, m);
    for (int i = 0; i < 4; i++) {
        kn_matmul_fwd(c, o, x, w, b, N - 2, K, M);
        kn_matmul_bwd(c, dx, w, NULL, o, x, w, N, K, M);
    }
    delta(&h, &m);
    CHECK(h == 0 && m == 12, "cached shapes x4: %ld queries, %ld matmuls (want 0, 12)", h, m);
    /* the types are part of the key: bf16 operands are a new plan, once */
    for (int i = 0; i < 2; i++)
        kn_matmul16_fwd(c, KN_BF16, KN_F32, KN_F32, o, x, w16, b, N, K, M);
    delta(&h, &m);
    CHECK(h == 1 && m == 2, "bf16 x2: %ld queries, %ld matmuls (want 1, 2)", h, m);
    /* and so is the epilogue: the GELU_AUX_BIAS plan, once */
    for (int i = 0; i < 2; i++)
        kn_matmul_gelu_fwd(c, KN_F32, KN_F32, KN_F32, o, pre, x, w, b, N, K, M);
    delta(&h, &m);
    CHECK(h == 1 && m == 2, "matmul_gelu x2: %ld queries, %ld matmuls (want 1, 2)", h, m);
    ty_err kerr = {0};
    CHECK(kn_check(c, &kerr) == 0, "context error: %s", kerr.msg);
    kn_close(c);
    return ty_summary("cuda_emu.plans");
}
