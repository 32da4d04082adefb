/* linear.c — the model's side of linear.h: its block linear layers by
 * (layer, slot), the adapter hook and the store for weights kept out of
 * the parameter buffer. */
#include "linear.h"

#include <stdio.h>
#include <string.h>

#include "model.h"

/* The layer_ix field of each slot. */
static int slot_tensor(const layer_ix *L, int slot)
{
    switch (slot) {
    case LS_ATTN:
        return L->attn_w;
    case LS_Q:
        return L->q_w;
    case LS_K:
        return L->k_w;
    case LS_V:
        return L->v_w;
    case LS_O:
        return L->o_w;
    case LS_FC:
        return L->fc_w;
    case LS_UP:
        return L->up_w;
    default:
        return L->proj_w;
    }
}

/* The bias of each slot (-1: none). */
static int slot_bias(const layer_ix *L, int slot)
{
    switch (slot) {
    case LS_ATTN:
        return L->attn_b;
    case LS_Q:
        return L->q_b;
    case LS_K:
        return L->k_b;
    case LS_V:
        return L->v_b;
    case LS_O:
        return L->o_b;
    case LS_FC:
        return L->fc_b;
    case LS_UP:
        return -1;
    default:
        return L->proj_b;
    }
}

int model_linear_bias(const model *m, int layer, int slot)
{
    if (layer < 0 || layer >= m->cfg.n_layer || slot < 0 || slot >= LS_N) return -1;
    return slot_tensor(&m->L[layer], slot) < 0 ? -1 : slot_bias(&m->L[layer], slot);
}

int model_n_tensors(const model *m)
{
    return m->nt;
}

void model_tensor_describe(const model *m, int i, model_tensor_desc *d)
{
    const model_tensor *t = &m->t[i];
    model_hf_name(m, t, d->name, sizeof d->name);
    d->ndim = t->ndim;
    d->shape[0] = t->shape[0];
    d->shape[1] = t->ndim > 1 ? t->shape[1] : 1;
    d->numel = t->numel;
    d->decay = t->decay;
    d->conv1d = t->conv1d;
    d->tied = i == m->wte && m->cfg.tied;
}

float *model_tensor_param(const model *m, int i)
{
    return m->params && !m->t[i].q4 ? m->params + m->t[i].off : NULL;
}

void model_tensor_set_grad(model *m, int i, float *g)
{
    m->t[i].xgrad = g;
}

int model_linear(const model *m, int layer, int slot, linear_desc *d)
{
    if (layer < 0 || layer >= m->cfg.n_layer || slot < 0 || slot >= LS_N) return 0;
    int ti = slot_tensor(&m->L[layer], slot);
    if (ti < 0) return 0;
    char name[128];
    model_hf_name(m, &m->t[ti], name, sizeof name);
    name[strlen(name) - strlen(".weight")] = 0;
    snprintf(d->module, sizeof d->module, "%s", name);
    d->out = (int)m->t[ti].shape[0];
    d->in = (int)m->t[ti].shape[1];
    return 1;
}

int model_embedding(const model *m, linear_desc *d)
{
    const model_tensor *t = &m->t[m->wte];
    char name[128];
    model_hf_name(m, t, name, sizeof name);
    name[strlen(name) - strlen(".weight")] = 0;
    snprintf(d->module, sizeof d->module, "%s", name);
    d->in = (int)t->shape[0];
    d->out = (int)t->shape[1];
    return m->wte;
}

float *model_linear_weight(model *m, int layer, int slot)
{
    return m->params + m->t[slot_tensor(&m->L[layer], slot)].off;
}

void model_set_linear_hook(model *m, const linear_hook *h)
{
    if (h)
        m->adapter = *h;
    else
        memset(&m->adapter, 0, sizeof m->adapter);
}

int model_linear_n_stored(const model *m)
{
    return m->n_q4;
}

void model_set_linear_store(model *m, const linear_store *s)
{
    if (s)
        m->base = *s;
    else
        memset(&m->base, 0, sizeof m->base);
}

size_t model_linear_set_aside(model *m)
{
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int s = 0; s < LS_N; s++) {
            int ti = slot_tensor(&m->L[l], s);
            if (ti >= 0) m->t[ti].q4 = ++m->n_q4;
        }
    /* The same layout rule as the table builder, skipping those weights. */
    size_t off = 0;
    for (int i = 0; i < m->nt; i++) {
        m->t[i].off = off;
        if (!m->t[i].q4) off += (m->t[i].numel + 15) & ~(size_t)15;
    }
    return off;
}

const model_config *model_linear_config(const model *m)
{
    return &m->cfg;
}

kn_ctx *model_linear_kn(const model *m)
{
    return m->kn;
}

kn_dtype model_linear_dtype(const model *m)
{
    return m->dt;
}
