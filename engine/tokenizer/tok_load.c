/* tok_load.c — builds a tok_tokenizer from a Hugging Face model directory:
 * tokenizer.json (model, normalizer, pre-tokenizer, decoder, added tokens,
 * post-processor), tokenizer_config.json and config.json (bos / eos).
 *
 * The loader is strict on purpose: a component it does not implement, a
 * merge naming a token the vocabulary lacks, or a malformed field is an
 * error that names it, because a tokenizer that silently differs from the
 * one the model was trained with ruins a fine-tune without any visible sign. */
#include "tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tyutil.h"

#define TJ "tokenizer.json"

/* ---- small JSON helpers ------------------------------------------------------- */

static const char *jtype(json_t *o)
{
    json_t *t = json_object_get(o, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

/* Optional boolean member; absent or null keeps the default. */
static int jbool(json_t *o, const char *k, bool dflt, bool *out, const char *where, ty_err *err)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v))
        return ty_err_set(err, TY_EINVAL, TJ ": %s.%s must be true or false", where, k);
    *out = json_is_true(v);
    return 0;
}

/* Required string member; *len gets its byte length (strings may hold NUL). */
static int jstr(json_t *o, const char *k, const char **out, size_t *len, const char *where,
                ty_err *err)
{
    json_t *v = json_object_get(o, k);
    if (!json_is_string(v))
        return ty_err_set(err, TY_EINVAL, TJ ": %s.%s must be a string", where, k);
    *out = json_string_value(v);
    if (len) *len = json_string_length(v);
    return 0;
}

