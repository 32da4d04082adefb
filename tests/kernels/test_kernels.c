/* test_kernels.c — checks every CPU kernel against a double-precision
 * reference written here, independently of kernels/cpu.
 *
 * For each op: the fp32 forward is compared with a plain double forward, and
 * the fp32 analytic backward with central finite differences of that double
 * forward (loss L = sum(r * out) for a fixed random r, so dout = r). Sizes
 * are odd on purpose. Also checked: += accumulation (a second backward
 * doubles the gradients), NULL gradient pointers, GQA and fused-qkv strides,
 * ignored targets, AdamW against a hand-computed step, and determinism
 * (bit-equal across runs, and across 1 and 2 threads where promised).
 * Usage: test_kernels <op>   (ctest registers one case per op). */
#include "kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tyassert.h"

/* ---- helpers ----------------------------------------------------------- */

static uint64_t g_rng = 0x1234567887654321ULL;

static double urand(void) /* uniform in [-1, 1) */
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static kn_ctx *open_cpu(int threads)
{
    kn_ctx *c = NULL;
    ty_err err = {0};
    if (kn_open(&c, KN_CPU, 0, threads, &err)) {
        fprintf(stderr, "kn_open: %s\n", err.msg);
        exit(2);
    }
    return c;
}

static float *falloc(kn_ctx *c, size_t n)
{
    float *p = kn_alloc(c, n * sizeof *p);
    if (!p) {
        fprintf(stderr, "kn_alloc failed\n");
        exit(2);
    }
    return p;
}

/* A float tensor with random values in [-a, a) and its exact double copy. */
static float *frand(kn_ctx *c, double **dcopy, size_t n, double a)
{
    float *f = falloc(c, n);
    double *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)(urand() * a);
        d[i] = f[i];
    }
    *dcopy = d;
    return f;
}

static double *dzeros(size_t n)
{
    return calloc(n ? n : 1, sizeof(double));
}

static double maxabs(const double *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

/* got (fp32) vs want (double): |got - want| <= rtol |want| + atol_rel * max|want| + 1e-7. */
static void check_close(const char *what, const float *got, const double *want, size_t n,
                        double rtol, double atol_rel)
{
    double floor = atol_rel * maxabs(want, n) + 1e-7;
    int shown = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (!(err <= rtol * fabs(want[i]) + floor)) {
            if (shown++ < 5) TY_FAIL("%s[%zu]: got %.9g want %.9g", what, i, got[i], want[i]);
        }
    }
}

/* Bit equality of two float buffers. */
static void check_same(const char *what, const float *a, const float *b, size_t n)
{
    CHECK(memcmp(a, b, n * sizeof *a) == 0, "%s: results differ bit-wise", what);
}

/* ---- finite differences ------------------------------------------------ */

/* A reference loss over double arrays held in `st`. */
typedef double (*loss_fn)(void *st);

/* Central differences of L with respect to every element of x (double,
 * so the step can be tiny and the error negligible next to fp32). */
static double *fd_grad(loss_fn L, void *st, double *x, size_t n)
{
    double *g = malloc(n * sizeof *g);
    for (size_t i = 0; i < n; i++) {
        double o = x[i], h = 1e-6 * fmax(1.0, fabs(o));
        x[i] = o + h;
        double lp = L(st);
        x[i] = o - h;
        double lm = L(st);
        x[i] = o;
        g[i] = (lp - lm) / (2 * h);
    }
    return g;
}

/* Analytic fp32 gradient vs FD: rtol 1e-3, floor 1e-4 of the largest entry. */
static void check_grad(const char *what, const float *got, loss_fn L, void *st, double *x, size_t n)
{
    double *g = fd_grad(L, st, x, n);
    check_close(what, got, g, n, 1e-3, 1e-4);
    free(g);
}

/* After a second backward into the same buffer, it must hold twice the
 * first (up to the rounding of adding term by term onto a non-zero start). */
static void check_doubled(const char *what, const float *second, const float *first, size_t n)
{
    int shown = 0;
    double floor = 0;
    for (size_t i = 0; i < n; i++)
        floor = fmax(floor, 2e-5 * fabs(first[i]));
    for (size_t i = 0; i < n; i++) {
        double want = 2.0 * first[i];
        if (!(fabs(second[i] - want) <= 1e-5 * fabs(want) + floor + 1e-12)) {
            if (shown++ < 3)
                TY_FAIL("%s[%zu] after two backwards: %.9g, want %.9g", what, i, second[i], want);
        }
    }
}

static double dot_r(const double *r, const double *y, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += r[i] * y[i];
    return s;
}

static float *fcopy(kn_ctx *c, const float *src, size_t n)
{
    float *f = falloc(c, n);
    memcpy(f, src, n * sizeof *f);
    return f;
}

/* ---- context and memory ------------------------------------------------ */

static void test_context(void)
{
    kn_ctx *c = NULL;
    ty_err err = {0};
    CHECK(kn_open(&c, KN_CUDA, 0, 0, &err) == TY_EINVAL && c == NULL, "KN_CUDA should fail");
    CHECK(strstr(err.msg, "CUDA") != NULL, "CUDA error message: '%s'", err.msg);
    CHECK(kn_open(&c, KN_CPU, 0, -1, &err) == TY_EINVAL, "negative threads accepted");
    CHECK(kn_open(&c, (kn_device)7, 0, 0, &err) == TY_EINVAL, "unknown device accepted");
    const char *lib = getenv("TY_CPU_SGEMM");
    if (lib && *lib && strcmp(lib, "openblas") && strcmp(lib, "onednn")) {
        /* An unknown GEMM library is refused by name, not ignored. */
        CHECK(kn_open(&c, KN_CPU, 0, 2, &err) == TY_EINVAL && c == NULL, "TY_CPU_SGEMM=%s taken",
              lib);
        CHECK(strstr(err.msg, "TY_CPU_SGEMM") != NULL, "error message: '%s'", err.msg);
        return;
    }

    c = open_cpu(2);
    CHECK(kn_device_of(c) == KN_CPU, "device_of");
    CHECK(strcmp(kn_device_name(c), "cpu") == 0, "device name");
    /* The fp32 GEMM library: OpenBLAS when forced, oneDNN when forced or
     * (by default) on an AVX-512 CPU of a build with oneDNN. */
    const char *want =
        lib && *lib ? (strcmp(lib, "onednn") == 0 ? "cpu: onednn sgemm" : "cpu: openblas") : NULL;
    CHECK(strstr(kn_describe(c), "2 threads") &&
              (want ? strncmp(kn_describe(c), want, strlen(want)) == 0
                    : (strncmp(kn_describe(c), "cpu: openblas", 13) == 0 ||
                       strncmp(kn_describe(c), "cpu: onednn sgemm", 17) == 0)),
          "describe: '%s'", kn_describe(c));
    CHECK(kn_bytes_in_use(c) == 0 && kn_peak_bytes(c) == 0, "fresh context uses memory");

    enum { NB = 200 };
    void *ps[NB];
    size_t total = 0;
    for (int i = 0; i < NB; i++) {
        size_t sz = 1 + (size_t)i * 37;
        ps[i] = kn_alloc(c, sz);
        CHECK(ps[i] != NULL, "alloc %zu", sz);
        CHECK(((uintptr_t)ps[i] & 63) == 0, "alloc not 64-byte aligned");
        const unsigned char *b = ps[i];
        int zero = 1;
        for (size_t k = 0; k < sz; k++)
            zero &= b[k] == 0;
        CHECK(zero, "alloc not zeroed");
        memset(ps[i], 0xab, sz);
        total += sz;
    }
    CHECK(kn_bytes_in_use(c) == total, "in use %zu, want %zu", kn_bytes_in_use(c), total);
    size_t freed = 0;
    for (int i = 0; i < NB; i += 2) {
        kn_free(c, ps[i]);
        freed += 1 + (size_t)i * 37;
    }
    CHECK(kn_bytes_in_use(c) == total - freed, "after free: %zu, want %zu", kn_bytes_in_use(c),
          total - freed);
    CHECK(kn_peak_bytes(c) == total, "peak %zu, want %zu", kn_peak_bytes(c), total);
    kn_free(c, NULL);
    int stranger;
    kn_free(c, &stranger); /* not ours: ignored, accounting unchanged */
    CHECK(kn_bytes_in_use(c) == total - freed, "foreign pointer changed the accounting");
    for (int i = 1; i < NB; i += 2)
        kn_free(c, ps[i]);
    CHECK(kn_bytes_in_use(c) == 0, "all freed but %zu in use", kn_bytes_in_use(c));
    CHECK(kn_peak_bytes(c) == total, "peak changed by frees");

    float host[5] = {1, 2, 3, 4, 5}, back[5] = {0};
    float *d = falloc(c, 5);
    kn_to_device(c, d, host, sizeof host);
    kn_sync(c);
    kn_to_host(c, back, d, sizeof back);
    CHECK(memcmp(host, back, sizeof host) == 0, "round trip");
    /* Left allocated on purpose: kn_close releases what a context still owns. */
    kn_close(c);
    kn_close(NULL);
}

/* ---- elementwise and reductions --------------------------------------- */

