/* settle.c — the end of a run: its outcome by DESIGN §2 (sched_finish_run),
 * a wait for the job's checkpoint uploads where the outcome needs them,
 * and the final transition, which is retried until it lands (full disk,
 * I/O error) so a job never stays running with no engine behind it. */
#include "sched_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "overlay.h"
#include "recovery.h"
#include "state.h"
#include "upload.h"
#include "tyutil.h"

static char *newest_checkpoint(srv *s, int64_t id)
{
    char *dir = NULL;
    ty_err err = {0};
    db *d = srv_db(s);
    if (d) db_checkpoint_newest(d, id, &dir, &err);
    return dir;
}

/* The job's checkpoint.store from its spec (malloc'd), or NULL. */
char *sched_job_store(srv *s, int64_t id)
{
    db_job j;
    jobspec spec;
    ty_err err = {0};
    db *d = srv_db(s);
    if (!d || db_job_get(d, id, &j, &err)) return NULL;
    char *out = NULL;
    if (srv_job_spec(&j, &spec, &err) == 0) {
        out = spec.store ? strdup(spec.store) : NULL;
        jobspec_free(&spec);
    }
    db_job_free(&j);
    return out;
}

/* Tries one settle transition; 0 when it landed or can never land (the job
 * moved on or is gone), else the write error. From just before the write
 * the API shows the job as `then` (a cancel or pause asked meanwhile), or
 * -1: as `to`, with its resume point (overlay.h). */
static int settle_once(sched *x, int64_t job_id, job_state to, int then, int restarts,
                       const char *store, const char *reason, ty_err *err)
{
    srv *s = x->s;
    const unsigned live = JOB_BIT(JOB_STARTING) | JOB_BIT(JOB_RUNNING) | JOB_BIT(JOB_STOPPING);
    /* The engine is gone: make the rows match the disk (a partial
     * checkpoint of a failed write is removed here) and find where a
     * pause or requeue resumes from. */
    char *ck = NULL;
    int64_t step = -1;
    ty_err rerr = {0};
    if (rec_reconcile(s, job_id, store, &ck, &step, &rerr) && !ck)
        ck = newest_checkpoint(s, job_id);
    db_job_update up = {.has_pgid = true, .pgid = 0, .has_gpus = true, .gpus = ""};
    char why[2600];
    snprintf(why, sizeof why, "%s", reason);
    if (to == JOB_PAUSED || to == JOB_QUEUED) {
        up.has_resume_from = true;
        up.resume_from = ck;
        if (ck && step >= 0 && !strstr(reason, ck)) {
            size_t n = strlen(why);
            snprintf(why + n, sizeof why - n, "; resumes from step %lld", (long long)step);
        }
    }
    /* A job with a store succeeds only with its result in the store
     * (docs/storage.md, "When the store fails"). */
    char verdict[2400];
    if (to == JOB_SUCCEEDED && !upload_job_verdict(s, job_id, verdict, sizeof verdict)) {
        to = JOB_FAILED;
        reason = verdict;
        snprintf(why, sizeof why, "%s", reason);
    }
    if (to == JOB_FAILED) {
        up.has_error = true;
        up.error = reason;
    }
    if (restarts >= 0) {
        up.has_restarts = true;
        up.restarts = restarts;
    }
    if (db_state_terminal(to)) up.set_finished = true;
    overlay_set(s, job_id, then >= 0 ? (job_state)then : to, reason);
    overlay_set_detail(s, job_id, up.has_resume_from, ck, restarts);
    int rc = srv_transition(s, job_id, live, to, why, &up, NULL, err);
    free(ck);
    if (rc == TY_ESTATE || rc == TY_ENOENT) overlay_clear(s, job_id); /* moved on, or gone */
    return rc == TY_ESTATE || rc == TY_ENOENT ? 0 : rc;
}

/* The final transition of a run (or of a job that waited for its uploads);
 * a write that fails is logged and retried (sched_check_pending). */
