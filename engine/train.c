/* train.c — the training loop of trainyard-engine (see train.h).
 *
 * One optimizer step = grad_accum micro-batches of batch_size rows of seq_len
 * tokens. Every micro-batch's dlogits are scaled by 1 / (non-ignored targets
 * in the whole step), so the accumulated gradient is that of the step's mean
 * token loss, the quantity reported as `loss` (PyTorch's loss.item() for the
 * same batch). Then: global grad norm, clipping, AdamW per tensor with the
 * scheduled lr. All state that influences later steps (weights, moments,
 * step, data cursor) is in the checkpoint, so a resumed run continues
 * bit-identically. */
#include "train.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "ckpt.h"
#include "data.h"
#include "dist.h"
#include "dist_bucket.h"
#include "zero.h"
#include "device.h"
#include "events.h"
#include "hfconfig.h"
#include "jobspec.h"
#include "kernels.h"
#include "lora.h"
#include "qlora.h"
#include "model.h"
#include "scaler.h"
#include "textdata.h"
#include "tokenizer.h"
#include "tyopen.h"
#include "tyutil.h"

volatile sig_atomic_t train_stop_requested = 0;

double train_lr_lambda(int schedule, long long k, long long warmup, long long total)
{
    if (k < warmup) return (double)k / (double)(warmup > 1 ? warmup : 1);
    if (schedule == SCHED_CONSTANT) return 1.0;
    double span = (double)(total - warmup > 1 ? total - warmup : 1);
    if (schedule == SCHED_LINEAR) {
        double r = (double)(total - k) / span;
        return r > 0 ? r : 0;
    }
    double progress = (double)(k - warmup) / span;
    double r = 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress)); /* num_cycles = 0.5 */
    return r > 0 ? r : 0;
}

/* Everything a run holds; freed in one place. */
typedef struct run {
    const train_args *a;
    jobspec spec;
    int have_spec;
    char spec_sha[65];
    kn_ctx *kn;
    model m;
    int have_model;
    lora lora; /* method lora: the adapters (attached as m's linear hook) */
    int have_lora;
    qlora_base *qb; /* method qlora: the NF4 base (the model's linear store; model_free frees it) */
    tok_tokenizer *tok; /* text formats */
    dataset train, eval;
    data_sampler sampler;
    int64_t step;   /* optimizer updates done */
    int64_t tokens; /* positions processed (incl. padding) */
    int32_t *in,
        *tg; /* host batch: grad_accum x batch_size x seq_len (kn_host_alloc: pinned on CUDA) */
    float *losses;     /* device: the step's per-token losses, read back once per step */
    int64_t last_ckpt; /* step of the newest checkpoint written by us */
    int64_t eval_step; /* step of the latest eval, -1 before any */
    double eval_loss;
    char fallback[600]; /* backend auto fell back to the CPU: why ("" if not) */
    /* Metric events (without "ev") since the last checkpoint, saved in its
     * trainer_state.json as log_history: a server killed before it
     * committed them gets them back when it adopts the checkpoint. */
    json_t *history;
    kn_dtype dt; /* storage precision */
    /* fp16 dynamic loss scaling (scaler.h, GradScaler's rule), all of it
     * in the checkpoint. bf16 / fp32: scale 1, nothing skipped. */
    ty_scaler sc;
    int stop;            /* the stop all ranks agreed on after the last step */
    int grads_clean;     /* the last update left the gradient buffer all 0 (kn_adamw_blocks) */
    kn_adamw_block *opt; /* the optimizer step's blocks: one per trained tensor */
    int n_opt, cap_opt;
    zero1 zero;       /* resources.zero 1: this rank's moments (zero.h) */
    grad_buckets gb;  /* world > 1, full fine-tuning, bucket_kb > 0 (dist_bucket.h) */
    model_config cfg; /* set-up: read by step_config, given to the model by step_model */
    int have_cfg;
    int vocab;               /* the model's vocabulary size */
    int64_t epoch0, cursor0; /* set-up: where the data resumes */
    double comm_s, step_s;   /* world > 1: seconds in collectives / in steps, logged at the end */
    uint64_t dev_used;       /* on a GPU: the device-wide bytes in use, highest after any step */
} run;

static int fail(const char *prefix, const ty_err *e)
{
    char msg[900];
    if (prefix)
        snprintf(msg, sizeof msg, "%s: %s", prefix, e->msg);
    else
        snprintf(msg, sizeof msg, "%s", e->msg);
    ev_log("error: %s", msg);
    ev_error(msg);
    /* The exit status comes from the code: a spec this engine cannot run
     * is 2 (TY_ESPEC), anything else a failure. */
    return e->code == TY_ESPEC ? TRAIN_BAD_SPEC : TRAIN_FAILED;
}

/* Puts "prefix: " before err's message, with the given code. */
static int prefixed(ty_err *err, int code, const char *prefix)
{
    char m[sizeof err->msg];
    snprintf(m, sizeof m, "%s", err->msg);
    return ty_err_set(err, code, "%s: %s", prefix, m);
}

static uint64_t peak_mem_bytes(run *r)
{
    return device_mem_bytes(r->kn);
}

/* ---- spec and setup ----------------------------------------------------- */

static int load_spec(run *r, ty_err *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = ty_read_file(r->a->spec_path, &text, &len, err);
    if (rc) return rc;
    ty_sha256_hex(text, len, r->spec_sha);
    rc = jobspec_parse_text(text, len, &r->spec, err);
    free(text);
    if (rc == 0) r->have_spec = 1;
    /* The server checked the paths at submit; what they name may have
     * changed since (a symlink swapped in while the job was queued), so
     * they are checked again here, and each file once more as it is
     * opened (ty_open_input). */
    if (rc == 0 && ty_open_roots()) rc = jobspec_check_roots(&r->spec, ty_open_roots(), err);
    return rc;
}

/* The checks that make a valid spec unusable by this engine: exit 2. */
static int check_supported(run *r, const model_config *c, char *msg, size_t n)
{
    const jobspec *s = &r->spec;
    json_t *qc = json_object_get(c->raw, "quantization_config");
    if (qc) {
        const char *qm = json_string_value(json_object_get(qc, "quant_method"));
        return snprintf(
                   msg, n,
                   "model.path: config.json has quantization_config (quant_method \"%s\"): the model is already "
                   "quantised; %s needs the original fp32/bf16/fp16 weights%s",
                   qm ? qm : "?", s->method == METHOD_QLORA ? "method qlora" : "training",
                   s->method == METHOD_QLORA ? " (it quantises them itself)" : ""),
               1;
    }
    if (s->format != DS_TOKENS && !s->model_path)
        return snprintf(msg, n,
                        "dataset.format %s needs model.path (a directory with tokenizer.json)",
                        jobspec_format_name(s->format)),
               1;
    textdata_template tp;
    if (s->format == DS_CHAT && textdata_template_parse(s->chat_template, &tp))
        return snprintf(msg, n,
                        "dataset.chat_template \"%s\" is not one of chatml, llama3, llama2, model",
                        s->chat_template),
               1;
    if (s->method != METHOD_FULL && s->lora_r < 1)
        return snprintf(msg, n, "lora.r must be at least 1 (got %d)", s->lora_r), 1;
    if (s->seq_len > c->max_pos)
        return snprintf(
                   msg, n,
                   "hyperparameters.seq_len %d exceeds the model's maximum of %d positions (%s)",
                   s->seq_len, c->max_pos,
                   c->arch == ARCH_GPT2 ? "n_positions" : "max_position_embeddings"),
               1;
    if ((int64_t)s->batch_size * s->seq_len > INT32_MAX / 4)
        return snprintf(
                   msg, n,
                   "hyperparameters.batch_size x seq_len = %lld positions per micro-batch is too many",
                   (long long)s->batch_size * s->seq_len),
               1;
    if (c->sliding_window && c->sliding_window < s->seq_len)
        return snprintf(
                   msg, n,
                   "hyperparameters.seq_len %d exceeds the model's sliding_window %d (not supported)",
                   s->seq_len, c->sliding_window),
               1;
    return 0;
}

/* engine/device.c: auto falls back to the CPU said out loud (log line and
 * the started event's `fallback`), never silently. */
static int open_device(run *r, ty_err *err)
{
    int rc = device_open(&r->kn, &r->spec, r->a->local_rank, r->a->threads, r->fallback,
                         sizeof r->fallback, err);
    if (r->fallback[0]) ev_log("backend auto: %s", r->fallback);
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (!rc && kn_device_of(r->kn) == KN_CUDA)
        ev_log("device: cuda %d (local rank) of CUDA_VISIBLE_DEVICES=%s: %s", r->a->local_rank,
               vis ? vis : "unset", kn_describe(r->kn));
    return rc;
}

