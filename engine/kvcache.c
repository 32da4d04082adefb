/* kvcache.c — see kvcache.h. One step: embeddings of the n new tokens, then
 * per layer norm -> q/k/v -> RoPE at the absolute positions -> append k/v
 * to the cache -> attention of each new row over cache rows [0, its
 * position] -> output projection -> residual -> MLP -> residual; finally
 * the last row's norm and the lm_head. Gemma 2 / 3 as in model.c: embeddings
 * times sqrt(hidden), norms by 1 + w, post-norms closing both branches,
 * GeGLU, the attention's scale, soft-cap and sliding window (a sliding
 * layer's row sees its last `window` positions of the cache), and the
 * final logits soft-capped. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvcache.h"

#define PW(m, i) ((i) >= 0 ? (m)->params + (m)->t[i].off : NULL)
/* A norm's weight as the kernels take it (Gemma: 1 + w). */
#define NW(m, i, n) model_norm_w((m), PW(m, i), (n))

/* Matmul weight i (plus `at` elements, for a row block of a fused weight)
 * in the cache's weight type: the fp32 parameters, or their 16-bit copy. */
static const void *mw(const kv_cache *c, int i, size_t at)
{
    size_t off = c->m->t[i].off + at;
    if (c->wdt == KN_F32) return c->m->params + off;
    return (const char *)c->w16 + off * kn_dtype_size(c->wdt);
}

/* out[n, M] = x[n, K] w^T + b. With 16-bit weights x is first rounded to
 * their type (in place: every x here is scratch read by this product and
 * its siblings only), as kn_matmul16 expects and as transformers computes
 * a 16-bit model; the accumulation and out stay fp32. */
static void mm(kv_cache *c, float *out, float *x, const void *w, const float *b, int n, int K,
               int M)
{
    kn_ctx *k = c->m->kn;
    if (c->wdt == KN_F32) {
        kn_matmul_fwd(k, out, x, w, b, n, K, M);
        return;
    }
    kn_round(k, x, (size_t)n * K, c->wdt);
    kn_matmul16_fwd(k, c->wdt, KN_F32, KN_F32, out, x, w, b, n, K, M);
}

int kv_create(kv_cache *c, model *m, int cap, int nmax, ty_err *err)
{
    memset(c, 0, sizeof *c);
    c->wdt = KN_F32;
    const model_config *g = &m->cfg;
    if (m->adapter.state)
        return ty_err_set(err, TY_EINVAL, "kv cache: merge the LoRA adapters before generating");
    if (cap < 1 || nmax < 1 || nmax > cap)
        return ty_err_set(err, TY_EINVAL, "kv cache: bad sizes %d / %d", cap, nmax);
    c->m = m;
    c->cap = cap;
    c->nmax = nmax;
    size_t C = g->dim, F = g->ffn, V = g->vocab, QD = (size_t)g->n_head * g->head_dim,
           KD = (size_t)g->n_kv_head * g->head_dim, N = nmax;
    size_t qkv = g->arch == ARCH_GPT2 ? 3 * C : QD; /* GPT-2 keeps the fused rows */
    size_t kvn = (size_t)g->n_layer * cap * KD;
    c->k = kn_alloc(m->kn, kvn * sizeof(float));
    c->v = kn_alloc(m->kn, kvn * sizeof(float));
#define A(f, n) c->f = kn_alloc(m->kn, (n) * sizeof *c->f)
    A(x, N * C);
    A(h, N * C);
    A(mean, N);
    A(rstd, N);
    A(q, N * qkv);
    A(kk, N * KD);
    A(vv, N * KD);
    A(att, N * QD);
    A(tmp, N * C);
    A(fc, N * F);
    A(up, N * F);
    A(act, N * F);
    A(logits, V);
    A(probs, (size_t)g->n_head * cap);
    A(qk_rstd, N * g->n_head);
    A(ids, N);
    A(pos, N);
#undef A
    if (!c->k || !c->v || !c->x || !c->h || !c->mean || !c->rstd || !c->q || !c->kk || !c->vv ||
        !c->att || !c->tmp || !c->fc || !c->up || !c->act || !c->logits || !c->probs ||
        !c->qk_rstd || !c->ids || !c->pos) {
        kv_free(c);
        return ty_err_set(err, TY_ENOMEM, "out of memory for a kv cache of %d positions", cap);
    }
    return 0;
}

