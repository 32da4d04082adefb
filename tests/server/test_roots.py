"""test_roots.py — roots are a boundary and model.init is
checked at submit, against the real daemon and the real engine.

Each case is one function, run as `test_roots.py <case>` by ctest
(server.roots_*). Attacks tried: /etc/shadow and the server's cwd with the
default roots; a symlink swapped in while the job is queued; a FIFO and
/dev/zero as datasets; a file:// store outside the store roots, also
through a symlink swapped in later; cloud credentials in the server's
environment; files that are not what they claim (a credentials file, a
SQLite database) whose content must not reach any error message; the data
directory's and database's modes. Python is /usr/bin/python3, stdlib only.
"""
import json
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tyharness as H  # noqa: E402
from tyharness import check, fail, wait_for  # noqa: E402

REAL_ENGINE = os.environ.get("TY_ENGINE", "")

TINY = {"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 32,
        "vocab_size": 64}
CREDS = "[default]\naws_access_key_id = AKIAROOTSTEST\naws_secret_access_key = s3cr3tW0RD\n"
SECRET_WORDS = ("default", "AKIAROOTSTEST", "s3cr3tW0RD", "SQLite", "near '")


def need_engine():
    check(REAL_ENGINE and os.access(REAL_ENGINE, os.X_OK), "TY_ENGINE must name trainyard-engine")


def write_tokens(path, rows=32):
    with open(path, "w") as f:
        for i in range(rows):
            f.write(json.dumps({"input_ids": [(i + j) % 64 for j in range(20)]}) + "\n")


def real_spec(train, steps=4, **kw):
    s = {"model": {"init": dict(TINY)}, "dataset": {"train": train, "format": "tokens"},
         "hyperparameters": {"max_steps": steps, "batch_size": 1, "seq_len": 16, "log_every_steps": 1}}
    s.update(kw)
    return s


def kill_all_engines(data_dir):
    """Engines (real or fake) whose command line names data_dir."""
    H.kill_engines(data_dir, (b"ty-fake-engine", b"trainyard-engine"))


class RealServer(H.Server):
    """The daemon with the real engine. roots=None here means: no
    --allowed-roots at all, so the server's own default applies."""

    def __init__(self, *extra, default_roots=False, env=None, **kw):
        need_engine()
        self.default_roots = default_roots
        self.env = env
        super().__init__("--engine", REAL_ENGINE, "--cpu-slots", "1", *extra, **kw)
        H._cleanup.append(lambda: kill_all_engines(self.data_dir))

    def start(self):
        args = [H.TRAINYARD, "serve", "--listen", "127.0.0.1:%d" % self.port, "--data-dir", self.data_dir,
                "--grace", str(self.grace), "--gpus", "none"]
        if not self.default_roots:
            args += ["--allowed-roots", self.roots]
        args += self.extra
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=self.env, cwd=self.tmp)
        wait_for(lambda: self._up(), 30, "the server to answer /healthz")

    def _up(self):
        if self.proc.poll() is not None:
            fail("server exited with %d at start:\n%s" % (self.proc.returncode, self.log_text()))
        try:
            return self.request("GET", "/healthz", check_schema=False).status == 200
        except OSError:
            return False


