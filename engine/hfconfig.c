/* hfconfig.c — config.json parsing for the GPT-2 and Llama families.
 *
 * Defaults mirror transformers' GPT2Config / LlamaConfig / MistralConfig /
 * Qwen2Config so a config that omits a field means what it means in Python. */
#include "hfconfig.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "tyutil.h"

/* Integer field with a default; a present field must be a positive int. */
static int cfg_int(json_t *o, const char *key, int def, const char *where, int *out, ty_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 30))
        return ty_err_field(err, TY_EINVAL, key, "%s: %s must be a positive integer", where, key);
    *out = (int)json_integer_value(v);
    return 0;
}

static int cfg_num(json_t *o, const char *key, double def, const char *where, float *out,
                   ty_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = (float)def;
        return 0;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return ty_err_field(err, TY_EINVAL, key, "%s: %s must be a positive number", where, key);
    *out = (float)json_number_value(v);
    return 0;
}

static int cfg_bool(json_t *o, const char *key, int def, const char *where, int *out, ty_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return ty_err_field(err, TY_EINVAL, key, "%s: %s must be true or false", where, key);
    *out = json_is_true(v);
    return 0;
}

static int cfg_gpt2(json_t *o, const char *w, model_config *c, ty_err *err)
{
    int rc;
    if ((rc = cfg_int(o, "vocab_size", 50257, w, &c->vocab, err)) ||
        (rc = cfg_int(o, "n_embd", 768, w, &c->dim, err)) ||
        (rc = cfg_int(o, "n_layer", 12, w, &c->n_layer, err)) ||
        (rc = cfg_int(o, "n_head", 12, w, &c->n_head, err)) ||
        (rc = cfg_int(o, "n_positions", 1024, w, &c->max_pos, err)) ||
        (rc = cfg_num(o, "layer_norm_epsilon", 1e-5, w, &c->norm_eps, err)) ||
        (rc = cfg_num(o, "initializer_range", 0.02, w, &c->init_std, err)) ||
        (rc = cfg_bool(o, "tie_word_embeddings", 1, w, &c->tied, err)))
        return rc;
    if ((rc = cfg_int(o, "n_inner", 4 * c->dim, w, &c->ffn, err))) return rc;
    json_t *act = json_object_get(o, "activation_function");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || (strcmp(json_string_value(act), "gelu_new") &&
                                  strcmp(json_string_value(act), "gelu_pytorch_tanh"))))
        return ty_err_field(err, TY_EINVAL, "activation_function",
                            "%s: activation_function must be gelu_new (the tanh GELU)", w);
    int flag;
    if ((rc = cfg_bool(o, "scale_attn_weights", 1, w, &flag, err))) return rc;
    if (!flag)
        return ty_err_field(err, TY_EINVAL, "scale_attn_weights",
                            "%s: scale_attn_weights=false is not supported", w);
    if ((rc = cfg_bool(o, "scale_attn_by_inverse_layer_idx", 0, w, &flag, err))) return rc;
    if (flag)
        return ty_err_field(err, TY_EINVAL, "scale_attn_by_inverse_layer_idx",
                            "%s: scale_attn_by_inverse_layer_idx=true is not supported", w);
    c->arch = ARCH_GPT2;
    c->n_kv_head = c->n_head;
    c->rope_theta = 0;
    return 0;
}

/* A number inside the RoPE object: "<key>.<name>", positive. */
static int rope_num(json_t *rp, const char *key, const char *name, const char *w, float *out,
                    ty_err *err)
{
    char field[64];
    snprintf(field, sizeof field, "%s.%s", key, name);
    json_t *v = json_object_get(rp, name);
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return ty_err_field(err, TY_EINVAL, field,
                            "%s: %s must be a positive number for rope_type llama3", w, field);
    *out = (float)json_number_value(v);
    return 0;
}

