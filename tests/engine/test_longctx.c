/* test_longctx.c — attention memory is linear in T (issue 10, item 2).
 *
 * A small GPT-2 and a small GQA Llama at T = 4096: the old kernel kept a
 * [B, H, T, T] probability matrix per layer (here 2 layers x 4 heads x
 * 4096^2 floats = 512 MiB per model); now each layer keeps one log-sum-exp
 * per (batch, head, row). The test allocates the activations, checks their
 * size against what the T x T matrices alone would have needed, and runs a
 * full forward + backward at that length: the loss must be finite and near
 * ln(vocab) for random weights, and the gradients finite. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "hfconfig.h"
#include "kernels.h"
#include "model.h"

static void run(kn_ctx *kn, const char *cfg_json, const char *tag)
{
    enum { B = 1, T = 4096 };
    json_error_t je;
    json_t *o = json_loads(cfg_json, 0, &je);
    model_config c;
    ty_err err = {0};
    model m;
    CHECK(o && hfconfig_parse(o, "test", &c, &err) == 0);
    json_decref(o);
    int L = c.n_layer, H = c.n_head, V = c.vocab;
    CHECK(model_create(&m, &c, kn, &err) == 0);
    CHECK(model_init_random(&m, 7, &err) == 0);
    size_t before = kn_bytes_in_use(kn);
    CHECK(model_alloc_acts(&m, B, T, MODEL_RECOMPUTE_NONE, &err) == 0);
    size_t acts = kn_bytes_in_use(kn) - before;
    double old_att = (double)L * B * H * T * (double)T * sizeof(float);
    printf("%s: T=%d activations %.1f MiB; the old kernel's attention matrices alone %.1f MiB\n", tag, T,
           acts / 1048576.0, old_att / 1048576.0);
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

int main(void)
{
    kn_ctx *kn;
    ty_err err = {0};
    if (kn_open(&kn, KN_CPU, 0, 0, &err)) {
        fprintf(stderr, "kn_open: %s\n", err.msg);
        return 1;
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
    if (check_failures) fprintf(stderr, "%d check(s) failed\n", check_failures);
    else printf("engine longctx: all checks passed\n");
    return check_failures != 0;
}
