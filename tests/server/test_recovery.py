#!/usr/bin/python3
"""test_recovery.py — restarts, crashes and full disks lose nothing.

Cases (ctest server.recovery_NAME):
  write_retry the requeue after an engine's death cannot be written (the
              database locked by another writer past the busy timeout): the
              API shows it queued meanwhile; it is logged and retried until
              it lands; the job is never a ghost.
  reconcile   before a resume: a vanished checkpoint is marked deleted, a
              partial and a corrupt directory are removed, an unknown
              complete one is adopted and resumed from. Fake engine.
  three_jobs  kill -9 the server with three running jobs (one engine deaf to
              SIGTERM, so recovery holds its window open for a grace
              period), restart, and cancel / pause / leave one each at once
              after /healthz answers: 202s, the requested end states, no
              orphan engine, no event lost; 20 times. Fake engine.
  exact       the real engine with keep_last 1: graceful SIGTERM of the
              server records the final checkpoint and requeues; kill -9
              mid-run; the job completes with no restart counted, its
              first start time, "resumed from step N", one metric row per
              step, and no checkpoint row pointing at a missing directory.
  chaos       the real engine, 50 SIGKILLs of the server or the engine at
              random moments (mid-checkpoint, mid-upload to a file:// store,
              mid-commit); every job completes with every step once, the
              event log replays without gap, duplicate or change, never two
              engines at once, no orphan, PRAGMA integrity_check ok.
  disk_full   the real engine on a small tmpfs: the job fails with the
              reason, no partial checkpoint stays, the server logs it and
              keeps answering; POST /jobs is 503 while the disk is full;
              DELETE works; a restart does not rerun it.

TY_BIN, TY_FAKE_ENGINE and TY_ENGINE (trainyard-engine) name the binaries.
"""
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import time

import tyharness as T
from tyharness import Server, check, engine_pids, fail, model_dir, run_tests, spec, tmpdir, wait_for

REAL_ENGINE = os.environ.get("TY_ENGINE", "")


# ---------------------------------------------------------------- helpers

def states_of(events):
    return [e[2]["data"]["to"] for e in events if e[1] == "state"]


def check_contiguous(events, what):
    ids = [e[0] for e in events]
    check(ids == list(range(1, len(ids) + 1)), "%s: event ids not 1..n without gap or duplicate: %s" % (what, ids))


def check_prefix(before, after, what):
    for b, a in zip(before, after):
        check(b[0] == a[0] and b[2] == a[2], "%s: committed event %s changed: %s" % (what, b, a))
    check(len(after) >= len(before), "%s: %d events before, only %d after" % (what, len(before), len(after)))


def real_engine_pids(data_dir):
    """Live (non-zombie) trainyard-engine processes working in data_dir."""
    return engine_pids(data_dir, b"trainyard-engine")


def kill_real_engines(data_dir):
    T.kill_engines(data_dir, (b"trainyard-engine",))


def real_server(*extra, data_dir=None, grace=5):
    check(REAL_ENGINE and os.access(REAL_ENGINE, os.X_OK), "TY_ENGINE must name trainyard-engine")
    T.ENGINE = REAL_ENGINE
    srv = Server(*extra, data_dir=data_dir, grace=grace)
    T._cleanup.append(lambda: kill_real_engines(srv.data_dir))
    return srv


def token_data(path, rows=64, seq=32, vocab=64, seed=1):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            a, d = rng.randrange(vocab), 1 + rng.randrange(7)
            f.write(json.dumps({"input_ids": [(a + t * d) % vocab for t in range(seq)]}) + "\n")
    return path


def real_spec(train, max_steps, every, keep_last, n_embd=32, n_layer=1, log_every=1, **kw):
    s = {"model": {"init": {"model_type": "gpt2", "n_layer": n_layer, "n_embd": n_embd, "n_head": 2,
                            "n_positions": 32, "vocab_size": 64, "layer_norm_epsilon": 1e-5}},
         "dataset": {"train": train, "format": "tokens"},
         "hyperparameters": {"max_steps": max_steps, "batch_size": 4, "seq_len": 32, "lr": 1e-3,
                             "log_every_steps": log_every},
         "resources": {"gpus": 0, "backend": "cpu"},
         "checkpoint": {"every_steps": every, "keep_last": keep_last},
         "max_restarts": 100}
    for k, v in kw.items():
        if isinstance(v, dict) and isinstance(s.get(k), dict):
            s[k].update(v)
        else:
            s[k] = v
    return s


