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
#       bench/engine-gpu/bench.py. Copies this script to OUT.
#   OUT/run.sh gpu OUT [SECONDS]  (on the GPU machine)
#       runs the table against `cuda` at CI's shapes (scale 1) and at
#       larger ones (scale 8: T up to 560, C up to 1624, V 8008), each
#       group under a timeout, and writes OUT/results/summary.txt: the
#       device line, every op's max abs / rel error against the CPU, and
#       PASS/FAIL per group; then bench/engine-gpu (GPT-2 124M and Llama
#       1B at T = 1024, bf16, largest batch that fits: tokens/s, MFU, peak
#       device memory) in what is left of the budget, into the same
#       summary and OUT/results/bench.json. Exit status 0 only if every
#       group passed and the benchmark ran.
#
# What it does not run yet: the PyTorch-reference model test on the GPU,
# resume on the GPU, llm.c's train_gpt2cu side by side. Figures from this
# script are the only GPU figures that may be quoted.
set -uo pipefail
mode=${1:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

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
  cp "$src/bench/engine-gpu/bench.py" "$out/bin/"
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
  cp "$here/run.sh" "$out/run.sh"
  echo "ready: $out ($(du -sh "$out" | cut -f1)); on the GPU: $out/run.sh gpu $out"
  ;;
gpu)
  out=${2:?usage: run.sh gpu OUT [SECONDS]}
  limit=${3:-420}
  res="$out/results"
  mkdir -p "$res" "$out/lib"
  tar -C "$out/lib" -xJf "$out/libs.tar.xz"
  lt=$(find /opt /usr -name 'libcublasLt.so.13' 2>/dev/null | head -1)
  [ -n "$lt" ] || { echo "no libcublasLt.so.13 on this machine" >&2; exit 1; }
  export LD_LIBRARY_PATH="$out/lib:$(dirname "$lt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  sum="$res/summary.txt"
  : >"$sum"
  { date -u; nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader 2>&1; } >>"$sum"
  start=$(date +%s)
  fail=0
  for scale in 1 8; do
    for g in context elementwise activations adamw embedding norm matmul rope attention crossentropy convert nf4; do
      left=$((limit - ($(date +%s) - start)))
      if [ "$left" -lt 10 ]; then
        echo "SKIP $g scale $scale: time budget spent" >>"$sum"
        fail=1
        continue
      fi
      log="$res/$g.s$scale.log"
      timeout "$left" "$out/bin/test_kernels_device_gpu" "$g" cuda "$scale" >"$log" 2>&1
      rc=$?
      grep -E '^(device: |op=|open: )' "$log" | sed "s/^/[s$scale] /" >>"$sum"
      if [ "$rc" -eq 0 ]; then echo "PASS $g scale $scale" >>"$sum"; else
        echo "FAIL $g scale $scale (rc $rc)" >>"$sum"
        grep -m5 FAIL "$log" >>"$sum"
        fail=1
      fi
    done
  done
  left=$((limit - ($(date +%s) - start)))
  if [ "$left" -ge 60 ]; then
    echo "bench/engine-gpu ($left s left):" >>"$sum"
    TY_CUBLASLT="$lt" python3 "$out/bin/bench.py" "$out/bin/trainyard-engine" --budget "$((left - 10))" \
      --out "$res/bench.json" >>"$sum" 2>&1 || fail=1
  else
    echo "SKIP bench/engine-gpu: time budget spent" >>"$sum"
    fail=1
  fi
  echo "elapsed $(( $(date +%s) - start )) s" >>"$sum"
  cat "$sum"
  exit $fail
  ;;
*)
  echo "usage: run.sh build OUT | run.sh gpu OUT [SECONDS]" >&2
  exit 2
  ;;
esac
