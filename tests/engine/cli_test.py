#!/usr/bin/python3
# cli_test.py — black-box tests of trainyard-engine's command line (ctest engine.cli.*):
# every bad input (docs/engine.md, "Errors") must end in one {"ev":"error"} naming the problem
# and a non-zero exit, plus SIGTERM, checkpoint layout, export/reload and NaN.
#
# Usage: cli_test.py ENGINE CASE. Standard library only: the tiny models are
# written here with struct + json in the safetensors format, independently of
# the engine's own writer.
import hashlib
import json
import os
import re
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

ENGINE = sys.argv[1]
CASE = sys.argv[2]
TMP = tempfile.mkdtemp(prefix=f"ty-engine-cli-{CASE}-")
VOCAB, DIM, LAYERS, HEADS, POS = 53, 16, 2, 2, 32


def fail(msg):
    print(f"FAIL [{CASE}]: {msg}")
    sys.exit(1)


def write_safetensors(path, tensors, header_edit=None):
    """tensors: list of (name, shape, list of floats). header_edit may change
    the header dict before it is written (to build broken files)."""
    header, blobs, off = {}, [], 0
    for name, shape, vals in tensors:
        blob = struct.pack(f"<{len(vals)}f", *vals)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    if header_edit:
        header_edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def gpt2_tensors(rng, vocab=VOCAB):
    def normal(n, std=0.02):
        return [rng.gauss(0, std) for _ in range(n)]
    t = [("transformer.wte.weight", (vocab, DIM), normal(vocab * DIM)),
         ("transformer.wpe.weight", (POS, DIM), normal(POS * DIM))]
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        t += [(p + "ln_1.weight", (DIM,), [1.0] * DIM), (p + "ln_1.bias", (DIM,), [0.0] * DIM),
              (p + "attn.c_attn.weight", (DIM, 3 * DIM), normal(3 * DIM * DIM)),
              (p + "attn.c_attn.bias", (3 * DIM,), [0.0] * 3 * DIM),
              (p + "attn.c_proj.weight", (DIM, DIM), normal(DIM * DIM)),
              (p + "attn.c_proj.bias", (DIM,), [0.0] * DIM),
              (p + "ln_2.weight", (DIM,), [1.0] * DIM), (p + "ln_2.bias", (DIM,), [0.0] * DIM),
              (p + "mlp.c_fc.weight", (DIM, 4 * DIM), normal(4 * DIM * DIM)),
              (p + "mlp.c_fc.bias", (4 * DIM,), [0.0] * 4 * DIM),
              (p + "mlp.c_proj.weight", (4 * DIM, DIM), normal(4 * DIM * DIM)),
              (p + "mlp.c_proj.bias", (DIM,), [0.0] * DIM)]
    t += [("transformer.ln_f.weight", (DIM,), [1.0] * DIM), ("transformer.ln_f.bias", (DIM,), [0.0] * DIM)]
    return t


def gpt2_config(**kw):
    c = {"model_type": "gpt2", "vocab_size": VOCAB, "n_embd": DIM, "n_layer": LAYERS, "n_head": HEADS,
         "n_positions": POS}
    c.update(kw)
    return c


def make_model_dir(name="model", header_edit=None, tensors=None, config=None):
    d = os.path.join(TMP, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config or gpt2_config(), f)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors or gpt2_tensors(random.Random(1)),
                      header_edit)
    return d


