/* cpu_elementwise.c — elementwise ops, reductions, embedding and dropout.
 *
 * The reductions that return a number (sum, sum of squares) must give the
 * same bits whatever the thread count, because exact resume compares losses
 * and grad norms bit for bit: the input is cut into fixed CHUNK-sized
 * pieces, each summed by one thread into eight fixed double lanes, and the
 * per-chunk results are added on one thread in chunk order. Each lane is a
 * plain sequential sum, so vector width does not change the result either. */
#include "cpu.h"
#include "cpu_math.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 8192

void cpu_thread_range(size_t n, size_t align, int tid, int nt, size_t *lo, size_t *hi)
{
    size_t me = (size_t)tid, cnt = (size_t)nt;
    size_t units = (n + align - 1) / align;
    *lo = units * me / cnt * align;
    *hi = units * (me + 1) / cnt * align;
    if (*lo > n) *lo = n;
    if (*hi > n) *hi = n;
}

int cpu_threads_for(const kn_ctx *c, size_t n)
{
    return n > CPU_PAR_MIN ? c->n_threads : 1;
}

void cpu_zero(kn_ctx *c, float *x, size_t n)
{
    (void)c;
    if (n) memset(x, 0, n * sizeof *x);
}

void cpu_copy(kn_ctx *c, float *dst, const float *src, size_t n)
{
    (void)c;
    if (n && dst != src) memmove(dst, src, n * sizeof *dst);
}

/* The operands of one elementwise job; each op reads the fields it needs. */
typedef struct ew_job {
    kn_dtype dt, g_dt; /* g_dt: the gated backwards' gradients' type */
    kn_dtype gv_dt;    /* gv's type (fp32 or dt): the gated backwards' dout */
    const void *gv;
    void *out;
    float *d1, *d2;
    const void *a, *b;
    const float *g;
    size_t n;
    float s;
    int acc;
} ew_job;

static void scale_range(size_t lo, size_t hi, void *arg)
{
    const ew_job *j = arg;
    float *x = j->out, s = j->s;
    for (size_t i = lo; i < hi; i++)
        x[i] *= s;
}

void cpu_scale(kn_ctx *c, float *x, size_t n, float s)
{
    ew_job j = {.out = x, .s = s};
    cpu_pool_for(c, cpu_threads_for(c, n), n, scale_range, &j);
}

static void axpy_range(size_t lo, size_t hi, void *arg)
{
    const ew_job *j = arg;
    float *y = j->out, a = j->s;
    const float *x = j->a;
    for (size_t i = lo; i < hi; i++)
        y[i] += a * x[i];
}

void cpu_axpy(kn_ctx *c, float *y, const float *x, size_t n, float a)
{
    ew_job j = {.out = y, .a = x, .s = a};
    cpu_pool_for(c, cpu_threads_for(c, n), n, axpy_range, &j);
}

static void add_f32_range(size_t lo, size_t hi, void *arg)
{
    const ew_job *j = arg;
    float *out = j->out;
    const float *a = j->a, *b = j->b;
    for (size_t i = lo; i < hi; i++)
        out[i] = a[i] + b[i];
}

static void add16_job(int tid, int nt, void *arg)
{
    const ew_job *j = arg;
    size_t lo, hi;
    cpu_thread_range(j->n, 32, tid, nt, &lo, &hi);
    float ba[CPU_EW_BLOCK], bb[CPU_EW_BLOCK], bo[CPU_EW_BLOCK];
    for (size_t i = lo; i < hi; i += CPU_EW_BLOCK) {
        size_t m = hi - i < CPU_EW_BLOCK ? hi - i : CPU_EW_BLOCK;
        const float *x = cpu_in(ba, j->a, j->dt, i, m), *y = cpu_in(bb, j->b, j->dt, i, m);
        for (size_t k = 0; k < m; k++)
            bo[k] = x[k] + y[k];
        cpu_out(j->out, j->dt, i, bo, m);
    }
}

void cpu_add(kn_ctx *c, kn_dtype dt, void *out, const void *a, const void *b, size_t n)
{
    ew_job j = {.dt = dt, .out = out, .a = a, .b = b, .n = n};
    if (dt == KN_F32)
        cpu_pool_for(c, cpu_threads_for(c, n), n, add_f32_range, &j);
    else
        cpu_pool_run(c, cpu_threads_for(c, n), add16_job, &j);
}

