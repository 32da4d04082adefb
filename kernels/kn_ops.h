/* kn_ops.h — the one list of kernel operations.
 *
 * Every tensor operation is written here once, as
 *     X(return type, name, (parameters), (arguments))
 * and everything else is generated from this list: the kn_* prototypes in
 * kernels.h, the function-pointer table a device fills (struct kn_backend
 * in backend.h) and the dispatching kn_* definitions in kernels.c. Adding
 * an op is one line here plus one function per backend; a backend that
 * forgets it fails to compile its table (designated initialisers are
 * checked by kn_open at run time too: a NULL entry is a TY_EINVAL there).
 *
 * The first parameter is always `kn_ctx *c`. Return types are single
 * tokens (void, int, double) so the generators can paste them. Semantics,
 * shapes and the accumulate convention are documented in kernels.h and
 * docs/kernels.md.
 *
 * Activations carry their storage type: an op's `kn_dtype dt` is the type
 * of every `void *` activation it reads or writes (fp32, or bf16 / fp16
 * stored on 16 bits); arithmetic is fp32 inside the op and a 16-bit store
 * rounds to nearest even once. Gradients (`float *dx`, `dout`...), norm
 * weights and per-row statistics (mean, rstd, lse) stay fp32: the engine
 * keeps one layer's activation gradients, so they cost O(N C), not O(L N C),
 * and summing several contributions into one fp32 buffer rounds once. The
 * written gradients whose only reader is a 16-bit GEMM (attention's, the
 * gated MLPs') take `kn_dtype g_dt`: fp32, or dt, rounded once as stored.
 * With dt = KN_F32 every op runs its fp32 code unchanged (same bits). */
#ifndef TY_KN_OPS_H
#define TY_KN_OPS_H

