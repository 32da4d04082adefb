#!/usr/bin/env bash
# tests/gpu/run.sh — the prepared check for a lent GPU machine (issue 11).
#
# GPU time is rare and short, so everything is built here and the GPU
# machine only runs binaries:
#
#   tests/gpu/run.sh build OUT   (here, no GPU needed)
#       configures BUILD_GPU (default build-gpu) in Release with
#       TY_CUDA_GPU_TESTS=ON, builds test_kernels_device_gpu (the kernel
#       table of tests/kernels/test_kernels_device.c linked against the
#       nvcc-built `cuda` backend), and copies it with every shared library
#       `ldd` names outside the system's own (cudart, OpenBLAS, oneDNN,
#       gomp...) into OUT (libs.tar.xz); the driver (libcuda) and cuBLASLt
#       are the GPU machine's (its image has nvidia-cublas) and are never
#       carried. Also builds trainyard-engine (the CUDA backend linked in,
#       the CUDA runtime static, cuBLASLt dlopened) and carries it with
#       bench/engine-gpu/bench.py and scaling.py, and Open MPI's launcher
#       for scaling.py's ranks (carry-mpi.sh: OUT/ompi.tar.xz, Debian's
#       Open MPI relocated). Copies this script to OUT.
#       Also computes the PyTorch reference of the model check here
#       (make_ref.py in the tests/hf venv, HF_VENV, default
#       build-test/hf-venv: transformers' small GPT-2 and Llama, PyTorch
#       fp32 losses) into OUT/ref, and carries model_check.py.
#   OUT/run.sh gpu OUT [SECONDS]  (on the GPU machine; SECONDS default 420,
#       the whole run stays under it plus unpacking: < 8 minutes)
#       1. the kernel table against `cpu` at CI's shapes (scale 1) and at
#          larger ones (scale 8: T up to 560, C up to 1624, V 8008), each
#          group under a timeout, within 45% of the budget: every op's max
#          abs / rel error, PASS/FAIL per group;
#       2. model_check.py within 25%: the engine with backend cuda against
#          the PyTorch losses in fp32 (tolerance 2e-4) and bf16 (1e-2) for
#          GPT-2 and Llama, and resume on the GPU (SIGTERM after the first
#          step, resume, losses and exported weights identical to the
#          uninterrupted run);
#       2b. tests/qlora/gpu_train.py within 10% more: a short QLoRA
#          training (NF4 base, recompute all) on cuda against the CPU's
#          losses, fp32 (1e-4) and bf16 (2e-2);
#       2c. bench/engine-gpu/scaling.py within 10% more: with 2 or more
#          GPUs, GPT-2 124M bf16 T 1024 at world 1 and world N (all GPUs,
#          the ranks under mpirun as the server starts them), the same
#          per-GPU batch: tokens/s of each, scaling efficiency, rank 0's
#          all-reduce share, losses agreeing; with one GPU a SKIP line
#          ("1 GPU: scaling not measurable"); "scaling" in bench.json;
#       3. bench/engine-gpu in what is left (GPT-2 124M and Llama 1B at
#          T = 1024, bf16, largest batch that fits: tokens/s, MFU, peak
#          device memory; OUT/results/bench.json);
#       writing OUT/results/summary.txt: the device line, one PASS / FAIL
#       line per check with its numbers, and the overall verdict. Exit 0
#       only if every check passed.
#   run.sh dry OUT BUILD  (here, ctest gpu.run_dry)
#       every step of `gpu` on the emulated backend with BUILD's binaries
#       (test_kernels_device on cuda-emu for two small groups,
#       trainyard-engine-emu for the model check and bench.py --dry,
#       scaling.py --dry: world 1 and world 2 on the CPU backend), the
#       reference made here with fewer steps: proves the script, measures
#       nothing.
#
# Not here: llm.c's train_gpt2cu side by side (not packaged anywhere this
# machine can reach; docs/benchmarks.md says what to run on a GPU machine).
# Figures from `gpu` are the only GPU figures that may be quoted.
set -uo pipefail
mode=${1:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# checks RES TABLE BACKEND SCALES GROUPS ENGINE BIN REF LIMIT DRY DEVICE —
# the three parts of `gpu` (and of `dry`), PASS / FAIL lines into
# RES/summary.txt; exits with the verdict.
checks() {
  local res=$1 table=$2 backend=$3 scales=$4 groups=$5 engine=$6 bin=$7 ref=$8 limit=$9
  local dry=${10} device=${11}
  local sum="$res/summary.txt" start fail=0 left rc log
  mkdir -p "$res"
  start=$(date +%s)
  { date -u; echo "device: $device"; echo "budget: $limit s"; } >"$sum"
  elapsed() { echo $(($(date +%s) - start)); }
  # 1. the kernel table, within 45% of the budget
  for scale in $scales; do
    for g in $groups; do
      left=$((limit * 45 / 100 - $(elapsed)))
      if [ "$left" -lt 10 ]; then
        echo "FAIL table.$g.s$scale: time budget spent" >>"$sum"
        fail=1
        continue
      fi
      log="$res/$g.s$scale.log"
      timeout "$left" "$table" "$g" "$backend" "$scale" >"$log" 2>&1
      rc=$?
      grep -E '^(device: |op=|open: )' "$log" | sed "s/^/[s$scale] /" >>"$sum"
      if [ "$rc" -eq 0 ]; then echo "PASS table.$g.s$scale" >>"$sum"; else
        echo "FAIL table.$g.s$scale (rc $rc): $(grep -m3 FAIL "$log" | tr '\n' ' ')" >>"$sum"
        fail=1
      fi
    done
  done
  # 2. PyTorch reference (fp32, bf16) and resume, within 25% more
  left=$((limit * 70 / 100 - $(elapsed)))
  if [ "$left" -ge 20 ]; then
    python3 "$bin/model_check.py" "$engine" "$ref" "$res/model" $dry --budget "$left" \
      >"$res/model.log" 2>&1 || fail=1
    grep -E '^(PASS|FAIL) ' "$res/model.log" >>"$sum"
    grep -q -E '^PASS ' "$res/model.log" || { echo "FAIL model: $(tail -3 "$res/model.log" | tr '\n' ' ')" >>"$sum"; fail=1; }
  else
    echo "FAIL model: time budget spent" >>"$sum"
    fail=1
  fi
  # 2b. a short QLoRA training, cuda against cpu losses, within 10% more
  left=$((limit * 80 / 100 - $(elapsed)))
  if [ "$left" -ge 20 ]; then
    if timeout "$left" python3 "$bin/gpu_train.py" "$engine" $dry >"$res/qlora.log" 2>&1; then
      grep -E '^PASS ' "$res/qlora.log" >>"$sum"
    else
      echo "FAIL qlora: $(grep -E '^FAIL' "$res/qlora.log" | tr '\n' ' ') $(tail -2 "$res/qlora.log" | tr '\n' ' ')" >>"$sum"
      fail=1
    fi
  else
    echo "FAIL qlora: time budget spent" >>"$sum"
    fail=1
  fi
  # 2c. data-parallel scaling 1 -> all GPUs, within 10% more: scaling.py
  # writes its PASS / FAIL / SKIP line here and "scaling" into bench.json
  left=$((limit * 90 / 100 - $(elapsed)))
  python3 "$bin/scaling.py" "$engine" $dry --budget "$left" --summary "$sum" \
    --out "$res/bench.json" >"$res/scaling.log" 2>&1 || fail=1
  # 3. the benchmark in what is left
  left=$((limit - $(elapsed)))
  if [ "$left" -ge 30 ]; then
    if python3 "$bin/bench.py" "$engine" $dry --budget "$((left - 10))" --out "$res/bench.json" \
      >"$res/bench.log" 2>&1; then
      echo "PASS bench: $(tr '\n' ' ' <"$res/bench.log")" >>"$sum"
    else
      echo "FAIL bench: $(tail -3 "$res/bench.log" | tr '\n' ' ')" >>"$sum"
      fail=1
    fi
  else
    echo "FAIL bench: time budget spent" >>"$sum"
    fail=1
  fi
  echo "elapsed $(elapsed) s" >>"$sum"
  if [ "$fail" -eq 0 ]; then echo "RESULT PASS" >>"$sum"; else echo "RESULT FAIL" >>"$sum"; fi
  cat "$sum"
  exit $fail
}

case "$mode" in
build)
  out=${2:?usage: run.sh build OUT}
  src=$(cd "$here/../.." && pwd)
  bdir=${BUILD_GPU:-$src/build-gpu}
  set -e
  mkdir -p "$bdir"
  cmake -S "$src" -B "$bdir" -DCMAKE_BUILD_TYPE=Release -DTY_CUDA_GPU_TESTS=ON \
    ${CUDA_ARCHS:+-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS"} >"$bdir/gpu-build.log" 2>&1 ||
    { tail -20 "$bdir/gpu-build.log"; exit 1; }
  cmake --build "$bdir" -j "$(nproc)" --target test_kernels_device_gpu trainyard-engine \
    >>"$bdir/gpu-build.log" 2>&1 || { tail -30 "$bdir/gpu-build.log"; exit 1; }
  mkdir -p "$out/bin" "$out/stage"
  cp "$bdir/bin/test_kernels_device_gpu" "$bdir/bin/trainyard-engine" "$out/bin/"
  cp "$src/bench/engine-gpu/bench.py" "$src/bench/engine-gpu/scaling.py" "$here/model_check.py" \
    "$src/tests/qlora/gpu_train.py" "$out/bin/"
  # The PyTorch side of the model check, here (no PyTorch on the GPU).
  venv=${HF_VENV:-$src/build-test/hf-venv}
  [ -x "$venv/bin/python" ] || { echo "no tests/hf venv at $venv (ctest -R hf.venv makes it)"; exit 1; }
  "$venv/bin/python" "$here/make_ref.py" "$out/ref" >"$bdir/make_ref.log" 2>&1 ||
    { tail -20 "$bdir/make_ref.log"; exit 1; }
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
  bash "$here/carry-mpi.sh" "$out" # OUT/ompi.tar.xz: mpirun for scaling.py's ranks
  cp "$here/run.sh" "$out/run.sh"
  echo "ready: $out ($(du -sh "$out" | cut -f1)); on the GPU: $out/run.sh gpu $out"
  ;;
gpu)
  out=${2:?usage: run.sh gpu OUT [SECONDS]}
  limit=${3:-420}
  mkdir -p "$out/lib"
  tar -C "$out/lib" -xJf "$out/libs.tar.xz"
  [ -f "$out/ompi.tar.xz" ] && tar -C "$out" -xJf "$out/ompi.tar.xz" # carry-mpi.sh's
  lt=$(find /opt /usr -name 'libcublasLt.so.13' 2>/dev/null | head -1)
  [ -n "$lt" ] || { echo "no libcublasLt.so.13 on this machine" >&2; exit 1; }
  export LD_LIBRARY_PATH="$out/lib:$(dirname "$lt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export TY_CUBLASLT="$lt"
  device=$(nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader 2>&1)
  checks "$out/results" "$out/bin/test_kernels_device_gpu" cuda "1 8" \
    "context elementwise activations adamw embedding norm matmul matmul_gelu rope attention crossentropy convert nf4" \
    "$out/bin/trainyard-engine" "$out/bin" "$out/ref" "$limit" "" "$device"
  ;;
