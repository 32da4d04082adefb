/* jobspec.c — the one validator of DESIGN §4 job specs (see jobspec.h).
 *
 * The server checks a submitted spec with this code and the engine reads the
 * same spec with it, so they can never disagree about a name, a default or a
 * range. Every object is walked against its list of known keys (unknown
 * fields are errors, not ignored), every value is type- and range-checked,
 * and the first fault is reported with its dotted path in err->field. */
#include "jobspec.h"

#include "tyopen.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tyutil.h"

#define NAME_MAX_LEN 128
#define PATH_MAX_LEN 4096
enum { FIELD_LEN = 128 }; /* longest dotted field path in a message */

/* ---- names of enum values, shared by the parser and jobspec_to_json ---- */

static const char *const method_names[] = {"full", "lora", "qlora"};
static const char *const precision_names[] = {"fp32", "bf16", "fp16", "auto"};
static const char *const backend_names[] = {"auto", "cuda", "cpu"};
static const char *const schedule_names[] = {"constant", "linear", "cosine"};
static const char *const recompute_names[] = {"none", "mlp", "all"};
static const char *const export_dtype_names[] = {"auto", "fp32", "bf16", "fp16"};
static const char *const format_names[] = {"tokens", "text", "prompt_completion", "chat"};
static const char *const template_names[] = {"chatml", "llama3", "llama2", "model"};
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *enum_name(const char *const *names, int n, int v)
{
    return v >= 0 && v < n ? names[v] : "?";
}

const char *jobspec_method_name(jobspec_method m)
{
    return enum_name(method_names, NELEM(method_names), m);
}
const char *jobspec_precision_name(jobspec_precision p)
{
    return enum_name(precision_names, NELEM(precision_names), p);
}
const char *jobspec_backend_name(jobspec_backend b)
{
    return enum_name(backend_names, NELEM(backend_names), b);
}
const char *jobspec_schedule_name(jobspec_schedule s)
{
    return enum_name(schedule_names, NELEM(schedule_names), s);
}
const char *jobspec_recompute_name(jobspec_recompute r)
{
    return enum_name(recompute_names, NELEM(recompute_names), r);
}
const char *jobspec_export_dtype_name(jobspec_export_dtype d)
{
    return enum_name(export_dtype_names, NELEM(export_dtype_names), d);
}
const char *jobspec_format_name(jobspec_format f)
{
    return enum_name(format_names, NELEM(format_names), f);
}

/* ---- field paths ---- */

/* Joins "parent" and "key" into a dotted path; the root has an empty parent. */
static void path_join(char *out, size_t n, const char *parent, const char *key)
{
    if (parent[0])
        snprintf(out, n, "%s.%s", parent, key);
    else
        snprintf(out, n, "%s", key);
}

static const char *json_type_word(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

/* Rejects any key of obj not in the NULL-terminated list `known`. Unknown
 * fields are errors so that a typo ("learning_rate") is never silently
 * trained with the default. */
static int check_keys(const json_t *obj, const char *parent, const char *const *known, ty_err *err)
{
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)obj, key, val)
    {
        int ok = 0;
        for (const char *const *k = known; *k; k++)
            if (strcmp(*k, key) == 0) {
                ok = 1;
                break;
            }
        if (!ok) {
            char f[FIELD_LEN];
            path_join(f, sizeof f, parent, key);
            return ty_err_field(err, TY_EINVAL, f, "%s: unknown field", f);
        }
    }
    return 0;
}

/* JSON types a field may be asked to have; the words match json_type_word. */
typedef enum { WANT_OBJECT, WANT_INTEGER, WANT_NUMBER, WANT_BOOLEAN, WANT_STRING } field_want;

/* The start of every field reader: looks obj.key up, writes its dotted path
 * into f[FIELD_LEN] for messages, and checks its type. A missing key is an
 * error only when required; otherwise 0 with *v NULL. A key present with a
 * null value counts as a wrong type: a spec says what it means. */
static int get_field(const json_t *obj, const char *parent, const char *key, int required,
                     field_want want, char *f, json_t **v, ty_err *err)
{
    static const char *const words[] = {"an object", "an integer", "a number", "a boolean",
                                        "a string"};
    path_join(f, FIELD_LEN, parent, key);
    *v = obj ? json_object_get(obj, key) : NULL;
    if (!*v) {
        if (required) return ty_err_field(err, TY_EINVAL, f, "%s: required field is missing", f);
        return 0;
    }
    int ok;
    switch (want) {
    case WANT_OBJECT:
        ok = json_is_object(*v);
        break;
    case WANT_INTEGER:
        ok = json_is_integer(*v);
        break;
    case WANT_NUMBER:
        ok = json_is_number(*v);
        break;
    case WANT_BOOLEAN:
        ok = json_is_boolean(*v);
        break;
    default:
        ok = json_is_string(*v);
        break;
    }
    if (!ok)
        return ty_err_field(err, TY_EINVAL, f, "%s: must be %s, got %s", f, words[want],
                            json_type_word(*v));
    return 0;
}

/* An object member; a missing optional key leaves *out NULL. */
static int get_object(const json_t *obj, const char *parent, const char *key, int required,
                      json_t **out, ty_err *err)
{
    char f[FIELD_LEN];
    json_t *v;
    int rc = get_field(obj, parent, key, required, WANT_OBJECT, f, &v, err);
    *out = rc ? NULL : v;
    return rc;
}

/* Integer field in [lo, hi]; a missing key keeps *out (the default) unless required. */
static int get_int(const json_t *obj, const char *parent, const char *key, int required, int64_t lo,
                   int64_t hi, int64_t *out, ty_err *err)
{
    char f[FIELD_LEN];
    json_t *v;
    int rc = get_field(obj, parent, key, required, WANT_INTEGER, f, &v, err);
    if (rc || !v) return rc;
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return ty_err_field(err, TY_EINVAL, f, "%s: must be in [%lld, %lld], got %lld", f,
                            (long long)lo, (long long)hi, (long long)x);
    *out = x;
    return 0;
}