/* ---- trainer state ------------------------------------------------------ */

static int write_trainer_state(run *r, const char *path, ty_err *err)
{
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)r->spec.seed);
    json_t *o =
        json_pack("{s:s, s:I, s:I, s:I, s:I, s:{s:s, s:s, s:I}, s:I, s:f, s:s, s:s, s:I}", "format",
                  "trainyard-trainer-state/1", "step", (json_int_t)r->step, "epoch",
                  (json_int_t)r->sampler.epoch, "cursor", (json_int_t)r->sampler.pos, "n_examples",
                  (json_int_t)r->train.n, "rng", "algorithm", "splitmix64-fisher-yates", "seed",
                  seed, "epoch", (json_int_t)r->sampler.epoch, "tokens", (json_int_t)r->tokens,
                  "loss_scale", (double)r->sc.scale, "spec_sha256", r->spec_sha, "model_type",
                  r->m.cfg.model_type, "params", (json_int_t)r->m.n_params);
    json_object_set_new(o, "growth_tracker", json_integer((json_int_t)r->sc.growth_tracker));
    json_object_set_new(o, "skipped_steps", json_integer((json_int_t)r->sc.skipped));
    json_object_set_new(o, "precision", json_string(kn_dtype_name(r->dt)));
    /* The eval loss of this very step, for checkpoint.keep_best. */
    if (r->eval_step == r->step && isfinite(r->eval_loss))
        json_object_set_new(o, "eval_loss", json_real(r->eval_loss));
    if (r->history) json_object_set(o, "log_history", r->history);
    char *text = json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text) return ty_err_set(err, TY_ENOMEM, "trainer state");
    int rc = ty_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

static int read_trainer_state(run *r, const char *path, int64_t *epoch, int64_t *cursor,
                              ty_err *err)
{
    json_t *o;
    int rc = ty_read_json(path, TY_ECORRUPT, &o, err);
    if (rc) return rc;
    json_int_t step = -1, ep = -1, cur = -1, n = -1, tokens = 0;
    const char *seed = NULL;
    if (json_unpack(o, "{s:I, s:I, s:I, s:I, s:{s:s}, s:I}", "step", &step, "epoch", &ep, "cursor",
                    &cur, "n_examples", &n, "rng", "seed", &seed, "tokens", &tokens) != 0) {
        json_decref(o);
        return ty_err_set(err, TY_ECORRUPT, "%s: not a trainer state", path);
    }
    char want[32];
    snprintf(want, sizeof want, "%llu", (unsigned long long)r->spec.seed);
    const char *sha = json_string_value(json_object_get(o, "spec_sha256"));
    if (sha && strcmp(sha, r->spec_sha))
        ev_log(
            "note: resuming a checkpoint written under a different spec (sha256 %.12s, now %.12s)",
            sha, r->spec_sha);
    if (n != r->train.n)
        rc = ty_err_set(err, TY_EINVAL,
                        "checkpoint was taken on %lld training examples, the dataset now has %d",
                        (long long)n, r->train.n);
    else if (strcmp(seed, want))
        rc = ty_err_set(err, TY_EINVAL, "checkpoint was taken with seed %s, the spec now says %s",
                        seed, want);
    else if (step < 0 || step > r->spec.max_steps)
        rc = ty_err_set(err, TY_EINVAL,
                        "checkpoint step %lld is beyond hyperparameters.max_steps %lld",
                        (long long)step, (long long)r->spec.max_steps);
    /* Loss-scaler state (absent in checkpoints written before the engine
     * had mixed precision: the precision's initial state). */
    json_t *ls = json_object_get(o, "loss_scale"), *gt = json_object_get(o, "growth_tracker"),
           *sk = json_object_get(o, "skipped_steps");
    if (!rc && r->dt == KN_F16 && json_is_number(ls) && json_number_value(ls) > 0 && gt && sk) {
        r->sc.scale = (float)json_number_value(ls);
        r->sc.growth_tracker = json_integer_value(gt);
        r->sc.skipped = json_integer_value(sk);
    } else if (!rc && sk && json_integer_value(sk) > 0) {
        r->sc.skipped =
            json_integer_value(sk); /* AdamW's step count stays right across a precision change */
    }
    json_decref(o);
    if (rc) return rc;
    r->step = step;
    r->tokens = tokens;
    *epoch = ep;
    *cursor = cur;
    return 0;
}

/* ---- checkpoint, export, eval ------------------------------------------ */

static int write_checkpoint(run *r, ty_err *err);

/* Every rank calls it at the same steps: with ZeRO-1 the moments (and
 * 16-bit runs' masters) are gathered to rank 0 first; rank 0 writes (the
 * weights are the same on every rank). */
static int save_checkpoint(run *r, ty_err *err)
{
    if (r->zero.on && zero_gather(&r->zero, &r->m, r->a->coll, 1, err)) return -1;
    int rc = 0;
    if (r->a->rank == 0) {
        rc = write_checkpoint(r, err);
    } else {
        r->last_ckpt = r->step;
        if (r->history) json_array_clear(r->history);
    }
    if (r->zero.on) zero_unsave(&r->zero, &r->m);
    return rc;
}

static int write_checkpoint(run *r, ty_err *err)
{
    char dir[4096], rel[64], path[4200];
    ckpt_dir_name(dir, sizeof dir, r->a->workdir, r->step);
    ckpt_rel_name(rel, sizeof rel, r->step);
    int rc = ckpt_begin(dir, err);
    /* LoRA checkpoints hold the adapters and their moments only; the frozen
     * base is model.path (or model.init) again on resume. */
    int lo = r->have_lora;
    snprintf(path, sizeof path, "%s/%s", dir,
             lo ? "adapter_model.safetensors" : "model.safetensors");
    if (!rc) rc = lo ? lora_save(&r->lora, path, err) : model_save_file(&r->m, path, err);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (!rc)
        rc = lo ? lora_save_optimizer(&r->lora, path, err) : model_save_optimizer(&r->m, path, err);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    if (!rc) rc = write_trainer_state(r, path, err);
    /* A LoRA checkpoint says what its adapters are (rsLoRA, patterns,
     * layers), so generating from it needs nothing from the spec. */
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (!rc && lo) rc = lora_write_config(&r->lora, &r->m, r->spec.model_path, path, err);
    const char *files[] = {lo ? "adapter_model.safetensors" : "model.safetensors",
                           "optimizer.safetensors", "trainer_state.json", "adapter_config.json"};
    uint64_t bytes = 0;
    if (!rc) rc = ckpt_commit(dir, r->step, files, lo ? 4 : 3, &bytes, err);
    if (rc) {
        /* A partial checkpoint (full disk, I/O error) is not left behind
         * to fill the disk or be mistaken for one. */
        ty_rm_rf(dir, NULL);
        return rc;
    }
    r->last_ckpt = r->step;
    if (r->history) json_array_clear(r->history);
    ev_emit(json_pack("{s:s, s:I, s:s, s:I}", "ev", "checkpoint", "step", (json_int_t)r->step,
                      "dir", rel, "bytes", (json_int_t)bytes));
    ev_log("checkpoint %s (%llu bytes)", rel, (unsigned long long)bytes);
    /* Pruning has one owner: under trainyard serve the server prunes (its
     * database knows which checkpoint it points at); alone, we do. */
    ty_err perr = {0};
    if (!r->a->supervised && ckpt_prune(r->a->workdir, r->spec.keep_last, r->spec.keep_best, &perr))
        ev_log("warning: pruning checkpoints: %s", perr.msg);
    return 0;
}

static int copy_file(const char *from, const char *to, ty_err *err)
{
    char *data = NULL;
    size_t len = 0;
    int rc = ty_read_file(from, &data, &len, err);
    if (!rc) rc = ty_write_file_atomic(to, data, len, err);
    free(data);
    return rc;
}

/* QLoRA's merged export starts from the original, unquantised base (the
 * model the adapter is for, as PEFT merges into a base loaded in 16 or 32
 * bits), not from the dequantised 4-bit weights the run trained against. */
static int load_unquantised(run *r, model *out, ty_err *err)
{
    const jobspec *s = &r->spec;
    model_config cfg;
    int rc = s->model_path ? hfconfig_load_dir(s->model_path, &cfg, err)
                           : hfconfig_parse(s->model_init, "model.init", &cfg, err);
    if (rc) return rc;
    if ((rc = model_create_ex(out, &cfg, r->kn, 1, err))) return rc;
    return s->model_path ? model_load_dir(out, s->model_path, err)
                         : model_init_random(out, s->seed, err);
}

