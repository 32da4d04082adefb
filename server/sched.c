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
 * before the API answers (recover_mark) and waits once for all orphaned
 * engines (recover_finish); every run's end and every start reconcile the
 * job's checkpoints with its directory (recovery.c); a final transition
 * that cannot be written is retried until it lands (settle, check_pending). */
#include "scheduler.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
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

#include "executor.h"
#include "fetch.h"
#include "gpu.h"
#include "recovery.h"
#include "ops.h"
#include "sse.h"
#include "state.h"
#include "upload.h"
#include "tyutil.h"
#include "tyjson.h"

#define LINE_MAX_BYTES (64 * 1024) /* longest engine event line */
#define READ_BUDGET (256 * 1024)   /* bytes read per pipe per wake-up */
#define TICK_MS 100

/* A start's downloads on their own thread (fetch_main). */
typedef struct fetch {
    struct sched *x;
    int64_t job_id;
    char *spec_json; /* the stored spec */
    char *resume;    /* in/out of fetch_prepare_start */
    char *spec_text; /* out: the engine's spec */
    int rc;
    ty_err err;
    fetch_handle *h;  /* cancels the transfer (pause, cancel, shutdown) */
    atomic_bool done; /* set last by the thread; then it may be joined */
    pthread_t thread;
} fetch;

typedef struct run {
    int64_t job_id;
    int nranks;
    exec_job *ej; /* its engines (executor.h), NULL before the start */
    bool ev_open; /* events still to be read from ej */
    int fd;       /* the executor's event descriptor in epoll, or -1 */
    bool ended;   /* every rank is gone; end says how */
    exec_end end;
    char *line; /* partial line */
    size_t line_len;
    uint64_t gpu_mask; /* GPU slots held */
    int cpu_slots;     /* CPU slots held: one per CPU rank */
    bool started;      /* saw the engine's started event */
    bool done_succeeded, done_stopped;
    char *error;        /* engine's error event message */
    char *fail_reason;  /* protocol violation found by us */
    char *stop_why;     /* why watch.c stopped it (budget, stall) */
    char intent[8];     /* "pause" | "cancel" | "budget" | "restart" | "fail" | "" */
    int64_t kill_at_ms; /* monotonic SIGKILL deadline, 0 = none */
    char *store;        /* the spec's checkpoint.store, or NULL */
    fetch *f;           /* downloads before the engine runs, or NULL */
    double bucket;      /* flood limiter tokens */
    int64_t bucket_ms;
    struct run *next;
} run;

/* A job whose engines are gone but whose final state waits for its
 * checkpoint uploads (pause, cancel, success), up to --upload-wait. */
typedef struct waiter {
    int64_t job_id;
    job_state to;
    char reason[1100];
    int64_t deadline_ms;
    struct waiter *next;
} waiter;

/* A run's final transition that could not be written (full disk, I/O
 * error): retried every tick until it lands, and logged, so a job never
 * stays `running` with no engine behind it. */
typedef struct pending {
    int64_t job_id;
    job_state to;
    int restarts; /* new value, or -1 to leave it */
    char *store;
    char reason[1100];
    int64_t next_ms;
    int tries;
    struct pending *next;
} pending;

/* A job a previous server left live, between the two halves of recovery
 * (recover_mark before the API serves, recover_finish on the scheduler
 * thread). The scheduler does not start it meanwhile. */
typedef struct recov {
    int64_t job_id;
    int64_t pgid; /* its orphaned engine group (executor handle), 0 if none is left */
    bool pause;   /* pause requested meanwhile: paused at the newest checkpoint */
} recov;

struct sched {
    srv *s;
    executor *ex;
    gpu_inv *gpu;
    pthread_mutex_t mu;
    run *runs;
    waiter *waiters;
    pending *pend;
    recov *recov;
    int nrecov;
    uint64_t gpus_busy;
    int cpu_busy;
    int efd, wake_fd;
    bool stop;
    pthread_t thread, sampler;
    pthread_mutex_t sample_mu;
    pthread_cond_t sample_cond;
    srv_gpu_sample samples[GPU_MAX];
    int64_t sample_job[GPU_MAX];
};

/* ---- small helpers ------------------------------------------------------------------ */

static void fetch_free(fetch *f)
{
    free(f->spec_json);
    free(f->resume);
    free(f->spec_text);
    fetch_handle_free(f->h);
    free(f);
}

/* A run's fetch thread, if any, must have been joined. */
static void run_free(executor *ex, run *r)
{
    if (r->f) fetch_free(r->f);
    if (r->ej) ex->ops->release(ex, r->ej);
    free(r->line);
    free(r->error);
    free(r->fail_reason);
    free(r->stop_why);
    free(r->store);
    free(r);
}

static void set_str(char **dst, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_str(char **dst, const char *fmt, ...)
{
    if (*dst) return; /* the first reason wins */
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(dst, fmt, ap) < 0) *dst = NULL;
    va_end(ap);
}

void sched_wake(sched *x)
{
    /* The upload workers start before the scheduler exists (and recovery
     * runs inside sched_new): nothing to wake yet. */
    if (!x) return;
    uint64_t one = 1;
    if (write(x->wake_fd, &one, sizeof one) < 0) { /* counter full: already woken */
    }
}

