/* cpu_loss.c — fused log-softmax cross-entropy and the AdamW update.
 *
 * Cross-entropy never materialises probabilities: the forward keeps only
 * each row's max and log-sum-exp (accumulated in double, so a 150k-token
 * vocabulary loses nothing), and the backward recomputes them, writing the
 * gradient over the logits in place when the caller aliases them. AdamW
 * follows torch.optim.AdamW's single-tensor code step for step, in fp32
 * with the bias corrections computed in double as Python does. */
#include "cpu.h"

#include <math.h>

#define CE_IGNORE (-100)

/* Row max and log(sum(exp(l - max))) of one row of logits. */
static void row_lse(const float *l, int V, float *mx_out, double *lse_out)
{
    float mx = -INFINITY;
    for (int j = 0; j < V; j++)
        mx = l[j] > mx ? l[j] : mx;
    double s = 0.0;
    for (int j = 0; j < V; j++)
        s += (double)expf(l[j] - mx);
    *mx_out = mx;
    *lse_out = log(s);
}

void cpu_crossentropy_fwd(kn_ctx *c, float *losses, const float *logits, const int32_t *targets,
                          int N, int V)
{
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if ((size_t)N * V > CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        int32_t t = targets[n];
        if (t == CE_IGNORE) {
            losses[n] = 0.0f;
            continue;
        }
        if (t < 0 || t >= V) {
            /* An out-of-range target has no loss; NaN makes the engine's
             * non-finite check stop the run instead of training on garbage. */
            losses[n] = NAN;
            continue;
        }
        const float *l = logits + (size_t)n * V;
        float mx;
        double lse;
        row_lse(l, V, &mx, &lse);
        losses[n] = (float)(lse - (double)(l[t] - mx));
    }
}

void cpu_crossentropy_bwd(kn_ctx *c, float *dlogits, const float *logits, const int32_t *targets,
                          int N, int V, float scale)
{
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if ((size_t)N * V > CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        int32_t t = targets[n];
        const float *l = logits + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        if (t == CE_IGNORE) {
            for (int j = 0; j < V; j++)
                d[j] = 0.0f;
            continue;
        }
        if (t < 0 || t >= V) {
            for (int j = 0; j < V; j++)
                d[j] = NAN;
            continue;
        }
        float mx;
        double lse;
        row_lse(l, V, &mx, &lse);
        float shift = mx + (float)lse;
        /* d may alias l: each element is read before it is written. */
        for (int j = 0; j < V; j++)
            d[j] = expf(l[j] - shift) * scale;
        d[t] -= scale;
    }
}

void cpu_adamw(kn_ctx *c, float *p, const float *g, float *m, float *v, size_t n, float lr,
               float b1, float b2, float eps, float wd, int64_t t)
{
    if (t < 1)
        t = 1;
    /* As torch 1.13: p.mul_(1 - lr*wd); m.mul_(b1).add_(g, 1-b1);
     * v.mul_(b2).addcmul_(g, g, 1-b2); denom = v.sqrt() / sqrt(bc2) + eps;
     * p.addcdiv_(m, denom, -lr/bc1). */
    double bc1 = 1.0 - pow((double)b1, (double)t);
    double bc2 = 1.0 - pow((double)b2, (double)t);
    float decay = (float)(1.0 - (double)lr * (double)wd);
    float step = (float)((double)lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float omb1 = (float)(1.0 - (double)b1), omb2 = (float)(1.0 - (double)b2);
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (n > CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float pi = wd != 0.0f ? p[i] * decay : p[i];
        float mi = m[i] * b1 + gi * omb1;
        float vi = v[i] * b2 + omb2 * gi * gi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi - step * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}
