#!/usr/bin/python3
"""test_server.py — integration tests of `trainyard serve`.

Each test starts the real daemon on a free port with a fresh data dir and
the fake engine (tests/fixtures), drives it over HTTP/SSE, and checks the
contract of DESIGN §2-§5 and docs/api.md; every response body and SSE event
is validated against openapi.yaml by tyharness. Run one test with
`test_server.py NAME` (ctest: server.NAME); TY_BIN and TY_FAKE_ENGINE name
the binaries.
"""
import hashlib
import json
import os
import re
import socket
import sqlite3
import subprocess
import threading
import time

from tyharness import (ROOT, SSE, TRAINYARD, Server, check, engine_pids, fail, free_port, is_terminal_event,
                       model_dir, openapi, run_tests, setup, spec, tmpdir, validate_named, wait_for)


def states_of(events):
    return [e[2]["data"]["to"] for e in events if e[1] == "state"]


def check_contiguous(events, what):
    ids = [e[0] for e in events]
    check(ids == list(range(1, len(ids) + 1)), "%s: event ids not 1..n without gap or duplicate: %s" % (what, ids))
    for e in events:
        check(e[0] == e[2]["seq"], "%s: SSE id %s != seq %s" % (what, e[0], e[2]["seq"]))


def metric_steps(events):
    return [e[2]["data"]["step"] for e in events if e[1] == "metric"]


# ---------------------------------------------------------------- lifecycle

def test_lifecycle():
    """submit -> running -> metrics over SSE -> succeeded, and every read endpoint."""
    srv, model, train = setup({"step_ms": 20, "checkpoint_every": 5})
    j = srv.submit(spec(model, train, max_steps=15, name="life", checkpoint={"keep_last": 0}))
    jid = j["id"]
    check(j["state"] in ("queued", "starting"), "new job state %s" % j["state"])
    check(j["name"] == "life" and j["spec"]["hyperparameters"]["max_steps"] == 15, "job echoes its spec")
    # docs/api.md: "spec": the submitted spec, defaults filled in (jobspec_to_json).
    hp = j["spec"]["hyperparameters"]
    check(hp.get("lr") == 0.0001 and hp.get("batch_size") == 1 and j["spec"].get("max_restarts") == 3,
          "the job's spec has its defaults filled in: %s" % j["spec"])
    with srv.events(jid, from_=0) as s:
        evs = s.read_until_end(60)
    check_contiguous(evs, "job stream")
    st = states_of(evs)
    check(st == ["queued", "starting", "running", "succeeded"], "state sequence %s" % st)
    check(is_terminal_event(evs[-1]), "stream ends after the terminal state event")
    check(metric_steps(evs) == list(range(1, 16)), "metric steps %s" % metric_steps(evs))
    cks = [e[2]["data"]["step"] for e in evs if e[1] == "checkpoint"]
    check(cks == [5, 10, 15], "checkpoint events %s" % cks)
    started = [e for e in evs if e[1] == "started"]
    check(len(started) == 1 and started[0][2]["data"]["params"] == 1100048, "started event %s" % started)

    job = srv.job(jid)
    check(job["state"] == "succeeded" and job["error"] is None, "final job %s" % job)
    check(job["progress"]["step"] == 15 and job["progress"]["fraction"] == 1, "progress %s" % job["progress"])
    check(job["last_metric"]["step"] == 15, "last_metric %s" % job["last_metric"])
    check(job["finished_at"] is not None and job["started_at"] is not None, "timestamps")
    check(job["queue_position"] is None, "queue_position of a finished job is null")

    m = srv.get("/jobs/%d/metrics" % jid).json["metrics"]
    check([r["step"] for r in m] == list(range(1, 16)), "metric rows %s" % [r["step"] for r in m])
    csv = srv.get("/jobs/%d/metrics?format=csv" % jid)
    check(csv.status == 200 and csv.headers.get("content-type", "").startswith("text/csv"), "csv %r" % csv)
    lines = csv.body.decode().strip().splitlines()
    check(lines[0].split(",")[:2] == ["step", "loss"] and len(lines) == 16, "csv lines %s" % lines[:2])

    cps = srv.get("/jobs/%d/checkpoints" % jid).json["checkpoints"]
    check([c["step"] for c in cps] == [5, 10, 15], "checkpoints %s" % cps)
    for c in cps:
        man = os.path.join(c["local_path"], "MANIFEST.json")
        with open(man, "rb") as f:
            check(hashlib.sha256(f.read()).hexdigest() == c["sha256"], "checkpoint sha256 is the manifest's")

    logs = srv.get("/jobs/%d/logs" % jid)
    check(logs.status == 200 and b"fake-engine: step 15" in logs.body, "logs %r" % logs.body[-200:])
    lst = srv.get("/jobs").json
    check([x["id"] for x in lst["jobs"]] == [jid] and lst["next_cursor"] is None, "list %s" % lst)
    check(srv.get("/jobs?state=succeeded").json["jobs"][0]["id"] == jid, "state filter")
    check(srv.get("/jobs?state=running").json["jobs"] == [], "state filter excludes")
    check(srv.get("/gpus").json == {"gpus": []}, "no GPUs with --gpus none")
    prom = srv.get("/metrics")
    check(prom.status == 200 and b"succeeded" in prom.body, "prometheus text %r" % prom.body[:200])
    spec_yaml = srv.get("/openapi.yaml")
    with open(os.path.join(ROOT, "openapi.yaml"), "rb") as f:
        check(spec_yaml.status == 200 and spec_yaml.body == f.read(), "/openapi.yaml serves the repository's file")
    check(srv.get("/").status == 200, "dashboard")
    d = srv.request("DELETE", "/jobs/%d" % jid)
    check(d.status == 204, "DELETE finished job %r" % d)
    check(srv.get("/jobs/%d" % jid).status == 404, "deleted job is gone")


