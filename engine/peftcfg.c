/* peftcfg.c — adapter_config.json: the field table, the reader and writer,
 * and PEFT's module matching (tuners_utils.check_target_module_exists,
 * utils.other.get_pattern_key). */
#include "peftcfg.h"

#include <ctype.h>
#include <math.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>

#include "tyutil.h"

/* ---- the field table ------------------------------------------------------ */

typedef enum {
    PF_READ,   /* honoured: read and applied exactly */
    PF_IGNORE, /* cannot change the adapter's output here (why says why) */
    PF_ONLY,   /* refused unless one of `allowed` (JSON texts, '|' between) */
} pf_kind;

typedef struct peft_field {
    const char *name;
    pf_kind kind;
    const char *allowed;
    const char *why;
} peft_field;

/* Every key PEFT 0.21's LoraConfig writes. tests/hf/peft_check.py fails
 * when PEFT writes a key that is not here. */
static const peft_field peft_fields[] = {
    {"r", PF_READ, NULL, "the rank of every adapter without a rank_pattern entry"},
    {"lora_alpha", PF_READ, NULL, "alpha of every adapter without an alpha_pattern entry"},
    {"use_rslora", PF_READ, NULL, "true scales by alpha / sqrt(r) instead of alpha / r"},
    {"target_modules", PF_READ, NULL,
     "a list (path equal to a name or ending in .name), a regex (the whole path), or all-linear"},
    {"exclude_modules", PF_READ, NULL, "modules never targeted, matched as target_modules"},
    {"rank_pattern", PF_READ, NULL, "per-module r: the first key matching the path's tail"},
    {"alpha_pattern", PF_READ, NULL, "per-module alpha: the first key matching the path's tail"},
    {"layers_to_transform", PF_READ, NULL, "only these layer indices (with a target_modules list)"},
    {"layers_pattern", PF_READ, NULL, "the name before the layer index (plain names only)"},
    {"peft_type", PF_ONLY, "\"LORA\"", "only LoRA adapters"},
    {"task_type", PF_ONLY, "null|\"CAUSAL_LM\"", "other tasks add heads the engine does not have"},
    {"bias", PF_READ, NULL,
     "none; lora_only: the targeted modules' biases train too; all: every bias of the model; "
     "the trained ones are in the adapter file"},
    {"use_dora", PF_READ, NULL,
     "DoRA: each target's output scaled per row by its lora_magnitude_vector over the norm of "
     "W + s B A (linear targets; not the embedding)"},
    {"modules_to_save", PF_READ, NULL,
     "modules trained whole (a module whose path ends in a name); not the tied embedding, not "
     "a Conv1D weight"},
    {"init_lora_weights", PF_ONLY, "true|false|\"gaussian\"",
     "these set only A and B, which the file replaces; the others (pissa, olora, corda, eva, "
     "loftq, ...) also rewrite the base weights"},
    {"loftq_config", PF_ONLY, "{}|null", "LoftQ rewrites the base weights"},
    {"eva_config", PF_ONLY, "null", "EVA initialisation is not supported"},
    {"corda_config", PF_ONLY, "null", "CorDA rewrites the base weights"},
    {"lora_ga_config", PF_ONLY, "null", "LoRA-GA initialisation is not supported"},
    {"megatron_config", PF_ONLY, "null", "Megatron parallel layers are not supported"},
    {"trainable_token_indices", PF_ONLY, "null", "trainable embedding rows are not supported"},
    {"velora_config", PF_ONLY, "null", "VeLoRA is not supported"},
    {"alora_invocation_tokens", PF_ONLY, "null", "activated LoRA is not supported"},
    {"use_qalora", PF_ONLY, "false", "QA-LoRA is not supported"},
    {"monteclora_config", PF_ONLY, "null", "MonteCLoRA is not supported"},
    {"layer_replication", PF_ONLY, "null", "replicated layers are not supported"},
    {"lora_bias", PF_ONLY, "false", "a bias on lora_B is not supported"},
    {"target_parameters", PF_ONLY, "null|[]", "adapters on bare parameters are not supported"},
    {"use_bdlora", PF_ONLY, "null|false", "block-diagonal LoRA is not supported"},
    {"arrow_config", PF_ONLY, "null", "Arrow routing is not supported"},
    {"kasa_config", PF_ONLY, "null", "KaSA is not supported"},
    {"base_model_name_or_path", PF_IGNORE, NULL, "the base is model.path / --model"},
    {"revision", PF_IGNORE, NULL, "the base model's hub revision; the base is a local directory"},
    {"peft_version", PF_IGNORE, NULL, "which PEFT wrote the file"},
    {"auto_mapping", PF_IGNORE, NULL, "the PEFT class to load with; the arithmetic is LoRA's"},
    {"inference_mode", PF_IGNORE, NULL, "frozen or trainable in PEFT; the same output"},
    {"lora_dropout", PF_IGNORE, NULL, "off when generating; training uses lora.dropout"},
    {"fan_in_fan_out", PF_IGNORE, NULL,
     "PEFT sets it per layer type (true for Conv1D, false for Linear); the tensors are the same"},
    {"megatron_core", PF_IGNORE, NULL, "used only with megatron_config, which is refused"},
    {"qalora_group_size", PF_IGNORE, NULL, "used only with use_qalora, which is refused"},
    {"ensure_weight_tying", PF_IGNORE, NULL,
     "ties a saved copy of the embeddings to the head; a tied embedding in modules_to_save is "
     "refused, trainable tokens too; on a tied embedding target PEFT adds lm_head adapters, "
     "whose tensors the adapter file then holds and loading refuses by name"},
};

