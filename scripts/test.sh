#!/usr/bin/env bash
# make test / make test-full: the three builds and their tests, each stage timed, then the time
# of each stage and the 10 slowest tests. The sanitizer builds run beside the release build and tests.
#   make test       the release build's tests but those labelled "full", the ASan+UBSan build's
#                   label "sanitize" and the TSan build's label "tsan", again without "full"; the
#                   parity sweeps sampled. Budget: 10 minutes on an idle 2-core machine.
#   make test-full  every test of every build, the sweeps whole (TRILL_TEST_FULL=1): run it
#                   before landing a change to what the sampled sweeps guard (ARCHITECTURE.md, Tests).
# Usage: scripts/test.sh default|full   (BUILD, ASAN_BUILD, TSAN_BUILD, JOBS from make)
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-default}
BUILD=${BUILD:-build} ASAN_BUILD=${ASAN_BUILD:-build-asan} TSAN_BUILD=${TSAN_BUILD:-build-tsan}
JOBS=${JOBS:-$(nproc)}
case "$MODE" in
  default) EXCLUDE=(-LE full) ;;
  full) EXCLUDE=(); export TRILL_TEST_FULL=1 ;;
  *) echo "usage: scripts/test.sh default|full" >&2; exit 2 ;;
esac

START=$(date +%s.%N)
STAGES=()   # "name seconds cpu-seconds"
# stage NAME COMMAND...: runs it, timed (wall, and the CPU time of everything it ran)
stage() {
  local name=$1 t0 c0 c1 rc=0
  shift
  t0=$(date +%s.%N)
  c0=$(awk '{ print $14 + $15 + $16 + $17 }' /proc/$$/stat)
  echo "== $name: $*"
  "$@" || rc=$?
  c1=$(awk '{ print $14 + $15 + $16 + $17 }' /proc/$$/stat)
  STAGES+=("$name $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }') $(((c1 - c0) / $(getconf CLK_TCK)))")
  return $rc
}

# every registered test must have a TIMEOUT (a deadlock fails its test instead of hanging the suite)
check_timeouts() {
  ctest --test-dir "$1" --show-only=json-v1 | python3 -c '
import json, sys
tests = json.load(sys.stdin)["tests"]
bad = [t["name"] for t in tests if not any(p["name"] == "TIMEOUT" for p in t.get("properties", []))]
if bad:
    sys.exit("tests without a TIMEOUT in %s: %s" % (sys.argv[1], " ".join(bad)))' "$1"
}

# run_tests BUILD ARGS...: ctest with a JUnit report of each test's time (BUILD/junit.xml)
run_tests() {
  local dir=$1
  shift
  check_timeouts "$dir" && ctest --test-dir "$dir" --output-on-failure -j"$JOBS" --output-junit junit.xml "$@"
}

summary() {
  local rc=$?
  [ -z "${BUILDS_PID:-}" ] || ! kill -0 "$BUILDS_PID" 2>/dev/null || kill -- -"$BUILDS_PID" 2>/dev/null || true
  echo
  echo "make test ($MODE) on $(nproc) cores, $(awk '/^model name/ { sub(/.*: /, ""); print; exit }' /proc/cpuinfo):"
  printf '  %-14s %8s %10s\n' stage "wall s" "CPU s"
  local s
  for s in "${STAGES[@]}"; do
    # shellcheck disable=SC2086
    printf '  %-14s %8s %10s\n' $s
  done
  printf '  %-14s %8.0f\n' total "$(awk -v a="$START" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')"
  [ -z "${BG_WALL:-}" ] || echo "  (the ASan and TSan builds, nice 19 beside the release build and tests: $BG_WALL s wall, $BG_CPU s CPU;
  their CPU also counts in the stage during which they ended, when the shell reaped them)"
  python3 - "$BUILD" "$ASAN_BUILD" "$TSAN_BUILD" <<'PY' || true
import os, sys, xml.etree.ElementTree as ET
rows = []
for build in sys.argv[1:]:
    path = os.path.join(build, "junit.xml")
    if os.path.exists(path):
        for t in ET.parse(path).getroot().iter("testcase"):
            rows.append((float(t.get("time", 0)), t.get("name"), build, t.get("status", "")))
rows.sort(reverse=True)
if rows:
    print("  the 10 slowest tests (seconds, wall; two at a time):")
    for sec, name, build, status in rows[:10]:
        print(f"  {sec:8.1f}  {name:<28} {build:<12} {status}")
PY
  exit $rc
}
trap summary EXIT

# The sanitizer builds run beside the release build and its tests at the lowest priority (nice 19):
# they take the cores those leave idle (the release build's links and its longest file, tests
# waiting on their processes, Python and node starting) and give them back at once. Their log is
# BUILD/sanitizer-builds.log; the stage "sanitizer-builds" is the wait for them after the tests,
# and a line after the table says what they took beside them.
sanitizer_builds() {
  local t0 rc=0 self=$BASHPID # (inside $(...) BASHPID would be the substitution's own)
  t0=$(date +%s.%N)
  { make --no-print-directory asan ASAN_BUILD="$ASAN_BUILD" JOBS="$JOBS" && make --no-print-directory tsan TSAN_BUILD="$TSAN_BUILD" JOBS="$JOBS"; } \
    >"$BUILD/sanitizer-builds.log" 2>&1 || rc=$?
  echo "$rc $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }') $(awk '{ print int(($14 + $15 + $16 + $17) / '"$(getconf CLK_TCK)"') }' /proc/$self/stat)" \
    >"$BUILD/sanitizer-builds.status"
}
wait_builds() {
  local rc=0 status
  wait "$BUILDS_PID" || true
  status=$(cat "$BUILD/sanitizer-builds.status" 2>/dev/null || echo "1 0 0")
  read -r rc BG_WALL BG_CPU <<<"$status"
  [ "$rc" -eq 0 ] || { tail -40 "$BUILD/sanitizer-builds.log"; echo "the sanitizer builds failed (the whole log: $BUILD/sanitizer-builds.log)"; }
  return "$rc"
}

stage deps bash scripts/install-deps.sh
mkdir -p "$BUILD"
rm -f "$BUILD/sanitizer-builds.status"
set -m # the builds in a process group of their own, stopped whole if the release build or its tests fail
(renice -n 19 $BASHPID >/dev/null; sanitizer_builds) &
BUILDS_PID=$!
set +m
stage build make --no-print-directory build BUILD="$BUILD" JOBS="$JOBS"
stage tests run_tests "$BUILD" "${EXCLUDE[@]}"
stage sanitizer-builds wait_builds
stage asan-tests run_tests "$ASAN_BUILD" -L sanitize "${EXCLUDE[@]}"
stage tsan-tests run_tests "$TSAN_BUILD" -L tsan "${EXCLUDE[@]}"
