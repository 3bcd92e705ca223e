#!/usr/bin/env bash
# run_fused.sh - one golden fusion test: runs `hpdlc emit fused SAMPLE.hpd`
# and compares its stdout with EXPECTED.fused using `diff -u`; the command
# must exit 0 and print nothing on stderr (fuse_check's and ir_verify's
# complaints go there).
#
#   run_fused.sh [--update] HPDLC SAMPLE.hpd EXPECTED.fused [STDLIB_DIR]
#
# --update rewrites EXPECTED.fused from the current output instead of
# comparing (read the diff of every changed file before committing it).
set -u

update=0
if [ "${1:-}" = "--update" ]; then
  update=1
  shift
fi
if [ $# -lt 3 ]; then
  echo "usage: $0 [--update] HPDLC SAMPLE.hpd EXPECTED.fused [STDLIB_DIR]" >&2
  exit 2
fi
hpdlc=$1
sample=$2
expected=$3
if [ -n "${4:-}" ]; then
  HPDL_STDLIB=$4
  export HPDL_STDLIB
fi

actual=$(mktemp)
errors=$(mktemp)
trap 'rm -f "$actual" "$errors"' EXIT
timeout 60 "$hpdlc" emit fused "$sample" >"$actual" 2>"$errors"
status=$?

if [ "$update" = 1 ]; then
  cat "$actual" >"$expected"
  echo "updated $expected (exit $status)"
  [ "$status" = 0 ] || cat "$errors" >&2
  exit 0
fi

fail=0
if [ "$status" != 0 ]; then
  echo "FAIL: hpdlc emit fused $sample exited with $status"
  fail=1
fi
if [ -s "$errors" ]; then
  echo "FAIL: hpdlc emit fused $sample wrote to stderr:"
  cat "$errors"
  fail=1
fi
if [ ! -f "$expected" ]; then
  echo "FAIL: $expected is missing (create it with: $0 --update $*)"
  fail=1
elif ! diff -u --label "$expected (expected)" --label "emit fused $sample (actual)" "$expected" "$actual"; then
  echo "FAIL: the kernels differ from $expected"
  fail=1
fi
exit $fail
