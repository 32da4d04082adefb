#!/usr/bin/env bash
# cli_test.sh — the `tokenize` command line: ids per input line equal to
# llama3-tokenizer-js's, --decode gives the lines back, --add-special adds
# bos, and bad input (invalid UTF-8, a missing or unsupported model) is a
# clear message with the documented exit status.
# Usage: cli_test.sh FIXTURES_DIR COMMAND...   (ty-tokenize, or trainyard-engine tokenize)
set -uo pipefail
fx=$1
shift
cmd=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
die() { echo "FAIL: $*" >&2; fail=1; }

# 1. ids per line agree with the reference.
"${cmd[@]}" --model "$fx/llama3" <"$fx/llama3.lines.txt" >"$tmp/ids" 2>"$tmp/err" || die "encode exited $?: $(cat "$tmp/err")"
if ! cmp -s "$tmp/ids" "$fx/llama3.lines.ids"; then
  die "ids differ from llama3-tokenizer-js:"
  diff "$fx/llama3.lines.ids" "$tmp/ids" | head -10 >&2
fi
[ "$(wc -l <"$tmp/ids")" = "$(wc -l <"$fx/llama3.lines.txt")" ] || die "not one output line per input line"

# 2. --decode turns them back into the same lines.
"${cmd[@]}" --model "$fx/llama3" --decode <"$tmp/ids" >"$tmp/text" 2>"$tmp/err" || die "decode exited $?: $(cat "$tmp/err")"
cmp -s "$tmp/text" "$fx/llama3.lines.txt" || die "decode(encode(lines)) differs from the lines"

# 3. --add-special puts <s> (1) first (Llama 2: smaller, loads faster).
out=$(printf 'Hello world!\n' | "${cmd[@]}" --model "$fx/llama2" --add-special)
[ "$out" = "1 15043 3186 29991" ] || die "--add-special gave '$out'"

# 4. Invalid UTF-8 on line 2: line 1 is printed, then exit 1 naming line 2.
printf 'fine\n\xff\xfe broken\nnever read\n' | "${cmd[@]}" --model "$fx/llama2" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc = 1 ] || die "invalid UTF-8: exit $rc, wanted 1"
grep -q "line 2: text is not valid UTF-8 (byte offset 0" "$tmp/err" || die "invalid UTF-8 message: $(cat "$tmp/err")"
[ "$(wc -l <"$tmp/out")" = 1 ] || die "invalid UTF-8: expected exactly the first line's ids"

# 5. A missing model and an unsupported model type: exit 2, message names it.
"${cmd[@]}" --model "$tmp/nope" </dev/null 2>"$tmp/err"
rc=$?
[ $rc = 2 ] && grep -q "tokenizer.json" "$tmp/err" || die "missing model: exit $rc: $(cat "$tmp/err")"
mkdir -p "$tmp/unigram"
echo '{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}' >"$tmp/unigram/tokenizer.json"
"${cmd[@]}" --model "$tmp/unigram" </dev/null 2>"$tmp/err"
rc=$?
[ $rc = 2 ] && grep -q 'model.type "Unigram" is not supported' "$tmp/err" || die "Unigram model: exit $rc: $(cat "$tmp/err")"

# 6. Bad usage.
"${cmd[@]}" </dev/null 2>/dev/null
[ $? = 2 ] || die "no --model should exit 2"

[ $fail = 0 ] && echo "tokenizer CLI tests passed"
exit $fail
