/* gate.c — accept, per-address limits and request-head checks in front of
 * libmicrohttpd (see gate.h for why).
 *
 * One thread runs an epoll loop over the listening socket and the
 * connections whose head is still arriving. It only peeks (MSG_PEEK) at
 * their bytes, so a connection handed to the daemon still starts at its
 * request line. A refused connection gets a JSON error, its write side is
 * shut, and what the client still sends is read and dropped for a moment
 * (a close with unread bytes would reset the connection and could destroy
 * the answer before the client read it). */
#include "gate.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "server.h"
#include "tyutil.h"

/* ---- the head check ------------------------------------------------------------------- */

static int reject(gate_verdict *v, unsigned status, const char *code, const char *field,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int reject(gate_verdict *v, unsigned status, const char *code, const char *field,
                  const char *fmt, ...)
{
    v->status = status;
    v->code = code;
    v->field = field;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->msg, sizeof v->msg, fmt, ap);
    va_end(ap);
    return GATE_REJECT;
}

/* RFC 9110 token characters (method, field names). */
static bool is_tchar(unsigned char c)
{
    return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

bool gate_has_ctl(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return true;
    return false;
}

static bool name_is(const char *h, size_t n, const char *want)
{
    return strlen(want) == n && !strncasecmp(h, want, n);
}

/* The request line: METHOD SP /target SP HTTP/1.x CRLF. */
static int check_request_line(const char *buf, size_t ll, const gate_limits *lim, bool *http11,
                              gate_verdict *v)
{
    if (ll < 2 || buf[ll - 2] != '\r')
        return reject(v, 400, "bad_request", NULL, "request lines must end with CRLF");
    const char *end = buf + ll - 2;
    const char *sp1 = memchr(buf, ' ', (size_t)(end - buf));
    if (!sp1 || sp1 == buf) return reject(v, 400, "bad_request", NULL, "malformed request line");
    for (const char *p = buf; p < sp1; p++)
        if (!is_tchar((unsigned char)*p))
            return reject(v, 400, "bad_request", NULL, "malformed request method");
    const char *t = sp1 + 1;
    const char *sp2 = memchr(t, ' ', (size_t)(end - t));
    if (!sp2 || sp2 == t) return reject(v, 400, "bad_request", NULL, "malformed request line");
    if (*t != '/')
        return reject(v, 400, "bad_request", NULL, "the request target must be a path ('/...')");
    int params = 0;
    bool in_query = false;
    for (const char *p = t; p < sp2; p++) {
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f)
            return reject(v, 400, "bad_request", NULL,
                          "the request target holds a byte that must be percent-encoded");
        /* Each parameter takes libmicrohttpd connection memory (a request
         * with a thousand stalls there without an answer). */
        if ((*p == '?' && !in_query) || (in_query && *p == '&')) params++;
        in_query = in_query || *p == '?';
    }
    if (params > lim->max_params)
        return reject(v, 414, "too_large", NULL, "more than %d query parameters", lim->max_params);
    const char *ver = sp2 + 1;
    if (end - ver != 8 || memcmp(ver, "HTTP/", 5) || !isdigit((unsigned char)ver[5]) ||
        ver[6] != '.' || !isdigit((unsigned char)ver[7]))
        return reject(v, 400, "bad_request", NULL, "malformed HTTP version");
    if (ver[5] != '1' || ver[7] > '1')
        return reject(v, 505, "version_not_supported", NULL,
                      "HTTP/%c.%c is not supported (HTTP/1.0 and HTTP/1.1 are)", ver[5], ver[7]);
    *http11 = ver[7] == '1';
    return GATE_OK;
}

typedef struct head_facts {
    int content_length_n, host_n, transfer_encoding_n, cookies;
    unsigned long long content_length;
} head_facts;

