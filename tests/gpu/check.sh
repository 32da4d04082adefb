#!/usr/bin/env bash
# check.sh ENGINE — what can be checked here of tests/gpu/run.sh (ctest
# gpu.carry_check): the script parses, and the engine it carries to a GPU
# machine starts there with only what ldd names: every library resolves,
# and neither the CUDA runtime (linked statically) nor cuBLASLt (loaded at
# run time, TY_CUBLASLT / LD_LIBRARY_PATH) nor the driver is a link-time
# dependency, so a machine without them still runs CPU jobs.
set -euo pipefail
engine=${1:?usage: check.sh ENGINE}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash -n "$here/run.sh"
out=$(ldd "$engine")
if grep -q "not found" <<<"$out"; then
  echo "FAIL: unresolved libraries:"; grep "not found" <<<"$out"; exit 1
fi
if grep -E -q "libcudart|libcublas|libcuda\.so" <<<"$out"; then
  echo "FAIL: the engine links a CUDA library dynamically:"; grep -E "libcudart|libcublas|libcuda\.so" <<<"$out"
  exit 1
fi
carried=$(awk '/=> \// {print $3}' <<<"$out" | grep -v -E '/(libc|libm|libpthread|libdl|librt)\.so|ld-linux' || true)
bytes=0
for lib in $carried; do bytes=$((bytes + $(stat -L -c %s "$lib"))); done
echo "ok: run.sh parses; the engine needs $(wc -w <<<"$carried") libraries beyond libc ($((bytes >> 20)) MiB before xz), all resolved, no CUDA library among them"
"$engine" --help >/dev/null 2>&1 || { echo "FAIL: the engine does not start"; exit 1; }
