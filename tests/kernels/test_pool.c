/* test_pool.c — the CPU kernels' thread pool (kernels/cpu/cpu_pool.c).
 *
 * Checks that a job runs once on each of its nt threads (tids 0 .. nt-1,
 * the caller as 0), back to back and after the workers fell asleep; that
 * a job issued inside a job runs inline on its thread; that the barrier
 * holds every thread until all arrived; that a request for more threads
 * than the context has is cut to the context's; and that cpu_pool_static
 * cuts a loop exactly as libgomp's schedule(static) does, which is what
 * keeps the kernels' bits those of their OpenMP regions. */
#include "cpu/cpu.h"
#include "kernels.h"

#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "tyassert.h"

static kn_ctx *open_cpu(int threads)
{
    kn_ctx *c = NULL;
    ty_err err = {0};
    REQUIRE(kn_open(&c, KN_CPU, 0, threads, &err) == 0, "kn_open: %s", err.msg);
    return c;
}

typedef struct marks {
    atomic_int seen[8], nt_bad, caller_bad;
    pthread_t caller;
} marks;

static void mark(int tid, int nt, void *arg)
{
    marks *m = arg;
    atomic_fetch_add(&m->seen[tid], 1);
    if (nt != 2) atomic_fetch_add(&m->nt_bad, 1);
    if ((tid == 0) != pthread_equal(pthread_self(), m->caller)) atomic_fetch_add(&m->caller_bad, 1);
}

/* n jobs of 2 threads, pausing `gap_us` between them (0: back to back). */
static void jobs(kn_ctx *c, int n, int gap_us)
{
    marks m = {.caller = pthread_self()};
    for (int i = 0; i < n; i++) {
        cpu_pool_run(c, 2, mark, &m);
        if (gap_us) usleep((useconds_t)gap_us);
    }
    CHECK(m.seen[0] == n && m.seen[1] == n && m.seen[2] == 0, "%d %d %d of %d", (int)m.seen[0],
          (int)m.seen[1], (int)m.seen[2], n);
    CHECK(m.nt_bad == 0 && m.caller_bad == 0);
}

static void inner(int tid, int nt, void *arg)
{
    marks *m = arg;
    if (tid != 0 || nt != 1) atomic_fetch_add(&m->nt_bad, 1);
    if (!pthread_equal(pthread_self(), m->caller)) atomic_fetch_add(&m->caller_bad, 1);
}

typedef struct nest {
    kn_ctx *c;
    marks m[2];
} nest;

static void outer(int tid, int nt, void *arg)
{
    (void)nt;
    nest *n = arg;
    n->m[tid].caller = pthread_self();
    cpu_pool_run(n->c, 2, inner, &n->m[tid]);
}

static void nested(kn_ctx *c)
{
    nest n = {.c = c};
    cpu_pool_run(c, 2, outer, &n);
    for (int t = 0; t < 2; t++)
        CHECK(n.m[t].nt_bad == 0 && n.m[t].caller_bad == 0, "thread %d", t);
}

typedef struct phases {
    atomic_int arrived[64];
    atomic_int bad;
} phases;

/* Round r: each thread arrives, waits at the barrier, then must see both. */
static void phased(int tid, int nt, void *arg)
{
    phases *p = arg;
    for (int r = 0; r < 64; r++) {
        atomic_fetch_add(&p->arrived[r], 1);
        if (tid == 1 && r % 16 == 0) usleep(2000); /* the other thread sleeps */
        cpu_pool_barrier(nt);
        if (atomic_load(&p->arrived[r]) != nt) atomic_fetch_add(&p->bad, 1);
    }
}

static void barrier(kn_ctx *c)
{
    phases p = {0};
    cpu_pool_run(c, 2, phased, &p);
    CHECK(p.bad == 0, "%d rounds passed the barrier early", (int)p.bad);
}

static void count_nt(int tid, int nt, void *arg)
{
    (void)tid;
    atomic_int *most = arg;
    if (nt > atomic_load(most)) atomic_store(most, nt);
}

/* Every item's thread under OpenMP's schedule(static) and cpu_pool_static. */
static void same_cut(size_t n, int nt)
{
    int *owner = malloc((n ? n : 1) * sizeof *owner), bad = 0;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (size_t i = 0; i < n; i++)
        owner[i] = omp_get_thread_num();
    for (int t = 0; t < nt; t++) {
        size_t lo, hi;
        cpu_pool_static(n, t, nt, &lo, &hi);
        for (size_t i = lo; i < hi; i++)
            bad |= owner[i] != t;
        for (size_t i = 0; i < n; i++)
            bad |= owner[i] == t && (i < lo || i >= hi);
    }
    CHECK(!bad, "n %zu, %d threads", n, nt);
    free(owner);
}

int main(void)
{
    kn_ctx *c = open_cpu(2);
    jobs(c, 20000, 0);
    jobs(c, 20, 3000);
    nested(c);
    barrier(c);
    atomic_int most = 0;
    cpu_pool_run(c, 8, count_nt, &most);
    CHECK(most == 2, "a job asked for 8 threads ran on %d", (int)most);
    kn_close(c);
    kn_ctx *one = open_cpu(1);
    marks m = {.caller = pthread_self()};
    cpu_pool_run(one, 2, inner, &m);
    CHECK(m.nt_bad == 0 && m.caller_bad == 0, "a 1-thread context runs jobs inline");
    kn_close(one);
    size_t ns[] = {0, 1, 2, 3, 7, 64, 1000, 16385};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++)
        for (int nt = 1; nt <= 5; nt++)
            same_cut(ns[i], nt);
    return ty_summary("test_pool");
}
