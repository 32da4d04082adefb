/* gate_tls.c — under TLS the gate cannot read a head before libmicrohttpd
 * parses it, and for heads it refuses itself (a malformed Content-Length,
 * an unsupported version, a line without a colon, a head over its memory)
 * libmicrohttpd writes its own answer: an HTML page, for some heads after
 * its status line and headers twice. That answer is never sent.
 *
 * Each connection's TLS session reads and writes through the functions
 * below. The read side counts the client's application-data records to
 * know when the handshake is over (TLS 1.3 also wraps the client's
 * Finished in one). From then on, until the access handler has been
 * called for the request (gate_request_begin), the daemon has nothing of
 * ours to send: a write then can only be its own answer, and it fails, so
 * the daemon closes the connection and the client gets no answer instead
 * of a malformed one. Everything the access handler sees is answered by
 * it, in JSON (http.c repeats the gate's checks there); under TLS every
 * answer closes the connection, so each one serves a single request. */
#include <errno.h>
#include <gnutls/gnutls.h>
#include <poll.h>
#include <sys/socket.h>

#include "gate_int.h"

/* Follows the TLS record framing of what the client sent. */
static void count_records(conn_ctx *x, const unsigned char *p, size_t n)
{
    while (n) {
        if (x->tls_left) {
            size_t k = n < x->tls_left ? n : x->tls_left;
            p += k;
            n -= k;
            x->tls_left -= k;
            continue;
        }
        x->tls_hdr[x->tls_hn++] = *p++;
        n--;
        if (x->tls_hn < 5) continue;
        x->tls_hn = 0;
        x->tls_left = (size_t)x->tls_hdr[3] << 8 | x->tls_hdr[4];
        if (x->tls_hdr[0] == 23) x->tls_app_records++; /* application_data */
    }
}

static ssize_t pull(gnutls_transport_ptr_t p, void *buf, size_t n)
{
    conn_ctx *x = p;
    ssize_t r = recv(x->fd, buf, n, 0);
    if (r > 0) count_records(x, buf, (size_t)r);
    return r;
}

static int pull_timeout(gnutls_transport_ptr_t p, unsigned int ms)
{
    conn_ctx *x = p;
    struct pollfd pfd = {.fd = x->fd, .events = POLLIN};
    return poll(&pfd, 1, ms == GNUTLS_INDEFINITE_TIMEOUT ? -1 : (int)ms);
}

static ssize_t push(gnutls_transport_ptr_t p, const void *data, size_t n)
{
    conn_ctx *x = p;
    int need = gnutls_protocol_get_version(x->tls) == GNUTLS_TLS1_3 ? 2 : 1;
    if (x->tls_app_records >= need && !x->handler_seen) {
        errno = EPIPE;
        return -1;
    }
    return send(x->fd, data, n, MSG_NOSIGNAL);
}

void gate_tls_guard(conn_ctx *x)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(x->mc, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (!ci || !ci->tls_session || x->fd < 0) return;
    gnutls_session_t s = ci->tls_session;
    x->tls = s;
    gnutls_transport_set_ptr(s, x);
    gnutls_transport_set_pull_function(s, pull);
    gnutls_transport_set_pull_timeout_function(s, pull_timeout);
    gnutls_transport_set_push_function(s, push);
}
