/* test_gemm16.c — every GEMM of a 16-bit training step takes 16-bit inputs.
 *
 * One forward + backward of a GPT-2 (fused c_fc + GELU, biases), a Llama
 * (GQA, SwiGLU) and a Qwen2 (q, k, v biases) in fp32, bf16 and fp16,
 * counted by model_gemm_counts: an fp32 step issues all its GEMMs with
 * fp32 inputs, a 16-bit step all of them with 16-bit inputs (dY included:
 * the backward hands its activation gradients to the GEMMs in the 16-bit
 * type), and the number is the architecture's: per layer GPT-2 has 4
 * forward products (c_attn, c_proj, c_fc with its GELU, mlp.c_proj) and 8
 * backward ones (dX and dW of each; the MLP proj's dX is the fused dgelu),
 * a Llama 7 and 14; the head adds 1 forward and 2 backward. An evaluation
 * forward issues the forward ones alone. The 16-bit gradients must also
 * stay within the type's precision of fp32's (relative L2 per tensor),
 * so a wrong conversion (a stale or short dY copy) fails here too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tyassert.h"
#include "model_fixture.h"

enum { B = 2, T = 9, N = B * T };

static const char *const GPT2 = "{\"model_type\":\"gpt2\",\"n_embd\":32,\"n_layer\":3,\"n_head\":4,"
                                "\"n_positions\":32,\"vocab_size\":61}";
static const char *const LLAMA =
    "{\"model_type\":\"llama\",\"hidden_size\":32,\"intermediate_size\":40,"
    "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"vocab_size\":61,\"max_position_embeddings\":32}";
static const char *const QWEN2 =
    "{\"model_type\":\"qwen2\",\"hidden_size\":32,\"intermediate_size\":40,"
    "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"vocab_size\":61,\"max_position_embeddings\":32,\"tie_word_embeddings\":false}";

/* One step's GEMM counts ([0] fp32 inputs, [1] 16-bit), the forward's
 * alone in fwd, and the step's gradients (host copy, caller frees). */
static float *step(kn_ctx *kn, const char *cfg_json, kn_dtype dt, size_t cnt[2], size_t fwd[2],
                   size_t *n_out)
{
    model m;
    ty_err err = {0};
    REQUIRE(fixture_model(&m, kn, cfg_json, 3) == 0);
    REQUIRE(model_set_precision(&m, dt, &err) == 0);
    REQUIRE(model_alloc_acts(&m, B, T, MODEL_RECOMPUTE_NONE, &err) == 0);
    int32_t in[N], tg[N];
    for (int i = 0; i < N; i++) {
        in[i] = (i * 7 + 2) % m.cfg.vocab;
        tg[i] = (i * 13 + 5) % m.cfg.vocab;
    }
    size_t n = m.t[m.nt - 1].off + m.t[m.nt - 1].numel, c0[2], c1[2];
    model_gemm_counts(&m, c0);
    model_forward(&m, in, tg, B, T);
    model_gemm_counts(&m, c1);
    fwd[0] = c1[0] - c0[0], fwd[1] = c1[1] - c0[1];
    model_forward_backward(&m, in, tg, B, T, 1.0f / N);
    model_gemm_counts(&m, c0);
    cnt[0] = c0[0] - c1[0], cnt[1] = c0[1] - c1[1];
    float *g = malloc(n * sizeof *g);
    REQUIRE(g != NULL);
    kn_to_host(kn, g, m.grads, n * sizeof *g);
    CHECK(kn_check(kn, &err) == 0, "%s: %s", kn_dtype_name(dt), err.msg);
    *n_out = n;
    model_free(&m);
    return g;
}

/* ||g - ref|| / ||ref|| over the whole gradient buffer [0, n). */
static double rel_l2(const float *g, const float *ref, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)g[i] - ref[i]) * ((double)g[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

static void check_family(kn_ctx *kn, const char *tag, const char *cfg_json, size_t per_layer_fwd,
                         size_t per_layer_bwd, int layers)
{
    static const kn_dtype dts[] = {KN_F32, KN_BF16, KN_F16};
    size_t want_fwd = per_layer_fwd * (size_t)layers + 1;
    size_t want = want_fwd + per_layer_bwd * (size_t)layers + 2;
    float *ref = NULL;
    for (int d = 0; d < 3; d++) {
        size_t cnt[2], fwd[2], n;
        float *g = step(kn, cfg_json, dts[d], cnt, fwd, &n);
        int w = dts[d] != KN_F32; /* the count that must hold them all */
        printf("%s %s: step gemms fp32 %zu 16-bit %zu, forward %zu / %zu\n", tag,
               kn_dtype_name(dts[d]), cnt[0], cnt[1], fwd[0], fwd[1]);
        CHECK(cnt[w] == want && cnt[!w] == 0, "%s %s: %zu fp32 + %zu 16-bit GEMMs, want %zu %s",
              tag, kn_dtype_name(dts[d]), cnt[0], cnt[1], want, w ? "16-bit" : "fp32");
        CHECK(fwd[w] == want_fwd && fwd[!w] == 0, "%s %s: forward %zu + %zu GEMMs, want %zu", tag,
              kn_dtype_name(dts[d]), fwd[0], fwd[1], want_fwd);
        if (!ref) {
            ref = g;
            continue;
        }
        double e = rel_l2(g, ref, n), tol = dts[d] == KN_BF16 ? 3e-2 : 6e-3;
        printf("%s %s: gradients' relative L2 distance from fp32 %.2e\n", tag,
               kn_dtype_name(dts[d]), e);
        CHECK(isfinite(e) && e < tol, "%s %s: gradients %.2e from fp32's (at most %.0e)", tag,
              kn_dtype_name(dts[d]), e, tol);
        free(g);
    }
    free(ref);
}

int main(void)
{
    kn_ctx *kn = fixture_cpu();
    REQUIRE(kn != NULL);
    check_family(kn, "gpt2", GPT2, 4, 8, 3);
    check_family(kn, "llama", LLAMA, 7, 14, 2);
    check_family(kn, "qwen2", QWEN2, 7, 14, 2);
    kn_close(kn);
    return ty_summary("engine gemm16");
}
