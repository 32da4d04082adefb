#!/usr/bin/env bash
# carry_mpi_test.sh ENGINE — ctest gpu.carry_mpi: the Open MPI launcher
# carry-mpi.sh packs for the GPU machine starts two CPU ranks of ENGINE on
# its own. Where this process may make a private mount namespace and mount
# in it (root: `unshare -m`), the system's Open MPI and PMIx directories, its config and
# its orterun are hidden in it first (empty tmpfs / /dev/null over them,
# visible to this test only), as on a machine without Open MPI; elsewhere
# the run is not isolated and says so. The ranks must train to the end
# (rank 0's done event, both ranks' all-reduce lines) with no "cannot open
# the help file" complaint (a component or help file not carried).
set -euo pipefail
engine=$(readlink -f "${1:?usage: carry_mpi_test.sh ENGINE}")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d /tmp/ty-carry-mpi-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
bash "$here/carry-mpi.sh" "$tmp" --no-xz
python3 - "$tmp" <<'EOF'
import json, random, sys
d = sys.argv[1]
r = random.Random(1)
with open(f"{d}/train.jsonl", "w") as f:
    for _ in range(16):
        f.write(json.dumps({"input_ids": [r.randrange(53) for _ in range(17)]}) + "\n")
spec = {"model": {"init": {"model_type": "gpt2", "vocab_size": 53, "n_embd": 16, "n_layer": 2, "n_head": 2,
                           "n_positions": 32}},
        "dataset": {"train": f"{d}/train.jsonl", "format": "tokens"},
        "hyperparameters": {"max_steps": 2, "batch_size": 2, "grad_accum": 2, "seq_len": 16, "lr": 1e-3,
                            "log_every_steps": 1, "seed": 1},
        "checkpoint": {"every_steps": 0}}
json.dump(spec, open(f"{d}/spec.json", "w"))
EOF
hide=""
info=$(ompi_info --path all --parsable)
for k in pkglibdir pkgdatadir sysconfdir; do
  d=$(sed -n "s/^path:$k:\(.*\)/\1/p" <<<"$info" | head -1)
  [ -d "$d" ] && hide="$hide mount -t tmpfs none $d;"
done
pmix=$(ldd "$(sed -n 's/^path:pkglibdir:\(.*\)/\1/p' <<<"$info" | head -1)"/mca_pmix_ext*.so 2>/dev/null |
  awk '/libpmix\.so/ {print $3; exit}')
[ -n "$pmix" ] && hide="$hide mount -t tmpfs none $(dirname "$(dirname "$(readlink -f "$pmix")")");"
for b in orterun orted mpirun; do
  p=$(command -v "$b" || true)
  [ -n "$p" ] && hide="$hide mount --bind /dev/null $(readlink -f "$p");"
done
run="env TY_WORLD_SIZE=2 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
  $tmp/ompi/bin/mpirun -np 2 --oversubscribe --bind-to none $engine --spec $tmp/spec.json \
  --workdir $tmp/work --threads 1"
if unshare -m bash -c "set -e; $hide true" 2>/dev/null; then
  unshare -m bash -c "set -e; $hide exec $run" >"$tmp/out" 2>"$tmp/err" || {
    echo "FAIL: the carried mpirun (system Open MPI hidden) exited $?"; tail -20 "$tmp/err"; exit 1; }
  echo "isolated: the system's Open MPI, PMIx and orterun were hidden"
else
  $run >"$tmp/out" 2>"$tmp/err" || { echo "FAIL: the carried mpirun exited $?"; tail -20 "$tmp/err"; exit 1; }
  echo "not isolated (no private mount namespace here): the system's Open MPI was visible"
fi
tail -1 "$tmp/out" | grep -q '"ev":"done","status":"succeeded"' ||
  { echo "FAIL: no done event"; tail -3 "$tmp/out"; tail -20 "$tmp/err"; exit 1; }
for r in 0 1; do
  grep -q "^trainyard-engine\[$r\]: data parallel: gradient all-reduce" "$tmp/err" ||
    { echo "FAIL: rank $r logged no all-reduce line"; tail -20 "$tmp/err"; exit 1; }
done
if grep -q "couldn't open the help file\|Sorry!" "$tmp/err"; then
  echo "FAIL: something was not carried:"; grep -A3 "Sorry!" "$tmp/err" | head -20; exit 1
fi
echo "ok: two ranks trained through the carried mpirun ($(du -sh "$tmp/ompi" | cut -f1) unpacked)"
