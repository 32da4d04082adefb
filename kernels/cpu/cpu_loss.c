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

/* One cross-entropy job: rows [0, N) of the logits, cut as schedule(static). */
typedef struct ce_job {
    kn_dtype dt;
    float *losses;
    void *dlogits;
    const void *logits;
    const int32_t *targets;
    int N, V, ld;
    float scale, cap;
    float *buf; /* ce_rows16: rows x V floats per thread */
    int rows;
} ce_job;

/* A 16-bit row widened into row[] with its max found in the same pass. */
CPU_HOT static float widen_max(float *row, const void *src, kn_dtype dt, int V)
{
    float mx = -INFINITY;
    if (dt == KN_BF16) {
        const uint16_t *h = src;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < V; j++) {
            float v = cpu_bf16_f32(h[j]);
            row[j] = v;
            mx = v > mx ? v : mx;
        }
    } else {
        const _Float16 *h = src;
        for (int j = 0; j < V; j++) {
            float v = (float)h[j];
            row[j] = v;
            mx = v > mx ? v : mx;
        }
    }
    return mx;
}

/* dst[j] = row[j] k rounded to the 16-bit dt: row_scale and the narrowing
 * conversion in one pass (the same fp32 product, the same rounding). */
CPU_HOT static void narrow_scaled(void *dst, kn_dtype dt, const float *row, int V, float k)
{
    if (dt == KN_BF16) {
        uint16_t *h = dst;
#pragma omp simd
        for (int j = 0; j < V; j++)
            h[j] = cpu_bf16_rne(row[j] * k);
    } else {
        _Float16 *h = dst;
        for (int j = 0; j < V; j++)
            h[j] = (_Float16)(row[j] * k);
    }
}

/* ce_row on a 16-bit row src, its gradient (dst, may be NULL) written in
 * dt: three passes (widen with the max, exponentials with their sum,
 * scale with the narrowing) where converting in and out around ce_row
 * takes five, with the same bits. */
static void ce_row16(float *loss, void *dst, kn_dtype dt, float *row, const void *src, int32_t t,
                     int V, float scale)
{
    if (t == CE_IGNORE || t < 0 || t >= V) { /* ce_row's cases that read nothing */
        ce_row(loss, dst ? row : NULL, row, t, V, scale);
        if (dst) cpu_convert_n(dst, dt, row, KN_F32, (size_t)V);
        return;
    }
    float mx = widen_max(row, src, dt, V);
    float lt = row[t];
    double s = row_sumexp(dst ? row : NULL, row, V, mx);
    if (loss) *loss = (float)(log(s) - (double)(lt - mx));
    if (!dst) return;
    float k = (float)(scale / s), dlt = row[t] * k - scale;
    narrow_scaled(dst, dt, row, V, k);
    cpu_convert_n((char *)dst + (size_t)t * kn_dtype_size(dt), dt, &dlt, KN_F32, 1);
}

static void ce16_job(int tid, int nt, void *arg)
{
    const ce_job *j = arg;
    size_t lo, hi, es = kn_dtype_size(j->dt), V = (size_t)j->V, ld = (size_t)j->ld;
    cpu_pool_static((size_t)j->N, tid, nt, &lo, &hi);
    float *row = j->buf + (size_t)tid * j->rows * V;
    for (size_t n = lo; n < hi; n++) {
        const char *src = (const char *)j->logits + n * ld * es;
        float *loss = j->losses ? j->losses + n : NULL;
        void *dst = j->dlogits ? (char *)j->dlogits + n * ld * es : NULL;
        if (j->dt != KN_F32 && j->cap <= 0.0f) {
            ce_row16(loss, dst, j->dt, row, src, j->targets[n], j->V, j->scale);
            continue;
        }
        cpu_convert_n(row, KN_F32, src, j->dt, V);
        float *d = dst ? (j->cap > 0.0f ? row + V : row) : NULL;
        if (j->cap > 0.0f)
            ce_row_capped(loss, d, row, j->targets[n], j->V, j->scale, j->cap);
        else
            ce_row(loss, d, row, j->targets[n], j->V, j->scale);
        if (dst) cpu_convert_n(dst, j->dt, d, KN_F32, V);
    }
}

