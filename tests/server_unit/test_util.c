/* test_util.c — the server's pure helpers: SSE frames, list cursors (round
 * trip and rejection of forged ones), timestamps, API tokens (format,
 * hashing, matching), the Prometheus text format line by line, listen
 * addresses and the config file. */
#include <jansson.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tyassert.h"
#include "server.h"
#include "sse.h"

static void test_cursor(void)
{
    int64_t ids[] = {1, 9, 10, 99, 12345, 9007199254740993LL};
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
        char c[32];
        int64_t back = 0;
        srv_cursor_encode(ids[i], c);
        for (char *p = c; *p; p++)
            CHECK(strchr("=+/", *p) == NULL); /* url-safe, no padding */
        CHECK(srv_cursor_decode(c, &back) == 0 && back == ids[i]);
    }
    int64_t v;
    /* "", junk, "j", "j0", "j-1", "j=0", padded "j123", "h12", "j01" */
    const char *bad[] = {"",     "x",    "!!!!",     "ag",   "ajA",
                         "ai0x", "aj0w", "ajEyMw==", "ajAx", "aDEy" /* "h12" */};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(srv_cursor_decode(bad[i], &v) != 0);
}

static void test_time(void)
{
    char t[32];
    srv_time_fmt(1796222660883LL, t);
    CHECK(!strcmp(t, "2026-12-02T14:44:20.883Z"));
    srv_time_fmt(0, t);
    CHECK(t[0] == 0);
}

static void test_tokens(void)
{
    char a[68], b[68], ha[65];
    ty_err err = {0};
    CHECK(srv_token_generate(a, &err) == 0 && srv_token_generate(b, &err) == 0);
    CHECK(strlen(a) == 67 && !strncmp(a, "ty_", 3) && strcmp(a, b));
    for (int i = 3; i < 67; i++)
        CHECK(strchr("0123456789abcdef", a[i]));
    srv_token_hash(a, ha);
    CHECK(strlen(ha) == 64);
    /* sha256("ty_test") computed independently (sha256sum). */
    srv_token_hash("ty_test", ha);
    CHECK(!strcmp(ha, "226cf4f69bb0b840fb7c42b3c30a4e7538d4d1b755dd849a01fe9ac47d948f3d"));
    char hs[2][65];
    srv_token_hash(a, hs[0]);
    srv_token_hash(b, hs[1]);
    CHECK(srv_token_matches(a, (const char(*)[65])hs, 2));
    CHECK(srv_token_matches(b, (const char(*)[65])hs, 2));
    CHECK(!srv_token_matches("ty_nope", (const char(*)[65])hs, 2));
    CHECK(!srv_token_matches(a, (const char(*)[65])hs, 0));
    /* A prefix of a valid token is not valid. */
    char pre[40];
    snprintf(pre, sizeof pre, "%.30s", a);
    CHECK(!srv_token_matches(pre, (const char(*)[65])hs, 2));
    /* Which one matched, for its scopes. */
    CHECK(srv_token_find(a, (const char(*)[65])hs, 2) == 0);
    CHECK(srv_token_find(b, (const char(*)[65])hs, 2) == 1);
    CHECK(srv_token_find("ty_nope", (const char(*)[65])hs, 2) == -1);

    unsigned m;
    char out[64];
    CHECK(srv_scopes_parse("read", &m) == 0 && m == SCOPE_READ);
    CHECK(srv_scopes_parse("admin,read,submit", &m) == 0 && m == SCOPE_ALL);
    srv_scopes_format(m, out);
    CHECK(!strcmp(out, "read,submit,admin"));
    srv_scopes_format(0, out);
    CHECK(!strcmp(out, "none"));
    const char *bad[] = {"", "write", "read,", ",read", "read,,admin", "READ", "read submit"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(srv_scopes_parse(bad[i], &m) != 0);
    CHECK(!strcmp(srv_scope_name(SCOPE_SUBMIT), "submit"));
}

/* Error bodies quote client input: always valid JSON, invalid UTF-8 as '?'. */
static void test_error_json(void)
{
    char o[16];
    srv_utf8_sanitize("a\xff\xc3\xa9\xed\xa0\x80z", o, sizeof o);
    CHECK(!strcmp(o, "a?\xc3\xa9???z"));
    srv_utf8_sanitize("abc\xe2\x82\xac", o, 6); /* the euro sign does not fit whole */
    CHECK(!strcmp(o, "abc"));
    char *j = srv_error_json("not_found", "\xc3", "no such endpoint: GET /\xff\x11");
    CHECK(j);
    json_t *v = json_loads(j, 0, NULL);
    CHECK(v && !strcmp(json_string_value(json_object_get(json_object_get(v, "error"), "message")),
                       "no such endpoint: GET /?\x11"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(v, "error"), "field")), "?"));
    json_decref(v);
    free(j);
}

