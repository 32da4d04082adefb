#!/usr/bin/env bash
# setup-venv.sh — the Hugging Face reference environment for tests/hf, made by
# `make test` itself (ctest fixture hf.venv runs this first).
#
# Usage: setup-venv.sh VENV_DIR REQUIREMENTS
#
# The venv lives under the build tree and is reused: it is rebuilt only when
# the requirements file or the interpreter changes (a stamp holds both), so a
# second `make test` spends well under a second here. A fresh one is built
# beside the old one and renamed into place, so an interrupted install never
# leaves a half-made venv that looks ready. torch is the CPU wheel from
# /opt/wheels when the machine carries it, else whatever pip finds.
#
# When the install fails, the package index is probed: if it cannot be
# reached at all, VENV_DIR.unavailable records why and the hf.* tests skip
# (exit 77) naming that reason; if it can, the failure is a real one and this
# script fails with pip's log.
set -uo pipefail
venv=$1
req=$2
py=${TY_HF_PYTHON:-python3}
wheel_dir=${TY_HF_WHEELS:-/opt/wheels}

pyver=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])') || {
  echo "hf.venv: $py does not run" >&2; exit 1; }
want="$(sha256sum "$req" | cut -d' ' -f1) python $pyver"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.ty-stamp" 2>/dev/null)" = "$want" ]; then
  echo "hf.venv: reusing $venv ($pyver)"
  exit 0
fi

rm -f "$venv.unavailable"
tmp="$venv.new"
rm -rf "$tmp"
log="$venv.pip.log"
echo "hf.venv: creating $venv with $py $pyver from $req (a few minutes, once)"
"$py" -m venv "$tmp" >"$log" 2>&1 || { cat "$log"; exit 1; }

# The pinned torch CPU wheel from the local file when it is there.
args=(-r "$req")
torch_pin=$(sed -n 's/^torch==\([^ ]*\).*/\1/p' "$req")
wheel=$(ls "$wheel_dir"/torch-"$torch_pin"+cpu-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] && args=("$wheel" "${args[@]}")
if ! "$tmp/bin/python" -m pip install --disable-pip-version-check --no-input "${args[@]}" >>"$log" 2>&1; then
  index=${PIP_INDEX_URL:-$("$tmp/bin/python" -m pip config get global.index-url 2>/dev/null || true)}
  index=${index:-https://pypi.org/simple}
  if ! "$tmp/bin/python" - "$index" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/pip/", timeout=15).read(1)
PY
  then
    reason="the package index $index cannot be reached; pip said: $(grep -m1 -iE 'error|retrying' "$log" | cut -c1-200)"
    echo "$reason" >"$venv.unavailable"
    rm -rf "$tmp"
    echo "hf.venv: SKIPPED: $reason"
    exit 0
  fi
  echo "hf.venv: pip install failed although $index is reachable:" >&2
  tail -30 "$log" >&2
  rm -rf "$tmp"
  exit 1
fi
# Every pin must be what got installed (pip may not silently pick another).
"$tmp/bin/python" - "$req" <<'PY' >>"$log" 2>&1 || { echo "hf.venv: installed versions differ from $req:" >&2; tail -5 "$log" >&2; rm -rf "$tmp"; exit 1; }
import sys
from importlib.metadata import version
bad = []
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, pin = line.split("==")
    got = version(name).split("+")[0]
    if got != pin:
        bad.append(f"{name} {got} (pinned {pin})")
if bad:
    sys.exit("; ".join(bad))
PY
echo "$want" >"$tmp/.ty-stamp"
rm -rf "$venv"
mv "$tmp" "$venv"
echo "hf.venv: ready: $venv"
