/* zero.h — ZeRO-1 (`resources.zero: 1`): the optimizer state sharded over
 * the ranks (docs/engine.md, Ranks).
 *
 * The flat parameter buffer is cut into one contiguous range per rank
 * (dist_cuts). The gradient sum is a reduce-scatter (coll.h): each rank
 * receives the sums of its own range only, the same bits as the unsharded
 * all-reduce's, and the norm is combined from the ranges' partials in rank
 * order as the unsharded run combines them (train.c); each rank then
 * updates only its range with the AdamW moments it alone keeps, and the
 * ranges are all-gathered into the weights. With 16-bit storage the fp32 masters are sharded too: a rank
 * keeps the masters of its range only (bf16: the low halves of the split
 * masters, the bf16 high halves being the weights every rank has; fp16:
 * fp32 copies), updates them and all-gathers the 16-bit weights. In fp32
 * the parameters are the weights the forward reads, so they stay whole.
 * AdamW is elementwise, so the weights are bit-identical to the unsharded
 * run. A checkpoint gathers the moments and masters on rank 0 and has the
 * usual layout, so it resumes at any world size, sharded or not.
 *
 * The shards live where the model does (kernel-context memory); the
 * update's all-gather goes over NCCL between GPU ranks (one broadcast per
 * range), over MPI between CPU ranks; a checkpoint's gathers go through
 * host buffers and MPI on both. */
#ifndef TY_ZERO_H
#define TY_ZERO_H

#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "model.h"

typedef struct zero1 {
    int on, world, rank;
    size_t n;          /* floats in the flat buffer */
    size_t *off, *len; /* per rank: its range */
    float *m, *v;      /* this rank's moments, len[rank] floats */
    kn_dtype master;   /* KN_F32: params whole; KN_BF16: lo16; KN_F16: w32 */
    uint16_t *lo16;    /* bf16: the low halves of this rank's masters */
    float *w32;        /* fp16: this rank's fp32 masters */
} zero1;

/* After set-up (the model's full moments and masters loaded): keeps this
 * rank's range of them and frees the full buffers (m->m, m->v and, with
 * 16-bit storage, m->plo or m->params become NULL). */
int zero_shard(zero1 *z, model *m, int world, int rank, ty_err *err);
/* AdamW over this rank's range with hp (the gradient factors applied,
 * the gradient left as it is: the trainer zeroes it), then the weights
 * all-gathered. */
int zero_adamw(zero1 *z, model *m, coll *c, const kn_adamw_hp *hp, float wd, ty_err *err);
/* For a checkpoint or the export (every rank calls it): on rank 0 the
 * model's masters (m->plo / m->params) and, with moments set, m->m / m->v
 * are whole again until zero_unsave. */
int zero_gather(zero1 *z, model *m, coll *c, int moments, ty_err *err);
void zero_unsave(zero1 *z, model *m);
/* Bytes this rank keeps of the moments and of the masters. */
void zero_bytes(const zero1 *z, size_t *moments, size_t *masters);
void zero_free(zero1 *z, model *m);

#endif
