"""test_store_probe.py — a job's checkpoint store is checked before the job
runs, and an upload that fails after that is never hidden.

The real `trainyard serve` with the fake engine against s3rver and Azurite
(tests/storage/harness.py), with tests/storage/faultproxy.py in front of
s3rver where a store must start failing in the middle of a job.

  probe_submit       POST /jobs writes and deletes a probe object: a missing
                     bucket, an unknown key, a missing Azure container, a
                     wrong Azure key and an endpoint that does not answer
                     are 400 naming checkpoint.store, the URI and the
                     reason, and no job is stored; a good store is 201 and
                     the probe object is gone.
  store_fails_mid_job  one intermediate checkpoint failing for good: the job
                     succeeds with checkpoint_error naming it; the store
                     failing from the middle of a job on: the job ends
                     failed, its error and checkpoint_error name the final
                     checkpoint and the store, and `trainyard watch` says so
                     and exits non-zero.
  export_upload      the export the engine leaves is uploaded to
                     STORE/job-<id>/export/ before the job succeeds; when
                     its upload fails the job ends failed saying the export
                     was not uploaded.
  real_engine_export the real engine's checkpoints and HF export, read back
                     from the bucket byte for byte.
  restart_while_finishing  kill -9 while a finished job waits for its final
                     uploads: after the restart it waits again and succeeds
                     with the checkpoint and the export in the bucket.
"""
import os
import signal
import sqlite3
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_storage_e2e as E  # noqa: E402  (s3 config, aws, checkpoints; scrubs cloud env vars)

H, T = E.H, E.T
check, wait_for = T.check, T.wait_for


def no_jobs(srv, n=0):
    r = srv.get("/jobs")
    check(r.status == 200 and len(r.json["jobs"]) == n, "no job stored: %r" % r.json)


def refused(srv, spec, *want):
    """POST /jobs is 400 naming checkpoint.store, with every string of want
    in the message."""
    r = srv.post("/jobs", spec, timeout=120)
    check(r.status == 400, "want 400, got %r" % r)
    e = r.json["error"]
    check(e["code"] == "invalid_spec" and e["field"] == "checkpoint.store", "field named: %r" % e)
    for w in want:
        check(w in e["message"], "%r not in %r" % (w, e["message"]))
    return e["message"]


def cli(srv, *args):
    env = dict(os.environ, TY_URL="http://127.0.0.1:%d" % srv.port)
    env.pop("TY_TOKEN", None)
    return subprocess.run([T.TRAINYARD] + list(args), capture_output=True, text=True, env=env,
                          timeout=120)