/* Signals the job's engines (the executor: every rank); a SIGTERM also
 * starts the grace timer after which enforce_grace() sends SIGKILL, and is
 * followed by SIGCONT: a stopped (SIGSTOP) engine sees the SIGTERM only
 * once continued, and would otherwise sit out the whole grace period. */
static void stop_run(sched *x, run *r, int sig)
{
    if (r->ej && !r->ended) {
        x->ex->ops->signal(x->ex, r->ej, sig);
        if (sig == SIGTERM) x->ex->ops->signal(x->ex, r->ej, SIGCONT);
    }
    if (sig == SIGTERM && !r->kill_at_ms) r->kill_at_ms = ty_mono_ms() + x->s->cfg.grace_s * 1000LL;
}

/* Stops reading the run's events (drained, or no longer trusted). */
static void events_close(sched *x, run *r)
{
    if (r->fd >= 0) epoll_ctl(x->efd, EPOLL_CTL_DEL, r->fd, NULL);
    r->fd = -1;
    if (r->ev_open) x->ex->ops->close_events(x->ex, r->ej);
    r->ev_open = false;
}

/* A protocol violation: fail the job, stop reading, kill the engine now. */
static void run_violation(sched *x, run *r, const char *why)
{
    set_str(&r->fail_reason, "%s", why);
    events_close(x, r);
    stop_run(x, r, SIGKILL);
}

static char *newest_checkpoint(srv *s, int64_t id)
{
    char *dir = NULL;
    ty_err err = {0};
    db *d = srv_db(s);
    if (d) db_checkpoint_newest(d, id, &dir, &err);
    return dir;
}

/* ---- engine events -------------------------------------------------------------------- */

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

static void handle_line(sched *x, run *r, const char *line, size_t len)
{
    srv *s = x->s;
    if (len == 0) return;
    /* Flood limit: a token bucket of event_rate per second, 2 s deep. */
    if (s->cfg.event_rate > 0) {
        int64_t now = ty_mono_ms();
        r->bucket += (double)(now - r->bucket_ms) * s->cfg.event_rate / 1000.0;
        double cap = 2.0 * s->cfg.event_rate;
        if (r->bucket > cap) r->bucket = cap;
        r->bucket_ms = now;
        if (r->bucket < 1.0) {
            char why[160];
            snprintf(why, sizeof why,
                     "engine flooded its event pipe (more than %d events/s); killed",
                     s->cfg.event_rate);
            run_violation(x, r, why);
            return;
        }
        r->bucket -= 1.0;
    }
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
        set_str(&r->error, "%s", m ? m : "engine reported an error without a message");
    } else if (!strcmp(ev, "checkpoint")) {
        note_checkpoint(x, r, o);
    } else if (!strcmp(ev, "metric") || !strcmp(ev, "eval") || !strcmp(ev, "log") ||
               !strcmp(ev, "started")) {
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
    } else {
        char msg[200];
        snprintf(msg, sizeof msg, "unknown engine event '%.64s' ignored", ev);
        json_t *l = json_pack("{ss ss}", "line", msg, "level", "warn");
        evw_push(s->evw, r->job_id, "log", ty_json_dumps(l, JSON_COMPACT));
        json_decref(l);
    }
    json_decref(o);
}

static void read_pipe(sched *x, run *r)
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

/* ---- starting jobs ----------------------------------------------------------------------- */

static void release(sched *x, run *r)
{
    x->gpus_busy &= ~r->gpu_mask;
    x->cpu_busy -= r->cpu_slots;
    pthread_mutex_lock(&x->sample_mu);
    for (int i = 0; i < GPU_MAX; i++)
        if (r->gpu_mask & (1ull << i)) x->sample_job[i] = 0;
    pthread_mutex_unlock(&x->sample_mu);
}

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

/* Takes the run's GPUs or CPU slot and lists it (x->mu held). From here
 * until reap() or start_failed() the slot is the job's, downloads included. */
static void hold(sched *x, run *r)
{
    x->gpus_busy |= r->gpu_mask;
    x->cpu_busy += r->cpu_slots;
    pthread_mutex_lock(&x->sample_mu);
    for (int i = 0; i < GPU_MAX; i++)
        if (r->gpu_mask & (1ull << i)) x->sample_job[i] = r->job_id;
    pthread_mutex_unlock(&x->sample_mu);
    r->next = x->runs;
    x->runs = r;
}

