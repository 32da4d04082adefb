/* http.h — request plumbing shared by the HTTP daemon and the route handlers:
 * the per-request context, starting the daemon (http.c) and the response
 * helpers (http_reply.c). The route table is routes.h's.
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
    int route;     /* index in routes_table (routes.h), -1 none */
    int64_t id;    /* {id} */
    char arg[128]; /* {name} */
    char *body;
    size_t len, cap;
    bool too_big;
    bool answered;    /* a response was queued early (413, 415, 401) */
    int64_t start_ms; /* head received: the body's deadline counts from here */
    /* What a route keeps across the calls of one request (a suspended
     * request's task); freed with route_state_free if the request ends
     * with it still set. */
    void *route_state;
    void (*route_state_free)(void *);
    int64_t token_id; /* the bearer token's row, 0 without a known one */
} http_req;

/* Starts the gate and libmicrohttpd on s->cfg.listen (serve.c calls it
 * last, once everything a request touches exists); *port_out gets the
 * bound port (for port 0). */
int http_start(srv *s, int *port_out, ty_err *err);

/* Queues r, with `Connection: close` unless the gate lets the connection
 * serve another request (gate_response_keeps). */
enum MHD_Result http_queue(struct MHD_Connection *conn, unsigned status, struct MHD_Response *r);

enum MHD_Result http_json(http_req *q, unsigned status, json_t *body);
/* A body already printed as compact JSON (taken: freed here). */
enum MHD_Result http_json_text(http_req *q, unsigned status, char *txt);
/* Whether http_json indents for this client (curl in a terminal). */
bool http_pretty(http_req *q);
enum MHD_Result http_error(http_req *q, unsigned status, const char *code, const char *field,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* An extra header of an error answer: Retry-After (429) or Allow (405). */
typedef struct http_extra_header {
    const char *name, *value;
} http_extra_header;
enum MHD_Result http_error_with(http_req *q, unsigned status, http_extra_header x, const char *code,
                                const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* The answer to a ty_err from the db/scheduler: 404 not_found, 409
 * conflict, 400 invalid_spec (these three name err->field), 503 disk_full,
 * else 500 internal. Sets *code; admission refuses through the same map. */
unsigned http_ty_status(const ty_err *err, const char **code);
enum MHD_Result http_ty_error(http_req *q, const ty_err *err);
enum MHD_Result http_bytes(http_req *q, unsigned status, const char *ctype, const void *data,
                           size_t len, bool copy);
const char *http_arg(http_req *q, const char *key);

#endif
