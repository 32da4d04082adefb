/* cpu_attention.c — rotary embeddings and causal grouped-query attention.
 *
 * Attention works on one (batch, head) at a time straight from the strided
 * q/k/v rows, so GPT-2's fused qkv buffer needs no split copy. The forward
 * splits (b, query head) across threads. The backward splits (b, kv head):
 * all query heads that share a kv head run on the same thread, so dk and dv
 * are accumulated by exactly one thread in a fixed order (no atomics, same
 * bits for any thread count). Only the causal triangle j <= i is computed. */
#include "cpu.h"

#include <math.h>
#include <stdlib.h>

/* ---- rotary position embedding ---------------------------------------- */

/* cos/sin for every (t, i < D/2), computed like Hugging Face does in fp32:
 * inv_freq = 1 / base^(2i/D), angle = pos * inv_freq. */
static float *rope_table(int T, int D, float base, int pos_offset)
{
    int half = D / 2;
    float *tab = malloc((size_t)T * half * 2 * sizeof *tab);
    if (!tab)
        return NULL;
    for (int t = 0; t < T; t++) {
        float pos = (float)(t + pos_offset);
        for (int i = 0; i < half; i++) {
            float inv = 1.0f / powf(base, (float)(2 * i) / (float)D);
            float ang = pos * inv;
            tab[((size_t)t * half + i) * 2] = cosf(ang);
            tab[((size_t)t * half + i) * 2 + 1] = sinf(ang);
        }
    }
    return tab;
}

/* dir = +1 rotates by theta (forward), -1 by -theta (the transpose). */
static void rope_apply(kn_ctx *c, float *x, int B, int T, int H, int D, int ld, float base,
                       int pos_offset, float dir)
{
    int half = D / 2;
    if (B <= 0 || T <= 0 || H <= 0 || half <= 0)
        return;
    float *tab = rope_table(T, D, base, pos_offset);
    if (tab) {
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if ((size_t)B * T * H * D > CPU_PAR_MIN)
        for (int bt = 0; bt < B * T; bt++) {
            const float *cs = tab + (size_t)(bt % T) * half * 2;
            for (int h = 0; h < H; h++) {
                float *r = x + (size_t)bt * ld + (size_t)h * D;
                for (int i = 0; i < half; i++) {
                    float co = cs[2 * i], si = dir * cs[2 * i + 1];
                    float a = r[i], b = r[i + half];
                    r[i] = a * co - b * si;
                    r[i + half] = b * co + a * si;
                }
            }
        }
        free(tab);
        return;
    }
    /* No memory for the table: the same arithmetic, computed in place. */
    for (int bt = 0; bt < B * T; bt++) {
        float pos = (float)(bt % T + pos_offset);
        for (int i = 0; i < half; i++) {
            float ang = pos * (1.0f / powf(base, (float)(2 * i) / (float)D));
            float co = cosf(ang), si = dir * sinf(ang);
            for (int h = 0; h < H; h++) {
                float *r = x + (size_t)bt * ld + (size_t)h * D;
                float a = r[i], b = r[i + half];
                r[i] = a * co - b * si;
                r[i + half] = b * co + a * si;
            }
        }
    }
}

void cpu_rope_fwd(kn_ctx *c, float *x, int B, int T, int H, int D, int ld, float base,
                  int pos_offset)
{
    rope_apply(c, x, B, T, H, D, ld, base, pos_offset, 1.0f);
}

void cpu_rope_bwd(kn_ctx *c, float *dx, int B, int T, int H, int D, int ld, float base,
                  int pos_offset)
{
    rope_apply(c, dx, B, T, H, D, ld, base, pos_offset, -1.0f);
}

/* ---- attention -------------------------------------------------------- */

