/* http.c — `trainyard serve`: starts the database, event writer, SSE hub and
 * scheduler, then answers HTTP on libmicrohttpd until SIGINT/SIGTERM.
 *
 * libmicrohttpd runs a small pool of epoll threads; streams are suspended
 * connections (sse.c), so no thread is ever tied to one client. This file
 * also holds what requests share: body accumulation with the size limit,
 * bearer-token checks and the JSON error helpers. */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec.h"
#include "sse.h"
#include "upload.h"
#include "tyutil.h"

/* ---- shared server plumbing --------------------------------------------------------- */

static void db_key_free(void *p) { db_close(p); }

db *srv_db(srv *s)
{
    db *d = pthread_getspecific(s->db_key);
    if (d) return d;
    ty_err err = {0};
    if (db_open(s->db_path, &d, &err)) {
        fprintf(stderr, "trainyard: %s\n", err.msg);
        return NULL;
    }
    pthread_setspecific(s->db_key, d);
    return d;
}

void srv_publish(srv *s, const db_event *ev)
{
    sse_hub_publish(s->hub, ev);
}

static void writer_publish(void *ctx, const db_event *ev)
{
    srv *s = ctx;
    atomic_fetch_add(&s->events_ingested, 1);
    sse_hub_publish(s->hub, ev);
}

int srv_transition(srv *s, int64_t id, unsigned from_mask, job_state to, const char *reason,
                   const db_job_update *upd, job_state *from_out, ty_err *err)
{
    db *d = srv_db(s);
    if (!d) return ty_err_set(err, TY_EIO, "database unavailable");
    db_event ev;
    pthread_mutex_lock(&s->write_lock);
    /* The job's engine events queued so far come before its state change. */
    ty_err ferr = {0};
    evw_flush_locked(s->evw, &ferr);
    int rc = db_job_transition(d, id, from_mask, to, reason, upd, from_out, &ev, err);
    if (rc == 0) {
        srv_publish(s, &ev);
        db_event_clear(&ev);
    }
    pthread_mutex_unlock(&s->write_lock);
    return rc;
}

void srv_job_dir(const srv *s, int64_t id, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%lld", s->jobs_dir, (long long)id);
}

/* ---- responses -------------------------------------------------------------------------- */

enum MHD_Result http_bytes(http_req *q, unsigned status, const char *ctype, const void *data,
                           size_t len, bool copy)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, (void *)data, copy ? MHD_RESPMEM_MUST_COPY : MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    if (ctype) MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result ok = MHD_queue_response(q->conn, status, r);
    MHD_destroy_response(r);
    q->answered = true;
    return ok;
}

enum MHD_Result http_json(http_req *q, unsigned status, json_t *body)
{
    char *txt = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!txt) return MHD_NO;
    size_t n = strlen(txt);
    struct MHD_Response *r = MHD_create_response_from_buffer(n, txt, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(txt);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ok = MHD_queue_response(q->conn, status, r);
    MHD_destroy_response(r);
    q->answered = true;
    return ok;
}

enum MHD_Result http_error(http_req *q, unsigned status, const char *code, const char *field,
                           const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *e = json_pack("{ss ss}", "code", code, "message", msg);
    if (field && *field) json_object_set_new(e, "field", json_string(field));
    return http_json(q, status, json_pack("{so}", "error", e));
}

enum MHD_Result http_ty_error(http_req *q, const ty_err *err)
{
    switch (err->code) {
    case TY_ENOENT: return http_error(q, 404, "not_found", err->field, "%s", err->msg);
    case TY_ESTATE: return http_error(q, 409, "conflict", err->field, "%s", err->msg);
    case TY_EINVAL: return http_error(q, 400, "invalid_spec", err->field, "%s", err->msg);
    default: return http_error(q, 500, "internal", NULL, "%s", err->msg);
    }
}

const char *http_arg(http_req *q, const char *key)
{
    return MHD_lookup_connection_value(q->conn, MHD_GET_ARGUMENT_KIND, key);
}

/* ---- auth ------------------------------------------------------------------------------- */

static bool authorized(http_req *q)
{
    const char *h = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, "Authorization");
    const char *tok = NULL;
    if (h && !strncasecmp(h, "Bearer ", 7)) tok = h + 7;
    /* Browsers cannot set headers on EventSource: the dashboard may pass the
     * token as ?access_token= instead. */
    if (!tok) tok = http_arg(q, "access_token");
    if (!tok || strncmp(tok, "ty_", 3)) return false;
    db *d = srv_db(q->s);
    char(*hashes)[65] = NULL;
    int n = 0;
    ty_err err = {0};
    if (!d || db_token_hashes(d, &hashes, &n, &err)) return false;
    bool ok = srv_token_matches(tok, (const char(*)[65])hashes, n);
    free(hashes);
    return ok;
}

