/* cpu.h — the CPU backend's operations, shared between its source files.
 *
 * Each function has the signature of its kn_* counterpart in kernels.h;
 * cpu_backend.c puts them in the kn_backend table. Threading rules for all
 * of them: OpenMP `parallel for schedule(static)` with ctx->n_threads, work
 * split so that every output element is written by one thread and every
 * reduction we write runs in an order that does not depend on the thread
 * count (sgemm's own order is OpenBLAS's: fixed per thread count). */
#ifndef TY_KERNELS_CPU_H
#define TY_KERNELS_CPU_H

#include "backend.h"

#include <cblas.h>

/* Per-context state (ctx->impl). */
typedef struct cpu_state {
    /* RoPE cos/sin for positions [0, rope_pos) at (rope_D, rope_base),
     * interleaved [pos][i][cos, sin]: built once, reused by every layer. */
    float *rope_tab;
    int rope_pos, rope_D;
    float rope_base;
} cpu_state;

/* Loops shorter than this run on one thread: the fork costs more. */
#define CPU_PAR_MIN 16384

/* This thread's share [*lo, *hi) of n items, cut in steps of `align` so
 * threads do not share cache lines; must be called inside a parallel region. */
void cpu_thread_range(size_t n, size_t align, size_t *lo, size_t *hi);
/* Threads worth using for n elementwise items (1 below CPU_PAR_MIN). */
int cpu_threads_for(const kn_ctx *c, size_t n);

/* OpenBLAS, loaded once per process (cpu_blas.c). cpu_sgemm is row-major
 * cblas_sgemm on the calling thread only. */
int cpu_blas_init(ty_err *err);
const char *cpu_blas_desc(void);
void cpu_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

void cpu_zero(kn_ctx *c, float *x, size_t n);
void cpu_copy(kn_ctx *c, float *dst, const float *src, size_t n);
void cpu_scale(kn_ctx *c, float *x, size_t n, float s);
void cpu_axpy(kn_ctx *c, float *y, const float *x, size_t n, float a);
void cpu_add(kn_ctx *c, float *out, const float *a, const float *b, size_t n);
double cpu_sum(kn_ctx *c, const float *x, size_t n);
double cpu_sumsq(kn_ctx *c, const float *x, size_t n);
int cpu_nonfinite(kn_ctx *c, const float *x, size_t n);

void cpu_embedding_fwd(kn_ctx *c, float *out, const int32_t *ids, const float *table, int N, int C,
                       int accumulate);
void cpu_embedding_bwd(kn_ctx *c, float *dtable, const int32_t *ids, const float *dout, int N,
                       int C);

void cpu_layernorm_fwd(kn_ctx *c, float *out, float *mean, float *rstd, const float *x,
                       const float *w, const float *b, int N, int C, float eps);
void cpu_layernorm_bwd(kn_ctx *c, float *dx, float *dw, float *db, const float *dout,
                       const float *x, const float *w, const float *mean, const float *rstd,
                       int N, int C);
void cpu_rmsnorm_fwd(kn_ctx *c, float *out, float *rstd, const float *x, const float *w, int N,
                     int C, float eps);
void cpu_rmsnorm_bwd(kn_ctx *c, float *dx, float *dw, const float *dout, const float *x,
                     const float *w, const float *rstd, int N, int C);

void cpu_matmul_fwd(kn_ctx *c, float *out, const float *x, const float *w, const float *bias,
                    int N, int K, int M);
void cpu_matmul_bwd(kn_ctx *c, float *dx, float *dw, float *dbias, const float *dout,
                    const float *x, const float *w, int N, int K, int M);

void cpu_rope_fwd(kn_ctx *c, float *x, int B, int T, int H, int D, int ld, float base,
                  int pos_offset);
void cpu_rope_bwd(kn_ctx *c, float *dx, int B, int T, int H, int D, int ld, float base,
                  int pos_offset);
void cpu_attention_fwd(kn_ctx *c, float *out, float *att, const float *q, const float *k,
                       const float *v, int B, int T, int Hq, int Hkv, int D, int ldq, int ldkv);
void cpu_attention_bwd(kn_ctx *c, float *dq, float *dk, float *dv, const float *dout,
                       const float *att, const float *q, const float *k, const float *v, int B,
                       int T, int Hq, int Hkv, int D, int ldq, int ldkv);

void cpu_gelu_fwd(kn_ctx *c, float *out, const float *x, size_t n);
void cpu_gelu_bwd(kn_ctx *c, float *dx, const float *dout, const float *x, size_t n);
void cpu_swiglu_fwd(kn_ctx *c, float *out, const float *gate, const float *up, size_t n);
void cpu_swiglu_bwd(kn_ctx *c, float *dgate, float *dup, const float *dout, const float *gate,
                    const float *up, size_t n);
void cpu_dropout_fwd(kn_ctx *c, float *out, uint8_t *mask, const float *x, size_t n, float p,
                     uint64_t seed, uint64_t offset);
void cpu_dropout_bwd(kn_ctx *c, float *dx, const float *dout, const uint8_t *mask, size_t n,
                     float p);

void cpu_crossentropy_fwd(kn_ctx *c, float *losses, const float *logits, const int32_t *targets,
                          int N, int V);
void cpu_crossentropy_bwd(kn_ctx *c, float *dlogits, const float *logits, const int32_t *targets,
                          int N, int V, float scale);

void cpu_crossentropy_fwd_bwd(kn_ctx *c, float *losses, float *dlogits, const float *logits,
                              const int32_t *targets, int N, int V, float scale);

void cpu_adamw(kn_ctx *c, float *p, const float *g, float *m, float *v, size_t n, float lr,
               float b1, float b2, float eps, float wd, int64_t t);

#endif
