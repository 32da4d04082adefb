#!/usr/bin/env bash
# Installs the npm test tools each tests/<area>/package.json names
# (emulators, tokenizers, playwright-core). Skips folders already installed.
set -euo pipefail
cd "$(dirname "$0")"
for pj in */package.json; do
  [ -e "$pj" ] || continue
  d=$(dirname "$pj")
  if [ ! -d "$d/node_modules" ] || [ "$d/package.json" -nt "$d/node_modules" ]; then
    echo "setup-npm: installing in tests/$d"
    (cd "$d" && npm install --no-audit --no-fund --loglevel=error && touch node_modules)
  fi
done
