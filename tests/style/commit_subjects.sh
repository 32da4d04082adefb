#!/usr/bin/env bash
# commit_subjects.sh SRC — every commit since the convention began has a
# subject of at most 72 characters (CONTRIBUTING.md): the subject says
# what changed, the body says why and gives the figures. Commits before
# BASE keep their old, longer subjects. Exit 77 (skipped) outside a git
# checkout or in a clone too shallow to hold BASE.
set -uo pipefail
src=${1:?usage: commit_subjects.sh SRC}
BASE=fffbef985b024535ab088d76b8501c677e82f96b  # the last commit before the convention
MAX=72
cd "$src" || exit 1
git rev-parse --git-dir >/dev/null 2>&1 || { echo "not a git checkout: skipped"; exit 77; }
git cat-file -e "$BASE^{commit}" 2>/dev/null || { echo "history lacks $BASE (shallow clone?): skipped"; exit 77; }
bad=0 n=0
while IFS= read -r line; do
  n=$((n + 1))
  hash=${line%% *} subject=${line#* }
  if [ ${#subject} -gt $MAX ]; then
    echo "commit $hash: subject of ${#subject} characters (at most $MAX): $subject"
    bad=$((bad + 1))
  fi
done < <(git log --no-merges --format='%h %s' "$BASE..HEAD")
echo "$n commits since $BASE, $bad with a subject over $MAX characters"
[ "$bad" -eq 0 ]
