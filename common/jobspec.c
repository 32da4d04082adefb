/* jobspec.c — the one validator of DESIGN §4 job specs (see jobspec.h).
 *
 * The server checks a submitted spec with this code and the engine reads the
 * same spec with it, so they can never disagree about a name, a default or a
 * range. Every spec field is one row of FIELDS below: its dotted path, type,
 * bounds, default, place in struct jobspec and, for an enum, its names.
 * Parsing, the known keys of every object (unknown fields are errors, not
 * ignored), the defaults, jobspec_to_json and jobspec_schema (which
 * tests/common holds against openapi.yaml's JobSpec) all walk that table, so
 * a new hyperparameter is one row plus its use. A row may name a check run
 * after it (a rule across fields) or, for an array or model.init, its own
 * reader. The first fault is reported with its dotted path in err->field. */
#include "jobspec.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
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

/* ---- the field table: types ---- */

typedef enum {
    F_OBJECT, /* a section; its rows follow it, named "section.key" */
    F_INT,    /* int or int64_t (by the member's size) in [lo, hi] */
    F_NUM,    /* double in dlo..dhi, each end closed unless F_*_OPEN */
    F_BOOL,   /* bool */
    F_STR,    /* char *: 1..hi bytes, no control characters */
    F_PATH,   /* char *: a data path (check_path_value), at most hi bytes */
    F_STORE,  /* char *: a checkpoint store URI, never a bare path */
    F_ENUM,   /* an int-sized enum: the index of the value in names */
    F_NAME,   /* char *: one of names, kept as text (dataset.chat_template) */
    F_ARRAY,  /* char *[hi] with its count at count_off; read by the row's reader */
    F_OPAQUE, /* json_t * (owned), read by the row's reader (model.init) */
} ftype;

enum {
    F_REQUIRED = 1,     /* missing is an error */
    F_LO_OPEN = 2,      /* F_NUM: dlo itself is refused */
    F_HI_OPEN = 4,      /* F_NUM: dhi itself is refused */
    F_OMIT_DEFAULT = 8, /* written back only when not the default (an array: when not empty) */
    F_NO_DEFAULT = 16,  /* def is the struct's "not set" value, no documented default;
                           written back only when set */
};

typedef struct field field;
struct field {
    const char *path; /* dotted, as err->field names it */
    size_t off, size; /* the struct jobspec member (none for F_OBJECT) */
    ftype type;
    int64_t lo, hi;           /* F_INT bounds; F_STR F_PATH F_STORE bytes; F_ARRAY items */
    const char *at_most;      /* F_INT: also at most this earlier row's value */
    double dlo, dhi;          /* F_NUM bounds */
    unsigned flags;           /* F_* above */
    const char *def;          /* the default as text ("256", "1e-4", "true", "chatml"), or NULL */
    const char *const *names; /* F_ENUM, F_NAME */
    int n_names;
    size_t count_off; /* F_ARRAY: its int count */
    /* F_OBJECT: before its keys are looked at (is the section allowed?);
     * any other row: after it is read, section present (rules across rows). */
    int (*check)(const jobspec *s, ty_err *err);
    /* F_OBJECT: written back only where this says so; NULL: always. */
    bool (*written)(const jobspec *s);
    /* F_ARRAY, F_OPAQUE: reads the value (NULL when absent) into s. */
    int (*read)(const field *f, const json_t *v, jobspec *s, ty_err *err);
};

/* F_ENUM rows store an enum member as an int. */
_Static_assert(sizeof(jobspec_method) == sizeof(int) && sizeof(jobspec_precision) == sizeof(int) &&
                   sizeof(jobspec_backend) == sizeof(int) &&
                   sizeof(jobspec_schedule) == sizeof(int) &&
                   sizeof(jobspec_format) == sizeof(int) &&
                   sizeof(jobspec_on_stall) == sizeof(int) &&
                   sizeof(jobspec_recompute) == sizeof(int) &&
                   sizeof(jobspec_export_dtype) == sizeof(int),
               "an enum of struct jobspec is not int-sized");

/* The key of a row within its object: "lr" of "hyperparameters.lr". */
static const char *row_key(const field *f)
{
    const char *dot = strchr(f->path, '.');
    return dot ? dot + 1 : f->path;
}

static void *member(const field *f, jobspec *s)
{
    return (char *)s + f->off;
}

static const void *cmember(const field *f, const jobspec *s)
{
    return (const char *)s + f->off;
}

