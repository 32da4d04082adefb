/* dist_bucket.h — the gradient sum in buckets, overlapped with the
 * backward pass (docs/engine.md, Ranks; resources.bucket_kb).
 *
 * The flat gradient buffer is cut, from its end, into buckets of about
 * bucket_kb KiB (contiguous ranges, 16-float aligned). The backward
 * completes the gradients from the end of the layout towards its start
 * (lm_head and the final norm, then the last layer down to the first, the
 * embeddings last), and tells the trainer so through the model's
 * grads_done hook: "everything from float `from` to the end is final for
 * this micro-batch". On the step's last micro-batch every bucket that lies
 * wholly at or above the frontier is started as a non-blocking sum
 * (coll_ireduce_f32: each rank's part of the bucket lands on it, the
 * summed parts all-gathered unless ZeRO-1 keeps the sums sharded), and the
 * started ones are driven (coll_progress) at each later call;
 * bucket_finish starts what is left and waits for all before the norm,
 * clipping and the optimizer.
 *
 * Each float is still summed once over the ranks, by its owner (coll.h):
 * over MPI in rank order, so the bits are the same whatever the bucketing,
 * with or without ZeRO-1. */
#ifndef TY_DIST_BUCKET_H
#define TY_DIST_BUCKET_H

#include <stddef.h>

#include "coll.h"
#include "tyerr.h"

typedef struct grad_buckets {
    coll *c;
    float *buf;
    size_t n;
    size_t *off, *len; /* per rank: the range it owns (dist_cuts) */
    int gather;        /* 0 with ZeRO-1: each rank keeps its range's sums only */
    size_t *lo;        /* bucket k: [lo[k], lo[k-1]) with lo[-1] = n; k = 0 is the last range */
    int nb;
    int next;               /* buckets [0, next) are started this step */
    long long early, total; /* buckets started during a backward / at all (the end log) */
    int err;                /* a failure inside the hook, reported by bucket_finish */
    ty_err first;           /* its reason */
    double comm_s;          /* seconds spent in collective calls (exposed communication) */
} grad_buckets;

/* Cuts buf[0, n) into buckets of at most bucket_kb KiB (at least 1); the
 * sums of a world of `world` ranks, all-gathered when gather is set. */
int bucket_init(grad_buckets *g, coll *c, float *buf, size_t n, int world, int bucket_kb,
                int gather, ty_err *err);
void bucket_free(grad_buckets *g);
/* The model's grads_done hook (ctx: the grad_buckets): gradients from
 * float `from` to the end are final. Starts what is ready, drives the rest. */
void bucket_ready(void *ctx, size_t from);
/* Starts every bucket not started, waits for all; the next step starts
 * afresh. Returns -1 with err on any collective failure of the step. */
int bucket_finish(grad_buckets *g, ty_err *err);

#endif
