/* fuzz_request.c — the HTTP request path as `trainyard serve` runs it, on
 * raw bytes from one client connection:
 *
 *   1. the gate's head check (gate_check_head, server/gate_head.c) with the
 *      limits http.c gives it; a refusal must be a JSON-able verdict;
 *   2. a head the gate accepts goes to libmicrohttpd configured with the
 *      server's parsing hooks (gate_unescape flags control bytes,
 *      gate_notify, the 64 KiB connection memory limit); the daemon has no
 *      listening socket and gets one end of a socketpair
 *      (MHD_add_connection), one daemon per input so nothing carries over;
 *   3. on the request, what http.c's check_head does before a handler:
 *      the control-byte flag, routes_match (server/routes.c), the strict
 *      query check routes_check_query; then the parsers handlers apply to
 *      arguments and headers: state lists through db_state_parse, the
 *      cursor (server/util.c), bearer tokens, the JSON Content-Type rule,
 *      and a POST /jobs body through the spec parser.
 *
 * Invariants beyond the sanitizers: the router only matches a route of
 * that method, with {id} > 0 and a safe {name}; a path or query that
 * passed the checks holds no control byte; query parameters that passed
 * are the route's, once each unless a list; cursors round-trip; and every
 * response on the wire is JSON — a head the gate let through that
 * libmicrohttpd then answered itself (with HTML) is a failure. Handlers
 * that need the database and scheduler are tested by tests/server. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include "db.h"
#include "fuzz_util.h"
#include "gate.h"
#include "http.h"
#include "jobspec.h"
#include "routes.h"
#include "server.h"

/* As http.c sets them for the gate (start_http). */
static const gate_limits LIMITS = {
    .max_line = 8192, .max_head = 16384, .max_fields = 100, .max_body = 1 << 20};

static gate *G;
/* sha256("ty_" + 64 x "a"): the one token this "server" knows. */
static char known[1][65];

typedef struct fz_req {
    int route;
    bool refused; /* answered at the head, as check_head would */
    char *body;
    size_t len;
} fz_req;

typedef struct arg_check {
    const route *rt;
    int count[32];
} arg_check;

/* Is key one of the route's parameters (a "name*" one may repeat)? */
static int param_of(const char *params, const char *key, bool *list)
{
    int i = 0;
    for (const char *p = params ? params : ""; *p; i++) {
        size_t n = strcspn(p, ",");
        bool star = n > 0 && p[n - 1] == '*';
        size_t kn = star ? n - 1 : n;
        if (strlen(key) == kn && !strncmp(p, key, kn)) {
            *list = star;
            return i;
        }
        p += n + (p[n] == ',');
    }
    return -1;
}

/* After routes_check_query accepted: what the handlers parse. */
static enum MHD_Result on_arg(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                              const char *value, size_t value_size)
{
    (void)kind;
    arg_check *c = cls;
    FUZZ_ASSERT(!gate_has_ctl(key, key_size) && (!value || !gate_has_ctl(value, value_size)),
                "a query with a control byte passed the checks");
    bool list = false;
    int i = param_of(c->rt->params, key, &list);
    if (i >= 0 && i < 32) {
        FUZZ_ASSERT(value, "parameter '%s' without a value passed", key);
        FUZZ_ASSERT(++c->count[i] == 1 || list, "parameter '%s' repeated and passed", key);
    }
    if (!value) return MHD_YES;
    if (!strcmp(key, "state")) {
        /* As routes.c's collect_states: each comma-separated name. */
        for (const char *p = value;;) {
            size_t n = strcspn(p, ",");
            char name[16];
            if (n < sizeof name) {
                memcpy(name, p, n);
                name[n] = 0;
                int st = db_state_parse(name);
                FUZZ_ASSERT(st < 0 || !strcmp(db_state_name((job_state)st), name),
                            "state '%s' parsed as %d", name, st);
            }
            if (!p[n]) break;
            p += n + 1;
        }
    } else if (!strcmp(key, "cursor")) {
        int64_t id = 0;
        if (srv_cursor_decode(value, &id) == 0) {
            FUZZ_ASSERT(id > 0, "cursor '%s' decoded to %lld", value, (long long)id);
            char again[32];
            int64_t id2 = 0;
            srv_cursor_encode(id, again);
            FUZZ_ASSERT(srv_cursor_decode(again, &id2) == 0 && id2 == id,
                        "cursor %lld does not round-trip", (long long)id);
        }
    } else if (!strcmp(key, "limit") || !strcmp(key, "from")) {
        char *end;
        errno = 0;
        (void)strtoll(value, &end, 10);
    } else if (!strcmp(key, "access_token")) {
        (void)srv_token_matches(value, (const char(*)[65])known, 1);
    }
    return MHD_YES;
}

