/* kernels.c — device dispatch and memory accounting for kernels.h.
 *
 * Every kn_* call forwards to the context's kn_backend table, so model code
 * never knows which device runs it. The one device-independent service here
 * is byte accounting: a pointer -> size side table (open addressing, linear
 * probing) gives kn_bytes_in_use and kn_peak_bytes for any device, since a
 * header in front of a GPU block could not be read from the host. */
#include "backend.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* ---- allocation table ------------------------------------------------- */

static size_t slot_hash(const void *p, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static void slot_put_raw(kn_alloc_slot *slots, size_t cap, void *p, size_t bytes)
{
    size_t i = slot_hash(p, cap);
    while (slots[i].p)
        i = (i + 1) & (cap - 1);
    slots[i].p = p;
    slots[i].bytes = bytes;
}

/* Keeps the load factor under 1/2 so probes stay short. */
static int slot_reserve(kn_ctx *c)
{
    if ((c->slot_used + 1) * 2 <= c->slot_cap)
        return 0;
    size_t cap = c->slot_cap ? c->slot_cap * 2 : 64;
    kn_alloc_slot *ns = calloc(cap, sizeof *ns);
    if (!ns)
        return -1;
    for (size_t i = 0; i < c->slot_cap; i++)
        if (c->slots[i].p)
            slot_put_raw(ns, cap, c->slots[i].p, c->slots[i].bytes);
    free(c->slots);
    c->slots = ns;
    c->slot_cap = cap;
    return 0;
}

/* Removes p and returns its size (*known = 0 when p is not in the table).
 * Backward-shift deletion keeps every remaining key reachable without
 * tombstones. */
static size_t slot_take(kn_ctx *c, const void *p, int *known)
{
    *known = 0;
    if (!c->slot_cap)
        return 0;
    size_t mask = c->slot_cap - 1, i = slot_hash(p, c->slot_cap);
    while (c->slots[i].p != p) {
        if (!c->slots[i].p)
            return 0;
        i = (i + 1) & mask;
    }
    *known = 1;
    size_t bytes = c->slots[i].bytes;
    size_t hole = i;
    for (size_t j = (i + 1) & mask; c->slots[j].p; j = (j + 1) & mask) {
        size_t home = slot_hash(c->slots[j].p, c->slot_cap);
        /* Move j into the hole unless its home lies cyclically in (hole, j]. */
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            c->slots[hole] = c->slots[j];
            hole = j;
        }
    }
    c->slots[hole].p = NULL;
    c->slots[hole].bytes = 0;
    c->slot_used--;
    return bytes;
}

/* ---- context and memory ----------------------------------------------- */

