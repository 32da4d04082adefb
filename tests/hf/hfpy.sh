#!/usr/bin/env bash
# hfpy.sh — runs a tests/hf script with the venv's python, or skips (exit 77,
# ctest SKIP_RETURN_CODE) with the reason setup-venv.sh recorded when the
# package index could not be reached.
# Usage: hfpy.sh VENV_DIR SCRIPT [ARGS...]
venv=$1
shift
if [ -x "$venv/bin/python" ]; then
  exec "$venv/bin/python" "$@"
fi
if [ -f "$venv.unavailable" ]; then
  echo "SKIP: the Hugging Face test environment could not be installed: $(cat "$venv.unavailable")"
  exit 77
fi
echo "FAIL: $venv/bin/python does not exist (did the hf.venv fixture run?)"
exit 1
