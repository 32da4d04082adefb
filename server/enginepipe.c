/* enginepipe.c — rank 0's event lines (DESIGN §3): each line read from
 * the executor's descriptor becomes a job event through the writer, a
 * checkpoint row, or the run's outcome (done, error); a flood or a
 * malformed line is a protocol violation that fails the job. */
#include "sched_int.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>

#include "ops.h"
#include "state.h"
#include "upload.h"
#include "tyutil.h"
#include "tyjson.h"

#define READ_BUDGET (256 * 1024) /* bytes read per pipe per wake-up */

/* Records a checkpoint the engine reported: its manifest must exist (a
 * checkpoint without one does not exist, DESIGN §6); the row carries the
 * manifest's sha256. */
static void note_checkpoint(sched *x, run *r, json_t *o)
{
    srv *s = x->s;
    json_t *jstep = json_object_get(o, "step"), *jdir = json_object_get(o, "dir");
    const char *dir = json_string_value(jdir);
    char msg[512];
    if (!json_is_integer(jstep) || !dir || !*dir || dir[0] == '/' || strstr(dir, "..")) {
        run_violation(x, r,
                      "engine protocol error: checkpoint event needs an integer step and a "
                      "relative dir");
        return;
    }
    char jobdir[PATH_MAX], path[PATH_MAX + 256], manifest[PATH_MAX + 300];
    srv_job_dir(s, r->job_id, jobdir, sizeof jobdir);
    snprintf(path, sizeof path, "%s/%s", jobdir, dir);
    snprintf(manifest, sizeof manifest, "%s/MANIFEST.json", path);
    char sha[65];
    uint64_t mbytes = 0;
    ty_err err = {0};
    if (ty_sha256_file(manifest, sha, &mbytes, &err)) {
        snprintf(msg, sizeof msg,
                 "checkpoint %s reported without a readable MANIFEST.json; ignored", dir);
        json_t *l = json_pack("{ss ss}", "line", msg, "level", "warn");
        evw_push(s->evw, r->job_id, "log", ty_json_dumps(l, JSON_COMPACT));
        json_decref(l);
        return;
    }
    json_int_t bytes = json_integer_value(json_object_get(o, "bytes"));
    db_event ev;
    pthread_mutex_lock(&s->write_lock);
    evw_flush_locked(s->evw, &err);
    db *d = srv_db(s);
    if (d && db_checkpoint_add(d, r->job_id, json_integer_value(jstep), dir, bytes, sha, path,
                               r->store, &ev, &err) == 0) {
        srv_publish(s, &ev);
        db_event_clear(&ev);
    }
    pthread_mutex_unlock(&s->write_lock);
    if (r->store) uploader_wake(s->up);
    /* The server is the one owner of pruning (the engine leaves it to us
     * when supervised): keep_last / keep_best are applied to the rows, so a
     * checkpoint the database still points at is never removed under it. */
    upload_retention(s, r->job_id);
}

/* Flood limit: a token bucket of event_rate per second, 2 s deep; an
 * engine over it is a protocol violation (true). */
static bool flooded(sched *x, run *r)
{
    srv *s = x->s;
    if (s->cfg.event_rate <= 0) return false;
    int64_t now = ty_mono_ms();
    r->bucket += (double)(now - r->bucket_ms) * s->cfg.event_rate / 1000.0;
    double cap = 2.0 * s->cfg.event_rate;
    if (r->bucket > cap) r->bucket = cap;
    r->bucket_ms = now;
    if (r->bucket < 1.0) {
        char why[160];
        snprintf(why, sizeof why, "engine flooded its event pipe (more than %d events/s); killed",
                 s->cfg.event_rate);
        run_violation(x, r, why);
        return true;
    }
    r->bucket -= 1.0;
    return false;
}

/* metric, eval, log and started become job events as they are (less
 * "ev"); a metric feeds the stall watch, the first started moves the job
 * to running. */
