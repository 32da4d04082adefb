/* routes.c — the REST API of DESIGN §3: the route table and its handlers.
 *
 * Handlers validate input, call the db / scheduler / SSE hub and render
 * the JSON shapes of docs/api.md. The table is also printed by
 * `trainyard routes` so tests can compare it with openapi.yaml. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "admit.h"
#include "disk.h"
#include "gpu.h"
#include "jobview.h"
#include "overlay.h"
#include "recovery.h"
#include "scheduler.h"
#include "gate.h"
#include "db_ops.h"
#include "genq.h"
#include "ops.h"
#include "state.h"
#include "upload.h"
#include "routes.h"
#include "jobspec.h"
#include "sse.h"
#include "tyutil.h"
#include "web_assets.h"
#include "tyjson.h"

static enum MHD_Result reply_job(http_req *q, unsigned status, int64_t id)
{
    db *d = srv_db(q->s);
    db_job j;
    ty_err err = {0};
    if (!d) return http_error(q, 500, "internal", NULL, "database unavailable");
    if (db_job_get(d, id, &j, &err)) return http_ty_error(q, &err);
    overlay_apply(q->s, &j);
    if (http_pretty(q)) {
        json_t *o = jobview_json(&q->s->cfg, d, &j);
        db_job_free(&j);
        return http_json(q, status, o);
    }
    char *txt = jobview_text(&q->s->cfg, d, &j);
    db_job_free(&j);
    return http_json_text(q, status, txt);
}

/* ---- /jobs ---------------------------------------------------------------------------------- */

/* A POST /jobs request as parsed, and what storing it makes of it. */
typedef struct job_post {
    jobspec spec;
    bool has_spec;
    const char *idem_key; /* the Idempotency-Key header, or NULL */
    char *spec_json;      /* the stored spec: every default filled in */
    char *tags;           /* the spec's tags as a JSON array */
    int64_t id;
    bool existing; /* the key named a job stored before: it is the answer */
} job_post;

static void job_post_free(job_post *p)
{
    if (p->has_spec) jobspec_free(&p->spec);
    free(p->spec_json);
    free(p->tags);
}

/* The body as a job spec with the server's default limits, and the
 * Idempotency-Key. */
static unsigned parse_job_post(http_req *q, job_post *p, admit_result *r)
{
    ty_err err = {0};
    if (q->len == 0)
        return admit_refuse(r, 400, "invalid_json", NULL, "empty body: send a job spec");
    int rc = jobspec_parse_text(q->body, q->len, &p->spec, &err);
    if (rc)
        return admit_refuse(r, 400, rc == TY_ECORRUPT ? "invalid_json" : "invalid_spec", err.field,
                            "%s", err.msg);
    p->has_spec = true;
    ops_spec_defaults(&q->s->cfg, &p->spec);
    p->idem_key = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, "Idempotency-Key");
    size_t kn = p->idem_key ? strlen(p->idem_key) : 1;
    if (kn == 0 || kn > 255)
        return admit_refuse(r, 400, "invalid_spec", "Idempotency-Key",
                            "Idempotency-Key must be 1 to 255 characters");
    return 0;
}

/* Stored with every default filled in: what the engine will run with and
 * what GET /jobs/{id} shows. */
static bool job_post_texts(job_post *p)
{
    json_t *root = jobspec_to_json(&p->spec);
    p->spec_json = root ? ty_json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    json_t *jtags = json_array();
    for (int i = 0; i < p->spec.n_tags; i++)
        json_array_append_new(jtags, json_string(p->spec.tags[i]));
    p->tags = ty_json_dumps(jtags, JSON_COMPACT);
    json_decref(jtags);
    return p->spec_json && p->tags;
}

/* Inserts the job (or finds the one its Idempotency-Key stored) and
 * publishes its first event. */
