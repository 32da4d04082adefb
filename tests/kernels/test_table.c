/* test_table.c — one table of kernel cases, run against every backend the
 * build contains (device-independent kernel tests).
 *
 * Unlike test_kernels.c (CPU only: it reads kn_alloc'd memory directly),
 * every case here goes through the device interface only: inputs are drawn
 * on the host (uniform in +-[0.1, 1], never zero, so a kernel that skips
 * work cannot pass by accident), copied in with kn_to_device, outputs are
 * poisoned with NaN before the call, results come back with kn_to_host and
 * are compared with a float64 reference written here, with the tolerance of
 * the case's dtype (rtol and an absolute floor relative to the largest
 * reference value):
 *     fp32 1e-5 / 1e-6     bf16 1e-2 / 1e-3     fp16 2e-3 / 2e-4
 * Ops that take a dtype for their activations (kn_matmul16 out / dout,
 * kn_crossentropy logits; case "typed": every activation op) run in each dtype: 16-bit results are held to
 * that dtype's tolerance, values computed in fp32 from exact 16-bit
 * inputs to fp32's.
 * Accumulating ops start from random non-zero gradients, so the check
 * covers "+=". Backends that cannot be opened (this build has no CUDA) are
 * reported and skipped; the CPU always runs.
 * Usage: test_kernels_table [case]  (ctest kernels.table). */
#include "kernels.h"
#ifdef TY_TEST_CUDA_EMU
#include "backend.h" /* kn_open_backend, kn_cuda_emu_backend */
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tyassert.h"

static uint64_t g_rng = 0x2545f4914f6cdd1dULL;

static double draw(void) /* +-[0.1, 1) */
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    double u = (double)(g_rng >> 11) / 9007199254740992.0;
    double v = 0.1 + 0.9 * u;
    return (g_rng & 1) ? v : -v;
}

static const struct {
    double rtol, atol;
} TOL[3] = {{1e-5, 1e-6}, {1e-2, 1e-3}, {2e-3, 2e-4}}; /* by kn_dtype */

/* ---- host <-> device helpers ------------------------------------------- */

typedef struct {
    kn_ctx *c;
    const char *dev, *name;
} tc;

static float *hrand(size_t n, double scale)
{
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(draw() * scale);
    return h;
}

static void *dput(tc *t, const void *h, size_t bytes)
{
    void *d = kn_alloc(t->c, bytes ? bytes : 1);
    if (h) kn_to_device(t->c, d, h, bytes);
    return d;
}

/* A device float buffer of n NaNs (an output that must be written). */
static float *dpoison(tc *t, size_t n)
{
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    float *d = dput(t, h, n * sizeof *h);
    free(h);
    return d;
}

/* Device result vs double reference under dtype dt's tolerance. */
static void expect(tc *t, const char *what, const float *d, const double *want, size_t n,
                   kn_dtype dt)
{
    float *h = malloc(n * sizeof *h);
    kn_sync(t->c);
    kn_to_host(t->c, h, d, n * sizeof *h);
    double mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(want[i]));
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)h[i] - want[i]);
        if (!(e <= TOL[dt].rtol * fabs(want[i]) + TOL[dt].atol * mx)) {
            if (bad++ < 3)
                fprintf(stderr, "FAIL %s %s %s[%zu]: got %.9g want %.9g\n", t->dev, t->name, what,
                        i, h[i], want[i]);
        }
    }
    ty_failures += bad;
    free(h);
}

static double *dvec(size_t n)
{
    return calloc(n ? n : 1, sizeof(double));
}

/* ---- cases ------------------------------------------------------------ */

static void c_elementwise(tc *t)
{
    size_t n = 20011;
    float *ha = hrand(n, 1), *hb = hrand(n, 1);
    float *a = dput(t, ha, n * 4), *b = dput(t, hb, n * 4), *o = dpoison(t, n);
    double *w = dvec(n);
    kn_add(t->c, KN_F32, o, a, b, n);
    for (size_t i = 0; i < n; i++)
        w[i] = (double)ha[i] + hb[i];
    expect(t, "add", o, w, n, KN_F32);
    kn_axpy(t->c, a, b, n, 0.75f); /* a += 0.75 b */
    for (size_t i = 0; i < n; i++)
        w[i] = (double)ha[i] + 0.75 * hb[i];
    expect(t, "axpy", a, w, n, KN_F32);
    kn_scale(t->c, b, n, -1.5f);
    for (size_t i = 0; i < n; i++)
        w[i] = -1.5 * hb[i];
    expect(t, "scale", b, w, n, KN_F32);
    float *o2 = dpoison(t, n);
    kn_copy(t->c, o2, b, n);
    expect(t, "copy", o2, w, n, KN_F32);
    double s = 0, ss = 0;
    for (size_t i = 0; i < n; i++)
        s += w[i], ss += w[i] * w[i];
    double gs = kn_sum(t->c, b, n), gss = kn_sumsq(t->c, b, n);
    if (fabs(gs - s) > 1e-9 * n || fabs(gss - ss) > 1e-9 * ss)
        TY_FAIL("%s sum %.17g/%.17g vs %.17g/%.17g", t->dev, gs, gss, s, ss);
    free(ha), free(hb), free(w);
}

static void c_convert(tc *t)
{
    size_t n = 5003;
    float *h = hrand(n, 300.0);
    float *x = dput(t, h, n * 4);
    for (int dt = KN_BF16; dt <= KN_F16; dt++) {
        void *d16 = dput(t, NULL, n * 2);
        float *back = dpoison(t, n);
        kn_convert(t->c, d16, (kn_dtype)dt, x, KN_F32, n);
        kn_convert(t->c, back, KN_F32, d16, (kn_dtype)dt, n);
        double *w = dvec(n);
        for (size_t i = 0; i < n; i++)
            w[i] = h[i];
        expect(t, dt == KN_BF16 ? "convert bf16" : "convert fp16", back, w, n, (kn_dtype)dt);
        free(w);
    }
    free(h);
}

static void c_embedding(tc *t)
{
    int V = 37, C = 19, N = 23;
    float *ht = hrand((size_t)V * C, 1);
    int32_t ids[23];
    for (int i = 0; i < N; i++)
        ids[i] = (i * 11 + 3) % V;
    float *tab = dput(t, ht, (size_t)V * C * 4), *o = dpoison(t, (size_t)N * C);
    int32_t *di = dput(t, ids, sizeof ids);
    kn_embedding_fwd(t->c, KN_F32, o, di, tab, N, C, 0);
    double *w = dvec((size_t)N * C);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < C; j++)
            w[(size_t)n * C + j] = ht[(size_t)ids[n] * C + j];
    expect(t, "embedding", o, w, (size_t)N * C, KN_F32);
    free(ht), free(w);
}

static void c_norms(tc *t)
{
    int N = 17, C = 45;
    float *hx = hrand((size_t)N * C, 2), *hw = hrand(C, 1), *hb = hrand(C, 1);
    float *x = dput(t, hx, (size_t)N * C * 4), *wgt = dput(t, hw, C * 4), *b = dput(t, hb, C * 4);
    float *o = dpoison(t, (size_t)N * C), *mean = dpoison(t, N), *rstd = dpoison(t, N);
    double *w = dvec((size_t)N * C), *wr = dvec(N);
    kn_layernorm_fwd(t->c, KN_F32, o, mean, rstd, x, wgt, b, N, C, 1e-5f);
    for (int n = 0; n < N; n++) {
        double mu = 0, var = 0;
        for (int j = 0; j < C; j++)
            mu += hx[(size_t)n * C + j];
        mu /= C;
        for (int j = 0; j < C; j++)
            var += (hx[(size_t)n * C + j] - mu) * (hx[(size_t)n * C + j] - mu);
        double rs = 1.0 / sqrt(var / C + 1e-5);
        wr[n] = rs;
        for (int j = 0; j < C; j++)
            w[(size_t)n * C + j] = (hx[(size_t)n * C + j] - mu) * rs * hw[j] + hb[j];
    }
    expect(t, "layernorm out", o, w, (size_t)N * C, KN_F32);
    expect(t, "layernorm rstd", rstd, wr, N, KN_F32);
    float *o2 = dpoison(t, (size_t)N * C), *r2 = dpoison(t, N);
    kn_rmsnorm_fwd(t->c, KN_F32, o2, r2, x, wgt, N, C, 1e-6f);
    for (int n = 0; n < N; n++) {
        double ms = 0;
        for (int j = 0; j < C; j++)
            ms += (double)hx[(size_t)n * C + j] * hx[(size_t)n * C + j];
        double rs = 1.0 / sqrt(ms / C + 1e-6);
        wr[n] = rs;
        for (int j = 0; j < C; j++)
            w[(size_t)n * C + j] = hx[(size_t)n * C + j] * rs * hw[j];
    }
    expect(t, "rmsnorm out", o2, w, (size_t)N * C, KN_F32);
    expect(t, "rmsnorm rstd", r2, wr, N, KN_F32);
    free(hx), free(hw), free(hb), free(w), free(wr);
}

static float *dclone(tc *t, const float *d, size_t n);
static void same_bits(tc *t, const char *what, kn_dtype dt, const void *x, const void *y, size_t n);

/* A bias given in the weights' 16-bit type (b_dt = dt) gives, bit for bit,
 * what the same values in fp32 give, out in dt and in fp32. */
static void bias16_same(tc *t, kn_dtype dt, const float *x, const void *w16, const float *b, int N,
                        int K, int M)
{
    size_t nm = (size_t)N * M, es = kn_dtype_size(dt);
    float *br = dclone(t, b, (size_t)M);
    void *b16 = dput(t, NULL, (size_t)M * es);
    kn_round(t->c, br, (size_t)M, dt); /* the values a 16-bit bias holds */
    kn_convert(t->c, b16, dt, br, KN_F32, (size_t)M);
    for (int od = 0; od < 2; od++) {
        kn_dtype out_dt = od ? KN_F32 : dt;
        size_t ob = nm * kn_dtype_size(out_dt);
        void *o1 = dput(t, NULL, ob), *o2 = dput(t, NULL, ob);
        kn_matmul16_fwd(t->c, dt, out_dt, KN_F32, o1, x, w16, br, KN_F32, N, K, M);
        kn_matmul16_fwd(t->c, dt, out_dt, KN_F32, o2, x, w16, b16, dt, N, K, M);
        same_bits(t, od ? "matmul16 16-bit bias, fp32 out" : "matmul16 16-bit bias", dt, o1, o2,
                  ob);
    }
}

/* matmul in fp32 and with 16-bit weights (inputs rounded on the host to
 * the dtype first, through the device's own convert). */
static void *typed_out(tc *t, kn_dtype dt, size_t n);

static void c_matmul(tc *t)
{
    int N = 33, K = 47, M = 29;
    for (int dt = KN_F32; dt <= KN_F16; dt++) {
        float *hx = hrand((size_t)N * K, 1), *hw = hrand((size_t)M * K, 1), *hb = hrand(M, 1);
        float *hg = hrand((size_t)N * M, 1), *hdx = hrand((size_t)N * K, 1),
              *hdw = hrand((size_t)M * K, 1);
        float *x = dput(t, hx, (size_t)N * K * 4), *wf = dput(t, hw, (size_t)M * K * 4),
              *b = dput(t, hb, M * 4);
        float *g = dput(t, hg, (size_t)N * M * 4);
        void *w16 = NULL;
        if (dt != KN_F32) { /* the values the op sees: rounded x, w, g */
            kn_round(t->c, x, (size_t)N * K, (kn_dtype)dt);
            kn_round(t->c, g, (size_t)N * M, (kn_dtype)dt);
            w16 = dput(t, NULL, (size_t)M * K * 2);
            kn_convert(t->c, w16, (kn_dtype)dt, wf, KN_F32, (size_t)M * K);
            kn_convert(t->c, wf, KN_F32, w16, (kn_dtype)dt, (size_t)M * K);
            kn_to_host(t->c, hx, x, (size_t)N * K * 4);
            kn_to_host(t->c, hg, g, (size_t)N * M * 4);
            kn_to_host(t->c, hw, wf, (size_t)M * K * 4);
        }
        float *o = dpoison(t, (size_t)N * M), *dx = dput(t, hdx, (size_t)N * K * 4),
              *dw = dput(t, hdw, (size_t)M * K * 4);
        if (dt == KN_F32) {
            kn_matmul_fwd(t->c, o, x, wf, b, N, K, M);
            kn_matmul_bwd(t->c, dx, dw, NULL, g, x, wf, N, K, M);
        } else {
            kn_matmul16_fwd(t->c, (kn_dtype)dt, KN_F32, KN_F32, o, x, w16, b, KN_F32, N, K, M);
            kn_matmul16_bwd(t->c, (kn_dtype)dt, KN_F32, KN_F32, dx, dw, NULL, g, x, w16, N, K, M);
        }
        double *wo = dvec((size_t)N * M), *wdx = dvec((size_t)N * K), *wdw = dvec((size_t)M * K);
        for (size_t i = 0; i < (size_t)N * K; i++)
            wdx[i] = hdx[i];
        for (size_t i = 0; i < (size_t)M * K; i++)
            wdw[i] = hdw[i];
        for (int n = 0; n < N; n++)
            for (int m = 0; m < M; m++) {
                double a = hb[m];
                for (int k = 0; k < K; k++) {
                    a += (double)hx[(size_t)n * K + k] * hw[(size_t)m * K + k];
                    wdx[(size_t)n * K + k] += (double)hg[(size_t)n * M + m] * hw[(size_t)m * K + k];
                    wdw[(size_t)m * K + k] += (double)hg[(size_t)n * M + m] * hx[(size_t)n * K + k];
                }
                wo[(size_t)n * M + m] = a;
            }
        /* Products of dt values are exact in fp32: fp32 tolerances hold. */
        expect(t, "matmul out", o, wo, (size_t)N * M, KN_F32);
        expect(t, "matmul dx (+=)", dx, wdx, (size_t)N * K, KN_F32);
        expect(t, "matmul dw (+=)", dw, wdw, (size_t)M * K, KN_F32);
        /* the written dx (kn_matmul16_dx) over poison, dout fp32 and (16-bit
         * runs) in dt: the GPU's beta-0 product must not read it */
        double *wdx1 = dvec((size_t)N * K);
        for (size_t i = 0; i < (size_t)N * K; i++)
            wdx1[i] = wdx[i] - hdx[i];
        const void *wt = dt == KN_F32 ? (const void *)wf : w16;
        for (int gt = 0; gt < (dt == KN_F32 ? 1 : 2); gt++) {
            float *dxw = dpoison(t, (size_t)N * K);
            void *gi = g;
            if (gt) {
                gi = dput(t, NULL, (size_t)N * M * 2);
                kn_convert(t->c, gi, (kn_dtype)dt, g, KN_F32, (size_t)N * M);
            }
            kn_matmul16_dx(t->c, (kn_dtype)dt, gt ? (kn_dtype)dt : KN_F32, KN_F32, dxw, gi, wt, N,
                           K, M);
            expect(t, gt ? "matmul16_dx (16-bit dout, written)" : "matmul16_dx (written)", dxw,
                   wdx1, (size_t)N * K, KN_F32);
            if (dt == KN_F32) continue;
            /* dx itself in dt: the product rounded once, so dt's tolerance */
            void *dx16 = typed_out(t, (kn_dtype)dt, (size_t)N * K);
            kn_matmul16_dx(t->c, (kn_dtype)dt, gt ? (kn_dtype)dt : KN_F32, (kn_dtype)dt, dx16, gi,
                           wt, N, K, M);
            kn_convert(t->c, dxw, KN_F32, dx16, (kn_dtype)dt, (size_t)N * K);
            expect(t, gt ? "matmul16_dx (16-bit dout, dx in dt)" : "matmul16_dx (dx in dt)", dxw,
                   wdx1, (size_t)N * K, (kn_dtype)dt);
        }
        free(wdx1);
        if (dt != KN_F32) {
            /* 16-bit out and dout (the engine's logits): out rounded to dt,
             * so dt's tolerance; dout 16-bit holds the same values as g, so
             * dx / dw accumulate once more by the same amounts. */
            void *o16 = dput(t, NULL, (size_t)N * M * 2), *g16 = dput(t, NULL, (size_t)N * M * 2);
            float *o16f = dpoison(t, (size_t)N * M);
            kn_matmul16_fwd(t->c, (kn_dtype)dt, (kn_dtype)dt, KN_F32, o16, x, w16, b, KN_F32, N, K,
                            M);
            kn_convert(t->c, o16f, KN_F32, o16, (kn_dtype)dt, (size_t)N * M);
            expect(t, "matmul16 out (16-bit)", o16f, wo, (size_t)N * M, (kn_dtype)dt);
            bias16_same(t, (kn_dtype)dt, x, w16, b, N, K, M);
            kn_convert(t->c, g16, (kn_dtype)dt, g, KN_F32, (size_t)N * M);
            kn_matmul16_bwd(t->c, (kn_dtype)dt, (kn_dtype)dt, KN_F32, dx, dw, NULL, g16, x, w16, N,
                            K, M);
            for (size_t i = 0; i < (size_t)N * K; i++)
                wdx[i] += wdx[i] - hdx[i];
            for (size_t i = 0; i < (size_t)M * K; i++)
                wdw[i] += wdw[i] - hdw[i];
            expect(t, "matmul16 dx (16-bit dout, +=)", dx, wdx, (size_t)N * K, KN_F32);
            expect(t, "matmul16 dw (16-bit dout, +=)", dw, wdw, (size_t)M * K, KN_F32);
        }
        free(hx), free(hw), free(hb), free(hg), free(hdx), free(hdw), free(wo), free(wdx),
            free(wdw);
    }
}

/* One-row products (decoding, N = 1: the CPU's cpu_gemv.c) in fp32, bf16
 * and fp16, over shapes that leave row and column remainders (K % 32,
 * M % 4 and % 16) and one large enough to be split over threads; with a
 * bias, fp32 or 16-bit out, fp32 or 16-bit x. Run also with
 * TY_KN_GEMV=portable (ctest kernels.table_gemv_portable). */