def probe_submit():
    url, s3proc = H.start_s3rver(["ckpts"])
    srv = E.new_server(lambda d: E.s3_config(d, url))
    model, train = E.inputs(srv, {"step_ms": 20})
    spec = lambda store: T.spec(model, train, max_steps=4,  # noqa: E731
                                checkpoint={"every_steps": 2, "store": store})

    msg = refused(srv, spec("s3://no-such-bucket/x"), "s3://no-such-bucket/x", "NoSuchBucket")
    check(".trainyard-probe-" in msg, "the message says the probe write failed: %r" % msg)
    no_jobs(srv)

    # A good store: accepted, and the probe object did not stay behind.
    jid = srv.submit(spec("s3://ckpts/runs"))["id"]
    srv.wait_state(jid, "succeeded", timeout=120)
    keys = E.s3_keys(url, "s3://ckpts/")
    check(keys and not [k for k in keys if ".trainyard-probe-" in k], "probe removed: %r" % keys)
    check(E.checkpoints(srv, jid)[-1]["state"] == "committed", "uploads work")
    check(srv.job(jid)["checkpoint_error"] is None, "no checkpoint_error: %r" % srv.job(jid))
    srv.stop()

    # A key s3rver does not know: refused (403), the secret never echoed.
    def wrong_key(d):
        path = os.path.join(d, "serve.conf")
        with open(path, "w") as f:
            f.write("s3-access-key-id = AKIAWRONGKEY0000\ns3-secret-access-key = \"%s\"\n"
                    "s3-region = us-east-1\ns3-endpoint = %s\n" % (E.S3_SECRET, url))
        return path
    bad = E.new_server(wrong_key)
    model, train = E.inputs(bad, {"step_ms": 20})
    msg = refused(bad, spec("s3://ckpts/runs"), "s3://ckpts/runs", "403")
    check(E.S3_SECRET not in msg, "no secret in %r" % msg)
    no_jobs(bad)
    bad.stop()

    # An endpoint that accepts connections and never answers: the submit
    # still comes back (bounded per request), refused, naming the store.
    os.killpg(s3proc.pid, signal.SIGSTOP)
    try:
        srv.start()
        model, train = E.inputs(srv, {"step_ms": 20})
        refused(srv, spec("s3://ckpts/runs"), "s3://ckpts/runs")
    finally:
        os.killpg(s3proc.pid, signal.SIGCONT)
    no_jobs(srv, 1)
    srv.stop()

    # Azure: the probe uses the same SharedKey the uploads use.
    sys.path.insert(0, os.path.join(HERE, "..", "storage"))
    import test_azure as A
    endpoint, _ = H.start_azurite()
    status, _, body = A.rest(endpoint, "PUT", "/ckpts", {"restype": "container"})
    check(status == 201, "container created: %r" % body[:200])

    def az_conf(key):
        def conf(d):
            path = os.path.join(d, "serve.conf")
            with open(path, "w") as f:
                f.write("azure-connection-string = \"DefaultEndpointsProtocol=http;AccountName=%s;"
                        "AccountKey=%s;BlobEndpoint=%s;\"\n" % (H.AZURITE_ACCOUNT, key, endpoint))
            return path
        return conf
    az = E.new_server(az_conf(H.AZURITE_KEY))
    model, train = E.inputs(az, {"step_ms": 20})
    refused(az, spec("az://no-such-container/x"), "az://no-such-container/x", "404")
    jid = az.submit(spec("az://ckpts/runs"))["id"]
    az.wait_state(jid, "succeeded", timeout=120)
    st, _, b = A.rest(endpoint, "GET", "/ckpts", {"restype": "container", "comp": "list"})
    check(st == 200 and b"MANIFEST.json" in b and b".trainyard-probe-" not in b,
          "checkpoints there, probe gone: %r" % b[:400])
    az.stop()
    wrong = "A" * 86 + "=="  # valid base64, not the account's key
    az2 = E.new_server(az_conf(wrong))
    model, train = E.inputs(az2, {"step_ms": 20})
    refused(az2, spec("az://ckpts/runs"), "az://ckpts/runs", "403")
    no_jobs(az2)


def fault_server(*extra):
    url, _ = H.start_s3rver(["ckpts"])
    proxy = H.FaultProxy(url)
    srv = E.new_server(lambda d: E.s3_config(d, proxy.url), "--upload-workers", "1",
                       "--upload-attempts", "2", "--upload-wait", "60", *extra)
    return url, proxy, srv


