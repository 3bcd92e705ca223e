#!/usr/bin/env bash
# roundtrip.sh - parse -> print -> parse of one file:
#   hpdlc emit source FILE   > a.hpd
#   hpdlc emit source a.hpd  > b.hpd     a and b must be identical, and
#   hpdlc emit ast FILE / a.hpd          the same tree once source spans
#                                        (@line:col-line:col) and the first
#                                        line (the file's path) are removed.
#
#   roundtrip.sh HPDLC FILE WORK_DIR
# The printed files are written to WORK_DIR (kept for inspection).
set -u
if [ $# -ne 3 ]; then
  echo "usage: $0 HPDLC FILE WORK_DIR" >&2
  exit 2
fi
hpdlc=$1
file=$2
work=$3
mkdir -p "$work" || exit 2
a=$work/a.hpd
b=$work/b.hpd

run() { # run OUT ARGS...: hpdlc ARGS > OUT, failing on a non-zero status
  local out=$1
  shift
  if ! timeout 30 "$hpdlc" "$@" >"$out"; then
    echo "FAIL: hpdlc $* exited with $?"
    exit 1
  fi
}

strip_ast() { # the tree without its spans and without the `file PATH` line
  sed -e '1{/^file /d}' -e 's/ @[0-9]*:[0-9]*-[0-9]*:[0-9]*//g' "$1"
}

run "$a" emit source "$file"
run "$b" emit source "$a"
fail=0
if ! cmp -s "$a" "$b"; then
  echo "FAIL: printing the printed source of $file changes it:"
  diff -u --label "print($file)" --label "print(print($file))" "$a" "$b"
  fail=1
fi
run "$work/orig.ast" emit ast "$file"
run "$work/printed.ast" emit ast "$a"
strip_ast "$work/orig.ast" >"$work/orig.ast.nospan"
strip_ast "$work/printed.ast" >"$work/printed.ast.nospan"
if ! diff -u --label "ast($file)" --label "ast(print($file))" "$work/orig.ast.nospan" "$work/printed.ast.nospan"; then
  echo "FAIL: the printed source of $file parses to another tree"
  fail=1
fi
if [ ! -s "$work/orig.ast.nospan" ]; then
  echo "FAIL: emit ast printed nothing for $file"
  fail=1
fi
exit $fail
