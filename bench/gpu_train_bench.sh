#!/usr/bin/env bash
# gpu_train_bench.sh - GPT-2 124M trained through hpdlrun on one GPU: tokens/s
# of the whole step (data, micro-batches, gradient norm, AdamW) with fp32 and
# TF32 GEMMs, beside hpdlc plan's prediction for the same run on the same
# device, as the ratio measured / predicted (docs/gpu.md).
#
#   bench/gpu_train_bench.sh [BUILD_DIR] [CLUSTER]
# BUILD_DIR: where bin/hpdlc, bin/hpdlrun and bin/hpdl-data are (default
# build); CLUSTER: the catalog's cluster whose GPU this is (default
# dgx-h100). STEPS (default 10) timed steps after 2 of warm-up; MICRO (4) x
# 1024 tokens a micro-batch, ACCUM (4) micro-batches a step; MODES (default
# "fp32 tf32 bf16", also bf16_fused_ce: the head and its loss fused, and
# bf16_eager: --fusion off, a kernel an op, planned so too) the
# precisions, each its own artifact and plan. PROFILE=N (N > 1): every launch
# of steps 2.. timed alone (so those steps slower), the N slowest printed.
# SAMPLE (default gpt2) another sample of samples/, ARGS more hpdlc arguments
# for it (-D sizes), SEQ (default 1024) its tokens a sequence, NAME its name
# in the table (a Llama of heads of 128: SAMPLE=llama ARGS="-D layers=4 ...").
#
# Without a GPU (no driver, or no GPU seen) it says so and times the
# emulated device on a tiny GPT-2 instead: the host side's cost only, no
# figure to compare with a GPU's.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
cluster=${2:-dgx-h100}
steps=${STEPS:-10}
micro=${MICRO:-4}
bin=$build/bin
for t in hpdlc hpdlrun hpdl-data; do
  [ -x "$bin/$t" ] || { echo "gpu_train_bench: no $bin/$t (build first, or give the build folder)"; exit 2; }
done
work=$(mktemp -d /tmp/hpdl-gpu-train.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$bin/hpdl-data" --synthetic 2000000 -o "$work/data/syn" > /dev/null || exit 1
data="$work/data/syn_train_*.bin"

if ! "$bin/hpdlrun" --info | grep -qE "^    GPU 0 "; then
  echo "gpu_train_bench: no GPU here:"
  "$bin/hpdlrun" --info | grep -E "CUDA driver"
  echo "gpu_train_bench: timing the emulated device's host side on gpt2-tiny instead (not a GPU figure)"
  "$bin/hpdlc" compile "$here/samples/gpt2-tiny.hpd" -D T=16 -D C=32 --global-batch 4 --micro-batch 2 --target cuda --emulate \
    -o "$work/tiny" > /dev/null || exit 1
  HPDL_PROFILE=1 "$bin/hpdlrun" "$work/tiny" --device emulate --steps 3 --data "$data" --checkpoint-dir "$work/ck" \
    --progress plain 2>&1 | grep -E "phases|done"
  exit 0
fi

accum=${ACCUM:-4}
sample=$here/samples/${SAMPLE:-gpt2}.hpd
seq=${SEQ:-1024}
read -r -a extra <<< "${ARGS:-}"
layout=(--dp 1 --gpus 1 --micro-batch "$micro" --global-batch $((accum * micro)) "${extra[@]}")
arch=$("$bin/hpdlrun" --info | sed -n 's/^    GPU 0 .*, \(sm_[0-9]*\),.*/\1/p')
plan_s() { # precision [more plan flags]: the plan's step time for this layout on the cluster's GPU
  "$bin/hpdlc" plan "$sample" --cluster "$cluster" "${layout[@]}" --precision "$@" --format json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["time"]["step_s"])'
}
printf "%-34s %10s %10s %12s %14s\n" "${NAME:-GPT-2 124M}, $((accum * micro)) x $seq tokens/step" "ms/step" "tokens/s" "plan ms" "measured/plan"
for mode in ${MODES:-fp32 tf32 bf16}; do
  tf=0 flags=() plan_flags=() precision=$mode
  # each precision named: the sample's train block says bf16
  case $mode in
    fp32) flags=(--precision fp32) ;;
    tf32) flags=(--precision fp32) tf=1 precision=none ;;  # the planner has no TF32 precision
    bf16) flags=(--precision bf16) ;;
    bf16_fused_ce) flags=(--precision bf16 --fused-ce on) precision=bf16 ;;
    bf16_eager) flags=(--precision bf16 --fusion off) plan_flags=(--fusion off) precision=bf16 ;;  # a kernel an op, planned so too
    *) echo "gpu_train_bench: no mode $mode (fp32, tf32, bf16, bf16_fused_ce, bf16_eager)"; exit 2 ;;
  esac
  art="$work/${SAMPLE:-gpt2}${flags[*]:+ ${flags[*]}}"
  art=${art// /_}
  [ -d "$art" ] || "$bin/hpdlc" compile "$sample" --target cuda --arch "${arch:-sm_90}" "${layout[@]}" "${flags[@]}" \
    -o "$art" > "$work/compile.log" 2>&1 || { cat "$work/compile.log"; exit 1; }
  predicted=none
  [ $precision = none ] || predicted=$(plan_s $precision "${plan_flags[@]}") || exit 1
  HPDL_PROFILE=${PROFILE:-1} HPDL_GEMM_TF32=$tf "$bin/hpdlrun" "$art" --steps $((steps + 2)) --data "$data" --checkpoint-dir "$work/ck-$mode" \
    --metrics "$work/$mode.jsonl" --progress quiet > "$work/$mode.log" 2>&1 || { cat "$work/$mode.log"; exit 1; }
  python3 - "$work/$mode.jsonl" "$mode" "$predicted" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][2:]
s = sum(r["step_s"] for r in rows) / len(rows)
tok = sum(r["tokens_per_s"] for r in rows) / len(rows)
plan = None if sys.argv[3] == "none" else float(sys.argv[3])
print(f"{'hpdlrun, ' + sys.argv[2]:<34} {1e3 * s:10.1f} {tok:10.0f} {'-' if plan is None else f'{1e3 * plan:.1f}':>12} "
      f"{'-' if plan is None else f'{s / plan:.2f}':>14}   loss {rows[-1]['loss']:.4f}")
EOF
  grep -E "phases|device memory" "$work/$mode.log" | sed 's/^/    /'
  [ "${PROFILE:-1}" -gt 1 ] && sed -n '/launches (HPDL_PROFILE/,$p' "$work/$mode.log" | grep -vE "^hpdlrun: (done|step phases)"
done
echo "(plan: hpdlc plan --cluster $cluster at the mode's precision; TF32 has none)"
