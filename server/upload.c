/* upload.c — checkpoint upload workers, retention, the export's upload and
 * the final verdict (see upload.h and docs/storage.md, "Wiring"); bringing
 * checkpoints and inputs back before a start is fetch.c.
 *
 * The queue is the `uploads` table, so it survives a crash: workers claim
 * one row at a time in a transaction (two workers never take the same row),
 * run the transfer outside any lock, and record the outcome with the
 * checkpoint's new state and its `checkpoint` event. Events are committed
 * and published under srv->write_lock like every other event, so streams
 * keep their id order. Error texts stored and shown come from the storage
 * library, which never puts credentials in a message. */
#include "upload.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "jobspec.h"
#include "retention.h"
#include "disk.h"
#include "state.h"
#include "storage.h"
#include "tyutil.h"
#include "tyjson.h"

#define UPLOAD_POLL_MS 500       /* idle workers look for due retries this often */
#define UPLOAD_BACKOFF_MAX_S 60  /* retry delays double from 2 s up to this */
#define UPLOAD_PROBE_TIMEOUT_S 4 /* per request of the submit-time store probe */

/* One transfer in flight, findable by job so pause/cancel can abort it. */
typedef struct active {
    int64_t job_id;
    store *st;
    struct active *next;
} active;

/* A finished job's export/ waiting for (or in) its upload. Not in the
 * database: the job waits for it in `stopping` with stop_intent
 * "succeeded", and the scheduler queues it again when it recovers such a
 * job after a restart. */
typedef struct export_job {
    int64_t job_id;
    bool running;
    struct export_job *next;
} export_job;

struct uploader {
    srv *s;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stop;
    int wakes; /* pending wake-ups, so a wake between polls is not lost */
    active *act;
    export_job *exports;   /* queued or running export uploads, oldest last */
    uploader_done_fn done; /* after each finished upload or export */
    void *done_ctx;
    bool recovered; /* the uploads a previous server left running are queued again */
    int nthreads;
    pthread_t *threads;
};

void upload_remote_prefix(int64_t job_id, const char *dir, char *out, size_t cap)
{
    snprintf(out, cap, "job-%lld/%s", (long long)job_id, dir);
}

static int open_store(srv *s, const char *uri, store **out, ty_err *err)
{
    store_config cfg;
    srv_store_config(&s->cfg, &cfg);
    return store_open(uri, &cfg, out, err);
}

/* Commits a db change that produced an event and publishes it, in order
 * after any engine events the writer holds (the srv_transition rule). */
typedef int (*db_step_fn)(db *d, void *arg, db_event *ev, ty_err *err);
static int with_event(srv *s, db_step_fn fn, void *arg, ty_err *err)
{
    db_event ev;
    memset(&ev, 0, sizeof ev);
    pthread_mutex_lock(&s->write_lock);
    evw_flush_locked(s->evw, err);
    db *d = srv_db(s);
    int rc = d ? fn(d, arg, &ev, err) : ty_err_set(err, TY_EIO, "no database handle");
    if (rc == 0 && ev.id > 0) srv_publish(s, &ev);
    db_event_clear(&ev);
    pthread_mutex_unlock(&s->write_lock);
    return rc;
}

typedef struct claim_arg {
    db_upload *u;
} claim_arg;

static int claim_fn(db *d, void *arg, db_event *ev, ty_err *err)
{
    return db_upload_claim(d, ty_now_ms(), ((claim_arg *)arg)->u, ev, err);
}

typedef struct finish_arg {
    const db_upload *u;
    db_upload_outcome o;
    const char *remote_uri, *error;
    int64_t retry_at;
} finish_arg;

static int finish_fn(db *d, void *arg, db_event *ev, ty_err *err)
{
    finish_arg *a = arg;
    return db_upload_finish(d, a->u, a->o, a->remote_uri, a->error, a->retry_at, ev, err);
}

typedef struct retire_arg {
    const db_checkpoint *c;
    const char *store_uri;
} retire_arg;

