/* cpu_attention.c — rotary embeddings and causal grouped-query attention.
 *
 * Attention keeps no T x T matrix between the passes (FlashAttention-2's
 * scheme, on the CPU): the forward saves the output and one log-sum-exp
 * per (batch, head, row); the backward recomputes the probabilities tile by
 * tile as P = exp(S - lse) and uses D_i = rowsum(dO_i * O_i) in place of
 * rowsum(P_i * dP_i), so no tile needs its whole row. Saved memory is
 * O(B H T); scratch is one block of rows per thread in the forward and two
 * 64 x 64 tiles per thread in the backward.
 *
 * Work comes straight from the strided q/k/v rows, so GPT-2's fused qkv
 * buffer needs no split copy. The forward splits (b, query head) across
 * threads. The backward splits (b, kv head): all query heads that share a
 * kv head run on the same thread, so dk and dv are accumulated by exactly
 * one thread in a fixed order (no atomics, same bits for any thread count).
 * Products are single-threaded sgemm calls; tiles above the diagonal are
 * never computed, so about half of the T x T work is skipped; with a
 * sliding window, tiles left of it are skipped too. A soft-cap (Gemma 2)
 * caps each score in the forward; the backward recomputes the capped
 * score and multiplies dS by its derivative 1 - tanh^2.
 *
 * 16-bit q, k, v and out (the op's dtype): bf16 on a CPU with AMX goes
 * to cpu_attention16.c (the same scheme, the tile products on AMX, this
 * file's softmax and masks). Otherwise each head's T x D rows are widened
 * into per-thread fp32 copies (O(T D), still linear in T) and the fp32
 * algorithm runs on them; the forward's output rows are rounded once as
 * they are stored. lse and all gradients are fp32. */
#include "cpu.h"
#include "cpu_math.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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
    if (!tab) return NULL;
    free(st->rope_tab);
    st->rope_tab = tab;
    st->rope_pos = want;
    st->rope_D = D;
    st->rope_base = base;
    return tab;
}

/* One head's D values at element `off` of a dt tensor as fp32 (rope on
 * 16-bit q / k: widened on the stack, rotated, rounded back once). */
#define ROPE_MAX_D 1024
static inline float *head_in(float *buf, void *x, kn_dtype dt, size_t off, int D)
{
    return (float *)cpu_in(buf, x, dt, off, (size_t)D);
}

/* One RoPE job: rows (b, t) of x, rotated with the table's or the
 * given inverse frequencies' cos/sin. */
typedef struct rope_job {
    kn_dtype dt;
    void *x;
    const float *tab; /* the cos/sin table, or the inverse frequencies */
    int T, H, D, ld, pos_offset;
    float dir;
} rope_job;

static void rope_tab_rows(size_t lo, size_t hi, void *arg)
{
    const rope_job *j = arg;
    kn_dtype dt = j->dt;
    int H = j->H, D = j->D, half = D / 2;
    float dir = j->dir;
    for (size_t bt = lo; bt < hi; bt++) {
        const float *cs = j->tab + (size_t)((int)(bt % (size_t)j->T) + j->pos_offset) * half * 2;
        float hb[dt == KN_F32 ? 1 : ROPE_MAX_D];
        for (int h = 0; h < H; h++) {
            size_t off = bt * j->ld + (size_t)h * D;
            float *r = head_in(hb, j->x, dt, off, D);
            for (int i = 0; i < half; i++) {
                float co = cs[2 * i], si = dir * cs[2 * i + 1];
                float a = r[i], b = r[i + half];
                r[i] = a * co - b * si;
                r[i + half] = b * co + a * si;
            }
            cpu_out(j->x, dt, off, r, (size_t)D);
        }
    }
}

/* dir = +1 rotates by theta (forward), -1 by -theta (the transpose).
 * x is of type dt: activations, or gradients in fp32 or in the step's
 * 16-bit type (widened, rotated, rounded once). */
