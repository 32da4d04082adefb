/* chattpl.h — a model's own chat template (tokenizer_config.json's
 * `chat_template`, Jinja), rendered by minja (third_party/minja), a
 * well-kept C++ Jinja implementation made for these templates; trainyard
 * writes no template engine of its own.
 *
 * Used at dataset indexing (textdata.c, chat_template "model"), never in
 * the training loop: each example is rendered once to check it and once
 * more when its row is read. Rendering follows transformers'
 * apply_chat_template: the template sees `messages`, `add_generation_prompt`,
 * `bos_token`, `eos_token` and `strftime_now`; minja's "polyfills" (which
 * rewrite messages for templates lacking a feature) are off, so the text is
 * the template's own. */
#ifndef TY_CHATTPL_H
#define TY_CHATTPL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct chattpl chattpl;

/* Parses a template; NULL with the reason in why on a syntax error. bos and
 * eos (may be NULL: "") are the tokenizer's special token strings. */
chattpl *chattpl_new(const char *source, const char *bos, const char *eos, char *why, size_t wn);
void chattpl_free(chattpl *t);
/* Renders messages_json (a JSON array of {role, content} objects) into a
 * malloc'd NUL-terminated string (*out, length *outn). Returns 0, or -1
 * with the reason (a template `raise_exception`, a runtime error) in why. */
int chattpl_render(const chattpl *t, const char *messages_json, int add_generation_prompt,
                   char **out, size_t *outn, char *why, size_t wn);

#ifdef __cplusplus
}
#endif

#endif
