/* textdata.c — text / prompt_completion / chat JSONL datasets (textdata.h).
 *
 * Rendering follows the models' published chat templates (tokenizer_config
 * chat_template of ChatML models, Llama 3 Instruct and Llama 2 Chat). A
 * rendered example is one string with the spans that carry loss; it is
 * tokenised whole, and a span boundary at character b becomes the token
 * count of the prefix text[0, b) tokenised alone — the way TRL finds the
 * completion of a prompt. Boundaries sit at special tokens or whitespace in
 * every template, where BPE never merges across them. */
#include "textdata.h"

#include "chattpl.h"
#include "tyopen.h"
#include "tyutil.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tyutil.h"

typedef struct {
    int32_t *v;
    int64_t n, cap;
} ivec;

static int iv_reserve(ivec *a, int64_t want)
{
    if (want <= a->cap) return 0;
    int64_t cap = a->cap ? a->cap : 256;
    while (cap < want)
        cap *= 2;
    int32_t *nv = realloc(a->v, (size_t)cap * sizeof *nv);
    if (!nv) return TY_ENOMEM;
    a->v = nv;
    a->cap = cap;
    return 0;
}

/* A rendered example: text plus the character spans that carry loss. */
typedef struct {
    char *s;
    size_t n, cap;
    size_t span[2 * 64]; /* [start, end) pairs */
    int nspan;
    int all; /* text format: every token carries loss */
} render;

static int rd_put(render *r, const char *s, size_t n)
{
    if (n > ((size_t)1 << 40) || r->n > ((size_t)1 << 40))
        return TY_ETOOBIG; /* also bounds the sizes for -O3 */
    if (!r->s || r->n + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 1024;
        while (cap < r->n + n + 1)
            cap *= 2;
        char *ns = realloc(r->s, cap);
        if (!ns) return TY_ENOMEM;
        r->s = ns;
        r->cap = cap;
    }
    if (n) memcpy(r->s + r->n, s, n);
    r->n += n;
    r->s[r->n] = 0;
    return 0;
}

static int rd_str(render *r, const char *s)
{
    return rd_put(r, s, strlen(s));
}

/* Appends s with the loss flag; loss spans are recorded. */
static int rd_loss(render *r, const char *s, size_t n)
{
    if (r->nspan == 64) return TY_ETOOBIG;
    size_t at = r->n;
    if (rd_put(r, s, n)) return TY_ENOMEM;
    r->span[2 * r->nspan] = at;
    r->span[2 * r->nspan + 1] = r->n;
    r->nspan++;
    return 0;
}

/* Jinja's |trim / .strip(): ASCII whitespace at both ends. */
static void strip(const char **s, size_t *n)
{
    while (*n && strchr(" \t\n\r\f\v", (*s)[0]))
        (*s)++, (*n)--;
    while (*n && strchr(" \t\n\r\f\v", (*s)[*n - 1]))
        (*n)--;
}

/* A chat turn's content and its closing token. In an assistant turn both
 * carry the loss, as one span (the model learns to end its turn). */
static int rd_turn(render *r, const char *cs, size_t cn, const char *end, int loss)
{
    if (!loss) return rd_put(r, cs, cn) | rd_str(r, end);
    render part = {0};
    int oom = rd_put(&part, cs, cn) | rd_str(&part, end);
    oom |= part.s ? rd_loss(r, part.s, part.n) : 1;
    free(part.s);
    return oom;
}

struct data_text {
    char path[1024];
    const char *map; /* the file, mapped during the index pass only */
    size_t size;
    int fd;     /* rows are read back with pread */
    char *line; /* one line read back */
    size_t line_cap;
    textdata_opts o;
    char *field;
    int n_ex;
    int64_t *line_off; /* per example: byte offset, length, line number */
    int32_t *line_len;
    int32_t *line_no;
    int64_t *cum; /* packing: cumulative token counts, n_ex + 1 */
    int n_rows;
    ivec tok, lab, ptok, plab; /* scratch: one example; a packed row */
    render rd;
    chattpl *jt; /* TD_MODEL: the model's template, parsed once */
    char err[2048];
};