static char *memdup0(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* A single character given as a string (Metaspace replacement, Strip content). */
static int jchar(json_t *o, const char *k, const char *dflt, char out[8], size_t *out_len,
                 const char *where, ty_err *err)
{
    json_t *v = json_object_get(o, k);
    const char *s = dflt;
    if (v && !json_is_null(v)) {
        if (!json_is_string(v))
            return ty_err_set(err, TY_EINVAL, TJ ": %s.%s must be a string", where, k);
        s = json_string_value(v);
    }
    size_t n = strlen(s);
    if (n == 0 || n > 4 || (size_t)tok_utf8_len((unsigned char)s[0]) != n)
        return ty_err_set(err, TY_EINVAL, TJ ": %s.%s must be a single character", where, k);
    memcpy(out, s, n);
    out[n] = '\0';
    *out_len = n;
    return 0;
}

/* A Replace/Split pattern: {"String": "..."} or {"Regex": "..."}. */
static int jpattern(json_t *o, const char *where, const char **pat, size_t *len, bool *is_regex,
                    ty_err *err)
{
    json_t *p = json_object_get(o, "pattern");
    json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    if (json_is_string(s)) {
        *pat = json_string_value(s);
        *len = json_string_length(s);
        *is_regex = false;
        return 0;
    }
    if (json_is_string(r)) {
        *pat = json_string_value(r);
        *len = json_string_length(r);
        *is_regex = true;
        return 0;
    }
    return ty_err_set(err, TY_EINVAL,
                      TJ ": %s.pattern must be {\"String\": ...} or {\"Regex\": ...}", where);
}

static int parse_prepend_scheme(json_t *o, const char *where, tok_prepend *out, ty_err *err)
{
    json_t *ps = json_object_get(o, "prepend_scheme");
    if (json_is_string(ps)) {
        const char *s = json_string_value(ps);
        if (!strcmp(s, "always"))
            *out = PREPEND_ALWAYS;
        else if (!strcmp(s, "first"))
            *out = PREPEND_FIRST;
        else if (!strcmp(s, "never"))
            *out = PREPEND_NEVER;
        else
            return ty_err_set(err, TY_EINVAL, TJ ": %s.prepend_scheme \"%s\" is not supported",
                              where, ty_safe_word(s));
        return 0;
    }
    /* The older form says add_prefix_space instead. */
    bool aps = true;
    if (jbool(o, "add_prefix_space", true, &aps, where, err)) return err ? err->code : TY_EINVAL;
    *out = aps ? PREPEND_ALWAYS : PREPEND_NEVER;
    return 0;
}

/* ---- sequences -------------------------------------------------------------------- */

typedef int (*part_parser)(tok_tokenizer *t, json_t *o, const char *where, ty_err *err);

/* A "Sequence" normalizer, pre-tokenizer or decoder: each member of the array
 * o[key] is parsed in order by parse (which may meet a nested Sequence), and
 * named where.key[i] in its errors. */
static int parse_sequence(tok_tokenizer *t, json_t *o, const char *where, const char *key,
                          part_parser parse, ty_err *err)
{
    json_t *list = json_object_get(o, key);
    if (!json_is_array(list))
        return ty_err_set(err, TY_EINVAL, TJ ": %s.%s must be an array", where, key);
    size_t i;
    json_t *c;
    json_array_foreach(list, i, c)
    {
        char w[96];
        snprintf(w, sizeof w, "%s.%s[%zu]", where, key, i);
        int rc = parse(t, c, w, err);
        if (rc) return rc;
    }
    return 0;
}

/* ---- normalizers ---------------------------------------------------------------- */

static int add_norm(tok_tokenizer *t, tok_norm *n, ty_err *err)
{
    tok_norm *v = realloc(t->norms, (size_t)(t->n_norms + 1) * sizeof *v);
    if (!v) return ty_err_set(err, TY_ENOMEM, "out of memory");
    t->norms = v;
    t->norms[t->n_norms++] = *n;
    return 0;
}

static int parse_normalizer(tok_tokenizer *t, json_t *o, const char *where, ty_err *err)
{
    const char *type = jtype(o);
    if (!type) return ty_err_set(err, TY_EINVAL, TJ ": %s has no type", where);
    tok_norm n = {0};
    if (!strcmp(type, "Sequence"))
        return parse_sequence(t, o, where, "normalizers", parse_normalizer, err);
    if (!strcmp(type, "NFC"))
        n.kind = NORM_NFC;
    else if (!strcmp(type, "NFD"))
        n.kind = NORM_NFD;
    else if (!strcmp(type, "NFKC"))
        n.kind = NORM_NFKC;
    else if (!strcmp(type, "NFKD"))
        n.kind = NORM_NFKD;
    else if (!strcmp(type, "Lowercase"))
        n.kind = NORM_LOWERCASE;
    else if (!strcmp(type, "Prepend")) {
        const char *s = NULL;
        size_t len = 0;
        if (jstr(o, "prepend", &s, &len, where, err)) return err ? err->code : TY_EINVAL;
        n.kind = NORM_PREPEND;
        n.text = memdup0(s, len);
        n.text_len = len;
        if (!n.text) return ty_err_set(err, TY_ENOMEM, "out of memory");
    } else if (!strcmp(type, "Replace")) {
        const char *pat = NULL, *content = NULL;
        size_t plen = 0, clen = 0;
        bool is_regex = false;
        if (jpattern(o, where, &pat, &plen, &is_regex, err)) return err ? err->code : TY_EINVAL;
        if (jstr(o, "content", &content, &clen, where, err)) return err ? err->code : TY_EINVAL;
        if (plen == 0) return ty_err_set(err, TY_EINVAL, TJ ": %s.pattern is empty", where);
        n.kind = NORM_REPLACE;
        if (is_regex) {
            n.re = tok_regex_compile(pat, plen, false, where, err);
            if (!n.re) return err ? err->code : TY_EINVAL;
        } else {
            n.text = memdup0(pat, plen);
            n.text_len = plen;
        }
        n.content = memdup0(content, clen);
        n.content_len = clen;
        if ((!is_regex && !n.text) || !n.content) {
            free(n.text);
            free(n.content);
            pcre2_code_free(n.re);
            return ty_err_set(err, TY_ENOMEM, "out of memory");
        }
    } else if (!strcmp(type, "Strip")) {
        n.kind = NORM_STRIP;
        if (jbool(o, "strip_left", true, &n.left, where, err) ||
            jbool(o, "strip_right", true, &n.right, where, err))
            return err ? err->code : TY_EINVAL;
    } else {
        return ty_err_field(err, TY_EINVAL, where,
                            TJ ": normalizer type \"%s\" (%s) is not supported", ty_safe_word(type),
                            where);
    }
    int rc = add_norm(t, &n, err);
    if (rc) {
        free(n.text);
        free(n.content);
        pcre2_code_free(n.re);
    }
    return rc;
}

/* ---- pre-tokenizers --------------------------------------------------------------- */

/* GPT-2's split: contractions, letter runs, digit runs, other symbols, each
 * with one optional leading space; whitespace runs keep their last space for
 * the word that follows. Used by ByteLevel when use_regex is true. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_pre(tok_tokenizer *t, tok_pre *p, ty_err *err)
{
    tok_pre *v = realloc(t->pres, (size_t)(t->n_pres + 1) * sizeof *v);
    if (!v) return ty_err_set(err, TY_ENOMEM, "out of memory");
    t->pres = v;
    t->pres[t->n_pres++] = *p;
    return 0;
}

static int parse_pre_tokenizer(tok_tokenizer *t, json_t *o, const char *where, ty_err *err)
{
    const char *type = jtype(o);
    if (!type) return ty_err_set(err, TY_EINVAL, TJ ": %s has no type", where);
    if (t->byte_level)
        return ty_err_set(
            err, TY_EINVAL,
            TJ ": %s (%s) follows a ByteLevel pre-tokenizer; only ByteLevel last is supported",
            where, type);
    tok_pre p = {0};
    if (!strcmp(type, "Sequence"))
        return parse_sequence(t, o, where, "pretokenizers", parse_pre_tokenizer, err);
    if (!strcmp(type, "Split")) {
        const char *pat = NULL, *beh = NULL;
        size_t plen = 0;
        bool is_regex = false;
        if (jpattern(o, where, &pat, &plen, &is_regex, err)) return err ? err->code : TY_EINVAL;
        if (jstr(o, "behavior", &beh, NULL, where, err)) return err ? err->code : TY_EINVAL;
        if (jbool(o, "invert", false, &p.invert, where, err)) return err ? err->code : TY_EINVAL;
        if (!strcmp(beh, "Removed"))
            p.behavior = SPLIT_REMOVED;
        else if (!strcmp(beh, "Isolated"))
            p.behavior = SPLIT_ISOLATED;
        else if (!strcmp(beh, "MergedWithPrevious"))
            p.behavior = SPLIT_MERGED_PREV;
        else if (!strcmp(beh, "MergedWithNext"))
            p.behavior = SPLIT_MERGED_NEXT;
        else if (!strcmp(beh, "Contiguous"))
            p.behavior = SPLIT_CONTIGUOUS;
        else
            return ty_err_set(err, TY_EINVAL, TJ ": %s.behavior \"%s\" is not supported", where,
                              ty_safe_word(beh));
        if (plen == 0) return ty_err_set(err, TY_EINVAL, TJ ": %s.pattern is empty", where);
        p.kind = PRE_SPLIT;
        p.re = tok_regex_compile(pat, plen, !is_regex, where, err);
        if (!p.re) return err ? err->code : TY_EINVAL;
    } else if (!strcmp(type, "ByteLevel")) {
        bool use_regex = true;
        p.kind = PRE_BYTELEVEL;
        if (jbool(o, "add_prefix_space", true, &p.add_prefix_space, where, err) ||
            jbool(o, "use_regex", true, &use_regex, where, err))
            return err ? err->code : TY_EINVAL;
        if (use_regex) {
            p.behavior = SPLIT_ISOLATED;
            p.re = tok_regex_compile(gpt2_pattern, sizeof gpt2_pattern - 1, false, where, err);
            if (!p.re) return err ? err->code : TY_EINVAL;
        }
        t->byte_level = true;
    } else if (!strcmp(type, "Metaspace")) {
        p.kind = PRE_METASPACE;
        if (jchar(o, "replacement", "\xE2\x96\x81", p.replacement, &p.replacement_len, where,
                  err) ||
            parse_prepend_scheme(o, where, &p.prepend, err) ||
            jbool(o, "split", true, &p.split, where, err))
            return err ? err->code : TY_EINVAL;
    } else if (!strcmp(type, "Digits")) {
        p.kind = PRE_DIGITS;
        if (jbool(o, "individual_digits", false, &p.individual_digits, where, err))
            return err ? err->code : TY_EINVAL;
        const char *pat = p.individual_digits ? "\\p{Nd}" : "\\p{Nd}+";
        p.re = tok_regex_compile(pat, strlen(pat), false, where, err);
        if (!p.re) return err ? err->code : TY_EINVAL;
        p.behavior = SPLIT_ISOLATED;
    } else {
        return ty_err_field(err, TY_EINVAL, where,
                            TJ ": pre-tokenizer type \"%s\" (%s) is not supported",
                            ty_safe_word(type), where);
    }
    int rc = add_pre(t, &p, err);
    if (rc) pcre2_code_free(p.re);
    return rc;
}

/* ---- decoders ------------------------------------------------------------------------ */

static int add_dec(tok_tokenizer *t, tok_dec *d, ty_err *err)
{
    tok_dec *v = realloc(t->decs, (size_t)(t->n_decs + 1) * sizeof *v);
    if (!v) return ty_err_set(err, TY_ENOMEM, "out of memory");
    t->decs = v;
    t->decs[t->n_decs++] = *d;
    return 0;
}

static int parse_decoder(tok_tokenizer *t, json_t *o, const char *where, ty_err *err)
{
    const char *type = jtype(o);
    if (!type) return ty_err_set(err, TY_EINVAL, TJ ": %s has no type", where);
    tok_dec d = {0};
    if (!strcmp(type, "Sequence"))
        return parse_sequence(t, o, where, "decoders", parse_decoder, err);
    if (!strcmp(type, "ByteLevel"))
        d.kind = DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback"))
        d.kind = DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse"))
        d.kind = DEC_FUSE;
    else if (!strcmp(type, "Replace")) {
        const char *pat = NULL, *content = NULL;
        size_t plen = 0, clen = 0;
        bool is_regex = false;
        if (jpattern(o, where, &pat, &plen, &is_regex, err)) return err ? err->code : TY_EINVAL;
        if (is_regex)
            return ty_err_set(err, TY_EINVAL,
                              TJ ": %s: a Replace decoder with a Regex pattern is not supported",
                              where);
        if (jstr(o, "content", &content, &clen, where, err)) return err ? err->code : TY_EINVAL;
        if (plen == 0) return ty_err_set(err, TY_EINVAL, TJ ": %s.pattern is empty", where);
        d.kind = DEC_REPLACE;
        d.pattern = memdup0(pat, plen);
        d.pattern_len = plen;
        d.content = memdup0(content, clen);
        d.content_len = clen;
        if (!d.pattern || !d.content) {
            free(d.pattern);
            free(d.content);
            return ty_err_set(err, TY_ENOMEM, "out of memory");
        }
    } else if (!strcmp(type, "Strip")) {
        d.kind = DEC_STRIP;
        json_t *st = json_object_get(o, "start"), *sp = json_object_get(o, "stop");
        if (jchar(o, "content", " ", d.strip, &d.strip_len, where, err))
            return err ? err->code : TY_EINVAL;
        if ((st && !json_is_integer(st)) || (sp && !json_is_integer(sp)))
            return ty_err_set(err, TY_EINVAL, TJ ": %s.start and .stop must be integers", where);
        d.start = st ? (int)json_integer_value(st) : 0;
        d.stop = sp ? (int)json_integer_value(sp) : 0;
        if (d.start < 0 || d.stop < 0)
            return ty_err_set(err, TY_EINVAL, TJ ": %s.start and .stop must not be negative",
                              where);
    } else if (!strcmp(type, "Metaspace")) {
        d.kind = DEC_METASPACE;
        if (jchar(o, "replacement", "\xE2\x96\x81", d.strip, &d.strip_len, where, err) ||
            parse_prepend_scheme(o, where, &d.prepend, err))
            return err ? err->code : TY_EINVAL;
    } else {
        return ty_err_field(err, TY_EINVAL, where, TJ ": decoder type \"%s\" (%s) is not supported",
                            ty_safe_word(type), where);
    }
    int rc = add_dec(t, &d, err);
    if (rc) {
        free(d.pattern);
        free(d.content);
    }
    return rc;
}

/* ---- model: vocabulary and merges ------------------------------------------------------- */

/* Records the spelling of an id; added tokens overwrite the model's. */
static int set_piece(tok_tokenizer *t, int32_t id, const char *s, size_t len, bool overwrite,
                     ty_err *err)
{
    if (t->pieces[id] && !overwrite) return 0;
    char *p = memdup0(s, len);
    if (!p) return ty_err_set(err, TY_ENOMEM, "out of memory");
    free(t->pieces[id]);
    t->pieces[id] = p;
    t->piece_len[id] = (uint32_t)len;
    return 0;
}

static int parse_merge(json_t *m, size_t i, const char **a, size_t *alen, const char **b,
                       size_t *blen, ty_err *err)
{
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *sp = memchr(s, ' ', n);
        if (!sp || sp == s || sp == s + n - 1 || memchr(sp + 1, ' ', (size_t)(s + n - sp - 1)))
            return ty_err_field(
                err, TY_EINVAL, "model.merges",
                TJ ": model.merges[%zu] \"%.64s\" is not two tokens separated by one space", i, s);
        *a = s;
        *alen = (size_t)(sp - s);
        *b = sp + 1;
        *blen = n - *alen - 1;
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *alen = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *blen = json_string_length(json_array_get(m, 1));
        return 0;
    }
    return ty_err_field(err, TY_EINVAL, "model.merges",
                        TJ ": model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", i);
}

