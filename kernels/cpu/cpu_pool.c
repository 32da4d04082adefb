/* cpu_pool.c — persistent worker threads for the CPU kernels (cpu_pool.h).
 *
 * Each worker owns a slot with a sequence number. To start a job the
 * caller publishes fn / arg / nt, sets `pending` to nt - 1 and bumps the
 * sequence of workers 1 .. nt-1 only; a worker seeing its sequence move
 * runs fn and decrements `pending`. Every wait (a worker for its next job,
 * the caller for the join, a thread at a barrier) spins for SPIN checks
 * and then sleeps on a futex, so an idle thread soon stops taking a core:
 * the bound matches the GOMP_SPINCOUNT the engine sets for OpenMP
 * (engine/main.c). A sleeper announces itself in a counter before it
 * sleeps and the waker reads that counter after its store (both seq_cst),
 * so a wake-up is either not needed or not lost, and the common case of a
 * waiter still spinning costs no system call.
 *
 * Library threading: workers set omp_set_num_threads(1) once, and the
 * caller sets it for the span of a job, so oneDNN's sgemm called in a
 * block runs on its calling thread as it does inside an OpenMP region;
 * OpenBLAS is single-threaded for the process (cpu_blas.c). */
#include "cpu_pool.h"
#include "cpu.h"

