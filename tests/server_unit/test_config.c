/* test_config.c — the server's option table (server/config.c) against what
 * it drives and what documents it: every option has a working default, a
 * line in --help and a row (or, for an object-store key, a mention) in
 * docs/server.md's "Flags and the config file", whose documented integer
 * defaults must equal the table's; every flag the page lists must be in the
 * table. Then the parsers: bounds, bools without a value, secrets refused
 * as flags, the file and the flags agreeing.
 * Usage: server_unit_config <path of docs/server.md> */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "tyassert.h"
#include "tyutil.h"

/* docs/server.md from "## Flags and the config file" to the next "## ". */
static char *flags_section(const char *path)
{
    char *doc = NULL;
    size_t len;
    ty_err err = {0};
    REQUIRE(ty_read_file(path, &doc, &len, &err) == 0, "%s", err.msg);
    char *start = strstr(doc, "\n## Flags and the config file\n");
    REQUIRE(start != NULL, "%s has no \"Flags and the config file\" section", path);
    char *end = strstr(start + 5, "\n## ");
    if (end) *end = 0;
    char *sec = strdup(start);
    free(doc);
    return sec;
}

/* The table row whose first cell names --name (a row may name two), or NULL. */
static const char *row_of(const char *sec, const char *name)
{
    size_t nl = strlen(name);
    for (const char *row = strstr(sec, "\n| `--"); row; row = strstr(row + 1, "\n| `--")) {
        const char *cell_end = strstr(row + 3, " |");
        for (const char *f = strstr(row, "--"); f && f < cell_end; f = strstr(f + 2, "--"))
            if (!strncmp(f + 2, name, nl) && (f[2 + nl] == ' ' || f[2 + nl] == '`')) return row + 1;
    }
    return NULL;
}

static void check_docs(const char *sec)
{
    size_t n;
    const srv_option *o = srv_config_options(&n);
    for (size_t i = 0; i < n; i++) {
        char key[128];
        if (o[i].flags & OPT_STORE) {
            snprintf(key, sizeof key, "`%s`", o[i].name);
            CHECK(strstr(sec, key) != NULL, "docs/server.md does not list the store key %s", key);
            continue;
        }
        if (o[i].type == OPT_CONFIG) {
            CHECK(strstr(sec, "`--config FILE`") != NULL,
                  "docs/server.md does not describe --config");
            continue;
        }
        const char *row = row_of(sec, o[i].name);
        CHECK(row != NULL, "docs/server.md has no row for --%s", o[i].name);
        if (!row || o[i].type != OPT_INT) continue;
        /* | `--flag ARG` | default | meaning | */
        const char *cell = strstr(row + 1, "| ");
        char def[64] = "";
        if (cell) sscanf(cell + 2, "%63[^ |]", def);
        CHECK(!strcmp(def, o[i].def), "docs/server.md gives --%s the default %s, the table %s",
              o[i].name, def, o[i].def);
    }
    /* The other way: every --flag in a row's first cell is an option. */
    for (const char *row = strstr(sec, "\n| `--"); row; row = strstr(row + 1, "\n| `--")) {
        const char *cell_end = strstr(row + 3, " |");
        for (const char *f = strstr(row, "--"); f && f < cell_end; f = strstr(f + 2, "--")) {
            char name[64];
            if (sscanf(f + 2, "%63[a-z0-9-]", name) != 1) continue;
            const srv_option *opt = srv_config_options_find(name);
            CHECK(opt != NULL && !(opt->flags & OPT_STORE),
                  "docs/server.md lists --%s, the table does not", name);
        }
    }
}

static void check_help(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f != NULL);
    srv_config_usage(f);
    fclose(f);
    size_t n;
    const srv_option *o = srv_config_options(&n);
    for (size_t i = 0; i < n; i++) {
        char want[128];
        snprintf(want, sizeof want, (o[i].flags & OPT_STORE) ? " %s" : "  --%s", o[i].name);
        CHECK(strstr(text, want) != NULL, "--help does not mention %s", o[i].name);
        CHECK(o[i].type == OPT_CONFIG || (o[i].flags & OPT_STORE) || o[i].help,
              "%s has no help text", o[i].name);
    }
    free(text);
}

static void check_parsing(void)
{
    srv_config c;
    ty_err err = {0};
    REQUIRE(srv_config_defaults(&c, &err) == 0, "%s", err.msg);
    /* Every default in the table is one its own parser accepts and stores. */
    CHECK(c.cpu_slots == 1 && c.max_body == 1048576 && c.max_params == 1000000000 &&
          c.grace_s == 30 && !c.require_token && !strcmp(c.listen, "127.0.0.1:8080") &&
          !strcmp(c.currency, "USD") && c.gpu_hour_price < 0 && c.cpu_hour_price < 0);
    CHECK(strstr(c.engine, "/trainyard-engine") != NULL, "engine %s", c.engine);

    char *ok[] = {"serve",           "--cpu-slots",      "3",   "--max-body=4096",
                  "--require-token", "--gpu-hour-price", "2.5", "--s3-region",
                  "eu-west-1",       "--max-params",     "0",   NULL};
    CHECK(srv_config_parse(&c, 11, ok, stdout, &err) == 0, "%s", err.msg);
    CHECK(c.cpu_slots == 3 && c.max_body == 4096 && c.require_token && c.gpu_hour_price == 2.5 &&
          !strcmp(c.store.s3_region, "eu-west-1") && c.max_params == 0);

    struct {
        const char *flag, *value, *fragment;
    } bad[] = {
        {"--cpu-slots", "1025", "cpu-slots must be an integer in [0, 1024], got '1025'"},
        {"--max-body", "12x", "max-body must be an integer"},
        {"--gpus", "0,a", "gpus must be auto, none or a list"},
        {"--currency", "usd", "3-letter ISO 4217"},
        {"--cpu-hour-price", "nan", "cpu-hour-price must be a number >= 0"},
        {"--listen", "nohost", "listen must be HOST:PORT"},
        {"--allowed-roots", "/a:rel", "'rel' is not an absolute path"},
        {"--azure-key", "k", "--azure-key is a secret"},
        {"--no-such", "1", "unknown setting 'no-such'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        srv_config_defaults(&c, &err);
        char *argv[] = {"serve", (char *)bad[i].flag, (char *)bad[i].value, NULL};
        CHECK_ERR(srv_config_parse(&c, 3, argv, stdout, &err), err, bad[i].fragment);
    }
    /* The file takes the same keys, secrets included; --config is no key. */
    CHECK(srv_config_set(&c, "azure-key", "k", &err) == 0 && !strcmp(c.store.azure_key, "k"));
    CHECK_ERR(srv_config_set(&c, "config", "x", &err), err, "unknown setting 'config'");
    CHECK(srv_config_set(&c, "require-token", "off", &err) == 0 && !c.require_token);
    CHECK(srv_config_is_secret("s3-session-token") && !srv_config_is_secret("s3-region"));
}

int main(int argc, char **argv)
{
    REQUIRE(argc == 2, "usage: server_unit_config DOCS/server.md");
    char *sec = flags_section(argv[1]);
    check_docs(sec);
    free(sec);
    check_help();
    check_parsing();
    return ty_summary("config");
}
