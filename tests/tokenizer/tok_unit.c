/* tok_unit.c — unit tests of the tokenizer on small tokenizer.json files
 * built here: every bad input the issue lists gives a clear error naming
 * the culprit, and the components the real models use behave as Hugging
 * Face documents them (Split behaviours, NFC, added-token lstrip/rstrip,
 * byte fallback, bos/eos from the configs, lossy decode).
 *
 * Each check prints what it expected on failure; the exit status is the
 * number of failed checks (capped), so ctest reports any of them. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "tokenizer.h"

#include "tyassert.h"

/* A BPE tokenizer.json over the given tokens (ids in order) and merges. */
static json_t *bpe_json(const char *const *vocab, const char *const *merges)
{
    json_t *v = json_object(), *m = json_array();
    for (int i = 0; vocab[i]; i++)
        json_object_set_new(v, vocab[i], json_integer(i));
    for (int i = 0; merges && merges[i]; i++)
        json_array_append_new(m, json_string(merges[i]));
    return json_pack("{s:s, s:[], s:n, s:n, s:n, s:{s:s, s:o, s:o}}", "version", "1.0",
                     "added_tokens", "normalizer", "pre_tokenizer", "decoder", "model", "type",
                     "BPE", "vocab", v, "merges", m);
}

static tok_tokenizer *load(json_t *root, const char *tcfg, ty_err *err)
{
    char *text = json_dumps(root, 0);
    tok_tokenizer *t = NULL;
    ty_err_clear(err);
    if (tok_load_json(&t, text, tcfg, NULL, err)) t = NULL;
    free(text);
    json_decref(root);
    return t;
}

/* Loading must fail with TY_EINVAL and a message containing want. */
static void expect_load_error(json_t *root, const char *want, const char *what)
{
    ty_err err;
    tok_tokenizer *t = load(root, NULL, &err);
    CHECK(!t && err.code == TY_EINVAL && strstr(err.msg, want),
          "%s: wanted an error naming \"%s\", got %s \"%s\"", what, want,
          t ? "success" : ty_err_name(err.code), err.msg);
    tok_free(t);
}

/* Encodes text and compares with the expected token spellings. */
static void expect_tokens(const tok_tokenizer *t, const char *text, const char *const *want,
                          const char *what)
{
    int32_t *ids;
    size_t n;
    ty_err err;
    if (tok_encode(t, text, strlen(text), 0, &ids, &n, &err)) {
        CHECK(0, "%s: encode failed: %s", what, err.msg);
        return;
    }
    size_t nw = 0;
    while (want[nw])
        nw++;
    int ok = n == nw;
    for (size_t i = 0; ok && i < n; i++)
        ok = !strcmp(tok_token_str(t, ids[i]), want[i]);
    if (!ok) {
        fprintf(stderr, "FAIL: %s: got", what);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " [%s]", tok_token_str(t, ids[i]));
        fprintf(stderr, ", wanted");
        for (size_t i = 0; i < nw; i++)
            fprintf(stderr, " [%s]", want[i]);
        TY_FAIL("");
    }
    free(ids);
}

static const char *const small_vocab[] = {"a", "-", "b", "a-", "-a", "ab", "<0x41>", "<unk>", NULL};
static const char *const small_merges[] = {"a -", "- a", "a b", NULL};

