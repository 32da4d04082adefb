/* test_kernels_device.c — every op of a device backend against `cpu`.
 *
 * The same random inputs go to a CPU context and to a device context
 * (`cuda-emu` here: the kernels/cuda sources compiled for the host, see
 * kernels/cuda/emu; `cuda` on a GPU machine, tests/gpu/run.sh). Inputs are
 * staged with kn_to_device and results read with kn_to_host, so nothing
 * assumes host-visible device memory. Each output is compared with the
 * CPU's: |dev - cpu| <= rtol |cpu| + atol * max|cpu| (fp32 on both sides;
 * the tolerances below allow for a different summation order, nothing
 * more). Dropout masks must be identical, and a second run of every op
 * must give the same bits (no atomics). One line per output reports the
 * max abs and rel error (tests/gpu/run.sh collects them).
 * Usage: test_kernels_device <group>[,<group>...]|all [cuda-emu|cuda] [scale]
 *   (several groups in one process: what tests/gpu/run.sh's sanitizer
 *   step runs, one tool start for all of them)
 *   scale 1 (default) is CI's small odd shapes; larger values grow T, C
 *   and V for a real device. */
#include "backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tyassert.h"

static int g_scale = 1;
static uint64_t g_rng = 0x243f6a8885a308d3ULL;

static double urand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static float *hrand(size_t n, double a)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(urand() * a);
    return h;
}

typedef struct pair {
    kn_ctx *cpu, *dev;
} pair;

/* A device buffer on each side holding the same host bytes. */
typedef struct buf {
    void *cpu, *dev;
    size_t bytes;
} buf;

static buf bput(pair *p, const void *host, size_t bytes)
{
    buf b = {kn_alloc(p->cpu, bytes), kn_alloc(p->dev, bytes), bytes};
    if (!b.cpu || !b.dev) {
        fprintf(stderr, "kn_alloc(%zu) failed\n", bytes);
        exit(2);
    }
    if (host && bytes) {
        kn_to_device(p->cpu, b.cpu, host, bytes);
        kn_to_device(p->dev, b.dev, host, bytes);
    }
    return b;
}
static buf bzeros(pair *p, size_t bytes)
{
    return bput(p, NULL, bytes);
}
static buf brand(pair *p, size_t n, double a)
{
    float *h = hrand(n, a);
    buf b = bput(p, h, n * sizeof(float));
    free(h);
    return b;
}
#define F(b, side) ((float *)(b).side)

static void *fetch(kn_ctx *c, const void *d, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    kn_to_host(c, h, d, bytes);
    return h;
}

static void ctx_ok(pair *p, const char *what)
{
    ty_err err = {0};
    if (kn_check(p->cpu, &err)) {
        TY_FAIL("%s: cpu error: %s", what, err.msg);
    }
    if (kn_check(p->dev, &err)) {
        TY_FAIL("%s: device error: %s", what, err.msg);
    }
}

/* Compares the device's copy of b with the CPU's. */
static void cmp(pair *p, const char *what, buf b, double rtol, double atol)
{
    ctx_ok(p, what);
    size_t n = b.bytes / sizeof(float);
    float *x = fetch(p->cpu, b.cpu, b.bytes), *y = fetch(p->dev, b.dev, b.bytes);
    double mx = 0, ea = 0, er = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i])) mx = fmax(mx, fabs(x[i]));
    int shown = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - y[i]);
        if (isnan(x[i]) && isnan(y[i])) continue;
        ea = fmax(ea, d);
        if (fabs(x[i]) > 1e-3 * mx) er = fmax(er, d / fabs(x[i]));
        if (!(d <= rtol * fabs(x[i]) + atol * mx + 1e-30)) {
            if (shown++ < 5) TY_FAIL("%s[%zu]: device %.9g cpu %.9g", what, i, y[i], x[i]);
        }
    }
    printf("op=%s n=%zu max_abs=%.3g max_rel=%.3g max_ref=%.3g\n", what, n, ea, er, mx);
    free(x);
    free(y);
}

/* cmp for a tensor of n values stored as dt (widened to fp32 on each side
 * first). Tolerances for 16-bit results: the two sides round fp32 values
 * summed in different orders, so one unit in the last place of dt (2^-8
 * relative for bf16, 2^-11 for fp16) may differ. */
static void cmp16(pair *p, const char *what, buf b, size_t n, kn_dtype dt, double rtol, double atol)
{
    buf w = bzeros(p, n * sizeof(float));
    kn_convert(p->cpu, w.cpu, KN_F32, b.cpu, dt, n);
    kn_convert(p->dev, w.dev, KN_F32, b.dev, dt, n);
    cmp(p, what, w, rtol, atol);
}

static void cmp_bytes(pair *p, const char *what, buf b)
{
    ctx_ok(p, what);
    void *x = fetch(p->cpu, b.cpu, b.bytes), *y = fetch(p->dev, b.dev, b.bytes);
    if (memcmp(x, y, b.bytes)) {
        TY_FAIL("%s: device bytes differ from cpu", what);
    }
    printf("op=%s n=%zu exact=%d\n", what, b.bytes, !memcmp(x, y, b.bytes));
    free(x);
    free(y);
}

static void cmp_val(const char *what, double cpu, double dev, double rtol)
{
    double d = fabs(cpu - dev);
    printf("op=%s cpu=%.12g dev=%.12g abs=%.3g\n", what, cpu, dev, d);
    if (!(d <= rtol * fabs(cpu) + 1e-12)) {
        TY_FAIL("%s: device %.12g cpu %.12g", what, dev, cpu);
    }
}

/* Runs an op twice on the device from the same inputs and requires the
 * same bits: `run` fills out from scratch each time. */
static void same_twice(pair *p, const char *what, buf out, void (*run)(kn_ctx *, void *), void *arg)
{
    void *a = fetch(p->dev, out.dev, out.bytes);
    run(p->dev, arg);
    void *b = fetch(p->dev, out.dev, out.bytes);
    if (memcmp(a, b, out.bytes)) {
        TY_FAIL("%s: a second run differs bit-wise", what);
    }
    free(a);
    free(b);
}

/* ---- groups ------------------------------------------------------------- */

static void t_elementwise(pair *p)
{
    size_t n = 20011 * (size_t)g_scale;
    buf x = brand(p, n, 2), y = brand(p, n, 2), o = bzeros(p, n * 4);
    kn_add(p->cpu, KN_F32, F(o, cpu), F(x, cpu), F(y, cpu), n);
    kn_add(p->dev, KN_F32, F(o, dev), F(x, dev), F(y, dev), n);
    cmp(p, "add", o, 0, 0);
    kn_axpy(p->cpu, F(o, cpu), F(x, cpu), n, -0.375f);
    kn_axpy(p->dev, F(o, dev), F(x, dev), n, -0.375f);
    cmp(p, "axpy", o, 0, 0);
    kn_scale(p->cpu, F(o, cpu), n, 1.7f);
    kn_scale(p->dev, F(o, dev), n, 1.7f);
    cmp(p, "scale", o, 0, 0);
    kn_copy(p->cpu, F(y, cpu), F(o, cpu), n - 3);
    kn_copy(p->dev, F(y, dev), F(o, dev), n - 3);
    cmp(p, "copy", y, 0, 0);
    kn_zero(p->cpu, F(y, cpu), n / 2);
    kn_zero(p->dev, F(y, dev), n / 2);
    cmp(p, "zero", y, 0, 0);
    cmp_val("sum", kn_sum(p->cpu, F(x, cpu), n), kn_sum(p->dev, F(x, dev), n), 1e-12);
    double s1 = kn_sumsq(p->dev, F(x, dev), n);
    cmp_val("sumsq", kn_sumsq(p->cpu, F(x, cpu), n), s1, 1e-12);
    if (kn_sumsq(p->dev, F(x, dev), n) != s1) {
        TY_FAIL("sumsq: second call differs");
    }
    cmp_val("sum_empty", 0.0, kn_sum(p->dev, F(x, dev), 0), 0);
    if (kn_nonfinite(p->dev, F(x, dev), n)) {
        TY_FAIL("nonfinite on finite data");
    }
    float bad[2] = {INFINITY, NAN};
    for (int k = 0; k < 2; k++) {
        kn_to_device(p->dev, F(x, dev) + n - 1 - k * (n / 2), &bad[k], sizeof(float));
        if (!kn_nonfinite(p->dev, F(x, dev), n)) {
            TY_FAIL("nonfinite misses %g", bad[k]);
        }
    }
    ctx_ok(p, "elementwise");
}

