# hfgen.py — writes small random Hugging Face model directories, "tokens"
# datasets and trainyard job specs for the engine-vs-PyTorch tests and bench.
#
# The safetensors format is written (and read back) here by hand, because the
# tests may only use the standard library, numpy and torch: an 8-byte
# little-endian header length, a JSON header mapping each tensor name to
# {dtype, shape, data_offsets}, then the raw little-endian data. Tensor names
# and layouts are exactly those Hugging Face stores (GPT-2's Conv1D weights are
# [in, out]; Llama's nn.Linear weights are [out, in]), so the engine reads the
# same files it would read from the Hub.
import json
import math
import os
import struct

import numpy as np
import torch

ST_DTYPES = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2)}


# ---- safetensors -----------------------------------------------------------

def st_bytes(t, dtype):
    """Little-endian bytes of tensor t stored as dtype (F32, F16 or BF16)."""
    tt = t.detach().to(ST_DTYPES[dtype][0]).contiguous()
    if dtype == "BF16":  # numpy has no bfloat16: ship the raw 16-bit patterns
        return tt.view(torch.int16).numpy().astype("<i2").tobytes()
    return tt.numpy().astype("<f4" if dtype == "F32" else "<f2").tobytes()


def write_safetensors(path, tensors, dtype="F32"):
    """tensors: ordered dict name -> torch tensor. Header padded with spaces to
    a multiple of 8 bytes, as the reference implementation does."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        b = st_bytes(t, dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """Returns name -> float64 tensor (exact widening of the stored values)."""
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    base, out = 8 + hlen, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        buf = raw[base + s:base + e]
        if info["dtype"] == "F32":
            a = torch.from_numpy(np.frombuffer(buf, dtype="<f4").copy())
        elif info["dtype"] == "F16":
            a = torch.from_numpy(np.frombuffer(buf, dtype="<f2").astype(np.float32))
        elif info["dtype"] == "BF16":
            a = torch.from_numpy(np.frombuffer(buf, dtype="<i2").copy()).view(torch.bfloat16).float()
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
        out[name] = a.double().reshape(info["shape"])
    return out


def read_model_weights(model_dir):
    """All tensors of a model directory, single file or sharded by index."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        out = {}
        for fn in files:
            out.update(read_safetensors(os.path.join(model_dir, fn)))
        return out
    return read_safetensors(os.path.join(model_dir, "model.safetensors"))


# ---- models ----------------------------------------------------------------

def gpt2_config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=97, eps=1e-5):
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": n_embd,
            "n_layer": n_layer, "n_head": n_head, "n_positions": n_positions, "n_ctx": n_positions,
            "vocab_size": vocab_size, "layer_norm_epsilon": eps, "activation_function": "gelu_new",
            "tie_word_embeddings": True}


def llama_config(hidden=32, inter=64, layers=2, heads=4, kv_heads=2, vocab=211, max_pos=64,
                 eps=1e-6, theta=10000.0, tied=False, model_type="llama"):
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
    return {"model_type": model_type, "architectures": [arch[model_type]], "hidden_size": hidden,
            "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "rms_norm_eps": eps, "rope_theta": theta,
            "max_position_embeddings": max_pos, "vocab_size": vocab, "tie_word_embeddings": tied,
            "hidden_act": "silu"}


def gpt2_tensors(cfg, gen, prefix="", std=0.1):
    """GPT-2 weights in Hugging Face names and layouts (Conv1D: [in, out])."""
    C, V, P = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    r = lambda *s: torch.randn(*s, generator=gen) * std          # noqa: E731
    norm = lambda n: 1.0 + 0.1 * torch.randn(n, generator=gen)   # noqa: E731
    bias = lambda n: 0.05 * torch.randn(n, generator=gen)        # noqa: E731
    t = {prefix + "wte.weight": r(V, C), prefix + "wpe.weight": r(P, C)}
    for i in range(cfg["n_layer"]):
        h = f"{prefix}h.{i}."
        t[h + "ln_1.weight"], t[h + "ln_1.bias"] = norm(C), bias(C)
        t[h + "attn.c_attn.weight"], t[h + "attn.c_attn.bias"] = r(C, 3 * C), bias(3 * C)
        t[h + "attn.c_proj.weight"], t[h + "attn.c_proj.bias"] = r(C, C), bias(C)
        t[h + "ln_2.weight"], t[h + "ln_2.bias"] = norm(C), bias(C)
        t[h + "mlp.c_fc.weight"], t[h + "mlp.c_fc.bias"] = r(C, 4 * C), bias(4 * C)
        t[h + "mlp.c_proj.weight"], t[h + "mlp.c_proj.bias"] = r(4 * C, C), bias(C)
    t[prefix + "ln_f.weight"], t[prefix + "ln_f.bias"] = norm(C), bias(C)
    return t