int kn_open(kn_ctx **out, kn_device dev, int device_index, int n_threads, ty_err *err)
{
    *out = NULL;
    const kn_backend *be = NULL;
    if (dev == KN_CPU)
        be = &kn_cpu_backend;
    else if (dev == KN_CUDA) {
#ifdef TY_KN_HAVE_CUDA
        be = &kn_cuda_backend;
#else
        return ty_err_set(err, TY_EINVAL, "this build has no CUDA backend");
#endif
    } else
        return ty_err_set(err, TY_EINVAL, "unknown kernel device %d", (int)dev);
    if (n_threads < 0)
        return ty_err_set(err, TY_EINVAL, "n_threads must be >= 0, got %d", n_threads);

    kn_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return ty_err_set(err, TY_ENOMEM, "out of memory opening a kernel context");
    c->dev = dev;
    c->be = be;
    c->n_threads = n_threads > 0 ? n_threads : omp_get_max_threads();
    if (c->n_threads < 1)
        c->n_threads = 1;
    int rc = be->open(c, device_index, err);
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void kn_close(kn_ctx *c)
{
    if (!c)
        return;
    /* Anything still allocated is released here, so a context owns its memory. */
    for (size_t i = 0; i < c->slot_cap; i++)
        if (c->slots[i].p)
            c->be->free(c, c->slots[i].p);
    free(c->slots);
    c->be->close(c);
    free(c);
}

kn_device kn_device_of(const kn_ctx *c) { return c->dev; }
const char *kn_device_name(const kn_ctx *c) { return c->be->name; }
const char *kn_describe(const kn_ctx *c) { return c->desc; }

void *kn_alloc(kn_ctx *c, size_t bytes)
{
    if (slot_reserve(c))
        return NULL;
    void *p = c->be->alloc(c, bytes);
    if (!p)
        return NULL;
    slot_put_raw(c->slots, c->slot_cap, p, bytes);
    c->slot_used++;
    c->bytes_in_use += bytes;
    if (c->bytes_in_use > c->peak_bytes)
        c->peak_bytes = c->bytes_in_use;
    return p;
}

/* A pointer this context did not hand out is left alone: freeing it here
 * could only turn a caller's bug into heap corruption. */
void kn_free(kn_ctx *c, void *p)
{
    if (!p)
        return;
    int known = 0;
    size_t bytes = slot_take(c, p, &known);
    if (!known)
        return;
    c->bytes_in_use -= bytes;
    c->be->free(c, p);
}

size_t kn_bytes_in_use(const kn_ctx *c) { return c->bytes_in_use; }
size_t kn_peak_bytes(const kn_ctx *c) { return c->peak_bytes; }

void kn_to_device(kn_ctx *c, void *dst, const void *host_src, size_t bytes)
{
    c->be->to_device(c, dst, host_src, bytes);
}
void kn_to_host(kn_ctx *c, void *host_dst, const void *src, size_t bytes)
{
    c->be->to_host(c, host_dst, src, bytes);
}
void kn_sync(kn_ctx *c) { c->be->sync(c); }

/* ---- operations: straight forwarding ----------------------------------- */

void kn_zero(kn_ctx *c, float *x, size_t n) { c->be->zero(c, x, n); }
void kn_copy(kn_ctx *c, float *dst, const float *src, size_t n) { c->be->copy(c, dst, src, n); }
void kn_scale(kn_ctx *c, float *x, size_t n, float s) { c->be->scale(c, x, n, s); }
void kn_axpy(kn_ctx *c, float *y, const float *x, size_t n, float a) { c->be->axpy(c, y, x, n, a); }
void kn_add(kn_ctx *c, float *out, const float *a, const float *b, size_t n)
{
    c->be->add(c, out, a, b, n);
}
double kn_sum(kn_ctx *c, const float *x, size_t n) { return c->be->sum(c, x, n); }
double kn_sumsq(kn_ctx *c, const float *x, size_t n) { return c->be->sumsq(c, x, n); }
int kn_nonfinite(kn_ctx *c, const float *x, size_t n) { return c->be->nonfinite(c, x, n); }

void kn_embedding_fwd(kn_ctx *c, float *out, const int32_t *ids, const float *table, int N, int C,
                      int accumulate)
{
    c->be->embedding_fwd(c, out, ids, table, N, C, accumulate);
}
void kn_embedding_bwd(kn_ctx *c, float *dtable, const int32_t *ids, const float *dout, int N, int C)
{
    c->be->embedding_bwd(c, dtable, ids, dout, N, C);
}

void kn_layernorm_fwd(kn_ctx *c, float *out, float *mean, float *rstd, const float *x,
                      const float *w, const float *b, int N, int C, float eps)
{
    c->be->layernorm_fwd(c, out, mean, rstd, x, w, b, N, C, eps);
}
void kn_layernorm_bwd(kn_ctx *c, float *dx, float *dw, float *db, const float *dout,
                      const float *x, const float *w, const float *mean, const float *rstd,
                      int N, int C)
{
    c->be->layernorm_bwd(c, dx, dw, db, dout, x, w, mean, rstd, N, C);
}
void kn_rmsnorm_fwd(kn_ctx *c, float *out, float *rstd, const float *x, const float *w, int N,
                    int C, float eps)
{
    c->be->rmsnorm_fwd(c, out, rstd, x, w, N, C, eps);
}
void kn_rmsnorm_bwd(kn_ctx *c, float *dx, float *dw, const float *dout, const float *x,
                    const float *w, const float *rstd, int N, int C)
{
    c->be->rmsnorm_bwd(c, dx, dw, dout, x, w, rstd, N, C);
}

void kn_matmul_fwd(kn_ctx *c, float *out, const float *x, const float *w, const float *bias, int N,
                   int K, int M)
{
    c->be->matmul_fwd(c, out, x, w, bias, N, K, M);
}
void kn_matmul_bwd(kn_ctx *c, float *dx, float *dw, float *dbias, const float *dout,
                   const float *x, const float *w, int N, int K, int M)
{
    c->be->matmul_bwd(c, dx, dw, dbias, dout, x, w, N, K, M);
}

void kn_rope_fwd(kn_ctx *c, float *x, int B, int T, int H, int D, int ld, float base,
                 int pos_offset)
{
    c->be->rope_fwd(c, x, B, T, H, D, ld, base, pos_offset);
}
void kn_rope_bwd(kn_ctx *c, float *dx, int B, int T, int H, int D, int ld, float base,
                 int pos_offset)
{
    c->be->rope_bwd(c, dx, B, T, H, D, ld, base, pos_offset);
}
void kn_attention_fwd(kn_ctx *c, float *out, float *att, const float *q, const float *k,
                      const float *v, int B, int T, int Hq, int Hkv, int D, int ldq, int ldkv)
{
    c->be->attention_fwd(c, out, att, q, k, v, B, T, Hq, Hkv, D, ldq, ldkv);
}
void kn_attention_bwd(kn_ctx *c, float *dq, float *dk, float *dv, const float *dout,
                      const float *att, const float *q, const float *k, const float *v, int B,
                      int T, int Hq, int Hkv, int D, int ldq, int ldkv)
{
    c->be->attention_bwd(c, dq, dk, dv, dout, att, q, k, v, B, T, Hq, Hkv, D, ldq, ldkv);
}

void kn_gelu_fwd(kn_ctx *c, float *out, const float *x, size_t n) { c->be->gelu_fwd(c, out, x, n); }
void kn_gelu_bwd(kn_ctx *c, float *dx, const float *dout, const float *x, size_t n)
{
    c->be->gelu_bwd(c, dx, dout, x, n);
}
void kn_swiglu_fwd(kn_ctx *c, float *out, const float *gate, const float *up, size_t n)
{
    c->be->swiglu_fwd(c, out, gate, up, n);
}
void kn_swiglu_bwd(kn_ctx *c, float *dgate, float *dup, const float *dout, const float *gate,
                   const float *up, size_t n)
{
    c->be->swiglu_bwd(c, dgate, dup, dout, gate, up, n);
}
void kn_dropout_fwd(kn_ctx *c, float *out, uint8_t *mask, const float *x, size_t n, float p,
                    uint64_t seed, uint64_t offset)
{
    c->be->dropout_fwd(c, out, mask, x, n, p, seed, offset);
}
void kn_dropout_bwd(kn_ctx *c, float *dx, const float *dout, const uint8_t *mask, size_t n, float p)
{
    c->be->dropout_bwd(c, dx, dout, mask, n, p);
}

void kn_crossentropy_fwd(kn_ctx *c, float *losses, const float *logits, const int32_t *targets,
                         int N, int V)
{
    c->be->crossentropy_fwd(c, losses, logits, targets, N, V);
}
void kn_crossentropy_bwd(kn_ctx *c, float *dlogits, const float *logits, const int32_t *targets,
                         int N, int V, float scale)
{
    c->be->crossentropy_bwd(c, dlogits, logits, targets, N, V, scale);
}

void kn_crossentropy_fwd_bwd(kn_ctx *c, float *losses, float *dlogits, const float *logits,
                             const int32_t *targets, int N, int V, float scale)
{
    c->be->crossentropy_fwd_bwd(c, losses, dlogits, logits, targets, N, V, scale);
}

void kn_adamw(kn_ctx *c, float *p, const float *g, float *m, float *v, size_t n, float lr,
              float b1, float b2, float eps, float wd, int64_t t)
{
    c->be->adamw(c, p, g, m, v, n, lr, b1, b2, eps, wd, t);
}
