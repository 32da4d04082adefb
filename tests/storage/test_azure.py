"""storage.azure — the az:// backend against Azurite's blob service:
SharedKey from a connection string (BlobEndpoint → Azurite), Put Blob for a
small file, Put Block + Put Block List for a large one (checked through the
REST API's block list), Get/Head/List/Delete, checkpoints, a wrong key
rejected by the service without the key in the message, and an account SAS
token accepted while a tampered one is refused; through faultproxy.py, a
failing block or Put Blob is retried alone and a corrupted download is
caught by Content-MD5.

The test talks to Azurite itself through a few lines of REST with its own
SharedKey signer, so container setup and read-backs do not go through the
code under test."""
import base64
import datetime
import hashlib
import hmac
import os
import urllib.error
import urllib.parse
import urllib.request

import harness as H

VERSION = "2021-08-06"


def rest(endpoint, method, path, query=None, body=b"", headers=None):
    """One SharedKey-signed request to Azurite; returns (status, headers, body)."""
    query = query or {}
    headers = dict(headers or {})
    headers["x-ms-date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT")
    headers["x-ms-version"] = VERSION
    url_path = urllib.parse.urlsplit(endpoint).path + urllib.parse.quote(path)
    xms = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()) if k.startswith("x-ms-"))
    res = f"/{H.AZURITE_ACCOUNT}{url_path}" + "".join(f"\n{k.lower()}:{v}" for k, v in sorted(query.items()))
    length = str(len(body)) if body else ""
    sts = "\n".join([method, "", "", length, headers.get("Content-MD5", ""), headers.get("Content-Type", ""),
                     "", "", "", "", "", ""]) + "\n" + xms + res
    sig = base64.b64encode(hmac.new(base64.b64decode(H.AZURITE_KEY), sts.encode(), hashlib.sha256).digest())
    headers["Authorization"] = f"SharedKey {H.AZURITE_ACCOUNT}:{sig.decode()}"
    url = endpoint + urllib.parse.quote(path) + ("?" + urllib.parse.urlencode(query) if query else "")
    if method in ("PUT", "POST") and not body:
        headers["Content-Length"] = "0"  # and no body, so urllib adds no Content-Type
    req = urllib.request.Request(url, data=body or None, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def account_sas(key_b64, permissions="rwdlac", tamper=False):
    """An account SAS (service b, resource types sco), signed per the
    2019-12-12 account SAS string-to-sign."""
    now = datetime.datetime.now(datetime.timezone.utc)
    st = (now - datetime.timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    se = (now + datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    sv = "2019-12-12"
    sts = "\n".join([H.AZURITE_ACCOUNT, permissions, "b", "sco", st, se, "", "http,https", sv, ""])
    sig = base64.b64encode(hmac.new(base64.b64decode(key_b64), sts.encode(), hashlib.sha256).digest()).decode()
    if tamper:
        sig = ("A" if sig[0] != "A" else "B") + sig[1:]
    q = {"sv": sv, "ss": "b", "srt": "sco", "sp": permissions, "st": st, "se": se, "spr": "http,https", "sig": sig}
    return urllib.parse.urlencode(q)


def main():
    a = H.args()
    endpoint, _ = H.start_azurite()
    work = H.tmpdir("azure")
    c = H.Checks()
    status, _, body = rest(endpoint, "PUT", "/ckpt", {"restype": "container"})
    c.ok(status == 201, f"container created through REST ({status} {body[:120]!r})")

    conn = (f"DefaultEndpointsProtocol=http;AccountName={H.AZURITE_ACCOUNT};AccountKey={H.AZURITE_KEY};"
            f"BlobEndpoint={endpoint};")
    env = H.clean_env({"AZURE_STORAGE_CONNECTION_STRING": conn,
                       "TY_STORE_THRESHOLD": str(4 << 20), "TY_STORE_PART_SIZE": str(1 << 20),
                       "TY_STORE_PARALLEL": "3"})
    st = H.Store(a.ty_store, env)
    root = "az://ckpt/jobs"

    small = os.path.join(work, "small.bin")
    H.write_random(small, 200_000, seed=3)
    st.run("put", root, "a/small.bin", small)
    status, hdrs, body = rest(endpoint, "GET", "/ckpt/jobs/a/small.bin")
    c.ok(status == 200 and hashlib.sha256(body).hexdigest() == H.sha256_file(small), "Put Blob, read back by REST")
    c.ok(hdrs.get("Content-MD5") == base64.b64encode(hashlib.md5(body).digest()).decode(),
         "blob stored with its Content-MD5")
    out = os.path.join(work, "out.bin")
    st.run("get", root, "a/small.bin", out)
    c.ok(H.sha256_file(out) == H.sha256_file(small), "get (Content-MD5 checked) round trip")

    big = os.path.join(work, "big.bin")
    size = (5 << 20) + 4321
    H.write_random(big, size, seed=4)
    st.run("put", root, "b/big file.bin", big)
    status, _, body = rest(endpoint, "GET", "/ckpt/jobs/b/big file.bin", {"comp": "blocklist"})
    committed = body.count(b"<Block>")
    c.ok(status == 200 and committed == 6, f"Put Block x6 + Put Block List ({status}, {committed} blocks)")
    status, _, body = rest(endpoint, "GET", "/ckpt/jobs/b/big file.bin")
    c.ok(hashlib.sha256(body).hexdigest() == H.sha256_file(big), "block blob read back by REST")
    st.run("get", root, "b/big file.bin", out)
    c.ok(H.sha256_file(out) == H.sha256_file(big), "block blob round trip")
    r = st.run("stat", root, "b/big file.bin")
    c.ok(r.stdout.split("\t")[1] == str(size), "Get Blob Properties size")

    r = st.run("ls", root)
    c.ok([x.split("\t")[0] for x in r.stdout.splitlines()] == ["a/small.bin", "b/big file.bin"], "List Blobs")
    r = st.run("ls", root, "b/")
    c.ok([x.split("\t")[0] for x in r.stdout.splitlines()] == ["b/big file.bin"], "List Blobs with prefix")

    ck = os.path.join(work, "step-000100")
    H.make_checkpoint(ck, {"model.safetensors": 5 << 20, "trainer_state.json": 300}, step=100)
    st.run("put-ckpt", root, "job-2/step-000100", ck)
    back = os.path.join(work, "restored")
    st.run("get-ckpt", root, "job-2/step-000100", back)
    c.ok(H.sha256_file(os.path.join(back, "model.safetensors")) == H.sha256_file(os.path.join(ck, "model.safetensors")),
         "checkpoint round trip")
    st.run("rm-ckpt", root, "job-2/step-000100")
    c.ok(st.run("ls", root, "job-2/").stdout.strip() == "", "checkpoint deleted")

    st.run("rm", root, "a/small.bin")
    r = st.run("rm", root, "a/small.bin", check=False)
    c.ok(r.returncode == 2, "deleting a missing blob reports not found")
    r = st.run("stat", root, "a/small.bin", check=False)
    c.ok(r.returncode == 2, "HEAD of a missing blob is not found")

    wrong = base64.b64encode(b"w" * 64).decode()
    bad_conn = conn.replace(H.AZURITE_KEY, wrong)
    r = st.run("put", root, "a/x.bin", small, check=False, env={"AZURE_STORAGE_CONNECTION_STRING": bad_conn})
    c.ok(r.returncode == 3, f"SharedKey with a wrong key is rejected ({r.returncode}: {r.stderr.strip()[:160]})")
    c.ok(wrong not in r.stderr and H.AZURITE_KEY not in r.stderr, "no key in the error")
    r = st.run("put", root, "a/x-big.bin", big, check=False, env={"AZURE_STORAGE_CONNECTION_STRING": bad_conn})
    c.ok(r.returncode == 3, "wrong key on a block upload is rejected")
    c.ok(rest(endpoint, "HEAD", "/ckpt/jobs/a/x-big.bin")[0] == 404, "nothing committed by the rejected upload")

    sas_env = {"AZURE_STORAGE_CONNECTION_STRING": "", "AZURE_STORAGE_ACCOUNT": H.AZURITE_ACCOUNT,
               "AZURE_STORAGE_BLOB_ENDPOINT": endpoint, "AZURE_STORAGE_SAS_TOKEN": "?" + account_sas(H.AZURITE_KEY)}
    r = st.run("put", root, "sas/big.bin", big, check=False, env=sas_env)
    c.ok(r.returncode == 0, f"SAS token upload (blocks) {r.stderr.strip()[:200]}")
    r = st.run("get", root, "sas/big.bin", out, check=False, env=sas_env)
    c.ok(r.returncode == 0 and H.sha256_file(out) == H.sha256_file(big), "SAS token download")
    bad_sas = account_sas(H.AZURITE_KEY, tamper=True)
    r = st.run("put", root, "sas/x.bin", small, check=False, env=dict(sas_env, AZURE_STORAGE_SAS_TOKEN=bad_sas))
    c.ok(r.returncode == 3, f"tampered SAS is refused ({r.returncode})")
    sig = urllib.parse.parse_qs(bad_sas)["sig"][0]
    c.ok(sig not in r.stderr and urllib.parse.quote(sig, safe="") not in r.stderr, "no SAS signature in the error")

    # Faults between us and Azurite: a block and a Put Blob fail, and only
    # they are sent again.
    px = H.FaultProxy(endpoint.rsplit("/", 1)[0])
    pconn = conn.replace(f"BlobEndpoint={endpoint}", f"BlobEndpoint={px.url}/{H.AZURITE_ACCOUNT}")
    fenv = {"AZURE_STORAGE_CONNECTION_STRING": pconn, "TY_STORE_RETRY_BASE_MS": "20"}
    px.set([{"method": "PUT", "query": "comp=block&", "action": "500", "skip": 2, "times": 2}])
    st.run("put", root, "f/big.bin", big, env=fenv)
    lg = px.log()
    blocks = sum(1 for e in lg if "comp=block&" in e["query"])
    c.ok(blocks == 8 and sum(1 for e in lg if "comp=blocklist" in e["query"]) == 1,
         f"two 500s on one block: 6 blocks + 2 retries, one block list ({blocks})")
    status, _, body = rest(endpoint, "GET", "/ckpt/jobs/f/big.bin")
    c.ok(hashlib.sha256(body).hexdigest() == H.sha256_file(big), "blob intact after block retries")
    px.set([{"method": "PUT", "action": "reset", "times": 1}])
    st.run("put", root, "f/small.bin", small, env=fenv)
    c.ok(len(px.log()) == 2, "Put Blob reset mid-body and retried")
    px.set([{"method": "GET", "action": "corrupt_response", "times": 1}])
    st.run("get", root, "f/small.bin", out, env=fenv)
    c.ok(H.sha256_file(out) == H.sha256_file(small) and len(px.log()) == 2, "corrupted download caught by Content-MD5")
    c.done()


if __name__ == "__main__":
    main()
