"""make_ref.py — the PyTorch side of the GPU model check, computed HERE
(tests/gpu/run.sh build), because the GPU machine has no PyTorch.

For GPT-2 and Llama: transformers' own small random model (tests/hf's
make_model: the same configs as hf.ref.*), a fixed batch of token rows, and
the losses of STEPS AdamW steps of transformers' model in PyTorch fp32 with
the engine's step (tests/hf/ref_check.py's torch_train: every step sees the
rows, mean token loss, clipping, AdamW with decay on >= 2-D tensors). The
job's hyperparameters are the ones tests/hf's job_spec gives the engine.
Writes OUT/<arch>/{model/, train.jsonl, ref.json}; model_check.py (standard
library only) runs the engine on the GPU against ref.json.

Usage: make_ref.py OUT [STEPS [BATCH SEQ]]   (in the tests/hf venv: hfpy.sh)
  (run.sh dry: 2 steps of 1 x 8 tokens, for the emulated engine's speed)"""
import json
import os
import shutil
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "hf"))
from hfcommon import job_spec, load_model, make_model  # noqa: E402
from ref_check import torch_train, write_rows  # noqa: E402



def main():
    out = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    batch, seq = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (2, 16)
    for arch in ("gpt2", "llama"):
        d = os.path.join(out, arch)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        make_model(arch, os.path.join(d, "model"))
        g = torch.Generator().manual_seed(3)
        model = load_model(os.path.join(d, "model"))
        rows = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g).tolist()
        write_rows(os.path.join(d, "train.jsonl"), rows)
        hp = job_spec("model", "train.jsonl", steps, batch, seq)["hyperparameters"]
        losses = torch_train(model, list(model.parameters()), rows, hp)
        with open(os.path.join(d, "ref.json"), "w") as f:
            json.dump({"arch": arch, "hyperparameters": hp, "losses": losses,
                       "torch": torch.__version__}, f, indent=1)
        print(f"{arch}: {steps} steps in PyTorch fp32: losses {['%.6f' % l for l in losses]}")


if __name__ == "__main__":
    main()
