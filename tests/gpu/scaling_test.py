#!/usr/bin/python3
"""scaling_test.py — ctest gpu.scaling_logic: the parts of
bench/engine-gpu/scaling.py that gpu.run_dry's world-2 run on the CPU
cannot reach here (the machine has no GPU): the one-GPU line, a budget too
short, a missing mpirun, and the verdict's arithmetic and parsing on
recorded events (rank 0's all-reduce line picked among the ranks', the
efficiency, losses that disagree failing). No engine runs.

Usage: scaling_test.py SCALING_PY
"""
import json
import os
import subprocess
import sys
import tempfile

SCALING = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.dirname(SCALING))
import scaling  # noqa: E402

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


def run(tmp, *extra):
    out, summary = os.path.join(tmp, "bench.json"), os.path.join(tmp, "summary.txt")
    for f in (out, summary):
        if os.path.exists(f):
            os.remove(f)
    with open(out, "w") as f:  # bench.py's results, there before: kept
        json.dump({"gpt2-124M": {"tokens_per_s": 1.0}}, f)
    p = subprocess.run([sys.executable, SCALING, "/nonexistent/engine", "--out", out, "--summary", summary,
                        *extra], capture_output=True, text=True, timeout=60)
    with open(out) as f:
        doc = json.load(f)
    with open(summary) as f:
        return p.returncode, p.stdout.strip(), f.read().strip(), doc


with tempfile.TemporaryDirectory(prefix="ty-scaling-test-") as tmp:
    rc, out, summ, doc = run(tmp, "--gpus", "1")
    check(rc == 0 and summ == "SKIP scaling: 1 GPU: scaling not measurable" and out == summ,
          f"one GPU: {summ!r}, rc {rc}")
    check(doc.get("gpt2-124M") == {"tokens_per_s": 1.0} and doc["scaling"]["skipped"] == "scaling not measurable",
          f"bench.json keeps what was there and gains scaling: {sorted(doc)}")
    rc, out, summ, doc = run(tmp, "--gpus", "4", "--budget", "20")
    check(rc == 0 and summ.startswith("SKIP scaling: time budget spent (20 s left"), f"short budget: {summ!r}")
    rc, out, summ, doc = run(tmp, "--gpus", "2", "--budget", "300", "--mpirun", "/nonexistent/mpirun")
    check(rc == 1 and summ.startswith("FAIL scaling: 2 GPUs but no /nonexistent/mpirun"), f"no mpirun: {summ!r}")

# Recorded events of a world-2 run: rank 1's line comes first and must not
# be the one read.
events = "\n".join(json.dumps(e) for e in [
    {"ev": "started", "world": 2},
    *({"ev": "metric", "step": s, "loss": 10.0 - s / 10, "tokens_per_s": tps, "mem_bytes": 100 + s}
      for s, tps in ((1, 50.0), (2, 900.0), (3, 1500.0), (4, 1400.0), (5, 1600.0))),
    {"ev": "done", "status": "completed"}])
stderr = ("trainyard-engine[1]: data parallel: gradient all-reduce 9.000 s of 10.000 s in steps (90.0%), "
          "world 2, blocking after the backward; 0 of 0 buckets started during the backward\n"
          "trainyard-engine[0]: data parallel: gradient all-reduce 1.000 s of 10.000 s in steps (10.0%), "
          "world 2, exposed (buckets overlapped with the backward); 3 of 4 buckets started during the backward\n")
wn = scaling.parse_run(events, stderr)
check(wn["tokens_per_s"] == 1500.0 and wn["allreduce_share"] == 0.1 and wn["peak_device_bytes"] == 105,
      f"parsed: median of steps 3-5, rank 0's share: {wn.get('tokens_per_s')}, {wn.get('allreduce_share')}")
check(wn["allreduce_mode"] == "world 2, exposed (buckets overlapped with the backward)", wn["allreduce_mode"])
check("error" in scaling.parse_run(events.replace('"done"', '"started"'), "x"), "no done event: an error")
check(scaling.parse_run('{"ev": "error", "message": "out of device memory"}', "")["error"] == "out of device memory",
      "the engine's error event is the reason")
w1 = dict(wn, tokens_per_s=1000.0)
ok, line, rec = scaling.compare(w1, wn, 2)
check(ok and abs(rec["efficiency"] - 0.75) < 1e-12 and not rec["goal_met"] and
      "efficiency 75.0% (goal 90%: not met)" in line and line.startswith("PASS scaling"), line)
ok, line, rec = scaling.compare(dict(w1, tokens_per_s=800.0), wn, 2)
check(ok and rec["goal_met"] and "93.8% (goal 90%: met)" in line, line)
bad = dict(wn, losses=[wn["losses"][0] * (1 + 1e-3)] + wn["losses"][1:])
ok, line, rec = scaling.compare(w1, bad, 2)
check(not ok and line.startswith("FAIL scaling: losses differ: step 1 1.0e-03"), line)
drift = dict(wn, losses=wn["losses"][:-1] + [wn["losses"][-1] * 1.05])
ok, line, rec = scaling.compare(w1, drift, 2)
check(not ok and "max 5.0e-02" in line, line)
ok, line, rec = scaling.compare(w1, dict(wn, allreduce_share=None), 2)
check(not ok and "rank 0 logged no all-reduce line" in line, line)

if failures:
    sys.exit(f"{len(failures)} failed")
print("scaling.py logic: all checks passed")