static enum MHD_Result on_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                 const char *value)
{
    (void)cls;
    (void)kind;
    if (!key || !value) return MHD_YES;
    if (!strcasecmp(key, "Authorization") && !strncasecmp(value, "Bearer ", 7)) {
        bool ok = srv_token_matches(value + 7, (const char(*)[65])known, 1);
        FUZZ_ASSERT(!ok || strlen(value + 7) == 67, "a token of the wrong length matched");
    } else if (!strcasecmp(key, "Last-Event-ID")) {
        char *end;
        errno = 0;
        (void)strtoll(value, &end, 10);
    }
    return MHD_YES;
}

/* The route's pattern, checked against what routes_match filled in. */
static void check_match(const http_req *q, int r, const char *method, const char *url)
{
    FUZZ_ASSERT(r >= -2 && r < routes_count, "routes_match returned %d", r);
    if (r < 0) return;
    const route *rt = &routes_table[r];
    FUZZ_ASSERT(!strcmp(rt->method, method) ||
                    (!strcmp(method, "HEAD") && !strcmp(rt->method, "GET")),
                "%s %s matched %s %s", method, url, rt->method, rt->pattern);
    if (strstr(rt->pattern, "{id}"))
        FUZZ_ASSERT(q->id > 0, "%s matched with id %lld", url, (long long)q->id);
    if (strstr(rt->pattern, "{name}"))
        FUZZ_ASSERT(q->arg[0] && q->arg[0] != '.' && !strchr(q->arg, '/'), "%s matched name '%s'",
                    url, q->arg);
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *json)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(json), (void *)json, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

