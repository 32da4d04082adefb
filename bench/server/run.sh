#!/usr/bin/env bash
# Server benchmark: trainyard against a bare libmicrohttpd server and against
# its goals (GET /jobs/{id} >= 0.5x bare libmicrohttpd with keep-alive, SSE
# fan-out p99 lag < 50 ms, >= 50k engine events/s into SQLite, dispatch
# < 50 ms), side by side in one run (see bench.py for the five figures).
# Usage: bench/server/run.sh RELEASE_BUILD_DIR [--quick] [--only=sse,...]
# (bench.py lists the options: --only, --serve-arg, --client-cpus).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR [--quick]}" && pwd)
shift
for b in trainyard ty-fake-engine ty-bench-bare-mhd ty-bench-sse-fanout; do
  [ -x "$build/bin/$b" ] || { echo "bench/server: $build/bin/$b missing; build first" >&2; exit 1; }
done
command -v wrk >/dev/null || { echo "bench/server: wrk missing (apt-get install wrk)" >&2; exit 1; }
# 1000 SSE clients need 1000+ descriptors in the client and the server.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
exec /usr/bin/python3 "$here/bench.py" "$build" "$@"
