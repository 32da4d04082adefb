#!/usr/bin/env bash
# Lints openapi.yaml with Redocly's recommended rules; any error or warning
# fails. The linter comes from tests/server/package.json (tests/setup-npm.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
redocly=$here/node_modules/.bin/redocly
if [ ! -x "$redocly" ]; then
  echo "lint-openapi: $redocly missing; run bash tests/setup-npm.sh" >&2
  exit 1
fi
export REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true
out=$("$redocly" lint --format=stylish "${1:?usage: lint-openapi.sh openapi.yaml}" 2>&1) || { echo "$out"; exit 1; }
echo "$out"
# Errors make redocly exit non-zero; warnings do not, but the spec must lint clean.
if grep -qE '[0-9]+ warnings?|\bwarning\b' <<<"$out"; then echo "lint-openapi: warnings" >&2; exit 1; fi
