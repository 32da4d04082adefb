/* cpu_matmul_gelu.c — the linear + GELU pair as one op: the reference
 * semantics of kn_matmul_gelu_fwd / kn_matmul_dgelu.
 *
 * On a GPU the pair is one cuBLASLt call (the GELU in the GEMM epilogue,
 * its input kept as the aux output; the backward's GELU derivative in the
 * epilogue of the next layer's dx product). Here it is the unfused ops in
 * the order the engine ran them before the fusion, with its rounding
 * points for 16-bit weights, so an fp32 or 16-bit CPU run computes the
 * same bits with and without the fused op: the CPU is the reference the
 * emulated and real cuBLASLt epilogues are tested against. */
#include "cpu.h"

#include <stdlib.h>

/* The weight's dtype, and each activation's: fp32 or the weight's (as
 * matmul16 reads them). */
static int types_ok(kn_ctx *c, kn_dtype dt, kn_dtype a_dt, kn_dtype b_dt, const char *op)
{
    if ((dt == KN_F32 || dt == KN_BF16 || dt == KN_F16) && (a_dt == KN_F32 || a_dt == dt) &&
        (b_dt == KN_F32 || b_dt == dt))
        return 1;
    kn_fail(c, TY_EINVAL,
            "%s: weight dtype %s with %s / %s activations (each is f32 or the weight's)", op,
            kn_dtype_name(dt), kn_dtype_name(a_dt), kn_dtype_name(b_dt));
    return 0;
}

void cpu_matmul_gelu_fwd(kn_ctx *c, kn_dtype dt, kn_dtype out_dt, kn_dtype x_dt, void *out,
                         void *pre, const void *x, const void *w, const void *bias, kn_dtype b_dt,
                         int N, int K, int M)
{
    if (N <= 0 || M <= 0 || !types_ok(c, dt, out_dt, x_dt, "matmul_gelu_fwd") ||
        !kn_bias_dtype_ok(c, dt, b_dt, "matmul_gelu_fwd"))
        return;
    size_t n = (size_t)N * M;
    if (out_dt == KN_F32) {
        if (dt == KN_F32)
            cpu_matmul_fwd(c, pre, x, w, bias, N, K, M); /* b_dt is fp32 (checked) */
        else
            cpu_matmul16_fwd(c, dt, KN_F32, x_dt, pre, x, w, bias, b_dt, N, K, M);
        const float *g = pre;
        if (dt != KN_F32) { /* GELU of pre as dt holds it: rounded in out, then in place */
            cpu_copy(c, out, pre, n);
            cpu_round(c, out, n, dt);
            g = out;
        }
        cpu_gelu_fwd(c, KN_F32, out, g, n);
        return;
    }
    /* 16-bit pre and out (out_dt == dt): pre is the product rounded to dt;
     * out is GELU of those values, rounded (the typed kn_gelu_fwd): the
     * engine's unfused lin_fwd + kn_gelu_fwd of a 16-bit run, bit for bit. */
    cpu_matmul16_fwd(c, dt, dt, x_dt, pre, x, w, bias, b_dt, N, K, M);
    cpu_gelu_fwd(c, dt, out, pre, n);
}

void cpu_matmul_dgelu(kn_ctx *c, kn_dtype dt, kn_dtype dout_dt, kn_dtype pre_dt, void *dpre,
                      float *dbias, const void *dout, const void *w, const void *pre, int N, int K,
                      int M)
{
    if (N <= 0 || K <= 0 || !types_ok(c, dt, dout_dt, pre_dt, "matmul_dgelu")) return;
    size_t n = (size_t)N * K;
    /* The fp32 values in dpre itself, or for a 16-bit dpre in a temporary
     * stored into it at the end (exact: they are rounded to dt = pre_dt). */
    float *d = pre_dt == KN_F32 ? dpre : malloc(n * sizeof *d);
    if (!d) {
        kn_fail(c, TY_ENOMEM, "matmul_dgelu: out of memory for %zu floats", n);
        return;
    }
    /* dact = dout w into d (x is unused without dw: pre stands in). */
    cpu_zero(c, d, n);
    if (dt == KN_F32)
        cpu_matmul_bwd(c, d, NULL, NULL, dout, pre, w, N, K, M);
    else
        cpu_matmul16_bwd(c, dt, dout_dt, pre_dt, d, NULL, NULL, dout, pre, w, N, K, M);
    cpu_round(c, d, n, dt);
    cpu_gelu_bwd_write(c, pre_dt, d, d, pre, n);
    cpu_round(c, d, n, dt);
    if (dbias) /* the column sums, in the row order kn_matmul_bwd uses */
        cpu_matmul_bwd(c, NULL, NULL, dbias, d, NULL, NULL, N, 0, K);
    if (d != dpre) {
        cpu_convert(c, dpre, pre_dt, d, KN_F32, n);
        free(d);
    }
}
