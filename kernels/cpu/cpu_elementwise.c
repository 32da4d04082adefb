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
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 8192

void cpu_thread_range(size_t n, size_t align, size_t *lo, size_t *hi)
{
    size_t me = (size_t)omp_get_thread_num(), cnt = (size_t)omp_get_num_threads();
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

void cpu_scale(kn_ctx *c, float *x, size_t n, float s)
{
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (n > CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

void cpu_axpy(kn_ctx *c, float *y, const float *x, size_t n, float a)
{
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (n > CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

static void add_f32(kn_ctx *c, float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (n > CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void cpu_add(kn_ctx *c, kn_dtype dt, void *out, const void *a, const void *b, size_t n)
{
    if (dt == KN_F32) {
        add_f32(c, out, a, b, n);
        return;
    }
#pragma omp parallel num_threads(cpu_threads_for(c, n))
    {
        size_t lo, hi;
        cpu_thread_range(n, 32, &lo, &hi);
        float ba[CPU_EW_BLOCK], bb[CPU_EW_BLOCK], bo[CPU_EW_BLOCK];
        for (size_t i = lo; i < hi; i += CPU_EW_BLOCK) {
            size_t m = hi - i < CPU_EW_BLOCK ? hi - i : CPU_EW_BLOCK;
            const float *x = cpu_in(ba, a, dt, i, m), *y = cpu_in(bb, b, dt, i, m);
            for (size_t j = 0; j < m; j++)
                bo[j] = x[j] + y[j];
            cpu_out(out, dt, i, bo, m);
        }
    }
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
#pragma omp parallel for schedule(static) num_threads(c->n_threads)
    for (size_t k = 0; k < nchunks; k++) {
        size_t lo = k * CHUNK, len = n - lo < CHUNK ? n - lo : CHUNK;
        part[k] = chunk_sum(x + lo, len, sq, s);
    }
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

int cpu_nonfinite(kn_ctx *c, const float *x, size_t n)
{
    int bad = 0;
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (n > CPU_PAR_MIN)           \
    reduction(|                                                                                    \
              : bad)
    for (size_t i = 0; i < n; i++)
        bad |= !isfinite(x[i]);
    return bad;
}

/* ---- embedding -------------------------------------------------------- */

/* out and table both of type dt: a gathered row is copied as is (exact in
 * any type); with accumulate, out = round(out + row) in fp32. */
void cpu_embedding_fwd(kn_ctx *c, kn_dtype dt, void *out, const int32_t *ids, const void *table,
                       int N, int C, int accumulate)
{
    size_t es = kn_dtype_size(dt);
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if ((size_t)N * C > CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
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

/* Rows of dtable may repeat in ids, so threads split the C columns: each
 * column is summed over n in order by one thread — no atomics, and the
 * result does not depend on the thread count. */
void cpu_embedding_bwd(kn_ctx *c, float *dtable, const int32_t *ids, const float *dout, int N,
                       int C)
{
    int nt = c->n_threads;
    if ((size_t)N * C <= CPU_PAR_MIN || C < 32) nt = 1;
#pragma omp parallel num_threads(nt)
    {
        int me = omp_get_thread_num(), cnt = omp_get_num_threads();
        /* Column ranges in 16-float (64-byte) units so threads never share a line. */
        int units = (C + 15) / 16;
        int lo = (int)((long)units * me / cnt) * 16;
        int hi = (int)((long)units * (me + 1) / cnt) * 16;
        if (hi > C) hi = C;
        for (int n = 0; n < N; n++) {
            float *d = dtable + (size_t)ids[n] * C;
            const float *g = dout + (size_t)n * C;
            for (int i = lo; i < hi; i++)
                d[i] += g[i];
        }
    }
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
void cpu_gelu_fwd(kn_ctx *c, kn_dtype dt, void *out, const void *x, size_t n)
{
#pragma omp parallel num_threads(cpu_threads_for(c, n))
    {
        size_t lo, hi;
        cpu_thread_range(n, 32, &lo, &hi);
        if (dt == KN_F32)
            gelu_fwd_range((float *)out + lo, (const float *)x + lo, hi - lo);
        else {
            float bx[CPU_EW_BLOCK], bo[CPU_EW_BLOCK];
            for (size_t i = lo; i < hi; i += CPU_EW_BLOCK) {
                size_t m = hi - i < CPU_EW_BLOCK ? hi - i : CPU_EW_BLOCK;
                gelu_fwd_range(bo, cpu_in(bx, x, dt, i, m), m);
                cpu_out(out, dt, i, bo, m);
            }
        }
    }
}

/* dx (+)= dout * gelu'(x) over n elements of x's dtype; acc 1 adds into
 * dx (kn_gelu_bwd), 0 overwrites it (the fused matmul_dgelu's dpre). */
static void gelu_bwd_n(kn_ctx *c, kn_dtype dt, float *dx, const float *dout, const void *x,
                       size_t n, int acc)
{
#pragma omp parallel num_threads(cpu_threads_for(c, n))
    {
        size_t lo, hi;
        cpu_thread_range(n, 32, &lo, &hi);
        if (dt == KN_F32)
            gelu_bwd_range(dx + lo, dout + lo, (const float *)x + lo, hi - lo, acc);
        else {
            float bx[CPU_EW_BLOCK];
            for (size_t i = lo; i < hi; i += CPU_EW_BLOCK) {
                size_t m = hi - i < CPU_EW_BLOCK ? hi - i : CPU_EW_BLOCK;
                gelu_bwd_range(dx + i, dout + i, cpu_in(bx, x, dt, i, m), m, acc);
            }
        }
    }
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
            dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        }
    if (dup)
#pragma omp simd
        for (size_t i = 0; i < n; i++) {
            float g = gate[i];
            dup[i] += dout[i] * (g / (1.0f + cpu_expf(-g)));
        }
}

void cpu_swiglu_fwd(kn_ctx *c, kn_dtype dt, void *out, const void *gate, const void *up, size_t n)
{
#pragma omp parallel num_threads(cpu_threads_for(c, n))
    {
        size_t lo, hi;
        cpu_thread_range(n, 32, &lo, &hi);
        if (dt == KN_F32)
            swiglu_fwd_range((float *)out + lo, (const float *)gate + lo, (const float *)up + lo,
                             hi - lo);
        else {
            float bg[CPU_EW_BLOCK], bu[CPU_EW_BLOCK], bo[CPU_EW_BLOCK];
            for (size_t i = lo; i < hi; i += CPU_EW_BLOCK) {
                size_t m = hi - i < CPU_EW_BLOCK ? hi - i : CPU_EW_BLOCK;
                swiglu_fwd_range(bo, cpu_in(bg, gate, dt, i, m), cpu_in(bu, up, dt, i, m), m);
                cpu_out(out, dt, i, bo, m);
            }
        }
    }
}

void cpu_swiglu_bwd(kn_ctx *c, kn_dtype dt, float *dgate, float *dup, const float *dout,
                    const void *gate, const void *up, size_t n)
{
#pragma omp parallel num_threads(cpu_threads_for(c, n))
    {
        size_t lo, hi;
        cpu_thread_range(n, 32, &lo, &hi);
        if (dt == KN_F32)
            swiglu_bwd_range(dgate ? dgate + lo : NULL, dup ? dup + lo : NULL, dout + lo,
                             (const float *)gate + lo, (const float *)up + lo, hi - lo);
        else {
            float bg[CPU_EW_BLOCK], bu[CPU_EW_BLOCK];
            for (size_t i = lo; i < hi; i += CPU_EW_BLOCK) {
                size_t m = hi - i < CPU_EW_BLOCK ? hi - i : CPU_EW_BLOCK;
                swiglu_bwd_range(dgate ? dgate + i : NULL, dup ? dup + i : NULL, dout + i,
                                 cpu_in(bg, gate, dt, i, m), cpu_in(bu, up, dt, i, m), m);
            }
        }
    }
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
            dgate[i] += dout[i] * up[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
        if (dup) dup[i] += dout[i] * 0.5f * v * (1.0f + th);
    }
}

void cpu_geglu_fwd(kn_ctx *c, kn_dtype dt, void *out, const void *gate, const void *up, size_t n)
{
#pragma omp parallel num_threads(cpu_threads_for(c, n))
    {
        size_t lo, hi;
        cpu_thread_range(n, 32, &lo, &hi);
        if (dt == KN_F32)
            geglu_fwd_range((float *)out + lo, (const float *)gate + lo, (const float *)up + lo,
                            hi - lo);
        else {
            float bg[CPU_EW_BLOCK], bu[CPU_EW_BLOCK], bo[CPU_EW_BLOCK];
            for (size_t i = lo; i < hi; i += CPU_EW_BLOCK) {
                size_t m = hi - i < CPU_EW_BLOCK ? hi - i : CPU_EW_BLOCK;
                geglu_fwd_range(bo, cpu_in(bg, gate, dt, i, m), cpu_in(bu, up, dt, i, m), m);
                cpu_out(out, dt, i, bo, m);
            }
        }
    }
}

void cpu_geglu_bwd(kn_ctx *c, kn_dtype dt, float *dgate, float *dup, const float *dout,
                   const void *gate, const void *up, size_t n)
{
    if (!dgate && !dup) return;
#pragma omp parallel num_threads(cpu_threads_for(c, n))
    {
        size_t lo, hi;
        cpu_thread_range(n, 32, &lo, &hi);
        if (dt == KN_F32)
            geglu_bwd_range(dgate ? dgate + lo : NULL, dup ? dup + lo : NULL, dout + lo,
                            (const float *)gate + lo, (const float *)up + lo, hi - lo);
        else {
            float bg[CPU_EW_BLOCK], bu[CPU_EW_BLOCK];
            for (size_t i = lo; i < hi; i += CPU_EW_BLOCK) {
                size_t m = hi - i < CPU_EW_BLOCK ? hi - i : CPU_EW_BLOCK;
                geglu_bwd_range(dgate ? dgate + i : NULL, dup ? dup + i : NULL, dout + i,
                                cpu_in(bg, gate, dt, i, m), cpu_in(bu, up, dt, i, m), m);
            }
        }
    }
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
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (n > CPU_PAR_MIN)
    for (size_t blk = 0; blk < nb; blk++) {
        size_t i0 = blk * CPU_EW_BLOCK, m = n - i0 < CPU_EW_BLOCK ? n - i0 : CPU_EW_BLOCK;
        float bx[CPU_EW_BLOCK], bo[CPU_EW_BLOCK];
        const float *xs = cpu_in(bx, x, dt, i0, m);
        float *os = cpu_out_buf(bo, out, dt, i0);
        for (size_t j = 0; j < m; j++) {
            size_t i = i0 + j;
            uint64_t z = mix64(key + (offset + i + 1) * 0x9e3779b97f4a7c15ULL);
            float u = (float)(z >> 40) * (1.0f / 16777216.0f);
            uint8_t keep = u >= p;
            if (mask) mask[i] = keep;
            os[j] = keep ? xs[j] * keep_scale : 0.0f;
        }
        cpu_out(out, dt, i0, os, m);
    }
}

void cpu_dropout_bwd(kn_ctx *c, float *dx, const float *dout, const uint8_t *mask, size_t n,
                     float p)
{
    if (p <= 0.0f) {
        cpu_axpy(c, dx, dout, n, 1.0f);
        return;
    }
    float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (n > CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        dx[i] += mask[i] ? dout[i] * keep_scale : 0.0f;
}

/* ---- DoRA ------------------------------------------------------------- */

void cpu_dora_norm(kn_ctx *c, float *g, float *norm, const float *w, const float *d,
                   const float *mag, float s, int M, int K)
{
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if ((size_t)M * K > CPU_PAR_MIN)
    for (int o = 0; o < M; o++) {
        const float *wr = w + (size_t)o * K, *dr = d + (size_t)o * K;
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            float v = wr[k] + s * dr[k];
            acc += v * v;
        }
        norm[o] = sqrtf(acc);
        if (g) g[o] = mag[o] / norm[o];
    }
}

void cpu_dora_fwd(kn_ctx *c, float *out, float *z, const float *y, const float *b, const float *lr,
                  const float *g, float s, int N, int M)
{
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if ((size_t)N * M > CPU_PAR_MIN)
    for (int n = 0; n < N; n++)
        for (int o = 0; o < M; o++) {
            size_t i = (size_t)n * M + o;
            float yb = y ? y[i] : b ? out[i] - b[o] : out[i], l = lr[i];
            z[i] = yb + l * s;
            out[i] = out[i] + ((g[o] - 1.0f) * yb + (g[o] * l) * s);
        }
}

void cpu_dora_bwd(kn_ctx *c, float *dlr, float *dy, float *dmag, const float *dout, const float *z,
                  const float *g, const float *norm, float s, int N, int M)
{
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if ((size_t)N * M > CPU_PAR_MIN)
    for (int o = 0; o < M; o++) {
        float acc = 0.0f;
        for (int n = 0; n < N; n++) {
            size_t i = (size_t)n * M + o;
            if (dlr) dlr[i] = (dout[i] * g[o]) * s;
            if (dy) dy[i] = dout[i] * (g[o] - 1.0f);
            acc += dout[i] * z[i];
        }
        if (dmag) dmag[o] += acc / norm[o];
    }
}