static void c_gemv(tc *t)
{
    const int shapes[][2] = {{1, 1}, {77, 37}, {256, 64}, {1000, 19}, {1030, 530}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int K = shapes[si][0], M = shapes[si][1];
        for (int dt = KN_F32; dt <= KN_F16; dt++) {
            float *hx = hrand((size_t)K, 1), *hw = hrand((size_t)M * K, 1), *hb = hrand(M, 1);
            float *x = dput(t, hx, (size_t)K * 4), *wf = dput(t, hw, (size_t)M * K * 4),
                  *b = dput(t, hb, M * 4), *o = dpoison(t, M), *o2 = dpoison(t, M);
            void *w16 = NULL, *x16 = NULL;
            if (dt != KN_F32) {
                kn_round(t->c, x, (size_t)K, (kn_dtype)dt);
                w16 = dput(t, NULL, (size_t)M * K * 2);
                x16 = dput(t, NULL, (size_t)K * 2);
                kn_convert(t->c, w16, (kn_dtype)dt, wf, KN_F32, (size_t)M * K);
                kn_convert(t->c, wf, KN_F32, w16, (kn_dtype)dt, (size_t)M * K);
                kn_convert(t->c, x16, (kn_dtype)dt, x, KN_F32, (size_t)K);
                kn_to_host(t->c, hx, x, (size_t)K * 4);
                kn_to_host(t->c, hw, wf, (size_t)M * K * 4);
            }
            double *wo = dvec(M), *wn = dvec(M);
            for (int m = 0; m < M; m++) {
                double a = 0;
                for (int k = 0; k < K; k++)
                    a += (double)hx[k] * hw[(size_t)m * K + k];
                wo[m] = a + hb[m];
                wn[m] = a;
            }
            if (dt == KN_F32) {
                kn_matmul_fwd(t->c, o, x, wf, b, 1, K, M);
                kn_matmul_fwd(t->c, o2, x, wf, NULL, 1, K, M);
                expect(t, "gemv fp32 out", o, wo, M, KN_F32);
                expect(t, "gemv fp32 out (no bias)", o2, wn, M, KN_F32);
            } else {
                kn_dtype d = (kn_dtype)dt;
                kn_matmul16_fwd(t->c, d, KN_F32, KN_F32, o, x, w16, b, KN_F32, 1, K, M);
                kn_matmul16_fwd(t->c, d, KN_F32, d, o2, x16, w16, NULL, KN_F32, 1, K, M);
                expect(t, "gemv 16-bit w out", o, wo, M, KN_F32);
                expect(t, "gemv 16-bit w and x out (no bias)", o2, wn, M, KN_F32);
                void *o16 = dput(t, NULL, (size_t)M * 2);
                float *o16f = dpoison(t, M);
                kn_matmul16_fwd(t->c, d, d, KN_F32, o16, x, w16, b, KN_F32, 1, K, M);
                kn_convert(t->c, o16f, KN_F32, o16, d, (size_t)M);
                expect(t, "gemv 16-bit out", o16f, wo, M, d);
            }
            free(hx), free(hw), free(hb), free(wo), free(wn);
        }
    }
}

/* GELU (tanh form) and its derivative in double, for the references. */
static double gelu_d(double v)
{
    return 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
}
static double gelu_grad_d(double v)
{
    double k = sqrt(2 / M_PI), t = tanh(k * (v + 0.044715 * v * v * v));
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
}

/* The typed pair of c_matmul_gelu: x (fp32 holding dt values) and g
 * copied to dt, pre / out / dout in dt; wp is the double product. */
static void matmul_gelu_typed(tc *t, kn_dtype dt, const float *x, const void *w, const float *b,
                              const float *g, const void *w2, const double *wp, int N, int K, int M,
                              int P)
{
    size_t nm = (size_t)N * M;
    void *x16 = dput(t, NULL, (size_t)N * K * 2), *g16 = dput(t, NULL, (size_t)N * P * 2);
    kn_convert(t->c, x16, dt, x, KN_F32, (size_t)N * K);
    kn_convert(t->c, g16, dt, g, KN_F32, (size_t)N * P);
    void *o16 = dput(t, NULL, nm * 2), *p16 = dput(t, NULL, nm * 2);
    float *dpre = dpoison(t, nm), *pf = dpoison(t, nm), *of = dpoison(t, nm);
    void *d16 = dput(t, NULL, nm * 2); /* dpre is stored in pre's type */
    kn_matmul_gelu_fwd(t->c, dt, dt, dt, o16, p16, x16, w, b, KN_F32, N, K, M);
    { /* a bias holding dt values, in fp32 and in dt (as the engine
         * passes it): the same bits */
        float *br = dclone(t, b, (size_t)M);
        void *b16 = dput(t, NULL, (size_t)M * 2), *o1 = dput(t, NULL, nm * 2),
             *p1 = dput(t, NULL, nm * 2), *o2 = dput(t, NULL, nm * 2), *p2 = dput(t, NULL, nm * 2);
        kn_round(t->c, br, (size_t)M, dt);
        kn_convert(t->c, b16, dt, br, KN_F32, (size_t)M);
        kn_matmul_gelu_fwd(t->c, dt, dt, dt, o1, p1, x16, w, br, KN_F32, N, K, M);
        kn_matmul_gelu_fwd(t->c, dt, dt, dt, o2, p2, x16, w, b16, dt, N, K, M);
        same_bits(t, "matmul_gelu 16-bit bias out", dt, o1, o2, nm * 2);
        same_bits(t, "matmul_gelu 16-bit bias pre", dt, p1, p2, nm * 2);
    }
    kn_matmul_dgelu(t->c, dt, dt, dt, d16, NULL, g16, w2, p16, N, M, P);
    kn_convert(t->c, dpre, KN_F32, d16, dt, nm);
    kn_convert(t->c, pf, KN_F32, p16, dt, nm);
    kn_convert(t->c, of, KN_F32, o16, dt, nm);
    float *hp = malloc(nm * 4), *hg = malloc((size_t)N * P * 4), *hw2 = malloc((size_t)P * M * 4);
    float *w2f = dpoison(t, (size_t)P * M);
    kn_convert(t->c, w2f, KN_F32, w2, dt, (size_t)P * M);
    kn_sync(t->c);
    kn_to_host(t->c, hp, pf, nm * 4);
    kn_to_host(t->c, hg, g, (size_t)N * P * 4);
    kn_to_host(t->c, hw2, w2f, (size_t)P * M * 4);
    double *wo = dvec(nm), *wd = dvec(nm);
    for (int n = 0; n < N; n++)
        for (int m = 0; m < M; m++) {
            double ga = 0, v = hp[(size_t)n * M + m];
            for (int q = 0; q < P; q++)
                ga += (double)hg[(size_t)n * P + q] * hw2[(size_t)q * M + m];
            wo[(size_t)n * M + m] = gelu_d(v);
            wd[(size_t)n * M + m] = ga * gelu_grad_d(v);
        }
    expect(t, "matmul_gelu typed pre", pf, wp, nm, dt);
    expect(t, "matmul_gelu typed out", of, wo, nm, dt);
    expect(t, "matmul_dgelu typed dpre (written)", dpre, wd, nm, dt);
    free(hp), free(hg), free(hw2), free(wo), free(wd);
}

/* kn_matmul_gelu_fwd / kn_matmul_dgelu: x[N,K] -> pre = x w^T + b ->
 * out = gelu(pre); backward from a next linear w2[P,M] and its dout[N,P].
 * M = 29 takes the unfused path on CUDA, M = 24 cuBLASLt's epilogues (aux
 * ld a multiple of 8). 16-bit weights: out and dpre to dt's tolerance (the
 * GELU's input is rounded to dt on one side, not the other); dbias is
 * checked against the sum of the op's own dpre, at fp32's. Then the typed
 * form a 16-bit run uses: x, pre, out and dout in dt (x_dt = out_dt =
 * dout_dt = pre_dt = dt): pre against the product (dt's tolerance), out
 * and dpre against GELU / its derivative of the pre the op stored. */
static void c_matmul_gelu(tc *t)
{
    int N = 33, K = 47, P = 13;
    for (int s = 0; s < 2; s++)
        for (int dt = KN_F32; dt <= KN_F16; dt++) {
            int M = s ? 24 : 29;
            kn_dtype d16 = (kn_dtype)dt;
            /* w at 0.4: pre within about +-4, where the CPU's fast tanh
             * keeps gelu' to fp32's tolerance (it saturates beyond). */
            float *hx = hrand((size_t)N * K, 1), *hw = hrand((size_t)M * K, 0.4), *hb = hrand(M, 1);
            float *hw2 = hrand((size_t)P * M, 1), *hg = hrand((size_t)N * P, 1), *hdb = hrand(M, 1);
            float *x = dput(t, hx, (size_t)N * K * 4), *wf = dput(t, hw, (size_t)M * K * 4),
                  *b = dput(t, hb, M * 4), *w2f = dput(t, hw2, (size_t)P * M * 4),
                  *g = dput(t, hg, (size_t)N * P * 4), *db = dput(t, hdb, M * 4);
            void *w = wf, *w2 = w2f;
            if (dt != KN_F32) { /* the values the op sees: rounded x, w, w2, g */
                kn_round(t->c, x, (size_t)N * K, d16);
                kn_round(t->c, g, (size_t)N * P, d16);
                w = dput(t, NULL, (size_t)M * K * 2), w2 = dput(t, NULL, (size_t)P * M * 2);
                kn_convert(t->c, w, d16, wf, KN_F32, (size_t)M * K);
                kn_convert(t->c, wf, KN_F32, w, d16, (size_t)M * K);
                kn_convert(t->c, w2, d16, w2f, KN_F32, (size_t)P * M);
                kn_convert(t->c, w2f, KN_F32, w2, d16, (size_t)P * M);
                kn_to_host(t->c, hx, x, (size_t)N * K * 4);
                kn_to_host(t->c, hg, g, (size_t)N * P * 4);
                kn_to_host(t->c, hw, wf, (size_t)M * K * 4);
                kn_to_host(t->c, hw2, w2f, (size_t)P * M * 4);
            }
            float *o = dpoison(t, (size_t)N * M), *pre = dpoison(t, (size_t)N * M),
                  *dpre = dpoison(t, (size_t)N * M);
            kn_matmul_gelu_fwd(t->c, d16, KN_F32, KN_F32, o, pre, x, w, b, KN_F32, N, K, M);
            kn_matmul_dgelu(t->c, d16, KN_F32, KN_F32, dpre, db, g, w2, pre, N, M, P);
            double *wp = dvec((size_t)N * M), *wo = dvec((size_t)N * M), *wd = dvec((size_t)N * M),
                   *wdb = dvec(M);
            for (int n = 0; n < N; n++)
                for (int m = 0; m < M; m++) {
                    double a = hb[m], ga = 0;
                    for (int k = 0; k < K; k++)
                        a += (double)hx[(size_t)n * K + k] * hw[(size_t)m * K + k];
                    for (int q = 0; q < P; q++)
                        ga += (double)hg[(size_t)n * P + q] * hw2[(size_t)q * M + m];
                    wp[(size_t)n * M + m] = a;
                    wo[(size_t)n * M + m] = gelu_d(a);
                    wd[(size_t)n * M + m] = ga * gelu_grad_d(a);
                }
            expect(t, "matmul_gelu pre", pre, wp, (size_t)N * M, KN_F32);
            expect(t, "matmul_gelu out", o, wo, (size_t)N * M, d16);
            expect(t, "matmul_dgelu dpre (written)", dpre, wd, (size_t)N * M, d16);
            float *hd = malloc((size_t)N * M * 4);
            kn_to_host(t->c, hd, dpre, (size_t)N * M * 4);
            for (int m = 0; m < M; m++) {
                wdb[m] = hdb[m];
                for (int n = 0; n < N; n++)
                    wdb[m] += hd[(size_t)n * M + m];
            }
            expect(t, "matmul_dgelu dbias (+=)", db, wdb, M, KN_F32);
            if (dt != KN_F32) matmul_gelu_typed(t, d16, x, w, b, g, w2, wp, N, K, M, P);
            free(hx), free(hw), free(hb), free(hw2), free(hg), free(hdb), free(hd), free(wp),
                free(wo), free(wd), free(wdb);
        }
}

static void c_activations(tc *t)
{
    size_t n = 4099;
    float *hx = hrand(n, 3), *hu = hrand(n, 2);
    float *x = dput(t, hx, n * 4), *u = dput(t, hu, n * 4), *o = dpoison(t, n), *o2 = dpoison(t, n);
    double *w = dvec(n);
    kn_gelu_fwd(t->c, KN_F32, o, x, n);
    for (size_t i = 0; i < n; i++) {
        double v = hx[i];
        w[i] = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    }
    expect(t, "gelu", o, w, n, KN_F32);
    kn_swiglu_fwd(t->c, KN_F32, o2, x, u, n);
    for (size_t i = 0; i < n; i++)
        w[i] = hx[i] / (1 + exp(-(double)hx[i])) * hu[i];
    expect(t, "swiglu", o2, w, n, KN_F32);
    /* GeGLU (Gemma): gelu_tanh(gate) * up, and its backward accumulating
     * onto ones: dgate = 1 + dout up gelu'(gate), dup = 1 + dout gelu(gate). */
    float *o3 = dpoison(t, n), *hd = hrand(n, 1), *dd = dput(t, hd, n * 4);
    kn_geglu_fwd(t->c, KN_F32, o3, x, u, n);
    double *wg = dvec(n), *wu = dvec(n);
    float *ones = malloc(n * sizeof *ones);
    for (size_t i = 0; i < n; i++) {
        double v = hx[i], th = tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v));
        double ge = 0.5 * v * (1 + th);
        double gp =
            0.5 * (1 + th) + 0.5 * v * (1 - th * th) * sqrt(2 / M_PI) * (1 + 3 * 0.044715 * v * v);
        w[i] = ge * hu[i];
        wg[i] = 1 + hd[i] * hu[i] * gp;
        wu[i] = 1 + hd[i] * ge;
        ones[i] = 1.0f;
    }
    expect(t, "geglu", o3, w, n, KN_F32);
    float *dg = dput(t, ones, n * 4), *du = dput(t, ones, n * 4);
    kn_geglu_bwd(t->c, KN_F32, KN_F32, dg, du, dd, KN_F32, x, u, n);
    for (size_t i = 0; i < n; i++)
        wg[i] -= 1, wu[i] -= 1;
    expect(t, "geglu dgate (written)", dg, wg, n, KN_F32);
    expect(t, "geglu dup (written)", du, wu, n, KN_F32);
    free(hx), free(hu), free(w), free(hd), free(wg), free(wu), free(ones);
}

/* Plain causal attention, then Gemma's options: an explicit scale with a
 * soft-cap that bites, and a sliding window shorter than T. */
static void c_attention_g(tc *t, float scale, float cap, int window)
{
    int B = 2, T = 70, Hq = 4, Hkv = 2, D = 8, ldq = Hq * D, ldkv = Hkv * D;
    size_t nq = (size_t)B * T * ldq, nk = (size_t)B * T * ldkv, nl = (size_t)B * Hq * T;
    float *hq = hrand(nq, 1), *hk = hrand(nk, 1), *hv = hrand(nk, 1);
    float *q = dput(t, hq, nq * 4), *k = dput(t, hk, nk * 4), *v = dput(t, hv, nk * 4);
    float *o = dpoison(t, nq), *lse = dpoison(t, nl);
    kn_attention_fwd(t->c, KN_F32, o, lse, q, k, v, B, T, Hq, Hkv, D, ldq, ldkv, scale, cap,
                     window);
    double sc = scale != 0.0f ? scale : 1.0 / sqrt((double)D);
    double *wo = dvec(nq), *wl = dvec(nl), *s = dvec(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < T; i++) {
                int g = h / (Hq / Hkv);
                double mx = -INFINITY, z = 0;
                int lo = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
                for (int j = lo; j <= i; j++) {
                    double a = 0;
                    for (int d = 0; d < D; d++)
                        a += (double)hq[((size_t)b * T + i) * ldq + h * D + d] *
                             hk[((size_t)b * T + j) * ldkv + g * D + d];
                    s[j] = a * sc;
                    if (cap > 0) s[j] = cap * tanh(s[j] / cap);
                    mx = fmax(mx, s[j]);
                }
                for (int j = lo; j <= i; j++)
                    z += exp(s[j] - mx);
                wl[((size_t)b * Hq + h) * T + i] = mx + log(z);
                for (int d = 0; d < D; d++) {
                    double a = 0;
                    for (int j = lo; j <= i; j++)
                        a += exp(s[j] - mx) / z * hv[((size_t)b * T + j) * ldkv + g * D + d];
                    wo[((size_t)b * T + i) * ldq + h * D + d] = a;
                }
            }
    char what[96];
    snprintf(what, sizeof what, "attention out (scale %g, softcap %g, window %d)", scale, cap,
             window);
    expect(t, what, o, wo, nq, KN_F32);
    snprintf(what, sizeof what, "attention lse (scale %g, softcap %g, window %d)", scale, cap,
             window);
    expect(t, what, lse, wl, nl, KN_F32);
    /* The last Tq rows alone over all T keys (kn_attention_kv_fwd, a
     * decode step over a KV cache): those rows of the same reference. */
    for (int Tq = 1; Tq <= 9; Tq += 8) {
        size_t nqo = (size_t)Tq * ldq, nlo = (size_t)Hq * Tq;
        float *okv = dpoison(t, (size_t)B * nqo), *lkv = dpoison(t, (size_t)B * nlo);
        double *wokv = dvec((size_t)B * nqo), *wlkv = dvec((size_t)B * nlo);
        for (int b = 0; b < B; b++) {
            kn_attention_kv_fwd(t->c, KN_F32, okv + b * nqo, lkv + b * nlo,
                                q + ((size_t)b * T + T - Tq) * ldq, k + (size_t)b * T * ldkv,
                                v + (size_t)b * T * ldkv, 1, Tq, T, Hq, Hkv, D, ldq, ldkv, scale,
                                cap, window);
            for (size_t e = 0; e < nqo; e++)
                wokv[b * nqo + e] = wo[((size_t)b * T + T - Tq) * ldq + e];
            for (int h = 0; h < Hq; h++)
                for (int r = 0; r < Tq; r++)
                    wlkv[b * nlo + (size_t)h * Tq + r] = wl[((size_t)b * Hq + h) * T + T - Tq + r];
        }
        snprintf(what, sizeof what, "attention_kv out (Tq %d, scale %g, softcap %g, window %d)", Tq,
                 scale, cap, window);
        expect(t, what, okv, wokv, (size_t)B * nqo, KN_F32);
        snprintf(what, sizeof what, "attention_kv lse (Tq %d, scale %g, softcap %g, window %d)", Tq,
                 scale, cap, window);
        expect(t, what, lkv, wlkv, (size_t)B * nlo, KN_F32);
        free(wokv), free(wlkv);
    }
    free(hq), free(hk), free(hv), free(wo), free(wl), free(s);
}

