/* cpu_attention.c — rotary embeddings and causal grouped-query attention.
 *
 * Attention works on one (batch, head) at a time straight from the strided
 * q/k/v rows, so GPT-2's fused qkv buffer needs no split copy. The forward
 * splits (b, query head) across threads. The backward splits (b, kv head):
 * all query heads that share a kv head run on the same thread, so dk and dv
 * are accumulated by exactly one thread in a fixed order (no atomics, same
 * bits for any thread count). Products are single-threaded sgemm calls on
 * blocks of 64 query rows, covering only columns up to the block's end, so
 * about half of the T x T work is skipped by the causal mask. */
#include "cpu.h"
#include "cpu_math.h"

#include <math.h>
#include <stdlib.h>

/* ---- rotary position embedding ---------------------------------------- */

/* cos/sin of pos * inv_freq_i for pos in [0, npos), computed like Hugging
 * Face does in fp32: inv_freq = 1 / base^(2i/D), angle = pos * inv_freq. */
static float *rope_table(int npos, int D, float base)
{
    int half = D / 2;
    float *tab = malloc((size_t)npos * half * 2 * sizeof *tab);
    float *inv = malloc((size_t)half * sizeof *inv);
    if (!tab || !inv) {
        free(tab);
        free(inv);
        return NULL;
    }
    for (int i = 0; i < half; i++)
        inv[i] = 1.0f / powf(base, (float)(2 * i) / (float)D);
    for (int p = 0; p < npos; p++)
        for (int i = 0; i < half; i++) {
            float ang = (float)p * inv[i];
            tab[((size_t)p * half + i) * 2] = cosf(ang);
            tab[((size_t)p * half + i) * 2 + 1] = sinf(ang);
        }
    free(inv);
    return tab;
}

/* The context's table covering positions [0, npos), rebuilt (for at least
 * twice the old range) only when D, base or the range change. NULL when
 * memory is short. */
static const float *rope_cached(kn_ctx *c, int npos, int D, float base)
{
    cpu_state *st = c->impl;
    if (st->rope_tab && st->rope_D == D && st->rope_base == base && st->rope_pos >= npos)
        return st->rope_tab;
    int want = npos;
    if (st->rope_tab && st->rope_D == D && st->rope_base == base && st->rope_pos * 2 > want)
        want = st->rope_pos * 2;
    float *tab = rope_table(want, D, base);
    if (!tab)
        return NULL;
    free(st->rope_tab);
    st->rope_tab = tab;
    st->rope_pos = want;
    st->rope_D = D;
    st->rope_base = base;
    return tab;
}

