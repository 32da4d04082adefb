/* zero.c — ZeRO-1: sharded AdamW moments and masters (see zero.h). */
#include "zero.h"

#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "events.h"
#include "kernels.h"

/* Raw bits from kernel-context memory to kernel-context memory (kn_copy
 * is for floats, and a low half read as bf16 could be a NaN): through the
 * host, at set-up only. */
static int copy_bits(kn_ctx *kn, void *dst, const void *src, size_t bytes, ty_err *err)
{
    void *h = malloc(bytes ? bytes : 1);
    if (!h) return ty_err_set(err, TY_ENOMEM, "out of memory for %zu bytes", bytes);
    kn_to_host(kn, h, src, bytes);
    kn_to_device(kn, dst, h, bytes);
    kn_sync(kn);
    free(h);
    return 0;
}

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
    /* The gradient sum's owners: this rank's shard of the summed gradient
     * is exactly the range it updates. */
    dist_cuts(z->n, world, z->off, z->len);
    size_t lo = z->off[rank], len = z->len[rank], bytes = len * sizeof(float);
    z->m = kn_alloc(m->kn, bytes ? bytes : sizeof(float));
    z->v = kn_alloc(m->kn, bytes ? bytes : sizeof(float));
    if (!z->m || !z->v)
        return ty_err_set(err, TY_ENOMEM, "out of memory for %zu bytes of moments", 2 * bytes);
    kn_copy(m->kn, z->m, m->m + lo, len);
    kn_copy(m->kn, z->v, m->v + lo, len);
    kn_free(m->kn, m->m);
    kn_free(m->kn, m->v);
    m->m = m->v = NULL;
    /* The masters: whole in fp32 (they are the weights the forward reads),
     * this rank's range with 16-bit storage. */
    z->master = m->plo ? KN_BF16 : m->dt != KN_F32 ? KN_F16 : KN_F32;
    if (z->master == KN_BF16) {
        if (!(z->lo16 = kn_alloc(m->kn, len ? len * sizeof(uint16_t) : sizeof(uint16_t))))
            return ty_err_set(err, TY_ENOMEM, "out of memory for the masters' low halves");
        if (copy_bits(m->kn, z->lo16, m->plo + lo, len * sizeof(uint16_t), err)) return -1;
        kn_free(m->kn, m->plo);
        m->plo = NULL;
    } else if (z->master == KN_F16) {
        if (!(z->w32 = kn_alloc(m->kn, bytes ? bytes : sizeof(float))))
            return ty_err_set(err, TY_ENOMEM, "out of memory for %zu bytes of masters", bytes);
        kn_copy(m->kn, z->w32, m->params + lo, len);
        kn_free(m->kn, m->params);
        m->params = NULL;
    }
    ev_log("ZeRO-1: this rank keeps the moments%s of floats [%zu, %zu) of %zu",
           z->master == KN_F32 ? "" : " and masters", lo, lo + len, z->n);
    return 0;
}

/* This rank's range of tensor i as a block of kn_adamw_blocks (n 0 when
 * the tensor lies outside it). */
static kn_adamw_block shard_block(zero1 *z, model *m, int i, float wd)
{
    size_t lo = z->off[z->rank], hi = lo + z->len[z->rank];
    const model_tensor *mt = &m->t[i];
    size_t a = mt->off > lo ? mt->off : lo, b = mt->off + mt->numel < hi ? mt->off + mt->numel : hi;
    kn_adamw_block k = {0};
    if (a >= b) return k;
    k.g = m->grads + a, k.m = z->m + (a - lo), k.v = z->v + (a - lo), k.n = b - a;
    k.wd = mt->decay ? wd : 0.0f;
    k.pdt = z->master == KN_BF16 ? KN_BF16 : KN_F32;
    if (z->master == KN_BF16)
        k.p = (uint16_t *)m->p16 + a, k.plo = z->lo16 + (a - lo);
    else
        k.p = z->master == KN_F16 ? z->w32 + (a - lo) : m->params + a;
    return k;
}

