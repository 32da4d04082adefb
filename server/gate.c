/* gate.c — accept, per-address limits, fair shares of the pending heads
 * and the gate thread in front of libmicrohttpd (see gate.h for why; the
 * head check itself is gate_head.c, keep-alive gate_keep.c).
 *
 * One thread runs an epoll loop over the listening socket, the
 * connections whose head is still arriving and the kept connections
 * waiting for their next head. It only peeks (MSG_PEEK) at their bytes,
 * so a connection handed to the daemon still starts at its request line.
 * A refused connection gets a JSON error, its write side is shut, and
 * what the client still sends is read and dropped for a moment (a close
 * with unread bytes would reset the connection and could destroy the
 * answer before the client read it). */
#include "gate_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "server.h"
#include "tyutil.h"

/* ---- per-address accounting ------------------------------------------------------------- */

void gate_key_of(const struct sockaddr *sa, ipkey *k)
{
    memset(k, 0, sizeof *k);
    if (sa && sa->sa_family == AF_INET) {
        k->a[10] = k->a[11] = 0xff;
        memcpy(k->a + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa && sa->sa_family == AF_INET6) {
        memcpy(k->a, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    }
}

static unsigned key_hash(const ipkey *k)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < 16; i++)
        h = (h ^ k->a[i]) * 16777619u;
    return h % IP_BUCKETS;
}

/* Takes one connection for k: its entry, or NULL at the limit when
 * enforce (or out of memory). The entry lives while it counts one. */
ipent *gate_ip_take(gate *g, const ipkey *k, bool enforce)
{
    unsigned b = key_hash(k);
    pthread_mutex_lock(&g->mu);
    ipent *e = g->tab[b];
    while (e && memcmp(&e->k, k, sizeof *k))
        e = e->next;
    if (!e && (e = calloc(1, sizeof *e))) {
        e->k = *k;
        e->next = g->tab[b];
        g->tab[b] = e;
    }
    if (e && enforce && g->cfg.per_ip > 0 && e->n >= g->cfg.per_ip)
        e = NULL;
    else if (e)
        e->n++;
    pthread_mutex_unlock(&g->mu);
    return e;
}

void gate_ip_give(gate *g, const ipkey *k)
{
    unsigned b = key_hash(k);
    pthread_mutex_lock(&g->mu);
    for (ipent **pp = &g->tab[b]; *pp; pp = &(*pp)->next) {
        ipent *e = *pp;
        if (memcmp(&e->k, k, sizeof *k)) continue;
        if (--e->n <= 0) {
            *pp = e->next;
            free(e);
        }
        break;
    }
    pthread_mutex_unlock(&g->mu);
}

/* ---- connections ------------------------------------------------------------------------ */

static const char *reason_of(unsigned status)
{
    switch (status) {
    case 400:
        return "Bad Request";
    case 408:
        return "Request Timeout";
    case 411:
        return "Length Required";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 503:
        return "Service Unavailable";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Error";
    }
}

/* Best effort: the answer is small and the socket's send buffer empty. */
static void send_error(int fd, unsigned status, const char *code, const char *field,
                       const char *msg)
{
    char *body = srv_error_json(code, field, msg);
    if (!body) return;
    char head[256];
    size_t bl = strlen(body);
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "%sConnection: close\r\n\r\n",
                      status, reason_of(status), bl,
                      status == 429 || status == 503 ? "Retry-After: 1\r\n" : "");
    struct iovec iov[2] = {{head, (size_t)hl}, {body, bl}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
    ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    free(body);
}

void gate_conn_link(gate *g, conn *c)
{
    c->prev = NULL;
    c->next = g->list;
    if (g->list) g->list->prev = c;
    g->list = c;
    if (!c->x) g->nconns++;
}

void gate_conn_unlink(gate *g, conn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        g->list = c->next;
    if (c->next) c->next->prev = c->prev;
    if (!c->x && !c->evicted) g->nconns--;
}

/* A new connection's head stops arriving: it no longer counts as pending. */
static void pend_end(gate *g, conn *c)
{
    if (!c->ip) return;
    c->ip->pend--;
    c->ip = NULL;
    g->npending--;
}

