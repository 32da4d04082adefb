/* model.c — tensor table, loading/saving, init, forward and backward.
 *
 * The table is built once from the config; its order is the buffer layout,
 * the init order and the order of tensors in saved files. The forward and
 * backward passes are written layer by layer as pairs of kn_* calls with the
 * shapes in comments (N = B*T rows, C = hidden size, F = MLP width,
 * Hq/Hkv query/kv heads of size D, V = vocabulary). */
#include "model.h"

#include <math.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "model_load.h"
#include "rng.h"
#include "safetensors.h"
#include "tyutil.h"

/* ---- tensor table ------------------------------------------------------ */

typedef struct {
    model_tensor *t;
    int n, cap;
    size_t off;
    int oom;
} table_builder;

/* Appends a tensor; shape [a] when b == 0, else [a, b]. Returns its index.
 * Offsets are rounded to 16 floats (64 bytes) so every view is aligned. */
static int tb_add(table_builder *tb, const char *name, int64_t a, int64_t b, int conv1d,
                  model_init_kind init, float std)
{
    if (tb->n == tb->cap) {
        int cap = tb->cap ? tb->cap * 2 : 64;
        model_tensor *nt = realloc(tb->t, (size_t)cap * sizeof *nt);
        if (!nt) {
            tb->oom = 1;
            return -1;
        }
        tb->t = nt;
        tb->cap = cap;
    }
    model_tensor *t = &tb->t[tb->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = b ? 2 : 1;
    t->shape[0] = a;
    t->shape[1] = b;
    t->numel = (size_t)a * (size_t)(b ? b : 1);
    t->off = tb->off;
    tb->off += (t->numel + 15) & ~(size_t)15;
    t->conv1d = conv1d;
    t->decay = t->ndim >= 2;
    t->init = init;
    t->init_std = std;
    return tb->n++;
}

static void build_gpt2(model *m, table_builder *tb)
{
    const model_config *c = &m->cfg;
    int64_t C = c->dim, F = c->ffn;
    float std = c->init_std, rstd = c->init_std / sqrtf(2.0f * (float)c->n_layer);
    char nm[96];
    m->wte = tb_add(tb, "wte.weight", c->vocab, C, 0, INIT_NORMAL, std);
    m->wpe = tb_add(tb, "wpe.weight", c->max_pos, C, 0, INIT_NORMAL, std);
    for (int l = 0; l < c->n_layer; l++) {
        layer_ix *L = &m->L[l];
        memset(L, 0xff, sizeof *L); /* every index -1 */
#define ADD(field, suffix, a, b, conv, init, sd)                                                   \
    do {                                                                                           \
        snprintf(nm, sizeof nm, "h.%d.%s", l, suffix);                                             \
        L->field = tb_add(tb, nm, a, b, conv, init, sd);                                           \
    } while (0)
        ADD(ln1_w, "ln_1.weight", C, 0, 0, INIT_ONES, 0);
        ADD(ln1_b, "ln_1.bias", C, 0, 0, INIT_ZEROS, 0);
        ADD(attn_w, "attn.c_attn.weight", 3 * C, C, 1, INIT_NORMAL, std);
        ADD(attn_b, "attn.c_attn.bias", 3 * C, 0, 0, INIT_ZEROS, 0);
        ADD(o_w, "attn.c_proj.weight", C, C, 1, INIT_NORMAL, rstd);
        ADD(o_b, "attn.c_proj.bias", C, 0, 0, INIT_ZEROS, 0);
        ADD(ln2_w, "ln_2.weight", C, 0, 0, INIT_ONES, 0);
        ADD(ln2_b, "ln_2.bias", C, 0, 0, INIT_ZEROS, 0);
        ADD(fc_w, "mlp.c_fc.weight", F, C, 1, INIT_NORMAL, std);
        ADD(fc_b, "mlp.c_fc.bias", F, 0, 0, INIT_ZEROS, 0);
        ADD(proj_w, "mlp.c_proj.weight", C, F, 1, INIT_NORMAL, rstd);
        ADD(proj_b, "mlp.c_proj.bias", C, 0, 0, INIT_ZEROS, 0);
    }
    m->lnf_w = tb_add(tb, "ln_f.weight", C, 0, 0, INIT_ONES, 0);
    m->lnf_b = tb_add(tb, "ln_f.bias", C, 0, 0, INIT_ZEROS, 0);
#undef ADD
    m->lm_head = c->tied ? m->wte : tb_add(tb, "lm_head.weight", c->vocab, C, 0, INIT_NORMAL, std);
}

static void build_llama(model *m, table_builder *tb)
{
    const model_config *c = &m->cfg;
    int64_t C = c->dim, F = c->ffn, QD = (int64_t)c->n_head * c->head_dim,
            KD = (int64_t)c->n_kv_head * c->head_dim;
    float std = c->init_std, rstd = c->init_std / sqrtf(2.0f * (float)c->n_layer);
    char nm[96];
    m->wte = tb_add(tb, "embed_tokens.weight", c->vocab, C, 0, INIT_NORMAL, std);
    m->wpe = -1;
    for (int l = 0; l < c->n_layer; l++) {
        layer_ix *L = &m->L[l];
        memset(L, 0xff, sizeof *L);
#define ADD(field, suffix, a, b, init, sd)                                                         \
    do {                                                                                           \
        snprintf(nm, sizeof nm, "layers.%d.%s", l, suffix);                                        \
        L->field = tb_add(tb, nm, a, b, 0, init, sd);                                              \
    } while (0)
        /* Gemma RMSNorm multiplies by 1 + w: its weights start at 0. */
        model_init_kind one = c->gemma ? INIT_ZEROS : INIT_ONES;
        ADD(ln1_w, "input_layernorm.weight", C, 0, one, 0);
        if (c->fused) {
            /* Phi-3: q, k, v are the row blocks [0, QD), [QD, QD+KD), [QD+KD, QD+2KD) */
            ADD(attn_w, "self_attn.qkv_proj.weight", QD + 2 * KD, C, INIT_NORMAL, std);
        } else {
            ADD(q_w, "self_attn.q_proj.weight", QD, C, INIT_NORMAL, std);
            if (c->qkv_bias) ADD(q_b, "self_attn.q_proj.bias", QD, 0, INIT_ZEROS, 0);
            ADD(k_w, "self_attn.k_proj.weight", KD, C, INIT_NORMAL, std);
            if (c->qkv_bias) ADD(k_b, "self_attn.k_proj.bias", KD, 0, INIT_ZEROS, 0);
            ADD(v_w, "self_attn.v_proj.weight", KD, C, INIT_NORMAL, std);
            if (c->qkv_bias) ADD(v_b, "self_attn.v_proj.bias", KD, 0, INIT_ZEROS, 0);
        }
        ADD(o_w, "self_attn.o_proj.weight", C, QD, INIT_NORMAL, rstd);
        if (c->o_bias) ADD(o_b, "self_attn.o_proj.bias", C, 0, INIT_ZEROS, 0);
        if (c->qk_norm) {
            ADD(qn_w, "self_attn.q_norm.weight", c->head_dim, 0, one, 0);
            ADD(kn_w, "self_attn.k_norm.weight", c->head_dim, 0, one, 0);
        }
        if (c->gemma) {
            /* Gemma's sandwich: post_attention_layernorm closes the attention
             * branch; pre_ / post_feedforward_layernorm wrap the MLP. */
            ADD(pan_w, "post_attention_layernorm.weight", C, 0, one, 0);
            ADD(ln2_w, "pre_feedforward_layernorm.weight", C, 0, one, 0);
            ADD(pfn_w, "post_feedforward_layernorm.weight", C, 0, one, 0);
        } else {
            ADD(ln2_w, "post_attention_layernorm.weight", C, 0, one, 0);
        }
        if (c->fused) {
            /* Phi-3: gate is rows [0, F), up rows [F, 2F) */
            ADD(fc_w, "mlp.gate_up_proj.weight", 2 * F, C, INIT_NORMAL, std);
        } else {
            ADD(fc_w, "mlp.gate_proj.weight", F, C, INIT_NORMAL, std);
            ADD(up_w, "mlp.up_proj.weight", F, C, INIT_NORMAL, std);
        }
        ADD(proj_w, "mlp.down_proj.weight", C, F, INIT_NORMAL, rstd);
#undef ADD
    }
    m->lnf_w = tb_add(tb, "norm.weight", C, 0, 0, c->gemma ? INIT_ZEROS : INIT_ONES, 0);
    m->lnf_b = -1;
    m->lm_head = c->tied ? m->wte : tb_add(tb, "lm_head.weight", c->vocab, C, 0, INIT_NORMAL, std);
}

static inline float *P(const model *m, int i)
{
    return i < 0 ? NULL : m->params + m->t[i].off;
}
static inline float *G(const model *m, int i)
{
    if (i >= 0 && m->t[i].xgrad) return m->t[i].xgrad;
    return i < 0 || !m->grads ? NULL : m->grads + m->t[i].off;
}

/* The weights the kernels compute with: the fp32 parameters, or with
 * 16-bit storage their 16-bit copy widened into w1d. Only 1-D tensors
 * (norm weights, biases) come here in 16-bit runs: matmul weights are read
 * in 16 bits by kn_matmul16 (W16) and embeddings convert only the rows
 * used. The 16-bit copy changes only between passes (the optimizer,
 * loading), so each forward pass widens all 1-D tensors once, in one op,
 * at its first use; the backward and any recomputation read the same. */
static float *W(model *m, int i)
{
    if (i < 0) return NULL;
    if (m->dt == KN_F32) return m->params + m->t[i].off;
    if (m->t[i].ndim != 1) return NULL; /* not widened (see above) */
    if (!m->w1d_fresh) {
        kn_convert_spans(m->kn, m->w1d, KN_F32, m->p16, m->dt, m->w1d_spans, m->w1d_ns);
        m->w1d_fresh = 1;
    }
    return m->w1d + m->w1d_at[i];
}

static const void *W16(const model *m, int i)
{
    return i < 0 ? NULL : (const char *)m->p16 + m->t[i].off * kn_dtype_size(m->dt);
}

/* ---- linear layers ------------------------------------------------------ */

/* Counts n GEMMs issued with 16-bit (is16) or fp32 inputs: the types the
 * model hands the kernels, which decide a GPU's path (tensor cores or
 * not). */
static void gemms(model *m, int is16, int n)
{
    m->n_gemm[is16 ? 1 : 0] += (size_t)n;
}

void model_gemm_counts(const model *m, size_t out[2])
{
    out[0] = m->n_gemm[0];
    out[1] = m->n_gemm[1];
}

/* Element n of an activation buffer (type m->dt): views into fused rows. */
static inline void *AV(const model *m, void *p, size_t n)
{
    return p ? (char *)p + n * kn_dtype_size(m->dt) : NULL;
}

/* Whether an adapter is attached (linear.h: its hook runs after every
 * block matmul and skips the slots it does not adapt). */
static int adapted(const model *m)
{
    return m->adapter.state != NULL;
}

/* x[N,K] (dt) as fp32 for an adapter or a 4-bit matmul: x itself in fp32
 * runs, else widened into the xw scratch. */
static const float *x_f32(model *m, const void *x, size_t n)
{
    if (m->dt == KN_F32) return x;
    kn_convert(m->kn, m->xw, KN_F32, x, m->dt, n);
    return m->xw;
}

/* Whether 4-bit weight q4 (model_tensor.q4) multiplies in 16 bits: a
 * 16-bit run whose type the store takes (linear.h's fwd16 / bwd16: QLoRA
 * with compute_dtype the run's precision), x and dY as the run holds
 * them. */
static int base16(const model *m, int q4)
{
    return q4 && m->dt != KN_F32 && m->dt == m->base.dt16 && m->base.fwd16;
}

/* Linear layer of block l, adapter slot s: out[N,M] = x[N,K] W^T + b with
 * weights wi (rows [row0, row0 + M) of them when row0 >= 0: Phi-3's q, k, v
 * and gate, up are row blocks of one fused weight; a row block of a
 * row-major [out, in] matrix is itself one) and bias bi (-1 = none), then
 * the adapter's share. x and out are activations (dt). 16-bit runs write
 * out rounded once: straight from kn_matmul16, or, when an adapter or a
 * 4-bit base needs fp32, from the fp32 product in ow. */
static void lin_fwd(model *m, int l, int s, int row0, void *out, const void *x, int wi, int bi,
                    int N, int K, int M)
{
    kn_ctx *k = m->kn;
    int q4 = m->t[wi].q4, ad = adapted(m), part = row0 >= 0;
    size_t skip = part ? (size_t)row0 * K : 0;
    gemms(m, m->dt != KN_F32 && (!q4 || base16(m, q4)), 1);
    if (m->dt == KN_F32 || (!q4 && !ad)) {
        if (m->dt == KN_F32 && !q4)
            kn_matmul_fwd(k, out, x, W(m, wi) + skip, W(m, bi), N, K, M);
        else if (!q4) /* the bias as p16 holds it: a GPU's epilogue adds it as it is */
            kn_matmul16_fwd(k, m->dt, m->dt, m->dt, out, x,
                            (const char *)W16(m, wi) + skip * kn_dtype_size(m->dt), W16(m, bi),
                            m->dt, N, K, M);
        else /* QLoRA in fp32: dequantised on the fly by the store */
            m->base.fwd(m->base.state, q4 - 1, skip, out, x, W(m, bi), N, K, M);
        if (ad) m->adapter.fwd(m->adapter.state, l, s, out, x, N, part ? row0 : 0, M);
        return;
    }
    /* 16-bit with an adapter or a 4-bit base: fp32 product, then round */
    if (!m->ow || !m->xw) { /* model_alloc_acts made none: an engine bug */
        kn_fail(k, TY_EINTERNAL, "linear layer: no fp32 views for a 16-bit adapted layer");
        return;
    }
    const float *xf = ad || !base16(m, q4) ? x_f32(m, x, (size_t)N * K) : NULL;
    if (base16(m, q4))
        m->base.fwd16(m->base.state, q4 - 1, skip, m->ow, x, W(m, bi), N, K, M);
    else if (q4)
        m->base.fwd(m->base.state, q4 - 1, skip, m->ow, xf, W(m, bi), N, K, M);
    else
        kn_matmul16_fwd(k, m->dt, KN_F32, m->dt, m->ow, x,
                        (const char *)W16(m, wi) + skip * kn_dtype_size(m->dt), W(m, bi), KN_F32, N,
                        K, M);
    if (ad) m->adapter.fwd(m->adapter.state, l, s, m->ow, xf, N, part ? row0 : 0, M);
    kn_convert(k, out, m->dt, m->ow, KN_F32, (size_t)N * M);
}

/* The activation gradient g[n] as the backward GEMMs' input: g itself in
 * fp32 runs; in 16-bit runs its copy in dt in the g16 scratch, exact (the
 * backward rounds every activation gradient to dt where it produces it),
 * so dX = dY W and dW += dY^T X both run with 16-bit inputs (a GPU's
 * 16-bit tensor cores, the CPU's oneDNN bf16 GEMM), fp32 accumulation. */
static const void *grad_in(model *m, const float *g, size_t n)
{
    if (m->dt == KN_F32) return g;
    kn_convert(m->kn, m->g16, m->dt, g, KN_F32, n);
    return m->g16;
}

/* Its backward: dx[N,K] += dout W (fp32 gradients), dW += dout^T x, db +=
 * sum dout (the weight's own rows), and the adapter's share; g is dout as
 * grad_in gives it (read by the GEMMs and by a 16-bit frozen 4-bit base,
 * base16; the adapter and a 4-bit base on the fp32 path, which give the
 * input gradient only, read the fp32 dout). fresh: dx holds nothing yet,
 * so the product writes it (kn_matmul16_dx: not cleared first, not read
 * back); a 4-bit base, which adds into dx, gets it cleared. */
static void lin_bwd_g(model *m, int l, int s, int row0, float *dx, int fresh, const float *dout,
                      const void *g, const void *x, int wi, int bi, int N, int K, int M)
{
    kn_ctx *k = m->kn;
    int q4 = m->t[wi].q4, ad = adapted(m), part = row0 >= 0;
    size_t skip = part ? (size_t)row0 * K : 0;
    float *dw = G(m, wi) ? G(m, wi) + skip : NULL, *db = G(m, bi);
    int write = fresh && dx && !q4;
    gemms(m, m->dt != KN_F32 && (!q4 || base16(m, q4)), (dx != NULL) + (!q4 && dw != NULL));
    if (fresh && dx && q4) kn_zero(k, dx, (size_t)N * K);
    if (base16(m, q4)) {
        m->base.bwd16(m->base.state, q4 - 1, skip, dx, g, N, K, M);
    } else if (q4) {
        m->base.bwd(m->base.state, q4 - 1, skip, dx, dout, N, K, M);
    } else if (m->dt == KN_F32) {
        if (write) kn_matmul16_dx(k, KN_F32, KN_F32, KN_F32, dx, dout, W(m, wi) + skip, N, K, M);
        kn_matmul_bwd(k, write ? NULL : dx, dw, db, dout, x, W(m, wi) + skip, N, K, M);
    } else {
        const void *w = (const char *)W16(m, wi) + skip * kn_dtype_size(m->dt);
        if (write) kn_matmul16_dx(k, m->dt, m->dt, KN_F32, dx, g, w, N, K, M);
        kn_matmul16_bwd(k, m->dt, m->dt, m->dt, write ? NULL : dx, dw, db, g, x, w, N, K, M);
    }
    if (ad)
        m->adapter.bwd(m->adapter.state, l, s, dx, dout, x_f32(m, x, (size_t)N * K), N,
                       part ? row0 : 0, M);
}

/* Whether weight wi's backward GEMMs read dout as grad_in gives it: all
 * but a 4-bit base on the fp32 path, which reads the fp32 dout. */
static int gemm_reads_g(const model *m, int wi)
{
    int q4 = m->t[wi].q4;
    return !q4 || base16(m, q4);
}

/* lin_bwd_g for a layer whose input gradient dx[N,K] only one op reads,
 * and reads as dt rounds it (a norm's or a gated activation's backward,
 * given dout_dt dt): the product writes dx in dt, rounded once
 * (kn_matmul16_dx's dx_dt), the values that op would read from an fp32 dx,
 * at half the bytes. Where grad16_only(wi) (no adapter adds into dx, no
 * 4-bit base); the whole weight (no row block). */
static void lin_bwd_g_dt(model *m, int l, int s, void *dx, const void *g, const void *x, int wi,
                         int bi, int N, int K, int M)
{
    gemms(m, 1, 1);
    kn_matmul16_dx(m->kn, m->dt, m->dt, m->dt, dx, g, W16(m, wi), N, K, M);
    lin_bwd_g(m, l, s, -1, NULL, 0, NULL, g, x, wi, bi, N, K, M);
}

/* A layer's dx for its one reader, in dx_dt: the step's 16-bit type
 * (lin_bwd_g_dt, where grad16_only(wi)) or fp32, written by lin_bwd_g from
 * dout and g as it takes them (dx may be NULL: no input gradient). */
static void lin_bwd_g_as(model *m, int l, int s, kn_dtype dx_dt, float *dx, const float *dout,
                         const void *g, const void *x, int wi, int bi, int N, int K, int M)
{
    if (dx_dt != KN_F32)
        lin_bwd_g_dt(m, l, s, dx, g, x, wi, bi, N, K, M);
    else
        lin_bwd_g(m, l, s, -1, dx, 1, dout, g, x, wi, bi, N, K, M);
}

/* dout as weights wi's backward GEMMs read it: grad_in's copy, or NULL
 * where they read the fp32 dout (gemm_reads_g). */
static const void *grad_for(model *m, int wi, const float *dout, size_t n)
{
    return gemm_reads_g(m, wi) ? grad_in(m, dout, n) : NULL;
}

/* Whether weight wi's backward reads its output gradient only as grad_in's
 * 16-bit copy (a 16-bit step, no adapter, no 4-bit base): the op that
 * makes the gradient may then store it in dt itself (kernels.h, g_dt),
 * and lin_bwd_g takes it as g with no fp32 dout. */
static int grad16_only(const model *m, int wi)
{
    return m->dt != KN_F32 && !adapted(m) && !m->t[wi].q4;
}

/* Whether weight wi's backward GEMMs read their output gradient as
 * grad_in's 16-bit copy (grad_for converts): a norm's backward that makes
 * that gradient may then store the copy itself (kn_*norm_bwd's dx_dt, into
 * g16), and grad_made hands it on with no conversion pass. */
static int grad16_copy(const model *m, int wi)
{
    return m->dt != KN_F32 && gemm_reads_g(m, wi);
}

/* g16 when the gradient's 16-bit copy is to be stored there for weight
 * wi's GEMMs (when), else NULL: a norm backward's dx_dt. */
static void *copy16_for(model *m, int wi, int when)
{
    return when && grad16_copy(m, wi) ? m->g16 : NULL;
}

/* grad_for, or g16 where the op that made dout stored its copy there
 * (copy16_for gave it g16 and nothing has written g16 since). */
static const void *grad_made(model *m, int wi, const float *dout, size_t n, const void *copy)
{
    return copy ? copy : grad_for(m, wi, dout, n);
}

/* Whether a 16-bit step holds the residual stream's gradient in dt alone,
 * in dres's memory (kernels.h: a norm backward's dx_dt without dx): the
 * same values the fp32 dres holds, at half the bytes for every norm
 * backward that adds to it. Its readers must take it in dt: the MLP and
 * attention output projections' GEMMs do where nothing reads their fp32
 * dout (grad16_only), and the embedding's backward gets it widened once.
 * Not Gemma, whose post-norms read it as an fp32 dout. */
static int res16(const model *m)
{
    if (m->dt == KN_F32 || m->cfg.gemma) return 0;
    for (int l = 0; l < m->cfg.n_layer; l++)
        if (!grad16_only(m, m->L[l].proj_w) || !grad16_only(m, m->L[l].o_w)) return 0;
    return 1;
}

/* lin_bwd_g with dout converted here. */
static void lin_bwd(model *m, int l, int s, int row0, float *dx, int fresh, const float *dout,
                    const void *x, int wi, int bi, int N, int K, int M)
{
    const void *g = grad_for(m, wi, dout, (size_t)N * M);
    lin_bwd_g(m, l, s, row0, dx, fresh, dout, g, x, wi, bi, N, K, M);
}

/* GPT-2's c_fc + GELU run as one op (kn_matmul_gelu_fwd / kn_matmul_dgelu:
 * cuBLASLt's GELU epilogues on a GPU) where nothing comes between the
 * product and the GELU: no adapter hooked in (its delta is added to fc and
 * to the proj's dx) and no 4-bit base. In fp32 and 16-bit runs alike: the
 * ops take the activations (ln2, fc, act) and the gradient dres (through
 * grad_in) in the run's dtype, and on the CPU compute the same bits as the
 * unfused lin_fwd + kn_gelu_fwd / lin_bwd + kn_gelu_bwd with their
 * roundings. */
static int fused_gelu(const model *m, const layer_ix *L)
{
    return !m->adapter.state && !m->t[L->fc_w].q4 && !m->t[L->proj_w].q4 && !m->w16;
}

/* A linear weight as the fused ops take it: fp32, or the 16-bit copy. */
static const void *WL(model *m, int i)
{
    return m->dt == KN_F32 ? (const void *)W(m, i) : W16(m, i);
}

/* The first table index of layer l's tensors (built contiguously): where
 * its gradients start in the layout. */
static int layer_first(const model *m, int l)
{
    const int *ix = (const int *)&m->L[l];
    int lo = m->nt;
    for (size_t j = 0; j < sizeof(layer_ix) / sizeof(int); j++)
        if (ix[j] >= 0 && ix[j] < lo) lo = ix[j];
    return lo;
}

int model_set_precision(model *m, kn_dtype dt, ty_err *err)
{
    if (m->p16) return 0; /* a QLoRA base's 16-bit home, made before loading */
    m->dt = dt;
    if (dt == KN_F32) return 0;
    size_t total = m->t[m->nt - 1].off + m->t[m->nt - 1].numel;
    /* The 1-D tensors' fp32 scratch, each 64-byte aligned: a few thousand
     * floats a layer (GPT-2 124M: 474 KiB in all). */
    m->w1d_at = calloc((size_t)m->nt, sizeof *m->w1d_at);
    m->w1d_spans = calloc((size_t)m->nt, sizeof *m->w1d_spans);
    if (!m->w1d_at || !m->w1d_spans)
        return ty_err_set(err, TY_ENOMEM, "out of memory for the weight table");
    size_t pos = 0;
    for (int i = 0; i < m->nt; i++)
        if (m->t[i].ndim == 1) {
            m->w1d_at[i] = pos;
            m->w1d_spans[m->w1d_ns++] = (kn_span){pos, m->t[i].off, m->t[i].numel};
            pos += (m->t[i].numel + 15) & ~(size_t)15;
        }
    m->w1d_n = pos ? pos : 16;
    m->w1d_fresh = 0;
    m->p16 = kn_alloc(m->kn, total * kn_dtype_size(dt));
    m->w1d = kn_alloc(m->kn, m->w1d_n * sizeof(float));
    if (!m->p16 || !m->w1d)
        return ty_err_set(err, TY_ENOMEM,
                          "out of memory for %s parameters (%zu bytes) and weight scratch",
                          kn_dtype_name(dt), total * kn_dtype_size(dt));
    if (dt == KN_BF16 && !m->frozen) {
        /* bf16 masters split (kn_master_split): the bf16 weights the
         * forward reads plus the low 16 bits of each fp32 master; the fp32
         * buffer goes. 4 bytes a parameter instead of 6, same numbers. */
        m->plo = kn_alloc(m->kn, total * sizeof(uint16_t));
        if (!m->plo) return ty_err_set(err, TY_ENOMEM, "out of memory for the masters' low halves");
        kn_master_split(m->kn, m->p16, m->plo, m->params, total);
        kn_free(m->kn, m->params);
        m->params = NULL;
        return 0;
    }
    model_sync_params(m);
    if (m->n_q4) {
        /* QLoRA's frozen 16-bit base is read only through p16 (and, for
         * the merged export, re-read from the model directory): the fp32
         * copy of the embeddings, norms and lm_head goes. */
        kn_free(m->kn, m->params);
        m->params = NULL;
    }
    return 0;
}

int model_nf4_home(model *m, kn_dtype dt, ty_err *err)
{
    if (dt != KN_F32) return model_set_precision(m, dt, err); /* p16, no fp32 buffer */
    size_t total = m->t[m->nt - 1].off + m->t[m->nt - 1].numel;
    if (!(m->params = kn_alloc(m->kn, total * sizeof(float))))
        return ty_err_set(err, TY_ENOMEM, "out of memory: %zu bytes for parameters",
                          total * sizeof(float));
    return 0;
}

void *model_master(model *m, int i, kn_dtype *pdt, uint16_t **plo)
{
    size_t off = m->t[i].off;
    *pdt = m->plo ? KN_BF16 : KN_F32;
    *plo = m->plo ? m->plo + off : NULL;
    return m->plo ? (void *)((uint16_t *)m->p16 + off) : (void *)(m->params + off);
}

void model_sync_params(model *m)
{
    if (m->dt == KN_F32) return;
    size_t total = m->t[m->nt - 1].off + m->t[m->nt - 1].numel;
    /* Split masters: AdamW wrote p16; ZeRO-1's sharded masters (no
     * params here): zero.c rounded and all-gathered it. */
    if (!m->plo && m->params) kn_convert(m->kn, m->p16, m->dt, m->params, KN_F32, total);
    m->w1d_fresh = 0; /* the scratch is stale now */
}

size_t model_act_bytes(const model *m)
{
    return m->n_acts;
}

model_mem model_memory(const model *m)
{
    size_t total = m->nt ? m->t[m->nt - 1].off + m->t[m->nt - 1].numel : 0;
    model_mem r = {0};
    r.params = m->params ? total * sizeof(float) : m->plo ? total * sizeof(uint16_t) : 0;
    r.p16 = m->p16 ? total * kn_dtype_size(m->dt) : 0;
    r.grads = m->grads ? total * sizeof(float) : 0;
    r.moments = (m->m ? total * sizeof(float) : 0) + (m->v ? total * sizeof(float) : 0);
    r.acts = model_act_bytes(m);
    r.wscratch = m->w1d ? m->w1d_n * sizeof(float) : 0;
    return r;
}

int model_create(model *m, model_config *cfg, kn_ctx *kn, ty_err *err)
{
    return model_create_ex(m, cfg, kn, 0, err);
}

int model_create_ex(model *m, model_config *cfg, kn_ctx *kn, int frozen, ty_err *err)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    memset(cfg, 0, sizeof *cfg);
    m->kn = kn;
    m->L = calloc((size_t)m->cfg.n_layer, sizeof *m->L);
    table_builder tb = {0};
    if (m->L) {
        if (m->cfg.arch == ARCH_GPT2)
            build_gpt2(m, &tb);
        else
            build_llama(m, &tb);
    }
    m->t = tb.t;
    m->nt = tb.n;
    if (!m->L || tb.oom)
        return ty_err_set(err, TY_ENOMEM, "out of memory building the tensor table");
    size_t total = tb.off, real = 0;
    for (int i = 0; i < m->nt; i++)
        real += m->t[i].numel;
    m->n_params = real;
    if (m->cfg.rope_scaled || (m->cfg.gemma && m->cfg.rope_global_factor != 1.0f)) {
        int half = m->cfg.head_dim / 2;
        float *h = malloc((size_t)half * sizeof *h);
        m->inv_freq = kn_alloc(kn, (size_t)half * sizeof(float));
        if (!h || !m->inv_freq) {
            free(h);
            return ty_err_set(err, TY_ENOMEM, "out of memory for RoPE frequencies");
        }
        hfconfig_inv_freq(&m->cfg, h);
        kn_to_device(kn, m->inv_freq, h, (size_t)half * sizeof(float));
        free(h);
    }
    if (m->cfg.gemma) {
        int n = m->cfg.dim > m->cfg.head_dim ? m->cfg.dim : m->cfg.head_dim;
        float *h = malloc((size_t)n * sizeof *h);
        m->nw = kn_alloc(kn, (size_t)n * sizeof(float));
        m->ones = kn_alloc(kn, (size_t)n * sizeof(float));
        if (!h || !m->nw || !m->ones) {
            free(h);
            return ty_err_set(err, TY_ENOMEM, "out of memory for norm weights");
        }
        for (int i = 0; i < n; i++)
            h[i] = 1.0f;
        kn_to_device(kn, m->ones, h, (size_t)n * sizeof(float));
        free(h);
    }
    if (frozen == MODEL_FROZEN_NF4) total = model_linear_set_aside(m);
    size_t bytes = total * sizeof(float);
    m->frozen = frozen;
    if (frozen == MODEL_FROZEN_NF4) return 0; /* its buffer: model_nf4_home */
    m->params = kn_alloc(kn, bytes);
    if (frozen) {
        if (!m->params)
            return ty_err_set(err, TY_ENOMEM, "out of memory: %zu bytes for parameters", bytes);
        return 0;
    }
    m->grads = kn_alloc(kn, bytes);
    m->m = kn_alloc(kn, bytes);
    m->v = kn_alloc(kn, bytes);
    if (!m->params || !m->grads || !m->m || !m->v)
        return ty_err_set(err, TY_ENOMEM,
                          "out of memory: 4 x %zu bytes for parameters, gradients and AdamW state",
                          bytes);
    return 0;
}