/* One field line (without CRLF): name ":" OWS value OWS. */
static int check_field(const char *h, size_t n, head_facts *f, gate_verdict *v)
{
    if (*h == ' ' || *h == '\t')
        return reject(v, 400, "bad_request", NULL, "obsolete line folding is not accepted");
    const char *colon = memchr(h, ':', n);
    if (!colon || colon == h)
        return reject(v, 400, "bad_request", NULL, "a header line has no field name");
    size_t nl = (size_t)(colon - h);
    for (size_t i = 0; i < nl; i++)
        if (!is_tchar((unsigned char)h[i]))
            return reject(v, 400, "bad_request", NULL, "malformed header field name");
    const char *val = colon + 1, *ve = h + n;
    while (val < ve && (*val == ' ' || *val == '\t'))
        val++;
    while (ve > val && (ve[-1] == ' ' || ve[-1] == '\t'))
        ve--;
    for (const char *p = val; p < ve; p++)
        if (((unsigned char)*p < 0x20 && *p != '\t') || *p == 0x7f)
            return reject(v, 400, "bad_request", NULL, "header %.*s holds a control byte",
                          (int)(nl > 64 ? 64 : nl), h);
    size_t vl = (size_t)(ve - val);
    if (name_is(h, nl, "Content-Length")) {
        if (++f->content_length_n > 1)
            return reject(v, 400, "bad_request", "Content-Length",
                          "more than one Content-Length header");
        /* libmicrohttpd does not strip trailing whitespace from this value
         * and would answer "19 " with its own HTML 400: refuse it here, in
         * JSON (found by fuzz.request). */
        if (vl == 0 || ve != h + n)
            return reject(v, 400, "bad_request", "Content-Length",
                          "Content-Length must be a decimal byte count");
        unsigned long long x = 0;
        for (size_t i = 0; i < vl; i++) {
            if (!isdigit((unsigned char)val[i]))
                return reject(v, 400, "bad_request", "Content-Length",
                              "Content-Length must be a decimal byte count");
            /* Saturate: anything this large is over every limit. */
            x = x > (1ULL << 60) ? x : x * 10 + (unsigned)(val[i] - '0');
        }
        f->content_length = x;
    } else if (name_is(h, nl, "Host")) {
        f->host_n++;
    } else if (name_is(h, nl, "Cookie")) {
        /* libmicrohttpd keeps each cookie in the connection's memory: too
         * many exhaust it and it answers with HTML itself. */
        f->cookies++;
        for (const char *p = val; p < ve; p++)
            f->cookies += *p == ';';
    } else if (name_is(h, nl, "Transfer-Encoding")) {
        f->transfer_encoding_n++;
    }
    return GATE_OK;
}

int gate_check_head(const char *buf, size_t n, const gate_limits *lim, gate_verdict *v)
{
    /* The request line, rejected early when it cannot be HTTP (a TLS
     * hello on the plain port, binary noise) instead of waiting it out. */
    const char *nl = memchr(buf, '\n', n);
    size_t scan = nl ? (size_t)(nl - buf) : n;
    for (size_t i = 0; i < scan; i++) {
        unsigned char c = (unsigned char)buf[i];
        /* CR may end the line, or the bytes so far (LF still to come). */
        if (c == '\r' && i + 1 == scan) break;
        if (c < 0x20 || c == 0x7f)
            return reject(v, 400, "bad_request", NULL,
                          "the request line holds a control byte (not an HTTP/1.x request?)");
    }
    if (!nl) {
        if (n > lim->max_line)
            return reject(v, 414, "too_large", NULL, "request line over %zu bytes", lim->max_line);
        return GATE_MORE;
    }
    size_t ll = (size_t)(nl - buf) + 1;
    if (ll > lim->max_line)
        return reject(v, 414, "too_large", NULL, "request line over %zu bytes", lim->max_line);
    bool http11 = false;
    if (check_request_line(buf, ll, lim, &http11, v)) return GATE_REJECT;

    head_facts f = {0};
    int fields = 0;
    for (size_t off = ll;;) {
        const char *e = memchr(buf + off, '\n', n - off);
        size_t len = e ? (size_t)(e - (buf + off)) + 1 : n - off;
        if (off + len > lim->max_head)
            return reject(v, 431, "too_large", NULL, "request head over %zu bytes", lim->max_head);
        if (!e) return GATE_MORE;
        if (len < 2 || buf[off + len - 2] != '\r')
            return reject(v, 400, "bad_request", NULL, "header lines must end with CRLF");
        if (len == 2) break; /* the blank line: end of the head */
        if (++fields > lim->max_fields)
            return reject(v, 431, "too_large", NULL, "more than %d header fields", lim->max_fields);
        if (check_field(buf + off, len - 2, &f, v)) return GATE_REJECT;
        off += len;
    }
    if (f.cookies > lim->max_cookies)
        return reject(v, 431, "too_large", "Cookie", "more than %d cookies", lim->max_cookies);
    if (f.transfer_encoding_n && f.content_length_n)
        return reject(v, 400, "bad_request", "Transfer-Encoding",
                      "Content-Length and Transfer-Encoding together");
    if (f.transfer_encoding_n)
        return reject(v, 411, "length_required", "Transfer-Encoding",
                      "send the body with a Content-Length (Transfer-Encoding is not accepted)");
    if (f.host_n > 1 || (http11 && f.host_n != 1))
        return reject(v, 400, "bad_request", "Host", "an HTTP/1.1 request needs exactly one Host");
    if (f.content_length_n && f.content_length > lim->max_body)
        return reject(v, 413, "too_large", NULL, "request body over the %zu-byte limit",
                      lim->max_body);
    return GATE_OK;
}

