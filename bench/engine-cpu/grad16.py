# grad16.py — should the flat gradient buffer of a bf16 run be fp32 or bf16?
# (the decision and figures are in docs/engine.md and
# docs/benchmarks.md.)
#
# Runs tests/engine_ref/mixedref.py — the PyTorch model of the engine's
# bf16 scheme (16-bit weights and activations, fp32 masters and AdamW) —
# three ways on the same GPT-2 and data, side by side: fp32 throughout;
# bf16 with fp32 gradient accumulation (the engine); bf16 with the
# gradient buffer itself in bf16 (llm.c's choice: every micro-batch's
# gradient is added to it and the sum rounded to bf16, done here with a
# post-accumulate hook on each master). Prints the first step's gradient
# error against fp32 accumulation of the same bf16 micro-batch gradients,
# for 1..grad_accum micro-batches, and each run's loss curve distance from
# fp32's.
#
# Usage: grad16.py [--steps N] [--accum N]   (needs torch: build-test/hf-venv)
import argparse
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "engine_ref"))
import hfgen  # noqa: E402
import mixedref  # noqa: E402


def setup(tmp, accum, steps):
    g = torch.Generator().manual_seed(5)
    cfg = hfgen.gpt2_config(n_embd=64, n_layer=4, n_head=4, n_positions=64, vocab_size=211)
    hfgen.write_model(os.path.join(tmp, "model"), cfg, hfgen.gpt2_tensors(cfg, g))
    data = os.path.join(tmp, "train.jsonl")
    hfgen.write_tokens_dataset(data, 2 * accum * steps, cfg["vocab_size"], 32, g)
    return hfgen.job_spec(os.path.join(tmp, "model"), data, steps, 2, 32, grad_accum=accum, lr=3e-3)


def run(spec, prec, grad16):
    load = mixedref.torchref.load_model

    def load_hooked(*a, **k):
        cfg, master = load(*a, **k)
        def to_bf16(p):  # the buffer is bf16: each accumulation rounds
            p.grad.copy_(p.grad.to(torch.bfloat16).float())

        for t in master.values():
            t.register_post_accumulate_grad_hook(to_bf16)
        return cfg, master

    mixedref.torchref.load_model = load_hooked if grad16 else load
    mixedref.DTYPES.setdefault("fp32", torch.float32)  # the same loop, no rounding
    try:
        return mixedref.train(dict(spec, precision=prec))[0]
    finally:
        mixedref.torchref.load_model = load


def first_grad_error(spec, accum):
    """Relative L2 error of a bf16 gradient buffer after k micro-batches
    (k = 1..accum) against fp32 accumulation of the same micro-batch
    gradients of the bf16 model."""
    import torchref
    cfg, master = torchref.load_model(spec["model"]["path"], torch.float32)
    dt = torch.bfloat16
    examples = torchref.load_examples(spec["dataset"]["train"], 32)
    R = lambda x: mixedref.Round.apply(x, dt)  # noqa: E731
    acc32 = {n: torch.zeros_like(t) for n, t in master.items()}
    acc16 = {n: torch.zeros_like(t) for n, t in master.items()}
    out = []
    for k in range(accum):
        rows = examples[2 * k:2 * k + 2]
        ids, tg = torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])
        for t in master.values():
            t.grad = None
        p = {n: mixedref.RoundW.apply(t, dt) for n, t in master.items()}
        logits = mixedref.gpt2_forward(cfg, p, ids, R)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tg.reshape(-1),
                                                 ignore_index=mixedref.IGNORE, reduction="sum")
        (loss / (64 * accum)).backward()
        num = den = 0.0
        for n, t in master.items():
            acc32[n] += t.grad
            acc16[n] = (acc16[n] + t.grad).to(dt).float()
            num += float(((acc16[n] - acc32[n]).double() ** 2).sum())
            den += float((acc32[n].double() ** 2).sum())
        out.append((num / den) ** 0.5)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--accum", type=int, default=8)
    a = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="grad16_") as tmp:
        spec = setup(tmp, a.accum, a.steps)
        errs = first_grad_error(spec, a.accum)
        print("bf16 gradient buffer vs fp32 accumulation, step 1 (relative L2):")
        print("  " + "  ".join(f"k={k + 1}: {e:.2e}" for k, e in enumerate(errs)))
        runs = {"fp32": run(spec, "fp32", False), "bf16, fp32 grads": run(spec, "bf16", False),
                "bf16, bf16 grads": run(spec, "bf16", True)}
    base = [r["loss"] for r in runs["fp32"]]
    print(f"GPT-2 4x64, batch 2 x 32 tokens, grad_accum {a.accum}, {a.steps} steps, lr 3e-3:")
    print(f"{'run':<18} {'loss 1':>9} {'loss last':>10} {'max |rel| vs fp32':>18} {'mean |rel|':>11}")
    for name, r in runs.items():
        ls = [x["loss"] for x in r]
        rel = [abs(x - y) / y for x, y in zip(ls, base)]
        print(f"{name:<18} {ls[0]:>9.5f} {ls[-1]:>10.5f} {max(rel):>18.2e} {sum(rel) / len(rel):>11.2e}")


if __name__ == "__main__":
    main()