static int export_model(run *r, ty_err *err)
{
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/export", r->a->workdir);
    int rc = ty_rm_rf(dir, err);
    if (!rc) rc = ty_mkdir_p(dir, err);
    if (r->have_lora && !r->spec.lora_merge) {
        /* A PEFT adapter directory (PeftModel.from_pretrained loads it). */
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        if (!rc) rc = lora_save(&r->lora, path, err);
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        if (!rc) rc = lora_write_config(&r->lora, &r->m, r->spec.model_path, path, err);
    } else {
        /* Full weights; with lora.merge, W + (alpha / r) B A. The merge is
         * the run's last use of the base weights. */
        model full;
        model *mm = &r->m;
        memset(&full, 0, sizeof full);
        if (!rc && r->qb) {
            rc = load_unquantised(r, &full, err);
            mm = &full;
        }
        if (!rc && r->have_lora) rc = lora_merge(&r->lora, mm, err);
        /* export.dtype, else the dtype the model came in (config.json's
         * torch_dtype; fp32 for model.init). */
        kn_dtype edt = KN_F32;
        jobspec_export_dtype want = r->spec.export_dtype;
        if (want == EXPORT_DTYPE_AUTO) {
            const char *own = json_string_value(json_object_get(mm->cfg.raw, "torch_dtype"));
            edt = own && !strcmp(own, "bfloat16")  ? KN_BF16
                  : own && !strcmp(own, "float16") ? KN_F16
                                                   : KN_F32;
        } else {
            edt = want == EXPORT_DTYPE_BF16 ? KN_BF16 : want == EXPORT_DTYPE_FP16 ? KN_F16 : KN_F32;
        }
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (!rc) rc = model_save_file_as(mm, path, edt, err);
        json_t *cfg = rc ? NULL
                         : hfconfig_export_as(&mm->cfg, edt == KN_BF16  ? "bfloat16"
                                                        : edt == KN_F16 ? "float16"
                                                                        : "float32");
        char *text = json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        json_decref(cfg);
        snprintf(path, sizeof path, "%s/config.json", dir);
        if (!rc)
            rc = text ? ty_write_file_atomic(path, text, strlen(text), err)
                      : ty_err_set(err, TY_ENOMEM, "config");
        free(text);
        if (mm == &full) model_free(&full);
    }
    /* The tokenizer travels with the weights when the model dir had one. */
    static const char *const tok_files[] = {
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
        "merges.txt",     "tokenizer.model",       "generation_config.json"};
    for (size_t i = 0; !rc && r->spec.model_path && i < sizeof tok_files / sizeof *tok_files; i++) {
        char from[4200];
        struct stat st;
        snprintf(from, sizeof from, "%s/%s", r->spec.model_path, tok_files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, tok_files[i]);
        if (stat(from, &st) == 0) rc = copy_file(from, path, err);
    }
    return rc;
}

/* Mean token loss over the whole eval set, in file order. */
static int run_eval(run *r, double *loss, ty_err *err)
{
    int B = r->spec.batch_size, T = r->spec.seq_len;
    double sum = 0;
    long long count = 0;
    if (r->have_lora) r->lora.training = 0; /* model.eval(): no dropout */
    for (int start = 0; start < r->eval.n; start += B) {
        int rows = r->eval.n - start < B ? r->eval.n - start : B;
        for (int b = 0; b < rows; b++) {
            int c =
                data_fill_row(&r->eval, start + b, T, r->in + (size_t)b * T, r->tg + (size_t)b * T);
            if (c < 0) return ty_err_set(err, TY_EIO, "dataset.eval: %s", data_error(&r->eval));
            count += c;
        }
        sum += model_forward(&r->m, r->in, r->tg, rows, T);
    }
    if (kn_check(r->kn, err)) return -1;
    *loss = count ? sum / (double)count : NAN;
    return 0;
}

static int emit_eval(run *r, ty_err *err)
{
    double loss = NAN;
    if (run_eval(r, &loss, err)) return -1;
    r->eval_step = r->step;
    r->eval_loss = loss;
    ev_emit(json_pack("{s:s, s:I, s:f}", "ev", "eval", "step", (json_int_t)r->step, "loss", loss));
    ev_log("eval step %lld loss %.6f", (long long)r->step, loss);
    return 0;
}

/* ---- one optimizer step ------------------------------------------------- */

typedef struct step_result {
    double loss, grad_norm, lr;
    int skipped;       /* fp16: inf/NaN gradients, update skipped */
    size_t grad_bytes; /* world > 1: other ranks' gradients received (coll_take_bytes) */
} step_result;

/* One more optimizer block (r->opt grows as needed, once). */
static int opt_add(run *r, kn_adamw_block b, ty_err *err)
{
    if (r->n_opt == r->cap_opt) {
        int cap = r->cap_opt ? 2 * r->cap_opt : 64;
        kn_adamw_block *o = realloc(r->opt, (size_t)cap * sizeof *o);
        if (!o) return ty_err_set(err, TY_ENOMEM, "out of memory for the optimizer's blocks");
        r->opt = o;
        r->cap_opt = cap;
    }
    r->opt[r->n_opt++] = b;
    return 0;
}

/* The adapters: A and B (2-D: decayed), DoRA's magnitudes (1-D), and the
 * model's own trained tensors (lora.bias); frozen ones have no gradient. */
static int lora_blocks(run *r, float wd, ty_err *err)
{
    lora *l = &r->lora;
    for (int i = 0; i < 2 * l->n; i++) {
        const lora_adapter *la = &l->ad[i / 2];
        size_t off = i % 2 ? la->b_off : la->a_off;
        size_t n = i % 2 ? (size_t)la->out * la->r : (size_t)la->r * la->in;
        kn_adamw_block b = {l->params + off, NULL, l->grads + off, l->m + off, l->v + off, n, wd,
                            KN_F32};
        if (opt_add(r, b, err)) return -1;
    }
    for (int i = 0; i < l->n; i++) {
        const lora_adapter *la = &l->ad[i];
        kn_adamw_block b = {l->params + la->m_off,
                            NULL,
                            l->grads + la->m_off,
                            l->m + la->m_off,
                            l->v + la->m_off,
                            (size_t)la->out,
                            0.0f,
                            KN_F32};
        if (la->dora && opt_add(r, b, err)) return -1;
    }
    for (int i = 0; i < l->n_x; i++) {
        const lora_extra *x = &l->x[i];
        kn_adamw_block b = {x->param,      NULL,     l->grads + x->off,    l->m + x->off,
                            l->v + x->off, x->numel, x->decay ? wd : 0.0f, KN_F32};
        if (!x->frozen && opt_add(r, b, err)) return -1;
    }
    return 0;
}

/* Every tensor of the model, its master as model_master gives it (fp32,
 * or the split bf16 master: model.h). */
static int model_blocks(run *r, float wd, ty_err *err)
{
    model *m = &r->m;
    for (int i = 0; i < m->nt; i++) {
        const model_tensor *mt = &m->t[i];
        kn_adamw_block b = {NULL,           NULL,      m->grads + mt->off,    m->m + mt->off,
                            m->v + mt->off, mt->numel, mt->decay ? wd : 0.0f, KN_F32};
        b.p = model_master(m, i, &b.pdt, &b.plo);
        if (opt_add(r, b, err)) return -1;
    }
    return 0;
}

/* The step's blocks for kn_adamw_blocks (the masters' pointers can move
 * between steps: a checkpoint's gather, so they are listed every step). */
static int optimizer_blocks(run *r, ty_err *err)
{
    float wd = (float)r->spec.weight_decay;
    r->n_opt = 0;
    return r->have_lora ? lora_blocks(r, wd, err) : model_blocks(r, wd, err);
}

/* The gradient sum after the backward, in one piece: with ZeRO-1 only
 * this rank's range is summed here (the reduce-scatter), else all of it. */
static int grad_sum(run *r, float *grads, size_t nbuf, ty_err *err)
{
    if (r->zero.on)
        return coll_reduce_f32(r->a->coll, grads, 0, nbuf, r->zero.off, r->zero.len, 0, err);
    return coll_sum_f32(r->a->coll, grads, nbuf, err);
}

