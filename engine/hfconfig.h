/* hfconfig.h — the model architecture, read from a Hugging Face config.json.
 *
 * Two families: GPT-2 (model_type "gpt2") and Llama ("llama", "mistral",
 * "qwen2", "qwen3" — Qwen3 adds an RMSNorm over each head's q and k before
 * RoPE, `qk_norm`; "phi3" — q, k, v and gate, up fused into one weight
 * each, `fused`; "gemma2" and "gemma3_text" — `gemma`, below). Missing fields take the transformers class defaults, so a short
 * `model.init` object in a job spec describes a model the same way
 * `GPT2Config(...)` / `LlamaConfig(...)` would. Settings the engine cannot
 * reproduce exactly (RoPE scalings other than Llama 3's, other activations,
 * sliding windows that bite) are errors rather than silently different numerics. */
#ifndef TY_HFCONFIG_H
#define TY_HFCONFIG_H

#include <jansson.h>
#include <stdint.h>
#include "tyerr.h"

typedef enum { ARCH_GPT2 = 0, ARCH_LLAMA } model_arch;

typedef struct model_config {
    model_arch arch;
    /* "gpt2" | "llama" | "mistral" | "qwen2" | "qwen3" | "phi3" | "gemma2" | "gemma3_text" */
    char model_type[16];
    int vocab; /* vocab_size */
    int dim;   /* n_embd / hidden_size */
    int n_layer;
    int n_head;
    int n_kv_head; /* == n_head for GPT-2 */
    int head_dim;
    int ffn;            /* n_inner (4*dim) / intermediate_size */
    int max_pos;        /* n_positions / max_position_embeddings */
    int sliding_window; /* mistral; 0 = none */
    float norm_eps;     /* layer_norm_epsilon / rms_norm_eps */
    float rope_theta;
    float init_std; /* initializer_range */
    int tied;       /* tie_word_embeddings */
    int qkv_bias;   /* qwen2, or llama attention_bias */
    int o_bias;     /* llama attention_bias */
    int qk_norm;    /* qwen3: q_norm / k_norm RMSNorm [head_dim] per head */
    int fused;      /* phi3: fused qkv_proj [q; k; v] and gate_up_proj [gate; up] */
    /* RoPE scaling (rope_parameters / rope_scaling): 0 none, 1 "llama3"
     * (Llama 3.1 / 3.2) with its factor, low/high_freq_factor and
     * original_max_position_embeddings. */
    int rope_scaled;
    float rope_factor, rope_low, rope_high;
    int rope_orig_max;
    /* Gemma 2 / 3 (gemma = 2 or 3; 0 otherwise): Gemma RMSNorm x * (1 + w)
     * on every norm, four norms a layer (input, post_attention,
     * pre_feedforward, post_feedforward), GeGLU MLP (gelu_pytorch_tanh),
     * embeddings times sqrt(hidden_size); Gemma 3 adds q/k norms
     * (qk_norm). attn_scale: query_pre_attn_scalar^-1/2. Soft-caps: 0 =
     * off. Layer l slides (window `window`) when bit l of sliding is set
     * (layer_types, or the family's alternating default). Gemma 3: sliding
     * layers use rope_local_theta; global ones rope_theta with inv_freq
     * divided by rope_global_factor (a "linear" rope_scaling; 1 = none). */
    int gemma;
    float attn_scale, attn_softcap, final_softcap;
    int window;
    uint64_t sliding[4]; /* up to 256 layers */
    float rope_local_theta, rope_global_factor;
    json_t *raw; /* the object it was read from (owned ref), for export */
} model_config;

/* Reads a config object (config.json contents or spec.model.init). `where`
 * names the source in messages ("config.json", "model.init"). */
int hfconfig_parse(json_t *obj, const char *where, model_config *out, ty_err *err);
/* Reads <dir>/config.json. */
int hfconfig_load_dir(const char *dir, model_config *out, ty_err *err);
/* The number of parameters the engine builds for c (as model.h's
 * n_params), saturating at UINT64_MAX; the server bounds model.init with it
 * at submit (--max-params) without allocating anything. */
uint64_t hfconfig_param_count(const model_config *c);
/* The config.json to export: the original object with architectures and
 * torch_dtype ("float32") set. New reference. */
json_t *hfconfig_export(const model_config *c);
/* The same with torch_dtype set to the given name ("bfloat16", ...). */
json_t *hfconfig_export_as(const model_config *c, const char *torch_dtype);
/* RoPE's inverse frequencies, head_dim/2 of them, as transformers computes
 * them in fp32 (1 / theta^(2i/D), then Llama 3's rescaling when
 * rope_scaled). */
void hfconfig_inv_freq(const model_config *c, float *out);
void hfconfig_free(model_config *c);
/* 1 when layer l of a Gemma model is a sliding-window layer. */
static inline int hfconfig_sliding(const model_config *c, int l)
{
    return c->gemma && l < 256 && (c->sliding[l / 64] >> (l % 64) & 1);
}

#endif
