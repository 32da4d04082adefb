# mixedref.py — the PyTorch reference for bf16 / fp16 training in the
# engine's precision scheme (llm.c's): fp32 master weights and AdamW
# moments; the forward and backward compute in fp32 but every parameter,
# activation and activation gradient is a 16-bit value, rounded to nearest
# even where it is produced; parameter gradients stay fp32; fp16 adds
# dynamic loss scaling with torch.cuda.amp.GradScaler's defaults.
#
# The rounding points are those a model held in 16-bit tensors has (each
# module output, each residual sum); they are written here from the model
# definitions in torchref.py, not from the engine. Round() rounds its input
# in the forward and the incoming gradient in the backward; the weights use
# RoundW, whose backward passes the fp32 gradient through to the master.
import math

import torch

import torchref

IGNORE = torchref.IGNORE
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Round(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dt):
        ctx.dt = dt
        return x.to(dt).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.dt).to(g.dtype), None


class RoundW(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dt):
        return x.to(dt).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g, None


def gpt2_forward(cfg, p, ids, R):
    B, T = ids.shape
    C, H = cfg["n_embd"], cfg["n_head"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    x = R(p["wte.weight"][ids] + p["wpe.weight"][torch.arange(T)])
    for i in range(cfg["n_layer"]):
        h = f"h.{i}."
        a = R(torchref.layernorm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps))
        qkv = R(a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"])
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = R(torchref.causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C))
        x = R(x + R(y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]))
        m = R(torchref.layernorm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps))
        f = R(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"])
        g = R(torchref.gelu_tanh(f))
        x = R(x + R(g @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]))
    x = R(torchref.layernorm(x, p["ln_f.weight"], p["ln_f.bias"], eps))
    return R(x @ p["wte.weight"].t())


def llama_forward(cfg, p, ids, R):
    B, T = ids.shape
    C, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, eps, theta = C // H, cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    lin = torchref.linear
    x = R(p["model.embed_tokens.weight"][ids])
    for i in range(cfg["num_hidden_layers"]):
        L = f"model.layers.{i}."
        a = R(torchref.rmsnorm(x, p[L + "input_layernorm.weight"], eps))
        q = R(lin(a, p, L + "self_attn.q_proj")).view(B, T, H, D).transpose(1, 2)
        k = R(lin(a, p, L + "self_attn.k_proj")).view(B, T, KV, D).transpose(1, 2)
        v = R(lin(a, p, L + "self_attn.v_proj")).view(B, T, KV, D).transpose(1, 2)
        q, k = R(torchref.rope(q, theta)), R(torchref.rope(k, theta))
        k, v = torchref.repeat_kv(k, H // KV), torchref.repeat_kv(v, H // KV)
        y = R(torchref.causal_attention(q, k, v).transpose(1, 2).reshape(B, T, H * D))
        x = R(x + R(lin(y, p, L + "self_attn.o_proj")))
        m = R(torchref.rmsnorm(x, p[L + "post_attention_layernorm.weight"], eps))
        g = R(lin(m, p, L + "mlp.gate_proj"))
        u = R(lin(m, p, L + "mlp.up_proj"))
        hh = R(torch.nn.functional.silu(g) * u)
        x = R(x + R(lin(hh, p, L + "mlp.down_proj")))
    x = R(torchref.rmsnorm(x, p["model.norm.weight"], eps))
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]
    return R(x @ head.t())


def nudge_ties(master):
    """The engine keeps bf16 masters split (kn_master_split: the bf16
    rounding plus the low 16 bits as a signed number); the one fp32 value
    that does not fit, an exact tie kept at an even bf16 (low half 0x8000,
    bit 16 clear), is moved one ulp towards that bf16. The same here."""
    with torch.no_grad():
        for t in master.values():
            b = t.view(torch.int32)
            tie = ((b & 0xFFFF) == 0x8000) & (((b >> 16) & 1) == 0) & torch.isfinite(t)
            b[tie] -= 1


def train(spec, steps=None, planted=None, growth_interval=2000):
    """The spec's run in its precision; one dict per step: {step, loss, lr,
    grad_norm (None when skipped), loss_scale, skipped_steps} as the engine's
    metric events report them (loss_scale after the step's update).
    planted: name -> factor applied to the loaded masters (to force fp16
    gradient overflow). growth_interval: clean steps before the fp16 scale
    doubles (GradScaler's 2000; the engine's TY_TEST_SCALE_GROWTH_INTERVAL)."""
    prec = spec.get("precision", "fp32")
    dt = DTYPES[prec]
    hp = spec["hyperparameters"]
    cfg, master = torchref.load_model(spec["model"]["path"], torch.float32)
    with torch.no_grad():
        for name, f in (planted or {}).items():
            master[name].mul_(f)
    if prec == "bf16":
        nudge_ties(master)
    B, T, GA = hp["batch_size"], hp["seq_len"], hp.get("grad_accum", 1)
    examples = torchref.load_examples(spec["dataset"]["train"], T)
    stream = torchref.example_stream(len(examples), hp.get("seed", 1234), torchref.identity_order)
    decay = [t for t in master.values() if t.dim() >= 2]
    no_decay = [t for t in master.values() if t.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": hp.get("weight_decay", 0.0)},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=hp["lr"], betas=(hp.get("adam_beta1", 0.9), hp.get("adam_beta2", 0.999)),
        eps=hp.get("adam_eps", 1e-8))
    R = lambda x: Round.apply(x, dt)  # noqa: E731
    fwd = gpt2_forward if cfg["model_type"] == "gpt2" else llama_forward
    # GradScaler's defaults for fp16; bf16 needs no scaling.
    scale = torch.tensor(65536.0 if prec == "fp16" else 1.0, dtype=torch.float32)
    growth, skipped = 0, 0
    max_steps = hp["max_steps"]
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
            p = {n: RoundW.apply(t, dt) for n, t in master.items()}
            logits = fwd(cfg, p, ids, R)
            lsum = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), tg.reshape(-1), ignore_index=IGNORE,
                reduction="sum")
            (lsum * (float(scale) / n_tok)).backward()
            total += float(lsum)
        lr = hp["lr"] * torchref.lr_lambda(hp.get("schedule", "constant"), k - 1,
                                           hp.get("warmup_steps", 0), max_steps)
        grads = [t.grad for t in master.values()]
        gn = None
        if prec == "fp16" and not all(bool(torch.isfinite(g).all()) for g in grads):
            scale = scale * 0.5
            growth = 0
            skipped += 1
        else:
            if prec == "fp16":
                inv = (1.0 / scale).to(torch.float32)
                for g in grads:
                    g.mul_(inv)
            mgn = hp.get("max_grad_norm", 1.0)
            if mgn > 0:
                gn = float(torch.nn.utils.clip_grad_norm_(list(master.values()), mgn))
            else:
                gn = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
            if prec == "bf16":
                nudge_ties(master)
            if prec == "fp16":
                growth += 1
                if growth == growth_interval:
                    scale, growth = scale * 2.0, 0
        out.append({"step": k, "loss": total / n_tok, "lr": lr, "grad_norm": gn,
                    "loss_scale": float(scale), "skipped_steps": skipped})
    return out, master
