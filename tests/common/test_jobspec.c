/* test_jobspec.c — unit test of the job-spec validator (common/jobspec.c).
 *
 * Every bad input of docs/api.md's spec rules gets the right code and names the right
 * field; the DESIGN §4 example parses; defaults are those jobspec.h states;
 * jobspec_to_json round-trips; jobspec_check_roots enforces the roots. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jobspec.h"

#include "tyassert.h"

static const char *DESIGN_EXAMPLE =
    "{\n"
    "  \"name\": \"med-qa-lora\",\n"
    "  \"model\": {\"path\": \"/models/tinyllama-1.1b\"},\n"
    "  \"dataset\": {\"train\": \"/data/train.jsonl\", \"eval\": \"/data/eval.jsonl\",\n"
    "              \"format\": \"prompt_completion\"},\n"
    "  \"method\": \"lora\",\n"
    "  \"lora\": {\"r\": 16, \"alpha\": 32, \"dropout\": 0.05, \"use_rslora\": true,\n"
    "           \"bias\": \"lora_only\",\n"
    "           \"targets\": [\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\"]},\n"
    "  \"hyperparameters\": {\"max_steps\": 1000, \"batch_size\": 8, \"seq_len\": 1024,\n"
    "                      \"grad_accum\": 4, \"lr\": 2e-4, \"schedule\": \"cosine\",\n"
    "                      \"warmup_steps\": 50, \"weight_decay\": 0.0,\n"
    "                      \"max_grad_norm\": 1.0, \"seed\": 1234, \"recompute\": \"mlp\"},\n"
    "  \"precision\": \"bf16\", \"export\": {\"dtype\": \"fp16\"},\n"
    "  \"resources\": {\"gpus\": 1, \"backend\": \"auto\"},\n"
    "  \"checkpoint\": {\"every_steps\": 200, \"keep_last\": 3,\n"
    "                 \"store\": \"s3://my-bucket/runs/med-qa\"},\n"
    "  \"priority\": 0\n"
    "}\n";

#define MINIMAL_HEAD "{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"/d/t.jsonl\"},"
#define MINIMAL MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10}}"

static void test_design_example(void)
{
    jobspec s;
    ty_err e;
    int rc = jobspec_parse_text(DESIGN_EXAMPLE, strlen(DESIGN_EXAMPLE), &s, &e);
    CHECK(rc == 0, "DESIGN example rejected: %s (%s)", e.msg, e.field);
    if (rc) return;
    CHECK(strcmp(s.name, "med-qa-lora") == 0, "name");
    CHECK(strcmp(s.model_path, "/models/tinyllama-1.1b") == 0, "model.path");
    CHECK(!s.model_init, "model.init");
    CHECK(strcmp(s.train, "/data/train.jsonl") == 0 && strcmp(s.eval, "/data/eval.jsonl") == 0,
          "dataset");
    CHECK(s.format == DS_PROMPT_COMPLETION, "format");
    CHECK(s.method == METHOD_LORA && s.lora_r == 16 && s.lora_alpha == 32 &&
              s.lora_dropout == 0.05 && s.lora_use_rslora && s.lora_bias == JOBSPEC_BIAS_LORA_ONLY,
          "lora");
    CHECK(s.n_targets == 4 && strcmp(s.targets[3], "o_proj") == 0, "targets");
    CHECK(s.max_steps == 1000 && s.batch_size == 8 && s.seq_len == 1024 && s.grad_accum == 4,
          "hp ints");
    CHECK(s.lr == 2e-4 && s.schedule == SCHED_COSINE && s.warmup_steps == 50, "hp lr");
    CHECK(s.recompute == RECOMPUTE_MLP && strcmp(jobspec_recompute_name(s.recompute), "mlp") == 0,
          "recompute");
    CHECK(s.export_dtype == EXPORT_DTYPE_FP16 &&
              strcmp(jobspec_export_dtype_name(s.export_dtype), "fp16") == 0,
          "export.dtype");
    CHECK(s.precision == PREC_BF16 && s.gpus == 1 && s.backend == BACKEND_AUTO, "resources");
    CHECK(s.cpu_ranks == 1 && s.zero == 0, "resources.cpu_ranks and zero default to 1 and 0");
    CHECK(s.nodes == 1, "resources.nodes defaults to 1");
    CHECK(s.bucket_kb == 4096, "resources.bucket_kb defaults to 4096");
    CHECK(s.ckpt_every_steps == 200 && s.keep_last == 3 &&
              strcmp(s.store, "s3://my-bucket/runs/med-qa") == 0,
          "checkpoint");
    CHECK(strcmp(jobspec_method_name(s.method), "lora") == 0, "method name");
    CHECK(strcmp(jobspec_precision_name(s.precision), "bf16") == 0, "precision name");
    CHECK(strcmp(jobspec_backend_name(s.backend), "auto") == 0, "backend name");

    /* Round trip: to_json, parse again, to_json again: identical documents. */
    json_t *j1 = jobspec_to_json(&s);
    jobspec s2;
    rc = jobspec_parse(j1, &s2, &e);
    CHECK(rc == 0, "round trip rejected: %s", e.msg);
    if (rc == 0) {
        json_t *j2 = jobspec_to_json(&s2);
        CHECK(json_equal(j1, j2), "round trip differs");
        CHECK(s2.n_targets == 4 && s2.lr == s.lr && s2.seed == s.seed && s2.lora_use_rslora &&
                  s2.lora_bias == JOBSPEC_BIAS_LORA_ONLY,
              "round trip values");
        json_decref(j2);
        jobspec_free(&s2);
    }
    json_decref(j1);
    jobspec_free(&s);
    CHECK(s.name == NULL && s.n_targets == 0, "jobspec_free leaves the struct zeroed");
}

