/* generate.c — text generation and logits from a trained model.
 *
 *   trainyard-engine generate (--model DIR | --config FILE) [--weights FILE]
 *       [--adapter DIR] [--lora-r R --lora-alpha A --lora-targets a,b --lora-rslora]
 *       (--prompt TEXT | --prompt-ids "1 2 3") [--max-tokens N]
 *       [--temperature T] [--top-p P] [--seed S] [--stop STR]... [--ignore-eos]
 *       [--threads N] [--dtype auto|fp32|bf16|fp16]
 *   trainyard-engine logits  (same model options) --prompt-ids "..." [--kv]
 *
 * The model is read the way training reads it (hfconfig + model_load_dir),
 * then --weights replaces its weights (a checkpoint's model.safetensors) and
 * --adapter adds a PEFT adapter (adapter_config.json for r / lora_alpha /
 * target_modules unless --lora-* say them; a LoRA checkpoint has no config).
 * `generate` merges the adapter into the weights and decodes with the KV
 * cache (kvcache.h): greedy at temperature 0 (the first of equal maxima,
 * as torch.argmax), else softmax(logits / T) restricted to the smallest
 * set of most likely tokens whose mass reaches top_p, drawn with splitmix64
 * from --seed. It stops at the eos token (unless --ignore-eos), at a stop
 * string (the text is cut before it), or after --max-tokens. The result is
 * one JSON object on stdout:
 *   {"text", "ids", "prompt_tokens", "completion_tokens", "finish_reason":
 *    "eos"|"stop"|"length", "prefill_s", "decode_s", "tokens_per_s", "dtype"}
 * --dtype is the type the products read the weights in (kvcache.h): auto
 * (default) is the checkpoint's own, config.json's dtype / torch_dtype —
 * a bf16 or fp16 model generates in 16 bits, as transformers' dtype="auto"
 * loads it — else fp32. `logits --kv` takes it too; the training forward
 * (logits without --kv) is fp32.
 * `logits` prints {"logits": [[...], ...]} for every prompt position: by
 * the training forward with the adapter unmerged (model_forward), or with
 * --kv by feeding the cache one token at a time — the tests hold both to
 * transformers. Errors: an `error` event (events.h) and exit 1, or 2 for
 * bad usage. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "events.h"
#include "generate.h"
#include "hfconfig.h"
#include "kvcache.h"
#include "lora.h"
#include "model.h"
#include "rng.h"
#include "tokenizer.h"

#define MAX_STOPS 8
#define MAX_TARGETS 16

typedef struct gen_opts {
    const char *model_dir, *config, *weights, *adapter, *tokenizer;
    const char *prompt, *prompt_ids;
    const char *dtype; /* NULL = auto */
    int lora_r, rslora;
    double lora_alpha;
    char *targets[MAX_TARGETS];
    int n_targets;
    char targets_buf[1024];
    int max_tokens, threads, ignore_eos, kv;
    double temperature, top_p;
    unsigned long long seed;
    const char *stops[MAX_STOPS];
    int n_stops;
} gen_opts;

typedef struct gen_ctx {
    kn_ctx *kn;
    model m;
    int have_model;
    lora l;
    int have_lora;
    tok_tokenizer *tok;
    int32_t eos;
} gen_ctx;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int fail1(const char *what, const ty_err *e)
{
    char msg[1200];
    if (e->field[0])
        snprintf(msg, sizeof msg, "%s%s%s: %s", what ? what : "", what ? ": " : "", e->field,
                 e->msg);
    else
        snprintf(msg, sizeof msg, "%s%s%s", what ? what : "", what ? ": " : "", e->msg);
    ev_error(msg);
    return 1;
}

static void print_usage(FILE *f, const char *cmd)
{
    fprintf(
        f,
        "usage: trainyard-engine %s (--model DIR | --config FILE) [--weights FILE] "
        "[--adapter DIR] [--lora-r R --lora-alpha A --lora-targets a,b --lora-rslora] (--prompt TEXT | --prompt-ids IDS) "
        "[--max-tokens N] [--temperature T] [--top-p P] [--seed S] [--stop STR]... [--ignore-eos] "
        "[--threads N] [--dtype auto|fp32|bf16|fp16]%s\n",
        cmd, strcmp(cmd, "logits") ? "" : " [--kv]");
}

