"""qlora.load_rss — the QLoRA load never stages a whole tensor in fp32.

Two bf16 Llamas that differ only in the vocabulary: a small one, and one
whose embedding and lm_head (V x C each) dwarf the rest. Each trains one
step under method qlora in bf16; the engine reports its allocations
(started.memory.total) and its peak resident size (metric mem_bytes,
getrusage). The big model may add to the peak what it allocates more than
the small one (its 16-bit embedding and lm_head, its logits) plus the
loader's bounded slices (SLACK) — nothing proportional to the tensors:
the old load path (each tensor staged whole in fp32, an fp32 parameter
buffer beside the 16-bit one, the file's pages kept mapped) added about
4 x the 16-bit bytes of embedding + lm_head more, and fails here.
The same runs check the bytes too: a second big run whose model file is
fp32 (converted in slices) must give the bf16 file's losses bit for bit.
Plain python3 (the safetensors files are written by hand, in a child).
Usage: load_rss.py ENGINE WORKDIR
"""
import json
import os
import random
import shutil
import struct
import subprocess
import sys

MiB = 2 ** 20
C, F, LAYERS, HEADS = 64, 128, 1, 4
V_SMALL, V_BIG = 512, 131072  # the big one: 2 x 16 MiB of bf16 embedding + lm_head
SLACK = 28 * MiB  # slices (fp32 4 MiB host + 4 MiB device + 2 MiB bf16 + 4 MiB NF4) and noise


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def tensors(V):
    t = [("model.embed_tokens.weight", [V, C]), ("model.norm.weight", [C]), ("lm_head.weight", [V, C])]
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        t += [(p + "input_layernorm.weight", [C]), (p + "post_attention_layernorm.weight", [C])]
        t += [(p + f"self_attn.{n}_proj.weight", [C, C]) for n in "qkvo"]
        t += [(p + "mlp.gate_proj.weight", [F, C]), (p + "mlp.up_proj.weight", [F, C]),
              (p + "mlp.down_proj.weight", [C, F])]
    return t


def block(name, n, rng):
    """Up to 4096 small values, tiled over the tensor (fast; the file's
    size is what matters here); norms are ones."""
    k = min(n, 4096)
    return [1.0] * k if "norm" in name else [rng.gauss(0.0, 0.02) for _ in range(k)]


def write_model(d, V, dtype):
    os.makedirs(d, exist_ok=True)
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": C,
           "intermediate_size": F, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
           "num_key_value_heads": HEADS, "vocab_size": V, "max_position_embeddings": 64,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
           "torch_dtype": "bfloat16"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    rng = random.Random(7)
    es = 2 if dtype == "BF16" else 4
    hdr, blobs, off = {}, [], 0
    for name, shape in tensors(V):
        n = 1
        for s in shape:
            n *= s
        raw = struct.pack("<%df" % min(n, 4096), *block(name, n, rng))
        if dtype == "BF16":  # fp32 bits truncated: exactly representable
            b16 = b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))
            blob = (b16 * (n // min(n, 4096) + 1))[:2 * n]
        else:  # the same values, widened: the bf16 bits with zero low halves
            b32 = b"".join(b"\0\0" + raw[i + 2:i + 4] for i in range(0, len(raw), 4))
            blob = (b32 * (n // min(n, 4096) + 1))[:4 * n]
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + es * n]}
        blobs.append(blob)
        off += es * n
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def run(engine, model_dir, data, wd):
    os.makedirs(wd, exist_ok=True)
    spec = {"name": "load-rss", "model": {"path": model_dir}, "dataset": {"train": data, "format": "tokens"},
            "method": "qlora", "precision": "bf16", "resources": {"backend": "cpu"},
            "lora": {"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]},
            "hyperparameters": {"max_steps": 2, "batch_size": 1, "seq_len": 16, "lr": 1e-3,
                                "log_every_steps": 1, "seed": 1},
            "checkpoint": {"every_steps": 0}}
    sp = os.path.join(wd, "spec.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    cmd = ["/bin/bash", "-c", 'exec "$0" "$@" 3>&1 1>&2', engine, "--spec", sp, "--workdir",
           os.path.join(wd, "w"), "--threads", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    ev = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    done = [e for e in ev if e["ev"] == "done"]
    if r.returncode or not done or done[-1]["status"] != "succeeded":
        fail(f"engine exit {r.returncode}: {[e for e in ev if e['ev'] == 'error']}\n{r.stderr[-2000:]}")
    started = next(e for e in ev if e["ev"] == "started")
    met = [e for e in ev if e["ev"] == "metric"]
    return started["memory"]["total"], max(m["mem_bytes"] for m in met), [m["loss"] for m in met]


def main():
    engine, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "train.jsonl")
    rng = random.Random(3)
    with open(data, "w") as f:
        for _ in range(4):
            f.write(json.dumps({"input_ids": [rng.randrange(V_SMALL) for _ in range(16)]}) + "\n")
    res = {}
    for tag, V, dt in (("small", V_SMALL, "BF16"), ("big", V_BIG, "BF16"), ("big32", V_BIG, "F32")):
        d = os.path.join(work, tag)
        # Written by a child: a child's peak RSS starts at its parent's
        # (fork copies the high-water mark, exec keeps it), so this process
        # must not grow by the file's size before starting the engine.
        subprocess.run([sys.executable, __file__, "--write", d, str(V), dt], check=True)
        res[tag] = run(engine, d, data, os.path.join(work, "run-" + tag))
        shutil.rmtree(d)
        print(f"{tag:6s} V {V:6d} {dt:4s}: allocated {res[tag][0] / MiB:7.1f} MiB, peak RSS "
              f"{res[tag][1] / MiB:7.1f} MiB, losses {res[tag][2]}")
    grown = res["big"][0] - res["small"][0]
    bound = res["small"][1] + grown + SLACK
    big16 = 2 * V_BIG * C * 2
    print(f"big - small: allocated +{grown / MiB:.1f} MiB (embedding + lm_head in bf16: {big16 / MiB:.1f}); "
          f"peak RSS +{(res['big'][1] - res['small'][1]) / MiB:.1f} MiB; bound {bound / MiB:.1f} MiB")
    if grown < big16:
        fail(f"the big model allocates only {grown} bytes more, less than its bf16 embedding + lm_head")
    for tag in ("big", "big32"):
        if res[tag][1] > bound:
            fail(f"{tag}: peak RSS {res[tag][1]} bytes above {bound} (small's peak + the allocations it adds "
                 f"+ {SLACK // MiB} MiB): the load stages whole tensors again?")
    if res["big32"][2] != res["big"][2]:
        fail(f"the fp32 file trains to {res['big32'][2]}, the bf16 one to {res['big'][2]}: not the same bytes")
    print("ok")


if len(sys.argv) == 5 and sys.argv[1] == "--write":
    write_model(sys.argv[2], int(sys.argv[3]), sys.argv[4])
else:
    main()
