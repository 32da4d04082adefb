/* tokenizer.h — the tokenizer module's interface: Hugging Face tokenizer.json
 * BPE models (byte-level as in GPT-2 / Llama 3 / Qwen2, and SentencePiece-
 * style with byte fallback as in Llama 2 / TinyLlama / Mistral).
 *
 * tok_load() reads a model directory once; the tokenizer is immutable
 * afterwards, so any number of threads may call tok_encode()/tok_decode()
 * on the same tokenizer at the same time (each call owns its scratch).
 * Any component of tokenizer.json this module does not implement is an
 * error naming it at load time — never a silently different tokenisation. */
#ifndef TY_TOKENIZER_H
#define TY_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "tyerr.h"

typedef struct tok_tokenizer tok_tokenizer;

/* Loads model_dir/tokenizer.json plus, when present, tokenizer_config.json
 * (bos/eos token strings, add_bos_token / add_eos_token) and config.json
 * (bos_token_id / eos_token_id as a fallback). *out is owned by the caller
 * (tok_free). Errors name the file and, where there is one, the component
 * or token ("tokenizer.json: model.type \"WordPiece\" is not supported"). */
int tok_load(tok_tokenizer **out, const char *model_dir, ty_err *err);

/* Same, from the text of a tokenizer.json and optional configs (either may
 * be NULL). Used by tok_load and by tests that build tokenizers in memory. */
int tok_load_json(tok_tokenizer **out, const char *tokenizer_json,
                  const char *tokenizer_config_json, const char *config_json, ty_err *err);

/* Encodes len bytes of UTF-8 text. Added tokens in the text (special or
 * not) become their ids, as Hugging Face does by default. add_special adds
 * bos and/or eos as the model's configuration asks (tok_adds_bos/eos).
 * Invalid UTF-8 is TY_EINVAL naming the byte offset. *ids is malloc'd and
 * owned by the caller; *n may be 0 (then *ids may still need free()). */
int tok_encode(const tok_tokenizer *tok, const char *text, size_t len, int add_special,
               int32_t **ids, size_t *n, ty_err *err);

/* Decodes ids back to text with the model's decoder chain; special tokens
 * are written as their text. The result is always valid UTF-8 (byte
 * sequences that are not valid UTF-8 become U+FFFD) and NUL-terminated;
 * *text is owned by the caller. An id outside the vocabulary is TY_EINVAL. */
int tok_decode(const tok_tokenizer *tok, const int32_t *ids, size_t n, char **text, size_t *len,
               ty_err *err);

/* -1 when the model has none. */
int32_t tok_bos(const tok_tokenizer *tok);
int32_t tok_eos(const tok_tokenizer *tok);
/* Whether add_special puts bos first / eos last. */
int tok_adds_bos(const tok_tokenizer *tok);
int tok_adds_eos(const tok_tokenizer *tok);
/* One more than the largest id of the model vocabulary and added tokens. */
int32_t tok_vocab_size(const tok_tokenizer *tok);
/* The id of a token string (added tokens first, then the model vocabulary,
 * in the model's own spelling, e.g. "Ġthe" or "▁the"); -1 if absent. */
int32_t tok_token_id(const tok_tokenizer *tok, const char *token);
/* The stored spelling of an id, or NULL when the id is unused. */
const char *tok_token_str(const tok_tokenizer *tok, int32_t id);
void tok_free(tok_tokenizer *tok);

/* `trainyard-engine tokenize --model DIR [--add-special] [--decode]`:
 * reads UTF-8 lines on stdin and prints each line's ids, space-separated,
 * one output line per input line (with --decode: reads ids, prints text).
 * argv[0] is the command's name; options follow. Returns the process exit
 * status: 0 ok, 2 bad arguments or model, 1 bad input (invalid UTF-8 names
 * the line), messages on stderr. */
int tokenizer_cli_main(int argc, char **argv);

#endif