/* clang-format off */
#define KN_OPS(X)                                                                                  \
    /* elementwise utilities */                                                                    \
    X(void, zero, (kn_ctx *c, float *x, size_t n), (c, x, n))                                      \
    X(void, copy, (kn_ctx *c, float *dst, const float *src, size_t n), (c, dst, src, n))           \
    X(void, scale, (kn_ctx *c, float *x, size_t n, float s), (c, x, n, s))                         \
    X(void, axpy, (kn_ctx *c, float *y, const float *x, size_t n, float a), (c, y, x, n, a))       \
    X(void, add, (kn_ctx *c, kn_dtype dt, void *out, const void *a, const void *b, size_t n),      \
      (c, dt, out, a, b, n))                                                                           \
    X(double, sum, (kn_ctx *c, const float *x, size_t n), (c, x, n))                               \
    X(double, sumsq, (kn_ctx *c, const float *x, size_t n), (c, x, n))                             \
    X(int, nonfinite, (kn_ctx *c, const float *x, size_t n), (c, x, n))                            \
    X(double, sumsq_scaled, (kn_ctx *c, const float *x, size_t n, float s), (c, x, n, s))          \
    /* storage types */                                                                            \
    X(void, convert, (kn_ctx *c, void *dst, kn_dtype dst_dt, const void *src, kn_dtype src_dt,     \
      size_t n), (c, dst, dst_dt, src, src_dt, n))                                                 \
    X(void, convert_spans, (kn_ctx *c, void *dst, kn_dtype dst_dt, const void *src,              \
      kn_dtype src_dt, const kn_span *s, int ns), (c, dst, dst_dt, src, src_dt, s, ns))            \
    X(void, round, (kn_ctx *c, float *x, size_t n, kn_dtype dt), (c, x, n, dt))                    \
    X(void, master_split, (kn_ctx *c, uint16_t *hi, uint16_t *lo, const float *x, size_t n),       \
      (c, hi, lo, x, n))                                                                           \
    X(void, master_join, (kn_ctx *c, float *x, const uint16_t *hi, const uint16_t *lo, size_t n),  \
      (c, x, hi, lo, n))                                                                           \
    /* embedding */                                                                                \
    X(void, embedding_fwd, (kn_ctx *c, kn_dtype dt, void *out, const int32_t *ids,                 \
      const void *table, int N, int C, int accumulate), (c, dt, out, ids, table, N, C, accumulate))                        \
    X(void, embedding_bwd, (kn_ctx *c, float *dtable, const int32_t *ids, const float *dout,       \
      int N, int C), (c, dtable, ids, dout, N, C))                                                 \
    /* normalisation */                                                                            \
    X(void, layernorm_fwd, (kn_ctx *c, kn_dtype dt, void *out, float *mean, float *rstd,           \
      const void *x, const float *w, const float *b, int N, int C, float eps),                     \
      (c, dt, out, mean, rstd, x, w, b, N, C, eps))                                                    \
    X(void, layernorm_bwd, (kn_ctx *c, kn_dtype dt, float *dx, void *dx_dt, float *dw, float *db, \
      const void *dout, kn_dtype dout_dt, const void *x, const float *w, const float *mean,        \
      const float *rstd, int N, int C), (c, dt, dx, dx_dt, dw, db, dout, dout_dt, x, w, mean, rstd, N, C))                                               \
    X(void, rmsnorm_fwd, (kn_ctx *c, kn_dtype dt, void *out, float *rstd, const void *x,           \
      const float *w, int N, int C, float eps), (c, dt, out, rstd, x, w, N, C, eps))                                   \
    X(void, rmsnorm_bwd, (kn_ctx *c, kn_dtype dt, float *dx, void *dx_dt, float *dw,              \
      const void *dout, kn_dtype dout_dt, const void *x, const float *w, const float *rstd, int N,  \
      int C), (c, dt, dx, dx_dt, dw, dout, dout_dt, x, w, rstd, N, C))       \
    X(void, add_layernorm_fwd, (kn_ctx *c, kn_dtype dt, void *res, void *out, float *mean,       \
      float *rstd, const void *a, const void *b, const float *w, const float *bias, int N, int C,  \
      float eps), (c, dt, res, out, mean, rstd, a, b, w, bias, N, C, eps))                         \
    X(void, add_rmsnorm_fwd, (kn_ctx *c, kn_dtype dt, void *res, void *out, float *rstd,           \
      const void *a, const void *b, const float *w, int N, int C, float eps),                      \
      (c, dt, res, out, rstd, a, b, w, N, C, eps))                                                 \
    /* matmul */                                                                                   \
    X(void, matmul_fwd, (kn_ctx *c, float *out, const float *x, const float *w,                    \
      const float *bias, int N, int K, int M), (c, out, x, w, bias, N, K, M))                      \
    X(void, matmul_bwd, (kn_ctx *c, float *dx, float *dw, float *dbias, const float *dout,         \
      const float *x, const float *w, int N, int K, int M), (c, dx, dw, dbias, dout, x, w, N, K, M)) \
    X(void, matmul16_fwd, (kn_ctx *c, kn_dtype dt, kn_dtype out_dt, kn_dtype x_dt, void *out,      \
      const void *x, const void *w, const void *bias, kn_dtype b_dt, int N, int K, int M),         \
      (c, dt, out_dt, x_dt, out, x, w, bias, b_dt, N, K, M))                                                   \
    X(void, matmul16_bwd, (kn_ctx *c, kn_dtype dt, kn_dtype dout_dt, kn_dtype x_dt, float *dx,     \
      float *dw, float *dbias, const void *dout, const void *x, const void *w, int N, int K,       \
      int M), (c, dt, dout_dt, x_dt, dx, dw, dbias, dout, x, w, N, K, M))                                        \
    X(void, matmul16_dx, (kn_ctx *c, kn_dtype dt, kn_dtype dout_dt, kn_dtype dx_dt, void *dx,      \
      const void *dout, const void *w, int N, int K, int M), (c, dt, dout_dt, dx_dt, dx, dout, w, N, K, M))                 \
    X(void, matmul_gelu_fwd, (kn_ctx *c, kn_dtype dt, kn_dtype out_dt, kn_dtype x_dt, void *out, \
      void *pre, const void *x, const void *w, const void *bias, kn_dtype b_dt, int N, int K,      \
      int M), (c, dt, out_dt, x_dt, out, pre, x, w, bias, b_dt, N, K, M))                                        \
    X(void, matmul_dgelu, (kn_ctx *c, kn_dtype dt, kn_dtype dout_dt, kn_dtype pre_dt, void *dpre,  \
      float *dbias, const void *dout, const void *w, const void *pre, int N, int K, int M),        \
      (c, dt, dout_dt, pre_dt, dpre, dbias, dout, w, pre, N, K, M))                                \
    /* 4-bit NormalFloat weights (QLoRA) */                                                       \
    X(void, nf4_dequant, (kn_ctx *c, void *out, kn_dtype dt, kn_nf4 w, size_t n),                  \
      (c, out, dt, w, n))                                                                          \
    X(void, nf4_matmul_fwd, (kn_ctx *c, kn_dtype dt, float *out, const float *x, kn_nf4 w,         \
      const float *bias, int N, int K, int M), (c, dt, out, x, w, bias, N, K, M))                  \
    X(void, nf4_matmul_bwd, (kn_ctx *c, kn_dtype dt, float *dx, const float *dout, kn_nf4 w,       \
      int N, int K, int M), (c, dt, dx, dout, w, N, K, M))                                         \
    /* attention */                                                                                \
    X(void, rope_fwd, (kn_ctx *c, kn_dtype dt, void *x, int B, int T, int H, int D, int ld,        \
      float base, int pos_offset), (c, dt, x, B, T, H, D, ld, base, pos_offset))                                   \
    X(void, rope_bwd, (kn_ctx *c, kn_dtype dt, void *dx, int B, int T, int H, int D, int ld,       \
      float base, int pos_offset), (c, dt, dx, B, T, H, D, ld, base, pos_offset))                                  \
    X(void, rope_freq_fwd, (kn_ctx *c, kn_dtype dt, void *x, int B, int T, int H, int D, int ld,   \
      const float *inv_freq, int pos_offset), (c, dt, x, B, T, H, D, ld, inv_freq, pos_offset))        \
    X(void, rope_freq_bwd, (kn_ctx *c, kn_dtype dt, void *dx, int B, int T, int H, int D, int ld,  \
      const float *inv_freq, int pos_offset), (c, dt, dx, B, T, H, D, ld, inv_freq, pos_offset))       \
    X(void, attention_fwd, (kn_ctx *c, kn_dtype dt, void *out, float *lse, const void *q,          \
      const void *k, const void *v, int B, int T, int Hq, int Hkv, int D, int ldq, int ldkv,       \
      float scale, float softcap, int window),                                                     \
      (c, dt, out, lse, q, k, v, B, T, Hq, Hkv, D, ldq, ldkv, scale, softcap, window))             \
    X(void, attention_kv_fwd, (kn_ctx *c, kn_dtype dt, void *out, float *lse, const void *q,       \
      const void *k, const void *v, int B, int Tq, int Tk, int Hq, int Hkv, int D, int ldq,        \
      int ldkv, float scale, float softcap, int window),                                           \
      (c, dt, out, lse, q, k, v, B, Tq, Tk, Hq, Hkv, D, ldq, ldkv, scale, softcap, window))        \
    X(void, attention_bwd, (kn_ctx *c, kn_dtype dt, kn_dtype g_dt, void *dq, void *dk, void *dv,   \
      const void *dout, kn_dtype dout_dt, const void *out, const float *lse, const void *q,        \
      const void *k, const void *v, int B, int T, int Hq, int Hkv, int D, int ldq, int ldkv,       \
      float scale, float softcap, int window),                                                     \
      (c, dt, g_dt, dq, dk, dv, dout, dout_dt, out, lse, q, k, v, B, T, Hq, Hkv, D, ldq, ldkv,     \
      scale, softcap, window))                                                                     \
    /* activations */                                                                              \
    X(void, gelu_fwd, (kn_ctx *c, kn_dtype dt, void *out, const void *x, size_t n),                \
      (c, dt, out, x, n))                                                                          \
    X(void, gelu_bwd, (kn_ctx *c, kn_dtype dt, float *dx, const float *dout, const void *x,        \
      size_t n), (c, dt, dx, dout, x, n))                                                          \
    X(void, swiglu_fwd, (kn_ctx *c, kn_dtype dt, void *out, const void *gate, const void *up,      \
      size_t n), (c, dt, out, gate, up, n))                                                        \
    X(void, swiglu_bwd, (kn_ctx *c, kn_dtype dt, kn_dtype g_dt, void *dgate, void *dup,            \
      const void *dout, kn_dtype dout_dt, const void *gate, const void *up, size_t n),             \
      (c, dt, g_dt, dgate, dup, dout, dout_dt, gate, up, n))                                       \
    X(void, geglu_fwd, (kn_ctx *c, kn_dtype dt, void *out, const void *gate, const void *up,       \
      size_t n), (c, dt, out, gate, up, n))                                                        \
    X(void, geglu_bwd, (kn_ctx *c, kn_dtype dt, kn_dtype g_dt, void *dgate, void *dup,             \
      const void *dout, kn_dtype dout_dt, const void *gate, const void *up, size_t n),             \
      (c, dt, g_dt, dgate, dup, dout, dout_dt, gate, up, n))                                       \
    X(void, dropout_fwd, (kn_ctx *c, kn_dtype dt, void *out, uint8_t *mask, const void *x,         \
      size_t n, float p, uint64_t seed, uint64_t offset), (c, dt, out, mask, x, n, p, seed, offset))             \
    X(void, dropout_bwd, (kn_ctx *c, float *dx, const float *dout, const uint8_t *mask,            \
      size_t n, float p), (c, dx, dout, mask, n, p))                                               \
    /* DoRA (PEFT's DoraLinearLayer): see kernels.h */                                             \
    X(void, dora_norm, (kn_ctx *c, float *g, float *norm, const float *w, const float *d,          \
      const float *mag, float s, int M, int K), (c, g, norm, w, d, mag, s, M, K))                  \
    X(void, dora_fwd, (kn_ctx *c, float *out, float *z, const float *y, const float *b,            \
      const float *lr, const float *g, float s, int N, int M), (c, out, z, y, b, lr, g, s, N, M))  \
    X(void, dora_bwd, (kn_ctx *c, float *dlr, float *dy, float *dmag, const float *dout,           \
      const float *z, const float *g, const float *norm, float s, int N, int M),                   \
      (c, dlr, dy, dmag, dout, z, g, norm, s, N, M))                                               \
    /* loss */                                                                                     \
    X(void, crossentropy_fwd, (kn_ctx *c, kn_dtype dt, float *losses, const void *logits,          \
      const int32_t *targets, int N, int V, int ld, float softcap),                                \
      (c, dt, losses, logits, targets, N, V, ld, softcap))                                         \
    X(void, crossentropy_fwd_bwd, (kn_ctx *c, kn_dtype dt, float *losses, void *dlogits,           \
      const void *logits, const int32_t *targets, int N, int V, int ld, float scale,               \
      float softcap), (c, dt, losses, dlogits, logits, targets, N, V, ld, scale, softcap))         \
    X(void, logits_fwd, (kn_ctx *c, kn_dtype dt, void *out, const void *x, const void *w, int N,   \
      int K, int V, int ld), (c, dt, out, x, w, N, K, V, ld))                                      \
    X(void, logits_bwd, (kn_ctx *c, kn_dtype dt, float *dx, float *dw, const void *dout,           \
      const void *x, const void *w, int N, int K, int V, int ld),                                  \
      (c, dt, dx, dw, dout, x, w, N, K, V, ld))                                                    \
    X(void, softcap, (kn_ctx *c, float *x, size_t n, float cap), (c, x, n, cap))                   \
    /* optimizer */                                                                                \
    X(void, adamw, (kn_ctx *c, kn_dtype pdt, void *p, uint16_t *plo, const float *g, float *m,     \
      float *v, size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t),           \
      (c, pdt, p, plo, g, m, v, n, lr, b1, b2, eps, wd, t))                                        \
    X(void, adamw_blocks, (kn_ctx *c, const kn_adamw_block *b, int nb, kn_adamw_hp hp),          \
      (c, b, nb, hp))
/* clang-format on */

#endif