static int get_int32(const json_t *obj, const char *parent, const char *key, int required,
                     int64_t lo, int64_t hi, int *out, ty_err *err)
{
    int64_t v = *out;
    int rc = get_int(obj, parent, key, required, lo, hi, &v, err);
    if (rc == 0) *out = (int)v;
    return rc;
}

/* Number field (integer or real) in the range lo..hi, each end open or closed. */
static int get_num(const json_t *obj, const char *parent, const char *key, double lo, int lo_open,
                   double hi, int hi_open, double *out, ty_err *err)
{
    char f[FIELD_LEN];
    json_t *v;
    int rc = get_field(obj, parent, key, 0, WANT_NUMBER, f, &v, err);
    if (rc || !v) return rc;
    double x = json_number_value(v);
    int bad = !isfinite(x) || (lo_open ? x <= lo : x < lo) || (hi_open ? x >= hi : x > hi);
    if (bad)
        return ty_err_field(err, TY_EINVAL, f, "%s: must be in %c%g, %g%c, got %g", f,
                            lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']', x);
    *out = x;
    return 0;
}

static int get_bool(const json_t *obj, const char *parent, const char *key, bool *out, ty_err *err)
{
    char f[FIELD_LEN];
    json_t *v;
    int rc = get_field(obj, parent, key, 0, WANT_BOOLEAN, f, &v, err);
    if (rc || !v) return rc;
    *out = json_is_true(v);
    return 0;
}

/* A string without control characters, 1..maxlen bytes. The text is valid
 * UTF-8 already (jansson guarantees it). *out is a fresh copy. */
static int get_string(const json_t *obj, const char *parent, const char *key, int required,
                      size_t maxlen, char **out, ty_err *err)
{
    char f[FIELD_LEN];
    json_t *v;
    int rc = get_field(obj, parent, key, required, WANT_STRING, f, &v, err);
    if (rc || !v) return rc;
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0) return ty_err_field(err, TY_EINVAL, f, "%s: must not be empty", f);
    if (n > maxlen) return ty_err_field(err, TY_EINVAL, f, "%s: longer than %zu bytes", f, maxlen);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return ty_err_field(err, TY_EINVAL, f, "%s: contains a control character", f);
    char *copy = strdup(s);
    if (!copy) return ty_err_field(err, TY_ENOMEM, f, "out of memory");
    free(*out);
    *out = copy;
    return 0;
}

/* String field that must be one of names[]; stores the index. */
static int get_enum(const json_t *obj, const char *parent, const char *key,
                    const char *const *names, int n, int *out, ty_err *err)
{
    char f[FIELD_LEN];
    json_t *v;
    int rc = get_field(obj, parent, key, 0, WANT_STRING, f, &v, err);
    if (rc || !v) return rc;
    const char *s = json_string_value(v);
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    char list[256] = "";
    for (int i = 0; i < n; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", names[i]);
    }
    return ty_err_field(err, TY_EINVAL, f, "%s: must be one of %s", f, list);
}

/* ---- paths ---- */

/* Does the slash-separated path contain a ".." component? */
static int has_dotdot(const char *p)
{
    const char *s = p;
    while (*s) {
        const char *e = strchr(s, '/');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n == 2 && s[0] == '.' && s[1] == '.') return 1;
        if (!e) break;
        s = e + 1;
    }
    return 0;
}

/* Returns the local filesystem path a spec path denotes ("/x" or
 * "file:///x" → "/x"), or NULL for a remote object-store URI. */
static const char *local_part(const char *p)
{
    if (strncmp(p, "file://", 7) == 0) return p + 7;
    if (p[0] == '/') return p;
    return NULL;
}

/* A path where the spec names data: an absolute local path, or an
 * s3:// gs:// az:// file:// URI. Never relative, never a ".." component:
 * the allowed-roots check is lexical and ".." would defeat it. */
static int check_path_value(const char *f, const char *p, ty_err *err)
{
    static const char *const remote[] = {"s3://", "gs://", "az://"};
    for (int i = 0; i < NELEM(remote); i++) {
        size_t l = strlen(remote[i]);
        if (strncmp(p, remote[i], l) == 0) {
            const char *bucket = p + l;
            if (!*bucket || *bucket == '/')
                return ty_err_field(err, TY_EINVAL, f, "%s: URI %s has no bucket or container", f,
                                    p);
            if (has_dotdot(bucket))
                return ty_err_field(err, TY_EINVAL, f, "%s: must not contain a '..' component", f);
            /* Credentials belong in the server's config, never in a spec
             * (which is stored and shown): no user@ part, no query (SAS). */
            size_t auth = strcspn(bucket, "/");
            if (memchr(bucket, '@', auth) || memchr(bucket, ':', auth) || strpbrk(p, "?#"))
                return ty_err_field(err, TY_EINVAL, f,
                                    "%s: URI must not carry credentials, a port or a query string; "
                                    "configure credentials on the server",
                                    f);
            return 0;
        }
    }
    if (strncmp(p, "file://", 7) == 0) {
        if (p[7] != '/')
            return ty_err_field(err, TY_EINVAL, f,
                                "%s: file:// URI must name an absolute path (file:///...)", f);
    } else if (p[0] != '/') {
        if (strstr(p, "://"))
            return ty_err_field(err, TY_EINVAL, f,
                                "%s: unsupported URI scheme (use s3://, gs://, az:// or file://)",
                                f);
        return ty_err_field(err, TY_EINVAL, f,
                            "%s: must be an absolute path, got relative path '%s'", f, p);
    }
    if (has_dotdot(p))
        return ty_err_field(err, TY_EINVAL, f, "%s: must not contain a '..' component", f);
    return 0;
}

static int get_path(const json_t *obj, const char *parent, const char *key, int required,
                    char **out, ty_err *err)
{
    int rc = get_string(obj, parent, key, required, PATH_MAX_LEN, out, err);
    if (rc || !*out) return rc;
    char f[FIELD_LEN];
    path_join(f, sizeof f, parent, key);
    return check_path_value(f, *out, err);
}

