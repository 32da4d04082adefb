/* zero.c — ZeRO-1: sharded AdamW moments (see zero.h). */
#include "zero.h"

#include <stdlib.h>
#include <string.h>

#include "events.h"
#include "kernels.h"

int zero_shard(zero1 *z, model *m, int world, int rank, ty_err *err)
{
    const model_tensor *last = &m->t[m->nt - 1];
    z->on = 1;
    z->world = world;
    z->rank = rank;
    z->n = last->off + last->numel;
    z->off = calloc((size_t)world, sizeof *z->off);
    z->len = calloc((size_t)world, sizeof *z->len);
    if (!z->off || !z->len) return ty_err_set(err, TY_ENOMEM, "out of memory");
    /* Cuts on 16-float boundaries (64 bytes, as every tensor view starts). */
    for (int k = 0; k <= world; k++) {
        size_t cut = k == world ? z->n : (z->n * (size_t)k / (size_t)world) / 16 * 16;
        if (k < world) z->off[k] = cut;
        if (k > 0) z->len[k - 1] = cut - z->off[k - 1];
    }
    size_t bytes = z->len[rank] * sizeof(float);
    z->m = kn_alloc(m->kn, bytes ? bytes : sizeof(float));
    z->v = kn_alloc(m->kn, bytes ? bytes : sizeof(float));
    if (!z->m || !z->v)
        return ty_err_set(err, TY_ENOMEM, "out of memory for %zu bytes of moments", 2 * bytes);
    kn_copy(m->kn, z->m, m->m + z->off[rank], z->len[rank]);
    kn_copy(m->kn, z->v, m->v + z->off[rank], z->len[rank]);
    kn_free(m->kn, m->m);
    kn_free(m->kn, m->v);
    m->m = m->v = NULL;
    ev_log("ZeRO-1: this rank keeps the moments of floats [%zu, %zu) of %zu", z->off[rank],
           z->off[rank] + z->len[rank], z->n);
    return 0;
}

int zero_adamw(zero1 *z, model *m, coll *c, float lr, float b1, float b2, float eps, float wd,
               long long t, ty_err *err)
{
    size_t lo = z->off[z->rank], hi = lo + z->len[z->rank];
    for (int i = 0; i < m->nt; i++) {
        const model_tensor *mt = &m->t[i];
        size_t a = mt->off > lo ? mt->off : lo,
               b = mt->off + mt->numel < hi ? mt->off + mt->numel : hi;
        if (a >= b) continue;
        kn_adamw(m->kn, KN_F32, m->params + a, NULL, m->grads + a, z->m + (a - lo), z->v + (a - lo),
                 b - a, lr, b1, b2, eps, mt->decay ? wd : 0.0f, t);
    }
    if (kn_check(m->kn, err)) return -1;
    return coll_allgather_f32(c, m->params, z->off, z->len, err);
}

int zero_gather(zero1 *z, model *m, coll *c, ty_err *err)
{
    float *full[2] = {NULL, NULL};
    const float *mine[2] = {z->m, z->v};
    for (int k = 0; k < 2; k++) {
        /* Only rank 0 holds the whole buffer, for as long as it writes. */
        if (z->rank == 0 && !(full[k] = kn_alloc(m->kn, z->n * sizeof(float)))) {
            kn_free(m->kn, full[0]);
            return ty_err_set(err, TY_ENOMEM, "out of memory gathering the moments");
        }
        if (z->rank == 0) kn_copy(m->kn, full[k], mine[k], z->len[0]); /* world 1: no collective */
        if (coll_gather_f32(c, full[k], mine[k], z->off, z->len, err)) return -1;
    }
    if (z->rank == 0) {
        m->m = full[0];
        m->v = full[1];
    }
    return 0;
}

void zero_unsave(zero1 *z, model *m)
{
    if (z->rank == 0) {
        kn_free(m->kn, m->m);
        kn_free(m->kn, m->v);
    }
    m->m = m->v = NULL;
}

void zero_free(zero1 *z, model *m)
{
    if (!z->on) return;
    kn_free(m->kn, z->m);
    kn_free(m->kn, z->v);
    free(z->off);
    free(z->len);
    memset(z, 0, sizeof *z);
}