def test_pagination():
    """Opaque cursors walk the whole list newest first without overlap."""
    srv, model, train = setup({"step_ms": 1})
    ids = [srv.submit(spec(model, train, max_steps=1))["id"] for _ in range(5)]
    seen, cursor = [], None
    while True:
        r = srv.get("/jobs?limit=2" + ("&cursor=" + cursor if cursor else "")).json
        check(len(r["jobs"]) <= 2, "limit respected")
        seen += [j["id"] for j in r["jobs"]]
        cursor = r["next_cursor"]
        if not cursor:
            break
    check(seen == sorted(ids, reverse=True), "pages %s vs %s" % (seen, ids))


def test_curl_pretty():
    """curl gets the JSON indented with a final newline; other clients the
    compact form (the stored spec copied in as text, the rest printed), with
    the same keys in the same order and the same values, for a job in each
    kind of state: queued, running, finished with checkpoints and tags."""
    srv, model, train = setup({"step_ms": 20}, "--cpu-slots", "1")
    done = srv.submit(spec(model, train, max_steps=4, checkpoint={"every_steps": 2},
                           tags=["a", "b"], hyperparameters={"lr": 0.003, "max_steps": 4}))["id"]
    srv.wait_state(done, "succeeded")
    run = srv.submit(spec(model, train, max_steps=3000))["id"]
    srv.wait_state(run, "running")
    queued = srv.submit(spec(model, train, max_steps=2))["id"]
    for jid in (done, run, queued):
        compact = srv.get("/jobs/%d" % jid)
        pretty = srv.request("GET", "/jobs/%d" % jid, headers={"User-Agent": "curl/8.5.0"})
        check(compact.body.count(b"\n") == 0, "compact for a library: %r" % compact.body[:80])
        check(pretty.body.startswith(b'{\n  "') and pretty.body.endswith(b"}\n"),
              "indented: %r" % pretty.body[:80])
        a = json.loads(pretty.body, object_pairs_hook=list)
        b = json.loads(compact.body, object_pairs_hook=list)
        if jid == run:  # the two reads are moments apart: drop what moves
            a, b = ([kv for kv in x if kv[0] not in ("progress", "last_metric", "updated_at",
                                                       "last_seq", "cost")] for x in (a, b))
        check(a == b, "job %d the same either way, in order:\n%s\n%s" % (jid, a, b))
    check(srv.get("/jobs/%d" % queued).json["queue_position"] == 1, "queued at 1")
    spec_text = srv.get("/jobs/%d" % done).body
    check(b'"lr":0.003,' in spec_text and b'"tags":["a","b"]' in spec_text,
          "shortest reals and tags in the compact body: %r" % spec_text[:400])
    srv.post("/jobs/%d/cancel" % run)
    srv.wait_state(run, "cancelled", 30)


# ---------------------------------------------------------------- control

def test_cancel():
    """Cancel while queued is immediate; while running it goes through stopping."""
    srv, model, train = setup({"step_ms": 50}, "--cpu-slots", "1")
    a = srv.submit(spec(model, train, max_steps=2000))["id"]
    srv.wait_state(a, "running")
    b = srv.submit(spec(model, train, max_steps=10))
    check(b["state"] == "queued" and b["queue_position"] == 1, "second job queued at 1: %s" % b)
    r = srv.post("/jobs/%d/cancel" % b["id"])
    check(r.status == 202 and r.json["state"] == "cancelled", "cancel queued: %r" % r)
    r = srv.post("/jobs/%d/cancel" % b["id"])
    check(r.status == 409 and r.json["error"]["code"] == "conflict", "cancel cancelled: %r" % r)
    pids = engine_pids(srv.data_dir)
    check(len(pids) == 1, "one engine runs: %s" % pids)
    r = srv.post("/jobs/%d/cancel" % a)
    check(r.status == 202 and r.json["state"] in ("stopping", "cancelled"), "cancel running: %r" % r)
    srv.wait_state(a, "cancelled", 30)
    evs = srv.all_events(a)
    check(states_of(evs)[-2:] == ["stopping", "cancelled"], "running cancel path %s" % states_of(evs))
    check(any(e[1] == "checkpoint" for e in evs), "the stopping engine checkpointed")
    wait_for(lambda: not engine_pids(srv.data_dir), 10, "the engine to exit")
    check(srv.job(b["id"])["state"] == "cancelled", "queued job stayed cancelled")


def test_pause_resume():
    """Pause checkpoints and stops; resume continues from that checkpoint."""
    srv, model, train = setup({"step_ms": 100, "resume_step_ms": 5})
    jid = srv.submit(spec(model, train, max_steps=300))["id"]
    wait_for(lambda: (srv.job(jid)["last_metric"] or {}).get("step", 0) >= 4, 60, "a few steps")
    r = srv.post("/jobs/%d/pause" % jid)
    check(r.status == 202 and r.json["state"] in ("stopping", "paused"), "pause: %r" % r)
    job = srv.wait_state(jid, "paused", 30)
    cps = srv.get("/jobs/%d/checkpoints" % jid).json["checkpoints"]
    check(cps, "a paused job has a checkpoint")
    ck = max(c["step"] for c in cps)
    check(job["resume_from"] and job["resume_from"].endswith("step-%06d" % ck),
          "resume_from %r names the newest checkpoint %d" % (job["resume_from"], ck))
    r = srv.post("/jobs/%d/pause" % jid)
    check(r.status == 409, "pause of a paused job is 409: %r" % r)
    r = srv.post("/jobs/%d/resume" % jid)
    check(r.status == 202 and r.json["state"] in ("queued", "starting", "running"), "resume: %r" % r)
    srv.wait_state(jid, "succeeded", 60)
    evs = srv.all_events(jid)
    check_contiguous(evs, "paused job")
    st = states_of(evs)
    check(st == ["queued", "starting", "running", "stopping", "paused", "queued", "starting", "running",
                 "succeeded"], "states %s" % st)
    started = [e[2]["data"] for e in evs if e[1] == "started"]
    check(len(started) == 2 and started[1].get("resumed_from_step") == ck,
          "second run resumed from step %d: %s" % (ck, started))
    paused_at = next(i for i, e in enumerate(evs) if e[1] == "state" and e[2]["data"]["to"] == "paused")
    second = metric_steps(evs[paused_at:])
    check(second and second[0] == ck + 1 and second[-1] == 300,
          "metrics after the resume continue from %d: %s" % (ck + 1, second))
    logs = [e[2]["data"]["line"] for e in evs if e[1] == "log"]
    check(any("resumed from step %d" % ck in l for l in logs), "engine log event names the resume step")