static void t_activations(pair *p)
{
    size_t n = 30011 * (size_t)g_scale;
    buf x = brand(p, n, 5), u = brand(p, n, 2), r = brand(p, n, 1);
    buf o = bzeros(p, n * 4), d1 = brand(p, n, 1), d2 = brand(p, n, 1);
    kn_gelu_fwd(p->cpu, KN_F32, F(o, cpu), F(x, cpu), n);
    kn_gelu_fwd(p->dev, KN_F32, F(o, dev), F(x, dev), n);
    cmp(p, "gelu_fwd", o, 2e-6, 2e-7);
    kn_gelu_bwd(p->cpu, KN_F32, F(d1, cpu), F(r, cpu), F(x, cpu), n);
    kn_gelu_bwd(p->dev, KN_F32, F(d1, dev), F(r, dev), F(x, dev), n);
    cmp(p, "gelu_bwd", d1, 2e-5, 2e-6);
    kn_swiglu_fwd(p->cpu, KN_F32, F(o, cpu), F(x, cpu), F(u, cpu), n);
    kn_swiglu_fwd(p->dev, KN_F32, F(o, dev), F(x, dev), F(u, dev), n);
    cmp(p, "swiglu_fwd", o, 2e-6, 2e-7);
    kn_swiglu_bwd(p->cpu, KN_F32, KN_F32, F(d1, cpu), F(d2, cpu), F(r, cpu), KN_F32, F(x, cpu),
                  F(u, cpu), n);
    kn_swiglu_bwd(p->dev, KN_F32, KN_F32, F(d1, dev), F(d2, dev), F(r, dev), KN_F32, F(x, dev),
                  F(u, dev), n);
    cmp(p, "swiglu_bwd.dgate", d1, 2e-5, 2e-6);
    cmp(p, "swiglu_bwd.dup", d2, 2e-5, 2e-6);
    kn_swiglu_bwd(p->cpu, KN_F32, KN_F32, NULL, F(d2, cpu), F(r, cpu), KN_F32, F(x, cpu), F(u, cpu),
                  n);
    kn_swiglu_bwd(p->dev, KN_F32, KN_F32, NULL, F(d2, dev), F(r, dev), KN_F32, F(x, dev), F(u, dev),
                  n);
    cmp(p, "swiglu_bwd.null_dgate", d2, 2e-5, 2e-6);

    buf m = bzeros(p, n);
    for (int k = 0; k < 2; k++) {
        float pd = k ? 0.0f : 0.3f;
        kn_dropout_fwd(p->cpu, KN_F32, F(o, cpu), m.cpu, F(x, cpu), n, pd, 1234, 99);
        kn_dropout_fwd(p->dev, KN_F32, F(o, dev), m.dev, F(x, dev), n, pd, 1234, 99);
        cmp_bytes(p, k ? "dropout_fwd.p0.mask" : "dropout_fwd.mask", m);
        cmp(p, k ? "dropout_fwd.p0" : "dropout_fwd", o, 0, 0);
        kn_dropout_bwd(p->cpu, F(d1, cpu), F(r, cpu), m.cpu, n, pd);
        kn_dropout_bwd(p->dev, F(d1, dev), F(r, dev), m.dev, n, pd);
        cmp(p, "dropout_bwd", d1, 2e-5, 2e-6); /* d1 holds swiglu's rounding */
    }
}

/* DoRA's three ops on an odd [N, M] x [M, K]: with and without the base
 * product y and the bias, and dmag accumulating over two calls. */
static void t_dora(pair *p)
{
    int N = 37 * g_scale, M = 53, K = 29;
    size_t nm = (size_t)N * M;
    buf w = brand(p, (size_t)M * K, 0.5), d = brand(p, (size_t)M * K, 0.5), mag = brand(p, M, 2);
    buf g = bzeros(p, M * 4), nrm = bzeros(p, M * 4);
    kn_dora_norm(p->cpu, F(g, cpu), F(nrm, cpu), F(w, cpu), F(d, cpu), F(mag, cpu), 0.7f, M, K);
    kn_dora_norm(p->dev, F(g, dev), F(nrm, dev), F(w, dev), F(d, dev), F(mag, dev), 0.7f, M, K);
    cmp(p, "dora_norm.norm", nrm, 2e-6, 2e-7);
    cmp(p, "dora_norm.g", g, 2e-6, 2e-7);
    buf lr = brand(p, nm, 1), y = brand(p, nm, 1), b = brand(p, M, 0.1), z = bzeros(p, nm * 4);
    buf dout = brand(p, nm, 1), dlr = bzeros(p, nm * 4), dy = bzeros(p, nm * 4);
    buf dmag = brand(p, M, 0.1);
    for (int k = 0; k < 2; k++) {
        buf out = brand(p, nm, 1);
        const float *yc = k ? F(y, cpu) : NULL, *yd = k ? F(y, dev) : NULL;
        kn_dora_fwd(p->cpu, F(out, cpu), F(z, cpu), yc, k ? NULL : F(b, cpu), F(lr, cpu), F(g, cpu),
                    0.7f, N, M);
        kn_dora_fwd(p->dev, F(out, dev), F(z, dev), yd, k ? NULL : F(b, dev), F(lr, dev), F(g, dev),
                    0.7f, N, M);
        cmp(p, k ? "dora_fwd.y" : "dora_fwd", out, 2e-6, 2e-7);
        cmp(p, k ? "dora_fwd.y.z" : "dora_fwd.z", z, 2e-6, 2e-7);
        kn_dora_bwd(p->cpu, F(dlr, cpu), F(dy, cpu), F(dmag, cpu), F(dout, cpu), F(z, cpu),
                    F(g, cpu), F(nrm, cpu), 0.7f, N, M);
        kn_dora_bwd(p->dev, F(dlr, dev), F(dy, dev), F(dmag, dev), F(dout, dev), F(z, dev),
                    F(g, dev), F(nrm, dev), 0.7f, N, M);
        cmp(p, "dora_bwd.dlr", dlr, 2e-6, 2e-7);
        cmp(p, "dora_bwd.dy", dy, 2e-6, 2e-7);
        cmp(p, "dora_bwd.dmag", dmag, 2e-5, 2e-6);
    }
}

static void t_adamw(pair *p)
{
    size_t n = 30011 * (size_t)g_scale;
    buf w = brand(p, n, 1), g = brand(p, n, 0.1), m = brand(p, n, 0.01), v = bzeros(p, n * 4);
    float *vh = hrand(n, 1);
    for (size_t i = 0; i < n; i++)
        vh[i] = vh[i] * vh[i] * 1e-3f;
    kn_to_device(p->cpu, v.cpu, vh, n * 4);
    kn_to_device(p->dev, v.dev, vh, n * 4);
    free(vh);
    for (int t = 1; t <= 3; t++) {
        kn_adamw(p->cpu, KN_F32, F(w, cpu), NULL, F(g, cpu), F(m, cpu), F(v, cpu), n, 1e-3f, 0.9f,
                 0.95f, 1e-8f, t == 2 ? 0.0f : 0.1f, t);
        kn_adamw(p->dev, KN_F32, F(w, dev), NULL, F(g, dev), F(m, dev), F(v, dev), n, 1e-3f, 0.9f,
                 0.95f, 1e-8f, t == 2 ? 0.0f : 0.1f, t);
    }
    cmp(p, "adamw.p", w, 1e-6, 1e-7);
    cmp(p, "adamw.m", m, 1e-6, 1e-7);
    cmp(p, "adamw.v", v, 1e-6, 1e-7);
}

static void t_embedding(pair *p)
{
    int N = 53 * g_scale, C = 67, V = 29;
    int32_t *ids = malloc(N * sizeof *ids);
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)((urand() + 1) * 0.5 * V) % V;
    ids[1] = ids[5] = ids[9]; /* repeated rows add up */
    buf id = bput(p, ids, N * sizeof *ids), tab = brand(p, (size_t)V * C, 1);
    buf pos = brand(p, (size_t)N * C, 1), o = bzeros(p, (size_t)N * C * 4);
    kn_embedding_fwd(p->cpu, KN_F32, F(o, cpu), id.cpu, F(tab, cpu), N, C, 0);
    kn_embedding_fwd(p->dev, KN_F32, F(o, dev), id.dev, F(tab, dev), N, C, 0);
    cmp(p, "embedding_fwd", o, 0, 0);
    kn_embedding_fwd(p->cpu, KN_F32, F(o, cpu), id.cpu, F(pos, cpu), N, C, 1);
    kn_embedding_fwd(p->dev, KN_F32, F(o, dev), id.dev, F(pos, dev), N, C, 1);
    cmp(p, "embedding_fwd.accumulate", o, 0, 0);
    buf dt = brand(p, (size_t)V * C, 1);
    kn_embedding_bwd(p->cpu, F(dt, cpu), id.cpu, F(pos, cpu), N, C);
    kn_embedding_bwd(p->dev, F(dt, dev), id.dev, F(pos, dev), N, C);
    cmp(p, "embedding_bwd", dt, 1e-6, 1e-7);
    free(ids);
}