static void record_event(sched *x, run *r, json_t *o, const char *ev)
{
    srv *s = x->s;
    static const char *const types[] = {"metric", "eval", "log", "started"};
    const char *type = NULL;
    for (size_t i = 0; i < 4; i++)
        if (!strcmp(ev, types[i])) type = types[i];
    json_object_del(o, "ev");
    evw_push(s->evw, r->job_id, type, ty_json_dumps(o, JSON_COMPACT));
    if (type == types[0])
        ops_note_metric(s, r->job_id, json_integer_value(json_object_get(o, "step")));
    if (type == types[3] && !r->started) {
        r->started = true;
        ty_err err = {0};
        srv_transition(s, r->job_id, JOB_BIT(JOB_STARTING), JOB_RUNNING, "engine started", NULL,
                       NULL, &err);
    }
}

static void handle_line(sched *x, run *r, const char *line, size_t len)
{
    srv *s = x->s;
    if (len == 0 || flooded(x, r)) return;
    json_error_t jerr;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    const char *ev = o ? json_string_value(json_object_get(o, "ev")) : NULL;
    if (!o || !json_is_object(o) || !ev) {
        char why[300];
        snprintf(why, sizeof why,
                 "engine protocol error: event line is not a JSON object with "
                 "\"ev\": %.160s",
                 o ? "missing ev" : jerr.text);
        json_decref(o);
        run_violation(x, r, why);
        return;
    }
    if (!strcmp(ev, "done")) {
        const char *st = json_string_value(json_object_get(o, "status"));
        if (st && !strcmp(st, "succeeded"))
            r->done_succeeded = true;
        else if (st && !strcmp(st, "stopped"))
            r->done_stopped = true;
        else
            run_violation(x, r, "engine protocol error: done needs status succeeded or stopped");
    } else if (!strcmp(ev, "error")) {
        const char *m = json_string_value(json_object_get(o, "message"));
        sched_set_str(&r->error, "%s", m ? m : "engine reported an error without a message");
    } else if (!strcmp(ev, "checkpoint")) {
        note_checkpoint(x, r, o);
    } else if (!strcmp(ev, "metric") || !strcmp(ev, "eval") || !strcmp(ev, "log") ||
               !strcmp(ev, "started")) {
        record_event(x, r, o, ev);
    } else {
        char msg[200];
        snprintf(msg, sizeof msg, "unknown engine event '%.64s' ignored", ev);
        json_t *l = json_pack("{ss ss}", "line", msg, "level", "warn");
        evw_push(s->evw, r->job_id, "log", ty_json_dumps(l, JSON_COMPACT));
        json_decref(l);
    }
    json_decref(o);
}

void run_read_pipe(sched *x, run *r)
{
    char buf[16384];
    size_t budget = READ_BUDGET;
    while (r->ev_open && budget > 0) {
        ssize_t k = x->ex->ops->read(x->ex, r->ej, buf, sizeof buf);
        if (k == 0) return;
        if (k < 0) { /* EOF: the engine closed fd 3 or exited */
            if (r->line_len > 0 && !r->fail_reason) handle_line(x, r, r->line, r->line_len);
            r->line_len = 0;
            if (r->fd >= 0) epoll_ctl(x->efd, EPOLL_CTL_DEL, r->fd, NULL);
            r->fd = -1;
            r->ev_open = false; /* the executor closed its end */
            return;
        }
        budget -= (size_t)k;
        for (ssize_t i = 0; i < k && r->ev_open; i++) {
            if (buf[i] == '\n') {
                handle_line(x, r, r->line, r->line_len);
                r->line_len = 0;
            } else if (r->line_len == LINE_MAX_BYTES) {
                char why[128];
                snprintf(why, sizeof why, "engine protocol error: event line longer than %d bytes",
                         LINE_MAX_BYTES);
                run_violation(x, r, why);
            } else {
                r->line[r->line_len++] = buf[i];
            }
        }
    }
}