static void c_attention(tc *t)
{
    c_attention_g(t, 0.0f, 0.0f, 0);
    c_attention_g(t, 0.9f, 1.5f, 0);
    c_attention_g(t, 0.0f, 0.0f, 9);
    c_attention_g(t, 0.5f, 2.0f, 33);
}

/* Fused cross-entropy with fp32 and 16-bit logits: the 16-bit logits are
 * the rounded values (the reference uses them), dlogits come back in the
 * same dtype (dt's tolerance), the loss is computed in fp32 from exact
 * inputs (fp32 tolerance); also in place (dlogits over logits). N rows of
 * V logits, row 4's target ignored (-100); V is not a multiple of 128 nor
 * of 8, so most rows start off a 16-byte boundary (CUDA's vector loads). */
static void c_crossentropy_nv(tc *t, int N, int V)
{
    for (int dtc = 0; dtc < 6; dtc++) {
        int dt = dtc % 3;
        float cap = dtc < 3 ? 0.0f : 2.5f; /* Gemma 2's final-logit soft-cap */
        size_t es = dt == KN_F32 ? 4 : 2, nv = (size_t)N * V;
        float *hl = hrand(nv, 4);
        int32_t *tg = malloc((size_t)N * sizeof *tg);
        for (int n = 0; n < N; n++)
            tg[n] = n == 4 ? -100 : (n * 17 + 1) % V;
        float *l32 = dput(t, hl, nv * 4), *loss = dpoison(t, N), *dlf = dpoison(t, nv);
        void *l = dput(t, NULL, nv * es), *dl = dput(t, NULL, nv * es);
        kn_convert(t->c, l, (kn_dtype)dt, l32, KN_F32, nv);
        kn_convert(t->c, l32, KN_F32, l, (kn_dtype)dt, nv); /* the values the op sees */
        kn_to_host(t->c, hl, l32, nv * 4);
        kn_convert(t->c, dl, (kn_dtype)dt, dlf, KN_F32, nv); /* poisoned */
        int32_t *dtg = dput(t, tg, (size_t)N * sizeof *tg);
        kn_crossentropy_fwd_bwd(t->c, (kn_dtype)dt, loss, dl, l, dtg, N, V, V, 0.1f, cap);
        kn_convert(t->c, dlf, KN_F32, dl, (kn_dtype)dt, nv);
        double *wl = dvec(N), *wd = dvec(nv), *wy = dvec((size_t)V);
        for (int n = 0; n < N; n++) {
            if (tg[n] == -100) continue;
            double mx = -INFINITY, z = 0, *y = wy;
            for (int j = 0; j < V; j++) {
                y[j] = hl[(size_t)n * V + j];
                if (cap > 0) y[j] = cap * tanh(y[j] / cap);
                mx = fmax(mx, y[j]);
            }
            for (int j = 0; j < V; j++)
                z += exp(y[j] - mx);
            wl[n] = log(z) + mx - y[tg[n]];
            for (int j = 0; j < V; j++)
                wd[(size_t)n * V + j] = 0.1 * (exp(y[j] - mx) / z - (j == tg[n])) *
                                        (cap > 0 ? 1 - (y[j] / cap) * (y[j] / cap) : 1.0);
        }
        const char *tag = dt == KN_F32    ? (cap > 0 ? "fp32, softcap" : "fp32")
                          : dt == KN_BF16 ? (cap > 0 ? "bf16, softcap" : "bf16")
                                          : (cap > 0 ? "fp16, softcap" : "fp16");
        char what[64];
        snprintf(what, sizeof what, "crossentropy loss (%s logits, V %d)", tag, V);
        expect(t, what, loss, wl, N, KN_F32);
        snprintf(what, sizeof what, "crossentropy dlogits (%s, V %d)", tag, V);
        expect(t, what, dlf, wd, nv, (kn_dtype)dt);
        /* Evaluation's forward and the in-place training form. */
        float *loss2 = dpoison(t, N);
        kn_crossentropy_fwd(t->c, (kn_dtype)dt, loss2, l, dtg, N, V, V, cap);
        snprintf(what, sizeof what, "crossentropy_fwd loss (%s logits, V %d)", tag, V);
        expect(t, what, loss2, wl, N, KN_F32);
        kn_crossentropy_fwd_bwd(t->c, (kn_dtype)dt, NULL, l, l, dtg, N, V, V, 0.1f, cap);
        kn_convert(t->c, dlf, KN_F32, l, (kn_dtype)dt, nv);
        snprintf(what, sizeof what, "crossentropy in place (%s, V %d)", tag, V);
        expect(t, what, dlf, wd, nv, (kn_dtype)dt);
        free(hl), free(wl), free(wd), free(wy), free(tg);
    }
}

/* ---- padded logits (kn_logit_ld) ---------------------------------------- */

/* A device [N, ld] tensor in dt whose first V columns hold h's [N, V]
 * values (h is overwritten with them as dt rounds them) and whose other
 * columns are NaN: an op that reads them spreads NaN into its results. */
static void *dpadded(tc *t, float *h, int N, int V, int ld, kn_dtype dt)
{
    size_t n = (size_t)N * ld;
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    for (int r = 0; r < N; r++)
        memcpy(p + (size_t)r * ld, h + (size_t)r * V, (size_t)V * sizeof *p);
    float *d32 = dput(t, p, n * sizeof *p);
    void *d = dput(t, NULL, n * kn_dtype_size(dt));
    kn_convert(t->c, d, dt, d32, KN_F32, n);
    kn_convert(t->c, d32, KN_F32, d, dt, n);
    kn_to_host(t->c, p, d32, n * sizeof *p);
    for (int r = 0; r < N; r++)
        memcpy(h + (size_t)r * V, p + (size_t)r * ld, (size_t)V * sizeof *p);
    free(p);
    return d;
}

/* The first V columns of a device [N, ld] tensor in dt, as a new device
 * fp32 [N, V] tensor for expect; a failure for each column past V that is
 * no longer NaN (the padding is never written). */
static float *dcols(tc *t, const char *what, const void *d, kn_dtype dt, int N, int V, int ld)
{
    size_t n = (size_t)N * ld;
    float *d32 = dput(t, NULL, n * sizeof(float)), *h = malloc(n * sizeof *h);
    float *g = malloc((size_t)N * V * sizeof *g);
    kn_convert(t->c, d32, KN_F32, d, dt, n);
    kn_to_host(t->c, h, d32, n * sizeof *h);
    int bad = 0;
    for (int r = 0; r < N; r++) {
        memcpy(g + (size_t)r * V, h + (size_t)r * ld, (size_t)V * sizeof *g);
        for (int j = V; j < ld; j++)
            bad += !isnan(h[(size_t)r * ld + j]);
    }
    if (bad)
        fprintf(stderr, "FAIL %s %s %s: %d padding values written\n", t->dev, t->name, what, bad);
    ty_failures += bad;
    float *out = dput(t, g, (size_t)N * V * sizeof *g);
    free(h), free(g);
    return out;
}

/* Cross-entropy's float64 reference: loss wl[N], gradient wd[N, V] for scale s. */
static void ce_ref(const float *hl, const int32_t *tg, int N, int V, double s, double *wl,
                   double *wd)
{
    for (int n = 0; n < N; n++) {
        const float *y = hl + (size_t)n * V;
        double mx = -INFINITY, z = 0;
        if (tg[n] == -100) continue;
        for (int j = 0; j < V; j++)
            mx = fmax(mx, y[j]);
        for (int j = 0; j < V; j++)
            z += exp(y[j] - mx);
        wl[n] = log(z) + mx - y[tg[n]];
        for (int j = 0; j < V; j++)
            wd[(size_t)n * V + j] = s * (exp(y[j] - mx) / z - (j == tg[n]));
    }
}

/* Cross-entropy on logits whose rows are ld > V apart (CUDA's padded
 * head): V 300 (not a multiple of 128), ld 384, row 2's target ignored;
 * the padding columns are NaN and must stay so, unread. */
static void c_crossentropy_ld(tc *t)
{
    enum { N = 6, V = 300, LD = 384 };
    int32_t tg[N] = {7, 299, -100, 0, 150, 64};
    int32_t *dtg = dput(t, tg, sizeof tg);
    for (int dt = 0; dt < 3; dt++) {
        float *hl = hrand((size_t)N * V, 4), *hn = malloc((size_t)N * V * sizeof *hn);
        for (size_t i = 0; i < (size_t)N * V; i++)
            hn[i] = NAN;
        void *l = dpadded(t, hl, N, V, LD, (kn_dtype)dt),
             *dl = dpadded(t, hn, N, V, LD, (kn_dtype)dt);
        double *wl = dvec(N), *wd = dvec((size_t)N * V);
        ce_ref(hl, tg, N, V, 0.1, wl, wd);
        float *loss = dpoison(t, N);
        kn_crossentropy_fwd(t->c, (kn_dtype)dt, loss, l, dtg, N, V, LD, 0.0f);
        expect(t, "crossentropy_fwd loss (padded)", loss, wl, N, KN_F32);
        kn_crossentropy_fwd_bwd(t->c, (kn_dtype)dt, loss, dl, l, dtg, N, V, LD, 0.1f, 0.0f);
        expect(t, "crossentropy loss (padded)", loss, wl, N, KN_F32);
        float *got = dcols(t, "crossentropy dlogits (padded)", dl, (kn_dtype)dt, N, V, LD);
        expect(t, "crossentropy dlogits (padded)", got, wd, (size_t)N * V, (kn_dtype)dt);
        kn_crossentropy_fwd_bwd(t->c, (kn_dtype)dt, NULL, l, l, dtg, N, V, LD, 0.1f, 0.0f);
        got = dcols(t, "crossentropy in place (padded)", l, (kn_dtype)dt, N, V, LD);
        expect(t, "crossentropy in place (padded)", got, wd, (size_t)N * V, (kn_dtype)dt);
        free(hl), free(hn), free(wl), free(wd);
    }
}

/* kn_logits_fwd's float64 reference, out[N, V] = x[N, K] w[V, K]^T. */
static void logits_ref(const float *hx, const float *hw, int N, int K, int V, double *wo)
{
    for (int n = 0; n < N; n++)
        for (int j = 0; j < V; j++) {
            double a = 0;
            for (int k = 0; k < K; k++)
                a += (double)hx[(size_t)n * K + k] * hw[(size_t)j * K + k];
            wo[(size_t)n * V + j] = a;
        }
}

/* kn_logits_bwd's: wdx = dx + dout w, wdw = dw + dout^T x. */
static void logits_bwd_ref(const float *hd, const float *hx, const float *hw, const float *hdx,
                           const float *hdw, int N, int K, int V, double *wdx, double *wdw)
{
    for (size_t i = 0; i < (size_t)N * K; i++)
        wdx[i] = hdx[i];
    for (size_t i = 0; i < (size_t)V * K; i++)
        wdw[i] = hdw[i];
    for (int n = 0; n < N; n++)
        for (int j = 0; j < V; j++)
            for (int k = 0; k < K; k++) {
                double g = hd[(size_t)n * V + j];
                wdx[(size_t)n * K + k] += g * hw[(size_t)j * K + k];
                wdw[(size_t)j * K + k] += g * hx[(size_t)n * K + k];
            }
}

/* The loss head's GEMMs with padded logits rows (ld 384 for V 300): the
 * forward writes only the V columns (dt's tolerance in 16 bits), the
 * backward reads only them (NaN padding in dout) and accumulates into
 * fp32 dx, dw (fp32's tolerance: exact dt inputs). */
static void c_logits(tc *t)
{
    enum { N = 5, K = 24, V = 300, LD = 384 };
    for (int dt = 0; dt < 3; dt++) {
        float *hx = hrand((size_t)N * K, 1), *hw = hrand((size_t)V * K, 1);
        float *hd = hrand((size_t)N * V, 1), *hn = malloc((size_t)N * V * sizeof *hn);
        float *hdx = hrand((size_t)N * K, 1), *hdw = hrand((size_t)V * K, 1);
        for (size_t i = 0; i < (size_t)N * V; i++)
            hn[i] = NAN;
        void *x = dpadded(t, hx, N, K, K, (kn_dtype)dt), *w = dpadded(t, hw, V, K, K, (kn_dtype)dt);
        void *out = dpadded(t, hn, N, V, LD, (kn_dtype)dt),
             *dout = dpadded(t, hd, N, V, LD, (kn_dtype)dt);
        float *dx = dput(t, hdx, (size_t)N * K * 4), *dw = dput(t, hdw, (size_t)V * K * 4);
        double *wo = dvec((size_t)N * V), *wdx = dvec((size_t)N * K), *wdw = dvec((size_t)V * K);
        logits_ref(hx, hw, N, K, V, wo);
        logits_bwd_ref(hd, hx, hw, hdx, hdw, N, K, V, wdx, wdw);
        kn_logits_fwd(t->c, (kn_dtype)dt, out, x, w, N, K, V, LD);
        float *got = dcols(t, "logits_fwd (padded)", out, (kn_dtype)dt, N, V, LD);
        expect(t, "logits_fwd (padded)", got, wo, (size_t)N * V, (kn_dtype)dt);
        kn_logits_bwd(t->c, (kn_dtype)dt, dx, dw, dout, x, w, N, K, V, LD);
        expect(t, "logits_bwd dx (padded)", dx, wdx, (size_t)N * K, KN_F32);
        expect(t, "logits_bwd dw (padded)", dw, wdw, (size_t)V * K, KN_F32);
        free(hx), free(hw), free(hd), free(hn), free(hdx), free(hdw), free(wo), free(wdx),
            free(wdw);
    }
}

static void c_crossentropy(tc *t)
{
    c_crossentropy_nv(t, 11, 53);
    c_crossentropy_nv(t, 7, 1037);
    c_crossentropy_ld(t);
}

static void c_adamw(tc *t)
{
    size_t n = 3001;
    float *hp = hrand(n, 1), *hg = hrand(n, 1), *hm = hrand(n, 0.1), *hv = hrand(n, 0.1);
    for (size_t i = 0; i < n; i++)
        hv[i] = fabsf(hv[i]);
    float *p = dput(t, hp, n * 4), *g = dput(t, hg, n * 4), *m = dput(t, hm, n * 4),
          *v = dput(t, hv, n * 4);
    kn_adamw(t->c, KN_F32, p, NULL, g, m, v, n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 3);
    double *wp = dvec(n), *wm = dvec(n), *wv = dvec(n);
    double bc1 = 1 - pow(0.9f, 3), bc2 = 1 - pow(0.999f, 3);
    for (size_t i = 0; i < n; i++) {
        double pi = hp[i] * (1 - 1e-2 * 0.1);
        wm[i] = 0.9 * hm[i] + 0.1 * hg[i];
        wv[i] = 0.999 * hv[i] + 0.001 * (double)hg[i] * hg[i];
        wp[i] = pi - 1e-2 / bc1 * wm[i] / (sqrt(wv[i]) / sqrt(bc2) + 1e-8);
    }
    expect(t, "adamw p", p, wp, n, KN_F32);
    expect(t, "adamw m", m, wm, n, KN_F32);
    expect(t, "adamw v", v, wv, n, KN_F32);
    free(hp), free(hg), free(hm), free(hv), free(wp), free(wm), free(wv);
}

/* fp32 masters split into bf16 + low half and joined back: exact (bits),
 * hi is kn_convert's bf16, the tie rule, and AdamW on split masters gives
 * the fp32 AdamW's result (split). */
