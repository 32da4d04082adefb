# ab.py — two engine builds (or one build under two environments) side by side
# in one run, on GPT-2 124M (fp32, or --precision bf16 / fp16) at two shapes: batch 4 x seq 64 (GEMMs of
# small M, where library overheads show) and batch 1 x seq 1024.
#
# A side is ENGINE or ENGINE:VAR=VALUE[,VAR=VALUE...], e.g.
#   ab.py build/bin/trainyard-engine:TY_CPU_SGEMM=openblas \
#         build/bin/trainyard-engine:TY_CPU_SGEMM=onednn
# compares the two fp32 GEMM libraries of one build, and
#   ab.py /tmp/old/bin/trainyard-engine build/bin/trainyard-engine
# compares a previous build against this one. The sides alternate round by
# round (A, B, A, B, ...) so that load drifting during the run hits both;
# each round is one engine run of --steps steps whose first step is skipped.
# Prints per shape the median step of each side, the spread (p90/p50) and
# B's tokens/s over A's; --busy N keeps N processes spinning meanwhile. Needs torch (the test venv) to write the model.
import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (same directory: model writing, engine runner)

AB_SHAPES = {
    "124M-B4xT64": {"n_layer": 12, "n_embd": 768, "n_head": 12, "seq": 64, "batch": 4},
    "124M-B1xT1024": {"n_layer": 12, "n_embd": 768, "n_head": 12, "seq": 1024, "batch": 1},
}


def parse_side(text):
    """ENGINE[:VAR=VALUE,...] -> (engine path, {VAR: VALUE})."""
    path, _, envs = text.partition(":")
    env = {}
    for kv in filter(None, envs.split(",")):
        k, eq, v = kv.partition("=")
        if not eq:
            raise SystemExit(f"ab.py: '{kv}' is not VAR=VALUE")
        env[k] = v
    if not os.access(path, os.X_OK):
        raise SystemExit(f"ab.py: {path} is not an executable engine")
    return path, env


def run_side(side, shape, steps, threads, tmp, mdir, data, precision):
    path, env = side
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        gaps, rss, _ = bench.engine_side(path, shape, steps, threads, tmp, mdir, data,
                                          precision)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return gaps, rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", choices=sorted(AB_SHAPES))
    ap.add_argument("--busy", type=int, default=0, help="extra spinning processes during the run")
    ap.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="fp32",
                    help="the spec's precision (activations and weights in that type)")
    args = ap.parse_args()
    sides = {"A": parse_side(args.a), "B": parse_side(args.b)}
    bench.SHAPES.update(AB_SHAPES)
    print(f"A {args.a}\nB {args.b}\nthreads {args.threads}; rounds {args.rounds}; "
          f"busy {args.busy}; precision {args.precision}; load {os.getloadavg()[0]:.2f}", flush=True)
    busy = bench.start_busy(args.busy)
    try:
        rows = run_shapes(args, sides)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(f"\n{'shape':<14} {'A tok/s':>9} {'B tok/s':>9} {'B/A':>6} {'p90/p50 A':>9} "
          f"{'p90/p50 B':>9}")
    for r in rows:
        print(f"{r['shape']:<14} {r['a_tokens_per_s']:>9.1f} {r['b_tokens_per_s']:>9.1f} "
              f"{r['b_over_a']:>5.2f}x {r['a_spread']:>9.2f} {r['b_spread']:>9.2f}")
    return 0


def run_shapes(args, sides):
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_ab_") as tmp:
        for shape in ([args.only] if args.only else list(AB_SHAPES)):
            s = AB_SHAPES[shape]
            mdir, data = bench.write_inputs(shape, args.steps, tmp)
            steps = {"A": [], "B": []}
            for _ in range(args.rounds):
                for name in ("A", "B"):
                    gaps, _ = run_side(sides[name], shape, args.steps, args.threads, tmp, mdir,
                                       data, args.precision)
                    steps[name] += gaps
            tok = s["batch"] * s["seq"]
            ma, mb = statistics.median(steps["A"]), statistics.median(steps["B"])
            rows.append({"shape": shape, "a_step_s": round(ma, 3), "b_step_s": round(mb, 3),
                         "a_tokens_per_s": round(tok / ma, 1), "b_tokens_per_s": round(tok / mb, 1),
                         "a_spread": bench.spread(steps["A"]), "b_spread": bench.spread(steps["B"]),
                         "b_over_a": round(ma / mb, 2),
                         "load_avg_after": round(os.getloadavg()[0], 2)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
