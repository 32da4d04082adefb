# check.py — one engine-vs-PyTorch case (ctest engine_ref.<case>): writes a
# random Hugging Face model, a "tokens" dataset and a job spec into a fresh
# temp dir, runs trainyard-engine on it and the PyTorch reference on the same
# files, and requires every step's loss to agree to 1e-4 relative.
#
# Usage: check.py --engine PATH --case NAME [--keep]
# In most cases the dataset holds exactly batch_size x grad_accum examples, so
# each optimizer step is one whole epoch and the comparison does not depend on
# the engine's shuffle; the *_shuffle cases hold 13 examples for 4 per step and
# follow the permutation engine/data.h documents. The resume case instead
# compares the engine with itself: an interrupted-and-resumed run must print
# the same losses as a straight one, bit for bit.
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hfgen      # noqa: E402
import torchref   # noqa: E402

REL_TOL = 1e-4
ENGINE_TIMEOUT_S = 300


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


# ---- running the engine --------------------------------------------------------

def engine_cmd(engine, spec_path, workdir, resume=None):
    # The engine writes events to fd 3: point it at our pipe, send its stdout to
    # stderr so a stray print cannot be mistaken for an event.
    cmd = ["/bin/bash", "-c", 'exec "$0" "$@" 3>&1 1>&2', engine, "--spec", spec_path,
           "--workdir", workdir]
    if resume:
        cmd += ["--resume", resume]
    return cmd


def parse_event(line, where):
    try:
        ev = json.loads(line)
    except ValueError:
        fail(f"{where}: event line is not JSON: {line!r}")
    if not isinstance(ev, dict) or "ev" not in ev:
        fail(f"{where}: event without 'ev': {line!r}")
    return ev


def run_engine(engine, spec_path, workdir, resume=None, stop_at_step=None):
    """Runs the engine to completion; returns (exit code, events, stderr text).
    stop_at_step: send SIGTERM once that step's metric event has arrived."""
    os.makedirs(workdir, exist_ok=True)
    errf = open(os.path.join(workdir, "..", os.path.basename(workdir) + ".stderr"), "w+")
    proc = subprocess.Popen(engine_cmd(engine, spec_path, workdir, resume), stdout=subprocess.PIPE,
                            stderr=errf, text=True)
    events, signalled = [], False
    # A hung engine must not hang the test (nor outlive it).
    watchdog = threading.Timer(ENGINE_TIMEOUT_S, proc.kill)
    watchdog.start()
    try:
        for line in proc.stdout:
            if not line.strip():
                continue
            ev = parse_event(line, spec_path)
            events.append(ev)
            if (stop_at_step is not None and not signalled and ev["ev"] == "metric"
                    and ev.get("step") == stop_at_step):
                proc.send_signal(signal.SIGTERM)
                signalled = True
        rc = proc.wait(timeout=ENGINE_TIMEOUT_S)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    errf.seek(0)
    err = errf.read()
    errf.close()
    return rc, events, err


def metrics_of(events):
    return [e for e in events if e["ev"] == "metric"]


def expect_success(rc, events, err, what, status="succeeded"):
    done = [e for e in events if e["ev"] == "done"]
    errors = [e for e in events if e["ev"] == "error"]
    if rc != 0 or errors or not done or done[-1].get("status") != status:
        tail = "\n".join(err.strip().splitlines()[-15:])
        fail(f"{what}: exit {rc}, errors {errors}, done {done} (wanted status {status})\n"
             f"--- engine stderr (tail) ---\n{tail}")


# ---- cases ---------------------------------------------------------------------

