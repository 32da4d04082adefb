"""peft_check.py — ctest hf.peft.<case>: adapter_config.json as PEFT writes
it, honoured exactly or refused by name, on tiny random GPT-2 (Conv1D) and
Llama (Linear) models.

fields   every key of a default LoraConfig().save_pretrained() is in the
         engine's field table (`trainyard-engine adapter-fields`), so a
         field a newer PEFT adds is noticed here.
refuse   each refused field (and an unknown one): `logits --adapter` exits
         2 with an `error` event naming it; training with lora.adapter
         fails the same way; POST /jobs answers 400 naming
         lora.adapter:adapter_config.json.<field>. A tensor that is not
         one of the targets' adapters is named.
rslora   use_rslora, patterns (rank_pattern / alpha_pattern), layers
patterns (layers_to_transform with and without layers_pattern, regex
layers   target_modules, exclude_modules), both ways:
         1. PEFT writes the adapter (lora_B drawn from N(0, 0.5)); the
            engine's `logits --adapter` equals PeftModel's logits (1e-5).
         2. the engine trains STEPS steps from that adapter (lora.adapter;
            rslora: with lora.use_rslora) and PyTorch trains the PeftModel
            the same way: losses within 1e-4; the engine's export, loaded
            by PeftModel.from_pretrained, gives the engine's logits (1e-5).
         rslora also trains from scratch with lora.use_rslora and checks
         the export the same way.
bias     bias lora_only and all, the same both ways on GPT-2 and on a
         Llama with attention_bias (PEFT's biases moved too); the export
         holds PEFT's tensor names; generate --adapter equals
         merge_and_unload's greedy tokens; a run from scratch with
         lora.bias "all".
save     modules_to_save the same way: Llama's embed_tokens and lm_head,
         GPT-2's wpe and ln_f; GPT-2's tied wte refused by name.
embed    LoRA on the token embedding (PEFT's lora.Embedding) the same
         way, GPT-2's tied wte and Llama's embed_tokens beside a linear
         target; generate --adapter equals merge_and_unload; a run from
         scratch targeting it.
dora     use_dora (PEFT's DoraLinearLayer) the same way on GPT-2's Conv1D
         (with biases) and Llama's Linear, the magnitudes perturbed; the
         merged generate; two steps with lora.dropout against PEFT's
         dropout branch drawing the engine's masks; a run from scratch
         with lora.use_dora.

Usage: peft_check.py ENGINE WORKDIR CASE [TRAINYARD]"""
import json
import os
import shutil
import subprocess
import sys

import peft
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from hfcommon import (check_close, engine_error, engine_logits, fail, job_spec, load_model,  # noqa: E402
                      make_model, write_json)
from ref_check import compare_losses, torch_train, write_rows  # noqa: E402

LOGIT_TOL = 1e-5
STEPS, BATCH, SEQ = 2, 2, 12
ARCHS = ("gpt2", "llama")
torch.set_num_threads(1)


def setup(work, arch, **config):
    base = os.path.join(work, arch, "base")
    make_model(arch, base, **config)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 97, (16,), generator=g).tolist()
    rows = torch.randint(0, 97, (BATCH, SEQ), generator=g).tolist()
    data = os.path.join(work, arch, "train.jsonl")
    write_rows(data, rows)
    return base, ids, rows, data


def peft_adapter(base, out, **cfg):
    """PEFT's own adapter with B drawn non-zero and the other trained
    tensors (biases) moved off the base's, saved to out."""
    pm = peft.get_peft_model(load_model(base), peft.LoraConfig(lora_dropout=0.0, **cfg))
    torch.manual_seed(5)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
            elif p.requires_grad and "lora_A" not in n:
                p.add_(torch.randn_like(p) * 0.3)
    pm.save_pretrained(out)
    return pm


def peft_logits(base, adapter, ids):
    pm = peft.PeftModel.from_pretrained(load_model(base), adapter).eval()
    with torch.no_grad():
        return pm(torch.tensor([ids])).logits[0]


def check_export(engine, base, export, ids, what):
    check_close(f"{what}: PeftModel.from_pretrained(export) vs engine", engine_logits(
        engine, ["--model", base, "--adapter", export], ids), peft_logits(base, export, ids), LOGIT_TOL)


