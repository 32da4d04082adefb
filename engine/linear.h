/* linear.h — a block's linear layers as the model shows them to adapters.
 *
 * The model owns its linear layers; something that trains on top of a
 * frozen model (LoRA, lora.c) learns their shapes and module names from
 * model_linear() and attaches through one hook the model calls after each
 * base matmul of a block (forward) and after its backward. So model.c
 * knows nothing of LoRA and lora.c nothing of the tensor table: this
 * header is all they share. A frozen base that keeps the block linear
 * weights outside the parameter buffer (QLoRA's NF4, qlora.c) is the
 * other hook: the model hands it each such weight as it is loaded or
 * drawn, and sends its matmuls there. The functions below are the
 * model's side (linear.c). */
#ifndef TY_LINEAR_H
#define TY_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "hfconfig.h"
#include "kernels.h"
#include "tyerr.h"

struct model;

/* The linear layers of a block. GPT-2: ATTN = c_attn (fused qkv), O =
 * attn.c_proj, FC = mlp.c_fc, PROJ = mlp.c_proj. Llama: Q, K, V, O, FC =
 * gate_proj, UP, PROJ = down_proj. Phi-3: ATTN = qkv_proj, FC =
 * gate_up_proj (fused), O, PROJ. */
typedef enum { LS_ATTN = 0, LS_Q, LS_K, LS_V, LS_O, LS_FC, LS_UP, LS_PROJ, LS_N } linear_slot;

typedef struct linear_desc {
    int in, out;      /* the weight W is [out, in] in the engine's layout */
    char module[112]; /* HF module path, e.g. model.layers.0.self_attn.q_proj */
} linear_desc;

/* Called by the model right after the base layer: the forward with its
 * input x[N, in] and output rows [row0, row0 + rows) of out (out holds
 * only those rows, [N, rows]); the backward with that block's dout and
 * the dx[N, in] to add into. A layer computed whole has row0 = 0, rows =
 * out; a fused weight whose row blocks feed separate buffers (Phi-3) is
 * called block by block in row order, forward and backward. */
typedef struct linear_hook {
    void *state; /* NULL: nothing attached */
    void (*fwd)(void *state, int layer, int slot, float *out, const float *x, int N, int row0,
                int rows);
    void (*bwd)(void *state, int layer, int slot, float *dx, const float *dout, const float *x,
                int N, int row0, int rows);
    /* The token embedding (NULL: not adapted). emb_fwd adds the adapter's
     * share into out[N, dim] (fp32) right after the lookup of ids[N] (on
     * the device), before position embeddings or any scaling; emb_bwd gets
     * that out's gradient. */
    void (*emb_fwd)(void *state, float *out, const int32_t *ids, int N);
    void (*emb_bwd)(void *state, const float *dout, const int32_t *ids, int N);
} linear_hook;

/* A weight handed to a store, read a slice at a time: elements [e0, e0 +
 * n) of it ([out, in] order) as host fp32 into out. The loader reads them
 * from the file (so the whole tensor is never staged in fp32). */
typedef struct linear_src {
    void *ctx;
    int (*read)(void *ctx, size_t e0, size_t n, float *out, ty_err *err);
} linear_src;

/* Where the block linear weights live when the model keeps them out of
 * its buffer (created with MODEL_FROZEN_NF4): q = 0 .. n_stored - 1 in
 * layer and slot order. put receives each (numel elements, from src)
 * under its HF name when it is loaded or drawn; fwd computes out[N, M] = x[N, K]
 * W^T + b, bwd adds dout W into dx (the weight is frozen), W being the
 * stored weight from its element `first` on (0; a fused weight's row
 * block row0 starts at row0 * K); free runs at model_free. fwd16 / bwd16
 * are the same products for a run whose activations are in dt16 (bf16,
 * fp16; KN_F32 where the store has none): x and dout come in dt16 as the
 * run holds them, out and dx stay fp32. The model sends a 16-bit run's
 * matmuls there when its type is dt16, to fwd / bwd (x, dout widened)
 * otherwise. */
typedef struct linear_store {
    void *state; /* NULL: nothing attached */
    int (*put)(void *state, int q, const char *name, size_t numel, const linear_src *src,
               ty_err *err);
    void (*fwd)(void *state, int q, size_t first, float *out, const float *x, const float *b, int N,
                int K, int M);
    void (*bwd)(void *state, int q, size_t first, float *dx, const float *dout, int N, int K,
                int M);
    void (*free)(void *state);
    kn_dtype dt16;
    void (*fwd16)(void *state, int q, size_t first, float *out, const void *x, const float *b,
                  int N, int K, int M);
    void (*bwd16)(void *state, int q, size_t first, float *dx, const void *dout, int N, int K,
                  int M);
} linear_store;

/* Slot `slot` of block `layer`: fills *d and returns 1, or 0 where the
 * model's family has no such layer. */
int model_linear(const struct model *m, int layer, int slot, linear_desc *d);
/* The input token embedding as a layer: in = vocabulary size, out = the
 * hidden size, its HF module path (model.embed_tokens, transformer.wte).
 * Returns its tensor index (model_tensor_*: tied says whether the output
 * head shares it). */
int model_embedding(const struct model *m, linear_desc *d);
/* That layer's fp32 weights on the device ([out, in]; for a merge). */
float *model_linear_weight(struct model *m, int layer, int slot);
/* Attaches h (copied); NULL detaches. */
void model_set_linear_hook(struct model *m, const linear_hook *h);
/* How many weights the model keeps out of its buffer (0 unless created
 * with MODEL_FROZEN_NF4), and attaching their store (copied; before
 * loading or model_init_random). */
int model_linear_n_stored(const struct model *m);
void model_set_linear_store(struct model *m, const linear_store *s);
/* Every tensor of the model, for an adapter that trains some of a frozen
 * model's own tensors as well (PEFT's bias and modules_to_save): the
 * tensor's full HF name and shape (engine layout), its fp32 parameters on
 * the device (NULL where the model keeps none: a QLoRA base), and the
 * gradient buffer the backward adds into from then on. */
typedef struct model_tensor_desc {
    char name[160]; /* e.g. transformer.h.0.ln_1.bias */
    int ndim;
    int64_t shape[2]; /* shape[1] = 1 for a 1-D tensor */
    size_t numel;
    int decay;  /* AdamW weight decay applies (>= 2-D) */
    int conv1d; /* GPT-2 Conv1D weight: [in, out] on disk */
    int tied;   /* the input embedding that is also the output head */
} model_tensor_desc;
int model_n_tensors(const struct model *m);
void model_tensor_describe(const struct model *m, int i, model_tensor_desc *d);
float *model_tensor_param(const struct model *m, int i);
void model_tensor_set_grad(struct model *m, int i, float *g);
/* The tensor index of slot `slot`'s bias in block `layer`, or -1. */
int model_linear_bias(const struct model *m, int layer, int slot);

/* The model's configuration and kernel context (borrowed). */
const model_config *model_linear_config(const struct model *m);
/* The type its activations are held in (KN_F32 until model_set_precision
 * or model_nf4_home makes it 16-bit). */
kn_dtype model_linear_dtype(const struct model *m);
kn_ctx *model_linear_kn(const struct model *m);

#endif