static void test_bad_inputs(void)
{
    json_t *j = bpe_json(small_vocab, small_merges);
    json_object_set_new(json_object_get(j, "model"), "type", json_string("WordPiece"));
    expect_load_error(j, "model.type \"WordPiece\" is not supported", "unknown model type");

    static const char *const missing[] = {"a -", "a zz", NULL};
    expect_load_error(bpe_json(small_vocab, missing), "\"zz\", which is not in the vocabulary",
                      "merge naming a missing token");

    static const char *const no_result[] = {"b a", NULL};
    expect_load_error(bpe_json(small_vocab, no_result), "makes token \"ba\"",
                      "merge whose result is missing");

    static const char *const malformed[] = {"a - b", NULL};
    expect_load_error(bpe_json(small_vocab, malformed), "not two tokens", "merge with three parts");

    j = bpe_json(small_vocab, small_merges);
    json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "BertNormalizer"));
    expect_load_error(j, "normalizer type \"BertNormalizer\"", "unsupported normalizer");

    j = bpe_json(small_vocab, small_merges);
    json_object_set_new(
        j, "pre_tokenizer",
        json_pack("{s:s, s:[{s:s}]}", "type", "Sequence", "pretokenizers", "type", "Whitespace"));
    expect_load_error(j, "pre-tokenizer type \"Whitespace\"", "unsupported pre-tokenizer");

    j = bpe_json(small_vocab, small_merges);
    json_object_set_new(j, "decoder", json_pack("{s:s}", "type", "WordPiece"));
    expect_load_error(j, "decoder type \"WordPiece\"", "unsupported decoder");

    j = bpe_json(small_vocab, small_merges);
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "Regex",
                                  "(unclosed", "behavior", "Isolated"));
    expect_load_error(j, "regex does not compile", "bad regex");

    j = bpe_json(small_vocab, small_merges);
    json_object_set_new(json_object_get(j, "model"), "unk_token", json_string("<nope>"));
    expect_load_error(j, "unk_token \"<nope>\"", "unk token missing");

    /* Found by fuzz.tokenizer: a post-processor id that is no token was
     * accepted, and encode then emitted an id without a spelling. */
    j = bpe_json(small_vocab, small_merges);
    json_object_set_new(j, "post_processor",
                        json_pack("{s:s, s:[{s:{s:s}}, {s:{s:s}}], s:{s:{s:[i]}}}", "type",
                                  "TemplateProcessing", "single", "SpecialToken", "id", "<s>",
                                  "Sequence", "id", "A", "special_tokens", "<s>", "ids", 99));
    expect_load_error(j, "id 99 is not a token", "post-processor id outside the vocabulary");
    j = bpe_json(small_vocab, small_merges);
    json_object_set_new(j, "post_processor",
                        json_pack("{s:s, s:[s, i], s:[s, i]}", "type", "RobertaProcessing", "cls",
                                  "<s>", -1, "sep", "</s>", 2));
    expect_load_error(j, "id -1 is not a token", "Roberta cls id outside the vocabulary");

    /* Found by fuzz.tokenizer: one token with a huge id made the loader allocate
     * tables for every id below it (gigabytes from a file of bytes). */
    j = bpe_json(small_vocab, small_merges);
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "far",
                        json_integer(333333333));
    expect_load_error(j, "id 333333333 leaves more than", "vocabulary id far past the others");

    ty_err err;
    tok_tokenizer *t = NULL;
    CHECK(tok_load_json(&t, "{\"model\": ", NULL, NULL, &err) == TY_EINVAL &&
              strstr(err.msg, "not valid JSON"),
          "truncated JSON: got \"%s\"", err.msg);
    CHECK(tok_load(&t, "/nonexistent/model", &err) == TY_ENOENT &&
              strstr(err.msg, "tokenizer.json"),
          "missing directory: got \"%s\"", err.msg);
}

static void test_invalid_utf8(void)
{
    ty_err err;
    tok_tokenizer *t = load(bpe_json(small_vocab, small_merges), NULL, &err);
    CHECK(t != NULL, "small tokenizer loads: %s", err.msg);
    if (!t) return;
    static const struct {
        const char *s;
        size_t off;
    } bad[] = {
        {"ab\x80", 2},            /* stray continuation byte */
        {"a\xC3", 1},             /* truncated sequence */
        {"\xC0\xAF", 0},          /* overlong '/' */
        {"a\xED\xA0\x80", 1},     /* UTF-16 surrogate */
        {"a\xF5\x80\x80\x80", 1}, /* beyond U+10FFFF */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = NULL;
        size_t n;
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", bad[i].off);
        int rc = tok_encode(t, bad[i].s, strlen(bad[i].s), 0, &ids, &n, &err);
        CHECK(rc == TY_EINVAL && strstr(err.msg, "not valid UTF-8") && strstr(err.msg, want),
              "invalid UTF-8 case %zu: rc %d \"%s\"", i, rc, err.msg);
        free(ids);
    }
    /* An id outside the vocabulary cannot be decoded. */
    int32_t bad_id[] = {0, 99};
    char *text = NULL;
    size_t len;
    CHECK(tok_decode(t, bad_id, 2, &text, &len, &err) == TY_EINVAL && strstr(err.msg, "id 99"),
          "decode of unknown id: \"%s\"", err.msg);
    free(text);
    tok_free(t);
}