void model_free(model *m)
{
    if (!m) return;
    if (m->kn) {
        kn_free(m->kn, m->params);
        kn_free(m->kn, m->grads);
        kn_free(m->kn, m->m);
        kn_free(m->kn, m->v);
        kn_free(m->kn, m->acts);
        kn_free(m->kn, m->p16);
        kn_free(m->kn, m->plo);
        kn_free(m->kn, m->w1d);
        kn_free(m->kn, m->ids);
        kn_free(m->kn, m->targets);
        kn_free(m->kn, m->pos);
        kn_free(m->kn, m->inv_freq);
        kn_free(m->kn, m->nw);
        kn_free(m->kn, m->ones);
        kn_free(m->kn, m->w16);
    }
    if (m->base.free) m->base.free(m->base.state);
    free(m->t);
    free(m->L);
    free(m->A);
    free(m->w1d_at);
    free(m->w1d_spans);
    hfconfig_free(&m->cfg);
    memset(m, 0, sizeof *m);
}

void model_rope(model *m, kn_dtype dt, void *x, int B, int T, int H, int ld, int pos_offset,
                int bwd)
{
    int D = m->cfg.head_dim;
    /* dt: the rows' type (the backward's gradients: fp32, or dt rounded) */
    if (m->inv_freq) {
        if (bwd)
            kn_rope_freq_bwd(m->kn, dt, x, B, T, H, D, ld, m->inv_freq, pos_offset);
        else
            kn_rope_freq_fwd(m->kn, dt, x, B, T, H, D, ld, m->inv_freq, pos_offset);
    } else {
        if (bwd)
            kn_rope_bwd(m->kn, dt, x, B, T, H, D, ld, m->cfg.rope_theta, pos_offset);
        else
            kn_rope_fwd(m->kn, dt, x, B, T, H, D, ld, m->cfg.rope_theta, pos_offset);
    }
}

