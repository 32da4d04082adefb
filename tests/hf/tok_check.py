"""tok_check.py — ctest hf.tokenizers: engine/tokenizer against the
`tokenizers` library (Hugging Face's Rust tokenizer) itself.

For each style (GPT-2, Llama 2, Llama 3, Mistral, Qwen2) a small BPE
tokenizer is trained with `tokenizers` on one seeded mixed corpus, with the
normalizer / pre-tokenizer / model options / decoder / post-processor /
special tokens that style's published tokenizer.json uses, and saved with
`Tokenizer.save` — so the file is exactly what the library writes. Then a
second corpus (code, CJK, emoji, accents, whitespace runs, special tokens
glued to text, random strings) is encoded by the library, with and without
special tokens, and decoded by it; tok_agree must produce the same ids and
the same decoded text for every case (and again from four threads). 400
random id sequences per style are decoded too (bytes that are not UTF-8:
the lossy replacement must be the library's).

Usage: tok_check.py TOK_AGREE WORKDIR [--style NAME]"""
import argparse
import json
import os
import random
import subprocess
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

# The split patterns of Llama 3's and Qwen2's tokenizer.json (Qwen2 takes
# digits one at a time).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
VOCAB = 2000


def byte_level(specials, split=None, nfc=False, ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    if split:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    return tok, trainer


def sentencepiece(specials, metaspace):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if metaspace:   # Mistral: Metaspace pre-tokenizer, "▁" prepended to the first word only
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    else:           # Llama 2: Prepend + Replace normalizers, no pre-tokenizer
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    # A small alphabet, so rarer characters go through byte fallback.
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False,
                                  limit_alphabet=120)
    return tok, trainer


def add_byte_tokens(tok):
    """SentencePiece files carry <0x00>..<0xFF> in the vocabulary (byte
    fallback's targets); the trainer does not make them, so they are added
    to the model's vocabulary in the library's own JSON and reloaded."""
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    for b in range(256):
        name = f"<0x{b:02X}>"
        if name not in vocab:
            vocab[name] = max(vocab.values()) + 1
    ids = sorted(set(vocab.values()) | {a["id"] for a in j["added_tokens"]})
    assert ids == list(range(len(ids))), "vocabulary ids are not dense"
    return Tokenizer.from_str(json.dumps(j))


def with_bos_template(tok, bos):
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])


STYLES = {
    # name: (builder, specials, bos, eos, metaspace-decoding quirk)
    "gpt2": ("<|endoftext|>", "<|endoftext|>", ["<|endoftext|>"]),
    "llama2": ("<s>", "</s>", ["<unk>", "<s>", "</s>"]),
    "mistral": ("<s>", "</s>", ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]),
    "llama3": ("<|begin_of_text|>", "<|end_of_text|>",
               ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|eot_id|>"]),
    "qwen2": (None, "<|endoftext|>", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
}


def build(style, train_texts):
    bos, eos, specials = STYLES[style]
    if style == "gpt2":
        tok, trainer = byte_level(specials)
    elif style == "llama3":
        tok, trainer = byte_level(specials, split=LLAMA3_SPLIT, ignore_merges=True)
    elif style == "qwen2":
        tok, trainer = byte_level(specials, split=QWEN2_SPLIT, nfc=True)
    else:
        tok, trainer = sentencepiece(specials, metaspace=(style == "mistral"))
    tok.train_from_iterator(train_texts, trainer)
    if style in ("llama2", "mistral"):
        tok = add_byte_tokens(tok)
    if style == "gpt2" or style == "qwen2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    elif style == "llama3":
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                          special_tokens=[(bos, tok.token_to_id(bos))])])
    else:
        with_bos_template(tok, bos)
    return tok


def write_model(tok, style, d):
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    bos, eos, _ = STYLES[style]
    cfg = {"eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}
    if bos:
        cfg["bos_token"] = bos
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)


def cases_for(tok, style, texts):
    out = []
    for i, t in enumerate(texts):
        for add in ((False, True) if i % 3 == 0 else (False,)):
            ids = tok.encode(t, add_special_tokens=add).ids
            out.append({"text": t, "add_special": add, "ids": ids,
                        "decoded": tok.decode(ids, skip_special_tokens=False)})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tok_agree")
    ap.add_argument("workdir")
    ap.add_argument("--style", action="append")
    a = ap.parse_args()
    train_texts = corpus.corpus(seed=1, n_random=800, n_sentences=1500)
    rng = random.Random(2)
    test_texts = corpus.corpus(seed=2, n_random=1500, n_sentences=800)
    failed = []
    for style in a.style or list(STYLES):
        tok = build(style, train_texts)
        d = os.path.join(a.workdir, style)
        write_model(tok, style, d)
        specials = STYLES[style][2]
        texts = test_texts + corpus.specials_glued(rng, specials, test_texts, 300)
        cases = cases_for(tok, style, texts)
        # Random id sequences: byte pieces that do not form UTF-8, lone
        # continuation bytes, cut characters — the lossy part of decode.
        vs = tok.get_vocab_size()
        for k in range(400):
            ids = [rng.randrange(vs) for _ in range(rng.randint(1, 12))]
            cases.append({"text": "", "decode_only": True, "ids": ids,
                          "decoded": tok.decode(ids, skip_special_tokens=False)})
        # The decode must give the text back wherever the library's does.
        same = sum(c["decoded"] == c["text"] for c in cases)
        cpath = os.path.join(a.workdir, f"{style}.cases.json")
        with open(cpath, "w") as f:
            json.dump({"cases": cases}, f, ensure_ascii=False)
        print(f"{style}: vocab {tok.get_vocab_size()}, {len(cases)} cases "
              f"({same} decode back to their text in the library)", flush=True)
        r = subprocess.run([a.tok_agree, d, cpath], capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        if r.returncode != 0:
            err = r.stderr.splitlines()
            print("\n".join(err[:40]) + (f"\n... {len(err) - 40} more lines" if len(err) > 40 else ""))
            failed.append(style)
    if failed:
        print(f"FAIL: ids or decoded text differ from the tokenizers library for: {', '.join(failed)}")
        sys.exit(1)
    print("all styles agree with the tokenizers library")


if __name__ == "__main__":
    main()
