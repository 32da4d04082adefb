"""storage.faults — retries and commit safety under injected faults, with
faultproxy.py between ty-store and s3rver: 500s and resets on one part are
retried for that part alone, a part corrupted on the way in (caught by its
ETag) and a download truncated or corrupted on the way out (caught by
length and MD5) and a request that stalls past the timeout are retried,
and a checkpoint whose upload fails never
leaves a MANIFEST.json behind — only a complete upload commits one."""
import collections
import os

import harness as H


def main():
    a = H.args()
    s3url, _ = H.start_s3rver(["ckpt"])
    px = H.FaultProxy(s3url)
    work = H.tmpdir("faults")
    base = {"AWS_ACCESS_KEY_ID": H.S3RVER_KEY, "AWS_SECRET_ACCESS_KEY": H.S3RVER_SECRET, "AWS_REGION": "us-east-1",
            "TY_STORE_THRESHOLD": str(6 << 20), "TY_STORE_PART_SIZE": str(5 << 20), "TY_STORE_PARALLEL": "2",
            "TY_STORE_RETRY_BASE_MS": "20", "TY_STORE_MAX_ATTEMPTS": "4", "TY_STORE_STALL_S": "10"}
    st = H.Store(a.ty_store, H.clean_env(dict(base, AWS_ENDPOINT_URL_S3=px.url)))
    direct = H.Store(a.ty_store, H.clean_env(dict(base, AWS_ENDPOINT_URL_S3=s3url)))
    c = H.Checks()
    root = "s3://ckpt/f"
    big = os.path.join(work, "big.bin")
    H.write_random(big, (20 << 20) + 777, seed=9)  # 5 parts
    want = H.sha256_file(big)
    out = os.path.join(work, "out.bin")

    def parts(log):
        return collections.Counter(e["query"].split("partNumber=")[1].split("&")[0]
                                   for e in log if e["method"] == "PUT" and "partNumber=" in e["query"])

    # 1. Two 500s on part 2: only part 2 is resent.
    px.set([{"method": "PUT", "query": "partNumber=2&", "action": "500", "times": 2}])
    st.run("put", root, "p/one.bin", big)
    log = px.log()
    n = parts(log)
    c.ok(n == {"1": 1, "2": 3, "3": 1, "4": 1, "5": 1}, f"500s on part 2 retry that part only: {dict(n)}")
    c.ok(sum(1 for e in log if "uploads" in e["query"] and e["method"] == "POST") == 1,
         "one CreateMultipartUpload")
    c.ok(all(e["sha256"] and len(e["sha256"]) == 64 for e in log), "x-amz-content-sha256 on every request")
    c.ok(all(e["md5"] for e in log if e["method"] == "PUT"), "Content-MD5 on every part")
    direct.run("get", root, "p/one.bin", out)
    c.ok(H.sha256_file(out) == want, "object intact after retries")

    # 2. A reset halfway through part 3's body.
    px.set([{"method": "PUT", "query": "partNumber=3&", "action": "reset", "times": 1}])
    st.run("put", root, "p/two.bin", big)
    n = parts(px.log())
    c.ok(n["3"] == 2 and n["1"] == 1, f"reset mid-part retried: {dict(n)}")
    direct.run("get", root, "p/two.bin", out)
    c.ok(H.sha256_file(out) == want, "object intact after a reset")

    # 3. Part 4's bytes corrupted on the way in: its ETag gives it away.
    px.set([{"method": "PUT", "query": "partNumber=4&", "action": "corrupt_request", "times": 1}])
    st.run("put", root, "p/three.bin", big)
    c.ok(parts(px.log())["4"] == 2, "corrupted part detected by ETag and resent")
    direct.run("get", root, "p/three.bin", out)
    c.ok(H.sha256_file(out) == want, "object intact after a corrupted part")

    # 4. Single PUT: a 503 then success.
    small = os.path.join(work, "small.bin")
    H.write_random(small, 300_000, seed=10)
    px.set([{"method": "PUT", "action": "503", "times": 1}])
    st.run("put", root, "p/small.bin", small)
    c.ok(sum(1 for e in px.log() if e["method"] == "PUT") == 2, "503 on PutObject retried once")

    # 5. Downloads: truncated body, then a flipped byte.
    px.set([{"method": "GET", "path": "small.bin", "action": "truncate", "times": 1}])
    st.run("get", root, "p/small.bin", out)
    c.ok(H.sha256_file(out) == H.sha256_file(small) and len(px.log()) == 2, "truncated download retried")
    px.set([{"method": "GET", "path": "small.bin", "action": "corrupt_response", "times": 1}])
    st.run("get", root, "p/small.bin", out)
    c.ok(H.sha256_file(out) == H.sha256_file(small) and len(px.log()) == 2, "corrupted download caught by MD5")

    # 5b. A server that stops answering: the stall timeout ends the wait.
    px.set([{"method": "GET", "path": "small.bin", "action": "hang", "times": 1}])
    r = st.run("get", root, "p/small.bin", out, env={"TY_STORE_STALL_S": "2"})
    c.ok(H.sha256_file(out) == H.sha256_file(small) and len(px.log()) == 2, "stalled request timed out and retried")

    # 6. A failure that does not go away: the error says why, no object.
    px.set([{"method": "PUT", "query": "partNumber=5&", "action": "500", "times": -1}])
    r = st.run("put", root, "p/never.bin", big, check=False)
    c.ok(r.returncode == 1 and "500" in r.stderr, f"persistent 500 fails the upload: {r.stderr.strip()[:150]}")
    c.ok(parts(px.log())["5"] == 4, "part 5 tried max_attempts times")
    c.ok(any(e["method"] == "DELETE" and "uploadId=" in e["query"] for e in px.log()), "multipart upload aborted")
    c.ok(direct.run("stat", root, "p/never.bin", check=False).returncode == 2, "no object after the failure")

    # 7. Checkpoints: a file that cannot be uploaded means no manifest.
    ck = os.path.join(work, "step-000300")
    H.make_checkpoint(ck, {"model.safetensors": 7 << 20, "optimizer.safetensors": 2 << 20,
                           "trainer_state.json": 500}, step=300)
    px.set([{"method": "PUT", "path": "optimizer", "action": "reset", "times": -1}])
    r = st.run("put-ckpt", root, "job-3/step-000300", ck, check=False)
    c.ok(r.returncode != 0, "checkpoint upload fails when one file cannot be uploaded")
    keys = [x.split("\t")[0] for x in direct.run("ls", root, "job-3/").stdout.splitlines()]
    c.ok(not any(k.endswith("MANIFEST.json") for k in keys), f"no manifest without all its files: {keys}")
    r = direct.run("get-ckpt", root, "job-3/step-000300", os.path.join(work, "r1"), check=False)
    c.ok(r.returncode == 2, "a download sees no committed checkpoint")

    px.set([{"method": "PUT", "path": "MANIFEST.json", "action": "500", "times": -1}])
    r = st.run("put-ckpt", root, "job-3/step-000300", ck, check=False)
    keys = [x.split("\t")[0] for x in direct.run("ls", root, "job-3/").stdout.splitlines()]
    c.ok(r.returncode != 0 and not any(k.endswith("MANIFEST.json") for k in keys),
         "a manifest that cannot be written leaves the checkpoint uncommitted")

    # Flaky but recoverable: every file hit once, the upload commits.
    px.set([{"method": "PUT", "path": "model", "action": "500", "times": 1},
            {"method": "PUT", "path": "optimizer", "action": "reset", "times": 1},
            {"method": "PUT", "path": "MANIFEST", "action": "503", "times": 1}])
    st.run("put-ckpt", root, "job-3/step-000300", ck)
    log = px.log()
    put_paths = [e["path"] for e in log if e["method"] == "PUT"]
    last_put = put_paths[-1] if put_paths else ""
    c.ok(last_put.endswith("MANIFEST.json"), "manifest is the last thing written")
    back = os.path.join(work, "r2")
    direct.run("get-ckpt", root, "job-3/step-000300", back)
    c.ok(all(H.sha256_file(os.path.join(back, f)) == H.sha256_file(os.path.join(ck, f))
             for f in ("model.safetensors", "optimizer.safetensors", "trainer_state.json")),
         "committed checkpoint downloads and verifies")

    # Download side: a corrupted file during get-ckpt is retried, not accepted.
    px.set([{"method": "GET", "path": "trainer_state", "action": "corrupt_response", "times": 2}])
    back = os.path.join(work, "r3")
    r = st.run("get-ckpt", root, "job-3/step-000300", back, check=False)
    c.ok(r.returncode == 0 and H.sha256_file(os.path.join(back, "trainer_state.json")) ==
         H.sha256_file(os.path.join(ck, "trainer_state.json")), "corrupted checkpoint file re-downloaded")
    px.set([{"method": "GET", "path": "trainer_state", "action": "corrupt_response", "times": -1}])
    back = os.path.join(work, "r4")
    r = st.run("get-ckpt", root, "job-3/step-000300", back, check=False)
    c.ok(r.returncode == 4 and not os.path.exists(os.path.join(back, "MANIFEST.json")),
         f"persistently corrupt file: corrupt error and no local manifest ({r.returncode})")
    c.done()


if __name__ == "__main__":
    main()