static void test_defaults(void)
{
    jobspec s;
    ty_err e;
    int rc = jobspec_parse_text(MINIMAL, strlen(MINIMAL), &s, &e);
    CHECK(rc == 0, "minimal spec rejected: %s", e.msg);
    if (rc) return;
    CHECK(s.name == NULL && s.eval == NULL && s.store == NULL && s.lora_adapter == NULL,
          "optional NULLs");
    CHECK(s.format == DS_TOKENS, "format default");
    CHECK(strcmp(s.text_field, "text") == 0, "text_field default");
    CHECK(strcmp(s.chat_template, "chatml") == 0, "chat_template default");
    CHECK(!s.packing && !s.skip_invalid && s.eval_fraction == 0, "dataset defaults");
    CHECK(s.method == METHOD_FULL, "method default");
    CHECK(s.lora_r == 8 && s.lora_alpha == 16 && s.lora_dropout == 0 && s.n_targets == 0 &&
              !s.lora_merge && !s.lora_use_rslora,
          "lora defaults");
    CHECK(s.batch_size == 1 && s.seq_len == 256 && s.grad_accum == 1, "batch defaults");
    CHECK(s.lr == 1e-4 && s.schedule == SCHED_CONSTANT && s.warmup_steps == 0, "lr defaults");
    CHECK(s.weight_decay == 0 && s.max_grad_norm == 1.0, "wd defaults");
    CHECK(s.adam_beta1 == 0.9 && s.adam_beta2 == 0.999 && s.adam_eps == 1e-8, "adam defaults");
    CHECK(s.seed == 1234 && s.log_every_steps == 10 && s.eval_every_steps == 0, "misc defaults");
    CHECK(s.recompute == RECOMPUTE_NONE && s.export_dtype == EXPORT_DTYPE_AUTO,
          "recompute/export defaults");
    CHECK(s.precision == PREC_FP32 && s.gpus == 0 && s.backend == BACKEND_AUTO,
          "resource defaults");
    CHECK(s.ckpt_every_steps == 0 && s.keep_last == 0 && s.keep_best == 0, "checkpoint defaults");
    CHECK(s.priority == 0 && s.max_restarts == 3, "priority defaults");
    json_t *j = jobspec_to_json(&s);
    CHECK(json_object_get(j, "lora") == NULL, "no lora section for method full");
    CHECK(json_real_value(json_object_get(json_object_get(j, "hyperparameters"), "lr")) == 1e-4,
          "defaults in to_json");
    json_decref(j);
    jobspec_free(&s);
}

