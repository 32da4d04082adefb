/* model.h — GPT-2 and Llama-family transformers on one contiguous buffer each.
 *
 * Following llm.c's train_gpt2.c: the parameters live in one buffer, the
 * gradients, AdamW's m and v in three more of the same layout, and every
 * activation the backward pass needs in one activation buffer; tensors are
 * views described by a table (name, shape, offset). Checkpoints write the
 * buffers tensor by tensor, gradient norms and clipping run over the whole
 * buffer, and a future all-reduce is one call. Model code calls kn_*
 * operations only; it never touches tensor elements itself.
 *
 * Tensor names are Hugging Face's, stored here without the family prefix
 * ("transformer." for GPT-2, "model." for Llama; lm_head has none). GPT-2's
 * Conv1D weights are [in, out] on disk and [out, in] here: transposed at load
 * and back at save, which is exact. */
#ifndef TY_MODEL_H
#define TY_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "hfconfig.h"
#include "kernels.h"
#include "linear.h"
#include "tyerr.h"

typedef enum { INIT_NORMAL = 0, INIT_ONES, INIT_ZEROS } model_init_kind;

/* Activation recomputation (hyperparameters.recompute): which activations
 * the backward computes again instead of keeping them from the forward.
 * MLP: ln2, fc/up and act of every layer; ALL: everything but each
 * layer's output. Same calls on the same inputs: identical results. */
typedef enum { MODEL_RECOMPUTE_NONE = 0, MODEL_RECOMPUTE_MLP, MODEL_RECOMPUTE_ALL } model_recompute;

typedef struct model_tensor {
    char name[96]; /* HF name without the family prefix */
    int ndim;
    int64_t shape[2];  /* engine layout ([out, in] for linear weights) */
    size_t off, numel; /* in floats, into each of the four buffers */
    int conv1d;        /* GPT-2 Conv1D: stored [in, out] on disk */
    int decay;         /* AdamW weight decay applies (>= 2-D tensors) */
    int q4;            /* kept out of the buffers (QLoRA): 1 + its index in m->base; 0 = none */
    /* A frozen model's tensor that is trained all the same (PEFT's bias and
     * modules_to_save, linear.h): its gradient buffer, owned by the adapter
     * (NULL: none, or the model's own grads). */
    float *xgrad;
    model_init_kind init;
    float init_std;
} model_tensor;

/* Per-layer tensor indices into the table; -1 where a family lacks one.
 * GPT-2: attn = c_attn (fused qkv), o = attn.c_proj, fc = mlp.c_fc,
 * proj = mlp.c_proj. Llama: q, k, v, o, gate, up, proj = down_proj; qn, kn =
 * Qwen3's q_norm / k_norm. */
typedef struct layer_ix {
    int ln1_w, ln1_b, attn_w, attn_b, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, qn_w, kn_w;
    int ln2_w, ln2_b, fc_w, fc_b, up_w, proj_w, proj_b;
    int pan_w, pfn_w; /* Gemma: post_attention / post_feedforward norms (ln2 = pre_feedforward) */
} layer_ix;

/* Per-layer saved activations (views into the activation buffer). The
 * `void *` ones are in the run's storage type m->dt (fp32, bf16, fp16);
 * per-row statistics are fp32. */
typedef struct layer_acts {
    void *ln1;
    float *ln1_mean, *ln1_rstd;
    void *q, *k, *v;          /* GPT-2: views into the fused qkv rows */
    void *qr, *kr;            /* qk_norm: q, k before their per-head RMSNorm */
    float *qn_rstd, *kn_rstd; /* qk_norm: one rstd per (row, head) */
    float *lse;               /* attention: log-sum-exp per (b, head, row) */
    void *atty;               /* attention output */
    void *res2, *ln2;
    float *ln2_mean, *ln2_rstd;
    void *fc, *up, *act; /* GPT-2: fc, -, gelu(fc); Llama: gate, up, swiglu */
    void *res3;
    /* Gemma's sandwich norms: the attention / MLP branch outputs before
     * their post-norms (dt), and those norms' rstd */
    void *ao, *mo;
    float *ao_rstd, *mo_rstd;
} layer_acts;

/* A KV cache as the forward reads and writes it (kvcache.h owns one):
 * per layer the keys and values of positions [0, len), fp32, laid out
 * [n_layer][cap][Hkv * D] (GPT-2: Hkv = n_head). */
typedef struct model_kv {
    float *k, *v;
    int cap, len;
} model_kv;

