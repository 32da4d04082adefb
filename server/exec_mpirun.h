/* exec_mpirun.h — a local job of several ranks, started as one mpirun.
 *
 * The local executor (exec_local.c) starts a one-rank job itself; for N > 1
 * ranks it calls this, and Open MPI's mpirun starts, wires up and tears
 * down the ranks (docs/engine.md, Ranks; docs/server.md). What the
 * executor gets back is mpirun's pid, leader of the job's process group
 * (the ranks join it), and the read end of the job's event FIFO. */
#ifndef TY_EXEC_MPIRUN_H
#define TY_EXEC_MPIRUN_H

#include <sys/types.h>

#include "executor.h"

typedef struct mpirun_job {
    pid_t pid;       /* mpirun, the process group leader */
    int events_fd;   /* FIFO read end, non-blocking */
    int hold_fd;     /* our own write end: no EOF before mpirun is reaped */
    char fifo[4200]; /* <jobdir>/events.fifo */
} mpirun_job;

/* Makes the FIFO, opens both ends, and spawns mpirun -np st->nranks with
 * the engine's arguments, its stdout/stderr on logfd. On failure nothing
 * is left open or running. */
int mpirun_start(srv *s, const exec_start *st, int logfd, int devnull, mpirun_job *m, ty_err *err);
/* To the job's group; SIGTERM becomes SIGUSR1 (mpirun answers SIGTERM by
 * killing its ranks a moment later; SIGUSR1 it ignores but forwards). */
void mpirun_signal(const mpirun_job *m, int sig);
/* After mpirun is reaped: drop our write end so reads reach EOF. */
void mpirun_ended(mpirun_job *m);
void mpirun_release(mpirun_job *m);

#endif
