"""make_text_model.py DIR — a tiny random GPT-2 made by transformers with a
byte-level BPE tokenizer.json trained by the `tokenizers` library, for the
tests that need a text prompt (hf.web_try)."""
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
from hfcommon import make_model  # noqa: E402

d = sys.argv[1]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(corpus.corpus(seed=4, n_random=100, n_sentences=400),
                        trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
make_model("gpt2", d, seed=21, vocab=tok.get_vocab_size())
tok.save(os.path.join(d, "tokenizer.json"))
with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}, f)
