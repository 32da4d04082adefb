/* test_io.c — unit tests of the engine parts that need no device:
 * safetensors (round trip, fp16/bf16, every malformed header the reader must
 * reject), config.json parsing, the tokens dataset and its shuffle, and
 * checkpoint manifests (commit, verify, corruption, pruning). */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tyassert.h"
#include "ckpt.h"
#include "data.h"
#include "hfconfig.h"
#include "rng.h"
#include "safetensors.h"
#include "tyutil.h"

static char tmpdir[256];

static void path_in(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", tmpdir, name);
}

/* Writes a raw safetensors file: header text (unpadded) plus data bytes. */
static void write_raw(const char *path, const char *header, const void *data, size_t dlen,
                      uint64_t claimed)
{
    FILE *f = fopen(path, "wb");
    size_t hl = strlen(header);
    uint64_t n = claimed ? claimed : hl;
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(n >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(header, 1, hl, f);
    if (dlen) fwrite(data, 1, dlen, f);
    fclose(f);
}

static int fill_seq(void *ctx, int i, float *buf, ty_err *err)
{
    (void)err;
    const st_out *outs = ctx;
    uint64_t n = 1;
    for (int d = 0; d < outs[i].ndim; d++)
        n *= (uint64_t)outs[i].shape[d];
    for (uint64_t k = 0; k < n; k++)
        buf[k] = (float)(i * 1000 + (int)k) * 0.5f - 3.25f;
    return 0;
}

static void test_safetensors_roundtrip(void)
{
    char path[512];
    path_in(path, sizeof path, "rt.safetensors");
    st_out outs[3] = {{"a.weight", 2, {3, 5}}, {"b", 1, {7}}, {"empty", 2, {0, 4}}};
    ty_err err = {0};
    json_t *meta = json_pack("{s:s}", "format", "pt");
    CHECK(st_write(path, outs, 3, meta, fill_seq, outs, &err) == 0);
    json_decref(meta);
    struct stat st;
    stat(path, &st);
    st_file f;
    CHECK(st_open(&f, path, &err) == 0);
    CHECK(f.n == 3);
    /* Data area starts 8-byte aligned, as HF's writer pads with spaces. */
    CHECK((f.t[0].data - (const uint8_t *)f.map) % 8 == 0);
    CHECK(json_is_string(json_object_get(f.metadata, "format")));
    const st_tensor *a = st_find(&f, "a.weight");
    CHECK(a && a->dtype == ST_F32 && a->ndim == 2 && a->shape[0] == 3 && a->shape[1] == 5);
    float buf[16];
    CHECK(a && st_to_f32(a, buf, &err) == 0);
    CHECK(buf[7] == 7 * 0.5f - 3.25f);
    const st_tensor *b = st_find(&f, "b");
    CHECK(b && st_to_f32(b, buf, &err) == 0 && buf[6] == (1000 + 6) * 0.5f - 3.25f);
    CHECK(st_find(&f, "nope") == NULL);
    st_close(&f);
}

/* st_write_ranges: elements [off, off + n) of tensor i, never more than
 * a piece; values exact in bf16 (integers -125..125). */
static size_t most_asked;
static int fill_range_seq(void *ctx, int i, uint64_t off, size_t n, float *buf, ty_err *err)
{
    (void)ctx;
    (void)err;
    if (n > most_asked) most_asked = n;
    for (size_t k = 0; k < n; k++)
        buf[k] = (float)((int)((off + k + (uint64_t)i * 7) % 251) - 125);
    return 0;
}

/* A tensor of 2.6M elements goes out in three pieces and reads back
 * whole, in F32 and BF16; the small and the empty tensor around it too. */
static void test_safetensors_ranges(void)
{
    st_out outs[3] = {{"small", 1, {7}}, {"big", 2, {2, 1300000}}, {"empty", 2, {0, 4}}};
    const st_dtype dts[2] = {ST_F32, ST_BF16};
    float *back = malloc(2600000 * sizeof *back);
    REQUIRE(back != NULL);
    for (int d = 0; d < 2; d++) {
        char path[512];
        path_in(path, sizeof path, d ? "ranges16.safetensors" : "ranges.safetensors");
        ty_err err = {0};
        most_asked = 0;
        CHECK(st_write_ranges(path, outs, 3, NULL, fill_range_seq, NULL, dts[d], &err) == 0, "%s",
              err.msg);
        CHECK(most_asked == ST_WRITE_PIECE, "%zu elements asked at once", most_asked);
        st_file f;
        REQUIRE(st_open(&f, path, &err) == 0);
        const st_tensor *big = st_find(&f, "big"), *small = st_find(&f, "small");
        CHECK(big && big->dtype == dts[d] && big->shape[1] == 1300000);
        CHECK(st_find(&f, "empty") != NULL);
        int bad = 0;
        if (big && st_to_f32(big, back, &err) == 0)
            for (size_t k = 0; k < 2600000; k++)
                bad += back[k] != (float)((int)((k + 7) % 251) - 125);
        else
            bad = 1;
        CHECK(bad == 0, "%d wrong elements", bad);
        CHECK(small && st_to_f32(small, back, &err) == 0 && back[6] == 6 - 125);
        st_close(&f);
    }
    free(back);
}

static void test_half_conversions(void)
{
    CHECK(st_f16_to_f32(0x3c00) == 1.0f);
    CHECK(st_f16_to_f32(0xc000) == -2.0f);
    CHECK(st_f16_to_f32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    CHECK(st_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(isinf(st_f16_to_f32(0x7c00)));
    CHECK(st_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(st_bf16_to_f32(0xc0a0) == -5.0f);
    /* F16 and BF16 tensors load as fp32. */
    char path[512];
    path_in(path, sizeof path, "half.safetensors");
    uint16_t data[4] = {0x3c00, 0x4000, 0x3f80, 0x4040};
    write_raw(path,
              "{\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}",
              data, sizeof data, 0);
    st_file f;
    ty_err err = {0};
    float out[2];
    CHECK(st_open(&f, path, &err) == 0);
    CHECK(st_to_f32(st_find(&f, "h"), out, &err) == 0 && out[0] == 1.0f && out[1] == 2.0f);
    CHECK(st_to_f32(st_find(&f, "b"), out, &err) == 0 && out[0] == 1.0f && out[1] == 3.0f);
    st_close(&f);
}

/* Every malformed file: st_open fails with a message naming the problem. */
static void expect_bad(const char *header, size_t dlen, uint64_t claimed, const char *fragment)
{
    char path[512];
    path_in(path, sizeof path, "bad.safetensors");
    unsigned char data[64] = {0};
    write_raw(path, header, data, dlen, claimed);
    st_file f;
    ty_err err = {0};
    int rc = st_open(&f, path, &err);
    CHECK_ERR(rc, err, fragment);
    if (rc == 0) st_close(&f);
}

static void test_safetensors_bad(void)
{
    const char *ok = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    { /* the well-formed file every bad case below is a variation of */
        char path[512];
        path_in(path, sizeof path, "good.safetensors");
        unsigned char data[8] = {0};
        write_raw(path, ok, data, 8, 0);
        st_file f;
        ty_err err = {0};
        CHECK(st_open(&f, path, &err) == 0);
        st_close(&f);
    }
    expect_bad(ok, 4, 0, "outside the data area"); /* truncated data */
    expect_bad(ok, 8, 1u << 20, "header length");  /* length beyond file */
    expect_bad("{\"x\": nope}", 0, 0, "not valid JSON");
    expect_bad("[1,2]", 0, 0, "not a JSON object");
    expect_bad("{\"x\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0,
               "unknown dtype \"Q4\"");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, 0,
               "shape x dtype");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 8, 0,
               "outside the data area");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               16, 0, "overlap");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, 0,
               "begin <= end");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, 0,
               "non-negative");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
               8, 0, "not valid JSON"); /* duplicate key */
    /* A file shorter than its 8-byte length prefix. */
    char path[512];
    path_in(path, sizeof path, "tiny.safetensors");
    FILE *f = fopen(path, "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    st_file sf;
    ty_err err = {0};
    int rc = st_open(&sf, path, &err);
    CHECK_ERR(rc, err, "truncated");
    path_in(path, sizeof path, "missing.safetensors");
    rc = st_open(&sf, path, &err);
    CHECK_ERR(rc, err, "missing.safetensors");
    /* An integer dtype is readable but not convertible to weights. */
    path_in(path, sizeof path, "int.safetensors");
    int64_t iv[1] = {5};
    write_raw(path, "{\"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", iv, 8, 0);
    CHECK(st_open(&sf, path, &err) == 0);
    float out[1];
    rc = st_to_f32(st_find(&sf, "i"), out, &err);
    CHECK_ERR(rc, err, "dtype I64");
    st_close(&sf);
}