int textdata_template_parse(const char *name, textdata_template *out)
{
    if (!name || !strcmp(name, "chatml"))
        *out = TD_CHATML;
    else if (!strcmp(name, "llama3"))
        *out = TD_LLAMA3;
    else if (!strcmp(name, "llama2"))
        *out = TD_LLAMA2;
    else if (!strcmp(name, "model"))
        *out = TD_MODEL;
    else
        return TY_EINVAL;
    return 0;
}

/* ---- validation and rendering ------------------------------------------ */

static const char *str_field(json_t *o, const char *key, char *why, size_t n)
{
    json_t *v = json_object_get(o, key);
    if (!v) return snprintf(why, n, "missing field \"%s\"", key), NULL;
    if (!json_is_string(v)) return snprintf(why, n, "field \"%s\" must be a string", key), NULL;
    return json_string_value(v);
}

/* messages[0, n) rendered by the model's template into a malloc'd string. */
static int model_render(const struct data_text *t, json_t *msgs, size_t n, int gen, char **out,
                        size_t *on, char *why, size_t wn)
{
    json_t *part = json_array();
    for (size_t j = 0; part && j < n; j++)
        json_array_append(part, json_array_get(msgs, j));
    char *js = part ? json_dumps(part, JSON_COMPACT) : NULL;
    json_decref(part);
    if (!js) return snprintf(why, wn, "out of memory"), -1;
    int rc = chattpl_render(t->jt, js, gen, out, on, why, wn);
    free(js);
    return rc;
}

/* The model's own chat_template (TD_MODEL): the conversation rendered
 * whole; an assistant message i carries the loss from where messages[0, i)
 * with the generation prompt ends to where messages[0, i] ends — TRL's
 * prefix rule, so each of those renderings must be a prefix of the whole
 * (a template that rewrites earlier turns as the conversation grows is
 * refused, naming the message). With r NULL (the index pass) the example
 * is rendered all the same, so template errors name their line. */
static int render_model(const struct data_text *t, json_t *msgs, render *r, char *why, size_t wn)
{
    render local = {0};
    render *out = r ? r : &local;
    size_t nm = json_array_size(msgs), fn = 0;
    char *full = NULL;
    int rc = model_render(t, msgs, nm, 0, &full, &fn, why, wn);
    if (!rc && (rd_put(out, "", 0) || rd_put(out, full, fn))) {
        snprintf(why, wn, "out of memory");
        rc = -1;
    }
    for (size_t i = 0; !rc && i < nm; i++) {
        if (strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")),
                   "assistant"))
            continue;
        char *pre = NULL, *upto = NULL;
        size_t pn = 0, un = 0;
        rc = model_render(t, msgs, i, 1, &pre, &pn, why, wn);
        if (!rc) rc = model_render(t, msgs, i + 1, 0, &upto, &un, why, wn);
        if (!rc && (pn > un || un > fn || memcmp(upto, pre, pn) || memcmp(full, upto, un))) {
            snprintf(
                why, wn,
                "chat_template: the rendering up to messages[%zu] is not a prefix of the whole conversation's, "
                "so its loss cannot be placed",
                i);
            rc = -1;
        }
        if (!rc && un > pn) {
            if (out->nspan == 64) {
                snprintf(why, wn, "too many turns (64 assistant messages at most)");
                rc = -1;
            } else {
                out->span[2 * out->nspan] = pn;
                out->span[2 * out->nspan + 1] = un;
                out->nspan++;
            }
        }
        free(pre);
        free(upto);
    }
    free(full);
    free(local.s);
    return rc;
}

int textdata_model_template(const char *dir, char **out, ty_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *o;
    int rc = ty_read_json(path, TY_ENOENT, &o, err);
    if (rc) return rc;
    json_t *ct = json_object_get(o, "chat_template"), *v;
    size_t i;
    if (json_is_array(ct)) /* [{name, template}, ...]: transformers' default entry */
        json_array_foreach(ct, i,
                           v) if (json_is_string(json_object_get(v, "name")) &&
                                  !strcmp(json_string_value(json_object_get(v, "name")), "default"))
        {
            ct = json_object_get(v, "template");
            break;
        }
    if (!json_is_string(ct))
        rc = ty_err_field(err, TY_ENOENT, "dataset.chat_template",
                          "dataset.chat_template \"model\": %s has no chat_template string", path);
    else if (!(*out = strdup(json_string_value(ct))))
        rc = ty_err_set(err, TY_ENOMEM, "out of memory");
    json_decref(o);
    return rc;
}

