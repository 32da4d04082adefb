/* gate.h — the front door of `trainyard serve`: accepts connections itself,
 * limits them per client address, and reads each request head (without
 * consuming it) before libmicrohttpd sees the connection.
 *
 * Why: libmicrohttpd answers malformed or oversized request heads itself,
 * with HTML bodies, and has no deadline for a head that trickles in. The
 * gate answers those cases with the JSON error of docs/api.md and hands
 * only well-formed heads to the daemon (MHD_add_connection).
 *
 * Keep-alive: when a response is complete and the daemon holds no byte the
 * gate has not checked, the connection is suspended in the daemon and
 * watched by the gate again until its next head is complete and checked
 * (or refused in JSON, or closed when idle past the head timeout). So each
 * request on the wire passes the gate, and a connection serves many.
 * A request the gate could not check first (bytes the daemon read ahead of
 * it) is answered with `Connection: close`.
 *
 * Under TLS the head is encrypted: the gate then only limits connections
 * per address, the daemon parses the head, every answer closes the
 * connection, and an answer the daemon would write itself (its HTML error
 * pages) is not sent: the connection is closed instead (docs/server.md). */
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

/* The bytes a head that gate_check_head accepted takes (through its blank
 * line) and its Content-Length (0 without one): where the next request on
 * the connection starts. */
void gate_head_extent(const char *buf, size_t n, size_t *head_len, unsigned long long *body_len);

/* Does the decoded text hold a NUL or another control byte (< 0x20, 0x7f)? */
bool gate_has_ctl(const char *s, size_t n);

typedef struct gate_config {
    gate_limits lim;
    int per_ip;          /* connections one address may hold (pending + served) */
    int head_timeout_ms; /* deadline for the whole head from accept or its first byte; also
                            how long a kept connection may stay idle between requests */
    int max_pending;     /* connections whose head is still arriving, shared fairly between
                            addresses (the oldest head of the address with most is dropped) */
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

/* The request cycle of a connection, called by the access handler:
 * gate_request_begin at its first call (version as libmicrohttpd gives
 * it), gate_request_head_done once the head checks have answered or
 * passed. Answers queued in between close the connection (libmicrohttpd
 * does so for answers queued before the body). */
void gate_request_begin(struct MHD_Connection *c, const char *version);
void gate_request_head_done(struct MHD_Connection *c);
/* Did the gate check the current request's head? (Not under TLS, nor for
 * heads the daemon read ahead of it.) */
bool gate_request_checked(struct MHD_Connection *c);
/* May the answer being queued keep the connection open? Records the
 * choice for gate_request_done; false answers get `Connection: close`,
 * true ones `Keep-Alive: *keep_alive` (the idle timeout). */
bool gate_response_keeps(struct MHD_Connection *c, const char **keep_alive);
/* Did the gate refuse this connection's next head (its JSON error is
 * sent)? The daemon must then drop the request unanswered. */
bool gate_refused(struct MHD_Connection *c);
/* MHD_OPTION_NOTIFY_COMPLETED, after the answer: a kept connection goes
 * back to the gate until its next head is checked. */
void gate_request_done(struct MHD_Connection *c, enum MHD_RequestTerminationCode toe);

#endif
