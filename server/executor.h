/* executor.h — the seam between the scheduler and what runs a job's
 * engines: start them, read rank 0's events, signal them, learn they ended.
 *
 * The scheduler (sched.c) owns the job's life — its state transitions, its
 * events, pause/cancel intents, the grace timer, uploads — and never cares
 * where an engine runs. An executor owns only the engines, the way a
 * storage backend owns only bytes (storage/store_int.h):
 *
 *   local (exec_local.c)  posix_spawn on this machine, one process group per
 *                         job, events on rank 0's fd 3 (a pipe);
 *   slurm (exec_slurm.c)  one sbatch per job, srun starts the ranks on the
 *                         allocation, events in a file on the shared work
 *                         path that the server follows; squeue is polled.
 *
 * One table of functions per backend; each keeps its own per-job struct
 * behind exec_job (its first member). The scheduler thread is the only
 * caller except exec_signal, which API threads reach under the scheduler's
 * lock: it must not block for long (slurm hands it to its own thread). */
#ifndef TY_EXECUTOR_H
#define TY_EXECUTOR_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "jobspec.h"
#include "server.h"

struct jobspec;
typedef struct executor executor;
typedef struct exec_ops exec_ops;

/* One run's engines, as the backend knows them. */
typedef struct exec_job {
    const exec_ops *ops;
    int64_t job_id;
} exec_job;

/* What a start needs. */
typedef struct exec_start {
    int64_t job_id;
    int nranks;          /* local: engines on this machine (one per GPU, else 1) */
    const char *cuda;    /* local: CUDA_VISIBLE_DEVICES, "" on the CPU */
    const char *jobdir;  /* holds spec.json; the engine's --workdir */
    const char *resume;  /* checkpoint directory relative to jobdir, or NULL */
    const jobspec *spec; /* the job's: a cluster reads its resources */
} exec_start;

/* How a run's engines ended. */
typedef struct exec_end {
    int status;             /* rank 0's wait status (W_EXITCODE form for a cluster) */
    char how[200];          /* "exited with status 1", "was killed by signal 9 (Killed)" */
    char rank_failure[200]; /* the first failure of another rank, or "" */
    bool lost;              /* the cluster took the job away (node failure, preemption):
                               requeued from its newest committed checkpoint, not counted
                               as a restart */
} exec_end;

struct exec_ops {
    const char *name;
    /* A cluster queues and places jobs itself (the scheduler hands it every
     * queued job, holding no local GPUs or CPU slots), and its engines
     * outlive a server restart (they are re-attached, not stopped). */
    bool cluster;
    /* Refuses at submit a job this backend cannot run (admit.c, on an API
     * thread, so it reads no executor state): TY_EINVAL naming the spec
     * field. NULL: every job the spec parser took (a cluster checks the
     * rest itself when it places the job). */
    int (*check_job)(const srv_config *c, const struct jobspec *spec, ty_err *err);
    /* Starts the ranks. *fd gets a descriptor the scheduler polls for
     * events, or -1 to be asked every tick; *handle what the database keeps
     * to find the engines after a crash (local: the process group), or 0.
     * On failure nothing of the job is left running. */
    int (*start)(executor *e, const exec_start *st, exec_job **out, int *fd, int64_t *handle,
                 ty_err *err);
    /* Event bytes from rank 0: > 0 read, 0 nothing now, -1 no more ever
     * (the backend has closed its end). */
    ssize_t (*read)(executor *e, exec_job *j, char *buf, size_t cap);
    /* Stops reading events (a protocol violation, or the run is over). */
    void (*close_events)(executor *e, exec_job *j);
    /* SIGTERM: checkpoint and stop; SIGKILL: now. Never blocks for long. */
    void (*signal)(executor *e, exec_job *j, int sig);
    /* Reaps; true once every rank is gone, with *end filled. */
    bool (*ended)(executor *e, exec_job *j, exec_end *end);
    void (*release)(executor *e, exec_job *j);
    /* Recovery of the engines a previous server left (handle as stored). */
    /* Local: is that engine group still this job's? (pids are reused) */
    bool (*orphan_alive)(executor *e, int64_t job_id, int64_t handle);
    void (*orphan_signal)(executor *e, int64_t handle, int sig);
    /* Does any process of it still run (zombies do not count)? */
    bool (*orphan_running)(executor *e, int64_t handle);
    /* Cluster: the job's current attempt, still known to the cluster or
     * with events left to read, as a run again (*fd as for start); NULL
     * when there is none. */
    exec_job *(*reattach)(executor *e, int64_t job_id, int *fd);
    /* Server shutdown with the run left going (cluster): remember how far
     * its events were read. */
    void (*detach)(executor *e, exec_job *j);
    void (*close)(executor *e);
};

struct executor {
    const exec_ops *ops;
    srv *s;
    void *impl; /* backend state */
};

/* --executor: "local" or "slurm". */
int exec_open(srv *s, executor **out, ty_err *err);
void exec_close(executor *e);

int exec_local_open(srv *s, executor *e, ty_err *err);
int exec_slurm_open(srv *s, executor *e, ty_err *err);

/* The engine's environment (exec_local.c, shared by the backends): the
 * allow-listed part of ours (confine.c: no cloud credentials) minus the
 * variables we set, plus TY_ALLOWED_ROOTS and `extra` (NULL-terminated
 * "K=V" strings, copied). NULL-terminated; free with exec_env_free. */
char **exec_env_new(srv *s, const char *const *extra);
void exec_env_free(char **env);

/* "exited with status 1", "was killed by signal 9 (Killed)". */
void exec_describe_status(int st, char *out, size_t cap);

#endif
