#!/usr/bin/env bash
# test.sh BUILD TEST_BUILD JOBS — `make test`, one line a stage.
#
# Installing packages, two builds and three hundred tests print thousands
# of lines (apt's, CMake's, make's, one per test) that bury the one that
# failed. Each stage's output goes to a log in TEST_BUILD; the terminal gets
# a line per stage, a progress line a minute while ctest runs, then the
# output of every test that failed, in full, and ctest's own summary (the
# "tests passed" line CI reads, the list of failures, the total time).
set -uo pipefail
build=$1 tbuild=$2 jobs=$3
mkdir -p "$tbuild"
logs=$(cd "$tbuild" && pwd)
start=$(date +%s)
stage() { # stage NAME LOG CMD... — runs CMD into LOG; on failure shows it and exits
  local name=$1 log=$2 t0
  shift 2
  t0=$(date +%s)
  if ! "$@" >"$log" 2>&1; then
    echo "test: $name FAILED; the end of $log:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
  echo "test: $name done in $(($(date +%s) - t0))s (log: $log)"
}
stage "packages (apt, npm)" "$logs/deps.log" bash -c 'bash deploy/install-deps.sh && bash tests/setup-npm.sh'
# The Release binaries `make run` uses: a warning only an optimised build
# raises must not break the README's first command.
bash deploy/build.sh "$build" Release "$jobs" trainyard trainyard-engine || exit 1
# The sanitizer build's nvcc compiles the three code paths of kernels/cuda
# (sm_75's f16-only products, sm_80's, sm_90a's); the Release build above
# compiles every architecture a user's GPU may be, with the same warnings
# as errors, so sm_86 and sm_89 (sm_80's code) are not compiled twice.
stage "configure $tbuild (sanitizers)" "$logs/configure.log" \
  cmake -S . -B "$tbuild" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTY_SANITIZE=ON \
  "-DCMAKE_CUDA_ARCHITECTURES=75;80;90a"
stage "build $tbuild" "$logs/build.log" env -u MAKEFLAGS -u MAKELEVEL cmake --build "$tbuild" -j "$jobs"
total=$(cd "$tbuild" && ctest -N | sed -n 's/^Total Tests: //p')
echo "test: running ${total:-the} tests (ctest -j $jobs; log: $logs/ctest.log)"
(cd "$tbuild" && ctest --output-on-failure -j "$jobs" --timeout 900) >"$logs/ctest.log" 2>&1 &
pid=$!
last=$(date +%s)
while kill -0 "$pid" 2>/dev/null; do
  sleep 2
  if [ $(($(date +%s) - last)) -ge 60 ]; then
    last=$(date +%s)
    done_n=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#' "$logs/ctest.log")
    failed_n=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#.*\*\*\*' "$logs/ctest.log")
    echo "test: $done_n of ${total:-?} tests done, $failed_n failed, $(($(date +%s) - start))s so far"
  fi
done
wait "$pid"
rc=$?
# Each failure as ctest printed it with --output-on-failure: its status
# line and its output, up to the next test's line.
awk '/^ *[0-9]+\/[0-9]+ Test +#/ { show = ($0 ~ /\*\*\*/) }
     /^ *Start +[0-9]+:/ { show = 0 }
     /% tests passed/ { exit }
     show' "$logs/ctest.log"
sed -n '/% tests passed/,$p' "$logs/ctest.log"
echo "test: all stages in $(($(date +%s) - start))s"
exit $rc