void kv_free(kv_cache *c)
{
    if (!c->m) return;
    kn_ctx *k = c->m->kn;
    void *ps[] = {c->k,      c->v,     c->x,       c->h,   c->mean, c->rstd, c->q,
                  c->kk,     c->vv,    c->att,     c->tmp, c->fc,   c->up,   c->act,
                  c->logits, c->probs, c->qk_rstd, c->ids, c->pos,  c->w16};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++)
        kn_free(k, ps[i]);
    memset(c, 0, sizeof *c);
}

int kv_set_weights(kv_cache *c, kn_dtype wdt, ty_err *err)
{
    model *m = c->m;
    if (wdt == c->wdt) return 0;
    if (wdt != KN_BF16 && wdt != KN_F16)
        return ty_err_set(err, TY_EINVAL, "kv cache: weights can be fp32, bf16 or fp16");
    if (!m->params)
        return ty_err_set(err, TY_EINVAL, "kv cache: the model has no fp32 parameters to round");
    size_t total = m->t[m->nt - 1].off + m->t[m->nt - 1].numel;
    kn_free(m->kn, c->w16);
    c->w16 = kn_alloc(m->kn, total * kn_dtype_size(wdt));
    if (!c->w16) {
        c->wdt = KN_F32;
        return ty_err_set(err, TY_ENOMEM, "out of memory for %zu %s weights", total,
                          kn_dtype_name(wdt));
    }
    /* All weights take the type, as transformers' model.to(dtype) does: the
     * fp32 parameters the norms, biases and embeddings read are rounded in
     * place (a no-op for a 16-bit checkpoint), then copied in 16 bits. */
    kn_round(m->kn, m->params, total, wdt);
    kn_convert(m->kn, c->w16, wdt, m->params, KN_F32, total);
    c->wdt = wdt;
    return kn_check(m->kn, err);
}

void kv_reset(kv_cache *c)
{
    c->len = 0;
}

/* Multiply-adds (heads x positions x head_dim) below which a row's
 * attention runs on one thread. */
#define ATTEND_PAR_MIN 65536

/* out[n, Hq*D]: row i (absolute position p0 + i) attends over cache rows
 * 0..p0+i of its kv head; softmax in double for the normaliser. */
static void attend(kv_cache *c, int layer, const float *q, int ldq, int n, int p0)
{
    const model_config *g = &c->m->cfg;
    int Hq = g->n_head, Hkv = g->n_kv_head, D = g->head_dim, QD = Hq * D, KD = Hkv * D;
    int rep = Hq / Hkv;
    const float *K = c->k + (size_t)layer * c->cap * KD, *Vc = c->v + (size_t)layer * c->cap * KD;
    float scale = g->attn_scale != 0.0f ? g->attn_scale : 1.0f / sqrtf((float)D);
    float cap = g->attn_softcap;
    int window = hfconfig_sliding(g, layer) ? g->window : 0;
    for (int i = 0; i < n; i++) {
        int last = p0 + i, lo = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
        /* threads only when the row has the work to pay for waking them:
         * one decode step over a short cache is a few microseconds */
        long work = (long)Hq * (last - lo + 1) * D;
#pragma omp parallel for schedule(static) if (work > ATTEND_PAR_MIN)
        for (int h = 0; h < Hq; h++) {
            const float *qh = q + (size_t)i * ldq + (size_t)h * D;
            int kh = h / rep;
            float *s = c->probs + (size_t)h * c->cap;
            float mx = -INFINITY;
            for (int j = lo; j <= last; j++) {
                const float *kj = K + (size_t)j * KD + (size_t)kh * D;
                float d = 0;
                for (int e = 0; e < D; e++)
                    d += qh[e] * kj[e];
                s[j] = d * scale;
                if (cap > 0.0f) s[j] = cap * tanhf(s[j] / cap);
                if (s[j] > mx) mx = s[j];
            }
            double sum = 0;
            for (int j = lo; j <= last; j++) {
                s[j] = expf(s[j] - mx);
                sum += s[j];
            }
            float inv = (float)(1.0 / sum);
            float *o = c->att + (size_t)i * QD + (size_t)h * D;
            for (int e = 0; e < D; e++)
                o[e] = 0;
            for (int j = lo; j <= last; j++) {
                const float *vj = Vc + (size_t)j * KD + (size_t)kh * D;
                float p = s[j] * inv;
                for (int e = 0; e < D; e++)
                    o[e] += p * vj[e];
            }
        }
    }
}

