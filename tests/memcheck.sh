#!/usr/bin/env bash
# memcheck.sh - the tools under valgrind's memcheck: a read of memory never
# written (an uninitialised flag, a field a struct's init forgot) is an error
# here, which AddressSanitizer and UBSan do not report. CTest plan.memcheck
# and runtime.memcheck (release build only: valgrind cannot run an ASan
# binary); skips with 77 when valgrind is missing.
#
#   bash tests/memcheck.sh plan BIN_DIR SOURCE_DIR
#       hpdlc plan on a model of each family the planner prices differently,
#       and the passes that build IR (emit grad, emit fused)
#   bash tests/memcheck.sh runtime BIN_DIR SOURCE_DIR WORK_DIR
#       a small GPT-2 compiled for the reference executor (native kernels use
#       AVX-512, which valgrind does not decode), trained 3 steps by hpdlrun
#       with a checkpoint each step, resumed for a 4th, and a damaged
#       checkpoint refused: the data loader, the optimizer, the checkpoints
#
# Each command runs with --error-exitcode; one with errors fails the test
# and prints valgrind's report (where, and where the value was made).
set -u
mode=$1
bin=$(cd "$2" 2> /dev/null && pwd) || { echo "memcheck: no folder $2"; exit 2; }
src=$3
work=${4:-}
if ! command -v valgrind > /dev/null 2>&1; then
  echo "memcheck: valgrind is not installed (apt-get install valgrind): skipped"
  exit 77
fi
cd "$src" || exit 2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=0
# check EXPECTED_EXIT TOOL ARGS...: TOOL under memcheck; its exit must be EXPECTED_EXIT
check() {
  local want=$1
  shift
  valgrind --error-exitcode=99 -q "$@" > /dev/null 2> "$log"
  local rc=$?
  if [ "$rc" -eq 99 ]; then
    # again with the origins of the values (twice the time, so only here)
    valgrind --error-exitcode=99 --track-origins=yes -q "$@" > /dev/null 2> "$log"
    echo "FAIL  ${*##*/}: memcheck errors:"
    head -n 60 "$log"
    failed=1
  elif [ "$rc" -ne "$want" ]; then
    echo "FAIL  ${*##*/}: exit $rc, not $want"
    head -n 20 "$log"
    failed=1
  else
    echo "ok    $*"
  fi
}

if [ "$mode" = runtime ]; then
  [ -n "$work" ] || { echo "memcheck: runtime needs WORK_DIR"; exit 2; }
  rm -rf "$work" && mkdir -p "$work" || exit 2
  art=$work/art
  "$bin/hpdlc" compile samples/gpt2-tiny.hpd -D L=1 -D C=32 -D H=2 -D T=16 --executor interp -o "$art" > /dev/null ||
    { echo "memcheck: the compile failed"; exit 1; }
  "$bin/hpdl-data" --synthetic 100000 -o "$work/data/syn" > /dev/null || { echo "memcheck: hpdl-data failed"; exit 1; }
  run=("$bin/hpdlrun" "$art" --data "$work/data/syn_train_*.bin" --checkpoint-dir "$work/ckpt")
  check 0 "${run[@]}" --steps 3 --checkpoint-every 1
  check 0 "${run[@]}" --steps 4 --resume
  # a checkpoint cut short: refused with a message, exit 1 (docs/runtime.md)
  ckpts=("$work"/ckpt/*.safetensors)
  last=${ckpts[${#ckpts[@]} - 1]}
  if [ -f "$last" ]; then
    truncate -s 100 "$last"
    check 1 "${run[@]}" --steps 5 --resume
  else
    echo "FAIL  no checkpoint written under $work/ckpt"
    failed=1
  fi
  exit $failed
fi

[ "$mode" = plan ] || { echo "memcheck: mode plan or runtime, not '$mode'"; exit 2; }
hpdlc=$bin/hpdlc
# the planner on each family of model and layout it prices differently, and
# the passes that build IR (lowering, autodiff, fusion)
cases=(
  "plan samples/gpt2-tiny.hpd --search --top 2"
  "plan samples/llama.hpd --explain"
  "plan samples/gpt-oss.hpd"
  "plan samples/deepseek-v3.hpd"
  "plan samples/resnet18.hpd"
  "plan samples/llama.hpd -D seq=32768 --cp 4 --cp-comm ring --gpus 32 --dp 8 --tp 1 --pp 1 --recompute selective"
  "plan samples/gpt.hpd --gpus 32 --pp 4 --precision bf16 --engine deepspeed --search --top 2"
  "emit grad samples/llama.hpd"
  "emit fused samples/moe-tiny.hpd"
)
for c in "${cases[@]}"; do
  # shellcheck disable=SC2086 # each case is a command line
  check 0 "$hpdlc" $c
done
exit $failed