/* RoPE settings. transformers 5 writes rope_parameters {rope_type,
 * rope_theta, factor, ...}; older files a rope_scaling object ({type |
 * rope_type, factor, ...}) beside a top-level rope_theta. "default" is
 * plain RoPE; "llama3" (Llama 3.1 / 3.2) rescales the frequencies, which
 * the engine does (hfconfig_inv_freq); other scalings (linear, dynamic,
 * yarn, longrope, ...) are refused rather than silently computed as plain
 * RoPE. */
static int cfg_rope(json_t *o, const char *w, model_config *c, ty_err *err)
{
    const char *key = "rope_parameters";
    json_t *rp = json_object_get(o, key);
    if (!rp || json_is_null(rp)) {
        key = "rope_scaling";
        rp = json_object_get(o, key);
    }
    if (!rp || json_is_null(rp)) return 0;
    char field[64];
    if (!json_is_object(rp))
        return ty_err_field(err, TY_EINVAL, key, "%s: %s must be an object", w, key);
    json_t *rt = json_object_get(rp, "rope_type");
    if (!rt || json_is_null(rt)) rt = json_object_get(rp, "type");
    snprintf(field, sizeof field, "%s.rope_type", key);
    if (rt && !json_is_null(rt) && !json_is_string(rt))
        return ty_err_field(err, TY_EINVAL, field, "%s: %s must be a string", w, field);
    const char *type = json_is_string(rt) ? json_string_value(rt) : "default";
    if (!strcmp(type, "llama3")) {
        int rc;
        json_t *om = json_object_get(rp, "original_max_position_embeddings");
        snprintf(field, sizeof field, "%s.original_max_position_embeddings", key);
        if (!json_is_integer(om) || json_integer_value(om) <= 0 ||
            json_integer_value(om) > (1 << 30))
            return ty_err_field(err, TY_EINVAL, field,
                                "%s: %s must be a positive integer for rope_type llama3", w, field);
        c->rope_orig_max = (int)json_integer_value(om);
        if ((rc = rope_num(rp, key, "factor", w, &c->rope_factor, err)) ||
            (rc = rope_num(rp, key, "low_freq_factor", w, &c->rope_low, err)) ||
            (rc = rope_num(rp, key, "high_freq_factor", w, &c->rope_high, err)))
            return rc;
        if (!(c->rope_high > c->rope_low)) {
            snprintf(field, sizeof field, "%s.high_freq_factor", key);
            return ty_err_field(err, TY_EINVAL, field,
                                "%s: %s must be greater than low_freq_factor", w, field);
        }
        c->rope_scaled = 1;
    } else if (strcmp(type, "default")) {
        return ty_err_field(
            err, TY_EINVAL, field,
            "%s: %s \"%s\" (RoPE scaling) is not supported (default and llama3 are)", w, field,
            ty_safe_word(type));
    }
    /* rope_parameters' theta counts when there is no top-level one. */
    json_t *th = json_object_get(rp, "rope_theta");
    if (th && !json_object_get(o, "rope_theta")) {
        snprintf(field, sizeof field, "%s.rope_theta", key);
        if (!json_is_number(th) || !(json_number_value(th) > 0))
            return ty_err_field(err, TY_EINVAL, field, "%s: %s must be a positive number", w,
                                field);
        c->rope_theta = (float)json_number_value(th);
    }
    return 0;
}

void hfconfig_inv_freq(const model_config *c, float *out)
{
    int D = c->head_dim;
    for (int i = 0; i < D / 2; i++)
        out[i] = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)D);
    if (c->gemma && c->rope_global_factor != 1.0f) /* Gemma 3's linear scaling */
        for (int i = 0; i < D / 2; i++)
            out[i] /= c->rope_global_factor;
    if (!c->rope_scaled) return;
    /* transformers' _compute_llama3_parameters, in fp32: wavelengths
     * shorter than orig/high keep their frequency, longer than orig/low
     * are divided by factor, and those between are blended smoothly. */
    float orig = (float)c->rope_orig_max, lo_wl = orig / c->rope_low, hi_wl = orig / c->rope_high;
    for (int i = 0; i < D / 2; i++) {
        float f = out[i], wl = 2.0f * (float)M_PI / f;
        float scaled = wl > lo_wl ? f / c->rope_factor : f;
        if (!(wl < hi_wl) && !(wl > lo_wl)) {
            float s = (orig / wl - c->rope_low) / (c->rope_high - c->rope_low);
            scaled = (1.0f - s) * scaled / c->rope_factor + s * scaled;
        }
        out[i] = scaled;
    }
}

