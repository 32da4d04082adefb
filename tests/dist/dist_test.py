#!/usr/bin/python3
# dist_test.py — data-parallel ranks of trainyard-engine on the CPU (ctest
# dist.*; docs/engine.md, Ranks). Usage: dist_test.py ENGINE CASE.
#
# Every multi-rank run goes through Open MPI's mpirun, as the server's local
# executor starts it. A tiny GPT-2 from model.init and a tokens dataset
# written here; standard library only.
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ENGINE = sys.argv[1]
CASE = sys.argv[2]
TMP = tempfile.mkdtemp(prefix=f"ty-dist-{CASE}-")
MPIRUN = shutil.which("mpirun") or "/usr/bin/mpirun"
ENV = dict(os.environ, OMP_NUM_THREADS="1")
for k in ("TY_WORLD_SIZE", "TY_RANK", "TY_LOCAL_RANK", "TY_EVENTS_PATH", "TY_SUPERVISOR_PID"):
    ENV.pop(k, None)
if os.geteuid() == 0:  # Open MPI refuses root without both
    ENV.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def fail(msg):
    print(f"FAIL [{CASE}]: {msg}")
    sys.exit(1)


def write_data(n=64, seed=1):
    rng = random.Random(seed)
    p = os.path.join(TMP, "train.jsonl")
    with open(p, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"input_ids": [rng.randrange(53) for _ in range(rng.randint(5, 20))]}) + "\n")
    return p


def write_spec(name="spec.json", **hp):
    h = {"max_steps": 6, "batch_size": 2, "grad_accum": 4, "seq_len": 16, "lr": 1e-2, "log_every_steps": 1,
         "seed": 3}
    h.update(hp)
    spec = {"model": {"init": {"model_type": "gpt2", "vocab_size": 53, "n_embd": 16, "n_layer": 2, "n_head": 2,
                               "n_positions": 32}},
            "dataset": {"train": write_data()}, "hyperparameters": h, "checkpoint": {"every_steps": 3}}
    p = os.path.join(TMP, name)
    with open(p, "w") as f:
        json.dump(spec, f)
    return p


def cmd(world, spec, workdir, resume=None):
    c = [ENGINE, "--spec", spec, "--workdir", os.path.join(TMP, workdir), "--threads", "1"]
    if resume:
        c += ["--resume", resume]
    if world == 1:
        return c
    return [MPIRUN, "-np", str(world), "--oversubscribe", "--bind-to", "none"] + c


def run(world, spec, workdir, resume=None, env=None):
    p = subprocess.run(cmd(world, spec, workdir, resume), capture_output=True, text=True, env=env or ENV,
                       timeout=120)
    events = []
    for line in p.stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            fail(f"world {world}: stdout line is not an event: {line!r}\nstderr:\n{p.stderr[-3000:]}")
    return p.returncode, events, p.stderr


def ok(res, what):
    rc, events, err = res
    if rc != 0 or not events or events[-1] != {"ev": "done", "status": "succeeded"}:
        fail(f"{what}: exit {rc}, last events {events[-3:]}\nstderr:\n{err[-3000:]}")
    return events


def losses(events):
    return {e["step"]: e["loss"] for e in events if e["ev"] == "metric"}


def close(a, b, what, rel=1e-6):
    if sorted(a) != sorted(b):
        fail(f"{what}: steps {sorted(a)} vs {sorted(b)}")
    for s in a:
        if abs(a[s] - b[s]) > rel * abs(a[s]):
            fail(f"{what}: step {s} loss {a[s]!r} vs {b[s]!r} (relative {abs(a[s] - b[s]) / abs(a[s]):.2e})")