/* World > 1: the flat gradient buffer summed (the buckets started during
 * the backward waited for, or one sum now; with ZeRO-1 each rank gets only
 * its range's sums), then (loss sum, stop): a stop asked of any rank (a
 * signal, the server gone) is a stop of all after this same step. */
static int step_sums(run *r, float *grads, size_t nbuf, double *loss_sum, step_result *out,
                     ty_err *err)
{
    double t0 = dist_now();
    if (r->gb.lo) {
        if (bucket_finish(&r->gb, err)) return -1;
        r->comm_s += r->gb.comm_s; /* the hooks' calls and the wait */
        r->gb.comm_s = 0;
    } else {
        if (grad_sum(r, grads, nbuf, err)) return -1;
        r->comm_s += dist_now() - t0;
    }
    out->grad_bytes = coll_take_bytes(r->a->coll);
    if (dist_supervisor_gone()) train_stop_requested = 1;
    double ls[2] = {*loss_sum, train_stop_requested ? 1.0 : 0.0};
    if (coll_sum_f64(r->a->coll, ls, 2, err)) return -1;
    *loss_sum = ls[0];
    r->stop = ls[1] > 0;
    return 0;
}

/* The sum of squares of the unscaled summed gradient. World > 1: one
 * partial per rank's range of dist_cuts, added in rank order. With ZeRO-1
 * a rank holds only its range's sums: it computes that partial and the
 * world's are gathered (summed with zeros elsewhere: exact); without, the
 * same partials over the same ranges, computed locally. Either way the
 * same bits at the same world. */
static int grad_sumsq(run *r, const float *grads, size_t nbuf, float unscale, double *out,
                      ty_err *err)
{
    int w = r->a->world, me = r->a->rank;
    if (w == 1) {
        *out = kn_sumsq_scaled(r->kn, grads, nbuf, unscale);
        return 0;
    }
    size_t *off = malloc(2 * sizeof *off * (size_t)w);
    double *part = calloc((size_t)w, sizeof *part);
    int rc = !off || !part ? ty_err_set(err, TY_ENOMEM, "out of memory") : 0;
    if (!rc) {
        dist_cuts(nbuf, w, off, off + w);
        for (int k = 0; k < w; k++)
            if (!r->zero.on || k == me)
                part[k] = kn_sumsq_scaled(r->kn, grads + off[k], off[w + k], unscale);
        if (r->zero.on) rc = coll_sum_f64(r->a->coll, part, w, err);
        *out = 0;
        for (int k = 0; k < w; k++)
            *out += part[k];
    }
    free(off);
    free(part);
    return rc;
}

/* Whether any summed gradient is inf / NaN, the same answer on every
 * rank: with ZeRO-1 each rank checks its range and the counts are summed. */
static int grad_nonfinite(run *r, const float *grads, size_t nbuf, int *bad, ty_err *err)
{
    if (!r->zero.on) {
        *bad = kn_nonfinite(r->kn, grads, nbuf);
        return 0;
    }
    size_t lo = r->zero.off[r->a->rank];
    double n = kn_nonfinite(r->kn, grads + lo, r->zero.len[r->a->rank]);
    if (coll_sum_f64(r->a->coll, &n, 1, err)) return -1;
    *bad = n > 0;
    return 0;
}

/* World > 1: this rank fills only its share of the step's rows
 * (dist_shard), the target count and the loss are summed over the ranks,
 * and so are the gradients, each already scaled by 1 / (global count): the
 * result is the global mean-token gradient on every rank. The sampler walks
 * all rows on every rank, so the trainer state is the same everywhere. */
static int train_step(run *r, step_result *out, ty_err *err)
{
    const jobspec *s = &r->spec;
    int B = s->batch_size, T = s->seq_len, A = s->grad_accum;
    int lo, mine;
    dist_shard(A * B, r->a->world, r->a->rank, &lo, &mine);
    long long count = 0;
    int64_t first_row = r->sampler.pos, first_epoch = r->sampler.epoch;
    for (int i = 0; i < A * B; i++) {
        int ex = data_sampler_next(&r->sampler);
        if (i < lo || i >= lo + mine) continue;
        size_t o = (size_t)(i - lo) * T;
        int c = data_fill_row(&r->train, ex, T, r->in + o, r->tg + o);
        if (c < 0) return ty_err_set(err, TY_EIO, "dataset.train: %s", data_error(&r->train));
        count += c;
    }
    double global[2] = {(double)count, 0};
    if (coll_sum_f64(r->a->coll, global, 1, err)) return -1;
    count = (long long)global[0];
    if (count == 0)
        return ty_err_set(
            err, TY_EINVAL,
            "step %lld: its %d examples (from position %lld of epoch %lld) have no target tokens",
            (long long)r->step + 1, A * B, (long long)first_row, (long long)first_epoch);
    model *m = &r->m;
    /* The trainable buffer: the whole model, or only the adapters. */
    float *grads = r->have_lora ? r->lora.grads : m->grads;
    size_t nbuf = r->have_lora ? r->lora.n_buf : m->t[m->nt - 1].off + m->t[m->nt - 1].numel;
    if (!r->grads_clean) kn_zero(r->kn, grads, nbuf);
    r->grads_clean = 0;
    /* fp16: the loss (so every gradient) is multiplied by the loss scale. */
    float scale = (float)((double)r->sc.scale / (double)count);
    /* Micro-batches of at most batch_size rows; with world 1 exactly the
     * grad_accum micro-batches. The dropout key is the global micro-batch
     * a row block starts in, so the masks match world 1 whenever the
     * shares are whole micro-batches. */
    for (int o = 0; o < mine; o += B) {
        int rows = mine - o < B ? mine - o : B;
        /* The last micro-batch finalises the gradients layer by layer:
         * their buckets' sums start during its backward. */
        m->grads_done = r->gb.lo && o + B >= mine ? bucket_ready : NULL;
        m->grads_done_ctx = &r->gb;
        if (r->have_lora) { /* dropout masks: a function of (seed, step, micro-batch) */
            r->lora.training = 1;
            r->lora.rng_step = (uint64_t)r->step * (uint64_t)A + (uint64_t)((lo + o) / B);
        }
        model_forward_backward_into(m, r->in + (size_t)o * T, r->tg + (size_t)o * T, rows, T, scale,
                                    r->losses + (size_t)o * T);
    }
    m->grads_done = NULL;
    /* The step's losses come back once, not per micro-batch: nothing waits
     * for the device between micro-batches. */
    double sum = kn_sum(r->kn, r->losses, (size_t)mine * T);
    /* A kernel failure (kn_fail) in any of those ops surfaces here, once per
     * step, before anything is updated. */
    if (kn_check(r->kn, err)) return -1;
    if (r->a->coll && step_sums(r, grads, nbuf, &sum, out, err)) return -1;
    out->loss = sum / (double)count;
    out->lr = s->lr * train_lr_lambda(s->schedule, r->step, s->warmup_steps, s->max_steps);
    if (!isfinite(out->loss)) return 0;
    /* GradScaler: the norm of the unscaled gradient (times the fp32
     * reciprocal, in register) is inf/NaN when any gradient is: then,
     * with loss scaling, skip the update and halve the scale; the growth
     * after enough clean steps is counted once the update is done. A norm
     * that overflows only in the unscaling is an error, as it was when the
     * unscaled gradient was stored. */
    float unscale = r->sc.enabled ? 1.0f / r->sc.scale : 1.0f;
    double sumsq;
    int bad = 0;
    if (grad_sumsq(r, grads, nbuf, unscale, &sumsq, err)) return -1;
    out->grad_norm = sqrt(sumsq);
    if (!isfinite(out->grad_norm) && r->sc.enabled && grad_nonfinite(r, grads, nbuf, &bad, err))
        return -1;
    if (bad) {
        ev_log("step %lld: inf/NaN gradients at loss scale %g; update skipped, scale halved",
               (long long)r->step + 1, (double)r->sc.scale);
        ty_scaler_update(&r->sc, 1);
        r->step++;
        r->tokens += (int64_t)A * B * T;
        out->skipped = 1;
        out->grad_norm = NAN;
        return 0;
    }
    if (!isfinite(out->grad_norm))
        return ty_err_set(err, TY_EINVAL,
                          "gradient norm is %s at step %lld (loss %g); stopping before the update",
                          isnan(out->grad_norm) ? "NaN" : "infinite", (long long)r->step + 1,
                          out->loss);
    /* torch.nn.utils.clip_grad_norm_: coef = max / (norm + 1e-6), applied
     * if < 1. AdamW's own step count: skipped steps are not optimizer steps. */
    kn_adamw_hp hp = {(float)out->lr,
                      (float)s->adam_beta1,
                      (float)s->adam_beta2,
                      (float)s->adam_eps,
                      r->step + 1 - r->sc.skipped,
                      {unscale, 1.0f},
                      0};
    if (s->max_grad_norm > 0) {
        double coef = s->max_grad_norm / (out->grad_norm + 1e-6);
        if (coef < 1.0) hp.gscale[1] = (float)coef;
    }
    if (r->zero.on) {
        if (zero_adamw(&r->zero, m, r->a->coll, &hp, (float)s->weight_decay, err)) return -1;
    } else {
        if (optimizer_blocks(r, err)) return -1;
        /* The blocks are every tensor that has a gradient, and nothing else
         * in the buffer is ever written, so clearing them behind the
         * update zeroes the buffer for the next step. */
        hp.zero_grad = 1;
        kn_adamw_blocks(r->kn, r->opt, r->n_opt, hp);
        r->grads_clean = 1;
    }
    r->step++;
    r->tokens += (int64_t)A * B * T;
    ty_scaler_update(&r->sc, 0);
    /* The 16-bit weights the next forward reads: round(masters). */
    if (!r->have_lora || r->lora.n_x) model_sync_params(m);
    return 0;
}