static unsigned store_job(http_req *q, job_post *p, admit_result *r)
{
    srv *s = q->s;
    db *d = srv_db(s);
    ty_err err = {0}, terr = {0};
    char sha[65], token_name[256] = "";
    if (!job_post_texts(p) || !d)
        return admit_refuse(r, 500, "internal", NULL, "cannot store the job");
    ty_sha256_hex(q->body, q->len, sha);
    if (q->token_id > 0) db_token_name(d, q->token_id, token_name, sizeof token_name, &terr);
    db_new_job nj = {.name = p->spec.name,
                     .spec = p->spec_json,
                     .priority = p->spec.priority,
                     .gpus_wanted = p->spec.gpus,
                     .max_steps = p->spec.max_steps,
                     .max_restarts = p->spec.max_restarts,
                     .idem_key = p->idem_key,
                     .body_sha256 = sha,
                     .tags = p->tags,
                     .token_name = token_name[0] ? token_name : NULL};
    db_event ev;
    pthread_mutex_lock(&s->write_lock);
    int rc = db_job_insert(d, &nj, &p->id, &p->existing, &ev, &err);
    if (rc == 0 && !p->existing) {
        srv_publish(s, &ev);
        db_event_clear(&ev);
    }
    pthread_mutex_unlock(&s->write_lock);
    if (rc == TY_ESTATE)
        return admit_refuse(r, 409, "idempotency_conflict", "Idempotency-Key", "%s", err.msg);
    if (rc) return admit_refuse_err(r, &err);
    if (!p->existing) sched_wake(s->sched);
    return 0;
}

/* 201 with the new job and its Location; 200 for an earlier one. */
static enum MHD_Result reply_stored(http_req *q, const job_post *p)
{
    db *d = srv_db(q->s);
    db_job j;
    ty_err err = {0};
    char loc[64];
    if (db_job_get(d, p->id, &j, &err)) return http_ty_error(q, &err);
    char *txt = jobview_text(&q->s->cfg, d, &j);
    db_job_free(&j);
    if (!txt) return MHD_NO;
    snprintf(loc, sizeof loc, "/jobs/%lld", (long long)p->id);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(txt), txt, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Location", loc);
    enum MHD_Result ok = http_queue(q->conn, p->existing ? 200 : 201, r);
    MHD_destroy_response(r);
    return ok;
}

/* Parse, admit (admit.c), store: a refusal of any step is answered in
 * one place. */
static enum MHD_Result post_jobs(http_req *q)
{
    job_post p = {0};
    admit_result r = {0};
    admit_ctx ctx = admit_ctx_of(q->s);
    enum MHD_Result res;
    if (parse_job_post(q, &p, &r) || admit_job(q->s, &p.spec, &ctx, &r) || store_job(q, &p, &r))
        res = admit_reply(q, &r);
    else
        res = reply_stored(q, &p);
    job_post_free(&p);
    return res;
}

typedef struct state_filter {
    unsigned mask;
    bool is_bad;
    char bad[64];
} state_filter;

/* Every state= value, each a comma-separated list (routes_check_query has
 * capped the total at 255 bytes). */
static enum MHD_Result collect_states(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    (void)kind;
    state_filter *f = cls;
    if (strcmp(key, "state") || !value) return MHD_YES;
    for (const char *p = value;;) {
        size_t n = strcspn(p, ",");
        char name[16];
        int st = n < sizeof name ? (memcpy(name, p, n), name[n] = 0, db_state_parse(name)) : -1;
        if (st < 0) {
            snprintf(f->bad, sizeof f->bad, "%.*s", (int)(n > 40 ? 40 : n), p);
            f->is_bad = true;
            return MHD_NO;
        }
        f->mask |= JOB_BIT(st);
        if (!p[n]) return MHD_YES;
        p += n + 1;
    }
}

static enum MHD_Result get_jobs(http_req *q)
{
    state_filter f = {0};
    MHD_get_connection_values(q->conn, MHD_GET_ARGUMENT_KIND, collect_states, &f);
    if (f.is_bad)
        return http_error(q, 400, "invalid_spec", "state",
                          "unknown state '%s' (queued, starting, running, stopping, paused, "
                          "succeeded, failed, cancelled)",
                          f.bad);
    long limit = 50;
    const char *l = http_arg(q, "limit");
    if (l) {
        char *end;
        errno = 0;
        limit = strtol(l, &end, 10);
        if (errno || end == l || *end || limit < 1 || limit > 200)
            return http_error(q, 400, "invalid_spec", "limit",
                              "limit must be an integer from 1 to 200");
    }
    int64_t before = 0;
    const char *c = http_arg(q, "cursor");
    if (c && srv_cursor_decode(c, &before))
        return http_error(q, 400, "invalid_spec", "cursor",
                          "cursor is not one this server "
                          "issued");
    db *d = srv_db(q->s);
    db_job *jobs;
    int n;
    ty_err err = {0};
    const char *tag = http_arg(q, "tag");
    if (tag && (!*tag || strlen(tag) > 64))
        return http_error(q, 400, "invalid_spec", "tag", "tag must be 1 to 64 characters");
    if (!d || db_job_list_tag(d, overlay_widen(q->s, f.mask), tag, before, (int)limit + 1, &jobs,
                              &n, &err))
        return http_error(q, 500, "internal", NULL, "%s", err.msg);
    json_t *arr = json_array();
    for (int i = 0; i < n && i < limit; i++) {
        overlay_apply(q->s, &jobs[i]);
        if (overlay_keep(&jobs[i], f.mask))
            json_array_append_new(arr, jobview_json(&q->s->cfg, d, &jobs[i]));
    }
    json_t *next = json_null();
    if (n > limit) {
        char cur[32];
        srv_cursor_encode(jobs[limit - 1].id, cur);
        next = json_string(cur);
    }
    db_jobs_free(jobs, n);
    return http_json(q, 200, json_pack("{so so}", "jobs", arr, "next_cursor", next));
}