static void t_norm(pair *p)
{
    int N = 37 * g_scale, C = 203 * g_scale;
    size_t nc = (size_t)N * C;
    buf x = brand(p, nc, 3), w = brand(p, C, 1), b = brand(p, C, 1), r = brand(p, nc, 1);
    buf o = bzeros(p, nc * 4), mean = bzeros(p, N * 4), rstd = bzeros(p, N * 4);
    buf dx = brand(p, nc, 1), dw = brand(p, C, 1), db = brand(p, C, 1);
    for (int hb = 0; hb < 2; hb++) {
        kn_layernorm_fwd(p->cpu, KN_F32, F(o, cpu), F(mean, cpu), F(rstd, cpu), F(x, cpu),
                         F(w, cpu), hb ? F(b, cpu) : NULL, N, C, 1e-5f);
        kn_layernorm_fwd(p->dev, KN_F32, F(o, dev), F(mean, dev), F(rstd, dev), F(x, dev),
                         F(w, dev), hb ? F(b, dev) : NULL, N, C, 1e-5f);
        cmp(p, "layernorm_fwd", o, 1e-5, 1e-6);
        cmp(p, "layernorm_fwd.mean", mean, 1e-5, 1e-6);
        cmp(p, "layernorm_fwd.rstd", rstd, 1e-5, 1e-6);
    }
    kn_layernorm_bwd(p->cpu, KN_F32, F(dx, cpu), NULL, F(dw, cpu), F(db, cpu), F(r, cpu), KN_F32,
                     F(x, cpu), F(w, cpu), F(mean, cpu), F(rstd, cpu), N, C);
    kn_layernorm_bwd(p->dev, KN_F32, F(dx, dev), NULL, F(dw, dev), F(db, dev), F(r, dev), KN_F32,
                     F(x, dev), F(w, dev), F(mean, dev), F(rstd, dev), N, C);
    cmp(p, "layernorm_bwd.dx", dx, 1e-4, 1e-5);
    cmp(p, "layernorm_bwd.dw", dw, 1e-4, 1e-5);
    cmp(p, "layernorm_bwd.db", db, 1e-4, 1e-5);
    kn_rmsnorm_fwd(p->cpu, KN_F32, F(o, cpu), F(rstd, cpu), F(x, cpu), F(w, cpu), N, C, 1e-6f);
    kn_rmsnorm_fwd(p->dev, KN_F32, F(o, dev), F(rstd, dev), F(x, dev), F(w, dev), N, C, 1e-6f);
    cmp(p, "rmsnorm_fwd", o, 1e-5, 1e-6);
    cmp(p, "rmsnorm_fwd.rstd", rstd, 1e-5, 1e-6);
    kn_rmsnorm_bwd(p->cpu, KN_F32, F(dx, cpu), NULL, F(dw, cpu), F(r, cpu), KN_F32, F(x, cpu),
                   F(w, cpu), F(rstd, cpu), N, C);
    kn_rmsnorm_bwd(p->dev, KN_F32, F(dx, dev), NULL, F(dw, dev), F(r, dev), KN_F32, F(x, dev),
                   F(w, dev), F(rstd, dev), N, C);
    cmp(p, "rmsnorm_bwd.dx", dx, 1e-4, 1e-5);
    cmp(p, "rmsnorm_bwd.dw", dw, 1e-4, 1e-5);
    kn_rmsnorm_bwd(p->cpu, KN_F32, NULL, NULL, F(dw, cpu), F(r, cpu), KN_F32, F(x, cpu), F(w, cpu),
                   F(rstd, cpu), N, C);
    kn_rmsnorm_bwd(p->dev, KN_F32, NULL, NULL, F(dw, dev), F(r, dev), KN_F32, F(x, dev), F(w, dev),
                   F(rstd, dev), N, C);
    cmp(p, "rmsnorm_bwd.null_dx", dw, 1e-4, 1e-5);
    /* the residual add fused with the norm, fp32 and 16-bit (x + r as a + b) */
    for (int dt = KN_F32; dt <= KN_F16; dt++) {
        kn_dtype t = (kn_dtype)dt;
        size_t es = kn_dtype_size(t);
        double rt = dt == KN_F32 ? 1e-5 : dt == KN_BF16 ? 1e-2 : 2e-3, at = rt / 10;
        buf a = bzeros(p, nc * es), bb = bzeros(p, nc * es), res = bzeros(p, nc * es),
            o16 = bzeros(p, nc * es);
        kn_convert(p->cpu, a.cpu, t, x.cpu, KN_F32, nc);
        kn_convert(p->dev, a.dev, t, x.dev, KN_F32, nc);
        kn_convert(p->cpu, bb.cpu, t, r.cpu, KN_F32, nc);
        kn_convert(p->dev, bb.dev, t, r.dev, KN_F32, nc);
        char what[64];
        kn_add_layernorm_fwd(p->cpu, t, res.cpu, o16.cpu, F(mean, cpu), F(rstd, cpu), a.cpu, bb.cpu,
                             F(w, cpu), F(b, cpu), N, C, 1e-5f);
        kn_add_layernorm_fwd(p->dev, t, res.dev, o16.dev, F(mean, dev), F(rstd, dev), a.dev, bb.dev,
                             F(w, dev), F(b, dev), N, C, 1e-5f);
        snprintf(what, sizeof what, "add_layernorm_fwd.%s.res", kn_dtype_name(t));
        cmp16(p, what, res, nc, t, 0, 0); /* one rounded add: the same bits */
        snprintf(what, sizeof what, "add_layernorm_fwd.%s.out", kn_dtype_name(t));
        cmp16(p, what, o16, nc, t, rt, at);
        cmp(p, "add_layernorm_fwd.mean", mean, 1e-5, 1e-6);
        cmp(p, "add_layernorm_fwd.rstd", rstd, 1e-5, 1e-6);
        kn_add_rmsnorm_fwd(p->cpu, t, res.cpu, o16.cpu, F(rstd, cpu), a.cpu, bb.cpu, F(w, cpu), N,
                           C, 1e-6f);
        kn_add_rmsnorm_fwd(p->dev, t, res.dev, o16.dev, F(rstd, dev), a.dev, bb.dev, F(w, dev), N,
                           C, 1e-6f);
        snprintf(what, sizeof what, "add_rmsnorm_fwd.%s.res", kn_dtype_name(t));
        cmp16(p, what, res, nc, t, 0, 0);
        snprintf(what, sizeof what, "add_rmsnorm_fwd.%s.out", kn_dtype_name(t));
        cmp16(p, what, o16, nc, t, rt, at);
        cmp(p, "add_rmsnorm_fwd.rstd", rstd, 1e-5, 1e-6);
    }
}

static void t_matmul(pair *p)
{
    int shapes[][3] = {{37, 29, 51}, {64, 64, 64}, {5, 130, 3}, {1, 7, 1}};
    for (int s = 0; s < 4; s++) {
        int N = shapes[s][0] * g_scale, K = shapes[s][1] * g_scale, M = shapes[s][2] * g_scale;
        buf x = brand(p, (size_t)N * K, 1), w = brand(p, (size_t)M * K, 1), bias = brand(p, M, 1);
        buf o = bzeros(p, (size_t)N * M * 4), d = brand(p, (size_t)N * M, 1);
        buf dx = brand(p, (size_t)N * K, 1), dw = brand(p, (size_t)M * K, 1), db = brand(p, M, 1);
        for (int hb = 0; hb < 2; hb++) {
            kn_matmul_fwd(p->cpu, F(o, cpu), F(x, cpu), F(w, cpu), hb ? F(bias, cpu) : NULL, N, K,
                          M);
            kn_matmul_fwd(p->dev, F(o, dev), F(x, dev), F(w, dev), hb ? F(bias, dev) : NULL, N, K,
                          M);
            cmp(p, hb ? "matmul_fwd.bias" : "matmul_fwd", o, 1e-5, 1e-6);
        }
        kn_matmul_bwd(p->cpu, F(dx, cpu), F(dw, cpu), F(db, cpu), F(d, cpu), F(x, cpu), F(w, cpu),
                      N, K, M);
        kn_matmul_bwd(p->dev, F(dx, dev), F(dw, dev), F(db, dev), F(d, dev), F(x, dev), F(w, dev),
                      N, K, M);
        cmp(p, "matmul_bwd.dx", dx, 1e-5, 1e-6);
        cmp(p, "matmul_bwd.dw", dw, 1e-5, 1e-6);
        cmp(p, "matmul_bwd.dbias", db, 1e-5, 1e-6);
        kn_matmul_bwd(p->cpu, NULL, F(dw, cpu), NULL, F(d, cpu), F(x, cpu), F(w, cpu), N, K, M);
        kn_matmul_bwd(p->dev, NULL, F(dw, dev), NULL, F(d, dev), F(x, dev), F(w, dev), N, K, M);
        cmp(p, "matmul_bwd.dw_only", dw, 1e-5, 1e-6);
    }
}

/* The fused linear + GELU (kn_matmul_gelu_fwd / kn_matmul_dgelu): shapes
 * whose aux leading dimension is a multiple of 8 take cuBLASLt's GELU_AUX /
 * DGELU epilogues (modelled by the emulated cuBLASLt), the others the
 * GEMM + kernel fallback; fp32 weights, then bf16 / fp16 ones with fp32
 * and 16-bit outputs. 16-bit tolerances: the epilogue's GELU reads the
 * fp32 pre-activation where the CPU reference reads it rounded to dt
 * (kernels.h), half an ulp of dt: 2^-9 (bf16) / 2^-12 (fp16) relative;
 * dbias sums N such terms. The typed form (x, pre, out, dout in dt, as a
 * 16-bit run passes them; on CUDA the bf16 / fp16 operands and aux go to
 * cuBLASLt as they are and DGELU writes a dt D) is held to the same
 * tolerances. A refused dtype pair is a clear error. */
