#!/usr/bin/env bash
# build.sh DIR TYPE JOBS TARGET... — the quiet build behind `make build`,
# `make run`, `make demo` and `make install`.
#
# CMake and the make it drives print a hundred "Entering directory" and
# progress lines that hide the one line a person needs; they go to
# DIR/build.log instead. While it builds, one line every 15 s (or at each
# tenth of the way) says how far it is and about how long is left, so a
# first build of several minutes never looks hung. On success it prints a
# short summary (what, where, how long, which backends this machine can
# use) and the binaries' absolute paths; on failure the errors and the end
# of the log, and where the whole log is.
set -uo pipefail
dir=$1 type=$2 jobs=$3
shift 3
mkdir -p "$dir"
log="$dir/build.log"
start=$(date +%s)
fresh=1
[ -f "$dir/CMakeCache.txt" ] && fresh=0
fail() {
  echo "build: FAILED. The errors:" >&2
  grep -E "error|Error" "$log" | head -n 30 >&2
  echo "... the end of the log:" >&2
  tail -n 15 "$log" >&2
  echo "build: the whole log is $log" >&2
  exit 1
}
echo "build: configuring $type in $dir$([ $fresh = 1 ] && echo ' (first build: a few minutes)')"
# MAKEFLAGS from an outer make would turn the directory lines back on and
# hand cmake's make a jobserver it does not need.
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="$type" >"$log" 2>&1 || fail
env -u MAKEFLAGS -u MAKELEVEL cmake --build "$dir" -j "$jobs" --target "$@" >>"$log" 2>&1 &
pid=$!
said=-1 last=$(date +%s)
while kill -0 "$pid" 2>/dev/null; do
  sleep 1
  pct=$(grep -o '^\[ *[0-9]*%\]' "$log" | tail -n 1 | tr -dc 0-9)
  [ -n "$pct" ] || continue
  now=$(date +%s)
  if [ $((pct / 10)) -gt $((said / 10)) ] || [ $((now - last)) -ge 15 ]; then
    el=$((now - start)) left=""
    [ "$pct" -gt 5 ] && [ "$pct" -lt 100 ] && left=", about $(( (el * (100 - pct) / pct + 59) / 60 )) min left"
    echo "build: compiling, ${pct}% after ${el}s${left}"
    said=$pct last=$now
  fi
done
wait "$pid" || fail
secs=$(( $(date +%s) - start ))
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$dir/CMakeCache.txt")
cuda=$(sed -n 's/.*trainyard: CUDA backend \([A-Za-z]*\).*/\1/p' "$log" | tail -n 1)
# What this machine can run, not only what was compiled.
if [ "$cuda" = "ON" ]; then
  if [ -e /dev/nvidiactl ] || nvidia-smi -L >/dev/null 2>&1; then
    backends="CPU and CUDA (a GPU is present)"
  else
    backends="CPU (CUDA compiled in; no GPU found)"
  fi
else
  backends="CPU (CUDA not compiled: no toolkit or no cuBLASLt header)"
fi
abs=$(cd "$dir" && pwd)
echo "build: trainyard ${version:-?} ($type) in ${secs}s; log in $log"
echo "build: backends usable here: $backends"
for t in "$@"; do
  echo "  $abs/bin/$t"
done
