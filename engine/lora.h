/* lora.h — LoRA adapters on a frozen model (method "lora"), PEFT-compatible.
 *
 * Each targeted linear layer W [out, in] gains y += s B A d(x), A [r, in]
 * (Kaiming-uniform, a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))), B [out, r]
 * (zeros), d = dropout, s = alpha / r (alpha / sqrt(r) with rsLoRA). r and
 * alpha may differ per module (rank_pattern, alpha_pattern). Targets are
 * Hugging Face module names matched as PEFT does (peftcfg.h): by suffix of
 * the module path ("c_proj" takes both of GPT-2's attention and MLP
 * projections), or a regex on the whole path. The adapters live in their own
 * contiguous buffers (parameters, gradients, AdamW m and v), so the model
 * keeps no gradient or optimizer state at all. Tensor names are PEFT's:
 * base_model.model.<module path>.lora_A.weight / .lora_B.weight, in the same
 * [r, in] / [out, r] layout for GPT-2's Conv1D (PEFT's fan_in_fan_out only
 * changes how the merge is transposed).
 *
 * The token embedding (embed_tokens, GPT-2's wte) is a target too, as
 * PEFT's lora.Embedding: E[ids] += s (A^T[ids]) B^T with A [r, vocab]
 * (zeros at init) and B [dim, r] (N(0, 1) at init), no dropout, saved as
 * <module>.lora_embedding_A / .lora_embedding_B (no ".weight"). A is kept
 * here transposed, [vocab, r], so the forward is a row gather; the files
 * hold PEFT's layout. The adapter adds to the input lookup only: a tied
 * output head keeps the frozen shared weights (as PEFT's forward does),
 * while the merge (lora_merge, PEFT's merge_and_unload) changes the one
 * shared tensor, head included.
 *
 * DoRA (use_dora, PEFT's DoraLinearLayer) on a linear target adds a
 * magnitude vector mag [out] (saved as <module>.lora_magnitude_vector;
 * init: the row norms of W) and computes, with the row norm
 * n = ||W + s B A|| taken as a constant (detached, as PEFT does) and
 * g = mag / n:  y = W x + b + (g - 1) (W x) + g s B A x, which is
 * g (W + s B A) x + b; with dropout d in training the two W x terms of
 * the DoRA share read d(x), as PEFT's. The merge is W <- g (W + s B A). */
#ifndef TY_LORA_H
#define TY_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "linear.h"
#include "peftcfg.h"
#include "tyerr.h"

typedef struct lora_adapter {
    int layer, slot; /* linear.h's (block, linear_slot); -1, -1 for the embedding */
    int emb;         /* the token embedding: in = vocab, A stored [in, r] */
    int in, out;
    int r;               /* this module's rank (rank_pattern, else r) */
    float scale;         /* alpha / r or alpha / sqrt(r), alpha_pattern's alpha */
    size_t a_off, b_off; /* into the lora buffers (floats) */
    char module[112];    /* HF module path, e.g. model.layers.0.self_attn.q_proj */
    float *h, *xd;       /* saved A d(x) [N, r]; d(x) [N, in] when dropout is on */
    uint8_t *mask;       /* dropout mask [N, in] */
    /* DoRA: the magnitude at m_off in the buffers; the base weight and
     * bias (fp32, the model's); per micro-batch g = mag / n and n [out],
     * and z = W d(x) + s B A d(x) [N, out] for the magnitude's gradient */
    int dora;
    size_t m_off;
    const float *w, *bias;
    float *g, *norm, *z;
} lora_adapter;

/* A tensor of the model itself that trains beside the adapters (a bias
 * under lora.bias): its values stay in the model's parameters, its
 * gradient and AdamW moments are in the adapters' buffers at `off`, so
 * zeroing, clipping and reducing the adapters' gradients takes them in. */
typedef struct lora_extra {
    int t;          /* the model's tensor index (linear.h) */
    char name[200]; /* PEFT's name in adapter_model.safetensors */
    int ndim;
    int64_t shape[2];
    size_t numel, off;
    int decay;    /* AdamW decays it (>= 2-D), as it would the model's own */
    int frozen;   /* in the adapter file only: PEFT's copy of a targeted
                   * embedding's base weights (no gradient, no optimizer
                   * state, may be absent when loading); after the others */
    float *param; /* the model's fp32 values (device) */
} lora_extra;

