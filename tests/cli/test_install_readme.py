"""test_install_readme.py — cli.install_readme: the README, as a new user
follows it, against an installed trainyard.

1. `make install-only` (what `make install` runs after building) into a
   temporary PREFIX, and again with DESTDIR staging: both binaries land in
   bin/, the systemd unit in lib/systemd/system/ with ExecStart under the
   prefix the files will run from.
2. `trainyard serve` from the installed bin/, started with the flags
   `make run` uses (`make -n run` says which; no --engine: it must find the
   installed trainyard-engine, which then trains the README's job for real).
3. Every command of the README's "30-second tour" block, taken from
   README.md itself and run by bash with only the port and the dataset path
   substituted; each must be one this test knows how to check, so a README
   edit that adds a command fails here until it is checked too.
4. The `trainyard ...` commands the README names in backticks, run as
   written with the installed bin/ first on PATH: submit, jobs, watch, logs
   -f, cancel|pause|resume, token create, and `trainyard demo --steps N`,
   which must say that its job is queued behind the running one.
5. `trainyard demo` against a server with the default roots: refused with
   a hint, accepted with --dir under the roots.

Environment: TY_SRC (the source tree, for README.md and the Makefile),
TY_BUILD_DIR (a configured, built tree to install from).
"""
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from tyharness import check, fail, free_port, tmpdir  # noqa: E402

SRC = os.environ.get("TY_SRC", "")
BUILD = os.environ.get("TY_BUILD_DIR", "")

_procs = []


def _env(extra=None):
    env = dict(os.environ)
    # A make or ctest above us must not leak its jobserver into ours.
    for k in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "TY_TOKEN"):
        env.pop(k, None)
    env["ASAN_OPTIONS"] = "detect_leaks=0"
    env.update(extra or {})
    return env


def run(cmd, cwd, env, timeout=120, ok=True):
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if ok:
        check(r.returncode == 0, "%r exited %d\nstdout: %s\nstderr: %s" % (cmd, r.returncode, r.stdout[-2000:],
                                                                            r.stderr[-2000:]))
    return r


def popen(cmd, cwd, env):
    p = subprocess.Popen(["bash", "-c", cmd], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    _procs.append(p)
    lines = queue.Queue()

    def pump():
        for line in p.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return p, lines


def read_until(lines, pred, timeout, what):
    """Lines from a popen() queue until pred(line); returns all read."""
    got = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.05, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            fail("stream ended before %s:\n%s" % (what, "".join(got)[-3000:]))
        got.append(line)
        if pred(line):
            return got
    fail("timed out waiting for %s:\n%s" % (what, "".join(got)[-3000:]))


def drain(p, lines, timeout):
    """Waits for p to exit; returns (code, everything it printed)."""
    out = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.05, deadline - time.monotonic()))
        except queue.Empty:
            fail("process did not end within %ds:\n%s" % (timeout, "".join(out)[-3000:]))
        if line is None:
            break
        out.append(line)
    return p.wait(timeout=10), "".join(out)


_engines = []  # installed engine paths whose processes cleanup kills


def kill_all():
    for p in _procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
    # Engines the server started live in their own process groups; a server
    # killed above leaves them behind. They are ours if they run our copy.
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                exe = os.readlink("/proc/%s/exe" % pid)
            except OSError:
                continue
            if exe in _engines:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass


# ------------------------------------------------------------------ README

def readme():
    with open(os.path.join(SRC, "README.md")) as f:
        return f.read()


def tour_commands(text):
    """The shell commands of the tour block: a command starts on a line
    without indentation outside a quoted string; comment lines are dropped."""
    m = re.search(r"## A 30-second tour\s+```sh\n(.*?)```", text, re.S)
    check(m, "README.md has no '## A 30-second tour' sh block")
    cmds, cur = [], ""
    for line in m.group(1).splitlines():
        open_quote = cur.count("'") % 2 == 1
        if not open_quote and line.startswith("#"):
            continue
        if cur and (open_quote or line[:1].isspace()):
            cur += "\n" + line
        else:
            if cur:
                cmds.append(cur)
            cur = line
    if cur:
        cmds.append(cur)
    return cmds