def write_byte_tokenizer(model_dir):
    """A byte-level BPE tokenizer.json with no merges (256 byte tokens and
    an end-of-text token): enough for the engine to read text rows."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    b2u, extra = {}, 0
    for b in range(256):
        if b in keep:
            b2u[b] = chr(b)
        else:
            b2u[b] = chr(256 + extra)
            extra += 1
    eot = {"id": 256, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": False, "special": True}
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [eot], "normalizer": None,
          "pre_tokenizer": bl, "post_processor": None, "decoder": bl,
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False, "byte_fallback": False,
                    "vocab": {b2u[b]: b for b in range(256)}, "merges": []}}
    with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
        json.dump(tj, f)
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|endoftext|>", "bos_token": None, "add_bos_token": False}, f)


def rejected(srv, body, field, *words):
    r = srv.post("/jobs", body)
    check(r.status == 400, "want 400 for %s, got %r" % (json.dumps(body)[:200], r))
    e = r.json["error"]
    check(e.get("field") == field, "want field %s, got %s" % (field, e))
    for w in words:
        check(w in e["message"], "error %r should mention %r" % (e["message"], w))
    return e


def no_secrets(text, what):
    for w in SECRET_WORDS:
        check(w not in text, "%s quotes file content (%r): %s" % (what, w, text[:600]))


def failed_with(srv, jid, *words, timeout=120):
    j = srv.wait_state(jid, ["failed", "succeeded", "cancelled"], timeout=timeout)
    check(j["state"] == "failed", "job %d should fail, is %s" % (jid, j["state"]))
    msg = j.get("error") or ""
    for w in words:
        check(w in msg, "job %d error %r should mention %r" % (jid, msg, w))
    evs = json.dumps(srv.all_events(jid))
    return msg, evs


def hold_slot(srv, root):
    """A long job on the only CPU slot, so the next one stays queued."""
    train = os.path.join(root, "hold.jsonl")
    write_tokens(train)
    jid = srv.submit(real_spec(train, steps=1000000000, name="hold"))["id"]
    srv.wait_state(jid, "running", timeout=60)
    return jid


# ---------------------------------------------------------------- cases

def test_roots_default():
    """No --allowed-roots: only DATA_DIR/inputs is readable — not /etc, not
    the cwd, not /tmp; the data dir is 0700, the database 0600."""
    srv = RealServer(default_roots=True)
    inputs = os.path.join(srv.data_dir, "inputs")
    check(os.path.isdir(inputs), "DATA_DIR/inputs should be created")
    rejected(srv, real_spec("/etc/shadow"), "dataset.train", "outside the allowed roots")
    cwd_file = os.path.join(srv.tmp, "in-cwd.jsonl")  # the server runs with cwd = srv.tmp
    write_tokens(cwd_file)
    rejected(srv, real_spec(cwd_file), "dataset.train", "outside the allowed roots")
    rejected(srv, real_spec(os.path.join(srv.data_dir, "trainyard.db")), "dataset.train")
    rejected(srv, real_spec("/tmp/x.jsonl"), "dataset.train")
    good = os.path.join(inputs, "train.jsonl")
    write_tokens(good)
    jid = srv.submit(real_spec(good, steps=2))["id"]
    check(srv.wait_state(jid, ["succeeded", "failed"], timeout=120)["state"] == "succeeded",
          "a job reading DATA_DIR/inputs should succeed: %s" % srv.job(jid))
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    check(mode(srv.data_dir) == 0o700, "data dir mode %o" % mode(srv.data_dir))
    for sfx in ("", "-wal", "-shm"):
        p = os.path.join(srv.data_dir, "trainyard.db" + sfx)
        if os.path.exists(p):
            check(mode(p) == 0o600, "%s mode %o" % (p, mode(p)))


def test_roots_tighten():
    """A data dir and database made world-readable by an older version are
    tightened at start."""
    tmp = H.tmpdir()
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    os.chmod(data, 0o755)
    db = os.path.join(data, "trainyard.db")
    sqlite3.connect(db).close()
    os.chmod(db, 0o644)
    srv = RealServer(data_dir=data, roots=tmp)
    check(stat.S_IMODE(os.stat(data).st_mode) == 0o700, "data dir not tightened")
    check(stat.S_IMODE(os.stat(db).st_mode) == 0o600, "database not tightened")
    srv.stop()
    # `trainyard token create` on a fresh data dir makes it private too.
    fresh = os.path.join(tmp, "fresh")
    r = subprocess.run([H.TRAINYARD, "token", "create", "ci", "--data-dir", fresh], capture_output=True,
                       timeout=60)
    check(r.returncode == 0, "token create: %r" % r.stderr)
    check(stat.S_IMODE(os.stat(fresh).st_mode) == 0o700, "token create's data dir is not 0700")
    check(stat.S_IMODE(os.stat(os.path.join(fresh, "trainyard.db")).st_mode) == 0o600,
          "token create's database is not 0600")


def test_roots_symlink_swap():
    """Checked at submit, swapped while queued: the engine re-checks and
    refuses /etc/passwd, and the error quotes none of it."""
    root = H.tmpdir()
    srv = RealServer(roots=root)
    link = os.path.join(root, "link.jsonl")
    os.symlink("/etc/passwd", link)
    rejected(srv, real_spec(link), "dataset.train", "outside the allowed roots")
    os.unlink(link)
    hold = hold_slot(srv, root)
    train = os.path.join(root, "train.jsonl")
    write_tokens(train)
    jid = srv.submit(real_spec(train, steps=2))["id"]
    check(srv.job(jid)["state"] == "queued", "the second job should wait for the slot")
    os.unlink(train)
    os.symlink("/etc/passwd", train)
    check(srv.post("/jobs/%d/cancel" % hold).status in (200, 202), "cancel the slot holder")
    msg, evs = failed_with(srv, jid, "outside the allowed roots")
    for w in ("root:x:", "/bin/sh", "/usr/sbin/nologin"):
        check(w not in msg and w not in evs, "passwd content leaked: %r" % w)


def test_roots_special_files():
    """A FIFO or a device as dataset: 400 at submit when it is there
    already; the engine refuses one swapped in later at once, it does not
    block; on its own (no server) it refuses /dev/zero and a FIFO."""
    srv = RealServer()
    fifo = os.path.join(srv.tmp, "fifo.jsonl")
    os.mkfifo(fifo)
    rejected(srv, real_spec(fifo), "dataset.train", "FIFO")
    hold = hold_slot(srv, srv.tmp)
    train = os.path.join(srv.tmp, "later.jsonl")
    write_tokens(train)
    jid = srv.submit(real_spec(train, steps=2))["id"]
    os.unlink(train)
    os.mkfifo(train)
    check(srv.post("/jobs/%d/cancel" % hold).status in (200, 202), "cancel the slot holder")
    failed_with(srv, jid, "FIFO")

    # The engine alone: the same refusals, with an error event and exit != 0.
    work = os.path.join(srv.tmp, "work")
    os.makedirs(work)
    for path, word in ((fifo, "FIFO"), ("/dev/zero", "character device")):
        spec_path = os.path.join(work, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(real_spec(path, steps=1), f)
        p = subprocess.run([REAL_ENGINE, "--spec", spec_path, "--workdir", work], capture_output=True,
                           timeout=120)
        out = p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")
        check(p.returncode != 0, "engine should fail on %s: %s" % (path, out[-800:]))
        check('"error"' in out and word in out, "engine error should say %s: %s" % (word, out[-800:]))


def test_roots_file_store():
    """file:// checkpoint stores: outside --store-roots is a 400; a symlink
    swapped into the store path while the job is queued writes nothing
    outside; inside, checkpoints land."""
    srv = RealServer("--upload-attempts", "1")
    stores = os.path.join(srv.data_dir, "stores")
    outside = os.path.join(srv.tmp, "outside")
    os.makedirs(outside)
    train = os.path.join(srv.tmp, "train.jsonl")
    write_tokens(train)
    ck = {"every_steps": 1}
    rejected(srv, real_spec(train, checkpoint=dict(ck, store="file://" + outside)), "checkpoint.store",
             "outside the store roots")
    rejected(srv, real_spec(train, checkpoint=dict(ck, store="file:///anywhere/x")), "checkpoint.store")
    os.symlink(outside, os.path.join(stores, "link"))
    rejected(srv, real_spec(train, checkpoint=dict(ck, store="file://%s/link/x" % stores)),
             "checkpoint.store")
    os.unlink(os.path.join(stores, "link"))

    def uploads_settled(job):
        cps = srv.get("/jobs/%d/checkpoints" % job).json["checkpoints"]
        return all(c["state"] in ("committed", "failed", "deleted") for c in cps) and (cps or [{}])

    good = srv.submit(real_spec(train, steps=2, checkpoint=dict(ck, store="file://%s/ok" % stores)))["id"]
    check(srv.wait_state(good, ["succeeded", "failed"], timeout=120)["state"] == "succeeded", "good job")
    wait_for(lambda: uploads_settled(good), 120, "the good job's uploads")
    cps = srv.get("/jobs/%d/checkpoints" % good).json["checkpoints"]
    check(cps and all(c["state"] == "committed" for c in cps), "uploads inside the root: %s" % cps)
    check(any(files for _, _, files in os.walk(os.path.join(stores, "ok"))), "objects under the store root")

    hold = hold_slot(srv, srv.tmp)
    jid = srv.submit(real_spec(train, steps=2, checkpoint=dict(ck, store="file://%s/swap/x" % stores)))["id"]
    # The store may have been probed at submit (a directory made there):
    # the swap replaces whatever is there by a link out of the roots.
    shutil.rmtree(os.path.join(stores, "swap"), ignore_errors=True)
    os.symlink(outside, os.path.join(stores, "swap"))
    check(srv.post("/jobs/%d/cancel" % hold).status in (200, 202), "cancel the slot holder")
    srv.wait_state(jid, ["succeeded", "failed"], timeout=120)

    wait_for(lambda: uploads_settled(jid), 120, "the swapped store's uploads to settle")
    leaked = [os.path.join(d, f) for d, _, fs in os.walk(outside) for f in fs]
    check(not leaked and not os.listdir(outside), "written outside the store roots: %s" % leaked)


def test_roots_engine_env():
    """The engine's environment is allow-listed: the server's cloud
    credentials and CLI token are not in /proc/<engine>/environ."""
    env = dict(os.environ, AWS_SECRET_ACCESS_KEY="awsSECRETvalue", AWS_ACCESS_KEY_ID="AKIAENVTEST",
               AZURE_STORAGE_KEY="azureSECRETvalue", AZURE_STORAGE_CONNECTION_STRING="AccountKey=azSECRET",
               GOOGLE_APPLICATION_CREDENTIALS="/nonexistent/gcs.json", GCS_HMAC_SECRET="gcsSECRET",
               TY_TOKEN="ty_clienttoken", LC_ALL="C")
    srv = RealServer(env=env)
    jid = hold_slot(srv, srv.tmp)

    def engine_env():
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read().split(b"\0")
                if not (cmd and cmd[0] == REAL_ENGINE.encode() and any(srv.data_dir.encode() in a for a in cmd)):
                    continue
                with open("/proc/%s/environ" % pid, "rb") as f:
                    return f.read().split(b"\0")
            except OSError:
                continue
        return None
    envs = wait_for(engine_env, 30, "the engine's /proc environ")
    names = {e.split(b"=", 1)[0].decode() for e in envs if b"=" in e}
    for bad in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AZURE_STORAGE_KEY",
                "AZURE_STORAGE_CONNECTION_STRING", "GOOGLE_APPLICATION_CREDENTIALS", "GCS_HMAC_SECRET",
                "TY_TOKEN"):
        check(bad not in names, "%s reached the engine" % bad)
    blob = b"\0".join(envs)
    for v in (b"awsSECRETvalue", b"azureSECRETvalue", b"azSECRET", b"gcsSECRET", b"ty_clienttoken"):
        check(v not in blob, "a secret value reached the engine")
    for want in ("PATH", "TY_JOB_ID", "TY_RANK", "TY_ALLOWED_ROOTS", "LC_ALL"):
        check(want in names, "%s should reach the engine (got %s)" % (want, sorted(names)))
    check(srv.post("/jobs/%d/cancel" % jid).status in (200, 202), "cancel")
    srv.wait_state(jid, ["cancelled", "failed", "succeeded"], timeout=60)


def test_roots_no_content_in_errors():
    """Files that are not what the spec says they are: the errors name the
    file and what is wrong, never a word of what is in it."""
    srv = RealServer()
    root = srv.tmp
    creds = os.path.join(root, "credentials")
    with open(creds, "w") as f:
        f.write(CREDS)
    dbfile = os.path.join(root, "some.sqlite")
    con = sqlite3.connect(dbfile)
    con.execute("create table t(x)")
    con.commit()
    con.close()
    # JSONL rows: a credentials file and a database as token datasets.
    for path in (creds, dbfile):
        jid = srv.submit(real_spec(path, steps=1))["id"]
        msg, evs = failed_with(srv, jid, "not valid JSON")
        no_secrets(msg, "job error for %s" % path)
        no_secrets(evs, "events for %s" % path)
    # config.json that is a credentials file.
    m1 = os.path.join(root, "m-config")
    os.makedirs(m1)
    shutil.copy(creds, os.path.join(m1, "config.json"))
    train = os.path.join(root, "train.jsonl")
    write_tokens(train)
    jid = srv.submit({"model": {"path": m1}, "dataset": {"train": train, "format": "tokens"},
                      "hyperparameters": {"max_steps": 1, "seq_len": 16}})["id"]
    msg, evs = failed_with(srv, jid, "config.json")
    no_secrets(msg, "config.json error")
    no_secrets(evs, "config.json events")
    # model.safetensors whose header is not JSON.
    m2 = os.path.join(root, "m-st")
    os.makedirs(m2)
    with open(os.path.join(m2, "config.json"), "w") as f:
        json.dump(TINY, f)
    hdr = b"{default = s3cr3tW0RD}"
    with open(os.path.join(m2, "model.safetensors"), "wb") as f:
        f.write(len(hdr).to_bytes(8, "little") + hdr + b"\0" * 64)
    jid = srv.submit({"model": {"path": m2}, "dataset": {"train": train, "format": "tokens"},
                      "hyperparameters": {"max_steps": 1, "seq_len": 16}})["id"]
    msg, evs = failed_with(srv, jid, "header is not valid JSON")
    no_secrets(msg, "safetensors error")
    no_secrets(evs, "safetensors events")
    # tokenizer.json that is a credentials file (the engine's tokenizer CLI).
    shutil.copy(creds, os.path.join(m2, "tokenizer.json"))
    p = subprocess.run([REAL_ENGINE, "tokenize", "--model", m2], input=b"hello", capture_output=True,
                       timeout=60)
    out = (p.stdout + p.stderr).decode(errors="replace")
    check(p.returncode != 0 and "tokenizer.json" in out, "tokenize should fail naming the file: %s" % out)
    no_secrets(out, "tokenizer error")
    # Text and chat JSONL rows (the engine's dump-rows): a credentials file
    # as a text dataset, a chat row whose role is a secret.
    m3 = os.path.join(root, "m-tok")
    os.makedirs(m3)
    with open(os.path.join(m3, "config.json"), "w") as f:
        json.dump(dict(TINY, vocab_size=300), f)
    write_byte_tokenizer(m3)
    chat = os.path.join(root, "chat.jsonl")
    with open(chat, "w") as f:
        f.write(json.dumps({"messages": [{"role": "s3cr3tW0RD", "content": "x"}]}) + "\n")
    for fmt, path, word in (("text", creds, "not valid JSON"), ("chat", chat, "role")):
        spec_path = os.path.join(root, "rows-%s.json" % fmt)
        with open(spec_path, "w") as f:
            json.dump({"model": {"path": m3}, "dataset": {"train": path, "format": fmt},
                       "hyperparameters": {"max_steps": 1, "seq_len": 16}}, f)
        p = subprocess.run([REAL_ENGINE, "dump-rows", "--spec", spec_path], capture_output=True, timeout=60)
        out = (p.stdout + p.stderr).decode(errors="replace")
        check(p.returncode != 0 and word in out, "dump-rows %s should fail on %s: %s" % (fmt, path, out[-600:]))
        no_secrets(out, "%s row error" % fmt)
    srv.stop()
    no_secrets(srv.log_text(), "server log")


def test_roots_model_init():
    """model.init is checked at submit by the engine's reader: bad shapes
    are 400 naming the field; --max-params bounds the size, counted as the
    engine counts (its start event's params)."""
    srv = RealServer()
    train = os.path.join(srv.tmp, "train.jsonl")
    write_tokens(train)
    rejected(srv, real_spec(train, model={"init": dict(TINY, n_embd=-64)}), "model.init.n_embd",
             "positive integer")
    rejected(srv, real_spec(train, model={"init": dict(TINY, n_head=0)}), "model.init.n_head")
    rejected(srv, real_spec(train, model={"init": dict(TINY, n_head=3)}), "model.init.n_head", "divisible")
    rejected(srv, real_spec(train, model={"init": dict(TINY, model_type="bert")}), "model.init.model_type")
    big = {"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64}
    rejected(srv, real_spec(train, model={"init": big}), "model.init", "--max-params")
    jid = srv.submit(real_spec(train, steps=1))["id"]
    srv.wait_state(jid, "succeeded", timeout=120)
    found = []

    def walk(o):
        if isinstance(o, dict):
            if isinstance(o.get("params"), int):
                found.append(o["params"])
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
    walk(srv.all_events(jid))
    params = found[0] if found else None
    check(params, "the engine reports its parameter count")
    srv.stop()
    exact = RealServer("--max-params", str(params), roots=srv.tmp, data_dir=srv.data_dir)
    exact.submit(real_spec(train, steps=1))
    exact.stop()
    under = RealServer("--max-params", str(params - 1), roots=srv.tmp, data_dir=srv.data_dir)
    rejected(under, real_spec(train, steps=1), "model.init", "--max-params")


if __name__ == "__main__":
    H.run_tests({n[len("test_"):]: f for n, f in sorted(globals().items()) if n.startswith("test_roots")})
