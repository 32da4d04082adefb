/* cpu_loss.c — fused log-softmax cross-entropy and the AdamW update.
 *
 * Cross-entropy never materialises probabilities: per row it finds the max,
 * then sums e^(l - max) in double (a 150k-token vocabulary loses nothing),
 * and the backward writes those exponentials straight into dlogits and
 * rescales them, so every logit costs one exp. dlogits may alias logits:
 * each element is read before it is overwritten, and the target's logit is
 * read first. kn_crossentropy_fwd_bwd does both halves in the same passes.
 * 16-bit logits (the engine's bf16 / fp16 runs) are widened a row at a
 * time into a per-thread fp32 row, so the [N, V] tensor stays 16-bit.
 * A final-logit soft-cap (Gemma 2's final_logit_softcapping) is folded in:
 * the loss is taken on y = cap tanh(z / cap) of the raw logits z, and the
 * gradient is the capped one times dy/dz = 1 - (y / cap)^2; such rows go
 * through the per-thread row buffer too (y must outlive the overwrite).
 * AdamW follows torch.optim.AdamW's single-tensor code step for step, in
 * fp32 with the bias corrections computed in double as Python does. */
#include "cpu.h"
#include "cpu_math.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#define CE_IGNORE (-100)

CPU_HOT static float row_max(const float *l, int V)
{
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < V; j++)
        mx = l[j] > mx ? l[j] : mx;
    return mx;
}

/* sum_j e^(l_j - mx), also stored into e[] when e is not NULL (e may be l). */
CPU_HOT static double row_sumexp(float *e, const float *l, int V, float mx)
{
    double s = 0.0;
    if (e) {
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < V; j++) {
            float v = cpu_expf(l[j] - mx);
            e[j] = v;
            s += (double)v;
        }
    } else {
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < V; j++)
            s += (double)cpu_expf(l[j] - mx);
    }
    return s;
}

CPU_HOT static void row_scale(float *d, int V, float k)
{
#pragma omp simd
    for (int j = 0; j < V; j++)
        d[j] *= k;
}

static void row_fill(float *d, int V, float v)
{
    for (int j = 0; j < V; j++)
        d[j] = v;
}

/* One row of loss and/or gradient; either output may be NULL. */
static void ce_row(float *loss, float *d, const float *l, int32_t t, int V, float scale)
{
    if (t == CE_IGNORE) {
        if (loss) *loss = 0.0f;
        if (d) row_fill(d, V, 0.0f);
        return;
    }
    if (t < 0 || t >= V) {
        /* An out-of-range target has no loss; NaN makes the engine's
         * non-finite check stop the run instead of training on garbage. */
        if (loss) *loss = NAN;
        if (d) row_fill(d, V, NAN);
        return;
    }
    float lt = l[t]; /* before d (maybe == l) is overwritten */
    float mx = row_max(l, V);
    double s = row_sumexp(d, l, V, mx);
    if (loss) *loss = (float)(log(s) - (double)(lt - mx));
    if (d) {
        row_scale(d, V, (float)(scale / s));
        d[t] -= scale;
    }
}

/* A soft-capped row: y = cap tanh(z / cap) in y[] (the thread's buffer,
 * holding z on entry), then the loss and, into d (fp32 row, may be the
 * caller's logits), (softmax(y) - onehot) scale (1 - (y / cap)^2). */
static void ce_row_capped(float *loss, float *d, float *y, int32_t t, int V, float scale, float cap)
{
    if (t == CE_IGNORE || t < 0 || t >= V) {
        ce_row(loss, d, y, t, V, scale);
        return;
    }
    float inv_cap = 1.0f / cap;
    for (int j = 0; j < V; j++)
        y[j] = cap * tanhf(y[j] * inv_cap);
    float mx = row_max(y, V);
    double s = row_sumexp(NULL, y, V, mx);
    if (loss) *loss = (float)(log(s) - (double)(y[t] - mx));
    if (!d) return;
    float k = (float)(scale / s);
    for (int j = 0; j < V; j++) {
        float g = cpu_expf(y[j] - mx) * k, r = y[j] * inv_cap;
        if (j == t) g -= scale;
        d[j] = g * (1.0f - r * r);
    }
}

/* 16-bit logits, or any soft-capped ones: each thread converts its rows
 * one at a time into a V-float buffer, runs the fp32 row there and, for
 * the backward, writes the row back rounded to dt. A row is read whole
 * before it is written, so dlogits may still alias logits. */
static void ce_rows16(kn_ctx *c, kn_dtype dt, float *losses, void *dlogits, const void *logits,
                      const int32_t *targets, int N, int V, float scale, float cap)
{
    size_t es = kn_dtype_size(dt);
    int nt = cpu_threads_for(c, (size_t)N * V);
    int rows = cap > 0.0f ? 2 : 1; /* capped: y and the gradient row */
    float *buf = malloc((size_t)nt * rows * V * sizeof(float));
    if (!buf) {
        kn_fail(c, TY_ENOMEM, "crossentropy: out of memory for %d rows of %d", nt, V);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int n = 0; n < N; n++) {
        float *row = buf + (size_t)omp_get_thread_num() * rows * V;
        cpu_convert_n(row, KN_F32, (const char *)logits + (size_t)n * V * es, dt, (size_t)V);
        float *loss = losses ? losses + n : NULL;
        float *d = dlogits ? (cap > 0.0f ? row + V : row) : NULL;
        if (cap > 0.0f)
            ce_row_capped(loss, d, row, targets[n], V, scale, cap);
        else
            ce_row(loss, d, row, targets[n], V, scale);
        if (dlogits) cpu_convert_n((char *)dlogits + (size_t)n * V * es, dt, d, KN_F32, (size_t)V);
    }
    free(buf);
}

