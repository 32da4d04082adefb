"""Shared plumbing for the storage tests: argument parsing, free ports,
starting and always stopping the emulators (s3rver, Azurite) that the tests
run against, and running the `ty-store` CLI.

Each test builds its own temporary directory and processes, so tests can run
in parallel under `ctest -j2` without sharing anything."""
import argparse
import atexit
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_BIN = os.path.join(HERE, "node_modules", ".bin")
# s3rver checks SigV4 signatures against its built-in account.
S3RVER_KEY = "S3RVER"
S3RVER_SECRET = "S3RVER"
# Azurite's well-known development account (published in its README).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsu"
               "Fq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==")

_T0 = time.time()
_procs = []
_dirs = []


def _cleanup():
    for p in _procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    for d in _dirs:
        shutil.rmtree(d, ignore_errors=True)


atexit.register(_cleanup)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))


def args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ty-store", required=True)
    ap.add_argument("--sigv4-dump", required=True)
    return ap.parse_args()


def tmpdir(tag):
    d = tempfile.mkdtemp(prefix=f"ty-storage-{tag}-")
    _dirs.append(d)
    return d


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{what} exited early with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not listen on port {port} within {timeout}s")


def spawn(cmd, log_path, env=None):
    log = open(log_path, "wb")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    _procs.append(p)
    return p


def need_node_tool(name):
    path = os.path.join(NODE_BIN, name)
    if not os.path.exists(path):
        print(f"SKIP: {path} missing; run `bash tests/setup-npm.sh`")
        sys.exit(77)
    return path


def start_s3rver(buckets):
    """Starts s3rver on a free port with the given buckets; returns its URL."""
    tool = need_node_tool("s3rver")
    d = tmpdir("s3rver")
    port = free_port()
    cmd = [tool, "-d", os.path.join(d, "data"), "-a", "127.0.0.1", "-p", str(port), "--silent",
           "--no-vhost-buckets"]
    for b in buckets:
        cmd += ["--configure-bucket", b]
    os.makedirs(os.path.join(d, "data"))
    p = spawn(cmd, os.path.join(d, "s3rver.log"))
    wait_port(port, p, "s3rver")
    return f"http://127.0.0.1:{port}", p


def start_azurite():
    tool = need_node_tool("azurite-blob")
    d = tmpdir("azurite")
    port = free_port()
    cmd = [tool, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", d,
           "--disableTelemetry", "--loose", "--skipApiVersionCheck", "--silent"]
    p = spawn(cmd, os.path.join(d, "azurite.log"))
    wait_port(port, p, "azurite")
    return f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}", p


def clean_env(extra):
    """The environment for ty-store: no inherited cloud credentials."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "AZURE_", "GCS_", "GOOGLE_", "STORAGE_EMULATOR", "TY_STORE_"))}
    env.update(extra)
    return env


class Store:
    """Runs `ty-store` with a fixed environment."""

    def __init__(self, binary, env):
        self.binary = binary
        self.env = env

    def run(self, *argv, check=True, env=None, timeout=120):
        e = dict(self.env)
        if env:
            e.update(env)
        r = subprocess.run([self.binary, *argv], env=e, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"ty-store {' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
        return r


def write_random(path, size, seed=0):
    """Deterministic pseudo-random content, written in 1 MiB blocks."""
    h = hashlib.sha256(str(seed).encode()).digest()
    block = (h * (1 << 15))[: 1 << 20]
    with open(path, "wb") as f:
        left = size
        i = 0
        while left > 0:
            chunk = block[: min(left, len(block))]
            # Vary each block so parts differ from one another.
            f.write(bytes([i & 0xFF]) + chunk[1:])
            left -= len(chunk)
            i += 1


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def make_checkpoint(d, sizes, step=200):
    """A checkpoint directory as DESIGN §6 describes, MANIFEST.json last."""
    import json
    os.makedirs(d, exist_ok=True)
    files = []
    for i, (name, size) in enumerate(sizes.items()):
        p = os.path.join(d, name)
        write_random(p, size, seed=i + step)
        files.append({"path": name, "bytes": size, "sha256": sha256_file(p)})
    with open(os.path.join(d, "MANIFEST.json.tmp"), "w") as f:
        json.dump({"format": "trainyard-checkpoint/1", "step": step, "files": files}, f)
    os.rename(os.path.join(d, "MANIFEST.json.tmp"), os.path.join(d, "MANIFEST.json"))
    return files


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def ok(self, cond, what):
        if cond:
            self.passed += 1
            print(f"ok   {what} [{time.time() - _T0:.1f}s]")
        else:
            self.failed += 1
            print(f"FAIL {what}")

    def done(self):
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)


class FaultProxy:
    """faultproxy.py in front of an emulator; rules can be swapped live."""

    def __init__(self, upstream):
        d = tmpdir("proxy")
        self.rules_path = os.path.join(d, "rules.json")
        self.log_path = os.path.join(d, "log.jsonl")
        self.set([])
        port = free_port()
        p = spawn([sys.executable, os.path.join(HERE, "faultproxy.py"), str(port), upstream, self.rules_path,
                   self.log_path], os.path.join(d, "proxy.log"))
        wait_port(port, p, "fault proxy")
        self.url = f"http://127.0.0.1:{port}"
        self.host = f"127.0.0.1:{port}"

    def set(self, rules):
        import json
        tmp = self.rules_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rules, f)
        os.replace(tmp, self.rules_path)
        open(self.log_path, "w").close()

    def log(self):
        import json
        with open(self.log_path) as f:
            return [json.loads(line) for line in f if line.strip()]
