#!/usr/bin/env bash
# run_golden.sh - one golden pipeline-schedule test: prints a schedule with
#   PRINTER --print KIND PP M V [--compute]
# (the test_schedule executable's print mode, the same text as
# sched_print / `hpdlc emit schedule`) and compares it with EXPECTED using
# `diff -u`.
#
#   run_golden.sh [--update] PRINTER EXPECTED.txt KIND PP M V [--compute]
#
# --update rewrites EXPECTED.txt from the current output instead (read the
# change before committing it).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../golden_lib.sh" || exit 2

update=0
if [ "${1:-}" = "--update" ]; then
  update=1
  shift
fi
if [ $# -lt 6 ]; then
  echo "usage: $0 [--update] PRINTER EXPECTED.txt KIND PP M V [--compute]" >&2
  exit 2
fi
printer=$1
expected=$2
shift 2

actual=$(mktemp)
trap 'rm -f "$actual"' EXIT
timeout 30 "$printer" --print "$@" >"$actual"
status=$?
if [ "$status" != 0 ]; then
  echo "FAIL: $printer --print $* exited with $status"
  exit 1
fi

if [ "$update" = 1 ]; then
  cp "$actual" "$expected"
  echo "updated $expected"
  exit 0
fi
golden_compare "$expected" "$actual" "schedule $* (actual)" "the schedule differs from $expected"