/* A checkpoint store is where results go, never a local path: only URIs. */
static int get_store(const json_t *obj, const char *parent, const char *key, char **out,
                     ty_err *err)
{
    int rc = get_path(obj, parent, key, 0, out, err);
    if (rc || !*out) return rc;
    if ((*out)[0] == '/') {
        char f[FIELD_LEN];
        path_join(f, sizeof f, parent, key);
        return ty_err_field(
            err, TY_EINVAL, f,
            "%s: must be a URI (s3://, gs://, az:// or file:///...), got a bare path", f);
    }
    return 0;
}

/* ---- sections ---- */

static int parse_model(const json_t *root, jobspec *s, ty_err *err)
{
    static const char *const keys[] = {"path", "init", NULL};
    json_t *m;
    int rc = get_object(root, "", "model", 1, &m, err);
    if (rc) return rc;
    if ((rc = check_keys(m, "model", keys, err))) return rc;
    json_t *init = json_object_get(m, "init");
    int has_path = json_object_get(m, "path") != NULL;
    if (has_path && init)
        return ty_err_field(err, TY_EINVAL, "model",
                            "model: give exactly one of model.path and model.init, not both");
    if (!has_path && !init)
        return ty_err_field(err, TY_EINVAL, "model.path",
                            "model.path: required field is missing (or give model.init)");
    if (has_path) return get_path(m, "model", "path", 1, &s->model_path, err);
    if (!json_is_object(init))
        return ty_err_field(err, TY_EINVAL, "model.init", "model.init: must be an object, got %s",
                            json_type_word(init));
    if (json_object_size(init) == 0)
        return ty_err_field(err, TY_EINVAL, "model.init",
                            "model.init: must not be empty (a config.json object)");
    /* A deep copy: the caller may free or change its document afterwards. */
    s->model_init = json_deep_copy(init);
    if (!s->model_init) return ty_err_field(err, TY_ENOMEM, "model.init", "out of memory");
    return 0;
}

static int parse_dataset(const json_t *root, jobspec *s, ty_err *err)
{
    static const char *const keys[] = {"train",        "eval",          "format",
                                       "text_field",   "chat_template", "packing",
                                       "skip_invalid", "eval_fraction", NULL};
    const char *P = "dataset";
    json_t *d;
    int rc, fmt = s->format, tmpl = 0;
    if ((rc = get_object(root, "", P, 1, &d, err))) return rc;
    if ((rc = check_keys(d, P, keys, err))) return rc;
    if ((rc = get_path(d, P, "train", 1, &s->train, err))) return rc;
    if ((rc = get_path(d, P, "eval", 0, &s->eval, err))) return rc;
    if ((rc = get_enum(d, P, "format", format_names, NELEM(format_names), &fmt, err))) return rc;
    s->format = (jobspec_format)fmt;
    if ((rc = get_string(d, P, "text_field", 0, 256, &s->text_field, err))) return rc;
    if (json_object_get(d, "chat_template")) {
        if ((rc = get_enum(d, P, "chat_template", template_names, NELEM(template_names), &tmpl,
                           err)))
            return rc;
        free(s->chat_template);
        s->chat_template = strdup(template_names[tmpl]);
        if (!s->chat_template) return ty_err_set(err, TY_ENOMEM, "out of memory");
    }
    if ((rc = get_bool(d, P, "packing", &s->packing, err))) return rc;
    if ((rc = get_bool(d, P, "skip_invalid", &s->skip_invalid, err))) return rc;
    if ((rc = get_num(d, P, "eval_fraction", 0, 0, 0.5, 0, &s->eval_fraction, err))) return rc;
    if (s->eval && s->eval_fraction > 0)
        return ty_err_field(
            err, TY_EINVAL, "dataset.eval_fraction",
            "dataset.eval_fraction: give either dataset.eval or dataset.eval_fraction, not both");
    return 0;
}

/* Target module names are model-specific (the engine checks they exist);
 * here only their spelling. */
