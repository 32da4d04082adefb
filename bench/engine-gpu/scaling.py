#!/usr/bin/env python3
# scaling.py — data-parallel scaling of trainyard-engine from one GPU to all
# of a node's: GPT-2 124M, bf16, T = 1024, the same per-GPU
# batch at world 1 and world N. Standard library only: tests/gpu/run.sh
# runs it on a lent GPU machine next to the binaries it carries (bench.py,
# whose shape table and data writer it shares, sits beside it).
#
#   scaling.py ENGINE [--gpus N] [--budget SECONDS] [--out FILE] [--summary FILE]
#   scaling.py ENGINE --dry   (here: world 2 on the CPU backend, tiny shape)
#
# The runs. Per-GPU batch b rows of T tokens, grad_accum N in both runs,
# so both see the same global batch of N x b rows a step (docs/engine.md,
# Ranks: a step's rows do not depend on the world) and their losses must
# agree: world 1 is one process on GPU 0 taking the N micro-batches of b
# rows in turn; world N is N ranks started the way the server starts a
# `resources.gpus: N` job (server/exec_mpirun.c): `mpirun -np N` with
# TY_WORLD_SIZE, CUDA_VISIBLE_DEVICES = the N GPUs, CUDA_DEVICE_ORDER,
# TY_EVENTS_PATH (rank 0's events, a file here where the server has a
# FIFO); each rank takes GPU `local rank` and one micro-batch of b rows;
# the gradients are summed over NCCL (its unique id goes over MPI). The
# mpirun: --mpirun, else TY_MPIRUN, else the one run.sh carries
# (OUT/ompi/bin/mpirun, tests/gpu/carry-mpi.sh), else the machine's.
# World 1's step also runs the optimizer once per N x b rows, as world N
# does per rank: the same work per GPU but the all-reduce.
#
# What it reports: tokens/s of each world (the median of the metric
# events' tokens_per_s after two warm-up steps; the engine counts the
# global batch's tokens), the scaling efficiency tok/s(N) / (N x tok/s(1))
# against the issue's goal of 90%, the share of rank 0's step time spent
# in the gradient all-reduce (the line every world > 1 rank logs at its
# end), and whether the losses agree (step 1 within 1e-5 relative: the
# same rows through the same kernels, only the order of the global sum
# differs; every step within 2e-2, bf16). A FAIL line for a run that did
# not finish or losses that disagree; an efficiency under the goal is
# reported, not failed. With fewer than two GPUs, or too little budget, a
# SKIP line with the reason. The line goes to stdout and, with --summary,
# is appended to that file; with --out the results are added to that JSON
# file under "scaling" (bench.json: what is there already is kept).
#
# --dry: the emulated CUDA backend cannot run two ranks here (a GPU rank's
# gradient sum is NCCL's, and there is neither NCCL nor a GPU), so the
# dry run takes world 1 and world 2 on the CPU backend with the same
# engine binary (the CPU ranks' collective is MPI) through the same
# launch, parsing and arithmetic; it measures nothing.
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (SHAPES, write_data, read_events: the single-GPU bench's)

GOAL = 0.90
TOL_FIRST, TOL_ALL = 1e-5, 2e-2
SHARE_RE = re.compile(r"^trainyard-engine\[0\]: data parallel: gradient all-reduce ([0-9.]+) s of "
                      r"([0-9.]+) s in steps \(([0-9.]+)%\)(.*)$", re.M)


def gpu_ids():
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES's list when set
    (a machine lent in part), else every GPU nvidia-smi lists (its indices
    are in PCI bus order, as CUDA_DEVICE_ORDER=PCI_BUS_ID numbers them)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [d.strip() for d in vis.split(",") if d.strip()]
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(l for l in p.stdout.splitlines() if l.startswith("GPU "))]


