/* coll_mpi.c — the collectives between CPU ranks over MPI (coll.h).
 *
 * The gradient sum is this file's own reduce-scatter: MPI_Ialltoallv
 * sends each rank's piece of every range to the range's owner, and the
 * owner adds the world's pieces in rank order, so a float's sum has the
 * same bits whatever the message sizes, the bucketing or ZeRO-1 (Open
 * MPI's MPI_Allreduce and MPI_Reduce_scatter pick algorithms by size and
 * add in orders of their own). Without ZeRO-1 an MPI_Iallgatherv of the
 * summed ranges follows. The pieces go on one duplicate of MPI_COMM_WORLD
 * and the all-gathers on another: a sum's all-gather starts when its
 * pieces have arrived, which is sooner on one rank than on another, so it
 * may not share a communicator's order with the next bucket's exchange;
 * on its own every rank starts them in the sums' order. A blocking sum
 * goes in chunks of 2^24 floats (its owner's pieces are a transient
 * buffer of that size); the other calls are plain blocking MPI on
 * MPI_COMM_WORLD, in chunks of MPI's int counts where they need it. */
#include "coll.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"

#ifdef TY_HAVE_NCCL
#include "coll_nccl.h"
#endif

/* One started gradient sum of buf[lo, hi): every rank's piece of this
 * rank's part arrives (SUM_EXCHANGE), the pieces are added in rank order,
 * then with gather the summed parts are all-gathered (SUM_GATHER). */
enum { SUM_EXCHANGE, SUM_GATHER, SUM_DONE };
typedef struct sum_op {
    MPI_Request req;
    float *base;       /* buf + lo */
    float *parts;      /* the world's pieces of this rank's part: rank i's at i * m */
    size_t mine, m;    /* this rank's part: base[mine, mine + m) */
    int *cnt, *dis;    /* per rank: its part of [lo, hi), from lo */
    int *rcnt, *rdis;  /* m floats from each rank, at i * m */
    int gather, stage; /* stage: SUM_* */
} sum_op;

struct coll {
    int world, rank;
    MPI_Comm xc, gc; /* the sums' exchanges, their all-gathers */
    sum_op *op;      /* started sums (coll_ireduce_f32), in order */
    int nop, capop;
    size_t rx; /* coll_take_bytes */
#ifdef TY_HAVE_NCCL
    coll_nccl *dev; /* GPU ranks: the gradient sum, its buckets, ZeRO-1's all-gather */
#endif
};

#define CHUNK ((size_t)1 << 30)
#define SUM_CHUNK ((size_t)1 << 24)

static int mpi_fail(ty_err *err, const char *what, int rc)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return ty_err_set(err, TY_EIO, "%s: %s", what, msg);
}

