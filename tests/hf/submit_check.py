"""submit_check.py — ctest hf.submit_refusal: a model directory whose
config.json (written by transformers' own config classes) names a family or
a setting the engine does not support is refused at POST /jobs with 400,
the field (model.path:config.json.<field>) and the reason, before any
engine runs; a supported one is accepted.

Usage: submit_check.py TRAINYARD ENGINE WORKDIR"""
import os
import shutil
import sys

import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "server"))
trainyard, engine, work = sys.argv[1:4]
os.environ["TY_BIN"], os.environ["TY_FAKE_ENGINE"] = trainyard, engine
import tyharness  # noqa: E402
from hfcommon import fail  # noqa: E402

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=97)
CASES = [
    # (name, config, wanted field, words the message must hold)
    # Gemma 3's multimodal checkpoint (vision tower + language model) is
    # refused, pointing at the text-only model_type; Gemma with another
    # MLP activation is refused by name.
    ("gemma3-multimodal", transformers.Gemma3Config(text_config=dict(head_dim=8, **SMALL)),
     "model.path:config.json.model_type", "gemma3_text"),
    ("gemma2-silu", transformers.Gemma2Config(head_dim=8, hidden_activation="silu", **SMALL),
     "model.path:config.json.hidden_activation", "gelu_pytorch_tanh"),
    ("phi3-partial", transformers.Phi3Config(partial_rotary_factor=0.5, **SMALL),
     "model.path:config.json.partial_rotary_factor", "part of each head"),
    ("llama-linear", transformers.LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0}, **SMALL),
     "model.path:config.json.rope_parameters.rope_type", "linear"),
    ("llama31-nofactor", transformers.LlamaConfig(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                                "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                                                                "original_max_position_embeddings": 8192}, **SMALL),
     "model.path:config.json.rope_parameters.high_freq_factor", "greater than low_freq_factor"),
]

# Configs of the supported families, accepted.
ACCEPTED = [
    ("llama", transformers.LlamaConfig(**SMALL)),
    ("qwen3", transformers.Qwen3Config(head_dim=8, **SMALL)),
    ("phi3", transformers.Phi3Config(pad_token_id=None, **SMALL)),
    ("gemma2", transformers.Gemma2Config(head_dim=8, **SMALL)),
    ("gemma3_text", transformers.Gemma3TextConfig(head_dim=8, **SMALL)),
    ("llama31", transformers.LlamaConfig(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0,
                                                       "original_max_position_embeddings": 8192}, **SMALL)),
]


def main():
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "train.jsonl")
    with open(data, "w") as f:
        f.write('{"input_ids": [1, 2, 3, 4]}\n')

    def spec(d):
        return {"name": "x", "model": {"path": d}, "dataset": {"train": data}, "method": "full",
                "hyperparameters": {"max_steps": 1, "seq_len": 4}, "resources": {"backend": "cpu"}}

    srv = tyharness.Server("--cpu-slots", "1", roots=work)
    try:
        for name, cfg, field, word in CASES:
            d = os.path.join(work, name)
            cfg.save_pretrained(d)
            r = srv.post("/jobs", spec(d))
            err = r.json.get("error", {}) if isinstance(r.json, dict) else {}
            if r.status != 400 or err.get("field") != field or word not in err.get("message", ""):
                fail(f"{name}: {r.status} {r.body[:300]!r}; wanted 400 naming {field} and {word!r}")
            print(f"  {name}: 400 {field}: {err['message']}")
        for name, cfg in ACCEPTED:
            d = os.path.join(work, name)
            cfg.save_pretrained(d)
            r = srv.post("/jobs", spec(d))
            if r.status != 201:
                fail(f"a supported {name} config: {r.status} {r.body[:300]!r}")
            print(f"  {name}: 201")
    finally:
        srv.stop()
    print("unsupported families are refused at submit")


if __name__ == "__main__":
    main()