static void c_master(tc *t)
{
    size_t n = 4099;
    float *h = hrand(n, 50.0);
    uint32_t ties[4] = {0x3f808000u, 0x3f818000u, 0xbf808000u,
                        0x7f7fffffu}; /* even tie, odd tie, negative even tie, max */
    for (int i = 0; i < 4; i++)
        memcpy(&h[i], &ties[i], 4);
    float *x = dput(t, h, n * 4), *back = dpoison(t, n), *c16 = dpoison(t, n);
    uint16_t *hi = dput(t, NULL, n * 2), *lo = dput(t, NULL, n * 2), *hb = dput(t, NULL, n * 2);
    kn_master_split(t->c, hi, lo, x, n);
    kn_master_join(t->c, back, hi, lo, n);
    kn_convert(t->c, hb, KN_BF16, x, KN_F32, n);
    kn_convert(t->c, c16, KN_F32, hi, KN_BF16, n);
    float *hback = malloc(n * 4), *hc = malloc(n * 4), *hbf = malloc(n * 4);
    kn_sync(t->c);
    kn_to_host(t->c, hback, back, n * 4);
    kn_to_host(t->c, hc, c16, n * 4);
    kn_convert(t->c, back, KN_F32, hb, KN_BF16, n);
    kn_to_host(t->c, hbf, back, n * 4);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &h[i], 4);
        memcpy(&b, &hback[i], 4);
        /* Even ties (low half 0x8000, bit 16 clear: h[0], h[2], and any
         * drawn one) move one ulp towards their bf16; all else is exact. */
        uint32_t want = (a & 0xffffu) == 0x8000u && !(a & 0x10000u) ? a - 1 : a;
        if (b != want || hc[i] != hbf[i]) {
            if (bad++ < 3)
                fprintf(stderr,
                        "FAIL %s master[%zu]: %08x joined %08x (want %08x), hi %g vs convert %g\n",
                        t->dev, i, a, b, want, hc[i], hbf[i]);
        }
    }
    ty_failures += bad;
    /* AdamW on the split masters = AdamW on fp32, split. */
    float *hg = hrand(n, 1), *hm = hrand(n, 0.1), *hv = hrand(n, 0.1);
    for (size_t i = 0; i < n; i++)
        hv[i] = fabsf(hv[i]);
    float *p32 = dput(t, hback, n * 4), *g = dput(t, hg, n * 4);
    float *m1 = dput(t, hm, n * 4), *v1 = dput(t, hv, n * 4), *m2 = dput(t, hm, n * 4),
          *v2 = dput(t, hv, n * 4);
    kn_adamw(t->c, KN_F32, p32, NULL, g, m1, v1, n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 3);
    kn_adamw(t->c, KN_BF16, hi, lo, g, m2, v2, n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 3);
    uint16_t *hi2 = dput(t, NULL, n * 2), *lo2 = dput(t, NULL, n * 2);
    kn_master_split(t->c, hi2, lo2, p32, n);
    uint16_t *a1 = malloc(n * 2), *a2 = malloc(n * 2), *b1 = malloc(n * 2), *b2 = malloc(n * 2);
    kn_sync(t->c);
    kn_to_host(t->c, a1, hi, n * 2), kn_to_host(t->c, a2, hi2, n * 2);
    kn_to_host(t->c, b1, lo, n * 2), kn_to_host(t->c, b2, lo2, n * 2);
    if (memcmp(a1, a2, n * 2) || memcmp(b1, b2, n * 2))
        fprintf(stderr, "FAIL %s adamw on split masters differs from fp32 adamw + split\n", t->dev),
            ty_failures++;
    free(h), free(hback), free(hc), free(hbf), free(hg), free(hm), free(hv), free(a1), free(a2),
        free(b1), free(b2);
}

/* ---- activations in 16 bits (ops that take the dtype of what they touch) --

 * Every op with a `kn_dtype dt` for its activations, in bf16 and fp16 at
 * odd shapes, against the same op in fp32 on the same device and the same
 * values (the inputs rounded to dt first): results an op stores in dt
 * must be the fp32 results rounded (dt's tolerance); fp32 results computed
 * from 16-bit inputs (statistics, lse, every gradient) fp32's. The fp32
 * ops themselves are held to float64 references by the cases above and by
 * test_kernels.c. */

/* n random values (scale) rounded to dt: *h holds them (host fp32), the
 * result is a device buffer of type dt, *f32 an fp32 device copy. */
static void *typed_in(tc *t, kn_dtype dt, size_t n, double scale, float **f32)
{
    float *h = hrand(n, scale);
    float *d = dput(t, h, n * 4);
    void *x = dput(t, NULL, n * kn_dtype_size(dt));
    kn_convert(t->c, x, dt, d, KN_F32, n);
    kn_convert(t->c, d, KN_F32, x, dt, n);
    free(h);
    *f32 = d;
    return x;
}

/* A poisoned (NaN) device buffer of type dt. */
static void *typed_out(tc *t, kn_dtype dt, size_t n)
{
    float *p = dpoison(t, n);
    void *x = dput(t, NULL, n * kn_dtype_size(dt));
    kn_convert(t->c, x, dt, p, KN_F32, n);
    return x;
}

/* Device fp32 results as a double reference. */
static double *ref_of(tc *t, const float *d, size_t n)
{
    float *h = malloc(n * sizeof *h);
    double *w = dvec(n);
    kn_sync(t->c);
    kn_to_host(t->c, h, d, n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        w[i] = h[i];
    free(h);
    return w;
}

/* got (type dt, on the device) against the fp32 result want32. */
static void same(tc *t, kn_dtype dt, const char *what, const void *got, const float *want32,
                 size_t n, kn_dtype tol)
{
    float *g = dpoison(t, n);
    kn_convert(t->c, g, KN_F32, got, dt, n);
    double *w = ref_of(t, want32, n);
    char name[96];
    snprintf(name, sizeof name, "%s (%s)", what, kn_dtype_name(dt));
    expect(t, name, g, w, n, tol);
    free(w);
}

/* A device copy of an fp32 buffer (gradients accumulate: both start equal). */
static float *dclone(tc *t, const float *d, size_t n)
{
    float *h = malloc(n * 4);
    kn_sync(t->c);
    kn_to_host(t->c, h, d, n * 4);
    float *c = dput(t, h, n * 4);
    free(h);
    return c;
}

static void att_grads16(tc *t, kn_dtype dt, const float *dq, const float *dk, const float *dv,
                        const float *dout, const void *o, const float *l, const void *q,
                        const void *k, const void *v, int B, int T, int Hq, int Hkv, int D, int ldq,
                        int ldkv, float scale, float cap, int window);

static void c_typed(tc *t)
{
    for (int di = KN_BF16; di <= KN_F16; di++) {
        kn_dtype dt = (kn_dtype)di;
        /* add, gelu, swiglu, dropout: n not a multiple of any block */
        size_t n = 5003;
        float *af, *bf;
        void *a = typed_in(t, dt, n, 3, &af), *b = typed_in(t, dt, n, 2, &bf);
        void *o = typed_out(t, dt, n);
        float *o32 = dpoison(t, n);
        kn_add(t->c, dt, o, a, b, n);
        kn_add(t->c, KN_F32, o32, af, bf, n);
        same(t, dt, "add", o, o32, n, dt);
        kn_gelu_fwd(t->c, dt, o, a, n);
        kn_gelu_fwd(t->c, KN_F32, o32, af, n);
        same(t, dt, "gelu", o, o32, n, dt);
        kn_swiglu_fwd(t->c, dt, o, a, b, n);
        kn_swiglu_fwd(t->c, KN_F32, o32, af, bf, n);
        same(t, dt, "swiglu", o, o32, n, dt);
        uint8_t *mk = dput(t, NULL, n), *mk32 = dput(t, NULL, n);
        kn_dropout_fwd(t->c, dt, o, mk, a, n, 0.3f, 7, 11);
        kn_dropout_fwd(t->c, KN_F32, o32, mk32, af, n, 0.3f, 7, 11);
        same(t, dt, "dropout", o, o32, n, dt);
        float *hg = hrand(n, 1);
        float *g = dput(t, hg, n * 4), *dx = dput(t, hg, n * 4), *dx32 = dput(t, hg, n * 4),
              *du = dput(t, hg, n * 4), *du32 = dput(t, hg, n * 4), *gr = dput(t, hg, n * 4);
        kn_round(t->c, gr, n, dt); /* dout as a 16-bit backward reads it */
        kn_gelu_bwd(t->c, dt, dx, g, a, n);
        kn_gelu_bwd(t->c, KN_F32, dx32, gr, af, n);
        same(t, KN_F32, "gelu dx (+=)", dx, dx32, n, KN_F32);
        kn_swiglu_bwd(t->c, dt, KN_F32, dx, du, g, KN_F32, a, b, n);
        kn_swiglu_bwd(t->c, KN_F32, KN_F32, dx32, du32, gr, KN_F32, af, bf, n);
        same(t, KN_F32, "swiglu dgate (written)", dx, dx32, n, KN_F32);
        same(t, KN_F32, "swiglu dup (written)", du, du32, n, KN_F32);
        free(hg);

        /* embedding: a 16-bit table, then accumulate a second table */
        int V = 29, N = 21, C = 37;
        float *tf, *t2f;
        void *tab = typed_in(t, dt, (size_t)V * C, 1, &tf),
             *tab2 = typed_in(t, dt, (size_t)V * C, 1, &t2f);
        int32_t ids[21];
        for (int i = 0; i < N; i++)
            ids[i] = (i * 7 + 5) % V;
        int32_t *did = dput(t, ids, sizeof ids);
        void *e = typed_out(t, dt, (size_t)N * C);
        float *e32 = dpoison(t, (size_t)N * C);
        kn_embedding_fwd(t->c, dt, e, did, tab, N, C, 0);
        kn_embedding_fwd(t->c, KN_F32, e32, did, tf, N, C, 0);
        same(t, dt, "embedding", e, e32, (size_t)N * C, KN_F32); /* a copy: exact */
        kn_embedding_fwd(t->c, dt, e, did, tab2, N, C, 1);
        kn_embedding_fwd(t->c, KN_F32, e32, did, t2f, N, C, 1);
        same(t, dt, "embedding (accumulate)", e, e32, (size_t)N * C, dt);

        /* norms, forward and backward: N x C odd */
        int R = 19, W = 53;
        size_t rc = (size_t)R * W;
        float *xf, *hw = hrand(W, 1), *hb = hrand(W, 1), *hd = hrand(rc, 1);
        void *x = typed_in(t, dt, rc, 2, &xf);
        float *w = dput(t, hw, W * 4), *bias = dput(t, hb, W * 4), *dout = dput(t, hd, rc * 4);
        void *y = typed_out(t, dt, rc);
        float *y32 = dpoison(t, rc), *mu = dpoison(t, R), *rs = dpoison(t, R),
              *mu32 = dpoison(t, R), *rs32 = dpoison(t, R);
        kn_layernorm_fwd(t->c, dt, y, mu, rs, x, w, bias, R, W, 1e-5f);
        kn_layernorm_fwd(t->c, KN_F32, y32, mu32, rs32, xf, w, bias, R, W, 1e-5f);
        same(t, dt, "layernorm out", y, y32, rc, dt);
        same(t, KN_F32, "layernorm mean", mu, mu32, R, KN_F32);
        same(t, KN_F32, "layernorm rstd", rs, rs32, R, KN_F32);
        float *gx = dput(t, hd, rc * 4), *gx32 = dput(t, hd, rc * 4), *gw = dput(t, hw, W * 4),
              *gw32 = dput(t, hw, W * 4), *gb = dput(t, hb, W * 4), *gb32 = dput(t, hb, W * 4);
        /* a 16-bit backward reads dout as dt holds it and stores dx rounded */
        float *dr = dput(t, hd, rc * 4);
        kn_round(t->c, dr, rc, dt);
        /* dx_dt: dx as stored, again in dt (bit for bit kn_convert's) */
        size_t nes = kn_dtype_size(dt);
        void *gxt = typed_out(t, dt, rc), *gxw = dput(t, NULL, rc * nes);
        kn_layernorm_bwd(t->c, dt, gx, gxt, gw, gb, dout, KN_F32, x, w, mu32, rs32, R, W);
        kn_convert(t->c, gxw, dt, gx, KN_F32, rc);
        same_bits(t, "layernorm dx_dt", dt, gxt, gxw, rc * nes);
        kn_layernorm_bwd(t->c, KN_F32, gx32, NULL, gw32, gb32, dr, KN_F32, xf, w, mu32, rs32, R, W);
        kn_round(t->c, gx32, rc, dt);
        same(t, KN_F32, "layernorm dx (+=)", gx, gx32, rc, KN_F32);
        same(t, KN_F32, "layernorm dw (+=)", gw, gw32, W, KN_F32);
        same(t, KN_F32, "layernorm db (+=)", gb, gb32, W, KN_F32);
        kn_rmsnorm_fwd(t->c, dt, y, rs, x, w, R, W, 1e-6f);
        kn_rmsnorm_fwd(t->c, KN_F32, y32, rs32, xf, w, R, W, 1e-6f);
        same(t, dt, "rmsnorm out", y, y32, rc, dt);
        same(t, KN_F32, "rmsnorm rstd", rs, rs32, R, KN_F32);
        gxt = typed_out(t, dt, rc);
        kn_rmsnorm_bwd(t->c, dt, gx, gxt, gw, dout, KN_F32, x, w, rs32, R, W);
        kn_convert(t->c, gxw, dt, gx, KN_F32, rc);
        same_bits(t, "rmsnorm dx_dt", dt, gxt, gxw, rc * nes);
        kn_rmsnorm_bwd(t->c, KN_F32, gx32, NULL, gw32, dr, KN_F32, xf, w, rs32, R, W);
        kn_round(t->c, gx32, rc, dt);
        same(t, KN_F32, "rmsnorm dx (+=)", gx, gx32, rc, KN_F32);
        same(t, KN_F32, "rmsnorm dw (+=)", gw, gw32, W, KN_F32);
        free(hw), free(hb), free(hd);

        /* RoPE in place on 16-bit q rows with a row stride (fused rows) */
        int Bq = 2, Tq = 13, H = 3, D = 10, ld = 2 * H * D + 4;
        size_t nr = (size_t)Bq * Tq * ld;
        float *rf;
        void *r = typed_in(t, dt, nr, 1, &rf);
        kn_rope_fwd(t->c, dt, r, Bq, Tq, H, D, ld, 10000.0f, 3);
        kn_rope_fwd(t->c, KN_F32, rf, Bq, Tq, H, D, ld, 10000.0f, 3);
        same(t, dt, "rope", r, rf, nr, dt);
        float hif[5] = {1.0f, 0.3f, 0.07f, 0.011f, 0.002f};
        float *inv = dput(t, hif, sizeof hif);
        kn_convert(t->c, rf, KN_F32, r, dt, nr); /* both from the same rounded rows */
        kn_rope_freq_fwd(t->c, dt, r, Bq, Tq, H, D, ld, inv, 5);
        kn_rope_freq_fwd(t->c, KN_F32, rf, Bq, Tq, H, D, ld, inv, 5);
        same(t, dt, "rope_freq", r, rf, nr, dt);
        /* the backward on gradient rows of type dt: the fp32 transpose of
         * the same values, rounded once (bit for bit kn_convert's) */
        size_t res = kn_dtype_size(dt);
        void *rwant = dput(t, NULL, nr * res);
        kn_convert(t->c, rf, KN_F32, r, dt, nr);
        kn_rope_bwd(t->c, dt, r, Bq, Tq, H, D, ld, 10000.0f, 3);
        kn_rope_bwd(t->c, KN_F32, rf, Bq, Tq, H, D, ld, 10000.0f, 3);
        kn_convert(t->c, rwant, dt, rf, KN_F32, nr);
        same_bits(t, "rope bwd in dt", dt, r, rwant, nr * res);
        kn_convert(t->c, rf, KN_F32, r, dt, nr);
        kn_rope_freq_bwd(t->c, dt, r, Bq, Tq, H, D, ld, inv, 5);
        kn_rope_freq_bwd(t->c, KN_F32, rf, Bq, Tq, H, D, ld, inv, 5);
        kn_convert(t->c, rwant, dt, rf, KN_F32, nr);
        same_bits(t, "rope_freq bwd in dt", dt, r, rwant, nr * res);

        /* attention, forward and backward, grouped heads, T not a multiple
         * of any tile, q / k / v as strided views */
        int B = 2, T = 75, Hq = 4, Hkv = 2, Dh = 8, ldq = Hq * Dh, ldkv = Hkv * Dh;
        size_t nq = (size_t)B * T * ldq, nk = (size_t)B * T * ldkv, nl = (size_t)B * Hq * T;
        float *qf, *kf, *vf;
        void *q = typed_in(t, dt, nq, 1, &qf), *k = typed_in(t, dt, nk, 1, &kf),
             *v = typed_in(t, dt, nk, 1, &vf);
        void *ao = typed_out(t, dt, nq);
        float *ao32 = dpoison(t, nq), *l = dpoison(t, nl), *l32 = dpoison(t, nl);
        kn_attention_fwd(t->c, dt, ao, l, q, k, v, B, T, Hq, Hkv, Dh, ldq, ldkv, 0.0f, 0.0f, 0);
        kn_attention_fwd(t->c, KN_F32, ao32, l32, qf, kf, vf, B, T, Hq, Hkv, Dh, ldq, ldkv, 0.0f,
                         0.0f, 0);
        same(t, dt, "attention out", ao, ao32, nq, dt);
        same(t, KN_F32, "attention lse", l, l32, nl, KN_F32);
        /* the backward reads the 16-bit out; the fp32 run its widened copy */
        float *aof = dpoison(t, nq);
        kn_convert(t->c, aof, KN_F32, ao, dt, nq);
        float *hdo = hrand(nq, 1), *hdk = hrand(nk, 1);
        float *ado = dput(t, hdo, nq * 4), *dq = dput(t, hdo, nq * 4), *dq32 = dput(t, hdo, nq * 4),
              *dk = dput(t, hdk, nk * 4), *dk32 = dput(t, hdk, nk * 4), *dv = dput(t, hdk, nk * 4),
              *dv32 = dput(t, hdk, nk * 4), *ador = dput(t, hdo, nq * 4);
        kn_round(t->c, ador, nq, dt); /* dout as a 16-bit backward reads it */
        kn_attention_bwd(t->c, dt, KN_F32, dq, dk, dv, ado, KN_F32, ao, l32, q, k, v, B, T, Hq, Hkv,
                         Dh, ldq, ldkv, 0.0f, 0.0f, 0);
        kn_attention_bwd(t->c, KN_F32, KN_F32, dq32, dk32, dv32, ador, KN_F32, aof, l32, qf, kf, vf,
                         B, T, Hq, Hkv, Dh, ldq, ldkv, 0.0f, 0.0f, 0);
        same(t, KN_F32, "attention dq (written)", dq, dq32, nq, KN_F32);
        same(t, KN_F32, "attention dk (written)", dk, dk32, nk, KN_F32);
        same(t, KN_F32, "attention dv (written)", dv, dv32, nk, KN_F32);
        att_grads16(t, dt, dq, dk, dv, ado, ao, l32, q, k, v, B, T, Hq, Hkv, Dh, ldq, ldkv, 0.0f,
                    0.0f, 0);
        free(hdo), free(hdk);

        /* matmul16 reading a 16-bit x (x_dt = dt) against the fp32 x */
        int Nm = 37, Km = 43, Mm = 31;
        float *mxf, *mwf, *mbh = hrand(Mm, 1), *mgh = hrand((size_t)Nm * Mm, 1);
        void *mx = typed_in(t, dt, (size_t)Nm * Km, 1, &mxf),
             *mw = typed_in(t, dt, (size_t)Mm * Km, 1, &mwf);
        float *mb = dput(t, mbh, Mm * 4), *mg = dput(t, mgh, (size_t)Nm * Mm * 4);
        kn_round(t->c, mg, (size_t)Nm * Mm, dt);
        float *mo = dpoison(t, (size_t)Nm * Mm), *mo32 = dpoison(t, (size_t)Nm * Mm);
        kn_matmul16_fwd(t->c, dt, KN_F32, dt, mo, mx, mw, mb, KN_F32, Nm, Km, Mm);
        kn_matmul16_fwd(t->c, dt, KN_F32, KN_F32, mo32, mxf, mw, mb, KN_F32, Nm, Km, Mm);
        same(t, KN_F32, "matmul16 out (16-bit x)", mo, mo32, (size_t)Nm * Mm, KN_F32);
        void *mo16 = typed_out(t, dt, (size_t)Nm * Mm);
        kn_matmul16_fwd(t->c, dt, dt, dt, mo16, mx, mw, mb, KN_F32, Nm, Km, Mm);
        same(t, dt, "matmul16 16-bit out (16-bit x)", mo16, mo32, (size_t)Nm * Mm, dt);
        float *mdx = dclone(t, mxf, (size_t)Nm * Km), *mdx32 = dclone(t, mxf, (size_t)Nm * Km),
              *mdw = dclone(t, mwf, (size_t)Mm * Km), *mdw32 = dclone(t, mwf, (size_t)Mm * Km);
        kn_matmul16_bwd(t->c, dt, KN_F32, dt, mdx, mdw, NULL, mg, mx, mw, Nm, Km, Mm);
        kn_matmul16_bwd(t->c, dt, KN_F32, KN_F32, mdx32, mdw32, NULL, mg, mxf, mw, Nm, Km, Mm);
        same(t, KN_F32, "matmul16 dx (16-bit x, +=)", mdx, mdx32, (size_t)Nm * Km, KN_F32);
        same(t, KN_F32, "matmul16 dw (16-bit x, +=)", mdw, mdw32, (size_t)Mm * Km, KN_F32);
        free(mbh), free(mgh);
    }
}

/* ---- the residual add fused with the norm ----------------------------------

 * kn_add_layernorm_fwd / kn_add_rmsnorm_fwd in fp32, bf16 and fp16 at an
 * odd C: res must be a + b rounded to dt exactly (host rounding below),
 * out to dt's tolerance and mean / rstd to fp32's against a double norm of
 * that res; and the fused op must give the same bits as kn_add followed by
 * the norm on the same device (the engine's recompute modes rely on it),
 * also with res written over a. */
static float round_host(float v, kn_dtype dt)
{
    if (dt == KN_F16) return (float)(_Float16)v;
    if (dt != KN_BF16) return v;
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&v, &u, 4);
    return v;
}

