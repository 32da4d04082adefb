/* fuzz_tokenizer.c — the tokenizer.json loader (engine/tokenizer/tok_load.c)
 * and, when a tokenizer loads, encoding and decoding with it.
 *
 * Input layout: tokenizer.json [NUL tokenizer_config.json [NUL text]]. The
 * config part is optional (empty = absent); the text defaults to a line
 * with spaces, digits, accents, an emoji and special-token spellings. The
 * promises of tokenizer.h are checked: every id an encode returns is below
 * tok_vocab_size and has a spelling, and decode always gives valid UTF-8. */
#include <string.h>

#include "fuzz_util.h"
#include "tokenizer.h"

static const char *DEFAULT_TEXT =
    "Hello world, it's 2026!  caf\xC3\xA9 na\xC3\xAFve \xF0\x9F\x99\x82 <s>x</s> <|endoftext|>\n\tend";

static int utf8_valid(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n || (k > 1 && c < 0xC2) || (c > 0xF4)) return 0;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] >> 6) != 2) return 0;
        i += k;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = fuzz_cstr(data, size);
    char *tj = buf, *tc = NULL, *text = NULL;
    size_t tlen = 0;
    char *z = memchr(buf, 0, size);
    if (z) {
        tc = z + 1;
        char *z2 = memchr(tc, 0, size - (size_t)(tc - buf));
        if (z2) {
            text = z2 + 1;
            tlen = size - (size_t)(text - buf);
        }
        if (!*tc) tc = NULL;
    }
    if (!text) {
        text = (char *)DEFAULT_TEXT;
        tlen = strlen(DEFAULT_TEXT);
    }
    tok_tokenizer *t = NULL;
    ty_err err = {0};
    if (tok_load_json(&t, tj, tc, NULL, &err)) {
        FUZZ_ASSERT(err.msg[0], "a rejected tokenizer has no message");
        free(buf);
        return 0;
    }
    int32_t vocab = tok_vocab_size(t);
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        ty_err eerr = {0};
        if (tok_encode(t, text, tlen, special, &ids, &n, &eerr)) {
            FUZZ_ASSERT(eerr.msg[0], "a failed encode has no message");
            free(ids);
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            FUZZ_ASSERT(ids[i] >= 0 && ids[i] < vocab, "id %d outside [0, %d)", ids[i], vocab);
            FUZZ_ASSERT(tok_token_str(t, ids[i]) != NULL, "id %d has no spelling", ids[i]);
        }
        char *out = NULL;
        size_t olen = 0;
        ty_err derr = {0};
        if (tok_decode(t, ids, n, &out, &olen, &derr) == 0) {
            FUZZ_ASSERT(out[olen] == 0 && utf8_valid(out, olen), "decode gave invalid UTF-8");
            free(out);
        } else {
            FUZZ_ASSERT(derr.msg[0], "a failed decode has no message");
        }
        free(ids);
    }
    tok_free(t);
    free(buf);
    return 0;
}
