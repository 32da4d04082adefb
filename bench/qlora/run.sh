#!/usr/bin/env bash
# QLoRA vs LoRA vs full on the CPU, against transformers + PEFT + bitsandbytes
# (the hf venv of tests/hf: TY_HF_VENV, else BUILD_DIR/hf-venv, made here by
# tests/hf/setup-venv.sh when missing), and the Llama-3-8B QLoRA footprint.
# Usage: bench/qlora/run.sh BUILD_DIR [bench.py options: --seq8b T --no-8b ...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
shift
engine="$build/bin/trainyard-engine"
[ -x "$engine" ] || { echo "qlora bench: $engine not built" >&2; exit 1; }
venv=${TY_HF_VENV:-$build/hf-venv}
if [ ! -x "$venv/bin/python" ]; then
  bash "$here/../../tests/hf/setup-venv.sh" "$venv" "$here/../../tests/hf/requirements.txt" >&2
fi
[ -x "$venv/bin/python" ] || { echo "qlora bench: no hf venv at $venv (the peer needs it)" >&2; exit 1; }
/usr/bin/python3 "$here/bench.py" "$engine" "$venv/bin/python" --threads "$(nproc)" "$@"
