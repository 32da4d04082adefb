#!/usr/bin/env bash
# with_refusal.sh CMD... — runs CMD, a kernel-table program on cuda-emu
# with TY_EMU_LT_REFUSE set, and fails unless the emulated cuBLASLt
# refused at least one query (its TY_EMU_LT_CASES census,
# kernels/cuda/emu/emu_cublaslt.h): a refusal the table never meets would
# test no fallback.
set -uo pipefail
census=$(mktemp)
trap 'rm -f "$census"' EXIT
TY_EMU_LT_CASES=$census "$@"
rc=$?
[ "$rc" -eq 0 ] || exit "$rc"
refused=$(awk '$1 == "refused" { print $2 }' "$census")
if [ "${refused:-0}" -le 0 ]; then
  echo "FAIL: TY_EMU_LT_REFUSE=${TY_EMU_LT_REFUSE:-} refused no query ($(tr '\n' ' ' <"$census"))"
  exit 1
fi
echo "ok: TY_EMU_LT_REFUSE=${TY_EMU_LT_REFUSE:-} refused $refused queries"
