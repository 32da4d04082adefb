/* sse.c — the SSE hub (see sse.h): subscriber queues of shared messages,
 * database replay inside the content callback, heartbeats and log follow.
 *
 * Fan-out rounds: with 1000 clients on one job, the cost of an event is
 * one send() per client, and the kernel's loopback/TCP path dominates it.
 * When events come faster than one pass over the clients, resuming a client
 * again for each new event (while others have not yet had the previous one)
 * only multiplies the sends. So resumes go in rounds: a publish with no
 * round in progress resumes every waiting client at once (no added delay);
 * a publish during a round only queues, and when the last client of the
 * round has been called back, one new round resumes everyone with queued
 * messages, who then get all of them in one send. Under load each send
 * carries several events; when the server keeps up it is one event a send,
 * as before. A client is "in the round" from its resume until its next
 * callback (or its end), which MHD runs promptly whether or not its socket
 * has room, so a slow reader cannot hold a round open; the ticker also
 * restarts a round that looks stuck (it cannot, but a missed count must not
 * stall every stream).
 *
 * Locking: hub->mu guards the client list; each client's mu guards its
 * queue and flags; round_mu guards the round counters. Order: hub->mu, then
 * a client's mu, then round_mu. Callbacks take their client's mu, and
 * round_mu (or, to start a round, hub->mu) with no other lock held. */
#include "sse.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "state.h"
#include "tyutil.h"

#define SSE_QCAP 4096         /* messages a client may lag behind */
#define SSE_BLOCK (64 * 1024) /* bytes per callback */
#define SSE_REPLAY_BATCH 512
#define SSE_LOG_TICK_MS 250

typedef enum { SSE_JOB, SSE_GLOBAL, SSE_LOG } sse_kind;

typedef struct sse_msg {
    atomic_int ref;
    int64_t id;    /* 0 = no id (heartbeat, live-only) */
    bool terminal; /* a job's final state event */
    size_t len;
    char data[];
} sse_msg;

typedef struct sse_client {
    sse_hub *hub;
    struct MHD_Connection *conn;
    sse_kind kind;
    int64_t job_id;
    pthread_mutex_t mu;
    sse_msg **q;
    int qhead, qlen;
    bool suspended, dropped;
    bool in_round; /* resumed by the current round, not yet called back */
    /* Touched only by the connection's callback thread: */
    bool replaying, ended;
    int64_t last_id;
    sse_msg *cur;
    size_t cur_off;
    db_event *replay;
    int replay_i, replay_n;
    int log_fd;
    struct sse_client *prev, *next;
} sse_client;

struct sse_hub {
    srv *s;
    pthread_mutex_t mu;
    pthread_cond_t gone;
    sse_client *head;
    int64_t nclients;
    bool closing;
    pthread_mutex_t round_mu;
    int round_left;   /* clients of the current round not yet called back */
    bool round_dirty; /* messages were queued for waiting clients meanwhile */
    int64_t round_start_ms;
    pthread_t ticker;
    pthread_mutex_t tick_mu;
    pthread_cond_t tick_cond;
    bool tick_stop;
};

static sse_msg *msg_new(const char *data, size_t len, int64_t id, bool terminal)
{
    sse_msg *m = malloc(sizeof *m + len + 1);
    if (!m) return NULL;
    atomic_init(&m->ref, 1);
    m->id = id;
    m->terminal = terminal;
    m->len = len;
    memcpy(m->data, data, len);
    m->data[len] = 0;
    return m;
}

static void msg_unref(sse_msg *m)
{
    if (m && atomic_fetch_sub(&m->ref, 1) == 1) free(m);
}

char *sse_format_event(const db_event *ev, int global, size_t *len)
{
    char ts[32];
    srv_time_fmt(ev->ts_ms, ts);
    size_t cap = strlen(ev->data) + 256;
    char *out = malloc(cap);
    if (!out) return NULL;
    char job[24] = "null";
    if (ev->job_id > 0) snprintf(job, sizeof job, "%lld", (long long)ev->job_id);
    int n = snprintf(out, cap,
                     "id: %lld\nevent: %s\ndata: {\"job_id\":%s,\"seq\":%lld,\"id\":%lld,"
                     "\"ts\":\"%s\",\"type\":\"%s\",\"data\":%s}\n\n",
                     (long long)(global ? ev->id : ev->seq), ev->type, job, (long long)ev->seq,
                     (long long)ev->id, ts, ev->type, ev->data);
    *len = (size_t)n;
    return out;
}