/* A Split on "-" with each behaviour; merges "a -" and "- a" show where the
 * piece boundaries fall. */
static void test_split_behaviours(void)
{
    static const struct {
        const char *behavior;
        int invert;
        const char *want[4];
    } cases[] = {
        {"Isolated", 0, {"a", "-", "a", NULL}},
        {"Removed", 0, {"a", "a", NULL}},
        {"MergedWithPrevious", 0, {"a-", "a", NULL}},
        {"MergedWithNext", 0, {"a", "-a", NULL}},
        {"Removed", 1, {"-", NULL}}, /* inverted: the non-matches are the delimiters */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = bpe_json(small_vocab, small_merges);
        json_object_set_new(j, "pre_tokenizer",
                            json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern",
                                      "String", "-", "behavior", cases[i].behavior, "invert",
                                      cases[i].invert));
        ty_err err;
        tok_tokenizer *t = load(j, NULL, &err);
        char what[64];
        snprintf(what, sizeof what, "Split %s%s", cases[i].behavior,
                 cases[i].invert ? " inverted" : "");
        CHECK(t != NULL, "%s loads: %s", what, err.msg);
        if (t) expect_tokens(t, "a-a", cases[i].want, what);
        tok_free(t);
    }
    /* No pre-tokenizer: BPE sees the whole text, the lower-ranked merge wins. */
    ty_err err;
    tok_tokenizer *t = load(bpe_json(small_vocab, small_merges), NULL, &err);
    static const char *const whole[] = {"a-", "a", NULL};
    if (t) expect_tokens(t, "a-a", whole, "no pre-tokenizer");
    tok_free(t);
}

/* SentencePiece-style pieces: NFC first, byte fallback for what the
 * vocabulary lacks, unk when there is no byte token, and added tokens with
 * lstrip / rstrip. */
