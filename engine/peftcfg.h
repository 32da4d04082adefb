/* peftcfg.h — what a LoRA adapter is: rank, alpha, scaling rule, which
 * modules it targets, per-module ranks and alphas; read from PEFT's
 * adapter_config.json or built from a job spec, written back for PEFT.
 *
 * Every field PEFT's LoraConfig writes is in one table (peftcfg.c): either
 * honoured exactly, ignored because it cannot change the adapter's output
 * (the reason is in the table), or refused unless it holds its default. A
 * field the table does not know is refused by name, so a newer PEFT's
 * addition is never silently dropped. Module matching follows PEFT's
 * check_target_module_exists and get_pattern_key (docs/engine.md, "LoRA");
 * PEFT's regular expressions are run by POSIX regcomp after a translation
 * that refuses what it cannot carry over exactly. */
#ifndef TY_PEFTCFG_H
#define TY_PEFTCFG_H

#include <jansson.h>
#include <stdio.h>

#include "tyerr.h"

#define LORA_MAX_TARGETS 16
#define LORA_MAX_PATTERNS 32
#define LORA_MAX_LAYERS 128
#define LORA_NAME_MAX 128
#define LORA_REGEX_MAX 512

enum { LORA_BIAS_NONE, LORA_BIAS_LORA_ONLY, LORA_BIAS_ALL };

typedef struct lora_pattern {
    char key[LORA_NAME_MAX]; /* a regex matched against the module path's tail */
    double value;
} lora_pattern;

typedef struct lora_cfg {
    int r;
    double alpha, dropout;
    int use_rslora; /* scale alpha / sqrt(r) instead of alpha / r */
    int use_dora;   /* DoRA: each target also has a magnitude vector (lora.h) */
    /* target_modules: a list (a module whose path equals a name or ends in
     * ".name"), a regex (the whole path must match) or "all-linear"; none
     * of them: the model's default list. */
    char targets[LORA_MAX_TARGETS][LORA_NAME_MAX];
    int n_targets;
    char target_regex[LORA_REGEX_MAX];
    int all_linear;
    /* exclude_modules, matched the same way; a match is never a target. */
    char exclude[LORA_MAX_TARGETS][LORA_NAME_MAX];
    int n_exclude;
    char exclude_regex[LORA_REGEX_MAX];
    lora_pattern rank_pattern[LORA_MAX_PATTERNS], alpha_pattern[LORA_MAX_PATTERNS];
    int n_rank_pattern, n_alpha_pattern;
    /* layers_to_transform (n_layers 0: every layer) and layers_pattern. */
    int layers[LORA_MAX_LAYERS];
    int n_layers, layers_int; /* layers_int: written as one integer, as given */
    char layers_pattern[8][64];
    int n_layers_pattern;
    /* bias: which of the base's biases train beside the adapters (PEFT's
     * "none", "lora_only": the targeted modules', "all": every one); they
     * are saved in the adapter file under the names PEFT gives them. */
    int bias; /* LORA_BIAS_* */
    /* modules_to_save: modules trained whole beside the adapters; PEFT's
     * rule: a module whose path (or an enclosing module's) ends in the
     * name, a plain string suffix. */
    char save[LORA_MAX_TARGETS][LORA_NAME_MAX];
    int n_save;
    int from_peft; /* read from adapter_config.json: errors name its fields */
} lora_cfg;

/* PEFT's LoraConfig defaults (r 8, alpha 8, every list empty). */
void lora_cfg_default(lora_cfg *c);
/* Reads adapter_config.json (ac; path for messages) over c. A field that
 * is malformed is TY_EINVAL; one this engine cannot honour is TY_ESPEC;
 * both name the field. */
int lora_cfg_from_peft(lora_cfg *c, const json_t *ac, const char *path, ty_err *err);
/* Reads path (a directory's adapter_config.json) the same way; TY_ENOENT
 * when there is none. */
int lora_cfg_load(lora_cfg *c, const char *path, ty_err *err);
/* The honoured fields as adapter_config.json holds them (into o). */
void lora_cfg_to_peft(const lora_cfg *c, json_t *o);

/* Whether module (a Hugging Face module path) is a target: 1 yes, 0 no;
 * *which = the list entry that matched (-1 for a regex / all-linear). */
int lora_cfg_targets(const lora_cfg *c, const char *module, int *which);
/* PEFT's list rule: module equals name or ends in ".name". */
int lora_name_matches(const char *module, const char *name);
/* The module's rank and alpha (rank_pattern / alpha_pattern, else r / alpha). */
int lora_cfg_rank(const lora_cfg *c, const char *module);
double lora_cfg_alpha(const lora_cfg *c, const char *module);
/* PEFT's scaling for (r, alpha): alpha / r, or alpha / sqrt(r) with rsLoRA. */
float lora_cfg_scale(const lora_cfg *c, int r, double alpha);

/* The field table, one line per field: name, what is done with it, why
 * (`trainyard-engine adapter-fields`). */
void peft_fields_print(FILE *f);

#endif
