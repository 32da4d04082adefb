/* kvcache.h — incremental (KV-cached) inference on a model.h model.
 *
 * Generation feeds the prompt once and then one token at a time; each call
 * computes only the new positions and attends over the keys and values of
 * every earlier position, kept per layer in the cache. The forward is the
 * training forward itself (model_forward_kv: model.c's layer_fwd with the
 * cache as the attention's input and output), so every family runs the
 * same per-layer code in training and in generation; this file owns the
 * cache's memory and its bookkeeping (positions filled, capacity).
 *
 * The model must have no LoRA hooks attached: adapters are merged into the
 * weights first (lora_merge), which is what inference should do anyway.
 * kv_create takes the model's activation arena for itself (forward only,
 * one sequence of up to nmax tokens a step); model_alloc_acts makes a
 * training arena again.
 *
 * Weights: fp32 (the model's parameters, read in place), or after
 * kv_set_weights a bf16 / fp16 copy that every product reads instead — a
 * decoded token reads each weight matrix once, so 16 bits halve the bytes
 * per token. Then each product's input row is rounded to that type and the
 * products accumulate in fp32 (model_infer_weights), as transformers runs a
 * 16-bit checkpoint; norms, residuals, attention and the cache stay fp32. */
#ifndef TY_KVCACHE_H
#define TY_KVCACHE_H

#include <stdint.h>

#include "model.h"

typedef struct kv_cache {
    model *m;      /* borrowed */
    model_kv kv;   /* keys, values; kv.cap positions held, kv.len filled */
    int nmax;      /* most tokens one kv_step may take */
    float *logits; /* [vocab], the last step's last row */
} kv_cache;

/* A cache for up to cap positions, taking up to nmax tokens per step. */
int kv_create(kv_cache *c, model *m, int cap, int nmax, ty_err *err);
void kv_free(kv_cache *c);
/* Products read weights of type wdt from now on (model_infer_weights):
 * bf16 / fp16 round the model's parameters to wdt in place. Call after the
 * weights are final (loaded, adapters merged). */
int kv_set_weights(kv_cache *c, kn_dtype wdt, ty_err *err);
/* Forgets every position (a new sequence). */
void kv_reset(kv_cache *c);
/* Runs ids[0..n) at positions len..len+n-1 and appends their keys and
 * values; returns the logits [vocab] of the last of them (valid until the
 * next call). n must be 1..nmax and len + n <= cap. */
const float *kv_step(kv_cache *c, const int32_t *ids, int n, ty_err *err);

#endif
