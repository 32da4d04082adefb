#!/usr/bin/env bash
# install-deps.sh — install the Debian packages trainyard builds and tests with.
# Idempotent: only missing packages are installed, and apt-get update runs only
# when something is missing. Pass --build-only to skip the test-only packages.
set -euo pipefail

build_pkgs=(build-essential cmake pkg-config
            libmicrohttpd-dev libjansson-dev libsqlite3-dev libcurl4-openssl-dev
            libssl-dev libopenblas-dev libpcre2-dev libutf8proc-dev
            libdnnl-dev  # oneDNN: bench/engine-cpu gemm-bf16 only
            openmpi-bin libopenmpi-dev  # data-parallel CPU ranks (docs/engine.md, Ranks)
            nlohmann-json3-dev) # minja's JSON (third_party/minja: model chat templates)
test_pkgs=(python3-torch python3-numpy awscli chromium nodejs npm wrk hyperfine
           valgrind curl sqlite3 procps openssl
           python3-venv    # tests/schemathesis makes a venv
           clang libclang-rt-14-dev   # tests/fuzz: libFuzzer
           clang-format               # make format, tests/style
           slurm-wlm munge)           # tests/slurm: a one-node cluster of the test's own

want=("${build_pkgs[@]}")
[ "${1:-}" = "--build-only" ] || want+=("${test_pkgs[@]}")

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# nodejs/npm may come from elsewhere on a developer machine; accept a working binary.
if command -v npm >/dev/null 2>&1; then
  filtered=(); for p in "${missing[@]}"; do [ "$p" = npm ] || [ "$p" = nodejs ] || filtered+=("$p"); done
  missing=("${filtered[@]}")
fi
[ ${#missing[@]} -eq 0 ] && { echo "install-deps: all packages present"; exit 0; }

echo "install-deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