static int usage_err(const char *cmd, const char *msg)
{
    char line[600];
    snprintf(line, sizeof line, "%s: %s", cmd, msg);
    fprintf(stderr, "trainyard-engine %s\n", line);
    print_usage(stderr, cmd);
    ev_error(line);
    return 2;
}

static int parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

static int parse_args(const char *cmd, int argc, char **argv, gen_opts *o)
{
    memset(o, 0, sizeof *o);
    o->max_tokens = 64;
    o->top_p = 1.0;
    o->lora_alpha = NAN;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        double x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_usage(stdout, cmd);
            return -1; /* done: exit 0 */
        }
        if (!strcmp(a, "--ignore-eos")) {
            o->ignore_eos = 1;
            continue;
        }
        if (!strcmp(a, "--kv")) {
            o->kv = 1;
            continue;
        }
        if (!strcmp(a, "--lora-rslora")) {
            o->rslora = 1;
            continue;
        }
        if (i + 1 >= argc) {
            char msg[200];
            snprintf(msg, sizeof msg, "%s needs a value", a);
            return usage_err(cmd, msg);
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--model"))
            o->model_dir = v;
        else if (!strcmp(a, "--config"))
            o->config = v;
        else if (!strcmp(a, "--weights"))
            o->weights = v;
        else if (!strcmp(a, "--adapter"))
            o->adapter = v;
        else if (!strcmp(a, "--tokenizer"))
            o->tokenizer = v;
        else if (!strcmp(a, "--prompt"))
            o->prompt = v;
        else if (!strcmp(a, "--prompt-ids"))
            o->prompt_ids = v;
        else if (!strcmp(a, "--dtype")) {
            if (strcmp(v, "auto") && strcmp(v, "fp32") && strcmp(v, "bf16") && strcmp(v, "fp16"))
                return usage_err(cmd, "--dtype must be auto, fp32, bf16 or fp16");
            o->dtype = strcmp(v, "auto") ? v : NULL;
        } else if (!strcmp(a, "--stop")) {
            if (o->n_stops == MAX_STOPS) return usage_err(cmd, "at most 8 --stop strings");
            if (!*v) return usage_err(cmd, "--stop must not be empty");
            o->stops[o->n_stops++] = v;
        } else if (!strcmp(a, "--lora-targets")) {
            snprintf(o->targets_buf, sizeof o->targets_buf, "%s", v);
            for (char *t = strtok(o->targets_buf, ","); t; t = strtok(NULL, ",")) {
                if (o->n_targets == MAX_TARGETS) return usage_err(cmd, "at most 16 --lora-targets");
                o->targets[o->n_targets++] = t;
            }
        } else if (!strcmp(a, "--lora-r")) {
            if (parse_num(v, 1, 65536, &x) || x != floor(x))
                return usage_err(cmd, "--lora-r must be a positive integer");
            o->lora_r = (int)x;
        } else if (!strcmp(a, "--lora-alpha")) {
            if (parse_num(v, 1e-9, 1e9, &x))
                return usage_err(cmd, "--lora-alpha must be a positive number");
            o->lora_alpha = x;
        } else if (!strcmp(a, "--max-tokens")) {
            if (parse_num(v, 1, 1 << 20, &x) || x != floor(x))
                return usage_err(cmd, "--max-tokens must be a positive integer");
            o->max_tokens = (int)x;
        } else if (!strcmp(a, "--threads")) {
            if (parse_num(v, 1, 4096, &x) || x != floor(x))
                return usage_err(cmd, "--threads must be a positive integer");
            o->threads = (int)x;
        } else if (!strcmp(a, "--temperature")) {
            if (parse_num(v, 0, 100, &x))
                return usage_err(cmd, "--temperature must be a number in [0, 100]");
            o->temperature = x;
        } else if (!strcmp(a, "--top-p")) {
            if (parse_num(v, 1e-9, 1, &x)) return usage_err(cmd, "--top-p must be in (0, 1]");
            o->top_p = x;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (end == v || *end || errno)
                return usage_err(cmd, "--seed must be a non-negative integer");
        } else {
            char msg[200];
            snprintf(msg, sizeof msg, "unknown option %s", a);
            return usage_err(cmd, msg);
        }
    }
    if (!o->model_dir && !o->config)
        return usage_err(cmd, "one of --model DIR or --config FILE is required");
    if (!o->prompt == !o->prompt_ids)
        return usage_err(cmd, "one of --prompt or --prompt-ids is required");
    if (!o->model_dir && !o->weights)
        return usage_err(cmd, "--config needs --weights (a model.safetensors)");
    return 0;
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* The adapter: adapter_config.json (every PEFT field honoured or refused,
 * peftcfg.h), with --lora-* over it; without the file (a LoRA checkpoint
 * of an older engine) --lora-r and --lora-alpha say it all. */
