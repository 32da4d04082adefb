/* cli.c — the trainyard command-line client (see cli.h, docs/cli.md).
 *
 * Each subcommand is one or two REST calls made with libcurl; `watch` and
 * `logs -f` follow streams. Answers are printed for people on stdout
 * (`--json` prints the server's JSON untouched for scripts), errors on
 * stderr, and the HTTP status is mapped to a stable exit code. */
#include "cli.h"
#include "cli_fmt.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tyutil.h"
#include "tyjson.h"

#define CLI_DEFAULT_URL "http://127.0.0.1:8080"
#define CLI_MAX_SPEC (16u << 20)

/* Where the server is and how to authenticate; read once from the environment. */
typedef struct cli_ctx {
    char base[1024];    /* TY_URL without a trailing slash */
    char auth[1100];    /* "Authorization: Bearer ..." or "" */
    const char *cacert; /* TY_CACERT, for a self-signed --tls-cert */
    int json;           /* --json: print raw JSON */
} cli_ctx;

/* A growable response body. */
typedef struct buf {
    char *data;
    size_t len, cap;
} buf;

static int buf_append(buf *b, const char *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    return buf_append(ud, p, size * n) == 0 ? size * n : 0;
}

/* Maps a transport failure to an exit code, naming the cause. */
static int curl_failure(const cli_ctx *c, CURLcode rc, const char *errbuf)
{
    ty_logf("cannot reach %s: %s", c->base, errbuf[0] ? errbuf : curl_easy_strerror(rc));
    return CLI_EXIT_CONNECT;
}

/* Prints the server's JSON error ({"error":{"code","message","field"}})
 * and maps the status to an exit code. */
static int http_failure(long status, const buf *body)
{
    json_t *j = body->data ? json_loads(body->data, 0, NULL) : NULL;
    json_t *e = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    const char *field = json_string_value(json_object_get(e, "field"));
    const char *code = json_string_value(json_object_get(e, "code"));
    if (msg)
        ty_logf("%s%s%s%s (HTTP %ld%s%s)", msg, field && *field ? " [" : "",
                field && *field ? field : "", field && *field ? "]" : "", status, code ? ", " : "",
                code ? code : "");
    else
        ty_logf("server answered HTTP %ld", status);
    json_decref(j);
    switch (status) {
    case 400:
    case 413:
    case 415:
    case 429:
        return CLI_EXIT_REJECTED;
    case 401:
    case 403:
        return CLI_EXIT_AUTH;
    case 404:
        return CLI_EXIT_NOT_FOUND;
    case 409:
        return CLI_EXIT_CONFLICT;
    default:
        return CLI_EXIT_FAILED;
    }
}

static CURL *cli_easy(const cli_ctx *c, const char *path, struct curl_slist **hdrs, char *errbuf)
{
    CURL *h = curl_easy_init();
    if (!h) return NULL;
    char url[2048];
    snprintf(url, sizeof url, "%s%s", c->base, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (c->cacert) curl_easy_setopt(h, CURLOPT_CAINFO, c->cacert);
    if (c->auth[0]) *hdrs = curl_slist_append(*hdrs, c->auth);
    errbuf[0] = '\0';
    return h;
}

/* One request. On a transport failure returns CLI_EXIT_CONNECT; otherwise 0
 * with *status and *out filled (the caller frees out->data). */
static int http_call(const cli_ctx *c, const char *method, const char *path, const char *body,
                     size_t blen, const char *extra_header, long *status, buf *out)
{
    char errbuf[CURL_ERROR_SIZE];
    struct curl_slist *hdrs = NULL;
    CURL *h = cli_easy(c, path, &hdrs, errbuf);
    if (!h) {
        ty_logf("libcurl initialisation failed");
        return CLI_EXIT_FAILED;
    }
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    /* A generation waits in the server's queue and may run up to its 600 s
     * time limit; everything else answers at once. */
    size_t pl = strlen(path);
    int gen = pl > 9 && !strcmp(path + pl - 9, "/generate");
    curl_easy_setopt(h, CURLOPT_TIMEOUT, gen ? 900L : 60L);
    if (body) {
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)blen);
    } else if (strcmp(method, "POST") == 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
    }
    if (extra_header) hdrs = curl_slist_append(hdrs, extra_header);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    CURLcode rc = curl_easy_perform(h);
    int ret = 0;
    if (rc != CURLE_OK)
        ret = curl_failure(c, rc, errbuf);
    else
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    return ret;
}

