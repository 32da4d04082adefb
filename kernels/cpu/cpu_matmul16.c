/* cpu_matmul16.c — matmul with 16-bit weights: oneDNN's bf16 GEMM, or
 * convert + sgemm.
 *
 * kn_matmul16_* compute what kn_matmul_* compute with w stored in bf16 or
 * fp16 and x / dout holding values that type represents (the engine rounds
 * every activation and activation gradient it produces). Products of such
 * values are exact in fp32 and the sums accumulate in fp32 either way, so
 * the two paths differ only in summation order.
 *
 * Which path is faster was measured (bench/engine-cpu gemm-bf16,
 * docs/benchmarks.md): on a CPU with AVX512-BF16, oneDNN's bf16 matmul
 * (brgemm) beat converting the weights to fp32 for OpenBLAS sgemm by about
 * 2x over the GPT-2 / Llama shapes. So bf16 goes to oneDNN when the build
 * has it (TY_KN_HAVE_DNNL) and oneDNN picks a native implementation for
 * this CPU; where it would only have its slow reference code, and for fp16
 * (no AVX512-FP16 here), the weights are converted into a per-context fp32
 * scratch and the sgemm kernels run. The choice is made once per shape and
 * is the same on every call, so results are deterministic for a thread
 * count, as the fp32 kernels are. oneDNN runs on the context's thread
 * count (omp_set_num_threads before each call). */
#include "cpu.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#ifdef TY_KN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

/* fp32 scratch for the converted weights (and, on the oneDNN path, the
 * bf16 copies of x / dout), grown as needed; NULL + kn_fail when short. */
static void *scratch(kn_ctx *c, int slot, size_t bytes)
{
    cpu_state *st = c->impl;
    if (st->mm_cap[slot] < bytes) {
        void *p = realloc(st->mm_buf[slot], bytes);
        if (!p) {
            kn_fail(c, TY_ENOMEM, "matmul16: out of memory for %zu bytes of scratch", bytes);
            return NULL;
        }
        st->mm_buf[slot] = p;
        st->mm_cap[slot] = bytes;
    }
    return st->mm_buf[slot];
}

#ifdef TY_KN_HAVE_DNNL

enum { MM_FWD, MM_FWD_BIAS, MM_DX, MM_DW, MM_FWD16, MM_FWD16_BIAS }; /* FWD16: bf16 dst */

/* One cached primitive per (kind, N, K, M). */
typedef struct dnnl_mm {
    int kind, N, K, M, native;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t src, wei, bias, dst;
} dnnl_mm;

typedef struct dnnl_state {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_mm *cache;
    int n, cap;
    int broken; /* oneDNN failed to initialise: convert + sgemm only */
} dnnl_state;

static dnnl_state *dn_state(kn_ctx *c)
{
    cpu_state *st = c->impl;
    if (st->dnnl) return st->dnnl;
    dnnl_state *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    if (dnnl_engine_create(&d->eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&d->stream, d->eng, dnnl_stream_default_flags) != dnnl_success)
        d->broken = 1;
    st->dnnl = d;
    return d;
}

/* The cached primitive for this product, creating it on first use; NULL
 * when oneDNN has no native bf16 code for it here (then sgemm is used). */
