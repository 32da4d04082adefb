/* http_reply.c — the answers of every request (http.h): JSON bodies,
 * bytes, and the JSON error shape of docs/api.md; `Connection: close` on
 * those the gate does not let keep their connection (gate.h). Below both the HTTP daemon (http.c) and the route
 * handlers, which only answer through these. */
#include "http.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "gate.h"
#include "tyutil.h"
#include "tyjson.h"

enum MHD_Result http_queue(struct MHD_Connection *conn, unsigned status, struct MHD_Response *r)
{
    /* A connection stays open only while the gate checks each of its heads
     * (gate.h): errors found in the head and answers to requests it could
     * not check end it. */
    const char *keep_alive = NULL;
    if (!gate_response_keeps(conn, &keep_alive))
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    else
        MHD_add_response_header(r, "Keep-Alive", keep_alive);
    return MHD_queue_response(conn, status, r);
}

enum MHD_Result http_bytes(http_req *q, unsigned status, const char *ctype, const void *data,
                           size_t len, bool copy)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, (void *)data, copy ? MHD_RESPMEM_MUST_COPY : MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    if (ctype) MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result ok = http_queue(q->conn, status, r);
    MHD_destroy_response(r);
    q->answered = true;
    return ok;
}

static enum MHD_Result queue_text(http_req *q, unsigned status, char *txt,
                                  const http_extra_header *x)
{
    if (!txt) return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(txt), txt, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(txt);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (x && x->name) MHD_add_response_header(r, x->name, x->value);
    enum MHD_Result ok = http_queue(q->conn, status, r);
    MHD_destroy_response(r);
    q->answered = true;
    return ok;
}

/* curl is how people read the API in a terminal: for it the body is
 * indented and ends in a newline (a 2 KB job on one line is unreadable, and
 * the prompt would follow the closing brace). Every other client gets the
 * compact form. */
bool http_pretty(http_req *q)
{
    const char *ua = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, "User-Agent");
    return ua && !strncmp(ua, "curl/", 5);
}

enum MHD_Result http_json(http_req *q, unsigned status, json_t *body)
{
    bool pretty = http_pretty(q);
    char *txt = ty_json_dumps(body, pretty ? JSON_INDENT(2) | JSON_PRESERVE_ORDER : JSON_COMPACT);
    json_decref(body);
    if (pretty && txt) {
        size_t n = strlen(txt);
        char *nl = realloc(txt, n + 2);
        if (nl) {
            nl[n] = '\n';
            nl[n + 1] = 0;
            txt = nl;
        }
    }
    return queue_text(q, status, txt, NULL);
}

enum MHD_Result http_json_text(http_req *q, unsigned status, char *txt)
{
    return queue_text(q, status, txt, NULL);
}

static enum MHD_Result verror(http_req *q, unsigned status, const http_extra_header *x,
                              const char *code, const char *field, const char *fmt, va_list ap)
{
    char msg[768];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return queue_text(q, status, srv_error_json(code, field, msg), x);
}

enum MHD_Result http_error(http_req *q, unsigned status, const char *code, const char *field,
                           const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    enum MHD_Result ok = verror(q, status, NULL, code, field, fmt, ap);
    va_end(ap);
    return ok;
}

enum MHD_Result http_error_with(http_req *q, unsigned status, http_extra_header x, const char *code,
                                const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    enum MHD_Result ok = verror(q, status, &x, code, NULL, fmt, ap);
    va_end(ap);
    return ok;
}

unsigned http_ty_status(const ty_err *err, const char **code)
{
    switch (err->code) {
    case TY_ENOENT:
        *code = "not_found";
        return 404;
    case TY_ESTATE:
        *code = "conflict";
        return 409;
    case TY_EINVAL:
    case TY_ESPEC:
        *code = "invalid_spec";
        return 400;
    case TY_ENOSPC: /* a full disk, or the read-only mode it causes (disk.c) */
        *code = "disk_full";
        return 503;
    default:
        *code = "internal";
        return 500;
    }
}

enum MHD_Result http_ty_error(http_req *q, const ty_err *err)
{
    const char *code;
    unsigned status = http_ty_status(err, &code);
    return http_error(q, status, code, status < 500 ? err->field : NULL, "%s", err->msg);
}

const char *http_arg(http_req *q, const char *key)
{
    return MHD_lookup_connection_value(q->conn, MHD_GET_ARGUMENT_KIND, key);
}