def test_crash_requeue():
    """An engine that dies is requeued from its checkpoint up to max_restarts, then failed."""
    srv, _, train = setup()
    always = model_dir(srv.tmp, {"step_ms": 10, "checkpoint_every": 2, "crash_at_step": 3}, "always")
    once = model_dir(srv.tmp, {"step_ms": 10, "checkpoint_every": 2, "crash_at_step": 3, "crash_times": 1}, "once")
    a = srv.submit(spec(always, train, max_steps=10, max_restarts=2))["id"]
    b = srv.submit(spec(once, train, max_steps=10))["id"]
    ja = srv.wait_state(a, "failed", 90)
    check(ja["restarts"] == 2, "restarts %d" % ja["restarts"])
    check(ja["error"] and "restart" in ja["error"], "failure reason names the restarts: %r" % ja["error"])
    sa = states_of(srv.all_events(a))
    check(sa.count("queued") == 3 and sa[-1] == "failed", "states %s" % sa)
    jb = srv.wait_state(b, "succeeded", 90)
    check(jb["restarts"] == 1 and jb["error"] is None, "requeued once then succeeded: %s" % jb)
    evs = srv.all_events(b)
    started = [e[2]["data"] for e in evs if e[1] == "started"]
    check(len(started) == 2 and started[1].get("resumed_from_step") == 2, "resumed from step 2: %s" % started)
    requeue = [e[2]["data"] for e in evs if e[1] == "state" and e[2]["data"]["from"] == "running"
               and e[2]["data"]["to"] == "queued"]
    check(len(requeue) == 1 and requeue[0].get("reason"), "requeue has a reason: %s" % requeue)

    # An engine's own error event is terminal: failed with its message, no requeue.
    err = model_dir(srv.tmp, {"step_ms": 10, "error_at_step": 3}, "error")
    c = srv.submit(spec(err, train, max_steps=10))["id"]
    jc = srv.wait_state(c, ["failed", "succeeded"], 60)
    check(jc["state"] == "failed" and jc["restarts"] == 0 and "injected error at step 3" in (jc["error"] or ""),
          "engine error event: %s / %r" % (jc["state"], jc["error"]))
    # Exit status 2 is a bad spec (DESIGN §5): failed at once, never requeued.
    bad = model_dir(srv.tmp, {"step_ms": 10, "exit_code": 2, "exit_at_step": 1}, "exit2")
    d = srv.submit(spec(bad, train, max_steps=10))["id"]
    jd = srv.wait_state(d, ["failed", "succeeded"], 60)
    check(jd["state"] == "failed" and jd["restarts"] == 0 and "spec" in (jd["error"] or ""),
          "engine exit 2: %s / %r" % (jd["state"], jd["error"]))


def test_sigterm_grace():
    """An engine that ignores SIGTERM (or hangs) is SIGKILLed after the grace period."""
    srv, _, train = setup(grace=2)
    deaf = model_dir(srv.tmp, {"step_ms": 50, "ignore_sigterm": True}, "deaf")
    jid = srv.submit(spec(deaf, train, max_steps=5000))["id"]
    srv.wait_state(jid, "running")
    wait_for(lambda: engine_pids(srv.data_dir), 10, "the engine process")
    t0 = time.monotonic()
    check(srv.post("/jobs/%d/cancel" % jid).status == 202, "cancel")
    time.sleep(1.0)
    check(engine_pids(srv.data_dir), "engine still alive inside the grace period")
    job = srv.wait_state(jid, ["cancelled", "failed"], 30)
    waited = time.monotonic() - t0
    check(job["state"] == "cancelled", "a cancelled job ends cancelled even when killed: %s" % job)
    check(waited >= 1.5, "killed only after the grace period (%.1fs)" % waited)
    wait_for(lambda: not engine_pids(srv.data_dir), 10, "the engine to be killed")

    hung = model_dir(srv.tmp, {"step_ms": 20, "hang_at_step": 3}, "hung")
    jid = srv.submit(spec(hung, train, max_steps=100))["id"]
    srv.wait_state(jid, "running")
    wait_for(lambda: (srv.job(jid)["last_metric"] or {}).get("step", 0) >= 2, 30, "step 2")
    check(srv.post("/jobs/%d/cancel" % jid).status == 202, "cancel hung")
    srv.wait_state(jid, "cancelled", 30)
    wait_for(lambda: not engine_pids(srv.data_dir), 10, "the hung engine to be killed")
    check(srv.get("/healthz").status == 200, "server still serves")


def test_kill9_recovery():
    """kill -9 of the server mid-run: the restarted server recovers the job, no committed event lost."""
    srv, model, train = setup({"step_ms": 60, "checkpoint_every": 5, "resume_step_ms": 5})
    jid = srv.submit(spec(model, train, max_steps=150))["id"]
    with srv.events(jid, from_=0) as s:
        before = s.read_until_end(60, stop=lambda e: e[1] == "metric" and e[2]["data"]["step"] >= 12)
    check(before[-1][1] == "metric", "got to step 12 before the kill")
    srv.kill9()
    wait_for(lambda: not engine_pids(srv.data_dir), 15, "the orphaned engine to exit with the server")
    srv.start()
    job = srv.wait_state(jid, "succeeded", 90)
    check(job["restarts"] == 0, "a server restart is not a restart of the job: %s" % job)
    after = srv.all_events(jid)
    check_contiguous(after, "recovered job")
    for b, a in zip(before, after):
        check(b[0] == a[0] and b[2] == a[2], "committed event %s changed after the restart: %s" % (b, a))
    st = states_of(after)
    check(st[:3] == ["queued", "starting", "running"] and st[-1] == "succeeded" and "queued" in st[3:],
          "requeued after restart: %s" % st)
    started = [e[2]["data"] for e in after if e[1] == "started"]
    check(len(started) == 2 and started[1].get("resumed_from_step", 0) >= 10,
          "second run resumed from a committed checkpoint: %s" % started)


