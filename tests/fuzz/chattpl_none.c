/* chattpl_none.c — the fuzz build's engine/chattpl.h. The fuzz tree is C
 * only (clang, libFuzzer); textdata.c's chat_template "model" path renders
 * through minja (C++, engine/chattpl.cpp), which no fuzzer reaches: the
 * jsonl fuzzer's datasets use the named templates. Parsing a template here
 * says so instead of linking C++ into every fuzzer. */
#include <stdio.h>

#include "chattpl.h"

chattpl *chattpl_new(const char *source, const char *bos, const char *eos, char *why, size_t wn)
{
    (void)source, (void)bos, (void)eos;
    if (why && wn) snprintf(why, wn, "model chat templates are not part of the fuzz build");
    return NULL;
}

void chattpl_free(chattpl *t)
{
    (void)t;
}

int chattpl_render(const chattpl *t, const char *messages_json, int add_generation_prompt,
                   char **out, size_t *outn, char *why, size_t wn)
{
    (void)t, (void)messages_json, (void)add_generation_prompt, (void)out, (void)outn;
    if (why && wn) snprintf(why, wn, "model chat templates are not part of the fuzz build");
    return -1;
}
