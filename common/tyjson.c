/* tyjson.c — shortest round-trip reals in JSON text (tyjson.h).
 *
 * jansson has no hook for how a real is printed, so ty_json_dumps lets it
 * print, then rewrites each number token outside strings that has a
 * fraction or exponent. The scan only needs JSON's lexical rules: a
 * string starts and ends at an unescaped quote, and a number is a run of
 * [-+.0-9eE] starting with '-' or a digit. */
#include "tyjson.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ty_fmt_double(char *buf, size_t cap, double v)
{
    if (isnan(v)) return snprintf(buf, cap, "nan");
    if (isinf(v)) return snprintf(buf, cap, v < 0 ? "-inf" : "inf");
    int n = 0;
    for (int p = 1; p <= 17; p++) {
        n = snprintf(buf, cap, "%.*g", p, v);
        if (n < 0 || (size_t)n >= cap || strtod(buf, NULL) == v) break;
    }
    return n;
}

static int is_number_char(char c)
{
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

char *ty_json_tidy(const char *text)
{
    if (!text) return NULL;
    size_t len = strlen(text);
    /* A real token of L >= 3 characters becomes at most L + 4 (the
     * n <= L + 2 check below, then ".0"): three times the input bounds it. */
    char *out = malloc(3 * len + 32);
    if (!out) return NULL;
    size_t o = 0;
    int in_str = 0;
    for (size_t i = 0; i < len;) {
        char c = text[i];
        if (in_str) {
            out[o++] = c;
            i++;
            if (c == '\\' && i < len)
                out[o++] = text[i++];
            else if (c == '"')
                in_str = 0;
            continue;
        }
        if (c == '"') {
            in_str = 1;
            out[o++] = c;
            i++;
            continue;
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
            size_t j = i;
            int real = 0;
            while (j < len && is_number_char(text[j])) {
                real |= text[j] == '.' || text[j] == 'e' || text[j] == 'E';
                j++;
            }
            if (real && j - i < 64) {
                char num[64], best[40];
                memcpy(num, text + i, j - i);
                num[j - i] = 0;
                int n = ty_fmt_double(best, sizeof best, strtod(num, NULL));
                if (n > 0 && (size_t)n < sizeof best && (size_t)n <= j - i + 2) {
                    memcpy(out + o, best, (size_t)n);
                    o += (size_t)n;
                    if (!strpbrk(best, ".eEni")) { /* reads as an integer: keep it real */
                        memcpy(out + o, ".0", 2);
                        o += 2;
                    }
                    i = j;
                    continue;
                }
            }
            memcpy(out + o, text + i, j - i);
            o += j - i;
            i = j;
            continue;
        }
        out[o++] = c;
        i++;
    }
    out[o] = 0;
    return out;
}

char *ty_json_dumps(const json_t *j, size_t flags)
{
    char *raw = json_dumps(j, flags);
    if (!raw) return NULL;
    char *tidy = ty_json_tidy(raw);
    free(raw);
    return tidy;
}