/* GET/POST expecting a JSON object with a 2xx status; *out is the parsed answer. */
static int call_json(const cli_ctx *c, const char *method, const char *path, const char *body,
                     size_t blen, const char *extra_header, json_t **out)
{
    long status = 0;
    buf b = {0};
    int rc = http_call(c, method, path, body, blen, extra_header, &status, &b);
    *out = NULL;
    if (rc == 0 && (status < 200 || status > 299)) rc = http_failure(status, &b);
    if (rc == 0) {
        json_error_t je;
        *out = b.data ? json_loads(b.data, 0, &je) : NULL;
        if (!*out) {
            ty_logf("server sent a non-JSON answer (HTTP %ld)", status);
            rc = CLI_EXIT_FAILED;
        }
    }
    free(b.data);
    return rc;
}

int cli_call_json(const cli_ctx *c, const char *method, const char *path, const char *body,
                  json_t **out)
{
    return call_json(c, method, path, body, body ? strlen(body) : 0, NULL, out);
}

int cli_call_text(const cli_ctx *c, const char *path, char **out)
{
    long status = 0;
    buf b = {0};
    int rc = http_call(c, "GET", path, NULL, 0, NULL, &status, &b);
    if (rc == 0 && (status < 200 || status > 299)) rc = http_failure(status, &b);
    *out = rc ? NULL : b.data ? b.data : strdup("");
    if (rc) free(b.data);
    return rc;
}

int cli_wants_json(const cli_ctx *c)
{
    return c->json;
}

/* A job id on the command line: a positive integer, nothing else. */
static int parse_id(const char *s, long long *id)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v <= 0) {
        ty_logf("'%s' is not a job id (a positive integer)", s);
        return CLI_EXIT_USAGE;
    }
    *id = v;
    return 0;
}

static const char *str_or(const char *s, const char *dflt)
{
    return s ? s : dflt;
}

static void print_json(json_t *j)
{
    char *s = ty_json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s) puts(s);
    free(s);
}

void cli_print_json(json_t *j)
{
    print_json(j);
}

/* ---- submit ---- */

static int read_spec(const char *file, buf *out)
{
    FILE *f = strcmp(file, "-") == 0 ? stdin : fopen(file, "rb");
    if (!f) {
        ty_logf("cannot open %s: %s", file, strerror(errno));
        return CLI_EXIT_USAGE;
    }
    char chunk[65536];
    size_t n;
    int rc = 0;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (out->len + n > CLI_MAX_SPEC || buf_append(out, chunk, n)) {
            ty_logf("%s: larger than %u bytes", file, CLI_MAX_SPEC);
            rc = CLI_EXIT_USAGE;
            break;
        }
    }
    if (rc == 0 && ferror(f)) {
        ty_logf("cannot read %s: %s", file, strerror(errno));
        rc = CLI_EXIT_USAGE;
    }
    if (f != stdin) fclose(f);
    if (rc == 0 && out->len == 0) {
        ty_logf("%s is empty", file);
        rc = CLI_EXIT_USAGE;
    }
    return rc;
}

