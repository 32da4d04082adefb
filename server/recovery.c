/* recovery.c — the disk is the truth for checkpoints, the database its index.
 *
 * A crash can leave a job directory and the checkpoints table disagreeing:
 * an engine that outlived a killed server wrote a checkpoint nobody
 * recorded; an engine killed mid-write left a directory without its
 * MANIFEST.json; retention marked a row deleted but died before removing
 * the files; a full disk stopped a checkpoint half way. Before every start
 * or resume, and when a run ends, rec_reconcile() makes the two agree
 * again, always from what is on disk:
 *
 *   - a directory without MANIFEST.json is a partial write: removed;
 *   - a complete directory the database does not know (manifest valid, every
 *     file's size and sha256 checked) is adopted: recorded like an engine's
 *     checkpoint event (upload queued when the job has a store);
 *   - a directory whose manifest fails its sums is removed (it is not a
 *     checkpoint, and resuming it would fail the job);
 *   - a directory whose row is `deleted` is removed (retention's intent);
 *   - a `local` or `failed` row whose directory is gone is marked `deleted`,
 *     so it is no longer listed as a local checkpoint.
 *
 * An adopted checkpoint also brings back the metric events the killed
 * server never committed: the engine saves the metrics since its previous
 * checkpoint in trainer_state.json (`log_history`), and those past the
 * job's last recorded metric are appended, so GET /jobs/{id}/metrics has
 * every step the checkpoint covers.
 *
 * It runs only while no engine of the job is alive, so nothing is being
 * written under it. Known rows are checked by their manifest's sha256 only
 * (cheap); full sums are computed only for directories to adopt. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "recovery.h"
#include "sched_int.h"
#include "state.h"
#include "upload.h"
#include "tyutil.h"
#include "tyjson.h"

#define MANIFEST_FORMAT "trainyard-checkpoint/1" /* engine/ckpt.h CKPT_FORMAT */

static void rec_log(srv *s, int64_t job_id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void rec_log(srv *s, int64_t job_id, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "trainyard: job %lld: %s\n", (long long)job_id, msg);
    json_t *l = json_pack("{ss ss}", "line", msg, "level", "warn");
    char *data = l ? ty_json_dumps(l, JSON_COMPACT) : NULL;
    json_decref(l);
    if (data && s->evw)
        evw_push(s->evw, job_id, "log", data);
    else
        free(data);
}

int rec_manifest_check(const char *dir, bool sums, int64_t *step, char sha[65], uint64_t *bytes,
                       ty_err *err)
{
    char path[PATH_MAX + 400];
    snprintf(path, sizeof path, "%s/MANIFEST.json", dir);
    uint64_t mbytes = 0;
    int rc = ty_sha256_file(path, sha, &mbytes, err);
    if (rc) return rc;
    json_t *m = NULL;
    rc = ty_read_json(path, TY_ECORRUPT, &m, err);
    if (rc) return rc;
    json_t *files = json_object_get(m, "files"), *js = json_object_get(m, "step"),
           *fmt = json_object_get(m, "format");
    if (!json_is_array(files) || !json_is_integer(js) || !json_is_string(fmt) ||
        strcmp(json_string_value(fmt), MANIFEST_FORMAT)) {
        json_decref(m);
        return ty_err_set(err, TY_ECORRUPT, "%s is not a %s manifest", path, MANIFEST_FORMAT);
    }
    *step = json_integer_value(js);
    uint64_t total = mbytes;
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f)
    {
        const char *name = json_string_value(json_object_get(f, "path"));
        const char *want = json_string_value(json_object_get(f, "sha256"));
        json_t *jb = json_object_get(f, "bytes");
        if (!name || !want || !json_is_integer(jb) || strchr(name, '/') || !strcmp(name, "..")) {
            rc = ty_err_set(err, TY_ECORRUPT, "%s: bad file entry %zu", path, i);
            break;
        }
        total += (uint64_t)json_integer_value(jb);
        if (!sums) continue;
        char fp[2 * PATH_MAX + 400], hex[65];
        uint64_t got = 0;
        snprintf(fp, sizeof fp, "%s/%s", dir, name);
        if (ty_sha256_file(fp, hex, &got, NULL)) {
            rc = ty_err_set(err, TY_ECORRUPT, "%s is missing", fp);
            break;
        }
        if (got != (uint64_t)json_integer_value(jb) || strcmp(hex, want)) {
            rc = ty_err_set(err, TY_ECORRUPT, "%s: size or sha256 differs from the manifest", fp);
            break;
        }
    }
    json_decref(m);
    if (!rc && bytes) *bytes = total;
    return rc;
}