static void rope_apply(kn_ctx *c, kn_dtype dt, void *x, int B, int T, int H, int D, int ld,
                       float base, int pos_offset, float dir)
{
    int half = D / 2;
    if (B <= 0 || T <= 0 || H <= 0 || half <= 0) return;
    if (dt != KN_F32 && D > ROPE_MAX_D) {
        kn_fail(c, TY_EINVAL, "rope: head size %d over %d in 16 bits", D, ROPE_MAX_D);
        return;
    }
    const float *tab = pos_offset >= 0 ? rope_cached(c, pos_offset + T, D, base) : NULL;
    if (tab) {
        rope_job j = {dt, x, tab, T, H, D, ld, pos_offset, dir};
        cpu_pool_for(c, cpu_threads_for(c, (size_t)B * T * H * D), (size_t)B * T, rope_tab_rows,
                     &j);
        return;
    }
    /* No table (short of memory, or a negative offset): the same
     * arithmetic, computed as we go (16-bit rows widened per head). */
    float hb[dt == KN_F32 ? 1 : ROPE_MAX_D];
    for (int bt = 0; bt < B * T; bt++) {
        float pos = (float)(bt % T + pos_offset);
        for (int h = 0; h < H; h++) {
            size_t off = (size_t)bt * ld + (size_t)h * D;
            float *r = head_in(hb, x, dt, off, D);
            for (int i = 0; i < half; i++) {
                float ang = pos * (1.0f / powf(base, (float)(2 * i) / (float)D));
                float co = cosf(ang), si = dir * sinf(ang);
                float a = r[i], b = r[i + half];
                r[i] = a * co - b * si;
                r[i + half] = b * co + a * si;
            }
            cpu_out(x, dt, off, r, (size_t)D);
        }
    }
}

void cpu_rope_fwd(kn_ctx *c, kn_dtype dt, void *x, int B, int T, int H, int D, int ld, float base,
                  int pos_offset)
{
    rope_apply(c, dt, x, B, T, H, D, ld, base, pos_offset, 1.0f);
}

void cpu_rope_bwd(kn_ctx *c, kn_dtype dt, void *dx, int B, int T, int H, int D, int ld, float base,
                  int pos_offset)
{
    rope_apply(c, dt, dx, B, T, H, D, ld, base, pos_offset, -1.0f);
}

static void rope_freq_rows32(size_t lo, size_t hi, void *arg)
{
    const rope_job *j = arg;
    int H = j->H, D = j->D, half = D / 2;
    float *xf = j->x, dir = j->dir;
    const float *inv = j->tab;
    for (size_t bt = lo; bt < hi; bt++) {
        float pos = (float)((int)(bt % (size_t)j->T) + j->pos_offset);
        for (int i = 0; i < half; i++) {
            float ang = pos * inv[i];
            float co = cosf(ang), si = dir * sinf(ang);
            for (int h = 0; h < H; h++) {
                float *r = xf + bt * j->ld + (size_t)h * D;
                float a = r[i], b = r[i + half];
                r[i] = a * co - b * si;
                r[i + half] = b * co + a * si;
            }
        }
    }
}

/* 16-bit: the same angles, the row's heads widened on the stack. */
static void rope_freq_rows16(size_t lo, size_t hi, void *arg)
{
    const rope_job *j = arg;
    kn_dtype dt = j->dt;
    int H = j->H, D = j->D, half = D / 2;
    float dir = j->dir;
    const float *inv = j->tab;
    for (size_t bt = lo; bt < hi; bt++) {
        float pos = (float)((int)(bt % (size_t)j->T) + j->pos_offset), hb[ROPE_MAX_D];
        for (int h = 0; h < H; h++) {
            size_t off = bt * j->ld + (size_t)h * D;
            float *r = head_in(hb, j->x, dt, off, D);
            for (int i = 0; i < half; i++) {
                float ang = pos * inv[i];
                float co = cosf(ang), si = dir * sinf(ang);
                float a = r[i], b = r[i + half];
                r[i] = a * co - b * si;
                r[i + half] = b * co + a * si;
            }
            cpu_out(j->x, dt, off, r, (size_t)D);
        }
    }
}

/* Given inverse frequencies (scaled RoPE): the angle pos * inv_freq[i] in
 * fp32 as Hugging Face computes it, cos/sin per (row, i), shared by the
 * heads. No table: the frequencies are the caller's, so a cache would need
 * their contents as its key. */
static void rope_freq_apply(kn_ctx *c, kn_dtype dt, void *x, int B, int T, int H, int D, int ld,
                            const float *inv, int pos_offset, float dir)
{
    int half = D / 2;
    if (B <= 0 || T <= 0 || H <= 0 || half <= 0) return;
    if (dt != KN_F32 && D > ROPE_MAX_D) {
        kn_fail(c, TY_EINVAL, "rope: head size %d over %d in 16 bits", D, ROPE_MAX_D);
        return;
    }
    rope_job j = {dt, x, inv, T, H, D, ld, pos_offset, dir};
    cpu_pool_for(c, cpu_threads_for(c, (size_t)B * T * H * D), (size_t)B * T,
                 dt == KN_F32 ? rope_freq_rows32 : rope_freq_rows16, &j);
}