/* Checks one parsed line against the format and renders it into r (when r
 * is not NULL). Returns 0, or -1 with the reason in why. */
static int render_example(const struct data_text *t, json_t *o, render *r, char *why, size_t wn)
{
    if (!json_is_object(o)) return snprintf(why, wn, "not a JSON object"), -1;
    if (r) {
        r->n = 0;
        r->nspan = 0;
        r->all = 0;
        if (rd_put(r, "", 0)) return snprintf(why, wn, "out of memory"), -1;
    }
    if (t->o.format == TD_TEXT) {
        const char *s = str_field(o, t->field, why, wn);
        if (!s) return -1;
        if (r) {
            r->all = 1;
            if (rd_put(r, s, json_string_length(json_object_get(o, t->field))))
                return snprintf(why, wn, "out of memory"), -1;
        }
        return 0;
    }
    if (t->o.format == TD_PROMPT_COMPLETION) {
        const char *p = str_field(o, "prompt", why, wn),
                   *c = p ? str_field(o, "completion", why, wn) : NULL;
        if (!p || !c) return -1;
        if (r && (rd_put(r, p, json_string_length(json_object_get(o, "prompt"))) ||
                  rd_loss(r, c, json_string_length(json_object_get(o, "completion")))))
            return snprintf(why, wn, "out of memory"), -1;
        return 0;
    }
    /* chat */
    json_t *msgs = json_object_get(o, "messages");
    if (!msgs) return snprintf(why, wn, "missing field \"messages\""), -1;
    if (!json_is_array(msgs) || !json_array_size(msgs))
        return snprintf(why, wn, "\"messages\" must be a non-empty array"), -1;
    size_t i, nm = json_array_size(msgs);
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role) || !json_is_string(content))
            return snprintf(why, wn, "messages[%zu] needs string \"role\" and \"content\"", i), -1;
        const char *rs = json_string_value(role);
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant"))
            return snprintf(why, wn, "messages[%zu].role is not system, user or assistant", i), -1;
        if (!strcmp(rs, "system") && i != 0)
            return snprintf(why, wn, "messages[%zu]: a system message must come first", i), -1;
    }
    const tok_tokenizer *tk = t->o.tok;
    const char *bos = tk && tok_bos(tk) >= 0 ? tok_token_str(tk, tok_bos(tk)) : NULL;
    const char *eos = tk && tok_eos(tk) >= 0 ? tok_token_str(tk, tok_eos(tk)) : NULL;
    textdata_template tp = t->o.chat_template;
    if (tp == TD_MODEL) return render_model(t, msgs, r, why, wn);
    if (tp == TD_LLAMA2) {
        /* Llama 2 chat: system folded into the first user turn, then strict
         * user/assistant alternation:
         *   <s>[INST] <<SYS>>\n{sys}\n<</SYS>>\n\n{user} [/INST] {assistant} </s> */
        size_t first = 0;
        const char *sys = NULL;
        if (!strcmp(json_string_value(json_object_get(json_array_get(msgs, 0), "role")),
                    "system")) {
            sys = json_string_value(json_object_get(json_array_get(msgs, 0), "content"));
            first = 1;
        }
        for (i = first; i < nm; i++) {
            const char *rs = json_string_value(json_object_get(json_array_get(msgs, i), "role"));
            if (strcmp(rs, (i - first) % 2 ? "assistant" : "user"))
                return snprintf(why, wn,
                                "messages[%zu]: llama2 needs roles alternating user/assistant", i),
                       -1;
        }
        if (!r) return 0;
        if (!bos || !eos)
            return snprintf(why, wn, "the llama2 template needs bos and eos tokens"), -1;
        int oom = 0;
        for (i = first; i < nm; i++) {
            json_t *c = json_object_get(json_array_get(msgs, i), "content");
            const char *cs = json_string_value(c);
            size_t cn = json_string_length(c);
            if ((i - first) % 2 == 0) {
                oom |= rd_str(r, bos) | rd_str(r, "[INST] ");
                if (i == first && sys) {
                    /* '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + content, then .strip() */
                    render tmp = {0};
                    oom |= rd_str(&tmp, "<<SYS>>\n") | rd_str(&tmp, sys) |
                           rd_str(&tmp, "\n<</SYS>>\n\n") | rd_put(&tmp, cs, cn);
                    const char *ts = tmp.s ? tmp.s : "";
                    size_t tn = tmp.n;
                    strip(&ts, &tn);
                    oom |= rd_put(r, ts, tn);
                    free(tmp.s);
                } else {
                    strip(&cs, &cn);
                    oom |= rd_put(r, cs, cn);
                }
                oom |= rd_str(r, " [/INST]");
            } else {
                /* ' ' + content.strip() + ' ' + eos_token carries the loss */
                strip(&cs, &cn);
                size_t at = r->n;
                oom |= rd_str(r, " ") | rd_put(r, cs, cn) | rd_str(r, " ") | rd_str(r, eos);
                if (!oom && r->nspan < 64) {
                    r->span[2 * r->nspan] = at;
                    r->span[2 * r->nspan + 1] = r->n;
                    r->nspan++;
                } else
                    oom = 1;
            }
        }
        return oom ? (snprintf(why, wn, "too many turns or out of memory"), -1) : 0;
    }
    if (!r) return 0;
    if (tp == TD_LLAMA3 && !bos)
        return snprintf(why, wn, "the llama3 template needs a bos token"), -1;
    int oom = 0;
    if (tp == TD_LLAMA3) oom |= rd_str(r, bos);
    json_array_foreach(msgs, i, m)
    {
        const char *rs = json_string_value(json_object_get(m, "role"));
        json_t *c = json_object_get(m, "content");
        const char *cs = json_string_value(c);
        size_t cn = json_string_length(c);
        int asst = !strcmp(rs, "assistant");
        if (tp == TD_CHATML) {
            /* <|im_start|>{role}\n{content}<|im_end|>\n — the assistant's
             * content and <|im_end|> carry the loss. */
            oom |= rd_str(r, "<|im_start|>") | rd_str(r, rs) | rd_str(r, "\n");
            oom |= rd_turn(r, cs, cn, "<|im_end|>", asst) | rd_str(r, "\n");
        } else {
            /* Llama 3: <|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|> */
            oom |= rd_str(r, "<|start_header_id|>") | rd_str(r, rs) |
                   rd_str(r, "<|end_header_id|>\n\n");
            strip(&cs, &cn);
            oom |= rd_turn(r, cs, cn, "<|eot_id|>", asst);
        }
    }
    return oom ? (snprintf(why, wn, "too many turns or out of memory"), -1) : 0;
}