void model_rope_layer(model *m, int l, kn_dtype dt, void *x, int B, int T, int H, int ld,
                      int pos_offset, int bwd)
{
    const model_config *c = &m->cfg;
    if (c->gemma == 3 && hfconfig_sliding(c, l)) {
        if (bwd)
            kn_rope_bwd(m->kn, dt, x, B, T, H, c->head_dim, ld, c->rope_local_theta, pos_offset);
        else
            kn_rope_fwd(m->kn, dt, x, B, T, H, c->head_dim, ld, c->rope_local_theta, pos_offset);
        return;
    }
    model_rope(m, dt, x, B, T, H, ld, pos_offset, bwd);
}

const float *model_norm_w(model *m, const float *w, int n)
{
    if (!m->cfg.gemma || !w) return w;
    kn_add(m->kn, KN_F32, m->nw, w, m->ones, (size_t)n);
    return m->nw;
}

void model_hf_name(const model *m, const model_tensor *t, char *out, size_t n)
{
    if (!strcmp(t->name, "lm_head.weight"))
        snprintf(out, n, "%s", t->name);
    else
        snprintf(out, n, "%s%s", m->cfg.arch == ARCH_GPT2 ? "transformer." : "model.", t->name);
}

/* ---- init -------------------------------------------------------------- */

/* One tensor's random values: pairs [lo, hi) of buf (2p and 2p + 1, the
 * last pair possibly half), pair p drawing the stream's two numbers after
 * state0 + 2p draws: the values a single pass over the stream gives. */
typedef struct init_job {
    float *buf;
    size_t numel, lo, hi;
    uint64_t state0;
    double std;
    int kind;
} init_job;

static void *init_pairs(void *arg)
{
    const init_job *j = arg;
    uint64_t state = rng_skip(j->state0, 2 * (uint64_t)j->lo);
    for (size_t p = j->lo; p < j->hi; p++) {
        float z0 = j->kind == INIT_ONES ? 1.0f : 0.0f, z1 = z0;
        if (j->kind == INIT_NORMAL) {
            /* Box-Muller on two 53-bit uniforms; u1 in (0, 1]. */
            double u1 = 1.0 - rng_unit(&state);
            double u2 = rng_unit(&state);
            double r = sqrt(-2.0 * log(u1));
            z0 = (float)(r * cos(2.0 * M_PI * u2) * j->std);
            z1 = (float)(r * sin(2.0 * M_PI * u2) * j->std);
        }
        j->buf[2 * p] = z0;
        if (2 * p + 1 < j->numel) j->buf[2 * p + 1] = z1;
    }
    return NULL;
}

/* Threads for the init: the machine's cores, up to INIT_THREADS; tensors
 * under INIT_SERIAL pairs are filled by the calling thread. */
#define INIT_THREADS 32
#define INIT_SERIAL ((size_t)1 << 18)

static void init_fill(float *buf, const model_tensor *t, uint64_t state0, int nthreads)
{
    size_t pairs = (t->numel + 1) / 2;
    init_job jobs[INIT_THREADS];
    pthread_t tid[INIT_THREADS];
    int n = pairs < INIT_SERIAL ? 1 : nthreads;
    bool live[INIT_THREADS] = {false};
    for (int k = 0; k < n; k++)
        jobs[k] = (init_job){buf,    t->numel,    pairs * k / n, pairs * (k + 1) / n,
                             state0, t->init_std, t->init};
    for (int k = 1; k < n; k++) /* a thread that cannot start: its piece runs here */
        live[k] = !pthread_create(&tid[k], NULL, init_pairs, &jobs[k]);
    for (int k = 0; k < n; k++)
        if (!live[k]) init_pairs(&jobs[k]);
    for (int k = 1; k < n; k++)
        if (live[k]) pthread_join(tid[k], NULL);
}

int model_init_random(model *m, uint64_t seed, ty_err *err)
{
    size_t maxn = 0;
    for (int i = 0; i < m->nt; i++)
        if (m->t[i].numel > maxn) maxn = m->t[i].numel;
    float *buf = malloc(maxn * sizeof *buf);
    if (!buf) return ty_err_set(err, TY_ENOMEM, "out of memory initialising weights");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = cores < 1 ? 1 : cores > INIT_THREADS ? INIT_THREADS : (int)cores;
    uint64_t state = seed;
    for (int i = 0; i < m->nt; i++) {
        const model_tensor *t = &m->t[i];
        init_fill(buf, t, state, nthreads);
        if (t->init == INIT_NORMAL) /* two draws a pair; the other inits draw none */
            state = rng_skip(state, 2 * (uint64_t)((t->numel + 1) / 2));
        int rc = model_put_f32(m, i, buf, err);
        if (rc) {
            free(buf);
            return rc;
        }
    }
    free(buf);
    return 0;
}

/* ---- loading ----------------------------------------------------------- */

