/* http.h — request plumbing shared by the HTTP daemon and the route handlers:
 * the per-request context, the route table and JSON response helpers.
 *
 * Every non-2xx answer goes through http_error so it is the JSON error shape
 * of docs/api.md. */
#ifndef TY_HTTP_H
#define TY_HTTP_H

#include <jansson.h>
#include <microhttpd.h>

#include "server.h"

typedef struct http_req {
    srv *s;
    struct MHD_Connection *conn;
    const char *method;
    const char *url;
    int route;     /* index in routes_table, -1 none */
    int64_t id;    /* {id} */
    char arg[128]; /* {name} */
    char *body;
    size_t len, cap;
    bool too_big;
    bool answered;    /* a response was queued early (413, 415, 401) */
    int64_t start_ms; /* head received: the body's deadline counts from here */
    void *gen;        /* POST /jobs/{id}/generate: its queued task (genq.c) */
    int64_t token_id; /* the bearer token's row, 0 without a known one */
} http_req;

typedef enum MHD_Result (*route_fn)(http_req *q);

typedef struct route {
    const char *method;
    const char *pattern; /* "/jobs/{id}/events" */
    route_fn fn;
    bool json_body;     /* body must be application/json */
    bool public_;       /* no token needed (static assets, health) */
    unsigned scope;     /* SCOPE_READ / SCOPE_SUBMIT / SCOPE_ADMIN a token needs */
    const char *params; /* query parameters, comma-separated; "name*" may repeat */
} route;

extern const route routes_table[];
extern const int routes_count;

/* Matches method + path; returns the route index, -1 for an unknown path,
 * -2 for a known path with another method. Fills q->id / q->arg. */
int routes_match(http_req *q, const char *method, const char *path);
/* The methods the path answers, "GET, HEAD, DELETE" (for 405's Allow). */
void routes_allowed(const char *path, char *out, size_t cap);
/* Strict query parsing for the route: a parameter it takes given twice
 * (unless a list), without a value, with a control character, or a list
 * over 255 bytes in all. Returns nonzero with field and msg filled. */
int routes_check_query(http_req *q, const route *rt, char *field, size_t fcap, char *msg,
                       size_t mcap);

/* Starts the gate and libmicrohttpd on s->cfg.listen (serve.c calls it
 * last, once everything a request touches exists); *port_out gets the
 * bound port (for port 0). */
int http_start(srv *s, int *port_out, ty_err *err);

/* Queues r with `Connection: close` (every request passes the gate). */
enum MHD_Result http_queue(struct MHD_Connection *conn, unsigned status, struct MHD_Response *r);

enum MHD_Result http_json(http_req *q, unsigned status, json_t *body);
enum MHD_Result http_error(http_req *q, unsigned status, const char *code, const char *field,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Maps a ty_err from the db/scheduler to 404/409/400/500. */
enum MHD_Result http_ty_error(http_req *q, const ty_err *err);
enum MHD_Result http_bytes(http_req *q, unsigned status, const char *ctype, const void *data,
                           size_t len, bool copy);
const char *http_arg(http_req *q, const char *key);

#endif
