"""A small fake of Google Cloud Storage's JSON API and OAuth2 token
endpoint for the storage tests, written from Google's published
descriptions: the jwt-bearer token grant (the assertion is checked: RS256
signature against the service account's public key, issuer, audience,
scope, lifetime), Bearer-authenticated object GET (metadata, or media with
x-goog-hash), list with page tokens, DELETE, and resumable uploads (session
POST, chunked PUT with Content-Range, 308 with Range, status queries with
"bytes */SIZE", md5Hash checked at finalization, chunks must be multiples
of 256 KiB except the last).

usage: fakegcs.py PORT CLIENT_EMAIL MODULUS_HEX EXPONENT

POST /_control with a JSON object arms faults: fail_chunks (store half of
the next N chunks, answer 503), reject_bearer (answer 401 to the next N
storage requests; reject_chunk_bearer only for chunk PUTs), token_fail (answer 500 to the next N token requests),
corrupt_media (flip a byte in the next N media downloads). GET /_log
returns the request log."""
import base64
import hashlib
import json
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, EMAIL, N, E = int(sys.argv[1]), sys.argv[2], int(sys.argv[3], 16), int(sys.argv[4])
SHA256_DIGESTINFO = bytes.fromhex("3031300d060960864801650304020105000420")
CHUNK_UNIT = 256 * 1024

lock = threading.Lock()
objects = {}      # (bucket, name) -> (bytes, md5 b64, generation)
sessions = {}     # id -> dict(bucket, name, size, md5, data)
tokens = set()
faults = {"fail_chunks": 0, "reject_bearer": 0, "reject_chunk_bearer": 0, "token_fail": 0, "corrupt_media": 0}
log = []


def b64url_decode(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def jwt_check(assertion):
    """Returns None if the assertion is valid, else the reason."""
    try:
        h64, c64, s64 = assertion.split(".")
        header, claims = json.loads(b64url_decode(h64)), json.loads(b64url_decode(c64))
        sig = int.from_bytes(b64url_decode(s64), "big")
    except Exception as e:  # malformed
        return f"malformed: {e}"
    if header.get("alg") != "RS256":
        return "alg"
    k = (N.bit_length() + 7) // 8
    em = pow(sig, E, N).to_bytes(k, "big")
    digest = hashlib.sha256(f"{h64}.{c64}".encode()).digest()
    t = SHA256_DIGESTINFO + digest
    want = b"\x00\x01" + b"\xff" * (k - len(t) - 3) + b"\x00" + t
    if em != want:
        return "signature"
    now = time.time()
    if claims.get("iss") != EMAIL:
        return "iss"
    if claims.get("aud") != f"http://127.0.0.1:{PORT}/token":
        return "aud"
    if "devstorage" not in claims.get("scope", ""):
        return "scope"
    if not (claims["iat"] - 300 <= now <= claims["exp"]) or claims["exp"] - claims["iat"] > 3600:
        return "lifetime"
    return None


def meta(bucket, name):
    data, md5, gen = objects[(bucket, name)]
    return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(len(data)), "md5Hash": md5,
            "etag": f"CJ{gen}E=", "generation": str(gen), "updated": "2026-01-02T03:04:05.000Z"}


