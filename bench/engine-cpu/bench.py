# bench.py — trainyard-engine (CPU) against what a user would run instead:
# transformers' GPT2LMHeadModel trained by PyTorch (torch 2.13 from the test
# venv), side by side in one run, on the same number of threads, the same
# weights and the same tokens.
#
# Two shapes: GPT-2 4 layers x 256 wide, seq 256, batch 8, vocab 50257 (training
# tokens/s; the goal is >= 1.5x PyTorch) and the GPT-2 124M shape (12 x 768,
# seq 1024, batch 1: step time and peak RSS). Each side runs in its own child
# process; step times come from the arrival of the engine's metric events and
# from the torch loop's own clock, skipping the first (warm-up) step; peak RSS
# is the child's ru_maxrss from wait4. `--busy N` keeps N extra processes
# spinning for the whole run (a loaded machine); every row reports the median
# step and the spread p90/p50 of each side, so a quiet and a loaded run can
# be set side by side; `--growth N` runs each side quiet and then with N
# spinning, in one run, and prints how much each median step grows. Run it
# with the venv's python (run.sh finds it):
#   bench.py ENGINE [--threads N] [--only SHAPE] [--steps N] [--busy N] [--growth N]
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "engine_ref"))

SHAPES = {
    "gpt2-4x256": {"n_layer": 4, "n_embd": 256, "n_head": 4, "seq": 256, "batch": 8, "steps": 6},
    "gpt2-124M": {"n_layer": 12, "n_embd": 768, "n_head": 12, "seq": 1024, "batch": 1, "steps": 4},
}
VOCAB = 50257


def read_batches(data, B, T):
    """The dataset the engine trains on, cut into the engine's batches: B rows
    of T + 1 tokens each (inputs are [:-1], targets [1:])."""
    rows = [json.loads(line)["input_ids"] for line in open(data)]
    return [rows[i:i + B] for i in range(0, len(rows) - B + 1, B)]


def torch_child(args):
    """The PyTorch side, as a user writes it: transformers' GPT2LMHeadModel
    loaded from the same safetensors (dropout off, as in the engine), the
    usual fp32 loop (forward, cross-entropy, backward, clip 1.0, AdamW with
    decay 0.1 on matrices only). One JSON line per step."""
    import torch
    from transformers import GPT2LMHeadModel
    torch.set_num_threads(args.threads)
    model = GPT2LMHeadModel.from_pretrained(args.model_dir, dtype=torch.float32, resid_pdrop=0.0,
                                            embd_pdrop=0.0, attn_pdrop=0.0)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-4)
    for step, rows in enumerate(read_batches(args.data, args.batch, args.seq)[:args.steps], 1):
        ids = torch.tensor(rows)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
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


def write_inputs(shape, steps, tmp):
    """The random model directory and the tokens dataset both sides read."""
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
        for _ in range(s["batch"] * (steps + 1)):
            ids = torch.randint(0, VOCAB, (s["seq"] + 1,), generator=g).tolist()
            f.write(json.dumps({"input_ids": ids}) + "\n")
    return mdir, data


def engine_side(engine, shape, steps, threads, tmp, mdir, data, precision=None):
    import hfgen
    s = SHAPES[shape]
    spec = hfgen.job_spec(mdir, data, steps, s["batch"], s["seq"], grad_accum=1, lr=1e-4,
                          schedule="constant", warmup_steps=0, name="bench-" + shape)
    if precision:
        spec["precision"] = precision
    spath = os.path.join(tmp, shape + ".spec.json")
    hfgen.write_json(spath, spec)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = ["/bin/bash", "-c", 'exec "$0" "$@" 3>&1 1>&2', engine, "--spec", spath,
           "--workdir", os.path.join(tmp, shape + ".work")]
    events, rc, rss = run_child(cmd, env)
    if rc != 0:
        raise SystemExit(f"engine failed on {shape} (exit {rc})")
    metrics = [(t, e) for t, e in events if e.get("ev") == "metric"]
    times = [t for t, _ in metrics]
    # Steady state: the gap between consecutive metric events, after step 1.
    return [b - a for a, b in zip(times, times[1:])], rss, metrics[0][1].get("loss")


def torch_side(shape, steps, threads, mdir, data):
    s = SHAPES[shape]
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-child", "--model-dir", mdir,
           "--data", data, "--batch", str(s["batch"]), "--seq", str(s["seq"]),
           "--steps", str(steps), "--threads", str(threads)]
    events, rc, rss = run_child(cmd)
    if rc != 0:
        raise SystemExit(f"torch failed on {shape} (exit {rc})")
    return [e["step_s"] for _, e in events][1:], rss, events[0][1]["loss"]


def spread(xs):
    """p90 / p50 of the step times (nearest rank): 1.0 is perfectly steady."""
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]
    return round(p90 / statistics.median(xs), 2)


