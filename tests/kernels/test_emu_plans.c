/* test_emu_plans.c — kernels.cuda_emu.plans: the CUDA backend asks
 * cuBLASLt's heuristic for an algorithm once per GEMM shape (with its
 * transposes, epilogue, types and pointer alignment) and caches the plan
 * in the context, so a training loop's steady state calls only
 * cublasLtMatmul (cuda_matmul.cu, gemm_plan). The emulated cuBLASLt counts
 * both calls (emu_lt_calls); the same counts hold on a GPU by the same
 * source.
 * Then the routes a plan takes when the heuristic has no algorithm
 * (TY_EMU_LT_REFUSE, read at each query): the plain fp32 product plus the
 * finishing kernel gives the fused epilogue's bits; with everything
 * refused the backend's own GEMM kernel runs and cuBLASLt runs nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

enum { RN = 19, RK = 24, RM = 40 };

/* out[RN,RM] of one linear with a bias on a fresh context (plans are per
 * context), x and w of dtype dt, the result in out_dt; the heuristic
 * queries and matmuls it took. */
static void linear(const char *refuse, kn_dtype dt, kn_dtype out_dt, float *out, long *h, long *m)
{
    if (refuse)
        setenv("TY_EMU_LT_REFUSE", refuse, 1);
    else
        unsetenv("TY_EMU_LT_REFUSE");
    kn_ctx *c = NULL;
    ty_err err = {0};
    CHECK(kn_open_backend(&c, &kn_cuda_emu_backend, KN_CUDA, 0, 1, &err) == 0, "open: %s", err.msg);
    if (!c) return;
    float hx[RN * RK], hw[RM * RK], hb[RM];
    for (int i = 0; i < RN * RK; i++)
        hx[i] = (float)((i * 37 % 101) - 50) / 64.0f; /* exact in bf16 and fp16 */
    for (int i = 0; i < RM * RK; i++)
        hw[i] = (float)((i * 53 % 97) - 48) / 128.0f;
    for (int i = 0; i < RM; i++)
        hb[i] = (float)(i % 7 - 3) / 8.0f;
    size_t es = dt == KN_F32 ? 4 : 2, os = out_dt == KN_F32 ? 4 : 2;
    float *x = kn_alloc(c, sizeof hx), *w32 = kn_alloc(c, sizeof hw), *b = kn_alloc(c, sizeof hb);
    void *w = dt == KN_F32 ? (void *)w32 : kn_alloc(c, RM * RK * es),
         *o = kn_alloc(c, RN * RM * os);
    kn_to_device(c, x, hx, sizeof hx);
    kn_to_device(c, w32, hw, sizeof hw);
    kn_to_device(c, b, hb, sizeof hb);
    if (dt != KN_F32) kn_convert(c, w, dt, w32, KN_F32, RM * RK);
    delta(h, m);
    kn_matmul16_fwd(c, dt, out_dt, KN_F32, o, x, w, b, KN_F32, RN, RK, RM);
    delta(h, m);
    float *o32 = (float *)o;
    if (out_dt != KN_F32) { /* widened on the device: exact */
        o32 = kn_alloc(c, RN * RM * 4);
        kn_convert(c, o32, KN_F32, o, out_dt, RN * RM);
    }
    kn_to_host(c, out, o32, RN * RM * 4);
    ty_err kerr = {0};
    CHECK(kn_check(c, &kerr) == 0, "refuse %s: context error: %s", refuse ? refuse : "-", kerr.msg);
    kn_close(c);
    unsetenv("TY_EMU_LT_REFUSE");
}

static void routes(void)
{
    static float ref[RN * RM], got[RN * RM];
    const kn_dtype dts[3] = {KN_F32, KN_BF16, KN_F16};
    for (int t = 0; t < 3; t++) {
        kn_dtype dt = dts[t];
        long h, m;
        linear(NULL, dt, dt, ref, &h, &m);
        CHECK(h == 1 && m == 1, "%s fused: %ld queries, %ld matmuls (want 1, 1)", kn_dtype_name(dt),
              h, m);
        /* bias epilogue refused: asked again without it, then the finishing kernel */
        linear("bias", dt, dt, got, &h, &m);
        CHECK(h == 2 && m == 1, "%s bias refused: %ld queries, %ld matmuls (want 2, 1)",
              kn_dtype_name(dt), h, m);
        CHECK(!memcmp(ref, got, sizeof ref), "%s bias refused: not the fused epilogue's bits",
              kn_dtype_name(dt));
        if (dt != KN_F32) { /* no 16-bit algorithm at all: the GEMM kernel */
            linear("16bit", dt, dt, got, &h, &m);
            CHECK(h == 2 && m == 0, "%s 16-bit refused: %ld queries, %ld matmuls (want 2, 0)",
                  kn_dtype_name(dt), h, m);
        } else {
            linear("all", dt, dt, got, &h, &m);
            CHECK(h == 2 && m == 0, "all refused: %ld queries, %ld matmuls (want 2, 0)", h, m);
        }
        double tol = dt == KN_F32 ? 1e-5 : dt == KN_BF16 ? 8e-3 : 1e-3, worst = 0;
        for (int i = 0; i < RN * RM; i++)
            worst = fmax(worst, fabs(got[i] - ref[i]) / fmax(1.0, fabs(ref[i])));
        CHECK(worst <= tol, "%s GEMM kernel: off by %g (tolerance %g)", kn_dtype_name(dt), worst,
              tol);
        printf("%s: fused, unfused (same bits) and kernel routes (max rel %.2g)\n",
               kn_dtype_name(dt), worst);
    }
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
        kn_matmul16_fwd(c, KN_BF16, KN_F32, KN_F32, o, x, w16, b, KN_F32, N, K, M);
    delta(&h, &m);
    CHECK(h == 1 && m == 2, "bf16 x2: %ld queries, %ld matmuls (want 1, 2)", h, m);
    /* and so is the epilogue: the GELU_AUX_BIAS plan, once */
    for (int i = 0; i < 2; i++)
        kn_matmul_gelu_fwd(c, KN_F32, KN_F32, KN_F32, o, pre, x, w, b, KN_F32, N, K, M);
    delta(&h, &m);
    CHECK(h == 1 && m == 2, "matmul_gelu x2: %ld queries, %ld matmuls (want 1, 2)", h, m);
    ty_err kerr = {0};
    CHECK(kn_check(c, &kerr) == 0, "context error: %s", kerr.msg);
    kn_close(c);
    routes();
    return ty_summary("cuda_emu.plans");
}
