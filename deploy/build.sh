#!/usr/bin/env bash
# build.sh DIR TYPE JOBS TARGET... — the quiet build behind `make build`,
# `make run`, `make demo` and `make install`.
#
# CMake and the make it drives print a hundred "Entering directory" and
# progress lines that hide the one line a person needs; they go to
# DIR/build.log instead. On success this prints a three-line summary (what,
# where, how long) and the binaries' absolute paths; on failure the errors
# and the end of the log, and where the whole log is.
set -uo pipefail
dir=$1 type=$2 jobs=$3
shift 3
mkdir -p "$dir"
log="$dir/build.log"
start=$(date +%s)
# MAKEFLAGS from an outer make would turn the directory lines back on and
# hand cmake's make a jobserver it does not need.
if ! { cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="$type" &&
       env -u MAKEFLAGS -u MAKELEVEL cmake --build "$dir" -j "$jobs" --target "$@"; } >"$log" 2>&1; then
  echo "build: FAILED. The errors:" >&2
  grep -E "error|Error" "$log" | head -n 30 >&2
  echo "... the end of the log:" >&2
  tail -n 15 "$log" >&2
  echo "build: the whole log is $log" >&2
  exit 1
fi
secs=$(( $(date +%s) - start ))
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$dir/CMakeCache.txt")
cuda=$(sed -n 's/.*trainyard: CUDA backend \([A-Za-z]*\).*/\1/p' "$log" | tail -n 1)
abs=$(cd "$dir" && pwd)
echo "build: trainyard ${version:-?} ($type, CUDA backend ${cuda:-?}) in ${secs}s; log in $log"
for t in "$@"; do
  echo "  $abs/bin/$t"
done
