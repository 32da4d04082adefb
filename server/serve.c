/* serve.c — `trainyard serve`: settings, the data directory, then the
 * database, SSE hub, event writer, upload workers, scheduler and HTTP in
 * that order; then waits for SIGINT/SIGTERM and stops them in the order
 * that loses nothing (docs/server.md "Shutdown and recovery"). It only
 * starts and stops: the state the parts share is state.c's. */
#include "serve.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "disk.h"
#include "gate.h"
#include "genq.h"
#include "http.h"
#include "ops.h"
#include "scheduler.h"
#include "sse.h"
#include "state.h"
#include "tyutil.h"
#include "upload.h"

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

/* The upload workers' wake-up of the scheduler: they start before it
 * exists (and recovery runs inside sched_new), so s->sched is read at
 * each call; sched_wake ignores NULL. */
static void wake_sched(void *ctx)
{
    srv *s = ctx;
    sched_wake(s->sched);
}

/* The database and job directory paths, made absolute, and the data
 * directory prepared; prints why and returns 1 when that fails. */
static int set_paths(srv *s)
{
    ty_err err = {0};
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
    return 0;
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
    if (set_paths(s)) return 1;
    srv_state_init(s);
    raise_nofile();
    if (srv_disk_start(s, &err)) {
        fprintf(stderr, "trainyard serve: %s\n", err.msg);
        return 1;
    }

    /* SIGINT/SIGTERM are taken by sigwait below; block them in every thread
     * we start. SIGPIPE is ignored: a dead client is an EPIPE, not a crash. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (!(s->hub = sse_hub_new(s, &err)) ||
        !(s->evw = evw_new_with(NULL, srv_db_of, &s->write_lock, srv_publish_ingested, s, &err)) ||
        !(s->up = uploader_new(s, wake_sched, s, &err)) || !(s->sched = sched_new(s, &err)) ||
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
    srv_db_release(s);
    return 0;
}