/* n bytes of two device buffers identical. */
static void same_bits(tc *t, const char *what, kn_dtype dt, const void *x, const void *y, size_t n)
{
    char *hx = malloc(n), *hy = malloc(n);
    kn_sync(t->c);
    kn_to_host(t->c, hx, x, n);
    kn_to_host(t->c, hy, y, n);
    if (memcmp(hx, hy, n))
        fprintf(stderr, "FAIL %s %s %s (%s): fused and unfused differ\n", t->dev, t->name, what,
                kn_dtype_name(dt)),
            ty_failures++;
    free(hx), free(hy);
}

/* ---- parameter gradients: column sums over many rows ------------------ */

/* n values k * unit, k a non-zero integer in [-kmax, kmax]: on such a grid
 * every partial sum of the cases below is exact in fp32 (small integers of
 * unit), whatever the order of the adds, so a result must equal its
 * float64 reference exactly. */
static float *hgrid(size_t n, int kmax, double unit)
{
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        double d = draw();
        int k = 1 + (int)(fabs(d) * (kmax - 1));
        h[i] = (float)((d < 0 ? -k : k) * unit);
    }
    return h;
}

/* Device result d equal to want, bit for bit (want holds fp32 values). */
static void exact(tc *t, const char *what, int N, const float *d, const double *want, size_t n)
{
    float *h = malloc(n * sizeof *h);
    kn_sync(t->c);
    kn_to_host(t->c, h, d, n * sizeof *h);
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if ((double)h[i] != want[i] && bad++ < 3)
            fprintf(stderr, "FAIL %s %s %s N=%d [%zu]: got %.9g want %.9g\n", t->dev, t->name, what,
                    N, i, h[i], want[i]);
    ty_failures += bad;
    free(h);
}

/* The same op run on two copies of the same gradient gave the same bits. */
static void twice(tc *t, const char *what, int N, const float *a, const float *b, size_t n)
{
    float *ha = malloc(n * 4), *hb = malloc(n * 4);
    kn_sync(t->c);
    kn_to_host(t->c, ha, a, n * 4);
    kn_to_host(t->c, hb, b, n * 4);
    if (memcmp(ha, hb, n * 4))
        fprintf(stderr, "FAIL %s %s %s N=%d: two runs differ\n", t->dev, t->name, what, N),
            ty_failures++;
    free(ha), free(hb);
}

/* The ids of the embedding case: token 5 on every third row (a chain
 * longer than a CUDA block's chunk at the largest N), the rest spread
 * over the V ids with repeats. */
static int32_t *grad_ids(int N, int V)
{
    int32_t *ids = malloc((size_t)N * sizeof *ids);
    for (int n = 0; n < N; n++)
        ids[n] = n % 3 == 0 ? 5 : (n * 7 + 1) % V;
    return ids;
}

/* dbias += column sums of dout[N, M]: fp32 (kn_matmul_bwd) and 16-bit
 * (kn_matmul16_bwd) dout, values on a grid of 2^-8 (exact); alone and
 * beside dw (x zeros, K 1), whose product may give the sums (a GPU's
 * BGRADB epilogue). */
static void grads_bias(tc *t, int N, int M)
{
    size_t nm = (size_t)N * M;
    float *hd = hgrid(nm, 256, 1.0 / 256), *hb = hgrid(M, 256, 1.0 / 256);
    double *w = dvec(M);
    for (int m = 0; m < M; m++) {
        w[m] = hb[m];
        for (int n = 0; n < N; n++)
            w[m] += hd[(size_t)n * M + m];
    }
    float *dout = dput(t, hd, nm * 4), *x = dput(t, NULL, N * 4), *wt = dput(t, NULL, 4 * M);
    kn_zero(t->c, x, (size_t)N);
    for (int with_dw = 0; with_dw < 2; with_dw++) {
        float *db = dput(t, hb, M * 4), *dw = with_dw ? dput(t, NULL, 4 * M) : NULL;
        if (dw) kn_zero(t->c, dw, (size_t)M);
        kn_matmul_bwd(t->c, NULL, dw, db, dout, x, wt, N, 1, M);
        exact(t, with_dw ? "dbias (with dw)" : "dbias", N, db, w, M);
    }
    for (int dt = KN_BF16; dt <= KN_F16; dt++) {
        void *d16 = dput(t, NULL, nm * 2), *x16 = dput(t, NULL, N * 2), *w16 = dput(t, NULL, 2 * M);
        kn_convert(t->c, d16, (kn_dtype)dt, dout, KN_F32, nm); /* exact: 8 significant bits */
        kn_convert(t->c, x16, (kn_dtype)dt, x, KN_F32, (size_t)N);
        for (int with_dw = 0; with_dw < 2; with_dw++) {
            float *db16 = dput(t, hb, M * 4), *dw = with_dw ? dput(t, NULL, 4 * M) : NULL;
            if (dw) kn_zero(t->c, dw, (size_t)M);
            kn_matmul16_bwd(t->c, (kn_dtype)dt, (kn_dtype)dt, (kn_dtype)dt, NULL, dw, db16, d16,
                            x16, w16, N, 1, M);
            char what[48];
            snprintf(what, sizeof what, "dbias (%s dout%s)", dt == KN_BF16 ? "bf16" : "fp16",
                     with_dw ? ", with dw" : "");
            exact(t, what, N, db16, w, M);
        }
    }
    free(hd), free(hb), free(w);
}

/* The norms' dw / db with x, mean, dout on a grid of 2^-4 and rstd a
 * power of two, so dout * xhat and its sums are exact; x in fp32 and bf16. */
static void grads_norm(tc *t, int N, int C)
{
    size_t nc = (size_t)N * C;
    float *hx = hgrid(nc, 32, 1.0 / 16), *hm = hgrid(N, 16, 1.0 / 16),
          *hd = hgrid(nc, 16, 1.0 / 16);
    float *hw = hgrid(C, 256, 1.0 / 256), *hb = hgrid(C, 256, 1.0 / 256), *hr = malloc(N * 4);
    for (int n = 0; n < N; n++)
        hr[n] = n % 3 == 0 ? 0.5f : n % 3 == 1 ? 1.0f : 2.0f;
    double *wl = dvec(C), *wb = dvec(C), *wr = dvec(C);
    for (int j = 0; j < C; j++) {
        wl[j] = wr[j] = hw[j], wb[j] = hb[j];
        for (int n = 0; n < N; n++) {
            double d = hd[(size_t)n * C + j], x = hx[(size_t)n * C + j];
            wl[j] += d * ((x - hm[n]) * hr[n]);
            wr[j] += d * (x * hr[n]);
            wb[j] += d;
        }
    }
    float *x = dput(t, hx, nc * 4), *mean = dput(t, hm, N * 4), *rstd = dput(t, hr, N * 4),
          *dout = dput(t, hd, nc * 4), *wgt = dput(t, hw, C * 4);
    void *x16 = dput(t, NULL, nc * 2);
    kn_convert(t->c, x16, KN_BF16, x, KN_F32, nc); /* exact: 6 significant bits */
    for (int dt = KN_F32; dt <= KN_BF16; dt++) {
        const void *xt = dt == KN_F32 ? (const void *)x : x16;
        float *gw = dput(t, hw, C * 4), *gb = dput(t, hb, C * 4), *gr = dput(t, hw, C * 4),
              *gb2 = dput(t, hb, C * 4);
        kn_layernorm_bwd(t->c, (kn_dtype)dt, NULL, NULL, gw, gb, dout, KN_F32, xt, wgt, mean, rstd,
                         N, C);
        kn_rmsnorm_bwd(t->c, (kn_dtype)dt, NULL, NULL, gr, dout, KN_F32, xt, wgt, rstd, N, C);
        kn_layernorm_bwd(t->c, (kn_dtype)dt, NULL, NULL, NULL, gb2, dout, KN_F32, xt, wgt, mean,
                         rstd, N, C);
        exact(t, "layernorm dw", N, gw, wl, C);
        exact(t, "layernorm db", N, gb, wb, C);
        exact(t, "rmsnorm dw", N, gr, wr, C);
        exact(t, "layernorm db (no dw)", N, gb2, wb, C);
    }
    free(hx), free(hm), free(hd), free(hw), free(hb), free(hr), free(wl), free(wb), free(wr);
}

/* dtable[ids[n]] += dout[n] with repeated ids, on a grid of 2^-8. */
static void grads_embedding(tc *t, int N, int C)
{
    int V = 23;
    size_t nc = (size_t)N * C, vc = (size_t)V * C;
    int32_t *ids = grad_ids(N, V);
    float *hd = hgrid(nc, 256, 1.0 / 256), *ht = hgrid(vc, 256, 1.0 / 256);
    double *w = dvec(vc);
    for (size_t i = 0; i < vc; i++)
        w[i] = ht[i];
    for (int n = 0; n < N; n++)
        for (int j = 0; j < C; j++)
            w[(size_t)ids[n] * C + j] += hd[(size_t)n * C + j];
    float *dout = dput(t, hd, nc * 4), *dt = dput(t, ht, vc * 4);
    int32_t *di = dput(t, ids, (size_t)N * 4);
    kn_embedding_bwd(t->c, dt, di, dout, N, C);
    exact(t, "embedding dtable", N, dt, w, vc);
    free(ids), free(hd), free(ht), free(w);
}

/* Each gradient twice from the same start on random (inexact) values,
 * where a different order of adds would show in the last bits. */
static void grads_twice(tc *t, int N, int C)
{
    int V = 23;
    size_t nc = (size_t)N * C;
    float *hx = hrand(nc, 2), *hd = hrand(nc, 1), *hm = hrand(N, 1), *hr = hrand(N, 2);
    float *hg = hrand((size_t)V * C, 1);
    int32_t *ids = grad_ids(N, V);
    float *x = dput(t, hx, nc * 4), *dout = dput(t, hd, nc * 4), *mean = dput(t, hm, N * 4),
          *rstd = dput(t, hr, N * 4), *wgt = dput(t, hg, C * 4);
    int32_t *di = dput(t, ids, (size_t)N * 4);
    float *g[2][4];
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < 3; k++)
            g[r][k] = dput(t, hg, C * 4);
        g[r][3] = dput(t, hg, (size_t)V * C * 4);
        kn_matmul_bwd(t->c, NULL, NULL, g[r][0], dout, x, wgt, N, 1, C);
        kn_layernorm_bwd(t->c, KN_F32, NULL, NULL, g[r][1], g[r][2], dout, KN_F32, x, wgt, mean,
                         rstd, N, C);
        kn_embedding_bwd(t->c, g[r][3], di, dout, N, C);
    }
    twice(t, "dbias", N, g[0][0], g[1][0], C);
    twice(t, "layernorm dw", N, g[0][1], g[1][1], C);
    twice(t, "layernorm db", N, g[0][2], g[1][2], C);
    twice(t, "embedding dtable", N, g[0][3], g[1][3], (size_t)V * C);
    free(hx), free(hd), free(hm), free(hr), free(hg), free(ids);
}

/* Bias, norm and embedding gradients over one row slice (20 rows) and
 * several (301, 2111: not multiples of any slice the CUDA backend cuts,
 * 8 slices in the emulation, 10 and 64 on the GPU's grid), 77 columns
 * (three CUDA tiles, the last partial). */
static void c_param_grads(tc *t)
{
    static const int rows[] = {20, 301, 2111};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        grads_bias(t, rows[i], 77);
        grads_norm(t, rows[i], 77);
        grads_embedding(t, rows[i], 77);
        grads_twice(t, rows[i], 77);
    }
}

static void c_add_norm(tc *t)
{
    int N = 13, C = 77;
    size_t nc = (size_t)N * C;
    for (int di = KN_F32; di <= KN_F16; di++) {
        kn_dtype dt = (kn_dtype)di;
        size_t es = kn_dtype_size(dt);
        float *af, *bf, *hw = hrand(C, 1), *hbias = hrand(C, 1);
        void *a = typed_in(t, dt, nc, 3, &af), *b = typed_in(t, dt, nc, 2, &bf);
        float *w = dput(t, hw, C * 4), *bias = dput(t, hbias, C * 4);
        float *ha = malloc(nc * 4), *hb = malloc(nc * 4);
        kn_sync(t->c);
        kn_to_host(t->c, ha, af, nc * 4);
        kn_to_host(t->c, hb, bf, nc * 4);
        double *wr = dvec(nc), *wo = dvec(nc), *wm = dvec(N), *ws = dvec(N), *wo2 = dvec(nc),
               *ws2 = dvec(N);
        for (int n = 0; n < N; n++) {
            double mu = 0, var = 0, ms = 0;
            for (int j = 0; j < C; j++) {
                size_t i = (size_t)n * C + j;
                wr[i] = round_host(ha[i] + hb[i], dt);
                mu += wr[i], ms += wr[i] * wr[i];
            }
            mu /= C;
            for (int j = 0; j < C; j++)
                var += (wr[(size_t)n * C + j] - mu) * (wr[(size_t)n * C + j] - mu);
            wm[n] = mu, ws[n] = 1 / sqrt(var / C + 1e-5), ws2[n] = 1 / sqrt(ms / C + 1e-6);
            for (int j = 0; j < C; j++) {
                size_t i = (size_t)n * C + j;
                wo[i] = (wr[i] - mu) * ws[n] * hw[j] + hbias[j];
                wo2[i] = wr[i] * ws2[n] * hw[j];
            }
        }
        /* layernorm: fused, then the two ops, then fused in place over a */
        void *res = typed_out(t, dt, nc), *o = typed_out(t, dt, nc);
        float *mean = dpoison(t, N), *rstd = dpoison(t, N), *rf = dpoison(t, nc),
              *of = dpoison(t, nc);
        kn_add_layernorm_fwd(t->c, dt, res, o, mean, rstd, a, b, w, bias, N, C, 1e-5f);
        kn_convert(t->c, rf, KN_F32, res, dt, nc);
        kn_convert(t->c, of, KN_F32, o, dt, nc);
        expect(t, "add_layernorm res", rf, wr, nc, KN_F32); /* exact values: fp32's tolerance */
        expect(t, "add_layernorm out", of, wo, nc, dt);
        expect(t, "add_layernorm mean", mean, wm, N, KN_F32);
        expect(t, "add_layernorm rstd", rstd, ws, N, KN_F32);
        void *res2 = typed_out(t, dt, nc), *o2 = typed_out(t, dt, nc);
        float *mean2 = dpoison(t, N), *rstd2 = dpoison(t, N);
        kn_add(t->c, dt, res2, a, b, nc);
        kn_layernorm_fwd(t->c, dt, o2, mean2, rstd2, res2, w, bias, N, C, 1e-5f);
        same_bits(t, "add_layernorm res", dt, res, res2, nc * es);
        same_bits(t, "add_layernorm out", dt, o, o2, nc * es);
        same_bits(t, "add_layernorm mean", dt, mean, mean2, N * 4);
        same_bits(t, "add_layernorm rstd", dt, rstd, rstd2, N * 4);
        void *a2 = dput(t, NULL, nc * es);
        kn_convert(t->c, a2, dt, af, KN_F32, nc);
        kn_add_layernorm_fwd(t->c, dt, a2, o2, mean2, rstd2, a2, b, w, NULL, N, C, 1e-5f);
        kn_layernorm_fwd(t->c, dt, o, mean, rstd, res, w, NULL, N, C, 1e-5f);
        same_bits(t, "add_layernorm in place res", dt, res, a2, nc * es);
        same_bits(t, "add_layernorm in place out (no bias)", dt, o, o2, nc * es);
        /* rmsnorm likewise */
        kn_add_rmsnorm_fwd(t->c, dt, res, o, rstd, a, b, w, N, C, 1e-6f);
        kn_convert(t->c, rf, KN_F32, res, dt, nc);
        kn_convert(t->c, of, KN_F32, o, dt, nc);
        expect(t, "add_rmsnorm res", rf, wr, nc, KN_F32);
        expect(t, "add_rmsnorm out", of, wo2, nc, dt);
        expect(t, "add_rmsnorm rstd", rstd, ws2, N, KN_F32);
        kn_add(t->c, dt, res2, a, b, nc);
        kn_rmsnorm_fwd(t->c, dt, o2, rstd2, res2, w, N, C, 1e-6f);
        same_bits(t, "add_rmsnorm res", dt, res, res2, nc * es);
        same_bits(t, "add_rmsnorm out", dt, o, o2, nc * es);
        same_bits(t, "add_rmsnorm rstd", dt, rstd, rstd2, N * 4);
        kn_convert(t->c, a2, dt, af, KN_F32, nc);
        kn_add_rmsnorm_fwd(t->c, dt, a2, o2, rstd2, a2, b, w, N, C, 1e-6f);
        same_bits(t, "add_rmsnorm in place res", dt, res, a2, nc * es);
        same_bits(t, "add_rmsnorm in place out", dt, o, o2, nc * es);
        free(hw), free(hbias), free(ha), free(hb), free(wr), free(wo), free(wm), free(ws),
            free(wo2), free(ws2);
    }
}