void cpu_rope_freq_fwd(kn_ctx *c, kn_dtype dt, void *x, int B, int T, int H, int D, int ld,
                       const float *inv_freq, int pos_offset)
{
    rope_freq_apply(c, dt, x, B, T, H, D, ld, inv_freq, pos_offset, 1.0f);
}

void cpu_rope_freq_bwd(kn_ctx *c, kn_dtype dt, void *dx, int B, int T, int H, int D, int ld,
                       const float *inv_freq, int pos_offset)
{
    rope_freq_apply(c, dt, dx, B, T, H, D, ld, inv_freq, pos_offset, -1.0f);
}

/* ---- attention -------------------------------------------------------- */

/* Query rows per block (forward and backward) and key columns per tile
 * (backward). */
#define ATT_BLOCK 64

/* The two Gemma options (kernels.h): scores soft-capped as
 * cap * tanh(s / cap) (Gemma 2's attn_logit_softcapping), and a sliding
 * window, row i seeing keys (i - window, i] only (cpu_att_lo, cpu.h).
 * Both 0 = off. */

/* Scores s[lo..i] (already scaled) of row i -> capped when cap > 0, then
 * probabilities in place (0 outside [lo, i], up to width w); returns the
 * row's log-sum-exp, the one number the backward needs to rebuild the row
 * (P_ij = exp(s_ij - lse_i)). */
CPU_HOT float cpu_att_softmax_row(float *s, int lo, int i, int w, float cap)
{
    if (cap > 0.0f) {
        float inv_cap = 1.0f / cap;
        for (int j = lo; j <= i; j++)
            s[j] = cap * tanhf(s[j] * inv_cap);
    }
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = lo; j <= i; j++)
        mx = s[j] > mx ? s[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = lo; j <= i; j++) {
        float e = cpu_expf(s[j] - mx);
        s[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = lo; j <= i; j++)
        s[j] *= inv;
    for (int j = 0; j < lo; j++)
        s[j] = 0.0f;
    for (int j = i + 1; j < w; j++)
        s[j] = 0.0f; /* the causal mask inside the block */
    return mx + logf(sum);
}

/* Rows [0, T) of one head (element `off`, row stride ld) of a dt tensor
 * as fp32: the tensor itself for fp32 (*ldf = ld), else widened into buf
 * (T x D, *ldf = D). */
const float *cpu_att_head_rows(float *buf, const void *x, kn_dtype dt, size_t off, int T, int D,
                               int ld, int *ldf)
{
    if (dt == KN_F32) {
        *ldf = ld;
        return (const float *)x + off;
    }
    for (int t = 0; t < T; t++)
        cpu_convert_n(buf + (size_t)t * D, KN_F32, (const uint16_t *)x + off + (size_t)t * ld, dt,
                      (size_t)D);
    *ldf = D;
    return buf;
}

/* One attention job's operands (forward or backward). */
typedef struct att_job {
    kn_dtype dt;
    void *out;
    float *lse, *dq, *dk, *dv;
    const void *q, *k, *v, *cout;
    const float *dout, *clse;
    int B, Tq, Tk, Hq, Hkv, D, ldq, ldkv, group, q0, ldo, br, window;
    float scale, softcap;
    size_t wide;
    atomic_int failed;
} att_job;

/* The forward of (batch, head) bh: its row blocks against their keys,
 * in the per-thread scratch a (br x Tk scores, then the widened rows). */
