/* cpu_attention16.c — bf16 attention on AMX tiles (Intel AMX-BF16).
 *
 * The same FlashAttention-2 scheme as cpu_attention.c (row blocks, key
 * tiles, fp32 softmax statistics and lse, the causal / window / soft-cap
 * masks, recomputation in the backward; the elementwise steps are that
 * file's functions), with every product of a tile formed by TDPBF16PS:
 * bf16 x bf16 pairs summed into fp32 tiles, 512 multiply-adds a cycle
 * against fp32 AVX-512's 32 (what it gains on the op and on a bf16
 * GPT-2 step: docs/benchmarks.md).
 *
 * Operands: q, k, v are bf16 already (exact); each head's rows are copied
 * once into zero-padded bf16 layouts (row-major for the left operand, the
 * "VNNI" pair layout for the right one). The fp32 operands — the
 * probabilities P and the score gradients dS — are split into a sum of
 * bf16 parts (hi + mid + lo, each the rounding of what the parts before
 * left), and each part is multiplied in turn into the same fp32 tile:
 * three parts carry 24 bits, so the products equal fp32 products to
 * fp32's rounding and the gradients stay within fp32's tolerance of the
 * fp32 kernel. The forward's P V uses two parts (16 bits, far below the
 * bf16 rounding of the output). The backward needs dO exact in bf16 (the
 * engine rounds every activation gradient); a dO holding other values
 * takes the fp32 kernel.
 *
 * Used when the CPU has AMX-BF16, the kernel grants the tile state
 * (arch_prctl), the op is bf16, and TY_CPU_ATTENTION is not "fp32". fp16
 * keeps the fp32 kernel: AMX-FP16 is not on these CPUs, and AVX512-FP16
 * accumulates in fp16. Results are deterministic and independent of the
 * thread count: each output element is summed in a fixed order by one
 * thread, as in the fp32 kernel. */
#include "cpu.h"
#include "cpu_math.h"

#include <pthread.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 11 || defined(__clang__))
#define ATT16_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* Row block and key tile, as in cpu_attention.c. */
#define BLK 64
/* Parts of the split fp32 operands: forward P, backward P and dS. */
#define FWD_PARTS 2
#define BWD_PARTS 3
/* Extra columns in the long row strides (the k / v pair layouts, the
 * forward's score rows): a stride of exactly 4 KiB would put the 16 rows
 * of every tile load in one L1 set. */
#define SKEW 16

static int up32(int n)
{
    return (n + 31) & ~31;
}

#ifdef ATT16_AMX

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_amx;

/* CPUID leaf 7: AMX-BF16 (edx 22), AMX-TILE (edx 24); then the kernel's
 * permission for the tile data state (ARCH_REQ_XCOMP_PERM, feature 18). */