static void test_elementwise(void)
{
    kn_ctx *c = open_cpu(2);
    size_t n = 100003; /* spans several threads and chunks */
    double *da, *db;
    float *a = frand(c, &da, n, 2.0), *b = frand(c, &db, n, 2.0);
    float *o = falloc(c, n);

    kn_add(c, KN_F32, o, a, b, n);
    double *want = dzeros(n);
    for (size_t i = 0; i < n; i++)
        want[i] = (double)a[i] + (double)b[i];
    check_close("add", o, want, n, 1e-7, 0);

    kn_copy(c, o, a, n);
    check_same("copy", o, a, n);
    kn_scale(c, o, n, 0.5f);
    for (size_t i = 0; i < n; i++)
        want[i] = 0.5 * a[i];
    check_close("scale", o, want, n, 0, 0);
    kn_axpy(c, o, b, n, -3.0f);
    for (size_t i = 0; i < n; i++)
        want[i] = 0.5 * a[i] - 3.0 * b[i];
    check_close("axpy", o, want, n, 1e-6, 1e-7);
    kn_zero(c, o, n);
    for (size_t i = 0; i < n; i++)
        CHECK(o[i] == 0.0f, "zero[%zu]", i);

    /* nonfinite: clean, NaN, +inf, -inf at both ends. */
    CHECK(kn_nonfinite(c, a, n) == 0, "finite data flagged");
    size_t spots[] = {0, n / 2, n - 1};
    float bad[] = {NAN, INFINITY, -INFINITY};
    for (int s = 0; s < 3; s++)
        for (int v = 0; v < 3; v++) {
            kn_copy(c, o, a, n);
            o[spots[s]] = bad[v];
            CHECK(kn_nonfinite(c, o, n) == 1, "missed %g at %zu", bad[v], spots[s]);
        }
    CHECK(kn_nonfinite(c, a, 0) == 0, "empty flagged");
    free(da);
    free(db);
    free(want);
    kn_close(c);
}

static void test_sum(void)
{
    kn_ctx *c1 = open_cpu(1), *c2 = open_cpu(2);
    size_t sizes[] = {0, 1, 7, 8191, 8193, 300007};
    for (int k = 0; k < 6; k++) {
        size_t n = sizes[k];
        double *dx;
        float *x = frand(c2, &dx, n ? n : 1, 3.0);
        double s = 0, sq = 0;
        for (size_t i = 0; i < n; i++) {
            s += dx[i];
            sq += dx[i] * dx[i];
        }
        double s1 = kn_sum(c1, x, n), s2 = kn_sum(c2, x, n);
        double q1 = kn_sumsq(c1, x, n), q2 = kn_sumsq(c2, x, n);
        CHECK(fabs(s2 - s) <= 1e-12 * (sq + 1), "sum n=%zu: %.17g vs %.17g", n, s2, s);
        CHECK(fabs(q2 - sq) <= 1e-12 * (sq + 1), "sumsq n=%zu: %.17g vs %.17g", n, q2, sq);
        /* Fixed order: identical bits for any thread count and any run. */
        CHECK(memcmp(&s1, &s2, sizeof s1) == 0, "sum n=%zu differs 1 vs 2 threads", n);
        CHECK(memcmp(&q1, &q2, sizeof q1) == 0, "sumsq n=%zu differs 1 vs 2 threads", n);
        double s3 = kn_sum(c2, x, n);
        CHECK(memcmp(&s3, &s2, sizeof s3) == 0, "sum n=%zu differs across runs", n);
        free(dx);
    }
    kn_close(c1);
    kn_close(c2);
}

/* ---- embedding --------------------------------------------------------- */

static void test_embedding(void)
{
    kn_ctx *c = open_cpu(2), *c1 = open_cpu(1);
    int N = 13, C = 37, V = 5;
    int32_t ids[13];
    for (int n = 0; n < N; n++)
        ids[n] = (n * 3) % V; /* repeats on purpose */
    double *dt, *dpos, *dr;
    float *table = frand(c, &dt, (size_t)V * C, 1.0);
    float *pos = frand(c, &dpos, (size_t)N * C, 1.0);
    float *r = frand(c, &dr, (size_t)N * C, 1.0);
    float *out = falloc(c, (size_t)N * C);

    kn_embedding_fwd(c, KN_F32, out, ids, table, N, C, 0);
    kn_embedding_fwd(c, KN_F32, out, ids, pos, N, C, 1); /* pos used as a second "table" row n */
    double *want = dzeros((size_t)N * C);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++)
            want[n * C + i] = dt[ids[n] * C + i] + dpos[ids[n] * C + i];
    check_close("embedding fwd", out, want, (size_t)N * C, 1e-6, 0);

    /* Backward: dtable[v] = sum over n with ids[n] == v of r[n]. */
    float *dtab = falloc(c, (size_t)V * C);
    kn_embedding_bwd(c, dtab, ids, r, N, C);
    double *gw = dzeros((size_t)V * C);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++)
            gw[ids[n] * C + i] += dr[n * C + i];
    check_close("embedding bwd", dtab, gw, (size_t)V * C, 1e-5, 1e-6);
    float *first = fcopy(c, dtab, (size_t)V * C);
    kn_embedding_bwd(c, dtab, ids, r, N, C);
    check_doubled("embedding dtable", dtab, first, (size_t)V * C);

    /* Thread-count independence on a bigger case. */
    int N2 = 301, C2 = 515, V2 = 17;
    int32_t *ids2 = malloc(N2 * sizeof *ids2);
    for (int n = 0; n < N2; n++)
        ids2[n] = (int32_t)((n * 7) % V2);
    double *dg2;
    float *g2 = frand(c, &dg2, (size_t)N2 * C2, 1.0);
    float *t1 = falloc(c, (size_t)V2 * C2), *t2 = falloc(c, (size_t)V2 * C2);
    kn_embedding_bwd(c1, t1, ids2, g2, N2, C2);
    kn_embedding_bwd(c, t2, ids2, g2, N2, C2);
    check_same("embedding bwd 1 vs 2 threads", t1, t2, (size_t)V2 * C2);

    free(ids2);
    free(dg2);
    free(dt);
    free(dpos);
    free(dr);
    free(want);
    free(gw);
    kn_close(c);
    kn_close(c1);
}

/* ---- layernorm / rmsnorm ---------------------------------------------- */

typedef struct {
    int N, C, rms;
    double eps;
    double *x, *w, *b, *r; /* b may be NULL */
    double *out;           /* scratch [N*C] */
} norm_st;

static void norm_ref(norm_st *s)
{
    for (int n = 0; n < s->N; n++) {
        const double *x = s->x + (size_t)n * s->C;
        double m = 0, v = 0;
        if (!s->rms) {
            for (int i = 0; i < s->C; i++)
                m += x[i];
            m /= s->C;
        }
        for (int i = 0; i < s->C; i++)
            v += (x[i] - m) * (x[i] - m);
        double rs = 1.0 / sqrt(v / s->C + s->eps);
        for (int i = 0; i < s->C; i++)
            s->out[n * s->C + i] = (x[i] - m) * rs * s->w[i] + (s->b ? s->b[i] : 0.0);
    }
}

static double norm_loss(void *st)
{
    norm_st *s = st;
    norm_ref(s);
    return dot_r(s->r, s->out, (size_t)s->N * s->C);
}

static void run_norm(int rms, int with_bias)
{
    kn_ctx *c = open_cpu(2), *c1 = open_cpu(1);
    int N = 9, C = 53;
    size_t NC = (size_t)N * C;
    float eps = 1e-5f;
    norm_st s = {.N = N, .C = C, .rms = rms, .eps = eps};
    float *x = frand(c, &s.x, NC, 2.0);
    for (size_t i = 0; i < NC; i++) { /* an offset so the mean matters */
        x[i] += 0.5f;
        s.x[i] = x[i];
    }
    float *w = frand(c, &s.w, C, 1.0);
    double *dbias = NULL;
    float *b = with_bias ? frand(c, &dbias, C, 1.0) : NULL;
    s.b = dbias;
    float *r = frand(c, &s.r, NC, 1.0);
    s.out = dzeros(NC);

    float *out = falloc(c, NC), *mean = falloc(c, N), *rstd = falloc(c, N);
    if (rms)
        kn_rmsnorm_fwd(c, KN_F32, out, rstd, x, w, N, C, eps);
    else
        kn_layernorm_fwd(c, KN_F32, out, mean, rstd, x, w, b, N, C, eps);
    norm_ref(&s);
    check_close(rms ? "rmsnorm fwd" : "layernorm fwd", out, s.out, NC, 1e-4, 1e-5);

    float *dx = falloc(c, NC), *dw = falloc(c, C), *db = falloc(c, C);
    if (rms)
        kn_rmsnorm_bwd(c, KN_F32, dx, NULL, dw, r, KN_F32, x, w, rstd, N, C);
    else
        kn_layernorm_bwd(c, KN_F32, dx, NULL, dw, with_bias ? db : NULL, r, KN_F32, x, w, mean,
                         rstd, N, C);
    check_grad("norm dx", dx, norm_loss, &s, s.x, NC);
    check_grad("norm dw", dw, norm_loss, &s, s.w, C);
    if (with_bias) check_grad("norm db", db, norm_loss, &s, s.b, C);

    /* Accumulation: a second backward doubles every gradient. */
    float *dx1 = fcopy(c, dx, NC), *dw1 = fcopy(c, dw, C), *db1 = fcopy(c, db, C);
    if (rms)
        kn_rmsnorm_bwd(c, KN_F32, dx, NULL, dw, r, KN_F32, x, w, rstd, N, C);
    else
        kn_layernorm_bwd(c, KN_F32, dx, NULL, dw, with_bias ? db : NULL, r, KN_F32, x, w, mean,
                         rstd, N, C);
    check_doubled("norm dx", dx, dx1, NC);
    check_doubled("norm dw", dw, dw1, C);
    if (with_bias) check_doubled("norm db", db, db1, C);

    /* NULL gradients are skipped; the others are unchanged by the omission. */
    float *dx2 = falloc(c, NC), *dw2 = falloc(c, C);
    if (rms) {
        kn_rmsnorm_bwd(c, KN_F32, NULL, NULL, dw2, r, KN_F32, x, w, rstd, N, C);
        kn_rmsnorm_bwd(c, KN_F32, dx2, NULL, NULL, r, KN_F32, x, w, rstd, N, C);
    } else {
        kn_layernorm_bwd(c, KN_F32, NULL, NULL, dw2, NULL, r, KN_F32, x, w, mean, rstd, N, C);
        kn_layernorm_bwd(c, KN_F32, dx2, NULL, NULL, NULL, r, KN_F32, x, w, mean, rstd, N, C);
    }
    check_same("norm dx alone", dx2, dx1, NC);
    check_same("norm dw alone", dw2, dw1, C);

    /* Thread-count independence of the column reductions on a bigger case. */
    int N3 = 257, C3 = 300;
    double *tmp;
    float *x3 = frand(c, &tmp, (size_t)N3 * C3, 1.0);
    free(tmp);
    float *g3 = frand(c, &tmp, (size_t)N3 * C3, 1.0);
    free(tmp);
    float *w3 = frand(c, &tmp, C3, 1.0);
    free(tmp);
    float *o3 = falloc(c, (size_t)N3 * C3), *m3 = falloc(c, N3), *r3 = falloc(c, N3);
    float *a1 = falloc(c, C3), *a2 = falloc(c, C3), *b1 = falloc(c, C3), *b2 = falloc(c, C3);
    if (rms) {
        kn_rmsnorm_fwd(c, KN_F32, o3, r3, x3, w3, N3, C3, eps);
        kn_rmsnorm_bwd(c1, KN_F32, NULL, NULL, a1, g3, KN_F32, x3, w3, r3, N3, C3);
        kn_rmsnorm_bwd(c, KN_F32, NULL, NULL, a2, g3, KN_F32, x3, w3, r3, N3, C3);
    } else {
        kn_layernorm_fwd(c, KN_F32, o3, m3, r3, x3, w3, NULL, N3, C3, eps);
        kn_layernorm_bwd(c1, KN_F32, NULL, NULL, a1, b1, g3, KN_F32, x3, w3, m3, r3, N3, C3);
        kn_layernorm_bwd(c, KN_F32, NULL, NULL, a2, b2, g3, KN_F32, x3, w3, m3, r3, N3, C3);
    }
    check_same("norm dw 1 vs 2 threads", a1, a2, C3);
    check_same("norm db 1 vs 2 threads", b1, b2, C3);

    free(s.x);
    free(s.w);
    free(s.b);
    free(s.r);
    free(s.out);
    kn_close(c);
    kn_close(c1);
}

