#!/usr/bin/env bash
# Generation benchmark: `trainyard-engine generate` (KV cache) vs transformers'
# generate on the same random model, the same prompt and the same threads, in
# fp32 and in bf16, with the machine's read bandwidth (membw) beside them.
# Uses the tests/hf venv (made here under BUILD_DIR/hf-venv if missing).
# Usage: bench/generate/run.sh BUILD_DIR [extra bench.py args]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd); shift
engine="$build/bin/trainyard-engine"
[ -x "$engine" ] || { echo "generate: $engine not built (cmake --build $build --target trainyard-engine)" >&2; exit 1; }
bash "$root/tests/hf/setup-venv.sh" "$build/hf-venv" "$root/tests/hf/requirements.txt" >&2
[ -x "$build/hf-venv/bin/python" ] || { echo "generate: no Hugging Face venv ($(cat "$build/hf-venv.unavailable" 2>/dev/null))" >&2; exit 1; }
membw="$build/bin/membw"
[ -x "$membw" ] || { echo "generate: $membw not built (cmake --build $build --target membw)" >&2; exit 1; }
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
exec "$build/hf-venv/bin/python" "$here/bench.py" "$engine" --threads "$(nproc)" --membw "$membw" "$@"
