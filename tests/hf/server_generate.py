"""server_generate.py — ctest hf.server_generate: POST /jobs/{id}/generate
and `trainyard generate` on a real server running the real engine, checked
against transformers' and peft's generate on the job's own outputs.

- 409 while the job has no checkpoint (a running job that checkpoints only
  at its end);
- a full fine-tuning job: greedy text from the newest checkpoint equals
  transformers' generate on the job's export (the same weights), and
  `base: true` equals transformers on the base model;
- a LoRA job: equals PeftModel.from_pretrained(base, export).generate;
- `trainyard generate ID PROMPT --json` gives the API's ids; --compare prints
  the base and the fine-tuned text;
- bad bodies are 400 naming the field; an unknown job 404;
- the time limit: with a generation that cannot finish (the server's engine
  is a wrapper that, while a flag file exists, sleeps instead of
  generating), time_limit_s 1 answers 503 and the next request runs.
Responses are checked against openapi.yaml by the harness.

Usage: server_generate.py TRAINYARD ENGINE WORKDIR"""
import json
import os
import shutil
import subprocess
import sys

import peft
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "server"))
trainyard, engine, work = sys.argv[1:4]
os.environ["TY_BIN"], os.environ["TY_FAKE_ENGINE"] = trainyard, engine  # the harness's names
import corpus  # noqa: E402
import tyharness  # noqa: E402
from hfcommon import fail, load_model, make_text_model  # noqa: E402

torch.set_num_threads(1)
PROMPT = "The model learning rate is"


def hf_greedy(model, ids, new):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=new, pad_token_id=0,
                             eos_token_id=model.config.eos_token_id)
    gen = out[0, len(ids):].tolist()
    eos = model.config.eos_token_id
    return gen[:gen.index(eos)] if eos in gen else gen


