/* cpu_nf4.c — QLoRA's 4-bit NormalFloat weights: dequantise, then sgemm.
 *
 * A NF4 weight (kernels.h, kn_nf4) is dequantised into a per-context fp32
 * scratch, rounded to the compute dtype, and the ordinary fp32 matmul runs
 * on it (cpu_matmul.c) — bitsandbytes' CPU path does the same (dequantize_4bit
 * to the compute dtype, then a dense linear). The dequantisation costs
 * M*K operations against the product's N*M*K, and the scratch holds one
 * weight at a time (grown to the largest, then reused), so the model keeps
 * only 4-bit weights. The arithmetic is exactly bitsandbytes':
 *   a = dyn8[qabsmax[b]] * absmax2[b / 256];  a = a + offset;  w = nf4[q] * a
 * each an fp32 operation rounded on its own (this file is compiled with
 * -ffp-contract=off so no multiply-add is fused), which makes the values
 * bit-identical to bitsandbytes' dequantize_4bit and to the CUDA kernel. */
#include "cpu.h"
#include "nf4_tables.h"

#include <omp.h>
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

/* deq(w) into an fp32 buffer, rounded to dt (a no-op for fp32). */
static void deq_f32(kn_ctx *c, float *out, const kn_nf4 *w, size_t n, kn_dtype dt)
{
    int nt = cpu_threads_for(c, n);
#pragma omp parallel num_threads(nt)
    {
        size_t lo, hi;
        cpu_thread_range(n, KN_NF4_BLOCK, &lo, &hi);
        deq_range(out, w, lo, hi);
    }
    if (dt != KN_F32) cpu_round(c, out, n, dt);
}

void cpu_nf4_dequant(kn_ctx *c, void *out, kn_dtype dt, kn_nf4 w, size_t n)
{
    if (!n) return;
    if (dt == KN_F32) {
        deq_f32(c, out, &w, n, KN_F32);
        return;
    }
    float *s = nf4_scratch(c, n);
    if (!s) return;
    deq_f32(c, s, &w, n, KN_F32);
    cpu_convert(c, out, dt, s, KN_F32, n);
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
