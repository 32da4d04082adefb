/* qlora.h — the frozen 4-bit base of method "qlora" (QLoRA, Dettmers et al.).
 *
 * Every linear layer of every transformer block (q/k/v/o, gate/up/down;
 * GPT-2's c_attn, c_proj, c_fc) is held as NF4 in bitsandbytes' format
 * (nf4.h); embeddings, norms, biases and lm_head stay in the model's
 * parameter buffer in the run's precision. The quantised tensors take no
 * room there: model_create_ex(MODEL_FROZEN_NF4) lays the buffer out
 * without them, and each is quantised as it is loaded (or drawn by
 * model.init), so the full-precision weights never exist all at once.
 * The model's matmuls on them go to kn_nf4_matmul_* (dequantise on the
 * fly, rounded to compute_dtype); in a 16-bit run whose type is
 * compute_dtype the weight is dequantised into a 16-bit scratch instead
 * and multiplied by the 16-bit activations (kn_matmul16_*: a GPU's 16-bit
 * tensor cores, as bitsandbytes' matmul_4bit runs). LoRA adapters
 * (lora.h) train on top. */
#ifndef TY_QLORA_H
#define TY_QLORA_H

#include <stddef.h>

#include "kernels.h"
#include "linear.h"
#include "tyerr.h"

typedef struct qlora_base {
    kn_ctx *kn;       /* borrowed from the model */
    int n;            /* quantised tensors */
    kn_nf4 *w;        /* [n] device views, by model_tensor.q4 - 1 */
    void **buf;       /* [n] their device allocations */
    size_t bytes;     /* device bytes of all of them */
    int double_quant; /* qlora.double_quant */
    kn_dtype compute; /* qlora.compute_dtype: what the dequantised weights are rounded to */
    struct model *m;  /* the model it is attached to (linear.h) */
    size_t largest;   /* elements of the largest weight */
    void *w16;        /* one weight dequantised in compute (16-bit runs), largest long */
} qlora_base;

/* Attaches an NF4 base as m's linear store (linear.h): m was created with
 * MODEL_FROZEN_NF4 and is not loaded yet. *out stays valid until
 * model_free(m), which frees it. */
int qlora_attach(struct model *m, int double_quant, kn_dtype compute, qlora_base **out,
                 ty_err *err);

#endif
