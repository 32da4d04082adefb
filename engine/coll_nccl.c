/* coll_nccl.c — NCCL between GPU ranks (see coll_nccl.h).
 *
 * The gradient sum of a range is one ncclReduce per rank's part of it, to
 * that rank (its owner, coll.h), in one group, then without ZeRO-1 one
 * ncclBroadcast of each summed part from its owner, in a second group.
 * ncclReduceScatter / ncclAllGather want equal parts at fixed places: the
 * parts are cut on 16-float boundaries (the last rank takes the rest) and
 * a bucket cuts them again into unequal pieces, and padding them would copy
 * the buffer; grouped, per-owner calls take the parts where they lie. A
 * float is then summed by the same ncclReduce, root and count with ZeRO-1
 * and without, so it has the same bits either way (NCCL's ring order for
 * that root, fixed for a communicator). Each rank sends about its whole
 * buffer once (a ring reduce forwards every part), against n (N - 1) / N
 * for an equal-parts reduce-scatter.
 *
 * A blocking sum is enqueued on the legacy default stream, which orders
 * itself after the kernels' own (blocking) stream, and waited for before
 * returning, so the caller sees a finished sum exactly as with MPI.
 *
 * The gradient buckets go on a second, non-blocking stream instead: an
 * event recorded on the legacy stream marks the point where the bucket's
 * gradients are final (it completes after all earlier work of the
 * kernels' blocking stream), the comm stream waits for it and runs the
 * sum while the backward continues on the kernels' stream; coll_nccl_wait
 * synchronises the comm stream before the optimizer. */
#include "coll_nccl.h"

#include <dlfcn.h>
#include <mpi.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "coll.h"

struct coll_nccl {
    int world;
    void *lib;
    ncclComm_t comm;
    cudaStream_t side; /* the buckets' stream, made at the first bucket */
    cudaEvent_t ready;
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
                           ncclComm_t, cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*destroy)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
};

static int nccl_fail(coll_nccl *n, ty_err *err, const char *what, ncclResult_t r)
{
    return ty_err_set(err, TY_EIO, "%s: %s", what,
                      n->error_string ? n->error_string(r) : "NCCL error");
}

int coll_nccl_open(coll_nccl **out, int world, int rank, ty_err *err)
{
    coll_nccl *n = calloc(1, sizeof *n);
    if (!n) return ty_err_set(err, TY_ENOMEM, "out of memory");
    n->world = world;
    /* TY_NCCL names the library; else the build tree's copy (fetched on
     * a GPU machine), else the loader's search path. */
    const char *env = getenv("TY_NCCL");
    const char *tries[] = {env && *env ? env : NULL, TY_NCCL_BUILD_DIR "/libnccl.so.2",
                           "libnccl.so.2"};
    for (size_t i = 0; i < sizeof tries / sizeof *tries && !n->lib; i++)
        if (tries[i]) n->lib = dlopen(tries[i], RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) {
        free(n);
        return ty_err_set(err, TY_EINVAL,
                          "multi-rank GPU training needs libnccl.so.2 (TY_NCCL, or "
                          "pip's nvidia-nccl-cu13): %s",
                          dlerror());
    }
    *(void **)&n->get_unique_id = dlsym(n->lib, "ncclGetUniqueId");
    *(void **)&n->init_rank = dlsym(n->lib, "ncclCommInitRank");
    *(void **)&n->reduce = dlsym(n->lib, "ncclReduce");
    *(void **)&n->broadcast = dlsym(n->lib, "ncclBroadcast");
    *(void **)&n->group_start = dlsym(n->lib, "ncclGroupStart");
    *(void **)&n->group_end = dlsym(n->lib, "ncclGroupEnd");
    *(void **)&n->destroy = dlsym(n->lib, "ncclCommDestroy");
    *(void **)&n->error_string = dlsym(n->lib, "ncclGetErrorString");
    if (!n->get_unique_id || !n->init_rank || !n->reduce || !n->broadcast || !n->group_start ||
        !n->group_end || !n->destroy || !n->error_string) {
        dlclose(n->lib);
        free(n);
        return ty_err_set(err, TY_EINVAL, "libnccl.so.2 lacks the functions this engine calls");
    }
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = ncclSuccess;
    if (rank == 0) r = n->get_unique_id(&id);
    /* Every rank learns whether rank 0 made one, then the id itself. */
    int ok = r == ncclSuccess;
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok) {
        int rc = nccl_fail(n, err, "ncclGetUniqueId on rank 0", r);
        coll_nccl_close(n);
        return rc;
    }
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    if ((r = n->init_rank(&n->comm, world, id, rank)) != ncclSuccess) {
        int rc = nccl_fail(n, err, "ncclCommInitRank", r);
        n->comm = NULL;
        coll_nccl_close(n);
        return rc;
    }
    *out = n;
    return 0;
}

