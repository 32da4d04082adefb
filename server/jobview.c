/* jobview.c — a job as the API shows it (jobview.h).
 *
 * The object is assembled from the job's row and three small lookups
 * (queue position, newest checkpoint, last event): progress is where the
 * job would continue from, the ETA and the stall time belong to a running
 * engine only, and the cost is its running time at the operator's price.
 *
 * Most of a GET's work used to be the stored spec: parsed from its text
 * and printed again, unchanged, for every request. The server stores that
 * text itself, compact and with shortest reals (routes.c writes it through
 * ty_json_dumps), so jobview_text prints the rest of the object and copies
 * the spec's text in at its place between "state" and "priority". The
 * result is the same text, key order included, as printing jobview_json. */
#include "jobview.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "db_ops.h"
#include "ops.h"
#include "recovery.h"
#include "state.h"
#include "tyjson.h"
#include "tyutil.h"

json_t *jobview_time(int64_t ms)
{
    char t[32];
    if (ms <= 0) return json_null();
    srv_time_fmt(ms, t);
    return json_string(t);
}

json_t *jobview_text_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *parsed_or_null(const char *s)
{
    json_t *o = s ? json_loads(s, 0, NULL) : NULL;
    return o ? o : json_null();
}

/* The current run's rate since its first metric, times the steps left. */
double jobview_eta(const db_job *j, int64_t step)
{
    if (j->state != JOB_RUNNING) return -1;
    if (j->metric0_ms > 0 && j->metric_last_ms > j->metric0_ms && step > j->metric0_step &&
        j->max_steps > step) {
        double per_step =
            (double)(j->metric_last_ms - j->metric0_ms) / 1000.0 / (double)(step - j->metric0_step);
        return per_step * (double)(j->max_steps - step);
    }
    if (j->max_steps > 0 && step >= j->max_steps) return 0;
    return -1;
}

/* The job's cost so far: its running time (db_job_run_ms) times its GPUs
 * at the GPU-hour price, or times one slot at the CPU-hour price for a CPU
 * job; null while the operator has not given the price that applies. */
static json_t *render_cost(const srv_config *cfg, const db_job *j)
{
    double amount, gpu_hours, cpu_hours;
    if (!ops_job_cost(cfg, j, ty_now_ms(), &amount, &gpu_hours, &cpu_hours)) return json_null();
    return json_pack("{sf ss sf sf}", "amount", amount, "currency", cfg->currency, "gpu_hours",
                     gpu_hours, "cpu_hours", cpu_hours);
}

static json_t *render_gpus(const char *list)
{
    json_t *gpus = json_array();
    for (const char *p = list ? list : ""; *p;) {
        json_array_append_new(gpus, json_integer(strtol(p, NULL, 10)));
        p = strchrnul(p, ',');
        if (*p) p++;
    }
    return gpus;
}

/* Progress is where the job would continue from: a paused or requeued
 * job (or one whose new run has not reported yet) is at its resume
 * checkpoint's step, not at the last metric of the run that stopped. The
 * steps between the last metric and the checkpoint a stop wrote were
 * trained too: a job is never behind its own newest checkpoint. */
static int64_t progress_step(db *d, const db_job *j, int64_t metric_step)
{
    int64_t step = metric_step;
    int64_t ck_step = rec_dir_step(j->resume_from);
    bool no_run_metric = j->metric0_ms == 0;
    if (ck_step >= 0 && (j->state == JOB_QUEUED || j->state == JOB_PAUSED ||
                         ((j->state == JOB_STARTING || j->state == JOB_RUNNING) && no_run_metric)))
        return ck_step;
    ty_err err = {0};
    char *newest = NULL;
    if (db_checkpoint_newest(d, j->id, &newest, &err) == 0 && newest) {
        int64_t n = rec_dir_step(newest);
        if (n > step) step = n;
    }
    free(newest);
    return step;
}

static json_t *render_progress(db *d, const db_job *j, int64_t metric_step)
{
    int64_t step = progress_step(d, j, metric_step);
    /* Only a running engine has an ETA. */
    double eta_s = jobview_eta(j, step);
    json_t *eta = eta_s >= 0 ? json_real(eta_s) : json_null();
    return json_pack("{sI sI sf so}", "step", (json_int_t)step, "max_steps",
                     (json_int_t)j->max_steps, "fraction",
                     j->max_steps > 0 ? (double)step / (double)j->max_steps : 0.0, "eta_s", eta);
}

/* The summary named in docs/api.md; the whole started event is in the
 * event stream. */
static json_t *render_engine(const char *started)
{
    json_t *engine = parsed_or_null(started);
    if (!json_is_object(engine)) return engine;
    json_t *e = json_object();
    const char *keys[] = {"params", "trainable", "world", "backend"};
    for (size_t i = 0; i < 4; i++) {
        json_t *v = json_object_get(engine, keys[i]);
        if (v) json_object_set(e, keys[i], v);
    }
    json_decref(engine);
    return e;
}

