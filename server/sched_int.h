/* sched_int.h — the scheduler's parts and what they share (not for use
 * outside them; the API is scheduler.h). Dependencies run one way:
 *
 *   sched.c       the loop, scheduling, the API actions, start and stop
 *     launch.c    starting a job: its resume point, downloads, the engine
 *     recovery.c  what a previous server left live (recover_mark/finish)
 *     settle.c    a run's end: its outcome and final transition, retried
 *     enginepipe.c  rank 0's event lines
 *     gpu.c       the GPU sampler thread
 *   sched_run.c   one run's slot, signals and event descriptor
 *
 * Every part but the sampler runs on the scheduler thread or under x->mu. */
#ifndef TY_SCHED_INT_H
#define TY_SCHED_INT_H

#include <stdatomic.h>

#include "executor.h"
#include "fetch.h"
#include "gpu.h"
#include "scheduler.h"

#define LINE_MAX_BYTES (64 * 1024) /* longest engine event line */

/* A start's downloads on their own thread (fetch_main). */
typedef struct fetch {
    struct sched *x;
    int64_t job_id;
    jobspec spec;    /* the job's spec, parsed (owned) */
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
    int restarts;   /* new value, or -1 to leave it */
    bool has_then;  /* a cancel or pause asked meanwhile: to → then once to lands */
    bool to_landed; /* to is written; only then is left */
    job_state then;
    char *store;
    char reason[1100];
    int64_t next_ms;
    int tries;
    struct pending *next;
} pending;

/* A job a previous server left live, between the two halves of recovery
 * (sched_recover_mark before the API serves, sched_recover_finish on the scheduler
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

/* ---- one run (sched_run.c) ---------------------------------------------------------------- */

run *run_new(sched *x, int64_t id);
/* A run's fetch thread, if any, must have been joined. */
void run_free(executor *ex, run *r);
void run_fetch_free(fetch *f);
/* Sets *dst unless already set: the first reason wins. */
void sched_set_str(char **dst, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void stop_run(sched *x, run *r, int sig);
void run_events_close(sched *x, run *r);
void run_violation(sched *x, run *r, const char *why);
void run_hold(sched *x, run *r);
void run_release(sched *x, run *r);
void run_unlist(sched *x, run *r);
void run_attach(sched *x, run *r, exec_job *ej, int fd);

/* ---- the parts ------------------------------------------------------------------------------ */

/* Reads what rank 0 wrote, up to a budget per wake-up (enginepipe.c). */
void run_read_pipe(sched *x, run *r);
/* launch.c */
void sched_start_job(sched *x, int64_t id, uint64_t gpu_mask, int cpu_slots);
void sched_collect_fetches(sched *x);
/* settle.c */
char *sched_job_store(srv *s, int64_t id);
void sched_settle(sched *x, int64_t job_id, job_state to, int restarts, const char *store,
                  const char *reason);
/* The same transition queued for sched_check_pending without trying it now
 * (recovery on a read-only start); the API shows it at once (overlay.h). */
void sched_settle_later(sched *x, int64_t job_id, job_state to, int restarts, const char *store,
                        const char *reason);
void sched_finalize(sched *x, int64_t job_id, job_state to, const char *reason);
void sched_finish_run(sched *x, run *r);
void sched_check_pending(sched *x);
void sched_check_waiters(sched *x);
/* recovery.c */
void sched_recover_mark(sched *x);
void sched_recover_finish(sched *x);
/* gpu.c: the sampling thread's body (arg: the sched). */
void *sched_sampler_main(void *arg);

#endif