static void test_config(void)
{
    model_config c;
    ty_err err = {0};
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "model_type", "gpt2", "n_embd", 64,
                          "n_layer", 2, "n_head", 4, "n_positions", 128, "vocab_size", 101);
    CHECK(hfconfig_parse(o, "t", &c, &err) == 0);
    CHECK(c.arch == ARCH_GPT2 && c.ffn == 256 && c.head_dim == 16 && c.tied == 1 &&
          c.max_pos == 128);
    CHECK(fabsf(c.norm_eps - 1e-5f) < 1e-12f);
    hfconfig_free(&c);
    json_decref(o);

    o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i}", "model_type", "qwen2", "hidden_size", 64,
                  "intermediate_size", 96, "num_hidden_layers", 1, "num_attention_heads", 4,
                  "num_key_value_heads", 2, "vocab_size", 99);
    CHECK(hfconfig_parse(o, "t", &c, &err) == 0);
    CHECK(c.arch == ARCH_LLAMA && c.qkv_bias && !c.o_bias && !c.tied && c.n_kv_head == 2 &&
          c.head_dim == 16);
    CHECK(c.max_pos == 32768 && c.rope_theta == 10000.0f);
    json_t *ex = hfconfig_export(&c);
    CHECK(!strcmp(json_string_value(json_array_get(json_object_get(ex, "architectures"), 0)),
                  "Qwen2ForCausalLM"));
    json_decref(ex);
    hfconfig_free(&c);
    json_decref(o);

    o = json_pack("{s:s, s:i, s:i, s:i}", "model_type", "llama", "hidden_size", 48,
                  "num_attention_heads", 6, "num_key_value_heads", 4);
    int rc = hfconfig_parse(o, "t", &c, &err);
    CHECK_ERR(rc, err, "num_key_value_heads");
    json_decref(o);
    o = json_pack("{s:s}", "model_type", "bert");
    rc = hfconfig_parse(o, "t", &c, &err);
    CHECK_ERR(rc, err, "not supported");
    json_decref(o);
    o = json_pack("{s:s, s:{s:s}}", "model_type", "llama", "rope_scaling", "type", "linear");
    rc = hfconfig_parse(o, "t", &c, &err);
    CHECK_ERR(rc, err, "rope_scaling");
    json_decref(o);
    o = json_pack("{s:s, s:s}", "model_type", "gpt2", "activation_function", "relu");
    rc = hfconfig_parse(o, "t", &c, &err);
    CHECK_ERR(rc, err, "gelu_new");
    json_decref(o);
}