static int cmd_submit(cli_ctx *c, int argc, char **argv)
{
    const char *file = NULL, *key = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--idempotency-key") == 0 && i + 1 < argc)
            key = argv[++i];
        else if (!file)
            file = argv[i];
        else {
            ty_logf("submit: unexpected argument '%s'", argv[i]);
            return CLI_EXIT_USAGE;
        }
    }
    if (!file) {
        ty_logf("usage: trainyard submit FILE|- [--idempotency-key KEY] [--json]");
        return CLI_EXIT_USAGE;
    }
    buf spec = {0};
    int rc = read_spec(file, &spec);
    if (rc) {
        free(spec.data);
        return rc;
    }
    char hdr[600];
    if (key) snprintf(hdr, sizeof hdr, "Idempotency-Key: %s", key);
    json_t *job;
    rc = call_json(c, "POST", "/jobs", spec.data, spec.len, key ? hdr : NULL, &job);
    free(spec.data);
    if (rc) return rc;
    if (c->json) {
        print_json(job);
    } else {
        /* The id alone on stdout, so `id=$(trainyard submit spec.json)` works. */
        printf("%lld\n", (long long)json_integer_value(json_object_get(job, "id")));
        json_t *pos = json_object_get(job, "queue_position");
        fprintf(stderr, "job %lld %s", (long long)json_integer_value(json_object_get(job, "id")),
                str_or(json_string_value(json_object_get(job, "state")), "?"));
        if (json_is_integer(pos))
            fprintf(stderr, " (queue position %lld)", (long long)json_integer_value(pos));
        fputc('\n', stderr);
    }
    json_decref(job);
    return 0;
}

/* ---- jobs, show ---- */

static int cmd_jobs(cli_ctx *c, int argc, char **argv)
{
    char query[512] = "";
    int limit = 0;
    for (int i = 0; i < argc; i++) {
        size_t l = strlen(query);
        if (strcmp(argv[i], "--state") == 0 && i + 1 < argc) {
            char *esc = curl_easy_escape(NULL, argv[++i], 0);
            snprintf(query + l, sizeof query - l, "%cstate=%s", l ? '&' : '?', esc ? esc : "");
            curl_free(esc);
        } else if (strcmp(argv[i], "--tag") == 0 && i + 1 < argc) {
            char *esc = curl_easy_escape(NULL, argv[++i], 0);
            snprintf(query + l, sizeof query - l, "%ctag=%s", l ? '&' : '?', esc ? esc : "");
            curl_free(esc);
        } else if (strcmp(argv[i], "--limit") == 0 && i + 1 < argc) {
            limit = atoi(argv[++i]);
            if (limit < 1 || limit > 200) {
                ty_logf("jobs: --limit must be in 1..200");
                return CLI_EXIT_USAGE;
            }
            snprintf(query + l, sizeof query - l, "%climit=%d", l ? '&' : '?', limit);
        } else {
            ty_logf("usage: trainyard jobs [--state S] [--tag T] [--limit N] [--json]");
            return CLI_EXIT_USAGE;
        }
    }
    char path[1024];
    snprintf(path, sizeof path, "/jobs%s", query);
    json_t *page;
    int rc = call_json(c, "GET", path, NULL, 0, NULL, &page);
    if (rc) return rc;
    json_t *jobs = json_object_get(page, "jobs");
    if (!json_is_array(jobs)) {
        ty_logf("server answer has no \"jobs\" list");
        json_decref(page);
        return CLI_EXIT_FAILED;
    }
    if (c->json) {
        print_json(page);
    } else {
        clifmt_jobs_header(stdout);
        size_t i;
        json_t *j;
        json_array_foreach(jobs, i, j) clifmt_jobs_row(stdout, j);
        /* A user who chose --limit asked for that many: no hint to use it. */
        if (json_is_string(json_object_get(page, "next_cursor"))) {
            if (!limit)
                fputs("(more jobs: use --limit N, up to 200)\n", stderr);
            else
                fprintf(stderr, "(the newest %d shown; there are older ones)\n", limit);
        }
    }
    json_decref(page);
    return 0;
}

static int cmd_show(cli_ctx *c, long long id)
{
    char path[64];
    snprintf(path, sizeof path, "/jobs/%lld", id);
    json_t *job;
    int rc = call_json(c, "GET", path, NULL, 0, NULL, &job);
    if (rc) return rc;
    print_json(job);
    json_decref(job);
    return 0;
}

