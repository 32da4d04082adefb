/* coll.h — the collectives data parallelism needs, behind one interface.
 *
 * MPI between CPU ranks (coll_mpi.c, Open MPI); between GPU ranks the
 * gradient sum goes over NCCL once coll_attach_nccl has been called
 * (coll_nccl.c, in a CUDA build; the unique id travels over MPI), while the
 * host scalars stay on MPI. The trainer calls
 * only these: per step one sum of the flat gradient buffer (in the kernel
 * context's memory: host on the CPU, device on a GPU) and two small sums of
 * host doubles. World 1 never opens a collective (coll is NULL and every
 * call is a no-op), so a single-rank run needs no MPI at all.
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
/* GPU ranks: device buffers (coll_sum_f32) go over NCCL from now on.
 * Fails clearly in a build without NCCL or where libnccl cannot load. */
int coll_attach_nccl(coll *c, ty_err *err);
void coll_close(coll *c);
const char *coll_name(const coll *c); /* "mpi" | "nccl" */

/* Sums n floats in place over all ranks (buf: kernel-context memory). */
int coll_sum_f32(coll *c, float *buf, size_t n, ty_err *err);
/* The bucketed, overlapped gradient sum (dist_bucket.h): coll_isum_f32
 * starts an in-place sum of n floats and returns at once; coll_progress
 * lets the started sums advance (MPI_Testall: Open MPI moves a
 * non-blocking collective only inside MPI calls) and never blocks;
 * coll_wait returns when every started sum is complete. The buffer must
 * not be written until then. On NCCL the sum runs on a second stream
 * after an event on the kernels' work, so the backward keeps computing. */
int coll_isum_f32(coll *c, float *buf, size_t n, ty_err *err);
int coll_progress(coll *c, ty_err *err);
int coll_wait(coll *c, ty_err *err);
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