static int cfg_llama(json_t *o, const char *w, const char *type, model_config *c, ty_err *err)
{
    /* transformers class defaults per model_type */
    int is_mistral = !strcmp(type, "mistral"), is_qwen2 = !strcmp(type, "qwen2"),
        is_qwen3 = !strcmp(type, "qwen3");
    int qwen = is_qwen2 || is_qwen3, is_phi3 = !strcmp(type, "phi3");
    int d_vocab = qwen ? 151936 : is_phi3 ? 32064 : 32000;
    int d_ffn = is_mistral ? 14336 : qwen ? 22016 : is_phi3 ? 8192 : 11008;
    int d_maxpos = is_mistral ? 4096 * 32 : qwen ? 32768 : is_phi3 ? 4096 : 2048;
    int rc;
    if ((rc = cfg_int(o, "vocab_size", d_vocab, w, &c->vocab, err)) ||
        (rc = cfg_int(o, "hidden_size", is_phi3 ? 3072 : 4096, w, &c->dim, err)) ||
        (rc = cfg_int(o, "intermediate_size", d_ffn, w, &c->ffn, err)) ||
        (rc = cfg_int(o, "num_hidden_layers", 32, w, &c->n_layer, err)) ||
        (rc = cfg_int(o, "num_attention_heads", 32, w, &c->n_head, err)) ||
        (rc = cfg_int(o, "num_key_value_heads", is_mistral ? 8 : c->n_head, w, &c->n_kv_head,
                      err)) ||
        (rc = cfg_int(o, "max_position_embeddings", d_maxpos, w, &c->max_pos, err)) ||
        (rc = cfg_num(o, "rms_norm_eps", is_phi3 ? 1e-5 : 1e-6, w, &c->norm_eps, err)) ||
        (rc = cfg_num(o, "rope_theta", 10000.0, w, &c->rope_theta, err)) ||
        (rc = cfg_num(o, "initializer_range", 0.02, w, &c->init_std, err)) ||
        (rc = cfg_bool(o, "tie_word_embeddings", 0, w, &c->tied, err)))
        return rc;
    if (c->dim % c->n_head)
        return ty_err_field(err, TY_EINVAL, "num_attention_heads",
                            "%s: hidden_size %d is not divisible by num_attention_heads %d", w,
                            c->dim, c->n_head);
    /* Qwen3Config's head_dim defaults to 128, not hidden / heads. */
    if ((rc = cfg_int(o, "head_dim", is_qwen3 ? 128 : c->dim / c->n_head, w, &c->head_dim, err)))
        return rc;
    c->qk_norm = is_qwen3;
    c->fused = is_phi3;
    /* Phi-3's partial_rotary_factor (top level, or in rope_parameters):
     * RoPE on only part of each head is not done. */
    json_t *prf = json_object_get(o, "partial_rotary_factor"),
           *rpo = json_object_get(o, "rope_parameters");
    const char *prf_field = "partial_rotary_factor";
    if ((!prf || json_is_null(prf)) && json_is_object(rpo)) {
        prf = json_object_get(rpo, "partial_rotary_factor");
        prf_field = "rope_parameters.partial_rotary_factor";
    }
    if (prf && !json_is_null(prf) && (!json_is_number(prf) || json_number_value(prf) != 1.0))
        return ty_err_field(err, TY_EINVAL, prf_field,
                            "%s: %s other than 1.0 (RoPE on part of each head) is not supported", w,
                            prf_field);
    json_t *act = json_object_get(o, "hidden_act");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        return ty_err_field(err, TY_EINVAL, "hidden_act", "%s: hidden_act must be silu", w);
    if ((rc = cfg_rope(o, w, c, err))) return rc;
    int flag = 0;
    if (is_qwen2) {
        c->qkv_bias = 1;
    } else {
        if ((rc = cfg_bool(o, "attention_bias", 0, w, &flag, err))) return rc;
        c->qkv_bias = c->o_bias = flag;
        if ((rc = cfg_bool(o, "mlp_bias", 0, w, &flag, err))) return rc;
        if (flag)
            return ty_err_field(err, TY_EINVAL, "mlp_bias", "%s: mlp_bias=true is not supported",
                                w);
    }
    /* Mistral's sliding window (and Qwen2's when use_sliding_window) limits
     * attention; the engine checks it against seq_len at start-up. */
    c->sliding_window = 0;
    int use_sw = !qwen;
    if (qwen && (rc = cfg_bool(o, "use_sliding_window", 0, w, &use_sw, err))) return rc;
    if (use_sw && (is_mistral || qwen || is_phi3)) {
        json_t *sw = json_object_get(o, "sliding_window");
        if (!sw && is_mistral)
            c->sliding_window = 4096;
        else if (json_is_integer(sw) && json_integer_value(sw) > 0)
            c->sliding_window = (int)json_integer_value(sw);
    }
    c->arch = ARCH_LLAMA;
    return 0;
}