static int cmd_action(cli_ctx *c, const char *action, long long id)
{
    char path[96];
    snprintf(path, sizeof path, "/jobs/%lld/%s", id, action);
    json_t *job;
    int rc = call_json(c, "POST", path, NULL, 0, NULL, &job);
    if (rc) return rc;
    if (c->json)
        print_json(job);
    else
        printf("job %lld: %s\n", id, str_or(json_string_value(json_object_get(job, "state")), "?"));
    json_decref(job);
    return 0;
}

/* generate's sampling flags: the request field each sets, and whether it
 * takes an integer; NULL for any other argument. */
static const char *generate_option(const char *flag, int *integer)
{
    static const struct {
        const char *flag, *key;
        int integer;
    } opts[] = {{"--max-tokens", "max_tokens", 1},
                {"--seed", "seed", 1},
                {"--temperature", "temperature", 0},
                {"--top-p", "top_p", 0}};
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++)
        if (!strcmp(flag, opts[i].flag)) {
            *integer = opts[i].integer;
            return opts[i].key;
        }
    return NULL;
}

/* generate ID PROMPT [--max-tokens N] [--temperature T] [--top-p P] [--seed S]
 * [--stop S]... [--base] [--compare]: POST /jobs/{id}/generate. --compare
 * asks twice, the base model and then the newest checkpoint, and prints
 * both texts. */
static int cmd_generate(cli_ctx *c, int argc, char **argv)
{
    long long id = 0;
    const char *prompt = NULL;
    int base = 0, compare = 0, rc;
    json_t *req = json_object(), *stop = json_array();
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL, *key;
        char *end;
        int integer;
        if (!strcmp(a, "--base"))
            base = 1;
        else if (!strcmp(a, "--compare"))
            compare = 1;
        else if (v && !strcmp(a, "--stop"))
            json_array_append_new(stop, json_string(argv[++i]));
        else if (v && (key = generate_option(a, &integer))) {
            long long n = integer ? strtoll(v, &end, 10) : 0;
            double d = integer ? 0 : strtod(v, &end);
            if (*end || end == v) {
                ty_logf("generate: %s needs %s", a, integer ? "an integer" : "a number");
                json_decref(req);
                json_decref(stop);
                return CLI_EXIT_USAGE;
            }
            json_object_set_new(req, key, integer ? json_integer(n) : json_real(d));
            i++;
        } else if (!id && parse_id(a, &id) == 0) {
        } else if (!prompt && id)
            prompt = a;
        else {
            id = 0; /* an argument too many: the usage below */
            break;
        }
    }
    if (!id || !prompt) {
        ty_logf(
            "usage: trainyard generate ID PROMPT [--max-tokens N] [--temperature T] [--top-p P] "
            "[--seed S] [--stop STR]... [--base | --compare]");
        json_decref(req);
        json_decref(stop);
        return CLI_EXIT_USAGE;
    }
    json_object_set_new(req, "prompt", json_string(prompt));
    if (json_array_size(stop)) json_object_set(req, "stop", stop);
    json_decref(stop);
    char path[96];
    snprintf(path, sizeof path, "/jobs/%lld/generate", id);
    rc = 0;
    for (int pass = compare ? 0 : 1; pass < 2 && !rc; pass++) {
        json_object_set_new(req, "base", json_boolean(compare ? pass == 0 : base));
        char *body = ty_json_dumps(req, JSON_COMPACT);
        json_t *res = NULL;
        rc = body ? call_json(c, "POST", path, body, strlen(body), NULL, &res) : CLI_EXIT_FAILED;
        free(body);
        if (rc) break;
        if (c->json) {
            print_json(res);
        } else {
            const char *text = json_string_value(json_object_get(res, "text"));
            if (compare) printf("== %s\n", pass == 0 ? "base model" : "fine-tuned");
            printf("%s%s\n", prompt, str_or(text, ""));
            fprintf(stderr, "(%lld tokens, %s, %.1f tokens/s%s%s)\n",
                    (long long)json_integer_value(json_object_get(res, "completion_tokens")),
                    str_or(json_string_value(json_object_get(res, "finish_reason")), "?"),
                    json_number_value(json_object_get(res, "tokens_per_s")),
                    json_is_string(json_object_get(res, "checkpoint")) ? ", " : "",
                    str_or(json_string_value(json_object_get(res, "checkpoint")), ""));
        }
        json_decref(res);
    }
    json_decref(req);
    return rc;
}

