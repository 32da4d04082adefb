#!/usr/bin/env bash
# fuzz.sh — builds and runs the libFuzzer targets of tests/fuzz (docs/fuzzing.md).
#
#   fuzz.sh build DIR                 configure + build tests/fuzz with clang into DIR
#   fuzz.sh run DIR TARGET SECONDS [SEED]
#                                     fuzz one target for SECONDS (SEED: libFuzzer's
#                                     -seed; ctest passes a fixed one, so a CI run
#                                     is repeatable; none = random, for make fuzz)
#   fuzz.sh all DIR SECONDS [JOBS]    build, then every target, JOBS at a time
#
# A run starts from the seeds in tests/fuzz/corpus/TARGET (read only) plus
# what earlier runs in DIR found (DIR/corpus/TARGET, where new inputs go), so
# a longer `make fuzz` keeps building on its corpus. A crash, leak, sanitizer
# report or per-input timeout fails the run; the input that did it is left in
# DIR/artifacts/TARGET/ and the command to reproduce it is printed.
# Exit 77 (ctest's skip) when clang or libFuzzer is not installed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
targets=(jobspec request safetensors tokenizer jsonl manifest)

find_clang() {
  local c
  for c in clang clang-14; do
    command -v "$c" >/dev/null 2>&1 && { echo "$c"; return 0; }
  done
  return 1
}

# Per-target input size limit: large enough for the real formats' headers.
max_len() {
  case "$1" in
    tokenizer|safetensors) echo 65536 ;;
    request) echo 20000 ;;
    *) echo 16384 ;;
  esac
}

build() {
  local dir="$1" cc
  if ! cc="$(find_clang)"; then
    echo "fuzz: clang is not installed (deploy/install-deps.sh installs clang and libclang-rt-14-dev)"
    exit 77
  fi
  if ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n){(void)d;(void)n;return 0;}' |
      "$cc" -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then
    echo "fuzz: $cc cannot link -fsanitize=fuzzer (install libclang-rt-14-dev)"
    exit 77
  fi
  local launcher=()
  command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache)
  cmake -S "$here" -B "$dir/build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE= "${launcher[@]}" >/dev/null
  cmake --build "$dir/build" -j "${FUZZ_BUILD_JOBS:-$(nproc)}"
}

run() {
  local dir="$1" t="$2" secs="$3" seed=()
  [ -n "${4:-}" ] && seed=(-seed="$4")
  local bin="$dir/build/fuzz_$t"
  if [ ! -x "$bin" ]; then
    find_clang >/dev/null || { echo "fuzz: clang is not installed; skipped"; exit 77; }
    echo "fuzz: $bin is missing (run: fuzz.sh build $dir)"
    exit 1
  fi
  local work="$dir/corpus/$t" art="$dir/artifacts/$t/"
  mkdir -p "$work" "$art"
  # ASan: leaks count; UBSan: any report aborts (also compiled in, -fno-sanitize-recover).
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1:${ASAN_OPTIONS:-}"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
  echo "fuzz: $t for ${secs}s (seeds $here/corpus/$t, corpus $work)"
  # A dictionary of the format's words, where there is one, speeds the
  # first minute up (field names the mutator would take long to spell).
  local dict=()
  [ -f "$here/dict/$t.dict" ] && dict=(-dict="$here/dict/$t.dict")
  local rc=0
  "$bin" "${seed[@]}" "${dict[@]}" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -max_len="$(max_len "$t")" \
         -print_final_stats=1 -artifact_prefix="$art" "$work" "$here/corpus/$t" 2>"$dir/$t.log" || rc=$?
  # The full log is long (every new coverage line); show its tail, or all of
  # it from the first sanitizer/libFuzzer report on failure.
  if [ $rc -ne 0 ]; then
    sed -n '/ERROR: \|runtime error\|==ERROR\|deadly signal\|ALARM\|out-of-memory\|^fuzz\(_[a-z]*\)\?: /,$p' "$dir/$t.log" | head -200
    local a
    for a in "$art"*; do
      [ -e "$a" ] && echo "fuzz: reproduce with: $bin $a"
    done
    echo "fuzz: $t FAILED (exit $rc; full log $dir/$t.log)"
    exit 1
  fi
  tail -n 15 "$dir/$t.log"
  echo "fuzz: $t ok"
}

cmd="${1:-}"
case "$cmd" in
  build) build "$2" ;;
  run) run "$2" "$3" "$4" "${5:-}" ;;
  all)
    dir="$2" secs="$3" jobs="${4:-1}"
    build "$dir"
    printf '%s\n' "${targets[@]}" |
      xargs -P "$jobs" -I{} bash "$0" run "$dir" {} "$secs"
    ;;
  *) echo "usage: fuzz.sh build DIR | run DIR TARGET SECONDS | all DIR SECONDS [JOBS]" >&2; exit 2 ;;
esac