/* check_head's order: control bytes, route, query, Content-Type. */
static void first_call(fz_req *r, struct MHD_Connection *conn, const char *url, const char *method)
{
    http_req q = {0};
    q.conn = conn;
    q.method = method;
    q.url = url;
    if (gate_take_bad_target(conn)) {
        r->refused = true;
        return;
    }
    FUZZ_ASSERT(!gate_has_ctl(url, strlen(url)), "a path with a control byte was not flagged");
    r->route = routes_match(&q, method, url);
    check_match(&q, r->route, method, url);
    if (r->route < 0) {
        r->refused = true;
        return;
    }
    const route *rt = &routes_table[r->route];
    char field[64], msg[256];
    if (routes_check_query(&q, rt, field, sizeof field, msg, sizeof msg)) {
        FUZZ_ASSERT(msg[0], "a refused query has no message");
        r->refused = true;
        return;
    }
    arg_check c = {.rt = rt};
    MHD_get_connection_values_n(conn, MHD_GET_ARGUMENT_KIND, on_arg, &c);
    MHD_get_connection_values(conn, MHD_HEADER_KIND, on_header, NULL);
    if (rt->json_body) {
        const char *ct =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        size_t n = ct ? strcspn(ct, "; ") : 0;
        if (!ct || n != 16 || strncasecmp(ct, "application/json", 16)) r->refused = true;
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    (void)cls;
    (void)version;
    fz_req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->route = -1;
        *con_cls = r;
        first_call(r, conn, url, method);
        /* An early answer ends the request, as http_error does. */
        return r->refused ? reply(conn, 400,
                                  "{\"error\":{\"code\":\"bad_request\",\"message\":\"refused\"}}")
                          : MHD_YES;
    }
    if (*upload_size) {
        if (!r->refused && r->len + *upload_size <= LIMITS.max_body) {
            char *g = realloc(r->body, r->len + *upload_size + 1);
            if (!g) return MHD_NO;
            r->body = g;
            memcpy(r->body + r->len, upload_data, *upload_size);
            r->len += *upload_size;
            r->body[r->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->refused) return MHD_YES;
    if (routes_table[r->route].json_body && r->body) {
        jobspec s;
        ty_err err = {0};
        if (jobspec_parse_text(r->body, r->len, &s, &err) == 0) jobspec_free(&s);
    }
    return reply(conn, 200, "{\"ok\":true}");
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    fz_req *r = *con_cls;
    if (!r) return;
    free(r->body);
    free(r);
    *con_cls = NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char tok[68] = "ty_";
    memset(tok + 3, 'a', 64);
    tok[67] = 0;
    srv_token_hash(tok, known[0]);
    gate_config gc = {
        .lim = LIMITS, .per_ip = 0, .head_timeout_ms = 1000, .max_pending = 16, .inspect = true};
    ty_err err = {0};
    G = gate_new(&gc, &err);
    FUZZ_ASSERT(G, "gate_new: %s", err.msg);
    return 0;
}

/* Everything the daemon wrote: each response's head must say JSON. */
static void check_responses(const char *out, size_t n)
{
    for (const char *p = out; p && p < out + n;) {
        const char *line = memmem(p, (size_t)(out + n - p), "HTTP/1.", 7);
        if (!line) break;
        const char *end = memmem(line, (size_t)(out + n - line), "\r\n\r\n", 4);
        size_t hn = end ? (size_t)(end - line) : (size_t)(out + n - line);
        FUZZ_ASSERT(memmem(line, hn, "application/json", 16), "a response that is not JSON: %.*s",
                    (int)hn, line);
        p = line + hn;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gate_verdict v;
    memset(&v, 0, sizeof v);
    int g = gate_check_head((const char *)data, size, &LIMITS, &v);
    if (g == GATE_REJECT) {
        FUZZ_ASSERT(v.status >= 400 && v.status < 600 && v.code && v.code[0] && v.msg[0],
                    "a refusal without status/code/message (%u)", v.status);
        return 0;
    }
    /* Incomplete: the server waits for more, then times out (408). */
    if (g != GATE_OK) return 0;

    int sv[2];
    FUZZ_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s",
                strerror(errno));
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_NO_LISTEN_SOCKET, 0, NULL, NULL, on_request, NULL, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, NULL, MHD_OPTION_NOTIFY_CONNECTION, gate_notify, G,
        MHD_OPTION_UNESCAPE_CALLBACK, gate_unescape, NULL, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)64 * 1024, MHD_OPTION_END);
    FUZZ_ASSERT(d, "MHD_start_daemon failed");
    struct sockaddr_in peer = {
        .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = htons(40000)};
    FUZZ_ASSERT(MHD_add_connection(d, sv[1], (struct sockaddr *)&peer, sizeof peer) == MHD_YES,
                "MHD_add_connection failed");
    /* The kernel buffers the whole input (max_len is under the socket's
     * buffer); EOF after it ends the client's side. */
    size_t off = 0;
    while (off < size) {
        ssize_t w = send(sv[0], data + off, size - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w <= 0) break;
        off += (size_t)w;
    }
    shutdown(sv[0], SHUT_WR);
    /* Run the daemon until it closes its end (read gives 0), keeping what
     * it answers; bounded, so a daemon waiting for more input cannot hang
     * the run (its connection dies with the daemon). */
    static char out[1 << 16];
    size_t got = 0;
    for (int round = 0; round < 4000; round++) {
        MHD_run(d);
        ssize_t k = recv(sv[0], out + got, sizeof out - 1 - got, MSG_DONTWAIT);
        if (k == 0) break;
        if (k > 0)
            got += (size_t)k;
        else if (errno != EAGAIN && errno != EWOULDBLOCK)
            break;
        if (got >= sizeof out - 1) break;
    }
    MHD_stop_daemon(d);
    close(sv[0]);
    check_responses(out, got);
    return 0;
}
