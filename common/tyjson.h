/* tyjson.h — JSON text with numbers as people write them.
 *
 * jansson prints a real with 17 significant digits ("%.17g"), so 0.003
 * becomes 0.0030000000000000001: exact, but noise to whoever reads it.
 * The shortest decimal text that reads back as the same double (the rule
 * of JavaScript's Number.prototype.toString and Python's repr) is exact
 * too, and short. Everything the server and the engine write as JSON or
 * CSV goes through these. */
#ifndef TY_TYJSON_H
#define TY_TYJSON_H

#include <jansson.h>
#include <stddef.h>

/* The shortest "%.<p>g" text of v (p = 1..17) that strtod reads back as v;
 * "nan" / "inf" / "-inf" for those. Returns the length, as snprintf. */
int ty_fmt_double(char *buf, size_t cap, double v);

/* json_dumps(j, flags) with every real number rewritten as ty_fmt_double
 * gives it, a ".0" kept where the text would read back as an integer (so
 * a real stays a real for jansson). NULL on allocation failure or where
 * json_dumps gives NULL. free() the result. */
char *ty_json_dumps(const json_t *j, size_t flags);

/* The same on JSON text already written (a line an engine sent). */
char *ty_json_tidy(const char *text);

#endif