def llama_tensors(cfg, gen, std=0.1):
    """Llama / Mistral / Qwen2 weights in Hugging Face names (nn.Linear: [out, in])."""
    C, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = C // H
    r = lambda *s: torch.randn(*s, generator=gen) * std          # noqa: E731
    norm = lambda n: 1.0 + 0.1 * torch.randn(n, generator=gen)   # noqa: E731
    bias = lambda n: 0.05 * torch.randn(n, generator=gen)        # noqa: E731
    qkv_bias = cfg["model_type"] == "qwen2"
    t = {"model.embed_tokens.weight": r(V, C)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = r(H * D, C)
        t[p + "self_attn.k_proj.weight"] = r(KV * D, C)
        t[p + "self_attn.v_proj.weight"] = r(KV * D, C)
        if qkv_bias:
            t[p + "self_attn.q_proj.bias"] = bias(H * D)
            t[p + "self_attn.k_proj.bias"] = bias(KV * D)
            t[p + "self_attn.v_proj.bias"] = bias(KV * D)
        t[p + "self_attn.o_proj.weight"] = r(C, H * D)
        t[p + "mlp.gate_proj.weight"] = r(I, C)
        t[p + "mlp.up_proj.weight"] = r(I, C)
        t[p + "mlp.down_proj.weight"] = r(C, I)
        t[p + "input_layernorm.weight"] = norm(C)
        t[p + "post_attention_layernorm.weight"] = norm(C)
    t["model.norm.weight"] = norm(C)
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = r(V, C)
    return t


def write_model(model_dir, cfg, tensors, dtype="F32", shards=1):
    """config.json plus model.safetensors, or `shards` files with an index."""
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if shards <= 1:
        write_safetensors(os.path.join(model_dir, "model.safetensors"), tensors, dtype)
        return
    names = list(tensors)
    per = math.ceil(len(names) / shards)
    weight_map, total = {}, 0
    for s in range(shards):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per:(s + 1) * per]}
        write_safetensors(os.path.join(model_dir, fn), part, dtype)
        for n, t in part.items():
            weight_map[n] = fn
            total += t.numel() * ST_DTYPES[dtype][1]
    with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


# ---- data and spec ---------------------------------------------------------

def write_tokens_dataset(path, n, vocab, seq_len, gen, min_len=2, labels_every=3):
    """n JSONL examples of random ids; lengths from min_len to seq_len + 8, so
    some are padded and some truncated; every labels_every-th line carries
    labels with a masked (-100) prompt and one masked token inside."""
    with open(path, "w") as f:
        for i in range(n):
            L = int(torch.randint(min_len, seq_len + 9, (1,), generator=gen))
            ids = torch.randint(0, vocab, (L,), generator=gen).tolist()
            ex = {"input_ids": ids}
            if labels_every and i % labels_every == 1 and L >= 4:
                labels = list(ids)
                k = int(torch.randint(1, L // 2 + 1, (1,), generator=gen))
                labels[:k] = [-100] * k
                labels[L - 2] = -100
                ex["labels"] = labels
            f.write(json.dumps(ex) + "\n")


def job_spec(model_dir, train_path, max_steps, batch_size, seq_len, grad_accum=2, lr=3e-3,
             schedule="cosine", warmup_steps=2, weight_decay=0.1, max_grad_norm=1.0, seed=1234,
             every_steps=0, name="engine-ref"):
    return {
        "name": name,
        "model": {"path": model_dir},
        "dataset": {"train": train_path, "format": "tokens"},
        "method": "full",
        "hyperparameters": {"max_steps": max_steps, "batch_size": batch_size, "seq_len": seq_len,
                            "grad_accum": grad_accum, "lr": lr, "schedule": schedule,
                            "warmup_steps": warmup_steps, "weight_decay": weight_decay,
                            "max_grad_norm": max_grad_norm, "seed": seed, "log_every_steps": 1},
        "precision": "fp32",
        "resources": {"backend": "cpu"},
        "checkpoint": {"every_steps": every_steps},
    }


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
