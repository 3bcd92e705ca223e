#!/usr/bin/env bash
# gpu_bench.sh - on a machine with a GPU: the device-layer tests (every
# kernel of gpt2-tiny alone, the whole step of gpt2-tiny, llama and gpt on
# the GPU against the reference executor, flash attention's three head-width
# tiers and a sliding window; with BUNDLE, bench/gpu_bundle.sh's folder, the
# suite's GPU tests through bench/gpu_tests.py), then GPT-2 124M's step timed through the device
# layer (fp32 and TF32 GEMMs, flash and materialised attention) beside
# PyTorch's on the same GPU (bench/gpu_torch_gpt2.py).
#
#   bench/gpu_bench.sh [TEST_DEVICE] [OUT_DIR]
# TEST_DEVICE: the test_device binary (default build/tests/test_device);
# logs go to OUT_DIR (default .). MICRO (default 4) and STEPS (10) pick the
# bench's micro batch and timed steps.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$here/build/tests/test_device}
out=${2:-.}
micro=${MICRO:-4}
steps=${STEPS:-10}
export HPDL_SOURCE_DIR=$here HPDL_STDLIB=$here/stdlib
export HPDL_CACHE=${HPDL_CACHE:-/tmp/hpdl-nvrtc-cache}
llama="llama.hpd -D layers=2 -D hidden=32 -D heads=4 -D kv_heads=2 -D ffn=64 -D seq=16 -D vocab=64 -L parallel.cluster=laptop -L parallel.nodes=1 -L parallel.data=1 -L parallel.tensor=1 -L parallel.sequence=off"
gpt="gpt.hpd -D layers=2 -D hidden=64 -D heads=4 -D seq=32 -D vocab=128 -L parallel.cluster=laptop -L parallel.nodes=1 -L parallel.data=1 -L parallel.tensor=1 -L parallel.pipeline=1"
fails=0
check() { # name, args...
  local name=$1; shift
  echo "== $name"
  timeout 300 "$bin" --device cuda "$@" > "$out/$name.log" 2>&1
  local rc=$?
  grep -E "device:|NVRTC|step of|kernels called|kernels of|FAIL|skipped|off$|error" "$out/$name.log" | head -40
  echo "   exit $rc"
  [ $rc -eq 0 ] || fails=$((fails + 1))
}
nvidia-smi -L 2>&1 | head -2
check kernels.gpt2-tiny --kernels gpt2-tiny.hpd
check step.gpt2-tiny --step gpt2-tiny.hpd
check step.llama --step $llama
check step.gpt --step $gpt
# Flash attention on the GPU (kernels/hpdl_attention.cuh): a tiny Qwen3 with a
# sliding window across several key tiles (head width 16), and head widths 128
# and 256 (the launch rule's other two tiers), causal, over many query tiles
qwen="qwen3.hpd -D layers=2 -D hidden=32 -D ffn=64 -D vocab=64 -L parallel.cluster=laptop -L parallel.nodes=1 -L parallel.data=1 -L parallel.tensor=1 -L parallel.sequence=off"
check step.qwen3_window --step $qwen -D heads=4 -D kv_heads=2 -D head_dim=16 -D seq=100 -D window=37
check step.qwen3_head128 --step $qwen -D heads=2 -D kv_heads=1 -D head_dim=128 -D seq=72
check step.qwen3_head256 --step $qwen -D heads=2 -D kv_heads=2 -D head_dim=256 -D seq=40
# the tensor-core kernels (heads of 16 .. 64) over several blocks of 64 rows and keys
check step.gpt_head64 --step gpt.hpd -D layers=1 -D hidden=128 -D heads=2 -D seq=192 -D vocab=64 -L parallel.cluster=laptop \
  -L parallel.nodes=1 -L parallel.data=1 -L parallel.tensor=1 -L parallel.pipeline=1
# The suite's GPU tests (layouts through hpdlrun, the ranks sharing the GPU,
# against the CPU target's metrics written beforehand where the CPU back end
# is): bench/gpu_bundle.sh's list, run by bench/gpu_tests.py
if [ -n "${BUNDLE:-}" ] && [ -f "$BUNDLE/gpu_tests.json" ]; then
  echo "== the suite's GPU tests (bench/gpu_tests.py)"
  python3 "$here/bench/gpu_tests.py" run --bundle "$BUNDLE" -j "${JOBS:-4}" --logs "$out/gpu_tests" 2>&1 | tee "$out/gpu_tests.log"
  fails=$((fails + ${PIPESTATUS[0]}))
fi
for attn in flash materialized; do
  echo "== bench: GPT-2 124M, micro batch $micro x 1024, fp32, $attn attention"
  timeout 300 "$bin" --device cuda --bench "$steps" --micro "$micro" --attention $attn gpt2.hpd 2>&1 |
    tee "$out/bench.fp32.$attn.log" | grep -E "bench|device|error"
  echo "== bench: the same with TF32 GEMMs"
  HPDL_GEMM_TF32=1 timeout 300 "$bin" --device cuda --bench "$steps" --micro "$micro" --attention $attn gpt2.hpd 2>&1 |
    tee "$out/bench.tf32.$attn.log" | grep -E "bench|device|error"
done
echo "== profile: TF32, flash attention, every launch timed alone (the 30 longest)"
HPDL_PROFILE=30 HPDL_GEMM_TF32=1 timeout 300 "$bin" --device cuda --bench 3 --micro "$micro" gpt2.hpd > "$out/profile.tf32.log" 2>&1
grep -vE "^bench" "$out/profile.tf32.log" | head -60
echo "== PyTorch on the same GPU"
PYTHONUNBUFFERED=1 timeout 300 python3 "$here/bench/gpu_torch_gpt2.py" --micro "$micro" --steps "$steps" 2>&1 | tee "$out/torch.log" | grep -vE "Warning|warn"
echo "gpu_bench: $fails check(s) failed"
exit $fails