def run_engine_events(engine, spec, workdir):
    os.makedirs(workdir, exist_ok=True)
    sp = os.path.join(workdir, "spec.json")
    write_json(sp, spec)
    cmd = ["/bin/bash", "-c", 'exec "$0" "$@" 3>&1 1>&2', engine, "--spec", sp, "--workdir", workdir]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return r.returncode, [json.loads(l) for l in r.stdout.splitlines() if l.strip()], r.stderr


def from_scratch(engine, work, arch, model, name, lora, what, want=None):
    """A LoRA run from fresh adapters with `lora` (r 4, lr 3e-2) in the spec:
    its export loads in PEFT with the engine's logits (check_export), and its
    adapter_config.json holds each key of `want` with that value and type."""
    base, ids, _, data = model
    spec = job_spec(base, data, STEPS, BATCH, SEQ, method="lora", lora=dict(r=4, **lora), lr=3e-2)
    wd = os.path.join(work, arch, name + "-fresh")
    train(engine, spec, wd)
    export = os.path.join(wd, "export")
    cfg = json.load(open(os.path.join(export, "adapter_config.json")))
    for k, v in (want or {}).items():
        if cfg.get(k) != v or type(cfg.get(k)) is not type(v):
            fail(f"{arch}: the export's adapter_config.json lacks {k} {v!r}")
    check_export(engine, base, export, ids, f"{arch} {what} from scratch")


def train(engine, spec, workdir):
    code, events, err = run_engine_events(engine, spec, workdir)
    done = [e for e in events if e["ev"] == "done"]
    if code != 0 or not done or done[-1]["status"] != "succeeded":
        fail(f"engine exit {code}: {[e for e in events if e['ev'] == 'error']}\n{err[-2000:]}")
    return [e for e in events if e["ev"] == "metric"]


def both_ways(engine, work, arch, model, name, cfg, spec_lora=None):
    """PEFT's adapter in the engine, then the engine's training and export
    in PEFT (see the module docstring). model: setup()'s tuple."""
    base, ids, rows, data = model
    ad = os.path.join(work, arch, name, "peft")
    peft_adapter(base, ad, **cfg)
    check_close(f"{arch} {name}: engine logits --adapter vs PeftModel", engine_logits(
        engine, ["--model", base, "--adapter", ad], ids), peft_logits(base, ad, ids), LOGIT_TOL)

    lora = {"r": cfg.get("r", 8), "alpha": cfg.get("lora_alpha", 8), "dropout": 0.0, "adapter": ad}
    lora.update(spec_lora or {})
    spec = job_spec(base, data, STEPS, BATCH, SEQ, method="lora", lora=lora)
    wd = os.path.join(work, arch, name, "engine")
    got = train(engine, spec, wd)
    pm = peft.PeftModel.from_pretrained(load_model(base), ad, is_trainable=True)
    params = [p for p in pm.parameters() if p.requires_grad]
    compare_losses(f"{arch} {name}: losses", got, torch_train(pm, params, rows, spec["hyperparameters"]))
    export = os.path.join(wd, "export")
    from safetensors import safe_open
    keys = [sorted(safe_open(os.path.join(d, "adapter_model.safetensors"), "pt").keys()) for d in (ad, export)]
    if keys[0] != keys[1]:
        fail(f"{arch} {name}: the export's tensors {keys[1]} are not PEFT's {keys[0]}")
    check_export(engine, base, export, ids, f"{arch} {name}")
    return export