/* Sum (squared when sq) of one chunk of x[i] * s (an fp32 product: s = 1
 * is x itself) with eight fixed lanes: the lanes give the compiler
 * independent adds to pipeline without changing the order. */
CPU_HOT static double chunk_sum(const float *x, size_t n, int sq, float s)
{
    double lane[8] = {0};
    size_t i = 0;
    /* Two loops, not a test per element: the compiler keeps each one's
     * eight lanes in one vector register. */
    if (sq)
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++) {
                double v = x[i + l] * s;
                lane[l] += v * v;
            }
    else
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++)
                lane[l] += (double)(x[i + l] * s);
    for (; i < n; i++) {
        double v = x[i] * s;
        lane[i & 7] += sq ? v * v : v;
    }
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
           ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

typedef struct sum_job {
    const float *x;
    size_t n;
    double *part;
    int sq;
    float s;
} sum_job;

static void chunks_range(size_t lo, size_t hi, void *arg)
{
    const sum_job *j = arg;
    for (size_t k = lo; k < hi; k++) {
        size_t o = k * CHUNK, len = j->n - o < CHUNK ? j->n - o : CHUNK;
        j->part[k] = chunk_sum(j->x + o, len, j->sq, j->s);
    }
}

static double fixed_order_sum(kn_ctx *c, const float *x, size_t n, int sq, float s)
{
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
    if (nchunks <= 1) return n ? chunk_sum(x, n, sq, s) : 0.0;
    double stackbuf[256];
    double *part = nchunks <= 256 ? stackbuf : malloc(nchunks * sizeof *part);
    if (!part) {
        /* No memory for partials: the same chunks, one thread, same order. */
        double sum = 0;
        for (size_t k = 0; k < nchunks; k++) {
            size_t lo = k * CHUNK, len = n - lo < CHUNK ? n - lo : CHUNK;
            sum += chunk_sum(x + lo, len, sq, s);
        }
        return sum;
    }
    sum_job j = {x, n, part, sq, s};
    cpu_pool_for(c, c->n_threads, nchunks, chunks_range, &j);
    double sum = 0;
    for (size_t k = 0; k < nchunks; k++)
        sum += part[k];
    if (part != stackbuf) free(part);
    return sum;
}

double cpu_sum(kn_ctx *c, const float *x, size_t n)
{
    return fixed_order_sum(c, x, n, 0, 1.0f);
}
double cpu_sumsq(kn_ctx *c, const float *x, size_t n)
{
    return fixed_order_sum(c, x, n, 1, 1.0f);
}
/* Inf or NaN anywhere propagates through the squares and the double sums
 * (finite fp32 squares cannot overflow a double), so no separate check. */
double cpu_sumsq_scaled(kn_ctx *c, const float *x, size_t n, float s)
{
    return fixed_order_sum(c, x, n, 1, s);
}

static void nonfinite_range(size_t lo, size_t hi, void *arg)
{
    const ew_job *j = arg;
    const float *x = j->a;
    int bad = 0;
    for (size_t i = lo; i < hi; i++)
        bad |= !isfinite(x[i]);
    if (bad) __atomic_store_n(&((ew_job *)arg)->acc, 1, __ATOMIC_RELAXED);
}

int cpu_nonfinite(kn_ctx *c, const float *x, size_t n)
{
    ew_job j = {.a = x};
    cpu_pool_for(c, cpu_threads_for(c, n), n, nonfinite_range, &j);
    return j.acc;
}

/* ---- embedding -------------------------------------------------------- */

/* out and table both of type dt: a gathered row is copied as is (exact in
 * any type); with accumulate, out = round(out + row) in fp32. */
typedef struct emb_job {
    kn_dtype dt;
    void *out;
    float *dtable;
    const int32_t *ids;
    const void *table;
    const float *dout;
    int N, C, accumulate;
} emb_job;

