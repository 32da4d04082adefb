/* cpu_pool.h — the persistent worker threads the CPU kernels share.
 *
 * A context's pool (cpu_pool.c) holds n_threads - 1 worker threads,
 * started on the first job that wants more than one thread and stopped by
 * kn_close. A job is fn(tid, nt, arg) run by nt threads: the caller as
 * tid 0 and workers 1 .. nt-1; cpu_pool_run returns once all are done.
 * A job issued from inside a job runs inline on the calling thread as
 * fn(0, 1, arg): jobs never nest. Library calls made inside a job (sgemm,
 * oneDNN) run single-threaded, as inside an OpenMP region.
 *
 * cpu_pool_static cuts [0, n) the way OpenMP's schedule(static) does, so
 * a kernel moved off `omp parallel for schedule(static)` gives every
 * thread the same rows and computes the same bits. */
#ifndef TY_KERNELS_CPU_POOL_H
#define TY_KERNELS_CPU_POOL_H

#include "backend.h"

#include <stddef.h>

typedef struct cpu_pool cpu_pool;
typedef void (*cpu_job_fn)(int tid, int nt, void *arg);
/* A static loop's body: items [lo, hi) of the loop, on one thread. */
typedef void (*cpu_range_fn)(size_t lo, size_t hi, void *arg);

/* fn(tid, nt, arg) on nt threads of c's pool (nt <= 1, or inside a job:
 * fn(0, 1, arg) here). */
void cpu_pool_run(kn_ctx *c, int nt, cpu_job_fn fn, void *arg);
/* `omp parallel for schedule(static) num_threads(nt)` over [0, n):
 * fn(lo, hi, arg) on each thread's share (nothing for an empty share). */
void cpu_pool_for(kn_ctx *c, int nt, size_t n, cpu_range_fn fn, void *arg);
/* Thread tid's share [*lo, *hi) of n items under schedule(static) with
 * nt threads: the first n % nt threads take one item more. */
void cpu_pool_static(size_t n, int tid, int nt, size_t *lo, size_t *hi);
/* Waits inside a job until all nt threads of the job have arrived. */
void cpu_pool_barrier(int nt);
/* Stops and frees a pool (NULL: nothing). */
void cpu_pool_free(cpu_pool *p);

#endif
