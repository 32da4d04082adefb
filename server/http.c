/* http.c — the HTTP side of `trainyard serve` (started by serve.c).
 *
 * libmicrohttpd runs a small pool of epoll threads; streams are suspended
 * connections (sse.c), so no thread is ever tied to one client. In front
 * of it the gate (gate.c) accepts connections, limits them per address and
 * checks each request head, also on kept-alive connections, so
 * libmicrohttpd never answers on its own.
 * This file also holds what requests share: body accumulation with the
 * size and time limits, bearer tokens with their scopes and the per-token
 * rate limit. It dispatches through the route table (routes.h); the
 * answers themselves are http_reply.c's, which the handlers use too. */
#include "http.h"

#include <errno.h>
#include <strings.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "gate.h"
#include "routes.h"
#include "state.h"
#include "tyutil.h"
#include "tyjson.h"

/* ---- auth ------------------------------------------------------------------------------- */

/* The token of this request: its row id and scopes, or false for a missing
 * or unknown token. */
static bool token_of(http_req *q, int64_t *id, unsigned *scopes)
{
    const char *h = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, "Authorization");
    const char *tok = NULL;
    if (h && !strncasecmp(h, "Bearer ", 7)) tok = h + 7;
    /* Browsers cannot set headers on EventSource: the dashboard may pass the
     * token as ?access_token= instead. */
    if (!tok) tok = http_arg(q, "access_token");
    if (!tok || strncmp(tok, "ty_", 3)) return false;
    db *d = srv_db(q->s);
    db_token *rows = NULL;
    int n = 0;
    ty_err err = {0};
    if (!d || db_token_list(d, &rows, &n, &err)) return false;
    char(*hashes)[65] = n ? malloc((size_t)n * sizeof *hashes) : NULL;
    int i = -1;
    if (hashes) {
        for (int k = 0; k < n; k++)
            memcpy(hashes[k], rows[k].sha256, 65);
        i = srv_token_find(tok, (const char(*)[65])hashes, n);
    }
    bool ok = i >= 0 && srv_scopes_parse(rows[i].scopes, scopes) == 0;
    if (ok) *id = rows[i].id;
    free(hashes);
    free(rows);
    return ok;
}

/* Per-token token buckets: `rate_limit` requests a second on average,
 * bursts of `rate_burst`. Few tokens exist, so a small array will do. */
typedef struct bucket {
    int64_t token_id;
    double level;
    int64_t last_ms;
} bucket;

struct ratelim {
    pthread_mutex_t mu;
    bucket *b;
    int n, cap;
};

/* Takes one request from the token's bucket; false with the seconds until
 * the next one is due when it is empty. */
static bool rate_take(srv *s, int64_t token_id, int *retry_s)
{
    if (s->cfg.rate_limit <= 0 || !s->rl) return true;
    struct ratelim *rl = s->rl;
    int64_t now = ty_now_ms();
    bool ok = true;
    pthread_mutex_lock(&rl->mu);
    bucket *b = NULL;
    for (int i = 0; i < rl->n && !b; i++)
        if (rl->b[i].token_id == token_id) b = &rl->b[i];
    if (!b && rl->n == rl->cap) {
        int cap = rl->cap ? rl->cap * 2 : 8;
        bucket *g = realloc(rl->b, (size_t)cap * sizeof *g);
        if (g) {
            rl->b = g;
            rl->cap = cap;
        }
    }
    if (!b && rl->n < rl->cap) {
        b = &rl->b[rl->n++];
        *b = (bucket){token_id, (double)s->cfg.rate_burst, now};
    }
    if (b) {
        b->level += (double)(now - b->last_ms) * s->cfg.rate_limit / 1000.0;
        if (b->level > s->cfg.rate_burst) b->level = s->cfg.rate_burst;
        b->last_ms = now;
        if (b->level >= 1.0) {
            b->level -= 1.0;
        } else {
            ok = false;
            double wait = (1.0 - b->level) / s->cfg.rate_limit;
            *retry_s = (int)wait + ((double)(int)wait < wait ? 1 : 0);
            if (*retry_s < 1) *retry_s = 1;
        }
    }
    pthread_mutex_unlock(&rl->mu);
    return ok;
}

/* ---- request checks ------------------------------------------------------------------------- */

typedef struct header_count {
    const char *name;
    int n;
    const char *value;
} header_count;

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    (void)kind;
    header_count *c = cls;
    if (key && !strcasecmp(key, c->name)) {
        c->n++;
        c->value = value;
    }
    return MHD_YES;
}

/* The first query parameter whose key or value holds a control byte
 * (values are counted, so a decoded NUL is seen too). */