#define N_FIELDS (sizeof peft_fields / sizeof peft_fields[0])

static const peft_field *find_field(const char *name)
{
    for (size_t i = 0; i < N_FIELDS; i++)
        if (!strcmp(peft_fields[i].name, name)) return &peft_fields[i];
    return NULL;
}

void peft_fields_print(FILE *f)
{
    for (size_t i = 0; i < N_FIELDS; i++) {
        const peft_field *p = &peft_fields[i];
        fprintf(f, "%s\t%s%s\t%s\n", p->name,
                p->kind == PF_READ     ? "honoured"
                : p->kind == PF_IGNORE ? "ignored"
                                       : "refused unless ",
                p->kind == PF_ONLY ? p->allowed : "", p->why);
    }
}

/* Whether v equals one of the '|'-separated JSON texts. */
static int allowed_value(const json_t *v, const char *allowed)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", allowed);
    for (char *save = NULL, *t = strtok_r(buf, "|", &save); t; t = strtok_r(NULL, "|", &save)) {
        json_t *a = json_loads(t, JSON_DECODE_ANY, NULL);
        int eq = a && json_equal(a, (json_t *)v);
        json_decref(a);
        if (eq) return 1;
    }
    return 0;
}

static void value_text(const json_t *v, char *out, size_t n)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    snprintf(out, n, "%.80s%s", s ? s : "?", s && strlen(s) > 80 ? "..." : "");
    free(s);
}

/* ---- Python's re, carried over to POSIX ERE ------------------------------ */

typedef struct sbuf {
    char *p;
    size_t n, len;
    int over;
} sbuf;

static void put(sbuf *b, const char *s)
{
    size_t k = strlen(s);
    if (b->len + k + 1 > b->n) {
        b->over = 1;
        return;
    }
    memcpy(b->p + b->len, s, k + 1);
    b->len += k;
}

static void putc1(sbuf *b, char c)
{
    char s[2] = {c, 0};
    put(b, s);
}

/* One bracket expression from s (at '['); returns the end (after ']') or
 * NULL with *why. Inside brackets POSIX takes '\' literally, so Python's
 * escapes become the characters they stand for. */
static const char *bracket(const char *s, sbuf *b, const char **why)
{
    put(b, "[");
    s++;
    if (*s == '^') putc1(b, *s++);
    if (*s == ']') putc1(b, *s++);
    for (; *s && *s != ']'; s++) {
        if (*s == '[' && (s[1] == ':' || s[1] == '.' || s[1] == '='))
            return *why = "[: [. [= inside a set mean other things in POSIX", NULL;
        if (*s != '\\') {
            putc1(b, *s);
            continue;
        }
        char c = *++s;
        if (c == 'd')
            put(b, "0-9");
        else if (c == 'w')
            put(b, "A-Za-z0-9_");
        else if (c == 's')
            put(b, " \t\n\r\f\v");
        else if (c && ispunct((unsigned char)c) && !strchr("]\\^-[", c))
            putc1(b, c);
        else
            return *why = "that escape inside [...] has no exact POSIX form", NULL;
    }
    if (*s != ']') return *why = "unterminated [", NULL;
    put(b, "]");
    return s + 1;
}

