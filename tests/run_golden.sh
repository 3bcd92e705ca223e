#!/usr/bin/env bash
# run_golden.sh - one golden-diagnostic test: runs `hpdlc check NAME.hpd` from
# the file's own folder (so diagnostics show the bare file name), compares its
# stderr with NAME.err using `diff -u`, and its exit status with the one the
# first line of NAME.hpd asks for (`# exit: N`; 1 when absent).
# A `# args: ...` comment on the first or second line gives extra arguments
# for hpdlc, passed before the file name (`# args: --tp 3 -D H=5`); they are
# split at white space (no quoting).
#
#   run_golden.sh [--update] HPDLC FILE.hpd [STDLIB_DIR]
#
# --update rewrites NAME.err from the current output instead of comparing
# (check every changed .err by reading it before committing it).
# STDLIB_DIR is passed to hpdlc as HPDL_STDLIB, relative to the file's folder,
# so paths in notes do not depend on where the checkout lives.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/golden_lib.sh" || exit 2

update=0
if [ "${1:-}" = "--update" ]; then
  update=1
  shift
fi
if [ $# -lt 2 ]; then
  echo "usage: $0 [--update] HPDLC FILE.hpd [STDLIB_DIR]" >&2
  exit 2
fi
hpdlc=$(realpath "$1")
file=$2
stdlib=${3:-}

dir=$(dirname "$file")
name=$(basename "$file")
base=${name%.hpd}
cd "$dir" || exit 2
expected_err="$base.err"

want_status=1
first=$(head -n 1 -- "$name" | tr -d '\r')
if [[ $first =~ ^#[[:space:]]*exit:[[:space:]]*([0-9]+) ]]; then
  want_status=${BASH_REMATCH[1]}
fi

extra_args=()
while IFS= read -r line; do
  line=${line%$'\r'}
  if [[ $line =~ ^#[[:space:]]*args:(.*)$ ]]; then
    read -r -a extra_args <<<"${BASH_REMATCH[1]}"
    break
  fi
done < <(head -n 2 -- "$name")

if [ -n "$stdlib" ]; then
  HPDL_STDLIB=$(realpath --relative-to=. "$stdlib")
  export HPDL_STDLIB
fi

actual=$(mktemp)
trap 'rm -f "$actual" "$actual.raw"' EXIT
# No colour (stderr is a file); a hang is a failure too.
timeout 30 "$hpdlc" check "${extra_args[@]}" "$name" >/dev/null 2>"$actual.raw"
status=$?

# Canonical paths of this folder (import-cycle notes print them) become
# relative, so the expected output does not depend on the checkout's location.
here_p=$(pwd -P)
here_l=$(pwd -L)
sed -e "s|$here_p/||g" -e "s|$here_l/||g" "$actual.raw" >"$actual"

if [ "$update" = 1 ]; then
  cp "$actual" "$expected_err"
  echo "updated $dir/$expected_err (exit $status)"
  if [ "$status" != "$want_status" ]; then
    echo "warning: exit status $status, but $name asks for $want_status" >&2
  fi
  exit 0
fi

fail=0
if [ "$status" -ge 124 ]; then
  echo "FAIL: hpdlc check $name: killed or timed out (status $status)"
  fail=1
elif [ "$status" != "$want_status" ]; then
  echo "FAIL: hpdlc check $name exited with $status, expected $want_status"
  fail=1
fi
golden_compare "$expected_err" "$actual" "$name (actual stderr)" \
  "the diagnostics differ from $dir/$expected_err" "create it with: $0 --update $1 $file ${stdlib}" || fail=1
exit $fail
