/* cpu_norm.c — LayerNorm (GPT-2) and RMSNorm (Llama), forward and backward.
 *
 * Rows are independent, so the forward and the dx part of the backward run
 * one row per iteration across threads. The weight/bias gradients reduce
 * over rows; threads split the C columns instead and each column is summed
 * over n in order by one thread, so dw and db do not depend on the thread
 * count and need no atomics.
 *
 * Activations (x, out) are of the op's dtype: 16-bit rows are widened into
 * a per-thread fp32 row (two rows of C floats, allocated per call; a
 * failure is a kn_fail) and run through the fp32 code; out is rounded once
 * when stored. Statistics, weights and gradients are fp32. */
#include "cpu.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

/* A thread's two fp32 rows for 16-bit activations (NULL for fp32; *failed
 * set when short of memory). */
static float *row_bufs(kn_dtype dt, int C, int *failed)
{
    if (dt == KN_F32) return NULL;
    float *b = malloc((size_t)2 * (C > 0 ? C : 1) * sizeof *b);
    if (!b) *failed = 1;
    return b;
}

/* [lo, hi) columns of C for thread `me` of `cnt`, in 16-float units. */
static void col_range(int C, int me, int cnt, int *lo, int *hi)
{
    int units = (C + 15) / 16;
    *lo = (int)((long)units * me / cnt) * 16;
    *hi = (int)((long)units * (me + 1) / cnt) * 16;
    if (*lo > C) *lo = C;
    if (*hi > C) *hi = C;
}

void cpu_layernorm_fwd(kn_ctx *c, kn_dtype dt, void *out, float *mean, float *rstd, const void *x,
                       const float *w, const float *b, int N, int C, float eps)
{
    int failed = 0;
#pragma omp parallel num_threads((size_t)N *C > CPU_PAR_MIN ? c->n_threads : 1)                    \
    reduction(|                                                                                    \
              : failed)
    {
        float *buf = row_bufs(dt, C, &failed);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            if (dt != KN_F32 && !buf) continue;
            const float *xr = cpu_in(buf, x, dt, (size_t)n * C, (size_t)C);
            float *o = cpu_out_buf(buf ? buf + C : NULL, out, dt, (size_t)n * C);
            /* Two passes (mean, then centred variance) avoid the cancellation
         * of E[x^2] - E[x]^2; sums in float like PyTorch, in fixed order. */
            float s = 0.0f;
            for (int i = 0; i < C; i++)
                s += xr[i];
            float m = s / (float)C;
            float v = 0.0f;
            for (int i = 0; i < C; i++) {
                float d = xr[i] - m;
                v += d * d;
            }
            float r = 1.0f / sqrtf(v / (float)C + eps);
            for (int i = 0; i < C; i++) {
                float y = (xr[i] - m) * r * w[i];
                o[i] = b ? y + b[i] : y;
            }
            cpu_out(out, dt, (size_t)n * C, o, (size_t)C);
            mean[n] = m;
            rstd[n] = r;
        }
        free(buf);
    }
    if (failed) kn_fail(c, TY_ENOMEM, "layernorm forward: out of memory for a %d-wide row", C);
}