static int64_t load_int(const field *f, const jobspec *s)
{
    if (f->size == sizeof(int64_t)) return *(const int64_t *)cmember(f, s);
    return *(const int *)cmember(f, s);
}

static void store_int(const field *f, jobspec *s, int64_t v)
{
    if (f->size == sizeof(int64_t))
        *(int64_t *)member(f, s) = v;
    else
        *(int *)member(f, s) = (int)v;
}

static int name_index(const field *f, const char *v)
{
    for (int i = 0; v && i < f->n_names; i++)
        if (strcmp(v, f->names[i]) == 0) return i;
    return -1;
}

/* ---- reading one row ---- */

/* JSON types a row may be asked to have; the words match json_type_word. */
typedef enum { WANT_OBJECT, WANT_INTEGER, WANT_NUMBER, WANT_BOOLEAN, WANT_STRING } field_want;

/* The start of every row reader: looks the row's key up in obj and checks
 * its type. A missing key is an error only when required; otherwise 0 with
 * *v NULL. A key present with a null value counts as a wrong type: a spec
 * says what it means. */
static int get_field(const json_t *obj, const field *f, field_want want, json_t **v, ty_err *err)
{
    static const char *const words[] = {"an object", "an integer", "a number", "a boolean",
                                        "a string"};
    const char *p = f->path;
    *v = obj ? json_object_get(obj, row_key(f)) : NULL;
    if (!*v) {
        if (f->flags & F_REQUIRED)
            return ty_err_field(err, TY_EINVAL, p, "%s: required field is missing", p);
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
        return ty_err_field(err, TY_EINVAL, p, "%s: must be %s, got %s", p, words[want],
                            json_type_word(*v));
    return 0;
}

/* Rejects any key of obj that is no row under parent ("" for the root).
 * Unknown fields are errors so that a typo ("learning_rate") is never
 * silently trained with the default. */
static int check_keys(const json_t *obj, const char *parent, ty_err *err);

static const field *find_row(const char *path);

static int read_int(const json_t *v, const field *f, jobspec *s, ty_err *err)
{
    json_int_t x = json_integer_value(v);
    int64_t hi = f->hi;
    if (f->at_most) {
        int64_t cap = load_int(find_row(f->at_most), s);
        hi = cap < hi ? cap : hi;
    }
    if (x < f->lo || x > hi)
        return ty_err_field(err, TY_EINVAL, f->path, "%s: must be in [%lld, %lld], got %lld",
                            f->path, (long long)f->lo, (long long)hi, (long long)x);
    store_int(f, s, x);
    return 0;
}

static int read_num(const json_t *v, const field *f, jobspec *s, ty_err *err)
{
    double x = json_number_value(v);
    int lo_open = f->flags & F_LO_OPEN, hi_open = f->flags & F_HI_OPEN;
    int bad = !isfinite(x) || (lo_open ? x <= f->dlo : x < f->dlo) ||
              (hi_open ? x >= f->dhi : x > f->dhi);
    if (bad)
        return ty_err_field(err, TY_EINVAL, f->path, "%s: must be in %c%g, %g%c, got %g", f->path,
                            lo_open ? '(' : '[', f->dlo, f->dhi, hi_open ? ')' : ']', x);
    *(double *)member(f, s) = x;
    return 0;
}

/* A string without control characters, 1..hi bytes. The text is valid
 * UTF-8 already (jansson guarantees it). The member gets a fresh copy. */
static int read_string(const json_t *v, const field *f, jobspec *s, ty_err *err)
{
    const char *p = f->path, *str = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0) return ty_err_field(err, TY_EINVAL, p, "%s: must not be empty", p);
    if (n > (size_t)f->hi)
        return ty_err_field(err, TY_EINVAL, p, "%s: longer than %zu bytes", p, (size_t)f->hi);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)str[i] < 0x20 || str[i] == 0x7f)
            return ty_err_field(err, TY_EINVAL, p, "%s: contains a control character", p);
    char *copy = strdup(str), **out = member(f, s);
    if (!copy) return ty_err_field(err, TY_ENOMEM, p, "out of memory");
    free(*out);
    *out = copy;
    if (f->type == F_PATH || f->type == F_STORE) {
        int rc = check_path_value(p, copy, err);
        if (rc) return rc;
    }
    /* A checkpoint store is where results go, never a local path: only URIs. */
    if (f->type == F_STORE && copy[0] == '/')
        return ty_err_field(
            err, TY_EINVAL, p,
            "%s: must be a URI (s3://, gs://, az:// or file:///...), got a bare path", p);
    return 0;
}