# ---------------------------------------------------------------- SSE

def test_sse_replay():
    """Last-Event-ID (and ?from=) replay every event exactly once across a reconnect."""
    srv, model, train = setup({"step_ms": 30})
    jid = srv.submit(spec(model, train, max_steps=30))["id"]
    with srv.events(jid, from_=0) as s:
        first = [s.next() for _ in range(8)]
    check(all(first), "8 events before the disconnect")
    with srv.events(jid, last_event_id=first[-1][0]) as s:
        second = s.read_until_end(60)
    evs = first + second
    check_contiguous(evs, "across a Last-Event-ID reconnect")
    check(is_terminal_event(evs[-1]), "ends with the terminal state")
    full = srv.all_events(jid)
    check([e[2] for e in full] == [e[2] for e in evs], "replay equals what was streamed live")
    with srv.events(jid, from_=10) as s:
        tail = s.read_until_end(30)
    check([e[0] for e in tail] == list(range(11, len(full) + 1)), "?from=10 starts at 11")
    with srv.events(jid, last_event_id=len(full)) as s:
        check(s.read_until_end(10) == [], "nothing after the last event of a finished job")
    # The global feed carries this job's state events.
    with SSE(srv, "/events", from_=0) as g:
        got = g.read_until_end(30, stop=lambda e: e[1] == "state" and e[2]["job_id"] == jid
                               and e[2]["data"]["to"] == "succeeded")
    check([e[2]["data"]["to"] for e in got if e[1] == "state" and e[2]["job_id"] == jid] ==
          states_of(full), "global feed has the job's states")


def test_sse_fanout():
    """200 concurrent SSE clients on one job all receive every event."""
    srv, model, train = setup({"step_ms": 20}, "--cpu-slots", "1")
    blocker_model = model_dir(srv.tmp, {"step_ms": 50}, "blocker")
    blocker = srv.submit(spec(blocker_model, train, max_steps=5000))["id"]
    srv.wait_state(blocker, "running")
    jid = srv.submit(spec(model, train, max_steps=20))["id"]
    n = 200
    results, errors = [None] * n, []
    ready = threading.Barrier(n + 1, timeout=120)

    def client(i):
        try:
            with srv.events(jid, from_=0, timeout=120) as s:
                evs = [s.next()]  # the queued state event, replayed
                ready.wait()
                evs += s.read_until_end(120)
            results[i] = evs
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append("client %d: %r" % (i, e))
            try:
                ready.abort()
            except Exception:
                pass

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    ready.wait()  # every client is connected and caught up before the job starts
    check(srv.post("/jobs/%d/cancel" % blocker).status == 202, "cancel blocker")
    for t in threads:
        t.join(180)
    check(not errors, "clients failed: %s" % errors[:5])
    full = [e[2] for e in srv.all_events(jid)]
    check(len(full) > 20, "job has its events")
    for i, r in enumerate(results):
        check(r is not None and [e[2] for e in r] == full, "client %d got %d of %d events" %
              (i, len(r or []), len(full)))


def test_sse_heartbeat():
    """An idle stream gets a `: hb` comment every --heartbeat seconds."""
    srv, _, _ = setup(None, "--heartbeat", "1")
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        sock.sendall(b"GET /events HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n")
        buf, deadline = b"", time.monotonic() + 3.6
        while time.monotonic() < deadline:
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = sock.recv(4096)
            except socket.timeout:
                break
            if not chunk:
                break
            buf += chunk
    finally:
        sock.close()
    check(b" 200 " in buf.split(b"\r\n", 1)[0], "stream answered 200: %r" % buf[:80])
    hbs = buf.count(b": hb")
    check(2 <= hbs <= 5, "expected about 3 heartbeats in 3.6 s on an idle stream, got %d" % hbs)


def test_sse_slow_client():
    """A client that stops reading is dropped; a reading client on the same job misses nothing."""
    srv, _, train = setup(None, "--event-rate", "0")
    model = model_dir(srv.tmp, {"flood": True, "flood_events": 60000})
    # The job is queued behind nothing but starts only after both clients are
    # subscribed: hold the single CPU slot with a parked job first.
    parked = srv.submit(spec(model_dir(srv.tmp, {"step_ms": 50}, "parked"), train, max_steps=5000))["id"]
    srv.wait_state(parked, "running")
    jid = srv.submit(spec(model, train, max_steps=60000, max_restarts=0))["id"]
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", srv.port))
    slow.sendall(("GET /jobs/%d/events?from=0 HTTP/1.1\r\nHost: t\r\n\r\n" % jid).encode())
    got, reconnects = [], 0
    with srv.events(jid, from_=0, timeout=120) as fast:
        got.append(fast.next())  # subscribed and caught up
        wait_for(lambda: "trainyard_sse_clients 2" in srv.get("/metrics").body.decode(), 10,
                 "both clients subscribed")
        check(srv.post("/jobs/%d/cancel" % parked).status == 202, "cancel the parked job")
        got += fast.read_until_end(120)
    # A reader that falls behind the flood is dropped too; it comes back with
    # Last-Event-ID and, across reconnects, must see every event exactly once.
    while not is_terminal_event(got[-1]):
        reconnects += 1
        check(reconnects < 50, "a reconnecting reader never reached the end")
        with srv.events(jid, last_event_id=got[-1][0], timeout=120) as again:
            got += again.read_until_end(120)
    full = srv.all_events(jid)
    check([e[0] for e in got] == [e[0] for e in full],
          "the reading client got every event once, in order (%d of %d, %d reconnects)" %
          (len(got), len(full), reconnects))
    check(len(full) > 20000, "the flood produced enough events to overrun a client (%d)" % len(full))
    # The slow client's stream was cut: it ends (EOF) without the terminal state.
    slow.settimeout(30)
    data = b""
    while True:
        chunk = slow.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    slow.close()
    check(len(data) > 0, "the slow client got the start of its stream")
    check(b'"to":"succeeded"' not in data and b'"to":"failed"' not in data,
          "the slow client was dropped before the end of the job (%d bytes)" % len(data))
    wait_for(lambda: "trainyard_sse_clients 0" in srv.get("/metrics").body.decode(), 10,
             "no stream clients left")