static dnnl_mm *dn_get(kn_ctx *c, int kind, int N, int K, int M)
{
    dnnl_state *d = dn_state(c);
    if (!d || d->broken) return NULL;
    for (int i = 0; i < d->n; i++)
        if (d->cache[i].kind == kind && d->cache[i].N == N && d->cache[i].K == K &&
            d->cache[i].M == M)
            return d->cache[i].native ? &d->cache[i] : NULL;
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 16;
        dnnl_mm *nc = realloc(d->cache, (size_t)cap * sizeof *nc);
        if (!nc) return NULL;
        d->cache = nc;
        d->cap = cap;
    }
    dnnl_mm *e = &d->cache[d->n++];
    memset(e, 0, sizeof *e);
    e->kind = kind, e->N = N, e->K = K, e->M = M;
    /* Row-major everywhere: tag ab is [rows, cols], ba its transpose. */
    dnnl_dims_t s, w, o;
    dnnl_format_tag_t st_tag = dnnl_ab, wt_tag = dnnl_ab;
    int fwd = kind == MM_FWD || kind == MM_FWD_BIAS || kind == MM_FWD16 || kind == MM_FWD16_BIAS;
    int with_bias = kind == MM_FWD_BIAS || kind == MM_FWD16_BIAS;
    if (fwd) { /* out[N,M] = x[N,K] w[M,K]^T */
        s[0] = N, s[1] = K, w[0] = K, w[1] = M, o[0] = N, o[1] = M, wt_tag = dnnl_ba;
    } else if (kind == MM_DX) { /* dx[N,K] += dout[N,M] w[M,K] */
        s[0] = N, s[1] = M, w[0] = M, w[1] = K, o[0] = N, o[1] = K;
    } else { /* dw[M,K] += dout[N,M]^T x[N,K] */
        s[0] = M, s[1] = N, w[0] = N, w[1] = K, o[0] = M, o[1] = K, st_tag = dnnl_ba;
    }
    dnnl_dims_t b = {1, M};
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    int ok = dnnl_memory_desc_init_by_tag(&e->src, 2, s, dnnl_bf16, st_tag) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&e->wei, 2, w, dnnl_bf16, wt_tag) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&e->dst, 2, o, kind >= MM_FWD16 ? dnnl_bf16 : dnnl_f32,
                                          dnnl_ab) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&e->bias, 2, b, dnnl_f32, dnnl_ab) == dnnl_success &&
             dnnl_primitive_attr_create(&attr) == dnnl_success;
    if (ok && (kind == MM_DX || kind == MM_DW)) /* the backward accumulates: dst += product */
        ok = dnnl_post_ops_create(&po) == dnnl_success &&
             dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    ok = ok && dnnl_matmul_desc_init(&md, &e->src, &e->wei, with_bias ? &e->bias : NULL, &e->dst) ==
                   dnnl_success;
    ok = ok && dnnl_primitive_desc_create(&pd, &md, attr, d->eng, NULL) == dnnl_success;
    if (ok) {
        const char *impl = NULL;
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        /* Only native code is faster than sgemm; the reference loops are not. */
        e->native = impl && strncmp(impl, "ref", 3) != 0;
        ok = !e->native || dnnl_primitive_create(&e->prim, pd) == dnnl_success;
        if (!ok) e->native = 0;
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return e->native ? e : NULL;
}

/* Runs a cached product; 0, or -1 after kn_fail. */
static int dn_run(kn_ctx *c, dnnl_mm *e, const void *src, const void *wei, const float *bias,
                  void *dst)
{
    dnnl_state *d = dn_state(c);
    dnnl_memory_t ms = NULL, mw = NULL, mb = NULL, mo = NULL;
    int ok = dnnl_memory_create(&ms, &e->src, d->eng, (void *)src) == dnnl_success &&
             dnnl_memory_create(&mw, &e->wei, d->eng, (void *)wei) == dnnl_success &&
             dnnl_memory_create(&mo, &e->dst, d->eng, dst) == dnnl_success &&
             (!bias || dnnl_memory_create(&mb, &e->bias, d->eng, (void *)bias) == dnnl_success);
    if (ok) {
        dnnl_exec_arg_t args[4] = {
            {DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, mo}, {DNNL_ARG_BIAS, mb}};
        omp_set_num_threads(c->n_threads);
        ok = dnnl_primitive_execute(e->prim, d->stream, bias ? 4 : 3, args) == dnnl_success &&
             dnnl_stream_wait(d->stream) == dnnl_success;
    }
    dnnl_memory_destroy(ms);
    dnnl_memory_destroy(mw);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(mo);
    if (!ok) kn_fail(c, TY_EINTERNAL, "oneDNN bf16 matmul [%d x %d x %d] failed", e->N, e->K, e->M);
    return ok ? 0 : -1;
}

