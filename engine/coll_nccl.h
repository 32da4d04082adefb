/* coll_nccl.h — the gradient sum between GPU ranks over NCCL (coll.h's
 * device half; coll_mpi.c hands device buffers here once attached).
 *
 * libnccl.so.2 is opened at run time (like cuBLASLt in kernels/cuda), so a
 * CUDA build links and starts on machines without it; the header comes
 * from NVIDIA's pinned wheel (fetch-nccl.sh). Rank 0 makes the unique id
 * and MPI broadcasts it: no rendezvous file or port. */
#ifndef TY_COLL_NCCL_H
#define TY_COLL_NCCL_H

#include <stddef.h>

#include "tyerr.h"

typedef struct coll_nccl coll_nccl;

/* Collective over MPI_COMM_WORLD; device is the CUDA device this rank's
 * kernels run on (current on the calling thread). */
int coll_nccl_open(coll_nccl **out, int world, int rank, ty_err *err);
/* coll_reduce_f32 of device floats (coll.h): async starts it on the
 * buckets' stream, ordered after the work queued so far, and
 * coll_nccl_wait waits for all started; else it returns when the sums are
 * there. */
int coll_nccl_reduce(coll_nccl *n, float *buf, size_t lo, size_t hi, const size_t *off,
                     const size_t *len, int gather, int async, ty_err *err);
int coll_nccl_wait(coll_nccl *n, ty_err *err);
/* ZeRO-1's all-gather in place: rank k's piece is the `len[k]` elements
 * of `size` bytes at off[k] (ncclAllGather wants equal pieces: these are
 * one ncclBroadcast per rank in a group, on the legacy stream, waited for). */
int coll_nccl_allgather(coll_nccl *n, void *buf, size_t size, const size_t *off, const size_t *len,
                        int world, ty_err *err);
void coll_nccl_close(coll_nccl *n);

#endif
