/* dist.c — rank discovery, MPI start-up and supervision under a launcher
 * (see dist.h and docs/engine.md, Ranks). */
#include "dist.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#ifdef TY_HAVE_MPI
#include <mpi.h>
#endif
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

static int pidfd_sup = -1; /* the watched supervisor, or -1 */

/* The first set variable of the list, as a non-negative int; def if none. */
static int env_int(const char *const *names, int def, int *ok, const char **which)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (!v || !*v) continue;
        char *end;
        long x = strtol(v, &end, 10);
        *which = *names;
        if (*end || x < 0 || x > 1000000) {
            *ok = 0;
            return def;
        }
        return (int)x;
    }
    return def;
}

int dist_env_read(dist_env *d, ty_err *err)
{
    static const char *const W[] = {"TY_WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", NULL};
    static const char *const R[] = {"TY_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", NULL};
    static const char *const L[] = {"TY_LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK",
                                    NULL};
    int ok = 1;
    const char *wn = "TY_WORLD_SIZE", *rn = "TY_RANK", *ln = "TY_LOCAL_RANK";
    d->world = env_int(W, 1, &ok, &wn);
    d->rank = env_int(R, 0, &ok, &rn);
    d->local_rank = env_int(L, 0, &ok, &ln);
    if (!ok || d->world < 1 || d->rank >= d->world)
        return ty_err_set(err, TY_EINVAL,
                          "bad rank environment: %s / %s / %s must be integers with rank < world "
                          "(world %d, rank %d)",
                          wn, rn, ln, d->world, d->rank);
    return 0;
}

int dist_init(const dist_env *d, int *argc, char ***argv, coll **c, ty_err *err)
{
    *c = NULL;
    if (d->world == 1) return 0;
#ifndef TY_HAVE_MPI
    (void)argc;
    (void)argv;
    return ty_err_set(
        err, TY_EINVAL,
        "world size %d: this engine was built without MPI (multi-rank training needs Open MPI)",
        d->world);
#else
    /* A launcher leaves its mark; without one MPI_Init would make a world
     * of one (or try to start a daemon) and the peers would wait forever. */
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK") && !getenv("PMI_RANK"))
        return ty_err_set(
            err, TY_EINVAL,
            "world size %d but no MPI launcher started this rank: start the ranks with mpirun or "
            "srun --mpi=pmix (docs/engine.md, Ranks)",
            d->world);
#ifdef __SANITIZE_ADDRESS__
    /* Open MPI loses small allocations in its start-up and shutdown
     * (threads of its own, unloaded components: no frames to name in a
     * suppression). The leak check runs now, before MPI exists, and not at
     * exit; the same trainer code is leak-checked by every world-1 test. */
    __lsan_do_leak_check();
#endif
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return ty_err_set(err, TY_EIO, "world size %d: MPI_Init failed", d->world);
    int size = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (size != d->world || rank != d->rank)
        return ty_err_set(err, TY_EINVAL,
                          "world size %d, rank %d from the environment, but MPI's world has %d "
                          "ranks and this is rank %d",
                          d->world, d->rank, size, rank);
    return coll_open_mpi(c, err);
#endif
}

void dist_finish(coll *c)
{
#ifdef TY_HAVE_MPI
    if (c) {
        coll_close(c);
        MPI_Finalize();
    }
#else
    (void)c;
#endif
}

/* The parent pid of process pid, from /proc (field 4 of stat). */
static long parent_of(long pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    long ppid = -1;
    if (!p || sscanf(p + 1, " %*c %ld", &ppid) != 1) return -1;
    return ppid;
}

int dist_supervise(const dist_env *d, ty_err *err)
{
    const char *sup = getenv("TY_SUPERVISOR_PID");
    if (!sup || !*sup) return 0;
    long want = strtol(sup, NULL, 10);
    /* The server's death is SIGTERM: checkpoint and stop. The server may
     * have died before the prctl, so the parent is checked after it. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    long parent = (long)getppid();
    if (parent == want) return 1;
    if (d->world > 1 && parent_of(parent) == want) {
        /* Under mpirun: a dead launcher is a dead job; one SIGKILL to the
         * launcher's group must reach us (Open MPI puts each rank in a
         * group of its own); the server is watched through a pidfd. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            return ty_err_set(err, TY_EIO, "the launcher that started this engine is gone");
        if (setpgid(0, getpgid(parent)) != 0)
            return ty_err_set(err, TY_EIO, "joining the launcher's process group: %s",
                              strerror(errno));
        pidfd_sup = (int)syscall(SYS_pidfd_open, (pid_t)want, 0);
        if (pidfd_sup < 0 || parent_of(parent) != want)
            return ty_err_set(err, TY_EIO,
                              "the server that started this engine is gone; not starting");
        return 1;
    }
    return ty_err_set(err, TY_EIO, "the server that started this engine is gone; not starting");
}

int dist_supervisor_gone(void)
{
    if (pidfd_sup < 0) return 0;
    struct pollfd p = {.fd = pidfd_sup, .events = POLLIN};
    return poll(&p, 1, 0) == 1;
}

void dist_shard(int rows, int world, int rank, int *lo, int *n)
{
    *lo = (int)((long long)rows * rank / world);
    *n = (int)((long long)rows * (rank + 1) / world) - *lo;
}

void dist_cuts(size_t n, int world, size_t *off, size_t *len)
{
    for (int k = 0; k <= world; k++) {
        size_t cut = k == world ? n : (n * (size_t)k / (size_t)world) / 16 * 16;
        if (k < world) off[k] = cut;
        if (k > 0) len[k - 1] = cut - off[k - 1];
    }
}

double dist_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
