"""gen16_check.py — ctest hf.generate16: a 16-bit checkpoint generates in 16
bits (docs/engine.md, Generation), held to transformers running the same
file in that dtype.

For GPT-2 and Llama (tiny random models transformers creates, saved with
`model.to(bfloat16 | float16).save_pretrained`, so config.json says
`dtype: bfloat16`):
- `generate` with the default --dtype auto reports dtype bf16 / fp16 (the
  products read 16-bit weights);
- the engine's scheme exactly: transformers' model in fp32 on the same
  (16-bit) weights with every linear layer's input rounded to the 16-bit
  type (a forward pre-hook) — what the engine computes (kvcache.h) — gives
  the same greedy tokens, token for token, and `logits --kv` within 1e-4 of
  its logits, while the engine's fp32 logits of the same file (--dtype fp32)
  are measurably farther: the 16-bit products really run;
- transformers itself in that dtype (`from_pretrained(dtype="auto")`,
  16-bit end to end, residual stream included): greedy tokens identical up
  to where its rounding makes them part, which is printed (the first token
  must agree), and logits within 16-bit rounding;
- an fp32 model with --dtype bf16 equals transformers' model.to(bfloat16)
  the same way;
- --dtype fp8 and `logits --dtype bf16` without --kv are usage errors.

Usage: gen16_check.py ENGINE WORKDIR"""
import json
import os
import shutil
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hfcommon import engine_error, engine_json, fail, make_model, rel_err  # noqa: E402

NEW = 24
TOL = {torch.bfloat16: 3e-2, torch.float16: 5e-3}  # max |diff| / max |logit|
torch.set_num_threads(1)


def hf_greedy(model, ids):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW,
                             min_new_tokens=NEW, num_beams=1, pad_token_id=0)
    return out[0, len(ids):].tolist()


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double()


def rounding_inputs(model, tdt):
    """model (fp32) with each linear layer's input rounded to tdt first."""
    from transformers.pytorch_utils import Conv1D
    for mod in model.modules():
        if isinstance(mod, (torch.nn.Linear, Conv1D)):
            mod.register_forward_pre_hook(lambda _m, a: (a[0].to(tdt).float(),) + tuple(a[1:]))
    return model


def logits(engine, model_dir, ids, dtype):
    j = engine_json(engine, "logits", ["--model", model_dir, "--prompt-ids", " ".join(map(str, ids)),
                                       "--kv", "--dtype", dtype])
    return torch.tensor(j["logits"], dtype=torch.float64)


def check_model(engine, what, model_dir, hf, emu, tdt, dtype_arg, prompt):
    """hf: transformers in tdt; emu: fp32 on the same weights, inputs of the
    linear layers rounded to tdt (the engine's scheme)."""
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[tdt]
    args = ["--model", model_dir, "--max-tokens", str(NEW), "--ignore-eos",
            "--prompt-ids", " ".join(map(str, prompt))] + (["--dtype", dtype_arg] if dtype_arg else [])
    r = engine_json(engine, "generate", args)
    if r["dtype"] != name:
        fail(f"{what}: generate ran in {r['dtype']}, wanted {name}")
    got = r["ids"]
    want_e = hf_greedy(emu, prompt)
    if got != want_e:
        fail(f"{what}: greedy {name}: engine {got} vs the fp32 model with {name} linear inputs {want_e}")
    want = hf_greedy(hf, prompt)
    part = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    print(f"  {what}: greedy {name}: {NEW} tokens = the engine's scheme in PyTorch; vs transformers in "
          f"{name}: " + ("all identical" if part is None else
                         f"identical up to token {part} (then engine {got[part]} vs {want[part]})"),
          flush=True)
    if part == 0:
        fail(f"{what}: the first greedy token differs from transformers in {name}: {got} vs {want}")
    got16 = logits(engine, model_dir, prompt, name)
    got32 = logits(engine, model_dir, prompt, "fp32")
    l_emu, l_hf = hf_logits(emu, prompt), hf_logits(hf, prompt)
    e_emu, e32, e_hf = rel_err(got16, l_emu), rel_err(got32, l_emu), rel_err(got16, l_hf)
    print(f"  {what}: logits --kv {name}: {e_emu:.1e} from the scheme in PyTorch (engine fp32: {e32:.1e}), "
          f"{e_hf:.1e} from transformers in {name}")
    if not e_emu <= 1e-4:
        fail(f"{what}: {name} logits differ from the scheme in PyTorch by {e_emu:.3g} > 1e-4")
    if not e32 > 3 * e_emu:
        fail(f"{what}: the fp32 logits ({e32:.3g}) are as near the {name} scheme as the {name} ones "
             f"({e_emu:.3g}): are the products 16-bit?")
    if not e_hf <= TOL[tdt]:
        fail(f"{what}: {name} logits differ from transformers' by {e_hf:.3g} > {TOL[tdt]}")


def expect_usage(engine, sub, args, needle):
    rc, err, out = engine_error(engine, sub, args)
    if rc != 2 or not err or needle not in err["message"]:
        fail(f"{sub} {args}: wanted exit 2 and an error naming {needle!r}; got exit {rc}, "
             f"{out[-300:]!r}")
    print(f"  {sub} {' '.join(args[-2:])}: exit 2, \"{err['message'][:80]}\"")


def main():
    engine, work = sys.argv[1:3]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    g = torch.Generator().manual_seed(5)
    for arch in ["gpt2", "llama"]:
        for tdt in [torch.bfloat16, torch.float16]:
            d = os.path.join(work, f"{arch}-{tdt}".replace("torch.", ""))
            make_model(arch, d, seed=13).to(tdt).save_pretrained(d)
            cfg = json.load(open(os.path.join(d, "config.json")))
            if cfg.get("dtype", cfg.get("torch_dtype")) not in ("bfloat16", "float16"):
                fail(f"{d}: config.json does not say a 16-bit dtype: {cfg}")
            hf = transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager",
                                                                   dtype="auto").eval()
            if next(hf.parameters()).dtype != tdt:
                fail(f"{d}: transformers loaded {next(hf.parameters()).dtype}, not {tdt}")
            emu = rounding_inputs(transformers.AutoModelForCausalLM.from_pretrained(
                d, attn_implementation="eager", dtype=torch.float32).eval(), tdt)
            prompt = torch.randint(3, 97, (7,), generator=g).tolist()
            check_model(engine, f"{arch} {tdt}".replace("torch.", ""), d, hf, emu, tdt, None, prompt)
        # an fp32 file generated in bf16 on request
        d = os.path.join(work, f"{arch}-fp32")
        make_model(arch, d, seed=17)
        emu = transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager",
                                                                dtype=torch.float32).eval()
        with torch.no_grad():  # the weights rounded as the engine's copy is (nearest even)
            for p in emu.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        hf = transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager",
                                                               dtype=torch.bfloat16).eval()
        prompt = torch.randint(3, 97, (7,), generator=g).tolist()
        check_model(engine, f"{arch} fp32 file --dtype bf16", d, hf, rounding_inputs(emu, torch.bfloat16),
                    torch.bfloat16, "bf16", prompt)
    d = os.path.join(work, "llama-fp32")
    expect_usage(engine, "generate", ["--model", d, "--prompt-ids", "5 6", "--dtype", "fp8"], "--dtype")
    expect_usage(engine, "logits", ["--model", d, "--prompt-ids", "5 6", "--dtype", "bf16"], "--kv")
    print("hf.generate16: ok")


if __name__ == "__main__":
    main()
