"""storage.gcs_xml — gs:// with HMAC keys speaks the XML API: SigV4 with
region "auto" against a GCS-style host. No GCS emulator exists, so the
S3-compatible s3rver stands in, reached through faultproxy.py (used here
only to record requests) under the host name storage.localhost, which
curl resolves to loopback. Single and multipart uploads, download, list,
delete and a checkpoint round trip."""
import os

import harness as H


def main():
    a = H.args()
    s3url, _ = H.start_s3rver(["gcs-bucket"])
    px = H.FaultProxy(s3url)
    port = px.url.rsplit(":", 1)[1]
    endpoint = f"http://storage.localhost:{port}"
    work = H.tmpdir("gcsxml")
    env = H.clean_env({"GCS_HMAC_ACCESS_ID": H.S3RVER_KEY, "GCS_HMAC_SECRET": "gcs-hmac-secret-value",
                       "GCS_ENDPOINT_URL": endpoint,
                       "TY_STORE_THRESHOLD": str(6 << 20), "TY_STORE_PART_SIZE": str(5 << 20)})
    st = H.Store(a.ty_store, env)
    c = H.Checks()
    root = "gs://gcs-bucket/runs"

    small = os.path.join(work, "small.bin")
    H.write_random(small, 50_000, seed=5)
    st.run("put", root, "x/small.bin", small)
    log = px.log()
    c.ok(log and all(e["host"] == f"storage.localhost:{port}" for e in log), "requests go to the GCS-style host")
    auth = log[0]["authorization"] if log else ""
    c.ok(auth.startswith(f"AWS4-HMAC-SHA256 Credential={H.S3RVER_KEY}/") and "/auto/s3/aws4_request" in auth,
         f"SigV4 with the HMAC id and region auto: {auth[:90]}")
    c.ok("gcs-hmac-secret-value" not in auth, "secret not sent")
    c.ok(log and log[0]["path"] == "/gcs-bucket/runs/x/small.bin", "path-style bucket/object")
    out = os.path.join(work, "out.bin")
    st.run("get", root, "x/small.bin", out)
    c.ok(H.sha256_file(out) == H.sha256_file(small), "round trip")

    big = os.path.join(work, "big.bin")
    H.write_random(big, (12 << 20) + 5, seed=6)
    px.set([])
    st.run("put", root, "x/big.bin", big)
    c.ok(sum(1 for e in px.log() if "partNumber=" in e["query"]) == 3, "XML multipart upload in 3 parts")
    st.run("get", root, "x/big.bin", out)
    c.ok(H.sha256_file(out) == H.sha256_file(big), "multipart round trip")

    keys = [x.split("\t")[0] for x in st.run("ls", root).stdout.splitlines()]
    c.ok(keys == ["x/big.bin", "x/small.bin"], f"list {keys}")
    ck = os.path.join(work, "step-000010")
    H.make_checkpoint(ck, {"model.safetensors": 1 << 20, "trainer_state.json": 100}, step=10)
    st.run("put-ckpt", root, "job/step-000010", ck)
    st.run("get-ckpt", root, "job/step-000010", os.path.join(work, "back"))
    c.ok(os.path.exists(os.path.join(work, "back", "MANIFEST.json")), "checkpoint round trip")
    st.run("rm", root, "x/small.bin")
    c.ok(st.run("stat", root, "x/small.bin", check=False).returncode == 2, "delete")
    r = st.run("put", root, "x/y.bin", small, check=False, env={"GCS_HMAC_ACCESS_ID": "GOOG1EUNKNOWN"})
    c.ok(r.returncode == 3 and "gcs-hmac-secret-value" not in r.stderr, "unknown HMAC id rejected, secret not shown")
    c.done()


if __name__ == "__main__":
    main()