/* ---- request handling ---------------------------------------------------------------------- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls)
{
    (void)version;
    srv *s = cls;
    http_req *q = *con_cls;
    if (!q) {
        q = calloc(1, sizeof *q);
        if (!q) return MHD_NO;
        *con_cls = q;
        q->s = s;
        q->conn = conn;
        q->method = method;
        q->url = url;
        atomic_fetch_add(&s->http_requests, 1);
        q->route = routes_match(q, method, url);
        if (q->route == -1)
            return http_error(q, 404, "not_found", NULL, "no such endpoint: %s %s", method, url);
        if (q->route == -2)
            return http_error(q, 405, "not_found", NULL, "%s is not allowed on %s",
                              method, url);
        const route *rt = &routes_table[q->route];
        if (s->auth_required && !rt->public_ && !authorized(q))
            return http_error(q, 401, "unauthorized", NULL,
                              "a valid bearer token is required (Authorization: Bearer ty_...)");
        if (rt->json_body) {
            const char *ct =
                MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
            size_t n = ct ? strcspn(ct, "; ") : 0;
            if (!ct || n != 16 || strncasecmp(ct, "application/json", 16))
                return http_error(q, 415, "unsupported_media_type", NULL,
                                  "Content-Type must be application/json, got '%s'",
                                  ct ? ct : "(none)");
        }
        const char *cl =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body)
            return http_error(q, 413, "too_large", NULL, "request body over the %zu-byte limit",
                              s->cfg.max_body);
        return MHD_YES;
    }
    if (*upload_size > 0) {
        /* A response queued early (error) ends the request: discard. */
        if (!q->answered && !q->too_big) {
            if (q->len + *upload_size > s->cfg.max_body) {
                q->too_big = true;
            } else {
                if (q->len + *upload_size + 1 > q->cap) {
                    size_t cap = (q->len + *upload_size + 1) * 2;
                    if (cap > s->cfg.max_body + 1) cap = s->cfg.max_body + 1;
                    char *g = realloc(q->body, cap);
                    if (!g) return MHD_NO;
                    q->body = g;
                    q->cap = cap;
                }
                memcpy(q->body + q->len, upload_data, *upload_size);
                q->len += *upload_size;
                q->body[q->len] = 0;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (q->answered) return MHD_YES;
    if (q->too_big)
        return http_error(q, 413, "too_large", NULL, "request body over the %zu-byte limit",
                          s->cfg.max_body);
    return routes_table[q->route].fn(q);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    http_req *q = *con_cls;
    if (!q) return;
    free(q->body);
    free(q);
    *con_cls = NULL;
}

/* ---- serve ----------------------------------------------------------------------------------- */

static int start_http(srv *s, ty_err *err)
{
    char host[256];
    int port;
    if (srv_listen_parse(s->cfg.listen, host, sizeof host, &port, err)) return TY_EINVAL;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    /* No MHD_USE_ERROR_LOG: it reports every client that hangs up on a
     * stream; failures to start are reported by us. */
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME;
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
        flags |= MHD_USE_IPv6;
    } else {
        return ty_err_field(err, TY_EINVAL, "listen", "listen host must be an IP address or "
                            "localhost, got '%s'", host);
    }
    (void)sl;
    char *cert = NULL, *key = NULL;
    if (s->cfg.tls_cert[0]) {
        size_t n;
        if (ty_read_file(s->cfg.tls_cert, &cert, &n, err)) return TY_EIO;
        if (ty_read_file(s->cfg.tls_key, &key, &n, err)) {
            free(cert);
            return TY_EIO;
        }
        flags |= MHD_USE_TLS;
    }
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_SOCK_ADDR, 0, &ss},
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, NULL},
        {MHD_OPTION_CONNECTION_LIMIT, 10000, NULL},
        /* A client that stops reading is dropped by the SSE hub, but its
         * socket only closes once MHD sees no progress for this long.
         * Suspended (idle) streams do not time out, and heartbeats keep
         * live ones active. */
        {MHD_OPTION_CONNECTION_TIMEOUT,
         s->cfg.heartbeat_s * 4 > 60 ? s->cfg.heartbeat_s * 4 : 60, NULL},
        {MHD_OPTION_THREAD_POOL_SIZE, s->cfg.http_threads, NULL},
        {cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, cert},
        {key ? MHD_OPTION_HTTPS_MEM_KEY : MHD_OPTION_END, 0, key},
        {MHD_OPTION_END, 0, NULL},
    };
    s->mhd = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, s,
                              MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
    /* MHD copies the TLS material while starting. */
    free(cert);
    free(key);
    if (!s->mhd)
        return ty_err_set(err, TY_EIO, "cannot listen on %s (in use, or TLS material invalid)",
                          s->cfg.listen);
    return 0;
}

