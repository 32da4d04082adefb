#!/usr/bin/env bash
# Data-parallel CPU scaling, world 1 -> 2 on this machine (bench.py says
# what runs side by side). Usage: bench/engine-dp/run.sh BUILD_DIR [bench.py args]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd); shift
engine="$build/bin/trainyard-engine"
[ -x "$engine" ] || { echo "engine-dp: $engine not built (cmake --build $build --target trainyard-engine)" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "engine-dp: mpirun not found (apt-get install openmpi-bin)" >&2; exit 1; }
/usr/bin/python3 "$here/bench.py" "$engine" --threads "$(nproc)" "$@"