typedef struct ctl_arg {
    char key[64];
    bool found;
} ctl_arg;

static enum MHD_Result find_ctl_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                    size_t key_size, const char *value, size_t value_size)
{
    (void)kind;
    ctl_arg *c = cls;
    if (gate_has_ctl(key, key_size) || (value && gate_has_ctl(value, value_size))) {
        snprintf(c->key, sizeof c->key, "%.*s", (int)strnlen(key, key_size), key);
        c->found = true;
        return MHD_NO;
    }
    return MHD_YES;
}

/* The gate's limits on a head (gate.h); max_body comes from the config. */
static const gate_limits head_limits = {
    .max_line = 8192, .max_head = 16384, .max_fields = 100, .max_params = 100, .max_cookies = 50};

typedef struct head_tally {
    int fields, hosts, te;
    size_t bytes;
    char ctl[64]; /* the first field whose value holds a control byte */
} head_tally;

static enum MHD_Result tally_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                   size_t key_size, const char *value, size_t value_size)
{
    (void)kind;
    head_tally *t = cls;
    t->fields++;
    t->bytes += key_size + value_size + 4;
    if (!strcasecmp(key, "Host"))
        t->hosts++;
    else if (!strcasecmp(key, "Transfer-Encoding"))
        t->te++;
    for (size_t i = 0; value && !t->ctl[0] && i < value_size; i++)
        if (((unsigned char)value[i] < 0x20 && value[i] != '\t') || value[i] == 0x7f)
            snprintf(t->ctl, sizeof t->ctl, "%.*s", (int)(key_size > 60 ? 60 : key_size), key);
    return MHD_YES;
}

/* Content-Length: one, in digits, within --max-body. */
static enum MHD_Result check_unread_length(http_req *q)
{
    header_count cl = {MHD_HTTP_HEADER_CONTENT_LENGTH, 0, NULL};
    MHD_get_connection_values(q->conn, MHD_HEADER_KIND, count_header, &cl);
    if (cl.n > 1)
        return http_error(q, 400, "bad_request", "Content-Length",
                          "more than one Content-Length header");
    if (cl.n == 1) {
        const char *v = cl.value ? cl.value : "";
        if (!*v || v[strspn(v, "0123456789")])
            return http_error(q, 400, "bad_request", "Content-Length",
                              "Content-Length must be a decimal byte count");
        if (strlen(v) > 12 || strtoull(v, NULL, 10) > q->s->cfg.max_body)
            return http_error(q, 413, "too_large", NULL, "request body over the %zu-byte limit",
                              q->s->cfg.max_body);
    }
    return MHD_YES;
}

/* A head the gate did not read (under TLS, or read ahead by the daemon on
 * a pipelining connection) gets the gate's checks here, as far as the
 * daemon's parsed form shows them, with the gate's answers. */
static enum MHD_Result check_unread_head(http_req *q, const char *version)
{
    head_tally t = {0};
    MHD_get_connection_values_n(q->conn, MHD_HEADER_KIND, tally_field, &t);
    int cookies = MHD_get_connection_values(q->conn, MHD_COOKIE_KIND, NULL, NULL);
    int params = MHD_get_connection_values(q->conn, MHD_GET_ARGUMENT_KIND, NULL, NULL);
    const gate_limits *l = &head_limits;
    if (strlen(q->url) + strlen(q->method) + 12 > l->max_line || params > l->max_params)
        return http_error(q, 414, "too_large", NULL,
                          "request line over %zu bytes or more than %d "
                          "query parameters",
                          l->max_line, l->max_params);
    if (t.fields > l->max_fields || t.bytes > l->max_head)
        return http_error(q, 431, "too_large", NULL, "more than %d header fields or %zu bytes",
                          l->max_fields, l->max_head);
    if (cookies > l->max_cookies)
        return http_error(q, 431, "too_large", "Cookie", "more than %d cookies", l->max_cookies);
    if (t.ctl[0])
        return http_error(q, 400, "bad_request", NULL, "header %s holds a control byte", t.ctl);
    if (t.te)
        return http_error(
            q, 411, "length_required", "Transfer-Encoding",
            "send the body with a Content-Length (Transfer-Encoding is not accepted)");
    if (t.hosts > 1 || (!strcmp(version, MHD_HTTP_VERSION_1_1) && t.hosts != 1))
        return http_error(q, 400, "bad_request", "Host",
                          "an HTTP/1.1 request needs exactly one Host");
    return check_unread_length(q);
}

/* The token (401), its scope (403) and rate (429) where tokens are
 * required; elsewhere a submit's token is only noted for usage. */
