// chattpl.cpp — the C face of minja's chat_template (chattpl.h). Everything
// minja throws is caught here and becomes a message; no exception crosses
// into C.
#include "chattpl.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include <chat-template.hpp>

struct chattpl {
    minja::chat_template tmpl;
    chattpl(const std::string &src, const std::string &bos, const std::string &eos)
        : tmpl(src, bos, eos)
    {
    }
};

static void say(char *why, size_t wn, const char *what, const char *msg)
{
    if (why && wn) snprintf(why, wn, "%s: %.400s", what, msg);
}

extern "C" chattpl *chattpl_new(const char *source, const char *bos, const char *eos, char *why,
                                size_t wn)
{
    try {
        return new chattpl(source, bos ? bos : "", eos ? eos : "");
    } catch (const std::exception &e) {
        say(why, wn, "chat_template does not parse", e.what());
    } catch (...) {
        say(why, wn, "chat_template does not parse", "unknown error");
    }
    return nullptr;
}

extern "C" void chattpl_free(chattpl *t)
{
    delete t;
}

extern "C" int chattpl_render(const chattpl *t, const char *messages_json,
                              int add_generation_prompt, char **out, size_t *outn, char *why,
                              size_t wn)
{
    try {
        minja::chat_template_inputs in;
        in.messages = nlohmann::ordered_json::parse(messages_json);
        in.add_generation_prompt = add_generation_prompt != 0;
        minja::chat_template_options opts;
        opts.apply_polyfills = false; /* the template's own text, as transformers renders it */
        std::string s = t->tmpl.apply(in, opts);
        char *p = static_cast<char *>(malloc(s.size() + 1));
        if (!p) {
            say(why, wn, "chat_template", "out of memory");
            return -1;
        }
        memcpy(p, s.data(), s.size());
        p[s.size()] = 0;
        *out = p;
        *outn = s.size();
        return 0;
    } catch (const std::exception &e) {
        say(why, wn, "chat_template", e.what());
    } catch (...) {
        say(why, wn, "chat_template", "unknown error");
    }
    return -1;
}
