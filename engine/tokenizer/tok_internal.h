/* tok_internal.h — what the tokenizer's source files share and nobody else
 * sees: the tokenizer struct, its component descriptions, the hash maps and
 * the growable buffers used for per-call scratch.
 *
 * Everything hanging off a tok_tokenizer is built by tok_load.c and read-only
 * afterwards; per-call state lives in tok_buf / tok_spans owned by the call. */
#ifndef TY_TOK_INTERNAL_H
#define TY_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* ---- growable byte buffer and lists of byte ranges ---------------------- */

typedef struct tok_buf {
    char *p;
    size_t len, cap;
} tok_buf;

int tok_buf_reserve(tok_buf *b, size_t extra);
int tok_buf_put(tok_buf *b, const void *s, size_t n);
void tok_buf_free(tok_buf *b);

/* A list of pieces of text, each a byte range of one buffer. Pre-tokenizers
 * and decoders turn one list into the next. */
typedef struct tok_span {
    size_t off, len;
} tok_span;

typedef struct tok_spans {
    tok_buf buf;
    tok_span *v;
    size_t n, cap;
} tok_spans;

int tok_spans_add(tok_spans *s, size_t off, size_t len);
/* Appends text to the buffer and a span covering it. */
int tok_spans_add_text(tok_spans *s, const char *t, size_t len);
void tok_spans_reset(tok_spans *s);
void tok_spans_free(tok_spans *s);

typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;

int tok_ids_push(tok_ids *a, int32_t id);

/* ---- hash maps ------------------------------------------------------------ */

/* token string -> id; keys point into strings the tokenizer owns. */
typedef struct tok_strmap {
    uint32_t mask; /* capacity - 1 (power of two) */
    const char **key;
    uint32_t *klen;
    int32_t *val; /* -1 marks an empty slot */
} tok_strmap;

int tok_strmap_init(tok_strmap *m, size_t expected);
/* Returns 1 when inserted, 0 when the key was present (value kept). */
int tok_strmap_put(tok_strmap *m, const char *k, uint32_t klen, int32_t v);
int32_t tok_strmap_get(const tok_strmap *m, const char *k, size_t klen);
void tok_strmap_free(tok_strmap *m);

/* (left id, right id) -> merge rank and merged id. One slot holds all
 * three so a lookup touches one cache line. */
typedef struct tok_pair_slot {
    uint64_t key; /* UINT64_MAX marks an empty slot */
    int32_t rank;
    int32_t merged;
} tok_pair_slot;

typedef struct tok_pairmap {
    uint32_t mask;
    tok_pair_slot *slot;
    /* One bit per hash value (a filter small enough for the CPU cache):
     * most pairs BPE asks about are not merges, and a clear bit answers
     * that without touching the large slot table. */
    uint64_t *filter;
    uint32_t filter_mask;
} tok_pairmap;

int tok_pairmap_init(tok_pairmap *m, size_t expected);
/* Returns 1 when inserted, 0 when the pair was present: like Hugging Face,
 * a repeated merge takes the later rank. */
int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged);
/* Returns the rank, or -1; *merged set when found. */
int32_t tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *merged);
void tok_pairmap_free(tok_pairmap *m);

/* ---- word cache ------------------------------------------------------------- */

/* Word -> ids, shared by every thread encoding with one tokenizer: the
 * same words come back constantly in real text, and BPE on a word costs
 * far more than a lookup. Sharded, one mutex per shard; a full shard is
 * emptied and refilled, which bounds memory without bookkeeping. */
typedef struct tok_cache tok_cache;

tok_cache *tok_cache_new(void);
void tok_cache_free(tok_cache *c);
/* Appends the cached ids of word to out; returns 1 on a hit, 0 on a miss,
 * negative on allocation failure. */
int tok_cache_get(tok_cache *c, const char *word, size_t len, tok_ids *out);
/* Remembers ids for word (words longer than TOK_CACHE_MAX_WORD are not). */
void tok_cache_put(tok_cache *c, const char *word, size_t len, const int32_t *ids, size_t n);
#define TOK_CACHE_MAX_WORD 64

/* ---- components ------------------------------------------------------------ */

typedef enum {
    NORM_NFC,
    NORM_NFD,
    NORM_NFKC,
    NORM_NFKD,
    NORM_LOWERCASE,
    NORM_PREPEND,
    NORM_REPLACE,
    NORM_STRIP,
} tok_norm_kind;

