/* tok_encode.c — text to ids, in Hugging Face's order: split out added
 * tokens, normalize each remaining segment, pre-tokenize it into words,
 * run BPE on each word, and put bos/eos around the result.
 *
 * The tokenizer is read-only here; all scratch (buffers, the PCRE2 match
 * data, the BPE heap) belongs to one enc_ctx on the caller's stack, which
 * is what makes concurrent tok_encode calls on one tokenizer safe. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* One heap entry: a candidate merge of the symbol at pos with its right
 * neighbour, remembered with both ids so a stale entry is recognised. */
typedef struct merge_cand {
    int32_t rank;
    int32_t pos;
    int32_t left, right;
    int32_t merged;
} merge_cand;

typedef struct enc_ctx {
    const tok_tokenizer *t;
    tok_ids out;
    tok_buf norm, tmp; /* normalizer input/output */
    tok_spans a, b;    /* pre-tokenizer piece lists */
    tok_buf mapped;    /* byte-level spelling of a word */
    pcre2_match_data *md;
    pcre2_match_context *mctx; /* with a large JIT stack, made on demand */
    pcre2_jit_stack *jit;
    /* BPE scratch, one slot per symbol of the current word */
    int32_t *sym, *prev, *next;
    size_t sym_cap;
    merge_cand *heap;
    size_t heap_n, heap_cap;
    ty_err *err;
} enc_ctx;

static int oom(enc_ctx *c)
{
    return ty_err_set(c->err, TY_ENOMEM, "out of memory");
}

/* ---- Unicode classes --------------------------------------------------------- */

static bool cp_is_space(utf8proc_int32_t cp)
{
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85) return true;
    utf8proc_category_t cat = utf8proc_category(cp);
    return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL ||
           cat == UTF8PROC_CATEGORY_ZP;
}

static bool cp_is_word(utf8proc_int32_t cp)
{
    if (cp == '_') return true;
    utf8proc_category_t cat = utf8proc_category(cp);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

/* Code point at s[i] (text is valid UTF-8 by now); *n gets its length. */
static utf8proc_int32_t cp_at(const char *s, size_t len, size_t i, size_t *n)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t r =
        utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
    *n = r > 0 ? (size_t)r : 1;
    return r > 0 ? cp : -1;
}

/* Start of the character that ends just before s[i]. */
static size_t cp_before(const char *s, size_t i)
{
    do
        i--;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
    return i;
}

/* ---- BPE ------------------------------------------------------------------------- */

static bool cand_less(const merge_cand *x, const merge_cand *y)
{
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static int heap_push(enc_ctx *c, merge_cand m)
{
    if (c->heap_n == c->heap_cap) {
        size_t cap = c->heap_cap ? c->heap_cap * 2 : 64;
        merge_cand *h = realloc(c->heap, cap * sizeof *h);
        if (!h) return oom(c);
        c->heap = h;
        c->heap_cap = cap;
    }
    size_t i = c->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&m, &c->heap[p])) break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = m;
    return 0;
}

static merge_cand heap_pop(enc_ctx *c)
{
    merge_cand top = c->heap[0], last = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const merge_cand *best = &last;
        if (l < n && cand_less(&c->heap[l], best)) {
            m = l;
            best = &c->heap[l];
        }
        if (r < n && cand_less(&c->heap[r], best)) m = r;
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = last;
    return top;
}

/* Queues the merge of symbol pos with its right neighbour, if there is one. */
static int consider(enc_ctx *c, int32_t pos)
{
    int32_t q = c->next[pos];
    if (q < 0) return 0;
    int32_t merged;
    int32_t rank = tok_pairmap_get(&c->t->merges, c->sym[pos], c->sym[q], &merged);
    if (rank < 0) return 0;
    merge_cand m = {rank, pos, c->sym[pos], c->sym[q], merged};
    return heap_push(c, m);
}

static int sym_reserve(enc_ctx *c, size_t n)
{
    if (n <= c->sym_cap) return 0;
    size_t cap = c->sym_cap ? c->sym_cap : 64;
    while (cap < n)
        cap *= 2;
    int32_t *s = realloc(c->sym, cap * sizeof *s), *p, *q;
    if (!s) return oom(c);
    c->sym = s;
    if (!(p = realloc(c->prev, cap * sizeof *p))) return oom(c);
    c->prev = p;
    if (!(q = realloc(c->next, cap * sizeof *q))) return oom(c);
    c->next = q;
    c->sym_cap = cap;
    return 0;
}

