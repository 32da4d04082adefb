"""tyharness.py — shared helpers for trainyard's server integration tests.

Starts the real daemon (`trainyard serve`) on a free port with the fake
engine (tests/fixtures), talks HTTP and SSE to it with the standard library
only, and validates every JSON response body and every SSE event against
openapi.yaml's schemas (a small JSON Schema validator for the subset the
spec uses). Everything started here is killed at exit, also on failure.
"""
import atexit
import http.client
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TRAINYARD = os.environ.get("TY_BIN", "")
ENGINE = os.environ.get("TY_FAKE_ENGINE", "")

_cleanup = []


def _run_cleanup():
    for fn in reversed(_cleanup):
        try:
            fn()
        except Exception:
            pass


atexit.register(_run_cleanup)


def fail(msg):
    raise AssertionError(msg)


def check(cond, msg):
    if not cond:
        fail(msg)


def wait_for(pred, timeout, what, interval=0.05):
    """Polls pred() until it returns a truthy value; fails naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    fail("timed out after %.0fs waiting for %s (last: %r)" % (timeout, what, last))


def tmpdir(prefix="ty-srv-"):
    d = tempfile.mkdtemp(prefix=prefix)
    _cleanup.append(lambda: shutil.rmtree(d, ignore_errors=True))
    return d


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------- schemas

_SPEC = None


def openapi():
    """openapi.yaml as a dict, converted by js-yaml (tests/server/node_modules)."""
    global _SPEC
    if _SPEC is None:
        js = ("const y=require('js-yaml');const fs=require('fs');"
              "process.stdout.write(JSON.stringify(y.load(fs.readFileSync(process.argv[1],'utf8'))))")
        env = dict(os.environ, NODE_PATH=os.path.join(HERE, "node_modules"))
        try:
            out = subprocess.run(["node", "-e", js, os.path.join(ROOT, "openapi.yaml")], env=env,
                                 check=True, capture_output=True, timeout=60).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            fail("cannot read openapi.yaml through node + js-yaml (run bash tests/setup-npm.sh): %s" % e)
        _SPEC = json.loads(out)
    return _SPEC


def _resolve(ref):
    check(ref.startswith("#/"), "only local $ref supported: " + ref)
    node = openapi()
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _type_ok(v, t):
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "string":
        return isinstance(v, str)
    if t == "array":
        return isinstance(v, list)
    if t == "object":
        return isinstance(v, dict)
    fail("schema uses unknown type " + t)


def schema_errors(v, s, path="$"):
    """Errors of value v against schema s (JSON Schema 2020-12 subset)."""
    errs = []
    if "$ref" in s:
        errs += schema_errors(v, _resolve(s["$ref"]), path)
    if "type" in s:
        ts = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(_type_ok(v, t) for t in ts):
            return errs + ["%s: %r is not of type %s" % (path, v, s["type"])]
    if "enum" in s and v not in s["enum"]:
        errs.append("%s: %r not in %r" % (path, v, s["enum"]))
    if "const" in s and v != s["const"]:
        errs.append("%s: %r != %r" % (path, v, s["const"]))
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if "minimum" in s and v < s["minimum"]:
            errs.append("%s: %r < minimum %r" % (path, v, s["minimum"]))
        if "maximum" in s and v > s["maximum"]:
            errs.append("%s: %r > maximum %r" % (path, v, s["maximum"]))
        if "exclusiveMinimum" in s and v <= s["exclusiveMinimum"]:
            errs.append("%s: %r <= exclusiveMinimum %r" % (path, v, s["exclusiveMinimum"]))
        if "exclusiveMaximum" in s and v >= s["exclusiveMaximum"]:
            errs.append("%s: %r >= exclusiveMaximum %r" % (path, v, s["exclusiveMaximum"]))
    if isinstance(v, str):
        if "minLength" in s and len(v) < s["minLength"]:
            errs.append("%s: shorter than %d" % (path, s["minLength"]))
        if "maxLength" in s and len(v) > s["maxLength"]:
            errs.append("%s: longer than %d" % (path, s["maxLength"]))
        if "pattern" in s and not re.search(s["pattern"], v):
            errs.append("%s: %r does not match %s" % (path, v, s["pattern"]))
    if isinstance(v, list):
        if "minItems" in s and len(v) < s["minItems"]:
            errs.append("%s: fewer than %d items" % (path, s["minItems"]))
        if "maxItems" in s and len(v) > s["maxItems"]:
            errs.append("%s: more than %d items" % (path, s["maxItems"]))
        if s.get("uniqueItems") and len(set(json.dumps(x, sort_keys=True) for x in v)) != len(v):
            errs.append("%s: items not unique" % path)
        if "items" in s:
            for i, x in enumerate(v):
                errs += schema_errors(x, s["items"], "%s[%d]" % (path, i))
    if isinstance(v, dict):
        props = s.get("properties", {})
        for r in s.get("required", []):
            if r not in v:
                errs.append("%s: required property %r missing" % (path, r))
        if "minProperties" in s and len(v) < s["minProperties"]:
            errs.append("%s: fewer than %d properties" % (path, s["minProperties"]))
        for k, x in v.items():
            if k in props:
                errs += schema_errors(x, props[k], path + "." + k)
            elif s.get("additionalProperties") is False:
                errs.append("%s: unexpected property %r" % (path, k))
            elif isinstance(s.get("additionalProperties"), dict):
                errs += schema_errors(x, s["additionalProperties"], path + "." + k)
    for sub in s.get("allOf", []):
        errs += schema_errors(v, sub, path)
    if "anyOf" in s and not any(not schema_errors(v, sub, path) for sub in s["anyOf"]):
        errs.append("%s: matches none of anyOf" % path)
    if "oneOf" in s:
        n = sum(1 for sub in s["oneOf"] if not schema_errors(v, sub, path))
        if n != 1:
            errs.append("%s: matches %d of oneOf (want exactly 1)" % (path, n))
    if "if" in s and not schema_errors(v, s["if"], path):
        errs += schema_errors(v, s.get("then", {}), path)
    elif "if" in s and "else" in s:
        errs += schema_errors(v, s["else"], path)
    return errs


def validate(v, schema, what):
    errs = schema_errors(v, schema)
    if errs:
        fail("%s does not match openapi.yaml:\n  %s\nbody: %s" % (what, "\n  ".join(errs[:10]),
                                                                    json.dumps(v)[:2000]))


def validate_named(v, name):
    validate(v, {"$ref": "#/components/schemas/" + name}, name)


def _match_path(path):
    """The openapi path template a concrete path falls under."""
    path = path.split("?", 1)[0]
    for tmpl in openapi()["paths"]:
        rx = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(tmpl)) + "$"
        if re.match(rx, path):
            return tmpl
    return None


def response_content(method, path, status):
    """The media types (name -> media object) openapi.yaml documents for this
    answer, or None for a path it does not know; fails when the status is
    not documented."""
    tmpl = _match_path(path)
    if tmpl is None:
        return None
    op = openapi()["paths"][tmpl].get(method.lower())
    if op is None:
        return None
    resps = op["responses"]
    key = str(status)
    # Every status an operation answers is listed by its own code, not only
    # through a range (4XX) or default: clients learn them from the spec.
    r = resps.get(key)
    check(r is not None, "%s %s answered %d, which openapi.yaml does not list (has %s)" %
          (method, tmpl, status, sorted(resps)))
    if "$ref" in r:
        r = _resolve(r["$ref"])
    return r.get("content", {})


# ---------------------------------------------------------------- the daemon

class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body
        self._json = None

    @property
    def json(self):
        if self._json is None:
            self._json = json.loads(self.body)
        return self._json

    def __repr__(self):
        return "<%d %s>" % (self.status, self.body[:300])


class Server:
    """One `trainyard serve` on a free port with a fresh data dir."""

    def __init__(self, *extra, data_dir=None, grace=2, roots=None, token=None, port=None):
        check(TRAINYARD and os.access(TRAINYARD, os.X_OK), "TY_BIN must name the trainyard binary")
        check(ENGINE and os.access(ENGINE, os.X_OK), "TY_FAKE_ENGINE must name ty-fake-engine")
        self.tmp = tmpdir()
        self.data_dir = data_dir or os.path.join(self.tmp, "data")
        self.roots = roots or self.tmp
        self.port = port or free_port()
        self.extra = list(extra)
        self.grace = grace
        self.token = token
        self.proc = None
        self.log_path = os.path.join(self.tmp, "server.log")
        _cleanup.append(self.kill)
        self.start()

    def start(self):
        args = [TRAINYARD, "serve", "--listen", "127.0.0.1:%d" % self.port, "--data-dir", self.data_dir,
                "--engine", ENGINE, "--grace", str(self.grace), "--gpus", "none",
                "--allowed-roots", self.roots, "--store-roots", self.roots] + self.extra
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                fail("server exited with %d at start:\n%s" % (self.proc.returncode, self.log_text()))
            try:
                if self.request("GET", "/healthz", check_schema=False).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        fail("server did not answer /healthz within 30 s:\n" + self.log_text())

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-4000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        """SIGTERM and wait: the clean shutdown."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                fail("server did not exit within 20 s of SIGTERM")
        self.log.close()

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def kill(self):
        """Cleanup: the server and every engine it left in its data dir."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        kill_engines(self.data_dir)

    # -- HTTP

    def connection(self, timeout):
        """A new client connection to this server (TLSServer's is HTTPS)."""
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, check_schema=True, timeout=30, token=None):
        h = dict(headers or {})
        tok = token if token is not None else self.token
        if tok and "Authorization" not in h:
            h["Authorization"] = "Bearer " + tok
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        elif isinstance(body, str):
            body = body.encode()
        c = self.connection(timeout)
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            resp = Response(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            c.close()
        if check_schema:
            self.check_response(method, path, resp)
        return resp

    def check_response(self, method, path, resp):
        """Every answer: a documented status and content type; JSON bodies
        validated against their schema; errors always the JSON Error."""
        ctype = resp.headers.get("content-type", "").split(";")[0].strip()
        content = response_content(method, path, resp.status)
        if resp.status >= 400:
            check(ctype == "application/json",
                  "%s %s: error %d is not JSON (%s): %r" % (method, path, resp.status, ctype, resp.body[:200]))
            validate(resp.json, {"$ref": "#/components/schemas/Error"}, "%s %s -> %d" % (method, path, resp.status))
            return
        if content is None or resp.status == 204:
            return
        check(ctype in content, "%s %s: %d has content type %r; openapi.yaml documents %s" %
              (method, path, resp.status, ctype, sorted(content)))
        if ctype == "application/json":
            validate(resp.json, content[ctype]["schema"], "%s %s -> %d" % (method, path, resp.status))

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body=body, **kw)

    def submit(self, spec, expect=201, **kw):
        r = self.post("/jobs", spec, **kw)
        check(r.status == expect, "POST /jobs: want %d, got %r" % (expect, r))
        return r.json

    def job(self, jid):
        r = self.get("/jobs/%d" % jid)
        check(r.status == 200, "GET /jobs/%d: %r" % (jid, r))
        return r.json

    def wait_state(self, jid, states, timeout=60):
        if isinstance(states, str):
            states = [states]
        return wait_for(lambda: (lambda j: j if j["state"] in states else None)(self.job(jid)),
                        timeout, "job %d to reach %s" % (jid, "/".join(states)))

    def events(self, jid, **kw):
        return SSE(self, "/jobs/%d/events" % jid, **kw)

    def all_events(self, jid, timeout=30):
        """Every event of a finished job, replayed from the database."""
        with self.events(jid, from_=0) as s:
            return s.read_until_end(timeout)

    def db_counts(self):
        """Rows in jobs and job_events, read straight from SQLite (read-only)."""
        con = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.data_dir, _db_name(self.data_dir)),
                              uri=True, timeout=10)
        try:
            return (con.execute("select count(*) from jobs").fetchone()[0],
                    con.execute("select count(*) from job_events").fetchone()[0])
        finally:
            con.close()