static void unlist(sched *x, run *r)
{
    for (run **pp = &x->runs; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
}

/* A held run that never got an engine: frees its slot and fails the job
 * (starting → failed) with the reason in err. */
static void settle(sched *x, int64_t job_id, job_state to, int restarts, const char *store,
                   const char *reason);

static void start_failed(sched *x, run *r, const ty_err *err)
{
    int64_t id = r->job_id;
    char *store = r->store;
    r->store = NULL;
    unlist(x, r);
    release(x, r);
    run_free(x->ex, r);
    settle(x, id, JOB_FAILED, -1, store, err->msg); /* retried if it cannot be written */
    free(store);
    sched_wake(x);
}

/* A run has engines from here on: its events are read, through epoll
 * when the executor gives a descriptor. */
static void attach(sched *x, run *r, exec_job *ej, int fd)
{
    r->ej = ej;
    r->ev_open = true;
    r->fd = fd;
    if (fd >= 0) {
        struct epoll_event ee = {.events = EPOLLIN, .data.ptr = r};
        epoll_ctl(x->efd, EPOLL_CTL_ADD, fd, &ee);
    }
}

/* Writes the engine's spec and has the executor start its ranks for a
 * held run (x->mu held). On failure nothing of the engine is left running. */
static int launch(sched *x, run *r, const char *resume, const char *spec_text, ty_err *err)
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
    char *stored = NULL;
    db_job j;
    ty_err e2 = {0};
    db *d = srv_db(s);
    if (d && db_job_get(d, r->job_id, &j, &e2) == 0) {
        stored = j.spec;
        j.spec = NULL;
        db_job_free(&j);
    }
    exec_start st = {.job_id = r->job_id,
                     .nranks = r->nranks,
                     .cuda = cuda,
                     .jobdir = jobdir,
                     .resume = resume,
                     .spec_json = stored ? stored : "{}"};
    exec_job *ej = NULL;
    int fd = -1;
    int64_t handle = 0;
    rc = x->ex->ops->start(x->ex, &st, &ej, &fd, &handle, err);
    free(stored);
    if (rc) return rc;
    attach(x, r, ej, fd);
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
    f->rc =
        fetch_prepare_start(s, f->job_id, f->spec_json, &f->resume, &f->spec_text, f->h, &f->err);
    srv_db_release(s);
    atomic_store(&f->done, true);
    sched_wake(f->x);
    return NULL;
}

/* Hands a held run's downloads to a fetch thread; the job stays starting
 * and collect_fetches() launches it when they are done. Takes ownership
 * of spec_json and resume. */
static int fetch_start(sched *x, run *r, char *spec_json, char *resume, ty_err *err)
{
    fetch *f = calloc(1, sizeof *f);
    if (f) f->h = fetch_handle_new();
    if (!f || !f->h) {
        free(f);
        free(spec_json);
        free(resume);
        return ty_err_set(err, TY_ENOMEM, "out of memory");
    }
    f->x = x;
    f->job_id = r->job_id;
    f->spec_json = spec_json;
    f->resume = resume;
    if (pthread_create(&f->thread, NULL, fetch_main, f)) {
        fetch_free(f);
        return ty_err_set(err, TY_EINTERNAL, "cannot start a thread to fetch the job's inputs");
    }
    r->f = f;
    return 0;
}

