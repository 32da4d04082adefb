#!/usr/bin/env python3
"""bench/qlora — QLoRA against LoRA and full fine-tuning, and against bitsandbytes + PEFT.

1. CPU, one run each on the same Llama shape (the same bf16 safetensors,
   GQA, the same data): the engine's full, lora and qlora, and the peer a
   user would run for QLoRA — transformers + PEFT + bitsandbytes (peer.py:
   nf4, double quantisation, bf16 compute, r 16 on all seven linears) —
   each in its own process: peak RSS (getrusage, the engine's mem_bytes),
   mean tokens/s after the first step, the engine's started.memory (bytes
   by kind); the ratios QLoRA / LoRA, QLoRA / full and engine / peer.
2. The Llama-3-8B shape (hidden 4096, F 14336, 32/8 heads, vocab 128256,
   r 16, batch 1, recompute "all" / gradient checkpointing) on the CPU with
   1 and 2 layers at a short sequence, both sides: measured peak RSS and
   tokens/s; the per-layer increment (2 layers - 1 layer) extrapolates each
   to 32 layers.
3. The computed device footprint of that shape at seq 2048 (the engine's
   allocations by kind from its layout rules, docs/engine.md "QLoRA"),
   checked first against the engine's started.memory for the CPU shape of
   part 1 and against the extrapolation of part 2 at its sequence.
   Compared with the published transformers + bitsandbytes + PEFT figure
   (Unsloth's benchmark page, docs/benchmarks.md), interpolated to seq 2048.
With --ab ENGINE_A, only part 1's qlora run, ENGINE_A and ENGINE
alternated round by round (--rounds; A, B, A, B so that drifting load hits
both), each run's first step skipped: the median step's tokens/s of each
and B's over A's — a change to the engine against the build before it.
Usage: bench.py ENGINE HF_PYTHON [--threads N] [--steps S] [--seq8b T] [--no-8b] [--no-small]
                [--ab ENGINE_A [--rounds R]]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
A64 = lambda x: (x + 63) // 64 * 64  # noqa: E731
F16 = lambda x: (x + 15) // 16 * 16  # noqa: E731 (the table's 16-float alignment)


def nf4_bytes(n):
    nb = (n + 63) // 64
    return A64((n + 1) // 2) + A64(nb) + A64((nb + 255) // 256 * 4)


def linears(c):
    C, F, H, KV = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"]
    D = C // H
    return [(H * D, C), (KV * D, C), (KV * D, C), (C, H * D), (F, C), (F, C), (C, F)]  # [out, in]


def predicted(c, r):
    """Bytes the engine allocates for the weights, NF4 weights and adapters
    of a bf16 QLoRA run with adapters on every block linear."""
    L, C, V = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
    q = L * sum(nf4_bytes(o * i) for o, i in linears(c))
    rest = F16(V * C) * (1 if c.get("tie_word_embeddings") else 2) + L * 2 * F16(C) + F16(C)
    ad = L * sum(F16(r * i) + F16(o * r) for o, i in linears(c)) * 4
    return {"quantized_weights": q, "weights16": rest * 2, "adapters": ad, "optimizer": 2 * ad}


def run(engine, spec, threads):
    with tempfile.TemporaryDirectory() as d:
        sp = os.path.join(d, "spec.json")
        json.dump(spec, open(sp, "w"))
        cmd = ["/bin/bash", "-c", 'exec "$0" "$@" 3>&1 1>/dev/null 2>/dev/null', engine, "--spec", sp,
               "--workdir", os.path.join(d, "w"), "--threads", str(threads)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    ev = [json.loads(l) for l in out.splitlines() if l.strip()]
    met = [e for e in ev if e["ev"] == "metric"]
    return next(e for e in ev if e["ev"] == "started"), met


def tps_of(met):
    return sum(m["tokens_per_s"] for m in met[1:]) / max(1, len(met) - 1)


def peer(py, model, data, B, T, steps, threads, gc):
    """peer.py in its own process: {peak_rss, tokens_per_s, losses, ...}."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TORCHDYNAMO_DISABLE="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error", TQDM_DISABLE="1")
    cmd = [py, os.path.join(HERE, "peer.py"), model, data, "--batch", str(B), "--seq", str(T), "--steps",
           str(steps), "--threads", str(threads)] + (["--gc"] if gc else [])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit(f"peer.py failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def make_model(py, out, c, max_pos):
    if os.path.exists(os.path.join(out, "model.safetensors")):
        return  # --models: made by an earlier run (same seed, same weights)
    subprocess.run([py, os.path.join(HERE, "make_model.py"), out, "--hidden", str(c["hidden_size"]),
                    "--ffn", str(c["intermediate_size"]), "--layers", str(c["num_hidden_layers"]),
                    "--heads", str(c["num_attention_heads"]), "--kv-heads", str(c["num_key_value_heads"]),
                    "--vocab", str(c["vocab_size"]), "--max-pos", str(max_pos)],
                   check=True, capture_output=True, env=dict(os.environ, TQDM_DISABLE="1"))


def write_data(path, vocab, T, n, seed):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"input_ids": [rng.randrange(vocab) for _ in range(T)]}) + "\n")