def store_fails_mid_job():
    url, proxy, srv = fault_server()
    model, train = E.inputs(srv, {"step_ms": 100})

    # One intermediate checkpoint refused for good (403 is never retried);
    # the final one lands: succeeded, and checkpoint_error says which is
    # missing from the bucket.
    # (The rule is in place before the submit, whose probe it does not
    # match: step-000004 is this job's alone, the next one checkpoints
    # every 5 steps.)
    proxy.set([{"method": "PUT", "path": "/checkpoints/step-000004/", "action": "403",
                "times": -1}])
    jid = srv.submit(T.spec(model, train, max_steps=12,
                            checkpoint={"every_steps": 4, "store": "s3://ckpts/runs"}))["id"]
    j = srv.wait_state(jid, ["succeeded", "failed"], timeout=120)
    cks = {c["step"]: c for c in E.checkpoints(srv, jid)}
    check(j["state"] == "succeeded", "the final checkpoint is in the store: %r / %r" % (j, cks))
    check(cks[4]["state"] == "failed" and cks[12]["state"] == "committed", "checkpoints: %r" % cks)
    ce = j["checkpoint_error"] or ""
    check("step-000004" in ce and "s3://ckpts/runs" in ce and "403" in ce, "checkpoint_error: %r" % ce)

    # The store starts failing once the job has a committed checkpoint:
    # every later upload fails (503, retried, then for good after
    # --upload-attempts), so the final checkpoint is not in the bucket and
    # the job ends failed, saying so.
    proxy.set([])
    slow = T.model_dir(srv.tmp, {"step_ms": 200}, name="slow")
    j2 = srv.submit(T.spec(slow, train, max_steps=30,
                           checkpoint={"every_steps": 5, "store": "s3://ckpts/runs"}))["id"]
    wait_for(lambda: any(c["state"] == "committed" for c in E.checkpoints(srv, j2)), 60,
             "a committed checkpoint of job %d" % j2)
    proxy.set([{"path": "job-%d/" % j2, "action": "503", "times": -1}])
    j = srv.wait_state(j2, ["succeeded", "failed"], timeout=200)
    check(j["state"] == "failed", "a job whose final checkpoint is not in its store fails: %r" % j)
    check("step-000030" in j["error"] and "s3://ckpts/runs" in j["error"] and
          "not in" in j["error"], "error: %r" % j["error"])
    check("s3://ckpts/runs" in (j["checkpoint_error"] or ""), "checkpoint_error: %r" % j)
    keys = E.s3_keys(url, "s3://ckpts/runs/job-%d/checkpoints/step-000030/" % j2)
    check(not [k for k in keys if k.endswith("MANIFEST.json")], "nothing committed: %r" % keys)
    r = cli(srv, "watch", str(j2))
    check(r.returncode != 0, "watch exits non-zero for the failed job: %r" % r)
    check("checkpoint_error: " in r.stderr and "s3://ckpts/runs" in r.stderr,
          "watch prints checkpoint_error: %r" % r.stderr)
    check("step-000030 (failed)" in r.stdout, "watch shows the failed upload: %r" % r.stdout[-2000:])
    E.no_secret(srv, j2, E.S3_SECRET)


def export_upload():
    url, proxy, srv = fault_server()
    model, train = E.inputs(srv, {"step_ms": 20, "export_bytes": 300000})
    s = T.spec(model, train, max_steps=6, checkpoint={"every_steps": 3, "store": "s3://ckpts/runs"})
    jid = srv.submit(s)["id"]
    j = srv.wait_state(jid, ["succeeded", "failed"], timeout=120)
    check(j["state"] == "succeeded" and j["checkpoint_error"] is None, "job: %r" % j)
    keys = E.s3_keys(url, "s3://ckpts/runs/job-%d/export/" % jid)
    check(keys == ["runs/job-%d/export/config.json" % jid,
                   "runs/job-%d/export/model.safetensors" % jid], "export in the bucket: %r" % keys)
    out = os.path.join(srv.tmp, "weights")
    r = E.aws(url, "s3", "cp", "s3://ckpts/runs/job-%d/export/model.safetensors" % jid, out)
    with open(out, "rb") as f, open(os.path.join(srv.data_dir, "jobs", str(jid), "export",
                                                  "model.safetensors"), "rb") as g:
        check(r.returncode == 0 and f.read() == g.read(), "the export reads back whole")
    logs = [e[2]["data"]["line"] for e in srv.all_events(jid) if e[1] == "log"]
    check(any(line.startswith("export uploaded to s3://ckpts/runs/job-%d/export" % jid)
              for line in logs), "the job says where its export went: %r" % logs)

    # The export's upload refused: the checkpoints are there, the job is not
    # told it succeeded.
    proxy.set([{"method": "PUT", "path": "/export/", "action": "403", "times": -1}])
    j2 = srv.submit(s)["id"]
    j = srv.wait_state(j2, ["succeeded", "failed"], timeout=120)
    check(j["state"] == "failed" and "export was not uploaded to s3://ckpts/runs" in j["error"],
          "job: %r" % j)
    check((j["checkpoint_error"] or "").startswith("export not uploaded to s3://ckpts/runs: "),
          "checkpoint_error: %r" % j["checkpoint_error"])
    check(all(c["state"] == "committed" for c in E.checkpoints(srv, j2)), "checkpoints committed")