# ---------------------------------------------------------------- bad input

def err_of(r):
    return r.json["error"]


def test_bad_input():
    """Each bad input gets its status and a JSON error naming the field, and changes nothing."""
    srv, model, train = setup({"step_ms": 1}, "--max-body", "4096")
    done = srv.submit(spec(model, train, max_steps=2))["id"]
    srv.wait_state(done, "succeeded")
    good = spec(model, train, max_steps=5)
    before = srv.db_counts()

    def bad(body, status, code, field=None, ctype="application/json", path="/jobs"):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = srv.request("POST", path, body=raw, headers={"Content-Type": ctype})
        check(r.status == status, "want %d for %r, got %r" % (status, raw[:120], r))
        e = err_of(r)
        check(e["code"] == code, "want code %s, got %s for %r" % (code, e, raw[:120]))
        if field is not None:
            check(e.get("field") == field, "want field %s, got %s (%s)" % (field, e.get("field"), e["message"]))
        return e

    def with_(path, value):
        s = json.loads(json.dumps(good))
        node = s
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        if value is KeyError:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
        return s

    e = bad(b'{"model": ', 400, "invalid_json")
    check(re.search(r"line \d+", e["message"]), "malformed JSON names the line: %s" % e["message"])
    bad(b'{"model": {"path": "/m\xff"}}', 400, "invalid_json")
    bad(json.dumps(with_("name", "x" * 5000)).encode(), 413, "too_large")
    bad(json.dumps(good).encode(), 415, "unsupported_media_type", ctype="text/plain")
    bad(with_("learning_rate", 0.1), 400, "invalid_spec", "learning_rate")
    bad(with_("hyperparameters.learning_rate", 0.1), 400, "invalid_spec", "hyperparameters.learning_rate")
    bad(with_("dataset.shuffle", True), 400, "invalid_spec", "dataset.shuffle")
    bad(with_("hyperparameters.max_steps", "10"), 400, "invalid_spec", "hyperparameters.max_steps")
    bad(with_("hyperparameters.lr", [1]), 400, "invalid_spec", "hyperparameters.lr")
    bad(with_("dataset.train", KeyError), 400, "invalid_spec", "dataset.train")
    bad(with_("hyperparameters.max_steps", KeyError), 400, "invalid_spec", "hyperparameters.max_steps")
    bad(with_("model", KeyError), 400, "invalid_spec", "model")
    bad(with_("hyperparameters.max_steps", 0), 400, "invalid_spec", "hyperparameters.max_steps")
    bad(with_("hyperparameters.max_steps", 10 ** 10), 400, "invalid_spec", "hyperparameters.max_steps")
    bad(with_("hyperparameters.batch_size", 0), 400, "invalid_spec", "hyperparameters.batch_size")
    bad(with_("hyperparameters.lr", 100), 400, "invalid_spec", "hyperparameters.lr")
    bad(with_("hyperparameters.lr", 0), 400, "invalid_spec", "hyperparameters.lr")
    bad(with_("model.path", "models/llama"), 400, "invalid_spec", "model.path")
    bad(with_("dataset.train", os.path.join(srv.tmp, "..", "etc", "passwd")), 400, "invalid_spec",
        "dataset.train")
    bad(with_("dataset.train", "/etc/passwd"), 400, "invalid_spec", "dataset.train")
    bad(with_("method", "dpo"), 400, "invalid_spec", "method")
    bad(b"[]", 400, "invalid_spec")

    def status(method, path, want, code):
        r = srv.request(method, path)
        check(r.status == want and err_of(r)["code"] == code, "%s %s: want %d %s, got %r" %
              (method, path, want, code, r))

    status("GET", "/jobs/99999", 404, "not_found")
    status("POST", "/jobs/99999/cancel", 404, "not_found")
    status("GET", "/jobs/99999/events", 404, "not_found")
    status("DELETE", "/jobs/99999", 404, "not_found")
    status("GET", "/nope", 404, "not_found")
    status("POST", "/jobs/%d/resume" % done, 409, "conflict")
    status("POST", "/jobs/%d/cancel" % done, 409, "conflict")
    status("POST", "/jobs/%d/pause" % done, 409, "conflict")
    r = srv.request("GET", "/jobs?limit=0")
    check(r.status == 400 and err_of(r).get("field") == "limit", "limit=0: %r" % r)
    r = srv.request("GET", "/jobs?state=bogus")
    check(r.status == 400 and err_of(r).get("field") == "state", "state=bogus: %r" % r)
    r = srv.request("GET", "/jobs?cursor=%%%%")
    check(r.status == 400 and err_of(r).get("field") == "cursor", "bad cursor: %r" % r)
    check(srv.db_counts() == before, "bad input changed the database: %s -> %s" % (before, srv.db_counts()))
    check(srv.submit(good)["id"] > done, "a good spec still goes through")