#include <limits.h>
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Checks a waiter makes before it sleeps (GOMP_SPINCOUNT's 10 000). */
#define SPIN 10000

typedef struct slot {
    _Alignas(64) atomic_int seq; /* bumped by the caller per job for this worker */
    atomic_int sleeping;         /* 1 while the worker sleeps on seq */
    cpu_pool *pool;
    int tid;
    pthread_t th;
} slot;

struct cpu_pool {
    int nw; /* workers (tids 1 .. nw) */
    slot *slots;
    cpu_job_fn fn;
    void *arg;
    int nt, stop;
    _Alignas(64) atomic_int pending; /* workers of this job not yet done */
    atomic_int join_sleeping;
    _Alignas(64) atomic_int bar_count, bar_gen, bar_sleepers;
};

/* The pool whose job this thread runs (NULL outside a job). */
static _Thread_local cpu_pool *t_pool;
static _Thread_local int t_in_job;

static void futex_wait(atomic_int *a, int val)
{
    syscall(SYS_futex, (int *)a, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(atomic_int *a, int n)
{
    syscall(SYS_futex, (int *)a, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Waits while *a == val: SPIN checks, then sleeps with *sleepers raised. */
static void wait_while(atomic_int *a, int val, atomic_int *sleepers)
{
    for (int i = 0; i < SPIN; i++) {
        if (atomic_load_explicit(a, memory_order_acquire) != val) return;
        relax();
    }
    atomic_fetch_add(sleepers, 1);
    while (atomic_load(a) == val)
        futex_wait(a, val);
    atomic_fetch_sub(sleepers, 1);
}

static void *worker(void *p)
{
    slot *s = p;
    cpu_pool *pool = s->pool;
    omp_set_num_threads(1);
    t_pool = pool;
    t_in_job = 1; /* a worker only ever runs jobs: its own calls run inline */
    int seen = 0;
    for (;;) {
        wait_while(&s->seq, seen, &s->sleeping);
        seen = atomic_load(&s->seq);
        if (pool->stop) return NULL;
        pool->fn(s->tid, pool->nt, pool->arg);
        if (atomic_fetch_sub(&pool->pending, 1) == 1 && atomic_load(&pool->join_sleeping))
            futex_wake(&pool->pending, 1);
    }
}

static cpu_pool *pool_start(int nw)
{
    cpu_pool *p = calloc(1, sizeof *p);
    slot *s = p ? aligned_alloc(64, (size_t)nw * sizeof *s) : NULL;
    if (!s) {
        free(p);
        return NULL;
    }
    p->slots = s;
    for (int i = 0; i < nw; i++) {
        atomic_init(&s[i].seq, 0);
        atomic_init(&s[i].sleeping, 0);
        s[i].pool = p;
        s[i].tid = i + 1;
        if (pthread_create(&s[i].th, NULL, worker, &s[i])) break;
        p->nw = i + 1;
    }
    return p;
}

/* Bumps a worker's sequence and wakes it if it sleeps. */
static void kick(slot *s)
{
    atomic_fetch_add(&s->seq, 1);
    if (atomic_load(&s->sleeping)) futex_wake(&s->seq, 1);
}

void cpu_pool_free(cpu_pool *p)
{
    if (!p) return;
    p->stop = 1;
    for (int i = 0; i < p->nw; i++)
        kick(&p->slots[i]);
    for (int i = 0; i < p->nw; i++)
        pthread_join(p->slots[i].th, NULL);
    free(p->slots);
    free(p);
}

/* c's pool, started on first use; NULL when no worker could start. */
static cpu_pool *ctx_pool(kn_ctx *c)
{
    cpu_state *st = c->impl;
    if (!st->pool && c->n_threads > 1) st->pool = pool_start(c->n_threads - 1);
    return st->pool;
}

static void run_inline(cpu_job_fn fn, void *arg)
{
    int was = t_in_job;
    t_in_job = 1;
    fn(0, 1, arg);
    t_in_job = was;
}

void cpu_pool_run(kn_ctx *c, int nt, cpu_job_fn fn, void *arg)
{
    cpu_pool *p = nt > 1 && !t_in_job ? ctx_pool(c) : NULL;
    if (p && nt > p->nw + 1) nt = p->nw + 1;
    if (!p || nt <= 1) {
        run_inline(fn, arg);
        return;
    }
    p->fn = fn, p->arg = arg, p->nt = nt;
    atomic_store(&p->pending, nt - 1);
    for (int i = 0; i < nt - 1; i++)
        kick(&p->slots[i]);
    int omp_nt = omp_get_max_threads();
    if (omp_nt != 1) omp_set_num_threads(1);
    t_pool = p;
    t_in_job = 1;
    fn(0, nt, arg);
    t_in_job = 0;
    t_pool = NULL;
    if (omp_nt != 1) omp_set_num_threads(omp_nt);
    for (int v; (v = atomic_load(&p->pending)) != 0;)
        wait_while(&p->pending, v, &p->join_sleeping);
}

void cpu_pool_barrier(int nt)
{
    cpu_pool *p = t_pool;
    if (nt <= 1 || !p) return;
    int gen = atomic_load(&p->bar_gen);
    if (atomic_fetch_add(&p->bar_count, 1) == nt - 1) {
        atomic_store(&p->bar_count, 0);
        atomic_fetch_add(&p->bar_gen, 1);
        if (atomic_load(&p->bar_sleepers)) futex_wake(&p->bar_gen, INT_MAX);
        return;
    }
    wait_while(&p->bar_gen, gen, &p->bar_sleepers);
}

void cpu_pool_static(size_t n, int tid, int nt, size_t *lo, size_t *hi)
{
    size_t q = n / (size_t)nt, r = n % (size_t)nt;
    if ((size_t)tid < r) {
        q++;
        r = 0;
    }
    *lo = q * (size_t)tid + r;
    *hi = *lo + q;
}

typedef struct for_job {
    size_t n;
    cpu_range_fn fn;
    void *arg;
} for_job;

static void for_body(int tid, int nt, void *a)
{
    const for_job *j = a;
    size_t lo, hi;
    cpu_pool_static(j->n, tid, nt, &lo, &hi);
    if (hi > lo) j->fn(lo, hi, j->arg);
}

void cpu_pool_for(kn_ctx *c, int nt, size_t n, cpu_range_fn fn, void *arg)
{
    if (!n) return;
    for_job j = {n, fn, arg};
    cpu_pool_run(c, nt, for_body, &j);
}
