"""A small HTTP proxy for the storage tests that forwards to an emulator and
injects faults by rule: a 500/503 reply, a connection reset halfway through
the request body, a response body cut short, or a flipped byte in the
request or response body. Every request is logged (method, path, query,
the headers that matter, and what was done to it) as JSON lines so tests
can count retries per part.

usage: faultproxy.py PORT UPSTREAM_URL RULES_JSON LOG_JSONL

RULES_JSON is re-read whenever it changes: a list of
  {"method": "PUT", "query": "partNumber=2", "path": "optimizer",
   "action": "500" | "503" | "403" | "reset" | "truncate" | "corrupt_request" | "corrupt_response" | "hang",
   "times": N (-1 = always), "skip": K}
where method/query/path are optional substring matches."""
import http.client
import json
import os
import socket
import struct
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, UPSTREAM, RULES, LOG = int(sys.argv[1]), urllib.parse.urlsplit(sys.argv[2]), sys.argv[3], sys.argv[4]
lock = threading.Lock()
state = {"mtime": None, "rules": [], "seen": []}
HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te", "trailer"}


def pick(method, path, query):
    """The action for this request, counting matches per rule."""
    with lock:
        try:
            m = os.stat(RULES).st_mtime_ns
        except FileNotFoundError:
            m = None
        if m != state["mtime"]:
            state["mtime"] = m
            state["rules"] = json.load(open(RULES)) if m else []
            state["seen"] = [0] * len(state["rules"])
        for i, r in enumerate(state["rules"]):
            if r.get("method") and r["method"] != method:
                continue
            if r.get("query") and r["query"] not in query:
                continue
            if r.get("path") and r["path"] not in urllib.parse.unquote(path):
                continue
            n = state["seen"][i]
            state["seen"][i] += 1
            skip, times = r.get("skip", 0), r.get("times", 1)
            if n < skip or (times >= 0 and n >= skip + times):
                continue
            return r["action"]
    return None


def log(entry):
    with lock, open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _reset(self):
        # SO_LINGER 0: close sends RST, like a dropped connection.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def _handle(self):
        u = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        action = pick(self.command, u.path, u.query)
        log({"method": self.command, "path": urllib.parse.unquote(u.path), "query": u.query, "action": action,
             "length": length, "host": self.headers.get("Host"),
             "authorization": self.headers.get("Authorization", ""),
             "sha256": self.headers.get("x-amz-content-sha256"), "md5": self.headers.get("Content-MD5"),
             "range": self.headers.get("Content-Range")})
        if action == "reset":
            if length:
                self.rfile.read(length // 2)
            self._reset()
            return
        body = self.rfile.read(length) if length else b""
        if action == "hang":
            # Say nothing for longer than the client's stall timeout, then
            # answer normally: a client without a timeout would accept this
            # late reply and never send the request again.
            time.sleep(20)
        if action in ("500", "503", "403"):
            # 403 is a refusal clients must not retry (a revoked key).
            code = b"AccessDenied" if action == "403" else b"InternalError"
            msg = b"<Error><Code>" + code + b"</Code><Message>injected</Message></Error>"
            self.send_response(int(action))
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        if action == "corrupt_request" and body:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        conn = http.client.HTTPConnection(UPSTREAM.hostname, UPSTREAM.port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        conn.request(self.command, self.path, body=body if length else None, headers=headers)
        resp = conn.getresponse()
        rbody = resp.read()
        conn.close()
        if action == "corrupt_response" and rbody:
            rbody = bytes([rbody[0] ^ 0xFF]) + rbody[1:]
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in HOP and k.lower() != "content-length":
                self.send_header(k, v)
        # A HEAD reply announces the object's length without a body.
        self.send_header("Content-Length", resp.getheader("Content-Length", "0") if self.command == "HEAD"
                         else str(len(rbody)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if action == "truncate" and len(rbody) > 1:
            self.wfile.write(rbody[: len(rbody) // 2])
            self.wfile.flush()
            self._reset()
            return
        self.wfile.write(rbody)

    def _guarded(self):
        try:
            self._handle()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up first

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _guarded


if __name__ == "__main__":
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", PORT), Proxy).serve_forever()
