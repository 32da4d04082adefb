/* exec.h — GPU inventory, the scheduler and the local executor.
 *
 * The scheduler starts queued jobs in priority-then-FIFO order as GPUs (a
 * bitmap) or CPU slots free up; the executor runs each job as N engine
 * processes in one process group and supervises them: events from rank 0's
 * fd 3 become job events, exits become the transitions of DESIGN §2. A
 * start that must download first (fetch_prepare_start) does so on a fetch
 * thread of its own; pause and cancel abort that download. */
#ifndef TY_EXEC_H
#define TY_EXEC_H

#include "server.h"

#define GPU_MAX 64

/* ---- GPU inventory (gpu.c) ---------------------------------------------------- */

typedef struct gpu_inv gpu_inv;

/* spec: "auto" (NVML if it loads, else no GPUs), "none", or "0,1,...". */
int gpu_inv_open(const char *spec, gpu_inv **out, ty_err *err);
int gpu_inv_count(const gpu_inv *g);
/* Device index of slot i (the number CUDA_VISIBLE_DEVICES uses). */
int gpu_inv_index(const gpu_inv *g, int i);
/* Fresh readings of every GPU (zeros where NVML is not available);
 * job_id is left 0 for the caller to fill. Returns the count. */
int gpu_inv_sample(gpu_inv *g, srv_gpu_sample *out);
void gpu_inv_free(gpu_inv *g);

/* ---- scheduler + executor (sched.c) ------------------------------------------- */

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
/* Latest GPU samples with the holding job; returns the count. */
int sched_gpu_snapshot(sched *x, srv_gpu_sample *out);
/* Stops scheduling and shuts the engines down gracefully: SIGTERM to every
 * engine group, then up to the grace period for their final checkpoints,
 * which are recorded; each such job is requeued from it (no restart
 * counted). Engines still alive then are left to the next start. */
void sched_stop(sched *x);
void sched_free(sched *x);

/* ---- checkpoints on disk vs. the database (recovery.c) ------------------------- */

/* Makes the job's checkpoint rows agree with its directory (see recovery.c):
 * removes partial directories, adopts complete unknown ones (upload queued
 * with store), marks rows whose directory is gone deleted. *newest gets the
 * newest complete checkpoint's dir (malloc'd; local or committed remote) and
 * *newest_step its step, or NULL / -1. No engine of the job may be alive. */
int rec_reconcile(srv *s, int64_t job_id, const char *store, char **newest, int64_t *newest_step,
                  ty_err *err);
/* Reads dir/MANIFEST.json (its sha256 into sha, the step, the total bytes)
 * and with sums checks every listed file's size and sha256. */
int rec_manifest_check(const char *dir, bool sums, int64_t *step, char sha[65], uint64_t *bytes,
                       ty_err *err);
/* The step of "checkpoints/step-000123", or -1. */
int64_t rec_dir_step(const char *dir);

/* Below this much free space on the data directory's disk, submits are
 * refused with TY_ENOSPC (503): a job could not checkpoint anyway. */
#define SRV_MIN_FREE_BYTES (1024 * 1024)
int srv_disk_check(srv *s, ty_err *err);

#endif