static enum MHD_Result get_job(http_req *q)
{
    return reply_job(q, 200, q->id);
}

static enum MHD_Result post_cancel(http_req *q)
{
    ty_err err = {0};
    if (sched_cancel(q->s->sched, q->id, &err)) return http_ty_error(q, &err);
    return reply_job(q, 202, q->id);
}

static enum MHD_Result post_pause(http_req *q)
{
    ty_err err = {0};
    if (sched_pause(q->s->sched, q->id, &err)) return http_ty_error(q, &err);
    return reply_job(q, 202, q->id);
}

static enum MHD_Result post_resume(http_req *q)
{
    ty_err err = {0};
    if (sched_resume(q->s->sched, q->id, &err)) return http_ty_error(q, &err);
    return reply_job(q, 202, q->id);
}

static enum MHD_Result delete_job(http_req *q)
{
    ty_err err = {0};
    db *d = srv_db(q->s);
    const char *purge = http_arg(q, "purge");
    if (purge && strcmp(purge, "0") && strcmp(purge, "1"))
        return http_error(q, 400, "invalid_spec", "purge", "purge must be 0 or 1");
    if (!d) return http_error(q, 500, "internal", NULL, "database unavailable");
    /* Remote copies are kept unless purge=1. A purge deletes them first
     * (only for a finished job: db_job_delete refuses the others, and a
     * live job may still be writing checkpoints), so a failed remote delete
     * leaves the job in place to try again. */
    db_job j;
    if (db_job_get(d, q->id, &j, &err)) return http_ty_error(q, &err);
    bool finished = db_state_terminal(j.state);
    db_job_free(&j);
    job_state settling;
    if (overlay_state(q->s, q->id, &settling))
        return http_error(q, 409, "conflict", NULL,
                          "job %lld is %s but that is still being written; retry once it is",
                          (long long)q->id, db_state_name(settling));
    if (finished && purge && !strcmp(purge, "1")) {
        if (upload_purge_job(q->s, q->id, &err))
            return http_error(q, 502, "internal", "purge",
                              "remote checkpoints could not all be deleted (the job is kept; "
                              "retry): %s",
                              err.msg);
    }
    if (srv_disk_delete_job(q->s, q->id, &err)) return http_ty_error(q, &err);
    return http_bytes(q, 204, NULL, "", 0, false);
}

/* ---- streams, metrics, logs, checkpoints ------------------------------------------------- */

static bool job_exists(http_req *q)
{
    db *d = srv_db(q->s);
    db_job j;
    ty_err err = {0};
    if (!d || db_job_get(d, q->id, &j, &err)) return false;
    db_job_free(&j);
    return true;
}

static int64_t parse_event_id(const char *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < 0 || !isdigit((unsigned char)*v)) return -2;
    return x;
}

/* Last-Event-ID header, else ?from=; -2 when either is malformed (both are
 * checked, so a bad ?from= is not hidden by the header). */
static int64_t stream_from(http_req *q, int64_t dflt)
{
    const char *h = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, "Last-Event-ID");
    const char *f = http_arg(q, "from");
    int64_t hv = h ? parse_event_id(h) : dflt, fv = f ? parse_event_id(f) : dflt;
    if (hv == -2 || fv == -2) return -2;
    return h ? hv : fv;
}