static void t_matmul_gelu(pair *p)
{
    /* {N, K, M, P}: x[N,K] -> pre[N,M] -> next linear [P, M] */
    int shapes[][4] = {{37, 29, 51, 23}, {20, 24, 40, 16}, {5, 130, 3, 7}, {9, 16, 8, 8}};
    for (int dt = KN_F32; dt <= KN_F16; dt++) {
        double rt = dt == KN_F32 ? 2e-5 : dt == KN_BF16 ? 1e-2 : 2e-3;
        double at = dt == KN_F32 ? 2e-6 : dt == KN_BF16 ? 4e-3 : 1e-3;
        double bt = dt == KN_F32 ? 2e-5 : 2e-2; /* dbias: a sum of N rounded terms */
        /* dpre from an fp32 run: cuBLASLt's DGELU epilogue computes the
         * derivative less exactly than the CPU's tanhf; on an H200 it is
         * within 1e-5 of max |dpre| (8e-6 to 9.4e-6 measured) */
        double dat = dt == KN_F32 ? 2e-5 : at;
        for (int s = 0; s < 4; s++) {
            int N = shapes[s][0] * g_scale, K = shapes[s][1] * g_scale, M = shapes[s][2] * g_scale,
                P = shapes[s][3] * g_scale;
            size_t es = dt == KN_F32 ? 4 : 2;
            buf x = brand(p, (size_t)N * K, 1), wf = brand(p, (size_t)M * K, 1),
                bias = brand(p, M, 1), w2f = brand(p, (size_t)P * M, 1);
            buf d = brand(p, (size_t)N * P, 1), db = brand(p, M, 1);
            buf w = wf, w2 = w2f;
            if (dt != KN_F32) { /* the values a 16-bit run holds */
                kn_dtype t = (kn_dtype)dt;
                w = bzeros(p, (size_t)M * K * es), w2 = bzeros(p, (size_t)P * M * es);
                kn_convert(p->cpu, w.cpu, t, wf.cpu, KN_F32, (size_t)M * K);
                kn_convert(p->dev, w.dev, t, wf.dev, KN_F32, (size_t)M * K);
                kn_convert(p->cpu, w2.cpu, t, w2f.cpu, KN_F32, (size_t)P * M);
                kn_convert(p->dev, w2.dev, t, w2f.dev, KN_F32, (size_t)P * M);
                kn_round(p->cpu, F(x, cpu), (size_t)N * K, t);
                kn_round(p->dev, F(x, dev), (size_t)N * K, t);
                kn_round(p->cpu, F(d, cpu), (size_t)N * P, t);
                kn_round(p->dev, F(d, dev), (size_t)N * P, t);
                kn_round(p->cpu, F(bias, cpu), (size_t)M, t); /* as 16-bit storage gives */
                kn_round(p->dev, F(bias, dev), (size_t)M, t);
            }
            char what[96];
            buf o = bzeros(p, (size_t)N * M * 4), pre = bzeros(p, (size_t)N * M * 4);
            for (int hb = 0; hb < 2; hb++) {
                kn_matmul_gelu_fwd(p->cpu, (kn_dtype)dt, KN_F32, KN_F32, o.cpu, pre.cpu, F(x, cpu),
                                   w.cpu, hb ? F(bias, cpu) : NULL, KN_F32, N, K, M);
                kn_matmul_gelu_fwd(p->dev, (kn_dtype)dt, KN_F32, KN_F32, o.dev, pre.dev, F(x, dev),
                                   w.dev, hb ? F(bias, dev) : NULL, KN_F32, N, K, M);
                snprintf(what, sizeof what, "matmul_gelu_fwd.%s.%dx%dx%d%s.pre",
                         kn_dtype_name((kn_dtype)dt), N, K, M, hb ? ".bias" : "");
                cmp(p, what, pre, 1e-5, 1e-6);
                snprintf(what, sizeof what, "matmul_gelu_fwd.%s.%dx%dx%d%s.out",
                         kn_dtype_name((kn_dtype)dt), N, K, M, hb ? ".bias" : "");
                cmp(p, what, o, rt, at);
            }
            if (dt != KN_F32) { /* pre and out stored in dt, from an fp32 x and a dt x */
                kn_dtype t = (kn_dtype)dt;
                buf x16 = bzeros(p, (size_t)N * K * 2), d16 = bzeros(p, (size_t)N * P * 2);
                kn_convert(p->cpu, x16.cpu, t, x.cpu, KN_F32, (size_t)N * K);
                kn_convert(p->dev, x16.dev, t, x.dev, KN_F32, (size_t)N * K);
                kn_convert(p->cpu, d16.cpu, t, d.cpu, KN_F32, (size_t)N * P);
                kn_convert(p->dev, d16.dev, t, d.dev, KN_F32, (size_t)N * P);
                for (int xt = 0; xt < 2; xt++) {
                    buf o16 = bzeros(p, (size_t)N * M * 2), p16 = bzeros(p, (size_t)N * M * 2);
                    kn_dtype x_dt = xt ? t : KN_F32;
                    buf xi = xt ? x16 : x;
                    kn_matmul_gelu_fwd(p->cpu, t, t, x_dt, o16.cpu, p16.cpu, xi.cpu, w.cpu,
                                       F(bias, cpu), KN_F32, N, K, M);
                    kn_matmul_gelu_fwd(p->dev, t, t, x_dt, o16.dev, p16.dev, xi.dev, w.dev,
                                       F(bias, dev), KN_F32, N, K, M);
                    snprintf(what, sizeof what, "matmul_gelu_fwd.%s.%dx%dx%d.16bit%s.pre",
                             kn_dtype_name(t), N, K, M, xt ? ".x16" : "");
                    cmp16(p, what, p16, (size_t)N * M, t, rt, at);
                    snprintf(what, sizeof what, "matmul_gelu_fwd.%s.%dx%dx%d.16bit%s.out",
                             kn_dtype_name(t), N, K, M, xt ? ".x16" : "");
                    cmp16(p, what, o16, (size_t)N * M, t, rt, at);
                    if (!xt) continue;
                    /* the typed backward: dout and pre in dt (a 16-bit run's tensors) */
                    /* dpre in dt, its garbage start overwritten */
                    buf dp = brand(p, ((size_t)N * M + 1) / 2, 1), db2 = brand(p, M, 1);
                    kn_matmul_dgelu(p->cpu, t, t, t, dp.cpu, F(db2, cpu), d16.cpu, w2.cpu, p16.cpu,
                                    N, M, P);
                    kn_matmul_dgelu(p->dev, t, t, t, dp.dev, F(db2, dev), d16.dev, w2.dev, p16.dev,
                                    N, M, P);
                    snprintf(what, sizeof what, "matmul_dgelu.%s.%dx%dx%d.16bit.dpre",
                             kn_dtype_name(t), N, M, P);
                    cmp16(p, what, dp, (size_t)N * M, t, rt, at);
                    snprintf(what, sizeof what, "matmul_dgelu.%s.%dx%dx%d.16bit.dbias",
                             kn_dtype_name(t), N, M, P);
                    cmp(p, what, db2, bt, bt);
                }
            }
            /* backward through the GELU from the next linear's dout[N,P] */
            buf dpre = brand(p, (size_t)N * M, 1); /* written, not accumulated */
            kn_matmul_dgelu(p->cpu, (kn_dtype)dt, KN_F32, KN_F32, F(dpre, cpu), F(db, cpu),
                            F(d, cpu), w2.cpu, F(pre, cpu), N, M, P);
            kn_matmul_dgelu(p->dev, (kn_dtype)dt, KN_F32, KN_F32, F(dpre, dev), F(db, dev),
                            F(d, dev), w2.dev, F(pre, dev), N, M, P);
            snprintf(what, sizeof what, "matmul_dgelu.%s.%dx%dx%d.dpre",
                     kn_dtype_name((kn_dtype)dt), N, M, P);
            cmp(p, what, dpre, rt, dat);
            snprintf(what, sizeof what, "matmul_dgelu.%s.%dx%dx%d.dbias",
                     kn_dtype_name((kn_dtype)dt), N, M, P);
            cmp(p, what, db, bt, bt);
        }
    }
    /* bf16 weights with an fp16 output: refused on both, with a message. */
    for (int side = 0; side < 2; side++) {
        kn_ctx *c = side ? p->dev : p->cpu;
        void *o = kn_alloc(c, 64), *q = kn_alloc(c, 64), *x = kn_alloc(c, 64), *w = kn_alloc(c, 64);
        kn_matmul_gelu_fwd(c, KN_BF16, KN_F16, KN_F32, o, q, x, w, NULL, KN_F32, 2, 2, 2);
        ty_err err = {0};
        int rc = kn_check(c, &err);
        if (rc != TY_EINVAL || !strstr(err.msg, "matmul_gelu_fwd")) {
            TY_FAIL("%s: bf16 weights with an f16 output gave %d (%s)", side ? "device" : "cpu", rc,
                    err.msg);
        }
        kn_matmul_dgelu(c, KN_BF16, KN_F32, KN_F16, o, NULL, x, w, q, 2, 2, 2);
        rc = kn_check(c, &err);
        if (rc != TY_EINVAL || !strstr(err.msg, "matmul_dgelu")) {
            TY_FAIL("%s: bf16 weights with an f16 pre gave %d (%s)", side ? "device" : "cpu", rc,
                    err.msg);
        }
        kn_free(c, o), kn_free(c, q), kn_free(c, x), kn_free(c, w);
    }
}

/* NF4 weights (QLoRA): random bytes are a valid quantised tensor, so the
 * codes, 8-bit absmax codes and scales are drawn directly. Dequantisation
 * must be bit-identical (both compute bitsandbytes' fp32 formula, each
 * operation rounded on its own); the matmuls agree to sgemm tolerance. */
static buf nf4_bytes(pair *p, size_t n)
{
    uint8_t *h = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        h[i] = (uint8_t)(urand() * 256.0);
    buf b = bput(p, h, n);
    free(h);
    return b;
}

static void t_nf4(pair *p)
{
    /* {M, K}: an odd element count, a partial block of 64, more than 256 blocks. */
    int shapes[][2] = {{7, 9}, {48, 40}, {130, 133}};
    for (int s = 0; s < 3; s++) {
        int M = shapes[s][0] * g_scale, K = shapes[s][1] * g_scale, N = 11 * g_scale;
        size_t n = (size_t)M * K, nb = (n + 63) / 64, nb2 = (nb + 255) / 256;
        buf codes = nf4_bytes(p, (n + 1) / 2), qa = nf4_bytes(p, nb);
        buf am = brand(p, nb, 1), am2 = brand(p, nb2, 0.5);
        for (int dq = 0; dq < 2; dq++) {
            kn_nf4 wc = {codes.cpu, dq ? NULL : F(am, cpu), qa.cpu, F(am2, cpu), 0.0123f, 0};
            kn_nf4 wd = {codes.dev, dq ? NULL : F(am, dev), qa.dev, F(am2, dev), 0.0123f, 0};
            for (int dt = 0; dt < 3; dt++) {
                buf out = bzeros(p, n * kn_dtype_size((kn_dtype)dt));
                kn_nf4_dequant(p->cpu, out.cpu, (kn_dtype)dt, wc, n);
                kn_nf4_dequant(p->dev, out.dev, (kn_dtype)dt, wd, n);
                char what[64];
                snprintf(what, sizeof what, "nf4_dequant.%s%s", kn_dtype_name((kn_dtype)dt),
                         dq ? ".dq" : "");
                cmp_bytes(p, what, out);
                kn_free(p->cpu, out.cpu);
                kn_free(p->dev, out.dev);
            }
            /* Views (a fused weight's row block): from row 1 and from an odd
             * element inside a block, the rest of the tensor; bit-identical
             * across backends and to the same elements of the whole. */
            buf whole = bzeros(p, n * 4);
            kn_nf4_dequant(p->cpu, whole.cpu, KN_F32, wc, n);
            float *wh = fetch(p->cpu, whole.cpu, n * 4);
            size_t firsts[2] = {(size_t)K, 37};
            for (int v = 0; v < 2; v++) {
                size_t f = firsts[v] < n ? firsts[v] : n - 1, nv = n - f;
                kn_nf4 vc = wc, vd = wd;
                vc.first = vd.first = f;
                buf out = bzeros(p, nv * 4);
                kn_nf4_dequant(p->cpu, out.cpu, KN_F32, vc, nv);
                kn_nf4_dequant(p->dev, out.dev, KN_F32, vd, nv);
                cmp_bytes(p, dq ? "nf4_dequant.view.dq" : "nf4_dequant.view", out);
                float *got = fetch(p->cpu, out.cpu, nv * 4);
                CHECK(!memcmp(got, wh + f, nv * 4),
                      "nf4 view from element %zu differs from the whole", f);
                free(got);
                kn_free(p->cpu, out.cpu);
                kn_free(p->dev, out.dev);
            }
            free(wh);
            kn_free(p->cpu, whole.cpu);
            kn_free(p->dev, whole.dev);
            buf x = brand(p, (size_t)N * K, 1), bias = brand(p, M, 1),
                o = bzeros(p, (size_t)N * M * 4);
            buf d = brand(p, (size_t)N * M, 1), dx = brand(p, (size_t)N * K, 1);
            for (int dt = 0; dt < 3; dt += 1) {
                kn_nf4_matmul_fwd(p->cpu, (kn_dtype)dt, F(o, cpu), F(x, cpu), wc, F(bias, cpu), N,
                                  K, M);
                kn_nf4_matmul_fwd(p->dev, (kn_dtype)dt, F(o, dev), F(x, dev), wd, F(bias, dev), N,
                                  K, M);
                cmp(p, dq ? "nf4_matmul_fwd.dq" : "nf4_matmul_fwd", o, 1e-5, 1e-6);
                kn_nf4_matmul_bwd(p->cpu, (kn_dtype)dt, F(dx, cpu), F(d, cpu), wc, N, K, M);
                kn_nf4_matmul_bwd(p->dev, (kn_dtype)dt, F(dx, dev), F(d, dev), wd, N, K, M);
                cmp(p, dq ? "nf4_matmul_bwd.dx.dq" : "nf4_matmul_bwd.dx", dx, 1e-5, 1e-6);
            }
        }
    }
}