static bool event_is_terminal(const db_event *ev)
{
    if (strcmp(ev->type, "state")) return false;
    json_t *o = json_loads(ev->data, 0, NULL);
    int to = db_state_parse(json_string_value(json_object_get(o, "to")));
    json_decref(o);
    return to >= 0 && db_state_terminal((job_state)to);
}

static bool is_global_type(const char *t)
{
    return !strcmp(t, "state") || !strcmp(t, "started") || !strcmp(t, "gpu");
}

/* Resumes suspended client c as part of the current round. Caller holds
 * c->mu. */
static void client_resume_in_round(sse_hub *h, sse_client *c)
{
    pthread_mutex_lock(&h->round_mu);
    if (h->round_left++ == 0) h->round_start_ms = ty_mono_ms();
    pthread_mutex_unlock(&h->round_mu);
    c->in_round = true;
    c->suspended = false;
    MHD_resume_connection(c->conn);
}

/* Starts a round: resumes every waiting client that has something queued
 * (or must end). Called with no lock held. */
static void round_start(sse_hub *h)
{
    pthread_mutex_lock(&h->mu);
    for (sse_client *c = h->head; c; c = c->next) {
        if (c->kind == SSE_LOG) continue;
        pthread_mutex_lock(&c->mu);
        if (c->suspended && (c->qlen > 0 || c->dropped)) client_resume_in_round(h, c);
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&h->mu);
}

/* c was called back (or ended) after its round's resume. The last client of
 * a round starts the next one if messages were queued meanwhile. */
static void round_visited(sse_hub *h)
{
    pthread_mutex_lock(&h->round_mu);
    bool next = --h->round_left == 0 && h->round_dirty;
    if (next) h->round_dirty = false;
    pthread_mutex_unlock(&h->round_mu);
    if (next) round_start(h);
}

/* Appends m to c's queue, or drops c when it is full; resumes c now unless
 * a round is in progress (see the top of this file). Caller holds hub->mu. */
static void client_enqueue(sse_hub *h, sse_client *c, sse_msg *m)
{
    pthread_mutex_lock(&c->mu);
    if (!c->dropped) {
        if (c->qlen == SSE_QCAP) {
            c->dropped = true; /* too slow: the callback ends the stream */
        } else {
            atomic_fetch_add(&m->ref, 1);
            c->q[(c->qhead + c->qlen++) % SSE_QCAP] = m;
        }
    }
    if (c->suspended) {
        pthread_mutex_lock(&h->round_mu);
        bool wait = h->round_left > 0 && !c->dropped;
        if (wait) h->round_dirty = true;
        pthread_mutex_unlock(&h->round_mu);
        if (!wait) client_resume_in_round(h, c);
    }
    pthread_mutex_unlock(&c->mu);
}

void sse_hub_publish(sse_hub *h, const db_event *ev)
{
    sse_msg *jm = NULL, *gm = NULL;
    bool global = is_global_type(ev->type);
    pthread_mutex_lock(&h->mu);
    for (sse_client *c = h->head; c; c = c->next) {
        sse_msg **mp;
        bool g = c->kind == SSE_GLOBAL;
        if (c->kind == SSE_JOB && c->job_id == ev->job_id && ev->job_id > 0)
            mp = &jm;
        else if (g && global)
            mp = &gm;
        else
            continue;
        if (!*mp) {
            size_t len;
            char *txt = sse_format_event(ev, g, &len);
            if (!txt) continue;
            *mp = msg_new(txt, len, g ? ev->id : ev->seq, !g && event_is_terminal(ev));
            free(txt);
            if (!*mp) continue;
        }
        client_enqueue(h, c, *mp);
    }
    pthread_mutex_unlock(&h->mu);
    msg_unref(jm);
    msg_unref(gm);
}

