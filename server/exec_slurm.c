/* exec_slurm.c — the Slurm executor: each job is one sbatch, its ranks one
 * srun inside the allocation, its events a file on the shared work path.
 *
 * The server and the compute nodes share one directory (--slurm-workdir;
 * the job directories live under it, so checkpoints, spec and logs are
 * where both sides see them). A start writes a batch script and submits
 * it; the script's srun starts one engine per task, rank 0 with fd 3
 * appended to events.<slurm id>.jsonl, which the scheduler follows like
 * the local pipe. Why a file rather than HTTP back to the server: it needs
 * no route, token or reachable server address from the nodes, it survives
 * a server restart with nothing lost (the server re-reads from the offset
 * it had recorded), and the shared path is needed for checkpoints anyway
 * (docs/server.md, "The Slurm executor").
 *
 * Slurm is asked on our own thread, never in a request or the scheduler's
 * loop: every --slurm-poll-ms it runs one squeue for all our jobs (sacct
 * for those squeue has forgotten) and the signals API threads asked for
 * (scancel). SIGTERM is `scancel --signal=TERM` to the job's steps (the
 * engines checkpoint and stop; a job still pending is simply cancelled),
 * SIGKILL a plain scancel. NODE_FAIL, PREEMPTED and BOOT_FAIL mark the end
 * as lost: the scheduler requeues the job from its newest committed
 * checkpoint. Jobs are submitted with --no-requeue so that Slurm reports
 * these instead of requeueing behind our back.
 *
 * The state kept for a restart is slurm.job in the job directory: the
 * Slurm id of the current attempt and how far its events were read
 * (rewritten at most once a second, and at shutdown). A job Slurm still
 * runs is re-attached after a restart, not submitted again. */
#include "executor.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "state.h"
#include "tyutil.h"

typedef struct slurm_job {
    exec_job base;
    char id[32]; /* Slurm job id */
    char jobdir[PATH_MAX];
    int evfd; /* the events file, -1 until it exists or once closed */
    bool ev_closed;
    off_t off; /* bytes of events read */
    off_t saved_off;
    int64_t saved_ms;
    /* Written by the poller under mu. */
    char state[32]; /* squeue's %T, "" before the first answer */
    char reason[96];
    bool gone;    /* neither squeue nor sacct knows it any more */
    int want_sig; /* signal to send (poller), 0 none */
    struct slurm_job *next;
} slurm_job;

typedef struct slurm_exec {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_t thread;
    bool stop;
    slurm_job *jobs;
} slurm_exec;

/* ---- running Slurm's commands ------------------------------------------------------------ */

extern char **environ;

/* Runs argv (PATH lookup) with env (NULL: ours); stdout into out (cap,
 * NUL-terminated, may be NULL), stderr too when out is given. Returns the
 * exit status, or -1 if it could not run. */
static int run_cmd(char *const argv[], char *const env[], char *out, size_t cap)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC)) return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, &at, argv, env ? env : environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(p[1]);
    if (rc) {
        close(p[0]);
        if (out && cap) snprintf(out, cap, "cannot run %s: %s", argv[0], strerror(rc));
        return -1;
    }
    size_t n = 0;
    char sink[4096];
    for (;;) {
        ssize_t k =
            out && n + 1 < cap ? read(p[0], out + n, cap - 1 - n) : read(p[0], sink, sizeof sink);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        if (out && n + 1 < cap) n += (size_t)k;
    }
    close(p[0]);
    if (out && cap) out[n] = 0;
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- job files --------------------------------------------------------------------------- */

static void job_file(const char *jobdir, char *out, size_t cap)
{
    snprintf(out, cap, "%s/slurm.job", jobdir);
}

/* slurm.job: "<slurm id> <events offset>\n", via a temporary file. */
static void save_state(slurm_job *j)
{
    char path[PATH_MAX + 16], tmp[PATH_MAX + 32];
    job_file(j->jobdir, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "we");
    if (!f) return;
    bool ok = fprintf(f, "%s %lld\n", j->id, (long long)j->off) > 0;
    ok &= fclose(f) == 0;
    if (ok && rename(tmp, path) == 0) {
        j->saved_off = j->off;
        j->saved_ms = ty_mono_ms();
    } else {
        unlink(tmp);
    }
}