/* ---- aligned and offset views ------------------------------------------------

 * CUDA's elementwise and row kernels move 16-byte packs when every pointer
 * is 16-byte aligned (and, for rows, C a multiple of the pack) and fall
 * back to one element at a time otherwise, with the n % W elements after
 * the last pack one by one. Each op runs here twice in fp32, bf16 and
 * fp16: on buffers as allocated and on copies one element further on (not
 * 16-byte aligned), with n = 1003 (not a multiple of 4 or 8) and rows of
 * C = 64 (a multiple of both). The two runs must give the same bits (so
 * must the fused add + norm and the two ops run on the offset copies);
 * the norms, whose packed path no other case reaches, are also held to
 * float64 references. */

/* A copy of `bytes` of device buffer x starting `shift` bytes into a new
 * buffer: the same values, another alignment. */
static void *dshift(tc *t, const void *x, size_t bytes, size_t shift)
{
    char *h = malloc(bytes);
    kn_sync(t->c);
    kn_to_host(t->c, h, x, bytes);
    char *d = dput(t, NULL, bytes + shift);
    kn_to_device(t->c, d + shift, h, bytes);
    free(h);
    return d + shift;
}

/* An fp32 device buffer of n random values and its copy one float on. */
static float *frand_pair(tc *t, size_t n, double scale, float **shifted)
{
    float *h = hrand(n, scale);
    float *d = dput(t, h, n * 4);
    *shifted = dshift(t, d, n * 4, 4);
    free(h);
    return d;
}

/* The forward ops of dtype dt, aligned and offset. */
static void vec_forward(tc *t, kn_dtype dt, size_t n)
{
    size_t es = kn_dtype_size(dt), nb = n * es;
    float *af, *bf;
    void *a = typed_in(t, dt, n, 3, &af), *b = typed_in(t, dt, n, 2, &bf);
    void *as = dshift(t, a, nb, es), *bs = dshift(t, b, nb, es);
    void *o = typed_out(t, dt, n), *os = dshift(t, o, nb, es);
    kn_add(t->c, dt, o, a, b, n);
    kn_add(t->c, dt, os, as, bs, n);
    same_bits(t, "add offset", dt, o, os, nb);
    kn_gelu_fwd(t->c, dt, o, a, n);
    kn_gelu_fwd(t->c, dt, os, as, n);
    same_bits(t, "gelu offset", dt, o, os, nb);
    kn_swiglu_fwd(t->c, dt, o, a, b, n);
    kn_swiglu_fwd(t->c, dt, os, as, bs, n);
    same_bits(t, "swiglu offset", dt, o, os, nb);
    kn_geglu_fwd(t->c, dt, o, a, b, n);
    kn_geglu_fwd(t->c, dt, os, as, bs, n);
    same_bits(t, "geglu offset", dt, o, os, nb);
    if (dt == KN_F32) return;
    float *w = dpoison(t, n), *ws = dshift(t, w, n * 4, 4);
    kn_convert(t->c, w, KN_F32, a, dt, n); /* widen */
    kn_convert(t->c, ws, KN_F32, as, dt, n);
    same_bits(t, "convert to fp32 offset", dt, w, ws, n * 4);
    float *xs, *x = frand_pair(t, n, 3, &xs);
    kn_convert(t->c, o, dt, x, KN_F32, n); /* narrow */
    kn_convert(t->c, os, dt, xs, KN_F32, n);
    same_bits(t, "convert from fp32 offset", dt, o, os, nb);
    kn_round(t->c, x, n, dt);
    kn_round(t->c, xs, n, dt);
    same_bits(t, "round offset", dt, x, xs, n * 4);
    kn_dtype ot = dt == KN_BF16 ? KN_F16 : KN_BF16; /* 16-bit to the other 16-bit type */
    void *c16 = typed_out(t, ot, n), *c16s = dshift(t, c16, n * 2, 2);
    kn_convert(t->c, c16, ot, a, dt, n);
    kn_convert(t->c, c16s, ot, as, dt, n);
    same_bits(t, "convert 16-bit to 16-bit offset", dt, c16, c16s, n * 2);
    kn_convert(t->c, w, KN_F32, c16, ot, n);
    double *want = ref_of(t, af, n);
    expect(t, "convert 16-bit to 16-bit", w, want, n, ot);
    free(want);
}

/* The fp32-gradient ops of dtype dt, and axpy / scale, aligned and offset. */
static void vec_backward(tc *t, kn_dtype dt, size_t n)
{
    size_t es = kn_dtype_size(dt), nb = n * es;
    float *af, *bf, *gs, *ds, *us;
    void *a = typed_in(t, dt, n, 3, &af), *b = typed_in(t, dt, n, 2, &bf);
    void *as = dshift(t, a, nb, es), *bs = dshift(t, b, nb, es);
    float *g = frand_pair(t, n, 1, &gs), *d = frand_pair(t, n, 1, &ds),
          *u = frand_pair(t, n, 1, &us);
    kn_gelu_bwd(t->c, dt, d, g, a, n);
    kn_gelu_bwd(t->c, dt, ds, gs, as, n);
    same_bits(t, "gelu dx offset", dt, d, ds, n * 4);
    kn_swiglu_bwd(t->c, dt, KN_F32, d, u, g, KN_F32, a, b, n);
    kn_swiglu_bwd(t->c, dt, KN_F32, ds, us, gs, KN_F32, as, bs, n);
    same_bits(t, "swiglu dgate offset", dt, d, ds, n * 4);
    same_bits(t, "swiglu dup offset", dt, u, us, n * 4);
    kn_geglu_bwd(t->c, dt, KN_F32, NULL, u, g, KN_F32, a, b, n); /* one gradient only */
    kn_geglu_bwd(t->c, dt, KN_F32, NULL, us, gs, KN_F32, as, bs, n);
    same_bits(t, "geglu dup offset", dt, u, us, n * 4);
    kn_geglu_bwd(t->c, dt, KN_F32, d, u, g, KN_F32, a, b, n);
    kn_geglu_bwd(t->c, dt, KN_F32, ds, us, gs, KN_F32, as, bs, n);
    same_bits(t, "geglu dgate offset", dt, d, ds, n * 4);
    same_bits(t, "geglu dup offset", dt, u, us, n * 4);
    if (dt != KN_F32) {
        /* gradients in dt, aligned and offset: kn_convert of the fp32 ones;
         * and dout given in dt (as a product that wrote it stores it), bit
         * for bit the fp32 dout's, which the op reads rounded */
        void *w[2] = {dput(t, NULL, nb), dput(t, NULL, nb)};
        void *g16 = dput(t, NULL, nb), *g16s = dshift(t, g16, nb, es);
        kn_convert(t->c, g16, dt, g, KN_F32, n);
        kn_convert(t->c, g16s, dt, gs, KN_F32, n);
        for (int geglu = 0; geglu < 2; geglu++) {
            if (geglu)
                kn_geglu_bwd(t->c, dt, KN_F32, d, u, g, KN_F32, a, b, n);
            else
                kn_swiglu_bwd(t->c, dt, KN_F32, d, u, g, KN_F32, a, b, n);
            kn_convert(t->c, w[0], dt, d, KN_F32, n);
            kn_convert(t->c, w[1], dt, u, KN_F32, n);
            for (int v = 0; v < 4; v++) {
                int off = v % 2, gin = v / 2;
                void *o[2] = {typed_out(t, dt, n), typed_out(t, dt, n)};
                if (off) o[0] = dshift(t, o[0], nb, es), o[1] = dshift(t, o[1], nb, es);
                const void *dd = gin ? (off ? g16s : g16) : (off ? (void *)gs : (void *)g);
                kn_dtype ddt = gin ? dt : KN_F32;
                if (geglu)
                    kn_geglu_bwd(t->c, dt, dt, o[0], o[1], dd, ddt, off ? as : a, off ? bs : b, n);
                else
                    kn_swiglu_bwd(t->c, dt, dt, o[0], o[1], dd, ddt, off ? as : a, off ? bs : b, n);
                char what[48];
                snprintf(what, sizeof what, "%s dgate in dt%s", geglu ? "geglu" : "swiglu",
                         gin ? ", dout in dt" : "");
                same_bits(t, what, dt, o[0], w[0], nb);
                snprintf(what, sizeof what, "%s dup in dt%s", geglu ? "geglu" : "swiglu",
                         gin ? ", dout in dt" : "");
                same_bits(t, what, dt, o[1], w[1], nb);
            }
        }
        return;
    }
    kn_axpy(t->c, d, g, n, -0.625f);
    kn_axpy(t->c, ds, gs, n, -0.625f);
    same_bits(t, "axpy offset", dt, d, ds, n * 4);
    kn_scale(t->c, d, n, 1.375f);
    kn_scale(t->c, ds, n, 1.375f);
    same_bits(t, "scale offset", dt, d, ds, n * 4);
}

/* Double references of the two norms of x[R,C] (host), from the statistics
 * the op returned: out (layernorm when mean is set, else rmsnorm) and dx
 * += the backward of dout onto dx0. */
static void norm_refs(const float *x, const float *w, const float *b, const float *mean,
                      const float *rstd, const float *dout, const float *dx0, int R, int C,
                      double *out, double *dx)
{
    for (int r = 0; r < R; r++) {
        double mu = mean ? mean[r] : 0, rs = rstd[r], m1 = 0, m2 = 0;
        for (int j = 0; j < C; j++) {
            size_t i = (size_t)r * C + j;
            double xh = (x[i] - mu) * rs, dn = (double)dout[i] * w[j];
            out[i] = xh * w[j] + (b ? b[j] : 0);
            m1 += dn / C, m2 += dn * xh / C;
        }
        for (int j = 0; j < C; j++) {
            size_t i = (size_t)r * C + j;
            double xh = (x[i] - mu) * rs, dn = (double)dout[i] * w[j];
            dx[i] = dx0[i] + rs * (dn - (mean ? m1 : 0) - xh * m2);
        }
    }
}

/* rstd (and mean) of x[R,C] in double: layernorm when mean is set. */
static void norm_stats(const float *x, int R, int C, double *mean, double *rstd, double eps)
{
    for (int r = 0; r < R; r++) {
        double mu = 0, q = 0;
        for (int j = 0; j < C; j++)
            mu += x[(size_t)r * C + j] / (double)C;
        if (!mean) mu = 0;
        for (int j = 0; j < C; j++)
            q += (x[(size_t)r * C + j] - mu) * (x[(size_t)r * C + j] - mu);
        if (mean) mean[r] = mu;
        rstd[r] = 1 / sqrt(q / C + eps);
    }
}

/* Host copy of n floats of a device buffer. */
static float *hget(tc *t, const float *d, size_t n)
{
    float *h = malloc(n * 4);
    kn_sync(t->c);
    kn_to_host(t->c, h, d, n * 4);
    return h;
}

/* One norm (layernorm when ln) forward and dx in dt, aligned against the
 * references and offset against aligned. */
static void vec_norm(tc *t, kn_dtype dt, int ln, int R, int C)
{
    size_t rc = (size_t)R * C, es = kn_dtype_size(dt), nb = rc * es;
    float *xf, *hw = hrand(C, 1), *hb = hrand(C, 1), *hd = hrand(rc, 1), *hdx = hrand(rc, 1);
    void *x = typed_in(t, dt, rc, 2, &xf), *xs = dshift(t, x, nb, es);
    float *w = dput(t, hw, C * 4), *bias = ln ? dput(t, hb, C * 4) : NULL;
    float *ws = dshift(t, w, C * 4, 4), *bs = ln ? dshift(t, bias, C * 4, 4) : NULL;
    void *y = typed_out(t, dt, rc), *ys = dshift(t, y, nb, es);
    float *mu = ln ? dpoison(t, R) : NULL, *rs = dpoison(t, R), *mus = ln ? dpoison(t, R) : NULL,
          *rss = dpoison(t, R), *yf = dpoison(t, rc);
    if (ln) {
        kn_layernorm_fwd(t->c, dt, y, mu, rs, x, w, bias, R, C, 1e-5f);
        kn_layernorm_fwd(t->c, dt, ys, mus, rss, xs, ws, bs, R, C, 1e-5f);
    } else {
        kn_rmsnorm_fwd(t->c, dt, y, rs, x, w, R, C, 1e-6f);
        kn_rmsnorm_fwd(t->c, dt, ys, rss, xs, ws, R, C, 1e-6f);
    }
    same_bits(t, ln ? "layernorm out offset" : "rmsnorm out offset", dt, y, ys, nb);
    same_bits(t, "norm rstd offset", dt, rs, rss, R * 4);
    if (ln) same_bits(t, "norm mean offset", dt, mu, mus, R * 4);
    float *dout = dput(t, hd, rc * 4), *dx = dput(t, hdx, rc * 4);
    float *douts = dshift(t, dout, rc * 4, 4), *dxs = dshift(t, dx, rc * 4, 4);
    void *dxt = typed_out(t, dt, rc), *dxts = dshift(t, typed_out(t, dt, rc), nb, es),
         *dxw = dput(t, NULL, nb);
    if (ln) {
        kn_layernorm_bwd(t->c, dt, dx, dxt, NULL, NULL, dout, KN_F32, x, w, mu, rs, R, C);
        kn_layernorm_bwd(t->c, dt, dxs, dxts, NULL, NULL, douts, KN_F32, xs, ws, mu, rs, R, C);
    } else {
        kn_rmsnorm_bwd(t->c, dt, dx, dxt, NULL, dout, KN_F32, x, w, rs, R, C);
        kn_rmsnorm_bwd(t->c, dt, dxs, dxts, NULL, douts, KN_F32, xs, ws, rs, R, C);
    }
    same_bits(t, ln ? "layernorm dx offset" : "rmsnorm dx offset", dt, dx, dxs, rc * 4);
    kn_convert(t->c, dxw, dt, dx, KN_F32, rc); /* dx_dt: dx as stored, in dt */
    same_bits(t, "norm dx_dt (packed)", dt, dxt, dxw, nb);
    same_bits(t, "norm dx_dt offset", dt, dxts, dxw, nb);
    float *hx = hget(t, xf, rc), *hmu = ln ? hget(t, mu, R) : NULL, *hrs = hget(t, rs, R);
    double *wmu = dvec(R), *wrs = dvec(R), *wy = dvec(rc), *wdx = dvec(rc);
    norm_stats(hx, R, C, ln ? wmu : NULL, wrs, ln ? 1e-5 : 1e-6);
    norm_refs(hx, hw, ln ? hb : NULL, hmu, hrs, hd, hdx, R, C, wy, wdx);
    kn_convert(t->c, yf, KN_F32, y, dt, rc);
    expect(t, ln ? "layernorm out (packed)" : "rmsnorm out (packed)", yf, wy, rc, dt);
    expect(t, "norm rstd (packed)", rs, wrs, R, KN_F32);
    if (ln) expect(t, "norm mean (packed)", mu, wmu, R, KN_F32);
    expect(t, "norm dx (packed, +=)", dx, wdx, rc, dt); /* dout read, dx stored in dt */
    /* dx held in dt (dx_dt without dx): a second backward into dx_dt as it
     * stands, bit for bit the same one into dx */
    if (ln) {
        kn_layernorm_bwd(t->c, dt, NULL, dxt, NULL, NULL, dout, KN_F32, x, w, mu, rs, R, C);
        kn_layernorm_bwd(t->c, dt, NULL, dxts, NULL, NULL, douts, KN_F32, xs, ws, mu, rs, R, C);
        kn_layernorm_bwd(t->c, dt, dx, NULL, NULL, NULL, dout, KN_F32, x, w, mu, rs, R, C);
    } else {
        kn_rmsnorm_bwd(t->c, dt, NULL, dxt, NULL, dout, KN_F32, x, w, rs, R, C);
        kn_rmsnorm_bwd(t->c, dt, NULL, dxts, NULL, douts, KN_F32, xs, ws, rs, R, C);
        kn_rmsnorm_bwd(t->c, dt, dx, NULL, NULL, dout, KN_F32, x, w, rs, R, C);
    }
    kn_convert(t->c, dxw, dt, dx, KN_F32, rc);
    same_bits(t, "norm dx held in dt (packed)", dt, dxt, dxw, nb);
    same_bits(t, "norm dx held in dt offset", dt, dxts, dxw, nb);
    /* dout given in dt (as a product that wrote it rounded stores it):
     * bit for bit the fp32 dout's, which the op reads rounded; dw and db
     * too */
    void *d16 = dput(t, NULL, nb), *d16s = dshift(t, d16, nb, es);
    kn_convert(t->c, d16, dt, dout, KN_F32, rc);
    kn_convert(t->c, d16s, dt, dout, KN_F32, rc);
    float *gx[3], *gw[3], *gb[3];
    for (int i = 0; i < 3; i++) {
        gx[i] = dput(t, hdx, rc * 4), gw[i] = dput(t, hw, C * 4), gb[i] = dput(t, hb, C * 4);
        const void *dd = i == 0 ? (const void *)dout : i == 1 ? d16 : d16s;
        kn_dtype ddt = i ? dt : KN_F32;
        if (ln)
            kn_layernorm_bwd(t->c, dt, gx[i], NULL, gw[i], gb[i], dd, ddt, i == 2 ? xs : x, w, mu,
                             rs, R, C);
        else
            kn_rmsnorm_bwd(t->c, dt, gx[i], NULL, gw[i], dd, ddt, i == 2 ? xs : x, w, rs, R, C);
    }
    for (int i = 1; i < 3; i++) {
        same_bits(t, i == 1 ? "norm dx, dout in dt" : "norm dx, dout in dt offset", dt, gx[i],
                  gx[0], rc * 4);
        same_bits(t, "norm dw, dout in dt", dt, gw[i], gw[0], C * 4);
        if (ln) same_bits(t, "norm db, dout in dt", dt, gb[i], gb[0], C * 4);
    }
    free(hw), free(hb), free(hd), free(hdx), free(hx), free(hmu), free(hrs), free(wmu), free(wrs),
        free(wy), free(wdx);
}