def cli_commands(text):
    """`trainyard ...` in backticks outside code blocks, `a|b|c` expanded."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    out = []
    for c in re.findall(r"`(trainyard [^`]+)`", prose.replace("\n", " ")):
        c = re.sub(r"\s+", " ", c).strip()
        m = re.match(r"trainyard (\w+(?:\|\w+)+) (.*)", c)
        if m:
            out += ["trainyard %s %s" % (v, m.group(2)) for v in m.group(1).split("|")]
        else:
            out.append(c)
    return out


# ------------------------------------------------------------------ steps

def check_install(work):
    prefix = os.path.join(work, "prefix")
    r = run("make --no-print-directory -C %s install-only BUILD=%s PREFIX=%s" %
            (shlex.quote(SRC), shlex.quote(BUILD), shlex.quote(prefix)), work, _env())
    check("installed %s/bin/trainyard\n" % prefix in r.stdout, "make install names what it installed: %r" % r.stdout)
    for b in ("trainyard", "trainyard-engine"):
        check(os.access(os.path.join(prefix, "bin", b), os.X_OK), "%s installed in %s/bin" % (b, prefix))
    with open(os.path.join(prefix, "lib/systemd/system/trainyard.service")) as f:
        unit = f.read()
    check(re.search(r"^ExecStart=%s/bin/trainyard serve " % re.escape(prefix), unit, re.M),
          "the installed unit runs the installed binary:\n" + unit)

    # DESTDIR stages the files; the unit still names the real prefix.
    stage = os.path.join(work, "stage")
    run("make --no-print-directory -C %s install-only BUILD=%s PREFIX=/usr/local DESTDIR=%s" %
        (shlex.quote(SRC), shlex.quote(BUILD), shlex.quote(stage)), work, _env())
    for b in ("trainyard", "trainyard-engine"):
        check(os.access(os.path.join(stage, "usr/local/bin", b), os.X_OK), "%s staged under DESTDIR" % b)
    with open(os.path.join(stage, "usr/local/lib/systemd/system/trainyard.service")) as f:
        check(re.search(r"^ExecStart=/usr/local/bin/trainyard serve ", f.read(), re.M),
              "DESTDIR is not part of ExecStart")
    return prefix


def make_run_serve(work, port):
    """The `trainyard serve ...` line `make run` would run (make -n prints
    it), with the installed trainyard instead of the build tree's: the
    server starts with the same flags as for a user following the README."""
    marker = "/nonexistent-build-dir"
    out = run("make --no-print-directory -n -C %s run BUILD=%s LISTEN=127.0.0.1:%d DATA_DIR=./trainyard-data" %
              (shlex.quote(SRC), marker, port), work, _env()).stdout
    check("dashboard: http://127.0.0.1:%d/" % port in out and "%s/bin/trainyard " % marker in out,
          "make run prints the URL and the binary's path:\n" + out)
    lines = [x for x in out.splitlines() if "%s/bin/trainyard serve " % marker in x]
    check(len(lines) == 1, "make -n run shows one trainyard serve line:\n" + out)
    cmd = lines[0].strip()
    cmd = cmd[len("exec "):] if cmd.startswith("exec ") else cmd
    return cmd.replace("%s/bin/trainyard" % marker, "trainyard")


def api(port, path, method="GET"):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def job(port, jid):
    st, body = api(port, "/jobs/%d" % jid)
    check(st == 200, "GET /jobs/%d: %d %r" % (jid, st, body[:300]))
    return json.loads(body)


def wait_state(port, jid, states, timeout=120):
    seen = {}

    def pred():
        j = seen["job"] = job(port, jid)
        return j if j["state"] in states else None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = pred()
        if j:
            return j
        time.sleep(0.1)
    j = seen.get("job") or {}
    fail("job %d did not become %s within %ds: it is %s (error %r)" % (jid, "/".join(states), timeout,
                                                                      j.get("state"), j.get("error")))


def installed_engine_running(engine):
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.readlink("/proc/%s/exe" % pid) == engine:
                    return True
            except OSError:
                pass
    return False


def run_tour(work, port, env, engine):
    text = readme()
    cmds = tour_commands(text)
    train = os.path.join(work, "train.jsonl")
    spec_body = None
    checked = set()
    for raw in cmds:
        cmd = raw.replace("localhost:8080", "localhost:%d" % port).replace("/tmp/train.jsonl", train)
        first = raw.split("#")[0].strip()
        if raw.startswith("awk "):
            run(cmd, work, env)
            with open(train) as f:
                rows = f.read().splitlines()
            check(len(rows) == 256 and all(len(json.loads(x)["input_ids"]) == 64 for x in rows), "awk dataset")
        elif re.match(r"curl -s -X POST \S+/jobs -H", first):
            m = re.search(r"-d '(.*)'", raw, re.S)
            spec_body = m.group(1).replace("/tmp/train.jsonl", train)
            j = json.loads(run(cmd, work, env).stdout)
            check(j.get("id") == 1, "the tour's job is job 1: %r" % j)
        elif re.match(r"curl -s \S+/jobs/1$", first):
            check(json.loads(run(cmd, work, env).stdout)["id"] == 1, "GET /jobs/1")
        elif first.startswith("curl -N ") and first.endswith("/jobs/1/events"):
            p, lines = popen(cmd, work, env)
            read_until(lines, lambda l: l.startswith("event: metric"), 180, "a metric event from curl -N")
            check(installed_engine_running(engine), "the job runs the installed %s" % engine)
            os.killpg(p.pid, signal.SIGINT)  # the README's Ctrl-C
            p.wait(timeout=10)
        elif first.endswith("/jobs/1/pause"):
            wait_state(port, 1, ["running"])
            j = json.loads(run(cmd, work, env).stdout)
            check(j["state"] in ("stopping", "paused"), "pause: %s" % j["state"])
            wait_state(port, 1, ["paused"])
        elif first.endswith("/jobs/1/resume"):
            j = json.loads(run(cmd, work, env).stdout)
            check(j["state"] in ("queued", "starting", "running"), "resume: %s" % j["state"])
        elif first.endswith("/jobs/1/checkpoints"):
            cps = json.loads(run(cmd, work, env).stdout)
            lst = cps["checkpoints"] if isinstance(cps, dict) else cps
            check(len(lst) >= 1, "the pause left a checkpoint: %r" % cps)
        elif "metrics?format=csv" in first:
            check(first.startswith("curl -s '"), "the csv URL is quoted for zsh: %s" % first)
            out = run(cmd, work, env).stdout
            check(out.splitlines()[0].startswith("step") and len(out.splitlines()) > 1, "csv: %r" % out[:300])
        elif first.endswith("/metrics"):
            check("trainyard_" in run(cmd, work, env).stdout, "Prometheus text")
        else:
            fail("the README's tour has a command this test does not check yet: %s" % raw)
        checked.add(raw)
    check(len(checked) == len(cmds) and spec_body, "every tour command ran")
    return spec_body


def run_cli(work, port, env, spec_body):
    text = readme()
    cmds = cli_commands(text)
    for want in ("trainyard submit spec.json", "trainyard jobs", "trainyard watch 1", "trainyard logs 1 -f",
                 "trainyard cancel 1", "trainyard pause 1", "trainyard resume 1", "trainyard token create alice"):
        check(want in cmds, "README names `%s` (found %s)" % (want, cmds))
    with open(os.path.join(work, "spec.json"), "w") as f:
        f.write(spec_body)
    done = {"trainyard serve"}  # main() started the server with it

    def cli(c, **kw):
        done.add(c)
        return run(c, work, env, **kw)

    # Pause and resume job 1 while it is the only job (a paused job gives
    # its slot away and queues again at the back), then submit a second
    # one, list, watch and follow job 1, cancel it.
    wait_state(port, 1, ["running"])
    check(cli("trainyard pause 1").stdout.startswith("job 1: "), "pause prints the state")
    wait_state(port, 1, ["paused"])
    cli("trainyard resume 1")
    wait_state(port, 1, ["running"])
    r = cli("trainyard submit spec.json")
    check(r.stdout.strip() == "2", "submit prints the new id: %r %r" % (r.stdout, r.stderr))
    out = cli("trainyard jobs").stdout
    check(re.search(r"^ID\s+STATE\s+STEP", out) and re.search(r"^1\s+running\s+\d+/3000\s", out, re.M)
          and re.search(r"^2\s+queued\s+0/3000\s", out, re.M), "jobs:\n" + out)
    watch, wlines = popen("trainyard watch 1", work, env)
    done.add("trainyard watch 1")
    logs, llines = popen("trainyard logs 1 -f", work, env)
    done.add("trainyard logs 1 -f")
    # Wait for a metric of the run in progress, not just the replay: a step
    # past the one job 1 was resumed at.
    resumed_at = job(port, 1)["progress"]["step"]
    read_until(wlines, lambda l: (lambda m: m and int(m.group(1)) > resumed_at)(
        re.match(r"step +(\d+)/3000 ", l)), 180, "a live metric line from watch")
    # The README's job is 3000 steps: minutes here, but a fast machine could
    # finish it first; then cancel is refused (4) and watch ends succeeded.
    done.add("trainyard cancel 1")
    r = run("trainyard cancel 1", work, env, ok=False)
    end_state = job(port, 1)["state"]
    if r.returncode == 0:
        want_code, want_line = 8, "Job 1 was cancelled"
    elif r.returncode == 4 and end_state == "succeeded":
        want_code, want_line = 0, "Job 1 succeeded"
    else:
        fail("trainyard cancel 1: exit %d, job %s: %s" % (r.returncode, end_state, r.stderr))
    code, wout = drain(watch, wlines, 120)
    check(code == want_code, "watch exits %d, got %d:\n%s" % (want_code, code, wout[-2000:]))
    lcode, lout = drain(logs, llines, 120)
    check(lcode == 0 and lout.strip(), "logs -f ends with the job: %d %r" % (lcode, lout[-500:]))
    # watch --all replays from the start: the sentence first, steps of 3000
    # with one loss and one lr format, the end.
    whole = run("trainyard watch 1 --all", work, env, ok=False)
    check(whole.returncode == want_code, "watch of the ended job: %d" % whole.returncode)
    lines = whole.stdout.splitlines()
    check(lines[0] == "Job 1 was submitted and is queued.", "watch's first line: %r" % lines[0])
    steps = [x for x in lines if x.startswith("step ")]
    loss = r"(\d\.\d{3}|\d\d\.\d\d|0\.0{0,2}[1-9]\d{3}|\d\.\d{3}e-\d+)"  # 4 significant digits
    check(steps and all(re.match(r"step +\d+/3000 +\d+\.\d%  loss " + loss + r" +lr \d\.\d{3}e[-+]\d\d  ", x)
                        for x in steps), "metric lines: %s" % steps[:5])
    check(any(x.startswith(want_line) for x in lines), "watch ends with %r: %s" % (want_line, lines[-3:]))

    # Job 2 runs now; the demo's job waits behind it and says so.
    wait_state(port, 2, ["starting", "running"])
    demo = [c for c in cmds if c.startswith("trainyard demo")]
    check(demo, "README names trainyard demo")
    out = cli(demo[0].replace("--steps N", "--steps 6")).stdout
    check(re.search(r"It is queued at position 1, behind 1 running job", out), "demo says it queued: %r" % out)
    m = re.search(r"Submitted job (\d+)", out)
    check(m and "#/jobs/%s" % m.group(1) in out, "demo names its job's page: %r" % out)

    # --limit: the user chose it, so no note telling them to use it.
    r = run("trainyard jobs --limit 1", work, env)
    check(len(r.stdout.splitlines()) == 2 and "--limit" not in r.stderr and "newest 1 shown" in r.stderr,
          "jobs --limit 1: %r %r" % (r.stdout, r.stderr))
    # --help: one heading per section, commands listed once.
    h = run("trainyard --help", work, env).stdout
    check(h.count("Server commands:") == 1 and h.count("Client commands") == 1 and "\nclient:" not in h
          and len(re.findall(r"^  watch ID", h, re.M)) == 1, "trainyard --help:\n" + h)

    tok = cli("trainyard token create alice").stdout.strip()
    check(re.match(r"^ty_[0-9a-f]{64}$", tok), "token create prints a token: %r" % tok)
    for c in cmds:
        if c not in done and not c.startswith("trainyard demo"):
            fail("the README names `%s`, which this test does not run yet" % c)


def check_demo_default_roots(work, env):
    """`trainyard demo` against a server with the default roots (the data
    dir's inputs/ only, not /tmp): refused with a hint to use --dir, then
    accepted with --dir under the roots."""
    port = free_port()
    env = dict(env, TY_URL="http://127.0.0.1:%d" % port)
    data = os.path.join(work, "plain-data")
    server, slines = popen("exec trainyard serve --listen 127.0.0.1:%d --data-dir %s" % (port, shlex.quote(data)),
                           work, env)
    read_until(slines, lambda l: "serving on" in l, 60, "the default-roots server to listen")
    r = run("trainyard demo --steps 6", work, env, ok=False)
    check(r.returncode == 1 and "outside the allowed roots" in r.stderr and "--dir" in r.stderr,
          "demo outside the roots says what to do: %d %r" % (r.returncode, r.stderr))
    r = run("trainyard demo --steps 6 --dir %s" % shlex.quote(os.path.join(data, "inputs", "demo")), work, env)
    check(re.search(r"^Submitted job 1: .*data in %s/inputs/demo\)" % re.escape(os.path.realpath(data)),
                    r.stdout, re.M) or re.search(r"^Submitted job 1: .*data in %s/inputs/demo\)" % re.escape(data),
                                                 r.stdout, re.M), "demo --dir: %r" % r.stdout)
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=60)


def main():
    check(SRC and os.path.isfile(os.path.join(SRC, "README.md")), "TY_SRC must name the source tree")
    check(BUILD and os.path.isfile(os.path.join(BUILD, "CMakeCache.txt")), "TY_BUILD_DIR must name a build tree")
    work = tmpdir("ty-readme-")
    try:
        prefix = check_install(work)
        _engines.append(os.path.join(prefix, "bin", "trainyard-engine"))
        port = free_port()
        env = _env({"PATH": os.path.join(prefix, "bin") + ":" + os.environ.get("PATH", ""),
                    "TY_URL": "http://127.0.0.1:%d" % port})
        server, slines = popen("exec " + make_run_serve(work, port), work, env)
        read_until(slines, lambda l: "serving on" in l, 60, "the installed server to listen")
        spec_body = run_tour(work, port, env, os.path.join(prefix, "bin", "trainyard-engine"))
        run_cli(work, port, env, spec_body)
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        check_demo_default_roots(work, env)
    finally:
        kill_all()
    print("ok cli.install_readme")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        kill_all()
        raise
