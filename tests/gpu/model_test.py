#!/usr/bin/env python3
# model_test.py — gpu.model_logic: bench/engine-gpu's roofline without an
# engine run. The fit recovers a known polynomial exactly and refuses a
# step whose launches differ between shapes; the step is cut out of a
# 1-step and a 2-step run; the roofline arithmetic on a synthetic profile
# (a compute-bound GEMM, a memory-bound kernel, a launch-bound one, a
# per-layer copy) gives the times worked out by hand; model.py runs on the
# committed profile.json and its --bench-json line sets a measured figure
# beside the modelled one. Standard library only.
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench", "engine-gpu")
sys.path.insert(0, BENCH)
import model  # noqa: E402
import counts as prof  # noqa: E402  (bench/engine-gpu/counts.py)

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


def rec(name, tc16=0, simt=0, read=0, write=0):
    return {"name": name, "grid": [1, 1, 1], "block": [1, 1, 1],
            "flops": {"tc16": tc16, "tf32": 0, "simt": simt, "mma": 0},
            "decl": {"read": read, "write": write}}


# the fit: q = 7 + 3 BT + 5 BT^2 + 2 V + 11 V BT, from five shapes
def q(B, T, V):
    return 7 + 3 * B * T + 5 * B * T * T + 2 * V + 11 * V * B * T


shapes = [(1, 48, 1000), (2, 48, 1000), (1, 96, 1000), (1, 48, 2000), (2, 48, 2000)]
runs = [((B, T, V), [rec("k_x", read=q(B, T, V)), rec(f"cublasLtMatmul default bf16>bf16 64x{B * T}x{V}",
                                                         tc16=2 * 64 * B * T * V)]) for B, T, V in shapes]
coefs = prof.fit(runs, True)
check([float(c) for c in coefs[0][4]] == [7, 3, 5, 2, 11], f"the read bytes' coefficients: {coefs[0][4]}")
check(prof.evaluate(coefs[1], 16, 1024, 128256, True)[0] == 2 * 64 * 16 * 1024 * 128256,
      "a GEMM's FLOPs extrapolate exactly to B 16, T 1024, V 128256")
bad = [runs[0], ((2, 48, 1000), [rec("k_y"), runs[1][1][1]])] + runs[2:]
try:
    prof.fit(bad, True)
    check(False, "a step with another kernel at one shape is refused")
except SystemExit as e:
    check("launches other kernels" in str(e), f"a step with another kernel at one shape is refused: {e}")

# the loss head's bulk + tail GEMMs (V 1000: 896 + 104 rows) join into one
# launch over V; other launches, and a vocabulary of whole tiles, are kept
head = [rec("k_ce", read=5), rec("cublasLtMatmul default bf16>bf16 896x48x2048 tA", tc16=896),
        rec("cublasLtMatmul default bf16>bf16 104x48x2048 tA", tc16=104, read=3),
        rec("cublasLtMatmul default bf16>f32 2048x48x896"), rec("k_ce", read=1)]
joined = prof.join_head_tiles(head, 1000)
check([r["name"] for r in joined] == ["k_ce", "cublasLtMatmul default bf16>bf16 1000x48x2048 tA",
                                      "cublasLtMatmul default bf16>f32 2048x48x896", "k_ce"] and
      joined[1]["flops"]["tc16"] == 1000 and joined[1]["decl"]["read"] == 3,
      f"the head's bulk and tail GEMMs join into one over V: {[r['name'] for r in joined]}")
check(prof.join_head_tiles(head, 1024) == head, "a vocabulary of whole 128-row tiles is left as it is")

# the step: S A E against S A A E
S, A, E = [rec("init")], [rec("fwd"), rec("bwd", read=1)], [rec("save")]
step = prof.one_step(S + A + E, S + A + A + E)
check([r["name"] for r in step] == ["fwd", "bwd"], f"the step between a 1- and a 2-step run: {step}")

