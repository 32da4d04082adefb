/* exec_mpirun.c — starting a local multi-rank job through mpirun (see
 * exec_mpirun.h; the contract is docs/engine.md, Ranks).
 *
 * Why a FIFO: mpirun does not hand our fd 3 to its ranks, so rank 0 opens
 * TY_EVENTS_PATH instead. We open the read end before mpirun starts (the
 * engine's open then never blocks) and hold a write end of our own, so a
 * read never sees EOF before rank 0 has even opened it; mpirun_ended drops
 * it once mpirun is reaped and the scheduler drains to a real EOF. */
#include "exec_mpirun.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <limits.h>

int mpirun_start(srv *s, const exec_start *st, int logfd, int devnull, mpirun_job *m, ty_err *err)
{
    m->pid = -1;
    m->events_fd = m->hold_fd = -1;
    snprintf(m->fifo, sizeof m->fifo, "%s/events.fifo", st->jobdir);
    unlink(m->fifo);
    if (mkfifo(m->fifo, 0600) != 0)
        return ty_err_set(err, TY_EIO, "cannot make %s: %s", m->fifo, strerror(errno));
    m->events_fd = open(m->fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (m->events_fd >= 0) m->hold_fd = open(m->fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (m->events_fd < 0 || m->hold_fd < 0) {
        int e = errno;
        mpirun_release(m);
        return ty_err_set(err, TY_EIO, "cannot open %s: %s", m->fifo, strerror(e));
    }

    /* Ranks x threads within the cores: the engine's pool is --threads. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long per = cores > st->nranks ? cores / st->nranks : 1;
    char np[16], threads[24], spec[PATH_MAX + 32], resume[PATH_MAX + 512];
    snprintf(np, sizeof np, "%d", st->nranks);
    snprintf(threads, sizeof threads, "%ld", per);
    snprintf(spec, sizeof spec, "%s/spec.json", st->jobdir);
    char *argv[20];
    int a = 0;
    argv[a++] = "mpirun";
    argv[a++] = "-np";
    argv[a++] = np;
    argv[a++] = "--oversubscribe"; /* ranks may outnumber cores; cpu_slots is the limit */
    argv[a++] = "--bind-to";
    argv[a++] = "none"; /* the engine's own thread pool */
    argv[a++] = s->cfg.engine;
    argv[a++] = "--spec";
    argv[a++] = spec;
    argv[a++] = "--workdir";
    argv[a++] = (char *)st->jobdir;
    argv[a++] = "--threads";
    argv[a++] = threads;
    if (st->resume) {
        snprintf(resume, sizeof resume, "%s/%s", st->jobdir, st->resume);
        argv[a++] = "--resume";
        argv[a++] = resume;
    }
    argv[a] = NULL;

    /* mpirun passes its environment to the ranks it starts here; the rank
     * itself comes from OMPI_COMM_WORLD_RANK (no TY_RANK). */
    char e_world[32], e_cuda[300], e_job[40], e_sup[48], e_events[4300];
    snprintf(e_world, sizeof e_world, "TY_WORLD_SIZE=%d", st->nranks);
    snprintf(e_cuda, sizeof e_cuda, "CUDA_VISIBLE_DEVICES=%s", st->cuda);
    snprintf(e_job, sizeof e_job, "TY_JOB_ID=%lld", (long long)st->job_id);
    snprintf(e_sup, sizeof e_sup, "TY_SUPERVISOR_PID=%d", (int)getpid());
    snprintf(e_events, sizeof e_events, "TY_EVENTS_PATH=%s", m->fifo);
    const char *extra[12];
    int k = 0;
    extra[k++] = e_world;
    extra[k++] = e_cuda;
    extra[k++] = e_job;
    extra[k++] = e_sup;
    extra[k++] = e_events;
    extra[k++] = "CUDA_DEVICE_ORDER=PCI_BUS_ID";
    if (geteuid() == 0) { /* Open MPI refuses root without both */
        extra[k++] = "OMPI_ALLOW_RUN_AS_ROOT=1";
        extra[k++] = "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1";
    }
    extra[k] = NULL;
    char **envp = exec_env_new(s, extra);
    if (!envp) {
        mpirun_release(m);
        return ty_err_set(err, TY_ENOMEM, "out of memory");
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    posix_spawn_file_actions_adddup2(&fa, devnull, 0);
    posix_spawn_file_actions_adddup2(&fa, logfd, 1);
    posix_spawn_file_actions_adddup2(&fa, logfd, 2);
    sigset_t none, defs;
    sigemptyset(&none);
    sigemptyset(&defs);
    sigaddset(&defs, SIGPIPE);
    sigaddset(&defs, SIGTERM);
    sigaddset(&defs, SIGINT);
    sigaddset(&defs, SIGUSR1);
    sigaddset(&defs, SIGCHLD);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &defs);
    posix_spawnattr_setpgroup(&at, 0); /* mpirun leads the job's group; ranks join it */
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
    int rc = posix_spawnp(&m->pid, "mpirun", &fa, &at, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    exec_env_free(envp);
    if (rc != 0) {
        m->pid = -1;
        mpirun_release(m);
        return ty_err_set(err, TY_EIO, "cannot run mpirun for %d ranks: %s (install openmpi-bin)",
                          st->nranks, strerror(rc));
    }
    return 0;
}

void mpirun_signal(const mpirun_job *m, int sig)
{
    if (m->pid <= 0) return;
    /* The ranks joined mpirun's group, so they get it directly (mpirun
     * signals each rank's own original group, which they have left). */
    kill(-m->pid, sig == SIGTERM ? SIGUSR1 : sig);
}

void mpirun_ended(mpirun_job *m)
{
    if (m->hold_fd >= 0) close(m->hold_fd);
    m->hold_fd = -1;
}

void mpirun_release(mpirun_job *m)
{
    if (m->events_fd >= 0) close(m->events_fd);
    if (m->hold_fd >= 0) close(m->hold_fd);
    m->events_fd = m->hold_fd = -1;
    if (m->fifo[0]) unlink(m->fifo);
}
