#!/usr/bin/env bash
# run_golden.sh - one golden report of `hpdlc plan`: runs it from the source
# root (so the report names the sample by its relative path) and compares its
# standard output with the expected file using diff -u.
#
#   run_golden.sh [--update] HPDLC SOURCE_DIR EXPECTED.txt SAMPLE [ARGS...]
#
# --update rewrites EXPECTED.txt instead (read every change before committing).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../golden_lib.sh" || exit 2
update=0
if [ "${1:-}" = "--update" ]; then
  update=1
  shift
fi
if [ $# -lt 4 ]; then
  echo "usage: $0 [--update] HPDLC SOURCE_DIR EXPECTED.txt SAMPLE [ARGS...]" >&2
  exit 2
fi
hpdlc=$(realpath "$1")
src=$2
expected=$(realpath -m "$3")
sample=$4
shift 4
cd "$src" || exit 2
actual=$(mktemp)
trap 'rm -f "$actual"' EXIT
"$hpdlc" plan "$sample" "$@" >"$actual" 2>&1
status=$?
if [ $status -ne 0 ]; then
  echo "hpdlc plan exited with $status" >&2
  cat "$actual" >&2
  exit 1
fi
if [ $update -eq 1 ]; then
  cp "$actual" "$expected"
  exit 0
fi
golden_compare "$expected" "$actual" "plan $sample $* (actual)" "the plan report differs from $expected"