static void test_model_init(void)
{
    const char *t =
        "{\"model\":{\"init\":{\"model_type\":\"llama\",\"hidden_size\":64}},"
        "\"dataset\":{\"train\":\"file:///d/t.jsonl\",\"format\":\"text\"},"
        "\"method\":\"qlora\",\"lora\":{\"r\":4,\"targets\":[\"model.layers.0.q_proj\"]},"
        "\"hyperparameters\":{\"max_steps\":1,\"seed\":0},\"checkpoint\":{\"store\":\"file:///s\"}}";
    jobspec s;
    ty_err e;
    int rc = jobspec_parse_text(t, strlen(t), &s, &e);
    CHECK(rc == 0, "model.init spec rejected: %s", e.msg);
    if (rc) return;
    CHECK(s.model_path == NULL && json_is_object(s.model_init), "model.init kept");
    CHECK(json_integer_value(json_object_get(s.model_init, "hidden_size")) == 64, "init content");
    CHECK(s.method == METHOD_QLORA && s.lora_r == 4 && s.n_targets == 1 && s.seed == 0, "qlora");
    CHECK(strcmp(s.train, "file:///d/t.jsonl") == 0, "file URI kept verbatim");
    json_t *j1 = jobspec_to_json(&s);
    jobspec s2;
    rc = jobspec_parse(j1, &s2, &e);
    CHECK(rc == 0, "model.init round trip rejected: %s", e.msg);
    if (rc == 0) {
        json_t *j2 = jobspec_to_json(&s2);
        CHECK(json_equal(j1, j2) && json_equal(s.model_init, s2.model_init),
              "model.init round trip differs");
        json_decref(j2);
        jobspec_free(&s2);
    }
    json_decref(j1);
    jobspec_free(&s);
}

struct bad {
    const char *text;
    int code;
    const char *field; /* NULL: don't care (malformed input has no field) */
};

