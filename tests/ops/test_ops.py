"""test_ops.py — the operations features against the real daemon and the fake
engine: budgets (a limit reached checkpoints and stops the job, succeeded
with stop_reason budget), stalls (an engine stopped with SIGSTOP, one that
loops without progress, the default from the step time) and idle GPUs
(injected utilisation), GET /queue and PATCH /jobs/{id} with tags, usage
(JSON, CSV, Prometheus), and signed webhooks from a durable outbox with a
receiver that fails and recovers, across a server restart. Every answer is
validated against openapi.yaml (tests/server/tyharness.py).
"""
import hashlib
import hmac
import http.server
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "server"))
from tyharness import (TRAINYARD, check, engine_pids, model_dir, run_tests, setup, spec,  # noqa: E402
                       wait_for, _cleanup)


def events_of(srv, jid):
    with srv.events(jid, from_=0) as s:
        return s.read_until_end(30)


def typed(evs, t):
    return [e[2]["data"] for e in evs if e[1] == t]


def wait_event(srv, jid, pred, timeout=30, what="an event"):
    """Reads the job's stream from the start until pred(type, data) holds."""
    with srv.events(jid, from_=0) as s:
        s.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ev = s.next()
            check(ev is not None, "stream of job %d ended before %s" % (jid, what))
            if pred(ev[1], ev[2]["data"]):
                return ev[2]["data"]
    raise AssertionError("no %s within %ds" % (what, timeout))


def cli(srv, *args, token=None):
    env = dict(os.environ, TY_URL="http://127.0.0.1:%d" % srv.port)
    if token or srv.token:
        env["TY_TOKEN"] = token or srv.token
    return subprocess.run([TRAINYARD] + list(args), env=env, capture_output=True, text=True, timeout=60)


# ---------------------------------------------------------------- 1. budgets

def test_budget():
    srv, model, train = setup({"step_ms": 40}, "--cpu-hour-price", "3600", "--cpu-slots", "3",
                              "--max-runtime-cap", "100")
    a = srv.submit(spec(model, train, 100000, limits={"max_runtime_s": 2}))["id"]
    b = srv.submit(spec(model, train, 100000, limits={"max_tokens": 2560}))["id"]
    c = srv.submit(spec(model, train, 100000, limits={"max_cost": 1.5, "max_runtime_s": 50}))["id"]
    for jid, limit in ((a, "max_runtime_s"), (b, "max_tokens"), (c, "max_cost")):
        j = srv.wait_state(jid, ["succeeded", "failed", "cancelled"], timeout=60)
        check(j["state"] == "succeeded" and j["stop_reason"] == "budget",
              "job %d: want succeeded/budget, got %s/%s (%s)" % (jid, j["state"], j["stop_reason"], j["error"]))
        check(j["progress"]["step"] < 100000, "job %d ran to the end" % jid)
        evs = events_of(srv, jid)
        budget = typed(evs, "budget")
        check(len(budget) == 1 and budget[0]["limit"] == limit and budget[0]["used"] >= budget[0]["value"],
              "job %d budget events: %r" % (jid, budget))
        moves = [(d["from"], d["to"]) for d in typed(evs, "state")]
        check(("running", "stopping") in moves and ("stopping", "succeeded") in moves, "moves %r" % moves)
        stop = [d for d in typed(evs, "state") if d["to"] == "stopping"][0]
        check(limit in stop["reason"], "stopping reason %r" % stop["reason"])
        # Stopped gracefully: the engine wrote its final checkpoint.
        ck = srv.get("/jobs/%d/checkpoints" % jid).json["checkpoints"]
        check(ck and ck[-1]["step"] == j["progress"]["step"], "final checkpoint %r vs %r" % (ck, j["progress"]))
    ja, jb, jc = srv.job(a), srv.job(b), srv.job(c)
    check(ja["cost"]["cpu_hours"] * 3600 >= 2, "runtime job ran %r" % ja["cost"])
    check(jb["last_metric"]["tokens"] >= 2560, "tokens %r" % jb["last_metric"])
    check(jc["cost"]["amount"] >= 1.5, "cost %r" % jc["cost"])
    # The server's cap is the default of a spec without a runtime limit.
    d = srv.submit(spec(model, train, 3))
    check(d["spec"]["limits"]["max_runtime_s"] == 100 and d["spec"]["limits"]["on_stall"] == "warn",
          "defaults %r" % d["spec"]["limits"])
    srv.wait_state(d["id"], "succeeded")
    check(srv.job(d["id"])["stop_reason"] is None, "a job that finished has no stop_reason")