static int load_merges(tok_tokenizer *t, json_t *merges, ty_err *err)
{
    size_t n = json_array_size(merges);
    if (tok_pairmap_init(&t->merges, n)) return ty_err_set(err, TY_ENOMEM, "out of memory");
    tok_buf cat = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        rc = parse_merge(json_array_get(merges, i), i, &a, &alen, &b, &blen, err);
        if (rc) break;
        int32_t ia = tok_strmap_get(&t->vocab, a, alen), ib = tok_strmap_get(&t->vocab, b, blen);
        if (ia < 0 || ib < 0) {
            rc = ty_err_field(
                err, TY_EINVAL, "model.merges",
                TJ ": model.merges[%zu] names token \"%.*s\", which is not in the vocabulary", i,
                (int)(ia < 0 ? alen : blen), ia < 0 ? a : b);
            break;
        }
        cat.len = 0;
        if (tok_buf_put(&cat, a, alen) || tok_buf_put(&cat, b, blen)) {
            rc = ty_err_set(err, TY_ENOMEM, "out of memory");
            break;
        }
        int32_t im = tok_strmap_get(&t->vocab, cat.p, cat.len);
        if (im < 0) {
            rc = ty_err_field(
                err, TY_EINVAL, "model.merges",
                TJ ": model.merges[%zu] makes token \"%.*s\", which is not in the vocabulary", i,
                (int)cat.len, cat.p);
            break;
        }
        tok_pairmap_put(&t->merges, ia, ib, (int32_t)i, im);
    }
    tok_buf_free(&cat);
    return rc;
}

