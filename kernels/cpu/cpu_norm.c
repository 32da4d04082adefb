/* cpu_norm.c — LayerNorm (GPT-2) and RMSNorm (Llama), forward and backward.
 *
 * Rows are independent, so the forward and the dx part of the backward run
 * one row per iteration across threads. The weight/bias gradients reduce
 * over rows; threads split the C columns instead and each column is summed
 * over n in order by one thread, so dw and db do not depend on the thread
 * count and need no atomics.
 *
 * Activations (x, out) are of the op's dtype: 16-bit rows are widened into
 * a per-thread fp32 row (two rows of C floats, allocated per call; a
 * failure is a kn_fail) and run through the fp32 code; out is rounded once
 * when stored. Statistics, weights and gradients are fp32; with a 16-bit
 * dtype the backward reads dout rounded to it (into the second row; a dout
 * already in dt is widened there) and
 * stores dx rounded to it, the values a 16-bit gradient holds (and, asked
 * for, the same row again in dt: dx_dt). A dx held in dt alone (dx_dt
 * without dx) is widened into a third row, added to there and stored back
 * rounded: the fp32 path's values. */
#include "cpu.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

/* One norm job's operands (forward or backward, LayerNorm or RMSNorm). */
typedef struct norm_job {
    kn_dtype dt;
    void *out;
    float *mean, *rstd, *dx, *dw, *db;
    void *dx_dt; /* the backward's copy of dx in dt, or dx itself (dx NULL) */
    const void *x;
    const float *w, *b, *cmean, *crstd;
    const void *dout; /* of type dout_dt: fp32, or dt */
    kn_dtype dout_dt;
    int N, C;
    float eps;
    atomic_int failed;
    /* The forward's row n (norm_fwd_job): out row o from x row xr, both
     * fp32, and the row's statistics. */
    void (*fwd_row)(const struct norm_job *j, const float *xr, float *o, size_t n);
    /* The backward's parts (norm_bwd_job): row n's dx added into d from
     * its dout row g and x row xr (both fp32), and the weight (and bias)
     * gradients for columns [lo, hi). */
    void (*dx_row)(const struct norm_job *j, const float *g, const float *xr, float *d, size_t n);
    void (*dw_cols)(const struct norm_job *j, float *buf, int lo, int hi);
} norm_job;

/* n elements of the job's dout from element off, as the backward reads
 * them (cpu_grad_in_as). */
static const float *dout_in(const struct norm_job *j, float *buf, size_t off, size_t n)
{
    return cpu_grad_in_as(buf, j->dout, j->dout_dt, j->dt, off, n);
}

/* Runs job over N rows of C on the pool (one thread below CPU_PAR_MIN
 * elements); a thread short of its row memory fails the op, naming it. */
static void norm_run(kn_ctx *c, norm_job *j, cpu_job_fn job, const char *what)
{
    atomic_init(&j->failed, 0);
    cpu_pool_run(c, (size_t)j->N * j->C > CPU_PAR_MIN ? c->n_threads : 1, job, j);
    if (j->failed) kn_fail(c, TY_ENOMEM, "%s: out of memory for a %d-wide row", what, j->C);
}

/* A thread's fp32 rows for 16-bit activations, two or (dx held in dt)
 * three (NULL for fp32; *failed set when short of memory). */
static float *row_bufs(kn_dtype dt, int C, int rows, int *failed)
{
    if (dt == KN_F32) return NULL;
    float *b = malloc((size_t)rows * (C > 0 ? C : 1) * sizeof *b);
    if (!b) *failed = 1;
    return b;
}

/* [lo, hi) columns of C for thread `me` of `cnt`, in 16-float units. */
static void col_range(int C, int me, int cnt, int *lo, int *hi)
{
    int units = (C + 15) / 16;
    *lo = (int)((long)units * me / cnt) * 16;
    *hi = (int)((long)units * (me + 1) / cnt) * 16;
    if (*lo > C) *lo = C;
    if (*hi > C) *hi = C;
}

/* One forward job: this thread's rows, 16-bit ones widened into its
 * fp32 row and the output rounded once when stored. */
static void norm_fwd_job(int tid, int nt, void *arg)
{
    norm_job *j = arg;
    kn_dtype dt = j->dt;
    int C = j->C, failed = 0;
    float *buf = row_bufs(dt, C, 2, &failed);
    size_t lo, hi;
    cpu_pool_static((size_t)j->N, tid, nt, &lo, &hi);
    if (!failed)
        for (size_t n = lo; n < hi; n++) {
            const float *xr = cpu_in(buf, j->x, dt, n * C, (size_t)C);
            float *o = cpu_out_buf(buf ? buf + C : NULL, j->out, dt, n * C);
            j->fwd_row(j, xr, o, n);
            cpu_out(j->out, dt, n * C, o, (size_t)C);
        }
    free(buf);
    if (failed) atomic_store(&j->failed, 1);
}