def _db_name(data_dir):
    for n in sorted(os.listdir(data_dir)):
        if n.endswith((".db", ".sqlite", ".sqlite3")):
            return n
    fail("no database file in %s: %s" % (data_dir, os.listdir(data_dir)))


def kill_engines(data_dir, binaries=(b"ty-fake-engine",)):
    """Kills engines (fake by default; name binaries for others) whose
    command line names this data dir (the ones a killed server left
    behind), by pid."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(tuple(binaries)) and any(data_dir.encode() in a for a in cmd):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def engine_pids(data_dir, binary=b"ty-fake-engine"):
    """Live (non-zombie) engine processes (fake by default) working in data_dir."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().split(b"\0")
            with open("/proc/%s/stat" % pid) as f:
                st = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if st != "Z" and cmd and cmd[0].endswith(binary) and any(data_dir.encode() in a for a in cmd):
            out.append(int(pid))
    return out


# ---------------------------------------------------------------- SSE

class SSE:
    """A minimal SSE client over http.client; every event's data is
    validated against the Event schema."""

    def __init__(self, server, path, last_event_id=None, from_=None, timeout=30, token=None):
        self.server = server
        q = "" if from_ is None else ("&" if "?" in path else "?") + "from=%d" % from_
        h = {"Accept": "text/event-stream"}
        tok = token if token is not None else server.token
        if tok:
            h["Authorization"] = "Bearer " + tok
        if last_event_id is not None:
            h["Last-Event-ID"] = str(last_event_id)
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
        self.conn.request("GET", path + q, headers=h)
        # Kept apart: the server answers `Connection: close`, after which
        # http.client drops conn.sock while the response still reads from it.
        self.sock = self.conn.sock
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        if self.status != 200:
            body = self.resp.read()
            server.check_response("GET", path, Response(self.status, {k.lower(): v for k, v in
                                                                      self.resp.getheaders()}, body))
            self.error = json.loads(body)
        else:
            ctype = self.resp.getheader("Content-Type", "")
            check(ctype.startswith("text/event-stream"), "SSE content type %r" % ctype)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def close(self):
        try:
            self.sock and self.sock.close()
        except OSError:
            pass
        self.conn.close()

    def next(self):
        """The next event as (id, type, data dict), or None at end of stream."""
        eid, etype, data = None, None, []
        while True:
            line = self.resp.readline()  # de-chunks, unlike resp.fp
            if not line:
                return None
            line = line.decode("utf-8").rstrip("\r\n")
            if line == "":
                if data:
                    d = json.loads("\n".join(data))
                    validate_named(d, "Event")
                    check(etype == d["type"], "SSE event: line %r vs data type %r" % (etype, d["type"]))
                    return (int(eid) if eid is not None else None, etype, d)
                continue
            if line.startswith(":"):
                continue
            k, _, v = line.partition(":")
            v = v[1:] if v.startswith(" ") else v
            if k == "id":
                eid = v
            elif k == "event":
                etype = v
            elif k == "data":
                data.append(v)

    def read_until_end(self, timeout=60, stop=None):
        """Events until the stream ends (the job's terminal state) or stop(ev)."""
        self.sock.settimeout(timeout)
        out = []
        while True:
            ev = self.next()
            if ev is None:
                return out
            out.append(ev)
            if stop and stop(ev):
                return out


