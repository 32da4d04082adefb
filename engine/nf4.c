/* nf4.c — bitsandbytes' NF4 quantisation (blocks of 64, double quant).
 *
 * The reference is bitsandbytes' quantize_4bit as its portable torch
 * implementation computes it (backends/default: the one its CPU build
 * runs), step by step in fp32:
 *   absmax = max |x| over the block;
 *   s = clamp(x * (1 / max(absmax, 1e-38)), -1, 1)   (a full block)
 *   s = clamp(x / max(absmax, 1e-38), -1, 1)          (a trailing partial
 *       block, whose stored absmax is the clamped one)
 *   code = the number of midpoints between consecutive levels below s
 *       (torch.bucketize: a value exactly on a midpoint takes the lower level).
 * Double quantisation (compress_statistics): offset = mean(absmax), and
 * absmax - offset is quantised the same way in blocks of 256 with the
 * dynamic 8-bit map — nearest level by midpoints, as bitsandbytes' CUDA
 * kernel and its portable implementation do. (Its x86 library's binary
 * search occasionally takes the second-nearest 8-bit code; tests/qlora
 * measures that against bitsandbytes itself.) The mean is summed in double
 * and rounded once; torch's fp32 cascade may differ in the last bit, which
 * is why the test hands bitsandbytes' own offset to the comparison.
 * Blocks are independent, so a tensor can be quantised a slice of whole
 * blocks at a time (nf4_begin / nf4_add / nf4_end: the loader's bounded
 * chunks); only the double quantisation waits for every absmax.
 * Compiled with -ffp-contract=off: every operation rounds on its own. */
#include "nf4.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

/* The midpoints of a sorted code book of len values, as torch computes
 * them: (code[:-1] + code[1:]) / 2 in fp32. */
static void midpoints(const float *code, int len, float *mid)
{
    for (int i = 0; i + 1 < len; i++)
        mid[i] = (code[i] + code[i + 1]) / 2.0f;
}

/* torch.bucketize(s, mid) with right=False: how many midpoints are < s. */
static int bucket(const float *mid, int nmid, float s)
{
    int lo = 0, hi = nmid; /* the answer lies in [lo, hi] */
    while (lo < hi) {
        int m = (lo + hi) / 2;
        if (mid[m] < s)
            lo = m + 1;
        else
            hi = m;
    }
    return lo;
}

/* Blockwise absmax quantisation of x[n] with block size bs against the
 * code book's midpoints: codes out[n], absmax am[ceil(n / bs)]. */
static void quantize_blocks(const float *x, size_t n, size_t bs, const float *mid, int nmid,
                            uint8_t *out, float *am)
{
    size_t nb = (n + bs - 1) / bs;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * bs, hi = lo + bs < n ? lo + bs : n;
        float a = 0.0f;
        for (size_t i = lo; i < hi; i++) {
            float v = fabsf(x[i]);
            if (v > a) a = v;
        }
        float ac = a > 1e-38f ? a : 1e-38f;
        int full = hi - lo == bs;
        float inv = 1.0f / ac;
        for (size_t i = lo; i < hi; i++) {
            float s = full ? x[i] * inv : x[i] / ac;
            s = s < -1.0f ? -1.0f : s > 1.0f ? 1.0f : s;
            out[i] = (uint8_t)bucket(mid, nmid, s);
        }
        am[b] = full ? a : ac;
    }
}

int nf4_begin(nf4_host *q, size_t n, int double_quant, ty_err *err)
{
    memset(q, 0, sizeof *q);
    q->n = n;
    q->nb = (n + KN_NF4_BLOCK - 1) / KN_NF4_BLOCK;
    q->double_quant = double_quant;
    q->codes = malloc((n + 1) / 2 + 1);
    q->absmax = malloc((q->nb ? q->nb : 1) * sizeof(float));
    if (!q->codes || !q->absmax) {
        nf4_free(q);
        return ty_err_set(err, TY_ENOMEM, "out of memory quantising %zu values to NF4", n);
    }
    return 0;
}

