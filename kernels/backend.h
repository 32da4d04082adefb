/* backend.h — the function table a device implements, and the context.
 *
 * Internal to kernels/: engine code only sees kernels.h. kernels.c keeps
 * the device-independent parts (argument routing, byte accounting) and
 * forwards every operation to ctx->be, so adding a device means filling one
 * kn_backend and listing it in kn_open; no caller changes. Every op entry
 * has exactly the signature of its kn_* counterpart. */
#ifndef TY_KERNELS_BACKEND_H
#define TY_KERNELS_BACKEND_H

#include "kernels.h"

typedef struct kn_backend {
    const char *name; /* "cpu" | "cuda" */

    /* Device setup on an already zeroed ctx (ctx->n_threads is set);
     * may store private state in ctx->impl and fills ctx->desc (see
     * kn_describe). Returns 0 or TY_E*. */
    int (*open)(kn_ctx *c, int device_index, ty_err *err);
    void (*close)(kn_ctx *c);

    /* Raw device memory: zeroed, 64-byte aligned. Accounting is done by
     * kernels.c, not here. */
    void *(*alloc)(kn_ctx *c, size_t bytes);
    void (*free)(kn_ctx *c, void *p);
    void (*to_device)(kn_ctx *c, void *dst, const void *host_src, size_t bytes);
    void (*to_host)(kn_ctx *c, void *host_dst, const void *src, size_t bytes);
    void (*sync)(kn_ctx *c);

    void (*zero)(kn_ctx *c, float *x, size_t n);
    void (*copy)(kn_ctx *c, float *dst, const float *src, size_t n);
    void (*scale)(kn_ctx *c, float *x, size_t n, float s);
    void (*axpy)(kn_ctx *c, float *y, const float *x, size_t n, float a);
    void (*add)(kn_ctx *c, float *out, const float *a, const float *b, size_t n);
    double (*sum)(kn_ctx *c, const float *x, size_t n);
    double (*sumsq)(kn_ctx *c, const float *x, size_t n);
    int (*nonfinite)(kn_ctx *c, const float *x, size_t n);

    void (*embedding_fwd)(kn_ctx *c, float *out, const int32_t *ids, const float *table,
                          int N, int C, int accumulate);
    void (*embedding_bwd)(kn_ctx *c, float *dtable, const int32_t *ids, const float *dout,
                          int N, int C);

    void (*layernorm_fwd)(kn_ctx *c, float *out, float *mean, float *rstd, const float *x,
                          const float *w, const float *b, int N, int C, float eps);
    void (*layernorm_bwd)(kn_ctx *c, float *dx, float *dw, float *db, const float *dout,
                          const float *x, const float *w, const float *mean,
                          const float *rstd, int N, int C);
    void (*rmsnorm_fwd)(kn_ctx *c, float *out, float *rstd, const float *x, const float *w,
                        int N, int C, float eps);
    void (*rmsnorm_bwd)(kn_ctx *c, float *dx, float *dw, const float *dout, const float *x,
                        const float *w, const float *rstd, int N, int C);

    void (*matmul_fwd)(kn_ctx *c, float *out, const float *x, const float *w,
                       const float *bias, int N, int K, int M);
    void (*matmul_bwd)(kn_ctx *c, float *dx, float *dw, float *dbias, const float *dout,
                       const float *x, const float *w, int N, int K, int M);

    void (*rope_fwd)(kn_ctx *c, float *x, int B, int T, int H, int D, int ld, float base,
                     int pos_offset);
    void (*rope_bwd)(kn_ctx *c, float *dx, int B, int T, int H, int D, int ld, float base,
                     int pos_offset);
    void (*attention_fwd)(kn_ctx *c, float *out, float *att, const float *q, const float *k,
                          const float *v, int B, int T, int Hq, int Hkv, int D, int ldq,
                          int ldkv);
    void (*attention_bwd)(kn_ctx *c, float *dq, float *dk, float *dv, const float *dout,
                          const float *att, const float *q, const float *k, const float *v,
                          int B, int T, int Hq, int Hkv, int D, int ldq, int ldkv);

    void (*gelu_fwd)(kn_ctx *c, float *out, const float *x, size_t n);
    void (*gelu_bwd)(kn_ctx *c, float *dx, const float *dout, const float *x, size_t n);
    void (*swiglu_fwd)(kn_ctx *c, float *out, const float *gate, const float *up, size_t n);
    void (*swiglu_bwd)(kn_ctx *c, float *dgate, float *dup, const float *dout,
                       const float *gate, const float *up, size_t n);
    void (*dropout_fwd)(kn_ctx *c, float *out, uint8_t *mask, const float *x, size_t n,
                        float p, uint64_t seed, uint64_t offset);
    void (*dropout_bwd)(kn_ctx *c, float *dx, const float *dout, const uint8_t *mask,
                        size_t n, float p);

    void (*crossentropy_fwd)(kn_ctx *c, float *losses, const float *logits,
                             const int32_t *targets, int N, int V);
    void (*crossentropy_bwd)(kn_ctx *c, float *dlogits, const float *logits,
                             const int32_t *targets, int N, int V, float scale);
    void (*crossentropy_fwd_bwd)(kn_ctx *c, float *losses, float *dlogits, const float *logits,
                                 const int32_t *targets, int N, int V, float scale);

    void (*adamw)(kn_ctx *c, float *p, const float *g, float *m, float *v, size_t n,
                  float lr, float b1, float b2, float eps, float wd, int64_t t);
} kn_backend;

/* One live allocation, for byte accounting (a side table rather than a
 * header before the block, because device memory is not host-readable). */
typedef struct kn_alloc_slot {
    void *p;
    size_t bytes;
} kn_alloc_slot;

struct kn_ctx {
    kn_device dev;
    const kn_backend *be;
    int n_threads;          /* resolved: always >= 1 */
    void *impl;             /* backend-private state */
    char desc[160];         /* kn_describe's line */
    size_t bytes_in_use;
    size_t peak_bytes;
    kn_alloc_slot *slots;   /* open-addressing table keyed by pointer */
    size_t slot_cap;        /* power of two, 0 before the first alloc */
    size_t slot_used;
};

/* The backends this build contains. */
extern const kn_backend kn_cpu_backend;
#ifdef TY_KN_HAVE_CUDA
extern const kn_backend kn_cuda_backend;
#endif

#endif