static void test_layernorm(void)
{
    run_norm(0, 1);
    run_norm(0, 0);
}

static void test_rmsnorm(void)
{
    run_norm(1, 0);
}

/* ---- matmul ------------------------------------------------------------ */

typedef struct {
    int N, K, M;
    double *x, *w, *b, *r, *out;
} mm_st;

static double mm_loss(void *st)
{
    mm_st *s = st;
    for (int n = 0; n < s->N; n++)
        for (int m = 0; m < s->M; m++) {
            double acc = s->b ? s->b[m] : 0.0;
            for (int k = 0; k < s->K; k++)
                acc += s->x[n * s->K + k] * s->w[m * s->K + k];
            s->out[n * s->M + m] = acc;
        }
    return dot_r(s->r, s->out, (size_t)s->N * s->M);
}

static void run_matmul(int with_bias)
{
    kn_ctx *c = open_cpu(2);
    int N = 7, K = 13, M = 11;
    mm_st s = {.N = N, .K = K, .M = M};
    float *x = frand(c, &s.x, (size_t)N * K, 1.0);
    float *w = frand(c, &s.w, (size_t)M * K, 1.0);
    double *dbias = NULL;
    float *b = with_bias ? frand(c, &dbias, M, 1.0) : NULL;
    s.b = dbias;
    float *r = frand(c, &s.r, (size_t)N * M, 1.0);
    s.out = dzeros((size_t)N * M);

    float *out = falloc(c, (size_t)N * M);
    kn_matmul_fwd(c, out, x, w, b, N, K, M);
    mm_loss(&s);
    check_close("matmul fwd", out, s.out, (size_t)N * M, 1e-5, 1e-6);

    float *dx = falloc(c, (size_t)N * K), *dw = falloc(c, (size_t)M * K), *db = falloc(c, M);
    kn_matmul_bwd(c, dx, dw, with_bias ? db : NULL, r, x, w, N, K, M);
    check_grad("matmul dx", dx, mm_loss, &s, s.x, (size_t)N * K);
    check_grad("matmul dw", dw, mm_loss, &s, s.w, (size_t)M * K);
    if (with_bias) check_grad("matmul db", db, mm_loss, &s, s.b, M);

    float *dx1 = fcopy(c, dx, (size_t)N * K), *dw1 = fcopy(c, dw, (size_t)M * K);
    float *db1 = fcopy(c, db, M);
    kn_matmul_bwd(c, dx, dw, with_bias ? db : NULL, r, x, w, N, K, M);
    check_doubled("matmul dx", dx, dx1, (size_t)N * K);
    check_doubled("matmul dw", dw, dw1, (size_t)M * K);
    if (with_bias) check_doubled("matmul db", db, db1, M);

    float *dx2 = falloc(c, (size_t)N * K), *dw2 = falloc(c, (size_t)M * K), *db2 = falloc(c, M);
    kn_matmul_bwd(c, dx2, NULL, NULL, r, x, w, N, K, M);
    kn_matmul_bwd(c, NULL, dw2, NULL, r, x, w, N, K, M);
    kn_matmul_bwd(c, NULL, NULL, db2, r, x, w, N, K, M);
    check_same("matmul dx alone", dx2, dx1, (size_t)N * K);
    check_same("matmul dw alone", dw2, dw1, (size_t)M * K);
    if (with_bias) check_same("matmul db alone", db2, db1, M);

    free(s.x);
    free(s.w);
    free(s.b);
    free(s.r);
    free(s.out);
    kn_close(c);
}

static void test_matmul(void)
{
    run_matmul(1);
    run_matmul(0);
    /* A bigger shape (blocked BLAS paths, threaded bias reduction), fwd only
     * against double, and the dbias reduction for 1 vs 2 threads. */
    kn_ctx *c = open_cpu(2), *c1 = open_cpu(1);
    int N = 67, K = 129, M = 301;
    mm_st s = {.N = N, .K = K, .M = M};
    float *x = frand(c, &s.x, (size_t)N * K, 1.0);
    float *w = frand(c, &s.w, (size_t)M * K, 1.0);
    float *b = frand(c, &s.b, M, 1.0);
    s.r = dzeros((size_t)N * M);
    s.out = dzeros((size_t)N * M);
    float *out = falloc(c, (size_t)N * M);
    kn_matmul_fwd(c, out, x, w, b, N, K, M);
    mm_loss(&s);
    check_close("matmul fwd big", out, s.out, (size_t)N * M, 1e-4, 1e-5);
    float *db1 = falloc(c, M), *db2 = falloc(c, M);
    kn_matmul_bwd(c1, NULL, NULL, db1, out, x, w, N, K, M);
    kn_matmul_bwd(c, NULL, NULL, db2, out, x, w, N, K, M);
    check_same("matmul dbias 1 vs 2 threads", db1, db2, M);
    free(s.x);
    free(s.w);
    free(s.b);
    free(s.r);
    free(s.out);
    kn_close(c);
    kn_close(c1);
}

/* ---- rope --------------------------------------------------------------- */

typedef struct {
    int B, T, H, D, ld, off;
    double base;
    const float *inv; /* kn_rope_freq's inverse frequencies; NULL: base's */
    double *x, *r, *out;
} rope_st;

static double rope_loss(void *st)
{
    rope_st *s = st;
    int half = s->D / 2;
    memcpy(s->out, s->x, (size_t)s->B * s->T * s->ld * sizeof(double));
    for (int b = 0; b < s->B; b++)
        for (int t = 0; t < s->T; t++)
            for (int h = 0; h < s->H; h++) {
                size_t o = ((size_t)b * s->T + t) * s->ld + (size_t)h * s->D;
                for (int i = 0; i < half; i++) {
                    double th =
                        (t + s->off) * (s->inv ? (double)s->inv[i] : pow(s->base, -2.0 * i / s->D));
                    double a = s->x[o + i], bb = s->x[o + i + half];
                    s->out[o + i] = a * cos(th) - bb * sin(th);
                    s->out[o + i + half] = bb * cos(th) + a * sin(th);
                }
            }
    return dot_r(s->r, s->out, (size_t)s->B * s->T * s->ld);
}

static void run_rope_with(kn_ctx *c, int B, int T, int H, int D, int ld, int off, double base,
                          const float *inv)
{
    rope_st s = {.B = B, .T = T, .H = H, .D = D, .ld = ld, .off = off, .base = base, .inv = inv};
    size_t n = (size_t)s.B * s.T * s.ld;
    float *x = frand(c, &s.x, n, 1.0);
    float *r = frand(c, &s.r, n, 1.0);
    s.out = dzeros(n);
    float *y = fcopy(c, x, n);
    if (inv)
        kn_rope_freq_fwd(c, KN_F32, y, s.B, s.T, s.H, s.D, s.ld, inv, s.off);
    else
        kn_rope_fwd(c, KN_F32, y, s.B, s.T, s.H, s.D, s.ld, (float)s.base, s.off);
    rope_loss(&s);
    check_close("rope fwd", y, s.out, n, 1e-5, 1e-6);
    for (size_t i = 0; i < n; i++)
        if ((int)(i % s.ld) >= s.H * s.D)
            CHECK(y[i] == x[i], "rope touched column %zu outside the heads", i % s.ld);

    /* The backward is the transpose, in place: dx = R^T r. */
    float *g = fcopy(c, r, n);
    if (inv)
        kn_rope_freq_bwd(c, KN_F32, g, s.B, s.T, s.H, s.D, s.ld, inv, s.off);
    else
        kn_rope_bwd(c, KN_F32, g, s.B, s.T, s.H, s.D, s.ld, (float)s.base, s.off);
    check_grad("rope dx", g, rope_loss, &s, s.x, n);

    /* Forward then backward is the identity (a rotation and its inverse). */
    if (inv)
        kn_rope_freq_bwd(c, KN_F32, y, s.B, s.T, s.H, s.D, s.ld, inv, s.off);
    else
        kn_rope_bwd(c, KN_F32, y, s.B, s.T, s.H, s.D, s.ld, (float)s.base, s.off);
    check_close("rope bwd(fwd(x))", y, s.x, n, 1e-5, 1e-6);
    free(s.x);
    free(s.r);
    free(s.out);
}