typedef struct model {
    model_config cfg;
    kn_ctx *kn; /* borrowed */
    int nt;
    model_tensor *t;
    size_t n_params;
    float *params, *grads, *m, *v;
    int wte, wpe, lnf_w, lnf_b, lm_head; /* lm_head == wte when tied */
    layer_ix *L;

    int B, T; /* activation capacity */
    model_recompute recompute;

    /* Storage precision (model_set_precision). KN_F32: everything as
     * above. KN_BF16 / KN_F16 (llm.c's scheme): `params` are the fp32
     * master weights that AdamW updates and checkpoints keep; the forward
     * and backward read p16 = round(params): matmul weights in 16 bits,
     * 1-D tensors widened into the fp32 scratch w1d (W() in model.c);
     * activations are stored in 16 bits (every op reads and writes them in
     * dt, kn_ops.h); activation gradients are fp32 buffers of one layer,
     * rounded to 16 bits where they are produced; parameter gradients and
     * AdamW moments stay fp32. */
    kn_dtype dt;
    void *p16;
    /* bf16 full fine-tuning: the fp32 masters are kept split, p16 (their
     * bf16 rounding, what the forward reads) plus plo, the low 16 bits
     * (kn_master_split), and `params` is NULL: AdamW updates both halves
     * (kn_adamw with KN_BF16), saving joins them. 4 bytes a parameter for
     * exact fp32 masters. fp16 (no such split) and frozen bases keep the
     * fp32 params and plo is NULL; a QLoRA base has p16 alone, loaded
     * straight into it (model_nf4_home). ZeRO-1 (zero.h) moves this rank's
     * range of the masters out and leaves params and plo NULL. */
    uint16_t *plo;
    /* Every 1-D tensor (norm weights, biases) of a 16-bit run widened to
     * fp32, packed: tensor i at w1d + w1d_at[i]; one kn_convert_spans of
     * w1d_spans (a span per tensor) fills it at the first W() of a forward
     * pass (w1d_fresh: 0 from the pass's start until then). */
    float *w1d;
    size_t w1d_n, *w1d_at;
    kn_span *w1d_spans;
    int w1d_ns, w1d_fresh;
    /* The activation arena (model_alloc_acts), n_acts bytes: activations
     * in dt, statistics and one layer's activation gradients in fp32. */
    char *acts;
    size_t n_acts;
    layer_acts *A;
    void *encoded, *lnf, *tmp; /* in dt */
    float *lnf_mean, *lnf_rstd, *losses;
    /* 16-bit runs with adapters or a 4-bit base: the fp32 views those
     * read and write (x widened, the product before its rounding). */
    float *xw, *ow;
    /* The head's logits for logit_rows rows at a time (in dt; the
     * dlogits are written over them): the lm_head GEMM, the cross-entropy
     * and the dlogits GEMMs run over chunks of rows, so the whole [N, V]
     * never exists (model_alloc_acts picks the rows; ce_rows > 0, set
     * before it, asks for that many: generate's logits dump asks for all).
     * Rows are logit_ld >= vocab elements apart (kn_logit_ld: CUDA pads
     * them to a multiple of 128; the columns past vocab are never read). */
    void *logits;
    int ce_rows, logit_rows, logit_ld;
    /* Set before model_alloc_acts for a forward-only model (generation):
     * no activation gradients, no logit chunk. */
    int inference;
    /* Inference with 16-bit weights (model_infer_weights): the block
     * products and the lm_head read w16, a copy of the parameters in wdt,
     * with their input rows rounded to wdt, fp32 out, as transformers
     * computes a 16-bit checkpoint; activations stay fp32 (dt KN_F32).
     * KN_F32 and NULL otherwise. */
    kn_dtype wdt;
    void *w16;
    float *dres, *dln, *datty, *dq, *dk, *dv, *dact, *dfc, *dup;
    /* 16-bit training: the activation gradient a backward GEMM reads,
     * in dt (exact: the gradients hold dt values), so dX and dW are 16-bit
     * products; [N, the widest linear output], at least a layer's dq, dk
     * and dv one after another. NULL in fp32. */
    void *g16;
    float *dqr, *dkr;             /* qk_norm: d(q, k before the norm) */
    int32_t *ids, *targets, *pos; /* kn_alloc'd, B*T each */

    /* LoRA (lora.h): the base weights are frozen, so grads, m and v are not
     * allocated (NULL), and the adapters attach through the hook (linear.h)
     * called after every block matmul; state NULL for full fine-tuning. */
    int frozen;
    linear_hook adapter;

    /* RoPE's inverse frequencies [head_dim/2] when they are not plain
     * theta's (Llama 3's scaling, cfg.rope_scaled); NULL otherwise. */
    float *inv_freq;
    /* Gemma: Gemma RMSNorm multiplies by 1 + w; nw is the scratch the
     * kernels read 1 + w from (refilled before each norm call), ones the
     * constant it is made with; [max(dim, head_dim)] each. NULL otherwise. */
    float *nw, *ones;
    /* QLoRA: created with MODEL_FROZEN_NF4, the n_q4 block linear weights
     * live outside `params`, in the store attached by qlora.c (linear.h). */
    int n_q4;
    linear_store base;
    /* Data parallel (dist_bucket.h): the backward calls grads_done(ctx,
     * from) each time the gradients from float `from` of the layout to its
     * end are complete for this micro-batch (after the final norm and
     * lm_head, after each layer, 0 after the embeddings). NULL: none. */
    void (*grads_done)(void *ctx, size_t from);
    void *grads_done_ctx;
    /* GEMMs the model has issued (forward, backward, head; not an
     * adapter's own), by the type of their two inputs: [0] fp32, [1] the
     * 16-bit type (model_gemm_counts). */
    size_t n_gemm[2];
} model;