class GCS(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, code, body=b"", headers=None, ctype="application/json"):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if body or code not in (204, 308):
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, code, msg):
        self.reply(code, {"error": {"code": code, "message": msg}})

    def take(self, name):
        with lock:
            if faults[name] > 0:
                faults[name] -= 1
                return True
        return False

    def handle_any(self):
        u = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(u.query, keep_blank_values=True))
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        entry = {"method": self.command, "path": u.path, "query": q, "range": self.headers.get("Content-Range"),
                 "len": len(body)}
        with lock:
            log.append(entry)
        if u.path == "/_control":
            with lock:
                faults.update(json.loads(body))
            return self.reply(200, {})
        if u.path == "/_log":
            with lock:
                return self.reply(200, log)
        if u.path == "/token":
            return self.token(body)
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in tokens:
            return self.error(401, "Invalid Credentials")
        if self.take("reject_bearer"):
            with lock:
                tokens.discard(auth[7:])
            return self.error(401, "Invalid Credentials")
        parts = u.path.split("/")
        # /upload/storage/v1/b/BUCKET/o
        if u.path.startswith("/upload/storage/v1/b/") and len(parts) == 7 and parts[6] == "o":
            if self.command == "POST" and q.get("uploadType") == "resumable":
                return self.start_session(parts[5], q, body)
            if self.command == "PUT" and "upload_id" in q:
                if self.take("reject_chunk_bearer"):
                    with lock:
                        tokens.discard(auth[7:])
                    return self.error(401, "Invalid Credentials")
                return self.chunk(q["upload_id"], body)
        # /storage/v1/b/BUCKET/o[/NAME]
        if u.path.startswith("/storage/v1/b/") and len(parts) >= 6 and parts[5] == "o":
            bucket = parts[4]
            if len(parts) == 6 and self.command == "GET":
                return self.list(bucket, q)
            if len(parts) == 7:
                name = urllib.parse.unquote(parts[6])
                with lock:
                    exists = (bucket, name) in objects
                if not exists:
                    return self.error(404, f"No such object: {bucket}/{name}")
                if self.command == "DELETE":
                    with lock:
                        del objects[(bucket, name)]
                    return self.reply(204)
                if self.command == "GET" and q.get("alt") == "media":
                    data, md5, _ = objects[(bucket, name)]
                    if self.take("corrupt_media") and data:
                        data = bytes([data[0] ^ 1]) + data[1:]
                    return self.reply(200, data, {"x-goog-hash": f"crc32c=AAAAAA==,md5={md5}"},
                                      "application/octet-stream")
                if self.command == "GET":
                    return self.reply(200, meta(bucket, name))
        return self.error(400, f"unsupported {self.command} {u.path}")

    def token(self, body):
        form = dict(urllib.parse.parse_qsl(body.decode()))
        if self.take("token_fail"):
            return self.reply(500, {"error": "internal_failure"})
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return self.reply(400, {"error": "unsupported_grant_type"})
        why = jwt_check(form.get("assertion", ""))
        if why:
            return self.reply(400, {"error": "invalid_grant", "error_description": f"bad assertion ({why})"})
        with lock:
            tok = f"ya29.fake-{len(tokens)}-{time.time_ns()}"
            tokens.add(tok)
        return self.reply(200, {"access_token": tok, "expires_in": 3599, "token_type": "Bearer"})

    def start_session(self, bucket, q, body):
        md = json.loads(body or b"{}")
        name = q.get("name") or md.get("name")
        size = self.headers.get("X-Upload-Content-Length")
        if not name or size is None:
            return self.error(400, "name and X-Upload-Content-Length required")
        sid = hashlib.sha1(f"{bucket}/{name}/{time.time_ns()}".encode()).hexdigest()
        with lock:
            sessions[sid] = {"bucket": bucket, "name": name, "size": int(size), "md5": md.get("md5Hash"),
                             "data": bytearray()}
        loc = f"http://127.0.0.1:{PORT}/upload/storage/v1/b/{bucket}/o?uploadType=resumable&upload_id={sid}"
        return self.reply(200, b"", {"Location": loc})

    def progress(self, s):
        n = len(s["data"])
        return self.reply(308, b"", {"Range": f"bytes=0-{n - 1}"} if n else {})

    def chunk(self, sid, body):
        s = sessions.get(sid)
        if not s:
            return self.error(404, "no such upload session")
        cr = self.headers.get("Content-Range", "")
        if not cr.startswith("bytes "):
            return self.error(400, "Content-Range required")
        spec, total = cr[6:].split("/")
        if spec == "*":
            if len(body):
                return self.error(400, "status query with a body")
            if len(s["data"]) == s["size"] and s.get("done"):
                return self.reply(200, meta(s["bucket"], s["name"]))
            return self.progress(s)
        first, last = (int(x) for x in spec.split("-"))
        if int(total) != s["size"] or last - first + 1 != len(body) or first > len(s["data"]):
            return self.error(400, f"bad Content-Range {cr} for {len(body)} bytes at {len(s['data'])}")
        if last + 1 != s["size"] and len(body) % CHUNK_UNIT:
            return self.error(400, "chunk size must be a multiple of 256 KiB")
        if self.take("fail_chunks"):
            del s["data"][first:]
            s["data"] += body[: (len(body) // 2) // CHUNK_UNIT * CHUNK_UNIT]
            return self.error(503, "injected")
        del s["data"][first:]
        s["data"] += body
        if len(s["data"]) < s["size"]:
            return self.progress(s)
        data = bytes(s["data"])
        md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
        if s["md5"] and s["md5"] != md5:
            return self.error(400, "Provided MD5 hash does not match")
        with lock:
            gen = time.time_ns()
            objects[(s["bucket"], s["name"])] = (data, md5, gen)
            s["done"] = True
        return self.reply(200, meta(s["bucket"], s["name"]))

    def list(self, bucket, q):
        prefix = q.get("prefix", "")
        with lock:
            names = sorted(n for (b, n) in objects if b == bucket and n.startswith(prefix))
        start = int(q.get("pageToken") or 0)
        page = names[start:start + 2]  # small pages so paging is exercised
        out = {"kind": "storage#objects", "items": [meta(bucket, n) for n in page]}
        if start + 2 < len(names):
            out["nextPageToken"] = str(start + 2)
        return self.reply(200, out)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any


if __name__ == "__main__":
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", PORT), GCS).serve_forever()