static void test_normalizer_fallback_added(void)
{
    static const char *const vocab[] = {"<unk>",    "<s>",    "</s>",          "\xE2\x96\x81",
                                        "\xC3\xA9", "e",      "<0xCC>",        "<0x81>",
                                        "x",        "<mask>", "\xE2\x96\x81x", NULL};
    static const char *const merges[] = {"\xE2\x96\x81 x", NULL};
    json_t *j = bpe_json(vocab, merges);
    json_t *model = json_object_get(j, "model");
    json_object_set_new(model, "unk_token", json_string("<unk>"));
    json_object_set_new(model, "byte_fallback", json_true());
    json_object_set_new(model, "fuse_unk", json_true());
    json_object_set_new(j, "normalizer",
                        json_pack("{s:s, s:[{s:s}, {s:s, s:s}, {s:s, s:{s:s}, s:s}]}", "type",
                                  "Sequence", "normalizers", "type", "NFC", "type", "Prepend",
                                  "prepend", "\xE2\x96\x81", "type", "Replace", "pattern", "String",
                                  " ", "content", "\xE2\x96\x81"));
    json_object_set_new(
        j, "added_tokens",
        json_pack("[{s:i, s:s, s:b, s:b, s:b, s:b}, {s:i, s:s, s:b, s:b, s:b, s:b}]", "id", 1,
                  "content", "<s>", "special", 1, "normalized", 0, "lstrip", 0, "rstrip", 0, "id",
                  9, "content", "<mask>", "special", 1, "normalized", 0, "lstrip", 1, "rstrip", 1));
    json_object_set_new(
        j, "decoder",
        json_pack("{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]}", "type",
                  "Sequence", "decoders", "type", "Replace", "pattern", "String", "\xE2\x96\x81",
                  "content", " ", "type", "ByteFallback", "type", "Fuse", "type", "Strip",
                  "content", " ", "start", 1, "stop", 0));
    ty_err err;
    tok_tokenizer *t = load(
        j,
        "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\"}, \"add_bos_token\": true}",
        &err);
    CHECK(t != NULL, "sentencepiece-style tokenizer loads: %s", err.msg);
    if (!t) return;
    /* "e" + combining acute composes to é (in the vocabulary). */
    static const char *const nfc[] = {"\xE2\x96\x81", "\xC3\xA9", NULL};
    expect_tokens(t, "e\xCC\x81", nfc, "NFC before BPE");
    /* U+0301 alone has byte tokens <0xCC><0x81>; "y" has none: unk, fused. */
    static const char *const fb[] = {"\xE2\x96\x81", "<0xCC>", "<0x81>", "<unk>", NULL};
    expect_tokens(t, "\xCC\x81yyy", fb, "byte fallback then fused unk");
    /* <mask> swallows the spaces around it; <s> does not. */
    static const char *const strip2[] = {"\xE2\x96\x81x", "<mask>", "\xE2\x96\x81x", NULL};
    expect_tokens(t, "x  <mask>  x", strip2, "added token with lstrip/rstrip");
    CHECK(tok_bos(t) == 1 && tok_eos(t) == 2 && tok_adds_bos(t) && !tok_adds_eos(t),
          "bos/eos from tokenizer_config: bos %d eos %d", tok_bos(t), tok_eos(t));
    CHECK(tok_token_id(t, "<mask>") == 9 && tok_token_id(t, "nope") == -1, "tok_token_id");

    int32_t *ids;
    size_t n;
    if (!tok_encode(t, "x", 1, 1, &ids, &n, &err)) {
        CHECK(n == 2 && ids[0] == 1 && ids[1] == 10, "add_special puts bos first: n=%zu", n);
        free(ids);
    }
    /* Decode: <0xCC> alone is not UTF-8 and becomes U+FFFD; Strip removes
     * the one leading space the normalizer added. */
    int32_t lone[] = {3, 6, 8};
    char *text;
    size_t len;
    if (!tok_decode(t, lone, 3, &text, &len, &err)) {
        CHECK(!strcmp(text, "\xEF\xBF\xBDx"), "lossy byte fallback decode: \"%s\"", text);
        free(text);
    } else {
        CHECK(0, "decode failed: %s", err.msg);
    }
    tok_free(t);
}

/* Byte-level: every byte has a token, so any text encodes and decodes back
 * exactly, including control characters and NUL. */
static void test_byte_level(void)
{
    json_t *v = json_object();
    for (int b = 0; b < 256; b++) {
        /* GPT-2's map, written out independently of the library's table. */
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        static int next = 256;
        int cp = printable ? b : next++;
        char s[4];
        if (cp < 0x80) {
            s[0] = (char)cp;
            s[1] = 0;
        } else {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
            s[2] = 0;
        }
        json_object_set_new(v, s, json_integer(b));
    }
    json_object_set_new(v, "\xC4\xA0h", json_integer(256)); /* "Ġh" */
    json_t *j =
        json_pack("{s:[], s:{s:s, s:b}, s:{s:s}, s:{s:s, s:o, s:[s]}}", "added_tokens",
                  "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 1, "decoder", "type",
                  "ByteLevel", "model", "type", "BPE", "vocab", v, "merges", "\xC4\xA0 h");
    ty_err err;
    tok_tokenizer *t = load(j, NULL, &err);
    CHECK(t != NULL, "byte-level tokenizer loads: %s", err.msg);
    if (!t) return;
    const char text[] = "h\x00\x01\t\xF0\x9F\xA6\x99 h";
    int32_t *ids;
    size_t n;
    if (tok_encode(t, text, sizeof text - 1, 0, &ids, &n, &err)) {
        CHECK(0, "byte-level encode: %s", err.msg);
    } else {
        /* add_prefix_space makes the first word " h" -> one merged token. */
        CHECK(n > 0 && ids[0] == 256, "add_prefix_space + merge: first id %d", n ? ids[0] : -1);
        char *back;
        size_t blen;
        if (!tok_decode(t, ids, n, &back, &blen, &err)) {
            CHECK(blen == sizeof text && back[0] == ' ' && !memcmp(back + 1, text, sizeof text - 1),
                  "byte-level round trip (with the added prefix space), %zu bytes", blen);
            free(back);
        }
        free(ids);
    }
    tok_free(t);
}

