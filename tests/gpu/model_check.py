#!/usr/bin/env python3
"""model_check.py — the engine on the GPU against PyTorch, and resume on the
GPU (tests/gpu/run.sh; standard library only: the GPU machine has no
PyTorch, so make_ref.py computed the reference losses at build time).

1. reference: for GPT-2 and Llama (REFDIR/<arch>/: transformers' model, the
   rows, PyTorch's fp32 losses and hyperparameters), the engine trains the
   same steps with backend cuda in fp32 and in bf16; every step's loss must
   be within the stated tolerance of PyTorch's, relative:
       fp32  2e-4  (true fp32 GEMMs, no TF32: summation order only;
                    hf.ref.* holds the CPU to 1e-4)
       bf16  1e-2  (bf16 weights and activations against an fp32 PyTorch
                    run, STEPS steps: the engine_ref mixed checks measure
                    ~1e-3 per step on the CPU; 1e-2 leaves room for GPU
                    summation order without hiding a wrong kernel, which
                    is off by O(1))
2. resume (GPT-2, bf16): an uninterrupted run of RESUME_STEPS steps; a
   second run that gets SIGTERM as soon as its first step is reported (it
   finishes that step, checkpoints and stops), then resumed from that
   checkpoint: the resumed steps' losses and grad norms must be the same
   floats, and the exported weights the same bytes (the kernels have no
   atomics: the same order every run).
Each check prints one `PASS name ...` or `FAIL name ...` line with its
numbers; exit 0 only if all passed.

Usage: model_check.py ENGINE REFDIR WORK [--dry] [--budget SECONDS]
  --dry: here, on trainyard-engine-emu (TY_KERNELS=cuda-emu): the same
  steps at emulation speed (resume over 3 steps, not 12); it proves the
  script, it measures no GPU."""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

TOL = {"fp32": 2e-4, "bf16": 1e-2}
RESUME_STEPS = 12


def spec_for(refdir, arch, precision, steps=None, every=0):
    ref = json.load(open(os.path.join(refdir, arch, "ref.json")))
    hp = dict(ref["hyperparameters"])
    if steps:
        hp["max_steps"] = steps
    spec = {"name": f"gpu-{arch}-{precision}", "model": {"path": os.path.join(refdir, arch, "model")},
            "dataset": {"train": os.path.join(refdir, arch, "train.jsonl"), "format": "tokens"},
            "method": "full", "hyperparameters": hp, "precision": precision,
            "resources": {"gpus": 1, "backend": "cuda"}, "checkpoint": {"every_steps": every}}
    return spec, ref["losses"]


def start(engine, spec, work, env, resume=None):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    sp = os.path.join(work, "spec.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    cmd = [engine, "--spec", sp, "--workdir", work] + (["--resume", resume] if resume else [])
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(os.path.join(work, "stderr"), "w"),
                            text=True, env=env)


def events_of(p, deadline, on_metric=None):
    evs = []
    for line in p.stdout:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        evs.append(e)
        if e.get("ev") == "metric" and on_metric:
            on_metric(e)
        if time.monotonic() > deadline:
            p.kill()
            break
    p.wait()
    return evs


def run(engine, spec, work, env, deadline, resume=None, on_metric=None):
    p = start(engine, spec, work, env, resume)
    evs = events_of(p, deadline, on_metric)
    done = [e for e in evs if e.get("ev") == "done"]
    err = [e.get("message") for e in evs if e.get("ev") == "error"]
    status = done[-1]["status"] if done else "no done event"
    if p.returncode != 0 or err:
        raise RuntimeError(f"engine exit {p.returncode}, {status}: {err or open(os.path.join(work, 'stderr')).read()[-400:]}")
    return evs, status


def metrics(evs):
    return {e["step"]: e for e in evs if e.get("ev") == "metric"}