static void t_rope(pair *p)
{
    int B = 2, T = 13 * g_scale, H = 3, D = 20, ld = H * D + 7;
    size_t n = (size_t)B * T * ld;
    buf x = brand(p, n, 1);
    kn_rope_fwd(p->cpu, KN_F32, F(x, cpu), B, T, H, D, ld, 10000.0f, 5);
    kn_rope_fwd(p->dev, KN_F32, F(x, dev), B, T, H, D, ld, 10000.0f, 5);
    cmp(p, "rope_fwd", x, 1e-5, 1e-6);
    kn_rope_bwd(p->cpu, KN_F32, F(x, cpu), B, T, H, D, ld, 500000.0f, 0);
    kn_rope_bwd(p->dev, KN_F32, F(x, dev), B, T, H, D, ld, 500000.0f, 0);
    cmp(p, "rope_bwd", x, 1e-5, 1e-6);
    /* Given frequencies (Llama 3's scaled RoPE): D/2 of them on each side. */
    float hinv[10];
    for (int i = 0; i < D / 2; i++)
        hinv[i] = 1.0f / (1.0f + (float)i * (float)i);
    buf inv = bput(p, hinv, sizeof hinv);
    kn_rope_freq_fwd(p->cpu, KN_F32, F(x, cpu), B, T, H, D, ld, F(inv, cpu), 7);
    kn_rope_freq_fwd(p->dev, KN_F32, F(x, dev), B, T, H, D, ld, F(inv, dev), 7);
    cmp(p, "rope_freq_fwd", x, 1e-5, 1e-6);
    kn_rope_freq_bwd(p->cpu, KN_F32, F(x, cpu), B, T, H, D, ld, F(inv, cpu), 0);
    kn_rope_freq_bwd(p->dev, KN_F32, F(x, dev), B, T, H, D, ld, F(inv, dev), 0);
    cmp(p, "rope_freq_bwd", x, 1e-5, 1e-6);
}

struct att_args {
    buf out, lse, q, k, v;
    int B, T, Hq, Hkv, D, ldq, ldkv;
    float scale, cap;
    int window;
    const float *q_dev, *k_dev, *v_dev;
};
static void att_rerun(kn_ctx *c, void *a_)
{
    struct att_args *a = a_;
    kn_attention_fwd(c, KN_F32, F(a->out, dev), F(a->lse, dev), a->q_dev, a->k_dev, a->v_dev, a->B,
                     a->T, a->Hq, a->Hkv, a->D, a->ldq, a->ldkv, a->scale, a->cap, a->window);
}

/* One attention case: fused (q,k,v in one qkv buffer, GPT-2) or separate. */
/* dt: the inputs hold values of that type (bf16 / fp16 runs store q, k, v
 * and dout in 16 bits; the kernel computes in fp32 either way). */
/* scale (0 = 1/sqrt(D)), cap (soft-cap) and window (sliding): Gemma's. */
static void att_case_g(pair *p, int B, int T, int Hq, int Hkv, int D, int fused, kn_dtype dt,
                       float scale, float cap, int window)
{
    char name[112];
    int C = Hq * D, Ck = Hkv * D;
    int ldq = fused ? C + 2 * Ck : C + 3, ldkv = fused ? C + 2 * Ck : Ck + 5;
    size_t nq = (size_t)B * T * ldq, nkv = (size_t)B * T * ldkv, no = (size_t)B * T * C;
    buf q = brand(p, nq, 1.5), k = fused ? q : brand(p, nkv, 1.5), v = fused ? q : brand(p, nkv, 1);
    size_t ko = fused ? (size_t)C : 0, vo = fused ? (size_t)C + Ck : 0;
    buf out = bzeros(p, no * 4), lse = bzeros(p, (size_t)B * Hq * T * 4), dout = brand(p, no, 1);
    if (dt != KN_F32) {
        buf in[4] = {q, k, v, dout};
        size_t len[4] = {nq, nkv, nkv, no};
        for (int i = 0; i < 4; i++) {
            kn_round(p->cpu, F(in[i], cpu), len[i], dt);
            kn_round(p->dev, F(in[i], dev), len[i], dt);
        }
    }
    const char *tn = dt == KN_F32 ? "" : dt == KN_BF16 ? ".bf16" : ".fp16";
    kn_attention_fwd(p->cpu, KN_F32, F(out, cpu), F(lse, cpu), F(q, cpu), F(k, cpu) + ko,
                     F(v, cpu) + vo, B, T, Hq, Hkv, D, ldq, ldkv, scale, cap, window);
    kn_attention_fwd(p->dev, KN_F32, F(out, dev), F(lse, dev), F(q, dev), F(k, dev) + ko,
                     F(v, dev) + vo, B, T, Hq, Hkv, D, ldq, ldkv, scale, cap, window);
    char gm[48] = "";
    if (scale != 0.0f || cap > 0.0f || window > 0)
        snprintf(gm, sizeof gm, ".s%g.cap%g.w%d", scale, cap, window);
    snprintf(name, sizeof name, "attention_fwd.B%d.T%d.H%d/%d.D%d%s%s%s", B, T, Hq, Hkv, D,
             fused ? ".fused" : "", tn, gm);
    cmp(p, name, out, 1e-4, 1e-5);
    snprintf(name, sizeof name, "attention_fwd.lse.T%d.H%d/%d.D%d%s", T, Hq, Hkv, D, gm);
    cmp(p, name, lse, 1e-5, 1e-6);
    struct att_args a = {out,
                         lse,
                         q,
                         k,
                         v,
                         B,
                         T,
                         Hq,
                         Hkv,
                         D,
                         ldq,
                         ldkv,
                         scale,
                         cap,
                         window,
                         F(q, dev),
                         F(k, dev) + ko,
                         F(v, dev) + vo};
    same_twice(p, "attention_fwd.repeat", out, att_rerun, &a);
    /* The last Tq rows of batch 0 over its T keys (a KV cache's step). */
    for (int Tq = 1; Tq <= T; Tq += T > 8 ? 7 : T) {
        size_t qo = (size_t)(T - Tq) * ldq;
        buf okv = bzeros(p, (size_t)Tq * C * 4), lkv = bzeros(p, (size_t)Hq * Tq * 4);
        kn_attention_kv_fwd(p->cpu, KN_F32, F(okv, cpu), F(lkv, cpu), F(q, cpu) + qo,
                            F(k, cpu) + ko, F(v, cpu) + vo, 1, Tq, T, Hq, Hkv, D, ldq, ldkv, scale,
                            cap, window);
        kn_attention_kv_fwd(p->dev, KN_F32, F(okv, dev), F(lkv, dev), F(q, dev) + qo,
                            F(k, dev) + ko, F(v, dev) + vo, 1, Tq, T, Hq, Hkv, D, ldq, ldkv, scale,
                            cap, window);
        snprintf(name, sizeof name, "attention_kv_fwd.Tq%d.T%d.H%d/%d.D%d%s%s%s", Tq, T, Hq, Hkv, D,
                 fused ? ".fused" : "", tn, gm);
        cmp(p, name, okv, 1e-4, 1e-5);
        snprintf(name, sizeof name, "attention_kv_fwd.lse.Tq%d.T%d.H%d/%d.D%d%s", Tq, T, Hq, Hkv, D,
                 gm);
        cmp(p, name, lkv, 1e-5, 1e-6);
    }

    /* Gradients are written over non-zero buffers (padding columns kept). */
    buf dq = brand(p, nq, 0.1), dk = fused ? dq : brand(p, nkv, 0.1),
        dv = fused ? dq : brand(p, nkv, 0.1);
    kn_attention_bwd(p->cpu, KN_F32, KN_F32, F(dq, cpu), F(dk, cpu) + ko, F(dv, cpu) + vo,
                     F(dout, cpu), KN_F32, F(out, cpu), F(lse, cpu), F(q, cpu), F(k, cpu) + ko,
                     F(v, cpu) + vo, B, T, Hq, Hkv, D, ldq, ldkv, scale, cap, window);
    kn_attention_bwd(p->dev, KN_F32, KN_F32, F(dq, dev), F(dk, dev) + ko, F(dv, dev) + vo,
                     F(dout, dev), KN_F32, F(out, dev), F(lse, dev), F(q, dev), F(k, dev) + ko,
                     F(v, dev) + vo, B, T, Hq, Hkv, D, ldq, ldkv, scale, cap, window);
    snprintf(name, sizeof name, "attention_bwd.dq.T%d.H%d/%d.D%d%s%s%s", T, Hq, Hkv, D,
             fused ? ".fused" : "", tn, gm);
    cmp(p, name, dq, 2e-4, 2e-5);
    if (!fused) {
        snprintf(name, sizeof name, "attention_bwd.dk.T%d.H%d/%d.D%d%s", T, Hq, Hkv, D, gm);
        cmp(p, name, dk, 2e-4, 2e-5);
        snprintf(name, sizeof name, "attention_bwd.dv.T%d.H%d/%d.D%d%s", T, Hq, Hkv, D, gm);
        cmp(p, name, dv, 2e-4, 2e-5);
        /* NULL dq: only dk and dv move. */
        kn_attention_bwd(p->cpu, KN_F32, KN_F32, NULL, F(dk, cpu), F(dv, cpu), F(dout, cpu), KN_F32,
                         F(out, cpu), F(lse, cpu), F(q, cpu), F(k, cpu), F(v, cpu), B, T, Hq, Hkv,
                         D, ldq, ldkv, scale, cap, window);
        kn_attention_bwd(p->dev, KN_F32, KN_F32, NULL, F(dk, dev), F(dv, dev), F(dout, dev), KN_F32,
                         F(out, dev), F(lse, dev), F(q, dev), F(k, dev), F(v, dev), B, T, Hq, Hkv,
                         D, ldq, ldkv, scale, cap, window);
        cmp(p, "attention_bwd.null_dq.dk", dk, 2e-4, 2e-5);
        cmp(p, "attention_bwd.null_dq.dv", dv, 2e-4, 2e-5);
    }
}