static void att_fwd_head(const att_job *j, float *a, int bh)
{
    kn_dtype dt = j->dt;
    void *out = j->out;
    const void *q = j->q, *k = j->k, *v = j->v;
    int Tq = j->Tq, Tk = j->Tk, Hq = j->Hq, D = j->D, ldq = j->ldq, ldkv = j->ldkv;
    int group = j->group, q0 = j->q0, ldo = j->ldo, br = j->br, window = j->window;
    float scale = j->scale, softcap = j->softcap;
    float *wq = a + (size_t)br * Tk, *wk = wq + (size_t)Tq * D, *wv = wk + (size_t)Tk * D,
          *wo = wv + (size_t)Tk * D;
    int b = bh / Hq, h = bh % Hq, g = h / group, lq, lkv, lkv2;
    const float *qb =
        cpu_att_head_rows(wq, q, dt, (size_t)b * Tq * ldq + (size_t)h * D, Tq, D, ldq, &lq);
    const float *kb =
        cpu_att_head_rows(wk, k, dt, (size_t)b * Tk * ldkv + (size_t)g * D, Tk, D, ldkv, &lkv);
    const float *vb =
        cpu_att_head_rows(wv, v, dt, (size_t)b * Tk * ldkv + (size_t)g * D, Tk, D, ldkv, &lkv2);
    size_t oo = (size_t)b * Tq * ldo + (size_t)h * D;
    float *lb = j->lse + (size_t)bh * Tq;
    for (int r0 = 0; r0 < Tq; r0 += br) {
        int r1 = r0 + br < Tq ? r0 + br : Tq, rows = r1 - r0;
        int i0 = q0 + r0, i1 = q0 + r1; /* the block's positions */
        /* fp32: straight into out; 16-bit: a block of rows, rounded below */
        float *ob = dt == KN_F32 ? (float *)out + oo + (size_t)r0 * ldo : wo;
        int lob = dt == KN_F32 ? ldo : D;
        /* Columns [j0, i1): the block's first row's window onwards. */
        int j0 = cpu_att_lo(i0, window), w = i1 - j0;
        /* S[r0:r1, j0:i1] = scale * Q[r0:r1] K[j0:i1]^T */
        cpu_sgemm(CblasNoTrans, CblasTrans, rows, w, D, scale, qb + (size_t)r0 * lq, lq,
                  kb + (size_t)j0 * lkv, lkv, 0.0f, a, Tk);
        for (int r = 0; r < rows; r++) {
            int i = i0 + r;
            lb[r0 + r] = cpu_att_softmax_row(a + (size_t)r * Tk, cpu_att_lo(i, window) - j0, i - j0,
                                             w, softcap);
        }
        /* O[r0:r1] = P[r0:r1, j0:i1] V[j0:i1] */
        cpu_sgemm(CblasNoTrans, CblasNoTrans, rows, D, w, 1.0f, a, Tk, vb + (size_t)j0 * lkv2, lkv2,
                  0.0f, ob, lob);
        for (int r = 0; dt != KN_F32 && r < rows; r++)
            cpu_out(out, dt, oo + (size_t)(r0 + r) * ldo, ob + (size_t)r * D, (size_t)D);
    }
}

/* This thread's share of the (batch, head) pairs, as schedule(static). */
static void att_fwd_job(int tid, int nt, void *arg)
{
    att_job *j = arg;
    /* One block of score rows, br x Tk: O(Tk) per thread. */
    float *a = malloc(((size_t)j->br * j->Tk + j->wide) * sizeof *a);
    if (!a) {
        atomic_store(&j->failed, 1);
        return;
    }
    size_t lo, hi;
    cpu_pool_static((size_t)j->B * j->Hq, tid, nt, &lo, &hi);
    for (size_t bh = lo; bh < hi; bh++)
        att_fwd_head(j, a, (int)bh);
    free(a);
}

/* Multiply-adds (B Hq Tq Tk D) below which the forward runs on one
 * thread: a decode step over a short cache is a few microseconds, less
 * than waking the threads. */
#define ATT_PAR_MIN 65536

/* The forward for Tq query rows that are the last Tq of Tk positions
 * (kn_attention_kv_fwd; Tq == Tk is kn_attention_fwd): q [B, Tq, Hq, D],
 * k, v [B, Tk, Hkv, D], out [B, Tq, Hq, D], lse [B, Hq, Tq]. Query row r
 * sits at position i = q0 + r, q0 = Tk - Tq, and sees keys [lo(i), i]. */
static void attention_rows(kn_ctx *c, kn_dtype dt, void *out, float *lse, const void *q,
                           const void *k, const void *v, int B, int Tq, int Tk, int Hq, int Hkv,
                           int D, int ldq, int ldkv, float scale, float softcap, int window)
{
    if (B <= 0 || Tq <= 0 || Tk < Tq || Hq <= 0 || Hkv <= 0 || D <= 0) return;
    int group = Hq / Hkv, q0 = Tk - Tq;
    if (scale == 0.0f) scale = 1.0f / sqrtf((float)D);
    int ldo = Hq * D, br = Tq < ATT_BLOCK ? Tq : ATT_BLOCK;
    int nt = c->n_threads < B * Hq ? c->n_threads : B * Hq;
    if ((double)B * Hq * Tq * Tk * D < ATT_PAR_MIN) nt = 1;
    if (dt == KN_BF16 && cpu_att16_on()) {
        cpu_att_args x = {
            .D = D, .ldq = ldq, .ldkv = ldkv, .window = window, .scale = scale, .cap = softcap};
        cpu_att16_fwd(c, out, lse, q, k, v, B, Tq, Tk, Hq, Hkv, ldq, ldkv, &x, nt);
        return;
    }
    size_t wide = dt == KN_F32 ? 0 : ((size_t)Tq + 2 * (size_t)Tk) * D + (size_t)br * D;
    att_job j = {.dt = dt,
                 .out = out,
                 .lse = lse,
                 .q = q,
                 .k = k,
                 .v = v,
                 .B = B,
                 .Tq = Tq,
                 .Tk = Tk,
                 .Hq = Hq,
                 .D = D,
                 .ldq = ldq,
                 .ldkv = ldkv,
                 .group = group,
                 .q0 = q0,
                 .ldo = ldo,
                 .br = br,
                 .window = window,
                 .scale = scale,
                 .softcap = softcap,
                 .wide = wide};
    atomic_init(&j.failed, 0);
    cpu_pool_run(c, nt, att_fwd_job, &j);
    int failed = j.failed;
    if (failed)
        kn_fail(c, TY_ENOMEM, "attention forward: out of memory for %d x %d scores", br, Tk);
}