CASES = {
    # name: (family, config kwargs, tensor kwargs, spec kwargs)
    "gpt2": ("gpt2", {"n_embd": 32, "n_head": 4, "vocab_size": 97}, {}, {"schedule": "cosine"}),
    "gpt2_prefix": ("gpt2", {"n_embd": 48, "n_head": 4, "vocab_size": 211},
                    {"prefix": "transformer."}, {"schedule": "linear", "warmup_steps": 1}),
    "llama_gqa": ("llama", {"hidden": 32, "inter": 64, "heads": 4, "kv_heads": 2, "vocab": 211},
                  {}, {"schedule": "cosine"}),
    "llama_tied": ("llama", {"hidden": 32, "inter": 48, "heads": 4, "kv_heads": 4, "vocab": 97,
                             "tied": True, "theta": 500000.0}, {}, {"schedule": "constant"}),
    "qwen2_bias": ("llama", {"hidden": 32, "inter": 64, "heads": 4, "kv_heads": 1, "vocab": 97,
                             "tied": True, "model_type": "qwen2"}, {},
                   {"schedule": "cosine", "warmup_steps": 0}),
    # seq_len = n_positions (every position row used), one row per
    # micro-batch, 4 micro-batches, tighter clipping, no weight decay.
    "gpt2_fullctx": ("gpt2", {"n_embd": 32, "n_head": 2, "vocab_size": 97, "n_positions": 24},
                     {}, {"seq_len": 24, "batch_size": 1, "grad_accum": 4, "max_grad_norm": 0.5,
                          "weight_decay": 0.0, "schedule": "cosine", "warmup_steps": 3}),
    "mistral_mqa": ("llama", {"hidden": 48, "inter": 80, "heads": 6, "kv_heads": 1, "vocab": 97,
                              "model_type": "mistral"}, {}, {"schedule": "linear", "batch_size": 3,
                                                            "grad_accum": 1}),
    "llama_bf16_sharded": ("llama", {"hidden": 32, "inter": 64, "heads": 4, "kv_heads": 2,
                                     "vocab": 211}, {"dtype": "BF16", "shards": 2},
                           {"schedule": "linear", "max_grad_norm": 0.0}),
}

SEQ_LEN, BATCH, ACCUM, STEPS = 16, 2, 2, 6

# Cases whose dataset spans several steps, so the engine's documented
# per-epoch shuffle (engine/data.h) decides which examples each step sees.
SHUFFLED = {"gpt2_shuffle": "gpt2", "llama_shuffle": "llama_gqa"}
# Cases that also give an eval file: `eval` events checked against torch.
EVAL_CASES = {"llama_gqa", "gpt2_shuffle"}


def build_case(tmp, name, seed=11, n_examples=None, steps=STEPS, every_steps=0, extra=None):
    """extra: top-level spec fields to set (precision, export, ...)."""
    family, ckw, tkw, skw = CASES[SHUFFLED.get(name, name)]
    g = torch.Generator().manual_seed(seed)
    model_dir = os.path.join(tmp, "model")
    tkw, skw = dict(tkw), dict(skw)
    dtype, shards = tkw.pop("dtype", "F32"), tkw.pop("shards", 1)
    T, B, A = skw.pop("seq_len", SEQ_LEN), skw.pop("batch_size", BATCH), skw.pop("grad_accum", ACCUM)
    if family == "gpt2":
        cfg = hfgen.gpt2_config(n_layer=2, **dict({"n_positions": 64}, **ckw))
        tensors = hfgen.gpt2_tensors(cfg, g, **tkw)
    else:
        cfg = hfgen.llama_config(layers=2, max_pos=64, **ckw)
        tensors = hfgen.llama_tensors(cfg, g, **tkw)
    hfgen.write_model(model_dir, cfg, tensors, dtype=dtype, shards=shards)
    data = os.path.join(tmp, "train.jsonl")
    hfgen.write_tokens_dataset(data, n_examples or B * A, cfg["vocab_size"], T, g)
    spec = hfgen.job_spec(model_dir, data, steps, B, T, grad_accum=A,
                          every_steps=every_steps, name=f"engine-ref-{name}", **skw)
    if name in EVAL_CASES:
        # 5 eval examples: not a multiple of batch_size, some padded, some cut.
        spec["dataset"]["eval"] = os.path.join(tmp, "eval.jsonl")
        spec["hyperparameters"]["eval_every_steps"] = 3
        hfgen.write_tokens_dataset(spec["dataset"]["eval"], 5, cfg["vocab_size"], SEQ_LEN, g)
    spec.update(extra or {})
    spec_path = os.path.join(tmp, "spec.json")
    hfgen.write_json(spec_path, spec)
    return spec, spec_path


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def compare(name, spec, got, order=torchref.identity_order, final=None, got_evals=None):
    evals = {}
    ref = torchref.train(spec, order=order, final=final, evals=evals)
    print(f"{'step':>4} {'engine loss':>14} {'torch loss':>14} {'rel':>9}  "
          f"{'engine lr':>10} {'torch lr':>10}  {'engine gnorm':>12} {'torch gnorm':>12}")
    bad = []
    by_step = {m["step"]: m for m in got}
    for r in ref:
        m = by_step.get(r["step"])
        if m is None:
            bad.append(f"step {r['step']}: no metric event")
            continue
        e = rel(m["loss"], r["loss"])
        print(f"{r['step']:>4} {m['loss']:>14.8f} {r['loss']:>14.8f} {e:>9.2e}  "
              f"{m.get('lr', float('nan')):>10.3e} {r['lr']:>10.3e}  "
              f"{m.get('grad_norm', float('nan')):>12.6f} {r['grad_norm']:>12.6f}")
        if e > REL_TOL:
            bad.append(f"step {r['step']}: loss {m['loss']!r} vs torch {r['loss']!r} (rel {e:.2e})")
        if "grad_norm" not in m or rel(m["grad_norm"], r["grad_norm"]) > REL_TOL:
            bad.append(f"step {r['step']}: grad_norm {m.get('grad_norm')!r} vs torch {r['grad_norm']!r}")
        if "lr" not in m or abs(m["lr"] - r["lr"]) > 1e-6 * hp_lr(spec) + 1e-12:
            bad.append(f"step {r['step']}: lr {m.get('lr')!r} vs torch {r['lr']!r}")
    if len(got) != len(ref):
        bad.append(f"{len(got)} metric events for {len(ref)} steps")
    got_evals = {e["step"]: e["loss"] for e in got_evals or []}
    if sorted(got_evals) != sorted(evals):
        bad.append(f"eval events at steps {sorted(got_evals)}, expected {sorted(evals)}")
    for k in sorted(set(evals) & set(got_evals)):
        print(f"eval step {k}: engine {got_evals[k]:.8f} torch {evals[k]:.8f}")
        if rel(got_evals[k], evals[k]) > REL_TOL:
            bad.append(f"eval at step {k}: {got_evals[k]!r} vs torch {evals[k]!r}")
    if bad:
        diagnose(spec, got, ref, order)
        fail(f"{name}: " + "; ".join(bad))
    print(f"{name}: {len(ref)} steps agree with PyTorch to {REL_TOL:g} relative")