def write_dataset(name, rows):
    p = os.path.join(TMP, name)
    with open(p, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return p


def random_rows(n, seed=2, lo=4, hi=20):
    rng = random.Random(seed)
    return [{"input_ids": [rng.randrange(VOCAB) for _ in range(rng.randint(lo, hi))]} for _ in range(n)]


def write_spec(model=None, train=None, name="spec.json", **hp):
    hyper = {"max_steps": 3, "batch_size": 2, "seq_len": 16, "grad_accum": 1, "lr": 1e-3,
             "log_every_steps": 1}
    extra = hp.pop("extra", {})
    hyper.update(hp)
    spec = {"model": model or {"init": gpt2_config()},
            "dataset": {"train": train or write_dataset("train.jsonl", random_rows(8)), "format": "tokens"},
            "hyperparameters": hyper}
    spec.update(extra)
    p = os.path.join(TMP, name)
    with open(p, "w") as f:
        json.dump(spec, f)
    return p


def run(spec, workdir="work", resume=None, fd3=False, timeout=120, env=None):
    """Runs the engine (extra environment variables in env); returns (exit
    code, events, stderr)."""
    cmd = [ENGINE, "--spec", spec, "--workdir", os.path.join(TMP, workdir), "--threads", "1"]
    if resume:
        cmd += ["--resume", resume]
    if fd3:  # events on fd 3, stdout must stay free of them
        cmd = ["/bin/bash", "-c", 'exec "$0" "$@" 3>&1 1>&2'] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **env) if env else None)
    events = []
    for line in p.stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            fail(f"non-JSON line on the event stream: {line!r}")
    return p.returncode, events, p.stderr


def expect_error(result, *fragments, code=None):
    rc, events, stderr = result
    errors = [e for e in events if e.get("ev") == "error"]
    if rc == 0:
        fail(f"exit 0, wanted a failure; events {events}")
    if code is not None and rc != code:
        fail(f"exit {rc}, wanted {code}; stderr: {stderr[-2000:]}")
    if len(errors) != 1 or set(errors[0]) != {"ev", "message"}:
        fail(f"wanted exactly one error event, got {events}; stderr: {stderr[-2000:]}")
    msg = errors[0]["message"]
    for frag in fragments:
        if frag not in msg:
            fail(f"error message {msg!r} does not mention {frag!r}")
    if "Sanitizer" in stderr or "runtime error" in stderr:
        fail(f"sanitizer report:\n{stderr[-3000:]}")
    print(f"ok: exit {rc}, {msg}")


def expect_success(result, status="succeeded"):
    rc, events, stderr = result
    if rc != 0 or not events or events[-1] != {"ev": "done", "status": status}:
        fail(f"exit {rc}, events {events[-3:]}, wanted done/{status}; stderr: {stderr[-3000:]}")
    return events


def patch_model(edit):
    return make_model_dir(header_edit=edit)


def spec_for_dir(d, **hp):
    return write_spec(model={"path": d}, **hp)


# ---- cases -------------------------------------------------------------------

def case_bad_spec():
    p = os.path.join(TMP, "spec.json")
    with open(p, "w") as f:
        json.dump({"model": {"init": gpt2_config()}, "dataset": {"train": "/x.jsonl"},
                   "hyperparameters": {"max_steps": 1, "lr": 1e-3, "bogus": 1}}, f)
    expect_error(run(p), "spec", "bogus", code=2)
    with open(p, "w") as f:
        f.write("{not json")
    expect_error(run(p), "spec", code=2)
    expect_error(run(os.path.join(TMP, "absent.json")), "absent.json", code=2)


def case_missing_files():
    d = os.path.join(TMP, "empty_model")
    os.makedirs(d)
    expect_error(run(spec_for_dir(d)), "config.json")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(gpt2_config(), f)
    expect_error(run(spec_for_dir(d)), "model.safetensors")
    expect_error(run(write_spec(train=os.path.join(TMP, "nope.jsonl"))), "nope.jsonl")
    # an index naming a shard that is not there
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {"transformer.wte.weight": "model-00001-of-00002.safetensors"}}, f)
    expect_error(run(spec_for_dir(d)), "model-00001-of-00002.safetensors")


def case_truncated():
    d = make_model_dir()
    p = os.path.join(d, "model.safetensors")
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(size - 100)
    expect_error(run(spec_for_dir(d)), "model.safetensors", "outside the data area")
    with open(p, "r+b") as f:
        f.truncate(5)
    expect_error(run(spec_for_dir(d)), "truncated")


