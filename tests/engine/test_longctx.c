/* test_longctx.c — attention memory is linear in T.
 *
 * A small GPT-2 and a small GQA Llama at T = 4096: the old kernel kept a
 * [B, H, T, T] probability matrix per layer (here 2 layers x 4 heads x
 * 4096^2 floats = 512 MiB per model); now each layer keeps one log-sum-exp
 * per (batch, head, row). The test allocates the activations, checks their
 * size against what the T x T matrices alone would have needed, and runs a
 * full forward + backward at that length: the loss must be finite and near
 * ln(vocab) for random weights, and the gradients finite.
 *
 * `test_engine_longctx memory` (engine.precision_memory): the kept
 * activations of an 8-layer GPT-2 in bf16 and fp16 storage take at most
 * 0.6x the fp32 bytes (every activation in 16 bits; fp32 are the per-row
 * statistics and one layer's activation gradients, next to the 16-bit
 * copy the GEMMs read: 0.56x), and the 16-bit parameters are 2 bytes
 * each; a forward + backward in each storage gives a loss within the
 * 16-bit precision of the fp32 one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tyassert.h"
#include "kernels.h"
#include "model.h"
#include "model_fixture.h"

static void run(kn_ctx *kn, const char *cfg_json, const char *tag)
{
    enum { B = 1, T = 4096 };
    ty_err err = {0};
    model m;
    REQUIRE(fixture_model(&m, kn, cfg_json, 7) == 0);
    int L = m.cfg.n_layer, H = m.cfg.n_head, V = m.cfg.vocab;
    size_t before = kn_bytes_in_use(kn);
    CHECK(model_alloc_acts(&m, B, T, MODEL_RECOMPUTE_NONE, &err) == 0);
    size_t acts = kn_bytes_in_use(kn) - before;
    double old_att = (double)L * B * H * T * (double)T * sizeof(float);
    printf("%s: T=%d activations %.1f MiB; the old kernel's attention matrices alone %.1f MiB\n",
           tag, T, acts / 1048576.0, old_att / 1048576.0);
    CHECK((double)acts < old_att / 8);

    int32_t *in = malloc(sizeof(int32_t) * B * T), *tg = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++) {
        in[i] = (i * 7 + 3) % V;
        tg[i] = (i * 11 + 5) % V;
    }
    size_t n = m.t[m.nt - 1].off + m.t[m.nt - 1].numel;
    kn_zero(kn, m.grads, n);
    double sum = model_forward_backward(&m, in, tg, B, T, 1.0f / (B * T));
    CHECK(kn_check(kn, &err) == 0);
    double loss = sum / (B * T);
    printf("%s: loss %.4f (ln V = %.4f), peak kernel memory %.1f MiB\n", tag, loss, log((double)V),
           kn_peak_bytes(kn) / 1048576.0);
    CHECK(isfinite(loss) && fabs(loss - log((double)V)) < 0.5);
    CHECK(!kn_nonfinite(kn, m.grads, n));
    CHECK(kn_sumsq(kn, m.grads, n) > 0);
    CHECK((double)kn_peak_bytes(kn) < old_att / 4);
    free(in);
    free(tg);
    model_free(&m);
}

static void precision_memory(kn_ctx *kn)
{
    static const char *cfg_json =
        "{\"model_type\":\"gpt2\",\"n_embd\":64,\"n_layer\":8,\"n_head\":4,"
        "\"n_positions\":128,\"vocab_size\":64}";
    enum { B = 2, T = 128 };
    const kn_dtype dts[3] = {KN_F32, KN_BF16, KN_F16};
    size_t bytes[3];
    double loss[3];
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        in[i] = (i * 5 + 1) % 64;
        tg[i] = (i * 13 + 2) % 64;
    }
    for (int d = 0; d < 3; d++) {
        ty_err err = {0};
        model m;
        REQUIRE(fixture_model(&m, kn, cfg_json, 3) == 0);
        size_t before = kn_bytes_in_use(kn);
        CHECK(model_set_precision(&m, dts[d], &err) == 0);
        size_t after = kn_bytes_in_use(kn), scr = m.w1d_n * 4 + 4096;
        size_t total = m.t[m.nt - 1].off + m.t[m.nt - 1].numel;
        /* fp16: the 16-bit copy next to the fp32 masters (+2 bytes a
         * parameter); bf16: the masters split into that copy and their low
         * halves, the fp32 buffer freed (no more than fp32's 4 bytes). */
        if (dts[d] == KN_F16)
            CHECK(after - before >= total * 2 && after - before < total * 2 + scr);
        if (dts[d] == KN_BF16) CHECK(after <= before + scr && m.params == NULL && m.plo != NULL);
        /* The fp32 weight scratch holds the 1-D tensors (norms, biases:
         * 832 floats a layer here), each padded to 16 floats at most, and
         * none of the matmul weights. */
        size_t n1d = 0, k1d = 0;
        for (int i = 0; i < m.nt; i++)
            if (m.t[i].ndim == 1) n1d += m.t[i].numel, k1d++;
        if (dts[d] != KN_F32) CHECK(m.w1d_n >= n1d && m.w1d_n <= n1d + 15 * k1d);
        CHECK(model_alloc_acts(&m, B, T, MODEL_RECOMPUTE_NONE, &err) == 0);
        bytes[d] = model_act_bytes(&m);
        size_t n = total;
        kn_zero(kn, m.grads, n);
        loss[d] = model_forward_backward(&m, in, tg, B, T, 1.0f / (B * T)) / (B * T);
        CHECK(kn_check(kn, &err) == 0 && !kn_nonfinite(kn, m.grads, n));
        printf("%s: activations %zu bytes, loss %.6f\n", kn_dtype_name(dts[d]), bytes[d], loss[d]);
        model_free(&m);
    }
    for (int d = 1; d < 3; d++) {
        CHECK((double)bytes[d] <= 0.6 * (double)bytes[0]);
        CHECK(fabs(loss[d] - loss[0]) < (dts[d] == KN_BF16 ? 2e-2 : 3e-3) * loss[0]);
        CHECK(loss[d] != loss[0]); /* really computed in another precision */
    }
}

int main(int argc, char **argv)
{
    kn_ctx *kn = fixture_cpu();
    if (!kn) return 1;
    if (argc > 1 && !strcmp(argv[1], "memory")) {
        precision_memory(kn);
        kn_close(kn);
        return ty_summary("engine longctx");
    }
    run(kn,
        "{\"model_type\":\"gpt2\",\"n_embd\":32,\"n_layer\":2,\"n_head\":4,\"n_positions\":4096,"
        "\"vocab_size\":64}",
        "gpt2");
    run(kn,
        "{\"model_type\":\"llama\",\"hidden_size\":32,\"intermediate_size\":48,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":64,"
        "\"max_position_embeddings\":4096}",
        "llama");
    kn_close(kn);
    return ty_summary("engine longctx");
}
