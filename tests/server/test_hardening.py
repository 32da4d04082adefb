"""test_hardening.py — the HTTP edges of `trainyard serve`:
malformed heads answered as JSON by the gate, never by
libmicrohttpd's HTML; control bytes in decoded paths and queries; strict
query parsing; the head deadline and the per-address connection limit;
token scopes, tokens required on loopback, and the per-token rate limit.

Raw requests go over plain sockets to 127.0.0.1 (http.client would fix
them up). Each case is one function; run one by name or all.
"""
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tyharness import (TRAINYARD, Server, check, fail, run_tests, setup, spec, validate,  # noqa: E402
                       wait_for)


def answer_end(buf):
    """Length of the first complete answer in buf (head and Content-Length
    body), or None while it is incomplete or has no Content-Length."""
    head, sep, rest = buf.partition(b"\r\n\r\n")
    if not sep:
        return None
    for ln in head.split(b"\r\n")[1:]:
        k, _, v = ln.partition(b":")
        if k.strip().lower() == b"content-length" and v.strip().isdigit():
            n = int(v)
            return len(head) + 4 + n if len(rest) >= n else None
    return None


def raw(srv, data, timeout=20, src=None, half_close=False):
    """Sends data as it is and reads the answer: until the server closes,
    or until one complete answer when it keeps the connection open;
    half_close ends the sending side after data."""
    s = socket.socket()
    s.settimeout(timeout)
    if src:
        s.bind((src, 0))
    s.connect(("127.0.0.1", srv.port))
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the server may answer and close before reading everything
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
            end = answer_end(out)
            if end is not None and b"connection: close" not in out[:end].lower():
                break
    except ConnectionResetError:
        pass
    s.close()
    return out


def parse(resp):
    """(status, headers dict, body) of one HTTP answer; fails on two."""
    check(resp.startswith(b"HTTP/1.1 "), "no HTTP answer: %r" % resp[:200])
    check(resp.count(b"HTTP/1.1 ") == 1 or b"\r\n\r\n" in resp and
          resp.split(b"\r\n\r\n", 1)[0].count(b"HTTP/1.1 ") == 1, "status line twice: %r" % resp[:400])
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        check(k.lower() not in headers or k.lower() == "set-cookie", "header %s twice: %r" % (k, resp[:400]))
        headers[k.lower()] = v.strip()
    if "content-length" in headers:
        check(len(body) == int(headers["content-length"]),
              "body is %d bytes, Content-Length says %s: %r" % (len(body), headers["content-length"], resp[:400]))
    return status, headers, body


def json_error(resp, status, code=None, field=None, what=""):
    st, h, body = parse(resp)
    check(st == status, "%s: want %d, got %d: %r" % (what, status, st, resp[:300]))
    check(h.get("content-type", "").startswith("application/json"),
          "%s: error %d is not JSON: %r" % (what, st, resp[:300]))
    e = json.loads(body)
    validate(e, {"$ref": "#/components/schemas/Error"}, what)
    if code:
        check(e["error"]["code"] == code, "%s: code %r, want %r" % (what, e["error"]["code"], code))
    if field:
        check(e["error"].get("field") == field, "%s: field %r, want %r" % (what, e["error"].get("field"), field))
    return h, e


