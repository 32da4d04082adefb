/* lora.h — LoRA adapters on a frozen model (method "lora"), PEFT-compatible.
 *
 * Each targeted linear layer W [out, in] gains y += (alpha / r) B A d(x),
 * A [r, in] (Kaiming-uniform, a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))),
 * B [out, r] (zeros), d = dropout. Targets are Hugging Face module names
 * matched as PEFT does, by suffix of the module path ("c_proj" takes both of
 * GPT-2's attention and MLP projections). The adapters live in their own
 * contiguous buffers (parameters, gradients, AdamW m and v), so the model
 * keeps no gradient or optimizer state at all. Tensor names are PEFT's:
 * base_model.model.<module path>.lora_A.weight / .lora_B.weight, in the same
 * [r, in] / [out, r] layout for GPT-2's Conv1D (PEFT's fan_in_fan_out only
 * changes how the merge is transposed). */
#ifndef TY_LORA_H
#define TY_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "linear.h"
#include "tyerr.h"

typedef struct lora_adapter {
    int layer, slot; /* linear.h's (block, linear_slot) */
    int in, out;
    size_t a_off, b_off; /* into the lora buffers (floats) */
    char module[112];    /* HF module path, e.g. model.layers.0.self_attn.q_proj */
    float *h, *xd;       /* saved A d(x) [N, r]; d(x) [N, in] when dropout is on */
    uint8_t *mask;       /* dropout mask [N, in] */
} lora_adapter;

typedef struct lora {
    kn_ctx *kn; /* borrowed */
    int r;
    double alpha;
    float scale, dropout;
    int n;
    lora_adapter *ad;
    int *slot_ix; /* [n_layer * LS_N]: adapter index or -1 */
    int n_layer;
    char targets[16][64]; /* the target names, for adapter_config.json */
    int n_targets;
    size_t n_params, n_buf;
    float *params, *grads, *m, *v;
    /* activations and scratch for micro-batches of up to N rows */
    size_t N;
    float *acts;
    uint8_t *masks;
    float *s_out, *s_dh, *s_dx;
    int training;            /* dropout on (training forward) or off (eval) */
    uint64_t seed, rng_step; /* dropout stream: (seed, rng_step, adapter) */
} lora;

/* Builds adapters for targets (NULL / 0 targets: PEFT's defaults, c_attn for
 * GPT-2, q_proj + v_proj for Llama-family models, qkv_proj for Phi-3) and
 * allocates the
 * buffers. A target matching no module, or r < 1, is TY_EINVAL. */
int lora_create(lora *l, const struct model *m, int r, double alpha, double dropout,
                char *const *targets, int n_targets, ty_err *err);
void lora_free(lora *l);
/* PEFT's init: A uniform from splitmix64(seed), B zero. */
void lora_init(lora *l, uint64_t seed);
int lora_alloc_acts(lora *l, int B, int T, ty_err *err);
/* Installs the adapters as m's linear hook (linear.h): from then on every
 * forward and backward of m runs them. model_set_linear_hook(m, NULL)
 * detaches. */
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

/* PEFT adapter_model.safetensors (only the adapters). */
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