static run *run_new(sched *x, int64_t id)
{
    run *r = calloc(1, sizeof *r);
    char *line = malloc(LINE_MAX_BYTES);
    if (!r || !line) {
        free(r);
        free(line);
        return NULL;
    }
    r->job_id = id;
    r->fd = -1;
    r->line = line;
    r->nranks = 1;
    r->bucket = 2.0 * x->s->cfg.event_rate;
    r->bucket_ms = ty_mono_ms();
    return r;
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

/* Starts job id on the resources picked by the caller (x->mu held): the
 * job goes starting and holds them; the engine is spawned now, or when
 * its downloads (resume checkpoint, remote inputs) finish on a fetch
 * thread. */
static void start_job(sched *x, int64_t id, uint64_t gpu_mask, int cpu_slots)
{
    srv *s = x->s;
    ty_err err = {0};
    db_job j;
    db *d = srv_db(s);
    if (!d || db_job_get(d, id, &j, &err)) return;
    char gpus[GPU_MAX * 4];
    int ngpu = gpu_list(x, gpu_mask, gpus, sizeof gpus);
    /* On a cluster the job's GPUs are Slurm's to pick: none are listed. */
    const char *backend = ngpu > 0 || (x->ex->ops->cluster && j.gpus_wanted > 0) ? "cuda" : "cpu";
    json_t *spec = json_loads(j.spec, 0, NULL);
    const char *want =
        json_string_value(json_object_get(json_object_get(spec, "resources"), "backend"));
    if (want && strcmp(want, "auto")) backend = !strcmp(want, "cuda") ? "cuda" : "cpu";
    char backend_s[8];
    snprintf(backend_s, sizeof backend_s, "%s", backend);
    const char *st =
        json_string_value(json_object_get(json_object_get(spec, "checkpoint"), "store"));
    char *store = st ? strdup(st) : NULL;
    json_decref(spec);
    /* The disk is the truth: resume from the newest complete checkpoint
     * there is (local or committed remote), whatever the row said. With
     * none at all the recorded one stays, so its absence fails the start
     * with a clear reason rather than silently starting over. */
    char *newest = NULL;
    int64_t nstep = -1;
    ty_err rerr = {0};
    if (rec_reconcile(s, id, store, &newest, &nstep, &rerr))
        fprintf(stderr, "trainyard: job %lld: checkpoint reconciliation: %s\n", (long long)id,
                rerr.msg);
    if (newest) {
        free(j.resume_from);
        j.resume_from = newest;
    }
    bool fetching = fetch_needed(s, id, j.spec, j.resume_from);

    db_job_update up = {.has_backend = true,
                        .backend = backend_s,
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
    int64_t rstep = rec_dir_step(j.resume_from);
    if (j.resume_from && rstep >= 0)
        snprintf(from, sizeof from, "; resumed from step %lld (%.500s)", (long long)rstep,
                 j.resume_from);
    else if (j.resume_from)
        snprintf(from, sizeof from, "; resumed from %.500s", j.resume_from);
    snprintf(reason, sizeof reason, "scheduled%s%s", from, fetching ? "; fetching inputs" : "");
    if (srv_transition(s, id, JOB_BIT(JOB_QUEUED), JOB_STARTING, reason, &up, NULL, &err)) {
        free(store);
        db_job_free(&j);
        return; /* cancelled or paused meanwhile */
    }
    if (from[0]) {
        /* Said where the dashboard's notices and `trainyard logs` show it:
         * progress goes back to the checkpoint's step, and this is why. */
        json_t *l = json_pack("{ss ss}", "line", from + 2, "level", "info");
        char *data = l ? ty_json_dumps(l, JSON_COMPACT) : NULL;
        json_decref(l);
        if (data) evw_push(s->evw, id, "log", data);
    }
    run *r = run_new(x, id);
    if (!r) {
        free(store);
        ty_err_set(&err, TY_ENOMEM, "out of memory");
        db_job_update up2 = {.has_error = true, .error = err.msg, .set_finished = true};
        ty_err e2 = {0};
        srv_transition(s, id, JOB_BIT(JOB_STARTING), JOB_FAILED, err.msg, &up2, NULL, &e2);
        db_job_free(&j);
        return;
    }
    r->gpu_mask = gpu_mask;
    r->cpu_slots = cpu_slots;
    r->nranks = ngpu > 0 ? ngpu : cpu_slots > 0 ? cpu_slots : 1;
    r->store = store;
    hold(x, r);
    char jobdir[PATH_MAX];
    srv_job_dir(s, id, jobdir, sizeof jobdir);
    int rc = ty_mkdir_p(jobdir, &err);
    if (rc == 0 && fetching) {
        rc = fetch_start(x, r, j.spec, j.resume_from, &err);
        j.spec = j.resume_from = NULL; /* the fetch owns them */
    } else if (rc == 0) {
        /* Nothing to download: the resume checkpoint is on disk and the
         * inputs are local, so this is quick enough to do here. */
        char *spec_text = NULL;
        rc = fetch_prepare_start(s, id, j.spec, &j.resume_from, &spec_text, NULL, &err);
        if (rc == 0) rc = launch(x, r, j.resume_from, spec_text, &err);
        free(spec_text);
    }
    if (rc) start_failed(x, r, &err);
    db_job_free(&j);
}

static void finalize(sched *x, int64_t job_id, job_state to, const char *reason);

/* Runs whose fetch thread finished (x->mu held): join it, then launch the
 * engine, fail the start with the download's reason, or, when the job was
 * paused or cancelled meanwhile (it is stopping), finish that. */
static void collect_fetches(sched *x)
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
            unlist(x, r);
            release(x, r);
            run_free(x->ex, r);
            if (shut) /* shutdown aborted the downloads */
                finalize(x, id, JOB_QUEUED,
                         "server shut down while fetching inputs (no engine "
                         "had started)");
            else
                finalize(x, id, pause ? JOB_PAUSED : JOB_CANCELLED,
                         pause ? "paused while fetching inputs (no engine had started)"
                               : "cancelled while fetching inputs (no engine had started)");
            sched_wake(x);
        } else {
            ty_err err = f->err;
            int rc = f->rc;
            if (rc == 0) rc = launch(x, r, f->resume, f->spec_text, &err);
            if (rc) start_failed(x, r, &err);
        }
        fetch_free(f);
    }
}

/* resources.cpu_ranks of a stored spec: the CPU slots the job takes. */
static int spec_cpu_ranks(const char *spec)
{
    json_t *j = spec ? json_loads(spec, 0, NULL) : NULL;
    json_int_t n =
        json_integer_value(json_object_get(json_object_get(j, "resources"), "cpu_ranks"));
    json_decref(j);
    return n > 1 ? (int)n : 1;
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
    if (!d || db_job_queued_ids(d, &ids, &n, &err)) return;
    int ngpu = gpu_inv_count(x->gpu);
    for (int i = 0; i < n && !x->stop; i++) {
        bool recovering = false;
        for (int k = 0; k < x->nrecov; k++)
            recovering |= x->recov[k].job_id == ids[i];
        if (recovering) continue;  /* its old engine may still be writing */
        if (x->ex->ops->cluster) { /* the cluster queues and places it */
            start_job(x, ids[i], 0, 0);
            continue;
        }
        db_job j;
        if (db_job_get(d, ids[i], &j, &err)) continue;
        int want = j.gpus_wanted, ranks = spec_cpu_ranks(j.spec);
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
            if (x->cpu_busy + ranks <= s->cfg.cpu_slots) start_job(x, ids[i], 0, ranks);
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
        if (got == want) start_job(x, ids[i], mask, 0);
    }
    free(ids);
}

