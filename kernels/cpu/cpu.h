/* cpu.h — the CPU backend's operations, shared between its source files.
 *
 * Each cpu_<op> has the signature of its kn_<op> counterpart (both come
 * from kn_ops.h); cpu_backend.c puts them in the kn_backend table. Threading rules for all
 * of them: jobs on the context's thread pool (cpu_pool.h) with ctx->n_threads,
 * cut as OpenMP's `parallel for schedule(static)` cuts a loop, work
 * split so that every output element is written by one thread and every
 * reduction we write runs in an order that does not depend on the thread
 * count (sgemm's own order is OpenBLAS's: fixed per thread count). */
#ifndef TY_KERNELS_CPU_H
#define TY_KERNELS_CPU_H

#include "backend.h"
#include "cpu_pool.h"

#include <cblas.h>

/* cpu_matmul16.c's scratch buffers: fp32 weights, 16-bit x, fp32 x rows,
 * fp32 out rows, an fp32 bias, the fp32 dx of a 16-bit written dx. */
#define CPU_MM_SLOTS 6

/* Per-context state (ctx->impl). */
typedef struct cpu_state {
    /* RoPE cos/sin for positions [0, rope_pos) at (rope_D, rope_base),
     * interleaved [pos][i][cos, sin]: built once, reused by every layer. */
    float *rope_tab;
    int rope_pos, rope_D;
    float rope_base;
    /* kn_matmul16 scratch (fp32 weights; 16-bit activations) and its
     * oneDNN engine, stream and primitive cache (cpu_matmul16.c). */
    void *mm_buf[CPU_MM_SLOTS];
    size_t mm_cap[CPU_MM_SLOTS];
    struct dnnl_state *dnnl;
    /* kn_nf4_* dequantisation scratch (cpu_nf4.c): one fp32 weight. */
    void *nf4_buf;
    size_t nf4_cap;
    /* The worker threads every parallel kernel runs on (cpu_pool.c). */
    cpu_pool *pool;
} cpu_state;

/* n elements of src (sdt) to dst (ddt) on the calling thread: the body
 * of kn_convert, for ops that widen 16-bit rows inside their own loops. */
void cpu_convert_n(void *dst, kn_dtype ddt, const void *src, kn_dtype sdt, size_t n);
/* x[n] rounded in place to what dt holds (kn_round on one thread's share). */
void cpu_round_n(float *x, size_t n, kn_dtype dt);

/* An fp32 master as bf16 hi (round-to-nearest-even, as kn_convert) plus
 * lo = the rest of its bits as a signed 16-bit number (kn_master_split).
 * The rest is within [-0x8000, 0x8000]; +0x8000 (a tie kept at an even
 * hi) does not fit and becomes 0x7fff: the master moves one ulp towards
 * hi and still rounds to it. NaN masters are not kept exactly. */