def main():
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    base = os.path.join(work, "base")
    tok = make_text_model(base, seed=21)
    eos = tok.token_to_id("<|endoftext|>")
    data = os.path.join(work, "train.jsonl")
    with open(data, "w") as f:
        for line in corpus.corpus(seed=8, n_random=0, n_sentences=8)[-8:]:
            f.write(json.dumps({"text": line}) + "\n")
    pids = tok.encode(PROMPT).ids

    def spec(steps, every=0, method="full"):
        s = {"name": "gen", "model": {"path": base}, "dataset": {"train": data, "format": "text"},
             "method": method, "hyperparameters": {"max_steps": steps, "batch_size": 2, "seq_len": 32,
                                                   "lr": 1e-2, "log_every_steps": 1},
             "resources": {"backend": "cpu"}, "checkpoint": {"every_steps": every}}
        if method == "lora":
            s["lora"] = {"r": 4, "alpha": 16, "targets": ["c_attn", "c_fc"]}
        return s

    # The server's engine: the real one, except that `generate` sleeps while
    # the flag file exists (the time-limit case).
    slow = os.path.join(work, "slow-generate")
    wrapper = os.path.join(work, "engine.sh")
    with open(wrapper, "w") as f:
        f.write('#!/bin/sh\nif [ "$1" = generate ] && [ -e "%s" ]; then exec sleep 300; fi\nexec "%s" "$@"\n'
                % (slow, engine))
    os.chmod(wrapper, 0o755)
    tyharness.ENGINE = wrapper
    srv = tyharness.Server("--cpu-slots", "1", roots=work)
    try:
        # 409: running, no checkpoint yet (every_steps 0: only at the end).
        long_id = srv.submit(spec(1000000))["id"]
        srv.wait_state(long_id, ["running"], timeout=120)
        r = srv.post(f"/jobs/{long_id}/generate", {"prompt": PROMPT})
        if r.status != 409 or r.json["error"]["code"] != "conflict":
            fail(f"generate before any checkpoint: {r.status} {r.body[:300]!r}, wanted 409 conflict")
        print(f"  no checkpoint yet: 409 \"{r.json['error']['message']}\"")
        srv.post(f"/jobs/{long_id}/cancel")
        srv.wait_state(long_id, ["cancelled"], timeout=120)

        # A full fine-tuning job.
        jid = srv.submit(spec(3))["id"]
        srv.wait_state(jid, ["succeeded"], timeout=300)
        jobdir = os.path.join(srv.data_dir, "jobs", str(jid))
        tuned = load_model(os.path.join(jobdir, "export"))
        tuned.config.eos_token_id = eos
        want = hf_greedy(tuned, pids, 20)
        r = srv.post(f"/jobs/{jid}/generate", {"prompt": PROMPT, "max_tokens": 20}, timeout=120)
        if r.status != 200:
            fail(f"generate: {r.status} {r.body[:400]!r}")
        res = r.json
        if res["ids"] != want or res["text"] != tok.decode(want) or res["base"] or not res["checkpoint"]:
            fail(f"fine-tuned: {res}\nwanted ids {want}")
        print(f"  fine-tuned greedy: {len(want)} tokens = transformers on the export ({res['checkpoint']})")
        b = load_model(base)
        b.config.eos_token_id = eos
        want_b = hf_greedy(b, pids, 20)
        r = srv.post(f"/jobs/{jid}/generate", {"prompt": PROMPT, "max_tokens": 20, "base": True}, timeout=120)
        if r.status != 200 or r.json["ids"] != want_b or r.json["checkpoint"] is not None:
            fail(f"base: {r.status} {r.body[:400]!r}\nwanted ids {want_b}")
        if want_b == want:
            fail("base and fine-tuned generate the same tokens; the comparison proves nothing")
        print(f"  base greedy: {len(want_b)} tokens = transformers on the base")

        # The CLI.
        env = dict(os.environ, TY_URL=f"http://127.0.0.1:{srv.port}")
        out = subprocess.run([trainyard, "generate", str(jid), PROMPT, "--max-tokens", "20", "--json"],
                             capture_output=True, text=True, env=env, timeout=120)
        if out.returncode != 0 or json.loads(out.stdout)["ids"] != want:
            fail(f"trainyard generate --json: exit {out.returncode}: {out.stdout[-300:]} {out.stderr[-300:]}")
        out = subprocess.run([trainyard, "generate", str(jid), PROMPT, "--max-tokens", "20", "--compare"],
                             capture_output=True, text=True, env=env, timeout=120)
        wanted = f"== base model\n{PROMPT}{tok.decode(want_b)}\n== fine-tuned\n{PROMPT}{tok.decode(want)}\n"
        if out.returncode != 0 or out.stdout != wanted:
            fail(f"trainyard generate --compare: exit {out.returncode}\n{out.stdout!r}\nwanted\n{wanted!r}\n{out.stderr}")
        print("  trainyard generate: --json ids and --compare text as the API")

        # A LoRA job.
        lid = srv.submit(spec(3, method="lora"))["id"]
        srv.wait_state(lid, ["succeeded"], timeout=300)
        pm = peft.PeftModel.from_pretrained(load_model(base), os.path.join(srv.data_dir, "jobs", str(lid), "export"))
        pm.eval()
        pm.config.eos_token_id = eos
        want_l = hf_greedy(pm, pids, 20)
        r = srv.post(f"/jobs/{lid}/generate", {"prompt": PROMPT, "max_tokens": 20}, timeout=120)
        if r.status != 200 or r.json["ids"] != want_l:
            fail(f"lora: {r.status} {r.body[:400]!r}\nwanted ids {want_l}")
        print(f"  LoRA greedy: {len(want_l)} tokens = PeftModel on the adapter export")

        # Bad input.
        for body, field in [({"prompt": PROMPT, "bogus": 1}, "bogus"), ({"prompt": ""}, "prompt"),
                            ({}, "prompt"), ({"prompt": "x", "prompt_ids": [1]}, "prompt"),
                            ({"prompt": "x", "temperature": -1}, "temperature"),
                            ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
                            ({"prompt": "x", "stop": [""]}, "stop"), ({"prompt": "x", "base": 1}, "base")]:
            r = srv.post(f"/jobs/{jid}/generate", body, check_schema=False)
            if r.status != 400 or r.json["error"].get("field") != field:
                fail(f"{body}: {r.status} {r.body[:300]!r}, wanted 400 naming {field}")
        r = srv.post(f"/jobs/{jid}/generate", {"prompt_ids": [5, 100000]}, timeout=60)
        if r.status != 400 or "vocabulary" not in r.json["error"]["message"] and "token id" not in r.json["error"]["message"]:
            fail(f"an id outside the vocabulary: {r.status} {r.body[:300]!r}")
        # The time limit kills the engine's process group and answers 503.
        open(slow, "w").close()
        r = srv.post(f"/jobs/{jid}/generate", {"prompt": PROMPT, "time_limit_s": 1}, timeout=120)
        os.unlink(slow)
        if r.status != 503 or "time limit" not in r.json["error"]["message"]:
            fail(f"time limit: {r.status} {r.body[:300]!r}, wanted 503 naming the time limit")
        r = srv.post(f"/jobs/{jid}/generate", {"prompt": PROMPT, "max_tokens": 20}, timeout=120)
        if r.status != 200 or r.json["ids"] != want:
            fail(f"after a timed-out request: {r.status} {r.body[:300]!r}")
        print("  time_limit_s 1 on a generation that cannot finish: 503; the next request runs")
        r = srv.post("/jobs/999999/generate", {"prompt": "x"})
        if r.status != 404:
            fail(f"unknown job: {r.status}")
        print("  bad bodies: 400 naming the field; the engine's refusal: 400; unknown job: 404")
    finally:
        srv.stop()
    print("server generate agrees with transformers and peft")


if __name__ == "__main__":
    main()
