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
 * weights first (lora_merge), which is what inference should do anyway. */
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
} kv_cache;

/* A cache for up to cap positions, taking up to nmax tokens per step. */
int kv_create(kv_cache *c, model *m, int cap, int nmax, ty_err *err);
void kv_free(kv_cache *c);
/* Forgets every position (a new sequence). */
void kv_reset(kv_cache *c);
/* Runs ids[0..n) at positions len..len+n-1 and appends their keys and
 * values; returns the logits [vocab] of the last of them (valid until the
 * next call). n must be 1..nmax and len + n <= cap. */
const float *kv_step(kv_cache *c, const int32_t *ids, int n, ty_err *err);

#endif