TERMINAL = ("succeeded", "failed", "cancelled")


def is_terminal_event(ev):
    return ev[1] == "state" and ev[2]["data"]["to"] in TERMINAL


# ---------------------------------------------------------------- specs

def model_dir(base, fixture=None, name="model"):
    """A model directory whose fixture.json tells the fake engine what to do."""
    d = os.path.join(base, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "fixture.json"), "w") as f:
        json.dump(fixture or {}, f)
    return d


def spec(model, train, max_steps=20, **kw):
    s = {"model": {"path": model}, "dataset": {"train": train},
         "hyperparameters": {"max_steps": max_steps, "log_every_steps": 1}}
    for k, v in kw.items():
        if isinstance(v, dict) and isinstance(s.get(k), dict):
            s[k].update(v)
        else:
            s[k] = v
    return s


def setup(fixture=None, *server_args, **server_kw):
    """A server and a model dir + train file under its allowed roots."""
    srv = Server(*server_args, **server_kw)
    train = os.path.join(srv.tmp, "train.jsonl")
    with open(train, "w") as f:
        f.write('{"text": "hello"}\n')
    return srv, model_dir(srv.tmp, fixture), train


def run_tests(tests):
    """Runs the named test function (argv[1]) or all; exits 0 or 1."""
    names = sys.argv[1:] or list(tests)
    for n in names:
        t0 = time.monotonic()
        try:
            tests[n]()
        except Exception as e:  # noqa: BLE001 - any failure fails the case, with its cause
            import traceback
            traceback.print_exc()
            print("FAIL %s: %s" % (n, e), file=sys.stderr)
            _run_cleanup()
            sys.exit(1)
        print("ok %s (%.1fs)" % (n, time.monotonic() - t0))
        _run_cleanup()
        _cleanup.clear()
    sys.exit(0)
