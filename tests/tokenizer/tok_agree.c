/* tok_agree.c — agreement test: our tokenizer against ids recorded from an
 * independent JavaScript tokenizer (make-fixtures.mjs), plus the round trip
 * decode(encode(text)) == text on every case.
 *
 * Then four threads encode every case at once on the same tokenizer and
 * must all get the reference ids again (tok_encode is documented as safe
 * to call concurrently).
 *
 * usage: tok_agree MODEL_DIR CASES_JSON [--specials-roundtrip | --metaspace]
 * --metaspace: Mistral-style files lose the leading space of a text that
 * starts with one (its "▁" is taken for the prepended one and stripped, as
 * in Hugging Face), so such texts skip the round trip.
 * Without --specials-roundtrip, cases whose ids hold a special token skip
 * the round trip: SentencePiece-style models re-add a "▁" after each
 * special token, so their text legitimately differs (as in Hugging Face).
 * A case with a "decoded" string (tests/hf: the `tokenizers` library's own
 * decode of the reference ids) must decode to exactly that instead; with
 * "decode_only": true the case is only decoded (random ids). */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

#include "tyassert.h"

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s (%zu):", label, n);
    for (size_t i = 0; i < n && i < 60; i++)
        fprintf(stderr, " %d", (int)ids[i]);
    fprintf(stderr, n > 60 ? " ...\n" : "\n");
}

typedef struct agree_job {
    const tok_tokenizer *tok;
    json_t *cases;
    size_t start;
    size_t mismatches;
} agree_job;

/* Encodes every case (in an order that differs per thread) and counts
 * results that differ from the reference. */