static void run_rope(kn_ctx *c, int B, int T, int H, int D, int ld, int off, double base)
{
    run_rope_with(c, B, T, H, D, ld, off, base, NULL);
}

/* kn_rope_freq: given frequencies (here base's, divided by a factor that
 * grows with i, as scaled RoPE does to the low frequencies), checked
 * against the same float64 reference; with base's own frequencies it must
 * give kn_rope's numbers. */
static void run_rope_freq(kn_ctx *c, int B, int T, int H, int D, int ld, int off)
{
    float *inv = kn_alloc(c, (size_t)(D / 2) * sizeof *inv);
    for (int i = 0; i < D / 2; i++)
        inv[i] = (float)(pow(10000.0, -2.0 * i / D) / (1.0 + 3.0 * i / D));
    run_rope_with(c, B, T, H, D, ld, off, 0, inv);
    for (int i = 0; i < D / 2; i++)
        inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)D);
    size_t n = (size_t)B * T * ld;
    double *xd;
    float *x = frand(c, &xd, n, 1.0), *y = fcopy(c, x, n);
    kn_rope_fwd(c, KN_F32, x, B, T, H, D, ld, 10000.0f, off);
    kn_rope_freq_fwd(c, KN_F32, y, B, T, H, D, ld, inv, off);
    for (size_t i = 0; i < n; i++)
        CHECK(fabsf(x[i] - y[i]) <= 1e-6f * (1.0f + fabsf(x[i])),
              "rope_freq vs rope at %zu: %g vs %g", i, y[i], x[i]);
    free(xd);
    kn_free(c, inv);
}

static void test_rope(void)
{
    kn_ctx *c = open_cpu(2);
    /* H=3 heads of D=10 inside rows of 37 (a fused buffer with extra
     * columns). One context throughout, so the cached cos/sin table is
     * reused, grown, and rebuilt for a new D and base. */
    run_rope(c, 2, 5, 3, 10, 37, 3, 10000.0);
    run_rope(c, 1, 4, 2, 10, 20, 0, 10000.0);   /* inside the cached range */
    run_rope(c, 1, 30, 1, 10, 10, 25, 10000.0); /* grows it */
    run_rope(c, 2, 6, 2, 8, 19, 1, 500000.0);   /* new D and base */
    run_rope(c, 1, 3, 1, 10, 10, -2, 10000.0);  /* negative offset: no table */
    run_rope_freq(c, 2, 5, 3, 10, 37, 3);
    run_rope_freq(c, 1, 7, 2, 16, 32, 40);
    kn_close(c);
}

/* ---- attention --------------------------------------------------------- */

typedef struct {
    int B, T, Hq, Hkv, D, ldq, ldkv;
    float scale, cap;        /* 0 = 1/sqrt(D); soft-cap, 0 = off */
    int window;              /* sliding window, 0 = off */
    double *q, *k, *v, *r;   /* q/k/v may point into one fused buffer */
    double *out, *att, *lse; /* att [B,Hq,T,T] is only the reference's */
} att_st;

static double att_loss(void *st)
{
    att_st *s = st;
    int grp = s->Hq / s->Hkv;
    double scale = s->scale != 0.0f ? s->scale : 1.0 / sqrt((double)s->D);
    double *sc = malloc((size_t)s->T * sizeof *sc);
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->Hq; h++) {
            int g = h / grp;
            for (int i = 0; i < s->T; i++) {
                const double *qi = s->q + ((size_t)b * s->T + i) * s->ldq + h * s->D;
                int lo = s->window > 0 && i - s->window + 1 > 0 ? i - s->window + 1 : 0;
                double mx = -INFINITY;
                for (int j = lo; j <= i; j++) {
                    const double *kj = s->k + ((size_t)b * s->T + j) * s->ldkv + g * s->D;
                    double a = 0;
                    for (int d = 0; d < s->D; d++)
                        a += qi[d] * kj[d];
                    sc[j] = a * scale;
                    if (s->cap > 0) sc[j] = s->cap * tanh(sc[j] / s->cap);
                    mx = fmax(mx, sc[j]);
                }
                double z = 0;
                for (int j = lo; j <= i; j++)
                    z += exp(sc[j] - mx);
                s->lse[((size_t)b * s->Hq + h) * s->T + i] = mx + log(z);
                double *arow = s->att + (((size_t)b * s->Hq + h) * s->T + i) * s->T;
                for (int j = 0; j < s->T; j++)
                    arow[j] = j >= lo && j <= i ? exp(sc[j] - mx) / z : 0.0;
                double *o = s->out + ((size_t)b * s->T + i) * s->Hq * s->D + h * s->D;
                for (int d = 0; d < s->D; d++) {
                    double a = 0;
                    for (int j = lo; j <= i; j++)
                        a += arow[j] * s->v[((size_t)b * s->T + j) * s->ldkv + g * s->D + d];
                    o[d] = a;
                }
            }
        }
    free(sc);
    return dot_r(s->r, s->out, (size_t)s->B * s->T * s->Hq * s->D);
}

/* fused: one [B,T,ldq] buffer holding q | k | v (GPT-2), else three buffers
 * with their own strides (padded rows, to catch stride bugs). */
static void run_attention_g(int B, int T, int Hq, int Hkv, int D, int fused, float scale, float cap,
                            int window)
{
    kn_ctx *c = open_cpu(2), *c1 = open_cpu(1);
    att_st s = {
        .B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .D = D, .scale = scale, .cap = cap, .window = window};
    size_t C = (size_t)Hq * D, Ckv = (size_t)Hkv * D;
    float *q, *k, *v, *qkv = NULL;
    double *dqkv = NULL, *dqs = NULL, *dks = NULL, *dvs = NULL;
    size_t nq, nkv; /* elements of the (strided) q and kv buffers */
    if (fused) {
        s.ldq = s.ldkv = (int)(C + 2 * Ckv);
        nq = nkv = (size_t)B * T * s.ldq;
        qkv = frand(c, &dqkv, nq, 1.5);
        q = qkv;
        k = qkv + C;
        v = qkv + C + Ckv;
        s.q = dqkv;
        s.k = dqkv + C;
        s.v = dqkv + C + Ckv;
    } else {
        s.ldq = (int)C + 3;
        s.ldkv = (int)Ckv + 5;
        nq = (size_t)B * T * s.ldq;
        nkv = (size_t)B * T * s.ldkv;
        q = frand(c, &dqs, nq, 1.5);
        k = frand(c, &dks, nkv, 1.5);
        v = frand(c, &dvs, nkv, 1.5);
        s.q = dqs;
        s.k = dks;
        s.v = dvs;
    }
    size_t no = (size_t)B * T * C, na = (size_t)B * Hq * T * T;
    float *r = frand(c, &s.r, no, 1.0);
    size_t nl = (size_t)B * Hq * T;
    s.out = dzeros(no);
    s.att = dzeros(na);
    s.lse = dzeros(nl);

    /* Outputs are poisoned: every element must be written. */
    float *out = falloc(c, no), *lse = falloc(c, nl);
    for (size_t i = 0; i < no; i++)
        out[i] = NAN;
    for (size_t i = 0; i < nl; i++)
        lse[i] = NAN;
    kn_attention_fwd(c, KN_F32, out, lse, q, k, v, B, T, Hq, Hkv, D, s.ldq, s.ldkv, scale, cap,
                     window);
    att_loss(&s);
    check_close("attention out", out, s.out, no, 1e-4, 1e-5);
    check_close("attention lse", lse, s.lse, nl, 1e-5, 1e-6);

    /* Gradient buffers share the input layouts (fused: one dqkv). */
    float *gq, *gk, *gv, *gbuf = NULL, *gq_s = NULL, *gk_s = NULL, *gv_s = NULL;
    if (fused) {
        gbuf = falloc(c, nq);
        gq = gbuf;
        gk = gbuf + C;
        gv = gbuf + C + Ckv;
    } else {
        gq = gq_s = falloc(c, nq);
        gk = gk_s = falloc(c, nkv);
        gv = gv_s = falloc(c, nkv);
    }
    kn_attention_bwd(c, KN_F32, KN_F32, gq, gk, gv, r, KN_F32, out, lse, q, k, v, B, T, Hq, Hkv, D,
                     s.ldq, s.ldkv, scale, cap, window);
    if (fused) {
        /* One FD pass over the whole fused buffer checks q, k and v at once,
         * and that the padding columns (none here) stay untouched. */
        check_grad("attention dqkv", gbuf, att_loss, &s, dqkv, nq);
    } else {
        /* Padding columns of the gradient must stay zero, so FD (zero there) agrees. */
        check_grad("attention dq", gq, att_loss, &s, dqs, nq);
        check_grad("attention dk", gk, att_loss, &s, dks, nkv);
        check_grad("attention dv", gv, att_loss, &s, dvs, nkv);
    }

    /* Written, not added, and NULL gradients (separate-buffer case only). */
    if (!fused) {
        float *q1 = fcopy(c, gq, nq), *k1 = fcopy(c, gk, nkv), *v1 = fcopy(c, gv, nkv);
        kn_attention_bwd(c, KN_F32, KN_F32, gq, gk, gv, r, KN_F32, out, lse, q, k, v, B, T, Hq, Hkv,
                         D, s.ldq, s.ldkv, scale, cap, window);
        check_same("attention dq again", gq, q1, nq);
        check_same("attention dk again", gk, k1, nkv);
        check_same("attention dv again", gv, v1, nkv);
        float *q2 = falloc(c, nq), *k2 = falloc(c, nkv), *v2 = falloc(c, nkv);
        kn_attention_bwd(c, KN_F32, KN_F32, q2, NULL, NULL, r, KN_F32, out, lse, q, k, v, B, T, Hq,
                         Hkv, D, s.ldq, s.ldkv, scale, cap, window);
        kn_attention_bwd(c, KN_F32, KN_F32, NULL, k2, NULL, r, KN_F32, out, lse, q, k, v, B, T, Hq,
                         Hkv, D, s.ldq, s.ldkv, scale, cap, window);
        kn_attention_bwd(c, KN_F32, KN_F32, NULL, NULL, v2, r, KN_F32, out, lse, q, k, v, B, T, Hq,
                         Hkv, D, s.ldq, s.ldkv, scale, cap, window);
        check_same("attention dq alone", q2, q1, nq);
        check_same("attention dk alone", k2, k1, nkv);
        check_same("attention dv alone", v2, v1, nkv);

        /* Same bits on 1 thread as on 2, forward and backward. */
        float *out1 = falloc(c, no), *lse1 = falloc(c, nl);
        kn_attention_fwd(c1, KN_F32, out1, lse1, q, k, v, B, T, Hq, Hkv, D, s.ldq, s.ldkv, scale,
                         cap, window);
        check_same("attention out 1 vs 2 threads", out1, out, no);
        check_same("attention lse 1 vs 2 threads", lse1, lse, nl);
        float *q3 = falloc(c, nq), *k3 = falloc(c, nkv), *v3 = falloc(c, nkv);
        kn_attention_bwd(c1, KN_F32, KN_F32, q3, k3, v3, r, KN_F32, out, lse, q, k, v, B, T, Hq,
                         Hkv, D, s.ldq, s.ldkv, scale, cap, window);
        check_same("attention dq 1 vs 2 threads", q3, q1, nq);
        check_same("attention dk 1 vs 2 threads", k3, k1, nkv);
        check_same("attention dv 1 vs 2 threads", v3, v1, nkv);
    }

    free(dqkv);
    free(dqs);
    free(dks);
    free(dvs);
    free(s.r);
    free(s.out);
    free(s.att);
    free(s.lse);
    kn_close(c);
    kn_close(c1);
}