/* Buffers stored by transformers that are not parameters. */
static int ignorable(const model *m, const char *name)
{
    size_t n = strlen(name);
#define ENDS(s) (n >= sizeof(s) - 1 && !strcmp(name + n - (sizeof(s) - 1), s))
    if (m->cfg.arch == ARCH_GPT2 && (ENDS(".attn.bias") || ENDS(".attn.masked_bias"))) return 1;
    if (ENDS(".rotary_emb.inv_freq")) return 1;
    /* A tied model may still carry lm_head.weight; transformers re-ties it
     * to the embedding after loading, so the stored copy is never used. */
    if (m->cfg.tied && !strcmp(name, "lm_head.weight")) return 1;
#undef ENDS
    return 0;
}

/* Strips the family prefix; NULL when the name is not one of ours. */
static int find_tensor(const model *m, const char *name, const char *suffix)
{
    const char *pre = m->cfg.arch == ARCH_GPT2 ? "transformer." : "model.";
    size_t pl = strlen(pre), sl = strlen(suffix), n = strlen(name);
    if (!strncmp(name, pre, pl)) {
        name += pl;
        n -= pl;
    }
    if (n < sl || strcmp(name + n - sl, suffix)) return -1;
    for (int i = 0; i < m->nt; i++)
        if (strlen(m->t[i].name) == n - sl && !strncmp(m->t[i].name, name, n - sl)) return i;
    return -1;
}

static void fmt_shape(char *out, size_t n, int ndim, const int64_t *s)
{
    size_t k = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(out + k, n - k, d ? ", %lld" : "%lld", (long long)s[d]);
    if (k < n) snprintf(out + k, n - k, "]");
}

/* Copies one stored tensor into dst (a buffer of the table layout; NULL:
 * the 16-bit home of a QLoRA base, model_load.h), a slice at a time. */
static int load_one(model *m, int idx, const st_tensor *st, float *dst, load_ctx *lc, ty_err *err)
{
    const model_tensor *t = &m->t[idx];
    int64_t want[2] = {t->conv1d ? t->shape[1] : t->shape[0],
                       t->conv1d ? t->shape[0] : t->shape[1]};
    int ok =
        st->ndim == t->ndim && st->shape[0] == want[0] && (t->ndim == 1 || st->shape[1] == want[1]);
    if (!ok) {
        char a[96], b[96];
        fmt_shape(a, sizeof a, st->ndim, st->shape);
        fmt_shape(b, sizeof b, t->ndim, want);
        return ty_err_field(err, TY_EINVAL, st->name,
                            "tensor %s has shape %s but config.json implies %s", st->name, a, b);
    }
    return load_tensor(m, idx, st, dst, lc, err);
}

/* Loads every tensor of one file whose name ends in suffix into dst. */
static int load_file_into(model *m, const st_file *f, const char *suffix, float *dst, load_ctx *lc,
                          ty_err *err)
{
    for (int i = 0; i < f->n; i++) {
        const st_tensor *st = &f->t[i];
        int idx = find_tensor(m, st->name, suffix);
        if (idx < 0) {
            if (!*suffix && ignorable(m, st->name)) continue;
            const char *fq = st_foreign_quant(st->name);
            if (fq)
                return ty_err_field(
                    err, TY_EINVAL, st->name,
                    "%s: tensor %s is part of a model quantised by %s; load the original "
                    "fp32/bf16/fp16 weights (method qlora quantises them itself)",
                    f->path, st->name, fq);
            if (*suffix &&
                (idx = find_tensor(m, st->name,
                                   !strcmp(suffix, ".exp_avg") ? ".exp_avg_sq" : ".exp_avg")) >= 0)
                continue; /* the other moment, loaded in its own pass */
            return ty_err_field(err, TY_EINVAL, st->name,
                                "%s: unexpected tensor %s (not part of a %s model)", f->path,
                                st->name, m->cfg.model_type);
        }
        if (lc->seen[idx])
            return ty_err_field(err, TY_EINVAL, st->name, "%s: tensor %s stored twice", f->path,
                                st->name);
        lc->seen[idx] = 1;
        int rc = load_one(m, idx, st, dst, lc, err);
        if (rc) return rc;
    }
    return 0;
}

static int check_all_seen(const model *m, const load_ctx *lc, const char *where, const char *suffix,
                          ty_err *err)
{
    for (int i = 0; i < m->nt; i++)
        if (!lc->seen[i]) {
            char hf[128];
            model_hf_name(m, &m->t[i], hf, sizeof hf);
            return ty_err_field(err, TY_EINVAL, hf, "%s: missing tensor %s%s", where, hf, suffix);
        }
    return 0;
}

int model_load_file(model *m, const char *path, ty_err *err)
{
    load_ctx lc = {0};
    st_file f;
    int rc = load_ctx_init(m, &lc, err);
    if (!rc) rc = st_open(&f, path, err);
    if (!rc) {
        rc = load_file_into(m, &f, "", m->params, &lc, err);
        st_close(&f);
    }
    if (!rc) rc = check_all_seen(m, &lc, path, "", err);
    load_ctx_free(&lc);
    return rc;
}

/* Sharded: the distinct files named by weight_map, each loaded in turn. */
static int load_sharded(model *m, const char *dir, const char *index_path, ty_err *err)
{
    json_t *idx;
    int rc = ty_read_json(index_path, TY_EINVAL, &idx, err);
    if (rc) return rc;
    json_t *wm = json_object_get(idx, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(idx);
        return ty_err_set(err, TY_EINVAL, "%s: not a safetensors index (no weight_map object)",
                          index_path);
    }
    /* Distinct shard names, in first-seen order. */
    json_t *shards = json_array();
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val)
    {
        if (!json_is_string(val) || strchr(json_string_value(val), '/')) {
            rc = ty_err_field(err, TY_EINVAL, key, "%s: weight_map[%s] is not a file name",
                              index_path, key);
            break;
        }
        int dup = 0;
        size_t i;
        json_t *s;
        json_array_foreach(shards, i, s) dup |=
            !strcmp(json_string_value(s), json_string_value(val));
        if (!dup) json_array_append(shards, val);
    }
    load_ctx lc = {0};
    if (!rc) rc = load_ctx_init(m, &lc, err);
    size_t i;
    json_t *s;
    json_array_foreach(shards, i, s)
    {
        if (rc) break;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(s));
        st_file f;
        rc = st_open(&f, path, err);
        if (rc) break;
        /* Every tensor in a shard must be listed there by the index. */
        for (int k = 0; k < f.n && !rc; k++) {
            json_t *w = json_object_get(wm, f.t[k].name);
            if (!w || strcmp(json_string_value(w), json_string_value(s)))
                rc = ty_err_field(err, TY_EINVAL, f.t[k].name,
                                  "%s: tensor %s is not listed for this shard in %s", path,
                                  f.t[k].name, index_path);
        }
        if (!rc) rc = load_file_into(m, &f, "", m->params, &lc, err);
        st_close(&f);
    }
    if (!rc) rc = check_all_seen(m, &lc, dir, "", err);
    load_ctx_free(&lc);
    json_decref(shards);
    json_decref(idx);
    return rc;
}

int model_load_dir(model *m, const char *dir, ty_err *err)
{
    char single[4096], index[4096];
    struct stat st;
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    if (stat(single, &st) == 0) return model_load_file(m, single, err);
    if (stat(index, &st) == 0) return load_sharded(m, dir, index, err);
    return ty_err_set(err, TY_ENOENT, "%s: no model.safetensors or model.safetensors.index.json",
                      dir);
}

int model_load_optimizer(model *m, const char *path, ty_err *err)
{
    load_ctx lc = {0};
    st_file f;
    int rc = load_ctx_init(m, &lc, err);
    if (!rc) rc = st_open(&f, path, err);
    if (rc) {
        load_ctx_free(&lc);
        return rc;
    }
    rc = load_file_into(m, &f, ".exp_avg", m->m, &lc, err);
    if (!rc) rc = check_all_seen(m, &lc, path, ".exp_avg", err);
    if (!rc) {
        memset(lc.seen, 0, (size_t)m->nt);
        rc = load_file_into(m, &f, ".exp_avg_sq", m->v, &lc, err);
    }
    if (!rc) rc = check_all_seen(m, &lc, path, ".exp_avg_sq", err);
    st_close(&f);
    load_ctx_free(&lc);
    return rc;
}

/* ---- saving ------------------------------------------------------------ */

typedef struct {
    model *m;
    const float *bufs[2]; /* which buffer tensor i comes from: i < nt -> bufs[0], else bufs[1];
                           * NULL with m->plo: the split bf16 masters */
    float *stage;         /* a Conv1D tensor whole (the largest of them), to transpose */
    float *join;          /* device: ST_WRITE_PIECE joined masters */
} save_ctx;

/* Elements [o, o + n) of tensor t of the buffer b (or the split masters)
 * as fp32 into host out. */
static int save_copy(save_ctx *sc, const float *buf, const model_tensor *t, size_t o, size_t n,
                     float *out, ty_err *err)
{
    model *m = sc->m;
    if (buf || !m->plo) {
        kn_to_host(m->kn, out, buf + t->off + o, n * sizeof(float));
        return 0;
    }
    kn_master_join(m->kn, sc->join, (const uint16_t *)m->p16 + t->off + o, m->plo + t->off + o, n);
    kn_to_host(m->kn, out, sc->join, n * sizeof(float));
    return kn_check(m->kn, err) ? -1 : 0;
}

/* st_write_ranges' fill: elements [off, off + n) of tensor i in the
 * file's order. Engine tensors are [out, in]; a Conv1D one is [in, out] on
 * disk, so it is read whole into the stage at its first piece and each
 * piece transposed from there (the largest, GPT-2's c_fc, is 9 MiB). */
static int save_fill(void *vctx, int i, uint64_t off, size_t n, float *out, ty_err *err)
{
    save_ctx *sc = vctx;
    model *m = sc->m;
    const float *buf = sc->bufs[i / m->nt];
    const model_tensor *t = &m->t[i % m->nt];
    if (!t->conv1d) return save_copy(sc, buf, t, (size_t)off, n, out, err);
    if (off == 0)
        for (size_t o = 0; o < t->numel; o += ST_WRITE_PIECE)
            if (save_copy(sc, buf, t, o,
                          t->numel - o < ST_WRITE_PIECE ? t->numel - o : ST_WRITE_PIECE,
                          sc->stage + o, err))
                return -1;
    int64_t o = t->shape[0], in = t->shape[1]; /* engine [out, in] -> disk [in, out] */
    for (size_t e = 0; e < n; e++) {
        uint64_t d = off + e; /* disk element: row d / o (an input), column d % o (an output) */
        out[e] = sc->stage[(int64_t)(d % (uint64_t)o) * in + (int64_t)(d / (uint64_t)o)];
    }
    return 0;
}

/* The writer's piece buffers: kn_host_alloc's (page-locked on a GPU, so
 * save_copy's copies out of the device into them are direct). */
static void *host_buf(void *kn, size_t bytes)
{
    return kn_host_alloc(kn, bytes);
}
static void host_buf_free(void *kn, void *p)
{
    kn_host_free(kn, p);
}

static int save_tensors(model *m, const char *path, const float *b0, const float *b1,
                        const char *s0, const char *s1, st_dtype dtype, ty_err *err)
{
    if (m->n_q4) /* its linear weights are 4-bit: saving them is the export's merge (train.c) */
        return ty_err_set(err, TY_EINVAL, "%s: a QLoRA model's quantised base is not saved", path);
    int n = m->nt * (b1 ? 2 : 1);
    st_out *outs = calloc((size_t)n, sizeof *outs);
    char(*names)[160] = calloc((size_t)n, sizeof *names);
    size_t maxn = 1;
    for (int i = 0; i < m->nt; i++)
        if (m->t[i].conv1d && m->t[i].numel > maxn) maxn = m->t[i].numel;
    save_ctx sc = {m, {b0, b1}, malloc(maxn * sizeof(float)), NULL};
    int rc;
    if (!b0 && m->plo) sc.join = kn_alloc(m->kn, ST_WRITE_PIECE * sizeof(float));
    if (!outs || !names || !sc.stage || (!b0 && m->plo && !sc.join)) {
        rc = ty_err_set(err, TY_ENOMEM, "out of memory writing %s", path);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        const model_tensor *t = &m->t[i % m->nt];
        char hf[128];
        model_hf_name(m, t, hf, sizeof hf);
        snprintf(names[i], sizeof names[i], "%s%s", hf, i < m->nt ? s0 : s1);
        outs[i].name = names[i];
        outs[i].ndim = t->ndim;
        outs[i].shape[0] = t->conv1d ? t->shape[1] : t->shape[0];
        outs[i].shape[1] = t->conv1d ? t->shape[0] : t->shape[1];
    }
    json_t *meta = json_pack("{s:s}", "format", "pt");
    st_bufs pinned = {host_buf, host_buf_free, m->kn};
    rc = st_write_ranges_in(path, outs, n, meta, save_fill, &sc, dtype, &pinned, err);
    json_decref(meta);
out:
    free(outs);
    free(names);
    free(sc.stage);
    kn_free(m->kn, sc.join);
    return rc;
}