/* ---- per-address accounting ------------------------------------------------------------- */

/* IPv4 addresses are counted as their IPv4-mapped IPv6 form. */
typedef struct ipkey {
    unsigned char a[16];
} ipkey;

typedef struct ipent {
    ipkey k;
    int n;
    struct ipent *next;
} ipent;

#define IP_BUCKETS 1024

/* A connection in the gate: its head is arriving (HEAD) or it was refused
 * and is being drained before close (DRAIN). */
typedef struct conn {
    int fd;
    bool draining;
    ipkey k;
    struct sockaddr_storage sa;
    socklen_t sl;
    int64_t deadline_ms;
    struct conn *prev, *next;
} conn;

struct gate {
    gate_config cfg;
    int lfd, efd, wake;
    struct MHD_Daemon *mhd;
    pthread_t th;
    bool running;
    atomic_bool stop;
    pthread_mutex_t mu; /* the address table: the gate thread and MHD's threads */
    ipent *tab[IP_BUCKETS];
    conn *list; /* the gate thread's own */
    int nconns;
    int64_t accept_paused_until;
    char *peek; /* max_head + 1 bytes */
};

/* What the daemon keeps per TCP connection (its "socket context"). */
typedef struct conn_ctx {
    ipkey k;
    bool counted;
    bool bad_target;
} conn_ctx;

static void key_of(const struct sockaddr *sa, ipkey *k)
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

/* Takes one connection for k; refuses (false) at the limit when enforce. */
static bool ip_take(gate *g, const ipkey *k, bool enforce)
{
    unsigned b = key_hash(k);
    bool ok = true;
    pthread_mutex_lock(&g->mu);
    ipent *e = g->tab[b];
    while (e && memcmp(&e->k, k, sizeof *k))
        e = e->next;
    if (!e && (e = calloc(1, sizeof *e))) {
        e->k = *k;
        e->next = g->tab[b];
        g->tab[b] = e;
    }
    if (!e)
        ok = !enforce;
    else if (enforce && g->cfg.per_ip > 0 && e->n >= g->cfg.per_ip)
        ok = false;
    else
        e->n++;
    pthread_mutex_unlock(&g->mu);
    return ok;
}

static void ip_give(gate *g, const ipkey *k)
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

void gate_notify(void *cls, struct MHD_Connection *c, void **socket_ctx,
                 enum MHD_ConnectionNotificationCode toe)
{
    gate *g = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_ctx *x = calloc(1, sizeof *x);
        if (!x) return;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        key_of(ci ? ci->client_addr : NULL, &x->k);
        x->counted = ip_take(g, &x->k, false);
        *socket_ctx = x;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_ctx *x = *socket_ctx;
        if (!x) return;
        if (x->counted) ip_give(g, &x->k);
        free(x);
        *socket_ctx = NULL;
    }
}

size_t gate_unescape(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    size_t n = MHD_http_unescape(s);
    if (gate_has_ctl(s, n)) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        conn_ctx *x = ci ? ci->socket_context : NULL;
        if (x) x->bad_target = true;
    }
    return n;
}

bool gate_take_bad_target(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn_ctx *x = ci ? ci->socket_context : NULL;
    if (!x || !x->bad_target) return false;
    x->bad_target = false;
    return true;
}

/* ---- the thread ------------------------------------------------------------------------- */

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

static void conn_unlink(gate *g, conn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        g->list = c->next;
    if (c->next) c->next->prev = c->prev;
    g->nconns--;
}

