"""test_gate_conns.py — the gate of `trainyard serve` across a connection's
life: every request of a kept-alive connection passes the same head checks
as the first (JSON errors, the head deadline, an idle timeout), pipelined
requests, malformed heads under TLS (never an HTML or doubled answer), and
fair shares of the pending heads under a flood from many addresses.

Raw requests go over plain sockets (http.client would fix them up). Each
case is one function; run one by name or all.
"""
import http.client
import os
import socket
import ssl
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_hardening import answer_end, json_error, parse  # noqa: E402
from tyharness import Server, check, run_tests, tmpdir, wait_for  # noqa: E402

GOOD = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


class Kept:
    """One client connection, read one answer at a time."""

    def __init__(self, srv, timeout=20, src=None):
        self.s = socket.socket()
        self.s.settimeout(timeout)
        if src:
            self.s.bind((src, 0))
        self.s.connect(("127.0.0.1", srv.port))
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def answer(self):
        """The next complete answer; b"" when the server closed first."""
        while answer_end(self.buf) is None:
            b = self.s.recv(65536)
            if not b:
                out, self.buf = self.buf, b""
                return out
            self.buf += b
        end = answer_end(self.buf)
        out, self.buf = self.buf[:end], self.buf[end:]
        return out

    def closed(self, within):
        """True once the server has closed the connection (without sending
        anything more) within `within` seconds."""
        self.s.settimeout(within)
        try:
            b = self.s.recv(65536)
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True
        check(b == b"", "bytes after the last answer: %r" % b[:200])
        return True

    def close(self):
        self.s.close()


def good_answer(k, what):
    st, h, body = parse(k.answer())
    check(st == 200, "%s: %d %r" % (what, st, body[:200]))
    check(h.get("connection") is None, "%s: the connection is not kept: %r" % (what, h))