def case_fields(engine, work):
    d = os.path.join(work, "default")
    peft.LoraConfig().save_pretrained(d)
    keys = list(json.load(open(os.path.join(d, "adapter_config.json"))))
    r = subprocess.run([engine, "adapter-fields"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        fail(f"adapter-fields: exit {r.returncode}: {r.stderr}")
    table = {l.split("\t")[0]: l.split("\t")[1] for l in r.stdout.splitlines() if l.strip()}
    missing = [k for k in keys if k not in table]
    if missing:
        fail(f"PEFT {peft.__version__} writes adapter_config.json fields the engine's table "
             f"(engine/peftcfg.c) does not know: {missing}")
    print(f"  all {len(keys)} fields of PEFT {peft.__version__}'s LoraConfig are in the table "
          f"({sum(v == 'honoured' for v in table.values())} honoured, "
          f"{sum(v == 'ignored' for v in table.values())} ignored, "
          f"{sum(v.startswith('refused') for v in table.values())} refused unless default)")


# (field, value): each refused with an error naming the field.
REFUSED = [("bias", "lora_everything"),
           ("loftq_config", {"loftq_bits": 4}), ("layer_replication", [[0, 1]]),
           ("target_parameters", ["transformer.h.0.mlp.c_fc.weight"]), ("trainable_token_indices", [1, 2]),
           ("init_lora_weights", "pissa"), ("peft_type", "IA3"), ("task_type", "SEQ_CLS"), ("lora_bias", True),
           ("use_qalora", True), ("eva_config", {"rho": 2.0}), ("alora_invocation_tokens", [5]),
           ("megatron_config", {}), ("a_field_from_the_future", 1)]


def case_refuse(engine, work, trainyard):
    base, ids, rows, data = setup(work, "gpt2")
    good = os.path.join(work, "good")
    peft_adapter(base, good, r=4, lora_alpha=8, target_modules=["c_attn"])
    cfg0 = json.load(open(os.path.join(good, "adapter_config.json")))
    dirs = []
    for i, (field, value) in enumerate(REFUSED):
        d = os.path.join(work, f"bad{i}-{field}")
        shutil.copytree(good, d)
        write_json(os.path.join(d, "adapter_config.json"), dict(cfg0, **{field: value}))
        dirs.append((field, d))
        code, err, out = engine_error(engine, "logits", ["--model", base, "--adapter", d, "--prompt-ids", "5 6"])
        msg = (err or {}).get("message", "")
        if code != 2 or field not in msg:
            fail(f"logits with {field} = {value!r}: exit {code}, error {err}; wanted exit 2 naming {field}")
        print(f"  logits, {field} = {json.dumps(value)}: exit 2: {msg[:150]}")
    # Training with lora.adapter: the same refusal (two of them; the reader is shared).
    for field, d in dirs[:1] + dirs[-1:]:
        spec = job_spec(base, data, 1, BATCH, SEQ, method="lora",
                        lora={"r": 4, "alpha": 8, "targets": ["c_attn"], "adapter": d})
        code, events, _ = run_engine_events(engine, spec, os.path.join(d, "run"))
        errs = [e for e in events if e["ev"] == "error"]
        if code != 2 or not errs or field not in errs[-1]["message"]:
            fail(f"training with lora.adapter ({field}): exit {code}, errors {errs}; wanted exit 2 naming {field}")
        print(f"  training, {field}: exit 2: {errs[-1]['message'][:150]}")
    # A tensor beyond the targets' adapters is named in the refusal (not a
    # tensor that does belong).
    from safetensors.torch import load_file, save_file
    extra = os.path.join(work, "extra-tensor")
    shutil.copytree(good, extra)
    st = os.path.join(extra, "adapter_model.safetensors")
    t = load_file(st)
    stray = "base_model.model.transformer.h.0.mlp.c_fc.lora_A.weight"
    t[stray] = torch.zeros(4, 32)
    save_file(t, st, metadata={"format": "pt"})
    code, err, _ = engine_error(engine, "logits", ["--model", base, "--adapter", extra, "--prompt-ids", "5"])
    if code == 0 or stray not in (err or {}).get("message", ""):
        fail(f"an adapter file with a stray {stray}: exit {code}, error {err}")
    print(f"  a stray tensor: exit {code}: {err['message'][-150:]}")
    # The accepted original still runs (no field of a real PEFT config is refused).
    engine_logits(engine, ["--model", base, "--adapter", good], ids)
    if trainyard:
        os.environ["TY_BIN"], os.environ["TY_FAKE_ENGINE"] = trainyard, engine
        sys.path.insert(0, os.path.join(HERE, "..", "server"))
        import tyharness
        srv = tyharness.Server("--cpu-slots", "1", roots=work)
        try:
            def spec(d, r=4):
                return {"name": "x", "model": {"path": base}, "dataset": {"train": data}, "method": "lora",
                        "lora": {"r": r, "alpha": 8, "adapter": d}, "hyperparameters": {"max_steps": 1, "seq_len": 4},
                        "resources": {"backend": "cpu"}}
            for field, d in dirs:
                r = srv.post("/jobs", spec(d))
                err = r.json.get("error", {}) if isinstance(r.json, dict) else {}
                want = f"lora.adapter:adapter_config.json.{field}"
                if r.status != 400 or err.get("field") != want:
                    fail(f"POST /jobs with {field}: {r.status} {r.body[:300]!r}; wanted 400 naming {want}")
                print(f"  POST /jobs, {field}: 400 {want}")
            r = srv.post("/jobs", spec(good, r=8))
            if r.status != 400 or r.json["error"].get("field") != "lora.r":
                fail(f"POST /jobs with lora.r 8 on an r 4 adapter: {r.status} {r.body[:300]!r}")
            r = srv.post("/jobs", spec(good))
            if r.status != 201:
                fail(f"POST /jobs with PEFT's own adapter: {r.status} {r.body[:300]!r}")
            print("  POST /jobs: PEFT's own adapter 201, lora.r against its r 400")
        finally:
            srv.stop()
    print("every refused field is named, at each reader")


def targets(arch):
    return ["c_attn", "c_proj", "c_fc"] if arch == "gpt2" else ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]


def case_rslora(engine, work):
    for arch in ARCHS:
        model = setup(work, arch)
        base, ids, _, data = model
        both_ways(engine, work, arch, model, "rslora",
                                       dict(r=4, lora_alpha=6, use_rslora=True, target_modules=targets(arch)),
                                       {"use_rslora": True})
        # From scratch: lora.use_rslora in the spec, written to the export.
        from_scratch(engine, work, arch, model, "rslora",
                     {"alpha": 6, "use_rslora": True, "targets": targets(arch)}, "rslora",
                     want={"use_rslora": True})


PATTERNS = {
    "gpt2": dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"],
                 rank_pattern={"h.1.attn.c_attn": 6, r"h\.\d\.mlp\.c_fc": 2},
                 alpha_pattern={"h.0.mlp.c_proj": 3, "c_proj": 20, "c_fc": 5.5}),
    "llama": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
                  rank_pattern={"layers.1.mlp.down_proj": 6, "o_proj": 2},
                  alpha_pattern={"model.layers.0.self_attn.q_proj": 2.5, r"v_pro[j]": 16}),
}