int model_save_file(model *m, const char *path, ty_err *err)
{
    return save_tensors(m, path, m->params, NULL, "", "", ST_F32, err);
}

int model_save_file_as(model *m, const char *path, kn_dtype dt, ty_err *err)
{
    st_dtype sd = dt == KN_BF16 ? ST_BF16 : dt == KN_F16 ? ST_F16 : ST_F32;
    return save_tensors(m, path, m->params, NULL, "", "", sd, err);
}

int model_save_optimizer(model *m, const char *path, ty_err *err)
{
    return save_tensors(m, path, m->m, m->v, ".exp_avg", ".exp_avg_sq", ST_F32, err);
}

/* ---- activations ------------------------------------------------------- */

/* Rows of the head's logit chunk for N rows: ce_rows when asked for,
 * else the device's choice (kn_logit_rows: the [N, V] logits, GPT-2 seq
 * 4096: 786 MiB in fp32, a 128k vocabulary's GBs, become a chunk reused
 * chunk after chunk; docs/engine.md), never more than N. */
static int head_rows(const model *m, size_t N, size_t V, size_t es)
{
    if (m->ce_rows <= 0) return kn_logit_rows(m->kn, N, V, es);
    return (int)((size_t)m->ce_rows < N ? (size_t)m->ce_rows : N);
}

int model_alloc_acts(model *m, int B, int T, model_recompute rc_mode, ty_err *err)
{
    const model_config *c = &m->cfg;
    size_t N = (size_t)B * T, C = (size_t)c->dim, F = (size_t)c->ffn, V = (size_t)c->vocab;
    size_t QD = (size_t)c->n_head * c->head_dim, KD = (size_t)c->n_kv_head * c->head_dim;
    size_t LSE = (size_t)B * c->n_head * T; /* attention keeps one number per row */
    int gpt2 = c->arch == ARCH_GPT2;
    size_t es = kn_dtype_size(m->dt);
    /* One arena in bytes; two passes: the first measures, the second
     * assigns views. Activations take es bytes an element (the storage
     * type: 16-bit runs keep them in 16 bits, ops read and write them so),
     * statistics and the activation gradients of one layer 4. */
    char *base = NULL;
    size_t off = 0;
    int inf = m->inference; /* forward only: no gradients, no logit chunk */
    model_free_acts(m);
    m->A = calloc((size_t)c->n_layer, sizeof *m->A);
    if (!m->A) return ty_err_set(err, TY_ENOMEM, "out of memory for activations");
    m->recompute = rc_mode;
    /* Recomputed activations are not kept per layer: every layer's view
     * points at layer 0's (the backward refills it just before use). With
     * mlp: ln2 and the F-wide fc/up/act; with all: everything but res3,
     * the layer's output and the next layer's input. */
    int keep_attn = rc_mode != MODEL_RECOMPUTE_ALL, keep_mlp = rc_mode == MODEL_RECOMPUTE_NONE;
    /* 16-bit runs with adapters on a frozen base (LoRA, QLoRA): fp32 x and
     * product views */
    int wide = m->dt != KN_F32 && m->frozen;
    size_t maxk = C > QD ? C : QD, maxm = gpt2 ? 3 * C : QD;
    if (F > maxk) maxk = F;
    if (F > maxm) maxm = F;
    if (C > maxm) maxm = C;
    /* g16 holds one product's 16-bit output gradient, or a layer's dq, dk
     * and dv together (the backward's 16-bit q/k/v path) */
    size_t maxg = maxm > QD + 2 * KD ? maxm : QD + 2 * KD;
    for (int pass = 0; pass < 2; pass++) {
        off = 0;
#define TAKEB(bytes)                                                                               \
    (off += ((bytes) + 63) & ~(size_t)63, base ? base + off - (((bytes) + 63) & ~(size_t)63) : NULL)
#define TAKE(n) ((float *)TAKEB((n) * sizeof(float)))
#define TAKE16(n) ((void *)TAKEB((n)*es))
        m->encoded = TAKE16(N * C);
        for (int l = 0; l < c->n_layer; l++) {
            layer_acts *a = &m->A[l];
            const layer_acts *a0 = &m->A[0];
#define KEEP(field, keep, n) a->field = (keep) || l == 0 ? TAKE(n) : a0->field
#define KEEP16(field, keep, n) a->field = (keep) || l == 0 ? TAKE16(n) : a0->field
            KEEP16(ln1, keep_attn, N * C);
            a->ln1_mean = NULL;
            if (gpt2) KEEP(ln1_mean, keep_attn, N);
            KEEP(ln1_rstd, keep_attn, N);
            if (gpt2) {
                KEEP16(q, keep_attn, N * 3 * C); /* fused qkv rows [N, 3C] */
                a->k = AV(m, a->q, C);
                a->v = AV(m, a->q, 2 * C);
            } else {
                KEEP16(q, keep_attn, N * QD);
                KEEP16(k, keep_attn, N * KD);
                KEEP16(v, keep_attn, N * KD);
            }
            a->qr = a->kr = NULL;
            a->qn_rstd = a->kn_rstd = NULL;
            if (c->qk_norm) {
                KEEP16(qr, keep_attn, N * QD);
                KEEP16(kr, keep_attn, N * KD);
                KEEP(qn_rstd, keep_attn, N * c->n_head);
                KEEP(kn_rstd, keep_attn, N * c->n_kv_head);
            }
            KEEP(lse, keep_attn, LSE);
            KEEP16(atty, keep_attn, N * QD);
            a->ao = a->mo = NULL;
            a->ao_rstd = a->mo_rstd = NULL;
            if (c->gemma) {
                KEEP16(ao, keep_attn, N * C);
                KEEP(ao_rstd, keep_attn, N);
                /* kept with the attention's: recompute mlp redoes only
                 * mlp_in_fwd, not the branch's output and its norm */
                KEEP16(mo, keep_attn, N * C);
                KEEP(mo_rstd, keep_attn, N);
            }
            KEEP16(res2, keep_attn, N * C);
            KEEP16(ln2, keep_mlp, N * C);
            a->ln2_mean = NULL;
            a->up = NULL;
            if (gpt2) KEEP(ln2_mean, keep_mlp, N);
            KEEP(ln2_rstd, keep_mlp, N);
            KEEP16(fc, keep_mlp, N * F);
            if (!gpt2) KEEP16(up, keep_mlp, N * F);
            KEEP16(act, keep_mlp, N * F);
            a->res3 = TAKE16(N * C);
#undef KEEP
#undef KEEP16
        }
        m->lnf = TAKE16(N * C);
        m->lnf_mean = TAKE(N);
        m->lnf_rstd = TAKE(N);
        m->logit_ld = kn_logit_ld(m->kn, (int)V);
        m->logit_rows = inf ? 0 : head_rows(m, N, (size_t)m->logit_ld, es);
        /* in dt: the dlogits are written over them */
        m->logits = inf ? NULL : TAKE16((size_t)m->logit_rows * m->logit_ld);
        m->losses = inf ? NULL : TAKE(N);
        m->tmp = TAKE16(N * C);
        m->xw = wide ? TAKE(N * maxk) : NULL;
        m->ow = wide ? TAKE(N * maxm) : NULL;
        m->dres = TAKE(N * C); /* also the forward's scratch for Gemma's embedding scale */
        m->dln = inf ? NULL : TAKE(N * C);
        m->datty = inf ? NULL : TAKE(N * QD);
        m->dq = inf ? NULL : TAKE(N * (gpt2 ? 3 * C : QD));
        m->dk = gpt2 ? (m->dq ? m->dq + C : NULL) : inf ? NULL : TAKE(N * KD);
        m->dv = gpt2 ? (m->dq ? m->dq + 2 * C : NULL) : inf ? NULL : TAKE(N * KD);
        m->dact = inf ? NULL : TAKE(N * F);
        m->dfc = inf ? NULL : TAKE(N * F);
        m->dup = gpt2 || inf ? NULL : TAKE(N * F);
        m->dqr = c->qk_norm && !inf ? TAKE(N * QD) : NULL;
        m->g16 = m->dt != KN_F32 && !inf ? TAKE16(N * maxg) : NULL;
        m->dkr = c->qk_norm && !inf ? TAKE(N * KD) : NULL;
#undef TAKE
#undef TAKE16
#undef TAKEB
        if (pass == 0) {
            base = kn_alloc(m->kn, off);
            if (!base)
                return ty_err_set(err, TY_ENOMEM, "out of memory: %zu bytes of activations", off);
        }
    }
    m->acts = base;
    m->n_acts = off;
    m->B = B;
    m->T = T;
    m->ids = kn_alloc(m->kn, N * sizeof(int32_t));
    m->targets = kn_alloc(m->kn, N * sizeof(int32_t));
    m->pos = kn_alloc(m->kn, N * sizeof(int32_t));
    int32_t *pos = malloc(N * sizeof *pos);
    if (!m->ids || !m->targets || !m->pos || !pos) {
        free(pos);
        return ty_err_set(err, TY_ENOMEM, "out of memory for token buffers");
    }
    for (size_t i = 0; i < N; i++)
        pos[i] = (int32_t)(i % (size_t)T);
    kn_to_device(m->kn, m->pos, pos, N * sizeof *pos);
    free(pos);
    return 0;
}

void model_free_acts(model *m)
{
    kn_free(m->kn, m->acts);
    kn_free(m->kn, m->ids);
    kn_free(m->kn, m->targets);
    kn_free(m->kn, m->pos);
    free(m->A);
    m->acts = NULL;
    m->ids = m->targets = m->pos = NULL;
    m->A = NULL;
    m->n_acts = 0;
    m->B = m->T = 0;
}

/* ---- forward ----------------------------------------------------------- */

/* Activations are stored in m->dt by the ops that produce them (one
 * rounding each, kn_ops.h). Activation gradients are fp32 buffers of one
 * layer; with 16-bit storage each is rounded where it is produced, so the
 * values the next op reads are exactly what a 16-bit tensor would hold
 * (the reference's scheme). The norms', activations' and attention's
 * backwards do that rounding themselves (they read dout as dt holds it;
 * the norms store dx so too: kernels.h), so a gradient that only they
 * read next, or that a norm produces, takes no separate pass. No-op in
 * fp32. */
#define RND(x, n) kn_round(k, (x), (size_t)(n), m->dt)
/* RND for a gradient that only weight wi's backward GEMMs read next: none
 * needed when they read it through grad_in, whose conversion to dt rounds
 * it the same way (one pass saved); an adapter or a 4-bit base reads the
 * fp32 values, which are then rounded in place as everywhere else. */
#define RG(x, n, wi)                                                                               \
    do {                                                                                           \
        if (adapted(m) || m->t[(wi)].q4) RND((x), (n));                                            \
    } while (0)
/* A norm's weight as the kernels take it (Gemma: 1 + w, model_norm_w). */
#define NWT(i, n) model_norm_w(m, W(m, (i)), (n))

/* Gemma scales the embeddings by sqrt(hidden_size) as a tensor of the
 * hidden states' dtype: the factor rounded to the storage type. */
static float embed_scale(const model *m)
{
    float s = (float)sqrt((double)m->cfg.dim);
    uint32_t u;
    memcpy(&u, &s, sizeof u);
    if (m->dt == KN_BF16) {
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        memcpy(&s, &u, sizeof s);
    } else if (m->dt == KN_F16) {
        s = (float)(_Float16)s;
    }
    return s;
}

/* The residual adds are fused with the norm that reads their sum
 * (kn_add_layernorm_fwd / kn_add_rmsnorm_fwd: res stored in dt, rounded
 * once, then normalised, mean / rstd saved) wherever the norm follows in
 * the same pass: res2 with the MLP's ln2 (every architecture; Gemma's b is
 * its post-attention norm's output), and res3 with the next layer's ln1 or
 * the final norm, done by the caller of layer_fwd after the next layer's
 * weights are loaded. The recomputation in the backward (recompute mlp |
 * all) starts from the kept res2 / layer input and runs the norms alone:
 * on the CPU the fused ops are kn_add then the norm, the same bits; on
 * CUDA one kernel with the same arithmetic (kernels.table_typed,
 * engine.cli.recompute). */

/* out[N,M] = x[N,K] w^T + b in an inference model with 16-bit weights
 * (m->wdt): x rounded to wdt in place (every x here is an activation that
 * only this product and its siblings read), times rows [row0, row0 + M)
 * of weight wi's 16-bit copy (row0 < 0: all), fp32 accumulation and out. */
static void lin_w16(model *m, void *out, void *x, int wi, int row0, int bi, int N, int K, int M)
{
    size_t at = m->t[wi].off + (row0 >= 0 ? (size_t)row0 * K : 0);
    gemms(m, 1, 1);
    kn_round(m->kn, x, (size_t)N * K, m->wdt);
    kn_matmul16_fwd(m->kn, m->wdt, KN_F32, KN_F32, out, x,
                    (const char *)m->w16 + at * kn_dtype_size(m->wdt), W(m, bi), KN_F32, N, K, M);
}

