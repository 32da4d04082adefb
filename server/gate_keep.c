/* gate_keep.c — a connection's life inside libmicrohttpd, as the gate sees
 * it (gate.h): its socket context, the request cycle the access handler
 * reports, and keep-alive.
 *
 * Keep-alive without giving up the gate: the gate counts the heads it
 * checked (credits) and the stream offset where their requests end. When
 * an answer that keeps the connection is complete and the daemon has no
 * credited request left, the bytes the daemon consumed (TCP_INFO's bytes
 * received less what is still queued) tell whether it holds anything the
 * gate did not check. If not, the connection is suspended in the daemon
 * and handed to the gate thread, which peeks at the next head like at a
 * new connection's, then resumes it (or refuses it in JSON, or closes it
 * when idle). The suspension happens in the completion notification
 * (MHD_OPTION_NOTIFY_COMPLETED): libmicrohttpd then resets the connection
 * for its next request and leaves it alone until the gate resumes it; a
 * connection is only ever closed by the daemon, after a resume. If the
 * daemon read ahead (a pipelining client racing the hand-over), its next
 * request gets the gate's checks in the access handler instead (http.c)
 * and an answer with `Connection: close`. */
#include "gate_int.h"

#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "tyutil.h"

conn_ctx *gate_ctx_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* What the gate checked of a new connection's first heads. */
static void take_handoff(gate *g, conn_ctx *x)
{
    pthread_mutex_lock(&g->mu);
    for (handoff **pp = &g->handoffs; *pp; pp = &(*pp)->next) {
        handoff *h = *pp;
        if (h->fd != x->fd) continue;
        x->credits = h->credits;
        x->checked_end = h->end;
        x->close_after = h->close_after;
        *pp = h->next;
        free(h);
        break;
    }
    pthread_mutex_unlock(&g->mu);
}

void gate_notify(void *cls, struct MHD_Connection *c, void **socket_ctx,
                 enum MHD_ConnectionNotificationCode toe)
{
    gate *g = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_ctx *x = calloc(1, sizeof *x);
        if (!x) return;
        x->g = g;
        x->mc = c;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        gate_key_of(ci ? ci->client_addr : NULL, &x->k);
        x->counted = gate_ip_take(g, &x->k, false) != NULL;
        ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        x->fd = ci ? ci->connect_fd : -1;
        *socket_ctx = x;
        if (g->cfg.inspect)
            take_handoff(g, x);
        else
            gate_tls_guard(x);
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_ctx *x = *socket_ctx;
        if (!x) return;
        if (x->counted) gate_ip_give(g, &x->k);
        free(x->kc); /* never in the gate now: only resumed connections close */
        free(x);
        *socket_ctx = NULL;
    }
}

size_t gate_unescape(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    size_t n = MHD_http_unescape(s);
    if (gate_has_ctl(s, n)) {
        conn_ctx *x = gate_ctx_of(c);
        if (x) x->bad_target = true;
    }
    return n;
}

bool gate_take_bad_target(struct MHD_Connection *c)
{
    conn_ctx *x = gate_ctx_of(c);
    if (!x || !x->bad_target) return false;
    x->bad_target = false;
    return true;
}

/* ---- the request cycle (the daemon's threads) --------------------------------------------- */

void gate_request_begin(struct MHD_Connection *c, const char *version)
{
    conn_ctx *x = gate_ctx_of(c);
    if (!x) return;
    x->handler_seen = true;
    x->in_head = true;
    x->keep = false;
    x->cur_checked = x->credits > 0;
    if (x->cur_checked) x->credits--;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONNECTION);
    x->client_close =
        !version || strcmp(version, MHD_HTTP_VERSION_1_1) || (h && strcasestr(h, "close"));
}

void gate_request_head_done(struct MHD_Connection *c)
{
    conn_ctx *x = gate_ctx_of(c);
    if (x) x->in_head = false;
}

bool gate_request_checked(struct MHD_Connection *c)
{
    conn_ctx *x = gate_ctx_of(c);
    return x && x->cur_checked;
}

bool gate_response_keeps(struct MHD_Connection *c, const char **keep_alive)
{
    conn_ctx *x = gate_ctx_of(c);
    if (!x) return false;
    x->keep = x->g->cfg.inspect && x->cur_checked && !x->in_head && !x->client_close &&
              !x->refused && !(x->close_after && x->credits == 0);
    *keep_alive = x->g->keep_alive;
    return x->keep;
}

bool gate_refused(struct MHD_Connection *c)
{
    conn_ctx *x = gate_ctx_of(c);
    return x && x->refused;
}

