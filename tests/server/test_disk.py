#!/usr/bin/python3
"""test_disk.py — a full disk never misreports and never locks the operator out.

The data directory lives on a small tmpfs the test mounts (root only; the
cases exit 77, ctest's SKIP, where mounting is impossible) and fills with a
file of its own. Fake engine. Cases (ctest server_disk.NAME):
  engine_dies  engines die while a filler keeps the disk full, so their final
               states cannot be written (the reserve it frees is eaten too):
               the API shows them failed / queued while the rows still say
               running; cancel of the failed one is 409, of the requeued one
               202 cancelled; lists filter by the shown state; DELETE waits
               (409); once space returns the rows say the same.
  delete_full  at 0 bytes free DELETE of a finished job is 204: the reserve
               makes room for the row, its directory goes, the reserve comes
               back; with no reserve left the job's files go first and make
               the room; a directory left without its job is removed at start.
  restart_full a server killed with a job running restarts on a full disk with
               no reserve and the job runs to the end once space returns; one
               stopped cleanly restarts read-only (/healthz), GETs work,
               submit is 503 disk_full, a DELETE frees its job's files and
               the room makes the server writable again without a restart.

TY_BIN and TY_FAKE_ENGINE name the binaries.
"""
import os
import sqlite3
import subprocess
import threading
import time

import tyharness as T
from tyharness import check, engine_pids, run_tests, setup, spec, tmpdir, wait_for


# ---------------------------------------------------------------- helpers

def mount_tmpfs(size="24m"):
    if os.geteuid() != 0:
        print("skipped: mounting a tmpfs needs root")
        raise SystemExit(77)
    mnt = os.path.join(tmpdir("ty-disk-"), "mnt")
    os.makedirs(mnt)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s,mode=0700" % size, "tmpfs", mnt],
                       capture_output=True)
    if r.returncode != 0:
        print("skipped: cannot mount a tmpfs: %s" % r.stderr.decode(errors="replace"))
        raise SystemExit(77)
    T._cleanup.append(lambda: subprocess.run(["umount", "-l", mnt], capture_output=True))
    return mnt


def free_bytes(path):
    v = os.statvfs(path)
    return v.f_bavail * v.f_frsize


