# The end-to-end tests' checks, sourced by tests/rl/fixture.sh and by the scripts of tests/dist:
# fail, LIMIT, clean_log, must_pass, must_exit and numeric. Every command under test runs under a
# timeout, must exit with exactly the status expected, and leave no sanitizer or runtime-error
# report in its log.
fail() { echo "FAIL: $*" >&2; exit 1; }
LIMIT=${TRILL_TEST_LIMIT_S:-300} # seconds any one command may take: a timeout is a failure, never a pass

# No sanitizer or runtime-error report in a log (under ASan/UBSan a report after the expected
# message would otherwise pass as "the run failed").
clean_log() {
    if grep -nE "Sanitizer|runtime error:|Segmentation fault|core dumped|double free|stack smashing" "$1" >&2; then
        fail "a sanitizer or runtime-error report in $1"
    fi
}
# must_pass LOG COMMAND...: exits 0 within LIMIT, stderr in LOG, no report in it.
must_pass() {
    local log=$1 rc=0
    shift
    timeout -k 5 "$LIMIT" "$@" 2>"$log" || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$log" >&2; fail "exit status $rc$( [ "$rc" -ne 124 ] || echo " (timed out after $LIMIT s)"): $*"; }
    clean_log "$log"
}
# must_exit CODE LOG COMMAND...: exits with exactly CODE (1: the run failed, 2: a usage error)
# within LIMIT, stderr in LOG, no report in it.
must_exit() {
    local want=$1 log=$2 rc=0
    shift 2
    timeout -k 5 "$LIMIT" "$@" 2>"$log" || rc=$?
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { tail -5 "$log" >&2; fail "timed out after $LIMIT s (a hang): $*"; }
    [ "$rc" -eq "$want" ] || { tail -20 "$log" >&2; fail "exit status $rc, expected $want: $*"; }
    clean_log "$log"
}

# numeric WHAT VALUE: VALUE is a number (a figure read from a log: an empty one would compare
# equal to another empty one)
numeric() {
    [[ "$2" =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]] || fail "$1: expected a number, got '$2'"
}