def test_budget_restart():
    # The server is killed while a job stops at its limit (its engine is
    # slow to stop): the next start ends it succeeded, stop_reason budget.
    srv, model, train = setup({"step_ms": 30, "stop_delay_ms": 3000}, grace=10)
    jid = srv.submit(spec(model, train, 100000, limits={"max_runtime_s": 1}))["id"]
    wait_event(srv, jid, lambda t, d: t == "state" and d["to"] == "stopping", timeout=60,
               what="the stop at the limit")
    st = srv.job(jid)
    check(st["state"] == "stopping", "the engine stopped before the kill: %r" % {k: st[k] for k in ("state", "stop_reason", "error")})
    srv.kill9()
    srv.start()
    j = srv.wait_state(jid, ["succeeded", "failed", "cancelled", "paused", "queued"], timeout=60)
    check(j["state"] == "succeeded" and j["stop_reason"] == "budget", "%s / %s / %s" %
          (j["state"], j["stop_reason"], j["error"]))
    wait_for(lambda: not engine_pids(srv.data_dir), 30, "the old engine to finish its checkpoint")


def test_budget_refused():
    srv, model, train = setup(None, "--max-cost-cap", "10", "--max-tokens-cap", "1000")
    for lim, field in (({"max_cost": 5}, "limits.max_cost"),           # no CPU price here
                       ({"max_tokens": 5000}, "limits.max_tokens"),    # over the cap
                       ({"max_runtime_s": 0}, "limits.max_runtime_s"),
                       ({"on_stall": "panic"}, "limits.on_stall"),
                       ({"stall_after_s": -1}, "limits.stall_after_s"),
                       ({"bogus": 1}, "limits.bogus")):
        e = srv.submit(spec(model, train, 3, limits=lim), expect=400)["error"]
        check(e["field"] == field, "%r: %r" % (lim, e))
    e = srv.submit(spec(model, train, 3, tags=["ok", "no spaces"]), expect=400)["error"]
    check(e["field"] == "tags[1]", "tags: %r" % e)
    e = srv.submit(spec(model, train, 3, tags=["x", "x"]), expect=400)["error"]
    check(e["field"] == "tags[1]" and "duplicate" in e["message"], "dup tags: %r" % e)
    check(srv.get("/jobs").json["jobs"] == [], "a refused job was stored")


def test_gpu_price():
    # One GPU named "GPU 0" (no NVML): its model price wins over --gpu-hour-price.
    srv, model, train = setup({"step_ms": 30}, "--gpus", "0", "--gpu-hour-price", "1",
                              "--gpu-hour-prices", "A100=2,GPU 0=7200")
    jid = srv.submit(spec(model, train, 20, resources={"gpus": 1}))["id"]
    j = srv.wait_state(jid, "succeeded")
    cost = j["cost"]
    check(cost["gpu_hours"] > 0 and abs(cost["amount"] / cost["gpu_hours"] - 7200) < 1e-6,
          "per-model price: %r" % cost)


def test_budget_progress():
    # Reporting every 1000 steps, a budget stop checkpoints far past the
    # last metric: the finished job's progress is its checkpoint's step.
    srv, model, train = setup({"step_ms": 20})
    jid = srv.submit(spec(model, train, 100000, hyperparameters={"log_every_steps": 1000},
                          limits={"max_runtime_s": 1}))["id"]
    j = srv.wait_state(jid, "succeeded", timeout=60)
    ck = srv.get("/jobs/%d/checkpoints" % jid).json["checkpoints"]
    newest = max(c["step"] for c in ck)
    check(newest > 1 and j["progress"]["step"] == newest,
          "progress %r, newest checkpoint step %d" % (j["progress"], newest))


# ---------------------------------------------------------------- 2. stalls, idle GPUs

