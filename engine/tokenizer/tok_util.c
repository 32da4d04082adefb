/* tok_util.c — the tokenizer's small building blocks: growable buffers,
 * open-addressing hash maps for the vocabulary and the merges, the GPT-2
 * byte <-> character map, UTF-8 helpers and PCRE2 compilation.
 *
 * Kept apart so tok_load.c, tok_encode.c and tok_decode.c read as the
 * pipeline they implement. Nothing here keeps global mutable state. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- buffers ------------------------------------------------------------------ */

int tok_buf_reserve(tok_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return TY_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tok_buf_put(tok_buf *b, const void *s, size_t n)
{
    if (tok_buf_reserve(b, n)) return TY_ENOMEM;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

void tok_buf_free(tok_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

int tok_spans_add(tok_spans *s, size_t off, size_t len)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        tok_span *v = realloc(s->v, cap * sizeof *v);
        if (!v) return TY_ENOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
    return 0;
}

int tok_spans_add_text(tok_spans *s, const char *t, size_t len)
{
    size_t off = s->buf.len;
    if (tok_buf_put(&s->buf, t, len)) return TY_ENOMEM;
    return tok_spans_add(s, off, len);
}

void tok_spans_reset(tok_spans *s)
{
    s->n = 0;
    s->buf.len = 0;
}

void tok_spans_free(tok_spans *s)
{
    tok_buf_free(&s->buf);
    free(s->v);
    memset(s, 0, sizeof *s);
}

int tok_ids_push(tok_ids *a, int32_t id)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return TY_ENOMEM;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

/* ---- hash maps ---------------------------------------------------------------- */

/* FNV-1a: short keys, good enough spread, no state. */
static uint32_t str_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

static uint32_t pow2_cap(size_t expected)
{
    uint32_t cap = 16;
    while (cap < expected * 2 + 1)
        cap *= 2;
    return cap;
}

int tok_strmap_init(tok_strmap *m, size_t expected)
{
    uint32_t cap = pow2_cap(expected);
    m->mask = cap - 1;
    m->key = calloc(cap, sizeof *m->key);
    m->klen = calloc(cap, sizeof *m->klen);
    m->val = malloc(cap * sizeof *m->val);
    if (!m->key || !m->klen || !m->val) {
        tok_strmap_free(m);
        return TY_ENOMEM;
    }
    for (uint32_t i = 0; i < cap; i++)
        m->val[i] = -1;
    return 0;
}

int tok_strmap_put(tok_strmap *m, const char *k, uint32_t klen, int32_t v)
{
    uint32_t i = str_hash(k, klen) & m->mask;
    while (m->val[i] >= 0) {
        if (m->klen[i] == klen && memcmp(m->key[i], k, klen) == 0) return 0;
        i = (i + 1) & m->mask;
    }
    m->key[i] = k;
    m->klen[i] = klen;
    m->val[i] = v;
    return 1;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *k, size_t klen)
{
    if (!m->val) return -1;
    uint32_t i = str_hash(k, klen) & m->mask;
    while (m->val[i] >= 0) {
        if (m->klen[i] == klen && memcmp(m->key[i], k, klen) == 0) return m->val[i];
        i = (i + 1) & m->mask;
    }
    return -1;
}

void tok_strmap_free(tok_strmap *m)
{
    free(m->key);
    free(m->klen);
    free(m->val);
    memset(m, 0, sizeof *m);
}

/* A 64-bit mix (splitmix64's finaliser) so consecutive ids spread out. */
static uint32_t pair_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return (uint32_t)k;
}

int tok_pairmap_init(tok_pairmap *m, size_t expected)
{
    uint32_t cap = pow2_cap(expected);
    m->mask = cap - 1;
    m->slot = malloc(cap * sizeof *m->slot);
    /* 8 bits per expected merge keeps false positives near 12 %. */
    uint32_t bits = 1u << 16;
    while (bits < expected * 8 && bits < (1u << 28))
        bits <<= 1;
    m->filter_mask = bits - 1;
    m->filter = calloc(bits / 64, sizeof *m->filter);
    if (!m->slot || !m->filter) {
        tok_pairmap_free(m);
        return TY_ENOMEM;
    }
    for (uint32_t i = 0; i < cap; i++)
        m->slot[i].key = UINT64_MAX;
    return 0;
}

int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = pair_hash(k) & m->mask;
    while (m->slot[i].key != UINT64_MAX) {
        if (m->slot[i].key == k) {
            m->slot[i].rank = rank;
            m->slot[i].merged = merged;
            return 0;
        }
        i = (i + 1) & m->mask;
    }
    m->slot[i] = (tok_pair_slot){k, rank, merged};
    uint32_t f = (pair_hash(k) >> 7) & m->filter_mask;
    m->filter[f / 64] |= 1ull << (f % 64);
    return 1;
}

