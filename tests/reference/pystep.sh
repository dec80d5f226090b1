# shellcheck shell=bash
# The parity scripts' Python steps in one long-lived python3 (sourced; needs PY). Each step used to
# be a fresh python3 paying torch's import (~2 s of CPU, most of these tests' time); here
# pystep_start starts pystep.py --serve as a coprocess, pystep hands it one step at a time and
# waits for its status, so the steps still run one by one, in the script's order, between the
# trill runs that need their files. pystep_stop (in the EXIT trap) ends it.
# TRILL_PYSTEP_SEPARATE=1 runs every step in a fresh python3 instead, as before (its outputs are
# the same bit for bit: pystep.py puts back between steps what a step could leave behind).

PYSTEP_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYSTEP_PID=""

pystep_start() {
  [ "${TRILL_PYSTEP_SEPARATE:-0}" = 1 ] && return 0
  exec {PYSTEP_STDOUT}>&1   # the server's own stdout is the test's, its requests come on fd 5
  coproc PYSTEP_SERVER { exec "$PY" "$PYSTEP_DIR/pystep.py" --serve 5<&0 6>&1 1>&"$PYSTEP_STDOUT" </dev/null; }
  PYSTEP_PID=$PYSTEP_SERVER_PID PYSTEP_TO=${PYSTEP_SERVER[1]} PYSTEP_FROM=${PYSTEP_SERVER[0]}
  exec {PYSTEP_STDOUT}>&-
}

pystep_stop() {
  [ -n "$PYSTEP_PID" ] || return 0
  kill "$PYSTEP_PID" 2>/dev/null || true
  wait "$PYSTEP_PID" 2>/dev/null || true
  PYSTEP_PID=""
}

# pystep [-o FILE] [-e FILE | -E] SCRIPT ARGS...: runs tests/reference/SCRIPT with ARGS, as
# `$PY SCRIPT ARGS >FILE 2>FILE` (-E: 2>&1) would; the status is the step's. A step that fails
# is named on stderr. Not in a subshell or pipeline: they cannot reach the server.
pystep() {
  local out="" err="" script rc
  while :; do
    case $1 in
      -o) out=$2; shift 2 ;;
      -e) err=$2; shift 2 ;;
      -E) err='&1'; shift ;;
      *) break ;;
    esac
  done
  script=$1; shift
  if [ -z "$PYSTEP_PID" ]; then   # TRILL_PYSTEP_SEPARATE=1 (or no pystep_start)
    (
      if [ -n "$out" ]; then exec >"$out"; fi
      if [ "$err" = '&1' ]; then exec 2>&1; elif [ -n "$err" ]; then exec 2>"$err"; fi
      exec "$PY" "$PYSTEP_DIR/$script" "$@"
    ) && return 0 || rc=$?
  elif [ "$BASHPID" != "$$" ]; then
    echo "pystep: $script: not in a subshell or pipeline (the server's pipes are the script's own)" >&2; return 125
  elif ! kill -0 "$PYSTEP_PID" 2>/dev/null; then
    echo "pystep: the server (pystep.py) is gone; step not run: $script $*" >&2; return 125
  elif ! printf '%s\0' $(($# + 4)) "$PWD" "$out" "$err" "$script" "$@" >&"$PYSTEP_TO" || ! read -r rc <&"$PYSTEP_FROM"; then
    echo "pystep: the server (pystep.py) exited during: $script $*" >&2; return 125
  fi
  [ "$rc" -eq 0 ] || echo "pystep: exit status $rc: $script $*" >&2
  return "$rc"
}
