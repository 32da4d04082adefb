# mixed_check.py — bf16 / fp16 training checks (ctest engine_ref.mixed_*):
#
#   <family>_<precision>  24 steps of the engine against mixedref.py (the same
#                         precision scheme in PyTorch): every step's loss and
#                         grad norm within the precision's tolerance, the
#                         loss scale and skipped-step count equal; the export
#                         in the asked dtype holds the rounded final masters.
#   resume_<precision>    SIGTERM + resume is bit-exact (check.case_resume).
#   fp16_overflow         a planted large gradient (lm_head x 1000) makes
#                         fp16 gradients overflow: the engine skips those
#                         steps, halves the scale each time, then trains on;
#                         the reference agrees; the scale and the skipped
#                         count are in trainer_state.json and survive resume.
#   fp16_growth           with the test knob TY_TEST_SCALE_GROWTH_INTERVAL=3
#                         the scale doubles after every 3 clean steps (the
#                         real 2000 is engine.scaler's unit test), as the
#                         reference with the same interval; a resume from
#                         mid-interval keeps the growth tracker.
#
# Tolerances: relative, per step. bf16 keeps 8 significant bits, fp16 11;
# the engine and the reference round at the same points, so they differ only
# where an fp32 result lands on the other side of a 16-bit rounding
# boundary because the fp32 sums were added in another order.
import argparse
import json
import os
import shutil
import struct
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check      # noqa: E402
import hfgen      # noqa: E402
import mixedref   # noqa: E402

TOL = {"bf16": 5e-3, "fp16": 1e-3}
STEPS = 24
FAMILY = {"gpt2": "gpt2", "llama": "llama_gqa"}


def fail(msg):
    check.fail(msg)


def st_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def compare(name, prec, got, ref):
    tol = TOL[prec]
    by_step = {m["step"]: m for m in got}
    bad = []
    print(f"{'step':>4} {'engine loss':>14} {'torch loss':>14} {'rel':>9} {'engine gn':>10} {'torch gn':>10}"
          f" {'scale':>8} {'skip':>4}")
    for r in ref:
        m = by_step.get(r["step"])
        if m is None:
            bad.append(f"step {r['step']}: no metric event")
            continue
        e = check.rel(m["loss"], r["loss"])
        gn_e, gn_r = m.get("grad_norm"), r["grad_norm"]
        print(f"{r['step']:>4} {m['loss']:>14.8f} {r['loss']:>14.8f} {e:>9.2e} {gn_e or 0:>10.5f} "
              f"{gn_r or 0:>10.5f} {m.get('loss_scale'):>8g} {m.get('skipped_steps'):>4}")
        if e > tol:
            bad.append(f"step {r['step']}: loss {m['loss']!r} vs torch {r['loss']!r} (rel {e:.2e} > {tol:g})")
        if (gn_e is None) != (gn_r is None) or (gn_r is not None and check.rel(gn_e, gn_r) > 5 * tol):
            bad.append(f"step {r['step']}: grad_norm {gn_e!r} vs torch {gn_r!r}")
        if m.get("loss_scale") != r["loss_scale"] or m.get("skipped_steps") != r["skipped_steps"]:
            bad.append(f"step {r['step']}: loss_scale/skipped {m.get('loss_scale')}/{m.get('skipped_steps')} "
                       f"vs torch {r['loss_scale']}/{r['skipped_steps']}")
    if len(got) != len(ref):
        bad.append(f"{len(got)} metric events for {len(ref)} steps")
    if bad:
        fail(f"{name}: " + "; ".join(bad[:8]))
    print(f"{name}: {len(ref)} steps agree with the {prec} PyTorch reference to {tol:g} relative")