void cpu_attention_fwd(kn_ctx *c, kn_dtype dt, void *out, float *lse, const void *q, const void *k,
                       const void *v, int B, int T, int Hq, int Hkv, int D, int ldq, int ldkv,
                       float scale, float softcap, int window)
{
    attention_rows(c, dt, out, lse, q, k, v, B, T, T, Hq, Hkv, D, ldq, ldkv, scale, softcap,
                   window);
}

void cpu_attention_kv_fwd(kn_ctx *c, kn_dtype dt, void *out, float *lse, const void *q,
                          const void *k, const void *v, int B, int Tq, int Tk, int Hq, int Hkv,
                          int D, int ldq, int ldkv, float scale, float softcap, int window)
{
    if (Tq > Tk) {
        kn_fail(c, TY_EINVAL, "attention: %d query rows over %d positions", Tq, Tk);
        return;
    }
    attention_rows(c, dt, out, lse, q, k, v, B, Tq, Tk, Hq, Hkv, D, ldq, ldkv, scale, softcap,
                   window);
}

/* P = exp(capped(S) - lse_i) in place over the tile s (rows [i0, i0 +
 * rows) against key columns [j0, j0 + cols), S already scaled), zero
 * outside the mask; tg gets the soft-cap's derivative 1 - tanh^2. */
CPU_HOT void cpu_att_bwd_probs(float *s, float *tg, const float *lb, int i0, int rows, int j0,
                               int cols, const cpu_att_args *x)
{
    const int ld = ATT_BLOCK;
    float cap = x->cap;
    for (int r = 0; r < rows; r++) {
        float *pr = s + (size_t)r * ld, l = lb[i0 + r];
        int hi = i0 + r - j0 + 1; /* visible columns [lo, hi) of this row */
        int lo = cpu_att_lo(i0 + r, x->window) - j0;
        if (hi > cols) hi = cols;
        if (lo < 0) lo = 0;
        if (hi < lo) hi = lo;
        if (cap > 0.0f) {
            float *tr = tg + (size_t)r * ld, inv_cap = 1.0f / cap;
            for (int j = lo; j < hi; j++) {
                float t = tanhf(pr[j] * inv_cap);
                pr[j] = cap * t;
                tr[j] = 1.0f - t * t;
            }
        }
        for (int j = 0; j < lo; j++)
            pr[j] = 0.0f;
#pragma omp simd
        for (int j = lo; j < hi; j++)
            pr[j] = cpu_expf(pr[j] - l);
        for (int j = hi; j < cols; j++)
            pr[j] = 0.0f;
    }
}

/* dS = P (dP - D_i) scale in place over dp (zero where P is), times
 * 1 - tanh^2 under the soft-cap. */
CPU_HOT void cpu_att_bwd_dscores(const float *s, float *dp, const float *tg, const float *db,
                                 int i0, int rows, int cols, const cpu_att_args *x)
{
    const int ld = ATT_BLOCK;
    float cap = x->cap, scale = x->scale;
    for (int r = 0; r < rows; r++) {
        const float *pr = s + (size_t)r * ld;
        float *dr = dp + (size_t)r * ld, di = db[i0 + r];
#pragma omp simd
        for (int j = 0; j < cols; j++)
            dr[j] = pr[j] * (dr[j] - di) * scale;
        if (cap > 0.0f) {
            const float *tr = tg + (size_t)r * ld;
            for (int j = 0; j < cols; j++)
                if (pr[j] != 0.0f) dr[j] *= tr[j];
        }
    }
}

/* One tile of the backward: rows [i0, i0+rows) of query head qb against key
 * columns [j0, j0+cols). s, dp and tg are ATT_BLOCK x ATT_BLOCK scratch
 * (tg: the soft-cap's derivative 1 - tanh^2 of each recomputed score). */