/* A soft-cap: absent or null = off (0), else a positive number. */
static int cfg_cap(json_t *o, const char *key, double def, const char *w, float *out, ty_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        *out = (float)def;
        return 0;
    }
    if (json_is_null(v)) {
        *out = 0.0f;
        return 0;
    }
    return cfg_num(o, key, def, w, out, err);
}

/* Gemma 3's RoPE: transformers 5 writes rope_parameters {sliding_attention:
 * {rope_type, rope_theta}, full_attention: {...}}; older files a top-level
 * rope_theta, rope_local_base_freq and rope_scaling (for the global layers).
 * "default" and "linear" (factor) are done; other types are refused. */
static int gemma3_rope_one(json_t *rp, const char *key, const char *w, float *theta, float *factor,
                           ty_err *err)
{
    char field[96];
    json_t *rt = json_object_get(rp, "rope_type");
    if (!rt || json_is_null(rt)) rt = json_object_get(rp, "type");
    const char *type = json_is_string(rt) ? json_string_value(rt) : "default";
    json_t *th = json_object_get(rp, "rope_theta");
    if (th && !json_is_null(th)) {
        snprintf(field, sizeof field, "%s.rope_theta", key);
        if (!json_is_number(th) || !(json_number_value(th) > 0))
            return ty_err_field(err, TY_EINVAL, field, "%s: %s must be a positive number", w,
                                field);
        *theta = (float)json_number_value(th);
    }
    snprintf(field, sizeof field, "%s.rope_type", key);
    if (!strcmp(type, "linear") && factor) {
        json_t *f = json_object_get(rp, "factor");
        snprintf(field, sizeof field, "%s.factor", key);
        if (!json_is_number(f) || !(json_number_value(f) > 0))
            return ty_err_field(err, TY_EINVAL, field,
                                "%s: %s must be a positive number for rope_type linear", w, field);
        *factor = (float)json_number_value(f);
    } else if (strcmp(type, "default")) {
        return ty_err_field(err, TY_EINVAL, field, "%s: %s \"%s\" is not supported (default%s are)",
                            w, field, ty_safe_word(type), factor ? " and linear" : "");
    }
    return 0;
}

/* Gemma 2 ("gemma2") and Gemma 3's text model ("gemma3_text"); defaults as
 * transformers' Gemma2Config / Gemma3TextConfig. */