static int valid_target_name(const char *t)
{
    if (!*t) return 0;
    for (const char *c = t; *c; c++)
        if (!((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '.'))
            return 0;
    return 1;
}

const char *const jobspec_bias_names[3] = {"none", "lora_only", "all"};

/* lora.modules_to_save: module names, as lora.targets. */
static int parse_save(const json_t *l, jobspec *s, ty_err *err)
{
    json_t *t = json_object_get(l, "modules_to_save");
    if (!t || json_is_null(t)) return 0;
    if (!json_is_array(t) || json_array_size(t) > JOBSPEC_MAX_TARGETS)
        return ty_err_field(err, TY_EINVAL, "lora.modules_to_save",
                            "lora.modules_to_save: must be an array of at most %d names",
                            JOBSPEC_MAX_TARGETS);
    for (size_t i = 0; i < json_array_size(t); i++) {
        char f[64];
        snprintf(f, sizeof f, "lora.modules_to_save[%zu]", i);
        const char *name = json_string_value(json_array_get(t, i));
        if (!name || !valid_target_name(name) || strlen(name) > 128)
            return ty_err_field(err, TY_EINVAL, f,
                                "%s: a module name is 1-128 characters of A-Z a-z 0-9 _ .", f);
        if (!(s->save[s->n_save] = strdup(name)))
            return ty_err_set(err, TY_ENOMEM, "out of memory");
        s->n_save++;
    }
    return 0;
}

static int parse_lora(const json_t *root, jobspec *s, ty_err *err)
{
    static const char *const keys[] = {"r",        "alpha",           "dropout", "use_rslora",
                                       "bias",     "targets",         "adapter", "merge",
                                       "use_dora", "modules_to_save", NULL};
    const char *P = "lora";
    json_t *l;
    int rc;
    if ((rc = get_object(root, "", P, 0, &l, err))) return rc;
    if (!l) return 0;
    if (s->method == METHOD_FULL)
        return ty_err_field(
            err, TY_EINVAL, "lora",
            "lora: only meaningful with method \"lora\" or \"qlora\" (method is \"full\")");
    if ((rc = check_keys(l, P, keys, err))) return rc;
    if ((rc = get_int32(l, P, "r", 0, 1, 4096, &s->lora_r, err))) return rc;
    if ((rc = get_num(l, P, "alpha", 0, 1, 1e6, 0, &s->lora_alpha, err))) return rc;
    if ((rc = get_num(l, P, "dropout", 0, 0, 1, 1, &s->lora_dropout, err))) return rc;
    if ((rc = get_bool(l, P, "use_rslora", &s->lora_use_rslora, err))) return rc;
    if ((rc = get_bool(l, P, "use_dora", &s->lora_use_dora, err))) return rc;
    if (s->lora_use_dora && s->method == METHOD_QLORA)
        return ty_err_field(err, TY_EINVAL, "lora.use_dora",
                            "lora.use_dora: DoRA needs the base weights in full precision for its "
                            "weight norm; method qlora keeps them in NF4 (use method lora)");
    if ((rc = get_enum(l, P, "bias", jobspec_bias_names, 3, &s->lora_bias, err))) return rc;
    json_t *t = json_object_get(l, "targets");
    if (t) {
        if (!json_is_array(t))
            return ty_err_field(err, TY_EINVAL, "lora.targets",
                                "lora.targets: must be an array, got %s", json_type_word(t));
        size_t n = json_array_size(t);
        if (n == 0)
            return ty_err_field(
                err, TY_EINVAL, "lora.targets",
                "lora.targets: must not be empty (omit it for the model's default)");
        if (n > JOBSPEC_MAX_TARGETS)
            return ty_err_field(err, TY_EINVAL, "lora.targets",
                                "lora.targets: at most %d entries, got %zu", JOBSPEC_MAX_TARGETS,
                                n);
        for (size_t i = 0; i < n; i++) {
            char f[64];
            snprintf(f, sizeof f, "lora.targets[%zu]", i);
            json_t *e = json_array_get(t, i);
            if (!json_is_string(e))
                return ty_err_field(err, TY_EINVAL, f, "%s: must be a string, got %s", f,
                                    json_type_word(e));
            const char *name = json_string_value(e);
            if (!valid_target_name(name) || strlen(name) > 128)
                return ty_err_field(err, TY_EINVAL, f,
                                    "%s: a module name is 1-128 characters of A-Z a-z 0-9 _ .", f);
            for (int j = 0; j < s->n_targets; j++)
                if (strcmp(s->targets[j], name) == 0)
                    return ty_err_field(err, TY_EINVAL, f, "%s: duplicate target \"%s\"", f, name);
            s->targets[s->n_targets] = strdup(name);
            if (!s->targets[s->n_targets]) return ty_err_set(err, TY_ENOMEM, "out of memory");
            s->n_targets++;
        }
    }
    if ((rc = parse_save(l, s, err))) return rc;
    if ((rc = get_path(l, P, "adapter", 0, &s->lora_adapter, err))) return rc;
    if ((rc = get_bool(l, P, "merge", &s->lora_merge, err))) return rc;
    return 0;
}

static int parse_hyper(const json_t *root, jobspec *s, ty_err *err)
{
    static const char *const keys[] = {"max_steps",
                                       "batch_size",
                                       "seq_len",
                                       "grad_accum",
                                       "lr",
                                       "schedule",
                                       "warmup_steps",
                                       "weight_decay",
                                       "max_grad_norm",
                                       "adam_beta1",
                                       "adam_beta2",
                                       "adam_eps",
                                       "seed",
                                       "log_every_steps",
                                       "eval_every_steps",
                                       "recompute",
                                       NULL};
    const char *P = "hyperparameters";
    json_t *h;
    int rc, sched = s->schedule, recompute = s->recompute;
    int64_t seed = (int64_t)s->seed;
    if ((rc = get_object(root, "", P, 1, &h, err))) return rc;
    if ((rc = check_keys(h, P, keys, err))) return rc;
    if ((rc = get_int(h, P, "max_steps", 1, 1, 1000000000, &s->max_steps, err))) return rc;
    if ((rc = get_int32(h, P, "batch_size", 0, 1, 65536, &s->batch_size, err))) return rc;
    if ((rc = get_int32(h, P, "seq_len", 0, 2, 1048576, &s->seq_len, err))) return rc;
    if ((rc = get_int32(h, P, "grad_accum", 0, 1, 65536, &s->grad_accum, err))) return rc;
    if ((rc = get_num(h, P, "lr", 0, 1, 10, 0, &s->lr, err))) return rc;
    if ((rc = get_enum(h, P, "schedule", schedule_names, NELEM(schedule_names), &sched, err)))
        return rc;
    s->schedule = (jobspec_schedule)sched;
    if ((rc = get_int(h, P, "warmup_steps", 0, 0, s->max_steps, &s->warmup_steps, err))) return rc;
    if ((rc = get_num(h, P, "weight_decay", 0, 0, 10, 0, &s->weight_decay, err))) return rc;
    if ((rc = get_num(h, P, "max_grad_norm", 0, 0, 1e6, 0, &s->max_grad_norm, err))) return rc;
    if ((rc = get_num(h, P, "adam_beta1", 0, 0, 1, 1, &s->adam_beta1, err))) return rc;
    if ((rc = get_num(h, P, "adam_beta2", 0, 0, 1, 1, &s->adam_beta2, err))) return rc;
    if ((rc = get_num(h, P, "adam_eps", 0, 1, 1, 0, &s->adam_eps, err))) return rc;
    if ((rc = get_int(h, P, "seed", 0, 0, INT64_MAX, &seed, err))) return rc;
    s->seed = (uint64_t)seed;
    if ((rc = get_int(h, P, "log_every_steps", 0, 1, 1000000000, &s->log_every_steps, err)))
        return rc;
    if ((rc = get_int(h, P, "eval_every_steps", 0, 0, 1000000000, &s->eval_every_steps, err)))
        return rc;
    if ((rc =
             get_enum(h, P, "recompute", recompute_names, NELEM(recompute_names), &recompute, err)))
        return rc;
    s->recompute = (jobspec_recompute)recompute;
    return 0;
}

static int parse_resources(const json_t *root, jobspec *s, ty_err *err)
{
    static const char *const keys[] = {"gpus",      "cpu_ranks", "nodes", "zero",
                                       "bucket_kb", "backend",   NULL};
    json_t *r;
    int rc, backend = s->backend;
    if ((rc = get_object(root, "", "resources", 0, &r, err))) return rc;
    if (!r) return 0;
    if ((rc = check_keys(r, "resources", keys, err))) return rc;
    if ((rc = get_int32(r, "resources", "gpus", 0, 0, 64, &s->gpus, err))) return rc;
    if ((rc = get_int32(r, "resources", "cpu_ranks", 0, 1, 256, &s->cpu_ranks, err))) return rc;
    if ((rc = get_int32(r, "resources", "nodes", 0, 1, 1024, &s->nodes, err))) return rc;
    if ((rc = get_int32(r, "resources", "zero", 0, 0, 1, &s->zero, err))) return rc;
    if ((rc = get_int32(r, "resources", "bucket_kb", 0, 0, 1 << 20, &s->bucket_kb, err))) return rc;
    if (s->cpu_ranks > 1 && s->gpus > 0)
        return ty_err_field(err, TY_EINVAL, "resources.cpu_ranks",
                            "resources.cpu_ranks: a job runs %d CPU ranks or one rank per GPU "
                            "(resources.gpus = %d), not both",
                            s->cpu_ranks, s->gpus);
    if ((rc = get_enum(r, "resources", "backend", backend_names, NELEM(backend_names), &backend,
                       err)))
        return rc;
    s->backend = (jobspec_backend)backend;
    if (s->backend == BACKEND_CPU && s->gpus > 0)
        return ty_err_field(err, TY_EINVAL, "resources.backend",
                            "resources.backend: \"cpu\" cannot use resources.gpus = %d", s->gpus);
    return 0;
}

/* qlora: how the frozen base is quantised (engine/nf4.c). compute_dtype
 * "auto" follows `precision`. */
static int parse_qlora(const json_t *root, jobspec *s, ty_err *err)
{
    static const char *const keys[] = {"double_quant", "compute_dtype", NULL};
    json_t *q;
    int rc, dt = s->qlora_compute_dtype;
    if ((rc = get_object(root, "", "qlora", 0, &q, err))) return rc;
    if (!q) return 0;
    if (s->method != METHOD_QLORA)
        return ty_err_field(err, TY_EINVAL, "qlora",
                            "qlora: only meaningful with method \"qlora\" (method is \"%s\")",
                            jobspec_method_name(s->method));
    if ((rc = check_keys(q, "qlora", keys, err))) return rc;
    if ((rc = get_bool(q, "qlora", "double_quant", &s->qlora_double_quant, err))) return rc;
    if ((rc = get_enum(q, "qlora", "compute_dtype", export_dtype_names, NELEM(export_dtype_names),
                       &dt, err)))
        return rc;
    s->qlora_compute_dtype = (jobspec_export_dtype)dt;
    return 0;
}

static int parse_export(const json_t *root, jobspec *s, ty_err *err)
{
    static const char *const keys[] = {"dtype", NULL};
    json_t *e;
    int rc, dt = s->export_dtype;
    if ((rc = get_object(root, "", "export", 0, &e, err))) return rc;
    if (!e) return 0;
    if ((rc = check_keys(e, "export", keys, err))) return rc;
    if ((rc = get_enum(e, "export", "dtype", export_dtype_names, NELEM(export_dtype_names), &dt,
                       err)))
        return rc;
    s->export_dtype = (jobspec_export_dtype)dt;
    return 0;
}

static int parse_checkpoint(const json_t *root, jobspec *s, ty_err *err)
{
    static const char *const keys[] = {"every_steps", "keep_last", "keep_best", "store", NULL};
    const char *P = "checkpoint";
    json_t *c;
    int rc;
    if ((rc = get_object(root, "", P, 0, &c, err))) return rc;
    if (!c) return 0;
    if ((rc = check_keys(c, P, keys, err))) return rc;
    if ((rc = get_int(c, P, "every_steps", 0, 0, 1000000000, &s->ckpt_every_steps, err))) return rc;
    if ((rc = get_int32(c, P, "keep_last", 0, 0, 1000000, &s->keep_last, err))) return rc;
    if ((rc = get_int32(c, P, "keep_best", 0, 0, 1000000, &s->keep_best, err))) return rc;
    if ((rc = get_store(c, P, "store", &s->store, err))) return rc;
    return 0;
}

static const char *const on_stall_names[] = {"warn", "restart", "fail"};

const char *jobspec_on_stall_name(jobspec_on_stall o)
{
    return (unsigned)o < NELEM(on_stall_names) ? on_stall_names[o] : "warn";
}

int jobspec_check_tags(const json_t *t, const char *field, ty_err *err)
{
    if (!json_is_array(t))
        return ty_err_field(err, TY_EINVAL, field, "%s: must be an array of strings, got %s", field,
                            json_type_word(t));
    size_t n = json_array_size(t);
    if (n > JOBSPEC_MAX_TAGS)
        return ty_err_field(err, TY_EINVAL, field, "%s: at most %d tags, got %zu", field,
                            JOBSPEC_MAX_TAGS, n);
    for (size_t i = 0; i < n; i++) {
        char f[FIELD_LEN];
        snprintf(f, sizeof f, "%s[%zu]", field, i);
        const json_t *e = json_array_get(t, i);
        const char *v = json_string_value(e);
        size_t len = v ? strlen(v) : 0;
        bool ok = v && len >= 1 && len <= JOBSPEC_TAG_LEN;
        for (size_t k = 0; ok && k < len; k++)
            ok = (v[k] >= 'A' && v[k] <= 'Z') || (v[k] >= 'a' && v[k] <= 'z') ||
                 (v[k] >= '0' && v[k] <= '9') || strchr("_.:-", v[k]);
        if (!ok)
            return ty_err_field(err, TY_EINVAL, f,
                                "%s: a tag is 1-%d characters of A-Z a-z 0-9 _ . : -", f,
                                JOBSPEC_TAG_LEN);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(json_string_value(json_array_get(t, j)), v))
                return ty_err_field(err, TY_EINVAL, f, "%s: duplicate tag \"%s\"", f, v);
    }
    return 0;
}

