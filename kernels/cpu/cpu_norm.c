/* cpu_norm.c — LayerNorm (GPT-2) and RMSNorm (Llama), forward and backward.
 *
 * Rows are independent, so the forward and the dx part of the backward run
 * one row per iteration across threads. The weight/bias gradients reduce
 * over rows; threads split the C columns instead and each column is summed
 * over n in order by one thread, so dw and db do not depend on the thread
 * count and need no atomics. */
#include "cpu.h"

#include <math.h>
#include <omp.h>

/* [lo, hi) columns of C for thread `me` of `cnt`, in 16-float units. */
static void col_range(int C, int me, int cnt, int *lo, int *hi)
{
    int units = (C + 15) / 16;
    *lo = (int)((long)units * me / cnt) * 16;
    *hi = (int)((long)units * (me + 1) / cnt) * 16;
    if (*lo > C) *lo = C;
    if (*hi > C) *hi = C;
}

void cpu_layernorm_fwd(kn_ctx *c, float *out, float *mean, float *rstd, const float *x,
                       const float *w, const float *b, int N, int C, float eps)
{
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if ((size_t)N * C > CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *o = out + (size_t)n * C;
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
        mean[n] = m;
        rstd[n] = r;
    }
}

void cpu_layernorm_bwd(kn_ctx *c, float *dx, float *dw, float *db, const float *dout,
                       const float *x, const float *w, const float *mean, const float *rstd, int N,
                       int C)
{
    int par = (size_t)N * C > CPU_PAR_MIN;
    if (dx) {
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (par)
        for (int n = 0; n < N; n++) {
            const float *g = dout + (size_t)n * C, *xr = x + (size_t)n * C;
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
#pragma omp parallel num_threads(par ? c->n_threads : 1)
        {
            int lo, hi;
            col_range(C, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
            for (int n = 0; n < N; n++) {
                const float *g = dout + (size_t)n * C, *xr = x + (size_t)n * C;
                float m = mean[n], r = rstd[n];
                if (dw)
                    for (int i = lo; i < hi; i++)
                        dw[i] += g[i] * ((xr[i] - m) * r);
                if (db)
                    for (int i = lo; i < hi; i++)
                        db[i] += g[i];
            }
        }
    }
}

void cpu_rmsnorm_fwd(kn_ctx *c, float *out, float *rstd, const float *x, const float *w, int N,
                     int C, float eps)
{
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if ((size_t)N * C > CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float s = 0.0f;
        for (int i = 0; i < C; i++)
            s += xr[i] * xr[i];
        float r = 1.0f / sqrtf(s / (float)C + eps);
        /* HF's LlamaRMSNorm: w * (x * rstd), in that order. */
        for (int i = 0; i < C; i++)
            o[i] = w[i] * (xr[i] * r);
        rstd[n] = r;
    }
}

void cpu_rmsnorm_bwd(kn_ctx *c, float *dx, float *dw, const float *dout, const float *x,
                     const float *w, const float *rstd, int N, int C)
{
    int par = (size_t)N * C > CPU_PAR_MIN;
    if (dx) {
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (par)
        for (int n = 0; n < N; n++) {
            const float *g = dout + (size_t)n * C, *xr = x + (size_t)n * C;
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
#pragma omp parallel num_threads(par ? c->n_threads : 1)
        {
            int lo, hi;
            col_range(C, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
            for (int n = 0; n < N; n++) {
                const float *g = dout + (size_t)n * C, *xr = x + (size_t)n * C;
                float r = rstd[n];
                for (int i = lo; i < hi; i++)
                    dw[i] += g[i] * (xr[i] * r);
            }
        }
    }
}