/* Metaspace as current Hugging Face runs it: spaces replaced, then "▁"
 * prepended unless already there, split before each "▁"; the decoder drops
 * the first token's "▁". ignore_merges lets whole words map to the vocab. */
static void test_metaspace(void)
{
    static const char *const vocab[] = {"<unk>", "\xE2\x96\x81Hey", "\xE2\x96\x81",
                                        "\xE2\x96\x81"
                                        "friend!",
                                        NULL};
    json_t *j = bpe_json(vocab, NULL);
    json_t *model = json_object_get(j, "model");
    json_object_set_new(model, "unk_token", json_string("<unk>"));
    json_object_set_new(model, "ignore_merges", json_true());
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement",
                                  "\xE2\x96\x81", "prepend_scheme", "always", "split", 1));
    json_object_set_new(j, "decoder",
                        json_pack("{s:s, s:s, s:s}", "type", "Metaspace", "replacement",
                                  "\xE2\x96\x81", "prepend_scheme", "always"));
    ty_err err;
    tok_tokenizer *t = load(j, NULL, &err);
    CHECK(t != NULL, "metaspace tokenizer loads: %s", err.msg);
    if (!t) return;
    static const char *const runs[] = {"\xE2\x96\x81Hey", "\xE2\x96\x81", "\xE2\x96\x81",
                                       "\xE2\x96\x81"
                                       "friend!",
                                       NULL};
    expect_tokens(t, "Hey   friend!", runs, "Metaspace split before each space");
    static const char *const lead[] = {"\xE2\x96\x81Hey", NULL};
    expect_tokens(t, " Hey", lead, "Metaspace does not prepend to a leading space");
    int32_t ids[] = {1, 3};
    char *text;
    size_t len;
    if (!tok_decode(t, ids, 2, &text, &len, &err)) {
        CHECK(!strcmp(text, "Hey friend!"), "Metaspace decoder: \"%s\"", text);
        free(text);
    }
    tok_free(t);
}

/* The word cache through its own interface: far more distinct words than
 * it holds, so shards fill and are cleared; every hit must give back
 * exactly the ids stored for that word, never another word's. */
static void test_cache(void)
{
    tok_cache *cache = tok_cache_new();
    CHECK(cache != NULL, "cache allocates");
    if (!cache) return;
    tok_ids out = {0};
    size_t hits = 0, wrong = 0;
    /* 300 000 words through 64 shards of 2 048: every shard is cleared
     * many times over. Then the most recent ones are looked up again. */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = pass ? 290000 : 0; i < 300000; i++) {
            char w[32];
            int n = snprintf(w, sizeof w, "w%d", i);
            int32_t ids[3] = {i, i * 7, -i};
            out.n = 0;
            int r = tok_cache_get(cache, w, (size_t)n, &out);
            if (r == 1) {
                hits++;
                if (out.n != (size_t)(1 + i % 3) || memcmp(out.v, ids, out.n * sizeof *ids))
                    wrong++;
            } else if (r == 0 && !pass) {
                tok_cache_put(cache, w, (size_t)n, ids, (size_t)(1 + i % 3));
            }
        }
    }
    /* Words longer than the limit are never cached. */
    char long_word[TOK_CACHE_MAX_WORD + 2];
    memset(long_word, 'x', sizeof long_word);
    int32_t one = 5;
    tok_cache_put(cache, long_word, sizeof long_word, &one, 1);
    out.n = 0;
    CHECK(tok_cache_get(cache, long_word, sizeof long_word, &out) == 0,
          "over-long words are not cached");
    CHECK(wrong == 0 && hits > 0, "cache: %zu hits, %zu with wrong ids", hits, wrong);
    free(out.v);
    tok_cache_free(cache);
}

int main(void)
{
    test_bad_inputs();
    test_invalid_utf8();
    test_split_behaviours();
    test_normalizer_fallback_added();
    test_byte_level();
    test_metaspace();
    test_cache();
    return ty_summary("tokenizer unit");
}
