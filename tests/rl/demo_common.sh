# Sourced by demo_learns.sh and demo_turns.sh (Usage: SCRIPT TRILL [DIR]): TRILL, HERE, a scratch
# folder W (the working directory, removed at exit), the demo's warm start D (DIR, the ctest fixture
# demo_cache; else built here first) as TRILL_CACHE_DIR's parent, fail, LIMIT, run LOG ARGS... (trill
# exits 0 within LIMIT with no sanitizer report in LOG) and pass1 WHEN LOG (held-out pass@1 before/after).
set -euo pipefail
TRILL=$(realpath "$1")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
D=${2:-$W/demo}
[ -f "$D/first.log" ] || bash "$HERE/demo_warm_start.sh" "$TRILL" "$D"
cd "$W"
export TRILL_CACHE_DIR="$D/cache"
fail() { echo "FAIL: $*" >&2; exit 1; }
LIMIT=${TRILL_TEST_LIMIT_S:-600}
run() {
    local log=$1 rc=0
    shift
    timeout -k 5 "$LIMIT" "$TRILL" "$@" 2>"$log" || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$log"; fail "exit status $rc: trill $*"; }
    if grep -nE "Sanitizer|runtime error:" "$log"; then fail "a sanitizer report in $log"; fi
}
pass1() { sed -n "s/.*held-out $1: pass@1 \([0-9.]*\)%.*/\1/p" "$2"; }
