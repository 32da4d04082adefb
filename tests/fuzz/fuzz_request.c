/* fuzz_request.c — the HTTP request path: raw bytes from a client through
 * libmicrohttpd's request-line, header, query and body parsing, then the
 * server's own routing (routes_match in server/routes.c) and the parsers
 * its handlers apply to query values and headers (state lists through
 * db_state_parse, the opaque cursor of server/util.c, limit / from /
 * Last-Event-ID integers, bearer tokens through srv_token_matches, the JSON
 * Content-Type rule, and a POST /jobs body through the spec parser).
 *
 * Each input is one client connection: a daemon with no listening socket
 * gets one end of a socketpair (MHD_add_connection), the input is written to
 * the other end, which is then half-closed, and the daemon is run until it
 * closes the connection. The daemon is made per input so no state carries
 * over. The handlers themselves (database, scheduler) are not reached; the
 * invariants checked are the router's: a match names a route of that
 * method, with a positive {id} or a safe {name}, and a cursor decodes to
 * what it encodes. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include "db.h"
#include "fuzz_util.h"
#include "http.h"
#include "jobspec.h"
#include "server.h"

#define MAX_BODY 65536

/* sha256("ty_" + 64 x "a"): the one token this "server" knows. */
static char known[1][65];

typedef struct fz_req {
    int route;
    char *body;
    size_t len;
} fz_req;

static enum MHD_Result on_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)cls;
    (void)kind;
    if (!key) return MHD_YES;
    if (!strcmp(key, "state") && value) {
        /* GET /jobs?state=a,b: the list is cut at 255 bytes as routes.c does. */
        char buf[256];
        snprintf(buf, sizeof buf, "%s", value);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            int st = db_state_parse(t);
            FUZZ_ASSERT(st < 0 || !strcmp(db_state_name((job_state)st), t), "state '%s' parsed as %d", t, st);
        }
    } else if (!strcmp(key, "cursor") && value && *value) {
        int64_t id = 0;
        if (srv_cursor_decode(value, &id) == 0) {
            FUZZ_ASSERT(id > 0, "cursor '%s' decoded to %lld", value, (long long)id);
            char again[32];
            int64_t id2 = 0;
            srv_cursor_encode(id, again);
            FUZZ_ASSERT(srv_cursor_decode(again, &id2) == 0 && id2 == id, "cursor %lld does not round-trip",
                        (long long)id);
        }
    } else if ((!strcmp(key, "limit") || !strcmp(key, "from")) && value) {
        char *end;
        errno = 0;
        (void)strtoll(value, &end, 10);
    } else if (!strcmp(key, "access_token") && value) {
        (void)srv_token_matches(value, (const char(*)[65])known, 1);
    }
    return MHD_YES;
}

static enum MHD_Result on_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)cls;
    (void)kind;
    if (!key || !value) return MHD_YES;
    if (!strcasecmp(key, "Authorization") && !strncasecmp(value, "Bearer ", 7)) {
        bool ok = srv_token_matches(value + 7, (const char(*)[65])known, 1);
        FUZZ_ASSERT(!ok || strlen(value + 7) == 67, "a token of the wrong length matched");
    } else if (!strcasecmp(key, "Last-Event-ID") || !strcasecmp(key, "Content-Length")) {
        char *end;
        errno = 0;
        (void)strtoull(value, &end, 10);
    }
    return MHD_YES;
}

/* The route's pattern, checked against what routes_match filled in. */
static void check_match(const http_req *q, int r, const char *method, const char *url)
{
    FUZZ_ASSERT(r >= -2 && r < routes_count, "routes_match returned %d", r);
    if (r < 0) return;
    const route *rt = &routes_table[r];
    FUZZ_ASSERT(!strcmp(rt->method, method) || (!strcmp(method, "HEAD") && !strcmp(rt->method, "GET")),
                "%s %s matched %s %s", method, url, rt->method, rt->pattern);
    if (strstr(rt->pattern, "{id}")) FUZZ_ASSERT(q->id > 0, "%s matched with id %lld", url, (long long)q->id);
    if (strstr(rt->pattern, "{name}"))
        FUZZ_ASSERT(q->arg[0] && q->arg[0] != '.' && !strchr(q->arg, '/'), "%s matched name '%s'", url, q->arg);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size,
                                  void **con_cls)
{
    (void)cls;
    (void)version;
    fz_req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        *con_cls = r;
        http_req q = {0};
        q.conn = conn;
        q.method = method;
        q.url = url;
        r->route = routes_match(&q, method, url);
        check_match(&q, r->route, method, url);
        MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, on_arg, NULL);
        MHD_get_connection_values(conn, MHD_HEADER_KIND, on_header, NULL);
        if (r->route >= 0 && routes_table[r->route].json_body) {
            const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
            size_t n = ct ? strcspn(ct, "; ") : 0;
            if (!ct || n != 16 || strncasecmp(ct, "application/json", 16)) r->route = -3;
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (r->len + *upload_size <= MAX_BODY) {
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
    if (r->route >= 0 && routes_table[r->route].json_body && r->body) {
        jobspec s;
        ty_err err = {0};
        if (jobspec_parse_text(r->body, r->len, &s, &err) == 0) jobspec_free(&s);
    }
    char msg[64];
    int n = snprintf(msg, sizeof msg, "{\"route\":%d}", r->route);
    struct MHD_Response *resp = MHD_create_response_from_buffer((size_t)n, msg, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    enum MHD_Result ok = MHD_queue_response(conn, r->route >= 0 ? 200 : 404, resp);
    MHD_destroy_response(resp);
    return ok;
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
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int sv[2];
    FUZZ_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s", strerror(errno));
    struct MHD_Daemon *d =
        MHD_start_daemon(MHD_USE_NO_LISTEN_SOCKET, 0, NULL, NULL, on_request, NULL, MHD_OPTION_NOTIFY_COMPLETED,
                         on_completed, NULL, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)65536, MHD_OPTION_END);
    FUZZ_ASSERT(d, "MHD_start_daemon failed");
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = htons(40000)};
    FUZZ_ASSERT(MHD_add_connection(d, sv[1], (struct sockaddr *)&peer, sizeof peer) == MHD_YES,
                "MHD_add_connection failed");
    /* The kernel buffers the whole input (max_len is well under the
     * socket's buffer); EOF after it ends the client's side. */
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    size_t off = 0;
    while (off < size) {
        ssize_t w = send(sv[0], data + off, size - off, MSG_NOSIGNAL);
        if (w <= 0) break;
        off += (size_t)w;
    }
    shutdown(sv[0], SHUT_WR);
    /* Run the daemon until it closes its end (read gives 0), draining
     * what it answers; bounded so a daemon that waits for more input does
     * not hang the run (its connection dies with the daemon). */
    char buf[4096];
    for (int round = 0; round < 2000; round++) {
        MHD_run(d);
        ssize_t k = recv(sv[0], buf, sizeof buf, MSG_DONTWAIT);
        if (k == 0) break;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) break;
        if (k < 0) {
            struct pollfd p = {.fd = sv[0], .events = POLLIN};
            poll(&p, 1, 0);
        }
    }
    MHD_stop_daemon(d);
    close(sv[0]);
    return 0;
}
