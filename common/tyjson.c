/* tyjson.c — shortest round-trip reals in JSON text (tyjson.h).
 *
 * jansson has no hook for how a real is printed, so ty_json_dumps lets it
 * print, then rewrites each number token outside strings that has a
 * fraction or exponent. The scan only needs JSON's lexical rules: a
 * string starts and ends at an unescaped quote, and a number is a run of
 * [-+.0-9eE] starting with '-' or a digit. */
#include "tyjson.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The digit count of the shortest round-trip text, in at most three
 * tries instead of seventeen. When a decimal of k <= 15 significant digits
 * reads back as v, it lies within half an ulp of v (under 1.2e-16 v),
 * closer than half the spacing of 15-digit decimals (over 5e-16 v), so it
 * is the 15-digit rounding of v with zeros after it: "%.14e" shows it and
 * its trailing zeros give k. Failing that the answer is 16 or 17 digits.
 * A subnormal's ulp is wider than that bound, so it searches every count. */
static int shortest_digits(double v)
{
    char buf[40];
    if (v != 0 && fabs(v) < DBL_MIN) {
        for (int p = 1; p < 17; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, v);
            if (strtod(buf, NULL) == v) return p;
        }
        return 17;
    }
    snprintf(buf, sizeof buf, "%.14e", v);
    if (strtod(buf, NULL) == v) {
        const char *e = strchr(buf, 'e');
        int k = 0;
        for (const char *p = buf; p < e; p++)
            if (*p >= '0' && *p <= '9') k++;
        for (const char *p = e - 1; p > buf && (*p == '0' || *p == '.'); p--)
            if (*p == '0') k--;
        return k > 0 ? k : 1;
    }
    snprintf(buf, sizeof buf, "%.15e", v);
    return strtod(buf, NULL) == v ? 16 : 17;
}

int ty_fmt_double(char *buf, size_t cap, double v)
{
    if (isnan(v)) return snprintf(buf, cap, "nan");
    if (isinf(v)) return snprintf(buf, cap, v < 0 ? "-inf" : "inf");
    return snprintf(buf, cap, "%.*g", shortest_digits(v), v);
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
