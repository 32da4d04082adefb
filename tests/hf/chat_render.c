/* chat_render.c — hf.chat_template's view of engine/chattpl: reads JSON
 * lines {"template": FILE, "messages": [...], "add_generation_prompt": b,
 * "bos": s, "eos": s} on stdin and writes one JSON line per case,
 * {"text": ...} or {"error": ...}, so the Python side can compare with
 * transformers' apply_chat_template. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chattpl.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

int main(void)
{
    char line[1 << 16];
    while (fgets(line, sizeof line, stdin)) {
        json_error_t je;
        json_t *c = json_loads(line, 0, &je), *res;
        if (!c) return fprintf(stderr, "chat_render: bad input line: %s\n", je.text), 2;
        const char *path = json_string_value(json_object_get(c, "template"));
        char *src = path ? slurp(path) : NULL;
        char why[512] = "", *out = NULL, *msgs = json_dumps(json_object_get(c, "messages"), 0);
        size_t n = 0;
        chattpl *t =
            src ? chattpl_new(src, json_string_value(json_object_get(c, "bos")),
                              json_string_value(json_object_get(c, "eos")), why, sizeof why)
                : NULL;
        if (!src) snprintf(why, sizeof why, "cannot read %s", path ? path : "(no template)");
        if (t && !chattpl_render(t, msgs, json_is_true(json_object_get(c, "add_generation_prompt")),
                                 &out, &n, why, sizeof why))
            res = json_pack("{s:s%}", "text", out, n);
        else
            res = json_pack("{s:s}", "error", why);
        char *js = json_dumps(res, JSON_COMPACT);
        printf("%s\n", js);
        fflush(stdout);
        free(js);
        json_decref(res);
        free(out);
        free(msgs);
        chattpl_free(t);
        free(src);
        json_decref(c);
    }
    return 0;
}
