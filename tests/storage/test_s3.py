"""storage.s3 — the s3:// backend against s3rver (which checks the
access key): single PUT, multipart with parallel parts, GET, HEAD, list,
delete, odd key characters, checkpoints, a wrong secret rejected without
the secret in the message, and objects read back and written by
/usr/bin/aws so a second S3 client agrees with ours."""
import os
import subprocess

import harness as H


def main():
    a = H.args()
    url, _ = H.start_s3rver(["ckpt"])
    work = H.tmpdir("s3")
    env = H.clean_env({
        "AWS_ACCESS_KEY_ID": H.S3RVER_KEY, "AWS_SECRET_ACCESS_KEY": H.S3RVER_SECRET,
        "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": url,
        "TY_STORE_THRESHOLD": str(6 << 20), "TY_STORE_PART_SIZE": str(5 << 20),
        "TY_STORE_PARALLEL": "3",
    })
    st = H.Store(a.ty_store, env)
    c = H.Checks()
    root = "s3://ckpt/jobs"

    small = os.path.join(work, "small.bin")
    H.write_random(small, 100_000, seed=1)
    st.run("put", root, "a/small.bin", small)
    out = os.path.join(work, "small.out")
    st.run("get", root, "a/small.bin", out)
    c.ok(H.sha256_file(out) == H.sha256_file(small), "single PUT round trip")
    r = st.run("stat", root, "a/small.bin")
    c.ok(r.stdout.split("\t")[1] == "100000", "stat size")

    odd = "a/with space+plus ü=eq.bin"
    st.run("put", root, odd, small)
    st.run("get", root, odd, out)
    c.ok(H.sha256_file(out) == H.sha256_file(small), "key with spaces, '+', '=' and UTF-8 signs and round-trips")

    big = os.path.join(work, "big.bin")
    H.write_random(big, (23 << 20) + 12345, seed=2)
    st.run("put", root, "b/big.bin", big)
    r = st.run("stat", root, "b/big.bin")
    c.ok(r.stdout.split("\t")[1] == str((23 << 20) + 12345), "multipart object has the full size")
    st.run("get", root, "b/big.bin", out)
    c.ok(H.sha256_file(out) == H.sha256_file(big), "multipart object downloads intact")

    r = st.run("ls", root)
    keys = [line.split("\t")[0] for line in r.stdout.splitlines()]
    c.ok(keys == sorted(["a/small.bin", odd, "b/big.bin"]), f"list all: {keys}")
    r = st.run("ls", root, "b/")
    c.ok([line.split("\t")[0] for line in r.stdout.splitlines()] == ["b/big.bin"], "list with prefix")

    # Another client agrees: aws reads what we wrote, we read what aws wrote.
    aws_env = dict(env, AWS_ENDPOINT_URL=url, AWS_DEFAULT_REGION="us-east-1",
                   AWS_EC2_METADATA_DISABLED="true", HOME=work)
    aws_out = os.path.join(work, "aws.out")
    r = subprocess.run(["/usr/bin/aws", "--endpoint-url", url, "s3", "cp", "s3://ckpt/jobs/b/big.bin", aws_out],
                       env=aws_env, capture_output=True, text=True, timeout=120)
    c.ok(r.returncode == 0 and H.sha256_file(aws_out) == H.sha256_file(big),
         f"aws s3 cp reads our multipart object {r.stderr.strip()[:200]}")
    r = subprocess.run(["/usr/bin/aws", "--endpoint-url", url, "s3", "cp", small, "s3://ckpt/jobs/c/from-aws.bin"],
                       env=aws_env, capture_output=True, text=True, timeout=120)
    st.run("get", root, "c/from-aws.bin", out)
    c.ok(r.returncode == 0 and H.sha256_file(out) == H.sha256_file(small), "we read what aws s3 cp wrote")

    # Checkpoint: files first, manifest last; download verifies sha256.
    ck = os.path.join(work, "step-000200")
    H.make_checkpoint(ck, {"model.safetensors": 7 << 20, "optimizer.safetensors": 1 << 20,
                           "trainer_state.json": 412})
    r = st.run("put-ckpt", root, "job-1/step-000200", ck)
    c.ok("uploaded" in r.stdout, "checkpoint upload")
    back = os.path.join(work, "restored")
    st.run("get-ckpt", root, "job-1/step-000200", back)
    c.ok(all(H.sha256_file(os.path.join(back, f)) == H.sha256_file(os.path.join(ck, f))
             for f in ("model.safetensors", "optimizer.safetensors", "trainer_state.json", "MANIFEST.json")),
         "checkpoint download matches")
    r = st.run("get-ckpt", root, "job-1/step-000999", os.path.join(work, "none"), check=False)
    c.ok(r.returncode == 2, "no manifest means no checkpoint (not found)")
    st.run("rm-ckpt", root, "job-1/step-000200")
    r = st.run("ls", root, "job-1/")
    c.ok(r.stdout.strip() == "", "checkpoint deleted")

    # Errors.
    r = st.run("stat", root, "a/missing", check=False)
    c.ok(r.returncode == 2, "stat of a missing object is not found")
    r = st.run("get", root, "a/missing", out + "2", check=False)
    c.ok(r.returncode == 2 and not os.path.exists(out + "2"), "get of a missing object leaves no file")
    st.run("rm", root, "a/small.bin")
    r = st.run("stat", root, "a/small.bin", check=False)
    c.ok(r.returncode == 2, "deleted object is gone")
    # s3rver checks the access key id but not SigV4 signatures themselves
    # (test_sigv4_botocore.py covers those), so an unknown key is the
    # rejection it can show.
    bad = {"AWS_ACCESS_KEY_ID": "UNKNOWNKEY", "AWS_SECRET_ACCESS_KEY": "WrongSecretValue123"}
    r = st.run("put", root, "a/x.bin", small, check=False, env=bad)
    c.ok(r.returncode == 3, f"unknown key is rejected as unauthorized ({r.returncode}: {r.stderr.strip()})")
    c.ok("WrongSecretValue123" not in r.stderr, "the secret is not in the error")
    r = st.run("put", root, "a/big-bad.bin", big, check=False, env=bad)
    c.ok(r.returncode == 3, "unknown key on a multipart upload is rejected")
    r = st.run("stat", root, "a/big-bad.bin", check=False)
    c.ok(r.returncode == 2, "a rejected multipart upload leaves no object")
    c.done()


if __name__ == "__main__":
    main()