static void ln_fwd_row(const norm_job *j, const float *xr, float *o, size_t n)
{
    int C = j->C;
    const float *w = j->w, *b = j->b;
    /* Two passes (mean, then centred variance) avoid the cancellation
     * of E[x^2] - E[x]^2; sums in float like PyTorch, in fixed order. */
    float s = 0.0f;
    for (int i = 0; i < C; i++)
        s += xr[i];
    float m = s / (float)C;
    float v = 0.0f;
    for (int i = 0; i < C; i++) {
        float d = xr[i] - m;
        v += d * d;
    }
    float r = 1.0f / sqrtf(v / (float)C + j->eps);
    for (int i = 0; i < C; i++) {
        float y = (xr[i] - m) * r * w[i];
        o[i] = b ? y + b[i] : y;
    }
    j->mean[n] = m;
    j->rstd[n] = r;
}

void cpu_layernorm_fwd(kn_ctx *c, kn_dtype dt, void *out, float *mean, float *rstd, const void *x,
                       const float *w, const float *b, int N, int C, float eps)
{
    norm_job j = {.dt = dt,
                  .out = out,
                  .mean = mean,
                  .rstd = rstd,
                  .x = x,
                  .w = w,
                  .b = b,
                  .N = N,
                  .C = C,
                  .eps = eps,
                  .fwd_row = ln_fwd_row};
    norm_run(c, &j, norm_fwd_job, "layernorm forward");
}

/* LayerNorm's dx of row n. */
static void ln_dx_row(const norm_job *j, const float *g, const float *xr, float *d, size_t n)
{
    int C = j->C;
    const float *w = j->w;
    float m = j->cmean[n], r = j->crstd[n];
    /* dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) */
    float s1 = 0.0f, s2 = 0.0f;
    for (int i = 0; i < C; i++) {
        float dxhat = g[i] * w[i];
        s1 += dxhat;
        s2 += dxhat * (xr[i] - m) * r;
    }
    s1 /= (float)C;
    s2 /= (float)C;
    for (int i = 0; i < C; i++) {
        float xhat = (xr[i] - m) * r;
        d[i] += r * (g[i] * w[i] - s1 - xhat * s2);
    }
}

/* LayerNorm's dw and db for columns [lo, hi), each summed in row order. */
static void ln_dwdb_cols(const norm_job *j, float *buf, int lo, int hi)
{
    int C = j->C;
    float *dw = j->dw, *db = j->db;
    for (int n = 0; n < j->N && hi > lo; n++) {
        /* this thread's columns of the row: xr[i] for i in [lo, hi) */
        const float *g =
            dout_in(j, buf ? buf + C : NULL, (size_t)n * C + lo, (size_t)(hi - lo)) - lo;
        const float *xr = cpu_in(buf, j->x, j->dt, (size_t)n * C + lo, (size_t)(hi - lo)) - lo;
        float m = j->cmean[n], r = j->crstd[n];
        if (dw)
            for (int i = lo; i < hi; i++)
                dw[i] += g[i] * ((xr[i] - m) * r);
        if (db)
            for (int i = lo; i < hi; i++)
                db[i] += g[i];
    }
}

/* One backward job: dx by rows (a 16-bit dout row read rounded into the
 * thread's second row, dx stored rounded), then (no barrier between: they
 * share only inputs) the weight and bias gradients by columns. */
static void norm_bwd_job(int tid, int nt, void *arg)
{
    norm_job *j = arg;
    kn_dtype dt = j->dt;
    int C = j->C, failed = 0, held = !j->dx; /* dx held in dt (dx_dt alone) */
    float *buf = row_bufs(dt, C, held ? 3 : 2, &failed);
    if (!failed && (j->dx || j->dx_dt)) {
        size_t lo, hi, es = kn_dtype_size(dt);
        cpu_pool_static((size_t)j->N, tid, nt, &lo, &hi);
        for (size_t n = lo; n < hi; n++) {
            char *t = j->dx_dt ? (char *)j->dx_dt + n * C * es : NULL;
            float *d = held ? buf + 2 * (size_t)C : j->dx + n * C;
            if (held) cpu_convert_n(d, KN_F32, t, dt, (size_t)C);
            j->dx_row(j, dout_in(j, buf ? buf + C : NULL, n * C, (size_t)C),
                      cpu_in(buf, j->x, dt, n * C, (size_t)C), d, n);
            cpu_round_n(d, (size_t)C, dt);
            if (t) cpu_convert_n(t, dt, d, KN_F32, (size_t)C);
        }
    }
    if (!failed && (j->dw || j->db)) {
        int lo, hi;
        col_range(j->C, tid, nt, &lo, &hi);
        j->dw_cols(j, buf, lo, hi);
    }
    free(buf);
    if (failed) atomic_store(&j->failed, 1);
}

/* An fp32 dx held "in dt" is dx itself. */
static void held_f32(kn_dtype dt, float **dx, void **dx_dt)
{
    if (!*dx && dt == KN_F32) {
        *dx = *dx_dt;
        *dx_dt = NULL;
    }
}