static int retire_fn(db *d, void *arg, db_event *ev, ty_err *err)
{
    retire_arg *a = arg;
    return db_checkpoint_retire(d, a->c, a->store_uri, ev, err);
}

/* ---- the job's checkpoint settings ------------------------------------------------------ */

typedef struct ckpt_policy {
    char *store; /* NULL: the job has no remote store */
    int keep_last, keep_best;
} ckpt_policy;

static int job_policy(srv *s, int64_t job_id, ckpt_policy *p, ty_err *err)
{
    memset(p, 0, sizeof *p);
    db *d = srv_db(s);
    db_job j;
    if (!d) return ty_err_set(err, TY_EIO, "no database handle");
    int rc = db_job_get(d, job_id, &j, err);
    if (rc) return rc;
    jobspec spec;
    rc = srv_job_spec(&j, &spec, err);
    db_job_free(&j);
    if (rc) return rc;
    p->store = spec.store ? strdup(spec.store) : NULL;
    p->keep_last = spec.keep_last;
    p->keep_best = spec.keep_best;
    jobspec_free(&spec);
    return 0;
}

/* ---- workers ------------------------------------------------------------------------------ */

static void act_add(uploader *u, active *a)
{
    pthread_mutex_lock(&u->mu);
    a->next = u->act;
    u->act = a;
    /* A stop that came before we registered must still abort us. */
    if (u->stop) store_cancel(a->st);
    pthread_mutex_unlock(&u->mu);
}

static void act_remove(uploader *u, active *a)
{
    pthread_mutex_lock(&u->mu);
    for (active **pp = &u->act; *pp; pp = &(*pp)->next)
        if (*pp == a) {
            *pp = a->next;
            break;
        }
    pthread_mutex_unlock(&u->mu);
}

/* Opens the job's store for one transfer and lists it as active until
 * close_active, so pause/cancel and shutdown reach it through store_cancel. */
static int open_active(uploader *u, int64_t job_id, const char *uri, active *a, ty_err *err)
{
    *a = (active){.job_id = job_id};
    int rc = open_store(u->s, uri, &a->st, err);
    if (rc == 0) act_add(u, a);
    return rc;
}

static void close_active(uploader *u, active *a)
{
    act_remove(u, a);
    store_close(a->st);
}

/* Is this checkpoint the job's newest one still standing? */
static bool is_newest(srv *s, const db_upload *up)
{
    db *d = srv_db(s);
    db_checkpoint *c;
    int n;
    ty_err err = {0};
    if (!d || db_checkpoint_list(d, up->job_id, &c, &n, &err)) return true;
    bool newest = true;
    for (int i = 0; i < n; i++)
        if (c[i].step > up->step && strcmp(c[i].state, "deleted")) newest = false;
    db_checkpoints_free(c, n);
    return newest;
}

static int64_t backoff_ms(int attempts)
{
    int64_t d = 2000LL << (attempts > 5 ? 5 : attempts - 1);
    if (d > UPLOAD_BACKOFF_MAX_S * 1000LL) d = UPLOAD_BACKOFF_MAX_S * 1000LL;
    return d;
}

/* A put failed for good: the job says so (checkpoint_error, shown by GET
 * /jobs, the dashboard and `trainyard status`) until a later one does. */
static void set_checkpoint_error(srv *s, int64_t job_id, const char *what, const char *uri,
                                 const char *reason)
{
    char text[1200];
    snprintf(text, sizeof text, "%s not uploaded to %s: %s", what, uri, reason);
    db *d = srv_db(s);
    ty_err err = {0};
    db_job_update up = {.has_checkpoint_error = true, .checkpoint_error = text};
    if (!d || db_job_update_fields(d, job_id, &up, &err))
        ty_logf("job %lld: cannot record checkpoint_error: %s", (long long)job_id, err.msg);
}

/* "checkpoints/step-000020" → "step-000020" for messages. */
static const char *dir_name(const char *dir)
{
    const char *slash = strrchr(dir, '/');
    return slash ? slash + 1 : dir;
}