static void emb_fwd_range(size_t lo, size_t hi, void *arg)
{
    const emb_job *j = arg;
    kn_dtype dt = j->dt;
    void *out = j->out;
    const void *table = j->table;
    const int32_t *ids = j->ids;
    int C = j->C, accumulate = j->accumulate;
    size_t es = kn_dtype_size(dt);
    for (size_t n = lo; n < hi; n++) {
        size_t oo = (size_t)n * C, ro = (size_t)ids[n] * C;
        if (!accumulate) {
            memcpy((char *)out + oo * es, (const char *)table + ro * es, (size_t)C * es);
        } else if (dt == KN_F32) {
            float *o = (float *)out + oo;
            const float *row = (const float *)table + ro;
            for (int i = 0; i < C; i++)
                o[i] += row[i];
        } else {
            float bo[CPU_EW_BLOCK], br[CPU_EW_BLOCK];
            for (int i = 0; i < C; i += CPU_EW_BLOCK) {
                size_t m = C - i < CPU_EW_BLOCK ? (size_t)(C - i) : CPU_EW_BLOCK;
                const float *o = cpu_in(bo, out, dt, oo + i, m);
                const float *r = cpu_in(br, table, dt, ro + i, m);
                for (size_t j = 0; j < m; j++)
                    bo[j] = o[j] + r[j];
                cpu_out(out, dt, oo + i, bo, m);
            }
        }
    }
}

void cpu_embedding_fwd(kn_ctx *c, kn_dtype dt, void *out, const int32_t *ids, const void *table,
                       int N, int C, int accumulate)
{
    emb_job j = {
        .dt = dt, .out = out, .ids = ids, .table = table, .C = C, .accumulate = accumulate};
    cpu_pool_for(c, cpu_threads_for(c, (size_t)N * C), (size_t)N, emb_fwd_range, &j);
}

/* Rows of dtable may repeat in ids, so threads split the C columns: each
 * column is summed over n in order by one thread — no atomics, and the
 * result does not depend on the thread count. */
static void emb_bwd_job(int me, int cnt, void *arg)
{
    const emb_job *j = arg;
    int C = j->C;
    /* Column ranges in 16-float (64-byte) units so threads never share a line. */
    int units = (C + 15) / 16;
    int lo = (int)((long)units * me / cnt) * 16;
    int hi = (int)((long)units * (me + 1) / cnt) * 16;
    if (hi > C) hi = C;
    for (int n = 0; n < j->N; n++) {
        float *d = j->dtable + (size_t)j->ids[n] * C;
        const float *g = j->dout + (size_t)n * C;
        for (int i = lo; i < hi; i++)
            d[i] += g[i];
    }
}

void cpu_embedding_bwd(kn_ctx *c, float *dtable, const int32_t *ids, const float *dout, int N,
                       int C)
{
    int nt = c->n_threads;
    if ((size_t)N * C <= CPU_PAR_MIN || C < 32) nt = 1;
    emb_job j = {.dtable = dtable, .ids = ids, .dout = dout, .N = N, .C = C};
    cpu_pool_run(c, nt, emb_bwd_job, &j);
}

/* ---- activations ------------------------------------------------------ */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* tanh(u) = 1 - 2 / (e^(2u) + 1): one vectorisable exp, exact limits +-1. */
static inline float tanh_fast(float u)
{
    return 1.0f - 2.0f / (cpu_expf(2.0f * u) + 1.0f);
}

CPU_HOT static void gelu_fwd_range(float *out, const float *x, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + tanh_fast(GELU_K * (v + GELU_A * v * v * v)));
    }
}

/* dx (+)= dout * gelu'(x); acc 0 writes 0 + the product (the same bits as
 * accumulating into a zeroed dx), and dx may then be dout itself. */
CPU_HOT static void gelu_bwd_range(float *dx, const float *dout, const float *x, size_t n, int acc)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float th = tanh_fast(GELU_K * (v + GELU_A * v * v * v));
        float du = GELU_K * (1.0f + 3.0f * GELU_A * v * v);
        float g = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du;
        dx[i] = (acc ? dx[i] : 0.0f) + dout[i] * g;
    }
}

/* The 16-bit forms run the fp32 range functions on blocks widened on the
 * stack (cpu_in / cpu_out): the same arithmetic, one rounding per store. */
static void gelu_fwd_job(int tid, int nt, void *arg)
{
    const ew_job *j = arg;
    kn_dtype dt = j->dt;
    size_t lo, hi;
    cpu_thread_range(j->n, 32, tid, nt, &lo, &hi);
    if (dt == KN_F32) {
        gelu_fwd_range((float *)j->out + lo, (const float *)j->a + lo, hi - lo);
        return;
    }
    float bx[CPU_EW_BLOCK], bo[CPU_EW_BLOCK];
    for (size_t i = lo; i < hi; i += CPU_EW_BLOCK) {
        size_t m = hi - i < CPU_EW_BLOCK ? hi - i : CPU_EW_BLOCK;
        gelu_fwd_range(bo, cpu_in(bx, j->a, dt, i, m), m);
        cpu_out(j->out, dt, i, bo, m);
    }
}

