/* test_qlora16.c — QLoRA's 4-bit base multiplies in 16 bits in a 16-bit run.
 *
 * A small GQA Llama, a GPT-2 (fused c_attn, biases) and a Phi-3 (qkv_proj
 * and gate_up_proj multiplied by row blocks, views of one NF4 tensor) with
 * their block linears in NF4 (qlora_attach, compute dtype = the run's
 * precision) and LoRA on every one of them (A and B drawn, so both get
 * gradients) run one forward + backward in bf16 and fp16, on the CPU
 * backend and on the emulated CUDA one, twice: through the store's 16-bit
 * path (linear.h's fwd16 / bwd16: the weight dequantised into the 16-bit
 * scratch, kn_matmul16_* on the 16-bit activations and dY) and, with the
 * store's dt16 cleared, through the fp32-product path (kn_nf4_matmul_* on
 * the widened activations). The 16-bit path must be the one taken —
 * model_gemm_counts sees no GEMM with fp32 inputs, where the other path
 * issues the base's (a Llama's 2 x 7 per layer) — and agree with the
 * fp32-product path: both multiply the same exact
 * 16-bit values with fp32 accumulation, so only the order of the sums
 * differs (loss within 1e-3 relative, adapter gradients' relative L2
 * within 1e-2 in bf16 and 2e-3 in fp16, below test_gemm16's
 * 16-bit-against-fp32 bounds). Measured: the Llama's CPU bf16 gradients
 * 1.6e-3 apart (oneDNN's bf16 GEMM sums in its own order; the loss
 * equal), the rest bit-identical (fp16 is widened for sgemm, the
 * emulated cuBLASLt sums 16-bit and fp32 inputs alike, and at width 128
 * oneDNN's order is sgemm's). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"
#include "hfconfig.h"
#include "lora.h"
#include "model.h"
#include "qlora.h"
#include "tyassert.h"

enum { B = 2, T = 9, N = B * T };

/* A family: its config, the LoRA targets (every block linear) and the
 * base GEMMs of one step (forward products and backward dX, per layer
 * times layers). */
typedef struct family {
    const char *tag, *cfg;
    char *targets[7];
    int n_targets;
    size_t base_gemms;
} family;

static const family FAMILIES[] = {
    {"llama",
     "{\"model_type\":\"llama\",\"hidden_size\":256,\"intermediate_size\":688,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
     "\"vocab_size\":61,\"max_position_embeddings\":32}",
     {"q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "gate_proj", "down_proj"},
     7,
     2 * 7 * 2},
    /* c_attn whole, biases, no fused GELU under a 4-bit base */
    {"gpt2",
     "{\"model_type\":\"gpt2\",\"n_embd\":128,\"n_layer\":2,\"n_head\":4,"
     "\"n_positions\":32,\"vocab_size\":61}",
     {"c_attn", "c_proj", "c_fc"},
     3,
     2 * 4 * 2},
    /* qkv_proj and gate_up_proj by row blocks: views of one NF4 tensor */
    {"phi3",
     "{\"model_type\":\"phi3\",\"hidden_size\":128,\"intermediate_size\":200,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
     "\"vocab_size\":61,\"max_position_embeddings\":32}",
     {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"},
     4,
     2 * 7 * 2},
};

typedef struct step_result {
    double loss;
    size_t gemm[2]; /* model_gemm_counts over the step: fp32 inputs, 16-bit */
    float *grads;   /* the adapters' gradients (host) */
    size_t n;
} step_result;

static int make_model(model *m, kn_ctx *kn, const family *f, kn_dtype dt, ty_err *err)
{
    json_error_t je;
    json_t *o = json_loads(f->cfg, 0, &je);
    model_config c;
    int rc = o ? hfconfig_parse(o, "test", &c, err) : -1;
    json_decref(o);
    if (rc) return rc;
    qlora_base *qb;
    rc = model_create_ex(m, &c, kn, MODEL_FROZEN_NF4, err);
    if (!rc) rc = qlora_attach(m, 1, dt, &qb, err);
    if (!rc) rc = model_nf4_home(m, dt, err);
    if (!rc) rc = model_init_random(m, 5, err);
    return rc;
}

/* LoRA on every block linear, A and B drawn from a fixed LCG. */
static int make_lora(lora *l, model *m, kn_ctx *kn, const family *f, ty_err *err)
{
    lora_cfg c;
    lora_cfg_from_spec(&c, 4, 8.0, 0.0, 0, f->targets, f->n_targets);
    int rc = lora_create(l, m, &c, err);
    if (rc) return rc;
    lora_attach(l, m);
    float *p = malloc(l->n_params * sizeof *p);
    if (!p) return -1;
    uint32_t s = 12345;
    for (size_t i = 0; i < l->n_params; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.2f;
    }
    kn_to_device(kn, l->params, p, l->n_params * sizeof *p);
    free(p);
    return lora_alloc_acts(l, B, T, err);
}

/* One forward + backward; path16 0 clears the store's 16-bit type. */
static int step(kn_ctx *kn, const family *f, kn_dtype dt, int path16, step_result *r)
{
    model m;
    lora l = {0};
    ty_err err = {0};
    int rc = make_model(&m, kn, f, dt, &err);
    if (!rc && !path16) m.base.dt16 = KN_F32;
    if (!rc) rc = model_alloc_acts(&m, B, T, MODEL_RECOMPUTE_NONE, &err);
    if (!rc) rc = make_lora(&l, &m, kn, f, &err);
    if (!rc) {
        int32_t in[N], tg[N];
        for (int i = 0; i < N; i++) {
            in[i] = (i * 7 + 2) % m.cfg.vocab;
            tg[i] = (i * 13 + 5) % m.cfg.vocab;
        }
        size_t c0[2], c1[2];
        model_gemm_counts(&m, c0);
        r->loss = model_forward_backward(&m, in, tg, B, T, 1.0f / N) / N;
        model_gemm_counts(&m, c1);
        r->gemm[0] = c1[0] - c0[0], r->gemm[1] = c1[1] - c0[1];
        r->n = l.n_params;
        r->grads = malloc(r->n * sizeof *r->grads);
        if (r->grads) kn_to_host(kn, r->grads, l.grads, r->n * sizeof *r->grads);
        rc = kn_check(kn, &err);
    }
    if (rc)
        fprintf(stderr, "%s %s %s: %s\n", f->tag, kn_device_name(kn), kn_dtype_name(dt), err.msg);
    lora_free(&l);
    model_free(&m);
    return rc || !r->grads ? -1 : 0;
}

/* ||g - ref|| / ||ref||. */
static double rel_l2(const float *g, const float *ref, size_t n)
{
    double d = 0, q = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)g[i] - ref[i]) * ((double)g[i] - ref[i]);
        q += (double)ref[i] * ref[i];
    }
    return q > 0 ? sqrt(d / q) : sqrt(d);
}