def test_stall_sigstop():
    srv, model, train = setup({"step_ms": 30}, grace=2)
    s = spec(model, train, 150, checkpoint={"every_steps": 20}, limits={"stall_after_s": 2, "on_stall": "restart"})
    jid = srv.submit(s)["id"]
    wait_for(lambda: srv.job(jid)["progress"]["step"] >= 30, 30, "30 steps")
    pids = engine_pids(srv.data_dir)
    check(len(pids) == 1, "one engine: %r" % pids)
    os.kill(pids[0], signal.SIGSTOP)
    stall = wait_event(srv, jid, lambda t, d: t == "stall", what="a stall event")
    check(stall["action"] == "restart" and stall["stall_after_s"] == 2 and stall["silent_s"] >= 2, "%r" % stall)
    j = srv.wait_state(jid, ["succeeded", "failed"], timeout=60)
    check(j["state"] == "succeeded" and j["restarts"] == 1, "after the restart: %s, %d restarts (%s)" %
          (j["state"], j["restarts"], j["error"]))
    moves = [d for d in typed(events_of(srv, jid), "state") if d["to"] == "queued" and d["from"] != None]
    check(moves and "stalled" in moves[0]["reason"] and "restart 1 of 3" in moves[0]["reason"], "%r" % moves)
    check(not engine_pids(srv.data_dir), "the stopped engine is gone")


def test_cancel_sigstop():
    # A stopped (SIGSTOP) engine is continued with the SIGTERM, so cancel
    # takes its checkpoint and ends well inside the 30 s grace period.
    srv, model, train = setup({"step_ms": 30}, grace=30)
    jid = srv.submit(spec(model, train, 100000))["id"]
    wait_for(lambda: srv.job(jid)["progress"]["step"] >= 5, 30, "5 steps")
    pids = engine_pids(srv.data_dir)
    check(len(pids) == 1, "one engine: %r" % pids)
    os.kill(pids[0], signal.SIGSTOP)
    t0 = time.monotonic()
    check(srv.post("/jobs/%d/cancel" % jid).status == 202, "cancel")
    j = srv.wait_state(jid, "cancelled", timeout=60)
    took = time.monotonic() - t0
    check(took < 15, "cancel of a stopped engine took %.1f s (grace 30 s)" % took)
    ck = srv.get("/jobs/%d/checkpoints" % jid).json["checkpoints"]
    check(ck, "the cancelled job kept a checkpoint: %r" % ck)
    check(not engine_pids(srv.data_dir), "the engine is gone")


def test_stall_loop():
    # An engine that loops without progress and ignores SIGTERM: failed.
    srv, model, train = setup({"step_ms": 30, "hang_at_step": 10}, grace=1)
    jid = srv.submit(spec(model, train, 1000, limits={"stall_after_s": 2, "on_stall": "fail"}))["id"]
    j = srv.wait_state(jid, ["succeeded", "failed", "cancelled"], timeout=60)
    check(j["state"] == "failed" and j["stop_reason"] == "stall" and "stalled" in j["error"],
          "%s / %s / %s" % (j["state"], j["stop_reason"], j["error"]))
    stall = typed(events_of(srv, jid), "stall")
    check(len(stall) == 1 and stall[0]["action"] == "fail" and stall[0]["step"] >= 9, "%r" % stall)


def test_stall_default():
    # No stall_after_s: 10x the median step time (0.2 s here), at least
    # --stall-floor (1 s for the test); on_stall warn leaves it running.
    srv, model, train = setup({"step_ms": 20, "hang_at_step": 15}, "--stall-floor", "1", grace=1)
    jid = srv.submit(spec(model, train, 1000))["id"]
    stall = wait_event(srv, jid, lambda t, d: t == "stall", what="a stall event")
    # 1 s unless a loaded machine made the steps slower than 0.1 s; never
    # the 300 s default floor.
    check(stall["action"] == "warn" and 1 <= stall["stall_after_s"] < 300, "%r" % stall)
    j = srv.job(jid)
    check(j["state"] == "running" and j["stalled_at"] is not None, "warn keeps it running, marked: %r" %
          {k: j[k] for k in ("state", "stalled_at")})
    check(srv.post("/jobs/%d/cancel" % jid).status == 202, "cancel")
    srv.wait_state(jid, "cancelled")