static void write_text(const char *name, const char *text, char *path, size_t n)
{
    path_in(path, n, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void test_data(void)
{
    char path[512];
    dataset d;
    ty_err err = {0};
    write_text("ok.jsonl",
               "{\"input_ids\": [1, 2, 3, 4]}\n\n"
               "{\"input_ids\": [5, 6, 7], \"labels\": [-100, 6, 7]}\n"
               "{\"input_ids\": [9]}\n",
               path, sizeof path);
    CHECK(data_load_tokens(path, 10, &d, &err) == 0);
    CHECK(d.n == 3);
    int32_t in[3], tg[3];
    /* truncated to T = 3: targets are the next labels, the last one ignored */
    CHECK(data_fill_row(&d, 0, 3, in, tg) == 2);
    CHECK(in[0] == 1 && in[2] == 3 && tg[0] == 2 && tg[1] == 3 && tg[2] == DATA_IGNORE);
    CHECK(data_fill_row(&d, 1, 3, in, tg) == 2 && tg[0] == 6 && tg[1] == 7 && tg[2] == DATA_IGNORE);
    /* padding: ignored targets, id 0 inputs */
    CHECK(data_fill_row(&d, 2, 3, in, tg) == 0 && in[0] == 9 && in[1] == 0 && tg[0] == DATA_IGNORE);
    data_free(&d);

    write_text("vocab.jsonl", "{\"input_ids\": [1]}\n{\"input_ids\": [1, 10]}\n", path,
               sizeof path);
    int rc = data_load_tokens(path, 10, &d, &err);
    CHECK_ERR(rc, err, "line 2: input_ids[1] = 10 is outside the vocabulary");
    write_text("json.jsonl", "{\"input_ids\": [1]}\n{\"input_ids\": [1,\n", path, sizeof path);
    rc = data_load_tokens(path, 10, &d, &err);
    CHECK_ERR(rc, err, "line 2: not valid JSON");
    CHECK(strstr(err.msg, "json.jsonl") != NULL);
    write_text("empty.jsonl", "\n\n", path, sizeof path);
    rc = data_load_tokens(path, 10, &d, &err);
    CHECK_ERR(rc, err, "empty dataset");
    write_text("labels.jsonl", "{\"input_ids\": [1, 2], \"labels\": [1]}\n", path, sizeof path);
    rc = data_load_tokens(path, 10, &d, &err);
    CHECK_ERR(rc, err, "as long as input_ids");
    write_text("noids.jsonl", "{\"text\": \"hi\"}\n", path, sizeof path);
    rc = data_load_tokens(path, 10, &d, &err);
    CHECK_ERR(rc, err, "line 1: needs \"input_ids\"");
    path_in(path, sizeof path, "absent.jsonl");
    rc = data_load_tokens(path, 10, &d, &err);
    CHECK_ERR(rc, err, "absent.jsonl");
}

static void test_split(void)
{
    char path[512];
    dataset d, ev;
    ty_err err = {0};
    write_text("split.jsonl",
               "{\"input_ids\": [0, 1]}\n{\"input_ids\": [1, 2]}\n{\"input_ids\": [2, 3]}\n"
               "{\"input_ids\": [3, 4]}\n{\"input_ids\": [4, 5]}\n{\"input_ids\": [5, 6]}\n",
               path, sizeof path);
    CHECK(data_load_tokens(path, 10, &d, &err) == 0);
    CHECK(data_split(&d, 0.34, 99, &ev, &err) == 0);
    CHECK(d.n == 4 && ev.n == 2);
    /* disjoint, complete, each part in file order */
    int seen[6] = {0}, ordered = 1;
    for (int i = 0; i < d.n; i++) {
        seen[d.tok[d.off[i]]]++;
        if (i) ordered &= d.tok[d.off[i]] > d.tok[d.off[i - 1]];
    }
    for (int i = 0; i < ev.n; i++) {
        seen[ev.tok[ev.off[i]]]++;
        if (i) ordered &= ev.tok[ev.off[i]] > ev.tok[ev.off[i - 1]];
    }
    int all = 1;
    for (int i = 0; i < 6; i++)
        all &= seen[i] == 1;
    CHECK(all && ordered);
    /* the held-out examples are the first two of the salted permutation */
    int32_t perm[6];
    data_permutation(99 ^ DATA_SPLIT_SALT, 0, 6, perm);
    int lo = perm[0] < perm[1] ? perm[0] : perm[1];
    CHECK(ev.tok[ev.off[0]] == lo);
    data_free(&d);
    data_free(&ev);
    write_text("one.jsonl", "{\"input_ids\": [1, 2]}\n", path, sizeof path);
    CHECK(data_load_tokens(path, 10, &d, &err) == 0);
    int rc = data_split(&d, 0.5, 1, &ev, &err);
    CHECK_ERR(rc, err, "cannot be split");
    data_free(&d);
}

static void test_shuffle(void)
{
    enum { N = 257 };
    int32_t p[N], q[N];
    int seen[N] = {0};
    data_permutation(42, 0, N, p);
    for (int i = 0; i < N; i++)
        seen[p[i]]++;
    int perm_ok = 1, same = 1;
    for (int i = 0; i < N; i++)
        perm_ok &= seen[i] == 1;
    CHECK(perm_ok);
    data_permutation(42, 0, N, q);
    CHECK(memcmp(p, q, sizeof p) == 0); /* deterministic */
    data_permutation(42, 1, N, q);
    for (int i = 0; i < N; i++)
        same &= p[i] == q[i];
    CHECK(!same); /* a new order each epoch */
    /* Known first values pin the documented algorithm (see data.h). */
    uint64_t s = 0;
    CHECK(rng_splitmix64(&s) == 0xE220A8397B1DCDAFull);
    int32_t small[3];
    data_permutation(0, 0, 3, small);
    uint64_t st = 0 ^ 0x9E3779B97F4A7C15ull;
    int32_t ref[3] = {0, 1, 2};
    for (int i = 2; i > 0; i--) {
        int j = (int)(rng_splitmix64(&st) % (uint64_t)(i + 1));
        int32_t t = ref[i];
        ref[i] = ref[j];
        ref[j] = t;
    }
    CHECK(memcmp(small, ref, sizeof ref) == 0);
    /* The sampler crosses epochs and resumes from its cursor. */
    data_sampler a, b;
    ty_err err = {0};
    CHECK(data_sampler_init(&a, 5, 7, 0, 0, &err) == 0);
    int seq[12];
    for (int i = 0; i < 12; i++)
        seq[i] = data_sampler_next(&a);
    CHECK(a.epoch == 2 && a.pos == 2);
    CHECK(data_sampler_init(&b, 5, 7, 1, 3, &err) == 0);
    int ok = 1;
    for (int i = 8; i < 12; i++)
        ok &= data_sampler_next(&b) == seq[i];
    CHECK(ok);
    data_sampler_free(&a);
    data_sampler_free(&b);
}

static void test_ckpt(void)
{
    ty_err err = {0};
    char dir[512], file[600];
    for (int step = 1; step <= 4; step++) {
        ckpt_dir_name(dir, sizeof dir, tmpdir, step * 10);
        CHECK(ckpt_begin(dir, &err) == 0);
        snprintf(file, sizeof file, "%s/a.bin", dir);
        CHECK(ty_write_file_atomic(file, "hello", 5, &err) == 0);
        const char *files[] = {"a.bin"};
        uint64_t bytes = 0;
        CHECK(ckpt_commit(dir, step * 10, files, 1, &bytes, &err) == 0);
        CHECK(bytes > 5);
    }
    char rel[64];
    ckpt_rel_name(rel, sizeof rel, 40);
    CHECK(!strcmp(rel, "checkpoints/step-000040"));
    /* manifest format */
    snprintf(file, sizeof file, "%s/MANIFEST.json", dir);
    json_error_t je;
    json_t *m = json_load_file(file, 0, &je);
    CHECK(m && !strcmp(json_string_value(json_object_get(m, "format")), "trainyard-checkpoint/1"));
    CHECK(json_integer_value(json_object_get(m, "step")) == 40);
    json_t *f0 = json_array_get(json_object_get(m, "files"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(f0, "path")), "a.bin"));
    CHECK(json_integer_value(json_object_get(f0, "bytes")) == 5);
    CHECK(!strcmp(json_string_value(json_object_get(f0, "sha256")),
                  "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"));
    json_decref(m);
    int64_t step = 0;
    CHECK(ckpt_verify(dir, &step, &err) == 0 && step == 40);
    /* corrupt one byte: the sum no longer matches */
    snprintf(file, sizeof file, "%s/a.bin", dir);
    CHECK(ty_write_file_atomic(file, "jello", 5, &err) == 0);
    int rc = ckpt_verify(dir, &step, &err);
    CHECK_ERR(rc, err, "checkpoint corrupt: a.bin sha256 mismatch");
    /* an incomplete checkpoint (no manifest) does not exist */
    ckpt_dir_name(dir, sizeof dir, tmpdir, 50);
    CHECK(ckpt_begin(dir, &err) == 0);
    rc = ckpt_verify(dir, &step, &err);
    CHECK_ERR(rc, err, "no MANIFEST.json");
    /* keep_last 2: 30 and 40 stay; the incomplete 50 is newer than the newest
     * committed one and may still be in progress, so it stays too */
    CHECK(ckpt_prune(tmpdir, 2, 0, &err) == 0);
    struct stat st;
    char p[600];
    for (int s = 1; s <= 5; s++) {
        ckpt_dir_name(p, sizeof p, tmpdir, s * 10);
        int exists = stat(p, &st) == 0;
        CHECK(exists == (s >= 3));
    }
}

/* keep_best spares the lowest eval losses from keep_last's pruning. */
static void test_keep_best(void)
{
    char root[300], dir[600], file[700];
    ty_err err = {0};
    snprintf(root, sizeof root, "%s/best", tmpdir);
    static const double losses[5] = {3.0, 1.5, 2.0, 1.0, 4.0}; /* steps 1..5; step 4 has no eval */
    for (int s = 1; s <= 5; s++) {
        ckpt_dir_name(dir, sizeof dir, root, s);
        CHECK(ckpt_begin(dir, &err) == 0);
        char state[128];
        if (s == 4)
            snprintf(state, sizeof state, "{\"step\": %d}", s);
        else
            snprintf(state, sizeof state, "{\"step\": %d, \"eval_loss\": %g}", s, losses[s - 1]);
        snprintf(file, sizeof file, "%s/trainer_state.json", dir);
        CHECK(ty_write_file_atomic(file, state, strlen(state), &err) == 0);
        const char *files[] = {"trainer_state.json"};
        CHECK(ckpt_commit(dir, s, files, 1, NULL, &err) == 0);
    }
    /* keep_last 1 keeps step 5; keep_best 2 keeps steps 2 (1.5) and 3 (2.0) */
    CHECK(ckpt_prune(root, 1, 2, &err) == 0);
    struct stat st;
    for (int s = 1; s <= 5; s++) {
        ckpt_dir_name(dir, sizeof dir, root, s);
        CHECK((stat(dir, &st) == 0) == (s == 2 || s == 3 || s == 5));
    }
}

/* An st_bufs allocator that counts, and gives nothing when refuse is set
 * (the writer then uses malloc's and releases none of them). */
static int allocs, releases, refuse;
static size_t alloc_bytes;
static void *count_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    if (refuse) return NULL;
    allocs++;
    alloc_bytes = bytes;
    return malloc(bytes);
}
static void count_release(void *ctx, void *p)
{
    (void)ctx;
    releases++;
    free(p);
}