static void compare(kn_ctx *kn, const family *f, kn_dtype dt)
{
    const char *dev = kn_device_name(kn), *dn = kn_dtype_name(dt);
    step_result s16 = {0}, s32 = {0};
    CHECK(step(kn, f, dt, 1, &s16) == 0, "%s %s %s: the 16-bit path's step", f->tag, dev, dn);
    CHECK(step(kn, f, dt, 0, &s32) == 0, "%s %s %s: the fp32-product path's step", f->tag, dev, dn);
    if (s16.grads && s32.grads && s16.n == s32.n) {
        double dl = fabs(s16.loss - s32.loss) / fabs(s32.loss);
        double dg = rel_l2(s16.grads, s32.grads, s16.n), tol = dt == KN_BF16 ? 1e-2 : 2e-3;
        printf("%s %s %s: gemms fp32/16-bit %zu/%zu (fp32-product path %zu/%zu), loss %.6f vs "
               "%.6f (rel %.1e), adapter gradients rel L2 %.2e\n",
               f->tag, dev, dn, s16.gemm[0], s16.gemm[1], s32.gemm[0], s32.gemm[1], s16.loss,
               s32.loss, dl, dg);
        CHECK(s16.gemm[0] == 0 && s32.gemm[0] == f->base_gemms &&
                  s16.gemm[1] == s32.gemm[1] + f->base_gemms,
              "%s %s %s: GEMM counts %zu/%zu and %zu/%zu", f->tag, dev, dn, s16.gemm[0],
              s16.gemm[1], s32.gemm[0], s32.gemm[1]);
        CHECK(isfinite(dl) && dl < 1e-3, "%s %s %s: loss %.1e from the fp32-product path's", f->tag,
              dev, dn, dl);
        CHECK(isfinite(dg) && dg < tol,
              "%s %s %s: adapter gradients %.2e from the fp32-product path's (at most %.0e)",
              f->tag, dev, dn, dg, tol);
    }
    free(s16.grads);
    free(s32.grads);
}

int main(void)
{
    kn_ctx *cpu = NULL, *emu = NULL;
    ty_err err = {0};
    REQUIRE(kn_open(&cpu, KN_CPU, 0, 1, &err) == 0);
    REQUIRE(kn_open_backend(&emu, &kn_cuda_emu_backend, KN_CUDA, 0, 0, &err) == 0);
    for (size_t i = 0; i < sizeof FAMILIES / sizeof *FAMILIES; i++)
        for (int d = 0; d < 2; d++) {
            kn_dtype dt = d ? KN_F16 : KN_BF16;
            compare(cpu, &FAMILIES[i], dt);
            compare(emu, &FAMILIES[i], dt);
        }
    kn_close(emu);
    kn_close(cpu);
    return ty_summary("engine qlora16");
}