def case_patterns(engine, work):
    for arch in ARCHS:
        export = both_ways(engine, work, arch, setup(work, arch), "patterns", PATTERNS[arch])
        got = json.load(open(os.path.join(export, "adapter_config.json")))
        for k in ("rank_pattern", "alpha_pattern"):
            if got[k] != PATTERNS[arch][k]:
                fail(f"{arch}: the export's {k} {got[k]} is not the adapter's {PATTERNS[arch][k]}")


LAYERS = {
    "gpt2": [("layers", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], layers_to_transform=[1])),
             ("layers_pattern", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"], layers_to_transform=0,
                                     layers_pattern="h")),
             ("regex", dict(r=4, lora_alpha=8, target_modules=r".*\.h\.0\.(attn|mlp)\.c_(attn|fc)"))],
    "llama": [("layers", dict(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"], layers_to_transform=[0])),
              ("layers_pattern", dict(r=4, lora_alpha=8, target_modules=["v_proj", "gate_proj"],
                                      layers_to_transform=[1], layers_pattern=["layers"])),
              ("regex", dict(r=4, lora_alpha=8, target_modules=r"model\.layers\.\d+\.self_attn\.(q|v)_pro.",
                             exclude_modules=["layers.1.self_attn.q_proj"]))],
}


def merged_generate(engine, base, adapter, what):
    """generate --adapter (the merge the KV cache runs on) against PEFT's
    merge_and_unload, greedy."""
    pm = peft.PeftModel.from_pretrained(load_model(base), adapter).merge_and_unload().eval()
    prompt = [5, 17, 33, 8, 61]
    with torch.no_grad():
        out = pm.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12, num_beams=1,
                          pad_token_id=0, eos_token_id=None)
    want = out[0, len(prompt):].tolist()
    got = subprocess.run([engine, "generate", "--model", base, "--adapter", adapter, "--max-tokens", "12",
                          "--prompt-ids", " ".join(map(str, prompt)), "--ignore-eos"],
                         capture_output=True, text=True, timeout=120)
    if got.returncode != 0:
        fail(f"{what}: generate --adapter exit {got.returncode}: {got.stdout[-800:]}")
    ids = json.loads(got.stdout.splitlines()[-1])["ids"]
    print(f"  {what}: generate --adapter vs merge_and_unload: {'identical' if ids == want else 'DIFFER'}")
    if ids != want:
        fail(f"{what}: generate --adapter {ids} vs merge_and_unload {want}")


