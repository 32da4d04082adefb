/* exec_local.c — the local executor: a job's ranks are processes of ours.
 *
 * Every rank is posix_spawn'ed into one process group that rank 0 leads,
 * so one kill(-pgid) reaches the whole job and nothing of the server. Rank
 * 0's fd 3 is the write end of a pipe whose read end the scheduler polls;
 * the other ranks get /dev/null there. stdout and stderr of every rank go
 * to the job's engine.log. A rank other than 0 that fails takes the job
 * down (the others would wait forever in a collective). The stored handle
 * is the process group; after a crash it is trusted only while its leader
 * still carries this job's TY_JOB_ID (pids are reused).
 *
 * A job of several CPU ranks is one mpirun instead (exec_mpirun.c): it is
 * then the only process we spawn and reap, and it leads the group. */
#include "executor.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu.h"
#include "exec_mpirun.h"
#include "jobspec.h"
#include "tyutil.h"

typedef struct local_job {
    exec_job base;
    int nranks, alive;
    pid_t pid[GPU_MAX];
    bool exited[GPU_MAX];
    int status[GPU_MAX];
    pid_t pgid;
    int fd; /* rank 0's fd 3 read end, -1 once closed */
    char rank_failure[200];
    bool mpi;      /* several ranks: pid[0] is mpirun */
    mpirun_job mj; /* then: its FIFO and signals */
} local_job;

/* ---- starting ------------------------------------------------------------------------ */

static int spawn_rank(executor *e, local_job *r, int rank, const exec_start *st, int logfd,
                      int pipe_w, int devnull, ty_err *err)
{
    srv *s = e->s;
    char spec[PATH_MAX + 32], resume_path[PATH_MAX + 512];
    snprintf(spec, sizeof spec, "%s/spec.json", st->jobdir);
    char *argv[8];
    int a = 0;
    argv[a++] = s->cfg.engine;
    argv[a++] = "--spec";
    argv[a++] = spec;
    argv[a++] = "--workdir";
    argv[a++] = (char *)st->jobdir;
    if (st->resume) {
        snprintf(resume_path, sizeof resume_path, "%s/%s", st->jobdir, st->resume);
        argv[a++] = "--resume";
        argv[a++] = resume_path;
    }
    argv[a] = NULL;

    char e_rank[32], e_world[32], e_local[32], e_cuda[300], e_job[40], e_sup[48];
    snprintf(e_rank, sizeof e_rank, "TY_RANK=%d", rank);
    snprintf(e_world, sizeof e_world, "TY_WORLD_SIZE=%d", r->nranks);
    snprintf(e_local, sizeof e_local, "TY_LOCAL_RANK=%d", rank);
    snprintf(e_cuda, sizeof e_cuda, "CUDA_VISIBLE_DEVICES=%s", st->cuda);
    snprintf(e_job, sizeof e_job, "TY_JOB_ID=%lld", (long long)st->job_id);
    /* The engine dies with us: it sets PR_SET_PDEATHSIG and, for the race
     * of our death before that, compares getppid() with this pid. It also
     * leaves checkpoint pruning to us (docs/server.md, "one owner"). */
    snprintf(e_sup, sizeof e_sup, "TY_SUPERVISOR_PID=%d", (int)getpid());
    /* NVML numbers GPUs in PCI order; make CUDA agree. */
    const char *extra[] = {
        e_rank, e_world, e_local, e_cuda, e_job, e_sup, "CUDA_DEVICE_ORDER=PCI_BUS_ID", NULL};
    char **envp = exec_env_new(s, extra);
    if (!envp) return ty_err_set(err, TY_ENOMEM, "out of memory");

    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    posix_spawn_file_actions_adddup2(&fa, devnull, 0);
    posix_spawn_file_actions_adddup2(&fa, logfd, 1);
    posix_spawn_file_actions_adddup2(&fa, logfd, 2);
    posix_spawn_file_actions_adddup2(&fa, rank == 0 ? pipe_w : devnull, 3);
    sigset_t none, defs;
    sigemptyset(&none);
    sigemptyset(&defs);
    sigaddset(&defs, SIGPIPE);
    sigaddset(&defs, SIGTERM);
    sigaddset(&defs, SIGINT);
    sigaddset(&defs, SIGCHLD);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &defs);
    /* Own process group: signals to the job reach every rank and nothing of
     * ours; rank 0 leads it. */
    posix_spawnattr_setpgroup(&at, rank == 0 ? 0 : r->pgid);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
    pid_t pid;
    int rc = posix_spawn(&pid, s->cfg.engine, &fa, &at, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    exec_env_free(envp);
    if (rc != 0)
        return ty_err_set(err, TY_EIO, "cannot run the engine %s: %s", s->cfg.engine, strerror(rc));
    r->pid[rank] = pid;
    if (rank == 0) r->pgid = pid;
    r->alive++;
    return 0;
}