void gate_conn_close(gate *g, conn *c)
{
    if (c->x) {
        gate_kept_release(g, c, true);
        return;
    }
    epoll_ctl(g->efd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (!c->draining) {
        pend_end(g, c);
        gate_ip_give(g, &c->k);
    }
    gate_conn_unlink(g, c);
    free(c);
}

/* Reads and drops what is there; false once the peer has closed. */
bool gate_drain(int fd)
{
    char sink[4096];
    for (;;) {
        ssize_t r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (r > 0) continue;
        if (r == 0) return false;
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    }
}

/* Refuses c: the JSON error, then a short drain before the close (a kept
 * connection goes back to the daemon to be closed there). */
void gate_conn_refuse(gate *g, conn *c, unsigned status, const char *code, const char *field,
                      const char *msg)
{
    bool open = gate_drain(c->fd);
    /* Under TLS a plain-text answer would only confuse the client. */
    if (g->cfg.inspect) send_error(c->fd, status, code, field, msg);
    shutdown(c->fd, SHUT_WR);
    if (!c->draining && !c->x) {
        pend_end(g, c);
        gate_ip_give(g, &c->k);
    }
    c->draining = true;
    c->deadline_ms = ty_now_ms() + 1000;
    if (!open) gate_conn_close(g, c);
}

int gate_scan_heads(gate *g, const char *buf, size_t n, int *credits, unsigned long long *end,
                    bool *close_after, gate_verdict *v)
{
    *credits = 0;
    *end = 0;
    *close_after = false;
    int rc = gate_check_head(buf, n, &g->cfg.lim, v);
    for (int r = rc; r == GATE_OK;) {
        size_t hl;
        unsigned long long bl;
        gate_head_extent(buf + *end, n - (size_t)*end, &hl, &bl);
        (*credits)++;
        *end += hl + bl;
        if (*end >= n) break;
        /* Pipelined: the daemon may read the next heads with this one. */
        gate_verdict later;
        r = gate_check_head(buf + *end, n - (size_t)*end, &g->cfg.lim, &later);
        *close_after = r == GATE_REJECT;
    }
    return rc;
}

static void conn_handover(gate *g, conn *c, int credits, unsigned long long end, bool close_after)
{
    /* At its limit the daemon would close the socket without a word. */
    const union MHD_DaemonInfo *di =
        g->cfg.max_served ? MHD_get_daemon_info(g->mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS) : NULL;
    if (di && di->num_connections >= g->cfg.max_served) {
        gate_conn_refuse(g, c, 503, "too_many_connections", NULL,
                         "the server is at its connection limit; retry shortly");
        return;
    }
    epoll_ctl(g->efd, EPOLL_CTL_DEL, c->fd, NULL);
    handoff *h = credits ? calloc(1, sizeof *h) : NULL;
    if (h) {
        *h = (handoff){.fd = c->fd, .credits = credits, .close_after = close_after, .end = end};
        pthread_mutex_lock(&g->mu);
        h->next = g->handoffs;
        g->handoffs = h;
        pthread_mutex_unlock(&g->mu);
    }
    /* The daemon takes the socket (and closes it on failure); its
     * STARTED notification counts the address before we give ours back. */
    if (MHD_add_connection(g->mhd, c->fd, (struct sockaddr *)&c->sa, c->sl) != MHD_YES && h) {
        pthread_mutex_lock(&g->mu);
        for (handoff **pp = &g->handoffs; *pp; pp = &(*pp)->next)
            if (*pp == h) {
                *pp = h->next;
                free(h);
                break;
            }
        pthread_mutex_unlock(&g->mu);
    }
    pend_end(g, c);
    gate_ip_give(g, &c->k);
    gate_conn_unlink(g, c);
    free(c);
}

static void conn_readable(gate *g, conn *c, uint32_t events)
{
    if (c->draining) {
        if (!gate_drain(c->fd))
            gate_conn_close(g, c);
        else if (c->x)
            gate_kept_rearm(g, c);
        return;
    }
    if (c->x) {
        gate_kept_readable(g, c, events);
        return;
    }
    size_t cap = g->cfg.lim.max_head + 1;
    ssize_t r = recv(c->fd, g->peek, cap, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        gate_conn_close(g, c);
        return;
    }
    if (r < 0) return;
    gate_verdict v;
    int credits;
    unsigned long long end;
    bool close_after;
    int rc = gate_scan_heads(g, g->peek, (size_t)r, &credits, &end, &close_after, &v);
    if (rc == GATE_OK)
        conn_handover(g, c, credits, end, close_after);
    else if (rc == GATE_REJECT)
        gate_conn_refuse(g, c, v.status, v.code, v.field, v.msg);
    /* The peer is done sending and the head is not complete: it never
     * will be (its unread bytes hide the end of file from the peek). It
     * may still be reading, so it gets the answer. */
    else if (events & (EPOLLHUP | EPOLLERR))
        gate_conn_close(g, c);
    else if (events & EPOLLRDHUP)
        gate_conn_refuse(g, c, 400, "bad_request", NULL,
                         "the connection ended inside the request head (no blank line after it)");
}

/* ---- fair shares ------------------------------------------------------------------------- */

/* The pending heads are over max_pending: drop the oldest head of the
 * address that has the most of them, so that a flood from many addresses
 * (each under its own limit) cannot keep every other client out. The
 * dropped one gets a best-effort 503 and is closed without the usual
 * drain: that would hold a slot the flood is fighting over. */
static void make_room(gate *g)
{
    conn *victim = NULL;
    for (conn *c = g->list; c; c = c->next) /* newest first: >= keeps the oldest */
        if (c->ip && !c->draining && !c->x && (!victim || c->ip->pend >= victim->ip->pend))
            victim = c;
    if (!victim) return;
    if (g->cfg.inspect)
        send_error(victim->fd, 503, "too_many_connections", NULL,
                   "the server has too many connections sending their request; this one was the "
                   "oldest of the address with the most");
    shutdown(victim->fd, SHUT_WR);
    pend_end(g, victim);
    gate_ip_give(g, &victim->k);
    victim->draining = true;
    /* Closed by the next expire(), not here: an event later in this epoll
     * batch may still name it. Until then it does not count against the
     * cap on connections in the gate, or a burst of arrivals would be
     * closed unheard behind the heads it displaced. */
    victim->deadline_ms = 0;
    victim->evicted = true;
    g->nconns--;
}

static conn *conn_new(gate *g, int fd, const struct sockaddr_storage *sa, socklen_t sl)
{
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return NULL;
    }
    c->fd = fd;
    c->sa = *sa;
    c->sl = sl;
    gate_key_of((const struct sockaddr *)sa, &c->k);
    c->deadline_ms = ty_now_ms() + g->cfg.head_timeout_ms;
    gate_conn_link(g, c);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = c};
    if (g->nconns > 2 * g->cfg.max_pending || epoll_ctl(g->efd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        /* Even the refusals are too many to keep: just close. */
        c->draining = true;
        gate_conn_close(g, c);
        return NULL;
    }
    return c;
}