static void conn_close(gate *g, conn *c)
{
    epoll_ctl(g->efd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (!c->draining) ip_give(g, &c->k);
    conn_unlink(g, c);
    free(c);
}

/* Reads and drops what is there; false once the peer has closed. */
static bool drain(int fd)
{
    char sink[4096];
    for (;;) {
        ssize_t r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (r > 0) continue;
        if (r == 0) return false;
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    }
}

/* Refuses c: the JSON error, then a short drain before the close. */
static void conn_refuse(gate *g, conn *c, unsigned status, const char *code, const char *field,
                        const char *msg)
{
    bool open = drain(c->fd);
    /* Under TLS a plain-text answer would only confuse the client. */
    if (g->cfg.inspect) send_error(c->fd, status, code, field, msg);
    shutdown(c->fd, SHUT_WR);
    if (!c->draining) ip_give(g, &c->k);
    c->draining = true;
    c->deadline_ms = ty_now_ms() + 1000;
    if (!open) conn_close(g, c);
}

static void conn_handover(gate *g, conn *c)
{
    /* At its limit the daemon would close the socket without a word. */
    const union MHD_DaemonInfo *di =
        g->cfg.max_served ? MHD_get_daemon_info(g->mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS) : NULL;
    if (di && di->num_connections >= g->cfg.max_served) {
        conn_refuse(g, c, 503, "too_many_connections", NULL,
                    "the server is at its connection limit; retry shortly");
        return;
    }
    epoll_ctl(g->efd, EPOLL_CTL_DEL, c->fd, NULL);
    /* The daemon takes the socket (and closes it on failure); its
     * STARTED notification counts the address before we give ours back. */
    MHD_add_connection(g->mhd, c->fd, (struct sockaddr *)&c->sa, c->sl);
    ip_give(g, &c->k);
    conn_unlink(g, c);
    free(c);
}

static void conn_readable(gate *g, conn *c, uint32_t events)
{
    if (c->draining) {
        if (!drain(c->fd)) conn_close(g, c);
        return;
    }
    size_t cap = g->cfg.lim.max_head + 1;
    ssize_t r = recv(c->fd, g->peek, cap, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        conn_close(g, c);
        return;
    }
    if (r < 0) return;
    gate_verdict v;
    int rc = gate_check_head(g->peek, (size_t)r, &g->cfg.lim, &v);
    if (rc == GATE_OK)
        conn_handover(g, c);
    else if (rc == GATE_REJECT)
        conn_refuse(g, c, v.status, v.code, v.field, v.msg);
    /* The peer is done sending and the head is not complete: it never
     * will be (its unread bytes hide the end of file from the peek). It
     * may still be reading, so it gets the answer. */
    else if (events & (EPOLLHUP | EPOLLERR))
        conn_close(g, c);
    else if (events & EPOLLRDHUP)
        conn_refuse(g, c, 400, "bad_request", NULL,
                    "the connection ended inside the request head (no blank line after it)");
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
        conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->sa = sa;
        c->sl = sl;
        key_of((struct sockaddr *)&sa, &c->k);
        c->deadline_ms = ty_now_ms() + g->cfg.head_timeout_ms;
        c->next = g->list;
        if (g->list) g->list->prev = c;
        g->list = c;
        g->nconns++;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = c};
        if (g->nconns > 2 * g->cfg.max_pending || epoll_ctl(g->efd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            /* Even the refusals are too many to keep: just close. */
            c->draining = true;
            conn_close(g, c);
            continue;
        }
        if (!ip_take(g, &c->k, true)) {
            c->draining = true; /* nothing taken, nothing to give back */
            char m[128];
            snprintf(m, sizeof m, "too many connections from this address (limit %d)",
                     g->cfg.per_ip);
            conn_refuse(g, c, 429, "too_many_connections", NULL, m);
            continue;
        }
        if (g->nconns > g->cfg.max_pending) {
            conn_refuse(g, c, 503, "too_many_connections", NULL,
                        "the server has too many connections sending their request");
            continue;
        }
        if (!g->cfg.inspect) conn_handover(g, c);
    }
}

/* Head deadlines and drain deadlines. */
static void expire(gate *g)
{
    int64_t now = ty_now_ms();
    for (conn *c = g->list, *next; c; c = next) {
        next = c->next;
        if (now < c->deadline_ms) continue;
        if (c->draining) {
            conn_close(g, c);
        } else {
            char m[128];
            snprintf(m, sizeof m, "the request head did not arrive within %d ms",
                     g->cfg.head_timeout_ms);
            conn_refuse(g, c, 408, "request_timeout", NULL, m);
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
        int timeout = g->list || g->accept_paused_until ? 50 : -1;
        int n = epoll_wait(g->efd, evs, 64, timeout);
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
         * conns it just made), and each fd is in a batch once, so no
         * event above named a freed conn. */
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
    if (g->running) {
        atomic_store(&g->stop, true);
        uint64_t one = 1;
        ssize_t w = write(g->wake, &one, sizeof one);
        (void)w;
        pthread_join(g->th, NULL);
        g->running = false;
    }
    while (g->list) {
        g->list->draining = true; /* the table is freed below */
        conn_close(g, g->list);
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
    for (int b = 0; b < IP_BUCKETS; b++)
        for (ipent *e = g->tab[b], *n; e; e = n) {
            n = e->next;
            free(e);
        }
    pthread_mutex_destroy(&g->mu);
    free(g->peek);
    free(g);
}
