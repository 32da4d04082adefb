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
 * Rows are ld elements apart (ld >= V, the logits' leading dimension);
 * columns V..ld-1 are neither read nor written.
 * A final-logit soft-cap (Gemma 2's final_logit_softcapping) is folded in:
 * the loss is taken on y = cap tanh(z / cap) of the raw logits z, and the
 * gradient is the capped one times dy/dz = 1 - (y / cap)^2; such rows go
 * through the per-thread row buffer too (y must outlive the overwrite).
 * AdamW follows torch.optim.AdamW's single-tensor code step for step, in
 * fp32 with the bias corrections computed in double as Python does; a
 * model's tensors go through it as one list of blocks in one parallel
 * region, the gradient's unscale and clip factors applied in register and
 * the gradient cleared behind the update (kn_adamw_blocks), so the
 * optimizer's tail reads each gradient once. */
#include "cpu.h"
#include "cpu_math.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

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
                      const int32_t *targets, int N, int V, int ld, float scale, float cap)
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
        cpu_convert_n(row, KN_F32, (const char *)logits + (size_t)n * ld * es, dt, (size_t)V);
        float *loss = losses ? losses + n : NULL;
        float *d = dlogits ? (cap > 0.0f ? row + V : row) : NULL;
        if (cap > 0.0f)
            ce_row_capped(loss, d, row, targets[n], V, scale, cap);
        else
            ce_row(loss, d, row, targets[n], V, scale);
        if (dlogits) cpu_convert_n((char *)dlogits + (size_t)n * ld * es, dt, d, KN_F32, (size_t)V);
    }
    free(buf);
}

void cpu_crossentropy_fwd(kn_ctx *c, kn_dtype dt, float *losses, const void *logits,
                          const int32_t *targets, int N, int V, int ld, float softcap)
{
    if (dt != KN_F32 || softcap > 0.0f) {
        ce_rows16(c, dt, losses, NULL, logits, targets, N, V, ld, 0.0f, softcap);
        return;
    }
    const float *l32 = logits;
#pragma omp parallel for schedule(static) num_threads(cpu_threads_for(c, (size_t)N *V))
    for (int n = 0; n < N; n++)
        ce_row(losses + n, NULL, l32 + (size_t)n * ld, targets[n], V, 0.0f);
}

