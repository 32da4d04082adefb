/* lora.c — LoRA adapters: table, init, forward/backward hooks, PEFT files.
 *
 * Attached as the model's linear hook (linear.h, lora_attach), the
 * adapters run right after each targeted base matmul and right after the
 * base layer's backward, with the same x, out and dout buffers, so they see
 * exactly the tensors nn.Linear would in PEFT's LoraLayer. The model is
 * known only through linear.h: layer shapes and module names, the weights
 * for the merge. All arithmetic goes through kn_* operations; the only
 * host loops over elements are the uniform init and the merge at export. */
#include "lora.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "rng.h"
#include "safetensors.h"
#include "tyutil.h"

#define LORA_INIT_SALT 0x6c6f72615f696e69ull /* "lora_ini" */

void lora_cfg_from_spec(lora_cfg *c, int r, double alpha, double dropout, int use_rslora,
                        char *const *targets, int n_targets)
{
    lora_cfg_default(c);
    c->r = r;
    c->alpha = alpha;
    c->dropout = dropout;
    c->use_rslora = use_rslora;
    for (int i = 0; i < n_targets && i < LORA_MAX_TARGETS; i++)
        snprintf(c->targets[c->n_targets++], LORA_NAME_MAX, "%s", targets[i]);
}

/* No target_modules: PEFT's defaults for the family. */
static void default_targets(lora_cfg *c, const model_config *mc)
{
    if (c->n_targets || c->target_regex[0] || c->all_linear) return;
    static const char *const gpt2_def[] = {"c_attn"}, *const llama_def[] = {"q_proj", "v_proj"},
                             *const phi3_def[] = {"qkv_proj"};
    int gpt2 = mc->arch == ARCH_GPT2;
    const char *const *t = gpt2 ? gpt2_def : mc->fused ? phi3_def : llama_def;
    int n = gpt2 || mc->fused ? 1 : 2;
    for (int i = 0; i < n; i++)
        snprintf(c->targets[c->n_targets++], LORA_NAME_MAX, "%s", t[i]);
}

static const char *module_names(const model_config *mc)
{
    return mc->arch == ARCH_GPT2 ? "GPT-2 has c_attn, c_proj, c_fc, wte"
           : mc->fused           ? "it has qkv_proj, o_proj, gate_up_proj, down_proj, embed_tokens"
                                 : "it has q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                   "down_proj, embed_tokens";
}

/* One adapter on the layer d describes, its A and B placed at *off. */
static lora_adapter *add_one(lora *l, const linear_desc *d, int layer, int slot, size_t *off)
{
    const lora_cfg *c = &l->cfg;
    lora_adapter *a = &l->ad[l->n++];
    a->layer = layer;
    a->slot = slot;
    a->out = d->out;
    a->in = d->in;
    a->r = lora_cfg_rank(c, d->module);
    a->scale = lora_cfg_scale(c, a->r, lora_cfg_alpha(c, d->module));
    if (a->r > l->r) l->r = a->r;
    snprintf(a->module, sizeof a->module, "%s", d->module);
    a->a_off = *off;
    *off += ((size_t)a->r * a->in + 15) & ~(size_t)15;
    a->b_off = *off;
    *off += ((size_t)a->out * a->r + 15) & ~(size_t)15;
    l->n_params += (size_t)a->r * a->in + (size_t)a->out * a->r;
    return a;
}

/* Every selected module's adapter, with its own rank and scale. */
static int add_adapters(lora *l, const struct model *m, ty_err *err)
{
    const lora_cfg *c = &l->cfg;
    const model_config *mc = model_linear_config(m);
    const char *tfield = c->from_peft ? "target_modules" : "lora.targets";
    int named[LORA_MAX_TARGETS] = {0};
    size_t off = 0;
    for (int layer = 0; layer < l->n_layer; layer++)
        for (int s = 0; s < LS_N; s++) {
            l->slot_ix[layer * LS_N + s] = -1;
            linear_desc d;
            if (!model_linear(m, layer, s, &d)) continue;
            int which, hit = lora_cfg_targets(c, d.module, &which);
            /* A listed name counts as found when it names a module at all,
             * even one that exclude_modules or layers_to_transform drop. */
            for (int k = 0; k < c->n_targets; k++)
                if (lora_name_matches(d.module, c->targets[k])) named[k] = 1;
            if (!hit) continue;
            l->slot_ix[layer * LS_N + s] = l->n;
            add_one(l, &d, layer, s, &off);
        }
    /* The token embedding (PEFT's lora.Embedding), named or matched like
     * the others; all-linear takes linear layers only. */
    linear_desc d;
    model_embedding(m, &d);
    int which;
    for (int k = 0; k < c->n_targets; k++)
        if (lora_name_matches(d.module, c->targets[k])) named[k] = 1;
    if (!c->all_linear && lora_cfg_targets(c, d.module, &which)) {
        l->emb = l->n;
        add_one(l, &d, -1, -1, &off)->emb = 1;
    }
    for (int k = 0; k < c->n_targets; k++)
        if (!named[k])
            return ty_err_field(err, TY_EINVAL, tfield,
                                "%s: \"%s\" matches no module of this %s model (%s)", tfield,
                                c->targets[k], mc->model_type, module_names(mc));
    for (int i = 0; i < l->n && c->use_dora; i++) { /* DoRA: the magnitudes, after A and B */
        lora_adapter *a = &l->ad[i];
        const char *dfield = c->from_peft ? "use_dora" : "lora.use_dora";
        if (a->emb)
            return ty_err_field(
                err, TY_ESPEC, dfield,
                "%s: DoRA on the embedding %s is not supported (linear targets only)", dfield,
                a->module);
        if (model_linear_n_stored(m))
            return ty_err_field(err, TY_ESPEC, dfield,
                                "%s: DoRA needs the base weights in full precision; method qlora "
                                "keeps them in NF4 (use method lora)",
                                dfield);
        a->dora = 1;
        a->m_off = off;
        off += ((size_t)a->out + 15) & ~(size_t)15;
        l->n_params += (size_t)a->out;
        a->w = model_linear_weight((struct model *)m, a->layer, a->slot);
        int b = model_linear_bias(m, a->layer, a->slot);
        a->bias = b >= 0 ? model_tensor_param(m, b) : NULL;
    }
    if (l->n == 0)
        return ty_err_field(err, TY_EINVAL, tfield,
                            "%s: %s%s selects no module of this %s model (%s)", tfield,
                            c->target_regex[0] ? "the regex " : "",
                            c->target_regex[0] ? c->target_regex : "the selection", mc->model_type,
                            module_names(mc));
    l->n_buf = off;
    return 0;
}