def check_export(name, export_dir, master, dt_name, prefix_fn):
    """The export holds round(final master) in the asked dtype, and its
    config.json says so."""
    st = st_header(os.path.join(export_dir, "model.safetensors"))
    want = {"bf16": "BF16", "fp16": "F16", "fp32": "F32"}[dt_name]
    dtypes = {v["dtype"] for k, v in st.items() if k != "__metadata__"}
    if dtypes != {want}:
        fail(f"{name}: export dtypes {dtypes}, wanted {want}")
    with open(os.path.join(export_dir, "config.json")) as f:
        tdt = json.load(f).get("torch_dtype")
    if tdt != {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dt_name]:
        fail(f"{name}: export config torch_dtype {tdt}")
    got = hfgen.read_safetensors(os.path.join(export_dir, "model.safetensors"))
    # Relative L2 distance over the whole model: the two runs' masters drift
    # apart a little over 24 steps (AdamW amplifies near-zero gradients such
    # as GPT-2's key bias), so single elements are not comparable; a wrong
    # dtype conversion, layout or tensor would be far off.
    num = den = 0.0
    for n, t in master.items():
        g = got.get(prefix_fn(n))
        if g is None or g.shape != t.shape:
            fail(f"{name}: export lacks {prefix_fn(n)} {tuple(t.shape)}")
        r = t.detach().to(mixedref.DTYPES.get(dt_name, torch.float32)).double()
        num += float(((g - r) ** 2).sum())
        den += float((r ** 2).sum())
    dist = (num / den) ** 0.5
    if dist > 0.03:
        fail(f"{name}: exported weights are {dist:.3g} (relative L2) from the reference's rounded masters")
    print(f"{name}: export is {want}, torch_dtype {tdt}, weights {dist:.2g} (relative L2) from round(master)")