static void att_bwd_tile(float *s, float *dp, float *tg, const float *qb, const float *kb,
                         const float *vb, const float *gb, const float *lb, const float *db,
                         float *dqb, float *dkb, float *dvb, int i0, int rows, int j0, int cols,
                         const cpu_att_args *x)
{
    const int ld = ATT_BLOCK;
    int D = x->D, lq = x->lq, lkv = x->lkv, ldq = x->ldq, ldkv = x->ldkv, ldo = x->ldo;
    const float *qi = qb + (size_t)i0 * lq, *gi = gb + (size_t)i0 * ldo;
    const float *kj = kb + (size_t)j0 * lkv, *vj = vb + (size_t)j0 * lkv;
    /* P = exp(capped(scale Q_i K_j^T) - lse_i), zero outside the mask */
    cpu_sgemm(CblasNoTrans, CblasTrans, rows, cols, D, x->scale, qi, lq, kj, lkv, 0.0f, s, ld);
    cpu_att_bwd_probs(s, tg, lb, i0, rows, j0, cols, x);
    /* dV_j += P^T dO_i */
    if (dvb)
        cpu_sgemm(CblasTrans, CblasNoTrans, cols, D, rows, 1.0f, s, ld, gi, ldo, 1.0f,
                  dvb + (size_t)j0 * ldkv, ldkv);
    if (!dqb && !dkb) return;
    /* dP = dO_i V_j^T, then dS */
    cpu_sgemm(CblasNoTrans, CblasTrans, rows, cols, D, 1.0f, gi, ldo, vj, lkv, 0.0f, dp, ld);
    cpu_att_bwd_dscores(s, dp, tg, db, i0, rows, cols, x);
    /* dQ_i += dS K_j;  dK_j += dS^T Q_i */
    if (dqb)
        cpu_sgemm(CblasNoTrans, CblasNoTrans, rows, D, cols, 1.0f, dp, ld, kj, lkv, 1.0f,
                  dqb + (size_t)i0 * ldq, ldq);
    if (dkb)
        cpu_sgemm(CblasTrans, CblasNoTrans, cols, D, rows, 1.0f, dp, ld, qi, lq, 1.0f,
                  dkb + (size_t)j0 * ldkv, ldkv);
}

/* D_i = sum_d dO[i,d] O[i,d] for the T rows of one head (O's row stride lo). */
CPU_HOT void cpu_att_rowdot(float *dst, const float *gb, const float *ob, int T, int D, int ldo,
                            int lo)
{
    for (int i = 0; i < T; i++) {
        const float *g = gb + (size_t)i * ldo, *o = ob + (size_t)i * lo;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int d = 0; d < D; d++)
            s += g[d] * o[d];
        dst[i] = s;
    }
}

/* The backward of (batch, kv head) bg, in the per-thread scratch s: three
 * tiles, one D_i vector and, for 16-bit activations, four widened heads. */
static void att_bwd_group(const att_job *j, float *s, int bg)
{
    kn_dtype dt = j->dt;
    const void *q = j->q, *k = j->k, *v = j->v, *out = j->cout;
    const float *dout = j->dout, *lse = j->clse;
    float *dq = j->dq, *dk = j->dk, *dv = j->dv;
    int T = j->Tq, Hq = j->Hq, Hkv = j->Hkv, D = j->D, ldq = j->ldq, ldkv = j->ldkv;
    int group = j->group, ldo = j->ldo, window = j->window;
    float scale = j->scale, softcap = j->softcap;
    size_t tile = (size_t)ATT_BLOCK * ATT_BLOCK;
    float *dp = s + tile, *tg = dp + tile, *db = tg + tile;
    float *wq = db + T, *wk = wq + (size_t)T * D, *wv = wk + (size_t)T * D,
          *wo = wv + (size_t)T * D;
    int b = bg / Hkv, g = bg % Hkv, lkv, lkv2;
    const float *kb =
        cpu_att_head_rows(wk, k, dt, (size_t)b * T * ldkv + (size_t)g * D, T, D, ldkv, &lkv);
    const float *vb =
        cpu_att_head_rows(wv, v, dt, (size_t)b * T * ldkv + (size_t)g * D, T, D, ldkv, &lkv2);
    float *dkb = dk ? dk + (size_t)b * T * ldkv + (size_t)g * D : NULL;
    float *dvb = dv ? dv + (size_t)b * T * ldkv + (size_t)g * D : NULL;
    /* Query heads sharing this kv head, then row blocks, then key
         * tiles, in order: dk/dv sum in a fixed order. */
    for (int h = g * group; h < (g + 1) * group; h++) {
        int lq, lo;
        const float *qb =
            cpu_att_head_rows(wq, q, dt, (size_t)b * T * ldq + (size_t)h * D, T, D, ldq, &lq);
        float *dqb = dq ? dq + (size_t)b * T * ldq + (size_t)h * D : NULL;
        const float *gb = dout + (size_t)b * T * ldo + (size_t)h * D;
        const float *ob =
            cpu_att_head_rows(wo, out, dt, (size_t)b * T * ldo + (size_t)h * D, T, D, ldo, &lo);
        const float *lb = lse + ((size_t)b * Hq + h) * T;
        cpu_att_rowdot(db, gb, ob, T, D, ldo, lo);
        cpu_att_args x = {.D = D,
                          .lq = lq,
                          .lkv = lkv,
                          .ldq = ldq,
                          .ldkv = ldkv,
                          .ldo = ldo,
                          .window = window,
                          .scale = scale,
                          .cap = softcap};
        for (int i0 = 0; i0 < T; i0 += ATT_BLOCK) {
            int rows = T - i0 < ATT_BLOCK ? T - i0 : ATT_BLOCK;
            /* Tiles left of the block's first window see nothing. */
            int jstart = cpu_att_lo(i0, window) / ATT_BLOCK * ATT_BLOCK;
            for (int j0 = jstart; j0 < i0 + rows; j0 += ATT_BLOCK) {
                int cols = i0 + rows - j0 < ATT_BLOCK ? i0 + rows - j0 : ATT_BLOCK;
                att_bwd_tile(s, dp, tg, qb, kb, vb, gb, lb, db, dqb, dkb, dvb, i0, rows, j0, cols,
                             &x);
            }
        }
    }
}

