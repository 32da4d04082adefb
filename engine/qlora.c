/* qlora.c — the NF4 base of method "qlora": layout, quantise at load.
 *
 * model.c asks three things of this file: which tensors are quantised
 * (qlora_layout, once, before the parameter buffer is allocated), what
 * to do with a tensor's values when they are loaded or drawn
 * (qlora_store: quantise, upload, drop the fp32 copy), and whether an
 * unknown tensor name means "already quantised by another tool"
 * (qlora_foreign_quant). The matmuls read m->qb->w[] through kn_nf4_*. */
#include "qlora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "nf4.h"

/* The linear weights of layer l, in layer_ix terms. */
static void linear_ix(const layer_ix *L, int out[8])
{
    int v[8] = {L->attn_w, L->q_w, L->k_w, L->v_w, L->o_w, L->fc_w, L->up_w, L->proj_w};
    memcpy(out, v, sizeof v);
}

int qlora_layout(model *m, size_t *floats, ty_err *err)
{
    qlora_base *qb = calloc(1, sizeof *qb);
    if (!qb) return ty_err_set(err, TY_ENOMEM, "out of memory for the QLoRA base");
    m->qb = qb;
    qb->double_quant = 1;
    qb->compute = KN_F32;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        int ix[8];
        linear_ix(&m->L[l], ix);
        for (int k = 0; k < 8; k++)
            if (ix[k] >= 0) m->t[ix[k]].q4 = ++qb->n;
    }
    qb->w = calloc((size_t)(qb->n ? qb->n : 1), sizeof *qb->w);
    qb->buf = calloc((size_t)(qb->n ? qb->n : 1), sizeof *qb->buf);
    if (!qb->w || !qb->buf) return ty_err_set(err, TY_ENOMEM, "out of memory for the QLoRA base");
    /* The same layout rule as the table builder, skipping quantised tensors. */
    size_t off = 0;
    for (int i = 0; i < m->nt; i++) {
        m->t[i].off = off;
        if (!m->t[i].q4) off += (m->t[i].numel + 15) & ~(size_t)15;
    }
    *floats = off;
    return 0;
}

int qlora_store(model *m, int idx, const float *w, ty_err *err)
{
    qlora_base *qb = m->qb;
    const model_tensor *t = &m->t[idx];
    int k = t->q4 - 1;
    nf4_host q;
    char hf[128];
    model_hf_name(m, t, hf, sizeof hf);
    int rc = nf4_quantize(w, t->numel, qb->double_quant, &q, err);
    if (rc) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return ty_err_field(err, rc, hf, "tensor %s: %s", hf, msg);
    }
    if (!qb->buf[k]) {
        size_t bytes = nf4_device_bytes(t->numel, qb->double_quant);
        qb->buf[k] = kn_alloc(m->kn, bytes);
        if (!qb->buf[k]) {
            nf4_free(&q);
            return ty_err_set(err, TY_ENOMEM, "out of memory: %zu bytes for NF4 tensor %s", bytes,
                              hf);
        }
        qb->bytes += bytes;
    }
    nf4_to_device(m->kn, &q, qb->buf[k], &qb->w[k]);
    nf4_free(&q);
    return 0;
}

void qlora_free(model *m)
{
    qlora_base *qb = m->qb;
    if (!qb) return;
    for (int i = 0; qb->buf && i < qb->n; i++)
        kn_free(m->kn, qb->buf[i]);
    free(qb->buf);
    free(qb->w);
    free(qb);
    m->qb = NULL;
}

const char *qlora_foreign_quant(const char *name)
{
    static const struct {
        const char *suffix, *what;
    } marks[] = {
        {".qweight", "GPTQ/AWQ"},
        {".qzeros", "GPTQ/AWQ"},
        {".scales", "GPTQ/AWQ"},
        {".g_idx", "GPTQ"},
        {".weight.absmax", "bitsandbytes"},
        {".weight.quant_map", "bitsandbytes"},
        {".weight.nested_absmax", "bitsandbytes"},
        {".weight.SCB", "bitsandbytes int8"},
    };
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof marks / sizeof *marks; i++) {
        size_t s = strlen(marks[i].suffix);
        if (n >= s && !strcmp(name + n - s, marks[i].suffix)) return marks[i].what;
    }
    if (strstr(name, ".weight.quant_state.")) return "bitsandbytes";
    return NULL;
}