/* Tensor i's gradient place in the buffers: after the adapters, each
 * trained tensor of the model once. */
static int add_extra(lora *l, const struct model *m, int i, const char *name, const char *field,
                     size_t *off, ty_err *err)
{
    for (int k = 0; k < l->n_x; k++)
        if (l->x[k].t == i) return 0;
    model_tensor_desc d;
    model_tensor_describe(m, i, &d);
    lora_extra *x = &l->x[l->n_x];
    x->param = model_tensor_param(m, i);
    if (!x->param)
        return ty_err_field(err, TY_ESPEC, field,
                            "%s: training %s needs fp32 values of it, which method qlora "
                            "in 16 bits does not keep (its unquantised tensors are stored in "
                            "the compute dtype alone); use precision fp32 or method lora",
                            field, d.name);
    x->t = i;
    snprintf(x->name, sizeof x->name, "base_model.model.%s", name);
    x->ndim = d.ndim;
    x->shape[0] = d.shape[0];
    x->shape[1] = d.shape[1];
    x->numel = d.numel;
    x->decay = d.decay;
    x->off = *off;
    *off += (d.numel + 15) & ~(size_t)15;
    l->n_params += d.numel;
    l->n_x++;
    return 0;
}

/* lora.bias (PEFT's bias): the biases that train. A targeted module's is
 * saved as PEFT's LoRA layer holds it, <module>.base_layer.bias; with
 * "all" every other bias of the model (norms' too) under its own name. */
static int add_biases(lora *l, const struct model *m, size_t *off, ty_err *err)
{
    if (l->cfg.bias == LORA_BIAS_NONE) return 0;
    int nt = model_n_tensors(m);
    l->x = calloc((size_t)nt, sizeof *l->x);
    if (!l->x) return ty_err_set(err, TY_ENOMEM, "out of memory for LoRA biases");
    char name[200];
    int rc = 0;
    for (int i = 0; i < l->n && !rc; i++) {
        const lora_adapter *a = &l->ad[i];
        int b = model_linear_bias(m, a->layer, a->slot);
        snprintf(name, sizeof name, "%s.base_layer.bias", a->module);
        if (b >= 0) rc = add_extra(l, m, b, name, "lora.bias", off, err);
    }
    for (int i = 0; i < nt && !rc && l->cfg.bias == LORA_BIAS_ALL; i++) {
        model_tensor_desc d;
        model_tensor_describe(m, i, &d);
        size_t L = strlen(d.name);
        if (L >= 5 && !strcmp(d.name + L - 5, ".bias"))
            rc = add_extra(l, m, i, d.name, "lora.bias", off, err);
    }
    return rc;
}

/* Whether PEFT's modules_to_save entry `name` takes the tensor `tensor`:
 * its module path, or an enclosing module's, ends in name (a plain string
 * suffix, as PEFT's _set_trainable tests). */
static int saved_by(const char *tensor, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = tensor; (p = strchr(p, '.')); p++) {
        size_t L = (size_t)(p - tensor);
        if (L >= n && !strncmp(tensor + L - n, name, n)) return 1;
    }
    return 0;
}

/* modules_to_save: every tensor of the named modules trains, saved under
 * its own HF name (PEFT's ModulesToSaveWrapper's copy, the adapter name
 * taken out). A tied embedding cannot be: PEFT trains a copy for the
 * input side while the head keeps the original, and the engine's model
 * has one tensor for both. */