def case_compare(engine, family, prec, keep):
    name = f"{family}_{prec}"
    tmp = tempfile.mkdtemp(prefix=f"engine_ref_mixed_{name}_")
    try:
        exp = "bf16" if prec == "fp16" else "fp16"  # export in the other 16-bit type
        spec, spec_path = check.build_case(tmp, FAMILY[family], steps=STEPS,
                                           extra={"precision": prec, "export": {"dtype": exp}})
        rc, events, err = check.run_engine(engine, spec_path, os.path.join(tmp, "work"))
        check.expect_success(rc, events, err, name)
        if f"fp32 storage" in err or f"{prec} storage" not in err:
            fail(f"{name}: the engine did not report {prec} storage")
        ref, master = mixedref.train(spec)
        compare(name, prec, check.metrics_of(events), ref)
        pre = "transformer." if family == "gpt2" else ""
        check_export(name, os.path.join(tmp, "work", "export"), master, exp,
                     lambda n: n if n.startswith("model.") or n.startswith("lm_head") else pre + n)
    finally:
        if keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def case_overflow(engine, keep):
    tmp = tempfile.mkdtemp(prefix="engine_ref_mixed_overflow_")
    try:
        spec, spec_path = check.build_case(tmp, "llama_gqa", steps=12, every_steps=6,
                                           extra={"precision": "fp16"})
        # Plant the large gradient: lm_head x 1000 in the model file itself.
        model_dir = spec["model"]["path"]
        w = hfgen.read_model_weights(model_dir)
        w["lm_head.weight"] = w["lm_head.weight"] * 1000.0
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        for fn in os.listdir(model_dir):
            if fn.endswith(".safetensors") or fn.endswith(".index.json"):
                os.unlink(os.path.join(model_dir, fn))
        hfgen.write_model(model_dir, cfg, {k: v.float() for k, v in w.items()})
        rc, events, err = check.run_engine(engine, spec_path, os.path.join(tmp, "work"))
        check.expect_success(rc, events, err, "fp16_overflow")
        got = check.metrics_of(events)
        ref, _ = mixedref.train(spec)
        compare("fp16_overflow", "fp16", got, ref)
        skipped = got[-1]["skipped_steps"]
        applied = [m for m in got if m.get("grad_norm") is not None]
        if not (1 <= skipped < 12 and got[-1]["loss_scale"] == 65536.0 / 2 ** skipped and applied
                and applied[-1]["step"] == 12):
            fail(f"fp16_overflow: wanted some skipped steps, the scale halved for each, then updates; "
                 f"got {[(m['step'], m['loss_scale'], m['skipped_steps']) for m in got]}")
        if "update skipped, scale halved" not in err:
            fail("fp16_overflow: skipped steps are not logged")
        ck = os.path.join(tmp, "work", "checkpoints", "step-000006")
        with open(os.path.join(ck, "trainer_state.json")) as f:
            st = json.load(f)
        at6 = [m for m in got if m["step"] == 6][0]
        if (st.get("loss_scale"), st.get("skipped_steps"), st.get("precision")) != \
                (at6["loss_scale"], at6["skipped_steps"], "fp16"):
            fail(f"fp16_overflow: trainer_state {st} does not hold step 6's scale state {at6}")
        print(f"fp16_overflow: {skipped} steps skipped, scale {got[-1]['loss_scale']:g}; "
              f"step 6 checkpoint holds scale {st['loss_scale']:g}, {st['skipped_steps']} skipped")
        # Resume from step 6 in a fresh workdir: steps 7..12 bit-identical,
        # which needs the scale, the growth tracker and the skipped count.
        rc, ev2, err = check.run_engine(engine, spec_path, os.path.join(tmp, "fresh"), resume=ck)
        check.expect_success(rc, ev2, err, "fp16_overflow resumed")
        a = {m["step"]: check.state_of(m) for m in got if m["step"] > 6}
        b = {m["step"]: check.state_of(m) for m in check.metrics_of(ev2)}
        if a != b:
            fail(f"fp16_overflow: resumed steps differ:\n{a}\n{b}")
        print("fp16_overflow: resumed from step 6, steps 7..12 bit-identical (scale state restored)")
    finally:
        if keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def case_growth(engine, keep):
    tmp = tempfile.mkdtemp(prefix="engine_ref_mixed_growth_")
    os.environ["TY_TEST_SCALE_GROWTH_INTERVAL"] = "3"
    try:
        spec, spec_path = check.build_case(tmp, "llama_gqa", steps=10, every_steps=4,
                                           extra={"precision": "fp16"})
        rc, events, err = check.run_engine(engine, spec_path, os.path.join(tmp, "work"))
        check.expect_success(rc, events, err, "fp16_growth")
        if "doubles after 3 clean steps" not in err:
            fail("fp16_growth: the engine did not log the test knob")
        got = check.metrics_of(events)
        ref, _ = mixedref.train(spec, growth_interval=3)
        compare("fp16_growth", "fp16", got, ref)
        scales = [m["loss_scale"] for m in got]
        # Before any skipped step the scale is 2^16 for steps 1-2, doubles at 3
        # and again at 6 (the reference agrees step by step, checked above).
        if scales[:6] != [65536.0, 65536.0, 131072.0, 131072.0, 131072.0, 262144.0] or got[5]["skipped_steps"]:
            fail(f"fp16_growth: scales {scales}, wanted a doubling after steps 3 and 6")
        # Resume from step 4 (one clean step into the second interval): the
        # growth tracker comes back, so the next doubling is still at step 6.
        ck = os.path.join(tmp, "work", "checkpoints", "step-000004")
        with open(os.path.join(ck, "trainer_state.json")) as f:
            st = json.load(f)
        if (st.get("loss_scale"), st.get("growth_tracker")) != (131072.0, 1):
            fail(f"fp16_growth: step 4 trainer_state has scale/tracker {st.get('loss_scale')}/"
                 f"{st.get('growth_tracker')}, wanted 131072/1")
        rc, ev2, err = check.run_engine(engine, spec_path, os.path.join(tmp, "fresh"), resume=ck)
        check.expect_success(rc, ev2, err, "fp16_growth resumed")
        a = {m["step"]: check.state_of(m) for m in got if m["step"] > 4}
        b = {m["step"]: check.state_of(m) for m in check.metrics_of(ev2)}
        if a != b:
            fail(f"fp16_growth: resumed steps differ:\n{a}\n{b}")
        print(f"fp16_growth: scales {scales}; resumed from step 4, steps 5..10 bit-identical")
    finally:
        del os.environ["TY_TEST_SCALE_GROWTH_INTERVAL"]
        if keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--case", required=True)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    fam, _, prec = a.case.partition("_")
    if a.case == "fp16_overflow":
        case_overflow(a.engine, a.keep)
    elif a.case == "fp16_growth":
        case_growth(a.engine, a.keep)
    elif fam == "resume" and prec in ("bf16", "fp16"):
        check.case_resume(a.engine, a.keep, prec)
    elif fam in FAMILY and prec in TOL:
        case_compare(a.engine, fam, prec, a.keep)
    else:
        fail(f"unknown case {a.case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
