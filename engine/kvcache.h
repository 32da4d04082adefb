/* kvcache.h — incremental (KV-cached) inference on a model.h model.
 *
 * Generation feeds the prompt once and then one token at a time; each call
 * computes only the new positions and attends over the keys and values of
 * every earlier position, kept per layer in the cache. The layer math is
 * the training forward's (model.c's layer_fwd): the same kn_* kernels on
 * the same weights, with RoPE at the absolute position (pos_offset) and
 * GPT-2's learned positions read at it. Only the attention over the cache
 * is not the training kernel (which is causal over T x T of one batch): it
 * is a small loop here over heads in parallel, on host memory, so this file
 * runs on the CPU backend only for now.
 *
 * The model must have no LoRA hooks attached: adapters are merged into the
 * weights first (lora_merge), which is what inference should do anyway.
 *
 * Weights: fp32 (the model's parameters, read in place), or after
 * kv_set_weights a bf16 / fp16 copy that every product reads instead — a
 * decoded token reads each weight matrix once, so 16 bits halve the bytes
 * per token. Then each product's input row is rounded to that type and the
 * products accumulate in fp32 (kn_matmul16), as transformers runs a 16-bit
 * checkpoint; norms, residuals, attention and the cache stay fp32. */
#ifndef TY_KVCACHE_H
#define TY_KVCACHE_H

#include <stdint.h>

#include "model.h"

typedef struct kv_cache {
    model *m;     /* borrowed */
    int cap;      /* positions the cache holds */
    int len;      /* positions filled */
    int nmax;     /* most tokens one kv_step may take */
    float *k, *v; /* [n_layer][cap][Hkv * D] */
    /* scratch for nmax rows */
    float *x, *h, *mean, *rstd, *q, *kk, *vv, *att, *tmp, *fc, *up, *act, *logits, *probs;
    float *qk_rstd; /* qk_norm: [nmax * n_head] */
    int32_t *ids, *pos;
    kn_dtype wdt; /* the products' weight type: KN_F32 (params) or w16's */
    void *w16;    /* 16-bit copy of the parameters, the table's layout; NULL in fp32 */
} kv_cache;

/* A cache for up to cap positions, taking up to nmax tokens per step. */
int kv_create(kv_cache *c, model *m, int cap, int nmax, ty_err *err);
void kv_free(kv_cache *c);
/* Products read weights of type wdt from now on: bf16 / fp16 round the
 * model's parameters to wdt in place (every weight in that type, as
 * model.to(dtype)) and make the 16-bit copy the products read (2 bytes a
 * parameter; the fp32 parameters stay for the norms, biases and
 * embeddings). Call after the weights are final (loaded, adapters merged). */
int kv_set_weights(kv_cache *c, kn_dtype wdt, ty_err *err);
/* Forgets every position (a new sequence). */
void kv_reset(kv_cache *c);
/* Runs ids[0..n) at positions len..len+n-1 and appends their keys and
 * values; returns the logits [vocab] of the last of them (valid until the
 * next call). n must be 1..nmax and len + n <= cap. */
const float *kv_step(kv_cache *c, const int32_t *ids, int n, ty_err *err);

#endif
