/* bwd16_accuracy.c — what a 16-bit training step loses against fp32, and
 * which of its GEMMs take 16-bit inputs (docs/engine.md, "Precision").
 *
 * For a tiny GPT-2 and a tiny Llama, on the CPU backend and on the
 * emulated CUDA backend (kernels/cuda compiled for the host), the same
 * model (one seed) is trained STEPS optimizer steps on one fixed batch in
 * fp32 and in bf16 (and fp16 with a fixed loss scale of 1, which these
 * small losses never overflow): zero the gradients, forward + backward,
 * AdamW on every tensor through its master (the split bf16 masters in
 * bf16, as train.c steps them), round the 16-bit weights. Printed per
 * run: the first and final loss, the final loss's relative distance from
 * fp32's, and for the first step (same weights in every precision) the
 * largest relative L2 difference of a weight gradient from fp32's,
 * ||g16 - g32|| / ||g32|| over the tensors with a non-zero fp32 gradient,
 * the GEMMs of that step by input type (model_gemm_counts), and an FNV-1a
 * hash of that step's gradient bits: equal hashes from two builds mean
 * bit-identical gradients.
 *
 * Usage: bwd16-accuracy [steps [cpu|emu|all]]   (default 50 all) */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "hfconfig.h"
#include "model.h"

enum { B = 4, T = 32 };

static const char *const GPT2 = "{\"model_type\":\"gpt2\",\"n_embd\":64,\"n_layer\":2,\"n_head\":4,"
                                "\"n_positions\":64,\"vocab_size\":211}";
static const char *const LLAMA =
    "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
    "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"vocab_size\":211,\"max_position_embeddings\":64}";

typedef struct {
    double loss0, loss, gemm[2];
    uint64_t hash; /* of g1's bits */
    float *g1;     /* host copy of the first step's gradients */
} run_out;

static uint64_t fnv1a(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

static int make(model *m, kn_ctx *kn, const char *cfg_json, kn_dtype dt)
{
    json_error_t je;
    json_t *o = json_loads(cfg_json, 0, &je);
    model_config c;
    ty_err err = {0};
    int rc = !o || hfconfig_parse(o, "bench", &c, &err);
    json_decref(o);
    if (!rc)
        rc = model_create(m, &c, kn, &err) || model_init_random(m, 11, &err) ||
             model_set_precision(m, dt, &err) ||
             model_alloc_acts(m, B, T, MODEL_RECOMPUTE_NONE, &err);
    if (rc) fprintf(stderr, "model: %s\n", err.msg);
    return rc;
}

static void adamw(model *m, int step)
{
    for (int i = 0; i < m->nt; i++) {
        const model_tensor *t = &m->t[i];
        kn_dtype pdt;
        uint16_t *plo;
        void *p = model_master(m, i, &pdt, &plo);
        kn_adamw(m->kn, pdt, p, plo, m->grads + t->off, m->m + t->off, m->v + t->off, t->numel,
                 3e-3f, 0.9f, 0.95f, 1e-8f, t->decay ? 0.1f : 0.0f, step);
    }
    model_sync_params(m);
}

static int train(kn_ctx *kn, const char *cfg_json, kn_dtype dt, int steps, run_out *r)
{
    model m;
    ty_err err = {0};
    if (make(&m, kn, cfg_json, dt)) return -1;
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        in[i] = (i * 7 + 3) % m.cfg.vocab;
        tg[i] = (in[i] * 5 + i % T) % m.cfg.vocab;
    }
    size_t n = m.t[m.nt - 1].off + m.t[m.nt - 1].numel;
    r->g1 = malloc(n * sizeof(float));
    for (int s = 0; s < steps && r->g1; s++) {
        size_t c0[2], c1[2];
        model_gemm_counts(&m, c0);
        kn_zero(kn, m.grads, n);
        r->loss = model_forward_backward(&m, in, tg, B, T, 1.0f / (B * T)) / (B * T);
        if (s == 0) {
            model_gemm_counts(&m, c1);
            r->gemm[0] = (double)(c1[0] - c0[0]);
            r->gemm[1] = (double)(c1[1] - c0[1]);
            r->loss0 = r->loss;
            kn_to_host(kn, r->g1, m.grads, n * sizeof(float));
            r->hash = fnv1a(r->g1, n * sizeof(float));
        }
        adamw(&m, s + 1);
        if (kn_check(kn, &err)) {
            fprintf(stderr, "%s: step %d: %s\n", kn_device_name(kn), s, err.msg);
            break;
        }
    }
    int ok = r->g1 && !err.msg[0];
    model_free(&m);
    return ok ? 0 : -1;
}

/* Largest ||a - b|| / ||b|| over the tensors of m's layout. */
static double max_rel_grad(const model *m, const float *a, const float *b)
{
    double worst = 0;
    for (int i = 0; i < m->nt; i++) {
        double d = 0, nb = 0;
        for (size_t j = m->t[i].off; j < m->t[i].off + m->t[i].numel; j++) {
            d += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
            nb += (double)b[j] * b[j];
        }
        if (nb > 0 && sqrt(d / nb) > worst) worst = sqrt(d / nb);
    }
    return worst;
}

static void family(kn_ctx *kn, const char *tag, const char *cfg_json, int steps)
{
    static const kn_dtype dts[] = {KN_F32, KN_BF16, KN_F16};
    run_out r[3] = {{0}};
    model shape; /* the layout, for the per-tensor norms */
    if (make(&shape, kn, cfg_json, KN_F32)) return;
    for (int d = 0; d < 3; d++)
        if (train(kn, cfg_json, dts[d], steps, &r[d])) goto out;
    for (int d = 0; d < 3; d++)
        printf("%-8s %-5s %-4s loss %.5f -> %.7f (vs fp32 %.2e)  max rel dW %.3e  "
               "gemms fp32 %g 16-bit %g  dW hash %016llx\n",
               kn_device_name(kn), tag, kn_dtype_name(dts[d]), r[d].loss0, r[d].loss,
               fabs(r[d].loss - r[0].loss) / r[0].loss, max_rel_grad(&shape, r[d].g1, r[0].g1),
               r[d].gemm[0], r[d].gemm[1], (unsigned long long)r[d].hash);
    fflush(stdout);
out:
    for (int d = 0; d < 3; d++)
        free(r[d].g1);
    model_free(&shape);
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 50;
    const char *which = argc > 2 ? argv[2] : "all";
    int on_cpu = !strcmp(which, "cpu") || !strcmp(which, "all"),
        on_emu = !strcmp(which, "emu") || !strcmp(which, "all");
    if (steps < 1 || (!on_cpu && !on_emu)) {
        fprintf(stderr, "usage: bwd16-accuracy [steps >= 1 [cpu|emu|all]]\n");
        return 2;
    }
    kn_ctx *cpu = NULL, *emu = NULL;
    ty_err err = {0};
    if (kn_open(&cpu, KN_CPU, 0, 0, &err) ||
        kn_open_backend(&emu, &kn_cuda_emu_backend, KN_CUDA, 0, 0, &err)) {
        fprintf(stderr, "kn_open: %s\n", err.msg);
        return 1;
    }
    printf("%d steps, batch %d x %d\n", steps, B, T);
    if (on_cpu) {
        family(cpu, "gpt2", GPT2, steps);
        family(cpu, "llama", LLAMA, steps);
    }
    if (on_emu) {
        family(emu, "gpt2", GPT2, steps);
        family(emu, "llama", LLAMA, steps);
    }
    kn_close(emu);
    kn_close(cpu);
    return 0;
}
