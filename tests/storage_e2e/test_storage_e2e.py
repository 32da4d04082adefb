"""test_storage_e2e.py — checkpoints in object stores, end to end: the real
`trainyard serve` with the fake engine (tests/fixtures) against emulators
the test starts (s3rver, Azurite; tests/storage/harness.py starts them).

Each case is one function; `test_storage_e2e.py CASE` runs one. What is
checked: checkpoints land in the bucket (read back with /usr/bin/aws and the
Azure REST API) and go `committed` in the API; keep_last leaves exactly N
remotely; a resume after the local job directory is deleted downloads the
newest committed checkpoint and continues from its step; an emulator that
is down fails the upload with a reason, the job whose final checkpoint is
not stored ends failed saying so, and a later retry commits it; a
server killed with -9 mid-upload resumes its queue; remote model/dataset
URIs are fetched into the cache, on a fetch thread that neither blocks
other jobs nor a cancel or pause of the fetching job; credentials never show in the API, the
events or the server log; purge deletes the remote copies.
"""
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
sys.path.insert(0, os.path.join(HERE, "..", "storage"))

import harness as H  # noqa: E402  (tests/storage: emulators)
import tyharness as T  # noqa: E402  (tests/server: the daemon)
from tyharness import check, wait_for  # noqa: E402

# The server must take its credentials from its config file, not from an
# environment the test happens to run in.
for _k in list(os.environ):
    if _k.startswith(("AWS_", "AZURE_", "GCS_", "GOOGLE_", "STORAGE_EMULATOR")):
        del os.environ[_k]

# s3rver accepts any secret for its key id; a unique one lets us grep for it.
S3_SECRET = "tyE2eS3cr3t-%d-do-not-leak" % os.getpid()


def s3_config(tmp, url, extra=""):
    path = os.path.join(tmp, "serve.conf")
    with open(path, "w") as f:
        f.write("# object store credentials live here, never in a spec\n"
                "s3-access-key-id = %s\ns3-secret-access-key = \"%s\"\n"
                "s3-region = us-east-1\ns3-endpoint = %s\n%s" % (H.S3RVER_KEY, S3_SECRET, url, extra))
    return path


def aws(url, *argv):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=H.S3RVER_KEY, AWS_SECRET_ACCESS_KEY=H.S3RVER_SECRET,
               AWS_DEFAULT_REGION="us-east-1")
    r = subprocess.run(["/usr/bin/aws", "--endpoint-url", url, *argv], env=env, capture_output=True,
                       text=True, timeout=120)
    return r


def s3_keys(url, prefix):
    r = aws(url, "s3", "ls", "--recursive", prefix)
    if r.returncode not in (0, 1):  # 1: nothing listed
        T.fail("aws s3 ls %s: %s" % (prefix, r.stderr))
    return sorted(line.split()[-1] for line in r.stdout.splitlines() if line.strip())


def checkpoints(srv, jid):
    r = srv.get("/jobs/%d/checkpoints" % jid)
    check(r.status == 200, "checkpoints: %r" % r)
    return r.json["checkpoints"]


def standing(cks):
    return [c for c in cks if c["state"] != "deleted"]


def new_server(conf_fn, *extra):
    """A server whose --config file conf_fn(dir) writes."""
    return T.Server("--config", conf_fn(T.tmpdir()), *extra)


def inputs(srv, fixture):
    train = os.path.join(srv.tmp, "train.jsonl")
    with open(train, "w") as f:
        f.write('{"text": "hello"}\n')
    return T.model_dir(srv.tmp, fixture), train


def no_secret(srv, jid, secret):
    """The secret is nowhere in the API's answers, the job's stored events
    (what its stream replays) or the server log."""
    texts = [srv.get("/jobs/%d" % jid).body, srv.get("/jobs/%d/checkpoints" % jid).body,
             srv.get("/jobs").body]
    con = sqlite3.connect("file:%s?mode=ro" % os.path.join(srv.data_dir, "trainyard.db"), uri=True,
                          timeout=10)
    try:
        rows = con.execute("select data from job_events where job_id = ?", (jid,)).fetchall()
    finally:
        con.close()
    check(rows, "job %d has events" % jid)
    texts += [r[0].encode() for r in rows]
    with open(srv.log_path, "rb") as f:
        texts.append(f.read())
    for t in texts:
        check(secret.encode() not in t, "the secret leaked: %r" % t[:300])


