#!/usr/bin/env bash
# QLoRA vs LoRA vs full on the CPU, and the Llama-3-8B QLoRA footprint.
# Usage: bench/qlora/run.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
engine="$build/bin/trainyard-engine"
[ -x "$engine" ] || { echo "qlora bench: $engine not built" >&2; exit 1; }
/usr/bin/python3 "$here/bench.py" "$engine" --threads "$(nproc)"