def case_losses():
    """World 1, 2 and 4 see the same global batches: the same losses step by
    step (the sums over ranks add in another order: within 1e-6 relative),
    one event stream, the same tokens, rank 0's checkpoints and export."""
    spec = write_spec()
    ref = ok(run(1, spec, "w1"), "world 1")
    for world in (2, 4):
        ev = ok(run(world, spec, f"w{world}"), f"world {world}")
        if ev[0]["ev"] != "started" or ev[0]["world"] != world:
            fail(f"world {world}: started event {ev[0]}")
        if sum(1 for e in ev if e["ev"] == "started") != 1:
            fail(f"world {world}: more than one event stream on stdout")
        close(losses(ref), losses(ev), f"world 1 vs {world}")
        tok = [e["tokens"] for e in ev if e["ev"] == "metric"]
        if tok != [e["tokens"] for e in ref if e["ev"] == "metric"]:
            fail(f"world {world}: tokens {tok}")
        d = os.path.join(TMP, f"w{world}")
        if sorted(os.listdir(os.path.join(d, "checkpoints"))) != ["step-000003", "step-000006"] or \
                not os.path.exists(os.path.join(d, "export", "model.safetensors")):
            fail(f"world {world}: checkpoints/export {os.listdir(d)}")
        worst = max(abs(losses(ref)[s] - losses(ev)[s]) / losses(ref)[s] for s in losses(ref))
        print(f"ok: world 1 vs {world}: 6 steps, largest relative loss difference {worst:.2e}")


def case_resume_world():
    """A checkpoint written by one world size resumes under another and
    continues as the uninterrupted run does."""
    spec = write_spec()
    ref = losses(ok(run(1, spec, "w1"), "world 1"))
    for (a, b) in ((1, 2), (4, 1), (2, 4)):
        wd = f"from{a}"
        if not os.path.isdir(os.path.join(TMP, wd)):
            ok(run(a, spec, wd), f"world {a}")
        ck = os.path.join(TMP, wd, "checkpoints", "step-000003")
        ev = ok(run(b, spec, f"{a}to{b}", resume=ck), f"world {a} -> {b}")
        got = losses(ev)
        if sorted(got) != [4, 5, 6]:
            fail(f"world {a} -> {b}: steps {sorted(got)}")
        close({s: ref[s] for s in got}, got, f"resume world {a} -> {b}")
        print(f"ok: checkpoint of world {a} resumed by world {b}")


