#!/usr/bin/env python3
# bench.py — trainyard-engine on one GPU: GPT-2 124M and a
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
#   --profile DIR: after a shape's measured run, one more at its batch
#       for PROFILE_STEPS steps with TY_CUDA_PROFILE=DIR/<shape>
#       (kernels/cuda/cuda_profile.cu: GPU time by launch name), when the
#       budget still holds as long again; its table stays in DIR and one
#       `PROFILE <shape>:` line gives a step's GPU span, the time in
#       launches and idle between them, and the largest launches. The
#       measured figures never come from the profiled run (its events and
#       reads slow the step).
#
# Batch: tried from the largest candidate down; a run that ends out of
# memory (the engine's "out of memory ...", CUDA's "out of memory",
# cuBLASLt's allocation status) moves to the next. Any other error stops
# the shape's sweep there and is printed: a smaller batch would not cure
# it, and walking on would spend the GPU's minutes repeating it. tokens/s
# is the median of the metric events' tokens_per_s after two warm-up steps.
#
# MFU = tokens/s x FLOPs per token / 989e12 (H100/H200 dense bf16), with
#     FLOPs per token = 6 N_matmul + 6 L T C
# N_matmul: the parameters that enter a matrix product for every token,
# i.e. all of them but the lookup tables: the token embedding when it is
# not also the output head (Llama's untied embed_tokens; GPT-2's tied wte
# is the head's matrix, so it counts once) and GPT-2's position table.
# The output head's V x C is a real product and counts; norms and biases
# (a few thousand) count too. 6 = 2 (multiply-add) x 3 (forward, and the
# backward's two products). 6 L T C is attention's QK^T and PV (2 T C each
# per token and layer, forward and backward), causal mask ignored, as in
# llm.c and Kaplan et al. Counting the untied embedding too would
# overstate Llama 1B's FLOPs by 21%.
#
# Memory: peak_device_bytes is the engine's mem_bytes (every buffer the
# kernel context held at its peak, cuBLASLt's workspace included);
# device_used_bytes is the whole device's use as the driver sees it
# (cudaMemGetInfo's total - free, highest after any step): the CUDA
# context, cuBLASLt's own allocations and anything else on the card too.
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

PEAK_FLOPS = 989e12
OOM_RE = re.compile(r"out of (device )?memory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|"
                    r"cuBLASLt .* failed \(status 3\)", re.I)  # 3: CUBLAS_STATUS_ALLOC_FAILED
FLOPS_FORMULA = "6 N_matmul + 6 L T C per token, N_matmul = parameters less lookup tables"
SHAPES = {
    "gpt2-124M": {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
                  "n_positions": 1024, "T": 1024, "batches": [64, 48, 32, 24, 16, 8, 4, 2, 1], "steps": 8},
    "llama-1B": {"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
                 "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "max_position_embeddings": 1024, "T": 1024, "batches": [32, 24, 16, 12, 8, 4, 2, 1],
                 "steps": 8},
    # --dry: the same code path at emulation size. The emulated device
    # cannot run out of memory, so the sweep's branches (out of memory
    # moves on, any other error stops) are checked by tests/gpu/bench_test.py
    # with a stand-in engine instead.
    "gpt2-dry": {"model_type": "gpt2", "vocab_size": 97, "n_embd": 32, "n_layer": 2, "n_head": 2,
                 "n_positions": 16, "T": 16, "batches": [2], "steps": 3},
    "llama-dry": {"model_type": "llama", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "max_position_embeddings": 16, "T": 16, "batches": [2], "steps": 3},
}


def layers_width(s):
    return (s.get("n_layer") or s["num_hidden_layers"], s.get("n_embd") or s["hidden_size"])