static int cfg_gemma(json_t *o, const char *w, int gen, model_config *c, ty_err *err)
{
    int rc;
    if ((rc = cfg_int(o, "vocab_size", gen == 2 ? 256000 : 262208, w, &c->vocab, err)) ||
        (rc = cfg_int(o, "hidden_size", 2304, w, &c->dim, err)) ||
        (rc = cfg_int(o, "intermediate_size", 9216, w, &c->ffn, err)) ||
        (rc = cfg_int(o, "num_hidden_layers", 26, w, &c->n_layer, err)) ||
        (rc = cfg_int(o, "num_attention_heads", 8, w, &c->n_head, err)) ||
        (rc = cfg_int(o, "num_key_value_heads", 4, w, &c->n_kv_head, err)) ||
        (rc = cfg_int(o, "head_dim", 256, w, &c->head_dim, err)) ||
        (rc = cfg_int(o, "max_position_embeddings", gen == 2 ? 8192 : 131072, w, &c->max_pos,
                      err)) ||
        (rc = cfg_num(o, "rms_norm_eps", 1e-6, w, &c->norm_eps, err)) ||
        (rc = cfg_num(o, "initializer_range", 0.02, w, &c->init_std, err)) ||
        (rc = cfg_bool(o, "tie_word_embeddings", 1, w, &c->tied, err)) ||
        (rc = cfg_int(o, "sliding_window", 4096, w, &c->window, err)) ||
        (rc = cfg_cap(o, "final_logit_softcapping", gen == 2 ? 30.0 : 0.0, w, &c->final_softcap,
                      err)) ||
        (rc =
             cfg_cap(o, "attn_logit_softcapping", gen == 2 ? 50.0 : 0.0, w, &c->attn_softcap, err)))
        return rc;
    float qpas;
    if ((rc = cfg_num(o, "query_pre_attn_scalar", 256, w, &qpas, err))) return rc;
    c->attn_scale = 1.0f / sqrtf(qpas);
    json_t *act = json_object_get(o, "hidden_activation");
    if (!act || json_is_null(act)) act = json_object_get(o, "hidden_act");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || strcmp(json_string_value(act), "gelu_pytorch_tanh")))
        return ty_err_field(err, TY_EINVAL, "hidden_activation",
                            "%s: hidden_activation must be gelu_pytorch_tanh", w);
    int flag;
    if ((rc = cfg_bool(o, "attention_bias", 0, w, &flag, err))) return rc;
    if (flag)
        return ty_err_field(err, TY_EINVAL, "attention_bias",
                            "%s: attention_bias=true is not supported for Gemma", w);
    if ((rc = cfg_bool(o, "use_bidirectional_attention", 0, w, &flag, err))) return rc;
    if (flag)
        return ty_err_field(err, TY_EINVAL, "use_bidirectional_attention",
                            "%s: use_bidirectional_attention=true (an encoder) is not supported",
                            w);
    if (c->n_layer > 256)
        return ty_err_field(err, TY_EINVAL, "num_hidden_layers",
                            "%s: num_hidden_layers %d: Gemma models of more than 256 layers are "
                            "not supported",
                            w, c->n_layer);
    /* layer_types, else the family's pattern: Gemma 2 alternates (sliding
     * first), Gemma 3 slides on all but every sliding_window_pattern-th. */
    json_t *lt = json_object_get(o, "layer_types");
    memset(c->sliding, 0, sizeof c->sliding);
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (int)json_array_size(lt) != c->n_layer)
            return ty_err_field(err, TY_EINVAL, "layer_types",
                                "%s: layer_types must list num_hidden_layers (%d) entries", w,
                                c->n_layer);
        for (int l = 0; l < c->n_layer; l++) {
            const char *t = json_string_value(json_array_get(lt, (size_t)l));
            if (t && !strcmp(t, "sliding_attention"))
                c->sliding[l / 64] |= 1ull << (l % 64);
            else if (!t || strcmp(t, "full_attention"))
                return ty_err_field(err, TY_EINVAL, "layer_types",
                                    "%s: layer_types[%d] must be sliding_attention or "
                                    "full_attention",
                                    w, l);
        }
    } else {
        int pattern = 2;
        if (gen == 3 && (rc = cfg_int(o, "sliding_window_pattern", 6, w, &pattern, err))) return rc;
        for (int l = 0; l < c->n_layer; l++)
            if ((l + 1) % pattern) c->sliding[l / 64] |= 1ull << (l % 64);
    }
    c->rope_theta = gen == 2 ? 10000.0f : 1000000.0f;
    c->rope_local_theta = 10000.0f;
    c->rope_global_factor = 1.0f;
    if (gen == 2) {
        if ((rc = cfg_rope(o, w, c, err))) return rc;
        if (c->rope_scaled)
            return ty_err_field(err, TY_EINVAL, "rope_scaling",
                                "%s: RoPE scaling is not supported for Gemma 2", w);
        json_t *th = json_object_get(o, "rope_theta");
        if (th && (rc = cfg_num(o, "rope_theta", 10000.0, w, &c->rope_theta, err))) return rc;
        c->rope_local_theta = c->rope_theta;
    } else {
        json_t *rp = json_object_get(o, "rope_parameters");
        json_t *full = json_is_object(rp) ? json_object_get(rp, "full_attention") : NULL;
        json_t *slide = json_is_object(rp) ? json_object_get(rp, "sliding_attention") : NULL;
        if ((rc = cfg_num(o, "rope_theta", 1000000.0, w, &c->rope_theta, err)) ||
            (rc = cfg_num(o, "rope_local_base_freq", 10000.0, w, &c->rope_local_theta, err)))
            return rc;
        if (json_is_object(full) &&
            (rc = gemma3_rope_one(full, "rope_parameters.full_attention", w, &c->rope_theta,
                                  &c->rope_global_factor, err)))
            return rc;
        if (json_is_object(slide) &&
            (rc = gemma3_rope_one(slide, "rope_parameters.sliding_attention", w,
                                  &c->rope_local_theta, NULL, err)))
            return rc;
        json_t *rs = json_object_get(o, "rope_scaling");
        if (json_is_object(rs) && (rc = gemma3_rope_one(rs, "rope_scaling", w, &c->rope_theta,
                                                        &c->rope_global_factor, err)))
            return rc;
        c->qk_norm = 1;
    }
    if (c->head_dim % 2)
        return ty_err_field(err, TY_EINVAL, "head_dim", "%s: head_dim %d must be even for RoPE", w,
                            c->head_dim);
    c->gemma = gen;
    c->arch = ARCH_LLAMA;
    return 0;
}

