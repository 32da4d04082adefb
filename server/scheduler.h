/* scheduler.h — the scheduler and supervisor (sched.c). Not "sched.h":
 * server/ is on the include path, where that name would hide the C
 * library's <sched.h> from pthread.h.
 *
 * The scheduler starts queued jobs in priority-then-FIFO order as GPUs (a
 * bitmap) or CPU slots free up, and supervises each job's engine ranks
 * through an executor (executor.h): events from rank 0's fd 3 become job
 * events, exits become the transitions of DESIGN §2. A start that must
 * download first (fetch.h) does so on a fetch thread of its own; pause and
 * cancel abort that download. */
#ifndef TY_SCHEDULER_H
#define TY_SCHEDULER_H

#include "server.h"

typedef struct sched sched;

/* Settles the jobs a previous server left starting/running/stopping (queued
 * again, or their recorded intent) and signals their orphaned engines, so
 * the API never shows them running without an engine; then starts the
 * scheduling thread (which waits once for those engines, reconciles their
 * checkpoints and lets them start again) and the GPU sampling thread. */
sched *sched_new(srv *s, ty_err *err);
/* Something changed (submit, resume): schedule now. */
void sched_wake(sched *x);
/* API actions; TY_ENOENT / TY_ESTATE with a message for the client. A job
 * recovery has not reached yet is queued: cancel ends it at once, pause is
 * accepted and lands when recovery reaches it. */
int sched_cancel(sched *x, int64_t id, ty_err *err);
int sched_pause(sched *x, int64_t id, ty_err *err);
int sched_resume(sched *x, int64_t id, ty_err *err);
/* How many GPUs the server schedules. */
int sched_gpu_count(sched *x);
/* The most GPUs a job may ask for: the server's own, or (a cluster
 * executor) per node, which only the cluster can check. */
int sched_job_gpu_limit(sched *x);
/* The executor's table: its abilities, read at submit (admit.c). */
const struct exec_ops *sched_exec_ops(sched *x);
/* GPUs and CPU slots free right now (GET /queue). */
void sched_capacity(sched *x, int *gpus_free, int *cpu_free);
/* Latest GPU samples with the holding job; returns the count. */
int sched_gpu_snapshot(sched *x, srv_gpu_sample *out);
/* Stops scheduling and shuts the engines down gracefully: SIGTERM to every
 * engine group, then up to the grace period for their final checkpoints,
 * which are recorded; each such job is requeued from it (no restart
 * counted). Engines still alive then are left to the next start. */
void sched_stop(sched *x);
void sched_free(sched *x);

#endif
