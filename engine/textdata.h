/* textdata.h — the text dataset formats: text, prompt_completion and chat.
 *
 * A JSONL file is mapped and indexed in one pass (the byte offset and
 * length of every valid line; each line is checked then: UTF-8, JSON, the
 * format's fields and types), dropping the pages behind the scan. Rows are
 * read back with pread and tokenised when a batch asks for them, so a large
 * file is never held, raw or tokenised, in memory. With
 * packing, a second pass counts each example's tokens (the counts alone are
 * kept) so packed rows can be cut out of the concatenation without storing
 * it. The result plugs into data.h's dataset, so sampling, splits and the
 * trainer treat every format alike. */
#ifndef TY_TEXTDATA_H
#define TY_TEXTDATA_H

#include "data.h"
#include "tokenizer.h"
#include "tyerr.h"

typedef enum { TD_TEXT = 1, TD_PROMPT_COMPLETION, TD_CHAT } textdata_format;
typedef enum { TD_CHATML = 0, TD_LLAMA3, TD_LLAMA2, TD_MODEL } textdata_template;

typedef struct textdata_opts {
    textdata_format format;
    const char *text_field; /* TD_TEXT; "text" when NULL */
    textdata_template chat_template;
    int packing;                /* concatenate examples into full seq_len rows */
    int seq_len;                /* needed for packing */
    int skip_invalid;           /* skip bad lines (counted) instead of failing */
    int vocab;                  /* the model's vocabulary: every id must be below it */
    const tok_tokenizer *tok;   /* borrowed; must outlive the dataset */
    const char *model_template; /* TD_MODEL: the model's chat_template (Jinja source), borrowed */
} textdata_opts;

/* Indexes path into *d (rows = examples, or packed rows). A bad line is an
 * error naming file and line unless skip_invalid (then d->skipped counts
 * them). An empty file is an error. */
int textdata_open(const char *path, const textdata_opts *o, dataset *d, ty_err *err);

/* Parses a chat template name ("chatml", "llama3", "llama2", or "model":
 * the model's own chat_template, rendered by chattpl.h). */
int textdata_template_parse(const char *name, textdata_template *out);
/* The chat_template of <dir>/tokenizer_config.json (a string, or the
 * "default" entry of a list of named templates) into *out (malloc'd).
 * TY_ENOENT naming the file when there is none. */
int textdata_model_template(const char *dir, char **out, ty_err *err);

#endif
