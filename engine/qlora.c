/* qlora.c — the NF4 base of method "qlora": quantise at load, matmuls.
 *
 * The model keeps its block linear weights out of the parameter buffer
 * when created with MODEL_FROZEN_NF4 and hands each to the store attached
 * here (linear.h's linear_store) as it is loaded or drawn: quantise it a
 * bounded slice at a time as the loader reads it, upload. Its matmuls on them come back here and go
 * to kn_nf4_matmul_*, dequantising on the fly. A 16-bit run whose type is
 * the compute dtype sends them to fwd16 / bwd16 instead: the weight is
 * dequantised into one 16-bit scratch (the largest weight long, made at
 * the first put, so the start's memory report holds it) and multiplied
 * by the 16-bit activations and gradients with kn_matmul16_*, fp32
 * accumulation — bitsandbytes' dequantize_4bit then a bf16 GEMM. Both
 * inputs are exact in 16 bits (the activations are stored so, the
 * weight is rounded to the compute dtype either way), so the two paths
 * differ only in the order of the sums. The model is known only
 * through linear.h. */
#include "qlora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf4.h"

/* Rows are quantised QL_CHUNK elements at a time (whole NF4 blocks):
 * the fp32 slice is the only full-precision copy, 4 MiB whatever the
 * tensor's size. */
#define QL_CHUNK ((size_t)1 << 20)

static int quantize(qlora_base *qb, size_t numel, const linear_src *src, nf4_host *q, ty_err *err)
{
    int rc = nf4_begin(q, numel, qb->double_quant, err);
    if (rc) return rc;
    size_t cap = numel < QL_CHUNK ? numel : QL_CHUNK;
    float *x = malloc((cap ? cap : 1) * sizeof *x);
    if (!x) return ty_err_set(err, TY_ENOMEM, "out of memory quantising %zu values", numel);
    for (size_t e0 = 0; e0 < numel && !rc; e0 += cap) {
        size_t n = numel - e0 < cap ? numel - e0 : cap;
        rc = src->read(src->ctx, e0, n, x, err);
        if (!rc) rc = nf4_add(q, e0, x, n, err);
    }
    free(x);
    return rc ? rc : nf4_end(q, err);
}

/* Whether the model's matmuls take the 16-bit path (its activations are
 * in the compute dtype, a 16-bit one). */
static int takes16(const qlora_base *qb)
{
    return qb->compute != KN_F32 && model_linear_dtype(qb->m) == qb->compute;
}

/* The 16-bit scratch, made once (0, or TY_ENOMEM with err set). */
static int alloc16(qlora_base *qb, ty_err *err)
{
    if (qb->w16 || !takes16(qb)) return 0;
    size_t bytes = qb->largest * kn_dtype_size(qb->compute);
    qb->w16 = kn_alloc(qb->kn, bytes ? bytes : 1);
    if (!qb->w16)
        return ty_err_set(err, TY_ENOMEM, "out of memory: %zu bytes for the 16-bit weight scratch",
                          bytes);
    return 0;
}

static int put(void *state, int k, const char *name, size_t numel, const linear_src *src,
               ty_err *err)
{
    qlora_base *qb = state;
    if (alloc16(qb, err)) return err->code;
    nf4_host q;
    int rc = quantize(qb, numel, src, &q, err);
    if (rc) {
        nf4_free(&q);
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return ty_err_field(err, rc, name, "tensor %s: %s", name, msg);
    }
    if (!qb->buf[k]) {
        size_t bytes = nf4_device_bytes(numel, qb->double_quant);
        qb->buf[k] = kn_alloc(qb->kn, bytes);
        if (!qb->buf[k]) {
            nf4_free(&q);
            return ty_err_set(err, TY_ENOMEM, "out of memory: %zu bytes for NF4 tensor %s", bytes,
                              name);
        }
        qb->bytes += bytes;
    }
    nf4_to_device(qb->kn, &q, qb->buf[k], &qb->w[k]);
    nf4_free(&q);
    return 0;
}

/* Weight k from its element `first` on: a row block of Phi-3's fused
 * qkv_proj / gate_up_proj is a view of the tensor quantised whole
 * (kn_nf4.first), its blocks and groups of 256 the whole tensor's, as
 * bitsandbytes quantises a Linear4bit. */
