/* kernels.h — every tensor operation the engine uses, for two devices.
 *
 * This is the only interface between model code (engine/) and a device.
 * Each operation is declared once here and implemented twice, with the same
 * semantics: kernels/cpu (C, OpenMP, OpenBLAS sgemm) and kernels/cuda
 * (CUDA C, cuBLASLt, fp32 accumulation). kernels.c dispatches on the
 * context's device through a table of function pointers (kn_backend).
 *
 * Conventions (llm.c style: raw pointers plus sizes, shapes in comments):
 *  - All tensors are fp32, row-major, contiguous unless a leading dimension
 *    (`ld*`, in elements) is given. Pointers are device pointers obtained
 *    from kn_alloc on the same context.
 *  - Linear weights are stored as nn.Linear does: w[out, in]; y = x w^T + b.
 *    (GPT-2's Conv1D [in, out] weights are transposed at load and export.)
 *  - Every *_bwd ACCUMULATES (+=) into each gradient it writes, so gradient
 *    accumulation and residual branches need no extra adds; callers zero
 *    gradient buffers with kn_zero. The one exception is documented
 *    (kn_crossentropy_bwd overwrites dlogits). A NULL gradient pointer means
 *    "not needed" (frozen weights, inputs without grad) and is skipped.
 *  - Results are deterministic for a given thread count: no atomics on
 *    floats, static work partitioning, fixed reduction order. Exact resume
 *    depends on this.
 *  - Reductions that return a number to the host (kn_sumsq, kn_sum) use a
 *    double accumulator. */
#ifndef TY_KERNELS_H
#define TY_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "tyerr.h"

typedef enum { KN_CPU = 0, KN_CUDA = 1 } kn_device;

typedef struct kn_ctx kn_ctx;

/* ---- context and memory ---------------------------------------------- */

/* Opens a context on a device (device_index: GPU ordinal, ignored on CPU).
 * KN_CUDA returns TY_EINVAL with a clear message when the build has no CUDA
 * or no GPU is present. n_threads: CPU threads (0 = OpenMP default). */
int kn_open(kn_ctx **out, kn_device dev, int device_index, int n_threads, ty_err *err);
void kn_close(kn_ctx *c);
kn_device kn_device_of(const kn_ctx *c);
const char *kn_device_name(const kn_ctx *c);     /* "cpu" | "cuda" */
/* One line for logs: device, library and threads, e.g.
 * "cpu: openblas SkylakeX, 2 threads". Owned by the context. */
const char *kn_describe(const kn_ctx *c);

/* Zero-initialised device memory, 64-byte aligned. NULL on failure.
 * kn_free ignores NULL and pointers this context did not allocate;
 * kn_close frees whatever the context still holds. */
void *kn_alloc(kn_ctx *c, size_t bytes);
void kn_free(kn_ctx *c, void *p);
/* Bytes currently / at most allocated through this context. */
size_t kn_bytes_in_use(const kn_ctx *c);
size_t kn_peak_bytes(const kn_ctx *c);
void kn_to_device(kn_ctx *c, void *dst, const void *host_src, size_t bytes);
void kn_to_host(kn_ctx *c, void *host_dst, const void *src, size_t bytes);
/* Waits for queued device work (no-op on CPU). */
void kn_sync(kn_ctx *c);

/* ---- elementwise utilities -------------------------------------------- */

void kn_zero(kn_ctx *c, float *x, size_t n);
void kn_copy(kn_ctx *c, float *dst, const float *src, size_t n);
void kn_scale(kn_ctx *c, float *x, size_t n, float s);                /* x *= s */
void kn_axpy(kn_ctx *c, float *y, const float *x, size_t n, float a);  /* y += a x */
void kn_add(kn_ctx *c, float *out, const float *a, const float *b, size_t n); /* out = a + b */
double kn_sum(kn_ctx *c, const float *x, size_t n);
double kn_sumsq(kn_ctx *c, const float *x, size_t n);                  /* for the global grad norm */
/* 1 if any element is NaN or inf. */
int kn_nonfinite(kn_ctx *c, const float *x, size_t n);

/* ---- embedding -------------------------------------------------------- */

/* out[N,C] (+)= table[ids[n], :]. accumulate=0 overwrites, 1 adds
 * (GPT-2: token embedding, then position embedding with accumulate=1).
 * ids are host-visible int32 on CPU, device int32 on CUDA (kn_alloc'd). */
void kn_embedding_fwd(kn_ctx *c, float *out, const int32_t *ids, const float *table,
                      int N, int C, int accumulate);
/* dtable[ids[n], :] += dout[n, :] (deterministic: parallel over C, not N). */
void kn_embedding_bwd(kn_ctx *c, float *dtable, const int32_t *ids, const float *dout, int N, int C);

/* ---- normalisation ---------------------------------------------------- */

/* out[N,C] = (x - mean) * rstd * w + b; saves mean[N], rstd[N]. b may be NULL. */
void kn_layernorm_fwd(kn_ctx *c, float *out, float *mean, float *rstd, const float *x,
                      const float *w, const float *b, int N, int C, float eps);
void kn_layernorm_bwd(kn_ctx *c, float *dx, float *dw, float *db, const float *dout,
                      const float *x, const float *w, const float *mean, const float *rstd,
                      int N, int C);
/* out[N,C] = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); saves rstd[N]. */
void kn_rmsnorm_fwd(kn_ctx *c, float *out, float *rstd, const float *x, const float *w,
                    int N, int C, float eps);