#define TOK_ID_GAP_MAX (1 << 20) /* unused ids a vocabulary may leave (max_id) */

/* Largest id among the model vocabulary and the added tokens, so the id ->
 * spelling table can be sized before it is filled. */
static int max_id(json_t *vocab, json_t *added, int64_t *out, ty_err *err)
{
    int64_t mx = -1;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 30))
            return ty_err_field(err, TY_EINVAL, "model.vocab",
                                TJ ": model.vocab[\"%.64s\"] must be an id in [0, 2^30)", k);
        if (json_integer_value(v) > mx) mx = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v)
    {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (1 << 30))
            return ty_err_field(err, TY_EINVAL, "added_tokens",
                                TJ ": added_tokens[%zu].id must be an id in [0, 2^30)", i);
        if (json_integer_value(id) > mx) mx = json_integer_value(id);
    }
    /* Ids index dense tables, so a few tokens with a huge id would cost gigabytes for
     * nothing: real vocabularies leave at most small gaps. */
    size_t n = json_object_size(vocab) + json_array_size(added);
    if (mx >= (int64_t)n + TOK_ID_GAP_MAX)
        return ty_err_field(err, TY_EINVAL, "model.vocab",
                            TJ ": id %lld leaves more than %d unused ids beside %zu tokens",
                            (long long)mx, TOK_ID_GAP_MAX, n);
    *out = mx;
    return 0;
}