/* ---- exits -------------------------------------------------------------------------------- */

/* The job's checkpoint.store from its stored spec (malloc'd), or NULL. */
static char *job_store(srv *s, int64_t id)
{
    db_job j;
    ty_err err = {0};
    db *d = srv_db(s);
    if (!d || db_job_get(d, id, &j, &err)) return NULL;
    json_t *spec = json_loads(j.spec, 0, NULL);
    const char *st =
        json_string_value(json_object_get(json_object_get(spec, "checkpoint"), "store"));
    char *out = st ? strdup(st) : NULL;
    json_decref(spec);
    db_job_free(&j);
    return out;
}

/* Tries one settle transition; 0 when it landed or can never land (the job
 * moved on or is gone), else the write error. */
static int settle_once(sched *x, int64_t job_id, job_state to, int restarts, const char *store,
                       const char *reason, ty_err *err)
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
    int rc = srv_transition(s, job_id, live, to, why, &up, NULL, err);
    free(ck);
    return rc == TY_ESTATE || rc == TY_ENOENT ? 0 : rc;
}

/* The final transition of a run (or of a job that waited for its uploads);
 * a write that fails is logged and retried (check_pending). */
static void settle(sched *x, int64_t job_id, job_state to, int restarts, const char *store,
                   const char *reason)
{
    ty_err err = {0};
    if (settle_once(x, job_id, to, restarts, store, reason, &err) == 0) return;
    fprintf(stderr, "trainyard: job %lld: cannot record %s (%s): %s; retrying\n", (long long)job_id,
            db_state_name(to), reason, err.msg);
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

static void finalize(sched *x, int64_t job_id, job_state to, const char *reason)
{
    char *store = job_store(x->s, job_id);
    settle(x, job_id, to, -1, store, reason);
    free(store);
}

/* Retries the transitions that failed to write, every 0.5 s, logging every
 * 20th failure so a full disk stays visible in the server log. */
static void check_pending(sched *x)
{
    int64_t now = ty_mono_ms();
    for (pending **pp = &x->pend; *pp;) {
        pending *p = *pp;
        if (now < p->next_ms) {
            pp = &p->next;
            continue;
        }
        ty_err err = {0};
        if (settle_once(x, p->job_id, p->to, p->restarts, p->store, p->reason, &err) == 0) {
            fprintf(stderr, "trainyard: job %lld: %s recorded after %d retries\n",
                    (long long)p->job_id, db_state_name(p->to), p->tries + 1);
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
        settle(x, r->job_id, JOB_QUEUED, restarts, r->store, reason);
        return true;
    }
    sr.stop_reason = "stall";
    db_job_update_fields(d, r->job_id, &sr, &err);
    *to = JOB_FAILED;
    return false;
}

/* All ranks have exited: the DESIGN §2 transition for how they ended. */
static void finish_run(sched *x, run *r)
{
    srv *s = x->s;
    ty_err err = {0};
    char reason[1024];
    const char *how = r->end.how;
    int status0 = r->end.status;
    job_state to;
    if (r->fail_reason || r->error) {
        snprintf(reason, sizeof reason, "%s", r->fail_reason ? r->fail_reason : r->error);
        to = JOB_FAILED;
    } else if (r->done_succeeded) {
        snprintf(reason, sizeof reason, "engine finished");
        to = JOB_SUCCEEDED;
    } else if (!strcmp(r->intent, "budget") || !strcmp(r->intent, "restart")) {
        if (finish_watched(x, r, &to, reason, sizeof reason)) return; /* requeued */
    } else if (r->intent[0]) {
        bool pause = strcmp(r->intent, "cancel") != 0;
        to = pause ? JOB_PAUSED : JOB_CANCELLED;
        if (r->done_stopped)
            snprintf(reason, sizeof reason, "%s", pause ? "paused" : "cancelled");
        else
            snprintf(reason, sizeof reason, "%s: engine %s without stopping cleanly",
                     pause ? "paused" : "cancelled", how);
    } else if (r->end.lost && !x->stop) {
        /* The cluster took the job away (a node failed, or it was
         * preempted): not the job's fault, so requeued from its newest
         * committed checkpoint without counting a restart. */
        snprintf(reason, sizeof reason, "engine %s; requeued (not counted as a restart)", how);
        settle(x, r->job_id, JOB_QUEUED, -1, r->store, reason);
        return;
    } else if (x->stop) {
        /* Graceful shutdown: the engine wrote its final checkpoint; the job
         * waits in the queue for the next start. Not a restart of the job. */
        settle(x, r->job_id, JOB_QUEUED, -1, r->store,
               r->done_stopped ? "server shut down; the engine stopped at a checkpoint"
                               : "server shut down");
        return;
    } else if (r->done_stopped) {
        snprintf(reason, sizeof reason, "paused");
        to = JOB_PAUSED;
    } else if (WIFEXITED(status0) && WEXITSTATUS(status0) == 2) {
        snprintf(reason, sizeof reason, "engine rejected the spec (exit status 2); see engine.log");
        to = JOB_FAILED;
    } else {
        /* Died without a terminal event: requeue from the newest checkpoint
         * while restarts remain. */
        db_job j;
        db *d = srv_db(s);
        if (!d || db_job_get(d, r->job_id, &j, &err)) return;
        const char *why = r->end.rank_failure[0] ? r->end.rank_failure : how;
        if (j.restarts < j.max_restarts) {
            snprintf(reason, sizeof reason, "engine %s without a terminal event; restart %d of %d",
                     why, j.restarts + 1, j.max_restarts);
            int restarts = j.restarts + 1;
            db_job_free(&j);
            settle(x, r->job_id, JOB_QUEUED, restarts, r->store, reason);
            return;
        }
        snprintf(reason, sizeof reason,
                 "engine %s without a terminal event; gave up after %d "
                 "restarts",
                 why, j.restarts);
        db_job_free(&j);
        to = JOB_FAILED;
    }
    /* Pause, cancel and success wait for the job's checkpoint uploads
     * (the final checkpoint in particular), bounded by --upload-wait. */
    if (to == JOB_SUCCEEDED && r->store) uploader_export(s->up, r->job_id);
    bool busy =
        to != JOB_FAILED && r->store && uploader_job_busy(s->up, r->job_id, to == JOB_SUCCEEDED);
    if (busy && x->stop && to == JOB_SUCCEEDED) {
        /* Shutting down with the final uploads pending: the job keeps its
         * intent and the next start waits for them (recover_mark). */
        db *d = srv_db(s);
        db_job_update pg = {.has_pgid = true,
                            .pgid = 0,
                            .has_gpus = true,
                            .gpus = "",
                            .has_stop_intent = true,
                            .stop_intent = "succeeded"};
        if (d) db_job_update_fields(d, r->job_id, &pg, &err);
        return;
    }
    if (busy && !x->stop) {
        waiter *w = calloc(1, sizeof *w);
        if (w) {
            w->job_id = r->job_id;
            w->to = to;
            snprintf(w->reason, sizeof w->reason, "%s", reason);
            w->deadline_ms = ty_mono_ms() + s->cfg.upload_wait_s * 1000LL;
            w->next = x->waiters;
            x->waiters = w;
            db *d = srv_db(s);
            /* The intent survives a restart: a job that finished waits no
             * more and is not rerun (see recover). */
            db_job_update pg = {.has_pgid = true,
                                .pgid = 0,
                                .has_gpus = true,
                                .gpus = "",
                                .has_stop_intent = to == JOB_SUCCEEDED,
                                .stop_intent = "succeeded"};
            if (d) db_job_update_fields(d, r->job_id, &pg, &err);
            return;
        }
    }
    if (to == JOB_FAILED)
        fprintf(stderr, "trainyard: job %lld failed: %s\n", (long long)r->job_id, reason);
    settle(x, r->job_id, to, -1, r->store, reason);
}

/* Checks the jobs waiting for uploads: finalizes those whose uploads are
 * done; at the deadline, cancels the job's running uploads (they stay
 * queued and are tried again later), says so in the reason, and finalizes
 * without waiting for the rest. */
static void check_waiters(sched *x)
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
        finalize(x, w->job_id, w->to, w->reason);
        free(w);
    }
}