/* Checks a raw line: UTF-8, JSON, fields. why gets the reason. */
static int check_line(struct data_text *t, const char *line, size_t len, char *why, size_t wn)
{
    if (!ty_utf8_valid(line, len)) {
        /* Name the first byte that starts no valid character (1-based). */
        size_t at = 0;
        while (at < len) {
            size_t k = 1;
            while (k <= 4 && at + k <= len && !ty_utf8_valid(line + at, k))
                k++;
            if (k > 4 || at + k > len) break;
            at += k;
        }
        return snprintf(why, wn, "invalid UTF-8 (byte %zu)", at + 1), -1;
    }
    json_error_t je;
    json_t *o = json_loadb(line, len, 0, &je);
    if (!o)
        return snprintf(why, wn, "not valid JSON (column %d: %s)", je.column, ty_json_error(&je)),
               -1;
    int rc = render_example(t, o, NULL, why, wn);
    json_decref(o);
    return rc;
}

/* ---- tokenisation of one example --------------------------------------- */

static int encode_len(const struct data_text *t, const char *s, size_t n, int64_t *out, char *why,
                      size_t wn)
{
    int32_t *ids = NULL;
    size_t k = 0;
    ty_err e = {0};
    int rc = tok_encode(t->o.tok, s, n, 0, &ids, &k, &e);
    free(ids);
    if (rc) return snprintf(why, wn, "%s", e.msg), -1;
    *out = (int64_t)k;
    return 0;
}