void cpu_gelu_fwd(kn_ctx *c, kn_dtype dt, void *out, const void *x, size_t n)
{
    ew_job j = {.dt = dt, .out = out, .a = x, .n = n};
    cpu_pool_run(c, cpu_threads_for(c, n), gelu_fwd_job, &j);
}

/* dx (+)= dout * gelu'(x) over n elements of x's dtype; acc 1 adds into
 * dx (kn_gelu_bwd), 0 overwrites it (the fused matmul_dgelu's dpre). A
 * 16-bit dtype reads dout rounded to it (kernels.h). */
static void gelu_bwd_job(int tid, int nt, void *arg)
{
    const ew_job *j = arg;
    kn_dtype dt = j->dt;
    size_t lo, hi;
    cpu_thread_range(j->n, 32, tid, nt, &lo, &hi);
    if (dt == KN_F32) {
        gelu_bwd_range(j->d1 + lo, j->g + lo, (const float *)j->a + lo, hi - lo, j->acc);
        return;
    }
    float bx[CPU_EW_BLOCK], bd[CPU_EW_BLOCK];
    for (size_t i = lo; i < hi; i += CPU_EW_BLOCK) {
        size_t m = hi - i < CPU_EW_BLOCK ? hi - i : CPU_EW_BLOCK;
        gelu_bwd_range(j->d1 + i, cpu_grad_in(bd, j->g, dt, i, m), cpu_in(bx, j->a, dt, i, m), m,
                       j->acc);
    }
}

static void gelu_bwd_n(kn_ctx *c, kn_dtype dt, float *dx, const float *dout, const void *x,
                       size_t n, int acc)
{
    ew_job j = {.dt = dt, .d1 = dx, .g = dout, .a = x, .n = n, .acc = acc};
    cpu_pool_run(c, cpu_threads_for(c, n), gelu_bwd_job, &j);
}

void cpu_gelu_bwd(kn_ctx *c, kn_dtype dt, float *dx, const float *dout, const void *x, size_t n)
{
    gelu_bwd_n(c, dt, dx, dout, x, n, 1);
}

void cpu_gelu_bwd_write(kn_ctx *c, kn_dtype dt, float *dx, const float *dout, const void *x,
                        size_t n)
{
    gelu_bwd_n(c, dt, dx, dout, x, n, 0);
}

/* The gated activations (SwiGLU, GeGLU) as jobs: their fp32 range
 * functions on each thread's share, 16-bit operands widened per block
 * (dout rounded to the dtype, or widened from it). The backwards write
 * their gradients. */
typedef void (*gated_fwd_fn)(float *out, const float *gate, const float *up, size_t n);
typedef void (*gated_bwd_fn)(float *dgate, float *dup, const float *dout, const float *gate,
                             const float *up, size_t n);

static void gated_fwd(int tid, int nt, const ew_job *j, gated_fwd_fn f)
{
    kn_dtype dt = j->dt;
    size_t lo, hi;
    cpu_thread_range(j->n, 32, tid, nt, &lo, &hi);
    if (dt == KN_F32) {
        f((float *)j->out + lo, (const float *)j->a + lo, (const float *)j->b + lo, hi - lo);
        return;
    }
    float bg[CPU_EW_BLOCK], bu[CPU_EW_BLOCK], bo[CPU_EW_BLOCK];
    for (size_t i = lo; i < hi; i += CPU_EW_BLOCK) {
        size_t m = hi - i < CPU_EW_BLOCK ? hi - i : CPU_EW_BLOCK;
        f(bo, cpu_in(bg, j->a, dt, i, m), cpu_in(bu, j->b, dt, i, m), m);
        cpu_out(j->out, dt, i, bo, m);
    }
}

/* dgate, dup (d1, d2) in g_dt: fp32 written in place, 16-bit through the
 * block's buffers, narrowed once. */