static int cmd_delete(cli_ctx *c, long long id, int purge)
{
    char path[96];
    snprintf(path, sizeof path, "/jobs/%lld%s", id, purge ? "?purge=1" : "");
    long status = 0;
    buf b = {0};
    int rc = http_call(c, "DELETE", path, NULL, 0, NULL, &status, &b);
    if (rc == 0 && (status < 200 || status > 299)) rc = http_failure(status, &b);
    if (rc == 0) printf("job %lld: deleted\n", id);
    free(b.data);
    return rc;
}

/* ---- streams: watch (SSE) and logs -f ---- */

/* State of one SSE connection: the line being assembled, the event being
 * built, and what watch has learnt so far. */
typedef struct sse_state {
    buf line;
    char event[64];
    buf data;
    long long last_id;    /* for Last-Event-ID on reconnect */
    const char *terminal; /* "succeeded" | "failed" | "cancelled" once seen */
    int json;
    clifmt_watch view; /* what the human-readable lines remember */
    long status;       /* HTTP status of the current connection */
    buf errbody;       /* body of a non-2xx answer */
} sse_state;

static int is_terminal(const char *s)
{
    return s &&
           (strcmp(s, "succeeded") == 0 || strcmp(s, "failed") == 0 || strcmp(s, "cancelled") == 0);
}

/* One complete SSE event: {"job_id","seq","ts","type","data"} in data. */
static void sse_dispatch(sse_state *st)
{
    if (st->data.len == 0) return;
    json_t *ev = json_loads(st->data.data, 0, NULL);
    if (ev) {
        const char *type = json_string_value(json_object_get(ev, "type"));
        if (!type) type = st->event;
        json_t *d = json_object_get(ev, "data");
        if (st->json) {
            char *s = ty_json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);
            if (s) puts(s);
            free(s);
        } else {
            clifmt_watch_event(&st->view, stdout, type, d,
                               json_string_value(json_object_get(ev, "ts")));
        }
        if (strcmp(type, "state") == 0) {
            const char *to = json_string_value(json_object_get(d, "to"));
            if (is_terminal(to))
                st->terminal = strcmp(to, "succeeded") == 0 ? "succeeded"
                               : strcmp(to, "failed") == 0  ? "failed"
                                                            : "cancelled";
        }
        json_decref(ev);
    }
    fflush(stdout);
    st->data.len = 0;
    if (st->data.data) st->data.data[0] = '\0';
}

static void sse_line(sse_state *st, char *line, size_t n)
{
    if (n && line[n - 1] == '\r') line[--n] = '\0';
    if (n == 0) { /* blank line: the event is complete */
        sse_dispatch(st);
        st->event[0] = '\0';
        return;
    }
    if (line[0] == ':') return; /* comment: the heartbeat */
    char *colon = strchr(line, ':');
    char *val = colon ? colon + 1 : line + n;
    if (colon) *colon = '\0';
    if (*val == ' ') val++;
    if (strcmp(line, "id") == 0) {
        st->last_id = strtoll(val, NULL, 10);
    } else if (strcmp(line, "event") == 0) {
        snprintf(st->event, sizeof st->event, "%s", val);
    } else if (strcmp(line, "data") == 0) {
        if (st->data.len) buf_append(&st->data, "\n", 1);
        buf_append(&st->data, val, strlen(val));
    }
}