static void att_case_dt(pair *p, int B, int T, int Hq, int Hkv, int D, int fused, kn_dtype dt)
{
    att_case_g(p, B, T, Hq, Hkv, D, fused, dt, 0.0f, 0.0f, 0);
}

static void att_case(pair *p, int B, int T, int Hq, int Hkv, int D, int fused)
{
    att_case_dt(p, B, T, Hq, Hkv, D, fused, KN_F32);
}

static void t_attention(pair *p)
{
    int s = g_scale;
    /* T not a multiple of the 32-row tile; GQA ratios 1, 4, 8; head dims
     * 64, 80, 128 and a small odd one. */
    att_case(p, 2, 37 * s, 2, 2, 16, 0);
    att_case(p, 1, 45 * s, 4, 1, 64, 0);
    att_case(p, 1, 33 * s, 8, 1, 80, 0);
    att_case(p, 1, 19 * s, 2, 2, 128, 0);
    att_case(p, 2, 29 * s, 3, 3, 24, 1); /* GPT-2's fused qkv */
    att_case(p, 1, 70 * s, 8, 2, 32, 0);
    /* Gemma 2 / 3 at odd shapes: query_pre_attn_scalar's scale with a
     * soft-cap that bites (q, k up to 1.5: scores past the cap), sliding
     * windows shorter than T and not multiples of the tiles, GQA. */
    att_case_g(p, 1, 45 * s, 4, 2, 24, 0, KN_F32, 0.35f, 2.0f, 0);
    att_case_g(p, 2, 37 * s, 4, 1, 16, 0, KN_F32, 0.0f, 0.0f, 11);
    att_case_g(p, 1, 70 * s, 8, 2, 40, 0, KN_F32, 0.2f, 3.0f, 33);
    att_case_g(p, 2, 29 * s, 3, 3, 24, 1, KN_F32, 0.0f, 1.5f, 5); /* fused */
    /* 16-bit inputs at the odd shapes: T not a multiple of the
     * 32-row tile, head dims 64 / 80 / 128, GQA ratios 4 / 8 / 1. */
    const kn_dtype dts[2] = {KN_BF16, KN_F16};
    for (int k = 0; k < 2; k++) {
        att_case_dt(p, 1, 45 * s, 4, 1, 64, 0, dts[k]);
        att_case_dt(p, 1, 33 * s, 8, 1, 80, 0, dts[k]);
        att_case_dt(p, 1, 19 * s, 2, 2, 128, 0, dts[k]);
    }
    /* An unsupported head dim is an error on the context, not garbage. */
    buf big = bzeros(p, 4 * 300 * 4);
    kn_attention_fwd(p->dev, KN_F32, F(big, dev), F(big, dev), F(big, dev), F(big, dev),
                     F(big, dev), 1, 1, 1, 1, 300, 300, 300, 0.0f, 0.0f, 0);
    ty_err err = {0};
    if (kn_check(p->dev, &err) == 0 || !strstr(err.msg, "head dim")) {
        TY_FAIL("attention with D=300 was not refused ('%s')", err.msg);
    }
}

/* The padded loss head (kn_logit_ld): bf16 logits rows ld = V rounded up
 * to 128 apart, the lm_head GEMMs and the in-place cross-entropy on both
 * sides; the padding columns hold random values both sides must leave
 * as they are (compared with the rest). */
static void t_head_padded(pair *p, buf tg, int N, int V)
{
    int K = 64, ld = (V + 127) / 128 * 128;
    size_t nl = (size_t)N * ld;
    buf x32 = brand(p, (size_t)N * K, 1), w32 = brand(p, (size_t)V * K, 1), l32 = brand(p, nl, 8);
    buf x = bzeros(p, (size_t)N * K * 2), w = bzeros(p, (size_t)V * K * 2), l = bzeros(p, nl * 2);
    buf dx = brand(p, (size_t)N * K, 1), dw = brand(p, (size_t)V * K, 1), loss = bzeros(p, N * 4);
    kn_ctx *side[2] = {p->cpu, p->dev};
    for (int s = 0; s < 2; s++) {
        void *xs = s ? x.dev : x.cpu, *ws = s ? w.dev : w.cpu, *ls = s ? l.dev : l.cpu;
        kn_convert(side[s], xs, KN_BF16, s ? x32.dev : x32.cpu, KN_F32, (size_t)N * K);
        kn_convert(side[s], ws, KN_BF16, s ? w32.dev : w32.cpu, KN_F32, (size_t)V * K);
        kn_convert(side[s], ls, KN_BF16, s ? l32.dev : l32.cpu, KN_F32, nl);
        kn_logits_fwd(side[s], KN_BF16, ls, xs, ws, N, K, V, ld);
    }
    cmp16(p, "logits_fwd.padded.bf16", l, nl, KN_BF16, 8e-3, 1e-3);
    kn_crossentropy_fwd_bwd(p->cpu, KN_BF16, F(loss, cpu), l.cpu, l.cpu, tg.cpu, N, V, ld,
                            1.0f / 22, 0.0f);
    kn_crossentropy_fwd_bwd(p->dev, KN_BF16, F(loss, dev), l.dev, l.dev, tg.dev, N, V, ld,
                            1.0f / 22, 0.0f);
    cmp(p, "crossentropy_fwd_bwd.padded.loss", loss, 1e-4, 1e-5);
    cmp16(p, "crossentropy_fwd_bwd.padded.bf16", l, nl, KN_BF16, 8e-3, 1e-3);
    /* the backward reads the CPU's dlogits (host memory) on both sides */
    kn_to_device(p->dev, l.dev, l.cpu, nl * 2);
    kn_logits_bwd(p->cpu, KN_BF16, F(dx, cpu), F(dw, cpu), l.cpu, x.cpu, w.cpu, N, K, V, ld);
    kn_logits_bwd(p->dev, KN_BF16, F(dx, dev), F(dw, dev), l.dev, x.dev, w.dev, N, K, V, ld);
    cmp(p, "logits_bwd.padded.dx", dx, 1e-4, 1e-5);
    cmp(p, "logits_bwd.padded.dw", dw, 1e-4, 1e-5);
}