typedef struct tok_norm {
    tok_norm_kind kind;
    char *text; /* PREPEND: what; REPLACE: literal pattern */
    size_t text_len;
    pcre2_code *re; /* REPLACE with a Regex pattern */
    char *content;  /* REPLACE: the replacement */
    size_t content_len;
    bool left, right; /* STRIP */
} tok_norm;

typedef enum {
    PRE_SPLIT,
    PRE_BYTELEVEL,
    PRE_METASPACE,
    PRE_DIGITS,
} tok_pre_kind;

/* How a Split keeps the pieces its pattern matches (HF's names). */
typedef enum {
    SPLIT_REMOVED,
    SPLIT_ISOLATED,
    SPLIT_MERGED_PREV,
    SPLIT_MERGED_NEXT,
    SPLIT_CONTIGUOUS,
} tok_split_behavior;

typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } tok_prepend;

typedef struct tok_pre {
    tok_pre_kind kind;
    pcre2_code *re; /* SPLIT (literal patterns compiled as literal) and BYTELEVEL */
    tok_split_behavior behavior;
    bool invert;
    bool add_prefix_space; /* BYTELEVEL */
    char replacement[8];   /* METASPACE: one character, UTF-8 */
    size_t replacement_len;
    tok_prepend prepend;    /* METASPACE */
    bool split;             /* METASPACE */
    bool individual_digits; /* DIGITS */
} tok_pre;

typedef enum {
    DEC_BYTELEVEL,
    DEC_REPLACE,
    DEC_BYTEFALLBACK,
    DEC_FUSE,
    DEC_STRIP,
    DEC_METASPACE,
} tok_dec_kind;

typedef struct tok_dec {
    tok_dec_kind kind;
    char *pattern, *content; /* REPLACE (literal) */
    size_t pattern_len, content_len;
    char strip[8]; /* STRIP: the character; METASPACE: replacement */
    size_t strip_len;
    int start, stop;     /* STRIP */
    tok_prepend prepend; /* METASPACE */
} tok_dec;

typedef struct tok_added {
    char *content;
    size_t len;
    int32_t id;
    bool special, lstrip, rstrip, normalized, single_word;
} tok_added;

struct tok_tokenizer {
    /* id -> spelling, for decode and tok_token_str; NULL where unused */
    char **pieces;
    uint32_t *piece_len;
    int32_t vocab_size;

    tok_strmap vocab; /* the model's vocabulary */
    tok_pairmap merges;
    int32_t unk_id; /* -1 when none */
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t fallback_ids[256]; /* ids of <0xNN>, -1 when absent */

    bool byte_level;       /* a ByteLevel pre-tokenizer maps bytes to chars */
    int32_t byte_ids[256]; /* byte-level: id of the one-character token of each byte */

    tok_norm *norms;
    int n_norms;
    tok_pre *pres;
    int n_pres;
    tok_dec *decs;
    int n_decs;
    bool has_decoder;

    tok_added *added; /* sorted by length, longest first */
    int n_added;
    bool added_first[256];     /* quick reject: first bytes of added tokens */
    bool any_normalized_added; /* some added token matches normalized text */
    tok_strmap added_map;

    tok_cache *cache; /* internally locked; NULL disables it */

    int32_t bos, eos;
    /* what add_special puts around the text (post_processor template, or
     * tokenizer_config's add_bos_token / add_eos_token); -1 for nothing */
    int32_t prefix_id, suffix_id;
};

/* ---- shared helpers ---------------------------------------------------------- */

/* GPT-2's byte <-> character map: the code point standing for each byte. */
uint32_t tok_byte_to_cp(unsigned byte);
/* The byte a code point stands for, or -1. */
int tok_cp_to_byte(uint32_t cp);
/* Appends the UTF-8 of a code point; returns bytes written (1-4). */
int tok_utf8_put(char *out, uint32_t cp);
/* Length of the UTF-8 sequence starting with byte c (1 for a stray byte). */
int tok_utf8_len(unsigned char c);
/* Offset of the first byte that is not valid UTF-8, or (size_t)-1. */
size_t tok_utf8_check(const char *s, size_t len);
/* Appends s to b, replacing every invalid UTF-8 sequence with U+FFFD. */
int tok_utf8_lossy(tok_buf *b, const char *s, size_t len);

/* Compiles a pattern in UTF mode with Unicode properties and JIT;
 * err names what for. */
pcre2_code *tok_regex_compile(const char *pat, size_t len, bool literal, const char *what,
                              ty_err *err);

#endif
