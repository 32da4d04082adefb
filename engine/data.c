/* data.c — tokens JSONL loading, batch rows and the per-epoch shuffle.
 *
 * Examples are stored flat (one token array, one label array, offsets) so a
 * large dataset costs two allocations, not one per line. */
#include "data.h"

#include "rng.h"
#include "tyopen.h"
#include "tyutil.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t *v;
    int64_t n, cap;
} i32vec;

static int vec_push(i32vec *a, int32_t x)
{
    if (a->n == a->cap) {
        int64_t cap = a->cap ? a->cap * 2 : 4096;
        int32_t *nv = realloc(a->v, (size_t)cap * sizeof *nv);
        if (!nv) return TY_ENOMEM;
        a->v = nv;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* Reads one integer array field; label arrays also accept -100. */
static int read_ids(json_t *arr, const char *path, long line, const char *key, int vocab,
                    int labels, i32vec *out, ty_err *err)
{
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x)
    {
        if (!json_is_integer(x))
            return ty_err_set(err, TY_EINVAL, "%s line %ld: %s[%zu] is not an integer", path, line,
                              key, i);
        json_int_t id = json_integer_value(x);
        if (labels && id == DATA_IGNORE) {
            if (vec_push(out, DATA_IGNORE))
                return ty_err_set(err, TY_ENOMEM, "out of memory reading %s", path);
            continue;
        }
        if (id < 0 || id >= vocab)
            return ty_err_set(err, TY_EINVAL,
                              "%s line %ld: %s[%zu] = %lld is outside the vocabulary [0, %d)", path,
                              line, key, i, (long long)id, vocab);
        if (vec_push(out, (int32_t)id))
            return ty_err_set(err, TY_ENOMEM, "out of memory reading %s", path);
    }
    return 0;
}

int data_load_tokens(const char *path, int vocab, dataset *d, ty_err *err)
{
    memset(d, 0, sizeof *d);
    /* Regular files inside the engine's roots only (tyopen.h). */
    ty_err oe = {0};
    FILE *fp = ty_fopen_input(path, &oe);
    if (!fp) return ty_err_set(err, oe.code, "dataset %s", oe.msg);
    i32vec tok = {0}, lab = {0};
    int64_t *off = NULL;
    int n = 0, cap = 0, rc = 0;
    char *buf = NULL;
    size_t bufcap = 0;
    ssize_t len;
    long line = 0;
    while ((len = getline(&buf, &bufcap, fp)) >= 0) {
        line++;
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' '))
            len--;
        if (len == 0) continue; /* blank lines carry no example */
        json_error_t je;
        json_t *o = json_loadb(buf, (size_t)len, 0, &je);
        if (!o) {
            rc = ty_err_set(err, TY_EINVAL, "%s line %ld: not valid JSON (column %d: %s)", path,
                            line, je.column, ty_json_error(&je));
            break;
        }
        json_t *ids = json_object_get(o, "input_ids"), *labels = json_object_get(o, "labels");
        if (!json_is_object(o) || !json_is_array(ids) || json_array_size(ids) == 0) {
            json_decref(o);
            rc = ty_err_set(err, TY_EINVAL,
                            "%s line %ld: needs \"input_ids\", a non-empty array of token ids",
                            path, line);
            break;
        }
        if (labels && !json_is_null(labels) &&
            (!json_is_array(labels) || json_array_size(labels) != json_array_size(ids))) {
            json_decref(o);
            rc = ty_err_set(err, TY_EINVAL,
                            "%s line %ld: \"labels\" must be an array as long as input_ids", path,
                            line);
            break;
        }
        int64_t start = tok.n;
        rc = read_ids(ids, path, line, "input_ids", vocab, 0, &tok, err);
        if (!rc && labels && !json_is_null(labels))
            rc = read_ids(labels, path, line, "labels", vocab, 1, &lab, err);
        else
            for (int64_t i = start; !rc && i < tok.n; i++)
                if (vec_push(&lab, tok.v[i]))
                    rc = ty_err_set(err, TY_ENOMEM, "out of memory reading %s", path);
        json_decref(o);
        if (rc) break;
        if (n + 1 >= cap) {
            cap = cap ? cap * 2 : 1024;
            int64_t *no = realloc(off, (size_t)(cap + 1) * sizeof *no);
            if (!no) {
                rc = ty_err_set(err, TY_ENOMEM, "out of memory reading %s", path);
                break;
            }
            off = no;
        }
        off[n] = start;
        n++;
        if (n == 0x7fffffff) {
            rc = ty_err_set(err, TY_ETOOBIG, "%s: too many examples", path);
            break;
        }
    }
    if (!rc && ferror(fp)) rc = ty_err_set(err, TY_EIO, "reading %s: %s", path, strerror(errno));
    fclose(fp);
    free(buf);
    if (!rc && n == 0) rc = ty_err_set(err, TY_EINVAL, "%s: empty dataset (no examples)", path);
    if (rc) {
        free(tok.v);
        free(lab.v);
        free(off);
        return rc;
    }
    off[n] = tok.n;
    d->n = n;
    d->off = off;
    d->tok = tok.v;
    d->lab = lab.v;
    return 0;
}

void data_free(dataset *d)
{
    if (!d) return;
    if (d->text && d->owns_text) d->ops->free(d->text);
    free(d->map);
    free(d->off);
    free(d->tok);
    free(d->lab);
    memset(d, 0, sizeof *d);
}