/* tags, limits and webhooks: what the server does around a run (budgets,
 * stalls, notifications); the engine parses and ignores them. */
static int parse_ops(const json_t *root, jobspec *s, ty_err *err)
{
    int rc;
    json_t *t = json_object_get(root, "tags");
    if (t) {
        if ((rc = jobspec_check_tags(t, "tags", err))) return rc;
        for (size_t i = 0; i < json_array_size(t); i++) {
            if (!(s->tags[i] = strdup(json_string_value(json_array_get(t, i)))))
                return ty_err_set(err, TY_ENOMEM, "out of memory");
            s->n_tags++;
        }
    }
    static const char *const keys[] = {"max_cost",      "max_runtime_s", "max_tokens",
                                       "stall_after_s", "on_stall",      NULL};
    json_t *l;
    int on_stall = s->on_stall;
    if ((rc = get_object(root, "", "limits", 0, &l, err))) return rc;
    if (l) {
        if ((rc = check_keys(l, "limits", keys, err))) return rc;
        if ((rc = get_num(l, "limits", "max_cost", 0, 1, 1e12, 0, &s->max_cost, err))) return rc;
        if ((rc = get_int(l, "limits", "max_runtime_s", 0, 1, 100000000, &s->max_runtime_s, err)))
            return rc;
        if ((rc = get_int(l, "limits", "max_tokens", 0, 1, INT64_MAX, &s->max_tokens, err)))
            return rc;
        if ((rc = get_int(l, "limits", "stall_after_s", 0, 1, 100000000, &s->stall_after_s, err)))
            return rc;
        if ((rc = get_enum(l, "limits", "on_stall", on_stall_names, NELEM(on_stall_names),
                           &on_stall, err)))
            return rc;
        s->on_stall = (jobspec_on_stall)on_stall;
    }
    json_t *w = json_object_get(root, "webhooks");
    if (w) {
        if (!json_is_array(w))
            return ty_err_field(err, TY_EINVAL, "webhooks",
                                "webhooks: must be an array of URLs, got %s", json_type_word(w));
        if (json_array_size(w) > JOBSPEC_MAX_WEBHOOKS)
            return ty_err_field(err, TY_EINVAL, "webhooks", "webhooks: at most %d URLs",
                                JOBSPEC_MAX_WEBHOOKS);
        for (size_t i = 0; i < json_array_size(w); i++) {
            char f[FIELD_LEN];
            snprintf(f, sizeof f, "webhooks[%zu]", i);
            const char *u = json_string_value(json_array_get(w, i));
            bool ok =
                u && strlen(u) <= 1024 && (!strncmp(u, "http://", 7) || !strncmp(u, "https://", 8));
            for (const char *c = u; ok && *c; c++)
                ok = (unsigned char)*c > 0x20 && *c != 0x7f;
            if (!ok)
                return ty_err_field(err, TY_EINVAL, f,
                                    "%s: must be an http:// or https:// URL of at most 1024 bytes",
                                    f);
            if (!(s->webhooks[i] = strdup(u))) return ty_err_set(err, TY_ENOMEM, "out of memory");
            s->n_webhooks++;
        }
    }
    return 0;
}

