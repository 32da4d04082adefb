/* sched.c — scheduler and supervisor in one thread.
 *
 * One thread owns every running job: it starts queued jobs when their
 * GPUs or CPU slot are free, reads rank 0's events (through epoll where the
 * executor gives a descriptor), learns from the executor when the ranks
 * have ended, enforces the SIGTERM→SIGKILL grace period, and turns each end
 * into the DESIGN §2 transition. Where and how engines run is the
 * executor's (executor.h: local processes, or Slurm). API threads call in under x->mu
 * to cancel or pause. A second thread samples the GPUs. Downloads before a
 * start (a resume checkpoint, remote inputs) run on a fetch thread per job
 * while the job holds its slot in `starting`, so one slow download never
 * stalls the other jobs' starts or pipes.
 *
 * Nothing is lost across a restart or a crash (docs/server.md, "Shutdown
 * and recovery"): engines die with the server (TY_SUPERVISOR_PID); a
 * shutdown waits up to the grace period for their final checkpoints and
 * requeues their jobs; a start settles every job a killed server left live
 * before the API answers and waits once for all orphaned engines
 * (recovery.c); every run's end and every start reconcile the job's
 * checkpoints with its directory; a final transition that cannot be
 * written is retried until it lands (settle.c).
 *
 * This file is the loop and the API; the parts it drives are listed in
 * sched_int.h. */
#include "sched_int.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "disk.h"
#include "ops.h"
#include "overlay.h"
#include "state.h"
#include "upload.h"
#include "tyutil.h"
#include "tyjson.h"

#define TICK_MS 100

/* resources.cpu_ranks of a job's spec: the CPU slots the job takes (1 for
 * a spec that does not parse, which its start then refuses). */
static int spec_cpu_ranks(const db_job *j)
{
    jobspec spec;
    ty_err err = {0};
    if (srv_job_spec(j, &spec, &err)) return 1;
    int n = spec.cpu_ranks;
    jobspec_free(&spec);
    return n > 1 ? n : 1;
}

/* Priority then FIFO; a job that does not fit now is skipped, so smaller
 * jobs behind it may run (no reservation; see docs/server.md). */
static void schedule(sched *x)
{
    srv *s = x->s;
    int64_t *ids;
    int n;
    ty_err err = {0};
    db *d = srv_db(s);
    if (!srv_disk_can_start(s)) return; /* the start would fail the job */
    if (!d || db_job_queued_ids(d, &ids, &n, &err)) return;
    int ngpu = gpu_inv_count(x->gpu);
    for (int i = 0; i < n && !x->stop; i++) {
        bool recovering = false;
        for (int k = 0; k < x->nrecov; k++)
            recovering |= x->recov[k].job_id == ids[i];
        /* Recovering: its old engine may still be writing. Settling: the
         * cancel or pause asked since its engine ended is still to be
         * written. */
        job_state settling;
        if (recovering || overlay_state(s, ids[i], &settling)) continue;
        if (x->ex->ops->cluster) { /* the cluster queues and places it */
            sched_start_job(x, ids[i], 0, 0);
            continue;
        }
        db_job j;
        if (db_job_get(d, ids[i], &j, &err)) continue;
        int want = j.gpus_wanted, ranks = spec_cpu_ranks(&j);
        db_job_free(&j);
        if (want == 0 && ranks > s->cfg.cpu_slots) { /* a server restarted with fewer slots */
            ty_err e2 = {0};
            char why[160];
            snprintf(why, sizeof why, "job asks for %d CPU ranks; this server has %d CPU slots",
                     ranks, s->cfg.cpu_slots);
            db_job_update up = {.has_error = true, .error = why, .set_finished = true};
            srv_transition(s, ids[i], JOB_BIT(JOB_QUEUED), JOB_CANCELLED, why, &up, NULL, &e2);
            continue;
        }
        if (want == 0) {
            if (x->cpu_busy + ranks <= s->cfg.cpu_slots) sched_start_job(x, ids[i], 0, ranks);
            continue;
        }
        if (want > ngpu) {
            ty_err e2 = {0};
            char why[160];
            snprintf(why, sizeof why, "job asks for %d GPUs; this server has %d", want, ngpu);
            db_job_update up = {.has_error = true, .error = why, .set_finished = true};
            srv_transition(s, ids[i], JOB_BIT(JOB_QUEUED), JOB_CANCELLED, why, &up, NULL, &e2);
            continue;
        }
        uint64_t mask = 0;
        int got = 0;
        for (int g = 0; g < ngpu && got < want; g++)
            if (!(x->gpus_busy & (1ull << g))) {
                mask |= 1ull << g;
                got++;
            }
        if (got == want) sched_start_job(x, ids[i], mask, 0);
    }
    free(ids);
}

