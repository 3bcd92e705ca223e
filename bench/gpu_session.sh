#!/usr/bin/env bash
# gpu_session.sh - one short visit to a GPU machine, the checks in the order
# they matter, each under what is left of a time budget: GPT-2 124M trained
# through hpdlrun in bf16 at one micro-batch of 16 sequences (llm.c's B = 16;
# the planner's prediction beside it), the suite's GPU tests
# (bench/gpu_tests.py, from bench/gpu_bundle.sh's list), bf16 at 4 x 4
# micro-batches, the per-launch profile of the bf16 step, the flash attention
# checks of bench/gpu_bench.sh that CTest does not list, a Llama of heads of 128
# in bf16 (its step and slowest launches: the 16-bit attention there), the bf16 step
# with fusion off (a kernel an op, beside its plan), BF16 and FP8 GEMMs
# sustained for 20 s each (clock and power beside); then what earlier
# visits measured already (fp32, TF32, the fused head, PyTorch's training
# step eager and compiled), as the budget allows.
#
#   bench/gpu_session.sh [BUNDLE] [OUT] [BUDGET_S]
# BUNDLE: bench/gpu_bundle.sh's folder (default .gpubundle); OUT: where
# session.log and logs.tgz (every part's log) go (default $OUT or .);
# BUDGET_S (default 520): no part starts once it is spent, and each part's
# own limit is what is left of it.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
bundle=$(cd "${1:-$here/.gpubundle}" && pwd)
out=${2:-${OUT:-.}}
budget=${3:-520}
start=$(date +%s)
logs=/tmp/hpdl-session
rm -rf "$logs"
mkdir -p "$logs" "$out"
exec > >(tee "$out/session.log") 2>&1
cd "$here" || exit 1
# shellcheck source=/dev/null
source "$bundle/env.sh"
left() { echo $((budget - ($(date +%s) - start))); }
save() { tar czf "$out/logs.tgz" -C /tmp hpdl-session 2>/dev/null; }
part() { # NAME NEEDED_S CAP_S COMMAND...: COMMAND under CAP_S or what is left, if at least NEEDED_S is
  local name=$1 need=$2 cap=$3
  shift 3
  local l
  l=$(left)
  if [ "$l" -lt "$need" ]; then
    echo "== $name: skipped, $l s left of the budget (needs $need)"
    return
  fi
  echo "== $name ($l s left)"
  [ "$l" -gt "$cap" ] && l=$cap
  local t0=$(date +%s)
  timeout --kill-after=5 "$l" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc after $(($(date +%s) - t0)) s"
  save
}
echo "gpu_session: $(date -u +%FT%TZ), budget $budget s"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
hpdlrun --info 2>&1 | sed -n '1,30p'

part train_b16 40 70 env STEPS=8 MICRO=16 ACCUM=1 MODES="bf16" bash bench/gpu_train_bench.sh "$bundle" dgx-h200
cat "$logs/train_b16.log"
part gpu_tests 60 300 python3 bench/gpu_tests.py run --bundle "$bundle" -j "${JOBS:-6}" --deadline $(($(left) - 150)) --grace 45 \
  --logs "$logs/gpu_tests"
grep -vE "^PASS" "$logs/gpu_tests.log" | head -80
grep -E "^PASS" "$logs/gpu_tests.log" | awk '{printf "%s %s; ", $2, $3} END {print ""}'
part train 50 90 env STEPS=10 MICRO=4 ACCUM=4 MODES="bf16" bash bench/gpu_train_bench.sh "$bundle" dgx-h200
cat "$logs/train.log"
part profile_b16 40 70 env STEPS=5 MICRO=16 ACCUM=1 MODES="bf16" PROFILE=25 bash bench/gpu_train_bench.sh "$bundle" dgx-h200
grep -vE "^step" "$logs/profile_b16.log" | head -60
part attention_checks 30 60 bash -c "bundle=$bundle; $(declare -f attn); attn"
grep -E "step of|FAIL|error" "$logs/attention_checks.log" | head -12
# a Llama of Llama-2-7B's heads (128, the 16-bit tensor-core attention since 2026-12-02)
# at 4096 positions, 4 layers of 2048, bf16: its step and its slowest launches
part train_llama 60 100 env STEPS=5 MICRO=1 ACCUM=4 MODES="bf16" PROFILE=20 SAMPLE=llama SEQ=4096 NAME="Llama 4 x 2048, heads 128" \
  ARGS="-D layers=4 -D hidden=2048 -D heads=16 -D kv_heads=16 -D ffn=5504 -D vocab=50304 --tp 1 --pp 1 --cp 1 --sp off" \
  bash bench/gpu_train_bench.sh "$bundle" dgx-h200
cat "$logs/train_llama.log"
# what fusion saves on the GPU, and the planner's price of the program a kernel an op
# (--fusion off, docs/planner.md 9.7, PyTorch's eager mode) beside the fused one's
part train_eager 50 90 env STEPS=8 MICRO=16 ACCUM=1 MODES="bf16_eager" bash bench/gpu_train_bench.sh "$bundle" dgx-h200
cat "$logs/train_eager.log"
# the share of its peak the GPU holds under minutes of large GEMMs, BF16 against FP8
# (docs/planner.md sec. 16, the DGX Cloud set: one sustained share for every precision?)
part gemm_sustained 50 60 python3 bench/gpu_gemm_sustained.py --seconds 20
grep -E "^(device|bf16|fp8)" "$logs/gemm_sustained.log"
part train_more 120 200 env STEPS=10 MICRO=4 ACCUM=4 MODES="bf16_fused_ce tf32 fp32" bash bench/gpu_train_bench.sh "$bundle" dgx-h200
cat "$logs/train_more.log"
part torch_train 60 100 python3 bench/gpu_torch_train.py --micro 4 --accum 4 --steps 10 --modes bf16,tf32
part torch_b16 30 50 python3 bench/gpu_torch_train.py --micro 16 --accum 1 --steps 8 --modes bf16
grep -hE "^device|^torch|Error|error" "$logs/torch_train.log" "$logs/torch_b16.log"
part torch_compile 100 200 python3 bench/gpu_torch_train.py --micro 4 --accum 4 --steps 10 --modes "" --compile
grep -E "^torch" "$logs/torch_compile.log"
save
echo "gpu_session: done in $(($(date +%s) - start)) s"
sleep 1  # tee's last lines