static void set_defaults(jobspec *s)
{
    memset(s, 0, sizeof *s);
    s->format = DS_TOKENS;
    s->method = METHOD_FULL;
    s->lora_r = 8;
    s->lora_alpha = 16;
    s->qlora_double_quant = true;
    s->batch_size = 1;
    s->seq_len = 256;
    s->grad_accum = 1;
    s->lr = 1e-4;
    s->schedule = SCHED_CONSTANT;
    s->max_grad_norm = 1.0;
    s->adam_beta1 = 0.9;
    s->adam_beta2 = 0.999;
    s->adam_eps = 1e-8;
    s->seed = 1234;
    s->log_every_steps = 10;
    s->precision = PREC_FP32;
    s->backend = BACKEND_AUTO;
    s->cpu_ranks = 1;
    s->bucket_kb = 4096;
    s->nodes = 1;
    s->max_restarts = 3;
    s->max_cost = -1;
}

static int parse_all(const json_t *root, jobspec *s, ty_err *err)
{
    static const char *const keys[] = {"name",
                                       "model",
                                       "dataset",
                                       "method",
                                       "lora",
                                       "qlora",
                                       "hyperparameters",
                                       "precision",
                                       "export",
                                       "resources",
                                       "checkpoint",
                                       "priority",
                                       "max_restarts",
                                       "tags",
                                       "limits",
                                       "webhooks",
                                       NULL};
    int rc, method = 0, prec = 0;
    if (!json_is_object(root))
        return ty_err_field(err, TY_EINVAL, "", "a job spec must be a JSON object, got %s",
                            json_type_word(root));
    if ((rc = check_keys(root, "", keys, err))) return rc;
    if ((rc = get_string(root, "", "name", 0, NAME_MAX_LEN, &s->name, err))) return rc;
    if ((rc = parse_model(root, s, err))) return rc;
    if ((rc = parse_dataset(root, s, err))) return rc;
    if (!s->text_field && !(s->text_field = strdup("text")))
        return ty_err_set(err, TY_ENOMEM, "out of memory");
    if (!s->chat_template && !(s->chat_template = strdup("chatml")))
        return ty_err_set(err, TY_ENOMEM, "out of memory");
    /* method before lora: the lora section is only allowed for lora/qlora. */
    if ((rc = get_enum(root, "", "method", method_names, NELEM(method_names), &method, err)))
        return rc;
    s->method = (jobspec_method)method;
    if ((rc = parse_lora(root, s, err))) return rc;
    if ((rc = parse_hyper(root, s, err))) return rc;
    if ((rc = get_enum(root, "", "precision", precision_names, NELEM(precision_names), &prec, err)))
        return rc;
    s->precision = (jobspec_precision)prec;
    if ((rc = parse_qlora(root, s, err))) return rc;
    if ((rc = parse_export(root, s, err))) return rc;
    if ((rc = parse_resources(root, s, err))) return rc;
    if ((rc = parse_checkpoint(root, s, err))) return rc;
    if ((rc = get_int32(root, "", "priority", 0, -1000, 1000, &s->priority, err))) return rc;
    if ((rc = get_int32(root, "", "max_restarts", 0, 0, 100, &s->max_restarts, err))) return rc;
    if ((rc = parse_ops(root, s, err))) return rc;
    return 0;
}