static void *agree_thread(void *arg)
{
    agree_job *j = arg;
    size_t n_cases = json_array_size(j->cases);
    for (size_t r = 0; r < n_cases; r++) {
        json_t *c = json_array_get(j->cases, (r + j->start) % n_cases);
        if (json_is_true(json_object_get(c, "decode_only"))) continue;
        json_t *text = json_object_get(c, "text"), *want = json_object_get(c, "ids");
        int32_t *ids;
        size_t n;
        ty_err err;
        if (tok_encode(j->tok, json_string_value(text), json_string_length(text),
                       json_is_true(json_object_get(c, "add_special")), &ids, &n, &err)) {
            j->mismatches++;
            continue;
        }
        int same = n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++)
            same = ids[k] == json_integer_value(json_array_get(want, k));
        j->mismatches += !same;
        free(ids);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR CASES_JSON [--specials-roundtrip]\n", argv[0]);
        return 2;
    }
    int specials_roundtrip = argc > 3 && !strcmp(argv[3], "--specials-roundtrip");
    int metaspace = argc > 3 && !strcmp(argv[3], "--metaspace");
    tok_tokenizer *tok;
    ty_err err = {0};
    if (tok_load(&tok, argv[1], &err)) {
        fprintf(stderr, "FAIL: loading %s: %s\n", argv[1], err.msg);
        return 1;
    }
    json_error_t je;
    json_t *root = json_load_file(argv[2], JSON_ALLOW_NUL, &je);
    json_t *cases = json_object_get(root, "cases");
    if (!json_is_array(cases) || json_array_size(cases) == 0) {
        fprintf(stderr, "FAIL: %s: no cases (%s)\n", argv[2], je.text);
        return 1;
    }
    size_t i, roundtrips = 0;
    json_t *c;
    json_array_foreach(cases, i, c)
    {
        if (json_is_true(json_object_get(c, "decode_only"))) {
            /* Ids not made by encode (tests/hf: random ids, so byte runs
             * that are not UTF-8): only the decoded text is compared. */
            json_t *want = json_object_get(c, "ids"), *decoded = json_object_get(c, "decoded");
            size_t n = json_array_size(want);
            int32_t *w = malloc((n + 1) * sizeof *w);
            for (size_t k = 0; k < n; k++)
                w[k] = (int32_t)json_integer_value(json_array_get(want, k));
            char *back;
            size_t blen;
            if (tok_decode(tok, w, n, &back, &blen, &err)) {
                TY_FAIL("case %zu: decode: %s", i, err.msg);
            } else {
                if (blen != json_string_length(decoded) ||
                    memcmp(back, json_string_value(decoded), blen)) {
                    fprintf(stderr,
                            "FAIL case %zu: decode of random ids \"%s\", reference \"%s\"\n", i,
                            back, json_string_value(decoded));
                    print_ids("ids", w, n);
                    ty_failures++;
                }
                roundtrips++;
                free(back);
            }
            free(w);
            continue;
        }
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t tlen = json_string_length(json_object_get(c, "text"));
        int add_special = json_is_true(json_object_get(c, "add_special"));
        json_t *want = json_object_get(c, "ids");
        int32_t *ids;
        size_t n;
        if (tok_encode(tok, text, tlen, add_special, &ids, &n, &err)) {
            TY_FAIL("case %zu: encode: %s", i, err.msg);
            continue;
        }
        int same = n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++)
            same = ids[k] == json_integer_value(json_array_get(want, k));
        if (!same) {
            fprintf(stderr, "FAIL case %zu: ids differ for text \"%s\"\n", i, text);
            int32_t *w = malloc((json_array_size(want) + 1) * sizeof *w);
            for (size_t k = 0; k < json_array_size(want); k++)
                w[k] = (int32_t)json_integer_value(json_array_get(want, k));
            print_ids("reference", w, json_array_size(want));
            print_ids("ours     ", ids, n);
            free(w);
            ty_failures++;
        }
        int has_special = 0;
        for (size_t k = 0; k < n; k++) {
            const char *s = tok_token_str(tok, ids[k]);
            has_special |= (ids[k] == tok_bos(tok) || ids[k] == tok_eos(tok) ||
                            (s && s[0] == '<' && strlen(s) > 2 && s[strlen(s) - 1] == '>' &&
                             strncmp(s, "<0x", 3) != 0));
        }
        json_t *decoded = json_object_get(c, "decoded");
        if (json_is_string(decoded)) {
            char *back;
            size_t blen;
            if (tok_decode(tok, ids, n, &back, &blen, &err)) {
                TY_FAIL("case %zu: decode: %s", i, err.msg);
            } else {
                if (blen != json_string_length(decoded) ||
                    memcmp(back, json_string_value(decoded), blen)) {
                    TY_FAIL("case %zu: decode \"%s\", reference \"%s\"", i, back,
                            json_string_value(decoded));
                }
                roundtrips++;
                free(back);
            }
            free(ids);
            continue;
        }
        /* A case may say its text does not come back (NFC changed it). */
        int roundtrip = !json_is_false(json_object_get(c, "roundtrip"));
        if (roundtrip && (!add_special || tok_adds_bos(tok) == 0) &&
            (specials_roundtrip || !has_special) && !(metaspace && text[0] == ' ')) {
            char *back;
            size_t blen;
            if (tok_decode(tok, ids, n, &back, &blen, &err)) {
                TY_FAIL("case %zu: decode: %s", i, err.msg);
            } else {
                if (blen != tlen || memcmp(back, text, tlen)) {
                    TY_FAIL("case %zu: round trip \"%s\" -> \"%s\"", i, text, back);
                }
                roundtrips++;
                free(back);
            }
        }
        free(ids);
    }
    agree_job jobs[4];
    pthread_t th[4];
    for (int k = 0; k < 4; k++) {
        jobs[k] = (agree_job){tok, cases, (size_t)k * json_array_size(cases) / 4, 0};
        if (pthread_create(&th[k], NULL, agree_thread, &jobs[k])) {
            fprintf(stderr, "FAIL: pthread_create\n");
            return 1;
        }
    }
    for (int k = 0; k < 4; k++) {
        pthread_join(th[k], NULL);
        if (jobs[k].mismatches) {
            TY_FAIL("thread %d: %zu cases differ when encoding concurrently", k,
                    jobs[k].mismatches);
        }
    }
    printf("%s: %zu cases, %zu round trips, 4 concurrent passes\n", argv[2], json_array_size(cases),
           roundtrips);
    json_decref(root);
    tok_free(tok);
    return ty_summary(argv[2]);
}