static void accept_all(gate *g)
{
    for (;;) {
        if (ty_now_ms() < g->accept_paused_until) return;
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(g->lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of descriptors: wait a little instead of spinning on
                 * a listening socket that stays readable. */
                g->accept_paused_until = ty_now_ms() + 100;
                struct epoll_event ev = {.events = 0, .data.ptr = NULL};
                epoll_ctl(g->efd, EPOLL_CTL_MOD, g->lfd, &ev);
            }
            return;
        }
        conn *c = conn_new(g, fd, &sa, sl);
        if (!c) continue;
        if (!(c->ip = gate_ip_take(g, &c->k, true))) {
            c->draining = true; /* nothing taken, nothing to give back */
            char m[128];
            snprintf(m, sizeof m, "too many connections from this address (limit %d)",
                     g->cfg.per_ip);
            gate_conn_refuse(g, c, 429, "too_many_connections", NULL, m);
            continue;
        }
        c->ip->pend++;
        if (++g->npending > g->cfg.max_pending) make_room(g);
        if (!g->cfg.inspect) conn_handover(g, c, 0, 0, false);
    }
}

/* Head deadlines, idle kept connections and drain deadlines. */
static void expire(gate *g)
{
    int64_t now = ty_now_ms();
    for (conn *c = g->list, *next; c; c = next) {
        next = c->next;
        if (now < c->deadline_ms) continue;
        if (c->draining || (c->x && !c->started)) {
            gate_conn_close(g, c); /* a kept one idle too long closes without a word */
        } else {
            char m[128];
            snprintf(m, sizeof m, "the request head did not arrive within %d ms",
                     g->cfg.head_timeout_ms);
            gate_conn_refuse(g, c, 408, "request_timeout", NULL, m);
        }
    }
    if (g->accept_paused_until && now >= g->accept_paused_until) {
        g->accept_paused_until = 0;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
        epoll_ctl(g->efd, EPOLL_CTL_MOD, g->lfd, &ev);
    }
}