def rank_pids(launcher):
    """{rank: pid} of the engines under an mpirun."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
            out[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(pid)
        except (OSError, KeyError, IndexError, ValueError):
            pass
    return out


def stop_run(world, how):
    """Starts a long run, waits for step 2, delivers the stop `how`, and
    checks every rank stopped after the same step with one checkpoint."""
    spec = write_spec(f"spec-{how}.json", max_steps=100000)
    wd = os.path.join(TMP, f"stop-{how}")
    log = open(os.path.join(TMP, f"stop-{how}.err"), "w")
    p = subprocess.Popen(cmd(world, spec, f"stop-{how}"), stdout=subprocess.PIPE, stderr=log, text=True, env=ENV,
                         start_new_session=True)
    events = []
    try:
        deadline = time.monotonic() + 90
        for line in p.stdout:
            events.append(json.loads(line))
            if events[-1]["ev"] == "metric" and events[-1]["step"] >= 2:
                break
            if time.monotonic() > deadline:
                fail("no step 2 within 90 s")
        pids = {}
        while len(pids) < world and time.monotonic() < deadline:
            pids = rank_pids(p.pid)
        if len(pids) != world:
            fail(f"found ranks {pids}")
        if how == "usr1-launcher":
            os.kill(p.pid, signal.SIGUSR1)      # what the server does; mpirun forwards it
        elif how == "term-rank1":
            os.kill(pids[1], signal.SIGTERM)    # one rank only (a scancel of one task)
        for line in p.stdout:
            events.append(json.loads(line))
        rc = p.wait(timeout=90)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        log.close()
    err = open(os.path.join(TMP, f"stop-{how}.err")).read()
    if rc != 0 or events[-1] != {"ev": "done", "status": "stopped"}:
        fail(f"{how}: exit {rc}, last events {events[-3:]}\n{err[-2000:]}")
    last = max(e["step"] for e in events if e["ev"] == "metric")
    stops = sorted(int(l.split()[-1]) for l in err.splitlines() if " stopped at step " in l)
    if stops != [last] * world:
        fail(f"{how}: ranks stopped at steps {stops}, last metric step {last}\n{err[-2000:]}")
    cks = [e for e in events if e["ev"] == "checkpoint"]
    if not cks or cks[-1]["step"] != last or \
            not os.path.exists(os.path.join(wd, "checkpoints", f"step-{last:06d}", "MANIFEST.json")):
        fail(f"{how}: final checkpoint {cks[-1:]} for step {last}")
    print(f"ok: {how}: all {world} ranks stopped after step {last}, checkpoint written")
    return last


def case_sigterm():
    stop_run(2, "usr1-launcher")
    stop_run(2, "term-rank1")


def case_bad():
    spec = write_spec()
    # A rank started without its launcher fails at once rather than waiting.
    env = dict(ENV, TY_WORLD_SIZE="2", TY_RANK="0")
    rc, ev, err = run(1, spec, "alone", env=env)
    if rc != 2 or not ev or ev[-1]["ev"] != "error" or "no MPI launcher" not in ev[-1]["message"]:
        fail(f"rank without a launcher: exit {rc}, events {ev}\n{err}")
    # The global batch must split evenly over the ranks.
    rc, ev, err = run(2, write_spec("odd.json", batch_size=3, grad_accum=1), "odd")
    if rc == 0 or not ev or ev[-1]["ev"] != "error" or "does not divide the global batch" not in ev[-1]["message"]:
        fail(f"batch 3 over 2 ranks: exit {rc}, events {ev}\n{err[-2000:]}")
    # Bad rank variables.
    rc, ev, err = run(1, spec, "badenv", env=dict(ENV, TY_WORLD_SIZE="2", TY_RANK="2"))
    if rc != 2 or "bad rank environment" not in ev[-1]["message"]:
        fail(f"rank 2 of 2: exit {rc}, events {ev}")
    print("ok: no launcher, uneven batch and a bad rank are refused")


def case_events_path():
    """TY_EVENTS_PATH: rank 0's events go to that file (mpirun's ranks have
    no fd 3 of ours); stdout keeps nothing."""
    spec = write_spec(max_steps=2)
    path = os.path.join(TMP, "events.jsonl")
    rc, ev, err = run(2, spec, "evp", env=dict(ENV, TY_EVENTS_PATH=path))
    got = [json.loads(l) for l in open(path)]
    if rc != 0 or ev or got[0]["ev"] != "started" or got[-1] != {"ev": "done", "status": "succeeded"}:
        fail(f"events path: exit {rc}, stdout events {ev}, file {got[-2:]}\n{err[-2000:]}")
    print(f"ok: {len(got)} events in TY_EVENTS_PATH, none on stdout")


def write_zero_spec(name, zero, **hp):
    p = write_spec(name, **hp)
    spec = json.load(open(p))
    spec["resources"] = {"zero": zero}
    with open(p, "w") as f:
        json.dump(spec, f)
    return p


def case_zero():
    """ZeRO-1: the same world with the moments sharded gives bit-identical
    losses and an identical checkpoint (gathered on rank 0); its checkpoint
    resumes unsharded at world 1 and sharded at world 4; LoRA is refused."""
    plain, zero = write_zero_spec("plain.json", 0), write_zero_spec("zero.json", 1)
    ref1 = losses(ok(run(1, plain, "p1"), "world 1"))
    for world in (1, 2):
        a = losses(ok(run(world, plain, f"plain{world}"), f"world {world}"))
        b = losses(ok(run(world, zero, f"zero{world}"), f"world {world} zero"))
        if a != b:
            fail(f"world {world}: zero 1 losses {b} differ from zero 0 {a}")
        for f in ("optimizer.safetensors", "model.safetensors"):
            x = open(os.path.join(TMP, f"plain{world}", "checkpoints", "step-000006", f), "rb").read()
            y = open(os.path.join(TMP, f"zero{world}", "checkpoints", "step-000006", f), "rb").read()
            if x != y:
                fail(f"world {world}: {f} of the ZeRO-1 run differs from the unsharded one")
        if world == 2:
            _, _, err = run(2, zero, "zero2log")
            spans = sorted(tuple(int(x) for x in l.split("floats [")[1].split(")")[0].split(", "))
                           for l in err.splitlines() if "ZeRO-1: this rank keeps" in l)
            n = int(err.split("ZeRO-1: this rank keeps")[1].split(") of ")[1].split()[0])
            if len(spans) != 2 or spans[0][0] != 0 or spans[0][1] != spans[1][0] or spans[1][1] != n or \
                    not n // 3 < spans[0][1] < 2 * n // 3:
                fail(f"ZeRO-1 ranges over 2 ranks: {spans} of {n}")
        print(f"ok: world {world}: ZeRO-1 losses and checkpoint bit-identical")
    ck = os.path.join(TMP, "zero2", "checkpoints", "step-000003")
    for world, spec in ((1, plain), (4, zero)):
        got = losses(ok(run(world, spec, f"zres{world}", resume=ck), f"resume world {world}"))
        close({s: ref1[s] for s in got}, got, f"ZeRO-1 world 2 checkpoint resumed by world {world}")
    print("ok: a ZeRO-1 checkpoint resumes at world 1 (unsharded) and 4 (sharded)")
    lora = json.load(open(zero))
    lora["method"] = "lora"
    with open(os.path.join(TMP, "lora.json"), "w") as f:
        json.dump(lora, f)
    rc, ev, err = run(2, os.path.join(TMP, "lora.json"), "lora")
    if rc == 0 or not ev or "resources.zero" not in ev[-1].get("message", ""):
        fail(f"zero with lora: exit {rc}, events {ev[-1:]}")
    print("ok: zero with method lora refused")


def write_res_spec(name, resources=None, top=None, **hp):
    p = write_spec(name, **hp)
    spec = json.load(open(p))
    if resources:
        spec["resources"] = resources
    spec.update(top or {})
    with open(p, "w") as f:
        json.dump(spec, f)
    return p


def ckpt_bytes(wd, step=6):
    d = os.path.join(TMP, wd, "checkpoints", f"step-{step:06d}")
    return {f: open(os.path.join(d, f), "rb").read() for f in ("model.safetensors", "optimizer.safetensors")}


def case_bucket():
    """The gradient all-reduce in buckets overlapped with the backward
    (resources.bucket_kb): with 2 ranks each float is a + b whatever the
    bucketing, so 1 KiB buckets (about 30 here) give the same losses and
    checkpoint bits as one all-reduce after the backward (bucket_kb 0);
    with 4 ranks within 1e-6 of world 1; world 1 has no buckets."""
    one, tiny = write_res_spec("b0.json", {"bucket_kb": 0}), write_res_spec("b1.json", {"bucket_kb": 1})
    rc, ev1, err1 = run(1, tiny, "bw1")
    ref = losses(ok((rc, ev1, err1), "world 1"))
    if "gradient bucket" in err1:
        fail(f"world 1 set up buckets:\n{err1[-2000:]}")
    a = ok(run(2, one, "bw2one"), "world 2 bucket_kb 0")
    rc, ev, err = run(2, tiny, "bw2tiny")
    b = ok((rc, ev, err), "world 2 bucket_kb 1")
    if losses(a) != losses(b) or ckpt_bytes("bw2one") != ckpt_bytes("bw2tiny"):
        fail(f"world 2: bucketed losses {losses(b)} vs one all-reduce {losses(a)} (or checkpoints differ)")
    g = [l for l in err.splitlines() if "gradient bucket" in l]
    nb = int(g[0].split("data parallel: ")[1].split()[0]) if g else 0
    summ = [l for l in err.splitlines() if "buckets started during the backward" in l]
    if nb < 8 or len(summ) != 2 or f"{6 * nb} of {6 * nb} buckets started during the backward" not in summ[0] or \
            "exposed" not in summ[0]:
        fail(f"world 2 with 1 KiB buckets: {g[:1]} {summ}\n{err[-2000:]}")
    _, _, err0 = run(2, one, "bw2log")
    if "blocking after the backward" not in err0 or "gradient bucket" in err0:
        fail(f"bucket_kb 0 did not take the one all-reduce:\n{err0[-1500:]}")
    print(f"ok: world 2: {nb} buckets overlapped with the backward, losses and checkpoint bit-identical to one "
          "all-reduce")
    close(ref, losses(ok(run(4, tiny, "bw4"), "world 4 bucket_kb 1")), "world 1 vs world 4 with 1 KiB buckets")
    print("ok: world 4 with 1 KiB buckets within 1e-6 of world 1")
    # A GQA Llama (untied lm_head after the final norm) in bf16: the same.
    llama = {"model_type": "llama", "vocab_size": 53, "hidden_size": 24, "intermediate_size": 40,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 32}
    for name, kb in (("l0", 0), ("l1", 1)):
        p = write_res_spec(f"{name}.json", {"bucket_kb": kb}, {"precision": "bf16"})
        spec = json.load(open(p))
        spec["model"] = {"init": llama}
        with open(p, "w") as f:
            json.dump(spec, f)
    a = ok(run(2, os.path.join(TMP, "l0.json"), "bl0"), "llama world 2 bucket_kb 0")
    b = ok(run(2, os.path.join(TMP, "l1.json"), "bl1"), "llama world 2 bucket_kb 1")
    if losses(a) != losses(b) or ckpt_bytes("bl0") != ckpt_bytes("bl1"):
        fail(f"llama bf16 world 2: bucketed losses {losses(b)} vs one all-reduce {losses(a)} (or checkpoints)")
    print("ok: Llama in bf16, world 2: 1 KiB buckets bit-identical to one all-reduce")


def case_zero16():
    """ZeRO-1 with bf16 / fp16 storage shards the fp32 masters too: the
    same world with and without it gives bit-identical losses and
    checkpoints (gathered on rank 0); a world 1 checkpoint resumes sharded
    at world 2 exactly as unsharded, and a sharded world 2 checkpoint
    resumes at world 1."""
    for prec in ("bf16", "fp16"):
        plain = write_res_spec(f"p-{prec}.json", {"zero": 0}, {"precision": prec})
        zero = write_res_spec(f"z-{prec}.json", {"zero": 1}, {"precision": prec})
        a = ok(run(2, plain, f"p2{prec}"), f"{prec} world 2")
        rc, ev, err = run(2, zero, f"z2{prec}")
        b = ok((rc, ev, err), f"{prec} world 2 zero")
        if losses(a) != losses(b) or ckpt_bytes(f"p2{prec}") != ckpt_bytes(f"z2{prec}"):
            fail(f"{prec}: ZeRO-1 losses {losses(b)} vs {losses(a)} (or checkpoints differ)")
        x = open(os.path.join(TMP, f"p2{prec}", "export", "model.safetensors"), "rb").read()
        y = open(os.path.join(TMP, f"z2{prec}", "export", "model.safetensors"), "rb").read()
        if x != y or err.count("ZeRO-1: this rank keeps the moments and masters") != 2:
            fail(f"{prec}: export differs or masters not sharded\n{err[-2000:]}")
        print(f"ok: {prec}: ZeRO-1 with sharded masters bit-identical (losses, checkpoint, export)")
        if prec == "fp16":
            continue
        ok(run(1, plain, "p1bf16"), "bf16 world 1")
        ck1 = os.path.join(TMP, "p1bf16", "checkpoints", "step-000003")
        c = losses(ok(run(2, plain, "r12p", resume=ck1), "bf16 world 1 -> 2"))
        d = losses(ok(run(2, zero, "r12z", resume=ck1), "bf16 world 1 -> 2 zero"))
        if c != d or ckpt_bytes("r12p") != ckpt_bytes("r12z"):
            fail(f"bf16 resume 1 -> 2: zero {d} vs plain {c} (or checkpoints differ)")
        ck2 = os.path.join(TMP, "z2bf16", "checkpoints", "step-000003")
        e = losses(ok(run(1, plain, "r21", resume=ck2), "bf16 world 2 zero -> 1"))
        close({s: losses(a)[s] for s in e}, e, "bf16: the sharded world 2 checkpoint resumed at world 1")
        print("ok: bf16: resume 1 -> 2 with ZeRO-1 exact, 2 (ZeRO-1) -> 1 within 1e-6")


def sum_bytes(events):
    return {e["step"]: e.get("grad_sum_bytes") for e in events if e["ev"] == "metric"}


def norms(events):
    return {e["step"]: e["grad_norm"] for e in events if e["ev"] == "metric"}


def case_zero_rs():
    """ZeRO-1's gradient sum is a reduce-scatter: rank 0 receives only the
    other ranks' pieces of its own range, (N - 1) len0 floats a step, where
    the unsharded all-reduce (the same reduce-scatter, then the all-gather)
    receives n - len0 more. With 1 KiB buckets overlapped with the backward
    and with one sum after it, sharded or not, world 2 and 4 give the same
    losses, gradient norms and checkpoint bits (each float summed in rank
    order by its owner); fp16's skipped steps too."""
    for world in (2, 4):
        runs = {}
        for zero in (0, 1):
            for kb in (0, 1):
                name = f"rs{world}z{zero}b{kb}"
                p = write_res_spec(f"{name}.json", {"zero": zero, "bucket_kb": kb})
                rc, ev, err = run(world, p, name)
                runs[zero, kb] = (ok((rc, ev, err), f"world {world} zero {zero} bucket_kb {kb}"), err)
        ref, err = runs[0, 0]
        keep = [l for l in err.splitlines() if "ZeRO-1: this rank keeps" in l]
        if keep:
            fail(f"world {world} zero 0 sharded: {keep}")
        err = runs[1, 1][1]
        span = [l for l in err.splitlines() if "trainyard-engine[0]" in l and "ZeRO-1: this rank keeps" in l]
        if len(span) != 1 or "reduce-scattered (ZeRO-1) during the backward" not in err:
            fail(f"world {world} zero 1 bucket_kb 1: {span}\n{err[-2000:]}")
        a, b = span[0].split("floats [")[1].split(")")[0].split(", ")
        n = int(span[0].split(") of ")[1].split()[0])
        len0 = int(b) - int(a)
        want = {0: 4 * ((world - 1) * len0 + n - len0), 1: 4 * (world - 1) * len0}
        for (zero, kb), (ev, _) in runs.items():
            got = set(sum_bytes(ev).values())
            if got != {want[zero]}:
                fail(f"world {world} zero {zero} bucket_kb {kb}: grad_sum_bytes {got}, want {want[zero]}")
            if losses(ev) != losses(ref) or norms(ev) != norms(ref):
                fail(f"world {world} zero {zero} bucket_kb {kb}: losses {losses(ev)} norms {norms(ev)} vs "
                     f"{losses(ref)} {norms(ref)}")
            if ckpt_bytes(f"rs{world}z{zero}b{kb}") != ckpt_bytes(f"rs{world}z0b0"):
                fail(f"world {world} zero {zero} bucket_kb {kb}: checkpoint differs from zero 0 bucket_kb 0")
        share = want[1] / (4 * n * (world - 1) / world)
        if not 0.95 < share < 1.05 or want[0] < 1.9 * want[1]:
            fail(f"world {world}: reduce-scatter {want[1]} B, all-reduce {want[0]} B of n = {n}")
        print(f"ok: world {world}: ZeRO-1 receives {want[1]} B of gradients a step ({share:.3f} of "
              f"4 n (N-1)/N, n = {n}), the all-reduce {want[0]} B; losses, norms and checkpoints "
              "bit-identical with and without ZeRO-1 and buckets")
    # fp16 with the loss scale doubling every step: skipped steps, decided
    # from each rank's range with ZeRO-1, at the same steps as unsharded.
    env = dict(ENV, TY_TEST_SCALE_GROWTH_INTERVAL="1")
    got = {}
    for zero in (0, 1):
        p = write_res_spec(f"sk{zero}.json", {"zero": zero, "bucket_kb": 1}, {"precision": "fp16"}, max_steps=20)
        ev = ok(run(4, p, f"sk{zero}", env=env), f"fp16 world 4 zero {zero}")
        got[zero] = [(e["step"], e["loss"], e["grad_norm"], e["skipped_steps"]) for e in ev if e["ev"] == "metric"]
    if got[0] != got[1] or not got[0][-1][3] or ckpt_bytes("sk0", 20) != ckpt_bytes("sk1", 20):
        fail(f"fp16 world 4 skipped steps: zero 0 {got[0]} vs zero 1 {got[1]}")
    print(f"ok: fp16 world 4: {got[0][-1][3]} of 20 steps skipped at the same steps with and without ZeRO-1")