static int local_start(executor *e, const exec_start *st, exec_job **out, int *fd, int64_t *handle,
                       ty_err *err)
{
    local_job *r = calloc(1, sizeof *r);
    if (!r) return ty_err_set(err, TY_ENOMEM, "out of memory");
    r->base.ops = e->ops;
    r->base.job_id = st->job_id;
    r->nranks = st->nranks;
    r->fd = -1;
    char logpath[PATH_MAX + 16];
    snprintf(logpath, sizeof logpath, "%s/engine.log", st->jobdir);
    int rc = 0;
    int pipefd[2] = {-1, -1};
    int logfd = open(logpath, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (logfd < 0 || devnull < 0 || pipe2(pipefd, O_CLOEXEC) != 0) {
        rc = ty_err_set(err, TY_EIO, "cannot set up the engine's files: %s", strerror(errno));
    }
    if (rc == 0 && st->nranks > 1) { /* Open MPI starts and wires the ranks */
        r->mpi = true;
        r->nranks = 1;
        rc = mpirun_start(e->s, st, logfd, devnull, &r->mj, err);
        if (rc == 0) {
            r->pid[0] = r->pgid = r->mj.pid;
            r->alive = 1;
            close(pipefd[0]);
            pipefd[0] = r->mj.events_fd; /* ours now: read and closed like the pipe */
            r->mj.events_fd = -1;
        }
    }
    for (int rank = 0; rc == 0 && !r->mpi && rank < r->nranks; rank++) {
        rc = spawn_rank(e, r, rank, st, logfd, pipefd[1], devnull, err);
        if (rc) {
            if (r->pgid > 0) kill(-r->pgid, SIGKILL);
            for (int k = 0; k < rank; k++)
                waitpid(r->pid[k], NULL, 0);
            r->alive = 0;
        }
    }
    if (pipefd[1] >= 0) close(pipefd[1]);
    if (logfd >= 0) close(logfd);
    if (devnull >= 0) close(devnull);
    if (rc) {
        if (pipefd[0] >= 0) close(pipefd[0]);
        free(r);
        return rc;
    }
    r->fd = pipefd[0];
    fcntl(r->fd, F_SETFL, O_NONBLOCK);
    *fd = r->fd;
    *handle = r->pgid;
    *out = &r->base;
    return 0;
}

/* ---- events, signals, exits ----------------------------------------------------------- */

static ssize_t local_read(executor *e, exec_job *j, char *buf, size_t cap)
{
    (void)e;
    local_job *r = (local_job *)j;
    if (r->fd < 0) return -1;
    ssize_t k = read(r->fd, buf, cap);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (k <= 0) { /* EOF: the engine closed fd 3 or exited */
        close(r->fd);
        r->fd = -1;
        return -1;
    }
    return k;
}

static void local_close_events(executor *e, exec_job *j)
{
    (void)e;
    local_job *r = (local_job *)j;
    if (r->fd >= 0) close(r->fd);
    r->fd = -1;
}

static void local_signal(executor *e, exec_job *j, int sig)
{
    (void)e;
    local_job *r = (local_job *)j;
    if (r->mpi && r->alive > 0)
        mpirun_signal(&r->mj, sig);
    else if (r->pgid > 0 && r->alive > 0)
        kill(-r->pgid, sig);
}

static bool local_ended(executor *e, exec_job *j, exec_end *end)
{
    (void)e;
    local_job *r = (local_job *)j;
    for (int k = 0; k < r->nranks; k++) {
        if (r->exited[k]) continue;
        int st;
        pid_t p = waitpid(r->pid[k], &st, WNOHANG);
        if (p != r->pid[k]) continue;
        r->exited[k] = true;
        r->status[k] = st;
        r->alive--;
        /* A rank failing takes the whole job down: the others would
         * wait forever in a collective. */
        if (k > 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0) && r->alive > 0) {
            char how[160];
            exec_describe_status(st, how, sizeof how);
            if (!r->rank_failure[0])
                snprintf(r->rank_failure, sizeof r->rank_failure, "rank %d %s", k, how);
            kill(-r->pgid, SIGKILL);
        }
    }
    if (r->alive > 0) return false;
    if (r->mpi) {
        mpirun_ended(&r->mj); /* the FIFO reaches EOF once drained */
        /* Its ranks joined its group; none may outlive it. */
        kill(-r->pgid, SIGKILL);
    }
    memset(end, 0, sizeof *end);
    end->status = r->status[0];
    exec_describe_status(r->status[0], end->how, sizeof end->how);
    snprintf(end->rank_failure, sizeof end->rank_failure, "%s", r->rank_failure);
    return true;
}

