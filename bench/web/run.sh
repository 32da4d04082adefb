#!/usr/bin/env bash
# bench/web — the dashboard's charts with ten runs of 10,000 points each,
# decimated (web/charts.js) vs stroking every point, in headless Chromium.
# Usage: bench/web/run.sh [BUILD_DIR]   (the build is not needed)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$here/../../tests/web/node_modules/playwright-core" ] || bash "$here/../../tests/setup-npm.sh"
exec node "$here/charts.mjs"