def case_gpu_nccl():
    """Two ranks on the (emulated) CUDA backend attach the NCCL path: with
    no libnccl to load (TY_NCCL names none) every rank stops at start with
    an error naming it, before any step (argv[3]: trainyard-engine-emu);
    with ZeRO-1 too (its all-gather is NCCL's on GPUs)."""
    emu = sys.argv[3]
    p = write_spec()
    spec = json.load(open(p))
    spec["resources"] = {"backend": "cuda", "gpus": 1}
    with open(p, "w") as f:
        json.dump(spec, f)
    cmd = [MPIRUN, "-np", "2", "--oversubscribe", "--bind-to", "none", emu, "--spec", p, "--workdir",
           os.path.join(TMP, "gpu"), "--threads", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(ENV, TY_NCCL="/nonexistent/libnccl.so.2"),
                       timeout=120)
    ev = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode == 0 or not ev or ev[-1]["ev"] != "error" or "nccl" not in ev[-1]["message"].lower() or \
            any(e["ev"] == "metric" for e in ev):
        fail(f"2 GPU ranks without libnccl: exit {r.returncode}, events {ev[-2:]}\n{r.stderr[-2000:]}")
    print(f"ok: GPU ranks refused without NCCL: {ev[-1]['message']}")
    # ZeRO-1 on GPU ranks takes the same path (its all-gather is NCCL's).
    spec["resources"]["zero"] = 1
    with open(p, "w") as f:
        json.dump(spec, f)
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(ENV, TY_NCCL="/nonexistent/libnccl.so.2"),
                       timeout=120)
    ev = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode == 0 or not ev or ev[-1]["ev"] != "error" or "nccl" not in ev[-1]["message"].lower():
        fail(f"ZeRO-1 on 2 GPU ranks without libnccl: exit {r.returncode}, events {ev[-2:]}\n{r.stderr[-2000:]}")
    print(f"ok: ZeRO-1 on GPU ranks reaches the NCCL attach: {ev[-1]['message']}")


CASES = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}

if __name__ == "__main__":
    try:
        if CASE not in CASES:
            fail(f"unknown case; known: {sorted(CASES)}")
        CASES[CASE]()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