def db_path(data_dir):
    return os.path.join(data_dir, "trainyard.db")


def db_rows(data_dir, sql, *args):
    con = sqlite3.connect("file:%s?mode=ro" % db_path(data_dir), uri=True, timeout=10)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def step_of(d):
    m = re.search(r"step-(\d+)$", d or "")
    return int(m.group(1)) if m else None


def check_checkpoints_true(srv, jid):
    """Every checkpoint listed as on disk is on disk, with its manifest."""
    r = srv.get("/jobs/%d/checkpoints" % jid)
    check(r.status == 200, "checkpoints of %d: %r" % (jid, r))
    jobdir = os.path.join(srv.data_dir, "jobs", str(jid))
    for c in r.json["checkpoints"]:
        if c["state"] in ("local", "failed"):
            check(os.path.exists(os.path.join(jobdir, c["dir"], "MANIFEST.json")),
                  "job %d: checkpoint %s listed %s but gone from disk" % (jid, c["dir"], c["state"]))
    root = os.path.join(jobdir, "checkpoints")
    for d in os.listdir(root) if os.path.isdir(root) else []:
        check(os.path.exists(os.path.join(root, d, "MANIFEST.json")),
              "job %d: partial checkpoint %s left on disk" % (jid, d))
    return r.json["checkpoints"]


def check_metrics_once(srv, jid, max_steps):
    r = srv.get("/jobs/%d/metrics" % jid)
    check(r.status == 200, "metrics: %r" % r)
    steps = [m["step"] for m in r.json["metrics"]]
    check(steps == list(range(1, max_steps + 1)),
          "job %d: metric rows are not each step once: %d rows, dups %s, missing %s" %
          (jid, len(steps), sorted({s for s in steps if steps.count(s) > 1})[:10],
           sorted(set(range(1, max_steps + 1)) - set(steps))[:10]))