int jobspec_parse(json_t *root, jobspec *out, ty_err *err)
{
    jobspec s;
    set_defaults(&s);
    ty_err_clear(err);
    int rc = parse_all(root, &s, err);
    if (rc) {
        jobspec_free(&s);
        memset(out, 0, sizeof *out);
        return rc;
    }
    *out = s;
    return 0;
}

/* Line and 1-based column of byte offset off, for error messages. */
static void line_col(const char *text, size_t off, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else if (((unsigned char)text[i] & 0xC0) != 0x80)
            (*col)++;
    }
}

int jobspec_parse_text(const char *text, size_t len, jobspec *out, ty_err *err)
{
    memset(out, 0, sizeof *out);
    ty_err_clear(err);
    if (!ty_utf8_valid(text, len)) {
        /* Walk character by character to point the user at the first bad byte. */
        size_t lo = 0;
        while (lo < len) {
            unsigned char c = (unsigned char)text[lo];
            size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            if (n > len - lo || !ty_utf8_valid(text + lo, n)) break;
            lo += n;
        }
        int line, col;
        line_col(text, lo, &line, &col);
        return ty_err_set(err, TY_ECORRUPT, "invalid UTF-8 at line %d, column %d (byte %zu)", line,
                          col, lo);
    }
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!root)
        return ty_err_set(err, TY_ECORRUPT, "malformed JSON at line %d, column %d: %s", je.line,
                          je.column, je.text);
    int rc = jobspec_parse(root, out, err);
    json_decref(root);
    return rc;
}

/* ---- allowed roots ---- */

static int check_one_root(const char *field, const char *p, const char *roots, ty_err *err)
{
    if (!p) return 0;
    const char *local = local_part(p);
    if (!local) return 0; /* object-store URIs: credentials, not roots, guard them */
    if (!ty_path_under_roots(local, roots))
        return ty_err_field(err, TY_EINVAL, field, "%s: %s is outside the allowed roots (%s)",
                            field, local, roots);
    /* A symlink inside a root may point outside it: check where it leads.
     * The engine checks again when it opens the file. */
    if (!ty_path_within_roots(local, roots))
        return ty_err_field(err, TY_EINVAL, field,
                            "%s: %s resolves to a place outside the allowed roots (%s)", field,
                            local, roots);
    return 0;
}

int jobspec_check_roots(const jobspec *s, const char *allowed_roots, ty_err *err)
{
    ty_err_clear(err);
    if (!allowed_roots || !*allowed_roots) return 0; /* no restriction configured */
    int rc;
    if ((rc = check_one_root("model.path", s->model_path, allowed_roots, err))) return rc;
    if ((rc = check_one_root("dataset.train", s->train, allowed_roots, err))) return rc;
    if ((rc = check_one_root("dataset.eval", s->eval, allowed_roots, err))) return rc;
    if ((rc = check_one_root("lora.adapter", s->lora_adapter, allowed_roots, err))) return rc;
    return 0;
}

int jobspec_check_store_roots(const jobspec *s, const char *store_roots, ty_err *err)
{
    ty_err_clear(err);
    if (!s->store || strncmp(s->store, "file://", 7)) return 0;
    const char *local = s->store + 7;
    if (!store_roots || !*store_roots)
        return ty_err_field(
            err, TY_EINVAL, "checkpoint.store",
            "checkpoint.store: file:// stores are off on this server (no store roots)");
    if (!ty_path_within_roots(local, store_roots))
        return ty_err_field(err, TY_EINVAL, "checkpoint.store",
                            "checkpoint.store: %s is outside the store roots (%s)", local,
                            store_roots);
    return 0;
}

void jobspec_free(jobspec *s)
{
    if (!s) return;
    free(s->name);
    free(s->model_path);
    json_decref(s->model_init);
    free(s->train);
    free(s->eval);
    free(s->text_field);
    free(s->chat_template);
    for (int i = 0; i < s->n_targets; i++)
        free(s->targets[i]);
    for (int i = 0; i < s->n_save; i++)
        free(s->save[i]);
    free(s->lora_adapter);
    free(s->store);
    for (int i = 0; i < s->n_tags; i++)
        free(s->tags[i]);
    for (int i = 0; i < s->n_webhooks; i++)
        free(s->webhooks[i]);
    memset(s, 0, sizeof *s);
}

/* ---- back to JSON ---- */

static void set_str(json_t *o, const char *k, const char *v)
{
    if (v) json_object_set_new(o, k, json_string(v));
}

jobspec_caps jobspec_default_caps(int cuda_gpus)
{
    unsigned all = 1u << PREC_FP32 | 1u << PREC_BF16 | 1u << PREC_FP16;
    return (jobspec_caps){.cpu = all, .cuda = cuda_gpus > 0 ? all : 0};
}

int jobspec_check_precision(const jobspec *s, const jobspec_caps *caps, ty_err *err)
{
    /* auto runs on CUDA when it can and falls back to the CPU otherwise
     * (logged by the engine), so either backend will do for it. */
    int cuda = s->backend == BACKEND_CUDA;
    unsigned can = cuda                                        ? caps->cuda
                   : s->backend == BACKEND_AUTO && s->gpus > 0 ? caps->cuda | caps->cpu
                                                               : caps->cpu;
    /* auto: the engine picks a precision the device runs, if it runs any */
    if (s->precision == PREC_AUTO ? can != 0 : (can & (1u << s->precision)) != 0) return 0;
    if (cuda && !caps->cuda)
        return ty_err_field(
            err, TY_EINVAL, "precision",
            "precision: %s cannot run on resources.backend %s: this installation has no CUDA GPUs "
            "(use backend \"cpu\", which runs fp32, bf16 and fp16)",
            jobspec_precision_name(s->precision), jobspec_backend_name(s->backend));
    return ty_err_field(err, TY_EINVAL, "precision", "precision: backend %s cannot run %s",
                        cuda ? "cuda" : "cpu", jobspec_precision_name(s->precision));
}