/* A quantifier's {m,n} (Python's {,n} is {0,n}); anything else is a literal
 * brace in Python. Returns the end, or s when it is not a quantifier. */
static const char *braces(const char *s, sbuf *b)
{
    const char *q = s + 1;
    while (isdigit((unsigned char)*q))
        q++;
    int lo = q > s + 1;
    if (*q == ',') {
        q++;
        while (isdigit((unsigned char)*q))
            q++;
    }
    if (*q != '}' || (!lo && q == s + 2)) return s;
    put(b, "{");
    if (!lo) put(b, "0");
    for (const char *t = s + 1; t <= q; t++)
        putc1(b, *t);
    return q + 1;
}

static int py_to_ere(const char *py, sbuf *b, const char **why)
{
    for (const char *s = py; *s;) {
        char c = *s;
        if (c == '[') {
            if (!(s = bracket(s, b, why))) return -1;
        } else if (c == '\\') {
            char e = s[1];
            static const char *const cls[][2] = {{"d", "[0-9]"},        {"D", "[^0-9]"},
                                                 {"w", "[A-Za-z0-9_]"}, {"W", "[^A-Za-z0-9_]"},
                                                 {"s", "[[:space:]]"},  {"S", "[^[:space:]]"}};
            int done = 0;
            for (size_t k = 0; k < sizeof cls / sizeof cls[0] && !done; k++)
                if (e == cls[k][0][0]) put(b, cls[k][1]), done = 1;
            if (!done) {
                if (!e || !ispunct((unsigned char)e))
                    return *why =
                               "an escape like \\b, \\A or a back-reference has no exact POSIX form",
                           -1;
                if (strchr(".[]{}()*+?^$|\\", e)) putc1(b, '\\');
                putc1(b, e);
            }
            s += 2;
        } else if (c == '(' && s[1] == '?') {
            if (s[2] != ':') return *why = "(?...) other than (?:...) has no exact POSIX form", -1;
            put(b, "(");
            s += 3;
        } else if (c == '{') {
            const char *t = braces(s, b);
            if (t == s) put(b, "\\{"), t = s + 1;
            s = t;
            if (t[-1] == '}' && *s == '?') s++; /* lazy: the same full matches */
        } else {
            putc1(b, c);
            s++;
            if (c == '*' || c == '+' || c == '?') {
                if (*s == '+') return *why = "possessive quantifiers have no POSIX form", -1;
                if (*s == '?') s++; /* lazy: the same full matches */
            }
        }
    }
    return b->over ? (*why = "too long", -1) : 0;
}

/* Compiles "^<prefix>(<py>)$" (prefix "(.*\.)?" for pattern keys). */
static int compile(regex_t *re, const char *prefix, const char *py, const char **why)
{
    char out[4 * LORA_REGEX_MAX];
    sbuf b = {out, sizeof out, 0, 0};
    out[0] = 0;
    put(&b, "^");
    put(&b, prefix);
    put(&b, "(");
    if (py_to_ere(py, &b, why)) return -1;
    put(&b, ")$");
    if (b.over) return *why = "too long", -1;
    if (regcomp(re, out, REG_EXTENDED | REG_NOSUB))
        return *why = "not a valid regular expression", -1;
    return 0;
}

static int regex_full(const char *py, const char *prefix, const char *s)
{
    regex_t re;
    const char *why;
    if (compile(&re, prefix, py, &why)) return 0; /* checked when read */
    int hit = regexec(&re, s, 0, NULL, 0) == 0;
    regfree(&re);
    return hit;
}

static int check_regex(const char *py, const char *prefix, const char *path, const char *field,
                       ty_err *err)
{
    regex_t re;
    const char *why = "";
    if (compile(&re, prefix, py, &why))
        return ty_err_field(err, TY_ESPEC, field, "%s: %s \"%.100s\": %s", path, field, py, why);
    regfree(&re);
    return 0;
}

