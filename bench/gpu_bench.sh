#!/usr/bin/env bash
# gpu_bench.sh - on a machine with a GPU: the device-layer tests (every
# kernel of gpt2-tiny alone, the whole step of gpt2-tiny, llama and gpt on
# the GPU against the reference executor), then GPT-2 124M's step timed
# through the device layer (fp32 and TF32 GEMMs) beside PyTorch's on the
# same GPU (bench/gpu_torch_gpt2.py).
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
echo "== bench: GPT-2 124M, micro batch $micro x 1024, fp32"
timeout 300 "$bin" --device cuda --bench "$steps" --micro "$micro" gpt2.hpd 2>&1 | tee "$out/bench.fp32.log" | grep -E "bench|device|error" 
echo "== bench: the same with TF32 GEMMs"
HPDL_GEMM_TF32=1 timeout 300 "$bin" --device cuda --bench "$steps" --micro "$micro" gpt2.hpd 2>&1 | tee "$out/bench.tf32.log" | grep -E "bench|device|error"
echo "== PyTorch on the same GPU"
PYTHONUNBUFFERED=1 timeout 300 python3 "$here/bench/gpu_torch_gpt2.py" --micro "$micro" --steps "$steps" 2>&1 | tee "$out/torch.log" | grep -vE "Warning|warn"
echo "gpu_bench: $fails check(s) failed"
exit $fails
