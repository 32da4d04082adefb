#!/usr/bin/env bash
# bench/storage — upload throughput of a 1 GiB checkpoint file to the S3
# emulator (s3rver) over loopback: trainyard's `ty-store put` against
# `/usr/bin/aws s3 cp` of the same file to the same server, alternating,
# each tool with its default part size and concurrency. Prints seconds,
# MiB/s and peak RSS (from /usr/bin/time) per run, the best of each, and
# the ratio aws_time / ty_time (goal >= 1.0: ours at least as fast).
#
# Usage: bench/storage/run.sh BUILD_DIR   (a Release build; ty-store is
# built there if missing). SIZE_MIB and ROUNDS override the defaults.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
size_mib=${SIZE_MIB:-1024}
rounds=${ROUNDS:-2}

[ -x "$build/bin/ty-store" ] || cmake --build "$build" --target ty-store -j2 >/dev/null
[ -x "$repo/tests/storage/node_modules/.bin/s3rver" ] || bash "$repo/tests/setup-npm.sh" >/dev/null
[ -x /usr/bin/aws ] || { echo "storage bench: /usr/bin/aws missing (apt-get install awscli)"; exit 1; }

work=$(mktemp -d /tmp/ty-bench-storage-XXXXXX)
s3pid=""
cleanup() {
    if [ -n "$s3pid" ]; then kill "$s3pid" 2>/dev/null || true; wait "$s3pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$work/s3"
"$repo/tests/storage/node_modules/.bin/s3rver" -d "$work/s3" -a 127.0.0.1 -p "$port" --silent \
    --no-vhost-buckets --configure-bucket bench >"$work/s3rver.log" 2>&1 &
s3pid=$!
for _ in $(seq 100); do
    (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break
    sleep 0.1
done
endpoint="http://127.0.0.1:$port"

echo "storage bench: writing a ${size_mib} MiB file"
head -c "$((size_mib * 1024 * 1024))" /dev/urandom >"$work/model.bin"

export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
export AWS_ENDPOINT_URL_S3="$endpoint" AWS_EC2_METADATA_DISABLED=true

# run NAME KEY CMD...: times one upload; prints "NAME SECONDS RSS_KIB".
run() {
    local name=$1 key=$2
    shift 2
    /usr/bin/time -f "%e %M" -o "$work/time" "$@" >"$work/out" 2>&1 || { cat "$work/out"; return 1; }
    read -r secs rss <"$work/time"
    echo "$name $secs $rss" >>"$work/results"
    awk -v n="$name" -v s="$secs" -v r="$rss" -v m="$size_mib" \
        'BEGIN { printf "  %-9s %6.2f s  %7.1f MiB/s  peak RSS %6.1f MiB\n", n, s, m / s, r / 1024 }'
    # Keep the emulator's disk use to one copy at a time.
    "$build/bin/ty-store" rm s3://bench "$key" >/dev/null 2>&1 || true
}

: >"$work/results"
for r in $(seq "$rounds"); do
    echo "round $r"
    run ty-store "r$r-ty.bin" "$build/bin/ty-store" put s3://bench "r$r-ty.bin" "$work/model.bin"
    run aws "r$r-aws.bin" /usr/bin/aws --endpoint-url "$endpoint" s3 cp --only-show-errors "$work/model.bin" \
        "s3://bench/r$r-aws.bin"
done

best() { awk -v n="$1" '$1==n {print $2}' "$work/results" | sort -g | head -1; }
rss() { awk -v n="$1" '$1==n {print $3}' "$work/results" | sort -g | tail -1; }
awk -v ty="$(best ty-store)" -v aw="$(best aws)" -v tr="$(rss ty-store)" -v ar="$(rss aws)" \
    -v m="$size_mib" -v n="$rounds" 'BEGIN {
    printf "\n| client | best of %d (s) | MiB/s | peak RSS (MiB) |\n|---|---|---|---|\n", n
    printf "| ty-store put | %.2f | %.0f | %.1f |\n", ty, m / ty, tr / 1024
    printf "| aws s3 cp | %.2f | %.0f | %.1f |\n", aw, m / aw, ar / 1024
    printf "\nratio (aws time / ty-store time): %.2fx (goal >= 1.0)\n", aw / ty
}'