/* The local checkpoint is gone (a standalone engine's keep_last, or a
 * directory removed by hand) before or while we read it. Not a failure,
 * unless it was the job's newest
 * (the one a resume needs). */
static void finish_vanished(srv *s, db_upload *up)
{
    ty_err err = {0};
    char reason[700];
    finish_arg fa = {.u = up, .o = DB_UP_SKIPPED, .error = "removed locally before upload"};
    if (is_newest(s, up)) {
        snprintf(reason, sizeof reason, "local checkpoint %s is gone before it was uploaded",
                 up->dir);
        fa.o = DB_UP_FAILED;
        fa.error = reason;
    }
    if (with_event(s, finish_fn, &fa, &err) == 0 && fa.o == DB_UP_FAILED)
        set_checkpoint_error(s, up->job_id, dir_name(up->dir), up->uri, reason);
}

static void do_put(uploader *u, db_upload *up)
{
    srv *s = u->s;
    ty_err err = {0};
    finish_arg fa = {.u = up};
    char manifest[PATH_MAX + 32], prefix[600], remote[2048] = "", reason[700];
    snprintf(manifest, sizeof manifest, "%s/MANIFEST.json", up->local_path ? up->local_path : "");
    struct stat sb;
    if (!up->local_path || stat(manifest, &sb) != 0) {
        finish_vanished(s, up);
        return;
    }
    upload_remote_prefix(up->job_id, up->dir, prefix, sizeof prefix);
    active a;
    int rc = open_active(u, up->job_id, up->uri, &a, &err);
    if (rc == 0) {
        uint64_t bytes = 0;
        rc = store_put_checkpoint(a.st, up->local_path, prefix, &bytes, &err);
        if (rc == 0) snprintf(remote, sizeof remote, "%s/%s", store_uri(a.st), prefix);
        close_active(u, &a);
    }
    if (rc != 0 && rc != TY_ESTATE && stat(manifest, &sb) != 0) {
        finish_vanished(s, up);
        return;
    }
    if (rc == 0) {
        fa.o = DB_UP_DONE;
        fa.remote_uri = remote;
    } else {
        bool stopping = rc == TY_ESTATE; /* store_cancel: pause timeout or shutdown */
        bool transient = stopping || rc == TY_EIO || rc == TY_ENOMEM;
        if (stopping)
            snprintf(reason, sizeof reason, "upload cancelled (it stays queued): %s", err.msg);
        else
            snprintf(reason, sizeof reason, "%s (attempt %d of %d)", err.msg, up->attempts,
                     s->cfg.upload_attempts);
        fa.error = reason;
        if (transient && (stopping || up->attempts < s->cfg.upload_attempts)) {
            fa.o = DB_UP_RETRY;
            fa.retry_at = ty_now_ms() + (stopping ? 1000 : backoff_ms(up->attempts));
        } else {
            fa.o = DB_UP_FAILED;
        }
        ty_logf("job %lld: upload of %s failed: %s", (long long)up->job_id, up->dir, reason);
    }
    ty_err e2 = {0};
    if (with_event(s, finish_fn, &fa, &e2))
        ty_logf("job %lld: cannot record the upload of %s: %s", (long long)up->job_id, up->dir,
                e2.msg);
    else if (fa.o == DB_UP_FAILED)
        set_checkpoint_error(s, up->job_id, dir_name(up->dir), up->uri, reason);
    if (rc == 0) upload_retention(s, up->job_id);
}