static int parse_model(tok_tokenizer *t, json_t *model, ty_err *err)
{
    if (!json_is_object(model)) return ty_err_set(err, TY_EINVAL, TJ ": model is missing");
    const char *type = jtype(model);
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    /* Files written by early versions of tokenizers carry no model type;
     * a vocabulary with merges is a BPE model. */
    if (!type && merges) type = "BPE";
    if (!type) return ty_err_set(err, TY_EINVAL, TJ ": model.type is missing");
    if (strcmp(type, "BPE"))
        return ty_err_field(err, TY_EINVAL, "model.type",
                            TJ ": model.type \"%s\" is not supported (only BPE)",
                            ty_safe_word(type));
    if (!json_is_object(vocab))
        return ty_err_set(err, TY_EINVAL, TJ ": model.vocab must be an object");
    if (!json_is_array(merges))
        return ty_err_set(err, TY_EINVAL, TJ ": model.merges must be an array");

    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) > 0)
        return ty_err_field(err, TY_EINVAL, "model.dropout", TJ ": BPE dropout is not supported");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(model, affixes[i]);
        if (json_is_string(v) && json_string_length(v) > 0)
            return ty_err_field(err, TY_EINVAL, affixes[i], TJ ": model.%s is not supported",
                                affixes[i]);
    }
    if (jbool(model, "byte_fallback", false, &t->byte_fallback, "model", err) ||
        jbool(model, "fuse_unk", false, &t->fuse_unk, "model", err) ||
        jbool(model, "ignore_merges", false, &t->ignore_merges, "model", err))
        return err ? err->code : TY_EINVAL;

    if (tok_strmap_init(&t->vocab, json_object_size(vocab)))
        return ty_err_set(err, TY_ENOMEM, "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v)
    {
        int32_t id = (int32_t)json_integer_value(v);
        size_t klen = strlen(k);
        int rc = set_piece(t, id, k, klen, false, err);
        if (rc) return rc;
        /* The map owns its own copy of each key: an added token may later
         * replace the spelling stored for the same id. */
        char *key = memdup0(k, klen);
        if (!key) return ty_err_set(err, TY_ENOMEM, "out of memory");
        if (!tok_strmap_put(&t->vocab, key, (uint32_t)klen, id)) free(key);
    }

    t->unk_id = -1;
    json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk)) {
        t->unk_id = tok_strmap_get(&t->vocab, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0)
            return ty_err_field(err, TY_EINVAL, "model.unk_token",
                                TJ ": model.unk_token \"%s\" is not in the vocabulary",
                                ty_safe_word(json_string_value(unk)));
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->fallback_ids[b] = tok_strmap_get(&t->vocab, name, 6);
    }
    return load_merges(t, merges, err);
}

/* ---- added tokens ------------------------------------------------------------------------ */

static int cmp_added_len(const void *a, const void *b)
{
    const tok_added *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int parse_added(tok_tokenizer *t, json_t *added, ty_err *err)
{
    size_t n = json_array_size(added);
    if (tok_strmap_init(&t->added_map, n)) return ty_err_set(err, TY_ENOMEM, "out of memory");
    if (!n) return 0;
    t->added = calloc(n, sizeof *t->added);
    if (!t->added) return ty_err_set(err, TY_ENOMEM, "out of memory");
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a)
    {
        char w[48];
        snprintf(w, sizeof w, "added_tokens[%zu]", i);
        const char *content = NULL;
        size_t len = 0;
        tok_added *x = &t->added[t->n_added];
        if (jstr(a, "content", &content, &len, w, err)) return err ? err->code : TY_EINVAL;
        if (len == 0) return ty_err_set(err, TY_EINVAL, TJ ": %s.content is empty", w);
        if (jbool(a, "special", false, &x->special, w, err) ||
            jbool(a, "lstrip", false, &x->lstrip, w, err) ||
            jbool(a, "rstrip", false, &x->rstrip, w, err) ||
            jbool(a, "normalized", !x->special, &x->normalized, w, err) ||
            jbool(a, "single_word", false, &x->single_word, w, err))
            return err ? err->code : TY_EINVAL;
        x->id = (int32_t)json_integer_value(json_object_get(a, "id"));
        x->content = memdup0(content, len);
        if (!x->content) return ty_err_set(err, TY_ENOMEM, "out of memory");
        x->len = len;
        t->n_added++;
        int rc = set_piece(t, x->id, content, len, true, err);
        if (rc) return rc;
    }
    qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added_len);
    for (int j = 0; j < t->n_added; j++) {
        tok_strmap_put(&t->added_map, t->added[j].content, (uint32_t)t->added[j].len,
                       t->added[j].id);
        t->added_first[(unsigned char)t->added[j].content[0]] = true;
        t->any_normalized_added |= t->added[j].normalized;
    }
    return 0;
}