/* dir = +1 rotates by theta (forward), -1 by -theta (the transpose). */
static void rope_apply(kn_ctx *c, float *x, int B, int T, int H, int D, int ld, float base,
                       int pos_offset, float dir)
{
    int half = D / 2;
    if (B <= 0 || T <= 0 || H <= 0 || half <= 0)
        return;
    const float *tab = pos_offset >= 0 ? rope_cached(c, pos_offset + T, D, base) : NULL;
    if (tab) {
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if ((size_t)B * T * H * D > CPU_PAR_MIN)
        for (int bt = 0; bt < B * T; bt++) {
            const float *cs = tab + (size_t)(bt % T + pos_offset) * half * 2;
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
        return;
    }
    /* No table (short of memory, or a negative offset): the same
     * arithmetic, computed as we go. */
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

/* Query rows per block: the causal triangle is covered block by block, so
 * only columns j < (end of the block) are ever computed. */
#define ATT_BLOCK 64

/* Row i of scores s[0..i] (already scaled) -> probabilities in place; the
 * masked tail s[i+1..T) is set to zero. */
CPU_HOT static void softmax_causal_row(float *s, int i, int T)
{
    int n = i + 1;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < n; j++)
        mx = s[j] > mx ? s[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
        float e = cpu_expf(s[j] - mx);
        s[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j < n; j++)
        s[j] *= inv;
    for (int j = n; j < T; j++)
        s[j] = 0.0f;
}

/* dS = P * (dP - rowsum(P * dP)) * scale over j <= i, in place on dp. */
CPU_HOT static void softmax_bwd_row(float *dp, const float *p, int i, float scale)
{
    int n = i + 1;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n; j++)
        s += p[j] * dp[j];
#pragma omp simd
    for (int j = 0; j < n; j++)
        dp[j] = p[j] * (dp[j] - s) * scale;
}

void cpu_attention_fwd(kn_ctx *c, float *out, float *att, const float *q, const float *k,
                       const float *v, int B, int T, int Hq, int Hkv, int D, int ldq, int ldkv)
{
    if (B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || D <= 0)
        return;
    int group = Hq / Hkv;
    float scale = 1.0f / sqrtf((float)D);
    int ldo = Hq * D;
#pragma omp parallel for schedule(static) num_threads(c->n_threads)
    for (int bh = 0; bh < B * Hq; bh++) {
        int b = bh / Hq, h = bh % Hq, g = h / group;
        const float *qb = q + (size_t)b * T * ldq + (size_t)h * D;
        const float *kb = k + (size_t)b * T * ldkv + (size_t)g * D;
        const float *vb = v + (size_t)b * T * ldkv + (size_t)g * D;
        float *ob = out + (size_t)b * T * ldo + (size_t)h * D;
        float *ab = att + (size_t)bh * T * T;
        for (int i0 = 0; i0 < T; i0 += ATT_BLOCK) {
            int i1 = i0 + ATT_BLOCK < T ? i0 + ATT_BLOCK : T, rows = i1 - i0;
            float *a = ab + (size_t)i0 * T;
            /* S[i0:i1, 0:i1] = scale * Q[i0:i1] K[0:i1]^T */
            cpu_sgemm(CblasNoTrans, CblasTrans, rows, i1, D, scale, qb + (size_t)i0 * ldq, ldq,
                      kb, ldkv, 0.0f, a, T);
            for (int r = 0; r < rows; r++)
                softmax_causal_row(a + (size_t)r * T, i0 + r, T);
            /* O[i0:i1] = P[i0:i1, 0:i1] V[0:i1] */
            cpu_sgemm(CblasNoTrans, CblasNoTrans, rows, D, i1, 1.0f, a, T, vb, ldkv, 0.0f,
                      ob + (size_t)i0 * ldo, ldo);
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
    int ldo = Hq * D;
    int nt = c->n_threads < B * Hkv ? c->n_threads : B * Hkv;
#pragma omp parallel num_threads(nt)
    {
        /* dL/dP of one block of query rows, turned into dL/dS in place. If
         * the heap cannot spare ATT_BLOCK rows, one row on the stack does
         * the same work in blocks of one (slower; same maths, other rounding). */
        float *heap = malloc((size_t)ATT_BLOCK * T * sizeof *heap);
        float one_row[heap ? 1 : T];
        float *dp = heap ? heap : one_row;
        int bs = heap ? ATT_BLOCK : 1;
#pragma omp for schedule(static)
        for (int bg = 0; bg < B * Hkv; bg++) {
            int b = bg / Hkv, g = bg % Hkv;
            const float *kb = k + (size_t)b * T * ldkv + (size_t)g * D;
            const float *vb = v + (size_t)b * T * ldkv + (size_t)g * D;
            float *dkb = dk ? dk + (size_t)b * T * ldkv + (size_t)g * D : NULL;
            float *dvb = dv ? dv + (size_t)b * T * ldkv + (size_t)g * D : NULL;
            /* Query heads sharing this kv head, in order: dk/dv sum in a fixed order. */
            for (int h = g * group; h < (g + 1) * group; h++) {
                const float *qb = q + (size_t)b * T * ldq + (size_t)h * D;
                float *dqb = dq ? dq + (size_t)b * T * ldq + (size_t)h * D : NULL;
                const float *gb = dout + (size_t)b * T * ldo + (size_t)h * D;
                const float *ab = att + ((size_t)b * Hq + h) * T * T;
                for (int i0 = 0; i0 < T; i0 += bs) {
                    int i1 = i0 + bs < T ? i0 + bs : T, rows = i1 - i0;
                    const float *p = ab + (size_t)i0 * T;
                    const float *gi = gb + (size_t)i0 * ldo;
                    /* dV[0:i1] += P[i0:i1, 0:i1]^T dO[i0:i1] */
                    if (dvb)
                        cpu_sgemm(CblasTrans, CblasNoTrans, i1, D, rows, 1.0f, p, T, gi, ldo, 1.0f,
                                  dvb, ldkv);
                    if (!dqb && !dkb)
                        continue;
                    /* dP[i0:i1, 0:i1] = dO[i0:i1] V[0:i1]^T, then dS in place */
                    cpu_sgemm(CblasNoTrans, CblasTrans, rows, i1, D, 1.0f, gi, ldo, vb, ldkv, 0.0f,
                              dp, T);
                    for (int r = 0; r < rows; r++)
                        softmax_bwd_row(dp + (size_t)r * T, p + (size_t)r * T, i0 + r, scale);
                    /* Columns past each row's diagonal are not zero in dp (they hold
                     * dO V^T); zero them so the products below see the causal dS. */
                    for (int r = 0; r < rows; r++)
                        for (int j = i0 + r + 1; j < i1; j++)
                            dp[(size_t)r * T + j] = 0.0f;
                    /* dQ[i0:i1] += dS K[0:i1] */
                    if (dqb)
                        cpu_sgemm(CblasNoTrans, CblasNoTrans, rows, D, i1, 1.0f, dp, T, kb, ldkv,
                                  1.0f, dqb + (size_t)i0 * ldq, ldq);
                    /* dK[0:i1] += dS^T Q[i0:i1] */
                    if (dkb)
                        cpu_sgemm(CblasTrans, CblasNoTrans, i1, D, rows, 1.0f, dp, T,
                                  qb + (size_t)i0 * ldq, ldq, 1.0f, dkb, ldkv);
                }
            }
        }
        free(heap);
    }
}