static void test_prom(void)
{
    srv_gpu_sample g[2] = {
        {.index = 0,
         .name = "NVIDIA H100 \"80GB\"",
         .mem_total = 85899345920LL,
         .mem_used = 1048576,
         .util = 37,
         .temp = 54},
        {.index = 1, .name = "GPU 1", .util = 0},
    };
    srv_prom p = {.jobs = {3, 0, 2, 0, 1, 10, 1, 0},
                  .queue_length = 3,
                  .events_ingested = 12345,
                  .sse_clients = 7,
                  .http_requests = 99,
                  .ngpus = 2,
                  .gpus = g};
    char *txt = srv_prom_render(&p);
    CHECK(txt);
    /* Every line is a # HELP / # TYPE comment or `name{labels} value`. */
    regex_t sample, help, type;
    CHECK(regcomp(&sample,
                  "^[a-zA-Z_:][a-zA-Z0-9_:]*(\\{[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\.)*\""
                  "(,[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\.)*\")*\\})? -?[0-9]+(\\.[0-9]+)?$",
                  REG_EXTENDED | REG_NOSUB) == 0);
    CHECK(regcomp(&help, "^# HELP [a-zA-Z_:][a-zA-Z0-9_:]* .+$", REG_EXTENDED | REG_NOSUB) == 0);
    CHECK(regcomp(&type, "^# TYPE [a-zA-Z_:][a-zA-Z0-9_:]* (gauge|counter)$",
                  REG_EXTENDED | REG_NOSUB) == 0);
    int samples = 0;
    char *save = NULL, *copy = strdup(txt);
    char typed[64][80];
    int ntyped = 0;
    for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(l, "# HELP", 6))
            CHECK(regexec(&help, l, 0, NULL, 0) == 0);
        else if (!strncmp(l, "# TYPE", 6)) {
            CHECK(regexec(&type, l, 0, NULL, 0) == 0);
            CHECK(ntyped < 64);
            sscanf(l + 7, "%79s", typed[ntyped++]);
        } else {
            if (regexec(&sample, l, 0, NULL, 0) != 0) fprintf(stderr, "bad line: %s\n", l);
            CHECK(regexec(&sample, l, 0, NULL, 0) == 0);
            /* Each sample's metric was declared by a TYPE line before it. */
            char name[80];
            sscanf(l, "%79[^{ ]", name);
            bool declared = false;
            for (int i = 0; i < ntyped; i++)
                declared |= !strcmp(typed[i], name);
            CHECK(declared);
            samples++;
        }
    }
    CHECK(samples == 8 + 1 + 1 + 1 + 1 + 4 * 2);
    CHECK(strstr(txt, "trainyard_jobs{state=\"succeeded\"} 10\n"));
    CHECK(strstr(txt, "trainyard_queue_length 3\n"));
    CHECK(strstr(txt, "trainyard_events_ingested_total 12345\n"));
    CHECK(strstr(txt, "trainyard_sse_clients 7\n"));
    CHECK(strstr(txt, "# TYPE trainyard_events_ingested_total counter\n"));
    CHECK(strstr(
        txt,
        "trainyard_gpu_utilization_percent{gpu=\"0\",name=\"NVIDIA H100 \\\"80GB\\\"\"} 37\n"));
    CHECK(strstr(
        txt,
        "trainyard_gpu_memory_total_bytes{gpu=\"0\",name=\"NVIDIA H100 \\\"80GB\\\"\"} 85899345920\n"));
    regfree(&sample);
    regfree(&help);
    regfree(&type);
    free(copy);
    free(txt);
}

static void test_listen(void)
{
    char host[64];
    int port;
    ty_err err = {0};
    CHECK(srv_listen_parse("127.0.0.1:8080", host, sizeof host, &port, &err) == 0);
    CHECK(!strcmp(host, "127.0.0.1") && port == 8080);
    CHECK(srv_listen_parse("[::1]:0", host, sizeof host, &port, &err) == 0);
    CHECK(!strcmp(host, "::1") && port == 0);
    CHECK(srv_listen_parse("8080", host, sizeof host, &port, &err) != 0);
    CHECK(srv_listen_parse("h:99999", host, sizeof host, &port, &err) != 0);
    CHECK(srv_host_is_loopback("127.0.0.1") && srv_host_is_loopback("127.1.2.3"));
    CHECK(srv_host_is_loopback("::1") && srv_host_is_loopback("localhost"));
    CHECK(!srv_host_is_loopback("0.0.0.0") && !srv_host_is_loopback("10.0.0.1") &&
          !srv_host_is_loopback("::"));
}