def matmul_params(s, params):
    """The engine's parameter count less what is only looked up per token:
    the token embedding unless it is the tied output head, and GPT-2's
    position table. tie_word_embeddings defaults as in the engine's config
    reader: GPT-2 tied, Llama untied."""
    _, C = layers_width(s)
    tied = s.get("tie_word_embeddings", s["model_type"] == "gpt2")
    lookup = 0 if tied else s["vocab_size"] * C
    if s["model_type"] == "gpt2":
        lookup += s["n_positions"] * C
    return params - lookup


def flops_per_token(s, params, T):
    L, C = layers_width(s)
    return 6 * matmul_params(s, params) + 6 * L * T * C


def is_oom(message):
    return bool(OOM_RE.search(message or ""))


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


PROFILE_STEPS = 4
PROFILE_TOP = 8


def run_one(engine, tmp, name, s, batch, env, timeout, steps=None):
    cfg = {k: v for k, v in s.items() if k not in ("T", "batches", "steps")}
    T, steps = s["T"], steps or s["steps"]
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
        return {"batch": batch, "error": f"timed out after {timeout:.0f} s", "oom": False}
    events = read_events(p.stdout)
    err = [e for e in events if e.get("ev") == "error"]
    metrics = [e for e in events if e.get("ev") == "metric"]
    if p.returncode != 0 or err or not metrics:
        why = err[0]["message"] if err else (p.stderr.strip().splitlines() or ["no output"])[-1]
        if not err and p.returncode < 0:
            why = f"killed by signal {-p.returncode}: {why}"
        return {"batch": batch, "error": why, "oom": is_oom(why)}
    started = [e for e in events if e.get("ev") == "started"][0]
    steady = [m["tokens_per_s"] for m in metrics if m["step"] > 2] or [metrics[-1]["tokens_per_s"]]
    tps = statistics.median(steady)
    flops_tok = flops_per_token(s, started["params"], T)
    used = [m["device_used_bytes"] for m in metrics if "device_used_bytes" in m]
    return {"batch": batch, "T": T, "params": started["params"],
            "matmul_params": matmul_params(s, started["params"]), "backend": started["backend"],
            "gpu": started.get("gpu"), "tokens_per_s": tps, "flops_per_token": flops_tok,
            "flops_formula": FLOPS_FORMULA, "mfu": tps * flops_tok / PEAK_FLOPS,
            "peak_device_bytes": max(m["mem_bytes"] for m in metrics),
            "device_used_bytes": max(used) if used else None, "losses": [m["loss"] for m in metrics],
            "wall_s": round(time.monotonic() - t0, 1)}


def sweep(engine, tmp, name, s, env, t_end, run=None):
    """The shape's batches from the largest down: (result or None, tried).
    Only an out-of-memory run moves on to the next batch."""
    run = run or run_one
    tried = []
    for b in s["batches"]:
        left = t_end - time.monotonic()
        if left < 10:
            tried.append({"batch": b, "error": "time budget spent", "oom": False})
            break
        r = run(engine, tmp, name, s, b, env, left)
        if "error" not in r:
            return r, tried
        tried.append(r)
        if not r.get("oom"):
            break
    return None, tried


def read_profile(path):
    """cuda_profile.cu's table: ({span, launches, gaps} in ms, [(ms, calls, name)])."""
    with open(path) as f:
        head = f.readline()
        m = re.match(r"# span ([\d.]+) ms, launches ([\d.]+) ms, gaps ([\d.]+) ms", head)
        if not m:
            raise ValueError(f"{path}: not a profile table: {head.strip()}")
        f.readline()
        rows = []
        for line in f:
            ms, calls, _, _, rname = line.rstrip("\n").split("\t", 4)
            if rname != "(gaps)":
                rows.append((float(ms), int(calls), rname))
    return dict(zip(("span", "launches", "gaps"), map(float, m.groups()))), rows