static size_t on_sse(char *p, size_t size, size_t n, void *ud)
{
    sse_state *st = ud;
    size_t total = size * n;
    for (size_t i = 0; i < total; i++) {
        if (p[i] == '\n') {
            if (!st->line.data) buf_append(&st->line, "", 0);
            sse_line(st, st->line.data, st->line.len);
            st->line.len = 0;
            if (st->terminal) return 0; /* done: stop reading, the stream ends here */
        } else if (buf_append(&st->line, p + i, 1)) {
            return 0;
        }
    }
    return total;
}

/* Body of a non-2xx answer goes aside so its JSON error can be shown. */
static size_t on_sse_checked(char *p, size_t size, size_t n, void *ud)
{
    sse_state *st = ud;
    if (st->status >= 300 || st->status < 200) {
        buf_append(&st->errbody, p, size * n);
        return size * n;
    }
    return on_sse(p, size, n, ud);
}

/* Header callback of the streaming requests (watch, logs -f): keeps the
 * HTTP status in the long that CURLOPT_HEADERDATA points at, so the body
 * callbacks can tell an error body from the stream before curl is done. */
static size_t on_status_header(char *p, size_t size, size_t n, void *ud)
{
    long *status = ud, code;
    /* The status line starts every header block. */
    if (size * n > 9 && strncmp(p, "HTTP/", 5) == 0) {
        const char *sp = memchr(p, ' ', size * n);
        if (sp && sscanf(sp, " %ld", &code) == 1) *status = code;
    }
    return size * n;
}

/* How many of a job's latest events watch shows before following live
 * (--all: every one). */
#define WATCH_TAIL 20

static int cmd_watch(cli_ctx *c, long long id, int all)
{
    /* First the job itself: 404 early, and a finished job ends at once. */
    char path[128];
    snprintf(path, sizeof path, "/jobs/%lld", id);
    json_t *job;
    int rc = call_json(c, "GET", path, NULL, 0, NULL, &job);
    if (rc) return rc;
    sse_state st = {0};
    st.json = c->json;
    clifmt_watch_init(&st.view, job);
    /* The last WATCH_TAIL events (the job's last_seq says where its stream
     * stands), or all of them; a server without last_seq replays all. */
    long long last_seq = (long long)json_integer_value(json_object_get(job, "last_seq"));
    json_decref(job);
    if (!all && last_seq > WATCH_TAIL) {
        st.last_id = last_seq - WATCH_TAIL;
        fprintf(stderr, "(%lld earlier events not shown; watch %lld --all replays them)\n",
                st.last_id, id);
    }
    int failures = 0;
    /* Replay from the start (from=0) or from the tail, then follow; after
     * a dropped connection resume with Last-Event-ID so nothing is printed
     * twice. */
    while (!st.terminal) {
        char errbuf[CURL_ERROR_SIZE];
        struct curl_slist *hdrs = NULL;
        snprintf(path, sizeof path, "/jobs/%lld/events%s", id, st.last_id ? "" : "?from=0");
        CURL *h = cli_easy(c, path, &hdrs, errbuf);
        if (!h) return CLI_EXIT_FAILED;
        char lei[64];
        if (st.last_id) {
            snprintf(lei, sizeof lei, "Last-Event-ID: %lld", st.last_id);
            hdrs = curl_slist_append(hdrs, lei);
        }
        hdrs = curl_slist_append(hdrs, "Accept: text/event-stream");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_status_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, &st.status);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_sse_checked);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &st);
        /* No overall timeout; a stream silent for 60 s (no heartbeat) is dead. */
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
        st.status = 0;
        st.errbody.len = 0;
        st.line.len = 0;
        st.data.len = 0;
        CURLcode cr = curl_easy_perform(h);
        curl_slist_free_all(hdrs);
        curl_easy_cleanup(h);
        if (st.terminal) break;
        if (st.status >= 300 || (st.status && st.status < 200)) {
            rc = http_failure(st.status, &st.errbody);
            break;
        }
        if (cr == CURLE_COULDNT_CONNECT || cr == CURLE_COULDNT_RESOLVE_HOST) {
            if (++failures > 5) {
                rc = curl_failure(c, cr, errbuf);
                break;
            }
        } else {
            failures = 0; /* the stream ran, then ended or broke: reconnect */
        }
        sleep(1);
    }
    free(st.line.data);
    free(st.data.data);
    free(st.errbody.data);
    if (rc) return rc;
    /* Never end on "succeeded" alone when an upload to the job's store
     * failed for good: say what is missing from the bucket. */
    snprintf(path, sizeof path, "/jobs/%lld", id);
    if (!c->json && call_json(c, "GET", path, NULL, 0, NULL, &job) == 0) {
        const char *ce = json_string_value(json_object_get(job, "checkpoint_error"));
        if (ce) fprintf(stderr, "checkpoint_error: %s\n", ce);
        json_decref(job);
    }
    if (strcmp(st.terminal, "succeeded") == 0) return CLI_EXIT_OK;
    return strcmp(st.terminal, "cancelled") == 0 ? CLI_EXIT_CANCELLED : CLI_EXIT_FAILED;
}

