/* test_model.c — model tensors through files: save -> load is bit-identical
 * for GPT-2 (Conv1D transposes) and Llama (GQA, qkv bias, untied head), the
 * same through a sharded directory, and missing / unexpected / mis-shaped
 * tensors are errors naming the tensor. Runs on the CPU kernels. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tyassert.h"
#include "kernels.h"
#include "model.h"
#include "model_fixture.h"
#include "safetensors.h"
#include "tyutil.h"

static char tmpdir[256];
static kn_ctx *kn;

/* The start of a case: model m from cfg_json with weights from seed, and
 * path, the file called name in the test's directory. */
static void setup(model *m, const char *cfg_json, uint64_t seed, const char *name, char *path,
                  size_t cap)
{
    snprintf(path, cap, "%s/%s", tmpdir, name);
    REQUIRE(fixture_model(m, kn, cfg_json, seed) == 0);
}

static size_t buf_floats(const model *m)
{
    return m->t[m->nt - 1].off + m->t[m->nt - 1].numel;
}

static void roundtrip(const char *cfg_json, const char *tag)
{
    model a, b;
    ty_err err = {0};
    char path[512];
    snprintf(path, sizeof path, "%s/%s.safetensors", tmpdir, tag);
    CHECK(fixture_model(&a, kn, cfg_json, 1) == 0);
    CHECK(fixture_model(&b, kn, cfg_json, 2) == 0); /* different weights to overwrite */
    size_t n = buf_floats(&a);
    CHECK(memcmp(a.params, b.params, n * sizeof(float)) != 0);
    CHECK(model_save_file(&a, path, &err) == 0);
    CHECK(model_load_file(&b, path, &err) == 0);
    CHECK(memcmp(a.params, b.params, n * sizeof(float)) == 0);
    /* Optimizer moments too. */
    for (int t = 0; t < a.nt; t++) /* tensor spans only: padding between them is never saved */
        for (size_t i = a.t[t].off; i < a.t[t].off + a.t[t].numel; i++) {
            a.m[i] = (float)i * 0.25f;
            a.v[i] = (float)i * 0.5f;
        }
    snprintf(path, sizeof path, "%s/%s.opt.safetensors", tmpdir, tag);
    CHECK(model_save_optimizer(&a, path, &err) == 0);
    CHECK(model_load_optimizer(&b, path, &err) == 0);
    CHECK(memcmp(a.m, b.m, n * sizeof(float)) == 0 && memcmp(a.v, b.v, n * sizeof(float)) == 0);
    model_free(&a);
    model_free(&b);
}

static const char *GPT2 = "{\"model_type\":\"gpt2\",\"n_embd\":16,\"n_layer\":2,\"n_head\":2,"
                          "\"n_positions\":12,\"vocab_size\":37}";
static const char *QWEN =
    "{\"model_type\":\"qwen2\",\"hidden_size\":16,\"intermediate_size\":24,"
    "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"vocab_size\":29,\"max_position_embeddings\":16}";

/* GPT-2's Conv1D weights are [in, out] on disk: check one against the view. */
static void test_conv1d_layout(void)
{
    model a;
    ty_err err = {0};
    char path[512];
    setup(&a, GPT2, 3, "layout.safetensors", path, sizeof path);
    CHECK(model_save_file(&a, path, &err) == 0);
    st_file f;
    CHECK(st_open(&f, path, &err) == 0);
    const st_tensor *t = st_find(&f, "transformer.h.0.mlp.c_fc.weight");
    CHECK(t && t->shape[0] == 16 && t->shape[1] == 64);
    CHECK(st_find(&f, "lm_head.weight") == NULL); /* tied: omitted like transformers */
    CHECK(st_find(&f, "transformer.wte.weight") != NULL);
    if (t) {
        float *disk = malloc(16 * 64 * sizeof(float));
        st_to_f32(t, disk, &err);
        int idx = -1;
        for (int i = 0; i < a.nt; i++)
            if (!strcmp(a.t[i].name, "h.0.mlp.c_fc.weight")) idx = i;
        const float *w = a.params + a.t[idx].off; /* [out=64, in=16] */
        CHECK(disk[3 * 64 + 5] == w[5 * 16 + 3]);
        free(disk);
    }
    st_close(&f);
    model_free(&a);
}

/* Writes model a's tensors under altered names/shapes to provoke errors. */
typedef struct {
    model *m;
    int skip;    /* tensor index to leave out, or -1 */
    int reshape; /* tensor index to give a wrong shape, or -1 */
    int extra;   /* add an unexpected tensor */
    int prefix;  /* write HF prefixes */
} mut;

/* Zeros: the contents do not matter for these tests, only names and shapes. */
static int mut_fill(void *ctx, int i, float *buf, ty_err *err)
{
    (void)err;
    const st_out *o = (const st_out *)ctx + i;
    size_t n = 1;
    for (int d = 0; d < o->ndim; d++)
        n *= (size_t)o->shape[d];
    memset(buf, 0, n * sizeof *buf);
    return 0;
}