static void amx_setup(void)
{
    const char *e = getenv("TY_CPU_ATTENTION");
    if (e && strcmp(e, "fp32") == 0) return;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    if (!(d & (1u << 22)) || !(d & (1u << 24))) return;
    g_amx = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

int cpu_att16_on(void)
{
    pthread_once(&g_once, amx_setup);
    return g_amx;
}

/* Palette 1, tiles 0-7 all 16 rows x 64 bytes: C tiles 0-3 (16 x 16
 * fp32), A tiles 4-5 (16 x 32 bf16), B tiles 6-7 (16 pair rows x 16). */
__attribute__((target("amx-tile"))) static void amx_config(void)
{
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++)
        cfg.colsb[i] = 64, cfg.rows[i] = 16;
    /* ldtilecfg with the whole struct as its operand: GCC 12's
     * _tile_loadconfig names only 8 bytes of it, and -O3 drops the stores
     * to the rest. */
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

__attribute__((target("amx-tile"))) static void amx_release(void)
{
    _tile_release();
}

/* C[M,N] (fp32, row stride ldc) = (acc ? C : 0) + sum over the parts p of A_p B, where
 * A_p = A + p * pstride is [M,K] bf16 row-major (stride lda) and B is
 * [K,N] in pair layout: pair row kk holds (B[2kk][n], B[2kk+1][n]) for
 * each n, ldb bf16 apart. M, N, K multiples of 32; 2 x 2 C tiles per
 * step, the parts of one k-step summed in order (hi, then mid, lo). */
__attribute__((target("amx-tile,amx-bf16"))) static void
amx_gemm(int M, int N, int K, const uint16_t *A, int lda, int parts, size_t pstride,
         const uint16_t *B, int ldb, float *C, int ldc, int acc)
{
    for (int m = 0; m < M; m += 32)
        for (int n = 0; n < N; n += 32) {
            float *c = C + (size_t)m * ldc + n;
            if (acc) {
                _tile_loadd(0, c, ldc * 4);
                _tile_loadd(1, c + 16, ldc * 4);
                _tile_loadd(2, c + (size_t)16 * ldc, ldc * 4);
                _tile_loadd(3, c + (size_t)16 * ldc + 16, ldc * 4);
            } else {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            }
            for (int k = 0; k < K; k += 32) {
                const uint16_t *b = B + (size_t)(k / 2) * ldb + (size_t)n * 2;
                _tile_loadd(6, b, ldb * 2);
                _tile_loadd(7, b + 32, ldb * 2);
                for (int p = 0; p < parts; p++) {
                    const uint16_t *a = A + p * pstride + (size_t)m * lda + k;
                    _tile_loadd(4, a, lda * 2);
                    _tile_loadd(5, a + (size_t)16 * lda, lda * 2);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
            }
            _tile_stored(0, c, ldc * 4);
            _tile_stored(1, c + 16, ldc * 4);
            _tile_stored(2, c + (size_t)16 * ldc, ldc * 4);
            _tile_stored(3, c + (size_t)16 * ldc + 16, ldc * 4);
        }
}

#else

int cpu_att16_on(void)
{
    return 0;
}
static void amx_config(void) {}
static void amx_release(void) {}
static void amx_gemm(int M, int N, int K, const uint16_t *A, int lda, int parts, size_t pstride,
                     const uint16_t *B, int ldb, float *C, int ldc, int acc)
{
    (void)M, (void)N, (void)K, (void)A, (void)lda, (void)parts, (void)pstride, (void)B, (void)ldb,
        (void)C, (void)ldc, (void)acc;
}

#endif

/* ---- operand layouts -------------------------------------------------- */

/* Rows [0, n) of x (bf16, row stride ld, D wide) as [np, Dp] row-major,
 * zero padded. */
static void lay_rows(uint16_t *dst, const uint16_t *x, int n, int np, int D, int Dp, int ld)
{
    for (int t = 0; t < np; t++) {
        uint16_t *d = dst + (size_t)t * Dp;
        int m = t < n ? D : 0;
        if (m) memcpy(d, x + (size_t)t * ld, (size_t)D * 2);
        memset(d + m, 0, (size_t)(Dp - m) * 2);
    }
}

/* x [n, D] as the right operand with k over its rows (pair layout,
 * [np/2][Dp][2]): P V, dS K, P^T dO, dS^T Q. */
static void lay_pairs_rows(uint16_t *dst, const uint16_t *x, int n, int np, int D, int Dp, int ld)
{
    memset(dst, 0, (size_t)np * Dp * 2);
    for (int t = 0; t < n; t++) {
        uint16_t *d = dst + (size_t)(t >> 1) * Dp * 2 + (t & 1);
        const uint16_t *r = x + (size_t)t * ld;
        for (int e = 0; e < D; e++)
            d[2 * e] = r[e];
    }
}

/* x [n, D] transposed as the right operand, k over its columns (pair
 * layout [Dp/2][np + SKEW][2]): Q K^T, dO V^T. */
static void lay_pairs_cols(uint16_t *dst, const uint16_t *x, int n, int np, int D, int Dp, int ld)
{
    for (int e = 0; e < Dp; e += 2) {
        uint16_t *d = dst + (size_t)(e >> 1) * (np + SKEW) * 2;
        int two = e + 1 < D, one = e < D; /* columns e, e + 1 inside x */
        for (int t = 0; t < n; t++) {
            const uint16_t *r = x + (size_t)t * ld + e;
            d[2 * t] = one ? r[0] : 0;
            d[2 * t + 1] = two ? r[1] : 0;
        }
        memset(d + (size_t)2 * n, 0, (size_t)(np - n) * 4);
    }
}

#ifdef ATT16_AMX

/* s [rows, cols] (fp32, stride lds) as `parts` bf16 parts [rp, cp]
 * (stride ld, pstride apart), zero padded: 16 columns per step,
 * VCVTNEPS2BF16 rounding to nearest even (as cpu_bf16_rne) and the part's
 * value taken off before the next. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void
split_parts(uint16_t *dst, size_t pstride, int ld, const float *s, int lds, int rows, int rp,
            int cols, int cp, int parts)
{
    for (int r = 0; r < rp; r++)
        for (int j = 0; j < cp; j += 16) {
            int n = r < rows ? cols - j : 0;
            n = n < 0 ? 0 : n > 16 ? 16 : n;
            __m512 x = _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), s + (size_t)r * lds + j);
            for (int p = 0; p < parts; p++) {
                __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
                _mm256_storeu_si256((__m256i *)(dst + p * pstride + (size_t)r * ld + j), h);
                __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
                x = _mm512_sub_ps(x, _mm512_castsi512_ps(w));
            }
        }
}

/* dst[16, 16] = src[16, 16]^T (row strides lds, ldd). */
__attribute__((target("avx512f"))) static void tr16(const float *src, int lds, float *dst, int ldd)
{
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_loadu_ps(src + (size_t)i * lds);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
    for (int i = 0; i < 16; i++)
        _mm512_storeu_ps(dst + (size_t)i * ldd, r[i]);
}

#else

static void split_parts(uint16_t *dst, size_t pstride, int ld, const float *s, int lds, int rows,
                        int rp, int cols, int cp, int parts)
{
    for (int p = 0; p < parts; p++)
        for (int r = 0; r < rp; r++)
            memset(dst + p * pstride + (size_t)r * ld, 0, (size_t)cp * 2);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) {
            float x = s[(size_t)r * lds + j];
            for (int p = 0; p < parts; p++) {
                uint16_t h = cpu_bf16_rne(x);
                dst[p * pstride + (size_t)r * ld + j] = h;
                x -= cpu_bf16_f32(h);
            }
        }
}

static void tr16(const float *src, int lds, float *dst, int ldd)
{
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            dst[(size_t)j * ldd + i] = src[(size_t)i * lds + j];
}

#endif

/* The rows x cols corner of a BLK x BLK tile transposed into tt. */
static void transpose_tile(float *tt, const float *s, int rows, int cols)
{
    for (int i = 0; i < rows; i += 16)
        for (int j = 0; j < cols; j += 16)
            tr16(s + (size_t)i * BLK + j, BLK, tt + (size_t)j * BLK + i, BLK);
}

/* dst[rows, D] (stride ldd) += c[rows, D] (stride ldc). */
CPU_HOT static void add_rows(float *dst, int ldd, const float *c, int ldc, int rows, int D)
{
    for (int r = 0; r < rows; r++) {
        float *d = dst + (size_t)r * ldd;
        const float *x = c + (size_t)r * ldc;
#pragma omp simd
        for (int e = 0; e < D; e++)
            d[e] += x[e];
    }
}

/* Bump allocator over one per-thread block (64-byte steps). */
static void *carve(char **at, size_t bytes)
{
    void *p = *at;
    *at += (bytes + 63) & ~(size_t)63;
    return p;
}

/* ---- forward ---------------------------------------------------------- */

typedef struct fwd_ws {
    uint16_t *kt, *vv, *qa, *pb;
    float *s, *o;
    int Dp, Tkp, Tqp;
} fwd_ws;

static size_t fwd_bytes(int Dp, int Tkp, int Tqp)
{
    size_t kp = (size_t)Tkp + 2 * SKEW;
    return 2 * ((size_t)2 * Dp * kp + (size_t)Tqp * Dp + (size_t)FWD_PARTS * BLK * kp) +
           4 * ((size_t)BLK * kp + (size_t)BLK * Dp) + 6 * 64;
}

static void fwd_carve(fwd_ws *w, char *base, int Dp, int Tkp, int Tqp)
{
    w->Dp = Dp, w->Tkp = Tkp, w->Tqp = Tqp;
    w->kt = carve(&base, (size_t)Dp * (Tkp + SKEW) * 2);
    w->vv = carve(&base, (size_t)Dp * Tkp * 2);
    w->qa = carve(&base, (size_t)Tqp * Dp * 2);
    w->pb = carve(&base, (size_t)FWD_PARTS * BLK * (Tkp + 2 * SKEW) * 2);
    w->s = carve(&base, (size_t)BLK * (Tkp + SKEW) * 4);
    w->o = carve(&base, (size_t)BLK * Dp * 4);
}

/* One block of query rows [r0, r0 + rows) of one head: scores, softmax,
 * P V, the rows rounded into out (row stride ldo) and lse. */
static void fwd_block(const fwd_ws *w, const cpu_att_args *x, uint16_t *out, int ldo, float *lb,
                      int q0, int r0, int rows)
{
    int Dp = w->Dp, Tkp = w->Tkp, i0 = q0 + r0, i1 = i0 + rows, rp = up32(rows);
    int j0 = cpu_att_lo(i0, x->window) & ~31, wd = i1 - j0, wp = up32(wd);
    int ls = Tkp + SKEW, lp = Tkp + 2 * SKEW; /* strides of s, pb */
    amx_gemm(rp, wp, Dp, w->qa + (size_t)r0 * Dp, Dp, 1, 0, w->kt + (size_t)j0 * 2, ls * 2, w->s,
             ls, 0);
    for (int r = 0; r < rows; r++) {
        float *sr = w->s + (size_t)r * ls;
        int i = i0 + r, lo = cpu_att_lo(i, x->window) - j0;
        for (int j = lo; j <= i - j0; j++)
            sr[j] *= x->scale;
        lb[r0 + r] = cpu_att_softmax_row(sr, lo, i - j0, wd, x->cap);
    }
    size_t ps = (size_t)BLK * lp;
    split_parts(w->pb, ps, lp, w->s, ls, rows, rp, wd, wp, FWD_PARTS);
    amx_gemm(rp, Dp, wp, w->pb, lp, FWD_PARTS, ps, w->vv + (size_t)(j0 / 2) * Dp * 2, Dp * 2, w->o,
             Dp, 0);
    for (int r = 0; r < rows; r++)
        cpu_out(out, KN_BF16, (size_t)(r0 + r) * ldo, w->o + (size_t)r * Dp, (size_t)x->D);
}

/* One AMX attention job's operands (forward or backward). */
typedef struct att16_job {
    const cpu_att_args *x;
    void *out;
    float *lse, *dq, *dk, *dv;
    const uint16_t *q16, *k16, *v16, *o16;
    const float *dout, *clse;
    int B, Tq, Tk, Hq, Hkv, ldq, ldkv, Dp, Tkp, Tqp, group, q0, ldo;
    atomic_int failed;
} att16_job;

/* The forward of (batch, head) bh; *last: the (batch, kv head) whose k, v
 * the scratch holds (consecutive heads of a group share them). */
static void fwd_head(const att16_job *j, fwd_ws *w, int bh, int *last)
{
    int D = j->x->D, Hq = j->Hq, Tq = j->Tq, Tk = j->Tk, Dp = j->Dp;
    int b = bh / Hq, h = bh % Hq, bg = b * j->Hkv + h / j->group;
    if (bg != *last) {
        size_t ko = (size_t)b * Tk * j->ldkv + (size_t)(h / j->group) * D;
        lay_pairs_cols(w->kt, j->k16 + ko, Tk, j->Tkp, D, Dp, j->ldkv);
        lay_pairs_rows(w->vv, j->v16 + ko, Tk, j->Tkp, D, Dp, j->ldkv);
        *last = bg;
    }
    lay_rows(w->qa, j->q16 + (size_t)b * Tq * j->ldq + (size_t)h * D, Tq, j->Tqp, D, Dp, j->ldq);
    uint16_t *ob = (uint16_t *)j->out + (size_t)b * Tq * j->ldo + (size_t)h * D;
    for (int r0 = 0; r0 < Tq; r0 += BLK)
        fwd_block(w, j->x, ob, j->ldo, j->lse + (size_t)bh * Tq, j->q0, r0,
                  Tq - r0 < BLK ? Tq - r0 : BLK);
}

/* This thread's share of the (batch, head) pairs, as schedule(static). */
static void fwd_job(int tid, int nt, void *arg)
{
    att16_job *j = arg;
    char *mem = malloc(fwd_bytes(j->Dp, j->Tkp, j->Tqp));
    if (!mem) {
        atomic_store(&j->failed, 1);
        return;
    }
    fwd_ws w = {0};
    int last = -1;
    fwd_carve(&w, mem, j->Dp, j->Tkp, j->Tqp);
    amx_config();
    size_t lo, hi;
    cpu_pool_static((size_t)j->B * j->Hq, tid, nt, &lo, &hi);
    for (size_t bh = lo; bh < hi; bh++)
        fwd_head(j, &w, (int)bh, &last);
    amx_release();
    free(mem);
}

void cpu_att16_fwd(kn_ctx *c, void *out, float *lse, const void *q, const void *k, const void *v,
                   int B, int Tq, int Tk, int Hq, int Hkv, int ldq, int ldkv, const cpu_att_args *x,
                   int nt)
{
    int D = x->D;
    att16_job j = {.x = x,
                   .out = out,
                   .lse = lse,
                   .q16 = q,
                   .k16 = k,
                   .v16 = v,
                   .B = B,
                   .Tq = Tq,
                   .Tk = Tk,
                   .Hq = Hq,
                   .Hkv = Hkv,
                   .ldq = ldq,
                   .ldkv = ldkv,
                   .Dp = up32(D),
                   .Tkp = up32(Tk),
                   .Tqp = up32(Tq),
                   .group = Hq / Hkv,
                   .q0 = Tk - Tq,
                   .ldo = Hq * D};
    atomic_init(&j.failed, 0);
    cpu_pool_run(c, nt, fwd_job, &j);
    if (j.failed) kn_fail(c, TY_ENOMEM, "attention forward (bf16): out of memory for its tiles");
}

/* ---- backward --------------------------------------------------------- */

typedef struct bwd_ws {
    uint16_t *kt, *kv, *vt, *qa, *qv, *ga, *gv; /* k, v per kv head; q, dO per head */
    uint16_t *pt, *ds, *dst;                    /* split P^T, dS, dS^T */
    float *s, *dp, *tg, *tt, *db, *wo;          /* tt: a transposed tile */
    float *sq, *sk, *sv;                        /* dq, dk, dv of the head, [Tp, Dp] */
    int Dp, Tp;
} bwd_ws;

static size_t bwd_bytes(int Dp, int Tp, int T, int D)
{
    size_t tile = (size_t)BLK * BLK;
    return 2 * ((size_t)7 * (Tp + SKEW) * Dp + 3 * BWD_PARTS * tile) +
           4 * (4 * tile + (size_t)3 * Tp * Dp + (size_t)T + (size_t)T * D) + 18 * 64;
}

static void bwd_carve(bwd_ws *w, char *base, int Dp, int Tp, int T, int D)
{
    size_t lay = (size_t)(Tp + SKEW) * Dp * 2, tile = (size_t)BLK * BLK;
    w->Dp = Dp, w->Tp = Tp;
    uint16_t **l16[] = {&w->kt, &w->kv, &w->vt, &w->qa, &w->qv, &w->ga, &w->gv};
    for (int i = 0; i < 7; i++)
        *l16[i] = carve(&base, lay);
    w->pt = carve(&base, BWD_PARTS * tile * 2);
    w->ds = carve(&base, BWD_PARTS * tile * 2);
    w->dst = carve(&base, BWD_PARTS * tile * 2);
    w->s = carve(&base, tile * 4);
    w->dp = carve(&base, tile * 4);
    w->tg = carve(&base, tile * 4);
    w->tt = carve(&base, tile * 4);
    w->sq = carve(&base, (size_t)Tp * Dp * 4);
    w->sk = carve(&base, (size_t)Tp * Dp * 4);
    w->sv = carve(&base, (size_t)Tp * Dp * 4);
    w->db = carve(&base, (size_t)T * 4);
    w->wo = carve(&base, (size_t)T * D * 4);
}

/* The outputs of one (batch, head) for the tiles. */
typedef struct bwd_out {
    float *dq, *dk, *dv; /* the compact rows (bwd_ws sq, sk, sv) or NULL */
    const float *lse;
} bwd_out;

/* dst[n, Dp] (fp32, one head's compact gradient rows) += the split A
 * (BLK-wide parts, k deep) times B (pair layout over k), summed on the
 * tiles in place. */
static void grad_add(const bwd_ws *w, float *dst, int n, int k, const uint16_t *A,
                     const uint16_t *B)
{
    int Dp = w->Dp;
    amx_gemm(up32(n), Dp, k, A, BLK, BWD_PARTS, (size_t)BLK * BLK, B, Dp * 2, dst, Dp, 1);
}

/* One tile: rows [i0, i0 + rows) against key columns [j0, j0 + cols). */
static void bwd_tile(const bwd_ws *w, const cpu_att_args *x, const bwd_out *o, int i0, int rows,
                     int j0, int cols)
{
    int Dp = w->Dp, Tp = w->Tp, rp = up32(rows), cp = up32(cols);
    size_t ps = (size_t)BLK * BLK;
    amx_gemm(rp, cp, Dp, w->qa + (size_t)i0 * Dp, Dp, 1, 0, w->kt + (size_t)j0 * 2, (Tp + SKEW) * 2,
             w->s, BLK, 0);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++)
            w->s[r * BLK + j] *= x->scale;
    cpu_att_bwd_probs(w->s, w->tg, o->lse, i0, rows, j0, cols, x);
    if (o->dv) { /* dV_j += P^T dO_i */
        transpose_tile(w->tt, w->s, rows, cols);
        split_parts(w->pt, ps, BLK, w->tt, BLK, cols, cp, rows, rp, BWD_PARTS);
        grad_add(w, o->dv + (size_t)j0 * Dp, cols, rp, w->pt, w->gv + (size_t)(i0 / 2) * Dp * 2);
    }
    if (!o->dq && !o->dk) return;
    amx_gemm(rp, cp, Dp, w->ga + (size_t)i0 * Dp, Dp, 1, 0, w->vt + (size_t)j0 * 2, (Tp + SKEW) * 2,
             w->dp, BLK, 0);
    cpu_att_bwd_dscores(w->s, w->dp, w->tg, w->db, i0, rows, cols, x);
    if (o->dq) { /* dQ_i += dS K_j */
        split_parts(w->ds, ps, BLK, w->dp, BLK, rows, rp, cols, cp, BWD_PARTS);
        grad_add(w, o->dq + (size_t)i0 * Dp, rows, cp, w->ds, w->kv + (size_t)(j0 / 2) * Dp * 2);
    }
    if (o->dk) { /* dK_j += dS^T Q_i */
        transpose_tile(w->tt, w->dp, rows, cols);
        split_parts(w->dst, ps, BLK, w->tt, BLK, cols, cp, rows, rp, BWD_PARTS);
        grad_add(w, o->dk + (size_t)j0 * Dp, cols, rp, w->dst, w->qv + (size_t)(i0 / 2) * Dp * 2);
    }
}