void cpu_crossentropy_fwd_bwd(kn_ctx *c, kn_dtype dt, float *losses, void *dlogits,
                              const void *logits, const int32_t *targets, int N, int V, int ld,
                              float scale, float softcap)
{
    if (dt != KN_F32 || softcap > 0.0f) {
        ce_rows16(c, dt, losses, dlogits, logits, targets, N, V, ld, scale, softcap);
        return;
    }
    float *d32 = dlogits;
    const float *l32 = logits;
#pragma omp parallel for schedule(static) num_threads(cpu_threads_for(c, (size_t)N *V))
    for (int n = 0; n < N; n++)
        ce_row(losses ? losses + n : NULL, d32 + (size_t)n * ld, l32 + (size_t)n * ld, targets[n],
               V, scale);
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

/* The per-update constants of torch 1.13's AdamW, and the gradient's two
 * factors (kn_adamw_hp.gscale). */
typedef struct adamw_k {
    float b1, b2, omb1, omb2, step, bc2_sqrt, eps, gs0, gs1;
} adamw_k;

/* As torch 1.13: p.mul_(1 - lr*wd); m.mul_(b1).add_(g, 1-b1);
 * v.mul_(b2).addcmul_(g, g, 1-b2); denom = v.sqrt() / sqrt(bc2) + eps;
 * p.addcdiv_(m, denom, -lr/bc1); g is read times gs0, then times gs1, the
 * two fp32 multiplies an unscale pass and a clip pass would make. */
CPU_HOT static void adamw_range(float *p, const float *g, float *m, float *v, size_t n, float decay,
                                int do_decay, const adamw_k *k)
{
    float b1 = k->b1, b2 = k->b2, omb1 = k->omb1, omb2 = k->omb2, step = k->step;
    float bc2_sqrt = k->bc2_sqrt, eps = k->eps, gs0 = k->gs0, gs1 = k->gs1;
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gs0 * gs1;
        float pi = do_decay ? p[i] * decay : p[i];
        float mi = m[i] * b1 + gi * omb1;
        float vi = v[i] * b2 + omb2 * gi * gi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi - step * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

/* Elements updated at a time: a tile of p, g, m, v stays in L1 while the
 * gradient is cleared and split masters are joined and split again. */
#define ADAMW_TILE 1024

/* Elements [i, j) of one block; zero_grad clears g behind the update. */
static void adamw_piece(const kn_adamw_block *b, size_t i, size_t j, float lr, const adamw_k *k,
                        int zero_grad)
{
    float decay = (float)(1.0 - (double)lr * (double)b->wd);
    float *pf = b->p;
    uint16_t *ph = b->p;
    for (; i < j; i += ADAMW_TILE) {
        size_t len = j - i < ADAMW_TILE ? j - i : ADAMW_TILE;
        if (b->pdt == KN_F32) {
            adamw_range(pf + i, b->g + i, b->m + i, b->v + i, len, decay, b->wd != 0.0f, k);
        } else { /* split masters: joined, the same update, split again */
            float buf[ADAMW_TILE];
            for (size_t e = 0; e < len; e++)
                buf[e] = cpu_join1(ph[i + e], b->plo[i + e]);
            adamw_range(buf, b->g + i, b->m + i, b->v + i, len, decay, b->wd != 0.0f, k);
            for (size_t e = 0; e < len; e++)
                cpu_split1(buf[e], ph + i + e, b->plo + i + e);
        }
        if (zero_grad) memset(b->g + i, 0, len * sizeof *b->g);
    }
}

static int adamw_blocks_ok(kn_ctx *c, const kn_adamw_block *b, int nb, size_t *total)
{
    *total = 0;
    for (int i = 0; i < nb; i++) {
        kn_dtype pdt = b[i].pdt;
        if (pdt != KN_F32 && (pdt != KN_BF16 || !b[i].plo)) {
            kn_fail(c, TY_EINVAL, "adamw: parameters in %s%s", kn_dtype_name(pdt),
                    pdt == KN_BF16 ? " need their low halves (plo)" : " are not supported");
            return 0;
        }
        *total += b[i].n;
    }
    return 1;
}

static adamw_k adamw_consts(const kn_adamw_hp *hp)
{
    int64_t t = hp->t < 1 ? 1 : hp->t;
    double bc1 = 1.0 - pow((double)hp->b1, (double)t);
    double bc2 = 1.0 - pow((double)hp->b2, (double)t);
    adamw_k k = {hp->b1,
                 hp->b2,
                 (float)(1.0 - (double)hp->b1),
                 (float)(1.0 - (double)hp->b2),
                 (float)((double)hp->lr / bc1),
                 (float)sqrt(bc2),
                 hp->eps,
                 hp->gscale[0],
                 hp->gscale[1]};
    return k;
}

/* All blocks in one parallel region: the blocks laid end to end are one
 * index range, cut into equal thread shares (64-byte steps); a thread
 * updates the pieces of the blocks its share covers. */
void cpu_adamw_blocks(kn_ctx *c, const kn_adamw_block *b, int nb, kn_adamw_hp hp)
{
    size_t total;
    if (!adamw_blocks_ok(c, b, nb, &total) || !total) return;
    adamw_k k = adamw_consts(&hp);
#pragma omp parallel num_threads(cpu_threads_for(c, total))
    {
        size_t lo, hi, off = 0;
        cpu_thread_range(total, 16, &lo, &hi);
        for (int i = 0; i < nb && off < hi; off += b[i].n, i++) {
            size_t a = lo > off ? lo - off : 0, e = hi - off < b[i].n ? hi - off : b[i].n;
            if (a < e) adamw_piece(&b[i], a, e, hp.lr, &k, hp.zero_grad);
        }
    }
}

void cpu_adamw(kn_ctx *c, kn_dtype pdt, void *p, uint16_t *plo, const float *g, float *m, float *v,
               size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    kn_adamw_block b = {p, plo, (float *)g, m, v, n, wd, pdt};
    kn_adamw_hp hp = {lr, b1, b2, eps, t, {1.0f, 1.0f}, 0};
    cpu_adamw_blocks(c, &b, 1, hp);
}