static void gated_bwd(int tid, int nt, const ew_job *j, gated_bwd_fn f)
{
    kn_dtype dt = j->dt, gdt = j->g_dt;
    void *dgate = j->d1, *dup = j->d2;
    size_t lo, hi;
    cpu_thread_range(j->n, 32, tid, nt, &lo, &hi);
    if (dt == KN_F32) {
        f(dgate ? (float *)dgate + lo : NULL, dup ? (float *)dup + lo : NULL,
          (const float *)j->gv + lo, (const float *)j->a + lo, (const float *)j->b + lo, hi - lo);
        return;
    }
    float bg[CPU_EW_BLOCK], bu[CPU_EW_BLOCK], bd[CPU_EW_BLOCK], og[CPU_EW_BLOCK], ou[CPU_EW_BLOCK];
    for (size_t i = lo; i < hi; i += CPU_EW_BLOCK) {
        size_t m = hi - i < CPU_EW_BLOCK ? hi - i : CPU_EW_BLOCK;
        float *fg = dgate ? cpu_out_buf(og, dgate, gdt, i) : NULL;
        float *fu = dup ? cpu_out_buf(ou, dup, gdt, i) : NULL;
        f(fg, fu, cpu_grad_in_as(bd, j->gv, j->gv_dt, dt, i, m), cpu_in(bg, j->a, dt, i, m),
          cpu_in(bu, j->b, dt, i, m), m);
        if (fg) cpu_out(dgate, gdt, i, fg, m);
        if (fu) cpu_out(dup, gdt, i, fu, m);
    }
}

/* A gated backward's types checked (what names it) and its job run. */
static void gated_bwd_run(kn_ctx *c, const char *what, cpu_job_fn job, kn_dtype dt, kn_dtype g_dt,
                          void *dgate, void *dup, const void *dout, kn_dtype dout_dt,
                          const void *gate, const void *up, size_t n)
{
    if ((!dgate && !dup) || !kn_grad_dtype_ok(c, dt, g_dt, what) ||
        !kn_grad_dtype_ok(c, dt, dout_dt, what))
        return;
    ew_job j = {.dt = dt,
                .g_dt = g_dt,
                .gv_dt = dout_dt,
                .gv = dout,
                .d1 = dgate,
                .d2 = dup,
                .a = gate,
                .b = up,
                .n = n};
    cpu_pool_run(c, cpu_threads_for(c, n), job, &j);
}

CPU_HOT static void swiglu_fwd_range(float *out, const float *gate, const float *up, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + cpu_expf(-g)) * up[i];
    }
}

CPU_HOT static void swiglu_bwd_range(float *dgate, float *dup, const float *dout, const float *gate,
                                     const float *up, size_t n)
{
    if (dgate)
#pragma omp simd
        for (size_t i = 0; i < n; i++) {
            float g = gate[i];
            float s = 1.0f / (1.0f + cpu_expf(-g));
            dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        }
    if (dup)
#pragma omp simd
        for (size_t i = 0; i < n; i++) {
            float g = gate[i];
            dup[i] = dout[i] * (g / (1.0f + cpu_expf(-g)));
        }
}

static void swiglu_fwd_job(int tid, int nt, void *arg)
{
    gated_fwd(tid, nt, arg, swiglu_fwd_range);
}

static void swiglu_bwd_job(int tid, int nt, void *arg)
{
    gated_bwd(tid, nt, arg, swiglu_bwd_range);
}

void cpu_swiglu_fwd(kn_ctx *c, kn_dtype dt, void *out, const void *gate, const void *up, size_t n)
{
    ew_job j = {.dt = dt, .out = out, .a = gate, .b = up, .n = n};
    cpu_pool_run(c, cpu_threads_for(c, n), swiglu_fwd_job, &j);
}

void cpu_swiglu_bwd(kn_ctx *c, kn_dtype dt, kn_dtype g_dt, void *dgate, void *dup, const void *dout,
                    kn_dtype dout_dt, const void *gate, const void *up, size_t n)
{
    gated_bwd_run(c, "swiglu backward", swiglu_bwd_job, dt, g_dt, dgate, dup, dout, dout_dt, gate,
                  up, n);
}

/* GeGLU (Gemma's MLP): out = gelu_tanh(gate) * up, the tanh GELU of
 * kn_gelu_fwd; the backward is gelu's derivative times up, and gelu. */