static int adapter_cfg(const gen_opts *o, lora_cfg *c, ty_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", o->adapter);
    lora_cfg_default(c);
    if (!file_exists(path)) {
        if (o->lora_r < 1 || isnan(o->lora_alpha))
            return ty_err_set(err, TY_EINVAL,
                              "%s is missing: give --lora-r and --lora-alpha (and --lora-targets)",
                              path);
    } else {
        int rc = lora_cfg_load(c, path, err);
        if (rc) return rc;
    }
    if (o->lora_r >= 1) c->r = o->lora_r;
    if (!isnan(o->lora_alpha)) c->alpha = o->lora_alpha;
    if (o->rslora) c->use_rslora = 1;
    if (o->n_targets) {
        c->n_targets = 0;
        c->target_regex[0] = 0;
        c->all_linear = 0;
        for (int i = 0; i < o->n_targets; i++)
            snprintf(c->targets[c->n_targets++], LORA_NAME_MAX, "%s", o->targets[i]);
    }
    return 0;
}

static int load(gen_ctx *g, gen_opts *o, int lora_hooks)
{
    ty_err err = {0};
    model_config cfg;
    int rc;
    if (o->config) {
        json_error_t je;
        json_t *j = json_load_file(o->config, 0, &je);
        if (!j)
            return ty_err_set(&err, TY_EINVAL, "%s: %s (line %d)", o->config, je.text, je.line),
                   fail1(NULL, &err);
        rc = hfconfig_parse(j, o->config, &cfg, &err);
        json_decref(j);
    } else {
        rc = hfconfig_load_dir(o->model_dir, &cfg, &err);
    }
    if (rc) return fail1(NULL, &err);
    if (kn_open(&g->kn, KN_CPU, 0, o->threads, &err)) {
        hfconfig_free(&cfg);
        return fail1("backend", &err);
    }
    rc = model_create_ex(&g->m, &cfg, g->kn, 1, &err);
    g->have_model = 1;
    if (rc) return fail1(NULL, &err);
    if (o->weights)
        rc = model_load_file(&g->m, o->weights, &err);
    else
        rc = model_load_dir(&g->m, o->model_dir, &err);
    if (rc) return fail1(NULL, &err);
    if (o->adapter) {
        lora_cfg lc;
        /* An adapter this engine cannot run as written: exit 2, as a spec's. */
        if ((rc = adapter_cfg(o, &lc, &err))) return fail1("adapter", &err) + (rc == TY_ESPEC);
        rc = lora_create(&g->l, &g->m, &lc, &err);
        g->have_lora = 1;
        if (rc) return fail1("adapter", &err) + (rc == TY_ESPEC);
        char path[4200];
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", o->adapter);
        if (lora_load(&g->l, path, &err)) return fail1("adapter", &err);
        if (lora_hooks)
            lora_attach(&g->l, &g->m);
        else if (lora_merge(&g->l, &g->m, &err))
            return fail1("adapter", &err);
    }
    /* The tokenizer: --tokenizer, else the model directory when it has one. */
    const char *tdir = o->tokenizer ? o->tokenizer : o->model_dir;
    char tpath[4200];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", tdir ? tdir : "");
    g->eos = -1;
    if (tdir && (o->tokenizer || file_exists(tpath))) {
        if (tok_load(&g->tok, tdir, &err)) return fail1("tokenizer", &err);
        g->eos = tok_eos(g->tok);
    }
    if (g->eos < 0) { /* config.json's eos_token_id (the first of a list) */
        json_t *e = json_object_get(g->m.cfg.raw, "eos_token_id");
        if (json_is_array(e)) e = json_array_get(e, 0);
        if (json_is_integer(e)) g->eos = (int32_t)json_integer_value(e);
    }
    return 0;
}