static enum MHD_Result check_auth(http_req *q, const route *rt)
{
    srv *s = q->s;
    if (s->auth_required && !rt->public_) {
        int64_t tid = 0;
        unsigned scopes = 0;
        if (!token_of(q, &tid, &scopes))
            return http_error(q, 401, "unauthorized", NULL,
                              "a valid bearer token is required (Authorization: Bearer ty_...)");
        if (!(scopes & rt->scope)) {
            char have[64];
            srv_scopes_format(scopes, have);
            return http_error(q, 403, "forbidden", NULL,
                              "this token lacks the '%s' scope that %s %s needs (it has: %s)",
                              srv_scope_name(rt->scope), rt->method, rt->pattern, have);
        }
        q->token_id = tid;
        int retry = 1;
        if (!rate_take(s, tid, &retry)) {
            char ra[16];
            snprintf(ra, sizeof ra, "%d", retry);
            return http_error_with(q, 429, (http_extra_header){MHD_HTTP_HEADER_RETRY_AFTER, ra},
                                   "rate_limited",
                                   "this token is over its rate limit (%d requests/s, bursts of "
                                   "%d); retry after %d s",
                                   s->cfg.rate_limit, s->cfg.rate_burst, retry);
        }
    } else if (!strcmp(rt->method, "POST") && !strcmp(rt->pattern, "/jobs")) {
        /* Not required here, but a submit that names a token is counted
         * against it in usage (GET /usage?group_by=token). */
        int64_t tid = 0;
        unsigned scopes = 0;
        if (token_of(q, &tid, &scopes)) q->token_id = tid;
    }
    return MHD_YES;
}

/* Everything decided from the head alone, in this order: the gate's checks
 * when it did not read the head, the decoded target, the route, the token
 * (401), its scope (403) and rate (429), the query, the body's type. */
static enum MHD_Result check_head(http_req *q, const char *version)
{
    struct MHD_Connection *conn = q->conn;
    if (!gate_request_checked(conn)) {
        enum MHD_Result r = check_unread_head(q, version);
        if (q->answered || r != MHD_YES) return r;
    }
    /* libmicrohttpd's C strings end at a decoded NUL ("/jobs/8%00/x" would
     * route as /jobs/8): the unescaper flagged it. */
    if (gate_take_bad_target(conn)) {
        ctl_arg c = {0};
        MHD_get_connection_values_n(conn, MHD_GET_ARGUMENT_KIND, find_ctl_arg, &c);
        if (c.found)
            return http_error(q, 400, "invalid_spec", c.key,
                              "query parameter '%s' holds a NUL or control character", c.key);
        return http_error(q, 400, "bad_request", NULL,
                          "the request path holds a NUL or control character once decoded");
    }
    q->route = routes_match(q, q->method, q->url);
    if (q->route == -1)
        return http_error(q, 404, "not_found", NULL, "no such endpoint: %s %s", q->method, q->url);
    if (q->route == -2) {
        char allow[128];
        routes_allowed(q->url, allow, sizeof allow);
        return http_error_with(q, 405, (http_extra_header){MHD_HTTP_HEADER_ALLOW, allow},
                               "not_found", "%s is not allowed on %s (allowed: %s)", q->method,
                               q->url, allow);
    }
    const route *rt = &routes_table[q->route];
    enum MHD_Result ar = check_auth(q, rt);
    if (q->answered || ar != MHD_YES) return ar;
    char field[64], msg[256];
    if (routes_check_query(q, rt, field, sizeof field, msg, sizeof msg))
        return http_error(q, 400, "invalid_spec", field, "%s", msg);
    if (rt->json_body) {
        const char *ct =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        size_t n = ct ? strcspn(ct, "; ") : 0;
        if (!ct || n != 16 || strncasecmp(ct, "application/json", 16))
            return http_error(q, 415, "unsupported_media_type", NULL,
                              "Content-Type must be application/json, got '%s'",
                              ct ? ct : "(none)");
    }
    return MHD_YES;
}