void cpu_dnnl_free(kn_ctx *c)
{
    cpu_state *st = c->impl;
    dnnl_state *d = st->dnnl;
    if (!d) return;
    for (int i = 0; i < d->n; i++)
        if (d->cache[i].prim) dnnl_primitive_destroy(d->cache[i].prim);
    free(d->cache);
    if (d->stream) dnnl_stream_destroy(d->stream);
    if (d->eng) dnnl_engine_destroy(d->eng);
    free(d);
    st->dnnl = NULL;
}

#else

void cpu_dnnl_free(kn_ctx *c)
{
    (void)c;
}

#endif

/* w (dt) as fp32 in scratch slot 0; NULL after kn_fail. */
static const float *weights_f32(kn_ctx *c, kn_dtype dt, const void *w, size_t n)
{
    if (dt == KN_F32) return w;
    float *w32 = scratch(c, 0, n * sizeof(float));
    if (w32) cpu_convert(c, w32, KN_F32, w, dt, n);
    return w32;
}

/* Rows per block where an fp32 copy of a 16-bit output or dout is
 * needed (the sgemm path): the copy is ROWS x M floats, not N x M. */
#define ROWS 256

/* dbias[M] += the column sums of dout[N,M] (dout_dt), rows in order: the
 * sum kn_matmul_bwd forms, over a 16-bit dout widened ROWS rows at a
 * time into scratch slot 3 (the same bits: each row adds in turn). */
static void bias_grad(kn_ctx *c, float *dbias, const void *dout, kn_dtype dout_dt, int N, int M)
{
    if (dout_dt == KN_F32) {
        cpu_matmul_bwd(c, NULL, NULL, dbias, dout, NULL, NULL, N, 0, M);
        return;
    }
    float *g32 = scratch(c, 3, (size_t)ROWS * M * sizeof(float));
    if (!g32) return;
    size_t es = kn_dtype_size(dout_dt);
    for (int r = 0; r < N; r += ROWS) {
        int n = N - r < ROWS ? N - r : ROWS;
        cpu_convert(c, g32, KN_F32, (const char *)dout + (size_t)r * M * es, dout_dt,
                    (size_t)n * M);
        cpu_matmul_bwd(c, NULL, NULL, dbias, g32, NULL, NULL, n, 0, M);
    }
}

/* Rows [r, r + n) of x (x_dt, K wide) as fp32: x itself for fp32, else
 * widened into scratch slot 2 (ROWS x K floats). */
static const float *x_rows(kn_ctx *c, const void *x, kn_dtype x_dt, int r, int n, int K)
{
    if (x_dt == KN_F32) return (const float *)x + (size_t)r * K;
    float *x32 = scratch(c, 2, (size_t)ROWS * K * sizeof(float));
    if (x32) cpu_convert(c, x32, KN_F32, (const uint16_t *)x + (size_t)r * K, x_dt, (size_t)n * K);
    return x32;
}

/* The bias as fp32: itself, or a 16-bit one widened into scratch slot 4
 * (exact); NULL for none, and after kn_fail. */
static const float *bias_f32(kn_ctx *c, const void *bias, kn_dtype b_dt, int M)
{
    if (!bias || b_dt == KN_F32) return bias;
    float *b = scratch(c, 4, (size_t)M * sizeof(float));
    if (b) cpu_convert(c, b, KN_F32, bias, b_dt, (size_t)M);
    return b;
}

