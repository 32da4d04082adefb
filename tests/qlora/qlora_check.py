"""qlora.llama — method "qlora" end to end on a small Llama (GQA).

The reference is peft's LoRA on the same model whose block linear weights
are replaced by dequant(quant(w)) (nf4_ref.py: bitsandbytes' algorithm in
numpy), trained by the same loop as tests/hf (tests/hf/ref_check.py). Both
start from one adapter (B non-zero, saved by peft, given as lora.adapter).
1. losses within 1e-4 relative per step, trained adapters within 1e-3, with
   and without double quantisation; the base files stay byte-identical;
2. the started event's memory: quantized_weights = the NF4 bytes of every
   block linear (computed here from the shapes), optimizer = 2 x adapters;
3. checkpoints hold only adapters, their moments and the trainer state;
   --resume from step 2 gives bit-identical losses and adapters;
   recompute "all" gives bit-identical losses;
4. the export is a PEFT adapter for the original base (PeftModel loads it
   on the un-quantised model); lora.merge exports W + (alpha/r) B A on the
   original weights (1e-6), everything else bit-identical;
5. bf16 precision with compute_dtype bf16 (the base's GEMMs on 16-bit
   inputs) trains within 2e-2 of fp32, and its --resume from step 2 gives
   bit-identical losses and adapters;
6. bad inputs: a config with quantization_config, GPTQ tensors, a
   non-linear target, bad qlora fields — each an error naming it;
7. with EMU_ENGINE (trainyard-engine-emu): the same run on the emulated
   CUDA backend (kernels/cuda's NF4 kernel + cuBLASLt path, device memory
   guarded) gives the CPU backend's losses within 1e-5.
Usage: qlora_check.py ENGINE WORKDIR [EMU_ENGINE]
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import peft
import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "hf"))
import nf4_ref as R  # noqa: E402
from hfcommon import fail, job_spec, load_model, make_model, rel_err, run_engine, write_json  # noqa: E402

LOSS_TOL, WEIGHT_TOL, MERGE_TOL, BF16_TOL = 1e-4, 1e-3, 1e-6, 2e-2
STEPS, BATCH, SEQ, R_, ALPHA = 4, 2, 16, 4, 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LINEARS = TARGETS
torch.set_num_threads(1)


def sha(d):
    h = hashlib.sha256()
    for f in sorted(os.listdir(d)):
        with open(os.path.join(d, f), "rb") as fh:
            h.update(f.encode() + fh.read())
    return h.hexdigest()


def dequantised_model(base_dir, dq, linears=LINEARS):
    """The model with each block linear's weight (a fused one whole, as
    bitsandbytes quantises a Linear4bit) replaced by dequant(quant(w))."""
    m = load_model(base_dir)
    with torch.no_grad():
        for name, mod in m.named_modules():
            if name.split(".")[-1] in linears:
                w = mod.weight.detach().numpy().astype(np.float32)
                d = R.dequantize_nf4(R.quantize_nf4(w.reshape(-1), dq), w.size)
                mod.weight.copy_(torch.from_numpy(d.reshape(w.shape)))
    return m


def torch_train(model, params, rows, hp):
    model.eval()
    decay = [p for p in params if p.dim() >= 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]}], lr=hp["lr"],
                            betas=(hp["adam_beta1"], hp["adam_beta2"]), eps=hp["adam_eps"])
    x = torch.tensor(rows)
    losses = []
    for _ in range(hp["max_steps"]):
        opt.zero_grad()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, hp["max_grad_norm"])
        opt.step()
        losses.append(loss.item())
    return losses


def engine_events(engine, spec, workdir, resume=None, expect_rc=0, env=None):
    os.makedirs(workdir, exist_ok=True)
    sp = os.path.join(workdir, "spec.json")
    write_json(sp, spec)
    cmd = ["/bin/bash", "-c", 'exec "$0" "$@" 3>&1 1>&2', engine, "--spec", sp, "--workdir", workdir]
    if resume:
        cmd += ["--resume", resume]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, **(env or {})))
    events = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    if r.returncode != expect_rc:
        fail(f"engine exit {r.returncode} (expected {expect_rc}): {events[-3:]}\n{r.stderr[-1500:]}")
    return events


def write_rows(path, rows):
    """A token-id JSONL dataset, one row a line."""
    with open(path, "w") as f:
        for r in rows:
            f.write('{"input_ids": %s}\n' % r)


def start_adapter(base_dir, targets, out):
    """A starting adapter made by peft on the un-quantised base with B != 0
    (so step 1 already differs from the base), given to both sides as
    lora.adapter. Returns peft's config and the adapter's state dict."""
    lcfg = peft.LoraConfig(r=R_, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=targets, bias="none",
                           task_type="CAUSAL_LM")
    pm0 = peft.get_peft_model(load_model(base_dir), lcfg)
    torch.manual_seed(5)
    with torch.no_grad():
        for n, p in pm0.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    pm0.save_pretrained(out)
    return lcfg, {k: v for k, v in pm0.state_dict().items() if "lora_" in k}


def expect_error(engine, spec, workdir, rc, needle):
    ev = engine_events(engine, spec, workdir, expect_rc=rc)
    errs = [e["message"] for e in ev if e["ev"] == "error"]
    if not errs or needle not in errs[-1]:
        fail(f"{workdir}: expected an error event containing {needle!r}, got {errs}")
    print(f"  refused (exit {rc}): {errs[-1][:150]}")


def nf4_bytes(n):
    a64 = lambda x: (x + 63) // 64 * 64  # noqa: E731
    nb = (n + 63) // 64
    return a64((n + 1) // 2) + a64(nb) + a64((nb + 255) // 256 * 4)


def main():
    engine, work = sys.argv[1:3]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    base_dir = os.path.join(work, "base")
    make_model("llama", base_dir)
    base_sum = sha(base_dir)
    g = torch.Generator().manual_seed(3)
    V = 97
    rows = torch.randint(0, V, (BATCH, SEQ), generator=g).tolist()
    data = os.path.join(work, "train.jsonl")
    write_rows(data, rows)

    # The starting adapter, made by peft on the un-quantised base.
    init_dir = os.path.join(work, "adapter0")
    lcfg, sd0 = start_adapter(base_dir, TARGETS, init_dir)
    lora = {"r": R_, "alpha": ALPHA, "dropout": 0.0, "targets": TARGETS, "adapter": init_dir}

    def qspec(steps=STEPS, dq=True, **kw):
        s = job_spec(base_dir, data, steps, BATCH, SEQ, method="qlora", lora=dict(lora),
                     qlora={"double_quant": dq, "compute_dtype": "auto"})
        s.update(kw)
        return s

    print("1. losses and adapters against peft on dequant(quant(W))", flush=True)
    for dq in (True, False):
        spec = qspec(dq=dq)
        wd = os.path.join(work, f"q-dq{int(dq)}")
        ev = engine_events(engine, spec, wd)
        got = [e["loss"] for e in ev if e["ev"] == "metric"]
        pm = peft.get_peft_model(dequantised_model(base_dir, dq), lcfg)
        pm.load_state_dict(sd0, strict=False)
        params = [p for p in pm.parameters() if p.requires_grad]
        want = torch_train(pm, params, rows, spec["hyperparameters"])
        print(f"  double_quant={dq}: engine {['%.7f' % l for l in got]}\n"
              f"                      torch  {['%.7f' % l for l in want]}")
        for s, (a, b) in enumerate(zip(got, want)):
            if not abs(a - b) / abs(b) <= LOSS_TOL or len(got) != STEPS:
                fail(f"double_quant={dq} step {s + 1}: loss {a!r} vs torch {b!r}")
        # the un-quantised base would give other losses: the test can tell
        ref_full = peft.get_peft_model(load_model(base_dir), lcfg)
        ref_full.load_state_dict(sd0, strict=False)
        with torch.no_grad():
            lf = ref_full(input_ids=torch.tensor(rows), labels=torch.tensor(rows)).loss.item()
        if abs(lf - got[0]) / abs(lf) <= LOSS_TOL:
            fail(f"the first loss {got[0]} equals the un-quantised model's {lf}: quantisation had no effect")
        tensors = load_file(os.path.join(wd, "export", "adapter_model.safetensors"))
        psd = {k.replace(".default", ""): v for k, v in pm.state_dict().items() if "lora_" in k}
        if sorted(tensors) != sorted(psd):
            fail(f"export adapter keys {sorted(tensors)[:3]}... vs peft {sorted(psd)[:3]}...")
        worst = max(rel_err(tensors[k], v) for k, v in psd.items())
        if not worst <= WEIGHT_TOL:
            fail(f"double_quant={dq}: trained adapters rel {worst:.2e} vs peft")
        print(f"  double_quant={dq}: {len(psd)} trained adapter tensors within {worst:.1e}")
        if dq:
            started = next(e for e in ev if e["ev"] == "started")
            first = got
    if sha(base_dir) != base_sum:
        fail("the base model directory changed")
    print("  the base model files are byte-identical")

    print("2. memory in the started event", flush=True)
    mem = started.get("memory", {})
    base = load_model(base_dir)
    want_q = sum(nf4_bytes(mod.weight.numel()) for n, mod in base.named_modules() if n.split(".")[-1] in LINEARS)
    if mem.get("quantized_weights") != want_q:
        fail(f"started.memory.quantized_weights {mem.get('quantized_weights')} != {want_q}")
    if not (mem.get("adapters", 0) > 0 and mem.get("optimizer") == 2 * mem["adapters"] and mem.get("activations", 0) > 0):
        fail(f"started.memory {mem}")
    lin_f32 = sum(mod.weight.numel() * 4 for n, mod in base.named_modules() if n.split(".")[-1] in LINEARS)
    if not mem["weights"] < sum(p.numel() * 4 for p in base.parameters()) - lin_f32 + 1024:
        fail(f"started.memory.weights {mem['weights']} still holds the fp32 linears ({lin_f32} bytes)")
    print(f"  {mem} (NF4 {want_q} bytes for {lin_f32} bytes of fp32 linears)")

    print("3. checkpoints, resume, recompute", flush=True)
    spec = qspec(checkpoint={"every_steps": 2})
    wd = os.path.join(work, "ckpt")
    ev = engine_events(engine, spec, wd)
    full = [e["loss"] for e in ev if e["ev"] == "metric"]
    ck = os.path.join(wd, "checkpoints", "step-000002")
    files = sorted(os.listdir(ck))
    if files != ["MANIFEST.json", "adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors",
                 "trainer_state.json"]:
        fail(f"checkpoint files {files}")
    if any("lora_" not in k for k in load_file(os.path.join(ck, "optimizer.safetensors"))):
        fail("optimizer.safetensors holds more than the adapters' moments")
    wd2 = os.path.join(work, "resumed")
    ev2 = engine_events(engine, spec, wd2, resume=ck)
    res = [e["loss"] for e in ev2 if e["ev"] == "metric"]
    if res != full[2:]:
        fail(f"resume from step 2: {res} vs uninterrupted {full[2:]}")
    a = load_file(os.path.join(wd, "export", "adapter_model.safetensors"))
    b = load_file(os.path.join(wd2, "export", "adapter_model.safetensors"))
    if any(not torch.equal(a[k], b[k]) for k in a):
        fail("the resumed run's adapter differs from the uninterrupted one")
    print(f"  resume from step 2: losses {res} bit-identical, adapters bit-identical")
    spec_rc = qspec()
    spec_rc["hyperparameters"]["recompute"] = "all"
    rc = [e["loss"] for e in engine_events(engine, spec_rc, os.path.join(work, "recompute")) if e["ev"] == "metric"]
    if rc != first:
        fail(f"recompute all: {rc} vs {first}")
    print("  recompute all: bit-identical losses")

    print("4. exports for the original base", flush=True)
    aexp = os.path.join(work, "q-dq1", "export")
    cfg = json.load(open(os.path.join(aexp, "adapter_config.json")))
    if cfg.get("peft_type") != "LORA" or cfg.get("base_model_name_or_path") != base_dir or cfg.get("r") != R_:
        fail(f"adapter_config.json {cfg}")
    loaded = peft.PeftModel.from_pretrained(load_model(base_dir), aexp).eval()
    with torch.no_grad():
        out = loaded(input_ids=torch.tensor(rows)).logits
    if not torch.isfinite(out).all():
        fail("PeftModel on the original base gives non-finite logits")
    print("  PeftModel.from_pretrained(original base, export) loads and runs")
    spec = qspec()
    spec["lora"]["merge"] = True
    spec["export"] = {"dtype": "fp32"}
    wd = os.path.join(work, "merge")
    engine_events(engine, spec, wd)
    merged = load_file(os.path.join(wd, "export", "model.safetensors"))
    orig = load_file(os.path.join(base_dir, "model.safetensors"))
    ad = load_file(os.path.join(work, "q-dq1", "export", "adapter_model.safetensors"))
    worst = 0.0
    for k, w in orig.items():
        mp = k[: -len(".weight")]
        ka = f"base_model.model.{mp}.lora_A.weight"
        if ka in ad:
            want = w.double() + (ALPHA / R_) * ad[f"base_model.model.{mp}.lora_B.weight"].double() @ ad[ka].double()
            worst = max(worst, rel_err(merged[k], want))
        elif not torch.equal(merged[k], w):
            fail(f"merged export: {k} differs from the original base")
    if not worst <= MERGE_TOL:
        fail(f"merged export: rel {worst:.2e} vs W + scale B A on the original weights")
    print(f"  merged export = original W + (alpha/r) B A within {worst:.1e}; other tensors identical")

    print("5. bf16", flush=True)
    spec = qspec(precision="bf16")
    spec["qlora"]["compute_dtype"] = "bf16"
    bf = [e["loss"] for e in engine_events(engine, spec, os.path.join(work, "bf16")) if e["ev"] == "metric"]
    if not all(abs(x - y) / abs(y) <= BF16_TOL for x, y in zip(bf, first)):
        fail(f"bf16 losses {bf} vs fp32 {first}")
    print(f"  bf16 losses {['%.5f' % l for l in bf]} within {BF16_TOL} of fp32")
    spec["checkpoint"] = {"every_steps": 2}
    wd = os.path.join(work, "bf16-ckpt")
    bfc = [e["loss"] for e in engine_events(engine, spec, wd) if e["ev"] == "metric"]
    ev2 = engine_events(engine, spec, os.path.join(work, "bf16-resumed"),
                        resume=os.path.join(wd, "checkpoints", "step-000002"))
    res = [e["loss"] for e in ev2 if e["ev"] == "metric"]
    if bfc != bf or res != bf[2:]:
        fail(f"bf16 resume from step 2: {res} vs uninterrupted {bf[2:]} (checkpointing: {bfc})")
    a = load_file(os.path.join(wd, "export", "adapter_model.safetensors"))
    b = load_file(os.path.join(work, "bf16-resumed", "export", "adapter_model.safetensors"))
    if any(not torch.equal(a[k], b[k]) for k in a):
        fail("the resumed bf16 run's adapter differs from the uninterrupted one")
    print(f"  bf16 resume from step 2: losses {res} bit-identical, adapters bit-identical")

    print("6. bad inputs", flush=True)
    qdir = os.path.join(work, "prequant")
    shutil.copytree(base_dir, qdir)
    c = json.load(open(os.path.join(qdir, "config.json")))
    c["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    write_json(os.path.join(qdir, "config.json"), c)
    s = qspec()
    s["model"]["path"] = qdir
    expect_error(engine, s, os.path.join(work, "bad1"), 2, "already quantised")
    gdir = os.path.join(work, "gptq")
    shutil.copytree(base_dir, gdir)
    t = load_file(os.path.join(gdir, "model.safetensors"))
    w = t.pop("model.layers.0.self_attn.q_proj.weight")
    t["model.layers.0.self_attn.q_proj.qweight"] = torch.zeros(w.shape[1] // 8, w.shape[0], dtype=torch.int32)
    save_file(t, os.path.join(gdir, "model.safetensors"), metadata={"format": "pt"})
    s = qspec()
    s["model"]["path"] = gdir
    expect_error(engine, s, os.path.join(work, "bad2"), 1, "quantised by GPTQ/AWQ")
    s = qspec()
    s["lora"] = {"r": 4, "alpha": 8, "targets": ["input_layernorm"]}
    expect_error(engine, s, os.path.join(work, "bad3"), 2, "input_layernorm")
    for qf, needle in [({"double_quant": "yes"}, "qlora.double_quant"), ({"compute_dtype": "int8"}, "qlora.compute_dtype"),
                       ({"blocksize": 32}, "qlora.blocksize")]:
        s = qspec()
        s["qlora"] = qf
        expect_error(engine, s, os.path.join(work, "bad4"), 2, needle)
    s = job_spec(base_dir, data, 1, BATCH, SEQ, method="lora", qlora={"double_quant": True})
    expect_error(engine, s, os.path.join(work, "bad5"), 2, "qlora")
    if len(sys.argv) > 3:
        print("7. the emulated CUDA backend", flush=True)
        spec = qspec(steps=2)
        spec["resources"] = {"gpus": 1, "backend": "cuda"}
        ev = engine_events(sys.argv[3], spec, os.path.join(work, "emu"),
                           env={"TY_KERNELS": "cuda-emu", "TY_EMU_GUARD": "1"})
        st = next(e for e in ev if e["ev"] == "started")
        emu = [e["loss"] for e in ev if e["ev"] == "metric"]
        if st.get("backend") not in ("cuda", "cuda-emu") or len(emu) != 2 or \
                not all(abs(x - y) / abs(y) <= 1e-5 for x, y in zip(emu, first)):
            fail(f"cuda-emu: backend {st.get('backend')}, losses {emu} vs cpu {first[:2]}")
        print(f"  cuda-emu losses {emu} match the CPU's within 1e-5")
    print("qlora: all checks passed")


if __name__ == "__main__":
    main()