def test_stall_healthy():
    # A healthy job that reports every 100 steps of 25 ms: 2.5 s between
    # metrics, ten times the 0.25 s a step-time rule would allow at the
    # 1 s floor. It must finish with no stall (on_stall restart would
    # restart it).
    srv, model, train = setup({"step_ms": 25}, "--stall-floor", "1", grace=1)
    jid = srv.submit(spec(model, train, 400, hyperparameters={"log_every_steps": 100},
                          limits={"on_stall": "restart"}))["id"]
    j = srv.wait_state(jid, ["succeeded", "failed"], timeout=60)
    stalls = typed(events_of(srv, jid), "stall")
    check(j["state"] == "succeeded" and j["restarts"] == 0 and not stalls,
          "%s, %d restarts, stalls %r" % (j["state"], j["restarts"], stalls))


def test_idle_gpu():
    srv0, model, train = setup({"step_ms": 50})  # only for the model dir and train file
    util = os.path.join(srv0.tmp, "util")
    with open(util, "w") as f:
        f.write("90\n")
    os.environ["TY_TEST_GPU_UTIL_FILE"] = util
    try:
        srv, _, _ = setup(None, "--gpus", "0", "--gpu-sample-ms", "100", "--idle-gpu-after", "1",
                          "--idle-gpu-util", "10", roots=srv0.tmp)
    finally:
        del os.environ["TY_TEST_GPU_UTIL_FILE"]
    jid = srv.submit(spec(model, train, 100000, resources={"gpus": 1}))["id"]
    srv.wait_state(jid, "running")
    busy = 0
    with srv.events(jid, from_=0) as s:
        s.sock.settimeout(30)
        # 20 samples at 90 % (2 s, twice --idle-gpu-after): no idle_gpu.
        while busy < 20:
            ev = s.next()
            check(ev and ev[1] != "idle_gpu", "idle_gpu while busy: %r" % (ev,))
            if ev[1] == "gpu" and ev[2]["data"]["util"] == 90:
                busy += 1
        with open(util, "w") as f:
            f.write("0\n")
        while True:
            ev = s.next()
            check(ev is not None, "stream ended without idle_gpu")
            if ev[1] == "idle_gpu":
                d = ev[2]["data"]
                check(d["gpus"] == [0] and d["util"] == 0 and d["threshold"] == 10 and d["idle_s"] >= 1, "%r" % d)
                break
    check(srv.post("/jobs/%d/cancel" % jid).status == 202, "cancel")
    srv.wait_state(jid, "cancelled")


# ---------------------------------------------------------------- 3. queue, PATCH, tags