static void reap(sched *x)
{
    for (run **pp = &x->runs; *pp;) {
        run *r = *pp;
        if (r->f) { /* no engine yet: collect_fetches() owns it */
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
            read_pipe(x, r);
        events_close(x, r);
        *pp = r->next;
        release(x, r);
        ops_run_ended(r->job_id);
        finish_run(x, r);
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

static void recover_finish(sched *x);

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
         * (recover_mark) and a cancel meanwhile is an ordinary one */
        db_job_update up = {.has_stop_intent = true, .stop_intent = intent};
        if (srv_transition(x->s, r->job_id, JOB_BIT(JOB_RUNNING), JOB_STOPPING, why, &up, NULL,
                           &err))
            continue;
        if (a == OPS_FAIL) {
            db_job_update sr = {.has_stop_reason = true, .stop_reason = "stall"};
            db *d = srv_db(x->s);
            if (d) db_job_update_fields(d, r->job_id, &sr, &err);
            set_str(&r->fail_reason, "%s", why);
        }
        snprintf(r->intent, sizeof r->intent, "%s", intent);
        set_str(&r->stop_why, "%s", why);
        stop_run(x, r, SIGTERM);
    }
}

static void *sched_main(void *arg)
{
    sched *x = arg;
    struct epoll_event evs[64];
    /* The second half of recovery may wait out one grace period; the HTTP
     * side already serves, and every job it concerns is already queued,
     * paused or finished (recover_mark), so cancel and pause just work. */
    recover_finish(x);
    pthread_mutex_lock(&x->mu);
    schedule(x);
    /* After sched_stop: keep reading pipes and reaping until every engine
     * has written its final checkpoint and exited, or the grace period
     * (plus a second for the last events) is over. */
    int64_t drain_until = 0;
    for (;;) {
        if (x->stop) {
            if (!drain_until) drain_until = ty_mono_ms() + x->s->cfg.grace_s * 1000LL + 1000;
            /* A cluster's engines go on without us: each run is left
             * where it is (its events read so far recorded) for the next
             * start to re-attach; only its downloads are waited for. */
            bool only_cluster = x->ex->ops->cluster;
            for (run *r = x->runs; r && only_cluster; r = r->next)
                only_cluster = !r->f;
            if (only_cluster) {
                for (run *r = x->runs; r; r = r->next)
                    if (r->ej && x->ex->ops->detach) x->ex->ops->detach(x->ex, r->ej);
                break;
            }
            if (!x->runs || ty_mono_ms() >= drain_until) break;
        }
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
                    read_pipe(x, r);
                    break;
                }
        }
        /* Executors without a descriptor (a followed file) are asked every tick. */
        for (run *r = x->runs; r; r = r->next)
            if (r->ev_open && r->fd < 0) read_pipe(x, r);
        reap(x);
        collect_fetches(x);
        enforce_grace(x);
        check_waiters(x);
        check_pending(x);
        watch_runs(x);
        if ((woken || n == 0) && !x->stop) schedule(x);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

/* ---- GPU sampling ---------------------------------------------------------------------------- */

static void *sampler_main(void *arg)
{
    sched *x = arg;
    srv *s = x->s;
    int n = gpu_inv_count(x->gpu);
    if (n == 0) return NULL;
    pthread_mutex_lock(&x->sample_mu);
    while (!x->stop) {
        srv_gpu_sample cur[GPU_MAX];
        pthread_mutex_unlock(&x->sample_mu);
        gpu_inv_sample(x->gpu, cur);
        pthread_mutex_lock(&x->sample_mu);
        for (int i = 0; i < n; i++) {
            cur[i].job_id = x->sample_job[i];
            x->samples[i] = cur[i];
        }
        pthread_mutex_unlock(&x->sample_mu);
        ops_gpu_sweep(s, cur, n);
        for (int i = 0; i < n; i++) {
            json_t *o = json_pack("{si si sI sI si}", "index", cur[i].index, "util", cur[i].util,
                                  "mem_used", (json_int_t)cur[i].mem_used, "mem_total",
                                  (json_int_t)cur[i].mem_total, "temp", cur[i].temp);
            char *data = ty_json_dumps(o, JSON_COMPACT);
            json_decref(o);
            if (!data) continue;
            if (cur[i].job_id > 0) {
                evw_push(s->evw, cur[i].job_id, "gpu", data);
            } else {
                sse_hub_publish_live(s->hub, "gpu", data);
                free(data);
            }
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + (int64_t)s->cfg.gpu_sample_ms * 1000000LL;
        ts.tv_sec += ns / 1000000000LL;
        ts.tv_nsec = ns % 1000000000LL;
        pthread_mutex_lock(&x->sample_mu);
        if (!x->stop) pthread_cond_timedwait(&x->sample_cond, &x->sample_mu, &ts);
    }
    pthread_mutex_unlock(&x->sample_mu);
    return NULL;
}

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

/* cancel/pause of a job with engines: → stopping, SIGTERM, grace timer. */
static int stop_job(sched *x, int64_t id, const char *intent, ty_err *err)
{
    run *r = find_run(x, id);
    if (!r) {
        /* Its engine is gone and its final state is being written again
         * (check_pending): accepted; a requeue becomes the request. */
        for (pending *p = x->pend; p; p = p->next)
            if (p->job_id == id) {
                if (p->to == JOB_QUEUED)
                    p->to = strcmp(intent, "cancel") ? JOB_PAUSED : JOB_CANCELLED;
                return 0;
            }
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
    /* No engine yet: abort the downloads; collect_fetches() then finishes
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
     * recover_finish at the newest complete checkpoint once the old engine
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

/* A cluster's job that is still running there is followed again as it
 * was, not stopped and submitted anew: same state, same stop intent. */
static bool reattach(sched *x, const db_job *j)
{
    if (!x->ex->ops->reattach) return false;
    if (j->state == JOB_RUNNING && j->stop_intent && !strcmp(j->stop_intent, "succeeded"))
        return false; /* finished; only its uploads were pending */
    int fd = -1;
    exec_job *ej = x->ex->ops->reattach(x->ex, j->id, &fd);
    if (!ej) return false;
    run *r = run_new(x, j->id);
    if (!r) {
        x->ex->ops->release(x->ex, ej);
        return false;
    }
    r->store = job_store(x->s, j->id);
    r->started = j->state != JOB_STARTING;
    hold(x, r);
    attach(x, r, ej, fd);
    if (j->state == JOB_STOPPING && j->stop_intent) {
        /* Asked again: the first signal may not have left before we died. */
        snprintf(r->intent, sizeof r->intent, "%s", j->stop_intent);
        stop_run(x, r, SIGTERM);
    }
    fprintf(stderr, "trainyard: job %lld: re-attached to its %s job after a restart\n",
            (long long)j->id, x->ex->ops->name);
    return true;
}

/* Recovery, first half, in sched_new before the API serves: every job a
 * previous server left starting, running or stopping is settled at once
 * in the database, and each orphaned engine group is sent SIGTERM (all of
 * them now; recover_finish waits once for all). No job is then shown as an
 * engine-backed `running` job without an engine, and cancel and pause take
 * the ordinary paths for queued or paused jobs (202, honoured):
 *   - a job that had finished and only waited for its final uploads: waits
 *     for them again (its export is queued again), then succeeds or fails
 *     on their verdict (finalize);
 *   - a job that was stopping: its recorded intent (paused / cancelled);
 *   - any other: queued again, not counted as a restart (the server, not
 *     the job, failed). The scheduler does not start it until its old
 *     engine is gone and its checkpoints are reconciled. */
static void recover_mark(sched *x)
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
        int64_t pg = j.pgid;
        if (!(pg > 0 && x->ex->ops->orphan_alive(x->ex, j.id, pg))) pg = 0;
        if (pg) x->ex->ops->orphan_signal(x->ex, pg, SIGTERM);
        fprintf(stderr, "trainyard: job %lld: recovering after a restart%s\n", (long long)j.id,
                pg ? "; its previous engine group got SIGTERM" : "");
        if (x->recov) x->recov[x->nrecov++] = (recov){.job_id = j.id, .pgid = pg};
        db_job_update up = {.has_pgid = true, .pgid = 0, .has_gpus = true, .gpus = ""};
        char reason[256];
        job_state to;
        if (j.state == JOB_RUNNING && j.stop_intent && !strcmp(j.stop_intent, "succeeded")) {
            /* The engine had finished; its final uploads were pending. The
             * queue kept the checkpoint's, the export is queued again, and
             * the job waits for them as before (finalize's verdict). */
            db_job_update_fields(d, j.id, &up, &err);
            uploader_export(s->up, j.id);
            waiter *w = calloc(1, sizeof *w);
            const char *why =
                "engine finished; server restarted while its final uploads were pending";
            if (!w) {
                finalize(x, j.id, JOB_SUCCEEDED, why);
            } else {
                *w = (waiter){.job_id = j.id,
                              .to = JOB_SUCCEEDED,
                              .next = x->waiters,
                              .deadline_ms = ty_mono_ms() + s->cfg.upload_wait_s * 1000LL};
                snprintf(w->reason, sizeof w->reason, "%s", why);
                x->waiters = w;
            }
            db_job_free(&j);
            continue;
        } else if (j.state == JOB_STOPPING && j.stop_intent &&
                   (!strcmp(j.stop_intent, "budget") || !strcmp(j.stop_intent, "restart") ||
                    !strcmp(j.stop_intent, "fail"))) {
            /* Stopped by watch.c: a budget ends succeeded, a stall's
             * restart is requeued, a stall's failure fails. */
            bool budget = !strcmp(j.stop_intent, "budget"),
                 again = !strcmp(j.stop_intent, "restart");
            to = budget ? JOB_SUCCEEDED : again ? JOB_QUEUED : JOB_FAILED;
            up.has_stop_reason = !again;
            up.stop_reason = budget ? "budget" : "stall";
            snprintf(reason, sizeof reason, "server restarted while stopping (%s%s)",
                     budget ? "a budget was reached" : "stalled, on_stall ",
                     budget ? "" : j.stop_intent);
            up.has_error = to == JOB_FAILED;
            up.error = reason;
        } else if (j.state == JOB_STOPPING && j.stop_intent) {
            bool pause = strcmp(j.stop_intent, "cancel") != 0;
            to = pause ? JOB_PAUSED : JOB_CANCELLED;
            snprintf(reason, sizeof reason, "server restarted while %s",
                     pause ? "pausing" : "cancelling");
        } else {
            to = JOB_QUEUED;
            snprintf(reason, sizeof reason,
                     "server restarted; recovering%s (not counted as a "
                     "restart)",
                     pg ? ": waiting for the previous engine's final checkpoint" : "");
        }
        up.set_finished = db_state_terminal(to);
        if (srv_transition(s, j.id, live, to, reason, &up, NULL, &err))
            fprintf(stderr, "trainyard: job %lld: recovery cannot record %s: %s\n", (long long)j.id,
                    db_state_name(to), err.msg);
        db_job_free(&j);
    }
    free(ids);
}

/* Recovery, second half, on the scheduler thread: one wait for all the
 * orphaned engine groups (SIGKILL for what is left after the grace
 * period), then each job's checkpoints are reconciled with its directory
 * and a queued or paused job resumes from the newest complete one. */
static void recover_finish(sched *x)
{
    srv *s = x->s;
    if (x->nrecov == 0) return;
    int64_t deadline = ty_mono_ms() + s->cfg.grace_s * 1000LL;
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
    for (int i = 0; i < x->nrecov; i++) {
        int64_t id = x->recov[i].job_id;
        char *store = job_store(s, id), *ck = NULL;
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
    recover_mark(x); /* before the API answers for any job */
    if (pthread_create(&x->thread, NULL, sched_main, x)) {
        ty_err_set(err, TY_EINTERNAL, "cannot start the scheduler thread");
        sched_free(x);
        return NULL;
    }
    if (pthread_create(&x->sampler, NULL, sampler_main, x)) {
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
     * reads their final events and requeues their jobs (finish_run), up to
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
            fetch_free(r->f);
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