static int add_saved(lora *l, const struct model *m, size_t *off, ty_err *err)
{
    const lora_cfg *c = &l->cfg;
    const char *field = c->from_peft ? "modules_to_save" : "lora.modules_to_save";
    int nt = model_n_tensors(m), rc = 0;
    if (!c->n_save) return 0;
    if (!l->x && !(l->x = calloc((size_t)nt, sizeof *l->x)))
        return ty_err_set(err, TY_ENOMEM, "out of memory for modules_to_save");
    for (int k = 0; k < c->n_save && !rc; k++) {
        int found = 0;
        for (int i = 0; i < nt && !rc; i++) {
            model_tensor_desc d;
            model_tensor_describe(m, i, &d);
            if (!saved_by(d.name, c->save[k])) continue;
            found = 1;
            if (d.tied)
                rc = ty_err_field(err, TY_ESPEC, field,
                                  "%s: \"%s\" is the embedding this model ties to its output "
                                  "head; PEFT would train a copy for the input side only, which "
                                  "one shared tensor cannot be",
                                  field, c->save[k]);
            else if (d.conv1d)
                rc = ty_err_field(err, TY_ESPEC, field,
                                  "%s: \"%s\" takes the Conv1D weight %s, which is not supported "
                                  "(embeddings, the head, norms are)",
                                  field, c->save[k], d.name);
            else
                rc = add_extra(l, m, i, d.name, field, off, err);
        }
        if (!rc && !found)
            rc =
                ty_err_field(err, TY_EINVAL, field, "%s: \"%s\" matches no module of this %s model",
                             field, c->save[k], model_linear_config(m)->model_type);
    }
    return rc;
}

/* PEFT's save_embedding_layers "auto": when target_modules names
 * embed_tokens or lm_head (a list entry equal to one, or a regex that
 * takes a module so named), the adapter file also holds the targeted
 * embedding's base weights, <module>.base_layer.weight, which loading
 * puts back into the model. They are an extra here that never trains. */
static int add_emb_base(lora *l, const struct model *m, ty_err *err)
{
    const lora_cfg *c = &l->cfg;
    if (l->emb < 0) return 0;
    const char *mod = l->ad[l->emb].module, *tail = strrchr(mod, '.');
    tail = tail ? tail + 1 : mod;
    int named = 0;
    for (int k = 0; k < c->n_targets; k++)
        named |= !strcmp(c->targets[k], "embed_tokens") || !strcmp(c->targets[k], "lm_head");
    if (c->target_regex[0]) named = !strcmp(tail, "embed_tokens");
    if (!named) return 0;
    int t = model_embedding(m, &(linear_desc){0});
    for (int k = 0; k < l->n_x; k++)
        if (l->x[k].t == t)
            return ty_err_field(err, TY_ESPEC,
                                c->from_peft ? "modules_to_save" : "lora.modules_to_save",
                                "%s is both a LoRA target and in modules_to_save", mod);
    if (!l->x && !(l->x = calloc((size_t)model_n_tensors(m), sizeof *l->x)))
        return ty_err_set(err, TY_ENOMEM, "out of memory for LoRA");
    model_tensor_desc d;
    model_tensor_describe(m, t, &d);
    lora_extra *x = &l->x[l->n_x];
    if (!(x->param = model_tensor_param(m, t)))
        return ty_err_field(err, TY_ESPEC, c->from_peft ? "target_modules" : "lora.targets",
                            "a LoRA adapter on %s needs the embedding's fp32 values, which "
                            "method qlora in 16 bits does not keep; use precision fp32 or method "
                            "lora",
                            mod);
    x->t = t;
    x->frozen = 1;
    snprintf(x->name, sizeof x->name, "base_model.model.%s.base_layer.weight", mod);
    x->ndim = 2;
    x->shape[0] = d.shape[0];
    x->shape[1] = d.shape[1];
    x->numel = d.numel;
    l->n_x++;
    l->n_frozen++;
    return 0;
}

int lora_create(lora *l, const struct model *m, const lora_cfg *cfg, ty_err *err)
{
    memset(l, 0, sizeof *l);
    const model_config *mc = model_linear_config(m);
    l->kn = model_linear_kn(m);
    l->cfg = *cfg;
    l->emb = -1;
    if (cfg->r < 1)
        return ty_err_field(err, TY_EINVAL, "lora.r", "lora.r must be at least 1 (got %d)", cfg->r);
    if (cfg->dropout < 0 || cfg->dropout >= 1)
        return ty_err_field(err, TY_EINVAL, "lora.dropout", "lora.dropout must lie in [0, 1)");
    default_targets(&l->cfg, mc);
    l->dropout = (float)cfg->dropout;
    l->n_layer = mc->n_layer;
    l->slot_ix = malloc((size_t)(l->n_layer ? l->n_layer : 1) * LS_N * sizeof *l->slot_ix);
    l->ad = calloc((size_t)l->n_layer * LS_N + 1, sizeof *l->ad); /* + the embedding */
    if (!l->slot_ix || !l->ad) return ty_err_set(err, TY_ENOMEM, "out of memory for LoRA adapters");
    int rc = add_adapters(l, m, err);
    if (rc) return rc;
    size_t off = l->n_buf;
    if ((rc = add_biases(l, m, &off, err)) || (rc = add_saved(l, m, &off, err)) ||
        (rc = add_emb_base(l, m, err)))
        return rc;
    l->n_buf = off;
    if (!l->n_buf) l->n_buf = 16;
    size_t bytes = l->n_buf * sizeof(float);
    l->params = kn_alloc(l->kn, bytes);
    l->grads = kn_alloc(l->kn, bytes);
    l->m = kn_alloc(l->kn, bytes);
    l->v = kn_alloc(l->kn, bytes);
    if (!l->params || !l->grads || !l->m || !l->v)
        return ty_err_set(err, TY_ENOMEM, "out of memory for LoRA parameters (4 x %zu bytes)",
                          bytes);
    kn_zero(l->kn, l->params, l->n_buf);
    kn_zero(l->kn, l->grads, l->n_buf);
    kn_zero(l->kn, l->m, l->n_buf);
    kn_zero(l->kn, l->v, l->n_buf);
    return 0;
}