def spec_for(model_dir, data, method, B, T, steps, recompute="none", r=16):
    spec = {"name": "bench", "model": {"path": model_dir}, "dataset": {"train": data, "format": "tokens"},
            "method": method, "precision": "bf16", "resources": {"backend": "cpu"},
            "hyperparameters": {"max_steps": steps, "batch_size": B, "seq_len": T, "lr": 1e-4,
                                "log_every_steps": 1, "seed": 1, "recompute": recompute},
            "checkpoint": {"every_steps": 0}}
    if method != "full":
        spec["lora"] = {"r": r, "alpha": 2 * r, "targets": TARGETS}
    return spec


TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MiB, G = 2 ** 20, 2 ** 30


def logit_bytes(V, T, card):
    """The loss head's 16-bit logit chunk (kn_logit_rows, kn_logit_ld): on
    the CPU (card None) 32 MiB worth of rows, at least 128; on a GPU of
    `card` bytes rows V rounded up to 128 apart, all T of them when they
    fit min(1 GiB, card / 64), else whole 128-row tiles of that."""
    if card is None:
        return min(T, max(128, (32 << 20) // (V * 2))) * V * 2
    ld, budget = (V + 127) // 128 * 128, min(G, card // 64)
    rows = T if T * ld * 2 <= budget else max(128, budget // (ld * 2) // 128 * 128)
    return min(T, rows) * ld * 2


def activations(c, T, L, card=None):
    """Activation bytes of a bf16 QLoRA run with recompute all: each layer
    keeps its output (T x C, 16-bit); one layer's fp32 working set is
    rebuilt in the backward (norm outputs, q/k/v/attention output,
    residual, gate/up/act and their gradients: about 8 C + 5 F floats per
    position); the logits and their gradient share one 16-bit buffer, a
    chunk of rows (logit_bytes; the loss head goes over chunks of rows);
    each adapter keeps A x [T, r] in fp32."""
    C, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    return L * T * C * 2 + (8 * C + 5 * F) * T * 4 + logit_bytes(V, T, card) + L * 7 * T * 16 * 4


def computed(c, T, card=None):
    p = predicted(c, 16)
    C, F = c["hidden_size"], c["intermediate_size"]
    acts = activations(c, T, c["num_hidden_layers"], card)
    scratch = F * C * 2  # the largest linear dequantised in bf16 (the 16-bit base path, both backends)
    parts = [("NF4 weights (double quant)", p["quantized_weights"]),
             ("embeddings + lm_head + norms, bf16", p["weights16"]),
             ("adapters + their gradients, fp32", 2 * p["adapters"]), ("AdamW m + v", p["optimizer"]),
             ("activations (recompute all)", acts), ("dequantisation scratch, bf16", scratch)]
    return parts, sum(v for _, v in parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("hf_python", help="the python of a venv with tests/hf/requirements.txt")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq8b", type=int, default=128)
    ap.add_argument("--steps8b", type=int, default=3)
    ap.add_argument("--no-8b", action="store_true")
    ap.add_argument("--no-small", action="store_true", help="skip part 1 (the 4x512 Llama)")
    ap.add_argument("--models", help="keep the generated models here and reuse them (2.5 + 2.9 GB)")
    ap.add_argument("--ab", metavar="ENGINE_A", help="part 1's qlora run only, ENGINE_A against ENGINE")
    ap.add_argument("--rounds", type=int, default=5, help="--ab: runs of each engine")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-qlora-")
    models = a.models or tmp
    cfg = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8192, "tie_word_embeddings": False}
    B, T, R = 2, 256, 16
    mdir, data = os.path.join(models, "small"), os.path.join(tmp, "train.jsonl")
    if a.ab:
        ab(a, cfg, B, T, mdir, data)
    else:
        if not a.no_small:
            part1(a, models, tmp, cfg, B, T, R, mdir, data)
        part23(a, models, tmp)
    subprocess.run(["rm", "-rf", tmp])


def part1(a, models, tmp, cfg, B, T, R, mdir, data):
    make_model(a.hf_python, mdir, cfg, 512)
    write_data(data, cfg["vocab_size"], T, 64, 5)
    print(f"1. CPU, Llama {cfg['num_hidden_layers']}x{cfg['hidden_size']} (F {cfg['intermediate_size']}, GQA 8/4, "
          f"vocab {cfg['vocab_size']}), batch {B} x seq {T}, bf16, {a.steps} steps, {a.threads} threads, "
          f"r {R} on all seven linears")
    res = {}
    for method in ("full", "lora", "qlora"):
        started, met = run(a.engine, spec_for(mdir, data, method, B, T, a.steps), a.threads)
        res[method] = (met[-1]["mem_bytes"], tps_of(met), started.get("memory", {}))
        m = started.get("memory", {})
        print(f"  engine {method:6s} peak RSS {met[-1]['mem_bytes'] / MiB:8.1f} MiB  {res[method][1]:8.1f} tokens/s  "
              f"allocated {m.get('total', 0) / MiB:7.1f} MiB (weights {m.get('weights', 0) / MiB:.1f}, "
              f"NF4 {m.get('quantized_weights', 0) / MiB:.1f}, adapters {m.get('adapters', 0) / MiB:.1f}, "
              f"optimizer {m.get('optimizer', 0) / MiB:.1f}, activations {m.get('activations', 0) / MiB:.1f})  "
              f"first loss {met[0]['loss']:.4f}")
    pr = peer(a.hf_python, mdir, data, B, T, a.steps, a.threads, False)
    print(f"  peer   qlora  peak RSS {pr['peak_rss'] / MiB:8.1f} MiB  {pr['tokens_per_s']:8.1f} tokens/s  "
          f"({pr['linear4bit']} Linear4bit, {pr['trainable']} trainable; first loss {pr['losses'][0]:.4f}; "
          f"{' '.join(k + ' ' + v for k, v in pr['versions'].items())})")
    for other in ("lora", "full"):
        print(f"  qlora / {other}: peak RSS {res['qlora'][0] / res[other][0]:.2f}x, "
              f"allocated {res['qlora'][2]['total'] / res[other][2]['total']:.2f}x, "
              f"tokens/s {res['qlora'][1] / res[other][1]:.2f}x")
    print(f"  engine qlora / peer qlora: peak RSS {res['qlora'][0] / pr['peak_rss']:.2f}x, "
          f"tokens/s {res['qlora'][1] / pr['tokens_per_s']:.2f}x")
    p, got = predicted(cfg, R), res["qlora"][2]
    for k in ("quantized_weights", "adapters", "optimizer"):
        print(f"  check {k}: computed {p[k]} engine {got[k]} -> {'same' if p[k] == got[k] else 'DIFFERENT'}")


def ab(a, cfg, B, T, mdir, data):
    make_model(a.hf_python, mdir, cfg, 512)
    write_data(data, cfg["vocab_size"], T, 64, 5)
    print(f"A/B: engine qlora, Llama {cfg['num_hidden_layers']}x{cfg['hidden_size']}, batch {B} x seq {T}, "
          f"bf16, r 16 on all seven linears, {a.rounds} rounds of {a.steps} steps, {a.threads} threads")
    sides, steps = {"A": a.ab, "B": a.engine}, {"A": [], "B": []}
    for _ in range(a.rounds):
        for k, engine in sides.items():
            _, met = run(engine, spec_for(mdir, data, "qlora", B, T, a.steps), a.threads)
            steps[k] += [m["tokens_per_s"] for m in met[1:]]
    med = {k: statistics.median(v) for k, v in steps.items()}
    for k, engine in sides.items():
        v = sorted(steps[k])
        print(f"  {k} {engine}: median step {med[k]:.1f} tokens/s (p10 {v[len(v) // 10]:.1f}, "
              f"p90 {v[len(v) * 9 // 10]:.1f}, {len(v)} steps)")
    print(f"  B / A: {med['B'] / med['A']:.2f}x tokens/s")


def part23(a, models, tmp):
    c8 = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
          "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False}
    if not a.no_8b:
        T8 = a.seq8b
        print(f"2. Llama-3-8B shape on the CPU, 1 and 2 layers measured, batch 1 x seq {T8}, r 16 on all seven "
              f"linears, recompute all / gradient checkpointing, bf16, {a.steps8b} steps, {a.threads} threads:")
        data8 = os.path.join(tmp, "train8b.jsonl")
        write_data(data8, c8["vocab_size"], T8, 8, 6)
        m8 = {}
        for L in (1, 2):
            d = os.path.join(models, f"l8b-{L}")
            make_model(a.hf_python, d, dict(c8, num_hidden_layers=L), 8192)
            started, met = run(a.engine, spec_for(d, data8, "qlora", 1, T8, a.steps8b, "all"), a.threads)
            pr = peer(a.hf_python, d, data8, 1, T8, a.steps8b, a.threads, True)
            m8[L] = (met[-1]["mem_bytes"], tps_of(met), started["memory"]["total"], pr["peak_rss"],
                     pr["tokens_per_s"])
            print(f"  {L} layer{'s' if L > 1 else ' '}: engine peak RSS {m8[L][0] / G:6.3f} GiB "
                  f"(allocated {m8[L][2] / G:6.3f}) {m8[L][1]:7.2f} tokens/s | peer peak RSS "
                  f"{m8[L][3] / G:6.3f} GiB {m8[L][4]:7.2f} tokens/s | engine/peer RSS "
                  f"{m8[L][0] / m8[L][3]:.2f}x tokens/s {m8[L][1] / m8[L][4]:.2f}x")
            if not a.models:
                subprocess.run(["rm", "-rf", d])
        ext = {k: m8[1][i] + 31 * (m8[2][i] - m8[1][i]) for k, i in (("engine", 0), ("alloc", 2), ("peer", 3))}
        print(f"  per layer: engine {(m8[2][0] - m8[1][0]) / MiB:.1f} MiB RSS ({(m8[2][2] - m8[1][2]) / MiB:.1f} "
              f"allocated), peer {(m8[2][3] - m8[1][3]) / MiB:.1f} MiB RSS")
        parts, tot = computed(c8, T8)
        print(f"  extrapolated to 32 layers (1 layer + 31 x the increment): engine {ext['engine'] / G:.2f} GiB "
              f"peak RSS ({ext['alloc'] / G:.2f} allocated; computed for seq {T8}: {tot / G:.2f}), "
              f"peer {ext['peer'] / G:.2f} GiB; engine / peer {ext['engine'] / ext['peer']:.2f}x")

    T2 = 2048
    parts, total = computed(c8, T2, 12 * G)  # the goal's 12 GiB card sets the logit chunk
    print(f"3. Llama-3-8B shape QLoRA (r 16, all 7 linears, seq {T2}, batch 1, recompute all, bf16, "
          f"on a 12 GiB GPU), computed:")
    for k, v in parts:
        print(f"  {k:38s} {v / G:6.2f} GiB")
    print(f"  {'total':38s} {total / G:6.2f} GiB  (goal: 12 GiB -> {'fits' if total < 12 * G else 'does NOT fit'})")
    # The published figure (docs/benchmarks.md cites it): Unsloth's benchmark
    # page measured transformers + bitsandbytes + PEFT with FlashAttention 2
    # ("Hugging Face + FA2") on Llama 3.1 8B Instruct, 4-bit QLoRA r 32 on
    # all seven linears, batch 1: the longest sequence that fit was 932
    # tokens in 12 GB and 2,551 in 16 GB. Seq 2048 lies between: linearly,
    # the GB the peer needs there.
    lo, hi = (932, 12), (2551, 16)
    pub = lo[1] + (hi[1] - lo[1]) * (T2 - lo[0]) / (hi[0] - lo[0])
    print(f"  published (docs.unsloth.ai/basics/unsloth-benchmarks, HF + FA2, r 32): {lo[0]} tokens in "
          f"{lo[1]} GB, {hi[0]} in {hi[1]} GB -> about {pub:.1f} GB at seq {T2} (interpolated); "
          f"computed / published {total / (pub * 1e9):.2f}x (GB = 1e9 bytes assumed)")


main()