/* A string that must be one of the row's names: its index (F_ENUM) or text. */
static int read_enum(const json_t *v, const field *f, jobspec *s, ty_err *err)
{
    int i = name_index(f, json_string_value(v));
    if (i >= 0 && f->type == F_ENUM) {
        *(int *)member(f, s) = i;
        return 0;
    }
    if (i >= 0) {
        char **out = member(f, s), *copy = strdup(f->names[i]);
        if (!copy) return ty_err_set(err, TY_ENOMEM, "out of memory");
        free(*out);
        *out = copy;
        return 0;
    }
    char list[256] = "";
    for (int k = 0; k < f->n_names; k++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", k ? ", " : "", f->names[k]);
    }
    return ty_err_field(err, TY_EINVAL, f->path, "%s: must be one of %s", f->path, list);
}

/* One row of a present object (obj), then its check. */
static int read_row(const json_t *obj, const field *f, jobspec *s, ty_err *err)
{
    static const field_want want[] = {
        [F_INT] = WANT_INTEGER, [F_NUM] = WANT_NUMBER,  [F_BOOL] = WANT_BOOLEAN,
        [F_STR] = WANT_STRING,  [F_PATH] = WANT_STRING, [F_STORE] = WANT_STRING,
        [F_ENUM] = WANT_STRING, [F_NAME] = WANT_STRING,
    };
    json_t *v = NULL;
    int rc = 0;
    if (f->type == F_ARRAY || f->type == F_OPAQUE)
        rc = f->read(f, json_object_get(obj, row_key(f)), s, err);
    else if ((rc = get_field(obj, f, want[f->type], &v, err)) == 0 && v) {
        if (f->type == F_INT)
            rc = read_int(v, f, s, err);
        else if (f->type == F_NUM)
            rc = read_num(v, f, s, err);
        else if (f->type == F_BOOL)
            *(bool *)member(f, s) = json_is_true(v);
        else if (f->type == F_ENUM || f->type == F_NAME)
            rc = read_enum(v, f, s, err);
        else
            rc = read_string(v, f, s, err);
    }
    if (rc == 0 && f->check) rc = f->check(s, err);
    return rc;
}

/* ---- rows with readers of their own ---- */