/* The word's initial symbols: one per byte for byte-level models, else one
 * per character, falling back to <0xNN> byte tokens or unk. */
static int initial_symbols(enc_ctx *c, const char *w, size_t len, size_t *n_out)
{
    const tok_tokenizer *t = c->t;
    size_t n = 0;
    if (sym_reserve(c, len + 1)) return c->err ? c->err->code : TY_ENOMEM;
    if (t->byte_level) {
        for (size_t i = 0; i < len; i++)
            c->sym[n++] = t->byte_ids[(unsigned char)w[i]];
        *n_out = n;
        return 0;
    }
    for (size_t i = 0; i < len;) {
        size_t cl = (size_t)tok_utf8_len((unsigned char)w[i]);
        if (cl > len - i) cl = len - i;
        int32_t id = tok_strmap_get(&t->vocab, w + i, cl);
        if (id >= 0) {
            c->sym[n++] = id;
        } else {
            bool bytes_ok = t->byte_fallback;
            for (size_t k = 0; bytes_ok && k < cl; k++)
                bytes_ok = t->fallback_ids[(unsigned char)w[i + k]] >= 0;
            if (bytes_ok) {
                for (size_t k = 0; k < cl; k++)
                    c->sym[n++] = t->fallback_ids[(unsigned char)w[i + k]];
            } else if (t->unk_id >= 0) {
                if (!(t->fuse_unk && n > 0 && c->sym[n - 1] == t->unk_id)) c->sym[n++] = t->unk_id;
            } else {
                size_t dummy;
                return ty_err_set(
                    c->err, TY_EINVAL,
                    "character U+%04X is not in the vocabulary and the model has neither "
                    "byte_fallback nor unk_token",
                    (unsigned)cp_at(w, len, i, &dummy));
            }
        }
        i += cl;
    }
    *n_out = n;
    return 0;
}

static int bpe_word(enc_ctx *c, const char *w, size_t len)
{
    const tok_tokenizer *t = c->t;
    if (len == 0) return 0;
    int hit = tok_cache_get(t->cache, w, len, &c->out);
    if (hit) return hit < 0 ? oom(c) : 0;
    size_t first = c->out.n;
    if (t->ignore_merges) {
        /* A word the vocabulary holds whole is emitted as it is. */
        const char *key = w;
        size_t klen = len;
        if (t->byte_level) {
            c->mapped.len = 0;
            if (tok_buf_reserve(&c->mapped, len * 2)) return oom(c);
            for (size_t i = 0; i < len; i++)
                c->mapped.len += (size_t)tok_utf8_put(c->mapped.p + c->mapped.len,
                                                      tok_byte_to_cp((unsigned char)w[i]));
            key = c->mapped.p;
            klen = c->mapped.len;
        }
        int32_t id = tok_strmap_get(&t->vocab, key, klen);
        if (id >= 0) {
            if (tok_ids_push(&c->out, id)) return oom(c);
            tok_cache_put(t->cache, w, len, &id, 1);
            return 0;
        }
    }
    size_t n = 0;
    int rc = initial_symbols(c, w, len, &n);
    if (rc) return rc;
    c->heap_n = 0;
    for (size_t i = 0; i < n; i++) {
        c->prev[i] = (int32_t)i - 1;
        c->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++)
        if ((rc = consider(c, (int32_t)i))) return rc;
    /* Lowest rank first, leftmost first among equals: Hugging Face's order. */
    while (c->heap_n) {
        merge_cand m = heap_pop(c);
        int32_t p = m.pos, q = c->next[p];
        if (c->sym[p] != m.left || q < 0 || c->sym[q] != m.right) continue;
        c->sym[p] = m.merged;
        c->sym[q] = -1;
        c->next[p] = c->next[q];
        if (c->next[p] >= 0) c->prev[c->next[p]] = p;
        if (c->prev[p] >= 0 && (rc = consider(c, c->prev[p]))) return rc;
        if ((rc = consider(c, p))) return rc;
    }
    for (int32_t i = 0; i >= 0; i = c->next[i])
        if (tok_ids_push(&c->out, c->sym[i])) return oom(c);
    tok_cache_put(t->cache, w, len, c->out.v + first, c->out.n - first);
    return 0;
}

