"""test_gpu_assign.py — the GPUs the server assigns reach the engine:
a job asking for a GPU runs with CUDA_VISIBLE_DEVICES naming
the one the scheduler gave it and TY_LOCAL_RANK 0, and the engine (backend
auto) opens it. No GPU here: the server is given a GPU list by hand
(`--gpus 1,3`, no NVML) and the engine is the test build
trainyard-engine-emu with the emulated CUDA backend (TY_KERNELS=cuda-emu,
set by a wrapper, since the server passes only allow-listed variables).
"""
import json
import os
import stat
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tyharness as H  # noqa: E402
from tyharness import check, run_tests  # noqa: E402

EMU_ENGINE = os.environ.get("TY_ENGINE_EMU", "")
TINY = {"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 32, "vocab_size": 64}


def test_assign():
    check(EMU_ENGINE and os.access(EMU_ENGINE, os.X_OK), "TY_ENGINE_EMU must name trainyard-engine-emu")
    tmp = H.tmpdir("ty-gpu-assign-")
    wrapper = os.path.join(tmp, "engine-emu.sh")
    with open(wrapper, "w") as f:
        f.write('#!/bin/sh\nTY_KERNELS=cuda-emu TY_EMU_GUARD=1 TY_EMU_DEVICES=1 exec "%s" "$@"\n' % EMU_ENGINE)
    os.chmod(wrapper, os.stat(wrapper).st_mode | stat.S_IXUSR)
    srv = H.Server("--engine", wrapper, "--gpus", "1,3", roots=tmp)
    H._cleanup.append(lambda: H.kill_engines(srv.data_dir, (b"trainyard-engine-emu",)))
    train = os.path.join(tmp, "train.jsonl")
    with open(train, "w") as f:
        for i in range(8):
            f.write(json.dumps({"input_ids": [(i + j) % 64 for j in range(20)]}) + "\n")
    spec = {"model": {"init": TINY}, "dataset": {"train": train, "format": "tokens"},
            "hyperparameters": {"max_steps": 2, "batch_size": 1, "seq_len": 16, "log_every_steps": 1},
            "resources": {"gpus": 1}}
    jid = srv.submit(spec)["id"]
    job = srv.wait_state(jid, ["succeeded", "failed"], timeout=180)
    evs = srv.all_events(jid)
    r = srv.get("/jobs/%d/logs" % jid)
    logs = r.body.decode("utf-8", "replace") if isinstance(r.body, bytes) else str(r.body)
    check(job["state"] == "succeeded", "job %s: %s" % (job["state"], logs[-2000:]))
    started = [e[2]["data"] for e in evs if e[1] == "started"]
    check(started and started[0]["backend"] == "cuda-emu" and "fallback" not in started[0]
          and started[0]["gpu"]["compute_capability"] == "9.0", "started: %r" % started)
    # The first free GPU of the list is 1: the engine was told exactly that.
    check("device: cuda 0 (local rank) of CUDA_VISIBLE_DEVICES=1:" in logs, "engine log: %s" % logs[-2000:])
    srv.stop()


if __name__ == "__main__":
    run_tests({"assign": test_assign})