# bias: GPT-2's linears and norms have biases; Llama's attention gets them
# (attention_bias), so "all" there takes q/k/v/o's and lora_only the
# targeted q/o's.
BIAS_MODEL = {"gpt2": {}, "llama": {"attention_bias": True}}
BIAS_TARGETS = {"gpt2": ["c_attn", "c_fc"], "llama": ["q_proj", "o_proj", "down_proj"]}


def case_bias(engine, work):
    for arch in ARCHS:
        model = setup(work, arch, **BIAS_MODEL[arch])
        base, ids, _, data = model
        for bias in ("lora_only", "all"):
            export = both_ways(engine, work, arch, model, f"bias-{bias}",
                               dict(r=4, lora_alpha=8, target_modules=BIAS_TARGETS[arch], bias=bias), {"bias": bias})
            if json.load(open(os.path.join(export, "adapter_config.json"))).get("bias") != bias:
                fail(f"{arch}: the export's adapter_config.json lacks bias {bias}")
            merged_generate(engine, base, export, f"{arch} bias {bias}")
        # From scratch: lora.bias in the spec, the biases in the export.
        from_scratch(engine, work, arch, model, "bias", {"alpha": 8, "bias": "all", "targets": BIAS_TARGETS[arch]},
                     "bias all")


# modules_to_save: Llama's (untied) embeddings and head; GPT-2's position
# embedding and final norm (its wte is tied to the head: refused).
SAVE = {"gpt2": (["c_attn"], ["wpe", "ln_f"]), "llama": (["q_proj", "v_proj"], ["embed_tokens", "lm_head"])}


def case_save(engine, work):
    for arch in ARCHS:
        model = setup(work, arch)
        base, ids, _, data = model
        tm, save = SAVE[arch]
        export = both_ways(engine, work, arch, model, "save",
                           dict(r=4, lora_alpha=8, target_modules=tm, modules_to_save=save), {"modules_to_save": save})
        if json.load(open(os.path.join(export, "adapter_config.json"))).get("modules_to_save") != save:
            fail(f"{arch}: the export's adapter_config.json lacks modules_to_save {save}")
        merged_generate(engine, base, export, f"{arch} modules_to_save")
        from_scratch(engine, work, arch, model, "save", {"alpha": 8, "targets": tm, "modules_to_save": save},
                     "modules_to_save")
    # GPT-2's tied wte: refused by name.
    base = os.path.join(work, "gpt2", "base")
    tied = os.path.join(work, "gpt2", "tied")
    peft_adapter(base, tied, r=4, lora_alpha=8, target_modules=["c_attn"], modules_to_save=["wte"])
    code, err, _ = engine_error(engine, "logits", ["--model", base, "--adapter", tied, "--prompt-ids", "5"])
    if code != 2 or "modules_to_save" not in (err or {}).get("message", ""):
        fail(f"modules_to_save [wte] on tied GPT-2: exit {code}, error {err}")
    print(f"  GPT-2 modules_to_save [wte]: exit 2: {err['message'][:160]}")


# LoRA on the token embedding (lora.Embedding): GPT-2's wte, tied to the
# head (the adapter changes the input side only; the merge, like
# merge_and_unload, the shared tensor), and Llama's embed_tokens (whose
# base weights PEFT saves in the adapter file too).
EMBED = {"gpt2": ["wte", "c_attn"], "llama": ["embed_tokens", "q_proj"]}


