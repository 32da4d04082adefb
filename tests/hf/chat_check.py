"""chat_check.py — ctest hf.chat_template: a model's own chat_template
(tokenizer_config.json, Jinja) rendered by the engine's renderer
(engine/chattpl.cpp, minja) equals transformers' apply_chat_template.

The templates in chat_templates/ are the families' published ones (Llama 3.1
and 3.2 Instruct, Qwen2.5 and Qwen3, Gemma 2, Phi-3.5 mini, Mistral Nemo),
as llama.cpp keeps them (models/templates). Each is rendered on several
conversations (system or not, one or several turns, unicode and whitespace
in the content), with and without add_generation_prompt; a template that
refuses a conversation (Gemma's "System role not supported", Mistral's
alternation) must be refused by both, the engine naming the template's own
message.

Usage: chat_check.py CHAT_RENDER ENGINE WORKDIR"""
import json
import os
import shutil
import subprocess
import sys

import transformers
from tokenizers import Tokenizer, models

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hfcommon import fail  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = sorted(f for f in os.listdir(os.path.join(HERE, "chat_templates")) if f.endswith(".jinja"))
BOS, EOS = "<s>", "</s>"

SYS = {"role": "system", "content": "You are terse.  Answer in one line."}
U1 = {"role": "user", "content": "What is 2+2?\n\nThink step by step."}
A1 = {"role": "assistant", "content": "  4, since 2+2 = 4.  "}
U2 = {"role": "user", "content": "Und auf Deutsch? 日本語でも 🙂"}
A2 = {"role": "assistant", "content": "Vier. 四。"}
CONVERSATIONS = [
    [U1],
    [U1, A1],
    [SYS, U1, A1],
    [U1, A1, U2, A2],
    [SYS, U1, A1, U2],
    [U1, U1],  # not alternating: some templates refuse it
]


def hf_render(tok, source, msgs, gen):
    try:
        return {"text": tok.apply_chat_template(msgs, chat_template=source, tokenize=False,
                                                add_generation_prompt=gen)}
    except Exception as e:  # a template's raise_exception (jinja2 TemplateError)
        return {"error": str(e)}


