#!/usr/bin/python3
"""bench_test.py — ctest gpu.bench_logic: the parts of
bench/engine-gpu/bench.py that gpu.run_dry cannot reach (the emulated
device never runs out of memory): the batch sweep moving down only on
out-of-memory errors and stopping, with the error named, on any other;
the MFU's FLOP count (parameters less the lookup tables, plus attention)
on the two benchmark shapes; device_used_bytes carried into bench.json.
A stand-in engine answers each batch as the test's plan says; no real
engine runs.

Usage: bench_test.py BENCH_PY
"""
import json
import os
import subprocess
import sys
import tempfile

BENCH = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.dirname(BENCH))
import bench  # noqa: E402

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


# What counts as out of memory: the engine's own messages, CUDA's, cuBLASLt's.
for msg, want in [("out of memory: 123456 bytes of activations", True),
                  ("cuda kernel: scratch: out of memory", True),
                  ("cuda kernel: cuBLASLt matmul failed (status 3)", True),
                  ("cuda kernel: launch of k_attn: invalid argument", False),
                  ("cuda kernel: cuBLASLt matmul failed (status 15)", False),
                  ("hyperparameters.batch_size x seq_len = 1 positions per micro-batch is too many", False),
                  ("timed out after 30 s", False), ("", False)]:
    check(bench.is_oom(msg) == want, f"is_oom({msg!r}) is {want}")

# The FLOP count. Llama 1B (untied): 16 layers of 60,821,504 (q, o 2048^2;
# k, v 2048 x 512; MLP 3 x 2048 x 8192; two norms), embedding and head
# 128256 x 2048 each, final norm: 1,498,482,688; the embedding is a lookup.
llama = bench.SHAPES["llama-1B"]
n_llama = 16 * 60821504 + 2 * 128256 * 2048 + 2048
check(n_llama == 1498482688, f"Llama 1B parameters {n_llama}")
check(bench.matmul_params(llama, n_llama) == n_llama - 128256 * 2048 == 1235814400,
      f"Llama 1B: the untied embedding is not counted ({bench.matmul_params(llama, n_llama)})")
check(bench.flops_per_token(llama, n_llama, 1024) == 6 * 1235814400 + 6 * 16 * 1024 * 2048,
      "Llama 1B FLOPs per token = 6 N_matmul + 6 L T C")
# GPT-2 124M (tied): 124,439,808 parameters; the tied wte is the head's
# matrix and counts, the position table (1024 x 768) does not.
gpt2 = bench.SHAPES["gpt2-124M"]
check(bench.matmul_params(gpt2, 124439808) == 124439808 - 1024 * 768,
      f"GPT-2 124M: only the position table is left out ({bench.matmul_params(gpt2, 124439808)})")
check(bench.matmul_params(dict(llama, tie_word_embeddings=True), n_llama - 128256 * 2048) ==
      n_llama - 128256 * 2048, "a tied Llama counts its embedding once, as the head")

STANDIN = r'''#!/usr/bin/python3
import json, os, sys
spec = json.load(open(sys.argv[sys.argv.index("--spec") + 1]))
b = spec["hyperparameters"]["batch_size"]
what = json.loads(os.environ["STANDIN_PLAN"]).get(str(b), "ok")
with open(os.environ["STANDIN_LOG"], "a") as f:
    f.write(f"{b}\n")
print(json.dumps({"ev": "started", "params": 124439808, "backend": "cuda", "gpu": {"name": "stand-in"}}))
if what != "ok":
    print(json.dumps({"ev": "error", "message": what}))
    sys.exit(1)
for s in range(1, spec["hyperparameters"]["max_steps"] + 1):
    print(json.dumps({"ev": "metric", "step": s, "loss": 5.0 - s / 10, "tokens_per_s": 1000.0 * s,
                      "mem_bytes": 1000 + b, "device_used_bytes": 5000 + 10 * s}))
print(json.dumps({"ev": "done", "status": "succeeded"}))
'''


def run(tmp, plan):
    log, out = os.path.join(tmp, "batches.log"), os.path.join(tmp, "bench.json")
    for f in (log, out):
        if os.path.exists(f):
            os.remove(f)
    env = dict(os.environ, STANDIN_PLAN=json.dumps(plan), STANDIN_LOG=log)
    p = subprocess.run([sys.executable, BENCH, os.path.join(tmp, "engine"), "--shapes", "gpt2-124M",
                        "--budget", "60", "--out", out], capture_output=True, text=True, timeout=120, env=env)
    tried = [int(x) for x in open(log).read().split()] if os.path.exists(log) else []
    doc = json.load(open(out)) if os.path.exists(out) else {}
    return p.returncode, p.stdout.strip() + p.stderr.strip(), tried, doc.get("gpt2-124M", {})


with tempfile.TemporaryDirectory(prefix="ty-bench-test-") as tmp:
    eng = os.path.join(tmp, "engine")
    with open(eng, "w") as f:
        f.write(STANDIN)
    os.chmod(eng, 0o755)
    oom = "out of memory: 99999999999 bytes of activations"
    # Out of memory at 64 and 48: moves on, and 32 runs.
    rc, out, tried, r = run(tmp, {"64": oom, "48": "cuda kernel: scratch: out of memory"})
    check(rc == 0 and tried == [64, 48, 32] and r.get("batch") == 32, f"OOM moves down: tried {tried}, rc {rc}")
    check([t["batch"] for t in r.get("refused", [])] == [64, 48] and all(t["oom"] for t in r["refused"]),
          f"the refused batches are recorded as out of memory: {r.get('refused')}")
    # tokens/s: the median after two warm-up steps (steps 3..8: 3000..8000).
    check(r.get("tokens_per_s") == 5500.0, f"tokens/s is the steady median: {r.get('tokens_per_s')}")
    want_mfu = 5500.0 * (6 * (124439808 - 1024 * 768) + 6 * 12 * 1024 * 768) / 989e12
    check(abs(r.get("mfu", 0) - want_mfu) < 1e-15, f"MFU {r.get('mfu')} = {want_mfu}")
    check(r.get("device_used_bytes") == 5080 and r.get("peak_device_bytes") == 1032,
          f"device_used_bytes is the highest metric's ({r.get('device_used_bytes')}), mem_bytes beside it")
    check("6 N_matmul + 6 L T C" in out and "device 0 MiB" in out and "out of memory at batch 64, 48" in out,
          f"the line states the formula, both memories and the OOM batches: {out!r}")
    # Any other error stops the sweep at once, and says which.
    bad = "cuda kernel: launch of k_attn: invalid argument"
    rc, out, tried, r = run(tmp, {"64": oom, "48": bad})
    check(rc == 1 and tried == [64, 48], f"a non-OOM error stops the sweep: tried {tried}, rc {rc}")
    check("not out of memory" in out and bad in out and "out of memory at batch 64" in out,
          f"and names the error: {out!r}")
    check(r.get("error", "").endswith(bad) and [t["batch"] for t in r.get("tried", [])] == [64, 48],
          f"bench.json records it: {r}")
    # Every batch out of memory: all tried, the last error given.
    plan = {str(b): oom for b in bench.SHAPES["gpt2-124M"]["batches"]}
    rc, out, tried, r = run(tmp, plan)
    check(rc == 1 and tried == bench.SHAPES["gpt2-124M"]["batches"] and "every batch ran out of memory" in out,
          f"all out of memory: tried {tried}: {out!r}")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
