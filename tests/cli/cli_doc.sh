#!/usr/bin/env bash
# docs/cli.md against the binary: every command that `trill --help` lists has a "## trill CMD"
# section, and each `--help` text the page shows is the binary's output, byte for byte.
#
# Usage: cli_doc.sh [--update] PATH/TO/trill PATH/TO/docs/cli.md
#
# The page shows a help text as a marker line naming the invocations it is the output of, then a
# fenced block holding that output:
#
#   <!-- help: trill bench --help; trill bench train --help -->
#   ```text
#   usage: trill bench train --model DIR ...
#   ```
#
# Every marker is checked. The invocations that must have one: `trill --help`, `trill CMD --help`
# for every CMD listed by `trill --help`, and the sub-commands in SUBCOMMANDS below (`trill --help`
# lists commands only, and `trill bench --help` shows bench train's text alone).
# `trill serve keys` has no --help of its own (it prints serve's usage and exits 2), so it is
# described in serve's section.
#
# --update rewrites each marked block with the binary's output of its first invocation (the prose
# around it is not touched: reread it against the new text).
set -uo pipefail
SUBCOMMANDS=("bench train" "bench generate")

update=0
if [ "${1:-}" = "--update" ]; then update=1; shift; fi
if [ $# -ne 2 ]; then
  echo "usage: $0 [--update] PATH/TO/trill PATH/TO/docs/cli.md" >&2
  exit 2
fi
TRILL=$1 DOC=$2
[ -x "$TRILL" ] || { echo "cli_doc: $TRILL: not an executable" >&2; exit 2; }
[ -r "$DOC" ] || { echo "cli_doc: $DOC: cannot read" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-cli-doc-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
REFRESH="bash tests/cli/cli_doc.sh --update build/trill docs/cli.md, then reread that section's prose (options, defaults, examples) against the new text"

# The marked blocks: $WORK/block.N (the fenced text) and $WORK/index (N<TAB>invocation, one a line).
if ! awk -v dir="$WORK" '
  function fail(msg) { printf "cli_doc: %s:%d: %s\n", FILENAME, FNR, msg > "/dev/stderr"; bad = 1; exit 1 }
  state == 0 && /^<!-- help: .* -->$/ {
    n++
    line = $0; sub(/^<!-- help: /, "", line); sub(/ -->$/, "", line)
    k = split(line, inv, /; */)
    for (i = 1; i <= k; i++) {
      if (inv[i] !~ /^trill( [A-Za-z0-9_-]+)* --help$/) fail("marker invocation \"" inv[i] "\" is not `trill [COMMAND ...] --help`")
      printf "%d\t%s\n", n, inv[i] > (dir "/index")
    }
    state = 1; next
  }
  state == 1 { if ($0 !~ /^```/) fail("a help marker must be followed by a fenced block"); state = 2; printf "" > (dir "/block." n); next }
  state == 2 && /^```$/ { state = 0; close(dir "/block." n); next }
  state == 2 { print > (dir "/block." n); next }
  END { if (!bad && state != 0) { printf "cli_doc: %s: the fenced block of the last help marker is not closed\n", FILENAME > "/dev/stderr"; exit 1 } }
' "$DOC"; then
  exit 1
fi
touch "$WORK/index"

failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

# run_help "trill ARGS --help" OUT: the binary's help text into OUT; nonzero when it did not exit 0
run_help() {
  local args
  read -r -a args <<<"${1#trill}"
  timeout -k 5 60 "$TRILL" "${args[@]}" >"$2" 2>"$WORK/stderr"
}

if [ "$update" = 1 ]; then
  while IFS=$'\t' read -r n inv; do
    [ -e "$WORK/new.$n" ] && continue # the first invocation of a marker gives its text
    run_help "$inv" "$WORK/new.$n" || { echo "cli_doc: '$inv' exited $?: $(head -c 300 "$WORK/stderr")" >&2; exit 1; }
  done <"$WORK/index"
  awk -v dir="$WORK" '
    state == 0 && /^<!-- help: .* -->$/ { n++; print; state = 1; next }
    state == 1 { print; f = dir "/new." n; while ((getline l < f) > 0) print l; close(f); state = 2; next }
    state == 2 && /^```$/ { print; state = 0; next }
    state == 2 { next }
    { print }
  ' "$DOC" >"$WORK/doc.new" && cat "$WORK/doc.new" >"$DOC"
  echo "cli_doc: rewrote the help blocks of $DOC; now reread the prose around the changed ones"
  rm -rf "$WORK"
  exec bash "$0" "$TRILL" "$DOC" # check the new page: sections and invocations that still lack a block
fi

# Every marked invocation: the binary's help must be the block, byte for byte.
while IFS=$'\t' read -r n inv; do
  if ! run_help "$inv" "$WORK/out"; then
    fail "'$inv' (marked in $DOC) did not exit 0: $(head -c 300 "$WORK/stderr")"
  elif ! diff -u --label "$DOC: the block marked '$inv'" --label "$TRILL's output" "$WORK/block.$n" "$WORK/out" >"$WORK/diff"; then
    fail "the help of '${inv% --help}' drifted: $DOC shows a text other than '$inv' prints:"
    sed 's/^/    /' "$WORK/diff"
    echo "  to refresh: $REFRESH"
  fi
done <"$WORK/index"

# Every command, its section and its help block.
if ! "$TRILL" --help >"$WORK/top"; then
  fail "'trill --help' did not exit 0"
fi
commands=$(sed -n 's/^  \([a-z][a-z0-9-]*\)  .*/\1/p' "$WORK/top")
[ -n "$commands" ] || fail "no commands found in 'trill --help' (expected lines '  NAME   summary')"
required=("trill --help")
for cmd in $commands; do
  required+=("trill $cmd --help")
  grep -qE "^## trill $cmd( |\$)" "$DOC" || fail "'trill $cmd' (listed by 'trill --help') has no section '## trill $cmd' in $DOC"
done
for sub in "${SUBCOMMANDS[@]}"; do required+=("trill $sub --help"); done
for inv in "${required[@]}"; do
  cut -f2 "$WORK/index" | grep -qxF -- "$inv" ||
    fail "'${inv% --help}' has no help block in $DOC: add the line '<!-- help: $inv -->' and an empty \`\`\`text block under its section, then run: $REFRESH"
done

if [ "$failed" -gt 0 ]; then
  echo "cli_doc: $failed problem(s): $DOC no longer matches $TRILL"
  exit 1
fi
echo "cli_doc: $DOC matches $TRILL: $(wc -l <"$WORK/index") help texts, $(echo $commands | wc -w) command sections"
