/* jobspec.h — the job spec of DESIGN §4: one parser, shared by server and engine.
 *
 * jobspec_parse() checks a JSON spec completely — unknown fields, types,
 * required fields, ranges, path syntax — and fills a struct with every
 * default applied. On failure err->field names the offending field as a
 * dotted path ("hyperparameters.lr", "lora.targets[2]"). The server also
 * checks paths against its allowed roots (jobspec_check_roots); the engine
 * reads the struct. Strings are owned by the jobspec (jobspec_free). */
#ifndef TY_JOBSPEC_H
#define TY_JOBSPEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include "tyerr.h"

#define JOBSPEC_MAX_TARGETS 16
#define JOBSPEC_MAX_TAGS 16
#define JOBSPEC_TAG_LEN 64
#define JOBSPEC_MAX_WEBHOOKS 4

typedef enum { METHOD_FULL = 0, METHOD_LORA, METHOD_QLORA } jobspec_method;
/* PREC_AUTO: the engine chooses once it knows the device -- bf16, or fp16
 * (with loss scaling) on a GPU older than compute capability 8.0. */
typedef enum { PREC_FP32 = 0, PREC_BF16, PREC_FP16, PREC_AUTO } jobspec_precision;
typedef enum { BACKEND_AUTO = 0, BACKEND_CUDA, BACKEND_CPU } jobspec_backend;
typedef enum { SCHED_CONSTANT = 0, SCHED_LINEAR, SCHED_COSINE } jobspec_schedule;
typedef enum { DS_TOKENS = 0, DS_TEXT, DS_PROMPT_COMPLETION, DS_CHAT } jobspec_format;
typedef enum { ON_STALL_WARN = 0, ON_STALL_RESTART, ON_STALL_FAIL } jobspec_on_stall;
typedef enum { RECOMPUTE_NONE = 0, RECOMPUTE_MLP, RECOMPUTE_ALL } jobspec_recompute;
/* export.dtype: auto = the model's own torch_dtype (fp32 for model.init). */
typedef enum {
    EXPORT_DTYPE_AUTO = 0,
    EXPORT_DTYPE_FP32,
    EXPORT_DTYPE_BF16,
    EXPORT_DTYPE_FP16
} jobspec_export_dtype;