void cpu_crossentropy_fwd(kn_ctx *c, kn_dtype dt, float *losses, const void *logits,
                          const int32_t *targets, int N, int V, float softcap)
{
    if (dt != KN_F32 || softcap > 0.0f) {
        ce_rows16(c, dt, losses, NULL, logits, targets, N, V, 0.0f, softcap);
        return;
    }
    const float *l32 = logits;
#pragma omp parallel for schedule(static) num_threads(cpu_threads_for(c, (size_t)N *V))
    for (int n = 0; n < N; n++)
        ce_row(losses + n, NULL, l32 + (size_t)n * V, targets[n], V, 0.0f);
}

void cpu_crossentropy_fwd_bwd(kn_ctx *c, kn_dtype dt, float *losses, void *dlogits,
                              const void *logits, const int32_t *targets, int N, int V, float scale,
                              float softcap)
{
    if (dt != KN_F32 || softcap > 0.0f) {
        ce_rows16(c, dt, losses, dlogits, logits, targets, N, V, scale, softcap);
        return;
    }
    float *d32 = dlogits;
    const float *l32 = logits;
#pragma omp parallel for schedule(static) num_threads(cpu_threads_for(c, (size_t)N *V))
    for (int n = 0; n < N; n++)
        ce_row(losses ? losses + n : NULL, d32 + (size_t)n * V, l32 + (size_t)n * V, targets[n], V,
               scale);
}

/* x = cap tanh(x / cap): the soft-capped logits that generation and
 * evaluation read (training folds the cap into the cross-entropy). */
void cpu_softcap(kn_ctx *c, float *x, size_t n, float cap)
{
    if (cap <= 0.0f) return;
    float inv_cap = 1.0f / cap;
#pragma omp parallel for schedule(static) num_threads(cpu_threads_for(c, n))
    for (size_t i = 0; i < n; i++)
        x[i] = cap * tanhf(x[i] * inv_cap);
}

CPU_HOT static void adamw_range(float *p, const float *g, float *m, float *v, size_t n, float decay,
                                int do_decay, float b1, float b2, float omb1, float omb2,
                                float step, float bc2_sqrt, float eps)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float pi = do_decay ? p[i] * decay : p[i];
        float mi = m[i] * b1 + gi * omb1;
        float vi = v[i] * b2 + omb2 * gi * gi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi - step * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

void cpu_adamw(kn_ctx *c, kn_dtype pdt, void *p, uint16_t *plo, const float *g, float *m, float *v,
               size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    if (pdt != KN_F32 && (pdt != KN_BF16 || !plo)) {
        kn_fail(c, TY_EINVAL, "adamw: parameters in %s%s", kn_dtype_name(pdt),
                pdt == KN_BF16 ? " need their low halves (plo)" : " are not supported");
        return;
    }
    if (t < 1) t = 1;
    /* As torch 1.13: p.mul_(1 - lr*wd); m.mul_(b1).add_(g, 1-b1);
     * v.mul_(b2).addcmul_(g, g, 1-b2); denom = v.sqrt() / sqrt(bc2) + eps;
     * p.addcdiv_(m, denom, -lr/bc1). */
    double bc1 = 1.0 - pow((double)b1, (double)t);
    double bc2 = 1.0 - pow((double)b2, (double)t);
    float decay = (float)(1.0 - (double)lr * (double)wd);
    float step = (float)((double)lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float omb1 = (float)(1.0 - (double)b1), omb2 = (float)(1.0 - (double)b2);
    float *pf = p;
    uint16_t *ph = p;
#pragma omp parallel num_threads(cpu_threads_for(c, n))
    {
        size_t lo, hi;
        cpu_thread_range(n, 16, &lo, &hi);
        if (pdt == KN_F32) {
            adamw_range(pf + lo, g + lo, m + lo, v + lo, hi - lo, decay, wd != 0.0f, b1, b2, omb1,
                        omb2, step, bc2_sqrt, eps);
        } else { /* split masters: joined 256 at a time, the same update, split again */
            float buf[256];
            for (size_t i = lo; i < hi; i += 256) {
                size_t k = hi - i < 256 ? hi - i : 256;
                for (size_t j = 0; j < k; j++)
                    buf[j] = cpu_join1(ph[i + j], plo[i + j]);
                adamw_range(buf, g + i, m + i, v + i, k, decay, wd != 0.0f, b1, b2, omb1, omb2,
                            step, bc2_sqrt, eps);
                for (size_t j = 0; j < k; j++)
                    cpu_split1(buf[j], ph + i + j, plo + i + j);
            }
        }
    }
}
