/* launch.c — starting a job on the slots the scheduler picked: the job
 * goes starting with its resume point (the newest complete checkpoint on
 * disk), then the engine is spawned at once or, when something must be
 * downloaded first, from a fetch thread of its own (collected by
 * sched_collect_fetches). */
#include "sched_int.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops.h"
#include "recovery.h"
#include "state.h"
#include "tyutil.h"
#include "tyjson.h"

/* Writes path via a temporary file and rename, so an engine never reads a
 * half-written spec. */
static int write_spec(const char *path, const char *text, ty_err *err)
{
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "we");
    if (!f) return ty_err_set(err, TY_EIO, "cannot write %s: %s", tmp, strerror(errno));
    bool ok = fputs(text, f) >= 0;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return ty_err_set(err, TY_EIO, "cannot write %s: %s", path, strerror(errno));
    }
    return 0;
}

/* "2,3": the device indices of the GPU slots in mask. */
static int gpu_list(sched *x, uint64_t mask, char *out, size_t cap)
{
    int n = 0;
    out[0] = 0;
    for (int i = 0; i < gpu_inv_count(x->gpu); i++) {
        if (!(mask & (1ull << i))) continue;
        size_t len = strlen(out);
        snprintf(out + len, cap - len, "%s%d", n ? "," : "", gpu_inv_index(x->gpu, i));
        n++;
    }
    return n;
}

/* A held run that never got an engine: frees its slot and fails the job
 * (starting → failed) with the reason in err. */
static void start_failed(sched *x, run *r, const ty_err *err)
{
    int64_t id = r->job_id;
    char *store = r->store;
    r->store = NULL;
    run_unlist(x, r);
    run_release(x, r);
    run_free(x->ex, r);
    sched_settle(x, id, JOB_FAILED, -1, store, err->msg); /* retried if it cannot be written */
    free(store);
    sched_wake(x);
}

/* Writes the engine's spec and has the executor start its ranks for a
 * held run (x->mu held). On failure nothing of the engine is left running. */
static int launch(sched *x, run *r, const jobspec *spec, const char *resume, const char *spec_text,
                  ty_err *err)
{
    srv *s = x->s;
    char jobdir[PATH_MAX], specpath[PATH_MAX + 16], cuda[GPU_MAX * 4];
    srv_job_dir(s, r->job_id, jobdir, sizeof jobdir);
    snprintf(specpath, sizeof specpath, "%s/spec.json", jobdir);
    gpu_list(x, r->gpu_mask, cuda, sizeof cuda);
    /* No fsync: the database is the record and the file is rewritten at
     * every start, so a crash costs nothing but dispatch latency. */
    int rc = write_spec(specpath, spec_text, err);
    if (rc) return rc;
    exec_start st = {.job_id = r->job_id,
                     .nranks = r->nranks,
                     .cuda = cuda,
                     .jobdir = jobdir,
                     .resume = resume,
                     .spec = spec};
    exec_job *ej = NULL;
    int fd = -1;
    int64_t handle = 0;
    rc = x->ex->ops->start(x->ex, &st, &ej, &fd, &handle, err);
    if (rc) return rc;
    ty_err e2 = {0};
    db *d = srv_db(s);
    run_attach(x, r, ej, fd);
    db_job_update pg = {.has_pgid = true, .pgid = handle};
    if (d) db_job_update_fields(d, r->job_id, &pg, &e2);
    return 0;
}

/* The downloads of one start, on their own thread so the scheduler keeps
 * starting other jobs and reading their pipes. The thread touches only
 * this struct (and its own database handle); the scheduler reads the
 * results after joining it. */
static void *fetch_main(void *arg)
{
    fetch *f = arg;
    srv *s = f->x->s;
    f->rc = fetch_prepare_start(s, f->job_id, &f->spec, &f->resume, &f->spec_text, f->h, &f->err);
    srv_db_release(s);
    atomic_store(&f->done, true);
    sched_wake(f->x);
    return NULL;
}

/* Hands a held run's downloads to a fetch thread; the job stays starting
 * and sched_collect_fetches() launches it when they are done. Takes ownership
 * of *spec (left zeroed) and resume. */
static int fetch_start(sched *x, run *r, jobspec *spec, char *resume, ty_err *err)
{
    fetch *f = calloc(1, sizeof *f);
    if (f) f->h = fetch_handle_new();
    if (!f || !f->h) {
        free(f);
        jobspec_free(spec);
        free(resume);
        return ty_err_set(err, TY_ENOMEM, "out of memory");
    }
    f->x = x;
    f->job_id = r->job_id;
    f->spec = *spec;
    memset(spec, 0, sizeof *spec);
    f->resume = resume;
    if (pthread_create(&f->thread, NULL, fetch_main, f)) {
        run_fetch_free(f);
        return ty_err_set(err, TY_EINTERNAL, "cannot start a thread to fetch the job's inputs");
    }
    r->f = f;
    return 0;
}