CPU_HOT static void geglu_fwd_range(float *out, const float *gate, const float *up, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float v = gate[i];
        out[i] = 0.5f * v * (1.0f + tanh_fast(GELU_K * (v + GELU_A * v * v * v))) * up[i];
    }
}

CPU_HOT static void geglu_bwd_range(float *dgate, float *dup, const float *dout, const float *gate,
                                    const float *up, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float v = gate[i];
        float th = tanh_fast(GELU_K * (v + GELU_A * v * v * v));
        float du = GELU_K * (1.0f + 3.0f * GELU_A * v * v);
        if (dgate)
            dgate[i] = dout[i] * up[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
        if (dup) dup[i] = dout[i] * 0.5f * v * (1.0f + th);
    }
}

static void geglu_fwd_job(int tid, int nt, void *arg)
{
    gated_fwd(tid, nt, arg, geglu_fwd_range);
}

static void geglu_bwd_job(int tid, int nt, void *arg)
{
    gated_bwd(tid, nt, arg, geglu_bwd_range);
}

void cpu_geglu_fwd(kn_ctx *c, kn_dtype dt, void *out, const void *gate, const void *up, size_t n)
{
    ew_job j = {.dt = dt, .out = out, .a = gate, .b = up, .n = n};
    cpu_pool_run(c, cpu_threads_for(c, n), geglu_fwd_job, &j);
}

void cpu_geglu_bwd(kn_ctx *c, kn_dtype dt, kn_dtype g_dt, void *dgate, void *dup, const void *dout,
                   kn_dtype dout_dt, const void *gate, const void *up, size_t n)
{
    gated_bwd_run(c, "geglu backward", geglu_bwd_job, dt, g_dt, dgate, dup, dout, dout_dt, gate, up,
                  n);
}

/* ---- dropout ---------------------------------------------------------- */

/* splitmix64's output function. The keep decision for element i is
 * u = top 24 bits of mix(mix(seed) + (offset + i + 1) * golden) / 2^24,
 * keep when u >= p — a pure function of (seed, offset + i), so any thread
 * split, and the CUDA backend, draw the same mask. */
static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct drop_job {
    kn_dtype dt;
    void *out;
    uint8_t *mask;
    const void *x;
    size_t n;
    float p, keep_scale;
    uint64_t key, offset;
} drop_job;

static void dropout_range(size_t lo, size_t hi, void *arg)
{
    const drop_job *d = arg;
    kn_dtype dt = d->dt;
    size_t n = d->n;
    for (size_t blk = lo; blk < hi; blk++) {
        size_t i0 = blk * CPU_EW_BLOCK, m = n - i0 < CPU_EW_BLOCK ? n - i0 : CPU_EW_BLOCK;
        float bx[CPU_EW_BLOCK], bo[CPU_EW_BLOCK];
        const float *xs = cpu_in(bx, d->x, dt, i0, m);
        float *os = cpu_out_buf(bo, d->out, dt, i0);
        for (size_t j = 0; j < m; j++) {
            size_t i = i0 + j;
            uint64_t z = mix64(d->key + (d->offset + i + 1) * 0x9e3779b97f4a7c15ULL);
            float u = (float)(z >> 40) * (1.0f / 16777216.0f);
            uint8_t keep = u >= d->p;
            if (d->mask) d->mask[i] = keep;
            os[j] = keep ? xs[j] * d->keep_scale : 0.0f;
        }
        cpu_out(d->out, dt, i0, os, m);
    }
}

void cpu_dropout_fwd(kn_ctx *c, kn_dtype dt, void *out, uint8_t *mask, const void *x, size_t n,
                     float p, uint64_t seed, uint64_t offset)
{
    if (p <= 0.0f) {
        if (n && out != x) memmove(out, x, n * kn_dtype_size(dt));
        if (mask && n) memset(mask, 1, n);
        return;
    }
    uint64_t key = mix64(seed);
    float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    /* Blocks of CPU_EW_BLOCK elements (any split draws the same mask). */
    size_t nb = (n + CPU_EW_BLOCK - 1) / CPU_EW_BLOCK;
    drop_job d = {dt, out, mask, x, n, p, keep_scale, key, offset};
    cpu_pool_for(c, cpu_threads_for(c, n), nb, dropout_range, &d);
}