/* The fields before the spec. */
static json_t *render_head(const db_job *j)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(j->id));
    json_object_set_new(o, "name", jobview_text_or_null(j->name));
    json_object_set_new(o, "state", json_string(db_state_name(j->state)));
    return o;
}

static void set_times(json_t *o, const db_job *j)
{
    json_object_set_new(o, "created_at", jobview_time(j->created_ms));
    json_object_set_new(o, "started_at", jobview_time(j->started_ms));
    json_object_set_new(o, "finished_at", jobview_time(j->finished_ms));
    json_object_set_new(o, "updated_at", jobview_time(j->updated_ms));
}

static void set_outcome(json_t *o, const db_job *j)
{
    json_object_set_new(o, "restarts", json_integer(j->restarts));
    json_object_set_new(o, "max_restarts", json_integer(j->max_restarts));
    json_object_set_new(o, "resume_from", jobview_text_or_null(j->resume_from));
    json_object_set_new(o, "error", jobview_text_or_null(j->error));
    json_object_set_new(o, "checkpoint_error", jobview_text_or_null(j->checkpoint_error));
    json_object_set_new(o, "backend", jobview_text_or_null(j->backend));
    json_object_set_new(o, "gpus", render_gpus(j->gpus));
}

/* The fields after the spec, in the order of docs/api.md. */
static json_t *render_tail(const srv_config *cfg, db *d, const db_job *j)
{
    ty_err err = {0};
    int pos = j->state == JOB_QUEUED ? db_job_queue_position(d, j->id, &err) : 0;
    json_t *metric = parsed_or_null(j->last_metric);
    json_t *o = json_object();
    json_object_set_new(o, "priority", json_integer(j->priority));
    json_object_set_new(o, "queue_position", pos > 0 ? json_integer(pos) : json_null());
    set_times(o, j);
    set_outcome(o, j);
    json_object_set_new(o, "progress",
                        render_progress(d, j, json_integer_value(json_object_get(metric, "step"))));
    /* One ETA a job: progress.eta_s (the current run's rate since its
     * first metric). The engine's own metric.eta_s counts from its start,
     * load included, so the two disagree; it stays in the event stream. */
    json_object_del(metric, "eta_s");
    json_object_set_new(o, "last_metric", metric);
    json_object_set_new(o, "last_eval", parsed_or_null(j->last_eval));
    json_object_set_new(o, "engine", render_engine(j->engine));
    json_object_set_new(o, "cost", render_cost(cfg, j));
    json_t *tags = json_loads(j->tags ? j->tags : "[]", 0, NULL);
    json_object_set_new(o, "tags", tags ? tags : json_array());
    json_object_set_new(o, "stop_reason", jobview_text_or_null(j->stop_reason));
    int64_t stalled = j->state == JOB_RUNNING ? ops_stalled_since(j->id) : 0;
    json_object_set_new(o, "stalled_at", jobview_time(stalled));
    /* Where the job's event stream stands: a client wanting only the
     * recent events opens it at ?from=last_seq-N. */
    json_object_set_new(o, "last_seq", json_integer(db_events_last_seq(d, j->id)));
    return o;
}

json_t *jobview_json(const srv_config *cfg, db *d, const db_job *j)
{
    json_t *o = render_head(j);
    json_object_set_new(o, "spec", parsed_or_null(j->spec));
    json_object_update_new(o, render_tail(cfg, d, j));
    return o;
}

char *jobview_text(const srv_config *cfg, db *d, const db_job *j)
{
    json_t *head = render_head(j), *tail = render_tail(cfg, d, j);
    char *h = ty_json_dumps(head, JSON_COMPACT), *t = ty_json_dumps(tail, JSON_COMPACT);
    json_decref(head);
    json_decref(tail);
    const char *spec = j->spec ? j->spec : "null";
    size_t hn = h ? strlen(h) : 0, sn = strlen(spec), tn = t ? strlen(t) : 0;
    /* head is "{...}" and tail "{...}": both have fields, so the result is
     * head without its "}", the spec, and tail without its "{". */
    char *out = h && t && hn > 2 && tn > 2 ? malloc(hn + sn + tn + 16) : NULL;
    if (out) {
        size_t o = hn - 1;
        memcpy(out, h, o);
        memcpy(out + o, ",\"spec\":", 8);
        o += 8;
        memcpy(out + o, spec, sn);
        o += sn;
        out[o++] = ',';
        memcpy(out + o, t + 1, tn); /* with its NUL */
    }
    free(h);
    free(t);
    return out;
}