void cpu_matmul16_fwd(kn_ctx *c, kn_dtype dt, kn_dtype out_dt, kn_dtype x_dt, void *out,
                      const void *x, const void *w, const void *bias_in, kn_dtype b_dt, int N,
                      int K, int M)
{
    if (N <= 0 || M <= 0 || !kn_bias_dtype_ok(c, dt, b_dt, "matmul16")) return;
    if (x_dt != KN_F32 && x_dt != dt) {
        kn_fail(c, TY_EINVAL, "matmul16: x is %s but the weights are %s", kn_dtype_name(x_dt),
                kn_dtype_name(dt));
        return;
    }
    const float *bias = bias_f32(c, bias_in, b_dt, M);
    if (bias_in && !bias) return;
    if (N == 1 && K > 0 && cpu_gemv_on()) {
        /* decoding: the weights read once, in 16 bits (cpu_gemv.c); measured
         * faster than oneDNN at one row (docs/benchmarks.md, Generation) */
        const float *x1 = x_rows(c, x, x_dt, 0, 1, K);
        float *o = out_dt == KN_F32 ? out : scratch(c, 3, (size_t)M * sizeof(float));
        if (!x1 || !o) return;
        cpu_gemv(c, dt, o, x1, w, bias, K, M);
        if (o != out) cpu_convert(c, out, out_dt, o, KN_F32, (size_t)M);
        return;
    }
#ifdef TY_KN_HAVE_DNNL
    int kind =
        out_dt == KN_BF16 ? (bias ? MM_FWD16_BIAS : MM_FWD16) : (bias ? MM_FWD_BIAS : MM_FWD);
    dnnl_mm *e = dt == KN_BF16 && K > 0 && (out_dt == KN_F32 || out_dt == KN_BF16)
                     ? dn_get(c, kind, N, K, M)
                     : NULL;
    if (e) {
        const void *x16 = x; /* bf16 x as given; fp32 x (holding bf16 values) converted */
        if (x_dt == KN_F32) {
            void *xc = scratch(c, 1, (size_t)N * K * 2);
            if (!xc) return;
            cpu_convert(c, xc, KN_BF16, x, KN_F32, (size_t)N * K);
            x16 = xc;
        }
        dn_run(c, e, x16, w, bias, out);
        return;
    }
#endif
    const float *w32 = weights_f32(c, dt, w, (size_t)M * K);
    if (!w32) return;
    if (out_dt == KN_F32 && x_dt == KN_F32) {
        cpu_matmul_fwd(c, out, x, w32, bias, N, K, M);
        return;
    }
    /* 16-bit x or out: blocks of ROWS rows, x widened and out rounded per block. */
    size_t es = kn_dtype_size(out_dt);
    float *o32 = out_dt == KN_F32 ? NULL : scratch(c, 3, (size_t)ROWS * M * sizeof(float));
    if (out_dt != KN_F32 && !o32) return;
    for (int r = 0; r < N; r += ROWS) {
        int n = N - r < ROWS ? N - r : ROWS;
        const float *xr = x_rows(c, x, x_dt, r, n, K);
        if (!xr) return;
        float *o = o32 ? o32 : (float *)out + (size_t)r * M;
        cpu_matmul_fwd(c, o, xr, w32, bias, n, K, M);
        if (o32)
            cpu_convert(c, (char *)out + (size_t)r * M * es, out_dt, o32, KN_F32, (size_t)n * M);
    }
}

/* The written dx: zeroed, then the accumulating product (the same bits);
 * for a 16-bit dx_dt into scratch slot 5, then rounded into dx once. */