/* Records an adopted checkpoint and publishes its event (as note_checkpoint
 * does for an engine's report). */
static int adopt(srv *s, int64_t job_id, int64_t step, const char *rel, const char *path,
                 uint64_t bytes, const char *sha, const char *store, ty_err *err)
{
    db_event ev;
    pthread_mutex_lock(&s->write_lock);
    ty_err ferr = {0};
    evw_flush_locked(s->evw, &ferr);
    db *d = srv_db(s);
    int rc = d ? db_checkpoint_add(d, job_id, step, rel, (int64_t)bytes, sha, path, store, &ev, err)
               : ty_err_set(err, TY_EIO, "no database handle");
    if (rc == 0) {
        srv_publish(s, &ev);
        db_event_clear(&ev);
    }
    pthread_mutex_unlock(&s->write_lock);
    return rc;
}

static int retire(srv *s, const db_checkpoint *c, const char *store, ty_err *err)
{
    db_event ev;
    pthread_mutex_lock(&s->write_lock);
    ty_err ferr = {0};
    evw_flush_locked(s->evw, &ferr);
    db *d = srv_db(s);
    bool remote = store && (c->remote_uri || c->attempts > 0);
    int rc = d ? db_checkpoint_retire(d, c, remote ? store : NULL, &ev, err)
               : ty_err_set(err, TY_EIO, "no database handle");
    if (rc == 0 && ev.id) srv_publish(s, &ev);
    if (rc == 0) db_event_clear(&ev);
    pthread_mutex_unlock(&s->write_lock);
    return rc;
}

/* Appends the metrics of an adopted checkpoint's log_history whose step is
 * past *floor (the job's last recorded metric step), in step order. */