void sched_settle(sched *x, int64_t job_id, job_state to, int restarts, const char *store,
                  const char *reason)
{
    ty_err err = {0};
    if (settle_once(x, job_id, to, -1, restarts, store, reason, &err) == 0) return;
    fprintf(stderr, "trainyard: job %lld: cannot record %s (%s): %s; retrying\n", (long long)job_id,
            db_state_name(to), reason, err.msg);
    sched_settle_later(x, job_id, to, restarts, store, reason);
}

void sched_settle_later(sched *x, int64_t job_id, job_state to, int restarts, const char *store,
                        const char *reason)
{
    overlay_set(x->s, job_id, to, reason);
    pending *p = calloc(1, sizeof *p);
    if (!p) return;
    p->job_id = job_id;
    p->to = to;
    p->restarts = restarts;
    p->store = store ? strdup(store) : NULL;
    snprintf(p->reason, sizeof p->reason, "%s", reason);
    p->next_ms = ty_mono_ms() + 500;
    p->next = x->pend;
    x->pend = p;
}

void sched_finalize(sched *x, int64_t job_id, job_state to, const char *reason)
{
    char *store = sched_job_store(x->s, job_id);
    sched_settle(x, job_id, to, -1, store, reason);
    free(store);
}

/* One try of a pending settle and of the cancel or pause asked for
 * meanwhile (from the queued or paused state the settle wrote); 0 when
 * both are done. The API goes on showing the request in between. */
static int pending_once(sched *x, pending *p, ty_err *err)
{
    if (!p->to_landed) {
        int rc = settle_once(x, p->job_id, p->to, p->has_then ? (int)p->then : -1, p->restarts,
                             p->store, p->reason, err);
        if (rc || !p->has_then) return rc;
        p->to_landed = true;
        overlay_set(x->s, p->job_id, p->then, p->reason);
    }
    bool cancel = p->then == JOB_CANCELLED;
    db_job_update up = {.set_finished = cancel};
    int rc = srv_transition(x->s, p->job_id, JOB_BIT(p->to), p->then,
                            cancel ? "cancel requested" : "pause requested", &up, NULL, err);
    if (rc == TY_ESTATE || rc == TY_ENOENT) overlay_clear(x->s, p->job_id);
    return rc == TY_ESTATE || rc == TY_ENOENT ? 0 : rc;
}

/* Retries the transitions that failed to write, every 0.5 s, logging every
 * 20th failure so a full disk stays visible in the server log. */
void sched_check_pending(sched *x)
{
    int64_t now = ty_mono_ms();
    for (pending **pp = &x->pend; *pp;) {
        pending *p = *pp;
        if (now < p->next_ms) {
            pp = &p->next;
            continue;
        }
        ty_err err = {0};
        if (pending_once(x, p, &err) == 0) {
            fprintf(stderr, "trainyard: job %lld: %s recorded after %d retries\n",
                    (long long)p->job_id, db_state_name(p->has_then ? p->then : p->to),
                    p->tries + 1);
            *pp = p->next;
            free(p->store);
            free(p);
            continue;
        }
        if (++p->tries % 20 == 0)
            fprintf(stderr, "trainyard: job %lld: still cannot record %s: %s\n",
                    (long long)p->job_id, db_state_name(p->to), err.msg);
        p->next_ms = now + 500;
        pp = &p->next;
    }
}

/* The end of a run watch.c stopped (budget, stall restart): a budget ends
 * succeeded with stop_reason budget; a restart requeues from the newest
 * checkpoint while restarts remain (true: done), else fails. */
static bool finish_watched(sched *x, run *r, job_state *to, char *reason, size_t cap)
{
    db *d = srv_db(x->s);
    ty_err err = {0};
    const char *why = r->stop_why ? r->stop_why : r->intent;
    db_job_update sr = {.has_stop_reason = true, .stop_reason = "budget"};
    if (!strcmp(r->intent, "budget")) {
        if (d) db_job_update_fields(d, r->job_id, &sr, &err);
        snprintf(reason, cap, "%s", why);
        *to = JOB_SUCCEEDED;
        return false;
    }
    db_job j;
    if (!d || db_job_get(d, r->job_id, &j, &err)) return true;
    bool again = j.restarts < j.max_restarts;
    int restarts = j.restarts + 1;
    if (again)
        snprintf(reason, cap, "%s; restart %d of %d", why, restarts, j.max_restarts);
    else
        snprintf(reason, cap, "%s; gave up after %d restarts", why, j.restarts);
    db_job_free(&j);
    if (again) {
        sched_settle(x, r->job_id, JOB_QUEUED, restarts, r->store, reason);
        return true;
    }
    sr.stop_reason = "stall";
    db_job_update_fields(d, r->job_id, &sr, &err);
    *to = JOB_FAILED;
    return false;
}