/* 'x' → 'x', with ' inside made '\'' (the script quotes every path). */
static int sh_quote(const char *s, char *out, size_t cap)
{
    size_t n = 0;
    if (cap < 3) return -1;
    out[n++] = '\'';
    for (; *s; s++) {
        const char *piece = *s == '\'' ? "'\\''" : NULL;
        size_t len = piece ? 4 : 1;
        if (n + len + 2 > cap) return -1;
        if (piece)
            memcpy(out + n, piece, 4);
        else
            out[n] = *s;
        n += len;
    }
    out[n++] = '\'';
    out[n] = 0;
    return 0;
}

static int write_script(srv *s, const exec_start *st, int ntasks, const char *path, ty_err *err)
{
    char q_engine[PATH_MAX * 2], q_spec[PATH_MAX * 2], q_dir[PATH_MAX * 2], q_res[PATH_MAX * 2];
    char spec[PATH_MAX + 16], res[PATH_MAX + 520];
    snprintf(spec, sizeof spec, "%s/spec.json", st->jobdir);
    if (st->resume) snprintf(res, sizeof res, "%s/%s", st->jobdir, st->resume);
    if (sh_quote(s->cfg.engine, q_engine, sizeof q_engine) ||
        sh_quote(spec, q_spec, sizeof q_spec) || sh_quote(st->jobdir, q_dir, sizeof q_dir) ||
        (st->resume && sh_quote(res, q_res, sizeof q_res)))
        return ty_err_set(err, TY_EINVAL, "job path too long for the batch script");
    FILE *f = fopen(path, "we");
    if (!f) return ty_err_set(err, TY_EIO, "cannot write %s: %s", path, strerror(errno));
    /* srun starts one engine per task (over PMIx when they form an MPI
     * world, docs/engine.md "Ranks"); only rank 0 writes events, to
     * TY_EVENTS_PATH, or fd 3 (the same file) for an engine that predates
     * it. The exit status is kept for the server, which learns the end
     * from squeue but the status from here. */
    fprintf(f,
            "#!/bin/sh\n"
            "# trainyard job %lld: written by the server for each submission.\n"
            "dir=%s\n"
            "export TY_EVENTS_PATH=\"$dir/events.$SLURM_JOB_ID.jsonl\"\n"
            "srun --kill-on-bad-exit=1%s /bin/sh -c 'exec \"$@\" 3>>\"$TY_EVENTS_PATH\"' \\\n"
            "    trainyard-engine %s --spec %s --workdir \"$dir\"%s%s\n"
            "rc=$?\n"
            "echo $rc > \"$dir/exit.$SLURM_JOB_ID\"\n"
            "exit $rc\n",
            (long long)st->job_id, q_dir, ntasks > 1 ? " --mpi=pmix" : "", q_engine, q_spec,
            st->resume ? " --resume " : "", st->resume ? q_res : "");
    if (fclose(f) != 0)
        return ty_err_set(err, TY_EIO, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

/* Resources from the job's spec: nodes × gpus per node, or CPU ranks. */
static void spec_resources(const jobspec *spec, int *nodes, int *gpus, int *cpu_ranks)
{
    *nodes = spec && spec->nodes > 0 ? spec->nodes : 1;
    *gpus = spec && spec->gpus > 0 ? spec->gpus : 0;
    *cpu_ranks = spec && spec->cpu_ranks > 0 ? spec->cpu_ranks : 1;
}

/* ---- the executor ------------------------------------------------------------------------ */

static void track(slurm_exec *se, slurm_job *j)
{
    pthread_mutex_lock(&se->mu);
    j->next = se->jobs;
    se->jobs = j;
    pthread_mutex_unlock(&se->mu);
    pthread_cond_signal(&se->cond);
}

static slurm_job *job_new(executor *e, int64_t job_id, const char *jobdir)
{
    slurm_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->base.ops = e->ops;
    j->base.job_id = job_id;
    j->evfd = -1;
    snprintf(j->jobdir, sizeof j->jobdir, "%s", jobdir);
    return j;
}

static int slurm_start(executor *e, const exec_start *st, exec_job **out, int *fd, int64_t *handle,
                       ty_err *err)
{
    srv *s = e->s;
    int nodes, gpus, cpu_ranks;
    spec_resources(st->spec, &nodes, &gpus, &cpu_ranks);
    char script[PATH_MAX + 32];
    snprintf(script, sizeof script, "%s/slurm.sh", st->jobdir);
    int ntasks = gpus > 0 ? gpus * nodes : cpu_ranks * nodes;
    int rc = write_script(s, st, ntasks, script, err);
    if (rc) return rc;

    char a_name[48], a_chdir[PATH_MAX + 16], a_out[PATH_MAX + 32], a_nodes[32], a_tasks[48],
        a_gpus[48], a_part[160], a_acct[160];
    snprintf(a_name, sizeof a_name, "--job-name=trainyard-%lld", (long long)st->job_id);
    snprintf(a_chdir, sizeof a_chdir, "--chdir=%s", st->jobdir);
    snprintf(a_out, sizeof a_out, "--output=%s/engine.log", st->jobdir);
    snprintf(a_nodes, sizeof a_nodes, "--nodes=%d", nodes);
    if (gpus > 0) {
        snprintf(a_tasks, sizeof a_tasks, "--ntasks-per-node=%d", gpus);
        snprintf(a_gpus, sizeof a_gpus, "--gpus-per-node=%d", gpus);
    } else {
        snprintf(a_tasks, sizeof a_tasks, "--ntasks-per-node=%d", cpu_ranks);
    }
    snprintf(a_part, sizeof a_part, "--partition=%s", s->cfg.slurm_partition);
    snprintf(a_acct, sizeof a_acct, "--account=%s", s->cfg.slurm_account);
    char extra[sizeof s->cfg.slurm_args];
    snprintf(extra, sizeof extra, "%s", s->cfg.slurm_args);
    char *argv[64];
    int a = 0;
    argv[a++] = "sbatch";
    argv[a++] = "--parsable";
    argv[a++] = "--no-requeue";
    argv[a++] = "--open-mode=append";
    argv[a++] = a_name;
    argv[a++] = a_chdir;
    argv[a++] = a_out;
    argv[a++] = a_nodes;
    argv[a++] = a_tasks;
    if (gpus > 0) argv[a++] = a_gpus;
    if (s->cfg.slurm_partition[0]) argv[a++] = a_part;
    if (s->cfg.slurm_account[0]) argv[a++] = a_acct;
    char *save = NULL;
    for (char *t = strtok_r(extra, " \t", &save); t && a < 60; t = strtok_r(NULL, " \t", &save))
        argv[a++] = t;
    argv[a++] = script;
    argv[a] = NULL;

    /* The engines get the environment a local engine would (no cloud
     * credentials), their job id and TY_SUPERVISED: checkpoint pruning is
     * ours, though we are not their parent. sbatch itself needs our
     * SLURM_CONF, if any, to find the cluster. */
    char e_job[40], e_conf[PATH_MAX + 16];
    snprintf(e_job, sizeof e_job, "TY_JOB_ID=%lld", (long long)st->job_id);
    const char *conf = getenv("SLURM_CONF");
    snprintf(e_conf, sizeof e_conf, "SLURM_CONF=%s", conf ? conf : "");
    const char *extra_env[] = {e_job, "TY_SUPERVISED=1", conf ? e_conf : NULL, NULL};
    char **env = exec_env_new(s, extra_env);
    if (!env) return ty_err_set(err, TY_ENOMEM, "out of memory");
    char outbuf[2048];
    int st_rc = run_cmd(argv, env, outbuf, sizeof outbuf);
    exec_env_free(env);
    /* --parsable prints "id" or "id;cluster". */
    char *end = NULL;
    long long id = strtoll(outbuf, &end, 10);
    if (st_rc != 0 || id <= 0 || (end && *end && *end != ';' && *end != '\n')) {
        size_t n = strlen(outbuf);
        while (n && (outbuf[n - 1] == '\n' || outbuf[n - 1] == ' '))
            outbuf[--n] = 0;
        return ty_err_set(err, TY_EIO, "sbatch failed (status %d): %.1500s", st_rc, outbuf);
    }
    slurm_job *j = job_new(e, st->job_id, st->jobdir);
    if (!j) {
        char idbuf[32], *cargv[] = {"scancel", idbuf, NULL};
        snprintf(idbuf, sizeof idbuf, "%lld", id);
        run_cmd(cargv, NULL, NULL, 0);
        return ty_err_set(err, TY_ENOMEM, "out of memory");
    }
    snprintf(j->id, sizeof j->id, "%lld", id);
    save_state(j);
    track(e->impl, j);
    *fd = -1;
    *handle = 0;
    *out = &j->base;
    return 0;
}

static ssize_t slurm_read(executor *e, exec_job *ej, char *buf, size_t cap)
{
    (void)e;
    slurm_job *j = (slurm_job *)ej;
    if (j->ev_closed) return -1;
    if (j->evfd < 0) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/events.%s.jsonl", j->jobdir, j->id);
        j->evfd = open(path, O_RDONLY | O_CLOEXEC);
        if (j->evfd < 0) return 0; /* the job has not started yet */
    }
    ssize_t k = pread(j->evfd, buf, cap, j->off);
    if (k <= 0) {
        if (j->off != j->saved_off && ty_mono_ms() - j->saved_ms >= 1000) save_state(j);
        return 0; /* a file has no end of stream: the job's end is learnt from Slurm */
    }
    j->off += k;
    if (ty_mono_ms() - j->saved_ms >= 1000) save_state(j);
    return k;
}

static void slurm_close_events(executor *e, exec_job *ej)
{
    (void)e;
    slurm_job *j = (slurm_job *)ej;
    if (j->evfd >= 0) close(j->evfd);
    j->evfd = -1;
    j->ev_closed = true;
    if (j->off != j->saved_off) save_state(j);
}

static void slurm_signal(executor *e, exec_job *ej, int sig)
{
    slurm_exec *se = e->impl;
    slurm_job *j = (slurm_job *)ej;
    /* We never suspend a Slurm job, so there is nothing to continue; and
     * scancel has one pending signal a job, which a SIGCONT would replace. */
    if (sig == SIGCONT) return;
    pthread_mutex_lock(&se->mu);
    if (sig == SIGKILL || !j->want_sig) j->want_sig = sig;
    pthread_mutex_unlock(&se->mu);
    pthread_cond_signal(&se->cond);
}

static bool state_live(const char *st)
{
    static const char *const ended[] = {"COMPLETED", "FAILED",    "CANCELLED",
                                        "TIMEOUT",   "NODE_FAIL", "PREEMPTED",
                                        "BOOT_FAIL", "DEADLINE",  "OUT_OF_MEMORY"};
    if (!st[0]) return true; /* not asked yet */
    for (size_t i = 0; i < sizeof ended / sizeof *ended; i++)
        if (!strncmp(st, ended[i], strlen(ended[i]))) return false; /* "CANCELLED by 0" */
    return true;
}

static bool slurm_ended(executor *e, exec_job *ej, exec_end *end)
{
    slurm_exec *se = e->impl;
    slurm_job *j = (slurm_job *)ej;
    char state[32], reason[96];
    pthread_mutex_lock(&se->mu);
    bool gone = j->gone;
    snprintf(state, sizeof state, "%s", j->state);
    snprintf(reason, sizeof reason, "%s", j->reason);
    pthread_mutex_unlock(&se->mu);
    if (!gone && state_live(state)) return false;
    /* Read the rest through a fresh open: on NFS that revalidates the
     * file (close-to-open), so lines the nodes appended last are seen. */
    if (j->evfd >= 0) close(j->evfd);
    j->evfd = -1;
    memset(end, 0, sizeof *end);
    /* The batch script's record of srun's status, when it got to write it. */
    char path[PATH_MAX + 64], *text = NULL;
    size_t len = 0;
    ty_err err = {0};
    int code = -1;
    snprintf(path, sizeof path, "%s/exit.%s", j->jobdir, j->id);
    if (ty_read_file(path, &text, &len, &err) == 0) {
        char *p;
        long v = strtol(text, &p, 10);
        if (p != text && v >= 0 && v < 256) code = (int)v;
        free(text);
    }
    if (!gone && !strcmp(state, "NODE_FAIL")) end->lost = true;
    if (!gone && (!strcmp(state, "PREEMPTED") || !strcmp(state, "BOOT_FAIL"))) end->lost = true;
    if (end->lost || code < 0) {
        /* No status of srun's: a signal for the record (SIGKILL: the
         * engines were killed with the job), an exit 0 for a completion. */
        end->status = !gone && !strcmp(state, "COMPLETED") ? 0 : SIGKILL;
    } else {
        end->status = code << 8; /* W_EXITCODE(code, 0) */
    }
    if (gone)
        snprintf(end->how, sizeof end->how, "(Slurm job %s) ended; Slurm no longer knows it",
                 j->id);
    else if (code >= 0 && !end->lost)
        snprintf(end->how, sizeof end->how, "exited with status %d (Slurm job %s %s)", code, j->id,
                 state);
    else
        snprintf(end->how, sizeof end->how, "ended with Slurm job %s %s%s%s%s", j->id, state,
                 reason[0] && strcmp(reason, "None") ? " (" : "",
                 reason[0] && strcmp(reason, "None") ? reason : "",
                 reason[0] && strcmp(reason, "None") ? ")" : "");
    return true;
}

static void slurm_release(executor *e, exec_job *ej)
{
    slurm_exec *se = e->impl;
    slurm_job *j = (slurm_job *)ej;
    if (!j) return;
    pthread_mutex_lock(&se->mu);
    for (slurm_job **pp = &se->jobs; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    pthread_mutex_unlock(&se->mu);
    if (j->evfd >= 0) close(j->evfd);
    free(j);
}

static void slurm_detach(executor *e, exec_job *ej)
{
    (void)e;
    slurm_job *j = (slurm_job *)ej;
    if (j->off != j->saved_off) save_state(j);
}

/* The job's attempt from slurm.job, unless Slurm says it is over (then the
 * job is requeued as after any restart). When Slurm cannot be asked, the
 * job is re-attached anyway: the poller learns its state later, and a job
 * submitted twice would be worse than a late requeue. */
static exec_job *slurm_reattach(executor *e, int64_t job_id, int *fd)
{
    char jobdir[PATH_MAX], path[PATH_MAX + 16], *text = NULL;
    size_t len = 0;
    ty_err err = {0};
    srv_job_dir(e->s, job_id, jobdir, sizeof jobdir);
    job_file(jobdir, path, sizeof path);
    if (ty_read_file(path, &text, &len, &err)) return NULL;
    long long id = 0, off = 0;
    int got = sscanf(text, "%lld %lld", &id, &off);
    free(text);
    if (got != 2 || id <= 0 || off < 0) return NULL;
    char idbuf[32], out[512];
    snprintf(idbuf, sizeof idbuf, "%lld", id);
    char *argv[] = {"squeue", "-h", "--states=all", "-o", "%i|%T", "-j", idbuf, NULL};
    int rc = run_cmd(argv, NULL, out, sizeof out);
    if (rc == 0) {
        char *bar = strchr(out, '|');
        if (!bar || strtoll(out, NULL, 10) != id) return NULL; /* forgotten: long over */
        char st[32];
        snprintf(st, sizeof st, "%.*s", (int)strcspn(bar + 1, "\n"), bar + 1);
        if (!state_live(st)) return NULL;
    }
    slurm_job *j = job_new(e, job_id, jobdir);
    if (!j) return NULL;
    snprintf(j->id, sizeof j->id, "%lld", id);
    j->off = j->saved_off = off;
    j->saved_ms = ty_mono_ms();
    track(e->impl, j);
    *fd = -1;
    return &j->base;
}

/* ---- the poller -------------------------------------------------------------------------- */

/* One squeue for every job we follow; sacct for those it no longer lists. */
static void poll_states(slurm_exec *se)
{
    char ids[8192] = "";
    size_t n = 0;
    int count = 0;
    pthread_mutex_lock(&se->mu);
    for (slurm_job *j = se->jobs; j; j = j->next) {
        if (j->gone || !state_live(j->state) || n + strlen(j->id) + 2 >= sizeof ids) continue;
        n += (size_t)snprintf(ids + n, sizeof ids - n, "%s%s", count ? "," : "", j->id);
        count++;
    }
    pthread_mutex_unlock(&se->mu);
    if (!count) return;
    static char out[1 << 16]; /* one poller thread per server */
    char *argv[] = {"squeue", "-h", "--states=all", "-o", "%i|%T|%r", "-j", ids, NULL};
    int rc = run_cmd(argv, NULL, out, sizeof out);
    /* squeue answers 1 when one of the ids is unknown but still lists the
     * others; only an answer in our format counts. */
    bool answered = rc == 0 || strchr(out, '|') != NULL;
    if (!answered) return;
    pthread_mutex_lock(&se->mu);
    for (slurm_job *j = se->jobs; j; j = j->next) {
        if (j->gone || !state_live(j->state)) continue;
        bool seen = false;
        for (char *line = out; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = 0;
            char *b1 = strchr(line, '|'), *b2 = b1 ? strchr(b1 + 1, '|') : NULL;
            if (b1 && b2 && (size_t)(b1 - line) == strlen(j->id) &&
                !strncmp(line, j->id, strlen(j->id))) {
                snprintf(j->state, sizeof j->state, "%.*s", (int)(b2 - b1 - 1), b1 + 1);
                snprintf(j->reason, sizeof j->reason, "%s", b2 + 1);
                seen = true;
            }
            if (nl) *nl = '\n';
            line = nl ? nl + 1 : NULL;
        }
        if (!seen) {
            /* Past MinJobAge: accounting may still know how it ended. */
            char id[32], acct[512];
            snprintf(id, sizeof id, "%s", j->id);
            pthread_mutex_unlock(&se->mu);
            char *sargv[] = {"sacct", "-n", "-P", "-X", "-o", "State", "-j", id, NULL};
            int src = run_cmd(sargv, NULL, acct, sizeof acct);
            pthread_mutex_lock(&se->mu);
            size_t l = strcspn(acct, "\n");
            if (src == 0 && l > 0 && l < sizeof j->state)
                snprintf(j->state, sizeof j->state, "%.*s", (int)l, acct);
            else
                j->gone = true;
        }
    }
    pthread_mutex_unlock(&se->mu);
}

/* The signals API threads asked for. A pending job has no engines to
 * checkpoint: a SIGTERM cancels it. */
static void send_signals(slurm_exec *se)
{
    for (;;) {
        char id[32];
        int sig = 0;
        bool pending = false;
        pthread_mutex_lock(&se->mu);
        for (slurm_job *j = se->jobs; j && !sig; j = j->next)
            if (j->want_sig) {
                sig = j->want_sig;
                j->want_sig = 0;
                pending = !strcmp(j->state, "PENDING");
                snprintf(id, sizeof id, "%s", j->id);
            }
        pthread_mutex_unlock(&se->mu);
        if (!sig) return;
        char *argv[6];
        int a = 0;
        argv[a++] = "scancel";
        if (sig == SIGTERM && !pending)
            argv[a++] = "--signal=TERM";
        else if (sig != SIGTERM && sig != SIGKILL)
            argv[a++] = "--signal=KILL";
        argv[a++] = id;
        argv[a] = NULL;
        char out[512];
        if (run_cmd(argv, NULL, out, sizeof out) != 0)
            fprintf(stderr, "trainyard: scancel %s: %s", id, out);
    }
}

static void *poller_main(void *arg)
{
    executor *e = arg;
    slurm_exec *se = e->impl;
    pthread_mutex_lock(&se->mu);
    while (!se->stop) {
        pthread_mutex_unlock(&se->mu);
        send_signals(se);
        poll_states(se);
        send_signals(se);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + (int64_t)e->s->cfg.slurm_poll_ms * 1000000LL;
        ts.tv_sec += ns / 1000000000LL;
        ts.tv_nsec = ns % 1000000000LL;
        pthread_mutex_lock(&se->mu);
        bool sig = false;
        for (slurm_job *j = se->jobs; j; j = j->next)
            sig |= j->want_sig != 0;
        if (!se->stop && !sig) pthread_cond_timedwait(&se->cond, &se->mu, &ts);
    }
    pthread_mutex_unlock(&se->mu);
    return NULL;
}

static void slurm_close(executor *e)
{
    slurm_exec *se = e->impl;
    if (!se) return;
    pthread_mutex_lock(&se->mu);
    se->stop = true;
    pthread_mutex_unlock(&se->mu);
    pthread_cond_signal(&se->cond);
    pthread_join(se->thread, NULL);
    /* Runs still listed were detached (the jobs go on in Slurm). */
    while (se->jobs) {
        slurm_job *j = se->jobs;
        se->jobs = j->next;
        if (j->evfd >= 0) close(j->evfd);
        free(j);
    }
    pthread_mutex_destroy(&se->mu);
    pthread_cond_destroy(&se->cond);
    free(se);
    e->impl = NULL;
}

/* No engine of ours outlives us locally: nothing to find after a crash
 * but what reattach finds. */
static bool slurm_orphan_alive(executor *e, int64_t job_id, int64_t handle)
{
    (void)e, (void)job_id, (void)handle;
    return false;
}
static void slurm_orphan_signal(executor *e, int64_t handle, int sig)
{
    (void)e, (void)handle, (void)sig;
}
static bool slurm_orphan_running(executor *e, int64_t handle)
{
    (void)e, (void)handle;
    return false;
}

static const exec_ops slurm_ops = {
    .name = "slurm",
    .cluster = true,
    .start = slurm_start,
    .read = slurm_read,
    .close_events = slurm_close_events,
    .signal = slurm_signal,
    .ended = slurm_ended,
    .release = slurm_release,
    .orphan_alive = slurm_orphan_alive,
    .orphan_signal = slurm_orphan_signal,
    .orphan_running = slurm_orphan_running,
    .reattach = slurm_reattach,
    .detach = slurm_detach,
    .close = slurm_close,
};

int exec_slurm_open(srv *s, executor *e, ty_err *err)
{
    /* The cluster must answer before we take jobs. */
    char out[1024];
    char *argv[] = {"sinfo", "-h", "-o", "%P", NULL};
    if (run_cmd(argv, NULL, out, sizeof out) != 0) {
        size_t n = strlen(out);
        while (n && out[n - 1] == '\n')
            out[--n] = 0;
        return ty_err_set(err, TY_EINVAL,
                          "--executor slurm: sinfo cannot reach the cluster: %.800s", out);
    }
    slurm_exec *se = calloc(1, sizeof *se);
    if (!se) return ty_err_set(err, TY_ENOMEM, "out of memory");
    pthread_mutex_init(&se->mu, NULL);
    pthread_cond_init(&se->cond, NULL);
    e->ops = &slurm_ops;
    e->s = s;
    e->impl = se;
    if (pthread_create(&se->thread, NULL, poller_main, e)) {
        pthread_mutex_destroy(&se->mu);
        pthread_cond_destroy(&se->cond);
        free(se);
        e->impl = NULL;
        return ty_err_set(err, TY_EINTERNAL, "cannot start the Slurm poller thread");
    }
    return 0;
}
