#!/usr/bin/env bash
# tests/gpu/run.sh — the prepared check for a lent GPU machine. docs/gpu.md
# is the playbook (the device call, what comes back, what to read when a
# step fails); this header is the reference.
#
# GPU time is rare and short, so everything is built here and the GPU
# machine only runs binaries:
#
#   tests/gpu/run.sh build DIR   (here, no GPU needed; DIR: the folder the
#       device call carries, inside the checkout and ignored by git, e.g.
#       build-gpu/carry)
#       configures BUILD_GPU (default build-gpu) in Release with
#       TY_CUDA_GPU_TESTS=ON, builds test_kernels_device_gpu (the kernel
#       table of tests/kernels/test_kernels_device.c linked against the
#       nvcc-built `cuda` backend) and trainyard-engine (the CUDA backend
#       linked in, the CUDA runtime static, cuBLASLt dlopened), and copies
#       them with every shared library `ldd` names outside the system's own
#       (OpenBLAS, oneDNN, gomp, MPI...) into DIR (libs.tar.xz); the driver
#       (libcuda) and cuBLASLt are the GPU machine's (its image has
#       nvidia-cublas) and are never carried. Open MPI's launcher for
#       scaling.py's ranks (carry-mpi.sh: DIR/ompi.tar.xz). The PyTorch
#       reference of the model check is computed here (make_ref.py in the
#       tests/hf venv, HF_VENV, default build-test/hf-venv) into DIR/ref.
#       Copies this script, model_check.py, gpu_train.py, bench.py,
#       scaling.py, model.py and profile.json into DIR and prints DIR's size: it travels with the
#       working tree, 64 MiB for both.
#
#   DIR/run.sh gpu DIR [RESULTS [SECONDS]]   (on the GPU machine)
#       RESULTS: where the verdict goes, the device tool's "$OUT" (default
#       $OUT when set, else DIR/results). SECONDS: the whole run, unpacking
#       included, default 450, so it ends before 460 s (each step's hard
#       timeout lets a stuck process 5 s to die after TERM).
#       RESULTS/summary.txt is written first (date, device line, budget)
#       and gains one PASS / FAIL / SKIP line per step as each ends, so a
#       run cut short still leaves its verdict so far; RESULTS/results.tgz
#       (every step's log, bench.json, a copy of summary.txt) is rewritten
#       after each step. The steps, each under `timeout -k 5` within its
#       share of SECONDS (a deadline at a fraction of it: time an early
#       step leaves unused goes to the next):
#       setup     unpack the libraries, find cuBLASLt (no budget share);
#       table     the kernel table against `cpu`, every group at CI's shapes
#                 (scale 1) then at larger ones (scale 8: T up to 560, C up
#                 to 1624, V 8008), until 33%: each op's max abs / rel
#                 error in table.log, one line per group and scale;
#       sanitize  compute-sanitizer (PATH, else /usr/local/cuda*/bin, or
#                 TY_SANITIZER) memcheck, racecheck and synccheck on the
#                 table at scale 1 for the groups attention, norm,
#                 elementwise (kn_sum / kn_sumsq / kn_nonfinite),
#                 crossentropy and adamw in one process per tool, 60 s in
#                 all (TY_SANITIZE_SECONDS); SKIP where the tool is absent
#                 or cannot attach to the device;
#       model     model_check.py until 62%: the engine on cuda against
#                 PyTorch's losses, fp32 and bf16, GPT-2 and Llama, and
#                 resume on the GPU;
#       qlora     tests/qlora/gpu_train.py until 70%: QLoRA on cuda
#                 against the CPU's losses;
#       scaling   bench/engine-gpu/scaling.py until 80%: world 1 against
#                 world N with N >= 2 GPUs, a SKIP line with one;
#       bench     bench/engine-gpu/bench.py until 98%: GPT-2 124M and
#                 Llama 1B at T 1024, bf16, tokens/s, MFU, peak memory
#                 (bench.json); a `PROFILE <shape>:` line each from a
#                 profiled run at the same batch (bench.py --profile: a
#                 step's GPU time in launches and idle, the largest
#                 launches; the tables under profile/ in results.tgz);
#                 then a `MODEL bench:` line (no verdict):
#                 model.py's roofline figure for each measured shape at
#                 its batch and T beside the measured one;
#       then `elapsed N s` and `RESULT PASS|FAIL`. Exit 0 only if no step
#       failed (SKIP is not a failure).
#       TY_GPU_STEPS="bench model" runs only those steps (the others get a
#       SKIP line), e.g. to retry one step in a second call.
#
#   run.sh dry DIR BUILD [RESULTS]   (here, ctest gpu.run_dry)
#       every step of `gpu` on the emulated backend with BUILD's binaries
#       (test_kernels_device on cuda-emu for two small groups,
#       trainyard-engine-emu for the model check, QLoRA and bench.py --dry,
#       scaling.py --dry: world 1 and world 2 on the CPU backend), the
#       reference made here with fewer steps, writing RESULTS (default
#       DIR/results) summary.txt and results.tgz as `gpu` does. The
#       sanitize step SKIPs (nothing on the CPU for compute-sanitizer to
#       check) unless TY_SANITIZER names a stand-in (gpu.sanitize_logic).
#       It proves the script and measures nothing.
#
# Not here: llm.c's train_gpt2cu side by side (not packaged anywhere this
# machine can reach; docs/benchmarks.md says what to run on a GPU machine).
# Figures from `gpu` are the only GPU figures that may be quoted.
set -uo pipefail
mode=${1:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
T0=$(date +%s)

SANITIZE_GROUPS="attention,norm,elementwise,crossentropy,adamw"

elapsed() { echo $(($(date +%s) - T0)); }
# Seconds left until PCT percent of the budget.
until_pct() { echo $((LIMIT * $1 / 100 - $(elapsed))); }
# One summary line: appended to summary.txt and echoed (the device tool
# returns the output's tail).
say() { printf '%s\n' "$*" >>"$SUM"; printf '%s\n' "$*"; }
# results.tgz: the logs so far and summary.txt, replaced whole each time.
pack() {
  cp "$SUM" "$LOGS/summary.txt"
  tar -C "$LOGS" -czf "$RES/results.tgz.part" . && mv -f "$RES/results.tgz.part" "$RES/results.tgz"
}
# Whether TY_GPU_STEPS (default: all) selects step $1.
selected() { [ -z "${TY_GPU_STEPS:-}" ] || [[ " ${TY_GPU_STEPS//,/ } " == *" $1 "* ]]; }
# limited SECONDS LOG CMD...: CMD under a hard timeout (TERM, then KILL 5 s
# later), stdout and stderr into LOG; its status (124 / 137: timed out).
limited() {
  local secs=$1 log=$2
  shift 2
  timeout -k 5 "$secs" "$@" >"$log" 2>&1
}
timed_out() { [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; }

# begin RESULTS DEVICE: summary.txt's head, before anything else runs.
begin() {
  RES=$1
  mkdir -p "$RES" "$LOGS"
  SUM="$RES/summary.txt"
  rm -f "$RES/results.tgz"
  { date -u '+%Y-%m-%d %H:%M:%S UTC'; echo "device: $2"; echo "budget: $LIMIT s"; } >"$SUM"
  cat "$SUM"
  FAIL=0
}

# timed NAME CMD...: runs the step CMD, adding "NAME N s" to TIMES.
TIMES=""
timed() {
  local name=$1 s0
  shift
  s0=$(elapsed)
  "$@"
  TIMES="$TIMES${TIMES:+, }$name $(($(elapsed) - s0)) s"
}

# finish: the verdict, the last pack, the exit status.
finish() {
  say "elapsed $(elapsed) s${TIMES:+ ($TIMES)}"
  if [ "$FAIL" -eq 0 ]; then say "RESULT PASS"; else say "RESULT FAIL"; fi
  pack
  exit "$FAIL"
}

step_table() { # TABLE BACKEND SCALES GROUPS
  local table=$1 backend=$2 scales=$3 groups=$4 left cap rc log s0
  for scale in $scales; do
    cap=$([ "$scale" -eq 1 ] && echo 30 || echo 60)
    for g in $groups; do
      left=$(until_pct 33)
      if [ "$left" -lt 5 ]; then
        say "SKIP table.$g.s$scale: time budget spent"
        continue
      fi
      log="$LOGS/table.$g.s$scale.log"
      s0=$(elapsed)
      limited $((left < cap ? left : cap)) "$log" "$table" "$g" "$backend" "$scale"
      rc=$?
      grep -E '^(device: |op=|open: )' "$log" | sed "s/^/[$g s$scale] /" >>"$LOGS/table.log"
      if [ "$rc" -eq 0 ]; then
        say "PASS table.$g.s$scale ($(($(elapsed) - s0)) s)"
      elif timed_out "$rc"; then
        say "FAIL table.$g.s$scale: timed out after $(($(elapsed) - s0)) s"
        FAIL=1
      else
        say "FAIL table.$g.s$scale (rc $rc): $(grep -m3 -E 'FAIL|open: ' "$log" | tr '\n' ' ')"
        FAIL=1
      fi
    done
  done
  pack
}

# The sanitizer: TY_SANITIZER, else compute-sanitizer on PATH, else under
# /usr/local/cuda*/bin.
find_sanitizer() {
  if [ -n "${TY_SANITIZER:-}" ]; then echo "$TY_SANITIZER"; return; fi
  command -v compute-sanitizer 2>/dev/null && return
  ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1
}

step_sanitize() { # TABLE BACKEND SANITIZER
  local table=$1 backend=$2 san=$3 total=${TY_SANITIZE_SECONDS:-60} end left cap rc log s0 errs tool
  end=$(($(elapsed) + total))
  for tool in memcheck racecheck synccheck; do
    left=$((end - $(elapsed)))
    cap=$((total / 3))
    [ "$left" -lt "$cap" ] && cap=$left
    if [ "$cap" -lt 3 ]; then
      say "SKIP sanitize.$tool: time budget spent"
      continue
    fi
    log="$LOGS/sanitize.$tool.log"
    s0=$(elapsed)
    limited "$cap" "$log" "$san" --tool "$tool" --error-exitcode 99 --print-limit 20 \
      "$table" "$SANITIZE_GROUPS" "$backend" 1
    rc=$?
    errs=$(grep -m1 -E 'ERROR SUMMARY: [0-9]+' "$log" | sed 's/.*ERROR SUMMARY: //')
    if [ "$rc" -eq 0 ]; then
      say "PASS sanitize.$tool: $SANITIZE_GROUPS at scale 1: ${errs:-no error summary} ($(($(elapsed) - s0)) s)"
    elif timed_out "$rc"; then
      say "SKIP sanitize.$tool: timed out after $(($(elapsed) - s0)) s (no verdict; budget $cap s)"
    elif grep -q -i -E 'device not supported|not supported on this|failed to initiali[sz]e|unable to (attach|initiali[sz]e)' "$log"; then
      say "SKIP sanitize.$tool: compute-sanitizer cannot run here: $(grep -m1 -i -E 'not supported|failed to initiali|unable to' "$log" | sed 's/^=* *//')"
    elif [ "$rc" -eq 99 ]; then
      say "FAIL sanitize.$tool: ${errs:-errors} in $SANITIZE_GROUPS: $(grep -m3 -E '^=+ +(Invalid|Race|Barrier|Error|.*hazard)' "$log" | sed 's/^=* *//' | tr '\n' ';')"
      FAIL=1
    else
      say "FAIL sanitize.$tool (rc $rc): $(grep -m3 -E 'FAIL|open: |Error' "$log" | tr '\n' ' ')"
      FAIL=1
    fi
  done
  pack
}

step_model() { # BIN ENGINE REF DRY
  local left rc
  left=$(until_pct 62)
  if [ "$left" -lt 20 ]; then say "FAIL model: time budget spent ($left s left)"; FAIL=1; return; fi
  limited "$left" "$LOGS/model.log" python3 "$1/model_check.py" "$2" "$3" "$WORK/model" $4 --budget $((left - 8))
  rc=$?
  grep -E '^(PASS|FAIL) ' "$LOGS/model.log" | while IFS= read -r l; do say "$l"; done
  if timed_out "$rc"; then
    say "FAIL model: timed out after $left s"
    FAIL=1
  elif [ "$rc" -ne 0 ]; then
    grep -q -E '^FAIL ' "$LOGS/model.log" || say "FAIL model (rc $rc): $(tail -3 "$LOGS/model.log" | tr '\n' ' ')"
    FAIL=1
  fi
  pack
}

step_qlora() { # BIN ENGINE DRY
  local left rc
  left=$(until_pct 70)
  if [ "$left" -lt 15 ]; then say "FAIL qlora: time budget spent ($left s left)"; FAIL=1; return; fi
  limited "$left" "$LOGS/qlora.log" python3 "$1/gpu_train.py" "$2" $3
  rc=$?
  grep -E '^(PASS|FAIL) ' "$LOGS/qlora.log" | while IFS= read -r l; do say "$l"; done
  if timed_out "$rc"; then
    say "FAIL qlora: timed out after $left s"
    FAIL=1
  elif [ "$rc" -ne 0 ]; then
    say "FAIL qlora (rc $rc): $(grep -E '^FAIL' "$LOGS/qlora.log" | tail -1) $(tail -2 "$LOGS/qlora.log" | tr '\n' ' ')"
    FAIL=1
  fi
  pack
}

step_scaling() { # BIN ENGINE DRY — scaling.py appends its own line
  local left rc n
  left=$(until_pct 80)
  n=$(wc -l <"$SUM")
  if [ "$left" -lt 5 ]; then say "SKIP scaling: time budget spent ($left s left)"; return; fi
  limited "$left" "$LOGS/scaling.log" python3 "$1/scaling.py" "$2" $3 --budget $((left - 5)) \
    --summary "$SUM" --out "$LOGS/bench.json"
  rc=$?
  [ "$(wc -l <"$SUM")" -gt "$n" ] && tail -n +$((n + 1)) "$SUM"
  if timed_out "$rc"; then
    say "FAIL scaling: timed out after $left s"
    FAIL=1
  elif [ "$rc" -ne 0 ]; then
    [ "$(wc -l <"$SUM")" -gt "$n" ] || say "FAIL scaling (rc $rc): $(tail -3 "$LOGS/scaling.log" | tr '\n' ' ')"
    FAIL=1
  fi
  pack
}

step_bench() { # BIN ENGINE DRY
  local left rc
  left=$(until_pct 98)
  if [ "$left" -lt 30 ]; then say "FAIL bench: time budget spent ($left s left)"; FAIL=1; return; fi
  limited "$left" "$LOGS/bench.log" python3 "$1/bench.py" "$2" $3 --budget $((left - 10)) \
    --out "$LOGS/bench.json" --profile "$LOGS/profile"
  rc=$?
  if [ "$rc" -eq 0 ]; then
    say "PASS bench: $(grep -v '^PROFILE ' "$LOGS/bench.log" | tr '\n' ' ')"
    # where each shape's GPU time went (a profiled run after the measured one)
    grep '^PROFILE ' "$LOGS/bench.log" | while IFS= read -r l; do say "$l"; done
    # the roofline's figure for the same shapes (modelled, no verdict)
    say "MODEL bench: $(timeout 20 python3 "$1/model.py" --profile "$1/profile.json" \
      --bench-json "$LOGS/bench.json" 2>&1 | tr '\n' ' ')"
  elif timed_out "$rc"; then
    say "FAIL bench: timed out after $left s: $(tr '\n' ' ' <"$LOGS/bench.log" | tail -c 600)"
    FAIL=1
  else
    say "FAIL bench (rc $rc): $(tail -4 "$LOGS/bench.log" | tr '\n' ' ')"
    FAIL=1
  fi
  pack
}

# checks TABLE BACKEND SCALES GROUPS ENGINE BIN REF DRY SANITIZER: the
# steps after setup, in order, then the verdict.
checks() {
  local table=$1 backend=$2 scales=$3 groups=$4 engine=$5 bin=$6 ref=$7 dry=$8 san=$9
  if selected table; then timed table step_table "$table" "$backend" "$scales" "$groups"; else say "SKIP table: not selected"; fi
  if ! selected sanitize; then
    say "SKIP sanitize: not selected"
  elif [ -z "$san" ]; then
    if [ -n "$dry" ]; then
      say "SKIP sanitize: dry run (cuda-emu runs on the CPU: nothing for compute-sanitizer to check)"
    else
      say "SKIP sanitize: no compute-sanitizer on PATH or under /usr/local/cuda*/bin"
    fi
  else
    timed sanitize step_sanitize "$table" "$backend" "$san"
  fi
  if selected model; then timed model step_model "$bin" "$engine" "$ref" "$dry"; else say "SKIP model: not selected"; fi
  if selected qlora; then timed qlora step_qlora "$bin" "$engine" "$dry"; else say "SKIP qlora: not selected"; fi
  if selected scaling; then timed scaling step_scaling "$bin" "$engine" "$dry"; else say "SKIP scaling: not selected"; fi
  if selected bench; then timed bench step_bench "$bin" "$engine" "$dry"; else say "SKIP bench: not selected"; fi
  finish
}

case "$mode" in
build)
  out=${2:?usage: run.sh build DIR}
  src=$(cd "$here/../.." && pwd)
  bdir=${BUILD_GPU:-$src/build-gpu}
  set -e
  mkdir -p "$bdir"
  cmake -S "$src" -B "$bdir" -DCMAKE_BUILD_TYPE=Release -DTY_CUDA_GPU_TESTS=ON \
    ${CUDA_ARCHS:+-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS"} >"$bdir/gpu-build.log" 2>&1 ||
    { tail -20 "$bdir/gpu-build.log"; exit 1; }
  cmake --build "$bdir" -j "$(nproc)" --target test_kernels_device_gpu trainyard-engine \
    >>"$bdir/gpu-build.log" 2>&1 || { tail -30 "$bdir/gpu-build.log"; exit 1; }
  # What an earlier build or run left in DIR (not DIR itself: it may hold more).
  rm -rf "$out/bin" "$out/stage" "$out/ref" "$out/lib" "$out/ompi" "$out/work" "$out/results" \
    "$out/libs.tar.xz" "$out/ompi.tar.xz" "$out/run.sh"
  mkdir -p "$out/bin" "$out/stage"
  cp "$bdir/bin/test_kernels_device_gpu" "$bdir/bin/trainyard-engine" "$out/bin/"
  cp "$src/bench/engine-gpu/bench.py" "$src/bench/engine-gpu/scaling.py" "$here/model_check.py" \
    "$src/tests/qlora/gpu_train.py" "$src/bench/engine-gpu/model.py" \
    "$src/bench/engine-gpu/profile.json" "$out/bin/"
  # Every resolved library except the C runtime's own, the GPU driver and
  # cuBLASLt (550 MB: the GPU image has it, in its PyTorch environment's
  # nvidia-cublas; the gpu phase finds it there). xz keeps what travels
  # under the device machine's 64 MiB.
  ldd "$bdir/bin/test_kernels_device_gpu" "$bdir/bin/trainyard-engine" | awk '/=> \// {print $3}' |
    sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcublasLt.so*) ;;
      *) cp -L "$lib" "$out/stage/" ;;
    esac
  done
  tar -C "$out/stage" -cJf "$out/libs.tar.xz" .
  rm -rf "$out/stage"
  bash "$here/carry-mpi.sh" "$out" # DIR/ompi.tar.xz: mpirun for scaling.py's ranks
  cp "$here/run.sh" "$out/run.sh"
  # The PyTorch side of the model check, here (last: the rest is usable
  # without it).
  venv=${HF_VENV:-$src/build-test/hf-venv}
  [ -x "$venv/bin/python" ] || { echo "no tests/hf venv at $venv (ctest -R hf.venv makes it)"; exit 1; }
  "$venv/bin/python" "$here/make_ref.py" "$out/ref" >"$bdir/make_ref.log" 2>&1 ||
    { tail -20 "$bdir/make_ref.log"; exit 1; }
  bytes=$(du -sb "$out" | cut -f1)
  # What travels beside it: tracked and untracked-not-ignored files.
  tree=$(cd "$src" && git ls-files -z --cached --others --exclude-standard |
    du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1) || tree=0
  echo "ready: $out: $((bytes >> 20)) MiB carried ($bytes bytes) + $((${tree:-0} >> 20)) MiB of working tree" \
    "(the device call takes 64 MiB in all)"
  [ $((bytes + ${tree:-0})) -lt $((64 << 20)) ] || { echo "too large for the device call"; exit 1; }
  ;;