/* Tokenises example ex into t->tok / t->lab. */
static int build_example(struct data_text *t, int ex)
{
    char why[512];
    size_t llen = (size_t)t->line_len[ex];
    if (llen + 1 > t->line_cap) {
        char *nl = realloc(t->line, llen + 1);
        if (!nl) return snprintf(t->err, sizeof t->err, "out of memory reading %s", t->path), -1;
        t->line = nl;
        t->line_cap = llen + 1;
    }
    for (size_t got = 0; got < llen;) {
        ssize_t k = pread(t->fd, t->line + got, llen - got, (off_t)t->line_off[ex] + (off_t)got);
        if (k <= 0) {
            snprintf(t->err, sizeof t->err, "reading %s line %d: %s", t->path, t->line_no[ex],
                     k < 0 ? strerror(errno) : "the file is shorter than when it was indexed");
            return -1;
        }
        got += (size_t)k;
    }
    json_error_t je;
    json_t *o = json_loadb(t->line, llen, 0, &je);
    render *r = &t->rd;
    if (!o || render_example(t, o, r, why, sizeof why)) {
        if (!o)
            snprintf(why, sizeof why, "not valid JSON (column %d: %s)", je.column,
                     ty_json_error(&je));
        json_decref(o);
        snprintf(t->err, sizeof t->err, "%s line %d: %s", t->path, t->line_no[ex], why);
        return -1;
    }
    json_decref(o);
    const tok_tokenizer *tk = t->o.tok;
    int32_t *ids = NULL;
    size_t n = 0;
    ty_err e = {0};
    if (tok_encode(tk, r->s, r->n, 0, &ids, &n, &e)) {
        free(ids);
        snprintf(t->err, sizeof t->err, "%s line %d: %s", t->path, t->line_no[ex], e.msg);
        return -1;
    }
    /* text and prompt_completion: BOS when the tokenizer adds one, EOS
     * always (it ends the example, and separates examples when packed). */
    int plain = t->o.format != TD_CHAT;
    int bos = plain && tok_adds_bos(tk) && tok_bos(tk) >= 0, eos = plain && tok_eos(tk) >= 0;
    int64_t len = (int64_t)n + bos + eos;
    if (iv_reserve(&t->tok, len + 1) || iv_reserve(&t->lab, len + 1)) {
        free(ids);
        snprintf(t->err, sizeof t->err, "out of memory tokenising %s", t->path);
        return -1;
    }
    int64_t at = 0;
    if (bos) {
        t->tok.v[0] = tok_bos(tk);
        t->lab.v[0] = DATA_IGNORE;
        at = 1;
    }
    for (size_t i = 0; i < n; i++) {
        t->tok.v[at + (int64_t)i] = ids[i];
        t->lab.v[at + (int64_t)i] = r->all ? ids[i] : DATA_IGNORE;
    }
    free(ids);
    for (int s = 0; s < r->nspan; s++) {
        int64_t b[2];
        for (int k = 0; k < 2; k++) {
            size_t c = r->span[2 * s + k];
            if (c == r->n)
                b[k] = (int64_t)n;
            else if (encode_len(t, r->s, c, &b[k], why, sizeof why)) {
                snprintf(t->err, sizeof t->err, "%s line %d: %s", t->path, t->line_no[ex], why);
                return -1;
            }
            if (b[k] > (int64_t)n) b[k] = (int64_t)n;
        }
        for (int64_t i = b[0]; i < b[1]; i++)
            t->lab.v[at + i] = t->tok.v[at + i];
    }
    at += (int64_t)n;
    if (eos) {
        t->tok.v[at] = tok_eos(tk);
        t->lab.v[at] = tok_eos(tk);
        at++;
    }
    for (int64_t i = 0; i < at; i++)
        if (t->tok.v[i] >= t->o.vocab) {
            snprintf(t->err, sizeof t->err,
                     "%s line %d: token id %d is outside the model's vocabulary [0, %d)", t->path,
                     t->line_no[ex], t->tok.v[i], t->o.vocab);
            return -1;
        }
    t->tok.n = t->lab.n = at;
    return 0;
}

/* ---- rows ---------------------------------------------------------------- */

