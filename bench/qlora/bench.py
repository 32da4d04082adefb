#!/usr/bin/env python3
"""bench/qlora — QLoRA against LoRA and full fine-tuning, side by side.

1. CPU, one run each on the same Llama shape (model.init, GQA, bf16
   storage, the same data): peak RSS (the last metric's mem_bytes), mean
   tokens/s after the first step, and the engine's own started.memory
   (bytes by kind), with the ratios QLoRA / LoRA and QLoRA / full.
2. The computed device footprint of a Llama-3-8B-shape QLoRA (r = 16 on all
   seven block linears, seq 2048, batch 1, recompute all, bf16): the
   engine's allocations by kind, from its layout rules (docs/engine.md
   "QLoRA"), checked here first against the engine's started.memory for
   the CPU shape of part 1, where both are known exactly.
Usage: bench.py ENGINE [--threads N] [--steps S]
"""
import argparse
import json
import os
import random
import subprocess
import tempfile

A64 = lambda x: (x + 63) // 64 * 64  # noqa: E731
F16 = lambda x: (x + 15) // 16 * 16  # noqa: E731 (the table's 16-float alignment)


def nf4_bytes(n):
    nb = (n + 63) // 64
    return A64((n + 1) // 2) + A64(nb) + A64((nb + 255) // 256 * 4)


def linears(c):
    C, F, H, KV = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"]
    D = C // H
    return [(H * D, C), (KV * D, C), (KV * D, C), (C, H * D), (F, C), (F, C), (C, F)]  # [out, in]


def predicted(c, r):
    """Bytes the engine allocates for the weights, NF4 weights and adapters
    of a bf16 QLoRA run with adapters on every block linear."""
    L, C, V = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
    q = L * sum(nf4_bytes(o * i) for o, i in linears(c))
    rest = F16(V * C) * (1 if c.get("tie_word_embeddings") else 2) + L * 2 * F16(C) + F16(C)
    ad = L * sum(F16(r * i) + F16(o * r) for o, i in linears(c)) * 4
    return {"quantized_weights": q, "weights16": rest * 2, "adapters": ad, "optimizer": 2 * ad}


def run(engine, spec, threads):
    with tempfile.TemporaryDirectory() as d:
        sp = os.path.join(d, "spec.json")
        json.dump(spec, open(sp, "w"))
        cmd = ["/bin/bash", "-c", 'exec "$0" "$@" 3>&1 1>/dev/null 2>/dev/null', engine, "--spec", sp,
               "--workdir", os.path.join(d, "w"), "--threads", str(threads)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    ev = [json.loads(l) for l in out.splitlines() if l.strip()]
    met = [e for e in ev if e["ev"] == "metric"]
    return next(e for e in ev if e["ev"] == "started"), met


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    cfg = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8192, "max_position_embeddings": 512,
           "tie_word_embeddings": False}
    B, T, R = 2, 256, 16
    rng = random.Random(5)
    tmp = tempfile.mkdtemp()
    data = os.path.join(tmp, "train.jsonl")
    with open(data, "w") as f:
        for _ in range(64):
            f.write(json.dumps({"input_ids": [rng.randrange(cfg["vocab_size"]) for _ in range(T)]}) + "\n")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    print(f"1. CPU, Llama {cfg['num_hidden_layers']}x{cfg['hidden_size']} (F {cfg['intermediate_size']}, GQA 8/4, "
          f"vocab {cfg['vocab_size']}), batch {B} x seq {T}, bf16, {a.steps} steps, {a.threads} threads")
    res = {}
    for method in ("full", "lora", "qlora"):
        spec = {"name": "bench", "model": {"init": cfg}, "dataset": {"train": data, "format": "tokens"},
                "method": method, "precision": "bf16", "resources": {"backend": "cpu"},
                "hyperparameters": {"max_steps": a.steps, "batch_size": B, "seq_len": T, "lr": 1e-4,
                                    "log_every_steps": 1, "seed": 1},
                "checkpoint": {"every_steps": 0}}
        if method != "full":
            spec["lora"] = {"r": R, "alpha": 32, "targets": targets}
        started, met = run(a.engine, spec, a.threads)
        tps = sum(m["tokens_per_s"] for m in met[1:]) / max(1, len(met) - 1)
        res[method] = (met[-1]["mem_bytes"], tps, started.get("memory", {}))
        m = started.get("memory", {})
        print(f"  {method:6s} peak RSS {met[-1]['mem_bytes'] / 2**20:8.1f} MiB  {tps:8.1f} tokens/s  "
              f"allocated {m.get('total', 0) / 2**20:7.1f} MiB (weights {m.get('weights', 0) / 2**20:.1f}, "
              f"NF4 {m.get('quantized_weights', 0) / 2**20:.1f}, adapters {m.get('adapters', 0) / 2**20:.1f}, "
              f"optimizer {m.get('optimizer', 0) / 2**20:.1f}, activations {m.get('activations', 0) / 2**20:.1f})")
    for other in ("lora", "full"):
        print(f"  qlora / {other}: peak RSS {res['qlora'][0] / res[other][0]:.2f}x, "
              f"allocated {res['qlora'][2]['total'] / res[other][2]['total']:.2f}x, "
              f"tokens/s {res['qlora'][1] / res[other][1]:.2f}x")
    p, got = predicted(cfg, R), res["qlora"][2]
    for k in ("quantized_weights", "adapters", "optimizer"):
        print(f"  check {k}: computed {p[k]} engine {got[k]} -> {'same' if p[k] == got[k] else 'DIFFERENT'}")

    # 2. Llama-3-8B shape
    c8 = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
          "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False}
    T8, C, F, V, L = 2048, 4096, 14336, 128256, 32
    p = predicted(c8, 16)
    # Activations with recompute "all" in bf16: each layer keeps its output
    # (T x C, 16-bit); one layer's fp32 working set is rebuilt in the
    # backward (norm outputs, q/k/v/attention output, residual, gate/up/act
    # and their gradients: about 8 C + 5 F floats per position, plus the
    # T x H log-sum-exp); the logits and their gradient share one 16-bit
    # [T, V] buffer; each adapter keeps A x [T, r] in fp32.
    acts = L * T8 * C * 2 + (8 * C + 5 * F) * T8 * 4 + T8 * V * 2 + L * 7 * T8 * 16 * 4
    scratch = F * C * 4  # the dequantisation scratch of the largest linear (fp32), CUDA backend
    total = p["quantized_weights"] + p["weights16"] + 2 * p["adapters"] + p["optimizer"] + acts + scratch
    G = 2 ** 30
    print("2. Llama-3-8B shape QLoRA (r 16, all 7 linears, seq 2048, batch 1, recompute all, bf16), computed:")
    for k, v in [("NF4 weights (double quant)", p["quantized_weights"]),
                 ("embeddings + lm_head + norms, bf16", p["weights16"]),
                 ("adapters + their gradients, fp32", 2 * p["adapters"]), ("AdamW m + v", p["optimizer"]),
                 ("activations (recompute all)", acts), ("dequantisation scratch", scratch)]:
        print(f"  {k:38s} {v / G:6.2f} GiB")
    print(f"  {'total':38s} {total / G:6.2f} GiB  (goal: 12 GiB -> {'fits' if total < 12 * G else 'does NOT fit'})")


main()