# ---------------------------------------------------------------- cases

def s3_upload_retention_resume():
    url, _ = H.start_s3rver(["ckpts"])
    srv = new_server(lambda d: s3_config(d, url), "--upload-workers", "2")
    model, train = inputs(srv, {"step_ms": 40})

    # Credentials in a spec are refused, before anything is stored.
    bad = T.spec(model, train, checkpoint={"store": "s3://AKID:%s@ckpts/x" % S3_SECRET})
    r = srv.post("/jobs", bad)
    check(r.status == 400 and r.json["error"]["field"] == "checkpoint.store", "field named: %r" % r.json)
    check(S3_SECRET.encode() not in r.body, "400 echoes the secret: %r" % r.body)

    s = T.spec(model, train, max_steps=20,
               checkpoint={"every_steps": 4, "keep_last": 2, "store": "s3://ckpts/runs"})
    jid = srv.submit(s)["id"]
    srv.wait_state(jid, "succeeded", timeout=120)
    # Success waited for the final checkpoint's upload.
    cks = checkpoints(srv, jid)
    st = standing(cks)
    check(len(st) == 2 and all(c["state"] == "committed" for c in st),
          "keep_last 2 leaves two committed checkpoints: %r" % cks)
    check(max(c["step"] for c in st) == 20, "the final checkpoint is kept: %r" % st)
    for c in st:
        check(c["remote_uri"] == "s3://ckpts/runs/job-%d/%s" % (jid, c["dir"]),
              "remote_uri: %r" % c)
    # Remote retention runs on the workers: wait until exactly two remain.
    want = sorted("runs/job-%d/%s/MANIFEST.json" % (jid, c["dir"]) for c in st)
    wait_for(lambda: [k for k in s3_keys(url, "s3://ckpts/runs/job-%d/" % jid)
                      if k.endswith("MANIFEST.json")] == want, 60, "exactly 2 manifests in the bucket")
    keys = s3_keys(url, "s3://ckpts/runs/job-%d/" % jid)
    check(len(keys) == 2 * 4, "each kept checkpoint has its 3 files + manifest, nothing else: %r" % keys)
    # aws reads back what we wrote: the manifest matches the local one.
    newest = max(st, key=lambda c: c["step"])
    out = os.path.join(srv.tmp, "m.json")
    r = aws(url, "s3", "cp", newest["remote_uri"] + "/MANIFEST.json", out)
    check(r.returncode == 0, "aws s3 cp: %s" % r.stderr)
    with open(out, "rb") as f, open(os.path.join(newest["local_path"], "MANIFEST.json"), "rb") as g:
        check(f.read() == g.read(), "remote manifest equals the local one")
    evs = [e for e in srv.all_events(jid) if e[1] == "checkpoint"]
    seen = {e[2]["data"].get("state") for e in evs}
    check({"local", "uploading", "committed", "deleted"} <= seen, "checkpoint events: %r" % seen)

    # Resume from remote: pause after a commit, delete the job directory.
    s2 = T.spec(model, train, max_steps=60,
                checkpoint={"every_steps": 5, "store": "s3://ckpts/runs"})
    fx = T.model_dir(srv.tmp, {"step_ms": 150, "resume_step_ms": 5}, name="slow")
    s2["model"]["path"] = fx
    j2 = srv.submit(s2)["id"]
    wait_for(lambda: any(c["state"] == "committed" for c in checkpoints(srv, j2)), 60,
             "a committed checkpoint of job %d" % j2)
    check(srv.post("/jobs/%d/pause" % j2).status == 202, "pause accepted")
    srv.wait_state(j2, "paused", timeout=60)
    cks = checkpoints(srv, j2)
    check(not any(c["state"] in ("local", "uploading") for c in cks),
          "pause waited for the uploads: %r" % cks)
    last = max((c for c in cks if c["state"] == "committed"), key=lambda c: c["step"])
    jobdir = os.path.join(srv.data_dir, "jobs", str(j2))
    subprocess.run(["rm", "-rf", jobdir], check=True)
    check(srv.post("/jobs/%d/resume" % j2).status == 202, "resume accepted")
    srv.wait_state(j2, "succeeded", timeout=120)
    started = [e[2]["data"] for e in srv.all_events(j2) if e[1] == "started"]
    check(started[-1].get("resumed_from_step") == last["step"],
          "resumed from the downloaded step %d: %r" % (last["step"], started[-1]))
    check(os.path.exists(os.path.join(jobdir, last["dir"], "MANIFEST.json")),
          "the checkpoint was downloaded into the job directory")
    with open(srv.log_path) as f:
        check("downloaded from the store and verified" in f.read(), "the log says so")

    no_secret(srv, jid, S3_SECRET)
    no_secret(srv, j2, S3_SECRET)

    # Purge deletes the remote copies.
    r = srv.request("DELETE", "/jobs/%d?purge=1" % jid)
    check(r.status == 204, "purge: %r" % r)
    check(s3_keys(url, "s3://ckpts/runs/job-%d/" % jid) == [], "nothing left after purge")


