#!/usr/bin/env bash
# The trill command tunes its process's memory before anything else (src/cli/main.c, tune_memory):
# where the kernel gives transparent huge pages on request only ("madvise"), it starts itself again
# with glibc.malloc.hugetlb=1 put first in GLIBC_TUNABLES (a user's tunables kept after it, a
# user's own hugetlb setting left alone), under its own name (not "exe"), for the commands that
# compute (not those that only read or write a file: `trill tokenize` runs as started). Checked on
# a running `trill score` held on a fifo as its input: /proc/PID/comm and /proc/PID/environ (which shows a
# variable's bytes as the process started; glibc's parsing of GLIBC_TUNABLES then cuts them at the
# first ':', so the user's part is looked for in the raw bytes). The sanitizer builds (allocators
# of their own) and other kernel settings do not restart: then only the name is checked.
# Usage: test_memory.sh TRILL
set -euo pipefail
TRILL=$(realpath "$1")
source "$(cd "$(dirname "$0")/../rl" && pwd)/checks.sh" # fail, must_pass
W=$(mktemp -d "${TMPDIR:-/tmp}/trill-memory-XXXXXX")
trap 'rm -rf "$W"' EXIT
cd "$W"
must_pass init.log "$TRILL" init --out tiny --preset tiny --seed 1
mode=$(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo "(none)")
restarts=true
case "$mode" in *"[madvise]"*) ;; *) restarts=false ;; esac
# (the libraries read whole first: `ldd | grep -q` under pipefail fails when grep stops reading early)
libs=$(ldd "$TRILL" 2>/dev/null || true)
sanitized=false
case "$libs" in *libasan* | *libtsan*) sanitized=true restarts=false ;; esac

# held TUNABLES-or-"-" WANT [KEPT]: a `trill score` started with GLIBC_TUNABLES=TUNABLES ("-":
# unset) runs as "trill" with GLIBC_TUNABLES=WANT (up to its first ':') within 10 s, KEPT among
# its environment's bytes (WANT "-": only the name is checked)
held() {
  local given=$1 want=$2 kept=${3:-} pid comm tun=""
  rm -f in
  mkfifo in
  if [ "$given" = - ]; then
    env -u GLIBC_TUNABLES "$TRILL" score --model tiny --input in --output out.jsonl 2>err &
  else
    env GLIBC_TUNABLES="$given" "$TRILL" score --model tiny --input in --output out.jsonl 2>err &
  fi
  pid=$!
  for _ in $(seq 100); do # it waits in opening its input
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    tun=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^GLIBC_TUNABLES=//p' || true)
    [ "$comm" = trill ] && { [ "$want" = - ] || [ "$tun" = "$want" ]; } && break
    sleep 0.1
  done
  local lost=false
  [ -z "$kept" ] || grep -qaF "$kept" "/proc/$pid/environ" || lost=true
  timeout 20 sh -c "echo '{\"tokens\": [1, 2, 3]}' >in" || { cat err; fail "trill score never read its input"; }
  wait "$pid" || { cat err; fail "trill score failed"; }
  ! $lost || fail "GLIBC_TUNABLES=$given lost $kept"
  [ "$comm" = trill ] || fail "the process is named \"$comm\", not trill"
  [ "$want" = - ] || [ "$tun" = "$want" ] || fail "GLIBC_TUNABLES=${given} gave \"$tun\", expected \"$want\""
}

if $restarts; then
  held - glibc.malloc.hugetlb=1
  held glibc.malloc.tcache_count=7 glibc.malloc.hugetlb=1 glibc.malloc.tcache_count=7
  held glibc.malloc.hugetlb=0 glibc.malloc.hugetlb=0
  echo "huge pages on request ($mode): trill runs with glibc.malloc.hugetlb=1 put first, a user's tunables kept, under its own name"
else
  held - -
  echo "SKIP: no restart here (transparent huge pages: $mode; sanitized build: $sanitized); the name checked"
fi