/* The fused residual add + norm in dt, aligned and offset. */
static void vec_add_norm(tc *t, kn_dtype dt, int R, int C)
{
    size_t rc = (size_t)R * C, es = kn_dtype_size(dt), nb = rc * es;
    float *af, *bf, *hw = hrand(C, 1), *hb = hrand(C, 1);
    void *a = typed_in(t, dt, rc, 3, &af), *b = typed_in(t, dt, rc, 2, &bf);
    void *as = dshift(t, a, nb, es), *bs = dshift(t, b, nb, es);
    float *w = dput(t, hw, C * 4), *bias = dput(t, hb, C * 4);
    float *ws = dshift(t, w, C * 4, 4), *biass = dshift(t, bias, C * 4, 4);
    void *res = typed_out(t, dt, rc), *o = typed_out(t, dt, rc);
    void *ress = dshift(t, res, nb, es), *os = dshift(t, o, nb, es);
    float *mu = dpoison(t, R), *rs = dpoison(t, R), *mus = dpoison(t, R), *rss = dpoison(t, R);
    kn_add_layernorm_fwd(t->c, dt, res, o, mu, rs, a, b, w, bias, R, C, 1e-5f);
    kn_add_layernorm_fwd(t->c, dt, ress, os, mus, rss, as, bs, ws, biass, R, C, 1e-5f);
    same_bits(t, "add_layernorm res offset", dt, res, ress, nb);
    same_bits(t, "add_layernorm out offset", dt, o, os, nb);
    same_bits(t, "add_layernorm mean offset", dt, mu, mus, R * 4);
    same_bits(t, "add_layernorm rstd offset", dt, rs, rss, R * 4);
    kn_add_rmsnorm_fwd(t->c, dt, res, o, rs, a, b, w, R, C, 1e-6f);
    kn_add_rmsnorm_fwd(t->c, dt, ress, os, rss, as, bs, ws, R, C, 1e-6f);
    same_bits(t, "add_rmsnorm res offset", dt, res, ress, nb);
    same_bits(t, "add_rmsnorm out offset", dt, o, os, nb);
    same_bits(t, "add_rmsnorm rstd offset", dt, rs, rss, R * 4);
    void *a2 = dshift(t, a, nb, 0); /* in place over a copy of a, packed */
    kn_add_rmsnorm_fwd(t->c, dt, a2, os, rss, a2, b, w, R, C, 1e-6f);
    same_bits(t, "add_rmsnorm in place res", dt, res, a2, nb);
    same_bits(t, "add_rmsnorm in place out", dt, o, os, nb);
    kn_add(t->c, dt, ress, as, bs, rc); /* unfused, offset: the fused op's bits */
    kn_rmsnorm_fwd(t->c, dt, os, rss, ress, ws, R, C, 1e-6f);
    same_bits(t, "add_rmsnorm offset unfused res", dt, res, ress, nb);
    same_bits(t, "add_rmsnorm offset unfused out", dt, o, os, nb);
    same_bits(t, "add_rmsnorm offset unfused rstd", dt, rs, rss, R * 4);
    free(hw), free(hb);
}

static void c_vec(tc *t)
{
    for (int di = KN_F32; di <= KN_F16; di++) {
        kn_dtype dt = (kn_dtype)di;
        vec_forward(t, dt, 1003);
        vec_backward(t, dt, 1003);
        for (int ln = 0; ln < 2; ln++) {
            vec_norm(t, dt, ln, 6, 64);
            vec_norm(t, dt, ln, 5, 61); /* C not a multiple of a pack */
        }
        vec_add_norm(t, dt, 6, 64);
    }
}

/* One block's parameter (fp32, or a split bf16 master from the same fp32
 * values), gradient and moments on the device, from host values. */
static kn_adamw_block block_put(tc *t, kn_dtype pdt, float wd, const float *hp, const float *hg,
                                const float *hm, const float *hv, size_t n)
{
    kn_adamw_block b = {NULL, NULL, dput(t, hg, n * 4), dput(t, hm, n * 4), dput(t, hv, n * 4), n,
                        wd,   pdt};
    float *p32 = dput(t, hp, n * 4);
    if (pdt == KN_F32) {
        b.p = p32;
        return b;
    }
    b.p = dput(t, NULL, n * 2), b.plo = dput(t, NULL, n * 2);
    kn_master_split(t->c, b.p, b.plo, p32, n);
    return b;
}

static void same_block(tc *t, const kn_adamw_block *a, const kn_adamw_block *b)
{
    same_bits(t, "adamw_blocks p", b->pdt, a->p, b->p, a->n * kn_dtype_size(a->pdt));
    if (a->plo) same_bits(t, "adamw_blocks plo", b->pdt, a->plo, b->plo, a->n * 2);
    same_bits(t, "adamw_blocks m", KN_F32, a->m, b->m, a->n * 4);
    same_bits(t, "adamw_blocks v", KN_F32, a->v, b->v, a->n * 4);
}

/* The context's error after a refused op holds want (case names the
 * check in the failure line). */
static void expect_refused(tc *t, const char *cas, const char *want)
{
    ty_err e = {0};
    if (!kn_check(t->c, &e) || !strstr(e.msg, want))
        fprintf(stderr, "FAIL %s %s: want \"%s\", got \"%s\"\n", t->dev, cas, want, e.msg),
            ty_failures++;
}

/* kn_adamw_blocks is, bit for bit, kn_scale by gscale[0], kn_scale by
 * gscale[1] and kn_adamw on each block: blocks of both master types, with
 * and without decay, one long enough to be split between threads, one
 * shorter than a 64-byte step and one empty, and more blocks than a CUDA
 * launch takes (kn_multi.cuh: 32), the master types mixed within one;
 * zero_grad leaves every gradient 0 and kn_adamw (no zero_grad) leaves it
 * as it was. */
static void c_adamw_blocks(tc *t)
{
    enum { NB = 41 };
    size_t ns[NB] = {40000, 7, 3001, 20011, 0};
    kn_dtype pdt[NB] = {KN_F32, KN_F32, KN_BF16, KN_BF16};
    float wd[NB] = {0.1f, 0.0f, 0.1f, 0.0f}, s0 = 1.0f / 3.0f, s1 = 0.7f;
    kn_adamw_block fused[NB], ref[NB];
    float *hg[NB];
    for (int i = 5; i < NB; i++) {
        ns[i] = 1 + (size_t)(i * 1237 % 9000);
        pdt[i] = i % 3 ? KN_BF16 : KN_F32;
        wd[i] = i % 2 ? 0.05f : 0.0f;
    }
    for (int i = 0; i < NB; i++) {
        size_t n = ns[i];
        float *hp = hrand(n, 1), *hm = hrand(n, 0.1), *hv = hrand(n, 0.1);
        hg[i] = hrand(n, 1);
        for (size_t j = 0; j < n; j++)
            hv[j] = fabsf(hv[j]);
        fused[i] = block_put(t, pdt[i], wd[i], hp, hg[i], hm, hv, n);
        ref[i] = block_put(t, pdt[i], wd[i], hp, hg[i], hm, hv, n);
        free(hp), free(hm), free(hv);
    }
    kn_adamw_hp hp = {1e-2f, 0.9f, 0.999f, 1e-8f, 3, {s0, s1}, 1};
    kn_adamw_blocks(t->c, fused, NB, hp);
    for (int i = 0; i < NB; i++) {
        kn_scale(t->c, ref[i].g, ref[i].n, s0);
        kn_scale(t->c, ref[i].g, ref[i].n, s1);
        kn_adamw(t->c, ref[i].pdt, ref[i].p, ref[i].plo, ref[i].g, ref[i].m, ref[i].v, ref[i].n,
                 hp.lr, hp.b1, hp.b2, hp.eps, ref[i].wd, hp.t);
        same_block(t, &fused[i], &ref[i]);
        float *fg = malloc(ns[i] * 4), *rg = malloc(ns[i] * 4);
        kn_sync(t->c);
        kn_to_host(t->c, fg, fused[i].g, ns[i] * 4);
        kn_to_host(t->c, rg, ref[i].g, ns[i] * 4);
        int bad = 0;
        for (size_t j = 0; j < ns[i]; j++)
            bad += fg[j] != 0.0f || rg[j] != hg[i][j] * s0 * s1;
        if (bad)
            fprintf(stderr, "FAIL %s adamw_blocks block %d: %d gradients not as left\n", t->dev, i,
                    bad),
                ty_failures++;
        free(fg), free(rg), free(hg[i]);
    }
    /* A master type AdamW does not update refuses the whole list, naming
     * it, before any block is touched. */
    static const char *const refused[] = {"adamw: parameters in fp16 are not supported",
                                          "adamw: parameters in bf16 need their low halves (plo)"};
    size_t n0 = fused[0].n;
    float *before = malloc(n0 * 4), *after = malloc(n0 * 4);
    kn_sync(t->c);
    kn_to_host(t->c, before, fused[0].p, n0 * 4);
    for (int r = 0; r < 2; r++) {
        kn_adamw_block two[2] = {fused[0], fused[2]};
        two[1].pdt = r ? KN_BF16 : KN_F16;
        two[1].plo = NULL;
        kn_adamw_blocks(t->c, two, 2, hp);
        expect_refused(t, "adamw_blocks", refused[r]);
    }
    kn_sync(t->c);
    kn_to_host(t->c, after, fused[0].p, n0 * 4);
    if (memcmp(before, after, n0 * 4))
        fprintf(stderr, "FAIL %s adamw_blocks: a refused list updated a block\n", t->dev),
            ty_failures++;
    free(before), free(after);
}

/* kn_convert_spans is kn_convert span by span, bit for bit, and leaves
 * the destination between its spans as it was: 80 spans (more than a CUDA
 * launch takes, kn_multi.cuh) of 0 to 9000 elements at odd offsets, from
 * and to fp32 and between the two 16-bit types. */
static void c_convert_spans(tc *t)
{
    enum { NS = 80 };
    kn_span s[NS];
    size_t src_n = 0, dst_n = 0;
    for (int i = 0; i < NS; i++) {
        size_t n = i % 7 == 3 ? 0 : i % 11 == 5 ? 9000 : 1 + (size_t)(i * 37 % 300);
        s[i] = (kn_span){dst_n + (size_t)(i % 3), src_n + (size_t)(i % 5), n};
        src_n = s[i].src + n;
        dst_n = s[i].dst + n;
    }
    dst_n += 2;
    float *h = hrand(src_n, 300.0);
    float *x32 = dput(t, h, src_n * 4);
    static const kn_dtype pairs[][2] = {
        {KN_F32, KN_BF16}, {KN_F32, KN_F16}, {KN_BF16, KN_F32}, {KN_BF16, KN_F16}};
    for (int p = 0; p < 4; p++) {
        kn_dtype dd = pairs[p][0], sd = pairs[p][1];
        size_t des = kn_dtype_size(dd), ses = kn_dtype_size(sd);
        void *src = dput(t, NULL, src_n * ses);
        kn_convert(t->c, src, sd, x32, KN_F32, src_n);
        unsigned char *pz = malloc(dst_n * des);
        memset(pz, 0xa5, dst_n * des);
        void *a = dput(t, pz, dst_n * des), *b = dput(t, pz, dst_n * des);
        kn_convert_spans(t->c, a, dd, src, sd, s, NS);
        for (int i = 0; i < NS; i++)
            kn_convert(t->c, (char *)b + s[i].dst * des, dd, (const char *)src + s[i].src * ses, sd,
                       s[i].n);
        same_bits(t, "convert_spans", dd, a, b, dst_n * des);
        free(pz);
    }
    free(h);
}

/* A backward asked to store its gradients in a type that is neither fp32
 * nor its activations' is refused with an error naming the op and both
 * types, and writes nothing. */
static void c_grad_dtype(tc *t)
{
    const size_t n = 64;
    const int T = 4, H = 1, D = 16;
    void *a = dput(t, NULL, n * 2), *b = dput(t, NULL, n * 2);
    kn_convert(t->c, a, KN_BF16, dpoison(t, n), KN_F32, n); /* poison the outputs */
    kn_convert(t->c, b, KN_BF16, dpoison(t, n), KN_F32, n);
    float *g = dput(t, NULL, n * 4), *l = dput(t, NULL, (size_t)T * 4);
    kn_zero(t->c, g, n);
    static const char *const want[] = {
        "swiglu backward: gradients in fp16 for bf16 activations",
        "geglu backward: gradients in fp16 for bf16 activations",
        "attention backward: gradients in fp16 for bf16 activations"};
    for (int op = 0; op < 3; op++) {
        if (op == 0) kn_swiglu_bwd(t->c, KN_BF16, KN_F16, a, b, g, KN_F32, g, g, n);
        if (op == 1) kn_geglu_bwd(t->c, KN_BF16, KN_F16, a, b, g, KN_F32, g, g, n);
        if (op == 2)
            kn_attention_bwd(t->c, KN_BF16, KN_F16, a, b, NULL, g, KN_F32, g, l, g, g, g, 1, T, H,
                             H, D, D, D, 0.0f, 0.0f, 0);
        expect_refused(t, "grad_dtype", want[op]);
    }
    uint16_t h[64];
    kn_sync(t->c);
    kn_to_host(t->c, h, a, sizeof h);
    int written = 0;
    for (size_t i = 0; i < n; i++)
        written += (h[i] & 0x7fc0) != 0x7fc0; /* NaN as kn_convert stores it */
    if (written)
        fprintf(stderr, "FAIL %s grad_dtype: %d outputs written after the refusal\n", t->dev,
                written),
            ty_failures++;
}

/* A product's bias in a type that is neither fp32 nor its weights' is
 * refused, naming the op and both types, and nothing is written. */
static void c_bias_dtype(tc *t)
{
    const int N = 4, K = 8, M = 16;
    float *x = dput(t, NULL, (size_t)N * K * 4), *o = dpoison(t, (size_t)N * M);
    void *w = dput(t, NULL, (size_t)M * K * 2), *b = dput(t, NULL, (size_t)M * 2);
    void *pre = dput(t, NULL, (size_t)N * M * 4);
    static const char *const want[] = {"matmul16: a fp16 bias for bf16 weights",
                                       "matmul_gelu_fwd: a fp16 bias for bf16 weights"};
    for (int op = 0; op < 2; op++) {
        if (op == 0) kn_matmul16_fwd(t->c, KN_BF16, KN_F32, KN_F32, o, x, w, b, KN_F16, N, K, M);
        if (op == 1)
            kn_matmul_gelu_fwd(t->c, KN_BF16, KN_F32, KN_F32, o, pre, x, w, b, KN_F16, N, K, M);
        expect_refused(t, "bias_dtype", want[op]);
    }
    float h[64];
    kn_sync(t->c);
    kn_to_host(t->c, h, o, sizeof h);
    int written = 0;
    for (int i = 0; i < N * M; i++)
        written += !isnan(h[i]);
    if (written)
        fprintf(stderr, "FAIL %s bias_dtype: %d outputs written after the refusal\n", t->dev,
                written),
            ty_failures++;
}

/* kn_sumsq_scaled(x, s) is kn_sumsq of x scaled by kn_scale, bit for bit
 * (s = 1: kn_sumsq of x), and inf, NaN or an overflowing product make it
 * non-finite. */