void sse_hub_publish_live(sse_hub *h, const char *type, const char *data_json)
{
    char ts[32];
    srv_time_fmt(ty_now_ms(), ts);
    size_t cap = strlen(data_json) + 160;
    char *txt = malloc(cap);
    if (!txt) return;
    int n = snprintf(txt, cap,
                     "event: %s\ndata: {\"job_id\":null,\"seq\":null,\"id\":null,\"ts\":\"%s\","
                     "\"type\":\"%s\",\"data\":%s}\n\n",
                     type, ts, type, data_json);
    sse_msg *m = msg_new(txt, (size_t)n, 0, false);
    free(txt);
    if (!m) return;
    pthread_mutex_lock(&h->mu);
    for (sse_client *c = h->head; c; c = c->next)
        if (c->kind == SSE_GLOBAL) client_enqueue(h, c, m);
    pthread_mutex_unlock(&h->mu);
    msg_unref(m);
}

/* Next replayed message, fetching from the database in batches; NULL when
 * the replay has caught up (c->replaying becomes false). */
static sse_msg *next_replayed(sse_client *c)
{
    if (c->replay_i == c->replay_n) {
        db_events_free(c->replay, c->replay_n);
        c->replay = NULL;
        c->replay_i = c->replay_n = 0;
        db *d = srv_db(c->hub->s);
        ty_err err = {0};
        bool terminal = false;
        if (!d) {
            c->replaying = false;
            return NULL;
        }
        if (c->kind == SSE_JOB) {
            /* State first, events second: if the job was already finished,
             * this replay includes its terminal event. */
            db_job j;
            if (db_job_get(d, c->job_id, &j, &err) == 0) {
                terminal = db_state_terminal(j.state);
                db_job_free(&j);
            } else {
                terminal = true; /* deleted meanwhile */
            }
            db_events_job(d, c->job_id, c->last_id, SSE_REPLAY_BATCH, &c->replay, &c->replay_n,
                          &err);
        } else {
            db_events_global(d, c->last_id, SSE_REPLAY_BATCH, &c->replay, &c->replay_n, &err);
        }
        if (c->replay_n == 0) {
            c->replaying = false;
            if (terminal) c->ended = true;
            return NULL;
        }
    }
    db_event *ev = &c->replay[c->replay_i++];
    bool g = c->kind == SSE_GLOBAL;
    size_t len;
    char *txt = sse_format_event(ev, g, &len);
    if (!txt) return NULL;
    sse_msg *m = msg_new(txt, len, g ? ev->id : ev->seq, !g && event_is_terminal(ev));
    free(txt);
    return m;
}

static ssize_t events_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    sse_client *c = cls;
    size_t n = 0;
    pthread_mutex_lock(&c->mu);
    bool was_in_round = c->in_round;
    c->in_round = false;
    pthread_mutex_unlock(&c->mu);
    if (was_in_round) round_visited(c->hub);
    for (;;) {
        if (c->cur) {
            size_t k = c->cur->len - c->cur_off;
            if (k > max - n) k = max - n;
            memcpy(buf + n, c->cur->data + c->cur_off, k);
            n += k;
            c->cur_off += k;
            if (c->cur_off < c->cur->len) break; /* buffer full */
            if (c->cur->terminal) c->ended = true;
            msg_unref(c->cur);
            c->cur = NULL;
            continue;
        }
        if (c->ended) break;
        sse_msg *m = NULL;
        if (c->replaying) {
            m = next_replayed(c);
            if (!m && c->replaying) break; /* out of memory: try later */
        }
        if (!m && !c->ended) {
            pthread_mutex_lock(&c->mu);
            if (c->dropped || c->hub->closing) {
                pthread_mutex_unlock(&c->mu);
                return n ? (ssize_t)n : MHD_CONTENT_READER_END_WITH_ERROR;
            }
            if (c->qlen > 0) {
                m = c->q[c->qhead];
                c->qhead = (c->qhead + 1) % SSE_QCAP;
                c->qlen--;
            } else if (n == 0) {
                /* Nothing to send: park the connection until a publisher
                 * or the heartbeat resumes it. */
                c->suspended = true;
                MHD_suspend_connection(c->conn);
                pthread_mutex_unlock(&c->mu);
                return 0;
            }
            pthread_mutex_unlock(&c->mu);
            if (!m) break;
        }
        if (!m) continue;
        /* Already delivered by the replay: skip. Heartbeats have id 0. */
        if (m->id > 0 && m->id <= c->last_id) {
            msg_unref(m);
            continue;
        }
        if (m->id > 0) c->last_id = m->id;
        c->cur = m;
        c->cur_off = 0;
    }
    if (n == 0 && c->ended) return MHD_CONTENT_READER_END_OF_STREAM;
    return (ssize_t)n;
}