int coll_open_mpi(coll **out, ty_err *err)
{
    coll *c = calloc(1, sizeof *c);
    if (!c) return ty_err_set(err, TY_ENOMEM, "out of memory");
    MPI_Comm_size(MPI_COMM_WORLD, &c->world);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    /* Errors come back to us (and become an error event) instead of
     * aborting inside MPI. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c->xc);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(MPI_COMM_WORLD, &c->gc);
    if (rc != MPI_SUCCESS) {
        free(c);
        return mpi_fail(err, "MPI_Comm_dup for the gradient sums", rc);
    }
    *out = c;
    return 0;
}

int coll_attach_nccl(coll *c, ty_err *err)
{
    if (!c) return 0;
#ifdef TY_HAVE_NCCL
    return c->dev ? 0 : coll_nccl_open(&c->dev, c->world, c->rank, err);
#else
    return ty_err_set(err, TY_EINVAL,
                      "world size %d on a GPU: this engine was built without NCCL "
                      "(a CUDA build fetches its header; docs/engine.md, Ranks)",
                      c->world);
#endif
}

void coll_close(coll *c)
{
#ifdef TY_HAVE_NCCL
    if (c) coll_nccl_close(c->dev);
#endif
    if (c) {
        MPI_Comm_free(&c->xc);
        MPI_Comm_free(&c->gc);
        free(c->op);
    }
    free(c);
}

const char *coll_name(const coll *c)
{
    (void)c;
    return "mpi";
}

/* The counts of a sum of buf[lo, hi) and the room for this rank's pieces. */
static int op_plan(coll *c, sum_op *o, float *buf, size_t lo, size_t hi, const size_t *off,
                   const size_t *len, ty_err *err)
{
    int w = c->world;
    if (hi - lo > INT_MAX)
        return ty_err_set(err, TY_EINVAL, "a gradient sum of %zu floats is beyond MPI's counts",
                          hi - lo);
    if (!(o->cnt = malloc(4 * sizeof(int) * (size_t)w)))
        return ty_err_set(err, TY_ENOMEM, "out of memory");
    o->dis = o->cnt + w, o->rcnt = o->dis + w, o->rdis = o->rcnt + w;
    for (int k = 0; k < w; k++) {
        size_t a, b;
        coll_part(lo, hi, off[k], len[k], &a, &b);
        o->cnt[k] = (int)(b - a);
        o->dis[k] = (int)(a - lo);
    }
    o->mine = (size_t)o->dis[c->rank], o->m = (size_t)o->cnt[c->rank];
    if (o->m * (size_t)w > INT_MAX)
        return ty_err_set(err, TY_EINVAL, "a gradient sum's pieces are beyond MPI's counts");
    for (int k = 0; k < w; k++)
        o->rcnt[k] = (int)o->m, o->rdis[k] = k * (int)o->m;
    o->base = buf + lo;
    o->parts = malloc(o->m * (size_t)w * sizeof(float) + 1);
    return o->parts ? 0 : ty_err_set(err, TY_ENOMEM, "out of memory for a gradient sum");
}

/* The owner's sum, in rank order: ((p0 + p1) + p2) + ... */
static void op_add(const coll *c, sum_op *o)
{
    float *dst = o->base + o->mine;
    memcpy(dst, o->parts, o->m * sizeof *dst);
    for (int k = 1; k < c->world; k++) {
        const float *p = o->parts + (size_t)k * o->m;
        for (size_t i = 0; i < o->m; i++)
            dst[i] += p[i];
    }
    free(o->parts);
    o->parts = NULL;
}

/* Moves a sum on: tests its request (block: waits for it); once the
 * pieces are in, adds them and starts the all-gather (or is done). */
static int op_step(coll *c, sum_op *o, int block, ty_err *err)
{
    if (o->stage == SUM_DONE) return 0;
    int done = 1;
    int rc =
        block ? MPI_Wait(&o->req, MPI_STATUS_IGNORE) : MPI_Test(&o->req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
        return mpi_fail(err,
                        o->stage == SUM_EXCHANGE ? "MPI_Ialltoallv of the gradients"
                                                 : "MPI_Iallgatherv of the gradients",
                        rc);
    if (!done) return 0;
    if (o->stage == SUM_EXCHANGE) op_add(c, o);
    if (o->stage == SUM_GATHER || !o->gather) {
        o->stage = SUM_DONE;
        return 0;
    }
    rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, o->base, o->cnt, o->dis, MPI_FLOAT,
                         c->gc, &o->req);
    if (rc != MPI_SUCCESS) return mpi_fail(err, "MPI_Iallgatherv of the gradients", rc);
    o->stage = SUM_GATHER;
    return 0;
}

/* Room for one more started sum. */
static sum_op *op_new(coll *c, ty_err *err)
{
    if (c->nop == c->capop) {
        int cap = c->capop ? 2 * c->capop : 64;
        sum_op *q = realloc(c->op, sizeof *q * (size_t)cap);
        if (!q) {
            ty_err_set(err, TY_ENOMEM, "out of memory");
            return NULL;
        }
        c->op = q;
        c->capop = cap;
    }
    sum_op *o = &c->op[c->nop++];
    memset(o, 0, sizeof *o);
    return o;
}

/* Every rank's summed part received (gather) and the pieces of this rank's. */
static void count_rx(coll *c, size_t lo, size_t hi, const size_t *off, const size_t *len,
                     int gather)
{
    size_t a, b;
    coll_part(lo, hi, off[c->rank], len[c->rank], &a, &b);
    c->rx += sizeof(float) * ((b - a) * (size_t)(c->world - 1) + (gather ? hi - lo - (b - a) : 0));
}

int coll_ireduce_f32(coll *c, float *buf, size_t lo, size_t hi, const size_t *off,
                     const size_t *len, int gather, ty_err *err)
{
    if (!c || hi <= lo) return 0;
    count_rx(c, lo, hi, off, len, gather);
#ifdef TY_HAVE_NCCL
    if (c->dev) return coll_nccl_reduce(c->dev, buf, lo, hi, off, len, gather, 1, err);
#endif
    sum_op *o = op_new(c, err);
    if (!o) return -1;
    o->gather = gather;
    int rc = op_plan(c, o, buf, lo, hi, off, len, err), m;
    if (!rc && (m = MPI_Ialltoallv(o->base, o->cnt, o->dis, MPI_FLOAT, o->parts, o->rcnt, o->rdis,
                                   MPI_FLOAT, c->xc, &o->req)) != MPI_SUCCESS)
        rc = mpi_fail(err, "MPI_Ialltoallv of the gradients", m);
    if (rc) { /* never started: not waited for */
        free(o->parts);
        free(o->cnt);
        c->nop--;
    }
    return rc;
}

int coll_reduce_f32(coll *c, float *buf, size_t lo, size_t hi, const size_t *off, const size_t *len,
                    int gather, ty_err *err)
{
    if (!c) return 0;
#ifdef TY_HAVE_NCCL
    if (c->dev) {
        count_rx(c, lo, hi, off, len, gather);
        return coll_nccl_reduce(c->dev, buf, lo, hi, off, len, gather, 0, err);
    }
#endif
    for (size_t o = lo; o < hi; o += SUM_CHUNK)
        if (coll_ireduce_f32(c, buf, o, hi - o < SUM_CHUNK ? hi : o + SUM_CHUNK, off, len, gather,
                             err) ||
            coll_wait(c, err))
            return -1;
    return 0;
}

int coll_sum_f32(coll *c, float *buf, size_t n, ty_err *err)
{
    if (!c) return 0;
    size_t *off = malloc(2 * sizeof *off * (size_t)c->world);
    if (!off) return ty_err_set(err, TY_ENOMEM, "out of memory");
    dist_cuts(n, c->world, off, off + c->world);
    int rc = coll_reduce_f32(c, buf, 0, n, off, off + c->world, 1, err);
    free(off);
    return rc;
}

/* The all-gathers start in the sums' order on every rank: a sum moves to
 * its all-gather only once every earlier one has. */
int coll_progress(coll *c, ty_err *err)
{
    if (!c || !c->nop) return 0;
    for (int k = 0; k < c->nop; k++) {
        if (op_step(c, &c->op[k], 0, err)) return -1;
        if (c->op[k].stage == SUM_EXCHANGE) break;
    }
    return 0;
}

int coll_wait(coll *c, ty_err *err)
{
    if (!c) return 0;
#ifdef TY_HAVE_NCCL
    if (c->dev) return coll_nccl_wait(c->dev, err);
#endif
    int rc = 0;
    for (int k = 0; k < c->nop; k++) {
        while (!rc && c->op[k].stage != SUM_DONE)
            rc = op_step(c, &c->op[k], 1, err);
        free(c->op[k].parts);
        free(c->op[k].cnt);
    }
    c->nop = 0;
    return rc;
}

size_t coll_take_bytes(coll *c)
{
    if (!c) return 0;
    size_t b = c->rx;
    c->rx = 0;
    return b;
}

int coll_sum_f64(coll *c, double *buf, int n, ty_err *err)
{
    if (!c) return 0;
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(err, "MPI_Allreduce", rc);
}

/* MPI's counts and displacements are ints: each piece and offset must fit. */
static int counts(const coll *c, const size_t *off, const size_t *len, int **cnt, int **dis,
                  ty_err *err)
{
    *cnt = malloc(sizeof(int) * (size_t)c->world);
    *dis = malloc(sizeof(int) * (size_t)c->world);
    if (!*cnt || !*dis) return ty_err_set(err, TY_ENOMEM, "out of memory");
    for (int k = 0; k < c->world; k++) {
        if (off[k] + len[k] > (size_t)0x7fffffff)
            return ty_err_set(err, TY_EINVAL, "a buffer of %zu floats is beyond MPI's int counts",
                              off[k] + len[k]);
        (*cnt)[k] = (int)len[k];
        (*dis)[k] = (int)off[k];
    }
    return 0;
}

static int allgather(coll *c, void *buf, MPI_Datatype t, const size_t *off, const size_t *len,
                     const char *what, ty_err *err)
{
    if (!c) return 0;
    int *cnt = NULL, *dis = NULL;
    int rc = counts(c, off, len, &cnt, &dis, err);
    if (!rc) {
        int m =
            MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, cnt, dis, t, MPI_COMM_WORLD);
        if (m != MPI_SUCCESS) rc = mpi_fail(err, what, m);
    }
    free(cnt);
    free(dis);
    return rc;
}