/* An engine that died without a terminal event: requeued from the newest
 * checkpoint while restarts remain (false: settled), else failed. */
static bool crash_outcome(sched *x, run *r, job_state *to, char *reason, size_t cap)
{
    ty_err err = {0};
    db_job j;
    db *d = srv_db(x->s);
    if (!d || db_job_get(d, r->job_id, &j, &err)) return false;
    const char *why = r->end.rank_failure[0] ? r->end.rank_failure : r->end.how;
    if (j.restarts < j.max_restarts) {
        snprintf(reason, cap, "engine %s without a terminal event; restart %d of %d", why,
                 j.restarts + 1, j.max_restarts);
        int restarts = j.restarts + 1;
        db_job_free(&j);
        sched_settle(x, r->job_id, JOB_QUEUED, restarts, r->store, reason);
        return false;
    }
    snprintf(reason, cap,
             "engine %s without a terminal event; gave up after %d "
             "restarts",
             why, j.restarts);
    db_job_free(&j);
    *to = JOB_FAILED;
    return true;
}

/* How the run ended, by DESIGN §2: true with *to and the reason, or false
 * when the job is already settled (requeued). */
static bool run_outcome(sched *x, run *r, job_state *to, char *reason, size_t cap)
{
    const char *how = r->end.how;
    int status0 = r->end.status;
    if (r->fail_reason || r->error) {
        snprintf(reason, cap, "%s", r->fail_reason ? r->fail_reason : r->error);
        *to = JOB_FAILED;
    } else if (r->done_succeeded) {
        snprintf(reason, cap, "engine finished");
        *to = JOB_SUCCEEDED;
    } else if (!strcmp(r->intent, "budget") || !strcmp(r->intent, "restart")) {
        return !finish_watched(x, r, to, reason, cap);
    } else if (r->intent[0]) {
        bool pause = strcmp(r->intent, "cancel") != 0;
        *to = pause ? JOB_PAUSED : JOB_CANCELLED;
        if (r->done_stopped)
            snprintf(reason, cap, "%s", pause ? "paused" : "cancelled");
        else
            snprintf(reason, cap, "%s: engine %s without stopping cleanly",
                     pause ? "paused" : "cancelled", how);
    } else if (r->end.lost && !x->stop) {
        /* The cluster took the job away (a node failed, or it was
         * preempted): not the job's fault, so requeued from its newest
         * committed checkpoint without counting a restart. */
        snprintf(reason, cap, "engine %s; requeued (not counted as a restart)", how);
        sched_settle(x, r->job_id, JOB_QUEUED, -1, r->store, reason);
        return false;
    } else if (x->stop) {
        /* Graceful shutdown: the engine wrote its final checkpoint; the job
         * waits in the queue for the next start. Not a restart of the job. */
        sched_settle(x, r->job_id, JOB_QUEUED, -1, r->store,
                     r->done_stopped ? "server shut down; the engine stopped at a checkpoint"
                                     : "server shut down");
        return false;
    } else if (r->done_stopped) {
        snprintf(reason, cap, "paused");
        *to = JOB_PAUSED;
    } else if (WIFEXITED(status0) && WEXITSTATUS(status0) == 2) {
        snprintf(reason, cap, "engine rejected the spec (exit status 2); see engine.log");
        *to = JOB_FAILED;
    } else {
        return crash_outcome(x, r, to, reason, cap);
    }
    return true;
}

