/* tok_decode.c — ids back to text through the model's decoder chain
 * (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace), as Hugging
 * Face applies it: each decoder turns a list of token strings into a new
 * list, and the final list is concatenated.
 *
 * Special tokens pass through the chain as their text, like HF's decode
 * without skip_special_tokens. The result is made valid UTF-8 at the end,
 * so a cut-off multi-byte character shows as U+FFFD, never as raw bytes. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

static int swap_in(tok_spans *a, tok_spans *b)
{
    tok_spans t = *a;
    *a = *b;
    *b = t;
    return 0;
}

/* "<0xNN>" -> the byte, or -1. */
static int fallback_byte(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char ch = s[i];
        int d = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                                         : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static int dec_bytelevel(tok_spans *a, tok_spans *b)
{
    /* One string: a character may be split over several tokens. */
    size_t off = b->buf.len;
    for (size_t i = 0; i < a->n; i++) {
        const char *s = a->buf.p + a->v[i].off;
        size_t len = a->v[i].len;
        for (size_t k = 0; k < len;) {
            size_t cl = (size_t)tok_utf8_len((unsigned char)s[k]);
            if (cl > len - k) cl = len - k;
            uint32_t cp = (unsigned char)s[k];
            if (cl > 1) {
                cp &= cl == 2 ? 0x1F : cl == 3 ? 0x0F : 0x07;
                for (size_t j = 1; j < cl; j++)
                    cp = (cp << 6) | ((unsigned char)s[k + j] & 0x3F);
            }
            int byte = tok_cp_to_byte(cp);
            if (byte >= 0) {
                char c = (char)byte;
                if (tok_buf_put(&b->buf, &c, 1)) return TY_ENOMEM;
            } else if (tok_buf_put(&b->buf, s + k, cl)) {
                return TY_ENOMEM;
            }
            k += cl;
        }
    }
    return tok_spans_add(b, off, b->buf.len - off);
}

static int dec_replace(const tok_dec *d, tok_spans *a, tok_spans *b)
{
    for (size_t i = 0; i < a->n; i++) {
        const char *s = a->buf.p + a->v[i].off;
        size_t len = a->v[i].len, off = b->buf.len, k = 0;
        while (k < len) {
            const char *hit = memmem(s + k, len - k, d->pattern, d->pattern_len);
            if (!hit) break;
            if (tok_buf_put(&b->buf, s + k, (size_t)(hit - (s + k))) ||
                tok_buf_put(&b->buf, d->content, d->content_len))
                return TY_ENOMEM;
            k = (size_t)(hit - s) + d->pattern_len;
        }
        if (tok_buf_put(&b->buf, s + k, len - k) || tok_spans_add(b, off, b->buf.len - off))
            return TY_ENOMEM;
    }
    return 0;
}

/* Consecutive <0xNN> tokens become their bytes when those form valid
 * UTF-8, else one U+FFFD per byte. */
static int dec_bytefallback(tok_spans *a, tok_spans *b)
{
    tok_buf run = {0};
    int rc = 0;
    for (size_t i = 0; i <= a->n && !rc; i++) {
        int byte = i < a->n ? fallback_byte(a->buf.p + a->v[i].off, a->v[i].len) : -1;
        if (byte >= 0) {
            char c = (char)byte;
            rc = tok_buf_put(&run, &c, 1);
            continue;
        }
        if (run.len) {
            if (tok_utf8_check(run.p, run.len) == (size_t)-1) {
                rc = tok_spans_add_text(b, run.p, run.len);
            } else {
                for (size_t k = 0; k < run.len && !rc; k++)
                    rc = tok_spans_add_text(b, "\xEF\xBF\xBD", 3);
            }
            run.len = 0;
        }
        if (!rc && i < a->n) rc = tok_spans_add_text(b, a->buf.p + a->v[i].off, a->v[i].len);
    }
    tok_buf_free(&run);
    return rc;
}

static int dec_fuse(tok_spans *a, tok_spans *b)
{
    size_t off = b->buf.len;
    for (size_t i = 0; i < a->n; i++)
        if (tok_buf_put(&b->buf, a->buf.p + a->v[i].off, a->v[i].len)) return TY_ENOMEM;
    return tok_spans_add(b, off, b->buf.len - off);
}

static int dec_strip(const tok_dec *d, tok_spans *a, tok_spans *b)
{
    for (size_t i = 0; i < a->n; i++) {
        const char *s = a->buf.p + a->v[i].off;
        size_t st = 0, en = a->v[i].len;
        for (int k = 0;
             k < d->start && en - st >= d->strip_len && !memcmp(s + st, d->strip, d->strip_len);
             k++)
            st += d->strip_len;
        for (int k = 0; k < d->stop && en - st >= d->strip_len &&
                        !memcmp(s + en - d->strip_len, d->strip, d->strip_len);
             k++)
            en -= d->strip_len;
        if (tok_spans_add_text(b, s + st, en - st)) return TY_ENOMEM;
    }
    return 0;
}

/* Replacement characters become spaces, except in the first token, where
 * Hugging Face drops them (they stand for the prepended space) unless the
 * scheme is "never". */
static int dec_metaspace(const tok_dec *d, tok_spans *a, tok_spans *b)
{
    for (size_t i = 0; i < a->n; i++) {
        const char *s = a->buf.p + a->v[i].off;
        size_t len = a->v[i].len, off = b->buf.len, k = 0;
        bool drop = i == 0 && d->prepend != PREPEND_NEVER;
        while (k < len) {
            if (len - k >= d->strip_len && !memcmp(s + k, d->strip, d->strip_len)) {
                if (!drop && tok_buf_put(&b->buf, " ", 1)) return TY_ENOMEM;
                k += d->strip_len;
            } else {
                if (tok_buf_put(&b->buf, s + k, 1)) return TY_ENOMEM;
                k++;
            }
        }
        if (tok_spans_add(b, off, b->buf.len - off)) return TY_ENOMEM;
    }
    return 0;
}

int tok_decode(const tok_tokenizer *tok, const int32_t *ids, size_t n, char **text, size_t *len,
               ty_err *err)
{
    *text = NULL;
    *len = 0;
    tok_spans a = {0}, b = {0};
    tok_buf out = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const char *s = tok_token_str(tok, ids[i]);
        if (!s) {
            rc = ty_err_set(err, TY_EINVAL,
                            "id %d (position %zu) is not in the vocabulary (size %d)", (int)ids[i],
                            i, (int)tok->vocab_size);
            break;
        }
        if (tok_spans_add_text(&a, s, tok->piece_len[ids[i]])) rc = TY_ENOMEM;
    }
    for (int k = 0; k < tok->n_decs && !rc; k++) {
        const tok_dec *d = &tok->decs[k];
        tok_spans_reset(&b);
        switch (d->kind) {
        case DEC_BYTELEVEL:
            rc = dec_bytelevel(&a, &b);
            break;
        case DEC_REPLACE:
            rc = dec_replace(d, &a, &b);
            break;
        case DEC_BYTEFALLBACK:
            rc = dec_bytefallback(&a, &b);
            break;
        case DEC_FUSE:
            rc = dec_fuse(&a, &b);
            break;
        case DEC_STRIP:
            rc = dec_strip(d, &a, &b);
            break;
        case DEC_METASPACE:
            rc = dec_metaspace(d, &a, &b);
            break;
        }
        if (!rc) swap_in(&a, &b);
    }
    /* Without a decoder Hugging Face joins the tokens with spaces. */
    for (size_t i = 0; i < a.n && !rc; i++) {
        if (!tok->has_decoder && i > 0 && tok_buf_put(&out, " ", 1)) rc = TY_ENOMEM;
        if (!rc) rc = tok_utf8_lossy(&out, a.buf.p + a.v[i].off, a.v[i].len);
    }
    if (!rc && tok_buf_put(&out, "", 0)) rc = TY_ENOMEM; /* NUL-terminate even when empty */
    tok_spans_free(&a);
    tok_spans_free(&b);
    if (rc) {
        tok_buf_free(&out);
        if (rc == TY_ENOMEM) ty_err_set(err, TY_ENOMEM, "out of memory");
        return rc;
    }
    *text = out.p;
    *len = out.len;
    return 0;
}