static void run_attention(int B, int T, int Hq, int Hkv, int D, int fused)
{
    run_attention_g(B, T, Hq, Hkv, D, fused, 0.0f, 0.0f, 0);
}

static void test_attention(void)
{
    /* Gemma: an explicit scale, a soft-cap that bites (scores reach ~5),
     * sliding windows shorter than T, one past a 64-row block. */
    run_attention_g(2, 13, 4, 2, 6, 0, 0.3f, 2.0f, 0);
    run_attention_g(1, 11, 3, 3, 5, 0, 0.0f, 0.0f, 4);
    run_attention_g(2, 9, 4, 1, 4, 0, 0.5f, 1.5f, 3);
    run_attention_g(1, 9, 2, 1, 4, 1, 0.0f, 3.0f, 5); /* fused */
    run_attention_g(1, 80, 2, 1, 4, 0, 0.0f, 2.5f, 30);
    run_attention(2, 7, 4, 2, 6, 0);  /* GQA, padded strides */
    run_attention(1, 9, 3, 3, 5, 0);  /* MHA, odd head size */
    run_attention(2, 5, 3, 1, 4, 0);  /* MQA */
    run_attention(1, 70, 2, 1, 4, 0); /* T past one 64-row block */
}

static void test_attention_fused(void)
{
    run_attention(2, 6, 3, 3, 4, 1); /* GPT-2 fused qkv, ld = 3C */
    run_attention(1, 66, 2, 2, 4, 1);
}

/* The first attention kernel kept the probabilities P [B,Hq,T,T] from the
 * forward and used rowsum(P * dP) in the backward. This is that algorithm
 * in plain fp32 loops (no tiles), so the tiled recomputing backward can be
 * held to it: the same gradients within fp32 rounding. q/k/v contiguous. */
static void old_attention(const float *q, const float *k, const float *v, const float *dout,
                          float *out, float *dq, float *dk, float *dv, int B, int T, int Hq,
                          int Hkv, int D)
{
    int grp = Hq / Hkv;
    float scale = 1.0f / sqrtf((float)D);
    float *P = malloc((size_t)T * T * sizeof *P), *dP = malloc((size_t)T * sizeof *dP);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            int g = h / grp;
#define Q(t) (q + ((size_t)b * T + (t)) * Hq * D + (size_t)h * D)
#define K(t) (k + ((size_t)b * T + (t)) * Hkv * D + (size_t)g * D)
#define V(t) (v + ((size_t)b * T + (t)) * Hkv * D + (size_t)g * D)
#define O(t) ((size_t)b * T + (t)) * Hq *D + (size_t)h *D
#define KV(t) ((size_t)b * T + (t)) * Hkv *D + (size_t)g *D
            for (int i = 0; i < T; i++) {
                float mx = -INFINITY, sum = 0.0f, *p = P + (size_t)i * T;
                for (int j = 0; j <= i; j++) {
                    float a = 0.0f;
                    for (int d = 0; d < D; d++)
                        a += Q(i)[d] * K(j)[d];
                    p[j] = a * scale;
                    mx = fmaxf(mx, p[j]);
                }
                for (int j = 0; j <= i; j++) {
                    p[j] = expf(p[j] - mx);
                    sum += p[j];
                }
                for (int j = 0; j <= i; j++)
                    p[j] /= sum;
                for (int d = 0; d < D; d++) {
                    float a = 0.0f;
                    for (int j = 0; j <= i; j++)
                        a += p[j] * V(j)[d];
                    out[O(i) + d] = a;
                }
            }
            for (int i = 0; i < T; i++) {
                const float *p = P + (size_t)i * T, *go = dout + O(i);
                float rs = 0.0f;
                for (int j = 0; j <= i; j++) {
                    float a = 0.0f;
                    for (int d = 0; d < D; d++)
                        a += go[d] * V(j)[d];
                    dP[j] = a;
                    rs += p[j] * a;
                }
                for (int j = 0; j <= i; j++) {
                    float ds = p[j] * (dP[j] - rs) * scale;
                    for (int d = 0; d < D; d++) {
                        dq[O(i) + d] += ds * K(j)[d];
                        dk[KV(j) + d] += ds * Q(i)[d];
                        dv[KV(j) + d] += p[j] * go[d];
                    }
                }
            }
#undef Q
#undef K
#undef V
#undef O
#undef KV
        }
    free(P);
    free(dP);
}

/* Tiled recomputing attention against the old materialising kernel, over
 * shapes that cross several 64 x 64 tiles (partial last tiles, GQA). */
static void run_attention_old(int B, int T, int Hq, int Hkv, int D)
{
    kn_ctx *c = open_cpu(2);
    size_t nq = (size_t)B * T * Hq * D, nkv = (size_t)B * T * Hkv * D, nl = (size_t)B * Hq * T;
    double *tmp;
    float *q = frand(c, &tmp, nq, 2.0);
    free(tmp);
    float *k = frand(c, &tmp, nkv, 2.0);
    free(tmp);
    float *v = frand(c, &tmp, nkv, 1.0);
    free(tmp);
    float *g = frand(c, &tmp, nq, 1.0);
    free(tmp);
    float *out = falloc(c, nq), *lse = falloc(c, nl), *dq = falloc(c, nq), *dk = falloc(c, nkv),
          *dv = falloc(c, nkv);
    float *oo = calloc(nq, sizeof *oo), *odq = calloc(nq, sizeof *odq),
          *odk = calloc(nkv, sizeof *odk), *odv = calloc(nkv, sizeof *odv);
    kn_attention_fwd(c, KN_F32, out, lse, q, k, v, B, T, Hq, Hkv, D, Hq * D, Hkv * D, 0.0f, 0.0f,
                     0);
    kn_attention_bwd(c, KN_F32, KN_F32, dq, dk, dv, g, KN_F32, out, lse, q, k, v, B, T, Hq, Hkv, D,
                     Hq * D, Hkv * D, 0.0f, 0.0f, 0);
    old_attention(q, k, v, g, oo, odq, odk, odv, B, T, Hq, Hkv, D);
    double *w = malloc((nq > nkv ? nq : nkv) * sizeof *w);
#define AGAINST_OLD(what, got, old, n)                                                             \
    do {                                                                                           \
        for (size_t i = 0; i < (n); i++)                                                           \
            w[i] = (old)[i];                                                                       \
        check_close(what, got, w, n, 2e-4, 2e-5);                                                  \
    } while (0)
    AGAINST_OLD("attention out vs old kernel", out, oo, nq);
    AGAINST_OLD("attention dq vs old kernel", dq, odq, nq);
    AGAINST_OLD("attention dk vs old kernel", dk, odk, nkv);
    AGAINST_OLD("attention dv vs old kernel", dv, odv, nkv);
#undef AGAINST_OLD
    free(w);
    free(oo);
    free(odq);
    free(odk);
    free(odv);
    kn_close(c);
}

static void test_attention_old(void)
{
    run_attention_old(1, 150, 4, 2, 8); /* three row blocks, partial last tile */
    run_attention_old(2, 64, 2, 2, 16); /* exactly one tile */
    run_attention_old(1, 129, 3, 1, 5); /* MQA, one row into a third block */
}

/* ---- storage conversions ----------------------------------------------- */

/* Nearest value with `bits` significant bits (ties to even), exponent range
 * [emin, emax] for normals, subnormals below, inf above the largest finite
 * value: IEEE rounding written out in double, independently of the kernel. */
static double ref_round(double x, int bits, int emin, int emax)
{
    if (isnan(x) || isinf(x) || x == 0.0) return x;
    double sign = x < 0 ? -1.0 : 1.0;
    x = fabs(x);
    int e;
    frexp(x, &e); /* x in [2^(e-1), 2^e) */
    int ex = e - 1 < emin ? emin : e - 1;
    double ulp = ldexp(1.0, ex - (bits - 1));
    double q = x / ulp, f = floor(q), r = q - f;
    if (r > 0.5 || (r == 0.5 && fmod(f, 2.0) != 0.0)) f += 1.0;
    double y = f * ulp;
    double maxv = ldexp(2.0 - ldexp(1.0, -(bits - 1)), emax);
    if (y > maxv) return sign * INFINITY;
    return copysign(y, sign);
}

