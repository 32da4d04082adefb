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

int kv_create(kv_cache *c, model *m, int cap, int nmax, ty_err *err)
{
    memset(c, 0, sizeof *c);
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
                  c->logits, c->probs, c->qk_rstd, c->ids, c->pos};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++)
        kn_free(k, ps[i]);
    memset(c, 0, sizeof *c);
}

void kv_reset(kv_cache *c)
{
    c->len = 0;
}

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
#pragma omp parallel for schedule(static)
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
            kn_matmul_fwd(k, c->q, c->h, PW(m, L->attn_w), PW(m, L->attn_b), n, C, 3 * C);
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
            const float *wq = g->fused ? PW(m, L->attn_w) : PW(m, L->q_w);
            const float *wk = g->fused ? wq + (size_t)QD * C : PW(m, L->k_w);
            const float *wv = g->fused ? wq + (size_t)(QD + KD) * C : PW(m, L->v_w);
            if (g->qk_norm) {
                /* Qwen3: per-head RMSNorm of q and k (from scratch rows) before RoPE */
                kn_matmul_fwd(k, c->att, c->h, wq, PW(m, L->q_b), n, C, QD);
                kn_matmul_fwd(k, c->kk, c->h, wk, PW(m, L->k_b), n, C, KD);
                kn_rmsnorm_fwd(k, KN_F32, c->q, c->qk_rstd, c->att, NW(m, L->qn_w, D), n * Hq, D,
                               g->norm_eps);
                kn_rmsnorm_fwd(k, KN_F32, Kc, c->qk_rstd, c->kk, NW(m, L->kn_w, D), n * Hkv, D,
                               g->norm_eps);
            } else {
                kn_matmul_fwd(k, c->q, c->h, wq, PW(m, L->q_b), n, C, QD);
                kn_matmul_fwd(k, Kc, c->h, wk, PW(m, L->k_b), n, C, KD);
            }
            kn_matmul_fwd(k, Vc, c->h, wv, PW(m, L->v_b), n, C, KD);
            model_rope_layer(m, l, KN_F32, c->q, 1, n, Hq, QD, p0, 0);
            model_rope_layer(m, l, KN_F32, Kc, 1, n, Hkv, KD, p0, 0);
            q = c->q;
            ldq = QD;
        }
        attend(c, l, q, ldq, n, p0);
        kn_matmul_fwd(k, c->tmp, c->att, PW(m, L->o_w), PW(m, L->o_b), n, QD, C);
        if (g->gemma) { /* post_attention norm, into h */
            kn_rmsnorm_fwd(k, KN_F32, c->h, c->rstd, c->tmp, NW(m, L->pan_w, C), n, C, g->norm_eps);
            kn_add(k, KN_F32, c->x, c->x, c->h, (size_t)n * C);
        } else {
            kn_add(k, KN_F32, c->x, c->x, c->tmp, (size_t)n * C);
        }
        if (gpt2) {
            kn_layernorm_fwd(k, KN_F32, c->h, c->mean, c->rstd, c->x, PW(m, L->ln2_w),
                             PW(m, L->ln2_b), n, C, g->norm_eps);
            kn_matmul_fwd(k, c->fc, c->h, PW(m, L->fc_w), PW(m, L->fc_b), n, C, F);
            kn_gelu_fwd(k, KN_F32, c->act, c->fc, (size_t)n * F);
        } else {
            kn_rmsnorm_fwd(k, KN_F32, c->h, c->rstd, c->x, NW(m, L->ln2_w, C), n, C, g->norm_eps);
            kn_matmul_fwd(k, c->fc, c->h, PW(m, L->fc_w), NULL, n, C, F);
            kn_matmul_fwd(k, c->up, c->h,
                          g->fused ? PW(m, L->fc_w) + (size_t)F * C : PW(m, L->up_w), NULL, n, C,
                          F);
            if (g->gemma)
                kn_geglu_fwd(k, KN_F32, c->act, c->fc, c->up, (size_t)n * F);
            else
                kn_swiglu_fwd(k, KN_F32, c->act, c->fc, c->up, (size_t)n * F);
        }
        kn_matmul_fwd(k, c->tmp, c->act, PW(m, L->proj_w), PW(m, L->proj_b), n, F, C);
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
    kn_matmul_fwd(k, c->logits, c->h, PW(m, m->lm_head), NULL, 1, C, V);
    kn_softcap(k, c->logits, (size_t)V, g->final_softcap); /* Gemma 2; 0 = off */
    c->len += n;
    if (kn_check(k, err)) return NULL;
    return c->logits;
}
