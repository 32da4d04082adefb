# ft_test.py — fine-tuning tests for trainyard-engine: text dataset rows and
# their loss masks, LoRA against a hand-written PyTorch LoRA, PEFT export
# (adapter files, merge), the adapter round trip and bad inputs.
#
#   /usr/bin/python3 ft_test.py --engine PATH --case NAME
#
# Models are tiny random Hugging Face directories from tests/engine_ref's
# generator (imported, not copied); the tokenizer is a small byte-level BPE
# tokenizer.json written here, so no vocabulary file is committed. The
# engine's rows come from `trainyard-engine dump-rows`; masks are checked
# against byte spans of the rendered template, decoded independently here.
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "engine_ref"))
import hfgen  # noqa: E402
import torchref  # noqa: E402

IGNORE = -100
TIMEOUT_S = 300
ENGINE = None


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


# ---- a tiny byte-level BPE tokenizer ----------------------------------------------

def bytes_to_unicode():
    """GPT-2's printable stand-in for every byte (the ByteLevel alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


B2U = bytes_to_unicode()
U2B = {u: b for b, u in B2U.items()}
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("l", "l"),
          ("Ġ", "w"), ("o", "r"), ("Ġw", "or"), ("l", "d"), ("Ġwor", "ld"), ("H", "e"), ("He", "ll"), ("Hell", "o")]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>", "<s>", "</s>"]
VOCAB_SIZE = 300  # the models' vocabulary: room above the tokenizer's ids


def tokenizer_vocab():
    vocab = {B2U[b]: b for b in range(256)}
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    return vocab


def write_tokenizer(model_dir, bos, eos, add_bos, model_type="BPE", merges=None):
    vocab = tokenizer_vocab()
    added = []
    for s in SPECIALS:
        added.append({"id": len(vocab) + len(added), "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                            "use_regex": True},
          "post_processor": None,
          "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
          "model": {"type": model_type, "dropout": None, "unk_token": None, "fuse_unk": False,
                    "byte_fallback": False, "vocab": vocab,
                    "merges": merges if merges is not None else [f"{a} {b}" for a, b in MERGES]}}
    hfgen.write_json(os.path.join(model_dir, "tokenizer.json"), tj)
    tc = {"bos_token": bos, "eos_token": eos, "add_bos_token": add_bos, "add_eos_token": False}
    hfgen.write_json(os.path.join(model_dir, "tokenizer_config.json"), tc)
    return {t["id"]: t["content"] for t in added}


def token_bytes(i, specials):
    """The bytes token id i stands for (special tokens: their text)."""
    if i in specials:
        return specials[i].encode()
    inv = {v: k for k, v in tokenizer_vocab().items()}
    return bytes(U2B[c] for c in inv[i])


# ---- running the engine ------------------------------------------------------------

def run_engine(spec, workdir, resume=None):
    """Trains; returns (exit status, events, stderr)."""
    os.makedirs(workdir, exist_ok=True)
    sp = os.path.join(workdir, "..", os.path.basename(workdir) + ".spec.json")
    hfgen.write_json(sp, spec)
    cmd = ["/bin/bash", "-c", 'exec "$0" "$@" 3>&1 1>&2', ENGINE, "--spec", sp, "--workdir", workdir]
    p = subprocess.run(cmd + (["--resume", resume] if resume else []), capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    events = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    return p.returncode, events, p.stderr


def ok_run(spec, workdir, what, resume=None):
    rc, events, err = run_engine(spec, workdir, resume)
    done = [e for e in events if e["ev"] == "done"]
    if rc != 0 or not done or done[-1]["status"] != "succeeded":
        fail(f"{what}: exit {rc}, events {events[-3:]}, stderr {err[-2000:]}")
    return events


def dump_rows(spec, tmp, eval_rows=False):
    sp = os.path.join(tmp, "dump.spec.json")
    hfgen.write_json(sp, spec)
    cmd = [ENGINE, "dump-rows", "--spec", sp] + (["--eval"] if eval_rows else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if p.returncode != 0:
        return p.returncode, None, p.stderr
    return 0, [json.loads(line) for line in p.stdout.splitlines()], p.stderr


def spec_for(model_dir, train, fmt, seq_len, steps=3, batch=2, **extra):
    s = hfgen.job_spec(model_dir, train, steps, batch, seq_len, grad_accum=1, lr=1e-2, schedule="constant",
                       warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0)
    s["dataset"]["format"] = fmt
    s["dataset"].update(extra)
    return s


def write_jsonl(path, rows, raw_lines=()):
    with open(path, "wb") as f:
        for r in rows:
            f.write(json.dumps(r).encode() + b"\n")
        for line in raw_lines:
            f.write(line + b"\n")


def make_model(tmp, arch="gpt2", bos="<s>", eos="</s>", add_bos=True, seed=3):
    d = os.path.join(tmp, f"model-{arch}-{seed}")
    gen = torch.Generator().manual_seed(seed)
    if arch == "gpt2":
        cfg = hfgen.gpt2_config(n_embd=16, n_layer=2, n_head=2, n_positions=128, vocab_size=VOCAB_SIZE)
        hfgen.write_model(d, cfg, hfgen.gpt2_tensors(cfg, gen, prefix="transformer."))
    else:
        cfg = hfgen.llama_config(hidden=16, inter=32, layers=2, heads=4, kv_heads=2, vocab=VOCAB_SIZE)
        hfgen.write_model(d, cfg, hfgen.llama_tensors(cfg, gen))
    specials = write_tokenizer(d, bos, eos, add_bos)
    return d, specials


# ---- masking -------------------------------------------------------------------------

def check_row(row, full, spans, specials, what):
    """full: the rendered example as bytes (BOS/EOS included); spans: byte
    ranges that carry loss. Each token's bytes must tile `full`; targets[t]
    must be input_ids[t+1] exactly for the tokens inside a span, else -100."""
    ids, tg = row["input_ids"], row["targets"]
    pos, n = 0, 0
    starts = []
    while pos < len(full):
        if n >= len(ids):
            fail(f"{what}: row ends before the rendered text ({full!r})")
        b = token_bytes(ids[n], specials)
        if full[pos:pos + len(b)] != b:
            fail(f"{what}: token {n} ({b!r}) does not continue {full[:pos]!r} -> {full!r}")
        starts.append((pos, pos + len(b)))
        pos += len(b)
        n += 1
    if any(i != 0 for i in ids[n:]) or any(t != IGNORE for t in tg[n - 1:]):
        fail(f"{what}: padding after token {n} is not id 0 / target -100: {ids} {tg}")
    for i in range(1, n):
        lo, hi = starts[i]
        inside = any(a <= lo and hi <= b for a, b in spans)
        want = ids[i] if inside else IGNORE
        if tg[i - 1] != want:
            fail(f"{what}: target {i - 1} (token {full[lo:hi]!r}) is {tg[i - 1]}, expected {want}; "
                 f"spans {[full[a:b] for a, b in spans]}")
    return n


def case_masking(tmp):
    m, specials = make_model(tmp, "gpt2", bos="<s>", eos="</s>", add_bos=True)
    T = 64
    # text: <s> text </s>, every token a target (the BOS is never one: nothing predicts it)
    texts = [{"text": "Hello the world"}, {"text": "in ll on"}, {"body": "x", "text": "wörld 東京 🙂"}]
    path = os.path.join(tmp, "text.jsonl")
    write_jsonl(path, texts)
    rc, rows, err = dump_rows(spec_for(m, path, "text", T), tmp)
    if rc:
        fail(f"text dump-rows: {err}")
    if len(rows) != 3:
        fail(f"text: {len(rows)} rows for 3 examples")
    for r, ex in zip(rows, texts):
        full = b"<s>" + ex["text"].encode() + b"</s>"
        check_row(r, full, [(3, len(full))], specials, "text")
    # text_field
    rc, rows, err = dump_rows(spec_for(m, path, "text", T, text_field="body"), tmp)
    if rc == 0:
        fail("text_field body: lines without it must be an error")
    if "line 1" not in err or "body" not in err:
        fail(f"text_field body: error should name line 1 and the field: {err}")

    # prompt_completion: loss on the completion and EOS only
    pcs = [{"prompt": "Hello", "completion": " the world"}, {"prompt": "in: ", "completion": "on\nll"}]
    path = os.path.join(tmp, "pc.jsonl")
    write_jsonl(path, pcs)
    rc, rows, err = dump_rows(spec_for(m, path, "prompt_completion", T), tmp)
    if rc:
        fail(f"prompt_completion dump-rows: {err}")
    for r, ex in zip(rows, pcs):
        p, c = ex["prompt"].encode(), ex["completion"].encode()
        full = b"<s>" + p + c + b"</s>"
        check_row(r, full, [(3 + len(p), len(full))], specials, "prompt_completion")

    # chat templates: loss on the assistant turns only
    conv = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
                          {"role": "assistant", "content": " the world "}, {"role": "user", "content": "in"},
                          {"role": "assistant", "content": "on ll"}]}]
    path = os.path.join(tmp, "chat.jsonl")
    write_jsonl(path, conv)
    msgs = conv[0]["messages"]

    def chatml():
        full, spans = b"", []
        for mm in msgs:
            full += b"<|im_start|>" + mm["role"].encode() + b"\n"
            body = mm["content"].encode() + b"<|im_end|>"
            if mm["role"] == "assistant":
                spans.append((len(full), len(full) + len(body)))
            full += body + b"\n"
        return full, spans

    def llama3():
        full, spans = b"<s>", []  # bos_token is <s> in this tokenizer config
        for mm in msgs:
            full += b"<|start_header_id|>" + mm["role"].encode() + b"<|end_header_id|>\n\n"
            body = mm["content"].strip().encode() + b"<|eot_id|>"
            if mm["role"] == "assistant":
                spans.append((len(full), len(full) + len(body)))
            full += body
        return full, spans

    def llama2():
        full, spans = b"", []
        sys_msg = msgs[0]["content"]
        for i, mm in enumerate(msgs[1:]):
            if mm["role"] == "user":
                c = mm["content"]
                if i == 0:
                    c = "<<SYS>>\n" + sys_msg + "\n<</SYS>>\n\n" + c
                full += b"<s>[INST] " + c.strip().encode() + b" [/INST]"
            else:
                body = b" " + mm["content"].strip().encode() + b" </s>"
                spans.append((len(full), len(full) + len(body)))
                full += body
        return full, spans

    for name, render in (("chatml", chatml), ("llama3", llama3), ("llama2", llama2)):
        rc, rows, err = dump_rows(spec_for(m, path, "chat", 128, chat_template=name), tmp)
        if rc:
            fail(f"chat {name} dump-rows: {err}")
        full, spans = render()
        check_row(rows[0], full, spans, specials, f"chat {name}")

    # llama2 needs user/assistant alternation: an error naming the line
    bad = [{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}]
    write_jsonl(path, bad)
    rc, rows, err = dump_rows(spec_for(m, path, "chat", T, chat_template="llama2"), tmp)
    if rc == 0 or "line 1" not in err or "alternat" not in err:
        fail(f"llama2 alternation: exit {rc}, {err}")

    # packing: the examples' tokens concatenated, cut into full rows
    many = [{"text": ("Hello the world " * (1 + i % 3)).strip()} for i in range(12)]
    path = os.path.join(tmp, "pack.jsonl")
    write_jsonl(path, many)
    T = 16
    rc, single, err = dump_rows(spec_for(m, path, "text", 64), tmp)
    if rc:
        fail(f"packing reference rows: {err}")
    stream_ids, stream_tg = [], []
    for r in single:
        ids = r["input_ids"]
        L = len(ids) - next(i for i, x in enumerate(reversed(ids)) if x != 0)
        stream_ids += ids[:L]
        stream_tg += [IGNORE] + [ids[k] for k in range(1, L)]  # every text token but BOS carries loss
    rc, packed, err = dump_rows(spec_for(m, path, "text", T, packing=True), tmp)
    if rc:
        fail(f"packing dump-rows: {err}")
    if len(packed) != len(stream_ids) // T:
        fail(f"packing: {len(packed)} rows for {len(stream_ids)} tokens at seq_len {T}")
    for j, r in enumerate(packed):
        want = stream_ids[j * T:(j + 1) * T]
        if r["input_ids"] != want:
            fail(f"packed row {j}: {r['input_ids']} != {want}")
        want_tg = [stream_tg[j * T + t + 1] for t in range(T - 1)] + [IGNORE]
        if r["targets"] != want_tg:
            fail(f"packed row {j} targets {r['targets']} != {want_tg}")

    # bad lines: an error naming file and line, or skipped and counted
    path = os.path.join(tmp, "bad.jsonl")
    write_jsonl(path, [{"text": "Hello"}], raw_lines=[b'{"text": "caf\xc3"}', b"{not json", b'{"text": 5}',
                                                       b'{"other": "x"}'])
    for bad_line, what in ((2, "UTF-8"), (3, "JSON"), (4, "string"), (5, "missing")):
        lines = open(path, "rb").read().splitlines()
        one = os.path.join(tmp, f"bad{bad_line}.jsonl")
        with open(one, "wb") as f:
            f.write(lines[0] + b"\n" + lines[bad_line - 1] + b"\n")
        rc, rows, err = dump_rows(spec_for(m, one, "text", T), tmp)
        if rc == 0 or "bad%d.jsonl line 2" % bad_line not in err or what not in err:
            fail(f"bad line ({what}): exit {rc}, stderr {err!r}")
    rc, rows, err = dump_rows(spec_for(m, path, "text", T, skip_invalid=True), tmp)
    if rc or len(rows) != 1 or "skipped 4 invalid lines" not in err:
        fail(f"skip_invalid: exit {rc}, {rows and len(rows)} rows, stderr {err!r}")

    # eval_fraction on a text set: the split rows plus the training rows are all rows
    rc, tr, err = dump_rows(spec_for(m, os.path.join(tmp, "pack.jsonl"), "text", 64, eval_fraction=0.25), tmp)
    rc2, ev, err2 = dump_rows(spec_for(m, os.path.join(tmp, "pack.jsonl"), "text", 64, eval_fraction=0.25), tmp,
                              eval_rows=True)
    if rc or rc2 or len(tr) != 9 or len(ev) != 3:
        fail(f"eval_fraction: {rc} {rc2} {tr and len(tr)} {ev and len(ev)} {err} {err2}")
    # end to end: LoRA on packed chat rows with a held-out split; the started
    # event's counts are the rows dump-rows builds
    convs = [{"messages": [{"role": "user", "content": "Hello" * (1 + i % 4)},
                           {"role": "assistant", "content": "the world " * (1 + i % 3)}]} for i in range(16)]
    path = os.path.join(tmp, "chat-many.jsonl")
    write_jsonl(path, convs)
    spec = spec_for(m, path, "chat", 32, chat_template="llama3", packing=True, eval_fraction=0.2)
    spec["method"] = "lora"
    spec["lora"] = {"r": 2, "alpha": 4, "dropout": 0.1}
    rc, tr, err = dump_rows(spec, tmp)
    rc2, ev, err2 = dump_rows(spec, tmp, eval_rows=True)
    if rc or rc2:
        fail(f"chat packing rows: {err} {err2}")
    events = ok_run(spec, os.path.join(tmp, "chat-lora"), "LoRA on packed chat")
    st = events[0]
    if (st["rows"], st["eval_rows"], st["tokens_per_epoch"], st["format"], st["method"]) != \
            (len(tr), len(ev), 32 * len(tr), "chat", "lora"):
        fail(f"started {st} vs {len(tr)} train / {len(ev)} eval rows")
    if not [e for e in events if e["ev"] == "eval"]:
        fail("no eval event with eval_fraction")
    print("ok masking")


# ---- LoRA reference ---------------------------------------------------------------------

GPT2_SLOTS = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
LLAMA_SLOTS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj"]


def modules(cfg, targets):
    gpt2 = cfg["model_type"] == "gpt2"
    n = cfg["n_layer"] if gpt2 else cfg["num_hidden_layers"]
    out = []
    for i in range(n):
        for s in GPT2_SLOTS if gpt2 else LLAMA_SLOTS:
            path = (f"transformer.h.{i}." if gpt2 else f"model.layers.{i}.") + s
            if any(path == t or path.endswith("." + t) for t in targets):
                out.append(path)
    return out


def lora_forward(cfg, p, lora, scale, ids):
    """The base model with y += scale * (x A^T) B^T on each adapted module;
    GPT-2's Conv1D weights are [in, out] (y = x W)."""
    def lin(x, name, conv):
        w = p[name + ".weight"]
        y = x @ w if conv else x @ w.t()
        b = p.get(name + ".bias")
        if b is not None:
            y = y + b
        key = ("transformer." if conv else "") + name
        if key in lora:
            A, B = lora[key]
            y = y + scale * ((x @ A.t()) @ B.t())
        return y

    B_, T = ids.shape
    if cfg["model_type"] == "gpt2":
        C, H, eps = cfg["n_embd"], cfg["n_head"], cfg.get("layer_norm_epsilon", 1e-5)
        x = p["wte.weight"][ids] + p["wpe.weight"][torch.arange(T)]
        for i in range(cfg["n_layer"]):
            h = f"h.{i}."
            a = torchref.layernorm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps)
            q, k, v = lin(a, h + "attn.c_attn", True).split(C, dim=-1)
            q, k, v = (t.view(B_, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = torchref.causal_attention(q, k, v).transpose(1, 2).reshape(B_, T, C)
            x = x + lin(y, h + "attn.c_proj", True)
            mm = torchref.layernorm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps)
            x = x + lin(torchref.gelu_tanh(lin(mm, h + "mlp.c_fc", True)), h + "mlp.c_proj", True)
        x = torchref.layernorm(x, p["ln_f.weight"], p["ln_f.bias"], eps)
        return x @ p["wte.weight"].t()
    C, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, eps, theta = C // H, cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    x = p["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        L = f"model.layers.{i}."
        a = torchref.rmsnorm(x, p[L + "input_layernorm.weight"], eps)
        q = lin(a, L + "self_attn.q_proj", False).view(B_, T, H, D).transpose(1, 2)
        k = lin(a, L + "self_attn.k_proj", False).view(B_, T, KV, D).transpose(1, 2)
        v = lin(a, L + "self_attn.v_proj", False).view(B_, T, KV, D).transpose(1, 2)
        q, k = torchref.rope(q, theta), torchref.rope(k, theta)
        k, v = torchref.repeat_kv(k, H // KV), torchref.repeat_kv(v, H // KV)
        y = torchref.causal_attention(q, k, v).transpose(1, 2).reshape(B_, T, H * D)
        x = x + lin(y, L + "self_attn.o_proj", False)
        mm = torchref.rmsnorm(x, p[L + "post_attention_layernorm.weight"], eps)
        g = lin(mm, L + "mlp.gate_proj", False)
        x = x + lin(torch.nn.functional.silu(g) * lin(mm, L + "mlp.up_proj", False), L + "mlp.down_proj", False)
    x = torchref.rmsnorm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]
    return x @ head.t()


def random_adapter(cfg, mods, r, seed):
    gen = torch.Generator().manual_seed(seed)
    gpt2 = cfg["model_type"] == "gpt2"
    out = {}
    for mpath in mods:
        name = mpath.split(".")[-1]
        if gpt2:
            C = cfg["n_embd"]
            shapes = {"c_attn": (C, 3 * C), "c_proj": (4 * C, C) if ".mlp." in mpath else (C, C), "c_fc": (C, 4 * C)}
            fin, fout = shapes[name]
        else:
            C, I = cfg["hidden_size"], cfg["intermediate_size"]
            Dq, Dkv = C, cfg["num_key_value_heads"] * (C // cfg["num_attention_heads"])
            fin, fout = {"q_proj": (C, Dq), "k_proj": (C, Dkv), "v_proj": (C, Dkv), "o_proj": (Dq, C),
                         "gate_proj": (C, I), "up_proj": (C, I), "down_proj": (I, C)}[name]
        out[mpath] = (torch.randn(r, fin, generator=gen) * 0.3, torch.randn(fout, r, generator=gen) * 0.3)
    return out


def write_adapter(d, lora, r, alpha, targets, base):
    os.makedirs(d, exist_ok=True)
    t = {}
    for mpath, (A, B) in lora.items():
        t[f"base_model.model.{mpath}.lora_A.weight"] = A
        t[f"base_model.model.{mpath}.lora_B.weight"] = B
    hfgen.write_safetensors(os.path.join(d, "adapter_model.safetensors"), t)
    hfgen.write_json(os.path.join(d, "adapter_config.json"),
                     {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": targets,
                      "base_model_name_or_path": base})


def torch_lora_train(spec, lora0, steps):
    """Trains only the adapters (float64) on the engine's data order; returns
    per-step losses and the final adapters."""
    hp = spec["hyperparameters"]
    cfg, p = torchref.load_model(spec["model"]["path"], torch.float64)
    for t in p.values():
        t.requires_grad_(False)
    lora = {k: (A.double().clone().requires_grad_(True), B.double().clone().requires_grad_(True))
            for k, (A, B) in lora0.items()}
    scale = spec["lora"]["alpha"] / spec["lora"]["r"]
    B, T = hp["batch_size"], hp["seq_len"]
    examples = torchref.load_examples(spec["dataset"]["train"], T)
    stream = torchref.example_stream(len(examples), hp["seed"], torchref.engine_order)
    params = [t for ab in lora.values() for t in ab]
    opt = torch.optim.AdamW(params, lr=hp["lr"], betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=hp["weight_decay"])
    losses = []
    for _ in range(steps):
        rows = [examples[next(stream)] for _ in range(B)]
        ids, tg = torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])
        n_tok = int((tg != IGNORE).sum())
        opt.zero_grad()
        logits = lora_forward(cfg, p, lora, scale, ids)
        lsum = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tg.reshape(-1),
                                                 ignore_index=IGNORE, reduction="sum")
        (lsum / n_tok).backward()
        torch.nn.utils.clip_grad_norm_(params, hp["max_grad_norm"])
        opt.step()
        losses.append(float(lsum) / n_tok)
    return losses, {k: (A.detach(), B.detach()) for k, (A, B) in lora.items()}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def case_lora(tmp, arch):
    m, _ = make_model(tmp, arch, seed=5 if arch == "gpt2" else 6)
    cfg = json.load(open(os.path.join(m, "config.json")))
    base = hfgen.read_model_weights(m)
    T, steps, r, alpha = 12, 4, 4, 8.0
    train = os.path.join(tmp, "train.jsonl")
    hfgen.write_tokens_dataset(train, 10, VOCAB_SIZE, T, torch.Generator().manual_seed(9))
    targets = ["c_attn", "c_proj", "c_fc"] if arch == "gpt2" else ["q_proj", "k_proj", "v_proj", "o_proj",
                                                                     "gate_proj", "up_proj", "down_proj"]
    mods = modules(cfg, targets)
    if arch == "gpt2" and len(mods) != 4 * cfg["n_layer"]:
        fail(f"c_proj must match both attn.c_proj and mlp.c_proj: {mods}")
    lora0 = random_adapter(cfg, mods, r, seed=21)
    start = os.path.join(tmp, "start-adapter")
    write_adapter(start, lora0, r, alpha, targets, m)

    def spec_of(max_steps, adapter, merge=False, tg=targets):
        s = hfgen.job_spec(m, train, max_steps, 2, T, grad_accum=1, lr=1e-2, schedule="constant", warmup_steps=0,
                           weight_decay=0.01, max_grad_norm=1.0)
        s["method"] = "lora"
        s["lora"] = {"r": r, "alpha": alpha, "dropout": 0.0, "targets": tg, "merge": merge}
        if adapter:
            s["lora"]["adapter"] = adapter
        return s

    # 1. losses against the hand-written LoRA, from a non-trivial adapter
    spec = spec_of(steps, start)
    events = ok_run(spec, os.path.join(tmp, "run1"), f"{arch} lora")
    started = events[0]
    n_lora = sum(A.numel() + B.numel() for A, B in lora0.values())
    if started.get("trainable") != n_lora or started["params"] <= n_lora or started.get("rows") != 10:
        fail(f"started event {started}: trainable should be {n_lora}")
    got = [e["loss"] for e in events if e["ev"] == "metric"]
    ref, final = torch_lora_train(spec, lora0, steps)
    if len(got) != steps or any(rel(a, b) > 1e-4 for a, b in zip(got, ref)):
        fail(f"{arch} lora losses {got} vs torch {ref}")
    if "eta_s" not in [e for e in events if e["ev"] == "metric"][-1]:
        fail("metric events need eta_s")

    # 2. the export is a PEFT adapter with the trained tensors
    exp = os.path.join(tmp, "run1", "export")
    ac = json.load(open(os.path.join(exp, "adapter_config.json")))
    want = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "task_type": "CAUSAL_LM", "bias": "none",
            "target_modules": targets, "base_model_name_or_path": m, "fan_in_fan_out": arch == "gpt2"}
    for k, v in want.items():
        if ac.get(k) != v:
            fail(f"adapter_config.json {k} = {ac.get(k)!r}, expected {v!r}")
    if not os.path.exists(os.path.join(exp, "tokenizer.json")):
        fail("the export lacks tokenizer.json")
    ad = hfgen.read_safetensors(os.path.join(exp, "adapter_model.safetensors"))
    if sorted(ad) != sorted(f"base_model.model.{mp}.lora_{x}.weight" for mp in mods for x in "AB"):
        fail(f"adapter tensor names {sorted(ad)}")
    for mp, (A, B) in final.items():
        ea, eb = ad[f"base_model.model.{mp}.lora_A.weight"], ad[f"base_model.model.{mp}.lora_B.weight"]
        if ea.shape != A.shape or eb.shape != B.shape:
            fail(f"{mp}: shapes {tuple(ea.shape)} {tuple(eb.shape)} vs {tuple(A.shape)} {tuple(B.shape)}")
        if (ea.double() - A).abs().max() > 1e-4 or (eb.double() - B).abs().max() > 1e-4:
            fail(f"{mp}: trained adapter differs from torch's")
    ck = os.path.join(tmp, "run1", "checkpoints", f"step-{steps:06d}")
    if sorted(os.listdir(ck)) != ["MANIFEST.json", "adapter_config.json", "adapter_model.safetensors",
                                  "optimizer.safetensors", "trainer_state.json"]:
        fail(f"LoRA checkpoint holds {sorted(os.listdir(ck))}")
    opt = hfgen.read_safetensors(os.path.join(ck, "optimizer.safetensors"))
    if len(opt) != 2 * len(ad):
        fail(f"optimizer state should cover only the adapters: {len(opt)} tensors")

    # 3. merge: W + (alpha/r) B A in HF layout; every other tensor bit-identical
    spec = spec_of(steps, start, merge=True)
    ok_run(spec, os.path.join(tmp, "run2"), f"{arch} lora merge")
    merged = hfgen.read_model_weights(os.path.join(tmp, "run2", "export"))
    ad2 = hfgen.read_safetensors(os.path.join(tmp, "run2", "checkpoints", f"step-{steps:06d}",
                                              "adapter_model.safetensors"))
    for name, w in base.items():
        mp = name[:-len(".weight")]
        if mp not in final and name in merged:
            if not torch.equal(merged[name], w):
                fail(f"{name}: a frozen weight changed")
            continue
        if mp not in final:
            continue
        A = ad2[f"base_model.model.{mp}.lora_A.weight"].double()
        B = ad2[f"base_model.model.{mp}.lora_B.weight"].double()
        delta = (alpha / r) * (B @ A)
        if arch == "gpt2":
            delta = delta.t()  # Conv1D stores [in, out]
        if (merged[name].double() - (w.double() + delta)).abs().max() > 1e-5:
            fail(f"{name}: merged weight is not W + (alpha/r) B A")

    # 4. round trip: the exported adapter as the start of a new job gives the
    # loss torch computes for that adapter
    spec = spec_of(1, exp)
    events = ok_run(spec, os.path.join(tmp, "run3"), f"{arch} adapter round trip")
    got = [e["loss"] for e in events if e["ev"] == "metric"][0]
    ref, _ = torch_lora_train(spec, {k: (ad[f"base_model.model.{k}.lora_A.weight"],
                                         ad[f"base_model.model.{k}.lora_B.weight"]) for k in mods}, 1)
    if rel(got, ref[0]) > 1e-4:
        fail(f"round trip: first loss {got} vs torch {ref[0]}")

    # 5. resume from a mid-run LoRA checkpoint: the same losses, bit for bit
    # (the adapters' moments and the dropout stream are in the checkpoint)
    spec = spec_of(steps, start)
    spec["lora"]["dropout"] = 0.1
    spec["checkpoint"]["every_steps"] = 2
    full = ok_run(spec, os.path.join(tmp, "run5"), f"{arch} lora with checkpoints")
    resumed = ok_run(spec, os.path.join(tmp, "run6"), f"{arch} lora resume",
                     resume=os.path.join(tmp, "run5", "checkpoints", "step-000002"))
    a = [(e["step"], e["loss"]) for e in full if e["ev"] == "metric"][2:]
    b = [(e["step"], e["loss"]) for e in resumed if e["ev"] == "metric"]
    if a != b:
        fail(f"LoRA resume: {b} vs uninterrupted {a}")

    # 6. default targets and PEFT init: A within U(-1/sqrt(in), 1/sqrt(in)), B zero
    spec = spec_of(1, None, tg=None)
    del spec["lora"]["targets"]
    spec["hyperparameters"]["lr"] = 1e-9
    spec["lora"]["dropout"] = 0.2  # exercised here; the comparisons above use 0
    spec["dataset"]["eval_fraction"] = 0.2
    events = ok_run(spec, os.path.join(tmp, "run4"), f"{arch} default targets")
    evals = [e for e in events if e["ev"] == "eval"]
    if len(evals) != 1 or not math.isfinite(evals[0]["loss"]):
        fail(f"eval with LoRA: {evals}")
    ad4 = hfgen.read_safetensors(os.path.join(tmp, "run4", "export", "adapter_model.safetensors"))
    want_mods = modules(cfg, ["c_attn"] if arch == "gpt2" else ["q_proj", "v_proj"])
    if sorted(ad4) != sorted(f"base_model.model.{mp}.lora_{x}.weight" for mp in want_mods for x in "AB"):
        fail(f"default targets: {sorted(ad4)}")
    for k, t in ad4.items():
        if k.endswith("lora_B.weight") and t.abs().max() > 1e-6:
            fail(f"{k}: B should start at zero")
        if k.endswith("lora_A.weight"):
            bound = 1 / math.sqrt(t.shape[1])
            if t.abs().max() > bound * (1 + 1e-6) or t.abs().max() < bound * 0.5 or t.std() < bound / 3:
                fail(f"{k}: not U(-{bound}, {bound})")
    print(f"ok lora {arch}")