void cpu_matmul16_dx(kn_ctx *c, kn_dtype dt, kn_dtype dout_dt, kn_dtype dx_dt, void *dx,
                     const void *dout, const void *w, int N, int K, int M)
{
    if (N <= 0 || K <= 0 || !kn_grad_dtype_ok(c, dt, dx_dt, "matmul16_dx")) return;
    size_t nk = (size_t)N * K;
    float *d = dx_dt == KN_F32 ? dx : scratch(c, 5, nk * sizeof(float));
    if (!d) return;
    cpu_zero(c, d, nk);
    if (dt == KN_F32 && dout_dt == KN_F32)
        cpu_matmul_bwd(c, d, NULL, NULL, dout, NULL, w, N, K, M);
    else
        cpu_matmul16_bwd(c, dt, dout_dt, dt, d, NULL, NULL, dout, NULL, w, N, K, M);
    if (d != dx) cpu_convert(c, dx, dx_dt, d, KN_F32, nk);
}

void cpu_matmul16_bwd(kn_ctx *c, kn_dtype dt, kn_dtype dout_dt, kn_dtype x_dt, float *dx, float *dw,
                      float *dbias, const void *dout, const void *x, const void *w, int N, int K,
                      int M)
{
    if (N <= 0 || M <= 0) return;
    if (x_dt != KN_F32 && x_dt != dt) {
        kn_fail(c, TY_EINVAL, "matmul16: x is %s but the weights are %s", kn_dtype_name(x_dt),
                kn_dtype_name(dt));
        return;
    }
#ifdef TY_KN_HAVE_DNNL
    dnnl_mm *ex = dt == KN_BF16 && dx && K > 0 ? dn_get(c, MM_DX, N, K, M) : NULL;
    dnnl_mm *ew = dt == KN_BF16 && dw && K > 0 ? dn_get(c, MM_DW, N, K, M) : NULL;
    if ((ex || ew) && (dout_dt == KN_F32 || dout_dt == KN_BF16) && (ex || !dx) && (ew || !dw)) {
        /* dout as bf16: as given, or converted (fp32 dout holds bf16 values). */
        const void *g16 = dout;
        if (dout_dt == KN_F32) {
            void *g = scratch(c, 1, (size_t)N * M * 2);
            if (!g) return;
            cpu_convert(c, g, KN_BF16, dout, KN_F32, (size_t)N * M);
            g16 = g;
        }
        if (ex && dn_run(c, ex, g16, w, NULL, dx)) return;
        if (ew) {
            const void *x16 = x;
            if (x_dt == KN_F32) {
                void *xc = scratch(c, 2, (size_t)N * K * 2);
                if (!xc) return;
                cpu_convert(c, xc, KN_BF16, x, KN_F32, (size_t)N * K);
                x16 = xc;
            }
            if (dn_run(c, ew, g16, x16, NULL, dw)) return;
        }
        if (dbias) bias_grad(c, dbias, dout, dout_dt, N, M);
        return;
    }
#endif
    const float *w32 = dx ? weights_f32(c, dt, w, (size_t)M * K) : NULL;
    if (dx && !w32) return;
    if (dout_dt == KN_F32 && x_dt == KN_F32) {
        cpu_matmul_bwd(c, dx, dw, dbias, dout, x, w32, N, K, M);
        return;
    }
    /* 16-bit dout or x: widened ROWS rows at a time; dx rows are
     * independent, dw and dbias accumulate block after block (a fixed
     * order). */
    size_t es = kn_dtype_size(dout_dt);
    float *g32 = dout_dt == KN_F32 ? NULL : scratch(c, 3, (size_t)ROWS * M * sizeof(float));
    if (dout_dt != KN_F32 && !g32) return;
    for (int r = 0; r < N; r += ROWS) {
        int n = N - r < ROWS ? N - r : ROWS;
        const float *g = (const float *)dout + (size_t)r * M;
        if (g32) {
            cpu_convert(c, g32, KN_F32, (const char *)dout + (size_t)r * M * es, dout_dt,
                        (size_t)n * M);
            g = g32;
        }
        const float *xr = dw ? x_rows(c, x, x_dt, r, n, K) : NULL;
        if (dw && !xr) return;
        cpu_matmul_bwd(c, dx ? dx + (size_t)r * K : NULL, dw, dbias, g, xr, w32, n, K, M);
    }
}