void lora_free(lora *l)
{
    if (!l) return;
    if (l->kn) {
        kn_free(l->kn, l->params);
        kn_free(l->kn, l->grads);
        kn_free(l->kn, l->m);
        kn_free(l->kn, l->v);
        kn_free(l->kn, l->acts);
        kn_free(l->kn, l->masks);
    }
    free(l->ad);
    free(l->x);
    free(l->slot_ix);
    memset(l, 0, sizeof *l);
}

/* DoRA's magnitude at init: the row norms of W (B is zero), as PEFT's
 * torch.linalg.norm(W, dim=1) (fp32 in row order). */
static void dora_init(lora *l, const lora_adapter *a)
{
    size_t nw = (size_t)a->out * a->in;
    float *w = malloc(nw * sizeof *w), *mag = malloc((size_t)a->out * sizeof *mag);
    if (w && mag) {
        kn_to_host(l->kn, w, a->w, nw * sizeof(float));
        for (int o = 0; o < a->out; o++) {
            double ss = 0;
            for (int i = 0; i < a->in; i++)
                ss += (double)w[(size_t)o * a->in + i] * w[(size_t)o * a->in + i];
            mag[o] = (float)sqrt(ss);
        }
        kn_to_device(l->kn, l->params + a->m_off, mag, (size_t)a->out * sizeof(float));
    }
    free(w);
    free(mag);
}

void lora_init(lora *l, uint64_t seed)
{
    uint64_t state = seed ^ LORA_INIT_SALT;
    for (int i = 0; i < l->n; i++) {
        lora_adapter *a = &l->ad[i];
        /* lora.Embedding: A zero (as created), B N(0, 1) (Box-Muller) */
        size_t n = a->emb ? (size_t)a->out * a->r : (size_t)a->r * a->in;
        float *buf = malloc(n * sizeof *buf);
        if (!buf) continue; /* cannot happen for sizes that fit the device buffers above */
        double bound = 1.0 / sqrt((double)a->in);
        for (size_t j = 0; j < n; j++) {
            double u = rng_unit(&state);
            if (a->emb)
                buf[j] = (float)(sqrt(-2.0 * log1p(-u)) * cos(2.0 * M_PI * rng_unit(&state)));
            else
                buf[j] = (float)((2.0 * u - 1.0) * bound);
        }
        kn_to_device(l->kn, l->params + (a->emb ? a->b_off : a->a_off), buf, n * sizeof(float));
        free(buf);
        if (a->dora) dora_init(l, a);
    }
}

int lora_alloc_acts(lora *l, int B, int T, ty_err *err)
{
    size_t N = (size_t)B * T, total = 0, maxout = 1, maxin = 1, mask = 0, maxw = 0;
    int drop = l->dropout > 0;
    for (int i = 0; i < l->n; i++) {
        total += (N * (size_t)l->ad[i].r + 15) & ~(size_t)15;
        if (l->ad[i].dora) {
            size_t o = (size_t)l->ad[i].out, w = o * (size_t)l->ad[i].in;
            total += 2 * ((o + 15) & ~(size_t)15) + ((N * o + 15) & ~(size_t)15);
            if (w > maxw) maxw = w;
        }
        if ((size_t)l->ad[i].out > maxout) maxout = (size_t)l->ad[i].out;
        if (l->ad[i].emb) continue; /* no dropout; its in is the vocabulary */
        if (drop) {
            total += (N * (size_t)l->ad[i].in + 15) & ~(size_t)15;
            mask += N * (size_t)l->ad[i].in;
        }
        if ((size_t)l->ad[i].in > maxin) maxin = (size_t)l->ad[i].in;
    }
    size_t scratch = ((N * maxout + 15) & ~(size_t)15) + ((N * (size_t)l->r + 15) & ~(size_t)15) +
                     ((N * maxin + 15) & ~(size_t)15);
    if (maxw) scratch += ((maxw + 15) & ~(size_t)15) + N * maxout;
    l->acts = kn_alloc(l->kn, (total + scratch) * sizeof(float));
    l->masks = mask ? kn_alloc(l->kn, mask) : NULL;
    if (!l->acts || (mask && !l->masks))
        return ty_err_set(err, TY_ENOMEM, "out of memory for LoRA activations");
    float *p = l->acts;
    uint8_t *q = l->masks;
    for (int i = 0; i < l->n; i++) {
        lora_adapter *a = &l->ad[i];
        a->h = p;
        p += (N * (size_t)a->r + 15) & ~(size_t)15;
        if (drop && !a->emb) {
            a->xd = p;
            p += (N * (size_t)a->in + 15) & ~(size_t)15;
            a->mask = q;
            q += N * (size_t)a->in;
        }
        if (a->dora) {
            size_t o = (size_t)a->out;
            a->g = p;
            p += (o + 15) & ~(size_t)15;
            a->norm = p;
            p += (o + 15) & ~(size_t)15;
            a->z = p;
            p += (N * o + 15) & ~(size_t)15;
        }
    }
    l->s_out = p;
    p += (N * maxout + 15) & ~(size_t)15;
    l->s_dh = p;
    p += (N * (size_t)l->r + 15) & ~(size_t)15;
    l->s_dx = p;
    p += (N * maxin + 15) & ~(size_t)15;
    if (maxw) {
        l->s_d = p;
        p += (maxw + 15) & ~(size_t)15;
        l->s_y = p;
    }
    l->N = N;
    return 0;
}