/* ---- exits -------------------------------------------------------------------------------- */

static void reap(sched *x)
{
    for (run **pp = &x->runs; *pp;) {
        run *r = *pp;
        if (r->f) { /* no engine yet: sched_collect_fetches() owns it */
            pp = &r->next;
            continue;
        }
        if (!r->ended) r->ended = x->ex->ops->ended(x->ex, r->ej, &r->end);
        if (!r->ended) {
            pp = &r->next;
            continue;
        }
        /* Drain what the engine wrote before exiting; then close the pipe
         * even if a stray grandchild still holds its write end. */
        for (int i = 0; i < 64 && r->ev_open; i++)
            run_read_pipe(x, r);
        run_events_close(x, r);
        *pp = r->next;
        run_release(x, r);
        ops_run_ended(r->job_id);
        sched_finish_run(x, r);
        run_free(x->ex, r);
        sched_wake(x);
    }
}

static void enforce_grace(sched *x)
{
    int64_t now = ty_mono_ms();
    for (run *r = x->runs; r; r = r->next)
        if (r->kill_at_ms && now >= r->kill_at_ms && r->ej && !r->ended) {
            x->ex->ops->signal(x->ex, r->ej, SIGKILL);
            r->kill_at_ms = 0;
        }
}

/* Budgets and stalls (watch.c decides, this thread acts on the engines it
 * owns): a budget stops the job as a pause would, ending succeeded; a
 * stall with on_stall restart or fail stops it to be requeued or failed. */
static void watch_runs(sched *x)
{
    for (run *r = x->runs; r; r = r->next) {
        if (!r->started || r->intent[0] || r->f || !r->ej || r->ended || x->stop) continue;
        char why[512];
        ops_action a = ops_check_run(x->s, r->job_id, why, sizeof why);
        if (a == OPS_GO_ON) continue;
        const char *intent = a == OPS_STOP_BUDGET ? "budget"
                             : a == OPS_RESTART   ? "restart"
                                                  : "fail";
        ty_err err = {0};
        /* stopping with the intent, so a restart of the server finishes it
         * (sched_recover_mark) and a cancel meanwhile is an ordinary one */
        db_job_update up = {.has_stop_intent = true, .stop_intent = intent};
        if (srv_transition(x->s, r->job_id, JOB_BIT(JOB_RUNNING), JOB_STOPPING, why, &up, NULL,
                           &err))
            continue;
        if (a == OPS_FAIL) {
            db_job_update sr = {.has_stop_reason = true, .stop_reason = "stall"};
            db *d = srv_db(x->s);
            if (d) db_job_update_fields(d, r->job_id, &sr, &err);
            sched_set_str(&r->fail_reason, "%s", why);
        }
        snprintf(r->intent, sizeof r->intent, "%s", intent);
        sched_set_str(&r->stop_why, "%s", why);
        stop_run(x, r, SIGTERM);
    }
}

/* After sched_stop: true once the loop may end, i.e. every engine has
 * written its final checkpoint and exited, or the grace period (plus a
 * second for the last events) is over. A cluster's engines go on without
 * us: each run is left where it is (its events read so far recorded) for
 * the next start to re-attach; only its downloads are waited for. */
static bool stop_drained(sched *x, int64_t *drain_until)
{
    if (!*drain_until) *drain_until = ty_mono_ms() + x->s->cfg.grace_s * 1000LL + 1000;
    bool only_cluster = x->ex->ops->cluster;
    for (run *r = x->runs; r && only_cluster; r = r->next)
        only_cluster = !r->f;
    if (only_cluster) {
        for (run *r = x->runs; r; r = r->next)
            if (r->ej && x->ex->ops->detach) x->ex->ops->detach(x->ex, r->ej);
        return true;
    }
    return !x->runs || ty_mono_ms() >= *drain_until;
}

/* One wait for events (x->mu released meanwhile) and the pipes they name;
 * returns whether the wake-up descriptor fired. *n gets the count. */