static void t_crossentropy(pair *p)
{
    int N = 23, V = 1001 * g_scale; /* V not a multiple of 64: the head splits (cuda_loss.cu) */
    int32_t *t = malloc(N * sizeof *t);
    for (int i = 0; i < N; i++)
        t[i] = (int32_t)((urand() + 1) * 0.5 * V) % V;
    t[3] = -100;
    t[7] = V - 1;
    t[8] = 0;
    buf tg = bput(p, t, N * sizeof *t), l = brand(p, (size_t)N * V, 8);
    buf loss = bzeros(p, N * 4), dl = bzeros(p, (size_t)N * V * 4);
    kn_crossentropy_fwd(p->cpu, KN_F32, F(loss, cpu), F(l, cpu), tg.cpu, N, V, V, 0.0f);
    kn_crossentropy_fwd(p->dev, KN_F32, F(loss, dev), F(l, dev), tg.dev, N, V, V, 0.0f);
    cmp(p, "crossentropy_fwd", loss, 1e-5, 1e-6);
    kn_crossentropy_fwd_bwd(p->cpu, KN_F32, F(loss, cpu), F(dl, cpu), F(l, cpu), tg.cpu, N, V, V,
                            1.0f / 22, 0.0f);
    kn_crossentropy_fwd_bwd(p->dev, KN_F32, F(loss, dev), F(dl, dev), F(l, dev), tg.dev, N, V, V,
                            1.0f / 22, 0.0f);
    cmp(p, "crossentropy_fwd_bwd.loss", loss, 1e-5, 1e-6);
    cmp(p, "crossentropy_fwd_bwd.dlogits", dl, 1e-5, 1e-6);
    /* In place (dlogits == logits), losses NULL. */
    kn_crossentropy_fwd_bwd(p->cpu, KN_F32, NULL, F(l, cpu), F(l, cpu), tg.cpu, N, V, V, 0.5f,
                            0.0f);
    kn_crossentropy_fwd_bwd(p->dev, KN_F32, NULL, F(l, dev), F(l, dev), tg.dev, N, V, V, 0.5f,
                            0.0f);
    cmp(p, "crossentropy_fwd_bwd.inplace", l, 1e-5, 1e-6);
    t_head_padded(p, tg, N, V);
    /* 16-bit logits and dlogits (the engine's bf16 / fp16 runs), read and
     * written in place as 16 bits; losses in fp32. */
    const kn_dtype dts[2] = {KN_BF16, KN_F16};
    for (int k = 0; k < 2; k++) {
        char what[64];
        buf l32 = brand(p, (size_t)N * V, 8), l16 = bzeros(p, (size_t)N * V * 2);
        buf g16 = bzeros(p, (size_t)N * V * 2);
        kn_convert(p->cpu, l16.cpu, dts[k], l32.cpu, KN_F32, (size_t)N * V);
        kn_convert(p->dev, l16.dev, dts[k], l32.dev, KN_F32, (size_t)N * V);
        double r16 = dts[k] == KN_BF16 ? 8e-3 : 1e-3;
        kn_crossentropy_fwd(p->cpu, dts[k], F(loss, cpu), l16.cpu, tg.cpu, N, V, V, 0.0f);
        kn_crossentropy_fwd(p->dev, dts[k], F(loss, dev), l16.dev, tg.dev, N, V, V, 0.0f);
        snprintf(what, sizeof what, "crossentropy_fwd.%s", kn_dtype_name(dts[k]));
        cmp(p, what, loss, 1e-5, 1e-6);
        kn_crossentropy_fwd_bwd(p->cpu, dts[k], F(loss, cpu), g16.cpu, l16.cpu, tg.cpu, N, V, V,
                                1.0f / 22, 0.0f);
        kn_crossentropy_fwd_bwd(p->dev, dts[k], F(loss, dev), g16.dev, l16.dev, tg.dev, N, V, V,
                                1.0f / 22, 0.0f);
        snprintf(what, sizeof what, "crossentropy_fwd_bwd.%s.dlogits", kn_dtype_name(dts[k]));
        cmp16(p, what, g16, (size_t)N * V, dts[k], r16, 1e-3);
        kn_crossentropy_fwd_bwd(p->cpu, dts[k], NULL, l16.cpu, l16.cpu, tg.cpu, N, V, V, 0.5f,
                                0.0f);
        kn_crossentropy_fwd_bwd(p->dev, dts[k], NULL, l16.dev, l16.dev, tg.dev, N, V, V, 0.5f,
                                0.0f);
        snprintf(what, sizeof what, "crossentropy_fwd_bwd.%s.inplace", kn_dtype_name(dts[k]));
        cmp16(p, what, l16, (size_t)N * V, dts[k], r16, 1e-3);
    }
    /* Gemma 2's final-logit soft-cap, fp32 and bf16 logits: saturating
     * (logits up to 8 against a cap of 3), in place. */
    for (int k = 0; k < 2; k++) {
        kn_dtype dtc = k ? KN_BF16 : KN_F32;
        char what[64];
        buf l32 = brand(p, (size_t)N * V, 8), lc = bzeros(p, (size_t)N * V * kn_dtype_size(dtc));
        kn_convert(p->cpu, lc.cpu, dtc, l32.cpu, KN_F32, (size_t)N * V);
        kn_convert(p->dev, lc.dev, dtc, l32.dev, KN_F32, (size_t)N * V);
        kn_crossentropy_fwd(p->cpu, dtc, F(loss, cpu), lc.cpu, tg.cpu, N, V, V, 3.0f);
        kn_crossentropy_fwd(p->dev, dtc, F(loss, dev), lc.dev, tg.dev, N, V, V, 3.0f);
        snprintf(what, sizeof what, "crossentropy_fwd.softcap.%s", kn_dtype_name(dtc));
        cmp(p, what, loss, 1e-5, 1e-6);
        kn_crossentropy_fwd_bwd(p->cpu, dtc, F(loss, cpu), lc.cpu, lc.cpu, tg.cpu, N, V, V,
                                1.0f / 22, 3.0f);
        kn_crossentropy_fwd_bwd(p->dev, dtc, F(loss, dev), lc.dev, lc.dev, tg.dev, N, V, V,
                                1.0f / 22, 3.0f);
        snprintf(what, sizeof what, "crossentropy_fwd_bwd.softcap.%s.inplace", kn_dtype_name(dtc));
        if (dtc == KN_F32)
            cmp(p, what, lc, 1e-5, 1e-6);
        else
            cmp16(p, what, lc, (size_t)N * V, dtc, 8e-3, 1e-3);
    }
    kn_softcap(p->cpu, F(l, cpu), (size_t)N * V, 2.0f);
    kn_softcap(p->dev, F(l, dev), (size_t)N * V, 2.0f);
    cmp(p, "softcap", l, 1e-6, 1e-7);
    /* An out-of-range target is NaN on both. */
    t[0] = V;
    kn_to_device(p->cpu, tg.cpu, t, N * sizeof *t);
    kn_to_device(p->dev, tg.dev, t, N * sizeof *t);
    kn_crossentropy_fwd(p->dev, KN_F32, F(loss, dev), F(dl, dev), tg.dev, N, V, V, 0.0f);
    float l0;
    kn_to_host(p->dev, &l0, F(loss, dev), sizeof l0);
    if (!isnan(l0)) {
        TY_FAIL("crossentropy: target V gave %g, not NaN", l0);
    }
    free(t);
}

/* Conversions must match the CPU bit for bit, including the edges:
 * NaN, inf, fp16 overflow (65504, 65519.99, 65520), subnormals and ties. */
