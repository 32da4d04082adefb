/* cpu_logits.c — the loss head's GEMMs, logits rows ld elements apart.
 *
 * kn_logits_fwd / _bwd are kn_matmul16_* (kn_matmul_* in fp32) for the
 * lm_head with the logits' leading dimension given. The CPU pads nothing
 * (kn_logit_ld is V here), so the engine's calls go straight to those ops
 * with the same bits as before; a wider ld (the kernel table gives one to
 * every backend) goes through a contiguous copy of the logits, which is
 * all a reference needs. */
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

static void dense_fwd(kn_ctx *c, kn_dtype dt, void *out, const void *x, const void *w, int N, int K,
                      int V)
{
    if (dt == KN_F32)
        cpu_matmul_fwd(c, out, x, w, NULL, N, K, V);
    else
        cpu_matmul16_fwd(c, dt, dt, dt, out, x, w, NULL, KN_F32, N, K, V);
}

static void dense_bwd(kn_ctx *c, kn_dtype dt, float *dx, float *dw, const void *dout, const void *x,
                      const void *w, int N, int K, int V)
{
    if (dt == KN_F32)
        cpu_matmul_bwd(c, dx, dw, NULL, dout, x, w, N, K, V);
    else
        cpu_matmul16_bwd(c, dt, dt, dt, dx, dw, NULL, dout, x, w, N, K, V);
}

/* Rows of V elements copied between strides (in elements). */
static void copy_rows(void *dst, int ldd, const void *src, int lds, int N, int V, size_t es)
{
    for (int n = 0; n < N; n++)
        memcpy((char *)dst + (size_t)n * ldd * es, (const char *)src + (size_t)n * lds * es,
               (size_t)V * es);
}

/* The contiguous [N, V] copy a padded call works on; NULL + kn_fail when short. */
static void *dense_buf(kn_ctx *c, int N, int V, int ld, size_t es)
{
    if (ld < V) {
        kn_fail(c, TY_EINVAL, "logits: leading dimension %d < vocabulary %d", ld, V);
        return NULL;
    }
    void *p = malloc((size_t)N * V * es);
    if (!p) kn_fail(c, TY_ENOMEM, "logits: out of memory for %d x %d", N, V);
    return p;
}

void cpu_logits_fwd(kn_ctx *c, kn_dtype dt, void *out, const void *x, const void *w, int N, int K,
                    int V, int ld)
{
    if (N <= 0 || V <= 0) return;
    if (ld == V) {
        dense_fwd(c, dt, out, x, w, N, K, V);
        return;
    }
    size_t es = kn_dtype_size(dt);
    void *tmp = dense_buf(c, N, V, ld, es);
    if (!tmp) return;
    dense_fwd(c, dt, tmp, x, w, N, K, V);
    copy_rows(out, ld, tmp, V, N, V, es);
    free(tmp);
}

void cpu_logits_bwd(kn_ctx *c, kn_dtype dt, float *dx, float *dw, const void *dout, const void *x,
                    const void *w, int N, int K, int V, int ld)
{
    if (N <= 0 || V <= 0) return;
    if (ld == V) {
        dense_bwd(c, dt, dx, dw, dout, x, w, N, K, V);
        return;
    }
    size_t es = kn_dtype_size(dt);
    void *tmp = dense_buf(c, N, V, ld, es);
    if (!tmp) return;
    copy_rows(tmp, V, dout, ld, N, V, es);
    dense_bwd(c, dt, dx, dw, tmp, x, w, N, K, V);
    free(tmp);
}
