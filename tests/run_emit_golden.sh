#!/usr/bin/env bash
# run_emit_golden.sh - one golden test of an `hpdlc emit` stage: runs
# `hpdlc emit STAGE [FLAGS...] SAMPLE.hpd` and compares its stdout with
# EXPECTED using `diff -u`; the command must exit 0 and print nothing on
# stderr (the checks of the stage - ir_verify, fuse_check, mem_check -
# complain there).
#
#   run_emit_golden.sh [--update] HPDLC STAGE SAMPLE.hpd EXPECTED STDLIB_DIR [FLAGS...]
#
# --update rewrites EXPECTED from the current output instead of comparing
# (read the diff of every changed file before committing it).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/golden_lib.sh" || exit 2

update=0
if [ "${1:-}" = "--update" ]; then
  update=1
  shift
fi
if [ $# -lt 5 ]; then
  echo "usage: $0 [--update] HPDLC STAGE SAMPLE.hpd EXPECTED STDLIB_DIR [FLAGS...]" >&2
  exit 2
fi
hpdlc=$1
stage=$2
sample=$3
expected=$4
HPDL_STDLIB=$5
export HPDL_STDLIB
shift 5

actual=$(mktemp)
errors=$(mktemp)
trap 'rm -f "$actual" "$errors"' EXIT
timeout 60 "$hpdlc" emit "$stage" "$@" "$sample" >"$actual" 2>"$errors"
status=$?

if [ "$update" = 1 ]; then
  cat "$actual" >"$expected"
  echo "updated $expected (exit $status)"
  [ "$status" = 0 ] || cat "$errors" >&2
  exit 0
fi

fail=0
if [ "$status" != 0 ]; then
  echo "FAIL: hpdlc emit $stage $* $sample exited with $status"
  fail=1
fi
if [ -s "$errors" ]; then
  echo "FAIL: hpdlc emit $stage $* $sample wrote to stderr:"
  cat "$errors"
  fail=1
fi
golden_compare "$expected" "$actual" "emit $stage $* $sample (actual)" \
  "the output of emit $stage differs from $expected" || fail=1
exit $fail
