"""run_schemathesis.py — schemathesis against openapi.yaml on a live server.

Starts `trainyard serve` (fake engine, tokens required, so the checks see
the auth paths too), seeds two finished jobs so the {id} operations reach
real jobs (schemathesis tries id 1 at the boundary), and runs
`st run` over every operation with every check but one:

- positive_data_acceptance is left out: it expects every schema-valid
  request to succeed, but the server refuses valid-looking input the schema
  cannot describe (paths outside --allowed-roots, cursors it never issued),
  and says so with a documented 400.

The run is bounded (TY_ST_MAX_EXAMPLES examples per operation, a
TY_ST_MAX_TIME budget, a 2 s request timeout, which also ends event
streams) and seeded (TY_ST_SEED), so `make test` stays fast and repeatable.
It fails on any failure schemathesis reports, when it tested fewer
operations than openapi.yaml has, when the server died, and on a sanitizer
report in the server's log.

usage: run_schemathesis.py PATH/TO/st
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from tyharness import TRAINYARD, Server, check, fail, model_dir, spec  # noqa: E402


def count_operations(path):
    """Operations in openapi.yaml, counted from its text (no YAML parser in
    the standard library): method keys under paths."""
    n, in_paths = 0, False
    with open(path) as f:
        for line in f:
            if line.startswith("paths:"):
                in_paths = True
            elif re.match(r"^\S", line):
                in_paths = False
            elif in_paths and re.match(r"^    (get|put|post|delete|patch|head|options):\s*$", line):
                n += 1
    return n


def main():
    st = sys.argv[1] if len(sys.argv) > 1 else ""
    check(st and os.access(st, os.X_OK), "schemathesis missing at %r (schemathesis.setup makes it)" % st)
    spec_path = os.path.join(ROOT, "openapi.yaml")
    srv = Server("--require-token", "--rate-limit", "0")
    tok = subprocess.run([TRAINYARD, "token", "create", "schemathesis", "--data-dir", srv.data_dir],
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    srv.token = tok
    train = os.path.join(srv.tmp, "train.jsonl")
    with open(train, "w") as f:
        f.write('{"text": "hello"}\n')
    model = model_dir(srv.tmp)
    for _ in range(2):
        jid = srv.submit(spec(model, train, max_steps=2))["id"]
        srv.wait_state(jid, "succeeded")

    cmd = [st, "run", spec_path, "--url", "http://127.0.0.1:%d" % srv.port,
           "--checks", "all", "--exclude-checks", "positive_data_acceptance",
           "--max-examples", os.environ.get("TY_ST_MAX_EXAMPLES", "8"),
           "--max-time", os.environ.get("TY_ST_MAX_TIME", "150"),
           "--request-timeout", "2", "--seed", os.environ.get("TY_ST_SEED", "1"),
           "--header", "Authorization: Bearer " + tok, "--no-color"]
    print("+ " + " ".join(c if "Bearer" not in c else "--header 'Authorization: Bearer ...'" for c in cmd),
          flush=True)
    env = dict(os.environ, SCHEMATHESIS_TELEMETRY="false", NO_COLOR="1")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=360, cwd=srv.tmp, env=env)
    out = p.stdout + p.stderr
    print(out[-20000:])
    want = count_operations(spec_path)
    m = re.search(r"Tested:\s+(\d+)", out)
    check(m and int(m.group(1)) == want,
          "schemathesis tested %s of the %d operations in openapi.yaml" % (m and m.group(1), want))
    check(p.returncode == 0, "schemathesis reported failures (exit %d); see above" % p.returncode)
    check(srv.proc.poll() is None, "the server died under schemathesis:\n" + srv.log_text())
    check(srv.get("/healthz", check_schema=False).status == 200, "server answers after the run")
    srv.stop()
    log = srv.log_text()
    for bad in ("AddressSanitizer", "runtime error:", "LeakSanitizer"):
        if bad in log:
            fail("sanitizer report in the server log:\n" + log)
    print("ok schemathesis: %d operations, no failures" % want)


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAIL schemathesis: %s" % e, file=sys.stderr)
        sys.exit(1)