def test_engine_misbehaviour():
    """Garbage, over-long lines and floods on fd 3 fail the job with a reason; the server keeps serving."""
    srv, _, train = setup(None, "--event-rate", "2000", "--cpu-slots", "3")
    cases = {
        "garbage": ({"step_ms": 20, "garbage": True}, r"json|parse|garbage|invalid"),
        "long": ({"step_ms": 20, "long_line": True, "long_line_bytes": 200000}, r"long|line|bytes"),
        "flood": ({"flood": True}, r"flood|rate|events"),
    }
    ids = {}
    for name, (fx, _) in cases.items():
        ids[name] = srv.submit(spec(model_dir(srv.tmp, fx, name), train, max_steps=1000, max_restarts=0))["id"]
    for name, (fx, rx) in cases.items():
        job = srv.wait_state(ids[name], ["failed", "succeeded", "cancelled"], 60)
        check(job["state"] == "failed", "%s: engine misbehaviour must fail the job: %s" % (name, job["state"]))
        check(job["error"] and re.search(rx, job["error"], re.I), "%s: unclear reason %r" % (name, job["error"]))
        evs = srv.all_events(ids[name])
        check(states_of(evs)[-1] == "failed", "%s: terminal state event" % name)
    wait_for(lambda: not engine_pids(srv.data_dir), 15, "misbehaving engines to be gone")
    check(srv.get("/healthz").status == 200, "server still serves")
    ok = srv.submit(spec(model_dir(srv.tmp, {"step_ms": 5}, "fine"), train, max_steps=5))["id"]
    srv.wait_state(ok, "succeeded", 60)


def test_idempotency():
    """Same key + same body returns the first job; same key + other body is 409."""
    srv, model, train = setup({"step_ms": 5})
    body = spec(model, train, max_steps=3)
    k = {"Idempotency-Key": "retry-123"}
    a = srv.post("/jobs", body, headers=k)
    check(a.status == 201, "first submit %r" % a)
    counts = srv.db_counts()
    b = srv.post("/jobs", body, headers=k)
    check(b.status in (200, 201) and b.json["id"] == a.json["id"], "retry returns the first job: %r" % b)
    c = srv.post("/jobs", spec(model, train, max_steps=4), headers=k)
    check(c.status == 409 and err_of(c)["code"] == "idempotency_conflict", "other body: %r" % c)
    # The first job runs meanwhile and writes its own events, so the retries
    # are checked by the jobs table and by job a's history: one queued state.
    check(srv.db_counts()[0] == counts[0], "retries added a job: %s -> %s" % (counts, srv.db_counts()))
    srv.wait_state(a.json["id"], "succeeded", 60)
    queued = [s for s in states_of(srv.all_events(a.json["id"])) if s == "queued"]
    check(len(queued) == 1, "retries added state events to the first job: %s" % queued)
    d = srv.post("/jobs", body, headers={"Idempotency-Key": "other"})
    check(d.status == 201 and d.json["id"] != a.json["id"], "another key is another job")
    e = srv.post("/jobs", body)
    check(e.status == 201 and e.json["id"] not in (a.json["id"], d.json["id"]), "no key, new job")


def test_auth():
    """Tokens: created once, stored hashed; 401 without or with a wrong one under --require-token."""
    data = os.path.join(tmpdir(), "data")
    os.makedirs(data)
    out = subprocess.run([TRAINYARD, "token", "create", "ci", "--data-dir", data], capture_output=True,
                         text=True, timeout=60)
    check(out.returncode == 0, "token create: %s" % out.stderr)
    m = re.search(r"\bty_[0-9a-f]{64}\b", out.stdout)
    check(m, "token printed: %r" % out.stdout)
    token = m.group(0)
    srv = Server("--require-token", data_dir=data)
    r = srv.request("GET", "/jobs", token="")
    check(r.status == 401 and err_of(r)["code"] == "unauthorized", "no token: %r" % r)
    r = srv.request("GET", "/jobs", token="ty_" + "0" * 64)
    check(r.status == 401, "wrong token: %r" % r)
    r = srv.request("POST", "/jobs", body={"x": 1}, token="")
    check(r.status == 401, "POST without token: %r" % r)
    check(srv.request("GET", "/jobs", token=token).status == 200, "right token")
    check(srv.request("GET", "/healthz", token="").status == 200, "healthz is open")
    s = SSE(srv, "/events", token="")
    check(s.status == 401, "SSE without token: %d" % s.status)
    s.close()
    srv.stop()
    with open(srv.log_path, "rb") as f:
        check(token.encode() not in f.read(), "the token appears in the server log")
    dbs = [n for n in os.listdir(data) if n.endswith((".db", ".sqlite", ".sqlite3"))]
    con = sqlite3.connect(os.path.join(data, dbs[0]))
    dump = "\n".join(con.iterdump())
    con.close()
    check(token not in dump and hashlib.sha256(token.encode()).hexdigest() in dump,
          "the database keeps the SHA-256, never the token")


# ---------------------------------------------------------------- CLI

def cli(srv_or_url, *args, token=None, timeout=90):
    url = srv_or_url if isinstance(srv_or_url, str) else "http://127.0.0.1:%d" % srv_or_url.port
    env = dict(os.environ, TY_URL=url)
    env.pop("TY_TOKEN", None)
    if token:
        env["TY_TOKEN"] = token
    return subprocess.run([TRAINYARD] + list(args), capture_output=True, text=True, env=env, timeout=timeout)


