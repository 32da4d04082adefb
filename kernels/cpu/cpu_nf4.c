/* cpu_nf4.c — QLoRA's 4-bit NormalFloat weights: dequantise, then sgemm.
 *
 * A NF4 weight (kernels.h, kn_nf4) is dequantised into a per-context fp32
 * scratch, rounded to the compute dtype, and the ordinary fp32 matmul runs
 * on it (cpu_matmul.c) — bitsandbytes' CPU path does the same (dequantize_4bit
 * to the compute dtype, then a dense linear). The dequantisation costs
 * M*K operations against the product's N*M*K, and the scratch holds one
 * weight at a time (grown to the largest, then reused), so the model keeps
 * only 4-bit weights. kn_nf4_dequant to a 16-bit type (the engine's
 * 16-bit QLoRA path, engine/qlora.c, then multiplies with matmul16)
 * converts slice by slice from the stack and takes no scratch. The
 * arithmetic is exactly bitsandbytes':
 *   a = dyn8[qabsmax[b]] * absmax2[b / 256];  a = a + offset;  w = nf4[q] * a
 * each an fp32 operation rounded on its own (this file is compiled with
 * -ffp-contract=off so no multiply-add is fused), which makes the values
 * bit-identical to bitsandbytes' dequantize_4bit and to the CUDA kernel. */
#include "cpu.h"
#include "nf4_tables.h"

#include <stdlib.h>

const float kn_nf4_levels[16] = KN_NF4_LEVELS_INIT;
const float kn_dyn8_map[256] = KN_DYN8_MAP_INIT;

/* One scratch buffer per context, kept beside matmul16's. */
static float *nf4_scratch(kn_ctx *c, size_t n)
{
    cpu_state *st = c->impl;
    size_t bytes = n * sizeof(float);
    if (st->nf4_cap < bytes) {
        void *p = realloc(st->nf4_buf, bytes);
        if (!p) {
            kn_fail(c, TY_ENOMEM, "nf4: out of memory for %zu bytes of dequantisation scratch",
                    bytes);
            return NULL;
        }
        st->nf4_buf = p;
        st->nf4_cap = bytes;
    }
    return st->nf4_buf;
}

/* out[i] = deq(w)[i] for i in [lo, hi), fp32. The view's element i is the
 * tensor's element g = first + i (kn_nf4), so the loop runs over
 * [first + lo, first + hi) block by block: one absmax per 64 values, then
 * a table lookup and a multiply per value, two values a byte where g is
 * even (always, for a whole tensor: lo is cpu_thread_range's multiple of
 * 64). */
static void deq_range(float *out, const kn_nf4 *w, size_t lo, size_t hi)
{
    out -= w->first;
    size_t ghi = w->first + hi;
    for (size_t g = w->first + lo; g < ghi;) {
        size_t b = g / KN_NF4_BLOCK,
               end = (b + 1) * KN_NF4_BLOCK < ghi ? (b + 1) * KN_NF4_BLOCK : ghi;
        float a;
        if (w->absmax) {
            a = w->absmax[b];
        } else {
            a = kn_dyn8_map[w->qabsmax[b]] * w->absmax2[b / KN_NF4_BLOCK2];
            a = a + w->offset;
        }
        if (g & 1) { /* a view starting at an odd element: its low nibble */
            out[g] = kn_nf4_levels[w->codes[g / 2] & 15] * a;
            g++;
        }
        for (; g + 1 < end; g += 2) {
            uint8_t byte = w->codes[g / 2];
            out[g] = kn_nf4_levels[byte >> 4] * a;
            out[g + 1] = kn_nf4_levels[byte & 15] * a;
        }
        if (g < end) { /* an odd count's last value */
            out[g] = kn_nf4_levels[w->codes[g / 2] >> 4] * a;
            g++;
        }
    }
}

/* deq(w)[lo, hi) stored in the 16-bit dt at out + lo, through an fp32
 * slice on the stack (a view of the view from lo: deq_range takes any
 * start), so no fp32 copy of the weight is made. */
static void deq16_range(void *out, kn_dtype dt, const kn_nf4 *w, size_t lo, size_t hi)
{
    float tmp[1024];
    size_t es = kn_dtype_size(dt);
    for (size_t i = lo; i < hi; i += 1024) {
        size_t n = hi - i < 1024 ? hi - i : 1024;
        kn_nf4 v = *w;
        v.first += i;
        deq_range(tmp, &v, 0, n);
        cpu_convert_n((char *)out + i * es, dt, tmp, KN_F32, n);
    }
}

typedef struct deq_job {
    void *out;
    kn_dtype dt; /* what out holds: fp32, or a 16-bit type stored directly */
    const kn_nf4 *w;
    size_t n;
} deq_job;

/* This thread's whole blocks of the dequantisation. */
static void deq_rows(int tid, int nt, void *arg)
{
    const deq_job *j = arg;
    size_t lo, hi;
    cpu_thread_range(j->n, KN_NF4_BLOCK, tid, nt, &lo, &hi);
    if (j->dt == KN_F32)
        deq_range(j->out, j->w, lo, hi);
    else
        deq16_range(j->out, j->dt, j->w, lo, hi);
}

/* deq(w) stored in dt (fp32, or 16 bits without an fp32 copy). */
static void deq(kn_ctx *c, void *out, kn_dtype dt, const kn_nf4 *w, size_t n)
{
    deq_job j = {out, dt, w, n};
    cpu_pool_run(c, cpu_threads_for(c, n), deq_rows, &j);
}

/* deq(w) into an fp32 buffer, rounded to dt (a no-op for fp32). */
static void deq_f32(kn_ctx *c, float *out, const kn_nf4 *w, size_t n, kn_dtype dt)
{
    deq(c, out, KN_F32, w, n);
    if (dt != KN_F32) cpu_round(c, out, n, dt);
}

void cpu_nf4_dequant(kn_ctx *c, void *out, kn_dtype dt, kn_nf4 w, size_t n)
{
    if (n) deq(c, out, dt, &w, n);
}

void cpu_nf4_matmul_fwd(kn_ctx *c, kn_dtype dt, float *out, const float *x, kn_nf4 w,
                        const float *bias, int N, int K, int M)
{
    if (N <= 0 || M <= 0) return;
    float *s = nf4_scratch(c, (size_t)M * K);
    if (!s) return;
    deq_f32(c, s, &w, (size_t)M * K, dt);
    cpu_matmul_fwd(c, out, x, s, bias, N, K, M);
}

void cpu_nf4_matmul_bwd(kn_ctx *c, kn_dtype dt, float *dx, const float *dout, kn_nf4 w, int N,
                        int K, int M)
{
    if (N <= 0 || M <= 0 || K <= 0 || !dx) return;
    float *s = nf4_scratch(c, (size_t)M * K);
    if (!s) return;
    deq_f32(c, s, &w, (size_t)M * K, dt);
    cpu_matmul_bwd(c, dx, NULL, NULL, dout, NULL, s, N, K, M);
}
