"""bench/qlora/peer.py — the reference side: transformers + PEFT + bitsandbytes QLoRA.

What a user fine-tuning with QLoRA on this machine would run: the model
loaded with BitsAndBytesConfig(load_in_4bit, nf4, double quantisation,
bf16 compute dtype) on the CPU (bitsandbytes' CPU backend), LoRA r on all
seven block linears by PEFT, torch.optim.AdamW on the adapters, gradient
checkpointing when the engine's side uses recompute "all". The rest of the
model stays bf16 (no prepare_model_for_kbit_training: its fp32 upcast of
embeddings, norms and lm_head would cost the peer memory the engine does
not spend). One process per run; it prints one JSON line: the process's
peak RSS (getrusage, as the engine's mem_bytes), the mean tokens/s after
the first step, and the losses.
Usage: peer.py MODEL_DIR DATA.jsonl --batch B --seq T --steps S --r R
               --threads N [--gc]
"""
import argparse
import json
import resource
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("data")
ap.add_argument("--batch", type=int, required=True)
ap.add_argument("--seq", type=int, required=True)
ap.add_argument("--steps", type=int, required=True)
ap.add_argument("--r", type=int, default=16)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--gc", action="store_true", help="gradient checkpointing")
a = ap.parse_args()
torch.set_num_threads(a.threads)

import peft  # noqa: E402
import transformers  # noqa: E402

t0 = time.time()
bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.bfloat16)
model = transformers.AutoModelForCausalLM.from_pretrained(a.model, quantization_config=bnb, dtype=torch.bfloat16,
                                                          device_map="cpu", attn_implementation="sdpa")
n4 = sum(1 for m in model.modules() if type(m).__name__ == "Linear4bit")
if a.gc:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
model.config.use_cache = False
cfg = peft.LoraConfig(r=a.r, lora_alpha=2 * a.r, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
model = peft.get_peft_model(model, cfg)
model.train()
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
load_s = time.time() - t0

rows = []
with open(a.data) as f:
    for line in f:
        rows.append(json.loads(line)["input_ids"][: a.seq])
losses, times = [], []
for s in range(a.steps):
    x = torch.tensor([rows[(s * a.batch + i) % len(rows)] for i in range(a.batch)])
    t = time.time()
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.time() - t)
    losses.append(loss.item())
tps = [a.batch * a.seq / t for t in times[1:]] or [a.batch * a.seq / times[0]]
print(json.dumps({"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "tokens_per_s": sum(tps) / len(tps), "losses": losses, "load_s": load_s,
                  "linear4bit": n4, "trainable": sum(p.numel() for p in params),
                  "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                               "peft": peft.__version__,
                               "bitsandbytes": __import__("bitsandbytes").__version__}}))
