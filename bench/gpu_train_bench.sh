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
# 1024 tokens a micro-batch, 4 micro-batches a step.
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

layout=(--dp 1 --gpus 1 --micro-batch "$micro" --global-batch $((4 * micro)))
arch=$("$bin/hpdlrun" --info | sed -n 's/^    GPU 0 .*, \(sm_[0-9]*\),.*/\1/p')
"$bin/hpdlc" compile "$here/samples/gpt2.hpd" --target cuda --arch "${arch:-sm_90}" "${layout[@]}" -o "$work/gpt2" > /dev/null || exit 1
predicted=$("$bin/hpdlc" plan "$here/samples/gpt2.hpd" --cluster "$cluster" "${layout[@]}" --precision fp32 --format json |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["time"]["step_s"])')
printf "%-28s %12s %12s %12s\n" "GPT-2 124M, $((4 * micro * 1024)) tokens/step" "ms/step" "tokens/s" "measured/plan"
for mode in fp32 tf32; do
  tf=0
  [ $mode = tf32 ] && tf=1
  HPDL_GEMM_TF32=$tf "$bin/hpdlrun" "$work/gpt2" --steps $((steps + 2)) --data "$data" --checkpoint-dir "$work/ck-$mode" \
    --metrics "$work/$mode.jsonl" --progress quiet || exit 1
  python3 - "$work/$mode.jsonl" "$mode" "$predicted" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][2:]
s = sum(r["step_s"] for r in rows) / len(rows)
tok = sum(r["tokens_per_s"] for r in rows) / len(rows)
plan = float(sys.argv[3])
ratio = f"{s / plan:.2f}" if sys.argv[2] == "fp32" else "(plan: fp32)"
print(f"{'hpdlrun, ' + sys.argv[2] + ' GEMMs':<28} {1e3 * s:12.1f} {tok:12.0f} {ratio:>12}")
EOF
done
echo "hpdlc plan --cluster $cluster --precision fp32: $(python3 -c "print(f'{1e3 * $predicted:.1f}')") ms a step"