def find_nccl():
    """TY_NCCL for the engine: the caller's, else a libnccl.so.2 of the
    machine (the GPU image's PyTorch environment has nvidia-nccl): first
    beside the cuBLASLt run.sh found (site-packages/nvidia/{cublas,nccl}/lib),
    then anywhere under /opt and /usr."""
    if os.environ.get("TY_NCCL"):
        return os.environ["TY_NCCL"]
    lt = os.environ.get("TY_CUBLASLT")
    if lt:
        p = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(lt))), "nccl", "lib", "libnccl.so.2")
        if os.path.exists(p):
            return p
    for root in ("/opt", "/usr"):
        for d, _, files in os.walk(root):
            if "libnccl.so.2" in files:
                return os.path.join(d, "libnccl.so.2")
    return None


def parse_run(events_text, stderr_text):
    """Metric events and rank 0's all-reduce line of one run: {losses, tps,
    share, allreduce_s, step_s} or {error}."""
    events = bench.read_events(events_text)
    err = [e for e in events if e.get("ev") == "error"]
    metrics = [e for e in events if e.get("ev") == "metric"]
    if err or not metrics or not any(e.get("ev") == "done" for e in events):
        why = err[0]["message"] if err else (stderr_text.strip().splitlines() or ["no events"])[-1]
        return {"error": why}
    steady = [m["tokens_per_s"] for m in metrics if m["step"] > 2] or [metrics[-1]["tokens_per_s"]]
    r = {"losses": [m["loss"] for m in metrics], "tokens_per_s": statistics.median(steady),
         "peak_device_bytes": max(m["mem_bytes"] for m in metrics),
         "device_used_bytes": max((m["device_used_bytes"] for m in metrics if "device_used_bytes" in m),
                                  default=None)}
    g = SHARE_RE.search(stderr_text)
    if g:
        r.update(allreduce_s=float(g.group(1)), step_s=float(g.group(2)), allreduce_share=float(g.group(3)) / 100,
                 allreduce_mode=g.group(4).lstrip(", ").split(";")[0])
    return r


def compare(w1, wn, world):
    """The verdict on two parsed runs: (ok, line, record)."""
    l1, ln = w1["losses"], wn["losses"]
    rel = [abs(a - b) / max(abs(a), 1e-30) for a, b in zip(l1, ln)]
    eff = wn["tokens_per_s"] / (world * w1["tokens_per_s"])
    rec = {"world": world, "tokens_per_s": {"1": w1["tokens_per_s"], str(world): wn["tokens_per_s"]},
           "efficiency": eff, "goal": GOAL, "goal_met": eff >= GOAL,
           "allreduce_share": wn.get("allreduce_share"), "allreduce_mode": wn.get("allreduce_mode"),
           "loss_rel_diff_first": rel[0] if rel else None, "loss_rel_diff_max": max(rel) if rel else None,
           "losses": {"1": l1, str(world): ln}}
    problems = []
    if len(l1) != len(ln) or not rel:
        problems.append(f"{len(l1)} vs {len(ln)} metric steps")
    elif rel[0] > TOL_FIRST or max(rel) > TOL_ALL:
        problems.append(f"losses differ: step 1 {rel[0]:.1e} (<= {TOL_FIRST:g}), max {max(rel):.1e} (<= {TOL_ALL:g})")
    if wn.get("allreduce_share") is None:
        problems.append("rank 0 logged no all-reduce line")
    share = wn.get("allreduce_share")
    text = (f"world 1 {w1['tokens_per_s']:.0f} tokens/s, world {world} {wn['tokens_per_s']:.0f} tokens/s, "
            f"efficiency {100 * eff:.1f}% (goal {100 * GOAL:.0f}%: {'met' if eff >= GOAL else 'not met'}), "
            f"all-reduce {'?' if share is None else f'{100 * share:.1f}%'} of rank 0's step time"
            f"{'' if not wn.get('allreduce_mode') else ' (' + wn['allreduce_mode'] + ')'}, "
            f"losses {'agree' if not problems else 'checked'}"
            + (f" (step 1 {rel[0]:.1e}, max {max(rel):.1e} relative)" if rel else ""))
    rec["problems"] = problems
    if problems:
        return False, f"FAIL scaling: {'; '.join(problems)}; {text}", rec
    return True, f"PASS scaling: {text}", rec