def s3_fault_and_kill9():
    url, proc = H.start_s3rver(["ckpts"])
    port = int(url.rsplit(":", 1)[1])
    srv = new_server(lambda d: s3_config(d, url), "--upload-workers", "1", "--upload-wait", "30")
    model, train = inputs(srv, {"step_ms": 30})

    # Emulator down after the submit (which probed it): the upload fails
    # with a reason and is retried; success waits for the retries up to
    # --upload-wait, and a job whose final checkpoint is still not in the
    # store then ends failed, saying so (never "succeeded").
    slow6 = T.model_dir(srv.tmp, {"step_ms": 400}, name="slow6")
    s = T.spec(slow6, train, max_steps=6,
               checkpoint={"every_steps": 6, "store": "s3://ckpts/runs"})
    jid = srv.submit(s)["id"]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    cks = wait_for(lambda: [c for c in checkpoints(srv, jid) if c["state"] == "failed"], 90,
                   "a failed upload")
    check(cks[0]["error"] and "attempt 1" in cks[0]["error"], "failure has a reason: %r" % cks[0])
    j = srv.wait_state(jid, ["succeeded", "failed"], timeout=90)
    check(j["state"] == "failed" and "step-000006 is not in s3://ckpts/runs" in j["error"] and
          "stays queued" in j["error"], "the job says its final checkpoint is not stored: %r" % j)
    # The same emulator comes back on the same port (fresh data): retried → committed.
    d = H.tmpdir("s3rver-again")
    os.makedirs(os.path.join(d, "data"))
    p2 = H.spawn([H.need_node_tool("s3rver"), "-d", os.path.join(d, "data"), "-a", "127.0.0.1",
                  "-p", str(port), "--silent", "--no-vhost-buckets", "--configure-bucket", "ckpts"],
                 os.path.join(d, "log"))
    H.wait_port(port, p2, "s3rver")
    wait_for(lambda: all(c["state"] == "committed" for c in checkpoints(srv, jid)), 90,
             "the retried upload commits")
    check(any(k.endswith("MANIFEST.json") for k in s3_keys(url, "s3://ckpts/runs/job-%d/" % jid)),
          "manifest in the bucket after the retry")

    # kill -9 mid-upload: a stalled emulator keeps the upload running (it
    # stops after the submit's probe; a checkpoint before that commits and
    # a later one stalls).
    slow = T.model_dir(srv.tmp, {"step_ms": 100}, name="slow")
    s2 = T.spec(slow, train, max_steps=12,
                checkpoint={"every_steps": 3, "store": "s3://ckpts/runs"})
    j2 = srv.submit(s2)["id"]
    os.killpg(p2.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: any(c["state"] == "uploading" for c in checkpoints(srv, j2)), 60,
                 "an upload in flight")
        srv.kill9()
    finally:
        os.killpg(p2.pid, signal.SIGCONT)
    srv.start()
    wait_for(lambda: (lambda cs: len(cs) >= 2 and all(c["state"] == "committed" for c in cs))(
        checkpoints(srv, j2)), 120, "the queue resumed after the restart")
    srv.wait_state(j2, "succeeded", timeout=120)

    # Pause waits for a stalled upload at most --upload-wait, then cancels
    # it (it stays queued) and says so; the upload commits later.
    srv.stop()
    srv.extra += ["--upload-wait", "2"]
    srv.start()
    j3 = srv.submit(T.spec(slow, train, max_steps=300,
                           checkpoint={"every_steps": 2, "store": "s3://ckpts/runs"}))["id"]
    os.killpg(p2.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: any(c["state"] == "uploading" for c in checkpoints(srv, j3)), 60,
                 "an upload of job %d in flight" % j3)
        check(srv.post("/jobs/%d/pause" % j3).status == 202, "pause accepted")
        srv.wait_state(j3, "paused", timeout=60)
        with srv.events(j3, from_=0) as sse:  # a paused job's stream stays open
            evs = sse.read_until_end(30, stop=lambda e: e[1] == "state" and
                                     e[2]["data"]["to"] == "paused")
        reason = evs[-1][2]["data"]["reason"]
        check("was cancelled and stays queued" in reason, "pause reason: %r" % reason)
    finally:
        os.killpg(p2.pid, signal.SIGCONT)
    wait_for(lambda: all(c["state"] == "committed" for c in checkpoints(srv, j3)), 120,
             "the cancelled uploads commit once the emulator answers")
    no_secret(srv, j2, S3_SECRET)
    no_secret(srv, j3, S3_SECRET)