typedef struct lora {
    kn_ctx *kn;   /* borrowed */
    lora_cfg cfg; /* what the adapters are (written back as adapter_config.json) */
    int r;        /* the largest rank: sizes the shared scratch */
    float dropout;
    int n;
    lora_adapter *ad;
    int *slot_ix;  /* [n_layer * LS_N]: adapter index or -1 */
    lora_extra *x; /* the model's own tensors trained too (lora.bias) */
    int n_x, n_frozen;
    int emb; /* the embedding's adapter index, or -1 */
    int n_layer;
    size_t n_params, n_buf;
    float *params, *grads, *m, *v;
    /* activations and scratch for micro-batches of up to N rows */
    size_t N;
    float *acts;
    uint8_t *masks;
    float *s_out, *s_dh, *s_dx;
    float *s_d, *s_y;        /* DoRA: B A [out, in]; W d(x) or the base part's dout [N, out] */
    int training;            /* dropout on (training forward) or off (eval) */
    uint64_t seed, rng_step; /* dropout stream: (seed, rng_step, adapter) */
} lora;

/* Builds the adapters cfg selects (no target_modules: PEFT's defaults,
 * c_attn for GPT-2, q_proj + v_proj for Llama-family models, qkv_proj for
 * Phi-3) and allocates the buffers. A listed target matching no module, a
 * regex matching none, or r < 1, is TY_EINVAL. */
int lora_create(lora *l, const struct model *m, const lora_cfg *cfg, ty_err *err);
/* The spec's adapters: its r, alpha, dropout, use_rslora and targets. */
void lora_cfg_from_spec(lora_cfg *c, int r, double alpha, double dropout, int use_rslora,
                        char *const *targets, int n_targets);
void lora_free(lora *l);
/* PEFT's init: A uniform from splitmix64(seed), B zero. */
void lora_init(lora *l, uint64_t seed);
int lora_alloc_acts(lora *l, int B, int T, ty_err *err);
/* Installs the adapters as m's linear hook (linear.h): from then on every
 * forward and backward of m runs them, and the backward adds the extra
 * tensors' gradients into the adapters' buffer. model_set_linear_hook(m,
 * NULL) detaches. */
void lora_attach(lora *l, struct model *m);

/* After the base layer's out[N, out] = x W^T + b: out += scale B A d(x). */
void lora_fwd(lora *l, int layer, int slot, float *out, const float *x, int N);
/* Given dout of that layer: dx[N, in] += its LoRA part; adds to dA, dB. */
void lora_bwd(lora *l, int layer, int slot, float *dx, const float *dout, const float *x, int N);
/* The same for a fused weight used by row blocks (Phi-3's qkv_proj and
 * gate_up_proj, whose blocks feed separate buffers): the block's output
 * out[N, rows] += scale (d(x) A^T) B[row0 : row0 + rows]^T. Blocks are
 * called in row order, the first (row0 = 0) computing A d(x) for all of
 * them; in the backward they add into one dh = sum of dout_block B_block,
 * and the last block (row0 + rows = out) turns it into dA and dx. Exactly
 * PEFT's one adapter on the fused module. */
void lora_fwd_part(lora *l, int layer, int slot, float *out, const float *x, int N, int row0,
                   int rows);
void lora_bwd_part(lora *l, int layer, int slot, float *dx, const float *dout, const float *x,
                   int N, int row0, int rows);

/* PEFT adapter_model.safetensors (the adapters and the trained biases;
 * after lora_load the model's 16-bit copy needs model_sync_params). */
int lora_save(lora *l, const char *path, ty_err *err);
/* Loads path (adapter_model.safetensors names, shapes must match exactly). */
int lora_load(lora *l, const char *path, ty_err *err);
int lora_save_optimizer(lora *l, const char *path, ty_err *err);
int lora_load_optimizer(lora *l, const char *path, ty_err *err);
/* adapter_config.json for PEFT. */
int lora_write_config(const lora *l, const struct model *m, const char *base_model,
                      const char *path, ty_err *err);
/* W += scale B A on every target, in the model's parameters (for export). */
int lora_merge(lora *l, struct model *m, ty_err *err);

#endif