int hfconfig_parse(json_t *obj, const char *where, model_config *out, ty_err *err)
{
    memset(out, 0, sizeof *out);
    if (!json_is_object(obj)) return ty_err_set(err, TY_EINVAL, "%s: not a JSON object", where);
    json_t *mt = json_object_get(obj, "model_type");
    if (!json_is_string(mt))
        return ty_err_field(err, TY_EINVAL, "model_type",
                            "%s: model_type missing (gpt2, llama, mistral, qwen2, qwen3, phi3, "
                            "gemma2 or gemma3_text)",
                            where);
    const char *type = json_string_value(mt);
    int rc;
    if (!strcmp(type, "gpt2"))
        rc = cfg_gpt2(obj, where, out, err);
    else if (!strcmp(type, "llama") || !strcmp(type, "mistral") || !strcmp(type, "qwen2") ||
             !strcmp(type, "qwen3") || !strcmp(type, "phi3"))
        rc = cfg_llama(obj, where, type, out, err);
    else if (!strcmp(type, "gemma2") || !strcmp(type, "gemma3_text"))
        rc = cfg_gemma(obj, where, type[5] == '2' ? 2 : 3, out, err);
    else if (!strcmp(type, "gemma3"))
        /* The multimodal checkpoint (Gemma3ForConditionalGeneration): its
         * weights sit under language_model / vision_tower prefixes and a
         * vision tower the engine does not run. Refused, saying how to get
         * the text model. */
        return ty_err_field(err, TY_EINVAL, "model_type",
                            "%s: model_type \"gemma3\" is the multimodal (image + text) model, "
                            "which is not supported; use a text-only Gemma 3 checkpoint "
                            "(model_type gemma3_text, e.g. gemma-3-1b)",
                            where);
    else
        return ty_err_field(err, TY_EINVAL, "model_type",
                            "%s: model_type \"%s\" is not supported (gpt2, llama, mistral, qwen2, "
                            "qwen3, phi3, gemma2, gemma3_text)",
                            where, ty_safe_word(type));
    if (rc) return rc;
    snprintf(out->model_type, sizeof out->model_type, "%s", type);
    if (out->arch == ARCH_GPT2) {
        if (out->dim % out->n_head)
            return ty_err_field(err, TY_EINVAL, "n_head",
                                "%s: n_embd %d is not divisible by n_head %d", where, out->dim,
                                out->n_head);
        out->head_dim = out->dim / out->n_head;
    }
    if (out->n_head % out->n_kv_head)
        return ty_err_field(
            err, TY_EINVAL, "num_key_value_heads",
            "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", where,
            out->n_head, out->n_kv_head);
    if (out->arch == ARCH_LLAMA && out->head_dim % 2)
        return ty_err_set(err, TY_EINVAL, "%s: head_dim %d must be even for RoPE", where,
                          out->head_dim);
    out->raw = json_incref(obj);
    return 0;
}

