/* zero.h — ZeRO-1 (`resources.zero: 1`): the AdamW moments sharded over
 * the ranks (docs/engine.md, Ranks).
 *
 * The flat parameter buffer is cut into one contiguous range per rank.
 * Every rank still sums the full gradient (the all-reduce) and computes
 * the same norm and clipping; then each updates only its range with the
 * moments it alone keeps, and the ranges are all-gathered into the
 * weights. AdamW is elementwise, so the weights are bit-identical to the
 * unsharded run. A checkpoint gathers the moments on rank 0 and has the
 * usual layout, so it resumes at any world size, sharded or not. */
#ifndef TY_ZERO_H
#define TY_ZERO_H

#include <stddef.h>

#include "coll.h"
#include "model.h"

typedef struct zero1 {
    int on, world, rank;
    size_t n;          /* floats in the flat buffer */
    size_t *off, *len; /* per rank: its range */
    float *m, *v;      /* this rank's moments, len[rank] floats */
} zero1;

/* After set-up (the model's full moments loaded or zero): keeps this
 * rank's range of them and frees the full buffers (m->m, m->v = NULL). */
int zero_shard(zero1 *z, model *m, int world, int rank, ty_err *err);
/* AdamW over this rank's range, then the weights all-gathered. */
int zero_adamw(zero1 *z, model *m, coll *c, float lr, float b1, float b2, float eps, float wd,
               long long t, ty_err *err);
/* For a checkpoint (every rank calls it): rank 0's m->m / m->v become the
 * full moments until zero_unsave. */
int zero_gather(zero1 *z, model *m, coll *c, ty_err *err);
void zero_unsave(zero1 *z, model *m);
void zero_free(zero1 *z, model *m);

#endif