static const struct bad BAD[] = {
    /* malformed JSON, invalid UTF-8, duplicates: TY_ECORRUPT */
    {"{\"model\": ", TY_ECORRUPT, ""},
    {"", TY_ECORRUPT, ""},
    {"{\"name\": \"a\xff\"}", TY_ECORRUPT, ""},
    {"{\"name\": \"\xc3\x28\"}", TY_ECORRUPT, ""},
    {"{\"name\": \"\xed\xa0\x80\"}", TY_ECORRUPT, ""}, /* UTF-16 surrogate */
    {"{\"name\": \"\xc0\xaf\"}", TY_ECORRUPT, ""},     /* overlong */
    {"{\"name\":\"a\",\"name\":\"b\"}", TY_ECORRUPT, ""},
    {"[1,2]", TY_EINVAL, ""},
    {"\"spec\"", TY_EINVAL, ""},
    /* unknown fields, at every level */
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"learning_rate\":1}", TY_EINVAL,
     "learning_rate"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"learning_rate\":1}}", TY_EINVAL,
     "hyperparameters.learning_rate"},
    {"{\"model\":{\"path\":\"/m\",\"revision\":\"main\"},\"dataset\":{\"train\":\"/t\"},"
     "\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "model.revision"},
    {"{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"/t\",\"shuffle\":true},"
     "\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "dataset.shuffle"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\",\"lora\":{\"rank\":8}}",
     TY_EINVAL, "lora.rank"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"resources\":{\"cpus\":2}}", TY_EINVAL,
     "resources.cpus"},
    /* a dotted key names no field, even where it spells one's path */
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"lora.r\":4}", TY_EINVAL, "lora.r"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"checkpoint\":{\"every\":2}}", TY_EINVAL,
     "checkpoint.every"},
    /* wrong types */
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":\"10\"}}", TY_EINVAL,
     "hyperparameters.max_steps"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10.5}}", TY_EINVAL,
     "hyperparameters.max_steps"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"lr\":\"0.1\"}}", TY_EINVAL,
     "hyperparameters.lr"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"batch_size\":null}}", TY_EINVAL,
     "hyperparameters.batch_size"},
    {MINIMAL_HEAD "\"hyperparameters\":[10]}", TY_EINVAL, "hyperparameters"},
    {"{\"model\":\"/m\",\"dataset\":{\"train\":\"/t\"},\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "model"},
    {"{\"model\":{\"path\":5},\"dataset\":{\"train\":\"/t\"},\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "model.path"},
    {"{\"model\":{\"init\":\"llama\"},\"dataset\":{\"train\":\"/t\"},\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "model.init"},
    {"{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"/t\",\"packing\":1},"
     "\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "dataset.packing"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"name\":42}", TY_EINVAL, "name"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"priority\":true}", TY_EINVAL,
     "priority"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\",\"lora\":{\"targets\":\"q_proj\"}}",
     TY_EINVAL, "lora.targets"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\",\"lora\":{\"targets\":[\"q\",7]}}",
     TY_EINVAL, "lora.targets[1]"},
    /* missing required fields */
    {"{\"dataset\":{\"train\":\"/t\"},\"hyperparameters\":{\"max_steps\":1}}", TY_EINVAL, "model"},
    {"{\"model\":{},\"dataset\":{\"train\":\"/t\"},\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "model.path"},
    {"{\"model\":{\"path\":\"/m\",\"init\":{\"a\":1}},\"dataset\":{\"train\":\"/t\"},"
     "\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "model"},
    {"{\"model\":{\"path\":\"/m\"},\"hyperparameters\":{\"max_steps\":1}}", TY_EINVAL, "dataset"},
    {"{\"model\":{\"path\":\"/m\"},\"dataset\":{},\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "dataset.train"},
    {"{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"/t\"}}", TY_EINVAL, "hyperparameters"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"lr\":0.1}}", TY_EINVAL, "hyperparameters.max_steps"},
    /* out of range: steps, batch, lr and the rest */
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":0}}", TY_EINVAL, "hyperparameters.max_steps"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":-5}}", TY_EINVAL,
     "hyperparameters.max_steps"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":1000000001}}", TY_EINVAL,
     "hyperparameters.max_steps"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"batch_size\":0}}", TY_EINVAL,
     "hyperparameters.batch_size"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"batch_size\":65537}}", TY_EINVAL,
     "hyperparameters.batch_size"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"lr\":0}}", TY_EINVAL,
     "hyperparameters.lr"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"lr\":-0.001}}", TY_EINVAL,
     "hyperparameters.lr"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"lr\":10.5}}", TY_EINVAL,
     "hyperparameters.lr"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"seq_len\":1}}", TY_EINVAL,
     "hyperparameters.seq_len"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"grad_accum\":0}}", TY_EINVAL,
     "hyperparameters.grad_accum"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"adam_beta1\":1}}", TY_EINVAL,
     "hyperparameters.adam_beta1"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"adam_eps\":0}}", TY_EINVAL,
     "hyperparameters.adam_eps"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"warmup_steps\":11}}", TY_EINVAL,
     "hyperparameters.warmup_steps"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"seed\":-1}}", TY_EINVAL,
     "hyperparameters.seed"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"log_every_steps\":0}}", TY_EINVAL,
     "hyperparameters.log_every_steps"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"weight_decay\":11}}", TY_EINVAL,
     "hyperparameters.weight_decay"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"priority\":1001}", TY_EINVAL,
     "priority"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"max_restarts\":101}", TY_EINVAL,
     "max_restarts"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"resources\":{\"gpus\":65}}", TY_EINVAL,
     "resources.gpus"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"resources\":{\"gpus\":2,\"backend\":\"cpu\"}}",
     TY_EINVAL, "resources.backend"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"resources\":{\"cpu_ranks\":0}}",
     TY_EINVAL, "resources.cpu_ranks"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"resources\":{\"cpu_ranks\":257}}",
     TY_EINVAL, "resources.cpu_ranks"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"resources\":{\"cpu_ranks\":2,\"gpus\":1}}",
     TY_EINVAL, "resources.cpu_ranks"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"resources\":{\"nodes\":0}}", TY_EINVAL,
     "resources.nodes"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"resources\":{\"nodes\":1025}}",
     TY_EINVAL, "resources.nodes"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"resources\":{\"zero\":2}}", TY_EINVAL,
     "resources.zero"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"resources\":{\"bucket_kb\":-1}}",
     TY_EINVAL, "resources.bucket_kb"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"checkpoint\":{\"keep_last\":-1}}",
     TY_EINVAL, "checkpoint.keep_last"},
    {"{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"/t\",\"eval_fraction\":0.6},"
     "\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "dataset.eval_fraction"},
    {"{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"/t\",\"eval\":\"/e\",\"eval_fraction\":0.1},"
     "\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "dataset.eval_fraction"},
    /* enums */
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"method\":\"dpo\"}", TY_EINVAL,
     "method"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"precision\":\"fp8\"}", TY_EINVAL,
     "precision"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"resources\":{\"backend\":\"rocm\"}}",
     TY_EINVAL, "resources.backend"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"schedule\":\"step\"}}", TY_EINVAL,
     "hyperparameters.schedule"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10,\"recompute\":\"attention\"}}", TY_EINVAL,
     "hyperparameters.recompute"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"export\":{\"dtype\":\"int8\"}}",
     TY_EINVAL, "export.dtype"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"export\":{\"format\":\"gguf\"}}",
     TY_EINVAL, "export.format"},
    {"{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"/t\",\"format\":\"csv\"},"
     "\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "dataset.format"},
    {"{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"/t\",\"chat_template\":\"vicuna\"},"
     "\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "dataset.chat_template"},
    /* lora */
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"lora\":{\"r\":8}}", TY_EINVAL, "lora"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\",\"lora\":{\"r\":0}}",
     TY_EINVAL, "lora.r"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\",\"lora\":{\"alpha\":-1}}",
     TY_EINVAL, "lora.alpha"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\",\"lora\":{\"dropout\":1}}",
     TY_EINVAL, "lora.dropout"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\",\"lora\":{\"use_rslora\":1}}",
     TY_EINVAL, "lora.use_rslora"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\",\"lora\":{\"use_dora\":1}}",
     TY_EINVAL, "lora.use_dora"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"method\":\"qlora\",\"lora\":{\"use_dora\":true}}",
     TY_EINVAL, "lora.use_dora"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\",\"lora\":{\"bias\":\"some\"}}",
     TY_EINVAL, "lora.bias"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\",\"lora\":{\"targets\":[]}}",
     TY_EINVAL, "lora.targets"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\","
                  "\"lora\":{\"targets\":[\"q_proj\",\"q proj\"]}}",
     TY_EINVAL, "lora.targets[1]"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\","
                  "\"lora\":{\"targets\":[\"q_proj\",\"q_proj\"]}}",
     TY_EINVAL, "lora.targets[1]"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\","
     "\"lora\":{\"targets\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\","
     "\"n\",\"o\",\"p\",\"q\"]}}",
     TY_EINVAL, "lora.targets"},
    /* relative paths, "..", bad URIs */
    {"{\"model\":{\"path\":\"models/llama\"},\"dataset\":{\"train\":\"/t\"},\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "model.path"},
    {"{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"./t.jsonl\"},\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "dataset.train"},
    {"{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"/data/../etc/passwd\"},"
     "\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "dataset.train"},
    {"{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"/t\",\"eval\":\"/data/..\"},"
     "\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "dataset.eval"},
    {"{\"model\":{\"path\":\"s3://b/../x\"},\"dataset\":{\"train\":\"/t\"},\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "model.path"},
    {"{\"model\":{\"path\":\"s3://\"},\"dataset\":{\"train\":\"/t\"},\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "model.path"},
    /* Credentials never ride in a spec: user:secret@bucket, SAS query strings. */
    {"{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"/t\"},\"hyperparameters\":{\"max_steps\":1},"
     "\"checkpoint\":{\"store\":\"s3://AKIDEXAMPLE:secret@bucket/runs\"}}",
     TY_EINVAL, "checkpoint.store"},
    {"{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"/t\"},\"hyperparameters\":{\"max_steps\":1},"
     "\"checkpoint\":{\"store\":\"az://ckpts/runs?sv=2022-11-02&sig=abc\"}}",
     TY_EINVAL, "checkpoint.store"},
    {"{\"model\":{\"path\":\"gs://key@bucket/m\"},\"dataset\":{\"train\":\"/t\"},"
     "\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "model.path"},
    {"{\"model\":{\"path\":\"file://m\"},\"dataset\":{\"train\":\"/t\"},\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "model.path"},
    {"{\"model\":{\"path\":\"http://x/m\"},\"dataset\":{\"train\":\"/t\"},\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "model.path"},
    {"{\"model\":{\"path\":\"\"},\"dataset\":{\"train\":\"/t\"},\"hyperparameters\":{\"max_steps\":1}}",
     TY_EINVAL, "model.path"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\",\"lora\":{\"adapter\":\"a/b\"}}",
     TY_EINVAL, "lora.adapter"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"checkpoint\":{\"store\":\"/local/dir\"}}",
     TY_EINVAL, "checkpoint.store"},
    {MINIMAL_HEAD
     "\"hyperparameters\":{\"max_steps\":10},\"checkpoint\":{\"store\":\"ftp://h/x\"}}",
     TY_EINVAL, "checkpoint.store"},
    {MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"name\":\"a\\nb\"}", TY_EINVAL, "name"},
};

static void test_bad_inputs(void)
{
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        const struct bad *b = &BAD[i];
        jobspec s;
        memset(&s, 0x5a, sizeof s); /* must come back zeroed */
        ty_err e;
        int rc = jobspec_parse_text(b->text, strlen(b->text), &s, &e);
        CHECK(rc == b->code, "case %zu: code %d, want %d (%s) for %s", i, rc, b->code, e.msg,
              b->text);
        CHECK(e.code == rc, "case %zu: err->code %d != rc %d", i, e.code, rc);
        if (b->field)
            CHECK(strcmp(e.field, b->field) == 0, "case %zu: field '%s', want '%s' (%s)", i,
                  e.field, b->field, e.msg);
        CHECK(e.msg[0] != '\0', "case %zu: no message", i);
        CHECK(s.name == NULL && s.train == NULL && s.model_path == NULL && s.n_targets == 0,
              "case %zu: *out not zeroed", i);
    }
}

/* Malformed JSON and invalid UTF-8 name line and column. */
/* lora.use_dora: parsed, off by default, written back only when on. */
static void test_use_dora(void)
{
    static const char *text = MINIMAL_HEAD
        "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\",\"lora\":{\"use_dora\":true}}";
    jobspec s, s2;
    ty_err e;
    int rc = jobspec_parse_text(text, strlen(text), &s, &e);
    CHECK(rc == 0 && s.lora_use_dora, "use_dora: %s", rc ? e.msg : "not set");
    if (rc) return;
    json_t *j = jobspec_to_json(&s);
    CHECK(json_is_true(json_object_get(json_object_get(j, "lora"), "use_dora")),
          "use_dora written");
    char *t = json_dumps(j, 0);
    rc = jobspec_parse_text(t, strlen(t), &s2, &e);
    CHECK(rc == 0 && s2.lora_use_dora, "use_dora round trip");
    if (!rc) jobspec_free(&s2);
    free(t);
    json_decref(j);
    jobspec_free(&s);
    static const char *off =
        MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"method\":\"lora\"}";
    rc = jobspec_parse_text(off, strlen(off), &s, &e);
    CHECK(rc == 0 && !s.lora_use_dora, "use_dora default");
    if (!rc) {
        j = jobspec_to_json(&s);
        CHECK(!json_object_get(json_object_get(j, "lora"), "use_dora"),
              "use_dora omitted when off");
        json_decref(j);
        jobspec_free(&s);
    }
}

static void test_positions(void)
{
    jobspec s;
    ty_err e;
    const char *t = "{\n  \"name\": \"x\",\n  \"model\": }";
    jobspec_parse_text(t, strlen(t), &s, &e);
    CHECK(strstr(e.msg, "line 3") != NULL, "malformed JSON line: %s", e.msg);
    const char *u = "{\n \"name\": \"ab\xfe\"}";
    jobspec_parse_text(u, strlen(u), &s, &e);
    CHECK(strstr(e.msg, "line 2, column 13") != NULL, "invalid UTF-8 position: %s", e.msg);
    /* Embedded NUL inside the body is malformed, not silently truncated. */
    const char nul[] = "{\"name\":\"a\0b\"}";
    int rc = jobspec_parse_text(nul, sizeof nul - 1, &s, &e);
    CHECK(rc == TY_ECORRUPT, "embedded NUL: rc %d (%s)", rc, e.msg);
}

static void test_roots(void)
{
    char tmpl[] = "/tmp/ty-jobspec-XXXXXX";
    char *dir = mkdtemp(tmpl);
    CHECK(dir != NULL, "mkdtemp");
    if (!dir) return;
    char inside[512], outside_link[512], roots[1200], spec[2048];
    snprintf(inside, sizeof inside, "%s/data", dir);
    snprintf(outside_link, sizeof outside_link, "%s/data/escape", dir);
    CHECK(mkdir(inside, 0755) == 0, "mkdir");
    CHECK(symlink("/etc", outside_link) == 0, "symlink");
    snprintf(roots, sizeof roots, "/nonexistent-root:%s/data/:/models", dir);

    struct {
        const char *model, *train;
        int rc;
        const char *field;
    } cases[] = {
        {"/models/llama", "%s/data/t.jsonl", 0, ""},
        {"s3://bucket/m", "file://%s/data/t.jsonl", 0, ""},
        {"/models", "%s/data", 0, ""},
        {"/modelsX/llama", "%s/data/t.jsonl", TY_EINVAL, "model.path"},
        {"/models/llama", "/etc/passwd", TY_EINVAL, "dataset.train"},
        {"/models/llama", "file:///etc/passwd", TY_EINVAL, "dataset.train"},
        {"/models/llama", "%s/data/escape/passwd", TY_EINVAL, "dataset.train"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char train[600];
        snprintf(train, sizeof train, cases[i].train, dir);
        snprintf(
            spec, sizeof spec,
            "{\"model\":{\"path\":\"%s\"},\"dataset\":{\"train\":\"%s\"},\"hyperparameters\":{\"max_steps\":1}}",
            cases[i].model, train);
        jobspec s;
        ty_err e;
        int rc = jobspec_parse_text(spec, strlen(spec), &s, &e);
        CHECK(rc == 0, "roots case %zu: parse %s", i, e.msg);
        if (rc) continue;
        rc = jobspec_check_roots(&s, roots, &e);
        CHECK(rc == cases[i].rc, "roots case %zu: rc %d want %d (%s)", i, rc, cases[i].rc, e.msg);
        CHECK(strcmp(e.field, cases[i].field) == 0, "roots case %zu: field '%s' want '%s'", i,
              e.field, cases[i].field);
        CHECK(jobspec_check_roots(&s, NULL, &e) == 0 && jobspec_check_roots(&s, "", &e) == 0,
              "roots case %zu: no roots = no restriction", i);
        jobspec_free(&s);
    }
    unlink(outside_link);
    rmdir(inside);
    rmdir(dir);
}

/* Precision against the backend: the CPU runs all three; CUDA what the
 * installation has (nothing without GPUs); auto may fall back to the CPU.
 * precision auto (the engine picks) passes wherever the backend runs. */
static void test_precision_caps(void)
{
    static const char *const precs[] = {"fp32", "bf16", "fp16", "auto"};
    jobspec_caps none = jobspec_default_caps(0), gpu = jobspec_default_caps(2);
    for (int p = 0; p < 4; p++) {
        for (int b = 0; b < 3; b++) {
            static const char *const backends[] = {"cpu", "cuda", "auto"};
            char text[512];
            snprintf(text, sizeof text,
                     MINIMAL_HEAD "\"hyperparameters\":{\"max_steps\":10},\"precision\":\"%s\","
                                  "\"resources\":{\"backend\":\"%s\",\"gpus\":%d}}",
                     precs[p], backends[b], b == 0 ? 0 : 1);
            jobspec s;
            ty_err e;
            int rc = jobspec_parse_text(text, strlen(text), &s, &e);
            CHECK(rc == 0, "%s: %s", text, e.msg);
            if (rc) continue;
            CHECK(!strcmp(jobspec_precision_name(s.precision), precs[p]), "precision %s", precs[p]);
            ty_err e1 = {0}, e2 = {0};
            int r_none = jobspec_check_precision(&s, &none, &e1),
                r_gpu = jobspec_check_precision(&s, &gpu, &e2);
            CHECK(r_gpu == 0, "%s/%s with GPUs: %s", precs[p], backends[b], e2.msg);
            if (b == 1)
                CHECK(r_none == TY_EINVAL && !strcmp(e1.field, "precision") &&
                          strstr(e1.msg, "no CUDA GPUs") && strstr(e1.msg, precs[p]),
                      "cuda/%s without GPUs: rc %d %s", precs[p], r_none, e1.msg);
            else
                CHECK(r_none == 0, "%s/%s without GPUs: %s", precs[p], backends[b], e1.msg);
            jobspec_free(&s);
        }
    }
}

int main(void)
{
    test_design_example();
    test_precision_caps();
    test_defaults();
    test_model_init();
    test_bad_inputs();
    test_use_dora();
    test_positions();
    test_roots();
    return ty_summary("jobspec");
}
