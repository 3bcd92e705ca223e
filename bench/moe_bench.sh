#!/usr/bin/env bash
# moe_bench.sh - a dropless mixture-of-experts step over the rows routed to each
# expert (hpdlc compile's default, compiler/ir/moepack.c) against the same layer
# over a slot for every token in every expert (--experts slots), in the same run:
# samples/moe-tiny.hpd with 16 experts, 2 a token (8x the routed rows in slots),
# 128-token sequences, on this machine's CPU. Prints each form's step time and
# arena and their ratios; with --target cuda (and NVRTC) also each form's
# memory-bound traffic (bench/cuda_traffic.py) for GPT-OSS-120B's two layers.
# Not a test: timings depend on the machine.
#
#   bash bench/moe_bench.sh [BUILD_DIR] [--cuda]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
cuda=${2:-}
bin=$build/bin
[ -x "$bin/hpdlc" ] || { echo "moe_bench: no $bin/hpdlc (build first, or pass the build folder)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin/hpdl-data" --synthetic 200000 -o "$work/tok" > /dev/null
defs=(-D drop=false -D E=16 -D K=2 -D T=128 -D C=64 -D F=128)
declare -A secs arena
for form in grouped slots; do
  out=$("$bin/hpdlc" compile samples/moe-tiny.hpd "${defs[@]}" --experts $form -o "$work/$form")
  arena[$form]=$(echo "$out" | sed -n 's/.*arena \([0-9]*\) bytes.*/\1/p' | head -1)
  "$bin/hpdlrun" "$work/$form" --data "$work/tok_train_*.bin" --steps 3 --checkpoint-dir "$work/warm-$form" > /dev/null 2>&1
  line=$("$bin/hpdlrun" "$work/$form" --data "$work/tok_train_*.bin" --steps 20 --checkpoint-dir "$work/ck-$form" --progress plain 2>&1 |
    grep "done:")
  secs[$form]=$(echo "$line" | sed -n 's/.* in \([0-9.]*\) s.*/\1/p')
  echo "moe-tiny E=16 top-2 T=128, $form: 20 steps ${secs[$form]} s, arena ${arena[$form]} bytes"
done
awk -v g="${secs[grouped]}" -v s="${secs[slots]}" -v ag="${arena[grouped]}" -v as="${arena[slots]}" \
  'BEGIN { printf "grouped over slots: %.2fx faster, %.2fx less arena\n", s / g, as / ag }'
if [ "$cuda" = "--cuda" ]; then
  for form in grouped slots; do
    "$bin/hpdlc" compile samples/gpt-oss.hpd -D layers=2 --micro-batch 1 --global-batch 1 --precision bf16 --target cuda \
      --arch sm_90 --ep 1 --tp 1 --pp 1 --dp 1 --gpus 1 --nodes 1 --experts $form -o "$work/oss-$form" | grep arena
    python3 bench/cuda_traffic.py "$work/oss-$form" --top 0 | head -1
  done
fi
