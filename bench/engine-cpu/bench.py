# bench.py — trainyard-engine (CPU) against the same training loop in PyTorch,
# side by side in one run, on the same number of threads.
#
# Two shapes: GPT-2 4 layers x 256 wide, seq 256, batch 8, vocab 50257 (training
# tokens/s; the goal is >= 1.5x PyTorch) and the GPT-2 124M shape (12 x 768,
# seq 1024, batch 1: step time and peak RSS). Each side runs in its own child
# process; step times come from the arrival of the engine's metric events and
# from the torch loop's own clock, skipping the first (warm-up) step; peak RSS
# is the child's ru_maxrss from wait4. Usage: bench.py ENGINE [--quick]
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "engine_ref"))

SHAPES = {
    "gpt2-4x256": {"n_layer": 4, "n_embd": 256, "n_head": 4, "seq": 256, "batch": 8, "steps": 4},
    "gpt2-124M": {"n_layer": 12, "n_embd": 768, "n_head": 12, "seq": 1024, "batch": 1, "steps": 3},
}
VOCAB = 50257


def torch_child(args):
    """The PyTorch side: the usual fp32 loop (forward, CE, backward, clip,
    AdamW) on random weights and tokens; prints one JSON line per step."""
    import torch
    import hfgen
    import torchref
    torch.set_num_threads(args.threads)
    s = SHAPES[args.shape]
    cfg = hfgen.gpt2_config(n_embd=s["n_embd"], n_layer=s["n_layer"], n_head=s["n_head"],
                            n_positions=1024, vocab_size=VOCAB)
    g = torch.Generator().manual_seed(1)
    p = {k: v.requires_grad_(True) for k, v in hfgen.gpt2_tensors(cfg, g, std=0.02).items()}
    decay = [t for t in p.values() if t.dim() >= 2]
    no_decay = [t for t in p.values() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-4)
    B, T = s["batch"], s["seq"]
    for step in range(1, s["steps"] + 1):
        ids = torch.randint(0, VOCAB, (B, T + 1), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = torchref.gpt2_forward(cfg, p, ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        print(json.dumps({"step": step, "loss": float(loss), "step_s": dt}), flush=True)


def run_child(cmd, env=None):
    """Runs cmd, collecting (arrival time, JSON event) per stdout line;
    returns (events, exit code, peak RSS bytes)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    events = []
    for line in proc.stdout:
        line = line.strip()
        if line.startswith("{"):
            events.append((time.perf_counter(), json.loads(line)))
    err = proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.stderr.write(err[-3000:])
    return events, proc.returncode, ru.ru_maxrss * 1024


def engine_side(engine, shape, threads, tmp):
    import torch
    import hfgen
    s = SHAPES[shape]
    cfg = hfgen.gpt2_config(n_embd=s["n_embd"], n_layer=s["n_layer"], n_head=s["n_head"],
                            n_positions=1024, vocab_size=VOCAB)
    g = torch.Generator().manual_seed(1)
    mdir = os.path.join(tmp, shape)
    hfgen.write_model(mdir, cfg, hfgen.gpt2_tensors(cfg, g, std=0.02))
    data = os.path.join(tmp, shape + ".jsonl")
    with open(data, "w") as f:
        for _ in range(s["batch"] * (s["steps"] + 1)):
            ids = torch.randint(0, VOCAB, (s["seq"] + 1,), generator=g).tolist()
            f.write(json.dumps({"input_ids": ids}) + "\n")
    spec = hfgen.job_spec(mdir, data, s["steps"], s["batch"], s["seq"], grad_accum=1, lr=1e-4,
                          schedule="constant", warmup_steps=0, name="bench-" + shape)
    spath = os.path.join(tmp, shape + ".spec.json")
    hfgen.write_json(spath, spec)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = ["/bin/bash", "-c", 'exec "$0" "$@" 3>&1 1>&2', engine, "--spec", spath,
           "--workdir", os.path.join(tmp, shape + ".work")]
    events, rc, rss = run_child(cmd, env)
    if rc != 0:
        raise SystemExit(f"engine failed on {shape} (exit {rc})")
    times = [t for t, e in events if e.get("ev") == "metric"]
    # Steady state: the gap between consecutive metric events, after step 1.
    steps = [b - a for a, b in zip(times, times[1:])]
    reported = [e.get("tokens_per_s") for _, e in events if e.get("ev") == "metric"]
    return steps, rss, reported


def torch_side(shape, threads):
    cmd = ["/usr/bin/python3", os.path.abspath(__file__), "--torch-child", "--shape", shape,
           "--threads", str(threads)]
    events, rc, rss = run_child(cmd)
    if rc != 0:
        raise SystemExit(f"torch failed on {shape} (exit {rc})")
    return [e["step_s"] for _, e in events][1:], rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine", nargs="?")
    ap.add_argument("--torch-child", action="store_true")
    ap.add_argument("--shape", default="gpt2-4x256")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--only", choices=sorted(SHAPES))
    args = ap.parse_args()
    if args.torch_child:
        torch_child(args)
        return 0
    import torch
    print(f"threads {args.threads}; torch {torch.__version__}; engine {args.engine}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_engine_cpu_") as tmp:
        for shape in ([args.only] if args.only else list(SHAPES)):
            s = SHAPES[shape]
            tok = s["batch"] * s["seq"]
            e_steps, e_rss, rep = engine_side(args.engine, shape, args.threads, tmp)
            t_steps, t_rss = torch_side(shape, args.threads)
            e_med, t_med = statistics.median(e_steps), statistics.median(t_steps)
            row = {"shape": shape, "tokens_per_step": tok,
                   "engine_step_s": round(e_med, 3), "torch_step_s": round(t_med, 3),
                   "engine_tokens_per_s": round(tok / e_med, 1),
                   "torch_tokens_per_s": round(tok / t_med, 1),
                   "speedup": round(t_med / e_med, 2),
                   "engine_peak_rss_mib": round(e_rss / 2**20), "torch_peak_rss_mib": round(t_rss / 2**20),
                   "rss_ratio_engine_over_torch": round(e_rss / t_rss, 2),
                   "engine_reported_tokens_per_s": rep[-1] if rep else None}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(f"{'shape':<12} {'engine tok/s':>12} {'torch tok/s':>12} {'speedup':>8} "
          f"{'engine step':>11} {'torch step':>10} {'engine RSS':>10} {'torch RSS':>10} {'RSS ratio':>9}")
    for r in rows:
        print(f"{r['shape']:<12} {r['engine_tokens_per_s']:>12.1f} {r['torch_tokens_per_s']:>12.1f} "
              f"{r['speedup']:>7.2f}x {r['engine_step_s']:>10.3f}s {r['torch_step_s']:>9.3f}s "
              f"{r['engine_peak_rss_mib']:>7d}MiB {r['torch_peak_rss_mib']:>7d}MiB "
              f"{r['rss_ratio_engine_over_torch']:>8.2f}x")
    goal = rows[0]["speedup"] >= 1.5 if rows and rows[0]["shape"] == "gpt2-4x256" else None
    if goal is not None:
        print(f"goal: engine >= 1.5x PyTorch tokens/s on gpt2-4x256: {'met' if goal else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