def start_busy(n):
    """n processes spinning on the CPU: the load a second job puts on the box."""
    code = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def measure(args, shape, tmp):
    s = SHAPES[shape]
    steps = args.steps or s["steps"]
    tok = s["batch"] * s["seq"]
    mdir, data = write_inputs(shape, steps, tmp)
    e_steps, e_rss, e_loss = engine_side(args.engine, shape, steps, args.threads, tmp, mdir, data)
    t_steps, t_rss, t_loss = torch_side(shape, steps, args.threads, mdir, data)
    e_med, t_med = statistics.median(e_steps), statistics.median(t_steps)
    return {"shape": shape, "tokens_per_step": tok, "busy": args.busy,
            "load_avg_after": round(os.getloadavg()[0], 2),
            # Same weights and examples (the engine shuffles their order):
            # both first losses sit near ln(50257) = 10.82 for the same model.
            "engine_loss_1": e_loss, "torch_loss_1": round(t_loss, 4),
            "engine_step_s": round(e_med, 3), "torch_step_s": round(t_med, 3),
            "engine_spread": spread(e_steps), "torch_spread": spread(t_steps),
            "engine_tokens_per_s": round(tok / e_med, 1),
            "torch_tokens_per_s": round(tok / t_med, 1),
            "speedup": round(t_med / e_med, 2),
            "engine_peak_rss_mib": round(e_rss / 2**20), "torch_peak_rss_mib": round(t_rss / 2**20),
            "rss_ratio_engine_over_torch": round(e_rss / t_rss, 2)}


def measure_growth(args, shape, tmp):
    """Each side quiet and then with args.growth processes spinning, in this
    one run: how much a second job on the machine slows each median step."""
    s = SHAPES[shape]
    steps = args.steps or s["steps"]
    mdir, data = write_inputs(shape, steps, tmp)
    out = {"shape": shape, "busy": args.growth}
    for load in (0, args.growth):
        busy = start_busy(load)
        try:
            e_steps, _, _ = engine_side(args.engine, shape, steps, args.threads, tmp, mdir, data)
            t_steps, _, _ = torch_side(shape, steps, args.threads, mdir, data)
        finally:
            for p in busy:
                p.kill()
                p.wait()
        tag = "loaded" if load else "quiet"
        out[f"engine_{tag}_s"] = round(statistics.median(e_steps), 3)
        out[f"torch_{tag}_s"] = round(statistics.median(t_steps), 3)
        out[f"engine_{tag}_spread"] = spread(e_steps)
        out[f"torch_{tag}_spread"] = spread(t_steps)
    out["engine_growth"] = round(out["engine_loaded_s"] / out["engine_quiet_s"], 2)
    out["torch_growth"] = round(out["torch_loaded_s"] / out["torch_quiet_s"], 2)
    return out


def print_table(rows):
    print()
    print(f"{'shape':<12} {'busy':>4} {'engine tok/s':>12} {'torch tok/s':>12} {'speedup':>8} "
          f"{'engine step':>11} {'torch step':>10} {'p90/p50 e':>9} {'p90/p50 t':>9} "
          f"{'engine RSS':>10} {'torch RSS':>10}")
    for r in rows:
        print(f"{r['shape']:<12} {r['busy']:>4} {r['engine_tokens_per_s']:>12.1f} "
              f"{r['torch_tokens_per_s']:>12.1f} {r['speedup']:>7.2f}x {r['engine_step_s']:>10.3f}s "
              f"{r['torch_step_s']:>9.3f}s {r['engine_spread']:>9.2f} {r['torch_spread']:>9.2f} "
              f"{r['engine_peak_rss_mib']:>7d}MiB {r['torch_peak_rss_mib']:>7d}MiB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine", nargs="?")
    ap.add_argument("--torch-child", action="store_true")
    ap.add_argument("--model-dir")
    ap.add_argument("--data")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--steps", type=int, default=0, help="timed steps + 1 (default per shape)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--only", choices=sorted(SHAPES))
    ap.add_argument("--busy", type=int, default=0, help="extra spinning processes during the run")
    ap.add_argument("--growth", type=int, default=0,
                    help="each side quiet, then with N spinning processes: step-time growth")
    args = ap.parse_args()
    if args.torch_child:
        torch_child(args)
        return 0
    if not args.engine:
        ap.error("ENGINE is required")
    import torch
    import transformers
    print(f"threads {args.threads}; busy {args.busy}; torch {torch.__version__}; "
          f"transformers {transformers.__version__}; engine {args.engine}; "
          f"load {os.getloadavg()[0]:.2f}")
    if args.growth:
        with tempfile.TemporaryDirectory(prefix="bench_engine_cpu_") as tmp:
            for shape in ([args.only] if args.only else list(SHAPES)):
                g = measure_growth(args, shape, tmp)
                print(json.dumps(g), flush=True)
                ok = g["engine_growth"] <= g["torch_growth"]
                print(f"{shape}: median step grows {g['engine_growth']}x (engine) vs "
                      f"{g['torch_growth']}x (torch) with {args.growth} busy: goal "
                      f"{'met' if ok else 'NOT met'}", flush=True)
        return 0
    busy = start_busy(args.busy)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench_engine_cpu_") as tmp:
            for shape in ([args.only] if args.only else list(SHAPES)):
                rows.append(measure(args, shape, tmp))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print_table(rows)
    goal = rows[0]["speedup"] >= 1.5 if rows and rows[0]["shape"] == "gpt2-4x256" else None
    if goal is not None:
        print(f"goal: engine >= 1.5x PyTorch tokens/s on gpt2-4x256: {'met' if goal else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
