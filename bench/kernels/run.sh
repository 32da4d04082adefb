#!/usr/bin/env bash
# Kernel micro-benchmark: our CPU kernels and the same ops in PyTorch, at
# the engine benchmark's shapes, one after the other on the same threads.
# Usage: bench/kernels/run.sh BUILD_DIR [THREADS] [REPS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run.sh BUILD_DIR [THREADS] [REPS]}
threads=${2:-2}
reps=${3:-5}
echo "-- trainyard kernels"
"$build/bin/bench_kernels" "$threads" "$reps"
echo "-- PyTorch"
/usr/bin/python3 "$here/torch_ops.py" "$threads" "$reps"
