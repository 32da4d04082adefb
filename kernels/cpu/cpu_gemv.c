/* cpu_gemv.c — the one-row product of decoding: out[M] = x[K] w[M,K]^T + b.
 *
 * Generating a token multiplies one activation row by every weight matrix,
 * so the work is reading the weights once (memory-bound), not arithmetic.
 * sgemm is the wrong tool at one row: OpenBLAS packs its B operand (the
 * whole weight) into a buffer before multiplying, reading and writing the
 * weights an extra time, and kn_matmul16's convert path widens 16-bit
 * weights into an fp32 copy first. Here each weight row is read once,
 * straight from where it lives, and dotted with x while in registers.
 *
 * kn_matmul_fwd and kn_matmul16_fwd come here when N == 1 (cpu_matmul.c,
 * cpu_matmul16.c), so the op list is unchanged and the CUDA backend needs
 * nothing new. The contract is theirs: 16-bit weights multiply an x that
 * holds values of the weights' type (the engine rounds activations before a
 * 16-bit product), so x is rounded to that type here too — a no-op for
 * such an x — and every path below computes the same products.
 *
 * Kernels, picked once per process:
 *  - bf16 on a CPU with AVX512-BF16: vdpbf16ps, 32 weights per instruction
 *    multiplied against bf16 x pairs and summed into fp32 lanes;
 *  - everything else (fp32, fp16, bf16 without that instruction): portable
 *    C whose inner loop widens the weights to fp32 and accumulates in fp32
 *    (`omp simd` reduction), compiled for AVX-512 / AVX2 / baseline
 *    (CPU_HOT). TY_KN_GEMV=portable forces this path (the kernel tests run
 *    both); TY_KN_GEMV=off sends one row down the N-row path (sgemm,
 *    oneDNN) as before this file, for bench/generate's comparison.
 * Rows are dotted four at a time so x is loaded once per four rows. Output
 * rows are split over the context's threads in 16-row steps when there are
 * enough weights to pay for the fork; each output element is one thread's
 * dot product in a fixed order, so results do not depend on the thread
 * count. */
#include "cpu.h"
#include "cpu_math.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GEMV_X86 1
#endif

/* Weights per thread below which one thread does the whole product: a
 * fork costs microseconds idle and a scheduler slice under load. */
#define GEMV_MIN_PER_THREAD (1L << 18)
/* Largest K whose rounded x fits the on-stack buffer; longer rows use heap. */
#define GEMV_STACK_K 16384

static int g_dpbf16; /* AVX512-BF16 kernel usable */
static int g_off;    /* TY_KN_GEMV=off: one-row products take the N-row path */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void gemv_setup(void)
{
    const char *force = getenv("TY_KN_GEMV");
    int portable = force && !strcmp(force, "portable");
    g_off = force && !strcmp(force, "off");
#ifdef GEMV_X86
    __builtin_cpu_init();
    g_dpbf16 =
        !portable && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
#else
    (void)portable;
#endif
}

/* Rows [lo, hi) of the portable kernel: out[r] = x . w[r] (+ bias), for a
 * weight type T widened to fp32 by WIDEN. One body, three instances (fp32,
 * bf16, fp16), so the three paths compute in the same order. */
#define GEMV_ROWS(name, T, WIDEN)                                                                  \
    CPU_HOT static void name(float *out, const float *x, const T *w, const float *bias, int K,     \
                             int lo, int hi)                                                       \
    {                                                                                              \
        int r = lo;                                                                                \
        for (; r + 4 <= hi; r += 4) {                                                              \
            const T *w0 = w + (size_t)r * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;             \
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                                  \
            _Pragma("omp simd reduction(+ : s0, s1, s2, s3)") for (int k = 0; k < K; k++)          \
            {                                                                                      \
                s0 += WIDEN(w0[k]) * x[k];                                                         \
                s1 += WIDEN(w1[k]) * x[k];                                                         \
                s2 += WIDEN(w2[k]) * x[k];                                                         \
                s3 += WIDEN(w3[k]) * x[k];                                                         \
            }                                                                                      \
            out[r] = s0, out[r + 1] = s1, out[r + 2] = s2, out[r + 3] = s3;                        \
        }                                                                                          \
        for (; r < hi; r++) {                                                                      \
            const T *w0 = w + (size_t)r * K;                                                       \
            float s0 = 0;                                                                          \
            _Pragma("omp simd reduction(+ : s0)") for (int k = 0; k < K; k++) s0 +=                \
                WIDEN(w0[k]) * x[k];                                                               \
            out[r] = s0;                                                                           \
        }                                                                                          \
        if (bias)                                                                                  \
            for (r = lo; r < hi; r++)                                                              \
                out[r] += bias[r];                                                                 \
    }

#define WIDEN_F32(v) (v)
#define WIDEN_F16(v) ((float)(v))
GEMV_ROWS(rows_f32, float, WIDEN_F32)
GEMV_ROWS(rows_bf16, uint16_t, cpu_bf16_f32)
GEMV_ROWS(rows_f16, _Float16, WIDEN_F16)

#ifdef GEMV_X86
/* vdpbf16ps: lane i += w[2i] x[2i] + w[2i+1] x[2i+1], fp32 accumulation.
 * K % 32 leftovers load masked (zeros add nothing). */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void