def test_queue_patch():
    srv, model, train = setup({"step_ms": 50}, "--gpus", "0,1", "--cpu-slots", "1")
    a = srv.submit(spec(model, train, 400, resources={"gpus": 1}))["id"]
    wait_for(lambda: srv.job(a)["progress"]["eta_s"] is not None, 30, "job A's ETA")
    ja = srv.job(a)
    check("eta_s" not in ja["last_metric"],
          "one ETA a job: last_metric has its own %r" % ja["last_metric"])
    b = srv.submit(spec(model, train, 5, resources={"gpus": 2}, hyperparameters={"batch_size": 2}))["id"]
    c = srv.submit(spec(model, train, 400))["id"]
    srv.wait_state(c, "running")
    wait_for(lambda: srv.job(c)["progress"]["eta_s"] is not None, 30, "job C's ETA")
    d = srv.submit(spec(model, train, 5))["id"]
    e = srv.submit(spec(model, train, 5, tags=["t0"]))["id"]
    q = {x["id"]: x for x in srv.get("/queue").json["queue"]}
    check(q[b]["reason"] == "waiting for 2 GPUs, 1 free" and q[b]["estimated_start_s"] > 0,
          "B: %r" % q[b])
    check(q[d]["reason"] == "waiting for a CPU slot, 0 of 1 free", "D: %r" % q[d])
    check([q[b]["position"], q[d]["position"], q[e]["position"]] == [1, 2, 3], "positions %r" % q)
    # E waits behind D, whose run time nobody knows before it runs: no
    # estimate, and the reason says so.
    check(q[e]["estimated_start_s"] is None and q[e]["estimated_start"] is None and
          q[e]["reason"] == "waiting for a CPU slot, 0 of 1 free; start unknown: job %d ahead has "
          "not run yet" % d, "E: %r" % q[e])
    # PATCH: priority reorders the queue; the spec follows.
    r = srv.request("PATCH", "/jobs/%d" % e, {"priority": 10, "name": "renamed", "tags": ["team-a", "exp:1"]})
    check(r.status == 200 and r.json["priority"] == 10 and r.json["name"] == "renamed"
          and r.json["tags"] == ["team-a", "exp:1"] and r.json["spec"]["priority"] == 10
          and r.json["spec"]["name"] == "renamed" and r.json["spec"]["tags"] == ["team-a", "exp:1"], "%r" % r)
    order = [x["id"] for x in srv.get("/queue").json["queue"] if x["state"] == "queued"]
    check(order == [e, b, d], "order after PATCH %r" % order)
    check(srv.job(e)["queue_position"] == 1, "queue_position")
    ests = {x["id"]: x["estimated_start_s"] for x in srv.get("/queue").json["queue"]}
    if ests[e] is not None and ests[d] is not None:
        check(ests[e] <= ests[d], "E (priority 10) estimated after D: %r" % ests)
    for body, field in (({"priority": "x"}, "priority"), ({"priority": 5000}, "priority"),
                        ({"bogus": 1}, "bogus"), ({"tags": ["ok", "bad tag"]}, "tags[1]"),
                        ({"name": ""}, "name")):
        r = srv.request("PATCH", "/jobs/%d" % e, body)
        check(r.status == 400 and r.json["error"]["field"] == field, "%r -> %r" % (body, r))
    check(srv.request("PATCH", "/jobs/%d" % e, {}).status == 400, "empty PATCH")
    r = srv.request("PATCH", "/jobs/%d" % a, {"priority": 1})
    check(r.status == 409 and "running" in r.json["error"]["message"], "PATCH running: %r" % r)
    check(srv.request("PATCH", "/jobs/99999", {"priority": 1}).status == 404, "PATCH unknown job")
    # Paused: listed with its reason, and still changeable.
    check(srv.post("/jobs/%d/pause" % d).status == 202, "pause D")
    qd = [x for x in srv.get("/queue").json["queue"] if x["id"] == d][0]
    check(qd["state"] == "paused" and qd["reason"] == "paused" and qd["position"] is None, "%r" % qd)
    check(srv.request("PATCH", "/jobs/%d" % d, {"tags": ["team-a"]}).status == 200, "PATCH paused")
    ids = sorted(j["id"] for j in srv.get("/jobs?tag=team-a").json["jobs"])
    check(ids == sorted([d, e]), "tag filter %r" % ids)
    check(srv.get("/jobs?tag=nobody").json["jobs"] == [], "empty tag filter")
    check(srv.get("/jobs?tag=").status == 400, "empty tag")
    # CLI: queue, jobs --tag, patch (and its conflict exit code).
    out = cli(srv, "queue")
    check(out.returncode == 0 and "waiting for 2 GPUs, 1 free" in out.stdout and "paused" in out.stdout,
          "trainyard queue: %r" % out)
    # estimates relative to now, never a raw timestamp (E and B have one:
    # the running jobs C and A report ETAs)
    rows = {l.split()[1]: l for l in out.stdout.splitlines()[1:] if l[:1].isdigit()}
    check(not re.search(r"\d{4}-\d\d-\d\dT", out.stdout) and
          all(re.search(r" (now|in ~\d+ (min|h))", rows[str(x)]) for x in (e, b)),
          "relative estimates: %r" % out.stdout)
    out = cli(srv, "jobs", "--tag", "exp:1", "--json")
    check(out.returncode == 0 and [j["id"] for j in json.loads(out.stdout)["jobs"]] == [e], "jobs --tag %r" % out)
    out = cli(srv, "patch", str(e), "--priority", "3", "--tags", "x,y")
    check(out.returncode == 0 and srv.job(e)["priority"] == 3 and srv.job(e)["tags"] == ["x", "y"], "patch %r" % out)
    out = cli(srv, "patch", str(a), "--priority", "3")
    check(out.returncode == 4 and "only queued or paused" in out.stderr, "patch running: %r" % out)
    for jid in (a, b, c, d, e):
        srv.post("/jobs/%d/cancel" % jid)