def case_header_length():
    d = make_model_dir()
    p = os.path.join(d, "model.safetensors")
    with open(p, "r+b") as f:
        f.write(struct.pack("<Q", os.path.getsize(p) * 2))
    expect_error(run(spec_for_dir(d)), "header length", "beyond the file size")


def case_offsets_outside():
    def edit(h):
        b, e = h["transformer.ln_f.bias"]["data_offsets"]
        h["transformer.ln_f.bias"]["data_offsets"] = [b + 10 ** 6, e + 10 ** 6]
    expect_error(run(spec_for_dir(patch_model(edit))), "transformer.ln_f.bias", "outside the data area")


def case_overlap():
    def edit(h):
        h["transformer.ln_f.bias"]["data_offsets"] = list(h["transformer.ln_f.weight"]["data_offsets"])
    expect_error(run(spec_for_dir(patch_model(edit))), "overlap", "transformer.ln_f")


def case_unknown_dtype():
    def edit(h):
        h["transformer.wpe.weight"]["dtype"] = "F12"
    expect_error(run(spec_for_dir(patch_model(edit))), "unknown dtype", "F12", "transformer.wpe.weight")


def case_shape_mismatch():
    # config.json says a vocabulary of VOCAB + 1: the embedding contradicts it
    d = make_model_dir(config=gpt2_config(vocab_size=VOCAB + 1))
    expect_error(run(spec_for_dir(d)), "transformer.wte.weight", f"[{VOCAB}, {DIM}]", f"[{VOCAB + 1}, {DIM}]")
    # a tensor that is not part of the model, and one that is missing
    t = gpt2_tensors(random.Random(1))
    d = make_model_dir("extra", tensors=t + [("transformer.h.9.attn.c_attn.weight", (2,), [0.0, 0.0])])
    expect_error(run(spec_for_dir(d)), "unexpected tensor transformer.h.9.attn.c_attn.weight")
    d = make_model_dir("missing", tensors=[x for x in t if x[0] != "transformer.h.1.mlp.c_fc.bias"])
    expect_error(run(spec_for_dir(d)), "missing tensor transformer.h.1.mlp.c_fc.bias")


def case_token_vocab():
    rows = random_rows(3)
    rows.append({"input_ids": [1, 2, VOCAB]})
    tr = write_dataset("train.jsonl", rows)
    expect_error(run(write_spec(train=tr)), "train.jsonl", "line 4", f"= {VOCAB}", "vocabulary")
    tr = write_dataset("bad.jsonl", random_rows(2) + ['{"input_ids": [1, 2'])
    expect_error(run(write_spec(train=tr)), "bad.jsonl line 3", "not valid JSON")


def case_empty_dataset():
    tr = write_dataset("empty.jsonl", [])
    expect_error(run(write_spec(train=tr)), "empty.jsonl", "empty dataset")
    # one-token examples predict nothing: a step without any target is an error
    tr = write_dataset("short.jsonl", [{"input_ids": [5]}, {"input_ids": [7]}])
    expect_error(run(write_spec(train=tr)), "step 1", "no target tokens")


def case_seq_len():
    expect_error(run(write_spec(seq_len=POS + 1)), "seq_len", str(POS + 1), str(POS), code=2)


def case_nan_loss():
    t = gpt2_tensors(random.Random(1))
    t = [(n, s, [float("inf")] * len(v)) if n == "transformer.wte.weight" else (n, s, v) for n, s, v in t]
    d = make_model_dir(tensors=t)
    result = run(spec_for_dir(d, extra={"checkpoint": {"every_steps": 1}}))
    expect_error(result, "loss is NaN at step 1")
    if os.path.exists(os.path.join(TMP, "work", "checkpoints", "step-000001")):
        fail("a checkpoint was written for the step whose loss was NaN")