/* dO rows of one head (fp32 holding bf16 values: the high halves) as
 * row-major bf16 [Tp, Dp] and in pair layout. */
static void lay_dout(const bwd_ws *w, const float *g, int T, int D, int ldo)
{
    int Dp = w->Dp, Tp = w->Tp;
    memset(w->ga, 0, (size_t)Tp * Dp * 2);
    for (int t = 0; t < T; t++)
        for (int e = 0; e < D; e++) {
            uint32_t u;
            memcpy(&u, g + (size_t)t * ldo + e, 4);
            w->ga[(size_t)t * Dp + e] = (uint16_t)(u >> 16);
        }
    lay_pairs_rows(w->gv, w->ga, T, Tp, D, Dp, Dp);
}

/* Query head h of batch b against its kv head, laid out already. */
static void bwd_head(const bwd_ws *w, const cpu_att_args *x, const bwd_out *o, const uint16_t *q16,
                     const float *g, const uint16_t *ob, int T, int ldo)
{
    int D = x->D, Dp = w->Dp, Tp = w->Tp, lo;
    lay_rows(w->qa, q16, T, Tp, D, Dp, x->ldq);
    lay_pairs_rows(w->qv, w->qa, T, Tp, D, Dp, Dp);
    lay_dout(w, g, T, D, ldo);
    const float *of = cpu_att_head_rows(w->wo, ob, KN_BF16, 0, T, D, ldo, &lo);
    cpu_att_rowdot(w->db, g, of, T, D, ldo, lo);
    for (int i0 = 0; i0 < T; i0 += BLK) {
        int rows = T - i0 < BLK ? T - i0 : BLK;
        int jstart = cpu_att_lo(i0, x->window) / BLK * BLK;
        for (int j0 = jstart; j0 < i0 + rows; j0 += BLK)
            bwd_tile(w, x, o, i0, rows, j0, i0 + rows - j0 < BLK ? i0 + rows - j0 : BLK);
    }
}