static void write_mutated(const char *path, const mut *mu)
{
    model *m = mu->m;
    st_out *outs = calloc((size_t)m->nt + 1, sizeof *outs);
    char(*names)[160] = calloc((size_t)m->nt + 1, sizeof *names);
    int n = 0;
    for (int i = 0; i < m->nt; i++) {
        if (i == mu->skip) continue;
        const model_tensor *t = &m->t[i];
        if (mu->prefix)
            model_hf_name(m, t, names[n], sizeof names[n]);
        else
            snprintf(names[n], sizeof names[n], "%s", t->name);
        outs[n].name = names[n];
        outs[n].ndim = t->ndim;
        outs[n].shape[0] = t->conv1d ? t->shape[1] : t->shape[0];
        outs[n].shape[1] = t->conv1d ? t->shape[0] : t->shape[1];
        if (i == mu->reshape) outs[n].shape[0] += 1;
        n++;
    }
    if (mu->extra) {
        snprintf(names[n], sizeof names[n], "model.layers.0.self_attn.rotary_emb.scale");
        outs[n].name = names[n];
        outs[n].ndim = 1;
        outs[n].shape[0] = 2;
        n++;
    }
    ty_err err = {0};
    CHECK(st_write(path, outs, n, NULL, mut_fill, outs, &err) == 0);
    free(outs);
    free(names);
}

static void test_bad_tensors(void)
{
    model m;
    ty_err err = {0};
    char path[512];
    setup(&m, QWEN, 4, "mut.safetensors", path, sizeof path);
    int kproj = -1;
    for (int i = 0; i < m.nt; i++)
        if (!strcmp(m.t[i].name, "layers.1.self_attn.k_proj.bias")) kproj = i;
    CHECK(kproj >= 0);

    mut mu = {&m, -1, -1, 0, 0}; /* without prefixes: accepted */
    write_mutated(path, &mu);
    CHECK(model_load_file(&m, path, &err) == 0);

    mu = (mut){&m, kproj, -1, 0, 1};
    write_mutated(path, &mu);
    int rc = model_load_file(&m, path, &err);
    CHECK_ERR(rc, err, "missing tensor model.layers.1.self_attn.k_proj.bias");

    mu = (mut){&m, -1, kproj, 0, 1};
    write_mutated(path, &mu);
    rc = model_load_file(&m, path, &err);
    CHECK_ERR(
        rc, err,
        "tensor model.layers.1.self_attn.k_proj.bias has shape [9] but config.json implies [8]");

    mu = (mut){&m, -1, -1, 1, 1};
    write_mutated(path, &mu);
    rc = model_load_file(&m, path, &err);
    CHECK_ERR(rc, err, "unexpected tensor model.layers.0.self_attn.rotary_emb.scale");
    model_free(&m);
}

/* Copies tensor (lo + i) of the source file: used by the shard writer. */
typedef struct {
    st_file *f;
    int lo;
} shard_ctx;

static int shard_fill(void *c, int i, float *buf, ty_err *e)
{
    shard_ctx *ctx = c;
    return st_to_f32(&ctx->f->t[ctx->lo + i], buf, e);
}

/* Two shards plus an index, as transformers writes large models. */
static void test_sharded(void)
{
    model a, b;
    ty_err err = {0};
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
    ty_mkdir_p(dir, &err);
    CHECK(fixture_model(&a, kn, GPT2, 5) == 0);
    CHECK(fixture_model(&b, kn, GPT2, 6) == 0);
    snprintf(path, sizeof path, "%s/whole.safetensors", tmpdir);
    CHECK(model_save_file(&a, path, &err) == 0);
    /* Split the saved file: first half of the tensors in shard 1. */
    st_file f;
    CHECK(st_open(&f, path, &err) == 0);
    json_t *wm = json_object();
    for (int s = 0; s < 2; s++) {
        int lo = s ? f.n / 2 : 0, hi = s ? f.n : f.n / 2;
        st_out *outs = calloc((size_t)(hi - lo), sizeof *outs);
        char shard[64];
        snprintf(shard, sizeof shard, "model-%05d-of-00002.safetensors", s + 1);
        for (int i = lo; i < hi; i++) {
            outs[i - lo].name = f.t[i].name;
            outs[i - lo].ndim = f.t[i].ndim;
            memcpy(outs[i - lo].shape, f.t[i].shape, sizeof f.t[i].shape);
            json_object_set_new(wm, f.t[i].name, json_string(shard));
        }
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        shard_ctx ctx = {&f, lo};
        CHECK(st_write(path, outs, hi - lo, NULL, shard_fill, &ctx, &err) == 0);
        free(outs);
    }
    json_t *idx = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", wm);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_dump_file(idx, path, 0);
    json_decref(idx);
    CHECK(model_load_dir(&b, dir, &err) == 0);
    CHECK(memcmp(a.params, b.params, buf_floats(&a) * sizeof(float)) == 0);
    /* a shard that disappeared is an error naming it */
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    unlink(path);
    int rc = model_load_dir(&b, dir, &err);
    CHECK_ERR(rc, err, "model-00002-of-00002.safetensors");
    st_close(&f);
    model_free(&a);
    model_free(&b);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ty-engine-model-XXXXXX");
    if (!mkdtemp(tmpdir)) return 2;
    ty_err err = {0};
    if (kn_open(&kn, KN_CPU, 0, 1, &err)) {
        fprintf(stderr, "kn_open: %s\n", err.msg);
        return 1;
    }
    roundtrip(GPT2, "gpt2");
    roundtrip(QWEN, "qwen2");
    roundtrip(
        "{\"model_type\":\"llama\",\"hidden_size\":16,\"intermediate_size\":20,\"num_hidden_layers\":1,"
        "\"num_attention_heads\":2,\"vocab_size\":31,\"tie_word_embeddings\":true,"
        "\"max_position_embeddings\":8}",
        "llama_tied");
    test_conv1d_layout();
    test_bad_tensors();
    test_sharded();
    kn_close(kn);
    ty_rm_rf(tmpdir, NULL);
    return ty_summary("engine model");
}
