#!/usr/bin/python3
"""test_slurm.py — the server's Slurm executor against a real one-node cluster
(items 4 and 5).

The cluster (munged, slurmctld, slurmd) is started by the ctest fixture
slurm.cluster_start (tests/slurm/cluster.sh) and reached through SLURM_CONF.
The server is the real `trainyard serve --executor slurm` and the engine the
real trainyard-engine on a tiny GPT-2 on the CPU, 2 data-parallel ranks per
job (resources.cpu_ranks: 2; srun --mpi=pmix forms their MPI world).

Cases (ctest slurm.NAME):
  refusals   --executor other than local/slurm, a relative --slurm-workdir,
             a --slurm-poll-ms out of range and a cluster sinfo cannot reach
             stop `serve` at start with the option or the cause named; a
             job sbatch refuses (no such partition; 2 nodes of a 1-node
             cluster) fails with its message; resources.nodes 2 on a local
             server is a 400 naming the field.
  lifecycle  a 2-rank job runs to success through sbatch/srun with every step's
             metric streamed from the events file and its checkpoints
             uploaded to a file:// store; a long job is paused
             (its Slurm job signalled, the final checkpoint recorded, Slurm
             done with it), resumed from that checkpoint, survives a kill -9
             and a graceful stop of the server (re-attached: same Slurm job,
             no second start),
             is requeued without a restart counted when its node goes down
             (NODE_FAIL), runs again once the node is back, and is
             cancelled (scancel; Slurm done with it).
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))

import tyharness as T  # noqa: E402
from tyharness import Server, check, run_tests, wait_for  # noqa: E402

REAL_ENGINE = os.environ.get("TY_ENGINE", "")
NODE = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()


def slurm(*args):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    check(r.returncode == 0, "%s: %s%s" % (" ".join(args), r.stdout, r.stderr))
    return r.stdout


def slurm_state(sid):
    """squeue's state of Slurm job sid ("" once it has been forgotten)."""
    out = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i|%T", "-j", str(sid)],
                         capture_output=True, text=True, timeout=30).stdout
    for line in out.splitlines():
        i, _, st = line.partition("|")
        if i == str(sid):
            return st
    return ""


def slurm_id(srv, jid):
    """The Slurm job of the job's current attempt (slurm.job in its directory)."""
    with open(os.path.join(srv.data_dir, "jobs", str(jid), "slurm.job")) as f:
        return int(f.read().split()[0])


def states_of(events):
    return [e[2]["data"]["to"] for e in events if e[1] == "state"]


def token_data(path, rows=64, seq=32, vocab=64):
    with open(path, "w") as f:
        for r in range(rows):
            a, d = r % vocab, 1 + r % 7
            f.write(json.dumps({"input_ids": [(a + t * d) % vocab for t in range(seq)]}) + "\n")
    return path


def spec(train, max_steps, every, log_every=1, ranks=2):
    return {"model": {"init": {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2,
                               "n_positions": 32, "vocab_size": 64, "layer_norm_epsilon": 1e-5}},
            "dataset": {"train": train, "format": "tokens"},
            "hyperparameters": {"max_steps": max_steps, "batch_size": 4, "seq_len": 32, "lr": 1e-3,
                                "log_every_steps": log_every},
            "resources": {"gpus": 0, "backend": "cpu", "cpu_ranks": ranks},
            "checkpoint": {"every_steps": every, "keep_last": 2},
            "max_restarts": 0}


def node_state():
    return slurm("sinfo", "-h", "-N", "-n", NODE, "-o", "%T").strip()