static void test_config(void)
{
    srv_config c;
    ty_err err = {0};
    CHECK(srv_config_defaults(&c, &err) == 0);
    CHECK(!strcmp(c.listen, "127.0.0.1:8080") && c.cpu_slots == 1 && c.grace_s == 30);
    char path[] = "/tmp/ty-cfg-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("# comment\n grace = 7\ncpu-slots=3\nlisten = \"127.0.0.1:9000\"\n", f);
    fclose(f);
    char *argv[] = {"serve", "--config", path, "--grace", "9", "--gpus=none", NULL};
    CHECK(srv_config_parse(&c, 6, argv, stdout, &err) == 0);
    CHECK(c.grace_s == 9 && c.cpu_slots == 3 && !strcmp(c.listen, "127.0.0.1:9000"));
    CHECK(!strcmp(c.gpus, "none"));
    /* Default roots: the data directory's inputs/ and stores/ only — never
     * the cwd, $HOME or /tmp. */
    CHECK(!strstr(c.allowed_roots, ":") && strstr(c.allowed_roots, "/trainyard-data/inputs"));
    CHECK(!strstr(c.store_roots, ":") && strstr(c.store_roots, "/trainyard-data/stores"));
    CHECK(c.max_params == 1000000000);
    srv_config c2;
    CHECK(srv_config_defaults(&c2, &err) == 0);
    char *bad[] = {"serve", "--grace", "-1", NULL};
    CHECK(srv_config_parse(&c2, 3, bad, stdout, &err) == TY_EINVAL && !strcmp(err.field, "grace"));
    char *unk[] = {"serve", "--frobnicate", "1", NULL};
    CHECK(srv_config_parse(&c2, 3, unk, stdout, &err) == TY_EINVAL);
    char *rel[] = {"serve", "--allowed-roots", "/a:rel", NULL};
    CHECK(srv_config_parse(&c2, 3, rel, stdout, &err) == TY_EINVAL);
    f = fopen(path, "w");
    fputs("no equals sign\n", f);
    fclose(f);
    CHECK(srv_config_load_file(&c2, path, &err) == TY_EINVAL && strstr(err.msg, ":1:"));
    unlink(path);
}

/* One SSE frame: id line (seq on job streams, global id on /events), event
 * name, one data line holding valid JSON, blank line. */
static void test_sse_frame(void)
{
    db_event ev = {.id = 41,
                   .job_id = 7,
                   .seq = 12,
                   .ts_ms = 1796222660883LL,
                   .type = "metric",
                   .data = "{\"step\":3,\"loss\":2.5}"};
    size_t len;
    char *job = sse_format_event(&ev, 0, &len);
    CHECK(job && strlen(job) == len);
    CHECK(!strncmp(job, "id: 12\nevent: metric\ndata: {", 28));
    CHECK(len > 2 && !strcmp(job + len - 2, "\n\n"));
    CHECK(strchr(job + 28, '\n') == job + len - 2); /* a single data line */
    json_error_t jerr;
    char *data = job + strlen("id: 12\nevent: metric\ndata: ");
    json_t *o = json_loadb(data, strlen(data) - 2, 0, &jerr);
    CHECK(o);
    CHECK(json_integer_value(json_object_get(o, "job_id")) == 7);
    CHECK(json_integer_value(json_object_get(o, "seq")) == 12);
    CHECK(json_integer_value(json_object_get(o, "id")) == 41);
    CHECK(!strcmp(json_string_value(json_object_get(o, "ts")), "2026-12-02T14:44:20.883Z"));
    CHECK(!strcmp(json_string_value(json_object_get(o, "type")), "metric"));
    CHECK(json_real_value(json_object_get(json_object_get(o, "data"), "loss")) == 2.5);
    json_decref(o);
    char *global = sse_format_event(&ev, 1, &len);
    CHECK(global && !strncmp(global, "id: 41\n", 7));
    free(job);
    free(global);
}

int main(void)
{
    test_sse_frame();
    test_cursor();
    test_time();
    test_tokens();
    test_error_json();
    test_prom();
    test_listen();
    test_config();
    printf("util: sse frame, cursor, time, tokens, prometheus, listen, config ok\n");
    return ty_summary("server util");
}
