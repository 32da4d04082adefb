"""storage.sigv4_botocore — storage/sigv4.c against botocore's S3 SigV4
signer (the copy bundled in Debian's awscli) with a fixed clock: the same
request must give the same canonical request, string to sign and
signature, for object GET/PUT/DELETE, the three multipart calls, listing
with a query string, session tokens and keys with characters that need
encoding."""
import datetime
import hashlib
import json
import subprocess
import sys
from urllib.parse import quote

import harness as H

# Debian's awscli v2 vendors botocore as a top-level package in its folder.
sys.path.insert(0, "/usr/lib/python3/dist-packages/awscli")
try:
    from botocore import auth as bauth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
except ImportError:
    print("SKIP: botocore from Debian's awscli is not installed (apt-get install awscli)")
    sys.exit(77)

FIXED = datetime.datetime(2026, 3, 14, 15, 9, 26)
AMZ = FIXED.strftime("%Y%m%dT%H%M%SZ")


class _FixedDatetime(datetime.datetime):
    @classmethod
    def utcnow(cls):
        return FIXED


class _FixedModule:
    datetime = _FixedDatetime


bauth.datetime = _FixedModule  # botocore reads the clock only through this name


def botocore_sign(method, host, key_path, params, headers, body, ak, sk, token, region):
    url = f"http://{host}{quote(key_path, safe='/~')}"
    req = AWSRequest(method=method, url=url, headers=dict(headers), data=body, params=params)
    signer = bauth.S3SigV4Auth(Credentials(ak, sk, token), "s3", region)
    signer.add_auth(req)
    authz = req.headers["Authorization"]
    del req.headers["Authorization"]
    cr = signer.canonical_request(req)
    sts = signer.string_to_sign(req, cr)
    signed = {k.lower(): v for k, v in signer.headers_to_sign(req).items()}
    return {"canonical_request": cr, "string_to_sign": sts, "authorization": authz,
            "payload": req.headers["X-Amz-Content-SHA256"], "signed": signed}


def ours(dump, requests):
    """Signs every request with storage-sigv4-dump in one process."""
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    r = subprocess.run([dump], input=lines, capture_output=True, text=True, check=True)
    return [json.loads(x) for x in r.stdout.splitlines()]


def main():
    a = H.args()
    c = H.Checks()
    host = "127.0.0.1:4568"
    part = bytes(range(256)) * 64
    complete = (b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber>"
                b"<ETag>\"9bb58f26192e4ba00f01e2e7b136bbd8\"</ETag></Part></CompleteMultipartUpload>")
    md5 = lambda b: __import__("base64").b64encode(hashlib.md5(b).digest()).decode()
    upload_id = "VXBsb2FkIElE+/with=odd&chars"
    cases = [
        ("GET object", "GET", "/ckpt/jobs/step-000200/model.safetensors", {}, {}, b""),
        ("HEAD object", "HEAD", "/ckpt/jobs/a.bin", {}, {}, b""),
        ("DELETE object", "DELETE", "/ckpt/jobs/a.bin", {}, {}, b""),
        ("PUT object with Content-MD5", "PUT", "/ckpt/jobs/a.bin", {}, {"Content-MD5": md5(part)}, part),
        ("PUT key needing encoding", "PUT", "/ckpt/dir/a file+x ü=eq(1).bin", {}, {}, b"x"),
        ("CreateMultipartUpload", "POST", "/ckpt/jobs/big.bin", {"uploads": ""}, {}, b""),
        ("UploadPart", "PUT", "/ckpt/jobs/big.bin", {"partNumber": "3", "uploadId": upload_id},
         {"Content-MD5": md5(part)}, part),
        ("CompleteMultipartUpload", "POST", "/ckpt/jobs/big.bin", {"uploadId": upload_id},
         {"Content-Type": "application/xml", "Content-MD5": md5(complete)}, complete),
        ("AbortMultipartUpload", "DELETE", "/ckpt/jobs/big.bin", {"uploadId": upload_id}, {}, b""),
        ("ListObjectsV2 query string", "GET", "/ckpt",
         {"list-type": "2", "prefix": "jobs/a b/ü", "continuation-token": "1/abc+def=="}, {}, b""),
    ]
    creds = [("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None, "us-east-1"),
             ("ASIATESTKEY", "secret/with+chars", "FQoGZXIvYXdzEJr//////////wEaDM=", "eu-west-1")]
    expected, requests, names = [], [], []
    for ak, sk, token, region in creds:
        for name, method, path, params, headers, body in cases:
            b = botocore_sign(method, host, path, params, headers, body, ak, sk, token, region)
            # Our S3 client signs host, x-amz-date, x-amz-content-sha256,
            # the token and the request's own headers: the same set.
            payload = hashlib.sha256(body).hexdigest()
            c.ok(b["payload"] == payload, f"{name} [{region}]: payload hash agrees")
            expected.append(b)
            names.append(f"{name} [{region}]")
            requests.append({"method": method, "path": "raw:" + path, "amz_date": AMZ, "region": region,
                             "service": "s3", "payload": payload, "ak": ak, "sk": sk,
                             "query": list(params.items()), "headers": list(b["signed"].items())})
    got = ours(a.sigv4_dump, requests)
    c.ok(len(got) == len(expected), f"{len(got)} signatures for {len(expected)} requests")
    for name, o, b in zip(names, got, expected):
        same = o["canonical_request"] == b["canonical_request"]
        c.ok(same, f"{name}: canonical request")
        if not same:
            print("--- ours\n" + o["canonical_request"] + "\n--- botocore\n" + b["canonical_request"])
        c.ok(o["string_to_sign"] == b["string_to_sign"], f"{name}: string to sign")
        c.ok(o["authorization"] == b["authorization"], f"{name}: Authorization header")
    c.done()


if __name__ == "__main__":
    main()