static void local_release(executor *e, exec_job *j)
{
    (void)e;
    local_job *r = (local_job *)j;
    if (!r) return;
    if (r->fd >= 0) close(r->fd);
    if (r->mpi) mpirun_release(&r->mj);
    free(r);
}

/* ---- recovery --------------------------------------------------------------------------- */

static bool pgid_alive(pid_t pgid)
{
    return pgid > 0 && kill(-pgid, 0) == 0;
}

/* Is pgid still the engine group of job id? The stored pid may have been
 * reused after a reboot, so we check the leader's TY_JOB_ID. */
static bool local_orphan_alive(executor *e, int64_t id, int64_t handle)
{
    (void)e;
    pid_t pgid = (pid_t)handle;
    if (!pgid_alive(pgid)) return false;
    char path[64], want[48];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pgid);
    snprintf(want, sizeof want, "TY_JOB_ID=%lld", (long long)id);
    char *env;
    size_t len;
    ty_err err = {0};
    if (ty_read_file(path, &env, &len, &err)) return false;
    bool found = false;
    for (size_t i = 0; i < len && !found; i += strlen(env + i) + 1)
        found = strcmp(env + i, want) == 0;
    free(env);
    return found;
}

static void local_orphan_signal(executor *e, int64_t handle, int sig)
{
    (void)e;
    if (handle > 0) kill(-(pid_t)handle, sig);
}

/* Does any process of group pg still run? Zombies do not count: an orphan
 * is reaped by init (or a subreaper) on its own schedule, and a zombie
 * writes nothing. */
static bool local_orphan_running(executor *e, int64_t handle)
{
    (void)e;
    pid_t pg = (pid_t)handle;
    if (!pgid_alive(pg)) return false;
    DIR *dh = opendir("/proc");
    if (!dh) return true;
    bool running = false;
    struct dirent *de;
    while (!running && (de = readdir(dh))) {
        if (de->d_name[0] < '1' || de->d_name[0] > '9') continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", de->d_name);
        FILE *f = fopen(path, "re");
        if (!f) continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[k] = 0;
        char *rp = strrchr(buf, ')');
        char state;
        int ppid, pgrp;
        if (rp && sscanf(rp + 1, " %c %d %d", &state, &ppid, &pgrp) == 3 && pgrp == pg &&
            state != 'Z')
            running = true;
    }
    closedir(dh);
    return running;
}

static void local_close(executor *e)
{
    (void)e;
}

/* Every engine runs on this machine: one node, and a CPU job's ranks each
 * hold one of the --cpu-slots at once, so more ranks than slots would wait
 * forever. */
static int local_check_job(const srv_config *c, const jobspec *spec, ty_err *err)
{
    if (spec->gpus == 0 && spec->cpu_ranks > c->cpu_slots)
        return ty_err_field(
            err, TY_EINVAL, "resources.cpu_ranks",
            "the job asks for %d CPU ranks; this server has %d CPU slots (--cpu-slots)",
            spec->cpu_ranks, c->cpu_slots);
    if (spec->nodes > 1)
        return ty_err_field(err, TY_EINVAL, "resources.nodes",
                            "the job asks for %d nodes; this server runs engines on its own "
                            "machine (--executor local), only --executor slurm spans nodes",
                            spec->nodes);
    return 0;
}

static const exec_ops local_ops = {
    .name = "local",
    .cluster = false,
    .check_job = local_check_job,
    .start = local_start,
    .read = local_read,
    .close_events = local_close_events,
    .signal = local_signal,
    .ended = local_ended,
    .release = local_release,
    .orphan_alive = local_orphan_alive,
    .orphan_signal = local_orphan_signal,
    .orphan_running = local_orphan_running,
    .close = local_close,
};

int exec_local_open(srv *s, executor *e, ty_err *err)
{
    (void)err;
    e->ops = &local_ops;
    e->s = s;
    return 0;
}
