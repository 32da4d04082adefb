/* sched_run.c — one run of the scheduler (sched_int.h): making and
 * freeing it, the slots it holds, signalling its engines and closing its
 * event descriptor. The bottom of the scheduler's parts: it calls none of
 * them. */
#include "sched_int.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "tyutil.h"

void run_fetch_free(fetch *f)
{
    jobspec_free(&f->spec);
    free(f->resume);
    free(f->spec_text);
    fetch_handle_free(f->h);
    free(f);
}

/* A run's fetch thread, if any, must have been joined. */
void run_free(executor *ex, run *r)
{
    if (r->f) run_fetch_free(r->f);
    if (r->ej) ex->ops->release(ex, r->ej);
    free(r->line);
    free(r->error);
    free(r->fail_reason);
    free(r->stop_why);
    free(r->store);
    free(r);
}

void sched_set_str(char **dst, const char *fmt, ...)
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
void stop_run(sched *x, run *r, int sig)
{
    if (r->ej && !r->ended) {
        x->ex->ops->signal(x->ex, r->ej, sig);
        if (sig == SIGTERM) x->ex->ops->signal(x->ex, r->ej, SIGCONT);
    }
    if (sig == SIGTERM && !r->kill_at_ms) r->kill_at_ms = ty_mono_ms() + x->s->cfg.grace_s * 1000LL;
}

/* Stops reading the run's events (drained, or no longer trusted). */
void run_events_close(sched *x, run *r)
{
    if (r->fd >= 0) epoll_ctl(x->efd, EPOLL_CTL_DEL, r->fd, NULL);
    r->fd = -1;
    if (r->ev_open) x->ex->ops->close_events(x->ex, r->ej);
    r->ev_open = false;
}

/* A protocol violation: fail the job, stop reading, kill the engine now. */
void run_violation(sched *x, run *r, const char *why)
{
    sched_set_str(&r->fail_reason, "%s", why);
    run_events_close(x, r);
    stop_run(x, r, SIGKILL);
}

void run_release(sched *x, run *r)
{
    x->gpus_busy &= ~r->gpu_mask;
    x->cpu_busy -= r->cpu_slots;
    pthread_mutex_lock(&x->sample_mu);
    for (int i = 0; i < GPU_MAX; i++)
        if (r->gpu_mask & (1ull << i)) x->sample_job[i] = 0;
    pthread_mutex_unlock(&x->sample_mu);
}

/* Takes the run's GPUs or CPU slot and lists it (x->mu held). From here
 * until reap() or start_failed() the slot is the job's, downloads included. */
void run_hold(sched *x, run *r)
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

void run_unlist(sched *x, run *r)
{
    for (run **pp = &x->runs; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
}

/* A run has engines from here on: its events are read, through epoll
 * when the executor gives a descriptor. */
void run_attach(sched *x, run *r, exec_job *ej, int fd)
{
    r->ej = ej;
    r->ev_open = true;
    r->fd = fd;
    if (fd >= 0) {
        struct epoll_event ee = {.events = EPOLLIN, .data.ptr = r};
        epoll_ctl(x->efd, EPOLL_CTL_ADD, fd, &ee);
    }
}

run *run_new(sched *x, int64_t id)
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