/* The fp32 rows in place: ce_row on the logits and dlogits as given. */
static void ce32_range(size_t lo, size_t hi, void *arg)
{
    const ce_job *j = arg;
    const float *l32 = j->logits;
    float *d32 = j->dlogits;
    size_t ld = (size_t)j->ld;
    for (size_t n = lo; n < hi; n++)
        ce_row(j->losses ? j->losses + n : NULL, d32 ? d32 + n * ld : NULL, l32 + n * ld,
               j->targets[n], j->V, j->scale);
}

/* 16-bit logits, or any soft-capped ones: each thread widens its rows
 * one at a time into a V-float buffer, runs the fp32 row there (ce_row16
 * fuses the widening and the narrowing into its passes) and, for the
 * backward, writes the row back rounded to dt. A row is read whole
 * before it is written, so dlogits may still alias logits. */
static void ce_rows16(kn_ctx *c, kn_dtype dt, float *losses, void *dlogits, const void *logits,
                      const int32_t *targets, int N, int V, int ld, float scale, float cap)
{
    int nt = cpu_threads_for(c, (size_t)N * V);
    int rows = cap > 0.0f ? 2 : 1; /* capped: y and the gradient row */
    float *buf = malloc((size_t)nt * rows * V * sizeof(float));
    if (!buf) {
        kn_fail(c, TY_ENOMEM, "crossentropy: out of memory for %d rows of %d", nt, V);
        return;
    }
    ce_job j = {dt, losses, dlogits, logits, targets, N, V, ld, scale, cap, buf, rows};
    cpu_pool_run(c, nt, ce16_job, &j);
    free(buf);
}

void cpu_crossentropy_fwd(kn_ctx *c, kn_dtype dt, float *losses, const void *logits,
                          const int32_t *targets, int N, int V, int ld, float softcap)
{
    if (dt != KN_F32 || softcap > 0.0f) {
        ce_rows16(c, dt, losses, NULL, logits, targets, N, V, ld, 0.0f, softcap);
        return;
    }
    ce_job j = {.dt = dt, .losses = losses, .logits = logits, .targets = targets, .V = V, .ld = ld};
    cpu_pool_for(c, cpu_threads_for(c, (size_t)N * V), N > 0 ? (size_t)N : 0, ce32_range, &j);
}

void cpu_crossentropy_fwd_bwd(kn_ctx *c, kn_dtype dt, float *losses, void *dlogits,
                              const void *logits, const int32_t *targets, int N, int V, int ld,
                              float scale, float softcap)
{
    if (dt != KN_F32 || softcap > 0.0f) {
        ce_rows16(c, dt, losses, dlogits, logits, targets, N, V, ld, scale, softcap);
        return;
    }
    ce_job j = {.dt = dt,
                .losses = losses,
                .dlogits = dlogits,
                .logits = logits,
                .targets = targets,
                .V = V,
                .ld = ld,
                .scale = scale};
    cpu_pool_for(c, cpu_threads_for(c, (size_t)N * V), N > 0 ? (size_t)N : 0, ce32_range, &j);
}

/* x = cap tanh(x / cap): the soft-capped logits that generation and
 * evaluation read (training folds the cap into the cross-entropy). */
static void softcap_range(size_t lo, size_t hi, void *arg)
{
    const ce_job *j = arg;
    float *x = j->dlogits, cap = j->cap, inv_cap = j->scale;
    for (size_t i = lo; i < hi; i++)
        x[i] = cap * tanhf(x[i] * inv_cap);
}

void cpu_softcap(kn_ctx *c, float *x, size_t n, float cap)
{
    if (cap <= 0.0f) return;
    ce_job j = {.dlogits = x, .cap = cap, .scale = 1.0f / cap};
    cpu_pool_for(c, cpu_threads_for(c, n), n, softcap_range, &j);
}

/* As torch 1.13: p.mul_(1 - lr*wd); m.mul_(b1).add_(g, 1-b1);
 * v.mul_(b2).addcmul_(g, g, 1-b2); denom = v.sqrt() / sqrt(bc2) + eps;
 * p.addcdiv_(m, denom, -lr/bc1); g is read times gs0, then times gs1, the
 * two fp32 multiplies an unscale pass and a clip pass would make. One
 * element: the new p; m and v updated in place. Both loops below inline
 * it, so fp32 and split masters get the same arithmetic. */
static inline __attribute__((always_inline)) float
adamw_one(float p, float g, float *m, float *v, float decay, int do_decay, const kn_adamw_k *k)
{
    float gi = g * k->gs0 * k->gs1;
    float pi = do_decay ? p * decay : p;
    float mi = *m * k->b1 + gi * k->omb1;
    float vi = *v * k->b2 + k->omb2 * gi * gi;
    float denom = sqrtf(vi) / k->bc2_sqrt + k->eps;
    *m = mi;
    *v = vi;
    return pi - k->step * (mi / denom);
}