def restart_while_finishing():
    """The engine finished while its final uploads were stuck (a stalled
    emulator); the server is killed with -9 then. After the restart the job
    waits for them again (the export is uploaded anew) and succeeds with
    everything in the bucket."""
    url, s3proc = H.start_s3rver(["ckpts"])
    srv = E.new_server(lambda d: E.s3_config(d, url), "--upload-workers", "1")
    # Slow enough that no upload can finish between the submit (whose probe
    # needs the emulator) and the SIGSTOP right after it.
    model, train = E.inputs(srv, {"step_ms": 300, "export_bytes": 1000})
    jid = srv.submit(T.spec(model, train, max_steps=6,
                            checkpoint={"every_steps": 3, "store": "s3://ckpts/runs"}))["id"]
    os.killpg(s3proc.pid, signal.SIGSTOP)
    db = os.path.join(srv.data_dir, "trainyard.db")

    def intent():
        con = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=10)
        try:
            return con.execute("select stop_intent from jobs where id = ?", (jid,)).fetchone()[0]
        finally:
            con.close()
    try:
        wait_for(lambda: intent() == "succeeded", 60, "the engine finished; the job waits for uploads")
        j = srv.job(jid)
        check(j["state"] == "stopping", "stopping, not running, while it waits: %r" % j)
        srv.kill9()
    finally:
        os.killpg(s3proc.pid, signal.SIGCONT)
    srv.start()
    j = srv.wait_state(jid, ["succeeded", "failed"], timeout=120)
    check(j["state"] == "succeeded" and j["checkpoint_error"] is None, "job: %r" % j)
    keys = E.s3_keys(url, "s3://ckpts/runs/job-%d/" % jid)
    check("runs/job-%d/export/model.safetensors" % jid in keys and
          "runs/job-%d/checkpoints/step-000006/MANIFEST.json" % jid in keys, "in the bucket: %r" % keys)
    states = [e[2]["data"] for e in srv.all_events(jid) if e[1] == "state"]
    check("server restarted while its final uploads were pending" in states[-1]["reason"],
          "reason: %r" % states[-1])


def real_engine_export():
    """The real trainyard-engine (a tiny GPT-2 from model.init on the CPU):
    its checkpoints and its Hugging Face export land in the bucket, byte
    for byte what it wrote locally, before the job succeeds."""
    engine = os.environ.get("TY_ENGINE")
    if not engine or not os.access(engine, os.X_OK):
        print("skip: TY_ENGINE names no engine binary")
        sys.exit(77)
    url, _ = H.start_s3rver(["ckpts"])
    srv = E.new_server(lambda d: E.s3_config(d, url), "--engine", engine)
    train = os.path.join(srv.tmp, "tokens.jsonl")
    with open(train, "w") as f:
        for i in range(16):
            f.write('{"input_ids": [%s]}\n' % ", ".join(str((i + t) % 32) for t in range(17)))
    spec = {"model": {"init": {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2,
                               "n_positions": 32, "vocab_size": 32}},
            "dataset": {"train": train, "format": "tokens"},
            "hyperparameters": {"max_steps": 4, "batch_size": 2, "seq_len": 16, "log_every_steps": 1},
            "resources": {"backend": "cpu"},
            "checkpoint": {"every_steps": 2, "store": "s3://ckpts/runs"}}
    jid = srv.submit(spec)["id"]
    j = srv.wait_state(jid, ["succeeded", "failed"], timeout=180)
    check(j["state"] == "succeeded" and j["checkpoint_error"] is None, "job: %r" % j)
    check(all(c["state"] == "committed" for c in E.checkpoints(srv, jid)), "checkpoints committed")
    local = os.path.join(srv.data_dir, "jobs", str(jid), "export")
    names = sorted(os.listdir(local))
    check("model.safetensors" in names and "config.json" in names, "the engine exported: %r" % names)
    keys = E.s3_keys(url, "s3://ckpts/runs/job-%d/export/" % jid)
    check(keys == ["runs/job-%d/export/%s" % (jid, n) for n in names], "export in the bucket: %r" % keys)
    for n in names:
        out = os.path.join(srv.tmp, "back-" + n)
        r = E.aws(url, "s3", "cp", "s3://ckpts/runs/job-%d/export/%s" % (jid, n), out)
        with open(out, "rb") as f, open(os.path.join(local, n), "rb") as g:
            check(r.returncode == 0 and f.read() == g.read(), "%s reads back whole" % n)


if __name__ == "__main__":
    T.run_tests({"probe_submit": probe_submit,
                 "store_fails_mid_job": store_fails_mid_job,
                 "export_upload": export_upload,
                 "restart_while_finishing": restart_while_finishing,
                 "real_engine_export": real_engine_export})