static void test_convert(void)
{
    kn_ctx *c = open_cpu(2);
    /* Random values over many binades, exact ties, overflow, tiny values,
     * and the specials. 40000 > the parallel threshold: both threads work. */
    size_t n = 40000;
    float *x = falloc(c, n);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(urand() * ldexp(1.0, (int)(urand() * 40)));
    x[0] = 1.0f + 0x1p-8f;     /* bf16 tie, round down to even */
    x[1] = 1.0f + 3 * 0x1p-8f; /* bf16 tie, round up to even */
    x[2] = 65520.0f;           /* fp16: rounds to inf */
    x[3] = 65519.0f;           /* fp16: 65504 */
    x[4] = 3e-6f;              /* fp16 subnormal */
    x[5] = INFINITY;
    x[6] = -INFINITY;
    x[7] = NAN;
    x[8] = 3.3895313892515355e38f; /* bf16: overflows to inf */
    x[9] = -0.0f;
    x[10] = 1.0f + 0x1p-11f; /* fp16 tie, to even */
    const struct {
        kn_dtype dt;
        int bits, emin, emax;
        const char *name;
    } fmts[] = {{KN_BF16, 8, -126, 127, "bf16"}, {KN_F16, 11, -14, 15, "fp16"}};
    for (int f = 0; f < 2; f++) {
        uint16_t *h = kn_alloc(c, n * 2);
        float *back = falloc(c, n), *r = fcopy(c, x, n);
        for (size_t i = 0; i < n; i++)
            back[i] = 7.0f; /* poisoned */
        kn_convert(c, h, fmts[f].dt, x, KN_F32, n);
        kn_convert(c, back, KN_F32, h, fmts[f].dt, n);
        kn_round(c, r, n, fmts[f].dt);
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            double want = ref_round((double)x[i], fmts[f].bits, fmts[f].emin, fmts[f].emax);
            int ok = isnan(want) ? isnan(back[i])
                                 : (double)back[i] == want && !!signbit(back[i]) == !!signbit(want);
            if (!ok && bad++ < 5)
                fprintf(stderr, "FAIL convert %s [%zu]: %.9g -> %.9g, want %.9g\n", fmts[f].name, i,
                        (double)x[i], (double)back[i], want);
        }
        ty_failures += bad;
        /* kn_round gives the same values without the 16-bit buffer. */
        CHECK(memcmp(r + 8, back + 8, (n - 8) * sizeof *r) == 0 && !isnan(r[0]),
              "%s: kn_round != convert", fmts[f].name);
        CHECK(isnan(back[7]), "%s: NaN lost", fmts[f].name);
        /* 16 -> 16 bits through fp32 and same-type copies. */
        uint16_t *h2 = kn_alloc(c, n * 2);
        kn_convert(c, h2, fmts[f].dt, h, fmts[f].dt, n);
        CHECK(memcmp(h2, h, n * 2) == 0, "%s: same-type convert is not a copy", fmts[f].name);
    }
    /* bf16 -> fp16 equals rounding the bf16 value to fp16. */
    uint16_t *hb = kn_alloc(c, n * 2), *hf = kn_alloc(c, n * 2);
    float *v = falloc(c, n), *w = falloc(c, n);
    kn_convert(c, hb, KN_BF16, x, KN_F32, n);
    kn_convert(c, hf, KN_F16, hb, KN_BF16, n);
    kn_convert(c, v, KN_F32, hb, KN_BF16, n);
    kn_round(c, v, n, KN_F16);
    kn_convert(c, w, KN_F32, hf, KN_F16, n);
    CHECK(memcmp(v + 8, w + 8, (n - 8) * sizeof *v) == 0, "bf16 -> fp16 differs from rounding");
    CHECK(kn_dtype_size(KN_BF16) == 2 && kn_dtype_size(KN_F32) == 4 &&
              !strcmp(kn_dtype_name(KN_F16), "fp16"),
          "dtype table");
    kn_close(c);
}

/* kn_matmul16: 16-bit weights (oneDNN bf16 or converted + sgemm), inputs
 * holding 16-bit values. Against double products of the same values:
 * products are exact, only the fp32 summation order differs. Shapes cross
 * oneDNN's and sgemm's blocking; the backward accumulates, NULLs skip. */
static void run_matmul16(kn_dtype dt, int N, int K, int M, int with_bias)
{
    kn_ctx *c = open_cpu(2);
    double *tmp;
    float *x = frand(c, &tmp, (size_t)N * K, 1.0);
    free(tmp);
    float *w = frand(c, &tmp, (size_t)M * K, 0.5);
    free(tmp);
    float *g = frand(c, &tmp, (size_t)N * M, 1.0);
    free(tmp);
    float *b = with_bias ? frand(c, &tmp, M, 1.0) : NULL;
    if (with_bias) free(tmp);
    kn_round(c, x, (size_t)N * K, dt);
    kn_round(c, g, (size_t)N * M, dt);
    uint16_t *w16 = kn_alloc(c, (size_t)M * K * 2);
    kn_convert(c, w16, dt, w, KN_F32, (size_t)M * K);
    kn_convert(c, w, KN_F32, w16, dt, (size_t)M * K); /* w: the 16-bit values, in fp32 */
    double *ro = dzeros((size_t)N * M), *rdx = dzeros((size_t)N * K), *rdw = dzeros((size_t)M * K),
           *rdb = dzeros(M);
    for (int n = 0; n < N; n++)
        for (int m = 0; m < M; m++) {
            double a = b ? b[m] : 0.0;
            for (int k = 0; k < K; k++)
                a += (double)x[(size_t)n * K + k] * w[(size_t)m * K + k];
            ro[(size_t)n * M + m] = a;
            double gv = g[(size_t)n * M + m];
            rdb[m] += 2 * gv;
            for (int k = 0; k < K; k++) {
                rdx[(size_t)n * K + k] += 2 * gv * w[(size_t)m * K + k];
                rdw[(size_t)m * K + k] += 2 * gv * x[(size_t)n * K + k];
            }
        }
    float *out = falloc(c, (size_t)N * M), *dx = falloc(c, (size_t)N * K),
          *dw = falloc(c, (size_t)M * K), *db = falloc(c, M);
    for (size_t i = 0; i < (size_t)N * M; i++)
        out[i] = NAN; /* poisoned: every element written */
    kn_matmul16_fwd(c, dt, KN_F32, KN_F32, out, x, w16, b, KN_F32, N, K, M);
    check_close("matmul16 out", out, ro, (size_t)N * M, 1e-5, 1e-6);
    /* Two backwards: the gradients accumulate (the reference is doubled);
     * a third with only dbias must not touch dx / dw. */
    kn_matmul16_bwd(c, dt, KN_F32, KN_F32, dx, dw, db, g, x, w16, N, K, M);
    kn_matmul16_bwd(c, dt, KN_F32, KN_F32, dx, dw, db, g, x, w16, N, K, M);
    check_close("matmul16 dx", dx, rdx, (size_t)N * K, 1e-5, 1e-6);
    check_close("matmul16 dw", dw, rdw, (size_t)M * K, 1e-5, 1e-6);
    check_close("matmul16 db", db, rdb, M, 1e-5, 1e-6);
    float *dx2 = fcopy(c, dx, (size_t)N * K);
    kn_matmul16_bwd(c, dt, KN_F32, KN_F32, NULL, NULL, db, g, x, w16, N, K, M);
    check_same("matmul16 dx untouched", dx, dx2, (size_t)N * K);
    /* The same call gives the same bits (the choice of path is fixed). */
    float *out2 = falloc(c, (size_t)N * M);
    kn_matmul16_fwd(c, dt, KN_F32, KN_F32, out2, x, w16, b, KN_F32, N, K, M);
    check_same("matmul16 repeat", out2, out, (size_t)N * M);
    /* dout in dt, as the engine's 16-bit backward passes it: the same
     * values, so the products match the references, and dbias (a column
     * sum in row order on every path) has the bits fp32 dout gives. */
    uint16_t *g16 = kn_alloc(c, (size_t)N * M * 2);
    kn_convert(c, g16, dt, g, KN_F32, (size_t)N * M);
    float *dx16 = falloc(c, (size_t)N * K), *dw16 = falloc(c, (size_t)M * K), *db16 = falloc(c, M),
          *db32 = falloc(c, M);
    for (int r = 0; r < 2; r++) {
        kn_matmul16_bwd(c, dt, dt, KN_F32, dx16, dw16, db16, g16, x, w16, N, K, M);
        kn_matmul16_bwd(c, dt, KN_F32, KN_F32, NULL, NULL, db32, g, x, w16, N, K, M);
    }
    check_close("matmul16 16-bit dout dx", dx16, rdx, (size_t)N * K, 1e-5, 1e-6);
    check_close("matmul16 16-bit dout dw", dw16, rdw, (size_t)M * K, 1e-5, 1e-6);
    check_same("matmul16 16-bit dout db", db16, db32, M);
    ty_err err = {0};
    CHECK(kn_check(c, &err) == 0, "matmul16: %s", err.msg);
    free(ro), free(rdx), free(rdw), free(rdb);
    kn_close(c);
}

static void test_matmul16(void)
{
    run_matmul16(KN_BF16, 37, 29, 53, 1);
    run_matmul16(KN_BF16, 130, 70, 19, 0);
    run_matmul16(KN_F16, 37, 29, 53, 1);
    run_matmul16(KN_F16, 5, 64, 33, 0);
}

/* ---- activations ------------------------------------------------------- */

typedef struct {
    size_t n;
    int kind; /* 0 gelu, 1 swiglu */
    double *x, *up, *r, *out;
} act_st;