void cpu_layernorm_bwd(kn_ctx *c, kn_dtype dt, float *dx, float *dw, float *db, const float *dout,
                       const void *x, const float *w, const float *mean, const float *rstd, int N,
                       int C)
{
    int par = (size_t)N * C > CPU_PAR_MIN, failed = 0;
    /* One region: dx by rows, then (no barrier between: they share only
     * inputs) dw and db by columns, each column summed in row order. */
#pragma omp parallel num_threads(par ? c->n_threads : 1) reduction(| : failed)
    {
        float *buf = row_bufs(dt, C, &failed);
        if (dx) {
#pragma omp for schedule(static) nowait
            for (int n = 0; n < N; n++) {
                if (dt != KN_F32 && !buf) continue;
                const float *g = dout + (size_t)n * C;
                const float *xr = cpu_in(buf, x, dt, (size_t)n * C, (size_t)C);
                float *d = dx + (size_t)n * C;
                float m = mean[n], r = rstd[n];
                /* dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) */
                float s1 = 0.0f, s2 = 0.0f;
                for (int i = 0; i < C; i++) {
                    float dxhat = g[i] * w[i];
                    s1 += dxhat;
                    s2 += dxhat * (xr[i] - m) * r;
                }
                s1 /= (float)C;
                s2 /= (float)C;
                for (int i = 0; i < C; i++) {
                    float xhat = (xr[i] - m) * r;
                    d[i] += r * (g[i] * w[i] - s1 - xhat * s2);
                }
            }
        }
        if (dw || db) {
            int lo, hi;
            col_range(C, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
            for (int n = 0; n < N && (dt == KN_F32 || buf) && hi > lo; n++) {
                /* this thread's columns of the row: xr[i] for i in [lo, hi) */
                const float *g = dout + (size_t)n * C;
                const float *xr = cpu_in(buf, x, dt, (size_t)n * C + lo, (size_t)(hi - lo)) - lo;
                float m = mean[n], r = rstd[n];
                if (dw)
                    for (int i = lo; i < hi; i++)
                        dw[i] += g[i] * ((xr[i] - m) * r);
                if (db)
                    for (int i = lo; i < hi; i++)
                        db[i] += g[i];
            }
        }
        free(buf);
    }
    if (failed) kn_fail(c, TY_ENOMEM, "layernorm backward: out of memory for a %d-wide row", C);
}

void cpu_rmsnorm_fwd(kn_ctx *c, kn_dtype dt, void *out, float *rstd, const void *x, const float *w,
                     int N, int C, float eps)
{
    int failed = 0;
#pragma omp parallel num_threads((size_t)N *C > CPU_PAR_MIN ? c->n_threads : 1)                    \
    reduction(|                                                                                    \
              : failed)
    {
        float *buf = row_bufs(dt, C, &failed);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            if (dt != KN_F32 && !buf) continue;
            const float *xr = cpu_in(buf, x, dt, (size_t)n * C, (size_t)C);
            float *o = cpu_out_buf(buf ? buf + C : NULL, out, dt, (size_t)n * C);
            float s = 0.0f;
            for (int i = 0; i < C; i++)
                s += xr[i] * xr[i];
            float r = 1.0f / sqrtf(s / (float)C + eps);
            /* HF's LlamaRMSNorm: w * (x * rstd), in that order. */
            for (int i = 0; i < C; i++)
                o[i] = w[i] * (xr[i] * r);
            cpu_out(out, dt, (size_t)n * C, o, (size_t)C);
            rstd[n] = r;
        }
        free(buf);
    }
    if (failed) kn_fail(c, TY_ENOMEM, "rmsnorm forward: out of memory for a %d-wide row", C);
}

void cpu_rmsnorm_bwd(kn_ctx *c, kn_dtype dt, float *dx, float *dw, const float *dout, const void *x,
                     const float *w, const float *rstd, int N, int C)
{
    int par = (size_t)N * C > CPU_PAR_MIN, failed = 0;
    /* One region: dx by rows, then (no barrier between) dw by columns. */
#pragma omp parallel num_threads(par ? c->n_threads : 1) reduction(| : failed)
    {
        float *buf = row_bufs(dt, C, &failed);
        if (dx) {
#pragma omp for schedule(static) nowait
            for (int n = 0; n < N; n++) {
                if (dt != KN_F32 && !buf) continue;
                const float *g = dout + (size_t)n * C;
                const float *xr = cpu_in(buf, x, dt, (size_t)n * C, (size_t)C);
                float *d = dx + (size_t)n * C;
                float r = rstd[n];
                /* dx = r * (dxhat - xhat * mean(dxhat * xhat)), xhat = x r */
                float s = 0.0f;
                for (int i = 0; i < C; i++)
                    s += g[i] * w[i] * xr[i];
                s *= r * r / (float)C;
                for (int i = 0; i < C; i++)
                    d[i] += r * (g[i] * w[i] - xr[i] * s);
            }
        }
        if (dw) {
            int lo, hi;
            col_range(C, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
            for (int n = 0; n < N && (dt == KN_F32 || buf) && hi > lo; n++) {
                const float *g = dout + (size_t)n * C;
                const float *xr = cpu_in(buf, x, dt, (size_t)n * C + lo, (size_t)(hi - lo)) - lo;
                float r = rstd[n];
                for (int i = lo; i < hi; i++)
                    dw[i] += g[i] * (xr[i] * r);
            }
        }
        free(buf);
    }
    if (failed) kn_fail(c, TY_ENOMEM, "rmsnorm backward: out of memory for a %d-wide row", C);
}

/* The residual add fused with the norm after it (kn_add_layernorm_fwd /
 * kn_add_rmsnorm_fwd): on the CPU the reference is the two ops in turn,
 * so an engine run computes the same bits fused or not; the one-pass
 * kernel that saves the re-read of res is the GPU's (cuda_norm.cu). */
void cpu_add_layernorm_fwd(kn_ctx *c, kn_dtype dt, void *res, void *out, float *mean, float *rstd,
                           const void *a, const void *b, const float *w, const float *bias, int N,
                           int C, float eps)
{
    if (N <= 0 || C <= 0) return;
    cpu_add(c, dt, res, a, b, (size_t)N * C);
    cpu_layernorm_fwd(c, dt, out, mean, rstd, res, w, bias, N, C, eps);
}

void cpu_add_rmsnorm_fwd(kn_ctx *c, kn_dtype dt, void *res, void *out, float *rstd, const void *a,
                         const void *b, const float *w, int N, int C, float eps)
{
    if (N <= 0 || C <= 0) return;
    cpu_add(c, dt, res, a, b, (size_t)N * C);
    cpu_rmsnorm_fwd(c, dt, out, rstd, res, w, N, C, eps);
}