json_t *jobspec_to_json(const jobspec *s)
{
    json_t *root = json_object();
    if (!root) return NULL;
    set_str(root, "name", s->name);

    json_t *m = json_object();
    set_str(m, "path", s->model_path);
    if (s->model_init) json_object_set_new(m, "init", json_deep_copy(s->model_init));
    json_object_set_new(root, "model", m);

    json_t *d = json_object();
    set_str(d, "train", s->train);
    set_str(d, "eval", s->eval);
    json_object_set_new(d, "format", json_string(jobspec_format_name(s->format)));
    set_str(d, "text_field", s->text_field);
    set_str(d, "chat_template", s->chat_template);
    json_object_set_new(d, "packing", json_boolean(s->packing));
    json_object_set_new(d, "skip_invalid", json_boolean(s->skip_invalid));
    json_object_set_new(d, "eval_fraction", json_real(s->eval_fraction));
    json_object_set_new(root, "dataset", d);

    json_object_set_new(root, "method", json_string(jobspec_method_name(s->method)));
    if (s->method != METHOD_FULL) {
        json_t *l = json_object();
        json_object_set_new(l, "r", json_integer(s->lora_r));
        json_object_set_new(l, "alpha", json_real(s->lora_alpha));
        json_object_set_new(l, "dropout", json_real(s->lora_dropout));
        json_object_set_new(l, "use_rslora", json_boolean(s->lora_use_rslora));
        if (s->lora_use_dora) json_object_set_new(l, "use_dora", json_true());
        json_object_set_new(l, "bias", json_string(jobspec_bias_names[s->lora_bias]));
        if (s->n_save > 0) {
            json_t *t = json_array();
            for (int i = 0; i < s->n_save; i++)
                json_array_append_new(t, json_string(s->save[i]));
            json_object_set_new(l, "modules_to_save", t);
        }
        if (s->n_targets > 0) {
            json_t *t = json_array();
            for (int i = 0; i < s->n_targets; i++)
                json_array_append_new(t, json_string(s->targets[i]));
            json_object_set_new(l, "targets", t);
        }
        set_str(l, "adapter", s->lora_adapter);
        json_object_set_new(l, "merge", json_boolean(s->lora_merge));
        json_object_set_new(root, "lora", l);
    }
    if (s->method == METHOD_QLORA)
        json_object_set_new(root, "qlora",
                            json_pack("{s:b, s:s}", "double_quant", s->qlora_double_quant,
                                      "compute_dtype",
                                      jobspec_export_dtype_name(s->qlora_compute_dtype)));

    json_t *h = json_object();
    json_object_set_new(h, "max_steps", json_integer(s->max_steps));
    json_object_set_new(h, "batch_size", json_integer(s->batch_size));
    json_object_set_new(h, "seq_len", json_integer(s->seq_len));
    json_object_set_new(h, "grad_accum", json_integer(s->grad_accum));
    json_object_set_new(h, "lr", json_real(s->lr));
    json_object_set_new(h, "schedule", json_string(jobspec_schedule_name(s->schedule)));
    json_object_set_new(h, "warmup_steps", json_integer(s->warmup_steps));
    json_object_set_new(h, "weight_decay", json_real(s->weight_decay));
    json_object_set_new(h, "max_grad_norm", json_real(s->max_grad_norm));
    json_object_set_new(h, "adam_beta1", json_real(s->adam_beta1));
    json_object_set_new(h, "adam_beta2", json_real(s->adam_beta2));
    json_object_set_new(h, "adam_eps", json_real(s->adam_eps));
    json_object_set_new(h, "seed", json_integer((json_int_t)s->seed));
    json_object_set_new(h, "log_every_steps", json_integer(s->log_every_steps));
    json_object_set_new(h, "eval_every_steps", json_integer(s->eval_every_steps));
    json_object_set_new(h, "recompute", json_string(jobspec_recompute_name(s->recompute)));
    json_object_set_new(root, "hyperparameters", h);

    json_object_set_new(root, "precision", json_string(jobspec_precision_name(s->precision)));
    json_object_set_new(root, "export",
                        json_pack("{s:s}", "dtype", jobspec_export_dtype_name(s->export_dtype)));
    json_t *r = json_object();
    json_object_set_new(r, "gpus", json_integer(s->gpus));
    json_object_set_new(r, "cpu_ranks", json_integer(s->cpu_ranks));
    json_object_set_new(r, "nodes", json_integer(s->nodes));
    json_object_set_new(r, "zero", json_integer(s->zero));
    json_object_set_new(r, "bucket_kb", json_integer(s->bucket_kb));
    json_object_set_new(r, "backend", json_string(jobspec_backend_name(s->backend)));
    json_object_set_new(root, "resources", r);

    json_t *c = json_object();
    json_object_set_new(c, "every_steps", json_integer(s->ckpt_every_steps));
    json_object_set_new(c, "keep_last", json_integer(s->keep_last));
    json_object_set_new(c, "keep_best", json_integer(s->keep_best));
    set_str(c, "store", s->store);
    json_object_set_new(root, "checkpoint", c);

    json_object_set_new(root, "priority", json_integer(s->priority));
    json_object_set_new(root, "max_restarts", json_integer(s->max_restarts));

    json_t *tags = json_array();
    for (int i = 0; i < s->n_tags; i++)
        json_array_append_new(tags, json_string(s->tags[i]));
    json_object_set_new(root, "tags", tags);
    json_t *l = json_object();
    if (s->max_cost >= 0) json_object_set_new(l, "max_cost", json_real(s->max_cost));
    if (s->max_runtime_s > 0)
        json_object_set_new(l, "max_runtime_s", json_integer(s->max_runtime_s));
    if (s->max_tokens > 0) json_object_set_new(l, "max_tokens", json_integer(s->max_tokens));
    if (s->stall_after_s > 0)
        json_object_set_new(l, "stall_after_s", json_integer(s->stall_after_s));
    json_object_set_new(l, "on_stall", json_string(jobspec_on_stall_name(s->on_stall)));
    json_object_set_new(root, "limits", l);
    if (s->n_webhooks > 0) {
        json_t *w = json_array();
        for (int i = 0; i < s->n_webhooks; i++)
            json_array_append_new(w, json_string(s->webhooks[i]));
        json_object_set_new(root, "webhooks", w);
    }
    return root;
}