static enum MHD_Result get_job_events(http_req *q)
{
    if (!job_exists(q))
        return http_error(q, 404, "not_found", NULL, "no job %lld", (long long)q->id);
    /* A job stream replays the job's whole history unless told otherwise. */
    int64_t from = stream_from(q, 0);
    if (from == -2)
        return http_error(q, 400, "invalid_spec", "from",
                          "Last-Event-ID / from must be a non-negative integer");
    return sse_hub_serve_events(q->s->hub, q->conn, q->id, from);
}

static enum MHD_Result get_events(http_req *q)
{
    /* The global feed is live unless the client names where it left off. */
    int64_t from = stream_from(q, -1);
    if (from == -2)
        return http_error(q, 400, "invalid_spec", "from",
                          "Last-Event-ID / from must be a non-negative integer");
    return sse_hub_serve_events(q->s->hub, q->conn, 0, from);
}

static const char *const metric_cols[] = {"step",   "loss",         "lr",       "grad_norm",
                                          "tokens", "tokens_per_s", "mem_bytes"};
#define NMETRIC_COLS (sizeof metric_cols / sizeof *metric_cols)

static enum MHD_Result get_metrics_of_job(http_req *q)
{
    const char *fmt = http_arg(q, "format");
    if (fmt && strcmp(fmt, "json") && strcmp(fmt, "csv"))
        return http_error(q, 400, "invalid_spec", "format", "format must be json or csv");
    if (!job_exists(q))
        return http_error(q, 404, "not_found", NULL, "no job %lld", (long long)q->id);
    db *d = srv_db(q->s);
    db_event *evs;
    int n;
    ty_err err = {0};
    if (db_events_metrics(d, q->id, &evs, &n, &err)) return http_ty_error(q, &err);
    bool csv = fmt && !strcmp(fmt, "csv");
    json_t *arr = csv ? NULL : json_array();
    size_t cap = 256 + (size_t)n * 160, len = 0;
    char *out = csv ? malloc(cap) : NULL;
    if (csv) {
        if (!out) {
            db_events_free(evs, n);
            return MHD_NO;
        }
        len =
            (size_t)snprintf(out, cap, "step,loss,lr,grad_norm,tokens,tokens_per_s,mem_bytes,ts\n");
    }
    for (int i = 0; i < n; i++) {
        json_t *m = json_loads(evs[i].data, 0, NULL);
        char ts[32];
        srv_time_fmt(evs[i].ts_ms, ts);
        if (!csv) {
            json_t *row = json_object();
            for (size_t k = 0; k < NMETRIC_COLS; k++) {
                json_t *v = json_object_get(m, metric_cols[k]);
                json_object_set(row, metric_cols[k], v ? v : json_null());
            }
            json_object_set_new(row, "ts", json_string(ts));
            json_array_append_new(arr, row);
        } else {
            for (size_t k = 0; k < NMETRIC_COLS; k++) {
                json_t *v = json_object_get(m, metric_cols[k]);
                char cell[64] = "";
                if (json_is_integer(v))
                    snprintf(cell, sizeof cell, "%lld", (long long)json_integer_value(v));
                else if (json_is_real(v))
                    ty_fmt_double(cell, sizeof cell, json_real_value(v));
                if (len + 128 > cap) {
                    cap *= 2;
                    char *g = realloc(out, cap);
                    if (!g) break;
                    out = g;
                }
                len += (size_t)snprintf(out + len, cap - len, "%s,", cell);
            }
            len += (size_t)snprintf(out + len, cap - len, "%s\n", ts);
        }
        json_decref(m);
    }
    db_events_free(evs, n);
    if (csv) {
        struct MHD_Response *r = MHD_create_response_from_buffer(len, out, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(r, "Content-Type", "text/csv; charset=utf-8");
        enum MHD_Result ok = http_queue(q->conn, 200, r);
        MHD_destroy_response(r);
        return ok;
    }
    return http_json(q, 200, json_pack("{so}", "metrics", arr));
}

static enum MHD_Result get_logs(http_req *q)
{
    const char *follow = http_arg(q, "follow");
    if (follow && strcmp(follow, "0") && strcmp(follow, "1"))
        return http_error(q, 400, "invalid_spec", "follow", "follow must be 0 or 1");
    if (!job_exists(q))
        return http_error(q, 404, "not_found", NULL, "no job %lld", (long long)q->id);
    char dir[PATH_MAX], path[PATH_MAX + 16];
    srv_job_dir(q->s, q->id, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/engine.log", dir);
    if (follow && !strcmp(follow, "1")) return sse_hub_serve_log(q->s->hub, q->conn, q->id, path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return http_bytes(q, 200, "text/plain; charset=utf-8", "", 0, false);
    }
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
    enum MHD_Result ok = http_queue(q->conn, 200, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result get_checkpoints(http_req *q)
{
    if (!job_exists(q))
        return http_error(q, 404, "not_found", NULL, "no job %lld", (long long)q->id);
    db *d = srv_db(q->s);
    db_checkpoint *c;
    int n;
    ty_err err = {0};
    if (db_checkpoint_list(d, q->id, &c, &n, &err)) return http_ty_error(q, &err);
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "step", json_integer(c[i].step));
        json_object_set_new(o, "dir", jobview_text_or_null(c[i].dir));
        json_object_set_new(o, "bytes", json_integer(c[i].bytes));
        json_object_set_new(o, "sha256", jobview_text_or_null(c[i].sha256));
        json_object_set_new(o, "local_path", jobview_text_or_null(c[i].local_path));
        json_object_set_new(o, "remote_uri", jobview_text_or_null(c[i].remote_uri));
        json_object_set_new(o, "state", jobview_text_or_null(c[i].state));
        json_object_set_new(o, "error", jobview_text_or_null(c[i].error));
        json_object_set_new(o, "created_at", jobview_time(c[i].created_ms));
        json_array_append_new(arr, o);
    }
    db_checkpoints_free(c, n);
    return http_json(q, 200, json_pack("{so}", "checkpoints", arr));
}

/* ---- machine -------------------------------------------------------------------------------- */

static enum MHD_Result get_gpus(http_req *q)
{
    srv_gpu_sample g[GPU_MAX];
    int n = sched_gpu_snapshot(q->s->sched, g);
    json_t *arr = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(
            arr, json_pack("{si ss sI sI si si so}", "index", g[i].index, "name", g[i].name,
                           "mem_total", (json_int_t)g[i].mem_total, "mem_used",
                           (json_int_t)g[i].mem_used, "util", g[i].util, "temp", g[i].temp,
                           "job_id", g[i].job_id > 0 ? json_integer(g[i].job_id) : json_null()));
    return http_json(q, 200, json_pack("{so}", "gpus", arr));
}

static enum MHD_Result get_healthz(http_req *q)
{
    srv *s = q->s;
    if (!srv_db(s)) return http_error(q, 503, "unavailable", NULL, "database unavailable");
    /* The disk: read_only while it is too full to write the database. */
    int64_t free_b = srv_disk_free(s);
    json_t *fb = free_b == INT64_MAX ? json_null() : json_integer(free_b);
    return http_json(q, 200,
                     json_pack("{ss ss ss so sb}", "status", "ok", "version", TY_VERSION, "storage",
                               srv_disk_writable(s) ? "read_write" : "read_only", "disk_free_bytes",
                               fb, "disk_reserve", (int)atomic_load(&s->reserve_held)));
}

static enum MHD_Result get_prom(http_req *q)
{
    srv *s = q->s;
    srv_prom p = {0};
    srv_gpu_sample g[GPU_MAX];
    ty_err err = {0};
    db *d = srv_db(s);
    if (!d || db_job_counts(d, p.jobs, &err))
        return http_error(q, 500, "internal", NULL, "database unavailable");
    overlay_counts(s, d, p.jobs);
    p.queue_length = p.jobs[JOB_QUEUED];
    p.events_ingested = atomic_load(&s->events_ingested);
    p.sse_clients = sse_hub_clients(s->hub);
    p.http_requests = atomic_load(&s->http_requests);
    p.ngpus = sched_gpu_snapshot(s->sched, g);
    p.gpus = g;
    char *txt = ops_prom_usage(s, srv_prom_render(&p));
    if (!txt) return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(txt), txt, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result ok = http_queue(q->conn, 200, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result serve_asset(http_req *q, const web_asset *tab, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(tab[i].name, name)) {
            struct MHD_Response *r = MHD_create_response_from_buffer(
                tab[i].len, (void *)tab[i].data, MHD_RESPMEM_PERSISTENT);
            MHD_add_response_header(r, "Content-Type", tab[i].ctype);
            MHD_add_response_header(r, "Cache-Control", "no-cache");
            enum MHD_Result ok = http_queue(q->conn, 200, r);
            MHD_destroy_response(r);
            return ok;
        }
    return http_error(q, 404, "not_found", NULL, "no such file: %s", name);
}

static enum MHD_Result get_openapi(http_req *q)
{
    return serve_asset(q, openapi_assets, openapi_assets_count, "openapi.yaml");
}

static enum MHD_Result get_index(http_req *q)
{
    return serve_asset(q, web_assets, web_assets_count, "index.html");
}

static enum MHD_Result get_static(http_req *q)
{
    return serve_asset(q, web_assets, web_assets_count, q->arg);
}

/* ---- the table ---------------------------------------------------------------------------- */

/* Each route names the token scope it needs (docs/server.md) and the query
 * parameters it takes (access_token is taken everywhere). */
const route routes_table[] = {
    {"POST", "/jobs", post_jobs, true, false, SCOPE_SUBMIT, ""},
    {"GET", "/jobs", get_jobs, false, false, SCOPE_READ, "state*,limit,cursor,tag"},
    {"GET", "/jobs/{id}", get_job, false, false, SCOPE_READ, ""},
    {"PATCH", "/jobs/{id}", ops_patch_job, true, false, SCOPE_SUBMIT, ""},
    {"DELETE", "/jobs/{id}", delete_job, false, false, SCOPE_ADMIN, "purge"},
    {"POST", "/jobs/{id}/cancel", post_cancel, false, false, SCOPE_SUBMIT, ""},
    {"POST", "/jobs/{id}/pause", post_pause, false, false, SCOPE_SUBMIT, ""},
    {"POST", "/jobs/{id}/resume", post_resume, false, false, SCOPE_SUBMIT, ""},
    {"GET", "/jobs/{id}/events", get_job_events, false, false, SCOPE_READ, "from"},
    {"GET", "/jobs/{id}/metrics", get_metrics_of_job, false, false, SCOPE_READ, "format"},
    {"GET", "/jobs/{id}/logs", get_logs, false, false, SCOPE_READ, "follow"},
    {"GET", "/jobs/{id}/checkpoints", get_checkpoints, false, false, SCOPE_READ, ""},
    {"POST", "/jobs/{id}/generate", genq_post, true, false, SCOPE_SUBMIT, ""},
    {"GET", "/gpus", get_gpus, false, false, SCOPE_READ, ""},
    {"GET", "/queue", ops_get_queue, false, false, SCOPE_READ, ""},
    {"GET", "/usage", ops_get_usage, false, false, SCOPE_READ, "from,to,group_by,format"},
    {"GET", "/events", get_events, false, false, SCOPE_READ, "from"},
    {"GET", "/healthz", get_healthz, false, true, SCOPE_READ, ""},
    {"GET", "/metrics", get_prom, false, false, SCOPE_READ, ""},
    {"GET", "/openapi.yaml", get_openapi, false, true, SCOPE_READ, ""},
    {"GET", "/", get_index, false, true, SCOPE_READ, ""},
    {"GET", "/static/{name}", get_static, false, true, SCOPE_READ, ""},
};
const int routes_count = sizeof routes_table / sizeof routes_table[0];

/* Compares one pattern with a path segment by segment. */
static bool match_pattern(const char *pat, const char *path, http_req *q)
{
    while (*pat && *path) {
        if (*pat != '/' || *path != '/') return false;
        pat++;
        path++;
        size_t pl = strcspn(pat, "/"), sl = strcspn(path, "/");
        if (!strncmp(pat, "{id}", 4) && pl == 4) {
            if (sl == 0 || sl > 18) return false;
            for (size_t i = 0; i < sl; i++)
                if (!isdigit((unsigned char)path[i])) return false;
            if (q) q->id = strtoll(path, NULL, 10);
            if (q && q->id <= 0) return false;
        } else if (!strncmp(pat, "{name}", 6) && pl == 6) {
            if (sl == 0 || sl >= sizeof q->arg || (path[0] == '.')) return false;
            if (q) {
                memcpy(q->arg, path, sl);
                q->arg[sl] = 0;
            }
        } else if (pl != sl || strncmp(pat, path, pl)) {
            return false;
        }
        pat += pl;
        path += sl;
    }
    return *pat == 0 && *path == 0;
}

void routes_allowed(const char *path, char *out, size_t cap)
{
    char buf[1024];
    size_t n = strlen(path), o = 0;
    out[0] = 0;
    if (n >= sizeof buf) return;
    memcpy(buf, path, n + 1);
    if (n > 1 && buf[n - 1] == '/') buf[n - 1] = 0;
    for (int i = 0; i < routes_count; i++) {
        if (!match_pattern(routes_table[i].pattern, buf, NULL)) continue;
        const char *m = routes_table[i].method;
        if (o < cap) o += (size_t)snprintf(out + o, cap - o, "%s%s", o ? ", " : "", m);
        if (!strcmp(m, "GET") && o < cap) o += (size_t)snprintf(out + o, cap - o, ", HEAD");
    }
}

int routes_match(http_req *q, const char *method, const char *path)
{
    bool path_known = false;
    /* "/jobs/" and "/jobs" are the same resource. */
    char buf[1024];
    size_t n = strlen(path);
    if (n >= sizeof buf) return -1;
    memcpy(buf, path, n + 1);
    if (n > 1 && buf[n - 1] == '/') buf[n - 1] = 0;
    for (int i = 0; i < routes_count; i++) {
        if (!match_pattern(routes_table[i].pattern, buf, q)) continue;
        path_known = true;
        if (!strcmp(routes_table[i].method, method) ||
            (!strcmp(method, "HEAD") && !strcmp(routes_table[i].method, "GET")))
            return i;
    }
    return path_known ? -2 : -1;
}

/* ---- strict query parsing ------------------------------------------------------------------ */

#define QUERY_LIST_MAX 255

typedef struct query_check {
    const char *params; /* the route's, "a,b*,c" */
    int seen[16];       /* per parameter of params, then access_token */
    size_t list_bytes[16];
    char field[64];
    char msg[256];
    bool bad;
} query_check;

/* Index of key in params (and whether it may repeat); -1 when the route
 * does not take it. access_token is index 15 on every route. */
static int param_index(const char *params, const char *key, size_t kn, bool *list)
{
    *list = false;
    if (kn == 12 && !memcmp(key, "access_token", 12)) return 15;
    int i = 0;
    for (const char *p = params; *p && i < 15; i++) {
        size_t n = strcspn(p, ",");
        bool star = n > 0 && p[n - 1] == '*';
        size_t name_n = star ? n - 1 : n;
        if (name_n == kn && !memcmp(p, key, kn)) {
            *list = star;
            return i;
        }
        p += n;
        if (*p == ',') p++;
    }
    return -1;
}

static enum MHD_Result check_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                 size_t key_size, const char *value, size_t value_size)
{
    (void)kind;
    query_check *c = cls;
    snprintf(c->field, sizeof c->field, "%.*s", (int)strnlen(key, key_size), key);
    if (gate_has_ctl(key, key_size) || (value && gate_has_ctl(value, value_size))) {
        snprintf(c->msg, sizeof c->msg, "query parameter '%s' holds a NUL or control character",
                 c->field);
        c->bad = true;
        return MHD_NO;
    }
    bool list;
    int i = param_index(c->params, key, key_size, &list);
    if (i < 0) return MHD_YES; /* not this route's: ignored, as documented */
    if (!value) {
        snprintf(c->msg, sizeof c->msg, "query parameter '%s' needs a value", c->field);
        c->bad = true;
        return MHD_NO;
    }
    if (c->seen[i]++ && !list) {
        snprintf(c->msg, sizeof c->msg, "query parameter '%s' is given more than once", c->field);
        c->bad = true;
        return MHD_NO;
    }
    c->list_bytes[i] += value_size + (c->seen[i] > 1 ? 1 : 0);
    if (list && c->list_bytes[i] > QUERY_LIST_MAX) {
        snprintf(c->msg, sizeof c->msg, "the '%s' list is over %d bytes", c->field, QUERY_LIST_MAX);
        c->bad = true;
        return MHD_NO;
    }
    return MHD_YES;
}

int routes_check_query(http_req *q, const route *rt, char *field, size_t fcap, char *msg,
                       size_t mcap)
{
    query_check c = {.params = rt->params ? rt->params : ""};
    MHD_get_connection_values_n(q->conn, MHD_GET_ARGUMENT_KIND, check_arg, &c);
    if (!c.bad) return 0;
    snprintf(field, fcap, "%s", c.field);
    snprintf(msg, mcap, "%s", c.msg);
    return TY_EINVAL;
}
