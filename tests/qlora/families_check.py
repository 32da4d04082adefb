"""qlora.families — method "qlora" on every supported family, and on a long sequence.

1. Phi-3 (fused qkv_proj and gate_up_proj: each quantised whole, as
   bitsandbytes quantises a Linear4bit, and multiplied by row blocks, the
   views of kn_nf4.first), Qwen3 (q_norm / k_norm, head_dim != hidden /
   heads) and Llama 3.x (llama3 rope scaling, tied head): adapters on every
   block linear, trained against peft LoRA on the model whose linears are
   dequant(quant(W)) (nf4_ref.py), the loop of qlora_check.py: losses within
   1e-4 per step, trained adapters within 1e-3; the un-quantised model's
   first loss differs (the test sees the quantisation).
2. Recompute on a long sequence: a Llama with 1024 positions at seq 1024,
   recompute "all" and "mlp" against none: bit-identical losses and
   adapters, fewer activation bytes in started.memory, and the losses of
   peft on dequant(quant(W)) with gradient checkpointing within 1e-4.
Usage: families_check.py ENGINE WORKDIR
"""
import os
import shutil
import sys

import peft
import torch
import transformers
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "hf"))
from hfcommon import fail, job_spec, load_model, lora_targets, make_model, rel_err  # noqa: E402
from qlora_check import dequantised_model, engine_events, start_adapter, torch_train, write_rows  # noqa: E402

LOSS_TOL, WEIGHT_TOL = 1e-4, 1e-3
R_, ALPHA = 4, 8
torch.set_num_threads(1)


def reference(base_dir, targets, lcfg, sd0, rows, hp, gc=False):
    pm = peft.get_peft_model(dequantised_model(base_dir, True, targets), lcfg)
    pm.load_state_dict(sd0, strict=False)
    if gc:
        pm.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        pm.base_model.model.enable_input_require_grads()
    params = [p for p in pm.parameters() if p.requires_grad]
    losses = torch_train(pm, params, rows, hp)
    return losses, {k.replace(".default", ""): v for k, v in pm.state_dict().items() if "lora_" in k}


def compare(what, got, want, ad_got, ad_want):
    print(f"  {what}: engine {['%.7f' % l for l in got]}\n  {' ' * len(what)}  torch  {['%.7f' % l for l in want]}")
    if len(got) != len(want) or any(not abs(a - b) / abs(b) <= LOSS_TOL for a, b in zip(got, want)):
        fail(f"{what}: losses {got} vs torch {want}")
    if sorted(ad_got) != sorted(ad_want):
        fail(f"{what}: adapter keys {sorted(ad_got)[:3]}... vs peft {sorted(ad_want)[:3]}...")
    worst = max(rel_err(ad_got[k], v) for k, v in ad_want.items())
    if not worst <= WEIGHT_TOL:
        fail(f"{what}: trained adapters rel {worst:.2e} vs peft")
    print(f"  {what}: {len(ad_want)} adapter tensors within {worst:.1e}")


def family(engine, work, arch):
    base_dir = os.path.join(work, arch, "base")
    make_model(arch, base_dir)
    targets = lora_targets(arch)
    g = torch.Generator().manual_seed(3)
    rows = torch.randint(0, 97, (2, 16), generator=g).tolist()
    data = os.path.join(work, arch, "train.jsonl")
    write_rows(data, rows)
    lcfg, sd0 = start_adapter(base_dir, targets, os.path.join(work, arch, "adapter0"))
    spec = job_spec(base_dir, data, 3, 2, 16, method="qlora",
                    lora={"r": R_, "alpha": ALPHA, "dropout": 0.0, "targets": targets,
                          "adapter": os.path.join(work, arch, "adapter0")},
                    qlora={"double_quant": True, "compute_dtype": "auto"})
    wd = os.path.join(work, arch, "run")
    ev = engine_events(engine, spec, wd)
    got = [e["loss"] for e in ev if e["ev"] == "metric"]
    want, ad_want = reference(base_dir, targets, lcfg, sd0, rows, spec["hyperparameters"])
    compare(arch, got, want, load_file(os.path.join(wd, "export", "adapter_model.safetensors")), ad_want)
    full = peft.get_peft_model(load_model(base_dir), lcfg)
    full.load_state_dict(sd0, strict=False)
    with torch.no_grad():
        lf = full(input_ids=torch.tensor(rows), labels=torch.tensor(rows)).loss.item()
    if abs(lf - got[0]) / abs(lf) <= LOSS_TOL:
        fail(f"{arch}: the first loss {got[0]} equals the un-quantised model's {lf}")
    mem = next(e for e in ev if e["ev"] == "started")["memory"]
    if not mem.get("quantized_weights", 0) > 0:
        fail(f"{arch}: started.memory {mem}")


def long_sequence(engine, work):
    T = 1024
    base_dir = os.path.join(work, "long", "base")
    torch.manual_seed(11)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=T, vocab_size=97,
                                   tie_word_embeddings=False, attention_dropout=0.0)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.08)
    m.save_pretrained(base_dir)
    targets = lora_targets("llama")
    rows = torch.randint(0, 97, (1, T), generator=torch.Generator().manual_seed(4)).tolist()
    data = os.path.join(work, "long", "train.jsonl")
    write_rows(data, rows)
    lcfg, sd0 = start_adapter(base_dir, targets, os.path.join(work, "long", "adapter0"))
    res = {}
    for rc in ("none", "mlp", "all"):
        spec = job_spec(base_dir, data, 2, 1, T, method="qlora",
                        lora={"r": R_, "alpha": ALPHA, "dropout": 0.0, "targets": targets,
                              "adapter": os.path.join(work, "long", "adapter0")},
                        qlora={"double_quant": True})
        spec["hyperparameters"]["recompute"] = rc
        wd = os.path.join(work, "long", rc)
        ev = engine_events(engine, spec, wd)
        res[rc] = ([e["loss"] for e in ev if e["ev"] == "metric"],
                   load_file(os.path.join(wd, "export", "adapter_model.safetensors")),
                   next(e for e in ev if e["ev"] == "started")["memory"]["activations"])
    print(f"  seq {T}: activations none {res['none'][2]} mlp {res['mlp'][2]} all {res['all'][2]} bytes")
    for rc in ("mlp", "all"):
        if res[rc][0] != res["none"][0] or any(not torch.equal(res[rc][1][k], v) for k, v in res["none"][1].items()):
            fail(f"recompute {rc} at seq {T}: losses {res[rc][0]} vs {res['none'][0]}, or adapters differ")
    if not res["all"][2] < res["mlp"][2] < res["none"][2]:
        fail(f"recompute does not shrink started.memory.activations: {[res[k][2] for k in res]}")
    print(f"  recompute mlp / all: bit-identical losses and adapters; activations "
          f"{res['all'][2] / res['none'][2]:.2f}x with all")
    want, ad_want = reference(base_dir, targets, lcfg, sd0, rows, spec["hyperparameters"], gc=True)
    compare(f"seq {T} recompute all", res["all"][0], want, res["all"][1], ad_want)


def main():
    engine, work = sys.argv[1:3]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    print("1. Phi-3, Qwen3, Llama 3.x against peft on dequant(quant(W))", flush=True)
    for arch in ("phi3", "qwen3", "llama3"):
        family(engine, work, arch)
    print("2. recompute with QLoRA on a long sequence", flush=True)
    long_sequence(engine, work)
    print("qlora.families: all checks passed")


main()
