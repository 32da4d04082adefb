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
 * fly, rounded to compute_dtype); LoRA adapters (lora.h) train on top. */
#ifndef TY_QLORA_H
#define TY_QLORA_H

#include <stddef.h>

#include "kernels.h"
#include "tyerr.h"

struct model;

typedef struct qlora_base {
    int n;            /* quantised tensors */
    kn_nf4 *w;        /* [n] device views, by model_tensor.q4 - 1 */
    void **buf;       /* [n] their device allocations */
    size_t bytes;     /* device bytes of all of them */
    int double_quant; /* qlora.double_quant */
    kn_dtype compute; /* qlora.compute_dtype: what the dequantised weights are rounded to */
} qlora_base;

/* Marks the block linear weights as quantised and lays the table out
 * without them; *floats receives the parameter buffer's size. */
int qlora_layout(struct model *m, size_t *floats, ty_err *err);
/* Quantises tensor idx from host fp32 values in the engine layout
 * ([out, in]) and uploads it. */
int qlora_store(struct model *m, int idx, const float *w, ty_err *err);
void qlora_free(struct model *m);

/* A tensor name that only a model quantised by another tool carries
 * (GPTQ / AWQ qweight, qzeros, scales, g_idx; bitsandbytes' absmax,
 * quant_map, quant_state): a message saying so, else NULL. */
const char *qlora_foreign_quant(const char *name);

#endif