def hp_lr(spec):
    return spec["hyperparameters"]["lr"]


def diagnose(spec, got, ref, order):
    """Names the likely culprit: the schedule's step numbering or the model."""
    if got and rel(got[0]["loss"], ref[0]["loss"]) > REL_TOL:
        print("diagnosis: step 1 already differs, before any update: the forward pass or the "
              "loss definition (data shift, padding, mean over tokens) disagrees")
        return
    alt = torchref.train(spec, lr_offset=1, order=order)
    if all(rel(m["loss"], a["loss"]) <= REL_TOL for m, a in zip(got, alt)):
        print("diagnosis: the engine matches the reference with lr_lambda(k) for step k; "
              "HF (and the reference) use lr_lambda(k-1), so the first update has warmup lr 0")
        return
    print("diagnosis: step 1 agrees, later steps do not: the gradients, clipping or the "
          "AdamW update (decay groups, bias correction) disagree")


def check_metric_fields(name, metrics):
    """DESIGN §5's metric fields: a growing token count, a positive rate and
    memory figure on every event."""
    last = 0
    for m in metrics:
        missing = [k for k in ("step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s",
                               "mem_bytes") if k not in m]
        if missing:
            fail(f"{name}: metric event {m} lacks {missing}")
        if not (isinstance(m["tokens"], int) and m["tokens"] > last and m["tokens_per_s"] > 0
                and isinstance(m["mem_bytes"], int) and m["mem_bytes"] > 0):
            fail(f"{name}: metric event {m}: tokens must grow, tokens_per_s and mem_bytes be > 0")
        last = m["tokens"]


