#!/usr/bin/env python3
# model.py — a roofline model of one bf16 training step on an H200, from
# the work the emulated step counted (profile.json, made by counts.py).
# MODELLED, NOT MEASURED: no figure it prints comes from a GPU.
#
#   model.py [--profile FILE] [--shape NAME --batch B --seq T] [--launch-us US]
#            [--top N] [--brief] [--json FILE]
#   (default: gpt2-124M at B 16, T 1024 and llama-1B at B 4, T 2048)
#   model.py --bench-json bench.json   (tests/gpu/run.sh, after bench.py:
#       each measured shape's figures beside the model's at its B and T)
#
# Per launch: time = max(sum over paths of FLOPs / peak(path),
#                        (bytes read + written) / HBM bandwidth) + launch cost
# and the step is the sum over its launches (one stream, no overlap).
# Peaks: NVIDIA H200 SXM datasheet, dense: bf16/fp16 tensor 989 TFLOP/s,
# TF32 tensor 494, fp32 67, HBM3e 4.8 TB/s (docs/benchmarks.md cites it).
# Warp MMA FLOPs (flash attention's tiles) are charged at the 16-bit tensor peak.
# Launch cost: 3 us per launch, cuBLASLt call, memset or copy (a stated
# assumption: back-to-back launches without CUDA graphs). Host copies
# (the batch in, the loss out) are charged at 25 GB/s (assumed PCIe), as
# bytes over that bandwidth. Not modelled: the host's own time, the sync
# at the loss read-back, tile quantisation, caches (bytes are each
# launch's compulsory traffic), clocks below boost.
# MFU is bench.py's: tokens/s x (6 N_matmul + 6 L T C) / 989e12. Standard
# library only: tests/gpu/run.sh runs it on the GPU machine beside bench.py.
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (SHAPES, flops_per_token, PEAK_FLOPS)

PEAK = {"tc16": 989e12, "tf32": 494e12, "simt": 67e12, "mma": 989e12}
HBM_BPS = 4.8e12
HOST_BPS = 25e9
LAUNCH_US = 3.0
DEFAULTS = (("gpt2-124M", 16, 1024), ("llama-1B", 4, 2048))


def poly(coef, B, T, V, with_v):
    x, y = B * T, B * T * T
    b = [1, x, y, V, V * x] if with_v else [1, x, y]
    return [sum(c * v for c, v in zip(cq, b)) for cq in coef]


def launches(prof, B, T, L):
    """(name, count, [tc16, tf32, simt, mma, read, write] per launch) at the shape."""
    V = prof["config"]["vocab_size"]
    out = []
    for e in prof["launches"]:
        q = poly(e["coef"], B, T, V, prof["fit_vocab"])
        if e["fixed"]:
            q = [a + (L - 1) * s for a, s in zip(q, e["per_layer_slope"])]
            n = e["n"]
        else:
            n = e["n"] * (L - 1)
        if n:
            out.append((e["name"], n, [max(v, 0.0) for v in q]))
    return out


def launch_time(name, q, launch_s):
    """Seconds of one launch and what bounds it."""
    compute = sum(f / PEAK[p] for f, p in zip(q[:4], ("tc16", "tf32", "simt", "mma")))
    host = name.startswith(("cudaMemcpyAsync.h2d", "cudaMemcpyAsync.d2h"))
    memory = (q[4] + q[5]) / (HOST_BPS if host else HBM_BPS)
    bound = "compute" if compute >= memory else "host copy" if host else "memory"
    if launch_s > max(compute, memory):
        bound = "launch"
    return max(compute, memory) + launch_s, bound


def model(prof, name, B, T, launch_us=LAUNCH_US):
    s = dict(bench.SHAPES[name])
    L, _ = bench.layers_width(s)
    V = prof["config"]["vocab_size"]
    pp = prof["params"]
    params = round(pp["at_L1_V0"] + (V - pp["V0"]) * pp["per_V"] + (L - 1) * pp["per_layer"])
    rows, total, flops, tc16 = {}, 0.0, 0.0, 0.0
    for lname, n, q in launches(prof, B, T, L):
        t, bound = launch_time(lname, q, launch_us * 1e-6)
        total += n * t
        flops += n * sum(q[:4])
        tc16 += n * (q[0] + q[3])  # cuBLASLt's 16-bit GEMMs and the warp-matrix tiles
        r = rows.setdefault(lname, {"name": lname, "count": 0, "seconds": 0.0, "bound": bound,
                                    "flops": 0.0, "bytes": 0.0})
        r["count"] += n
        r["seconds"] += n * t
        r["flops"] += n * sum(q[:4])
        r["bytes"] += n * (q[4] + q[5])
    tps = B * T / total
    fpt = bench.flops_per_token(s, params, T)
    return {"shape": name, "B": B, "T": T, "L": L, "params": params, "step_s": total,
            "tokens_per_s": tps, "mfu": tps * fpt / bench.PEAK_FLOPS, "flops_per_token": fpt,
            "counted_flops_per_token": flops / (B * T), "tc16_share": tc16 / flops if flops else 0.0,
            "launches": sum(r["count"] for r in rows.values()), "launch_us": launch_us,
            "top": sorted(rows.values(), key=lambda r: -r["seconds"]),
            "fit_check": prof["check"], "modelled": "not measured"}


