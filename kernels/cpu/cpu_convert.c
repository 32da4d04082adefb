/* cpu_convert.c — fp32 <-> bf16 / fp16 storage conversions.
 *
 * bf16 is the top half of an fp32: narrowing adds 0x7fff plus the lowest
 * kept bit before truncating, which is round-to-nearest-even, and carries
 * into the exponent correctly up to inf; NaNs are made quiet so none turns
 * into inf. fp16 goes through the compiler's _Float16 (IEEE binary16,
 * round-to-nearest-even, overflow to inf, subnormals kept), which uses the
 * F16C / AVX-512 conversion instructions where the clone has them. */
#include "cpu.h"
#include "cpu_math.h"

#include <string.h>

CPU_HOT static void to_bf16(uint16_t *d, const float *s, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        d[i] = cpu_bf16_rne(s[i]);
}

CPU_HOT static void from_bf16(float *d, const uint16_t *s, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        d[i] = cpu_bf16_f32(s[i]);
}

CPU_HOT static void to_f16(_Float16 *d, const float *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = (_Float16)s[i];
}

CPU_HOT static void from_f16(float *d, const _Float16 *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = (float)s[i];
}

CPU_HOT static void round_bf16(float *x, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        x[i] = cpu_bf16_f32(cpu_bf16_rne(x[i]));
}

CPU_HOT static void round_f16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(_Float16)x[i];
}

/* n elements from src to dst (both already offset to this share). */
void cpu_convert_n(void *dst, kn_dtype ddt, const void *src, kn_dtype sdt, size_t n)
{
    if (ddt == sdt) {
        if (dst != src) memcpy(dst, src, n * kn_dtype_size(ddt));
        return;
    }
    /* 16-bit to 16-bit goes through fp32 in a small stack buffer. */
    if (ddt != KN_F32 && sdt != KN_F32) {
        float tmp[1024];
        size_t es = kn_dtype_size(sdt);
        for (size_t i = 0; i < n; i += 1024) {
            size_t m = n - i < 1024 ? n - i : 1024;
            cpu_convert_n(tmp, KN_F32, (const char *)src + i * es, sdt, m);
            cpu_convert_n((char *)dst + i * es, ddt, tmp, KN_F32, m);
        }
        return;
    }
    if (sdt == KN_F32) {
        if (ddt == KN_BF16)
            to_bf16(dst, src, n);
        else
            to_f16(dst, src, n);
    } else if (sdt == KN_BF16) {
        from_bf16(dst, src, n);
    } else {
        from_f16(dst, src, n);
    }
}

/* The operands of a conversion job. */
typedef struct cv_job {
    void *dst;
    const void *src;
    uint16_t *hi, *lo;
    kn_dtype ddt, sdt;
    size_t n;
} cv_job;

static void convert_job(int tid, int nt, void *arg)
{
    const cv_job *j = arg;
    size_t lo, hi, ds = kn_dtype_size(j->ddt), ss = kn_dtype_size(j->sdt);
    cpu_thread_range(j->n, 32, tid, nt, &lo, &hi);
    if (hi > lo)
        cpu_convert_n((char *)j->dst + lo * ds, j->ddt, (const char *)j->src + lo * ss, j->sdt,
                      hi - lo);
}

void cpu_convert(kn_ctx *c, void *dst, kn_dtype dst_dt, const void *src, kn_dtype src_dt, size_t n)
{
    cv_job j = {.dst = dst, .src = src, .ddt = dst_dt, .sdt = src_dt, .n = n};
    cpu_pool_run(c, cpu_threads_for(c, n), convert_job, &j);
}

/* The spans laid end to end are one index range, cut into equal thread
 * shares; a thread converts the parts of the spans its share covers. */
typedef struct spans_job {
    void *dst;
    const void *src;
    kn_dtype ddt, sdt;
    const kn_span *s;
    int ns;
    size_t total;
} spans_job;

static void spans_job_run(int tid, int nt, void *arg)
{
    const spans_job *j = arg;
    size_t lo, hi, off = 0, ds = kn_dtype_size(j->ddt), ss = kn_dtype_size(j->sdt);
    cpu_thread_range(j->total, 32, tid, nt, &lo, &hi);
    for (int i = 0; i < j->ns && off < hi; off += j->s[i].n, i++) {
        size_t a = lo > off ? lo - off : 0, e = hi - off < j->s[i].n ? hi - off : j->s[i].n;
        if (a < e)
            cpu_convert_n((char *)j->dst + (j->s[i].dst + a) * ds, j->ddt,
                          (const char *)j->src + (j->s[i].src + a) * ss, j->sdt, e - a);
    }
}

void cpu_convert_spans(kn_ctx *c, void *dst, kn_dtype dst_dt, const void *src, kn_dtype src_dt,
                       const kn_span *s, int ns)
{
    spans_job j = {dst, src, dst_dt, src_dt, s, ns, 0};
    for (int i = 0; i < ns; i++)
        j.total += s[i].n;
    if (j.total) cpu_pool_run(c, cpu_threads_for(c, j.total), spans_job_run, &j);
}

void cpu_round_n(float *x, size_t n, kn_dtype dt)
{
    if (dt == KN_BF16)
        round_bf16(x, n);
    else if (dt == KN_F16)
        round_f16(x, n);
}

static void round_job(int tid, int nt, void *arg)
{
    const cv_job *j = arg;
    size_t lo, hi;
    cpu_thread_range(j->n, 16, tid, nt, &lo, &hi);
    if (hi > lo) cpu_round_n((float *)j->dst + lo, hi - lo, j->ddt);
}

void cpu_round(kn_ctx *c, float *x, size_t n, kn_dtype dt)
{
    if (dt == KN_F32) return;
    cv_job j = {.dst = x, .ddt = dt, .n = n};
    cpu_pool_run(c, cpu_threads_for(c, n), round_job, &j);
}

/* ---- fp32 masters as bf16 + a 16-bit low half (kn_master_split/join) ---- */

static void split_range(size_t a, size_t b, void *arg)
{
    const cv_job *j = arg;
    const float *x = j->src;
    for (size_t i = a; i < b; i++)
        cpu_split1(x[i], j->hi + i, j->lo + i);
}

void cpu_master_split(kn_ctx *c, uint16_t *hi, uint16_t *lo, const float *x, size_t n)
{
    cv_job j = {.src = x, .hi = hi, .lo = lo};
    cpu_pool_for(c, cpu_threads_for(c, n), n, split_range, &j);
}

static void join_range(size_t a, size_t b, void *arg)
{
    const cv_job *j = arg;
    float *x = j->dst;
    for (size_t i = a; i < b; i++)
        x[i] = cpu_join1(j->hi[i], j->lo[i]);
}

void cpu_master_join(kn_ctx *c, float *x, const uint16_t *hi, const uint16_t *lo, size_t n)
{
    cv_job j = {.dst = x, .hi = (uint16_t *)hi, .lo = (uint16_t *)lo};
    cpu_pool_for(c, cpu_threads_for(c, n), n, join_range, &j);
}
