#!/usr/bin/env bash
# fetch-cublas.sh DEST — the cuBLAS / cuBLASLt headers (and, with --libs,
# libcublasLt) for the CUDA backend, from NVIDIA's pinned PyPI wheel.
#
# The CUDA toolkit on our build and CI machines ships nvcc and the runtime
# but not the math libraries; NVIDIA publishes them as wheels. CMake runs
# this at configure time (kernels/cuda/CMakeLists.txt) into the build tree,
# so a fresh clone needs nothing installed by hand; a stamp makes it run
# once. Exit status non-zero (with the reason on stderr) when the index is
# unreachable: the build then leaves the CUDA backend out and says so.
set -euo pipefail
DEST=${1:?usage: fetch-cublas.sh DEST [--libs]}
WANT_LIBS=${2:-}
PIN="nvidia-cublas==13.10.0.20"
STAMP="$DEST/.stamp-$PIN${WANT_LIBS:+-libs}"
[ -f "$STAMP" ] && exit 0
mkdir -p "$DEST"
tmp=$(mktemp -d "$DEST/.dl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "$PIN" >"$tmp/log" 2>&1; then
  echo "fetch-cublas: cannot download $PIN from the package index:" >&2
  tail -3 "$tmp/log" >&2
  exit 1
fi
whl=$(ls "$tmp"/*.whl)
python3 - "$whl" "$DEST" "$WANT_LIBS" <<'PY'
import os, sys, zipfile
whl, dest, libs = sys.argv[1], sys.argv[2], sys.argv[3] == "--libs"
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        base = os.path.basename(n)
        if "/include/" in n and base.endswith(".h"):
            out = os.path.join(dest, "include", base)
        elif libs and base == "libcublasLt.so.13":
            out = os.path.join(dest, "lib", base)
        else:
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(n) as src, open(out, "wb") as dst:
            dst.write(src.read())
if libs:
    link = os.path.join(dest, "lib", "libcublasLt.so")
    if not os.path.lexists(link):
        os.symlink("libcublasLt.so.13", link)
PY
touch "$STAMP"
