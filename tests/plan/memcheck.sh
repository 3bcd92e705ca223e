#!/usr/bin/env bash
# memcheck.sh - hpdlc's planner and IR passes under valgrind's memcheck: a
# read of memory never written (an uninitialised flag, a field a struct's
# init forgot) is an error here, which AddressSanitizer and UBSan do not
# report. CTest plan.memcheck (release build only: valgrind cannot run an
# ASan binary); skips with 77 when valgrind is missing.
#
#   bash tests/plan/memcheck.sh HPDLC SOURCE_DIR
#
# Each command runs with --error-exitcode; the first with errors fails the
# test and prints valgrind's report (where, and where the value was made).
set -u
hpdlc=$1
src=$2
if ! command -v valgrind > /dev/null 2>&1; then
  echo "memcheck: valgrind is not installed (apt-get install valgrind): skipped"
  exit 77
fi
cd "$src" || exit 2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# the planner on each family of model and layout it prices differently, and
# the passes that build IR (lowering, autodiff, fusion)
cases=(
  "plan samples/gpt2-tiny.hpd --search --top 2"
  "plan samples/llama.hpd --explain"
  "plan samples/gpt-oss.hpd"
  "plan samples/deepseek-v3.hpd"
  "plan samples/resnet18.hpd"
  "plan samples/llama.hpd -D seq=32768 --cp 4 --cp-comm ring --gpus 32 --dp 8 --tp 1 --pp 1 --recompute selective"
  "plan samples/gpt.hpd --gpus 32 --dp 4 --tp 2 --pp 4 --schedule interleaved --virtual-stages 2 --engine deepspeed"
  "emit grad samples/llama.hpd"
  "emit fused samples/moe-tiny.hpd"
)
failed=0
for c in "${cases[@]}"; do
  # shellcheck disable=SC2086 # each case is a command line
  valgrind --error-exitcode=99 --track-origins=yes -q "$hpdlc" $c > /dev/null 2> "$log"
  rc=$?
  if [ "$rc" -eq 99 ]; then
    echo "FAIL  hpdlc $c: memcheck errors:"
    head -n 60 "$log"
    failed=1
  elif [ "$rc" -ne 0 ]; then
    echo "FAIL  hpdlc $c: exit $rc"
    head -n 20 "$log"
    failed=1
  else
    echo "ok    hpdlc $c"
  fi
done
exit $failed