/* logs: the engine's stderr log, raw; with -f the server keeps the
 * connection open and streams new lines. */
typedef struct logs_state {
    long status;
    buf errbody;
} logs_state;

static size_t on_logs(char *p, size_t size, size_t n, void *ud)
{
    logs_state *ls = ud;
    if (ls->status < 200 || ls->status > 299) {
        buf_append(&ls->errbody, p, size * n);
        return size * n;
    }
    size_t w = fwrite(p, 1, size * n, stdout);
    fflush(stdout);
    return w;
}

static int cmd_logs(cli_ctx *c, long long id, int follow)
{
    char path[128], errbuf[CURL_ERROR_SIZE];
    snprintf(path, sizeof path, "/jobs/%lld/logs%s", id, follow ? "?follow=1" : "");
    struct curl_slist *hdrs = NULL;
    CURL *h = cli_easy(c, path, &hdrs, errbuf);
    if (!h) return CLI_EXIT_FAILED;
    logs_state ls = {0};
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_status_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &ls.status);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_logs);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &ls);
    if (!follow) curl_easy_setopt(h, CURLOPT_TIMEOUT, 120L);
    CURLcode cr = curl_easy_perform(h);
    int rc = 0;
    if (ls.status && (ls.status < 200 || ls.status > 299))
        rc = http_failure(ls.status, &ls.errbody);
    else if (cr != CURLE_OK && !(follow && cr == CURLE_PARTIAL_FILE))
        rc = curl_failure(c, cr, errbuf);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    free(ls.errbody.data);
    return rc;
}

/* ---- dispatch ---- */

static const char *const commands[] = {"submit", "jobs",  "show",   "watch",  "logs",
                                       "cancel", "pause", "resume", "delete", "generate",
                                       "queue",  "patch", "usage",  NULL};

int cli_is_command(const char *name)
{
    for (const char *const *c = commands; *c; c++)
        if (strcmp(*c, name) == 0) return 1;
    return 0;
}

void cli_usage(FILE *out)
{
    fputs("Client commands (to the server at $TY_URL, default " CLI_DEFAULT_URL ",\n"
          "with the token in $TY_TOKEN when it needs one):\n"
          "  submit FILE|- [--idempotency-key KEY]   submit a job spec; prints the job id\n"
          "  jobs [--state S] [--tag T] [--limit N]  list jobs, newest first\n"
          "  show ID                                 one job as JSON\n"
          "  watch ID [--all]                        a job's last 20 events, then its progress\n"
          "                                          live until it ends (--all: every event)\n"
          "  logs ID [-f]                            the engine's log; -f follows it\n"
          "  cancel|pause|resume ID                  change a job's state\n"
          "  delete ID [--purge]                     delete a finished job\n"
          "  generate ID PROMPT [--max-tokens N] [--temperature T] [--top-p P] [--seed S]\n"
          "           [--stop STR]... [--base | --compare]\n"
          "                                          text from the job's newest checkpoint\n"
          "                                          (--base: the base model; --compare: both)\n"
          "  --json (with any of them)               print the server's JSON instead\n",
          out);
    cli_ops_usage(out);
    fputs("\n"
          "Exit codes: 0 ok, 1 job or server failure, 2 usage, 3 not found, 4 conflict,\n"
          "5 cannot connect, 6 input rejected, 7 unauthorized, 8 job cancelled (watch).\n",
          out);
}

