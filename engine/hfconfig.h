/* hfconfig.h — the model architecture, read from a Hugging Face config.json.
 *
 * Two families: GPT-2 (model_type "gpt2") and Llama ("llama", "mistral",
 * "qwen2"). Missing fields take the transformers class defaults, so a short
 * `model.init` object in a job spec describes a model the same way
 * `GPT2Config(...)` / `LlamaConfig(...)` would. Settings the engine cannot
 * reproduce exactly (rope_scaling, other activations, sliding windows that
 * bite) are errors rather than silently different numerics. */
#ifndef TY_HFCONFIG_H
#define TY_HFCONFIG_H

#include <jansson.h>
#include <stdint.h>
#include "tyerr.h"

typedef enum { ARCH_GPT2 = 0, ARCH_LLAMA } model_arch;

typedef struct model_config {
    model_arch arch;
    char model_type[16];   /* "gpt2" | "llama" | "mistral" | "qwen2" */
    int vocab;             /* vocab_size */
    int dim;               /* n_embd / hidden_size */
    int n_layer;
    int n_head;
    int n_kv_head;         /* == n_head for GPT-2 */
    int head_dim;
    int ffn;               /* n_inner (4*dim) / intermediate_size */
    int max_pos;           /* n_positions / max_position_embeddings */
    int sliding_window;    /* mistral; 0 = none */
    float norm_eps;        /* layer_norm_epsilon / rms_norm_eps */
    float rope_theta;
    float init_std;        /* initializer_range */
    int tied;              /* tie_word_embeddings */
    int qkv_bias;          /* qwen2, or llama attention_bias */
    int o_bias;            /* llama attention_bias */
    json_t *raw;           /* the object it was read from (owned ref), for export */
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
void hfconfig_free(model_config *c);

#endif
