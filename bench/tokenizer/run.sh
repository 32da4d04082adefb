#!/usr/bin/env bash
# bench/tokenizer/run.sh — encode throughput (MB/s of UTF-8 text) of the
# trainyard tokenizer against the JavaScript reference tokenizers
# (gpt-3-encoder, llama-tokenizer-js, llama3-tokenizer-js) on the same text,
# line by line, side by side in one run, with the ratio (goal: >= 5x).
# Two ratios: first pass over the text (our word cache cold, V8 not yet
# warmed up) and sustained over >= 2 s of repeated passes (both warm).
# Usage: bench/tokenizer/run.sh BUILD_DIR   (a Release build with tok-bench)
# Leaves the figures as a Markdown table in bench/out/tokenizer/results.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
bench="$build/bin/tok-bench"
out="$root/bench/out/tokenizer"
[ -x "$bench" ] || { echo "tokenizer bench: $bench is missing; build the tok-bench target" >&2; exit 1; }
command -v node >/dev/null || { echo "tokenizer bench: node is missing" >&2; exit 1; }
mkdir -p "$out"

# The reference tokenizers and the model directories made from their data.
if [ ! -d "$root/tests/tokenizer/node_modules/llama3-tokenizer-js" ]; then
  (cd "$root/tests/tokenizer" && npm install --no-audit --no-fund --loglevel=error)
fi
node "$root/tests/tokenizer/make-fixtures.mjs" "$out/fixtures" >/dev/null

# The text: English prose (Debian's licence texts) and the multilingual
# test corpus (CJK, emoji, combining marks, code, whitespace runs): fixed
# inputs, so runs stay comparable. Lines holding special-token spellings are
# left out: two of the JS tokenizers treat them as text, which would make the
# token counts differ.
text="$out/text.txt"
{
  for f in GPL-3 GPL-2 LGPL-2.1 Apache-2.0 MPL-2.0 GFDL-1.3 Artistic; do
    [ -f "/usr/share/common-licenses/$f" ] && cat "/usr/share/common-licenses/$f"
  done
  cat "$out/fixtures/llama3.lines.txt"
} | grep -v -e '<s>' -e '</s>' -e '<unk>' -e '<|' >"$text"
bytes=$(wc -c <"$text")
echo "text: $bytes bytes, $(wc -l <"$text") lines; each side encodes it line by line for >= 2 s"

field() { sed -n "s/.*\"$2\": *\([0-9.]*\).*/\1/p" <<<"$1"; }

{
  echo "| model (reference) | first pass: trainyard / JS MB/s | ratio | sustained: trainyard (1 / 2 threads) / JS MB/s | ratio (1 thread) | same token count |"
  echo "|---|---:|---:|---:|---:|---|"
} >"$out/results.md"
printf '%-8s %22s %8s   %-34s %8s\n' model "first pass: ours / JS" ratio "sustained: ours 1thr / 2thr, JS" ratio

for m in gpt2 llama2 llama3; do
  case $m in
    gpt2) ref=gpt-3-encoder ;;
    llama2) ref=llama-tokenizer-js ;;
    llama3) ref=llama3-tokenizer-js ;;
  esac
  ours=$("$bench" "$out/fixtures/$m" "$text" 1)
  ours2=$("$bench" "$out/fixtures/$m" "$text" 2)
  js=$(node "$here/bench-js.mjs" "$m" "$text")
  o=$(field "$ours" first_pass_mb_per_s)
  j=$(field "$js" first_pass_mb_per_s)
  os=$(field "$ours" mb_per_s)
  os2=$(field "$ours2" mb_per_s)
  js_s=$(field "$js" mb_per_s)
  # Tokens per pass must match: both sides tokenised the same text alike.
  ot=$(awk -v t="$(field "$ours" tokens)" -v p="$(field "$ours" passes)" 'BEGIN{printf "%d", t/p}')
  jt=$(awk -v t="$(field "$js" tokens)" -v p="$(field "$js" passes)" 'BEGIN{printf "%d", t/p}')
  agree=yes
  [ "$ot" = "$jt" ] || agree="no ($ot vs $jt)"
  ratio=$(awk -v a="$o" -v b="$j" 'BEGIN{ if (b > 0) printf "%.1f", a/b; else print "inf" }')
  ratio_s=$(awk -v a="$os" -v b="$js_s" 'BEGIN{ if (b > 0) printf "%.1f", a/b; else print "inf" }')
  printf '%-8s %22s %7sx   %-34s %7sx  (tokens/pass %s, same count: %s)\n' \
    "$m" "$o / $j" "$ratio" "$os / $os2, $js_s" "$ratio_s" "$ot" "$agree"
  echo "| $m ($ref) | $o / $j | ${ratio}x | $os / $os2 / $js_s | ${ratio_s}x | $agree |" >>"$out/results.md"
done
echo "table: $out/results.md"