static bool job_finished(sse_client *c)
{
    db_job j;
    ty_err err = {0};
    db *d = srv_db(c->hub->s);
    if (!d || db_job_get(d, c->job_id, &j, &err) != 0) return true; /* gone */
    bool done = db_state_terminal(j.state);
    db_job_free(&j);
    return done;
}

static ssize_t log_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    sse_client *c = cls;
    ssize_t k = pread(c->log_fd, buf, max, (off_t)pos);
    if (k > 0) return k;
    if (k < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    /* At the end of the file. The state is read before reading again so a
     * job that finished meanwhile still has its last lines sent. */
    if (job_finished(c)) {
        k = pread(c->log_fd, buf, max, (off_t)pos);
        return k > 0 ? k : MHD_CONTENT_READER_END_OF_STREAM;
    }
    pthread_mutex_lock(&c->mu);
    if (c->hub->closing) {
        pthread_mutex_unlock(&c->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    /* The ticker resumes followed logs every SSE_LOG_TICK_MS. */
    c->suspended = true;
    MHD_suspend_connection(c->conn);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

static void client_free_cb(void *cls)
{
    sse_client *c = cls;
    sse_hub *h = c->hub;
    pthread_mutex_lock(&h->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        h->head = c->next;
    if (c->next) c->next->prev = c->prev;
    h->nclients--;
    pthread_cond_broadcast(&h->gone);
    pthread_mutex_unlock(&h->mu);
    if (c->in_round) round_visited(h);
    for (int i = 0; i < c->qlen; i++)
        msg_unref(c->q[(c->qhead + i) % SSE_QCAP]);
    msg_unref(c->cur);
    db_events_free(c->replay, c->replay_n);
    if (c->log_fd >= 0) close(c->log_fd);
    pthread_mutex_destroy(&c->mu);
    free(c->q);
    free(c);
}

static enum MHD_Result serve(sse_hub *h, struct MHD_Connection *conn, sse_client *c,
                             const char *ctype)
{
    MHD_ContentReaderCallback cb = c->kind == SSE_LOG ? log_cb : events_cb;
    pthread_mutex_lock(&h->mu);
    if (h->closing) {
        pthread_mutex_unlock(&h->mu);
        if (c->log_fd >= 0) close(c->log_fd);
        free(c->q);
        free(c);
        return MHD_NO;
    }
    /* Subscribe before the first callback runs, i.e. before any replay. */
    c->next = h->head;
    if (h->head) h->head->prev = c;
    h->head = c;
    h->nclients++;
    pthread_mutex_unlock(&h->mu);
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, cb, c, client_free_cb);
    if (!r) {
        client_free_cb(c);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    /* A stream ends its connection: it is never handed back to the gate
     * for a next request (gate.h). */
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

static sse_client *client_new(sse_hub *h, struct MHD_Connection *conn, sse_kind kind,
                              int64_t job_id)
{
    sse_client *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->q = kind == SSE_LOG ? NULL : calloc(SSE_QCAP, sizeof *c->q);
    if (kind != SSE_LOG && !c->q) {
        free(c);
        return NULL;
    }
    c->hub = h;
    c->conn = conn;
    c->kind = kind;
    c->job_id = job_id;
    c->log_fd = -1;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

enum MHD_Result sse_hub_serve_events(sse_hub *h, struct MHD_Connection *conn, int64_t job_id,
                                     int64_t from)
{
    sse_client *c = client_new(h, conn, job_id > 0 ? SSE_JOB : SSE_GLOBAL, job_id);
    if (!c) return MHD_NO;
    if (from >= 0) {
        c->replaying = true;
        c->last_id = from;
    } else {
        /* Live only: start after whatever is committed now. */
        c->last_id = 0;
    }
    return serve(h, conn, c, "text/event-stream");
}

enum MHD_Result sse_hub_serve_log(sse_hub *h, struct MHD_Connection *conn, int64_t job_id,
                                  const char *path)
{
    sse_client *c = client_new(h, conn, SSE_LOG, job_id);
    if (!c) return MHD_NO;
    c->log_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (c->log_fd < 0) c->log_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return serve(h, conn, c, "text/plain; charset=utf-8");
}

int64_t sse_hub_clients(sse_hub *h)
{
    pthread_mutex_lock(&h->mu);
    int64_t n = h->nclients;
    pthread_mutex_unlock(&h->mu);
    return n;
}

/* Heartbeats for event streams; periodic wake-ups for followed logs. */
static void *ticker_main(void *arg)
{
    sse_hub *h = arg;
    int64_t next_hb = ty_mono_ms() + h->s->cfg.heartbeat_s * 1000LL;
    pthread_mutex_lock(&h->tick_mu);
    while (!h->tick_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SSE_LOG_TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&h->tick_cond, &h->tick_mu, &ts);
        if (h->tick_stop) break;
        bool hb = ty_mono_ms() >= next_hb;
        if (hb) next_hb = ty_mono_ms() + h->s->cfg.heartbeat_s * 1000LL;
        sse_msg *m = hb ? msg_new(": hb\n\n", 6, 0, false) : NULL;
        pthread_mutex_lock(&h->mu);
        for (sse_client *c = h->head; c; c = c->next) {
            if (c->kind == SSE_LOG) {
                pthread_mutex_lock(&c->mu);
                if (c->suspended) {
                    c->suspended = false;
                    MHD_resume_connection(c->conn);
                }
                pthread_mutex_unlock(&c->mu);
            } else if (m) {
                client_enqueue(h, c, m);
            }
        }
        pthread_mutex_unlock(&h->mu);
        msg_unref(m);
        /* A round open for a second with messages waiting: start the next
         * one anyway (a lost count would otherwise hold every stream). */
        pthread_mutex_lock(&h->round_mu);
        bool stuck = h->round_dirty && h->round_left > 0 && ty_mono_ms() - h->round_start_ms > 1000;
        if (stuck) h->round_dirty = false;
        pthread_mutex_unlock(&h->round_mu);
        if (stuck) round_start(h);
    }
    pthread_mutex_unlock(&h->tick_mu);
    return NULL;
}

sse_hub *sse_hub_new(srv *s, ty_err *err)
{
    sse_hub *h = calloc(1, sizeof *h);
    if (!h) {
        ty_err_set(err, TY_ENOMEM, "out of memory");
        return NULL;
    }
    h->s = s;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->gone, NULL);
    pthread_mutex_init(&h->tick_mu, NULL);
    pthread_cond_init(&h->tick_cond, NULL);
    pthread_mutex_init(&h->round_mu, NULL);
    if (pthread_create(&h->ticker, NULL, ticker_main, h)) {
        free(h);
        ty_err_set(err, TY_EINTERNAL, "cannot start the SSE ticker thread");
        return NULL;
    }
    return h;
}

void sse_hub_shutdown(sse_hub *h)
{
    pthread_mutex_lock(&h->tick_mu);
    h->tick_stop = true;
    pthread_cond_broadcast(&h->tick_cond);
    pthread_mutex_unlock(&h->tick_mu);
    pthread_join(h->ticker, NULL);
    /* MHD must not be stopped with suspended connections: wake them all so
     * their callbacks see `closing` and end. */
    pthread_mutex_lock(&h->mu);
    h->closing = true;
    for (sse_client *c = h->head; c; c = c->next) {
        pthread_mutex_lock(&c->mu);
        if (c->suspended) {
            c->suspended = false;
            MHD_resume_connection(c->conn);
        }
        pthread_mutex_unlock(&c->mu);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 3;
    while (h->nclients > 0 && pthread_cond_timedwait(&h->gone, &h->mu, &ts) == 0) {
    }
    pthread_mutex_unlock(&h->mu);
}

void sse_hub_free(sse_hub *h)
{
    if (!h) return;
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->gone);
    pthread_mutex_destroy(&h->tick_mu);
    pthread_cond_destroy(&h->tick_cond);
    pthread_mutex_destroy(&h->round_mu);
    free(h);
}