def azure_upload():
    sys.path.insert(0, os.path.join(HERE, "..", "storage"))
    import test_azure as A  # the SharedKey REST helper of the storage tests
    endpoint, _ = H.start_azurite()
    status, _, body = A.rest(endpoint, "PUT", "/ckpts", {"restype": "container"})
    check(status == 201, "container created: %r" % body[:200])
    conn = ("DefaultEndpointsProtocol=http;AccountName=%s;AccountKey=%s;BlobEndpoint=%s;"
            % (H.AZURITE_ACCOUNT, H.AZURITE_KEY, endpoint))

    def conf(d):
        path = os.path.join(d, "serve.conf")
        with open(path, "w") as f:
            f.write("azure-connection-string = \"%s\"\n" % conn)
        return path
    srv = new_server(conf)
    # A secret is refused as a flag (ps would show it).
    r = subprocess.run([T.TRAINYARD, "serve", "--azure-key", "x"], capture_output=True, text=True)
    check(r.returncode != 0 and "config" in r.stderr, "secret flag refused: %r" % r.stderr)
    model, train = inputs(srv, {"step_ms": 30})
    s = T.spec(model, train, max_steps=8,
               checkpoint={"every_steps": 4, "keep_last": 1, "store": "az://ckpts/runs"})
    jid = srv.submit(s)["id"]
    srv.wait_state(jid, "succeeded", timeout=120)
    cks = standing(checkpoints(srv, jid))
    check(len(cks) == 1 and cks[0]["state"] == "committed" and cks[0]["step"] == 8,
          "one committed checkpoint: %r" % cks)

    def blobs():
        st, _, b = A.rest(endpoint, "GET", "/ckpts", {"restype": "container", "comp": "list",
                                                     "prefix": "runs/job-%d/" % jid})
        check(st == 200, "list blobs: %r" % b[:200])
        return sorted(re.findall(r"<Name>([^<]+)</Name>", b.decode()))
    wait_for(lambda: [n for n in blobs() if n.endswith("MANIFEST.json")] ==
             ["runs/job-%d/checkpoints/step-000008/MANIFEST.json" % jid], 60,
             "only the newest manifest in Azurite")
    no_secret(srv, jid, H.AZURITE_KEY)