static int ctx_init(cli_ctx *c)
{
    memset(c, 0, sizeof *c);
    const char *url = getenv("TY_URL");
    if (!url || !*url) url = CLI_DEFAULT_URL;
    if (strlen(url) >= sizeof c->base) {
        ty_logf("TY_URL is too long");
        return CLI_EXIT_USAGE;
    }
    snprintf(c->base, sizeof c->base, "%s", url);
    size_t n = strlen(c->base);
    while (n > 0 && c->base[n - 1] == '/')
        c->base[--n] = '\0';
    const char *tok = getenv("TY_TOKEN");
    if (tok && *tok) {
        if (strlen(tok) > 1000 || strpbrk(tok, "\r\n")) {
            ty_logf("TY_TOKEN is not a valid token");
            return CLI_EXIT_USAGE;
        }
        snprintf(c->auth, sizeof c->auth, "Authorization: Bearer %s", tok);
    }
    const char *ca = getenv("TY_CACERT");
    if (ca && *ca) c->cacert = ca;
    return 0;
}

int cli_main(int argc, char **argv)
{
    if (argc < 2 || !cli_is_command(argv[1])) {
        if (argc >= 2) ty_logf("unknown command '%s'", argv[1]);
        cli_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    cli_ctx c;
    int rc = ctx_init(&c);
    if (rc) return rc;
    const char *cmd = argv[1];

    /* Collect arguments, taking out the flags every command shares. */
    char **args = calloc((size_t)argc, sizeof *args);
    if (!args) return CLI_EXIT_FAILED;
    int nargs = 0, follow = 0, purge = 0, all = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            c.json = 1;
        else if (strcmp(argv[i], "-f") == 0 || strcmp(argv[i], "--follow") == 0)
            follow = 1;
        else if (strcmp(argv[i], "--purge") == 0)
            purge = 1;
        else if (strcmp(argv[i], "--all") == 0 && strcmp(cmd, "watch") == 0)
            all = 1;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            cli_usage(stdout);
            free(args);
            return CLI_EXIT_OK;
        } else
            args[nargs++] = argv[i];
    }
    if ((follow && strcmp(cmd, "logs") != 0) || (purge && strcmp(cmd, "delete") != 0)) {
        ty_logf("%s: unexpected option %s", cmd, follow ? "-f" : "--purge");
        free(args);
        return CLI_EXIT_USAGE;
    }

    curl_global_init(CURL_GLOBAL_DEFAULT);
    if ((rc = cli_ops_main(&c, cmd, nargs, args)) != -1) {
        /* queue, patch, usage (cli_ops.c) */
    } else if (strcmp(cmd, "submit") == 0) {
        rc = cmd_submit(&c, nargs, args);
    } else if (strcmp(cmd, "jobs") == 0) {
        rc = cmd_jobs(&c, nargs, args);
    } else if (strcmp(cmd, "generate") == 0) {
        rc = cmd_generate(&c, nargs, args);
    } else {
        long long id = 0;
        if (nargs != 1) {
            ty_logf("usage: trainyard %s ID", cmd);
            rc = CLI_EXIT_USAGE;
        } else if ((rc = parse_id(args[0], &id)) == 0) {
            if (strcmp(cmd, "show") == 0)
                rc = cmd_show(&c, id);
            else if (strcmp(cmd, "watch") == 0)
                rc = cmd_watch(&c, id, all);
            else if (strcmp(cmd, "logs") == 0)
                rc = cmd_logs(&c, id, follow);
            else if (strcmp(cmd, "delete") == 0)
                rc = cmd_delete(&c, id, purge);
            else
                rc = cmd_action(&c, cmd, id);
        }
    }
    curl_global_cleanup();
    free(args);
    return rc;
}