def fill(path):
    """Appends to path until the disk is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


class Filler:
    """Keeps the disk full: whatever space appears (the server's reserve)
    is taken again at once, until stop()."""

    def __init__(self, path):
        self.path, self.done = path, threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.done.is_set():
            fill(self.path)
            time.sleep(0.005)

    def stop(self):
        self.done.set()
        self.t.join()
        os.unlink(self.path)


def row_state(srv, jid):
    con = sqlite3.connect("file:%s?mode=ro" % os.path.join(srv.data_dir, "trainyard.db"), uri=True,
                          timeout=10)
    try:
        r = con.execute("SELECT state FROM jobs WHERE id = ?", (jid,)).fetchone()
        return r[0] if r else None
    finally:
        con.close()


def health(srv):
    r = srv.get("/healthz")
    check(r.status == 200, "/healthz: %r" % r)
    return r.json


def server_on(mnt, fixture, *extra):
    srv, model, train = setup(fixture, "--cpu-slots", "2", *extra, data_dir=os.path.join(mnt, "data"))
    wait_for(lambda: health(srv)["disk_reserve"], 10, "the reserve to be taken at start")
    return srv, model, train


def ids_listed(srv, state):
    r = srv.get("/jobs?state=" + state)
    check(r.status == 200, "GET /jobs?state=%s: %r" % (state, r))
    return {j["id"] for j in r.json["jobs"]}


# ---------------------------------------------------------------- cases

def test_engine_dies():
    """Engines that die on a full disk are shown by their outcome at once."""
    mnt = mount_tmpfs()
    srv, model, train = server_on(mnt, {"step_ms": 100, "stderr_lines": 0})
    body = dict(checkpoint={"every_steps": 100000})
    a = srv.submit(spec(model, train, max_steps=100000, max_restarts=0, **body))["id"]
    b = srv.submit(spec(model, train, max_steps=100000, max_restarts=3, **body))["id"]
    for j in (a, b):
        srv.wait_state(j, "running", 30)
    # The reserve already spent: no write can land until the filler stops.
    filler = Filler(os.path.join(mnt, "filler"))
    os.unlink(os.path.join(srv.data_dir, "disk-reserve"))
    wait_for(lambda: free_bytes(mnt) == 0, 10, "the disk to fill")
    for pid in engine_pids(srv.data_dir):
        os.kill(pid, 9)
    ja = srv.wait_state(a, "failed", 10)
    check("without a terminal event" in (ja["error"] or ""), "the failure says why: %r" % ja["error"])
    check(ja["gpus"] == [] and ja["finished_at"], "a failed job holds nothing: %r" % ja)
    srv.wait_state(b, "queued", 10)
    wait_for(lambda: "cannot record" in srv.log_text(), 10, "the server to log the failed write")
    check(row_state(srv, a) == "running" and row_state(srv, b) == "running",
          "the rows are still running (the writes cannot land): %s %s" % (row_state(srv, a), row_state(srv, b)))
    r = srv.post("/jobs/%d/cancel" % a)
    check(r.status == 409 and "failed" in r.json["error"]["message"], "cancel of the failed job: %r" % r)
    r = srv.post("/jobs/%d/cancel" % b)
    check(r.status == 202 and r.json["state"] == "cancelled", "cancel of the requeued job: %r" % r)
    check(srv.job(b)["state"] == "cancelled", "shown cancelled")
    check(not ids_listed(srv, "running") & {a, b}, "neither is listed running")
    check(a in ids_listed(srv, "failed") and b in ids_listed(srv, "cancelled"), "listed by shown state")
    prom = srv.get("/metrics").body.decode()
    check('trainyard_jobs{state="running"} 0' in prom, "/metrics counts none running:\n%s" % prom[:800])
    r = srv.request("DELETE", "/jobs/%d" % a)
    check(r.status == 409, "DELETE while the final state is unwritten: %r" % r)
    check(srv.post("/jobs", spec(model, train)).status == 503, "submit on a full disk")
    filler.stop()
    wait_for(lambda: row_state(srv, a) == "failed" and row_state(srv, b) == "cancelled", 20,
             "the final states to land once space returns")
    check(srv.job(a)["state"] == "failed" and srv.job(b)["state"] == "cancelled", "the rows and API agree")
    wait_for(lambda: health(srv)["disk_reserve"], 10, "the reserve to come back")
    srv.stop()


def test_delete_full():
    """DELETE frees a job at 0 bytes free; a job directory without a row goes at start."""
    mnt = mount_tmpfs()
    # Each job exports 2 MiB: files whose removal makes room.
    srv, model, train = server_on(mnt, {"step_ms": 5, "export_bytes": 2 << 20})
    jid = srv.submit(spec(model, train, max_steps=5))["id"]
    srv.wait_state(jid, "succeeded", 30)
    jobdir = os.path.join(srv.data_dir, "jobs", str(jid))
    check(os.path.isdir(jobdir), "the job has a directory")
    fill(os.path.join(mnt, "filler"))
    check(free_bytes(mnt) == 0, "the disk is full")
    r = srv.post("/jobs", spec(model, train))
    check(r.status == 503 and r.json["error"]["code"] == "disk_full", "submit on a full disk: %r" % r)
    r = srv.request("DELETE", "/jobs/%d" % jid)
    check(r.status == 204, "DELETE at 0 bytes free: %r" % r)
    check(not os.path.exists(jobdir), "its directory is gone")
    check(srv.get("/jobs/%d" % jid).status == 404, "its row is gone")
    os.unlink(os.path.join(mnt, "filler"))
    wait_for(lambda: health(srv)["disk_reserve"], 10, "the reserve to come back once there is room")
    # No reserve left either: the job's files go first and make the room.
    big = srv.submit(spec(model, train, max_steps=3))["id"]
    srv.wait_state(big, "succeeded", 30)
    os.unlink(os.path.join(srv.data_dir, "disk-reserve"))
    fill(os.path.join(mnt, "filler"))
    check(free_bytes(mnt) == 0, "the disk is full again")
    r = srv.request("DELETE", "/jobs/%d" % big)
    check(r.status == 204, "DELETE without a reserve: %r" % r)
    check(not os.path.exists(os.path.join(srv.data_dir, "jobs", str(big))), "its directory is gone")
    check(srv.get("/jobs/%d" % big).status == 404, "its row is gone")
    os.unlink(os.path.join(mnt, "filler"))
    # A delete that stopped between the row and the directory; and a
    # directory of an id this database never gave out, left alone.
    orphan = os.path.join(srv.data_dir, "jobs", str(jid))
    os.makedirs(os.path.join(orphan, "checkpoints"))
    foreign = os.path.join(srv.data_dir, "jobs", "4242")
    os.makedirs(foreign)
    j2 = srv.submit(spec(model, train, max_steps=3))["id"]
    srv.wait_state(j2, "succeeded", 30)
    srv.stop()
    srv.start()
    check(not os.path.exists(orphan), "a directory without a job is removed at start")
    check(os.path.isdir(foreign), "a directory beyond the ids given out stays")
    check(os.path.isdir(os.path.join(srv.data_dir, "jobs", str(j2))), "a job's own directory stays")
    check(srv.job(j2)["state"] == "succeeded", "the job is intact")
    srv.stop()


def restart_full_disk(srv, mnt, how):
    """Stops the server (kill -9 or SIGTERM), spends its reserve, fills the disk, starts it."""
    srv.kill9() if how == "kill" else srv.stop()
    T.kill_engines(srv.data_dir)
    os.unlink(os.path.join(srv.data_dir, "disk-reserve"))
    fill(os.path.join(mnt, "filler"))
    srv.start()


def test_restart_full():
    """Restarts on a full disk: jobs never shown running, read-only when need be, writable again."""
    mnt = mount_tmpfs()
    srv, model, train = server_on(mnt, {"step_ms": 50, "stderr_lines": 0, "export_bytes": 2 << 20})
    jid = srv.submit(spec(model, train, max_steps=40))["id"]
    srv.wait_state(jid, "running", 30)
    # Killed: the database's -shm and -wal are left, so it opens read-write
    # (its writes land while the WAL file has room, else are retried).
    restart_full_disk(srv, mnt, "kill")
    check(health(srv)["storage"] == "read_write", "opens read-write with its -shm left")
    r = srv.post("/jobs", spec(model, train))
    check(r.status == 503 and r.json["error"]["code"] == "disk_full", "submit on a full disk: %r" % r)
    os.unlink(os.path.join(mnt, "filler"))
    srv.wait_state(jid, "succeeded", 60)
    # Stopped cleanly: SQLite must set up its -shm again, which a full disk
    # refuses: read-only until space is freed.
    restart_full_disk(srv, mnt, "stop")
    h = health(srv)
    check(h["storage"] == "read_only" and h["disk_free_bytes"] == 0 and not h["disk_reserve"],
          "/healthz says read-only: %r" % h)
    check("serving read-only" in open(srv.log_path, errors="replace").read(), "the log says read-only")
    check(srv.job(jid)["state"] == "succeeded", "GET /jobs/{id} works")
    check(jid in ids_listed(srv, "succeeded"), "GET /jobs works")
    r = srv.post("/jobs", spec(model, train))
    check(r.status == 503 and r.json["error"]["code"] == "disk_full", "submit read-only: %r" % r)
    # DELETE frees the job's files, which lets the database open read-write.
    r = srv.request("DELETE", "/jobs/%d" % jid)
    check(r.status == 204, "delete read-only: %r" % r)
    check(not os.path.exists(os.path.join(srv.data_dir, "jobs", str(jid))), "its files are gone")
    check(srv.get("/jobs/%d" % jid).status == 404, "its row is gone")
    check(health(srv)["storage"] == "read_write", "writable once the delete made room")
    os.unlink(os.path.join(mnt, "filler"))
    j2 = srv.submit(spec(model, train, max_steps=3))["id"]
    srv.wait_state(j2, "succeeded", 60)
    srv.stop()


def upload_states(srv, immutable=False):
    """The upload queue's rows (a done one is removed), read beside the server
    (immutable: the main file alone, where a full disk has no room for -shm)."""
    con = sqlite3.connect("file:%s?%s" % (os.path.join(srv.data_dir, "trainyard.db"),
                                          "immutable=1" if immutable else "mode=ro"),
                          uri=True, timeout=10)
    try:
        return [r[0] for r in con.execute("select state from uploads order by id")]
    finally:
        con.close()


def test_restart_full_uploads():
    """Uploads a server left running are queued again when a read-only start
    (full disk) gets room, not only at the next start."""
    mnt = mount_tmpfs()
    stores = tmpdir("stores")  # off the full disk: the uploads themselves have room
    srv, model, train = server_on(mnt, {"step_ms": 20}, "--store-roots", stores)
    ck = {"every_steps": 2, "store": "file://%s/s" % stores}
    jid = srv.submit(spec(model, train, max_steps=4, checkpoint=ck))["id"]
    srv.wait_state(jid, "succeeded", 60)
    wait_for(lambda: srv.get("/jobs/%d/checkpoints" % jid).json["checkpoints"] and
             all(c["state"] == "committed" for c in
                 srv.get("/jobs/%d/checkpoints" % jid).json["checkpoints"]), 60, "the uploads")
    srv.stop()
    # The newest checkpoint's upload as a server killed mid-upload leaves it
    # (a done row is removed from the queue).
    con = sqlite3.connect(os.path.join(srv.data_dir, "trainyard.db"))
    con.execute("insert into uploads(checkpoint_id, file, uri, op, state) select id,"
                " coalesce(local_path, dir), ?, 'put', 'running' from checkpoints"
                " where job_id = ? order by step desc limit 1", (ck["store"], jid))
    con.commit()
    con.close()
    os.unlink(os.path.join(srv.data_dir, "disk-reserve"))
    fill(os.path.join(mnt, "filler"))
    srv.start()
    check(health(srv)["storage"] == "read_only", "read-only on the full disk")
    time.sleep(1.5)
    left = upload_states(srv, immutable=True)
    check(left == ["running"], "nothing to queue it again with yet: %s" % left)
    os.unlink(os.path.join(mnt, "filler"))
    wait_for(lambda: health(srv)["storage"] == "read_write", 30, "the database writable again")
    wait_for(lambda: upload_states(srv) == [], 60, "the interrupted upload queued again and done")
    check("interrupted by the last shutdown are queued again" in
          open(srv.log_path, errors="replace").read(), "the log says so")
    srv.stop()


TESTS = {"engine_dies": test_engine_dies, "delete_full": test_delete_full,
         "restart_full": test_restart_full, "restart_full_uploads": test_restart_full_uploads}

if __name__ == "__main__":
    run_tests(TESTS)