static void t_convert(pair *p)
{
    size_t n = 20000;
    float *h = hrand(n, 4);
    const float edge[] = {NAN,         -NAN,           INFINITY,       -INFINITY,     0.0f,
                          -0.0f,       65504.0f,       65519.99f,      65520.0f,      -65536.0f,
                          1e-8f,       5.9604645e-8f,  2.9802322e-8f,  2.9802326e-8f, 6.1035156e-5f,
                          6.1e-5f,     1.00048828125f, 1.00146484375f, 3.0e38f,       1.0e-40f,
                          1.00390625f, 1.01171875f};
    for (size_t i = 0; i < sizeof edge / sizeof *edge; i++)
        h[i] = edge[i];
    for (size_t i = 100; i < 2100; i++) /* a sweep through fp16's subnormal range */
        h[i] = (float)(i - 1100) * 3.1e-9f;
    buf x = bput(p, h, n * 4), h16 = bzeros(p, n * 2), back = bzeros(p, n * 4);
    const kn_dtype dts[2] = {KN_BF16, KN_F16};
    for (int k = 0; k < 2; k++) {
        const char *nm = kn_dtype_name(dts[k]);
        char what[64];
        kn_convert(p->cpu, h16.cpu, dts[k], x.cpu, KN_F32, n);
        kn_convert(p->dev, h16.dev, dts[k], x.dev, KN_F32, n);
        snprintf(what, sizeof what, "convert.f32_to_%s", nm);
        cmp_bytes(p, what, h16);
        kn_convert(p->cpu, back.cpu, KN_F32, h16.cpu, dts[k], n);
        kn_convert(p->dev, back.dev, KN_F32, h16.dev, dts[k], n);
        snprintf(what, sizeof what, "convert.%s_to_f32", nm);
        cmp_bytes(p, what, back);
        buf r = bput(p, h, n * 4);
        kn_round(p->cpu, F(r, cpu), n, dts[k]);
        kn_round(p->dev, F(r, dev), n, dts[k]);
        snprintf(what, sizeof what, "round.%s", nm);
        cmp_bytes(p, what, r);
    }
    buf b16 = bzeros(p, n * 2);
    kn_convert(p->cpu, b16.cpu, KN_BF16, h16.cpu, KN_F16, n);
    kn_convert(p->dev, b16.dev, KN_BF16, h16.dev, KN_F16, n);
    cmp_bytes(p, "convert.f16_to_bf16", b16);
    free(h);

    /* matmul16: a 16-bit weight, fp32 activations holding 16-bit values. */
    int N = 19, K = 37, M = 23;
    for (int k = 0; k < 2; k++) {
        buf xw = brand(p, (size_t)N * K, 1), w32 = brand(p, (size_t)M * K, 1);
        kn_round(p->cpu, F(xw, cpu), (size_t)N * K, dts[k]);
        kn_round(p->dev, F(xw, dev), (size_t)N * K, dts[k]);
        buf w = bzeros(p, (size_t)M * K * 2), bias = brand(p, M, 1);
        kn_convert(p->cpu, w.cpu, dts[k], w32.cpu, KN_F32, (size_t)M * K);
        kn_convert(p->dev, w.dev, dts[k], w32.dev, KN_F32, (size_t)M * K);
        buf o = bzeros(p, (size_t)N * M * 4), d = brand(p, (size_t)N * M, 1);
        buf dx = brand(p, (size_t)N * K, 1), dw = brand(p, (size_t)M * K, 1), db = brand(p, M, 1);
        kn_round(p->cpu, F(d, cpu), (size_t)N * M, dts[k]); /* dout holds dt values too */
        kn_round(p->dev, F(d, dev), (size_t)N * M, dts[k]);
        kn_matmul16_fwd(p->cpu, dts[k], KN_F32, KN_F32, F(o, cpu), F(xw, cpu), w.cpu, F(bias, cpu),
                        KN_F32, N, K, M);
        kn_matmul16_fwd(p->dev, dts[k], KN_F32, KN_F32, F(o, dev), F(xw, dev), w.dev, F(bias, dev),
                        KN_F32, N, K, M);
        cmp(p, k ? "matmul16_fwd.fp16" : "matmul16_fwd.bf16", o, 1e-5, 1e-6);
        kn_matmul16_bwd(p->cpu, dts[k], KN_F32, KN_F32, F(dx, cpu), F(dw, cpu), F(db, cpu),
                        F(d, cpu), F(xw, cpu), w.cpu, N, K, M);
        kn_matmul16_bwd(p->dev, dts[k], KN_F32, KN_F32, F(dx, dev), F(dw, dev), F(db, dev),
                        F(d, dev), F(xw, dev), w.dev, N, K, M);
        cmp(p, "matmul16_bwd.dx", dx, 1e-5, 1e-6);
        cmp(p, "matmul16_bwd.dw", dw, 1e-5, 1e-6);
        cmp(p, "matmul16_bwd.dbias", db, 1e-5, 1e-6);
    }
    /* The native 16-bit path end to end: 16-bit result (rounded by the
     * epilogue, bias fused) and 16-bit dout into fp32 gradients, at odd
     * shapes (K = 80, a head dim; M = 1001, a vocabulary not a multiple of
     * 64) and without bias. */
    const int shapes[3][3] = {{19, 37, 23}, {21 * g_scale, 80, 1001}, {3, 128, 64}};
    for (int k = 0; k < 2; k++)
        for (int sh = 0; sh < 3; sh++) {
            int n = shapes[sh][0], kk = shapes[sh][1], m = shapes[sh][2], has_bias = sh != 2;
            char what[80];
            const char *nm = kn_dtype_name(dts[k]);
            double r16 = dts[k] == KN_BF16 ? 8e-3 : 1e-3;
            buf xw = brand(p, (size_t)n * kk, 1), w32 = brand(p, (size_t)m * kk, 1),
                bias = brand(p, m, 1);
            kn_round(p->cpu, F(xw, cpu), (size_t)n * kk, dts[k]);
            kn_round(p->dev, F(xw, dev), (size_t)n * kk, dts[k]);
            /* a 16-bit result's bias holds values of its type (kernels.h) */
            kn_round(p->cpu, F(bias, cpu), (size_t)m, dts[k]);
            kn_round(p->dev, F(bias, dev), (size_t)m, dts[k]);
            buf w = bzeros(p, (size_t)m * kk * 2), o16 = bzeros(p, (size_t)n * m * 2);
            kn_convert(p->cpu, w.cpu, dts[k], w32.cpu, KN_F32, (size_t)m * kk);
            kn_convert(p->dev, w.dev, dts[k], w32.dev, KN_F32, (size_t)m * kk);
            kn_matmul16_fwd(p->cpu, dts[k], dts[k], KN_F32, o16.cpu, F(xw, cpu), w.cpu,
                            has_bias ? F(bias, cpu) : NULL, KN_F32, n, kk, m);
            kn_matmul16_fwd(p->dev, dts[k], dts[k], KN_F32, o16.dev, F(xw, dev), w.dev,
                            has_bias ? F(bias, dev) : NULL, KN_F32, n, kk, m);
            snprintf(what, sizeof what, "matmul16_fwd.%s_out.%dx%dx%d", nm, n, kk, m);
            cmp16(p, what, o16, (size_t)n * m, dts[k], r16, 1e-3);
            buf d32 = brand(p, (size_t)n * m, 1), d16 = bzeros(p, (size_t)n * m * 2);
            kn_convert(p->cpu, d16.cpu, dts[k], d32.cpu, KN_F32, (size_t)n * m);
            kn_convert(p->dev, d16.dev, dts[k], d32.dev, KN_F32, (size_t)n * m);
            buf dx = brand(p, (size_t)n * kk, 1), dw = brand(p, (size_t)m * kk, 1),
                db = brand(p, m, 1);
            kn_matmul16_bwd(p->cpu, dts[k], dts[k], KN_F32, F(dx, cpu), F(dw, cpu), F(db, cpu),
                            d16.cpu, F(xw, cpu), w.cpu, n, kk, m);
            kn_matmul16_bwd(p->dev, dts[k], dts[k], KN_F32, F(dx, dev), F(dw, dev), F(db, dev),
                            d16.dev, F(xw, dev), w.dev, n, kk, m);
            snprintf(what, sizeof what, "matmul16_bwd.%s_dout.dx", nm);
            cmp(p, what, dx, 1e-5, 1e-6);
            snprintf(what, sizeof what, "matmul16_bwd.%s_dout.dw", nm);
            cmp(p, what, dw, 1e-5, 1e-6);
            snprintf(what, sizeof what, "matmul16_bwd.%s_dout.dbias", nm);
            cmp(p, what, db, 1e-5, 1e-6);
        }
}

/* The loss head's chunk (kn_logit_rows): the CPU's 32 MiB of logits; on
 * the device the whole batch while it fits the budget (1 GiB, or a
 * 64th of the card's memory), else whole 128-row tiles of it. */
static void t_logit_rows(pair *p)
{
    size_t V = 50257, total = kn_info(p->dev)->total_mem;
    size_t budget = total / 64 && total / 64 < ((size_t)1 << 30) ? total / 64 : (size_t)1 << 30;
    size_t fit = budget / (V * 2), tiles = fit / 128 * 128;
    int cpu = kn_logit_rows(p->cpu, 8192, V, 2), all = kn_logit_rows(p->dev, fit, V, 2);
    int over = kn_logit_rows(p->dev, fit + 1000, V, 2), few = kn_logit_rows(p->dev, 100, V, 2);
    printf("logit rows: cpu %d, device %d of %zu, %d of %zu\n", cpu, all, fit, over, fit + 1000);
    if (cpu != (int)(((size_t)32 << 20) / (V * 2))) TY_FAIL("cpu logit rows %d", cpu);
    if (all != (int)fit) TY_FAIL("device logit rows %d, the batch is %zu", all, fit);
    if (over != (int)tiles || over % 128) TY_FAIL("device logit rows %d, want %zu", over, tiles);
    if (few != 100) TY_FAIL("device logit rows %d for a 100-row batch", few);
    if (kn_logit_rows(p->dev, 100000, 1 << 24, 4) != 128) TY_FAIL("device logit rows under 128");
}

static void t_context(pair *p)
{
    const char *d = kn_describe(p->dev);
    printf("device: %s\n", d);
    if (strncmp(d, kn_device_name(p->dev), strlen(kn_device_name(p->dev)))) {
        TY_FAIL("describe '%s' does not name the device", d);
    }
    size_t before = kn_bytes_in_use(p->dev);
    void *a = kn_alloc(p->dev, 1000);
    float z[250];
    kn_to_host(p->dev, z, a, sizeof z);
    for (int i = 0; i < 250; i++)
        if (z[i] != 0.0f) {
            TY_FAIL("kn_alloc memory not zeroed");
            break;
        }
    if (kn_bytes_in_use(p->dev) != before + 1000) {
        TY_FAIL("byte accounting");
    }
    kn_free(p->dev, a);
    /* The sticky error channel: an op failing inside makes later ops no-ops
     * until kn_check collects it. */
    kn_fail(p->dev, TY_EIO, "synthetic");
    ty_err err = {0};
    if (kn_check(p->dev, &err) != TY_EIO || !strstr(err.msg, "synthetic") ||
        strncmp(err.msg, kn_device_name(p->dev), strlen(kn_device_name(p->dev)))) {
        TY_FAIL("kn_check: '%s'", err.msg);
    }
    t_logit_rows(p);
}

/* Whether name is in list: "all", or names separated by commas. */
static int listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    if (!strcmp(list, "all")) return 1;
    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, name, n) && (p[n] == ',' || p[n] == 0)) return 1;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_kernels_device <group> [cuda-emu|cuda] [scale]\n");
        return 2;
    }
    const char *bname = argc > 2 ? argv[2] : "cuda-emu";
    if (argc > 3) g_scale = atoi(argv[3]) > 0 ? atoi(argv[3]) : 1;
    const kn_backend *be = NULL;
    if (!strcmp(bname, "cuda-emu")) be = &kn_cuda_emu_backend;
#ifdef TY_KN_HAVE_CUDA
    else if (!strcmp(bname, "cuda"))
        be = &kn_cuda_backend;
#endif
    if (!be) {
        fprintf(stderr, "backend %s is not in this build\n", bname);
        return 2;
    }
    pair p = {0};
    ty_err err = {0};
    if (kn_open(&p.cpu, KN_CPU, 0, 1, &err) || kn_open_backend(&p.dev, be, KN_CUDA, 0, 0, &err)) {
        fprintf(stderr, "open: %s\n", err.msg);
        return 2;
    }
    static const struct {
        const char *name;
        void (*fn)(pair *);
    } groups[] = {{"context", t_context},         {"elementwise", t_elementwise},
                  {"activations", t_activations}, {"adamw", t_adamw},
                  {"embedding", t_embedding},     {"norm", t_norm},
                  {"matmul", t_matmul},           {"rope", t_rope},
                  {"attention", t_attention},     {"crossentropy", t_crossentropy},
                  {"convert", t_convert},         {"nf4", t_nf4},
                  {"matmul_gelu", t_matmul_gelu}, {"dora", t_dora}};
    int found = 0;
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
        if (listed(argv[1], groups[i].name)) {
            groups[i].fn(&p);
            found++;
        }
    kn_close(p.dev);
    kn_close(p.cpu);
    int want = 1; /* names in the list: each must be a group */
    for (const char *c = strchr(argv[1], ','); c; c = strchr(c + 1, ','))
        want++;
    if (!found || (strcmp(argv[1], "all") && found != want)) {
        fprintf(stderr, "unknown group in %s\n", argv[1]);
        return 2;
    }
    return ty_summary(argc > 1 ? argv[1] : "kernels");
}