def remote_inputs():
    url, _ = H.start_s3rver(["ckpts"])
    srv = new_server(lambda d: s3_config(d, url))
    model, train = inputs(srv, {"step_ms": 10})
    for local, key in ((os.path.join(model, "fixture.json"), "models/m1/fixture.json"),
                       (train, "data/train.jsonl")):
        r = aws(url, "s3", "cp", local, "s3://ckpts/" + key)
        check(r.returncode == 0, "aws s3 cp: %s" % r.stderr)
    s = T.spec("s3://ckpts/models/m1", "s3://ckpts/data/train.jsonl", max_steps=3)
    jid = srv.submit(s)["id"]
    srv.wait_state(jid, "succeeded", timeout=60)
    with open(os.path.join(srv.data_dir, "jobs", str(jid), "spec.json")) as f:
        eng = json.load(f)
    cache = os.path.join(srv.data_dir, "cache")
    check(eng["model"]["path"].startswith(cache) and eng["dataset"]["train"].startswith(cache),
          "the engine got cached local paths: %r" % eng["model"])
    check(os.path.exists(os.path.join(eng["model"]["path"], "fixture.json")), "model dir cached")
    check(srv.job(jid)["spec"]["model"]["path"] == "s3://ckpts/models/m1", "the API keeps the URI")
    # A second job reuses the cache (same URI and ETag).
    j2 = srv.submit(s)["id"]
    srv.wait_state(j2, "succeeded", timeout=60)
    with open(os.path.join(srv.data_dir, "jobs", str(j2), "spec.json")) as f:
        check(json.load(f)["model"]["path"] == eng["model"]["path"], "same cache entry")
    # A missing object fails the start with a clear reason.
    j3 = srv.submit(T.spec("s3://ckpts/models/m1", "s3://ckpts/data/missing.jsonl",
                           max_steps=3))["id"]
    j = srv.wait_state(j3, "failed", timeout=60)
    check("dataset.train" in j["error"] and "missing.jsonl" in j["error"], "reason: %r" % j["error"])
    no_secret(srv, jid, S3_SECRET)