gpu)
  dir=$(cd "${2:?usage: run.sh gpu DIR [RESULTS [SECONDS]]}" && pwd)
  res=${3:-${OUT:-$dir/results}}
  LIMIT=${4:-450}
  WORK="$dir/work"
  LOGS="$WORK/logs"
  rm -rf "$WORK"
  begin "$res" "$(timeout 20 nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader 2>&1 | tr '\n' ';')"
  # setup: the carried libraries and launcher, the machine's cuBLASLt.
  s0=$(elapsed)
  mkdir -p "$dir/lib"
  if ! limited 60 "$LOGS/setup.log" tar -C "$dir/lib" -xJf "$dir/libs.tar.xz"; then
    say "FAIL setup: could not unpack libs.tar.xz: $(tail -2 "$LOGS/setup.log" | tr '\n' ' ')"
    FAIL=1
    finish
  fi
  [ -f "$dir/ompi.tar.xz" ] && limited 60 "$LOGS/setup-ompi.log" tar -C "$dir" -xJf "$dir/ompi.tar.xz"
  # cuBLASLt: TY_CUBLASLT when it names a file, else the image's.
  lt=${TY_CUBLASLT:-}
  [ -f "$lt" ] || lt=$(timeout 30 find /opt /usr -name 'libcublasLt.so.13' 2>/dev/null | head -1)
  if [ -z "$lt" ]; then
    say "FAIL setup: no libcublasLt.so.13 under /opt or /usr (TY_CUBLASLT names another)"
    FAIL=1
    finish
  fi
  export LD_LIBRARY_PATH="$dir/lib:$(dirname "$lt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export TY_CUBLASLT="$lt"
  export PYTHONUNBUFFERED=1
  san=$(find_sanitizer)
  say "PASS setup: libraries unpacked, cuBLASLt $lt, compute-sanitizer ${san:-none} ($(($(elapsed) - s0)) s)"
  TIMES="setup $(($(elapsed) - s0)) s"
  checks "$dir/bin/test_kernels_device_gpu" cuda "1 8" \
    "context elementwise activations adamw embedding norm matmul matmul_gelu rope attention crossentropy convert nf4" \
    "$dir/bin/trainyard-engine" "$dir/bin" "$dir/ref" "" "$san"
  ;;