def test_json_errors():
    """Every head libmicrohttpd would refuse with HTML is a JSON error, with
    one status line; a large but acceptable head still works."""
    srv = Server()
    host = b"Host: x\r\n"
    cases = [
        (b"GET / HTTP/2.0\r\n" + host + b"\r\n", 505, "version_not_supported"),
        (b"GET / HTTP/1.2\r\n" + host + b"\r\n", 505, "version_not_supported"),
        (b"GET / HTTP/one\r\n" + host + b"\r\n", 400, "bad_request"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "bad_request"),
        (b"GET /healthz\r\n\r\n", 400, "bad_request"),
        (b"GET /healthz HTTP/1.1\n" + host + b"\n", 400, "bad_request"),
        (b"GET healthz HTTP/1.1\r\n" + host + b"\r\n", 400, "bad_request"),
        (b"GET /healthz HTTP/1.1\r\n\r\n", 400, "bad_request"),
        (b"GET /healthz HTTP/1.1\r\n" + host + host + b"\r\n", 400, "bad_request"),
        (b"GET /healthz HTTP/1.1\r\n" + host + b"NoColon\r\n\r\n", 400, "bad_request"),
        (b"GET /healthz HTTP/1.1\r\n" + host + b"X-A : b\r\n\r\n", 400, "bad_request"),
        (b"GET /healthz HTTP/1.1\r\n" + host + b"X-A: b\r\n folded\r\n\r\n", 400, "bad_request"),
        (b"GET /healthz HTTP/1.1\r\n" + host + b"X-A: b\x01c\r\n\r\n", 400, "bad_request"),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + host + b"\r\n", 414, "too_large"),
        (b"GET /healthz HTTP/1.1\r\n" + host + b"X-Big: " + b"b" * 20000 + b"\r\n\r\n", 431, "too_large"),
        (b"GET /healthz HTTP/1.1\r\n" + host + b"".join(b"X-%d: v\r\n" % i for i in range(150)) + b"\r\n",
         431, "too_large"),
        (b"POST /jobs HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\nContent-Length: -1\r\n\r\n{}",
         400, "bad_request"),
        (b"POST /jobs HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\nContent-Length: 2\r\n"
         b"Content-Length: 3\r\n\r\n{} ", 400, "bad_request"),
        (b"POST /jobs HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\nContent-Length: 2\r\n"
         b"Content-Length: 2\r\n\r\n{}", 400, "bad_request"),
        (b"POST /jobs HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\nContent-Length: 2, 2\r\n\r\n{}",
         400, "bad_request"),
        # Found by fuzz.request: libmicrohttpd answered this one in HTML.
        (b"POST /jobs HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\nContent-Length: 2 \r\n\r\n{}",
         400, "bad_request"),
        (b"POST /jobs HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\nContent-Length: 2\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400, "bad_request"),
        (b"POST /jobs HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 411, "length_required"),
        (b"POST /jobs HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\n"
         b"Content-Length: 99999999999999999999999\r\n\r\n", 413, "too_large"),
        # libmicrohttpd keeps parameters and cookies in per-connection memory;
        # a thousand of either used to stall it or draw its HTML 431.
        (b"GET /jobs?" + b"&".join([b"a"] * 1000) + b" HTTP/1.1\r\n" + host + b"\r\n", 414, "too_large"),
        (b"GET /jobs?" + b"&".join([b"a"] * 101) + b" HTTP/1.1\r\n" + host + b"\r\n", 414, "too_large"),
        (b"GET /jobs HTTP/1.1\r\n" + host + b"Cookie: " + b"; ".join([b"c=1"] * 1000) + b"\r\n\r\n",
         431, "too_large"),
        (b"GET /jobs HTTP/1.1\r\n" + host + b"Cookie: " + b"; ".join([b"c=1"] * 30) + b"\r\nCookie: " +
         b"; ".join([b"c=1"] * 21) + b"\r\n\r\n", 431, "too_large"),
    ]
    for req, status, code in cases:
        json_error(raw(srv, req), status, code, what=repr(req[:60]))
    # The largest head the gate takes still reaches the handlers intact.
    fields = b"".join(b"X-Pad-%02d: %s\r\n" % (i, b"p" * 140) for i in range(95))
    st, h, body = parse(raw(srv, b"GET /healthz HTTP/1.1\r\n" + host + fields + b"\r\n"))
    check(st == 200 and json.loads(body)["status"] == "ok", "large head: %d %r" % (st, body[:200]))
    check(h.get("connection") is None, "a good answer keeps the connection: %r" % h)
    # The most of everything at once: 100 parameters, 50 cookies, 100 fields.
    fields = b"Cookie: " + b"; ".join([b"c%d=1" % i for i in range(50)]) + b"\r\n"
    fields += b"".join(b"X-Pad-%02d: %s\r\n" % (i, b"p" * 120) for i in range(98))
    req = b"GET /jobs?" + b"&".join([b"p%d=1" % i for i in range(100)]) + b" HTTP/1.1\r\n" + host + fields + b"\r\n"
    check(len(req) <= 16384, "the request is within the head limit (%d)" % len(req))
    st, h, body = parse(raw(srv, req))
    check(st == 200 and "jobs" in json.loads(body), "largest head: %d %r" % (st, body[:200]))
    # HTTP/1.0 needs no Host.
    st, _, _ = parse(raw(srv, b"GET /healthz HTTP/1.0\r\n\r\n"))
    check(st == 200, "HTTP/1.0 /healthz: %d" % st)
    # A client that stops sending inside the head still reads its answer.
    json_error(raw(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", half_close=True), 400, "bad_request",
               what="head cut short")
    # Client bytes quoted in a message need not be UTF-8; the body is still JSON.
    for path in (b"/%FF%FE", b"/jobs/%C3", b"/static/%F0%9F"):
        json_error(raw(srv, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n"), 404, "not_found",
                   what="GET " + path.decode())
    json_error(raw(srv, b"GET /jobs?%C3%11=1 HTTP/1.1\r\nHost: x\r\n\r\n"), 400, "invalid_spec",
               what="control byte after a cut UTF-8 sequence in a parameter name")
    # 405 says which methods the path takes.
    h, _ = json_error(raw(srv, b"TRACE /jobs/1 HTTP/1.1\r\nHost: x\r\n\r\n"), 405, what="TRACE")
    check(h.get("allow") == "GET, HEAD, PATCH, DELETE", "Allow: %r" % h.get("allow"))
    check(srv.get("/healthz").status == 200, "server still answers")


def test_ctl_path():
    """A control byte in the decoded path is 400 before routing: a DELETE
    of /jobs/N%00/x does not delete job N."""
    srv, model, train = setup()
    jid = srv.submit(spec(model, train, max_steps=1))["id"]
    srv.wait_state(jid, "succeeded")
    for path in ["/jobs/%d%%00/anything" % jid, "/jobs/%d%%00" % jid, "/jobs/%d%%0a" % jid,
                 "/jobs%%7f/%d" % jid, "/jobs/%d/%%01" % jid]:
        r = srv.request("DELETE", path, check_schema=False)
        check(r.status == 400, "DELETE %s: %r" % (path, r))
        h, e = json_error(raw(srv, b"DELETE " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n"), 400,
                          "bad_request", what="DELETE " + path)
    check(srv.job(jid)["state"] == "succeeded", "job %d still there" % jid)


def test_query_strict():
    """Repeated parameters, values with NULs, over-long lists and empty
    values are 400 with the parameter as field; documented repeats work."""
    srv, model, train = setup()
    jid = srv.submit(spec(model, train, max_steps=1))["id"]
    srv.wait_state(jid, "succeeded")
    bad = [("/jobs?limit=1&limit=2", "limit"), ("/jobs?cursor=%00", "cursor"),
           ("/jobs?cursor=", "cursor"), ("/jobs?cursor=x%00y", "cursor"),
           ("/jobs?state=" + ",".join(["succeeded"] * 26), "state"),
           ("/jobs?" + "&".join(["state=succeeded"] * 30), "state"),
           ("/jobs?state=", "state"), ("/jobs?state=running,,queued", "state"),
           ("/jobs?limit", "limit"), ("/jobs?st%00ate=running", "st"),
           ("/events?from=-1", "from"), ("/jobs/%d/events?from=x" % jid, "from"),
           ("/events?from=1&from=2", "from"), ("/jobs/%d/metrics?format=json&format=csv" % jid, "format"),
           ("/jobs/%d/logs?follow=0&follow=0" % jid, "follow")]
    for path, field in bad:
        r = srv.get(path)
        check(r.status == 400 and r.json["error"].get("field") == field,
              "GET %s: want 400 naming %s, got %r" % (path, field, r))
    # A bad ?from= is not hidden by a good Last-Event-ID.
    r = srv.get("/jobs/%d/events?from=-1" % jid, headers={"Last-Event-ID": "0"})
    check(r.status == 400 and r.json["error"]["field"] == "from", "from=-1 with Last-Event-ID: %r" % r)
    r = srv.request("DELETE", "/jobs/%d?purge=0&purge=1" % jid)
    check(r.status == 400 and r.json["error"]["field"] == "purge", "purge twice: %r" % r)
    ok = ["/jobs?state=succeeded&state=failed", "/jobs?state=" + ",".join(["succeeded"] * 25),
          "/jobs?limit=5&unknown=1&unknown=2"]
    for path in ok:
        r = srv.get(path)
        check(r.status == 200 and [j["id"] for j in r.json["jobs"]] == [jid], "GET %s: %r" % (path, r))


def test_header_timeout():
    """A head that trickles in, or never comes, gets 408 JSON and the
    connection is closed; the server answers others meanwhile."""
    srv = Server("--header-timeout", "1")
    s = socket.socket()
    s.settimeout(30)
    s.connect(("127.0.0.1", srv.port))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    out = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            s.sendall(b"X")  # one byte at a time, never ending the head
        except OSError:
            break
        try:
            s.settimeout(0.2)
            b = s.recv(65536)
            if not b:
                break
            out += b
        except socket.timeout:
            continue
        except ConnectionResetError:
            break
    s.settimeout(5)
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except OSError:
        pass
    s.close()
    json_error(out, 408, "request_timeout", what="trickled head")
    json_error(raw(srv, b""), 408, "request_timeout", what="silent client")
    check(srv.get("/healthz").status == 200, "server still answers")


def test_body_timeout():
    """A body that trickles in past --request-timeout ends its connection
    (the daemon cannot answer mid-body); no job is created."""
    srv = Server("--request-timeout", "1")
    s = socket.socket()
    s.settimeout(30)
    s.connect(("127.0.0.1", srv.port))
    s.sendall(b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1000\r\n\r\n{")
    closed = False
    for _ in range(999):  # at most 999 bytes: the body never completes
        try:
            s.sendall(b" ")
            s.settimeout(0.2)
            if s.recv(65536) == b"":
                closed = True
                break
        except socket.timeout:
            continue
        except OSError:
            closed = True
            break
    s.close()
    check(closed, "the connection outlived 999 trickled body bytes with --request-timeout 1")
    r = srv.get("/jobs")
    check(r.status == 200 and r.json["jobs"] == [], "server answers, no job: %r" % r)


def test_per_ip_limit():
    """One address cannot hold more connections than --per-ip-connections
    (429 JSON with Retry-After); another address is still served; the
    slots come back when the connections close. The client under test is
    127.0.0.3, so the harness's own requests from 127.0.0.1 (which the
    daemon may not have finished closing) do not count against it."""
    srv = Server("--per-ip-connections", "8", "--header-timeout", "60")
    me = "127.0.0.3"
    held = []
    for _ in range(8):
        s = socket.socket()
        s.settimeout(30)
        s.bind((me, 0))
        s.connect(("127.0.0.1", srv.port))
        s.sendall(b"GET /healthz HTTP/1.1\r\n")  # an unfinished head: held in the gate
        held.append(s)
    # 40 more from the same address: every one refused, none served.
    for _ in range(40):
        h, e = json_error(raw(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", src=me), 429,
                          "too_many_connections", what="9th connection")
        check(h.get("retry-after", "").isdigit(), "429 without Retry-After: %r" % h)
    # Another loopback address is another client.
    st, _, body = parse(raw(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", src="127.0.0.2"))
    check(st == 200, "127.0.0.2 refused while %s is at its limit: %d %r" % (me, st, body))
    for s in held:
        s.close()

    def served():
        return parse(raw(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", src=me))[0] == 200
    wait_for(served, 30, "%s to be served again after closing its connections" % me)
    # Finished requests give their slot back too.
    for _ in range(20):
        st, _, _ = parse(raw(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", src=me))
        check(st == 200, "sequential requests within the limit: %d" % st)


def test_max_connections():
    """At --max-connections served requests the next one is 503 JSON, not a
    silent close; a slot frees when a stream ends."""
    # A closed stream is noticed at its next heartbeat: one a second.
    srv = Server("--max-connections", "3", "--per-ip-connections", "0", "--heartbeat", "1")
    def open_stream():
        # The harness's own last request may still hold a slot for a moment.
        s = socket.socket()
        s.settimeout(30)
        s.connect(("127.0.0.1", srv.port))
        s.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        if s.recv(4096).startswith(b"HTTP/1.1 200"):
            return s
        s.close()
        return None
    streams = [wait_for(open_stream, 30, "a stream slot") for _ in range(3)]
    h, _ = json_error(raw(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), 503, "too_many_connections",
                      what="a 4th connection")
    check(h.get("retry-after") == "1", "Retry-After: %r" % h)
    streams.pop().close()
    wait_for(lambda: parse(raw(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 200, 30,
             "a slot after one stream closed")
    for s in streams:
        s.close()


def make_token(srv, name, *args):
    p = subprocess.run([TRAINYARD, "token", "create", name, "--data-dir", srv.data_dir] + list(args),
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, "token create %s: %s" % (name, p.stderr))
    return p.stdout.strip()


def test_scopes():
    """Each route needs its scope: read (GET), submit (POST /jobs, cancel,
    pause, resume), admin (DELETE); a token without it gets 403 JSON."""
    srv, model, train = setup(None, "--require-token", "--rate-limit", "0")
    reader = make_token(srv, "reader", "--scope", "read")
    submitter = make_token(srv, "submitter", "--scope=submit")
    admin = make_token(srv, "admin", "--scope", "admin,read")
    full = make_token(srv, "full")
    for bad in ["", "write", "read,,admin", "read,"]:
        p = subprocess.run([TRAINYARD, "token", "create", "x" + bad, "--data-dir", srv.data_dir,
                            "--scope", bad], capture_output=True, text=True, timeout=60)
        check(p.returncode == 2 and "scope" in p.stderr, "--scope %r: %d %s" % (bad, p.returncode, p.stderr))

    check(srv.get("/jobs", token="").status == 401, "no token")
    check(srv.get("/jobs", token=reader).status == 200, "read token lists jobs")
    r = srv.post("/jobs", spec(model, train, max_steps=1), token=reader)
    check(r.status == 403 and r.json["error"]["code"] == "forbidden" and "submit" in r.json["error"]["message"],
          "read token submits: %r" % r)
    jid = srv.submit(spec(model, train, max_steps=1), token=submitter)["id"]
    r = srv.get("/jobs/%d" % jid, token=submitter)
    check(r.status == 403 and "read" in r.json["error"]["message"], "submit token reads: %r" % r)
    srv.token = full
    srv.wait_state(jid, "succeeded")
    for tok in (reader, submitter):
        r = srv.request("DELETE", "/jobs/%d" % jid, token=tok)
        check(r.status == 403, "DELETE with a token without admin: %r" % r)
    check(srv.post("/jobs/%d/cancel" % jid, token=reader).status == 403, "cancel needs submit")
    check(srv.get("/jobs/%d/events?from=0" % jid, token=submitter).status == 403, "events need read")
    check(srv.get("/healthz", token="").status == 200, "public routes need no token")
    r = srv.request("DELETE", "/jobs/%d" % jid, token=admin)
    check(r.status == 204, "admin deletes: %r" % r)


def test_loopback_token():
    """Loopback needs no token unless --require-token says so."""
    srv = Server()
    check(srv.get("/jobs").status == 200, "loopback without a token")
    srv2 = Server("--require-token")
    r = srv2.get("/jobs")
    check(r.status == 401 and r.json["error"]["code"] == "unauthorized", "--require-token: %r" % r)
    tok = make_token(srv2, "t")
    check(srv2.get("/jobs", token=tok).status == 200, "with a token")
    check(srv2.get("/jobs?access_token=" + tok, token="").status == 200, "?access_token=")
    check(srv2.get("/jobs", token="ty_" + "0" * 64).status == 401, "unknown token")


def test_rate_limit():
    """Past its burst, a token is refused with 429 JSON and Retry-After, and
    served again once that has passed; other tokens have their own budget."""
    srv = Server("--require-token", "--rate-limit", "1", "--rate-burst", "3")
    a, b = make_token(srv, "a"), make_token(srv, "b")
    limited = None
    for _ in range(30):
        r = srv.get("/jobs", token=a)
        if r.status == 429:
            limited = r
            break
        check(r.status == 200, "GET /jobs: %r" % r)
    check(limited is not None, "30 requests at once never hit a limit of 1/s with bursts of 3")
    check(limited.json["error"]["code"] == "rate_limited", "code %r" % limited.json)
    retry = limited.headers.get("retry-after", "")
    check(retry.isdigit() and int(retry) >= 1, "Retry-After %r" % retry)
    check(srv.get("/jobs", token=b).status == 200, "another token is not limited")
    time.sleep(int(retry))  # the server said when: waiting that long is the contract under test
    wait_for(lambda: srv.get("/jobs", token=a).status == 200, 30, "token a served again")


TESTS = {
    "json_errors": test_json_errors,
    "ctl_path": test_ctl_path,
    "query_strict": test_query_strict,
    "header_timeout": test_header_timeout,
    "body_timeout": test_body_timeout,
    "per_ip_limit": test_per_ip_limit,
    "max_connections": test_max_connections,
    "scopes": test_scopes,
    "loopback_token": test_loopback_token,
    "rate_limit": test_rate_limit,
}

if __name__ == "__main__":
    run_tests(TESTS)