/* ---- the run ------------------------------------------------------------ */

/* The model directory's tokenizer, for the text formats. */
static int load_tokenizer(run *r, int vocab, ty_err *err)
{
    const jobspec *s = &r->spec;
    if (s->format == DS_TOKENS) return 0;
    int rc = tok_load(&r->tok, s->model_path, err);
    if (rc) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return ty_err_set(err, rc, "model.path %s: %s", s->model_path, msg);
    }
    if (tok_vocab_size(r->tok) > vocab)
        return ty_err_set(err, TY_EINVAL,
                          "%s/tokenizer.json has %d tokens but the model's vocabulary is %d",
                          s->model_path, tok_vocab_size(r->tok), vocab);
    return 0;
}

/* One dataset file in the spec's format; text formats stream (textdata.h). */
static int load_data(run *r, const char *path, int vocab, dataset *d, ty_err *err)
{
    const jobspec *s = &r->spec;
    if (s->format == DS_TOKENS) return data_load_tokens(path, vocab, d, err);
    if (!r->tok) return ty_err_set(err, TY_EINVAL, "no tokenizer loaded");
    textdata_opts o = {0};
    o.format = s->format == DS_TEXT                ? TD_TEXT
               : s->format == DS_PROMPT_COMPLETION ? TD_PROMPT_COMPLETION
                                                   : TD_CHAT;
    o.text_field = s->text_field;
    textdata_template_parse(s->chat_template, &o.chat_template); /* checked in check_supported */
    char *jinja = NULL; /* chat_template "model": tokenizer_config.json's own (textdata.h) */
    if (o.format == TD_CHAT && o.chat_template == TD_MODEL) {
        int rc = textdata_model_template(s->model_path, &jinja, err);
        if (rc) return rc;
        o.model_template = jinja;
    }
    o.packing = s->packing;
    o.seq_len = s->seq_len;
    o.skip_invalid = s->skip_invalid;
    o.vocab = vocab;
    o.tok = r->tok;
    int rc = textdata_open(path, &o, d, err);
    free(jinja); /* parsed by textdata_open; not needed after */
    if (!rc && d->skipped) {
        const char *base = strrchr(path, '/');
        char msg[600];
        snprintf(msg, sizeof msg, "skipped %lld invalid line%s in %s (dataset.skip_invalid)",
                 (long long)d->skipped, d->skipped == 1 ? "" : "s", base ? base + 1 : path);
        ev_emit(json_pack("{s:s, s:s, s:s, s:I}", "ev", "log", "level", "warn", "line", msg,
                          "skipped", (json_int_t)d->skipped));
        ev_log("warning: %s", msg);
    }
    return rc;
}

/* The adapters lora.adapter describes: its adapter_config.json read over
 * the spec's (each PEFT field honoured or refused, peftcfg.h). The spec's
 * r must agree; its alpha, use_rslora and dropout are what this run trains
 * with (a different alpha or scaling rule is noted); its targets, when
 * given, replace target_modules. The rest (rank_pattern, alpha_pattern,
 * layers_to_transform, exclude_modules, a regex target_modules) only the
 * adapter can say, and is kept and written back at export. */
static int same_saved(const lora_cfg *a, const lora_cfg *b)
{
    if (a->n_save != b->n_save) return 0;
    for (int i = 0; i < a->n_save; i++)
        if (strcmp(a->save[i], b->save[i])) return 0;
    return 1;
}

static int adapter_cfg(const jobspec *s, lora_cfg *c, ty_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", s->lora_adapter);
    lora_cfg spec = *c;
    ty_err ae = {0};
    lora_cfg_default(c); /* what PEFT assumes for a field the file leaves out */
    int rc = lora_cfg_load(c, path, &ae);
    if (rc == TY_ENOENT) {
        *c = spec; /* a LoRA checkpoint: the spec says everything */
        return 0;
    }
    if (rc) {
        ty_err_field(err, rc == TY_EINVAL || rc == TY_ESPEC ? TY_ESPEC : rc, "lora.adapter",
                     "lora.adapter: %s", ae.msg);
        if (ae.field[0]) snprintf(err->field, sizeof err->field, "lora.adapter:%.100s", ae.field);
        return err->code;
    }
    if (c->r != spec.r)
        return ty_err_field(err, TY_ESPEC, "lora.r", "lora.adapter: %s has r = %d but lora.r is %d",
                            path, c->r, spec.r);
    static const char *const bias_names[] = {"none", "lora_only", "all"};
    if (c->bias != spec.bias)
        return ty_err_field(err, TY_ESPEC, "lora.bias",
                            "lora.adapter: %s has bias \"%s\" but lora.bias is \"%s\" (the "
                            "adapter file holds the biases its setting trains)",
                            path, bias_names[c->bias], bias_names[spec.bias]);
    if (c->use_dora != spec.use_dora)
        return ty_err_field(err, TY_ESPEC, "lora.use_dora",
                            "lora.adapter: %s has use_dora %s but lora.use_dora is %s (the "
                            "adapter file holds magnitudes only with DoRA)",
                            path, c->use_dora ? "true" : "false", spec.use_dora ? "true" : "false");
    if (!same_saved(c, &spec))
        return ty_err_field(err, TY_ESPEC, "lora.modules_to_save",
                            "lora.adapter: %s has other modules_to_save than "
                            "lora.modules_to_save (the adapter file holds the modules its "
                            "setting trains)",
                            path);
    if (c->alpha != spec.alpha)
        ev_log("note: %s has lora_alpha %g; training with lora.alpha %g", path, c->alpha,
               spec.alpha);
    if (c->use_rslora != spec.use_rslora)
        ev_log("note: %s has use_rslora %s; training with lora.use_rslora %s", path,
               c->use_rslora ? "true" : "false", spec.use_rslora ? "true" : "false");
    c->alpha = spec.alpha;
    c->use_rslora = spec.use_rslora;
    c->dropout = spec.dropout;
    if (spec.n_targets) {
        memcpy(c->targets, spec.targets, sizeof c->targets);
        c->n_targets = spec.n_targets;
        c->target_regex[0] = 0;
        c->all_linear = 0;
    }
    return 0;
}

/* The adapters of method lora: fresh (PEFT init) or lora.adapter. */
static int setup_lora(run *r, ty_err *err)
{
    const jobspec *s = &r->spec;
    lora_cfg c;
    lora_cfg_from_spec(&c, s->lora_r, s->lora_alpha, s->lora_dropout, s->lora_use_rslora,
                       s->targets, s->n_targets);
    c.bias = s->lora_bias;
    c.use_dora = s->lora_use_dora;
    for (int i = 0; i < s->n_save && i < LORA_MAX_TARGETS; i++)
        snprintf(c.save[c.n_save++], LORA_NAME_MAX, "%s", s->save[i]);
    int rc = s->lora_adapter ? adapter_cfg(s, &c, err) : 0;
    if (rc) return rc;
    rc = lora_create(&r->lora, &r->m, &c, err);
    r->have_lora = 1; /* lora_free copes with a partial one */
    if (rc == TY_EINVAL)
        err->code = rc = TY_ESPEC; /* r, dropout or targets the model cannot take */
    if (rc) return rc;
    r->lora.seed = s->seed;
    lora_attach(&r->lora, &r->m);
    if (!s->lora_adapter) {
        lora_init(&r->lora, s->seed);
        return 0;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", s->lora_adapter);
    rc = lora_load(&r->lora, path, err);
    if (rc) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return ty_err_set(err, rc, "lora.adapter: %s", msg);
    }
    return 0;
}