static int td_fill(struct data_text *t, int row, int T, int32_t *inputs, int32_t *targets)
{
    if (!t->o.packing) {
        if (build_example(t, row)) return -1;
        return data_row_from(t->tok.v, t->lab.v, t->tok.n, T, inputs, targets);
    }
    /* Packed row j is the concatenation's tokens [jT, jT + T), the last
     * position without a target, as HF's group_texts + the model's shift. */
    int64_t lo = (int64_t)row * T, hi = lo + T, total = t->cum[t->n_ex];
    if (hi > total) hi = total;
    int a = 0, b = t->n_ex;
    while (b - a > 1) { /* last example starting at or before lo */
        int mid = (a + b) / 2;
        if (t->cum[mid] <= lo)
            a = mid;
        else
            b = mid;
    }
    if (iv_reserve(&t->ptok, T) || iv_reserve(&t->plab, T)) {
        snprintf(t->err, sizeof t->err, "out of memory packing %s", t->path);
        return -1;
    }
    int64_t got = 0;
    for (int ex = a; ex < t->n_ex && t->cum[ex] < hi; ex++) {
        if (build_example(t, ex)) return -1;
        if (t->tok.n != t->cum[ex + 1] - t->cum[ex]) {
            snprintf(t->err, sizeof t->err,
                     "%s changed while training (line %d tokenises differently)", t->path,
                     t->line_no[ex]);
            return -1;
        }
        for (int64_t i = 0; i < t->tok.n; i++) {
            int64_t p = t->cum[ex] + i;
            if (p < lo || p >= hi) continue;
            t->ptok.v[p - lo] = t->tok.v[i];
            t->plab.v[p - lo] = t->lab.v[i];
            got++;
        }
    }
    /* data_row_from shifts labels by one: row position T-1 gets no target. */
    return data_row_from(t->ptok.v, t->plab.v, got, T, inputs, targets);
}

static const char *td_error(const struct data_text *t)
{
    return t->err;
}

static void td_free(struct data_text *t)
{
    if (!t) return;
    if (t->map && t->size) munmap((void *)t->map, t->size);
    if (t->fd >= 0) close(t->fd);
    free(t->line);
    free(t->field);
    free(t->line_off);
    free(t->line_len);
    free(t->line_no);
    free(t->cum);
    free(t->tok.v);
    free(t->lab.v);
    free(t->ptok.v);
    free(t->plab.v);
    free(t->rd.s);
    chattpl_free(t->jt);
    free(t);
}

static const data_text_ops td_ops = {td_fill, td_error, td_free};

/* ---- indexing ------------------------------------------------------------ */

