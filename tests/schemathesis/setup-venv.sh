#!/usr/bin/env bash
# Creates the virtual environment schemathesis runs from, under the build
# tree (the ctest fixture schemathesis.setup passes its path), and installs
# the pinned schemathesis from PyPI into it. Nothing is installed outside
# that folder; a venv that already holds the pinned version is kept.
set -euo pipefail
venv=${1:?usage: setup-venv.sh VENV_DIR}
pin=4.32.5
py=${TY_VENV_PYTHON:-python3}
if [ -x "$venv/bin/st" ] && [ "$(cat "$venv/.ty-pin" 2>/dev/null)" = "$pin" ]; then
  echo "schemathesis $pin already in $venv"
  exit 0
fi
rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "schemathesis==$pin"
echo "$pin" >"$venv/.ty-pin"
"$venv/bin/st" --version