static int drop_on(const lora *l)
{
    return l->training && l->dropout > 0;
}

void lora_fwd_part(lora *l, int layer, int slot, float *out, const float *x, int N, int row0,
                   int rows)
{
    int i = l->slot_ix[layer * LS_N + slot];
    if (i < 0) return;
    lora_adapter *a = &l->ad[i];
    kn_ctx *k = l->kn;
    if (row0 == 0) {
        const float *xd = x;
        if (drop_on(l)) {
            /* A distinct counter range per (step, micro-batch, adapter). */
            uint64_t offset = ((l->rng_step * (uint64_t)l->n + (uint64_t)i) << 32);
            kn_dropout_fwd(k, KN_F32, a->xd, a->mask, x, (size_t)N * a->in, l->dropout, l->seed,
                           offset);
            xd = a->xd;
        }
        /* h[N,r] = d(x) A^T, shared by every row block */
        kn_matmul_fwd(k, a->h, xd, l->params + a->a_off, NULL, N, a->in, a->r);
        if (a->dora) { /* n = ||W + s B A|| by rows (a constant), g = mag / n */
            kn_zero(k, l->s_d, (size_t)a->out * a->in);
            kn_matmul_bwd(k, l->s_d, NULL, NULL, l->params + a->b_off, l->s_d, l->params + a->a_off,
                          a->out, a->in, a->r);
            kn_dora_norm(k, a->g, a->norm, a->w, l->s_d, l->params + a->m_off, a->scale, a->out,
                         a->in);
        }
    }
    /* s_out[N,rows] = h B_block^T; out += scale s_out */
    kn_matmul_fwd(k, l->s_out, a->h, l->params + a->b_off + (size_t)row0 * a->r, NULL, N, a->r,
                  rows);
    if (!a->dora) {
        kn_axpy(k, out, l->s_out, (size_t)N * rows, a->scale);
        return;
    }
    /* DoRA: out += (g - 1) W d(x) + g s B A d(x); W x is out - b without
     * dropout, else W d(x) computed here (PEFT's F.linear(d(x), W)) */
    const float *y = NULL;
    if (drop_on(l)) {
        kn_matmul_fwd(k, l->s_y, a->xd, a->w + (size_t)row0 * a->in, NULL, N, a->in, rows);
        y = l->s_y;
    }
    kn_dora_fwd(k, out, a->z + (size_t)N * row0, y, a->bias ? a->bias + row0 : NULL, l->s_out,
                a->g + row0, a->scale, N, rows);
}

void lora_fwd(lora *l, int layer, int slot, float *out, const float *x, int N)
{
    int i = l->slot_ix[layer * LS_N + slot];
    if (i >= 0) lora_fwd_part(l, layer, slot, out, x, N, 0, l->ad[i].out);
}

void lora_bwd(lora *l, int layer, int slot, float *dx, const float *dout, const float *x, int N)
{
    int i = l->slot_ix[layer * LS_N + slot];
    if (i >= 0) lora_bwd_part(l, layer, slot, dx, dout, x, N, 0, l->ad[i].out);
}

void lora_bwd_part(lora *l, int layer, int slot, float *dx, const float *dout, const float *x,
                   int N, int row0, int rows)
{
    int i = l->slot_ix[layer * LS_N + slot];
    if (i < 0) return;
    lora_adapter *a = &l->ad[i];
    kn_ctx *k = l->kn;
    size_t nout = (size_t)N * rows, nin = (size_t)N * a->in;
    size_t boff = a->b_off + (size_t)row0 * a->r;
    if (row0 == 0 && drop_on(l)) kn_zero(k, l->s_dx, nin);
    if (a->dora) {
        /* s_out = g s dout; dmag += sum_n dout z / n; the base part's
         * (g - 1) dout W into d(d(x)) */
        kn_dora_bwd(k, l->s_out, l->s_y, l->grads + a->m_off + row0, dout, a->z + (size_t)N * row0,
                    a->g + row0, a->norm + row0, a->scale, N, rows);
        kn_matmul_bwd(k, drop_on(l) ? l->s_dx : dx, NULL, NULL, l->s_y, x,
                      a->w + (size_t)row0 * a->in, N, a->in, rows);
    } else { /* s_out = scale dout */
        kn_zero(k, l->s_out, nout);
        kn_axpy(k, l->s_out, dout, nout, a->scale);
    }
    /* dh[N,r] (+)= s_out B_block; dB_block += s_out^T h */
    if (row0 == 0) kn_zero(k, l->s_dh, (size_t)N * a->r);
    kn_matmul_bwd(k, l->s_dh, l->grads + boff, NULL, l->s_out, a->h, l->params + boff, N, a->r,
                  rows);
    if (row0 + rows < a->out) return; /* more blocks add to dh first */
    /* d(dx)[N,in] = dh A; dA += dh^T d(x); dropout's backward into dx */
    if (drop_on(l)) {
        kn_matmul_bwd(k, l->s_dx, l->grads + a->a_off, NULL, l->s_dh, a->xd, l->params + a->a_off,
                      N, a->in, a->r);
        kn_dropout_bwd(k, dx, l->s_dx, a->mask, nin, l->dropout);
    } else {
        kn_matmul_bwd(k, dx, l->grads + a->a_off, NULL, l->s_dh, x, l->params + a->a_off, N, a->in,
                      a->r);
    }
}