def case_embed(engine, work):
    for arch in ARCHS:
        model = setup(work, arch)
        base, ids, _, data = model
        tm = EMBED[arch]
        export = both_ways(engine, work, arch, model, "embed", dict(r=4, lora_alpha=8, target_modules=tm),
                           {"targets": tm})
        merged_generate(engine, base, export, f"{arch} embedding")
        from_scratch(engine, work, arch, model, "embed", {"alpha": 8, "targets": tm}, "embedding")


M64 = (1 << 64) - 1


def engine_keep(seed, offset, n, p):
    """kn_dropout_fwd's mask (kernels/cpu/cpu_elementwise.c) in numpy."""
    import numpy as np

    def mix(z):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
        return z ^ (z >> np.uint64(31))
    key = int(mix(np.array([seed], dtype=np.uint64))[0])
    with np.errstate(over="ignore"):
        i = np.arange(n, dtype=np.uint64)
        z = mix(np.uint64(key) + (np.uint64(offset) + i + np.uint64(1)) * np.uint64(0x9e3779b97f4a7c15))
    u = (z >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    return torch.from_numpy(u >= np.float32(p))


class EngineDropout(torch.nn.Module):
    """The engine's dropout on adapter `ix` of `n` (lora.c: offset
    (step * n + ix) << 32, one micro-batch a step), so PEFT's training
    branch draws the engine's masks."""

    def __init__(self, ix, n, p, seed):
        super().__init__()
        self.ix, self.n, self.p, self.seed, self.step = ix, n, p, seed, 0

    def forward(self, x):
        keep = engine_keep(self.seed, (self.step * self.n + self.ix) << 32, x.numel(), self.p)
        self.step += 1
        scale = torch.tensor(1.0, dtype=torch.float32) / (1.0 - torch.tensor(self.p, dtype=torch.float32))
        return torch.where(keep.view(x.shape), x * scale, torch.zeros_like(x))


def dora_dropout(engine, work, arch, model, ad, p=0.25):
    """DoRA with dropout: PEFT's other branch (the base part on d(x)),
    the LoRA layers alone in training mode with the engine's masks."""
    base, ids, rows, data = model
    spec = job_spec(base, data, STEPS, BATCH, SEQ, method="lora",
                    lora={"r": 4, "alpha": 8, "dropout": p, "use_dora": True, "adapter": ad})
    got = train(engine, spec, os.path.join(work, arch, "dora-dropout"))
    pm = peft.PeftModel.from_pretrained(load_model(base), ad, is_trainable=True)
    layers = [m for _, m in pm.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)]
    for i, m in enumerate(layers):
        m.lora_dropout["default"] = EngineDropout(i, len(layers), p, spec["hyperparameters"]["seed"])
        m.train = (lambda orig: lambda mode=True: orig(True))(m.train)  # stays in training mode
    params = [q for q in pm.parameters() if q.requires_grad]
    compare_losses(f"{arch} DoRA with dropout {p}: losses", got, torch_train(pm, params, rows, spec["hyperparameters"]))


def case_dora(engine, work):
    for arch in ARCHS:
        model = setup(work, arch)
        base, ids, _, data = model
        export = both_ways(engine, work, arch, model, "dora",
                           dict(r=4, lora_alpha=8, target_modules=targets(arch), use_dora=True), {"use_dora": True})
        merged_generate(engine, base, export, f"{arch} DoRA")
        dora_dropout(engine, work, arch, model, os.path.join(work, arch, "dora", "peft"))
        from_scratch(engine, work, arch, model, "dora", {"alpha": 8, "use_dora": True, "targets": targets(arch)},
                     "DoRA", want={"use_dora": True})


def case_layers(engine, work):
    for arch in ARCHS:
        model = setup(work, arch)
        for name, cfg in LAYERS[arch]:
            both_ways(engine, work, arch, model, name, cfg)


def main():
    engine, work, case = sys.argv[1:4]
    trainyard = sys.argv[4] if len(sys.argv) > 4 else None
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if case == "fields":
        case_fields(engine, work)
    elif case == "refuse":
        case_refuse(engine, work, trainyard)
    else:
        {"rslora": case_rslora, "patterns": case_patterns, "layers": case_layers, "bias": case_bias,
         "save": case_save, "embed": case_embed, "dora": case_dora}[case](engine, work)
        print(f"{case}: the engine and peft agree both ways on GPT-2 and Llama")


if __name__ == "__main__":
    main()
