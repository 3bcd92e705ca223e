#!/usr/bin/env bash
# run_memory.sh - one golden memory-plan test: runs
# `hpdlc emit memory [FLAGS...] SAMPLE.hpd` and compares its stdout with
# EXPECTED using `diff -u`; the command must exit 0 and print nothing on
# stderr (mem_check's, fuse_check's and ir_verify's complaints go there).
#
#   run_memory.sh [--update] HPDLC SAMPLE.hpd EXPECTED STDLIB_DIR [FLAGS...]
#
# --update rewrites EXPECTED from the current output instead of comparing
# (read the diff of every changed file before committing it).
set -u

update=0
if [ "${1:-}" = "--update" ]; then
  update=1
  shift
fi
if [ $# -lt 4 ]; then
  echo "usage: $0 [--update] HPDLC SAMPLE.hpd EXPECTED STDLIB_DIR [FLAGS...]" >&2
  exit 2
fi
hpdlc=$1
sample=$2
expected=$3
HPDL_STDLIB=$4
export HPDL_STDLIB
shift 4

actual=$(mktemp)
errors=$(mktemp)
trap 'rm -f "$actual" "$errors"' EXIT
timeout 60 "$hpdlc" emit memory "$@" "$sample" >"$actual" 2>"$errors"
status=$?

if [ "$update" = 1 ]; then
  cat "$actual" >"$expected"
  echo "updated $expected (exit $status)"
  [ "$status" = 0 ] || cat "$errors" >&2
  exit 0
fi

fail=0
if [ "$status" != 0 ]; then
  echo "FAIL: hpdlc emit memory $* $sample exited with $status"
  fail=1
fi
if [ -s "$errors" ]; then
  echo "FAIL: hpdlc emit memory $* $sample wrote to stderr:"
  cat "$errors"
  fail=1
fi
if [ ! -f "$expected" ]; then
  echo "FAIL: $expected is missing (create it with: $0 --update ...)"
  fail=1
elif ! diff -u --label "$expected (expected)" --label "emit memory $* $sample (actual)" "$expected" "$actual"; then
  echo "FAIL: the memory plan differs from $expected"
  fail=1
fi
exit $fail