/* model.init, read after model.path: exactly one of the two. */
static int read_init(const field *f, const json_t *init, jobspec *s, ty_err *err)
{
    (void)f;
    if (s->model_path && init)
        return ty_err_field(err, TY_EINVAL, "model",
                            "model: give exactly one of model.path and model.init, not both");
    if (!s->model_path && !init)
        return ty_err_field(err, TY_EINVAL, "model.path",
                            "model.path: required field is missing (or give model.init)");
    if (!init) return 0;
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

/* Appends a copy of v to the row's array. */
static int array_add(const field *f, jobspec *s, const char *v, ty_err *err)
{
    char **a = member(f, s);
    int *n = (int *)((char *)s + f->count_off);
    if (!(a[*n] = strdup(v))) return ty_err_set(err, TY_ENOMEM, "out of memory");
    (*n)++;
    return 0;
}

/* lora.modules_to_save: module names, as lora.targets; null is none. */
static int read_save(const field *f, const json_t *t, jobspec *s, ty_err *err)
{
    if (!t || json_is_null(t)) return 0;
    if (!json_is_array(t) || json_array_size(t) > (size_t)f->hi)
        return ty_err_field(err, TY_EINVAL, f->path, "%s: must be an array of at most %d names",
                            f->path, (int)f->hi);
    for (size_t i = 0; i < json_array_size(t); i++) {
        char p[FIELD_LEN];
        snprintf(p, sizeof p, "%s[%zu]", f->path, i);
        const char *name = json_string_value(json_array_get(t, i));
        if (!name || !valid_target_name(name) || strlen(name) > 128)
            return ty_err_field(err, TY_EINVAL, p,
                                "%s: a module name is 1-128 characters of A-Z a-z 0-9 _ .", p);
        int rc = array_add(f, s, name, err);
        if (rc) return rc;
    }
    return 0;
}

/* lora.targets: 1-16 unique module names; absent is the model's default. */
static int read_targets(const field *f, const json_t *t, jobspec *s, ty_err *err)
{
    if (!t) return 0;
    const char *P = f->path;
    if (!json_is_array(t))
        return ty_err_field(err, TY_EINVAL, P, "%s: must be an array, got %s", P,
                            json_type_word(t));
    size_t n = json_array_size(t);
    if (n == 0)
        return ty_err_field(err, TY_EINVAL, P,
                            "%s: must not be empty (omit it for the model's default)", P);
    if (n > (size_t)f->hi)
        return ty_err_field(err, TY_EINVAL, P, "%s: at most %d entries, got %zu", P, (int)f->hi, n);
    for (size_t i = 0; i < n; i++) {
        char p[FIELD_LEN];
        snprintf(p, sizeof p, "%s[%zu]", P, i);
        json_t *e = json_array_get(t, i);
        if (!json_is_string(e))
            return ty_err_field(err, TY_EINVAL, p, "%s: must be a string, got %s", p,
                                json_type_word(e));
        const char *name = json_string_value(e);
        if (!valid_target_name(name) || strlen(name) > 128)
            return ty_err_field(err, TY_EINVAL, p,
                                "%s: a module name is 1-128 characters of A-Z a-z 0-9 _ .", p);
        for (int j = 0; j < s->n_targets; j++)
            if (strcmp(s->targets[j], name) == 0)
                return ty_err_field(err, TY_EINVAL, p, "%s: duplicate target \"%s\"", p, name);
        int rc = array_add(f, s, name, err);
        if (rc) return rc;
    }
    return 0;
}

static int read_tags(const field *f, const json_t *t, jobspec *s, ty_err *err)
{
    if (!t) return 0;
    int rc = jobspec_check_tags(t, f->path, err);
    for (size_t i = 0; rc == 0 && i < json_array_size(t); i++)
        rc = array_add(f, s, json_string_value(json_array_get(t, i)), err);
    return rc;
}

/* webhooks: http(s) URLs of at most 1024 bytes, no spaces or controls. */
static int read_webhooks(const field *f, const json_t *w, jobspec *s, ty_err *err)
{
    if (!w) return 0;
    if (!json_is_array(w))
        return ty_err_field(err, TY_EINVAL, f->path, "%s: must be an array of URLs, got %s",
                            f->path, json_type_word(w));
    if (json_array_size(w) > (size_t)f->hi)
        return ty_err_field(err, TY_EINVAL, f->path, "%s: at most %d URLs", f->path, (int)f->hi);
    for (size_t i = 0; i < json_array_size(w); i++) {
        char p[FIELD_LEN];
        snprintf(p, sizeof p, "%s[%zu]", f->path, i);
        const char *u = json_string_value(json_array_get(w, i));
        bool ok =
            u && strlen(u) <= 1024 && (!strncmp(u, "http://", 7) || !strncmp(u, "https://", 8));
        for (const char *c = u; ok && *c; c++)
            ok = (unsigned char)*c > 0x20 && *c != 0x7f;
        if (!ok)
            return ty_err_field(err, TY_EINVAL, p,
                                "%s: must be an http:// or https:// URL of at most 1024 bytes", p);
        int rc = array_add(f, s, u, err);
        if (rc) return rc;
    }
    return 0;
}

/* ---- rules across rows ---- */

static int lora_allowed(const jobspec *s, ty_err *err)
{
    if (s->method != METHOD_FULL) return 0;
    return ty_err_field(
        err, TY_EINVAL, "lora",
        "lora: only meaningful with method \"lora\" or \"qlora\" (method is \"full\")");
}

static int qlora_allowed(const jobspec *s, ty_err *err)
{
    if (s->method == METHOD_QLORA) return 0;
    return ty_err_field(err, TY_EINVAL, "qlora",
                        "qlora: only meaningful with method \"qlora\" (method is \"%s\")",
                        jobspec_method_name(s->method));
}

static bool has_lora(const jobspec *s)
{
    return s->method != METHOD_FULL;
}

static bool has_qlora(const jobspec *s)
{
    return s->method == METHOD_QLORA;
}

static int check_eval_fraction(const jobspec *s, ty_err *err)
{
    if (!s->eval || s->eval_fraction <= 0) return 0;
    return ty_err_field(
        err, TY_EINVAL, "dataset.eval_fraction",
        "dataset.eval_fraction: give either dataset.eval or dataset.eval_fraction, not both");
}

static int check_dora(const jobspec *s, ty_err *err)
{
    if (!s->lora_use_dora || s->method != METHOD_QLORA) return 0;
    return ty_err_field(err, TY_EINVAL, "lora.use_dora",
                        "lora.use_dora: DoRA needs the base weights in full precision for its "
                        "weight norm; method qlora keeps them in NF4 (use method lora)");
}

static int check_ranks(const jobspec *s, ty_err *err)
{
    if (s->cpu_ranks <= 1 || s->gpus <= 0) return 0;
    return ty_err_field(err, TY_EINVAL, "resources.cpu_ranks",
                        "resources.cpu_ranks: a job runs %d CPU ranks or one rank per GPU "
                        "(resources.gpus = %d), not both",
                        s->cpu_ranks, s->gpus);
}

static int check_backend(const jobspec *s, ty_err *err)
{
    if (s->backend != BACKEND_CPU || s->gpus <= 0) return 0;
    return ty_err_field(err, TY_EINVAL, "resources.backend",
                        "resources.backend: \"cpu\" cannot use resources.gpus = %d", s->gpus);
}

/* ---- the field table ---- */

#define AT(m) .off = offsetof(jobspec, m), .size = sizeof(((jobspec *)0)->m)
#define SECTION .type = F_OBJECT
#define INT(l, h) .type = F_INT, .lo = (l), .hi = (h)
#define NUM(l, h) .type = F_NUM, .dlo = (l), .dhi = (h)
#define BOOL .type = F_BOOL
#define STR(n) .type = F_STR, .hi = (n)
#define PATH .type = F_PATH, .hi = PATH_MAX_LEN
#define STORE .type = F_STORE, .hi = PATH_MAX_LEN
#define ENUM(t, n) .type = (t), .names = (n), .n_names = NELEM(n)
#define STEPS 1000000000

/* In the order of jobspec_to_json's output; a section's rows follow it.
 * (lora.targets and lora.modules_to_save count in n_targets and n_save.) */
static const field FIELDS[] = {
    {"name", AT(name), STR(NAME_MAX_LEN)},
    {"model", SECTION, .flags = F_REQUIRED},
    {"model.path", AT(model_path), PATH},
    {"model.init", AT(model_init), .type = F_OPAQUE, .read = read_init},
    {"dataset", SECTION, .flags = F_REQUIRED},
    {"dataset.train", AT(train), PATH, .flags = F_REQUIRED},
    {"dataset.eval", AT(eval), PATH},
    {"dataset.format", AT(format), ENUM(F_ENUM, format_names), .def = "tokens"},
    {"dataset.text_field", AT(text_field), STR(256), .def = "text"},
    {"dataset.chat_template", AT(chat_template), ENUM(F_NAME, template_names), .def = "chatml"},
    {"dataset.packing", AT(packing), BOOL, .def = "false"},
    {"dataset.skip_invalid", AT(skip_invalid), BOOL, .def = "false"},
    {"dataset.eval_fraction", AT(eval_fraction), NUM(0, 0.5), .def = "0",
     .check = check_eval_fraction},
    {"method", AT(method), ENUM(F_ENUM, method_names), .def = "full"},
    {"lora", SECTION, .check = lora_allowed, .written = has_lora},
    {"lora.r", AT(lora_r), INT(1, 4096), .def = "8"},
    {"lora.alpha", AT(lora_alpha), NUM(0, 1e6), .flags = F_LO_OPEN, .def = "16"},
    {"lora.dropout", AT(lora_dropout), NUM(0, 1), .flags = F_HI_OPEN, .def = "0"},
    {"lora.use_rslora", AT(lora_use_rslora), BOOL, .def = "false"},
    {"lora.use_dora", AT(lora_use_dora), BOOL, .flags = F_OMIT_DEFAULT, .def = "false",
     .check = check_dora},
    {"lora.bias", AT(lora_bias), ENUM(F_ENUM, jobspec_bias_names), .def = "none"},
    {"lora.modules_to_save", AT(save), .type = F_ARRAY, .hi = JOBSPEC_MAX_TARGETS,
     .count_off = offsetof(jobspec, n_save), .flags = F_OMIT_DEFAULT, .read = read_save},
    {"lora.targets", AT(targets), .type = F_ARRAY, .hi = JOBSPEC_MAX_TARGETS,
     .count_off = offsetof(jobspec, n_targets), .flags = F_OMIT_DEFAULT, .read = read_targets},
    {"lora.adapter", AT(lora_adapter), PATH},
    {"lora.merge", AT(lora_merge), BOOL, .def = "false"},
    {"qlora", SECTION, .check = qlora_allowed, .written = has_qlora},
    {"qlora.double_quant", AT(qlora_double_quant), BOOL, .def = "true"},
    {"qlora.compute_dtype", AT(qlora_compute_dtype), ENUM(F_ENUM, export_dtype_names),
     .def = "auto"},
    {"hyperparameters", SECTION, .flags = F_REQUIRED},
    {"hyperparameters.max_steps", AT(max_steps), INT(1, STEPS), .flags = F_REQUIRED},
    {"hyperparameters.batch_size", AT(batch_size), INT(1, 65536), .def = "1"},
    {"hyperparameters.seq_len", AT(seq_len), INT(2, 1048576), .def = "256"},
    {"hyperparameters.grad_accum", AT(grad_accum), INT(1, 65536), .def = "1"},
    {"hyperparameters.lr", AT(lr), NUM(0, 10), .flags = F_LO_OPEN, .def = "1e-4"},
    {"hyperparameters.schedule", AT(schedule), ENUM(F_ENUM, schedule_names), .def = "constant"},
    {"hyperparameters.warmup_steps", AT(warmup_steps), INT(0, STEPS), .def = "0",
     .at_most = "hyperparameters.max_steps"},
    {"hyperparameters.weight_decay", AT(weight_decay), NUM(0, 10), .def = "0"},
    {"hyperparameters.max_grad_norm", AT(max_grad_norm), NUM(0, 1e6), .def = "1"},
    {"hyperparameters.adam_beta1", AT(adam_beta1), NUM(0, 1), .flags = F_HI_OPEN, .def = "0.9"},
    {"hyperparameters.adam_beta2", AT(adam_beta2), NUM(0, 1), .flags = F_HI_OPEN, .def = "0.999"},
    {"hyperparameters.adam_eps", AT(adam_eps), NUM(0, 1), .flags = F_LO_OPEN, .def = "1e-8"},
    {"hyperparameters.seed", AT(seed), INT(0, INT64_MAX), .def = "1234"},
    {"hyperparameters.log_every_steps", AT(log_every_steps), INT(1, STEPS), .def = "10"},
    {"hyperparameters.eval_every_steps", AT(eval_every_steps), INT(0, STEPS), .def = "0"},
    {"hyperparameters.recompute", AT(recompute), ENUM(F_ENUM, recompute_names), .def = "none"},
    {"precision", AT(precision), ENUM(F_ENUM, precision_names), .def = "fp32"},
    {"export", SECTION},
    {"export.dtype", AT(export_dtype), ENUM(F_ENUM, export_dtype_names), .def = "auto"},
    {"resources", SECTION},
    {"resources.gpus", AT(gpus), INT(0, 64), .def = "0"},
    {"resources.cpu_ranks", AT(cpu_ranks), INT(1, 256), .def = "1", .check = check_ranks},
    {"resources.nodes", AT(nodes), INT(1, 1024), .def = "1"},
    {"resources.zero", AT(zero), INT(0, 1), .def = "0"},
    {"resources.bucket_kb", AT(bucket_kb), INT(0, 1 << 20), .def = "4096"},
    {"resources.backend", AT(backend), ENUM(F_ENUM, backend_names), .def = "auto",
     .check = check_backend},
    {"checkpoint", SECTION},
    {"checkpoint.every_steps", AT(ckpt_every_steps), INT(0, STEPS), .def = "0"},
    {"checkpoint.keep_last", AT(keep_last), INT(0, 1000000), .def = "0"},
    {"checkpoint.keep_best", AT(keep_best), INT(0, 1000000), .def = "0"},
    {"checkpoint.store", AT(store), STORE},
    {"priority", AT(priority), INT(-1000, 1000), .def = "0"},
    {"max_restarts", AT(max_restarts), INT(0, 100), .def = "3"},
    {"tags", AT(tags), .type = F_ARRAY, .hi = JOBSPEC_MAX_TAGS,
     .count_off = offsetof(jobspec, n_tags), .read = read_tags},
    {"limits", SECTION},
    {"limits.max_cost", AT(max_cost), NUM(0, 1e12), .flags = F_LO_OPEN | F_NO_DEFAULT, .def = "-1"},
    {"limits.max_runtime_s", AT(max_runtime_s), INT(1, 100000000), .flags = F_NO_DEFAULT,
     .def = "0"},
    {"limits.max_tokens", AT(max_tokens), INT(1, INT64_MAX), .flags = F_NO_DEFAULT, .def = "0"},
    {"limits.stall_after_s", AT(stall_after_s), INT(1, 100000000), .flags = F_NO_DEFAULT,
     .def = "0"},
    {"limits.on_stall", AT(on_stall), ENUM(F_ENUM, on_stall_names), .def = "warn"},
    {"webhooks", AT(webhooks), .type = F_ARRAY, .hi = JOBSPEC_MAX_WEBHOOKS,
     .count_off = offsetof(jobspec, n_webhooks), .flags = F_OMIT_DEFAULT, .read = read_webhooks},
};
#define N_FIELDS NELEM(FIELDS)

static const field *find_row(const char *path)
{
    for (int i = 0; i < N_FIELDS; i++)
        if (strcmp(FIELDS[i].path, path) == 0) return &FIELDS[i];
    return NULL;
}

static int check_keys(const json_t *obj, const char *parent, ty_err *err)
{
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)obj, key, val)
    {
        char f[FIELD_LEN];
        path_join(f, sizeof f, parent, key);
        /* A dotted key ("lora.r" at the root) names no row of this object. */
        if (strchr(key, '.') || !find_row(f))
            return ty_err_field(err, TY_EINVAL, f, "%s: unknown field", f);
    }
    return 0;
}