int nf4_add(nf4_host *q, size_t e0, const float *x, size_t cnt, ty_err *err)
{
    if (e0 % KN_NF4_BLOCK || e0 > q->n || cnt > q->n - e0 ||
        (cnt % KN_NF4_BLOCK && e0 + cnt != q->n))
        return ty_err_set(err, TY_EINTERNAL, "NF4: slice [%zu, +%zu) of %zu is not whole blocks",
                          e0, cnt, q->n);
    for (size_t i = 0; i < cnt; i++)
        if (!isfinite(x[i]))
            return ty_err_set(err, TY_EINVAL,
                              "element %zu is %s: NF4 quantisation needs finite weights", e0 + i,
                              isnan(x[i]) ? "NaN" : "infinite");
    uint8_t *c4 = malloc(cnt + 1);
    if (!c4) return ty_err_set(err, TY_ENOMEM, "out of memory quantising %zu values to NF4", cnt);
    float mid4[15];
    midpoints(kn_nf4_levels, 16, mid4);
    quantize_blocks(x, cnt, KN_NF4_BLOCK, mid4, 15, c4, q->absmax + e0 / KN_NF4_BLOCK);
    /* An odd count (the last slice) is padded with a 0, whose code is
     * level 0.0's; e0 is even, so bytes never straddle two slices. */
    c4[cnt] = (uint8_t)bucket(mid4, 15, 0.0f);
    for (size_t j = 0; j < (cnt + 1) / 2; j++)
        q->codes[e0 / 2 + j] = (uint8_t)(c4[2 * j] << 4 | c4[2 * j + 1]);
    free(c4);
    return 0;
}

int nf4_end(nf4_host *q, ty_err *err)
{
    if (!q->double_quant) return 0;
    float mid8[255];
    midpoints(kn_dyn8_map, 256, mid8);
    q->nb2 = (q->nb + KN_NF4_BLOCK2 - 1) / KN_NF4_BLOCK2;
    q->qabsmax = malloc(q->nb ? q->nb : 1);
    q->absmax2 = malloc((q->nb2 ? q->nb2 : 1) * sizeof(float));
    float *d = malloc((q->nb ? q->nb : 1) * sizeof(float));
    if (!q->qabsmax || !q->absmax2 || !d) {
        free(d);
        return ty_err_set(err, TY_ENOMEM, "out of memory double-quantising %zu absmax values",
                          q->nb);
    }
    double sum = 0;
    for (size_t b = 0; b < q->nb; b++)
        sum += q->absmax[b];
    q->offset = q->nb ? (float)(sum / (double)q->nb) : 0.0f;
    for (size_t b = 0; b < q->nb; b++)
        d[b] = q->absmax[b] - q->offset;
    quantize_blocks(d, q->nb, KN_NF4_BLOCK2, mid8, 255, q->qabsmax, q->absmax2);
    free(d);
    return 0;
}

int nf4_quantize(const float *x, size_t n, int double_quant, nf4_host *q, ty_err *err)
{
    int rc = nf4_begin(q, n, double_quant, err);
    if (!rc) rc = nf4_add(q, 0, x, n, err);
    if (!rc) rc = nf4_end(q, err);
    if (rc) nf4_free(q);
    return rc;
}

void nf4_free(nf4_host *q)
{
    if (!q) return;
    free(q->codes);
    free(q->absmax);
    free(q->qabsmax);
    free(q->absmax2);
    memset(q, 0, sizeof *q);
}

size_t nf4_device_bytes(size_t n, int double_quant)
{
    size_t nb = (n + KN_NF4_BLOCK - 1) / KN_NF4_BLOCK,
           nb2 = (nb + KN_NF4_BLOCK2 - 1) / KN_NF4_BLOCK2;
    size_t bytes = ALIGN64((n + 1) / 2);
    if (double_quant) return bytes + ALIGN64(nb) + ALIGN64(nb2 * sizeof(float));
    return bytes + ALIGN64(nb * sizeof(float));
}

void nf4_to_device(kn_ctx *kn, const nf4_host *q, void *dev, kn_nf4 *w)
{
    char *p = dev;
    memset(w, 0, sizeof *w);
    kn_to_device(kn, p, q->codes, (q->n + 1) / 2);
    w->codes = (const uint8_t *)p;
    p += ALIGN64((q->n + 1) / 2);
    if (q->double_quant) {
        kn_to_device(kn, p, q->qabsmax, q->nb);
        w->qabsmax = (const uint8_t *)p;
        p += ALIGN64(q->nb);
        kn_to_device(kn, p, q->absmax2, q->nb2 * sizeof(float));
        w->absmax2 = (const float *)p;
        w->offset = q->offset;
    } else {
        kn_to_device(kn, p, q->absmax, q->nb * sizeof(float));
        w->absmax = (const float *)p;
    }
}