/* ---- matching -------------------------------------------------------------- */

static int ends_with_dot(const char *module, const char *name)
{
    size_t n = strlen(module), t = strlen(name);
    return n > t && module[n - t - 1] == '.' && !strcmp(module + n - t, name);
}

int lora_name_matches(const char *module, const char *name)
{
    return !strcmp(module, name) || ends_with_dot(module, name);
}

/* The layer index PEFT reads from a path: the first ".<name>.<digits>."
 * (any name without layers_pattern, else one of its names, which may also
 * start the path). -1 when there is none. */
static long layer_index(const lora_cfg *c, const char *module)
{
    for (const char *p = module; *p; p++) {
        int start = p == module, after_dot = p > module && p[-1] == '.';
        if (!start && !after_dot) continue;
        const char *q = NULL;
        if (c->n_layers_pattern == 0) {
            if (!after_dot) continue;
            q = strchr(p, '.'); /* the [^.]* segment */
            if (q) q++;
        } else {
            for (int k = 0; k < c->n_layers_pattern && !q; k++) {
                size_t L = strlen(c->layers_pattern[k]);
                if (!strncmp(p, c->layers_pattern[k], L) && p[L] == '.') q = p + L + 1;
            }
        }
        if (!q || !isdigit((unsigned char)*q)) continue;
        const char *d = q;
        while (isdigit((unsigned char)*d))
            d++;
        if (*d == '.') return strtol(q, NULL, 10);
    }
    return -1;
}

int lora_cfg_targets(const lora_cfg *c, const char *module, int *which)
{
    *which = -1;
    if (c->exclude_regex[0] && regex_full(c->exclude_regex, "", module)) return 0;
    for (int k = 0; k < c->n_exclude; k++)
        if (!strcmp(module, c->exclude[k]) || ends_with_dot(module, c->exclude[k])) return 0;
    if (c->all_linear) return 1;
    if (c->target_regex[0]) return regex_full(c->target_regex, "", module);
    for (int k = 0; k < c->n_targets; k++) /* a whole path: no layer filter */
        if (!strcmp(module, c->targets[k])) return *which = k, 1;
    int hit = -1;
    for (int k = 0; k < c->n_targets && hit < 0; k++)
        if (ends_with_dot(module, c->targets[k])) hit = k;
    if (hit < 0) return 0;
    *which = hit;
    if (c->n_layers == 0) return 1;
    long ix = layer_index(c, module);
    for (int k = 0; ix >= 0 && k < c->n_layers; k++)
        if (c->layers[k] == ix) return 1;
    return 0;
}

static const lora_pattern *pattern_for(const lora_pattern *p, int n, const char *module)
{
    for (int k = 0; k < n; k++)
        if (regex_full(p[k].key, "(.*\\.)?", module)) return &p[k];
    return NULL;
}

int lora_cfg_rank(const lora_cfg *c, const char *module)
{
    const lora_pattern *p = pattern_for(c->rank_pattern, c->n_rank_pattern, module);
    return p ? (int)p->value : c->r;
}

double lora_cfg_alpha(const lora_cfg *c, const char *module)
{
    const lora_pattern *p = pattern_for(c->alpha_pattern, c->n_alpha_pattern, module);
    return p ? p->value : c->alpha;
}

float lora_cfg_scale(const lora_cfg *c, int r, double alpha)
{
    return (float)(c->use_rslora ? alpha / sqrt((double)r) : alpha / r);
}

/* ---- reading ---------------------------------------------------------------- */

void lora_cfg_default(lora_cfg *c)
{
    memset(c, 0, sizeof *c);
    c->r = 8;
    c->alpha = 8;
}

/* A JSON list of names into names / n. */
static int read_names(const json_t *v, char (*names)[LORA_NAME_MAX], int max, int *n,
                      const char *path, const char *field, ty_err *err)
{
    size_t i;
    json_t *e;
    if (json_array_size(v) > (size_t)max)
        return ty_err_field(err, TY_ESPEC, field, "%s: %s: at most %d names", path, field, max);
    json_array_foreach(v, i, e)
    {
        const char *s = json_string_value(e);
        if (!s || !*s || strlen(s) >= LORA_NAME_MAX)
            return ty_err_field(err, TY_EINVAL, field,
                                "%s: %s[%zu] must be a name of 1-%d characters", path, field, i,
                                LORA_NAME_MAX - 1);
        snprintf(names[(*n)++], LORA_NAME_MAX, "%s", s);
    }
    return 0;
}

