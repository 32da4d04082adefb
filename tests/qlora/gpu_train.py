#!/usr/bin/env python3
"""gpu_train.py — a short QLoRA training on the device backend against the CPU's.

tests/gpu/run.sh carries it to a GPU machine and runs it after the kernel
table: a Llama (model.init, GQA, 2 layers) trained with method qlora (NF4
double-quantised base, r 8 on all seven linears, recompute "all") for a few
steps on `cuda` and on `cpu`, from the same seed and data. The per-step
losses must agree within 1e-4 relative in fp32 and 2e-2 in bf16 (the NF4
dequantisation is bit-identical on both backends, kernels.cuda_emu.nf4;
only the GEMMs' summation order differs), and it prints each backend's
losses, tokens/s, mem_bytes and started.memory. Stdlib only (the GPU
machine has python3 but not the hf venv). ctest gpu.run_dry runs it on
the emulated backend (--dry: trainyard-engine-emu, TY_KERNELS=cuda-emu,
smaller shape): it proves the script, it measures nothing.
Usage: gpu_train.py ENGINE [--dry]
"""
import json
import os
import random
import subprocess
import sys
import tempfile


def run(engine, spec, d, env):
    sp = os.path.join(d, "spec.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    r = subprocess.run(["/bin/bash", "-c", 'exec "$0" "$@" 3>&1 1>&2', engine, "--spec", sp, "--workdir",
                        os.path.join(d, "w")], capture_output=True, text=True, timeout=600, env=env)
    ev = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    if r.returncode:
        errs = [e.get("message") for e in ev if e.get("ev") == "error"]
        sys.exit(f"FAIL: engine exit {r.returncode}: {errs} {r.stderr[-800:]}")
    return next(e for e in ev if e["ev"] == "started"), [e for e in ev if e["ev"] == "metric"]


def main():
    engine = sys.argv[1]
    dry = "--dry" in sys.argv
    C, F, L, V, B, T, steps = (64, 128, 1, 211, 2, 16, 2) if dry else (512, 1408, 2, 8192, 2, 256, 4)
    cfg = {"model_type": "llama", "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
           "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": V, "max_position_embeddings": T,
           "tie_word_embeddings": False}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "train.jsonl")
        rng = random.Random(3)
        with open(data, "w") as f:
            for _ in range(8):
                f.write(json.dumps({"input_ids": [rng.randrange(V) for _ in range(T)]}) + "\n")
        for prec, tol in (("fp32", 1e-4), ("bf16", 2e-2)):
            losses = {}
            for be in ("cuda", "cpu"):
                spec = {"name": "gpu-qlora", "model": {"init": cfg}, "dataset": {"train": data, "format": "tokens"},
                        "method": "qlora", "precision": prec, "qlora": {"double_quant": True},
                        "lora": {"r": 8, "alpha": 16, "targets": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                                  "gate_proj", "up_proj", "down_proj"]},
                        "resources": {"backend": be, **({"gpus": 1} if be == "cuda" else {})},
                        "hyperparameters": {"max_steps": steps, "batch_size": B, "seq_len": T, "lr": 1e-3,
                                            "log_every_steps": 1, "seed": 1, "recompute": "all"},
                        "checkpoint": {"every_steps": 0}}
                env = dict(os.environ)
                if dry and be == "cuda":
                    env.update(TY_KERNELS="cuda-emu", TY_EMU_GUARD="1")
                d = os.path.join(tmp, f"{prec}-{be}")
                os.makedirs(d)
                st, met = run(engine, spec, d, env)
                losses[be] = [m["loss"] for m in met]
                tps = sum(m["tokens_per_s"] for m in met[1:]) / max(1, len(met) - 1)
                print(f"qlora {prec} {be:4s} (backend {st.get('backend')}): losses "
                      f"{' '.join('%.6f' % x for x in losses[be])}  {tps:.1f} tokens/s  mem_bytes "
                      f"{met[-1]['mem_bytes']}  started.memory {json.dumps(st.get('memory', {}))}")
                if be == "cuda" and st.get("backend") not in ("cuda", "cuda-emu"):
                    print(f"FAIL: asked for cuda, ran on {st.get('backend')}")
                    ok = False
            a, b = losses["cuda"], losses["cpu"]
            worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
            good = len(a) == len(b) == steps and worst <= tol
            print(f"{'PASS' if good else 'FAIL'} qlora train {prec}: cuda vs cpu losses within {worst:.1e} "
                  f"(tolerance {tol})")
            ok = ok and good
    sys.exit(0 if ok else 1)


main()