dry)
  out=${2:?usage: run.sh dry DIR BUILD [RESULTS]}
  build=$(cd "${3:?usage: run.sh dry DIR BUILD [RESULTS]}" && pwd)
  src=$(cd "$here/../.." && pwd)
  venv=${HF_VENV:-$build/hf-venv}
  rm -rf "$out"
  mkdir -p "$out/bin"
  out=$(cd "$out" && pwd)
  LIMIT=${DRY_SECONDS:-500}
  WORK="$out/work"
  LOGS="$WORK/logs"
  begin "${4:-$out/results}" "cuda-emu on $(uname -m) (no GPU: nothing measured)"
  cp "$here/model_check.py" "$src/bench/engine-gpu/bench.py" "$src/bench/engine-gpu/scaling.py" \
    "$src/tests/qlora/gpu_train.py" "$src/bench/engine-gpu/model.py" \
    "$src/bench/engine-gpu/profile.json" "$out/bin/"
  export PYTHONUNBUFFERED=1
  if selected model; then # the reference: in the hf venv, here as on the build machine
    s0=$(elapsed)
    bash "$src/tests/hf/hfpy.sh" "$venv" "$here/make_ref.py" "$out/ref" 2 1 8 >"$LOGS/make_ref.log" 2>&1
    rc=$?
    [ "$rc" -eq 77 ] && { cat "$LOGS/make_ref.log"; exit 77; }
    if [ "$rc" -ne 0 ]; then
      say "FAIL setup: make_ref.py failed: $(tail -3 "$LOGS/make_ref.log" | tr '\n' ' ')"
      FAIL=1
      finish
    fi
    say "PASS setup: PyTorch reference made ($(($(elapsed) - s0)) s)"
    TIMES="setup $(($(elapsed) - s0)) s"
  fi
  checks "$build/bin/test_kernels_device" cuda-emu 1 "context matmul_gelu" \
    "$build/bin/trainyard-engine-emu" "$out/bin" "$out/ref" --dry "${TY_SANITIZER:-}"
  ;;
*)
  echo "usage: run.sh build DIR | run.sh gpu DIR [RESULTS [SECONDS]] | run.sh dry DIR BUILD [RESULTS]" >&2
  exit 2
  ;;
esac