/* ---- request handling ---------------------------------------------------------------------- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    srv *s = cls;
    http_req *q = *con_cls;
    /* The gate refused this head on a kept connection and answered it. */
    if (gate_refused(conn)) return MHD_NO;
    if (!q) {
        q = calloc(1, sizeof *q);
        if (!q) return MHD_NO;
        *con_cls = q;
        q->s = s;
        q->conn = conn;
        q->method = method;
        q->url = url;
        q->route = -1;
        q->start_ms = ty_now_ms();
        atomic_fetch_add(&s->http_requests, 1);
        gate_request_begin(conn, version);
        enum MHD_Result r = check_head(q, version ? version : "");
        gate_request_head_done(conn);
        return r;
    }
    if (*upload_size > 0) {
        /* A body slower than --request-timeout ends the connection: the
         * daemon cannot answer in the middle of a body, and a client this
         * slow holds a connection for nothing. */
        if (s->cfg.request_timeout_s > 0 &&
            ty_now_ms() - q->start_ms > (int64_t)s->cfg.request_timeout_s * 1000)
            return MHD_NO;
        /* A response queued early (error) ends the request: discard. */
        if (!q->answered && !q->too_big) {
            if (q->len + *upload_size > s->cfg.max_body) {
                q->too_big = true;
            } else {
                if (q->len + *upload_size + 1 > q->cap) {
                    size_t cap = (q->len + *upload_size + 1) * 2;
                    if (cap > s->cfg.max_body + 1) cap = s->cfg.max_body + 1;
                    char *g = realloc(q->body, cap);
                    if (!g) return MHD_NO;
                    q->body = g;
                    q->cap = cap;
                }
                memcpy(q->body + q->len, upload_data, *upload_size);
                q->len += *upload_size;
                q->body[q->len] = 0;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (q->answered) return MHD_YES;
    if (q->too_big)
        return http_error(q, 413, "too_large", NULL, "request body over the %zu-byte limit",
                          s->cfg.max_body);
    return routes_table[q->route].fn(q);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    http_req *q = *con_cls;
    /* A kept connection goes back to the gate for its next head. */
    gate_request_done(conn, toe);
    if (!q) return;
    /* A request that ends with its route state still held (a generate
     * request whose client left): the route frees it. */
    if (q->route_state && q->route_state_free) q->route_state_free(q->route_state);
    free(q->body);
    free(q);
    *con_cls = NULL;
}

/* ---- start ------------------------------------------------------------------------------------ */

int http_start(srv *s, int *port_out, ty_err *err)
{
    static struct ratelim rl = {.mu = PTHREAD_MUTEX_INITIALIZER};
    s->rl = &rl;
    char host[256];
    int port;
    if (srv_listen_parse(s->cfg.listen, host, sizeof host, &port, err)) return TY_EINVAL;
    gate_config gc = {
        .lim = head_limits,
        .per_ip = s->cfg.per_ip_connections,
        .head_timeout_ms = s->cfg.header_timeout_s * 1000,
        .max_pending = s->cfg.max_pending_heads,
        .max_served = (unsigned)s->cfg.max_connections,
        .inspect = !s->cfg.tls_cert[0],
    };
    gc.lim.max_body = s->cfg.max_body;
    if (!(s->gate = gate_new(&gc, err))) return TY_ENOMEM;
    /* No MHD_USE_ERROR_LOG: it reports every client that hangs up on a
     * stream; failures to start are reported by us. The gate accepts and
     * hands connections over (MHD_add_connection, which needs ITC). */
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    char *cert = NULL, *key = NULL;
    if (s->cfg.tls_cert[0]) {
        size_t n;
        if (ty_read_file(s->cfg.tls_cert, &cert, &n, err)) return TY_EIO;
        if (ty_read_file(s->cfg.tls_key, &key, &n, err)) {
            free(cert);
            return TY_EIO;
        }
        flags |= MHD_USE_TLS;
    }
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, NULL},
        {MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)gate_notify, s->gate},
        {MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)gate_unescape, NULL},
        {MHD_OPTION_CONNECTION_LIMIT, s->cfg.max_connections, NULL},
        /* Room for the largest head the gate lets through, so the daemon
         * never runs out of it and answers 431/414 itself. */
        {MHD_OPTION_CONNECTION_MEMORY_LIMIT, 64 * 1024, NULL},
        /* A client that stops reading is dropped by the SSE hub, but its
         * socket only closes once MHD sees no progress for this long.
         * Suspended (idle) streams do not time out, and heartbeats keep
         * live ones active. */
        {MHD_OPTION_CONNECTION_TIMEOUT, s->cfg.heartbeat_s * 4 > 60 ? s->cfg.heartbeat_s * 4 : 60,
         NULL},
        {MHD_OPTION_THREAD_POOL_SIZE, s->cfg.http_threads, NULL},
        {cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, cert},
        {key ? MHD_OPTION_HTTPS_MEM_KEY : MHD_OPTION_END, 0, key},
        {MHD_OPTION_END, 0, NULL},
    };
    s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_ARRAY, opts,
                              MHD_OPTION_END);
    /* MHD copies the TLS material while starting. */
    free(cert);
    free(key);
    if (!s->mhd)
        return ty_err_set(err, TY_EIO, "cannot start the HTTP daemon (TLS material invalid?)");
    return gate_listen(s->gate, host, port, s->mhd, port_out, err);
}