dry)
  out=${2:?usage: run.sh dry OUT BUILD}
  build=$(cd "${3:?usage: run.sh dry OUT BUILD}" && pwd)
  src=$(cd "$here/../.." && pwd)
  venv=${HF_VENV:-$build/hf-venv}
  rm -rf "$out"
  mkdir -p "$out/bin"
  cp "$here/model_check.py" "$src/bench/engine-gpu/bench.py" "$src/bench/engine-gpu/scaling.py" \
    "$src/tests/qlora/gpu_train.py" "$out/bin/"
  bash "$src/tests/hf/hfpy.sh" "$venv" "$here/make_ref.py" "$out/ref" 2 1 8 >"$out/make_ref.log" 2>&1
  rc=$?
  [ "$rc" -eq 77 ] && { cat "$out/make_ref.log"; exit 77; }
  [ "$rc" -eq 0 ] || { echo "make_ref.py failed:"; tail -20 "$out/make_ref.log"; exit 1; }
  checks "$out/results" "$build/bin/test_kernels_device" cuda-emu 1 "context matmul_gelu" \
    "$build/bin/trainyard-engine-emu" "$out/bin" "$out/ref" "${DRY_SECONDS:-500}" --dry \
    "cuda-emu on $(uname -m) (no GPU: nothing measured)"
  ;;
*)
  echo "usage: run.sh build OUT | run.sh gpu OUT [SECONDS] | run.sh dry OUT BUILD" >&2
  exit 2
  ;;
esac