def profile_shape(engine, tmp, name, s, batch, env, left, out_dir):
    """One profiled run at batch: the summary dict, or {"error": ...}."""
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    for old in os.listdir(d):
        os.remove(os.path.join(d, old))
    r = run_one(engine, tmp, name + "-profile", s, batch, dict(env, TY_CUDA_PROFILE=d), left,
                steps=PROFILE_STEPS)
    if "error" in r:
        return {"error": r["error"]}
    tables = [os.path.join(d, f) for f in os.listdir(d) if f.startswith("cuda-profile.")]
    if len(tables) != 1:
        return {"error": f"{len(tables)} profile tables in {d} (one expected)"}
    totals, rows = read_profile(tables[0])
    per = {k: v / PROFILE_STEPS for k, v in totals.items()}
    top = [{"name": n, "ms_per_step": ms / PROFILE_STEPS, "calls_per_step": c / PROFILE_STEPS,
            "share": ms / totals["span"] if totals["span"] else 0.0} for ms, c, n in rows[:PROFILE_TOP]]
    return {"steps": PROFILE_STEPS, "batch": batch, "table": os.path.basename(tables[0]),
            "span_ms_per_step": per["span"], "launches_ms_per_step": per["launches"],
            "gaps_ms_per_step": per["gaps"], "top": top}


def profile_line(name, p):
    if "error" in p:
        return f"PROFILE {name}: no profile: {p['error']}"
    top = ", ".join(f"{t['name']} {t['ms_per_step']:.1f} ms ({100 * t['share']:.0f}%)" for t in p["top"])
    return (f"PROFILE {name}: batch {p['batch']}, a step ({p['steps']} profiled, first included): GPU span "
            f"{p['span_ms_per_step']:.1f} ms, in launches {p['launches_ms_per_step']:.1f} ms, idle between "
            f"them {p['gaps_ms_per_step']:.1f} ms; largest: {top}")


def describe_failure(tried):
    """Why no batch ran, naming the error that stopped the sweep."""
    if not tried:
        return "nothing tried"
    last = tried[-1]
    ooms = [t["batch"] for t in tried if t.get("oom")]
    head = f"out of memory at batch {', '.join(map(str, ooms))}; " if ooms else ""
    if last.get("oom"):
        return f"{head}every batch ran out of memory (last: {last['error']})"
    return f"{head}stopped at batch {last['batch']} by an error that is not out of memory: {last['error']}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("--shapes", default="gpt2-124M,llama-1B")
    ap.add_argument("--budget", type=float, default=300, help="seconds for all shapes")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--profile", metavar="DIR", help="one profiled run per measured shape, tables here")
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
            r, tried = sweep(a.engine, tmp, name, s, env, t_end)
            if r and a.profile:
                left = t_end - time.monotonic()
                if left > 1.2 * r["wall_s"] + 10:
                    r["profile"] = profile_shape(a.engine, tmp, name, s, r["batch"], env, left, a.profile)
                else:
                    r["profile"] = {"error": f"{left:.0f} s of the budget left, the run took {r['wall_s']} s"}
            if r:
                r["refused"] = tried
                results[name] = r
                used = r["device_used_bytes"]
                print(f"{name}: batch {r['batch']} x T {r['T']} bf16 on {r['backend']}: "
                      f"{r['tokens_per_s']:.0f} tokens/s, MFU {100 * r['mfu']:.1f}% of 989 TFLOP/s "
                      f"({r['flops_per_token'] / 1e9:.3f} GFLOP/token = {FLOPS_FORMULA}; N_matmul "
                      f"{r['matmul_params']} of {r['params']}), peak memory: engine "
                      f"{r['peak_device_bytes'] / 2**20:.0f} MiB, device "
                      f"{'?' if used is None else f'{used / 2**20:.0f} MiB'}"
                      + (f"; out of memory at batch {', '.join(str(t['batch']) for t in tried)}" if tried else ""))
                if "profile" in r:
                    print(profile_line(name, r["profile"]))
            else:
                why = describe_failure(tried)
                results[name] = {"error": why, "tried": tried}
                print(f"{name}: no batch ran: {why}")
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