static void do_delete(uploader *u, db_upload *up)
{
    srv *s = u->s;
    ty_err err = {0};
    char prefix[600];
    upload_remote_prefix(up->job_id, up->dir, prefix, sizeof prefix);
    active a;
    int rc = open_active(u, up->job_id, up->uri, &a, &err);
    if (rc == 0) {
        rc = store_delete_checkpoint(a.st, prefix, &err);
        close_active(u, &a);
    }
    finish_arg fa = {.u = up, .o = DB_UP_DONE};
    if (rc != 0 && rc != TY_ENOENT) {
        /* Never blocks or fails the job: retried later, logged only. */
        fa.o = up->attempts < s->cfg.upload_attempts * 4 ? DB_UP_RETRY : DB_UP_FAILED;
        fa.error = err.msg;
        fa.retry_at = ty_now_ms() + backoff_ms(up->attempts);
        ty_logf("job %lld: remote delete of %s failed (%s): %s", (long long)up->job_id, up->dir,
                fa.o == DB_UP_RETRY ? "will retry" : "gave up", err.msg);
    }
    ty_err e2 = {0};
    with_event(s, finish_fn, &fa, &e2);
}

static void do_export(uploader *u, int64_t job_id);

/* The oldest queued export not yet running, marked running; 0 if none.
 * Called with u->mu held. */
static int64_t take_export(uploader *u)
{
    export_job *pick = NULL;
    for (export_job *e = u->exports; e; e = e->next)
        if (!e->running) pick = e;
    if (!pick) return 0;
    pick->running = true;
    return pick->job_id;
}

static void notify_done(uploader *u)
{
    if (u->done) u->done(u->done_ctx);
}

/* The uploads a previous server left running are queued again once the
 * database is writable: at start, or when a start on a full disk (served
 * read-only, disk.c) gets room again. Before any worker claims one: at
 * start in uploader_new, later by the first worker to see the database
 * writable (under u->mu). */
static int requeue_interrupted(uploader *u, ty_err *err)
{
    int requeued = 0;
    db *d = srv_db(u->s);
    if (!d) return ty_err_set(err, TY_EIO, "no database handle");
    if (db_upload_recover(d, &requeued, err)) return -1;
    u->recovered = true;
    if (requeued > 0)
        ty_logf("%d checkpoint upload(s) interrupted by the last shutdown are queued again",
                requeued);
    return 0;
}

static void recover_interrupted(uploader *u)
{
    ty_err err = {0};
    if (u->recovered || !srv_disk_writable(u->s)) return;
    if (requeue_interrupted(u, &err)) ty_logf("upload queue: %s", err.msg);
}