static double act_loss(void *st)
{
    act_st *s = st;
    for (size_t i = 0; i < s->n; i++) {
        double x = s->x[i];
        if (s->kind == 0)
            s->out[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
        else
            s->out[i] = x / (1.0 + exp(-x)) * s->up[i];
    }
    return dot_r(s->r, s->out, s->n);
}

static void test_gelu(void)
{
    kn_ctx *c = open_cpu(2);
    act_st s = {.n = 1001, .kind = 0};
    float *x = frand(c, &s.x, s.n, 5.0), *r = frand(c, &s.r, s.n, 1.0);
    s.out = dzeros(s.n);
    float *out = falloc(c, s.n), *dx = falloc(c, s.n);
    kn_gelu_fwd(c, KN_F32, out, x, s.n);
    act_loss(&s);
    check_close("gelu fwd", out, s.out, s.n, 1e-5, 1e-6);
    kn_gelu_bwd(c, KN_F32, dx, r, x, s.n);
    check_grad("gelu dx", dx, act_loss, &s, s.x, s.n);
    float *dx1 = fcopy(c, dx, s.n);
    kn_gelu_bwd(c, KN_F32, dx, r, x, s.n);
    check_doubled("gelu dx", dx, dx1, s.n);
    free(s.x);
    free(s.r);
    free(s.out);
    kn_close(c);
}

static void test_swiglu(void)
{
    kn_ctx *c = open_cpu(2);
    act_st s = {.n = 1001, .kind = 1};
    float *g = frand(c, &s.x, s.n, 6.0), *up = frand(c, &s.up, s.n, 2.0);
    float *r = frand(c, &s.r, s.n, 1.0);
    s.out = dzeros(s.n);
    float *out = falloc(c, s.n), *dg = falloc(c, s.n), *du = falloc(c, s.n);
    kn_swiglu_fwd(c, KN_F32, out, g, up, s.n);
    act_loss(&s);
    check_close("swiglu fwd", out, s.out, s.n, 1e-5, 1e-6);
    kn_swiglu_bwd(c, KN_F32, KN_F32, dg, du, r, KN_F32, g, up, s.n);
    check_grad("swiglu dgate", dg, act_loss, &s, s.x, s.n);
    check_grad("swiglu dup", du, act_loss, &s, s.up, s.n);
    float *g1 = fcopy(c, dg, s.n), *u1 = fcopy(c, du, s.n);
    kn_swiglu_bwd(c, KN_F32, KN_F32, dg, du, r, KN_F32, g, up, s.n); /* written, not added */
    check_same("swiglu dgate again", dg, g1, s.n);
    check_same("swiglu dup again", du, u1, s.n);
    float *g2 = falloc(c, s.n), *u2 = falloc(c, s.n);
    kn_swiglu_bwd(c, KN_F32, KN_F32, g2, NULL, r, KN_F32, g, up, s.n);
    kn_swiglu_bwd(c, KN_F32, KN_F32, NULL, u2, r, KN_F32, g, up, s.n);
    check_same("swiglu dgate alone", g2, g1, s.n);
    check_same("swiglu dup alone", u2, u1, s.n);
    free(s.x);
    free(s.up);
    free(s.r);
    free(s.out);
    kn_close(c);
}

/* ---- dropout ----------------------------------------------------------- */

static void test_dropout(void)
{
    kn_ctx *c = open_cpu(2), *c1 = open_cpu(1);
    size_t n = 200003;
    double *dx;
    float *x = frand(c, &dx, n, 1.0);
    float *out = falloc(c, n), *out1 = falloc(c, n), *g = falloc(c, n);
    uint8_t *mask = kn_alloc(c, n), *mask1 = kn_alloc(c, n);
    float p = 0.3f;

    kn_dropout_fwd(c, KN_F32, out, mask, x, n, p, 42, 0);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(mask[i] <= 1, "mask value %d", mask[i]);
        kept += mask[i];
        float want = mask[i] ? x[i] * (1.0f / (1.0f - p)) : 0.0f;
        if (out[i] != want) {
            CHECK(0, "dropout out[%zu] = %g, want %g", i, out[i], want);
            break;
        }
    }
    double frac = (double)kept / n;
    /* 0.7 expected; 200k draws give a standard deviation of 0.001. */
    CHECK(fabs(frac - 0.7) < 0.01, "kept fraction %.4f", frac);

    /* Same mask on 1 thread, and a pure function of (seed, offset + i). */
    kn_dropout_fwd(c1, KN_F32, out1, mask1, x, n, p, 42, 0);
    CHECK(memcmp(mask, mask1, n) == 0, "mask differs 1 vs 2 threads");
    check_same("dropout out 1 vs 2 threads", out, out1, n);
    kn_dropout_fwd(c, KN_F32, out1, mask1, x, n - 1000, p, 42, 1000);
    CHECK(memcmp(mask + 1000, mask1, n - 1000) == 0, "offset does not shift the stream");
    kn_dropout_fwd(c, KN_F32, out1, mask1, x, n, p, 43, 0);
    CHECK(memcmp(mask, mask1, n) != 0, "seed does not change the mask");

    /* Backward: dx += dout * mask / (1-p), accumulating. */
    kn_dropout_bwd(c, g, x, mask, n, p);
    for (size_t i = 0; i < n; i++) {
        float want = mask[i] ? x[i] * (1.0f / (1.0f - p)) : 0.0f;
        if (g[i] != want) {
            CHECK(0, "dropout dx[%zu] = %g, want %g", i, g[i], want);
            break;
        }
    }
    float *g1 = fcopy(c, g, n);
    kn_dropout_bwd(c, g, x, mask, n, p);
    check_doubled("dropout dx", g, g1, n);

    /* p = 0 copies, keeps everything, and the backward passes through. */
    kn_dropout_fwd(c, KN_F32, out, mask, x, n, 0.0f, 42, 0);
    check_same("dropout p=0", out, x, n);
    kn_zero(c, g, n);
    kn_dropout_bwd(c, g, x, mask, n, 0.0f);
    check_same("dropout p=0 bwd", g, x, n);
    free(dx);
    kn_close(c);
    kn_close(c1);
}

/* ---- cross-entropy ----------------------------------------------------- */

typedef struct {
    int N, V;
    const int32_t *t;
    double scale;
    double *l, *loss;
    double cap; /* final-logit soft-cap, 0 = off */
} ce_st;

static double ce_loss(void *st)
{
    ce_st *s = st;
    double total = 0;
    for (int n = 0; n < s->N; n++) {
        if (s->t[n] == -100) {
            s->loss[n] = 0;
            continue;
        }
        const double *raw = s->l + (size_t)n * s->V;
        double *l = malloc((size_t)s->V * sizeof *l);
        for (int j = 0; j < s->V; j++)
            l[j] = s->cap > 0 ? s->cap * tanh(raw[j] / s->cap) : raw[j];
        double mx = -INFINITY, z = 0;
        for (int j = 0; j < s->V; j++)
            mx = fmax(mx, l[j]);
        for (int j = 0; j < s->V; j++)
            z += exp(l[j] - mx);
        s->loss[n] = log(z) + mx - l[s->t[n]];
        free(l);
        total += s->loss[n];
    }
    return total * s->scale;
}

static void test_crossentropy(void)
{
    kn_ctx *c = open_cpu(2);
    int N = 9, V = 37;
    int32_t t[9] = {3, -100, 36, 0, 17, -100, 5, 5, 20};
    ce_st s = {.N = N, .V = V, .t = t, .scale = 1.0 / 7.0};
    size_t nl = (size_t)N * V;
    float *l = frand(c, &s.l, nl, 4.0);
    s.loss = dzeros(N);
    float *loss = falloc(c, N);
    kn_crossentropy_fwd(c, KN_F32, loss, l, t, N, V, V, 0.0f);
    ce_loss(&s);
    check_close("crossentropy fwd", loss, s.loss, N, 1e-5, 1e-6);
    CHECK(loss[1] == 0.0f && loss[5] == 0.0f, "ignored targets have a loss");

    float *d = falloc(c, nl);
    for (size_t i = 0; i < nl; i++)
        d[i] = 123.0f; /* overwritten, not accumulated */
    kn_crossentropy_fwd_bwd(c, KN_F32, NULL, d, l, t, N, V, V, (float)s.scale, 0.0f);
    check_grad("crossentropy dlogits", d, ce_loss, &s, s.l, nl);
    for (int j = 0; j < V; j++)
        CHECK(d[1 * V + j] == 0.0f && d[5 * V + j] == 0.0f, "ignored row has a gradient");

    /* In place over the logits gives the same result. */
    float *alias = fcopy(c, l, nl);
    kn_crossentropy_fwd_bwd(c, KN_F32, NULL, alias, alias, t, N, V, V, (float)s.scale, 0.0f);
    check_same("crossentropy in place", alias, d, nl);

    /* The fused call's losses are the forward's bits, and asking for them
     * does not change the gradient. */
    float *loss2 = falloc(c, N), *d2 = falloc(c, nl);
    kn_crossentropy_fwd(c, KN_F32, loss, l, t, N, V, V, 0.0f);
    kn_crossentropy_fwd_bwd(c, KN_F32, loss2, d2, l, t, N, V, V, (float)s.scale, 0.0f);
    check_same("crossentropy fused loss", loss2, loss, N);
    check_same("crossentropy fused dlogits", d2, d, nl);

    /* Huge logits stay finite (max subtracted before exp). */
    for (size_t i = 0; i < nl; i++) {
        l[i] = l[i] * 1000.0f + 30000.0f;
        s.l[i] = l[i];
    }
    kn_crossentropy_fwd(c, KN_F32, loss, l, t, N, V, V, 0.0f);
    ce_loss(&s);
    CHECK(!kn_nonfinite(c, loss, N), "non-finite loss on large logits");
    check_close("crossentropy fwd large", loss, s.loss, N, 1e-4, 1e-5);
    kn_crossentropy_fwd_bwd(c, KN_F32, NULL, d, l, t, N, V, V, 1.0f, 0.0f);
    CHECK(!kn_nonfinite(c, d, nl), "non-finite gradient on large logits");

    /* A target outside [0, V) is poisoned, so the engine's NaN check stops. */
    int32_t badt[9] = {3, -100, 37, 0, 17, -100, 5, 5, -1};
    kn_crossentropy_fwd(c, KN_F32, loss, l, badt, N, V, V, 0.0f);
    CHECK(isnan(loss[2]) && isnan(loss[8]) && !isnan(loss[0]), "bad targets not flagged");

    /* Final-logit soft-cap (Gemma 2): logits up to ~8 against a cap of 3,
     * so tanh saturates; loss, gradient through the cap, aliasing. */
    for (size_t i = 0; i < nl; i++) {
        l[i] = (float)(s.l[i] - 30000.0) / 1000.0f * 2.0f;
        s.l[i] = l[i];
    }
    s.cap = 3.0;
    kn_crossentropy_fwd(c, KN_F32, loss, l, t, N, V, V, 3.0f);
    ce_loss(&s);
    check_close("crossentropy fwd softcap", loss, s.loss, N, 1e-5, 1e-6);
    kn_crossentropy_fwd_bwd(c, KN_F32, loss2, d, l, t, N, V, V, (float)s.scale, 3.0f);
    check_same("crossentropy softcap fused loss", loss2, loss, N);
    check_grad("crossentropy softcap dlogits", d, ce_loss, &s, s.l, nl);
    float *alias2 = fcopy(c, l, nl);
    kn_crossentropy_fwd_bwd(c, KN_F32, NULL, alias2, alias2, t, N, V, V, (float)s.scale, 3.0f);
    check_same("crossentropy softcap in place", alias2, d, nl);
    /* kn_softcap: the capped logits themselves. */
    float *capd = fcopy(c, l, nl);
    kn_softcap(c, capd, nl, 3.0f);
    for (size_t i = 0; i < nl; i++)
        CHECK(fabs(capd[i] - 3.0 * tanh(s.l[i] / 3.0)) <= 1e-6 * 3.0, "softcap value");
    float *same = fcopy(c, l, nl);
    kn_softcap(c, same, nl, 0.0f);
    check_same("softcap 0 is off", same, l, nl);
    free(s.l);
    free(s.loss);
    kn_close(c);
}