typedef struct jobspec {
    char *name; /* optional; NULL when absent */
    /* model: exactly one of path / init */
    char *model_path;   /* local absolute path or s3:// gs:// az:// URI */
    json_t *model_init; /* a config.json-shaped object (owned ref), or NULL */

    /* dataset */
    char *train;           /* required */
    char *eval;            /* optional */
    jobspec_format format; /* default tokens */
    char *text_field;      /* default "text" */
    char *chat_template;   /* "chatml" | "llama3" | "llama2"; default chatml */
    bool packing;          /* default false */
    bool skip_invalid;     /* default false */
    double eval_fraction;  /* 0 = none; [0, 0.5] */

    jobspec_method method; /* default full */
    /* lora.bias, PEFT's names: none, the targeted modules' biases, all biases */
#define JOBSPEC_BIAS_NONE 0
#define JOBSPEC_BIAS_LORA_ONLY 1
#define JOBSPEC_BIAS_ALL 2
    /* lora (also used by qlora) */
    int lora_r;           /* default 8, >= 1 */
    double lora_alpha;    /* default 16 */
    double lora_dropout;  /* default 0, [0, 1) */
    bool lora_use_rslora; /* default false: scale alpha / sqrt(r) instead of alpha / r */
    bool lora_use_dora;   /* default false: DoRA (PEFT's use_dora); method lora only */
    int n_targets;        /* default: q_proj,v_proj (llama) chosen by engine when 0 */
    char *targets[JOBSPEC_MAX_TARGETS];
    int lora_bias; /* JOBSPEC_BIAS_*: which biases train beside the adapters */
    int n_save;    /* lora.modules_to_save: modules trained whole (PEFT's) */
    char *save[JOBSPEC_MAX_TARGETS];
    char *lora_adapter; /* optional: starting adapter directory (PEFT format) */
    bool lora_merge;    /* export merged full weights instead of an adapter */
    /* qlora (method qlora only; docs/engine.md "QLoRA") */
    bool qlora_double_quant; /* default true: 8-bit absmax values */
    jobspec_export_dtype
        qlora_compute_dtype; /* dtype of the dequantised weights; auto = precision */

    /* hyperparameters */
    int64_t max_steps;           /* required, [1, 1e9] */
    int batch_size;              /* default 1, [1, 65536] */
    int seq_len;                 /* default 256, [2, 1048576] */
    int grad_accum;              /* default 1, [1, 65536] */
    double lr;                   /* default 1e-4, (0, 10] */
    jobspec_schedule schedule;   /* default constant */
    int64_t warmup_steps;        /* default 0 */
    double weight_decay;         /* default 0, [0, 10] */
    double max_grad_norm;        /* default 1.0, 0 = off */
    double adam_beta1;           /* default 0.9, [0, 1) */
    double adam_beta2;           /* default 0.999, [0, 1) */
    double adam_eps;             /* default 1e-8, > 0 */
    uint64_t seed;               /* default 1234 */
    int64_t log_every_steps;     /* default 10, >= 1 */
    int64_t eval_every_steps;    /* default 0 = only at the end when eval is set */
    jobspec_recompute recompute; /* default none */

    jobspec_precision precision;       /* default fp32 */
    jobspec_export_dtype export_dtype; /* default auto */
    int gpus;                          /* default 0 = run on CPU slots; [0, 64] */
    int cpu_ranks; /* default 1; data-parallel CPU ranks [1, 256], only without gpus */
    int nodes;     /* default 1; [1, 1024] machines (the Slurm executor only); gpus and
                                 cpu_ranks then count per node */
    int zero;      /* default 0; 1 = ZeRO-1 (optimizer state sharded over the ranks) */
    int bucket_kb; /* default 4096; gradient all-reduce buckets overlapped with the backward
                      (world > 1), 0 = one all-reduce after it; [0, 1 << 20] */
    jobspec_backend backend; /* default auto */

    /* checkpoint */
    int64_t ckpt_every_steps; /* default 0 = only at stop/end */
    int keep_last;            /* default 0 = keep all */
    int keep_best;            /* default 0 = off */
    char *store;              /* optional remote URI: s3:// gs:// az:// file:// */

    int priority;     /* default 0, [-1000, 1000]; higher runs first */
    int max_restarts; /* default 3, [0, 100] */

    /* operations (the server's, the engine ignores them) */
    int n_tags;
    char *tags[JOBSPEC_MAX_TAGS]; /* 1-64 chars of A-Z a-z 0-9 _ . : - ; unique */
    double max_cost;              /* limits.max_cost; < 0 = none */
    int64_t max_runtime_s;        /* limits.max_runtime_s; 0 = none */
    int64_t max_tokens;           /* limits.max_tokens; 0 = none */
    int64_t stall_after_s;        /* limits.stall_after_s; 0 = from the step time */
    jobspec_on_stall on_stall;    /* limits.on_stall; default warn */
    int n_webhooks;
    char *webhooks[JOBSPEC_MAX_WEBHOOKS]; /* http(s) URLs */
} jobspec;

/* Parses and validates. On error returns TY_EINVAL with err->field set;
 * *out is left zeroed (nothing to free).
 *
 * JSON layout (DESIGN §4; openapi.yaml's JobSpec mirrors it):
 *   name; model{path|init}; dataset{train, eval, format, text_field,
 *   chat_template, packing, skip_invalid, eval_fraction}; method;
 *   lora{r, alpha, dropout, use_rslora, use_dora, bias, modules_to_save, targets, adapter,
 *   merge} (method lora/qlora only);
 *   qlora{double_quant, compute_dtype} (method qlora only);
 *   hyperparameters{max_steps, batch_size, seq_len, grad_accum, lr, schedule,
 *   warmup_steps, weight_decay, max_grad_norm, adam_beta1, adam_beta2,
 *   adam_eps, seed, log_every_steps, eval_every_steps, recompute}; precision;
 *   export{dtype}; resources{gpus, cpu_ranks, nodes, zero, bucket_kb, backend}; checkpoint{every_steps, keep_last, keep_best,
 *   store}; priority; max_restarts; tags; limits{max_cost, max_runtime_s,
 *   max_tokens, stall_after_s, on_stall}; webhooks. */