/* Copies the examples with keep[i] == want into out. */
static int data_subset(const dataset *d, const char *keep, char want, dataset *out)
{
    memset(out, 0, sizeof *out);
    int n = 0;
    int64_t toks = 0;
    for (int i = 0; i < d->n; i++)
        if (keep[i] == want) {
            n++;
            toks += d->off[i + 1] - d->off[i];
        }
    out->off = malloc(((size_t)n + 1) * sizeof *out->off);
    out->tok = malloc(((size_t)toks + 1) * sizeof *out->tok);
    out->lab = malloc(((size_t)toks + 1) * sizeof *out->lab);
    if (!out->off || !out->tok || !out->lab) {
        data_free(out);
        return TY_ENOMEM;
    }
    int64_t at = 0;
    for (int i = 0; i < d->n; i++) {
        if (keep[i] != want) continue;
        int64_t len = d->off[i + 1] - d->off[i];
        out->off[out->n++] = at;
        memcpy(out->tok + at, d->tok + d->off[i], (size_t)len * sizeof *out->tok);
        memcpy(out->lab + at, d->lab + d->off[i], (size_t)len * sizeof *out->lab);
        at += len;
    }
    out->off[out->n] = at;
    return 0;
}

/* Text formats: the split divides the row map; the text stays shared. */
static int text_subset(const dataset *d, const char *keep, char want, dataset *out)
{
    memset(out, 0, sizeof *out);
    out->map = malloc((size_t)d->n * sizeof *out->map);
    if (!out->map) return TY_ENOMEM;
    for (int i = 0; i < d->n; i++)
        if (keep[i] == want) out->map[out->n++] = d->map[i];
    out->text = d->text;
    out->ops = d->ops;
    out->skipped = d->skipped;
    return 0;
}

int data_split(dataset *d, double fraction, uint64_t seed, dataset *eval, ty_err *err)
{
    memset(eval, 0, sizeof *eval);
    if (d->n < 2)
        return ty_err_set(
            err, TY_EINVAL,
            "dataset.eval_fraction: %d example(s) cannot be split into train and eval", d->n);
    long long k = llround((double)d->n * fraction);
    if (k < 1) k = 1;
    if (k > d->n - 1) k = d->n - 1;
    int32_t *perm = malloc((size_t)d->n * sizeof *perm);
    char *held = calloc((size_t)d->n, 1);
    dataset train;
    int rc = 0;
    if (!perm || !held) rc = TY_ENOMEM;
    if (!rc) {
        data_permutation(seed ^ DATA_SPLIT_SALT, 0, d->n, perm);
        for (long long i = 0; i < k; i++)
            held[perm[i]] = 1;
        if (d->text) {
            rc = text_subset(d, held, 1, eval);
            if (!rc && (rc = text_subset(d, held, 0, &train))) data_free(eval);
        } else {
            rc = data_subset(d, held, 1, eval);
            if (!rc && (rc = data_subset(d, held, 0, &train))) data_free(eval);
        }
    }
    free(perm);
    free(held);
    if (rc) return ty_err_set(err, TY_ENOMEM, "out of memory splitting the dataset");
    if (d->text) { /* the train part takes over ownership of the text */
        train.owns_text = d->owns_text;
        d->owns_text = 0;
    }
    data_free(d);
    *d = train;
    return 0;
}

int data_row_from(const int32_t *tok, const int32_t *lab, int64_t len, int T, int32_t *inputs,
                  int32_t *targets)
{
    if (len > T) len = T;
    int count = 0;
    for (int t = 0; t < T; t++) {
        inputs[t] = t < len ? tok[t] : 0;
        /* Position t predicts label t+1; targets beyond the (truncated)
         * example are ignored, exactly like HF's shift inside the model. */
        targets[t] = t + 1 < len ? lab[t + 1] : DATA_IGNORE;
        if (targets[t] != DATA_IGNORE) count++;
    }
    return count;
}

int data_fill_row(const dataset *d, int ex, int T, int32_t *inputs, int32_t *targets)
{
    if (d->text) return d->ops->fill(d->text, d->map[ex], T, inputs, targets);
    int64_t b = d->off[ex];
    return data_row_from(d->tok + b, d->lab + b, d->off[ex + 1] - b, T, inputs, targets);
}

const char *data_error(const dataset *d)
{
    return d->text ? d->ops->error(d->text) : "no error";
}

void data_permutation(uint64_t seed, int64_t epoch, int n, int32_t *perm)
{
    uint64_t state = seed ^ ((uint64_t)(epoch + 1) * 0x9E3779B97F4A7C15ull);
    for (int i = 0; i < n; i++)
        perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_splitmix64(&state) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

int data_sampler_init(data_sampler *s, int n, uint64_t seed, int64_t epoch, int64_t pos,
                      ty_err *err)
{
    memset(s, 0, sizeof *s);
    if (n <= 0 || epoch < 0 || pos < 0 || pos > n)
        return ty_err_set(err, TY_EINVAL,
                          "data cursor (epoch %lld, position %lld) does not fit %d examples",
                          (long long)epoch, (long long)pos, n);
    s->perm = malloc((size_t)n * sizeof *s->perm);
    if (!s->perm) return ty_err_set(err, TY_ENOMEM, "out of memory for the data permutation");
    s->n = n;
    s->seed = seed;
    s->epoch = epoch;
    s->pos = pos;
    data_permutation(seed, epoch, n, s->perm);
    return 0;
}

int data_sampler_next(data_sampler *s)
{
    if (s->pos == s->n) {
        s->epoch++;
        s->pos = 0;
        data_permutation(s->seed, s->epoch, s->n, s->perm);
    }
    return s->perm[s->pos++];
}

void data_sampler_free(data_sampler *s)
{
    if (!s) return;
    free(s->perm);
    memset(s, 0, sizeof *s);
}