/* A block linear layer of the forward: lin_fwd, or lin_w16 in an inference
 * model with 16-bit weights. */
static void lin(model *m, int l, int s, int row0, void *out, void *x, int wi, int bi, int N, int K,
                int M)
{
    if (m->w16)
        lin_w16(m, out, x, wi, row0, bi, N, K, M);
    else
        lin_fwd(m, l, s, row0, out, x, wi, bi, N, K, M);
}

/* The MLP's input side of layer l: ln2, fc (and up), act from res2. Split
 * out because recompute mlp|all runs it again in the backward. With xa the
 * forward's res2 = xa + m->tmp is formed here, fused with ln2. */
static void mlp_in_fwd(model *m, int l, int B, int T, const void *xa)
{
    kn_ctx *k = m->kn;
    const model_config *c = &m->cfg;
    int N = B * T, C = c->dim, F = c->ffn, gpt2 = c->arch == ARCH_GPT2;
    kn_dtype dt = m->dt;
    const layer_ix *L = &m->L[l];
    layer_acts *a = &m->A[l];
    if (gpt2) {
        /* act[N,F] = gelu(layernorm(res2) Wfc^T + bfc) */
        if (xa)
            kn_add_layernorm_fwd(k, dt, a->res2, a->ln2, a->ln2_mean, a->ln2_rstd, xa, m->tmp,
                                 W(m, L->ln2_w), W(m, L->ln2_b), N, C, c->norm_eps);
        else
            kn_layernorm_fwd(k, dt, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, W(m, L->ln2_w),
                             W(m, L->ln2_b), N, C, c->norm_eps);
        if (fused_gelu(m, L)) {
            gemms(m, dt != KN_F32, 1);
            kn_matmul_gelu_fwd(k, dt, dt, dt, a->act, a->fc, a->ln2, WL(m, L->fc_w), WL(m, L->fc_b),
                               dt, N, C, F);
        } else {
            lin(m, l, LS_FC, -1, a->fc, a->ln2, L->fc_w, L->fc_b, N, C, F);
            kn_gelu_fwd(k, dt, a->act, a->fc, (size_t)N * F);
        }
    } else {
        /* act[N,F] = silu(ln2 Wgate^T) * (ln2 Wup^T) */
        if (xa)
            kn_add_rmsnorm_fwd(k, dt, a->res2, a->ln2, a->ln2_rstd, xa, m->tmp, NWT(L->ln2_w, C), N,
                               C, c->norm_eps);
        else
            kn_rmsnorm_fwd(k, dt, a->ln2, a->ln2_rstd, a->res2, NWT(L->ln2_w, C), N, C,
                           c->norm_eps);
        if (c->fused) {
            /* Phi-3: gate and up from the row halves of gate_up_proj */
            lin(m, l, LS_FC, 0, a->fc, a->ln2, L->fc_w, -1, N, C, F);
            lin(m, l, LS_FC, F, a->up, a->ln2, L->fc_w, -1, N, C, F);
        } else {
            lin(m, l, LS_FC, -1, a->fc, a->ln2, L->fc_w, -1, N, C, F);
            lin(m, l, LS_UP, -1, a->up, a->ln2, L->up_w, -1, N, C, F);
        }
        if (c->gemma) /* GeGLU: gelu_tanh(gate) * up */
            kn_geglu_fwd(k, dt, a->act, a->fc, a->up, (size_t)N * F);
        else
            kn_swiglu_fwd(k, dt, a->act, a->fc, a->up, (size_t)N * F);
    }
}

/* atty[N, Hq*D] = causal attention of layer l's q over its k, v (a->q,
 * a->k, a->v; row strides ldq, ldkv; Hk kv heads), Gemma's scale, soft-cap
 * and window as given. Without a cache, over the B x T batch itself. With
 * one (B = 1), the T new rows sit at positions kv->len..: their k, v rows
 * are appended to layer l's cache rows [len, len + T) and q attends over
 * cache rows [0, len + T) (kn_attention_kv_fwd). */
static void attention(model *m, int l, int B, int T, int Hk, int ldq, int ldkv, float scale,
                      float cap, int window, const model_kv *kv)
{
    kn_ctx *k = m->kn;
    const model_config *c = &m->cfg;
    layer_acts *a = &m->A[l];
    int Hq = c->n_head, D = c->head_dim, KD = Hk * D;
    if (!kv) {
        kn_attention_fwd(k, m->dt, a->atty, a->lse, a->q, a->k, a->v, B, T, Hq, Hk, D, ldq, ldkv,
                         scale, cap, window);
        return;
    }
    /* cache rows of layer l: [cap, KD] fp32 (dt is fp32 with a cache) */
    float *kc = kv->k + (size_t)l * kv->cap * KD, *vc = kv->v + (size_t)l * kv->cap * KD;
    if (ldkv == KD) {
        kn_copy(k, kc + (size_t)kv->len * KD, a->k, (size_t)T * KD);
        kn_copy(k, vc + (size_t)kv->len * KD, a->v, (size_t)T * KD);
    } else { /* GPT-2: k, v are column blocks of the fused qkv rows */
        for (int t = 0; t < T; t++) {
            kn_copy(k, kc + (size_t)(kv->len + t) * KD, (float *)a->k + (size_t)t * ldkv, KD);
            kn_copy(k, vc + (size_t)(kv->len + t) * KD, (float *)a->v + (size_t)t * ldkv, KD);
        }
    }
    kn_attention_kv_fwd(k, KN_F32, a->atty, a->lse, a->q, kc, vc, 1, T, kv->len + T, Hq, Hk, D, ldq,
                        KD, scale, cap, window);
}

/* Layer l from its input x[N,C] up to res3; with recompute all, the
 * backward calls it again for the layer it is about to differentiate.
 * fused: the forward pass's form -- x is formed here as xa + m->tmp (the
 * previous layer's res2 and branch output; l > 0) fused with ln1, and the
 * last add (res3 = res2 + m->tmp) is left to the caller, which fuses it with
 * the next norm. kv: generation's cache (B = 1; NULL in training), the
 * positions of the T rows starting at kv->len (attention above). */
static void layer_fwd(model *m, int l, const void *x, int B, int T, int fused, const model_kv *kv)
{
    kn_ctx *k = m->kn;
    const model_config *c = &m->cfg;
    int N = B * T, C = c->dim, F = c->ffn, Hq = c->n_head, Hkv = c->n_kv_head, D = c->head_dim;
    int QD = Hq * D, KD = Hkv * D, gpt2 = c->arch == ARCH_GPT2;
    kn_dtype dt = m->dt;
    const layer_ix *L = &m->L[l];
    layer_acts *a = &m->A[l];
    const void *xa = fused && l ? m->A[l - 1].res2 : NULL; /* x = xa + tmp, fused with ln1 */
    if (gpt2) {
        /* ln1[N,C] = layernorm(x); qkv[N,3C] = ln1 Wattn^T + b */
        if (xa)
            kn_add_layernorm_fwd(k, dt, (void *)x, a->ln1, a->ln1_mean, a->ln1_rstd, xa, m->tmp,
                                 W(m, L->ln1_w), W(m, L->ln1_b), N, C, c->norm_eps);
        else
            kn_layernorm_fwd(k, dt, a->ln1, a->ln1_mean, a->ln1_rstd, x, W(m, L->ln1_w),
                             W(m, L->ln1_b), N, C, c->norm_eps);
        lin(m, l, LS_ATTN, -1, a->q, a->ln1, L->attn_w, L->attn_b, N, C, 3 * C);
        /* atty[N,C] = causal attention over heads of the fused rows */
        attention(m, l, B, T, Hq, 3 * C, 3 * C, 0.0f, 0.0f, 0, kv);
    } else {
        /* ln1[N,C] = rmsnorm(x); q[N,Hq*D], k/v[N,Hkv*D]; RoPE on q, k */
        if (xa)
            kn_add_rmsnorm_fwd(k, dt, (void *)x, a->ln1, a->ln1_rstd, xa, m->tmp, NWT(L->ln1_w, C),
                               N, C, c->norm_eps);
        else
            kn_rmsnorm_fwd(k, dt, a->ln1, a->ln1_rstd, x, NWT(L->ln1_w, C), N, C, c->norm_eps);
        void *qo = c->qk_norm ? a->qr : a->q, *ko = c->qk_norm ? a->kr : a->k;
        if (c->fused) {
            /* Phi-3: q, k, v from the row blocks of qkv_proj */
            lin(m, l, LS_ATTN, 0, qo, a->ln1, L->attn_w, -1, N, C, QD);
            lin(m, l, LS_ATTN, QD, ko, a->ln1, L->attn_w, -1, N, C, KD);
            lin(m, l, LS_ATTN, QD + KD, a->v, a->ln1, L->attn_w, -1, N, C, KD);
        } else {
            lin(m, l, LS_Q, -1, qo, a->ln1, L->q_w, L->q_b, N, C, QD);
            lin(m, l, LS_K, -1, ko, a->ln1, L->k_w, L->k_b, N, C, KD);
            lin(m, l, LS_V, -1, a->v, a->ln1, L->v_w, L->v_b, N, C, KD);
        }
        if (c->qk_norm) {
            /* Qwen3: q[N*Hq, D] = rmsnorm(qr) per head (k likewise), before RoPE */
            kn_rmsnorm_fwd(k, dt, a->q, a->qn_rstd, a->qr, NWT(L->qn_w, D), N * Hq, D, c->norm_eps);
            kn_rmsnorm_fwd(k, dt, a->k, a->kn_rstd, a->kr, NWT(L->kn_w, D), N * Hkv, D,
                           c->norm_eps);
        }
        int p0 = kv ? kv->len : 0; /* the rows' first position */
        model_rope_layer(m, l, dt, a->q, B, T, Hq, QD, p0, 0);
        model_rope_layer(m, l, dt, a->k, B, T, Hkv, KD, p0, 0);
        /* Gemma: query_pre_attn_scalar's scale, the score soft-cap, and the
         * sliding window on the layers layer_types names */
        attention(m, l, B, T, Hkv, QD, KD, c->attn_scale, c->attn_softcap,
                  hfconfig_sliding(c, l) ? c->window : 0, kv);
    }
    /* res2[N,C] = x + atty Wo^T + bo (Gemma: + its post_attention norm) */
    void *ob = c->gemma ? a->ao : m->tmp;
    lin(m, l, LS_O, -1, ob, a->atty, L->o_w, L->o_b, N, QD, C);
    if (c->gemma)
        kn_rmsnorm_fwd(k, dt, m->tmp, a->ao_rstd, a->ao, NWT(L->pan_w, C), N, C, c->norm_eps);
    mlp_in_fwd(m, l, B, T, x); /* res2 = x + tmp, fused with ln2 */
    /* res3[N,C] = res2 + act Wproj^T + bproj (Gemma: + post_feedforward norm) */
    void *mb = c->gemma ? a->mo : m->tmp;
    lin(m, l, LS_PROJ, -1, mb, a->act, L->proj_w, L->proj_b, N, F, C);
    if (c->gemma)
        kn_rmsnorm_fwd(k, dt, m->tmp, a->mo_rstd, a->mo, NWT(L->pfn_w, C), N, C, c->norm_eps);
    if (!fused) kn_add(k, dt, a->res3, a->res2, m->tmp, (size_t)N * C);
}

/* m->pos[0..n) = p0, p0 + 1, ..: the positions GPT-2's wpe reads. */
static void set_positions(model *m, int p0, int n)
{
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    if (!pos) {
        kn_fail(m->kn, TY_ENOMEM, "out of memory for %d positions", n);
        return;
    }
    for (int i = 0; i < n; i++)
        pos[i] = p0 + i;
    kn_to_device(m->kn, m->pos, pos, (size_t)n * sizeof *pos);
    free(pos);
}

/* Everything up to the head: m->lnf[N,C] for the B x T host inputs
 * (targets: host, or NULL when there is no loss). kv: generation's cache
 * (layer_fwd; B = 1): m->pos then holds the rows' positions kv->len... */