/* This thread's share of the (batch, kv head) pairs, as schedule(static). */
static void att_bwd_job(int tid, int nt, void *arg)
{
    att_job *j = arg;
    int T = j->Tq, D = j->D;
    /* Three tiles (P, dS, the soft-cap's derivative) and one D_i vector
     * per thread; with 16-bit activations also one head's q, k, v, out
     * widened (4 T x D). */
    size_t wide = j->dt == KN_F32 ? 0 : (size_t)4 * T * D, tile = (size_t)ATT_BLOCK * ATT_BLOCK;
    float *s = malloc((3 * tile + (size_t)T + wide) * sizeof *s);
    if (!s) {
        atomic_store(&j->failed, 1);
        return;
    }
    size_t lo, hi;
    cpu_pool_static((size_t)j->B * j->Hkv, tid, nt, &lo, &hi);
    for (size_t bg = lo; bg < hi; bg++)
        att_bwd_group(j, s, (int)bg);
    free(s);
}

/* The backward into fp32 dq, dk, dv (any may be NULL). */
static void attention_bwd_f32(kn_ctx *c, kn_dtype dt, float *dq, float *dk, float *dv,
                              const void *dout_in, kn_dtype dout_dt, const void *out,
                              const float *lse, const void *q, const void *k, const void *v, int B,
                              int T, int Hq, int Hkv, int D, int ldq, int ldkv, float scale,
                              float softcap, int window)
{
    /* Written: the views are cleared, then the jobs add into them (the
     * same bits as a caller's clear). */
    size_t rows = (size_t)B * T;
    for (size_t r = 0; r < rows; r++) {
        if (dq) memset(dq + r * ldq, 0, (size_t)Hq * D * sizeof *dq);
        if (dk) memset(dk + r * ldkv, 0, (size_t)Hkv * D * sizeof *dk);
        if (dv) memset(dv + r * ldkv, 0, (size_t)Hkv * D * sizeof *dv);
    }
    int group = Hq / Hkv;
    if (scale == 0.0f) scale = 1.0f / sqrtf((float)D);
    int ldo = Hq * D;
    int nt = c->n_threads < B * Hkv ? c->n_threads : B * Hkv;
    /* A 16-bit backward reads dout as dt holds it (kernels.h): rounded
     * from fp32, or widened from dt. */
    size_t ng = (size_t)B * T * ldo;
    float *gbuf = dt == KN_F32 ? NULL : malloc(ng * sizeof *gbuf);
    if (dt != KN_F32 && !gbuf) {
        kn_fail(c, TY_ENOMEM, "attention backward: out of memory for the rounded dout");
        return;
    }
    const float *dout = cpu_grad_in_as(gbuf, dout_in, dout_dt, dt, 0, ng);
    if (dt == KN_BF16 && cpu_att16_on()) { /* dout exact in bf16 now */
        cpu_att_args x = {
            .D = D, .ldq = ldq, .ldkv = ldkv, .window = window, .scale = scale, .cap = softcap};
        cpu_att16_bwd(c, dq, dk, dv, dout, out, lse, q, k, v, B, T, Hq, Hkv, &x, nt);
        free(gbuf);
        return;
    }
    att_job j = {.dt = dt,
                 .dq = dq,
                 .dk = dk,
                 .dv = dv,
                 .dout = dout,
                 .cout = out,
                 .clse = lse,
                 .q = q,
                 .k = k,
                 .v = v,
                 .B = B,
                 .Tq = T,
                 .Hq = Hq,
                 .Hkv = Hkv,
                 .D = D,
                 .ldq = ldq,
                 .ldkv = ldkv,
                 .group = group,
                 .ldo = ldo,
                 .window = window,
                 .scale = scale,
                 .softcap = softcap};
    atomic_init(&j.failed, 0);
    cpu_pool_run(c, nt, att_bwd_job, &j);
    free(gbuf);
    int failed = j.failed;
    if (failed) kn_fail(c, TY_ENOMEM, "attention backward: out of memory for its tiles");
}

