# make test's samples of the parity scripts' cases (sourced): SAMPLE=" case case ... " names the
# cases make test runs; make test-full (TRILL_TEST_FULL=1) runs every case.
skipped=()
sampled() { # sampled CASE: true when make test-full, or CASE is in make test's sample
  [ "${TRILL_TEST_FULL:-0}" = 1 ] || [[ "$SAMPLE" == *" $1 "* ]] || { skipped+=("$1"); return 1; }
}
# says which cases the sample left out
report_sampled() {
  [ ${#skipped[@]} -eq 0 ] || echo "make test's sample: not run here (make test-full runs them): ${skipped[*]}"
}
