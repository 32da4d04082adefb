"""bench/qlora/make_model.py — a random Llama in bf16 safetensors, for both sides.

The engine and the peer (peer.py) load the same directory, so they
quantise the same weights. transformers' own initialisation (normal,
std 0.02) draws them; the values do not matter to memory or speed.
Usage: make_model.py OUT --hidden C --ffn F --layers L --heads H --kv-heads K --vocab V [--max-pos P]
"""
import argparse

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("out")
for k in ("hidden", "ffn", "layers", "heads", "kv-heads", "vocab"):
    ap.add_argument("--" + k, type=int, required=True)
ap.add_argument("--max-pos", type=int, default=8192)
a = ap.parse_args()
torch.manual_seed(1)
cfg = transformers.LlamaConfig(hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
                               num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                               max_position_embeddings=a.max_pos, tie_word_embeddings=False, rope_theta=500000.0,
                               rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
with torch.device("cpu"):
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
model.save_pretrained(a.out)