/* ---- set-up, one step at a time ----------------------------------------
 *
 * Each step fills its part of the run and returns 0, or a TY_E* code with a
 * message for the `error` event. TY_ESPEC says the spec asks for what this
 * engine cannot do (exit 2); any other code is a failure (exit 1). */

/* The spec, parsed and checked against the roots; its batch split over ranks. */
static int step_spec(run *r, ty_err *err)
{
    if (load_spec(r, err)) {
        char m[sizeof err->field + sizeof err->msg + 2];
        if (err->field[0])
            snprintf(m, sizeof m, "%s: %s", err->field, err->msg);
        else
            snprintf(m, sizeof m, "%s", err->msg);
        return ty_err_set(err, TY_ESPEC, "spec: %s", m);
    }
    const jobspec *s = &r->spec;
    if (s->zero && s->method != METHOD_FULL)
        return ty_err_set(err, TY_ESPEC,
                          "resources.zero: ZeRO-1 shards the optimizer state of method full; "
                          "LoRA's is the adapters' and small");
    if (r->a->world > 1 && ((int64_t)s->batch_size * s->grad_accum) % r->a->world)
        return ty_err_set(
            err, TY_ESPEC,
            "world size %d does not divide the global batch of hyperparameters.batch_size x "
            "grad_accum = %lld rows",
            r->a->world, (long long)s->batch_size * s->grad_accum);
    return 0;
}

/* The model's config.json, or model.init (whose faults are the spec's). */
static int step_config(run *r, ty_err *err)
{
    const jobspec *s = &r->spec;
    int rc;
    if (s->model_path && strstr(s->model_path, "://"))
        return ty_err_set(
            err, TY_ESPEC,
            "model.path: remote URIs must be fetched by the server before the engine starts");
    if (s->model_path)
        rc = hfconfig_load_dir(s->model_path, &r->cfg, err);
    else if ((rc = hfconfig_parse(s->model_init, "model.init", &r->cfg, err)))
        err->code = rc = TY_ESPEC;
    if (!rc) r->have_cfg = 1;
    return rc;
}

/* What a valid spec may still ask that this engine cannot do; the precision. */
static int step_supported(run *r, ty_err *err)
{
    const jobspec *s = &r->spec;
    char msg[512];
    if (check_supported(r, &r->cfg, msg, sizeof msg)) return ty_err_set(err, TY_ESPEC, "%s", msg);
    /* The same check as the server's at submit: this engine's CPU runs
     * every precision; a CUDA job needs a CUDA build. */
    jobspec_caps caps = jobspec_default_caps(device_cuda_built());
    ty_err perr = {0};
    if (jobspec_check_precision(s, &caps, &perr)) return ty_err_set(err, TY_ESPEC, "%s", perr.msg);
    /* precision auto: bf16 until the device is known (step_device) */
    r->dt = s->precision == PREC_FP16 ? KN_F16 : s->precision == PREC_FP32 ? KN_F32 : KN_BF16;
    ty_scaler_init(&r->sc, r->dt == KN_F16);
    if (r->sc.enabled && (r->sc.interval = ty_scaler_env_interval()) != TY_SCALER_GROWTH_INTERVAL)
        ev_log(
            "test knob TY_TEST_SCALE_GROWTH_INTERVAL: the loss scale doubles after %lld clean steps",
            (long long)r->sc.interval);
    return 0;
}

/* The kernel context; ranks > 1 only where there is a collective for them. */
static int step_device(run *r, ty_err *err)
{
    if (open_device(r, err))
        return prefixed(err, err->code == TY_ESPEC ? TY_EINVAL : err->code, "backend");
    /* GPU ranks: the gradient sum (and ZeRO-1's all-gather) over NCCL. */
    if (r->a->coll && kn_device_of(r->kn) != KN_CPU && coll_attach_nccl(r->a->coll, err))
        return err->code = TY_ESPEC;
    /* precision auto: fp16 with loss scaling where the card has no bf16 */
    if (r->spec.precision == PREC_AUTO && (r->dt = device_auto_precision(r->kn)) == KN_F16)
        ty_scaler_init(&r->sc, 1);
    if (device_check_precision(r->kn, r->dt, err)) return err->code = TY_ESPEC;
    return 0;
}

/* The tensor table and its buffers; the model takes the config. */
static int step_model(run *r, ty_err *err)
{
    r->vocab = r->cfg.vocab;
    r->have_cfg = 0; /* model_create_ex takes it, even on failure */
    const jobspec *s = &r->spec;
    int frozen = s->method == METHOD_QLORA ? MODEL_FROZEN_NF4 : s->method == METHOD_LORA;
    int rc = model_create_ex(&r->m, &r->cfg, r->kn, frozen, err);
    r->have_model = 1;                       /* model_free copes with a partial model */
    if (!rc && frozen == MODEL_FROZEN_NF4) { /* before loading: quantised as they arrive */
        jobspec_export_dtype cd = s->qlora_compute_dtype;
        kn_dtype compute = cd == EXPORT_DTYPE_AUTO   ? r->dt
                           : cd == EXPORT_DTYPE_BF16 ? KN_BF16
                           : cd == EXPORT_DTYPE_FP16 ? KN_F16
                                                     : KN_F32;
        rc = qlora_attach(&r->m, s->qlora_double_quant, compute, &r->qb, err);
        if (!rc) rc = model_nf4_home(&r->m, r->dt, err); /* loaded straight into 16 bits */
    }
    return rc;
}

/* The tokenizer (text formats), the train and eval sets. */
static int step_data(run *r, ty_err *err)
{
    const jobspec *s = &r->spec;
    if (load_tokenizer(r, r->vocab, err)) return err->code;
    if (load_data(r, s->train, r->vocab, &r->train, err))
        return prefixed(err, err->code, "dataset.train");
    if (s->eval && load_data(r, s->eval, r->vocab, &r->eval, err))
        return prefixed(err, err->code, "dataset.eval");
    if (!s->eval && s->eval_fraction > 0)
        return data_split(&r->train, s->eval_fraction, s->seed, &r->eval, err);
    return 0;
}

/* --resume: the checkpoint's weights (or adapters), moments, step and data cursor. */
static int resume_weights(run *r, ty_err *err)
{
    const train_args *a = r->a;
    const jobspec *s = &r->spec;
    char path[4200];
    int64_t mstep = 0;
    snprintf(path, sizeof path, "%s/trainer_state.json", a->resume);
    int rc = ckpt_verify(a->resume, &mstep, err);
    if (!rc) rc = read_trainer_state(r, path, &r->epoch0, &r->cursor0, err);
    if (rc) return rc;
    if (mstep != r->step)
        return ty_err_set(
            err, TY_ECORRUPT,
            "checkpoint corrupt: MANIFEST.json says step %lld, trainer_state.json %lld",
            (long long)mstep, (long long)r->step);
    if (s->method != METHOD_FULL) {
        /* The frozen base comes from the spec; the adapters and their
         * moments from the checkpoint. */
        rc = s->model_path ? model_load_dir(&r->m, s->model_path, err)
                           : model_init_random(&r->m, s->seed, err);
        if (!rc) rc = setup_lora(r, err);
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", a->resume);
        if (!rc) rc = lora_load(&r->lora, path, err);
        snprintf(path, sizeof path, "%s/optimizer.safetensors", a->resume);
        if (!rc) rc = lora_load_optimizer(&r->lora, path, err);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", a->resume);
        if (!(rc = model_load_file(&r->m, path, err))) {
            snprintf(path, sizeof path, "%s/optimizer.safetensors", a->resume);
            rc = model_load_optimizer(&r->m, path, err);
        }
    }
    /* Whatever is wrong here is the checkpoint's, not the spec's. */
    if (rc) return prefixed(err, rc == TY_ESPEC ? TY_EINVAL : rc, "checkpoint");
    r->last_ckpt = r->step;
    ev_log("resumed from %s at step %lld", a->resume, (long long)r->step);
    return 0;
}

/* The weights: resumed, loaded from model.path or random; the adapters of
 * method lora; then the 16-bit copies the forward reads. */
