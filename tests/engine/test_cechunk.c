/* test_cechunk.c — the loss head over chunks of rows.
 *
 * The engine never holds the whole [N, vocab] logits: the lm_head GEMM,
 * the cross-entropy and the dlogits GEMMs run over logit_rows rows at a
 * time (model.c head_loss). For a GPT-2 (tied head) and a GQA Llama
 * (untied head) in fp32, bf16 and fp16 storage, the same model and batch
 * with the logits whole (one chunk) and in chunks of 5 rows (24 rows: 5,
 * 5, 5, 5, 4) must give:
 *   - the same per-row losses within 1e-6 relative (each row's
 *     cross-entropy is independent of the others; only the GEMM making the
 *     logit row may round differently for fewer rows: bit-identical here
 *     in bf16 / fp16, last-bit differences in fp32 from OpenBLAS);
 *   - the same evaluation loss (model_forward) within 1e-6;
 *   - the same gradients within 1e-5 relative L2 (only dW_lm's summation
 *     order changes: chunk after chunk instead of one GEMM);
 *   - a logits buffer of 5 rows: the arena smaller by 19 rows of vocab.
 * And the engine's own choice: a 65536-token vocabulary over 512 rows
 * gets 32 MiB chunks (128 rows in fp32, 256 in bf16), never more rows
 * than the batch has. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tyassert.h"
#include "model_fixture.h"

enum { B = 2, T = 12, N = B * T };

static void make(model *m, kn_ctx *kn, const char *cfg_json, kn_dtype dt, int ce_rows, int b, int t)
{
    ty_err err = {0};
    REQUIRE(fixture_model(m, kn, cfg_json, 5) == 0);
    REQUIRE(model_set_precision(m, dt, &err) == 0);
    m->ce_rows = ce_rows;
    REQUIRE(model_alloc_acts(m, b, t, MODEL_RECOMPUTE_NONE, &err) == 0);
}

static size_t n_params(const model *m)
{
    return m->t[m->nt - 1].off + m->t[m->nt - 1].numel;
}

static void compare(kn_ctx *kn, const char *tag, const char *cfg_json, kn_dtype dt)
{
    model whole, chunked;
    make(&whole, kn, cfg_json, dt, 0, B, T);
    make(&chunked, kn, cfg_json, dt, 5, B, T);
    int V = whole.cfg.vocab;
    CHECK(whole.logit_rows == N, "%s: %d rows", tag, whole.logit_rows);
    CHECK(chunked.logit_rows == 5, "%s: %d rows", tag, chunked.logit_rows);
    size_t es = kn_dtype_size(dt), saved = (size_t)(N - 5) * V * es;
    CHECK(whole.n_acts - chunked.n_acts + 64 >= saved &&
              whole.n_acts - chunked.n_acts <= saved + 64,
          "%s: arena %zu vs %zu bytes", tag, whole.n_acts, chunked.n_acts);

    int32_t in[N], tg[N];
    for (int i = 0; i < N; i++) {
        in[i] = (i * 7 + 3) % V;
        tg[i] = i == 4 ? -100 : (i * 11 + 5) % V; /* one ignored row */
    }
    float lw[N], lc[N];
    size_t np = n_params(&whole);
    kn_zero(kn, whole.grads, np);
    kn_zero(kn, chunked.grads, np);
    model_forward_backward_into(&whole, in, tg, B, T, 1.0f / (N - 1), lw);
    model_forward_backward_into(&chunked, in, tg, B, T, 1.0f / (N - 1), lc);
    ty_err err = {0};
    CHECK(kn_check(kn, &err) == 0, "%s", err.msg);
    /* Per row the same cross-entropy of the same logit row; the GEMM that
     * makes the row may round differently with fewer rows (OpenBLAS's edge
     * kernels: fp32 rows differ in the last bits), so 1e-6 relative. */
    int same = !memcmp(lw, lc, sizeof lw);
    for (int i = 0; i < N; i++)
        CHECK(fabsf(lw[i] - lc[i]) <= 1e-6f * fabsf(lw[i]), "%s row %d: %.9g vs %.9g", tag, i,
              lw[i], lc[i]);
    CHECK(lc[4] == 0.0f && isfinite(lc[0]) && lc[0] > 0.0f);
    double num = 0, den = 0;
    for (size_t i = 0; i < np; i++) {
        double d = (double)whole.grads[i] - chunked.grads[i];
        num += d * d;
        den += (double)whole.grads[i] * whole.grads[i];
    }
    double rel = sqrt(num / den);
    printf("%s %s: per-row losses %s, gradients %.3g relative L2 apart\n", tag, kn_dtype_name(dt),
           same ? "bit-identical" : "within 1e-6", rel);
    CHECK(den > 0 && rel < 1e-5, "%s: gradients %.3g apart", tag, rel);
    /* the lm_head's gradient really comes from the chunks (not left zero) */
    const model_tensor *h = &chunked.t[chunked.lm_head];
    CHECK(kn_sumsq(kn, chunked.grads + h->off, h->numel) > 0);

    double ew = model_forward(&whole, in, tg, B, T), ec = model_forward(&chunked, in, tg, B, T);
    CHECK(fabs(ew - ec) <= 1e-6 * ew && ew > 0, "%s: eval %.17g vs %.17g", tag, ew, ec);
    model_free(&whole);
    model_free(&chunked);
}

/* The engine's own chunk: 32 MiB of logits, at least 128 rows, <= N. */
static void auto_rows(kn_ctx *kn)
{
    static const char *cfg = "{\"model_type\":\"gpt2\",\"n_embd\":16,\"n_layer\":1,\"n_head\":2,"
                             "\"n_positions\":256,\"vocab_size\":65536}";
    model m;
    make(&m, kn, cfg, KN_F32, 0, 2, 256);
    CHECK(m.logit_rows == 128, "fp32: %d rows", m.logit_rows);
    model_free(&m);
    make(&m, kn, cfg, KN_BF16, 0, 2, 256);
    CHECK(m.logit_rows == 256, "bf16: %d rows", m.logit_rows);
    model_free(&m);
    make(&m, kn, cfg, KN_BF16, 0, 1, 100);
    CHECK(m.logit_rows == 100, "short batch: %d rows", m.logit_rows);
    model_free(&m);
    make(&m, kn, cfg, KN_F32, 1000, 1, 100); /* asked for more than there are */
    CHECK(m.logit_rows == 100, "ce_rows 1000: %d rows", m.logit_rows);
    model_free(&m);
}

int main(void)
{
    kn_ctx *kn = fixture_cpu();
    if (!kn) return 1;
    static const char *gpt2 = "{\"model_type\":\"gpt2\",\"n_embd\":32,\"n_layer\":2,\"n_head\":4,"
                              "\"n_positions\":16,\"vocab_size\":96}";
    static const char *llama =
        "{\"model_type\":\"llama\",\"hidden_size\":32,\"intermediate_size\":48,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
        "\"max_position_embeddings\":16,\"vocab_size\":80,\"tie_word_embeddings\":false}";
    const kn_dtype dts[3] = {KN_F32, KN_BF16, KN_F16};
    for (int d = 0; d < 3; d++) {
        compare(kn, "gpt2", gpt2, dts[d]);
        compare(kn, "llama", llama, dts[d]);
    }
    auto_rows(kn);
    kn_close(kn);
    return ty_summary("engine cechunk");
}