static void *gate_main(void *arg)
{
    gate *g = arg;
    struct epoll_event evs[64];
    int64_t next_expire = 0;
    while (!atomic_load(&g->stop)) {
        /* Kept connections arrive from the daemon's threads without a
         * wake-up: look at the inbox at least every 50 ms. */
        int n = epoll_wait(g->efd, evs, 64, 50);
        gate_adopt_kept(g);
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == NULL)
                accept_all(g);
            else if (p == (void *)&g->wake)
                continue;
            else
                conn_readable(g, p, evs[i].events);
        }
        /* Only a conn's own event frees it (accept_all frees only the
         * conns it just made; make_room leaves its victim to expire), and
         * each fd is in a batch once, so no event above named a freed conn. */
        int64_t now = ty_now_ms();
        if (now >= next_expire) {
            expire(g);
            next_expire = now + 50;
        }
    }
    return NULL;
}

gate *gate_new(const gate_config *cfg, ty_err *err)
{
    gate *g = calloc(1, sizeof *g);
    if (!g || !(g->peek = malloc(cfg->lim.max_head + 1))) {
        free(g);
        ty_err_set(err, TY_ENOMEM, "out of memory");
        return NULL;
    }
    g->cfg = *cfg;
    /* Clients that honour it drop an idle connection before the gate does. */
    snprintf(g->keep_alive, sizeof g->keep_alive, "timeout=%d", cfg->head_timeout_ms / 1000);
    g->lfd = g->efd = g->wake = -1;
    pthread_mutex_init(&g->mu, NULL);
    return g;
}

int gate_listen(gate *g, const char *host, int port, struct MHD_Daemon *mhd, int *port_out,
                ty_err *err)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    const char *h = !strcmp(host, "localhost") ? "127.0.0.1" : host;
    if (inet_pton(AF_INET, h, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        sl = sizeof *a4;
    } else if (inet_pton(AF_INET6, h, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        sl = sizeof *a6;
    } else {
        return ty_err_field(err, TY_EINVAL, "listen",
                            "listen host must be an IP address or localhost, got '%s'", host);
    }
    int one = 1;
    g->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (g->lfd < 0) return ty_err_set(err, TY_EIO, "socket: %s", strerror(errno));
    setsockopt(g->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ss.ss_family == AF_INET6) setsockopt(g->lfd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(g->lfd, (struct sockaddr *)&ss, sl) != 0 || listen(g->lfd, SOMAXCONN) != 0)
        return ty_err_set(err, TY_EIO, "cannot listen on %s:%d: %s", host, port, strerror(errno));
    struct sockaddr_storage bound;
    socklen_t bl = sizeof bound;
    getsockname(g->lfd, (struct sockaddr *)&bound, &bl);
    *port_out = ntohs(bound.ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
                                                 : ((struct sockaddr_in6 *)&bound)->sin6_port);
    g->mhd = mhd;
    g->efd = epoll_create1(EPOLL_CLOEXEC);
    g->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event le = {.events = EPOLLIN, .data.ptr = NULL};
    struct epoll_event we = {.events = EPOLLIN, .data.ptr = &g->wake};
    if (g->efd < 0 || g->wake < 0 || epoll_ctl(g->efd, EPOLL_CTL_ADD, g->lfd, &le) != 0 ||
        epoll_ctl(g->efd, EPOLL_CTL_ADD, g->wake, &we) != 0)
        return ty_err_set(err, TY_EIO, "epoll: %s", strerror(errno));
    if (pthread_create(&g->th, NULL, gate_main, g) != 0)
        return ty_err_set(err, TY_EIO, "cannot start the accept thread");
    g->running = true;
    return 0;
}

void gate_stop(gate *g)
{
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->closing = true;
    pthread_mutex_unlock(&g->mu);
    if (g->running) {
        atomic_store(&g->stop, true);
        uint64_t one = 1;
        ssize_t w = write(g->wake, &one, sizeof one);
        (void)w;
        pthread_join(g->th, NULL);
        g->running = false;
    }
    /* Kept connections go back to the daemon, which closes them. */
    gate_adopt_kept(g);
    while (g->list) {
        if (!g->list->x) g->list->draining = true; /* the table is freed below */
        gate_conn_close(g, g->list);
    }
    if (g->lfd >= 0) close(g->lfd);
    g->lfd = -1;
}

void gate_free(gate *g)
{
    if (!g) return;
    gate_stop(g);
    if (g->efd >= 0) close(g->efd);
    if (g->wake >= 0) close(g->wake);
    for (handoff *h = g->handoffs, *n; h; h = n) {
        n = h->next;
        free(h);
    }
    for (int b = 0; b < IP_BUCKETS; b++)
        for (ipent *e = g->tab[b], *n; e; e = n) {
            n = e->next;
            free(e);
        }
    pthread_mutex_destroy(&g->mu);
    free(g->peek);
    free(g);
}
