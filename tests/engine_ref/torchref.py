# torchref.py — an independent PyTorch reference of a trainyard training run:
# GPT-2 and Llama-family forward passes written from their definitions, the
# "tokens" data pipeline, and the optimizer loop of the usual PyTorch script.
#
# The engine's numbers are checked against this file, so it follows the
# published semantics rather than the engine's code: HF's rotate-half RoPE,
# repeat_kv for grouped-query heads, RMSNorm, GELU's tanh form, the HF label
# shift; loss of step k = mean cross-entropy over every non-ignored target of
# step k's micro-batches, before the update; torch.nn.utils.clip_grad_norm_;
# torch.optim.AdamW with no decay on 1-D tensors (biases, norm weights); HF's
# warmup + constant / linear / cosine schedules (step k uses lr_lambda(k-1)).
# It computes in float64 by default so it is the ground truth for an fp32 run.
import json
import math

import torch

import hfgen

IGNORE = -100


# ---- model -------------------------------------------------------------------

def load_model(model_dir, dtype=torch.float64):
    """(config, params) with params a dict of leaf tensors that require grad,
    GPT-2 names without the optional `transformer.` prefix."""
    with open(f"{model_dir}/config.json") as f:
        cfg = json.load(f)
    raw = hfgen.read_model_weights(model_dir)
    params = {}
    for name, t in raw.items():
        if cfg["model_type"] == "gpt2" and name.startswith("transformer."):
            name = name[len("transformer."):]
        params[name] = t.to(dtype).clone().requires_grad_(True)
    return cfg, params


def layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rmsnorm(x, w, eps):
    # HF computes the statistic in fp32 at least; keep float64 when given.
    xf = x if x.dtype == torch.float64 else x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * y.to(x.dtype)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def causal_attention(q, k, v):
    """q [B,H,T,D], k/v [B,H,T,D] -> [B,H,T,D], scale 1/sqrt(D)."""
    T, D = q.shape[2], q.shape[3]
    att = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = att.masked_fill(mask, float("-inf")).softmax(-1)
    return att @ v


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(x, theta):
    """x [B,H,T,D]; HF LlamaRotaryEmbedding + apply_rotary_pos_emb."""
    T, D = x.shape[2], x.shape[3]
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return x * cos + rotate_half(x) * sin


def repeat_kv(x, n_rep):
    """[B,KV,T,D] -> [B,KV*n_rep,T,D], each kv head repeated for its group."""
    if n_rep == 1:
        return x
    B, KV, T, D = x.shape
    return x[:, :, None].expand(B, KV, n_rep, T, D).reshape(B, KV * n_rep, T, D)