/* ---- post-processor and bos / eos ---------------------------------------------------------- */

/* An id the post-processor or config.json names must be one of this
 * tokenizer's tokens: encode would otherwise emit an id with no spelling
 * (or past the vocabulary), which decode and the model cannot take. */
static int known_id(const tok_tokenizer *t, json_int_t id, const char *what, ty_err *err)
{
    if (id < 0 || id >= t->vocab_size || !t->pieces[id])
        return ty_err_set(err, TY_EINVAL, "%s: id %lld is not a token of this tokenizer", what,
                          (long long)id);
    return 0;
}

/* The id a TemplateProcessing piece {"SpecialToken": {"id": "<s>"}} adds. */
static int template_special(const tok_tokenizer *t, json_t *proc, json_t *piece, int32_t *id,
                            ty_err *err)
{
    json_t *st = json_object_get(piece, "SpecialToken");
    if (!st) return 0;
    json_t *name = json_object_get(st, "id");
    json_t *spec =
        json_object_get(json_object_get(proc, "special_tokens"), json_string_value(name));
    json_t *ids = json_object_get(spec, "ids");
    if (!json_is_string(name) || json_array_size(ids) != 1 ||
        !json_is_integer(json_array_get(ids, 0)))
        return ty_err_set(err, TY_EINVAL,
                          TJ ": post_processor: special token \"%s\" must map to exactly one id",
                          json_is_string(name) ? ty_safe_word(json_string_value(name)) : "?");
    if (known_id(t, json_integer_value(json_array_get(ids, 0)), TJ ": post_processor", err))
        return TY_EINVAL;
    *id = (int32_t)json_integer_value(json_array_get(ids, 0));
    return 0;
}

static int parse_post_processor(tok_tokenizer *t, json_t *o, const char *where, ty_err *err)
{
    const char *type = jtype(o);
    if (!type) return ty_err_set(err, TY_EINVAL, TJ ": %s has no type", where);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(o, "processors");
        size_t i;
        json_t *c;
        json_array_foreach(list, i, c)
        {
            int rc = parse_post_processor(t, c, where, err);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0; /* only adjusts offsets */
    if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(o, "single");
        size_t n = json_array_size(single);
        if (!n)
            return ty_err_set(err, TY_EINVAL, TJ ": %s.single must be a non-empty array", where);
        size_t i;
        json_t *piece;
        int32_t id;
        json_array_foreach(single, i, piece)
        {
            bool ok = json_object_get(piece, "SpecialToken") || json_object_get(piece, "Sequence");
            if (!ok)
                return ty_err_set(err, TY_EINVAL,
                                  TJ ": %s.single[%zu] is neither SpecialToken nor Sequence", where,
                                  i);
            if (json_object_get(piece, "SpecialToken") && i != 0 && i != n - 1)
                return ty_err_set(
                    err, TY_EINVAL,
                    TJ ": %s: special tokens in the middle of the template are not supported",
                    where);
        }
        id = -1;
        if (template_special(t, o, json_array_get(single, 0), &id, err))
            return err ? err->code : TY_EINVAL;
        if (id >= 0) t->prefix_id = id;
        id = -1;
        if (n > 1 && template_special(t, o, json_array_get(single, n - 1), &id, err))
            return err ? err->code : TY_EINVAL;
        if (id >= 0) t->suffix_id = id;
        return 0;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_t *cls = json_object_get(o, "cls"), *sep = json_object_get(o, "sep");
        if (!json_is_integer(json_array_get(cls, 1)) || !json_is_integer(json_array_get(sep, 1)))
            return ty_err_set(err, TY_EINVAL, TJ ": %s.cls and .sep must be [token, id]", where);
        if (known_id(t, json_integer_value(json_array_get(cls, 1)), TJ ": post_processor.cls",
                     err) ||
            known_id(t, json_integer_value(json_array_get(sep, 1)), TJ ": post_processor.sep", err))
            return TY_EINVAL;
        t->prefix_id = (int32_t)json_integer_value(json_array_get(cls, 1));
        t->suffix_id = (int32_t)json_integer_value(json_array_get(sep, 1));
        return 0;
    }
    return ty_err_field(err, TY_EINVAL, where, TJ ": post-processor type \"%s\" is not supported",
                        ty_safe_word(type));
}

