#!/usr/bin/python3
"""bench/engine-dp — data-parallel CPU scaling of trainyard-engine, side by side.

One GPT-2 shape and one global batch, trained the same number of steps:

  w1 x T       one rank with all T threads (what a job gets without cpu_ranks)
  w1 x T/2     one rank with T/2 threads (the per-rank baseline)
  w2 x T/2     two ranks under mpirun, T/2 threads each (resources.cpu_ranks 2),
               one blocking all-reduce after the backward (bucket_kb 0)
  w2 x T/2 ov  the same with the all-reduce in buckets overlapped with the
               backward (bucket_kb, the engine's default unless --bucket-kb)

and prints tokens/s, the ratio w2 / w1 (same cores), the scaling efficiency
w2 / (2 x w1 at T/2 threads), and the share of the step time rank 0 spent
inside the gradient all-reduce calls (the engine logs it at the end of a
world > 1 run): the whole all-reduce without overlap, only the exposed
part (starting and testing buckets, the final wait) with it. The losses
of the runs must agree (1e-6 relative; the two world 2 runs bit for bit).

Usage: bench.py ENGINE [--steps N] [--layers L] [--dim D] [--seq T] [--batch B] [--bucket-kb K]
"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("engine")
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--dim", type=int, default=256)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--batch", type=int, default=4, help="rows per micro-batch; grad_accum 2, so 2x this per step")
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--bucket-kb", type=int, default=None, help="resources.bucket_kb of the overlapped run")
args = ap.parse_args()

tmp = tempfile.mkdtemp(prefix="ty-bench-dp-")
env = dict(os.environ)
if os.geteuid() == 0:
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
rng = random.Random(1)
vocab = 1024
with open(os.path.join(tmp, "train.jsonl"), "w") as f:
    for _ in range(256):
        f.write(json.dumps({"input_ids": [rng.randrange(vocab) for _ in range(args.seq)]}) + "\n")
spec = {"model": {"init": {"model_type": "gpt2", "vocab_size": vocab, "n_embd": args.dim, "n_layer": args.layers,
                           "n_head": max(1, args.dim // 64), "n_positions": args.seq}},
        "dataset": {"train": os.path.join(tmp, "train.jsonl")},
        "hyperparameters": {"max_steps": args.steps, "batch_size": args.batch, "grad_accum": 2,
                            "seq_len": args.seq, "lr": 1e-4, "log_every_steps": 1}}
with open(os.path.join(tmp, "spec.json"), "w") as f:
    json.dump(spec, f)
spec["resources"] = {"bucket_kb": 0}
with open(os.path.join(tmp, "spec-b0.json"), "w") as f:
    json.dump(spec, f)
if args.bucket_kb is not None:
    spec["resources"] = {"bucket_kb": args.bucket_kb}
    with open(os.path.join(tmp, "spec.json"), "w") as f:
        json.dump(spec, f)


def run(world, threads, name, spec_file="spec.json"):
    cmd = [args.engine, "--spec", os.path.join(tmp, spec_file), "--workdir", os.path.join(tmp, name),
           "--threads", str(threads)]
    if world > 1:
        cmd = ["mpirun", "-np", str(world), "--oversubscribe", "--bind-to", "none"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, OMP_NUM_THREADS=str(threads)))
    if p.returncode != 0:
        sys.exit(f"{name}: exit {p.returncode}\n{p.stderr[-2000:]}")
    ev = [json.loads(l) for l in p.stdout.splitlines()]
    m = [e for e in ev if e["ev"] == "metric"]
    # Steady state: the first step (allocation, first touch) is left out.
    tps = sum(x["tokens_per_s"] for x in m[1:]) / max(1, len(m) - 1)
    share = None
    g = re.search(r"all-reduce ([0-9.]+) s of ([0-9.]+) s in steps \(([0-9.]+)%\)", p.stderr)
    if g:
        share = float(g.group(3))
    nb = re.search(r"data parallel: ([0-9]+) gradient buckets? of up to ([0-9]+) KiB", p.stderr)
    return tps, {x["step"]: x["loss"] for x in m}, share, (nb.group(1), nb.group(2)) if nb else None


half = max(1, args.threads // 2)
try:
    w1, l1, _, _ = run(1, args.threads, "w1full")
    w1h, l1h, _, _ = run(1, half, "w1half")
    w2, l2, share, _ = run(2, half, "w2", "spec-b0.json")
    w2o, l2o, share_o, nb = run(2, half, "w2o")
    for s in l1:
        for other in (l1h, l2, l2o):
            if abs(other[s] - l1[s]) > 1e-6 * abs(l1[s]):
                sys.exit(f"losses differ at step {s}: {l1[s]} vs {other[s]}")
    if l2 != l2o:
        sys.exit(f"world 2: the overlapped run's losses differ from the blocking one's: {l2o} vs {l2}")
    tok = 2 * args.batch * args.seq
    print(f"engine-dp: GPT-2 {args.layers}x{args.dim}, seq {args.seq}, global batch {2 * args.batch} rows "
          f"({tok} tokens/step), {args.steps} steps, {args.threads} cores")
    print(f"  world 1 x {args.threads} threads : {w1:10.1f} tokens/s")
    print(f"  world 1 x {half} threads : {w1h:10.1f} tokens/s")
    print(f"  world 2 x {half} threads : {w2:10.1f} tokens/s  (blocking all-reduce {share:.1f}% of rank 0's "
          "step time)")
    print(f"  world 2 x {half} overlap : {w2o:10.1f} tokens/s  (exposed all-reduce {share_o:.1f}% of rank 0's "
          f"step time; {nb[0]} buckets of up to {nb[1]} KiB)")
    print(f"  ratio world 2 / world 1 on the same cores: {w2 / w1:.2f}x blocking, {w2o / w1:.2f}x overlapped")
    print(f"  scaling efficiency world 2 / (2 x world 1 at {half} threads): {w2 / (2 * w1h) * 100:.0f}% blocking, "
          f"{w2o / (2 * w1h) * 100:.0f}% overlapped")
    print("  losses: identical to 1e-6 relative across the four runs, bit for bit between the two world 2 runs")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
