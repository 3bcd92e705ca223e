#!/usr/bin/env bash
# check_summary.sh - one shape-inference / override test: runs
#   HPDLC check ARGS...
# from the source root and requires exit status 0 and a stdout that is exactly
# the EXPECTED line (the one-line summary: model, parameter count, layout).
#
#   check_summary.sh HPDLC SOURCE_DIR EXPECTED [ARGS...]
set -u
if [ $# -lt 3 ]; then
  echo "usage: $0 HPDLC SOURCE_DIR EXPECTED [ARGS...]" >&2
  exit 2
fi
hpdlc=$(realpath "$1")
cd "$2" || exit 2
expected=$3
shift 3

out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
timeout 30 "$hpdlc" check "$@" >"$out" 2>"$err"
status=$?

fail=0
if [ "$status" != 0 ]; then
  echo "FAIL: hpdlc check $* exited with $status, expected 0"
  fail=1
fi
if ! diff -u --label expected --label "hpdlc check $* (stdout)" <(printf '%s\n' "$expected") "$out"; then
  echo "FAIL: the summary differs"
  fail=1
fi
if [ "$fail" = 1 ] && [ -s "$err" ]; then
  echo "stderr was:"
  cat "$err"
fi
exit $fail