int hfconfig_load_dir(const char *dir, model_config *out, ty_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *o;
    int rc = ty_read_json(path, TY_EINVAL, &o, err);
    if (rc) return rc;
    rc = hfconfig_parse(o, path, out, err);
    json_decref(o);
    return rc;
}

uint64_t hfconfig_param_count(const model_config *c)
{
    /* In double: a config of 2^30-sized fields overflows 64 bits. */
    double V = c->vocab, C = c->dim, F = c->ffn, L = c->n_layer, n;
    if (c->arch == ARCH_GPT2) {
        double layer =
            2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (F * C + F) + (C * F + C);
        n = V * C + (double)c->max_pos * C + L * layer + 2 * C;
    } else {
        double QD = (double)c->n_head * c->head_dim, KD = (double)c->n_kv_head * c->head_dim;
        double layer = C + QD * C + 2 * KD * C + C * QD + C + 3 * F * C;
        if (c->qkv_bias) layer += QD + 2 * KD;
        if (c->o_bias) layer += C;
        if (c->qk_norm) layer += 2.0 * c->head_dim;
        if (c->gemma) layer += 2 * C; /* post-attention and post-feedforward norms */
        n = V * C + L * layer + C;
    }
    if (!c->tied) n += V * C;
    return n >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)n;
}

json_t *hfconfig_export(const model_config *c)
{
    return hfconfig_export_as(c, "float32");
}

json_t *hfconfig_export_as(const model_config *c, const char *torch_dtype)
{
    json_t *o = json_deep_copy(c->raw);
    const char *arch = c->arch == ARCH_GPT2                ? "GPT2LMHeadModel"
                       : !strcmp(c->model_type, "mistral") ? "MistralForCausalLM"
                       : !strcmp(c->model_type, "qwen2")   ? "Qwen2ForCausalLM"
                       : !strcmp(c->model_type, "qwen3")   ? "Qwen3ForCausalLM"
                       : !strcmp(c->model_type, "phi3")    ? "Phi3ForCausalLM"
                       : c->gemma == 2                     ? "Gemma2ForCausalLM"
                       : c->gemma == 3                     ? "Gemma3ForCausalLM"
                                                           : "LlamaForCausalLM";
    if (!json_object_get(o, "architectures"))
        json_object_set_new(o, "architectures", json_pack("[s]", arch));
    json_object_set_new(o, "torch_dtype", json_string(torch_dtype));
    return o;
}

void hfconfig_free(model_config *c)
{
    if (!c) return;
    json_decref(c->raw);
    c->raw = NULL;
}