/* The hourly price per GPU (or CPU slot) of a run on these slots: the mean
 * of its GPUs' model prices (ops_unit_price); < 0 when one is unknown. */
static double run_price(sched *x, uint64_t mask)
{
    if (!mask) return ops_unit_price(&x->s->cfg, NULL);
    double sum = 0;
    int n = 0;
    pthread_mutex_lock(&x->sample_mu);
    for (int i = 0; i < gpu_inv_count(x->gpu) && sum >= 0; i++)
        if (mask & (1ull << i)) {
            double p = ops_unit_price(&x->s->cfg, x->samples[i].name);
            sum = p < 0 ? -1 : sum + p;
            n++;
        }
    pthread_mutex_unlock(&x->sample_mu);
    return sum < 0 || !n ? -1 : sum / n;
}

/* The backend a run on ngpu listed GPUs gets: "cuda" | "cpu", the spec's
 * resources.backend winning over auto. On a cluster the job's GPUs are
 * Slurm's to pick: none are listed. */
static const char *run_backend(sched *x, const db_job *j, const jobspec *spec, int ngpu)
{
    if (spec->backend != BACKEND_AUTO) return spec->backend == BACKEND_CUDA ? "cuda" : "cpu";
    return ngpu > 0 || (x->ex->ops->cluster && j->gpus_wanted > 0) ? "cuda" : "cpu";
}

/* The disk is the truth: resume from the newest complete checkpoint there
 * is (local or committed remote), whatever the row said. With none at all
 * the recorded one stays, so its absence fails the start with a clear
 * reason rather than silently starting over. */
static void resume_point(srv *s, db_job *j, const char *store)
{
    char *newest = NULL;
    int64_t nstep = -1;
    ty_err rerr = {0};
    if (rec_reconcile(s, j->id, store, &newest, &nstep, &rerr))
        fprintf(stderr, "trainyard: job %lld: checkpoint reconciliation: %s\n", (long long)j->id,
                rerr.msg);
    if (newest) {
        free(j->resume_from);
        j->resume_from = newest;
    }
}

/* The starting transition's reason; from gets "; resumed from ..." ("" for
 * a fresh start). */
static void start_reason(const db_job *j, bool fetching, char *reason, size_t rcap, char *from,
                         size_t fcap)
{
    int64_t rstep = rec_dir_step(j->resume_from);
    if (j->resume_from && rstep >= 0)
        snprintf(from, fcap, "; resumed from step %lld (%.500s)", (long long)rstep, j->resume_from);
    else if (j->resume_from)
        snprintf(from, fcap, "; resumed from %.500s", j->resume_from);
    snprintf(reason, rcap, "scheduled%s%s", from, fetching ? "; fetching inputs" : "");
}

/* Said where the dashboard's notices and `trainyard logs` show it:
 * progress goes back to the checkpoint's step, and this is why. */
static void log_resume(srv *s, int64_t id, const char *from)
{
    json_t *l = json_pack("{ss ss}", "line", from, "level", "info");
    char *data = l ? ty_json_dumps(l, JSON_COMPACT) : NULL;
    json_decref(l);
    if (data) evw_push(s->evw, id, "log", data);
}

/* The held run's job directory, then its downloads on a fetch thread or,
 * with nothing to download, its engine now. Takes *spec and j's
 * resume_from when a fetch thread starts. */
static int start_engine(sched *x, run *r, db_job *j, jobspec *spec, bool fetching, ty_err *err)
{
    char jobdir[PATH_MAX];
    srv_job_dir(x->s, r->job_id, jobdir, sizeof jobdir);
    int rc = ty_mkdir_p(jobdir, err);
    if (rc == 0 && fetching) {
        rc = fetch_start(x, r, spec, j->resume_from, err);
        j->resume_from = NULL; /* the fetch owns it */
    } else if (rc == 0) {
        /* Nothing to download: the resume checkpoint is on disk and the
         * inputs are local, so this is quick enough to do here. */
        char *spec_text = NULL;
        rc = fetch_prepare_start(x->s, r->job_id, spec, &j->resume_from, &spec_text, NULL, err);
        if (rc == 0) rc = launch(x, r, spec, j->resume_from, spec_text, err);
        free(spec_text);
    }
    return rc;
}

/* A queued job whose stored spec does not parse never starts: it fails
 * with the reason in err. */
