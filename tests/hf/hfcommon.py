"""hfcommon.py — shared helpers of the tests/hf checks: tiny random models
made by transformers itself, job specs, running the engine and comparing
tensors."""
import json
import os
import subprocess
import sys

import torch
import transformers

ENGINE_TIMEOUT_S = 300


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def tiny_config(arch, vocab=97):
    """A two-layer random model of each supported architecture, eager
    attention, no dropout (the engine trains with eval numerics)."""
    common = dict(vocab_size=vocab, bos_token_id=1, eos_token_id=2)
    if arch == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0, **common)
    kw = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64, attention_dropout=0.0, **common)
    if arch == "llama":
        # A theta other than the default: transformers 5 writes it inside
        # rope_parameters, which the engine must read.
        return transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False,
                                        rope_theta=500000.0, **kw)
    if arch == "llama3":
        # Llama 3.1 / 3.2: rope_type llama3 and a tied head (3.2). With
        # head_dim 8, theta 10000 and original_max_position_embeddings 64
        # the four wavelengths (6, 63, 628, 6283) fall in each of the
        # scaling's three bands: kept, blended, divided by factor.
        return transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=10000.0,
                                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 64}, **kw)
    if arch == "mistral":
        return transformers.MistralConfig(num_key_value_heads=1, tie_word_embeddings=False,
                                          sliding_window=None, **kw)
    if arch == "qwen2":
        return transformers.Qwen2Config(num_key_value_heads=2, tie_word_embeddings=True, **kw)
    if arch == "qwen3":
        # head_dim 16 with hidden 32 and 4 heads: q/o are 64 wide, not the
        # hidden size (Qwen3 sets head_dim on its own).
        return transformers.Qwen3Config(num_key_value_heads=2, head_dim=16, tie_word_embeddings=False, **kw)
    if arch == "phi3":
        # Fused qkv_proj (grouped kv heads) and gate_up_proj. No pad token:
        # nn.Embedding's padding_idx would keep that row's gradient at zero.
        return transformers.Phi3Config(num_key_value_heads=2, pad_token_id=None, **kw)
    if arch in ("gemma2", "gemma3"):
        # head_dim 8 beside query_pre_attn_scalar 16 (the scale is not
        # 1/sqrt(head_dim)); a sliding window of 8 under sequences of 16 and
        # 24, so the sliding layers really cut; soft-caps small enough to
        # bite at these weights. No pad token (its embedding row would get
        # no gradient).
        gkw = dict(kw, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=16, sliding_window=8,
                   pad_token_id=None)
        if arch == "gemma2":
            # layers: sliding, full (the alternating default)
            return transformers.Gemma2Config(attn_logit_softcapping=0.5, final_logit_softcapping=1.0, **gkw)
        # Gemma 3: sliding, full, sliding by layer_types; local and global
        # theta differ and the global layers' RoPE is linearly scaled.
        return transformers.Gemma3TextConfig(
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            **dict(gkw, num_hidden_layers=3),
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0}})
    raise ValueError(arch)


def lora_targets(arch):
    """Every linear layer, by the module names PEFT uses for the family."""
    if arch == "gpt2":
        return ["c_attn", "c_proj", "c_fc"]
    if arch == "phi3":
        return ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    return ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# The newer families: their norm weights are drawn too
# (1 + noise) so a norm weight read wrongly changes the logits.
NEW_FAMILIES = ("qwen3", "llama3", "phi3", "gemma2", "gemma3")


def make_model(arch, path, seed=7, vocab=97, **config):
    """tiny_config(arch) with `config` set over it, random, saved to path."""
    torch.manual_seed(seed)
    cfg = tiny_config(arch, vocab)
    for k, v in config.items():
        setattr(cfg, k, v)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                          dtype=torch.float32)
    # Larger-than-default weights so the logits are not all near zero.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.08)
            elif "bias" in n:
                p.normal_(0, 0.02)
            elif arch in NEW_FAMILIES:
                p.normal_(1.0, 0.1)
    model.save_pretrained(path)
    return model


def make_text_model(path, seed):
    """A tiny random GPT-2 with a byte-level BPE tokenizer.json that the
    `tokenizers` library trains (always on the same corpus, so the same
    tokenizer): for the tests that need a text prompt. `seed` draws the
    weights. Returns the tokenizer."""
    import corpus
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus.corpus(seed=4, n_random=100, n_sentences=400),
                            trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    make_model("gpt2", path, seed=seed, vocab=tok.get_vocab_size())
    tok.save(os.path.join(path, "tokenizer.json"))
    write_json(os.path.join(path, "tokenizer_config.json"),
               {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"})
    return tok


def load_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager",
                                                             dtype=torch.float32).eval()


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


def job_spec(model_dir, train_path, steps, batch, seq_len, **kw):
    hp = {"max_steps": steps, "batch_size": batch, "seq_len": seq_len, "grad_accum": 1,
          "lr": kw.pop("lr", 3e-3), "schedule": "constant", "warmup_steps": 0,
          "weight_decay": kw.pop("weight_decay", 0.1), "max_grad_norm": kw.pop("max_grad_norm", 1.0),
          "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-8, "seed": 1234, "log_every_steps": 1}
    spec = {"name": "hf-ref", "model": {"path": model_dir},
            "dataset": {"train": train_path, "format": "tokens"}, "method": "full",
            "hyperparameters": hp, "precision": "fp32", "resources": {"backend": "cpu"},
            "checkpoint": {"every_steps": 0}}
    spec.update(kw)
    return spec


def run_engine(engine, spec, workdir):
    """Trains; returns the metric events. Any error fails the test."""
    os.makedirs(workdir, exist_ok=True)
    sp = os.path.join(workdir, "spec.json")
    write_json(sp, spec)
    cmd = ["/bin/bash", "-c", 'exec "$0" "$@" 3>&1 1>&2', engine, "--spec", sp, "--workdir", workdir]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S)
    events = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    done = [e for e in events if e["ev"] == "done"]
    if r.returncode != 0 or not done or done[-1]["status"] != "succeeded":
        fail(f"engine exit {r.returncode}: {[e for e in events if e['ev'] == 'error']}\n{r.stderr[-2000:]}")
    return [e for e in events if e["ev"] == "metric"]


def engine_json(engine, sub, args):
    r = subprocess.run([engine, sub] + args, capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S)
    if r.returncode != 0:
        fail(f"trainyard-engine {sub} {' '.join(args)}: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    return json.loads(r.stdout.splitlines()[-1])


def engine_error(engine, sub, args, timeout=120):
    """Runs trainyard-engine SUB ARGS expecting it to fail: (exit code, the
    last `error` event or None, stdout) for the caller's own checks. A
    refusal is quick: a shorter timeout than a run's."""
    r = subprocess.run([engine, sub] + args, capture_output=True, text=True, timeout=timeout)
    evs = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    errs = [e for e in evs if e.get("ev") == "error"]
    return r.returncode, errs[-1] if errs else None, r.stdout


def engine_logits(engine, model_args, ids, kv=False):
    j = engine_json(engine, "logits", model_args + ["--prompt-ids", " ".join(map(str, ids))] + (["--kv"] if kv else []))
    return torch.tensor(j["logits"], dtype=torch.float64)


def rel_err(a, b):
    """max |a - b| / max |b|: the error relative to the tensor's scale."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def check_close(what, got, want, tol):
    e = rel_err(got, want)
    print(f"  {what}: rel {e:.2e} (tolerance {tol:.0e})", flush=True)
    if not e <= tol:
        fail(f"{what}: relative error {e:.3e} > {tol:.0e}")