/* Builds the tensor table for cfg and allocates the parameter, gradient and
 * optimizer buffers (zeroed). Takes ownership of cfg (it moves). */
int model_create(model *m, model_config *cfg, kn_ctx *kn, ty_err *err);
/* Same; frozen = 1 allocates the parameters only (no gradients or AdamW
 * state): the model is trained through adapters (lora.h). frozen =
 * MODEL_FROZEN_NF4 also keeps the block linear weights out of the buffer,
 * in a store attached before loading (linear.h; qlora.h's NF4). */
#define MODEL_FROZEN_NF4 2
int model_create_ex(model *m, model_config *cfg, kn_ctx *kn, int frozen, ty_err *err);
/* A MODEL_FROZEN_NF4 model's buffer for what stays unquantised, before
 * loading: fp32 parameters, or with a 16-bit dt the 16-bit copy alone
 * (model_set_precision now), which the load fills straight (model_load.h). */
int model_nf4_home(model *m, kn_dtype dt, ty_err *err);
void model_free(model *m);
/* linear.c: marks every block linear weight as kept out of the buffer
 * (n_q4, t[].q4) and lays the table out without them; returns the
 * buffer's size in floats. */
size_t model_linear_set_aside(model *m);

/* Random weights: normal(0, initializer_range) for weights and embeddings
 * (residual projections attn.c_proj / mlp.c_proj / o_proj / down_proj
 * scaled by 1/sqrt(2 n_layer)), norm weights 1, biases 0, drawn in table
 * order from splitmix64 + Box-Muller seeded by `seed`. */
int model_init_random(model *m, uint64_t seed, ty_err *err);

/* Loads weights from an HF model directory: model.safetensors or the shards
 * listed in model.safetensors.index.json. Missing, unexpected or mis-shaped
 * tensors are errors naming the tensor. */
int model_load_dir(model *m, const char *dir, ty_err *err);
/* Loads one safetensors file of HF-named tensors (e.g. a checkpoint's
 * model.safetensors) into the parameters, with the same checks. */
int model_load_file(model *m, const char *path, ty_err *err);
/* Writes the parameters as an HF model.safetensors (prefixed names, Conv1D
 * transposed back, tied lm_head omitted as transformers does). */
int model_save_file(model *m, const char *path, ty_err *err);
/* The same in another dtype (the export's export.dtype): the fp32 masters
 * rounded to nearest-even. Checkpoints always use model_save_file. */
int model_save_file_as(model *m, const char *path, kn_dtype dt, ty_err *err);
/* AdamW moments: "<hf name>.exp_avg" / ".exp_avg_sq", same layout. */
int model_save_optimizer(model *m, const char *path, ty_err *err);
int model_load_optimizer(model *m, const char *path, ty_err *err);

/* Sets the storage precision before model_alloc_acts: for bf16 / fp16
 * allocates the 16-bit parameters and the weight scratch. */