int jobspec_parse(json_t *root, jobspec *out, ty_err *err);
/* Convenience: parse text. Invalid UTF-8 and malformed JSON (including
 * duplicate keys) return TY_ECORRUPT with line and column in err->msg and an
 * empty err->field; spec faults return TY_EINVAL as jobspec_parse. */
int jobspec_parse_text(const char *text, size_t len, jobspec *out, ty_err *err);
/* Every local path in the spec (model, train, eval, adapter; "/x" or
 * "file:///x") must lie under one of the colon-separated roots, also after
 * resolving symlinks where the path exists; remote URIs are not checked
 * here. NULL or "" means no restriction. TY_EINVAL with err->field. */
int jobspec_check_roots(const jobspec *s, const char *allowed_roots, ty_err *err);
/* A file:// checkpoint.store must lie under one of the colon-separated
 * store roots, also where its existing part leads through symlinks; NULL or
 * "" refuses every file:// store. Other stores pass. TY_EINVAL, field
 * "checkpoint.store". */
int jobspec_check_store_roots(const jobspec *s, const char *store_roots, ty_err *err);
void jobspec_free(jobspec *s);
/* A tags value (the spec's `tags`, PATCH's): an array of at most
 * JOBSPEC_MAX_TAGS unique strings of 1-64 characters of A-Z a-z 0-9 _ . : -.
 * TY_EINVAL naming field ("tags[2]"). */
int jobspec_check_tags(const json_t *tags, const char *field, ty_err *err);
const char *jobspec_on_stall_name(jobspec_on_stall o);

/* What each backend can run on this installation: bit sets over
 * jobspec_precision (1u << PREC_*). */
typedef struct jobspec_caps {
    unsigned cpu, cuda;
} jobspec_caps;
/* The CPU engine runs fp32, bf16 and fp16 (it is the reference for every
 * semantic a GPU will have); the CUDA backend the same where the
 * installation has CUDA GPUs (cuda_gpus > 0), nothing where it has none. */
jobspec_caps jobspec_default_caps(int cuda_gpus);
/* The precision against the backend the job will run on (auto: CUDA or,
 * failing that, the CPU). TY_EINVAL with err->field "precision" when that
 * backend cannot run it. Shared by the server (400 at submit)
 * and the engine (exit 2). */
int jobspec_check_precision(const jobspec *s, const jobspec_caps *caps, ty_err *err);
/* The spec back as JSON with every default filled in (what GET /jobs/{id}
 * shows); parsing it again gives the same struct. Caller owns the result. */
json_t *jobspec_to_json(const jobspec *s);
/* The field table as JSON, one object per row in order: path, type and
 * required, then as openapi.yaml words them minimum / exclusiveMinimum,
 * maximum / exclusiveMaximum, minLength / maxLength, maxItems, enum,
 * default, kind "path" (a DataPath) or "store", and omit_default where
 * jobspec_to_json leaves the default (or an empty array) out. What
 * tests/common holds against openapi.yaml's JobSpec and the parser.
 * Caller owns the result. */
json_t *jobspec_schema(void);

const char *jobspec_method_name(jobspec_method m);
/* lora.bias's values, indexed by JOBSPEC_BIAS_* (PEFT's LoraConfig.bias). */
extern const char *const jobspec_bias_names[3];
const char *jobspec_precision_name(jobspec_precision p);
const char *jobspec_backend_name(jobspec_backend b);
const char *jobspec_schedule_name(jobspec_schedule s);
const char *jobspec_recompute_name(jobspec_recompute r);
const char *jobspec_export_dtype_name(jobspec_export_dtype d);
const char *jobspec_format_name(jobspec_format f);

#endif
