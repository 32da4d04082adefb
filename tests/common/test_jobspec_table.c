/* test_jobspec_table.c — the field table drives the parser (common/jobspec.c).
 *
 * For every row jobspec_schema gives: an integer is accepted at its bounds
 * and refused one past them, a number likewise at closed ends and at open
 * ones refused, a string of maxLength bytes accepted and one more refused,
 * every enum value accepted and another refused, each refusal naming the
 * row's path; and a spec that leaves the row out parses to the row's
 * default, which jobspec_to_json writes back (or leaves out where the row
 * has none). A row the parser ignored, or a bound or default the table
 * states but the parser does not keep, fails here. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobspec.h"

#include "tyassert.h"

/* The method a row's section needs: lora.* with lora, qlora.* with qlora. */
static const char *method_for(const char *path)
{
    if (!strncmp(path, "qlora.", 6)) return "qlora";
    return !strncmp(path, "lora.", 5) ? "lora" : "full";
}

/* The smallest spec with row path's section allowed, path set to v (NULL: left out). */
static json_t *spec_with(const char *path, json_t *v)
{
    json_t *root = json_pack("{s:{s:s}, s:{s:s}, s:{s:I}, s:s}", "model", "path", "/m", "dataset",
                             "train", "/d/t", "hyperparameters", "max_steps",
                             (json_int_t)1000000000, "method", method_for(path));
    const char *dot = strchr(path, '.');
    if (!v) return root;
    if (!dot) {
        json_object_set_new(root, path, v);
        return root;
    }
    char sec[64];
    snprintf(sec, sizeof sec, "%.*s", (int)(dot - path), path);
    json_t *o = json_object_get(root, sec);
    if (!o) json_object_set_new(root, sec, o = json_object());
    json_object_set_new(o, dot + 1, v);
    return root;
}

/* Parses the spec with path = v: 0, or the error code with *field set. */
static int try_value(const char *path, json_t *v, char *field, size_t cap)
{
    json_t *root = spec_with(path, v);
    jobspec s;
    ty_err e = {0};
    int rc = jobspec_parse(root, &s, &e);
    snprintf(field, cap, "%s", rc ? e.field : "");
    if (rc == 0) jobspec_free(&s);
    json_decref(root);
    return rc;
}

static void accepts(const char *path, json_t *v, const char *what)
{
    char f[128];
    CHECK(try_value(path, v, f, sizeof f) == 0, "%s: %s refused (field %s)", path, what, f);
}

static void refuses(const char *path, json_t *v, const char *what)
{
    char f[128];
    int rc = try_value(path, v, f, sizeof f);
    CHECK(rc == TY_EINVAL && !strcmp(f, path), "%s: %s: rc %d, field '%s'", path, what, rc, f);
}

static void check_int(const char *path, const json_t *row)
{
    json_int_t lo = json_integer_value(json_object_get(row, "minimum"));
    json_int_t hi = json_integer_value(json_object_get(row, "maximum"));
    CHECK(json_object_get(row, "minimum") && json_object_get(row, "maximum"), "%s: bounds", path);
    accepts(path, json_integer(lo), "the minimum");
    accepts(path, json_integer(hi), "the maximum");
    if (lo > INT64_MIN) refuses(path, json_integer(lo - 1), "below the minimum");
    if (hi < INT64_MAX) refuses(path, json_integer(hi + 1), "above the maximum");
    refuses(path, json_real(lo + 0.5), "a fraction");
}

static void check_num(const char *path, const json_t *row)
{
    json_t *lo = json_object_get(row, "minimum"), *xlo = json_object_get(row, "exclusiveMinimum");
    json_t *hi = json_object_get(row, "maximum"), *xhi = json_object_get(row, "exclusiveMaximum");
    CHECK((lo || xlo) && (hi || xhi), "%s: bounds", path);
    if (!(lo || xlo) || !(hi || xhi)) return;
    double l = json_number_value(lo ? lo : xlo), h = json_number_value(hi ? hi : xhi);
    if (lo) accepts(path, json_real(l), "the minimum");
    if (xlo) refuses(path, json_real(l), "the exclusive minimum");
    refuses(path, json_real(nextafter(l, -INFINITY)), "below the minimum");
    if (hi) accepts(path, json_real(h), "the maximum");
    if (xhi) refuses(path, json_real(h), "the exclusive maximum");
    refuses(path, json_real(nextafter(h, INFINITY)), "above the maximum");
}

static void check_string(const char *path, const json_t *row)
{
    json_t *e = json_object_get(row, "enum");
    size_t i;
    json_t *v;
    json_array_foreach(e, i, v) accepts(path, json_copy(v), json_string_value(v));
    if (e) {
        refuses(path, json_string("zz-none-of-them"), "a value not in its enum");
        return;
    }
    if (json_object_get(row, "kind")) return; /* paths: their syntax is test_jobspec.c's */
    size_t max = (size_t)json_integer_value(json_object_get(row, "maxLength"));
    CHECK(max > 0 && max < 100000, "%s: maxLength %zu", path, max);
    char *s = malloc(max + 2);
    memset(s, 'a', max + 1);
    s[max + 1] = 0;
    refuses(path, json_string(s), "a string over maxLength");
    s[max] = 0;
    accepts(path, json_string(s), "a string of maxLength");
    free(s);
    refuses(path, json_string(""), "an empty string");
}

/* Left out, the row parses to its default, and jobspec_to_json writes it. */
static void check_default(const char *path, const json_t *row)
{
    json_t *root = spec_with(path, NULL), *back = NULL;
    jobspec s;
    ty_err e = {0};
    int rc = jobspec_parse(root, &s, &e);
    CHECK(rc == 0, "%s: the smallest spec: %s", path, e.msg);
    if (rc == 0) {
        back = jobspec_to_json(&s);
        jobspec_free(&s);
    }
    const char *dot = strchr(path, '.');
    char sec[64];
    snprintf(sec, sizeof sec, "%.*s", dot ? (int)(dot - path) : 0, path);
    json_t *v =
        dot ? json_object_get(json_object_get(back, sec), dot + 1) : json_object_get(back, path);
    json_t *def = json_object_get(row, "default");
    if (!v && json_is_true(json_object_get(row, "omit_default")))
        ; /* left out when it is the default */
    else if (def && json_is_number(def))
        CHECK(json_is_number(v) && json_number_value(v) == json_number_value(def),
              "%s: written back as %g, default %g", path, json_number_value(v),
              json_number_value(def));
    else if (def)
        CHECK(v && json_equal(v, def), "%s: written back unlike its default", path);
    json_decref(back);
    json_decref(root);
}

int main(void)
{
    json_t *rows = jobspec_schema();
    size_t i;
    json_t *row;
    int n = 0;
    json_array_foreach(rows, i, row)
    {
        const char *path = json_string_value(json_object_get(row, "path"));
        const char *type = json_string_value(json_object_get(row, "type"));
        if (!strcmp(type, "integer"))
            check_int(path, row);
        else if (!strcmp(type, "number"))
            check_num(path, row);
        else if (!strcmp(type, "string"))
            check_string(path, row);
        else if (!strcmp(type, "boolean")) {
            accepts(path, json_true(), "true");
            refuses(path, json_integer(1), "an integer");
        }
        check_default(path, row);
        n++;
    }
    CHECK(n >= 60, "only %d rows", n);
    json_decref(rows);
    printf("common.jobspec_table: %d rows\n", n);
    return ty_summary("jobspec_table");
}