CPU_HOT static void adamw_range(float *p, float *g, float *m, float *v, size_t n, float decay,
                                int do_decay, int zero_grad, const kn_adamw_k *k)
{
    kn_adamw_k kk = *k;
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        p[i] = adamw_one(p[i], g[i], m + i, v + i, decay, do_decay, &kk);
        if (zero_grad) g[i] = 0.0f;
    }
}

/* The same on split masters (cpu_split1 / cpu_join1): each master joined
 * from its bf16 hi and 16-bit lo, updated and split again in one pass,
 * without branches so that it vectorises (a NaN's split is a select). */
CPU_HOT static void adamw_split_range(uint16_t *ph, uint16_t *pl, float *g, float *m, float *v,
                                      size_t n, float decay, int do_decay, int zero_grad,
                                      const kn_adamw_k *k)
{
    kn_adamw_k kk = *k;
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        union {
            uint32_t u;
            float f;
        } x = {((uint32_t)ph[i] << 16) + (uint32_t)(int32_t)(int16_t)pl[i]};
        x.f = adamw_one(x.f, g[i], m + i, v + i, decay, do_decay, &kk);
        uint32_t u = x.u;
        uint32_t h = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        int32_t d = (int32_t)(u - (h << 16));
        d = d == 0x8000 ? 0x7fff : d;
        int nan = (u & 0x7fffffffu) > 0x7f800000u;
        ph[i] = (uint16_t)(nan ? (u >> 16) | 0x40u : h);
        pl[i] = (uint16_t)(int16_t)(nan ? 0 : d);
        if (zero_grad) g[i] = 0.0f;
    }
}

/* Elements [i, j) of one block; zero_grad clears g as it is read. */
static void adamw_piece(const kn_adamw_block *b, size_t i, size_t j, float lr, const kn_adamw_k *k,
                        int zero_grad)
{
    float decay = kn_adamw_decay(lr, b->wd);
    size_t n = j - i;
    if (b->pdt == KN_F32)
        adamw_range((float *)b->p + i, b->g + i, b->m + i, b->v + i, n, decay, b->wd != 0.0f,
                    zero_grad, k);
    else
        adamw_split_range((uint16_t *)b->p + i, b->plo + i, b->g + i, b->m + i, b->v + i, n, decay,
                          b->wd != 0.0f, zero_grad, k);
}

typedef struct adamw_job {
    const kn_adamw_block *b;
    int nb;
    size_t total;
    const kn_adamw_hp *hp;
    kn_adamw_k k;
} adamw_job;

static void adamw_job_run(int tid, int nt, void *arg)
{
    const adamw_job *j = arg;
    const kn_adamw_block *b = j->b;
    size_t lo, hi, off = 0;
    cpu_thread_range(j->total, 16, tid, nt, &lo, &hi);
    for (int i = 0; i < j->nb && off < hi; off += b[i].n, i++) {
        size_t a = lo > off ? lo - off : 0, e = hi - off < b[i].n ? hi - off : b[i].n;
        if (a < e) adamw_piece(&b[i], a, e, j->hp->lr, &j->k, j->hp->zero_grad);
    }
}

/* All blocks in one parallel job: the blocks laid end to end are one
 * index range, cut into equal thread shares (64-byte steps); a thread
 * updates the pieces of the blocks its share covers. */
void cpu_adamw_blocks(kn_ctx *c, const kn_adamw_block *b, int nb, kn_adamw_hp hp)
{
    size_t total = 0;
    if (!kn_adamw_blocks_ok(c, b, nb)) return;
    for (int i = 0; i < nb; i++)
        total += b[i].n;
    if (!total) return;
    adamw_job j = {b, nb, total, &hp, kn_adamw_consts(&hp)};
    cpu_pool_run(c, cpu_threads_for(c, total), adamw_job_run, &j);
}

void cpu_adamw(kn_ctx *c, kn_dtype pdt, void *p, uint16_t *plo, const float *g, float *m, float *v,
               size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    kn_adamw_block b = {p, plo, (float *)g, m, v, n, wd, pdt};
    kn_adamw_hp hp = {lr, b1, b2, eps, t, {1.0f, 1.0f}, 0};
    cpu_adamw_blocks(c, &b, 1, hp);
}