def case_kernel_error():
    # A failure inside a kernel op (TY_KN_FAIL_OP simulates a device error
    # in one op) surfaces at the step's check: one error event naming the
    # op, a non-zero exit, and no checkpoint for the failed step.
    for op in ("attention_bwd", "matmul_fwd"):
        result = run(write_spec(extra={"checkpoint": {"every_steps": 1}}), workdir="work-" + op,
                     env={"TY_KN_FAIL_OP": op})
        expect_error(result, "cpu kernel: " + op + " failed", code=1)
        if os.path.exists(os.path.join(TMP, "work-" + op, "checkpoints", "step-000001")):
            fail("a checkpoint was written for a step whose kernels failed")


def case_auto_fallback():
    # backend auto with a GPU asked for, with no GPU to use: the run
    # goes to the CPU and says why, in the log and in the started event.
    result = run(write_spec(extra={"resources": {"gpus": 1, "backend": "auto"}}), workdir="work-auto")
    events = expect_success(result)
    st = [e for e in events if e.get("ev") == "started"][0]
    # (a build without CUDA, or one on a machine without a GPU driver)
    why = st.get("fallback", "")
    if st.get("backend") != "cpu" or ("no CUDA backend" not in why and "no NVIDIA driver" not in why):
        fail(f"started event does not show the fallback: {st}")
    if not st.get("device", "").startswith("cpu: "):
        fail(f"started.device {st.get('device')!r}")
    if "backend auto: cuda unavailable" not in result[2]:
        fail(f"fallback not logged: {result[2][-2000:]}")
    # backend cpu (or no GPU asked for) is not a fallback.
    events = expect_success(run(write_spec(extra={"resources": {"backend": "cpu"}}), workdir="work-cpu"))
    st = [e for e in events if e.get("ev") == "started"][0]
    if "fallback" in st:
        fail(f"fallback reported for backend cpu: {st}")