# ---------------------------------------------------------------- 5. usage

def test_usage():
    srv, model, train = setup({"step_ms": 20}, "--require-token", "--cpu-hour-price", "3600", "--cpu-slots", "2")
    toks = {}
    for name in ("alice", "bob"):
        out = subprocess.run([TRAINYARD, "token", "create", name, "--data-dir", srv.data_dir],
                             capture_output=True, text=True, timeout=30)
        check(out.returncode == 0, "token create: %r" % out)
        toks[name] = out.stdout.strip().split()[-1]
    srv.token = toks["alice"]
    a1 = srv.submit(spec(model, train, 5, tags=["a"]))["id"]
    a2 = srv.submit(spec(model, train, 5, tags=["a", "b"]))["id"]
    b1 = srv.submit(spec(model, train, 5), token=toks["bob"])["id"]
    b2 = srv.submit(spec(model, train, 100000), token=toks["bob"])["id"]
    srv.wait_state(b2, "running")
    srv.post("/jobs/%d/cancel" % b2)
    for jid in (a1, a2, b1, b2):
        srv.wait_state(jid, ["succeeded", "cancelled"])
    tokens = sum((srv.job(j)["last_metric"] or {}).get("tokens", 0) for j in (a1, a2, b1, b2))
    u = srv.get("/usage?group_by=token").json
    g = {x["key"]: x for x in u["groups"]}
    check(g["alice"]["jobs"] == {"succeeded": 2, "failed": 0, "cancelled": 0}, "alice %r" % g)
    check(g["bob"]["jobs"] == {"succeeded": 1, "failed": 0, "cancelled": 1}, "bob %r" % g)
    t = u["total"]
    check(t["tokens"] == tokens and t["gpu_seconds"] == 0 and t["cpu_seconds"] > 0, "total %r vs %d" % (t, tokens))
    check(abs(t["cost"] - t["cpu_seconds"]) < 1e-6, "price 1/s: %r" % t)
    g = {x["key"]: x for x in srv.get("/usage?group_by=tag").json["groups"]}
    check(sum(g["a"]["jobs"].values()) == 2 and sum(g["b"]["jobs"].values()) == 1
          and sum(g[None]["jobs"].values()) == 2, "by tag %r" % g)
    day = time.strftime("%Y-%m-%d", time.gmtime())
    g = srv.get("/usage?group_by=day").json["groups"]
    check(len(g) == 1 and g[0]["key"] == day and sum(g[0]["jobs"].values()) == 4, "by day %r" % g)
    tomorrow = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 86400))
    e = srv.get("/usage?from=%s" % tomorrow).json
    check(e["groups"][0]["jobs"] == {"succeeded": 0, "failed": 0, "cancelled": 0}, "empty window %r" % e)
    w = srv.get("/usage?from=%sT00:00:00Z&to=%s" % (day, tomorrow)).json
    check(sum(w["total"]["jobs"].values()) == 4, "window %r" % w)
    r = srv.get("/usage?group_by=tag", headers={"Accept": "text/csv"})
    lines = r.body.decode().splitlines()
    check(r.headers["content-type"].startswith("text/csv") and lines[0].startswith("key,gpu_seconds")
          and len(lines) == 4 and any(l.startswith('"a",') for l in lines), "csv %r" % lines)
    check(srv.get("/usage?format=csv").body.decode().count("\n") == 2, "format=csv")
    for q, field in (("group_by=week", "group_by"), ("from=yesterday", "from"), ("format=xml", "format"),
                     ("from=2026-12-03&to=2026-12-01", "to")):
        r = srv.get("/usage?" + q)
        check(r.status == 400 and r.json["error"]["field"] == field, "%s: %r" % (q, r))
    prom = srv.get("/metrics").body.decode()
    check('trainyard_jobs_finished_total{state="succeeded"} 3' in prom and
          'trainyard_jobs_finished_total{state="cancelled"} 1' in prom and
          "trainyard_tokens_trained_total %d" % tokens in prom and
          "trainyard_cpu_seconds_total %.3f" % t["cpu_seconds"] in prom, "prometheus:\n" + prom[-1500:])
    # Deleting a job leaves the ledger (counters never go down).
    check(srv.request("DELETE", "/jobs/%d" % a1).status == 204, "delete")
    check(srv.get("/usage").json["total"] == t, "usage changed after a delete")
    out = cli(srv, "usage", "--group-by", "token")
    check(out.returncode == 0 and "alice" in out.stdout and "bob" in out.stdout, "cli usage %r" % out)
    cur = t["currency"]
    check(("COST (%s)" % cur) in out.stdout.splitlines()[0], "the cost column names %s: %r" % (cur, out.stdout))
    out = cli(srv, "usage", "--csv")
    check(out.returncode == 0 and out.stdout.startswith("key,gpu_seconds"), "cli usage --csv %r" % out)


