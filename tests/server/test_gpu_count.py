"""test_gpu_count.py — a job asking for more GPUs than the server has is
refused at submit: 400 invalid_spec naming the field
`resources.gpus`, with the count asked for and the count the server has,
before anything is queued.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tyharness import check, run_tests, setup, spec  # noqa: E402


def refused(srv, model, train, want, have):
    r = srv.submit(spec(model, train, resources={"gpus": want}), expect=400)
    e = r["error"]
    check(e["field"] == "resources.gpus" and ("asks for %d GPU" % want) in e["message"]
          and ("has %d" % have) in e["message"], "gpus %d on %d: %r" % (want, have, r))


def test_count():
    # No GPUs at all: one is too many; the job list stays empty.
    srv, model, train = setup(None, "--gpus", "none")
    refused(srv, model, train, 1, 0)
    refused(srv, model, train, 8, 0)
    body = srv.get("/jobs").json
    jobs = body.get("jobs", []) if isinstance(body, dict) else body
    check(jobs == [], "a refused job was queued: %r" % body)
    srv.stop()
    # Two GPUs named on the command line: three are refused with the count.
    srv, model, train = setup(None, "--gpus", "0,1")
    refused(srv, model, train, 3, 2)
    srv.stop()


if __name__ == "__main__":
    run_tests({"count": test_count})
