#!/usr/bin/env python3
# bench.py — trainyard-engine on one GPU (issue 11): GPT-2 124M and a
# Llama 1B shape at T = 1024 in bf16, the largest batch that fits; tokens/s,
# MFU and peak device memory. Standard library only: tests/gpu/run.sh runs
# it on a lent GPU machine next to the binaries it carries.
#
#   bench.py ENGINE [--shapes gpt2-124M,llama-1B] [--budget SECONDS] [--out FILE]
#       (--out: the results are added to FILE's JSON object, keys already
#       there, such as scaling.py's "scaling", kept)
#   bench.py ENGINE --dry     (here: tiny shapes on the emulated backend,
#                              ENGINE = trainyard-engine-emu; checks the
#                              script, measures nothing)
#
# Batch: tried from the largest candidate down; a run whose engine reports
# an error (out of device memory) moves to the next. tokens/s is the median
# of the metric events' tokens_per_s after two warm-up steps. MFU counts
# 6 N + 6 L C T FLOPs per token (N parameters, L layers, C width, T
# positions: the matmuls forward and backward plus attention's QK^T and
# PV) against 989 TFLOP/s, H100/H200 dense bf16. Peak device memory is the
# engine's mem_bytes (the kernel context's peak on a GPU).
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

PEAK_FLOPS = 989e12
SHAPES = {
    "gpt2-124M": {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
                  "n_positions": 1024, "T": 1024, "batches": [64, 48, 32, 24, 16, 8, 4, 2, 1], "steps": 8},
    "llama-1B": {"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
                 "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "max_position_embeddings": 1024, "T": 1024, "batches": [32, 24, 16, 12, 8, 4, 2, 1],
                 "steps": 8},
    # --dry: the same code path at emulation size.
    # The first batch is refused by the engine (too many positions), so the
    # sweep down is exercised too.
    "gpt2-dry": {"model_type": "gpt2", "vocab_size": 97, "n_embd": 32, "n_layer": 2, "n_head": 2,
                 "n_positions": 16, "T": 16, "batches": [1 << 26, 2], "steps": 3},
    "llama-dry": {"model_type": "llama", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "max_position_embeddings": 16, "T": 16, "batches": [1 << 26, 2], "steps": 3},
}


def layers_width(s):
    return (s.get("n_layer") or s["num_hidden_layers"], s.get("n_embd") or s["hidden_size"])


def write_data(tmp, vocab, T, rows):
    p = os.path.join(tmp, f"tokens-{vocab}-{T}-{rows}.jsonl")
    if not os.path.exists(p):
        rng = random.Random(1)
        with open(p, "w") as f:
            for _ in range(rows):
                f.write(json.dumps({"input_ids": [rng.randrange(vocab) for _ in range(T + 1)]}) + "\n")
    return p


def read_events(text):
    """The engine's event lines (JSON) of text; other lines are skipped."""
    events = []
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    return events


def run_one(engine, tmp, name, s, batch, env, timeout):
    cfg = {k: v for k, v in s.items() if k not in ("T", "batches", "steps")}
    T, steps = s["T"], s["steps"]
    spec = {"model": {"init": cfg},
            "dataset": {"train": write_data(tmp, s["vocab_size"], T, min(batch * (steps + 1), 1024)), "format": "tokens"},
            "hyperparameters": {"max_steps": steps, "batch_size": batch, "seq_len": T, "lr": 1e-4,
                                "log_every_steps": 1},
            "precision": "bf16", "resources": {"gpus": 1, "backend": "cuda"},
            "checkpoint": {"every_steps": 0}}
    sp = os.path.join(tmp, f"{name}-b{batch}.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    work = os.path.join(tmp, f"work-{name}-b{batch}")
    t0 = time.monotonic()
    try:
        p = subprocess.run([engine, "--spec", sp, "--workdir", work], capture_output=True, text=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"batch": batch, "error": f"timed out after {timeout:.0f} s"}
    events = read_events(p.stdout)
    err = [e for e in events if e.get("ev") == "error"]
    metrics = [e for e in events if e.get("ev") == "metric"]
    if p.returncode != 0 or err or not metrics:
        why = err[0]["message"] if err else (p.stderr.strip().splitlines() or ["no output"])[-1]
        return {"batch": batch, "error": why}
    started = [e for e in events if e.get("ev") == "started"][0]
    L, C = layers_width(s)
    steady = [m["tokens_per_s"] for m in metrics if m["step"] > 2] or [metrics[-1]["tokens_per_s"]]
    tps = statistics.median(steady)
    flops_tok = 6 * started["params"] + 6 * L * C * T
    return {"batch": batch, "T": T, "params": started["params"], "backend": started["backend"],
            "gpu": started.get("gpu"), "tokens_per_s": tps, "mfu": tps * flops_tok / PEAK_FLOPS,
            "peak_device_bytes": max(m["mem_bytes"] for m in metrics), "losses": [m["loss"] for m in metrics],
            "wall_s": round(time.monotonic() - t0, 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("--shapes", default="gpt2-124M,llama-1B")
    ap.add_argument("--budget", type=float, default=300, help="seconds for all shapes")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--dry", action="store_true")
    a = ap.parse_args()
    env = dict(os.environ)
    shapes = a.shapes.split(",")
    if a.dry:
        env.update(TY_KERNELS="cuda-emu", TY_EMU_GUARD="1", OMP_NUM_THREADS="1")
        shapes = ["gpt2-dry", "llama-dry"]
    t_end = time.monotonic() + a.budget
    results = {}
    with tempfile.TemporaryDirectory(prefix="ty-bench-gpu-") as tmp:
        for name in shapes:
            s = SHAPES[name]
            tried = []
            for b in s["batches"]:
                left = t_end - time.monotonic()
                if left < 10:
                    tried.append({"batch": b, "error": "time budget spent"})
                    break
                r = run_one(a.engine, tmp, name, s, b, env, left)
                if "error" not in r:
                    results[name] = r
                    break
                tried.append(r)
            if name in results:
                r = results[name]
                r["refused"] = tried
                mib = r["peak_device_bytes"] / 2**20
                print(f"{name}: batch {r['batch']} x T {r['T']} bf16 on {r['backend']}: "
                      f"{r['tokens_per_s']:.0f} tokens/s, MFU {100 * r['mfu']:.1f}% of 989 TFLOP/s, "
                      f"peak device memory {mib:.0f} MiB ({r['params']} parameters)")
            else:
                results[name] = {"error": "no batch ran", "tried": tried}
                print(f"{name}: no batch ran: {tried[-1]['error'] if tried else 'nothing tried'}")
    if a.out:  # added to what is there (scaling.py's "scaling", run before)
        doc = {}
        if os.path.exists(a.out):
            with open(a.out) as f:
                doc = json.load(f)
        doc.update(results)
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