static int gather(coll *c, void *full, const void *mine, MPI_Datatype t, const size_t *off,
                  const size_t *len, const char *what, ty_err *err)
{
    if (!c) return 0;
    int *cnt = NULL, *dis = NULL;
    int rc = counts(c, off, len, &cnt, &dis, err);
    if (!rc) {
        int m = MPI_Gatherv(mine, cnt[c->rank], t, c->rank == 0 ? full : NULL, cnt, dis, t, 0,
                            MPI_COMM_WORLD);
        if (m != MPI_SUCCESS) rc = mpi_fail(err, what, m);
    }
    free(cnt);
    free(dis);
    return rc;
}

int coll_allgather_f32(coll *c, float *buf, const size_t *off, const size_t *len, ty_err *err)
{
#ifdef TY_HAVE_NCCL
    if (c && c->dev)
        return coll_nccl_allgather(c->dev, buf, sizeof(float), off, len, c->world, err);
#endif
    return allgather(c, buf, MPI_FLOAT, off, len, "MPI_Allgatherv of the weights", err);
}

int coll_allgather_u16(coll *c, uint16_t *buf, const size_t *off, const size_t *len, ty_err *err)
{
#ifdef TY_HAVE_NCCL
    if (c && c->dev)
        return coll_nccl_allgather(c->dev, buf, sizeof(uint16_t), off, len, c->world, err);
#endif
    return allgather(c, buf, MPI_UINT16_T, off, len, "MPI_Allgatherv of the 16-bit weights", err);
}

int coll_gather_f32(coll *c, float *full, const float *mine, const size_t *off, const size_t *len,
                    ty_err *err)
{
    return gather(c, full, mine, MPI_FLOAT, off, len, "MPI_Gatherv of the optimizer state", err);
}

int coll_gather_u16(coll *c, uint16_t *full, const uint16_t *mine, const size_t *off,
                    const size_t *len, ty_err *err)
{
    return gather(c, full, mine, MPI_UINT16_T, off, len, "MPI_Gatherv of the masters", err);
}

int coll_barrier(coll *c, ty_err *err)
{
    if (!c) return 0;
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(err, "MPI_Barrier", rc);
}