/* The linear hook's two calls (linear.h): the model passes each layer
 * whole (row0 = 0, rows = out) or, for a fused weight, block by block. */
static void hook_fwd(void *state, int layer, int slot, float *out, const float *x, int N, int row0,
                     int rows)
{
    lora_fwd_part(state, layer, slot, out, x, N, row0, rows);
}

static void hook_bwd(void *state, int layer, int slot, float *dx, const float *dout, const float *x,
                     int N, int row0, int rows)
{
    lora_bwd_part(state, layer, slot, dx, dout, x, N, row0, rows);
}

/* lora.Embedding: h[N,r] = A^T[ids]; out += scale h B^T. */
static void hook_emb_fwd(void *state, float *out, const int32_t *ids, int N)
{
    lora *l = state;
    lora_adapter *a = &l->ad[l->emb];
    kn_ctx *k = l->kn;
    kn_embedding_fwd(k, KN_F32, a->h, ids, l->params + a->a_off, N, a->r, 0);
    kn_matmul_fwd(k, l->s_out, a->h, l->params + a->b_off, NULL, N, a->r, a->out);
    kn_axpy(k, out, l->s_out, (size_t)N * a->out, a->scale);
}

/* dB += (scale dout)^T h; dA^T[ids] += (scale dout) B. */
static void hook_emb_bwd(void *state, const float *dout, const int32_t *ids, int N)
{
    lora *l = state;
    lora_adapter *a = &l->ad[l->emb];
    kn_ctx *k = l->kn;
    size_t nout = (size_t)N * a->out;
    kn_zero(k, l->s_out, nout);
    kn_axpy(k, l->s_out, dout, nout, a->scale);
    kn_zero(k, l->s_dh, (size_t)N * a->r);
    kn_matmul_bwd(k, l->s_dh, l->grads + a->b_off, NULL, l->s_out, a->h, l->params + a->b_off, N,
                  a->r, a->out);
    kn_embedding_bwd(k, l->grads + a->a_off, ids, l->s_dh, N, a->r);
}

void lora_attach(lora *l, struct model *m)
{
    linear_hook h = {l, hook_fwd, hook_bwd, NULL, NULL};
    if (l->emb >= 0) h.emb_fwd = hook_emb_fwd, h.emb_bwd = hook_emb_bwd;
    model_set_linear_hook(m, &h);
    for (int k = 0; k < l->n_x; k++)
        if (!l->x[k].frozen) model_tensor_set_grad(m, l->x[k].t, l->grads + l->x[k].off);
}

/* ---- files ---------------------------------------------------------------- */

/* The file's tensors: each adapter's A and B (items 0 .. 2n - 1), with
 * DoRA the magnitudes (2n .. 3n - 1), then the model's own tensors
 * (lora.bias, modules_to_save, an embedding's base weights). */
static int n_ad_items(const lora *l)
{
    return (l->cfg.use_dora ? 3 : 2) * l->n;
}

static int n_items(const lora *l)
{
    return n_ad_items(l) + l->n_x;
}

/* The items an optimizer file holds: the frozen extras (last) have no state. */
static int n_opt_items(const lora *l)
{
    return n_ad_items(l) + l->n_x - l->n_frozen;
}

typedef struct item {
    char name[240];
    int ndim;
    int64_t shape[2];
    size_t numel;
    float *at;    /* in the buffer asked for (for the values: the model's own) */
    int t;        /* held transposed here: the embedding's A, [shape[1], shape[0]] */
    int optional; /* loading goes on without it */
} item;

/* Item j with its name + suffix, living in buf (l->params, m or v). */
static void item_of(const lora *l, int j, float *buf, const char *suffix, item *it)
{
    if (j >= 2 * l->n && j < n_ad_items(l)) {
        const lora_adapter *a = &l->ad[j - 2 * l->n];
        snprintf(it->name, sizeof it->name, "base_model.model.%s.lora_magnitude_vector%s",
                 a->module, suffix);
        it->ndim = 1;
        it->shape[0] = a->out;
        it->shape[1] = 1;
        it->numel = (size_t)a->out;
        it->at = buf + a->m_off;
        it->t = 0;
        it->optional = 0;
        return;
    }
    if (j >= n_ad_items(l)) {
        const lora_extra *x = &l->x[j - n_ad_items(l)];
        snprintf(it->name, sizeof it->name, "%s%s", x->name, suffix);
        it->ndim = x->ndim;
        it->shape[0] = x->shape[0];
        it->shape[1] = x->shape[1];
        it->numel = x->numel;
        it->at = buf == l->params ? x->param : buf + x->off;
        it->t = 0;
        it->optional = x->frozen;
        return;
    }
    const lora_adapter *a = &l->ad[j / 2];
    int b = j % 2;
    if (a->emb)
        snprintf(it->name, sizeof it->name, "base_model.model.%s.lora_embedding_%c%s", a->module,
                 b ? 'B' : 'A', suffix);
    else
        snprintf(it->name, sizeof it->name, "base_model.model.%s.lora_%c.weight%s", a->module,
                 b ? 'B' : 'A', suffix);
    it->t = a->emb && !b;
    it->optional = 0;
    it->ndim = 2;
    it->shape[0] = b ? a->out : a->r;
    it->shape[1] = b ? a->r : a->in;
    it->numel = (size_t)it->shape[0] * it->shape[1];
    it->at = buf + (b ? a->b_off : a->a_off);
}