# ---------------------------------------------------------------- 4. webhooks

class Receiver:
    """A local webhook receiver; answers 500 to its first `fail` requests."""

    def __init__(self, port=0, fail=0):
        self.got, self.fail, self.lock = [], fail, threading.Lock()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with outer.lock:
                    failing = outer.fail > 0
                    if failing:
                        outer.fail -= 1
                    else:
                        outer.got.append((dict(self.headers), body))
                self.send_response(500 if failing else 204)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        _cleanup.append(self.close)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def events(self, jid):
        with self.lock:
            return [json.loads(b) for h, b in self.got if json.loads(b)["job_id"] == jid]


def verify(secret, headers, body):
    ts = headers["X-Trainyard-Timestamp"]
    want = "sha256=" + hmac.new(secret.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
    check(hmac.compare_digest(headers["X-Trainyard-Signature"], want), "bad signature %r" % headers)


def test_webhooks():
    r1, r2 = Receiver(fail=2), Receiver()
    srv0, model, train = setup({"step_ms": 30})
    conf = os.path.join(srv0.tmp, "ty.conf")
    with open(conf, "w") as f:
        f.write("webhook-urls = http://127.0.0.1:%d/hook\nwebhook-secret = s3cret\n"
                "webhook-allowed-hosts = 127.0.0.1:%d\nwebhook-attempts = 30\n" % (r1.port, r2.port))
    srv, _, _ = setup(None, "--config", conf, roots=srv0.tmp)
    e = srv.submit(spec(model, train, 5, webhooks=["http://evil.example/x"]), expect=400)["error"]
    check(e["field"] == "webhooks[0]" and "allowed" in e["message"], "%r" % e)
    e = srv.submit(spec(model, train, 5, webhooks=["http://127.0.0.1:%d/own" % r1.port]), expect=400)["error"]
    check(e["field"] == "webhooks[0]", "a port not allowed: %r" % e)
    jid = srv.submit(spec(model, train, 100000, webhooks=["http://127.0.0.1:%d/own" % r2.port],
                          limits={"max_runtime_s": 1}))["id"]
    srv.wait_state(jid, "succeeded", timeout=60)

    def delivered(r):
        """The job's events once every one has arrived: deliveries are not
        serialised (docs/api.md, Order), so a retried early state can land
        after "succeeded"; wait for the budget event and for the states,
        ordered by seq, to link from the first to "succeeded"."""
        evs = r.events(jid)
        states = sorted((e for e in evs if e["type"] == "state"), key=lambda e: e["seq"])
        ends = [(e["data"]["from"], e["data"]["to"]) for e in states]
        whole = bool(ends) and ends[0][0] is None and ends[-1][1] == "succeeded" and \
            all(ends[i][1] == ends[i + 1][0] for i in range(len(ends) - 1))
        return evs if whole and any(e["type"] == "budget" for e in evs) else None
    for r in (r1, r2):
        evs = wait_for(lambda: delivered(r), 30, "the webhooks of job %d" % jid)
        types = [(e["type"], e["data"].get("to")) for e in evs]
        check(("budget", None) in types and ("state", "running") in types and ("state", "stopping") in types,
              "types %r" % types)
        # r1 failed its first two: arrival order may differ; seq orders
        # the job's states into one chain ending succeeded
        states = sorted((e for e in evs if e["type"] == "state"), key=lambda e: e["seq"])
        seqs = [e["seq"] for e in states]
        check(len(set(seqs)) == len(seqs), "seq repeats: %r" % seqs)
        chain = [(e["data"]["from"], e["data"]["to"]) for e in states]
        check(all(chain[i][1] == chain[i + 1][0] for i in range(len(chain) - 1)), "by seq: %r" % chain)
        last = states[-1]
        check(last["job"]["state"] == "succeeded" and last["job"]["stop_reason"] == "budget", "%r" % last)
        with r.lock:
            for h, b in r.got:
                verify("s3cret", h, b)
                check(h["X-Trainyard-Delivery"].isdigit(), "delivery id %r" % h)
    check(r1.fail == 0, "r1 was asked again after failing")
    # Durable: a receiver down while a job runs gets its events after a restart.
    port = r1.port
    r1.close()
    j2 = srv.submit(spec(model, train, 3))["id"]
    srv.wait_state(j2, "succeeded")
    con = sqlite3.connect("file:%s/trainyard.db?mode=ro" % srv.data_dir, uri=True, timeout=10)
    wait_for(lambda: con.execute("select count(*) from webhook_outbox o join job_events e on e.id = o.event_id"
                                 " where e.job_id = ? and o.url like '%/hook' and o.attempts > 0", (j2,)).fetchone()[0],
             30, "a failed try to the receiver that is down")
    con.close()
    srv.stop()
    r3 = Receiver(port=port)
    srv.start()
    evs = wait_for(lambda: [e for e in r3.events(j2) if e["type"] == "state" and e["data"]["to"] == "succeeded"],
                   60, "job %d's events after the restart" % j2)
    check(evs[0]["job_id"] == j2, "%r" % evs)
    with r3.lock:
        for h, b in r3.got:
            verify("s3cret", h, b)


def test_webhook_slow():
    # A receiver that accepts connections and never answers: each delivery
    # waits out its 10 s timeout on the delivery thread, while the scheduler
    # runs three jobs one after the other (a scheduler that waited for
    # deliveries would need two minutes for their 12 state changes).
    import socket
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(64)
    _cleanup.append(sink.close)
    srv, model, train = setup({"step_ms": 10}, "--webhook-urls", "http://127.0.0.1:%d/hook" % sink.getsockname()[1])
    ids = [srv.submit(spec(model, train, 10))["id"] for _ in range(3)]
    for jid in ids:
        srv.wait_state(jid, "succeeded", timeout=60)
    # Meanwhile the outbox took every state change (4 per job), though not
    # one delivery has finished: fanning out does not wait on the network.
    con = sqlite3.connect("file:%s/trainyard.db?mode=ro" % srv.data_dir, uri=True, timeout=10)
    count = lambda st: con.execute("select count(*) from webhook_outbox where state = ?", (st,)).fetchone()[0]
    wait_for(lambda: count("pending") >= 12, 20, "12 queued deliveries (have %d)" % count("pending"))
    check(count("delivered") == 0, "a delivery to a silent receiver")
    con.close()
    srv.stop()  # clean, with a transfer in flight (aborted, stays pending)


if __name__ == "__main__":
    run_tests({"budget": test_budget, "budget_restart": test_budget_restart, "budget_refused": test_budget_refused, "gpu_price": test_gpu_price,
               "budget_progress": test_budget_progress,
               "stall_sigstop": test_stall_sigstop, "cancel_sigstop": test_cancel_sigstop,
               "stall_healthy": test_stall_healthy,
               "stall_loop": test_stall_loop,
               "stall_default": test_stall_default, "idle_gpu": test_idle_gpu,
               "queue_patch": test_queue_patch, "usage": test_usage, "webhooks": test_webhooks,
               "webhook_slow": test_webhook_slow})
