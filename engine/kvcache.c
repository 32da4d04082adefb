/* kvcache.c — see kvcache.h. The cache's memory and bookkeeping; the
 * forward of a step is model_forward_kv (model.c). */
#include <stdlib.h>
#include <string.h>

#include "kvcache.h"

int kv_create(kv_cache *c, model *m, int cap, int nmax, ty_err *err)
{
    memset(c, 0, sizeof *c);
    const model_config *g = &m->cfg;
    if (m->adapter.state)
        return ty_err_set(err, TY_EINVAL, "kv cache: merge the LoRA adapters before generating");
    if (m->dt != KN_F32)
        return ty_err_set(err, TY_EINVAL, "kv cache: the model must store fp32 activations");
    if (cap < 1 || nmax < 1 || nmax > cap)
        return ty_err_set(err, TY_EINVAL, "kv cache: bad sizes %d / %d", cap, nmax);
    c->m = m;
    c->nmax = nmax;
    int Hkv = g->arch == ARCH_GPT2 ? g->n_head : g->n_kv_head;
    size_t kvn = (size_t)g->n_layer * cap * Hkv * g->head_dim;
    c->kv.k = kn_alloc(m->kn, kvn * sizeof(float));
    c->kv.v = kn_alloc(m->kn, kvn * sizeof(float));
    c->kv.cap = cap;
    c->logits = kn_alloc(m->kn, (size_t)g->vocab * sizeof(float));
    if (!c->kv.k || !c->kv.v || !c->logits) {
        kv_free(c);
        return ty_err_set(err, TY_ENOMEM, "out of memory for a kv cache of %d positions", cap);
    }
    /* one sequence of up to nmax rows a step, forward only: each layer
     * keeps only its output (recompute all's arena) */
    m->inference = 1;
    int rc = model_alloc_acts(m, 1, nmax, MODEL_RECOMPUTE_ALL, err);
    if (rc) kv_free(c);
    return rc;
}

void kv_free(kv_cache *c)
{
    if (!c->m) return;
    kn_ctx *k = c->m->kn;
    kn_free(k, c->kv.k);
    kn_free(k, c->kv.v);
    kn_free(k, c->logits);
    model_free_acts(c->m);
    c->m->inference = 0;
    memset(c, 0, sizeof *c);
}

int kv_set_weights(kv_cache *c, kn_dtype wdt, ty_err *err)
{
    return model_infer_weights(c->m, wdt, err);
}

void kv_reset(kv_cache *c)
{
    c->kv.len = 0;
}

const float *kv_step(kv_cache *c, const int32_t *ids, int n, ty_err *err)
{
    model *m = c->m;
    int V = m->cfg.vocab;
    if (n < 1 || n > c->nmax || c->kv.len + n > c->kv.cap) {
        ty_err_set(err, TY_EINVAL, "kv cache: %d positions would exceed its %d", c->kv.len + n,
                   c->kv.cap);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V) {
            ty_err_set(err, TY_EINVAL, "token id %d is outside the vocabulary [0, %d)", ids[i], V);
            return NULL;
        }
    }
    model_forward_kv(m, ids, n, &c->kv, c->logits);
    if (kn_check(m->kn, err)) return NULL;
    c->kv.len += n;
    return c->logits;
}
