/* test_cuda_emu_train.c — a short training run through the CUDA kernels
 * (emulated on the CPU) matches the CPU backend.
 *
 * A small GPT-2 (fused qkv, layernorm, GELU, tied head) and a small GQA
 * Llama (RoPE, rmsnorm, SwiGLU) are built twice from the same seed, once on
 * a `cpu` context and once on `cuda-emu` (the kernels/cuda sources
 * compiled for the host, kernels/cuda/emu), and trained for a few steps:
 * zero the gradients, model_forward_backward on a fixed batch, one AdamW
 * step over the whole flat parameter buffer. Every step's loss must agree
 * within 2e-4 relative (fp32 on both, different summation orders, the
 * differences compounding through the updates), and the loss must fall
 * (the run really trains). Vocabulary 97 and T = 21 are deliberately not
 * multiples of any tile. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"
#include "tyassert.h"
#include "hfconfig.h"
#include "model.h"

enum { STEPS = 6, B = 2, T = 21 };

static int train(kn_ctx *kn, const char *cfg_json, double *losses)
{
    json_error_t je;
    json_t *o = json_loads(cfg_json, 0, &je);
    model_config c;
    ty_err err = {0};
    model m;
    if (!o || hfconfig_parse(o, "test", &c, &err)) {
        fprintf(stderr, "config: %s\n", err.msg);
        json_decref(o);
        return -1;
    }
    json_decref(o);
    if (model_create(&m, &c, kn, &err) || model_init_random(&m, 11, &err) ||
        model_alloc_acts(&m, B, T, MODEL_RECOMPUTE_NONE, &err)) {
        fprintf(stderr, "model: %s\n", err.msg);
        return -1;
    }
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        in[i] = (i * 7 + 3) % m.cfg.vocab;
        tg[i] = i % 9 == 4 ? -100 : (i * 5 + 1) % m.cfg.vocab;
    }
    int n_tg = 0;
    for (int i = 0; i < B * T; i++)
        n_tg += tg[i] != -100;
    size_t n = m.t[m.nt - 1].off + m.t[m.nt - 1].numel;
    for (int s = 0; s < STEPS; s++) {
        kn_zero(kn, m.grads, n);
        losses[s] = model_forward_backward(&m, in, tg, B, T, 1.0f / n_tg) / n_tg;
        kn_adamw(kn, KN_F32, m.params, NULL, m.grads, m.m, m.v, n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                 s + 1);
        if (kn_check(kn, &err)) {
            fprintf(stderr, "%s: step %d: %s\n", kn_device_name(kn), s, err.msg);
            model_free(&m);
            return -1;
        }
    }
    model_free(&m);
    return 0;
}

static void compare(const char *tag, const char *cfg_json)
{
    kn_ctx *cpu = NULL, *emu = NULL;
    ty_err err = {0};
    CHECK(kn_open(&cpu, KN_CPU, 0, 1, &err) == 0);
    CHECK(kn_open_backend(&emu, &kn_cuda_emu_backend, KN_CUDA, 0, 0, &err) == 0);
    if (!cpu || !emu) return;
    double lc[STEPS], le[STEPS];
    CHECK(train(cpu, cfg_json, lc) == 0);
    CHECK(train(emu, cfg_json, le) == 0);
    for (int s = 0; s < STEPS; s++) {
        double rel = fabs(lc[s] - le[s]) / fabs(lc[s]);
        printf("%s step %d: cpu %.7f cuda-emu %.7f rel %.2g\n", tag, s + 1, lc[s], le[s], rel);
        CHECK(isfinite(le[s]) && rel <= 2e-4);
    }
    CHECK(le[STEPS - 1] < le[0] - 0.05);
    kn_close(emu);
    kn_close(cpu);
}

int main(void)
{
    compare("gpt2", "{\"model_type\":\"gpt2\",\"n_embd\":32,\"n_layer\":2,\"n_head\":4,"
                    "\"n_positions\":64,\"vocab_size\":97}");
    compare("llama", "{\"model_type\":\"llama\",\"hidden_size\":32,\"intermediate_size\":48,"
                     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                     "\"vocab_size\":97,\"max_position_embeddings\":64}");
    return ty_summary("engine cuda_emu_train");
}
