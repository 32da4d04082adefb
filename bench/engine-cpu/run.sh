#!/usr/bin/env bash
# Engine CPU benchmark: trainyard-engine vs the same PyTorch 1.13 training loop
# on the same threads, GPT-2 4x256 (tokens/s) and the 124M shape (step, RSS).
# Usage: bench/engine-cpu/run.sh BUILD_DIR [extra bench.py args]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd); shift
engine="$build/bin/trainyard-engine"
[ -x "$engine" ] || { echo "engine-cpu: $engine not built (cmake --build $build --target trainyard-engine)" >&2; exit 1; }
exec /usr/bin/python3 "$here/bench.py" "$engine" --threads "$(nproc)" "$@"
