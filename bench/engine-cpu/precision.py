# precision.py — fp32 against bf16 storage in one run, side by side
# training tokens/s and peak RSS of trainyard-engine on the
# GPT-2 124M shape and a Llama-1B-wide model at seq 1024 and 4096, then the
# attention memory curve against T.
#
# Each configuration is its own engine process on random weights and
# tokens, batch 1, `--steps` optimizer steps (default 2: the first warms up,
# the rest are timed by the arrival of their metric events); peak RSS is the
# child's ru_maxrss. The Llama is TinyLlama's width (hidden 2048, MLP 5632,
# 32 heads, 4 kv heads, vocab 32000) with --llama-layers of its 22 layers
# (default 2, so fp32 fits the 23 GiB build machine next to other jobs);
# per-layer costs scale with the layer count, embeddings and head do not.
# The attention curve trains one step of a 1-layer GPT-2 (C = 64, 4 heads)
# at T = 512 .. 8192 and reports the activation bytes the engine allocated
# (its start-up log) next to what the previous kernel's [B, H, T, T]
# probabilities alone needed.
#
# The batch sweep (--batches, default 1,2,4,8) trains GPT-2 124M at seq 1024
# one step per batch size in each precision and prints the bf16/fp32 peak
# RSS ratio per batch: the parameter side (16 bytes a parameter in both)
# is constant while activations grow with the rows, so the ratio falls
# with the batch. A batch whose fp32 peak would pass --max-rss-gib
# (estimated from batch 1: its peak plus an activation arena per extra
# row of the batch) is skipped and said so.
#
# Usage: precision.py ENGINE [--threads N] [--steps N] [--llama-layers N]
#                    [--batches 1,2,4,8] [--max-rss-gib 14]
#                    [--only gpt2|llama|sweep|attention]
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "engine_ref"))


def run_engine(engine, spec, tmp, tag, threads):
    import hfgen
    spath = os.path.join(tmp, tag + ".spec.json")
    hfgen.write_json(spath, spec)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = ["/bin/bash", "-c", 'exec "$0" "$@" 3>&1 1>&2', engine, "--spec", spath, "--workdir",
           os.path.join(tmp, tag + ".work"), "--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    times, started = [], None
    for line in proc.stdout:
        if line.startswith("{"):
            ev = json.loads(line)
            if ev.get("ev") == "metric":
                times.append(time.perf_counter())
            elif ev.get("ev") == "started":
                started = time.perf_counter()
    err = proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        sys.stderr.write(err[-3000:])
        raise SystemExit(f"{tag}: engine exit {rc}")
    m = re.search(r"activations: (\d+) bytes", err)
    mem = re.search(r"memory: ([^\n]*)", err)
    steps = [b - a for a, b in zip(times, times[1:])]
    if not steps and times and started:  # one step: from `started` to its metric (includes warm-up)
        steps = [times[0] - started]
    return {"step_s": min(steps) if steps else None, "rss": ru.ru_maxrss * 1024,
            "acts": int(m.group(1)) if m else None, "memory": mem.group(1) if mem else None}


def write_data(path, n, seq, vocab, g):
    import torch
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"input_ids": torch.randint(0, vocab, (seq + 1,), generator=g).tolist()}) + "\n")


