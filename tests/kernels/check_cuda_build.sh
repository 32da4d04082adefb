#!/usr/bin/env bash
# check_cuda_build.sh LIB N_SOURCES — kernels.cuda_build: the nvcc-built
# backend library holds one object per .cu and defines the kn_cuda_backend
# table (compiling it is the real check: warnings are errors, every
# architecture of CMAKE_CUDA_ARCHITECTURES). Registered only when the
# toolkit and the cuBLASLt header were found. With SRC_DIR, also that no
# kernel source calls an atomic (atomicAdd & co.): every reduction is a
# fixed-order one, so results repeat bit for bit (docs/kernels.md). Always:
# no managed (unified) memory -- device buffers are cudaMalloc'd, batches
# go through pinned host memory and explicit copies -- checked
# in the library's undefined symbols and, with SRC_DIR, in the sources.
# With ARCHS and FLAGS (the target's CUDA_ARCHITECTURES and, for a Makefile
# generator, its flags.make): every configured architecture reaches nvcc
# as real code (the default list, or the build's override).
set -euo pipefail
lib=$1 want=$2 src=${3:-} archs=${4:-} flags=${5:-}
n=$(ar t "$lib" | grep -c '\.o$')
[ "$n" -eq "$want" ] || { echo "FAIL: $lib has $n objects, want $want"; exit 1; }
nm "$lib" | grep -E ' [DR] kn_cuda_backend$' >/dev/null || { echo "FAIL: no kn_cuda_backend table in $lib"; exit 1; }
echo "ok: $lib: $n objects, kn_cuda_backend defined"
if nm -u "$lib" | grep -E 'cudaMallocManaged|cuMemAllocManaged|cudaMemAdvise|cudaMemPrefetchAsync'; then
  echo "FAIL: $lib uses managed memory (above)"
  exit 1
fi
echo "ok: no managed memory in $lib"
if [ -n "$src" ]; then
  if grep -n -E '\batomic[A-Z][A-Za-z_]*[[:space:]]*\(' "$src"/*.cu "$src"/*.cuh; then
    echo "FAIL: atomics in the CUDA kernels (above): reductions must be in a fixed order"
    exit 1
  fi
  echo "ok: no atomics in $src"
  if grep -n -E 'cudaMallocManaged|__managed__|cudaMemAdvise' "$src"/*.cu "$src"/*.cuh; then
    echo "FAIL: managed memory in the CUDA sources (above)"
    exit 1
  fi
  echo "ok: no managed memory in $src"
fi
if [ -n "$archs" ] && [ -f "$flags" ]; then
  for a in ${archs//;/ }; do
    a=${a%-real}
    a=${a%-virtual}
    grep -q -- "code=\[compute_$a,sm_$a\]\|code=sm_$a" "$flags" ||
      { echo "FAIL: architecture $a of '$archs' is not compiled ($flags)"; exit 1; }
  done
  echo "ok: compiled for $archs"
elif [ -n "$archs" ]; then
  echo "ok: architectures $archs (no flags.make with this generator to check them against)"
fi
