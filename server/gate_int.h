/* gate_int.h — what the gate's files share (gate.c: accept, per-address
 * limits, fair shares and the thread; gate_keep.c: the request cycle of a
 * connection inside libmicrohttpd and its keep-alive; gate_tls.c: the
 * guard on what the daemon writes under TLS). Not for other callers:
 * gate.h is the interface. */
#ifndef TY_GATE_INT_H
#define TY_GATE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "gate.h"

/* IPv4 addresses are counted as their IPv4-mapped IPv6 form. */
typedef struct ipkey {
    unsigned char a[16];
} ipkey;

typedef struct ipent {
    ipkey k;
    int n;    /* connections held, in the gate and in the daemon (under gate.mu) */
    int pend; /* of those, new ones whose head is arriving (the gate thread's) */
    struct ipent *next;
} ipent;

#define IP_BUCKETS 1024

typedef struct conn_ctx conn_ctx;

/* A connection in the gate: a new one whose head is arriving, one refused
 * and drained before close (draining), or a kept one (x set): the
 * daemon's, suspended between two requests until its next head is
 * checked. */
typedef struct conn {
    int fd;
    bool draining;
    bool started; /* kept: the next head has begun (its deadline runs) */
    bool evicted; /* dropped for a fair share: not counted in nconns */
    ipent *ip;    /* new: its address entry, counted in ip->pend */
    conn_ctx *x;  /* kept: the daemon's context of the connection */
    ipkey k;
    struct sockaddr_storage sa;
    socklen_t sl;
    int64_t deadline_ms;
    struct conn *prev, *next;
} conn;

/* What a new connection's checked heads tell the daemon's side (by fd,
 * from the hand-over to the daemon's STARTED notification). */
typedef struct handoff {
    int fd, credits;
    bool close_after;
    unsigned long long end;
    struct handoff *next;
} handoff;

/* What the daemon keeps per TCP connection (its "socket context"). The
 * request-cycle fields are the daemon thread's while the connection is
 * in the daemon, the gate thread's while it is suspended in the gate. */
struct conn_ctx {
    gate *g;
    struct MHD_Connection *mc;
    int fd;
    ipkey k;
    bool counted;
    bool bad_target;
    int credits;                    /* checked heads the daemon has not begun */
    unsigned long long checked_end; /* stream offset where those end */
    bool close_after;               /* a later head was refused: close after the credited ones */
    bool cur_checked;               /* the request being served passed the gate */
    bool in_head;                   /* between gate_request_begin and gate_request_head_done */
    bool client_close;              /* HTTP/1.0 or Connection: close */
    bool keep;                      /* its answer keeps the connection */
    bool refused;                   /* the gate refused the next head: drop it */
    bool registered;                /* its fd is in the gate's epoll set (one-shot) */
    struct conn *kc;                /* the gate's conn for it while kept, reused */
    bool handler_seen;              /* the access handler was called on this connection */
    void *tls;                      /* gnutls_session_t under TLS (gate_tls.c) */
    unsigned char tls_hdr[5];
    int tls_hn;          /* bytes of tls_hdr read */
    size_t tls_left;     /* bytes left of the current record */
    int tls_app_records; /* application-data records the client sent */
};

struct gate {
    gate_config cfg;
    int lfd, efd, wake;
    struct MHD_Daemon *mhd;
    pthread_t th;
    bool running;
    atomic_bool stop;
    pthread_mutex_t mu; /* the address table, handoffs, inbox, closing */
    ipent *tab[IP_BUCKETS];
    handoff *handoffs;
    conn *inbox;  /* kept connections the daemon's threads gave back */
    bool closing; /* gate_stop began: keep nothing more */
    conn *list;   /* the gate thread's own */
    int nconns;   /* new and draining connections in list */
    int npending; /* new ones whose head is arriving */
    int64_t accept_paused_until;
    char *peek;          /* max_head + 1 bytes */
    char keep_alive[32]; /* the Keep-Alive header of kept answers: "timeout=N" */
};

conn_ctx *gate_ctx_of(struct MHD_Connection *c);
void gate_key_of(const struct sockaddr *sa, ipkey *k);
ipent *gate_ip_take(gate *g, const ipkey *k, bool enforce);
void gate_ip_give(gate *g, const ipkey *k);

/* The heads in buf: gate_check_head's answer for the first one; when it
 * is acceptable, *credits counts it and the acceptable complete heads
 * after it, *end is the stream length they take with their bodies, and
 * *close_after says a later one was refused. */
int gate_scan_heads(gate *g, const char *buf, size_t n, int *credits, unsigned long long *end,
                    bool *close_after, gate_verdict *v);

void gate_conn_link(gate *g, conn *c);
void gate_conn_unlink(gate *g, conn *c);
void gate_conn_close(gate *g, conn *c);
void gate_conn_refuse(gate *g, conn *c, unsigned status, const char *code, const char *field,
                      const char *msg);
bool gate_drain(int fd);

/* gate_keep.c: kept connections in the gate thread. */
void gate_adopt_kept(gate *g);
void gate_kept_readable(gate *g, conn *c, uint32_t events);
/* Arms c's one-shot registration for its next event. */
void gate_kept_rearm(gate *g, conn *c);
/* Hands c back to the daemon (drop: it is to close the connection). */
void gate_kept_release(gate *g, conn *c, bool drop);

/* gate_tls.c: under TLS, the daemon's own answers are not sent. */
void gate_tls_guard(conn_ctx *x);

#endif
