#!/usr/bin/env bash
# ptxas-report.sh COMPILER ARGS... — ty_kernels_cuda's compiler launcher.
#
# A source compiled with ptxas's resource report (-Xptxas=-v, given to
# the attention sources by sources.cmake's list) keeps that report beside
# its object, as OBJECT.ptxas, written only when the compile succeeds,
# and the report's lines stay out of the build's output (five
# architectures of them). kernels.cuda_attn_ptxas reads the files: the
# check is on the very objects the library holds, at every architecture
# it was built for, without compiling the largest sources again. Every
# other compile runs unchanged.
set -uo pipefail
report=0 obj=
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
  -Xptxas=-v) report=1 ;;
  -o) obj=${args[i + 1]:-} ;;
  esac
done
[ "$report" = 1 ] && [ -n "$obj" ] || exec "$@"
"$@" >"$obj.ptxas.tmp" 2>&1
rc=$?
# Everything but the report (warnings, errors) is shown as the compiler gave it.
grep -v -E '^ptxas info +:|^ +[0-9]+ bytes (stack frame|gmem)' "$obj.ptxas.tmp" >&2
if [ "$rc" -eq 0 ]; then
  mv "$obj.ptxas.tmp" "$obj.ptxas"
else
  rm -f "$obj.ptxas.tmp" "$obj.ptxas"
fi
exit "$rc"