def test_cli():
    """The client's commands and their documented exit codes (docs/cli.md)."""
    srv, model, train = setup({"step_ms": 20, "checkpoint_every": 5})
    path = os.path.join(srv.tmp, "spec.json")
    with open(path, "w") as f:
        json.dump(spec(model, train, max_steps=12, name="cli-job"), f)
    r = cli(srv, "submit", path)
    check(r.returncode == 0 and r.stdout.strip().isdigit(), "submit: %d %r %r" % (r.returncode, r.stdout, r.stderr))
    jid = int(r.stdout)
    r = cli(srv, "watch", str(jid))
    check(r.returncode == 0, "watch of a succeeding job exits 0: %d %s" % (r.returncode, r.stderr))
    check(re.search(r"step 12\b.*loss", r.stdout) and "succeeded" in r.stdout and "tokens/s" in r.stdout,
          "watch prints steps, loss, tokens/s and the end: %r" % r.stdout[-500:])
    r = cli(srv, "show", str(jid))
    check(r.returncode == 0 and json.loads(r.stdout)["state"] == "succeeded", "show")
    validate_named(json.loads(r.stdout), "Job")
    r = cli(srv, "jobs")
    check(r.returncode == 0 and re.search(r"^%d\s+succeeded\s+12/12" % jid, r.stdout, re.M), "jobs: %r" % r.stdout)
    r = cli(srv, "jobs", "--state", "running")
    check(r.returncode == 0 and str(jid) not in r.stdout.split("\n", 1)[1], "jobs --state filters")
    r = cli(srv, "logs", str(jid))
    check(r.returncode == 0 and "fake-engine: step 12" in r.stdout, "logs")
    check(cli(srv, "cancel", str(jid)).returncode == 4, "cancel of a finished job: conflict (4)")
    check(cli(srv, "show", "99999").returncode == 3, "unknown job: not found (3)")
    check(cli(srv, "show", "abc").returncode == 2, "bad id: usage (2)")
    # --top-p reaches the API as top_p (it once went out as temperature): 2 is outside top_p's (0, 1]
    r = cli(srv, "generate", str(jid), "hi", "--top-p", "2")
    check(r.returncode != 0 and "top_p" in r.stderr,
          "generate --top-p 2 is refused naming top_p: %r" % (r.stdout + r.stderr)[-300:])
    check(cli(srv, "frobnicate").returncode == 2, "unknown command: usage (2)")
    check(cli(srv, "submit", "/nonexistent.json").returncode == 2, "unreadable file: usage (2)")
    badp = os.path.join(srv.tmp, "bad.json")
    with open(badp, "w") as f:
        json.dump(spec(model, train, max_steps=0), f)
    r = cli(srv, "submit", badp)
    check(r.returncode == 6 and "hyperparameters.max_steps" in r.stderr, "invalid spec: rejected (6): %r" % r.stderr)
    check(cli("http://127.0.0.1:%d" % free_port(), "jobs").returncode == 5, "no server: cannot connect (5)")
    r1 = cli(srv, "submit", path, "--idempotency-key", "cli-k")
    r2 = cli(srv, "submit", path, "--idempotency-key", "cli-k")
    check(r1.returncode == 0 and r2.returncode == 0 and r1.stdout == r2.stdout, "idempotent CLI retry: %r %r" %
          (r1.stdout, r2.stdout))
    other = os.path.join(srv.tmp, "other.json")
    with open(other, "w") as f:
        json.dump(spec(model, train, max_steps=13), f)
    check(cli(srv, "submit", other, "--idempotency-key", "cli-k").returncode == 4,
          "same key, other body: conflict (4)")

    # pause / resume / cancel through the CLI, and watch's exit for a cancelled job
    slow = model_dir(srv.tmp, {"step_ms": 40}, "slow")
    with open(path, "w") as f:
        json.dump(spec(slow, train, max_steps=500), f)
    jid = int(cli(srv, "submit", path).stdout)
    srv.wait_state(jid, "running")
    check(cli(srv, "pause", str(jid)).returncode == 0, "pause")
    srv.wait_state(jid, "paused", 30)
    check(cli(srv, "resume", str(jid)).returncode == 0, "resume")
    srv.wait_state(jid, "running", 30)
    watcher = subprocess.Popen([TRAINYARD, "watch", str(jid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=dict(os.environ, TY_URL="http://127.0.0.1:%d" % srv.port))
    follower = subprocess.Popen([TRAINYARD, "logs", str(jid), "-f"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=dict(os.environ, TY_URL="http://127.0.0.1:%d" % srv.port))
    time.sleep(0.5)
    check(cli(srv, "cancel", str(jid)).returncode == 0, "cancel")
    try:
        rc = watcher.wait(60)
        logs_out, _ = follower.communicate(timeout=60)
    finally:
        for p in (watcher, follower):
            if p.poll() is None:
                p.kill()
    check(rc == 8, "watch of a cancelled job exits 8, got %d" % rc)
    check(follower.returncode == 0 and b"fake-engine: stopped at step" in logs_out,
          "logs -f follows until the job ends: %d %r" % (follower.returncode, logs_out[-300:]))

    failing = model_dir(srv.tmp, {"step_ms": 10, "error_at_step": 3}, "failing")
    with open(path, "w") as f:
        json.dump(spec(failing, train, max_steps=50, max_restarts=0), f)
    jid = int(cli(srv, "submit", path).stdout)
    r = cli(srv, "watch", str(jid))
    check(r.returncode == 1 and "failed" in r.stdout, "watch of a failing job exits 1: %d %r" %
          (r.returncode, r.stdout[-300:]))


def test_cli_watch():
    """watch shows a job's last 20 events then follows live; --all replays all."""
    srv, model, train = setup({"step_ms": 1})
    path = os.path.join(srv.tmp, "spec.json")
    with open(path, "w") as f:
        json.dump(spec(model, train, max_steps=3000, hyperparameters={"log_every_steps": 10},
                       checkpoint={"every_steps": 100000}), f)
    jid = int(cli(srv, "submit", path).stdout)
    srv.wait_state(jid, "succeeded", 120)
    every = srv.all_events(jid)
    # Read again once the stream has ended: the API shows a settling job
    # in its final state just before the state event is written (the
    # overlay), so the first read's last_seq may lack that event.
    j = srv.job(jid)
    check(j["last_seq"] > 300, "a long history: last_seq %d" % j["last_seq"])
    check(every[-1][0] == j["last_seq"],
          "last_seq %d is the newest event's seq: %r" % (j["last_seq"], every[-1]))

    r = cli(srv, "watch", str(jid))
    lines = r.stdout.splitlines()
    steps = [int(m.group(1)) for m in (re.match(r"step +(\d+)/3000 ", x) for x in lines) if m]
    check(r.returncode == 0 and lines[-1].startswith("Job %d succeeded" % jid), "watch ends succeeded: %r" % lines[-3:])
    check(len(lines) <= 20 and steps and steps[0] > 2700 and steps[-1] == 3000,
          "watch shows only the last events: %d lines, steps %s" % (len(lines), steps[:3]))
    check("--all replays them" in r.stderr and str(j["last_seq"] - 20) in r.stderr,
          "watch says how many it left out: %r" % r.stderr)

    r = cli(srv, "watch", str(jid), "--all")
    lines = r.stdout.splitlines()
    check(r.returncode == 0 and lines[0] == "Job %d was submitted and is queued." % jid,
          "watch --all starts at the start: %r" % lines[:2])
    # Every 10th step and the first.
    check(len([x for x in lines if x.startswith("step ")]) == 301 and not r.stderr,
          "watch --all prints every metric: %d lines" % len(lines))
    check(cli(srv, "show", str(jid), "--all").returncode == 2, "--all is watch's alone")

    # A running job deep into its steps: the tail, then live steps after it.
    slow = model_dir(srv.tmp, {"step_ms": 20}, "slow")
    with open(path, "w") as f:
        json.dump(spec(slow, train, max_steps=100000, checkpoint={"every_steps": 100000}), f)
    jid = int(cli(srv, "submit", path).stdout)
    wait_for(lambda: srv.job(jid)["progress"]["step"] >= 150, 60, "job %d past step 150" % jid)
    at = srv.job(jid)["progress"]["step"]
    watcher = subprocess.Popen([TRAINYARD, "watch", str(jid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=dict(os.environ, TY_URL="http://127.0.0.1:%d" % srv.port))
    seen = []
    try:
        while len(seen) < 60:
            line = watcher.stdout.readline()
            m = re.match(r"step +(\d+)/100000 ", line)
            check(line, "watch ended early: %r" % seen[-3:])
            if m:
                seen.append(int(m.group(1)))
        check(cli(srv, "cancel", str(jid)).returncode == 0, "cancel")
        rc = watcher.wait(60)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    check(seen[0] >= at - 25, "the tail starts near step %d, not at %d" % (at, seen[0]))
    check(seen == list(range(seen[0], seen[0] + len(seen))), "then every step once, live: %s" % seen[:5])
    check(seen[-1] > at + 20 and rc == 8, "it followed live past step %d to %d; exit %d" % (at, seen[-1], rc))


def test_cli_auth():
    data = os.path.join(tmpdir(), "data")
    os.makedirs(data)
    tok = re.search(r"ty_[0-9a-f]{64}", subprocess.run([TRAINYARD, "token", "create", "c", "--data-dir", data],
                                                       capture_output=True, text=True).stdout).group(0)
    srv = Server("--require-token", data_dir=data)
    check(cli(srv, "jobs").returncode == 7, "no token: unauthorized (7)")
    check(cli(srv, "jobs", token="ty_" + "1" * 64).returncode == 7, "wrong token: unauthorized (7)")
    check(cli(srv, "jobs", token=tok).returncode == 0, "token from TY_TOKEN")


# ---------------------------------------------------------------- the spec

def test_cost():
    """cost: null without a price; with one it grows while running, stops while paused, is fixed at the end."""
    t0 = time.monotonic()
    bare, model0, train0 = setup({"step_ms": 50})
    j = bare.submit(spec(model0, train0, max_steps=20))
    check(j["cost"] is None, "no price configured: cost is null, got %r" % j["cost"])
    bare.post("/jobs/%d/cancel" % j["id"])
    # 3600 per CPU-hour: one second of running time costs 1.0.
    srv, model, train = setup({"step_ms": 50}, "--cpu-hour-price", "3600", "--currency", "EUR")
    jid = srv.submit(spec(model, train, max_steps=20))["id"]
    wait_for(lambda: (srv.job(jid)["last_metric"] or {}).get("step", 0) >= 2, 60, "a few steps")
    a = srv.job(jid)["cost"]
    check(a is not None and a["currency"] == "EUR" and a["gpu_hours"] == 0, "cost of a CPU job: %r" % a)
    time.sleep(0.3)
    b = srv.job(jid)
    check(b["state"] != "running" or b["cost"]["amount"] > a["amount"],
          "cost grows while running: %r then %r" % (a, b["cost"]))
    srv.wait_state(jid, "succeeded", 60)
    c = srv.job(jid)["cost"]
    time.sleep(0.3)
    d = srv.job(jid)["cost"]
    check(c == d, "a finished job's cost is fixed: %r then %r" % (c, d))
    wall = time.monotonic() - t0
    check(0.3 < c["amount"] < wall, "cost %r of ~1 s of running, test wall time %.1f s" % (c, wall))
    check(abs(c["cpu_hours"] * 3600 - c["amount"]) < 1e-6, "amount = cpu_hours x price: %r" % c)
    # Paused: the running time, and so the cost, stands still.
    srv2, model2, train2 = setup({"step_ms": 100}, "--cpu-hour-price", "3600")
    pid = srv2.submit(spec(model2, train2, max_steps=300))["id"]
    wait_for(lambda: (srv2.job(pid)["last_metric"] or {}).get("step", 0) >= 2, 60, "a few steps")
    check(srv2.post("/jobs/%d/pause" % pid).status == 202, "pause accepted")
    p1 = srv2.wait_state(pid, "paused", 30)["cost"]
    check(p1["amount"] > 0 and p1["currency"] == "USD", "a paused job keeps what it cost: %r" % p1)
    time.sleep(1.0)
    p2 = srv2.job(pid)["cost"]
    check(p2 == p1, "cost does not grow while paused: %r then %r" % (p1, p2))


def test_routes_match():
    """`trainyard routes` and openapi.yaml's paths+methods are the same set."""
    out = subprocess.run([TRAINYARD, "routes"], capture_output=True, text=True, timeout=30)
    check(out.returncode == 0, "trainyard routes: %s" % out.stderr)
    routes = set()
    for line in out.stdout.splitlines():
        if line.strip():
            m, p = line.split()[:2]
            routes.add((m.upper(), p))
    spec_routes = set()
    for p, item in openapi()["paths"].items():
        for m in item:
            if m in ("get", "put", "post", "delete", "patch", "head", "options"):
                spec_routes.add((m.upper(), p))
    check(routes == spec_routes, "router vs openapi.yaml:\n  only in the router: %s\n  only in the spec: %s" %
          (sorted(routes - spec_routes), sorted(spec_routes - routes)))


TESTS = {n[5:]: f for n, f in globals().items() if n.startswith("test_") and callable(f)}

if __name__ == "__main__":
    run_tests(TESTS)
