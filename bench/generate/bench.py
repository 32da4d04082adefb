"""bench.py — generation tokens/s: trainyard-engine generate vs transformers'
generate, greedy, same model files, same prompt, same thread count, each in
its own process, one after the other. The model is random, made by
transformers (AutoModelForCausalLM.from_config) and saved once, in fp32 or
(the -bf16 shapes) converted to bf16 and saved so (config.json dtype
bfloat16): both sides then load it as they load any checkpoint, the engine
with --dtype auto (bf16 weights, fp32 accumulation) and transformers with
dtype="auto" (bf16 end to end). Both decode the same number of tokens
(--ignore-eos / min_new_tokens); in fp32 they must produce the same tokens
(a difference is a warning), in bf16 their rounding differs (transformers
rounds every activation) and where the tokens part is printed. Reported:
end-to-end seconds for prompt + N new tokens (model loading excluded) and
new tokens per second over that time, the median of --repeat runs; and,
with --membw, the machine's read bandwidth (membw.c, same threads) and each
side's weight bytes per second — weight bytes per decoded token (every
linear weight and the lm_head, once) times its tokens/s — as a fraction of
it: near 1 a side is bound by memory bandwidth."""
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
for _k in list(SHAPES):  # the same models saved in bf16
    SHAPES[_k + "-bf16"] = SHAPES[_k]

HF_CHILD = r"""
import json, sys, time, torch, transformers
path, threads, ids, new, repeat = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype="auto").eval()
x = torch.tensor([ids])
times = []
with torch.inference_mode():
    m.generate(x, do_sample=False, max_new_tokens=4, min_new_tokens=4, pad_token_id=0)  # warm-up
    for _ in range(repeat):
        t = time.perf_counter()
        out = m.generate(x, do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
        times.append(time.perf_counter() - t)
print(json.dumps({"times": times, "ids": out[0, len(ids):].tolist(), "dtype": str(next(m.parameters()).dtype)}))
"""


def make(shape, path):
    """Saves the shape's random model; returns its weight bytes per decoded
    token: every linear layer's weight (the lm_head included, tied or not)
    read once, in the saved dtype."""
    import torch
    import transformers
    from transformers.pytorch_utils import Conv1D
    fam, kw = SHAPES[shape]
    torch.manual_seed(0)
    cfg = (transformers.GPT2Config if fam == "gpt2" else transformers.LlamaConfig)(**kw)
    m = transformers.AutoModelForCausalLM.from_config(cfg)
    if shape.endswith("-bf16"):
        m = m.to(torch.bfloat16)
    m.save_pretrained(path)
    return sum(mod.weight.numel() * mod.weight.element_size() for mod in m.modules()
               if isinstance(mod, (torch.nn.Linear, Conv1D)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--shape", action="append")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--membw", help="the membw program (bench/generate/membw.c)")
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), TRANSFORMERS_VERBOSITY="error")
    bw = None
    if a.membw:
        r = subprocess.run([a.membw, str(a.threads)], capture_output=True, text=True, env=env, check=True)
        print(r.stdout.rsplit("\n{", 1)[0].strip() + "\n")  # the one-row product table
        bw = json.loads(r.stdout.splitlines()[-1])["read_gbs"] * 1e9
        print(f"read bandwidth, {a.threads} threads: {bw / 1e9:.1f} GB/s\n")
    print(f"| shape | prompt + new | trainyard s | transformers s | trainyard tok/s | transformers tok/s | ratio "
          f"| weight MB / token | trainyard, of read BW | transformers, of read BW | tokens |")
    print(f"|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in a.shape or list(SHAPES):
        with tempfile.TemporaryDirectory() as tmp:
            wbytes = make(shape, tmp)
            ids = [(i * 7919) % 1000 + 3 for i in range(a.prompt)]
            ours, got = [], None
            for _ in range(a.repeat + 1):
                r = subprocess.run([a.engine, "generate", "--model", tmp, "--prompt-ids", " ".join(map(str, ids)),
                                    "--max-tokens", str(a.new), "--ignore-eos", "--threads", str(a.threads)],
                                   capture_output=True, text=True, env=env, check=True)
                j = json.loads(r.stdout.splitlines()[-1])
                ours.append(j["prefill_s"] + j["decode_s"])
                got = j["ids"]
                want_dt = "bf16" if shape.endswith("-bf16") else "fp32"
                if j["dtype"] != want_dt:
                    sys.exit(f"{shape}: the engine generated in {j['dtype']}, not {want_dt}")
            ours = ours[1:]  # the first run warms the page cache
            r = subprocess.run([sys.executable, "-c", HF_CHILD, tmp, str(a.threads), json.dumps(ids), str(a.new),
                                str(a.repeat)], capture_output=True, text=True, env=env, check=True)
            hf = json.loads(r.stdout.splitlines()[-1])
            if len(hf["ids"]) != len(got):
                sys.exit(f"{shape}: {len(got)} tokens vs transformers' {len(hf['ids'])}: not the same work")
            part = next((i for i, (x, y) in enumerate(zip(hf["ids"], got)) if x != y), None)
            tokens = "identical" if part is None else f"part at {part}"
            if part is not None and not shape.endswith("-bf16"):
                print(f"WARNING {shape}: outputs differ from position {part} (fp32 ties on a random model)",
                      file=sys.stderr)
            t_ours, t_hf = statistics.median(ours), statistics.median(hf["times"])
            frac = (lambda t: f"{wbytes * a.new / t / bw:.2f}") if bw else (lambda t: "-")
            print(f"| {shape} | {a.prompt} + {a.new} | {t_ours:.3f} | {t_hf:.3f} | {a.new / t_ours:.1f} | "
                  f"{a.new / t_hf:.1f} | **{t_hf / t_ours:.2f}×** | {wbytes / 1e6:.1f} | {frac(t_ours)} | "
                  f"{frac(t_hf)} | {tokens} |", flush=True)


if __name__ == "__main__":
    main()