static kn_nf4 view(const qlora_base *qb, int k, size_t first)
{
    kn_nf4 w = qb->w[k];
    w.first += first;
    return w;
}

static void fwd(void *state, int k, size_t first, float *out, const float *x, const float *b, int N,
                int K, int M)
{
    qlora_base *qb = state;
    kn_nf4_matmul_fwd(qb->kn, qb->compute, out, x, view(qb, k, first), b, N, K, M);
}

static void bwd(void *state, int k, size_t first, float *dx, const float *dout, int N, int K, int M)
{
    qlora_base *qb = state;
    kn_nf4_matmul_bwd(qb->kn, qb->compute, dx, dout, view(qb, k, first), N, K, M);
}

/* Weight k from `first`, n elements, dequantised into the 16-bit scratch
 * (NULL after a failure, reported through the context). */
static const void *dequant16(qlora_base *qb, int k, size_t first, size_t n)
{
    ty_err err = {0};
    if (alloc16(qb, &err)) {
        kn_fail(qb->kn, err.code, "%s", err.msg);
        return NULL;
    }
    if (!qb->w16 || n > qb->largest) {
        kn_fail(qb->kn, TY_EINTERNAL, "qlora: no 16-bit scratch for %zu elements", n);
        return NULL;
    }
    kn_nf4_dequant(qb->kn, qb->w16, qb->compute, view(qb, k, first), n);
    return qb->w16;
}

static void fwd16(void *state, int k, size_t first, float *out, const void *x, const float *b,
                  int N, int K, int M)
{
    qlora_base *qb = state;
    if (N <= 0 || M <= 0) return;
    const void *w = dequant16(qb, k, first, (size_t)M * K);
    if (w) kn_matmul16_fwd(qb->kn, qb->compute, KN_F32, qb->compute, out, x, w, b, KN_F32, N, K, M);
}

static void bwd16(void *state, int k, size_t first, float *dx, const void *dout, int N, int K,
                  int M)
{
    qlora_base *qb = state;
    if (N <= 0 || M <= 0 || K <= 0 || !dx) return;
    const void *w = dequant16(qb, k, first, (size_t)M * K);
    if (w)
        kn_matmul16_bwd(qb->kn, qb->compute, qb->compute, qb->compute, dx, NULL, NULL, dout, NULL,
                        w, N, K, M);
}

static void base_free(void *state)
{
    qlora_base *qb = state;
    kn_free(qb->kn, qb->w16);
    for (int i = 0; qb->buf && i < qb->n; i++)
        kn_free(qb->kn, qb->buf[i]);
    free(qb->buf);
    free(qb->w);
    free(qb);
}

/* Elements of the model's largest block linear weight (a fused one
 * whole): what the 16-bit scratch holds. */
static size_t largest_linear(const struct model *m)
{
    size_t most = 0;
    linear_desc d;
    for (int l = 0; l < model_linear_config(m)->n_layer; l++)
        for (int s = 0; s < LS_N; s++)
            if (model_linear(m, l, s, &d) && (size_t)d.in * d.out > most)
                most = (size_t)d.in * d.out;
    return most;
}

int qlora_attach(struct model *m, int double_quant, kn_dtype compute, qlora_base **out, ty_err *err)
{
    *out = NULL;
    qlora_base *qb = calloc(1, sizeof *qb);
    if (!qb) return ty_err_set(err, TY_ENOMEM, "out of memory for the QLoRA base");
    qb->kn = model_linear_kn(m);
    qb->n = model_linear_n_stored(m);
    qb->double_quant = double_quant;
    qb->compute = compute;
    qb->w = calloc((size_t)(qb->n ? qb->n : 1), sizeof *qb->w);
    qb->buf = calloc((size_t)(qb->n ? qb->n : 1), sizeof *qb->buf);
    if (!qb->w || !qb->buf) {
        base_free(qb);
        return ty_err_set(err, TY_ENOMEM, "out of memory for the QLoRA base");
    }
    qb->m = m;
    qb->largest = largest_linear(m);
    linear_store s = {.state = qb,
                      .put = put,
                      .fwd = fwd,
                      .bwd = bwd,
                      .free = base_free,
                      .dt16 = compute,
                      .fwd16 = fwd16,
                      .bwd16 = bwd16};
    model_set_linear_store(m, &s);
    *out = qb;
    return 0;
}
