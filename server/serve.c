/* serve.c — `trainyard serve`: settings, the data directory, then the
 * database, SSE hub, event writer, upload workers, scheduler and HTTP in
 * that order; then waits for SIGINT/SIGTERM and stops them in the order
 * that loses nothing (docs/server.md "Shutdown and recovery"). Also the
 * daemon-wide helpers of server.h that every part uses: the per-thread
 * database handle, publishing, transitions, job directories. */
#include "server.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "gate.h"
#include "genq.h"
#include "http.h"
#include "ops.h"
#include "scheduler.h"
#include "sse.h"
#include "tyutil.h"
#include "upload.h"

/* ---- shared server plumbing --------------------------------------------------------- */

static void db_key_free(void *p)
{
    db_close(p);
}

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

/* ---- serve ----------------------------------------------------------------------------------- */

/* Descriptors bound how many clients can connect at all: take the hard
 * limit, so the per-address limit is what one client meets first. */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max > (1u << 20) ? (1u << 20) : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
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
    int port, bound_port = 0;
    webhooks *wh = NULL;
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
    /* Under Slurm the job directories live where the nodes see them. */
    if (!strcmp(s->cfg.executor, "slurm") && s->cfg.slurm_workdir[0]) {
        snprintf(s->jobs_dir, sizeof s->jobs_dir, "%.4000s/jobs", s->cfg.slurm_workdir);
        if (ty_mkdir_p(s->jobs_dir, &err)) {
            fprintf(stderr, "trainyard serve: --slurm-workdir: %s\n", err.msg);
            return 1;
        }
    }
    if (srv_data_dir_prepare(&s->cfg, &err)) {
        fprintf(stderr, "trainyard serve: %s\n", err.msg);
        return 1;
    }
    pthread_key_create(&s->db_key, db_key_free);
    raise_nofile();
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
        !(wh = webhooks_start(s, &err)) || http_start(s, &bound_port, &err)) {
        fprintf(stderr, "trainyard serve: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr,
            "trainyard: serving on %s://%s:%u (data %s, %d GPU(s), %d CPU slot(s), tokens %s)\n",
            s->cfg.tls_cert[0] ? "https" : "http", host, (unsigned)bound_port, s->cfg.data_dir,
            sched_gpu_count(s->sched), s->cfg.cpu_slots,
            s->auth_required ? "required" : "optional");
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr,
            "trainyard: %s: shutting down; running engines checkpoint and their jobs are "
            "requeued (up to --grace %d s)\n",
            strsignal(sig), s->cfg.grace_s);
    atomic_store(&s->stopping, true);
    /* Stop accepting, end the streams, stop HTTP, then the scheduler (which
     * SIGTERMs engines and records their final checkpoints, up to the grace
     * period), and flush the event writer last. */
    gate_stop(s->gate);
    sse_hub_shutdown(s->hub);
    genq_shutdown(); /* answers and resumes suspended generate requests */
    MHD_stop_daemon(s->mhd);
    gate_free(s->gate);
    sched_stop(s->sched);
    webhooks_stop(wh);    /* undelivered rows stay in the outbox for the next start */
    uploader_stop(s->up); /* transfers in flight stay queued for the next start */
    evw_free(s->evw);
    sched_free(s->sched);
    uploader_free(s->up);
    sse_hub_free(s->hub);
    db_close(pthread_getspecific(s->db_key));
    pthread_setspecific(s->db_key, NULL);
    return 0;
}