static void *worker_main(void *arg)
{
    uploader *u = arg;
    srv *s = u->s;
    pthread_mutex_lock(&u->mu);
    while (!u->stop) {
        recover_interrupted(u);
        /* A finished job's export first: its final state waits for it. */
        int64_t ex = take_export(u);
        if (ex) {
            pthread_mutex_unlock(&u->mu);
            do_export(u, ex);
            notify_done(u);
            pthread_mutex_lock(&u->mu);
            continue;
        }
        pthread_mutex_unlock(&u->mu);
        db_upload up;
        ty_err err = {0};
        claim_arg ca = {.u = &up};
        int rc = with_event(s, claim_fn, &ca, &err);
        if (rc == 0) {
            if (!strcmp(up.op, "put"))
                do_put(u, &up);
            else
                do_delete(u, &up);
            db_upload_clear(&up);
            notify_done(u); /* a job may be waiting for this upload */
            pthread_mutex_lock(&u->mu);
            continue;
        }
        if (rc != TY_ENOENT) ty_logf("upload queue: %s", err.msg);
        pthread_mutex_lock(&u->mu);
        if (u->wakes > 0) {
            u->wakes--;
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + UPLOAD_POLL_MS * 1000000LL;
        ts.tv_sec += ns / 1000000000LL;
        ts.tv_nsec = ns % 1000000000LL;
        if (!u->stop) pthread_cond_timedwait(&u->cond, &u->mu, &ts);
        if (u->wakes > 0) u->wakes--;
    }
    pthread_mutex_unlock(&u->mu);
    srv_db_release(s);
    return NULL;
}

uploader *uploader_new(srv *s, uploader_done_fn done, void *ctx, ty_err *err)
{
    if (!srv_db(s)) {
        ty_err_set(err, TY_EIO, "no database handle");
        return NULL;
    }
    uploader *u = calloc(1, sizeof *u);
    if (u) u->threads = calloc((size_t)s->cfg.upload_workers, sizeof *u->threads);
    if (!u || !u->threads) {
        if (u) free(u);
        ty_err_set(err, TY_ENOMEM, "out of memory");
        return NULL;
    }
    u->s = s;
    u->done = done;
    u->done_ctx = ctx;
    pthread_mutex_init(&u->mu, NULL);
    /* The start fails where a writable database cannot queue them again. */
    if (srv_disk_writable(s) && requeue_interrupted(u, err)) {
        pthread_mutex_destroy(&u->mu);
        free(u->threads);
        free(u);
        return NULL;
    }
    pthread_cond_init(&u->cond, NULL);
    for (int i = 0; i < s->cfg.upload_workers; i++) {
        if (pthread_create(&u->threads[i], NULL, worker_main, u)) {
            ty_err_set(err, TY_EINTERNAL, "cannot start upload worker %d", i);
            uploader_stop(u);
            uploader_free(u);
            return NULL;
        }
        u->nthreads++;
    }
    return u;
}

void uploader_wake(uploader *u)
{
    if (!u) return;
    pthread_mutex_lock(&u->mu);
    u->wakes++;
    pthread_cond_signal(&u->cond);
    pthread_mutex_unlock(&u->mu);
}

bool uploader_job_busy(uploader *u, int64_t job_id, bool final)
{
    if (!u) return false;
    bool exporting = false;
    pthread_mutex_lock(&u->mu);
    for (export_job *e = u->exports; e; e = e->next)
        if (e->job_id == job_id) exporting = true;
    pthread_mutex_unlock(&u->mu);
    if (exporting) return true;
    int n = 0;
    ty_err err = {0};
    db *d = srv_db(u->s);
    if (!d || db_upload_busy(d, job_id, final, &n, &err)) return false;
    return n > 0;
}

void uploader_cancel_job(uploader *u, int64_t job_id)
{
    if (!u) return;
    pthread_mutex_lock(&u->mu);
    for (active *a = u->act; a; a = a->next)
        if (a->job_id == job_id) store_cancel(a->st);
    pthread_mutex_unlock(&u->mu);
}

void uploader_stop(uploader *u)
{
    if (!u) return;
    pthread_mutex_lock(&u->mu);
    u->stop = true;
    for (active *a = u->act; a; a = a->next)
        store_cancel(a->st);
    pthread_cond_broadcast(&u->cond);
    pthread_mutex_unlock(&u->mu);
    for (int i = 0; i < u->nthreads; i++)
        pthread_join(u->threads[i], NULL);
    u->nthreads = 0;
}

void uploader_free(uploader *u)
{
    if (!u) return;
    while (u->exports) {
        export_job *e = u->exports;
        u->exports = e->next;
        free(e);
    }
    pthread_mutex_destroy(&u->mu);
    pthread_cond_destroy(&u->cond);
    free(u->threads);
    free(u);
}

/* ---- retention ---------------------------------------------------------------------------- */

void upload_retention_pick(const db_checkpoint *c, int n, int keep_last, int keep_best,
                           const double *loss, bool *keep)
{
    /* Rows are in step order; the server is the one owner of pruning, local
     * and remote, and chooses as a standalone engine does (retention.h). */
    ty_ret_item *it = malloc(((size_t)n + 1) * sizeof *it);
    if (!it) { /* out of memory: keep everything rather than guess */
        for (int i = 0; i < n; i++)
            keep[i] = true;
        return;
    }
    for (int i = 0; i < n; i++) {
        it[i].kind = !strcmp(c[i].state, "deleted")     ? TY_RET_GONE
                     : !strcmp(c[i].state, "committed") ? TY_RET_COMMITTED
                                                        : TY_RET_STANDING;
        it[i].loss = loss[i];
    }
    ty_retention_select(it, n, keep_last, keep_best, keep);
    free(it);
}

void upload_retention(srv *s, int64_t job_id)
{
    ty_err err = {0};
    ckpt_policy p;
    if (job_policy(s, job_id, &p, &err)) return;
    db *d = srv_db(s);
    db_checkpoint *c = NULL;
    int n = 0;
    bool *keep = NULL;
    double *loss = NULL;
    if (p.keep_last <= 0 && p.keep_best <= 0) goto out;
    if (!d || db_checkpoint_list(d, job_id, &c, &n, &err)) goto out;
    keep = calloc((size_t)n + 1, sizeof *keep);
    loss = calloc((size_t)n + 1, sizeof *loss);
    if (!keep || !loss) goto out;
    for (int i = 0; i < n; i++)
        if (p.keep_best <= 0 || db_checkpoint_eval_loss(d, job_id, c[i].step, &loss[i], &err))
            loss[i] = NAN;
    upload_retention_pick(c, n, p.keep_last, p.keep_best, loss, keep);
    for (int i = 0; i < n; i++) {
        if (keep[i] || !strcmp(c[i].state, "deleted") || !strcmp(c[i].state, "uploading")) continue;
        /* A remote copy may exist (committed) or be partly there (a failed
         * or interrupted try): either way the remote delete is queued. */
        bool remote = p.store && (c[i].remote_uri || c[i].attempts > 0);
        retire_arg ra = {.c = &c[i], .store_uri = remote ? p.store : NULL};
        ty_err e2 = {0};
        if (with_event(s, retire_fn, &ra, &e2)) continue; /* being uploaded: next pass */
        if (c[i].local_path && ty_rm_rf(c[i].local_path, &e2) && e2.code != TY_ENOENT)
            ty_logf("job %lld: cannot remove %s: %s", (long long)job_id, c[i].local_path, e2.msg);
    }
    if (s->up) uploader_wake(s->up);
out:
    free(keep);
    free(loss);
    db_checkpoints_free(c, n);
    free(p.store);
}

/* ---- purge -------------------------------------------------------------------------------- */

int upload_purge_job(srv *s, int64_t job_id, ty_err *err)
{
    ckpt_policy p;
    int rc = job_policy(s, job_id, &p, err);
    if (rc) return rc;
    db *d = srv_db(s);
    db_checkpoint *c = NULL;
    int n = 0, running = 0;
    if (!d) rc = ty_err_set(err, TY_EIO, "no database handle");
    /* Nothing may upload behind our back: drop the queue rows, cancel the
     * running ones (a cancelled upload commits nothing) until none is left. */
    for (int64_t until = ty_mono_ms() + 30000; d && rc == 0;) {
        if ((rc = db_upload_drop_job(d, job_id, &running, err)) || running == 0) break;
        if (ty_mono_ms() > until) {
            rc = ty_err_set(err, TY_ESTATE, "an upload of job %lld does not stop",
                            (long long)job_id);
            break;
        }
        uploader_cancel_job(s->up, job_id);
        usleep(50000);
    }
    if (rc == 0 && p.store && (rc = db_checkpoint_list(d, job_id, &c, &n, err)) == 0) {
        store *st = NULL;
        if ((rc = open_store(s, p.store, &st, err)) == 0) {
            /* Every row, whatever its state: a failed or deleted one may
             * have left files behind. Missing objects count as deleted. */
            for (int i = 0; i < n && rc == 0; i++) {
                char prefix[600];
                upload_remote_prefix(job_id, c[i].dir, prefix, sizeof prefix);
                rc = store_delete_checkpoint(st, prefix, err);
                if (rc == TY_ENOENT) rc = 0;
            }
            store_close(st);
        }
    }
    db_checkpoints_free(c, n);
    free(p.store);
    return rc;
}

/* ---- the export, the final verdict, the store probe --------------------------------------- */

static void export_paths(srv *s, int64_t job_id, char *dir, char *marker, size_t cap)
{
    char jobdir[PATH_MAX];
    srv_job_dir(s, job_id, jobdir, sizeof jobdir);
    snprintf(dir, cap, "%.4000s/export", jobdir);
    snprintf(marker, cap, "%.4000s/export.uploaded", jobdir);
}

static bool is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

void uploader_export(uploader *u, int64_t job_id)
{
    if (!u) return;
    ckpt_policy p;
    ty_err err = {0};
    if (job_policy(u->s, job_id, &p, &err)) return;
    char dir[PATH_MAX], marker[PATH_MAX];
    export_paths(u->s, job_id, dir, marker, sizeof dir);
    bool want = p.store && is_dir(dir);
    free(p.store);
    if (!want) return;
    /* The marker says "this export is in the store"; a new export (the
     * engine rewrites export/ whole) is not until uploaded again. */
    unlink(marker);
    export_job *e = calloc(1, sizeof *e);
    if (!e) return; /* the verdict then says the export was not uploaded */
    e->job_id = job_id;
    pthread_mutex_lock(&u->mu);
    for (export_job *x = u->exports; x; x = x->next)
        if (x->job_id == job_id) { /* already queued or running */
            free(e);
            e = NULL;
            break;
        }
    if (e) {
        e->next = u->exports;
        u->exports = e;
        u->wakes++;
        pthread_cond_signal(&u->cond);
    }
    pthread_mutex_unlock(&u->mu);
}

static void job_log(srv *s, int64_t job_id, const char *level, const char *line)
{
    json_t *l = json_pack("{ss ss}", "line", line, "level", level);
    char *text = l ? ty_json_dumps(l, JSON_COMPACT) : NULL;
    json_decref(l);
    if (text) evw_push(s->evw, job_id, "log", text);
}

/* Uploads <job dir>/export/ to STORE/job-<id>/export/ once (each request
 * is retried by storage/); the outcome is the marker file or the job's
 * checkpoint_error, which the final verdict reads. */
static void do_export(uploader *u, int64_t job_id)
{
    srv *s = u->s;
    ty_err err = {0};
    ckpt_policy p;
    char dir[PATH_MAX], marker[PATH_MAX], prefix[64], remote[2200], line[2600];
    export_paths(s, job_id, dir, marker, sizeof dir);
    snprintf(prefix, sizeof prefix, "job-%lld/export", (long long)job_id);
    int rc = job_policy(s, job_id, &p, &err);
    if (rc == 0 && !p.store) rc = ty_err_set(&err, TY_EINVAL, "the job has no checkpoint.store");
    uint64_t bytes = 0;
    int files = 0;
    active a;
    if (rc == 0 && (rc = open_active(u, job_id, p.store, &a, &err)) == 0) {
        rc = store_put_dir(a.st, dir, prefix, &bytes, &files, &err);
        snprintf(remote, sizeof remote, "%s/%s", store_uri(a.st), prefix);
        close_active(u, &a);
    }
    if (rc == 0) rc = ty_write_file_atomic(marker, remote, strlen(remote), &err);
    bool stopping = false;
    pthread_mutex_lock(&u->mu);
    stopping = u->stop;
    pthread_mutex_unlock(&u->mu);
    if (rc == 0) {
        snprintf(line, sizeof line, "export uploaded to %s (%d files, %llu bytes)", remote, files,
                 (unsigned long long)bytes);
        job_log(s, job_id, "info", line);
        ty_logf("job %lld: %s", (long long)job_id, line);
        /* An earlier failed try of this export (before a restart) no
         * longer holds. */
        db *d = srv_db(s);
        db_job j;
        if (d && db_job_get(d, job_id, &j, &err) == 0) {
            if (j.checkpoint_error && !strncmp(j.checkpoint_error, "export not uploaded", 19)) {
                db_job_update cl = {.has_checkpoint_error = true, .checkpoint_error = NULL};
                db_job_update_fields(d, job_id, &cl, &err);
            }
            db_job_free(&j);
        }
    } else if (rc == TY_ESTATE && stopping) {
        /* Shutdown: the job still waits (stop_intent), and the restart's
         * recovery uploads the export again. Not a failure of the job. */
        ty_logf("job %lld: export upload interrupted by shutdown; retried after the restart",
                (long long)job_id);
    } else if (p.store) {
        char reason[700];
        snprintf(reason, sizeof reason, "%s%s", rc == TY_ESTATE ? "upload cancelled: " : "",
                 err.msg);
        set_checkpoint_error(s, job_id, "export", p.store, reason);
        snprintf(line, sizeof line, "export not uploaded to %s: %s", p.store, reason);
        job_log(s, job_id, "warn", line);
        ty_logf("job %lld: %s", (long long)job_id, line);
    }
    free(p.store);
    pthread_mutex_lock(&u->mu);
    for (export_job **pp = &u->exports; *pp; pp = &(*pp)->next)
        if ((*pp)->job_id == job_id) {
            export_job *e = *pp;
            *pp = e->next;
            free(e);
            break;
        }
    pthread_mutex_unlock(&u->mu);
}

bool upload_job_verdict(srv *s, int64_t job_id, char *why, size_t cap)
{
    ckpt_policy p;
    ty_err err = {0};
    why[0] = 0;
    if (job_policy(s, job_id, &p, &err) || !p.store) return true;
    db *d = srv_db(s);
    db_checkpoint *c = NULL;
    db_job j;
    int n = 0;
    bool have_job = d && db_job_get(d, job_id, &j, &err) == 0;
    size_t k = 0;
#define SAY(...) (k += (size_t)snprintf(why + k, k < cap ? cap - k : 0, __VA_ARGS__))
    if (d && db_checkpoint_list(d, job_id, &c, &n, &err) == 0) {
        int newest = -1;
        for (int i = n - 1; i >= 0 && newest < 0; i--)
            if (strcmp(c[i].state, "deleted")) newest = i;
        if (newest >= 0 && strcmp(c[newest].state, "committed")) {
            bool queued = uploader_job_busy(s->up, job_id, true);
            SAY("training finished, but the final checkpoint %s is not in %s: %s%s",
                dir_name(c[newest].dir), p.store,
                c[newest].error ? c[newest].error : "its upload did not run",
                queued ? "; the upload stays queued and is retried" : "");
        }
    }
    char dir[PATH_MAX], marker[PATH_MAX];
    struct stat sb;
    export_paths(s, job_id, dir, marker, sizeof dir);
    if (is_dir(dir) && stat(marker, &sb) != 0) {
        const char *ce = have_job ? j.checkpoint_error : NULL;
        SAY("%straining finished, but the export was not uploaded to %s%s%s", k ? "; " : "",
            p.store, ce && !strncmp(ce, "export ", 7) ? ": " : " (its upload did not finish)",
            ce && !strncmp(ce, "export ", 7) ? strstr(ce, ": ") + 2 : "");
    }
#undef SAY
    db_checkpoints_free(c, n);
    if (have_job) db_job_free(&j);
    free(p.store);
    return why[0] == 0;
}

int upload_probe_store(srv *s, const char *uri, ty_err *err)
{
    store_config cfg;
    srv_store_config(&s->cfg, &cfg);
    /* Bounded: the submit that runs this holds an HTTP thread. Two tries
     * of each request, each at most UPLOAD_PROBE_TIMEOUT_S. */
    cfg.max_attempts = 2;
    cfg.retry_base_ms = 200;
    cfg.retry_max_ms = 500;
    cfg.connect_timeout_s = UPLOAD_PROBE_TIMEOUT_S;
    cfg.stall_timeout_s = UPLOAD_PROBE_TIMEOUT_S;
    cfg.request_timeout_s = UPLOAD_PROBE_TIMEOUT_S;
    store *st = NULL;
    int rc = store_open(uri, &cfg, &st, err);
    if (rc == 0) {
        rc = store_probe(st, NULL, 0, err);
        store_close(st);
    }
    if (rc) {
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err->msg);
        ty_err_field(err, rc, "checkpoint.store", "checkpoint.store %s cannot be used: %s", uri, m);
    }
    return rc;
}
