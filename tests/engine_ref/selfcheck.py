# selfcheck.py — checks the PyTorch reference itself (ctest engine_ref.selfcheck),
# so that an engine mismatch can be blamed on the engine and not on torchref.py.
#
# Each piece of torchref.py is compared with a second, differently written
# formulation: safetensors bytes against the format description, GPT-2
# attention against torch's multi_head_attention_forward, grouped-query
# attention against the same model with duplicated key/value heads, rotate-half
# RoPE against Meta's complex-number form, causality and right padding, the
# schedules against hand-computed values, and AdamW against its formula.
import json
import math
import os
import struct
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hfgen      # noqa: E402
import torchref   # noqa: E402

failures = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        failures.append(name)


def close(a, b, tol=1e-10):
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


def check_safetensors(tmp):
    g = torch.Generator().manual_seed(3)
    ts = {"a.weight": torch.randn(3, 5, generator=g), "b": torch.randn(7, generator=g)}
    for dt in ("F32", "F16", "BF16"):
        path = os.path.join(tmp, f"t_{dt}.safetensors")
        hfgen.write_safetensors(path, ts, dt)
        raw = open(path, "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        hdr = json.loads(raw[8:8 + n])
        size = {"F32": 4, "F16": 2, "BF16": 2}[dt]
        ok = n % 8 == 0 and hdr["a.weight"]["shape"] == [3, 5] and hdr["a.weight"]["dtype"] == dt
        ok = ok and hdr["a.weight"]["data_offsets"] == [0, 15 * size]
        ok = ok and hdr["b"]["data_offsets"] == [15 * size, 22 * size] and len(raw) == 8 + n + 22 * size
        back = hfgen.read_safetensors(path)
        want = {k: v.to(hfgen.ST_DTYPES[dt][0]).double() for k, v in ts.items()}
        ok = ok and all(torch.equal(back[k], want[k]) for k in ts)
        check(f"safetensors {dt} layout and round trip", ok)
    # Sharded: the index maps every tensor to a file holding it.
    cfg = hfgen.llama_config()
    t = hfgen.llama_tensors(cfg, g)
    hfgen.write_model(os.path.join(tmp, "sh"), cfg, t, shards=3)
    back = hfgen.read_model_weights(os.path.join(tmp, "sh"))
    check("sharded model round trip", set(back) == set(t) and
          all(torch.equal(back[k], t[k].double()) for k in t))


def check_ops():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 6, 16, generator=g, dtype=torch.float64)
    w = torch.randn(16, generator=g, dtype=torch.float64)
    b = torch.randn(16, generator=g, dtype=torch.float64)
    check("layernorm = F.layer_norm", close(torchref.layernorm(x, w, b, 1e-5),
                                            F.layer_norm(x, (16,), w, b, 1e-5)))
    want = x / torch.sqrt((x * x).sum(-1, keepdim=True) / 16 + 1e-6) * w
    check("rmsnorm formula", close(torchref.rmsnorm(x, w, 1e-6), want))
    check("gelu tanh = F.gelu(approximate=tanh)", close(torchref.gelu_tanh(x),
                                                        F.gelu(x, approximate="tanh")))
    # RoPE: HF rotate-half on [x_lo | x_hi] is Meta's complex rotation of the
    # pairs (x_lo[i], x_hi[i]) by pos * theta^(-2i/D).
    q = torch.randn(2, 3, 9, 8, generator=g, dtype=torch.float64)
    D = 8
    inv = 500000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(9, dtype=torch.float64)[:, None] * inv[None, :]
    z = torch.complex(q[..., :D // 2], q[..., D // 2:]) * torch.polar(torch.ones_like(ang), ang)
    want = torch.cat((z.real, z.imag), dim=-1)
    check("rope rotate-half = complex rotation", close(torchref.rope(q, 500000.0), want))


def check_gpt2(tmp):
    g = torch.Generator().manual_seed(5)
    cfg = hfgen.gpt2_config(n_embd=32, n_head=4, n_layer=1)
    t = {k: v.double() for k, v in hfgen.gpt2_tensors(cfg, g).items()}
    ids = torch.randint(0, cfg["vocab_size"], (2, 12), generator=g)
    # Attention sub-block through torch's own multi-head attention.
    x = torch.randn(2, 12, 32, generator=g, dtype=torch.float64)
    C, H, T = 32, 4, 12
    qkv = x @ t["h.0.attn.c_attn.weight"] + t["h.0.attn.c_attn.bias"]
    q, k, v = (u.view(2, T, H, C // H).transpose(1, 2) for u in qkv.split(C, -1))
    mine = torchref.causal_attention(q, k, v).transpose(1, 2).reshape(2, T, C)
    mine = mine @ t["h.0.attn.c_proj.weight"] + t["h.0.attn.c_proj.bias"]
    xt = x.transpose(0, 1)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    ref, _ = F.multi_head_attention_forward(
        xt, xt, xt, C, H, t["h.0.attn.c_attn.weight"].t(), t["h.0.attn.c_attn.bias"], None, None,
        False, 0.0, t["h.0.attn.c_proj.weight"].t(), t["h.0.attn.c_proj.bias"], training=False,
        need_weights=False, attn_mask=mask)
    check("gpt2 attention = F.multi_head_attention_forward", close(mine, ref.transpose(0, 1)))
    # Causality: a later token never changes earlier logits.
    la = torchref.gpt2_forward(cfg, t, ids)
    ids2 = ids.clone()
    ids2[:, 7] = (ids2[:, 7] + 1) % cfg["vocab_size"]
    lb = torchref.gpt2_forward(cfg, t, ids2)
    check("gpt2 causal", close(la[:, :7], lb[:, :7]) and not close(la[:, 7:], lb[:, 7:]))
    # The `transformer.` prefix loads to the same parameters.
    for pre in ("", "transformer."):
        hfgen.write_model(os.path.join(tmp, "g" + pre), cfg, hfgen.gpt2_tensors(
            cfg, torch.Generator().manual_seed(9), prefix=pre))
    _, p0 = torchref.load_model(os.path.join(tmp, "g"))
    _, p1 = torchref.load_model(os.path.join(tmp, "gtransformer."))
    check("gpt2 prefix-free names", set(p0) == set(p1) and all(torch.equal(p0[k], p1[k]) for k in p0))


def check_llama():
    g = torch.Generator().manual_seed(6)
    cfg = hfgen.llama_config(hidden=32, heads=4, kv_heads=2, layers=2, model_type="qwen2")
    t = {k: v.double() for k, v in hfgen.llama_tensors(cfg, g).items()}
    ids = torch.randint(0, cfg["vocab_size"], (2, 10), generator=g)
    # GQA with 2 kv heads = MHA whose kv heads are copied for each group.
    mha_cfg = dict(cfg, num_key_value_heads=4)
    m = dict(t)
    D = 8
    for i in range(2):
        for n in ("k_proj", "v_proj"):
            key = f"model.layers.{i}.self_attn.{n}"
            m[key + ".weight"] = t[key + ".weight"].view(2, D, 32).repeat_interleave(2, 0).reshape(32, 32)
            m[key + ".bias"] = t[key + ".bias"].view(2, D).repeat_interleave(2, 0).reshape(32)
    check("gqa = mha with repeated kv heads",
          close(torchref.llama_forward(cfg, t, ids), torchref.llama_forward(mha_cfg, m, ids)))
    # Right padding never changes the loss of the real tokens.
    full = torchref.llama_forward(cfg, t, ids)[:, :6]
    short = torchref.llama_forward(cfg, t, ids[:, :6])
    check("llama right padding is inert", close(full, short))
    # Tied head uses the embedding matrix.
    tied = dict(cfg, tie_word_embeddings=True)
    tt = dict(t, **{"lm_head.weight": t["model.embed_tokens.weight"]})
    check("tied head = untied head with lm_head := embed_tokens",
          close(torchref.llama_forward(tied, t, ids), torchref.llama_forward(cfg, tt, ids)))


def check_schedule_and_adamw():
    lr = torchref.lr_lambda
    ok = lr("cosine", 0, 2, 10) == 0.0 and lr("cosine", 1, 2, 10) == 0.5
    ok = ok and lr("cosine", 2, 2, 10) == 1.0 and abs(lr("cosine", 6, 2, 10) - 0.5) < 1e-15
    ok = ok and abs(lr("linear", 6, 2, 10) - 0.5) < 1e-15 and lr("constant", 9, 2, 10) == 1.0
    ok = ok and lr("linear", 0, 0, 4) == 1.0 and lr("linear", 3, 0, 4) == 0.25
    check("schedules (HF warmup + constant/linear/cosine)", ok)
    # Two AdamW steps by the formula of kernels.h vs torch.optim.AdamW.
    g = torch.Generator().manual_seed(7)
    p0 = torch.randn(5, generator=g, dtype=torch.float64)
    grads = [torch.randn(5, generator=g, dtype=torch.float64) for _ in range(2)]
    p = p0.clone().requires_grad_(True)
    opt = torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for gr in grads:
        p.grad = gr.clone()
        opt.step()
    q, m, v = p0.clone(), torch.zeros(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64)
    for t_, gr in enumerate(grads, 1):
        q = q - 0.01 * 0.1 * q
        m = 0.9 * m + 0.1 * gr
        v = 0.95 * v + 0.05 * gr * gr
        q = q - 0.01 * (m / (1 - 0.9 ** t_)) / (torch.sqrt(v / (1 - 0.95 ** t_)) + 1e-8)
    check("torch AdamW = decoupled-decay formula", close(p.detach(), q, 1e-14))


def check_data(tmp):
    path = os.path.join(tmp, "d.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"input_ids": [5, 6, 7]}) + "\n")
        f.write(json.dumps({"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}) + "\n")
    ex = torchref.load_examples(path, 4)
    ok = ex[0] == ([5, 6, 7, 0], [6, 7, -100, -100])
    ok = ok and ex[1] == ([1, 2, 3, 4], [-100, 3, 4, -100])
    check("tokens data: shift, truncate, pad", ok, str(ex))
    # SplitMix64 against the published sequence for seed 1234567 (Vigna's
    # splitmix64.c), and the shuffle is a permutation that changes per epoch.
    st, outs = 1234567, []
    for _ in range(3):
        st, z = torchref.splitmix64(st)
        outs.append(z)
    check("splitmix64 reference vectors",
          outs == [6457827717110365317, 3203168211198807973, 9817491932198370423])
    p0, p1 = torchref.engine_order(13, 1234, 0), torchref.engine_order(13, 1234, 1)
    check("epoch permutations", sorted(p0) == list(range(13)) and sorted(p1) == list(range(13))
          and p0 != p1 and p0 == torchref.engine_order(13, 1234, 0))


def main():
    with tempfile.TemporaryDirectory(prefix="engine_ref_self_") as tmp:
        check_safetensors(tmp)
        check_ops()
        check_gpt2(tmp)
        check_llama()
        check_schedule_and_adamw()
        check_data(tmp)
    if failures:
        print(f"{len(failures)} self-check(s) failed: {', '.join(failures)}")
        return 1
    print("torch reference self-checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