void cpu_layernorm_bwd(kn_ctx *c, kn_dtype dt, float *dx, void *dx_dt, float *dw, float *db,
                       const void *dout, kn_dtype dout_dt, const void *x, const float *w,
                       const float *mean, const float *rstd, int N, int C)
{
    if (!kn_grad_dtype_ok(c, dt, dout_dt, "norm backward")) return;
    held_f32(dt, &dx, &dx_dt);
    norm_job j = {.dt = dt,
                  .dx = dx,
                  .dx_dt = dx_dt,
                  .dw = dw,
                  .db = db,
                  .dout = dout,
                  .dout_dt = dout_dt,
                  .x = x,
                  .w = w,
                  .cmean = mean,
                  .crstd = rstd,
                  .N = N,
                  .C = C,
                  .dx_row = ln_dx_row,
                  .dw_cols = ln_dwdb_cols};
    norm_run(c, &j, norm_bwd_job, "layernorm backward");
}

static void rms_fwd_row(const norm_job *j, const float *xr, float *o, size_t n)
{
    int C = j->C;
    const float *w = j->w;
    float s = 0.0f;
    for (int i = 0; i < C; i++)
        s += xr[i] * xr[i];
    float r = 1.0f / sqrtf(s / (float)C + j->eps);
    /* HF's LlamaRMSNorm: w * (x * rstd), in that order. */
    for (int i = 0; i < C; i++)
        o[i] = w[i] * (xr[i] * r);
    j->rstd[n] = r;
}

void cpu_rmsnorm_fwd(kn_ctx *c, kn_dtype dt, void *out, float *rstd, const void *x, const float *w,
                     int N, int C, float eps)
{
    norm_job j = {.dt = dt,
                  .out = out,
                  .rstd = rstd,
                  .x = x,
                  .w = w,
                  .N = N,
                  .C = C,
                  .eps = eps,
                  .fwd_row = rms_fwd_row};
    norm_run(c, &j, norm_fwd_job, "rmsnorm forward");
}

/* RMSNorm's dx of row n. */
static void rms_dx_row(const norm_job *j, const float *g, const float *xr, float *d, size_t n)
{
    int C = j->C;
    const float *w = j->w;
    float r = j->crstd[n];
    /* dx = r * (dxhat - xhat * mean(dxhat * xhat)), xhat = x r */
    float s = 0.0f;
    for (int i = 0; i < C; i++)
        s += g[i] * w[i] * xr[i];
    s *= r * r / (float)C;
    for (int i = 0; i < C; i++)
        d[i] += r * (g[i] * w[i] - xr[i] * s);
}

/* RMSNorm's dw for columns [lo, hi), each summed in row order. */
static void rms_dw_cols(const norm_job *j, float *buf, int lo, int hi)
{
    int C = j->C;
    for (int n = 0; n < j->N && hi > lo; n++) {
        const float *g =
            dout_in(j, buf ? buf + C : NULL, (size_t)n * C + lo, (size_t)(hi - lo)) - lo;
        const float *xr = cpu_in(buf, j->x, j->dt, (size_t)n * C + lo, (size_t)(hi - lo)) - lo;
        float r = j->crstd[n];
        for (int i = lo; i < hi; i++)
            j->dw[i] += g[i] * (xr[i] * r);
    }
}

void cpu_rmsnorm_bwd(kn_ctx *c, kn_dtype dt, float *dx, void *dx_dt, float *dw, const void *dout,
                     kn_dtype dout_dt, const void *x, const float *w, const float *rstd, int N,
                     int C)
{
    if (!kn_grad_dtype_ok(c, dt, dout_dt, "norm backward")) return;
    held_f32(dt, &dx, &dx_dt);
    norm_job j = {.dt = dt,
                  .dx = dx,
                  .dx_dt = dx_dt,
                  .dw = dw,
                  .dout = dout,
                  .dout_dt = dout_dt,
                  .x = x,
                  .w = w,
                  .crstd = rstd,
                  .N = N,
                  .C = C,
                  .dx_row = rms_dx_row,
                  .dw_cols = rms_dw_cols};
    norm_run(c, &j, norm_bwd_job, "rmsnorm backward");
}

/* The residual add fused with the norm after it (kn_add_layernorm_fwd /
 * kn_add_rmsnorm_fwd): on the CPU the reference is the two ops in turn,
 * so an engine run computes the same bits fused or not; the one-pass
 * kernel that saves the re-read of res is the GPU's (cuda_norm.cu). */
void cpu_add_layernorm_fwd(kn_ctx *c, kn_dtype dt, void *res, void *out, float *mean, float *rstd,
                           const void *a, const void *b, const float *w, const float *bias, int N,
                           int C, float eps)
{
    if (N <= 0 || C <= 0) return;
    cpu_add(c, dt, res, a, b, (size_t)N * C);
    cpu_layernorm_fwd(c, dt, out, mean, rstd, res, w, bias, N, C, eps);
}

void cpu_add_rmsnorm_fwd(kn_ctx *c, kn_dtype dt, void *res, void *out, float *rstd, const void *a,
                         const void *b, const float *w, int N, int C, float eps)
{
    if (N <= 0 || C <= 0) return;
    cpu_add(c, dt, res, a, b, (size_t)N * C);
    cpu_rmsnorm_fwd(c, dt, out, rstd, res, w, N, C, eps);
}
