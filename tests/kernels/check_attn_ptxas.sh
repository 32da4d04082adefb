#!/usr/bin/env bash
# check_attn_ptxas.sh OBJECTS ARCHS — kernels.cuda_attn_ptxas: ptxas's
# resource report (-Xptxas -v) for the attention sources of kernels/cuda
# (cuda_attention.cu and the flash launchers cuda_attn_*.cu), as the
# build's own compile left it beside each object (OBJECTS: the library's
# objects, ';'-separated; kernels/cuda/ptxas-report.sh writes
# OBJECT.ptxas), at every architecture of ARCHS from sm_80 up (the
# tensor-core kernels' targets; all of them must be in the reports).
# Every attention kernel must use no stack frame and spill nothing. The
# tensor-core ones (k_fl_*): the forward, dq and dk/dv for every head dim
# (64, 80, 96, 128, 256) and both 16-bit types, each built for two
# shared-memory limits (one kernel where both give the same warps a
# block), and k_fl_rowdot, the backward's row dots: all 30 (kernel, head
# dim, type) must be there. They keep their tiles in shared memory and
# their accumulators in registers indexed by constants; the scalar ones
# (k_attn_*: fp32 and other head dims, three head-dim bounds: 9) keep
# columns of shared memory, never per-thread arrays, which ptxas puts in
# local memory.
set -euo pipefail
objs=$1 archs=$2
reports=()
for o in ${objs//;/ }; do
  case ${o##*/} in
  cuda_attention.cu.o | cuda_attn_*.cu.o)
    [ -f "$o.ptxas" ] || { echo "FAIL: no ptxas report beside $o"; exit 1; }
    reports+=("$o.ptxas") ;;
  esac
done
[ "${#reports[@]}" -ge 2 ] ||
  { echo "FAIL: ${#reports[@]} attention objects among $objs"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0 checked=0
for a in ${archs//;/ }; do
  a=${a%-real}
  a=${a%-virtual}
  [ "${a%[a-z]}" -ge 80 ] || continue
  checked=$((checked + 1))
  # "Compiling entry function 'NAME' for 'sm_XX'" then "S bytes stack frame, W bytes spill
  # stores, R bytes spill loads": one line per kernel, NAME STACK STORES LOADS.
  awk -v want="sm_$a" '
       /Compiling entry function/ { match($0, /\047[^\047]+\047/); name = substr($0, RSTART + 1, RLENGTH - 2)
                                    n = split($0, q, "\047"); if (q[n - 1] != want) name = "" }
       /bytes stack frame/ && name != "" { print name, $1, $5, $9; name = "" }' "${reports[@]}" \
    >"$tmp/k$a.txt"
  n=$(grep -c 'k_fl_' "$tmp/k$a.txt" || true)
  # (kernel, head dim, type) of each k_fl_ kernel but the row dots, from the mangled
  # name: ...k_fl_fwdINS_6fl_cfgILi64E13__nv_bfloat16Li4E...
  combos=$(sed -nE 's/.*(k_fl_[a-z_]+)INS_[0-9]+fl_cfgILi([0-9]+)E[0-9]+(__half|__nv_bfloat16)Li.*/\1 \2 \3/p' \
    "$tmp/k$a.txt" | sort -u | wc -l)
  rowdot=$(grep -c 'k_fl_rowdot' "$tmp/k$a.txt" || true)
  ns=$(grep -c 'k_attn_' "$tmp/k$a.txt" || true)
  [ "$combos" -eq 30 ] && [ "$rowdot" -eq 1 ] ||
    { echo "FAIL: sm_$a: $combos (kernel, head dim, type) of 30 and $rowdot row-dot kernels"; fail=1; }
  [ "$ns" -eq 9 ] || { echo "FAIL: sm_$a: $ns scalar attention kernels, want 9"; fail=1; }
  while read -r name stack st ld; do
    case $name in
    *k_fl_* | *k_attn_*)
      if [ "$stack" != 0 ] || [ "$st" != 0 ] || [ "$ld" != 0 ]; then
        echo "FAIL: sm_$a $name: $stack bytes stack, $st / $ld bytes spilled"
        fail=1
      fi ;;
    esac
  done <"$tmp/k$a.txt"
  [ "$fail" -ne 0 ] || echo "ok: sm_$a: $n tensor-core and $ns scalar attention kernels in" \
    "${#reports[@]} objects, no stack, no spills"
done
[ "$checked" -gt 0 ] || { echo "FAIL: no architecture from sm_80 up in '$archs'"; exit 1; }
exit $fail