const float *kv_step(kv_cache *c, const int32_t *ids, int n, ty_err *err)
{
    model *m = c->m;
    kn_ctx *k = m->kn;
    const model_config *g = &m->cfg;
    if (n < 1 || n > c->nmax || c->len + n > c->cap) {
        ty_err_set(err, TY_EINVAL, "kv cache: %d positions would exceed its %d", c->len + n,
                   c->cap);
        return NULL;
    }
    int C = g->dim, F = g->ffn, V = g->vocab, Hq = g->n_head, Hkv = g->n_kv_head, D = g->head_dim;
    int QD = Hq * D, KD = Hkv * D, gpt2 = g->arch == ARCH_GPT2, p0 = c->len;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V) {
            ty_err_set(err, TY_EINVAL, "token id %d is outside the vocabulary [0, %d)", ids[i], V);
            return NULL;
        }
    }
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    if (!pos) {
        ty_err_set(err, TY_ENOMEM, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        pos[i] = p0 + i;
    kn_to_device(k, c->ids, ids, (size_t)n * sizeof *ids);
    kn_to_device(k, c->pos, pos, (size_t)n * sizeof *pos);
    free(pos);
    kn_embedding_fwd(k, KN_F32, c->x, c->ids, PW(m, m->wte), n, C, 0);
    if (g->gemma) kn_scale(k, c->x, (size_t)n * C, (float)sqrt((double)C));
    if (gpt2) kn_embedding_fwd(k, KN_F32, c->x, c->pos, PW(m, m->wpe), n, C, 1);

    for (int l = 0; l < g->n_layer; l++) {
        const layer_ix *L = &m->L[l];
        float *Kc = c->k + ((size_t)l * c->cap + p0) * KD,
              *Vc = c->v + ((size_t)l * c->cap + p0) * KD;
        const float *q;
        int ldq;
        if (gpt2) {
            kn_layernorm_fwd(k, KN_F32, c->h, c->mean, c->rstd, c->x, PW(m, L->ln1_w),
                             PW(m, L->ln1_b), n, C, g->norm_eps);
            mm(c, c->q, c->h, mw(c, L->attn_w, 0), PW(m, L->attn_b), n, C, 3 * C);
            for (int i = 0; i < n; i++) {
                memcpy(Kc + (size_t)i * KD, c->q + (size_t)i * 3 * C + C,
                       (size_t)C * sizeof(float));
                memcpy(Vc + (size_t)i * KD, c->q + (size_t)i * 3 * C + 2 * C,
                       (size_t)C * sizeof(float));
            }
            q = c->q;
            ldq = 3 * C;
        } else {
            kn_rmsnorm_fwd(k, KN_F32, c->h, c->rstd, c->x, NW(m, L->ln1_w, C), n, C, g->norm_eps);
            /* Phi-3: q, k, v weights are row blocks of the fused qkv_proj */
            const void *wq = g->fused ? mw(c, L->attn_w, 0) : mw(c, L->q_w, 0);
            const void *wk = g->fused ? mw(c, L->attn_w, (size_t)QD * C) : mw(c, L->k_w, 0);
            const void *wv = g->fused ? mw(c, L->attn_w, (size_t)(QD + KD) * C) : mw(c, L->v_w, 0);
            if (g->qk_norm) {
                /* Qwen3: per-head RMSNorm of q and k (from scratch rows) before RoPE */
                mm(c, c->att, c->h, wq, PW(m, L->q_b), n, C, QD);
                mm(c, c->kk, c->h, wk, PW(m, L->k_b), n, C, KD);
                kn_rmsnorm_fwd(k, KN_F32, c->q, c->qk_rstd, c->att, NW(m, L->qn_w, D), n * Hq, D,
                               g->norm_eps);
                kn_rmsnorm_fwd(k, KN_F32, Kc, c->qk_rstd, c->kk, NW(m, L->kn_w, D), n * Hkv, D,
                               g->norm_eps);
            } else {
                mm(c, c->q, c->h, wq, PW(m, L->q_b), n, C, QD);
                mm(c, Kc, c->h, wk, PW(m, L->k_b), n, C, KD);
            }
            mm(c, Vc, c->h, wv, PW(m, L->v_b), n, C, KD);
            model_rope_layer(m, l, KN_F32, c->q, 1, n, Hq, QD, p0, 0);
            model_rope_layer(m, l, KN_F32, Kc, 1, n, Hkv, KD, p0, 0);
            q = c->q;
            ldq = QD;
        }
        attend(c, l, q, ldq, n, p0);
        mm(c, c->tmp, c->att, mw(c, L->o_w, 0), PW(m, L->o_b), n, QD, C);
        if (g->gemma) { /* post_attention norm, into h */
            kn_rmsnorm_fwd(k, KN_F32, c->h, c->rstd, c->tmp, NW(m, L->pan_w, C), n, C, g->norm_eps);
            kn_add(k, KN_F32, c->x, c->x, c->h, (size_t)n * C);
        } else {
            kn_add(k, KN_F32, c->x, c->x, c->tmp, (size_t)n * C);
        }
        if (gpt2) {
            kn_layernorm_fwd(k, KN_F32, c->h, c->mean, c->rstd, c->x, PW(m, L->ln2_w),
                             PW(m, L->ln2_b), n, C, g->norm_eps);
            mm(c, c->fc, c->h, mw(c, L->fc_w, 0), PW(m, L->fc_b), n, C, F);
            kn_gelu_fwd(k, KN_F32, c->act, c->fc, (size_t)n * F);
        } else {
            kn_rmsnorm_fwd(k, KN_F32, c->h, c->rstd, c->x, NW(m, L->ln2_w, C), n, C, g->norm_eps);
            mm(c, c->fc, c->h, mw(c, L->fc_w, 0), NULL, n, C, F);
            mm(c, c->up, c->h, g->fused ? mw(c, L->fc_w, (size_t)F * C) : mw(c, L->up_w, 0), NULL,
               n, C, F);
            if (g->gemma)
                kn_geglu_fwd(k, KN_F32, c->act, c->fc, c->up, (size_t)n * F);
            else
                kn_swiglu_fwd(k, KN_F32, c->act, c->fc, c->up, (size_t)n * F);
        }
        mm(c, c->tmp, c->act, mw(c, L->proj_w, 0), PW(m, L->proj_b), n, F, C);
        if (g->gemma) { /* post_feedforward norm, into h */
            kn_rmsnorm_fwd(k, KN_F32, c->h, c->rstd, c->tmp, NW(m, L->pfn_w, C), n, C, g->norm_eps);
            kn_add(k, KN_F32, c->x, c->x, c->h, (size_t)n * C);
        } else {
            kn_add(k, KN_F32, c->x, c->x, c->tmp, (size_t)n * C);
        }
    }
    /* Only the last row's logits are needed. */
    const float *last = c->x + (size_t)(n - 1) * C;
    if (gpt2)
        kn_layernorm_fwd(k, KN_F32, c->h, c->mean, c->rstd, last, PW(m, m->lnf_w), PW(m, m->lnf_b),
                         1, C, g->norm_eps);
    else
        kn_rmsnorm_fwd(k, KN_F32, c->h, c->rstd, last, NW(m, m->lnf_w, C), 1, C, g->norm_eps);
    mm(c, c->logits, c->h, mw(c, m->lm_head, 0), NULL, 1, C, V);
    kn_softcap(k, c->logits, (size_t)V, g->final_softcap); /* Gemma 2; 0 = off */
    c->len += n;
    if (kn_check(k, err)) return NULL;
    return c->logits;
}