def test_lifecycle():
    check(REAL_ENGINE and os.access(REAL_ENGINE, os.X_OK), "TY_ENGINE must name trainyard-engine")
    check(os.environ.get("SLURM_CONF"), "SLURM_CONF must name the test cluster's slurm.conf")
    T.ENGINE = REAL_ENGINE
    srv = Server("--executor", "slurm", "--slurm-poll-ms", "200", "--event-rate", "0", grace=20)
    # Whatever happens, nothing of ours stays in the queue or on the node.
    T._cleanup.append(lambda: subprocess.run(["scontrol", "update", "nodename=" + NODE, "state=resume"],
                                             capture_output=True))
    T._cleanup.append(lambda: subprocess.run(["scancel", "--name=trainyard-1", "--name=trainyard-2"],
                                             capture_output=True))
    train = token_data(os.path.join(srv.tmp, "train.jsonl"))

    # ---- a job to success, every metric streamed back, its checkpoints
    # uploaded to a file:// store by the server as for a local job
    store = os.path.join(srv.tmp, "store")
    os.makedirs(store)
    sa_spec = spec(train, max_steps=12, every=6)
    sa_spec["checkpoint"]["store"] = "file://" + store
    a = srv.submit(sa_spec)["id"]
    ja = srv.wait_state(a, ["succeeded", "failed", "cancelled"], 90)
    check(ja["state"] == "succeeded", "job %d: %s (%s)" % (a, ja["state"], ja["error"]))
    evs = srv.all_events(a)
    steps = [e[2]["data"]["step"] for e in evs if e[1] == "metric"]
    check(steps == list(range(1, 13)), "job %d: metric steps %s" % (a, steps))
    check(ja["engine"]["world"] == 2, "job %d ran as one world of 2 ranks: %s" % (a, ja["engine"]))
    # With its final checkpoint's upload still running when the engines end,
    # the job waits for it in stopping (docs/server.md, "Job states").
    st = states_of(evs)
    check(st in (["queued", "starting", "running", "succeeded"],
                 ["queued", "starting", "running", "stopping", "succeeded"]), "job %d: %s" % (a, st))
    waits = [e[2]["data"]["reason"] for e in evs if e[1] == "state" and e[2]["data"]["to"] == "stopping"]
    check(all("waiting for its checkpoint uploads" in w for w in waits), "job %d: %s" % (a, waits))
    sa = slurm_id(srv, a)
    wait_for(lambda: slurm_state(sa) in ("COMPLETED", ""), 30, "Slurm job %d completed" % sa)
    cks = srv.get("/jobs/%d/checkpoints" % a).json["checkpoints"]
    final = [c for c in cks if c["step"] == 12]
    check(final and final[0]["state"] == "committed" and final[0]["remote_uri"],
          "job %d: final checkpoint recorded and uploaded: %s" % (a, cks))
    check(os.path.exists(os.path.join(store, "job-%d" % a, "checkpoints", "step-000012", "MANIFEST.json")),
          "job %d: the store holds the final checkpoint" % a)

    # ---- a long job: pause, resume
    b = srv.submit(spec(train, max_steps=100000, every=5, log_every=5))["id"]
    wait_for(lambda: (srv.job(b)["last_metric"] or {}).get("step", 0) >= 10, 90, "job %d past step 10" % b)
    s1 = slurm_id(srv, b)
    check(slurm_state(s1) == "RUNNING", "Slurm job %d: %s" % (s1, slurm_state(s1)))
    check(srv.post("/jobs/%d/pause" % b).status == 202, "pause")
    jb = srv.wait_state(b, ["paused", "failed", "cancelled", "queued"], 60)
    check(jb["state"] == "paused", "job %d pauses: %s (%s)" % (b, jb["state"], jb["error"]))
    check(jb["resume_from"], "paused job %d has a checkpoint to resume from" % b)
    paused_at = int(jb["resume_from"].rsplit("-", 1)[1])
    check(slurm_state(s1) in ("COMPLETED", ""), "Slurm job %d after pause: %s" % (s1, slurm_state(s1)))
    check(srv.post("/jobs/%d/resume" % b).status == 202, "resume")
    wait_for(lambda: (srv.job(b)["last_metric"] or {}).get("step", 0) > paused_at + 5, 90,
             "job %d trains past step %d again" % (b, paused_at))
    s2 = slurm_id(srv, b)
    check(s2 != s1, "resume submits a new Slurm job (%d, %d)" % (s1, s2))

    # ---- kill -9 of the server: the Slurm job is re-attached, not submitted again
    srv.kill9()
    srv.start()
    check(srv.job(b)["state"] == "running", "job %d after a server restart: %s" % (b, srv.job(b)["state"]))
    at = (srv.job(b)["last_metric"] or {}).get("step", 0)
    wait_for(lambda: (srv.job(b)["last_metric"] or {}).get("step", 0) > at + 5, 60,
             "job %d's metrics flow again after the restart" % b)
    check(slurm_id(srv, b) == s2, "the same Slurm job after a restart (%d, %d)" % (s2, slurm_id(srv, b)))
    check(slurm_state(s2) == "RUNNING", "Slurm job %d: %s" % (s2, slurm_state(s2)))
    # A graceful stop leaves it running in Slurm too; the next start re-attaches.
    srv.stop()
    check(slurm_state(s2) == "RUNNING", "Slurm job %d after a graceful stop: %s" % (s2, slurm_state(s2)))
    srv.start()
    check(srv.job(b)["state"] == "running", "job %d after a graceful restart: %s" % (b, srv.job(b)["state"]))
    at = (srv.job(b)["last_metric"] or {}).get("step", 0)
    wait_for(lambda: (srv.job(b)["last_metric"] or {}).get("step", 0) > at + 5, 60,
             "job %d's metrics flow again after the graceful restart" % b)
    check(slurm_id(srv, b) == s2, "the same Slurm job after a graceful restart")

    # ---- the node goes down: NODE_FAIL, requeued (no restart counted), runs again
    slurm("scontrol", "update", "nodename=" + NODE, "state=down", "reason=test")
    wait_for(lambda: srv.job(b)["state"] in ("queued", "starting"), 60, "job %d requeued after NODE_FAIL" % b)
    check(srv.job(b)["restarts"] == 0, "a lost node is not a restart: %s" % srv.job(b))
    check(slurm_state(s2) == "NODE_FAIL", "Slurm job %d: %s" % (s2, slurm_state(s2)))
    slurm("scontrol", "update", "nodename=" + NODE, "state=resume")
    wait_for(lambda: node_state() in ("idle", "mixed", "allocated"), 30, "node back")
    jb = srv.wait_state(b, ["running", "failed", "cancelled", "succeeded"], 90)
    check(jb["state"] == "running", "job %d runs again: %s (%s)" % (b, jb["state"], jb["error"]))
    s3 = slurm_id(srv, b)
    check(s3 not in (s1, s2), "the requeued job is a new Slurm job (%d)" % s3)

    # ---- cancel: scancel, cancelled, Slurm done with it
    at = (srv.job(b)["last_metric"] or {}).get("step", 0)
    wait_for(lambda: (srv.job(b)["last_metric"] or {}).get("step", 0) > at, 60, "job %d trains" % b)
    check(srv.post("/jobs/%d/cancel" % b).status == 202, "cancel")
    jb = srv.wait_state(b, ["cancelled", "failed", "paused", "succeeded"], 60)
    check(jb["state"] == "cancelled", "job %d cancels: %s (%s)" % (b, jb["state"], jb["error"]))
    wait_for(lambda: slurm_state(s3) in ("COMPLETED", "CANCELLED", ""), 30, "Slurm job %d over" % s3)
    evs = srv.all_events(b)
    st = states_of(evs)
    check(st.count("starting") == 3, "job %d started three times (submit, resume, requeue): %s" % (b, st))
    logs = " | ".join(e[2]["data"].get("line", "") for e in evs if e[1] == "log")
    check("resumed from step %d" % paused_at in logs, "job %d resumed from its checkpoint: %s" % (b, logs[-600:]))
    lost = [e[2]["data"] for e in evs if e[1] == "state" and "NODE_FAIL" in json.dumps(e[2]["data"])]
    check(lost and lost[0]["to"] == "queued", "job %d: the requeue names NODE_FAIL: %s" %
          (b, [e[2]["data"] for e in evs if e[1] == "state"]))
    # Every job's engine log is where the server writes it, from srun.
    with open(os.path.join(srv.data_dir, "jobs", str(b), "engine.log"), "rb") as f:
        check(f.read(), "job %d: engine.log is empty" % b)
    srv.stop()
    with open(srv.log_path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    for marker in ("runtime error:", "ERROR: AddressSanitizer"):
        i = text.find(marker)
        check(i < 0, "sanitizer report in the server log: %s" % text[max(0, i - 200):i + 800])


def serve_fails(env, *args):
    """`trainyard serve ARGS` with env: its exit status and output."""
    d = T.tmpdir()
    r = subprocess.run([os.environ["TY_BIN"], "serve", "--listen", "127.0.0.1:%d" % T.free_port(),
                        "--data-dir", os.path.join(d, "data")] + list(args),
                       capture_output=True, text=True, timeout=60, env=env)
    return r.returncode, r.stdout + r.stderr


def test_refusals():
    """Bad executor settings are refused at start with the option named."""
    env = dict(os.environ)
    rc, out = serve_fails(env, "--executor", "kubernetes")
    check(rc == 2 and "executor must be local or slurm" in out, "bad --executor: %d %s" % (rc, out))
    rc, out = serve_fails(env, "--executor", "slurm", "--slurm-workdir", "relative/path")
    check(rc == 2 and "slurm-workdir must be an absolute path" in out, "relative --slurm-workdir: %d %s" % (rc, out))
    rc, out = serve_fails(env, "--executor", "slurm", "--slurm-poll-ms", "5")
    check(rc == 2 and "slurm-poll-ms" in out, "--slurm-poll-ms 5: %d %s" % (rc, out))
    # No cluster to reach: a config that names no controller that answers.
    d = T.tmpdir()
    conf = os.path.join(d, "slurm.conf")
    with open(os.environ["SLURM_CONF"]) as f:
        text = f.read()
    port = T.free_port()
    with open(conf, "w") as f:
        f.write("".join(("SlurmctldPort=%d\n" % port) if l.startswith("SlurmctldPort=") else l + "\n"
                        for l in text.splitlines()))
    rc, out = serve_fails(dict(env, SLURM_CONF=conf), "--executor", "slurm")
    check(rc != 0 and "sinfo cannot reach the cluster" in out, "unreachable cluster: %d %s" % (rc, out))
    # A submission Slurm refuses fails the job with sbatch's own words.
    check(REAL_ENGINE and os.access(REAL_ENGINE, os.X_OK), "TY_ENGINE must name trainyard-engine")
    T.ENGINE = REAL_ENGINE
    srv = Server("--executor", "slurm", "--slurm-poll-ms", "200", "--slurm-partition", "nosuch")
    train = token_data(os.path.join(srv.tmp, "train.jsonl"))
    j = srv.submit(spec(train, max_steps=2, every=1, ranks=1))["id"]
    job = srv.wait_state(j, ["failed", "succeeded", "cancelled"], 60)
    check(job["state"] == "failed" and "sbatch failed" in (job["error"] or "") and
          "partition" in job["error"].lower(), "a refused sbatch fails the job: %s" % job)
    srv.stop()
    # resources.nodes reaches sbatch: two nodes of a one-node cluster is
    # refused by Slurm; a local server refuses any number above 1 at submit.
    srv = Server("--executor", "slurm", "--slurm-poll-ms", "200", roots=os.path.dirname(train))
    two = spec(train, max_steps=2, every=1, ranks=1)
    two["resources"]["nodes"] = 2
    j = srv.submit(two)["id"]
    job = srv.wait_state(j, ["failed", "succeeded", "cancelled"], 60)
    check(job["state"] == "failed" and "sbatch failed" in (job["error"] or "") and
          "node" in job["error"].lower(), "2 nodes of a 1-node cluster: %s" % job)
    check(job["spec"]["resources"]["nodes"] == 2, "the stored spec keeps resources.nodes: %s" % job["spec"])
    srv.stop()
    srv = Server(roots=os.path.dirname(train))
    r = srv.post("/jobs", two)
    check(r.status == 400 and r.json["error"]["field"] == "resources.nodes" and
          "--executor slurm" in r.json["error"]["message"], "nodes 2 on a local server: %r" % r)
    srv.stop()


if __name__ == "__main__":
    run_tests({"lifecycle": test_lifecycle, "refusals": test_refusals})