/* ---- adamw -------------------------------------------------------------- */

static void test_adamw(void)
{
    kn_ctx *c = open_cpu(2);
    size_t n = 20011;
    double *dp, *dg;
    float *p = frand(c, &dp, n, 1.0), *m = falloc(c, n), *v = falloc(c, n);
    float *g = frand(c, &dg, n, 0.1);
    double *hm = dzeros(n), *hv = dzeros(n);
    double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
    for (int64_t t = 1; t <= 3; t++) {
        double wdt = t == 2 ? 0.0 : wd; /* one step without decay */
        kn_adamw(c, KN_F32, p, NULL, g, m, v, n, (float)lr, (float)b1, (float)b2, (float)eps,
                 (float)wdt, t);
        for (size_t i = 0; i < n; i++) {
            double gi = g[i];
            dp[i] -= lr * wdt * dp[i];
            hm[i] = b1 * hm[i] + (1 - b1) * gi;
            hv[i] = b2 * hv[i] + (1 - b2) * gi * gi;
            double mh = hm[i] / (1 - pow(b1, (double)t)), vh = hv[i] / (1 - pow(b2, (double)t));
            dp[i] -= lr * mh / (sqrt(vh) + eps);
        }
        check_close("adamw p", p, dp, n, 1e-6, 1e-7);
        check_close("adamw m", m, hm, n, 1e-5, 1e-6);
        check_close("adamw v", v, hv, n, 1e-5, 1e-6);
        /* Perturb the gradient between steps so the moments diverge. */
        for (size_t i = 0; i < n; i++)
            g[i] = (float)(g[i] * 0.5 + urand() * 0.05);
    }
    free(dp);
    free(dg);
    free(hm);
    free(hv);
    kn_close(c);
}

/* ---- determinism --------------------------------------------------------- */

/* One small training-step-shaped pipeline (matmul, attention on a fused
 * qkv, layernorm, gelu, cross-entropy, AdamW, grad norm) on a fresh context;
 * returns the grad norm and leaves the updated weights in w_out. */
static double pipeline(int threads, float *w_out)
{
    kn_ctx *c = open_cpu(threads);
    uint64_t saved = g_rng;
    g_rng = 0x9e3779b97f4a7c15ULL; /* same inputs on every call */
    int B = 2, T = 33, C = 24, H = 3, V = 41, N = B * T;
    double *tmp;
    float *x = frand(c, &tmp, (size_t)N * C, 1.0);
    free(tmp);
    size_t nw = (size_t)3 * C * C + (size_t)V * C;
    float *w = frand(c, &tmp, nw, 0.2);
    free(tmp);
    float *wqkv = w, *whead = w + (size_t)3 * C * C;
    float *gw = falloc(c, nw), *m = falloc(c, nw), *v = falloc(c, nw);
    float *qkv = falloc(c, (size_t)N * 3 * C), *lse = falloc(c, (size_t)B * H * T);
    float *ao = falloc(c, (size_t)N * C), *ln = falloc(c, (size_t)N * C);
    float *mean = falloc(c, N), *rstd = falloc(c, N), *ones = falloc(c, C);
    float *act = falloc(c, (size_t)N * C), *logits = falloc(c, (size_t)N * V);
    float *losses = falloc(c, N), *dact = falloc(c, (size_t)N * C), *dln = falloc(c, (size_t)N * C);
    float *dao = falloc(c, (size_t)N * C), *dqkv = falloc(c, (size_t)N * 3 * C);
    float *dx = falloc(c, (size_t)N * C);
    int32_t *tg = malloc(N * sizeof *tg);
    for (int n = 0; n < N; n++)
        tg[n] = n % 7 == 3 ? -100 : (n * 13) % V;
    for (int i = 0; i < C; i++)
        ones[i] = 1.0f;
    g_rng = saved;

    kn_matmul_fwd(c, qkv, x, wqkv, NULL, N, C, 3 * C);
    kn_attention_fwd(c, KN_F32, ao, lse, qkv, qkv + C, qkv + 2 * C, B, T, H, H, C / H, 3 * C, 3 * C,
                     0.0f, 0.0f, 0);
    kn_layernorm_fwd(c, KN_F32, ln, mean, rstd, ao, ones, NULL, N, C, 1e-5f);
    kn_gelu_fwd(c, KN_F32, act, ln, (size_t)N * C);
    kn_matmul_fwd(c, logits, act, whead, NULL, N, C, V);
    kn_crossentropy_fwd_bwd(c, KN_F32, losses, logits, logits, tg, N, V, V, 1.0f / N, 0.0f);
    kn_matmul_bwd(c, dact, gw + (size_t)3 * C * C, NULL, logits, act, whead, N, C, V);
    kn_gelu_bwd(c, KN_F32, dln, dact, ln, (size_t)N * C);
    kn_layernorm_bwd(c, KN_F32, dao, NULL, NULL, NULL, dln, KN_F32, ao, ones, mean, rstd, N, C);
    kn_attention_bwd(c, KN_F32, KN_F32, dqkv, dqkv + C, dqkv + 2 * C, dao, KN_F32, ao, lse, qkv,
                     qkv + C, qkv + 2 * C, B, T, H, H, C / H, 3 * C, 3 * C, 0.0f, 0.0f, 0);
    kn_matmul_bwd(c, dx, gw, NULL, dqkv, x, wqkv, N, C, 3 * C);
    double norm = sqrt(kn_sumsq(c, gw, nw)) + kn_sum(c, losses, N);
    kn_adamw(c, KN_F32, w, NULL, gw, m, v, nw, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1);
    memcpy(w_out, w, nw * sizeof *w);
    free(tg);
    kn_close(c);
    return norm;
}

static void test_determinism(void)
{
    size_t nw = (size_t)3 * 24 * 24 + (size_t)41 * 24;
    float *a = malloc(nw * sizeof *a), *b = malloc(nw * sizeof *b);
    for (int threads = 1; threads <= 2; threads++) {
        double na = pipeline(threads, a), nb = pipeline(threads, b);
        CHECK(memcmp(&na, &nb, sizeof na) == 0, "%d threads: grad norm differs across runs",
              threads);
        check_same("weights after a step, two runs", a, b, nw);
        CHECK(isfinite(na) && na > 0, "pipeline norm %g", na);
    }
    free(a);
    free(b);
}

/* ---- main --------------------------------------------------------------- */

static const struct {
    const char *name;
    void (*fn)(void);
} tests[] = {
    {"context", test_context},
    {"elementwise", test_elementwise},
    {"sum", test_sum},
    {"embedding", test_embedding},
    {"layernorm", test_layernorm},
    {"rmsnorm", test_rmsnorm},
    {"matmul", test_matmul},
    {"rope", test_rope},
    {"attention", test_attention},
    {"attention_fused", test_attention_fused},
    {"attention_old", test_attention_old},
    {"convert", test_convert},
    {"matmul16", test_matmul16},
    {"gelu", test_gelu},
    {"swiglu", test_swiglu},
    {"dropout", test_dropout},
    {"crossentropy", test_crossentropy},
    {"adamw", test_adamw},
    {"determinism", test_determinism},
};

int main(int argc, char **argv)
{
    int ran = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (argc < 2 || strcmp(argv[1], "all") == 0 || strcmp(argv[1], tests[i].name) == 0) {
            int before = ty_failures;
            tests[i].fn();
            printf("%s %s\n", ty_failures == before ? "ok  " : "FAIL", tests[i].name);
            ran++;
        }
    if (!ran) {
        fprintf(stderr, "unknown test '%s'\n", argv[1]);
        return 2;
    }
    return ty_summary(argc > 1 ? argv[1] : "kernels");
}