def fetch_off_scheduler():
    """Downloads run on a fetch thread: while one job fetches from a stalled
    emulator, another job starts and runs on the other CPU slot; the
    fetching job holds its slot, a cancel answers 202 and lands in
    cancelled, a pause lands in paused, neither leaks its slot or a partial
    file, and the paused job resumes once the emulator answers."""
    url, proc = H.start_s3rver(["ckpts"])
    srv = new_server(lambda d: s3_config(d, url), "--cpu-slots", "2")
    model, train = inputs(srv, {"step_ms": 10})
    r = aws(url, "s3", "cp", train, "s3://ckpts/data/slow.jsonl")
    check(r.returncode == 0, "aws s3 cp: %s" % r.stderr)
    remote = T.spec(model, "s3://ckpts/data/slow.jsonl", max_steps=3)
    local = T.spec(model, train, max_steps=3)

    def fetching(jid):
        """Is the job starting, its newest state event saying it fetches?"""
        if srv.job(jid)["state"] != "starting":
            return None
        con = sqlite3.connect("file:%s?mode=ro" % os.path.join(srv.data_dir, "trainyard.db"),
                              uri=True, timeout=10)
        try:
            row = con.execute("select data from job_events where job_id = ? and type = 'state' "
                              "order by seq desc limit 1", (jid,)).fetchone()
        finally:
            con.close()
        st = json.loads(row[0])
        return st["to"] == "starting" and "fetching inputs" in st["reason"]

    # A stopped emulator accepts connections and never answers: a download
    # that takes as long as the test wants (the client's stall timeout and
    # retries take minutes to give up).
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        a = srv.submit(remote)["id"]
        wait_for(lambda: fetching(a), 30, "job %d starting, fetching its dataset" % a)
        b = srv.submit(local)["id"]
        srv.wait_state(b, "succeeded", timeout=60)
        check(srv.job(a)["state"] == "starting", "job %d still fetching: %r" % (a, srv.job(a)))
        c = srv.submit(remote)["id"]
        wait_for(lambda: fetching(c), 30, "job %d starting, fetching its dataset" % c)
        # Both CPU slots are held by the fetching jobs.
        d = srv.submit(local)["id"]
        check(srv.job(d)["state"] == "queued", "no free slot for job %d" % d)
        r = srv.post("/jobs/%d/cancel" % a)
        check(r.status == 202, "cancel of a fetching job: %r" % r)
        ja = srv.wait_state(a, "cancelled", timeout=30)
        with srv.events(a, from_=0) as sse:
            evs = sse.read_until_end(10)
        reason = [e for e in evs if e[1] == "state"][-1][2]["data"]["reason"]
        check("while fetching inputs" in reason, "cancel reason: %r" % reason)
        check(ja["finished_at"], "cancelled job finished: %r" % ja)
        # A's slot is free again: D starts and runs while C still fetches.
        srv.wait_state(d, "succeeded", timeout=60)
        check(srv.job(c)["state"] == "starting", "job %d still fetching" % c)
        r = srv.post("/jobs/%d/pause" % c)
        check(r.status == 202, "pause of a fetching job: %r" % r)
        srv.wait_state(c, "paused", timeout=30)
    finally:
        os.killpg(proc.pid, signal.SIGCONT)
    parts = [os.path.join(dp, f) for dp, ds, fs in os.walk(srv.data_dir) for f in ds + fs
             if f.endswith(".part")]
    check(not parts, "no partial download left: %r" % parts)
    # Both slots are free: the paused job resumes (its download now
    # completes) beside a new local job.
    check(srv.post("/jobs/%d/resume" % c).status == 202, "resume accepted")
    e = srv.submit(local)["id"]
    srv.wait_state(c, "succeeded", timeout=90)
    srv.wait_state(e, "succeeded", timeout=60)
    with open(os.path.join(srv.data_dir, "jobs", str(c), "spec.json")) as f:
        check(json.load(f)["dataset"]["train"].startswith(os.path.join(srv.data_dir, "cache")),
              "the resumed job got the cached dataset")
    no_secret(srv, c, S3_SECRET)

    # The resume download of a checkpoint whose local files are gone is
    # fetched the same way; a cancel removes the half-made directory.
    slow = T.model_dir(srv.tmp, {"step_ms": 150}, name="slow")
    g = srv.submit(T.spec(slow, train, max_steps=200,
                          checkpoint={"every_steps": 3, "store": "s3://ckpts/runs"}))["id"]
    wait_for(lambda: any(k["state"] == "committed" for k in checkpoints(srv, g)), 60,
             "a committed checkpoint of job %d" % g)
    check(srv.post("/jobs/%d/pause" % g).status == 202, "pause accepted")
    srv.wait_state(g, "paused", timeout=60)
    jobdir = os.path.join(srv.data_dir, "jobs", str(g))
    subprocess.run(["rm", "-rf", jobdir], check=True)
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        check(srv.post("/jobs/%d/resume" % g).status == 202, "resume accepted")
        wait_for(lambda: fetching(g), 30, "job %d starting, fetching its checkpoint" % g)
        h = srv.submit(local)["id"]
        srv.wait_state(h, "succeeded", timeout=60)
        check(srv.post("/jobs/%d/cancel" % g).status == 202, "cancel of a fetching resume")
        srv.wait_state(g, "cancelled", timeout=30)
    finally:
        os.killpg(proc.pid, signal.SIGCONT)
    left = os.listdir(os.path.join(jobdir, "checkpoints")) if os.path.isdir(
        os.path.join(jobdir, "checkpoints")) else []
    check(left == [], "no half-downloaded checkpoint directory: %r" % left)


if __name__ == "__main__":
    T.run_tests({"s3_upload_retention_resume": s3_upload_retention_resume,
                 "s3_fault_and_kill9": s3_fault_and_kill9,
                 "azure_upload": azure_upload,
                 "remote_inputs": remote_inputs,
                 "fetch_off_scheduler": fetch_off_scheduler})