typedef struct {
    lora *l;
    float *bufs[2];
    const char *sfx[2];
    int per;
} lsave_ctx;

/* src [rows, cols] into dst [cols, rows]. */
static void transpose(float *dst, const float *src, int64_t rows, int64_t cols)
{
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            dst[j * rows + i] = src[i * cols + j];
}

static int lsave_fill(void *vctx, int i, float *out, ty_err *err)
{
    lsave_ctx *c = vctx;
    item it;
    item_of(c->l, i % c->per, c->bufs[i / c->per], "", &it);
    float *tmp = it.t ? malloc(it.numel * sizeof *tmp) : NULL;
    if (it.t && !tmp) return ty_err_set(err, TY_ENOMEM, "out of memory writing %s", it.name);
    kn_to_host(c->l->kn, it.t ? tmp : out, it.at, it.numel * sizeof(float));
    if (tmp) transpose(out, tmp, it.shape[1], it.shape[0]);
    free(tmp);
    return 0;
}

static int save_bufs(lora *l, const char *path, float *b0, float *b1, const char *s0,
                     const char *s1, ty_err *err)
{
    int per = b0 == l->params ? n_items(l) : n_opt_items(l), n = per * (b1 ? 2 : 1);
    st_out *outs = calloc((size_t)(n ? n : 1), sizeof *outs);
    item *its = calloc((size_t)(n ? n : 1), sizeof *its);
    int rc;
    if (!outs || !its) {
        rc = ty_err_set(err, TY_ENOMEM, "out of memory writing %s", path);
    } else {
        for (int i = 0; i < n; i++) {
            item_of(l, i % per, i < per ? b0 : b1, i < per ? s0 : s1, &its[i]);
            outs[i].name = its[i].name;
            outs[i].ndim = its[i].ndim;
            outs[i].shape[0] = its[i].shape[0];
            outs[i].shape[1] = its[i].shape[1];
        }
        lsave_ctx c = {l, {b0, b1}, {s0, s1}, per};
        json_t *meta = json_pack("{s:s}", "format", "pt");
        rc = st_write(path, outs, n, meta, lsave_fill, &c, err);
        json_decref(meta);
    }
    free(outs);
    free(its);
    return rc;
}

int lora_save(lora *l, const char *path, ty_err *err)
{
    return save_bufs(l, path, l->params, NULL, "", "", err);
}

int lora_save_optimizer(lora *l, const char *path, ty_err *err)
{
    return save_bufs(l, path, l->m, l->v, ".exp_avg", ".exp_avg_sq", err);
}

/* The first tensor of f that is none of the adapters' (for the message). */
static const char *stray_tensor(const lora *l, const st_file *f)
{
    for (int t = 0; t < f->n; t++) {
        int ours = 0;
        for (int j = 0; j < n_items(l) && !ours; j++) {
            item it;
            item_of(l, j, l->params, "", &it);
            ours = !strcmp(it.name, f->t[t].name);
        }
        if (!ours) return f->t[t].name;
    }
    return "?";
}

/* Loads every item (name + suffix) of f into buf, exactly once. */
static int load_bufs(lora *l, const st_file *f, float *buf, const char *suffix, int other_suffixes,
                     ty_err *err)
{
    int per = buf == l->params ? n_items(l) : n_opt_items(l), rc = 0;
    size_t maxn = 1;
    item it;
    for (int j = 0; j < per; j++) {
        item_of(l, j, buf, suffix, &it);
        if (it.numel > maxn) maxn = it.numel;
    }
    float *stage = malloc(maxn * sizeof *stage), *tr = malloc(maxn * sizeof *tr);
    if (!stage || !tr) {
        free(stage), free(tr);
        return ty_err_set(err, TY_ENOMEM, "out of memory loading %s", f->path);
    }
    int found = 0;
    for (int j = 0; j < per && !rc; j++) {
        item_of(l, j, buf, suffix, &it);
        const st_tensor *t = st_find(f, it.name);
        if (!t && it.optional) continue;
        if (!t) {
            rc = ty_err_field(err, TY_EINVAL, it.name,
                              "%s: missing tensor %s (lora.targets / lora.r / lora.bias must "
                              "match the adapter)",
                              f->path, it.name);
            break;
        }
        int ok = t->ndim == it.ndim && t->shape[0] == it.shape[0] &&
                 (it.ndim == 1 || t->shape[1] == it.shape[1]);
        if (!ok) {
            char want[64];
            if (it.ndim == 1)
                snprintf(want, sizeof want, "[%lld]", (long long)it.shape[0]);
            else
                snprintf(want, sizeof want, "[%lld, %lld]", (long long)it.shape[0],
                         (long long)it.shape[1]);
            if (j < 2 * l->n)
                snprintf(want + strlen(want), sizeof want - strlen(want), ": r = %d",
                         l->ad[j / 2].r);
            rc = ty_err_field(err, TY_EINVAL, it.name,
                              "%s: tensor %s has the wrong shape (expected %s)", f->path, it.name,
                              want);
            break;
        }
        if ((rc = st_to_f32(t, stage, err))) break;
        if (it.t) transpose(tr, stage, it.shape[0], it.shape[1]);
        kn_to_device(l->kn, it.at, it.t ? tr : stage, it.numel * sizeof(float));
        found++;
    }
    free(stage);
    free(tr);
    if (!rc && !other_suffixes && f->n != found)
        rc = ty_err_set(err, TY_EINVAL,
                        "%s holds %d tensor%s that %s not adapters of these targets (one is %s)",
                        f->path, f->n - found, f->n - found == 1 ? "" : "s",
                        f->n - found == 1 ? "is" : "are", stray_tensor(l, f));
    return rc;
}