static inline float dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static inline void axpy_row(float *y, float a, const float *x, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

void cpu_attention_fwd(kn_ctx *c, float *out, float *att, const float *q, const float *k,
                       const float *v, int B, int T, int Hq, int Hkv, int D, int ldq, int ldkv)
{
    if (B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || D <= 0)
        return;
    int group = Hq / Hkv;
    float scale = 1.0f / sqrtf((float)D);
    size_t ldo = (size_t)Hq * D;
#pragma omp parallel for schedule(static) num_threads(c->n_threads)
    for (int bh = 0; bh < B * Hq; bh++) {
        int b = bh / Hq, h = bh % Hq, g = h / group;
        const float *qb = q + (size_t)b * T * ldq + (size_t)h * D;
        const float *kb = k + (size_t)b * T * ldkv + (size_t)g * D;
        const float *vb = v + (size_t)b * T * ldkv + (size_t)g * D;
        float *ob = out + (size_t)b * T * ldo + (size_t)h * D;
        float *ab = att + (size_t)bh * T * T;
        for (int i = 0; i < T; i++) {
            const float *qi = qb + (size_t)i * ldq;
            float *row = ab + (size_t)i * T;
            float mx = -INFINITY;
            for (int j = 0; j <= i; j++) {
                float s = dot(qi, kb + (size_t)j * ldkv, D) * scale;
                row[j] = s;
                mx = s > mx ? s : mx;
            }
            float sum = 0.0f;
            for (int j = 0; j <= i; j++) {
                float e = expf(row[j] - mx);
                row[j] = e;
                sum += e;
            }
            float inv = 1.0f / sum;
            for (int j = 0; j <= i; j++)
                row[j] *= inv;
            for (int j = i + 1; j < T; j++)
                row[j] = 0.0f;
            float *oi = ob + (size_t)i * ldo;
            for (int d = 0; d < D; d++)
                oi[d] = 0.0f;
            for (int j = 0; j <= i; j++)
                axpy_row(oi, row[j], vb + (size_t)j * ldkv, D);
        }
    }
}

void cpu_attention_bwd(kn_ctx *c, float *dq, float *dk, float *dv, const float *dout,
                       const float *att, const float *q, const float *k, const float *v, int B,
                       int T, int Hq, int Hkv, int D, int ldq, int ldkv)
{
    if (B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || D <= 0)
        return;
    if (!dq && !dk && !dv)
        return;
    int group = Hq / Hkv;
    float scale = 1.0f / sqrtf((float)D);
    size_t ldo = (size_t)Hq * D;
#pragma omp parallel for schedule(static) num_threads(c->n_threads)
    for (int bg = 0; bg < B * Hkv; bg++) {
        /* dp: dL/d(probabilities) of one row, reused as dL/d(scores);
         * T floats on the thread's stack (512 KiB at T = 128k). */
        float dp[T];
        int b = bg / Hkv, g = bg % Hkv;
        const float *kb = k + (size_t)b * T * ldkv + (size_t)g * D;
        const float *vb = v + (size_t)b * T * ldkv + (size_t)g * D;
        float *dkb = dk ? dk + (size_t)b * T * ldkv + (size_t)g * D : NULL;
        float *dvb = dv ? dv + (size_t)b * T * ldkv + (size_t)g * D : NULL;
        for (int h = g * group; h < (g + 1) * group; h++) {
            const float *qb = q + (size_t)b * T * ldq + (size_t)h * D;
            float *dqb = dq ? dq + (size_t)b * T * ldq + (size_t)h * D : NULL;
            const float *gb = dout + (size_t)b * T * ldo + (size_t)h * D;
            const float *ab = att + ((size_t)b * Hq + h) * T * T;
            for (int i = 0; i < T; i++) {
                const float *p = ab + (size_t)i * T;
                const float *gi = gb + (size_t)i * ldo;
                if (dvb)
                    for (int j = 0; j <= i; j++)
                        axpy_row(dvb + (size_t)j * ldkv, p[j], gi, D);
                if (!dqb && !dkb)
                    continue;
                float s = 0.0f;
                for (int j = 0; j <= i; j++) {
                    dp[j] = dot(gi, vb + (size_t)j * ldkv, D);
                    s += p[j] * dp[j];
                }
                for (int j = 0; j <= i; j++)
                    dp[j] = p[j] * (dp[j] - s) * scale;
                if (dqb) {
                    float *dqi = dqb + (size_t)i * ldq;
                    for (int j = 0; j <= i; j++)
                        axpy_row(dqi, dp[j], kb + (size_t)j * ldkv, D);
                }
                if (dkb) {
                    const float *qi = qb + (size_t)i * ldq;
                    for (int j = 0; j <= i; j++)
                        axpy_row(dkb + (size_t)j * ldkv, dp[j], qi, D);
                }
            }
        }
    }
}
