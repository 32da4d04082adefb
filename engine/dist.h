/* dist.h — a rank's place in a data-parallel job (docs/engine.md, Ranks).
 *
 * dist_env reads world / rank / local rank from the environment (TY_*,
 * else Slurm's, else Open MPI's). dist_init starts MPI for world > 1 —
 * only when a launcher (mpirun, srun --mpi=pmix) started this process, so a
 * rank started alone fails at once rather than waiting for peers — and
 * checks that MPI agrees. dist_supervise handles TY_SUPERVISOR_PID when a
 * launcher sits between the server and us. dist_shard says which rows of a
 * step's global batch are this rank's, dist_cuts which floats of the
 * gradient buffer it owns. */
#ifndef TY_DIST_H
#define TY_DIST_H

#include "coll.h"
#include "tyerr.h"

typedef struct dist_env {
    int world, rank, local_rank;
} dist_env;

/* 0, or -1 with err set (a variable that is not a small non-negative
 * integer, or rank >= world). */
int dist_env_read(dist_env *d, ty_err *err);

/* World 1: *c = NULL and nothing else happens. World > 1: MPI_Init and an
 * MPI collective; errors (no launcher, MPI's size or rank differ) set err.
 * A build without MPI refuses world > 1. */
int dist_init(const dist_env *d, int *argc, char ***argv, coll **c, ty_err *err);
/* MPI_Finalize after a clean end (a failing rank exits without it, which
 * makes the launcher take the job down). */
void dist_finish(coll *c);

/* TY_SUPERVISOR_PID handling: returns 1 when supervised, 0 when not, -1
 * with err when the supervisor is gone. A direct child sets
 * PR_SET_PDEATHSIG = SIGTERM; a launcher's child (its parent's parent is
 * the supervisor, world > 1) joins the launcher's process group, sets
 * PR_SET_PDEATHSIG = SIGKILL and watches the supervisor (dist_supervisor_gone). */
int dist_supervise(const dist_env *d, ty_err *err);
/* 1 once a watched supervisor has exited (polled once per step). */
int dist_supervisor_gone(void);

/* Monotonic seconds, for the all-reduce share the engine logs. */
double dist_now(void);

/* The contiguous share of `rows` rows that rank takes: [*lo, *lo + *n). */
void dist_shard(int rows, int world, int rank, int *lo, int *n);
/* The cut of a flat buffer of n floats into one contiguous range per rank
 * (rank k: [off[k], off[k] + len[k])), on 16-float boundaries (64 bytes,
 * as every tensor view starts), the last taking the rest: ZeRO-1's shards
 * and the owners of the gradient sum (coll_reduce_f32), with ZeRO or not. */
void dist_cuts(size_t n, int world, size_t *off, size_t *len);

#endif
