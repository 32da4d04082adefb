"""make_text_model.py DIR — a tiny random GPT-2 made by transformers with a
byte-level BPE tokenizer.json trained by the `tokenizers` library
(hfcommon.make_text_model), for the tests that need a text prompt
(hf.web_try)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hfcommon import make_text_model  # noqa: E402

make_text_model(sys.argv[1], seed=21)