/* Rows of fp32 gradients narrowed into their 16-bit outputs, in parallel
 * over rows: row r of output i is w[i] elements at r * ld[i] of both. */
typedef struct narrow_job {
    void *dst[3];
    const float *src[3];
    size_t ld[3], w[3], rows;
    kn_dtype dt;
} narrow_job;

static void narrow_rows(size_t a, size_t b, void *arg)
{
    const narrow_job *j = arg;
    for (int i = 0; i < 3; i++)
        for (size_t r = a; j->dst[i] && r < b; r++)
            cpu_convert_n((uint16_t *)j->dst[i] + r * j->ld[i], j->dt, j->src[i] + r * j->ld[i],
                          KN_F32, j->w[i]);
}

void cpu_attention_bwd(kn_ctx *c, kn_dtype dt, kn_dtype g_dt, void *dq, void *dk, void *dv,
                       const void *dout, kn_dtype dout_dt, const void *out, const float *lse,
                       const void *q, const void *k, const void *v, int B, int T, int Hq, int Hkv,
                       int D, int ldq, int ldkv, float scale, float softcap, int window)
{
    if (B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || D <= 0) return;
    if (!dq && !dk && !dv) return;
    if (!kn_grad_dtype_ok(c, dt, g_dt, "attention backward")) return;
    if (!kn_grad_dtype_ok(c, dt, dout_dt, "attention backward")) return;
    if (g_dt == KN_F32) {
        attention_bwd_f32(c, dt, dq, dk, dv, dout, dout_dt, out, lse, q, k, v, B, T, Hq, Hkv, D,
                          ldq, ldkv, scale, softcap, window);
        return;
    }
    /* 16-bit gradients: the fp32 ones into a mirror of the outputs (the
     * same strides; one buffer at the same offsets where the outputs
     * share rows, as GPT-2's q, k, v thirds do), then narrowed row by
     * row: each rounded once from its fp32 sum. */
    size_t rows = (size_t)B * T;
    narrow_job j = {{dq, dk, dv},
                    {NULL, NULL, NULL},
                    {(size_t)ldq, (size_t)ldkv, (size_t)ldkv},
                    {(size_t)Hq * D, (size_t)Hkv * D, (size_t)Hkv * D},
                    rows,
                    g_dt};
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    size_t sum = 0, ext[3];
    for (int i = 0; i < 3; i++) {
        ext[i] = j.dst[i] ? (rows - 1) * j.ld[i] + j.w[i] : 0;
        if (!j.dst[i]) continue;
        uintptr_t a = (uintptr_t)j.dst[i];
        lo = a < lo ? a : lo;
        hi = a + ext[i] * 2 > hi ? a + ext[i] * 2 : hi;
        sum += ext[i];
    }
    int shared = (hi - lo) / 2 <= sum;
    float *buf = malloc((shared ? (hi - lo) / 2 : sum) * sizeof *buf);
    if (!buf) {
        kn_fail(c, TY_ENOMEM, "attention backward: out of memory for the fp32 gradients");
        return;
    }
    float *t[3] = {NULL, NULL, NULL};
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        if (!j.dst[i]) continue;
        t[i] = shared ? buf + ((uintptr_t)j.dst[i] - lo) / 2 : buf + at;
        at += ext[i];
        j.src[i] = t[i];
    }
    attention_bwd_f32(c, dt, t[0], t[1], t[2], dout, dout_dt, out, lse, q, k, v, B, T, Hq, Hkv, D,
                      ldq, ldkv, scale, softcap, window);
    cpu_pool_for(c, cpu_threads_for(c, sum), rows, narrow_rows, &j);
    free(buf);
}
