# golden_lib.sh - the comparison step shared by the golden-test runners
# (run_golden.sh, run_emit_golden.sh, plan/run_golden.sh,
# schedule/run_golden.sh), which source it.

# golden_compare EXPECTED ACTUAL ACTUAL_LABEL FAIL_MESSAGE [HINT]
# Returns 0 when EXPECTED exists and equals ACTUAL. Otherwise prints why -
# EXPECTED missing (with ACTUAL's text and HINT, how to create it), or the
# diff -u followed by "FAIL: FAIL_MESSAGE" - and returns 1.
golden_compare() {
  local expected=$1 actual=$2 label=$3 message=$4 hint=${5:-"create it with the runner's --update"}
  if [ ! -f "$expected" ]; then
    echo "FAIL: $expected is missing; the output was:"
    cat "$actual"
    echo "($hint)"
    return 1
  fi
  if ! diff -u --label "$expected (expected)" --label "$label" "$expected" "$actual"; then
    echo "FAIL: $message"
    return 1
  fi
  return 0
}