/* ---- normalizers ----------------------------------------------------------------- */

static bool all_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

static int norm_unicode(enc_ctx *c, utf8proc_option_t opts)
{
    if (all_ascii(c->norm.p, c->norm.len)) return 0; /* every form leaves ASCII alone */
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)c->norm.p,
                                      (utf8proc_ssize_t)c->norm.len, &dst, opts | UTF8PROC_STABLE);
    if (r < 0) return ty_err_set(c->err, TY_EINVAL, "normalization failed: %s", utf8proc_errmsg(r));
    c->norm.len = 0;
    int rc = tok_buf_put(&c->norm, dst, (size_t)r);
    free(dst);
    return rc ? oom(c) : 0;
}

static int norm_lowercase(enc_ctx *c)
{
    c->tmp.len = 0;
    for (size_t i = 0; i < c->norm.len;) {
        size_t n;
        utf8proc_int32_t cp = cp_at(c->norm.p, c->norm.len, i, &n);
        char u[4];
        if (tok_buf_put(&c->tmp, u, (size_t)tok_utf8_put(u, (uint32_t)utf8proc_tolower(cp))))
            return oom(c);
        i += n;
    }
    tok_buf t = c->norm;
    c->norm = c->tmp;
    c->tmp = t;
    return 0;
}

/* Replaces every non-overlapping occurrence, left to right. */
static int norm_replace(enc_ctx *c, const tok_norm *nm)
{
    c->tmp.len = 0;
    size_t i = 0;
    const char *s = c->norm.p;
    size_t len = c->norm.len;
    while (i < len) {
        size_t ms, me;
        if (nm->re) {
            int r = pcre2_match(nm->re, (PCRE2_SPTR)s, len, i, PCRE2_NOTEMPTY, c->md, c->mctx);
            if (r == PCRE2_ERROR_NOMATCH) break;
            if (r < 0)
                return ty_err_set(c->err, TY_EINTERNAL, "normalizer regex failed (PCRE2 error %d)",
                                  r);
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
            ms = ov[0];
            me = ov[1];
        } else {
            const char *hit = memmem(s + i, len - i, nm->text, nm->text_len);
            if (!hit) break;
            ms = (size_t)(hit - s);
            me = ms + nm->text_len;
        }
        if (tok_buf_put(&c->tmp, s + i, ms - i) ||
            tok_buf_put(&c->tmp, nm->content, nm->content_len))
            return oom(c);
        i = me;
    }
    if (tok_buf_put(&c->tmp, s + i, len - i)) return oom(c);
    tok_buf t = c->norm;
    c->norm = c->tmp;
    c->tmp = t;
    return 0;
}

static void norm_strip(enc_ctx *c, const tok_norm *nm)
{
    size_t s = 0, e = c->norm.len, n;
    while (nm->left && s < e && cp_is_space(cp_at(c->norm.p, e, s, &n)))
        s += n;
    while (nm->right && e > s) {
        size_t b = cp_before(c->norm.p, e);
        if (!cp_is_space(cp_at(c->norm.p, e, b, &n))) break;
        e = b;
    }
    memmove(c->norm.p, c->norm.p + s, e - s);
    c->norm.len = e - s;
    c->norm.p[c->norm.len] = '\0';
}