/* The products' weight type: --dtype, else the checkpoint's (config.json's
 * dtype, or torch_dtype as transformers 4 wrote it). */
static kn_dtype weight_dtype(const gen_opts *o, const model *m)
{
    const char *d = o->dtype;
    if (!d) {
        json_t *j = json_object_get(m->cfg.raw, "dtype");
        if (!json_is_string(j)) j = json_object_get(m->cfg.raw, "torch_dtype");
        const char *own = json_string_value(j);
        d = own && !strcmp(own, "bfloat16")  ? "bf16"
            : own && !strcmp(own, "float16") ? "fp16"
                                             : "fp32";
    }
    return !strcmp(d, "bf16") ? KN_BF16 : !strcmp(d, "fp16") ? KN_F16 : KN_F32;
}

static void unload(gen_ctx *g)
{
    if (g->have_lora) lora_free(&g->l);
    if (g->have_model) model_free(&g->m);
    if (g->kn) kn_close(g->kn);
    tok_free(g->tok);
}

/* The prompt as ids: --prompt-ids, or --prompt through the tokenizer with
 * the specials it adds (bos), as transformers' tokenizer(prompt) does. */
static int prompt_ids(gen_ctx *g, const gen_opts *o, int32_t **ids, size_t *n)
{
    ty_err err = {0};
    if (o->prompt) {
        if (!g->tok)
            return ty_err_set(
                       &err, TY_EINVAL,
                       "--prompt needs a tokenizer.json (the model directory has none; use --tokenizer DIR or --prompt-ids)"),
                   fail1(NULL, &err);
        if (tok_encode(g->tok, o->prompt, strlen(o->prompt), 1, ids, n, &err))
            return fail1("prompt", &err);
    } else {
        size_t cap = 16;
        *n = 0;
        *ids = malloc(cap * sizeof **ids);
        const char *p = o->prompt_ids;
        while (*ids) {
            while (*p == ' ' || *p == ',')
                p++;
            if (!*p) break;
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v >= g->m.cfg.vocab) {
                free(*ids);
                *ids = NULL; /* the caller frees ids too */
                return ty_err_set(&err, TY_EINVAL,
                                  "--prompt-ids: \"%.20s\" is not a token id in [0, %d)", p,
                                  g->m.cfg.vocab),
                       fail1(NULL, &err);
            }
            if (*n == cap) {
                int32_t *t = realloc(*ids, (cap *= 2) * sizeof *t);
                if (!t) free(*ids);
                *ids = t;
                if (!t) break;
            }
            (*ids)[(*n)++] = (int32_t)v;
            p = end;
        }
        if (!*ids) return ty_err_set(&err, TY_ENOMEM, "out of memory"), fail1(NULL, &err);
    }
    if (*n == 0) {
        free(*ids);
        *ids = NULL; /* the caller frees ids too */
        return ty_err_set(&err, TY_EINVAL, "the prompt is empty (no tokens)"), fail1(NULL, &err);
    }
    for (size_t i = 0; i < *n; i++) {
        if ((*ids)[i] >= g->m.cfg.vocab) {
            free(*ids);
            *ids = NULL; /* the caller frees ids too */
            return ty_err_set(&err, TY_EINVAL,
                              "the prompt's token %d is outside the model's vocabulary of %d",
                              (int)(*ids)[i], g->m.cfg.vocab),
                   fail1(NULL, &err);
        }
    }
    return 0;
}

typedef struct cand {
    float p;
    int id;
} cand;

static int cand_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

/* Greedy at temperature 0, else top-p sampling of softmax(logits / T). */
static int sample(const float *logits, int V, double temperature, double top_p, uint64_t *rng,
                  cand *buf)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        buf[i].p = (float)exp((logits[i] - logits[best]) / temperature);
        buf[i].id = i;
        sum += buf[i].p;
    }
    qsort(buf, (size_t)V, sizeof *buf, cand_desc);
    int keep = V;
    double mass = 0;
    for (int i = 0; i < V; i++) {
        mass += buf[i].p / sum;
        if (mass >= top_p) {
            keep = i + 1;
            break;
        }
    }
    double kept = 0;
    for (int i = 0; i < keep; i++)
        kept += buf[i].p;
    double u = rng_unit(rng) * kept;
    for (int i = 0; i < keep; i++) {
        u -= buf[i].p;
        if (u < 0) return buf[i].id;
    }
    return buf[keep - 1].id;
}