def brief(m):
    return (f"{m['shape']}: B {m['B']} x T {m['T']} bf16: modelled {1e3 * m['step_s']:.1f} ms/step, "
            f"{m['tokens_per_s']:.0f} tokens/s, MFU {100 * m['mfu']:.1f}% (H200 roofline, "
            f"{m['launch_us']:g} us/launch; modelled, not measured)")


def report(m, top):
    print(brief(m))
    print(f"  {m['launches']} launches per step, {m['params']} parameters; FLOPs on 16-bit tensor "
          f"cores (cuBLASLt and warp-matrix tiles) {100 * m['tc16_share']:.1f}% of {m['counted_flops_per_token'] / 1e9:.3f} GFLOP/token "
          f"counted (MFU counts {m['flops_per_token'] / 1e9:.3f}); the fit predicted a held-out "
          f"emulated shape within {100 * m['fit_check']['worst_relative_error']:.2g}% per launch"
          + (f" (worst: {m['fit_check']['worst_at']})" if m['fit_check'].get('worst_at') else "")
          + (f", the step's FLOPs within {100 * m['fit_check']['step_flops_error']:.2g}% and bytes "
             f"within {100 * m['fit_check']['step_bytes_error']:.2g}%"
             if "step_bytes_error" in m["fit_check"] else ""))
    print(f"  top {top} launches by modelled time:")
    for r in m["top"][:top]:
        print(f"    {100 * r['seconds'] / m['step_s']:5.1f}%  {1e3 * r['seconds']:8.3f} ms  "
              f"{r['count']:5d} x {1e6 * r['seconds'] / r['count']:9.1f} us  {r['bound']:8s} {r['name']}")


def beside(doc, path, launch_us):
    """One line per shape bench.py measured: measured and modelled."""
    with open(path) as f:
        measured = json.load(f)
    out = []
    for name, r in measured.items():
        if not isinstance(r, dict) or "tokens_per_s" not in r or "batch" not in r or "T" not in r:
            continue
        if name not in doc["shapes"]:
            out.append(f"{name}: no profile (profile.json has {', '.join(doc['shapes'])})")
            continue
        m = model(doc["shapes"][name], name, r["batch"], r["T"], launch_us)
        out.append(f"{name} B {r['batch']} T {r['T']}: measured {r['tokens_per_s']:.0f} tokens/s "
                   f"MFU {100 * r['mfu']:.1f}%; modelled (not measured) {m['tokens_per_s']:.0f} "
                   f"tokens/s MFU {100 * m['mfu']:.1f}% {1e3 * m['step_s']:.1f} ms/step; measured/"
                   f"modelled {r['tokens_per_s'] / m['tokens_per_s']:.2f}")
    return out or ["no measured shape in " + path]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "profile.json"))
    ap.add_argument("--shape")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--launch-us", type=float, default=LAUNCH_US)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--brief", action="store_true", help="one line per shape")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--bench-json", help="bench.py's results: model each measured shape beside them")
    a = ap.parse_args()
    try:
        with open(a.profile) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"model.py: cannot read the profile {a.profile}: {e}", file=sys.stderr)
        return 2
    if a.bench_json:
        try:
            print("\n".join(beside(doc, a.bench_json, a.launch_us)))
        except (OSError, ValueError, KeyError) as e:
            print(f"model.py: cannot read bench.py's results {a.bench_json}: {e}", file=sys.stderr)
            return 2
        return 0
    if a.shape:
        if a.shape not in doc["shapes"]:
            print(f"model.py: no profile for shape {a.shape} (have: {', '.join(doc['shapes'])})",
                  file=sys.stderr)
            return 2
        if not a.batch or not a.seq or a.batch < 1 or a.seq < 1:
            print("model.py: --shape needs --batch and --seq, both at least 1", file=sys.stderr)
            return 2
        todo = [(a.shape, a.batch, a.seq)]
    else:
        todo = [d for d in DEFAULTS if d[0] in doc["shapes"]]
    out = []
    for name, B, T in todo:
        m = model(doc["shapes"][name], name, B, T, a.launch_us)
        out.append(m)
        if a.brief:
            print(brief(m))
        else:
            report(m, a.top)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