/* A finished engine's job that waits for its uploads is `stopping` with the
 * intent "succeeded", never `running`: its engine is gone. The intent
 * survives a restart: a job that finished waits no more and is not rerun
 * (sched_recover_mark). A job stopping already (a budget's stop) only
 * gets the intent. */
static void record_success_wait(srv *s, int64_t job_id, db_job_update *pg)
{
    ty_err err = {0};
    db *d = srv_db(s);
    if (!d) return;
    pg->has_stop_intent = true;
    pg->stop_intent = "succeeded";
    if (srv_transition(s, job_id, JOB_BIT(JOB_STARTING) | JOB_BIT(JOB_RUNNING), JOB_STOPPING,
                       "engine finished; waiting for its checkpoint uploads", pg, NULL, &err) == 0)
        return;
    ty_err_clear(&err);
    db_job_update_fields(d, job_id, pg, &err);
}

/* Pause, cancel and success wait for the job's checkpoint uploads (the
 * final checkpoint in particular), bounded by --upload-wait: true when the
 * job now waits (or, shutting down, keeps its intent for the next start). */
static bool wait_for_uploads(sched *x, run *r, job_state to, const char *reason)
{
    srv *s = x->s;
    ty_err err = {0};
    if (to == JOB_SUCCEEDED && r->store) uploader_export(s->up, r->job_id);
    bool busy =
        to != JOB_FAILED && r->store && uploader_job_busy(s->up, r->job_id, to == JOB_SUCCEEDED);
    db_job_update pg = {.has_pgid = true, .pgid = 0, .has_gpus = true, .gpus = ""};
    if (busy && x->stop && to == JOB_SUCCEEDED) {
        /* Shutting down with the final uploads pending: the next start
         * waits for them. */
        record_success_wait(s, r->job_id, &pg);
        return true;
    }
    if (!busy || x->stop) return false;
    waiter *w = calloc(1, sizeof *w);
    if (!w) return false;
    w->job_id = r->job_id;
    w->to = to;
    snprintf(w->reason, sizeof w->reason, "%s", reason);
    w->deadline_ms = ty_mono_ms() + s->cfg.upload_wait_s * 1000LL;
    w->next = x->waiters;
    x->waiters = w;
    db *d = srv_db(s);
    if (to == JOB_SUCCEEDED)
        record_success_wait(s, r->job_id, &pg);
    else if (d)
        db_job_update_fields(d, r->job_id, &pg, &err);
    return true;
}

/* All ranks have exited: the DESIGN §2 transition for how they ended. */
void sched_finish_run(sched *x, run *r)
{
    char reason[1024];
    job_state to;
    if (!run_outcome(x, r, &to, reason, sizeof reason)) return; /* settled already */
    if (wait_for_uploads(x, r, to, reason)) return;
    if (to == JOB_FAILED)
        fprintf(stderr, "trainyard: job %lld failed: %s\n", (long long)r->job_id, reason);
    sched_settle(x, r->job_id, to, -1, r->store, reason);
}

/* Checks the jobs waiting for uploads: finalizes those whose uploads are
 * done; at the deadline, cancels the job's running uploads (they stay
 * queued and are tried again later), says so in the reason, and finalizes
 * without waiting for the rest. */
void sched_check_waiters(sched *x)
{
    srv *s = x->s;
    int64_t now = ty_mono_ms();
    for (waiter **pp = &x->waiters; *pp;) {
        waiter *w = *pp;
        if (x->stop && w->to == JOB_SUCCEEDED) {
            /* Shutdown: the job stays with its intent for the next start. */
            *pp = w->next;
            free(w);
            continue;
        }
        if (uploader_job_busy(s->up, w->job_id, w->to == JOB_SUCCEEDED)) {
            if (now < w->deadline_ms && !x->stop) {
                pp = &w->next;
                continue;
            }
            uploader_cancel_job(s->up, w->job_id);
            size_t n = strlen(w->reason);
            snprintf(w->reason + n, sizeof w->reason - n,
                     "; checkpoint upload still running after %d s was cancelled and stays queued",
                     s->cfg.upload_wait_s);
        }
        *pp = w->next;
        sched_finalize(x, w->job_id, w->to, w->reason);
        free(w);
    }
}