/* The backward of (batch, kv head) bg: its query heads in order, dk and
 * dv summed in the scratch and added once. */
static void bwd_group(const att16_job *j, bwd_ws *w, int bg)
{
    const cpu_att_args *x = j->x;
    int D = x->D, T = j->Tq, Dp = j->Dp, Tp = j->Tkp, ldo = j->ldo;
    int b = bg / j->Hkv, g = bg % j->Hkv;
    size_t ko = (size_t)b * T * x->ldkv + (size_t)g * D;
    lay_pairs_cols(w->kt, j->k16 + ko, T, Tp, D, Dp, x->ldkv);
    lay_pairs_rows(w->kv, j->k16 + ko, T, Tp, D, Dp, x->ldkv);
    lay_pairs_cols(w->vt, j->v16 + ko, T, Tp, D, Dp, x->ldkv);
    size_t gbytes = (size_t)Tp * Dp * 4;
    memset(w->sk, 0, gbytes);
    memset(w->sv, 0, gbytes);
    for (int h = g * j->group; h < (g + 1) * j->group; h++) {
        size_t qo = (size_t)b * T * x->ldq + (size_t)h * D;
        size_t oo = (size_t)b * T * ldo + (size_t)h * D;
        bwd_out o = {.dq = j->dq ? w->sq : NULL,
                     .dk = j->dk ? w->sk : NULL,
                     .dv = j->dv ? w->sv : NULL,
                     .lse = j->clse + ((size_t)b * j->Hq + h) * T};
        memset(w->sq, 0, gbytes);
        bwd_head(w, x, &o, j->q16 + qo, j->dout + oo, j->o16 + oo, T, ldo);
        if (j->dq) add_rows(j->dq + qo, x->ldq, w->sq, Dp, T, D);
    }
    /* the head's sums added once: contiguous rows for the tiles */
    if (j->dk) add_rows(j->dk + ko, x->ldkv, w->sk, Dp, T, D);
    if (j->dv) add_rows(j->dv + ko, x->ldkv, w->sv, Dp, T, D);
}