static void start_refused(srv *s, int64_t id, const ty_err *err)
{
    db_job_update up = {.has_error = true, .error = err->msg, .set_finished = true};
    ty_err e2 = {0};
    srv_transition(s, id, JOB_BIT(JOB_QUEUED), JOB_FAILED, err->msg, &up, NULL, &e2);
}

/* No memory for the run: the job, already starting, fails. */
static void start_no_memory(srv *s, int64_t id, ty_err *err)
{
    ty_err_set(err, TY_ENOMEM, "out of memory");
    db_job_update up2 = {.has_error = true, .error = err->msg, .set_finished = true};
    ty_err e2 = {0};
    srv_transition(s, id, JOB_BIT(JOB_STARTING), JOB_FAILED, err->msg, &up2, NULL, &e2);
}

/* Starts job id on the resources picked by the caller (x->mu held): the
 * job goes starting and holds them; the engine is spawned now, or when
 * its downloads (resume checkpoint, remote inputs) finish on a fetch
 * thread. */
void sched_start_job(sched *x, int64_t id, uint64_t gpu_mask, int cpu_slots)
{
    srv *s = x->s;
    ty_err err = {0};
    db_job j;
    db *d = srv_db(s);
    if (!d || db_job_get(d, id, &j, &err)) return;
    jobspec spec;
    if (srv_job_spec(&j, &spec, &err)) {
        start_refused(s, id, &err);
        db_job_free(&j);
        return;
    }
    char gpus[GPU_MAX * 4];
    int ngpu = gpu_list(x, gpu_mask, gpus, sizeof gpus);
    char *store = spec.store ? strdup(spec.store) : NULL;
    resume_point(s, &j, store);
    bool fetching = fetch_needed(s, id, &spec, j.resume_from);
    db_job_update up = {.has_backend = true,
                        .backend = run_backend(x, &j, &spec, ngpu),
                        .has_gpus = true,
                        .gpus = gpus,
                        .has_hour_price = true,
                        .hour_price = run_price(x, gpu_mask),
                        .set_started = true,
                        .has_stop_intent = true,
                        .stop_intent = NULL,
                        .has_error = true,
                        .error = NULL,
                        .has_resume_from = true,
                        .resume_from = j.resume_from};
    char reason[700], from[600] = "";
    start_reason(&j, fetching, reason, sizeof reason, from, sizeof from);
    if (srv_transition(s, id, JOB_BIT(JOB_QUEUED), JOB_STARTING, reason, &up, NULL, &err)) {
        free(store);
        jobspec_free(&spec);
        db_job_free(&j);
        return; /* cancelled or paused meanwhile */
    }
    if (from[0]) log_resume(s, id, from + 2);
    run *r = run_new(x, id);
    if (!r) {
        free(store);
        start_no_memory(s, id, &err);
        jobspec_free(&spec);
        db_job_free(&j);
        return;
    }
    r->gpu_mask = gpu_mask;
    r->cpu_slots = cpu_slots;
    r->nranks = ngpu > 0 ? ngpu : cpu_slots > 0 ? cpu_slots : 1;
    r->store = store;
    run_hold(x, r);
    if (start_engine(x, r, &j, &spec, fetching, &err)) start_failed(x, r, &err);
    jobspec_free(&spec);
    db_job_free(&j);
}

/* Runs whose fetch thread finished (x->mu held): join it, then launch the
 * engine, fail the start with the download's reason, or, when the job was
 * paused or cancelled meanwhile (it is stopping), finish that. */
void sched_collect_fetches(sched *x)
{
    run *next;
    for (run *r = x->runs; r; r = next) {
        next = r->next;
        fetch *f = r->f;
        if (!f || !atomic_load(&f->done)) continue;
        pthread_join(f->thread, NULL);
        r->f = NULL;
        if (r->intent[0] || x->stop) {
            bool pause = strcmp(r->intent, "cancel") != 0, shut = !r->intent[0];
            int64_t id = r->job_id;
            run_unlist(x, r);
            run_release(x, r);
            run_free(x->ex, r);
            if (shut) /* shutdown aborted the downloads */
                sched_finalize(x, id, JOB_QUEUED,
                               "server shut down while fetching inputs (no engine "
                               "had started)");
            else
                sched_finalize(x, id, pause ? JOB_PAUSED : JOB_CANCELLED,
                               pause ? "paused while fetching inputs (no engine had started)"
                                     : "cancelled while fetching inputs (no engine had started)");
            sched_wake(x);
        } else {
            ty_err err = f->err;
            int rc = f->rc;
            if (rc == 0) rc = launch(x, r, &f->spec, f->resume, f->spec_text, &err);
            if (rc) start_failed(x, r, &err);
        }
        run_fetch_free(f);
    }
}