/* Bytes of the stream the daemon has read, or -1 when unknown. */
static long long stream_consumed(int fd)
{
    struct tcp_info ti;
    socklen_t l = sizeof ti;
    int inq = 0;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &l) != 0 ||
        l < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received ||
        ioctl(fd, FIONREAD, &inq) != 0)
        return -1;
    return (long long)ti.tcpi_bytes_received - inq;
}

void gate_request_done(struct MHD_Connection *c, enum MHD_RequestTerminationCode toe)
{
    conn_ctx *x = gate_ctx_of(c);
    if (!x || !x->keep || toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) return;
    x->keep = false;
    /* A credited head follows: the daemon has it, or reads it next. */
    if (x->credits > 0) return;
    if (stream_consumed(x->fd) != (long long)x->checked_end) return;
    gate *g = x->g;
    /* One conn per connection, kept across its requests and registered
     * once: EPOLLONESHOT disarms it at its event, a MOD re-arms it. */
    conn *k = x->kc ? x->kc : (x->kc = calloc(1, sizeof *k));
    if (!k) return;
    k->fd = x->fd;
    k->x = x;
    k->k = x->k;
    k->started = k->draining = false;
    k->deadline_ms = ty_now_ms() + g->cfg.head_timeout_ms;
    pthread_mutex_lock(&g->mu);
    if (g->closing) {
        pthread_mutex_unlock(&g->mu);
        return;
    }
    MHD_suspend_connection(c);
    k->next = g->inbox;
    g->inbox = k;
    pthread_mutex_unlock(&g->mu);
    /* After the inbox: the gate thread adopts it before handling any
     * event that names it. If this fails the idle deadline releases it. */
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET | EPOLLONESHOT,
                             .data.ptr = k};
    if (epoll_ctl(g->efd, x->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, k->fd, &ev) == 0)
        x->registered = true;
}

/* ---- kept connections (the gate thread) ----------------------------------------------------- */

void gate_adopt_kept(gate *g)
{
    pthread_mutex_lock(&g->mu);
    conn *in = g->inbox;
    g->inbox = NULL;
    pthread_mutex_unlock(&g->mu);
    while (in) {
        conn *n = in->next;
        gate_conn_link(g, in);
        in = n;
    }
}

void gate_kept_release(gate *g, conn *c, bool drop)
{
    conn_ctx *x = c->x;
    if (drop) {
        /* The daemon reads the end of the stream and closes. */
        epoll_ctl(g->efd, EPOLL_CTL_DEL, c->fd, NULL);
        x->registered = false;
        x->refused = true;
        shutdown(c->fd, SHUT_RDWR);
    }
    /* Otherwise its one-shot event fired and disarmed it: nothing to do. */
    gate_conn_unlink(g, c);
    MHD_resume_connection(x->mc);
}

void gate_kept_rearm(gate *g, conn *c)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET | EPOLLONESHOT,
                             .data.ptr = c};
    epoll_ctl(g->efd, EPOLL_CTL_MOD, c->fd, &ev);
}

void gate_kept_readable(gate *g, conn *c, uint32_t events)
{
    ssize_t r = recv(c->fd, g->peek, g->cfg.lim.max_head + 1, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        gate_kept_release(g, c, true); /* the client left between requests */
        return;
    }
    gate_verdict v;
    int credits = 0, rc = GATE_MORE;
    unsigned long long end = 0;
    bool close_after = false;
    if (r > 0) {
        if (!c->started) {
            /* From its first byte a head has the head deadline. */
            c->started = true;
            c->deadline_ms = ty_now_ms() + g->cfg.head_timeout_ms;
        }
        rc = gate_scan_heads(g, g->peek, (size_t)r, &credits, &end, &close_after, &v);
    }
    if (rc == GATE_OK) {
        c->x->credits = credits;
        c->x->checked_end += end;
        c->x->close_after = close_after;
        gate_kept_release(g, c, false);
        return;
    }
    /* Still the gate's: its next event is wanted. */
    gate_kept_rearm(g, c);
    if (rc == GATE_REJECT)
        gate_conn_refuse(g, c, v.status, v.code, v.field, v.msg);
    else if (r > 0 && (events & (EPOLLHUP | EPOLLERR)))
        gate_kept_release(g, c, true);
    else if (r > 0 && (events & EPOLLRDHUP))
        gate_conn_refuse(g, c, 400, "bad_request", NULL,
                         "the connection ended inside the request head (no blank line after it)");
}