static void dropout_bwd_range(size_t lo, size_t hi, void *arg)
{
    const drop_job *d = arg;
    float *dx = d->out;
    const float *dout = d->x;
    for (size_t i = lo; i < hi; i++)
        dx[i] += d->mask[i] ? dout[i] * d->keep_scale : 0.0f;
}

void cpu_dropout_bwd(kn_ctx *c, float *dx, const float *dout, const uint8_t *mask, size_t n,
                     float p)
{
    if (p <= 0.0f) {
        cpu_axpy(c, dx, dout, n, 1.0f);
        return;
    }
    float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    drop_job d = {.out = dx, .mask = (uint8_t *)mask, .x = dout, .keep_scale = keep_scale};
    cpu_pool_for(c, cpu_threads_for(c, n), n, dropout_bwd_range, &d);
}

/* ---- DoRA ------------------------------------------------------------- */

typedef struct dora_job {
    float *g, *norm, *out, *z, *dlr, *dy, *dmag;
    const float *w, *d, *mag, *y, *b, *lr, *dout, *cz, *cg, *cnorm;
    float s;
    int N, M, K;
} dora_job;

static void dora_norm_range(size_t lo, size_t hi, void *arg)
{
    const dora_job *j = arg;
    int K = j->K;
    for (size_t o = lo; o < hi; o++) {
        const float *wr = j->w + o * K, *dr = j->d + o * K;
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            float v = wr[k] + j->s * dr[k];
            acc += v * v;
        }
        j->norm[o] = sqrtf(acc);
        if (j->g) j->g[o] = j->mag[o] / j->norm[o];
    }
}

void cpu_dora_norm(kn_ctx *c, float *g, float *norm, const float *w, const float *d,
                   const float *mag, float s, int M, int K)
{
    dora_job j = {.g = g, .norm = norm, .w = w, .d = d, .mag = mag, .s = s, .M = M, .K = K};
    cpu_pool_for(c, cpu_threads_for(c, (size_t)M * K), M > 0 ? (size_t)M : 0, dora_norm_range, &j);
}

static void dora_fwd_range(size_t lo, size_t hi, void *arg)
{
    const dora_job *j = arg;
    int M = j->M;
    float *out = j->out, s = j->s;
    const float *y = j->y, *b = j->b, *g = j->cg;
    for (size_t n = lo; n < hi; n++)
        for (int o = 0; o < M; o++) {
            size_t i = n * M + o;
            float yb = y ? y[i] : b ? out[i] - b[o] : out[i], l = j->lr[i];
            j->z[i] = yb + l * s;
            out[i] = out[i] + ((g[o] - 1.0f) * yb + (g[o] * l) * s);
        }
}

void cpu_dora_fwd(kn_ctx *c, float *out, float *z, const float *y, const float *b, const float *lr,
                  const float *g, float s, int N, int M)
{
    dora_job j = {.out = out, .z = z, .y = y, .b = b, .lr = lr, .cg = g, .s = s, .N = N, .M = M};
    cpu_pool_for(c, cpu_threads_for(c, (size_t)N * M), N > 0 ? (size_t)N : 0, dora_fwd_range, &j);
}

static void dora_bwd_range(size_t lo, size_t hi, void *arg)
{
    const dora_job *j = arg;
    int N = j->N, M = j->M;
    const float *dout = j->dout, *g = j->cg;
    for (size_t o = lo; o < hi; o++) {
        float acc = 0.0f;
        for (int n = 0; n < N; n++) {
            size_t i = (size_t)n * M + o;
            if (j->dlr) j->dlr[i] = (dout[i] * g[o]) * j->s;
            if (j->dy) j->dy[i] = dout[i] * (g[o] - 1.0f);
            acc += dout[i] * j->cz[i];
        }
        if (j->dmag) j->dmag[o] += acc / j->cnorm[o];
    }
}

void cpu_dora_bwd(kn_ctx *c, float *dlr, float *dy, float *dmag, const float *dout, const float *z,
                  const float *g, const float *norm, float s, int N, int M)
{
    dora_job j = {.dlr = dlr,
                  .dy = dy,
                  .dmag = dmag,
                  .dout = dout,
                  .cz = z,
                  .cg = g,
                  .cnorm = norm,
                  .s = s,
                  .N = N,
                  .M = M};
    cpu_pool_for(c, cpu_threads_for(c, (size_t)N * M), M > 0 ? (size_t)M : 0, dora_bwd_range, &j);
}