def test_kept_bad_heads():
    """On one kept connection, a good request then a bad one: the bad one
    gets the gate's JSON error (never libmicrohttpd's HTML) and the
    connection closes."""
    srv = Server()
    host = b"Host: x\r\n"
    cases = [
        (b"GET /healthz HTTP/1.1\r\n" + host + b"X-Big: " + b"b" * 20000 + b"\r\n\r\n", 431, "too_large"),
        (b"GET /healthz HTTP/1.1\r\n" + host + b"X-A: b\x01c\r\n\r\n", 400, "bad_request"),
        (b"GET /healthz HTTP/1.1\r\n" + host + b"".join(b"X-%d: v\r\n" % i for i in range(150)) + b"\r\n",
         431, "too_large"),
        (b"POST /jobs HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\nContent-Length: -1\r\n\r\n{}",
         400, "bad_request"),
        (b"GET /healthz HTTP/1.1\r\n" + host + b"NoColon\r\n\r\n", 400, "bad_request"),
        (b"GET /healthz HTTP/2.0\r\n" + host + b"\r\n", 505, "version_not_supported"),
        (b"GET /healthz HTTP/1.1\r\n\r\n", 400, "bad_request"),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + host + b"\r\n", 414, "too_large"),
    ]
    for bad, status, code in cases:
        k = Kept(srv)
        for i in range(2):
            k.send(GOOD)
            good_answer(k, "good request %d before %r" % (i, bad[:40]))
        k.send(bad)
        h, _ = json_error(k.answer(), status, code, what="kept, then %r" % bad[:60])
        check(h.get("connection") == "close", "a refused head closes: %r" % h)
        check(k.closed(10), "the connection outlived a refused head")
        k.close()
    # A body on a kept connection, then the next request.
    k = Kept(srv)
    k.send(b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    st, h, _ = parse(k.answer())
    check(st == 400 and h.get("connection") is None, "POST {} keeps: %d %r" % (st, h))
    k.send(GOOD)
    good_answer(k, "after a body")
    k.close()


def test_pipelined():
    """Requests sent at once are answered in order on the kept connection;
    when one of them is refused, the ones before it are answered and the
    connection closes instead of answering it (the client retries it)."""
    srv = Server()
    k = Kept(srv)
    k.send(GOOD * 3)
    for i in range(3):
        good_answer(k, "pipelined %d" % i)
    k.send(GOOD)
    good_answer(k, "after the pipelined ones")
    k.close()

    k = Kept(srv)
    k.send(GOOD * 2 + b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n")
    first = parse(k.answer())
    check(first[0] == 200, "first of good, good, bad: %r" % (first,))
    st, h, _ = parse(k.answer())
    check(st == 200 and h.get("connection") == "close", "the last good one closes: %d %r" % (st, h))
    check(k.closed(10), "nothing answers the bad head")
    k.close()
    # Alone, it gets the gate's answer.
    k = Kept(srv)
    k.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n")
    json_error(k.answer(), 400, "bad_request", what="the bad head alone")
    k.close()


def test_kept_idle():
    """A kept connection idle past --header-timeout is closed without a
    word; one that starts a head and trickles it gets 408 at the head's
    deadline; another client is served meanwhile."""
    srv = Server("--header-timeout", "1")
    k = Kept(srv)
    k.send(GOOD)
    good_answer(k, "first")
    check(k.closed(10), "an idle kept connection was not closed within 10 s")
    k.close()

    k = Kept(srv)
    k.send(GOOD)
    good_answer(k, "first")
    k.send(b"GET /healthz HTTP/1.1\r\n")
    out, deadline = b"", time.monotonic() + 10
    k.s.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            k.send(b"X")  # one byte at a time, never ending the head
        except OSError:
            break
        try:
            b = k.s.recv(65536)
            if not b:
                break
            out += b
        except socket.timeout:
            continue
        except ConnectionResetError:
            break
    k.close()
    json_error(out, 408, "request_timeout", what="a head trickled on a kept connection")
    check(srv.get("/healthz").status == 200, "server still answers")


def make_cert(d):
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    p = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                        "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, "openssl req: %s" % p.stderr)
    return cert, key


def tls_raw(port, data, timeout=20):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw_s:
        with ctx.wrap_socket(raw_s) as s:
            try:
                s.sendall(data)
                while True:
                    b = s.recv(65536)
                    if not b:
                        break
                    out += b
            except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
                pass  # a close without TLS close_notify: no answer
    return out


class TLSServer(Server):
    """The harness's server over HTTPS (a self-signed certificate)."""

    def connection(self, timeout):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=ctx)


def test_tls_heads():
    """Under --tls-cert a malformed head gets one well-formed JSON error or
    no answer at all, never libmicrohttpd's HTML page or a doubled status
    line; good requests are answered."""
    d = tmpdir()
    cert, key = make_cert(d)
    srv = TLSServer("--tls-cert", cert, "--tls-key", key)
    host = b"Host: x\r\n"
    cases = [
        b"POST /jobs HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\nContent-Length: -1\r\n\r\n{}",
        b"POST /jobs HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\nContent-Length: 2 \r\n\r\n{}",
        b"GET /healthz HTTP/1.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n" + host + b"NoColon\r\n\r\n",
        b"GET /healthz HTTP/2.0\r\n" + host + b"\r\n",
        b"GET /healthz\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n" + host + b"X-Big: " + b"b" * 70000 + b"\r\n\r\n",
        b"POST /jobs HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\nContent-Length: 2\r\n"
        b"Content-Length: 3\r\n\r\n{} ",
        b"POST /jobs HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        b"\r\nzz\r\n\r\n",
    ]
    for req in cases:
        out = tls_raw(srv.port, req)
        check(b"<html" not in out.lower(), "%r: an HTML answer: %r" % (req[:60], out[:300]))
        if out:
            check(out[9:12].isdigit() and int(out[9:12]) >= 400, "TLS %r: %r" % (req[:60], out[:200]))
            json_error(out, int(out[9:12]), what="TLS %r" % req[:60])
    st, _, body = parse(tls_raw(srv.port, GOOD))
    check(st == 200, "TLS GET /healthz: %d %r" % (st, body[:200]))


def test_flood_fair():
    """Trickling connections from 40 addresses, each under the per-address
    limit, fill --max-pending-heads; a fresh address is still served at
    once, and the addresses holding the most heads lose their oldest."""
    srv = Server("--max-pending-heads", "200", "--per-ip-connections", "20", "--header-timeout", "60")
    held = []
    for a in range(40):
        for _ in range(8):  # 320 trickling heads over 40 addresses
            s = socket.socket()
            s.settimeout(10)
            s.bind(("127.0.1.%d" % (a + 1), 0))
            s.connect(("127.0.0.1", srv.port))
            s.sendall(b"GET /healthz HTTP/1.1\r\n")
            held.append(s)

    def fresh_served():
        t0 = time.monotonic()
        k = Kept(srv, timeout=5, src="127.0.2.1")
        k.send(GOOD)
        out = k.answer()
        k.close()
        return out.startswith(b"HTTP/1.1 200") and time.monotonic() - t0 < 5
    for i in range(5):
        check(wait_for(fresh_served, 2, "a fresh address served during the flood"), "fresh %d" % i)
    # Dropped heads got a 503 (or a reset); at most max_pending are still held.
    alive = 0
    for s in held:
        s.settimeout(0.01)
        try:
            b = s.recv(4096)
            if b:
                check(b" 503 " in b.split(b"\r\n", 1)[0], "a dropped head got %r" % b[:100])
        except socket.timeout:
            alive += 1
        except OSError:
            pass
        s.close()
    check(alive <= 200, "%d trickling heads still held with --max-pending-heads 200" % alive)


TESTS = {
    "kept_bad_heads": test_kept_bad_heads,
    "pipelined": test_pipelined,
    "kept_idle": test_kept_idle,
    "tls_heads": test_tls_heads,
    "flood_fair": test_flood_fair,
}

if __name__ == "__main__":
    run_tests(TESTS)