def exported(work):
    d = os.path.join(work, "export")
    out = {}
    for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if n.endswith(".safetensors"):
            out[n] = open(os.path.join(d, n), "rb").read()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("refdir")
    ap.add_argument("work")
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--budget", type=float, default=240)
    a = ap.parse_args()
    env = dict(os.environ)
    if a.dry:
        env.update(TY_KERNELS="cuda-emu", OMP_NUM_THREADS="1")
    deadline = time.monotonic() + a.budget
    resume_steps = 3 if a.dry else RESUME_STEPS  # emulation speed: fewer steps
    refdir = os.path.abspath(a.refdir)
    results = []

    def record(ok, name, detail):
        line = f"{'PASS' if ok else 'FAIL'} {name} {detail}"
        print(line, flush=True)
        results.append(ok)

    for arch in ("gpt2", "llama"):
        for prec in ("fp32", "bf16"):
            name = f"model.ref.{arch}.{prec}"
            try:
                spec, want = spec_for(refdir, arch, prec)
                evs, status = run(a.engine, spec, os.path.join(a.work, name), env, deadline)
                got = metrics(evs)
                st = [e for e in evs if e.get("ev") == "started"]
                where = (st[0].get("gpu") or {}).get("name", st[0].get("backend")) if st else "?"
                if sorted(got) != list(range(1, len(want) + 1)):
                    raise RuntimeError(f"steps {sorted(got)} for {len(want)} reference steps ({status})")
                rel = [abs(got[i + 1]["loss"] - w) / abs(w) for i, w in enumerate(want)]
                record(max(rel) <= TOL[prec], name,
                       f"on {where}: {len(want)} steps, max rel loss error {max(rel):.2e} (tolerance "
                       f"{TOL[prec]:.0e}); engine {['%.6f' % got[i + 1]['loss'] for i in range(len(want))]} "
                       f"torch {['%.6f' % w for w in want]}")
            except (RuntimeError, OSError, KeyError, ValueError) as e:
                record(False, name, str(e)[:600])

    name = "model.resume.gpt2.bf16"
    try:
        spec, _ = spec_for(refdir, "gpt2", "bf16", steps=resume_steps, every=0)
        wa, wb, wc = (os.path.join(a.work, name + s) for s in ("-whole", "-stopped", "-resumed"))
        evs_a, _ = run(a.engine, spec, wa, env, deadline)
        sent = []

        def stop(e, holder=sent):
            if not holder:
                holder.append(e["step"])
                os.kill(procs[-1].pid, signal.SIGTERM)

        procs = [start(a.engine, spec, wb, env)]
        evs_b = events_of(procs[-1], deadline, stop)
        done_b = [e for e in evs_b if e.get("ev") == "done"]
        if not done_b or done_b[-1]["status"] != "stopped":
            raise RuntimeError(f"the SIGTERMed run did not stop mid-run: {done_b}")
        stopped = max(metrics(evs_b))
        ck = os.path.join(wb, "checkpoints", "step-%06d" % stopped)
        if not os.path.isdir(ck):
            raise RuntimeError(f"no checkpoint {ck} after SIGTERM at step {stopped}")
        evs_c, status_c = run(a.engine, spec, wc, env, deadline, resume=ck)
        ma, mb, mc = metrics(evs_a), metrics(evs_b), metrics(evs_c)
        keys = ("loss", "grad_norm", "lr")
        same_b = all(ma[s][k] == mb[s][k] for s in mb for k in keys)
        same_c = sorted(mc) == list(range(stopped + 1, resume_steps + 1)) and all(
            ma[s][k] == mc[s][k] for s in mc for k in keys)
        ea, ec = exported(wa), exported(wc)
        same_w = bool(ea) and ea == ec
        record(same_b and same_c and same_w, name,
               f"SIGTERM after step {sent[0] if sent else '?'}, stopped at step {stopped}, resumed steps "
               f"{min(mc) if mc else '-'}..{max(mc) if mc else '-'} ({status_c}): losses/grad norms "
               f"{'identical' if same_b and same_c else 'DIFFER'}, exported weights "
               f"{'identical' if same_w else 'DIFFER'} ({sum(len(v) for v in ea.values())} bytes)")
    except (RuntimeError, OSError, KeyError, ValueError) as e:
        record(False, name, str(e)[:600])
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