/* target_modules / exclude_modules: null, a regex string or a list. */
static int read_modules(const json_t *v, char (*names)[LORA_NAME_MAX], int *n, char *regex,
                        int *all_linear, const char *path, const char *field, ty_err *err)
{
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (all_linear && !strcasecmp(s, "all-linear")) return *all_linear = 1, 0;
        if (strlen(s) >= LORA_REGEX_MAX)
            return ty_err_field(err, TY_ESPEC, field, "%s: %s: a regex of at most %d characters",
                                path, field, LORA_REGEX_MAX - 1);
        snprintf(regex, LORA_REGEX_MAX, "%s", s);
        return check_regex(s, "", path, field, err);
    }
    if (!json_is_array(v))
        return ty_err_field(err, TY_EINVAL, field, "%s: %s must be a list of names or a regex",
                            path, field);
    return read_names(v, names, LORA_MAX_TARGETS, n, path, field, err);
}

static int read_pattern(const json_t *v, lora_pattern *p, int *n, int integer, const char *path,
                        const char *field, ty_err *err)
{
    const char *key;
    json_t *x;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v))
        return ty_err_field(err, TY_EINVAL, field, "%s: %s must be an object", path, field);
    if (json_object_size(v) > LORA_MAX_PATTERNS)
        return ty_err_field(err, TY_ESPEC, field, "%s: %s: at most %d keys", path, field,
                            LORA_MAX_PATTERNS);
    /* Objects keep the file's order, which is the order PEFT tries the keys. */
    json_object_foreach((json_t *)v, key, x)
    {
        int ok = integer ? json_is_integer(x) && json_integer_value(x) >= 1
                         : json_is_number(x) && isfinite(json_number_value(x));
        if (!ok)
            return ty_err_field(err, TY_EINVAL, field, "%s: %s[\"%.60s\"] must be %s", path, field,
                                key, integer ? "a positive integer" : "a number");
        if (strlen(key) >= LORA_NAME_MAX)
            return ty_err_field(err, TY_ESPEC, field, "%s: %s: a key of at most %d characters",
                                path, field, LORA_NAME_MAX - 1);
        int rc = check_regex(key, "(.*\\.)?", path, field, err);
        if (rc) return rc;
        snprintf(p[*n].key, LORA_NAME_MAX, "%s", key);
        p[(*n)++].value = integer ? (double)json_integer_value(x) : json_number_value(x);
    }
    return 0;
}

static int read_layers(lora_cfg *c, const json_t *lt, const json_t *lp, const char *path,
                       ty_err *err)
{
    if (json_is_integer(lt)) {
        c->layers[c->n_layers++] = (int)json_integer_value(lt);
        c->layers_int = 1;
    } else if (json_is_array(lt)) {
        size_t i;
        json_t *e;
        if (json_array_size(lt) > LORA_MAX_LAYERS)
            return ty_err_field(err, TY_ESPEC, "layers_to_transform",
                                "%s: layers_to_transform: at most %d layers", path,
                                LORA_MAX_LAYERS);
        json_array_foreach(lt, i, e)
        {
            if (!json_is_integer(e))
                return ty_err_field(err, TY_EINVAL, "layers_to_transform",
                                    "%s: layers_to_transform[%zu] must be an integer", path, i);
            c->layers[c->n_layers++] = (int)json_integer_value(e);
        }
    } else if (lt && !json_is_null(lt)) {
        return ty_err_field(err, TY_EINVAL, "layers_to_transform",
                            "%s: layers_to_transform must be an integer or a list of them", path);
    }
    if (!lp || json_is_null(lp)) return 0;
    json_t *one = json_is_string(lp) ? json_pack("[O]", lp) : json_incref((json_t *)lp);
    int rc = json_is_array(one) ? 0
                                : ty_err_field(err, TY_EINVAL, "layers_pattern",
                                               "%s: layers_pattern must be a name or a list", path);
    size_t i;
    json_t *e;
    if (!rc && json_array_size(one) > 8)
        rc = ty_err_field(err, TY_ESPEC, "layers_pattern", "%s: layers_pattern: at most 8 names",
                          path);
    json_array_foreach(one, i, e)
    {
        const char *s = json_string_value(e);
        size_t L = s ? strlen(s) : 0;
        for (size_t k = 0; s && k < L; k++)
            if (!isalnum((unsigned char)s[k]) && s[k] != '_') s = NULL;
        if (rc || !s || !L || L >= 64) {
            rc = rc ? rc
                    : ty_err_field(err, TY_ESPEC, "layers_pattern",
                                   "%s: layers_pattern[%zu]: only plain names (letters, digits, _) "
                                   "are supported",
                                   path, i);
            break;
        }
        snprintf(c->layers_pattern[c->n_layers_pattern++], 64, "%s", s);
    }
    json_decref(one);
    if (!rc && c->n_layers_pattern && !c->n_layers)
        rc = ty_err_field(err, TY_EINVAL, "layers_pattern",
                          "%s: layers_pattern needs layers_to_transform", path);
    return rc;
}