void kn_rmsnorm_bwd(kn_ctx *c, float *dx, float *dw, const float *dout, const float *x,
                    const float *w, const float *rstd, int N, int C);

/* ---- matmul ----------------------------------------------------------- */

/* out[N,M] = x[N,K] w[M,K]^T + bias[M]   (bias may be NULL). */
void kn_matmul_fwd(kn_ctx *c, float *out, const float *x, const float *w, const float *bias,
                   int N, int K, int M);
/* dx[N,K] += dout w;  dw[M,K] += dout^T x;  dbias[M] += sum_n dout. Any may be NULL. */
void kn_matmul_bwd(kn_ctx *c, float *dx, float *dw, float *dbias, const float *dout,
                   const float *x, const float *w, int N, int K, int M);

/* ---- attention -------------------------------------------------------- */

/* Rotary position embedding, Hugging Face rotate-half convention, in place on
 * x laid out [B, T, H, D] with row stride ld (elements between tokens):
 * for i < D/2, theta_i = pos * base^(-2i/D), pos = t + pos_offset:
 *   x[i]       = x[i] cos - x[i + D/2] sin
 *   x[i + D/2] = x[i + D/2] cos + x[i] sin                               */
void kn_rope_fwd(kn_ctx *c, float *x, int B, int T, int H, int D, int ld, float base, int pos_offset);
/* The transpose (rotation by -theta), in place on the gradient. */
void kn_rope_bwd(kn_ctx *c, float *dx, int B, int T, int H, int D, int ld, float base, int pos_offset);

/* Causal scaled-dot-product attention with grouped-query heads.
 * q: [B, T, Hq, D] with row stride ldq; k, v: [B, T, Hkv, D] with row stride
 * ldkv (Hq % Hkv == 0; query head h uses kv head h / (Hq / Hkv)). This lets
 * GPT-2's fused qkv output [B, T, 3C] be passed as q = qkv, k = qkv + C,
 * v = qkv + 2C, ldq = ldkv = 3C. out: [B, T, Hq, D] contiguous.
 * att: [B, Hq, T, T] saved softmax probabilities (scale 1/sqrt(D)). */
void kn_attention_fwd(kn_ctx *c, float *out, float *att, const float *q, const float *k,
                      const float *v, int B, int T, int Hq, int Hkv, int D, int ldq, int ldkv);
/* dq, dk, dv use the same layouts/strides as q, k, v; accumulates. */
void kn_attention_bwd(kn_ctx *c, float *dq, float *dk, float *dv, const float *dout,
                      const float *att, const float *q, const float *k, const float *v,
                      int B, int T, int Hq, int Hkv, int D, int ldq, int ldkv);

/* ---- activations ------------------------------------------------------ */

/* GELU, tanh approximation (GPT-2's gelu_new). */
void kn_gelu_fwd(kn_ctx *c, float *out, const float *x, size_t n);
void kn_gelu_bwd(kn_ctx *c, float *dx, const float *dout, const float *x, size_t n);
/* out = silu(gate) * up (Llama MLP). */
void kn_swiglu_fwd(kn_ctx *c, float *out, const float *gate, const float *up, size_t n);
void kn_swiglu_bwd(kn_ctx *c, float *dgate, float *dup, const float *dout, const float *gate,
                   const float *up, size_t n);
/* Inverted dropout: out = x * mask / (1-p), mask[i] in {0,1} drawn from
 * (seed, offset + i) by a counter-based generator, so it is the same on both
 * devices and reproducible on resume. p == 0 copies. */
void kn_dropout_fwd(kn_ctx *c, float *out, uint8_t *mask, const float *x, size_t n, float p,
                    uint64_t seed, uint64_t offset);
void kn_dropout_bwd(kn_ctx *c, float *dx, const float *dout, const uint8_t *mask, size_t n, float p);

/* ---- loss ------------------------------------------------------------- */

/* losses[N] = -log softmax(logits[n])[targets[n]], 0 where targets[n] == -100.
 * targets: int32, same memory rules as embedding ids. Returns nothing; sum
 * with kn_sum. probs are not saved (recomputed in the backward). */
void kn_crossentropy_fwd(kn_ctx *c, float *losses, const float *logits, const int32_t *targets,
                         int N, int V);
/* dlogits[N,V] = (softmax(logits) - onehot(target)) * scale, 0 rows where
 * ignored. OVERWRITES dlogits (it may alias logits to save memory).
 * scale = 1 / (non-ignored targets in the whole optimizer step). */
void kn_crossentropy_bwd(kn_ctx *c, float *dlogits, const float *logits, const int32_t *targets,
                         int N, int V, float scale);

/* Both of the above in one pass over the logits (what a training step needs;
 * about half the memory traffic and exps of calling them in turn):
 * losses as kn_crossentropy_fwd (may be NULL), dlogits as
 * kn_crossentropy_bwd (overwritten; may alias logits). */
void kn_crossentropy_fwd_bwd(kn_ctx *c, float *losses, float *dlogits, const float *logits,
                             const int32_t *targets, int N, int V, float scale);

/* ---- optimizer -------------------------------------------------------- */

/* One AdamW update on n parameters (PyTorch torch.optim.AdamW semantics):
 *   p -= lr * wd * p                      (decoupled decay; wd may be 0)
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
 * step t counts from 1. Call once per parameter group. */
void kn_adamw(kn_ctx *c, float *p, const float *g, float *m, float *v, size_t n, float lr,
              float b1, float b2, float eps, float wd, int64_t t);

#endif