/* ---- defaults and the parse ---- */

/* Sets the row's default (its "not set" value for F_NO_DEFAULT). */
static int set_default(const field *f, jobspec *s)
{
    if (!f->def) return 0;
    switch (f->type) {
    case F_INT:
        store_int(f, s, strtoll(f->def, NULL, 10));
        break;
    case F_NUM:
        *(double *)member(f, s) = strtod(f->def, NULL);
        break;
    case F_BOOL:
        *(bool *)member(f, s) = strcmp(f->def, "true") == 0;
        break;
    case F_ENUM:
        *(int *)member(f, s) = name_index(f, f->def);
        break;
    case F_STR:
    case F_NAME:
        if (!(*(char **)member(f, s) = strdup(f->def))) return TY_ENOMEM;
        break;
    default:
        break;
    }
    return 0;
}

static int set_defaults(jobspec *s, ty_err *err)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < N_FIELDS; i++)
        if (set_default(&FIELDS[i], s)) return ty_err_set(err, TY_ENOMEM, "out of memory");
    return 0;
}

/* A section row: *sec is its object, or NULL when it is absent (its rows
 * then keep their defaults). */
static int read_section(const json_t *root, const field *f, jobspec *s, const json_t **sec,
                        ty_err *err)
{
    json_t *v;
    int rc = get_field(root, f, WANT_OBJECT, &v, err);
    *sec = NULL;
    if (rc || !v) return rc;
    if (f->check && (rc = f->check(s, err))) return rc;
    if ((rc = check_keys(v, f->path, err))) return rc;
    *sec = v;
    return 0;
}