# ---- bad inputs ---------------------------------------------------------------------------

def expect_error(spec, tmp, name, words):
    rc, events, err = run_engine(spec, os.path.join(tmp, name))
    errs = [e for e in events if e["ev"] == "error"]
    if rc == 0 or not errs or any(w not in errs[-1]["message"] for w in words):
        fail(f"{name}: exit {rc}, error events {errs}, stderr {err[-1500:]}")


def case_bad_inputs(tmp):
    m, _ = make_model(tmp, "llama", seed=7)
    train = os.path.join(tmp, "t.jsonl")
    write_jsonl(train, [{"text": "Hello the world"}] * 4)
    # unknown tokenizer model type
    bad = os.path.join(tmp, "bad-type")
    subprocess.run(["cp", "-r", m, bad], check=True)
    write_tokenizer(bad, "<s>", "</s>", True, model_type="WordPiece")
    expect_error(spec_for(bad, train, "text", 16), tmp, "wordpiece", ["WordPiece"])
    # a merge naming a token the vocabulary lacks
    bad = os.path.join(tmp, "bad-merge")
    subprocess.run(["cp", "-r", m, bad], check=True)
    write_tokenizer(bad, "<s>", "</s>", True, merges=[f"{a} {b}" for a, b in MERGES] + ["zq Ġnope"])
    expect_error(spec_for(bad, train, "text", 16), tmp, "merge", ["merges[16]", "zq", "not in the vocabulary"])
    # invalid UTF-8 in a dataset line
    bad = os.path.join(tmp, "bad-utf8.jsonl")
    write_jsonl(bad, [{"text": "ok"}], raw_lines=[b'{"text": "\xff\xfe"}'])
    expect_error(spec_for(m, bad, "text", 16), tmp, "utf8", ["bad-utf8.jsonl line 2", "invalid UTF-8 (byte 11)"])
    # a LoRA target that matches no module
    s = spec_for(m, train, "text", 16)
    s["method"] = "lora"
    s["lora"] = {"r": 4, "alpha": 8, "targets": ["q_proj", "c_attn"]}
    expect_error(s, tmp, "target", ["c_attn", "matches no module"])
    # r = 0
    s["lora"] = {"r": 0, "alpha": 8}
    rc, events, err = run_engine(s, os.path.join(tmp, "r0"))
    errs = [e for e in events if e["ev"] == "error"]
    if rc != 2 or not errs or "lora.r" not in errs[-1]["message"]:
        fail(f"r = 0: exit {rc}, {errs}")
    # a starting adapter whose config says another rank
    ad = os.path.join(tmp, "r8-adapter")
    os.makedirs(ad)
    hfgen.write_json(os.path.join(ad, "adapter_config.json"), {"peft_type": "LORA", "r": 8, "lora_alpha": 8})
    s["lora"] = {"r": 2, "alpha": 8, "adapter": ad}
    expect_error(s, tmp, "adapter_r", ["r = 8", "lora.r is 2"])
    # a missing starting adapter
    s["lora"] = {"r": 2, "alpha": 8, "adapter": os.path.join(tmp, "nowhere")}
    expect_error(s, tmp, "adapter", ["lora.adapter", "nowhere"])
    # skip_invalid: a warning event with the count, then training
    mixed = os.path.join(tmp, "mixed.jsonl")
    write_jsonl(mixed, [{"text": "Hello the world"}] * 3, raw_lines=[b"{oops", b'{"text": 1}'])
    s = spec_for(m, mixed, "text", 16, skip_invalid=True)
    events = ok_run(s, os.path.join(tmp, "skip"), "skip_invalid")
    logs = [e for e in events if e["ev"] == "log" and e.get("level") == "warn"]
    if not logs or "skipped 2 invalid lines in mixed.jsonl" not in logs[0]["line"]:
        fail(f"skip_invalid log event: {events[:3]}")
    print("ok bad inputs")


def main():
    global ENGINE
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--case", required=True)
    a = ap.parse_args()
    ENGINE = a.engine
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="ft-test-") as tmp:
        if a.case == "masking":
            case_masking(tmp)
        elif a.case in ("lora_gpt2", "lora_llama"):
            case_lora(tmp, a.case.split("_")[1])
        elif a.case == "bad_inputs":
            case_bad_inputs(tmp)
        else:
            fail(f"unknown case {a.case}")


if __name__ == "__main__":
    main()