static int step_weights(run *r, ty_err *err)
{
    const jobspec *s = &r->spec;
    int rc;
    if (r->a->resume)
        rc = resume_weights(r, err);
    else if (s->model_path)
        rc = model_load_dir(&r->m, s->model_path, err) ? prefixed(err, err->code, "model") : 0;
    else
        rc = model_init_random(&r->m, s->seed, err);
    if (!rc && !r->a->resume && s->method != METHOD_FULL) rc = setup_lora(r, err);
    if (!rc) rc = model_set_precision(&r->m, r->dt, err); /* 16-bit weights from what was loaded */
    return rc;
}

/* The data order, activations and batch buffers; an eval set that scores something. */
static int step_buffers(run *r, ty_err *err)
{
    const jobspec *s = &r->spec;
    int rc;
    if ((rc = data_sampler_init(&r->sampler, r->train.n, s->seed, r->epoch0, r->cursor0, err)) ||
        (r->have_lora && (rc = lora_alloc_acts(&r->lora, s->batch_size, s->seq_len, err))) ||
        (rc = model_alloc_acts(&r->m, s->batch_size, s->seq_len, (model_recompute)s->recompute,
                               err)))
        return rc;
    size_t n = (size_t)s->grad_accum * s->batch_size * s->seq_len;
    r->in = kn_host_alloc(r->kn, n * sizeof *r->in);
    r->tg = kn_host_alloc(r->kn, n * sizeof *r->tg);
    r->losses = kn_alloc(r->kn, n * sizeof *r->losses);
    if (!r->in || !r->tg || !r->losses)
        return ty_err_set(err, TY_ENOMEM, "out of memory for %zu batch tokens", n);
    /* An eval set must have something to score, or its loss would be 0/0. */
    long long targets = 0;
    for (int i = 0; i < r->eval.n; i++) {
        int c = data_fill_row(&r->eval, i, s->seq_len, r->in, r->tg);
        if (c < 0) return ty_err_set(err, TY_EIO, "dataset.eval: %s", data_error(&r->eval));
        targets += c;
    }
    if (r->eval.n && targets == 0)
        return ty_err_set(err, TY_EINVAL,
                          "dataset.eval: the eval set has no target tokens within seq_len %d",
                          s->seq_len);
    /* ZeRO-1: from here on this rank keeps only its range of the moments
     * and masters (loaded in full from a resume checkpoint above). A world
     * of 1 has nothing to shard them over (and may be a GPU, where the
     * shards' host copies would not do): it runs unsharded. */
    if (s->zero && r->a->world > 1 && zero_shard(&r->zero, &r->m, r->a->world, r->a->rank, err))
        return -1;
    /* World > 1, full fine-tuning: the all-reduce in buckets during the
     * backward (the adapters' small buffer goes in one piece after it). */
    if (r->a->coll && !r->have_lora && s->bucket_kb > 0) {
        model *m = &r->m;
        size_t n = m->t[m->nt - 1].off + m->t[m->nt - 1].numel;
        return bucket_init(&r->gb, r->a->coll, m->grads, n, r->a->world, s->bucket_kb, !r->zero.on,
                           err);
    }
    return 0;
}

/* The steps in order; the first failure ends the run with one `error` event. */
static int setup(run *r, int *code)
{
    static const struct {
        int (*fn)(run *r, ty_err *err);
    } steps[] = {{step_spec},  {step_config}, {step_supported}, {step_device},
                 {step_model}, {step_data},   {step_weights},   {step_buffers}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        ty_err err = {0};
        if (steps[i].fn(r, &err)) {
            *code = fail(NULL, &err);
            return -1;
        }
    }
    return 0;
}

static void teardown(run *r)
{
    if (r->have_cfg) hfconfig_free(&r->cfg);
    kn_host_free(r->kn, r->in); /* dump-rows has no context: plain free */
    kn_host_free(r->kn, r->tg);
    data_sampler_free(&r->sampler);
    data_free(&r->eval); /* may borrow the train set's text */
    data_free(&r->train);
    if (r->have_lora) lora_free(&r->lora);
    if (r->have_model) zero_free(&r->zero, &r->m);
    bucket_free(&r->gb);
    free(r->opt);
    if (r->have_model) model_free(&r->m);
    tok_free(r->tok);
    if (r->kn) kn_close(r->kn);
    if (r->have_spec) jobspec_free(&r->spec);
    json_decref(r->history);
}

/* The started event's `memory`: device bytes by kind, as allocated. */
static json_t *memory_json(const run *r)
{
    const model *m = &r->m;
    model_mem mm = model_memory(m);
    size_t weights = mm.params + mm.p16 + mm.wscratch, adapters = 0, grads = mm.grads,
           optimizer = mm.moments;
    size_t acts = mm.acts, zm, zw;
    zero_bytes(&r->zero, &zm, &zw); /* ZeRO-1: this rank's shards */
    weights += zw;
    optimizer += zm;
    if (r->have_lora) {
        adapters = r->lora.n_buf * sizeof(float);
        grads = adapters;
        optimizer = 2 * adapters;
        size_t N = r->lora.N, la = 0;
        for (int i = 0; i < r->lora.n; i++) {
            la += ((N * (size_t)r->lora.ad[i].r + 15) & ~(size_t)15) * sizeof(float);
            if (r->lora.ad[i].dora) /* g, n [out]; z [N, out] */
                la += (2 * (((size_t)r->lora.ad[i].out + 15) & ~(size_t)15) +
                       ((N * (size_t)r->lora.ad[i].out + 15) & ~(size_t)15)) *
                      sizeof(float);
            if (r->lora.dropout > 0 && !r->lora.ad[i].emb)
                la += ((N * (size_t)r->lora.ad[i].in + 15) & ~(size_t)15) * sizeof(float) +
                      N * (size_t)r->lora.ad[i].in;
        }
        acts += la;
    }
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "weights", (json_int_t)weights,
                     "quantized_weights", (json_int_t)(r->qb ? r->qb->bytes : 0), "adapters",
                     (json_int_t)adapters, "gradients", (json_int_t)grads, "optimizer",
                     (json_int_t)optimizer, "activations", (json_int_t)acts, "total",
                     (json_int_t)kn_bytes_in_use(r->kn));
}

