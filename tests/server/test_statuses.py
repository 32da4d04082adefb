#!/usr/bin/python3
"""test_statuses.py — openapi.yaml lists every status each route can answer.

Two halves. The statuses every request can meet before or around its
handler are a table here (the gate, the disk, the server's own failures,
and for routes that take a token 401 and 403), checked against each
operation's own codes, with a self-check that a spec missing one fails.
The statuses handlers answer are checked where the tests see them:
tyharness.response_content fails any answer whose code the operation does
not list by name (a 4XX range is not enough), in every server test; this
file also provokes the gate's statuses over a raw socket and checks them
per route.

TY_BIN and TY_FAKE_ENGINE name the binaries.
"""
import copy
import socket

from tyharness import Server, check, openapi, run_tests

# Every operation: the gate's refusals (400 bad_request, 408 request_timeout,
# 411 length_required, 413/414/431 too_large, 429/503 too_many_connections,
# 505 version_not_supported), a full disk (503 disk_full) and 500 internal.
COMMON = {"400", "408", "411", "413", "414", "429", "431", "500", "503", "505"}
# Operations that take a token: 401 unauthorized, 403 forbidden (its scope).
# Besides: 404 on paths with a parameter, 415 on operations with a body.
TOKEN = {"401", "403"}
METHODS = ("get", "post", "put", "patch", "delete")


def missing(spec):
    """(method, path, code) the spec does not list by name."""
    out = []
    for path, item in spec["paths"].items():
        for m in METHODS:
            op = item.get(m)
            if not op:
                continue
            sec = op.get("security", spec.get("security", []))
            want = COMMON | (TOKEN if any("bearerAuth" in s for s in sec) else set())
            if "{" in path:  # a value the router does not take (/jobs/abc): 404
                want |= {"404"}
            if "requestBody" in op:  # a body that is not application/json: 415
                want |= {"415"}
            out += [(m.upper(), path, c) for c in sorted(want - set(op["responses"]))]
    return out


def test_table():
    """Each operation lists the common statuses; a spec lacking one is caught."""
    spec = openapi()
    gaps = missing(spec)
    check(not gaps, "openapi.yaml lacks statuses: %s" % gaps[:20])
    broken = copy.deepcopy(spec)
    del broken["paths"]["/jobs/{id}"]["delete"]["responses"]["503"]
    del broken["paths"]["/healthz"]["get"]["responses"]["505"]
    check(missing(broken) == [("DELETE", "/jobs/{id}", "503"), ("GET", "/healthz", "505")],
          "the check finds removed statuses: %s" % missing(broken))


def raw(srv, data):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        s.sendall(data)
        buf = b""
        while b"\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
        return int(buf.split(b" ", 2)[1])
    finally:
        s.close()


def test_gate():
    """The gate's refusals on each route are statuses the route lists."""
    srv = Server("--max-body", "1024")
    spec = openapi()
    cases = [
        (b"GET %s HTTP/1.1\r\nHost: x\r\nContent-Length: 99999\r\n\r\n", 413),
        (b"GET %s?" + b"a=1&" * 3000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET %s HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 200 + b"\r\n", 431),
        (b"GET %s HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        (b"GET %s HTTP/1.1\r\n\r\n", 400),
    ]
    for tmpl, item in spec["paths"].items():
        path = tmpl.replace("{id}", "1").replace("{name}", "app.js").encode()
        for m in METHODS:
            if m not in item:
                continue
            for req, want in cases:
                data = req.replace(b"GET", m.upper().encode(), 1).replace(b"%s", path, 1)
                got = raw(srv, data)
                check(got == want, "%s %s: gate answered %d, want %d" % (m.upper(), tmpl, got, want))
                check(str(got) in item[m]["responses"],
                      "%s %s answers %d, which openapi.yaml does not list" % (m.upper(), tmpl, got))
    srv.stop()


TESTS = {"table": test_table, "gate": test_gate}

if __name__ == "__main__":
    run_tests(TESTS)