int srv_serve_main(int argc, char **argv)
{
    static srv S;
    srv *s = &S;
    ty_err err = {0};
    if (srv_config_defaults(&s->cfg, &err)) {
        fprintf(stderr, "trainyard serve: %s\n", err.msg);
        return 2;
    }
    int rc = srv_config_parse(&s->cfg, argc, argv, stdout, &err);
    if (rc == 1) return 0;
    if (rc) {
        fprintf(stderr, "trainyard serve: %s\n", err.msg);
        return 2;
    }
    char host[256];
    int port;
    srv_listen_parse(s->cfg.listen, host, sizeof host, &port, &err);
    s->auth_required = s->cfg.require_token || !srv_host_is_loopback(host);
    snprintf(s->db_path, sizeof s->db_path, "%.4000s/trainyard.db", s->cfg.data_dir);
    snprintf(s->jobs_dir, sizeof s->jobs_dir, "%.4000s/jobs", s->cfg.data_dir);
    if (ty_mkdir_p(s->jobs_dir, &err)) {
        fprintf(stderr, "trainyard serve: %s\n", err.msg);
        return 1;
    }
    /* Engines are spawned with a relative-free view of the world. */
    char abs[PATH_MAX];
    if (realpath(s->cfg.data_dir, abs)) {
        snprintf(s->cfg.data_dir, sizeof s->cfg.data_dir, "%s", abs);
        snprintf(s->db_path, sizeof s->db_path, "%.4000s/trainyard.db", abs);
        snprintf(s->jobs_dir, sizeof s->jobs_dir, "%.4000s/jobs", abs);
    }
    pthread_key_create(&s->db_key, db_key_free);
    pthread_mutex_init(&s->write_lock, NULL);
    if (!srv_db(s)) return 1;

    /* SIGINT/SIGTERM are taken by sigwait below; block them in every thread
     * we start. SIGPIPE is ignored: a dead client is an EPIPE, not a crash. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (!(s->hub = sse_hub_new(s, &err)) ||
        !(s->evw = evw_new(s->db_path, &s->write_lock, writer_publish, s, &err)) ||
        !(s->up = uploader_new(s, &err)) || !(s->sched = sched_new(s, &err)) ||
        start_http(s, &err)) {
        fprintf(stderr, "trainyard serve: %s\n", err.msg);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr,
            "trainyard: serving on %s://%s:%u (data %s, %d GPU(s), %d CPU slot(s), tokens %s)\n",
            s->cfg.tls_cert[0] ? "https" : "http", host, di ? di->port : (unsigned)port,
            s->cfg.data_dir, sched_gpu_count(s->sched), s->cfg.cpu_slots,
            s->auth_required ? "required" : "optional");
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "trainyard: %s: shutting down; running jobs are recovered on next start\n",
            strsignal(sig));
    atomic_store(&s->stopping, true);
    /* Stop accepting, end the streams, stop HTTP, then the scheduler (which
     * SIGTERMs engines without waiting), and flush the event writer last. */
    MHD_socket lsock = MHD_quiesce_daemon(s->mhd);
    sse_hub_shutdown(s->hub);
    MHD_stop_daemon(s->mhd);
    if (lsock != MHD_INVALID_SOCKET) close(lsock);
    sched_stop(s->sched);
    uploader_stop(s->up); /* transfers in flight stay queued for the next start */
    evw_free(s->evw);
    sched_free(s->sched);
    uploader_free(s->up);
    sse_hub_free(s->hub);
    db_close(pthread_getspecific(s->db_key));
    pthread_setspecific(s->db_key, NULL);
    return 0;
}

/* ---- trainyard token create -------------------------------------------------------------------- */

int srv_token_main(int argc, char **argv)
{
    const char *data_dir = "./trainyard-data", *name = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data-dir") && i + 1 < argc) data_dir = argv[++i];
        else if (!strncmp(argv[i], "--data-dir=", 11)) data_dir = argv[i] + 11;
        else if (!strcmp(argv[i], "create") && !name && i + 1 < argc && argv[i + 1][0] != '-')
            name = argv[++i];
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            name = NULL;
            break;
        } else {
            fprintf(stderr, "trainyard token: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!name) {
        fputs("usage: trainyard token create NAME [--data-dir DIR]\n"
              "Prints a new API token once; the server keeps only its SHA-256.\n", stderr);
        return 2;
    }
    ty_err err = {0};
    char path[PATH_MAX + 32], tok[68], hash[65];
    if (ty_mkdir_p(data_dir, &err)) {
        fprintf(stderr, "trainyard token: %s\n", err.msg);
        return 1;
    }
    snprintf(path, sizeof path, "%s/trainyard.db", data_dir);
    db *d;
    if (db_open(path, &d, &err) || srv_token_generate(tok, &err)) {
        fprintf(stderr, "trainyard token: %s\n", err.msg);
        return 1;
    }
    srv_token_hash(tok, hash);
    int rc = db_token_add(d, name, hash, &err);
    db_close(d);
    if (rc) {
        fprintf(stderr, "trainyard token: %s\n", err.msg);
        return 1;
    }
    printf("%s\n", tok);
    return 0;
}
