#!/usr/bin/env bash
# format.sh [--check] — clang-format over the C sources (every tracked *.c
# and *.h), with the repository's .clang-format (LLVM base, 4-space indent,
# 100 columns). `make format` rewrites them; --check (the ctest
# style.clang_format) changes nothing and fails naming each file that is
# not formatted, so an unformatted file fails `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null 2>&1 || {
  echo "format: clang-format is not installed (deploy/install-deps.sh installs it)" >&2
  exit 1
}
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.c' '*.h' ':!third_party/**') # vendored code keeps its style
else # an exported tree: the same files, minus build output and npm modules
  mapfile -t files < <(find . \( -name 'build*' -o -name node_modules -o -name .git -o -name third_party \) -prune -o \
                             \( -name '*.c' -o -name '*.h' \) -type f -print | sed 's|^\./||' | sort)
fi
existing=()
for f in "${files[@]}"; do [ -f "$f" ] && existing+=("$f"); done
if [ "${1:-}" != "--check" ]; then
  clang-format -i "${existing[@]}"
  echo "format: ${#existing[@]} files formatted"
  exit 0
fi
bad=$( (clang-format --dry-run --Werror "${existing[@]}" 2>&1 || true) |
        sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error:.*/\1/p' | sort -u)
if [ -n "$bad" ]; then
  echo "format: these files are not formatted (run \`make format\`):" >&2
  echo "$bad" | sed 's/^/  /' >&2
  exit 1
fi
echo "format: ${#existing[@]} files formatted as .clang-format says"