/* Runs the normalizer chain over text into c->norm. */
static int normalize(enc_ctx *c, const char *s, size_t len)
{
    c->norm.len = 0;
    if (tok_buf_put(&c->norm, s, len)) return oom(c);
    for (int i = 0; i < c->t->n_norms; i++) {
        const tok_norm *nm = &c->t->norms[i];
        int rc = 0;
        switch (nm->kind) {
        case NORM_NFC:
            rc = norm_unicode(c, UTF8PROC_COMPOSE);
            break;
        case NORM_NFD:
            rc = norm_unicode(c, UTF8PROC_DECOMPOSE);
            break;
        case NORM_NFKC:
            rc = norm_unicode(c, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
            break;
        case NORM_NFKD:
            rc = norm_unicode(c, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
            break;
        case NORM_LOWERCASE:
            rc = norm_lowercase(c);
            break;
        case NORM_PREPEND:
            if (c->norm.len) {
                c->tmp.len = 0;
                if (tok_buf_put(&c->tmp, nm->text, nm->text_len) ||
                    tok_buf_put(&c->tmp, c->norm.p, c->norm.len))
                    return oom(c);
                tok_buf t = c->norm;
                c->norm = c->tmp;
                c->tmp = t;
            }
            break;
        case NORM_REPLACE:
            rc = norm_replace(c, nm);
            break;
        case NORM_STRIP:
            norm_strip(c, nm);
            break;
        }
        if (rc) return rc;
    }
    return 0;
}

/* ---- pre-tokenizers ------------------------------------------------------------------ */

/* Emits the pieces of one input piece split by re, per the Split behaviour. */
static int split_piece(enc_ctx *c, const tok_pre *p, const char *s, size_t len, tok_spans *out)
{
    size_t base = out->buf.len;
    if (tok_buf_put(&out->buf, s, len)) return oom(c);
    /* cur: the piece being built [cs, ce); cur_is_match: it holds matches
     * only (a lone match for MergedWithNext, a run of them for Contiguous). */
    size_t cs = 0, ce = 0, pos = 0;
    bool have = false, cur_is_match = false;
#define FLUSH()                                                                                    \
    do {                                                                                           \
        if (have && ce > cs && tok_spans_add(out, base + cs, ce - cs)) return oom(c);              \
        have = false;                                                                              \
    } while (0)
    while (pos <= len) {
        size_t ms = len, me = len;
        if (pos < len) {
            int r = pcre2_match(p->re, (PCRE2_SPTR)s, len, pos, PCRE2_NOTEMPTY, c->md, c->mctx);
            if (r == PCRE2_ERROR_JIT_STACKLIMIT && !c->jit) {
                /* A very long run (thousands of spaces) needs a bigger JIT
                 * stack than the default; make one for this call and retry. */
                c->jit = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
                c->mctx = pcre2_match_context_create(NULL);
                if (!c->jit || !c->mctx) return oom(c);
                pcre2_jit_stack_assign(c->mctx, NULL, c->jit);
                continue;
            }
            if (r >= 0) {
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
                ms = ov[0];
                me = ov[1];
            } else if (r != PCRE2_ERROR_NOMATCH) {
                return ty_err_set(c->err, TY_EINTERNAL,
                                  "pre-tokenizer regex failed (PCRE2 error %d)", r);
            }
        }
        /* Two segments: the gap [pos, ms) and the match [ms, me). */
        for (int k = 0; k < 2; k++) {
            size_t ss = k ? ms : pos, se = k ? me : ms;
            if (se <= ss) continue;
            bool is_match = (k == 1) != p->invert;
            switch (p->behavior) {
            case SPLIT_REMOVED:
                if (!is_match && tok_spans_add(out, base + ss, se - ss)) return oom(c);
                break;
            case SPLIT_ISOLATED:
                if (tok_spans_add(out, base + ss, se - ss)) return oom(c);
                break;
            case SPLIT_MERGED_PREV:
            case SPLIT_MERGED_NEXT:
            case SPLIT_CONTIGUOUS: {
                /* Does this segment join the piece being built? A match
                 * joins what precedes it (MergedWithPrevious); a gap joins
                 * a lone match (MergedWithNext); a match joins a run of
                 * matches (Contiguous). Anything else starts a new piece. */
                bool join = have && (p->behavior == SPLIT_MERGED_PREV   ? is_match
                                     : p->behavior == SPLIT_MERGED_NEXT ? cur_is_match && !is_match
                                                                        : cur_is_match && is_match);
                if (join) {
                    ce = se;
                    cur_is_match = cur_is_match && is_match;
                    break;
                }
                FLUSH();
                cs = ss;
                ce = se;
                have = true;
                cur_is_match = is_match;
                break;
            }
            }
        }
        if (ms >= len) break;
        pos = me;
    }
    FLUSH();
#undef FLUSH
    return 0;
}

/* Metaspace: spaces become the replacement character, then one is
 * prepended as the scheme says unless the piece already starts with one
 * (so " hello" gives "▁hello", as current Hugging Face does), and the piece
 * splits before each replacement. */
static int metaspace_piece(enc_ctx *c, const tok_pre *p, const char *s, size_t len, bool first,
                           tok_spans *out)
{
    c->tmp.len = 0;
    bool prepend = p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && first);
    bool starts = len > 0 && (s[0] == ' ' || (len >= p->replacement_len &&
                                              !memcmp(s, p->replacement, p->replacement_len)));
    if (prepend && !starts && len > 0)
        if (tok_buf_put(&c->tmp, p->replacement, p->replacement_len)) return oom(c);
    for (size_t i = 0; i < len; i++) {
        int rc = s[i] == ' ' ? tok_buf_put(&c->tmp, p->replacement, p->replacement_len)
                             : tok_buf_put(&c->tmp, s + i, 1);
        if (rc) return oom(c);
    }
    size_t base = out->buf.len;
    if (tok_buf_put(&out->buf, c->tmp.p, c->tmp.len)) return oom(c);
    if (!p->split) return tok_spans_add(out, base, c->tmp.len) ? oom(c) : 0;
    const char *t = out->buf.p + base;
    size_t n = c->tmp.len, start = 0;
    for (size_t i = 0; i + p->replacement_len <= n; i++) {
        if (i > start && !memcmp(t + i, p->replacement, p->replacement_len)) {
            if (tok_spans_add(out, base + start, i - start)) return oom(c);
            start = i;
        }
    }
    if (n > start && tok_spans_add(out, base + start, n - start)) return oom(c);
    return 0;
}

/* Turns c->norm into words in c->a. at_start: this text begins the input
 * (Metaspace's "first" scheme prepends only there). */
static int pre_tokenize(enc_ctx *c, bool at_start)
{
    tok_spans_reset(&c->a);
    if (tok_spans_add_text(&c->a, c->norm.p, c->norm.len)) return oom(c);
    for (int k = 0; k < c->t->n_pres; k++) {
        const tok_pre *p = &c->t->pres[k];
        tok_spans_reset(&c->b);
        for (size_t i = 0; i < c->a.n; i++) {
            const char *s = c->a.buf.p + c->a.v[i].off;
            size_t len = c->a.v[i].len;
            int rc = 0;
            switch (p->kind) {
            case PRE_SPLIT:
            case PRE_DIGITS:
                rc = split_piece(c, p, s, len, &c->b);
                break;
            case PRE_METASPACE:
                rc = metaspace_piece(c, p, s, len, at_start && c->a.v[i].off == 0, &c->b);
                break;
            case PRE_BYTELEVEL: {
                const char *src = s;
                size_t n = len;
                if (p->add_prefix_space && (len == 0 || s[0] != ' ')) {
                    c->tmp.len = 0;
                    if (tok_buf_put(&c->tmp, " ", 1) || tok_buf_put(&c->tmp, s, len)) return oom(c);
                    src = c->tmp.p;
                    n = c->tmp.len;
                }
                if (p->re)
                    rc = split_piece(c, p, src, n, &c->b);
                else
                    rc = tok_spans_add_text(&c->b, src, n) ? oom(c) : 0;
                break;
            }
            }
            if (rc) return rc;
        }
        tok_spans t = c->a;
        c->a = c->b;
        c->b = t;
    }
    return 0;
}

/* ---- added tokens ---------------------------------------------------------------------- */

/* Finds the leftmost (then longest) added token with the given normalized
 * flag in s[from, len). Returns its index or -1; ms and me receive the match
 * including any whitespace its lstrip/rstrip swallow. */
static int find_added(const tok_tokenizer *t, const char *s, size_t len, size_t from, size_t floor,
                      bool normalized, size_t *ms, size_t *me)
{
    for (size_t i = from; i < len; i++) {
        if (!t->added_first[(unsigned char)s[i]]) continue;
        for (int k = 0; k < t->n_added; k++) {
            const tok_added *a = &t->added[k];
            if (a->normalized != normalized || a->len > len - i ||
                memcmp(s + i, a->content, a->len))
                continue;
            size_t n;
            if (a->single_word) {
                if (i > 0 && cp_is_word(cp_at(s, len, cp_before(s, i), &n))) continue;
                if (i + a->len < len && cp_is_word(cp_at(s, len, i + a->len, &n))) continue;
            }
            size_t b = i, e = i + a->len;
            while (a->lstrip && b > floor) {
                size_t pb = cp_before(s, b);
                if (!cp_is_space(cp_at(s, len, pb, &n))) break;
                b = pb;
            }
            while (a->rstrip && e < len && cp_is_space(cp_at(s, len, e, &n)))
                e += n;
            *ms = b;
            *me = e;
            return k;
        }
    }
    return -1;
}

static int encode_words(enc_ctx *c, bool at_start)
{
    int rc = pre_tokenize(c, at_start);
    for (size_t i = 0; !rc && i < c->a.n; i++)
        rc = bpe_word(c, c->a.buf.p + c->a.v[i].off, c->a.v[i].len);
    return rc;
}

/* A segment between non-normalized added tokens: normalize it, then split
 * on the added tokens that match normalized text. */
static int encode_segment(enc_ctx *c, const char *s, size_t len, bool at_start)
{
    const tok_tokenizer *t = c->t;
    int rc = normalize(c, s, len);
    if (rc || c->norm.len == 0) return rc;
    if (!t->any_normalized_added) return encode_words(c, at_start);

    /* encode_words reads c->norm, so the whole normalized segment moves
     * aside and each piece between added tokens takes its place in turn. */
    tok_buf whole = c->norm;
    memset(&c->norm, 0, sizeof c->norm);
    size_t pos = 0, ms, me;
    while (!rc && pos <= whole.len) {
        int k = find_added(t, whole.p, whole.len, pos, pos, true, &ms, &me);
        size_t gap_end = k >= 0 ? ms : whole.len;
        if (gap_end > pos) {
            c->norm.len = 0;
            if (tok_buf_put(&c->norm, whole.p + pos, gap_end - pos)) rc = oom(c);
            if (!rc) rc = encode_words(c, at_start && pos == 0);
        }
        if (k < 0 || rc) break;
        if (tok_ids_push(&c->out, t->added[k].id)) rc = oom(c);
        pos = me;
    }
    tok_buf_free(&c->norm);
    c->norm = whole;
    return rc;
}

static int encode_text(enc_ctx *c, const char *s, size_t len)
{
    const tok_tokenizer *t = c->t;
    size_t pos = 0, ms, me;
    for (;;) {
        int k = t->n_added ? find_added(t, s, len, pos, pos, false, &ms, &me) : -1;
        size_t gap_end = k >= 0 ? ms : len;
        if (gap_end > pos) {
            int rc = encode_segment(c, s + pos, gap_end - pos, pos == 0);
            if (rc) return rc;
        }
        if (k < 0) return 0;
        if (tok_ids_push(&c->out, t->added[k].id)) return oom(c);
        pos = me;
    }
}

int tok_encode(const tok_tokenizer *tok, const char *text, size_t len, int add_special,
               int32_t **ids, size_t *n, ty_err *err)
{
    *ids = NULL;
    *n = 0;
    size_t bad = tok_utf8_check(text, len);
    if (bad != (size_t)-1)
        return ty_err_set(err, TY_EINVAL, "text is not valid UTF-8 (byte offset %zu, byte 0x%02X)",
                          bad, (unsigned char)text[bad]);
    enc_ctx c = {.t = tok, .err = err};
    c.md = pcre2_match_data_create(4, NULL);
    int rc = c.md ? 0 : oom(&c);
    if (!rc && add_special && tok->prefix_id >= 0 && tok_ids_push(&c.out, tok->prefix_id))
        rc = oom(&c);
    if (!rc) rc = encode_text(&c, text, len);
    if (!rc && add_special && tok->suffix_id >= 0 && tok_ids_push(&c.out, tok->suffix_id))
        rc = oom(&c);
    pcre2_match_data_free(c.md);
    pcre2_match_context_free(c.mctx);
    pcre2_jit_stack_free(c.jit);
    tok_buf_free(&c.norm);
    tok_buf_free(&c.tmp);
    tok_buf_free(&c.mapped);
    tok_spans_free(&c.a);
    tok_spans_free(&c.b);
    free(c.sym);
    free(c.prev);
    free(c.next);
    free(c.heap);
    if (rc) {
        free(c.out.v);
        return rc;
    }
    *ids = c.out.v;
    *n = c.out.n;
    return 0;
}
