/* qlora.c — the NF4 base of method "qlora": quantise at load, matmuls.
 *
 * The model keeps its block linear weights out of the parameter buffer
 * when created with MODEL_FROZEN_NF4 and hands each to the store attached
 * here (linear.h's linear_store) as it is loaded or drawn: quantise it a
 * bounded slice at a time as the loader reads it, upload. Its matmuls on them come back here and go
 * to kn_nf4_matmul_*, dequantising on the fly. The model is known only
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

static int put(void *state, int k, const char *name, size_t numel, const linear_src *src,
               ty_err *err)
{
    qlora_base *qb = state;
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

static void base_free(void *state)
{
    qlora_base *qb = state;
    for (int i = 0; qb->buf && i < qb->n; i++)
        kn_free(qb->kn, qb->buf[i]);
    free(qb->buf);
    free(qb->w);
    free(qb);
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
    linear_store s = {qb, put, fwd, bwd, base_free};
    model_set_linear_store(m, &s);
    *out = qb;
    return 0;
}
