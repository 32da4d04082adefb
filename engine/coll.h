/* coll.h — the collectives data parallelism needs, behind one interface.
 *
 * MPI between CPU ranks (coll_mpi.c, Open MPI); between GPU ranks the
 * gradient sum goes over NCCL once coll_attach_nccl has been called
 * (coll_nccl.c, in a CUDA build; the unique id travels over MPI), while the
 * host scalars stay on MPI. The trainer calls only these: per step one sum
 * of the flat gradient buffer (in the kernel context's memory: host on the
 * CPU, device on a GPU) and two small sums of host doubles. World 1 never
 * opens a collective (coll is NULL and every call is a no-op), so a
 * single-rank run needs no MPI at all.
 *
 * The gradient sum is a reduce-scatter: each float has an owner (the rank
 * whose range of dist_cuts holds it), the owner receives every rank's
 * value of it and adds them, and then, unless ZeRO-1 keeps the sums
 * sharded, every rank's summed range is all-gathered. The all-reduce
 * without ZeRO-1 is that same reduce-scatter followed by the all-gather, so
 * a float is summed by the same calls either way and has the same bits
 * with and without ZeRO-1. Over MPI the owner adds in rank order,
 * ((g0 + g1) + g2) + ..., whatever the bucketing or the message size
 * (MPI_Alltoallv of the pieces, the sum on the owner: MPI_Reduce_scatter
 * and MPI_Allreduce may each pick an algorithm by size, and their orders
 * differ); over NCCL the order is NCCL's ring for the owner as root
 * (coll_nccl.c).
 *
 * Every call is collective: all ranks make the same calls in the same
 * order. A failure is reported once with the reason; the caller exits
 * non-zero and the launcher takes the other ranks down. */
#ifndef TY_COLL_H
#define TY_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "tyerr.h"

typedef struct coll coll;

/* After the MPI world exists (dist_init): world and rank are MPI's. */
int coll_open_mpi(coll **out, ty_err *err);
/* GPU ranks: device buffers (the gradient sum, ZeRO-1's all-gather) go
 * over NCCL from now on.
 * Fails clearly in a build without NCCL or where libnccl cannot load. */
int coll_attach_nccl(coll *c, ty_err *err);
void coll_close(coll *c);
const char *coll_name(const coll *c); /* "mpi" | "nccl" */

/* The gradient sum of buf[lo, hi) over the ranks (buf: kernel-context
 * memory, the whole flat buffer; off / len: its dist_cuts). Rank k ends
 * with the sums of [lo, hi) within its range [off[k], off[k] + len[k]);
 * with gather every rank ends with all of [lo, hi) summed; without, the
 * rest of [lo, hi) is left as this rank's own values. */
int coll_reduce_f32(coll *c, float *buf, size_t lo, size_t hi, const size_t *off, const size_t *len,
                    int gather, ty_err *err);
/* The part of [lo, hi) within the range [off, off + len): [*a, *b),
 * empty when *a == *b. */
static inline void coll_part(size_t lo, size_t hi, size_t off, size_t len, size_t *a, size_t *b)
{
    *a = off > lo ? off : lo;
    *b = off + len < hi ? off + len : hi;
    if (*b < *a) *b = *a;
}
/* The all-reduce: coll_reduce_f32 of buf[0, n) under dist_cuts(n), gathered. */
int coll_sum_f32(coll *c, float *buf, size_t n, ty_err *err);
/* The bucketed, overlapped gradient sum (dist_bucket.h): coll_ireduce_f32
 * starts coll_reduce_f32's sum and returns at once; coll_progress lets
 * the started sums advance (MPI_Testall: Open MPI moves a non-blocking
 * collective only inside MPI calls; an owner adds its pieces and starts the
 * all-gather as they arrive) and never blocks; coll_wait returns when
 * every started sum is complete. The buffer must not be written until then.
 * On NCCL the sum runs on a second stream after an event on the kernels'
 * work, so the backward keeps computing. */
int coll_ireduce_f32(coll *c, float *buf, size_t lo, size_t hi, const size_t *off,
                     const size_t *len, int gather, ty_err *err);
int coll_progress(coll *c, ty_err *err);
int coll_wait(coll *c, ty_err *err);
/* Bytes of other ranks' gradients this rank received in the gradient sums
 * since the last call (the reduce-scatter's pieces of its range, and the
 * all-gather's other ranges): about 4 n (N - 1) / N a step with ZeRO-1,
 * twice that without. 0 for world 1. */
size_t coll_take_bytes(coll *c);
/* Sums n host doubles in place over all ranks. */
int coll_sum_f64(coll *c, double *buf, int n, ty_err *err);
/* Gathers equal-or-unequal contiguous pieces: rank k contributes
 * buf[off[k], off[k] + len[k]) and every rank ends with all of buf
 * (kernel-context memory: over NCCL once attached). */
int coll_allgather_f32(coll *c, float *buf, const size_t *off, const size_t *len, ty_err *err);
/* Rank k's piece (mine, len[k] floats) lands at full + off[k] on rank 0
 * (full is read only there). Host memory, over MPI. */
int coll_gather_f32(coll *c, float *full, const float *mine, const size_t *off, const size_t *len,
                    ty_err *err);
/* The same for 16-bit elements (ZeRO-1's 16-bit weights and the low
 * halves of split bf16 masters: bits, never converted). */
int coll_allgather_u16(coll *c, uint16_t *buf, const size_t *off, const size_t *len, ty_err *err);
int coll_gather_u16(coll *c, uint16_t *full, const uint16_t *mine, const size_t *off,
                    const size_t *len, ty_err *err);
int coll_barrier(coll *c, ty_err *err);

#endif