rows_dpbf16(float *out, const uint16_t *x16, const uint16_t *w, const float *bias, int K, int lo,
            int hi)
{
    int full = K & ~31;
    __mmask32 tail = (__mmask32)((1ull << (K & 31)) - 1);
    int r = lo;
    for (; r + 4 <= hi; r += 4) {
        const uint16_t *w0 = w + (size_t)r * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < full; k += 32) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(x16 + k);
            a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w0 + k), xv);
            a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w1 + k), xv);
            a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512(w2 + k), xv);
            a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512(w3 + k), xv);
        }
        if (tail) {
            __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(tail, x16 + full);
            a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_maskz_loadu_epi16(tail, w0 + full), xv);
            a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_maskz_loadu_epi16(tail, w1 + full), xv);
            a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_maskz_loadu_epi16(tail, w2 + full), xv);
            a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_maskz_loadu_epi16(tail, w3 + full), xv);
        }
        out[r] = _mm512_reduce_add_ps(a0);
        out[r + 1] = _mm512_reduce_add_ps(a1);
        out[r + 2] = _mm512_reduce_add_ps(a2);
        out[r + 3] = _mm512_reduce_add_ps(a3);
    }
    for (; r < hi; r++) {
        const uint16_t *w0 = w + (size_t)r * K;
        __m512 a0 = _mm512_setzero_ps();
        for (int k = 0; k < full; k += 32)
            a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w0 + k),
                                  (__m512bh)_mm512_loadu_si512(x16 + k));
        if (tail)
            a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_maskz_loadu_epi16(tail, w0 + full),
                                  (__m512bh)_mm512_maskz_loadu_epi16(tail, x16 + full));
        out[r] = _mm512_reduce_add_ps(a0);
    }
    if (bias)
        for (r = lo; r < hi; r++)
            out[r] += bias[r];
}
#endif

/* One gemv job: each thread's 16-row steps of out. */
typedef struct gemv_job {
    kn_dtype wdt;
    float *out;
    const float *x;
    const uint16_t *x16;
    const void *w;
    const float *bias;
    int K, M;
} gemv_job;

static void gemv_rows(int tid, int nt, void *arg)
{
    const gemv_job *j = arg;
    size_t lo, hi;
    cpu_thread_range((size_t)j->M, 16, tid, nt, &lo, &hi);
    if (hi <= lo) return;
    if (j->wdt == KN_F32) rows_f32(j->out, j->x, j->w, j->bias, j->K, (int)lo, (int)hi);
#ifdef GEMV_X86
    else if (j->wdt == KN_BF16 && g_dpbf16)
        rows_dpbf16(j->out, j->x16, j->w, j->bias, j->K, (int)lo, (int)hi);
#endif
    else if (j->wdt == KN_BF16)
        rows_bf16(j->out, j->x, j->w, j->bias, j->K, (int)lo, (int)hi);
    else
        rows_f16(j->out, j->x, j->w, j->bias, j->K, (int)lo, (int)hi);
}

int cpu_gemv_on(void)
{
    pthread_once(&g_once, gemv_setup);
    return !g_off;
}

void cpu_gemv(kn_ctx *c, kn_dtype wdt, float *out, const float *x, const void *w, const float *bias,
              int K, int M)
{
    pthread_once(&g_once, gemv_setup);
    if (M <= 0) return;
    if (K <= 0) {
        for (int r = 0; r < M; r++)
            out[r] = bias ? bias[r] : 0.0f;
        return;
    }
    /* x rounded to the weights' type: fp32 values (xr) for the portable
     * kernels, bf16 bits (x16) for vdpbf16ps. */
    int on_stack = wdt != KN_F32 && K <= GEMV_STACK_K;
    float xs[on_stack ? K : 1];
    uint16_t x16s[on_stack ? K : 1];
    float *xr = NULL;
    uint16_t *x16 = NULL;
    void *heap = NULL;
    if (wdt != KN_F32) {
        if (on_stack) {
            xr = xs;
            x16 = x16s;
        } else {
            heap = malloc((size_t)K * (sizeof *xr + sizeof *x16));
            if (!heap) {
                kn_fail(c, TY_ENOMEM, "gemv: out of memory for a row of %d", K);
                return;
            }
            xr = heap;
            x16 = (uint16_t *)(xr + K);
        }
        if (wdt == KN_BF16) {
            cpu_convert_n(x16, KN_BF16, x, KN_F32, (size_t)K);
            cpu_convert_n(xr, KN_F32, x16, KN_BF16, (size_t)K);
        } else {
            _Float16 *h = (_Float16 *)x16;
            cpu_convert_n(h, wdt, x, KN_F32, (size_t)K);
            cpu_convert_n(xr, KN_F32, h, wdt, (size_t)K);
        }
        x = xr;
    }
    long work = (long)M * K;
    int nt = c->n_threads;
    if (work / GEMV_MIN_PER_THREAD < nt) nt = (int)(work / GEMV_MIN_PER_THREAD);
    if (nt < 1) nt = 1;
    if (nt > (M + 15) / 16) nt = (M + 15) / 16;
    gemv_job j = {wdt, out, x, x16, w, bias, K, M};
    cpu_pool_run(c, nt, gemv_rows, &j);
    free(heap);
}