static bool poll_pipes(sched *x, int *nout)
{
    struct epoll_event evs[64];
    pthread_mutex_unlock(&x->mu);
    int n = epoll_wait(x->efd, evs, 64, TICK_MS);
    pthread_mutex_lock(&x->mu);
    bool woken = false;
    for (int i = 0; i < n; i++) {
        if (evs[i].data.ptr == NULL) {
            uint64_t v;
            if (read(x->wake_fd, &v, sizeof v) < 0) { /* spurious */
            }
            woken = true;
            continue;
        }
        /* The run may have been freed by reap() in this batch: look it up. */
        for (run *r = x->runs; r; r = r->next)
            if (r == evs[i].data.ptr) {
                run_read_pipe(x, r);
                break;
            }
    }
    /* Executors without a descriptor (a followed file) are asked every tick. */
    for (run *r = x->runs; r; r = r->next)
        if (r->ev_open && r->fd < 0) run_read_pipe(x, r);
    *nout = n;
    return woken;
}

static void *sched_main(void *arg)
{
    sched *x = arg;
    /* The second half of recovery may wait out one grace period; the HTTP
     * side already serves, and every job it concerns is already queued,
     * paused or finished (sched_recover_mark), so cancel and pause just work. */
    sched_recover_finish(x);
    pthread_mutex_lock(&x->mu);
    schedule(x);
    int64_t drain_until = 0;
    for (;;) {
        if (x->stop && stop_drained(x, &drain_until)) break;
        int n;
        bool woken = poll_pipes(x, &n);
        reap(x);
        sched_collect_fetches(x);
        enforce_grace(x);
        sched_check_waiters(x);
        sched_check_pending(x);
        watch_runs(x);
        srv_disk_tick(x->s); /* nothing starts while the disk is full */
        if ((woken || n == 0) && !x->stop) schedule(x);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

/* ---- GPU sampling ---------------------------------------------------------------------------- */

int sched_gpu_snapshot(sched *x, srv_gpu_sample *out)
{
    int n = gpu_inv_count(x->gpu);
    pthread_mutex_lock(&x->sample_mu);
    for (int i = 0; i < n; i++) {
        out[i] = x->samples[i];
        out[i].index = gpu_inv_index(x->gpu, i);
        if (!out[i].name[0]) snprintf(out[i].name, sizeof out[i].name, "GPU %d", out[i].index);
        out[i].job_id = x->sample_job[i];
    }
    pthread_mutex_unlock(&x->sample_mu);
    return n;
}

int sched_gpu_count(sched *x)
{
    return gpu_inv_count(x->gpu);
}

int sched_job_gpu_limit(sched *x)
{
    return x->ex->ops->cluster ? GPU_MAX : gpu_inv_count(x->gpu);
}

const exec_ops *sched_exec_ops(sched *x)
{
    return x->ex->ops;
}

void sched_capacity(sched *x, int *gpus_free, int *cpu_free)
{
    pthread_mutex_lock(&x->mu);
    int n = 0;
    for (int i = 0; i < gpu_inv_count(x->gpu); i++)
        n += !(x->gpus_busy & (1ull << i));
    *gpus_free = n;
    *cpu_free = x->s->cfg.cpu_slots - x->cpu_busy;
    pthread_mutex_unlock(&x->mu);
}

/* ---- API actions ------------------------------------------------------------------------------- */

static run *find_run(sched *x, int64_t id)
{
    for (run *r = x->runs; r; r = r->next)
        if (r->job_id == id) return r;
    return NULL;
}

/* cancel/pause of a job whose engine is gone while its final state is
 * being written again: a requeue becomes the request (and a pause a
 * cancel); an end already reached is a conflict, as it will be once
 * written. The API shows the new target at once (overlay.h). */
static int stop_pending(sched *x, pending *p, const char *intent, ty_err *err)
{
    bool cancel = !strcmp(intent, "cancel");
    job_state now = p->has_then ? p->then : p->to;
    if (now == JOB_QUEUED || (now == JOB_PAUSED && cancel)) {
        /* Written after the settle: neither running → cancelled nor
         * running → paused is a transition of its own. */
        p->has_then = true;
        p->then = cancel ? JOB_CANCELLED : JOB_PAUSED;
        overlay_set(x->s, p->job_id, p->then, p->reason);
        return 0;
    }
    return ty_err_set(err, TY_ESTATE, "job %lld is %s (its engine has ended); it cannot be %s",
                      (long long)p->job_id, db_state_name(now), cancel ? "cancelled" : "paused");
}

/* cancel/pause of a job with engines: → stopping, SIGTERM, grace timer. */
static int stop_job(sched *x, int64_t id, const char *intent, ty_err *err)
{
    run *r = find_run(x, id);
    if (!r) {
        /* Its engine is gone and its final state is being written again
         * (sched_check_pending): accepted; a requeue becomes the request. */
        for (pending *p = x->pend; p; p = p->next)
            if (p->job_id == id) return stop_pending(x, p, intent, err);
        /* Its engine has ended and the job waits for its uploads: a cancel
         * of a pause is honoured; the outcome of a finished engine stays. */
        for (waiter *w = x->waiters; w; w = w->next)
            if (w->job_id == id) {
                if (w->to == JOB_PAUSED && !strcmp(intent, "cancel")) w->to = JOB_CANCELLED;
                return 0;
            }
        return ty_err_set(err, TY_ESTATE, "job %lld has no running engine", (long long)id);
    }
    if (r->intent[0]) {
        /* Already stopping: a cancel may upgrade a pause, nothing else. */
        if (!strcmp(intent, "cancel") && strcmp(r->intent, "cancel")) {
            snprintf(r->intent, sizeof r->intent, "cancel");
            db_job_update up = {.has_stop_intent = true, .stop_intent = "cancel"};
            db *d = srv_db(x->s);
            if (d) db_job_update_fields(d, id, &up, err);
            return 0;
        }
        return ty_err_set(err, TY_ESTATE, "job %lld is already stopping", (long long)id);
    }
    db_job_update up = {.has_stop_intent = true, .stop_intent = intent};
    char reason[64];
    snprintf(reason, sizeof reason, "%s requested", intent);
    if (srv_transition(x->s, id, JOB_BIT(JOB_STARTING) | JOB_BIT(JOB_RUNNING), JOB_STOPPING, reason,
                       &up, NULL, err))
        return err->code;
    snprintf(r->intent, sizeof r->intent, "%s", intent);
    /* No engine yet: abort the downloads; sched_collect_fetches() then finishes
     * the stop as soon as the fetch thread returns. */
    if (r->f)
        fetch_handle_cancel(r->f->h);
    else
        stop_run(x, r, SIGTERM);
    return 0;
}

int sched_cancel(sched *x, int64_t id, ty_err *err)
{
    pthread_mutex_lock(&x->mu);
    db_job_update up = {.set_finished = true};
    job_state from;
    int rc = srv_transition(x->s, id, JOB_BIT(JOB_QUEUED) | JOB_BIT(JOB_PAUSED), JOB_CANCELLED,
                            "cancel requested", &up, &from, err);
    if (rc == TY_ESTATE && (from == JOB_STARTING || from == JOB_RUNNING || from == JOB_STOPPING)) {
        ty_err_clear(err);
        rc = stop_job(x, id, "cancel", err);
    }
    /* Cancelled before recovery reached it: its previous engine's final
     * checkpoint is of no use any more, so it need not finish writing it. */
    for (int k = 0; rc == 0 && k < x->nrecov; k++)
        if (x->recov[k].job_id == id && x->recov[k].pgid > 0 &&
            x->ex->ops->orphan_alive(x->ex, id, x->recov[k].pgid)) /* never a reused pid */
            x->ex->ops->orphan_signal(x->ex, x->recov[k].pgid, SIGKILL);
    pthread_mutex_unlock(&x->mu);
    return rc;
}

int sched_pause(sched *x, int64_t id, ty_err *err)
{
    pthread_mutex_lock(&x->mu);
    /* A queued job recovery has not reached yet: accepted now, paused by
     * sched_recover_finish at the newest complete checkpoint once the old engine
     * has written it. */
    for (int k = 0; k < x->nrecov; k++)
        if (x->recov[k].job_id == id) {
            db_job j;
            db *d = srv_db(x->s);
            if (d && db_job_get(d, id, &j, err) == 0) {
                bool queued = j.state == JOB_QUEUED;
                db_job_free(&j);
                if (queued) {
                    x->recov[k].pause = true;
                    pthread_mutex_unlock(&x->mu);
                    return 0;
                }
            }
            ty_err_clear(err);
        }
    job_state from;
    int rc = srv_transition(x->s, id, JOB_BIT(JOB_QUEUED), JOB_PAUSED,
                            "pause requested (was queued)", NULL, &from, err);
    if (rc == TY_ESTATE && (from == JOB_STARTING || from == JOB_RUNNING)) {
        ty_err_clear(err);
        rc = stop_job(x, id, "pause", err);
    } else if (rc == TY_ESTATE) {
        ty_err_set(err, TY_ESTATE,
                   "job %lld is %s; only queued, starting or running jobs can be "
                   "paused",
                   (long long)id, db_state_name(from));
    }
    pthread_mutex_unlock(&x->mu);
    return rc;
}

int sched_resume(sched *x, int64_t id, ty_err *err)
{
    job_state from;
    int rc = srv_transition(x->s, id, JOB_BIT(JOB_PAUSED), JOB_QUEUED, "resume requested", NULL,
                            &from, err);
    if (rc == TY_ESTATE)
        ty_err_set(err, TY_ESTATE, "job %lld is %s; only paused jobs can be resumed", (long long)id,
                   db_state_name(from));
    if (rc == 0) sched_wake(x);
    return rc;
}

/* ---- recovery, lifecycle --------------------------------------------------------------------- */

sched *sched_new(srv *s, ty_err *err)
{
    sched *x = calloc(1, sizeof *x);
    if (!x) {
        ty_err_set(err, TY_ENOMEM, "out of memory");
        return NULL;
    }
    x->s = s;
    x->efd = x->wake_fd = -1;
    if (exec_open(s, &x->ex, err)) {
        free(x);
        return NULL;
    }
    if (gpu_inv_open(s->cfg.gpus, &x->gpu, err)) {
        exec_close(x->ex);
        free(x);
        return NULL;
    }
    pthread_mutex_init(&x->mu, NULL);
    pthread_mutex_init(&x->sample_mu, NULL);
    pthread_cond_init(&x->sample_cond, NULL);
    x->efd = epoll_create1(EPOLL_CLOEXEC);
    x->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ee = {.events = EPOLLIN, .data.ptr = NULL};
    if (x->efd < 0 || x->wake_fd < 0 || epoll_ctl(x->efd, EPOLL_CTL_ADD, x->wake_fd, &ee)) {
        ty_err_set(err, TY_EIO, "epoll: %s", strerror(errno));
        sched_free(x);
        return NULL;
    }
    gpu_inv_sample(x->gpu, x->samples);
    sched_recover_mark(x); /* before the API answers for any job */
    if (pthread_create(&x->thread, NULL, sched_main, x)) {
        ty_err_set(err, TY_EINTERNAL, "cannot start the scheduler thread");
        sched_free(x);
        return NULL;
    }
    if (pthread_create(&x->sampler, NULL, sched_sampler_main, x)) {
        ty_err_set(err, TY_EINTERNAL, "cannot start the GPU sampler thread");
        pthread_mutex_lock(&x->mu);
        x->stop = true;
        pthread_mutex_unlock(&x->mu);
        sched_wake(x);
        pthread_join(x->thread, NULL);
        x->thread = 0;
        sched_free(x);
        return NULL;
    }
    return x;
}

void sched_stop(sched *x)
{
    pthread_mutex_lock(&x->mu);
    x->stop = true;
    /* Engines get SIGTERM (they checkpoint and stop); the scheduler thread
     * reads their final events and requeues their jobs (sched_finish_run), up to
     * the grace period. A job whose engine outlives that stays running in
     * the database and the next start recovers it. Downloads are aborted
     * (nothing partial stays) and the job is requeued. */
    for (run *r = x->runs; r; r = r->next) {
        if (r->ej && !x->ex->ops->cluster) stop_run(x, r, SIGTERM);
        if (r->f) fetch_handle_cancel(r->f->h);
    }
    pthread_mutex_unlock(&x->mu);
    sched_wake(x);
    pthread_mutex_lock(&x->sample_mu);
    pthread_cond_broadcast(&x->sample_cond);
    pthread_mutex_unlock(&x->sample_mu);
    if (x->thread) pthread_join(x->thread, NULL);
    if (x->sampler) pthread_join(x->sampler, NULL);
    for (run *r = x->runs; r; r = r->next)
        if (r->f) {
            pthread_join(r->f->thread, NULL);
            run_fetch_free(r->f);
            r->f = NULL;
        }
    x->thread = x->sampler = 0;
}

void sched_free(sched *x)
{
    if (!x) return;
    while (x->runs) {
        run *r = x->runs;
        x->runs = r->next;
        run_free(x->ex, r);
    }
    while (x->waiters) {
        waiter *w = x->waiters;
        x->waiters = w->next;
        free(w);
    }
    while (x->pend) {
        pending *p = x->pend;
        x->pend = p->next;
        free(p->store);
        free(p);
    }
    free(x->recov);
    if (x->efd >= 0) close(x->efd);
    if (x->wake_fd >= 0) close(x->wake_fd);
    gpu_inv_free(x->gpu);
    exec_close(x->ex);
    pthread_mutex_destroy(&x->mu);
    pthread_mutex_destroy(&x->sample_mu);
    pthread_cond_destroy(&x->sample_cond);
    free(x);
}