/* Every key against the table: unknown ones and unsupported values refused. */
static int check_fields(const json_t *ac, const char *path, ty_err *err)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)ac, key, v)
    {
        const peft_field *f = find_field(key);
        if (!f)
            return ty_err_field(err, TY_ESPEC, key,
                                "%s: field \"%.60s\" is not one this engine knows (PEFT 0.21's "
                                "LoraConfig); refused rather than ignored, as it may change the "
                                "adapter",
                                path, key);
        if (f->kind == PF_ONLY && !allowed_value(v, f->allowed)) {
            char val[100];
            value_text(v, val, sizeof val);
            return ty_err_field(err, TY_ESPEC, key, "%s: %s = %s is not supported: %s (only %s)",
                                path, key, val, f->why, f->allowed);
        }
    }
    return 0;
}

int lora_cfg_from_peft(lora_cfg *c, const json_t *ac, const char *path, ty_err *err)
{
    if (!json_is_object(ac)) return ty_err_set(err, TY_EINVAL, "%s: not a JSON object", path);
    int rc = check_fields(ac, path, err);
    if (rc) return rc;
    c->from_peft = 1;
    json_t *v;
    if ((v = json_object_get(ac, "r"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65536)
            return ty_err_field(err, TY_EINVAL, "r", "%s: r must be a positive integer", path);
        c->r = (int)json_integer_value(v);
    }
    if ((v = json_object_get(ac, "lora_alpha"))) {
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            return ty_err_field(err, TY_EINVAL, "lora_alpha", "%s: lora_alpha must be a number",
                                path);
        c->alpha = json_number_value(v);
    }
    if ((v = json_object_get(ac, "bias")) && !json_is_null(v)) {
        static const char *const names[] = {"none", "lora_only", "all"};
        const char *b = json_string_value(v);
        int k = 0;
        while (k < 3 && !(b && !strcmp(b, names[k])))
            k++;
        if (k == 3)
            return ty_err_field(err, TY_ESPEC, "bias",
                                "%s: bias is not supported unless \"none\", \"lora_only\" or "
                                "\"all\" (PEFT's values)",
                                path);
        c->bias = k;
    }
    if ((v = json_object_get(ac, "modules_to_save")) && !json_is_null(v)) {
        if (!json_is_array(v))
            return ty_err_field(err, TY_EINVAL, "modules_to_save",
                                "%s: modules_to_save must be a list of names", path);
        c->n_save = 0;
        if ((rc = read_names(v, c->save, LORA_MAX_TARGETS, &c->n_save, path, "modules_to_save",
                             err)))
            return rc;
    }
    if ((v = json_object_get(ac, "use_dora"))) {
        if (!json_is_boolean(v))
            return ty_err_field(err, TY_EINVAL, "use_dora", "%s: use_dora must be true or false",
                                path);
        c->use_dora = json_is_true(v);
    }
    if ((v = json_object_get(ac, "use_rslora"))) {
        if (!json_is_boolean(v))
            return ty_err_field(err, TY_EINVAL, "use_rslora",
                                "%s: use_rslora must be true or false", path);
        c->use_rslora = json_is_true(v);
    }
    c->n_targets = 0, c->target_regex[0] = 0, c->all_linear = 0;
    if ((rc = read_modules(json_object_get(ac, "target_modules"), c->targets, &c->n_targets,
                           c->target_regex, &c->all_linear, path, "target_modules", err)) ||
        (rc = read_modules(json_object_get(ac, "exclude_modules"), c->exclude, &c->n_exclude,
                           c->exclude_regex, NULL, path, "exclude_modules", err)) ||
        (rc = read_pattern(json_object_get(ac, "rank_pattern"), c->rank_pattern, &c->n_rank_pattern,
                           1, path, "rank_pattern", err)) ||
        (rc = read_pattern(json_object_get(ac, "alpha_pattern"), c->alpha_pattern,
                           &c->n_alpha_pattern, 0, path, "alpha_pattern", err)) ||
        (rc = read_layers(c, json_object_get(ac, "layers_to_transform"),
                          json_object_get(ac, "layers_pattern"), path, err)))
        return rc;
    if ((c->target_regex[0] || c->all_linear) && c->n_layers)
        return ty_err_field(err, TY_EINVAL, "layers_to_transform",
                            "%s: layers_to_transform needs a target_modules list (PEFT refuses "
                            "it with a regex)",
                            path);
    return 0;
}

int lora_cfg_load(lora_cfg *c, const char *path, ty_err *err)
{
    json_t *ac = NULL;
    int rc = ty_read_json(path, TY_EINVAL, &ac, err);
    if (!rc) rc = lora_cfg_from_peft(c, ac, path, err);
    json_decref(ac);
    return rc;
}

/* ---- writing ---------------------------------------------------------------- */

static json_t *names_json(const char (*names)[LORA_NAME_MAX], int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_string(names[i]));
    return a;
}