int32_t tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *merged)
{
    if (!m->slot) return -1;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t h = pair_hash(k), f = (h >> 7) & m->filter_mask;
    if (!(m->filter[f / 64] & (1ull << (f % 64)))) return -1;
    uint32_t i = h & m->mask;
    while (m->slot[i].key != UINT64_MAX) {
        if (m->slot[i].key == k) {
            *merged = m->slot[i].merged;
            return m->slot[i].rank;
        }
        i = (i + 1) & m->mask;
    }
    return -1;
}

void tok_pairmap_free(tok_pairmap *m)
{
    free(m->slot);
    free(m->filter);
    memset(m, 0, sizeof *m);
}

/* ---- GPT-2 byte <-> character map ---------------------------------------------- */

/* Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
 * themselves; the other 68 bytes take code points 256, 257, ... in byte
 * order, so every byte becomes a visible, non-space character. */
static bool byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The 68 other bytes in order: 0x00-0x20 (33), 0x7F-0xA0 (34), 0xAD (1). */
uint32_t tok_byte_to_cp(unsigned byte)
{
    if (byte_is_printable(byte)) return byte;
    if (byte <= 0x20) return 256 + byte;
    if (byte >= 0x7F && byte <= 0xA0) return 256 + 33 + (byte - 0x7F);
    return 256 + 67; /* 0xAD */
}

int tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256) return byte_is_printable(cp) ? (int)cp : -1;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(0x7F + cp - 256 - 33);
    if (cp == 256 + 67) return 0xAD;
    return -1;
}

/* ---- UTF-8 ------------------------------------------------------------------------ */

int tok_utf8_put(char *out, uint32_t cp)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

int tok_utf8_len(unsigned char c)
{
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 1;
}

/* Length of the valid sequence at s (s < end), or 0 when it is not valid:
 * no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_valid_seq(const unsigned char *s, const unsigned char *end)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t n = (size_t)tok_utf8_len((unsigned char)c);
    if (n == 1 || (size_t)(end - s) < n) return 0;
    uint32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    return n;
}

size_t tok_utf8_check(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    while (p < end) {
        if (*p < 0x80) {
            p++;
            continue;
        }
        size_t n = utf8_valid_seq(p, end);
        if (!n) return (size_t)(p - (const unsigned char *)s);
        p += n;
    }
    return (size_t)-1;
}

/* Bytes of the maximal subpart at s, an ill-formed sequence: the longest
 * prefix of a well-formed sequence (at least 1 byte). Each such subpart is
 * one U+FFFD, as Rust's String::from_utf8_lossy (which Hugging Face's
 * decode uses) and the Unicode standard's recommended practice do. */
static size_t utf8_maximal_subpart(const unsigned char *s, const unsigned char *end)
{
    unsigned c = s[0];
    size_t n = (size_t)tok_utf8_len((unsigned char)c);
    if (n == 1) return 1; /* 80..C1, F5..FF: a lone bad byte */
    size_t k = 1;
    for (; k < n && s + k < end; k++) {
        unsigned lo = 0x80, hi = 0xBF, x = s[k];
        if (k == 1) {
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
            else if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        }
        if (x < lo || x > hi) break;
    }
    return k;
}

int tok_utf8_lossy(tok_buf *b, const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    if (tok_buf_reserve(b, len)) return TY_ENOMEM;
    while (p < end) {
        size_t n = utf8_valid_seq(p, end);
        if (n) {
            if (tok_buf_put(b, p, n)) return TY_ENOMEM;
            p += n;
        } else {
            if (tok_buf_put(b, "\xEF\xBF\xBD", 3)) return TY_ENOMEM;
            p += utf8_maximal_subpart(p, end);
        }
    }
    return 0;
}

/* ---- regular expressions ----------------------------------------------------------- */

pcre2_code *tok_regex_compile(const char *pat, size_t len, bool literal, const char *what,
                              ty_err *err)
{
    int ec;
    PCRE2_SIZE eo;
    /* PCRE2 refuses UCP together with LITERAL; a literal needs no classes. */
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        ty_err_set(err, TY_EINVAL, "tokenizer.json: %s: regex does not compile at offset %zu: %s",
                   what, (size_t)eo, (const char *)msg);
        return NULL;
    }
    /* JIT makes pre-tokenisation several times faster; where it is not
     * available PCRE2 falls back to its interpreter with the same results. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}