def gpt2_forward(cfg, p, ids):
    B, T = ids.shape
    C, H = cfg["n_embd"], cfg["n_head"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    x = p["wte.weight"][ids] + p["wpe.weight"][torch.arange(T)]
    for i in range(cfg["n_layer"]):
        h = f"h.{i}."
        a = layernorm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps)
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]   # Conv1D: x W
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = layernorm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps)
        m = gelu_tanh(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"])
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = layernorm(x, p["ln_f.weight"], p["ln_f.bias"], eps)
    return x @ p["wte.weight"].t()


def linear(x, p, name):
    y = x @ p[name + ".weight"].t()
    b = p.get(name + ".bias")
    return y if b is None else y + b


def llama_forward(cfg, p, ids):
    B, T = ids.shape
    C, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, eps, theta = C // H, cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    x = p["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        L = f"model.layers.{i}."
        a = rmsnorm(x, p[L + "input_layernorm.weight"], eps)
        q = linear(a, p, L + "self_attn.q_proj").view(B, T, H, D).transpose(1, 2)
        k = linear(a, p, L + "self_attn.k_proj").view(B, T, KV, D).transpose(1, 2)
        v = linear(a, p, L + "self_attn.v_proj").view(B, T, KV, D).transpose(1, 2)
        q, k = rope(q, theta), rope(k, theta)
        k, v = repeat_kv(k, H // KV), repeat_kv(v, H // KV)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, H * D)
        x = x + linear(y, p, L + "self_attn.o_proj")
        m = rmsnorm(x, p[L + "post_attention_layernorm.weight"], eps)
        g = linear(m, p, L + "mlp.gate_proj")
        x = x + linear(torch.nn.functional.silu(g) * linear(m, p, L + "mlp.up_proj"), p,
                       L + "mlp.down_proj")
    x = rmsnorm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]
    return x @ head.t()


def forward(cfg, p, ids):
    if cfg["model_type"] == "gpt2":
        return gpt2_forward(cfg, p, ids)
    if cfg["model_type"] in ("llama", "mistral", "qwen2"):
        return llama_forward(cfg, p, ids)
    raise ValueError(f"unsupported model_type {cfg['model_type']}")


# ---- data --------------------------------------------------------------------

def load_examples(path, seq_len):
    """Each JSONL line -> (inputs[seq_len], targets[seq_len]) int64 rows:
    inputs truncated to seq_len and padded with 0, targets[t] = labels[t+1]
    (labels default to input_ids), -100 past the end: HF's shift."""
    out = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            ex = json.loads(line)
            ids = ex["input_ids"][:seq_len]
            labels = ex.get("labels", ex["input_ids"])[:seq_len]
            inp = ids + [0] * (seq_len - len(ids))
            tgt = labels[1:] + [IGNORE] * (seq_len - len(labels) + 1)
            out.append((inp, tgt))
    return out


def splitmix64(x):
    """One step of SplitMix64: returns (new_state, output)."""
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return x, z ^ (z >> 31)


def identity_order(n, seed, epoch):
    return list(range(n))


def engine_order(n, seed, epoch):
    """The permutation engine/data.h documents: Fisher-Yates driven by
    splitmix64 from state = seed ^ ((epoch + 1) * golden), j = draw % (i + 1)
    for i = n-1 down to 1."""
    m = (1 << 64) - 1
    state = (seed ^ (((epoch + 1) * 0x9E3779B97F4A7C15) & m)) & m
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        state, z = splitmix64(state)
        j = z % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def example_stream(n, seed, order):
    """Endless example indices: epoch 0's permutation, then epoch 1's, ..."""
    epoch = 0
    while True:
        for i in order(n, seed, epoch):
            yield i
        epoch += 1


# ---- schedule and training loop ------------------------------------------------

def lr_lambda(schedule, step0, warmup, total):
    """HF get_{constant,linear,cosine}_schedule_with_warmup multiplier at
    scheduler step step0 (0 for the first optimizer update)."""
    if step0 < warmup:
        return step0 / max(1, warmup)
    if schedule == "constant":
        return 1.0
    progress = (step0 - warmup) / max(1, total - warmup)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    if schedule == "cosine":
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    raise ValueError(f"unknown schedule {schedule}")


def train(spec, dtype=torch.float64, order=identity_order, lr_offset=0, steps=None, final=None,
          evals=None):
    """Runs the spec's training loop; returns one dict per step:
    {step, loss, lr, grad_norm, tokens}. lr_offset=1 evaluates the schedule at
    k instead of k-1 (for engines that count the first update as step 1).
    final: a dict that receives the trained parameters (our names).
    evals: a dict that receives {step: eval loss} when the spec has an eval
    file: mean CE over all of its non-ignored targets with the weights after
    that step, every eval_every_steps steps and after the last one."""
    hp = spec["hyperparameters"]
    cfg, p = load_model(spec["model"]["path"], dtype)
    if final is not None:
        final.update(p)
    B, T, GA = hp["batch_size"], hp["seq_len"], hp.get("grad_accum", 1)
    examples = load_examples(spec["dataset"]["train"], T)
    stream = example_stream(len(examples), hp.get("seed", 1234), order)
    # One parameter group with decay (matrices, embeddings), one without.
    decay = [t for t in p.values() if t.dim() >= 2]
    no_decay = [t for t in p.values() if t.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": hp.get("weight_decay", 0.0)},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=hp["lr"], betas=(hp.get("adam_beta1", 0.9), hp.get("adam_beta2", 0.999)),
        eps=hp.get("adam_eps", 1e-8))
    max_steps = hp["max_steps"]
    eval_path = spec["dataset"].get("eval")
    eval_rows = load_examples(eval_path, T) if eval_path and evals is not None else []
    eval_every = hp.get("eval_every_steps", 0)
    out = []
    for k in range(1, (steps or max_steps) + 1):
        micro = []
        for _ in range(GA):
            rows = [examples[next(stream)] for _ in range(B)]
            micro.append((torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])))
        n_tok = sum(int((tg != IGNORE).sum()) for _, tg in micro)
        opt.zero_grad(set_to_none=False)
        total = 0.0
        for ids, tg in micro:
            logits = forward(cfg, p, ids)
            lsum = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), tg.reshape(-1),
                ignore_index=IGNORE, reduction="sum")
            (lsum / n_tok).backward()
            total += float(lsum)
        mgn = hp.get("max_grad_norm", 1.0)
        params = list(p.values())
        if mgn > 0:
            gn = float(torch.nn.utils.clip_grad_norm_(params, mgn))
        else:
            gn = float(torch.sqrt(sum((t.grad.double() ** 2).sum() for t in params)))
        lr = hp["lr"] * lr_lambda(hp.get("schedule", "constant"), k - 1 + lr_offset,
                                  hp.get("warmup_steps", 0), max_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        out.append({"step": k, "loss": total / n_tok, "lr": lr, "grad_norm": gn,
                    "tokens": B * T * GA})
        if eval_rows and ((eval_every > 0 and k % eval_every == 0) or k == max_steps):
            evals[k] = eval_loss(cfg, p, eval_rows)
    return out


def eval_loss(cfg, p, rows):
    """Mean cross-entropy over every non-ignored target of the eval rows."""
    with torch.no_grad():
        ids = torch.tensor([r[0] for r in rows])
        tg = torch.tensor([r[1] for r in rows])
        logits = forward(cfg, p, ids)
        s = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tg.reshape(-1),
                                              ignore_index=IGNORE, reduction="sum")
        return float(s) / int((tg != IGNORE).sum())
