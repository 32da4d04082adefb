#!/usr/bin/env bash
# Engine CPU benchmarks, each side by side in one run:
#   bench.py      trainyard-engine vs transformers' GPT2LMHeadModel on torch
#                 2.13 (the test venv), same threads, weights and tokens,
#                 GPT-2 4x256 (tokens/s) and the 124M shape; --busy 1 adds a
#                 spinning process (a loaded machine)
#   sgemm         the fp32 GEMM libraries: OpenBLAS vs oneDNN (when built)
#   gemm-bf16     oneDNN's bf16 matmul vs convert + sgemm (when built)
#   grad16.py     fp32 vs bf16 gradient accumulation in the bf16 scheme's
#                 PyTorch model (needs torch: the hf-venv of a test build)
#   precision.py  fp32 vs bf16 storage: tokens/s and peak RSS, GPT-2 124M and
#                 a Llama-1B-wide model at seq 1024 / 4096, a GPT-2 batch
#                 sweep (1, 2, 4, 8 at seq 1024: the bf16/fp32 RSS ratio per
#                 batch), and the attention memory curve against T (slow:
#                 minutes per step on 2 cores)
# Usage: bench/engine-cpu/run.sh BUILD_DIR [extra bench.py args]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd); shift
engine="$build/bin/trainyard-engine"
[ -x "$engine" ] || { echo "engine-cpu: $engine not built (cmake --build $build --target trainyard-engine)" >&2; exit 1; }
py=""
for v in "$build/hf-venv/bin/python" "$build/../build-test/hf-venv/bin/python"; do
  [ -x "$v" ] && { py=$v; break; }
done
if [ -n "$py" ]; then
  "$py" "$here/bench.py" "$engine" --threads "$(nproc)" "$@"
else
  echo "engine-cpu: bench.py needs torch 2.13 and transformers (ctest -R hf.venv builds the venv)"
fi
if [ -x "$build/bin/sgemm" ]; then
  "$build/bin/sgemm" "$(nproc)" 5
else
  echo "engine-cpu: sgemm not built (needs libdnnl-dev)"
fi
if [ -x "$build/bin/gemm-bf16" ]; then
  "$build/bin/gemm-bf16" "$(nproc)" 3
else
  echo "engine-cpu: gemm-bf16 not built (needs libdnnl-dev)"
fi
/usr/bin/python3 "$here/precision.py" "$engine" --threads "$(nproc)"
if [ -n "$py" ]; then "$py" "$here/grad16.py"; else echo "engine-cpu: grad16.py needs torch (ctest hf.venv)"; fi