/* st_write_ranges_in takes its piece buffers from the caller's allocator
 * (three of a piece each, all given back) or, refused, from malloc; the
 * file is the same either way. */
static void test_safetensors_bufs(void)
{
    st_out outs[2] = {{"small", 1, {7}}, {"big", 2, {2, 1300000}}};
    st_bufs bufs = {count_alloc, count_release, NULL};
    float *back = malloc(2600000 * sizeof *back);
    REQUIRE(back != NULL);
    for (refuse = 0; refuse < 2; refuse++) {
        char path[512];
        path_in(path, sizeof path, "bufs.safetensors");
        ty_err err = {0};
        allocs = releases = 0;
        CHECK(st_write_ranges_in(path, outs, 2, NULL, fill_range_seq, NULL, ST_BF16, &bufs, &err) ==
                  0,
              "%s", err.msg);
        CHECK(allocs == (refuse ? 0 : 3) && releases == allocs, "%d allocs, %d releases", allocs,
              releases);
        CHECK(refuse || alloc_bytes == ST_WRITE_PIECE * sizeof(float), "%zu bytes", alloc_bytes);
        st_file f;
        REQUIRE(st_open(&f, path, &err) == 0);
        const st_tensor *big = st_find(&f, "big");
        int bad = !big || st_to_f32(big, back, &err) != 0;
        for (size_t k = 0; !bad && k < 2600000; k++)
            bad += back[k] != (float)((int)((k + 7) % 251) - 125);
        CHECK(bad == 0, "%d wrong elements", bad);
        st_close(&f);
    }
    free(back);
}