static void c_sumsq_scaled(tc *t)
{
    size_t n = 20011;
    float *h = hrand(n, 3), s = 1.0f / 3.0f;
    float *x = dput(t, h, n * 4), *y = dput(t, h, n * 4);
    kn_scale(t->c, y, n, s);
    double a = kn_sumsq_scaled(t->c, x, n, s), b = kn_sumsq(t->c, y, n);
    double c1 = kn_sumsq_scaled(t->c, x, n, 1.0f), d1 = kn_sumsq(t->c, x, n);
    if (a != b || c1 != d1)
        fprintf(stderr, "FAIL %s sumsq_scaled %.17g vs %.17g, s = 1: %.17g vs %.17g\n", t->dev, a,
                b, c1, d1),
            ty_failures++;
    float bad[4] = {INFINITY, -INFINITY, NAN, 3e38f};
    float scale[4] = {s, s, s, 4.0f};
    for (int k = 0; k < 4; k++) {
        size_t at = (size_t)k * 4999 + 17;
        kn_to_device(t->c, x + at, &bad[k], 4);
        double r = kn_sumsq_scaled(t->c, x, n, scale[k]);
        if (isfinite(r))
            fprintf(stderr, "FAIL %s sumsq_scaled misses %g (times %g)\n", t->dev, bad[k],
                    scale[k]),
                ty_failures++;
        kn_to_device(t->c, x + at, &h[at], 4);
    }
    free(h);
}

/* One 16-bit attention shape, forward and backward, against the same
 * backend's fp32 run on the widened inputs, at the dtype's tolerance:
 * the CUDA backend takes its tensor-core kernels here (16-bit P, dS and
 * dO in the products), the CPU its fp32 arithmetic. */
typedef struct {
    int D, T, Hq, Hkv, window;
    float scale, cap;
} att16_shape;

static void att16_fwd(tc *t, kn_dtype dt, att16_shape s, void *q, void *k, void *v, float *qf,
                      float *kf, float *vf, void *o, float *of, float *l)
{
    int B = 1, ldq = s.Hq * s.D, ldkv = s.Hkv * s.D;
    size_t nq = (size_t)B * s.T * ldq, nl = (size_t)B * s.Hq * s.T;
    float *l32 = dpoison(t, nl);
    kn_attention_fwd(t->c, dt, o, l, q, k, v, B, s.T, s.Hq, s.Hkv, s.D, ldq, ldkv, s.scale, s.cap,
                     s.window);
    kn_attention_fwd(t->c, KN_F32, of, l32, qf, kf, vf, B, s.T, s.Hq, s.Hkv, s.D, ldq, ldkv,
                     s.scale, s.cap, s.window);
    char what[96];
    snprintf(what, sizeof what, "attention16 D %d out", s.D);
    same(t, dt, what, o, of, nq, dt);
    snprintf(what, sizeof what, "attention16 D %d lse", s.D);
    same(t, KN_F32, what, l, l32, nl, dt);
}

/* kn_attention_bwd with g_dt = dt stores dq, dk, dv rounded once from the
 * fp32 gradients dq, dk, dv the same call made with g_dt fp32: bit for bit
 * what kn_convert of those gives, every element written. */
static void att_grads16(tc *t, kn_dtype dt, const float *dq, const float *dk, const float *dv,
                        const float *dout, const void *o, const float *l, const void *q,
                        const void *k, const void *v, int B, int T, int Hq, int Hkv, int D, int ldq,
                        int ldkv, float scale, float cap, int window)
{
    size_t nq = (size_t)B * T * ldq, nk = (size_t)B * T * ldkv, es = kn_dtype_size(dt);
    void *g[3] = {typed_out(t, dt, nq), typed_out(t, dt, nk), typed_out(t, dt, nk)};
    void *want[3] = {dput(t, NULL, nq * es), dput(t, NULL, nk * es), dput(t, NULL, nk * es)};
    kn_attention_bwd(t->c, dt, dt, g[0], g[1], g[2], dout, KN_F32, o, l, q, k, v, B, T, Hq, Hkv, D,
                     ldq, ldkv, scale, cap, window);
    kn_convert(t->c, want[0], dt, dq, KN_F32, nq);
    kn_convert(t->c, want[1], dt, dk, KN_F32, nk);
    kn_convert(t->c, want[2], dt, dv, KN_F32, nk);
    same_bits(t, "attention dq in dt", dt, g[0], want[0], nq * es);
    same_bits(t, "attention dk in dt", dt, g[1], want[1], nk * es);
    same_bits(t, "attention dv in dt", dt, g[2], want[2], nk * es);
    /* dout stored in dt (dout_dt), as a producer that rounds it stores
     * it: bit for bit the gradients of the fp32 dout, in fp32 and in dt */
    void *dout16 = dput(t, NULL, nq * es);
    kn_convert(t->c, dout16, dt, dout, KN_F32, nq);
    float *f[3] = {dpoison(t, nq), dpoison(t, nk), dpoison(t, nk)};
    kn_attention_bwd(t->c, dt, KN_F32, f[0], f[1], f[2], dout16, dt, o, l, q, k, v, B, T, Hq, Hkv,
                     D, ldq, ldkv, scale, cap, window);
    same_bits(t, "attention dq (dout in dt)", KN_F32, f[0], dq, nq * 4);
    same_bits(t, "attention dk (dout in dt)", KN_F32, f[1], dk, nk * 4);
    same_bits(t, "attention dv (dout in dt)", KN_F32, f[2], dv, nk * 4);
    void *h[3] = {typed_out(t, dt, nq), typed_out(t, dt, nk), typed_out(t, dt, nk)};
    kn_attention_bwd(t->c, dt, dt, h[0], h[1], h[2], dout16, dt, o, l, q, k, v, B, T, Hq, Hkv, D,
                     ldq, ldkv, scale, cap, window);
    same_bits(t, "attention dq in dt (dout in dt)", dt, h[0], want[0], nq * es);
    same_bits(t, "attention dk in dt (dout in dt)", dt, h[1], want[1], nk * es);
    same_bits(t, "attention dv in dt (dout in dt)", dt, h[2], want[2], nk * es);
}

static void att16_case(tc *t, kn_dtype dt, att16_shape s)
{
    int B = 1, ldq = s.Hq * s.D, ldkv = s.Hkv * s.D;
    size_t nq = (size_t)B * s.T * ldq, nk = (size_t)B * s.T * ldkv, nl = (size_t)B * s.Hq * s.T;
    float *qf, *kf, *vf;
    void *q = typed_in(t, dt, nq, 1, &qf), *k = typed_in(t, dt, nk, 1, &kf),
         *v = typed_in(t, dt, nk, 1, &vf), *o = typed_out(t, dt, nq);
    float *of = dpoison(t, nq), *l = dpoison(t, nl);
    att16_fwd(t, dt, s, q, k, v, qf, kf, vf, o, of, l);
    /* the last 9 rows alone over all T keys (a decode step over a KV
     * cache): those rows of the fp32 reference */
    int Tq = 9;
    void *okv = typed_out(t, dt, (size_t)Tq * ldq);
    kn_attention_kv_fwd(t->c, dt, okv, dpoison(t, (size_t)s.Hq * Tq),
                        (char *)q + (size_t)(s.T - Tq) * ldq * 2, k, v, 1, Tq, s.T, s.Hq, s.Hkv,
                        s.D, ldq, ldkv, s.scale, s.cap, s.window);
    char what[96];
    snprintf(what, sizeof what, "attention16_kv D %d out", s.D);
    same(t, dt, what, okv, of + (size_t)(s.T - Tq) * ldq, (size_t)Tq * ldq, dt);
    kn_convert(t->c, of, KN_F32, o, dt, nq); /* both read the 16-bit out */
    float *hdo = hrand(nq, 1), *hdk = hrand(nk, 1);
    float *ado = dput(t, hdo, nq * 4), *dq = dput(t, hdo, nq * 4), *dq32 = dput(t, hdo, nq * 4),
          *dk = dput(t, hdk, nk * 4), *dk32 = dput(t, hdk, nk * 4), *dv = dput(t, hdk, nk * 4),
          *dv32 = dput(t, hdk, nk * 4), *ador = dput(t, hdo, nq * 4);
    kn_round(t->c, ador, nq, dt); /* dout as a 16-bit backward reads it */
    kn_attention_bwd(t->c, dt, KN_F32, dq, dk, dv, ado, KN_F32, o, l, q, k, v, B, s.T, s.Hq, s.Hkv,
                     s.D, ldq, ldkv, s.scale, s.cap, s.window);
    kn_attention_bwd(t->c, KN_F32, KN_F32, dq32, dk32, dv32, ador, KN_F32, of, l, qf, kf, vf, B,
                     s.T, s.Hq, s.Hkv, s.D, ldq, ldkv, s.scale, s.cap, s.window);
    snprintf(what, sizeof what, "attention16 D %d dq (written)", s.D);
    same(t, KN_F32, what, dq, dq32, nq, dt);
    snprintf(what, sizeof what, "attention16 D %d dk (written)", s.D);
    same(t, KN_F32, what, dk, dk32, nk, dt);
    snprintf(what, sizeof what, "attention16 D %d dv (written)", s.D);
    same(t, KN_F32, what, dv, dv32, nk, dt);
    att_grads16(t, dt, dq, dk, dv, ado, o, l, q, k, v, B, s.T, s.Hq, s.Hkv, s.D, ldq, ldkv, s.scale,
                s.cap, s.window);
    free(hdo), free(hdk);
}

/* Each head dim the CUDA backend's tensor-core kernels are built for, with
 * grouped heads, a window, a soft-cap and a scale among them; T not a
 * multiple of any tile, and small: the emulation runs them one lane at a
 * time. */
static void c_attention16(tc *t)
{
    static const att16_shape shapes[] = {
        {64, 70, 4, 2, 0, 0.0f, 0.0f},  {80, 37, 2, 1, 20, 0.0f, 0.0f},
        {96, 35, 2, 2, 0, 0.3f, 2.0f},  {128, 40, 2, 1, 17, 0.0f, 1.5f},
        {256, 21, 2, 1, 0, 0.0f, 0.0f}, {64, 37, 3, 1, 9, 0.2f, 1.0f},
    };
    for (int di = KN_BF16; di <= KN_F16; di++)
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            att16_case(t, (kn_dtype)di, shapes[i]);
}

/* ---- attention in 16 bits at tile-sized shapes ---------------------------

 * kn_attention_* on 16-bit q, k, v past the tile sizes (several 64-row
 * blocks, T and D not multiples of 32, grouped heads, the Gemma options)
 * against the fp32 op on the same values: out to dt's tolerance, lse to
 * fp32's; the backward, fed a dO holding dt values (what the engine
 * passes, and what the CPU's AMX bf16 kernel takes), every gradient to
 * fp32's; and the last rows alone (kn_attention_kv_fwd) as the forward. */
static void att_tiles_case(tc *t, kn_dtype dt, int B, int T, int Hq, int Hkv, int D, float scale,
                           float cap, int window)
{
    int ldq = Hq * D + 8, ldkv = Hkv * D, Tq = T / 3;
    size_t nq = (size_t)B * T * ldq, nk = (size_t)B * T * ldkv, nl = (size_t)B * Hq * T;
    size_t no = (size_t)B * T * Hq * D;
    float *qf, *kf, *vf, *gf;
    void *q = typed_in(t, dt, nq, 1, &qf), *k = typed_in(t, dt, nk, 1, &kf),
         *v = typed_in(t, dt, nk, 1, &vf);
    typed_in(t, dt, no, 1, &gf); /* dO: dt values in fp32, as the engine's */
    void *o = typed_out(t, dt, no);
    float *o32 = dpoison(t, no), *l = dpoison(t, nl), *l32 = dpoison(t, nl);
    char what[96];
    snprintf(what, sizeof what, "attention16 out (T %d, D %d, cap %g, window %d)", T, D, cap,
             window);
    kn_attention_fwd(t->c, dt, o, l, q, k, v, B, T, Hq, Hkv, D, ldq, ldkv, scale, cap, window);
    kn_attention_fwd(t->c, KN_F32, o32, l32, qf, kf, vf, B, T, Hq, Hkv, D, ldq, ldkv, scale, cap,
                     window);
    same(t, dt, what, o, o32, no, dt);
    same(t, KN_F32, "attention16 lse", l, l32, nl, KN_F32);
    /* batch 0's last Tq rows over its T keys */
    void *okv = typed_out(t, dt, (size_t)Tq * Hq * D);
    float *okv32 = dpoison(t, (size_t)Tq * Hq * D), *lkv = dpoison(t, (size_t)Hq * Tq);
    size_t es = kn_dtype_size(dt), qoff = (size_t)(T - Tq) * ldq;
    kn_attention_kv_fwd(t->c, dt, okv, lkv, (char *)q + qoff * es, k, v, 1, Tq, T, Hq, Hkv, D, ldq,
                        ldkv, scale, cap, window);
    kn_attention_kv_fwd(t->c, KN_F32, okv32, lkv, qf + qoff, kf, vf, 1, Tq, T, Hq, Hkv, D, ldq,
                        ldkv, scale, cap, window);
    same(t, dt, "attention16 kv out", okv, okv32, (size_t)Tq * Hq * D, dt);
    float *of = dpoison(t, no);
    kn_convert(t->c, of, KN_F32, o, dt, no);
    float *hq = hrand(nq, 1), *hk = hrand(nk, 1);
    float *dq = dput(t, hq, nq * 4), *dq32 = dput(t, hq, nq * 4), *dk = dput(t, hk, nk * 4),
          *dk32 = dput(t, hk, nk * 4), *dv = dput(t, hk, nk * 4), *dv32 = dput(t, hk, nk * 4);
    kn_attention_bwd(t->c, dt, KN_F32, dq, dk, dv, gf, KN_F32, o, l32, q, k, v, B, T, Hq, Hkv, D,
                     ldq, ldkv, scale, cap, window);
    kn_attention_bwd(t->c, KN_F32, KN_F32, dq32, dk32, dv32, gf, KN_F32, of, l32, qf, kf, vf, B, T,
                     Hq, Hkv, D, ldq, ldkv, scale, cap, window);
    /* The CPU's AMX kernel splits P and dS in three bf16 parts: fp32's
     * tolerance. A device's tensor-core kernel (CUDA's flash attention, a
     * hi + lo pair) is held to dt's, as in the attention16 case. */
    kn_dtype gtol = strcmp(t->dev, "cpu") ? dt : KN_F32;
    same(t, KN_F32, "attention16 dq (written)", dq, dq32, nq, gtol);
    same(t, KN_F32, "attention16 dk (written)", dk, dk32, nk, gtol);
    same(t, KN_F32, "attention16 dv (written)", dv, dv32, nk, gtol);
    free(hq), free(hk);
}

static void c_attention_tiles(tc *t)
{
    for (int di = KN_BF16; di <= KN_F16; di++) {
        att_tiles_case(t, (kn_dtype)di, 1, 150, 4, 2, 40, 0.0f, 0.0f, 0);
        att_tiles_case(t, (kn_dtype)di, 2, 97, 2, 1, 64, 0.3f, 2.0f, 33);
        att_tiles_case(t, (kn_dtype)di, 1, 200, 3, 3, 16, 0.0f, 0.0f, 70);
        /* the flash kernels past two key tiles of 64: their second buffer
         * refilled while other warps may still read it (fl_kv_next) */
        att_tiles_case(t, (kn_dtype)di, 1, 200, 2, 1, 64, 0.0f, 0.0f, 0);
        att_tiles_case(t, (kn_dtype)di, 1, 140, 2, 2, 128, 0.0f, 1.5f, 0);
    }
}

static const struct {
    const char *name;
    void (*run)(tc *t);
} CASES[] = {
    {"elementwise", c_elementwise},
    {"convert", c_convert},
    {"embedding", c_embedding},
    {"norms", c_norms},
    {"matmul", c_matmul},
    {"gemv", c_gemv},
    {"matmul_gelu", c_matmul_gelu},
    {"activations", c_activations},
    {"attention", c_attention},
    {"attention16", c_attention16},
    {"crossentropy", c_crossentropy},
    {"logits", c_logits},
    {"adamw", c_adamw},
    {"adamw_blocks", c_adamw_blocks},
    {"convert_spans", c_convert_spans},
    {"grad_dtype", c_grad_dtype},
    {"bias_dtype", c_bias_dtype},
    {"sumsq_scaled", c_sumsq_scaled},
    {"master", c_master},
    {"typed", c_typed},
    {"attention_tiles", c_attention_tiles},
    {"add_norm", c_add_norm},
    {"param_grads", c_param_grads},
    {"vec", c_vec},
};

int main(int argc, char **argv)
{
    const struct {
        kn_device dev;
        const char *name;
    } devs[] = {{KN_CPU, "cpu"}, {KN_CUDA, "cuda"}, {KN_CUDA, "cuda-emu"}};
    int ran = 0;
    for (size_t d = 0; d < sizeof devs / sizeof *devs; d++) {
        kn_ctx *c = NULL;
        ty_err err = {0};
        int orc;
#ifdef TY_TEST_CUDA_EMU
        if (!strcmp(devs[d].name, "cuda-emu"))
            orc = kn_open_backend(&c, &kn_cuda_emu_backend, KN_CUDA, 0, 2, &err);
        else
#endif
            orc = strcmp(devs[d].name, "cuda-emu") ? kn_open(&c, devs[d].dev, 0, 2, &err)
                                                   : ty_err_set(&err, TY_EINVAL, "not linked");
        if (orc) {
            if (devs[d].dev == KN_CPU) {
                fprintf(stderr, "FAIL: the CPU backend does not open: %s\n", err.msg);
                return 1;
            }
            printf("skip %s: %s\n", devs[d].name, err.msg);
            continue;
        }
        for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
            if (argc > 1 && strcmp(argv[1], CASES[i].name)) continue;
            tc t = {c, devs[d].name, CASES[i].name};
            int before = ty_failures;
            CASES[i].run(&t);
            ty_err kerr = {0};
            if (kn_check(c, &kerr)) TY_FAIL("%s %s: %s", devs[d].name, CASES[i].name, kerr.msg);
            printf("%s %s %s\n", ty_failures == before ? "ok  " : "FAIL", devs[d].name,
                   CASES[i].name);
            ran++;
        }
        kn_close(c);
    }
    if (!ran) {
        fprintf(stderr, "no case ran\n");
        return 2;
    }
    return ty_summary(argc > 1 ? argv[1] : "kernels");
}
