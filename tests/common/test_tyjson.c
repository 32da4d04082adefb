/* test_tyjson.c — JSON reals as their shortest round-trip text: the
 * values people type come back as typed, every double reads back
 * exactly, strings and integers are untouched, and a real stays a real. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tyassert.h"
#include "tyjson.h"

static void fmt_is(double v, const char *want)
{
    char buf[40];
    ty_fmt_double(buf, sizeof buf, v);
    CHECK(!strcmp(buf, want), "ty_fmt_double(%.17g) = %s, want %s", v, buf, want);
}

int main(void)
{
    fmt_is(0.003, "0.003");
    fmt_is(0.9, "0.9");
    fmt_is(2e-5, "2e-05");
    fmt_is(1.0 / 3, "0.3333333333333333");
    fmt_is(-0.5, "-0.5");
    fmt_is(5e-324, "5e-324");
    /* every double reads back exactly: a spread of bit patterns */
    uint64_t u = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < 100000; i++) {
        u ^= u << 13, u ^= u >> 7, u ^= u << 17;
        double v;
        memcpy(&v, &u, sizeof v);
        if (!isfinite(v)) continue;
        char buf[40];
        ty_fmt_double(buf, sizeof buf, v);
        if (strtod(buf, NULL) != v) {
            CHECK(0, "%a printed as %s does not read back", v, buf);
            break;
        }
    }
    json_t *o = json_pack("{sf sf sf si ss s[f]}", "lr", 0.003, "one", 1.0, "big", 1e300, "n", 3,
                          "s", "0.30000000000000004 \\\" 1.0", "a", 0.1 + 0.2);
    char *text = ty_json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    CHECK(text && !strcmp(text, "{\"lr\":0.003,\"one\":1.0,\"big\":1e+300,\"n\":3,"
                                "\"s\":\"0.30000000000000004 \\\\\\\" 1.0\","
                                "\"a\":[0.30000000000000004]}"),
          "ty_json_dumps: %s", text ? text : "(null)");
    json_t *back = text ? json_loads(text, 0, NULL) : NULL;
    CHECK(back && json_equal(o, back), "the text does not read back as the same values");
    CHECK(back && json_is_real(json_object_get(back, "one")), "1.0 came back as an integer");
    free(text);
    json_decref(back);
    json_decref(o);
    char *line = ty_json_tidy("{\"ev\":\"metric\",\"lr\":0.0030000000000000001,\"step\":10}");
    CHECK(line && !strcmp(line, "{\"ev\":\"metric\",\"lr\":0.003,\"step\":10}"), "tidy: %s", line);
    free(line);
    return ty_summary("common.tyjson");
}