/* A fill that counts its calls and fails at piece fail_at (-1: never). */
static int fills, fail_at;
static int fill_range_count(void *ctx, int i, uint64_t off, size_t n, float *buf, ty_err *err)
{
    (void)ctx;
    (void)i;
    (void)off;
    if (fills++ == fail_at)
        return ty_err_set(err, TY_EINTERNAL, "fill failed at piece %d", fail_at);
    memset(buf, 0, n * sizeof *buf);
    return 0;
}

/* The pieces' writer thread stops at the first failure and says which:
 * a full device (/dev/full) is an I/O error naming it, and the fill is
 * not asked for the rest of a 20-piece tensor; a fill's own error comes
 * back as it was, from the middle of the ring. */
static void test_safetensors_write_errors(void)
{
    st_out big = {"big", 2, {20, (int64_t)ST_WRITE_PIECE}};
    ty_err err = {0};
    fills = 0;
    fail_at = -1;
    int rc = st_write_ranges("/dev/full", &big, 1, NULL, fill_range_count, NULL, ST_BF16, &err);
    CHECK(rc == TY_EIO && strstr(err.msg, "No space left"), "rc %d: %s", rc, err.msg);
    CHECK(fills < 20, "%d of 20 pieces filled after the device was full", fills);
    char path[512];
    path_in(path, sizeof path, "fill-fails.safetensors");
    memset(&err, 0, sizeof err);
    fills = 0;
    fail_at = 5;
    rc = st_write_ranges(path, &big, 1, NULL, fill_range_count, NULL, ST_F32, &err);
    CHECK(rc == TY_EINTERNAL && strstr(err.msg, "fill failed at piece 5"), "rc %d: %s", rc,
          err.msg);
    CHECK(fills == 6, "%d fills", fills);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ty-engine-io-XXXXXX");
    if (!mkdtemp(tmpdir)) return 2;
    test_safetensors_roundtrip();
    test_safetensors_ranges();
    test_safetensors_write_errors();
    test_safetensors_bufs();
    test_half_conversions();
    test_safetensors_bad();
    test_config();
    test_data();
    test_split();
    test_shuffle();
    test_ckpt();
    test_keep_best();
    ty_rm_rf(tmpdir, NULL);
    return ty_summary("engine io");
}