static void forward_hidden(model *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                           const model_kv *kv)
{
    kn_ctx *k = m->kn;
    const model_config *c = &m->cfg;
    int N = B * T, C = c->dim, gpt2 = c->arch == ARCH_GPT2;
    kn_dtype dt = m->dt;
    m->w1d_fresh = 0; /* the 16-bit weights may have changed since the last pass (W) */
    kn_to_device(k, m->ids, inputs, (size_t)N * sizeof(int32_t));
    if (targets) kn_to_device(k, m->targets, targets, (size_t)N * sizeof(int32_t));
    if (kv) set_positions(m, kv->len, T);

    /* encoded[N,C] = wte[ids] (+ wpe[t]): the tables in dt (16-bit runs
     * read their 16-bit weights: only the rows used, rounded once when
     * the position row is added) */
    const void *wte = dt == KN_F32 ? (const void *)W(m, m->wte) : W16(m, m->wte);
    kn_embedding_fwd(k, dt, m->encoded, m->ids, wte, N, C, 0);
    if (m->adapter.emb_fwd) { /* LoRA on the embedding: fp32, through dres in 16-bit runs */
        size_t nc = (size_t)N * C;
        float *e = dt == KN_F32 ? m->encoded : m->dres;
        if (dt != KN_F32) kn_convert(k, e, KN_F32, m->encoded, dt, nc);
        m->adapter.emb_fwd(m->adapter.state, e, m->ids, N);
        if (dt != KN_F32) kn_convert(k, m->encoded, dt, e, KN_F32, nc);
    }
    if (gpt2) {
        const void *wpe = dt == KN_F32 ? (const void *)W(m, m->wpe) : W16(m, m->wpe);
        kn_embedding_fwd(k, dt, m->encoded, m->pos, wpe, N, C, 1);
    }
    if (c->gemma) { /* x sqrt(hidden), rounded to dt: through dres (unused until the backward) */
        size_t nc = (size_t)N * C;
        kn_convert(k, m->dres, KN_F32, m->encoded, dt, nc);
        kn_scale(k, m->dres, nc, embed_scale(m));
        kn_convert(k, m->encoded, dt, m->dres, KN_F32, nc);
    }

    /* each layer's last residual add is fused with the next norm: layer
     * l + 1's ln1, or here the final norm */
    const void *x = m->encoded;
    for (int l = 0; l < c->n_layer; l++) {
        layer_fwd(m, l, x, B, T, 1, kv);
        x = m->A[l].res3;
    }
    /* lnf[N,C] = norm(x) (x = res2 + tmp of the last layer, fused) */
    const void *xa = c->n_layer ? m->A[c->n_layer - 1].res2 : NULL;
    if (gpt2 && xa)
        kn_add_layernorm_fwd(k, dt, (void *)x, m->lnf, m->lnf_mean, m->lnf_rstd, xa, m->tmp,
                             W(m, m->lnf_w), W(m, m->lnf_b), N, C, c->norm_eps);
    else if (gpt2)
        kn_layernorm_fwd(k, dt, m->lnf, m->lnf_mean, m->lnf_rstd, x, W(m, m->lnf_w), W(m, m->lnf_b),
                         N, C, c->norm_eps);
    else if (xa)
        kn_add_rmsnorm_fwd(k, dt, (void *)x, m->lnf, m->lnf_rstd, xa, m->tmp, NWT(m->lnf_w, C), N,
                           C, c->norm_eps);
    else
        kn_rmsnorm_fwd(k, dt, m->lnf, m->lnf_rstd, x, NWT(m->lnf_w, C), N, C, c->norm_eps);
}

/* The lm_head weight as the head's GEMMs read it: fp32, or in dt. */
static const void *head_w(model *m)
{
    return m->dt == KN_F32 ? (const void *)W(m, m->lm_head) : (const void *)W16(m, m->lm_head);
}

/* The head over rows [r, r + n) (n <= logit_rows): logits[n,V] =
 * lnf[r..] W_lm^T in dt, rows logit_ld apart (the device's padding). */
static void head_fwd(model *m, int r, int n)
{
    int C = m->cfg.dim;
    const void *x = AV(m, m->lnf, (size_t)r * C);
    gemms(m, m->dt != KN_F32, 1);
    kn_logits_fwd(m->kn, m->dt, m->logits, x, head_w(m), n, C, m->cfg.vocab, m->logit_ld);
}

/* Its backward from the chunk's dlogits (in m->logits, in dt: the
 * cross-entropy rounded them): dln[r..] = dlogits W_lm (dln zeroed by the
 * caller), dW_lm += dlogits^T lnf[r..] chunk after chunk. */
static void head_bwd(model *m, int r, int n)
{
    int C = m->cfg.dim;
    const void *x = AV(m, m->lnf, (size_t)r * C);
    float *dx = m->dln + (size_t)r * C;
    gemms(m, m->dt != KN_F32, 1 + (G(m, m->lm_head) != NULL));
    kn_logits_bwd(m->kn, m->dt, dx, G(m, m->lm_head), m->logits, x, head_w(m), n, C, m->cfg.vocab,
                  m->logit_ld);
}

/* The loss head over chunks of logit_rows rows: per chunk the lm_head
 * GEMM, the cross-entropy (losses[N] per row) and, when training, its
 * backward into dlogits and at once the two GEMMs back to dln[N,C] and
 * dW_lm, so the next chunk can reuse the logits. The rows' losses are
 * the same bits as one whole-N call (each row's CE is independent);
 * dW_lm sums the chunks in order. */
static void head_loss(model *m, float *losses, int N, int train, float scale, float softcap)
{
    kn_ctx *k = m->kn;
    int V = m->cfg.vocab, R = m->logit_rows, ld = m->logit_ld;
    if (train) kn_zero(k, m->dln, (size_t)N * m->cfg.dim);
    for (int r = 0; r < N; r += R) {
        int n = N - r < R ? N - r : R;
        head_fwd(m, r, n);
        if (!train) {
            kn_crossentropy_fwd(k, m->dt, losses + r, m->logits, m->targets + r, n, V, ld, softcap);
            continue;
        }
        /* losses and dlogits in one pass; dlogits overwrite the logits */
        kn_crossentropy_fwd_bwd(k, m->dt, losses ? losses + r : NULL, m->logits, m->logits,
                                m->targets + r, n, V, ld, scale, softcap);
        head_bwd(m, r, n);
    }
}

double model_forward(model *m, const int32_t *inputs, const int32_t *targets, int B, int T)
{
    int N = B * T;
    forward_hidden(m, inputs, targets, B, T, NULL);
    head_loss(m, m->losses, N, 0, 0.0f, m->cfg.final_softcap);
    return kn_sum(m->kn, m->losses, (size_t)N);
}

void model_forward_kv(model *m, const int32_t *ids, int n, const model_kv *kv, float *logits)
{
    kn_ctx *k = m->kn;
    int C = m->cfg.dim, V = m->cfg.vocab;
    forward_hidden(m, ids, NULL, 1, n, kv);
    /* logits[V] = lnf[n-1] W_lm^T (only the last row is sampled from) */
    float *x = (float *)m->lnf + (size_t)(n - 1) * C;
    if (m->w16)
        lin_w16(m, logits, x, m->lm_head, -1, -1, 1, C, V);
    else {
        gemms(m, 0, 1);
        kn_matmul_fwd(k, logits, x, W(m, m->lm_head), NULL, 1, C, V);
    }
    kn_softcap(k, logits, (size_t)V, m->cfg.final_softcap); /* Gemma 2; 0 = off */
}

int model_infer_weights(model *m, kn_dtype wdt, ty_err *err)
{
    if (wdt == m->wdt) return 0;
    if (wdt != KN_BF16 && wdt != KN_F16)
        return ty_err_set(err, TY_EINVAL, "inference weights can be fp32, bf16 or fp16");
    if (!m->params || m->dt != KN_F32)
        return ty_err_set(err, TY_EINVAL, "inference weights: the model has no fp32 parameters");
    size_t total = m->t[m->nt - 1].off + m->t[m->nt - 1].numel;
    kn_free(m->kn, m->w16);
    m->wdt = KN_F32;
    m->w16 = kn_alloc(m->kn, total * kn_dtype_size(wdt));
    if (!m->w16)
        return ty_err_set(err, TY_ENOMEM, "out of memory for %zu %s weights", total,
                          kn_dtype_name(wdt));
    /* All weights take the type, as transformers' model.to(dtype) does: the
     * fp32 parameters the norms, biases and embeddings read are rounded in
     * place (a no-op for a 16-bit checkpoint), then copied in 16 bits. */
    kn_round(m->kn, m->params, total, wdt);
    kn_convert(m->kn, m->w16, wdt, m->params, KN_F32, total);
    m->wdt = wdt;
    return kn_check(m->kn, err);
}

/* ---- backward ---------------------------------------------------------- */

/* Backward from dln = d(lnf) (head_loss left it there, dW_lm done); adds
 * into the gradients. */