int zero_adamw(zero1 *z, model *m, coll *c, const kn_adamw_hp *hp, float wd, ty_err *err)
{
    size_t lo = z->off[z->rank], hi = lo + z->len[z->rank];
    uint16_t *w16 = m->p16;
    kn_adamw_block *blk = malloc((size_t)(m->nt ? m->nt : 1) * sizeof *blk);
    if (!blk) return ty_err_set(err, TY_ENOMEM, "out of memory for the optimizer's blocks");
    int nb = 0;
    for (int i = 0; i < m->nt; i++) {
        kn_adamw_block b = shard_block(z, m, i, wd);
        if (b.n) blk[nb++] = b;
    }
    /* The gradient outside this range is never read here: the trainer
     * zeroes the whole buffer before the next step, so this range's is
     * left as it is. */
    kn_adamw_hp h = *hp;
    h.zero_grad = 0;
    kn_adamw_blocks(m->kn, blk, nb, h);
    free(blk);
    /* fp16: this range's weights rounded from its masters, as
     * model_sync_params rounds the whole buffer. */
    if (z->master == KN_F16) kn_convert(m->kn, w16 + lo, m->dt, z->w32, KN_F32, hi - lo);
    if (kn_check(m->kn, err)) return -1;
    if (z->master == KN_F32) return coll_allgather_f32(c, m->params, z->off, z->len, err);
    return coll_allgather_u16(c, w16, z->off, z->len, err);
}

/* Rank 0 gets the whole buffer of n elements of `size` bytes, in
 * kernel-context memory; every rank sends its piece. The pieces go
 * through host buffers and MPI (a checkpoint's rare gather; the same code
 * for CPU and GPU ranks). */
static int gather_one(zero1 *z, model *m, coll *c, void **full, const void *mine, size_t size,
                      ty_err *err)
{
    size_t own = z->len[z->rank] * size;
    void *hm = malloc(own ? own : 1), *hf = z->rank == 0 ? malloc(z->n * size) : NULL;
    int rc = 0;
    *full = NULL;
    if (!hm || (z->rank == 0 && !hf)) {
        rc = ty_err_set(err, TY_ENOMEM, "out of memory gathering the optimizer state");
        goto out;
    }
    kn_to_host(m->kn, hm, mine, own);
    rc = size == sizeof(float) ? coll_gather_f32(c, hf, hm, z->off, z->len, err)
                               : coll_gather_u16(c, hf, hm, z->off, z->len, err);
    if (rc || z->rank != 0) goto out;
    if (!(*full = kn_alloc(m->kn, z->n * size))) {
        rc = ty_err_set(err, TY_ENOMEM, "out of memory gathering the optimizer state");
        goto out;
    }
    kn_to_device(m->kn, *full, hf, z->n * size);
    kn_sync(m->kn);
out:
    free(hm);
    free(hf);
    return rc;
}

int zero_gather(zero1 *z, model *m, coll *c, int moments, ty_err *err)
{
    void *a = NULL, *b = NULL, *w = NULL;
    if (moments && (gather_one(z, m, c, &a, z->m, sizeof(float), err) ||
                    gather_one(z, m, c, &b, z->v, sizeof(float), err)))
        goto fail;
    if (z->master == KN_BF16 && gather_one(z, m, c, &w, z->lo16, sizeof(uint16_t), err)) goto fail;
    if (z->master == KN_F16 && gather_one(z, m, c, &w, z->w32, sizeof(float), err)) goto fail;
    if (z->rank == 0) {
        if (moments) {
            m->m = a;
            m->v = b;
        }
        if (z->master == KN_BF16) m->plo = w;
        if (z->master == KN_F16) m->params = w;
    }
    return 0;
fail:
    kn_free(m->kn, a);
    kn_free(m->kn, b);
    return -1;
}

void zero_unsave(zero1 *z, model *m)
{
    if (z->rank == 0) {
        kn_free(m->kn, m->m);
        kn_free(m->kn, m->v);
        if (z->master == KN_BF16) kn_free(m->kn, m->plo);
        if (z->master == KN_F16) kn_free(m->kn, m->params);
    }
    m->m = m->v = NULL;
    if (z->master == KN_BF16) m->plo = NULL;
    if (z->master == KN_F16) m->params = NULL;
}

void zero_bytes(const zero1 *z, size_t *moments, size_t *masters)
{
    size_t len = z->on ? z->len[z->rank] : 0;
    *moments = 2 * len * sizeof(float);
    *masters = len * (z->master == KN_BF16  ? sizeof(uint16_t)
                      : z->master == KN_F16 ? sizeof(float)
                                            : 0);
}

void zero_free(zero1 *z, model *m)
{
    if (!z->on) return;
    kn_free(m->kn, z->m);
    kn_free(m->kn, z->v);
    kn_free(m->kn, z->lo16);
    kn_free(m->kn, z->w32);
    free(z->off);
    free(z->len);
    memset(z, 0, sizeof *z);
}