def check_export(name, spec, export_dir, final):
    """The exported HF directory holds the trained weights: same names (up to
    GPT-2's optional `transformer.` prefix), same HF layouts, values equal to
    the reference's after the same steps, and the same config."""
    with open(os.path.join(spec["model"]["path"], "config.json")) as f:
        cfg_in = json.load(f)
    try:
        with open(os.path.join(export_dir, "config.json")) as f:
            cfg_out = json.load(f)
        got = hfgen.read_model_weights(export_dir)
    except (OSError, ValueError) as e:
        fail(f"{name}: cannot read the export in {export_dir}: {e}")
    keys = [k for k in cfg_in if k not in ("architectures", "n_ctx")]
    wrong = [f"{k}: {cfg_out.get(k)!r} (input {cfg_in[k]!r})" for k in keys
             if cfg_out.get(k, cfg_in[k] if k == "tie_word_embeddings" else None) != cfg_in[k]]
    if wrong:
        fail(f"{name}: exported config.json differs: " + "; ".join(wrong))
    if cfg_in["model_type"] == "gpt2":
        got = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in got.items()}
    if set(got) != set(final):
        fail(f"{name}: exported tensors {sorted(set(got) ^ set(final))} differ from the model's")
    worst, total, outliers, sum_diff = 0.0, 0, 0, 0.0
    hp = spec["hyperparameters"]
    for k, want in final.items():
        if tuple(got[k].shape) != tuple(want.shape):
            fail(f"{name}: exported {k} has shape {list(got[k].shape)}, HF layout is {list(want.shape)}")
        diff = (got[k] - want.detach()).abs()
        if k.endswith("attn.c_attn.bias"):
            # The key bias adds the same q.b to every score of a query, which
            # softmax ignores: its true gradient is 0 and both sides feed
            # rounding noise to Adam, which turns it into steps of up to lr.
            # Only bound it by the largest possible Adam travel.
            C = want.shape[0] // 3
            if float(diff[C:2 * C].max()) > hp["lr"] * hp["max_steps"] * 1.01:
                fail(f"{name}: exported {k} key part moved more than Adam can")
            diff = torch.cat((diff[:C], diff[2 * C:]))
        worst = max(worst, float(diff.max()))
        total += diff.numel()
        outliers += int((diff > 1e-4).sum())
        sum_diff += float(diff.sum())
    # A weight whose gradient is nearly 0 gets Adam steps of up to lr from
    # rounding noise alone, so a rare element may stray; a real defect
    # (layout, decay group, update rule) moves whole tensors.
    if outliers > max(1, total // 1000) or sum_diff / total > 1e-6:
        fail(f"{name}: exported weights differ from PyTorch's trained weights: {outliers} of "
             f"{total} by more than 1e-4, mean abs diff {sum_diff / total:.1e}, max {worst:.1e}")
    print(f"{name}: export matches PyTorch's trained weights (mean abs diff {sum_diff / total:.1e}, "
          f"max {worst:.1e}, {outliers} beyond 1e-4)")


def case_compare(engine, name, keep):
    tmp = tempfile.mkdtemp(prefix=f"engine_ref_{name}_")
    try:
        shuffled = name in SHUFFLED
        # 13 examples for 4 per step: epochs end mid-step and are reshuffled.
        spec, spec_path = build_case(tmp, name, n_examples=3 * BATCH * ACCUM + 1 if shuffled else None,
                                     steps=8 if shuffled else STEPS)
        rc, events, err = run_engine(engine, spec_path, os.path.join(tmp, "work"))
        expect_success(rc, events, err, name)
        started = [e for e in events if e["ev"] == "started"]
        if not started:
            fail(f"{name}: no started event")
        n_params = sum(t.numel() for t in torchref.load_model(spec["model"]["path"])[1].values())
        st = started[0]
        if (st.get("params"), st.get("trainable"), st.get("world"), st.get("backend")) != \
                (n_params, n_params, 1, "cpu"):
            fail(f"{name}: started event {st}; wanted params = trainable = {n_params} (full "
                 "fine-tuning), world 1, backend cpu")
        check_metric_fields(name, metrics_of(events))
        final = {}
        compare(name, spec, metrics_of(events),
                torchref.engine_order if shuffled else torchref.identity_order, final,
                [e for e in events if e["ev"] == "eval"])
        check_export(name, spec, os.path.join(tmp, "work", "export"), final)
    finally:
        if keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def state_of(m):
    """What must match bit for bit between a straight and a resumed run."""
    return (m["loss"], m.get("grad_norm"), m.get("loss_scale"), m.get("skipped_steps"))


def case_resume(engine, keep, precision="fp32"):
    """20 steps straight vs 10 steps + SIGTERM + resume: identical losses
    (and, in any precision, identical loss scales and skipped counts)."""
    tmp = tempfile.mkdtemp(prefix=f"engine_ref_resume_{precision}_")
    try:
        # More examples than one step, so the data cursor and the per-epoch
        # shuffle state must survive the restart too.
        # every_steps 7: the straight run also leaves periodic checkpoints.
        spec, spec_path = build_case(tmp, "llama_gqa", n_examples=3 * BATCH * ACCUM + 1, steps=20,
                                     every_steps=7, extra={"precision": precision})
        rc, ev_a, err = run_engine(engine, spec_path, os.path.join(tmp, "straight"))
        expect_success(rc, ev_a, err, "straight run")
        straight = {m["step"]: state_of(m) for m in metrics_of(ev_a)}
        if sorted(straight) != list(range(1, 21)):
            fail(f"straight run: metric steps {sorted(straight)}, wanted 1..20")

        # SIGTERM once step 10's metric is read. The engine keeps training
        # meanwhile and stops at the next step boundary, so it may stop after
        # step 10 or a little later; any stop point must resume exactly. On a
        # loaded machine it can even finish first: then try an earlier step.
        for attempt, stop_at in enumerate((10, 4, 1)):
            work = os.path.join(tmp, f"interrupted{attempt}")
            rc, ev_b, err = run_engine(engine, spec_path, work, stop_at_step=stop_at)
            done = [e for e in ev_b if e["ev"] == "done"]
            if not (rc == 0 and done and done[-1].get("status") == "succeeded"):
                break
            print(f"the engine finished all 20 steps before SIGTERM (sent at step {stop_at}) "
                  "took effect; retrying with an earlier signal")
        else:
            fail("the engine never stopped on SIGTERM")
        expect_success(rc, ev_b, err, "interrupted run", status="stopped")
        first = {m["step"]: state_of(m) for m in metrics_of(ev_b)}
        stop = max(first)
        ckpts = [e for e in ev_b if e["ev"] == "checkpoint"]
        if not ckpts or ckpts[-1].get("step") != stop:
            fail(f"interrupted run stopped after step {stop} but its checkpoint events are {ckpts}")
        ck = ckpts[-1]["dir"]
        ck = ck if os.path.isabs(ck) else os.path.join(work, ck)
        want_dir = os.path.join(work, "checkpoints", f"step-{stop:06d}")
        if os.path.realpath(ck) != os.path.realpath(want_dir):
            fail(f"checkpoint dir {ck}, DESIGN §6 names it {want_dir}")
        if not os.path.exists(os.path.join(ck, "MANIFEST.json")):
            fail(f"{ck} has no MANIFEST.json")
        print(f"SIGTERM at step {stop_at}'s metric; the engine stopped after step {stop} -> {ck}")

        rc, ev_c, err = run_engine(engine, spec_path, work, resume=ck)
        expect_success(rc, ev_c, err, "resumed run")
        second = {m["step"]: state_of(m) for m in metrics_of(ev_c)}
        if sorted(second) != list(range(stop + 1, 21)):
            fail(f"resumed run: metric steps {sorted(second)}, wanted {stop + 1}..20")
        combined = {**first, **second}
        diffs = [f"step {k}: {combined[k]!r} vs straight {straight[k]!r}"
                 for k in range(1, 21) if combined[k] != straight[k]]
        for k in range(1, 21):
            print(f"{k:>3} {straight[k]!r:>22} {combined[k]!r:>22}"
                  f"{'' if combined[k] == straight[k] else '   <-- differs'}")
        if diffs:
            fail("resumed losses are not bit-identical: " + "; ".join(diffs))
        print(f"resume_exact: steps 1..{stop} + resume {stop + 1}..20 identical to 20 straight")

        # The same from a periodic checkpoint of the straight run, resumed
        # into a fresh work directory.
        periodic = os.path.join(tmp, "straight", "checkpoints", "step-000014")
        if not os.path.exists(os.path.join(periodic, "MANIFEST.json")):
            fail(f"checkpoint.every_steps 7 left no committed {periodic}")
        rc, ev_d, err = run_engine(engine, spec_path, os.path.join(tmp, "fresh"), resume=periodic)
        expect_success(rc, ev_d, err, "run resumed from the periodic checkpoint")
        third = {m["step"]: state_of(m) for m in metrics_of(ev_d)}
        if third != {k: straight[k] for k in range(15, 21)}:
            fail(f"resumed from step 14: losses {third} differ from the straight run's "
                 f"{ {k: straight[k] for k in range(15, 21)} }")
        print("resume_exact: resuming the periodic step-14 checkpoint in a fresh workdir gives "
              "steps 15..20 bit-identical too")
    finally:
        if keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--case", required=True, choices=sorted(CASES) + sorted(SHUFFLED) + ["resume_exact"])
    ap.add_argument("--keep", action="store_true", help="keep the temp dir for inspection")
    a = ap.parse_args()
    if not os.access(a.engine, os.X_OK):
        fail(f"engine binary {a.engine} is not executable")
    torch.set_num_threads(1)
    if a.case == "resume_exact":
        case_resume(a.engine, a.keep)
    else:
        case_compare(a.engine, a.case, a.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
