#!/usr/bin/env bash
# fetch-nccl.sh DEST [--libs] — nccl.h (and, with --libs, libnccl.so.2) for
# the engine's NCCL collectives (coll_nccl.c), from NVIDIA's pinned PyPI
# wheel, the way kernels/cuda/fetch-cublas.sh fetches cuBLASLt: run by CMake
# at configure time into the build tree when the CUDA build is on; a stamp
# makes it run once. Non-zero exit (reason on stderr) when the index is
# unreachable: the engine is then built without NCCL and says so.
set -euo pipefail
DEST=${1:?usage: fetch-nccl.sh DEST [--libs]}
WANT_LIBS=${2:-}
PIN="nvidia-nccl-cu13==2.32.3"
STAMP="$DEST/.stamp-$PIN${WANT_LIBS:+-libs}"
[ -f "$STAMP" ] && exit 0
mkdir -p "$DEST"
tmp=$(mktemp -d "$DEST/.dl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "$PIN" >"$tmp/log" 2>&1; then
  echo "fetch-nccl: cannot download $PIN from the package index:" >&2
  tail -3 "$tmp/log" >&2
  exit 1
fi
whl=$(ls "$tmp"/*.whl)
python3 - "$whl" "$DEST" "$WANT_LIBS" <<'PY'
import os, sys, zipfile
whl, dest, libs = sys.argv[1], sys.argv[2], sys.argv[3] == "--libs"
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.endswith("/include/nccl.h"):
            out = os.path.join(dest, "include", "nccl.h")
        elif libs and n.endswith("/lib/libnccl.so.2"):
            out = os.path.join(dest, "lib", "libnccl.so.2")
        else:
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(n) as src, open(out, "wb") as dst:
            dst.write(src.read())
PY
touch "$STAMP"
