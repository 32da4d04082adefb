#!/usr/bin/python3
"""run_test.py — tests/gpu/run.sh's own output, here (no GPU).

  run_test.py dry RUN_SH BUILD DIR        ctest gpu.run_dry
      `run.sh dry DIR BUILD`: every step on the emulated backend; then
      what the GPU call would hand back must be there: RESULTS/summary.txt
      (the date, the device line, the budget, a PASS / FAIL / SKIP line for
      setup, both table groups, sanitize -- a SKIP in a dry run --, the
      model check, QLoRA, scaling and the bench, the elapsed line with each
      step's seconds, RESULT last) and RESULTS/results.tgz (every step's
      log, bench.json and the same summary.txt). Exits with run.sh's
      status when that holds (a FAIL verdict fails the test), 77 when the
      tests/hf venv is missing, else 1.
  run_test.py sanitize RUN_SH BUILD DIR   ctest gpu.sanitize_logic
      the sanitizer step alone (TY_GPU_STEPS=sanitize) on the emulated
      table with a stand-in compute-sanitizer (TY_SANITIZER): its options
      as run.sh gives them, the table taking the five groups in one
      process, and each verdict: clean -> PASS, errors (exit 99) -> FAIL
      and RESULT FAIL, "Device not supported" -> SKIP, a tool that outlives
      its share -> SKIP (timed out), a budget too short -> SKIP, and the
      step within its budget.
"""
import os
import re
import subprocess
import sys
import tarfile
import time