/* This thread's share of the (batch, kv head) pairs, as schedule(static). */
static void bwd_job(int tid, int nt, void *arg)
{
    att16_job *j = arg;
    int D = j->x->D, T = j->Tq;
    char *mem = malloc(bwd_bytes(j->Dp, j->Tkp, T, D));
    if (!mem) {
        atomic_store(&j->failed, 1);
        return;
    }
    bwd_ws w = {0};
    bwd_carve(&w, mem, j->Dp, j->Tkp, T, D);
    amx_config();
    size_t lo, hi;
    cpu_pool_static((size_t)j->B * j->Hkv, tid, nt, &lo, &hi);
    for (size_t bg = lo; bg < hi; bg++)
        bwd_group(j, &w, (int)bg);
    amx_release();
    free(mem);
}

void cpu_att16_bwd(kn_ctx *c, float *dq, float *dk, float *dv, const float *dout, const void *out,
                   const float *lse, const void *q, const void *k, const void *v, int B, int T,
                   int Hq, int Hkv, const cpu_att_args *x, int nt)
{
    int D = x->D;
    att16_job j = {.x = x,
                   .dq = dq,
                   .dk = dk,
                   .dv = dv,
                   .dout = dout,
                   .o16 = out,
                   .clse = lse,
                   .q16 = q,
                   .k16 = k,
                   .v16 = v,
                   .B = B,
                   .Tq = T,
                   .Hq = Hq,
                   .Hkv = Hkv,
                   .Dp = up32(D),
                   .Tkp = up32(T),
                   .group = Hq / Hkv,
                   .ldo = Hq * D};
    atomic_init(&j.failed, 0);
    cpu_pool_run(c, nt, bwd_job, &j);
    if (j.failed) kn_fail(c, TY_ENOMEM, "attention backward (bf16): out of memory for its tiles");
}