static void backfill_metrics(srv *s, int64_t job_id, const char *ckdir, int64_t *floor)
{
    char path[PATH_MAX + 400];
    snprintf(path, sizeof path, "%s/trainer_state.json", ckdir);
    json_t *st = NULL;
    if (ty_read_json(path, TY_ECORRUPT, &st, NULL)) return;
    json_t *hist = json_object_get(st, "log_history"), *m;
    size_t i;
    int n = 0;
    json_array_foreach(hist, i, m)
    {
        json_t *js = json_object_get(m, "step");
        if (!json_is_object(m) || !json_is_integer(js) || json_integer_value(js) <= *floor)
            continue;
        char *data = ty_json_dumps(m, JSON_COMPACT);
        if (!data) continue;
        evw_push(s->evw, job_id, "metric", data);
        *floor = json_integer_value(js);
        n++;
    }
    json_decref(st);
    if (n) rec_log(s, job_id, "recovered %d metric event(s) from %s/trainer_state.json", n, ckdir);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static const db_checkpoint *row_of(const db_checkpoint *c, int n, int64_t step)
{
    for (int i = 0; i < n; i++)
        if (c[i].step == step) return &c[i];
    return NULL;
}

static bool has_manifest(const char *dir)
{
    char m[PATH_MAX + 400];
    struct stat sb;
    snprintf(m, sizeof m, "%s/MANIFEST.json", dir);
    return stat(m, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The job's last recorded metric step (-1: none): metrics past it come
 * back from adopted checkpoints. */
static int64_t metric_floor(db *d, int64_t job_id)
{
    int64_t floor = -1;
    db_job j;
    if (db_job_get(d, job_id, &j, NULL) == 0) {
        json_t *lm = j.last_metric ? json_loads(j.last_metric, 0, NULL) : NULL;
        json_t *js = json_object_get(lm, "step");
        if (json_is_integer(js)) floor = json_integer_value(js);
        json_decref(lm);
        db_job_free(&j);
    }
    return floor;
}

/* The steps of root's step-NNNNNN directories (names the engine writes),
 * in step order, so adopted checkpoints and their metrics go in order. */
static int64_t *list_steps(const char *root, int *count)
{
    int64_t *steps = NULL;
    int ns = 0, cap = 0;
    DIR *dh = opendir(root);
    struct dirent *de;
    while (dh && (de = readdir(dh))) {
        long long step;
        char tail;
        char name[64];
        if (sscanf(de->d_name, "step-%lld%c", &step, &tail) != 1 || step < 0) continue;
        snprintf(name, sizeof name, "step-%06lld", step);
        if (strcmp(name, de->d_name)) continue; /* not a name the engine writes */
        if (ns == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *g = realloc(steps, (size_t)cap * sizeof *g);
            if (!g) break;
            steps = g;
        }
        steps[ns++] = step;
    }
    if (dh) closedir(dh);
    if (ns) qsort(steps, (size_t)ns, sizeof *steps, cmp_i64);
    *count = ns;
    return steps;
}

/* One checkpoint directory against its row (row may be NULL): partial,
 * deleted or corrupt directories are removed, unknown complete ones
 * adopted with the metrics they bring back. */
static void reconcile_dir(srv *s, int64_t job_id, const char *jobdir, long long step,
                          const db_checkpoint *row, const char *store, int64_t *floor)
{
    char path[PATH_MAX + 300], rel[300];
    snprintf(path, sizeof path, "%s/checkpoints/step-%06lld", jobdir, step);
    snprintf(rel, sizeof rel, "checkpoints/step-%06lld", step);
    ty_err e2 = {0};
    if (!has_manifest(path)) {
        if (ty_rm_rf(path, &e2) == 0)
            rec_log(s, job_id, "removed %s: partial checkpoint (no MANIFEST.json)", rel);
        return;
    }
    if (row && !strcmp(row->state, "deleted")) {
        if (ty_rm_rf(path, &e2) == 0)
            rec_log(s, job_id, "removed %s: its checkpoint was already deleted", rel);
        return;
    }
    char sha[65];
    uint64_t bytes = 0;
    int64_t mstep = -1;
    bool known = row && row->sha256 &&
                 rec_manifest_check(path, false, &mstep, sha, &bytes, &e2) == 0 &&
                 !strcmp(sha, row->sha256);
    if (known) return;
    ty_err_clear(&e2);
    if (rec_manifest_check(path, true, &mstep, sha, &bytes, &e2) || mstep != step) {
        if (!e2.msg[0]) ty_err_set(&e2, TY_ECORRUPT, "manifest says step %lld", (long long)mstep);
        ty_err e3 = {0};
        ty_rm_rf(path, &e3);
        rec_log(s, job_id, "removed %s: not a complete checkpoint (%s)", rel, e2.msg);
        return;
    }
    backfill_metrics(s, job_id, path, floor);
    if (adopt(s, job_id, step, rel, path, bytes, sha, store, &e2) == 0)
        rec_log(s, job_id, "adopted %s: complete on disk but not in the database", rel);
    else
        rec_log(s, job_id, "cannot record %s found on disk: %s", rel, e2.msg);
}

/* Rows that say "on disk" (local, failed) whose directory is gone: deleted. */
static void retire_missing(srv *s, int64_t job_id, const char *jobdir, const db_checkpoint *c,
                           int n, const char *store)
{
    for (int i = 0; i < n; i++) {
        if (strcmp(c[i].state, "local") && strcmp(c[i].state, "failed")) continue;
        char path[PATH_MAX + 300];
        if (c[i].local_path)
            snprintf(path, sizeof path, "%s", c[i].local_path);
        else
            snprintf(path, sizeof path, "%s/%s", jobdir, c[i].dir);
        if (has_manifest(path)) continue;
        ty_err e2 = {0};
        if (retire(s, &c[i], store, &e2) == 0)
            rec_log(s, job_id, "%s is gone from disk: marked deleted", c[i].dir);
    }
}

/* The newest complete checkpoint: on disk, or committed to the store. */
static int newest_complete(db *d, int64_t job_id, const char *jobdir, char **newest,
                           int64_t *newest_step, ty_err *err)
{
    db_checkpoint *c = NULL;
    int n = 0;
    int rc = db_checkpoint_list(d, job_id, &c, &n, err);
    if (rc) return rc;
    for (int i = n - 1; i >= 0; i--) {
        if (!strcmp(c[i].state, "deleted")) continue;
        char path[PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", jobdir, c[i].dir);
        bool remote = !strcmp(c[i].state, "committed") && c[i].remote_uri;
        if (!remote && !has_manifest(path)) continue;
        if (newest) *newest = strdup(c[i].dir);
        if (newest_step) *newest_step = c[i].step;
        break;
    }
    db_checkpoints_free(c, n);
    return 0;
}

int rec_reconcile(srv *s, int64_t job_id, const char *store, char **newest, int64_t *newest_step,
                  ty_err *err)
{
    if (newest) *newest = NULL;
    if (newest_step) *newest_step = -1;
    db *d = srv_db(s);
    if (!d) return ty_err_set(err, TY_EIO, "no database handle");
    db_checkpoint *c = NULL;
    int n = 0;
    int rc = db_checkpoint_list(d, job_id, &c, &n, err);
    if (rc) return rc;
    char jobdir[PATH_MAX], root[PATH_MAX + 16];
    srv_job_dir(s, job_id, jobdir, sizeof jobdir);
    snprintf(root, sizeof root, "%s/checkpoints", jobdir);
    int64_t floor = metric_floor(d, job_id);
    int ns = 0;
    int64_t *steps = list_steps(root, &ns);
    for (int k = 0; k < ns; k++)
        reconcile_dir(s, job_id, jobdir, steps[k], row_of(c, n, steps[k]), store, &floor);
    free(steps);
    retire_missing(s, job_id, jobdir, c, n, store);
    db_checkpoints_free(c, n);
    return newest_complete(d, job_id, jobdir, newest, newest_step, err);
}

int64_t rec_dir_step(const char *dir)
{
    const char *p = dir ? strrchr(dir, '/') : NULL;
    long long step;
    char tail;
    if (!p || sscanf(p + 1, "step-%lld%c", &step, &tail) != 1) return -1;
    return step;
}

int srv_disk_check(srv *s, ty_err *err)
{
    struct statvfs v;
    if (statvfs(s->cfg.data_dir, &v) != 0) return 0; /* cannot tell: let the write say */
    uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize;
    if (avail < SRV_MIN_FREE_BYTES)
        return ty_err_set(err, TY_ENOSPC,
                          "the data directory's disk is full (%llu bytes free); try again once "
                          "space is freed",
                          (unsigned long long)avail);
    return 0;
}

/* ---- the scheduler's recovery ----------------------------------------------------------------- */

/* A job whose engine had finished and that waited for its final uploads:
 * `stopping` with the intent "succeeded" (`running` in a database an
 * earlier server wrote). */
static bool waited_for_uploads(const db_job *j)
{
    return (j->state == JOB_STOPPING || j->state == JOB_RUNNING) && j->stop_intent &&
           !strcmp(j->stop_intent, "succeeded");
}

/* A cluster's job that is still running there is followed again as it
 * was, not stopped and submitted anew: same state, same stop intent. */
static bool reattach(sched *x, const db_job *j)
{
    if (!x->ex->ops->reattach) return false;
    if (waited_for_uploads(j)) return false; /* finished; only its uploads were pending */
    int fd = -1;
    exec_job *ej = x->ex->ops->reattach(x->ex, j->id, &fd);
    if (!ej) return false;
    run *r = run_new(x, j->id);
    if (!r) {
        x->ex->ops->release(x->ex, ej);
        return false;
    }
    r->store = sched_job_store(x->s, j->id);
    r->started = j->state != JOB_STARTING;
    run_hold(x, r);
    run_attach(x, r, ej, fd);
    if (j->state == JOB_STOPPING && j->stop_intent) {
        /* Asked again: the first signal may not have left before we died. */
        snprintf(r->intent, sizeof r->intent, "%s", j->stop_intent);
        stop_run(x, r, SIGTERM);
    }
    fprintf(stderr, "trainyard: job %lld: re-attached to its %s job after a restart\n",
            (long long)j->id, x->ex->ops->name);
    return true;
}

/* A job whose engine had finished while its final uploads were pending:
 * the queue kept the checkpoint's, the export is queued again, and the job
 * waits for them as before (sched_finalize's verdict). */
static void recover_waiting_uploads(sched *x, int64_t id)
{
    srv *s = x->s;
    uploader_export(s->up, id);
    waiter *w = calloc(1, sizeof *w);
    const char *why = "engine finished; server restarted while its final uploads were pending";
    if (!w) {
        sched_finalize(x, id, JOB_SUCCEEDED, why);
        return;
    }
    *w = (waiter){.job_id = id,
                  .to = JOB_SUCCEEDED,
                  .next = x->waiters,
                  .deadline_ms = ty_mono_ms() + s->cfg.upload_wait_s * 1000LL};
    snprintf(w->reason, sizeof w->reason, "%s", why);
    x->waiters = w;
}

/* The orphaned engine group of a job a previous server left live, sent
 * SIGTERM now; 0 when none is left. */
static int64_t recover_signal_orphan(sched *x, const db_job *j)
{
    int64_t pg = j->pgid;
    if (!(pg > 0 && x->ex->ops->orphan_alive(x->ex, j->id, pg))) pg = 0;
    if (pg) x->ex->ops->orphan_signal(x->ex, pg, SIGTERM);
    fprintf(stderr, "trainyard: job %lld: recovering after a restart%s\n", (long long)j->id,
            pg ? "; its previous engine group got SIGTERM" : "");
    return pg;
}

/* The state a live job of a previous server is settled in (not one that
 * waited for its final uploads): its recorded intent, else queued again. */
static job_state recover_outcome(const db_job *j, int64_t pg, db_job_update *up, char *reason,
                                 size_t cap)
{
    job_state to;
    if (j->state == JOB_STOPPING && j->stop_intent &&
        (!strcmp(j->stop_intent, "budget") || !strcmp(j->stop_intent, "restart") ||
         !strcmp(j->stop_intent, "fail"))) {
        /* Stopped by watch.c: a budget ends succeeded, a stall's
         * restart is requeued, a stall's failure fails. */
        bool budget = !strcmp(j->stop_intent, "budget"), again = !strcmp(j->stop_intent, "restart");
        to = budget ? JOB_SUCCEEDED : again ? JOB_QUEUED : JOB_FAILED;
        up->has_stop_reason = !again;
        up->stop_reason = budget ? "budget" : "stall";
        snprintf(reason, cap, "server restarted while stopping (%s%s)",
                 budget ? "a budget was reached" : "stalled, on_stall ",
                 budget ? "" : j->stop_intent);
        up->has_error = to == JOB_FAILED;
        up->error = reason;
    } else if (j->state == JOB_STOPPING && j->stop_intent) {
        bool pause = strcmp(j->stop_intent, "cancel") != 0;
        to = pause ? JOB_PAUSED : JOB_CANCELLED;
        snprintf(reason, cap, "server restarted while %s", pause ? "pausing" : "cancelling");
    } else {
        to = JOB_QUEUED;
        snprintf(reason, cap,
                 "server restarted; recovering%s (not counted as a "
                 "restart)",
                 pg ? ": waiting for the previous engine's final checkpoint" : "");
    }
    return to;
}

/* Recovery, first half, in sched_new before the API serves: every job a
 * previous server left starting, running or stopping is settled at once
 * in the database, and each orphaned engine group is sent SIGTERM (all of
 * them now; sched_recover_finish waits once for all). No job is then shown as an
 * engine-backed `running` job without an engine, and cancel and pause take
 * the ordinary paths for queued or paused jobs (202, honoured):
 *   - a job that had finished and only waited for its final uploads: waits
 *     for them again (its export is queued again), then succeeds or fails
 *     on their verdict (finalize);
 *   - a job that was stopping: its recorded intent (paused / cancelled);
 *   - any other: queued again, not counted as a restart (the server, not
 *     the job, failed). The scheduler does not start it until its old
 *     engine is gone and its checkpoints are reconciled. */
void sched_recover_mark(sched *x)
{
    srv *s = x->s;
    ty_err err = {0};
    int64_t *ids;
    int n;
    db *d = srv_db(s);
    const unsigned live = JOB_BIT(JOB_STARTING) | JOB_BIT(JOB_RUNNING) | JOB_BIT(JOB_STOPPING);
    if (!d || db_job_ids_in(d, live, &ids, &n, &err)) return;
    x->recov = n ? calloc((size_t)n, sizeof *x->recov) : NULL;
    for (int i = 0; i < n; i++) {
        db_job j;
        if (db_job_get(d, ids[i], &j, &err)) continue;
        if (reattach(x, &j)) {
            db_job_free(&j);
            continue;
        }
        int64_t pg = recover_signal_orphan(x, &j);
        if (x->recov) x->recov[x->nrecov++] = (recov){.job_id = j.id, .pgid = pg};
        db_job_update up = {.has_pgid = true, .pgid = 0, .has_gpus = true, .gpus = ""};
        char reason[256];
        if (waited_for_uploads(&j)) {
            db_job_update_fields(d, j.id, &up, &err);
            recover_waiting_uploads(x, j.id);
            db_job_free(&j);
            continue;
        }
        job_state to = recover_outcome(&j, pg, &up, reason, sizeof reason);
        up.set_finished = db_state_terminal(to);
        if (srv_transition(s, j.id, live, to, reason, &up, NULL, &err)) {
            /* A full disk: written by the scheduler once it has room. */
            fprintf(stderr, "trainyard: job %lld: recovery cannot record %s: %s; retrying\n",
                    (long long)j.id, db_state_name(to), err.msg);
            char *store = sched_job_store(s, j.id);
            sched_settle_later(x, j.id, to, -1, store, reason);
            free(store);
        }
        db_job_free(&j);
    }
    free(ids);
}

/* One wait for all the orphaned engine groups: SIGKILL for what is left
 * after the grace period, then up to 5 s for them to go. */
static void recover_wait_orphans(sched *x)
{
    int64_t deadline = ty_mono_ms() + x->s->cfg.grace_s * 1000LL;
    for (bool any = true; any;) {
        any = false;
        for (int i = 0; i < x->nrecov; i++)
            any |= x->recov[i].pgid && x->ex->ops->orphan_running(x->ex, x->recov[i].pgid);
        if (!any || x->stop) break;
        if (ty_mono_ms() >= deadline) {
            for (int i = 0; i < x->nrecov; i++)
                if (x->recov[i].pgid) x->ex->ops->orphan_signal(x->ex, x->recov[i].pgid, SIGKILL);
            int64_t gone = ty_mono_ms() + 5000;
            for (bool left = true; left && ty_mono_ms() < gone;) {
                left = false;
                for (int i = 0; i < x->nrecov; i++)
                    left |= x->recov[i].pgid && x->ex->ops->orphan_running(x->ex, x->recov[i].pgid);
                if (left) usleep(20000);
            }
            break;
        }
        usleep(20000);
    }
}

/* Recovery, second half, on the scheduler thread: one wait for all the
 * orphaned engine groups (SIGKILL for what is left after the grace
 * period), then each job's checkpoints are reconciled with its directory
 * and a queued or paused job resumes from the newest complete one. */
void sched_recover_finish(sched *x)
{
    srv *s = x->s;
    if (x->nrecov == 0) return;
    recover_wait_orphans(x);
    for (int i = 0; i < x->nrecov; i++) {
        int64_t id = x->recov[i].job_id;
        char *store = sched_job_store(s, id), *ck = NULL;
        int64_t step = -1;
        ty_err err = {0};
        if (rec_reconcile(s, id, store, &ck, &step, &err))
            fprintf(stderr, "trainyard: job %lld: checkpoint reconciliation: %s\n", (long long)id,
                    err.msg);
        db_job j;
        db *d = srv_db(s);
        pthread_mutex_lock(&x->mu);
        bool pause = x->recov[i].pause;
        pthread_mutex_unlock(&x->mu);
        if (d && db_job_get(d, id, &j, &err) == 0) {
            if (pause && j.state == JOB_QUEUED) {
                char reason[200];
                if (ck)
                    snprintf(reason, sizeof reason,
                             "pause requested while recovering; paused at "
                             "step %lld",
                             (long long)step);
                else
                    snprintf(reason, sizeof reason,
                             "pause requested while recovering; paused (no "
                             "checkpoint yet)");
                db_job_update up = {.has_resume_from = true, .resume_from = ck};
                srv_transition(s, id, JOB_BIT(JOB_QUEUED), JOB_PAUSED, reason, &up, NULL, &err);
            } else if (ck && (j.state == JOB_QUEUED || j.state == JOB_PAUSED)) {
                db_job_update up = {.has_resume_from = true, .resume_from = ck};
                db_job_update_fields(d, id, &up, &err);
            }
            db_job_free(&j);
        }
        free(ck);
        free(store);
    }
    pthread_mutex_lock(&x->mu);
    free(x->recov);
    x->recov = NULL;
    x->nrecov = 0;
    pthread_mutex_unlock(&x->mu);
}
