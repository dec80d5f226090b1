# Sourced by the data-parallel tests: kill_rank_1 JOB CMD LOG waits until LOG shows step 4, kills
# rank 1 of the mpirun job JOB (the process of CMD, e.g. "trill sft", under JOB, whose environment
# names it rank 1) with SIGKILL, and checks that the job ends within 30 s, non-zero, with mpirun naming the
# rank, with no sanitizer report in LOG. Needs fail() and clean_log() (tests/rl/checks.sh).
# under PID ANCESTOR: PID descends from ANCESTOR (ctest runs two tests at once: another test's job
# has a rank 1 of the same binary too, and killing it fails both tests)
under() {
  local p=$1
  while [ -n "$p" ] && [ "$p" -gt 1 ]; do
    [ "$p" -eq "$2" ] && return 0
    p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null) || return 1
  done
  return 1
}
kill_rank_1() {
  local job=$1 cmd=$2 log=$3 victim="" rc=0 t0 t1
  for _ in $(seq 1200); do grep -q "^step 4/" "$log" 2>/dev/null && break; sleep 0.1; done
  grep -q "^step 4/" "$log" || { cat "$log"; fail "the run to kill never reached step 4"; }
  for p in $(pgrep -f "$cmd"); do
    under "$p" "$job" && grep -qz "^OMPI_COMM_WORLD_RANK=1$" "/proc/$p/environ" 2>/dev/null && victim=$p
  done
  [ -n "$victim" ] || fail "no rank-1 process to kill"
  t0=$(date +%s)
  kill -9 "$victim"
  wait "$job" || rc=$?
  t1=$(date +%s)
  [ "$rc" -ne 0 ] || fail "the job exited 0 after a rank was killed"
  [ $((t1 - t0)) -le 30 ] || fail "the job took $((t1 - t0)) s to end after a rank was killed"
  grep -q "rank 1 .*exited on signal 9" "$log" || { tail -20 "$log"; fail "the job's end does not name the killed rank"; }
  clean_log "$log" # the kill is the only failure: no sanitizer or runtime-error report from the others
  echo "a killed rank ended the job in $((t1 - t0)) s: $(grep -o 'process rank 1 [^.]*' "$log" | head -1)"
}
