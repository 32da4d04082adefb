#!/usr/bin/python3
"""test_dist.py — multi-rank CPU jobs from the server.

The real server and engine: `resources.cpu_ranks: 2` starts one mpirun of
two engine ranks (docs/engine.md, Ranks; docs/server.md). Cases (ctest
server.dist_NAME):
  success     a 2-rank job runs to success; the started event says world
              2, every step's metric arrives once, no engine or mpirun left.
  pause       pause reaches both ranks (checkpoint at the step they stopped
              at, paused, nothing left running), resume continues from it,
              cancel stops both ranks: cancelled, nothing left.
  rank_dies   SIGKILL to rank 1 alone: the whole job goes down (no orphan
              rank or mpirun), is requeued from its newest committed
              checkpoint (one restart counted) and runs to success.
  validation  more ranks than --cpu-slots, or a global batch the ranks do
              not divide: 400 naming resources.cpu_ranks; two nodes on the
              local executor: 400 naming resources.nodes; nothing queued.

TY_BIN, TY_FAKE_ENGINE and TY_ENGINE (trainyard-engine) name the binaries.
"""
import json
import os
import random
import signal

import tyharness as T
from tyharness import Server, check, engine_pids, run_tests, wait_for

REAL_ENGINE = os.environ.get("TY_ENGINE", "")


def server(grace=20):
    check(REAL_ENGINE and os.access(REAL_ENGINE, os.X_OK), "TY_ENGINE must name trainyard-engine")
    T.ENGINE = REAL_ENGINE
    srv = Server("--cpu-slots", "2", grace=grace)
    T._cleanup.append(lambda: T.kill_engines(srv.data_dir, (b"trainyard-engine", b"mpirun")))
    return srv


def running(srv):
    """Engines and launchers still alive in this server's data dir."""
    return engine_pids(srv.data_dir, b"trainyard-engine") + engine_pids(srv.data_dir, b"mpirun")


def dist_spec(srv, max_steps, every=2, **kw):
    path = os.path.join(srv.tmp, "train.jsonl")
    rng = random.Random(1)
    with open(path, "w") as f:
        for _ in range(64):
            a, d = rng.randrange(64), 1 + rng.randrange(7)
            f.write(json.dumps({"input_ids": [(a + t * d) % 64 for t in range(16)]}) + "\n")
    s = {"model": {"init": {"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 16,
                            "vocab_size": 64}},
         "dataset": {"train": path, "format": "tokens"},
         "hyperparameters": {"max_steps": max_steps, "batch_size": 2, "grad_accum": 2, "seq_len": 16, "lr": 1e-3,
                             "log_every_steps": 1},
         "resources": {"cpu_ranks": 2, "backend": "cpu"},
         "checkpoint": {"every_steps": every}}
    s.update(kw)
    return s


def step(srv, jid):
    return (srv.job(jid)["last_metric"] or {}).get("step", 0)


def rank_pid(srv, rank):
    for pid in engine_pids(srv.data_dir, b"trainyard-engine"):
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
        except OSError:
            continue
        if env.get(b"OMPI_COMM_WORLD_RANK") == str(rank).encode():
            return pid
    return None


def test_success():
    srv = server()
    jid = srv.submit(dist_spec(srv, 8))["id"]
    srv.wait_state(jid, "succeeded", 120)
    evs = srv.all_events(jid)
    job = srv.job(jid)
    check(job["engine"] and job["engine"].get("world") == 2, "engine info says world 2: %s" % job.get("engine"))
    metrics = [e[2]["data"]["step"] for e in evs if e[1] == "metric"]
    check(metrics == list(range(1, 9)), "each step's metric once: %s" % metrics)
    check(os.path.exists(os.path.join(srv.data_dir, "jobs", str(jid), "export", "model.safetensors")),
          "rank 0 wrote the export")
    wait_for(lambda: not running(srv), 20, "no engine or mpirun left")
    srv.stop()