int textdata_open(const char *path, const textdata_opts *o, dataset *d, ty_err *err)
{
    memset(d, 0, sizeof *d);
    struct data_text *t = calloc(1, sizeof *t);
    if (!t) return ty_err_set(err, TY_ENOMEM, "out of memory indexing %s", path);
    snprintf(t->path, sizeof t->path, "%s", path);
    t->o = *o;
    t->field = strdup(o->text_field ? o->text_field : "text");
    int rc = 0;
    if (o->format == TD_CHAT && o->chat_template == TD_MODEL) {
        /* The model's own template, parsed once for every example. */
        const tok_tokenizer *tk = o->tok;
        const char *bos = tk && tok_bos(tk) >= 0 ? tok_token_str(tk, tok_bos(tk)) : NULL;
        const char *eos = tk && tok_eos(tk) >= 0 ? tok_token_str(tk, tok_eos(tk)) : NULL;
        char why[512] = "no chat_template given";
        if (!o->model_template ||
            !(t->jt = chattpl_new(o->model_template, bos, eos, why, sizeof why))) {
            rc = ty_err_field(err, TY_EINVAL, "dataset.chat_template",
                              "dataset.chat_template \"model\": %s", why);
            goto out;
        }
    }
    /* Regular files inside the engine's roots only (tyopen.h). */
    ty_err oe = {0};
    int fd = t->fd = ty_open_input(path, &oe);
    struct stat st;
    if (fd < 0) {
        rc = ty_err_set(err, oe.code, "dataset %s", oe.msg);
        goto out;
    }
    if (fstat(fd, &st)) {
        rc = ty_err_set(err, TY_EIO, "dataset %s: %s", path, strerror(errno));
        goto out;
    }
    t->size = (size_t)st.st_size;
    if (t->size) {
        void *p = mmap(NULL, t->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            t->size = 0;
            rc = ty_err_set(err, TY_EIO, "dataset %s: mmap: %s", path, strerror(errno));
            goto out;
        }
        t->map = p;
        madvise(p, t->size, MADV_SEQUENTIAL);
    }
    /* One pass: every line is checked and its offset kept. */
    int cap = 0;
    long line = 0;
    size_t dropped = 0;
    const size_t chunk = (size_t)64 << 20;
    for (size_t pos = 0; pos < t->size;) {
        /* Pages behind the scan are dropped as it goes: the index pass
         * never holds more than a chunk of the file in the process. */
        if (pos - dropped >= chunk) {
            madvise((void *)(t->map + dropped), chunk, MADV_DONTNEED);
            dropped += chunk;
        }
        const char *s = t->map + pos, *nl = memchr(s, '\n', t->size - pos);
        size_t len = nl ? (size_t)(nl - s) : t->size - pos;
        size_t next = pos + len + (nl ? 1 : 0);
        line++;
        while (len && (s[len - 1] == '\r' || s[len - 1] == ' '))
            len--;
        if (!len) {
            pos = next;
            continue;
        }
        char why[512];
        if (check_line(t, s, len, why, sizeof why)) {
            if (!o->skip_invalid) {
                rc = ty_err_set(err, TY_EINVAL, "%s line %ld: %s", path, line, why);
                goto out;
            }
            d->skipped++;
            pos = next;
            continue;
        }
        if (t->n_ex == cap) {
            cap = cap ? cap * 2 : 4096;
            int64_t *a = realloc(t->line_off, (size_t)cap * sizeof *a);
            if (a) t->line_off = a;
            int32_t *b = realloc(t->line_len, (size_t)cap * sizeof *b);
            if (b) t->line_len = b;
            int32_t *c = realloc(t->line_no, (size_t)cap * sizeof *c);
            if (c) t->line_no = c;
            if (!a || !b || !c) {
                rc = ty_err_set(err, TY_ENOMEM, "out of memory indexing %s", path);
                goto out;
            }
        }
        if (len > INT32_MAX || line > INT32_MAX || t->n_ex == INT32_MAX - 1) {
            rc = ty_err_set(err, TY_ETOOBIG, "%s line %ld: line too long or too many lines", path,
                            line);
            goto out;
        }
        t->line_off[t->n_ex] = (int64_t)pos;
        t->line_len[t->n_ex] = (int32_t)len;
        t->line_no[t->n_ex] = (int32_t)line;
        t->n_ex++;
        pos = next;
    }
    if (t->n_ex == 0) {
        rc = ty_err_set(err, TY_EINVAL, "%s: empty dataset (no %sexamples)", path,
                        d->skipped ? "valid " : "");
        goto out;
    }
    if (t->map) munmap((void *)t->map, t->size);
    t->map = NULL;
    t->n_rows = t->n_ex;
    if (o->packing) {
        /* Token counts only; the tokens themselves are rebuilt per row. */
        t->cum = malloc(((size_t)t->n_ex + 1) * sizeof *t->cum);
        if (!t->cum) {
            rc = ty_err_set(err, TY_ENOMEM, "out of memory indexing %s", path);
            goto out;
        }
        t->cum[0] = 0;
        for (int ex = 0; ex < t->n_ex; ex++) {
            if (build_example(t, ex)) {
                rc = ty_err_set(err, TY_EINVAL, "%s", t->err);
                goto out;
            }
            t->cum[ex + 1] = t->cum[ex] + t->tok.n;
        }
        int64_t rows = t->cum[t->n_ex] / o->seq_len;
        if (rows < 1) rows = 1; /* shorter than one row: one padded row */
        if (rows > INT32_MAX - 1) {
            rc = ty_err_set(err, TY_ETOOBIG, "%s: too many packed rows", path);
            goto out;
        }
        t->n_rows = (int)rows;
    }
    d->map = malloc((size_t)t->n_rows * sizeof *d->map);
    if (!d->map) {
        rc = ty_err_set(err, TY_ENOMEM, "out of memory indexing %s", path);
        goto out;
    }
    for (int i = 0; i < t->n_rows; i++)
        d->map[i] = i;
    d->n = t->n_rows;
    d->text = t;
    d->ops = &td_ops;
    d->owns_text = 1;
out:
    if (rc) { /* td_free closes the file */
        free(d->map);
        d->map = NULL;
        td_free(t);
    }
    return rc;
}
