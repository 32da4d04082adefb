#!/usr/bin/env bash
# Runs every benchmark area (bench/<area>/run.sh BUILD_DIR) one after another.
# Each prints its own figures and the ratio against its named peer.
# Usage: bench/run-all.sh [BUILD_DIR] [AREA...]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd); shift || true
areas=("$@")
[ ${#areas[@]} -gt 0 ] || areas=(server engine-cpu engine-dp kernels tokenizer dataset storage generate qlora web)
status=0
for a in "${areas[@]}"; do
  [ -x "$here/$a/run.sh" ] || [ -f "$here/$a/run.sh" ] || { echo "== $a: no benchmark"; continue; }
  echo "== $a"
  bash "$here/$a/run.sh" "$build" || { echo "== $a: FAILED"; status=1; }
done
exit $status