int lora_load(lora *l, const char *path, ty_err *err)
{
    st_file f;
    int rc = st_open(&f, path, err);
    if (rc) return rc;
    rc = load_bufs(l, &f, l->params, "", 0, err);
    st_close(&f);
    return rc;
}

int lora_load_optimizer(lora *l, const char *path, ty_err *err)
{
    st_file f;
    int rc = st_open(&f, path, err);
    if (rc) return rc;
    rc = load_bufs(l, &f, l->m, ".exp_avg", 1, err);
    if (!rc) rc = load_bufs(l, &f, l->v, ".exp_avg_sq", 1, err);
    st_close(&f);
    return rc;
}

int lora_write_config(const lora *l, const struct model *m, const char *base_model,
                      const char *path, ty_err *err)
{
    json_t *o = json_pack("{s:s, s:s, s:s?}", "peft_type", "LORA", "task_type", "CAUSAL_LM",
                          "base_model_name_or_path", base_model);
    if (!o) return ty_err_set(err, TY_ENOMEM, "adapter_config.json");
    lora_cfg_to_peft(&l->cfg, o);
    json_object_set_new(o, "fan_in_fan_out",
                        json_boolean(model_linear_config(m)->arch == ARCH_GPT2));
    json_object_set_new(o, "inference_mode", json_true());
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text) return ty_err_set(err, TY_ENOMEM, "adapter_config.json");
    int rc = ty_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

int lora_merge(lora *l, struct model *m, ty_err *err)
{
    for (int i = 0; i < l->n; i++) {
        const lora_adapter *a = &l->ad[i];
        size_t nw = (size_t)a->out * a->in;
        float *w = malloc(nw * sizeof *w), *A = malloc((size_t)a->r * a->in * sizeof *A),
              *B = malloc((size_t)a->out * a->r * sizeof *B);
        if (!w || !A || !B) {
            free(w), free(A), free(B);
            return ty_err_set(err, TY_ENOMEM, "out of memory merging LoRA");
        }
        float *dw = a->emb ? model_tensor_param(m, model_embedding(m, &(linear_desc){0}))
                           : model_linear_weight(m, a->layer, a->slot);
        if (!dw) {
            free(w), free(A), free(B);
            return ty_err_set(err, TY_EINVAL, "merging LoRA: no fp32 weights of %s", a->module);
        }
        kn_to_host(l->kn, w, dw, nw * sizeof(float));
        kn_to_host(l->kn, A, l->params + a->a_off, (size_t)a->r * a->in * sizeof(float));
        kn_to_host(l->kn, B, l->params + a->b_off, (size_t)a->out * a->r * sizeof(float));
        if (a->emb) {
            /* E[v, c] += scale sum_k A^T[v, k] B[c, k]: the shared tensor of
             * a tied head too, as merge_and_unload's */
            for (int v = 0; v < a->in; v++)
                for (int c = 0; c < a->out; c++) {
                    double s = 0;
                    for (int k = 0; k < a->r; k++)
                        s += (double)A[(size_t)v * a->r + k] * B[(size_t)c * a->r + k];
                    w[(size_t)v * a->out + c] += (float)(a->scale * s);
                }
            kn_to_device(l->kn, dw, w, nw * sizeof(float));
            free(w), free(A), free(B);
            continue;
        }
        /* W[o, i] += scale sum_k B[o, k] A[k, i] (engine layout [out, in];
         * the Conv1D transpose happens at save). DoRA then scales each row
         * by mag / ||row||, PEFT's dora_factor. */
        float *mag = a->dora ? malloc((size_t)a->out * sizeof *mag) : NULL;
        if (a->dora && !mag) {
            free(w), free(A), free(B);
            return ty_err_set(err, TY_ENOMEM, "out of memory merging LoRA");
        }
        if (mag) kn_to_host(l->kn, mag, l->params + a->m_off, (size_t)a->out * sizeof(float));
        for (int o = 0; o < a->out; o++) {
            double ss = 0;
            for (int c = 0; c < a->in; c++) {
                double s = 0;
                for (int k = 0; k < a->r; k++)
                    s += (double)B[(size_t)o * a->r + k] * A[(size_t)k * a->in + c];
                float v = w[(size_t)o * a->in + c] + (float)(a->scale * s);
                w[(size_t)o * a->in + c] = v;
                ss += (double)v * v;
            }
            if (mag) {
                float f = (float)(mag[o] / sqrt(ss));
                for (int c = 0; c < a->in; c++)
                    w[(size_t)o * a->in + c] *= f;
            }
        }
        free(mag);
        kn_to_device(l->kn, dw, w, nw * sizeof(float));
        free(w), free(A), free(B);
    }
    return 0;
}