def server_log(srv):
    """The whole server log (all starts), not just its tail."""
    with open(srv.log_path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def no_sanitizer_report(srv):
    with open(srv.log_path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    for marker in ("runtime error:", "ERROR: AddressSanitizer", "ERROR: LeakSanitizer"):
        i = text.find(marker)
        check(i < 0, "sanitizer report in the server log: %s" % text[max(0, i - 200):i + 800])


def integrity_ok(data_dir):
    rows = db_rows(data_dir, "PRAGMA integrity_check")
    check(rows == [("ok",)], "PRAGMA integrity_check: %s" % rows)


# ---------------------------------------------------------------- restarts lose nothing

def test_three_jobs():
    """kill -9 with three running jobs; cancel / pause / leave right after /healthz; 20 times."""
    srv = Server("--cpu-slots", "3", grace=4)
    train = os.path.join(srv.tmp, "train.jsonl")
    with open(train, "w") as f:
        f.write('{"text": "hello"}\n')
    fast = model_dir(srv.tmp, {"step_ms": 20, "checkpoint_every": 5, "resume_step_ms": 20}, "fast")
    # Slow to stop: after the kill it outlives the grace period, so recovery
    # (one wait for all groups) SIGKILLs it, and the cancel and pause of
    # the other two arrive while recovery has not reached them.
    deaf = model_dir(srv.tmp, {"step_ms": 20, "checkpoint_every": 5, "stop_delay_ms": 60000,
                               "resume_step_ms": 2}, "deaf")
    for it in range(20):
        a = srv.submit(spec(fast, train, max_steps=100000, name="cancel-%d" % it))["id"]
        b = srv.submit(spec(fast, train, max_steps=100000, name="pause-%d" % it))["id"]
        c = srv.submit(spec(deaf, train, max_steps=300, name="leave-%d" % it))["id"]
        for j in (a, b, c):
            wait_for(lambda j=j: (srv.job(j)["last_metric"] or {}).get("step", 0) >= 6, 30,
                     "job %d past its first checkpoint" % j)
        seen = {}
        for j in (a, b, c):
            with srv.events(j, from_=0) as s:
                seen[j] = s.read_until_end(30, stop=lambda e: e[1] == "metric")
        srv.kill9()
        srv.start()
        ra = srv.post("/jobs/%d/cancel" % a)
        rb = srv.post("/jobs/%d/pause" % b)
        check(ra.status == 202, "iteration %d: cancel right after restart: %r" % (it, ra))
        check(rb.status == 202, "iteration %d: pause right after restart: %r" % (it, rb))
        for j in (a, b, c):
            st = srv.job(j)["state"]
            check(st != "running" or j == c, "iteration %d: job %d reads running before recovery" % (it, j))
        ja = srv.wait_state(a, ["cancelled", "failed", "succeeded", "paused"], 60)
        jb = srv.wait_state(b, ["paused", "failed", "succeeded", "cancelled"], 60)
        jc = srv.wait_state(c, ["succeeded", "failed", "cancelled", "paused"], 90)
        check(ja["state"] == "cancelled", "iteration %d: cancel ends %s" % (it, ja["state"]))
        check(jb["state"] == "paused", "iteration %d: pause ends %s" % (it, jb["state"]))
        check(jc["state"] == "succeeded", "iteration %d: the job left alone ends %s (%s)" %
              (it, jc["state"], jc["error"]))
        for jj in (ja, jb, jc):
            check(jj["restarts"] == 0, "iteration %d: server restart counted as a restart: %s" % (it, jj))
            check(jj["progress"]["eta_s"] is None, "iteration %d: %s job has an ETA" % (it, jj["state"]))
        # Paused at its newest complete checkpoint, and progress says so.
        rf = jb["resume_from"]
        jobdir = os.path.join(srv.data_dir, "jobs", str(b))
        check(rf and os.path.exists(os.path.join(jobdir, rf, "MANIFEST.json")),
              "iteration %d: paused job resumes from a complete checkpoint: %r" % (it, rf))
        on_disk = [step_of(d) for d in os.listdir(os.path.join(jobdir, "checkpoints"))
                   if os.path.exists(os.path.join(jobdir, "checkpoints", d, "MANIFEST.json"))]
        check(step_of(rf) == max(on_disk), "iteration %d: paused at %s, newest on disk %s" % (it, rf, max(on_disk)))
        check(jb["progress"]["step"] == step_of(rf),
              "iteration %d: paused job says step %d, its checkpoint is %s" % (it, jb["progress"]["step"], rf))
        # The cancelled job never started an engine again.
        evs_a = srv.all_events(a)
        check(states_of(evs_a).count("starting") == 1,
              "iteration %d: cancelled job was started again: %s" % (it, states_of(evs_a)))
        for j, end in ((a, "cancelled"), (b, "paused"), (c, "succeeded")):
            with srv.events(j, from_=0) as s:
                evs = s.read_until_end(10, stop=lambda e, end=end: e[1] == "state" and e[2]["data"]["to"] == end)
            check_contiguous(evs, "iteration %d job %d" % (it, j))
            check_prefix(seen[j], evs, "iteration %d job %d" % (it, j))
        wait_for(lambda: not engine_pids(srv.data_dir), 15, "no engine left (iteration %d)" % it)
        check(srv.post("/jobs/%d/cancel" % b).status == 202, "cancel the paused job")
    check(srv.get("/healthz").status == 200, "server answers")
    srv.stop()
    no_sanitizer_report(srv)


# ---------------------------------------------------------------- failures are states

def test_write_retry():
    """A final transition that cannot be written is logged and retried until it lands."""
    srv = Server(grace=2)
    train = os.path.join(srv.tmp, "train.jsonl")
    with open(train, "w") as f:
        f.write('{"text": "hello"}\n')
    model = model_dir(srv.tmp, {"step_ms": 30, "checkpoint_every": 5, "resume_step_ms": 1})
    jid = srv.submit(spec(model, train, max_steps=2000))["id"]
    wait_for(lambda: (srv.job(jid)["last_metric"] or {}).get("step", 0) >= 6, 60, "step 6")
    # Another writer holds the database past the server's busy timeout
    # (5 s) when the engine dies: the requeue fails to write.
    con = sqlite3.connect(db_path(srv.data_dir), timeout=60, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    try:
        pids = engine_pids(srv.data_dir)
        check(len(pids) == 1, "one engine: %s" % pids)
        os.kill(pids[0], signal.SIGKILL)
        # Each write the scheduler tries waits out the busy timeout first:
        # allow several.
        wait_for(lambda: "cannot record queued" in server_log(srv), 120, "the failed write in the log")
        row = con.execute("SELECT state FROM jobs WHERE id = ?", (jid,)).fetchone()[0]
        check(row == "running", "nothing recorded while the database is locked: %s" % row)
        # The API shows the requeue meanwhile: never running without an engine.
        check(srv.job(jid)["state"] == "queued", "shown queued while the write is retried")
    finally:
        con.execute("ROLLBACK")
        con.close()
    job = srv.wait_state(jid, ["succeeded", "failed"], 120)
    check(job["state"] == "succeeded" and job["restarts"] == 1,
          "requeued once the database took writes, then finished: %s" % job)
    check("queued recorded after" in server_log(srv), "the retry is logged")
    check(srv.get("/healthz").status == 200, "server answers")
    srv.stop()
    no_sanitizer_report(srv)


# ---------------------------------------------------------------- disk vs. database

def test_reconcile():
    """Before a resume the job's checkpoint rows are made to match its directory."""
    srv = Server(grace=2)
    train = os.path.join(srv.tmp, "train.jsonl")
    with open(train, "w") as f:
        f.write('{"text": "hello"}\n')
    model = model_dir(srv.tmp, {"step_ms": 20, "checkpoint_every": 2, "resume_step_ms": 2})
    # 300 steps of 20 ms: the pause after step 9 lands well before the end
    # even on a loaded machine (60 steps could finish first).
    jid = srv.submit(spec(model, train, max_steps=300, checkpoint={"keep_last": 0}))["id"]
    wait_for(lambda: (srv.job(jid)["last_metric"] or {}).get("step", 0) >= 9, 30, "step 9")
    check(srv.post("/jobs/%d/pause" % jid).status == 202, "pause")
    job = srv.wait_state(jid, "paused", 30)
    # 17.3: a paused job is at its checkpoint's step and has no ETA.
    check(job["resume_from"] and job["progress"]["step"] == step_of(job["resume_from"]),
          "paused at %s but progress says step %d" % (job["resume_from"], job["progress"]["step"]))
    check(job["progress"]["eta_s"] is None, "a paused job has no ETA")
    root = os.path.join(srv.data_dir, "jobs", str(jid), "checkpoints")
    newest = max(step_of(d) for d in os.listdir(root))
    adopted = newest + 2
    # Odd steps past it: the resumed engine (checkpoint every 2) never writes them.
    partial = adopted + 1 if (adopted + 1) % 2 else adopted + 2
    corrupt = partial + 2
    # (a) a listed checkpoint whose directory is gone
    import shutil
    shutil.rmtree(os.path.join(root, "step-000002"))
    # (b) a partial write (no manifest)
    os.makedirs(os.path.join(root, "step-%06d" % (partial)))
    with open(os.path.join(root, "step-%06d" % (partial), "model.safetensors"), "wb") as f:
        f.write(b"half")
    # (c) a complete checkpoint the database never heard of (what an engine
    #     that outlived a killed server leaves): a copy renumbered
    src, dst = os.path.join(root, "step-%06d" % newest), os.path.join(root, "step-%06d" % adopted)
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "MANIFEST.json")) as f:
        man = json.load(f)
    man["step"] = adopted
    with open(os.path.join(dst, "MANIFEST.json"), "w") as f:
        json.dump(man, f)
    # (d) a manifest whose files do not match it
    bad = os.path.join(root, "step-%06d" % (corrupt))
    shutil.copytree(src, bad)
    with open(os.path.join(bad, "MANIFEST.json")) as f:
        man = json.load(f)
    man["step"] = corrupt
    with open(os.path.join(bad, "MANIFEST.json"), "w") as f:
        json.dump(man, f)
    with open(os.path.join(bad, "optimizer.safetensors"), "ab") as f:
        f.write(b"x")

    check(srv.post("/jobs/%d/resume" % jid).status == 202, "resume")
    job = srv.wait_state(jid, "succeeded", 60)
    evs = srv.all_events(jid)
    check_contiguous(evs, "reconciled job")
    started = [e[2]["data"] for e in evs if e[1] == "started"]
    check(started[-1].get("resumed_from_step") == adopted,
          "resumed from the adopted checkpoint %d: %s" % (adopted, started[-1]))
    starting = [e[2]["data"]["reason"] for e in evs if e[1] == "state" and e[2]["data"]["to"] == "starting"]
    check("resumed from step %d" % adopted in starting[-1], "start reason: %r" % starting[-1])
    logs = " | ".join(e[2]["data"]["line"] for e in evs if e[1] == "log")
    for what in ("step-000002 is gone from disk", "adopted checkpoints/step-%06d" % adopted,
                 "removed checkpoints/step-%06d: partial" % (partial),
                 "removed checkpoints/step-%06d: not a complete checkpoint" % (corrupt)):
        check(what in logs, "job log says %r: %s" % (what, logs[-2000:]))
    cks = {c["step"]: c for c in check_checkpoints_true(srv, jid)}
    check(cks[2]["state"] == "deleted", "the vanished checkpoint is marked deleted: %s" % cks[2])
    check(cks[adopted]["state"] == "local", "the adopted checkpoint is listed: %s" % cks.get(adopted))
    check(partial not in cks and corrupt not in cks, "no row for the partial or corrupt ones")
    check(not os.path.exists(bad) and not os.path.exists(os.path.join(root, "step-%06d" % (partial))),
          "partial and corrupt directories removed")
    check(job["progress"]["eta_s"] is None, "a finished job has no ETA")
    # One row per step; the renumbered copy stands for steps no engine ran.
    steps = [m["step"] for m in srv.get("/jobs/%d/metrics" % jid).json["metrics"]]
    check(steps == list(range(1, newest + 1)) + list(range(adopted + 1, 301)), "metric steps %s" % steps)
    srv.stop()
    no_sanitizer_report(srv)


# ---------------------------------------------------------------- the exact restart case

def test_exact():
    """keep_last 1 with the real engine through a graceful restart and a kill -9."""
    srv = real_server(grace=10)
    train = token_data(os.path.join(srv.tmp, "train.jsonl"))
    max_steps = 700
    jid = srv.submit(real_spec(train, max_steps, every=5, keep_last=1))["id"]
    srv.wait_state(jid, "running", 60)
    started_at = srv.job(jid)["started_at"]
    wait_for(lambda: (srv.job(jid)["last_metric"] or {}).get("step", 0) >= 40, 60, "step 40")
    with srv.events(jid, from_=0) as s:
        before = s.read_until_end(30, stop=lambda e: e[1] == "metric" and e[2]["data"]["step"] >= 40)

    # 1. Graceful SIGTERM: the server waits for the final checkpoint and records it.
    srv.stop()
    check(not real_engine_pids(srv.data_dir), "engine gone after a graceful shutdown")
    (state, resume_from, restarts), = db_rows(srv.data_dir, "SELECT state, resume_from, restarts FROM jobs "
                                                            "WHERE id = ?", jid)
    check(state == "queued" and restarts == 0, "after SIGTERM the job is requeued, no restart: %s %s" %
          (state, restarts))
    jobdir = os.path.join(srv.data_dir, "jobs", str(jid))
    check(resume_from and os.path.exists(os.path.join(jobdir, resume_from, "MANIFEST.json")),
          "resume_from %r is a complete checkpoint on disk" % resume_from)
    rows = db_rows(srv.data_dir, "SELECT state FROM checkpoints WHERE job_id = ? AND dir = ?", jid, resume_from)
    check(rows == [("local",)], "the final checkpoint is recorded: %s" % rows)
    last_metric = db_rows(srv.data_dir, "SELECT json_extract(last_metric, '$.step') FROM jobs WHERE id = ?",
                          jid)[0][0]
    check(step_of(resume_from) >= last_metric, "final checkpoint %s covers the last metric %s" %
          (resume_from, last_metric))

    # 2. Restart: resumes from it and says so.
    srv.start()
    srv.wait_state(jid, "running", 60)
    evs = srv.events(jid, from_=0)
    with evs as s:
        got = s.read_until_end(30, stop=lambda e: e[1] == "state" and e[2]["data"]["to"] == "running"
                               and e[0] > len(before))
    check_prefix(before, got, "graceful restart")
    starting = [e[2]["data"]["reason"] for e in got if e[1] == "state" and e[2]["data"]["to"] == "starting"]
    check("resumed from step %d" % step_of(resume_from) in starting[-1], "start reason: %r" % starting[-1])

    # 3. kill -9 mid-run: the engine dies with the server, writes its final
    #    checkpoint, and the next start adopts it from disk.
    first_ck = step_of(resume_from)
    wait_for(lambda: (srv.job(jid)["last_metric"] or {}).get("step", 0) >= first_ck + 30, 60, "progress")
    with srv.events(jid, from_=0) as s:
        before = s.read_until_end(30, stop=lambda e: e[1] == "metric" and e[2]["data"]["step"] >= first_ck + 30)
    srv.kill9()
    wait_for(lambda: not real_engine_pids(srv.data_dir), 20, "the engine to exit with the server")
    on_disk = [step_of(d) for d in os.listdir(os.path.join(jobdir, "checkpoints"))
               if os.path.exists(os.path.join(jobdir, "checkpoints", d, "MANIFEST.json"))]
    srv.start()
    job = srv.wait_state(jid, "succeeded", 120)
    after = srv.all_events(jid)
    check_contiguous(after, "recovered job")
    check_prefix(before, after, "kill -9 restart")
    starting = [e[2]["data"]["reason"] for e in after if e[1] == "state" and e[2]["data"]["to"] == "starting"]
    check("resumed from step %d" % max(on_disk) in starting[-1],
          "resumed from the newest checkpoint on disk (%d): %r" % (max(on_disk), starting[-1]))
    check(job["restarts"] == 0, "server restarts are not job restarts: %d" % job["restarts"])
    check(job["started_at"] == started_at, "first start time kept: %s vs %s" % (job["started_at"], started_at))
    check(job["progress"]["step"] == max_steps and job["progress"]["eta_s"] is None, "progress %s" % job["progress"])
    check_metrics_once(srv, jid, max_steps)
    cks = check_checkpoints_true(srv, jid)
    standing = [c for c in cks if c["state"] != "deleted"]
    check(len(standing) == 1 and standing[0]["step"] == max_steps, "keep_last 1 keeps the last: %s" % standing)
    check(len(os.listdir(os.path.join(jobdir, "checkpoints"))) == 1, "one checkpoint dir on disk")
    srv.stop()
    integrity_ok(srv.data_dir)
    no_sanitizer_report(srv)


# ---------------------------------------------------------------- kill anything

def test_chaos():
    """50 SIGKILLs of the server or the engine at random moments; nothing lost."""
    seed = int(os.environ.get("TY_CHAOS_SEED", "0")) or random.SystemRandom().randrange(1, 1 << 30)
    rng = random.Random(seed)
    print("chaos seed %d (TY_CHAOS_SEED=%d replays the choices)" % (seed, seed))
    srv = real_server(grace=5)
    store = os.path.join(srv.tmp, "store")
    os.makedirs(store)
    train = token_data(os.path.join(srv.tmp, "train.jsonl"))
    max_steps = 400
    jobs = []
    seen = {}

    def submit():
        ckpt = {"store": "file://" + store} if len(jobs) % 2 == 0 else {}
        jid = srv.submit(real_spec(train, max_steps, every=2, keep_last=2, checkpoint=ckpt))["id"]
        jobs.append(jid)
        return jid

    cur = submit()
    kills = {"server": 0, "engine": 0}
    it = 0
    while kills["server"] + kills["engine"] < 50:  # 50 kills; finished jobs are replaced
        it += 1
        check(it <= 500, "only %s kills in %d iterations" % (kills, it))
        time.sleep(rng.uniform(0.05, 0.6))
        job = srv.job(cur)
        if job["state"] in ("succeeded", "failed", "cancelled"):
            check(job["state"] == "succeeded", "job %d ended %s: %s" % (cur, job["state"], job["error"]))
            cur = submit()
            continue
        engines = real_engine_pids(srv.data_dir)
        check(len(engines) <= 1, "iteration %d: two engines at once: %s" % (it, engines))
        target = "engine" if engines and rng.random() < 0.4 else "server"
        kills[target] += 1
        if target == "engine":
            try:
                os.kill(engines[0], signal.SIGKILL)
            except OSError:
                pass
            continue
        # What the streams delivered before the kill was committed: it must
        # replay unchanged afterwards.
        with srv.events(cur, from_=0) as s:
            check(s.status == 200, "event stream of job %d: %s" % (cur, s.status))
            if s.conn.sock:
                s.conn.sock.settimeout(5)
            got = []
            try:
                while True:
                    ev = s.next()
                    if ev is None:
                        break
                    got.append(ev)
                    if len(got) >= 40 and rng.random() < 0.2:
                        break
            except OSError:
                pass
        seen[cur] = max(seen.get(cur, []), got, key=len)
        srv.kill9()
        srv.start()
    print("kills: %s, jobs %s" % (kills, jobs))
    for jid in jobs:
        job = srv.wait_state(jid, ["succeeded", "failed", "cancelled"], 180)
        check(job["state"] == "succeeded", "job %d ended %s: %s" % (jid, job["state"], job["error"]))
        check(job["progress"]["step"] == max_steps, "job %d at step %d" % (jid, job["progress"]["step"]))
        evs = srv.all_events(jid)
        check_contiguous(evs, "job %d" % jid)
        if jid in seen:
            check_prefix(seen[jid], evs, "job %d" % jid)
        check_metrics_once(srv, jid, max_steps)
        check_checkpoints_true(srv, jid)
    srv.stop()
    check(not real_engine_pids(srv.data_dir), "no orphan engine")
    integrity_ok(srv.data_dir)
    no_sanitizer_report(srv)
    # Committed remote checkpoints are complete.
    for (jid, d, uri) in db_rows(srv.data_dir, "SELECT job_id, dir, remote_uri FROM checkpoints "
                                               "WHERE state = 'committed'"):
        path = os.path.join(store, "job-%d" % jid, d, "MANIFEST.json")
        check(os.path.exists(path), "committed checkpoint %s of job %d has its manifest in the store" % (d, jid))


# ---------------------------------------------------------------- full disk

def test_disk_full():
    """A checkpoint that hits a full disk fails the job cleanly; submits are 503 while full."""
    if os.geteuid() != 0:
        print("skipped: mounting a tmpfs needs root")
        raise SystemExit(77)
    base = tmpdir("ty-diskfull-")
    mnt = os.path.join(base, "mnt")
    os.makedirs(mnt)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", mnt], capture_output=True)
    if r.returncode != 0:
        print("skipped: cannot mount a tmpfs: %s" % r.stderr.decode(errors="replace"))
        raise SystemExit(77)
    T._cleanup.append(lambda: subprocess.run(["umount", "-l", mnt], capture_output=True))
    data = os.path.join(mnt, "data")
    srv = real_server(data_dir=data, grace=5)
    train = token_data(os.path.join(srv.tmp, "train.jsonl"))
    # ~1.3 MB per checkpoint (weights + two moments), all kept: the third does not fit.
    jid = srv.submit(real_spec(train, 200, every=10, keep_last=0, n_embd=64, n_layer=2, log_every=10))["id"]
    job = srv.wait_state(jid, ["failed", "succeeded"], 120)
    check(job["state"] == "failed", "job on a full disk ends failed: %s" % job["state"])
    check(re.search(r"space", job["error"] or "", re.I), "the reason says the disk is full: %r" % job["error"])
    check(job["progress"]["eta_s"] is None, "failed job has no ETA")
    check_checkpoints_true(srv, jid)
    wait_for(lambda: "job %d failed" % jid in server_log(srv), 10, "the server log to name the failure")
    check(not real_engine_pids(srv.data_dir), "no engine left")
    check(srv.get("/healthz").status == 200, "server keeps answering")
    check(srv.post("/jobs/%d/cancel" % jid).status == 409, "cancel of a failed job is a plain conflict")

    # While the disk is full, submits are 503 with a JSON error, not 500.
    filler = os.path.join(mnt, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)
    r = srv.post("/jobs", real_spec(train, 10, every=5, keep_last=1))
    check(r.status == 503 and r.json["error"]["code"] == "disk_full", "submit on a full disk: %r" % r)
    os.unlink(filler)
    j2 = srv.submit(real_spec(train, 10, every=5, keep_last=1))["id"]
    check(srv.post("/jobs/%d/cancel" % j2).status == 202, "cancel the new job")
    srv.wait_state(j2, ["cancelled", "succeeded"], 60)

    # A restart does not rerun the failed job; DELETE works.
    srv.kill9()
    srv.start()
    check(srv.job(jid)["state"] == "failed", "still failed after a restart")
    check(srv.request("DELETE", "/jobs/%d" % jid).status == 204, "delete the failed job")
    check(not os.path.exists(os.path.join(data, "jobs", str(jid))), "its directory is gone")
    srv.stop()
    integrity_ok(data)
    no_sanitizer_report(srv)


TESTS = {"write_retry": test_write_retry, "reconcile": test_reconcile, "three_jobs": test_three_jobs, "exact": test_exact, "chaos": test_chaos, "disk_full": test_disk_full}

if __name__ == "__main__":
    run_tests(TESTS)