def case_recompute():
    # hyperparameters.recompute none | mlp | all: the same losses, grad
    # norms and final weights bit for bit, with fewer activation bytes
    # kept (logged at start) as more is recomputed. GPT-2, a GQA Llama, and
    # LoRA with dropout (its masks must come out the same when recomputed);
    # the same with 16-bit activations (bf16: GPT-2 and LoRA on the Llama,
    # whose adapters read widened fp32 copies; fp16: the Llama).
    llama = {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": 24, "intermediate_size": 40,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 32}
    runs = [("gpt2", {"init": gpt2_config()}, {}),
            ("llama", {"init": llama}, {}),
            ("lora", {"init": llama}, {"method": "lora", "lora": {"r": 4, "dropout": 0.2,
                                                                  "targets": ["q_proj", "v_proj", "up_proj"]}})]
    lora16 = {"method": "lora", "precision": "bf16",
              "lora": {"r": 4, "dropout": 0.2, "targets": ["q_proj", "v_proj", "up_proj"]}}
    runs += [("gpt2-bf16", {"init": gpt2_config()}, {"precision": "bf16"}),
             ("llama-fp16", {"init": llama}, {"precision": "fp16"}),
             ("lora-bf16", {"init": llama}, lora16)]
    for tag, model, extra in runs:
        seen = {}
        for mode in ("none", "mlp", "all"):
            spec = write_spec(model=model, name=f"spec-{tag}-{mode}.json", recompute=mode, grad_accum=2,
                              max_steps=4, extra=extra)
            rc, events, stderr = result = run(spec, workdir=f"work-{tag}-{mode}")
            expect_success(result)
            metrics = [(e["step"], e["loss"], e["grad_norm"]) for e in events if e.get("ev") == "metric"]
            m = re.search(r"activations: (\d+) bytes \(recompute " + mode + r", " +
                          extra.get("precision", "fp32") + r" storage\)", stderr)
            if not m:
                fail(f"{tag}/{mode}: no activations line in the log")
            exp = os.path.join(TMP, f"work-{tag}-{mode}", "export")
            weights = b"".join(open(os.path.join(exp, f), "rb").read() for f in sorted(os.listdir(exp))
                               if f.endswith(".safetensors"))
            seen[mode] = (metrics, int(m.group(1)), weights)
        base = seen["none"]
        for mode in ("mlp", "all"):
            if seen[mode][0] != base[0]:
                fail(f"{tag}: recompute {mode} metrics {seen[mode][0]} differ from none {base[0]}")
            if seen[mode][2] != base[2]:
                fail(f"{tag}: recompute {mode} exported different weights")
        if not base[1] > seen["mlp"][1] > seen["all"][1]:
            fail(f"{tag}: activation bytes none/mlp/all {base[1]}/{seen['mlp'][1]}/{seen['all'][1]}")
        print(f"ok: {tag} identical in none/mlp/all; activations {base[1]}/{seen['mlp'][1]}/{seen['all'][1]} bytes")


def check_manifest(ckdir, step):
    with open(os.path.join(ckdir, "MANIFEST.json")) as f:
        m = json.load(f)
    if m.get("format") != "trainyard-checkpoint/1" or m.get("step") != step:
        fail(f"manifest header {m}")
    names = [x["path"] for x in m["files"]]
    if names != ["model.safetensors", "optimizer.safetensors", "trainer_state.json"]:
        fail(f"manifest files {names}")
    for x in m["files"]:
        data = open(os.path.join(ckdir, x["path"]), "rb").read()
        if len(data) != x["bytes"] or hashlib.sha256(data).hexdigest() != x["sha256"]:
            fail(f"manifest entry {x} does not match the file")
    if sorted(os.listdir(ckdir)) != sorted(names + ["MANIFEST.json"]):
        fail(f"unexpected files in {ckdir}: {os.listdir(ckdir)}")
    with open(os.path.join(ckdir, "trainer_state.json")) as f:
        st = json.load(f)
    for k in ("step", "epoch", "cursor", "rng", "spec_sha256", "loss_scale"):
        if k not in st:
            fail(f"trainer_state.json lacks {k}: {st}")
    if st["step"] != step:
        fail(f"trainer_state step {st['step']}, manifest {step}")


def case_checkpoints():
    """every_steps + keep_last, the layout of DESIGN §6, events on fd 3."""
    spec = write_spec(max_steps=5, extra={"checkpoint": {"every_steps": 2, "keep_last": 2}})
    events = expect_success(run(spec, fd3=True))
    cks = [e for e in events if e["ev"] == "checkpoint"]
    if [c["step"] for c in cks] != [2, 4, 5]:
        fail(f"checkpoint events {cks}")
    for c in cks:
        if c["dir"] != f"checkpoints/step-{c['step']:06d}" or not isinstance(c["bytes"], int):
            fail(f"checkpoint event {c}")
    root = os.path.join(TMP, "work", "checkpoints")
    if sorted(os.listdir(root)) != ["step-000004", "step-000005"]:
        fail(f"keep_last 2 left {sorted(os.listdir(root))}")
    check_manifest(os.path.join(root, "step-000005"), 5)
    total = sum(os.path.getsize(os.path.join(root, "step-000005", f)) for f in os.listdir(os.path.join(root, "step-000005")))
    if cks[-1]["bytes"] != total:
        fail(f"checkpoint event bytes {cks[-1]['bytes']}, files total {total}")
    started = events[0]
    if started["ev"] != "started" or started["world"] != 1 or started["backend"] != "cpu" or \
            started["params"] != started["trainable"] or started["params"] <= 0:
        fail(f"started event {started}")
    metrics = [e for e in events if e["ev"] == "metric"]
    keys = ["ev", "step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "mem_bytes", "eta_s", "loss_scale",
            "skipped_steps"]
    if [m["step"] for m in metrics] != [1, 2, 3, 4, 5] or any(list(m) != keys for m in metrics) or \
            any(m["eta_s"] < 0 for m in metrics) or metrics[-1]["eta_s"] != 0:
        fail(f"metric events {metrics}")
    if metrics[-1]["tokens"] != 5 * 2 * 16:
        fail(f"tokens {metrics[-1]['tokens']}, wanted {5 * 2 * 16}")


def case_corrupt_checkpoint():
    spec = write_spec(max_steps=2)
    expect_success(run(spec))
    ck = os.path.join(TMP, "work", "checkpoints", "step-000002")
    p = os.path.join(ck, "optimizer.safetensors")
    data = bytearray(open(p, "rb").read())
    data[-3] ^= 0x40
    open(p, "wb").write(bytes(data))
    expect_error(run(spec, workdir="work2", resume=ck), "checkpoint corrupt: optimizer.safetensors sha256 mismatch")
    os.remove(os.path.join(ck, "MANIFEST.json"))
    expect_error(run(spec, workdir="work3", resume=ck), "MANIFEST.json")


def case_sigterm():
    spec = write_spec(max_steps=1000000, log_every_steps=1,
                      train=write_dataset("train.jsonl", random_rows(5)))
    cmd = [ENGINE, "--spec", spec, "--workdir", os.path.join(TMP, "work"), "--threads", "1"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    events = []
    try:
        for line in p.stdout:
            events.append(json.loads(line))
            if events[-1]["ev"] == "metric" and events[-1]["step"] == 2:
                p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if rc != 0 or events[-1] != {"ev": "done", "status": "stopped"}:
        fail(f"exit {rc}, last events {events[-3:]}")
    last = max(e["step"] for e in events if e["ev"] == "metric")
    ck = [e for e in events if e["ev"] == "checkpoint"]
    if not ck or ck[-1]["step"] != last or ck[-1]["dir"] != f"checkpoints/step-{last:06d}":
        fail(f"stopped after step {last} but checkpoint events are {ck}")
    check_manifest(os.path.join(TMP, "work", ck[-1]["dir"]), last)
    print(f"ok: stopped after step {last} with a committed checkpoint")


def case_export_reload():
    """The export loads again bit-identically: the loss of the reloaded
    model on one example equals the first run's final eval loss on it."""
    one = write_dataset("one.jsonl", random_rows(1, seed=9, lo=12, hi=12))
    for fam, init in (("gpt2", gpt2_config()),
                      ("llama", {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": DIM,
                                 "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "max_position_embeddings": POS})):
        spec = write_spec(model={"init": init}, name=f"{fam}.json", max_steps=3, batch_size=1,
                          extra={})
        with open(spec) as f:
            s = json.load(f)
        s["dataset"]["eval"] = one
        json.dump(s, open(spec, "w"))
        events = expect_success(run(spec, workdir=f"{fam}1"))
        eval_loss = [e for e in events if e["ev"] == "eval"][-1]["loss"]
        export = os.path.join(TMP, f"{fam}1", "export")
        cfg = json.load(open(os.path.join(export, "config.json")))
        if cfg.get("model_type") != fam or cfg.get("torch_dtype") != "float32":
            fail(f"exported config.json {cfg}")
        ckm = os.path.join(TMP, f"{fam}1", "checkpoints", "step-000003", "model.safetensors")
        if open(ckm, "rb").read() != open(os.path.join(export, "model.safetensors"), "rb").read():
            fail("export/model.safetensors differs from the final checkpoint's weights")
        with open(os.path.join(export, "tokenizer.json"), "w") as f:
            f.write('{"fake": true}')
        spec2 = write_spec(model={"path": export}, train=one, name=f"{fam}2.json", max_steps=1, batch_size=1)
        events2 = expect_success(run(spec2, workdir=f"{fam}2"))
        loss = [e for e in events2 if e["ev"] == "metric"][0]["loss"]
        if loss != eval_loss:
            fail(f"{fam}: reloaded export gives loss {loss!r}, the exporting run {eval_loss!r}")
        if open(os.path.join(TMP, f"{fam}2", "export", "tokenizer.json")).read() != '{"fake": true}':
            fail("tokenizer.json was not carried into the export")
        print(f"ok: {fam} export reloads bit-identically (loss {loss!r})")


def case_resume():
    """Resuming the step-2 checkpoint of a 5-step run (7 examples, 3 per
    step: the cursor crosses epochs) reproduces steps 3..5 bit for bit."""
    for fam, init in (("gpt2", gpt2_config()),
                      ("llama", {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": DIM,
                                 "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "max_position_embeddings": POS})):
        spec = write_spec(model={"init": init}, name=f"{fam}.json", max_steps=5, batch_size=3,
                          weight_decay=0.1, warmup_steps=2, schedule="cosine",
                          train=write_dataset("train7.jsonl", random_rows(7)),
                          extra={"checkpoint": {"every_steps": 2}})
        straight = expect_success(run(spec, workdir=f"{fam}-a"))
        ck = os.path.join(TMP, f"{fam}-a", "checkpoints", "step-000002")
        resumed = expect_success(run(spec, workdir=f"{fam}-b", resume=ck))
        a = {e["step"]: (e["loss"], e["lr"], e["grad_norm"], e["tokens"]) for e in straight if e["ev"] == "metric"}
        b = {e["step"]: (e["loss"], e["lr"], e["grad_norm"], e["tokens"]) for e in resumed if e["ev"] == "metric"}
        if sorted(b) != [3, 4, 5] or any(a[k] != b[k] for k in b):
            fail(f"{fam}: straight {a} vs resumed {b}")
        ea = open(os.path.join(TMP, f"{fam}-a", "export", "model.safetensors"), "rb").read()
        eb = open(os.path.join(TMP, f"{fam}-b", "export", "model.safetensors"), "rb").read()
        if ea != eb:
            fail(f"{fam}: the resumed run exported different weights")
        print(f"ok: {fam} resumed steps 3..5 identical, same exported weights")


def case_world():
    env = dict(os.environ, TY_WORLD_SIZE="2", TY_RANK="0")
    p = subprocess.run([ENGINE, "--spec", write_spec(), "--workdir", os.path.join(TMP, "w")],
                       capture_output=True, text=True, env=env, timeout=60)
    events = [json.loads(x) for x in p.stdout.splitlines()]
    expect_error((p.returncode, events, p.stderr), "world size 2")


def case_help():
    """--help, --version and SUB --help print to stdout and exit 0, for the
    program and every subcommand; a usage error still exits 2."""
    subs = ["generate", "logits", "dump-rows", "adapter-fields", "tokenize"]
    for args in [["--help"], ["-h"], ["--version"]] + [[s, "--help"] for s in subs]:
        p = subprocess.run([ENGINE] + args, capture_output=True, text=True, timeout=30)
        want = "trainyard-engine 0" if args == ["--version"] else "usage:"
        if p.returncode != 0 or not p.stdout.startswith(want):
            fail(f"{' '.join(args)}: exit {p.returncode}, stdout {p.stdout[:120]!r}; wanted 0 and {want!r}")
    for args in [[], ["--bogus", "1"], ["generate"], ["logits", "--bogus"], ["dump-rows"], ["adapter-fields", "x"]]:
        p = subprocess.run([ENGINE] + args, capture_output=True, text=True, timeout=30)
        if p.returncode != 2 or "usage" not in p.stderr:
            fail(f"{' '.join(args) or '(no arguments)'}: exit {p.returncode}, stderr {p.stderr[:200]!r}; "
                 "wanted 2 and the usage")
    print(f"ok: --help, --version and {len(subs)} subcommands' --help exit 0; usage errors exit 2")


CASES = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}

if __name__ == "__main__":
    try:
        if CASE not in CASES:
            fail(f"unknown case; known: {sorted(CASES)}")
        CASES[CASE]()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