def model_init(kind, layers, seq):
    if kind == "gpt2":
        return {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": max(seq, 1024),
                "vocab_size": 50257}
    return {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": layers,
            "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
            "max_position_embeddings": max(seq, 2048), "tie_word_embeddings": False}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--llama-layers", type=int, default=2)
    ap.add_argument("--seqs", default="1024,4096")
    ap.add_argument("--long-steps", type=int, default=1,
                    help="steps for seq > 1024 (1: timed from the started event, warm-up included)")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--max-rss-gib", type=float, default=14.0)
    ap.add_argument("--only", choices=["gpt2", "llama", "sweep", "attention"])
    a = ap.parse_args()
    import torch
    g = torch.Generator().manual_seed(1)
    print(f"threads {a.threads}, {a.steps} steps per run (first is warm-up), batch 1 "
          f"(the sweep: one step per batch size)", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_precision_") as tmp:
        for kind in ("gpt2", "llama"):
            if a.only and a.only != kind:
                continue
            for seq in [int(s) for s in a.seqs.split(",")]:
                vocab = 50257 if kind == "gpt2" else 32000
                data = os.path.join(tmp, f"{kind}-{seq}.jsonl")
                nsteps = a.steps if seq <= 1024 else a.long_steps
                write_data(data, nsteps + 1, seq, vocab, g)
                res = {}
                for prec in ("fp32", "bf16"):
                    spec = {"model": {"init": model_init(kind, a.llama_layers, seq)},
                            "dataset": {"train": data, "format": "tokens"},
                            "hyperparameters": {"max_steps": nsteps, "batch_size": 1, "seq_len": seq,
                                                "lr": 1e-4, "log_every_steps": 1},
                            "precision": prec, "export": {"dtype": "bf16"}}
                    res[prec] = run_engine(a.engine, spec, tmp, f"{kind}-{seq}-{prec}", a.threads)
                    r = res[prec]
                    print(json.dumps({"model": kind, "seq": seq, "precision": prec, "step_s": r["step_s"],
                                      "tokens_per_s": seq / r["step_s"], "peak_rss_mib": r["rss"] >> 20,
                                      "activation_mib": (r["acts"] or 0) >> 20, "memory": r["memory"]}), flush=True)
                rows.append((kind, seq, res))
        sweep = []
        if not a.only or a.only == "sweep":
            seq, rss1, acts1 = 1024, None, None
            for b in [int(x) for x in a.batches.split(",")]:
                if rss1 and acts1 and rss1 + (b - 1) * acts1 > a.max_rss_gib * 2**30:
                    est = (rss1 + (b - 1) * acts1) / 2**30
                    print(f"sweep: batch {b} skipped: fp32 peak ~{est:.1f} GiB > {a.max_rss_gib} GiB", flush=True)
                    sweep.append((b, None))
                    continue
                data = os.path.join(tmp, f"sweep-{b}.jsonl")
                write_data(data, b + 1, seq, 50257, g)
                res = {}
                for prec in ("fp32", "bf16"):
                    spec = {"model": {"init": model_init("gpt2", 0, seq)},
                            "dataset": {"train": data, "format": "tokens"},
                            "hyperparameters": {"max_steps": 1, "batch_size": b, "seq_len": seq,
                                                "lr": 1e-4, "log_every_steps": 1},
                            "precision": prec, "export": {"dtype": "bf16"}}
                    r = res[prec] = run_engine(a.engine, spec, tmp, f"sweep-{b}-{prec}", a.threads)
                    print(json.dumps({"sweep_batch": b, "precision": prec, "step_s": r["step_s"],
                                      "tokens_per_s": b * seq / r["step_s"], "peak_rss_mib": r["rss"] >> 20,
                                      "activation_mib": (r["acts"] or 0) >> 20, "memory": r["memory"]}), flush=True)
                if b == 1:
                    rss1, acts1 = res["fp32"]["rss"], res["fp32"]["acts"]
                sweep.append((b, res))
        curve = []
        if not a.only or a.only == "attention":
            for T in (512, 1024, 2048, 4096, 8192):
                data = os.path.join(tmp, f"att-{T}.jsonl")
                write_data(data, 2, T, 256, g)
                spec = {"model": {"init": {"model_type": "gpt2", "n_embd": 64, "n_layer": 1, "n_head": 4,
                                           "n_positions": T, "vocab_size": 256}},
                        "dataset": {"train": data, "format": "tokens"},
                        "hyperparameters": {"max_steps": 1, "batch_size": 1, "seq_len": T, "lr": 1e-4}}
                r = run_engine(a.engine, spec, tmp, f"att-{T}", a.threads)
                curve.append((T, r["acts"], r["rss"], 1 * 4 * T * T * 4))
    if rows:
        print()
        print(f"{'model':<22} {'seq':>5} {'fp32 tok/s':>10} {'bf16 tok/s':>10} {'ratio':>6} "
              f"{'fp32 RSS':>9} {'bf16 RSS':>9} {'ratio':>6} {'fp32 acts':>9} {'bf16 acts':>9}")
        for kind, seq, res in rows:
            f, b = res["fp32"], res["bf16"]
            name = "gpt2-124M" if kind == "gpt2" else f"llama-1B-wide x{a.llama_layers}L"
            print(f"{name:<22} {seq:>5} {seq / f['step_s']:>10.1f} {seq / b['step_s']:>10.1f} "
                  f"{f['step_s'] / b['step_s']:>5.2f}x {f['rss'] >> 20:>6}MiB {b['rss'] >> 20:>6}MiB "
                  f"{b['rss'] / f['rss']:>5.2f}x {f['acts'] >> 20:>6}MiB {b['acts'] >> 20:>6}MiB")
    if sweep:
        print()
        print("GPT-2 124M, seq 1024, one step each (tokens/s from `started`: warm-up included)")
        print(f"{'batch':>5} {'fp32 tok/s':>10} {'bf16 tok/s':>10} {'ratio':>6} {'fp32 RSS':>9} {'bf16 RSS':>9} "
              f"{'ratio':>6} {'fp32 acts':>9} {'bf16 acts':>9}")
        for b, res in sweep:
            if res is None:
                print(f"{b:>5} skipped (fp32 over --max-rss-gib)")
                continue
            f, h = res["fp32"], res["bf16"]
            print(f"{b:>5} {b * 1024 / f['step_s']:>10.1f} {b * 1024 / h['step_s']:>10.1f} "
                  f"{f['step_s'] / h['step_s']:>5.2f}x {f['rss'] >> 20:>6}MiB {h['rss'] >> 20:>6}MiB "
                  f"{h['rss'] / f['rss']:>5.2f}x {f['acts'] >> 20:>6}MiB {h['acts'] >> 20:>6}MiB")
    if curve:
        print()
        print(f"{'T':>6} {'activations':>12} {'per token':>10} {'peak RSS':>9} {'old att (1 layer)':>18}")
        for T, acts, rss, old in curve:
            print(f"{T:>6} {acts / 2**20:>9.2f}MiB {acts / T:>8.0f} B {rss >> 20:>6}MiB {old / 2**20:>15.1f}MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