/* bos_token / eos_token in tokenizer_config.json: a string or an
 * AddedToken object {"content": ...}; null means none. */
static int config_token(tok_tokenizer *t, json_t *cfg, const char *key, int32_t *out, ty_err *err)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return ty_err_set(err, TY_EINVAL,
                          "tokenizer_config.json: %s must be a string or an object with content",
                          key);
    int32_t id = tok_token_id(t, json_string_value(v));
    if (id < 0)
        return ty_err_set(err, TY_EINVAL,
                          "tokenizer_config.json: %s \"%s\" is not a token of this tokenizer", key,
                          ty_safe_word(json_string_value(v)));
    *out = id;
    return 0;
}

/* bos_token_id / eos_token_id in config.json: an id or a list (the first
 * is the one we put in sequences). */
static int config_id(tok_tokenizer *t, json_t *cfg, const char *key, int32_t *out, ty_err *err)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_array(v)) v = json_array_get(v, 0);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= t->vocab_size || !t->pieces[json_integer_value(v)])
        return ty_err_set(err, TY_EINVAL, "config.json: %s is not an id of this tokenizer", key);
    *out = (int32_t)json_integer_value(v);
    return 0;
}

static int parse_special_config(tok_tokenizer *t, json_t *tcfg, json_t *cfg, ty_err *err)
{
    t->bos = t->eos = -1;
    if (tcfg && (config_token(t, tcfg, "bos_token", &t->bos, err) ||
                 config_token(t, tcfg, "eos_token", &t->eos, err)))
        return err ? err->code : TY_EINVAL;
    if (cfg && t->bos < 0 && config_id(t, cfg, "bos_token_id", &t->bos, err))
        return err ? err->code : TY_EINVAL;
    if (cfg && t->eos < 0 && config_id(t, cfg, "eos_token_id", &t->eos, err))
        return err ? err->code : TY_EINVAL;
    /* transformers rebuilds the template from these flags when they are set. */
    json_t *ab = json_object_get(tcfg, "add_bos_token"),
           *ae = json_object_get(tcfg, "add_eos_token");
    if (json_is_boolean(ab)) t->prefix_id = json_is_true(ab) ? t->bos : -1;
    if (json_is_boolean(ae)) t->suffix_id = json_is_true(ae) ? t->eos : -1;
    return 0;
}

/* ---- the whole file ------------------------------------------------------------------------ */

static json_t *parse_text(const char *text, const char *name, ty_err *err)
{
    json_error_t je;
    json_t *root = json_loads(text, JSON_ALLOW_NUL, &je);
    if (!root) {
        ty_err_set(err, TY_EINVAL, "%s: not valid JSON at line %d column %d: %s", name, je.line,
                   je.column, ty_json_error(&je));
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        ty_err_set(err, TY_EINVAL, "%s: must be a JSON object", name);
        return NULL;
    }
    return root;
}

static int build(tok_tokenizer *t, json_t *root, json_t *tcfg, json_t *cfg, ty_err *err)
{
    json_t *model = json_object_get(root, "model");
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added))
        return ty_err_set(err, TY_EINVAL, TJ ": added_tokens must be an array");
    if (!json_is_object(model)) return ty_err_set(err, TY_EINVAL, TJ ": model is missing");
    json_t *vocab = json_object_get(model, "vocab");
    int64_t mx = -1;
    if (json_is_object(vocab) && max_id(vocab, added, &mx, err)) return err ? err->code : TY_EINVAL;
    t->vocab_size = (int32_t)(mx + 1);
    t->pieces = calloc((size_t)t->vocab_size + 1, sizeof *t->pieces);
    t->piece_len = calloc((size_t)t->vocab_size + 1, sizeof *t->piece_len);
    if (!t->pieces || !t->piece_len) return ty_err_set(err, TY_ENOMEM, "out of memory");
    t->prefix_id = t->suffix_id = -1;

    int rc = parse_model(t, model, err);
    if (!rc) rc = parse_added(t, added, err);
    json_t *c;
    if (!rc && (c = json_object_get(root, "normalizer")) && !json_is_null(c))
        rc = parse_normalizer(t, c, "normalizer", err);
    if (!rc && (c = json_object_get(root, "pre_tokenizer")) && !json_is_null(c))
        rc = parse_pre_tokenizer(t, c, "pre_tokenizer", err);
    if (!rc && (c = json_object_get(root, "decoder")) && !json_is_null(c)) {
        t->has_decoder = true;
        rc = parse_decoder(t, c, "decoder", err);
    }
    if (!rc && (c = json_object_get(root, "post_processor")) && !json_is_null(c))
        rc = parse_post_processor(t, c, "post_processor", err);
    if (!rc) rc = parse_special_config(t, tcfg, cfg, err);
    if (rc) return rc;
    if (!(t->cache = tok_cache_new())) return ty_err_set(err, TY_ENOMEM, "out of memory");

    if (t->byte_level) {
        for (int b = 0; b < 256; b++) {
            char s[4];
            int n = tok_utf8_put(s, tok_byte_to_cp((unsigned)b));
            t->byte_ids[b] = tok_strmap_get(&t->vocab, s, (size_t)n);
            if (t->byte_ids[b] < 0)
                return ty_err_set(
                    err, TY_EINVAL,
                    TJ ": ByteLevel: the vocabulary has no token for byte 0x%02X (\"%.*s\")", b, n,
                    s);
        }
    }
    return 0;
}