def test_pause():
    srv = server()
    jid = srv.submit(dist_spec(srv, 100000, every=1000))["id"]
    srv.wait_state(jid, "running", 60)
    wait_for(lambda: step(srv, jid) >= 3, 60, "step 3")
    check(len(engine_pids(srv.data_dir, b"trainyard-engine")) == 2, "two ranks run")
    check(srv.post("/jobs/%d/pause" % jid).status == 202, "pause accepted")
    job = srv.wait_state(jid, "paused", 60)
    check(not running(srv), "pause stopped both ranks and mpirun: %s" % running(srv))
    last = step(srv, jid)
    if job["resume_from"] != "checkpoints/step-%06d" % last:
        print(open(os.path.join(srv.data_dir, "jobs", str(jid), "engine.log")).read()[-3000:])
        print(srv.log_text())
    check(job["resume_from"] == "checkpoints/step-%06d" % last,
          "paused at the checkpoint of the step both ranks stopped after (%d): %s" % (last, job["resume_from"]))
    check(srv.post("/jobs/%d/resume" % jid).status == 202, "resume accepted")
    srv.wait_state(jid, "running", 60)
    wait_for(lambda: step(srv, jid) >= last + 2, 60, "progress after resume")
    with srv.events(jid, from_=0) as s:
        evs = s.read_until_end(30, stop=lambda e: e[1] == "metric" and e[2]["data"]["step"] >= last + 2)
    starting = [e[2]["data"]["reason"] for e in evs if e[1] == "state" and e[2]["data"]["to"] == "starting"]
    check("resumed from step %d" % last in starting[-1], "resumed from the pause checkpoint: %r" % starting[-1])
    check(srv.post("/jobs/%d/cancel" % jid).status == 202, "cancel accepted")
    srv.wait_state(jid, "cancelled", 60)
    wait_for(lambda: not running(srv), 20, "cancel stopped both ranks and mpirun")
    srv.stop()


def test_rank_dies():
    srv = server()
    jid = srv.submit(dist_spec(srv, 150, every=2, max_restarts=1))["id"]
    srv.wait_state(jid, "running", 60)
    wait_for(lambda: step(srv, jid) >= 5, 60, "step 5")
    wait_for(lambda: rank_pid(srv, 1) is not None, 20, "rank 1's pid")
    pid = rank_pid(srv, 1)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: srv.job(jid)["restarts"] == 1, 60, "the job requeued with one restart")
    srv.wait_state(jid, "succeeded", 180)
    starting = [e for e in srv.all_events(jid) if e[1] == "state" and e[2]["data"]["to"] in ("queued", "starting")]
    reasons = " | ".join(e[2]["data"]["reason"] for e in starting)
    check("resumed from step" in reasons, "requeued from its newest checkpoint: %s" % reasons)
    wait_for(lambda: not running(srv), 20, "no orphan rank or mpirun")
    check(srv.job(jid)["restarts"] == 1, "one restart: %s" % srv.job(jid)["restarts"])
    srv.stop()


def test_validation():
    srv = server()
    n = len(srv.get("/jobs").json["jobs"])
    r = srv.submit(dist_spec(srv, 4, resources={"cpu_ranks": 3, "backend": "cpu"}), expect=400)
    r = r["error"]
    check(r["field"] == "resources.cpu_ranks" and "3 CPU ranks" in r["message"], "3 ranks on 2 slots: %s" % r)
    s = dist_spec(srv, 4)
    s["hyperparameters"].update(batch_size=3, grad_accum=1)
    r = srv.submit(s, expect=400)
    r = r["error"]
    check(r["field"] == "resources.cpu_ranks" and "divide" in r["message"], "batch 3 over 2 ranks: %s" % r)
    # The local executor runs every engine here: one node only.
    r = srv.submit(dist_spec(srv, 4, resources={"cpu_ranks": 1, "nodes": 2, "backend": "cpu"}), expect=400)
    r = r["error"]
    check(r["code"] == "invalid_spec" and r["field"] == "resources.nodes" and
          "--executor local" in r["message"], "2 nodes on the local executor: %s" % r)
    check(len(srv.get("/jobs").json["jobs"]) == n, "nothing queued")
    srv.stop()


if __name__ == "__main__":
    run_tests({"success": test_success, "pause": test_pause, "rank_dies": test_rank_dies,
               "validation": test_validation})
