#!/usr/bin/python3
"""scaling_test.py — ctest gpu.scaling_logic: the parts of
bench/engine-gpu/scaling.py that gpu.run_dry's world-2 run on the CPU
cannot reach here (the machine has no GPU): the one-GPU line, a budget too
short, a missing mpirun, the GPUs taken from CUDA_VISIBLE_DEVICES, the
verdict's arithmetic and parsing on recorded events (rank 0's all-reduce
line picked among the ranks', the efficiency, losses that disagree
failing), and a GPU world 2's launch through the machine's mpirun (each
rank's TY_WORLD_SIZE, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, argv, the
spec) with a stand-in engine. No real engine runs.

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


def run(tmp, *extra, env=None):
    out, summary = os.path.join(tmp, "bench.json"), os.path.join(tmp, "summary.txt")
    for f in (out, summary):
        if os.path.exists(f):
            os.remove(f)
    with open(out, "w") as f:  # bench.py's results, there before: kept
        json.dump({"gpt2-124M": {"tokens_per_s": 1.0}}, f)
    p = subprocess.run([sys.executable, SCALING, "/nonexistent/engine", "--out", out, "--summary", summary,
                        *extra], capture_output=True, text=True, timeout=60, env=env)
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
    # The GPUs are CUDA_VISIBLE_DEVICES's when it is set (a machine lent in part).
    env = {k: v for k, v in os.environ.items() if k != "TY_MPIRUN"}
    rc, out, summ, doc = run(tmp, env=dict(env, CUDA_VISIBLE_DEVICES="5"))
    check(rc == 0 and summ == "SKIP scaling: 1 GPU: scaling not measurable", f"CUDA_VISIBLE_DEVICES=5: {summ!r}")
    rc, out, summ, doc = run(tmp, "--budget", "300", "--mpirun", "/nonexistent/mpirun",
                             env=dict(env, CUDA_VISIBLE_DEVICES="3,5,6"))
    check(rc == 1 and summ.startswith("FAIL scaling: 3 GPUs but no"), f"CUDA_VISIBLE_DEVICES=3,5,6: {summ!r}")

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

# The launch of world 2, as run_world makes it, through the machine's
# mpirun: a stand-in engine records what each rank was given.
FAKE = r"""#!/usr/bin/python3
import json, os, sys
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
with open(os.environ["TY_EVENTS_PATH"], "a") as f:
    f.write(json.dumps({"ev": "launch", "rank": rank, "world": os.environ.get("TY_WORLD_SIZE"),
                        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "order": os.environ.get("CUDA_DEVICE_ORDER"), "argv": sys.argv[1:]}) + "\n")
    if rank == "0":
        f.write(json.dumps({"ev": "metric", "step": 1, "loss": 5.0, "tokens_per_s": 10.0, "mem_bytes": 1}) + "\n")
        f.write(json.dumps({"ev": "done", "status": "succeeded"}) + "\n")
sys.stderr.write(f"trainyard-engine[{rank}]: data parallel: gradient all-reduce 0.100 s of 1.000 s in steps "
                 "(10.0%), world 2, blocking after the backward; 0 of 0 buckets started during the backward\n")
"""
mpirun = scaling.shutil.which("mpirun")
if mpirun:
    with tempfile.TemporaryDirectory(prefix="ty-scaling-launch-") as tmp:
        fake = os.path.join(tmp, "engine")
        with open(fake, "w") as f:
            f.write(FAKE)
        os.chmod(fake, 0o755)
        spec = scaling.make_spec(scaling.bench.SHAPES["gpt2-dry"], 4, 2, 2, 3, "data.jsonl", False)
        r = scaling.run_world(fake, tmp, spec, 2, ["3", "5", "6"], dict(os.environ), 60, mpirun, 1)
        ev = [json.loads(x) for x in open(os.path.join(tmp, "work-w2-b4", "events.jsonl"))]
        launch = sorted((e for e in ev if e["ev"] == "launch"), key=lambda e: e["rank"])
        check([(e["rank"], e["world"], e["cuda"], e["order"]) for e in launch] ==
              [("0", "2", "3,5", "PCI_BUS_ID"), ("1", "2", "3,5", "PCI_BUS_ID")],
              f"world 2 ranks: TY_WORLD_SIZE, the first two GPUs, PCI order: {launch}")
        check(launch[0]["argv"][0] == "--spec" and "--workdir" in launch[0]["argv"], f"argv {launch[0]['argv']}")
        check(r.get("allreduce_share") == 0.1 and r.get("losses") == [5.0], f"parsed through mpirun: {r}")
        check(spec["resources"] == {"backend": "cuda", "gpus": 2} and spec["hyperparameters"]["grad_accum"] == 2
              and spec["hyperparameters"]["batch_size"] == 4 and spec["precision"] == "bf16",
              f"the world 2 spec: {spec['resources']}, {spec['hyperparameters']}")
else:
    print("no mpirun here: the world 2 launch is not checked")

if failures:
    sys.exit(f"{len(failures)} failed")
print("scaling.py logic: all checks passed")