int model_set_precision(model *m, kn_dtype dt, ty_err *err);
/* Parameter i as AdamW updates it: the fp32 master (*pdt KN_F32, *plo
 * NULL) or the split bf16 master (KN_BF16, p16's hi and its low half). */
void *model_master(model *m, int i, kn_dtype *pdt, uint16_t **plo);
/* Refreshes the 16-bit parameters from the fp32 masters (after loading,
 * init, merge and every optimizer update). No-op in fp32. */
void model_sync_params(model *m);
/* Bytes of the activation arena (activations in dt, fp32 statistics and one layer's gradients). */
size_t model_act_bytes(const model *m);
/* Where the model's memory goes, in bytes (the start-up log's "memory:"
 * line, docs/benchmarks.md): fp32 parameters (the masters with 16-bit
 * storage), the 16-bit weight copy, gradients, AdamW m + v, activations
 * (the arena above), the fp32 scratch for 1-D weights. */
typedef struct model_mem {
    size_t params, p16, grads, moments, acts, wscratch;
} model_mem;
model_mem model_memory(const model *m);

/* Allocates activations for micro-batches of up to B rows of T tokens,
 * keeping per layer only what `recompute` does not recompute. */
int model_alloc_acts(model *m, int B, int T, model_recompute recompute, ty_err *err);
/* Frees the activation arena and token buffers (model_alloc_acts again
 * makes new ones). */
void model_free_acts(model *m);
/* Forward of n host token ids of one sequence at positions kv->len.. (n <=
 * the T of model_alloc_acts, B 1): the same per-layer forward as training,
 * RoPE and GPT-2's positions at those positions, each layer's new keys and
 * values appended to the cache and its attention over cache rows [0,
 * kv->len + n). Writes the logits [V] (fp32, device) of the last token,
 * final soft-cap applied; the caller advances kv->len. fp32 storage only
 * (dt KN_F32); no adapter hooks are expected (merge them first). */
void model_forward_kv(model *m, const int32_t *ids, int n, const model_kv *kv, float *logits);
/* Products read weights of type wdt from now on (inference only): bf16 /
 * fp16 round the parameters to wdt in place (every weight in that type,
 * as model.to(dtype)) and make the 16-bit copy the products read (2 bytes
 * a parameter; the fp32 parameters stay for the norms, biases and
 * embeddings). Call after the weights are final (loaded, adapters
 * merged). KN_F32 when already so is a no-op. */
int model_infer_weights(model *m, kn_dtype wdt, ty_err *err);
/* Forward pass on B x T host token ids and targets (-100 ignored); returns
 * the SUM of per-token cross-entropy over non-ignored targets (evaluation). */
double model_forward(model *m, const int32_t *inputs, const int32_t *targets, int B, int T);
/* One training micro-batch: forward, the fused cross-entropy forward and
 * backward (dlogits scaled by `scale`, 1 / non-ignored targets of the whole
 * optimizer step), and the backward, adding into m->grads (or the
 * adapters'). Returns the loss SUM as model_forward does. */
double model_forward_backward(model *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                              float scale);
/* The same, with the per-token losses left in the device buffer losses[B*T]
 * instead of summed: the trainer sums a whole step's at once, so the device
 * is read back once per optimizer step. */
void model_forward_backward_into(model *m, const int32_t *inputs, const int32_t *targets, int B,
                                 int T, float scale, float *losses);

/* The GEMMs issued since the model was created: out[0] with fp32 inputs,
 * out[1] with both inputs in the 16-bit storage type (tensor cores on a
 * GPU). A GEMM is one product: a backward's dx and dW count one each. */
void model_gemm_counts(const model *m, size_t out[2]);

/* RoPE on x [B, T, H, head_dim] (row stride ld) at positions pos_offset..,
 * forward or (bwd = 1) its transpose: plain theta or cfg's scaling. */
void model_rope(model *m, kn_dtype dt, void *x, int B, int T, int H, int ld, int pos_offset,
                int bwd);
/* The same for layer l: Gemma 3's sliding layers use rope_local_theta. */
void model_rope_layer(model *m, int l, kn_dtype dt, void *x, int B, int T, int H, int ld,
                      int pos_offset, int bwd);
/* Gemma: the weight a norm multiplies by, 1 + w (m->nw, valid until the
 * next call); other families: w itself. w is the norm tensor's data. */
const float *model_norm_w(model *m, const float *w, int n);

/* The HF name with the family prefix as transformers saves it. */
void model_hf_name(const model *m, const model_tensor *t, char *out, size_t n);

#endif