static void backward_from_head(model *m, int B, int T)
{
    kn_ctx *k = m->kn;
    const model_config *c = &m->cfg;
    int N = B * T, C = c->dim, F = c->ffn, Hq = c->n_head, Hkv = c->n_kv_head, D = c->head_dim;
    int QD = Hq * D, KD = Hkv * D, gpt2 = c->arch == ARCH_GPT2;
    kn_dtype dt = m->dt;
    size_t NC = (size_t)N * C, NF = (size_t)N * F;

    const void *xL = c->n_layer ? m->A[c->n_layer - 1].res3 : m->encoded;
    /* dres[N,C] = d(final norm input): fp32 (dx32), or held in dt alone
     * (rg, res16), when the norms' backwards take it as their dx_dt */
    int r16 = res16(m);
    float *dx32 = r16 ? NULL : m->dres;
    void *rg = r16 ? (void *)m->dres : NULL;
    kn_zero(k, m->dres, r16 ? (NC * kn_dtype_size(dt) + 3) / 4 : NC);
    /* dres16: g16 where the norm backward that made dres also stored its
     * 16-bit copy for the next MLP projection's GEMMs (not with Gemma,
     * whose post-feedforward norm reads dres first); rg itself when held */
    void *dres16 = r16          ? rg
                   : c->n_layer ? copy16_for(m, m->L[c->n_layer - 1].proj_w, !c->gemma)
                                : NULL;
    if (gpt2)
        kn_layernorm_bwd(k, dt, dx32, dres16, G(m, m->lnf_w), G(m, m->lnf_b), m->dln, KN_F32, xL,
                         W(m, m->lnf_w), m->lnf_mean, m->lnf_rstd, N, C);
    else
        kn_rmsnorm_bwd(k, dt, dx32, dres16, G(m, m->lnf_w), m->dln, KN_F32, xL, NWT(m->lnf_w, C),
                       m->lnf_rstd, N, C);
    if (m->grads_done) m->grads_done(m->grads_done_ctx, m->t[m->lnf_w].off);

    for (int l = c->n_layer - 1; l >= 0; l--) {
        const layer_ix *L = &m->L[l];
        layer_acts *a = &m->A[l];
        const void *x = l ? m->A[l - 1].res3 : m->encoded;
        /* Activations that were not kept are computed again, by the same
         * calls on the same inputs: the same bits as the forward's. */
        if (m->recompute == MODEL_RECOMPUTE_ALL)
            layer_fwd(m, l, x, B, T, 0, NULL);
        else if (m->recompute == MODEL_RECOMPUTE_MLP)
            mlp_in_fwd(m, l, B, T, NULL);
        /* dres holds d(res3); the residual passes it to res2 unchanged.
         * MLP branch: dact[N,F] = dres Wproj; dWproj += dres^T act */
        /* GPT-2 fused (no adapter): dact is not formed; the fused op
         * below computes dfc = (dres Wproj) * gelu'(fc) and dbfc (the GELU
         * derivative in the product's epilogue on a GPU). */
        int fg = gpt2 && fused_gelu(m, L);
        const float *dmo = dx32;
        void *mo16 = dres16;
        if (c->gemma) {
            /* through the post_feedforward norm: dln = d(mo) */
            kn_zero(k, m->dln, NC);
            mo16 = copy16_for(m, L->proj_w, 1);
            kn_rmsnorm_bwd(k, dt, m->dln, mo16, G(m, L->pfn_w), m->dres, KN_F32, a->mo,
                           NWT(L->pfn_w, C), a->mo_rstd, N, C);
            dmo = m->dln;
        }
        /* d(mo) in dt once, for the proj's GEMMs and (fused) the dgelu's */
        const void *gmo = grad_made(m, L->proj_w, dmo, NC, mo16);
        /* the gated MLPs' dact in dt, for the activation's backward alone */
        kn_dtype act_dt = !gpt2 && grad16_only(m, L->proj_w) ? dt : KN_F32;
        lin_bwd_g_as(m, l, LS_PROJ, act_dt, fg ? NULL : m->dact, dmo, gmo, a->act, L->proj_w,
                     L->proj_b, N, F, C);
        /* dact is read as dt holds it by the activation's backward; dln =
         * d(ln2) is written by the first of the fc's (and up's) products;
         * ln2's backward, making d(res2), stores its copy for Wo's GEMMs */
        void *ao16 = r16 ? rg : copy16_for(m, L->o_w, !c->gemma);
        if (gpt2) {
            gemms(m, dt != KN_F32, fg);
            /* dln = d(ln2) in dt from c_fc's dX, for ln2's backward alone */
            kn_dtype ln2_dt = fg && grad16_only(m, L->fc_w) ? dt : KN_F32;
            if (fg) {
                /* dfc in dt as the epilogue writes it (and dbfc): the fc's
                 * GEMMs read it as it stands */
                kn_matmul_dgelu(k, dt, dt, dt, m->dfc, G(m, L->fc_b), gmo, WL(m, L->proj_w), a->fc,
                                N, F, C);
                lin_bwd_g_as(m, l, LS_FC, ln2_dt, m->dln, dt == KN_F32 ? m->dfc : NULL, m->dfc,
                             a->ln2, L->fc_w, -1, N, C, F);
            } else {
                kn_zero(k, m->dfc, NF);
                kn_gelu_bwd(k, dt, m->dfc, m->dact, a->fc, NF);
                RG(m->dfc, NF, L->fc_w);
                lin_bwd(m, l, LS_FC, -1, m->dln, 1, m->dfc, a->ln2, L->fc_w, L->fc_b, N, C, F);
            }
            kn_layernorm_bwd(k, dt, dx32, ao16, G(m, L->ln2_w), G(m, L->ln2_b), m->dln, ln2_dt,
                             a->res2, W(m, L->ln2_w), a->ln2_mean, a->ln2_rstd, N, C);
        } else {
            /* dfc, dup written; in a 16-bit step whose gate and up
             * products read no fp32 gradient (no adapter, no 4-bit base),
             * in dt in their own buffers: the GEMMs' inputs as grad_in
             * would have made them */
            int uw = c->fused ? L->fc_w : L->up_w;
            int g16 = grad16_only(m, L->fc_w) && grad16_only(m, uw);
            kn_dtype gdt = g16 ? dt : KN_F32;
            if (c->gemma)
                kn_geglu_bwd(k, dt, gdt, m->dfc, m->dup, m->dact, act_dt, a->fc, a->up, NF);
            else
                kn_swiglu_bwd(k, dt, gdt, m->dfc, m->dup, m->dact, act_dt, a->fc, a->up, NF);
            if (g16) {
                int s_up = c->fused ? LS_FC : LS_UP, up0 = c->fused ? F : -1;
                lin_bwd_g(m, l, LS_FC, c->fused ? 0 : -1, m->dln, 1, NULL, m->dfc, a->ln2, L->fc_w,
                          -1, N, C, F);
                lin_bwd_g(m, l, s_up, up0, m->dln, 0, NULL, m->dup, a->ln2, uw, -1, N, C, F);
            } else {
                RG(m->dfc, NF, L->fc_w);
                RG(m->dup, NF, uw);
                if (c->fused) {
                    lin_bwd(m, l, LS_FC, 0, m->dln, 1, m->dfc, a->ln2, L->fc_w, -1, N, C, F);
                    lin_bwd(m, l, LS_FC, F, m->dln, 0, m->dup, a->ln2, L->fc_w, -1, N, C, F);
                } else {
                    lin_bwd(m, l, LS_FC, -1, m->dln, 1, m->dfc, a->ln2, L->fc_w, -1, N, C, F);
                    lin_bwd(m, l, LS_UP, -1, m->dln, 0, m->dup, a->ln2, L->up_w, -1, N, C, F);
                }
            }
            kn_rmsnorm_bwd(k, dt, dx32, ao16, G(m, L->ln2_w), m->dln, KN_F32, a->res2,
                           NWT(L->ln2_w, C), a->ln2_rstd, N, C);
        }
        /* dres now holds d(res2). Attention branch: datty[N,QD] = dres Wo */
        const float *dao = dx32;
        if (c->gemma) {
            /* through the post_attention norm: dln = d(ao) */
            kn_zero(k, m->dln, NC);
            ao16 = copy16_for(m, L->o_w, 1);
            kn_rmsnorm_bwd(k, dt, m->dln, ao16, G(m, L->pan_w), m->dres, KN_F32, a->ao,
                           NWT(L->pan_w, C), a->ao_rstd, N, C);
            dao = m->dln;
        }
        /* datty is read by the attention backward alone, rounded as it
         * reads it: in a 16-bit step where one product makes it (no
         * adapter, no 4-bit base), that product stores it in dt */
        kn_dtype att_dt = grad16_only(m, L->o_w) ? dt : KN_F32;
        lin_bwd_g_as(m, l, LS_O, att_dt, m->datty, dao, grad_made(m, L->o_w, dao, NC, ao16),
                     a->atty, L->o_w, L->o_b, N, QD, C);
        /* dln = d(ln1): the first of the qkv products writes it */
        if (gpt2) {
            /* dq, dk, dv written whole (the three thirds of each row); in
             * a 16-bit step whose qkv product reads no fp32 gradient (no
             * adapter, no 4-bit base), in dt into g16: the GEMMs' input as
             * grad_in would have made it */
            int g16 = grad16_only(m, L->attn_w);
            void *gq = g16 ? m->g16 : (void *)m->dq;
            kn_attention_bwd(k, dt, g16 ? dt : KN_F32, gq, g16 ? AV(m, gq, C) : (void *)m->dk,
                             g16 ? AV(m, gq, 2 * (size_t)C) : (void *)m->dv, m->datty, att_dt,
                             a->atty, a->lse, a->q, a->k, a->v, B, T, Hq, Hq, D, 3 * C, 3 * C, 0.0f,
                             0.0f, 0);
            if (g16) {
                lin_bwd_g_dt(m, l, LS_ATTN, m->dln, m->g16, a->ln1, L->attn_w, L->attn_b, N, C,
                             3 * C); /* dln = d(ln1) in dt */
            } else {
                RG(m->dq, (size_t)N * 3 * C, L->attn_w);
                lin_bwd(m, l, LS_ATTN, -1, m->dln, 1, m->dq, a->ln1, L->attn_w, L->attn_b, N, C,
                        3 * C);
            }
            dres16 = r16 ? rg : l ? copy16_for(m, m->L[l - 1].proj_w, 1) : NULL;
            kn_layernorm_bwd(k, dt, dx32, dres16, G(m, L->ln1_w), G(m, L->ln1_b), m->dln,
                             g16 ? dt : KN_F32, x, W(m, L->ln1_w), a->ln1_mean, a->ln1_rstd, N, C);
        } else {
            /* dq, dk, dv; in a 16-bit step where only the q, k, v products
             * read them (no adapter, no 4-bit base, no per-head norm), in
             * dt into g16 ([N,QD], [N,KD], [N,KD] one after another) with
             * RoPE's backward in place there: each value rounded where
             * the fp32 path rounds it (RND, then grad_in after RoPE) */
            int wq = c->fused ? L->attn_w : L->q_w, wk = c->fused ? L->attn_w : L->k_w,
                wv = c->fused ? L->attn_w : L->v_w;
            int g16 = !c->qk_norm && grad16_only(m, wq) && grad16_only(m, wk) && grad16_only(m, wv);
            kn_dtype gdt = g16 ? dt : KN_F32;
            void *gq = g16 ? m->g16 : (void *)m->dq;
            void *gk = g16 ? AV(m, gq, (size_t)N * QD) : (void *)m->dk;
            void *gv = g16 ? AV(m, gk, (size_t)N * KD) : (void *)m->dv;
            kn_attention_bwd(k, dt, gdt, gq, gk, gv, m->datty, att_dt, a->atty, a->lse, a->q, a->k,
                             a->v, B, T, Hq, Hkv, D, QD, KD, c->attn_scale, c->attn_softcap,
                             hfconfig_sliding(c, l) ? c->window : 0);
            if (!g16) {
                RND(m->dq, (size_t)N * QD);
                RND(m->dk, (size_t)N * KD);
                RG(m->dv, (size_t)N * KD, wv);
            }
            model_rope_layer(m, l, gdt, gq, B, T, Hq, QD, 0, 1);
            model_rope_layer(m, l, gdt, gk, B, T, Hkv, KD, 0, 1);
            if (g16 && c->fused) {
                lin_bwd_g(m, l, LS_ATTN, 0, m->dln, 1, NULL, gq, a->ln1, wq, -1, N, C, QD);
                lin_bwd_g(m, l, LS_ATTN, QD, m->dln, 0, NULL, gk, a->ln1, wk, -1, N, C, KD);
                lin_bwd_g(m, l, LS_ATTN, QD + KD, m->dln, 0, NULL, gv, a->ln1, wv, -1, N, C, KD);
            } else if (g16) {
                lin_bwd_g(m, l, LS_Q, -1, m->dln, 1, NULL, gq, a->ln1, wq, L->q_b, N, C, QD);
                lin_bwd_g(m, l, LS_K, -1, m->dln, 0, NULL, gk, a->ln1, wk, L->k_b, N, C, KD);
                lin_bwd_g(m, l, LS_V, -1, m->dln, 0, NULL, gv, a->ln1, wv, L->v_b, N, C, KD);
            } else {
                if (!c->qk_norm) { /* the per-head norms read them rounded */
                    RG(m->dq, (size_t)N * QD, wq);
                    RG(m->dk, (size_t)N * KD, wk);
                }
                float *dqo = m->dq, *dko = m->dk;
                if (c->qk_norm) {
                    /* through Qwen3's per-head norms: dqr, dkr; dW of q_norm, k_norm */
                    kn_zero(k, m->dqr, (size_t)N * QD);
                    kn_zero(k, m->dkr, (size_t)N * KD);
                    kn_rmsnorm_bwd(k, dt, m->dqr, NULL, G(m, L->qn_w), m->dq, KN_F32, a->qr,
                                   NWT(L->qn_w, D), a->qn_rstd, N * Hq, D);
                    kn_rmsnorm_bwd(k, dt, m->dkr, NULL, G(m, L->kn_w), m->dk, KN_F32, a->kr,
                                   NWT(L->kn_w, D), a->kn_rstd, N * Hkv, D);
                    dqo = m->dqr;
                    dko = m->dkr;
                }
                if (c->fused) {
                    lin_bwd(m, l, LS_ATTN, 0, m->dln, 1, dqo, a->ln1, L->attn_w, -1, N, C, QD);
                    lin_bwd(m, l, LS_ATTN, QD, m->dln, 0, dko, a->ln1, L->attn_w, -1, N, C, KD);
                    lin_bwd(m, l, LS_ATTN, QD + KD, m->dln, 0, m->dv, a->ln1, L->attn_w, -1, N, C,
                            KD);
                } else {
                    lin_bwd(m, l, LS_Q, -1, m->dln, 1, dqo, a->ln1, L->q_w, L->q_b, N, C, QD);
                    lin_bwd(m, l, LS_K, -1, m->dln, 0, dko, a->ln1, L->k_w, L->k_b, N, C, KD);
                    lin_bwd(m, l, LS_V, -1, m->dln, 0, m->dv, a->ln1, L->v_w, L->v_b, N, C, KD);
                }
            }
            dres16 = r16 ? rg : l ? copy16_for(m, m->L[l - 1].proj_w, !c->gemma) : NULL;
            kn_rmsnorm_bwd(k, dt, dx32, dres16, G(m, L->ln1_w), m->dln, KN_F32, x, NWT(L->ln1_w, C),
                           a->ln1_rstd, N, C);
        }
        /* dres now holds d(x), the previous layer's res3 */
        if (m->grads_done) m->grads_done(m->grads_done_ctx, m->t[layer_first(m, l)].off);
    }
    /* Embeddings: dwte[ids] += dres (and dwpe[t] += dres) */
    float *gwte = G(m, m->wte), *gwpe = gpt2 ? G(m, m->wpe) : NULL;
    if (!gwte && !gwpe && !m->adapter.emb_bwd) return;      /* frozen: nothing to accumulate */
    if (c->gemma) kn_scale(k, m->dres, NC, embed_scale(m)); /* the sqrt(hidden) factor */
    float *demb = m->dres;
    if (r16) { /* held in dt: widened (exact) into dln, free by now */
        kn_convert(k, m->dln, KN_F32, rg, dt, NC);
        demb = m->dln;
    }
    if (m->adapter.emb_bwd) m->adapter.emb_bwd(m->adapter.state, demb, m->ids, N);
    if (gwte) kn_embedding_bwd(k, gwte, m->ids, demb, N, C);
    if (gwpe) kn_embedding_bwd(k, gwpe, m->pos, demb, N, C);
    if (m->grads_done) m->grads_done(m->grads_done_ctx, 0);
}

void model_forward_backward_into(model *m, const int32_t *inputs, const int32_t *targets, int B,
                                 int T, float scale, float *losses)
{
    forward_hidden(m, inputs, targets, B, T, NULL);
    head_loss(m, losses, B * T, 1, scale, m->cfg.final_softcap);
    backward_from_head(m, B, T);
}

double model_forward_backward(model *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                              float scale)
{
    int N = B * T;
    forward_hidden(m, inputs, targets, B, T, NULL);
    head_loss(m, m->losses, N, 1, scale, 0.0f);
    double sum = kn_sum(m->kn, m->losses, (size_t)N); /* before the backward reuses the arena */
    backward_from_head(m, B, T);
    return sum;
}