#include <string.h>
static inline void cpu_split1(float x, uint16_t *hi, uint16_t *lo)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { /* NaN: quiet, as kn_convert */
        *hi = (uint16_t)((u >> 16) | 0x40u);
        *lo = 0;
        return;
    }
    uint16_t h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    int32_t d = (int32_t)(u - ((uint32_t)h << 16));
    if (d == 0x8000) d = 0x7fff;
    *hi = h;
    *lo = (uint16_t)(int16_t)d;
}
static inline float cpu_join1(uint16_t hi, uint16_t lo)
{
    uint32_t u = ((uint32_t)hi << 16) + (uint32_t)(int32_t)(int16_t)lo;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Activations of type dt seen as fp32 (kn_ops.h: ops take the dtype of
 * their activations). cpu_in: n elements from element `off` of p, widened
 * into buf when dt is 16-bit, p itself when fp32 (no copy: the fp32 code
 * path is unchanged). cpu_out_buf / cpu_out: where an op writes n fp32
 * results, p itself for fp32, else buf, narrowed into p by cpu_out
 * (round to nearest even, once). */
static inline const float *cpu_in(float *buf, const void *p, kn_dtype dt, size_t off, size_t n)
{
    if (dt == KN_F32) return (const float *)p + off;
    cpu_convert_n(buf, KN_F32, (const uint16_t *)p + off, dt, n);
    return buf;
}
/* n elements of an fp32 gradient from element `off` of p as an op of
 * dtype dt reads it: p itself for fp32; for a 16-bit dt rounded to it,
 * in buf (kernels.h: the 16-bit backwards read dout as dt holds it). */
static inline const float *cpu_grad_in(float *buf, const float *p, kn_dtype dt, size_t off,
                                       size_t n)
{
    if (dt == KN_F32) return p + off;
    memcpy(buf, p + off, n * sizeof *buf);
    cpu_round_n(buf, n, dt);
    return buf;
}
/* The same for a gradient stored in p_dt: fp32 (cpu_grad_in), or dt
 * itself (a producer rounded it already: widened into buf). */
static inline const float *cpu_grad_in_as(float *buf, const void *p, kn_dtype p_dt, kn_dtype dt,
                                          size_t off, size_t n)
{
    if (p_dt == KN_F32) return cpu_grad_in(buf, p, dt, off, n);
    return cpu_in(buf, p, p_dt, off, n);
}
static inline float *cpu_out_buf(float *buf, void *p, kn_dtype dt, size_t off)
{
    return dt == KN_F32 ? (float *)p + off : buf;
}
static inline void cpu_out(void *p, kn_dtype dt, size_t off, const float *buf, size_t n)
{
    if (dt != KN_F32) cpu_convert_n((uint16_t *)p + off, dt, buf, KN_F32, n);
}

/* Elements per block where an elementwise op widens 16-bit inputs on the
 * stack (a few KiB per thread). */
#define CPU_EW_BLOCK 512

/* Releases cpu_matmul16.c's oneDNN state (no-op without oneDNN). */
void cpu_dnnl_free(kn_ctx *c);

/* Loops shorter than this run on one thread: the fork costs more. */
#define CPU_PAR_MIN 16384

/* Thread tid's share [*lo, *hi) of n items among nt, cut in steps of
 * `align` so threads do not share cache lines. */
void cpu_thread_range(size_t n, size_t align, int tid, int nt, size_t *lo, size_t *hi);
/* Threads worth using for n elementwise items (1 below CPU_PAR_MIN). */
int cpu_threads_for(const kn_ctx *c, size_t n);

/* OpenBLAS, loaded once per process (cpu_blas.c). cpu_sgemm is row-major
 * cblas_sgemm on the calling thread only. */
int cpu_blas_init(ty_err *err);
const char *cpu_blas_desc(void);
void cpu_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* out[M] = x[K] w[M,K]^T (+ bias) for one row, w in wdt (fp32, bf16,
 * fp16; x rounded to wdt first): the N == 1 case of kn_matmul_fwd and
 * kn_matmul16_fwd (cpu_gemv.c). */
void cpu_gemv(kn_ctx *c, kn_dtype wdt, float *out, const float *x, const void *w, const float *bias,
              int K, int M);
/* 0 when TY_KN_GEMV=off (bench/generate/membw compares the paths). */
int cpu_gemv_on(void);

/* dx = dout * gelu'(x), written, in place allowed (cpu_matmul_gelu.c); x
 * in dt. */
void cpu_gelu_bwd_write(kn_ctx *c, kn_dtype dt, float *dx, const float *dout, const void *x,
                        size_t n);

/* Attention's pieces shared by the fp32 kernel (cpu_attention.c) and the
 * AMX bf16 one (cpu_attention16.c). cpu_att_args: what a tile needs
 * besides its rows and columns; lq / lkv are the row strides of the
 * (possibly widened) q and k, v, ldq / ldkv those of q / dq and k / v /
 * dk / dv, ldo of out and dout. Row i sees keys [cpu_att_lo(i), i]. */
typedef struct cpu_att_args {
    int D, lq, lkv, ldq, ldkv, ldo, window;
    float scale, cap;
} cpu_att_args;
static inline int cpu_att_lo(int i, int window)
{
    return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
}
float cpu_att_softmax_row(float *s, int lo, int i, int w, float cap);
const float *cpu_att_head_rows(float *buf, const void *x, kn_dtype dt, size_t off, int T, int D,
                               int ld, int *ldf);
void cpu_att_rowdot(float *dst, const float *gb, const float *ob, int T, int D, int ldo, int lo);
void cpu_att_bwd_probs(float *s, float *tg, const float *lb, int i0, int rows, int j0, int cols,
                       const cpu_att_args *x);
void cpu_att_bwd_dscores(const float *s, float *dp, const float *tg, const float *db, int i0,
                         int rows, int cols, const cpu_att_args *x);
/* The AMX path: 1 when this CPU and kernel give it (and TY_CPU_ATTENTION is
 * not fp32). The _fwd / _bwd take bf16 q, k, v, out; the backward's dO must
 * hold bf16 values (cpu_attention_bwd rounds it). */
int cpu_att16_on(void);
void cpu_att16_fwd(kn_ctx *c, void *out, float *lse, const void *q, const void *k, const void *v,
                   int B, int Tq, int Tk, int Hq, int Hkv, int ldq, int ldkv, const cpu_att_args *x,
                   int nt);
void cpu_att16_bwd(kn_ctx *c, float *dq, float *dk, float *dv, const float *dout, const void *out,
                   const float *lse, const void *q, const void *k, const void *v, int B, int T,
                   int Hq, int Hkv, const cpu_att_args *x, int nt);

/* One cpu_<op> per op of kn_ops.h, with its kn_* signature; cpu_backend.c
 * builds the table from the same list. */
#define KN_CPU_PROTO(ret, name, params, args) ret cpu_##name params;
KN_OPS(KN_CPU_PROTO)
#undef KN_CPU_PROTO

#endif
