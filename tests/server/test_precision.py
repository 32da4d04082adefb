"""test_precision.py — precision against the backend at submit: a
precision the chosen backend cannot run is a 400 naming the
field `precision`; fp16 and bf16 on the CPU are accepted (the CPU engine is
the reference for them) and stored with the job; export.dtype and
hyperparameters.recompute round-trip through GET /jobs/{id}.

The test server has no GPUs (--gpus none), so CUDA can run nothing.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tyharness import check, run_tests, setup, spec  # noqa: E402


def test_validate():
    srv, model, train = setup(None, "--gpus", "none")
    # CUDA asked for explicitly, in any precision: nothing can run it here.
    for prec in ("fp32", "bf16", "fp16"):
        r = srv.submit(spec(model, train, precision=prec, resources={"backend": "cuda"}), expect=400)
        check(r["error"]["field"] == "precision" and prec in r["error"]["message"]
              and "no CUDA GPUs" in r["error"]["message"], "cuda/%s: %r" % (prec, r))
    # The CPU runs all three, explicitly or through auto without GPUs.
    for prec, backend in (("fp16", "cpu"), ("bf16", "cpu"), ("bf16", "auto"), ("fp32", "auto")):
        j = srv.submit(spec(model, train, precision=prec, resources={"backend": backend},
                            export={"dtype": "bf16"}, hyperparameters={"recompute": "mlp"}))
        got = srv.job(j["id"])["spec"]
        check(got["precision"] == prec and got["export"] == {"dtype": "bf16"}
              and got["hyperparameters"]["recompute"] == "mlp", "stored spec %r" % got)
        srv.post("/jobs/%d/cancel" % j["id"])
    # A precision that is not one at all is still the parser's 400.
    r = srv.submit(spec(model, train, precision="fp8"), expect=400)
    check(r["error"]["field"] == "precision", "fp8: %r" % r)


if __name__ == "__main__":
    run_tests({"validate": test_validate})
