/* coll_mpi.c — the collectives between CPU ranks over MPI (coll.h).
 *
 * Plain blocking MPI_Allreduce / MPI_Allgatherv on MPI_COMM_WORLD, and
 * MPI_Iallreduce for the gradient buckets (their requests kept here until
 * coll_wait). MPI's counts are ints, so a buffer goes in chunks of at most
 * 2^30 elements. Open MPI's reduction algorithm for a given world size and
 * message size is fixed, so a run is reproducible at the same world size;
 * across world sizes the order of the final sums differs (docs/engine.md,
 * Ranks). */
#include "coll.h"

#include <mpi.h>
#include <stdlib.h>

#ifdef TY_HAVE_NCCL
#include "coll_nccl.h"
#endif

struct coll {
    int world, rank;
    MPI_Request *req; /* started non-blocking sums (coll_isum_f32) */
    int nreq, capreq;
#ifdef TY_HAVE_NCCL
    coll_nccl *dev; /* GPU ranks: the gradient sum, its buckets, ZeRO-1's all-gather */
#endif
};

#define CHUNK ((size_t)1 << 30)

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
    if (c) free(c->req);
    free(c);
}

const char *coll_name(const coll *c)
{
    (void)c;
    return "mpi";
}

int coll_sum_f32(coll *c, float *buf, size_t n, ty_err *err)
{
    if (!c) return 0;
#ifdef TY_HAVE_NCCL
    if (c->dev) return coll_nccl_sum_f32(c->dev, buf, n, err);
#endif
    for (size_t o = 0; o < n; o += CHUNK) {
        int k = (int)(n - o < CHUNK ? n - o : CHUNK);
        int rc = MPI_Allreduce(MPI_IN_PLACE, buf + o, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_fail(err, "MPI_Allreduce of the gradients", rc);
    }
    return 0;
}

int coll_isum_f32(coll *c, float *buf, size_t n, ty_err *err)
{
    if (!c) return 0;
#ifdef TY_HAVE_NCCL
    if (c->dev) return coll_nccl_isum_f32(c->dev, buf, n, err);
#endif
    for (size_t o = 0; o < n; o += CHUNK) {
        if (c->nreq == c->capreq) {
            int cap = c->capreq ? 2 * c->capreq : 64;
            MPI_Request *q = realloc(c->req, sizeof *q * (size_t)cap);
            if (!q) return ty_err_set(err, TY_ENOMEM, "out of memory");
            c->req = q;
            c->capreq = cap;
        }
        int k = (int)(n - o < CHUNK ? n - o : CHUNK);
        int rc = MPI_Iallreduce(MPI_IN_PLACE, buf + o, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                                &c->req[c->nreq]);
        if (rc != MPI_SUCCESS) return mpi_fail(err, "MPI_Iallreduce of a gradient bucket", rc);
        c->nreq++;
    }
    return 0;
}

int coll_progress(coll *c, ty_err *err)
{
    if (!c || !c->nreq) return 0;
#ifdef TY_HAVE_NCCL
    if (c->dev) return 0; /* NCCL's stream advances by itself */
#endif
    int done = 0;
    int rc = MPI_Testall(c->nreq, c->req, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(err, "MPI_Testall of the gradient buckets", rc);
    return 0;
}

int coll_wait(coll *c, ty_err *err)
{
    if (!c) return 0;
#ifdef TY_HAVE_NCCL
    if (c->dev) return coll_nccl_wait(c->dev, err);
#endif
    int n = c->nreq;
    c->nreq = 0;
    int rc = MPI_Waitall(n, c->req, MPI_STATUSES_IGNORE);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(err, "MPI_Waitall of the gradient buckets", rc);
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
