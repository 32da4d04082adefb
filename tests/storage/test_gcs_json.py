"""storage.gcs_json — gs:// with a service-account key: RS256 JWT exchanged
for an OAuth2 token, then the JSON API, against fakegcs.py (which verifies
the JWT with the public key). Resumable uploads in 256 KiB-aligned chunks,
resumed from the session's reported offset after failed chunks; token
reuse within a run and refresh after a 401; a download corrupted in flight
caught by x-goog-hash; paged listing; delete; checkpoints; a key the
service does not know is refused without key material in the error."""
import json
import os
import subprocess
import urllib.request

import harness as H

EMAIL = "trainer@test-project.iam.gserviceaccount.com"


def keypair(d, name):
    key = os.path.join(d, name + ".pem")
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", key],
                   check=True, capture_output=True)
    mod = subprocess.run(["openssl", "rsa", "-in", key, "-noout", "-modulus"], check=True, capture_output=True,
                         text=True).stdout.strip().split("=", 1)[1]
    return key, mod


def service_account(d, name, key, token_uri):
    path = os.path.join(d, name + ".json")
    with open(path, "w") as f:
        json.dump({"type": "service_account", "project_id": "test-project", "private_key_id": "k1",
                   "private_key": open(key).read(), "client_email": EMAIL, "client_id": "1",
                   "token_uri": token_uri}, f)
    return path


def main():
    a = H.args()
    work = H.tmpdir("gcsjson")
    key, modulus = keypair(work, "sa")
    port = H.free_port()
    p = H.spawn([os.sys.executable, os.path.join(H.HERE, "fakegcs.py"), str(port), EMAIL, modulus, "65537"],
                os.path.join(work, "fakegcs.log"))
    H.wait_port(port, p, "fake GCS")
    base = f"http://127.0.0.1:{port}"

    def control(**kw):
        urllib.request.urlopen(urllib.request.Request(base + "/_control", data=json.dumps(kw).encode(),
                                                      method="POST"), timeout=10).read()

    def get_log():
        return json.loads(urllib.request.urlopen(base + "/_log", timeout=10).read())

    sa = service_account(work, "sa", key, base + "/token")
    env = H.clean_env({"GOOGLE_APPLICATION_CREDENTIALS": sa, "STORAGE_EMULATOR_HOST": f"127.0.0.1:{port}",
                       "TY_STORE_PART_SIZE": str(3 * 256 * 1024), "TY_STORE_RETRY_BASE_MS": "20"})
    st = H.Store(a.ty_store, env)
    c = H.Checks()
    root = "gs://bkt/ckpts"

    small = os.path.join(work, "small.bin")
    H.write_random(small, 1000, seed=7)
    st.run("put", root, "a/small.bin", small)
    log = get_log()
    c.ok(sum(1 for e in log if e["path"] == "/token") == 1, "one token exchange (JWT verified by the fake)")
    c.ok(any(e["method"] == "POST" and e["query"].get("uploadType") == "resumable" for e in log),
         "resumable upload session opened")
    out = os.path.join(work, "out.bin")
    st.run("get", root, "a/small.bin", out)
    c.ok(H.sha256_file(out) == H.sha256_file(small), "small round trip")

    big = os.path.join(work, "big.bin")
    size = 3 * 1024 * 1024 + 1234
    H.write_random(big, size, seed=8)
    n0 = len(get_log())
    st.run("put", root, "a/big.bin", big)
    puts = [e for e in get_log()[n0:] if e["method"] == "PUT"]
    c.ok(len(puts) == 5 and all(e["len"] % (256 * 1024) == 0 for e in puts[:-1]),
         f"chunked in 5 aligned PUTs ({[e['len'] for e in puts]})")
    st.run("get", root, "a/big.bin", out)
    c.ok(H.sha256_file(out) == H.sha256_file(big), "chunked upload round trip")

    control(fail_chunks=2)
    n0 = len(get_log())
    st.run("put", root, "a/resumed.bin", big)
    lg = get_log()[n0:]
    queries = [e for e in lg if e["method"] == "PUT" and e["range"] and e["range"].startswith("bytes */")]
    c.ok(len(queries) == 2, f"status asked after each failed chunk ({len(queries)})")
    sent = sum(e["len"] for e in lg if e["method"] == "PUT")
    c.ok(sent < 2 * size, f"resumed from the persisted offset, not from zero ({sent} bytes sent for {size})")
    st.run("get", root, "a/resumed.bin", out)
    c.ok(H.sha256_file(out) == H.sha256_file(big), "resumed upload intact")

    control(reject_bearer=1)
    n0 = len(get_log())
    st.run("stat", root, "a/big.bin")
    c.ok(sum(1 for e in get_log()[n0:] if e["path"] == "/token") == 2, "401 refreshes the token once")

    control(reject_chunk_bearer=1)
    n0 = len(get_log())
    st.run("put", root, "a/refreshed.bin", big)
    lg = get_log()[n0:]
    c.ok(sum(1 for e in lg if e["path"] == "/token") == 2, "401 on a chunk refreshes the token and resends it")
    st.run("get", root, "a/refreshed.bin", out)
    c.ok(H.sha256_file(out) == H.sha256_file(big), "upload intact after the refresh")

    control(token_fail=1)
    r = st.run("stat", root, "a/big.bin", check=False)
    c.ok(r.returncode == 0, "token endpoint 500 retried")

    control(corrupt_media=1)
    st.run("get", root, "a/big.bin", out)
    c.ok(H.sha256_file(out) == H.sha256_file(big), "corrupted download caught by x-goog-hash and retried")

    for i in range(3):
        st.run("put", root, f"b/f{i}.bin", small)
    r = st.run("ls", root)
    keys = [x.split("\t")[0] for x in r.stdout.splitlines()]
    c.ok(keys == ["a/big.bin", "a/refreshed.bin", "a/resumed.bin", "a/small.bin", "b/f0.bin", "b/f1.bin",
                 "b/f2.bin"],
         f"list across pages {keys}")
    r = st.run("ls", root, "b/")
    c.ok(len(r.stdout.splitlines()) == 3, "list with prefix")
    st.run("rm", root, "b/f1.bin")
    c.ok(st.run("rm", root, "b/f1.bin", check=False).returncode == 2, "delete, then not found")
    c.ok(st.run("stat", root, "b/f1.bin", check=False).returncode == 2, "stat of deleted object")

    ck = os.path.join(work, "step-000050")
    H.make_checkpoint(ck, {"model.safetensors": 1 << 20, "trainer_state.json": 64}, step=50)
    st.run("put-ckpt", root, "job/step-000050", ck)
    st.run("get-ckpt", root, "job/step-000050", os.path.join(work, "back"))
    c.ok(H.sha256_file(os.path.join(work, "back", "model.safetensors")) ==
         H.sha256_file(os.path.join(ck, "model.safetensors")), "checkpoint round trip")

    other, _ = keypair(work, "other")
    bad = service_account(work, "bad", other, base + "/token")
    r = st.run("put", root, "a/x.bin", small, check=False, env={"GOOGLE_APPLICATION_CREDENTIALS": bad})
    c.ok(r.returncode == 3 and "invalid_grant" in r.stderr, f"unknown key refused ({r.stderr.strip()[:120]})")
    c.ok("PRIVATE KEY" not in r.stderr and "eyJ" not in r.stderr, "no key or JWT in the error")
    c.done()


if __name__ == "__main__":
    main()
