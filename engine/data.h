/* data.h — the training data of `dataset.format: "tokens"` and its order.
 *
 * A dataset is JSONL, one example per line: {"input_ids": [...]} with
 * optional "labels" of the same length (-100 = no loss), the Hugging Face
 * convention. A row of the batch holds the first seq_len ids; the target at
 * position t is labels[t + 1] (labels default to input_ids), the last
 * position and padding get -100. Examples are visited in a fresh permutation
 * each epoch: Fisher-Yates driven by splitmix64 seeded from (seed, epoch), so
 * the order depends only on (seed, epoch, cursor) and resumes exactly. */
#ifndef TY_DATA_H
#define TY_DATA_H

#include <stdint.h>
#include "tyerr.h"

#define DATA_IGNORE (-100)

struct data_text;

/* The text formats (textdata.c) plug in through these: rows are built on
 * demand from a streamed file, so data.c needs no tokenizer. fill returns
 * the row's target count, or -1 with the reason in error(). */
typedef struct data_text_ops {
    int (*fill)(struct data_text *t, int row, int T, int32_t *inputs, int32_t *targets);
    const char *(*error)(const struct data_text *t);
    void (*free)(struct data_text *t);
} data_text_ops;

typedef struct dataset {
    int n;        /* examples (tokens) or rows (text formats) */
    int64_t *off; /* tokens: n + 1 offsets into tok / lab */
    int32_t *tok;
    int32_t *lab; /* labels, DATA_IGNORE where ignored */
    /* Text formats: rows come from `text`; map[i] is the source row of
     * row i (a split keeps part of them). The train set owns `text`; an
     * eval set split off it borrows it. */
    struct data_text *text;
    const data_text_ops *ops;
    int owns_text;
    int32_t *map;
    int64_t skipped; /* invalid lines skipped (dataset.skip_invalid) */
} dataset;

/* Loads a tokens JSONL file; ids must lie in [0, vocab). Errors name the
 * file and line. An empty file is an error. */
int data_load_tokens(const char *path, int vocab, dataset *d, ty_err *err);
void data_free(dataset *d);

/* dataset.eval_fraction: moves round(n * fraction) examples (at least 1,
 * leaving at least 1) into *eval. The held-out examples are the first ones
 * of data_permutation(seed ^ DATA_SPLIT_SALT, 0, n); both parts keep file
 * order. Errors when there are fewer than 2 examples. */
#define DATA_SPLIT_SALT 0x6576616C5F737074ull /* "eval_spt" */
int data_split(dataset *d, double fraction, uint64_t seed, dataset *eval, ty_err *err);

/* Fills one batch row of T positions from example ex; returns the number of
 * non-ignored targets. Padding inputs are id 0 (never attended to by a real
 * position under the causal mask). Text formats build the row on demand and
 * may fail (I/O): -1, with the reason in data_error(). */
int data_fill_row(const dataset *d, int ex, int T, int32_t *inputs, int32_t *targets);
const char *data_error(const dataset *d);
/* The row of an example of len tokens with HF labels: inputs are its first
 * T ids, target t is lab[t + 1] (-100 past the truncated end). */
int data_row_from(const int32_t *tok, const int32_t *lab, int64_t len, int T, int32_t *inputs,
                  int32_t *targets);

/* The permutation of epoch `epoch` (0-based) of n examples:
 *   state = seed ^ ((epoch + 1) * 0x9E3779B97F4A7C15)
 *   perm = [0, n); for i = n-1 .. 1: j = splitmix64(state) % (i + 1); swap(perm[i], perm[j]) */
void data_permutation(uint64_t seed, int64_t epoch, int n, int32_t *perm);

/* Walks examples epoch by epoch. The cursor (epoch, pos) is all the state
 * a checkpoint needs; the permutation is recomputed from it. */
typedef struct data_sampler {
    int n;
    uint64_t seed;
    int64_t epoch; /* current epoch, 0-based */
    int64_t pos;   /* next index into perm */
    int32_t *perm;
} data_sampler;

int data_sampler_init(data_sampler *s, int n, uint64_t seed, int64_t epoch, int64_t pos,
                      ty_err *err);
int data_sampler_next(data_sampler *s);
void data_sampler_free(data_sampler *s);

#endif