def run_world(engine, tmp, spec, world, gpus, env, timeout, mpirun, threads):
    """One run; world > 1 through mpirun as the server starts GPU ranks."""
    name = f"w{world}-b{spec['hyperparameters']['batch_size']}"
    sp = os.path.join(tmp, name + ".json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    work = os.path.join(tmp, "work-" + name)
    os.makedirs(work, exist_ok=True)
    events = os.path.join(work, "events.jsonl")
    open(events, "w").close()  # rank 0 appends
    cmd = [engine, "--spec", sp, "--workdir", work, "--threads", str(threads)]
    e = dict(env, TY_EVENTS_PATH=events, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    if gpus:
        e["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[:world])
    if world > 1:
        cmd = [mpirun, "-np", str(world), "--oversubscribe", "--bind-to", "none"] + cmd
        e["TY_WORLD_SIZE"] = str(world)
        if os.geteuid() == 0:  # Open MPI refuses root without both
            e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                         start_new_session=True)
    RUNNING[:] = [p]
    try:
        _, stderr = p.communicate(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        # SIGTERM first: mpirun passes it to its ranks and reaps them, so no
        # rank is left holding a GPU for the benchmark that follows.
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
        return {"error": f"world {world} timed out after {timeout:.0f} s"}
    text = open(events).read() if os.path.exists(events) else ""
    r = parse_run(text, stderr)
    if "error" not in r and p.returncode != 0:
        r = {"error": f"exit {p.returncode}: {(stderr.strip().splitlines() or [''])[-1]}"}
    r["wall_s"] = round(time.monotonic() - t0, 1)
    return r


# The run in flight. Its ranks are in a session of their own (mpirun and
# its children), so the step's hard timeout (run.sh's `timeout`, which
# signals this process's group) does not reach them: on SIGTERM this
# process ends them first, so none stays on a GPU for the next step.
RUNNING = []


def on_term(signum, frame):
    for p in RUNNING:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
    raise SystemExit(128 + signum)


def make_spec(shape, batch, world, accum, steps, data, dry):
    cfg = {k: v for k, v in shape.items() if k not in ("T", "batches", "steps")}
    T = shape["T"]
    res = ({"backend": "cpu", **({"cpu_ranks": world} if world > 1 else {})} if dry
           else {"backend": "cuda", "gpus": world})
    return {"model": {"init": cfg}, "dataset": {"train": data, "format": "tokens"},
            "hyperparameters": {"max_steps": steps, "batch_size": batch, "grad_accum": accum, "seq_len": T,
                                "lr": 1e-4, "log_every_steps": 1, "seed": 1},
            "precision": "bf16", "resources": res, "checkpoint": {"every_steps": 0}}


def record(args, line, rec):
    print(line)
    if args.summary:
        with open(args.summary, "a") as f:
            f.write(line + "\n")
    if args.out:
        doc = {}
        if os.path.exists(args.out):
            with open(args.out) as f:
                doc = json.load(f)
        doc["scaling"] = dict(rec, line=line)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


def default_mpirun():
    """The launcher run.sh carries (tests/gpu/carry-mpi.sh: OUT/ompi beside
    OUT/bin, the Open MPI the engine's libmpi comes from), else mpirun on
    the path."""
    carried = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ompi", "bin", "mpirun")
    return carried if os.access(carried, os.X_OK) else "mpirun"


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("--gpus", type=int,
                    help="GPUs to use, the first N of CUDA_VISIBLE_DEVICES's or nvidia-smi's (default: all)")
    ap.add_argument("--budget", type=float, default=120, help="seconds for both runs")
    ap.add_argument("--out", help="JSON file to add the results to, under \"scaling\"")
    ap.add_argument("--summary", help="append the PASS / FAIL / SKIP line to this file")
    ap.add_argument("--mpirun", default=os.environ.get("TY_MPIRUN") or default_mpirun())
    ap.add_argument("--dry", action="store_true")
    return ap.parse_args()


def main(a):
    t_end = time.monotonic() + a.budget
    env = dict(os.environ)
    if a.dry:
        world, gpus, shape, batches, steps, need = 2, [], bench.SHAPES["gpt2-dry"], [2], 4, 15
        env.pop("TY_KERNELS", None)
        env["OMP_NUM_THREADS"] = "1"
    else:
        gpus = gpu_ids()
        if a.gpus is not None:
            gpus = (gpus + [str(i) for i in range(len(gpus), a.gpus)])[:a.gpus]
        world, shape, batches, steps, need = len(gpus), bench.SHAPES["gpt2-124M"], [16, 8, 4], 8, 40
        if world < 2:
            record(a, f"SKIP scaling: {world} GPU{'' if world == 1 else 's'}: scaling not measurable",
                   {"gpus": world, "skipped": "scaling not measurable"})
            return 0
    if a.budget < need:
        record(a, f"SKIP scaling: time budget spent ({a.budget:.0f} s left, the step needs {need})",
               {"gpus": world, "skipped": "time budget spent"})
        return 0
    mpirun = shutil.which(a.mpirun)
    if not mpirun:
        record(a, f"FAIL scaling: {world} {'GPUs' if gpus else 'ranks'} but no {a.mpirun}: ranks start "
               "through Open MPI's mpirun as the server starts them (docs/engine.md, Ranks)",
               {"gpus": world, "error": "no mpirun"})
        return 1
    if gpus and "TY_NCCL" not in env:
        nccl = find_nccl()
        if nccl:
            env["TY_NCCL"] = nccl
    threads = 1 if a.dry else max(1, (os.cpu_count() or 2) // world)
    with tempfile.TemporaryDirectory(prefix="ty-bench-scaling-") as tmp:
        w1 = {"error": "no batch tried"}
        for b in batches:  # the per-GPU batch: the first that fits one GPU
            left = t_end - time.monotonic()
            data = bench.write_data(tmp, shape["vocab_size"], shape["T"], b * world * (steps + 1))
            w1 = run_world(a.engine, tmp, make_spec(shape, b, 1, world, steps, data, a.dry), 1, gpus, env,
                           left * 0.6, mpirun, threads)
            if "error" not in w1 or not bench.is_oom(w1["error"]):
                break  # a batch that fits, or an error a smaller batch would not cure
        if "error" in w1:
            record(a, f"FAIL scaling: world 1 did not run: {w1['error']}", {"gpus": world, "error": w1["error"]})
            return 1
        left = t_end - time.monotonic()
        wn = run_world(a.engine, tmp, make_spec(shape, b, world, world, steps, data, a.dry), world, gpus, env, left,
                       mpirun, threads)
        if "error" in wn:
            record(a, f"FAIL scaling: world {world} did not run: {wn['error']}",
                   {"gpus": world, "batch": b, "error": wn["error"], "world1": w1})
            return 1
        ok, line, rec = compare(w1, wn, world)
        rec.update(gpus=world if gpus else 0, batch_per_gpu=b, T=shape["T"], steps=steps, precision="bf16",
                   wall_s={"1": w1["wall_s"], str(world): wn["wall_s"]},
                   peak_device_bytes={"1": w1["peak_device_bytes"], str(world): wn["peak_device_bytes"]},
                   device_used_bytes={"1": w1["device_used_bytes"], str(world): wn["device_used_bytes"]})
        what = (f"GPT-2 {'dry' if a.dry else '124M'} bf16 T {shape['T']}, {b} rows per "
                f"{'rank' if a.dry else 'GPU'}, grad_accum {world}, {steps} steps"
                + (" on the CPU backend (dry: nothing measured)" if a.dry else ""))
        record(a, f"{line}; {what}", rec)
        return 0 if ok else 1


if __name__ == "__main__":
    args = parse_args()
    signal.signal(signal.SIGTERM, on_term)
    try:
        sys.exit(main(args))
    except Exception as e:  # the summary still gets the step's line
        record(args, f"FAIL scaling: {type(e).__name__}: {e}", {"error": str(e)})
        raise