int tok_load_json(tok_tokenizer **out, const char *tokenizer_json,
                  const char *tokenizer_config_json, const char *config_json, ty_err *err)
{
    *out = NULL;
    json_t *root = parse_text(tokenizer_json, TJ, err), *tcfg = NULL, *cfg = NULL;
    if (!root) return err ? err->code : TY_EINVAL;
    int rc = 0;
    if (tokenizer_config_json &&
        !(tcfg = parse_text(tokenizer_config_json, "tokenizer_config.json", err)))
        rc = err ? err->code : TY_EINVAL;
    if (!rc && config_json && !(cfg = parse_text(config_json, "config.json", err)))
        rc = err ? err->code : TY_EINVAL;
    tok_tokenizer *t = NULL;
    if (!rc) {
        t = calloc(1, sizeof *t);
        if (!t) rc = ty_err_set(err, TY_ENOMEM, "out of memory");
    }
    if (!rc) rc = build(t, root, tcfg, cfg, err);
    json_decref(root);
    json_decref(tcfg);
    json_decref(cfg);
    if (rc) {
        tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* Reads dir/name; a missing optional file leaves *text NULL. */
static int read_model_file(const char *dir, const char *name, bool required, char **text,
                           ty_err *err)
{
    char path[4096];
    size_t len;
    *text = NULL;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return ty_err_set(err, TY_EINVAL, "model directory path is too long");
    int rc = ty_read_file(path, text, &len, err);
    if (rc == TY_ENOENT && !required) {
        ty_err_clear(err);
        return 0;
    }
    if (rc == TY_ENOENT)
        return ty_err_set(err, TY_ENOENT,
                          "%s: no such file (the model directory needs a tokenizer.json)", path);
    return rc;
}

int tok_load(tok_tokenizer **out, const char *model_dir, ty_err *err)
{
    char *tj = NULL, *tc = NULL, *c = NULL;
    *out = NULL;
    int rc = read_model_file(model_dir, TJ, true, &tj, err);
    if (!rc) rc = read_model_file(model_dir, "tokenizer_config.json", false, &tc, err);
    if (!rc) rc = read_model_file(model_dir, "config.json", false, &c, err);
    if (!rc) rc = tok_load_json(out, tj, tc, c, err);
    free(tj);
    free(tc);
    free(c);
    return rc;
}

/* ---- accessors ------------------------------------------------------------------------------ */

int32_t tok_bos(const tok_tokenizer *t)
{
    return t->bos;
}
int32_t tok_eos(const tok_tokenizer *t)
{
    return t->eos;
}
int tok_adds_bos(const tok_tokenizer *t)
{
    return t->prefix_id >= 0;
}
int tok_adds_eos(const tok_tokenizer *t)
{
    return t->suffix_id >= 0;
}
int32_t tok_vocab_size(const tok_tokenizer *t)
{
    return t->vocab_size;
}

int32_t tok_token_id(const tok_tokenizer *t, const char *token)
{
    size_t n = strlen(token);
    int32_t id = tok_strmap_get(&t->added_map, token, n);
    return id >= 0 ? id : tok_strmap_get(&t->vocab, token, n);
}

const char *tok_token_str(const tok_tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->vocab_size) return NULL;
    return t->pieces[id];
}

void tok_free(tok_tokenizer *t)
{
    if (!t) return;
    for (int32_t i = 0; i < t->vocab_size; i++)
        free(t->pieces[i]);
    free(t->pieces);
    free(t->piece_len);
    if (t->vocab.val)
        for (uint32_t i = 0; i <= t->vocab.mask; i++)
            if (t->vocab.val[i] >= 0) free((char *)t->vocab.key[i]);
    tok_strmap_free(&t->vocab);
    tok_pairmap_free(&t->merges);
    for (int i = 0; i < t->n_norms; i++) {
        free(t->norms[i].text);
        free(t->norms[i].content);
        pcre2_code_free(t->norms[i].re);
    }
    free(t->norms);
    for (int i = 0; i < t->n_pres; i++)
        pcre2_code_free(t->pres[i].re);
    free(t->pres);
    for (int i = 0; i < t->n_decs; i++) {
        free(t->decs[i].pattern);
        free(t->decs[i].content);
    }
    free(t->decs);
    for (int i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    tok_strmap_free(&t->added_map);
    tok_cache_free(t->cache);
    free(t);
}