/* Where the first stop string starts in text, or -1. */
static long find_stop(const gen_opts *o, const char *text, size_t len)
{
    long at = -1;
    for (int s = 0; s < o->n_stops; s++) {
        size_t sl = strlen(o->stops[s]);
        for (size_t i = 0; i + sl <= len; i++) {
            if (!memcmp(text + i, o->stops[s], sl)) {
                if (at < 0 || (long)i < at) at = (long)i;
                break;
            }
        }
    }
    return at;
}

int generate_main(int argc, char **argv)
{
    gen_opts o;
    ev_init(0);
    int rc = parse_args("generate", argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    gen_ctx g = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    cand *buf = NULL;
    char *text = NULL;
    size_t tlen = 0;
    kv_cache kv = {0};
    ty_err err = {0};
    if ((rc = load(&g, &o, 0)) || (rc = prompt_ids(&g, &o, &ids, &n))) goto out;
    if (o.n_stops && !g.tok) {
        rc = usage_err("generate", "--stop needs a tokenizer (the model has no tokenizer.json)");
        goto out;
    }
    const model_config *c = &g.m.cfg;
    long total = (long)n + o.max_tokens;
    if (total > c->max_pos) {
        ty_err_set(&err, TY_EINVAL,
                   "%zu prompt tokens + %d new tokens exceed the model's %d positions", n,
                   o.max_tokens, c->max_pos);
        rc = fail1(NULL, &err);
        goto out;
    }
    if (c->sliding_window && total > c->sliding_window) {
        ty_err_set(
            &err, TY_EINVAL,
            "%zu prompt tokens + %d new tokens exceed the model's sliding_window %d (not supported)",
            n, o.max_tokens, c->sliding_window);
        rc = fail1(NULL, &err);
        goto out;
    }
    if (kv_create(&kv, &g.m, (int)total, (int)n, &err) ||
        kv_set_weights(&kv, weight_dtype(&o, &g.m), &err)) {
        rc = fail1(NULL, &err);
        goto out;
    }
    buf = malloc((size_t)c->vocab * sizeof *buf);
    int32_t *out_ids = realloc(ids, (size_t)total * sizeof *out_ids);
    if (!buf || !out_ids) {
        ty_err_set(&err, TY_ENOMEM, "out of memory");
        rc = fail1(NULL, &err);
        goto out;
    }
    ids = out_ids;
    uint64_t rng = o.seed ^ 0x67656e6572617465ULL; /* "generate" */
    const char *finish = "length";
    double t0 = now_s();
    const float *logits = kv_step(&kv, ids, (int)n, &err);
    double t1 = now_s(), t2 = t1;
    int produced = 0;
    long cut = -1;
    while (logits) {
        int next = sample(logits, c->vocab, o.temperature, o.top_p, &rng, buf);
        if (!o.ignore_eos && next == g.eos) {
            finish = "eos";
            break;
        }
        ids[n + produced++] = next;
        if (o.n_stops) {
            free(text);
            text = NULL;
            if (tok_decode(g.tok, ids + n, (size_t)produced, &text, &tlen, &err)) break;
            if ((cut = find_stop(&o, text, tlen)) >= 0) {
                finish = "stop";
                break;
            }
        }
        if (produced == o.max_tokens) break;
        logits = kv_step(&kv, ids + n + produced - 1, 1, &err);
        t2 = now_s();
    }
    t2 = now_s();
    if (err.msg[0]) {
        rc = fail1(NULL, &err);
        goto out;
    }
    if (g.tok && !text && tok_decode(g.tok, ids + n, (size_t)produced, &text, &tlen, &err)) {
        rc = fail1("decode", &err);
        goto out;
    }
    if (cut >= 0) tlen = (size_t)cut;
    json_t *res = json_object();
    json_t *jids = json_array();
    for (int i = 0; i < produced; i++)
        json_array_append_new(jids, json_integer(ids[n + i]));
    json_object_set_new(res, "text", text ? json_stringn(text, tlen) : json_null());
    json_object_set_new(res, "ids", jids);
    json_object_set_new(res, "prompt_tokens", json_integer((json_int_t)n));
    json_object_set_new(res, "completion_tokens", json_integer(produced));
    json_object_set_new(res, "finish_reason", json_string(finish));
    json_object_set_new(res, "prefill_s", json_real(t1 - t0));
    json_object_set_new(res, "decode_s", json_real(t2 - t1));
    json_object_set_new(res, "tokens_per_s",
                        json_real(produced > 1 && t2 > t1 ? (produced - 1) / (t2 - t1) : 0));
    json_object_set_new(res, "dtype", json_string(kn_dtype_name(g.m.wdt)));
    char *s = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(res);
    if (s) {
        printf("%s\n", s);
        free(s);
    }
    fflush(stdout);
out:
    kv_free(&kv);
    free(buf);
    free(text);
    free(ids);
    unload(&g);
    return rc;
}

static void print_row(const float *row, int V, int first)
{
    printf(first ? "[" : ",[");
    for (int j = 0; j < V; j++)
        printf(j ? ",%.9g" : "%.9g", row[j]);
    printf("]");
}

int logits_main(int argc, char **argv)
{
    gen_opts o;
    ev_init(0);
    int rc = parse_args("logits", argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    gen_ctx g = {0};
    int32_t *ids = NULL, *targets = NULL;
    size_t n = 0;
    ty_err err = {0};
    kv_cache kv = {0};
    if (!o.kv && o.dtype && strcmp(o.dtype, "fp32")) {
        rc = usage_err("logits", "--dtype bf16 / fp16 needs --kv (the training forward is fp32)");
        goto out;
    }
    if ((rc = load(&g, &o, !o.kv)) || (rc = prompt_ids(&g, &o, &ids, &n))) goto out;
    const model_config *c = &g.m.cfg;
    if ((long)n > c->max_pos) {
        ty_err_set(&err, TY_EINVAL, "%zu tokens exceed the model's %d positions", n, c->max_pos);
        rc = fail1(NULL, &err);
        goto out;
    }
    int V = c->vocab;
    printf("{\"logits\":[");
    if (o.kv) {
        if (kv_create(&kv, &g.m, (int)n, 1, &err) ||
            kv_set_weights(&kv, weight_dtype(&o, &g.m), &err)) {
            rc = fail1(NULL, &err);
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            const float *l = kv_step(&kv, ids + i, 1, &err);
            if (!l) {
                rc = fail1(NULL, &err);
                goto out;
            }
            print_row(l, V, i == 0);
        }
    } else {
        targets = malloc(n * sizeof *targets);
        if (!targets) {
            rc = 1;
            goto out;
        }
        for (size_t i = 0; i < n; i++)
            targets[i] = -100;
        g.m.ce_rows = (int)n; /* every row's logits are printed: keep them all */
        if (model_alloc_acts(&g.m, 1, (int)n, MODEL_RECOMPUTE_NONE, &err) ||
            (g.have_lora && g.m.adapter.state && lora_alloc_acts(&g.l, 1, (int)n, &err))) {
            rc = fail1(NULL, &err);
            goto out;
        }
        g.l.training = 0;
        model_forward(&g.m, ids, targets, 1, (int)n);
        if (kn_check(g.kn, &err)) {
            rc = fail1(NULL, &err);
            goto out;
        }
        size_t ld = (size_t)g.m.logit_ld;
        float *host = malloc((size_t)n * ld * sizeof *host);
        if (!host) {
            rc = 1;
            goto out;
        }
        /* the training path folds Gemma 2's final soft-cap into the loss */
        kn_softcap(g.kn, g.m.logits, (size_t)n * ld, c->final_softcap);
        kn_to_host(g.kn, host, g.m.logits, (size_t)n * ld * sizeof *host);
        for (size_t i = 0; i < n; i++) /* rows ld apart: the device's padding */
            print_row(host + i * ld, V, i == 0);
        free(host);
    }
    printf("]}\n");
    fflush(stdout);
out:
    kv_free(&kv);
    free(ids);
    free(targets);
    unload(&g);
    return rc;
}