MODE, RUN_SH, BUILD, DIR = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3]), sys.argv[4]
failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def run(env=None, timeout=900):
    t0 = time.monotonic()
    p = subprocess.run(["bash", RUN_SH, "dry", DIR, BUILD], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t0


def results():
    """summary.txt's lines and results.tgz's members {name: bytes}."""
    res = os.path.join(DIR, "results")
    summ = os.path.join(res, "summary.txt")
    lines = open(summ).read().splitlines() if os.path.exists(summ) else []
    members = {}
    tgz = os.path.join(res, "results.tgz")
    if os.path.exists(tgz):
        with tarfile.open(tgz) as t:
            for m in t.getmembers():
                if m.isfile():
                    members[os.path.basename(m.name)] = t.extractfile(m).read()
    check(os.path.exists(summ) and os.path.exists(tgz), f"{res} holds summary.txt and results.tgz")
    check(sorted(os.listdir(res)) == ["results.tgz", "summary.txt"] if os.path.isdir(res) else False,
          "and nothing else (the device call returns at most 8 files)")
    check(len(lines) > 3 and lines[1].startswith("device: ") and lines[2].startswith("budget: "),
          f"summary.txt begins with the date, the device and the budget: {lines[:3]}")
    check(bool(lines) and re.match(r"RESULT (PASS|FAIL)$", lines[-1]) is not None and
          lines[-2].startswith("elapsed "), f"and ends with the elapsed time and the verdict: {lines[-2:]}")
    check(members.get("summary.txt", b"").decode().splitlines() == lines, "results.tgz holds the same summary.txt")
    return lines, members


def verdict(lines, step):
    """The verdict lines of a step (PASS / FAIL / SKIP step...)."""
    return [l for l in lines if re.match(r"(PASS|FAIL|SKIP) " + re.escape(step) + r"\b", l)]


if MODE == "dry":
    rc, out, secs = run()
    if rc == 77:
        print(out)
        sys.exit(77)
    print(out)
    lines, members = results()
    for step in ("setup", "table.context.s1", "table.matmul_gelu.s1", "model.ref.gpt2.fp32",
                 "model.ref.llama.bf16", "model.resume.gpt2.bf16", "qlora", "scaling", "bench"):
        check(len(verdict(lines, step)) >= 1, f"a verdict line for {step}: {verdict(lines, step)}")
    check(verdict(lines, "sanitize") == ["SKIP sanitize: dry run (cuda-emu runs on the CPU: nothing for "
                                         "compute-sanitizer to check)"], f"sanitize SKIPs: {verdict(lines, 'sanitize')}")
    for name in ("table.context.s1.log", "table.log", "model.log", "qlora.log", "scaling.log", "bench.log",
                 "bench.json", "make_ref.log"):
        check(name in members, f"results.tgz holds {name}")
    check(b'"scaling"' in members.get("bench.json", b"") and b'"gpt2-dry"' in members.get("bench.json", b""),
          "bench.json holds scaling's and bench's results")
    pline = [l for l in lines if l.startswith("PROFILE ")]
    check(len(pline) == 2 and all(re.search(r"GPU span [\d.]+ ms, in launches [\d.]+ ms, idle between them "
                                            r"[\d.]+ ms; largest: k_\w+", l) for l in pline),
          f"a PROFILE line for each shape, from the profiled run: {pline}")
    check(any(n.startswith("cuda-profile.") for n in members), "results.tgz holds the profile tables")
    mline = [l for l in lines if l.startswith("MODEL bench: ")]
    check(len(mline) == 1 and "gpt2-dry: no profile (profile.json has gpt2-124M" in mline[0],
          f"model.py's line follows the bench, naming the shapes it has no profile for: {mline}")
    times = re.findall(r"(\w+) (\d+) s", lines[-2]) if lines else []
    check([n for n, _ in times] == ["elapsed", "setup", "table", "model", "qlora", "scaling", "bench"],
          f"the elapsed line gives each step's seconds: {lines[-2] if lines else ''}")
    print(f"run.sh dry: exit {rc} in {secs:.0f} s")
    if failures:
        sys.exit(1)
    sys.exit(rc)

# sanitize: a stand-in compute-sanitizer. memcheck runs the table as the
# real tool would; racecheck reports a race; synccheck cannot attach;
# STANDIN_HANG makes every tool hang.
os.makedirs(DIR, exist_ok=True)
standin = os.path.join(os.path.abspath(DIR), "..", "compute-sanitizer-standin")
with open(standin, "w") as f:
    f.write(r'''#!/usr/bin/env bash
echo "$*" >>"$STANDIN_LOG"
[ -n "${STANDIN_HANG:-}" ] && exec sleep 600
tool= ; exitcode=1
while [ "${1#--}" != "$1" ]; do
  case "$1" in
    --tool) tool=$2; shift 2 ;;
    --error-exitcode) exitcode=$2; shift 2 ;;
    *) shift 2 ;;
  esac
done
echo "========= COMPUTE-SANITIZER"
case "$tool" in
  memcheck) "$@"; rc=$?; echo "========= ERROR SUMMARY: 0 errors"; exit $rc ;;
  racecheck) echo "========= Error: Race reported between Write access at k_attn+0x10 and Read access at k_attn+0x20"
             echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"
             echo "========= ERROR SUMMARY: 1 error"; exit "$exitcode" ;;
  synccheck) echo "========= Error: Device not supported. Please refer to the documentation"
             echo "open: CUDA device 0 setup: unknown error" >&2; exit 2 ;;
esac
exit 3
''')
os.chmod(standin, 0o755)
log = os.path.join(os.path.abspath(DIR), "..", "standin.log")
if os.path.exists(log):
    os.remove(log)
env = {"TY_GPU_STEPS": "sanitize", "TY_SANITIZER": os.path.abspath(standin), "STANDIN_LOG": log,
       "TY_SANITIZE_SECONDS": "90"}
rc, out, secs = run(env, timeout=300)
print(out)
lines, members = results()
calls = open(log).read().splitlines() if os.path.exists(log) else []
check(len(calls) == 3 and all(re.fullmatch(rf"--tool {t} --error-exitcode 99 --print-limit 20 \S+/test_kernels_device "
                                           r"attention,norm,elementwise,crossentropy,adamw cuda-emu 1", c)
                              for t, c in zip(("memcheck", "racecheck", "synccheck"), calls)),
      f"one call per tool, the five groups in one table process: {calls}")
s = verdict(lines, "sanitize.memcheck")
check(len(s) == 1 and s[0].startswith("PASS sanitize.memcheck: attention,norm,elementwise,crossentropy,adamw at "
                                      "scale 1: 0 errors"), f"memcheck clean: {s}")
check("op=adamw" in members.get("sanitize.memcheck.log", b"").decode() and
      "op=sumsq" in members.get("sanitize.memcheck.log", b"").decode(),
      "the table ran its groups under the tool (adamw's and sumsq's lines in the log)")
s = verdict(lines, "sanitize.racecheck")
check(len(s) == 1 and s[0].startswith("FAIL sanitize.racecheck: 1 error in ") and "Race reported" in s[0],
      f"racecheck's race fails, named: {s}")
s = verdict(lines, "sanitize.synccheck")
check(len(s) == 1 and s[0].startswith("SKIP sanitize.synccheck: compute-sanitizer cannot run here: ") and
      "Device not supported" in s[0], f"a device the tool cannot attach to is a SKIP: {s}")
check(rc == 1 and lines[-1] == "RESULT FAIL", f"a FAIL line fails the run: exit {rc}, {lines[-1:]}")
for step in ("table", "model", "qlora", "scaling", "bench"):
    check(verdict(lines, step) == [f"SKIP {step}: not selected"], f"{step} not selected: {verdict(lines, step)}")
# A tool that hangs is cut at its share (9 s / 3) and is no verdict.
env.update(STANDIN_HANG="1", TY_SANITIZE_SECONDS="9")
rc, out, secs = run(env, timeout=120)
print(out)
lines, members = results()
s = [l for l in lines if l.startswith(("PASS sanitize", "FAIL sanitize", "SKIP sanitize"))]
# (second-granularity clocks: the last tool may find its share already
# spent, which is a SKIP too)
check(len(s) == 3 and re.match(r"SKIP sanitize\.memcheck: timed out after \d+ s \(no verdict; budget 3 s\)", s[0])
      and all(re.match(r"SKIP sanitize\.\w+: (timed out after \d+ s \(no verdict; budget \d s\)|time budget spent)",
                       l) for l in s[1:]), f"hanging tools time out as SKIPs: {s}")
check(rc == 0 and lines[-1] == "RESULT PASS", f"SKIPs alone pass: exit {rc}")
check(secs < 9 + 3 * 5 + 10, f"the step keeps to its budget (timeout -k 5 on each tool): {secs:.0f} s")
print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