static int parse_all(const json_t *root, jobspec *s, ty_err *err)
{
    if (!json_is_object(root))
        return ty_err_field(err, TY_EINVAL, "", "a job spec must be a JSON object, got %s",
                            json_type_word(root));
    int rc = check_keys(root, "", err);
    const json_t *sec = NULL;
    for (int i = 0; rc == 0 && i < N_FIELDS; i++) {
        const field *f = &FIELDS[i];
        if (f->type == F_OBJECT)
            rc = read_section(root, f, s, &sec, err);
        else if (!strchr(f->path, '.'))
            rc = read_row(root, f, s, err);
        else if (sec)
            rc = read_row(sec, f, s, err);
    }
    return rc;
}

int jobspec_parse(json_t *root, jobspec *out, ty_err *err)
{
    jobspec s;
    ty_err_clear(err);
    int rc = set_defaults(&s, err);
    if (rc == 0) rc = parse_all(root, &s, err);
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

void jobspec_free(jobspec *s)
{
    if (!s) return;
    for (int i = 0; i < N_FIELDS; i++) {
        const field *f = &FIELDS[i];
        if (f->type == F_STR || f->type == F_PATH || f->type == F_STORE || f->type == F_NAME)
            free(*(char **)member(f, s));
        else if (f->type == F_OPAQUE)
            json_decref(*(json_t **)member(f, s));
        else if (f->type == F_ARRAY) {
            char **a = member(f, s);
            for (int k = 0; k < *(int *)((char *)s + f->count_off); k++)
                free(a[k]);
        }
    }
    memset(s, 0, sizeof *s);
}

/* ---- back to JSON ---- */

/* One row's value as JSON, or NULL where it is not written back. */
static json_t *row_json(const field *f, const jobspec *s)
{
    bool omit = (f->flags & (F_OMIT_DEFAULT | F_NO_DEFAULT)) != 0;
    const char *def = f->def ? f->def : "0";
    switch (f->type) {
    case F_INT: {
        int64_t v = load_int(f, s);
        return omit && v == strtoll(def, NULL, 10) ? NULL : json_integer(v);
    }
    case F_NUM: {
        double v = *(const double *)cmember(f, s);
        return omit && v == strtod(def, NULL) ? NULL : json_real(v);
    }
    case F_BOOL: {
        bool v = *(const bool *)cmember(f, s);
        return omit && v == !strcmp(def, "true") ? NULL : json_boolean(v);
    }
    case F_ENUM:
        return json_string(enum_name(f->names, f->n_names, *(const int *)cmember(f, s)));
    case F_OPAQUE: {
        const json_t *v = *(json_t *const *)cmember(f, s);
        return v ? json_deep_copy(v) : NULL;
    }
    case F_ARRAY: {
        char *const *a = cmember(f, s);
        int n = *(const int *)((const char *)s + f->count_off);
        json_t *arr = omit && n == 0 ? NULL : json_array();
        for (int k = 0; arr && k < n; k++)
            json_array_append_new(arr, json_string(a[k]));
        return arr;
    }
    default: {
        const char *v = *(char *const *)cmember(f, s);
        return v ? json_string(v) : NULL;
    }
    }
}

json_t *jobspec_to_json(const jobspec *s)
{
    json_t *root = json_object(), *sec = NULL;
    if (!root) return NULL;
    for (int i = 0; i < N_FIELDS; i++) {
        const field *f = &FIELDS[i];
        if (f->type == F_OBJECT) {
            sec = !f->written || f->written(s) ? json_object() : NULL;
            if (sec) json_object_set_new(root, f->path, sec);
            continue;
        }
        json_t *parent = strchr(f->path, '.') ? sec : root;
        json_t *v = parent ? row_json(f, s) : NULL;
        if (v) json_object_set_new(parent, row_key(f), v);
    }
    return root;
}

/* ---- the table as JSON Schema words ---- */

static const char *const schema_types[] = {
    [F_OBJECT] = "object", [F_INT] = "integer", [F_NUM] = "number",    [F_BOOL] = "boolean",
    [F_STR] = "string",    [F_PATH] = "string", [F_STORE] = "string",  [F_ENUM] = "string",
    [F_NAME] = "string",   [F_ARRAY] = "array", [F_OPAQUE] = "object",
};

/* A row's bounds, in openapi.yaml's words. */
static void schema_bounds(const field *f, json_t *o)
{
    if (f->type == F_INT) {
        json_object_set_new(o, "minimum", json_integer(f->lo));
        json_object_set_new(o, "maximum", json_integer(f->hi));
    } else if (f->type == F_NUM) {
        json_object_set_new(o, f->flags & F_LO_OPEN ? "exclusiveMinimum" : "minimum",
                            json_real(f->dlo));
        json_object_set_new(o, f->flags & F_HI_OPEN ? "exclusiveMaximum" : "maximum",
                            json_real(f->dhi));
    } else if (f->type == F_STR || f->type == F_PATH || f->type == F_STORE) {
        json_object_set_new(o, "minLength", json_integer(1));
        json_object_set_new(o, "maxLength", json_integer(f->hi));
    } else if (f->type == F_ARRAY)
        json_object_set_new(o, "maxItems", json_integer(f->hi));
}

/* The row's documented default as JSON. */
static json_t *def_json(const field *f)
{
    if (f->type == F_INT) return json_integer(strtoll(f->def, NULL, 10));
    if (f->type == F_NUM) return json_real(strtod(f->def, NULL));
    if (f->type == F_BOOL) return json_boolean(!strcmp(f->def, "true"));
    return json_string(f->def);
}

json_t *jobspec_schema(void)
{
    static const char *const kinds[] = {[F_PATH] = "path", [F_STORE] = "store"};
    json_t *rows = json_array();
    for (int i = 0; rows && i < N_FIELDS; i++) {
        const field *f = &FIELDS[i];
        json_t *o = json_pack("{s:s, s:s, s:b}", "path", f->path, "type", schema_types[f->type],
                              "required", (f->flags & F_REQUIRED) != 0);
        schema_bounds(f, o);
        if (f->type < NELEM(kinds) && kinds[f->type])
            json_object_set_new(o, "kind", json_string(kinds[f->type]));
        if (f->names) {
            json_t *e = json_array();
            for (int k = 0; k < f->n_names; k++)
                json_array_append_new(e, json_string(f->names[k]));
            json_object_set_new(o, "enum", e);
        }
        if (f->def && !(f->flags & F_NO_DEFAULT)) json_object_set_new(o, "default", def_json(f));
        if (f->flags & F_OMIT_DEFAULT) json_object_set_new(o, "omit_default", json_true());
        json_array_append_new(rows, o);
    }
    return rows;
}
