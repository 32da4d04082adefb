/* gate.h — the front door of `trainyard serve`: accepts connections itself,
 * limits them per client address, and reads each request head (without
 * consuming it) before libmicrohttpd sees the connection.
 *
 * Why: libmicrohttpd answers malformed or oversized request heads itself,
 * with HTML bodies, and has no deadline for a head that trickles in. The
 * gate answers those cases with the JSON error of docs/api.md and hands
 * only well-formed heads to the daemon (MHD_add_connection). Every
 * response says `Connection: close`, so each request on the wire passes
 * the gate. Under TLS the head is encrypted: the gate then only limits
 * connections per address and the daemon parses the head (docs/server.md). */
#ifndef TY_GATE_H
#define TY_GATE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "tyerr.h"

typedef struct gate_limits {
    size_t max_line; /* request line, bytes with CRLF (414 beyond) */
    size_t max_head; /* request line + header fields + blank line (431 beyond) */
    int max_fields;  /* header fields (431 beyond) */
    int max_params;  /* query parameters (414 beyond) */
    int max_cookies; /* cookies over all Cookie fields (431 beyond) */
    size_t max_body; /* Content-Length (413 beyond) */
} gate_limits;

typedef struct gate_verdict {
    unsigned status;   /* HTTP status of the refusal */
    const char *code;  /* Error.code */
    const char *field; /* Error.field, or NULL */
    char msg[192];
} gate_verdict;

enum { GATE_OK = 0, GATE_MORE = 1, GATE_REJECT = -1 };

/* Checks the first n bytes of a connection against RFC 9112 and the
 * limits: GATE_OK once a complete, acceptable head is there, GATE_MORE
 * while it is incomplete and within limits, GATE_REJECT (v filled) for
 * anything the server will not take. Pure; unit-tested and fuzzed. */
int gate_check_head(const char *buf, size_t n, const gate_limits *lim, gate_verdict *v);

/* Does the decoded text hold a NUL or another control byte (< 0x20, 0x7f)? */
bool gate_has_ctl(const char *s, size_t n);

typedef struct gate_config {
    gate_limits lim;
    int per_ip;          /* connections one address may hold (pending + served) */
    int head_timeout_ms; /* deadline for the whole head from accept */
    int max_pending;     /* connections whose head is still arriving */
    unsigned max_served; /* the daemon's MHD_OPTION_CONNECTION_LIMIT (503 at it) */
    bool inspect;        /* false under TLS: hand over at once */
} gate_config;

typedef struct gate gate;

/* Two steps, because libmicrohttpd needs the gate as its notification
 * context before the gate can hand connections to it: gate_new, then
 * MHD_start_daemon(MHD_USE_NO_LISTEN_SOCKET, ... gate_notify, g ...), then
 * gate_listen, which binds host:port (port 0 = any), listens and starts
 * the gate thread. *port_out gets the bound port. */
gate *gate_new(const gate_config *cfg, ty_err *err);
int gate_listen(gate *g, const char *host, int port, struct MHD_Daemon *mhd, int *port_out,
                ty_err *err);
/* Stops accepting and closes the connections still in the gate (call
 * before MHD_stop_daemon); gate_free after MHD_stop_daemon. */
void gate_stop(gate *g);
void gate_free(gate *g);

/* libmicrohttpd connection notifications (MHD_OPTION_NOTIFY_CONNECTION):
 * the per-address count follows a connection into the daemon, and the
 * socket context carries the per-connection flag the URL unescaper sets. */
void gate_notify(void *cls, struct MHD_Connection *c, void **socket_ctx,
                 enum MHD_ConnectionNotificationCode toe);
/* MHD_OPTION_UNESCAPE_CALLBACK: percent-decodes like libmicrohttpd and
 * flags the connection when the result holds a control byte, which the
 * daemon's C strings would otherwise silently cut at. */
size_t gate_unescape(void *cls, struct MHD_Connection *c, char *s);
/* Was the current request's path or query flagged? Clears the flag. */
bool gate_take_bad_target(struct MHD_Connection *c);

#endif