static json_t *pattern_json(const lora_pattern *p, int n, int integer)
{
    json_t *o = json_object();
    for (int i = 0; i < n; i++)
        json_object_set_new(o, p[i].key,
                            integer ? json_integer((json_int_t)p[i].value) : json_real(p[i].value));
    return o;
}

void lora_cfg_to_peft(const lora_cfg *c, json_t *o)
{
    json_object_set_new(o, "r", json_integer(c->r));
    json_object_set_new(o, "lora_alpha", json_real(c->alpha));
    json_object_set_new(o, "lora_dropout", json_real(c->dropout));
    json_object_set_new(o, "use_rslora", json_boolean(c->use_rslora));
    json_object_set_new(o, "use_dora", json_boolean(c->use_dora));
    static const char *const bias_names[] = {"none", "lora_only", "all"};
    json_object_set_new(o, "bias", json_string(bias_names[c->bias]));
    json_object_set_new(o, "modules_to_save",
                        c->n_save ? names_json(c->save, c->n_save) : json_null());
    json_object_set_new(o, "target_modules",
                        c->all_linear        ? json_string("all-linear")
                        : c->target_regex[0] ? json_string(c->target_regex)
                                             : names_json(c->targets, c->n_targets));
    json_object_set_new(o, "exclude_modules",
                        c->exclude_regex[0] ? json_string(c->exclude_regex)
                        : c->n_exclude      ? names_json(c->exclude, c->n_exclude)
                                            : json_null());
    json_object_set_new(o, "rank_pattern", pattern_json(c->rank_pattern, c->n_rank_pattern, 1));
    json_object_set_new(o, "alpha_pattern", pattern_json(c->alpha_pattern, c->n_alpha_pattern, 0));
    json_t *layers = json_null();
    if (c->layers_int) {
        layers = json_integer(c->layers[0]);
    } else if (c->n_layers) {
        layers = json_array();
        for (int i = 0; i < c->n_layers; i++)
            json_array_append_new(layers, json_integer(c->layers[i]));
    }
    json_object_set_new(o, "layers_to_transform", layers);
    json_t *lp = c->n_layers_pattern ? json_array() : json_null();
    for (int i = 0; i < c->n_layers_pattern; i++)
        json_array_append_new(lp, json_string(c->layers_pattern[i]));
    json_object_set_new(o, "layers_pattern", lp);
}