/* The buckets' stream, ordered after everything the backward has queued
 * on the legacy stream. */
static int side_stream(coll_nccl *n, cudaStream_t *st, ty_err *err)
{
    cudaError_t e = cudaSuccess;
    if (!n->side && ((e = cudaStreamCreateWithFlags(&n->side, cudaStreamNonBlocking)) ||
                     (e = cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming))))
        return ty_err_set(err, TY_EIO, "the gradient buckets' CUDA stream: %s",
                          cudaGetErrorString(e));
    if ((e = cudaEventRecord(n->ready, (cudaStream_t)0)) ||
        (e = cudaStreamWaitEvent(n->side, n->ready, 0)))
        return ty_err_set(err, TY_EIO, "a gradient bucket's event: %s", cudaGetErrorString(e));
    *st = n->side;
    return 0;
}

/* One group: each rank's part of [lo, hi) reduced to it (bcast 0) or
 * broadcast from it (bcast 1), in place. */
static ncclResult_t by_owner(coll_nccl *n, float *buf, size_t lo, size_t hi, const size_t *off,
                             const size_t *len, int bcast, cudaStream_t st)
{
    ncclResult_t r = n->group_start();
    for (int k = 0; k < n->world && r == ncclSuccess; k++) {
        size_t a, b;
        coll_part(lo, hi, off[k], len[k], &a, &b);
        if (a == b) continue;
        r = bcast ? n->broadcast(buf + a, buf + a, b - a, ncclFloat32, k, n->comm, st)
                  : n->reduce(buf + a, buf + a, b - a, ncclFloat32, ncclSum, k, n->comm, st);
    }
    ncclResult_t r2 = n->group_end();
    return r == ncclSuccess ? r2 : r;
}

int coll_nccl_reduce(coll_nccl *n, float *buf, size_t lo, size_t hi, const size_t *off,
                     const size_t *len, int gather, int async, ty_err *err)
{
    cudaStream_t st = (cudaStream_t)0;
    if (async && side_stream(n, &st, err)) return -1;
    ncclResult_t r = by_owner(n, buf, lo, hi, off, len, 0, st);
    if (r == ncclSuccess && gather) r = by_owner(n, buf, lo, hi, off, len, 1, st);
    if (r != ncclSuccess) return nccl_fail(n, err, "ncclReduce of the gradients", r);
    cudaError_t e = async ? cudaSuccess : cudaStreamSynchronize(st);
    if (e != cudaSuccess)
        return ty_err_set(err, TY_EIO, "ncclReduce of the gradients: %s", cudaGetErrorString(e));
    return 0;
}

int coll_nccl_wait(coll_nccl *n, ty_err *err)
{
    if (!n->side) return 0;
    cudaError_t e = cudaStreamSynchronize(n->side);
    if (e != cudaSuccess)
        return ty_err_set(err, TY_EIO, "the gradient buckets' sums: %s", cudaGetErrorString(e));
    return 0;
}

int coll_nccl_allgather(coll_nccl *n, void *buf, size_t size, const size_t *off, const size_t *len,
                        int world, ty_err *err)
{
    /* Rank k broadcasts its piece in place; one group, so NCCL runs the
     * world's broadcasts together. Bytes: the pieces are bits, never
     * converted. */
    char *b = buf;
    ncclResult_t r = n->group_start();
    for (int k = 0; k < world && r == ncclSuccess; k++)
        r = n->broadcast(b + off[k] * size, b + off[k] * size, len[k] * size, ncclUint8, k, n->comm,
                         (cudaStream_t)0);
    ncclResult_t r2 = n->group_end();
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) return nccl_fail(n, err, "ncclBroadcast of the ZeRO-1 weights", r);
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)0);
    if (e != cudaSuccess)
        return ty_err_set(err, TY_EIO, "ncclBroadcast of the ZeRO-1 weights: %s",
                          cudaGetErrorString(e));
    return 0;
}

void coll_nccl_close(coll_nccl *n)
{
    if (!n) return;
    if (n->ready) cudaEventDestroy(n->ready);
    if (n->side) cudaStreamDestroy(n->side);
    if (n->comm) n->destroy(n->comm);
    if (n->lib) dlclose(n->lib);
    free(n);
}