# the roofline on a synthetic profile: one layer fitted, constants only
syn = {"config": {"vocab_size": 50257}, "fit_vocab": False, "params": {"at_L1_V0": 0, "V0": 50257,
       "per_V": 0, "per_layer": 0}, "check": {"worst_relative_error": 0.0},
       "launches": [
           {"name": "gemm", "coef": [[989e9, 0, 0], [0] * 3, [0] * 3, [0] * 3, [0] * 3, [0] * 3],
            "fixed": 1, "per_layer_slope": [0] * 6, "n": 1},        # 1 ms on tensor cores
           {"name": "copy", "coef": [[0] * 3] * 4 + [[2.4e9, 0, 0], [2.4e9, 0, 0]],
            "fixed": 0, "per_layer_slope": None, "n": 1},           # 1 ms of HBM, per extra layer
           {"name": "tiny", "coef": [[0] * 3] * 4 + [[4, 0, 0], [4, 0, 0]],
            "fixed": 1, "per_layer_slope": [0, 0, 0, 0, 1, 0], "n": 2}]}  # launch-bound
rows = {r[0]: r for r in model.launches(syn, 1, 1, 3)}
check(rows["copy"][1] == 2 and rows["tiny"][1] == 2 and rows["tiny"][2][4] == 6,
      f"per-layer copies and slopes at L 3: {rows}")
t, bound = model.launch_time("gemm", rows["gemm"][2], 3e-6)
check(abs(t - 1.003e-3) < 1e-12 and bound == "compute", f"989 GFLOP bf16: 1 ms + 3 us, compute: {t} {bound}")
t, bound = model.launch_time("copy", rows["copy"][2], 3e-6)
check(abs(t - 1.003e-3) < 1e-12 and bound == "memory", f"4.8 GB: 1 ms + 3 us, memory: {t} {bound}")
t, bound = model.launch_time("tiny", rows["tiny"][2], 3e-6)
check(bound == "launch" and abs(t - 3e-6) < 1e-9, f"10 bytes: the launch cost: {t} {bound}")

# model.py on the committed profile
p = subprocess.run([sys.executable, os.path.join(BENCH, "model.py")], capture_output=True, text=True)
check(p.returncode == 0 and "gpt2-124M: B 16 x T 1024 bf16: modelled" in p.stdout and
      "top 10 launches" in p.stdout and "not measured" in p.stdout, f"model.py on profile.json: {p.stdout[:300]}")
with open(os.path.join(BENCH, "profile.json")) as f:
    doc = json.load(f)
for name, sp in doc["shapes"].items():
    B, T = dict((n, (b, t)) for n, b, t in model.DEFAULTS)[name]
    m = model.model(sp, name, B, T)
    check(0 < m["mfu"] < 1 and 0 <= m["tc16_share"] <= 1 and m["step_s"] > 0,
          f"{name}: MFU {m['mfu']:.3f}, 16-bit share {m['tc16_share']:.3f}, step {m['step_s']:.4f} s")
    check(abs(m["counted_flops_per_token"] / m["flops_per_token"] - 1) < 0.1,
          f"{name}: counted FLOPs/token within 10% of bench.py's 6N + 6LTC: "
          f"{m['counted_flops_per_token']:.4g} vs {m['flops_per_token']:.4g}")
with tempfile.TemporaryDirectory() as tmp:
    bj = os.path.join(tmp, "bench.json")
    with open(bj, "w") as f:
        json.dump({"scaling": {"tokens_per_s": 5.0, "world": 2}, "gpt2-dry": {"batch": 2, "T": 16, "tokens_per_s": 1.0, "mfu": 0.0},
                   "gpt2-124M": {"batch": 8, "T": 1024, "tokens_per_s": 1000.0, "mfu": 0.01}}, f)
    p = subprocess.run([sys.executable, os.path.join(BENCH, "model.py"), "--bench-json", bj],
                       capture_output=True, text=True)
    lines = p.stdout.splitlines()
    check(p.returncode == 0 and len(lines) == 2 and lines[0].startswith("gpt2-dry: no profile") and
          lines[1].startswith("gpt2-124M B 8 T 1024: measured 1000 tokens/s") and "modelled (not measured)" in lines[1],
          f"--bench-json: {lines}")
print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