static int train_loop(run *r)
{
    const jobspec *s = &r->spec;
    ty_err err = {0};
    size_t trainable = r->have_lora ? r->lora.n_params : r->m.n_params;
    /* rows: training rows per epoch (examples, or packed rows);
     * tokens_per_epoch: the positions they fill (rows x seq_len, padding
     * included, the unit of metric.tokens). */
    json_t *started =
        json_pack("{s:s, s:I, s:I, s:i, s:s, s:s, s:s, s:I, s:I, s:I, s:s}", "ev", "started",
                  "params", (json_int_t)r->m.n_params, "trainable", (json_int_t)trainable, "world",
                  r->a->world, "backend", kn_device_name(r->kn), "method",
                  jobspec_method_name(s->method), "format", jobspec_format_name(s->format), "rows",
                  (json_int_t)r->train.n, "eval_rows", (json_int_t)r->eval.n, "tokens_per_epoch",
                  (json_int_t)r->train.n * s->seq_len, "device", kn_describe(r->kn));
    if (r->fallback[0]) json_object_set_new(started, "fallback", json_string(r->fallback));
    json_object_set_new(started, "precision",
                        json_string(kn_dtype_name(r->dt))); /* auto's choice */
    device_describe(r->kn, started);
    json_object_set_new(started, "memory", memory_json(r));
    ev_emit(started);
    ev_log("%s model, %zu parameters (%zu trainable), %d training rows, backend %s",
           r->m.cfg.model_type, r->m.n_params, trainable, r->train.n, kn_device_name(r->kn));
    ev_log("activations: %zu bytes (recompute %s, %s storage)", model_act_bytes(&r->m),
           jobspec_recompute_name(s->recompute), kn_dtype_name(r->dt));
    model_mem mm = model_memory(&r->m);
    ev_log(
        "memory: parameters %zu MiB, 16-bit weights %zu MiB, gradients %zu MiB, AdamW moments %zu MiB, "
        "activations %zu MiB, weight scratch %zu KiB; kernel blocks in use %zu MiB",
        mm.params >> 20, mm.p16 >> 20, mm.grads >> 20, mm.moments >> 20, mm.acts >> 20,
        mm.wscratch >> 10, kn_bytes_in_use(r->kn) >> 20);
    int64_t win_t0 = ty_mono_ms(), win_tokens = r->tokens, run_t0 = win_t0, run_step0 = r->step;
    /* Rank 0 alone evaluates, checkpoints and exports (docs/engine.md,
     * Ranks); the others wait at the next collective. */
    int lead = r->a->rank == 0;
    while (r->step < s->max_steps) {
        if (r->a->coll ? r->stop : train_stop_requested) break;
        step_result sr = {0};
        double t0 = dist_now();
        if (train_step(r, &sr, &err)) return fail(NULL, &err);
        r->step_s += dist_now() - t0;
        /* After a step every buffer it used is still held (nothing is
         * freed in the loop), so this is the device's peak so far. */
        uint64_t used = device_used_bytes(r->kn);
        if (used > r->dev_used) r->dev_used = used;
        if (!isfinite(sr.loss)) {
            char msg[256];
            snprintf(msg, sizeof msg,
                     "loss is %s at step %lld; stopping (last good checkpoint kept)",
                     isnan(sr.loss) ? "NaN" : "infinite", (long long)r->step + 1);
            ev_log("error: %s", msg);
            ev_error(msg);
            return TRAIN_FAILED;
        }
        if (r->step % s->log_every_steps == 0 || r->step == s->max_steps) {
            int64_t now = ty_mono_ms();
            double secs = (double)(now - win_t0) / 1000.0;
            double tps = secs > 0 ? (double)(r->tokens - win_tokens) / secs : 0.0;
            /* ETA from this process's mean step time so far. */
            double per_step = (double)(now - run_t0) / 1000.0 / (double)(r->step - run_step0);
            double eta = per_step * (double)(s->max_steps - r->step);
            /* grad_norm is null for a step skipped by the loss scaler. */
            json_t *m = json_pack(
                "{s:s, s:I, s:f, s:f, s:o, s:I, s:f, s:I, s:f, s:f, s:I}", "ev", "metric", "step",
                (json_int_t)r->step, "loss", sr.loss, "lr", sr.lr, "grad_norm",
                sr.skipped ? json_null() : json_real(sr.grad_norm), "tokens", (json_int_t)r->tokens,
                "tokens_per_s", tps, "mem_bytes", (json_int_t)peak_mem_bytes(r), "eta_s", eta,
                "loss_scale", (double)r->sc.scale, "skipped_steps", (json_int_t)r->sc.skipped);
            if (m && r->a->coll) /* rank 0's: the gradient sum's traffic */
                json_object_set_new(m, "grad_sum_bytes", json_integer((json_int_t)sr.grad_bytes));
            if (m && kn_device_of(r->kn) == KN_CUDA)
                json_object_set_new(m, "device_used_bytes", json_integer((json_int_t)r->dev_used));
            if (r->history && m) {
                json_t *h = json_deep_copy(m);
                json_object_del(h, "ev");
                json_array_append_new(r->history, h);
            }
            ev_emit(m);
            ev_log("step %lld loss %.6f lr %.3g grad_norm %.4f %.1f tok/s%s", (long long)r->step,
                   sr.loss, sr.lr, sr.grad_norm, tps, sr.skipped ? " (skipped)" : "");
            win_t0 = now;
            win_tokens = r->tokens;
        }
        if (r->eval.n && s->eval_every_steps > 0 && r->step % s->eval_every_steps == 0 &&
            r->step < s->max_steps)
            if (lead && emit_eval(r, &err)) return fail(NULL, &err);
        if (s->ckpt_every_steps > 0 && r->step % s->ckpt_every_steps == 0 &&
            save_checkpoint(r, &err))
            return fail("checkpoint", &err);
    }
    if (r->a->coll && r->step_s > 0) /* bench/engine-dp reads this line */
        ev_log("data parallel: gradient all-reduce %.3f s of %.3f s in steps (%.1f%%), world %d, "
               "%s; %lld of %lld buckets started during the backward",
               r->comm_s, r->step_s, 100.0 * r->comm_s / r->step_s, r->a->world,
               r->gb.lo ? "exposed (buckets overlapped with the backward)"
                        : "blocking after the backward",
               r->gb.early, r->gb.total);
    if (r->step < s->max_steps) { /* stopped by SIGTERM */
        if (r->last_ckpt != r->step && save_checkpoint(r, &err)) return fail("checkpoint", &err);
        if (coll_barrier(r->a->coll, &err)) return fail(NULL, &err);
        ev_done("stopped");
        ev_log("stopped at step %lld", (long long)r->step);
        return TRAIN_OK;
    }
    if (lead && r->eval.n && emit_eval(r, &err)) return fail(NULL, &err);
    if (r->last_ckpt != r->step && save_checkpoint(r, &err)) return fail("checkpoint", &err);
    /* ZeRO-1: the export reads the masters, whole on rank 0 for it. */
    if (r->zero.on && zero_gather(&r->zero, &r->m, r->a->coll, 0, &err))
        return fail("export", &err);
    if (lead && export_model(r, &err)) return fail("export", &err);
    if (r->zero.on) zero_unsave(&r->zero, &r->m);
    /* No rank leaves before rank 0's checkpoint and export are on disk. */
    if (coll_barrier(r->a->coll, &err)) return fail(NULL, &err);
    ev_done("succeeded");
    return TRAIN_OK;
}

int train_run(const train_args *a)
{
    run r;
    memset(&r, 0, sizeof r);
    r.a = a;
    r.last_ckpt = -1;
    r.history = json_array();
    r.eval_step = -1;
    ev_init(a->rank);
    int code = TRAIN_OK;
    ty_err err = {0};
    if (ty_mkdir_p(a->workdir, &err)) {
        code = fail("workdir", &err);
    } else if (setup(&r, &code) == 0) {
        code = train_loop(&r);
    }
    teardown(&r);
    return code;
}

/* ---- dump-rows ------------------------------------------------------------ */

int train_dump_rows(const char *spec_path, int eval)
{
    run r;
    memset(&r, 0, sizeof r);
    train_args a = {0};
    a.spec_path = spec_path;
    r.a = &a;
    ev_init(
        1); /* as a non-zero rank: stdout carries rows, never events (logs still go to stderr) */
    ty_err err = {0};
    model_config cfg;
    int code = TRAIN_FAILED, have_cfg = 0;
    if (load_spec(&r, &err)) {
        fprintf(stderr, "trainyard-engine: spec: %s%s%s\n", err.field, err.field[0] ? ": " : "",
                err.msg);
        code = TRAIN_BAD_SPEC;
        goto out;
    }
    const jobspec *s = &r.spec;
    int rc = s->model_path ? hfconfig_load_dir(s->model_path, &cfg, &err)
                           : hfconfig_parse(s->model_init, "model.init", &cfg, &err);
    if (rc) goto fail;
    have_cfg = 1;
    char msg[512];
    if (check_supported(&r, &cfg, msg, sizeof msg)) {
        fprintf(stderr, "trainyard-engine: %s\n", msg);
        code = TRAIN_BAD_SPEC;
        goto out;
    }
    if ((rc = load_tokenizer(&r, cfg.vocab, &err)) ||
        (rc = load_data(&r, s->train, cfg.vocab, &r.train, &err)))
        goto fail;
    if (s->eval && (rc = load_data(&r, s->eval, cfg.vocab, &r.eval, &err))) goto fail;
    if (!s->eval && s->eval_fraction > 0 &&
        (rc = data_split(&r.train, s->eval_fraction, s->seed, &r.eval, &err)))
        goto fail;
    const dataset *d = eval ? &r.eval : &r.train;
    int T = s->seq_len;
    r.in = malloc((size_t)T * sizeof *r.in);
    r.tg = malloc((size_t)T * sizeof *r.tg);
    if (!r.in || !r.tg) {
        ty_err_set(&err, TY_ENOMEM, "out of memory");
        goto fail;
    }
    /* Rows in dataset order (not shuffled); targets[t] is the label that
     * position t predicts (-100: no loss). */
    for (int i = 0; i < d->n; i++) {
        if (data_fill_row(d, i, T, r.in, r.tg) < 0) {
            ty_err_set(&err, TY_EIO, "%s", data_error(d));
            goto fail;
        }
        json_t *ids = json_array(), *tg = json_array();
        for (int t = 0; t < T; t++) {
            json_array_append_new(ids, json_integer(r.in[t]));
            json_array_append_new(tg, json_integer(r.tg[t]));
        }
        json_t *o = json_pack("{s:i, s:o, s:o}", "row", i, "input_ids", ids, "targets", tg);
        char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(o);
        if (line) printf("%s\n", line);
        free(line);
    }
    code = TRAIN_OK;
    goto out;
fail:
    fprintf(stderr, "trainyard-engine: %s\n", err.msg);
out:
    if (have_cfg) hfconfig_free(&cfg);
    teardown(&r);
    return code;
}