def main():
    render, engine, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token=BOS, eos_token=EOS)
    cases, want = [], []
    for name in TEMPLATES:
        path = os.path.join(HERE, "chat_templates", name)
        source = open(path).read()
        for msgs in CONVERSATIONS:
            for gen in (False, True):
                cases.append({"template": path, "messages": msgs, "add_generation_prompt": gen, "bos": BOS,
                              "eos": EOS, "name": name})
                want.append(hf_render(tok, source, msgs, gen))
    r = subprocess.run([render], input="".join(json.dumps(c) + "\n" for c in cases), capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        fail(f"chat_render exit {r.returncode}: {r.stderr[-2000:]}")
    got = [json.loads(l) for l in r.stdout.splitlines()]
    if len(got) != len(cases):
        fail(f"chat_render answered {len(got)} of {len(cases)} cases: {r.stderr[-2000:]}")
    per = {}
    for c, g, w in zip(cases, got, want):
        what = f"{c['name']} on {[m['role'] for m in c['messages']]} gen={c['add_generation_prompt']}"
        if "error" in w:
            if "error" not in g:
                fail(f"{what}: transformers refuses ({w['error']!r}) but the engine rendered {g['text'][:200]!r}")
            if w["error"] not in g["error"]:
                fail(f"{what}: the engine's refusal {g['error']!r} lacks the template's message {w['error']!r}")
            per.setdefault(c["name"], [0, 0])[1] += 1
        else:
            if "error" in g:
                fail(f"{what}: the engine fails ({g['error']}) where transformers renders {w['text'][:200]!r}")
            if g["text"] != w["text"]:
                fail(f"{what}: engine\n{g['text']!r}\ntransformers\n{w['text']!r}")
            per.setdefault(c["name"], [0, 0])[0] += 1
    for name, (same, refused) in sorted(per.items()):
        print(f"  {name}: {same} renderings equal transformers', {refused} refused by both")
    print("chat templates render as transformers renders them")
    dataset_check(engine, work)


def dataset_check(engine, work):
    """A chat dataset with chat_template "model": the engine's rows
    (dump-rows) are transformers' apply_chat_template text tokenised by the
    `tokenizers` library, and the loss is on each assistant message: from
    the end of messages[:i] with the generation prompt to the end of
    messages[:i+1] (TRL's prefix rule), targets shifted by one."""
    import corpus
    from tokenizers import decoders, pre_tokenizers, trainers
    d = os.path.join(work, "model")
    os.makedirs(d)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus.corpus(seed=4, n_random=50, n_sentences=300),
                            trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.save(os.path.join(d, "tokenizer.json"))
    source = open(os.path.join(HERE, "chat_templates", "Qwen-Qwen2.5-7B-Instruct.jinja")).read()
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                   "pad_token": "<|endoftext|>", "bos_token": None, "chat_template": source}, f)
    transformers.Qwen2Config(vocab_size=bpe.get_vocab_size(), hidden_size=16, intermediate_size=32,
                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1).save_pretrained(d)
    # The tokenizer.json as written (AutoTokenizer would pick Qwen2's class,
    # which brings Qwen's own split regex instead of this file's).
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"),
                                               eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = source
    convs = [CONVERSATIONS[2], CONVERSATIONS[3], [SYS, U2, A2, U1, A1]]
    data = os.path.join(work, "chat.jsonl")
    with open(data, "w") as f:
        for c in convs:
            f.write(json.dumps({"messages": c}) + "\n")
    seq = 160
    spec = {"name": "chat", "model": {"path": d}, "method": "full",
            "dataset": {"train": data, "format": "chat", "chat_template": "model"},
            "hyperparameters": {"max_steps": 1, "seq_len": seq, "batch_size": 1}, "resources": {"backend": "cpu"}}
    sp = os.path.join(work, "spec.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    r = subprocess.run([engine, "dump-rows", "--spec", sp], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail(f"dump-rows: exit {r.returncode}: {r.stderr[-1500:]}")
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    if len(rows) != len(convs):
        fail(f"dump-rows gave {len(rows)} rows for {len(convs)} conversations")

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    for c, row in zip(convs, rows):
        text = tok.apply_chat_template(c, tokenize=False)
        want = ids(text)
        labels = [-100] * len(want)
        for i, m in enumerate(c):
            if m["role"] != "assistant":
                continue
            a = len(ids(tok.apply_chat_template(c[:i], tokenize=False, add_generation_prompt=True)))
            b = len(ids(tok.apply_chat_template(c[:i + 1], tokenize=False)))
            labels[a:b] = want[a:b]
        want_in = (want + [0] * seq)[:seq]
        # a row is the first seq tokens; target t = label t+1 inside the row
        # (its last position has none, as docs/engine.md says)
        want_tg = (labels[:seq][1:] + [-100] * seq)[:seq]
        key_in = "ids" if "ids" in row else "input_ids"
        key_tg = "targets" if "targets" in row else "labels"
        if row[key_in] != want_in:
            fail(f"rows of {[m['role'] for m in c]}: ids differ from transformers'\n{row[key_in]}\n{want_in}")
        if row[key_tg] != want_tg:
            fail(f"rows of {[m['role'] for m in c]}: loss targets differ\n{row[key_tg]}\n{want_tg}")
        print(f"  dataset row of {[m['role'] for m in c]}: {len(want)} tokens, "
              f"{sum(t != -100 for t in want_tg)} with loss, equal to transformers' + TRL's prefix rule")
    # A template that refuses the conversation names the file's line.
    with open(data, "w") as f:
        f.write(json.dumps({"messages": [U1]}) + "\n")
    bad = dict(json.load(open(os.path.join(d, "tokenizer_config.json"))))
    bad["chat_template"] = "{{ raise_exception('no chat here') }}"
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(bad, f)
    r = subprocess.run([engine, "dump-rows", "--spec", sp], capture_output=True, text=True, timeout=120)
    if r.returncode == 0 or "line 1" not in r.stderr or "no chat here" not in r.stderr:
        fail(f"a raising template: exit {r.returncode}, stderr {r.stderr[-600:]!r}")
    print(f"  a template's raise_exception: exit {r.returncode}, \"{r.stderr.strip().splitlines()[-1][:120]}\"")


if __name__ == "__main__":
    main()
